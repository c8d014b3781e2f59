// Replay throughput (issue: Replay, Benchmark), measured in one run on one
// recording (the C++ example with one step dumped in full):
//  - `replay_all` (what `opguard replay --all` does) in events/s and input
//    bytes/s, against the time to just read the same events' full input
//    tensors from the step files (the I/O floor of any replay);
//  - the per-trial cost of one event replayed in a child process (a
//    process-wide knob: env:OPGUARD_REPLAY_BENCH=1) against in this process:
//    the first such trial starts the child (it loads torch), the later ones
//    reuse it (replay/trial_server.h).
//
//   opguard_replay_throughput --opguard build/bin/opguard --tiny-gpt build/bin/tiny_gpt [--steps 2]
//                             [--recording DIR] [--child-trials 5] [--trials 20]
// Without --recording it records `tiny_gpt --steps N --dump-steps N-1` into a
// temporary directory first (not timed).

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "opguard/formats/recording.h"
#include "opguard/replay/replay.h"

namespace {

using namespace opguard;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

bool replayable(const formats::Event& ev) {
  for (const auto& v : ev.inputs) {
    if (!formats::carries_tensor(v.kind)) continue;
    const auto& m = v.tensor;
    if ((m.flags & formats::kTensorUninitialized) || m.numel() == 0) continue;
    if (!(m.flags & formats::kTensorHasData)) return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string opguard_bin, tiny_gpt, recording;
  int steps = 2, child_trials = 5, trials = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--opguard") opguard_bin = v;
    else if (a == "--tiny-gpt") tiny_gpt = v;
    else if (a == "--recording") recording = v;
    else if (a == "--steps") steps = std::atoi(v.c_str());
    else if (a == "--child-trials") child_trials = std::atoi(v.c_str());
    else if (a == "--trials") trials = std::atoi(v.c_str());
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (opguard_bin.empty() || (recording.empty() && tiny_gpt.empty())) {
    std::fprintf(stderr, "usage: %s --opguard OPGUARD (--tiny-gpt TINY_GPT | --recording DIR)\n", argv[0]);
    return 2;
  }
  std::filesystem::path tmp;
  if (recording.empty()) {
    char pattern[] = "/tmp/opguard_replay_bench_XXXXXX";
    if (mkdtemp(pattern) == nullptr) return 74;
    tmp = pattern;
    recording = (tmp / "rec").string();
    const std::string cmd = "'" + opguard_bin + "' record --out '" + recording + "' --dump-steps " +
                            std::to_string(steps - 1) + " -- '" + tiny_gpt + "' --steps " + std::to_string(steps) +
                            " > /dev/null";
    if (std::system(cmd.c_str()) != 0) {
      std::fprintf(stderr, "recording failed: %s\n", cmd.c_str());
      return 1;
    }
  }

  // Baseline: read every full input tensor of the replayable events.
  auto t0 = Clock::now();
  int64_t read_events = 0;
  uint64_t read_bytes = 0;
  std::string small_event;
  uint64_t small_bytes = ~uint64_t{0};
  const auto layout = formats::scan_recording(recording);
  for (const auto& [step, path] : layout.ranks.at(0).steps) {
    formats::StepReader reader(path);
    for (const auto& ev : reader.events()) {
      if (!replayable(ev)) continue;
      ++read_events;
      uint64_t bytes = 0;
      for (const auto& v : ev.inputs)
        if (formats::carries_tensor(v.kind) && (v.tensor.flags & formats::kTensorHasData))
          bytes += reader.read_tensor(v.tensor).bytes.size();
      read_bytes += bytes;
      if (bytes > 0 && bytes < small_bytes && ev.op == "aten::add") {
        small_bytes = bytes;
        small_event = formats::event_id_string(ev.id);
      }
    }
  }
  const double read_s = since(t0);

  replay::ReplayOptions o;
  o.self_exe = opguard_bin;
  t0 = Clock::now();
  int64_t skipped = 0;
  const auto results = replay::replay_all(recording, o, &skipped);
  const double all_s = since(t0);
  int64_t reproduces = 0;
  uint64_t replay_bytes = 0;
  double op_s = 0;
  for (const auto& r : results) {
    reproduces += r.verdict == replay::Verdict::kReproduces;
    replay_bytes += r.input_bytes;
    op_s += r.seconds;
  }
  const double n = static_cast<double>(results.size());
  std::printf("recording %s: %zu events replayed (%lld without full inputs), %lld reproduce\n", recording.c_str(),
              results.size(), static_cast<long long>(skipped), static_cast<long long>(reproduces));
  std::printf("read inputs only : %.3f s  %8.0f events/s  %8.1f MiB/s  (%lld events, %.1f MiB)\n", read_s,
              read_events / read_s, read_bytes / 1048576.0 / read_s, static_cast<long long>(read_events),
              read_bytes / 1048576.0);
  std::printf("replay --all     : %.3f s  %8.0f events/s  %8.1f MiB/s  (ops alone %.3f s)\n", all_s, n / all_s,
              replay_bytes / 1048576.0 / all_s, op_s);
  std::printf("ratio replay/read: %.2f\n", all_s / read_s);

  if (small_event.empty()) {
    std::fprintf(stderr, "no aten::add event with full inputs for the per-trial figures\n");
    return 1;
  }
  // Per trial: one small event (the smallest aten::add), located and replayed.
  t0 = Clock::now();
  for (int i = 0; i < trials; ++i) replay::replay_event(recording, small_event, o);
  const double in_process = since(t0) / trials;
  auto child = o;
  child.config = replay::Config::parse("env:OPGUARD_REPLAY_BENCH=1");
  t0 = Clock::now();
  bool was_child = replay::replay_event(recording, small_event, child).child_process;
  const double first_child = since(t0);
  t0 = Clock::now();
  for (int i = 0; i < child_trials; ++i)
    was_child = replay::replay_event(recording, small_event, child).child_process && was_child;
  const double in_child = since(t0) / child_trials;
  std::printf("per trial, event %s (aten::add, %llu input bytes): in process %.2f ms; child process: the first "
              "(starts it) %.1f ms, the next %d %.2f ms each%s\n",
              small_event.c_str(), static_cast<unsigned long long>(small_bytes), in_process * 1e3, first_child * 1e3,
              child_trials, in_child * 1e3, was_child ? "" : " (NOT a child: check)");
  std::printf("ratio child/in-process: first %.1f, later %.1f\n", first_child / in_process, in_child / in_process);
  if (!tmp.empty()) std::filesystem::remove_all(tmp);
  return 0;
}
