#include "writer.h"

#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>

#include <chrono>
#include <cstdio>

#include "opguard/core/error.h"

namespace opguard::record {
namespace {

// Marks the recorder's own threads: the hook ignores everything they dispatch.
thread_local bool t_is_writer_thread = false;

kernels::TensorView view_of(const at::Tensor& t, const formats::TensorMeta& meta) {
  kernels::TensorView v;
  v.dtype = meta.dtype;
  v.sizes = meta.sizes.data();
  v.strides = meta.strides.data();
  v.ndim = static_cast<int>(meta.sizes.size());
  v.data = t.defined() ? t.const_data_ptr() : nullptr;
  return v;
}

}  // namespace

bool is_writer_thread() { return t_is_writer_thread; }

Writer::Writer(std::string rank_dir, int rank, int64_t first_step, const RecorderConfig& config,
               std::function<void(const std::string&)> on_failure)
    : rank_dir_(std::move(rank_dir)),
      rank_(rank),
      config_(config),
      on_failure_(std::move(on_failure)),
      pool_(config.hash_threads) {
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
  return queue_.empty() || queued_bytes_ + bytes <= config_.queue.max_bytes;
}

void Writer::bury(at::Tensor tensor, c10::Storage storage) {
  if (!tensor.defined() && !storage) return;
  std::lock_guard<std::mutex> lock(graveyard_mutex_);
  // Moves: no reference count changes here.
  if (tensor.defined()) graveyard_.push_back(std::move(tensor));
  if (storage) storage_graveyard_.push_back(std::move(storage));
}

void Writer::collect_garbage() {
  std::vector<at::Tensor> dead;
  std::vector<c10::Storage> dead_storages;
  {
    std::lock_guard<std::mutex> lock(graveyard_mutex_);
    if (graveyard_.empty() && storage_graveyard_.empty()) return;
    dead.swap(graveyard_);
    dead_storages.swap(storage_graveyard_);
  }
  // `dead` goes out of scope here, on an application thread, holding no lock.
}

void Writer::enqueue(std::unique_ptr<PendingEvent> event) {
  collect_garbage();
  if (failed_.load()) return;
  for (auto& task : event->tasks) {
    if (task && task->tensor.defined() && task->tensor.device().is_cpu() && task->state.load() == TensorTask::kPending) {
      task->data = task->tensor.const_data_ptr();
      task->keep = task->tensor.storage();
      task->tensor = at::Tensor();  // on the application thread: see pending.h
    }
  }
  {
    std::lock_guard<std::mutex> lock(registry_mutex_);
    for (auto& task : event->tasks) {
      if (task && task->storage != nullptr && task->state.load() != TensorTask::kDone)
        registry_[task->storage].push_back(task);
    }
  }
  if (config_.queue.policy == QueueFullPolicy::kWait) help_until_room(event->queued_bytes);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queued_bytes_ += event->queued_bytes;
    queue_.push_back(Item{std::move(event)});
  }
  wake_.notify_one();
}

void Writer::end_step() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(Item{nullptr});
  }
  wake_.notify_one();
}

void Writer::help_until_room(uint64_t bytes) {
  while (true) {
    TensorTaskPtr todo;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (queue_.empty() || queued_bytes_ + bytes <= config_.queue.max_bytes || stopping_) return;
      for (auto& item : queue_) {
        if (!item.event) continue;
        for (auto& task : item.event->tasks) {
          if (task && task->state.load() == TensorTask::kPending) {
            todo = task;
            break;
          }
        }
        if (todo) break;
      }
      if (!todo) {
        // Everything queued is being worked on: wait for the writer to finish
        // an event.
        room_.wait_for(lock, std::chrono::milliseconds(2));
        continue;
      }
    }
    run_task(*todo);
  }
}

void Writer::flush_storage(const c10::StorageImpl* storage) {
  std::vector<std::weak_ptr<TensorTask>> tasks;
  {
    std::lock_guard<std::mutex> lock(registry_mutex_);
    auto it = registry_.find(storage);
    if (it == registry_.end()) return;
    tasks = it->second;
  }
  for (auto& weak : tasks) {
    if (auto task = weak.lock()) run_task(*task);
  }
}

void Writer::run_task(TensorTask& task) {
  int expected = TensorTask::kPending;
  if (!task.state.compare_exchange_strong(expected, TensorTask::kRunning)) {
    // Someone else has it: wait until it is done. Tasks are short (one
    // tensor), so a yield loop is cheaper than a condition variable per task.
    while (task.state.load() != TensorTask::kDone) std::this_thread::yield();
    return;
  }
  try {
    if (task.fingerprint || task.dump) {
      at::RecordFunctionGuard no_recording(false);
      at::Tensor t = task.tensor;
      if (t.defined() && !t.device().is_cpu()) t = t.cpu();  // the CUDA path hashes on the device (kernels/)
      auto view = view_of(t, task.meta);
      if (!t.defined()) view.data = task.data;
      // Only the writer thread uses the pool: a training thread running a task
      // must not wait behind the writer's job.
      kernels::HashPool* pool = t_is_writer_thread ? &pool_ : nullptr;
      if (task.fingerprint) task.meta.fingerprint = kernels::fingerprint(view, pool);
      if (task.dump) {
        task.bytes.resize(static_cast<std::size_t>(task.meta.numel()) * dtype_size(task.meta.dtype));
        kernels::gather_contiguous(view, task.bytes.data());
      }
    }
  } catch (const std::exception& e) {
    // A tensor we cannot read (freed device memory, an exotic layout): keep
    // the event, without this fingerprint.
    task.fingerprint = false;
    task.dump = false;
    task.meta.flags |= formats::kTensorNotFingerprinted;
  }
  release(task);
}

