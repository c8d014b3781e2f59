#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include "opguard/core/error.h"
#include "opguard/kernels/decompose.h"

using opguard::DType;
using namespace opguard::kernels;

namespace {

// 1e8 has a float32 spacing of 8, so adding 1 to it is lost: the orders that
// meet 1e8 + 1 before the cancellation lose the ones.
const std::vector<float> kRank0 = {1e8f, 1.0f, 1.0f, 1.0f};
const std::vector<float> kRank1 = {1.0f, 1e8f, 1.0f, 1.0f};
const std::vector<float> kRank2 = {-1e8f, 1.0f, 1e8f, 1.0f};
const std::vector<float> kRank3 = {1.0f, -1e8f, -1e8f, 1.0f};

std::vector<float> reduce(const ReduceSpec& spec) {
  const void* parts[] = {kRank0.data(), kRank1.data(), kRank2.data(), kRank3.data()};
  std::vector<float> out(4);
  reduce_partials(DType::kFloat32, parts, 4, 4, spec, out.data());
  return out;
}

}  // namespace

TEST_CASE("the three summation orders give their documented, different bits") {
  // Element by element (ranks 0..3):
  //   e0 = (1e8, 1, -1e8, 1)  e1 = (1, 1e8, 1, -1e8)  e2 = (1, 1, 1e8, -1e8)  e3 = ones
  // sequential: e0 ((1e8+1)-1e8)+1 = 1; e1 ((1+1e8)+1)-1e8 = 0; e2 ((1+1)+1e8)-1e8 = 0
  // tree:       e0 (1e8+1)+(-1e8+1) = 0; e1 likewise 0; e2 (1+1)+(1e8-1e8) = 2
  // ring (Gloo's): 16 bytes make 8 segments of one element, two per rank, so
  //             chunk 0 is e0,e1 summed from rank 3 down (3,2,1,0), chunk 1
  //             is e2,e3 summed 0,3,2,1; chunks 2 and 3 are empty.
  //             e0 ((1-1e8)+1)+1e8 = 0; e1 ((-1e8+1)+1e8)+1 = 1; e2 ((1-1e8)+1e8)+1 = 1
  CHECK(reduce({ReduceOrder::kSequential}) == std::vector<float>{1.0f, 0.0f, 0.0f, 4.0f});
  CHECK(reduce({ReduceOrder::kTree}) == std::vector<float>{0.0f, 0.0f, 2.0f, 4.0f});
  CHECK(reduce({ReduceOrder::kRing}) == std::vector<float>{0.0f, 1.0f, 1.0f, 4.0f});
}

TEST_CASE("ring chunks follow Gloo's segmentation") {
  // 1001 float32 over 4 ranks: 8 segments of 126 elements, two per rank.
  CHECK(ring_chunk(1001, 4, 4, 0).end == 252);
  CHECK(ring_chunk(1001, 4, 4, 3).begin == 756);
  CHECK(ring_chunk(1001, 4, 4, 3).end == 1001);
  // 7 and 5 elements over 4 ranks: 8 segments of one element; the last chunk
  // is short, or empty.
  CHECK(ring_chunk(7, 4, 4, 3).begin == 6);
  CHECK(ring_chunk(7, 4, 4, 3).end == 7);
  CHECK(ring_chunk(5, 4, 4, 2).end == 5);
  CHECK(ring_chunk(5, 4, 4, 3).begin == ring_chunk(5, 4, 4, 3).end);
  // 12,000,004 bytes exceed 8 segments of 1 MiB: 12 segments of 250,001
  // elements, three per rank (with no segment limit it would be 8).
  CHECK(ring_chunk(3000001, 4, 4, 1).begin == 750003);
  CHECK(ring_chunk(3000001, 4, 4, 1, int64_t{1} << 40).begin == 750002);
}

TEST_CASE("a reduction may write into one of its partials") {
  std::vector<float> a = {1.0f, 2.0f}, b = {3.0f, 4.0f};
  const void* parts[] = {a.data(), b.data()};
  reduce_partials(DType::kFloat32, parts, 2, 2, {ReduceOrder::kRing}, a.data());
  CHECK(a == std::vector<float>{4.0f, 6.0f});
}

