#include "opguard/kernels/decompose.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "opguard/core/error.h"

namespace opguard::kernels {
namespace {

float bf16_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even; NaN stays NaN (quietened), as c10::BFloat16 does.
uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Element type adapters: load, add with one rounding, store.
struct Float {
  using T = float;
  static T add(T a, T b) { return a + b; }
};
struct Double {
  using T = double;
  static T add(T a, T b) { return a + b; }
};
struct BFloat {
  using T = uint16_t;
  static T add(T a, T b) { return float_to_bf16(bf16_to_float(a) + bf16_to_float(b)); }
};

template <typename E>
typename E::T load(const void* p, int64_t i) {
  typename E::T v;
  std::memcpy(&v, static_cast<const uint8_t*>(p) + i * static_cast<int64_t>(sizeof(v)), sizeof(v));
  return v;
}

template <typename E>
typename E::T sum_in_order(const void* const* partials, const int* order, int ranks, int64_t i) {
  auto acc = load<E>(partials[order[0]], i);
  for (int r = 1; r < ranks; ++r) acc = E::add(acc, load<E>(partials[order[r]], i));
  return acc;
}

template <typename E>
typename E::T sum_tree(const void* const* partials, int ranks, int64_t i) {
  std::vector<typename E::T> level(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) level[static_cast<std::size_t>(r)] = load<E>(partials[r], i);
  while (level.size() > 1) {
    std::vector<typename E::T> next;
    for (std::size_t j = 0; j + 1 < level.size(); j += 2) next.push_back(E::add(level[j], level[j + 1]));
    if (level.size() % 2 == 1) next.push_back(level.back());
    level.swap(next);
  }
  return level[0];
}

template <typename E>
void reduce(const void* const* partials, int ranks, int64_t numel, const ReduceSpec& spec, void* out) {
  // Results go to a temporary first: `out` may alias a partial.
  std::vector<typename E::T> result(static_cast<std::size_t>(numel));
  std::vector<int> order(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) order[static_cast<std::size_t>(r)] = r;
  for (int c = 0; c < (spec.order == ReduceOrder::kRing ? ranks : 1); ++c) {
    Shard chunk{0, numel};
    if (spec.order == ReduceOrder::kRing) {
      chunk = ring_chunk(numel, static_cast<int64_t>(sizeof(typename E::T)), ranks, c, spec.ring_max_segment_bytes);
      // Chunk c travels c-1 -> c-2 -> ... -> c; each rank adds its own
      // partial to what it received (addition commutes bitwise, so "own +
      // received" is the same as the left fold in this order).
      for (int r = 0; r < ranks; ++r) order[static_cast<std::size_t>(r)] = ((c - 1 - r) % ranks + ranks) % ranks;
    }
    for (int64_t i = chunk.begin; i < chunk.end; ++i)
      result[static_cast<std::size_t>(i)] = spec.order == ReduceOrder::kTree ? sum_tree<E>(partials, ranks, i)
                                                                              : sum_in_order<E>(partials, order.data(), ranks, i);
  }
  if (numel > 0) std::memcpy(out, result.data(), result.size() * sizeof(typename E::T));
}

}  // namespace

std::string_view reduce_order_name(ReduceOrder order) {
  switch (order) {
    case ReduceOrder::kSequential: return "sequential";
    case ReduceOrder::kRing: return "ring";
    case ReduceOrder::kTree: return "tree";
  }
  return "?";
}

std::optional<ReduceOrder> reduce_order_from_name(std::string_view name) {
  for (auto o : {ReduceOrder::kSequential, ReduceOrder::kRing, ReduceOrder::kTree})
    if (reduce_order_name(o) == name) return o;
  return std::nullopt;
}

Shard shard_of(int64_t n, int parts, int i) {
  OPGUARD_CHECK(parts >= 1 && i >= 0 && i < parts);
  const int64_t base = n / parts, extra = n % parts;
  const int64_t begin = i * base + (i < extra ? i : extra);
  return {begin, begin + base + (i < extra ? 1 : 0)};
}

Shard ring_chunk(int64_t numel, int64_t element_size, int ranks, int c, int64_t max_segment_bytes) {
  OPGUARD_CHECK(ranks >= 1 && c >= 0 && c < ranks && element_size > 0 && numel >= 0);
  // gloo/allreduce.cc, ring(): the segment size is a whole number of elements,
  // and the segment count a multiple of the rank count, at least twice it.
  const int64_t max_segment = element_size * std::max<int64_t>(1, max_segment_bytes / element_size);
  const int64_t bytes = numel * element_size;
  int64_t segments = std::max<int64_t>((bytes + max_segment - 1) / max_segment, 2 * int64_t{ranks});
  segments = (segments + ranks - 1) / ranks * ranks;
  const int64_t per_rank = segments / ranks;
  const int64_t segment_elems = (numel + segments - 1) / segments;
  const int64_t begin = std::min(numel, c * per_rank * segment_elems);
  return {begin, std::min(numel, (c + 1) * per_rank * segment_elems)};
}

void reduce_partials(DType dtype, const void* const* partials, int ranks, int64_t numel, const ReduceSpec& spec,
                     void* out) {
  if (ranks < 1) throw UsageError("a reduction needs at least one rank");
  if (numel < 0) throw UsageError("a reduction needs a non-negative element count");
  switch (dtype) {
    case DType::kFloat32: reduce<Float>(partials, ranks, numel, spec, out); return;
    case DType::kFloat64: reduce<Double>(partials, ranks, numel, spec, out); return;
    case DType::kBFloat16: reduce<BFloat>(partials, ranks, numel, spec, out); return;
    default:
      throw UsageError("emulated reductions support float32, float64 and bfloat16, not " +
                       std::string(dtype_name(dtype)));
  }
}

void split_matmul(const float* a, const float* b, int64_t m, int64_t k, int64_t n, int ranks, const ReduceSpec& spec,
                  float* c) {
  if (ranks < 1) throw UsageError("tp needs at least one shard");
  std::vector<std::vector<float>> partial(static_cast<std::size_t>(ranks), std::vector<float>(static_cast<std::size_t>(m * n)));
  std::vector<const void*> ptrs;
  for (int r = 0; r < ranks; ++r) {
    const Shard s = shard_of(k, ranks, r);
    auto& p = partial[static_cast<std::size_t>(r)];
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        float acc = 0.0f;
        for (int64_t q = s.begin; q < s.end; ++q) acc += a[i * k + q] * b[q * n + j];
        p[static_cast<std::size_t>(i * n + j)] = acc;
      }
    ptrs.push_back(p.data());
  }
  reduce_partials(DType::kFloat32, ptrs.data(), ranks, m * n, spec, c);
}

void split_batch_weight_grad(const float* x, const float* dy, int64_t batch, int64_t in, int64_t out,
                             int microbatches, const ReduceSpec& spec, float* dw) {
  if (microbatches < 1) throw UsageError("microbatches needs at least one micro-batch");
  std::vector<std::vector<float>> partial(static_cast<std::size_t>(microbatches),
                                          std::vector<float>(static_cast<std::size_t>(out * in)));
  std::vector<const void*> ptrs;
  for (int mb = 0; mb < microbatches; ++mb) {
    const Shard s = shard_of(batch, microbatches, mb);
    auto& p = partial[static_cast<std::size_t>(mb)];
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) {
        float acc = 0.0f;
        for (int64_t r = s.begin; r < s.end; ++r) acc += dy[r * out + o] * x[r * in + i];
        p[static_cast<std::size_t>(o * in + i)] = acc;
      }
    ptrs.push_back(p.data());
  }
  reduce_partials(DType::kFloat32, ptrs.data(), microbatches, out * in, spec, dw);
}

}  // namespace opguard::kernels
