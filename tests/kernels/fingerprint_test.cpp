#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "opguard/kernels/fingerprint.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

using opguard::DType;
using namespace opguard::kernels;

namespace {

std::vector<uint8_t> random_bytes(std::size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(gen());
  return v;
}

// The definition in fingerprint.h, written out independently of the kernel.
uint64_t reference_fingerprint(DType dtype, std::vector<int64_t> sizes, const std::vector<uint8_t>& bytes) {
  std::vector<uint8_t> buf = {'O', 'G', 'F', '1', static_cast<uint8_t>(dtype), static_cast<uint8_t>(sizes.size()), 0, 0};
  for (int64_t s : sizes) {
    uint8_t le[8];
    std::memcpy(le, &s, 8);
    buf.insert(buf.end(), le, le + 8);
  }
  uint64_t n = bytes.size();
  uint8_t le[8];
  std::memcpy(le, &n, 8);
  buf.insert(buf.end(), le, le + 8);
  for (std::size_t off = 0; off < bytes.size(); off += kFingerprintChunkBytes) {
    uint64_t h = XXH3_64bits(bytes.data() + off, std::min(kFingerprintChunkBytes, bytes.size() - off));
    std::memcpy(le, &h, 8);
    buf.insert(buf.end(), le, le + 8);
  }
  return XXH3_64bits(buf.data(), buf.size());
}

}  // namespace

TEST_CASE("the fingerprint follows its written definition across chunk boundaries") {
  for (std::size_t n : {std::size_t{0}, std::size_t{4}, kFingerprintChunkBytes - 4, kFingerprintChunkBytes,
                        kFingerprintChunkBytes + 4, 3 * kFingerprintChunkBytes + 1000}) {
    auto bytes = random_bytes(n, 7);
    std::vector<int64_t> sizes = {static_cast<int64_t>(n / 4)};
    TensorView v{DType::kFloat32, sizes.data(), nullptr, 1, bytes.data()};
    REQUIRE(fingerprint(v) == reference_fingerprint(DType::kFloat32, sizes, std::vector<uint8_t>(bytes.begin(), bytes.begin() + sizes[0] * 4)));
  }
}

TEST_CASE("the fingerprint is the same for one thread and for a pool of four") {
  auto bytes = random_bytes(5 * kFingerprintChunkBytes + 12, 3);
  std::vector<int64_t> sizes = {static_cast<int64_t>(bytes.size() / 4)};
  TensorView v{DType::kInt32, sizes.data(), nullptr, 1, bytes.data()};
  HashPool pool(4);
  REQUIRE(pool.threads() == 4);
  const uint64_t one = fingerprint(v);
  for (int i = 0; i < 20; ++i) REQUIRE(fingerprint(v, &pool) == one);
}

TEST_CASE("a job that throws on a pool thread reaches the caller, and the pool goes on working") {
  HashPool pool(3);
  std::vector<int> done(64, 0);
  bool thrown = false;
  try {
    pool.parallel_for(done.size(), [&](std::size_t i) {
      if (i % 7 == 3) throw std::runtime_error("job " + std::to_string(i));
      done[i] = 1;
    });
  } catch (const std::runtime_error& e) {
    thrown = std::string(e.what()).rfind("job ", 0) == 0;
  }
  REQUIRE(thrown);
  for (std::size_t i = 0; i < done.size(); ++i) REQUIRE(done[i] == (i % 7 == 3 ? 0 : 1));
  std::vector<int> again(64, 0);
  pool.parallel_for(again.size(), [&](std::size_t i) { again[i] = 1; });
  REQUIRE(std::count(again.begin(), again.end(), 1) == 64);
}

