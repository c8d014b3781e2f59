// Finding events, reading their full tensors, deciding in-process vs child
// trials, and comparing replayed outputs with recorded ones. No torch here:
// execute.cpp runs the op.

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "execute.h"
#include "opguard/core/error.h"
#include "opguard/formats/recording.h"
#include "opguard/formats/rerecord.h"
#include "opguard/kernels/fingerprint.h"
#include "free_running.h"
#include "replay_internal.h"
#include "save.h"
#include "trial_server.h"

namespace opguard::replay {
namespace {

using formats::Event;
using formats::StepReader;
using formats::TensorData;
using formats::Value;
using formats::ValueKind;

const formats::RankFiles& rank_files(const formats::RecordingLayout& layout, const std::string& dir, int rank) {
  for (const auto& r : layout.ranks)
    if (r.rank == rank) return r;
  throw UsageError(fmt::format("{} has no rank {}: opguard ls lists its ranks", dir, rank));
}

uint64_t parse_id(const std::string& text) {
  auto id = formats::parse_event_id(text);
  if (!id)
    throw UsageError(fmt::format("'{}' is not an event id: use a number such as 1234, or STREAM.SEQ such as 2.57", text));
  return *id;
}

// An event and the step file it lives in (kept open for its tensors).
struct Located {
  std::shared_ptr<StepReader> reader;
  const Event* event = nullptr;
};

Located locate(const std::string& dir, int rank, const std::string& event_text) {
  const uint64_t id = parse_id(event_text);
  const auto layout = formats::scan_recording(dir);
  const auto& files = rank_files(layout, dir, rank);
  for (const auto& [step, path] : files.steps) {
    auto reader = std::make_shared<StepReader>(path);
    for (const auto& ev : reader->events())
      if (ev.id == id) return Located{reader, &ev};
  }
  throw UsageError(formats::no_event_message(dir, event_text, rank));
}

// Whether a tensor input's bits matter and are missing.
bool needs_data(const formats::TensorMeta& m) {
  if (m.flags & formats::kTensorUninitialized) return false;  // contents unobservable
  if (m.numel() == 0) return false;
  return (m.flags & formats::kTensorHasData) == 0;
}

bool replayable_inputs(const Event& ev) {
  for (const auto& v : ev.inputs)
    if (formats::carries_tensor(v.kind) && needs_data(v.tensor)) return false;
  return true;
}

detail::Settings settings_of(const Config& c) {
  detail::Settings s;
  if (auto v = c.get("threads")) s.threads = std::stoi(*v);
  if (auto v = c.get("mkldnn")) s.mkldnn = *v == "on";
  if (auto v = c.get("deterministic")) s.deterministic = *v == "on";
  if (auto v = c.get("flush_denormal")) s.flush_denormal = detail::flush_denormal_of(*v);
  if (auto v = c.get("float32_matmul_precision")) s.matmul_precision = *v;
  if (auto v = c.get("dtype")) s.dtype = dtype_from_name(*v);
  if (auto v = c.get("tp")) s.tp = std::stoi(*v);
  if (auto v = c.get("microbatches")) s.microbatches = std::stoi(*v);
  if (auto v = c.get("reduce")) s.reduce = *v;
  if (auto v = c.get("device"); v && *v != "cpu") s.device = *v;
  if (auto v = c.get("tf32_cublas")) s.tf32_cublas = *v == "on";
  if (auto v = c.get("tf32_cudnn")) s.tf32_cudnn = *v == "on";
  if (auto v = c.get("cudnn_benchmark")) s.cudnn_benchmark = *v == "on";
  if (auto v = c.get("cudnn_deterministic")) s.cudnn_deterministic = *v == "on";
  if (auto v = c.get("reduced_precision_reduction")) {
    s.fp16_reduction = *v == "on" || *v == "fp16";
    s.bf16_reduction = *v == "on" || *v == "bf16";
  }
  if (auto v = c.get("sdpa_backend")) s.sdpa_backend = formats::parse_sdp(*v);
  return s;
}

// The environment a config needs (NAME=VALUE), whether or not this process has it.
std::vector<std::string> env_of(const Config& c) {
  std::vector<std::string> env;
  for (const auto& [k, v] : c.knobs) {
    if (k == "cpu_capability") env.push_back("ATEN_CPU_CAPABILITY=" + v);
    else if (k == "cublas_workspace_config") env.push_back("CUBLAS_WORKSPACE_CONFIG=" + v);
    else if (k == "blas_threads") {
      env.push_back("MKL_NUM_THREADS=" + v);
      env.push_back("OPENBLAS_NUM_THREADS=" + v);
    } else if (k.rfind("env:", 0) == 0) {
      env.push_back(k.substr(4) + "=" + v);
    }
  }
  return env;
}

// The recorded environment variables (detail::kRecordedEnv) that `c` leaves
// unset. A trial runs without them, as the recorded program did, whatever the
// environment of this process: a recording made without MKL_CBWR is replayed
// without it even from a shell that exports it.
std::vector<std::string> unset_env_of(const Config& c) {
  const auto set = env_of(c);
  std::vector<std::string> names;
  for (const char* name : detail::kRecordedEnv) {
    const std::string prefix = std::string(name) + "=";
    bool is_set = false;
    for (const auto& kv : set) is_set = is_set || kv.rfind(prefix, 0) == 0;
    if (!is_set) names.emplace_back(name);
  }
  return names;
}

// What a child trial's environment changes: NAME=VALUE sets, a bare NAME removes.
std::vector<std::string> env_overrides_of(const Config& c) {
  auto overrides = env_of(c);
  for (auto& name : unset_env_of(c)) overrides.push_back(std::move(name));
  return overrides;
}

// The process-wide parts of `c` that this process does not already have; empty
// when the trial can run here.
std::vector<std::string> missing_process_state(const Config& c) {
  std::vector<std::string> missing;
  for (const auto& name : unset_env_of(c))
    if (std::getenv(name.c_str()) != nullptr) missing.push_back("unset " + name);
  for (const auto& kv : env_of(c)) {
    const auto eq = kv.find('=');
    const std::string name = kv.substr(0, eq), value = kv.substr(eq + 1);
    if (name == "ATEN_CPU_CAPABILITY") {
      if (detail::process_cpu_capability() != value) missing.push_back(kv);
      continue;
    }
    const char* now = std::getenv(name.c_str());
    if (now == nullptr || value != now) missing.push_back(kv);
  }
  return missing;
}

OutputResult compare_output(const Value& rec, const StepReader& reader, const detail::OutValue* got, int index) {
  OutputResult o;
  o.index = index;
  o.name = rec.name;
  o.kind = formats::value_kind_name(rec.kind);
  if (got == nullptr) {
    o.equal = false;
    o.note = "the replay returned no value here";
    return o;
  }
  if (formats::carries_tensor(rec.kind)) {
    const auto& m = rec.tensor;
    o.dtype = std::string(dtype_name(m.dtype));
    o.sizes = m.sizes;
    o.recorded_fingerprint = m.fingerprint;
    if (got->kind != ValueKind::kTensor) {
      o.equal = false;
      o.note = fmt::format("the replay returned a {}, the recording a tensor", formats::value_kind_name(got->kind));
      return o;
    }
    if (got->dtype != m.dtype || got->sizes != m.sizes) {
      o.equal = false;
      o.note = fmt::format("the replay returned {} {}, the recording {} {}", dtype_name(got->dtype),
                           fmt::join(got->sizes, "x"), dtype_name(m.dtype), fmt::join(m.sizes, "x"));
      return o;
    }
    if (!got->bytes_valid) {
      o.compared = false;
      o.note = "the replayed tensor cannot be read back (layout or device)";
      return o;
    }
    o.replayed_fingerprint = kernels::fingerprint_contiguous(got->dtype, got->sizes.data(),
                                                             static_cast<int>(got->sizes.size()), got->bytes.data(),
                                                             got->bytes.size());
    if (got->strides != m.strides && m.numel() > 1)
      o.note = fmt::format("strides [{}] where the recording has [{}]", fmt::join(got->strides, ","),
                           fmt::join(m.strides, ","));
    if (!m.has_fingerprint()) {
      o.compared = false;
      o.note = (m.flags & formats::kTensorUninitialized) ? "an uninitialised buffer in the recording: no bits to compare"
                                                          : "the recording holds no fingerprint for it";
      return o;
    }
    o.equal = o.replayed_fingerprint == m.fingerprint;
    if ((m.flags & formats::kTensorHasData) && m.data_index >= 0) {
      const TensorData data = reader.read_tensor(m);
      if (data.bytes.size() == got->bytes.size()) {
        o.has_metrics = true;
        o.metrics = kernels::compare_contiguous(m.dtype, data.bytes.data(), got->bytes.data(), m.numel());
        o.equal = o.metrics.equal();
      }
    }
    return o;
  }
  o.recorded_text = rec.text;
  o.replayed_text = got->text;
  if (rec.kind == ValueKind::kTensorList) {
    o.equal = got->kind == ValueKind::kTensorList;
  } else {
    o.equal = got->kind == rec.kind && got->text == rec.text;
    // The recorder writes an undefined tensor as None "undefined".
    if (rec.kind == ValueKind::kNone && got->kind == ValueKind::kNone) o.equal = true;
  }
  if (!o.equal)
    o.note = fmt::format("the replay returned {} {}", formats::value_kind_name(got->kind), got->text);
  return o;
}

// Runs one event in this process and compares it with `expected` (the same
// event, or --expect's event of another recording).
// The outputs of a trial on sliced inputs: nothing recorded has their shapes,
// so they carry only what the replay computed (ReplayOptions::slices).
std::vector<OutputResult> sliced_outputs(const Event& ev, const std::vector<detail::OutValue>& got) {
  std::vector<OutputResult> outs;
  for (std::size_t k = 0; k < got.size(); ++k) {
    OutputResult o;
    o.index = static_cast<int>(k);
    if (k < ev.outputs.size()) o.name = ev.outputs[k].name;
    o.kind = formats::value_kind_name(got[k].kind);
    o.compared = false;
    o.note = "inputs sliced: not compared with the recording";
    if (got[k].kind == ValueKind::kTensor) {
      o.dtype = std::string(dtype_name(got[k].dtype));
      o.sizes = got[k].sizes;
      if (got[k].bytes_valid)
        o.replayed_fingerprint = kernels::fingerprint_contiguous(
            got[k].dtype, got[k].sizes.data(), static_cast<int>(got[k].sizes.size()), got[k].bytes.data(),
            got[k].bytes.size());
    } else {
      o.replayed_text = got[k].text;
    }
    outs.push_back(std::move(o));
  }
  return outs;
}

ReplayResult run_here(const Event& ev, const StepReader& reader, const Event& expected,
                      const StepReader& expected_reader, const Config& config, int rank,
                      const std::vector<InputSlice>& slices = {}, const std::string& save_dir = {},
                      detail::FreeRunning* free = nullptr) {
  ReplayResult r;
  r.event = formats::event_id_string(ev.id);
  r.rank = rank;
  r.step = ev.step;
  r.phase = formats::phase_name(ev.phase);
  r.op = ev.op;
  r.overload = ev.overload;
  r.scope = ev.scope;
  r.config = config.to_string();
  std::vector<TensorData> storage(ev.inputs.size());
  std::vector<const TensorData*> data(ev.inputs.size(), nullptr);
  // Free-running: inputs linked to what the window's earlier ops wrote get
  // the replayed bits (free_running.h), also where the recording has none.
  std::vector<bool> fed(ev.inputs.size(), false);
  if (free != nullptr) {
    for (std::size_t i = 0; i < ev.inputs.size(); ++i) {
      const auto& v = ev.inputs[i];
      if (v.kind != ValueKind::kTensor) continue;
      if (v.tensor.flags & formats::kTensorHasData) storage[i] = reader.read_tensor(v.tensor);
      auto bits = free->feed(v.tensor, (v.tensor.flags & formats::kTensorHasData) ? &storage[i] : nullptr);
      if (!bits) continue;
      storage[i] = std::move(*bits);
      data[i] = &storage[i];
      fed[i] = true;
      ++r.fed_inputs;
    }
  }
  for (std::size_t i = 0; i < ev.inputs.size(); ++i) {
    const auto& v = ev.inputs[i];
    if (!formats::carries_tensor(v.kind) || fed[i]) continue;
    if (v.tensor.flags & formats::kTensorNotFingerprinted) {
      r.reason = CannotReason::kUnsupportedValue;
      r.message = fmt::format("input '{}' is a {} tensor on {} that the recorder could not read", v.name,
                              dtype_name(v.tensor.dtype), v.tensor.device);
      return r;
    }
    if (needs_data(v.tensor)) {
      r.reason = CannotReason::kInputsNotRecorded;
      r.message = fmt::format("input '{}' of event {} has only a fingerprint: the recording holds no full tensor",
                              v.name.empty() ? "?" : v.name, r.event);
      return r;
    }
  }
  for (std::size_t i = 0; i < ev.inputs.size(); ++i) {
    const auto& v = ev.inputs[i];
    if (!formats::carries_tensor(v.kind) || !(v.tensor.flags & formats::kTensorHasData) || fed[i]) continue;
    if (free == nullptr || v.kind != ValueKind::kTensor) storage[i] = reader.read_tensor(v.tensor);
    r.input_bytes += storage[i].bytes.size();
    data[i] = &storage[i];
  }
  std::optional<Event> sliced;
  if (!slices.empty()) {
    sliced = ev;
    detail::apply_slices(slices, sliced->inputs, storage);
    r.input_bytes = 0;
    for (const auto& d : storage) r.input_bytes += d.bytes.size();
  }
  auto settings = settings_of(config);
  settings.capture_call = !save_dir.empty();
  auto exec = detail::execute(sliced ? *sliced : ev, data, settings);
  if (!save_dir.empty() && exec.reason == CannotReason::kNone)
    detail::save_trial(save_dir, sliced ? *sliced : ev, exec, r.config);
  r.seconds = exec.seconds;
  if (free != nullptr && exec.reason == CannotReason::kNone) free->record(ev, exec);
  if (exec.reason != CannotReason::kNone) {
    r.reason = exec.reason;
    r.message = exec.message;
    return r;
  }
  if (sliced) {
    r.outputs = sliced_outputs(ev, exec.outputs);
    r.verdict = Verdict::kReproduces;
    r.message = "inputs sliced: the op ran; outputs not compared with the recording";
    return r;
  }
  const auto& want = expected.outputs;
  if (want.empty() && exec.outputs.empty()) {
    r.reason = CannotReason::kNothingToCompare;
    r.message = ev.op + " returns nothing and the recording holds no outputs to compare";
    return r;
  }
  bool all_equal = true;
  int compared = 0;
  for (std::size_t k = 0; k < want.size(); ++k) {
    auto o = compare_output(want[k], expected_reader, k < exec.outputs.size() ? &exec.outputs[k] : nullptr,
                            static_cast<int>(k));
    all_equal = all_equal && o.equal;
    compared += o.compared ? 1 : 0;
    r.outputs.push_back(std::move(o));
  }
  if (exec.outputs.size() != want.size()) {
    all_equal = false;
    r.message = fmt::format("the replay returned {} values, the recording holds {}", exec.outputs.size(), want.size());
  }
  r.verdict = all_equal ? Verdict::kReproduces : Verdict::kDiffers;
  if (r.message.empty()) {
    for (const auto& o : r.outputs) {
      if (o.equal) continue;
      r.message = fmt::format("output {}{} differs", o.index, o.name.empty() ? "" : " (" + o.name + ")");
      if (o.has_metrics)
        r.message += fmt::format(": {} of {} elements, max {} ULP", o.metrics.differing, o.metrics.numel,
                                 o.metrics.max_ulp == kernels::kUlpInfinite ? std::string("inf")
                                                                            : std::to_string(o.metrics.max_ulp));
      else if (!o.note.empty())
        r.message += ": " + o.note;
      break;
    }
  }
  if (!exec.note.empty()) r.message += (r.message.empty() ? "" : "; ") + exec.note;
  // A replay that differs where an uninitialised input's storage comes back as
  // a fingerprinted output: if the op read the bits there, they were written
  // where the recorder could not see them, and the difference says nothing
  // about the op. An op that only overwrites them (normal_, fill_, zero_ of
  // a fresh buffer) gives the same outputs whatever they were: run once more
  // with the buffer filled otherwise to tell.
  for (std::size_t i = 0; i < ev.inputs.size(); ++i) {
    const auto& in = ev.inputs[i];
    if (r.verdict != Verdict::kDiffers) break;
    if (in.kind != ValueKind::kTensor || !(in.tensor.flags & formats::kTensorUninitialized)) continue;
    if (data[i] == nullptr && in.tensor.device == "cpu") {
      formats::TensorData filled;
      filled.dtype = in.tensor.dtype;
      filled.sizes = in.tensor.sizes;
      filled.bytes.assign(static_cast<std::size_t>(in.tensor.numel()) * dtype_size(in.tensor.dtype), 0x5a);
      auto other_data = data;
      other_data[i] = &filled;
      auto plain = settings;
      plain.capture_call = false;
      const auto again = detail::execute(ev, other_data, plain);
      bool same = again.reason == CannotReason::kNone && again.outputs.size() == exec.outputs.size();
      for (std::size_t k = 0; same && k < again.outputs.size(); ++k)
        same = again.outputs[k].bytes_valid && exec.outputs[k].bytes_valid &&
               again.outputs[k].bytes == exec.outputs[k].bytes;
      if (same) continue;  // the old bits were not read: the op's own difference
    }
    for (const auto& out : ev.outputs) {
      if (out.kind != ValueKind::kTensor || !out.tensor.has_fingerprint()) continue;
      if (out.tensor.storage_id == 0 || out.tensor.storage_id != in.tensor.storage_id) continue;
      r.verdict = Verdict::kCannotReplay;
      r.reason = CannotReason::kWrittenOutside;
      r.message = fmt::format("input '{}' was recorded as an uninitialised buffer, yet {} returns bits from it: "
                              "they were written outside the dispatcher (torch.tensor from a list, numpy, a custom "
                              "kernel), so no recording holds them", in.name, ev.op);
      return r;
    }
  }
  if (r.verdict == Verdict::kReproduces && compared == 0 && !r.outputs.empty())
    r.message = "outputs are uninitialised buffers: only their dtype and sizes were compared";
  return r;
}

}  // namespace

Config event_recorded_config(const std::string& recording_dir, int rank, const std::string& event_id) {
  const auto loc = locate(recording_dir, rank, event_id);
  return with_event_knobs(recorded_config(recording_dir, rank), *loc.event);
}

namespace {

Config effective_config(const std::string& dir, const ReplayOptions& o) {
  return o.from_recorded ? recorded_config(dir, o.rank).overlaid(o.config) : o.config;
}

// The config one event of a request replays under.
Config event_config(const detail::Request& req, const Config& config, const Event& ev) {
  if (!req.event_knobs || !ev.knobs) return config;
  return with_event_knobs(config, ev).overlaid(Config::parse(req.user_config));
}

// Runs a request in this process. In a child, the parent has set the
// environment; a process-wide knob that still did not take is an error.
detail::Outcome run_request_here(const detail::Request& req, bool in_child) {
  const Config config = Config::parse(req.config);
  if (in_child) {
    auto missing = missing_process_state(config);
    if (!missing.empty())
      throw UsageError(fmt::format("the child trial could not apply {} (this libtorch ignored it)", missing.front()));
  }
  detail::Outcome out;
  std::shared_ptr<StepReader> expect_reader;
  const Event* expect_event = nullptr;
  Located expect_loc;
  if (!req.expect_dir.empty()) {
    expect_loc = locate(req.expect_dir, req.expect_rank, req.expect_event);
    expect_reader = expect_loc.reader;
    expect_event = expect_loc.event;
  }
  auto mark_child = [&](ReplayResult& r) { r.child_process = in_child; };
  if (req.mode == detail::Request::Mode::kEvent) {
    auto loc = locate(req.dir, req.rank, req.event);
    if (expect_event != nullptr && (expect_event->op != loc.event->op || expect_event->overload != loc.event->overload))
      throw UsageError(fmt::format("event {} of {} is {}, not {} like event {}: --expect needs the same operator",
                                   req.expect_event, req.expect_dir, expect_event->op, loc.event->op, req.event));
    auto r = run_here(*loc.event, *loc.reader, expect_event ? *expect_event : *loc.event,
                      expect_reader ? *expect_reader : *loc.reader, event_config(req, config, *loc.event), req.rank,
                      req.slices, req.save_dir);
    mark_child(r);
    out.results.push_back(std::move(r));
    return out;
  }
  const auto layout = formats::scan_recording(req.dir);
  const auto& files = rank_files(layout, req.dir, req.rank);
  if (req.mode == detail::Request::Mode::kAll) {
    for (const auto& [step, path] : files.steps) {
      StepReader reader(path);
      for (const auto& ev : reader.events()) {
        if (!replayable_inputs(ev)) {
          ++out.skipped;
          continue;
        }
        auto r = run_here(ev, reader, ev, reader, event_config(req, config, ev), req.rank);
        mark_child(r);
        out.results.push_back(std::move(r));
      }
    }
    return out;
  }
  // Window: the first event and the next ones of its stream, in order.
  std::optional<detail::FreeRunning> free;
  if (req.free_running) free.emplace();
  const uint64_t first = parse_id(req.event);
  const uint32_t stream = static_cast<uint32_t>(first >> 48);
  bool started = false;
  for (const auto& [step, path] : files.steps) {
    StepReader reader(path);
    for (const auto& ev : reader.events()) {
      if (ev.stream != stream) continue;
      if (!started && ev.id != first) continue;
      started = true;
      auto r = run_here(ev, reader, ev, reader, event_config(req, config, ev), req.rank, {}, {}, free ? &*free : nullptr);
      mark_child(r);
      const bool stop = r.verdict == Verdict::kDiffers && !req.keep_going;
      out.results.push_back(std::move(r));
      if (stop || static_cast<int64_t>(out.results.size()) >= req.window) return out;
    }
  }
  if (!started)
    throw UsageError(formats::no_event_message(req.dir, req.event, req.rank));
  return out;
}

detail::Outcome run_request(const detail::Request& req, const ReplayOptions& o) {
  const Config config = Config::parse(req.config);
  const auto missing = missing_process_state(config);
  if (missing.empty()) return run_request_here(req, false);
  if (o.self_exe.empty())
    throw UsageError(fmt::format("{} needs a child process, and no opguard executable was given to start one",
                                 missing.front()));
  int status = 0;
  const auto answer =
      detail::call_trial_server(o.self_exe, env_overrides_of(config), detail::request_to_json(req), &status);
  if (answer && answer->kind == 'r') return detail::outcome_from_json(answer->payload);
  if (answer && answer->kind == 'u') throw UsageError(answer->payload);
  // A crash of the op under this config is a trial outcome, not a crash of ours.
  detail::Outcome failed;
  ReplayResult r;
  r.event = req.event;
  r.rank = req.rank;
  r.config = req.config;
  r.child_process = true;
  r.reason = CannotReason::kChildFailed;
  r.message = answer ? fmt::format("the child trial under {} failed: {}", fmt::join(missing, " "), answer->payload)
                     : fmt::format("the child trial under {} exited with status {}", fmt::join(missing, " "), status);
  failed.results.push_back(std::move(r));
  return failed;
}

detail::Request base_request(const std::string& dir, const ReplayOptions& o) {
  detail::Request req;
  req.dir = dir;
  req.rank = o.rank;
  req.config = effective_config(dir, o).to_string();
  req.event_knobs = o.from_recorded;
  req.user_config = o.config.to_string();
  req.expect_dir = o.expect_dir;
  req.expect_event = o.expect_event;
  req.expect_rank = o.expect_rank;
  req.slices = o.slices;
  return req;
}

}  // namespace

ReplayResult replay_event(const std::string& recording_dir, const std::string& event_id, const ReplayOptions& options) {
  auto req = base_request(recording_dir, options);
  req.mode = detail::Request::Mode::kEvent;
  req.event = event_id;
  req.save_dir = options.save_dir;
  if (!options.expect_dir.empty() && options.expect_event.empty()) req.expect_event = event_id;
  locate(recording_dir, options.rank, event_id);  // an unknown event is a usage error in the parent
  auto out = run_request(req, options);
  OPGUARD_CHECK(out.results.size() == 1);
  return out.results.front();
}

std::vector<ReplayResult> replay_all(const std::string& recording_dir, const ReplayOptions& options, int64_t* skipped) {
  auto req = base_request(recording_dir, options);
  req.mode = detail::Request::Mode::kAll;
  auto out = run_request(req, options);
  if (skipped) *skipped = out.skipped;
  return out.results;
}

std::vector<ReplayResult> replay_window(const std::string& recording_dir, const std::string& first_event, int64_t n,
                                        const ReplayOptions& options) {
  if (n < 1) throw UsageError("--window takes a positive number of events");
  auto req = base_request(recording_dir, options);
  req.mode = detail::Request::Mode::kWindow;
  req.event = first_event;
  req.window = n;
  req.free_running = options.free_running;
  req.keep_going = options.window_keep_going;
  return run_request(req, options).results;
}

std::string rerecord_command(const std::string& recording_dir, int rank, const std::string& event_id,
                             const std::string& opguard_command) {
  const auto layout = formats::scan_recording(recording_dir);
  const auto m = formats::read_manifest(rank_files(layout, recording_dir, rank).manifest_path);
  return formats::rerecord_command(m, recording_dir, event_id, 16, opguard_command, formats::numerics_env_here());
}

int child_server_main() {
  return detail::serve_trials([](const std::string& request) {
    return detail::outcome_to_json(run_request_here(detail::request_from_json(request), true));
  });
}

}  // namespace opguard::replay
