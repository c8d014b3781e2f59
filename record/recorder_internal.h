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

// The in-process knobs the calling thread's next op runs under, as
// Event::knobs bits (formats::knob_bits, gpu_knob_bits): read per op on the
// training thread, so cheap (about 0.1 us) and never throwing (run_info.cpp).
uint32_t current_knobs();

// The calling thread's number in the intra-op parallel region it runs in (0:
// the region's master), or -1 outside any (at::in_parallel_region(),
// at::get_thread_num(); run_info.cpp, which includes ATen/Parallel.h).
int parallel_region_thread();

// Manifest facts: the numerics knobs of the process (run_info.cpp).
void collect_run_info(formats::Manifest& manifest);
void collect_end_info(formats::Manifest& manifest);
std::string iso_time_now();

}  // namespace opguard::record
