// Strings from a recording are data: op names, scopes, argument names and
// manifest values that look like paths or shell commands never become files,
// directories or commands when ls, show and diff read the recording
// (docs/RECORD.md, "Reading recordings is safe").

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>

#include "../bisect/recording_builder.h"
#include "../support/process.h"

using namespace opguard::testing;
namespace fs = std::filesystem;

namespace {

const std::string kOpguard = OPGUARD_BIN;

// Every path under `dir`, relative and sorted, except run()'s own capture files.
std::vector<std::string> tree(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string p = fs::relative(e.path(), dir).string();
    if (p.rfind("stdout.", 0) != 0 && p.rfind("stderr.", 0) != 0) out.push_back(p);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A recording whose strings are paths out of the working directory and shell
// syntax; `fp` is the output fingerprint of its first op (runs differ there).
void write_hostile(const std::string& dir, const fs::path& victim, uint64_t fp) {
  const std::string up = "../../../../../../../.." + victim.string();
  Run r;
  r.add(0, Op{up + "/op", {tensor(up + "/arg", T{1, 0, 11}), arg("$(touch " + victim.string() + "/arg)", ValueKind::kString, up)},
              {tensor(victim.string() + "/out", T{2, 0, fp})}, victim.string() + "/scope/../.."});
  r.add(0, Op{"aten::exp", {tensor("self", T{2, 0, fp})}, {tensor("", T{3, 0, fp + 1})}, "`touch " + victim.string() + "/x`"});
  r.set_info("record_command", "./train; touch " + victim.string() + "/cmd");
  r.set_info("cwd", victim.string() + "/cwd");
  r.set_info("program", up + "/program");
  r.set_env("LD_PRELOAD", victim.string() + "/evil.so");
  r.write(dir);
}

}  // namespace

TEST_CASE("names and commands from a recording create no file and run nothing in ls, show and diff") {
  TempDir tmp;
  const fs::path victim = tmp.path() / "victim";
  fs::create_directories(victim);
  const fs::path work = tmp.path() / "work";
  fs::create_directories(work);
  write_hostile((work / "a").string(), victim, 100);
  write_hostile((work / "b").string(), victim, 200);
  const auto victim_before = tree(victim);
  const auto work_before = tree(work);

  const std::vector<std::vector<std::string>> commands = {
      {kOpguard, "ls", "a"},
      {kOpguard, "ls", "a", "--json"},
      {kOpguard, "show", "a", "--event", "0"},
      {kOpguard, "show", "a", "--event", "1", "--json"},
      {kOpguard, "diff", "a", "b", "--trace", "trace.json"},
      {kOpguard, "diff", "a", "b", "--json", "--events"},
  };
  for (const auto& cmd : commands) {
    // cd into `work` so that relative names would land there.
    std::vector<std::string> in_work = {"/bin/sh", "-c", "cd \"$0\" && exec \"$@\"", work.string()};
    in_work.insert(in_work.end(), cmd.begin(), cmd.end());
    Result r = run(in_work, tmp.path().string());
    INFO(cmd[1] << ": exit " << r.exit_code << "\n" << r.out.substr(0, 3000) << r.err);
    REQUIRE((r.exit_code == 0 || r.exit_code == 3));
    if (cmd[1] == "diff") {
      // Neither the hostile record command nor the preload is offered in a
      // re-record command (ls and show may print them: they are data there).
      REQUIRE(r.out.find("touch " + victim.string() + "/cmd") == std::string::npos);
      REQUIRE(r.out.find("evil.so") == std::string::npos);
    }
  }
  REQUIRE(tree(victim) == victim_before);
  auto work_after = tree(work);
  REQUIRE(std::find(work_after.begin(), work_after.end(), "trace.json") != work_after.end());
  work_after.erase(std::find(work_after.begin(), work_after.end(), "trace.json"));
  REQUIRE(work_after == work_before);
}
