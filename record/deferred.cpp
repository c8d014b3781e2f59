#include "deferred.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/Storage.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "writer.h"

namespace opguard::record {
namespace {

c10::DeleterFnPtr g_base_deleter = nullptr;  // the wrapped allocator's, set once

void deferring_delete(void* p) { DeferredHashing::instance().release(p); }

// Hands out the wrapped allocator's memory unchanged, under a deleter that
// asks DeferredHashing first. Only allocations whose deleter is the wrapped
// allocator's fixed one (its raw_deleter) are wrapped; the rest pass through.
class DeferringAllocator final : public c10::Allocator {
 public:
  explicit DeferringAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(std::size_t n) override {
    c10::DataPtr p = base_->allocate(n);
    if (p.get() != p.get_context() || p.get_deleter() != g_base_deleter) return p;
    const c10::Device device = p.device();
    void* data = p.release_context();
    return {data, data, &deferring_delete, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &deferring_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    base_->copy_data(dest, src, count);
  }

 private:
  c10::Allocator* base_;
};

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

void install_deferring_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    c10::Allocator* base = c10::GetCPUAllocator();
    if (base == nullptr || base->raw_deleter() == nullptr) return;  // nothing to wrap safely
    g_base_deleter = base->raw_deleter();
    static DeferringAllocator wrapper(base);  // lives as long as the process: storages keep its deleter
    c10::SetCPUAllocator(&wrapper, /*priority=*/0);
  });
}

bool frees_can_wait(const c10::Storage& storage) {
  return g_base_deleter != nullptr && storage.data_ptr().get_deleter() == &deferring_delete;
}

DeferredHashing& DeferredHashing::instance() {
  static DeferredHashing* d = new DeferredHashing();  // never destroyed: deleters run at exit
  return *d;
}

std::shared_ptr<DeferredJob> DeferredHashing::add(TensorTask& task) {
  auto job = std::make_shared<DeferredJob>();
  job->task = &task;
  job->base = task.deferred_base;
  job->bytes = task.deferred_bytes;
  std::lock_guard<std::mutex> lock(mutex_);
  entries_[job->base].jobs.push_back(job);
  bucket_jobs_[bucket(job->base)].fetch_add(1, std::memory_order_seq_cst);
  outstanding_bytes_.fetch_add(job->bytes, std::memory_order_relaxed);
  return job;
}

void DeferredHashing::run_or_wait(DeferredJob& job, DeferredRunner run, void* context) {
  int expected = DeferredJob::kQueued;
  if (job.state.compare_exchange_strong(expected, DeferredJob::kRunning, std::memory_order_acq_rel)) {
    run(context, *job.task);
    complete(job);
    return;
  }
  for (int spins = 0; job.state.load(std::memory_order_acquire) != DeferredJob::kDone; ++spins) {
    if (spins < 4096) {
      cpu_relax();
    } else {
      sched_yield();  // the other thread may share this core
    }
  }
}

void DeferredHashing::wait_clear(const void* base, DeferredRunner run, void* context) {
  if (bucket_jobs_[bucket(base)].load(std::memory_order_seq_cst) == 0) return;
  thread_local std::vector<std::shared_ptr<DeferredJob>> jobs;  // kept alive while run or waited for
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = entries_.find(base);
    if (it == entries_.end()) return;
    jobs.assign(it->second.jobs.begin(), it->second.jobs.end());
  }
  for (const auto& job : jobs) run_or_wait(*job, run, context);
  jobs.clear();
}

void DeferredHashing::complete(DeferredJob& job) {
  void* free_now = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = entries_.find(job.base);
    if (it != entries_.end()) {
      auto& jobs = it->second.jobs;
      jobs.erase(std::find_if(jobs.begin(), jobs.end(), [&](const auto& j) { return j.get() == &job; }));
      if (jobs.empty()) {
        if (it->second.freed) free_now = const_cast<void*>(job.base);
        entries_.erase(it);
      }
    }
    bucket_jobs_[bucket(job.base)].fetch_sub(1, std::memory_order_seq_cst);
    outstanding_bytes_.fetch_sub(job.bytes, std::memory_order_relaxed);
  }
  job.state.store(DeferredJob::kDone, std::memory_order_release);
  if (free_now != nullptr) g_base_deleter(free_now);
}

