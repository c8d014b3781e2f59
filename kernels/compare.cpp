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
#include "compare_internal.h"

namespace opguard::kernels {
namespace {

using element::Accumulator;
using element::BF16;
using element::F16;
using element::F32;
using element::F64;
using element::F8E4M3;
using element::F8E5M2;

template <typename T>
typename T::Bits load(const uint8_t* p, int64_t i) {
  typename T::Bits b;
  std::memcpy(&b, p + i * static_cast<int64_t>(sizeof(b)), sizeof(b));
  return b;
}

// `parts` parts of format T; element index = part index / parts_per_element.
template <typename T>
void compare_float(const uint8_t* pa, const uint8_t* pb, int64_t parts, int parts_per_element, Accumulator& r) {
  for (int64_t i = 0; i < parts; ++i) element::floating_part<T>(load<T>(pa, i), load<T>(pb, i), i / parts_per_element, r);
}

template <typename I>
void compare_int(const uint8_t* pa, const uint8_t* pb, int64_t n, Accumulator& r) {
  for (int64_t i = 0; i < n; ++i) {
    I a, b;
    std::memcpy(&a, pa + i * static_cast<int64_t>(sizeof(I)), sizeof(I));
    std::memcpy(&b, pb + i * static_cast<int64_t>(sizeof(I)), sizeof(I));
    element::integer_element<I>(a, b, i, r);
  }
}

}  // namespace

uint64_t ulp_distance(DType dtype, uint64_t a, uint64_t b) {
  switch (dtype) {
    case DType::kFloat64: return element::ulp<F64>(a, b);
    case DType::kFloat32: return element::ulp<F32>(static_cast<uint32_t>(a), static_cast<uint32_t>(b));
    case DType::kFloat16: return element::ulp<F16>(static_cast<uint16_t>(a), static_cast<uint16_t>(b));
    case DType::kBFloat16: return element::ulp<BF16>(static_cast<uint16_t>(a), static_cast<uint16_t>(b));
    case DType::kFloat8E4M3: return element::ulp<F8E4M3>(static_cast<uint8_t>(a), static_cast<uint8_t>(b));
    case DType::kFloat8E5M2: return element::ulp<F8E5M2>(static_cast<uint8_t>(a), static_cast<uint8_t>(b));
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

CompareResult compare_result(DType dtype, int64_t numel, const element::Accumulator& acc, const uint8_t* elem_a,
                             const uint8_t* elem_b) {
  CompareResult r;
  r.dtype = dtype;
  r.numel = numel;
  r.floating = dtype_is_floating(dtype) || dtype_is_complex(dtype);
  r.differing = acc.differing;
  r.max_ulp = acc.max_ulp;
  r.max_abs_error = acc.max_abs;
  r.max_rel_error = acc.max_rel;
  r.nan_a = acc.nan_a;
  r.nan_b = acc.nan_b;
  r.inf_a = acc.inf_a;
  r.inf_b = acc.inf_b;
  if (acc.first_index == element::kNoIndex) return r;
  r.first_index = acc.first_index;
  // Complex elements report their first differing part.
  const bool complex = dtype_is_complex(dtype);
  const DType part = dtype == DType::kComplex64 ? DType::kFloat32 : dtype == DType::kComplex128 ? DType::kFloat64 : dtype;
  const std::size_t part_size = dtype_size(part);
  for (int p = 0; p < (complex ? 2 : 1); ++p) {
    uint64_t a = 0, b = 0;
    std::memcpy(&a, elem_a + p * part_size, part_size);
    std::memcpy(&b, elem_b + p * part_size, part_size);
    if (a == b) continue;
    r.first_a_bits = a;
    r.first_b_bits = b;
    r.first_a = bits_to_double(part, a);
    r.first_b = bits_to_double(part, b);
    break;
  }
  return r;
}

CompareResult compare_contiguous(DType dtype, const void* a, const void* b, int64_t numel) {
  if (numel < 0) throw UsageError("compare_contiguous needs a non-negative element count");
  if (numel > 0 && (a == nullptr || b == nullptr)) throw UsageError("compare_contiguous got a null buffer");
  Accumulator r;
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
  const std::size_t es = dtype_size(dtype);
  const int64_t first = r.first_index == element::kNoIndex ? 0 : r.first_index;
  return compare_result(dtype, numel, r, pa + first * static_cast<int64_t>(es), pb + first * static_cast<int64_t>(es));
}

}  // namespace opguard::kernels
