#pragma once
// opguard::Recorder: control of the recorder from inside a C++ program. Torch
// stays out of this header (at::Tensor is only declared).
//
//   #include <opguard/record/recorder.h>
//   opguard::RecorderOptions options;
//   options.out_dir = "runA";
//   options.policy = "steps=3";           // SamplingPolicy text (record/config.h)
//   opguard::Recorder::start(options);    // throws opguard::UsageError / IoError
//   ... train, calling opguard::mark_step() (scope.h) after each optimizer step ...
//   opguard::Recorder::stop();            // flushes; the recording is complete
//
// A program run under `opguard record` is already recording when main()
// starts; start() then throws UsageError.

#include <cstdint>
#include <string>

namespace at {
class Tensor;
}

namespace opguard {

struct RecorderOptions {
  std::string out_dir;
  std::string policy;  // e.g. "all", "steps=2:3;ops=softmax"
  std::string queue;   // e.g. "bytes=512M;policy=drop"
  bool strict = false;  // abort the process (exit 74) if the recording cannot be written
  int hash_threads = 1;
  // Host tensors are fingerprinted on a hashing thread while training goes
  // on (docs/RECORD.md, "Deferred fingerprints"); false: on the training thread.
  bool defer_hashing = true;
};

struct RecorderStats {
  uint64_t events = 0;
  uint64_t dropped_tensors = 0;
  uint64_t bytes_written = 0;
  int64_t step = 0;
  bool failed = false;  // a write failed and recording stopped
};

class Recorder {
 public:
  static void start(const RecorderOptions& options);
  // Drains the queue, writes the last step and the final manifest. Idempotent.
  static void stop();
  static bool active();
  // Ends the current step (same as opguard::mark_step()).
  static void step();
  // Records `tensor` as a boundary named `name` (an event "opguard::mark").
  static void mark(const at::Tensor& tensor, const std::string& name);
  static RecorderStats stats();
};

}  // namespace opguard
