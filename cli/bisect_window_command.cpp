// opguard bisect window: the smallest sub-window, ending at --to, that still
// gives other bits under --bad than under --good when replayed free-running
// (bisect/include/opguard/bisect/window.h). A subcommand of `opguard bisect`.

#include <cstdio>
#include <memory>
#include <string>

#include "exit_codes.h"
#include "opguard/bisect/window.h"
#include "opguard/core/error.h"
#include "verbs.h"

namespace opguard::cli {
namespace {

constexpr const char* kWindowHelp = R"(Find where a window's divergence starts (docs/REPLAY.md).

  opguard bisect window REC --from ID --to ID --good CFG --bad CFG [--rank R] [--json]

Replays the events --from .. --to of one thread free-running (each replayed
output feeds the later events that read it) under --good and under --bad. If
the last event gives other bits under the two, it binary-searches the latest
start from which that is still so: the smallest sub-window START .. --to, whose
first op is where the divergence that reaches --to comes in. It prints every
trial, the sub-window event by event (same or differs between good and bad)
and the first event of it whose bits differ. The first event of each trial
replays its recorded inputs, so the recording must hold them in full.

--good and --bad are knobs set over the recording's recorded config (opguard
configs lists them); omitted, --good is the recorded config.

Exit code: 0 found, 4 nothing to bisect (the last event gives the same bits
under good and bad), 65 the window's end cannot be replayed or a bad
recording, 2 bad options, unknown event or knob.)";

struct WindowCliOptions {
  std::string dir, from, to, good, bad;
  int rank = 0;
  bool json = false;
};

int run_window(const WindowCliOptions& o) {
  if (o.dir.empty()) throw UsageError("bisect window needs a recording: REC --from ID --to ID --good CFG --bad CFG");
  if (o.from.empty() || o.to.empty()) throw UsageError("bisect window needs --from ID and --to ID");
  if (o.bad.empty()) throw UsageError("bisect window needs --bad CFG, the knobs under which the bits change");
  bisect::WindowBisectOptions w;
  w.recording = o.dir;
  w.rank = o.rank;
  w.from = o.from;
  w.to = o.to;
  // The window's first op's knobs (the knobs a program changes inside the
  // window are not followed: docs/BISECT.md).
  const replay::Config recorded = replay::event_recorded_config(o.dir, o.rank, o.from);
  w.good = recorded.overlaid(replay::Config::parse(o.good));
  w.bad = recorded.overlaid(replay::Config::parse(o.bad));
  w.self_exe = executable_dir() + "/opguard";
  const auto r = bisect::bisect_window(w);
  const std::string text = o.json ? bisect::window_json(r) + "\n" : bisect::window_text(r);
  std::fputs(text.c_str(), stdout);
  return r.nothing_to_bisect ? kExitNothing : kExitOk;
}

}  // namespace

void add_bisect_window_subcommand(CLI::App& bisect, VerbResult& result) {
  auto o = std::make_shared<WindowCliOptions>();
  CLI::App* s = bisect.add_subcommand("window", "Smallest free-running sub-window that still ends in the divergence");
  s->footer(kWindowHelp);
  s->add_option("recording", o->dir, "Recording holding the window's inputs in full");
  s->add_option("--from", o->from, "First event of the window");
  s->add_option("--to", o->to, "Last event of the window (its bits differ between good and bad)");
  s->add_option("--good", o->good, "Knobs of the good config, over the recorded config");
  s->add_option("--bad", o->bad, "Knobs of the bad config, over the recorded config");
  s->add_option("--rank", o->rank, "Rank (default 0)");
  s->add_flag("--json", o->json, "Machine-readable output (schema opguard-bisect-window/1)");
  s->callback([o, &result] { result.exit_code = run_window(*o); });
}

}  // namespace opguard::cli
