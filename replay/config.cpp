// Knobs, config strings and the config a recording was made under. No torch:
// `opguard configs` and config validation must not wait for torch's headers.

#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "opguard/core/error.h"
#include "opguard/formats/recording.h"
#include "opguard/replay/replay.h"
#include "replay_internal.h"

namespace opguard::replay {
namespace {

bool cpu_has_flag(const std::string& flag) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line);
    std::string w;
    while (words >> w)
      if (w == flag) return true;
    return false;
  }
  return false;
}

std::vector<KnobInfo> make_table() {
  std::vector<KnobInfo> t;
  auto add = [&](std::string name, std::string values, std::string changes, bool process_wide, bool available = true,
                 std::string why = "") {
    t.push_back(KnobInfo{std::move(name), std::move(values), std::move(changes), process_wide, available, std::move(why)});
  };
  add("device", "cpu|cuda:N (cuda = cuda:0; needs a CUDA device)", "where the op runs: the recorded inputs are "
      "copied to the device, the outputs back; CPU vs GPU kernels give other bits for most floating ops", false);
  add("threads", "positive integer", "intra-op threads (at::set_num_threads, also MKL's): full reductions "
      "(sum, mean over all elements) split their work by thread count", false);
  const bool avx2 = cpu_has_flag("avx2");
  const bool avx512 = cpu_has_flag("avx512f");
  add("cpu_capability", std::string("default|avx2") + (avx512 ? "|avx512" : ""),
      "ATEN_CPU_CAPABILITY: which vectorised ATen kernels run (exp, tanh, softmax, layer_norm, sum, randn); "
      "not MKL's BLAS", true, avx2, avx2 ? "" : "this CPU has no AVX2");
  add("mkldnn", "on|off", "oneDNN (at::globalContext().setUserEnabledMkldnn): conv2d and bf16/fp16 matmul "
      "algorithms", false);
  add("deterministic", "on|off", "torch.use_deterministic_algorithms: picks deterministic kernels where an op "
      "has them (mostly CUDA; index_add, scatter_reduce)", false);
  add("dtype", "bfloat16|float16|float32|float64 (bf16, fp16, fp32, fp64)",
      "casts floating inputs to this dtype, runs the op, casts floating outputs back to the recorded dtype",
      false);
  add("float32_matmul_precision", "highest|high|medium", "the CPU's oneDNN fp32 matmul precision "
      "(torch.backends.mkldnn.matmul.fp32_precision ieee|tf32|bf16, as torch.set_float32_matmul_precision sets it): "
      "fp32 matmul through TF32/bf16 paths where the hardware has them; the CUDA one is tf32_cublas", false);
  add("flush_denormal", "on|off|main|workers", "flush denormal floats to zero (FTZ and DAZ, "
      "torch.set_flush_denormal) on every thread (on), on the thread that calls the op only (main: the program "
      "set it after its first parallel op, and torch's intra-op workers kept what they started with) or on the "
      "intra-op workers only (workers: the program cleared it after its first parallel op)", false);
  add("sdpa_backend", "all|none|math|flash|efficient|cudnn, or several joined by + (math+flash)",
      "the scaled_dot_product_attention backends enabled (torch.nn.attention.sdpa_kernel): the op picks its "
      "kernel among them, on the CPU flash or math; unset: those the recorded op ran under", false);
  add("blas_threads", "positive integer", "MKL_NUM_THREADS and OPENBLAS_NUM_THREADS for the trial: BLAS "
      "(mm, addmm, bmm) blocking and summation order", true);
  add("tp", "positive integer", "tensor-parallel split: the reduction dimension of mm, addmm, linear, matmul and "
      "bmm cut into P shards, the op run per shard, partials summed in the reduce order (docs/KERNELS.md)", false);
  add("microbatches", "positive integer", "data-parallel / accumulation split of a gradient over the batch: "
      "backward weight gradients (mm of a transposed matrix) and sums over dim 0 cut into M micro-batches, "
      "summed in the reduce order", false);
  add("reduce", "sequential|ring|tree", "order the tp or microbatches partials are summed in (default: ring with "
      "tp, sequential with microbatches); ring is the order Gloo's CPU all-reduce sums in", false);
  add("env:NAME", "any string", "sets environment variable NAME for the trial (MKL_CBWR, OMP_*, DNNL_*, ...); "
      "read by libraries at start-up", true);
  const char* gpu[][2] = {
      {"tf32_cublas", "cuBLAS fp32 matmul in TF32 (torch.backends.cuda.matmul.allow_tf32)"},
      {"tf32_cudnn", "cuDNN fp32 convolutions in TF32 (torch.backends.cudnn.allow_tf32)"},
      {"cudnn_benchmark", "cuDNN autotuning: the fastest measured algorithm, not the heuristic's "
                          "(torch.backends.cudnn.benchmark)"},
      {"cudnn_deterministic", "deterministic cuDNN algorithms only (torch.backends.cudnn.deterministic)"},
      {"reduced_precision_reduction", "fp16 and bf16 cuBLAS GEMMs may accumulate in reduced precision "
                                      "(allow_fp16/bf16_reduced_precision_reduction): on (both), off (neither), "
                                      "fp16 or bf16 (that one only)"},
      {"cublas_workspace_config", "CUBLAS_WORKSPACE_CONFIG for the trial: the cuBLAS workspace, which decides "
                                  "split-K reductions (:4096:8 and :16:8 are the deterministic settings)"},
  };
  for (const auto& g : gpu) {
    const std::string name = g[0];
    const bool workspace = name == "cublas_workspace_config";  // an environment variable: a child process
    add(name, workspace ? ":N:M (:4096:8, :16:8)" : name == "reduced_precision_reduction" ? "on|off|fp16|bf16" : "on|off",
        g[1], workspace);
    t.back().needs_cuda = true;
  }
  t.front().needs_cuda = true;  // device: cuda:N only; cpu always works
  return t;
}

