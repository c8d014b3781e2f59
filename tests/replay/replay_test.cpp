// Replay on recordings of real programs: both examples (one step recorded in
// full must replay bitwise, every exception explained), knob_ops.py (a knob of
// PLATFORM.md's table changes the op it names and leaves the others equal),
// config strings, and the replay / configs verbs with their exit codes.
// No torch headers here (the library hides them), so doctest's CHECK is safe;
// REQUIRE is used anyway where the test cannot go on.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include "../support/process.h"
#include "opguard/core/error.h"
#include "opguard/formats/recording.h"
#include "opguard/replay/replay.h"
#include "../../replay/trial_server.h"

using opguard::testing::Result;
using opguard::testing::record_argv;
using opguard::testing::run;
using opguard::testing::TempDir;
namespace replay = opguard::replay;

namespace {

const std::string kOpguard = OPGUARD_BIN;
const std::string kTinyGpt = OPGUARD_TINY_GPT_BIN;
const std::string kTinyGptPy = OPGUARD_TINY_GPT_PY;
const std::string kKnobOps = OPGUARD_KNOB_OPS_PY;
const std::string kMixedOps = OPGUARD_MIXED_OPS_PY;
const std::string kDenormalOps = OPGUARD_DENORMAL_OPS_PY;
const std::string kSdpaOps = OPGUARD_SDPA_OPS_PY;
const std::string kKnobSwitchOps = OPGUARD_KNOB_SWITCH_OPS_PY;
const std::string kPython = OPGUARD_PYTHON_BIN;

// Only the ops knob_ops.py wants compared keep full tensors: its 16M-float
// input would otherwise be dumped by every op that makes it.
const std::string kKnobDumpOps = "aten::(sum|softmax|exp|mm|randn|dropout)";

void record(const TempDir& tmp, const std::string& out, const std::vector<std::string>& flags,
            const std::vector<std::string>& program, const std::vector<std::string>& env = {}) {
  Result r = run(record_argv(kOpguard, out, flags, program), tmp.path().string(), env);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
}

// Recordings shared by several test cases, made once per test binary run.
struct Recordings {
  TempDir tmp;
  std::string cpp, py, knobs, knobs_default, mixed, flushed, attention, switched;
  Recordings() {
    cpp = tmp / "cpp";
    record(tmp, cpp, {"--dump-steps", "1"}, {kTinyGpt, "--steps", "2"});
    py = tmp / "py";
    record(tmp, py, {"--dump-steps", "1"}, {kPython, kTinyGptPy, "--steps", "2"});
    mixed = tmp / "mixed";
    // With MKL's default code path: under MKL_CBWR=COMPATIBLE (the suite's
    // setting) the small mm and bmm of its matmuls round alike, and a replay
    // that ran a bmm where the recorded op ran an mm would go unnoticed.
    record(tmp, mixed, {"--dump-all"}, {kPython, kMixedOps}, {"MKL_CBWR"});
    flushed = tmp / "flushed";
    record(tmp, flushed, {"--dump-all"}, {kPython, kDenormalOps, "flush"});
    attention = tmp / "attention";
    record(tmp, attention, {"--dump-all"}, {kPython, kSdpaOps, "math"});
    switched = tmp / "switched";
    record(tmp, switched, {"--dump-all"}, {kPython, kKnobSwitchOps});
    knobs = tmp / "knobs";
    record(tmp, knobs, {"--dump-ops", kKnobDumpOps}, {kPython, kKnobOps});
    knobs_default = tmp / "knobs_default";
    // ONEDNN_DEFAULT_FPMATH_MODE=STRICT is oneDNN's default: the same bits, one more recorded variable.
    record(tmp, knobs_default, {"--dump-ops", kKnobDumpOps}, {kPython, kKnobOps},
           {"ATEN_CPU_CAPABILITY=default", "ONEDNN_DEFAULT_FPMATH_MODE=STRICT"});
  }
};

Recordings& recordings() {
  static Recordings r;
  return r;
}

replay::ReplayOptions options(const std::string& config = "") {
  replay::ReplayOptions o;
  o.config = replay::Config::parse(config);
  o.self_exe = kOpguard;
  return o;
}

// The replayable events of knob_ops.py by op name (each op occurs once there).
std::map<std::string, replay::ReplayResult> by_op(const std::vector<replay::ReplayResult>& results) {
  std::map<std::string, replay::ReplayResult> m;
  for (const auto& r : results) m[r.op + (r.overload.empty() ? "" : "." + r.overload)] = r;
  return m;
}

std::string event_of(const std::string& dir, const std::string& op) {
  auto all = by_op(replay::replay_all(dir, options()));
  REQUIRE(all.count(op) == 1);
  return all.at(op).event;
}

}  // namespace

TEST_CASE("every operator of one fully recorded step of the C++ example replays bitwise: forward, backward, optimizer") {
  int64_t skipped = 0;
  const auto results = replay::replay_all(recordings().cpp, options(), &skipped);
  std::set<std::string> phases;
  int64_t in_step1 = 0;
  for (const auto& r : results) {
    INFO(r.event << " " << r.op << ": " << r.message);
    CHECK(r.verdict == replay::Verdict::kReproduces);
    if (r.step == 1) {
      phases.insert(r.phase);
      ++in_step1;
    }
  }
  CHECK(phases == std::set<std::string>{"forward", "backward", "optimizer"});
  // Step 1 is dumped in full: every one of its events has its inputs.
  CHECK(in_step1 > 500);
  CHECK(skipped > 0);  // step 0 holds only fingerprints
}

