// The repro bundle: two replay trials that save what the op received and
// returned (ReplayOptions::save_dir), compared; when their bits differ, the
// bundle's files, with the op call of repro.py and repro.cpp generated from the
// recorded schema. Every value that goes into generated code is validated
// here first (a crafted recording must not inject code), and every file name
// is a constant of this file.

#include "opguard/bisect/repro.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "opguard/formats/recording.h"
#include "opguard/formats/tensor_file.h"
#include "repro_templates.h"

extern char** environ;

namespace opguard::bisect {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kBundleFormat = "opguard-bundle/1";
// Every file of a bundle; check_bundle accepts no other names.
const std::vector<std::string> kBundleFiles = {"inputs.h5",   "expected_good.h5", "expected_bad.h5", "manifest.json",
                                               "README.md",   "repro.py",         "repro.cpp",       "CMakeLists.txt"};
constexpr const char* kTrialsDir = ".trials";  // inside out_dir while the trials run; removed after

// Knobs the standalone programs can set (repro.py, repro.cpp: apply_in_process, env_of).
const std::set<std::string> kReproKnobs = {"device",        "threads",        "cpu_capability", "mkldnn",
                                           "deterministic", "dtype",          "flush_denormal", "float32_matmul_precision",
                                           "blas_threads",  "tp",             "microbatches",   "reduce",
                                           "sdpa_backend"};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw FormatError(path + " cannot be read");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (std::size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

// --- the output directory ---------------------------------------------------------

// Returns whether it created the directory. A symlink, a file, or a non-empty
// directory is refused: the bundle never writes among someone else's files.
bool prepare_out_dir(const std::string& out_dir) {
  if (out_dir.empty()) throw UsageError("-o needs a directory for the bundle");
  struct stat st {};
  if (::lstat(out_dir.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode))
      throw IoError(fmt::format("{} is a symbolic link: give the bundle a plain new directory", out_dir));
    if (!S_ISDIR(st.st_mode)) throw IoError(fmt::format("{} exists and is not a directory", out_dir));
    if (!fs::is_empty(out_dir))
      throw IoError(fmt::format("{} exists and is not empty: give the bundle a new or empty directory", out_dir));
    return false;
  }
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw IoError(fmt::format("cannot create {}: {}", out_dir, ec.message()));
  return true;
}

// --- validated values for generated code --------------------------------------------

[[noreturn]] void refuse(const std::string& what) {
  throw CannotBundle("the recorded call cannot go into a standalone program: " + what);
}

const std::regex kIdent("[A-Za-z_][A-Za-z0-9_]*");
const std::regex kInt("-?[0-9]{1,20}");
// C99 hex floats as "%a" prints them, and its inf/nan.
const std::regex kDouble("-?(0x[0-9a-f]+(\\.[0-9a-f]*)?p[-+][0-9]+|inf|nan)");
const std::regex kDevice("[a-z]+(:[0-9]+)?");

std::string checked(const std::string& text, const std::regex& re, const std::string& what) {
  if (!std::regex_match(text, re)) refuse(fmt::format("'{}' is not a valid {}", text, what));
  return text;
}

std::vector<std::string> list_items(const std::string& text) {
  if (text.size() < 2 || text.front() != '[' || text.back() != ']') refuse("'" + text + "' is not a list");
  std::vector<std::string> items;
  std::string cur;
  for (std::size_t i = 1; i + 1 < text.size(); ++i) {
    if (text[i] == ',') {
      items.push_back(cur);
      cur.clear();
    } else {
      cur += text[i];
    }
  }
  if (!cur.empty()) items.push_back(cur);
  return items;
}

// A string literal valid in both C++ and Python: printable ASCII, with \\, ",
// and everything else as three-digit octal escapes.
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("\\{:03o}", c);
    }
  }
  return out + "\"";
}

const std::map<std::string, std::string> kPyLayouts = {{"Strided", "torch.strided"}, {"Sparse", "torch.sparse_coo"},
                                                       {"SparseCsr", "torch.sparse_csr"}, {"Mkldnn", "torch._mkldnn"}};
const std::map<std::string, std::string> kPyMemoryFormats = {{"Contiguous", "torch.contiguous_format"},
                                                             {"Preserve", "torch.preserve_format"},
                                                             {"ChannelsLast", "torch.channels_last"},
                                                             {"ChannelsLast3d", "torch.channels_last_3d"}};

struct Generated {
  std::string py_args, py_call, cpp_args;
  std::vector<std::string> py_locals;  // the argument locals in schema order (a0, a1, ...)
  // Arguments the op writes and does not return, compared after the call:
  // their Python locals, their C++ stack slots.
  std::vector<std::string> py_written, cpp_written;
  std::vector<std::string> summary;  // one line per argument for the manifest and README
};

