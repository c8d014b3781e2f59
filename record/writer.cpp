#include "writer.h"

#include <ATen/record_function.h>
#include <unistd.h>

#include <cstdio>

namespace opguard::record {
namespace {

thread_local bool t_is_writer_thread = false;

}  // namespace

bool is_writer_thread() { return t_is_writer_thread; }
void mark_writer_thread() { t_is_writer_thread = true; }

Writer::Writer(std::string rank_dir, int rank, int64_t first_step, const RecorderConfig& config,
               std::function<void(const std::string&, int64_t)> on_failure)
    : rank_dir_(std::move(rank_dir)), rank_(rank), config_(config), on_failure_(std::move(on_failure)) {
  open_step_ = first_step;
  thread_ = std::thread([this] { thread_main(); });
}

Writer::~Writer() {
  try {
    finish();
  } catch (...) {
    // Destructors never throw; finish() already reported through on_failure_.
  }
}

bool Writer::has_room(uint64_t bytes) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return fits_locked(bytes);
}

void Writer::wait_for_room(uint64_t bytes) {
  std::unique_lock<std::mutex> lock(mutex_);
  urgent_ = true;  // the writer may be napping on a short batch
  wake_.notify_one();
  room_.wait(lock, [&] { return fits_locked(bytes) || stopping_ || failed_.load(); });
}

void Writer::enqueue(std::unique_ptr<PendingEvent> event) {
  if (admit(*event)) enqueue_admitted(std::move(event));
}

bool Writer::admit(PendingEvent& event) {
  if (failed_.load()) return false;
  event.meta_bytes = estimate_event_bytes(event);
  const uint64_t bytes = event.queued_bytes + event.meta_bytes;
  std::unique_lock<std::mutex> lock(mutex_);
  if (!fits_locked(bytes)) {
    // The writer is behind by a whole queue: wait for it, whatever the
    // policy (only full contents are ever dropped, never events).
    urgent_ = true;
    wake_.notify_one();
    room_.wait(lock, [&] { return fits_locked(bytes) || stopping_ || failed_.load(); });
    if (failed_.load()) return false;
  }
  queued_bytes_ += bytes;
  if (queued_bytes_ > peak_queued_bytes_.load()) peak_queued_bytes_.store(queued_bytes_);
  return true;
}

void Writer::enqueue_admitted(std::unique_ptr<PendingEvent> event) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const bool holds_copies = event->queued_bytes > 0;
    queue_.push_back(Item{std::move(event)});
    // Waking the writer for every event cost a futex call and a context
    // switch per operator on the training thread; it takes them in batches
    // (or after kWriterNap), and at once when an event holds full tensors.
    if (holds_copies) urgent_ = true;
    wake = writer_idle_ && (queue_.size() >= kWakeBatch || holds_copies);
  }
  if (wake) wake_.notify_one();
}

namespace {

// What a spare event holds: its task and value capacity.
std::size_t spare_slots(const PendingEvent& p) {
  return p.tasks.capacity() + p.event.inputs.capacity() + p.event.outputs.capacity();
}

}  // namespace

std::unique_ptr<PendingEvent> Writer::take_spare() {
  {
    std::lock_guard<std::mutex> lock(spare_mutex_);
    if (!spare_.empty()) {
      std::unique_ptr<PendingEvent> p = std::move(spare_.back());
      spare_.pop_back();
      spare_slots_ -= spare_slots(*p);
      return p;
    }
  }
  return std::make_unique<PendingEvent>();
}

void Writer::recycle(std::vector<std::unique_ptr<PendingEvent>>& written) {
  for (auto& p : written) {
    if (p->tasks.capacity() > kMaxSpareTasks ||
        p->event.inputs.capacity() + p->event.outputs.capacity() > kMaxSpareTasks) {
      p.reset();
      continue;
    }
    // Everything back to a new event's state but the capacity of its task
    // and value vectors.
    std::vector<std::optional<TensorTask>> tasks = std::move(p->tasks);
    std::vector<formats::Value> inputs = std::move(p->event.inputs), outputs = std::move(p->event.outputs);
    tasks.clear();
    inputs.clear();
    outputs.clear();
    *p = PendingEvent();
    p->tasks = std::move(tasks);
    p->event.inputs = std::move(inputs);
    p->event.outputs = std::move(outputs);
  }
  {
    std::lock_guard<std::mutex> lock(spare_mutex_);
    for (auto& p : written) {
      if (!p || spare_slots_ + spare_slots(*p) > kMaxSpareSlots) continue;
      spare_slots_ += spare_slots(*p);
      spare_.push_back(std::move(p));
    }
  }
  written.clear();  // those not kept are freed here
}

void Writer::end_step() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(Item{nullptr});
    urgent_ = true;  // close the step file now: a killed run keeps it
  }
  wake_.notify_one();
}

