#pragma once
// Replay: re-execute a recorded operator in isolation (DESIGN.md, Rule 5) with
// exactly the recorded input bits, under a configuration, and compare what it
// computes with what the recording holds. No torch types here: bisect and the
// CLI call this without paying for torch headers; only replay/execute.cpp
// includes the dispatcher.
//
// A trial runs in this process when every knob it needs can be set here
// (threads, mkldnn, dtype, ...); a knob that is process-wide (the CPU
// capability, environment variables that libraries read once) runs the trial
// in a child process: opguard itself, re-executed with the environment set and
// the request as JSON (see ReplayOptions::self_exe), which prints its result as
// JSON for the parent to read back. Either way the caller gets the same result.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "opguard/core/dtype.h"
#include "opguard/formats/recording.h"
#include "opguard/kernels/compare.h"

namespace opguard::replay {

// --- configurations ------------------------------------------------------------

// One knob of `opguard configs`.
struct KnobInfo {
  std::string name;     // "threads", "cpu_capability", "env:NAME"
  std::string values;   // what it takes, as text ("positive integer", "default|avx2")
  std::string changes;  // what it changes in an op's numerics
  bool process_wide = false;  // applied by running the trial in a child process
  bool available = true;      // this build (and this machine) can apply it
  std::string unavailable_reason;  // why not, when !available
  // Needs a CUDA device (device=cuda:N, the GPU knobs): available where
  // cuda_device_count() finds one, which is asked only when such a knob is used.
  bool needs_cuda = false;
};
const std::vector<KnobInfo>& knob_table();

// The CUDA devices replay can run on. The first call loads libtorch_cuda.so
// from beside the libtorch_cpu opguard links (a few seconds); 0 with *why
// (one sentence) where it cannot load or the machine has no usable GPU.
int cuda_device_count(std::string* why);

// An ordered set of knob=value pairs. Later settings of the same knob win.
struct Config {
  std::vector<std::pair<std::string, std::string>> knobs;

