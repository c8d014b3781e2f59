#pragma once
// XXH3-64 (seed 0, default secret) written from the public specification
// (xxhash.com, "doc/xxhash_spec.md"), as functions that compile both as host
// code and as CUDA device code. The CUDA fingerprint kernel and its host-side
// reference (cuda_reference.cpp) share these; tests pin them against
// libxxhash's XXH3_64bits for every length class.
//
// The long-input path (> 240 bytes) is split the way the kernel splits it:
// the input is a sequence of 1 KiB "blocks" of 16 stripes of 64 bytes; each of
// the 8 accumulator lanes receives a sum (mod 2^64) of per-stripe terms within
// a block, and a per-lane scramble separates blocks. A block's lane sums are
// independent of each other, so threads compute them in parallel and one
// thread per lane then runs the short scramble chain. Lanes never mix until
// the final merge.

#include <cstddef>
#include <cstdint>

#ifdef __CUDACC__
#define OPGUARD_HD __host__ __device__ __forceinline__
#else
#define OPGUARD_HD inline
#endif

namespace opguard::kernels::xxh3 {

inline constexpr std::size_t kSecretSize = 192;
inline constexpr std::size_t kStripeBytes = 64;
inline constexpr std::size_t kStripesPerBlock = (kSecretSize - kStripeBytes) / 8;  // 16
inline constexpr std::size_t kBlockBytes = kStripeBytes * kStripesPerBlock;        // 1024
inline constexpr std::size_t kMidSizeMax = 240;

inline constexpr uint64_t kPrime32_1 = 0x9E3779B1u;
inline constexpr uint64_t kPrime32_2 = 0x85EBCA77u;
inline constexpr uint64_t kPrime32_3 = 0xC2B2AE3Du;
inline constexpr uint64_t kPrime64_1 = 0x9E3779B185EBCA87ull;
inline constexpr uint64_t kPrime64_2 = 0xC2B2AE3D27D4EB4Full;
inline constexpr uint64_t kPrime64_3 = 0x165667B19E3779F9ull;
inline constexpr uint64_t kPrime64_4 = 0x85EBCA77C2B2AE63ull;
inline constexpr uint64_t kPrime64_5 = 0x27D4EB2F165667C5ull;

// The specification's default secret (its kSecret table).
#define OPGUARD_XXH3_SECRET_BYTES                                                                  \
  {0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c, \
   0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f, \
   0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21, \
   0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c, \
   0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3, \
   0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8, \
   0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d, \
   0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64, \
   0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb, \
   0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e, \
   0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce, \
   0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e}

#ifdef __CUDACC__
// One copy per translation unit; only cuda.cu includes this under nvcc.
static __constant__ uint8_t kSecretDevice[kSecretSize] = OPGUARD_XXH3_SECRET_BYTES;
#endif
inline constexpr uint8_t kSecretHost[kSecretSize] = OPGUARD_XXH3_SECRET_BYTES;

OPGUARD_HD uint8_t secret_byte(std::size_t i) {
#ifdef __CUDA_ARCH__
  return kSecretDevice[i];
#else
  return kSecretHost[i];
#endif
}

// Little-endian loads, byte by byte: inputs need no alignment.
OPGUARD_HD uint64_t load64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
OPGUARD_HD uint32_t load32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}
OPGUARD_HD uint64_t secret64(std::size_t off) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | secret_byte(off + static_cast<std::size_t>(i));
  return v;
}
OPGUARD_HD uint32_t secret32(std::size_t off) {
  return static_cast<uint32_t>(secret64(off));
}

OPGUARD_HD uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
OPGUARD_HD uint64_t swap64(uint64_t x) {
  uint64_t r = 0;
  for (int i = 0; i < 8; ++i) r = (r << 8) | ((x >> (8 * i)) & 0xff);
  return r;
}

// Low and high 64 bits of the 128-bit product, xor-folded.
OPGUARD_HD uint64_t mul128_fold64(uint64_t a, uint64_t b) {
#ifdef __CUDA_ARCH__
  return (a * b) ^ __umul64hi(a, b);
#else
  const unsigned __int128 p = static_cast<unsigned __int128>(a) * b;
  return static_cast<uint64_t>(p) ^ static_cast<uint64_t>(p >> 64);
#endif
}

OPGUARD_HD uint64_t avalanche_xxh64(uint64_t h) {
  h ^= h >> 33;
  h *= kPrime64_2;
  h ^= h >> 29;
  h *= kPrime64_3;
  return h ^ (h >> 32);
}
OPGUARD_HD uint64_t avalanche(uint64_t h) {
  h ^= h >> 37;
  h *= 0x165667919E3779F9ull;
  return h ^ (h >> 32);
}
OPGUARD_HD uint64_t rrmxmx(uint64_t h, uint64_t len) {
  h ^= rotl64(h, 49) ^ rotl64(h, 24);
  h *= 0x9FB21C651E98DF25ull;
  h ^= (h >> 35) + len;
  h *= 0x9FB21C651E98DF25ull;
  return h ^ (h >> 28);
}
OPGUARD_HD uint64_t mix16(const uint8_t* in, std::size_t secret_off) {
  return mul128_fold64(load64(in) ^ secret64(secret_off), load64(in + 8) ^ secret64(secret_off + 8));
}

