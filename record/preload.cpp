// The entry point of `opguard record`: when libopguard_record.so is loaded
// into a process (LD_PRELOAD, or linked) whose environment names a recording
// (OPGUARD_OUT), recording starts before main() and ends at exit.

#include <cstdio>
#include <cstdlib>

#include "opguard/core/error.h"
#include "opguard/record/config.h"
#include "recorder_internal.h"

namespace opguard::record {
namespace {

__attribute__((constructor)) void start_from_environment() {
  std::optional<RecorderConfig> config;
  try {
    config = RecorderConfig::from_env();
    if (!config) return;
    start_recording(*config);
  } catch (const std::exception& e) {
    // Bad recorder config: fail before the training starts, not halfway.
    std::fprintf(stderr, "opguard: bad recorder configuration: %s\n", e.what());
    std::fflush(stderr);
    std::_Exit(2);
  }
  // stop_recording() runs at exit: registered when the recording opens.
}

}  // namespace
}  // namespace opguard::record
