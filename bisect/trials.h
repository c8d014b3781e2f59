#pragma once
// One trial of bisect config / shrink: the event replayed under a full config
// (not overlaid on the recorded one) and optional input slices, cached by the
// config string and the slices, so that no config is replayed twice.

#include <map>
#include <string>
#include <vector>

#include "opguard/bisect/bisect.h"

namespace opguard::bisect::detail {

struct TrialRun {
  bool ran = false;  // the op ran and returned values
  Bits bits;
  std::string config, message, op;
  replay::CannotReason reason = replay::CannotReason::kNone;
  bool child_process = false;
  double seconds = 0.0;
  uint64_t input_bytes = 0;
};

Bits bits_of(const replay::ReplayResult& r);
std::string slices_text(const std::vector<replay::InputSlice>& slices);

class TrialRunner {
 public:
  explicit TrialRunner(TrialTarget target) : target_(std::move(target)) {}
  // References stay valid for the runner's life (std::map nodes).
  const TrialRun& run(const replay::Config& config) { return run(config, target_.slices); }
  const TrialRun& run(const replay::Config& config, const std::vector<replay::InputSlice>& slices);
  // The same trial replayed afresh, not cached (determinism checks).
  TrialRun run_again(const replay::Config& config, const std::vector<replay::InputSlice>& slices);
  bool has(const replay::Config& config) const { return cache_.count(key(config, target_.slices)) != 0; }
  int replays() const { return replays_; }

 private:
  static std::string key(const replay::Config& c, const std::vector<replay::InputSlice>& s) {
    return c.to_string() + "|" + slices_text(s);
  }
  TrialTarget target_;
  std::map<std::string, TrialRun> cache_;
  int replays_ = 0;
};

// Throws FormatError (one sentence naming the config and why) unless t ran.
void require_ran(const TrialRun& t, const char* which, const replay::Config& config);

}  // namespace opguard::bisect::detail

#include "opguard/formats/recording.h"

namespace opguard::bisect::detail {
// The recorded event (metadata only). Throws UsageError when it is not there.
formats::Event load_event(const std::string& dir, int rank, const std::string& event_id);
}  // namespace opguard::bisect::detail
