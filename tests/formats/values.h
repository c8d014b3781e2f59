#pragma once
// Test support for the formats tests: building event values by hand.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "opguard/formats/recording.h"

namespace opguard::testing {

// A tensor value with no full data (data_index -1, flags 0).
inline formats::Value tensor_value(const std::string& name, DType dtype, std::vector<int64_t> sizes,
                                   std::vector<int64_t> strides, uint64_t fingerprint) {
  formats::Value v;
  v.kind = formats::ValueKind::kTensor;
  v.name = name;
  v.tensor.dtype = dtype;
  v.tensor.sizes = std::move(sizes);
  v.tensor.strides = std::move(strides);
  v.tensor.fingerprint = fingerprint;
  return v;
}

}  // namespace opguard::testing
