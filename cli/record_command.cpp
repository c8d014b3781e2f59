// opguard record: run a training program with the recorder preloaded.

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <string>
#include <vector>

#include "exit_codes.h"
#include "opguard/core/error.h"
#include "opguard/formats/recording.h"
#include "opguard/record/config.h"
#include "opguard/replay/replay.h"
#include "verbs.h"

extern char** environ;

namespace opguard::cli {
namespace {

namespace fs = std::filesystem;

static_assert(kExitStrictAbort == record::kStrictExitCode, "the documented --strict exit code");

constexpr const char* kHelp = R"(Run PROGRAM with the opguard recorder preloaded and write a recording to DIR.

Every top-level operator (forward, backward, optimizer, on every thread) becomes
an event with fingerprints of its tensors; full tensors only where the dump
options ask. The program needs no change: C++ libtorch and Python PyTorch
programs are recorded alike (Python programs also get module scopes).

Examples:
  opguard record --out runA -- ./build/bin/tiny_gpt --steps 5
  opguard record --out runB --dump-steps 3 -- python3 examples/tiny_gpt.py --steps 5
  opguard record --out runB2 --dump-around 1234:32 -- ./build/bin/tiny_gpt --steps 5
  opguard record --out runT --declare tp=2 -- ./build/bin/tiny_gpt --tp 2

--declare names knobs the program applies itself and the recorder cannot see
(a tensor-parallel split it emulates: tp=P, reduce=ORDER; see opguard configs).
They go into the manifest (declared_knobs); bisect run compares them between
two runs like the knobs it records, so it can name them.

Faults: a killed run leaves every completed step readable (the step it died in
is listed as torn by opguard ls). If a write fails (disk full, I/O error) the
recorder says so once on stderr, marks the recording incomplete in its
manifest (recording_failed 1) and stops recording; the training goes on with
the same bits. With --strict it aborts the run with exit code 74 instead.
When the writer falls behind by --queue-bytes: --queue-full wait blocks the
training until it catches up; drop keeps fingerprints but drops full tensors
(counted as dropped_tensors in the manifest). Events are never dropped.

Exit code: the program's own (128+N if signal N killed it); 2 for bad options,
74 if DIR cannot be written or, under --strict, the recording failed during
the run; 127 if PROGRAM cannot be started.)";

struct RecordOptions {
  std::string out;
  bool dump_all = false;
  std::vector<std::string> dump_steps;
  int64_t dump_every = 0;
  std::string dump_ops;
  std::string dump_scopes;
  std::vector<std::string> dump_around;
  std::string dump_budget;
  std::string queue_bytes;
  std::string queue_full = "wait";
  bool strict = false;
  bool stop_after_windows = false;
  int hash_threads = 1;
  bool hash_on_training_thread = false;
  std::vector<std::string> declare;
  std::vector<std::string> command;
};

std::string policy_text(const RecordOptions& o) {
  std::vector<std::string> items;
  if (o.dump_all) items.push_back("all");
  if (!o.dump_steps.empty()) {
    std::string s = "steps=";
    for (std::size_t i = 0; i < o.dump_steps.size(); ++i) s += (i ? "," : "") + o.dump_steps[i];
    items.push_back(s);
  }
  if (o.dump_every > 0) items.push_back("every=" + std::to_string(o.dump_every));
  if (!o.dump_ops.empty()) items.push_back("ops=" + o.dump_ops);
  if (!o.dump_scopes.empty()) items.push_back("scopes=" + o.dump_scopes);
  if (!o.dump_around.empty()) {
    std::string s = "around=";
    for (std::size_t i = 0; i < o.dump_around.size(); ++i) s += (i ? "," : "") + o.dump_around[i];
    items.push_back(s);
  }
  if (!o.dump_budget.empty()) items.push_back("budget=" + o.dump_budget);
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? ";" : "") + items[i];
  return out;
}

std::string find_program(const std::string& name) {
  if (name.find('/') != std::string::npos) {
    if (::access(name.c_str(), X_OK) == 0 && !fs::is_directory(name)) return name;
    throw LaunchError(fmt::format("program '{}' was not found or is not executable: check the command after --", name));
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= dirs.size()) {
    auto end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string dir = dirs.substr(start, end - start);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0 && !fs::is_directory(candidate)) return candidate;
    start = end + 1;
  }
  throw LaunchError(fmt::format("program '{}' was not found on PATH: check the command after --", name));
}