void Writer::release(TensorTask& task) {
  // Dropped when this function returns, after the lock: on an application
  // thread at once (a buried tensor would keep its use count raised), on the
  // writer thread through bury().
  at::Tensor tensor = std::move(task.tensor);
  c10::Storage keep = std::move(task.keep);
  task.data = nullptr;
  if (t_is_writer_thread) bury(std::move(tensor), std::move(keep));
  std::lock_guard<std::mutex> lock(registry_mutex_);
  if (task.fingerprint && !(task.meta.flags & formats::kTensorNotFingerprinted)) {
    // Outputs and inputs alike describe the bits of this storage version.
    CacheEntry entry;
    entry.storage_id = task.meta.storage_id;
    entry.version = task.meta.version;
    entry.offset = task.meta.storage_offset;
    entry.sizes = task.meta.sizes;
    entry.strides = task.meta.strides;
    entry.dtype = static_cast<uint8_t>(task.meta.dtype);
    entry.fingerprint = task.meta.fingerprint;
    if (cache_.size() > 65536) cache_.clear();
    cache_[entry.storage_id] = std::move(entry);
  }
  // Not dropped here: see bury().
  if (task.storage != nullptr) {
    auto it = registry_.find(task.storage);
    if (it != registry_.end()) {
      auto& v = it->second;
      for (std::size_t i = 0; i < v.size();) {
        auto p = v[i].lock();
        if (!p || p.get() == &task || p->state.load() == TensorTask::kDone) {
          v[i] = v.back();
          v.pop_back();
        } else {
          ++i;
        }
      }
      if (v.empty()) registry_.erase(it);
    }
  }
  task.state.store(TensorTask::kDone);
}

bool Writer::cached_fingerprint(const at::Tensor& t, uint64_t storage_id, uint64_t* fp) {
  std::lock_guard<std::mutex> lock(registry_mutex_);
  auto it = cache_.find(storage_id);
  if (it == cache_.end()) return false;
  const CacheEntry& e = it->second;
  if (e.version != static_cast<uint32_t>(t._version()) || e.offset != t.storage_offset())
    return false;
  if (!std::equal(e.sizes.begin(), e.sizes.end(), t.sizes().begin(), t.sizes().end()) ||
      !std::equal(e.strides.begin(), e.strides.end(), t.strides().begin(), t.strides().end()))
    return false;
  *fp = e.fingerprint;
  return true;
}

void Writer::thread_main() {
  t_is_writer_thread = true;
  at::RecordFunctionGuard no_recording(false);
  while (true) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) break;  // stopping and drained
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    uint64_t released = 0;
    if (!item.event) {
      if (!failed_.load()) {
        try {
          close_step();
        } catch (const std::exception& e) {
          fail(e.what());
        }
      }
      ++open_step_;
    } else {
      released = item.event->queued_bytes;
      if (failed_.load()) {
        for (auto& task : item.event->tasks)
          if (task) run_task(*task);  // cheap when it is only a release
      } else {
        try {
          write_event(*item.event);
        } catch (const std::exception& e) {
          fail(e.what());
        }
      }
      item.event.reset();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queued_bytes_ -= released;
    }
    room_.notify_all();
  }
  if (!failed_.load()) {
    try {
      close_step();
    } catch (const std::exception& e) {
      fail(e.what());
    }
  }
}

void Writer::write_event(PendingEvent& pending) {
  if (!step_writer_) {
    const std::string path = rank_dir_ + "/" + formats::step_file_name(open_step_);
    step_writer_ = std::make_unique<formats::StepWriter>(path, rank_, open_step_);
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
    run_task(*task);  // usually runs here; waits if a training thread has it
    formats::Value& value = i < n_in ? ev.inputs[i] : ev.outputs[i - n_in];
    value.tensor = task->meta;
    if (task->dump && !(task->meta.flags & formats::kTensorNotFingerprinted)) {
      value.tensor.data_index = step_writer_->write_tensor(
          task->meta.dtype, task->meta.sizes, task->bytes.data(), task->bytes.size());
      value.tensor.flags |= formats::kTensorHasData;
      std::vector<uint8_t>().swap(task->bytes);
    }
  }
  step_writer_->add_event(std::move(ev));
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
  step_writer_.reset();  // leaves the partial step as .tmp
  if (on_failure_) on_failure_(message);
}

void Writer::finish() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (finished_) return;
    finished_ = true;
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  collect_garbage();
}

}  // namespace opguard::record