TEST_CASE("every operator of one fully recorded step of the Python example replays bitwise, except detach_ of "
          "buffers that torch.tensor filled outside the dispatcher") {
  const auto results = replay::replay_all(recordings().py, options());
  std::set<std::string> phases;
  int64_t reproduces = 0, explained = 0;
  for (const auto& r : results) {
    INFO(r.event << " " << r.op << ": " << r.message);
    if (r.step == 1) phases.insert(r.phase);
    if (r.verdict == replay::Verdict::kReproduces) {
      ++reproduces;
      continue;
    }
    // torch.tensor(list) copies the data into an empty buffer with memcpy, not
    // through an operator: the recorder sees an uninitialised input, and
    // aten::detach_ returns bits no recording holds. Nothing else may fail.
    CHECK(r.verdict == replay::Verdict::kCannotReplay);
    CHECK(r.reason == replay::CannotReason::kWrittenOutside);
    CHECK(r.op == "aten::detach_");
    ++explained;
  }
  CHECK(phases == std::set<std::string>{"forward", "backward", "optimizer"});
  CHECK(reproduces > 500);
  CHECK(explained <= 4);  // the token batch and the targets, in each of the two steps
}

TEST_CASE("cpu_capability=default, run in a child process, changes the bits of softmax and leaves mm, exp and the "
          "sums equal") {
  const auto results = by_op(replay::replay_all(recordings().knobs, options("cpu_capability=default")));
  REQUIRE(results.count("aten::softmax.int") == 1);
  const auto& softmax = results.at("aten::softmax.int");
  CHECK(softmax.child_process);
  CHECK(softmax.verdict == replay::Verdict::kDiffers);
  REQUIRE(softmax.outputs.size() == 1);
  REQUIRE(softmax.outputs[0].has_metrics);
  CHECK(softmax.outputs[0].metrics.differing > 0);
  // A few ULP: another vectorised exp inside softmax, not another algorithm.
  CHECK(softmax.outputs[0].metrics.max_ulp < 64);
  for (const char* op : {"aten::mm", "aten::exp", "aten::sum", "aten::sum.dim_IntList"}) {
    INFO(op);
    REQUIRE(results.count(op) == 1);
    CHECK(results.at(op).verdict == replay::Verdict::kReproduces);
  }
  // The recorded capability (avx2 or avx512 here) reproduces softmax.
  const auto same = replay::replay_event(recordings().knobs, softmax.event, options());
  CHECK(same.verdict == replay::Verdict::kReproduces);
}

TEST_CASE("threads=1 changes the bits of a full sum of 16M floats recorded with 2 threads and leaves the row sum, "
          "softmax and mm equal") {
  const auto results = by_op(replay::replay_all(recordings().knobs, options("threads=1")));
  REQUIRE(results.count("aten::sum") == 1);
  CHECK(results.at("aten::sum").verdict == replay::Verdict::kDiffers);
  CHECK_FALSE(results.at("aten::sum").child_process);
  for (const char* op : {"aten::sum.dim_IntList", "aten::softmax.int", "aten::mm"}) {
    INFO(op);
    REQUIRE(results.count(op) == 1);
    CHECK(results.at(op).verdict == replay::Verdict::kReproduces);
  }
  // The recorded 2 threads reproduce it; the trial left this process's threads alone.
  const auto two = replay::replay_event(recordings().knobs, results.at("aten::sum").event, options("threads=2"));
  CHECK(two.verdict == replay::Verdict::kReproduces);
}

TEST_CASE("the reference's softmax replayed under the suspect's cpu_capability gives the suspect's recorded bits") {
  const std::string ref = recordings().knobs, sus = recordings().knobs_default;
  const std::string id = event_of(ref, "aten::softmax.int");
  auto o = options();
  o.expect_dir = sus;
  o.expect_event = id;  // same program, same event ids
  const auto as_recorded = replay::replay_event(ref, id, o);
  CHECK(as_recorded.verdict == replay::Verdict::kDiffers);  // the two runs differ there
  o.config = replay::Config::parse("cpu_capability=default");
  const auto explained = replay::replay_event(ref, id, o);
  INFO(explained.message);
  CHECK(explained.verdict == replay::Verdict::kReproduces);  // the knob explains the divergence
}

TEST_CASE("random ops replay from the recorded generator state, every time") {
  const auto results = by_op(replay::replay_all(recordings().knobs, options()));
  for (const char* op : {"aten::randn", "aten::dropout"}) {
    INFO(op);
    REQUIRE(results.count(op) == 1);
    CHECK(results.at(op).verdict == replay::Verdict::kReproduces);
    // Again: the default generator has moved on since, and is restored.
    CHECK(replay::replay_event(recordings().knobs, results.at(op).event, options()).verdict ==
          replay::Verdict::kReproduces);
  }
}

