#pragma once
// opguard bisect: from a divergent operator to the knobs that flip its bits
// (config search, delta debugging), to the smallest inputs that still show it
// (shrink), and the whole pipeline from two recordings (run). No torch: every
// trial is a replay::replay_event. docs/BISECT.md documents the algorithms,
// the text output and the JSON schema ("opguard-bisect/1").

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "opguard/replay/replay.h"

namespace opguard::bisect {

// --- delta debugging -------------------------------------------------------------

// What one trial of a subset of changes gives: the good bits, the bad bits,
// other bits than both, or no bits at all (the op failed under that config).
// Only kBad counts as "the divergence is there"; kOther and kFailed are what
// Zeller calls unresolved.
enum class TrialOutcome { kGood, kBad, kOther, kFailed };
const char* trial_outcome_name(TrialOutcome o);  // "good", "bad", "other", "failed"

// The oracle gets a subset of change indices (sorted, each in [0, n)).
using Oracle = std::function<TrialOutcome(const std::vector<int>& subset)>;

struct DdminResult {
  std::vector<int> minimal;  // sorted change indices
  bool one_minimal = false;  // every subset with one change of `minimal` removed is not kBad (checked)
  int oracle_calls = 0;      // distinct subsets asked (the result is cached per subset)
};

// ddmin (Zeller and Hildebrandt 2002, "Simplifying and isolating
// failure-inducing input") over changes 0..n-1: a subset that gives kBad and
// from which no single change can be removed. Precondition, checked by the
// callers: the full set gives kBad and the empty set does not.
DdminResult ddmin(int n, const Oracle& oracle);

// --- bisect config ---------------------------------------------------------------

// A knob in which the good and the bad config differ; "" for a knob the config
// does not set (the trial then leaves it as the process has it).
struct KnobChange {
  std::string knob;
  std::string good_value, bad_value;
  std::string text() const;  // "threads: 2 -> 1"
};

// The bits a trial computed: per output, its replayed fingerprint or value text.
struct Bits {
  std::vector<std::string> outputs;  // "float32[4,8]:0123456789abcdef" or "int:3"
  bool operator==(const Bits& o) const { return outputs == o.outputs; }
  bool operator!=(const Bits& o) const { return !(*this == o); }
};

struct Trial {
  std::vector<std::string> knobs;  // the bad knobs applied over good ("" none)
  std::string config;              // the full config it ran under
  TrialOutcome outcome = TrialOutcome::kFailed;
  std::string message;             // why it failed, or the replay's message
  bool child_process = false;
  double seconds = 0.0;            // wall time of the trial, child start included
};

struct TrialTarget {
  std::string recording;
  std::string event;
  int rank = 0;
  std::string self_exe;  // opguard itself, for child-process trials
  std::vector<replay::InputSlice> slices;
};

struct ConfigSearchOptions {
  TrialTarget target;
  // Full configs (the pipeline passes the two runs' recorded configs); the CLI
  // passes --good and --bad overlaid on the recording's recorded config.
  replay::Config good, bad;
};

struct ConfigSearchResult {
  std::vector<KnobChange> differences;  // every knob good and bad differ in
  bool nothing_to_bisect = false;       // good and bad give the same bits (or no knob differs)
  std::vector<KnobChange> minimal;      // the knob set that turns the good bits into the bad ones
  bool one_minimal = false;
  std::vector<Trial> trials;            // every distinct trial, in the order run
  int trial_count = 0;                  // replays run (cached repeats not counted)
  Bits good_bits, bad_bits;
  std::string message;                  // one sentence when nothing_to_bisect or not 1-minimal
  std::string op;                       // the event's operator
  double seconds = 0.0;
};

// The config `good` with the bad values of `changes` set (a "" bad value
// removes the knob).
replay::Config apply_changes(const replay::Config& good, const std::vector<KnobChange>& changes);
std::vector<KnobChange> config_differences(const replay::Config& good, const replay::Config& bad);

// Throws UsageError for an unknown event or bad config, FormatError when the
// good or the bad config itself cannot replay the event (its message says why:
// inputs not recorded, op unknown).
ConfigSearchResult bisect_config(const ConfigSearchOptions& options);

// --- bisect shrink ---------------------------------------------------------------

struct ShrinkOptions {
  TrialTarget target;  // target.slices: where to start (usually none)
  replay::Config good, bad;
  int max_trials = 120;  // each trial replays the event twice (good and bad)
};

struct InputShape {
  int argument = 0;  // position among the event's inputs
  std::string name;
  std::string dtype;
  std::vector<int64_t> sizes;
  uint64_t bytes = 0;     // logical size (numel x element size)
  bool recorded = true;   // the recording holds its data (false: an uninitialised buffer)
};

struct ShrinkResult {
  bool diverges = false;  // good and bad differ on the original inputs
  std::vector<replay::InputSlice> slices;  // the final slices (one per shrunk argument and dimension)
  std::vector<InputShape> original, final;  // every full tensor input
  uint64_t original_bytes = 0, final_bytes = 0;
  int trials = 0;       // slice candidates tried (each: a good and a bad replay)
  int accepted = 0;     // candidates that kept the divergence
  bool budget_exhausted = false;
  Bits good_bits, bad_bits;  // on the final slices
  std::string message;
  double seconds = 0.0;
};

// Throws like bisect_config.
ShrinkResult shrink_inputs(const ShrinkOptions& options);

// --- bisect run ------------------------------------------------------------------

struct RunOptions {
  std::string reference, suspect;
  std::string out_dir;          // work directories (re-recordings) and the bundle go here
  int rank = 0;
  std::string self_exe;         // opguard itself
  int dump_radius = 4;          // R of the re-recording's --dump-around ID:R
  int shrink_max_trials = 120;
  bool write_bundle = true;
  std::string python;           // non-empty: run the bundle's repro.py with it (check_bundle)
  // Progress, one line at a time (the library does not print).
  std::function<void(const std::string&)> progress;
};

struct StageTime {
  std::string stage;  // "diff", "re-record", "replay", "bisect config", "shrink", "bundle"
  double seconds = 0.0;
};

struct RunResult {
  enum class Status {
    kFound,          // a knob set explains the divergence
    kNoDivergence,   // the runs do not diverge
    kNothingToBisect,  // the two configs give the same bits for the divergent op, or no op diverged
                       // (the runs differ only in events one of them has, or a missing step)
    kNotReplayable,  // the divergent op cannot be replayed (no full tensors, no record command, ...)
  };
  Status status = Status::kNotReplayable;
  std::string message;
  std::string event;                     // the first divergent event (reference id)
  std::string op, scope, phase;
  int64_t step = 0;
  std::string recording;                 // the recording the trials replayed (re-recorded or REF)
  bool rerecorded = false;
  // Replayed under the suspect's recorded config, the reference's event gives
  // the suspect's recorded bits: the recorded knobs explain the divergence.
  bool suspect_bits_explained = false;
  std::optional<ConfigSearchResult> config;
  std::optional<ShrinkResult> shrink;
  std::string bundle_dir;                // "" when no bundle was written
  std::string bundle_note;               // why not, or what the bundle check said
  std::vector<StageTime> stages;
  double seconds = 0.0;
};

RunResult bisect_run(const RunOptions& options);

// --- output ----------------------------------------------------------------------

std::string config_text(const ConfigSearchResult& r);
std::string shrink_text(const ShrinkResult& r);
std::string run_text(const RunResult& r);
// JSON, schema "opguard-bisect/1" (docs/BISECT.md); "verb" is config, shrink or run.
std::string config_json(const ConfigSearchResult& r);
std::string shrink_json(const ShrinkResult& r);
std::string run_json(const RunResult& r);

}  // namespace opguard::bisect
