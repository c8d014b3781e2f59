// opguard bisect config | shrink | run: the knobs that flip an operator's
// bits, the smallest inputs that still show it, and the whole pipeline from
// two recordings to a repro bundle (docs/BISECT.md).

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "exit_codes.h"
#include "opguard/bisect/bisect.h"
#include "opguard/core/error.h"
#include "verbs.h"

namespace opguard::cli {
namespace {

constexpr const char* kHelp = R"(Bisect a divergent operator (docs/BISECT.md).

  opguard bisect config REC --event ID --good CFG --bad CFG [--rank R] [--json]
    Delta debugging (ddmin) over the knobs in which good and bad differ: each
    trial replays the event under good with a subset of the bad knobs set over
    it. Prints every trial with its outcome (good, bad, other bits, failed)
    and the 1-minimal knob set that turns the good bits into the bad ones.
  opguard bisect shrink REC --event ID --good CFG --bad CFG [--rank R] [--json]
    Cuts the event's tensor inputs (halving, then finer) while good and bad
    still give different bits; prints the original and final shapes and bytes.
  opguard bisect run REF SUSPECT -o DIR [--rank R] [--json] [--check-with PYTHON]
    diff -> re-record around the first divergent operator with full tensors
    when needed -> replay under both runs' recorded configs -> bisect config
    -> shrink -> repro bundle in DIR/bundle. Re-recordings go to DIR/work.

  opguard bisect window REC --from ID --to ID ...   (opguard bisect window --help)

--good and --bad are knobs set over the recording's recorded config
(opguard configs lists the knobs); omitted, --good is the recorded config.

Exit code: 0 found (a knob set, shrunk inputs, a bundle), 4 nothing to bisect
(good and bad give the same bits; run: the runs do not diverge), 65 the event
cannot be replayed (inputs not recorded in full and no record command, op
unknown) or a bad recording, 2 bad options, unknown event or knob, 74 run: DIR
cannot be written, 127 run: the --check-with Python cannot be started.)";

struct Options {
  std::string dir, event, good, bad, out, suspect, check_python;
  int rank = 0, max_trials = 120;
  bool json = false;
};

bisect::TrialTarget target_of(const Options& o) {
  if (o.dir.empty()) throw UsageError("bisect config and shrink need a recording: REC --event ID --good CFG --bad CFG");
  if (o.event.empty()) throw UsageError("bisect config and shrink need --event ID (opguard diff names it)");
  return bisect::TrialTarget{o.dir, o.event, o.rank, executable_dir() + "/opguard", {}};
}

// --good / --bad over the recorded config (with the event's own knobs).
std::pair<replay::Config, replay::Config> configs_of(const Options& o) {
  if (o.bad.empty()) throw UsageError("bisect needs --bad CFG, the knobs under which the bits change");
  target_of(o);  // a recording and an event, or one sentence saying which is missing
  const replay::Config recorded = replay::event_recorded_config(o.dir, o.rank, o.event);
  return {recorded.overlaid(replay::Config::parse(o.good)), recorded.overlaid(replay::Config::parse(o.bad))};
}

void print(const std::string& text) { std::fputs(text.c_str(), stdout); }

int run_config(const Options& o) {
  const auto [good, bad] = configs_of(o);
  const auto r = bisect::bisect_config(bisect::ConfigSearchOptions{target_of(o), good, bad});
  print(o.json ? bisect::config_json(r) + "\n" : bisect::config_text(r));
  return r.nothing_to_bisect ? kExitNothing : kExitOk;
}

int run_shrink(const Options& o) {
  const auto [good, bad] = configs_of(o);
  bisect::ShrinkOptions s;
  s.target = target_of(o);
  s.good = good;
  s.bad = bad;
  s.max_trials = o.max_trials;
  const auto r = bisect::shrink_inputs(s);
  print(o.json ? bisect::shrink_json(r) + "\n" : bisect::shrink_text(r));
  return r.diverges ? kExitOk : kExitNothing;
}

// Whether `program` names an executable file, as posix_spawnp would find it
// (a name without a slash is looked up on PATH).
bool can_execute(const std::string& program) {
  if (program.find('/') != std::string::npos) return ::access(program.c_str(), X_OK) == 0;
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  for (std::size_t begin = 0; begin <= dirs.size();) {
    std::size_t end = dirs.find(':', begin);
    if (end == std::string::npos) end = dirs.size();
    const std::string dir = end > begin ? dirs.substr(begin, end - begin) : ".";
    if (::access((dir + "/" + program).c_str(), X_OK) == 0) return true;
    begin = end + 1;
  }
  return false;
}

int run_pipeline(const Options& o) {
  if (o.dir.empty() || o.suspect.empty()) throw UsageError("bisect run needs two recordings: REF SUSPECT -o DIR");
  if (o.out.empty()) throw UsageError("bisect run needs -o DIR for the re-recordings and the bundle");
  // Before the pipeline runs, not after it (the check is its last stage).
  if (!o.check_python.empty() && !can_execute(o.check_python))
    throw LaunchError(fmt::format("cannot start {}: no such executable (--check-with)", o.check_python));
  bisect::RunOptions r;
  r.reference = o.dir;
  r.suspect = o.suspect;
  r.out_dir = o.out;
  r.rank = o.rank;
  r.self_exe = executable_dir() + "/opguard";
  r.shrink_max_trials = o.max_trials;
  r.python = o.check_python;
  // A terminal gets one status line rewritten in place; a pipe or file gets plain lines.
  const bool tty = isatty(STDERR_FILENO) != 0;
  const auto t0 = std::chrono::steady_clock::now();
  r.progress = [tty, t0](const std::string& line) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (tty) std::fprintf(stderr, "\r\033[K[%6.1f s] %s", s, line.c_str());
    else std::fprintf(stderr, "opguard bisect: [%.1f s] %s\n", s, line.c_str());
    std::fflush(stderr);
  };
  const auto res = bisect::bisect_run(r);
  if (tty) std::fputs("\r\033[K", stderr);
  print(o.json ? bisect::run_json(res) + "\n" : bisect::run_text(res));
  switch (res.status) {
    case bisect::RunResult::Status::kFound: return kExitOk;
    case bisect::RunResult::Status::kNoDivergence:
    case bisect::RunResult::Status::kNothingToBisect: return kExitNothing;
    case bisect::RunResult::Status::kNotReplayable: return kExitFormat;
  }
  return kExitInternal;
}

}  // namespace

