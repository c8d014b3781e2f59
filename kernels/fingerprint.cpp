#include "opguard/kernels/fingerprint.h"

// The streaming state's definition, so that each thread keeps one in place
// (no allocation that could fail on a pool thread).
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
// The library's runtime-dispatched XXH3 (AVX2 / AVX-512 where the CPU has
// them): the same values as the baseline XXH3_64bits, about 2x the speed
// here. The header turns every XXH3_64bits below into XXH3_64bits_dispatch.
#include <xxh_x86dispatch.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>

#include "opguard/core/error.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace opguard::kernels {
namespace {

#if defined(__x86_64__)
__attribute__((target("avx"))) void zero_upper_avx() { _mm256_zeroupper(); }
#endif

// XXH3's AVX-512 code in libxxhash 0.8.1 (Debian 12) returns with the upper
// halves of the vector registers in use (no vzeroupper). Until something
// clears them, every legacy-SSE instruction the thread runs next pays for
// the transition: libtorch's scalar code, and MKL's SSE2 kernels, which
// MKL_CBWR=COMPATIBLE selects, ran an sgemm 5-6 times slower after one hash
// (a recorded tiny_gpt step under MKL_CBWR=COMPATIBLE: 4.8x the unrecorded
// one). Every hash here clears them before it returns to its caller.
void clear_upper_state() {
#if defined(__x86_64__)
  static const bool has_avx = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx") != 0;
  }();
  if (has_avx) zero_upper_avx();
#endif
}

uint64_t hash_bytes(const void* data, std::size_t n) {
  const uint64_t h = XXH3_64bits(data, n);
  clear_upper_state();
  return h;
}

}  // namespace

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= sizes[d];
  return n;
}

bool TensorView::is_contiguous() const {
  if (strides == nullptr) return true;
  int64_t expected = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (sizes[d] != 1 && strides[d] != expected) return false;
    expected *= sizes[d];
  }
  return true;
}

// --- HashPool ---------------------------------------------------------------

struct HashPool::Impl {
  std::mutex mutex;
  std::condition_variable wake;
  std::condition_variable done;
  std::vector<std::thread> workers;
  bool stopping = false;
  // The current job; one at a time (callers serialise on job_mutex).
  std::mutex job_mutex;
  void (*fn)(void*, std::size_t) = nullptr;
  void* ctx = nullptr;
  std::size_t n = 0;
  std::atomic<std::size_t> next{0};
  std::size_t finished = 0;
  uint64_t generation = 0;

  std::exception_ptr error;  // the first exception a job threw, for the caller

  void work_on_current() {
    std::size_t local = 0;
    for (std::size_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
      // An exception must not leave a worker thread (std::terminate): the
      // caller rethrows it once every job is done.
      try {
        fn(ctx, i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!error) error = std::current_exception();
      }
      ++local;
    }
    if (local > 0) {
      std::lock_guard<std::mutex> lock(mutex);
      finished += local;
      if (finished == n) done.notify_all();
    }
  }

  void worker_main() {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mutex);
    while (true) {
      wake.wait(lock, [&] { return stopping || generation != seen; });
      if (stopping) return;
      seen = generation;
      lock.unlock();
      work_on_current();
      lock.lock();
    }
  }
};

HashPool::HashPool(int threads) : impl_(new Impl) {
  for (int i = 1; i < threads; ++i) impl_->workers.emplace_back([this] { impl_->worker_main(); });
}

HashPool::~HashPool() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->wake.notify_all();
  for (auto& t : impl_->workers) t.join();
  delete impl_;
}

int HashPool::threads() const { return static_cast<int>(impl_->workers.size()) + 1; }

void HashPool::run(std::size_t n, void (*fn)(void*, std::size_t), void* ctx) {
  if (n == 0) return;
  if (impl_->workers.empty() || n == 1) {
    for (std::size_t i = 0; i < n; ++i) fn(ctx, i);
    return;
  }
  std::lock_guard<std::mutex> job(impl_->job_mutex);
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->fn = fn;
    impl_->ctx = ctx;
    impl_->n = n;
    impl_->next = 0;
    impl_->finished = 0;
    impl_->error = nullptr;
    ++impl_->generation;
  }
  impl_->wake.notify_all();
  impl_->work_on_current();
  std::unique_lock<std::mutex> lock(impl_->mutex);
  impl_->done.wait(lock, [&] { return impl_->finished == impl_->n; });
  if (impl_->error) std::rethrow_exception(std::exchange(impl_->error, nullptr));
}

