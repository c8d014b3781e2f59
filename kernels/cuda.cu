// CUDA fingerprint and comparison (interface in include/opguard/kernels/cuda.h).
//
// Fingerprint: one thread block per 1 MiB chunk. A chunk longer than 240 bytes
// is XXH3's long path: 256 threads cover 32 of its 1 KiB blocks at a time, one
// thread per (block, lane) summing that lane's 16 stripe terms; then 8 threads
// (one per lane) run the scramble chain over the 32 sums, in order. The lane
// arithmetic is xxh3_portable.h's, shared with the host reference, so the two
// cannot drift. Chunk hashes go back to the host, where combine_chunk_hashes
// (fingerprint.cpp) finishes exactly as on the CPU.
//
// Comparison: a grid-stride pass, one element::Accumulator per thread, a tree
// reduction per block; the host merges the per-block results (all fields are
// sums, maxima or minima, so the order does not matter).

#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include "compare_element.h"
#include "compare_internal.h"
#include "opguard/kernels/cuda.h"
#include "xxh3_portable.h"

namespace opguard::kernels {
namespace {

void check(cudaError_t e, const char* call) {
  if (e != cudaSuccess) throw CudaError(std::string(call) + " failed: " + cudaGetErrorString(e));
}

// Device memory owned for the duration of one call.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) {
    if (bytes > 0) check(cudaMalloc(&ptr_, bytes), "cudaMalloc");
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
};

constexpr int kHashThreads = 256;
constexpr int kGroups = kHashThreads / 8;  // XXH3 blocks per tile
constexpr std::size_t kBatchChunks = 64;   // gather scratch: 64 MiB

__global__ void hash_chunks(const uint8_t* base, std::size_t nbytes, uint64_t* out) {
  namespace x = xxh3;
  const std::size_t off = static_cast<std::size_t>(blockIdx.x) * kFingerprintChunkBytes;
  const std::size_t len = min(kFingerprintChunkBytes, nbytes - off);
  const uint8_t* in = base + off;
  if (len <= x::kMidSizeMax) {
    if (threadIdx.x == 0) out[blockIdx.x] = x::hash_short(in, len);
    return;
  }
  __shared__ uint64_t sums[kGroups][8];
  __shared__ uint64_t finals[8];
  const int lane = threadIdx.x & 7;
  const int group = threadIdx.x >> 3;
  uint64_t keys[x::kStripesPerBlock];
  for (std::size_t s = 0; s < x::kStripesPerBlock; ++s) keys[s] = x::secret64(8 * (s + lane));
  const std::size_t blocks = x::full_blocks(len);
  uint64_t acc = x::lane_init(lane);
  for (std::size_t tile = 0; tile < blocks; tile += kGroups) {
    const std::size_t b = tile + group;
    uint64_t sum = 0;
    if (b < blocks) {
      // 8-byte aligned: the base is (checked by the host) and blocks are 1 KiB.
      const auto* p = reinterpret_cast<const uint64_t*>(in + b * x::kBlockBytes);
      for (std::size_t s = 0; s < x::kStripesPerBlock; ++s)
        sum += x::stripe_term(p[s * 8 + lane], p[s * 8 + (lane ^ 1)], keys[s]);
    }
    sums[group][lane] = sum;
    __syncthreads();
    if (threadIdx.x < 8) {
      const std::size_t n = min(static_cast<std::size_t>(kGroups), blocks - tile);
      for (std::size_t k = 0; k < n; ++k) acc = x::scramble(acc + sums[k][lane], lane);
    }
    __syncthreads();
  }
  if (threadIdx.x < 8) finals[lane] = x::finish_lane(acc, in, len, lane);
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = x::merge_lanes(finals, len);
}

struct Layout {
  int ndim;
  int64_t sizes[64];
  int64_t strides[64];
};

// Copies elements [begin, begin + n) in row-major order of a strided view into
// `out` (element size `es`: 1, 2, 4, 8 or 16 bytes).
__global__ void gather(const uint8_t* data, Layout layout, int es, int64_t begin, int64_t n, uint8_t* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rem = begin + i, offset = 0;
    for (int d = layout.ndim - 1; d >= 0; --d) {
      offset += (rem % layout.sizes[d]) * layout.strides[d];
      rem /= layout.sizes[d];
    }
    const uint8_t* src = data + offset * es;
    uint8_t* dst = out + i * es;
    for (int k = 0; k < es; ++k) dst[k] = src[k];
  }
}