std::string dataset_of(const json& j) {
  if (!j.is_string()) refuse("an argument tensor has no dataset");
  return checked(j.get<std::string>(), kIdent, "dataset name");
}

// The call of the op, in Python (named locals, then torch.ops.<ns>.<op>.<overload>)
// and C++ (the boxed stack, then callBoxed), from the trial's call.json.
Generated generate_call(const json& call) {
  Generated g;
  const std::string op = call.at("op"), overload = call.at("overload");
  const auto sep = op.find("::");
  if (sep == std::string::npos) refuse("operator name '" + op + "' has no namespace");
  const std::string ns = checked(op.substr(0, sep), kIdent, "operator namespace");
  const std::string name = checked(op.substr(sep + 2), kIdent, "operator name");
  if (!overload.empty()) checked(overload, kIdent, "overload name");
  std::vector<std::string> positional, keyword;
  std::string py_pre, cpp_pre;
  int index = 0;
  for (const json& a : call.at("arguments")) {
    const std::string kind = a.at("kind"), text = a.at("text"), type = a.at("type");
    const json& datasets = a.at("datasets");
    const std::string arg_name = a.at("name");
    const std::string local = fmt::format("a{}", index);
    std::string py, cpp;
    // Whether each tensor required grad (call.json "grad"): the loaders set
    // it again, as opguard's replay does.
    auto grad_of = [&](std::size_t k) -> std::string {
      if (!a.contains("grad")) return "";
      const json& g = a.at("grad");
      if (!g.is_array() || k >= g.size() || !g[k].is_string()) refuse("argument '" + arg_name + "' has a bad grad list");
      const std::string v = g[k].get<std::string>();
      if (v != "" && v != "leaf" && v != "computed") refuse("'" + v + "' is not a grad state");
      return v;
    };
    auto tensor_expr = [&](const json& ds, std::size_t k) {
      const std::string grad = grad_of(k);
      return grad.empty() ? fmt::format("t(\"{}\")", dataset_of(ds))
                          : fmt::format("t(\"{}\", \"{}\")", dataset_of(ds), grad);
    };
    if (kind == "tensor") {
      py = cpp = tensor_expr(datasets.at(0), 0);
    } else if (kind == "wrapped_number") {
      // A Python number the dispatcher wrapped in a 0-dim tensor: passed as a
      // number again (type promotion treats it as a scalar), never cast.
      const std::string ds = dataset_of(datasets.at(0));
      py = fmt::format("load(h5, \"{}\").item()", ds);
      cpp = fmt::format("wrapped(load(inputs, \"{}\"))", ds);
    } else if (kind == "none") {
      py = "None";
      // A non-optional Tensor argument that is undefined travels as an undefined tensor.
      cpp = type == "Tensor" ? "at::Tensor()" : "c10::IValue()";
    } else if (kind == "int") {
      py = checked(text, kInt, "integer");
      cpp = fmt::format("c10::IValue(static_cast<int64_t>(std::strtoll(\"{}\", nullptr, 10)))", py);
    } else if (kind == "double") {
      checked(text, kDouble, "double");
      py = fmt::format("float.fromhex(\"{}\")", text);
      cpp = fmt::format("c10::IValue(d(\"{}\"))", text);
    } else if (kind == "bool") {
      if (text != "true" && text != "false") refuse("'" + text + "' is not a bool");
      py = text == "true" ? "True" : "False";
      cpp = fmt::format("c10::IValue({})", text);
    } else if (kind == "complex") {
      const auto comma = text.find(',');
      if (text.size() < 5 || text.front() != '(' || text.back() != ')' || comma == std::string::npos)
        refuse("'" + text + "' is not a complex");
      const std::string re = checked(text.substr(1, comma - 1), kDouble, "double");
      const std::string im = checked(text.substr(comma + 1, text.size() - comma - 2), kDouble, "double");
      py = fmt::format("complex(float.fromhex(\"{}\"), float.fromhex(\"{}\"))", re, im);
      cpp = fmt::format("c10::IValue(c10::complex<double>(d(\"{}\"), d(\"{}\")))", re, im);
    } else if (kind == "string") {
      py = quoted(text);
      cpp = fmt::format("c10::IValue(std::string({}))", quoted(text));
    } else if (kind == "int_list" || kind == "double_list" || kind == "bool_list") {
      std::vector<std::string> py_items, cpp_items;
      for (const auto& item : list_items(text)) {
        if (kind == "int_list") {
          py_items.push_back(checked(item, kInt, "integer"));
          cpp_items.push_back(fmt::format("static_cast<int64_t>(std::strtoll(\"{}\", nullptr, 10))", item));
        } else if (kind == "double_list") {
          checked(item, kDouble, "double");
          py_items.push_back(fmt::format("float.fromhex(\"{}\")", item));
          cpp_items.push_back(fmt::format("d(\"{}\")", item));
        } else {
          if (item != "true" && item != "false") refuse("'" + item + "' is not a bool");
          py_items.push_back(item == "true" ? "True" : "False");
          cpp_items.push_back(item);
        }
      }
      py = fmt::format("[{}]", fmt::join(py_items, ", "));
      const char* elem = kind == "int_list" ? "int64_t" : kind == "double_list" ? "double" : "bool";
      cpp = kind == "bool_list" ? fmt::format("c10::IValue(c10::List<bool>({{{}}}))", fmt::join(cpp_items, ", "))
                                : fmt::format("c10::IValue(std::vector<{}>{{{}}})", elem, fmt::join(cpp_items, ", "));
    } else if (kind == "scalar_type" || kind == "layout" || kind == "memory_format") {
      const int64_t code = a.at("code");
      if (kind == "scalar_type") {
        if (!dtype_from_name(text)) refuse("'" + text + "' is not a dtype");
        py = "torch." + text;
      } else {
        const auto& table = kind == "layout" ? kPyLayouts : kPyMemoryFormats;
        const auto it = table.find(text);
        if (it == table.end()) refuse("'" + text + "' is not a " + kind);
        py = it->second;
      }
      cpp = fmt::format("c10::IValue(static_cast<int64_t>({}))  /* {} */", code, text);
    } else if (kind == "device") {
      checked(text, kDevice, "device");
      py = fmt::format("torch.device(\"{}\")", text);
      cpp = fmt::format("c10::IValue(c10::Device(\"{}\"))", text);
    } else if (kind == "generator") {
      const std::string ds = dataset_of(datasets.at(0));
      py = fmt::format("generator(h5, \"{}\")", ds);
      cpp = fmt::format("c10::IValue(generator(load(inputs, \"{}\")))", ds);
    } else if (kind == "tensor_list" || kind == "optional_tensor_list") {
      std::vector<std::string> py_items, cpp_items;
      for (std::size_t k = 0; k < datasets.size(); ++k) {
        if (datasets[k].is_null()) {
          py_items.push_back("None");
          cpp_items.push_back("std::nullopt");
        } else {
          py_items.push_back(tensor_expr(datasets[k], k));
          cpp_items.push_back(py_items.back());
        }
      }
      py = fmt::format("[{}]", fmt::join(py_items, ", "));
      cpp = kind == "tensor_list"
                ? fmt::format("c10::IValue(c10::List<at::Tensor>({{{}}}))", fmt::join(cpp_items, ", "))
                : fmt::format("c10::IValue(c10::List<std::optional<at::Tensor>>({{{}}}))", fmt::join(cpp_items, ", "));
    } else if (kind == "default_generator") {
      const std::string ds = dataset_of(datasets.at(0));
      py_pre += fmt::format("        torch.default_generator.set_state(load(h5, \"{}\").contiguous())\n", ds);
      // getDefaultCPUGenerator() is a const reference; a copy shares its state.
      cpp_pre += fmt::format("  at::Generator(at::detail::getDefaultCPUGenerator()).set_state(load(inputs, \"{}\").contiguous());\n", ds);
      g.summary.push_back("the default CPU generator's state: dataset " + ds);
      continue;
    } else {
      refuse(fmt::format("argument '{}' is a {} ({})", arg_name, kind, text));
    }
    const std::string comment = fmt::format("{} {}", type, arg_name);
    g.py_args += fmt::format("        {} = {}  # {}\n", local, py, comment);
    g.py_locals.push_back(local);
    if (a.value("written", false)) {
      // Written and not returned: compared after the call like an output.
      g.py_written.push_back(local);
      g.cpp_written.push_back(fmt::format("stack[{}]", index));
    }
    g.cpp_args += fmt::format("  stack.emplace_back({});  // {}\n", cpp, comment);
    (a.at("kwarg_only").get<bool>() ? keyword : positional)
        .push_back(a.at("kwarg_only").get<bool>() ? fmt::format("{}={}", checked(arg_name, kIdent, "argument name"), local)
                                                  : local);
    g.summary.push_back(fmt::format("{} {} = {}", type, arg_name,
                                    kind == "tensor" || kind == "wrapped_number" || kind == "generator" ||
                                            kind.find("list") != std::string::npos
                                        ? (datasets.empty() ? text : "dataset " + datasets.dump())
                                        : text.empty() ? kind : text));
    ++index;
  }
  g.py_args += py_pre;
  g.cpp_args += cpp_pre;
  positional.insert(positional.end(), keyword.begin(), keyword.end());
  g.py_call = fmt::format("torch.ops.{}.{}.{}({})", ns, name, overload.empty() ? "default" : overload,
                          fmt::join(positional, ", "));
  return g;
}

