#pragma once
// Host-side reference of the CUDA fingerprint: the same chunking, the same
// XXH3 lane decomposition (xxh3_portable.h compiled as host code) and the same
// combine, without a GPU. Tests hold it equal to fingerprint() and to
// libxxhash, so that on a machine without a GPU the device algorithm is still
// checked everywhere except its thread mapping.

#include <cstdint>

#include "opguard/kernels/fingerprint.h"

namespace opguard::kernels {

uint64_t fingerprint_reference(const TensorView& view);

}  // namespace opguard::kernels
