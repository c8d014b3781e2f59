// compare_contiguous: one pass over two element arrays (conventions in
// compare.h). Elements are read with memcpy, so unaligned buffers from HDF5
// reads are fine.

#include "opguard/kernels/compare.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "opguard/core/error.h"

namespace opguard::kernels {
namespace {

// A real floating format: `Bits` holds one element; `kSignBit` its sign.
struct F64 {
  using Bits = uint64_t;
  static constexpr Bits kSign = Bits{1} << 63;
  static bool is_nan(Bits b) { return (b & ~kSign) > 0x7ff0000000000000ull; }
  static bool is_inf(Bits b) { return (b & ~kSign) == 0x7ff0000000000000ull; }
  static double value(Bits b) {
    double d;
    std::memcpy(&d, &b, 8);
    return d;
  }
};
struct F32 {
  using Bits = uint32_t;
  static constexpr Bits kSign = Bits{1} << 31;
  static bool is_nan(Bits b) { return (b & ~kSign) > 0x7f800000u; }
  static bool is_inf(Bits b) { return (b & ~kSign) == 0x7f800000u; }
  static double value(Bits b) {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  }
};
struct F16 {
  using Bits = uint16_t;
  static constexpr Bits kSign = 0x8000;
  static bool is_nan(Bits b) { return (b & 0x7fff) > 0x7c00; }
  static bool is_inf(Bits b) { return (b & 0x7fff) == 0x7c00; }
  static double value(Bits b) {
    const int exp = (b >> 10) & 0x1f, mant = b & 0x3ff;
    double v;
    if (exp == 0) v = std::ldexp(static_cast<double>(mant), -24);
    else if (exp == 31) v = mant ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
    else v = std::ldexp(static_cast<double>(mant | 0x400), exp - 25);
    return (b & kSign) ? -v : v;
  }
};
struct BF16 {
  using Bits = uint16_t;
  static constexpr Bits kSign = 0x8000;
  static bool is_nan(Bits b) { return (b & 0x7fff) > 0x7f80; }
  static bool is_inf(Bits b) { return (b & 0x7fff) == 0x7f80; }
  static double value(Bits b) { return F32::value(static_cast<uint32_t>(b) << 16); }
};
// float8 e4m3fn: bias 7, no infinities, NaN is S.1111.111.
struct F8E4M3 {
  using Bits = uint8_t;
  static constexpr Bits kSign = 0x80;
  static bool is_nan(Bits b) { return (b & 0x7f) == 0x7f; }
  static bool is_inf(Bits) { return false; }
  static double value(Bits b) {
    if (is_nan(b)) return std::numeric_limits<double>::quiet_NaN();
    const int exp = (b >> 3) & 0xf, mant = b & 0x7;
    double v = exp == 0 ? std::ldexp(static_cast<double>(mant), -9) : std::ldexp(static_cast<double>(mant | 8), exp - 10);
    return (b & kSign) ? -v : v;
  }
};
// float8 e5m2: IEEE-like, bias 15.
struct F8E5M2 {
  using Bits = uint8_t;
  static constexpr Bits kSign = 0x80;
  static bool is_nan(Bits b) { return (b & 0x7f) > 0x7c; }
  static bool is_inf(Bits b) { return (b & 0x7f) == 0x7c; }
  static double value(Bits b) {
    const int exp = (b >> 2) & 0x1f, mant = b & 0x3;
    double v;
    if (exp == 0) v = std::ldexp(static_cast<double>(mant), -16);
    else if (exp == 31) v = mant ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
    else v = std::ldexp(static_cast<double>(mant | 4), exp - 17);
    return (b & kSign) ? -v : v;
  }
};

template <typename T>
uint64_t ulp(typename T::Bits a, typename T::Bits b) {
  const bool nan_a = T::is_nan(a), nan_b = T::is_nan(b);
  if (nan_a || nan_b) return nan_a && nan_b ? 0 : kUlpInfinite;
  // Sign-magnitude to a signed integer: +0 and -0 both map to 0.
  auto key = [](typename T::Bits x) -> int64_t {
    const int64_t mag = static_cast<int64_t>(x & static_cast<typename T::Bits>(~T::kSign));
    return (x & T::kSign) ? -mag : mag;
  };
  const int64_t ka = key(a), kb = key(b);
  // Magnitudes fit in 63 bits, so the difference fits in uint64.
  return ka > kb ? static_cast<uint64_t>(ka) - static_cast<uint64_t>(kb)
                 : static_cast<uint64_t>(kb) - static_cast<uint64_t>(ka);
}

template <typename T>
typename T::Bits load(const uint8_t* p, int64_t i) {
  typename T::Bits b;
  std::memcpy(&b, p + i * static_cast<int64_t>(sizeof(b)), sizeof(b));
  return b;
}

constexpr double kInf = std::numeric_limits<double>::infinity();

// `parts` elements of format T; element index = part index / parts_per_element.
template <typename T>
void compare_float(const uint8_t* pa, const uint8_t* pb, int64_t parts, int parts_per_element, CompareResult& r) {
  r.floating = true;
  for (int64_t i = 0; i < parts; ++i) {
    const auto a = load<T>(pa, i), b = load<T>(pb, i);
    if (a == b) {
      if (T::is_nan(a)) ++r.nan_a, ++r.nan_b;
      else if (T::is_inf(a)) ++r.inf_a, ++r.inf_b;
      continue;
    }
    const bool nan_a = T::is_nan(a), nan_b = T::is_nan(b);
    r.nan_a += nan_a;
    r.nan_b += nan_b;
    r.inf_a += T::is_inf(a);
    r.inf_b += T::is_inf(b);
    ++r.differing;
    const double va = T::value(a), vb = T::value(b);
    if (r.first_index < 0) {
      r.first_index = i / parts_per_element;
      r.first_a = va;
      r.first_b = vb;
      r.first_a_bits = a;
      r.first_b_bits = b;
    }
    const uint64_t u = ulp<T>(a, b);
    if (u > r.max_ulp) r.max_ulp = u;
    double abs_err, rel_err;
    if (nan_a || nan_b) {
      abs_err = rel_err = (nan_a && nan_b) ? 0.0 : kInf;
    } else {
      abs_err = std::fabs(va - vb);  // inf - inf of opposite signs is inf; same signs are equal bits
      rel_err = (va == 0.0 || std::isinf(va)) ? (abs_err == 0.0 ? 0.0 : kInf) : abs_err / std::fabs(va);
    }
    if (abs_err > r.max_abs_error) r.max_abs_error = abs_err;
    if (rel_err > r.max_rel_error) r.max_rel_error = rel_err;
  }
}

template <typename I>
void compare_int(const uint8_t* pa, const uint8_t* pb, int64_t n, CompareResult& r) {
  using U = std::make_unsigned_t<I>;
  for (int64_t i = 0; i < n; ++i) {
    I a, b;
    std::memcpy(&a, pa + i * static_cast<int64_t>(sizeof(I)), sizeof(I));
    std::memcpy(&b, pb + i * static_cast<int64_t>(sizeof(I)), sizeof(I));
    if (a == b) continue;
    ++r.differing;
    if (r.first_index < 0) {
      r.first_index = i;
      r.first_a = static_cast<double>(a);
      r.first_b = static_cast<double>(b);
      r.first_a_bits = static_cast<U>(a);
      r.first_b_bits = static_cast<U>(b);
    }
    // The exact distance fits in the unsigned type of the same width.
    const U d = a > b ? static_cast<U>(static_cast<U>(a) - static_cast<U>(b))
                      : static_cast<U>(static_cast<U>(b) - static_cast<U>(a));
    const double abs_err = static_cast<double>(d);
    if (abs_err > r.max_abs_error) r.max_abs_error = abs_err;
  }
}

}  // namespace

uint64_t ulp_distance(DType dtype, uint64_t a, uint64_t b) {
  switch (dtype) {
    case DType::kFloat64: return ulp<F64>(a, b);
    case DType::kFloat32: return ulp<F32>(static_cast<uint32_t>(a), static_cast<uint32_t>(b));
    case DType::kFloat16: return ulp<F16>(static_cast<uint16_t>(a), static_cast<uint16_t>(b));
    case DType::kBFloat16: return ulp<BF16>(static_cast<uint16_t>(a), static_cast<uint16_t>(b));
    case DType::kFloat8E4M3: return ulp<F8E4M3>(static_cast<uint8_t>(a), static_cast<uint8_t>(b));
    case DType::kFloat8E5M2: return ulp<F8E5M2>(static_cast<uint8_t>(a), static_cast<uint8_t>(b));
    default:
      throw UsageError(std::string("ULP distance is defined for real floating dtypes only, not ") +
                       std::string(dtype_name(dtype)));
  }
}

double bits_to_double(DType dtype, uint64_t bits) {
  switch (dtype) {
    case DType::kFloat64: return F64::value(bits);
    case DType::kFloat32: return F32::value(static_cast<uint32_t>(bits));
    case DType::kFloat16: return F16::value(static_cast<uint16_t>(bits));
    case DType::kBFloat16: return BF16::value(static_cast<uint16_t>(bits));
    case DType::kFloat8E4M3: return F8E4M3::value(static_cast<uint8_t>(bits));
    case DType::kFloat8E5M2: return F8E5M2::value(static_cast<uint8_t>(bits));
    case DType::kInt8: return static_cast<int8_t>(bits);
    case DType::kInt16: return static_cast<int16_t>(bits);
    case DType::kInt32: return static_cast<int32_t>(bits);
    case DType::kInt64: return static_cast<double>(static_cast<int64_t>(bits));
    default: return static_cast<double>(bits);
  }
}

CompareResult compare_contiguous(DType dtype, const void* a, const void* b, int64_t numel) {
  if (numel < 0) throw UsageError("compare_contiguous needs a non-negative element count");
  if (numel > 0 && (a == nullptr || b == nullptr)) throw UsageError("compare_contiguous got a null buffer");
  CompareResult r;
  r.dtype = dtype;
  r.numel = numel;
  const auto* pa = static_cast<const uint8_t*>(a);
  const auto* pb = static_cast<const uint8_t*>(b);
  switch (dtype) {
    case DType::kFloat64: compare_float<F64>(pa, pb, numel, 1, r); break;
    case DType::kFloat32: compare_float<F32>(pa, pb, numel, 1, r); break;
    case DType::kFloat16: compare_float<F16>(pa, pb, numel, 1, r); break;
    case DType::kBFloat16: compare_float<BF16>(pa, pb, numel, 1, r); break;
    case DType::kFloat8E4M3: compare_float<F8E4M3>(pa, pb, numel, 1, r); break;
    case DType::kFloat8E5M2: compare_float<F8E5M2>(pa, pb, numel, 1, r); break;
    case DType::kComplex64: compare_float<F32>(pa, pb, numel * 2, 2, r); break;
    case DType::kComplex128: compare_float<F64>(pa, pb, numel * 2, 2, r); break;
    case DType::kInt8: compare_int<int8_t>(pa, pb, numel, r); break;
    case DType::kInt16: compare_int<int16_t>(pa, pb, numel, r); break;
    case DType::kInt32: compare_int<int32_t>(pa, pb, numel, r); break;
    case DType::kInt64: compare_int<int64_t>(pa, pb, numel, r); break;
    case DType::kUInt8: compare_int<uint8_t>(pa, pb, numel, r); break;
    case DType::kUInt16: compare_int<uint16_t>(pa, pb, numel, r); break;
    case DType::kUInt32: compare_int<uint32_t>(pa, pb, numel, r); break;
    case DType::kUInt64: compare_int<uint64_t>(pa, pb, numel, r); break;
    case DType::kBool: compare_int<uint8_t>(pa, pb, numel, r); break;
  }
  return r;
}

}  // namespace opguard::kernels