TEST_CASE("ops under autocast, Python numbers wrapped as tensors, scaled_dot_product_attention's dropout and "
          "kernels that look at requires_grad replay bitwise") {
  // mixed_ops.py: without the recorded autocast state the linear returned
  // float32 (the recording bfloat16); without the wrapped-number flag
  // 0-dim + 1e-6 and int * 0.5 returned float64; without the generator state
  // the attention's dropout mask differed; without requires_grad the matmuls
  // of a parameter and a 3-d operand ran as bmm instead of one mm (other
  // bits), and relu_ and detach_ of a computed tensor under grad mode need it
  // rebuilt as computed, not as a leaf (relu_ fails on it) nor as a view
  // (detach_ fails); without the default dtype randn, zeros and
  // ints * 0.25 under torch.set_default_dtype(torch.float64) returned float32;
  // a foreach op's Scalar[] was recorded as "GenericList" (not replayable,
  // and two runs' other step sizes compared equal); fused AdamW's empty
  // max_exp_avg_sqs came back as an int list, "differs".
  const auto results = replay::replay_all(recordings().mixed, options());
  std::set<std::string> ops;
  int matmuls = 0;
  for (const auto& r : results) {
    INFO(r.event << " " << r.op << ": " << r.message);
    CHECK(r.verdict == replay::Verdict::kReproduces);
    ops.insert(r.op + (r.overload.empty() ? "" : "." + r.overload));
    matmuls += r.op == "aten::matmul" ? 1 : 0;
  }
  for (const char* op : {"aten::linear", "aten::scaled_dot_product_attention", "aten::add.Tensor", "aten::mul.Tensor",
                         "aten::relu_", "aten::detach_", "aten::add_.Tensor", "aten::zeros", "aten::randn",
                         "aten::_foreach_addcdiv_.ScalarList", "aten::_foreach_mul_.ScalarList", "aten::_fused_adamw_"})
    CHECK(ops.count(op) == 1);
  CHECK(matmuls == 4);  // autocast's, two under grad mode, one under no_grad
  Result relu = run({kOpguard, "show", recordings().mixed, "--event", by_op(results).at("aten::relu_").event},
                    recordings().tmp.path().string());
  CHECK(relu.out.find("grad mode on") != std::string::npos);
  CHECK(relu.out.find("requires-grad") != std::string::npos);
  CHECK(relu.out.find("requires-grad leaf") == std::string::npos);
  // The first zeros (under the float64 default); AdamW's state makes more.
  const auto first_zeros = std::find_if(results.begin(), results.end(),
                                        [](const replay::ReplayResult& r) { return r.op == "aten::zeros"; });
  REQUIRE(first_zeros != results.end());
  Result zeros = run({kOpguard, "show", recordings().mixed, "--event", first_zeros->event},
                     recordings().tmp.path().string());
  CHECK(zeros.out.find("default dtype float64") != std::string::npos);
  CHECK(relu.out.find("default dtype") == std::string::npos);  // float32 is not shown
  // show names the autocast state and the wrapped number.
  Result linear = run({kOpguard, "show", recordings().mixed, "--event", by_op(results).at("aten::linear").event},
                      recordings().tmp.path().string());
  CHECK(linear.out.find("autocast cpu=bfloat16") != std::string::npos);
  Result add = run({kOpguard, "show", recordings().mixed, "--event", by_op(results).at("aten::add.Tensor").event},
                   recordings().tmp.path().string());
  CHECK(add.out.find("wrapped-number") != std::string::npos);
  // The step sizes are numbers, compared and shown (ints as ints).
  Result addcdiv = run({kOpguard, "show", recordings().mixed, "--event",
                        by_op(results).at("aten::_foreach_addcdiv_.ScalarList").event},
                       recordings().tmp.path().string());
  CHECK(addcdiv.out.find("double_list [0x1.999999999999ap-4,0x1p-2]") != std::string::npos);
  Result mul = run({kOpguard, "show", recordings().mixed, "--event",
                    by_op(results).at("aten::_foreach_mul_.ScalarList").event},
                   recordings().tmp.path().string());
  CHECK(mul.out.find("int_list [2,3]") != std::string::npos);
}

TEST_CASE("dtype=bf16 runs mm in bfloat16 and returns float32 that differs; dtype=fp32 on float32 inputs reproduces") {
  const std::string id = event_of(recordings().knobs, "aten::mm");
  const auto bf16 = replay::replay_event(recordings().knobs, id, options("dtype=bf16"));
  CHECK(bf16.verdict == replay::Verdict::kDiffers);
  REQUIRE(bf16.outputs.size() == 1);
  CHECK(bf16.outputs[0].dtype == "float32");
  CHECK(bf16.outputs[0].has_metrics);
  const auto fp32 = replay::replay_event(recordings().knobs, id, options("dtype=fp32"));
  CHECK(fp32.verdict == replay::Verdict::kReproduces);
}

TEST_CASE("a recorded variable that the recorded run did not have is removed for the trial, whatever opguard has") {
  const std::string id = event_of(recordings().knobs, "aten::mm");
  const auto here = replay::replay_event(recordings().knobs, id, options());
  CHECK_FALSE(here.child_process);
  // As if opguard ran from a shell that exports it: the trial needs a child
  // process without it, and reproduces there.
  setenv("ONEDNN_DEFAULT_FPMATH_MODE", "BF16", 1);
  const auto child = replay::replay_event(recordings().knobs, id, options());
  unsetenv("ONEDNN_DEFAULT_FPMATH_MODE");
  CHECK(child.child_process);
  CHECK(child.verdict == replay::Verdict::kReproduces);
}

TEST_CASE("trials under one process-wide config share one child process; a child that died is replaced") {
  const std::string id = event_of(recordings().knobs, "aten::mm");
  // Other cases leave their children running: this one's is the new pid.
  const auto before = replay::detail::trial_server_pids();
  const int started = replay::detail::trial_servers_started();
  const auto o = options("env:OPGUARD_TEST_SERVER=1");
  for (int i = 0; i < 3; ++i) {
    const auto r = replay::replay_event(recordings().knobs, id, o);
    CHECK(r.child_process);
    CHECK(r.verdict == replay::Verdict::kReproduces);
  }
  CHECK(replay::detail::trial_servers_started() == started + 1);
  pid_t mine = 0;
  for (pid_t p : replay::detail::trial_server_pids())
    if (std::find(before.begin(), before.end(), p) == before.end()) mine = p;
  REQUIRE(mine > 0);
  // Killed between trials (not by a trial): the next trial gets a new child.
  REQUIRE(::kill(mine, SIGKILL) == 0);
  ::usleep(200 * 1000);
  const auto again = replay::replay_event(recordings().knobs, id, o);
  CHECK(again.child_process);
  CHECK(again.verdict == replay::Verdict::kReproduces);
  CHECK(replay::detail::trial_servers_started() == started + 2);
}

