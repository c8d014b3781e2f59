// Diff throughput (issue: Diff, Benchmark): two synthetic recordings of N
// events each (fingerprints only), identical and with 1% of events perturbed;
// prints events aligned per second and the time of `diff_recordings` against
// simply reading both event tables (StepReader: every column read and
// validated, as the diff reads them), measured in the same run.
//
//   opguard_diff_throughput [--events N] [--steps S] [--repeats R] [--dir D] [--keep]
//
// Read and diff are each timed R times (default 3), back to back, and the
// median is printed (the machine may be shared). --keep leaves the recordings
// under D and reuses them when D already holds them (to profile the diff
// alone: perf record ... --keep, twice).

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "opguard/bisect/diff.h"
#include "opguard/formats/recording.h"
#include "median.h"

namespace {

using namespace opguard;
using formats::Event;
using formats::Value;
using formats::ValueKind;

Value tensor(const char* name, uint64_t storage, uint64_t fp, int64_t rows) {
  Value v;
  v.kind = ValueKind::kTensor;
  v.name = name;
  v.tensor.sizes = {rows, 64};
  v.tensor.strides = {64, 1};
  v.tensor.storage_id = storage;
  v.tensor.fingerprint = fp;
  return v;
}

// A program of `steps` steps: each event reads the previous event's output
// and a parameter, and writes a fresh tensor. `perturb_every` > 0 changes the
// output bits of every perturb_every-th event (and so its consumer's input).
void write_run(const std::string& dir, int64_t events, int steps, int64_t perturb_every) {
  static const char* kOps[] = {"aten::mm", "aten::add", "aten::gelu", "aten::layer_norm", "aten::softmax",
                               "aten::mul", "aten::sum", "aten::transpose"};
  static const char* kScopes[] = {"blocks.0.attn", "blocks.0.mlp", "blocks.1.attn", "blocks.1.mlp", "head"};
  std::filesystem::create_directories(formats::rank_dir(dir, 0));
  formats::Manifest m;
  m.info["program"] = "synthetic";
  formats::write_manifest(formats::rank_dir(dir, 0) + "/manifest.h5", m);
  const int64_t per_step = events / steps;
  uint64_t seq = 0, storage = 1000;
  uint64_t prev_storage = 1, prev_fp = 1;
  int64_t t = 0;
  for (int s = 0; s < steps; ++s) {
    formats::StepWriter w(formats::rank_dir(dir, 0) + "/" + formats::step_file_name(s), 0, s);
    for (int64_t k = 0; k < per_step; ++k, ++seq) {
      Event e;
      e.seq = seq;
      e.id = formats::make_event_id(0, seq);
      e.step = s;
      e.phase = static_cast<formats::Phase>((k * 3) / per_step);
      e.op = kOps[seq % 8];
      e.scope = kScopes[(seq / 8) % 5];
      e.schema = e.op + "(Tensor self, Tensor other) -> Tensor";
      e.t_start_ns = t += 1000;
      e.t_end_ns = t += 500;
      const int64_t rows = 1 + static_cast<int64_t>(seq % 4);
      e.inputs.push_back(tensor("self", prev_storage, prev_fp, rows));
      e.inputs.push_back(tensor("other", 1 + seq % 37, 77 + seq % 37, rows));
      Value alpha;
      alpha.kind = ValueKind::kDouble;
      alpha.name = "alpha";
      alpha.text = "0x1p+0";
      e.inputs.push_back(alpha);
      uint64_t fp = (seq + 1) * 0x9e3779b97f4a7c15ULL;
      if (perturb_every > 0 && seq % static_cast<uint64_t>(perturb_every) == static_cast<uint64_t>(perturb_every / 2)) fp ^= 1;
      e.outputs.push_back(tensor("", ++storage, fp, rows));
      prev_storage = storage;
      prev_fp = fp;
      w.add_event(std::move(e));
    }
    w.close();
  }
}

// CPU seconds (user + system) of every thread of this process so far.
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double read_both(const std::string& a, const std::string& b) {
  const auto t0 = std::chrono::steady_clock::now();
  std::size_t n = 0;
  for (const auto& dir : {a, b})
    for (const auto& r : formats::scan_recording(dir).ranks)
      for (const auto& [step, path] : r.steps) n += formats::StepReader(path).event_count();
  const double s = seconds_since(t0);
  if (n == 0) std::abort();
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t events = 1'000'000;
  int steps = 10;
  int repeats = 3;
  bool keep = false;
  std::string dir = (std::filesystem::temp_directory_path() / "opguard_diff_bench").string();
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--keep")) keep = true;
    else if (i + 1 >= argc) break;
    else if (!std::strcmp(argv[i], "--events")) events = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--repeats")) repeats = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--dir")) dir = argv[++i];
  }
  if (keep && std::filesystem::exists(dir + "/perturbed")) {
    std::printf("reusing the recordings under %s (--keep)\n", dir.c_str());
  } else {
    std::filesystem::remove_all(dir);
    std::printf("writing 3 synthetic recordings of %lld events in %d steps under %s\n",
                static_cast<long long>(events), steps, dir.c_str());
    for (const auto& [name, perturb_every] : {std::pair{"ref", 0}, {"same", 0}, {"perturbed", 100}}) {
      const auto t0 = std::chrono::steady_clock::now();
      write_run(dir + "/" + name, events, steps, perturb_every);
      const double s = seconds_since(t0);
      std::printf("  %-10s written in %.2f s (%.0f events/s, StepWriter and building the events)\n", name, s,
                  static_cast<double>(events) / s);
    }
  }
  using opguard::bench::median;
  std::printf("%-12s %10s %10s %14s %12s %12s   (median of %d)\n", "suspect", "read s", "diff s", "events/s",
              "diff/read", "diff cpu s", repeats);
  for (const char* suspect : {"same", "perturbed"}) {
    const std::string s = dir + "/" + suspect;
    // Warm the page cache once, then time read and diff back to back.
    read_both(dir + "/ref", s);
    std::vector<double> reads, diffs, cpus;
    bisect::DiffReport report;
    for (int r = 0; r < repeats; ++r) {
      reads.push_back(read_both(dir + "/ref", s));
      const auto t0 = std::chrono::steady_clock::now();
      const double c0 = cpu_seconds();
      report = bisect::diff_recordings(dir + "/ref", s, {});
      diffs.push_back(seconds_since(t0));
      cpus.push_back(cpu_seconds() - c0);  // the diff reads on a helper thread: CPU time can exceed wall time
    }
    const double read = median(reads), diff = median(diffs);
    std::printf("%-12s %10.3f %10.3f %14.0f %12.2f %12.3f   (origins %lld, propagated %lld)\n", suspect, read, diff,
                static_cast<double>(report.events_suspect) / diff, diff / read, median(cpus),
                static_cast<long long>(report.totals.counts[1]), static_cast<long long>(report.totals.counts[3]));
  }
  if (!keep) std::filesystem::remove_all(dir);
  return 0;
}
