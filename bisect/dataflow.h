#pragma once
// Where the bits of a tensor came from, in the suspect run (DESIGN.md, Rule 2:
// propagated vs entered). Private to opguard_bisect.
//
// The recorder gives every tensor its storage id, the storage's version
// counter and its view geometry. Two observations of one storage with the same
// geometry and version hold the same bits, unless memory was written outside
// the dispatcher (numpy, a custom kernel, silent data corruption): then the
// fingerprints disagree and that is how `entered` is found. Every observation
// also carries whether its bits differed from the reference's aligned event.

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "opguard/formats/recording.h"
#include "opguard/formats/tensor_view.h"

namespace opguard::bisect {

// Shared with free-running replay (formats/tensor_view.h).
using formats::bits_state;
using formats::BitsState;
using formats::view_geometry;

// Where a differing input's bits came from.
struct BitsSource {
  enum Kind : uint8_t {
    kPropagated,      // `event` produced (or last saw) these bits, and they differed there already
    kEnteredOutside,  // the suspect's bits changed after `event` without any operator (or `event` = -1: never produced)
    kEnteredReference,  // the suspect read what `event` produced, equal in both runs: the reference's bits changed
  };
  Kind kind = kEnteredOutside;
  int32_t event = -1;  // index into the caller's event table; -1: no event of the recording produced it
  bool unseen = false;  // no event had this storage as an input or output before
  // The storage was seen, this view of it never (made inside an op: a view a
  // forward op saved for the backward pass without returning it).
  bool view_unseen = false;
};

// What the recording says of a tensor's bits, differing or not.
struct Provenance {
  bool known = false;    // false: no event produced or saw these bits (or they changed outside the dispatcher)
  bool differs = false;  // they differed from the reference where last produced or seen
  int32_t event = -1;    // that event
};

class Dataflow {
 public:
  // Whether input tensor `m` carries bits that differ from the reference's,
  // for an event that has no partner to compare with (an unmatched event).
  Provenance provenance(const formats::TensorMeta& m) const;
  // Explains the bits of input tensor `m`, which differ from the reference.
  BitsSource explain(const formats::TensorMeta& m) const;
  // Records that `event` saw `m` as an input: a later reader of the same view
  // and version finds it (the first consumer of bits from outside).
  void observe_input(const formats::TensorMeta& m, int32_t event, bool differs);
  // Records that `event` wrote `m` (an output that is not an alias of an input,
  // or an argument the op mutates). `m` may lack a fingerprint (post-state not
  // recorded): then a later reader of this storage is explained by `event`
  // only as its last writer.
  void record_write(const formats::TensorMeta& m, int32_t event, bool differs, bool bits_known);
  // Records an output that aliases an input's storage (view, detach, ...).
  void record_alias(const formats::TensorMeta& m, int32_t event, bool differs);
  std::size_t storages() const { return storages_.size(); }

 private:
  struct Observation {
    uint64_t geometry = 0;
    uint32_t version = 0;
    BitsState state = BitsState::kUnknown;
    uint64_t fingerprint = 0;
    bool differs = false;
    int32_t event = -1;
  };
  struct Storage {
    std::vector<Observation> seen;  // since the last write; bounded by kMaxViews
    int32_t last_writer = -1;
    int32_t last_divergent_writer = -1;
  };
  void add(Storage& s, const Observation& o);

  std::unordered_map<uint64_t, Storage> storages_;
};

}  // namespace opguard::bisect