void add_bisect_command(CLI::App& app, VerbResult& result) {
  auto o = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand("bisect", "Find the knobs and the smallest inputs that flip an operator's bits");
  sub->footer(kHelp);
  sub->require_subcommand(1);
  // `shrinks`: the verb shrinks inputs (shrink, run), so it takes --max-trials.
  auto common = [&](CLI::App* s, bool shrinks) {
    s->add_option("--rank", o->rank, "Rank (default 0)");
    s->add_flag("--json", o->json, "Machine-readable output (schema opguard-bisect/1)");
    if (shrinks)
      s->add_option("--max-trials", o->max_trials, "Shrink: at most this many slice candidates (default 120)")
          ->check(at_least_one());
  };
  auto event_verb = [&](const char* name, const char* what, int (*fn)(const Options&), bool shrinks) {
    CLI::App* s = sub->add_subcommand(name, what);
    s->footer(kHelp);
    s->add_option("recording", o->dir, "Recording holding the event's inputs in full");
    s->add_option("--event,-e", o->event, "Event id");
    s->add_option("--good", o->good, "Knobs of the good config, over the recorded config");
    s->add_option("--bad", o->bad, "Knobs of the bad config, over the recorded config");
    common(s, shrinks);
    s->callback([o, &result, fn] { result.exit_code = fn(*o); });
  };
  event_verb("config", "ddmin over the knobs in which good and bad differ", run_config, false);
  event_verb("shrink", "Shrink the inputs while good and bad still differ", run_shrink, true);
  CLI::App* run = sub->add_subcommand("run", "diff, re-record, replay, bisect config, shrink, bundle");
  run->footer(kHelp);
  run->add_option("reference", o->dir, "Reference recording")->required();
  run->add_option("suspect", o->suspect, "Suspect recording")->required();
  run->add_option("-o,--out", o->out, "Output directory (re-recordings, bundle)");
  run->add_option("--check-with", o->check_python, "Run the bundle's repro.py with this Python to check it");
  common(run, true);
  run->callback([o, &result] { result.exit_code = run_pipeline(*o); });
  add_bisect_window_subcommand(*sub, result);  // bisect_window_command.cpp
}

}  // namespace opguard::cli
