// opguard replay: re-execute recorded operators with their recorded input bits.

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "exit_codes.h"
#include "opguard/core/error.h"
#include "opguard/replay/replay.h"
#include "verbs.h"

namespace opguard::cli {
namespace {

constexpr const char* kHelp = R"(Re-execute a recorded operator through the dispatcher with exactly its recorded
input bits (teacher forcing), under the recorded config with --config's knobs
set over it, and compare its outputs with the recorded ones bitwise (with
element-wise metrics where the recording holds the full outputs).

The recording must hold the event's tensor inputs in full: record with
--dump-steps, --dump-all or --dump-around (the message says the command).
Process-wide knobs (cpu_capability, blas_threads, env:NAME) run the trial in a
child opguard process. `opguard configs` lists every knob.

Examples:
  opguard replay runB2 --event 1234
  opguard replay runB2 --event 1234 --config threads=1,cpu_capability=default --json
  opguard replay runA --event 1234 --config cpu_capability=default --expect runB --expect-event 1230
  opguard replay runB2 --all
  opguard replay runB2 --event 1234 --window 20
  opguard replay runB2 --event 1234 --window 20 --free-running

--window N replays N consecutive events of the event's thread, each with its
recorded inputs (teacher-forced); with --free-running, an input that the
recording shows reading an earlier window event's output gets the replayed
bits instead (docs/REPLAY.md says what is linked). Either way it stops after
the first event that differs and names it.

Exit code: 0 the replay reproduces the recorded bits (--all, --window: every
event replayed does), 3 it differs, 65 the event cannot be replayed (inputs not
recorded in full, an operator this libtorch lacks, an argument replay cannot
rebuild) or the recording is bad, 2 bad options, unknown event or knob.)";

std::string fp_text(uint64_t fp) { return fmt::format("{:016x}", fp); }

std::string ulp_text(uint64_t ulp) {
  return ulp == kernels::kUlpInfinite ? std::string("inf") : std::to_string(ulp);
}

std::string result_text(const replay::ReplayResult& r, bool detail) {
  std::string t = fmt::format("event {} (rank {}, step {}, {}) {}{}\n", r.event, r.rank, r.step, r.phase,
                              formats::op_text(r.op, r.overload), r.scope.empty() ? "" : "  [" + r.scope + "]");
  t += fmt::format("  config   {}{}\n", r.config.empty() ? "(as recorded)" : r.config,
                   r.child_process ? "  (child process)" : "");
  if (r.fed_inputs > 0) t += fmt::format("  inputs   {} fed from earlier replayed events (free-running)\n", r.fed_inputs);
  std::string verdict = replay::verdict_name(r.verdict);
  if (r.verdict == replay::Verdict::kCannotReplay) verdict += fmt::format(" ({})", replay::cannot_reason_name(r.reason));
  t += fmt::format("  verdict  {}{}\n", verdict, r.message.empty() ? "" : ": " + r.message);
  if (!detail) return t;
  for (const auto& o : r.outputs) {
    const std::string label = fmt::format("output {}{}", o.index, o.name.empty() ? "" : " " + o.name);
    if (o.kind == "tensor" || o.kind == "generator") {
      std::string line = fmt::format("  {:<12} {} [{}] recorded {} replayed {} {}", label, o.dtype,
                                     fmt::join(o.sizes, ","), fp_text(o.recorded_fingerprint),
                                     fp_text(o.replayed_fingerprint),
                                     !o.compared ? "not compared" : o.equal ? "equal" : "DIFFERS");
      t += line + "\n";
      if (o.has_metrics && !o.metrics.equal()) {
        const auto& m = o.metrics;
        t += fmt::format("               {} of {} elements differ ({:.3g}%), max {} ULP, max abs {:.6g}, max rel {:.6g}\n",
                         m.differing, m.numel, 100.0 * m.differing_fraction(), ulp_text(m.max_ulp), m.max_abs_error,
                         m.max_rel_error);
        t += fmt::format("               first at [{}]: recorded {:.9g} (0x{:x}), replayed {:.9g} (0x{:x})\n",
                         m.first_index, m.first_a, m.first_a_bits, m.first_b, m.first_b_bits);
        if (m.nan_a || m.nan_b || m.inf_a || m.inf_b)
          t += fmt::format("               NaN {} / {}, Inf {} / {} (recorded / replayed)\n", m.nan_a, m.nan_b,
                           m.inf_a, m.inf_b);
      }
    } else {
      t += fmt::format("  {:<12} {} recorded {} replayed {} {}\n", label, o.kind, o.recorded_text, o.replayed_text,
                       o.equal ? "equal" : "DIFFERS");
    }
    if (!o.note.empty()) t += fmt::format("               {}\n", o.note);
  }
  return t;
}

struct Options {
  std::string dir, event, config, expect, expect_event;
  int rank = 0, expect_rank = 0;
  int64_t window = 0;
  bool all = false, json = false, verbose = false, ignore_recorded = false, free_running = false;
  bool child_server = false;  // the child side of process-wide trials (replay/trial_server.h)
};

replay::ReplayOptions library_options(const Options& o) {
  replay::ReplayOptions r;
  r.rank = o.rank;
  r.config = replay::Config::parse(o.config);
  r.from_recorded = !o.ignore_recorded;
  r.self_exe = executable_dir() + "/opguard";
  r.expect_dir = o.expect;
  r.expect_event = o.expect_event;
  r.expect_rank = o.expect_rank;
  r.free_running = o.free_running;
  return r;
}

int run_one(const Options& o) {
  const auto options = library_options(o);
  // Here, not in a trial's child process, whose failure reads "child-failed".
  if (!o.expect.empty()) formats::scan_recording(o.expect);
  const auto r = replay::replay_event(o.dir, o.event, options);
  if (o.json) {
    std::printf("%s\n", replay::to_json({r}).c_str());
  } else {
    std::fputs(result_text(r, true).c_str(), stdout);
  }
  if (r.verdict == replay::Verdict::kReproduces) return kExitOk;
  if (r.verdict == replay::Verdict::kDiffers) return kExitDiverged;
  if (r.reason == replay::CannotReason::kInputsNotRecorded) {
    const std::string cmd = replay::rerecord_command(o.dir, o.rank, r.event, executable_dir() + "/opguard");
    if (cmd.empty())
      std::fprintf(stderr, "opguard: %s holds only fingerprints for this event and its manifest has no record "
                           "command: re-record the program with --dump-around %s\n", o.dir.c_str(), r.event.c_str());
    else
      std::fprintf(stderr,
                   "opguard: re-record this event's window with full tensors (add the program's own environment "
                   "variables; the recording holds only those that change numerics):\n  %s\n",
                   cmd.c_str());
  }
  return kExitFormat;
}

int run_many(const Options& o) {
  const auto options = library_options(o);
  int64_t skipped = 0;
  std::vector<replay::ReplayResult> results;
  if (o.all) results = replay::replay_all(o.dir, options, &skipped);
  else results = replay::replay_window(o.dir, o.event, o.window, options);
  int64_t reproduces = 0, differs = 0, cannot = 0;
  uint64_t bytes = 0;
  double seconds = 0.0;
  std::map<std::string, int64_t> reasons;
  for (const auto& r : results) {
    reproduces += r.verdict == replay::Verdict::kReproduces;
    differs += r.verdict == replay::Verdict::kDiffers;
    if (r.verdict == replay::Verdict::kCannotReplay) {
      ++cannot;
      ++reasons[replay::cannot_reason_name(r.reason)];
    }
    bytes += r.input_bytes;
    seconds += r.seconds;
  }
  const int64_t n = static_cast<int64_t>(results.size());
  if (o.json) {
    nlohmann::json j;
    j["replayed"] = n;
    j["skipped"] = skipped;
    j["reproduces"] = reproduces;
    j["differs"] = differs;
    j["cannot_replay"] = cannot;
    j["fraction_reproduces"] = n > 0 ? static_cast<double>(reproduces) / n : 0.0;
    j["op_seconds"] = seconds;
    j["input_bytes"] = bytes;
    j["results"] = nlohmann::json::parse(replay::to_json(results));
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    for (const auto& r : results)
      if (o.verbose || r.verdict != replay::Verdict::kReproduces) std::fputs(result_text(r, o.verbose || !o.all).c_str(), stdout);
    std::printf("%s %lld events%s: %lld reproduce bitwise (%.1f%%), %lld differ, %lld cannot be replayed",
                o.all ? "replayed" : "window of", static_cast<long long>(n),
                o.all ? fmt::format(" with full inputs ({} without)", skipped).c_str() : "",
                static_cast<long long>(reproduces), n > 0 ? 100.0 * reproduces / n : 0.0,
                static_cast<long long>(differs), static_cast<long long>(cannot));
    std::string why;
    for (const auto& [reason, count] : reasons) why += fmt::format("{}{} {}", why.empty() ? "" : ", ", count, reason);
    std::printf("%s\n", why.empty() ? "" : (" (" + why + ")").c_str());
    std::printf("ops ran %.3f s on %.1f MiB of recorded inputs\n", seconds, bytes / 1048576.0);
  }
  if (n == 0) {
    std::fprintf(stderr, "opguard: %s holds no event with full input tensors: record with --dump-steps N or "
                         "--dump-around ID\n", o.dir.c_str());
    return kExitFormat;
  }
  if (differs > 0) return kExitDiverged;
  // A window none of whose events could be replayed (its first event has no
  // full inputs, say) is not a window that reproduces.
  if (!o.all && reproduces == 0 && cannot > 0) return kExitFormat;
  return kExitOk;
}

}  // namespace