// The recorder library and the Python hooks, beside this executable in the
// build tree (bin/ lib/ python/) and in an install (bin/ lib/ share/opguard/python).
std::string find_recorder_library() {
  const std::string dir = executable_dir();
  for (const char* rel : {"/../lib/libopguard_record.so", "/../lib64/libopguard_record.so"}) {
    std::string p = dir + rel;
    if (fs::exists(p)) return fs::canonical(p).string();
  }
  throw LaunchError("libopguard_record.so was not found beside the opguard executable: reinstall opguard");
}

std::string find_python_dir() {
  const std::string dir = executable_dir();
  for (const char* rel : {"/../python", "/../share/opguard/python"}) {
    std::string p = dir + rel;
    if (fs::exists(p + "/opguard/__init__.py")) return fs::canonical(p).string();
  }
  return "";
}

void prepare_output(const std::string& out) {
  std::error_code ec;
  if (fs::exists(out, ec)) {
    if (!fs::is_directory(out, ec))
      throw IoError(fmt::format("--out {} exists and is not a directory: choose another path", out));
    if (!fs::is_empty(out, ec))
      throw IoError(fmt::format("--out {} is not empty: choose a new directory for the recording", out));
  } else {
    fs::create_directories(out, ec);
    if (ec) throw IoError(fmt::format("cannot create --out {}: {}", out, ec.message()));
  }
  // Probe: the recorder opens its files lazily, so check writability now,
  // before the training starts.
  const std::string probe = out + "/.opguard-probe";
  int fd = ::open(probe.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
  if (fd < 0) throw IoError(fmt::format("cannot write into --out {}: {}", out, std::strerror(errno)));
  ::close(fd);
  ::unlink(probe.c_str());
}

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,+@%") == std::string::npos)
    return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

pid_t g_child = 0;
void forward_signal(int sig) {
  if (g_child > 0) ::kill(g_child, sig);
}

int run_record(const RecordOptions& o) {
  if (o.command.empty()) throw UsageError("record needs the program to run after --, e.g. opguard record --out runA -- ./train");
  if (o.hash_threads < 1 || o.hash_threads > 256) throw UsageError("--hash-threads must be between 1 and 256");
  if (o.stop_after_windows && o.dump_around.empty())
    throw UsageError("--stop-after-windows needs --dump-around: it ends the program after the windows");
  // Validate everything the recorder will parse, so that bad flags fail here.
  const std::string policy = policy_text(o);
  record::parse_policy(policy);
  std::string queue = "policy=" + o.queue_full;
  if (!o.queue_bytes.empty()) queue += ";bytes=" + o.queue_bytes;
  record::parse_queue(queue);
  std::string declared_text;
  for (const auto& d : o.declare) declared_text += (declared_text.empty() ? "" : ",") + d;
  const std::string declared = replay::Config::parse(declared_text).to_string();
  const std::string program = find_program(o.command[0]);
  const std::string library = find_recorder_library();
  const std::string python_dir = find_python_dir();
  prepare_output(o.out);
  const std::string out_abs = fs::absolute(o.out).lexically_normal().string();

  std::string command_line;
  for (const auto& a : o.command) command_line += (command_line.empty() ? "" : " ") + shell_quote(a);

  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string kv(*e);
    // OPGUARD_TEST_* are test-only recorder knobs (record/config.h) and pass through.
    const bool ours = kv.rfind("OPGUARD_", 0) == 0 && kv.rfind("OPGUARD_TEST_", 0) != 0;
    if (ours || kv.rfind("LD_PRELOAD=", 0) == 0 || kv.rfind("PYTHONPATH=", 0) == 0) continue;
    env.push_back(kv);
  }
  const char* old_preload = std::getenv("LD_PRELOAD");
  env.push_back("LD_PRELOAD=" + library + (old_preload && *old_preload ? std::string(":") + old_preload : ""));
  const char* old_pythonpath = std::getenv("PYTHONPATH");
  if (!python_dir.empty()) {
    std::string pp = python_dir + "/boot:" + python_dir;
    if (old_pythonpath && *old_pythonpath) pp += std::string(":") + old_pythonpath;
    env.push_back("PYTHONPATH=" + pp);
  } else if (old_pythonpath) {
    env.push_back(std::string("PYTHONPATH=") + old_pythonpath);
  }
  env.push_back(std::string(record::kEnvOut) + "=" + out_abs);
  env.push_back(std::string(record::kEnvPolicy) + "=" + policy);
  env.push_back(std::string(record::kEnvQueue) + "=" + queue);
  env.push_back(std::string("OPGUARD_LIB=") + library);
  if (o.strict) env.push_back(std::string(record::kEnvStrict) + "=1");
  if (o.stop_after_windows) env.push_back(std::string(record::kEnvStopAfterWindows) + "=1");
  env.push_back(std::string(record::kEnvHashThreads) + "=" + std::to_string(o.hash_threads));
  env.push_back(std::string(record::kEnvDeferHashing) + "=" + (o.hash_on_training_thread ? "0" : "1"));
  env.push_back(std::string(record::kEnvCommand) + "=" + command_line);
  if (!declared.empty()) env.push_back(std::string(record::kEnvDeclared) + "=" + declared);

  std::vector<char*> argv;
  for (const auto& a : o.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (auto& kv : env) envp.push_back(kv.data());
  envp.push_back(nullptr);

  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = ::fork();
  if (pid < 0) throw LaunchError(fmt::format("cannot start {}: fork failed: {}", program, std::strerror(errno)));
  if (pid == 0) {
    ::execve(program.c_str(), argv.data(), envp.data());
    std::fprintf(stderr, "opguard: cannot start %s: %s\n", program.c_str(), std::strerror(errno));
    std::_Exit(kExitLaunch);
  }
  g_child = pid;
  struct sigaction sa {};
  sa.sa_handler = forward_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);

  // A one-line summary on stderr, so that the program's stdout stays its own.
  try {
    auto layout = formats::scan_recording(o.out);
    for (const auto& r : layout.ranks) {
      std::string torn = r.torn.empty() ? "" : fmt::format(", {} torn", r.torn.size());
      std::string incomplete;
      try {
        const auto info = formats::read_manifest(r.manifest_path).info;
        auto failed = info.find("recording_failed");
        if (failed != info.end() && failed->second == "1") incomplete = " (incomplete: recording stopped early)";
      } catch (const FormatError&) {
        incomplete = " (its manifest cannot be read)";
      }
      std::fprintf(stderr, "opguard: recorded rank %d: %zu complete step file(s)%s in %s%s\n", r.rank,
                   r.steps.size(), torn.c_str(), r.dir.c_str(), incomplete.c_str());
    }
  } catch (const FormatError&) {
    std::fprintf(stderr, "opguard: %s holds no recording: the program ran no torch operator under the recorder\n",
                 o.out.c_str());
  }
  if (!WIFEXITED(status))
    std::fprintf(stderr, "opguard: %s was killed by signal %d\n", program.c_str(), WTERMSIG(status));
  return code;
}

}  // namespace

