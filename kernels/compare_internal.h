#pragma once
// Shared by the CPU comparison and the host side of the CUDA one: turns an
// accumulated pass into a CompareResult. `elem_a` and `elem_b` point at the
// first differing element's bytes (host memory; ignored when none differs).

#include <cstdint>

#include "compare_element.h"
#include "opguard/kernels/compare.h"

namespace opguard::kernels {

CompareResult compare_result(DType dtype, int64_t numel, const element::Accumulator& acc, const uint8_t* elem_a,
                             const uint8_t* elem_b);

}  // namespace opguard::kernels
