#include "opguard/core/dtype.h"

#include <array>

#include "opguard/core/error.h"

namespace opguard {
namespace {

struct DTypeInfo {
  std::string_view name;
  std::size_t size;
};

constexpr std::array<DTypeInfo, kNumDTypes> kInfo = {{
    {"float64", 8},   {"float32", 4},    {"float16", 2},   {"bfloat16", 2},  {"int8", 1},
    {"int16", 2},     {"int32", 4},      {"int64", 8},     {"uint8", 1},     {"bool", 1},
    {"complex64", 8}, {"complex128", 16}, {"uint16", 2},   {"uint32", 4},    {"uint64", 8},
    {"float8_e4m3fn", 1}, {"float8_e5m2", 1},
}};

const DTypeInfo& info(DType d) {
  auto i = static_cast<std::size_t>(d);
  OPGUARD_CHECK(i < kInfo.size());
  return kInfo[i];
}

}  // namespace

std::size_t dtype_size(DType d) { return info(d).size; }
std::string_view dtype_name(DType d) { return info(d).name; }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (std::size_t i = 0; i < kInfo.size(); ++i) {
    if (kInfo[i].name == name) return static_cast<DType>(i);
  }
  return std::nullopt;
}

bool dtype_is_floating(DType d) {
  switch (d) {
    case DType::kFloat64:
    case DType::kFloat32:
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2:
      return true;
    default:
      return false;
  }
}

bool dtype_is_complex(DType d) { return d == DType::kComplex64 || d == DType::kComplex128; }

}  // namespace opguard
