// Faults while recording a real training run (tiny_gpt, C++ and Python):
//   - SIGKILL at seeded random points: the recording opens with ls, show and
//     diff, every completed step equals an uninterrupted recording's, the
//     torn step is reported;
//   - a full disk (a tmpfs made for the test, or where mounting is not allowed
//     and always in record_disk_full_preload, enospc_preload.cpp): the recorder stops, says so once, marks the manifest,
//     and the training computes the same bits; --strict aborts with 74;
//   - a writer slower than the training (test knob OPGUARD_TEST_WRITER_DELAY_US)
//     behind a tiny queue: the bound holds over thousands of steps under both
//     policies, drop counts what it dropped.
// Each case prints what it tried (the figures in the README come from here):
//   ./build/bin/opguard_crash_safety_test -s

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>
#include <tuple>

#include "../support/process.h"
#include "../support/recording_keys.h"
#include "opguard/formats/recording.h"

using opguard::testing::read_file;
using opguard::testing::Result;
using opguard::testing::record_argv;
using opguard::testing::run;
using opguard::testing::step_keys;
using opguard::testing::TempDir;
namespace fmts = opguard::formats;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kOpguard = OPGUARD_BIN;
const std::string kTinyGpt = OPGUARD_TINY_GPT_BIN;
const std::string kPython = OPGUARD_PYTHON_BIN;
const std::string kTinyGptPy = OPGUARD_TINY_GPT_PY;

// The smallest useful model: a step takes a few milliseconds.
const std::vector<std::string> kTiny = {"--width", "32", "--depth", "1", "--heads", "2",
                                        "--seq",   "16", "--batch", "2", "--threads", "1"};

std::vector<std::string> tiny_cpp(int steps, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> cmd = {kTinyGpt, "--steps", std::to_string(steps)};
  cmd.insert(cmd.end(), kTiny.begin(), kTiny.end());
  cmd.insert(cmd.end(), extra.begin(), extra.end());
  return cmd;
}

std::vector<std::string> tiny_py(int steps) {
  std::vector<std::string> cmd = {kPython, kTinyGptPy, "--steps", std::to_string(steps)};
  cmd.insert(cmd.end(), kTiny.begin(), kTiny.end());
  return cmd;
}

std::vector<std::string> record_cmd(const std::string& out, const std::vector<std::string>& flags,
                                    const std::vector<std::string>& program) {
  return record_argv(kOpguard, out, flags, program);
}

// A child process started without waiting for it; stdout and stderr go to
// files in `scratch`; `env` entries are added to the child's environment.
struct Child {
  pid_t pid = -1;
  std::string out_path, err_path;
};

