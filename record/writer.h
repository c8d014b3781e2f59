#pragma once
// Private to record/: the asynchronous writer. One background thread takes
// events in the order they were queued, fingerprints their tensors (unless a
// training thread already did), copies full tensors, and writes one step file
// per step. The training thread only enqueues; it does pending work itself
// only where correctness needs it (before an operator overwrites a tensor that
// is still waiting to be hashed) or the queue's byte bound is reached under
// policy `wait`.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "opguard/formats/recording.h"
#include "opguard/kernels/fingerprint.h"
#include "opguard/record/config.h"
#include "pending.h"

namespace opguard::record {

class Writer {
 public:
  // `on_failure` is called once, from the writer thread, with the error text
  // when a write fails; recording stops after it.
  Writer(std::string rank_dir, int rank, int64_t first_step, const RecorderConfig& config,
         std::function<void(const std::string&)> on_failure);
  ~Writer();  // finish() if not called

  // Called from training threads. Registers the event's pending tasks and
  // queues it; may block under policy wait (see QueueConfig).
  void enqueue(std::unique_ptr<PendingEvent> event);
  // Marks the end of a step: the step file being written is closed.
  void end_step();
  // Ensures no pending task still reads `storage`: runs the ones nobody has
  // started on the calling thread and waits for running ones. Call before an
  // operator writes to it.
  void flush_storage(const c10::StorageImpl* storage);
  // Runs a task on the calling thread (fingerprint, and copy if dump).
  void run_task(TensorTask& task);
  // The known fingerprint of the tensor's current bits, if an output task
  // computed it and the tensor has not changed since (same version).
  bool cached_fingerprint(const at::Tensor& t, uint64_t storage_id, uint64_t* fp);
  // True when the queue would take `bytes` more without exceeding its bound.
  bool has_room(uint64_t bytes) const;

  void finish();  // drain and close; idempotent
  bool failed() const { return failed_.load(); }
  uint64_t bytes_written() const { return bytes_written_.load(); }
  uint64_t events_written() const { return events_written_.load(); }

 private:
  void thread_main();
  void write_event(PendingEvent& event);
  void close_step();
  void fail(const std::string& message);
  void release(TensorTask& task);
  // Tensors of the application are never dropped on an opguard thread: the
  // last reference to a tensor that Python owns takes the GIL, which a training
  // thread waiting on one of our locks may hold. The writer buries them; the
  // next application thread that enqueues (and finish()) drops them.
  void bury(at::Tensor tensor, c10::Storage storage);
  void collect_garbage();
  void help_until_room(uint64_t bytes);

  const std::string rank_dir_;
  const int rank_;
  const RecorderConfig config_;
  std::function<void(const std::string&)> on_failure_;
  kernels::HashPool pool_;

  struct Item {
    std::unique_ptr<PendingEvent> event;  // null: end of step
  };
  mutable std::mutex mutex_;
  std::condition_variable wake_;       // writer waits for items
  std::condition_variable room_;       // producers wait for room / task completion
  std::deque<Item> queue_;
  bool stopping_ = false;
  bool finished_ = false;
  uint64_t queued_bytes_ = 0;

  // Pending tasks by the storage they read; guarded by registry_mutex_.
  std::mutex registry_mutex_;
  std::unordered_map<const c10::StorageImpl*, std::vector<std::weak_ptr<TensorTask>>> registry_;
  struct CacheEntry {
    uint64_t storage_id = 0;
    uint32_t version = 0;
    int64_t offset = 0;
    std::vector<int64_t> sizes, strides;
    uint8_t dtype = 0;
    uint64_t fingerprint = 0;
  };
  std::unordered_map<uint64_t, CacheEntry> cache_;  // by storage id

  std::mutex graveyard_mutex_;
  std::vector<at::Tensor> graveyard_;
  std::vector<c10::Storage> storage_graveyard_;

  std::unique_ptr<formats::StepWriter> step_writer_;  // writer thread only
  int64_t open_step_ = 0;  // the step whose file is (or will be) open
  uint64_t closed_bytes_ = 0;  // writer thread only
  std::atomic<bool> failed_{false};
  std::atomic<uint64_t> bytes_written_{0};
  std::atomic<uint64_t> events_written_{0};
  std::thread thread_;
};

}  // namespace opguard::record