void DeferredHashing::release(void* p) {
  if (!forked_.load(std::memory_order_relaxed) && bucket_jobs_[bucket(p)].load(std::memory_order_seq_cst) != 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = entries_.find(p);
    if (it != entries_.end()) {
      it->second.freed = true;  // complete() frees it after the last job
      return;
    }
  }
  g_base_deleter(p);
}

// --- the hashing thread -------------------------------------------------------

namespace {

int affinity_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

}  // namespace

Hasher::Hasher(Writer& writer, std::function<void(PendingEvent&)> settle, uint32_t test_delay_us)
    : writer_(writer), settle_(std::move(settle)), test_delay_us_(test_delay_us), cpus_(affinity_cpus()) {
  thread_ = std::thread([this] { thread_main(); });
}

Hasher::~Hasher() { finish(); }

void Hasher::enqueue(std::unique_ptr<PendingEvent> event) { push(std::move(event)); }

void Hasher::end_step() { push(nullptr); }

void Hasher::hand_on(std::unique_ptr<PendingEvent> event) {
  settle_(*event);
  writer_.enqueue_admitted(std::move(event));
}

void Hasher::push(std::unique_ptr<PendingEvent> event) {
  // Counted against the writer's bound now, on the training thread: what
  // waits here is memory the recorder holds like the writer's queue.
  if (event && !writer_.admit(*event)) return;
  bool wake = false;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (queue_.size() >= kMaxQueued) room_.wait(lock, [&] { return queue_.size() < kMaxQueued || stopping_; });
    if (stopping_ && event) {
      // finish() has run: hash here and hand on, in order behind what it drained.
      lock.unlock();
      hand_on(std::move(event));
      return;
    }
    if (!spare_core() && queue_.empty() && !handing_ &&
        !(event && std::any_of(event->tasks.begin(), event->tasks.end(),
                               [](const auto& t) { return t && t->deferred_data != nullptr; }))) {
      // No core for this thread, nothing of this stage ahead of the event and
      // nothing to hash: hand it on here (in order: under the lock), as
      // without this stage, rather than wake this thread (a context switch
      // on a busy core per operator).
      if (event) {
        settle_(*event);
        writer_.enqueue_admitted(std::move(event));
      } else {
        writer_.end_step();
      }
      return;
    }
    Item item{std::move(event)};
    try {
      if (item.event) {
        // The event's task vector is final now: jobs may point into it.
        for (auto& task : item.event->tasks) {
          if (task && task->deferred_data != nullptr) task->job = DeferredHashing::instance().add(*task);
        }
      }
      queue_.push_back(std::move(item));  // on failure `item` keeps the event
    } catch (const std::exception&) {
      // Out of memory: the jobs made so far must not outlive the event, and
      // the event must not be lost: hash it here (settle runs its jobs).
      if (!item.event) throw;
      lock.unlock();
      hand_on(std::move(item.event));
      return;
    }
    queued_.store(queue_.size(), std::memory_order_release);
    wake = sleeping_;
  }
  if (wake) wake_.notify_one();
}

void Hasher::thread_main() {
  mark_writer_thread();
  std::deque<Item> batch;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      handing_ = false;  // the last batch is with the writer
      if (queue_.empty() && !stopping_) {
        // Spin a while before sleeping: the next operator usually comes within
        // microseconds, and a sleeping thread costs its producer a futex wake.
        // Not where the program's threads take every core (the class comment).
        const int spin_limit = spare_core() ? 400000 : 0;
        lock.unlock();
        for (int spins = 0; spins < spin_limit && queued_.load(std::memory_order_acquire) == 0; ++spins) cpu_relax();
        lock.lock();
        sleeping_ = true;
        wake_.wait(lock, [&] { return !queue_.empty() || stopping_; });
        sleeping_ = false;
      }
      if (queue_.empty() && stopping_) break;
      batch.swap(queue_);
      handing_ = true;
      queued_.store(0, std::memory_order_release);
    }
    room_.notify_all();
    for (Item& item : batch) {
      if (!item.event) {
        writer_.end_step();
        continue;
      }
      if (test_delay_us_ > 0 && std::any_of(item.event->tasks.begin(), item.event->tasks.end(),
                                            [](const auto& t) { return t && t->job; }))
        ::usleep(test_delay_us_);
      hand_on(std::move(item.event));
    }
    batch.clear();
  }
}

void Hasher::finish() { stop_queue_thread(mutex_, finished_, stopping_, wake_, room_, thread_); }

}  // namespace opguard::record
