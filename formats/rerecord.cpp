#include "opguard/formats/rerecord.h"

namespace opguard::formats {

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,+@%") ==
                        std::string::npos)
    return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string rerecord_command(const Manifest& manifest, const std::string& recording_dir, const std::string& event_id,
                             int radius, const std::string& opguard_command) {
  const auto& info = manifest.info;
  auto cmd = info.find("record_command");
  if (cmd == info.end() || cmd->second.empty()) return "";
  std::string text;
  auto cwd = info.find("cwd");
  if (cwd != info.end() && !cwd->second.empty()) text += "cd " + shell_quote(cwd->second) + " && ";
  std::string env;
  for (const auto& [k, v] : manifest.env) env += " " + shell_quote(k + "=" + v);
  if (!env.empty()) text += "env" + env + " ";
  std::string out = recording_dir;
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  out += "-around-" + event_id;
  text += opguard_command + " record --out " + shell_quote(out) + " --dump-around " + event_id + ":" +
          std::to_string(radius) + " -- " + cmd->second;
  return text;
}

}  // namespace opguard::formats