// --- configs ------------------------------------------------------------------------

std::vector<std::pair<std::string, std::string>> knobs_of(const std::string& config_text) {
  return replay::Config::parse(config_text).knobs;
}

void check_repro_knobs(const std::vector<std::pair<std::string, std::string>>& knobs) {
  for (const auto& [k, v] : knobs) {
    if (kReproKnobs.count(k) || k.rfind("env:", 0) == 0) continue;
    throw UsageError(fmt::format(
        "knob {} acts on the GPU and the standalone repro programs run on the CPU: bundle a divergence of another "
        "knob",
        k));
  }
}

std::string py_config(const std::vector<std::pair<std::string, std::string>>& knobs) {
  std::vector<std::string> items;
  for (const auto& [k, v] : knobs) items.push_back(fmt::format("{}: {}", quoted(k), quoted(v)));
  return fmt::format("{{{}}}", fmt::join(items, ", "));
}

std::string cpp_config(const std::vector<std::pair<std::string, std::string>>& knobs) {
  std::vector<std::string> items;
  for (const auto& [k, v] : knobs) items.push_back(fmt::format("{{{}, {}}}", quoted(k), quoted(v)));
  return fmt::format("{{{}}}", fmt::join(items, ", "));
}

std::vector<std::string> differing_knobs(const std::vector<std::pair<std::string, std::string>>& good,
                                         const std::vector<std::pair<std::string, std::string>>& bad) {
  std::map<std::string, std::string> g(good.begin(), good.end()), b(bad.begin(), bad.end());
  std::vector<std::string> out;
  for (const auto& [k, v] : b)
    if (!g.count(k) || g[k] != v) out.push_back(k);
  for (const auto& [k, v] : g)
    if (!b.count(k)) out.push_back(k);
  return out;
}

