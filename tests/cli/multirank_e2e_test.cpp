// A data-parallel training run (examples/tiny_gpt.py --ddp, torch.distributed
// with Gloo, 2 and 4 ranks launched by torchrun) recorded with one
// `opguard record`: one file set per rank, ranks from the environment, every
// all-reduce an event whose output is the reduced gradient; diff across runs
// and across ranks of one run (docs/RECORD.md, "Multi-process runs").

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "../support/process.h"
#include "opguard/formats/recording.h"

using opguard::testing::Result;
using opguard::testing::record_argv;
using opguard::testing::run;
using opguard::testing::TempDir;
namespace fmts = opguard::formats;

namespace {

const std::string kOpguard = OPGUARD_BIN;
const std::string kPython = OPGUARD_PYTHON_BIN;
const std::string kTinyGptPy = OPGUARD_TINY_GPT_PY;
// One all-reduce per parameter tensor of ddp_example's model (embeddings 2,
// block 16, final norm 2, head 1) and one for the loss, per step.
constexpr std::size_t kAllReducesPerStep = 22;
// ddp_example trains 2 steps; its closing barrier (after the last optimizer
// step) opens a third step file that holds that collective
// (and the tensor barrier() allocates for it).
constexpr std::size_t kStepFiles = 3;

// torchrun as `python -m torch.distributed.run`: the venv's launcher without
// relying on PATH. --standalone picks a free port, so tests may run in parallel.
std::vector<std::string> ddp_example(int ranks, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> cmd = {kPython, "-m", "torch.distributed.run", "--standalone",
                                  "--nproc_per_node", std::to_string(ranks), kTinyGptPy, "--ddp",
                                  "--steps", "2", "--width", "32", "--depth", "1", "--heads", "2",
                                  "--seq", "16", "--batch", "4"};
  cmd.insert(cmd.end(), extra.begin(), extra.end());
  return cmd;
}

Result record(const TempDir& tmp, const std::string& out, const std::vector<std::string>& program,
              const std::vector<std::string>& flags = {}) {
  return run(record_argv(kOpguard, out, flags, program), tmp.path().string());
}

Result run_opguard(const TempDir& tmp, const std::vector<std::string>& args) {
  std::vector<std::string> cmd = {kOpguard};
  cmd.insert(cmd.end(), args.begin(), args.end());
  return run(cmd, tmp.path().string());
}

// Every event of one rank, in step order.
std::vector<fmts::Event> rank_events(const std::string& dir, int rank) {
  std::vector<fmts::Event> out;
  for (const auto& r : fmts::scan_recording(dir).ranks) {
    if (r.rank != rank) continue;
    for (const auto& [step, path] : r.steps) {
      fmts::StepReader reader(path);
      out.insert(out.end(), reader.events().begin(), reader.events().end());
    }
  }
  return out;
}

std::vector<const fmts::Event*> all_reduces(const std::vector<fmts::Event>& events) {
  std::vector<const fmts::Event*> out;
  for (const auto& e : events)
    if (e.op == "c10d::allreduce_") out.push_back(&e);
  return out;
}

// The gradient an all-reduce takes and gives: input 0 is the list header, 1
// its only tensor; outputs likewise.
const fmts::TensorMeta& reduced_input(const fmts::Event& e) { return e.inputs.at(1).tensor; }
const fmts::TensorMeta& reduced_output(const fmts::Event& e) { return e.outputs.at(1).tensor; }

std::vector<float> floats(const std::string& step_file, const fmts::TensorMeta& meta) {
  fmts::StepReader reader(step_file);
  fmts::TensorData data = reader.read_tensor(meta);
  REQUIRE(data.dtype == opguard::DType::kFloat32);
  std::vector<float> out(data.bytes.size() / sizeof(float));
  std::memcpy(out.data(), data.bytes.data(), data.bytes.size());
  return out;
}

// Every rank recorded with its own manifest, the same number of steps, and
// all-reduces whose outputs agree across the ranks and whose inputs do not.
void require_ranks(const std::string& dir, int ranks) {
  fmts::RecordingLayout layout = fmts::scan_recording(dir);
  REQUIRE(layout.ranks.size() == static_cast<std::size_t>(ranks));
  std::vector<std::vector<fmts::Event>> events;
  for (int r = 0; r < ranks; ++r) {
    REQUIRE(layout.ranks[r].rank == r);
    REQUIRE(layout.ranks[r].steps.size() == kStepFiles);
    {
      fmts::StepReader last(layout.ranks[r].steps.back().second);
      bool barrier = false;
      for (const auto& e : last.events()) barrier = barrier || e.op == "c10d::barrier";
      REQUIRE(barrier);
    }
    REQUIRE(layout.ranks[r].torn.empty());
    fmts::Manifest m = fmts::read_manifest(layout.ranks[r].manifest_path);
    REQUIRE(m.rank == r);
    REQUIRE(m.world_size == ranks);
    REQUIRE(m.info.at("clean_exit") == "1");
    events.push_back(rank_events(dir, r));
  }
  const auto reference = all_reduces(events[0]);
  REQUIRE(reference.size() == 2 * kAllReducesPerStep);
  std::size_t inputs_differ = 0;
  for (int r = 1; r < ranks; ++r) {
    const auto mine = all_reduces(events[r]);
    REQUIRE(mine.size() == reference.size());
    for (std::size_t i = 0; i < mine.size(); ++i) {
      REQUIRE(mine[i]->step == reference[i]->step);
      REQUIRE(reduced_output(*mine[i]).has_fingerprint());
      REQUIRE(reduced_output(*mine[i]).fingerprint == reduced_output(*reference[i]).fingerprint);
      if (reduced_input(*mine[i]).fingerprint != reduced_input(*reference[i]).fingerprint) ++inputs_differ;
    }
  }
  // Each rank's gradients come from its own shard of the batch.
  REQUIRE(inputs_differ > reference.size() / 2);
}

}  // namespace

