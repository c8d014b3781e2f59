// The writer queue's bound over thousands of steps, in this process: a small
// training loop (one 128x128 weight, ~12 events a step) recorded with full
// tensors behind a 256 KiB queue while the writer is slowed down
// (OPGUARD_TEST_WRITER_DELAY_US), so that tensors arrive faster than it
// writes them. Both policies: wait (nothing dropped) and drop (dropped
// tensors counted). The bound is checked on the recorder's own count
// (peak_queued_bytes) and on the process's peak memory (VmHWM), which must
// not grow between step 200 and step 2000.
//   ./build/bin/opguard_queue_bound_test -s   prints the figures

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <stdlib.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>

#include "opguard/formats/recording.h"
#include "opguard/record/recorder.h"
#include "opguard/record/scope.h"

// doctest after the torch headers (STYLE.md: glog's CHECK).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kBound = 256 << 10;
constexpr int kSteps = 2000;
constexpr int kEarlyStep = 200;
// Memory that is not the queue may still move a little between step 200 and
// step 2000 (the allocator's free lists, HDF5's caches): 16 MiB is far below
// what the queue would hold unbounded (the control below) and far above that.
constexpr uint64_t kRssMargin = uint64_t{16} << 20;

uint64_t vm_hwm_bytes() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  REQUIRE(f != nullptr);
  char line[256];
  uint64_t kib = 0;
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (std::sscanf(line, "VmHWM: %" SCNu64 " kB", &kib) == 1) break;
  std::fclose(f);
  REQUIRE(kib > 0);
  return kib * 1024;
}

// Resets VmHWM to the current resident size ("5" > clear_refs, Linux 4.0+),
// so that each recorded loop measures its own peak. Returns false if the
// kernel does not allow it (then the runs are ordered so that no earlier run
// had a higher peak than the one measured).
bool reset_vm_hwm() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (f == nullptr) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

struct LoopResult {
  uint32_t loss_bits = 0;        // the last step's loss
  uint64_t weight_checksum = 0;  // the final weight's bits
  uint64_t rss_early = 0;        // VmHWM after kEarlyStep steps
  uint64_t rss_end = 0;          // VmHWM at the end
};

// A deterministic training loop: loss = sum(tanh(x @ w)), plain SGD.
LoopResult train(int steps) {
  at::manual_seed(7);
  at::Tensor x = at::randn({32, 128});
  at::Tensor w = at::randn({128, 128}).mul_(0.05).requires_grad_(true);
  LoopResult r;
  for (int step = 0; step < steps; ++step) {
    at::Tensor loss = at::tanh(at::mm(x, w)).sum();
    loss.backward();
    {
      at::NoGradGuard no_grad;
      w.sub_(w.grad() * 0.001);
      w.mutable_grad().zero_();
    }
    float value = loss.item<float>();
    std::memcpy(&r.loss_bits, &value, sizeof value);
    opguard::mark_step();
    if (step + 1 == kEarlyStep) r.rss_early = vm_hwm_bytes();
  }
  at::Tensor c = w.detach().contiguous();
  const auto* bits = static_cast<const uint32_t*>(c.const_data_ptr());
  for (int64_t i = 0; i < c.numel(); ++i) r.weight_checksum = r.weight_checksum * 1000003 + bits[i];
  r.rss_end = vm_hwm_bytes();
  return r;
}

struct RecordedLoop {
  LoopResult loop;
  std::map<std::string, std::string> info;
  uint64_t peak_queued = 0;
  uint64_t flagged_dropped = 0;  // values flagged kTensorDropped in the step files
  uint64_t events = 0;
  std::size_t step_files = 0;
};

RecordedLoop record_loop(const std::string& dir, int steps, const std::string& queue) {
  opguard::RecorderOptions options;
  options.out_dir = dir;
  options.policy = "all";
  options.queue = queue;
  opguard::Recorder::start(options);
  RecordedLoop r;
  reset_vm_hwm();
  r.loop = train(steps);
  opguard::Recorder::stop();
  auto layout = opguard::formats::scan_recording(dir);
  REQUIRE(layout.ranks.size() == 1);
  r.info = opguard::formats::read_manifest(layout.ranks[0].manifest_path).info;
  r.peak_queued = std::stoull(r.info.at("peak_queued_bytes"));
  r.step_files = layout.ranks[0].steps.size();
  for (const auto& [step, path] : layout.ranks[0].steps) {
    opguard::formats::StepReader reader(path);
    for (const auto& e : reader.events()) {
      ++r.events;
      for (const auto* values : {&e.inputs, &e.outputs})
        for (const auto& v : *values) r.flagged_dropped += (v.tensor.flags & opguard::formats::kTensorDropped) ? 1 : 0;
    }
  }
  fs::remove_all(dir);
  return r;
}

