// libopguard_record_cuda.so: the recorder's CUDA fingerprint. It links the
// CUDA runtime, which a CPU-only torch does not ship, so libopguard_record.so
// does not link it: recorder.cpp loads this module (dlopen, from its own
// directory) at the first CUDA tensor it hashes, when torch has already loaded
// the runtime. No torch here: the caller passes the device pointer and
// torch's current stream.

#include <cstdio>
#include <exception>
#include <vector>

#include "opguard/kernels/cuda.h"
#include "record_cuda.h"

extern "C" int opguard_record_cuda_chunk_hashes(const opguard::kernels::TensorView* view, void* stream,
                                                std::vector<uint64_t>* out, char* error, std::size_t error_len) {
  try {
    thread_local opguard::kernels::CudaWorkspace workspace;
    opguard::kernels::chunk_hashes_cuda(*view, out, stream, &workspace);
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(error, error_len, "%s", e.what());
    return -1;
  }
}