TEST_CASE("a child's answers: its usage error and other errors come back as messages; a child that exits without "
          "answering gives its exit status, and the next call starts another") {
  opguard::testing::TempDir tmp;
  auto script = [&](const std::string& name, const std::string& body) {
    const std::string path = tmp / name;
    std::ofstream(path) << "#!/bin/bash\n" << body;
    REQUIRE(::chmod(path.c_str(), 0755) == 0);
    return path;
  };
  // Reads one request, answers, exits.
  const auto usage = script("usage.sh", "read -r n; head -c \"$n\" >/dev/null; printf 'u 9\\nbad knobs'\n");
  int status = -1;
  auto a = replay::detail::call_trial_server(usage, {"OPGUARD_FAKE=1"}, "{\"x\": 1}", &status);
  REQUIRE(a.has_value());
  CHECK(a->kind == 'u');
  CHECK(a->payload == "bad knobs");
  const auto dies = script("dies.sh", "read -r n; exit 7\n");
  for (int i = 0; i < 2; ++i) {
    const int started = replay::detail::trial_servers_started();
    CHECK_FALSE(replay::detail::call_trial_server(dies, {"OPGUARD_FAKE=2"}, "{}", &status).has_value());
    CHECK(status == 7);
    CHECK(replay::detail::trial_servers_started() == started + 1);
  }
  // Through replay: a child's failure that is not a usage error is the trial's verdict.
  const auto broken = script("broken.sh", "read -r n; head -c \"$n\" >/dev/null; printf 'e 4\\nboom'; sleep 1\n");
  auto o = options("env:OPGUARD_TEST_BROKEN=1");
  o.self_exe = broken;
  const auto r = replay::replay_event(recordings().knobs, event_of(recordings().knobs, "aten::mm"), o);
  CHECK(r.verdict == replay::Verdict::kCannotReplay);
  CHECK(r.reason == replay::CannotReason::kChildFailed);
  CHECK(r.message.find("boom") != std::string::npos);
}

TEST_CASE("config strings: canonical values, later settings win, one clear error for an unknown knob, a bad value "
          "and a knob this build cannot apply") {
  const auto c = replay::Config::parse("threads=2,mkldnn=0,dtype=bf16,threads=1,env:MKL_CBWR=COMPATIBLE");
  CHECK(c.to_string() == "threads=1,mkldnn=off,dtype=bfloat16,env:MKL_CBWR=COMPATIBLE");
  CHECK(c.get("env:MKL_CBWR") == std::optional<std::string>("COMPATIBLE"));
  CHECK(replay::Config::parse("").empty());
  const auto over = replay::Config::parse("threads=2,mkldnn=on").overlaid(replay::Config::parse("threads=4"));
  CHECK(over.to_string() == "threads=4,mkldnn=on");
  CHECK_THROWS_AS(replay::Config::parse("warp_speed=9"), opguard::UsageError);
  CHECK_THROWS_AS(replay::Config::parse("threads=0"), opguard::UsageError);
  CHECK_THROWS_AS(replay::Config::parse("threads"), opguard::UsageError);
  CHECK_THROWS_AS(replay::Config::parse("dtype=int8"), opguard::UsageError);
  CHECK_THROWS_AS(replay::Config::parse("cpu_capability=sse9"), opguard::UsageError);
  CHECK_THROWS_AS(replay::Config::parse("device=gpu"), opguard::UsageError);
  CHECK_THROWS_AS(replay::Config::parse("device=cuda:x"), opguard::UsageError);
  // The GPU knobs need a CUDA device: refused with the reason where there is none.
  std::string why;
  if (replay::cuda_device_count(&why) == 0) {
    CHECK_FALSE(why.empty());
    CHECK_THROWS_AS(replay::Config::parse("tf32_cublas=on"), opguard::UsageError);
    try {
      replay::Config::parse("device=cuda:0");
      CHECK(false);
    } catch (const opguard::UsageError& e) {
      CHECK(std::string(e.what()) == "device=cuda:0 cannot be applied here: " + why);
    }
  } else {
    CHECK(replay::Config::parse("device=cuda,tf32_cublas=1,sdpa_backend=math").to_string() ==
          "device=cuda:0,tf32_cublas=on,sdpa_backend=math");
    CHECK_THROWS_AS(replay::Config::parse("device=cuda:4096"), opguard::UsageError);
    CHECK_THROWS_AS(replay::Config::parse("cublas_workspace_config=4096"), opguard::UsageError);
  }
}

