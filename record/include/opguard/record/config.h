#pragma once
// The recorder's configuration and sampling policy. Torch-free: the CLI parses
// and validates the same strings before it launches a program, so a bad flag
// fails before training starts.
//
// The policy travels to a preloaded recorder in environment variables
// (kEnv* below), each in the text form that parse_* accepts and to_string writes.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace opguard::record {

inline constexpr const char* kEnvOut = "OPGUARD_OUT";            // recording directory
inline constexpr const char* kEnvPolicy = "OPGUARD_POLICY";      // SamplingPolicy text
inline constexpr const char* kEnvQueue = "OPGUARD_QUEUE";        // QueueConfig text
inline constexpr const char* kEnvStrict = "OPGUARD_STRICT";      // "1": abort on write failure
// "1": end the program (exit status 0) at the end of the step in which the
// last --dump-around window closed, once that step is written.
inline constexpr const char* kEnvStopAfterWindows = "OPGUARD_STOP_AFTER_WINDOWS";
inline constexpr const char* kEnvHashThreads = "OPGUARD_HASH_THREADS";
inline constexpr const char* kEnvDeferHashing = "OPGUARD_DEFER_HASHING";  // "0": hash on the training thread
inline constexpr const char* kEnvCommand = "OPGUARD_COMMAND";    // the recorded command line (for the manifest)
// Knobs the program applies itself, which the recorder cannot observe (a
// parallel decomposition it emulates): `opguard record --declare` checks them
// and the manifest keeps them as /info/declared_knobs.
inline constexpr const char* kEnvDeclared = "OPGUARD_DECLARED_KNOBS";
inline constexpr const char* kEnvPreloadOwner = "OPGUARD_OWNER_PID";
// Test only: the writer sleeps this many microseconds before each event it
// writes (a disk slower than the training), so that tests can fill the queue.
// `opguard record` passes OPGUARD_TEST_* variables through to the program.
inline constexpr const char* kEnvTestWriterDelay = "OPGUARD_TEST_WRITER_DELAY_US";
// Test only: the hashing thread sleeps this long before each event it hashes.
inline constexpr const char* kEnvTestHasherDelay = "OPGUARD_TEST_HASHER_DELAY_US";
// Benchmark only ("1"): the callbacks see every top-level op with its inputs
// and outputs, as when recording, and record nothing: what libtorch's
// RecordFunction costs the program before the recorder does any work
// (benchmarks/record_overhead.py). The manifest says observe_only=1.
inline constexpr const char* kEnvTestObserveOnly = "OPGUARD_TEST_OBSERVE_ONLY";

// Exit status of a training process whose recorder failed under --strict.
inline constexpr int kStrictExitCode = 74;

struct StepRange {
  int64_t first = 0;
  int64_t last = 0;  // inclusive
};

struct EventWindow {
  uint64_t event_id = 0;
  uint64_t radius = 0;  // events of the same stream within [id-radius, id+radius]
};

// Which events get full tensors (inputs and outputs). Every given selector
// must match (they narrow each other); within one selector any entry matches.
// No selector and all=false: fingerprints only.
struct SamplingPolicy {
  bool all = false;
  std::vector<StepRange> steps;
  int64_t every = 0;  // steps divisible by `every`
  std::string ops;     // ECMAScript regex over "aten::op.overload"
  std::string scopes;  // ECMAScript regex over the scope path
  std::vector<EventWindow> windows;
  uint64_t budget_bytes = 0;  // 0: unlimited; once spent, no more full tensors

  bool dumps_anything() const;
  std::string to_string() const;
};

enum class QueueFullPolicy { kWait, kDrop };

// The writer queue holds events, with the copies of the tensors the sampling
// policy keeps in full, until they are written; max_bytes bounds what it
// holds: the copies plus an estimate of each event's own size (its values,
// shapes and strings). Fingerprints are taken before an event is queued.
// When full tensors would exceed the bound: kWait blocks the training thread
// until the writer has written enough (complete recording, slower training);
// kDrop records the new event with its fingerprints but without its full
// tensors (each flagged kTensorDropped, counted in the manifest's
// dropped_tensors). Events themselves are never dropped: when events alone
// fill the queue (a writer slower than fingerprint-only recording), the
// training thread waits under either policy. An event larger than the bound
// is taken alone, into an empty queue.
struct QueueConfig {
  uint64_t max_bytes = uint64_t{1} << 30;
  QueueFullPolicy policy = QueueFullPolicy::kWait;
  std::string to_string() const;
};

// Parsers throw opguard::UsageError with one sentence naming the bad part.
SamplingPolicy parse_policy(const std::string& text);
QueueConfig parse_queue(const std::string& text);
uint64_t parse_bytes(const std::string& text);  // "512M", "2G", "1000"
StepRange parse_step_range(const std::string& text);  // "3", "2:5"
EventWindow parse_window(const std::string& text);    // "1234", "1234:50", "2.57:10"
uint32_t test_writer_delay_from_env();                // kEnvTestWriterDelay, 0 when unset
uint32_t test_hasher_delay_from_env();                // kEnvTestHasherDelay, 0 when unset
bool test_observe_only_from_env();                    // kEnvTestObserveOnly is "1"

struct RecorderConfig {
  std::string out_dir;
  SamplingPolicy policy;
  QueueConfig queue;
  bool strict = false;
  bool stop_after_windows = false;  // kEnvStopAfterWindows; needs policy.windows
  int hash_threads = 1;
  // Fingerprints of host tensors taken on a hashing thread while training
  // goes on (record/deferred.h); false: on the training thread.
  bool defer_hashing = true;
  std::string command;
  std::string declared_knobs;  // kEnvDeclared, as opguard record wrote it ("tp=2")
  uint32_t test_writer_delay_us = 0;  // kEnvTestWriterDelay (also read by Recorder::start)
  uint32_t test_hasher_delay_us = 0;  // kEnvTestHasherDelay (also read by Recorder::start)
  bool test_observe_only = false;     // kEnvTestObserveOnly (also read by Recorder::start)

  // From the kEnv* variables; nullopt when OPGUARD_OUT is unset.
  static std::optional<RecorderConfig> from_env();
};

}  // namespace opguard::record