std::string ulp_text(uint64_t ulp) { return ulp == kernels::kUlpInfinite ? "inf" : std::to_string(ulp); }

json metrics_json(const kernels::CompareResult& m) {
  json j = {{"differing", m.differing}, {"numel", m.numel}, {"max_abs_error", m.max_abs_error}};
  if (m.floating) {
    j["max_ulp"] = ulp_text(m.max_ulp);
    j["max_rel_error"] = m.max_rel_error;
  }
  if (m.first_index >= 0)
    j["first"] = {{"index", m.first_index}, {"good", m.first_a}, {"bad", m.first_b},
                  {"good_bits", fmt::format("0x{:x}", m.first_a_bits)}, {"bad_bits", fmt::format("0x{:x}", m.first_b_bits)}};
  return j;
}

// The CPU's model name and the SIMD flags that decide which ATen kernels a
// cpu_capability can select (/proc/cpuinfo).
std::pair<std::string, std::string> cpu_model_and_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model = "unknown", flags;
  bool have_model = false, have_flags = false;
  while (std::getline(in, line) && !(have_model && have_flags)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const auto begin = line.find_first_not_of(' ', colon + 1);
    const std::string value = begin == std::string::npos ? "" : line.substr(begin);
    if (!have_model && line.rfind("model name", 0) == 0) {
      model = value;
      have_model = true;
    } else if (!have_flags && line.rfind("flags", 0) == 0) {
      std::istringstream words(value);
      std::string w;
      while (words >> w)
        if (w == "avx" || w == "avx2" || w == "fma" || w.rfind("avx512", 0) == 0 || w.rfind("amx", 0) == 0)
          flags += (flags.empty() ? "" : " ") + w;
      have_flags = true;
    }
  }
  return {model, flags};
}

struct Trial {
  replay::ReplayResult result;
  json call;
  std::map<std::string, formats::StoredTensor> outputs;  // by dataset name
};

Trial run_trial(const BundleSpec& spec, const replay::Config& config, bool from_recorded, const std::string& dir) {
  replay::ReplayOptions o;
  o.rank = spec.rank;
  o.config = config;
  o.from_recorded = from_recorded && !spec.whole_configs;
  o.self_exe = spec.self_exe;
  o.slices = spec.slices;
  o.save_dir = dir;
  Trial t;
  t.result = replay::replay_event(spec.recording_dir, spec.event, o);
  if (t.result.verdict == replay::Verdict::kCannotReplay)
    throw CannotBundle(fmt::format("event {} cannot be replayed under {}: {}", spec.event, t.result.config,
                                   t.result.message));
  if (::access((dir + "/call.json").c_str(), R_OK) != 0)
    throw CannotBundle(fmt::format("the trial of event {} under {} saved nothing", spec.event, t.result.config));
  try {
    t.call = json::parse(read_text(dir + "/call.json"));
  } catch (const json::exception& e) {
    throw CannotBundle(std::string("the trial's call.json does not parse: ") + e.what());
  }
  for (auto& s : formats::read_tensor_file(dir + "/outputs.h5")) t.outputs[s.name] = std::move(s);
  return t;
}