TEST_CASE("device=cuda:0 replays recorded CPU events on the GPU: exact element-wise ops reproduce, TF32 changes mm") {
  std::string why;
  if (replay::cuda_device_count(&why) == 0) {
    MESSAGE("SKIPPED (no GPU): " << why);
    return;
  }
  // One full step of the C++ example on the GPU: a figure, and the ops whose
  // IEEE result is exact (one rounding) must give the CPU's bits.
  const auto all = replay::replay_all(recordings().cpp, options("device=cuda:0"));
  std::map<std::string, int> verdicts;
  int exact = 0;
  for (const auto& r : all) {
    ++verdicts[replay::verdict_name(r.verdict)];
    const std::string op = r.op + "." + r.overload;
    if (op == "aten::mul.Tensor" || op == "aten::add.Tensor" || op == "aten::sub.Tensor") {
      INFO(r.event << " " << op << " " << r.message);
      CHECK(r.verdict == replay::Verdict::kReproduces);
      ++exact;
    }
  }
  MESSAGE("C++ tiny_gpt step 1 on cuda:0: " << all.size() << " events, " << verdicts["reproduces"]
                                            << " reproduce the CPU bits, " << verdicts["differs"] << " differ, "
                                            << verdicts["cannot-replay"] << " cannot replay");
  CHECK(exact > 0);
  const std::string mm = event_of(recordings().knobs, "aten::mm");
  const auto off = replay::replay_event(recordings().knobs, mm, options("device=cuda:0,tf32_cublas=off"));
  const auto on = replay::replay_event(recordings().knobs, mm, options("device=cuda:0,tf32_cublas=on"));
  REQUIRE(off.verdict != replay::Verdict::kCannotReplay);
  REQUIRE(on.verdict != replay::Verdict::kCannotReplay);
  REQUIRE(off.outputs.size() == 1);
  REQUIRE(on.outputs.size() == 1);
  CHECK(off.outputs[0].replayed_fingerprint != on.outputs[0].replayed_fingerprint);
  // The same trial twice: the same bits.
  const auto again = replay::replay_event(recordings().knobs, mm, options("device=cuda:0,tf32_cublas=on"));
  CHECK(again.outputs[0].replayed_fingerprint == on.outputs[0].replayed_fingerprint);
  // A CPU generator's state does not drive CUDA's: said, not replayed wrongly.
  const auto randn = replay::replay_event(recordings().knobs, event_of(recordings().knobs, "aten::randn"),
                                          options("device=cuda:0"));
  CHECK(randn.verdict == replay::Verdict::kCannotReplay);
}

TEST_CASE("the recorded config comes from the manifest: threads, cpu capability, oneDNN, determinism") {
  const auto c = replay::recorded_config(recordings().knobs, 0);
  CHECK(c.get("threads") == std::optional<std::string>("2"));
  REQUIRE(c.get("cpu_capability").has_value());
  CHECK(c.get("mkldnn") == std::optional<std::string>("on"));
  CHECK(c.get("deterministic") == std::optional<std::string>("off"));
  CHECK(replay::recorded_config(recordings().knobs_default, 0).get("cpu_capability") ==
        std::optional<std::string>("default"));
  // Numerics variables of the recorded run's environment become env: knobs.
  CHECK(replay::recorded_config(recordings().knobs_default, 0).get("env:ONEDNN_DEFAULT_FPMATH_MODE") ==
        std::optional<std::string>("STRICT"));
  CHECK_FALSE(replay::recorded_config(recordings().knobs, 0).get("env:ONEDNN_DEFAULT_FPMATH_MODE").has_value());
  CHECK_THROWS_AS(replay::recorded_config(recordings().knobs, 7), opguard::UsageError);
}

TEST_CASE("a program that flushes denormals to zero is replayed with them flushed; flush_denormal=off differs") {
  // denormal_ops.py flush: torch.set_flush_denormal(True), then 1e-20f * 1e-20f,
  // 0 with denormals flushed and a denormal otherwise. The manifest says so
  // (flush_denormal at the end: the program set it after the recording opened).
  CHECK(replay::recorded_config(recordings().flushed, 0).get("flush_denormal") == std::optional<std::string>("on"));
  CHECK_FALSE(replay::recorded_config(recordings().knobs, 0).get("flush_denormal").has_value());
  const auto mul = by_op(replay::replay_all(recordings().flushed, options())).at("aten::mul.Tensor");
  INFO(mul.message);
  CHECK(mul.verdict == replay::Verdict::kReproduces);
  CHECK(mul.config.find("flush_denormal=on") != std::string::npos);
  const auto off = replay::replay_event(recordings().flushed, mul.event, options("flush_denormal=off"));
  CHECK(off.verdict == replay::Verdict::kDiffers);
  // ls shows it (the value at the end: the program set it after the recording opened).
  Result ls = run({kOpguard, "ls", recordings().flushed}, recordings().tmp.path().string());
  CHECK(ls.out.find("flush_denormal on") != std::string::npos);
  Result ls_mixed = run({kOpguard, "ls", recordings().mixed}, recordings().tmp.path().string());
  CHECK(ls_mixed.out.find("flush_denormal") == std::string::npos);
}

TEST_CASE("flush_denormal is set on every intra-op thread of a trial and undone on all of them") {
  // denormal_ops.py flush big: 2**20 products of 1e-20f on two intra-op
  // threads, all 0 with denormals flushed. torch.set_flush_denormal sets the
  // calling thread's MXCSR only, and a worker keeps the one it was created
  // with. Replay set the knob on the calling thread only: in a process whose
  // workers were created without it (here by the first trial, under "off"),
  // a trial under "on" flushed the caller's chunk and not the worker's and
  // said the op differs; undone on the caller only, "on" stayed in the
  // workers for the trials after it.
  if (std::thread::hardware_concurrency() < 2) {
    MESSAGE("SKIPPED: one CPU, no intra-op worker thread to set");
    return;
  }
  const std::string dir = recordings().tmp / "flushed_big";
  record(recordings().tmp, dir, {"--dump-all"}, {kPython, kDenormalOps, "flush", "big"});
  CHECK(replay::recorded_config(dir, 0).get("threads") == std::optional<std::string>("2"));
  const auto events = by_op(replay::replay_all(dir, options("flush_denormal=off")));
  const auto& first_off = events.at("aten::mul.Tensor");
  REQUIRE(first_off.outputs.size() == 1);
  REQUIRE(first_off.outputs[0].has_metrics);
  CHECK(first_off.outputs[0].metrics.differing == (1 << 20));  // no chunk flushed
  const auto on = replay::replay_event(dir, first_off.event, options());
  INFO(on.message);
  CHECK(on.config.find("flush_denormal=on") != std::string::npos);
  CHECK_FALSE(on.child_process);
  CHECK(on.verdict == replay::Verdict::kReproduces);  // every chunk flushed
  // After it, a trial that does not name the knob (a recording of the program
  // without flush) runs with none flushed, in this process like the others.
  const std::string plain_dir = recordings().tmp / "denormal_big";
  record(recordings().tmp, plain_dir, {"--dump-all"}, {kPython, kDenormalOps, "big"});
  const auto plain = by_op(replay::replay_all(plain_dir, options())).at("aten::mul.Tensor");
  INFO(plain.message);
  CHECK_FALSE(plain.child_process);
  CHECK(plain.config.find("flush_denormal") == std::string::npos);
  CHECK(plain.verdict == replay::Verdict::kReproduces);
}