TEST_CASE("a non-contiguous view has the fingerprint of its row-major copy") {
  // A transposed 300 x 1000 float64 matrix: 2.4 MB, so several chunks.
  const int64_t rows = 300, cols = 1000;
  std::vector<double> base(rows * cols);
  std::iota(base.begin(), base.end(), 0.5);
  std::vector<int64_t> t_sizes = {cols, rows}, t_strides = {1, cols};
  TensorView transposed{DType::kFloat64, t_sizes.data(), t_strides.data(), 2, base.data()};
  REQUIRE_FALSE(transposed.is_contiguous());
  std::vector<double> copy(rows * cols);
  gather_contiguous(transposed, copy.data());
  for (int64_t i = 0; i < cols; ++i)
    for (int64_t j = 0; j < rows; ++j) REQUIRE(copy[i * rows + j] == base[j * cols + i]);
  TensorView contiguous{DType::kFloat64, t_sizes.data(), nullptr, 2, copy.data()};
  HashPool pool(3);
  REQUIRE(fingerprint(transposed) == fingerprint(contiguous));
  REQUIRE(fingerprint(transposed, &pool) == fingerprint(contiguous));
}

namespace {

// Row-major copy of a strided view, one element at a time by index arithmetic.
std::vector<uint8_t> naive_gather(const std::vector<uint8_t>& base, std::size_t es,
                                  const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  std::vector<uint8_t> out(static_cast<std::size_t>(numel) * es);
  for (int64_t flat = 0; flat < numel; ++flat) {
    int64_t rem = flat, offset = 0;
    for (int d = static_cast<int>(sizes.size()) - 1; d >= 0; --d) {
      offset += (rem % sizes[d]) * strides[d];
      rem /= sizes[d];
    }
    std::memcpy(out.data() + flat * es, base.data() + offset * es, es);
  }
  return out;
}

}  // namespace

TEST_CASE("batched transposes of every element size gather and hash like their row-major copy") {
  // Rows that do not divide the 1 MiB chunk, matrices that end inside a
  // chunk, a single row per matrix, an expanded (stride 0) inner dimension,
  // rows so long that one gather block spans chunks, columns pages apart.
  struct Case {
    std::vector<int64_t> sizes, strides;
    int64_t base_elems;
  };
  const std::vector<Case> cases = {
      {{3, 700, 333}, {333 * 700, 1, 700}, 3 * 333 * 700},  // transpose(-1, -2) of (3, 333, 700)
      {{5, 1, 9}, {1, 1, 5}, 45},
      {{2, 3, 17, 5}, {255, 85, 1, 17}, 510},
      {{4, 64, 1000}, {64, 1, 0}, 4 * 64},  // expanded along the last dimension
      {{1031, 257}, {1, 1031}, 1031 * 257},
      {{64, 96}, {1, 64}, 64 * 96},  // whole tiles only, for every element size
      // permute(0, 2, 1, 3) of (3, 7, 5, 32): rows of 32 contiguous elements
      // (the 32- to 256-byte row copies), and of (2, 4, 3, 5): rows of 5.
      {{3, 5, 7, 32}, {1120, 32, 160, 1}, 3360},
      {{2, 3, 4, 5}, {60, 5, 15, 1}, 120},
      // t() of a (70001, 16) matrix: rows of 70001 elements, so one gather
      // block holds several chunks and ends inside one.
      {{16, 70001}, {1, 16}, 16 * 70001},
      // t() of a (700, 1024) matrix cut to 200 columns: columns 1024
      // elements apart (a page or more from 4 bytes up: the taller blocks),
      // 200 rows (a last block shorter than the others).
      {{200, 700}, {1, 1024}, 1024 * 700},
  };
  HashPool pool(3);
  for (std::size_t es : {std::size_t{1}, std::size_t{2}, std::size_t{4}, std::size_t{8}}) {
    const DType dtype = es == 1 ? DType::kUInt8 : es == 2 ? DType::kInt16 : es == 4 ? DType::kInt32 : DType::kInt64;
    for (const Case& c : cases) {
      CAPTURE(es);
      CAPTURE(c.sizes.size());
      CAPTURE(c.sizes[0]);
      const auto base = random_bytes(static_cast<std::size_t>(c.base_elems) * es, 11);
      const auto expected = naive_gather(base, es, c.sizes, c.strides);
      TensorView view{dtype, c.sizes.data(), c.strides.data(), static_cast<int>(c.sizes.size()), base.data()};
      std::vector<uint8_t> gathered(expected.size());
      gather_contiguous(view, gathered.data());
      REQUIRE(gathered == expected);
      REQUIRE(fingerprint(view) == reference_fingerprint(dtype, c.sizes, expected));
      REQUIRE(fingerprint(view, &pool) == reference_fingerprint(dtype, c.sizes, expected));
    }
  }
}

