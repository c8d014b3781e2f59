#pragma once
// An all-reduce replayed through NCCL across the GPUs of this machine, in one
// process (one communicator per GPU from ncclCommInitAll), to compare NCCL's
// bits with a recording and with reduce_partials' emulation (docs/KERNELS.md,
// "NCCL"). Torch-free; the library opguard_kernels_nccl always exists: built
// without NCCL (OPGUARD_NCCL off, or no CUDA) nccl_built() is false and
// nccl_allreduce throws opguard::Error.

#include <cstdint>
#include <string>
#include <vector>

#include "opguard/core/dtype.h"
#include "opguard/core/error.h"

namespace opguard::kernels {

// An NCCL or CUDA call failed; the message names the call and the library's text.
class NcclError : public Error {
 public:
  using Error::Error;
};

bool nccl_built();
// CUDA devices this process can use (0 without CUDA, a driver or a GPU).
int nccl_device_count();
// NCCL's version as "2.28.9", or "" when not built.
std::string nccl_version();

struct NcclOptions {
  // Exported as NCCL_ALGO / NCCL_PROTO before the communicators are created
  // (NCCL reads them once, there); empty leaves the environment as it is.
  std::string algo;   // e.g. "Ring", "Tree"
  std::string proto;  // e.g. "Simple", "LL", "LL128"
};

// Sums `ranks` host buffers of `numel` elements of `dtype` (float32, float64,
// float16 or bfloat16) with ncclAllReduce(ncclSum), rank r on GPU r, and
// returns every rank's result (row-major bytes). Throws UsageError when fewer
// than `ranks` GPUs are present or the dtype has no NCCL type, NcclError when
// a call fails.
std::vector<std::vector<uint8_t>> nccl_allreduce(DType dtype, const void* const* partials, int ranks, int64_t numel,
                                                 const NcclOptions& options = {});

}  // namespace opguard::kernels
