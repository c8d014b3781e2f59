#include "opguard/formats/rerecord.h"

#include <unistd.h>

#include <cstring>
#include <set>

namespace opguard::formats {
namespace {

constexpr const char* kShellSafe = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,+@%";

constexpr const char* kNumericsEnvPrefixes[] = {
    "OMP_",    "MKL_",    "KMP_",   "OPENBLAS_", "GOTO",     "BLIS_",   "ATEN_",  "TORCH_",
    "PYTORCH_", "CUDA_",  "CUBLAS", "CUDNN_",    "NCCL_",    "NVIDIA_", "DNNL_",  "ONEDNN_",
    "RANK",    "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_", "GLOO_",
};

bool shell_safe(char c) { return c != '\0' && std::strchr(kShellSafe, c) != nullptr; }

}  // namespace

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of(kShellSafe) == std::string::npos) return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

bool is_shell_quoted_words(const std::string& text) {
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (true) {
    if (i >= n) return false;  // an empty word: leading, trailing or double space
    if (text[i] == '\'') {
      // '...' with each ' inside written as '\'' (close, escaped quote, reopen).
      ++i;
      while (true) {
        if (i >= n) return false;
        if (text[i] != '\'') {
          ++i;
        } else if (text.compare(i, 4, "'\\''") == 0) {
          i += 4;
        } else {
          ++i;
          break;
        }
      }
    } else {
      const std::size_t start = i;
      while (i < n && shell_safe(text[i])) ++i;
      if (i == start) return false;
    }
    if (i == n) return true;
    if (text[i] != ' ') return false;
    ++i;
  }
}

bool is_numerics_env(const std::string& name) {
  if (name.empty() || name.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_") !=
                          std::string::npos)
    return false;
  for (const char* prefix : kNumericsEnvPrefixes) {
    if (name.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

std::vector<std::string> numerics_env_here() {
  std::vector<std::string> names;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string kv = *e;
    std::string name = kv.substr(0, kv.find('='));
    if (is_numerics_env(name)) names.push_back(std::move(name));
  }
  return names;
}

std::string rerecord_command(const Manifest& manifest, const std::string& recording_dir, const std::string& event_id,
                             int radius, const std::string& opguard_command, const std::vector<std::string>& inherited) {
  const auto& info = manifest.info;
  auto cmd = info.find("record_command");
  if (cmd == info.end() || !is_shell_quoted_words(cmd->second)) return "";
  std::string text;
  auto cwd = info.find("cwd");
  if (cwd != info.end() && !cwd->second.empty()) text += "cd " + shell_quote(cwd->second) + " && ";
  std::string env;
  for (const auto& name : std::set<std::string>(inherited.begin(), inherited.end())) {
    if (is_numerics_env(name) && manifest.env.count(name) == 0) env += " -u " + name;
  }
  for (const auto& [k, v] : manifest.env) {
    if (is_numerics_env(k)) env += " " + shell_quote(k + "=" + v);
  }
  if (!env.empty()) text += "env" + env + " ";
  std::string out = recording_dir;
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  out += "-around-" + event_id;
  auto declared = info.find("declared_knobs");
  const std::string declare =
      declared == info.end() || declared->second.empty() ? "" : " --declare " + shell_quote(declared->second);
  // The program ends once the window is written: a long training run is not
  // run to its end for one window.
  text += opguard_command + " record --out " + shell_quote(out) + " --stop-after-windows --dump-around " + event_id +
          ":" + std::to_string(radius) + declare + " -- " + cmd->second;
  return text;
}

}  // namespace opguard::formats
