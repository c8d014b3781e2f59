#pragma once
// Annotations a C++ training program uses so that its recording carries module
// scopes, phases and step boundaries. Header-only and free when no recorder is
// running: each is a RecordFunction range in USER_SCOPE that the recorder reads
// by name, so a program using them needs no link dependency on opguard and is
// recorded the same way under `opguard record` (LD_PRELOAD) or opguard::Recorder.
//
//   for (int i = 0; i < n_layers; ++i) {
//     opguard::Scope block("blocks." + std::to_string(i));   // nested scopes join with '.'
//     { opguard::Scope s("attn"); x = x + attn(ln1(x)); }
//   }
//   loss.backward();                                         // backward scopes come from forward
//   { opguard::PhaseScope p(opguard::PhaseScope::kOptimizer); optimizer.step(); }
//   opguard::mark_step();                                    // step N ends here

#include <ATen/record_function.h>

#include <string>
#include <utility>

namespace opguard {

// Range names the recorder recognises. Part of the recording contract.
inline constexpr const char* kScopeRangePrefix = "opguard::scope/";
inline constexpr const char* kPhaseRangePrefix = "opguard::phase/";
inline constexpr const char* kStepRangeName = "opguard::step";

class Scope {
 public:
  explicit Scope(std::string name) : range_(at::RecordScope::USER_SCOPE) {
    if (range_.isActive()) {
      name_ = kScopeRangePrefix + std::move(name);
      range_.before(std::string_view(name_));
    }
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  // Declared first so it outlives the range, whose end callback reads it.
  std::string name_;
  at::RecordFunction range_;
};

class PhaseScope {
 public:
  static constexpr const char* kForward = "forward";
  static constexpr const char* kBackward = "backward";
  static constexpr const char* kOptimizer = "optimizer";
  static constexpr const char* kOther = "other";

  explicit PhaseScope(const char* phase) : range_(at::RecordScope::USER_SCOPE) {
    if (range_.isActive()) {
      name_ = std::string(kPhaseRangePrefix) + phase;
      range_.before(std::string_view(name_));
    }
  }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  std::string name_;
  at::RecordFunction range_;
};

// Ends the current training step: events after it belong to the next step.
// Once a program calls it, only these calls end steps (docs/RECORD.md,
// "Steps": otherwise PyTorch's Optimizer.step ranges, or steps inferred from
// a backward and an update of the parameters).
inline void mark_step() {
  at::RecordFunction range(at::RecordScope::USER_SCOPE);
  if (range.isActive()) range.before(std::string_view(kStepRangeName));
}

}  // namespace opguard
