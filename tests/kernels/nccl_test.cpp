// The NCCL all-reduce replay (kernels/nccl.h). Needs two or more GPUs; with
// fewer, every GPU case says "SKIPPED" and only the refusal is checked.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "opguard/kernels/decompose.h"
#include "opguard/kernels/nccl.h"

namespace kernels = opguard::kernels;
using opguard::DType;

namespace {

int gpus_or_skip(const char* what) {
  const int n = kernels::nccl_device_count();
  if (kernels::nccl_built() && n >= 2) return n;
  const std::string line = "SKIPPED (" + std::to_string(n) + " GPU(s)" +
                           (kernels::nccl_built() ? "" : "; built without NCCL") + ", needs 2): " + what;
  MESSAGE(line);
  std::fprintf(stderr, "%s\n", line.c_str());
  return 0;
}

std::vector<std::vector<float>> partials(int ranks, int64_t numel, bool integers) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<std::vector<float>> p(static_cast<std::size_t>(ranks), std::vector<float>(static_cast<std::size_t>(numel)));
  for (auto& v : p)
    for (auto& x : v) x = integers ? static_cast<float>(static_cast<int>(u(rng) * 1000.0f)) : u(rng) * 8.0f;
  return p;
}

}  // namespace

TEST_CASE("an all-reduce over more ranks than GPUs is refused with the count") {
  const int n = kernels::nccl_device_count();
  std::vector<float> x(4, 1.0f);
  std::vector<const void*> ptrs(static_cast<std::size_t>(n + 1), x.data());
  if (kernels::nccl_built()) {
    CHECK_THROWS_AS(kernels::nccl_allreduce(DType::kFloat32, ptrs.data(), n + 1, 4), opguard::UsageError);
  } else {
    CHECK_THROWS_AS(kernels::nccl_allreduce(DType::kFloat32, ptrs.data(), n + 1, 4), opguard::Error);
  }
  CHECK_THROWS_AS(kernels::nccl_allreduce(DType::kInt32, ptrs.data(), 1, 4), opguard::Error);
}

TEST_CASE("NCCL sums integer-valued partials exactly, the same bits on every rank") {
  const int gpus = gpus_or_skip("NCCL exact all-reduce");
  if (gpus == 0) return;
  const int64_t numel = 1 << 20;
  auto p = partials(gpus, numel, true);
  std::vector<const void*> ptrs;
  for (const auto& v : p) ptrs.push_back(v.data());
  const auto out = kernels::nccl_allreduce(DType::kFloat32, ptrs.data(), gpus, numel);
  std::vector<float> want(static_cast<std::size_t>(numel));
  kernels::reduce_partials(DType::kFloat32, ptrs.data(), gpus, numel, {kernels::ReduceOrder::kSequential}, want.data());
  for (const auto& r : out) CHECK(std::memcmp(r.data(), want.data(), r.size()) == 0);
}

TEST_CASE("NCCL's bits against the emulated orders, per NCCL_ALGO and NCCL_PROTO (reported; ranks must agree)") {
  const int gpus = gpus_or_skip("NCCL vs emulation");
  if (gpus == 0) return;
  MESSAGE("NCCL " << kernels::nccl_version() << ", " << gpus << " GPUs");
  const int64_t numel = (1 << 22) + 3;
  auto p = partials(gpus, numel, false);
  std::vector<const void*> ptrs;
  for (const auto& v : p) ptrs.push_back(v.data());
  for (const char* algo : {"Ring", "Tree"}) {
    for (const char* proto : {"Simple", "LL", "LL128"}) {
      std::vector<std::vector<uint8_t>> out;
      try {
        out = kernels::nccl_allreduce(DType::kFloat32, ptrs.data(), gpus, numel, {algo, proto});
      } catch (const kernels::NcclError& e) {
        MESSAGE(algo << "/" << proto << ": " << e.what());
        continue;
      }
      for (const auto& r : out) CHECK(r == out.front());
      std::string line = std::string(algo) + "/" + proto + ":";
      for (auto order : {kernels::ReduceOrder::kSequential, kernels::ReduceOrder::kRing, kernels::ReduceOrder::kTree}) {
        std::vector<float> want(static_cast<std::size_t>(numel));
        kernels::ReduceSpec spec;
        spec.order = order;
        kernels::reduce_partials(DType::kFloat32, ptrs.data(), gpus, numel, spec, want.data());
        int64_t differing = 0;
        const auto* got = reinterpret_cast<const float*>(out.front().data());
        for (int64_t i = 0; i < numel; ++i) differing += std::memcmp(&got[i], &want[static_cast<std::size_t>(i)], 4) != 0;
        line += " " + std::string(kernels::reduce_order_name(order)) + " differs in " + std::to_string(differing);
      }
      MESSAGE(line);
      std::printf("%s of %lld elements\n", line.c_str(), static_cast<long long>(numel));
    }
  }
}
