// Fingerprint throughput against baselines measured in the same run on the
// same bytes (docs/KERNELS.md, "Benchmarks"):
//   CPU  memcpy (one thread), XXH3-64 of the whole buffer (one thread), the
//        fingerprint on one thread and on a HashPool of --threads threads,
//        XXH3 on as many threads (a slice each: the memory system's ceiling);
//        target: fingerprint per thread >= 0.9 of XXH3 on one thread.
//   CUDA (built with CUDA and a GPU present) a device-to-device cudaMemcpy,
//        fingerprint_cuda and compare_cuda of the same bytes; target >= 0.7 of
//        the copy's bandwidth.
// Each figure is the best of --repeats runs (the machine is shared; the best
// run is the least disturbed). Prints one line per figure and the ratios.
//
//   opguard_fingerprint_throughput [--mib 256] [--repeats 5] [--threads N] [--no-cuda]

#include <xxhash.h>
// The runtime-dispatched XXH3 (AVX2 / AVX-512), as fingerprint.cpp uses: the
// baseline is the fastest XXH3 this machine has.
#include <xxh_x86dispatch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "opguard/kernels/compare.h"
#include "opguard/kernels/cuda.h"
#include "opguard/kernels/fingerprint.h"

#ifdef OPGUARD_BENCH_CUDA
#include <cuda_runtime.h>
#endif

namespace kernels = opguard::kernels;

