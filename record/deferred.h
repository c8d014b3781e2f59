#pragma once
// Private to record/: fingerprints taken off the training thread.
//
// A host tensor that an operator produced or read is hashed on the recorder's
// hashing thread while the training thread goes on, under two guarantees
// that its bytes do not change before they are hashed:
//
// - Nobody frees them. Host memory comes from a wrapper around libtorch's CPU
//   allocator (install_deferring_allocator) whose deleter holds back the free
//   of memory with a hash outstanding until the hash is done. The recorder
//   keeps no reference to the tensor (pending.h says why it must not).
// - No operator writes them. Every recorded operator that writes a tensor
//   (its schema says so) first waits until no hash of that tensor's memory is
//   outstanding: it hashes them itself, or waits for the one the hashing
//   thread is on (DeferredHashing::wait_clear). A write without the dispatcher
//   (numpy, data_ptr) is not seen; a probe of the bytes taken when the hash
//   was deferred and compared after it catches most of those, and the tensor
//   is then recorded as not fingerprinted (docs/RECORD.md).
//

#include <c10/util/SmallVector.h>
#include <c10/util/flat_hash_map.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "pending.h"

namespace c10 {
struct Storage;
}

namespace opguard::record {

class Writer;

// Wraps libtorch's CPU allocator, once per process. Memory it hands out is
// memory whose free can be held back; everything else (memory allocated
// before, pinned memory, from_blob) is hashed on the training thread.
void install_deferring_allocator();
bool frees_can_wait(const c10::Storage& storage);

// One tensor whose fingerprint was deferred. Whoever claims it first hashes
// it: the hashing thread in queue order, or a training thread that is about
// to write its memory (it would otherwise wait behind every job queued
// before it).
struct DeferredJob {
  enum State : int { kQueued = 0, kRunning = 1, kDone = 2 };
  std::atomic<int> state{kQueued};
  TensorTask* task = nullptr;  // valid until kDone: its event is not handed on before
  const void* base = nullptr;  // the storage's first byte
  uint64_t bytes = 0;
};

// Fingerprints a deferred tensor (settle_deferred's per-tensor work).
using DeferredRunner = void (*)(void* context, TensorTask& task);

// The outstanding jobs and the held-back frees, for the whole process (the
// allocator's deleter is a plain function).
class DeferredHashing {
 public:
  static DeferredHashing& instance();

  // A job for `task` (in an event about to be queued; its tensor alive).
  std::shared_ptr<DeferredJob> add(TensorTask& task);
  // Runs `job` on this thread unless another thread claimed it; returns once it is done.
  void run_or_wait(DeferredJob& job, DeferredRunner run, void* context);
  // Training thread, before an op writes the memory at `base`: every
  // outstanding job on it is run here or waited for.
  void wait_clear(const void* base, DeferredRunner run, void* context);
  // Bytes of outstanding jobs: past a bound the recorder hashes on the training thread.
  uint64_t outstanding_bytes() const { return outstanding_bytes_.load(std::memory_order_relaxed); }

  // The allocator's deleter: frees `p` now, or when its last job is done.
  void release(void* p);
  // In a forked child no hashing thread runs: frees are never held.
  void forked() { forked_.store(true); }

 private:
  void complete(DeferredJob& job);
  // In a flat table, one or two jobs inline: adding a job allocates nothing
  // beyond the job (a node or a vector made here would be freed on the
  // hashing thread, a cross-thread free for malloc).
  struct Entry {
    c10::SmallVector<std::shared_ptr<DeferredJob>, 2> jobs;  // outstanding, on this memory
    bool freed = false;  // its free waits for them
  };
  std::mutex mutex_;
  ska::flat_hash_map<const void*, Entry> entries_;  // by storage's first byte
  // Outstanding jobs by a hash of their memory's first byte, so that a free
  // or a write of memory with none outstanding (nearly all of them) skips
  // the mutex even while other jobs are.
  static constexpr std::size_t kBuckets = 4096;
  static std::size_t bucket(const void* base) {
    return static_cast<std::size_t>((reinterpret_cast<uintptr_t>(base) >> 6) * 0x9E3779B97F4A7C15ull >> 52);
  }
  std::atomic<uint32_t> bucket_jobs_[kBuckets] = {};
  std::atomic<uint64_t> outstanding_bytes_{0};
  std::atomic<bool> forked_{false};
};

// The stage between the training threads and the writer when hashing is
// deferred: takes events (and step ends) in order, fingerprints their
// deferred tensors with `settle`, and hands them on to the writer in the same
// order. When its queue runs dry it spins a while before it sleeps, so that
// the training thread does not pay a futex wake per operator, but only while
// the program leaves a core spare: a program whose intra-op threads take
// every core the process may run on would lose that core to the spin (the
// OpenMP workers wait for the one that was preempted), so there it sleeps
// at once, and an event with nothing to hash that finds this stage idle goes
// straight to the writer (docs/BENCHMARKS.md, "All cores busy").
class Hasher {
 public:
  // `settle` fingerprints an event's deferred tensors (with run_or_wait).
  // `test_delay_us`: sleep that long before each event (tests: kEnvTestHasherDelay).
  Hasher(Writer& writer, std::function<void(PendingEvent&)> settle, uint32_t test_delay_us = 0);
  ~Hasher();  // finish() if not called

  void enqueue(std::unique_ptr<PendingEvent> event);
  // The intra-op threads the program computes on, as the training thread
  // last read them (at::get_num_threads() is per thread under OpenMP: this
  // thread cannot read it).
  void note_program_threads(int threads) {
    if (program_threads_.load(std::memory_order_relaxed) != threads)
      program_threads_.store(threads, std::memory_order_relaxed);
  }
  // Whether the program leaves a core for this thread's hashing.
  bool spare_core() const { return program_threads_.load(std::memory_order_relaxed) < cpus_; }
  void end_step();
  void finish();  // hashes and hands on everything queued; idempotent

 private:
  void thread_main();
  void push(std::unique_ptr<PendingEvent> event);  // null: end of step
  void hand_on(std::unique_ptr<PendingEvent> event);  // settle, then to the writer

  Writer& writer_;
  std::function<void(PendingEvent&)> settle_;
  const uint32_t test_delay_us_;
  struct Item {
    std::unique_ptr<PendingEvent> event;  // null: end of step
  };
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable room_;
  std::deque<Item> queue_;
  std::atomic<std::size_t> queued_{0};
  std::atomic<int> program_threads_{1};
  const int cpus_;  // the CPUs this process may run on (sched_getaffinity)
  bool sleeping_ = false;
  bool handing_ = false;  // this thread is handing a batch on (the lock's)
  bool stopping_ = false;
  bool finished_ = false;
  // Events waiting to be hashed: a producer past this waits, so that a writer
  // that is behind (and blocks this thread) holds the training threads back
  // as it would without this stage.
  static constexpr std::size_t kMaxQueued = 1024;
  std::thread thread_;
};

}  // namespace opguard::record
