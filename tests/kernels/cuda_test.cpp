// The CUDA fingerprint and comparison: their host-side reference against the
// CPU path (always), and the device code against the CPU path (only where a
// GPU is present; elsewhere each GPU case says it was skipped).

#include <doctest/doctest.h>
#include <xxhash.h>

#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#ifdef OPGUARD_TEST_CUDA
#include <cuda_runtime.h>
#endif

#include "compare_element.h"
#include "cuda_reference.h"
#include "opguard/kernels/compare.h"
#include "opguard/kernels/cuda.h"
#include "opguard/kernels/fingerprint.h"
#include "xxh3_portable.h"

using opguard::DType;
using namespace opguard::kernels;

namespace {

std::vector<uint8_t> random_bytes(std::size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(gen());
  return v;
}

// One tensor case: a storage and a view into it.
struct Case {
  std::string name;
  DType dtype;
  std::vector<int64_t> sizes, strides;  // strides empty: contiguous
  int64_t offset = 0;                   // elements
  std::vector<uint8_t> storage;

  TensorView view() const {
    return TensorView{dtype, sizes.data(), strides.empty() ? nullptr : strides.data(), static_cast<int>(sizes.size()),
                      storage.data() + offset * static_cast<int64_t>(opguard::dtype_size(dtype))};
  }
};

// Every dtype in contiguous shapes (scalar, empty, odd, several chunks) and
// non-contiguous views (transposed, stepped slice at an offset, expanded).
std::vector<Case> cases() {
  std::vector<Case> out;
  uint32_t seed = 1;
  for (int d = 0; d < opguard::kNumDTypes; ++d) {
    const auto dtype = static_cast<DType>(d);
    const int64_t es = static_cast<int64_t>(opguard::dtype_size(dtype));
    const int64_t big = static_cast<int64_t>(2 * kFingerprintChunkBytes) / es + 13;  // 3 chunks, last one short
    auto add = [&](std::string name, std::vector<int64_t> sizes, std::vector<int64_t> strides, int64_t offset,
                   int64_t storage_elems) {
      out.push_back({std::string(opguard::dtype_name(dtype)) + " " + name, dtype, std::move(sizes), std::move(strides),
                     offset, random_bytes(static_cast<std::size_t>(storage_elems * es), seed++)});
    };
    add("scalar", {}, {}, 0, 1);
    add("empty", {0}, {}, 0, 0);
    add("empty 3x0x5", {3, 0, 5}, {}, 0, 0);
    add("7", {7}, {}, 0, 7);
    add("odd 61x37", {61, 37}, {}, 0, 61 * 37);
    add("three chunks", {big}, {}, 0, big);
    add("transposed 37x61", {37, 61}, {1, 37}, 0, 61 * 37);
    add("stepped slice", {big / 3}, {3}, 1, big);
    add("expanded 5x1000", {5, 1000}, {0, 1}, 0, 1000);
    add("transposed three chunks", {big / 517, 517}, {1, big / 517}, 0, big);
  }
  return out;
}

#ifdef OPGUARD_TEST_CUDA
void cuda_ok(cudaError_t e) { REQUIRE_MESSAGE(e == cudaSuccess, cudaGetErrorString(e)); }

// Device copy of a host buffer, freed at scope end.
struct DeviceCopy {
  void* ptr = nullptr;
  explicit DeviceCopy(const void* host, std::size_t n) {
    cuda_ok(cudaMalloc(&ptr, n == 0 ? 1 : n));
    if (n > 0) cuda_ok(cudaMemcpy(ptr, host, n, cudaMemcpyHostToDevice));
  }
  ~DeviceCopy() { cudaFree(ptr); }
};
#endif

bool gpu_or_skip(const char* what) {
  if (cuda_available()) return true;
  const std::string line = std::string("SKIPPED (no GPU") + (cuda_built() ? "" : "; built without CUDA") + "): " + what;
  MESSAGE(line);
  return false;
}

}  // namespace

