// opguard ls: what a recording holds, per rank, step and phase.

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "opguard/core/error.h"
#include "opguard/formats/recording.h"
#include "verbs.h"

namespace opguard::cli {
namespace {

constexpr const char* kHelp = R"(List a recording: per rank, step and phase the number of events, distinct
operators and bytes of full tensors; the manifest's numerics knobs; torn steps
(a process killed during a step leaves it torn; every earlier step is intact).

--events lists every event after its step's phases: its id (what show,
replay, bisect and repro take as --event), phase, operator, module scope and
autograd node; --step S keeps one step (of the listing and of --events).

Examples:
  opguard ls runA
  opguard ls runA --events --step 1
  opguard ls runA --json | python3 -m json.tool)";

struct Options {
  std::string dir;
  bool json = false;
  bool events = false;
  std::optional<int64_t> step;
};

struct PhaseStats {
  uint64_t events = 0;
  std::set<std::string> ops;
  uint64_t full_tensors = 0;
  uint64_t bytes = 0;
};

uint64_t tensor_bytes(const formats::TensorMeta& m) {
  return static_cast<uint64_t>(m.numel()) * dtype_size(m.dtype);
}

int run_ls(const Options& o) {
  const std::string& dir = o.dir;
  const formats::RecordingLayout layout = formats::scan_recording(dir);
  if (o.step) {
    bool any = false;
    for (const auto& r : layout.ranks)
      for (const auto& s : r.steps) any = any || s.first == *o.step;
    if (!any)
      throw UsageError(fmt::format("{} has no complete step {}: opguard ls {} lists its steps", dir, *o.step, dir));
  }
  nlohmann::json out;
  out["recording"] = dir;
  out["ranks"] = nlohmann::json::array();
  std::string text;
  text += fmt::format("recording {} ({} rank{})\n", dir, layout.ranks.size(), layout.ranks.size() == 1 ? "" : "s");
  for (const auto& rank : layout.ranks) {
    const formats::Manifest manifest = formats::read_manifest(rank.manifest_path);
    // `missing`: what a key the manifest lacks reads as (keys newer than the recording).
    auto info = [&](const char* key, const char* missing = "?") {
      auto it = manifest.info.find(key);
      return it == manifest.info.end() ? std::string(missing) : it->second;
    };
    nlohmann::json jr;
    jr["rank"] = rank.rank;
    jr["world_size"] = manifest.world_size;
    jr["format_version"] = manifest.format_version;
    jr["info"] = manifest.info;
    jr["env"] = manifest.env;
    jr["info"].erase("torch_config");
    text += fmt::format("rank {}: program {} argv {}\n", rank.rank, info("program"), info("argv"));
    // The knobs the steps ran under: their values at a clean end where the
    // manifest has them (a program may set them after the recording opened),
    // as replay's recorded config takes them.
    auto knob = [&](const std::string& key) {
      auto it = manifest.info.find(key + "_at_end");
      return it != manifest.info.end() ? it->second : info(key.c_str());
    };
    // Denormals flushed: on the main thread, and in the intra-op workers where
    // they differ from it (torch.set_flush_denormal after the first parallel op).
    const std::string flush_main = knob("flush_denormal");
    const std::string flush_workers = info("flush_denormal_workers_at_end", "");
    std::string flush = flush_main == "1" ? "  flush_denormal on" : "";
    if (!flush_workers.empty() && flush_workers != flush_main) {
      if (flush.empty()) flush = "  flush_denormal off";
      flush += flush_workers == "1" ? " (intra-op workers on)"
               : flush_workers == "0" ? " (intra-op workers off)"
                                      : " (intra-op workers mixed)";
    }
    text += fmt::format("  torch {}  threads {}  cpu_capability {}  mkldnn {}  deterministic {}  default_dtype {}{}\n",
                        info("torch_version"), knob("threads"), info("cpu_capability"), knob("mkldnn_enabled"),
                        knob("deterministic_algorithms"), knob("default_dtype"), flush);
    std::string clean = info("clean_exit") == "1" ? "clean exit" : "did not exit cleanly";
    if (info("recording_failed") == "1") clean = "recording failed";
    if (const std::string sig = info("ended_by_signal", ""); !sig.empty())
      clean = "ended by " + sig + " (the recording was finished first)";
    if (info("stopped_after_windows", "") == "1")
      clean = "ended by the recorder after its --dump-around windows (--stop-after-windows)";
    const std::string taken_at = info("fingerprints", "");  // where fingerprints were taken
    std::string taken = taken_at.empty() ? "" : "  fingerprints " + taken_at;
    if (!info("observe_only", "").empty()) taken += "  observe only (a benchmark: no events)";
    const std::string written = info("written_while_deferred", "0");
    if (written != "0") taken += "  " + written + " deferred tensor(s) written without the dispatcher (not fingerprinted)";
    text += fmt::format("  started {}  {}  sampling '{}'{}\n", info("start_time"), clean, info("sampling_policy"), taken);
    text += fmt::format("  {:>6}  {:<9}  {:>7}  {:>4}  {:>12}  {:>12}\n", "step", "phase", "events", "ops",
                        "full-tensors", "bytes");
    jr["steps"] = nlohmann::json::array();
    uint64_t total_events = 0;
    for (const auto& [step, path] : rank.steps) {
      if (o.step && step != *o.step) continue;
      formats::StepReader reader(path);
      std::map<int, PhaseStats> phases;
      for (const auto& ev : reader.events()) {
        auto& ps = phases[static_cast<int>(ev.phase)];
        ++ps.events;
        ps.ops.insert(formats::op_text(ev.op, ev.overload));
        for (const auto* values : {&ev.inputs, &ev.outputs}) {
          for (const auto& v : *values) {
            if (v.tensor.flags & formats::kTensorHasData) {
              ++ps.full_tensors;
              ps.bytes += tensor_bytes(v.tensor);
            }
          }
        }
      }
      nlohmann::json js;
      js["step"] = step;
      js["file"] = path;
      js["phases"] = nlohmann::json::object();
      for (const auto& [phase, ps] : phases) {
        const char* name = formats::phase_name(static_cast<formats::Phase>(phase));
        text += fmt::format("  {:>6}  {:<9}  {:>7}  {:>4}  {:>12}  {:>12}\n", step, name, ps.events, ps.ops.size(),
                            ps.full_tensors, ps.bytes);
        js["phases"][name] = {{"events", ps.events}, {"distinct_ops", ps.ops.size()},
                              {"full_tensors", ps.full_tensors}, {"bytes", ps.bytes}};
        total_events += ps.events;
      }
      if (o.events) {
        js["events"] = nlohmann::json::array();
        for (const auto& ev : reader.events()) {
          const std::string id = formats::event_id_string(ev.id);
          const std::string op = formats::op_text(ev.op, ev.overload);
          const char* phase = formats::phase_name(ev.phase);
          text += fmt::format("  {:>10}  {:<9}  {}{}{}\n", id, phase, op, ev.scope.empty() ? "" : "  scope " + ev.scope,
                              ev.node.empty() ? "" : "  node " + ev.node);
          js["events"].push_back({{"id", id}, {"phase", phase}, {"op", op}, {"scope", ev.scope}, {"node", ev.node}});
        }
      }
      jr["steps"].push_back(js);
    }
    // A recording whose process is still running: its last step is being
    // written, not torn.
    const bool running = info("clean_exit") != "1" && formats::owner_running(rank.dir);
    jr["recording_in_progress"] = running;
    jr["torn_steps"] = nlohmann::json::array();
    for (const auto& [step, path] : rank.torn) {
      if (running)
        text += fmt::format("  {:>6}  being written: the recording process is still running ({})\n", step, path);
      else
        text += fmt::format("  {:>6}  torn: the process died during this step; its events were lost ({})\n", step,
                            path);
      jr["torn_steps"].push_back({{"step", step}, {"file", path}});
    }
    jr["events"] = total_events;
    // complete: the process ended cleanly and every write succeeded.
    jr["complete"] = info("clean_exit") == "1" && info("recording_failed") != "1";
    if (o.step) {
      const bool has = std::any_of(rank.steps.begin(), rank.steps.end(), [&](const auto& s) { return s.first == *o.step; });
      text += fmt::format("  {} events in step {}{}\n", total_events, *o.step, has ? "" : " (not a complete step of this rank)");
    } else {
      text += fmt::format("  {} events in {} complete step(s)\n", total_events, rank.steps.size());
    }
    if (info("recording_failed") == "1") {
      text += fmt::format("  incomplete: recording stopped at step {} because a write failed ({}); {}\n",
                          info("failed_step"), info("failure"),
                          info("strict") == "1" ? "--strict aborted the run" : "the run went on unrecorded");
    } else if (running) {
      text += "  in progress: the recording process is still running; these are the steps written so far\n";
    } else if (info("clean_exit") != "1") {
      text += "  incomplete: the process did not exit cleanly (killed?); steps after the last complete one are "
              "missing\n";
    }
    if (info("dropped_tensors") != "?" && info("dropped_tensors") != "0") {
      text += fmt::format("  {} full tensor(s) dropped: the writer queue was full under --queue-full drop "
                          "(fingerprints kept)\n",
                          info("dropped_tensors"));
    }
    out["ranks"].push_back(jr);
  }
  if (o.json) {
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::fputs(text.c_str(), stdout);
  }
  return 0;
}

}  // namespace

void add_ls_command(CLI::App& app, VerbResult& result) {
  auto o = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand("ls", "List the steps, phases and events of a recording");
  sub->footer(kHelp);
  sub->add_option("recording", o->dir, "Recording directory")->required();
  sub->add_flag("--json", o->json, "Machine-readable output");
  sub->add_flag("--events", o->events, "List every event: id, phase, operator, scope, autograd node");
  sub->add_option("--step", o->step, "Only this step")->check(non_negative());
  sub->callback([o, &result] { result.exit_code = run_ls(*o); });
}

}  // namespace opguard::cli