void copy_new_file(const std::string& from, const std::string& to) { formats::write_new_file(to, read_text(from)); }

std::string knob_list(const std::vector<std::string>& knobs, const std::vector<std::pair<std::string, std::string>>& cfg) {
  std::map<std::string, std::string> m(cfg.begin(), cfg.end());
  std::vector<std::string> items;
  for (const auto& k : knobs) items.push_back(m.count(k) ? k + "=" + m[k] : k + " unset");
  return fmt::format("{}", fmt::join(items, ", "));
}

}  // namespace

BundleResult write_bundle(const BundleSpec& spec, const std::string& out_dir) {
  const bool created = prepare_out_dir(out_dir);
  const std::string trials = out_dir + "/" + kTrialsDir;
  auto cleanup = [&](bool remove_out_dir) {
    std::error_code ec;
    fs::remove_all(trials, ec);
    if (remove_out_dir && created) fs::remove(out_dir, ec);
  };
  BundleResult br;
  br.dir = out_dir;
  try {
    if (::mkdir(trials.c_str(), 0755) != 0) throw IoError(fmt::format("cannot create {}: {}", trials, std::strerror(errno)));
    Trial good = run_trial(spec, spec.good, true, trials + "/good");
    Trial bad = run_trial(spec, spec.bad, true, trials + "/bad");
    br.op = good.result.op;
    br.overload = good.result.overload;
    br.good_config = good.result.config;
    br.bad_config = bad.result.config;
    const auto good_knobs = knobs_of(br.good_config), bad_knobs = knobs_of(br.bad_config);
    check_repro_knobs(good_knobs);
    check_repro_knobs(bad_knobs);
    // The inputs as the op saw them before any dtype knob cast them.
    std::string inputs_dir = trials + "/good";
    if (replay::Config::parse(br.good_config).get("dtype")) {
      replay::Config plain;
      for (const auto& kv : good_knobs)
        if (kv.first != "dtype") plain.knobs.push_back(kv);
      inputs_dir = trials + "/inputs";
      run_trial(spec, plain, false, inputs_dir);
    }
    // Compare the good and the bad bits, output by output.
    bool differ = good.outputs.size() != bad.outputs.size();
    json outputs_manifest = json::array();
    std::vector<std::string> output_datasets;
    for (const json& o : good.call.at("outputs")) {
      if (!o.contains("dataset")) {
        const json* other = nullptr;
        for (const json& p : bad.call.at("outputs"))
          if (p.at("index") == o.at("index")) other = &p;
        const bool same = other && other->at("text") == o.at("text") && other->at("kind") == o.at("kind");
        differ = differ || !same;
        outputs_manifest.push_back({{"index", o.at("index")}, {"kind", o.at("kind")}, {"good", o.at("text")},
                                    {"bad", other ? other->at("text") : json(nullptr)}});
        continue;
      }
      const std::string ds = checked(o.at("dataset").get<std::string>(), kIdent, "dataset name");
      output_datasets.push_back(ds);
      const auto& a = good.outputs.at(ds);
      const auto it = bad.outputs.find(ds);
      BundleOutput bo;
      bo.index = o.at("index");
      bo.dtype = std::string(dtype_name(a.dtype));
      bo.sizes = a.sizes;
      json entry = {{"index", bo.index}, {"kind", "tensor"}, {"dataset", ds}, {"dtype", bo.dtype}, {"sizes", a.sizes}};
      if (it == bad.outputs.end() || it->second.dtype != a.dtype || it->second.sizes != a.sizes) {
        differ = true;
        entry["note"] = "the bad config returns another dtype or shape";
      } else {
        bo.metrics = kernels::compare_contiguous(a.dtype, a.bytes.data(), it->second.bytes.data(), a.numel());
        differ = differ || !bo.metrics.equal();
        entry["metrics"] = metrics_json(bo.metrics);
      }
      outputs_manifest.push_back(entry);
      br.outputs.push_back(bo);
    }
    if (!differ) {
      cleanup(true);
      br.reproduced = false;
      br.message = fmt::format("event {} ({}) gives identical bits under {} and under {}: nothing to reproduce",
                               spec.event, br.op, br.good_config, br.bad_config);
      return br;
    }
    std::stable_partition(br.outputs.begin(), br.outputs.end(),
                          [](const BundleOutput& o) { return !o.metrics.equal() || o.metrics.numel == 0; });

    const Generated gen = generate_call(good.call);
    const std::vector<std::string> knobs =
        spec.knobs_found.empty() ? differing_knobs(good_knobs, bad_knobs) : spec.knobs_found;
    const std::string op_text = formats::op_text(br.op, br.overload);
    std::string finding = spec.finding;
    if (finding.empty()) {
      finding = fmt::format("{} gives different bits with {} than with {}", op_text, knob_list(knobs, bad_knobs),
                            knob_list(knobs, good_knobs));
      if (!br.outputs.empty() && br.outputs.front().metrics.numel > 0) {
        const auto& m = br.outputs.front().metrics;
        finding += fmt::format(": {} of {} elements of output {} differ, by up to {} ULP (max abs error {:.3g})",
                               m.differing, m.numel, br.outputs.front().index, ulp_text(m.max_ulp), m.max_abs_error);
      }
      finding += ".";
    }
    br.message = finding;

    // inputs.h5 and its size
    const std::string in_path = inputs_dir + "/inputs.h5";
    for (const auto& t : formats::read_tensor_file(in_path)) br.input_bytes += t.bytes.size();
    json inputs_manifest = json::array();
    for (const auto& t : formats::read_tensor_file(in_path))
      inputs_manifest.push_back({{"dataset", t.name}, {"dtype", std::string(dtype_name(t.dtype))}, {"sizes", t.sizes},
                                 {"strides", t.strides}, {"storage_offset", t.storage_offset}});

    json manifest;
    manifest["format"] = kBundleFormat;
    manifest["finding"] = finding;
    manifest["operator"] = {{"name", br.op}, {"overload", br.overload}, {"schema", good.call.at("schema")}};
    json args = json::array();
    for (const json& a : good.call.at("arguments")) {
      args.push_back({{"name", a.at("name")}, {"type", a.at("type")}, {"kwarg_only", a.at("kwarg_only")},
                      {"kind", a.at("kind")}, {"value", a.at("text")}, {"datasets", a.at("datasets")}});
      if (a.contains("grad")) args.back()["grad"] = a.at("grad");
    }
    manifest["arguments"] = args;
    manifest["inputs"] = inputs_manifest;
    manifest["outputs"] = outputs_manifest;
    manifest["good"] = {{"config", br.good_config}, {"set_over_recorded", spec.good.to_string()}};
    manifest["bad"] = {{"config", br.bad_config}, {"set_over_recorded", spec.bad.to_string()}};
    manifest["knobs_found"] = knobs;
    json slices = json::array();
    for (const auto& s : spec.slices)
      slices.push_back({{"argument", s.argument}, {"dim", s.dim}, {"start", s.start}, {"length", s.length}});
    manifest["slices"] = slices;
    // The recording's name only: its path is this machine's.
    fs::path rec = fs::path(spec.recording_dir).lexically_normal();
    if (rec.filename().empty()) rec = rec.parent_path();
    manifest["source"] = {{"recording", rec.filename().string()},
                          {"event", spec.event}, {"rank", spec.rank}, {"step", good.result.step},
                          {"phase", good.result.phase}, {"scope", good.result.scope}};
    json env = good.call.at("environment");
    env["device"] = "cpu";
    const auto [model, flags] = cpu_model_and_flags();
    env["cpu"] = model;
    env["cpu_flags"] = flags;  // cpu_capability above is the one the good trial ran with
    if (!env.contains("cuda_version")) env["cuda_version"] = nullptr;
    env["cublas"] = "not used (the op runs on the CPU)";
    if (!env.contains("cudnn_version")) env["cudnn_version"] = nullptr;
    if (!env.contains("nccl")) env["nccl"] = nullptr;
    manifest["environment"] = env;
    manifest["files"] = kBundleFiles;
    manifest["exit_codes"] = {{"0", "the divergence reproduced (good and bad bits differ; with --strict also the "
                                     "expected bits)"},
                              {"1", "it did not"},
                              {"2", "the bundle could not be run"}};

    std::string outputs_py, outputs_cpp, recorded_env;
    {
      std::vector<std::string> names;
      for (const auto& name : replay::recorded_env_names()) names.push_back(quoted(name));
      recorded_env = fmt::format("{}", fmt::join(names, ", "));
      std::vector<std::string> q;
      for (const auto& ds : output_datasets) q.push_back(quoted(ds));
      outputs_py = fmt::format("[{}]", fmt::join(q, ", "));
      outputs_cpp = fmt::format("{}", fmt::join(q, ", "));
    }
    const std::string title = fmt::format("opguard repro bundle: {}", finding);
    const std::string autocast = good.call.value("autocast_cpu", "");
    if (!autocast.empty() && !dtype_from_name(autocast)) refuse("'" + autocast + "' is not a dtype");
    manifest["autocast_cpu"] = autocast;
    const json grad_mode_json = good.call.value("grad_mode", json(false));
    if (!grad_mode_json.is_boolean()) refuse("grad_mode is not a bool");
    const bool grad_mode = grad_mode_json.get<bool>();
    manifest["grad_mode"] = grad_mode;
    const std::string default_dtype = good.call.value("default_dtype", "");
    if (!default_dtype.empty() && !dtype_from_name(default_dtype)) refuse("'" + default_dtype + "' is not a dtype");
    manifest["default_dtype"] = default_dtype;
    const std::string sdpa = good.call.value("sdpa_backend", "all");
    if (!formats::parse_sdp(sdpa)) refuse("'" + sdpa + "' is not a set of attention backends");
    manifest["sdpa_backend"] = sdpa;
    std::string py = templates::kReproPy;
    py = replace_all(py, "@@TITLE@@", replace_all(title, "\"", "'"));
    py = replace_all(py, "@@OP@@", op_text);
    py = replace_all(py, "@@CONFIGS@@",
                     fmt::format("{{\n    \"good\": {},\n    \"bad\": {},\n}}", py_config(good_knobs), py_config(bad_knobs)));
    py = replace_all(py, "@@OUTPUTS@@", outputs_py);
    py = replace_all(py, "@@RECORDED_ENV@@", "[" + recorded_env + "]");
    py = replace_all(py, "@@ARGS@@", gen.py_args);
    py = replace_all(py, "@@AUTOCAST@@", autocast.empty() ? "None" : quoted(autocast));
    py = replace_all(py, "@@GRAD_MODE@@", grad_mode ? "True" : "False");
    py = replace_all(py, "@@DEFAULT_DTYPE@@", default_dtype.empty() ? "None" : quoted(default_dtype));
    py = replace_all(py, "@@SDPA_BACKEND@@", quoted(sdpa));
    py = replace_all(py, "@@CALL@@", gen.py_call);
    const bool backward = good.result.phase == "backward";
    py = replace_all(py, "@@ARG_LIST@@", fmt::format("{}", fmt::join(gen.py_locals, ", ")));
    py = replace_all(py, "@@WRITTEN@@", fmt::format("{}", fmt::join(gen.py_written, ", ")));
    py = replace_all(py, "@@BACKWARD@@", backward ? "True" : "False");
    std::string cpp = templates::kReproCpp;
    cpp = replace_all(cpp, "@@TITLE@@", replace_all(title, "\n", " "));
    cpp = replace_all(cpp, "@@OP_NAME@@", br.op);
    cpp = replace_all(cpp, "@@OVERLOAD@@", br.overload);
    cpp = replace_all(cpp, "@@CONFIGS@@",
                      fmt::format("    {{\"good\", {}}},\n    {{\"bad\", {}}},", cpp_config(good_knobs), cpp_config(bad_knobs)));
    cpp = replace_all(cpp, "@@OUTPUTS@@", outputs_cpp);
    cpp = replace_all(cpp, "@@RECORDED_ENV@@", recorded_env);
    cpp = replace_all(cpp, "@@ARGS@@", gen.cpp_args);
    cpp = replace_all(cpp, "@@WRITTEN@@", fmt::format("{}", fmt::join(gen.cpp_written, ", ")));
    cpp = replace_all(cpp, "@@AUTOCAST@@", quoted(autocast));
    cpp = replace_all(cpp, "@@GRAD_MODE@@", grad_mode ? "true" : "false");
    cpp = replace_all(cpp, "@@DEFAULT_DTYPE@@", quoted(default_dtype));
    cpp = replace_all(cpp, "@@SDPA_BACKEND@@", quoted(sdpa));
    cpp = replace_all(cpp, "@@BACKWARD@@", backward ? "true" : "false");

    std::string readme = fmt::format("# {}\n\n", op_text);
    readme += fmt::format(
        "{} Run `python3 repro.py` (needs torch and h5py) or build `repro.cpp` with CMake (needs libtorch and HDF5) "
        "and run `./build/repro .`; both exit 0 when the divergence reproduces.\n\n",
        finding);
    readme += "```sh\npython3 repro.py            # exit 0 reproduced, 1 not, 2 could not run\n"
              "python3 repro.py --strict   # also require the exact bits of expected_good.h5 / expected_bad.h5\n"
              "cmake -S . -B build -DCMAKE_PREFIX_PATH=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')\n"
              "cmake --build build && ./build/repro . --strict\n```\n\n";
    readme += fmt::format("Good config: `{}`\n\nBad config: `{}`\n\nKnobs found: {}\n\n", br.good_config, br.bad_config,
                          knobs.empty() ? "(none)" : fmt::format("{}", fmt::join(knobs, ", ")));
    readme += "## The call\n\n";
    readme += fmt::format("Schema: `{}`\n\n", good.call.at("schema").get<std::string>());
    for (const auto& line : gen.summary) readme += "- `" + line + "`\n";
    readme += "\n## Files\n\n"
              "- `inputs.h5`: every tensor argument as the op received it (dataset per argument, attributes dtype, "
              "strides, storage_offset)\n"
              "- `expected_good.h5`, `expected_bad.h5`: the outputs under each config on the machine in the manifest\n"
              "- `manifest.json`: operator, schema, arguments, configs, knobs, metrics, environment\n"
              "- `repro.py`, `repro.cpp`, `CMakeLists.txt`: the reproducers\n\n"
              "Each config runs in its own child process with the config's environment variables set "
              "(ATEN_CPU_CAPABILITY and the like are read once per process). Written by `opguard repro`; "
              "docs/BUNDLE.md in opguard describes the format.\n";

    copy_new_file(in_path, out_dir + "/inputs.h5");
    copy_new_file(trials + "/good/outputs.h5", out_dir + "/expected_good.h5");
    copy_new_file(trials + "/bad/outputs.h5", out_dir + "/expected_bad.h5");
    formats::write_new_file(out_dir + "/manifest.json", manifest.dump(2) + "\n");
    formats::write_new_file(out_dir + "/README.md", readme);
    formats::write_new_file(out_dir + "/repro.py", py, 0755);
    formats::write_new_file(out_dir + "/repro.cpp", cpp);
    formats::write_new_file(out_dir + "/CMakeLists.txt", templates::kCMakeLists);
    cleanup(false);
    br.reproduced = true;
    return br;
  } catch (...) {
    // A half-written bundle is worse than none.
    std::error_code ec;
    fs::remove_all(trials, ec);
    for (const auto& f : kBundleFiles) ::unlink((out_dir + "/" + f).c_str());
    if (created) fs::remove(out_dir, ec);
    throw;
  }
}

