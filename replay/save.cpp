#include "save.h"

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "opguard/core/error.h"
#include "opguard/formats/tensor_file.h"

namespace opguard::replay::detail {
namespace {

using nlohmann::json;

formats::StoredTensor stored(const std::string& name, const OutValue& v) {
  formats::StoredTensor t;
  t.name = name;
  t.dtype = v.dtype;
  t.sizes = v.sizes;
  t.strides = v.strides;
  t.storage_offset = v.storage_offset;
  t.bytes = v.bytes;
  return t;
}

}  // namespace

void save_trial(const std::string& dir, const formats::Event& ev, const ExecResult& exec, const std::string& config) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    const int err = errno;
    throw IoError("cannot create the trial directory " + dir + ": " + std::strerror(err));
  }
  json call;
  call["op"] = ev.op;
  call["overload"] = ev.overload;
  call["schema"] = ev.schema;
  call["config"] = config;
  // The dtype of the CPU autocast the op ran under ("" without): the bundle's
  // programs run on the CPU.
  const auto autocast = formats::autocast_of(ev.flags).cpu;
  call["autocast_cpu"] = autocast ? std::string(dtype_name(*autocast)) : std::string();
  call["grad_mode"] = (ev.flags & formats::kEventGradMode) != 0;
  const auto default_dtype = formats::default_dtype_of(ev.flags);
  call["default_dtype"] = default_dtype ? std::string(dtype_name(*default_dtype)) : std::string();
  call["sdpa_backend"] = formats::sdp_text(formats::sdp_backends_of(ev.flags));
  call["environment"] = json::object();
  for (const auto& [k, v] : torch_environment()) call["environment"][k] = v;
  std::vector<formats::StoredTensor> inputs, outputs;
  auto add_input = [&](const std::string& name, const OutValue& v) -> json {
    if (v.kind != formats::ValueKind::kTensor) return nullptr;
    if (!v.bytes_valid) throw IoError("argument " + name + " of " + ev.op + " cannot be read back to save it");
    inputs.push_back(stored(name, v));
    return name;
  };
  call["arguments"] = json::array();
  for (std::size_t i = 0; i < exec.call.size(); ++i) {
    const CallArg& a = exec.call[i];
    json j = {{"name", a.name}, {"type", a.type}, {"kwarg_only", a.kwarg_only}, {"kind", a.kind}, {"text", a.text},
              {"code", a.code}, {"written", a.written}};
    j["datasets"] = json::array();
    const bool list = a.kind == "tensor_list" || a.kind == "optional_tensor_list";
    for (std::size_t k = 0; k < a.tensors.size(); ++k) {
      const std::string name = a.kind == "default_generator" ? std::string("default_generator")
                               : list ? "arg" + std::to_string(i) + "_" + std::to_string(k)
                                      : "arg" + std::to_string(i);
      j["datasets"].push_back(add_input(name, a.tensors[k]));
    }
    if (std::any_of(a.grad.begin(), a.grad.end(), [](const std::string& g) { return !g.empty(); }))
      j["grad"] = a.grad;  // per dataset: "leaf", "computed" or ""
    call["arguments"].push_back(std::move(j));
  }
  call["outputs"] = json::array();
  for (std::size_t k = 0; k < exec.outputs.size(); ++k) {
    const OutValue& o = exec.outputs[k];
    json j = {{"index", k}, {"kind", formats::value_kind_name(o.kind)}, {"text", o.text}};
    if (o.kind == formats::ValueKind::kTensor && o.bytes_valid) {
      j["dataset"] = "out" + std::to_string(k);
      j["dtype"] = std::string(dtype_name(o.dtype));
      j["sizes"] = o.sizes;
      outputs.push_back(stored("out" + std::to_string(k), o));
    }
    call["outputs"].push_back(std::move(j));
  }
  formats::write_tensor_file(dir + "/inputs.h5", inputs);
  formats::write_tensor_file(dir + "/outputs.h5", outputs);
  formats::write_new_file(dir + "/call.json", call.dump(2) + "\n");
}

}  // namespace opguard::replay::detail
