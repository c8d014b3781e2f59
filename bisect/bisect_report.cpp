// Text and JSON ("opguard-bisect/1", docs/BISECT.md) of bisect config,
// shrink and run.

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "opguard/bisect/bisect.h"
#include "trials.h"

namespace opguard::bisect {
namespace {

using nlohmann::json;

std::string shape_text(const InputShape& s) {
  return fmt::format("{} {} [{}]", s.name.empty() ? fmt::format("input {}", s.argument) : s.name, s.dtype,
                     fmt::join(s.sizes, ","));
}

json change_json(const KnobChange& c) {
  return json{{"knob", c.knob}, {"good", c.good_value}, {"bad", c.bad_value}};
}

json config_j(const ConfigSearchResult& r) {
  json j;
  j["op"] = r.op;
  j["nothing_to_bisect"] = r.nothing_to_bisect;
  j["message"] = r.message;
  j["differences"] = json::array();
  for (const auto& c : r.differences) j["differences"].push_back(change_json(c));
  j["minimal"] = json::array();
  for (const auto& c : r.minimal) j["minimal"].push_back(change_json(c));
  j["one_minimal"] = r.one_minimal;
  j["trial_count"] = r.trial_count;
  j["good_bits"] = r.good_bits.outputs;
  j["bad_bits"] = r.bad_bits.outputs;
  j["trials"] = json::array();
  for (const auto& t : r.trials)
    j["trials"].push_back(json{{"knobs", t.knobs},
                               {"config", t.config},
                               {"outcome", trial_outcome_name(t.outcome)},
                               {"message", t.message},
                               {"child_process", t.child_process},
                               {"seconds", t.seconds}});
  j["seconds"] = r.seconds;
  return j;
}

json shape_json(const InputShape& s) {
  return json{{"argument", s.argument}, {"name", s.name},   {"dtype", s.dtype},
              {"sizes", s.sizes},       {"bytes", s.bytes}, {"recorded", s.recorded}};
}

json shrink_j(const ShrinkResult& r) {
  json j;
  j["diverges"] = r.diverges;
  j["message"] = r.message;
  j["slices"] = json::array();
  for (const auto& s : r.slices)
    j["slices"].push_back(json{{"argument", s.argument}, {"dim", s.dim}, {"start", s.start}, {"length", s.length}});
  j["original"] = json::array();
  for (const auto& s : r.original) j["original"].push_back(shape_json(s));
  j["final"] = json::array();
  for (const auto& s : r.final) j["final"].push_back(shape_json(s));
  j["original_bytes"] = r.original_bytes;
  j["final_bytes"] = r.final_bytes;
  j["trials"] = r.trials;
  j["accepted"] = r.accepted;
  j["budget_exhausted"] = r.budget_exhausted;
  j["good_bits"] = r.good_bits.outputs;
  j["bad_bits"] = r.bad_bits.outputs;
  j["seconds"] = r.seconds;
  return j;
}

const char* status_name(RunResult::Status s) {
  switch (s) {
    case RunResult::Status::kFound: return "found";
    case RunResult::Status::kNoDivergence: return "no-divergence";
    case RunResult::Status::kNothingToBisect: return "nothing-to-bisect";
    case RunResult::Status::kNotReplayable: return "not-replayable";
  }
  return "not-replayable";
}

}  // namespace

std::string config_text(const ConfigSearchResult& r) {
  std::string t;
  t += fmt::format("{} knob(s) differ between good and bad:\n", r.differences.size());
  for (const auto& c : r.differences) t += "  " + c.text() + "\n";
  t += fmt::format("trials ({} replays):\n", r.trial_count);
  for (const auto& tr : r.trials)
    t += fmt::format("  {:<7} {}{}{}\n", trial_outcome_name(tr.outcome),
                     tr.knobs.empty() ? std::string("(good)") : fmt::format("{}", fmt::join(tr.knobs, "+")),
                     tr.child_process ? "  (child process)" : "",
                     tr.outcome == TrialOutcome::kFailed ? "  " + tr.message : "");
  if (r.nothing_to_bisect) return t + r.message + "\n";
  t += "minimal knob set";
  t += r.one_minimal ? " (1-minimal: without any one of them the bad bits do not appear):\n" : ":\n";
  for (const auto& c : r.minimal) t += "  " + c.text() + "\n";
  return t;
}

std::string shrink_text(const ShrinkResult& r) {
  std::string t;
  if (!r.diverges) return r.message + "\n";
  for (std::size_t i = 0; i < r.original.size(); ++i) {
    const auto& a = r.original[i];
    const auto& b = r.final[i];
    t += fmt::format("  {} -> [{}]{}\n", shape_text(a), fmt::join(b.sizes, ","), a.recorded ? "" : "  (uninitialised in the recording)");
  }
  t += fmt::format("inputs {} -> {} bytes ({:.1f}%), {} trials ({} kept the divergence){}\n", r.original_bytes,
                   r.final_bytes, r.original_bytes ? 100.0 * r.final_bytes / r.original_bytes : 0.0, r.trials,
                   r.accepted, r.budget_exhausted ? ", trial budget spent" : "");
  std::string slices;
  for (const auto& s : r.slices)
    slices += fmt::format("{}{}:{}:{}:{}", slices.empty() ? "" : ",", s.argument, s.dim, s.start, s.length);
  // As `opguard repro --slices` takes them.
  if (!slices.empty()) t += "slices (argument:dim:start:length, for repro --slices): " + slices + "\n";
  return t;
}

std::string run_text(const RunResult& r) {
  std::string t;
  if (r.status != RunResult::Status::kFound) return r.message + "\n";
  t += "finding: " + r.message + "\n";
  if (r.config) {
    std::string knobs;
    for (const auto& k : r.config->minimal) knobs += (knobs.empty() ? "" : ", ") + k.text();
    t += fmt::format("  knobs    {} ({} of {} differing knobs, {} replay trials)\n", knobs, r.config->minimal.size(),
                     r.config->differences.size(), r.config->trial_count);
  }
  if (r.shrink) {
    std::string shapes;
    for (const auto& s : r.shrink->final)
      shapes += (shapes.empty() ? "" : ", ") + fmt::format("[{}]", fmt::join(s.sizes, ","));
    t += fmt::format("  inputs   {} -> {} bytes: {}\n", r.shrink->original_bytes, r.shrink->final_bytes, shapes);
  }
  t += "  replayed " + r.recording + (r.rerecorded ? " (re-recorded with full tensors)" : "") + "\n";
  if (!r.bundle_dir.empty()) t += "  bundle   " + r.bundle_dir + "\n";
  if (!r.bundle_note.empty()) t += "  " + r.bundle_note + "\n";
  std::string times;
  for (const auto& s : r.stages) times += fmt::format("{}{} {:.2f} s", times.empty() ? "" : ", ", s.stage, s.seconds);
  t += fmt::format("  time     {:.2f} s ({})\n", r.seconds, times);
  return t;
}

std::string config_json(const ConfigSearchResult& r) {
  json j = config_j(r);
  j["schema"] = "opguard-bisect/1";
  j["verb"] = "config";
  return j.dump(2);
}

std::string shrink_json(const ShrinkResult& r) {
  json j = shrink_j(r);
  j["schema"] = "opguard-bisect/1";
  j["verb"] = "shrink";
  return j.dump(2);
}

std::string run_json(const RunResult& r) {
  json j;
  j["schema"] = "opguard-bisect/1";
  j["verb"] = "run";
  j["status"] = status_name(r.status);
  j["message"] = r.message;
  j["event"] = r.event;
  j["op"] = r.op;
  j["scope"] = r.scope;
  j["phase"] = r.phase;
  j["step"] = r.step;
  j["recording"] = r.recording;
  j["rerecorded"] = r.rerecorded;
  j["suspect_bits_explained"] = r.suspect_bits_explained;
  if (r.config) j["config"] = config_j(*r.config);
  if (r.shrink) j["shrink"] = shrink_j(*r.shrink);
  j["bundle"] = r.bundle_dir;
  j["bundle_note"] = r.bundle_note;
  j["stages"] = json::array();
  for (const auto& s : r.stages) j["stages"].push_back(json{{"stage", s.stage}, {"seconds", s.seconds}});
  j["seconds"] = r.seconds;
  return j.dump(2);
}

}  // namespace opguard::bisect