  // "threads=2,cpu_capability=default,env:MKL_CBWR=COMPATIBLE". Throws
  // UsageError for an unknown knob, a bad value, or a knob this build cannot
  // apply (one sentence naming it and what to do).
  static Config parse(const std::string& text);
  std::string to_string() const;
  std::optional<std::string> get(const std::string& knob) const;
  void set(const std::string& knob, const std::string& value);
  // This config with every knob of `other` set over it.
  Config overlaid(const Config& other) const;
  bool empty() const { return knobs.empty(); }
};

// The configuration a recording was made under, as far as its manifest says
// (threads, cpu_capability, mkldnn, deterministic, float32 matmul precision,
// BLAS thread and MKL_CBWR environment variables).
Config recorded_config(const std::string& recording_dir, int rank);
// `run` (a recording's recorded_config) with the in-process knobs one of its
// ops recorded (formats::Event::knobs: threads, mkldnn, deterministic,
// float32_matmul_precision, flush_denormal) in place of the run's, which the
// manifest holds only for the start and a clean end. Unchanged for an event
// without them.
// The CUDA knobs (tf32_cublas, tf32_cudnn, cudnn_benchmark,
// cudnn_deterministic, reduced_precision_reduction) join where `run` names a
// CUDA device (they need one: Config::parse refuses them without), or
// always with kAlways (to print them).
enum class GpuKnobs { kWhereCuda, kAlways };
Config with_event_knobs(Config run, const formats::Event& ev, GpuKnobs gpu = GpuKnobs::kWhereCuda);
// recorded_config with the knobs of one event (with_event_knobs). Throws
// UsageError for an event the recording lacks.
Config event_recorded_config(const std::string& recording_dir, int rank, const std::string& event_id);
// The environment variables a recorded config carries (as env:NAME knobs) when
// the recorded run had them; a config without one means "unset": trials, and
// the programs of a repro bundle, run without it whatever their caller's
// environment holds.
const std::vector<std::string>& recorded_env_names();
// The knobs the program declared it applies itself (`opguard record
// --declare`, the manifest's declared_knobs): empty when it declared none.
// They describe the program, not its replay: a recording's own events are
// replayed without them (a declared tp=2 is already in its ops).
Config declared_config(const std::string& recording_dir, int rank);

// --- results -------------------------------------------------------------------

enum class Verdict { kReproduces, kDiffers, kCannotReplay };
const char* verdict_name(Verdict v);  // "reproduces", "differs", "cannot-replay"

// Why an event could not be replayed.
enum class CannotReason {
  kNone,
  kInputsNotRecorded,  // a tensor input has only a fingerprint (re-record with --dump-around)
  kOpUnknown,          // this libtorch has no such operator or overload
  kUnsupportedValue,   // an argument kind replay cannot rebuild (kOther, a CUDA generator, ...)
  kOpFailed,           // the op threw when re-executed
  kNothingToCompare,   // the op returned nothing observable (no outputs recorded)
  kChildFailed,        // a child-process trial died or printed no result
  kWrittenOutside,     // an input the recorder saw as an uninitialised buffer carried bits the op
                       // returns: they were written outside the dispatcher (torch.tensor(list),
                       // numpy, a custom kernel), so no recording holds them
};
const char* cannot_reason_name(CannotReason r);

struct OutputResult {
  int index = 0;          // position among the event's output values
  std::string name;       // return name, "" when the schema names none
  std::string kind;       // value kind name ("tensor", "int", ...)
  bool equal = true;      // the bits (or the value text) agree with the recording
  bool compared = true;   // false: the recording has no bits for it (uninitialised buffer)
  std::string note;       // why not compared, or a layout remark
  uint64_t recorded_fingerprint = 0;
  uint64_t replayed_fingerprint = 0;
  std::string recorded_text, replayed_text;  // non-tensor outputs
  std::vector<int64_t> sizes;
  std::string dtype;
  bool has_metrics = false;  // the recording held the full output, so element-wise metrics exist
  kernels::CompareResult metrics;
};

struct ReplayResult {
  std::string event;  // event id as text
  int rank = 0;
  int64_t step = 0;
  std::string phase;
  std::string op, overload, scope;
  std::string config;  // the effective config of the trial
  bool child_process = false;
  Verdict verdict = Verdict::kCannotReplay;
  CannotReason reason = CannotReason::kNone;
  std::string message;  // one sentence: why cannot-replay, or which output differs
  std::vector<OutputResult> outputs;
  double seconds = 0.0;  // wall time of the op call alone
  uint64_t input_bytes = 0;  // bytes of full input tensors read from the recording
  // Free-running windows: tensor inputs that got the bits an earlier replayed
  // event of the window wrote, instead of the recorded ones.
  int fed_inputs = 0;
};

// --- running -------------------------------------------------------------------

// A slice of one recorded input tensor along one dimension: the trial runs on
// elements [start, start + length) of dimension `dim` of input value
// `argument` (its position among the event's input values, as `opguard show`
// numbers them). The slice is dense, its dimensions in the same stride order
// as the recorded tensor (a transposed input stays transposed). Several slices
// of the same argument apply one after the other. With any slice the outputs
// have other shapes than the recorded ones, so they are not compared with the
// recording: the verdict is kReproduces when the op ran, each output has
// compared = false and its replayed fingerprint and sizes (compare two trials
// with each other). A slice out of range is a UsageError.
struct InputSlice {
  int argument = 0;
  int dim = 0;
  int64_t start = 0;
  int64_t length = 0;
};

struct ReplayOptions {
  int rank = 0;
  // Applied to the recorded inputs before the call (also in child trials).
  std::vector<InputSlice> slices;
  // Non-empty: the trial (in this process or the child) also writes what the
  // op received and returned to this directory, which it creates (its parent
  // must exist) and which must not hold those files yet: inputs.h5,
  // outputs.h5 and call.json (replay/save.h; the repro bundle's raw material).
  // Only for replay_event.
  std::string save_dir;
  // Knobs set over the recorded config. The trial runs under
  // recorded_config(...).overlaid(config) unless `from_recorded` is false.
  Config config;
  bool from_recorded = true;
  // How to start a child trial: the opguard executable. Its argv becomes
  // {self_exe, "replay", "--child-server"}; one child per environment serves
  // every trial under it (replay/trial_server.h). Empty: a trial that needs a
  // child fails with UsageError.
  std::string self_exe;
  // Compare against this recording's event instead of the replayed one's own
  // outputs (--expect). Its outputs must have the same count and kinds.
  std::string expect_dir;
  std::string expect_event;
  int expect_rank = 0;
  // replay_window only. free_running: an input that the recording shows
  // reading what an earlier event of the window wrote (same storage id, a
  // version that write explains, a fingerprint that agrees) gets the replayed
  // bits of that write, not the recorded ones (DESIGN.md, Rule 5; the rules
  // and what is not linked: replay/free_running.h, docs/REPLAY.md). The first
  // event replays its recorded inputs. window_keep_going: replay all n events
  // instead of stopping after the first that differs.
  bool free_running = false;
  bool window_keep_going = false;
};

// Replays one event. Throws UsageError for an event id that does not parse or
// is not in the recording, FormatError for a bad recording. Everything about
// the event itself (missing inputs, unknown op, the op failing) is a verdict,
// not an exception.
ReplayResult replay_event(const std::string& recording_dir, const std::string& event_id,
                          const ReplayOptions& options);

// Replays every event of the rank whose tensor inputs the recording holds in
// full (steps in order, events in execution order). `skipped` (optional) gets
// the number of events left out for want of full inputs.
std::vector<ReplayResult> replay_all(const std::string& recording_dir, const ReplayOptions& options,
                                     int64_t* skipped = nullptr);

// Replays events id, id+1, ... (n in all, same stream), each teacher-forced
// with its own recorded inputs, or free-running (ReplayOptions::free_running);
// stops after the first event that differs unless window_keep_going.
std::vector<ReplayResult> replay_window(const std::string& recording_dir, const std::string& first_event,
                                        int64_t n, const ReplayOptions& options);

// The `opguard record --dump-around` command that re-records the event's
// window with full tensors (from the manifest's record_command and cwd), or
// "" when the manifest does not hold the command.
std::string rerecord_command(const std::string& recording_dir, int rank, const std::string& event_id,
                             const std::string& opguard_command = "opguard");

// JSON for --json and for the child protocol.
std::string to_json(const std::vector<ReplayResult>& results);
std::vector<ReplayResult> results_from_json(const std::string& json);

// The child side of process-wide trials: serves the parent's requests, each
// run in this process (whose environment the parent has set), until its
// stdin closes (replay/trial_server.h). Returns the exit code for the child.
int child_server_main();

}  // namespace opguard::replay
