// What a thread that reads the training thread's fresh outputs costs the
// training thread, on this machine: the question behind the recorder's
// hashing thread (docs/BENCHMARKS.md, "What reading on the second core
// costs"). A producer thread, pinned to the first CPU this process may use,
// runs an elementwise loop over a ring of buffers (out = in * a + previous *
// b, the shape of an activation's update), while a reader pinned to the
// second CPU does one of:
//   idle   a loop of pause instructions (the baseline)
//   own    fingerprints a ring of its own buffers: as many bytes hashed,
//          memory the producer never touches
//   lag L  fingerprints each buffer the producer finished, L buffers behind
//          the newest (L = 0: at once, as the recorder's hashing thread does)
// Prints the producer's time per buffer (median of --repeats interleaved
// rounds), its ratio to idle's, and what the reader hashed.
//
// The reader may hash a buffer while the producer rewrites it (only when it
// falls a whole ring behind): the hashes are discarded, the bytes read are
// what is measured.
//
//   opguard_second_core_reader [--kib 512] [--ring 16] [--buffers 20000] [--repeats 5] [--lags 0,1,2,4]

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "median.h"
#include "opguard/kernels/fingerprint.h"

namespace kernels = opguard::kernels;

namespace {

struct Options {
  std::size_t kib = 512;
  std::size_t ring = 16;
  long buffers = 20000;
  int repeats = 5;
  std::vector<long> lags{0, 1, 2, 4};
};

struct Mode {
  std::string name;
  enum Kind { kIdle, kOwn, kLag } kind;
  long lag = 0;
};

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// The n-th CPU this process may run on, or -1.
int nth_cpu(int n) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return -1;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &set) && n-- == 0) return cpu;
  return -1;
}

void pin(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

uint64_t fingerprint(const float* data, std::size_t floats) {
  const int64_t size = static_cast<int64_t>(floats);
  kernels::TensorView view;
  view.sizes = &size;
  view.ndim = 1;
  view.data = data;
  thread_local std::vector<uint64_t> chunks;
  kernels::chunk_hashes(view, &chunks, nullptr);
  return chunks.empty() ? 0 : chunks.front();
}

struct Round {
  double ms_per_buffer = 0;
  double reader_gbps = 0;
};

Round run_round(const Options& o, const Mode& mode, std::vector<std::vector<float>>& ring,
                std::vector<std::vector<float>>& own, const std::vector<float>& in, int cpu0, int cpu1) {
  const std::size_t floats = in.size();
  std::atomic<long> published{-1};
  std::atomic<bool> done{false};
  uint64_t read_bytes = 0;
  std::atomic<uint64_t> sink{0};
  std::thread reader([&] {
    pin(cpu1);
    uint64_t h = 0;
    long seen = -1;
    std::size_t next_own = 0;
    while (!done.load(std::memory_order_acquire)) {
      if (mode.kind == Mode::kIdle) {
        cpu_relax();
        continue;
      }
      if (mode.kind == Mode::kOwn) {
        h += fingerprint(own[next_own++ % own.size()].data(), floats);
        read_bytes += floats * sizeof(float);
        continue;
      }
      const long p = published.load(std::memory_order_acquire);
      if (p == seen || p < mode.lag) {
        cpu_relax();
        continue;
      }
      seen = p;
      h += fingerprint(ring[static_cast<std::size_t>(p - mode.lag) % ring.size()].data(), floats);
      read_bytes += floats * sizeof(float);
    }
    sink.fetch_add(h, std::memory_order_relaxed);
  });
  pin(cpu0);
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < o.buffers; ++i) {
    float* out = ring[static_cast<std::size_t>(i) % ring.size()].data();
    const float* prev = ring[static_cast<std::size_t>(i + static_cast<long>(ring.size()) - 1) % ring.size()].data();
    for (std::size_t j = 0; j < floats; ++j) out[j] = in[j] * 1.0001f + prev[j] * 0.5f;
    published.store(i, std::memory_order_release);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  done.store(true, std::memory_order_release);
  reader.join();
  Round r;
  r.ms_per_buffer = seconds * 1e3 / static_cast<double>(o.buffers);
  r.reader_gbps = static_cast<double>(read_bytes) / seconds / 1e9;
  return r;
}

// "0,1,2,4"; false if any item is not a number.
bool parse_list(const char* text, std::vector<long>* out) {
  out->clear();
  for (const char* p = text; *p != '\0';) {
    char* end = nullptr;
    const long v = std::strtol(p, &end, 10);
    if (end == p || (*end != ',' && *end != '\0')) return false;
    out->push_back(v);
    p = *end == ',' ? end + 1 : end;
  }
  return true;
}

}  // namespace