TEST_CASE("the portable XXH3-64 equals libxxhash for every length class") {
  const auto bytes = random_bytes(3 * kFingerprintChunkBytes + 64, 42);
  // Odd start: the portable loads need no alignment.
  for (std::size_t n = 0; n <= 4200; ++n) {
    const uint64_t got = xxh3::hash(bytes.data() + 1, n);
    if (got != XXH3_64bits(bytes.data() + 1, n)) REQUIRE_MESSAGE(false, "length " << n);
  }
  for (std::size_t n : {kFingerprintChunkBytes - 1, kFingerprintChunkBytes, kFingerprintChunkBytes + 1,
                        3 * kFingerprintChunkBytes + 63})
    REQUIRE(xxh3::hash(bytes.data(), n) == XXH3_64bits(bytes.data(), n));
}

TEST_CASE("the host reference of the CUDA fingerprint equals the CPU fingerprint for every dtype and layout") {
  HashPool pool(3);
  for (const auto& c : cases()) {
    INFO(c.name);
    const uint64_t cpu = fingerprint(c.view());
    REQUIRE(fingerprint_reference(c.view()) == cpu);
    REQUIRE(fingerprint(c.view(), &pool) == cpu);
  }
}

TEST_CASE("comparison accumulators merged from any split equal one pass") {
  // float32 with the awkward values: signed zeros, NaN payloads, infinities.
  std::vector<float> a(1000), b(1000);
  std::mt19937 gen(5);
  std::normal_distribution<float> dist;
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = b[i] = dist(gen);
  const float inf = std::numeric_limits<float>::infinity();
  b[17] = -0.0f, a[17] = 0.0f;
  a[100] = std::numeric_limits<float>::quiet_NaN();
  b[300] = inf;
  a[500] = -inf, b[500] = inf;
  b[999] = std::nextafter(a[999], inf);
  const CompareResult whole = compare_contiguous(DType::kFloat32, a.data(), b.data(), 1000);
  REQUIRE(whole.differing == 5);
  element::Accumulator merged;
  for (int64_t begin : {900, 0, 250, 600}) {  // any order, as the device merges
    element::Accumulator part;
    const int64_t end = begin == 900 ? 1000 : begin == 0 ? 250 : begin == 250 ? 600 : 900;
    for (int64_t i = begin; i < end; ++i) {
      uint32_t x, y;
      std::memcpy(&x, &a[static_cast<std::size_t>(i)], 4);
      std::memcpy(&y, &b[static_cast<std::size_t>(i)], 4);
      element::floating_part<element::F32>(x, y, i, part);
    }
    element::merge(merged, part);
  }
  REQUIRE(merged.differing == whole.differing);
  REQUIRE(merged.first_index == whole.first_index);
  REQUIRE(merged.max_ulp == whole.max_ulp);
  REQUIRE(merged.max_abs == whole.max_abs_error);
  REQUIRE(merged.max_rel == whole.max_rel_error);
  REQUIRE(merged.nan_a == whole.nan_a);
  REQUIRE(merged.inf_b == whole.inf_b);
}

TEST_CASE("without CUDA the CUDA entry points say how to get them") {
  if (cuda_built()) {
    MESSAGE("built with CUDA; cuda_available() = " << cuda_available());
    REQUIRE(true);
    return;
  }
  REQUIRE_FALSE(cuda_available());
  std::vector<int64_t> sizes = {1};
  float x = 1.0f;
  REQUIRE_THROWS_AS(fingerprint_cuda(TensorView{DType::kFloat32, sizes.data(), nullptr, 1, &x}), opguard::Error);
  CudaWorkspace workspace;
  std::vector<uint64_t> chunks;
  REQUIRE_THROWS_AS(chunk_hashes_cuda(TensorView{DType::kFloat32, sizes.data(), nullptr, 1, &x}, &chunks, nullptr,
                                      &workspace),
                    opguard::Error);
}

