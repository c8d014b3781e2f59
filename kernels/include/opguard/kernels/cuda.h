#pragma once
// The CUDA fingerprint and comparison, behind a torch-free interface. The
// library opguard_kernels_cuda always exists: built without CUDA (OPGUARD_CUDA
// off or no nvcc) cuda_built() and cuda_available() are false and the other
// calls throw opguard::Error, so callers need no #ifdef.
//
// Pointers are device pointers on the current device. Calls are synchronous
// (they return host values); work is queued on `stream` (a cudaStream_t; null
// is the legacy default stream), so pass the caller's current stream (torch's
// at::cuda::getCurrentCUDAStream()) to order after the kernels that wrote the
// data.

#include <cstdint>
#include <vector>

#include "opguard/core/error.h"
#include "opguard/kernels/compare.h"
#include "opguard/kernels/fingerprint.h"

namespace opguard::kernels {

// A CUDA runtime call failed; the message names the call and CUDA's text.
class CudaError : public Error {
 public:
  using Error::Error;
};

bool cuda_built();
// Built with CUDA and at least one device is usable (no GPU, no driver: false).
bool cuda_available();

// The fingerprint of docs/FORMAT.md (the same value fingerprint() gives on the
// CPU for the same dtype, shape and row-major bytes). view.data is a device
// pointer; sizes and strides are host arrays. Strided or unaligned views are
// gathered into row-major order on the device, in batches of at most
// 64 chunks (64 MiB of device scratch).
uint64_t fingerprint_cuda(const TensorView& view, void* stream = nullptr);

// Device buffers kept between calls of chunk_hashes_cuda (grown as needed,
// reallocated when the current device changes, freed by the destructor), so
// that a caller hashing tensor after tensor (the recorder) allocates nothing
// per tensor: cudaMalloc and cudaFree synchronise the device.
class CudaWorkspace {
 public:
  CudaWorkspace();
  ~CudaWorkspace();
  CudaWorkspace(const CudaWorkspace&) = delete;
  CudaWorkspace& operator=(const CudaWorkspace&) = delete;
  struct Impl;
  Impl* impl() { return impl_; }

 private:
  Impl* impl_;
};

// The chunk hashes of fingerprint_cuda (combine_chunk_hashes turns them into
// the fingerprint, as chunk_hashes() on the CPU), into `out`. Synchronous: it
// waits for `stream`, on which the hashes are computed after the work queued
// before them.
void chunk_hashes_cuda(const TensorView& view, std::vector<uint64_t>* out, void* stream, CudaWorkspace* workspace);

// compare_contiguous() for two device buffers of `numel` row-major elements,
// in one pass on the device.
CompareResult compare_cuda(DType dtype, const void* a, const void* b, int64_t numel, void* stream = nullptr);

}  // namespace opguard::kernels
