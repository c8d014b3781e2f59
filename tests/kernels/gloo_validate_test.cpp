// kernels/decompose against a real distributed run: gloo_validate.py runs 2
// and 4 processes with c10d's Gloo backend on this machine, each all-reducing
// its partial matmul, its data-parallel weight gradient and raw partials of
// several sizes and dtypes, plus a gradient accumulated over micro-batches by
// autograd. reduce_partials must give the reduced bits exactly, in the order
// each case names (ring for Gloo, sequential for accumulation), and the other
// orders must not: otherwise the data could not tell the orders apart.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cstring>

#include "../support/process.h"
#include "opguard/core/dtype.h"
#include "opguard/kernels/decompose.h"

using opguard::testing::read_file;
using opguard::testing::run;
using opguard::testing::TempDir;
namespace kernels = opguard::kernels;

namespace {

struct Run {
  TempDir tmp;
  nlohmann::json cases = nlohmann::json::array();
  Run() {
    const auto r = run({OPGUARD_PYTHON_BIN, OPGUARD_GLOO_SCRIPT, "--out", tmp / "out", "--world", "2", "--world", "4"},
                       tmp.path().string());
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    for (const char* w : {"2", "4"}) {
      const auto meta = nlohmann::json::parse(read_file(tmp / (std::string("out/cases_w") + w + ".json")));
      for (const auto& c : meta["cases"]) cases.push_back(c);
    }
  }
  std::string bytes(const nlohmann::json& c, int rank, const char* kind) const {
    return read_file(tmp / ("out/" + c["name"].get<std::string>() + "_w" + std::to_string(c["world"].get<int>()) +
                            "_r" + std::to_string(rank) + "_" + kind + ".bin"));
  }
};

const Run& the_run() {
  static Run r;
  return r;
}

std::string reduced_by(const Run& run, const nlohmann::json& c, kernels::ReduceSpec spec) {
  const int world = c["world"].get<int>();
  const auto dtype = opguard::dtype_from_name(c["dtype"].get<std::string>());
  REQUIRE(dtype.has_value());
  std::vector<std::string> parts;
  std::vector<const void*> ptrs;
  for (int r = 0; r < world; ++r) parts.push_back(run.bytes(c, r, "partial"));
  for (const auto& p : parts) ptrs.push_back(p.data());
  std::string out(parts.front().size(), '\0');
  kernels::reduce_partials(*dtype, ptrs.data(), world, c["numel"].get<int64_t>(), spec, out.data());
  return out;
}

}  // namespace

TEST_CASE("every case of the Gloo run is reproduced bit for bit by the order it names") {
  const Run& run = the_run();
  REQUIRE(run.cases.size() >= 20);
  for (const auto& c : run.cases) {
    const std::string label = c["name"].get<std::string>() + " world " + std::to_string(c["world"].get<int>());
    INFO(label);
    const std::string reduced = run.bytes(c, 0, "reduced");
    REQUIRE(reduced.size() == run.bytes(c, 0, "partial").size());
    for (int r = 1; r < c["world"].get<int>(); ++r) CHECK(run.bytes(c, r, "reduced") == reduced);  // every rank agrees
    const auto order = kernels::reduce_order_from_name(c["order"].get<std::string>());
    REQUIRE(order.has_value());
    CHECK(reduced_by(run, c, {*order}) == reduced);
    if (c.contains("view_partial_equal")) CHECK(c["view_partial_equal"].get<bool>());
  }
}

TEST_CASE("with four ranks the other orders give other bits, so the run tells them apart") {
  const Run& run = the_run();
  int checked = 0;
  for (const auto& c : run.cases) {
    if (c["world"].get<int>() != 4 || c["numel"].get<int64_t>() < 1000) continue;
    INFO(c["name"].get<std::string>());
    const std::string reduced = run.bytes(c, 0, "reduced");
    const auto named = *kernels::reduce_order_from_name(c["order"].get<std::string>());
    for (auto other : {kernels::ReduceOrder::kSequential, kernels::ReduceOrder::kRing, kernels::ReduceOrder::kTree})
      if (other != named) CHECK(reduced_by(run, c, {other}) != reduced);
    // Gloo's chunk boundaries depend on its 1 MiB segment limit: the 12 MB case
    // has 12 segments where an unlimited segment size would make 8.
    if (c["name"] == "raw_f32_segmented") {
      kernels::ReduceSpec unlimited;
      unlimited.order = kernels::ReduceOrder::kRing;
      unlimited.ring_max_segment_bytes = int64_t{1} << 40;
      CHECK(reduced_by(run, c, unlimited) != reduced);
    }
    ++checked;
  }
  CHECK(checked >= 8);
}
