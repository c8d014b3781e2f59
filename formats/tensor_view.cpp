#include "opguard/formats/tensor_view.h"

#include <xxhash.h>

#include <algorithm>
#include <vector>

namespace opguard::formats {

BitsState bits_state(uint8_t tensor_flags) {
  if (tensor_flags & kTensorUninitialized) return BitsState::kUninitialized;
  if (tensor_flags & kTensorNotFingerprinted) return BitsState::kUnknown;
  return BitsState::kHashed;
}

BitsState bits_state(const TensorMeta& m) { return bits_state(m.flags); }

uint64_t view_geometry(DType dtype, int64_t storage_offset, const int64_t* sizes, const int64_t* strides,
                       std::size_t ndim) {
  // dtype, offset, rank, sizes, strides: at most 3 + 2 * 64 words for the
  // deepest tensors torch allows; longer ones hash their first 64 dimensions.
  int64_t words[3 + 2 * 64];
  const std::size_t nd = std::min<std::size_t>(ndim, 64);
  words[0] = static_cast<int64_t>(dtype);
  words[1] = storage_offset;
  words[2] = static_cast<int64_t>(ndim);
  for (std::size_t i = 0; i < nd; ++i) {
    words[3 + i] = sizes[i];
    words[3 + nd + i] = strides[i];
  }
  return XXH3_64bits(words, (3 + 2 * nd) * sizeof(int64_t));
}

uint64_t view_geometry(const TensorMeta& m) {
  // A TensorMeta built by hand may lack strides: they hash as 0.
  if (m.strides.size() >= m.sizes.size())
    return view_geometry(m.dtype, m.storage_offset, m.sizes.data(), m.strides.data(), m.sizes.size());
  std::vector<int64_t> strides(m.sizes.size(), 0);
  std::copy(m.strides.begin(), m.strides.end(), strides.begin());
  return view_geometry(m.dtype, m.storage_offset, m.sizes.data(), strides.data(), m.sizes.size());
}

}  // namespace opguard::formats