// `values`: what the error says to use (a knob with values beyond on and off).
std::string canonical_bool(const std::string& knob, const std::string& v, const char* values = "on or off") {
  if (v == "on" || v == "1" || v == "true" || v == "yes") return "on";
  if (v == "off" || v == "0" || v == "false" || v == "no") return "off";
  throw UsageError(knob + "=" + v + " is not a value of " + knob + ": use " + values);
}

std::string canonical_positive(const std::string& knob, const std::string& v) {
  std::size_t used = 0;
  long n = 0;
  try {
    n = std::stol(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || n < 1 || n > 4096)
    throw UsageError(knob + "=" + v + " is not a value of " + knob + ": use an integer from 1 to 4096");
  return std::to_string(n);
}

const KnobInfo* find_knob(const std::string& name) {
  const std::string key = name.rfind("env:", 0) == 0 ? "env:NAME" : name;
  for (const auto& k : knob_table())
    if (k.name == key) return &k;
  return nullptr;
}

// Checks one knob=value and returns the value in its canonical spelling.
std::string canonical_value(const std::string& knob, const std::string& v) {
  const KnobInfo* info = find_knob(knob);
  if (info == nullptr) {
    std::string names;
    for (const auto& k : knob_table()) names += (names.empty() ? "" : ", ") + k.name;
    throw UsageError("'" + knob + "' is not a knob: use one of " + names + " (opguard configs lists them)");
  }
  if (knob == "env:")
    throw UsageError("env: needs a variable name: env:NAME=VALUE");
  if (!info->available) throw UsageError(knob + " cannot be applied by this build: " + info->unavailable_reason);
  if (knob == "device") {
    if (v == "cpu") return v;
    if (v != "cuda" && (v.rfind("cuda:", 0) != 0 || v.size() == 5 ||
                        v.find_first_not_of("0123456789", 5) != std::string::npos || v.size() > 9))
      throw UsageError("device=" + v + " is not a device: use cpu or cuda:N");
    const int index = v == "cuda" ? 0 : std::stoi(v.substr(5));
    std::string why;
    const int devices = cuda_device_count(&why);
    if (devices == 0) throw UsageError("device=" + v + " cannot be applied here: " + why);
    if (index >= devices)
      throw UsageError("device=" + v + " names no device: this machine has cuda:0 to cuda:" +
                       std::to_string(devices - 1));
    return "cuda:" + std::to_string(index);
  }
  if (info->needs_cuda) {
    std::string why;
    if (cuda_device_count(&why) == 0) throw UsageError(knob + " needs a CUDA device: " + why);
    if (knob == "cublas_workspace_config") {
      const auto second = v.find(':', 1);
      const bool ok = v.size() >= 4 && v[0] == ':' && second != std::string::npos && second > 1 &&
                      second + 1 < v.size() && v.find_first_not_of("0123456789:") == std::string::npos &&
                      v.find(':', second + 1) == std::string::npos;
      if (!ok) throw UsageError("cublas_workspace_config=" + v + " is not :SIZE_KIB:COUNT, for example :4096:8");
      return v;
    }
    if (knob == "reduced_precision_reduction" && (v == "fp16" || v == "bf16")) return v;
    return canonical_bool(knob, v);
  }
  if (knob == "threads" || knob == "blas_threads" || knob == "tp" || knob == "microbatches")
    return canonical_positive(knob, v);
  if (knob == "reduce") {
    if (v == "sequential" || v == "ring" || v == "tree") return v;
    throw UsageError("reduce=" + v + " is not a value of reduce: use sequential, ring or tree");
  }
  if (knob == "mkldnn" || knob == "deterministic") return canonical_bool(knob, v);
  if (knob == "flush_denormal")
    return v == "main" || v == "workers" ? v : canonical_bool(knob, v, "on, off, main or workers");
  if (knob == "sdpa_backend") {
    if (auto b = formats::parse_sdp(v)) return formats::sdp_text(*b);
    throw UsageError("sdpa_backend=" + v + " is not a value of sdpa_backend: use all, none, or math, flash, "
                     "efficient and cudnn, alone or joined by +");
  }
  if (knob == "cpu_capability") {
    if (v == "default" || v == "avx2") return v;
    if (v == "avx512") {
      if (info->values.find("avx512") == std::string::npos)
        throw UsageError("cpu_capability=avx512 cannot be applied on this machine: its CPU has no AVX-512");
      return v;
    }
    throw UsageError("cpu_capability=" + v + " is not a value of cpu_capability: use " + info->values);
  }
  if (knob == "dtype") {
    static const std::map<std::string, std::string> kNames = {
        {"bf16", "bfloat16"}, {"bfloat16", "bfloat16"}, {"fp16", "float16"}, {"float16", "float16"},
        {"half", "float16"},  {"fp32", "float32"},      {"float32", "float32"}, {"float", "float32"},
        {"fp64", "float64"},  {"float64", "float64"},   {"double", "float64"}};
    auto it = kNames.find(v);
    if (it == kNames.end())
      throw UsageError("dtype=" + v + " is not a value of dtype: use bf16, fp16, fp32 or fp64");
    return it->second;
  }
  if (knob == "float32_matmul_precision") {
    if (v == "highest" || v == "high" || v == "medium") return v;
    throw UsageError("float32_matmul_precision=" + v + " is not a value: use highest, high or medium");
  }
  return v;  // env:NAME takes any string
}

}  // namespace

