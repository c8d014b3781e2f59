#pragma once
// Private to record/: what the hook, the run-info collector, the torch op
// registrations and the preload entry point share.

#include <string>

#include "opguard/formats/recording.h"
#include "opguard/record/config.h"

namespace at {
class Tensor;
}

namespace opguard::record {

struct RecorderImpl;
extern RecorderImpl* g_recorder;

// Throws UsageError if a recorder is active.
void start_recording(const RecorderConfig& config);
// Drains and finalises; idempotent; never throws.
void stop_recording();
// Records `tensor` as an event "opguard::mark" (a boundary).
void mark_tensor(const at::Tensor& tensor, const std::string& name);

// Manifest facts: the numerics knobs of the process (run_info.cpp).
void collect_run_info(formats::Manifest& manifest);
void collect_end_info(formats::Manifest& manifest);
std::string iso_time_now();

}  // namespace opguard::record