TEST_CASE("views with rows too long for a gather block hash like their row-major copy") {
  // Every other byte of 10 MB (one row of 5,000,001 elements), and t() of a
  // (300001, 20) float32 matrix (rows of 1.2 MB, 16 of which would exceed the
  // block limit): both go through the gather in chunk-sized pieces of a row.
  struct Case {
    DType dtype;
    std::size_t es;
    std::vector<int64_t> sizes, strides;
    int64_t base_elems;
  };
  const std::vector<Case> cases = {
      {DType::kUInt8, 1, {5000001}, {2}, 10000002},
      {DType::kFloat32, 4, {20, 300001}, {1, 20}, 20 * 300001},
  };
  HashPool pool(2);
  for (const Case& c : cases) {
    CAPTURE(c.es);
    const auto base = random_bytes(static_cast<std::size_t>(c.base_elems) * c.es, 5);
    const auto expected = naive_gather(base, c.es, c.sizes, c.strides);
    TensorView view{c.dtype, c.sizes.data(), c.strides.data(), static_cast<int>(c.sizes.size()), base.data()};
    REQUIRE(fingerprint(view) == reference_fingerprint(c.dtype, c.sizes, expected));
    REQUIRE(fingerprint(view, &pool) == reference_fingerprint(c.dtype, c.sizes, expected));
  }
}

TEST_CASE("a broadcast view with zero strides hashes its expanded contents") {
  std::vector<float> row = {1.f, 2.f, 3.f};
  std::vector<int64_t> sizes = {4, 3}, strides = {0, 1};
  TensorView expanded{DType::kFloat32, sizes.data(), strides.data(), 2, row.data()};
  std::vector<float> full = {1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3};
  TensorView dense{DType::kFloat32, sizes.data(), nullptr, 2, full.data()};
  REQUIRE(fingerprint(expanded) == fingerprint(dense));
}

TEST_CASE("dtype, shape and every bit change the fingerprint") {
  std::vector<float> a = {1.f, 2.f, 3.f, 4.f};
  std::vector<int64_t> s4 = {4}, s22 = {2, 2};
  const uint64_t base = fingerprint({DType::kFloat32, s4.data(), nullptr, 1, a.data()});
  REQUIRE(base != fingerprint({DType::kInt32, s4.data(), nullptr, 1, a.data()}));
  REQUIRE(base != fingerprint({DType::kFloat32, s22.data(), nullptr, 2, a.data()}));
  // Signed zero and NaN payloads count: bitwise means bitwise.
  std::vector<float> z = {0.f}, nz = {-0.f};
  std::vector<int64_t> s1 = {1};
  REQUIRE(fingerprint({DType::kFloat32, s1.data(), nullptr, 1, z.data()}) !=
          fingerprint({DType::kFloat32, s1.data(), nullptr, 1, nz.data()}));
  for (int bit = 0; bit < 32; ++bit) {
    auto b = a;
    uint32_t u;
    std::memcpy(&u, &b[2], 4);
    u ^= 1u << bit;
    std::memcpy(&b[2], &u, 4);
    REQUIRE(base != fingerprint({DType::kFloat32, s4.data(), nullptr, 1, b.data()}));
  }
}

TEST_CASE("a zero-size and a 0-d tensor have fingerprints that differ") {
  std::vector<int64_t> empty = {0};
  float one = 1.f;
  const uint64_t e = fingerprint({DType::kFloat32, empty.data(), nullptr, 1, nullptr});
  const uint64_t scalar = fingerprint({DType::kFloat32, nullptr, nullptr, 0, &one});
  REQUIRE(e != scalar);
  REQUIRE(e == reference_fingerprint(DType::kFloat32, {0}, {}));
}

