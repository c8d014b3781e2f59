// The re-record command (rerecord.h) is built from a manifest, which is input
// like any other file: its strings reach a shell only quoted, the record
// command only in the form `opguard record` writes it, the environment only
// for numerics variables. Checked by running the commands through /bin/sh.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "../support/process.h"
#include "opguard/formats/recording.h"
#include "opguard/formats/rerecord.h"

using opguard::testing::TempDir;
namespace fmts = opguard::formats;
namespace fs = std::filesystem;

namespace {

std::string quoted_words(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : " ") + fmts::shell_quote(w);
  return out;
}

// Every path under `dir`, relative, sorted: what a command left behind.
std::vector<std::string> tree(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) out.push_back(fs::relative(e.path(), dir).string());
  std::sort(out.begin(), out.end());
  return out;
}

const std::vector<std::string> kHostileWords = {
    "",           "a b",          "it's",        "$(touch pwned)", "`touch pwned`", "a;touch pwned",
    "x\ntouch pwned", "'",        "\\",          "a'b'c",          "$HOME",         "*",
    "--out=../../elsewhere", "|", "&&",          ">pwned",         "\"q\"",         "\t",
};

}  // namespace

TEST_CASE("words quoted by shell_quote and joined by spaces are recognised, with any content") {
  REQUIRE(fmts::is_shell_quoted_words(quoted_words({"python3", "train.py", "--steps", "2"})));
  REQUIRE(fmts::is_shell_quoted_words(quoted_words(kHostileWords)));
  for (const auto& w : kHostileWords) REQUIRE(fmts::is_shell_quoted_words(fmts::shell_quote(w)));
}

TEST_CASE("record commands with unquoted shell syntax are not recognised") {
  for (const char* text : {"python3 train.py; touch pwned", "a && b", "a || b", "a | b", "$(touch pwned)",
                           "`touch pwned`", "a > pwned", "a < b", "a\nb", "a  b", " a", "a ", "", "'open",
                           "'a'b", "a'b'", "a\tb", "a&", "(a)", "a #b", "~/x", "a=$(b)", "'a'\\''"}) {
    INFO("[" << text << "]");
    REQUIRE_FALSE(fmts::is_shell_quoted_words(text));
  }
}

TEST_CASE("only numerics environment variables pass into a re-record command") {
  for (const char* name : {"OMP_NUM_THREADS", "MKL_CBWR", "ATEN_CPU_CAPABILITY", "RANK", "WORLD_SIZE",
                           "MASTER_ADDR", "NCCL_ALGO", "CUBLAS_WORKSPACE_CONFIG"})
    REQUIRE(fmts::is_numerics_env(name));
  for (const char* name : {"LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONSTARTUP", "BASH_ENV", "ENV",
                           "PATH", "IFS", "PS4", "SHELLOPTS", "HOME", "", "OMP_X;touch pwned", "OMP_X=1",
                           "OMP X", "omp_num_threads"})
    REQUIRE_FALSE(fmts::is_numerics_env(name));
}

TEST_CASE("a manifest's hostile strings reach the shell as plain words and run nothing") {
  TempDir tmp;
  // A real directory with shell syntax in its name, as the recorded cwd.
  const fs::path cwd = tmp.path() / "run $(touch pwned) 'q' `touch pwned`";
  fs::create_directories(cwd);
  fmts::Manifest m;
  m.info["cwd"] = cwd.string();
  m.info["record_command"] = quoted_words({"prog", "a b; touch pwned", "$(touch pwned)", "it's"});
  m.env["OMP_NUM_THREADS"] = "1; touch pwned";
  m.env["LD_PRELOAD"] = "/tmp/evil.so";
  m.env["BASH_ENV"] = "/tmp/evil.sh";
  const std::string rec_dir = (tmp.path() / "rec").string();
  // The opguard executable replaced by printf: the shell's words, one per line.
  const std::string cmd = fmts::rerecord_command(m, rec_dir, "12", 4, "printf '[%s]\\n'", {});
  REQUIRE(cmd.find("LD_PRELOAD") == std::string::npos);
  REQUIRE(cmd.find("BASH_ENV") == std::string::npos);
  const auto before = tree(tmp.path());
  opguard::testing::Result r = opguard::testing::run({"/bin/sh", "-c", cmd}, tmp.path().string());
  INFO(cmd << "\n" << r.out << r.err);
  REQUIRE(r.exit_code == 0);
  REQUIRE(r.out == "[record]\n[--out]\n[" + rec_dir + "-around-12]\n[--stop-after-windows]\n[--dump-around]\n[12:4]\n[--]\n[prog]\n"
                   "[a b; touch pwned]\n[$(touch pwned)]\n[it's]\n");
  // Nothing but run's own stdout and stderr files appeared (the command wrote none).
  auto after = tree(tmp.path());
  after.erase(std::remove_if(after.begin(), after.end(),
                             [](const std::string& p) { return p.rfind("stdout.", 0) == 0 || p.rfind("stderr.", 0) == 0; }),
              after.end());
  REQUIRE(after == before);
}

TEST_CASE("a re-record runs in the recorded numerics environment: variables the caller has and the run had not are removed") {
  TempDir tmp;
  fmts::Manifest m;
  m.info["record_command"] = quoted_words({"prog"});
  m.env["ATEN_CPU_CAPABILITY"] = "default";
  const std::string cmd = fmts::rerecord_command(m, "rec", "3", 16, "printenv ATEN_CPU_CAPABILITY MKL_CBWR PATH; :",
                                                 {"MKL_CBWR", "ATEN_CPU_CAPABILITY", "PATH", "OMP_X;touch pwned"});
  INFO(cmd);
  REQUIRE(cmd.rfind("env -u MKL_CBWR ATEN_CPU_CAPABILITY=default printenv", 0) == 0);
  // The caller's MKL_CBWR does not reach the program; its PATH does.
  opguard::testing::Result r =
      opguard::testing::run({"/bin/sh", "-c", cmd}, tmp.path().string(), {"MKL_CBWR=COMPATIBLE", "ATEN_CPU_CAPABILITY=avx2"});
  REQUIRE(r.exit_code == 0);
  REQUIRE(r.out.rfind("default\n/", 0) == 0);
  REQUIRE(r.out.find("COMPATIBLE") == std::string::npos);
  // numerics_env_here lists this process's numerics variables and no others.
  setenv("OMP_OPGUARD_TEST", "1", 1);
  const auto here = fmts::numerics_env_here();
  unsetenv("OMP_OPGUARD_TEST");
  CHECK(std::find(here.begin(), here.end(), "OMP_OPGUARD_TEST") != here.end());
  CHECK(std::find(here.begin(), here.end(), "PATH") == here.end());
}

TEST_CASE("a manifest whose record command is not in opguard's quoted form gets no re-record command") {
  fmts::Manifest m;
  m.info["record_command"] = "python3 train.py; touch pwned";
  REQUIRE(fmts::rerecord_command(m, "rec", "3", 16, "opguard", {}).empty());
  m.info["record_command"] = quoted_words({"python3", "train.py"});
  REQUIRE(fmts::rerecord_command(m, "rec", "3", 16, "opguard", {}) ==
          "opguard record --out rec-around-3 --stop-after-windows --dump-around 3:16 -- python3 train.py");
}
