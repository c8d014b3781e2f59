#pragma once
// Which bits a recorded tensor observation stands for, shared by the two
// places that link producers to consumers through storage ids: diff's
// dataflow (bisect/dataflow.h) and free-running replay (replay/free_running.h).
//
// Two observations of one storage (TensorMeta::storage_id) with the same view
// geometry and version counter hold the same bits, unless memory was written
// outside the dispatcher: then their fingerprints disagree.

#include <cstddef>
#include <cstdint>

#include "opguard/formats/recording.h"

namespace opguard::formats {

// What a fingerprint field says about a tensor's bits.
enum class BitsState : uint8_t { kHashed, kUninitialized, kUnknown };
BitsState bits_state(const TensorMeta& m);
BitsState bits_state(uint8_t tensor_flags);  // the same from TensorMeta::flags

// Hash of dtype, storage offset, sizes and strides: which view of a storage.
// In-memory only (never written to a file).
uint64_t view_geometry(const TensorMeta& m);
// The same from a value row's columns (StepColumns): `ndim` sizes, then `ndim` strides.
uint64_t view_geometry(DType dtype, int64_t storage_offset, const int64_t* sizes, const int64_t* strides,
                       std::size_t ndim);

}  // namespace opguard::formats
