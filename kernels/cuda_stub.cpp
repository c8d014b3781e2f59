// opguard_kernels_cuda built without CUDA: every entry point says so.
#include "opguard/kernels/cuda.h"

namespace opguard::kernels {

namespace {
[[noreturn]] void not_built() {
  throw Error("opguard was built without CUDA kernels: reconfigure with -DOPGUARD_CUDA=ON where nvcc is installed");
}
}  // namespace

bool cuda_built() { return false; }
bool cuda_available() { return false; }
uint64_t fingerprint_cuda(const TensorView&, void*) { not_built(); }
struct CudaWorkspace::Impl {};
CudaWorkspace::CudaWorkspace() : impl_(nullptr) {}
CudaWorkspace::~CudaWorkspace() = default;
void chunk_hashes_cuda(const TensorView&, std::vector<uint64_t>*, void*, CudaWorkspace*) { not_built(); }
CompareResult compare_cuda(DType, const void*, const void*, int64_t, void*) { not_built(); }

}  // namespace opguard::kernels