TEST_CASE("denormals flushed on the main thread only, or on the intra-op workers only, replay as they ran "
          "(flush_denormal=main, workers)") {
  // denormal_ops.py flush late big: the program starts its intra-op worker
  // before torch.set_flush_denormal(True), so the worker's half of the 2**20
  // products stays denormal; cleared big: it sets the flag, starts the
  // worker, clears it, so only the worker's half is flushed. The manifest has
  // the main thread's state per event and the workers' at the end; replay
  // sets both (before, it set the main thread's on every thread and said the
  // first op differs in 524288 of 1048576 elements).
  if (std::thread::hardware_concurrency() < 2) {
    MESSAGE("SKIPPED: one CPU, no intra-op worker thread to set");
    return;
  }
  struct Case {
    const char* mode;
    const char* value;
    const char* other;  // another value, under which the op differs in the worker's or main thread's half
  };
  for (const Case& c : {Case{"late", "main", "on"}, Case{"cleared", "workers", "off"}}) {
    INFO(c.mode);
    const std::string dir = recordings().tmp / (std::string("flushed_") + c.mode);
    record(recordings().tmp, dir, {"--dump-all"}, {kPython, kDenormalOps, "flush", c.mode, "big"});
    CHECK(replay::recorded_config(dir, 0).get("flush_denormal") == std::optional<std::string>(c.value));
    const auto mul = by_op(replay::replay_all(dir, options())).at("aten::mul.Tensor");
    INFO(mul.message);
    CHECK(mul.config.find(std::string("flush_denormal=") + c.value) != std::string::npos);
    CHECK_FALSE(mul.child_process);
    CHECK(mul.verdict == replay::Verdict::kReproduces);
    const auto other = replay::replay_event(dir, mul.event, options(std::string("flush_denormal=") + c.other));
    REQUIRE(other.outputs.size() == 1);
    REQUIRE(other.outputs[0].has_metrics);
    CHECK(other.outputs[0].metrics.differing == (1 << 19));  // one thread's half
  }
  Result ls = run({kOpguard, "ls", recordings().tmp / "flushed_late"}, recordings().tmp.path().string());
  CHECK(ls.out.find("flush_denormal on (intra-op workers off)") != std::string::npos);
  // Undone on every thread: a recording without the flag replays after them.
  const std::string plain_dir = recordings().tmp / "denormal_big_after";
  record(recordings().tmp, plain_dir, {"--dump-all"}, {kPython, kDenormalOps, "big"});
  const auto plain = by_op(replay::replay_all(plain_dir, options())).at("aten::mul.Tensor");
  CHECK(plain.verdict == replay::Verdict::kReproduces);
  CHECK_THROWS_AS(replay::Config::parse("flush_denormal=caller"), opguard::UsageError);
}

TEST_CASE("a random op that fills a fresh buffer differs under another config; it is not said to read bits written "
          "outside the dispatcher") {
  // normal_ of an empty() buffer: its input is recorded as uninitialised and
  // its output is that storage. A replay that differs there was called
  // cannot-replay (input-written-outside-dispatcher), as for an op that reads
  // bits a kernel wrote without the dispatcher; normal_ reads none of them
  // (replay now runs it once more with the buffer filled otherwise to tell).
  TempDir tmp;
  std::ofstream(tmp / "fill.py") << "import torch\n"
                                     "g = torch.Generator().manual_seed(7)\n"
                                     "x = torch.empty(64)\n"
                                     "x.normal_(generator=g)\n";
  const std::string dir = tmp / "fill";
  record(tmp, dir, {"--dump-all"}, {kPython, tmp / "fill.py"});
  const auto normal = by_op(replay::replay_all(dir, options())).at("aten::normal_");
  INFO(normal.message);
  CHECK(normal.verdict == replay::Verdict::kReproduces);
  const auto as_double = replay::replay_event(dir, normal.event, options("dtype=fp64"));
  INFO(as_double.message);
  CHECK(as_double.verdict == replay::Verdict::kDiffers);
}

