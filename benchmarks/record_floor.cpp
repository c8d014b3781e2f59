// The floor of a RecordFunction recorder that hashes on another thread: a
// library preloaded into a training program (record_overhead.py runs it) that
// does the least any such recorder must do on the training thread, and no more.
//
// For every top-level operator (nested ones hidden, as the recorder hides
// them), the tensors it reads are handed, by reference, to a hashing thread
// through a per-thread ring: no lock, no allocation, no metadata on the
// training thread. Tensors the op writes are hashed before it runs (their old
// bits are gone after). Its outputs are handed over when it returns. The
// hashing thread hashes host tensors with XXH3 and drops the references.
//
// It records nothing: no event, no shape, no fingerprint cache, no
// uninitialised memory, no writer. A ratio measured with it is a lower bound
// for the design that docs/BENCHMARKS.md discusses ("a per-thread ring of
// plain records"), not a recorder.
//
// OPGUARD_FLOOR_HASH takes parts of the hashing out or changes them:
//   unset or "1"  everything above;
//   "0"           nothing hashed (the references are still handed over);
//   "deferred"    only the hashing thread hashes: the inputs an op writes are
//                 not hashed at all (what those cost; no recorder may do this);
//   "cache"       as "1", but an input the op writes is hashed in place only
//                 when the hashing thread has not already hashed those bits
//                 (its memory at its current version, handed over as an
//                 earlier op's output); the hashing thread spins instead of
//                 sleeping between rounds.

#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <xxhash.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

