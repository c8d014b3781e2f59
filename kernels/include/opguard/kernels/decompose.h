#pragma once
// Parallel decompositions emulated on one device (docs/KERNELS.md). A
// tensor-parallel matmul splits its reduction dimension K into P shards, each
// rank computes a partial product, and an all-reduce sums the partials; a
// data-parallel (or accumulated) gradient sums per-micro-batch gradients.
// The bits depend on the order of those sums, which is what these functions
// fix. Replay exposes them as knobs tp=P, reduce=sequential|ring|tree,
// microbatches=M.
//
// Orders, for partials p_0 .. p_{P-1} (every add rounds to the dtype):
//   sequential  ((p_0 + p_1) + p_2) + ... + p_{P-1}          (gradient accumulation)
//   tree        pairwise by rank: (p_0 + p_1) + (p_2 + p_3), and so on up; an
//               odd one out at a level moves up unchanged
//   ring        Gloo's ring all-reduce (gloo/allreduce.cc, the algorithm c10d's
//               ProcessGroupGloo runs for CPU tensors): the bytes are cut into
//               S = roundup(max(ceil(bytes / 1 MiB), 2P), P) segments of
//               ceil(numel / S) elements (the last ones shorter or empty);
//               chunk c is segments [c S/P, (c+1) S/P) and is reduce-scattered
//               along the ring r -> r-1 starting at rank c-1, so its elements are
//               p_{c-1}, then p_{c-2} + that, ..., then p_c + that (ranks mod P).
//               Validated bit for bit against a real 2- and 4-process Gloo run
//               (tests/kernels/gloo_validate.py, CTest kernels_gloo); NCCL's
//               rings on GPUs are only modelled by it (docs/KERNELS.md).

#include <cstdint>
#include <optional>
#include <string_view>

#include "opguard/core/dtype.h"

namespace opguard::kernels {

enum class ReduceOrder : uint8_t { kSequential, kRing, kTree };

std::string_view reduce_order_name(ReduceOrder order);
std::optional<ReduceOrder> reduce_order_from_name(std::string_view name);

struct ReduceSpec {
  ReduceOrder order = ReduceOrder::kSequential;
  // ring only: Gloo's AllreduceOptions::kMaxSegmentSize, which sets the
  // segment count and so where chunks begin.
  int64_t ring_max_segment_bytes = int64_t{1} << 20;
};

// Sums `ranks` buffers of `numel` elements of `dtype` (float32, float64 or
// bfloat16; bfloat16 adds in float and rounds to nearest even after every add,
// as c10::BFloat16 does) into `out`, in the order of `spec`. `out` may alias
// a partial. Throws opguard::UsageError for another dtype or ranks < 1.
void reduce_partials(DType dtype, const void* const* partials, int ranks, int64_t numel, const ReduceSpec& spec,
                     void* out);

// The shard of a dimension of length `n` split `parts` ways that part `i`
// gets, as torch.tensor_split cuts it: [begin, end).
struct Shard {
  int64_t begin = 0, end = 0;
};
Shard shard_of(int64_t n, int parts, int i);

// The elements of chunk `c` (the chunk rank c ends up owning) of a ring
// all-reduce of `numel` elements of `element_size` bytes over `ranks` ranks,
// as described above.
Shard ring_chunk(int64_t numel, int64_t element_size, int ranks, int c,
                 int64_t max_segment_bytes = int64_t{1} << 20);

// C[m][n] = sum_k A[m][k] B[k][n] (row-major float32) with K split into
// `ranks` shards: each partial is a plain k-ascending dot product over its
// shard, then reduce_partials. A torch-free model of a tensor-parallel
// row-parallel linear; replay computes the partials with the real operator.
void split_matmul(const float* a, const float* b, int64_t m, int64_t k, int64_t n, int ranks, const ReduceSpec& spec,
                  float* c);

// The weight gradient of y = x W^T over a batch of `batch` rows,
// dW[o][i] = sum_r dy[r][o] x[r][i], with the batch split into `microbatches`
// micro-batches: each micro-batch's gradient is a row-ascending sum, and the
// micro-batch gradients are summed in the order of `spec` (sequential for
// gradient accumulation, ring or tree for a data-parallel all-reduce).
void split_batch_weight_grad(const float* x, const float* dy, int64_t batch, int64_t in, int64_t out,
                             int microbatches, const ReduceSpec& spec, float* dw);

}  // namespace opguard::kernels
