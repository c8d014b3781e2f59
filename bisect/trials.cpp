#include "trials.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>

#include "opguard/core/error.h"

namespace opguard::bisect::detail {

Bits bits_of(const replay::ReplayResult& r) {
  Bits b;
  for (const auto& o : r.outputs) {
    if (o.kind == "tensor")
      b.outputs.push_back(fmt::format("{}[{}]:{:016x}", o.dtype, fmt::join(o.sizes, ","), o.replayed_fingerprint));
    else
      b.outputs.push_back(o.kind + ":" + o.replayed_text);
  }
  return b;
}

std::string slices_text(const std::vector<replay::InputSlice>& slices) {
  std::string s;
  for (const auto& x : slices)
    s += fmt::format("{}{}:{}:{}:{}", s.empty() ? "" : ";", x.argument, x.dim, x.start, x.length);
  return s;
}

const TrialRun& TrialRunner::run(const replay::Config& config, const std::vector<replay::InputSlice>& slices) {
  const std::string k = key(config, slices);
  auto it = cache_.find(k);
  if (it != cache_.end()) return it->second;
  return cache_.emplace(k, run_again(config, slices)).first->second;
}

TrialRun TrialRunner::run_again(const replay::Config& config, const std::vector<replay::InputSlice>& slices) {
  replay::ReplayOptions o;
  o.rank = target_.rank;
  o.config = config;
  o.from_recorded = false;
  o.self_exe = target_.self_exe;
  o.slices = slices;
  const auto t0 = std::chrono::steady_clock::now();
  TrialRun t;
  t.config = config.to_string();
  try {
    const auto r = replay::replay_event(target_.recording, target_.event, o);
    // kWrittenOutside: the op ran, but bits of an input the recorder saw as
    // uninitialised reach its outputs. Replay zero-fills such inputs in every
    // trial, so two trials still compare like for like (normal_ on an empty
    // buffer is the common case: its bits do not depend on the input at all).
    t.ran = r.verdict != replay::Verdict::kCannotReplay || r.reason == replay::CannotReason::kWrittenOutside;
    t.bits = bits_of(r);
    t.message = r.message;
    t.op = r.op;
    t.reason = r.reason;
    t.child_process = r.child_process;
    t.input_bytes = r.input_bytes;
  } catch (const UsageError& e) {
    // A slice the op's shapes cannot take is a failed trial; an unknown event
    // or a bad config is the caller's error.
    if (slices.empty()) throw;
    t.message = e.what();
  }
  t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++replays_;
  return t;
}

void require_ran(const TrialRun& t, const char* which, const replay::Config& config) {
  if (t.ran) return;
  throw FormatError(fmt::format("the event cannot be replayed under the {} config ({}): {}", which,
                                config.empty() ? "as this process is" : config.to_string(), t.message));
}

}  // namespace opguard::bisect::detail

namespace opguard::bisect::detail {

formats::Event load_event(const std::string& dir, int rank, const std::string& event_id) {
  const auto id = formats::parse_event_id(event_id);
  if (!id) throw UsageError(fmt::format("'{}' is not an event id: use a number such as 1234", event_id));
  for (const auto& r : formats::scan_recording(dir).ranks) {
    if (r.rank != rank) continue;
    for (const auto& [step, path] : r.steps) {
      formats::StepReader reader(path);
      for (const auto& ev : reader.events())
        if (ev.id == *id) return ev;
    }
  }
  throw UsageError(formats::no_event_message(dir, event_id, rank));
}

}  // namespace opguard::bisect::detail
