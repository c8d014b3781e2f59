#pragma once
// Walking a recorded strided view over its storage, torch-free: shared by
// execute.cpp (scattering recorded bits into a rebuilt storage) and
// free_running.cpp (keeping a window's replayed storages).

#include <cstdint>
#include <cstring>
#include <vector>

#include "opguard/formats/recording.h"

namespace opguard::replay::detail {

// Elements a storage needs for the view: offset + the last element + 1 (just
// the offset for an empty view).
inline int64_t storage_extent(const formats::TensorMeta& m) {
  int64_t extent = m.storage_offset;
  if (m.numel() > 0) {
    extent += 1;
    for (std::size_t d = 0; d < m.sizes.size() && d < m.strides.size(); ++d) extent += (m.sizes[d] - 1) * m.strides[d];
  }
  return extent;
}

// Calls fn(row_major_index, storage_index) for every element of the view, in
// row-major order. Overlapping views (stride 0) visit a storage element more
// than once.
template <typename Fn>
void for_each_element(const formats::TensorMeta& m, Fn&& fn) {
  const int ndim = static_cast<int>(m.sizes.size());
  const int64_t numel = m.numel();
  if (numel <= 0) return;
  std::vector<int64_t> index(ndim, 0);
  const int64_t inner = ndim > 0 ? m.sizes[ndim - 1] : 1;
  const int64_t inner_stride = ndim > 0 ? m.strides[ndim - 1] : 0;
  for (int64_t done = 0; done < numel; done += inner) {
    int64_t offset = m.storage_offset;
    for (int d = 0; d + 1 < ndim; ++d) offset += index[d] * m.strides[d];
    for (int64_t j = 0; j < inner; ++j) fn(done + j, offset + j * inner_stride);
    for (int d = ndim - 2; d >= 0; --d) {
      if (++index[d] < m.sizes[d]) break;
      index[d] = 0;
    }
  }
}

// Writes the view's row-major bits `src` into `storage` (element 0 of the
// storage; elements of `element_size` bytes).
inline void scatter_view(const formats::TensorMeta& m, std::size_t element_size, const uint8_t* src, uint8_t* storage) {
  const int ndim = static_cast<int>(m.sizes.size());
  if (ndim > 0 && m.strides[ndim - 1] == 1) {
    // Contiguous rows: one copy per row.
    const int64_t inner = m.sizes[ndim - 1];
    for_each_element(m, [&](int64_t i, int64_t s) {
      if (i % inner == 0) std::memcpy(storage + s * element_size, src + i * element_size, inner * element_size);
    });
    return;
  }
  for_each_element(m, [&](int64_t i, int64_t s) {
    std::memcpy(storage + s * element_size, src + i * element_size, element_size);
  });
}

}  // namespace opguard::replay::detail