// --- fingerprint --------------------------------------------------------------

namespace {

std::size_t chunk_count(std::size_t nbytes) {
  return (nbytes + kFingerprintChunkBytes - 1) / kFingerprintChunkBytes;
}

// Copies `n` elements of type T spaced `stride` elements apart into `out`.
template <typename T>
void copy_strided(const uint8_t* src, int64_t stride, int64_t n, uint8_t* out) {
  for (int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, src + i * stride * static_cast<int64_t>(sizeof(T)), sizeof(T));
    std::memcpy(out + i * static_cast<int64_t>(sizeof(T)), &v, sizeof(T));
  }
}

#if defined(__SSE2__)
// A full tile of copy_transposed (64 bytes a side) moved in square blocks of
// one 16-byte register a side, transposed in registers with integer unpacks
// (bit moves only: every pattern, NaNs included, comes out as it went in).
// The tile is read from `src` (element (i, j) at src[i + j * col_stride]) and
// written to `out` (element (i, j) at out[i * out_stride + j]), strides in
// elements. Element by element through a buffer, the shuffles cost more than
// the loads: t() of a 128 x 1024 float matrix in cache ran at 7.5 GB/s.
inline __m128i load16(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
inline void store16(uint8_t* p, __m128i v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v); }

template <std::size_t kSize>
void transpose_tile_simd(const uint8_t* src, int64_t col_stride, uint8_t* out, int64_t out_stride);

template <>
void transpose_tile_simd<2>(const uint8_t* src, int64_t col_stride, uint8_t* out, int64_t out_stride) {
  const int64_t in_line = col_stride * 2, out_line = out_stride * 2;
  for (int ib = 0; ib < 32; ib += 8) {
    for (int jb = 0; jb < 32; jb += 8) {
      const uint8_t* s = src + ib * 2 + jb * in_line;
      __m128i r[8];
      for (int j = 0; j < 8; ++j) r[j] = load16(s + j * in_line);
      __m128i a[8], b[8];
      for (int k = 0; k < 4; ++k) {
        a[2 * k] = _mm_unpacklo_epi16(r[2 * k], r[2 * k + 1]);
        a[2 * k + 1] = _mm_unpackhi_epi16(r[2 * k], r[2 * k + 1]);
      }
      for (int k = 0; k < 2; ++k) {  // k = 0: rows 0-3 of the block, k = 1: rows 4-7
        b[4 * k + 0] = _mm_unpacklo_epi32(a[4 * k + 0], a[4 * k + 2]);  // i 0, 1
        b[4 * k + 1] = _mm_unpackhi_epi32(a[4 * k + 0], a[4 * k + 2]);  // i 2, 3
        b[4 * k + 2] = _mm_unpacklo_epi32(a[4 * k + 1], a[4 * k + 3]);  // i 4, 5
        b[4 * k + 3] = _mm_unpackhi_epi32(a[4 * k + 1], a[4 * k + 3]);  // i 6, 7
      }
      uint8_t* o = out + (ib * out_stride + jb) * 2;
      for (int k = 0; k < 4; ++k) {
        store16(o + (2 * k) * out_line, _mm_unpacklo_epi64(b[k], b[4 + k]));
        store16(o + (2 * k + 1) * out_line, _mm_unpackhi_epi64(b[k], b[4 + k]));
      }
    }
  }
}

template <>
void transpose_tile_simd<4>(const uint8_t* src, int64_t col_stride, uint8_t* out, int64_t out_stride) {
  const int64_t in_line = col_stride * 4, out_line = out_stride * 4;
  for (int ib = 0; ib < 16; ib += 4) {
    for (int jb = 0; jb < 16; jb += 4) {
      const uint8_t* s = src + ib * 4 + jb * in_line;
      const __m128i r0 = load16(s), r1 = load16(s + in_line), r2 = load16(s + 2 * in_line),
                    r3 = load16(s + 3 * in_line);
      const __m128i t0 = _mm_unpacklo_epi32(r0, r1), t1 = _mm_unpacklo_epi32(r2, r3);
      const __m128i t2 = _mm_unpackhi_epi32(r0, r1), t3 = _mm_unpackhi_epi32(r2, r3);
      uint8_t* o = out + (ib * out_stride + jb) * 4;
      store16(o, _mm_unpacklo_epi64(t0, t1));
      store16(o + out_line, _mm_unpackhi_epi64(t0, t1));
      store16(o + 2 * out_line, _mm_unpacklo_epi64(t2, t3));
      store16(o + 3 * out_line, _mm_unpackhi_epi64(t2, t3));
    }
  }
}

