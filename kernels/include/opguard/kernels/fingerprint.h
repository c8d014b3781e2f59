#pragma once
// The tensor fingerprint (docs/FORMAT.md, "Fingerprint"): a 64-bit hash of a
// tensor's logical content — dtype, shape and the element bytes in row-major
// order — independent of strides, storage offset, device and thread count.
//
// Definition, version 1:
//   bytes  = the elements in row-major order (little-endian, as stored)
//   chunks = bytes cut into kFingerprintChunkBytes pieces (the last may be
//            shorter; an empty tensor has none)
//   h[i]   = XXH3_64bits(chunk i)
//   header = "OGF1", u8 dtype code, u8 ndim, u16 0, i64 sizes[ndim], u64 nbytes
//   fp     = XXH3_64bits(header || h[0] || ... || h[n-1])   (all little-endian)
// Chunks hash independently, so any number of threads (or a GPU) computes the
// same value as one thread.

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "opguard/core/dtype.h"

namespace opguard::kernels {

inline constexpr std::size_t kFingerprintChunkBytes = std::size_t{1} << 20;

// A view of tensor memory: `data` points at element [0,...,0]; strides are in
// elements and may be zero or negative-free non-contiguous (no negative strides
// in torch).
struct TensorView {
  DType dtype = DType::kFloat32;
  const int64_t* sizes = nullptr;
  const int64_t* strides = nullptr;  // nullptr: row-major contiguous
  int ndim = 0;
  const void* data = nullptr;

  int64_t numel() const;
  bool is_contiguous() const;
};

// Worker threads that hash chunks in parallel. Owned by the caller; a pool of
// size 0 or 1 hashes on the calling thread. Thread-safe: several callers may
// share one pool.
class HashPool {
 public:
  explicit HashPool(int threads);
  ~HashPool();
  HashPool(const HashPool&) = delete;
  HashPool& operator=(const HashPool&) = delete;
  int threads() const;

  // Runs fn(i) for i in [0, n), on the pool and the calling thread; returns
  // when all are done.
  template <typename Fn>
  void parallel_for(std::size_t n, Fn&& fn) {
    using F = std::remove_reference_t<Fn>;
    run(n, [](void* ctx, std::size_t i) { (*static_cast<F*>(ctx))(i); }, const_cast<void*>(static_cast<const void*>(&fn)));
  }

 private:
  void run(std::size_t n, void (*fn)(void*, std::size_t), void* ctx);
  struct Impl;
  Impl* impl_;
};

uint64_t fingerprint(const TensorView& view, HashPool* pool = nullptr);

// The chunk hashes h[0..n) of the definition above; fingerprint() is
// combine_chunk_hashes over them. Two views with the same row-major bytes
// (a tensor and its reshape, flatten or unsqueeze) have the same chunk
// hashes, so a caller that keeps them fingerprints the other view without
// reading its memory.
void chunk_hashes(const TensorView& view, std::vector<uint64_t>* out, HashPool* pool = nullptr);

// The fingerprint of row-major bytes that are already contiguous.
uint64_t fingerprint_contiguous(DType dtype, const int64_t* sizes, int ndim, const void* data,
                                std::size_t nbytes, HashPool* pool = nullptr);

// Combines chunk hashes into the fingerprint (shared by the CPU path and the
// host side of the CUDA path, so both follow one definition).
uint64_t combine_chunk_hashes(DType dtype, const int64_t* sizes, int ndim, std::size_t nbytes,
                              const uint64_t* chunk_hashes, std::size_t n_chunks);

// A cheap witness of the memory under a view, for a cache that trusts a
// version counter (torch bumps it for operators, not for writes through
// numpy or a kernel called without the dispatcher): XXH3 of the 64-byte
// lines at every kProbeStrideBytes of the byte span from the view's first
// element to the end of its last, and of the span's last 64 bytes. A
// different witness proves the memory changed; an equal one does not prove
// it did not (a write between the lines goes unseen).
inline constexpr std::size_t kProbeStrideBytes = 4096;
uint64_t probe(const TensorView& view);

// probe() with at most about kQuickProbeLines lines, spread evenly over the
// span (the same as probe() up to kQuickProbeLines * kProbeStrideBytes): a
// witness cheap enough to take on a training thread for a short wait (the
// recorder's deferred fingerprints). It sees a rewrite of the whole memory,
// and fewer partial writes than probe().
inline constexpr std::size_t kQuickProbeLines = 16;
uint64_t quick_probe(const TensorView& view);

// Sets every byte probe() reads of `nbytes` contiguous bytes to `byte`: a
// buffer fresh from an allocator holds whatever was there, and a probe of
// that would tell a later write apart from the old bytes only by chance.
void stamp_probe_lines(void* data, std::size_t nbytes, uint8_t byte);

// Copies the elements of a strided view into row-major order.
void gather_contiguous(const TensorView& view, void* out);

}  // namespace opguard::kernels