int grid_for(int64_t n, int threads) {
  return static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 4096));
}

// --- comparison -------------------------------------------------------------

constexpr int kCompareThreads = 256;
constexpr int kCompareBlocks = 1024;

__device__ void reduce_block(element::Accumulator local, element::Accumulator* out) {
  // Raw storage: a __shared__ array may not run Accumulator's initialisers.
  __shared__ __align__(16) unsigned char raw[kCompareThreads * sizeof(element::Accumulator)];
  auto* shared = reinterpret_cast<element::Accumulator*>(raw);
  shared[threadIdx.x] = local;
  __syncthreads();
  for (int step = kCompareThreads / 2; step > 0; step /= 2) {
    if (threadIdx.x < step) element::merge(shared[threadIdx.x], shared[threadIdx.x + step]);
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = shared[0];
}

template <typename T>
__global__ void compare_floating(const typename T::Bits* a, const typename T::Bits* b, int64_t parts,
                                 int parts_per_element, element::Accumulator* out) {
  element::Accumulator local;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < parts;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    element::floating_part<T>(a[i], b[i], i / parts_per_element, local);
  reduce_block(local, out);
}

template <typename I>
__global__ void compare_integer(const I* a, const I* b, int64_t n, element::Accumulator* out) {
  element::Accumulator local;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    element::integer_element<I>(a[i], b[i], i, local);
  reduce_block(local, out);
}

template <typename T>
void launch_floating(const void* a, const void* b, int64_t parts, int ppe, int grid, element::Accumulator* out,
                     cudaStream_t s) {
  using Bits = typename T::Bits;
  compare_floating<T><<<grid, kCompareThreads, 0, s>>>(static_cast<const Bits*>(a), static_cast<const Bits*>(b),
                                                        parts, ppe, out);
}
template <typename I>
void launch_integer(const void* a, const void* b, int64_t n, int grid, element::Accumulator* out, cudaStream_t s) {
  compare_integer<I><<<grid, kCompareThreads, 0, s>>>(static_cast<const I*>(a), static_cast<const I*>(b), n, out);
}

}  // namespace

bool cuda_built() { return true; }

bool cuda_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" / "no driver" error
    return false;
  }
  return n > 0;
}

struct CudaWorkspace::Impl {
  int device = -1;
  void* hashes = nullptr;  // chunk hashes
  std::size_t hashes_bytes = 0;
  void* scratch = nullptr;  // gathered batches of a strided view
  std::size_t scratch_bytes = 0;

  void release() {
    if (hashes != nullptr) cudaFree(hashes);
    if (scratch != nullptr) cudaFree(scratch);
    hashes = scratch = nullptr;
    hashes_bytes = scratch_bytes = 0;
  }
  // A buffer of at least `bytes` on the current device.
  void* get(void*& ptr, std::size_t& have, std::size_t bytes) {
    int current = 0;
    check(cudaGetDevice(&current), "cudaGetDevice");
    if (current != device) {
      release();
      device = current;
    }
    if (have < bytes) {
      if (ptr != nullptr) cudaFree(ptr);
      ptr = nullptr;
      have = 0;
      check(cudaMalloc(&ptr, bytes), "cudaMalloc");
      have = bytes;
    }
    return ptr;
  }
};