CheckResult check_bundle(const std::string& dir, const CheckOptions& options) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw FormatError(fmt::format("{} is not a directory: give the bundle directory that opguard repro wrote", dir));
  for (const auto& f : kBundleFiles) {
    struct stat fst {};
    if (::lstat((dir + "/" + f).c_str(), &fst) != 0 || !S_ISREG(fst.st_mode))
      throw FormatError(fmt::format("{} is not a repro bundle: {} is missing or not a regular file", dir, f));
  }
  json manifest;
  try {
    manifest = json::parse(read_text(dir + "/manifest.json"));
  } catch (const json::exception& e) {
    throw FormatError(fmt::format("{}/manifest.json is not JSON: {}", dir, e.what()));
  }
  if (!manifest.is_object() || manifest.value("format", "") != kBundleFormat)
    throw FormatError(fmt::format("{}/manifest.json is not an {} manifest", dir, kBundleFormat));
  // The manifest's file list must be the bundle's own names: nothing it says
  // becomes a path.
  if (!manifest.contains("files") || manifest["files"] != json(kBundleFiles))
    throw FormatError(fmt::format("{}/manifest.json lists files other than the bundle's own", dir));
  if (options.python.empty()) throw UsageError("no Python interpreter to run repro.py: pass --python");

  std::vector<std::string> argv = {options.python, "repro.py"};
  if (options.strict) argv.push_back("--strict");
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) throw LaunchError(std::string("pipe: ") + std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDERR_FILENO);
  // repro.py finds its files beside itself; the working directory is the bundle's.
  posix_spawn_file_actions_addchdir_np(&actions, dir.c_str());
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, cargv[0], &actions, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipe_fds[1]);
  if (rc != 0) {
    ::close(pipe_fds[0]);
    throw LaunchError(fmt::format("cannot start {}: {}", options.python, std::strerror(rc)));
  }
  CheckResult r;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(pipe_fds[0], buf, sizeof(buf));
    if (n > 0) r.output.append(buf, static_cast<std::size_t>(n));
    else if (n == 0 || errno != EINTR) break;
  }
  ::close(pipe_fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.reproduced = r.exit_code == 0;
  r.message = r.exit_code == 0   ? "the bundle still reproduces"
              : r.exit_code == 1 ? "the bundle no longer reproduces"
                                 : fmt::format("repro.py could not run the bundle (exit {})", r.exit_code);
  return r;
}

}  // namespace opguard::bisect
