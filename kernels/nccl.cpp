// NCCL all-reduce across this machine's GPUs in one process (nccl.h). Host
// code only: it compiles as C++ against the toolkit's nccl.h and cudart.

#include "opguard/kernels/nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>

namespace opguard::kernels {
namespace {

void check(cudaError_t e, const char* call) {
  if (e != cudaSuccess) throw NcclError(std::string(call) + " failed: " + cudaGetErrorString(e));
}

void check(ncclResult_t r, const char* call) {
  if (r != ncclSuccess) throw NcclError(std::string(call) + " failed: " + ncclGetErrorString(r));
}

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat64: return ncclFloat64;
    case DType::kFloat16: return ncclFloat16;
    case DType::kBFloat16: return ncclBfloat16;
    default:
      throw UsageError("an NCCL all-reduce replay takes float32, float64, float16 or bfloat16, not " +
                       std::string(dtype_name(d)));
  }
}

// Per-GPU state, released in the destructor whatever happened.
struct Ranks {
  std::vector<ncclComm_t> comms;
  std::vector<void*> buffers;
  std::vector<cudaStream_t> streams;
  ~Ranks() {
    for (std::size_t r = 0; r < buffers.size(); ++r) {
      cudaSetDevice(static_cast<int>(r));
      if (buffers[r] != nullptr) cudaFree(buffers[r]);
      if (r < streams.size() && streams[r] != nullptr) cudaStreamDestroy(streams[r]);
    }
    for (auto c : comms)
      if (c != nullptr) ncclCommDestroy(c);
  }
};

}  // namespace

bool nccl_built() { return true; }

int nccl_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver or no GPU: a sticky error to clear
    return 0;
  }
  return n;
}

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "";
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

std::vector<std::vector<uint8_t>> nccl_allreduce(DType dtype, const void* const* partials, int ranks, int64_t numel,
                                                 const NcclOptions& options) {
  const ncclDataType_t type = nccl_type(dtype);
  if (ranks < 1 || numel < 0) throw UsageError("an NCCL all-reduce needs at least one rank and a size >= 0");
  const int devices = nccl_device_count();
  if (devices < ranks)
    throw UsageError("an NCCL all-reduce over " + std::to_string(ranks) + " ranks needs " + std::to_string(ranks) +
                     " GPUs; this machine has " + std::to_string(devices));
  if (!options.algo.empty()) setenv("NCCL_ALGO", options.algo.c_str(), 1);
  if (!options.proto.empty()) setenv("NCCL_PROTO", options.proto.c_str(), 1);
  const std::size_t bytes = static_cast<std::size_t>(numel) * dtype_size(dtype);
  Ranks st;
  st.comms.assign(static_cast<std::size_t>(ranks), nullptr);
  std::vector<int> devlist(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) devlist[static_cast<std::size_t>(r)] = r;
  check(ncclCommInitAll(st.comms.data(), ranks, devlist.data()), "ncclCommInitAll");
  st.buffers.assign(static_cast<std::size_t>(ranks), nullptr);
  st.streams.assign(static_cast<std::size_t>(ranks), nullptr);
  for (int r = 0; r < ranks; ++r) {
    check(cudaSetDevice(r), "cudaSetDevice");
    check(cudaStreamCreate(&st.streams[static_cast<std::size_t>(r)]), "cudaStreamCreate");
    check(cudaMalloc(&st.buffers[static_cast<std::size_t>(r)], bytes > 0 ? bytes : 1), "cudaMalloc");
    if (bytes > 0)
      check(cudaMemcpy(st.buffers[static_cast<std::size_t>(r)], partials[r], bytes, cudaMemcpyHostToDevice),
            "cudaMemcpy to the device");
  }
  // One thread drives every communicator: the calls must be grouped.
  check(ncclGroupStart(), "ncclGroupStart");
  for (int r = 0; r < ranks; ++r) {
    const auto i = static_cast<std::size_t>(r);
    check(ncclAllReduce(st.buffers[i], st.buffers[i], static_cast<std::size_t>(numel), type, ncclSum, st.comms[i],
                        st.streams[i]),
          "ncclAllReduce");
  }
  check(ncclGroupEnd(), "ncclGroupEnd");
  std::vector<std::vector<uint8_t>> out(static_cast<std::size_t>(ranks), std::vector<uint8_t>(bytes));
  for (int r = 0; r < ranks; ++r) {
    const auto i = static_cast<std::size_t>(r);
    check(cudaSetDevice(r), "cudaSetDevice");
    check(cudaStreamSynchronize(st.streams[i]), "cudaStreamSynchronize");
    if (bytes > 0) check(cudaMemcpy(out[i].data(), st.buffers[i], bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
  }
  return out;
}

}  // namespace opguard::kernels