const std::vector<KnobInfo>& knob_table() {
  static const std::vector<KnobInfo> table = make_table();
  return table;
}

Config Config::parse(const std::string& text) {
  Config c;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(start, end - start);
    start = end + 1;
    if (item.empty()) {
      if (end == text.size()) break;
      continue;
    }
    // env:NAME=VALUE splits at the first '=' after the name.
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      throw UsageError("'" + item + "' is not knob=value: write for example threads=2,cpu_capability=default");
    const std::string knob = item.substr(0, eq);
    c.set(knob, canonical_value(knob, item.substr(eq + 1)));
  }
  return c;
}

std::string Config::to_string() const {
  std::string s;
  for (const auto& [k, v] : knobs) s += (s.empty() ? "" : ",") + k + "=" + v;
  return s;
}

std::optional<std::string> Config::get(const std::string& knob) const {
  for (const auto& [k, v] : knobs)
    if (k == knob) return v;
  return std::nullopt;
}

void Config::set(const std::string& knob, const std::string& value) {
  for (auto& [k, v] : knobs) {
    if (k == knob) {
      v = value;
      return;
    }
  }
  knobs.emplace_back(knob, value);
}

Config Config::overlaid(const Config& other) const {
  Config c = *this;
  for (const auto& [k, v] : other.knobs) c.set(k, v);
  return c;
}