TEST_CASE("the CUDA fingerprint equals the CPU fingerprint for every dtype and layout") {
  if (!gpu_or_skip("CUDA fingerprint agreement")) return;
#ifdef OPGUARD_TEST_CUDA
  for (const auto& c : cases()) {
    INFO(c.name);
    DeviceCopy dev(c.storage.data(), c.storage.size());
    TensorView v = c.view();
    v.data = static_cast<const uint8_t*>(dev.ptr) + (static_cast<const uint8_t*>(v.data) - c.storage.data());
    REQUIRE(fingerprint_cuda(v) == fingerprint(c.view()));
  }
  // A contiguous view at an odd byte address takes the gather path.
  const auto bytes = random_bytes(kFingerprintChunkBytes + 301, 9);
  DeviceCopy dev(bytes.data(), bytes.size());
  std::vector<int64_t> sizes = {static_cast<int64_t>(kFingerprintChunkBytes + 300)};
  REQUIRE(fingerprint_cuda({DType::kUInt8, sizes.data(), nullptr, 1, static_cast<uint8_t*>(dev.ptr) + 1}) ==
          fingerprint({DType::kUInt8, sizes.data(), nullptr, 1, bytes.data() + 1}));
#endif
}

TEST_CASE("one CUDA workspace hashes view after view like the CPU (the recorder's use)") {
  if (!gpu_or_skip("CUDA workspace reuse")) return;
#ifdef OPGUARD_TEST_CUDA
  // Every case twice through one workspace, in an order that grows and
  // shrinks its buffers between contiguous and gathered views.
  CudaWorkspace workspace;
  std::vector<uint64_t> device_chunks, host_chunks;
  for (int round = 0; round < 2; ++round) {
    for (const auto& c : cases()) {
      INFO(c.name << ", round " << round);
      DeviceCopy dev(c.storage.data(), c.storage.size());
      TensorView v = c.view();
      v.data = static_cast<const uint8_t*>(dev.ptr) + (static_cast<const uint8_t*>(v.data) - c.storage.data());
      chunk_hashes_cuda(v, &device_chunks, nullptr, &workspace);
      chunk_hashes(c.view(), &host_chunks);
      REQUIRE(device_chunks == host_chunks);
    }
  }
#endif
}

TEST_CASE("the CUDA comparison equals the CPU comparison for every dtype") {
  if (!gpu_or_skip("CUDA comparison agreement")) return;
#ifdef OPGUARD_TEST_CUDA
  for (int d = 0; d < opguard::kNumDTypes; ++d) {
    const auto dtype = static_cast<DType>(d);
    INFO(opguard::dtype_name(dtype));
    const std::size_t es = opguard::dtype_size(dtype);
    for (int64_t n : {0, 1, 1000, 300001}) {
      auto a = random_bytes(static_cast<std::size_t>(n) * es, 11 + d);
      auto b = a;
      // Flip a low bit in a few elements, and a whole random element in others.
      for (int64_t i = 7; i < n; i += 9973) b[static_cast<std::size_t>(i) * es] ^= 1;
      for (int64_t i = 501; i < n; i += 30011) std::memset(&b[static_cast<std::size_t>(i) * es], 0xff, es);
      DeviceCopy da(a.data(), a.size()), db(b.data(), b.size());
      const CompareResult cpu = compare_contiguous(dtype, a.data(), b.data(), n);
      const CompareResult gpu = compare_cuda(dtype, da.ptr, db.ptr, n);
      REQUIRE(gpu.differing == cpu.differing);
      REQUIRE(gpu.first_index == cpu.first_index);
      REQUIRE(gpu.first_a_bits == cpu.first_a_bits);
      REQUIRE(gpu.first_b_bits == cpu.first_b_bits);
      REQUIRE(gpu.max_ulp == cpu.max_ulp);
      REQUIRE(gpu.max_abs_error == cpu.max_abs_error);
      REQUIRE(gpu.max_rel_error == cpu.max_rel_error);
      REQUIRE(gpu.nan_a == cpu.nan_a);
      REQUIRE(gpu.nan_b == cpu.nan_b);
      REQUIRE(gpu.inf_a == cpu.inf_a);
      REQUIRE(gpu.inf_b == cpu.inf_b);
      REQUIRE(gpu.floating == cpu.floating);
    }
  }
#endif
}