template <>
void transpose_tile_simd<8>(const uint8_t* src, int64_t col_stride, uint8_t* out, int64_t out_stride) {
  const int64_t in_line = col_stride * 8, out_line = out_stride * 8;
  for (int ib = 0; ib < 8; ib += 2) {
    for (int jb = 0; jb < 8; jb += 2) {
      const uint8_t* s = src + ib * 8 + jb * in_line;
      const __m128i r0 = load16(s), r1 = load16(s + in_line);
      uint8_t* o = out + (ib * out_stride + jb) * 8;
      store16(o, _mm_unpacklo_epi64(r0, r1));
      store16(o + out_line, _mm_unpackhi_epi64(r0, r1));
    }
  }
}
#endif

// Copies `rows` x `cols` elements of a transposed block into row-major `out`:
// element (i, j) is at src[i + j * col_stride]. Square tiles of one cache
// line a side (whole ones in SSE2 registers, edge ones through a local
// buffer) are moved one at a time: every source line and every output
// line is touched once, in one piece, whatever the strides (columns a page
// apart map to one cache set, so a tile that kept them in the cache would
// evict itself). Element by element along a row touched a new cache line per
// element: 1.3 GB/s against 17-24 for the hash (opguard_fingerprint_throughput).
template <typename T>
void copy_transposed(const uint8_t* src, int64_t rows, int64_t cols, int64_t col_stride, uint8_t* out) {
  constexpr int64_t kTile = 64 / static_cast<int64_t>(sizeof(T));
  constexpr int64_t es = static_cast<int64_t>(sizeof(T));
  T tile[kTile][kTile];  // tile[j][i]: column j of the tile, as stored
  for (int64_t j0 = 0; j0 < cols; j0 += kTile) {
    const int64_t nj = std::min(kTile, cols - j0);
    for (int64_t i0 = 0; i0 < rows; i0 += kTile) {
      const int64_t ni = std::min(kTile, rows - i0);
      const uint8_t* col = src + (j0 * col_stride + i0) * es;
#if defined(__SSE2__)
      if constexpr (sizeof(T) >= 2) {
        if (ni == kTile && nj == kTile) {
          transpose_tile_simd<sizeof(T)>(col, col_stride, out + (i0 * cols + j0) * es, cols);
          continue;
        }
      }
#endif
      if (ni == kTile) {  // a constant size: two vector moves, not `rep movs`
        for (int64_t j = 0; j < nj; ++j) std::memcpy(tile[j], col + j * col_stride * es, sizeof(tile[j]));
      } else {
        for (int64_t j = 0; j < nj; ++j) std::memcpy(tile[j], col + j * col_stride * es, ni * es);
      }
      for (int64_t i = 0; i < ni; ++i) {
        uint8_t* row = out + ((i0 + i) * cols + j0) * es;
        if (nj == kTile) {
          T line[kTile];
          for (int64_t j = 0; j < kTile; ++j) line[j] = tile[j][i];
          std::memcpy(row, line, sizeof(line));
        } else {
          for (int64_t j = 0; j < nj; ++j) std::memcpy(row + j * es, &tile[j][i], sizeof(T));
        }
      }
    }
  }
}

// Copies `rows` rows of `row_bytes` each, `row_stride` bytes apart, to `out`
// back to back. The common short rows (a head dimension of 16 to 64 floats)
// are copied with a constant size: inline vector moves, not a memcpy call.
void copy_rows(const uint8_t* src, int64_t row_stride, int64_t rows, std::size_t row_bytes, uint8_t* out) {
  // `size`: a std::integral_constant (the size known at compile time) or a std::size_t.
  auto copy = [&](auto size) {
    const std::size_t n = size;
    for (int64_t r = 0; r < rows; ++r) std::memcpy(out + r * static_cast<int64_t>(n), src + r * row_stride, n);
  };
  switch (row_bytes) {
    case 32: copy(std::integral_constant<std::size_t, 32>()); return;
    case 64: copy(std::integral_constant<std::size_t, 64>()); return;
    case 128: copy(std::integral_constant<std::size_t, 128>()); return;
    case 256: copy(std::integral_constant<std::size_t, 256>()); return;
    default: copy(row_bytes);
  }
}

