// The parallelism knobs tp, microbatches and reduce on a recording of
// parallel_ops.py (every tensor dumped): a tensor-parallel split changes the
// bits of matmul-like ops and one shard leaves them equal; micro-batches
// change the backward weight and bias gradients; an op a knob does not apply
// to says so instead of silently reproducing. Repro bundles of decomposed
// ops give replay's bits exactly, in repro.py and in repro.cpp.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <filesystem>

#include "../support/process.h"
#include "opguard/core/error.h"
#include "opguard/replay/replay.h"

using opguard::testing::Result;
using opguard::testing::run;
using opguard::testing::TempDir;
namespace replay = opguard::replay;

namespace {

struct Recording {
  TempDir tmp;
  std::string dir;
  std::vector<replay::ReplayResult> events;  // replayed as recorded
  Recording() {
    dir = tmp / "rec";
    Result r = run({OPGUARD_BIN, "record", "--out", dir, "--dump-all", "--", OPGUARD_PYTHON_BIN, OPGUARD_PARALLEL_OPS_PY},
                   tmp.path().string());
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    replay::ReplayOptions o;
    o.self_exe = OPGUARD_BIN;
    events = replay::replay_all(dir, o);
  }
};

const Recording& recording() {
  static Recording r;
  return r;
}

// The one event of `op` in `phase` whose first output has `dtype`.
std::string event_of(const std::string& op, const std::string& phase, const std::string& dtype = "float32") {
  std::vector<std::string> found;
  for (const auto& r : recording().events)
    if (r.op == op && r.phase == phase && !r.outputs.empty() && r.outputs[0].dtype == dtype) found.push_back(r.event);
  INFO(op << " " << phase << " " << dtype);
  REQUIRE(found.size() == 1);
  return found.front();
}

replay::ReplayResult trial(const std::string& event, const std::string& config) {
  replay::ReplayOptions o;
  o.self_exe = OPGUARD_BIN;
  o.config = replay::Config::parse(config);
  return replay::replay_event(recording().dir, event, o);
}

bool mentions(const replay::ReplayResult& r, const std::string& text) {
  return r.message.find(text) != std::string::npos;
}

}  // namespace

TEST_CASE("tp=4,reduce=ring changes the bits of a recorded mm and addmm; tp=1 leaves them equal") {
  for (const char* op : {"aten::mm", "aten::addmm"}) {
    INFO(op);
    const std::string id = event_of(op, "forward");
    const auto split = trial(id, "tp=4,reduce=ring");
    INFO(split.message);
    CHECK(split.verdict == replay::Verdict::kDiffers);
    REQUIRE(split.outputs.size() == 1);
    CHECK(split.outputs[0].has_metrics);
    CHECK(split.outputs[0].metrics.differing > 0);
    CHECK(mentions(split, "shards [64,64,64,64]"));
    const auto one = trial(id, "tp=1,reduce=ring");
    INFO(one.message);
    CHECK(one.verdict == replay::Verdict::kReproduces);
    CHECK(mentions(one, "tp=1"));
  }
}

TEST_CASE("tp splits linear, matmul and bmm too; two shards sum alike in every order, four do not") {
  for (const char* op : {"aten::linear", "aten::matmul", "aten::bmm"}) {
    INFO(op);
    const std::string id = event_of(op, "forward");
    const auto ring2 = trial(id, "tp=2,reduce=ring");
    const auto seq2 = trial(id, "tp=2,reduce=sequential");
    INFO(ring2.message);
    CHECK(mentions(ring2, "tp=2 reduce=ring"));
    REQUIRE(ring2.outputs.size() == 1);
    REQUIRE(seq2.outputs.size() == 1);
    // a + b == b + a in IEEE arithmetic: with two partials the order is moot.
    CHECK(ring2.outputs[0].replayed_fingerprint == seq2.outputs[0].replayed_fingerprint);
  }
  const std::string mm = event_of("aten::mm", "forward");
  const auto ring4 = trial(mm, "tp=4,reduce=ring"), seq4 = trial(mm, "tp=4,reduce=sequential"),
             tree4 = trial(mm, "tp=4,reduce=tree");
  CHECK(ring4.outputs[0].replayed_fingerprint != seq4.outputs[0].replayed_fingerprint);
  CHECK(ring4.outputs[0].replayed_fingerprint != tree4.outputs[0].replayed_fingerprint);
  CHECK(seq4.outputs[0].replayed_fingerprint != tree4.outputs[0].replayed_fingerprint);
}

TEST_CASE("microbatches=4 changes the backward weight gradient and bias gradient; tp does not apply to them") {
  for (const char* op : {"aten::mm", "aten::sum.dim_IntList"}) {
    INFO(op);
    const std::string name = op;
    const auto dot = name.find('.');
    std::string id;
    for (const auto& r : recording().events)
      if (r.phase == "backward" && r.op == name.substr(0, dot) &&
          (dot == std::string::npos ? r.overload.empty() : r.overload == name.substr(dot + 1)))
        id = r.event;
    REQUIRE(!id.empty());
    const auto mb = trial(id, "microbatches=4");
    INFO(mb.message);
    CHECK(mb.verdict == replay::Verdict::kDiffers);
    CHECK(mentions(mb, "reduce=sequential"));
    CHECK(mentions(mb, "batch rows"));
    const auto tp = trial(id, "tp=4");
    INFO(tp.message);
    CHECK(tp.verdict == replay::Verdict::kReproduces);
    CHECK(mentions(tp, "does not apply"));
  }
}

