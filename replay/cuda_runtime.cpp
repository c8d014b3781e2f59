// CUDA for replay without linking it: opguard links the CPU libtorch only, and
// device=cuda:N (and the GPU knobs) load libtorch_cuda.so from beside
// libtorch_cpu the first time a config asks for them. Its static initialisers
// register the CUDA kernels with the dispatcher and the CUDA hooks with ATen,
// as `import torch` does in Python. A CPU run never pays the load (~2 s).

#include <dlfcn.h>
#include <libgen.h>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include <mutex>
#include <string>

#include "opguard/replay/replay.h"

namespace opguard::replay {
namespace {

struct CudaState {
  int devices = 0;
  std::string why;  // when devices == 0
};

// The directory of the libtorch_cpu this process runs.
std::string torch_lib_dir() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&at::get_num_threads), &info) == 0 || info.dli_fname == nullptr) return "";
  std::string path = info.dli_fname;
  return std::string(::dirname(path.data()));
}

CudaState probe() {
  CudaState s;
  const std::string dir = torch_lib_dir();
  if (dir.empty()) {
    s.why = "cannot find the directory of the libtorch this opguard runs";
    return s;
  }
  const std::string lib = dir + "/libtorch_cuda.so";
  if (::dlopen(lib.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    const char* err = ::dlerror();
    s.why = "this libtorch has no CUDA (" + lib + " does not load: " + (err ? err : "unknown error") + ")";
    return s;
  }
  const auto& hooks = at::detail::getCUDAHooks();
  if (!hooks.isBuilt()) {
    s.why = "libtorch_cuda.so loaded but ATen's CUDA hooks were set up before it (report this as an opguard bug)";
    return s;
  }
  s.devices = hooks.getNumGPUs();
  if (s.devices <= 0) {
    s.devices = 0;
    s.why = "this machine has no CUDA device that libtorch can use (no GPU or no NVIDIA driver)";
  }
  return s;
}

}  // namespace

int cuda_device_count(std::string* why) {
  static std::once_flag once;
  static CudaState state;
  std::call_once(once, [] { state = probe(); });
  if (why != nullptr) *why = state.why;
  return state.devices;
}

}  // namespace opguard::replay