// The last two dimensions swapped (t(), transpose(-1, -2)) with an element
// size copy_transposed handles: gather_range moves such rows by tiles.
bool last_two_swapped(const TensorView& v, std::size_t es) {
  const int nd = v.ndim;
  return nd >= 2 && v.strides[nd - 1] != 1 && v.strides[nd - 2] == 1 && v.sizes[nd - 2] > 1 &&
         (es == 1 || es == 2 || es == 4 || es == 8);
}

// Row-major walk over a strided view, copying elements [begin, end) into out.
void gather_range(const TensorView& v, int64_t begin, int64_t end, uint8_t* out) {
  const std::size_t es = dtype_size(v.dtype);
  const int nd = v.ndim;
  if (nd == 0) {
    if (begin < end) std::memcpy(out, v.data, es);
    return;
  }
  int64_t index[64];
  OPGUARD_CHECK(nd <= 64);
  int64_t rem = begin;
  for (int d = nd - 1; d >= 0; --d) {
    index[d] = rem % v.sizes[d];
    rem /= v.sizes[d];
  }
  const auto* base = static_cast<const uint8_t*>(v.data);
  const int64_t inner = v.sizes[nd - 1];
  const int64_t inner_stride = v.strides[nd - 1];
  // Transposed: whole rows go through copy_transposed, as many as lie in one matrix.
  const bool transposed = last_two_swapped(v, es);
  int64_t pos = begin;
  // `rows` whole rows of the last dimension were copied.
  auto advance_rows = [&](int64_t rows) {
    out += rows * inner * static_cast<int64_t>(es);
    pos += rows * inner;
    index[nd - 2] += rows;
    for (int d = nd - 2; d > 0 && index[d] == v.sizes[d]; --d) {
      index[d] = 0;
      ++index[d - 1];
    }
  };
  while (pos < end) {
    int64_t offset = 0;
    for (int d = 0; d < nd - 1; ++d) offset += index[d] * v.strides[d];
    if (transposed && index[nd - 1] == 0 && end - pos >= 2 * inner) {
      const int64_t rows = std::min(v.sizes[nd - 2] - index[nd - 2], (end - pos) / inner);
      const uint8_t* src = base + offset * static_cast<int64_t>(es);
      switch (es) {
        case 1: copy_transposed<uint8_t>(src, rows, inner, inner_stride, out); break;
        case 2: copy_transposed<uint16_t>(src, rows, inner, inner_stride, out); break;
        case 4: copy_transposed<uint32_t>(src, rows, inner, inner_stride, out); break;
        default: copy_transposed<uint64_t>(src, rows, inner, inner_stride, out); break;
      }
      advance_rows(rows);
      continue;
    }
    if (inner_stride == 1 && nd >= 2 && index[nd - 1] == 0 && end - pos >= 2 * inner) {
      // Whole rows of a view whose last dimension is contiguous (a permute
      // that keeps it, a slice): one copy per row, no index arithmetic.
      const int64_t rows = std::min(v.sizes[nd - 2] - index[nd - 2], (end - pos) / inner);
      copy_rows(base + offset * static_cast<int64_t>(es), v.strides[nd - 2] * static_cast<int64_t>(es), rows,
                static_cast<std::size_t>(inner) * es, out);
      advance_rows(rows);
      continue;
    }
    const int64_t run = std::min(inner - index[nd - 1], end - pos);
    const uint8_t* src = base + (offset + index[nd - 1] * inner_stride) * static_cast<int64_t>(es);
    if (inner_stride == 1) {
      std::memcpy(out, src, run * es);
      out += run * es;
    } else {
      // Element by element (transposed and expanded views): a typed loop,
      // not one memcpy call per element, which cost more than the hash.
      switch (es) {
        case 1: copy_strided<uint8_t>(src, inner_stride, run, out); break;
        case 2: copy_strided<uint16_t>(src, inner_stride, run, out); break;
        case 4: copy_strided<uint32_t>(src, inner_stride, run, out); break;
        case 8: copy_strided<uint64_t>(src, inner_stride, run, out); break;
        default:
          for (int64_t i = 0; i < run; ++i)
            std::memcpy(out + i * static_cast<int64_t>(es), src + i * inner_stride * static_cast<int64_t>(es), es);
          break;
      }
      out += run * es;
    }
    pos += run;
    index[nd - 1] += run;
    for (int d = nd - 1; d > 0 && index[d] == v.sizes[d]; --d) {
      index[d] = 0;
      ++index[d - 1];
    }
  }
}

}  // namespace