void add_record_command(CLI::App& app, VerbResult& result) {
  auto opts = std::make_shared<RecordOptions>();
  CLI::App* sub = app.add_subcommand("record", "Run a training program under the recorder");
  sub->footer(kHelp);
  sub->add_option("--out,-o", opts->out, "Recording directory (new or empty)")->required();
  sub->add_flag("--dump-all", opts->dump_all, "Full tensors for every event");
  sub->add_option("--dump-steps", opts->dump_steps, "Full tensors in these steps: 3 or 2:5 (repeatable)");
  sub->add_option("--dump-every", opts->dump_every, "Full tensors every N steps")->check(at_least_one());
  sub->add_option("--dump-ops", opts->dump_ops, "Full tensors for ops matching this regex (aten::softmax.int)");
  sub->add_option("--dump-scopes", opts->dump_scopes, "Full tensors for scopes matching this regex");
  sub->add_option("--dump-around", opts->dump_around, "Full tensors for events ID-R..ID+R: ID[:R], R=32 by default (repeatable)");
  sub->add_option("--dump-budget", opts->dump_budget, "Stop full dumps after this many bytes: 512M, 2G");
  sub->add_option("--queue-bytes", opts->queue_bytes, "Bound on bytes the writer queue holds (default 1G)");
  sub->add_option("--queue-full", opts->queue_full, "When the queue is full: wait (default) or drop")
      ->check(CLI::IsMember({"wait", "drop"}));
  sub->add_flag("--strict", opts->strict, "Abort the run (exit 74) if the recording cannot be written");
  sub->add_flag("--stop-after-windows", opts->stop_after_windows,
                "End the program (exit 0) once the step in which the last --dump-around window closed is written");
  sub->add_option("--hash-threads", opts->hash_threads, "Threads that hash tensors of 1 MiB or more alongside the training thread (default 1: the training thread alone)");
  sub->add_flag("--hash-on-training-thread", opts->hash_on_training_thread,
                "Fingerprint every tensor on the training thread before its op returns, not on the recorder's hashing "
                "thread (docs/RECORD.md, \"Deferred fingerprints\")");
  sub->add_option("--declare", opts->declare,
                  "Knobs the program applies itself (tp=2,reduce=ring): kept in the manifest for bisect run (repeatable)");
  sub->add_option("command", opts->command, "-- PROGRAM ARGS...")->required();
  sub->positionals_at_end();
  sub->callback([opts, &result] { result.exit_code = run_record(*opts); });
}

}  // namespace opguard::cli
