// opguard repro: write the bundle a kernel team receives (docs/BUNDLE.md), and
// opguard repro check: re-run one and confirm it still reproduces.

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "exit_codes.h"
#include "opguard/bisect/repro.h"
#include "opguard/core/error.h"
#include "verbs.h"

#ifndef OPGUARD_DEFAULT_PYTHON
#define OPGUARD_DEFAULT_PYTHON "python3"
#endif

namespace opguard::cli {
namespace {

constexpr const char* kHelp = R"(Write a standalone repro bundle for one recorded operator whose bits differ
between two configs (docs/BUNDLE.md):

  opguard repro REC --event ID --good CFG --bad CFG -o DIR [--slices A:D:S:L,...]
  opguard repro check DIR [--python PY] [--loose]

The bundle holds the op's inputs (inputs.h5, after --slices), its outputs under
each config (expected_good.h5, expected_bad.h5), manifest.json (schema,
arguments, configs, knobs, metrics, environment), README.md, and two programs
that need no opguard: repro.py (torch + h5py) and repro.cpp + CMakeLists.txt
(libtorch + HDF5). Both run the op under each config in a child process and
exit 0 when the divergence reproduces.

--good and --bad are knobs set over the recorded config (opguard configs lists
them). DIR must be new or empty; nothing else is written. --slices cuts input
A (its position among the event's inputs) to elements [S, S+L) of dimension D
(bisect shrink prints them). --knobs names the knob set found (the manifest's
knobs_found; default: every knob in which good and bad differ).

repro check runs the bundle's repro.py --strict with --python (default
$OPGUARD_PYTHON, else the Python this opguard was built with) in DIR: both
configs must give exactly the expected bits, and differ from each other.

Exit code: 0 bundle written / still reproduces, 4 nothing to reproduce (good
and bad give identical bits; no bundle is written) / check: it no longer
reproduces, 65 the event cannot be replayed or DIR is not a bundle, 74 cannot
write DIR (it is not empty, not a directory or a symbolic link), 2 bad options
(unknown event or knob), 127 check: the Python cannot be started.)";

inline constexpr int kExitNothing = 4;  // as bisect's "nothing to bisect"

struct Options {
  std::string dir, event, good, bad, out, slices, knobs, finding, python;
  std::string check_dir;
  int rank = 0;
  bool loose = false;
};

std::vector<replay::InputSlice> parse_slices(const std::string& text) {
  std::vector<replay::InputSlice> out;
  std::size_t begin = 0;
  while (begin < text.size()) {
    const auto end = std::min(text.find(',', begin), text.size());
    const std::string item = text.substr(begin, end - begin);
    replay::InputSlice s;
    long long a = 0, d = 0, st = 0, len = 0;
    char tail = 0;
    if (std::sscanf(item.c_str(), "%lld:%lld:%lld:%lld%c", &a, &d, &st, &len, &tail) != 4 || a < 0 || d < 0 ||
        st < 0 || len < 1)
      throw UsageError(fmt::format("--slices takes ARG:DIM:START:LENGTH,... (non-negative, length >= 1); '{}' is not one",
                                   item));
    s.argument = static_cast<int>(a);
    s.dim = static_cast<int>(d);
    s.start = st;
    s.length = len;
    out.push_back(s);
    begin = end + 1;
  }
  return out;
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  std::size_t begin = 0;
  while (begin < text.size()) {
    const auto end = std::min(text.find(',', begin), text.size());
    if (end > begin) out.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return out;
}

int run_write(const Options& o) {
  if (o.dir.empty()) throw UsageError("repro needs a recording: REC --event ID --good CFG --bad CFG -o DIR");
  if (o.event.empty()) throw UsageError("repro needs --event ID (opguard diff names the first divergent one)");
  if (o.bad.empty()) throw UsageError("repro needs --bad CFG, the knobs under which the bits change");
  if (o.out.empty()) throw UsageError("repro needs -o DIR, a new or empty directory for the bundle");
  bisect::BundleSpec spec;
  spec.recording_dir = o.dir;
  spec.rank = o.rank;
  spec.event = o.event;
  spec.good = replay::Config::parse(o.good);
  spec.bad = replay::Config::parse(o.bad);
  spec.knobs_found = split_commas(o.knobs);
  spec.slices = parse_slices(o.slices);
  spec.finding = o.finding;
  spec.self_exe = executable_dir() + "/opguard";
  const auto r = bisect::write_bundle(spec, o.out);
  if (!r.reproduced) {
    std::fprintf(stderr, "opguard repro: %s\n", r.message.c_str());
    return kExitNothing;
  }
  std::printf("%s\n", r.message.c_str());
  std::printf("good  %s\nbad   %s\n", r.good_config.c_str(), r.bad_config.c_str());
  for (const auto& out : r.outputs)
    std::printf("output %d  %s [%s]: %lld of %lld elements differ\n", out.index, out.dtype.c_str(),
                fmt::format("{}", fmt::join(out.sizes, ",")).c_str(), static_cast<long long>(out.metrics.differing),
                static_cast<long long>(out.metrics.numel));
  std::printf("bundle %s (inputs %llu bytes)\n  cd %s && python3 repro.py\n  opguard repro check %s\n", r.dir.c_str(),
              static_cast<unsigned long long>(r.input_bytes), r.dir.c_str(), r.dir.c_str());
  return kExitOk;
}

int run_check(const Options& o) {
  bisect::CheckOptions c;
  c.python = o.python;
  if (c.python.empty()) {
    const char* env = std::getenv("OPGUARD_PYTHON");
    c.python = env && *env ? env : OPGUARD_DEFAULT_PYTHON;
  }
  c.strict = !o.loose;
  const auto r = bisect::check_bundle(o.check_dir, c);
  std::fwrite(r.output.data(), 1, r.output.size(), stdout);
  std::printf("opguard repro check: %s\n", r.message.c_str());
  if (r.exit_code == 0) return kExitOk;
  if (r.exit_code == 1) return kExitNothing;
  return kExitFormat;
}

}  // namespace

void add_repro_command(CLI::App& app, VerbResult& result) {
  auto o = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand("repro", "Write a standalone repro bundle for one divergent operator");
  sub->footer(kHelp);
  sub->add_option("recording", o->dir, "Recording directory");
  sub->add_option("--event,-e", o->event, "Event id");
  sub->add_option("--rank", o->rank, "Rank (default 0)");
  sub->add_option("--good", o->good, "Knobs of the good config, set over the recorded one (default: as recorded)");
  sub->add_option("--bad", o->bad, "Knobs of the bad config, set over the recorded one");
  sub->add_option("-o,--out", o->out, "Bundle directory (new or empty)");
  sub->add_option("--slices", o->slices, "Input slices ARG:DIM:START:LENGTH,... (bisect shrink's result)");
  sub->add_option("--knobs", o->knobs, "The knob set found (bisect config's result), k1,k2");
  sub->add_option("--finding", o->finding, "The finding in one sentence (default: written from the metrics)");
  CLI::App* check = sub->add_subcommand("check", "Re-run a bundle's repro.py and confirm it still reproduces");
  check->add_option("bundle", o->check_dir, "Bundle directory")->required();
  check->add_option("--python", o->python, "Python with torch and h5py (default $OPGUARD_PYTHON or the build's)");
  check->add_flag("--loose", o->loose, "Accept a divergence with other bits than the expected ones");
  check->callback([o, &result] { result.exit_code = run_check(*o); });
  sub->callback([o, sub, &result] {
    if (sub->got_subcommand("check")) return;
    result.exit_code = run_write(*o);
  });
}

}  // namespace opguard::cli