uint64_t combine_chunk_hashes(DType dtype, const int64_t* sizes, int ndim, std::size_t nbytes,
                              const uint64_t* chunk_hashes, std::size_t n_chunks) {
  OPGUARD_CHECK(ndim >= 0 && ndim < 256);
  // The header, sizes, byte count and chunk hashes back to back; on the
  // stack for tensors of up to 56 dimensions and chunks together (every
  // fingerprint of the recorder's hot path), on the heap beyond.
  const std::size_t len = 16 + 8 * static_cast<std::size_t>(ndim) + 8 * n_chunks;
  uint8_t local[512];
  std::vector<uint8_t> heap;
  uint8_t* buf = local;
  if (len > sizeof(local)) {
    heap.resize(len);
    buf = heap.data();
  }
  // x86-64 and aarch64 are little-endian; the format is too.
  const uint8_t head[8] = {'O', 'G', 'F', '1', static_cast<uint8_t>(dtype), static_cast<uint8_t>(ndim), 0, 0};
  uint8_t* p = buf;
  std::memcpy(p, head, sizeof(head));
  p += sizeof(head);
  if (ndim > 0) std::memcpy(p, sizes, 8 * static_cast<std::size_t>(ndim));
  p += 8 * static_cast<std::size_t>(ndim);
  const uint64_t n64 = nbytes;
  std::memcpy(p, &n64, 8);
  p += 8;
  if (n_chunks > 0) std::memcpy(p, chunk_hashes, 8 * n_chunks);
  return hash_bytes(buf, len);
}

namespace {

void contiguous_chunk_hashes(const void* data, std::size_t nbytes, std::vector<uint64_t>* out,
                             HashPool* pool) {
  const std::size_t n = chunk_count(nbytes);
  out->resize(n);
  uint64_t* hashes = out->data();
  const auto* bytes = static_cast<const uint8_t*>(data);
  auto hash_chunk = [&](std::size_t i) {
    const std::size_t off = i * kFingerprintChunkBytes;
    hashes[i] = hash_bytes(bytes + off, std::min(kFingerprintChunkBytes, nbytes - off));
  };
  if (pool != nullptr) {
    pool->parallel_for(n, hash_chunk);
  } else {
    for (std::size_t i = 0; i < n; ++i) hash_chunk(i);
  }
}

}  // namespace

uint64_t fingerprint_contiguous(DType dtype, const int64_t* sizes, int ndim, const void* data,
                                std::size_t nbytes, HashPool* pool) {
  std::vector<uint64_t> hashes;
  contiguous_chunk_hashes(data, nbytes, &hashes, pool);
  return combine_chunk_hashes(dtype, sizes, ndim, nbytes, hashes.data(), hashes.size());
}

