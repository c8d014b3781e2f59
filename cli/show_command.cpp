// opguard show: one event in full.

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "opguard/core/error.h"
#include "opguard/formats/recording.h"
#include "opguard/replay/replay.h"
#include "verbs.h"

namespace opguard::cli {
namespace {

constexpr const char* kHelp = R"(Show one event: its operator, schema, step, phase, scope, thread, and every
argument and output (tensors with dtype, shape, strides, fingerprint and, where
the recording holds full tensors, a preview of the values).

Examples:
  opguard show runA --event 120
  opguard show runA --event 2.57 --rank 1 --json)";

float half_to_float(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float v;
  if (exp == 0) v = std::ldexp(static_cast<float>(mant), -24);
  else if (exp == 31) v = mant ? NAN : INFINITY;
  else v = std::ldexp(static_cast<float>(mant | 0x400), static_cast<int>(exp) - 25);
  return sign ? -v : v;
}

float bf16_to_float(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// The first `count` elements as text, for a preview.
std::vector<std::string> preview(const formats::TensorData& data, std::size_t count) {
  std::vector<std::string> out;
  const std::size_t es = dtype_size(data.dtype);
  const std::size_t n = std::min(count, es ? data.bytes.size() / es : 0);
  for (std::size_t i = 0; i < n; ++i) {
    const uint8_t* p = data.bytes.data() + i * es;
    auto get = [&](auto v) {
      std::memcpy(&v, p, sizeof(v));
      return v;
    };
    switch (data.dtype) {
      case DType::kFloat64: out.push_back(fmt::format("{:.17g}", get(double{}))); break;
      case DType::kFloat32: out.push_back(fmt::format("{:.9g}", get(float{}))); break;
      case DType::kFloat16: out.push_back(fmt::format("{:.5g}", half_to_float(get(uint16_t{})))); break;
      case DType::kBFloat16: out.push_back(fmt::format("{:.4g}", bf16_to_float(get(uint16_t{})))); break;
      case DType::kInt8: out.push_back(std::to_string(get(int8_t{}))); break;
      case DType::kInt16: out.push_back(std::to_string(get(int16_t{}))); break;
      case DType::kInt32: out.push_back(std::to_string(get(int32_t{}))); break;
      case DType::kInt64: out.push_back(std::to_string(get(int64_t{}))); break;
      case DType::kUInt8: out.push_back(std::to_string(get(uint8_t{}))); break;
      case DType::kUInt16: out.push_back(std::to_string(get(uint16_t{}))); break;
      case DType::kUInt32: out.push_back(std::to_string(get(uint32_t{}))); break;
      case DType::kUInt64: out.push_back(std::to_string(get(uint64_t{}))); break;
      case DType::kBool: out.push_back(get(uint8_t{}) ? "true" : "false"); break;
      case DType::kComplex64: {
        float re = get(float{});
        float im;
        std::memcpy(&im, p + 4, 4);
        out.push_back(fmt::format("({:.9g},{:.9g})", re, im));
        break;
      }
      case DType::kComplex128: {
        double re = get(double{});
        double im;
        std::memcpy(&im, p + 8, 8);
        out.push_back(fmt::format("({:.17g},{:.17g})", re, im));
        break;
      }
      default: out.push_back(fmt::format("0x{:02x}", get(uint8_t{}))); break;
    }
  }
  return out;
}

std::string dims_text(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (std::size_t i = 0; i < d.size(); ++i) s += (i ? "," : "") + std::to_string(d[i]);
  return s + "]";
}

std::string flags_text(uint8_t f) {
  std::string s;
  if (f & formats::kTensorUninitialized) s += " uninitialized";
  if (f & formats::kTensorHasData) s += " full";
  if (f & formats::kTensorDropped) s += " dropped";
  if (f & formats::kTensorNotFingerprinted) s += " not-fingerprinted";
  if (f & formats::kTensorWrappedNumber) s += " wrapped-number";
  if (f & formats::kTensorRequiresGrad) s += (f & formats::kTensorNonLeaf) ? " requires-grad" : " requires-grad leaf";
  return s;
}

nlohmann::json value_json(const formats::Value& v, const formats::StepReader& reader, std::string* text,
                          const std::string& indent) {
  nlohmann::json j;
  j["kind"] = formats::value_kind_name(v.kind);
  j["name"] = v.name;
  if (v.mutated) j["mutated"] = true;
  if (v.kind == formats::ValueKind::kTensor || v.kind == formats::ValueKind::kGenerator) {
    const auto& m = v.tensor;
    j["dtype"] = std::string(dtype_name(m.dtype));
    j["sizes"] = m.sizes;
    j["strides"] = m.strides;
    j["storage_offset"] = m.storage_offset;
    j["device"] = m.device;
    j["fingerprint"] = m.has_fingerprint() ? fmt::format("{:016x}", m.fingerprint) : std::string();
    j["flags"] = flags_text(m.flags);
    j["storage_id"] = m.storage_id;
    j["version"] = m.version;
    std::string line = fmt::format("{}{:<10} {}{} {} {} strides {} fp {}{}", indent, v.name.empty() ? "-" : v.name,
                                   formats::value_kind_name(v.kind) == std::string("generator") ? "generator " : "",
                                   dtype_name(m.dtype), dims_text(m.sizes), m.device, dims_text(m.strides),
                                   m.has_fingerprint() ? fmt::format("{:016x}", m.fingerprint) : "-",
                                   flags_text(m.flags));
    if (v.mutated) line += " (written)";
    *text += line + "\n";
    if ((m.flags & formats::kTensorHasData) && m.data_index >= 0) {
      auto data = reader.read_tensor(m.data_index);
      auto values = preview(data, 8);
      j["preview"] = values;
      std::string p;
      for (std::size_t i = 0; i < values.size(); ++i) p += (i ? ", " : "") + values[i];
      if (static_cast<int64_t>(values.size()) < m.numel()) p += ", ...";
      *text += fmt::format("{}  values [{}]\n", indent, p);
    }
  } else {
    j["value"] = v.text;
    *text += fmt::format("{}{:<10} {} {}{}\n", indent, v.name.empty() ? "-" : v.name, formats::value_kind_name(v.kind),
                         v.text, v.mutated ? " (written)" : "");
  }
  return j;
}

int run_show(const std::string& dir, const std::string& event_text, int rank, bool json) {
  auto id = formats::parse_event_id(event_text);
  if (!id) throw UsageError(fmt::format("'{}' is not an event id: use a number such as 1234, or STREAM.SEQ such as 2.57", event_text));
  const auto layout = formats::scan_recording(dir);
  const formats::RankFiles* files = nullptr;
  for (const auto& r : layout.ranks)
    if (r.rank == rank) files = &r;
  if (files == nullptr) throw UsageError(fmt::format("{} has no rank {}", dir, rank));
  // A foreign or other-version manifest is refused here too.
  const formats::Manifest manifest = formats::read_manifest(files->manifest_path);
  for (const auto& [step, path] : files->steps) {
    formats::StepReader reader(path);
    for (const auto& ev : reader.events()) {
      if (ev.id != *id) continue;
      std::string text;
      nlohmann::json j;
      j["id"] = formats::event_id_string(ev.id);
      j["rank"] = rank;
      j["step"] = ev.step;
      j["phase"] = formats::phase_name(ev.phase);
      j["op"] = ev.op;
      j["overload"] = ev.overload;
      j["schema"] = ev.schema;
      j["scope"] = ev.scope;
      j["node"] = ev.node;
      j["thread"] = ev.thread;
      j["stream"] = ev.stream;
      j["duration_ns"] = ev.t_end_ns - ev.t_start_ns;
      const std::string autocast = formats::autocast_text(formats::autocast_of(ev.flags));
      j["autocast"] = autocast;
      const bool grad_mode = (ev.flags & formats::kEventGradMode) != 0;
      j["grad_mode"] = grad_mode;
      const auto default_dtype = formats::default_dtype_of(ev.flags);
      j["default_dtype"] = default_dtype ? std::string(dtype_name(*default_dtype)) : std::string();
      const std::string sdp = formats::sdp_text(formats::sdp_backends_of(ev.flags));
      j["sdpa_backend"] = sdp;
      // The in-process knobs the op ran under, as replay sets them; the CUDA
      // ones apart (printed where one is not torch's default).
      replay::Config cpu_knobs, cuda_knobs;
      for (const auto& [k, v] : replay::with_event_knobs(replay::Config{}, ev, replay::GpuKnobs::kAlways).knobs) {
        const auto info = std::find_if(replay::knob_table().begin(), replay::knob_table().end(),
                                       [&](const replay::KnobInfo& i) { return i.name == k; });
        (info != replay::knob_table().end() && info->needs_cuda ? cuda_knobs : cpu_knobs).set(k, v);
      }
      const std::string knobs = cpu_knobs.to_string(), cuda = cuda_knobs.to_string();
      // Bit 13 set: knobs_of gives the CUDA knobs.
      const bool cuda_recorded = ev.knobs && (*ev.knobs & formats::kKnobsGpuRecorded) != 0;
      const bool cuda_default =
          !cuda_recorded || formats::gpu_knob_bits(*formats::knobs_of(*ev.knobs).gpu) == formats::gpu_knob_bits({});
      j["knobs"] = knobs;
      j["cuda_knobs"] = cuda;
      j["file"] = path;
      text += fmt::format("event {} (rank {}, step {}, {}) {}\n", j["id"].get<std::string>(), rank, ev.step,
                          formats::phase_name(ev.phase), formats::op_text(ev.op, ev.overload));
      text += fmt::format("  schema  {}\n  scope   {}\n", ev.schema, ev.scope.empty() ? "(top)" : ev.scope);
      if (!ev.node.empty()) text += fmt::format("  node    {}\n", ev.node);
      if (!autocast.empty()) text += fmt::format("  autocast {}\n", autocast);
      if (grad_mode) text += "  grad mode on\n";
      if (default_dtype && *default_dtype != DType::kFloat32)
        text += fmt::format("  default dtype {}\n", dtype_name(*default_dtype));
      if (sdp != "all") text += fmt::format("  attention backends {} (sdpa_backend)\n", sdp);
      if (!knobs.empty()) text += fmt::format("  knobs   {}\n", knobs);
      if (!cuda_default) text += fmt::format("  cuda knobs {}\n", cuda);
      text += fmt::format("  thread  {} (stream {})  {:.1f} us\n", ev.thread, ev.stream,
                          (ev.t_end_ns - ev.t_start_ns) / 1000.0);
      text += "  inputs\n";
      j["inputs"] = nlohmann::json::array();
      for (const auto& v : ev.inputs) j["inputs"].push_back(value_json(v, reader, &text, "    "));
      text += "  outputs\n";
      j["outputs"] = nlohmann::json::array();
      for (const auto& v : ev.outputs) j["outputs"].push_back(value_json(v, reader, &text, "    "));
      if (json) std::printf("%s\n", j.dump(2).c_str());
      else std::fputs(text.c_str(), stdout);
      return 0;
    }
  }
  // A torn or stopped recording lost the events after its last complete step.
  auto info = [&](const char* key) {
    auto it = manifest.info.find(key);
    return it == manifest.info.end() ? std::string() : it->second;
  };
  std::string lost;
  if (!files->torn.empty()) {
    lost = fmt::format("; step {} is torn (the process died during it): its events were lost", files->torn.back().first);
  } else if (info("recording_failed") == "1") {
    lost = fmt::format("; the recording stopped at step {} (a write failed): later events were not recorded",
                       info("failed_step"));
  } else if (info("clean_exit") != "1") {
    lost = "; the recording is incomplete (the process did not exit cleanly)";
  }
  throw UsageError(formats::no_event_message(dir, event_text, rank, lost));
}

}  // namespace

void add_show_command(CLI::App& app, VerbResult& result) {
  struct Options {
    std::string dir, event;
    int rank = 0;
    bool json = false;
  };
  auto o = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand("show", "Show one event with its arguments and fingerprints");
  sub->footer(kHelp);
  sub->add_option("recording", o->dir, "Recording directory")->required();
  sub->add_option("--event,-e", o->event, "Event id")->required();
  sub->add_option("--rank", o->rank, "Rank (default 0)");
  sub->add_flag("--json", o->json, "Machine-readable output");
  sub->callback([o, &result] { result.exit_code = run_show(o->dir, o->event, o->rank, o->json); });
}

}  // namespace opguard::cli
