// A tiny "training program" that uses the installed recorder.
//   train DIR   records itself into DIR through opguard::Recorder
//   train       only computes (to be run under `opguard record`)
// Prints the bits of its result so that both runs can be compared.
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/sum.h>
#include <opguard/core/error.h>
#include <opguard/record/recorder.h>
#include <opguard/record/scope.h>

#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
  try {
    if (argc > 1) {
      opguard::RecorderOptions options;
      options.out_dir = argv[1];
      options.policy = "all";
      opguard::Recorder::start(options);
    }
    at::Tensor w = at::ones({4, 4});
    for (int step = 0; step < 2; ++step) {
      {
        opguard::Scope scope("layer");
        w = at::add(at::mul(w, w), w);
      }
      opguard::mark_step();
    }
    float total = at::sum(w).item<float>();
    if (argc > 1) {
      opguard::RecorderStats stats = opguard::Recorder::stats();
      opguard::Recorder::stop();
      std::printf("events %llu\n", static_cast<unsigned long long>(stats.events));
    }
    uint32_t bits = 0;
    std::memcpy(&bits, &total, 4);
    std::printf("result bits %08x\n", bits);
    return 0;
  } catch (const opguard::Error& e) {
    std::fprintf(stderr, "train: %s\n", e.what());
    return 1;
  }
}
