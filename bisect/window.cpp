// bisect window: binary search for the latest start of a free-running window
// that still ends in a good-vs-bad difference (window.h).
//
// Free-running replay is causal: replaying [a, to] gives for [a, b] the same
// bits as replaying [a, b]. So one trial per start a is enough, and the
// search keeps the invariant "[lo, to] diverges, [hi, to] does not" (hi = the
// empty window past `to`), which ends with a start lo where starting one
// event later loses the divergence: 1-minimal, whether or not divergence is
// monotone in the start.

#include "opguard/bisect/window.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <map>

#include "opguard/core/error.h"
#include "opguard/formats/recording.h"
#include "trials.h"

namespace opguard::bisect {
namespace {

struct WindowEvents {
  std::vector<std::string> ids;
  std::vector<std::string> ops;
};

WindowEvents window_events(const std::string& dir, int rank, const std::string& from, const std::string& to) {
  const auto first = formats::parse_event_id(from), last = formats::parse_event_id(to);
  if (!first || !last)
    throw UsageError(fmt::format("'{}' is not an event id: use a number such as 1234, or STREAM.SEQ such as 2.57",
                                 first ? to : from));
  if ((*first >> 48) != (*last >> 48))
    throw UsageError(fmt::format("events {} and {} are on two threads: a window is one thread's events", from, to));
  if (*last < *first) throw UsageError(fmt::format("--to {} comes before --from {}", to, from));
  const auto layout = formats::scan_recording(dir);
  const formats::RankFiles* files = nullptr;
  for (const auto& r : layout.ranks)
    if (r.rank == rank) files = &r;
  if (files == nullptr) throw UsageError(fmt::format("{} has no rank {}: opguard ls lists its ranks", dir, rank));
  WindowEvents w;
  bool saw_first = false, saw_last = false;
  for (const auto& [step, path] : files->steps) {
    formats::StepReader reader(path);
    for (const auto& ev : reader.events()) {
      if (ev.stream != (*first >> 48) || ev.id < *first || ev.id > *last) continue;
      saw_first = saw_first || ev.id == *first;
      saw_last = saw_last || ev.id == *last;
      w.ids.push_back(formats::event_id_string(ev.id));
      w.ops.push_back(formats::op_text(ev.op, ev.overload));
    }
  }
  if (!saw_first || !saw_last)
    throw UsageError(formats::no_event_message(dir, saw_first ? to : from, rank));
  return w;
}

struct Run {
  std::vector<replay::ReplayResult> good, bad;
  bool diverges = false;  // WindowTrial::diverges
  std::string message;
};

class WindowTrials {
 public:
  WindowTrials(const WindowBisectOptions& o, const WindowEvents& w, WindowBisectResult& result)
      : o_(o), w_(w), result_(result) {}

  // Replays [start, to] free-running under good and bad.
  const Run& run(std::size_t start) {
    auto it = runs_.find(start);
    if (it != runs_.end()) return it->second;
    const auto t0 = std::chrono::steady_clock::now();
    Run r;
    const int64_t n = static_cast<int64_t>(w_.ids.size() - start);
    r.good = replay::replay_window(o_.recording, w_.ids[start], n, options(o_.good));
    r.bad = replay::replay_window(o_.recording, w_.ids[start], n, options(o_.bad));
    result_.replays += 2;
    WindowTrial t;
    t.start = w_.ids[start];
    t.events = n;
    t.diverges = r.diverges = end_diverges(r, &t.message);
    r.message = t.message;
    t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    result_.trials.push_back(t);
    return runs_.emplace(start, std::move(r)).first->second;
  }

 private:
  replay::ReplayOptions options(const replay::Config& c) const {
    replay::ReplayOptions r;
    r.rank = o_.rank;
    r.config = c;
    r.from_recorded = false;
    r.self_exe = o_.self_exe;
    r.free_running = true;
    r.window_keep_going = true;
    return r;
  }
  bool end_diverges(const Run& r, std::string* why) const {
    const std::string& end = w_.ids.back();
    for (const auto* side : {&r.good, &r.bad}) {
      if (side->empty() || side->back().event != end) {
        *why = fmt::format("the replay did not reach event {}", end);
        return false;
      }
      if (side->back().verdict == replay::Verdict::kCannotReplay) {
        *why = fmt::format("event {} cannot be replayed under {}: {}", end, side->back().config, side->back().message);
        return false;
      }
    }
    return detail::bits_of(r.good.back()) != detail::bits_of(r.bad.back());
  }