// Inputs of 0 to 240 bytes (the spec's short and mid-size paths).
OPGUARD_HD uint64_t hash_short(const uint8_t* in, std::size_t len) {
  if (len == 0) return avalanche_xxh64(secret64(56) ^ secret64(64));
  if (len <= 3) {
    const uint32_t combined = static_cast<uint32_t>(in[0]) << 16 | static_cast<uint32_t>(in[len >> 1]) << 24 |
                              static_cast<uint32_t>(in[len - 1]) | static_cast<uint32_t>(len) << 8;
    return avalanche_xxh64(static_cast<uint64_t>(combined) ^ (secret32(0) ^ secret32(4)));
  }
  if (len <= 8) {
    const uint64_t lo = load32(in + len - 4), hi = load32(in);
    const uint64_t keyed = (lo + (hi << 32)) ^ (secret64(8) ^ secret64(16));
    return rrmxmx(keyed, len);
  }
  if (len <= 16) {
    const uint64_t lo = load64(in) ^ (secret64(24) ^ secret64(32));
    const uint64_t hi = load64(in + len - 8) ^ (secret64(40) ^ secret64(48));
    return avalanche(len + swap64(lo) + hi + mul128_fold64(lo, hi));
  }
  uint64_t acc = len * kPrime64_1;
  if (len <= 128) {
    if (len > 32) {
      if (len > 64) {
        if (len > 96) {
          acc += mix16(in + 48, 96);
          acc += mix16(in + len - 64, 112);
        }
        acc += mix16(in + 32, 64);
        acc += mix16(in + len - 48, 80);
      }
      acc += mix16(in + 16, 32);
      acc += mix16(in + len - 32, 48);
    }
    acc += mix16(in, 0);
    acc += mix16(in + len - 16, 16);
    return avalanche(acc);
  }
  const std::size_t rounds = len / 16;
  for (std::size_t i = 0; i < 8; ++i) acc += mix16(in + 16 * i, 16 * i);
  acc = avalanche(acc);
  for (std::size_t i = 8; i < rounds; ++i) acc += mix16(in + 16 * i, 16 * (i - 8) + 3);
  acc += mix16(in + len - 16, 136 - 17);
  return avalanche(acc);
}

// --- long inputs, lane by lane ----------------------------------------------

OPGUARD_HD uint64_t lane_init(int lane) {
  switch (lane) {
    case 0: return kPrime32_3;
    case 1: return kPrime64_1;
    case 2: return kPrime64_2;
    case 3: return kPrime64_3;
    case 4: return kPrime64_4;
    case 5: return kPrime32_2;
    case 6: return kPrime64_5;
    default: return kPrime32_1;
  }
}

// Lane `lane`'s term from one stripe: `own` is the stripe's 64-bit word at
// `lane`, `neighbour` the word at lane ^ 1, `key` the secret word for it.
OPGUARD_HD uint64_t stripe_term(uint64_t own, uint64_t neighbour, uint64_t key) {
  const uint64_t k = own ^ key;
  return neighbour + (k & 0xffffffffull) * (k >> 32);
}

// Sum of lane `lane`'s terms over `stripes` stripes starting at `in`, stripe
// s keyed by secret offset 8 * s (the layout inside one block).
OPGUARD_HD uint64_t block_lane_sum(const uint8_t* in, std::size_t stripes, int lane) {
  uint64_t sum = 0;
  for (std::size_t s = 0; s < stripes; ++s) {
    const uint8_t* p = in + s * kStripeBytes;
    sum += stripe_term(load64(p + 8 * lane), load64(p + 8 * (lane ^ 1)), secret64(8 * (s + lane)));
  }
  return sum;
}

OPGUARD_HD uint64_t scramble(uint64_t acc, int lane) {
  acc ^= acc >> 47;
  acc ^= secret64(kSecretSize - kStripeBytes + 8 * lane);
  return acc * kPrime32_1;
}

// Number of whole blocks the long path scrambles after (the last, possibly
// partial, block is handled by finish_lane).
OPGUARD_HD std::size_t full_blocks(std::size_t len) { return (len - 1) / kBlockBytes; }

// A lane's accumulator after all full blocks, plus the tail: the remaining
// whole stripes and the last 64 bytes (keyed at offset 192 - 64 - 7).
OPGUARD_HD uint64_t finish_lane(uint64_t acc, const uint8_t* in, std::size_t len, int lane) {
  const std::size_t blocks = full_blocks(len);
  const std::size_t tail_stripes = ((len - 1) - blocks * kBlockBytes) / kStripeBytes;
  acc += block_lane_sum(in + blocks * kBlockBytes, tail_stripes, lane);
  const uint8_t* last = in + len - kStripeBytes;
  acc += stripe_term(load64(last + 8 * lane), load64(last + 8 * (lane ^ 1)),
                     secret64(kSecretSize - kStripeBytes - 7 + 8 * lane));
  return acc;
}

// Merges the 8 final lane accumulators into the hash.
OPGUARD_HD uint64_t merge_lanes(const uint64_t* acc, std::size_t len) {
  uint64_t r = len * kPrime64_1;
  for (int i = 0; i < 4; ++i)
    r += mul128_fold64(acc[2 * i] ^ secret64(11 + 16 * i), acc[2 * i + 1] ^ secret64(11 + 16 * i + 8));
  return avalanche(r);
}

// Serial XXH3-64 over any length, in the kernel's lane decomposition.
OPGUARD_HD uint64_t hash(const uint8_t* in, std::size_t len) {
  if (len <= kMidSizeMax) return hash_short(in, len);
  uint64_t acc[8];
  const std::size_t blocks = full_blocks(len);
  for (int lane = 0; lane < 8; ++lane) {
    uint64_t a = lane_init(lane);
    for (std::size_t b = 0; b < blocks; ++b) a = scramble(a + block_lane_sum(in + b * kBlockBytes, kStripesPerBlock, lane), lane);
    acc[lane] = finish_lane(a, in, len, lane);
  }
  return merge_lanes(acc, len);
}

}  // namespace opguard::kernels::xxh3