TEST_CASE("bfloat16 partials round after every add") {
  // 256 in bf16 has spacing 2: 256 + 1 rounds to even (256), twice.
  const uint16_t k256 = 0x4380, k1 = 0x3f80;
  std::vector<uint16_t> r0 = {k256}, r1 = {k1}, r2 = {k1};
  const void* parts[] = {r0.data(), r1.data(), r2.data()};
  uint16_t seq = 0, tree = 0;
  reduce_partials(DType::kBFloat16, parts, 3, 1, {ReduceOrder::kSequential}, &seq);
  reduce_partials(DType::kBFloat16, parts, 3, 1, {ReduceOrder::kTree}, &tree);
  CHECK(seq == k256);           // (256 + 1) + 1 -> 256 + 1 -> 256
  CHECK(tree == k256);          // (256 + 1) + 1, tree of 3 is the same pairs
  const void* other[] = {r1.data(), r2.data(), r0.data()};
  uint16_t ones_first = 0;
  reduce_partials(DType::kBFloat16, other, 3, 1, {ReduceOrder::kSequential}, &ones_first);
  CHECK(ones_first == 0x4381);  // (1 + 1) + 256 = 258
}

TEST_CASE("shards follow torch.tensor_split") {
  // tensor_split(10, 4) -> sizes 3, 3, 2, 2.
  CHECK(shard_of(10, 4, 0).begin == 0);
  CHECK(shard_of(10, 4, 0).end == 3);
  CHECK(shard_of(10, 4, 1).end == 6);
  CHECK(shard_of(10, 4, 2).end == 8);
  CHECK(shard_of(10, 4, 3).end == 10);
  CHECK(shard_of(3, 4, 3).begin == shard_of(3, 4, 3).end);  // an empty last shard
}

TEST_CASE("a split matmul with one shard is the plain matmul, and shards change the bits") {
  // A row of K = 4 products 1e8, 1, -1e8, 1 against a column of ones.
  const std::vector<float> a = {1e8f, 1.0f, -1e8f, 1.0f};
  const std::vector<float> b = {1.0f, 1.0f, 1.0f, 1.0f};
  float one = 0, seq2 = 0, tree4 = 0;
  split_matmul(a.data(), b.data(), 1, 4, 1, 1, {ReduceOrder::kSequential}, &one);
  CHECK(one == 1.0f);  // ((1e8 + 1) - 1e8) + 1
  split_matmul(a.data(), b.data(), 1, 4, 1, 2, {ReduceOrder::kSequential}, &seq2);
  CHECK(seq2 == 0.0f);  // (1e8 + 1) + (-1e8 + 1): each shard loses its 1
  split_matmul(a.data(), b.data(), 1, 4, 1, 4, {ReduceOrder::kTree}, &tree4);
  CHECK(tree4 == 0.0f);
}

TEST_CASE("a micro-batched weight gradient depends on the micro-batch count") {
  // batch 4, in 1, out 1: dW = sum_r dy[r] x[r] with products 1e8, 1, -1e8, 1.
  const std::vector<float> x = {1e8f, 1.0f, -1e8f, 1.0f}, dy = {1.0f, 1.0f, 1.0f, 1.0f};
  float m1 = 0, m2 = 0, m4 = 0;
  split_batch_weight_grad(x.data(), dy.data(), 4, 1, 1, 1, {ReduceOrder::kSequential}, &m1);
  split_batch_weight_grad(x.data(), dy.data(), 4, 1, 1, 2, {ReduceOrder::kSequential}, &m2);
  split_batch_weight_grad(x.data(), dy.data(), 4, 1, 1, 4, {ReduceOrder::kSequential}, &m4);
  CHECK(m1 == 1.0f);
  CHECK(m2 == 0.0f);
  CHECK(m4 == 1.0f);  // micro-batches of one row: the same order as one batch
}

TEST_CASE("reduction knobs parse and reject what they do not know") {
  CHECK(reduce_order_from_name("ring") == ReduceOrder::kRing);
  CHECK(reduce_order_from_name("tree") == ReduceOrder::kTree);
  CHECK(reduce_order_from_name("sequential") == ReduceOrder::kSequential);
  CHECK_FALSE(reduce_order_from_name("butterfly").has_value());
  int32_t i = 0;
  const void* parts[] = {&i};
  CHECK_THROWS_AS(reduce_partials(DType::kInt32, parts, 1, 1, {}, &i), opguard::UsageError);
}
