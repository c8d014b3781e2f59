// bisect config: ddmin over the knobs in which good and bad differ. Each trial
// replays the event under good with a subset of the bad values set over it,
// and is classified by its bits against the good and the bad trial's bits.

#include <fmt/format.h>

#include <chrono>
#include <map>

#include "opguard/bisect/bisect.h"
#include "opguard/core/error.h"
#include "trials.h"

namespace opguard::bisect {

std::string KnobChange::text() const {
  return fmt::format("{}: {} -> {}", knob, good_value.empty() ? "(unset)" : good_value,
                     bad_value.empty() ? "(unset)" : bad_value);
}

std::vector<KnobChange> config_differences(const replay::Config& good, const replay::Config& bad) {
  std::vector<KnobChange> out;
  for (const auto& [k, v] : good.knobs) {
    const auto b = bad.get(k);
    if (!b || *b != v) out.push_back(KnobChange{k, v, b.value_or("")});
  }
  for (const auto& [k, v] : bad.knobs)
    if (!good.get(k)) out.push_back(KnobChange{k, "", v});
  return out;
}

replay::Config apply_changes(const replay::Config& good, const std::vector<KnobChange>& changes) {
  replay::Config c = good;
  for (const auto& ch : changes) {
    if (ch.bad_value.empty()) {
      for (auto it = c.knobs.begin(); it != c.knobs.end(); ++it) {
        if (it->first == ch.knob) {
          c.knobs.erase(it);
          break;
        }
      }
    } else {
      c.set(ch.knob, ch.bad_value);
    }
  }
  return c;
}

ConfigSearchResult bisect_config(const ConfigSearchOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  ConfigSearchResult result;
  result.differences = config_differences(options.good, options.bad);
  detail::TrialRunner runner(options.target);

  const auto& good = runner.run(options.good);
  const auto& bad = runner.run(options.bad);
  result.op = good.op;
  detail::require_ran(good, "good", options.good);
  detail::require_ran(bad, "bad", options.bad);
  result.good_bits = good.bits;
  result.bad_bits = bad.bits;
  const int n = static_cast<int>(result.differences.size());

  auto record = [&](const std::vector<KnobChange>& applied, const detail::TrialRun& t, TrialOutcome outcome) {
    Trial trial;
    for (const auto& ch : applied) trial.knobs.push_back(ch.knob);
    trial.config = t.config;
    trial.outcome = outcome;
    trial.message = t.message;
    trial.child_process = t.child_process;
    trial.seconds = t.seconds;
    result.trials.push_back(std::move(trial));
  };
  auto classify = [&](const detail::TrialRun& t) {
    if (!t.ran) return TrialOutcome::kFailed;
    if (t.bits == bad.bits) return TrialOutcome::kBad;
    if (t.bits == good.bits) return TrialOutcome::kGood;
    return TrialOutcome::kOther;
  };
  record({}, good, TrialOutcome::kGood);
  std::vector<KnobChange> all(result.differences.begin(), result.differences.end());
  record(all, bad, TrialOutcome::kBad);

  if (n == 0 || good.bits == bad.bits) {
    result.nothing_to_bisect = true;
    result.message = n == 0 ? "the good and the bad config set the same knobs to the same values: nothing to bisect"
                            : fmt::format("{} gives the same bits under the good and the bad config: nothing to "
                                          "bisect", result.op);
    result.trial_count = runner.replays();
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return result;
  }

  const auto found = ddmin(n, [&](const std::vector<int>& subset) {
    std::vector<KnobChange> applied;
    for (int i : subset) applied.push_back(result.differences[i]);
    const replay::Config c = apply_changes(options.good, applied);
    const bool cached = runner.has(c);
    const auto& t = runner.run(c);
    const TrialOutcome o = classify(t);
    if (!cached) record(applied, t, o);
    return o;
  });
  for (int i : found.minimal) result.minimal.push_back(result.differences[i]);
  result.one_minimal = found.one_minimal;
  result.trial_count = runner.replays();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace opguard::bisect
