#include "cuda_reference.h"

#include <algorithm>
#include <vector>

#include "xxh3_portable.h"

namespace opguard::kernels {

uint64_t fingerprint_reference(const TensorView& view) {
  const std::size_t nbytes = static_cast<std::size_t>(view.numel()) * dtype_size(view.dtype);
  std::vector<uint8_t> bytes(nbytes);
  gather_contiguous(view, bytes.data());
  std::vector<uint64_t> hashes;
  for (std::size_t off = 0; off < nbytes; off += kFingerprintChunkBytes)
    hashes.push_back(xxh3::hash(bytes.data() + off, std::min(kFingerprintChunkBytes, nbytes - off)));
  return combine_chunk_hashes(view.dtype, view.sizes, view.ndim, nbytes, hashes.data(), hashes.size());
}

}  // namespace opguard::kernels