std::string temp_dir() {
  char tmpl[] = "/tmp/opguard-queue-test-XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  return tmpl;
}

}  // namespace

TEST_CASE("a writer slower than the training keeps the queue within its bound for 2000 steps, under wait and drop") {
  // 200 us a written event: a step's ~12 events of 16-64 KiB arrive in well
  // under the 2.4 ms the writer then needs for them.
  REQUIRE(setenv("OPGUARD_TEST_WRITER_DELAY_US", "200", 1) == 0);
  const std::string tmp = temp_dir();
  const LoopResult plain = train(kSteps);
  const bool hwm_resets = reset_vm_hwm();
  MESSAGE("VmHWM " << std::string(hwm_resets ? "is reset before each recorded loop" : "cannot be reset here (clear_refs)"));

  RecordedLoop wait = record_loop(tmp + "/wait", kSteps, "bytes=256K;policy=wait");
  RecordedLoop drop = record_loop(tmp + "/drop", kSteps, "bytes=256K;policy=drop");
  // Control (last: its queue raises the process's peak memory): with a bound
  // it never reaches, the slowed writer falls behind by many times kBound
  // within 200 steps, so the bound is what held the queue above, not a fast
  // disk.
  RecordedLoop unbounded = record_loop(tmp + "/unbounded", kEarlyStep, "bytes=1G;policy=wait");
  REQUIRE(unbounded.peak_queued > 8 * kBound);
  // And VmHWM sees such a queue: the memory check above can fail.
  if (hwm_resets && unbounded.peak_queued > 2 * kRssMargin)
    REQUIRE(unbounded.loop.rss_end > wait.loop.rss_early + kRssMargin);
  for (const RecordedLoop* r : {&wait, &drop}) {
    // The recording changes no bit of the training.
    REQUIRE(r->loop.loss_bits == plain.loss_bits);
    REQUIRE(r->loop.weight_checksum == plain.weight_checksum);
    REQUIRE(r->info.at("clean_exit") == "1");
    // kSteps steps, plus the final weight checksum's ops after the last mark_step.
    REQUIRE(r->step_files == static_cast<std::size_t>(kSteps) + 1);
    REQUIRE(r->peak_queued <= kBound);
    REQUIRE(r->loop.rss_end <= r->loop.rss_early + kRssMargin);
  }
  // wait: complete; drop: every event kept, the dropped tensors counted.
  REQUIRE(wait.info.at("dropped_tensors") == "0");
  REQUIRE(wait.flagged_dropped == 0);
  REQUIRE(drop.flagged_dropped > 0);
  REQUIRE(drop.info.at("dropped_tensors") == std::to_string(drop.flagged_dropped));
  REQUIRE(drop.events == wait.events);
  REQUIRE(wait.info.at("events") == std::to_string(wait.events));
  MESSAGE("queue bound " << kBound << " bytes, writer slowed by 200 us/event, " << kSteps << " steps, "
                         << wait.events << " events, full tensors for all: unbounded control peaks at "
                         << unbounded.peak_queued << " queued bytes by step " << kEarlyStep
                         << "; wait: peak queue " << wait.peak_queued << " bytes, VmHWM " << (wait.loop.rss_early >> 20)
                         << " MiB at step " << kEarlyStep << " -> " << (wait.loop.rss_end >> 20)
                         << " MiB at step " << kSteps << ", 0 dropped; drop: peak queue " << drop.peak_queued
                         << " bytes, VmHWM " << (drop.loop.rss_early >> 20) << " -> " << (drop.loop.rss_end >> 20)
                         << " MiB, " << drop.flagged_dropped << " tensors dropped (manifest dropped_tensors "
                         << drop.info.at("dropped_tensors") << "), no event lost");
  fs::remove_all(tmp);
}