TEST_CASE("attention run under sdpa_kernel(MATH) is replayed with the math backend; sdpa_backend=all differs") {
  // sdpa_ops.py math: scaled_dot_product_attention inside
  // torch.nn.attention.sdpa_kernel(SDPBackend.MATH). The op picks its kernel
  // among the enabled backends (on the CPU flash, else math), and the two round
  // differently; the event records the backends (before it did, replay ran
  // flash and said the op differs: 14203 of 16384 elements, up to 53370 ULP).
  const auto all = by_op(replay::replay_all(recordings().attention, options()));
  const auto sdpa = all.at("aten::scaled_dot_product_attention");
  INFO(sdpa.message);
  CHECK(sdpa.verdict == replay::Verdict::kReproduces);
  const auto flash = replay::replay_event(recordings().attention, sdpa.event, options("sdpa_backend=all"));
  CHECK(flash.verdict == replay::Verdict::kDiffers);
  CHECK(replay::replay_event(recordings().attention, sdpa.event, options("sdpa_backend=math")).verdict ==
        replay::Verdict::kReproduces);
  // The value names a set of backends, canonically ordered.
  CHECK(replay::Config::parse("sdpa_backend=flash+math").to_string() == "sdpa_backend=math+flash");
  CHECK(replay::Config::parse("sdpa_backend=math+flash+efficient+cudnn").to_string() == "sdpa_backend=all");
  CHECK(replay::Config::parse("sdpa_backend=none").to_string() == "sdpa_backend=none");
  for (const char* bad : {"sdpa_backend=", "sdpa_backend=math+", "sdpa_backend=math+math", "sdpa_backend=fast"})
    CHECK_THROWS_AS(replay::Config::parse(bad), opguard::UsageError);
  // show says so; an op under the default backends says nothing.
  Result show = run({kOpguard, "show", recordings().attention, "--event", sdpa.event}, recordings().tmp.path().string());
  CHECK(show.out.find("attention backends math (sdpa_backend)") != std::string::npos);
  Result json = run({kOpguard, "show", recordings().attention, "--event", sdpa.event, "--json"},
                    recordings().tmp.path().string());
  CHECK(nlohmann::json::parse(json.out)["sdpa_backend"] == "math");
  Result other = run({kOpguard, "show", recordings().attention, "--event", all.at("aten::randn").event},
                     recordings().tmp.path().string());
  CHECK(other.out.find("attention backends") == std::string::npos);
}

TEST_CASE("knobs the program changes between ops (threads, oneDNN) are recorded per op; each op replays under its own") {
  // knob_switch_ops.py: a full sum under 2 threads then 1, a conv2d with
  // oneDNN off then on. The manifest holds the values at the start and the
  // end (threads 1 at the end); before the knobs were recorded per op, the
  // first sum replayed on 1 thread and the first conv2d with oneDNN on, and
  // both were said to differ.
  std::vector<replay::ReplayResult> sums, convs;
  for (const auto& r : replay::replay_all(recordings().switched, options())) {
    if (r.op == "aten::sum") sums.push_back(r);
    if (r.op == "aten::conv2d") convs.push_back(r);
  }
  REQUIRE(sums.size() == 2);
  REQUIRE(convs.size() == 2);
  for (const auto& r : {sums[0], sums[1], convs[0], convs[1]}) {
    INFO(r.op << " " << r.event << ": " << r.message);
    CHECK(r.verdict == replay::Verdict::kReproduces);
  }
  CHECK(sums[0].config.find("threads=2") != std::string::npos);
  CHECK(sums[1].config.find("threads=1") != std::string::npos);
  CHECK(convs[0].config.find("mkldnn=off") != std::string::npos);
  CHECK(convs[1].config.find("mkldnn=on") != std::string::npos);
  // What the caller sets still wins over what the op recorded.
  CHECK(replay::replay_event(recordings().switched, sums[0].event, options("threads=1")).verdict ==
        replay::Verdict::kDiffers);
  CHECK(replay::replay_event(recordings().switched, convs[0].event, options("mkldnn=on")).verdict ==
        replay::Verdict::kDiffers);
  // show prints them.
  Result show = run({kOpguard, "show", recordings().switched, "--event", convs[0].event},
                    recordings().tmp.path().string());
  CHECK(show.out.find("mkldnn=off") != std::string::npos);
  CHECK(show.out.find("cuda knobs") == std::string::npos);  // torch's defaults then
}

TEST_CASE("the CUDA knobs are recorded per op, also when set through the per-backend API; they join a replay on a "
          "CUDA device only") {
  // knob_switch_ops.py ends with torch.backends.cuda.matmul.fp32_precision =
  // "tf32", cudnn.benchmark on and bf16 reduced-precision reductions off, then
  // an mm. libtorch's float32MatmulPrecision() throws from the first on: the
  // recorder read it for the manifest at the end and lost the clean end.
  const std::string dir = recordings().switched;
  Result ls = run({kOpguard, "ls", dir}, recordings().tmp.path().string());
  CHECK(ls.out.find("clean exit") != std::string::npos);
  const std::string mm = event_of(dir, "aten::mm");
  Result show = run({kOpguard, "show", dir, "--event", mm, "--json"}, recordings().tmp.path().string());
  const auto j = nlohmann::json::parse(show.out);
  CHECK(j["cuda_knobs"] == "tf32_cublas=on,tf32_cudnn=on,cudnn_benchmark=on,cudnn_deterministic=off,"
                           "reduced_precision_reduction=fp16");
  CHECK(j["knobs"].get<std::string>().find("tf32") == std::string::npos);
  CHECK(j["knobs"].get<std::string>().find("float32_matmul_precision=highest") != std::string::npos);
  // On the CPU they are left out (they need a CUDA device); the mm replays.
  const auto r = replay::replay_event(dir, mm, options());
  INFO(r.message);
  CHECK(r.verdict == replay::Verdict::kReproduces);
  CHECK(r.config.find("tf32") == std::string::npos);
  // With a CUDA device named they join (Config::set: no device needed here).
  const opguard::formats::Event ev = [&] {
    const auto layout = opguard::formats::scan_recording(dir);
    for (const auto& [step, path] : layout.ranks.at(0).steps) {
      const opguard::formats::StepReader reader(path);
      for (const auto& e : reader.events())
        if (opguard::formats::event_id_string(e.id) == mm) return e;
    }
    FAIL("no event " << mm);
    return opguard::formats::Event{};
  }();
  replay::Config cuda;
  cuda.set("device", "cuda:0");
  const std::string joined = replay::with_event_knobs(cuda, ev).to_string();
  CHECK(joined.find("tf32_cublas=on") != std::string::npos);
  CHECK(joined.find("cudnn_benchmark=on") != std::string::npos);
  CHECK(joined.find("reduced_precision_reduction=fp16") != std::string::npos);
  CHECK(replay::with_event_knobs(replay::Config{}, ev).to_string().find("tf32") == std::string::npos);
  CHECK(replay::with_event_knobs(replay::Config{}, ev, replay::GpuKnobs::kAlways).to_string().find("tf32_cublas=on") !=
        std::string::npos);
  // The knob takes the one-dtype values (validated where a GPU is).
  const auto& table = replay::knob_table();
  const auto info = std::find_if(table.begin(), table.end(),
                                 [](const replay::KnobInfo& k) { return k.name == "reduced_precision_reduction"; });
  REQUIRE(info != table.end());
  CHECK(info->values == "on|off|fp16|bf16");
}

