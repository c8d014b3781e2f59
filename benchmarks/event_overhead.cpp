// The recorder's fixed cost per event: loops of small operators (so that
// hashing costs next to nothing) timed unrecorded and under opguard::Recorder
// in the same process, interleaved, median of the repeats.
//
//   opguard_event_overhead [--ops N] [--repeats R] [--dir D]
//
// Prints per workload the time per operator unrecorded and recorded, their
// ratio, and the difference: what every event of a training step costs on the
// training thread besides hashing (tiny_gpt at width 128 runs about 1,300
// events a step). Runs on one intra-op thread, like record_overhead.py.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "opguard/record/recorder.h"
#include "median.h"

namespace {

using opguard::bench::median;

// Microseconds per call of `body` over `ops` calls.
double time_per_op(const std::function<void()>& body, int ops) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < ops; ++i) body();
  const auto end = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(end - start).count() / ops;
}

struct Workload {
  const char* name;
  std::function<void()> body;
  int events = 1;  // recorded events per call of body
};

}  // namespace

int main(int argc, char** argv) {
  int ops = 100000;
  int repeats = 5;
  std::string dir;
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (std::strcmp(argv[i], "--ops") == 0 && has_value) {
      ops = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--repeats") == 0 && has_value) {
      repeats = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--dir") == 0 && has_value) {
      dir = argv[++i];
    } else {
      std::fprintf(stderr, "usage: opguard_event_overhead [--ops N] [--repeats R] [--dir D]\n");
      return 2;
    }
  }
  if (dir.empty()) {
    char tmpl[] = "/tmp/opguard-event-overhead-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      std::perror("mkdtemp");
      return 1;
    }
    dir = tmpl;
  }
  at::set_num_threads(1);
  at::Tensor x = at::ones({4});
  at::Tensor y = at::ones({4});
  at::Tensor bias = at::ones({4, 4});
  at::Tensor a = at::full({4, 8}, 0.5f);
  at::Tensor b = at::full({8, 4}, 0.25f);
  at::Tensor z;
  // An optimizer's in-place chain (AdamW's moments) on a 64 KiB tensor: each
  // op writes the memory whose previous version's fingerprint may still be
  // outstanding.
  at::Tensor moment = at::full({128, 128}, 0.5f);
  at::Tensor grad = at::full({128, 128}, 0.25f);
  const std::vector<Workload> workloads = {
      {"add (2 tensors in, 1 out)", [&] { y = x.add(y); }},
      {"addmm (3 tensors in, 1 out)", [&] { z = at::addmm(bias, a, b); }},
      {"mul_ then add_, 64 KiB (2 ops)",
       [&] {
         moment.mul_(0.5);
         moment.add_(grad, 0.5);
       },
       2},
  };

  std::printf("%d ops per run, median of %d interleaved repeats, 1 intra-op thread\n", ops, repeats);
  std::printf("%-30s %14s %14s %8s %16s\n", "workload", "unrecorded us", "recorded us", "ratio", "us per event");
  int run = 0;
  for (const Workload& w : workloads) {
    for (int i = 0; i < ops / 10; ++i) w.body();  // warm up: allocator, dispatcher caches
    std::vector<double> plain, recorded, ratios;
    for (int r = 0; r < repeats; ++r) {
      plain.push_back(time_per_op(w.body, ops));
      opguard::RecorderOptions options;
      options.out_dir = dir + "/run" + std::to_string(run++);
      opguard::Recorder::start(options);
      recorded.push_back(time_per_op(w.body, ops));
      opguard::Recorder::stop();
      std::filesystem::remove_all(options.out_dir);
      ratios.push_back(recorded.back() / plain.back());
    }
    const double p = median(plain);
    const double q = median(recorded);
    std::printf("%-30s %14.3f %14.3f %8.2f %16.3f\n", w.name, p / w.events, q / w.events, median(ratios),
                (q - p) / w.events);
  }
  std::filesystem::remove_all(dir);
  std::printf("ratio: median over repeats of recorded over the unrecorded run just before it\n");
  return 0;
}