void add_replay_command(CLI::App& app, VerbResult& result) {
  auto o = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand("replay", "Re-execute recorded operators with their recorded inputs");
  sub->footer(kHelp);
  sub->add_option("recording", o->dir, "Recording directory");
  CLI::Option* event = sub->add_option("--event,-e", o->event, "Event id (the first one with --window)");
  sub->add_flag("--all", o->all, "Replay every event whose inputs the recording holds in full")->excludes(event);
  sub->add_option("--window", o->window, "Replay N consecutive events from --event, teacher-forced; stop at the first that differs")
      ->check(at_least_one());
  sub->add_flag("--free-running", o->free_running,
                "--window: feed the replayed outputs to the later events that read them (default: teacher-forced)");
  sub->add_option("--rank", o->rank, "Rank (default 0)");
  sub->add_option("--config,-c", o->config, "Knobs set over the recorded config: k=v,... (opguard configs lists them)");
  sub->add_flag("--ignore-recorded-config", o->ignore_recorded, "Run under this process's settings plus --config only");
  CLI::Option* expect =
      sub->add_option("--expect", o->expect, "Compare with this other recording's event instead of the replayed event's outputs");
  sub->add_option("--expect-event", o->expect_event, "The event of --expect (default: the same id)")->needs(expect);
  sub->add_option("--expect-rank", o->expect_rank, "The rank of --expect (default 0)")->needs(expect);
  sub->add_flag("--json", o->json, "Machine-readable output");
  sub->add_flag("--verbose,-v", o->verbose, "--all, --window: print every event, not only those that do not reproduce");
  // The child side of a process-wide trial (see replay.h); not for users.
  sub->add_flag("--child-server", o->child_server)->group("");
  sub->callback([o, &result] {
    if (o->child_server) {
      result.exit_code = replay::child_server_main();
      return;
    }
    if (o->dir.empty()) throw UsageError("replay needs a recording: opguard replay DIR --event ID");
    const int modes = (o->all ? 1 : 0) + (o->window > 0 ? 1 : 0);
    if (modes > 1) throw UsageError("--all and --window exclude each other");
    if (!o->all && o->event.empty()) throw UsageError("replay needs --event ID, or --all");
    if (o->all && !o->expect.empty()) throw UsageError("--expect compares one event: use it with --event");
    if (o->free_running && o->window <= 0) throw UsageError("--free-running needs --window N");
    if (o->all || o->window > 0) result.exit_code = run_many(*o);
    else result.exit_code = run_one(*o);
  });
}

}  // namespace opguard::cli
