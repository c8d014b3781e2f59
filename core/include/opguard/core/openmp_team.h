// Runs a function once on every thread of an OpenMP team of the calling
// thread's current size (torch's intra-op threads: at::set_num_threads sets
// it), the calling thread included: for per-thread state that torch sets on
// the calling thread only, such as the MXCSR's flush-to-zero bits of
// torch.set_flush_denormal (a worker keeps the MXCSR it was created with).
//
// Through libgomp's entry point GOMP_parallel, what `#pragma omp parallel`
// compiles to: opguard is not built with OpenMP, and at::parallel_for's
// inline OpenMP path then runs on the calling thread alone. libgomp is the
// one torch loaded (the pip wheel's torch/lib/libgomp.so.1).
//
// Header-only, like written_arguments.h: used by record/run_info.cpp and
// replay/execute.cpp.
#pragma once

#include <dlfcn.h>

#include <atomic>

namespace opguard {

// False, running nothing, where the process has no libgomp (another
// parallel backend, or torch not loaded).
inline bool on_every_openmp_thread(void (*fn)(void*), void* data) {
  using Parallel = void (*)(void (*)(void*), void*, unsigned, unsigned);
  static const Parallel parallel = [] {
    void* symbol = dlsym(RTLD_DEFAULT, "GOMP_parallel");
    if (symbol == nullptr) {
      // torch loaded by Python without RTLD_GLOBAL: ask the library itself.
      if (void* lib = dlopen("libgomp.so.1", RTLD_LAZY | RTLD_NOLOAD)) symbol = dlsym(lib, "GOMP_parallel");
    }
    return reinterpret_cast<Parallel>(symbol);
  }();
  if (parallel == nullptr) return false;
  parallel(fn, data, 0, 0);  // 0 threads: the team size the process set (omp_set_num_threads)
  return true;
}

// fn(value) on every thread of the team. The function and the value travel
// in atomics stored after construction: ThreadSanitizer does not see libgomp
// (not built for it) order the workers after the caller's writes.
inline bool on_every_openmp_thread(void (*fn)(bool), bool value) {
  struct Call {
    std::atomic<void (*)(bool)> fn;
    std::atomic<bool> value;
  } call;
  call.fn.store(fn);
  call.value.store(value);
  return on_every_openmp_thread(
      [](void* data) {
        auto& c = *static_cast<Call*>(data);
        c.fn.load()(c.value.load());
      },
      &call);
}

}  // namespace opguard