TEST_CASE("the probe sees a write to any sampled line of a view's span, and nothing else moves it") {
  // A float32 view of 3000 x 7 elements, row stride 9 (a slice): its span is
  // (2999 * 9 + 6 + 1) * 4 bytes, not a multiple of the probe stride.
  std::vector<uint8_t> bytes = random_bytes(2999 * 9 * 4 + 7 * 4 + 100, 7);
  const int64_t sizes[2] = {3000, 7}, strides[2] = {9, 1};
  TensorView v{DType::kFloat32, sizes, strides, 2, bytes.data()};
  const std::size_t span = (2999 * 9 + 7) * 4;
  const uint64_t before = probe(v);
  CHECK(probe(v) == before);
  // A longer probe in between leaves nothing behind in the reused buffer.
  std::vector<uint8_t> big = random_bytes(1 << 20, 8);
  TensorView w{DType::kUInt8, nullptr, nullptr, 0, big.data()};
  const int64_t n = static_cast<int64_t>(big.size());
  w.sizes = &n;
  w.ndim = 1;
  (void)probe(w);
  CHECK(probe(v) == before);
  // Every sampled line: the first bytes of each kProbeStrideBytes, and the last.
  for (std::size_t at : {std::size_t{0}, std::size_t{63}, kProbeStrideBytes, 5 * kProbeStrideBytes + 17, span - 1,
                         span - 64}) {
    CAPTURE(at);
    bytes[at] ^= 0x40;
    CHECK(probe(v) != before);
    bytes[at] ^= 0x40;
  }
  CHECK(probe(v) == before);
  bytes[span] ^= 1;  // past the last element: not the view's memory
  CHECK(probe(v) == before);
  // A whole-tensor write (numpy's `a[:] = ...`) always shows.
  std::vector<uint8_t> copy = bytes;
  for (std::size_t i = 0; i < span; ++i) bytes[i] = static_cast<uint8_t>(bytes[i] + 1);
  CHECK(probe(v) != before);
  bytes = copy;
  // Contiguous, tiny and empty views.
  const int64_t three = 3, zero = 0;
  TensorView tiny{DType::kFloat32, &three, nullptr, 1, bytes.data()};
  const uint64_t t0 = probe(tiny);
  bytes[11] ^= 1;
  CHECK(probe(tiny) != t0);
  TensorView none{DType::kFloat32, &zero, nullptr, 1, nullptr};
  CHECK(probe(none) == 0);
}

TEST_CASE("the quick probe is the probe up to 16 strides, and beyond reads at most 18 lines spread over the span") {
  // Up to kQuickProbeLines * kProbeStrideBytes, the same lines as probe().
  for (std::size_t n : {std::size_t{100}, kProbeStrideBytes * 3 + 5, kQuickProbeLines * kProbeStrideBytes}) {
    std::vector<uint8_t> a = random_bytes(n, 3);
    const int64_t size = static_cast<int64_t>(n);
    const TensorView v{DType::kUInt8, &size, nullptr, 1, a.data()};
    CHECK(quick_probe(v) == probe(v));
  }
  // 1 MiB of float32 in a [512, 512] view: the lines at every span / 16 and
  // the last one move it; a line between them, which probe() reads, does not.
  std::vector<uint8_t> bytes = random_bytes(1 << 20, 4);
  const int64_t sizes[2] = {512, 512};
  const TensorView v{DType::kFloat32, sizes, nullptr, 2, bytes.data()};
  const uint64_t quick = quick_probe(v), full = probe(v);
  const std::size_t spread = (1 << 20) / kQuickProbeLines;
  for (std::size_t at : {std::size_t{0}, spread, 7 * spread + 63, (std::size_t{1} << 20) - 1}) {
    CAPTURE(at);
    bytes[at] ^= 0x40;
    CHECK(quick_probe(v) != quick);
    bytes[at] ^= 0x40;
  }
  bytes[kProbeStrideBytes] ^= 0x40;
  CHECK(probe(v) != full);
  CHECK(quick_probe(v) == quick);
  bytes[kProbeStrideBytes] ^= 0x40;
  // A whole-tensor write always shows.
  for (auto& b : bytes) b = static_cast<uint8_t>(b + 1);
  CHECK(quick_probe(v) != quick);
  const int64_t zero = 0;
  CHECK(quick_probe({DType::kFloat32, &zero, nullptr, 1, nullptr}) == 0);
}

