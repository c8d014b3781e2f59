// Manifest facts: everything about the process that can change the bits an
// operator computes (DESIGN.md, Config), read once when the recording opens
// and again at the end (a program may change threads after its first op).

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <c10/core/DefaultDtype.h>
#include <hdf5.h>
#include <sys/syscall.h>
#include <torch/headeronly/version.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include <atomic>
#include <cctype>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <tuple>

#include "opguard/core/openmp_team.h"
#include "opguard/formats/rerecord.h"
#include "recorder_internal.h"

extern char** environ;

namespace opguard::record {
namespace {

#if defined(__x86_64__) || defined(__i386__)
// torch.set_flush_denormal(True) sets FTZ and DAZ in the calling thread's
// MXCSR (libtorch keeps no flag of it).
constexpr unsigned kMxcsrFtzDaz = 0x8040;
#endif

std::string read_cmdline() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // NUL-separated; store as a JSON-like list so that spaces stay unambiguous.
  std::string out = "[";
  std::string cur;
  bool first = true;
  auto flush = [&] {
    std::string quoted = "\"";
    for (char c : cur) {
      if (c == '"' || c == '\\') quoted += '\\';
      quoted += c;
    }
    out += (first ? "" : ",") + quoted + "\"";
    first = false;
    cur.clear();
  };
  for (char c : raw) {
    if (c == '\0') flush();
    else cur += c;
  }
  if (!cur.empty()) flush();
  return out + "]";
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
  }
  return "unknown";
}

// at::get_cpu_capability() says "AVX512"; ATEN_CPU_CAPABILITY takes "avx512".
std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

void collect_knobs(formats::Manifest& m, const std::string& suffix) {
  auto& info = m.info;
  info["threads" + suffix] = std::to_string(at::get_num_threads());
  info["interop_threads" + suffix] = std::to_string(at::get_num_interop_threads());
  // The per-op knobs' reading (never throwing, unlike
  // float32MatmulPrecision() once a program used the per-backend API).
  const auto knobs = formats::knobs_of(current_knobs());
  info["mkldnn_enabled" + suffix] = knobs.mkldnn ? "1" : "0";
  info["deterministic_algorithms" + suffix] = knobs.deterministic ? "1" : "0";
  info["default_dtype" + suffix] = std::string(c10::get_default_dtype().name());
#if defined(__x86_64__) || defined(__i386__)
  // Read from this thread's MXCSR (current_knobs); other CPUs have no key.
  info["flush_denormal" + suffix] = knobs.flush_denormal ? "1" : "0";
#endif
  info["float32_matmul_precision" + suffix] = knobs.matmul_precision;
  // The fp32 precisions the per-event knobs do not carry: oneDNN's
  // convolutions and RNNs on the CPU (bf16 and tf32 allow its reduced-precision
  // paths where the CPU has them) and cuDNN's RNNs. Torch's spelling; an
  // unset one reads as what it inherits, ieee at the end.
  using P = at::Float32Precision;
  using B = at::Float32Backend;
  using Op = at::Float32Op;
  for (const auto& [key, backend, op] : {std::tuple{"mkldnn_conv_fp32_precision", B::MKLDNN, Op::CONV},
                                         std::tuple{"mkldnn_rnn_fp32_precision", B::MKLDNN, Op::RNN},
                                         std::tuple{"cudnn_rnn_fp32_precision", B::CUDA, Op::RNN}}) {
    const P p = at::globalContext().float32Precision(backend, op);
    info[key + suffix] = p == P::NONE ? "ieee" : at::precision2str(p);
  }
  if (knobs.gpu) {
    for (const auto& [name, value] : formats::gpu_knob_values(*knobs.gpu)) info[name + suffix] = value;
  }
}

}  // namespace

int parallel_region_thread() { return at::in_parallel_region() ? at::get_thread_num() : -1; }

