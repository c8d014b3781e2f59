// scan_recording: which files a recording directory holds, without opening them.

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

#include "opguard/core/error.h"
#include "opguard/formats/recording.h"

namespace opguard::formats {
namespace {

namespace fs = std::filesystem;

// "<prefix><digits><suffix>" -> the number; nullopt for anything else.
std::optional<int64_t> numbered(const std::string& name, const std::string& prefix, const std::string& suffix) {
  if (name.size() <= prefix.size() + suffix.size()) return std::nullopt;
  if (name.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  if (name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) return std::nullopt;
  std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.empty() || digits.size() > 15) return std::nullopt;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  return std::strtoll(digits.c_str(), nullptr, 10);
}

}  // namespace

RecordingLayout scan_recording(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw FormatError(dir + " is not an opguard recording: it is not a directory");
  }
  RecordingLayout layout;
  layout.dir = dir;
  fs::directory_iterator it(dir, ec);
  if (ec) throw FormatError(dir + " is not an opguard recording: it cannot be listed (" + ec.message() + ")");
  for (const auto& entry : it) {
    auto rank = numbered(entry.path().filename().string(), "rank", "");
    if (!rank || *rank > INT32_MAX || !entry.is_directory(ec)) continue;
    RankFiles rf;
    rf.rank = static_cast<int>(*rank);
    rf.dir = entry.path().string();
    rf.manifest_path = (entry.path() / "manifest.h5").string();
    if (!fs::is_regular_file(rf.manifest_path, ec)) continue;
    fs::directory_iterator files(entry.path(), ec);
    if (ec) continue;
    for (const auto& f : files) {
      const std::string name = f.path().filename().string();
      if (auto s = numbered(name, "step", ".h5")) {
        rf.steps.emplace_back(*s, f.path().string());
      } else if (auto t = numbered(name, "step", ".h5.tmp")) {
        rf.torn.emplace_back(*t, f.path().string());
      }
    }
    std::sort(rf.steps.begin(), rf.steps.end());
    std::sort(rf.torn.begin(), rf.torn.end());
    layout.ranks.push_back(std::move(rf));
  }
  if (layout.ranks.empty()) {
    throw FormatError(dir + " is not an opguard recording: it has no rank<N>/manifest.h5");
  }
  std::sort(layout.ranks.begin(), layout.ranks.end(),
            [](const RankFiles& a, const RankFiles& b) { return a.rank < b.rank; });
  return layout;
}

}  // namespace opguard::formats