TEST_CASE("opguard replay: exit 0 when it reproduces, 3 when a knob makes it differ, 65 with the re-record command "
          "when inputs are only fingerprints, 2 for an unknown event or knob") {
  TempDir scratch;
  const std::string dir = recordings().knobs;
  const std::string sum = event_of(dir, "aten::sum");
  Result ok = run({kOpguard, "replay", dir, "--event", sum}, scratch.path().string());
  INFO(ok.out << ok.err);
  CHECK(ok.exit_code == 0);
  CHECK(ok.out.find("verdict  reproduces") != std::string::npos);

  Result differs = run({kOpguard, "replay", dir, "--event", sum, "--config", "threads=1", "--json"},
                       scratch.path().string());
  INFO(differs.out << differs.err);
  CHECK(differs.exit_code == 3);
  const auto j = nlohmann::json::parse(differs.out);
  REQUIRE(j.size() == 1);
  CHECK(j[0]["verdict"] == "differs");
  CHECK(j[0]["outputs"][0]["metrics"]["differing"] == 1);

  // Event 0 of the C++ example's step 0 is fingerprints only.
  Result missing = run({kOpguard, "replay", recordings().cpp, "--event", "300"}, scratch.path().string());
  INFO(missing.out << missing.err);
  CHECK(missing.exit_code == 65);
  CHECK(missing.out.find("inputs-not-recorded") != std::string::npos);
  CHECK(missing.err.find("--dump-around 300:16") != std::string::npos);
  CHECK(missing.err.find("tiny_gpt --steps 2") != std::string::npos);

  CHECK(run({kOpguard, "replay", dir, "--event", "999999"}, scratch.path().string()).exit_code == 2);
  CHECK(run({kOpguard, "replay", dir, "--event", "x.y"}, scratch.path().string()).exit_code == 2);
  CHECK(run({kOpguard, "replay", dir, "--event", sum, "--config", "bogus=1"}, scratch.path().string()).exit_code == 2);
  CHECK(run({kOpguard, "replay", scratch / "nothing", "--event", "1"}, scratch.path().string()).exit_code == 65);
}

TEST_CASE("opguard replay --all reports the fraction that reproduces, and --window stops at the first event that "
          "differs") {
  TempDir scratch;
  Result all = run({kOpguard, "replay", recordings().cpp, "--all"}, scratch.path().string());
  INFO(all.out << all.err);
  CHECK(all.exit_code == 0);
  CHECK(all.out.find("reproduce bitwise (100.0%)") != std::string::npos);

  const std::string dir = recordings().knobs;
  const std::string exp = event_of(dir, "aten::exp");
  Result window = run({kOpguard, "replay", dir, "--event", exp, "--window", "50", "--config", "cpu_capability=default",
                       "--json"}, scratch.path().string());
  INFO(window.out << window.err);
  CHECK(window.exit_code == 3);
  const auto j = nlohmann::json::parse(window.out);
  REQUIRE(j["results"].size() >= 2);
  CHECK(j["results"].back()["op"] == "aten::softmax");
  CHECK(j["results"].back()["verdict"] == "differs");
  CHECK(j["results"][0]["verdict"] == "reproduces");
}

TEST_CASE("opguard configs lists every knob with its values, what it changes and whether this build applies it") {
  TempDir scratch;
  Result r = run({kOpguard, "configs", "--json"}, scratch.path().string());
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.out);
  std::map<std::string, nlohmann::json> knobs;
  for (const auto& k : j) knobs[k["name"]] = k;
  for (const char* name : {"device", "threads", "cpu_capability", "mkldnn", "deterministic", "dtype", "blas_threads",
                           "env:NAME", "tf32_cublas", "cudnn_benchmark", "sdpa_backend"}) {
    INFO(name);
    REQUIRE(knobs.count(name) == 1);
    CHECK_FALSE(knobs[name]["changes"].get<std::string>().empty());
  }
  CHECK(knobs["cpu_capability"]["process_wide"] == true);
  CHECK(knobs["threads"]["process_wide"] == false);
  CHECK(knobs["tf32_cublas"]["available"] == (replay::cuda_device_count(nullptr) > 0));
  CHECK(knobs["tf32_cublas"]["needs_cuda"] == true);
  CHECK(knobs["threads"]["available"] == true);
  CHECK(knobs["sdpa_backend"]["available"] == true);  // on the CPU too: flash or math
  CHECK(knobs["sdpa_backend"]["needs_cuda"] == false);
}