namespace {

// One producer (a training thread), one consumer (the hashing thread).
struct Ring {
  static constexpr uint64_t kSlots = 1 << 16;
  c10::TensorImpl* slots[kSlots];  // each holds one reference, released by the consumer
  uint32_t versions[kSlots];        // the version when handed over
  std::atomic<uint64_t> head{0};
  std::atomic<uint64_t> tail{0};
};

std::mutex g_rings_mutex;
std::vector<Ring*> g_rings;  // never freed: a thread's ring outlives it until drained
std::atomic<uint64_t> g_sink{0};  // the hashes, so that none is optimised away
std::atomic<uint64_t> g_handed{0};
std::atomic<uint64_t> g_full{0};
// OPGUARD_FLOOR_HASH (the settings are at the top of this file).
const char* hash_setting() {
  const char* v = std::getenv("OPGUARD_FLOOR_HASH");
  return v == nullptr ? "1" : v;
}
const bool g_hash = std::strcmp(hash_setting(), "0") != 0;
const bool g_cache = std::strcmp(hash_setting(), "cache") == 0;
const bool g_hash_written = g_cache || std::strcmp(hash_setting(), "1") == 0;

// The memory and version the hashing thread last hashed, by memory address:
// direct-mapped, lossy, lock-free.
struct Hashed {
  std::atomic<const void*> data{nullptr};
  std::atomic<uint32_t> version{0};
};
constexpr size_t kHashedSlots = 1 << 14;
Hashed g_hashed_table[kHashedSlots];
std::atomic<uint64_t> g_written_hits{0}, g_written_misses{0};
size_t hashed_slot(const void* data) { return (reinterpret_cast<uintptr_t>(data) >> 6) % kHashedSlots; }
uint32_t version_of(const c10::TensorImpl* t) { return t->version_counter().current_version(); }

thread_local Ring* t_ring = nullptr;
thread_local int t_depth = 0;
thread_local std::unordered_map<const char*, uint64_t>* t_written = nullptr;  // by fn.name()

uint64_t hash_of(const c10::TensorImpl* t) {
  if (!g_hash || !t->has_storage() || !t->is_contiguous() || t->device().type() != c10::kCPU) return 0;
  const void* data = t->data();
  return data == nullptr ? 0 : XXH3_64bits(data, static_cast<size_t>(t->numel()) * t->itemsize());
}

void hand_over(const at::Tensor& t) {
  if (!t.defined()) return;
  Ring* r = t_ring;
  if (r == nullptr) {
    r = t_ring = new Ring();
    std::lock_guard<std::mutex> lock(g_rings_mutex);
    g_rings.push_back(r);
  }
  const uint64_t head = r->head.load(std::memory_order_relaxed);
  if (head - r->tail.load(std::memory_order_acquire) >= Ring::kSlots) {
    g_full.fetch_add(1, std::memory_order_relaxed);  // full: hashed here
    g_sink.fetch_add(hash_of(t.unsafeGetTensorImpl()), std::memory_order_relaxed);
    return;
  }
  r->slots[head % Ring::kSlots] = c10::intrusive_ptr<c10::TensorImpl>(t.getIntrusivePtr()).release();
  if (g_cache) r->versions[head % Ring::kSlots] = t.is_inference() ? 0 : version_of(t.unsafeGetTensorImpl());
  r->head.store(head + 1, std::memory_order_release);
}

void hand_over(const c10::IValue& v) {
  if (v.isTensor()) {
    hand_over(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList().vec()) hand_over(t);
  }
}

// Bit i: the op writes argument i (alias info), looked up once per op and thread.
uint64_t written_arguments(const at::RecordFunction& fn) {
  if (t_written == nullptr) t_written = new std::unordered_map<const char*, uint64_t>();
  auto it = t_written->find(fn.name());
  if (it != t_written->end()) return it->second;
  uint64_t mask = 0;
  if (auto handle = c10::Dispatcher::singleton().findSchema(*fn.operator_name())) {
    const auto& args = handle->schema().arguments();
    for (size_t i = 0; i < args.size() && i < 64; ++i)
      if (args[i].alias_info() != nullptr && args[i].alias_info()->isWrite()) mask |= uint64_t{1} << i;
  }
  t_written->emplace(fn.name(), mask);
  return mask;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (!fn.operator_name() || t_depth++ > 0) return nullptr;
  at::enableRecordFunction(false);  // the ops it calls are not seen (back on in on_end)
  try {
    const uint64_t written = written_arguments(fn);
    const auto args = fn.inputs();
    for (size_t i = 0; i < args.size(); ++i) {
      if (i < 64 && ((written >> i) & 1) != 0) {
        if (g_hash_written && args[i].isTensor()) {
          const c10::TensorImpl* t = args[i].toTensor().unsafeGetTensorImpl();
          if (g_cache && t->has_storage() && !args[i].toTensor().is_inference()) {
            const Hashed& h = g_hashed_table[hashed_slot(t->storage().data())];
            if (h.data.load(std::memory_order_acquire) == t->storage().data() &&
                h.version.load(std::memory_order_acquire) == version_of(t)) {
              g_written_hits.fetch_add(1, std::memory_order_relaxed);
              continue;
            }
            g_written_misses.fetch_add(1, std::memory_order_relaxed);
          }
          g_sink.fetch_add(hash_of(t));
        }
      } else {
        hand_over(args[i]);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "record_floor: %s\n", e.what());
  }
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (!fn.operator_name() || --t_depth > 0) return;
  try {
    for (const auto& v : fn.outputs()) hand_over(v);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "record_floor: %s\n", e.what());
  }
  at::enableRecordFunction(true);
}

std::atomic<bool> g_stop{false};

// Until g_stop, then once more: every reference is dropped before libtorch's
// own static destructors run (Install's destructor joins this thread first).
void hashing_thread() {
  std::vector<Ring*> rings;
  for (bool last = false; !last;) {
    last = g_stop.load();
    {
      std::lock_guard<std::mutex> lock(g_rings_mutex);
      rings = g_rings;
    }
    bool any = false;
    for (Ring* r : rings) {
      uint64_t tail = r->tail.load(std::memory_order_relaxed);
      const uint64_t head = r->head.load(std::memory_order_acquire);
      for (; tail < head; ++tail) {
        auto t = c10::intrusive_ptr<c10::TensorImpl>::reclaim(r->slots[tail % Ring::kSlots]);
        g_sink.fetch_add(hash_of(t.get()), std::memory_order_relaxed);
        if (g_cache && t->has_storage()) {
          Hashed& h = g_hashed_table[hashed_slot(t->storage().data())];
          h.data.store(nullptr, std::memory_order_release);
          h.version.store(r->versions[tail % Ring::kSlots], std::memory_order_release);
          h.data.store(t->storage().data(), std::memory_order_release);
        }
        g_handed.fetch_add(1, std::memory_order_relaxed);
        any = true;
      }
      r->tail.store(tail, std::memory_order_release);
    }
    if (!any && !g_cache) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

struct Install {
  std::thread hasher;
  at::CallbackHandle handle = 0;
  Install() {
    handle = at::addGlobalCallback(at::RecordFunctionCallback(on_start, on_end)
                                       .needsInputs(true)
                                       .needsOutputs(true)
                                       .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
    hasher = std::thread(hashing_thread);
  }
  ~Install() {
    at::removeCallback(handle);
    g_stop.store(true);
    hasher.join();
    std::fprintf(stderr,
                 "record_floor: %llu tensors handed over, %llu hashed in place (ring full); written inputs "
                 "already hashed %llu, hashed in place %llu\n",
                 static_cast<unsigned long long>(g_handed.load()), static_cast<unsigned long long>(g_full.load()),
                 static_cast<unsigned long long>(g_written_hits.load()),
                 static_cast<unsigned long long>(g_written_misses.load()));
  }
} g_install;

}  // namespace