namespace {

// The row-major bytes of a strided view are gathered a block at a time into a
// buffer that stays in the core's cache and hashed from there, chunk by chunk
// (XXH3's streaming state gives the same hash as one call over the chunk).
// A block is whole rows of the last dimension, at least one tile of
// copy_transposed tall (64 bytes of elements), so that every source line a
// transposed view touches is read once, in one piece. Gathering a whole 1 MiB
// chunk before hashing it went through the last-level cache twice, and a
// chunk of a few very long rows (t() of a 65536 x 1024 matrix: four rows a
// chunk) re-read each source line once per chunk: 0.36 GB/s.
constexpr std::size_t kGatherBlockBytes = 32 * 1024;
constexpr std::size_t kTallBlockBytes = 4 << 20;
constexpr std::size_t kMaxBlockBytes = 16 << 20;
constexpr int64_t kTallTiles = 4;

// Hashes elements [begin, end) of a strided view, `begin` on a chunk boundary,
// into hashes[0 ..] (one per chunk the range covers).
void strided_range_hashes(const TensorView& view, int64_t begin, int64_t end, uint64_t* hashes) {
  const auto es = static_cast<int64_t>(dtype_size(view.dtype));
  const auto chunk_bytes = static_cast<int64_t>(kFingerprintChunkBytes);
  const int64_t inner = view.ndim > 0 ? std::max<int64_t>(view.sizes[view.ndim - 1], 1) : 1;
  const int64_t tile_rows = std::max<int64_t>(64 / es, 1);
  int64_t rows = std::max(tile_rows, static_cast<int64_t>(kGatherBlockBytes) / (inner * es));
  if (last_two_swapped(view, static_cast<std::size_t>(es)) && view.strides[view.ndim - 1] * es >= 4096) {
    // A transposed view whose columns lie a page or more apart: taller
    // blocks, so that each visit of a column's page takes four of its lines,
    // not one. t() of a 16384 x 1024 float32 matrix: 3.0 -> 4.5 GB/s.
    rows = std::max(rows, std::min(kTallTiles * tile_rows, static_cast<int64_t>(kTallBlockBytes) / (inner * es)));
  }
  rows = std::max(rows / tile_rows, int64_t{1}) * tile_rows;
  int64_t block = rows * inner;  // elements
  // Rows too long for a block of whole ones (a 1-d strided view, a slice of
  // a very wide matrix) go through in chunk-sized pieces of a row.
  if (block * es > static_cast<int64_t>(kMaxBlockBytes)) block = chunk_bytes / es;
  thread_local std::vector<uint8_t> buffer;
  thread_local XXH3_state_t state;
  buffer.resize(static_cast<std::size_t>(std::min(block, end - begin) * es));
  int64_t filled = 0;  // bytes of the current chunk hashed so far
  for (int64_t pos = begin; pos < end;) {
    // Blocks at multiples of `block` from the view's first element: whole rows.
    const int64_t next = std::min(end, (pos / block + 1) * block);
    gather_range(view, pos, next, buffer.data());
    const uint8_t* p = buffer.data();
    int64_t left = (next - pos) * es;
    while (left > 0) {
      const int64_t take = std::min(left, chunk_bytes - filled);
      if (filled == 0 && (take == chunk_bytes || next == end)) {
        *hashes++ = hash_bytes(p, static_cast<std::size_t>(take));  // the whole chunk at once
      } else {
        if (filled == 0) XXH3_64bits_reset(&state);
        XXH3_64bits_update(&state, p, static_cast<std::size_t>(take));
        filled += take;
        if (filled == chunk_bytes || (next == end && left == take)) {
          *hashes++ = XXH3_64bits_digest(&state);
          filled = 0;
        }
      }
      p += take;
      left -= take;
    }
    pos = next;
  }
  clear_upper_state();  // after the streaming state's updates and digests
  // A block of long rows (up to kMaxBlockBytes) is not kept for the next view.
  if (buffer.capacity() > kTallBlockBytes) std::vector<uint8_t>().swap(buffer);
}

}  // namespace

void chunk_hashes(const TensorView& view, std::vector<uint64_t>* out, HashPool* pool) {
  const std::size_t es = dtype_size(view.dtype);
  const int64_t numel = view.numel();
  const std::size_t nbytes = static_cast<std::size_t>(numel) * es;
  if (view.is_contiguous()) {
    contiguous_chunk_hashes(view.data, nbytes, out, pool);
    return;
  }
  // Strided. Chunk boundaries fall on element boundaries because every dtype
  // size divides the chunk size.
  const std::size_t n = chunk_count(nbytes);
  out->resize(n);
  uint64_t* hashes = out->data();
  if (pool == nullptr || pool->threads() == 1 || n == 1) {
    // One chunk is one stream: gathered and hashed on this thread. Sharing
    // its gather out to the pool (then hashing it here) was slower than this
    // for a 512 KiB t() in cache: 9.8 against 12.4 GB/s.
    strided_range_hashes(view, 0, numel, hashes);
    return;
  }
  const int64_t per_chunk = static_cast<int64_t>(kFingerprintChunkBytes / es);
  // Runs of whole chunks, two per thread, each streamed block by block.
  const std::size_t runs = std::min(n, static_cast<std::size_t>(2 * pool->threads()));
  const std::size_t per_run = (n + runs - 1) / runs;
  pool->parallel_for(runs, [&](std::size_t i) {
    const std::size_t first = std::min(n, i * per_run);
    const int64_t begin = static_cast<int64_t>(first) * per_chunk;
    const int64_t end = std::min(numel, static_cast<int64_t>(std::min(n, first + per_run)) * per_chunk);
    if (begin < end) strided_range_hashes(view, begin, end, hashes + first);
  });
}

