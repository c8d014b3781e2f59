// compare_contiguous on crafted inputs whose exact answers are known. The main()
// comes from fingerprint_test.cpp (one doctest binary per stage).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "opguard/core/error.h"
#include "opguard/kernels/compare.h"

using opguard::DType;
using namespace opguard::kernels;

namespace {

uint32_t f32_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
float f32_from(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

}  // namespace

TEST_CASE("identical float32 buffers compare equal with zero metrics") {
  std::vector<float> a = {1.0f, -2.5f, 0.0f, 3e-40f};
  auto r = compare_contiguous(DType::kFloat32, a.data(), a.data(), 4);
  REQUIRE(r.equal());
  DOCTEST_CHECK(r.numel == 4);
  DOCTEST_CHECK(r.first_index == -1);
  DOCTEST_CHECK(r.max_ulp == 0);
  DOCTEST_CHECK(r.max_abs_error == 0.0);
  DOCTEST_CHECK(r.floating);
}

TEST_CASE("1.0f against nextafter(1.0f) is one differing element at 1 ULP") {
  std::vector<float> a = {0.5f, 1.0f, 2.0f};
  std::vector<float> b = a;
  b[1] = std::nextafter(1.0f, 2.0f);
  auto r = compare_contiguous(DType::kFloat32, a.data(), b.data(), 3);
  REQUIRE(r.differing == 1);
  DOCTEST_CHECK(r.max_ulp == 1);
  DOCTEST_CHECK(r.first_index == 1);
  DOCTEST_CHECK(r.first_a == 1.0);
  DOCTEST_CHECK(r.first_b == static_cast<double>(b[1]));
  DOCTEST_CHECK(r.first_a_bits == 0x3f800000u);
  DOCTEST_CHECK(r.first_b_bits == 0x3f800001u);
  // 2^-23 is one float32 ULP at 1.0.
  DOCTEST_CHECK(r.max_abs_error == std::ldexp(1.0, -23));
  DOCTEST_CHECK(r.max_rel_error == std::ldexp(1.0, -23));
  DOCTEST_CHECK(r.differing_fraction() == doctest::Approx(1.0 / 3.0));
}

TEST_CASE("-0.0 and +0.0 differ bitwise but are 0 ULP apart") {
  float a = 0.0f, b = -0.0f;
  auto r = compare_contiguous(DType::kFloat32, &a, &b, 1);
  REQUIRE(r.differing == 1);
  DOCTEST_CHECK(r.max_ulp == 0);
  DOCTEST_CHECK(r.max_abs_error == 0.0);
  DOCTEST_CHECK(r.max_rel_error == 0.0);
  DOCTEST_CHECK(r.first_b_bits == 0x80000000u);
  // The smallest subnormals of opposite signs straddle both zeros: 2 ULP.
  DOCTEST_CHECK(ulp_distance(DType::kFloat32, 0x00000001u, 0x80000001u) == 2);
}

TEST_CASE("ULP distance counts across the exponent boundary and up to infinity") {
  // 1.0f and the float just below it: 1 ULP, though the exponent changes.
  DOCTEST_CHECK(ulp_distance(DType::kFloat32, 0x3f800000u, 0x3f7fffffu) == 1);
  DOCTEST_CHECK(ulp_distance(DType::kFloat32, 0x7f7fffffu, 0x7f800000u) == 1);  // max finite vs +Inf
  DOCTEST_CHECK(ulp_distance(DType::kFloat64, 0x3ff0000000000000ull, 0x3ff0000000000003ull) == 3);
  // -1.0 vs +1.0: twice the magnitude key of 1.0.
  DOCTEST_CHECK(ulp_distance(DType::kFloat32, 0xbf800000u, 0x3f800000u) == 2ull * 0x3f800000u);
}

TEST_CASE("NaN against a number is infinitely far; two NaN payloads differ bitwise at 0 ULP") {
  const float qnan = std::numeric_limits<float>::quiet_NaN();
  const float other_nan = f32_from(0x7fc00001u);
  std::vector<float> a = {1.0f, qnan, qnan, INFINITY};
  std::vector<float> b = {qnan, other_nan, qnan, 1.0f};
  auto r = compare_contiguous(DType::kFloat32, a.data(), b.data(), 4);
  REQUIRE(r.differing == 3);
  DOCTEST_CHECK(r.max_ulp == kUlpInfinite);
  DOCTEST_CHECK(std::isinf(r.max_abs_error));
  DOCTEST_CHECK(std::isinf(r.max_rel_error));
  DOCTEST_CHECK(r.nan_a == 2);
  DOCTEST_CHECK(r.nan_b == 3);
  DOCTEST_CHECK(r.inf_a == 1);
  DOCTEST_CHECK(r.inf_b == 0);
  DOCTEST_CHECK(r.first_index == 0);

  // Only the payloads differ: bitwise different, ULP 0, error 0.
  auto p = compare_contiguous(DType::kFloat32, &qnan, &other_nan, 1);
  REQUIRE(p.differing == 1);
  DOCTEST_CHECK(p.max_ulp == 0);
  DOCTEST_CHECK(p.max_abs_error == 0.0);
  DOCTEST_CHECK(f32_bits(qnan) != f32_bits(other_nan));
}

TEST_CASE("bfloat16 and float16 bit patterns decode exactly and count ULPs") {
  // bf16: 1.0 = 0x3f80, next = 0x3f81 (1 + 2^-7); 2.0 = 0x4000.
  std::vector<uint16_t> a = {0x3f80, 0x4000, 0x0000};
  std::vector<uint16_t> b = {0x3f81, 0x4000, 0x8000};
  auto r = compare_contiguous(DType::kBFloat16, a.data(), b.data(), 3);
  REQUIRE(r.differing == 2);
  DOCTEST_CHECK(r.max_ulp == 1);
  DOCTEST_CHECK(r.first_index == 0);
  DOCTEST_CHECK(r.first_a == 1.0);
  DOCTEST_CHECK(r.first_b == 1.0 + std::ldexp(1.0, -7));
  DOCTEST_CHECK(r.max_abs_error == std::ldexp(1.0, -7));

  // fp16: 1.0 = 0x3c00, 0x3c05 is 5 ULP above; 65504 = 0x7bff, +Inf = 0x7c00;
  // smallest subnormal 0x0001 = 2^-24.
  std::vector<uint16_t> h_a = {0x3c00, 0x7bff, 0x0001};
  std::vector<uint16_t> h_b = {0x3c05, 0x7c00, 0x0001};
  auto h = compare_contiguous(DType::kFloat16, h_a.data(), h_b.data(), 3);
  REQUIRE(h.differing == 2);
  DOCTEST_CHECK(h.max_ulp == 5);
  DOCTEST_CHECK(h.first_a == 1.0);
  DOCTEST_CHECK(h.first_b == 1.0 + 5 * std::ldexp(1.0, -10));
  DOCTEST_CHECK(h.inf_b == 1);
  DOCTEST_CHECK(std::isinf(h.max_abs_error));
  DOCTEST_CHECK(bits_to_double(DType::kFloat16, 0x7bff) == 65504.0);
  DOCTEST_CHECK(bits_to_double(DType::kFloat16, 0x0001) == std::ldexp(1.0, -24));
  DOCTEST_CHECK(bits_to_double(DType::kFloat16, 0xc000) == -2.0);
}

TEST_CASE("float8 e4m3fn and e5m2 decode their extremes") {
  DOCTEST_CHECK(bits_to_double(DType::kFloat8E4M3, 0x7e) == 448.0);
  DOCTEST_CHECK(std::isnan(bits_to_double(DType::kFloat8E4M3, 0x7f)));
  DOCTEST_CHECK(bits_to_double(DType::kFloat8E4M3, 0x01) == std::ldexp(1.0, -9));
  DOCTEST_CHECK(bits_to_double(DType::kFloat8E5M2, 0x7b) == 57344.0);
  DOCTEST_CHECK(std::isinf(bits_to_double(DType::kFloat8E5M2, 0x7c)));
  DOCTEST_CHECK(ulp_distance(DType::kFloat8E4M3, 0x38, 0x3a) == 2);
}

TEST_CASE("integer and bool tensors report counts and exact absolute error") {
  std::vector<int8_t> a = {127, 0, 5};
  std::vector<int8_t> b = {-128, 0, 7};
  auto r = compare_contiguous(DType::kInt8, a.data(), b.data(), 3);
  REQUIRE(r.differing == 2);
  DOCTEST_CHECK(!r.floating);
  DOCTEST_CHECK(r.max_abs_error == 255.0);
  DOCTEST_CHECK(r.first_index == 0);
  DOCTEST_CHECK(r.first_a == 127.0);
  DOCTEST_CHECK(r.first_b == -128.0);
  DOCTEST_CHECK(r.first_b_bits == 0x80);

  std::vector<int64_t> la = {std::numeric_limits<int64_t>::min(), 3};
  std::vector<int64_t> lb = {std::numeric_limits<int64_t>::max(), 3};
  auto l = compare_contiguous(DType::kInt64, la.data(), lb.data(), 2);
  REQUIRE(l.differing == 1);
  DOCTEST_CHECK(l.max_abs_error == std::ldexp(1.0, 64));  // 2^64 - 1 rounds to 2^64 in double

  std::vector<uint8_t> ba = {1, 0, 1};
  std::vector<uint8_t> bb = {1, 1, 0};
  auto bo = compare_contiguous(DType::kBool, ba.data(), bb.data(), 3);
  REQUIRE(bo.differing == 2);
  DOCTEST_CHECK(bo.max_abs_error == 1.0);
  DOCTEST_CHECK(bo.first_index == 1);
}

TEST_CASE("complex64 compares its parts and reports the element index") {
  std::vector<float> a = {1.0f, 2.0f, 3.0f, 4.0f};  // (1,2), (3,4)
  std::vector<float> b = {1.0f, 2.0f, 3.0f, std::nextafter(4.0f, 5.0f)};
  auto r = compare_contiguous(DType::kComplex64, a.data(), b.data(), 2);
  REQUIRE(r.differing == 1);
  DOCTEST_CHECK(r.first_index == 1);
  DOCTEST_CHECK(r.max_ulp == 1);
  DOCTEST_CHECK(r.first_a == 4.0);
}

TEST_CASE("compare_contiguous rejects a negative count and null buffers") {
  float x = 0;
  bool threw = false;
  try {
    compare_contiguous(DType::kFloat32, &x, &x, -1);
  } catch (const opguard::UsageError&) {
    threw = true;
  }
  REQUIRE(threw);
  threw = false;
  try {
    compare_contiguous(DType::kFloat32, nullptr, &x, 1);
  } catch (const opguard::UsageError&) {
    threw = true;
  }
  REQUIRE(threw);
  auto empty = compare_contiguous(DType::kFloat32, nullptr, nullptr, 0);
  DOCTEST_CHECK(empty.equal());
}
