// The small naming functions of recording.h: phases, value kinds, event ids,
// file names, element counts, the owner of a rank directory.

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <signal.h>
#include <unistd.h>

#include "opguard/core/error.h"
#include "opguard/formats/recording.h"

namespace opguard::formats {
namespace {

constexpr std::array<const char*, 4> kPhaseNames = {"forward", "backward", "optimizer", "other"};

constexpr std::array<const char*, 17> kValueKindNames = {
    "none",      "tensor",      "tensor_list", "int",          "double",    "bool",
    "string",    "int_list",    "double_list", "bool_list",    "scalar_type", "device",
    "layout",    "memory_format", "generator", "complex",      "other",
};

constexpr uint64_t kSeqMask = (uint64_t{1} << 48) - 1;

// Parses a non-empty run of decimal digits (nothing else: no sign, no space).
std::optional<uint64_t> parse_digits(std::string_view text) {
  if (text.empty()) return std::nullopt;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

}  // namespace

const char* phase_name(Phase p) {
  auto i = static_cast<std::size_t>(p);
  return i < kPhaseNames.size() ? kPhaseNames[i] : "unknown";
}

std::optional<Phase> phase_from_name(const std::string& name) {
  for (std::size_t i = 0; i < kPhaseNames.size(); ++i) {
    if (name == kPhaseNames[i]) return static_cast<Phase>(i);
  }
  return std::nullopt;
}

const char* value_kind_name(ValueKind k) {
  auto i = static_cast<std::size_t>(k);
  return i < kValueKindNames.size() ? kValueKindNames[i] : "unknown";
}

// A dtype code of the event flags; `what` names it in the error.
static DType flag_dtype(uint32_t code, const char* what) {
  if (code >= static_cast<uint32_t>(kNumDTypes))
    throw FormatError(std::string(what) + " code " + std::to_string(code) + " this opguard does not know");
  return static_cast<DType>(code);
}

Autocast autocast_of(uint32_t f) {
  Autocast a;
  if (f & 1u) a.cpu = flag_dtype((f >> 8) & 0xffu, "an autocast dtype");
  if (f & 2u) a.cuda = flag_dtype((f >> 16) & 0xffu, "an autocast dtype");
  return a;
}

std::optional<DType> default_dtype_of(uint32_t f) {
  if (!(f & kEventDefaultDtype)) return std::nullopt;
  return flag_dtype(f >> 24, "a default dtype");
}

std::string autocast_text(const Autocast& a) {
  std::string s;
  if (a.cpu) s += "cpu=" + std::string(dtype_name(*a.cpu));
  if (a.cuda) s += std::string(s.empty() ? "" : ",") + "cuda=" + std::string(dtype_name(*a.cuda));
  return s;
}

namespace {
constexpr std::array<const char*, 3> kMatmulPrecisions = {"highest", "high", "medium"};
}

uint32_t knob_bits(const EventKnobs& k) {
  uint32_t precision = 0;
  while (precision < kMatmulPrecisions.size() && k.matmul_precision != kMatmulPrecisions[precision]) ++precision;
  if (precision == kMatmulPrecisions.size())
    throw FormatError("'" + k.matmul_precision + "' is not a float32 matmul precision");
  return knob_bits(k.threads, k.mkldnn, k.deterministic, k.flush_denormal, precision) |
         (k.gpu ? gpu_knob_bits(*k.gpu) : 0u);
}

EventKnobs knobs_of(uint32_t bits) {
  EventKnobs k;
  k.threads = knob_threads(bits);
  const uint32_t precision = (bits >> 11) & 3u;
  if (k.threads == 0 || precision >= kMatmulPrecisions.size())
    throw FormatError("knobs value " + std::to_string(bits) + " this opguard does not know");
  k.mkldnn = (bits & (1u << 8)) != 0;
  k.deterministic = (bits & (1u << 9)) != 0;
  k.flush_denormal = (bits & (1u << 10)) != 0;
  k.matmul_precision = kMatmulPrecisions[precision];
  if (bits & kKnobsGpuRecorded) {
    GpuKnobs g;
    g.tf32_cublas = (bits & (1u << 14)) != 0;
    g.tf32_cudnn = (bits & (1u << 15)) != 0;
    g.cudnn_benchmark = (bits & (1u << 16)) != 0;
    g.cudnn_deterministic = (bits & (1u << 17)) != 0;
    g.fp16_reduction = (bits & (1u << 18)) != 0;
    g.bf16_reduction = (bits & (1u << 19)) != 0;
    k.gpu = g;
  }
  return k;
}

std::string reduction_text(bool fp16, bool bf16) {
  if (fp16 == bf16) return fp16 ? "on" : "off";
  return fp16 ? "fp16" : "bf16";
}

std::vector<std::pair<std::string, std::string>> gpu_knob_values(const GpuKnobs& g) {
  auto on_off = [](bool v) { return std::string(v ? "on" : "off"); };
  return {{"tf32_cublas", on_off(g.tf32_cublas)},
          {"tf32_cudnn", on_off(g.tf32_cudnn)},
          {"cudnn_benchmark", on_off(g.cudnn_benchmark)},
          {"cudnn_deterministic", on_off(g.cudnn_deterministic)},
          {"reduced_precision_reduction", reduction_text(g.fp16_reduction, g.bf16_reduction)}};
}

std::string sdp_text(const SdpBackends& b) {
  if (b == SdpBackends{}) return "all";
  std::string s;
  for (const auto& [on, name] : {std::pair{b.math, "math"}, std::pair{b.flash, "flash"},
                                 std::pair{b.efficient, "efficient"}, std::pair{b.cudnn, "cudnn"}})
    if (on) s += (s.empty() ? "" : "+") + std::string(name);
  return s.empty() ? "none" : s;
}

std::optional<SdpBackends> parse_sdp(const std::string& text) {
  if (text == "all") return SdpBackends{};
  SdpBackends b{false, false, false, false};
  if (text == "none") return b;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    const std::size_t end = std::min(text.find('+', begin), text.size());
    const std::string name = text.substr(begin, end - begin);
    bool* on = name == "math" ? &b.math : name == "flash" ? &b.flash : name == "efficient" ? &b.efficient
             : name == "cudnn" ? &b.cudnn : nullptr;
    if (on == nullptr || *on) return std::nullopt;  // unknown or repeated
    *on = true;
    begin = end + 1;
  }
  return b;
}

std::string event_id_string(uint64_t id) {
  uint64_t stream = id >> 48;
  uint64_t seq = id & kSeqMask;
  if (stream == 0) return std::to_string(seq);
  return std::to_string(stream) + "." + std::to_string(seq);
}

std::string op_text(const std::string& op, const std::string& overload) {
  return overload.empty() ? op : op + "." + overload;
}

std::optional<uint64_t> parse_event_id(const std::string& text) {
  std::string_view view(text);
  std::size_t dot = view.find('.');
  uint64_t stream = 0;
  std::string_view seq_text = view;
  if (dot != std::string_view::npos) {
    std::optional<uint64_t> s = parse_digits(view.substr(0, dot));
    if (!s || *s > 0xFFFF) return std::nullopt;
    stream = *s;
    seq_text = view.substr(dot + 1);
  }
  std::optional<uint64_t> seq = parse_digits(seq_text);
  if (!seq || *seq > kSeqMask) return std::nullopt;
  return make_event_id(static_cast<uint32_t>(stream), *seq);
}

std::string no_event_message(const std::string& dir, const std::string& event, int rank, const std::string& why) {
  return dir + " has no event " + event + " on rank " + std::to_string(rank) + why +
         ": list events with opguard ls --events";
}

int64_t TensorMeta::numel() const {
  int64_t n = 1;
  for (int64_t size : sizes) {
    if (size < 0 || __builtin_mul_overflow(n, size, &n)) return -1;
  }
  return n;
}

std::string step_file_name(int64_t step) {
  char name[40];
  std::snprintf(name, sizeof(name), "step%08lld.h5", static_cast<long long>(step));
  return name;
}

std::string rank_dir(const std::string& recording_dir, int rank) {
  return (std::filesystem::path(recording_dir) / ("rank" + std::to_string(rank))).string();
}

namespace {

// Field 22 of /proc/PID/stat (starttime), counted after the command name's
// closing parenthesis, as the name may hold spaces and parentheses.
std::optional<uint64_t> process_start_time(long pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = text.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(text.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22; ++i)
    if (!(fields >> field)) return std::nullopt;
  return parse_digits(field);
}

}  // namespace

std::string owner_line() {
  const long pid = static_cast<long>(::getpid());
  const auto start = process_start_time(pid);
  return std::to_string(pid) + (start ? " " + std::to_string(*start) : "") + "\n";
}

bool owner_running(const std::string& rank_dir) {
  std::ifstream in(rank_dir + "/owner.pid");
  long pid = 0;
  if (!(in >> pid) || pid <= 0) return false;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM) return false;
  uint64_t recorded_start = 0;
  if (!(in >> recorded_start)) return true;  // the pid alone
  const auto start = process_start_time(pid);
  return !start || *start == recorded_start;
}

}  // namespace opguard::formats