TEST_CASE("a 2-rank Gloo run recorded with opguard record: one file set per rank, all-reduces with the summed gradient") {
  TempDir tmp;
  Result plain = run(ddp_example(2), tmp.path().string());
  INFO(plain.err);
  REQUIRE(plain.exit_code == 0);
  REQUIRE(plain.out.find("final loss bits") != std::string::npos);
  Result rec = record(tmp, tmp / "run", ddp_example(2), {"--dump-ops", "^c10d::allreduce_$"});
  INFO(rec.err);
  REQUIRE(rec.exit_code == 0);
  // The observer changes nothing: rank 0 prints the all-reduced loss.
  REQUIRE(rec.out == plain.out);
  REQUIRE(rec.err.find("recorded rank 0: 3 complete step file(s)") != std::string::npos);
  REQUIRE(rec.err.find("recorded rank 1: 3 complete step file(s)") != std::string::npos);
  require_ranks(tmp / "run", 2);

  // With full tensors: each output is, element for element, the float sum of
  // the two ranks' inputs (a + b is the same bits in either order).
  fmts::RecordingLayout layout = fmts::scan_recording(tmp / "run");
  std::size_t checked = 0, changed = 0;
  for (const auto& [step, file0] : layout.ranks[0].steps) {
    const std::string file1 = layout.ranks[1].steps.at(static_cast<std::size_t>(step)).second;
    fmts::StepReader r0(file0), r1(file1);
    const auto a = all_reduces(r0.events()), b = all_reduces(r1.events());
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      REQUIRE(reduced_input(*a[i]).data_index >= 0);
      REQUIRE(reduced_output(*a[i]).data_index >= 0);
      const std::vector<float> in0 = floats(file0, reduced_input(*a[i]));
      const std::vector<float> in1 = floats(file1, reduced_input(*b[i]));
      const std::vector<float> out0 = floats(file0, reduced_output(*a[i]));
      const std::vector<float> out1 = floats(file1, reduced_output(*b[i]));
      REQUIRE(in0.size() == in1.size());
      REQUIRE(out0.size() == in0.size());
      REQUIRE(std::memcmp(out0.data(), out1.data(), out0.size() * sizeof(float)) == 0);
      for (std::size_t k = 0; k < in0.size(); ++k) {
        const float sum = in0[k] + in1[k];
        if (std::memcmp(&sum, &out0[k], sizeof(float)) != 0) {
          INFO("all-reduce " << i << " of step " << step << ", element " << k << ": " << in0[k] << " + " << in1[k]
                             << " recorded as " << out0[k]);
          REQUIRE(false);
        }
        if (std::memcmp(&in0[k], &out0[k], sizeof(float)) != 0) ++changed;
      }
      ++checked;
    }
  }
  REQUIRE(checked == 2 * kAllReducesPerStep);
  REQUIRE(changed > 0);

  // The replicas agree on everything data-parallel replicas must agree on.
  Result cross = run_opguard(tmp, {"diff", tmp / "run", "--ranks", "0,1"});
  INFO(cross.out << cross.err);
  REQUIRE(cross.exit_code == 0);
  REQUIRE(cross.out.find("runs agree bitwise") != std::string::npos);
}

TEST_CASE("a 4-rank Gloo run: four file sets, the ranks agree, and two runs diff per rank") {
  TempDir tmp;
  Result a = record(tmp, tmp / "a", ddp_example(4));
  INFO(a.err);
  REQUIRE(a.exit_code == 0);
  require_ranks(tmp / "a", 4);
  for (const char* pair : {"0,1", "0,3", "2,3"}) {
    Result cross = run_opguard(tmp, {"diff", tmp / "a", "--ranks", pair});
    INFO(pair << "\n" << cross.out << cross.err);
    REQUIRE(cross.exit_code == 0);
  }

  // The same program again: every rank of one run is bitwise the same as that
  // rank of the other.
  Result b = record(tmp, tmp / "b", ddp_example(4));
  REQUIRE(b.exit_code == 0);
  Result same = run_opguard(tmp, {"diff", tmp / "a", tmp / "b"});
  INFO(same.out << same.err);
  REQUIRE(same.exit_code == 0);
  for (int r = 0; r < 4; ++r) {
    Result one = run_opguard(tmp, {"diff", tmp / "a", tmp / "b", "--rank", std::to_string(r)});
    REQUIRE(one.exit_code == 0);
  }

  // Another learning rate (AdamW turns it into a tensor outside the
  // dispatcher): the runs diverge at the first optimizer step of rank 0.
  Result c = record(tmp, tmp / "c", ddp_example(4, {"--lr", "2e-3"}));
  REQUIRE(c.exit_code == 0);
  Result diverged = run_opguard(tmp, {"diff", tmp / "a", tmp / "c", "--max-origins", "1"});
  INFO(diverged.out << diverged.err);
  REQUIRE(diverged.exit_code == 3);
  const std::size_t first = diverged.out.find("first divergent operator:");
  REQUIRE(first != std::string::npos);
  // Every rank diverges at the same event of step 0's optimizer phase; which
  // rank is named first among equals is not part of the contract.
  bool some_rank = false;
  for (int r = 0; r < 4; ++r) {
    const std::string where = "step 0, rank " + std::to_string(r) + ", optimizer";
    some_rank = some_rank || diverged.out.find(where, first) != std::string::npos;
  }
  REQUIRE(some_rank);
}
