#pragma once
// A plain HDF5 file of named tensors: the inputs and expected outputs of a
// repro bundle (docs/BUNDLE.md), readable with h5py or the HDF5 C API alone.
// Each tensor is a dataset of the root group, shaped like the tensor (a scalar
// dataspace for a 0-dim tensor), holding its elements in row-major order, with
// attributes `dtype` (torch's name: "float32", "bfloat16"), `strides` and
// `storage_offset` (int64: the layout the op saw). Element types are those of
// the recording format (docs/FORMAT.md) except bfloat16, which is stored as its
// raw uint16 bits (h5py would read HDF5's custom 16-bit float as IEEE half);
// bool and float8 are raw uint8 as there too.

#include <cstdint>
#include <string>
#include <vector>

#include "opguard/core/dtype.h"

namespace opguard::formats {

struct StoredTensor {
  std::string name;  // [A-Za-z0-9_]+; the caller makes it, never from a recording
  DType dtype = DType::kFloat32;
  std::vector<int64_t> sizes, strides;
  int64_t storage_offset = 0;
  std::vector<uint8_t> bytes;  // row-major contiguous, numel * dtype_size(dtype)

  int64_t numel() const;
};

// Creates `path`, which must not exist (O_EXCL semantics: an existing file or
// symlink there is an IoError, never overwritten or followed). The root has
// the common attributes opguard_format and kind = "tensors". Throws UsageError
// for a bad name or byte count.
void write_tensor_file(const std::string& path, const std::vector<StoredTensor>& tensors);

// Creates `path` with `text`, the same way (O_EXCL | O_NOFOLLOW). Throws IoError.
void write_new_file(const std::string& path, const std::string& text, unsigned mode = 0644);

// Every dataset of the root group in name order. Throws FormatError for a file
// that is not such a tensor file, or holds more than `max_bytes` of elements.
std::vector<StoredTensor> read_tensor_file(const std::string& path, uint64_t max_bytes = uint64_t{1} << 34);

}  // namespace opguard::formats
