#pragma once
// opguard bisect window: for a window of events whose last event gives other
// bits under a bad config than under a good one when the window is replayed
// free-running, the latest event from which a free-running replay still shows
// that difference at the window's end (the smallest sub-window that ends
// there), and the first event of that sub-window whose own bits differ. No
// torch: each trial is a replay::replay_window. docs/REPLAY.md describes it.

#include <cstdint>
#include <string>
#include <vector>

#include "opguard/replay/replay.h"

namespace opguard::bisect {

struct WindowBisectOptions {
  std::string recording;
  int rank = 0;
  std::string from, to;  // event ids of one stream, from <= to
  // Full configs: each trial runs under exactly these (the CLI overlays
  // --good and --bad on the recorded config).
  replay::Config good, bad;
  std::string self_exe;  // opguard itself, for child-process trials
};

// One trial: the window [start, to] replayed free-running under good and bad.
struct WindowTrial {
  std::string start;     // first event of the sub-window
  int64_t events = 0;    // its length
  bool diverges = false;  // the end event's replayed bits differ between good and bad
  std::string message;   // why it does not count (an event that could not be replayed)
  double seconds = 0.0;  // both replays, child processes included
};

// An event of the smallest sub-window, as the good and the bad replay saw it.
struct WindowEvent {
  std::string event, op;
  bool differs = false;  // good and bad gave other bits
  int fed_inputs = 0;    // inputs fed from earlier events of the sub-window (good replay)
};

struct WindowBisectResult {
  std::string recording, from, to, good_config, bad_config;
  int64_t window_events = 0;
  bool nothing_to_bisect = false;  // the end gives the same bits under good and bad
  std::string start, start_op;     // first event of the smallest sub-window [start, to]
  int64_t sub_window_events = 0;
  std::string first_differing, first_differing_op;  // first event of it whose bits differ
  std::vector<WindowEvent> events;                   // the sub-window, in order
  std::vector<WindowTrial> trials;                   // in the order they ran
  int replays = 0;                                   // replay_window calls (2 per trial)
};

// Throws UsageError for unknown or out-of-order events, or events of two
// streams; FormatError when the window's end cannot be replayed under good
// or bad at all (for example inputs not recorded: the message says why).
WindowBisectResult bisect_window(const WindowBisectOptions& options);

std::string window_text(const WindowBisectResult& r);
std::string window_json(const WindowBisectResult& r);  // schema "opguard-bisect-window/1"

}  // namespace opguard::bisect