TEST_CASE("an op the knob does not apply to reproduces and says so: relu, an fp16 mm, microbatches on a forward mm") {
  const auto relu = trial(event_of("aten::relu", "forward"), "tp=4");
  CHECK(relu.verdict == replay::Verdict::kReproduces);
  CHECK(mentions(relu, "tp=4 does not apply"));
  const auto half = trial(event_of("aten::mm", "forward", "float16"), "tp=4");
  CHECK(half.verdict == replay::Verdict::kReproduces);
  CHECK(mentions(half, "not Half"));
  const auto fwd = trial(event_of("aten::mm", "forward"), "microbatches=2");
  CHECK(fwd.verdict == replay::Verdict::kReproduces);
  CHECK(mentions(fwd, "microbatches=2 does not apply"));
  const auto lone = trial(event_of("aten::mm", "forward"), "reduce=tree");
  CHECK(mentions(lone, "no effect without tp or microbatches"));
}

TEST_CASE("parallelism knobs parse, reject bad values and are listed by opguard configs") {
  CHECK(replay::Config::parse("tp=4,reduce=ring,microbatches=2").to_string() == "tp=4,reduce=ring,microbatches=2");
  CHECK_THROWS_AS(replay::Config::parse("tp=0"), opguard::UsageError);
  CHECK_THROWS_AS(replay::Config::parse("microbatches=x"), opguard::UsageError);
  CHECK_THROWS_AS(replay::Config::parse("reduce=butterfly"), opguard::UsageError);
  TempDir tmp;
  Result r = run({OPGUARD_BIN, "configs"}, tmp.path().string());
  CHECK(r.exit_code == 0);
  for (const char* knob : {"tp", "microbatches", "reduce"}) {
    INFO(knob);
    CHECK(r.out.find(std::string("\n") + knob) != std::string::npos);
  }
  Result bad = run({OPGUARD_BIN, "replay", recording().dir, "--event", "0", "--config", "reduce=butterfly"},
                   tmp.path().string());
  CHECK(bad.exit_code == 2);
}

// A bundle's standalone programs decompose the op themselves: --strict makes
// them match the bits replay wrote into expected_good.h5 and expected_bad.h5,
// so every form and order must agree with replay/decomposed.cpp bit for bit.
TEST_CASE("repro bundles of tp and microbatches configs reproduce replay's exact bits in repro.py and repro.cpp") {
  struct Case {
    std::string op, phase, good, bad;
  };
  const std::vector<Case> cases = {
      {"aten::mm", "forward", "tp=4,reduce=sequential", "tp=4,reduce=ring"},
      {"aten::addmm", "forward", "", "tp=4,reduce=tree"},
      {"aten::matmul", "forward", "", "tp=3,reduce=ring"},
      {"aten::bmm", "forward", "tp=4,reduce=tree", "tp=4,reduce=sequential"},
      {"aten::linear", "forward", "", "tp=2"},
  };
  TempDir tmp;
  std::string first_bundle;
  auto check_bundle = [&](const std::string& id, const std::string& good, const std::string& bad, const std::string& label) {
    const std::string bundle = tmp / ("bundle-" + label);
    Result w = run({OPGUARD_BIN, "repro", recording().dir, "--event", id, "--good", good, "--bad", bad, "-o", bundle},
                   tmp.path().string());
    INFO(label << ": " << w.out << w.err);
    REQUIRE(w.exit_code == 0);
    Result py = run({OPGUARD_PYTHON_BIN, bundle + "/repro.py", "--strict"}, tmp.path().string());
    INFO(py.out << py.err);
    CHECK(py.exit_code == 0);
    CHECK(py.out.find("REPRODUCED: good and bad give different bits") != std::string::npos);
    if (first_bundle.empty()) first_bundle = bundle;
  };
  for (const auto& c : cases) check_bundle(event_of(c.op, c.phase), c.good, c.bad, c.op.substr(6) + "-" + c.bad);
  // The backward weight and bias gradients, split over micro-batches.
  for (const char* op : {"mm", "sum"}) {
    std::string id;
    for (const auto& r : recording().events)
      if (r.phase == "backward" && r.op == std::string("aten::") + op) id = r.event;
    REQUIRE(!id.empty());
    check_bundle(id, "microbatches=2", "microbatches=4,reduce=tree", std::string(op) + "-backward");
  }

  // repro.cpp of the first bundle (mm, sequential vs ring over 4 shards), built with CMake.
  Result cpp = opguard::testing::build_and_run_repro(OPGUARD_PYTHON_BIN, OPGUARD_CMAKE_BIN, first_bundle,
                                                     tmp / "repro-build", tmp.path().string());
  INFO(cpp.out << cpp.err);
  CHECK(cpp.exit_code == 0);
  CHECK(cpp.out.find("REPRODUCED: good and bad give different bits") != std::string::npos);
}
