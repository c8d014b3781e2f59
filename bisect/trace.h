#pragma once
// The divergence as a Chrome trace-event JSON file (ui.perfetto.dev and
// chrome://tracing open it; docs/DIFF.md, "Trace"). Private to opguard_bisect:
// diff feeds it one slice per event while it classifies, then writes it.

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "opguard/bisect/diff.h"
#include "opguard/formats/recording.h"

namespace opguard::bisect {

class TraceLog {
 public:
  explicit TraceLog(std::size_t limit_per_run) : limit_(limit_per_run) {}
  // A suspect event and, if aligned, its reference partner (both get `cls`).
  void add_suspect(int rank, const formats::Event& b, const formats::Event* a, EventClass cls,
                   const formats::TensorMeta* first_output);
  void add_reference_only(int rank, const formats::Event& a);
  // Throws IoError if the file cannot be written.
  void write(const std::string& path, const DiffReport& report) const;
  bool truncated() const { return truncated_; }

 private:
  struct Slice {
    int32_t rank = 0;
    uint32_t stream = 0;
    int64_t t0 = 0, t1 = 0;
    int64_t step = 0;
    uint8_t phase = 0;
    EventClass cls = EventClass::kSame;
    uint64_t id = 0;
    int32_t op = 0, scope = 0;
    int64_t partner = -1;  // index of the aligned slice in the other run's list
    bool has_fingerprint = false;
    uint64_t fingerprint = 0;
  };
  int32_t intern(const std::string& s);
  bool full(int run);
  Slice make(int rank, const formats::Event& e, EventClass cls);

  std::size_t limit_;
  bool truncated_ = false;
  std::vector<std::string> names_;
  std::unordered_map<std::string, int32_t> index_;
  std::vector<Slice> slices_[2];  // [0] reference, [1] suspect
};

}  // namespace opguard::bisect
