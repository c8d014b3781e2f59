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

// A cut of one dimension must cut every dimension of the inputs with the same
// recorded size the same way: such dimensions are, as a rule, one dimension
// of the op seen by several arguments (mm's inner dimension, the rows of
// layer_norm's input, mean and gradient), and kernels that do not check
// their shapes read past the end of the smaller input (bisect shrink cuts
// them together for this reason).
void check_cut_together(const std::vector<InputSlice>& slices, const std::vector<formats::Value>& inputs) {
  struct Window {
    int argument, dim;
    int64_t size, start, length;
  };
  std::vector<Window> windows;
  for (int a = 0; a < static_cast<int>(inputs.size()); ++a) {
    if (inputs[a].kind != formats::ValueKind::kTensor) continue;
    const auto& sizes = inputs[a].tensor.sizes;
    for (int d = 0; d < static_cast<int>(sizes.size()); ++d)
      if (sizes[d] > 1) windows.push_back(Window{a, d, sizes[d], 0, sizes[d]});
  }
  for (std::size_t i = 0; i < slices.size(); ++i) {
    const auto& s = slices[i];
    for (std::size_t j = 0; j < i; ++j)
      if (slices[j].argument == s.argument && slices[j].dim == s.dim)
        throw UsageError(fmt::format("slice of input {}: dimension {} is cut twice", s.argument, s.dim));
    for (auto& w : windows)
      if (w.argument == s.argument && w.dim == s.dim) w.start = s.start, w.length = s.length;
  }
  for (const auto& w : windows) {
    for (const auto& o : windows) {
      if (o.size != w.size || (o.start == w.start && o.length == w.length)) continue;
      throw UsageError(fmt::format(
          "slice of input {}: dimension {} (size {}) is cut to [{}, {}) and dimension {} of input {}, of the same "
          "size, to [{}, {}); cut every dimension of that size alike ({}:{}:{}:{}), as an op reads them together",
          w.argument, w.dim, w.size, w.start, w.start + w.length, o.dim, o.argument, o.start, o.start + o.length,
          o.argument, o.dim, w.start, w.length));
    }
  }
}

}  // namespace

void apply_slices(const std::vector<InputSlice>& slices, std::vector<formats::Value>& inputs,
                  std::vector<formats::TensorData>& data) {
  for (const auto& s : slices) {
    if (s.argument < 0 || s.argument >= static_cast<int>(inputs.size()) ||
        inputs[s.argument].kind != formats::ValueKind::kTensor)
      throw UsageError(fmt::format("slice of input {}: the event has no tensor input there", s.argument));
    const auto& sizes = inputs[s.argument].tensor.sizes;
    const int ndim = static_cast<int>(sizes.size());
    if (s.dim < 0 || s.dim >= ndim)
      throw UsageError(fmt::format("slice of input {}: it has {} dimensions, not dimension {}", s.argument, ndim, s.dim));
    // Compared without s.start + s.length, which overflows for a start near 2^63.
    if (s.start < 0 || s.length < 1 || s.length > sizes[s.dim] || s.start > sizes[s.dim] - s.length)
      throw UsageError(fmt::format("slice of input {}: [{}, {} more) is outside dimension {} of size {}", s.argument,
                                   s.start, s.length, s.dim, sizes[s.dim]));
  }
  check_cut_together(slices, inputs);
  for (const auto& s : slices) {
    auto& m = inputs[s.argument].tensor;
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