uint32_t current_knobs() {
  const auto& ctx = at::globalContext();
  // Precisions by backend (torch.backends.{cuda,mkldnn}.matmul.fp32_precision;
  // the legacy torch.set_float32_matmul_precision sets both): the one for
  // the CPU's oneDNN matmul spelled as the legacy value (ieee highest, tf32
  // high, bf16 medium), the CUDA one as TF32 on or off. NONE inherits and
  // ends at ieee.
  using P = at::Float32Precision;
  const P cpu = ctx.float32Precision(at::Float32Backend::MKLDNN, at::Float32Op::MATMUL);
  const uint32_t precision = cpu == P::TF32 ? 1u : cpu == P::BF16 ? 2u : 0u;
  bool flushed = false;
#if defined(__x86_64__) || defined(__i386__)
  // Read on this thread: where torch.set_flush_denormal sets them.
  flushed = (_mm_getcsr() & kMxcsrFtzDaz) == kMxcsrFtzDaz;
#endif
  formats::GpuKnobs g;
  g.tf32_cublas = ctx.float32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL) == P::TF32;
  g.tf32_cudnn = ctx.float32Precision(at::Float32Backend::CUDA, at::Float32Op::CONV) == P::TF32;
  g.cudnn_benchmark = ctx.benchmarkCuDNN();
  g.cudnn_deterministic = ctx.deterministicCuDNN();
  using R = at::CuBLASReductionOption;
  g.fp16_reduction = ctx.allowFP16ReductionCuBLAS() == R::AllowReducedPrecisionWithSplitK;
  g.bf16_reduction = ctx.allowBF16ReductionCuBLAS() == R::AllowReducedPrecisionWithSplitK;
  return formats::knob_bits(at::get_num_threads(), ctx.userEnabledMkldnn(), ctx.deterministicAlgorithms(), flushed,
                            precision) |
         formats::gpu_knob_bits(g);
}

std::string iso_time_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

void collect_run_info(formats::Manifest& m) {
  auto& info = m.info;
  info["argv"] = read_cmdline();
  char cwd[4096];
  info["cwd"] = getcwd(cwd, sizeof(cwd)) ? cwd : "";
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  info["hostname"] = host;
  info["pid"] = std::to_string(getpid());
  std::ifstream exe_name("/proc/self/comm");
  std::string comm;
  std::getline(exe_name, comm);
  info["program"] = comm;
  info["torch_version"] = TORCH_VERSION;
  unsigned major = 0, minor = 0, release = 0;
  H5get_libversion(&major, &minor, &release);
  info["hdf5_version"] = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
  info["cpu_capability"] = lower(at::get_cpu_capability());
  info["cpu_model"] = cpu_model();
  info["hardware_concurrency"] = std::to_string(sysconf(_SC_NPROCESSORS_ONLN));
  info["has_mkl"] = at::hasMKL() ? "1" : "0";
  info["has_mkldnn"] = at::hasMKLDNN() ? "1" : "0";
  info["torch_config"] = at::show_config();
  collect_knobs(m, "");
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const char* kv = *e;
    const char* eq = std::strchr(kv, '=');
    if (eq == nullptr) continue;
    std::string key(kv, eq - kv);
    if (formats::is_numerics_env(key)) m.env[key] = eq + 1;
  }
}

namespace {

#if defined(__x86_64__) || defined(__i386__)
// Whether torch's intra-op worker threads flush denormals: "1" all of them,
// "0" none, "mixed"; empty where no worker answered. A worker keeps the
// MXCSR it was created with, so a program that calls
// torch.set_flush_denormal after its first parallel op flushes on its main
// thread and not in the workers (its parallel ops run partly unflushed).
// Asked through a parallel region of the calling thread's team, so only at
// the end: at the start it could create the workers itself, before a later
// torch.set_flush_denormal that they would otherwise have started with.
std::string workers_flush_denormal() {
  if (at::get_num_threads() <= 1 || at::in_parallel_region()) return "";
  // Atomics, the caller's stored after construction: ThreadSanitizer does
  // not see libgomp order the workers after it (libgomp is not built for it).
  struct Probe {
    std::atomic<long> caller{0};
    std::atomic<int> workers{0}, flushed{0};
  } probe;
  probe.caller.store(syscall(SYS_gettid));
  auto ask = [](void* data) {
    auto& p = *static_cast<Probe*>(data);
    if (syscall(SYS_gettid) == p.caller.load()) return;
    p.workers.fetch_add(1);
    if ((_mm_getcsr() & kMxcsrFtzDaz) == kMxcsrFtzDaz) p.flushed.fetch_add(1);
  };
  if (!on_every_openmp_thread(ask, &probe) || probe.workers.load() == 0) return "";
  return probe.flushed.load() == 0 ? "0" : probe.flushed.load() == probe.workers.load() ? "1" : "mixed";
}
#endif

}  // namespace

void collect_end_info(formats::Manifest& m) {
  collect_knobs(m, "_at_end");
#if defined(__x86_64__) || defined(__i386__)
  if (const std::string workers = workers_flush_denormal(); !workers.empty())
    m.info["flush_denormal_workers_at_end"] = workers;
#endif
}

}  // namespace opguard::record
