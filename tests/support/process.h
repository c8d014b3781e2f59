#pragma once
// Test support: temporary directories and child processes. Header-only, no
// torch, so end-to-end tests compile in seconds.

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace opguard::testing {

// A fresh directory from mkdtemp, removed at the end unless keep() was called
// (then its path is printed as evidence).
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "opguard_test_XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) std::abort();
    path_ = pattern;
  }
  ~TempDir() {
    if (keep_) {
      std::fprintf(stderr, "evidence kept in %s\n", path_.c_str());
    } else {
      std::error_code ignored;
      std::filesystem::remove_all(path_, ignored);
    }
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }
  void keep() { keep_ = true; }

 private:
  std::filesystem::path path_;
  bool keep_ = false;
};

// The argv of `OPGUARD record --out OUT FLAGS... -- PROGRAM...`.
inline std::vector<std::string> record_argv(const std::string& opguard, const std::string& out,
                                            const std::vector<std::string>& flags,
                                            const std::vector<std::string>& program) {
  std::vector<std::string> cmd = {opguard, "record", "--out", out};
  cmd.insert(cmd.end(), flags.begin(), flags.end());
  cmd.push_back("--");
  cmd.insert(cmd.end(), program.begin(), program.end());
  return cmd;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

struct Result {
  int exit_code = -1;  // 128+N when killed by signal N
  std::string out;
  std::string err;
};

// Runs argv (no shell) with extra environment entries (NAME=VALUE sets, a
// bare NAME removes); captures stdout and stderr through files in `scratch`.
inline Result run(const std::vector<std::string>& argv, const std::string& scratch,
                  const std::vector<std::string>& extra_env = {}) {
  static int counter = 0;
  const std::string out_path = scratch + "/stdout." + std::to_string(counter);
  const std::string err_path = scratch + "/stderr." + std::to_string(counter++);
  pid_t pid = fork();
  if (pid == 0) {
    int out = open(out_path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
    int err = open(err_path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
    dup2(out, 1);
    dup2(err, 2);
    for (const auto& kv : extra_env) {
      if (kv.find('=') == std::string::npos) unsetenv(kv.c_str());
      else putenv(const_cast<char*>(kv.c_str()));
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  Result r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_file(out_path);
  r.err = read_file(err_path);
  return r;
}

// Builds a repro bundle's repro.cpp with CMake against the libtorch of
// `python`'s torch, in `build_dir`, and runs it on the bundle with `args`.
// Returns the run, or the result of the first step that failed (its out
// starts with the step's name).
inline Result build_and_run_repro(const std::string& python, const std::string& cmake, const std::string& bundle,
                                  const std::string& build_dir, const std::string& cwd,
                                  const std::vector<std::string>& args = {"--strict"}) {
  auto failed = [](const char* step, Result r) {
    r.out = std::string(step) + " failed\n" + r.out;
    return r;
  };
  Result prefix = run({python, "-c", "import torch;print(torch.utils.cmake_prefix_path)"}, cwd);
  if (prefix.exit_code != 0) return failed("torch.utils.cmake_prefix_path", prefix);
  Result cfg = run({cmake, "-S", bundle, "-B", build_dir,
                    "-DCMAKE_PREFIX_PATH=" + prefix.out.substr(0, prefix.out.find('\n'))},
                   cwd);
  if (cfg.exit_code != 0) return failed("cmake configure", cfg);
  Result make = run({cmake, "--build", build_dir, "-j", "2"}, cwd);
  if (make.exit_code != 0) return failed("cmake build", make);
  std::vector<std::string> cmd = {build_dir + "/repro", bundle};
  cmd.insert(cmd.end(), args.begin(), args.end());
  return run(cmd, cwd);
}

}  // namespace opguard::testing