Child spawn(const std::vector<std::string>& argv, const std::string& scratch, const std::string& tag,
            const std::vector<std::string>& env = {}) {
  Child c;
  c.out_path = scratch + "/" + tag + ".stdout";
  c.err_path = scratch + "/" + tag + ".stderr";
  c.pid = fork();
  if (c.pid == 0) {
    int out = open(c.out_path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
    int err = open(c.err_path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
    dup2(out, 1);
    dup2(err, 2);
    for (const auto& kv : env) putenv(const_cast<char*>(kv.c_str()));
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  return c;
}

Result wait_child(const Child& c) {
  int status = 0;
  while (waitpid(c.pid, &status, 0) < 0 && errno == EINTR) {
  }
  Result r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_file(c.out_path);
  r.err = read_file(c.err_path);
  return r;
}

Result run_with(const std::vector<std::string>& argv, const std::string& scratch, const std::string& tag,
                const std::vector<std::string>& env = {}) {
  return wait_child(spawn(argv, scratch, tag, env));
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto p = text.find(what); p != std::string::npos; p = text.find(what, p + what.size())) ++n;
  return n;
}

// Waits until the recorder has opened DIR's rank 0 (its manifest exists) or
// the child has exited; returns false in the second case.
bool wait_for_manifest(const std::string& dir, pid_t child) {
  const auto give_up = Clock::now() + std::chrono::seconds(120);
  while (Clock::now() < give_up) {
    if (fs::exists(dir + "/rank0/manifest.h5") && fs::exists(dir + "/rank0/owner.pid")) return true;
    int status = 0;
    if (waitpid(child, &status, WNOHANG) == child) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  return false;
}

nlohmann::json ls_json(const std::string& dir, const std::string& scratch) {
  Result ls = run({kOpguard, "ls", dir, "--json"}, scratch);
  INFO(ls.err);
  REQUIRE(ls.exit_code == 0);
  return nlohmann::json::parse(ls.out)["ranks"][0];
}

std::map<std::string, std::string> info_of(const std::string& dir) {
  return fmts::read_manifest(dir + "/rank0/manifest.h5").info;
}

// Complete steps of rank 0 must be 0, 1, ..., n-1 (no holes); returns them.
std::vector<std::pair<int64_t, std::string>> contiguous_steps(const std::string& dir) {
  auto layout = fmts::scan_recording(dir);
  REQUIRE(layout.ranks.size() == 1);
  const auto& steps = layout.ranks[0].steps;
  for (std::size_t i = 0; i < steps.size(); ++i) REQUIRE(steps[i].first == static_cast<int64_t>(i));
  return steps;
}

// Every complete step of `dir` holds exactly the events of the same step of
// `reference` (same ids, ops, scopes, shapes, fingerprints, flags).
void require_steps_equal(const std::string& reference, const std::string& dir) {
  auto ref = fmts::scan_recording(reference).ranks.at(0).steps;
  for (const auto& [step, path] : contiguous_steps(dir)) {
    REQUIRE(static_cast<std::size_t>(step) < ref.size());
    const auto a = step_keys(ref[step].second), b = step_keys(path);
    REQUIRE(!b.empty());
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (a[i] != b[i]) {
        INFO("step " << step << " event " << i << "\n  " << a[i] << "\n  " << b[i]);
        REQUIRE(a[i] == b[i]);
      }
    }
  }
}

// The recording `killed` (killed during the run that made `reference`)
// through ls, show and diff. Returns a one-line description.
std::string check_killed_recording(const std::string& reference, const std::string& killed, const TempDir& tmp) {
  const std::string scratch = tmp.path().string();
  auto rank = ls_json(killed, scratch);
  REQUIRE(rank["info"]["clean_exit"] == "0");
  REQUIRE(rank["complete"] == false);
  require_steps_equal(reference, killed);
  const auto layout = fmts::scan_recording(killed).ranks.at(0);
  const auto complete = static_cast<int64_t>(layout.steps.size());
  // At most one torn step: the one after the last complete step.
  REQUIRE(layout.torn.size() <= 1);
  if (!layout.torn.empty()) REQUIRE(layout.torn[0].first == complete);
  REQUIRE(rank["torn_steps"].size() == layout.torn.size());
  Result text = run({kOpguard, "ls", killed}, scratch);
  REQUIRE(text.exit_code == 0);
  REQUIRE(text.out.find("incomplete") != std::string::npos);
  if (!layout.torn.empty()) REQUIRE(text.out.find("torn") != std::string::npos);

  // show: an event of a complete step is shown; one of the lost step says why.
  const auto ref_steps = fmts::scan_recording(reference).ranks.at(0).steps;
  if (complete > 0) {
    const auto first = fmts::StepReader(layout.steps[0].second).events().front().id;
    Result shown = run({kOpguard, "show", killed, "--event", fmts::event_id_string(first)}, scratch);
    INFO(shown.err);
    REQUIRE(shown.exit_code == 0);
  }
  if (complete < static_cast<int64_t>(ref_steps.size())) {
    const auto lost = fmts::StepReader(ref_steps[complete].second).events().front().id;
    Result missing = run({kOpguard, "show", killed, "--event", fmts::event_id_string(lost)}, scratch);
    REQUIRE(missing.exit_code == 2);
    REQUIRE(missing.err.find(layout.torn.empty() ? "incomplete" : "torn") != std::string::npos);
  }

  // diff: the completed steps are the same; the whole runs are not.
  if (complete > 0) {
    Result same = run({kOpguard, "diff", reference, killed, "--steps", "0:" + std::to_string(complete - 1)}, scratch);
    INFO(same.out << same.err);
    REQUIRE(same.exit_code == 0);
  }
  Result whole = run({kOpguard, "diff", reference, killed, "--json"}, scratch);
  INFO(whole.err);
  // Killed after its last step (at exit): nothing is missing.
  REQUIRE(whole.exit_code == (complete < static_cast<int64_t>(ref_steps.size()) ? 3 : 0));
  auto j = nlohmann::json::parse(whole.out);
  REQUIRE(j["torn_steps"].size() == layout.torn.size());

  return std::to_string(complete) + " complete step(s), " +
         (layout.torn.empty() ? std::string("no torn step (killed between steps)")
                              : "torn step " + std::to_string(layout.torn[0].first));
}

// Records `program` with `flags`; when `kill_after_ms` >= 0, SIGKILLs the
// training process that long after its recording opened. Returns the
// milliseconds from the recording's opening to the process's end.
double record_and_maybe_kill(const std::string& out, const std::vector<std::string>& flags,
                             const std::vector<std::string>& program, const TempDir& tmp, const std::string& tag,
                             double kill_after_ms, Result* result) {
  Child c = spawn(record_cmd(out, flags, program), tmp.path().string(), tag);
  REQUIRE(wait_for_manifest(out, c.pid));
  const auto opened = Clock::now();
  if (kill_after_ms >= 0) {
    const int pid = std::stoi(read_file(out + "/rank0/owner.pid"));
    std::this_thread::sleep_until(opened + std::chrono::microseconds(static_cast<int64_t>(kill_after_ms * 1000)));
    kill(pid, SIGKILL);  // may have exited already: then the run is simply complete
  }
  *result = wait_child(c);
  return std::chrono::duration<double, std::milli>(Clock::now() - opened).count();
}

uint64_t seed_from_env() {
  const char* s = std::getenv("OPGUARD_KILL_SEED");
  return s && *s ? std::strtoull(s, nullptr, 10) : 20261203;
}

void kill_at_random_points(const std::vector<std::string>& program, const std::vector<std::string>& flags,
                           int kills, const std::string& name) {
  TempDir tmp;
  const std::string reference = tmp / "reference";
  Result r;
  const double run_ms = record_and_maybe_kill(reference, flags, program, tmp, "reference", -1, &r);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const std::size_t ref_steps = contiguous_steps(reference).size();
  const uint64_t seed = seed_from_env();
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> when(0.0, run_ms);
  MESSAGE(name << ": uninterrupted run " << ref_steps << " steps in " << run_ms << " ms after the recording opened; "
               << kills << " kill points from seed " << seed << " (OPGUARD_KILL_SEED)");
  int torn = 0, between = 0, finished = 0;
  for (int k = 0; k < kills; ++k) {
    const double at = when(rng);
    const std::string out = tmp / ("killed" + std::to_string(k));
    Result killed;
    record_and_maybe_kill(out, flags, program, tmp, "killed" + std::to_string(k), at, &killed);
    if (killed.exit_code == 0 || info_of(out)["clean_exit"] == "1") {
      ++finished;  // the run ended (or wrote its final manifest) before the kill landed: a complete recording
      require_steps_equal(reference, out);
      MESSAGE(name << " kill " << k + 1 << "/" << kills << " at " << at << " ms: the run had already finished");
      continue;
    }
    REQUIRE(killed.exit_code == 128 + SIGKILL);
    const std::string what = check_killed_recording(reference, out, tmp);
    const bool has_torn = what.find("torn step ") != std::string::npos;
    (has_torn ? torn : between) += 1;
    MESSAGE(name << " kill " << k + 1 << "/" << kills << " at " << at << " ms: " << what
                 << "; ls, show and diff read it, completed steps identical to the uninterrupted recording");
  }
  MESSAGE(name << ": " << kills << " kills: " << torn << " in a step (torn), " << between << " between steps, "
               << finished << " after the end");
  REQUIRE(torn + between > 0);
}

}  // namespace

TEST_CASE("a SIGKILL at random points of a recorded C++ run leaves every completed step intact") {
  // Full tensors make the writer busy, so that kills land inside HDF5 writes too.
  kill_at_random_points(tiny_cpp(40), {"--dump-all"}, 8, "tiny_gpt (C++)");
}

TEST_CASE("a SIGKILL at random points of a recorded Python run leaves every completed step intact") {
  kill_at_random_points(tiny_py(30), {"--dump-all"}, 3, "tiny_gpt.py");
}

// --- disk full ---------------------------------------------------------------

namespace {

// A file system that fills up at 8 MiB: a tmpfs of that size mounted for the
// test, or, where mounting is not allowed (not root, a container) or
// OPGUARD_DISK_FULL=preload, enospc_preload.cpp's budget of that size on the
// recording directory (writes past it fail with ENOSPC, as on the tmpfs).
class FullDisk {
 public:
  explicit FullDisk(const TempDir& tmp) : dir_(tmp / "disk") {
    fs::create_directories(dir_);
    const char* forced = std::getenv("OPGUARD_DISK_FULL");
    if (forced == nullptr || std::string(forced) != "preload") {
      if (::mount("tmpfs", dir_.c_str(), "tmpfs", 0, "size=8m") == 0) {
        mounted_ = true;
        method_ = "tmpfs of 8 MiB mounted at " + dir_ + " (writes fail with ENOSPC)";
        return;
      }
      method_ = std::string("mount failed (") + std::strerror(errno) + "), so ";
    }
    method_ += "LD_PRELOAD " + std::string(OPGUARD_ENOSPC_PRELOAD) + " with a budget of 8 MiB on " + dir_ +
               " (writes fail with ENOSPC)";
  }
  ~FullDisk() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  FullDisk(const FullDisk&) = delete;
  FullDisk& operator=(const FullDisk&) = delete;

  static constexpr uint64_t kBytes = uint64_t{8} << 20;
  const std::string& dir() const { return dir_; }
  const std::string& method() const { return method_; }
  // The environment a recorded run on this disk needs.
  std::vector<std::string> env() const {
    if (mounted_) return {};
    return {std::string("LD_PRELOAD=") + OPGUARD_ENOSPC_PRELOAD, "OPGUARD_TEST_ENOSPC_DIR=" + dir_,
            "OPGUARD_TEST_ENOSPC_BYTES=" + std::to_string(kBytes)};
  }

 private:
  std::string dir_;
  std::string method_;
  bool mounted_ = false;
};

}  // namespace

TEST_CASE("a full disk stops the recording once, marks it incomplete, and the training keeps its bits") {
  TempDir tmp;
  const std::string scratch = tmp.path().string();
  FullDisk disk(tmp);
  MESSAGE("disk full: " << disk.method());
  const int steps = 40;
  // Steps 0-2 small (fingerprints), then full tensors: a few steps fit.
  const std::vector<std::string> kDumpFrom3 = {"--dump-steps", "3:1000"};
  Result plain = run_with(tiny_cpp(steps, {"--out-params", tmp / "plain.bin"}), scratch, "plain");
  REQUIRE(plain.exit_code == 0);
  // The same recording on a disk with room, to compare the steps that made it.
  const std::string reference = tmp / "reference";
  Result ref = run_with(record_cmd(reference, kDumpFrom3, tiny_cpp(steps)), scratch, "reference");
  REQUIRE(ref.exit_code == 0);
  uint64_t largest_step = 0, total = 0;
  for (const auto& [s, path] : contiguous_steps(reference)) {
    largest_step = std::max<uint64_t>(largest_step, fs::file_size(path));
    total += fs::file_size(path);
  }
  REQUIRE(total > FullDisk::kBytes);  // the run does not fit
  REQUIRE(largest_step < FullDisk::kBytes);  // but a step does

  SUBCASE("without --strict the run finishes with the same loss and parameters") {
    const std::string out = disk.dir() + "/rec";
    Result rec = run_with(record_cmd(out, kDumpFrom3, tiny_cpp(steps, {"--out-params", tmp / "rec.bin"})),
                          scratch, "full", disk.env());
    INFO(rec.err);
    REQUIRE(rec.exit_code == 0);
    REQUIRE(rec.out == plain.out);  // every step's loss bits
    REQUIRE(read_file(tmp / "rec.bin") == read_file(tmp / "plain.bin"));
    REQUIRE(read_file(tmp / "rec.bin").size() > 1000);
    REQUIRE(count(rec.err, "opguard: recording stopped") == 1);
    REQUIRE(rec.err.find("No space left on device") != std::string::npos);
    REQUIRE(count(rec.err, "opguard:") == 2);  // that line and record's summary line
    REQUIRE(rec.err.find("incomplete: recording stopped early") != std::string::npos);
    auto info = info_of(out);
    REQUIRE(info["recording_failed"] == "1");
    REQUIRE(info["clean_exit"] == "0");
    REQUIRE(info["failure"].find("No space left on device") != std::string::npos);
    REQUIRE(!fs::exists(out + "/rank0/space.reserve"));
    const auto complete = contiguous_steps(out);
    REQUIRE(complete.size() < static_cast<std::size_t>(steps));
    REQUIRE(info["failed_step"] == std::to_string(complete.size()));
    REQUIRE(fmts::scan_recording(out).ranks.at(0).torn.empty());  // the partial step was removed
    require_steps_equal(reference, out);
    Result ls = run({kOpguard, "ls", out}, scratch);
    REQUIRE(ls.exit_code == 0);
    REQUIRE(ls.out.find("incomplete: recording stopped at step " + info["failed_step"]) != std::string::npos);
    MESSAGE("disk full without --strict: recording stopped at step " << info["failed_step"] << " of " << steps
                                                                      << " (" << info["failure"]
                                                                      << "); exit 0, loss bits and parameters "
                                                                         "identical to the unrecorded run");
  }
  SUBCASE("with --strict the run aborts with exit code 74") {
    const std::string out = disk.dir() + "/strict";
    Result rec = run_with(record_cmd(out, {"--dump-steps", "3:1000", "--strict"}, tiny_cpp(steps)), scratch, "strict", disk.env());
    INFO(rec.err);
    REQUIRE(rec.exit_code == 74);
    REQUIRE(count(rec.err, "--strict was given: aborting the run (exit 74)") == 1);
    REQUIRE(rec.out.find("final loss") == std::string::npos);  // it did not finish
    auto info = info_of(out);
    REQUIRE(info["recording_failed"] == "1");
    REQUIRE(info["strict"] == "1");
    require_steps_equal(reference, out);
    MESSAGE("disk full with --strict: exit 74 at step " << info["failed_step"] << ", manifest recording_failed 1");
  }
}

// --- writer queue full ---------------------------------------------------------

namespace {

struct QueueRun {
  Result result;
  std::map<std::string, std::string> info;
  uint64_t peak_queued = 0;
  uint64_t peak_rss = 0;
};

constexpr uint64_t kQueueBound = 256 << 10;
const char* kSlowWriter = "OPGUARD_TEST_WRITER_DELAY_US=20";

QueueRun record_queued(const TempDir& tmp, const std::string& name, int steps, const std::string& policy,
                       uint64_t bound) {
  QueueRun q;
  const std::string out = tmp / name;
  q.result = run_with(record_cmd(out, {"--dump-all", "--queue-bytes", std::to_string(bound), "--queue-full", policy},
                                 tiny_cpp(steps, {"--print-every", "0"})),
                      tmp.path().string(), name, {kSlowWriter});
  INFO(q.result.err);
  REQUIRE(q.result.exit_code == 0);
  q.info = info_of(out);
  REQUIRE(q.info["clean_exit"] == "1");
  q.peak_queued = std::stoull(q.info["peak_queued_bytes"]);
  q.peak_rss = std::stoull(q.info["peak_rss_bytes"]);
  return q;
}

// Values flagged dropped, and events, over every step file.
std::pair<uint64_t, uint64_t> dropped_and_events(const std::string& dir) {
  uint64_t dropped = 0, events = 0;
  for (const auto& [s, path] : contiguous_steps(dir)) {
    fmts::StepReader reader(path);
    for (const auto& e : reader.events()) {
      ++events;
      for (const auto* values : {&e.inputs, &e.outputs})
        for (const auto& v : *values) dropped += (v.tensor.flags & fmts::kTensorDropped) ? 1 : 0;
    }
  }
  return {dropped, events};
}

}  // namespace

TEST_CASE("under opguard record a writer slower than the training meets the queue policy: wait keeps all, drop counts") {
  // The bound over thousands of steps and peak memory: tests/record/queue_bound_test.cpp.
  TempDir tmp;
  const int steps = 100;
  Result plain = run_with(tiny_cpp(steps, {"--print-every", "0"}), tmp.path().string(), "plain");
  REQUIRE(plain.exit_code == 0);
  QueueRun wait = record_queued(tmp, "wait", steps, "wait", kQueueBound);
  QueueRun drop = record_queued(tmp, "drop", steps, "drop", kQueueBound);
  for (const QueueRun* q : {&wait, &drop}) {
    REQUIRE(q->result.out == plain.out);  // the final loss bits
    REQUIRE(q->peak_queued <= kQueueBound);
    REQUIRE(q->peak_rss > 0);
    REQUIRE(q->info.at("queue").find("bytes=" + std::to_string(kQueueBound)) != std::string::npos);
  }
  const auto [wait_dropped, wait_events] = dropped_and_events(tmp / "wait");
  const auto [drop_dropped, drop_events] = dropped_and_events(tmp / "drop");
  REQUIRE(wait.info["dropped_tensors"] == "0");
  REQUIRE(wait_dropped == 0);
  REQUIRE(drop.info["dropped_tensors"] == std::to_string(drop_dropped));
  REQUIRE(drop_dropped > 0);
  REQUIRE(drop_events == wait_events);
  REQUIRE(wait.info["events"] == std::to_string(wait_events));
  Result ls = run({kOpguard, "ls", tmp / "drop"}, tmp.path().string());
  REQUIRE(ls.exit_code == 0);
  REQUIRE(ls.out.find(std::to_string(drop_dropped) + " full tensor(s) dropped") != std::string::npos);
  MESSAGE("queue full under opguard record (tiny_gpt " << steps << " steps, --dump-all, --queue-bytes " << kQueueBound
                                                       << ", " << std::string(kSlowWriter) << "): wait: peak queue "
                                                       << wait.peak_queued << " bytes, 0 dropped; drop: peak queue "
                                                       << drop.peak_queued << " bytes, " << drop_dropped
                                                       << " full tensors dropped and counted, all " << drop_events
                                                       << " events kept; loss bits as unrecorded");
}

// --- SIGTERM, Ctrl-C, and a recording still being written --------------------

namespace {

// A training loop that runs until it is stopped and writes, after every
// optimizer step, how many it finished to `count` (what it had done when the
// signal came).
const char* const kEndless =
    "import sys, torch\n"
    "torch.manual_seed(0)\n"
    "torch.set_num_threads(1)\n"
    "m = torch.nn.Linear(8, 8)\n"
    "opt = torch.optim.SGD(m.parameters(), lr=0.01)\n"
    "x = torch.randn(4, 8)\n"
    "done = 0\n"
    "try:\n"
    "    while True:\n"
    "        loss = m(x).pow(2).mean()\n"
    "        opt.zero_grad()\n"
    "        loss.backward()\n"
    "        opt.step()\n"
    "        done += 1\n"
    "        with open(sys.argv[1], 'w') as f:\n"
    "            f.write(str(done))\n"
    "except KeyboardInterrupt:\n"
    "    print('KeyboardInterrupt raised', flush=True)\n"
    "    raise\n";

int64_t count_in(const std::string& path) {
  for (int tries = 0; tries < 100; ++tries) {
    const std::string text = read_file(path);
    if (!text.empty()) return std::stoll(text);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // between truncate and write
  }
  return -1;
}

}  // namespace

TEST_CASE("SIGTERM and Ctrl-C end a recorded run with every step it finished recorded, however far behind the "
          "writer was") {
  // The default action of SIGTERM (what a cluster sends at a time limit or a
  // preemption) killed the process with the writer hundreds of steps behind
  // on small steps; an uncaught KeyboardInterrupt re-raises SIGINT after
  // Python's exit handlers, so C's, which finish the recording, never ran.
  // The writer is slowed here (0.5 ms an event) so that it is far behind.
  TempDir tmp;
  std::ofstream(tmp / "endless.py") << kEndless;
  for (const auto& [sig, name, code] : {std::tuple<int, const char*, int>{SIGTERM, "SIGTERM", 143},
                                        std::tuple<int, const char*, int>{SIGINT, "SIGINT", 130}}) {
    INFO(std::string(name));
    const std::string out = tmp / (std::string("rec_") + name);
    const std::string count = tmp / (std::string("count_") + name);
    Child c = spawn(record_cmd(out, {}, {kPython, tmp / "endless.py", count}), tmp.path().string(), name,
                    {"OPGUARD_TEST_WRITER_DELAY_US=500"});
    REQUIRE(wait_for_manifest(out, c.pid));
    while (!fs::exists(count)) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const int64_t finished = count_in(count);
    const int64_t written_then = static_cast<int64_t>(fmts::scan_recording(out).ranks[0].steps.size());
    ::kill(c.pid, sig);  // opguard record passes it on to the program
    Result r = wait_child(c);
    INFO(r.err);
    CHECK(r.exit_code == code);
    MESSAGE(std::string(name) << ": " << finished << " steps finished when it came, " << written_then << " written by then, "
                 << contiguous_steps(out).size() << " in the recording");
    CHECK(written_then < finished);  // the writer was behind: what the test is about
    CHECK(static_cast<int64_t>(contiguous_steps(out).size()) >= finished);
    const auto ls = ls_json(out, tmp.path().string());
    CHECK(ls["torn_steps"].empty());
    CHECK(info_of(out)["clean_exit"] == "1");
    if (sig == SIGTERM) CHECK(info_of(out)["ended_by_signal"] == "SIGTERM");
    // Python's own handler still turns Ctrl-C into KeyboardInterrupt (the
    // recorder takes SIGINT only where it has the default action).
    if (sig == SIGINT) CHECK(r.out.find("KeyboardInterrupt raised") != std::string::npos);
  }

  // Ctrl-C of a C++ program (no handler of its own: SIGINT's default action
  // killed it with the queue unwritten).
  const std::string out = tmp / "rec_cpp_SIGINT";
  Child c = spawn(record_cmd(out, {}, tiny_cpp(100000)), tmp.path().string(), "cpp_SIGINT",
                  {"OPGUARD_TEST_WRITER_DELAY_US=500"});
  REQUIRE(wait_for_manifest(out, c.pid));
  while (fmts::scan_recording(out).ranks[0].steps.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const int64_t written_then = static_cast<int64_t>(fmts::scan_recording(out).ranks[0].steps.size());
  ::kill(c.pid, SIGINT);
  Result r = wait_child(c);
  INFO(r.err);
  CHECK(r.exit_code == 130);
  MESSAGE("C++ SIGINT: " << written_then << " steps written when it came, " << contiguous_steps(out).size()
                         << " in the recording");
  CHECK(static_cast<int64_t>(contiguous_steps(out).size()) > written_then);  // the queue was written
  CHECK(ls_json(out, tmp.path().string())["torn_steps"].empty());
  CHECK(info_of(out)["clean_exit"] == "1");
  CHECK(info_of(out)["ended_by_signal"] == "SIGINT");
}

TEST_CASE("ls of a recording still being written says so, and after a SIGKILL that the process died") {
  TempDir tmp;
  const std::string out = tmp / "live";
  Child c = spawn(record_cmd(out, {}, tiny_cpp(100000)), tmp.path().string(), "live");
  REQUIRE(wait_for_manifest(out, c.pid));
  while (fmts::scan_recording(out).ranks[0].steps.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  Result ls = run({kOpguard, "ls", out}, tmp.path().string());
  CHECK(ls.out.find("in progress: the recording process is still running") != std::string::npos);
  CHECK(ls.out.find("torn:") == std::string::npos);
  CHECK(ls_json(out, tmp.path().string())["recording_in_progress"] == true);
  ::kill(std::stoi(read_file(out + "/rank0/owner.pid")), SIGKILL);
  wait_child(c);
  ls = run({kOpguard, "ls", out}, tmp.path().string());
  CHECK(ls.out.find("the process did not exit cleanly") != std::string::npos);
  CHECK(ls_json(out, tmp.path().string())["recording_in_progress"] == false);
  CHECK(info_of(out)["fingerprints"] == "deferred");  // the manifest written at open says so too

  // The dead recorder's pid given to another process since (this test's, with
  // another start time) is not the recorder; the same pid and start time is.
  const std::string owner = out + "/rank0/owner.pid";
  const std::string self = fmts::owner_line();
  REQUIRE(self.find(' ') != std::string::npos);
  std::ofstream(owner, std::ios::trunc) << ::getpid() << " 1\n";
  CHECK(ls_json(out, tmp.path().string())["recording_in_progress"] == false);
  std::ofstream(owner, std::ios::trunc) << self;
  CHECK(ls_json(out, tmp.path().string())["recording_in_progress"] == true);
  std::ofstream(owner, std::ios::trunc) << ::getpid() << "\n";  // the pid alone: an older recorder's file
  CHECK(ls_json(out, tmp.path().string())["recording_in_progress"] == true);
}
