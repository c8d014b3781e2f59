#pragma once
// The repro bundle (docs/BUNDLE.md): one recorded operator, its minimal inputs
// and the good and bad configs that give different bits, as a directory a
// kernel team can run without opguard: inputs.h5, expected_good.h5,
// expected_bad.h5, manifest.json, README.md, repro.py (torch + h5py) and
// repro.cpp + CMakeLists.txt (libtorch + HDF5).
//
// No torch here: the bundle's bits come from two replay trials
// (ReplayOptions::save_dir), run in child processes where a knob is
// process-wide.

#include <cstdint>
#include <string>
#include <vector>

#include "opguard/core/error.h"
#include "opguard/replay/replay.h"

namespace opguard::bisect {

struct BundleSpec {
  std::string recording_dir;
  int rank = 0;
  std::string event;  // event id as text ("1234", "2.57")
  // Knobs set over the recorded config (like ReplayOptions::config); the
  // manifest holds the effective configs.
  replay::Config good, bad;
  // good and bad are whole configs, as bisect's trials ran them (bisect run):
  // a knob one of them lacks is left at the process's default, not at the
  // recording's value (the reference's flush_denormal=on would otherwise come
  // back into a suspect that ran without it).
  bool whole_configs = false;
  std::vector<std::string> knobs_found;  // bisect config's minimal knob set; empty: all that differ
  std::vector<replay::InputSlice> slices;  // bisect shrink's result; empty: the recorded inputs
  std::string finding;   // one sentence from bisect; empty: the bundle writes its own
  std::string self_exe;  // the opguard executable, for child trials (ReplayOptions::self_exe)
};

// One tensor output compared between the good and the bad trial.
struct BundleOutput {
  int index = 0;  // among the op's flattened outputs
  std::string dtype;
  std::vector<int64_t> sizes;
  kernels::CompareResult metrics;  // good as the reference
};

struct BundleResult {
  std::string dir;
  // false: good and bad gave identical bits and nothing was written (the CLI
  // says "nothing to reproduce" and exits kExitNothing).
  bool reproduced = false;
  std::string message;  // the finding, or why there is nothing to reproduce
  std::string op, overload;
  std::string good_config, bad_config;  // effective
  std::vector<BundleOutput> outputs;    // the differing ones first
  uint64_t input_bytes = 0;             // of inputs.h5's tensors
};

// Thrown when a trial cannot run the event (inputs not recorded, op failed,
// the child died): the bundle needs both trials' bits.
class CannotBundle : public FormatError {
 public:
  using FormatError::FormatError;
};

// Runs the good and the bad trial and, when their bits differ, writes the
// bundle into `out_dir`, which must not exist or be an empty directory (its
// parent is created if missing). Every file name is fixed; nothing from the
// recording becomes a path, and no absolute path of this machine goes into the
// bundle. Throws UsageError (bad out_dir, event, config), CannotBundle, IoError.
BundleResult write_bundle(const BundleSpec& spec, const std::string& out_dir);

struct CheckOptions {
  std::string python;  // the interpreter that runs repro.py (torch and h5py)
  bool strict = true;  // also require the expected bits, not just a divergence
};

struct CheckResult {
  bool reproduced = false;
  int exit_code = 0;   // repro.py's
  std::string output;  // what repro.py printed (stdout and stderr)
  std::string message;
};

// Validates the bundle's layout and manifest (FormatError for a missing file,
// a manifest that is not one, or a file name that is not one of the bundle's
// own) and runs `python repro.py [--strict]` in it.
CheckResult check_bundle(const std::string& dir, const CheckOptions& options);

}  // namespace opguard::bisect
