// The all-reduces of a recorded 4-rank data-parallel run (examples/tiny_gpt.py
// --ddp over Gloo, launched by torchrun under opguard record) summed again:
// the emulated ring order reproduces every recorded gradient all-reduce bit
// for bit, and the sequential and tree orders do not; NCCL trials run where a
// machine has 4 GPUs and say why not elsewhere.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "../support/process.h"
#include "opguard/core/error.h"
#include "opguard/replay/allreduce.h"

using opguard::testing::Result;
using opguard::testing::run;
using opguard::testing::TempDir;
namespace replay = opguard::replay;

namespace {

struct Recording {
  TempDir tmp;
  std::string dir;
  Recording() {
    dir = tmp / "ddp";
    Result r = run({OPGUARD_BIN, "record", "--out", dir, "--dump-ops", "^c10d::allreduce_$", "--", OPGUARD_PYTHON_BIN,
                    "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4", OPGUARD_TINY_GPT_PY,
                    "--ddp", "--steps", "2", "--width", "32", "--depth", "1", "--heads", "2", "--seq", "16", "--batch",
                    "8"},
                   tmp.path().string());
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
  }
};

const Recording& recording() {
  static Recording r;
  return r;
}

const replay::AllreduceTrial& trial(const replay::AllreduceReplay& r, const std::string& how) {
  for (const auto& t : r.trials)
    if (t.how == how) return t;
  FAIL("no trial " << how);
  return r.trials.front();
}

}  // namespace

TEST_CASE("the ring emulation reproduces every recorded Gloo all-reduce of a 4-rank run; sequential and tree do not") {
  replay::AllreduceOptions o;
  o.nccl_configs = {"Ring/Simple"};
  const auto all = replay::replay_allreduces(recording().dir, o);
  // One per parameter (12 with --depth 1) and one for the loss, per step.
  REQUIRE(all.size() >= 2 * 13);
  int64_t seq_differs = 0, tree_differs = 0, large = 0;
  for (const auto& r : all) {
    INFO("all-reduce " << r.index << " step " << r.step << " " << r.dtype << "[" << r.numel << "]");
    CHECK(r.outputs_agree);
    CHECK(r.events.size() == 4);
    const auto& ring = trial(r, "emulated ring");
    CHECK(ring.ran);
    CHECK(ring.equal);
    if (r.numel >= 64) {
      ++large;
      seq_differs += trial(r, "emulated sequential").equal ? 0 : 1;
      tree_differs += trial(r, "emulated tree").equal ? 0 : 1;
    }
    const auto& nccl = trial(r, "nccl Ring/Simple");
    if (!nccl.ran) CHECK(!nccl.note.empty());  // no NCCL, or fewer than 4 GPUs: it says so
  }
  // The other orders give other bits on the larger gradients: the recording
  // tells the orders apart.
  CHECK(large > 10);
  CHECK(seq_differs > large / 2);
  CHECK(tree_differs > large / 2);
}

TEST_CASE("a single-rank recording or one without full all-reduce inputs is refused with what to do") {
  TempDir tmp;
  CHECK_THROWS_AS(replay::replay_allreduces(tmp.path().string()), opguard::Error);
}
