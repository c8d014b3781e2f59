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
#include <memory>
#include <vector>

#include "opguard/formats/recording.h"
#include "opguard/formats/tensor_view.h"

namespace opguard::bisect {

// Shared with free-running replay (formats/tensor_view.h).
using formats::bits_state;
using formats::BitsState;
using formats::view_geometry;

// One observation of a tensor's bits, from a value row of a step file: which
// view of which storage at which version, and what its fingerprint says.
struct TensorBits {
  uint64_t storage_id = 0;  // 0: unknown (never tracked)
  uint64_t geometry = 0;    // view_geometry
  uint32_t version = 0;
  BitsState state = BitsState::kUnknown;
  uint64_t fingerprint = 0;
};

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
  // Where `known` is false: the event that last wrote the storage (-1: none),
  // whose bits were then changed without an operator.
  int32_t last_writer = -1;
};

class Dataflow {
 public:
  // Whether input tensor `m` carries bits that differ from the reference's,
  // for an event that has no partner to compare with (an unmatched event).
  Provenance provenance(const TensorBits& m) const;
  // Explains the bits of input tensor `m`, which differ from the reference.
  BitsSource explain(const TensorBits& m) const;
  // Records that `event` saw `m` as an input: a later reader of the same view
  // and version finds it (the first consumer of bits from outside).
  void observe_input(const TensorBits& m, int32_t event, bool differs);
  // Records that `event` wrote `m` (an output that is not an alias of an input,
  // or an argument the op mutates). `m` may lack a fingerprint (post-state not
  // recorded): then a later reader of this storage is explained by `event`
  // only as its last writer.
  void record_write(const TensorBits& m, int32_t event, bool differs, bool bits_known);
  // Records an output that aliases an input's storage (view, detach, ...).
  void record_alias(const TensorBits& m, int32_t event, bool differs);
  std::size_t storages() const { return count_; }

  // Views of one storage remembered between writes. A storage is rarely seen
  // through more than a handful of geometries (the tensor, its transpose, a few
  // reshapes); the oldest is forgotten first.
  static constexpr std::size_t kMaxViews = 16;

 private:
  struct Observation {
    uint64_t geometry = 0;
    uint64_t fingerprint = 0;
    uint32_t version = 0;
    int32_t event = -1;
    BitsState state = BitsState::kUnknown;
    bool differs = false;
  };
  // The observations of one storage since its last write, oldest first, at
  // most kMaxViews. The first sits in place: most storages are seen through one
  // view (activations), and a new storage then costs no allocation.
  class Views {
   public:
    std::size_t size() const { return n_; }
    Observation& operator[](std::size_t i) { return i < kInline ? inline_[i] : more_[i - kInline]; }
    const Observation& operator[](std::size_t i) const { return i < kInline ? inline_[i] : more_[i - kInline]; }
    void clear() {
      n_ = 0;
      more_.clear();
    }
    void push_back(const Observation& o) {
      if (n_ < kInline) inline_[n_] = o;
      else more_.push_back(o);
      ++n_;
    }
    void erase_oldest() {
      for (std::size_t i = 1; i < n_; ++i) (*this)[i - 1] = (*this)[i];
      if (n_ > kInline) more_.pop_back();
      --n_;
    }

   private:
    static constexpr std::size_t kInline = 1;
    Observation inline_[kInline];
    std::vector<Observation> more_;
    uint32_t n_ = 0;
  };
  struct Storage {
    Views seen;
    int32_t last_writer = -1;
    int32_t last_divergent_writer = -1;
  };
  // Storage id (never 0) -> number of its Storage: open addressing with linear
  // probing, so that a new storage costs no node allocation. The recorder
  // numbers storages 1, 2, 3, ... as they appear: the slot is the id itself
  // (its higher 16-bit pieces folded in, so that ids apart by a power of two
  // still spread), which keeps consecutive ids in consecutive slots
  // (a scattering hash made most lookups cache misses: the diff of a million
  // synthetic events took 0.92 s instead of 0.79 s). Other id patterns stay
  // correct, only probes may get longer.
  class Index {
   public:
    // The index of `id`, or -1.
    int64_t find(uint64_t id) const;
    // The index of `id`; `fresh` if it was not there, which is then its index.
    uint32_t find_or_insert(uint64_t id, uint32_t fresh);

   private:
    std::size_t slot(uint64_t id) const {
      return static_cast<std::size_t>(id ^ (id >> 16) ^ (id >> 32) ^ (id >> 48)) & (keys_.size() - 1);
    }
    void grow();
    std::vector<uint64_t> keys_;  // 0: empty
    std::vector<uint32_t> values_;
    std::size_t used_ = 0;
  };
  Storage& storage(uint64_t id);  // creates it
  const Storage& at(uint32_t i) const { return chunks_[i / kChunk][i % kChunk]; }
  void add(Storage& s, const Observation& o);

  // Storages in chunks that never move: growing a vector of a million of them
  // (moving each, touching fresh pages twice) was half the dataflow's time.
  static constexpr uint32_t kChunk = 4096;
  Index index_;
  std::vector<std::unique_ptr<Storage[]>> chunks_;
  uint32_t count_ = 0;
};

}  // namespace opguard::bisect
