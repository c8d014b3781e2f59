// opguard_kernels_nccl built without NCCL: every entry point says so.
#include "opguard/kernels/nccl.h"

namespace opguard::kernels {

bool nccl_built() { return false; }
int nccl_device_count() { return 0; }
std::string nccl_version() { return ""; }

std::vector<std::vector<uint8_t>> nccl_allreduce(DType, const void* const*, int, int64_t, const NcclOptions&) {
  throw Error("opguard was built without NCCL: reconfigure with -DOPGUARD_CUDA=ON -DOPGUARD_NCCL=ON where the CUDA "
              "toolkit and NCCL are installed");
}

}  // namespace opguard::kernels
