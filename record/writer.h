#pragma once
// Private to record/: the asynchronous writer. One background thread takes
// events in the order they were queued and writes one step file per step.
// Events arrive complete (fingerprints taken, full tensors copied: see
// pending.h), so the training thread's share is the hashing and the copy; the
// HDF5 work is the writer's.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "opguard/formats/recording.h"
#include "opguard/record/config.h"
#include "pending.h"

namespace opguard::record {

class Writer {
 public:
  // `on_failure` is called once, from the writer thread, with the error text
  // and the step being written when a write fails (the partial step file is
  // removed first); recording stops after it.
  Writer(std::string rank_dir, int rank, int64_t first_step, const RecorderConfig& config,
         std::function<void(const std::string&, int64_t)> on_failure);
  ~Writer();  // finish() if not called

  // Called from training threads: queues the event (the writer takes them in
  // batches, at most kWriterNap late). Callers apply the queue policy to full
  // contents first (has_room / wait_for_room); enqueue itself blocks only
  // while the event would push the queue past its bound (config.h says why).
  void enqueue(std::unique_ptr<PendingEvent> event);
  // enqueue() in two halves, for a stage in between (deferred.h's Hasher):
  // admit() counts the event against the bound (waiting for room as
  // enqueue does) on the training thread; false: the writer failed, drop
  // it. enqueue_admitted() queues an admitted event.
  bool admit(PendingEvent& event);
  void enqueue_admitted(std::unique_ptr<PendingEvent> event);
  // An empty event to fill: one the writer has written and cleared (its
  // task and value vectors keep their capacity), or a new one. Recycling them spares the
  // training thread an allocation of the task vector per operator, which is
  // above glibc's small-bin size and made malloc walk its fast bins each time.
  std::unique_ptr<PendingEvent> take_spare();
  // Marks the end of a step: the step file being written is closed.
  void end_step();
  // True when the queue would take `bytes` more without exceeding its bound
  // (a queue that holds no copies takes anything).
  bool has_room(uint64_t bytes) const;
  // Blocks until has_room(bytes), the writer failed, or it is stopping.
  void wait_for_room(uint64_t bytes);

  void finish();  // drain and close; idempotent
  bool failed() const { return failed_.load(); }
  uint64_t bytes_written() const { return bytes_written_.load(); }
  uint64_t events_written() const { return events_written_.load(); }
  uint64_t peak_queued_bytes() const { return peak_queued_bytes_.load(); }

 private:
  void thread_main();
  void write_event(PendingEvent& event);
  void close_step();
  void fail(const std::string& message);
  // Under mutex_: the queue takes `bytes` more without passing its bound.
  bool fits_locked(uint64_t bytes) const {
    return queued_bytes_ == 0 || queued_bytes_ + bytes <= config_.queue.max_bytes;
  }
  void release(uint64_t bytes);  // writer thread: written bytes leave the queue
  // Writer thread: clears the written events and keeps some for take_spare().
  void recycle(std::vector<std::unique_ptr<PendingEvent>>& written);
  void test_delay();             // writer thread: config_.test_writer_delay_us per event
  int64_t delay_debt_us_ = 0;    // writer thread only

  const std::string rank_dir_;
  const int rank_;
  const RecorderConfig config_;
  std::function<void(const std::string&, int64_t)> on_failure_;

  struct Item {
    std::unique_ptr<PendingEvent> event;  // null: end of step
  };
  mutable std::mutex mutex_;
  std::condition_variable wake_;  // writer waits for items
  std::condition_variable room_;  // producers wait for room
  std::deque<Item> queue_;
  std::mutex spare_mutex_;
  std::vector<std::unique_ptr<PendingEvent>> spare_;  // cleared events for take_spare()
  std::size_t spare_slots_ = 0;  // task and value capacity held in spare_
  // The writer returns events a batch at a time (what queued during its
  // nap): keep enough for a busy batch, and at most about 5 MB of task and
  // value slots.
  static constexpr std::size_t kMaxSpareSlots = 16384;
  static constexpr std::size_t kMaxSpareTasks = 16;  // larger task or value vectors are freed, not kept
  bool stopping_ = false;
  bool writer_idle_ = false;  // the writer waits on wake_
  bool urgent_ = false;       // a step ended, copies wait or a producer waits for room: no nap
  static constexpr std::size_t kWakeBatch = 256;  // events that wake a napping writer
  static constexpr std::chrono::milliseconds kWriterNap{20};
  bool finished_ = false;
  uint64_t queued_bytes_ = 0;

  std::unique_ptr<formats::StepWriter> step_writer_;  // writer thread only
  int64_t open_step_ = 0;      // the step whose file is (or will be) open
  uint64_t closed_bytes_ = 0;  // writer thread only
  std::atomic<bool> failed_{false};
  std::atomic<uint64_t> bytes_written_{0};
  std::atomic<uint64_t> events_written_{0};
  std::atomic<uint64_t> peak_queued_bytes_{0};
  std::thread thread_;
};

// True on the recorder's own threads: the hook ignores what they dispatch.
bool is_writer_thread();
void mark_writer_thread();  // called first by each of the recorder's own threads

// Stops a thread that serves a queue (Writer, Hasher): sets `stopping` under
// `mutex`, once (`finished` says it was done), wakes the waiters of `wake`
// and `room`, and joins `thread`.
void stop_queue_thread(std::mutex& mutex, bool& finished, bool& stopping, std::condition_variable& wake,
                       std::condition_variable& room, std::thread& thread);

}  // namespace opguard::record