uint64_t fingerprint(const TensorView& view, HashPool* pool) {
  std::vector<uint64_t> hashes;
  chunk_hashes(view, &hashes, pool);
  const std::size_t nbytes = static_cast<std::size_t>(view.numel()) * dtype_size(view.dtype);
  return combine_chunk_hashes(view.dtype, view.sizes, view.ndim, nbytes, hashes.data(), hashes.size());
}

namespace {

constexpr std::size_t kProbeLine = 64;

// Calls f(offset, length) for each line a probe with `stride` reads in a span
// of `span` bytes (span > 2 lines): one at every `stride` bytes (the last one
// cut short where the span ends), then the span's last 64 bytes.
template <typename F>
void for_each_probe_line(std::size_t span, std::size_t stride, F&& f) {
  for (std::size_t at = 0; at < span; at += stride) f(at, std::min(kProbeLine, span - at));
  f(span - kProbeLine, kProbeLine);
}

// Bytes from the view's first element to the end of its last (torch strides are >= 0).
std::size_t byte_span(const TensorView& view) {
  int64_t last = view.numel() - 1;  // offset of the last element, in elements
  if (view.strides != nullptr) {
    last = 0;
    for (int d = 0; d < view.ndim; ++d) last += (view.sizes[d] - 1) * view.strides[d];
  }
  return (static_cast<std::size_t>(last) + 1) * dtype_size(view.dtype);
}

uint64_t probe_with_stride(const TensorView& view, std::size_t span, std::size_t stride) {
  const auto* p = static_cast<const uint8_t*>(view.data);
  if (span <= 2 * kProbeLine) return hash_bytes(p, span);
  thread_local std::vector<uint8_t> lines;
  lines.resize(((span - 1) / stride + 2) * kProbeLine);
  uint8_t* out = lines.data();
  for_each_probe_line(span, stride, [&](std::size_t at, std::size_t n) {
    if (n == kProbeLine) {
      std::memcpy(out, p + at, kProbeLine);  // a constant size: inline moves
    } else {
      std::memcpy(out, p + at, n);
      std::memset(out + n, 0, kProbeLine - n);  // the buffer is reused: no stale bytes in the hash
    }
    out += kProbeLine;
  });
  return hash_bytes(lines.data(), static_cast<std::size_t>(out - lines.data()));
}

}  // namespace

uint64_t probe(const TensorView& view) {
  if (view.numel() == 0) return 0;
  return probe_with_stride(view, byte_span(view), kProbeStrideBytes);
}

uint64_t quick_probe(const TensorView& view) {
  if (view.numel() == 0) return 0;
  const std::size_t span = byte_span(view);
  const std::size_t spread = (span / kQuickProbeLines + kProbeLine - 1) / kProbeLine * kProbeLine;
  return probe_with_stride(view, span, std::max(kProbeStrideBytes, spread));
}

void stamp_probe_lines(void* data, std::size_t nbytes, uint8_t byte) {
  auto* p = static_cast<uint8_t*>(data);
  if (nbytes <= 2 * kProbeLine) {
    std::memset(p, byte, nbytes);
    return;
  }
  for_each_probe_line(nbytes, kProbeStrideBytes, [&](std::size_t at, std::size_t n) { std::memset(p + at, byte, n); });
}

void gather_contiguous(const TensorView& view, void* out) {
  const std::size_t nbytes = static_cast<std::size_t>(view.numel()) * dtype_size(view.dtype);
  if (view.is_contiguous()) {
    if (nbytes > 0) std::memcpy(out, view.data, nbytes);
    return;
  }
  gather_range(view, 0, view.numel(), static_cast<uint8_t*>(out));
}

}  // namespace opguard::kernels
