// Slicing recorded inputs (ReplayOptions::slices) before a trial: the bytes
// are row-major, so a slice along one dimension copies, for every index of
// the dimensions before it, one contiguous run of `length` inner blocks.

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "opguard/core/error.h"
#include "replay_internal.h"

namespace opguard::replay::detail {
namespace {

// Dense strides for `sizes`, the dimensions nested in the order of `old`
// (largest stride outermost; ties keep the dimension order).
std::vector<int64_t> dense_strides_like(const std::vector<int64_t>& sizes, const std::vector<int64_t>& old) {
  const std::size_t n = sizes.size();
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  if (old.size() == n)
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return old[a] > old[b]; });
  std::vector<int64_t> strides(n, 1);
  int64_t s = 1;
  for (std::size_t k = n; k-- > 0;) {
    strides[order[k]] = s;
    s *= std::max<int64_t>(sizes[order[k]], 1);
  }
  return strides;
}

void slice_bytes(formats::TensorData& d, std::size_t elem, const std::vector<int64_t>& sizes, int dim, int64_t start,
                 int64_t length) {
  int64_t outer = 1, inner = 1;
  for (int k = 0; k < dim; ++k) outer *= sizes[k];
  for (std::size_t k = dim + 1; k < sizes.size(); ++k) inner *= sizes[k];
  const std::size_t block = static_cast<std::size_t>(inner) * elem;
  std::vector<uint8_t> out(static_cast<std::size_t>(outer * length) * block);
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(out.data() + static_cast<std::size_t>(o * length) * block,
                d.bytes.data() + static_cast<std::size_t>(o * sizes[dim] + start) * block,
                static_cast<std::size_t>(length) * block);
  d.bytes = std::move(out);
}

}  // namespace

void apply_slices(const std::vector<InputSlice>& slices, std::vector<formats::Value>& inputs,
                  std::vector<formats::TensorData>& data) {
  for (const auto& s : slices) {
    if (s.argument < 0 || s.argument >= static_cast<int>(inputs.size()) ||
        inputs[s.argument].kind != formats::ValueKind::kTensor)
      throw UsageError(fmt::format("slice of input {}: the event has no tensor input there", s.argument));
    auto& m = inputs[s.argument].tensor;
    const int ndim = static_cast<int>(m.sizes.size());
    if (s.dim < 0 || s.dim >= ndim)
      throw UsageError(fmt::format("slice of input {}: it has {} dimensions, not dimension {}", s.argument, ndim, s.dim));
    if (s.start < 0 || s.length < 1 || s.start + s.length > m.sizes[s.dim])
      throw UsageError(fmt::format("slice of input {}: [{}, {}) is outside dimension {} of size {}", s.argument,
                                   s.start, s.start + s.length, s.dim, m.sizes[s.dim]));
    auto& d = data[s.argument];
    if (!d.bytes.empty()) {
      OPGUARD_CHECK(d.bytes.size() == static_cast<std::size_t>(m.numel()) * dtype_size(m.dtype));
      slice_bytes(d, dtype_size(m.dtype), m.sizes, s.dim, s.start, s.length);
    }
    auto sizes = m.sizes;
    sizes[s.dim] = s.length;
    m.strides = dense_strides_like(sizes, m.strides);
    m.sizes = sizes;
    m.storage_offset = 0;
    d.sizes = sizes;
  }
}

}  // namespace opguard::replay::detail
