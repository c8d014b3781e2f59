#pragma once
// Element types opguard stores. The numeric codes are part of the recording
// format (docs/FORMAT.md): never renumber, only append.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace opguard {

enum class DType : uint8_t {
  kFloat64 = 0,
  kFloat32 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kInt8 = 4,
  kInt16 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kUInt8 = 8,
  kBool = 9,
  kComplex64 = 10,
  kComplex128 = 11,
  kUInt16 = 12,
  kUInt32 = 13,
  kUInt64 = 14,
  kFloat8E4M3 = 15,
  kFloat8E5M2 = 16,
};
constexpr int kNumDTypes = 17;

std::size_t dtype_size(DType d);
// Short names as torch prints them without the prefix: "float32", "bfloat16".
std::string_view dtype_name(DType d);
std::optional<DType> dtype_from_name(std::string_view name);
bool dtype_is_floating(DType d);  // real floating point (not complex)
bool dtype_is_complex(DType d);

}  // namespace opguard