TEST_CASE("stamped probe lines make a fresh buffer's probe independent of its garbage") {
  for (std::size_t n : {std::size_t{5}, std::size_t{128}, std::size_t{129}, kProbeStrideBytes * 3 + 100}) {
    CAPTURE(n);
    std::vector<uint8_t> a = random_bytes(n, 1), b = random_bytes(n, 2);
    stamp_probe_lines(a.data(), n, 0x01);
    stamp_probe_lines(b.data(), n, 0x01);
    const int64_t size = static_cast<int64_t>(n);
    TensorView va{DType::kUInt8, &size, nullptr, 1, a.data()}, vb{DType::kUInt8, &size, nullptr, 1, b.data()};
    CHECK(probe(va) == probe(vb));
    const uint64_t stamped = probe(va);
    std::memset(a.data(), 0, n);  // a whole write (numpy's a[:] = 0) shows
    CHECK(probe(va) != stamped);
  }
}

#if defined(__x86_64__)
namespace {

// XINUSE (XGETBV with ECX = 1): which parts of the vector state are not in
// their initial state. std::nullopt where the CPU does not report it.
std::optional<uint64_t> vector_state_in_use() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || (c & (1u << 27)) == 0) return std::nullopt;  // OSXSAVE
  if (!__get_cpuid_count(0xd, 1, &a, &b, &c, &d) || (a & (1u << 2)) == 0) return std::nullopt;
  uint32_t lo = 0, hi = 0;
  asm volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(1));
  return (uint64_t{hi} << 32) | lo;
}

// The upper halves of ymm0-15 (bit 2) and of zmm0-15 (bit 6).
constexpr uint64_t kUpperHalves = (1u << 2) | (1u << 6);

// Not a target("avx2") function: the compiler would end it with vzeroupper.
// Called only where the CPU has AVX2.
void dirty_upper_halves() { asm volatile("vpcmpeqd %%ymm0, %%ymm0, %%ymm0" ::: "xmm0"); }

}  // namespace

TEST_CASE("every hash returns with the upper halves of the vector registers clear") {
  // Left in use (XXH3's AVX-512 code in libxxhash 0.8.1 does not clear
  // them), every legacy-SSE instruction the thread runs next pays for it:
  // MKL's SSE2 kernels under MKL_CBWR=COMPATIBLE ran 5-6 times slower after a
  // hash on the training thread.
  const auto before = vector_state_in_use();
  if (!before || !__builtin_cpu_supports("avx2")) {
    MESSAGE("skipped: this CPU does not report which vector state is in use (XGETBV 1), or has no AVX2");
    return;
  }
  dirty_upper_halves();
  const auto dirty = vector_state_in_use();
  REQUIRE((*dirty & (1u << 2)) != 0);  // the check can see the state

  std::vector<uint8_t> bytes = random_bytes(3 * kFingerprintChunkBytes + 100, 9);
  const int64_t n = static_cast<int64_t>(bytes.size() / 4);
  const int64_t sizes[2] = {256, 128}, strides[2] = {1, 256};  // a transposed view
  const TensorView flat{DType::kFloat32, &n, nullptr, 1, bytes.data()};
  const TensorView transposed{DType::kFloat32, sizes, strides, 2, bytes.data()};
  HashPool pool(2);
  const std::vector<std::pair<const char*, std::function<void()>>> hashes = {
      {"fingerprint", [&] { (void)fingerprint(flat); }},
      {"fingerprint, a pool", [&] { (void)fingerprint(flat, &pool); }},
      {"fingerprint of a transposed view", [&] { (void)fingerprint(transposed); }},
      {"probe", [&] { (void)probe(flat); }},
      {"quick_probe", [&] { (void)quick_probe(transposed); }},
  };
  for (const auto& entry : hashes) {
    const char* name = entry.first;  // not a structured binding: clang's CAPTURE cannot capture one in C++17
    CAPTURE(name);
    dirty_upper_halves();
    entry.second();
    const auto after = vector_state_in_use();
    CHECK((*after & kUpperHalves) == 0);
  }
}
#endif
