#pragma once
// The per-element step of the comparison (conventions in
// include/opguard/kernels/compare.h), as functions that compile both as host
// code (compare.cpp) and as CUDA device code (cuda.cu), so the CPU pass and the
// device reduction apply one definition. An Accumulator holds what one thread
// has seen; merge() combines two of them in any order (every field is a sum, a
// max or a min), which is what lets the device reduce them in a tree.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#ifdef __CUDACC__
#define OPGUARD_HD __host__ __device__ __forceinline__
#else
#define OPGUARD_HD inline
#endif

namespace opguard::kernels::element {

inline constexpr int64_t kNoIndex = INT64_MAX;

struct Accumulator {
  int64_t differing = 0;
  uint64_t max_ulp = 0;
  double max_abs = 0.0;  // never NaN: NaN cases become +Inf
  double max_rel = 0.0;
  int64_t first_index = kNoIndex;  // element index of the first differing element
  int64_t nan_a = 0, nan_b = 0, inf_a = 0, inf_b = 0;
};

OPGUARD_HD void merge(Accumulator& into, const Accumulator& other) {
  into.differing += other.differing;
  into.max_ulp = other.max_ulp > into.max_ulp ? other.max_ulp : into.max_ulp;
  into.max_abs = other.max_abs > into.max_abs ? other.max_abs : into.max_abs;
  into.max_rel = other.max_rel > into.max_rel ? other.max_rel : into.max_rel;
  into.first_index = other.first_index < into.first_index ? other.first_index : into.first_index;
  into.nan_a += other.nan_a;
  into.nan_b += other.nan_b;
  into.inf_a += other.inf_a;
  into.inf_b += other.inf_b;
}

OPGUARD_HD double infinity() { return HUGE_VAL; }
OPGUARD_HD double quiet_nan() { return NAN; }

OPGUARD_HD double from_bits64(uint64_t b) {
  double d;
  memcpy(&d, &b, 8);
  return d;
}
OPGUARD_HD double from_bits32(uint32_t b) {
  float f;
  memcpy(&f, &b, 4);
  return f;
}

// A real floating format: `Bits` holds one element.
struct F64 {
  using Bits = uint64_t;
  static constexpr Bits kSign = Bits{1} << 63;
  static OPGUARD_HD bool is_nan(Bits b) { return (b & ~kSign) > 0x7ff0000000000000ull; }
  static OPGUARD_HD bool is_inf(Bits b) { return (b & ~kSign) == 0x7ff0000000000000ull; }
  static OPGUARD_HD double value(Bits b) { return from_bits64(b); }
};
struct F32 {
  using Bits = uint32_t;
  static constexpr Bits kSign = Bits{1} << 31;
  static OPGUARD_HD bool is_nan(Bits b) { return (b & ~kSign) > 0x7f800000u; }
  static OPGUARD_HD bool is_inf(Bits b) { return (b & ~kSign) == 0x7f800000u; }
  static OPGUARD_HD double value(Bits b) { return from_bits32(b); }
};
struct F16 {
  using Bits = uint16_t;
  static constexpr Bits kSign = 0x8000;
  static OPGUARD_HD bool is_nan(Bits b) { return (b & 0x7fff) > 0x7c00; }
  static OPGUARD_HD bool is_inf(Bits b) { return (b & 0x7fff) == 0x7c00; }
  static OPGUARD_HD double value(Bits b) {
    const int exp = (b >> 10) & 0x1f, mant = b & 0x3ff;
    double v;
    if (exp == 0) v = std::ldexp(static_cast<double>(mant), -24);
    else if (exp == 31) v = mant ? quiet_nan() : infinity();
    else v = std::ldexp(static_cast<double>(mant | 0x400), exp - 25);
    return (b & kSign) ? -v : v;
  }
};
struct BF16 {
  using Bits = uint16_t;
  static constexpr Bits kSign = 0x8000;
  static OPGUARD_HD bool is_nan(Bits b) { return (b & 0x7fff) > 0x7f80; }
  static OPGUARD_HD bool is_inf(Bits b) { return (b & 0x7fff) == 0x7f80; }
  static OPGUARD_HD double value(Bits b) { return from_bits32(static_cast<uint32_t>(b) << 16); }
};
// float8 e4m3fn: bias 7, no infinities, NaN is S.1111.111.
struct F8E4M3 {
  using Bits = uint8_t;
  static constexpr Bits kSign = 0x80;
  static OPGUARD_HD bool is_nan(Bits b) { return (b & 0x7f) == 0x7f; }
  static OPGUARD_HD bool is_inf(Bits) { return false; }
  static OPGUARD_HD double value(Bits b) {
    if (is_nan(b)) return quiet_nan();
    const int exp = (b >> 3) & 0xf, mant = b & 0x7;
    const double v = exp == 0 ? std::ldexp(static_cast<double>(mant), -9) : std::ldexp(static_cast<double>(mant | 8), exp - 10);
    return (b & kSign) ? -v : v;
  }
};
// float8 e5m2: IEEE-like, bias 15.
struct F8E5M2 {
  using Bits = uint8_t;
  static constexpr Bits kSign = 0x80;
  static OPGUARD_HD bool is_nan(Bits b) { return (b & 0x7f) > 0x7c; }
  static OPGUARD_HD bool is_inf(Bits b) { return (b & 0x7f) == 0x7c; }
  static OPGUARD_HD double value(Bits b) {
    const int exp = (b >> 2) & 0x1f, mant = b & 0x3;
    double v;
    if (exp == 0) v = std::ldexp(static_cast<double>(mant), -16);
    else if (exp == 31) v = mant ? quiet_nan() : infinity();
    else v = std::ldexp(static_cast<double>(mant | 4), exp - 17);
    return (b & kSign) ? -v : v;
  }
};

inline constexpr uint64_t kUlpNaN = ~uint64_t{0};  // == kUlpInfinite in compare.h

template <typename T>
OPGUARD_HD uint64_t ulp(typename T::Bits a, typename T::Bits b) {
  const bool nan_a = T::is_nan(a), nan_b = T::is_nan(b);
  if (nan_a || nan_b) return nan_a && nan_b ? 0 : kUlpNaN;
  // Sign-magnitude to a signed integer: +0 and -0 both map to 0. Magnitudes
  // fit in 63 bits, so the difference fits in uint64.
  const int64_t ma = static_cast<int64_t>(a & static_cast<typename T::Bits>(~T::kSign));
  const int64_t mb = static_cast<int64_t>(b & static_cast<typename T::Bits>(~T::kSign));
  const int64_t ka = (a & T::kSign) ? -ma : ma, kb = (b & T::kSign) ? -mb : mb;
  return ka > kb ? static_cast<uint64_t>(ka) - static_cast<uint64_t>(kb)
                 : static_cast<uint64_t>(kb) - static_cast<uint64_t>(ka);
}

// One part (an element, or the real or imaginary half of a complex one) of
// floating format T at element index `index`.
template <typename T>
OPGUARD_HD void floating_part(typename T::Bits a, typename T::Bits b, int64_t index, Accumulator& r) {
  const bool nan_a = T::is_nan(a), nan_b = T::is_nan(b);
  const bool inf_a = T::is_inf(a), inf_b = T::is_inf(b);
  r.nan_a += nan_a;
  r.nan_b += nan_b;
  r.inf_a += inf_a;
  r.inf_b += inf_b;
  if (a == b) return;
  ++r.differing;
  if (index < r.first_index) r.first_index = index;
  const uint64_t u = ulp<T>(a, b);
  if (u > r.max_ulp) r.max_ulp = u;
  double abs_err, rel_err;
  if (nan_a || nan_b) {
    abs_err = rel_err = (nan_a && nan_b) ? 0.0 : infinity();
  } else {
    const double va = T::value(a), vb = T::value(b);
    abs_err = std::fabs(va - vb);  // inf - inf of opposite signs is inf; same signs are equal bits
    rel_err = (va == 0.0 || std::isinf(va)) ? (abs_err == 0.0 ? 0.0 : infinity()) : abs_err / std::fabs(va);
  }
  if (abs_err > r.max_abs) r.max_abs = abs_err;
  if (rel_err > r.max_rel) r.max_rel = rel_err;
}

// One element of integer type I (bool compares as uint8).
template <typename I>
OPGUARD_HD void integer_element(I a, I b, int64_t index, Accumulator& r) {
  if (a == b) return;
  ++r.differing;
  if (index < r.first_index) r.first_index = index;
  using U = std::make_unsigned_t<I>;
  // The exact distance fits in the unsigned type of the same width.
  const U d = a > b ? static_cast<U>(static_cast<U>(a) - static_cast<U>(b))
                    : static_cast<U>(static_cast<U>(b) - static_cast<U>(a));
  const double abs_err = static_cast<double>(d);
  if (abs_err > r.max_abs) r.max_abs = abs_err;
}

}  // namespace opguard::kernels::element
