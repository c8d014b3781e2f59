#pragma once
// Free-running window replay (ReplayOptions::free_running): the outputs of the
// window's replayed ops feed the later ops of the window that read them, where
// the recording shows that dataflow. Torch-free; replay.cpp drives it.
//
// The link is the one diff's dataflow uses (formats/tensor_view.h): an input
// reads what an earlier event of the window wrote when it names the same
// storage id at the version that write left. Replayed bits are kept per
// storage, element by element, at the recorded view geometry of each write,
// so that an input gets them through any view of that storage, also one the
// window never produced (an in-place op on a slice, then a read of the whole).
//
// Not linked (the input keeps its recorded bits): a storage the window never
// wrote; a version the window's writes do not explain (written by another
// thread, outside the window, or outside the dispatcher); a view in another
// dtype than the write; an input whose recorded fingerprint disagrees with
// the fingerprint recorded for the same view at the same version (bits
// written outside the dispatcher in between).

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "execute.h"
#include "opguard/formats/recording.h"

namespace opguard::replay::detail {

class FreeRunning {
 public:
  // The bits input `m` gets: nullopt when it is not linked to a replayed
  // write (use `recorded`). Elements of the view the window did not write
  // come from `recorded`; without it, a partly written view is not linked.
  std::optional<formats::TensorData> feed(const formats::TensorMeta& m, const formats::TensorData* recorded) const;
  // After `ev` ran: its replayed outputs and the post-call state of the
  // arguments it mutated, written over their recorded views.
  void record(const formats::Event& ev, const ExecResult& exec);

 private:
  struct Storage {
    DType dtype = DType::kFloat32;
    uint32_t version = 0;
    // false after a write whose resulting version the recording does not
    // show (a mutated argument of an op that returns nothing): the next
    // reader with a version above `version` is taken to read that write.
    bool version_exact = true;
    std::vector<uint8_t> bytes;  // the storage's elements
    std::vector<uint8_t> known;  // per element: written by a replayed op
    std::unordered_map<uint64_t, uint64_t> fingerprints;  // view geometry -> recorded fingerprint, this version
  };
  void write(const formats::TensorMeta& m, const OutValue& bits, bool version_known);

  std::unordered_map<uint64_t, Storage> storages_;
};

}  // namespace opguard::replay::detail