void Writer::thread_main() {
  mark_writer_thread();
  at::RecordFunctionGuard no_recording(false);
  std::deque<Item> batch;
  std::vector<std::unique_ptr<PendingEvent>> written;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      writer_idle_ = true;
      wake_.wait_for(lock, kWriterNap, [&] { return stopping_ || urgent_ || queue_.size() >= kWakeBatch; });
      writer_idle_ = false;
      urgent_ = false;
      if (queue_.empty()) {
        if (stopping_) break;  // stopping and drained
        continue;
      }
      batch.swap(queue_);
    }
    // Written events leave the queue's count in groups (one lock per group,
    // not per event), and at once when they held full contents.
    constexpr int kReleaseEvery = 64;
    uint64_t released = 0;
    int pending_release = 0;
    for (Item& item : batch) {
      if (!item.event) {
        if (!failed_.load()) {
          try {
            close_step();
          } catch (const std::exception& e) {
            fail(e.what());
          }
        }
        ++open_step_;
        continue;
      }
      const bool held_copies = item.event->queued_bytes > 0;
      released += item.event->queued_bytes + item.event->meta_bytes;
      if (!failed_.load()) {
        if (config_.test_writer_delay_us > 0) test_delay();
        try {
          write_event(*item.event);
        } catch (const std::exception& e) {
          fail(e.what());
        }
      }
      written.push_back(std::move(item.event));
      if (held_copies || ++pending_release >= kReleaseEvery) {
        release(released);
        released = 0;
        pending_release = 0;
      }
    }
    batch.clear();
    recycle(written);
    release(released);  // also wakes producers: has_room() says yes to an empty queue
  }
  if (!failed_.load()) {
    try {
      close_step();
    } catch (const std::exception& e) {
      fail(e.what());
    }
  }
}

void Writer::test_delay() {
  // Sleeps of a few microseconds last far longer on a loaded machine: owe
  // the delay and pay it in sleeps of a millisecond or more, measured.
  delay_debt_us_ += config_.test_writer_delay_us;
  if (delay_debt_us_ < 1000) return;
  const auto start = std::chrono::steady_clock::now();
  ::usleep(static_cast<useconds_t>(delay_debt_us_));
  delay_debt_us_ -= std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count();
}

void Writer::release(uint64_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queued_bytes_ -= bytes;
  }
  room_.notify_all();
}

void Writer::write_event(PendingEvent& pending) {
  if (!step_writer_) {
    const std::string path = rank_dir_ + "/" + formats::step_file_name(open_step_);
    step_writer_ = std::make_unique<formats::StepWriter>(path, rank_, open_step_, config_.policy.dumps_anything());
  }
  formats::Event& ev = pending.event;
  ev.op = pending.op->op;
  ev.overload = pending.op->overload;
  ev.schema = pending.op->schema;
  ev.scope = pending.scope ? *pending.scope : std::string();
  const std::size_t n_in = ev.inputs.size();
  for (std::size_t i = 0; i < pending.tasks.size(); ++i) {
    auto& task = pending.tasks[i];
    if (!task) continue;
    formats::Value& value = i < n_in ? ev.inputs[i] : ev.outputs[i - n_in];
    task->move_dims_into_meta();
    value.tensor = std::move(task->meta);
    if (task->has_bytes) {
      value.tensor.data_index = step_writer_->write_tensor(value.tensor.dtype, value.tensor.sizes,
                                                           task->bytes.data(), task->bytes.size());
      value.tensor.flags |= formats::kTensorHasData;
      std::vector<uint8_t>().swap(task->bytes);
    }
  }
  // Copied into the step's tables: the event goes back to take_spare() with
  // the capacity of its value vectors (no allocation per event on the
  // training thread).
  step_writer_->add_event(ev);
  events_written_.fetch_add(1);
  bytes_written_.store(closed_bytes_ + step_writer_->bytes_written());
}

void Writer::close_step() {
  if (step_writer_) {
    step_writer_->close();
    closed_bytes_ += step_writer_->bytes_written();
    bytes_written_.store(closed_bytes_);
    step_writer_.reset();
  }
}

void Writer::fail(const std::string& message) {
  if (failed_.exchange(true)) return;
  // The partial step holds only some of its full tensors (events are written
  // at close): nothing a reader could use. Removing it gives the space back
  // on a full disk, so that the manifest can still say what happened.
  if (step_writer_) step_writer_->abandon();
  step_writer_.reset();
  const std::string tmp = rank_dir_ + "/" + formats::step_file_name(open_step_) + ".tmp";
  std::remove(tmp.c_str());
  room_.notify_all();
  if (on_failure_) on_failure_(message, open_step_);
}

void Writer::finish() { stop_queue_thread(mutex_, finished_, stopping_, wake_, room_, thread_); }

void stop_queue_thread(std::mutex& mutex, bool& finished, bool& stopping, std::condition_variable& wake,
                       std::condition_variable& room, std::thread& thread) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (finished) return;
    finished = true;
    stopping = true;
  }
  wake.notify_all();
  room.notify_all();
  if (thread.joinable()) thread.join();
}

}  // namespace opguard::record