CudaWorkspace::CudaWorkspace() : impl_(new Impl) {}
CudaWorkspace::~CudaWorkspace() {
  impl_->release();  // errors ignored: the context may be gone at exit
  delete impl_;
}

void chunk_hashes_cuda(const TensorView& view, std::vector<uint64_t>* out, void* stream_ptr,
                       CudaWorkspace* workspace) {
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  CudaWorkspace::Impl& ws = *workspace->impl();
  const std::size_t es = dtype_size(view.dtype);
  const int64_t numel = view.numel();
  const std::size_t nbytes = static_cast<std::size_t>(numel) * es;
  const std::size_t n_chunks = (nbytes + kFingerprintChunkBytes - 1) / kFingerprintChunkBytes;
  out->resize(n_chunks);
  if (n_chunks == 0) return;
  if (view.data == nullptr) throw UsageError("chunk_hashes_cuda got a null device pointer");
  OPGUARD_CHECK(view.ndim <= 64);
  auto* d_hashes = static_cast<uint64_t*>(ws.get(ws.hashes, ws.hashes_bytes, n_chunks * sizeof(uint64_t)));
  const bool aligned = reinterpret_cast<uintptr_t>(view.data) % 8 == 0;
  if (view.is_contiguous() && aligned) {
    hash_chunks<<<static_cast<unsigned>(n_chunks), kHashThreads, 0, stream>>>(static_cast<const uint8_t*>(view.data),
                                                                              nbytes, d_hashes);
    check(cudaGetLastError(), "hash_chunks launch");
  } else {
    Layout layout{};
    layout.ndim = view.ndim;
    int64_t expected = 1;
    for (int d = view.ndim - 1; d >= 0; --d) {
      layout.sizes[d] = view.sizes[d];
      layout.strides[d] = view.strides != nullptr ? view.strides[d] : expected;
      expected *= view.sizes[d];
    }
    const std::size_t batch_bytes = std::min(nbytes, kBatchChunks * kFingerprintChunkBytes);
    auto* scratch = static_cast<uint8_t*>(ws.get(ws.scratch, ws.scratch_bytes, batch_bytes));
    const int64_t per_chunk = static_cast<int64_t>(kFingerprintChunkBytes / es);
    for (std::size_t first = 0; first < n_chunks; first += kBatchChunks) {
      const std::size_t count = std::min(kBatchChunks, n_chunks - first);
      const int64_t begin = static_cast<int64_t>(first) * per_chunk;
      const int64_t n = std::min(numel - begin, static_cast<int64_t>(count) * per_chunk);
      gather<<<grid_for(n, 256), 256, 0, stream>>>(static_cast<const uint8_t*>(view.data), layout,
                                                   static_cast<int>(es), begin, n, scratch);
      check(cudaGetLastError(), "gather launch");
      hash_chunks<<<static_cast<unsigned>(count), kHashThreads, 0, stream>>>(
          scratch, static_cast<std::size_t>(n) * es, d_hashes + first);
      check(cudaGetLastError(), "hash_chunks launch");
    }
    // The scratch is reused by the next batch only after the kernels that
    // read it, because all of them run in order on one stream.
  }
  check(cudaMemcpyAsync(out->data(), d_hashes, n_chunks * sizeof(uint64_t), cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync (chunk hashes)");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

uint64_t fingerprint_cuda(const TensorView& view, void* stream) {
  CudaWorkspace workspace;
  std::vector<uint64_t> hashes;
  chunk_hashes_cuda(view, &hashes, stream, &workspace);
  const std::size_t nbytes = static_cast<std::size_t>(view.numel()) * dtype_size(view.dtype);
  return combine_chunk_hashes(view.dtype, view.sizes, view.ndim, nbytes, hashes.data(), hashes.size());
}

CompareResult compare_cuda(DType dtype, const void* a, const void* b, int64_t numel, void* stream_ptr) {
  if (numel < 0) throw UsageError("compare_cuda needs a non-negative element count");
  if (numel > 0 && (a == nullptr || b == nullptr)) throw UsageError("compare_cuda got a null buffer");
  const std::size_t es = dtype_size(dtype);
  const std::size_t align = dtype_is_complex(dtype) ? es / 2 : es;
  if (reinterpret_cast<uintptr_t>(a) % align != 0 || reinterpret_cast<uintptr_t>(b) % align != 0)
    throw UsageError("compare_cuda needs element-aligned buffers (as torch allocates them)");
  element::Accumulator acc;
  if (numel > 0) {
    auto stream = static_cast<cudaStream_t>(stream_ptr);
    const int64_t parts = dtype_is_complex(dtype) ? numel * 2 : numel;
    const int grid = static_cast<int>(std::min<int64_t>((parts + kCompareThreads - 1) / kCompareThreads, kCompareBlocks));
    DeviceBuffer d_out(static_cast<std::size_t>(grid) * sizeof(element::Accumulator));
    auto* out = d_out.as<element::Accumulator>();
    switch (dtype) {
      case DType::kFloat64: launch_floating<element::F64>(a, b, numel, 1, grid, out, stream); break;
      case DType::kFloat32: launch_floating<element::F32>(a, b, numel, 1, grid, out, stream); break;
      case DType::kFloat16: launch_floating<element::F16>(a, b, numel, 1, grid, out, stream); break;
      case DType::kBFloat16: launch_floating<element::BF16>(a, b, numel, 1, grid, out, stream); break;
      case DType::kFloat8E4M3: launch_floating<element::F8E4M3>(a, b, numel, 1, grid, out, stream); break;
      case DType::kFloat8E5M2: launch_floating<element::F8E5M2>(a, b, numel, 1, grid, out, stream); break;
      case DType::kComplex64: launch_floating<element::F32>(a, b, parts, 2, grid, out, stream); break;
      case DType::kComplex128: launch_floating<element::F64>(a, b, parts, 2, grid, out, stream); break;
      case DType::kInt8: launch_integer<int8_t>(a, b, numel, grid, out, stream); break;
      case DType::kInt16: launch_integer<int16_t>(a, b, numel, grid, out, stream); break;
      case DType::kInt32: launch_integer<int32_t>(a, b, numel, grid, out, stream); break;
      case DType::kInt64: launch_integer<int64_t>(a, b, numel, grid, out, stream); break;
      case DType::kUInt8:
      case DType::kBool: launch_integer<uint8_t>(a, b, numel, grid, out, stream); break;
      case DType::kUInt16: launch_integer<uint16_t>(a, b, numel, grid, out, stream); break;
      case DType::kUInt32: launch_integer<uint32_t>(a, b, numel, grid, out, stream); break;
      case DType::kUInt64: launch_integer<uint64_t>(a, b, numel, grid, out, stream); break;
    }
    check(cudaGetLastError(), "compare kernel launch");
    std::vector<element::Accumulator> blocks(static_cast<std::size_t>(grid));
    check(cudaMemcpyAsync(blocks.data(), out, blocks.size() * sizeof(element::Accumulator), cudaMemcpyDeviceToHost,
                          stream),
          "cudaMemcpyAsync (comparison)");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    for (const auto& blk : blocks) element::merge(acc, blk);
  }
  uint8_t elem_a[16] = {}, elem_b[16] = {};
  if (acc.first_index != element::kNoIndex) {
    const std::size_t off = static_cast<std::size_t>(acc.first_index) * es;
    check(cudaMemcpy(elem_a, static_cast<const uint8_t*>(a) + off, es, cudaMemcpyDeviceToHost), "cudaMemcpy (first a)");
    check(cudaMemcpy(elem_b, static_cast<const uint8_t*>(b) + off, es, cudaMemcpyDeviceToHost), "cudaMemcpy (first b)");
  }
  return compare_result(dtype, numel, acc, elem_a, elem_b);
}

}  // namespace opguard::kernels
