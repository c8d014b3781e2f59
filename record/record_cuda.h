#pragma once
// Private to record/: the entry point of libopguard_record_cuda.so
// (cuda_hash.cpp), found with dlsym by recorder.cpp. Both sides are this
// project's code, built by one compiler: C++ types cross, exceptions do not.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "opguard/kernels/fingerprint.h"

// The chunk hashes of `view` (device memory, current device) into `out`,
// computed on `stream` (a cudaStream_t) and waited for. 0, or -1 with the
// reason in `error`.
extern "C" int opguard_record_cuda_chunk_hashes(const opguard::kernels::TensorView* view, void* stream,
                                                std::vector<uint64_t>* out, char* error, std::size_t error_len);
using OpguardRecordCudaChunkHashes = decltype(&opguard_record_cuda_chunk_hashes);

#define OPGUARD_RECORD_CUDA_LIBRARY "libopguard_record_cuda.so"
#define OPGUARD_RECORD_CUDA_SYMBOL "opguard_record_cuda_chunk_hashes"