namespace {

double best_seconds(int repeats, const std::function<void()>& fn) {
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

double gbps(std::size_t bytes, double seconds) { return static_cast<double>(bytes) / seconds / 1e9; }

volatile uint64_t g_sink = 0;  // keeps the hashes from being optimised away

#ifdef OPGUARD_BENCH_CUDA
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

void bench_cuda(const std::vector<float>& host, int repeats, uint64_t cpu_fp) {
  const std::size_t bytes = host.size() * sizeof(float);
  void *a = nullptr, *b = nullptr;
  check(cudaMalloc(&a, bytes), "cudaMalloc");
  check(cudaMalloc(&b, bytes), "cudaMalloc");
  check(cudaMemcpy(a, host.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  const int64_t sizes[] = {static_cast<int64_t>(host.size())};
  kernels::TensorView v;
  v.dtype = opguard::DType::kFloat32;
  v.sizes = sizes;
  v.ndim = 1;
  v.data = a;
  // Warm up (module load, first launch) outside the timing.
  check(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy D2D");
  const uint64_t gpu_fp = kernels::fingerprint_cuda(v);
  (void)kernels::compare_cuda(opguard::DType::kFloat32, a, b, static_cast<int64_t>(host.size()));
  const double copy = best_seconds(repeats, [&] {
    check(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy D2D");
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  });
  const double fp = best_seconds(repeats, [&] { g_sink = g_sink + kernels::fingerprint_cuda(v); });
  kernels::CompareResult cmp;
  const double cmpt = best_seconds(repeats, [&] {
    cmp = kernels::compare_cuda(opguard::DType::kFloat32, a, b, static_cast<int64_t>(host.size()));
  });
  std::printf("cuda copy D2D              %8.1f GB/s  (bytes copied / s)\n", gbps(bytes, copy));
  std::printf("cuda fingerprint           %8.1f GB/s  ratio to copy %.2f (target >= 0.7)\n", gbps(bytes, fp),
              copy / fp);
  std::printf("cuda compare (2 inputs)    %8.1f GB/s of one input  ratio to copy %.2f (target >= 0.7)\n",
              gbps(bytes, cmpt), copy / cmpt);
  std::printf("cuda fingerprint equals the CPU's: %s; compare of a copy: %lld differing\n",
              gpu_fp == cpu_fp ? "yes" : "NO", static_cast<long long>(cmp.differing));
  cudaFree(a);
  cudaFree(b);
  if (gpu_fp != cpu_fp) std::exit(1);
}
#endif

}  // namespace

int main(int argc, char** argv) {
  std::size_t mib = 256;
  int repeats = 5;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  bool cuda = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--mib") mib = std::strtoull(next(), nullptr, 10);
    else if (a == "--repeats") repeats = std::atoi(next());
    else if (a == "--threads") threads = std::atoi(next());
    else if (a == "--no-cuda") cuda = false;
    else {
      std::fprintf(stderr, "usage: %s [--mib 256] [--repeats 5] [--threads N] [--no-cuda]\n", argv[0]);
      return 2;
    }
  }
  if (mib == 0 || repeats < 1 || threads < 1) {
    std::fprintf(stderr, "--mib, --repeats and --threads take positive numbers\n");
    return 2;
  }
  const std::size_t bytes = mib << 20;
  std::vector<float> src(bytes / sizeof(float)), dst(src.size());
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (auto& x : src) x = dist(rng);
  std::memcpy(dst.data(), src.data(), bytes);  // touch every page before timing
  const int64_t sizes[] = {static_cast<int64_t>(src.size())};
  auto fp = [&](kernels::HashPool* pool) {
    return kernels::fingerprint_contiguous(opguard::DType::kFloat32, sizes, 1, src.data(), bytes, pool);
  };

  const double t_copy = best_seconds(repeats, [&] { std::memcpy(dst.data(), src.data(), bytes); });
  const double t_xxh = best_seconds(repeats, [&] { g_sink = g_sink + XXH3_64bits(src.data(), bytes); });
  const double t_fp1 = best_seconds(repeats, [&] { g_sink = g_sink + fp(nullptr); });
  kernels::HashPool pool(threads);
  const uint64_t single = fp(nullptr), parallel = fp(&pool);
  const double t_fpn = best_seconds(repeats, [&] { g_sink = g_sink + fp(&pool); });
  // XXH3 on the same threads, each over its own slice: what the memory system
  // gives N hashing threads on this machine, the ceiling for the pool.
  const double t_xxhn = best_seconds(repeats, [&] {
    std::vector<std::thread> workers;
    std::vector<uint64_t> h(static_cast<std::size_t>(threads), 0);
    const std::size_t slice = bytes / static_cast<std::size_t>(threads);
    for (int t = 0; t < threads; ++t) {
      const std::size_t begin = slice * static_cast<std::size_t>(t);
      const std::size_t len = t + 1 == threads ? bytes - begin : slice;
      const auto* from = reinterpret_cast<const uint8_t*>(src.data()) + begin;
      workers.emplace_back([&h, t, from, len] { h[static_cast<std::size_t>(t)] = XXH3_64bits(from, len); });
    }
    for (auto& w : workers) w.join();
    for (uint64_t v : h) g_sink = g_sink + v;
  });

  // Transposed matrices (t() of a weight, read by backward's mm): the view is
  // gathered row-major a block at a time and hashed from there. One the size of a
  // tiny_gpt weight (512 KiB, the same view hashed over and over: in cache,
  // as a weight or activation that was just computed), and the whole buffer
  // as one 1024-row matrix (from memory; columns 4 KiB apart, a page each).
  struct Transposed {
    int64_t rows, cols;  // of the contiguous matrix; the view is cols x rows
    double seconds = 0, pooled = 0;
    bool equal = false;
  };
  std::vector<Transposed> transposed_cases = {{128, 1024}, {static_cast<int64_t>(src.size()) / 1024, 1024}};
  for (Transposed& c : transposed_cases) {
    const int64_t n = c.rows * c.cols;
    const int64_t count = static_cast<int64_t>(src.size()) / n;
    const bool in_cache = count > 1;
    const int64_t t_sizes[] = {c.cols, c.rows}, t_strides[] = {1, c.cols};
    auto view_at = [&](int64_t k) {
      return kernels::TensorView{opguard::DType::kFloat32, t_sizes, t_strides, 2, src.data() + k * n};
    };
    c.seconds = best_seconds(repeats, [&] {
      for (int64_t k = 0; k < count; ++k) g_sink = g_sink + kernels::fingerprint(view_at(in_cache ? 0 : k));
    }) / static_cast<double>(count);
    c.pooled = best_seconds(repeats, [&] {
      for (int64_t k = 0; k < count; ++k) g_sink = g_sink + kernels::fingerprint(view_at(in_cache ? 0 : k), &pool);
    }) / static_cast<double>(count);
    kernels::gather_contiguous(view_at(0), dst.data());
    c.equal = kernels::fingerprint(view_at(0)) == kernels::fingerprint(view_at(0), &pool) &&
              kernels::fingerprint(view_at(0)) ==
              kernels::fingerprint_contiguous(opguard::DType::kFloat32, t_sizes, 2, dst.data(),
                                              static_cast<std::size_t>(n) * sizeof(float));
  }

  std::printf("buffer %zu MiB float32, best of %d, %d thread(s) in the pool\n", mib, repeats, threads);
  std::printf("cpu memcpy (1 thread)      %8.2f GB/s\n", gbps(bytes, t_copy));
  std::printf("cpu XXH3-64 (1 thread)     %8.2f GB/s  (xxhash %u, runtime-dispatched)\n", gbps(bytes, t_xxh),
              XXH_versionNumber());
  std::printf("cpu fingerprint 1 thread   %8.2f GB/s  ratio to XXH3 %.3f (target >= 0.9)  to memcpy %.2f\n",
              gbps(bytes, t_fp1), t_xxh / t_fp1, t_copy / t_fp1);
  std::printf("cpu fingerprint %2d threads %8.2f GB/s  per thread %.2f GB/s, ratio to XXH3 1 thread %.3f\n", threads,
              gbps(bytes, t_fpn), gbps(bytes, t_fpn) / threads, t_xxh / t_fpn / threads);
  std::printf("cpu XXH3-64 %2d threads     %8.2f GB/s  (a slice per thread); fingerprint %d threads / XXH3 %d threads "
              "%.3f\n", threads, gbps(bytes, t_xxhn), threads, threads, t_xxhn / t_fpn);
  bool transposed_ok = true;
  for (const Transposed& c : transposed_cases) {
    const std::size_t n_bytes = static_cast<std::size_t>(c.rows * c.cols) * sizeof(float);
    std::printf("cpu fingerprint t() %5lld x %-6lld %6.2f GB/s  (1 thread, %zu KiB view) ratio to XXH3 %.3f; "
                "%d threads %.2f GB/s\n",
                static_cast<long long>(c.cols), static_cast<long long>(c.rows), gbps(n_bytes, c.seconds),
                n_bytes >> 10, gbps(n_bytes, c.seconds) / gbps(bytes, t_xxh), threads, gbps(n_bytes, c.pooled));
    transposed_ok = transposed_ok && c.equal;
  }
  std::printf("fingerprint 1 thread == %d threads: %s; transposed views == their row-major copies: %s\n", threads,
              single == parallel ? "yes" : "NO", transposed_ok ? "yes" : "NO");
  if (single != parallel || !transposed_ok) return 1;
#ifdef OPGUARD_BENCH_CUDA
  if (cuda && kernels::cuda_available()) bench_cuda(src, repeats, single);
  else std::printf("cuda: %s\n", cuda ? "no usable GPU here (skipped)" : "skipped (--no-cuda)");
#else
  std::printf("cuda: not built (OPGUARD_CUDA off or no nvcc)\n");
  (void)cuda;
#endif
  return 0;
}
