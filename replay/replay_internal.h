#pragma once
// Shared between the torch-free files of opguard_replay.

#include <cstdint>
#include <string>
#include <vector>

#include "opguard/formats/recording.h"
#include "opguard/replay/replay.h"

namespace opguard::replay::detail {

// Environment variables from a recording's manifest that become env: knobs of
// its recorded config: they change the numerics of BLAS, oneDNN or cuBLAS and
// are read once per process. A config that does not set one runs without it.
inline constexpr const char* kRecordedEnv[] = {
    "MKL_CBWR",         "MKL_NUM_THREADS",            "OPENBLAS_NUM_THREADS",     "MKL_ENABLE_INSTRUCTIONS",
    "MKL_DYNAMIC",      "DNNL_MAX_CPU_ISA",           "ONEDNN_MAX_CPU_ISA",       "DNNL_DEFAULT_FPMATH_MODE",
    "ONEDNN_DEFAULT_FPMATH_MODE", "NVIDIA_TF32_OVERRIDE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"};

// flush_denormal's value as the threads whose MXCSR flushes: `on` every
// thread, `off` none, `main` only the thread that calls the op, `workers` only
// torch's intra-op threads. torch.set_flush_denormal sets the calling
// thread's MXCSR, and an intra-op worker keeps the one it was created with:
// a program that calls it after its first parallel op runs as `main`, one
// that clears it after its first parallel op as `workers`.
struct FlushDenormal {
  bool caller = false;
  bool workers = false;
};
inline FlushDenormal flush_denormal_of(const std::string& value) {
  return {value == "on" || value == "main", value == "on" || value == "workers"};
}
inline std::string flush_denormal_value(FlushDenormal f) {
  return f.caller ? (f.workers ? "on" : "main") : (f.workers ? "workers" : "off");
}

// What a child trial is asked to do: the effective config (already overlaid on
// the recorded one) and which events.
struct Request {
  enum class Mode { kEvent, kAll, kWindow };
  Mode mode = Mode::kEvent;
  std::string dir;
  int rank = 0;
  std::string config;  // Config::to_string() of the effective config
  // Whether `config` starts from the recording's config (ReplayOptions::
  // from_recorded): each event then replays under the knobs it recorded
  // (with_event_knobs) with `user_config`, what the caller set, over them.
  bool event_knobs = false;
  std::string user_config;
  std::string event;   // kEvent, kWindow: the (first) event
  int64_t window = 0;  // kWindow: how many events
  std::string expect_dir, expect_event;
  int expect_rank = 0;
  std::vector<InputSlice> slices;
  std::string save_dir;  // kEvent: ReplayOptions::save_dir
  bool free_running = false;  // kWindow: ReplayOptions::free_running
  bool keep_going = false;    // kWindow: ReplayOptions::window_keep_going
};

// Applies `slices` to a copy of an event's inputs: `inputs` are ev.inputs
// (metadata rewritten to the dense sliced layout) and `data` their full
// contents where recorded (sliced in place). Throws UsageError for a slice
// that names no tensor input, a dimension it lacks, or a range outside it.
void apply_slices(const std::vector<InputSlice>& slices, std::vector<formats::Value>& inputs,
                  std::vector<formats::TensorData>& data);

struct Outcome {
  std::vector<ReplayResult> results;
  int64_t skipped = 0;
};

std::string request_to_json(const Request& r);
Request request_from_json(const std::string& json);
std::string outcome_to_json(const Outcome& o);
Outcome outcome_from_json(const std::string& json);

}  // namespace opguard::replay::detail