int run(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 == argc) {
      std::fprintf(stderr, "%s needs a value\n", flag.c_str());
      return 2;
    }
    const char* value = argv[i + 1];
    if (flag == "--kib") {
      o.kib = std::strtoul(value, nullptr, 10);
    } else if (flag == "--ring") {
      o.ring = std::strtoul(value, nullptr, 10);
    } else if (flag == "--buffers") {
      o.buffers = std::strtol(value, nullptr, 10);
    } else if (flag == "--repeats") {
      o.repeats = std::atoi(value);
    } else if (flag == "--lags") {
      if (!parse_list(value, &o.lags)) {
        std::fprintf(stderr, "--lags takes numbers separated by commas, not %s\n", value);
        return 2;
      }
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (o.kib == 0 || o.ring < 2 || o.buffers <= 0 || o.repeats <= 0) {
    std::fprintf(stderr, "--kib, --buffers and --repeats must be positive, --ring at least 2\n");
    return 2;
  }
  const int cpu0 = nth_cpu(0);
  const int cpu1 = nth_cpu(1);
  if (cpu1 < 0) std::fprintf(stderr, "one CPU only: the two threads are not pinned apart\n");
  const std::size_t floats = o.kib * 1024 / sizeof(float);
  std::vector<float> in(floats);
  for (std::size_t j = 0; j < floats; ++j) in[j] = static_cast<float>(j % 1000) * 1e-3f;
  std::vector<std::vector<float>> ring(o.ring, std::vector<float>(floats, 0.0f));
  std::vector<std::vector<float>> own(o.ring, std::vector<float>(floats, 1.0f));

  std::vector<Mode> modes{{"idle", Mode::kIdle, 0}, {"own", Mode::kOwn, 0}};
  for (long lag : o.lags) {
    if (lag < 0 || static_cast<std::size_t>(lag) + 1 >= o.ring) {
      std::fprintf(stderr, "lag %ld left out: it must be at least 0 and under --ring minus 1\n", lag);
      continue;
    }
    modes.push_back({"lag " + std::to_string(lag), Mode::kLag, lag});
  }
  std::vector<std::vector<double>> ms(modes.size()), gbps(modes.size());
  for (int r = 0; r < o.repeats; ++r) {
    for (std::size_t m = 0; m < modes.size(); ++m) {
      const Round round = run_round(o, modes[m], ring, own, in, cpu0, cpu1);
      ms[m].push_back(round.ms_per_buffer);
      gbps[m].push_back(round.reader_gbps);
    }
  }
  std::printf("producer: %zu KiB buffers, ring of %zu (%.1f MiB), %ld buffers a round, CPUs %d and %d, %d rounds\n",
              o.kib, o.ring, static_cast<double>(o.kib * o.ring) / 1024.0, o.buffers, cpu0, cpu1, o.repeats);
  const double base = opguard::bench::median(ms[0]);
  for (std::size_t m = 0; m < modes.size(); ++m) {
    const double t = opguard::bench::median(ms[m]);
    std::printf("%-8s %8.4f ms a buffer (%6.2f GB/s written)  ratio %.3f  reader %6.2f GB/s hashed\n",
                modes[m].name.c_str(), t, static_cast<double>(floats * sizeof(float)) / t / 1e6, t / base,
                opguard::bench::median(gbps[m]));
  }
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "opguard_second_core_reader: not enough memory for the buffers (--kib times --ring, twice)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "opguard_second_core_reader: %s\n", e.what());
    return 1;
  }
}