namespace {

formats::Manifest rank_manifest(const std::string& recording_dir, int rank) {
  for (const auto& r : formats::scan_recording(recording_dir).ranks)
    if (r.rank == rank) return formats::read_manifest(r.manifest_path);
  throw UsageError(recording_dir + " has no rank " + std::to_string(rank) + ": opguard ls lists its ranks");
}

}  // namespace

Config declared_config(const std::string& recording_dir, int rank) {
  const auto m = rank_manifest(recording_dir, rank);
  auto it = m.info.find("declared_knobs");
  if (it == m.info.end() || it->second.empty()) return {};
  try {
    return Config::parse(it->second);
  } catch (const UsageError& e) {
    throw FormatError(recording_dir + " declares knobs this opguard cannot use (" + e.what() + ")");
  }
}

Config recorded_config(const std::string& recording_dir, int rank) {
  const auto m = rank_manifest(recording_dir, rank);
  Config c;
  auto info = [&](const std::string& key) -> std::string {
    // The state at the end is what the steps ran under when the program
    // changed a knob after its first op.
    auto it = m.info.find(key + "_at_end");
    if (it == m.info.end()) it = m.info.find(key);
    return it == m.info.end() ? "" : it->second;
  };
  if (auto t = info("threads"); !t.empty() && t != "0") c.set("threads", t);
  if (auto cap = m.info.find("cpu_capability"); cap != m.info.end() && !cap->second.empty())
    c.set("cpu_capability", cap->second);
  if (auto v = info("mkldnn_enabled"); !v.empty()) c.set("mkldnn", v == "1" ? "on" : "off");
  if (auto v = info("deterministic_algorithms"); !v.empty()) c.set("deterministic", v == "1" ? "on" : "off");
  if (auto v = info("float32_matmul_precision"); !v.empty()) c.set("float32_matmul_precision", v);
  // Only when some thread flushed: off is every process's state (and
  // recordings before the keys existed have none). The intra-op workers'
  // state is asked at a clean end with more than one thread; without it, they
  // are taken to flush as the main thread does.
  const bool main_flushes = info("flush_denormal") == "1";
  const std::string workers = info("flush_denormal_workers");
  const detail::FlushDenormal flush{main_flushes, workers == "1" || (workers.empty() && main_flushes)};
  if (flush.caller || flush.workers) c.set("flush_denormal", detail::flush_denormal_value(flush));
  for (const char* name : detail::kRecordedEnv) {
    auto it = m.env.find(name);
    if (it != m.env.end()) c.set(std::string("env:") + name, it->second);
  }
  return c;
}

Config with_event_knobs(Config run, const formats::Event& ev, GpuKnobs gpu) {
  if (!ev.knobs) return run;
  const auto k = formats::knobs_of(*ev.knobs);
  run.set("threads", std::to_string(k.threads));
  run.set("mkldnn", k.mkldnn ? "on" : "off");
  run.set("deterministic", k.deterministic ? "on" : "off");
  run.set("float32_matmul_precision", k.matmul_precision);
  // The event's thread as it ran the op, the intra-op workers as the run's
  // value has them (their state is asked at the end only). Named as
  // recorded_config names it: where some thread flushed, or where the run's
  // value was named.
  const auto run_flush = run.get("flush_denormal");
  const detail::FlushDenormal flush{k.flush_denormal, run_flush && detail::flush_denormal_of(*run_flush).workers};
  if (flush.caller || flush.workers || run_flush) run.set("flush_denormal", detail::flush_denormal_value(flush));
  const auto device = run.get("device");
  const bool cuda = device && device->rfind("cuda", 0) == 0;
  if (k.gpu && (gpu == GpuKnobs::kAlways || cuda)) {
    for (const auto& [name, value] : formats::gpu_knob_values(*k.gpu)) run.set(name, value);
  }
  return run;
}

const std::vector<std::string>& recorded_env_names() {
  static const std::vector<std::string> names(std::begin(detail::kRecordedEnv), std::end(detail::kRecordedEnv));
  return names;
}

}  // namespace opguard::replay