  const WindowBisectOptions& o_;
  const WindowEvents& w_;
  WindowBisectResult& result_;
  std::map<std::size_t, Run> runs_;
};

}  // namespace

WindowBisectResult bisect_window(const WindowBisectOptions& o) {
  const auto w = window_events(o.recording, o.rank, o.from, o.to);
  WindowBisectResult result;
  result.recording = o.recording;
  result.from = o.from;
  result.to = o.to;
  result.good_config = o.good.to_string();
  result.bad_config = o.bad.to_string();
  result.window_events = static_cast<int64_t>(w.ids.size());
  WindowTrials trials(o, w, result);
  const Run& whole = trials.run(0);
  if (!whole.diverges) {
    if (!whole.message.empty()) throw FormatError(fmt::format("bisect window: {}", whole.message));
    result.nothing_to_bisect = true;
    return result;
  }
  std::size_t lo = 0, hi = w.ids.size();
  while (hi - lo > 1) {
    const std::size_t mid = lo + (hi - lo) / 2;
    if (trials.run(mid).diverges) lo = mid;
    else hi = mid;
  }
  const Run& best = trials.run(lo);
  result.start = w.ids[lo];
  result.start_op = w.ops[lo];
  result.sub_window_events = static_cast<int64_t>(w.ids.size() - lo);
  for (std::size_t k = 0; k < best.good.size() && k < best.bad.size(); ++k) {
    WindowEvent e;
    e.event = best.good[k].event;
    e.op = formats::op_text(best.good[k].op, best.good[k].overload);
    e.differs = best.good[k].verdict == replay::Verdict::kCannotReplay ||
                        best.bad[k].verdict == replay::Verdict::kCannotReplay
                    ? best.good[k].verdict != best.bad[k].verdict
                    : detail::bits_of(best.good[k]) != detail::bits_of(best.bad[k]);
    e.fed_inputs = best.good[k].fed_inputs;
    if (e.differs && result.first_differing.empty()) {
      result.first_differing = e.event;
      result.first_differing_op = e.op;
    }
    result.events.push_back(std::move(e));
  }
  return result;
}

std::string window_text(const WindowBisectResult& r) {
  auto events = [](int64_t n) { return fmt::format("{} event{}", n, n == 1 ? "" : "s"); };
  std::string t = fmt::format("bisect window {} .. {} of {} ({}), free-running\n", r.from, r.to, r.recording,
                              events(r.window_events));
  t += fmt::format("  good  {}\n  bad   {}\n", r.good_config, r.bad_config);
  for (const auto& tr : r.trials)
    t += fmt::format("  trial from {:>8} ({}): {}{}  [{:.2f} s]\n", tr.start, events(tr.events),
                     tr.diverges ? "end differs" : "end equal", tr.message.empty() ? "" : " (" + tr.message + ")",
                     tr.seconds);
  if (r.nothing_to_bisect) {
    t += fmt::format("nothing to bisect: event {} gives the same bits under good and bad\n", r.to);
    return t;
  }
  t += fmt::format("smallest sub-window: {} .. {} ({}), first op {} {}\n", r.start, r.to, events(r.sub_window_events),
                   r.start, r.start_op);
  if (!r.first_differing.empty())
    t += fmt::format("first event whose bits differ in it: {} {}\n", r.first_differing, r.first_differing_op);
  for (const auto& e : r.events)
    t += fmt::format("  {:>8} {:<36} {}{}\n", e.event, e.op, e.differs ? "differs" : "same",
                     e.fed_inputs > 0 ? fmt::format("  ({} inputs fed)", e.fed_inputs) : "");
  t += fmt::format("{} trials, {} window replays\n", r.trials.size(), r.replays);
  return t;
}

std::string window_json(const WindowBisectResult& r) {
  nlohmann::json j;
  j["schema"] = "opguard-bisect-window/1";
  j["recording"] = r.recording;
  j["from"] = r.from;
  j["to"] = r.to;
  j["window_events"] = r.window_events;
  j["good_config"] = r.good_config;
  j["bad_config"] = r.bad_config;
  j["nothing_to_bisect"] = r.nothing_to_bisect;
  j["start"] = r.start;
  j["start_op"] = r.start_op;
  j["sub_window_events"] = r.sub_window_events;
  j["first_differing"] = r.first_differing;
  j["first_differing_op"] = r.first_differing_op;
  j["events"] = nlohmann::json::array();
  for (const auto& e : r.events)
    j["events"].push_back({{"event", e.event}, {"op", e.op}, {"differs", e.differs}, {"fed_inputs", e.fed_inputs}});
  j["trials"] = nlohmann::json::array();
  for (const auto& t : r.trials)
    j["trials"].push_back({{"start", t.start}, {"events", t.events}, {"diverges", t.diverges},
                           {"message", t.message}, {"seconds", t.seconds}});
  j["replays"] = r.replays;
  return j.dump(2);
}

}  // namespace opguard::bisect
