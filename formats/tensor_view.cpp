#include "opguard/formats/tensor_view.h"

#include <xxhash.h>

#include <algorithm>

namespace opguard::formats {

BitsState bits_state(const TensorMeta& m) {
  if (m.flags & kTensorUninitialized) return BitsState::kUninitialized;
  if (m.flags & kTensorNotFingerprinted) return BitsState::kUnknown;
  return BitsState::kHashed;
}

uint64_t view_geometry(const TensorMeta& m) {
  // dtype, offset, rank, sizes, strides: at most 3 + 2 * 64 words for the
  // deepest tensors torch allows; longer ones hash their first 64 dimensions.
  int64_t words[3 + 2 * 64];
  const std::size_t nd = std::min<std::size_t>(m.sizes.size(), 64);
  words[0] = static_cast<int64_t>(m.dtype);
  words[1] = m.storage_offset;
  words[2] = static_cast<int64_t>(m.sizes.size());
  for (std::size_t i = 0; i < nd; ++i) {
    words[3 + i] = m.sizes[i];
    words[3 + nd + i] = i < m.strides.size() ? m.strides[i] : 0;
  }
  return XXH3_64bits(words, (3 + 2 * nd) * sizeof(int64_t));
}

}  // namespace opguard::formats
