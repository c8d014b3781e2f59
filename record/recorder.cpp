// The RecordFunction hook: turns every top-level operator call into an Event.
//
// What runs on the training thread (per top-level op): reading the boxed
// inputs and outputs into Values, assigning storage ids, fingerprinting every
// tensor (inputs before the op runs, outputs after), copying the ones the
// sampling policy keeps in full, and queueing the event. No reference to an
// application tensor outlives the callback (pending.h says why); the HDF5
// work happens on the writer thread.

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/SequenceNumber.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/flat_hash_map.h>
#include <dlfcn.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fcntl.h>
#include <memory_resource>
#include <mutex>
#include <regex>
#include <sys/mman.h>
#include <sys/stat.h>
#include <thread>
#include <unordered_map>
#include <xxhash.h>

#include "opguard/core/error.h"
#include "opguard/core/written_arguments.h"
#include "opguard/kernels/fingerprint.h"
#include "opguard/record/config.h"
#include "opguard/record/recorder.h"
#include "collectives.h"
#include "deferred.h"
#include "opguard/record/scope.h"
#include "record_cuda.h"
#include "recorder_internal.h"
#include "writer.h"

namespace opguard::record {

namespace {

using formats::Phase;
using formats::Value;
using formats::ValueKind;

constexpr const char* kNodePrefix = "autograd::engine::evaluate_function: ";
constexpr const char* kOptimizerStepPrefix = "Optimizer.step#";
constexpr const char* kOptimizerZeroGradPrefix = "Optimizer.zero_grad#";

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

bool starts_with(const char* s, const char* prefix) {
  return std::strncmp(s, prefix, std::strlen(prefix)) == 0;
}

std::string hex_double(double d) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%a", d);
  return buf;
}

std::optional<DType> to_dtype(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Double: return DType::kFloat64;
    case c10::ScalarType::Float: return DType::kFloat32;
    case c10::ScalarType::Half: return DType::kFloat16;
    case c10::ScalarType::BFloat16: return DType::kBFloat16;
    case c10::ScalarType::Char: return DType::kInt8;
    case c10::ScalarType::Short: return DType::kInt16;
    case c10::ScalarType::Int: return DType::kInt32;
    case c10::ScalarType::Long: return DType::kInt64;
    case c10::ScalarType::Byte: return DType::kUInt8;
    case c10::ScalarType::Bool: return DType::kBool;
    case c10::ScalarType::ComplexFloat: return DType::kComplex64;
    case c10::ScalarType::ComplexDouble: return DType::kComplex128;
    case c10::ScalarType::UInt16: return DType::kUInt16;
    case c10::ScalarType::UInt32: return DType::kUInt32;
    case c10::ScalarType::UInt64: return DType::kUInt64;
    case c10::ScalarType::Float8_e4m3fn: return DType::kFloat8E4M3;
    case c10::ScalarType::Float8_e5m2: return DType::kFloat8E5M2;
    default: return std::nullopt;
  }
}

// --- per-thread state -------------------------------------------------------

struct NodeFrame {
  std::string node;
  const std::string* scope = nullptr;
  uint64_t forward_thread = 0;  // RecordFunction's id of the thread that ran the node's forward op
  std::size_t scope_depth = 0;  // the thread's module scopes open when the node started
};

struct ThreadState {
  bool initialised = false;
  uint32_t stream = 0;
  uint64_t next_seq = 0;
  uint64_t tid = 0;
  int op_depth = 0;  // open operator ranges on this thread
  std::vector<const std::string*> scopes;  // interned full paths, innermost last
  struct PhaseFrame {
    Phase phase;
    bool optimizer_step;  // PyTorch's Optimizer.step range (may call a closure)
  };
  std::vector<PhaseFrame> phases;  // explicit phase ranges
  std::vector<NodeFrame> nodes;            // autograd node ranges
  std::unordered_map<std::string, bool> op_regex_cache;
  std::unordered_map<const std::string*, bool> scope_regex_cache;
  uint64_t generation = 0;  // Recorder generation these caches belong to
};

thread_local ThreadState t_state;

// Events in flight, process-wide, that began outside any intra-op parallel
// region: while one runs, an op that starts on a parallel region's worker
// thread (not its master) is taken to be one its kernel runs there (the CPU
// flash attention's backward allocates its buffers with at::empty on each
// OpenMP worker). ATen does not hand the master's RecordFunction switch to
// its workers, so that op would otherwise be an event of its own, on the
// worker's stream, in the wrong phase and scope.
std::atomic<int> g_kernels_in_flight{0};

// What the start callback hands to the end callback.
struct Context : at::ObserverContext {
  enum Kind { kScope, kPhase, kNode, kOptimizer, kEvent };
  explicit Context(Kind k) : kind(k) {}
  Kind kind;
  std::unique_ptr<PendingEvent> pending;
  bool dump = false;  // the sampling policy keeps this event's tensors in full
  // kEvent: RecordFunction is off on this thread until on_end (the ops this
  // op calls are not events, and observing them cost more than the hook).
  bool hides_nested = false;
  // The arguments the op writes and does not return (OpInfo::
  // arg_written_unreturned): recorded after the op as extra outputs.
  std::vector<std::pair<const std::string*, c10::IValue>> written;
  // kEvent in forward: the autograd sequence numbers before the op ran; the
  // nodes it (or an op it calls) creates take the numbers up to on_end's.
  bool forward_nodes = false;
  uint64_t seq_begin = 0;
  // kEvent: counted in g_kernels_in_flight until on_end.
  bool in_flight = false;
};

}  // namespace

// --- the recorder ----------------------------------------------------------

// Memory for the recorder's tables that live across operators (storage ids,
// the fingerprint cache, autograd node scopes), mapped apart from malloc's
// heap. Their small nodes, allocated between the program's tensors on the
// training thread's heap, kept freed tensor memory from coalescing: the
// heap grew by about 50 MB a step (tiny_gpt --width 128 --depth 4) and every
// new tensor page-faulted. One per table, used under that table's mutex.
class MappedResource : public std::pmr::memory_resource {
  void* do_allocate(std::size_t bytes, std::size_t) override {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    return p;
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t) override { ::munmap(p, bytes); }
  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override { return this == &other; }
};

struct TableMemory {
  MappedResource mapped;
  std::pmr::unsynchronized_pool_resource pool{std::pmr::pool_options{0, 64 * 1024}, &mapped};
};

// An open-addressing table in a TableMemory, for the lookups of every
// tensor (a node-based map's chains cost a cache miss or two each).
template <class K, class V>
using FlatTable =
    ska::flat_hash_map<K, V, std::hash<K>, std::equal_to<K>, std::pmr::polymorphic_allocator<std::pair<K, V>>>;

struct RecorderImpl {
  RecorderConfig config;
  std::regex ops_re, scopes_re;
  int rank = 0;
  int world_size = 1;
  std::string rank_dir;
  uint64_t generation = 0;

  std::atomic<bool> active{false};
  std::atomic<bool> failed{false};
  std::atomic<int64_t> step{0};
  std::atomic<bool> explicit_steps{false};
  std::atomic<bool> optimizer_ranges{false};
  // An Optimizer.step range ended the step: taken by the next event that is
  // not an optimizer op, or by the program's own step call right after it
  // (opguard.step() after optimizer.step() ends one step, not two).
  std::atomic<bool> step_end_pending{false};
  // The inferred step boundary (docs/RECORD.md, "Steps"), for programs with
  // neither: since the last boundary a backward op ran and, after it, an op
  // wrote a parameter (a leaf tensor that requires grad); the next forward op
  // of the thread whose forward ops the backward ran for (RecordFunction's
  // thread id) starts a new step. Reset by every step boundary.
  std::atomic<bool> backward_seen{false};
  std::atomic<bool> parameters_updated{false};
  std::atomic<uint64_t> training_thread{0};
  std::atomic<uint64_t> dumped_bytes{0};
  std::atomic<uint64_t> dropped{0};
  // Deferred tensors whose quick probe changed before they were hashed
  // (written without the dispatcher): recorded as not fingerprinted.
  std::atomic<uint64_t> written_while_deferred{0};
  std::atomic<uint64_t> ops_on_kernel_workers{0};  // ops a kernel ran on its parallel workers: not events
  std::atomic<uint64_t> events{0};
  std::atomic<bool> budget_exhausted{false};
  std::atomic<uint32_t> next_stream{1};
  at::CallbackHandle handle = 0;
  int64_t start_ns = 0;
  std::string start_time;

  std::once_flag open_once;
  std::atomic<bool> opened{false};
  std::atomic<bool> refused{false};  // another process owns this rank
  std::unique_ptr<Writer> writer;
  // Between the training threads and the writer when fingerprints are
  // deferred (config.defer_hashing; deferred.h); null otherwise.
  std::unique_ptr<Hasher> hasher;
  std::unique_ptr<kernels::HashPool> pool;  // helps training threads hash large tensors
  formats::Manifest manifest;

  // Chunk hashes (kernels::chunk_hashes) of the views of each storage hashed
  // since its version last changed: a weight read by forward, backward and
  // optimizer, directly and transposed, is hashed once per view; a reshape,
  // view or flatten of hashed contiguous bytes is not read at all (the same
  // row-major bytes have the same chunk hashes; only the header differs).
  // Fixed-size entries in table_memory (see TableMemory for why).
  static constexpr int kMaxCachedDims = 6;
  static constexpr std::size_t kInlineChunks = 4;  // views up to 4 MiB; larger ones keep a vector
  static constexpr std::size_t kViewsPerStorage = 4;
  static constexpr std::size_t kMaxCachedStorages = 16384;
  struct CachedView {
    int64_t offset = 0;  // storage offset, in elements of elem_size
    uint64_t nbytes = 0;
    uint8_t elem_size = 0;
    uint8_t ndim = 0;  // sizes and strides: non-contiguous views only
    bool contiguous = false;
    uint32_t n_chunks = 0;
    bool probed = false;  // host memory: `probe` is kernels::probe of it when cached
    uint64_t probe = 0;
    int64_t sizes[kMaxCachedDims] = {};
    int64_t strides[kMaxCachedDims] = {};
    uint64_t chunks[kInlineChunks] = {};
    std::vector<uint64_t> more_chunks;  // all of them, when n_chunks > kInlineChunks
    const uint64_t* chunk_data() const { return n_chunks > kInlineChunks ? more_chunks.data() : chunks; }
  };
  struct CacheEntry {
    uint32_t version = 0;
    uint8_t used = 0;
    uint8_t next = 0;  // the slot the next view replaces once all are used
    CachedView views[kViewsPerStorage];
  };
  std::mutex cache_mutex;
  TableMemory cache_memory;
  std::pmr::unordered_map<uint64_t, CacheEntry> fingerprint_cache{&cache_memory.pool};  // by storage id

  // --stop-after-windows: which --dump-around windows an event of their
  // stream has passed (one flag per window), and whether the stop was asked.
  std::unique_ptr<std::atomic<bool>[]> window_closed;
  std::atomic<bool> stop_requested{false};

  // Interned strings and operator facts; entries never move or die while the
  // recorder lives, so events keep raw pointers to them.
  std::mutex intern_mutex;
  std::deque<std::string> scope_strings;
  std::unordered_map<std::string, const std::string*> scope_index;
  std::unordered_map<c10::OperatorName, std::unique_ptr<OpInfo>> ops;

  // Storage identity: the same StorageImpl has one id while it lives.
  struct StorageEntry {
    c10::weak_intrusive_ptr<c10::StorageImpl> weak;
    uint64_t id;
  };
  std::mutex storage_mutex;
  TableMemory storage_memory;  // storage_ids and uninit, under storage_mutex
  FlatTable<const c10::StorageImpl*, StorageEntry> storage_ids{&storage_memory.pool};
  uint64_t next_storage_id = 1;
  // storage_ids' size at which the next insert sweeps out the entries of
  // storages that died: twice what the last sweep left, so that a sweep's
  // cost spreads over as many inserts as the entries it reads.
  std::size_t storage_sweep_at = 1024;
  // Storages whose bits are uninitialised memory (made by empty*), until an
  // operator first writes them or their probe changes (numpy or a kernel
  // called without the dispatcher wrote them).
  struct UninitEntry {
    c10::weak_intrusive_ptr<c10::StorageImpl> weak;
    std::optional<uint64_t> probe;  // storage_probe when marked; none for device memory
  };
  FlatTable<const c10::StorageImpl*, UninitEntry> uninit{&storage_memory.pool};

  // Forward scope of each autograd node, by (forward thread, sequence nr).
  std::mutex node_mutex;
  TableMemory node_memory;
  std::pmr::unordered_map<uint64_t, const std::string*> node_scopes{&node_memory.pool};
  // Autograd nodes [seq_begin, seq_end) of RecordFunction thread `thread`
  // were created under `scope`.
  void remember_node_scopes(uint64_t thread, uint64_t seq_begin, uint64_t seq_end, const std::string* scope) {
    // A composite op creates a handful of nodes; the cap bounds a surprise.
    seq_end = std::min(seq_end, seq_begin + 4096);
    std::lock_guard<std::mutex> lock(node_mutex);
    if (node_scopes.size() > (1u << 20)) node_scopes.clear();
    for (uint64_t seq = seq_begin; seq < seq_end; ++seq) node_scopes[(thread << 40) ^ seq] = scope;
  }

  const std::string* intern_scope(const std::string& s) {
    std::lock_guard<std::mutex> lock(intern_mutex);
    auto it = scope_index.find(s);
    if (it != scope_index.end()) return it->second;
    scope_strings.push_back(s);
    const std::string* p = &scope_strings.back();
    scope_index.emplace(s, p);
    return p;
  }

  const OpInfo* op_info(const at::RecordFunction& fn, const c10::OperatorName& name);
  // `maybe_uninitialized`: set to whether t's storage is marked
  // uninitialised now (still_uninitialized says whether it still is).
  uint64_t storage_id(const at::Tensor& t, bool* maybe_uninitialized = nullptr);
  // Whether s (t's storage) is marked uninitialised and its probe is as
  // marked; `clear`: an op writes it now, drop the mark. A changed probe
  // drops it too: the bits are data.
  bool still_uninitialized(const at::Tensor& t, const c10::StorageImpl* s, bool clear);
  // `cpu`: the view with its data pointer for a tensor in host memory (its
  // cached entry is only served while the memory's probe is unchanged),
  // nullptr for device tensors (served on storage and version alone).
  bool cached_fingerprint(TensorTask& task, bool contiguous, const kernels::TensorView* cpu);
  // Host tensors (`cpu`) are cached with their kernels::probe.
  void cache_chunks(const TensorTask& task, bool contiguous, const std::vector<uint64_t>& chunks,
                    const kernels::TensorView* cpu);
  // Drops the cached hashes of t's storage: a backend wrote it without bumping
  // its version (c10d collectives, collectives.h).
  void forget_fingerprints(const at::Tensor& t);
  // t, an output of empty*, holds no data; `fresh`: a new buffer (not the
  // resized `out=` tensor of empty.out), stamped and probed.
  void mark_uninitialized(const at::Tensor& t, bool fresh);
  void open_recording();
  // kOpen when the recording opens, kFailed when a write failed (from the
  // writer thread), kFinal at a clean end. Throws IoError / FormatError.
  enum class ManifestState { kOpen, kFailed, kFinal };
  void write_manifest(ManifestState state);
  std::mutex manifest_mutex;  // manifest and its file
  bool opened_manifest = false;  // the kOpen manifest exists
  std::string failure;        // the failed write, for the manifest
  int64_t failed_step = -1;

  // Disk space set aside when the recording opens (rank_dir/space.reserve)
  // and given back before the manifest is rewritten after a failed write, so
  // that a full disk still gets a manifest saying the recording is
  // incomplete. Removed at a clean end.
  std::string reserve_path;
  std::atomic<bool> reserved{false};
  void reserve_space();
  void release_space();
  bool wants_dump(const ThreadState& ts, const OpInfo& op, const std::string* scope,
                  uint32_t stream, uint64_t seq, int64_t step);
};

// The active recorder. Never freed: a callback already running on another
// thread may still read it after stop().
RecorderImpl* g_recorder = nullptr;

void end_step();  // with Recorder::step, below

namespace {

std::mutex g_lifecycle_mutex;
std::atomic<bool> g_in_forked_child{false};
uint64_t g_generation = 0;

// Whether the recorder infers steps itself (neither mark_step() nor an
// Optimizer.step range seen yet).
bool infers_steps(const RecorderImpl& rec) {
  return !rec.explicit_steps.load(std::memory_order_relaxed) && !rec.optimizer_ranges.load(std::memory_order_relaxed);
}

// A parameter, for the steps the recorder infers: a leaf tensor that requires grad.
bool is_parameter(const at::Tensor& t) { return t.defined() && t.requires_grad() && t.is_leaf(); }

bool is_empty_op(const std::string& name) {
  static const char* kEmpty[] = {"aten::empty",     "aten::empty_like",        "aten::empty_strided",
                                 "aten::new_empty", "aten::new_empty_strided", "aten::empty_permuted"};
  for (const char* e : kEmpty)
    if (name == e) return true;
  return false;
}

bool is_random_op(const std::string& name, const c10::FunctionSchema& schema) {
  for (const auto& arg : schema.arguments()) {
    auto type = arg.type();
    if (auto opt = type->cast<c10::OptionalType>()) type = opt->getElementType();
    if (type->kind() == c10::TypeKind::GeneratorType) return true;
  }
  static const char* kRandom[] = {"aten::dropout",       "aten::dropout_",        "aten::native_dropout",
                                  "aten::feature_dropout", "aten::alpha_dropout", "aten::rand",
                                  "aten::randn",         "aten::randint",         "aten::rand_like",
                                  "aten::randn_like",    "aten::randint_like",    "aten::randperm",
                                  "aten::rrelu",         "aten::rrelu_",          "aten::_fused_dropout",
                                  "aten::feature_alpha_dropout",
                                  // dropout_p > 0 draws from the default generator
                                  "aten::scaled_dot_product_attention",
                                  "aten::_scaled_dot_product_attention_math",
                                  "aten::_scaled_dot_product_flash_attention_for_cpu"};
  for (const char* r : kRandom)
    if (name == r) return true;
  return false;
}

}  // namespace

const OpInfo* RecorderImpl::op_info(const at::RecordFunction& fn, const c10::OperatorName& name) {
  std::lock_guard<std::mutex> lock(intern_mutex);
  auto it = ops.find(name);
  if (it != ops.end()) return it->second.get();
  auto info = std::make_unique<OpInfo>();
  info->op = name.name;
  info->overload = name.overload_name;
  info->is_mark = info->op == "opguard::mark";
  info->ignored = !info->is_mark && (starts_with(info->op.c_str(), "opguard::") ||
                                     starts_with(info->op.c_str(), "profiler::"));
  info->makes_uninitialized = is_empty_op(info->op);
  auto handle = c10::Dispatcher::singleton().findSchema(name);
  if (handle) {
    const auto& schema = handle->schema();
    std::ostringstream text;
    text << schema;
    info->schema = text.str();
    for (const auto& arg : schema.arguments()) {
      info->arg_names.push_back(arg.name());
      info->arg_written.push_back(arg.alias_info() != nullptr && arg.alias_info()->isWrite());
      auto type = arg.real_type();
      if (auto opt = type->cast<c10::OptionalType>()) type = opt->getElementType();
      switch (type->kind()) {
        case c10::TypeKind::ScalarTypeType: info->arg_int_kind.push_back(IntKind::kScalarType); break;
        case c10::TypeKind::LayoutType: info->arg_int_kind.push_back(IntKind::kLayout); break;
        case c10::TypeKind::MemoryFormatType: info->arg_int_kind.push_back(IntKind::kMemoryFormat); break;
        default: info->arg_int_kind.push_back(IntKind::kPlain); break;
      }
    }
    for (const auto& ret : schema.returns()) info->return_names.push_back(ret.name());
    info->arg_written_unreturned = written_not_returned(schema);
    info->random = is_random_op(info->op, schema);
  }
  const OpInfo* p = info.get();
  ops.emplace(name, std::move(info));
  return p;
}

uint64_t RecorderImpl::storage_id(const at::Tensor& t, bool* maybe_uninitialized) {
  const c10::Storage& storage = t.storage();
  const c10::StorageImpl* key = storage.unsafeGetStorageImpl();
  std::lock_guard<std::mutex> lock(storage_mutex);
  if (maybe_uninitialized != nullptr) *maybe_uninitialized = !uninit.empty() && uninit.count(key) != 0;
  // A live tensor's StorageImpl found here is the one the entry was made
  // for: the entry's weak reference keeps that object's memory from being
  // freed, so no other StorageImpl can have been made at its address.
  auto it = storage_ids.find(key);
  if (it != storage_ids.end()) return it->second.id;
  if (storage_ids.size() >= storage_sweep_at) {
    // The cached fingerprints of a storage that died are never served again
    // (ids are not reused): they go too, to keep the cache to live storages.
    std::lock_guard<std::mutex> cache_lock(cache_mutex);  // lock order: storage_mutex, then cache_mutex
    for (auto i = storage_ids.begin(); i != storage_ids.end();) {
      if (!i->second.weak.expired()) {
        ++i;
        continue;
      }
      fingerprint_cache.erase(i->second.id);
      i = storage_ids.erase(i);
    }
    for (auto i = uninit.begin(); i != uninit.end();) {
      i = i->second.weak.expired() ? uninit.erase(i) : std::next(i);
    }
    storage_sweep_at = std::max<std::size_t>(1024, 2 * storage_ids.size());
  }
  const uint64_t id = next_storage_id++;
  storage_ids.emplace(key, StorageEntry{storage.getWeakStorageImpl(), id});
  return id;
}

namespace {

// kernels::probe of all of a host storage's bytes (whatever view reads it);
// none for device memory, which the host cannot read.
std::optional<uint64_t> storage_probe(const at::Tensor& t) {
  const c10::Storage& storage = t.storage();
  if (!t.device().is_cpu() || storage.data() == nullptr) return std::nullopt;
  const auto nbytes = static_cast<int64_t>(storage.nbytes());
  kernels::TensorView whole;
  whole.dtype = DType::kUInt8;
  whole.sizes = &nbytes;
  whole.ndim = 1;
  whole.data = storage.data();
  return kernels::probe(whole);
}

}  // namespace

bool RecorderImpl::still_uninitialized(const at::Tensor& t, const c10::StorageImpl* s, bool clear) {
  std::optional<uint64_t> marked;
  {
    std::lock_guard<std::mutex> lock(storage_mutex);
    auto it = uninit.find(s);
    if (it == uninit.end()) return false;
    if (it->second.weak.lock().get() != s) {
      uninit.erase(it);
      return false;
    }
    marked = it->second.probe;
  }
  const bool written_outside = marked && storage_probe(t) != marked;
  if (clear || written_outside) {
    std::lock_guard<std::mutex> lock(storage_mutex);
    uninit.erase(s);
  }
  return !written_outside;
}

bool RecorderImpl::cached_fingerprint(TensorTask& task, bool contiguous, const kernels::TensorView* cpu) {
  formats::TensorMeta& m = task.meta;
  const std::size_t es = dtype_size(m.dtype);
  const uint64_t nbytes = static_cast<uint64_t>(task.numel()) * es;
  const std::size_t ndim = static_cast<std::size_t>(task.ndim);
  // The entry's chunk hashes are copied out, so that the probe of a large
  // tensor runs without the lock other recording threads need.
  thread_local std::vector<uint64_t> chunks;
  uint64_t expected_probe = 0;
  bool probed = false;
  {
    std::lock_guard<std::mutex> lock(cache_mutex);
    auto it = fingerprint_cache.find(m.storage_id);
    if (it == fingerprint_cache.end() || it->second.version != m.version) return false;
    const CacheEntry& e = it->second;
    const CachedView* hit = nullptr;
    for (std::size_t i = 0; i < e.used && hit == nullptr; ++i) {
      const CachedView& v = e.views[i];
      if (v.contiguous != contiguous || v.nbytes != nbytes) continue;
      // Offsets compare in bytes: a view may reinterpret the element type.
      if (v.offset * static_cast<int64_t>(v.elem_size) != m.storage_offset * static_cast<int64_t>(es)) continue;
      if (!contiguous && (v.elem_size != es || v.ndim != ndim ||
                          !std::equal(task.sizes(), task.sizes() + ndim, v.sizes) ||
                          !std::equal(task.strides(), task.strides() + ndim, v.strides)))
        continue;
      hit = &v;
    }
    if (hit == nullptr) return false;
    if (hit->probed && cpu == nullptr) {
      fingerprint_cache.erase(it);
      return false;
    }
    probed = hit->probed;
    expected_probe = hit->probe;
    chunks.assign(hit->chunk_data(), hit->chunk_data() + hit->n_chunks);
  }
  if (probed && kernels::probe(*cpu) != expected_probe) {
    // Written without the dispatcher since it was hashed (numpy, a kernel
    // called directly): the version did not move, the bits did. Every view
    // of this storage is stale.
    std::lock_guard<std::mutex> lock(cache_mutex);
    auto it = fingerprint_cache.find(m.storage_id);
    if (it != fingerprint_cache.end() && it->second.version == m.version) fingerprint_cache.erase(it);
    return false;
  }
  m.fingerprint = kernels::combine_chunk_hashes(m.dtype, task.sizes(), static_cast<int>(ndim), nbytes,
                                                chunks.data(), chunks.size());
  return true;
}

void RecorderImpl::forget_fingerprints(const at::Tensor& t) {
  const uint64_t id = storage_id(t);
  std::lock_guard<std::mutex> lock(cache_mutex);
  fingerprint_cache.erase(id);
}

void RecorderImpl::cache_chunks(const TensorTask& task, bool contiguous, const std::vector<uint64_t>& chunks,
                                const kernels::TensorView* cpu) {
  const uint64_t probe = cpu == nullptr ? 0 : kernels::probe(*cpu);
  const formats::TensorMeta& m = task.meta;
  if (!contiguous && task.ndim > kMaxCachedDims) return;
  std::lock_guard<std::mutex> lock(cache_mutex);
  if (fingerprint_cache.size() >= kMaxCachedStorages) fingerprint_cache.clear();
  CacheEntry& e = fingerprint_cache[m.storage_id];
  if (e.version != m.version) {
    e.version = m.version;
    e.used = 0;
    e.next = 0;
  }
  std::size_t slot = e.used;
  if (slot < kViewsPerStorage) {
    ++e.used;
  } else {
    slot = e.next;
    e.next = static_cast<uint8_t>((e.next + 1) % kViewsPerStorage);
  }
  CachedView& v = e.views[slot];
  v.offset = m.storage_offset;
  v.elem_size = static_cast<uint8_t>(dtype_size(m.dtype));
  v.nbytes = static_cast<uint64_t>(task.numel()) * v.elem_size;
  v.contiguous = contiguous;
  v.probed = cpu != nullptr;
  v.probe = probe;
  v.ndim = contiguous ? 0 : static_cast<uint8_t>(task.ndim);
  for (std::size_t d = 0; d < v.ndim; ++d) {
    v.sizes[d] = task.sizes()[d];
    v.strides[d] = task.strides()[d];
  }
  v.n_chunks = static_cast<uint32_t>(chunks.size());
  if (chunks.size() > kInlineChunks) {
    v.more_chunks = chunks;
  } else {
    std::vector<uint64_t>().swap(v.more_chunks);
    std::copy(chunks.begin(), chunks.end(), v.chunks);
  }
}

void RecorderImpl::mark_uninitialized(const at::Tensor& t, bool fresh) {
  // The probed lines of a new buffer get a known byte (0x01: a valid bool,
  // a tiny float) before the program sees it, so that whether anything wrote
  // them by the next read does not depend on the garbage that was there: it
  // did, unless it wrote exactly those bytes. Only a program that reads
  // memory it never wrote can see the difference. An `out=` tensor
  // (`empty.out`) is the program's own memory, resized: not stamped, not
  // probed, flagged until an operator writes it.
  const bool probed = fresh && t.device().is_cpu() && t.storage().data() != nullptr;
  if (probed) kernels::stamp_probe_lines(t.storage().mutable_data(), t.storage().nbytes(), 0x01);
  UninitEntry e{t.storage().getWeakStorageImpl(), probed ? storage_probe(t) : std::nullopt};
  std::lock_guard<std::mutex> lock(storage_mutex);
  uninit.insert_or_assign(t.storage().unsafeGetStorageImpl(), std::move(e));
}

// A --dump-around window's event: its stream and its position in the stream
// (formats::make_event_id's two parts).
static std::pair<uint64_t, uint64_t> window_place(const EventWindow& w) {
  return {w.event_id >> 48, w.event_id & ((uint64_t{1} << 48) - 1)};
}

bool RecorderImpl::wants_dump(const ThreadState& ts, const OpInfo& op, const std::string* scope,
                              uint32_t stream, uint64_t seq, int64_t step) {
  const SamplingPolicy& p = config.policy;
  if (budget_exhausted.load(std::memory_order_relaxed)) return false;
  if (op.is_mark) return true;  // marks are boundaries: always full
  if (p.all) return true;
  if (!p.dumps_anything()) return false;
  if (!p.steps.empty()) {
    bool any = false;
    for (const auto& r : p.steps) any = any || (step >= r.first && step <= r.last);
    if (!any) return false;
  }
  if (p.every > 0 && step % p.every != 0) return false;
  auto& mutable_ts = const_cast<ThreadState&>(ts);
  if (!p.ops.empty()) {
    const std::string key = formats::op_text(op.op, op.overload);
    auto it = mutable_ts.op_regex_cache.find(key);
    if (it == mutable_ts.op_regex_cache.end())
      it = mutable_ts.op_regex_cache.emplace(key, std::regex_search(key, ops_re)).first;
    if (!it->second) return false;
  }
  if (!p.scopes.empty()) {
    auto it = mutable_ts.scope_regex_cache.find(scope);
    if (it == mutable_ts.scope_regex_cache.end())
      it = mutable_ts.scope_regex_cache.emplace(scope, std::regex_search(*scope, scopes_re)).first;
    if (!it->second) return false;
  }
  if (!p.windows.empty()) {
    bool any = false;
    for (const auto& w : p.windows) {
      const auto [wstream, wseq] = window_place(w);
      const uint64_t lo = wseq > w.radius ? wseq - w.radius : 0;
      any = any || (wstream == stream && seq >= lo && seq <= wseq + w.radius);
    }
    if (!any) return false;
  }
  return true;
}

// --- building values ----------------------------------------------------------

namespace {

// The CUDA fingerprint module beside this library (record_cuda.h), loaded at
// the first CUDA tensor; null when there is none (a build without CUDA
// kernels) or it does not load. CUDA tensors are then copied to the host to be
// hashed, which the first one says on stderr.
OpguardRecordCudaChunkHashes cuda_chunk_hashes() {
  static const OpguardRecordCudaChunkHashes fn = []() -> OpguardRecordCudaChunkHashes {
    std::string path = OPGUARD_RECORD_CUDA_LIBRARY;
    Dl_info self{};
    if (dladdr(reinterpret_cast<void*>(&cuda_chunk_hashes), &self) != 0 && self.dli_fname != nullptr) {
      const std::string lib = self.dli_fname;
      const auto slash = lib.rfind('/');
      if (slash != std::string::npos) path = lib.substr(0, slash + 1) + path;
    }
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    void* symbol = handle != nullptr ? dlsym(handle, OPGUARD_RECORD_CUDA_SYMBOL) : nullptr;
    if (symbol == nullptr) {
      const char* why = dlerror();
      std::fprintf(stderr, "opguard: CUDA tensors are copied to the host to be fingerprinted (%s)\n",
                   why != nullptr ? why : "no CUDA fingerprint module");
      return nullptr;
    }
    return reinterpret_cast<OpguardRecordCudaChunkHashes>(symbol);
  }();
  return fn;
}

// The view a task describes (its dtype, shape and strides), over `data`.
kernels::TensorView task_view(const TensorTask& task, const void* data) {
  kernels::TensorView view;
  view.dtype = task.meta.dtype;
  view.sizes = task.sizes();
  view.strides = task.strides();
  view.ndim = task.ndim;
  view.data = data;
  return view;
}

// Fingerprints one deferred tensor (ValueBuilder::defers), on whichever
// thread claimed its job. A tensor whose probe changed while it waited was
// written without the dispatcher (numpy, data_ptr): its hash may mix old and
// new bytes, so it is recorded as not fingerprinted, and the first such
// tensor is reported on stderr.
void run_deferred(void* context, TensorTask& task) {
  RecorderImpl& rec = *static_cast<RecorderImpl*>(context);
  formats::TensorMeta& m = task.meta;
  const kernels::TensorView view = task_view(task, task.deferred_data);
  const bool contiguous = view.is_contiguous();
  try {
    if (task.cacheable && rec.cached_fingerprint(task, contiguous, &view)) return;
    thread_local std::vector<uint64_t> chunks;
    kernels::chunk_hashes(view, &chunks, nullptr);
    if (kernels::quick_probe(view) != task.deferred_probe) {
      m.flags |= formats::kTensorNotFingerprinted;
      rec.written_while_deferred.fetch_add(1, std::memory_order_relaxed);
      static std::atomic<bool> said{false};
      if (!said.exchange(true))
        std::fprintf(stderr,
                     "opguard: a tensor was written without the dispatcher (numpy, data_ptr) while it waited to be "
                     "fingerprinted: it is recorded as not fingerprinted (docs/RECORD.md)\n");
      return;
    }
    m.fingerprint = kernels::combine_chunk_hashes(m.dtype, view.sizes, view.ndim, task.deferred_bytes, chunks.data(),
                                                  chunks.size());
    if (task.cacheable) rec.cache_chunks(task, contiguous, chunks, &view);
  } catch (const std::exception&) {
    m.flags |= formats::kTensorNotFingerprinted;
  }
}

// A thread's spare tensor vector for ValueBuilder (its capacity: no
// allocation per event).
thread_local std::vector<at::Tensor> t_spare_tensors;

struct ValueBuilder {
  ValueBuilder(RecorderImpl& r, PendingEvent& p, bool d, std::vector<Value>& v)
      : rec(r), pending(p), dump(d), values(v), base(p.tasks.size()) {
    tensors.swap(t_spare_tensors);  // empty if another builder on this thread holds it
  }
  ~ValueBuilder() {
    tensors.clear();
    if (tensors.capacity() > t_spare_tensors.capacity()) tensors.swap(t_spare_tensors);
  }
  ValueBuilder(const ValueBuilder&) = delete;
  ValueBuilder& operator=(const ValueBuilder&) = delete;

  RecorderImpl& rec;
  PendingEvent& pending;
  bool dump;
  std::vector<Value>& values;
  // pending.tasks[base + i] is the task of values[i] (the event's tasks are
  // its inputs' then its outputs').
  std::size_t base;
  std::vector<at::Tensor> tensors;  // parallel to values; dropped by settle()
  // Host memory (storages' first bytes) this op writes: an input that shares
  // it is hashed now, not deferred. More than fit: none is deferred.
  static constexpr int kMaxWritten = 4;
  const void* written_bases[kMaxWritten] = {};
  int n_written = 0;
  // Outputs hashed on this thread (a collective: its backend writes them).
  bool outputs_now = false;

  void reserve(std::size_t n) {
    values.reserve(n);
    pending.tasks.reserve(base + n);
    tensors.reserve(n);
  }

  // Appends a value without a tensor.
  void add(Value v) {
    values.push_back(std::move(v));
    pending.tasks.emplace_back();
    tensors.emplace_back();
  }

  void add_tensor(const at::Tensor& t, const std::string& name, bool written) {
    Value v;
    v.name = name;
    v.mutated = written;
    if (!t.defined()) {
      v.kind = ValueKind::kNone;
      v.text = "undefined";
      add(std::move(v));
      return;
    }
    v.kind = ValueKind::kTensor;
    add(std::move(v));
    if (written && rec.hasher && t.has_storage() && t.device().is_cpu()) {
      // The op is about to write this memory: no deferred hash of it (through
      // any view) may be left; this thread runs those not yet started.
      const void* memory = t.storage().data();
      DeferredHashing::instance().wait_clear(memory, run_deferred, &rec);
      if (n_written < kMaxWritten) written_bases[n_written] = memory;
      ++n_written;
    }
    if (written && infers_steps(rec) && rec.backward_seen.load(std::memory_order_relaxed) && is_parameter(t) &&
        t.has_storage() && t.storage().data() != nullptr) {
      // A parameter updated after a backward: an optimizer ran (the steps the
      // recorder infers). Not a FakeTensor of torch.compile's tracing: it
      // holds no bytes.
      rec.parameters_updated.store(true, std::memory_order_relaxed);
    }
    TensorTask& task = pending.tasks.back().emplace();
    formats::TensorMeta& m = task.meta;
    auto dtype = to_dtype(t.scalar_type());
    const bool strided = t.layout() == c10::kStrided;
    bool shaped = true;
    try {
      // Nested tensors refuse sizes() and strides(); so do subclasses that
      // compute their sizes in Python (the jagged NestedTensor raises).
      const int ndim = static_cast<int>(t.dim());
      task.set_dims(t.sizes().data(), strided ? t.strides().data() : nullptr, ndim);
      if (strided) m.storage_offset = t.storage_offset();
    } catch (const std::exception&) {
      shaped = false;  // recorded without a shape
      task.set_dims(nullptr, nullptr, 0);
      m.storage_offset = 0;
    }
    const bool hashable = dtype && shaped && strided && t.has_storage() && !t.is_meta() &&
                          (t.device().is_cpu() || t.device().is_cuda());
    m.dtype = dtype.value_or(DType::kUInt8);
    if (!t.device().is_cpu()) m.device = t.device().str();  // TensorMeta's default is "cpu"
    // A Python number passed where the schema takes a tensor: type promotion
    // treats it as a scalar, and replay must too.
    if (t.unsafeGetTensorImpl()->is_wrapped_number()) m.flags |= formats::kTensorWrappedNumber;
    // Some kernels choose their path by requires_grad (matmul folds a 3-d
    // operand into one mm when the other requires grad; CUDA's attention
    // backends): replay sets it again.
    if (t.requires_grad()) m.flags |= formats::kTensorRequiresGrad | (t.is_leaf() ? 0 : formats::kTensorNonLeaf);
    // The value's tensor stays empty: the writer fills it from the task (writer.cpp).
    if (!hashable) {
      m.flags |= formats::kTensorNotFingerprinted;
      return;
    }
    m.storage_id = rec.storage_id(t, &task.maybe_uninitialized);
    // Tensors made under torch.inference_mode have no version counter
    // (_version() throws): recorded with version 0, hashed every time.
    if (t.is_inference()) {
      m.version = 0;
      task.cacheable = false;
    } else {
      m.version = static_cast<uint32_t>(t._version());
    }
    tensors.back() = t;
  }

  // Bytes of full contents settle() would keep.
  uint64_t dump_bytes() const {
    if (!dump) return 0;
    uint64_t n = 0;
    for (std::size_t i = 0; i < tensors.size(); ++i)
      if (tensors[i].defined()) n += static_cast<uint64_t>(tensors[i].numel()) * tensors[i].element_size();
    return n;
  }

  // Whether tensor i (not copied, not in the cache) can be hashed on the
  // hashing thread (deferred.h): host memory whose free can wait, large
  // enough to be worth it, not written by this op (inputs), made by an op
  // that reads tensors (outputs: a factory's output is often filled next
  // without the dispatcher, by numpy or data_ptr).
  bool defers(std::size_t i, const at::Tensor& t, bool outputs, uint64_t nbytes) const {
    constexpr uint64_t kMinBytes = 16 * 1024;          // below: hashing costs less than deferring
    // Memory whose frees may be held back: at most the queue's bound (the
    // memory the user lets the recorder hold), and 256 MiB.
    const uint64_t max_outstanding = std::min<uint64_t>(256ull << 20, rec.config.queue.max_bytes);
    if (!rec.hasher || nbytes < kMinBytes || !t.device().is_cpu() || !frees_can_wait(t.storage())) return false;
    if (!rec.hasher->spare_core()) return false;  // the program's threads would wait for the hashing thread
    if (DeferredHashing::instance().outstanding_bytes() + nbytes > max_outstanding) return false;
    if (outputs) {
      if (outputs_now) return false;
      for (const Value& v : pending.event.inputs)
        if (v.kind == ValueKind::kTensor || v.kind == ValueKind::kTensorList) return true;
      return false;
    }
    if (values[i].mutated || n_written > kMaxWritten) return false;
    const void* memory = t.storage().data();
    return std::find(written_bases, written_bases + n_written, memory) == written_bases + n_written;
  }

  // Fingerprints every tensor this builder holds, on this thread, copies the
  // full contents when the event is dumped and `keep_data` (the queue took
  // them), and drops the references. Outputs of empty* ops are marked
  // uninitialised; an input the op writes clears that mark.
  void settle(bool keep_data, bool outputs) {
    at::RecordFunctionGuard no_recording(false);
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      at::Tensor t = std::move(tensors[i]);
      if (!t.defined()) continue;
      TensorTask& task = *pending.tasks[base + i];
      formats::TensorMeta& m = task.meta;
      const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
      const bool fresh_buffer = outputs && pending.op->makes_uninitialized;
      if (fresh_buffer) rec.mark_uninitialized(t, pending.op->overload != "out");
      if (fresh_buffer ||
          (task.maybe_uninitialized && rec.still_uninitialized(t, storage, !outputs && values[i].mutated))) {
        // Bits of a buffer made by empty* that nothing wrote since: not data,
        // never fingerprinted.
        m.flags |= formats::kTensorUninitialized;
        continue;
      }
      if (task.numel() > 0 && t.storage().data() == nullptr) {
        // No bytes behind it: a FakeTensor of torch.compile's tracing (its
        // storage is a meta storage, yet the tensor reports a CPU or CUDA
        // device), or any other storage that holds no data. Nothing to hash.
        m.flags |= formats::kTensorNotFingerprinted;
        continue;
      }
      const bool want_data = dump && (m.flags & ~formats::kTensorDescriptionFlags) == 0;
      if (want_data && !keep_data) {
        m.flags |= formats::kTensorDropped;
        rec.dropped.fetch_add(1, std::memory_order_relaxed);
      }
      const bool copy = want_data && keep_data;
      kernels::TensorView view = task_view(task, nullptr);
      const bool contiguous = view.is_contiguous();
      // Host tensors are probed (kernels::probe) before a cached fingerprint
      // is served, on this thread or the hashing thread.
      kernels::TensorView cpu_view = view;
      cpu_view.data = t.device().is_cpu() ? t.const_data_ptr() : nullptr;
      const kernels::TensorView* cpu = cpu_view.data != nullptr ? &cpu_view : nullptr;
      const uint64_t nbytes = static_cast<uint64_t>(task.numel()) * dtype_size(m.dtype);
      if (!copy && defers(i, t, outputs, nbytes)) {
        // Looked up in the fingerprint cache or hashed by run_deferred on the
        // hashing thread (or by a thread that writes this memory first); the
        // job is made when the event is queued. Only a quick probe is taken
        // here: the cache's own probe (every 4 KiB) runs there too.
        task.deferred_data = cpu_view.data;
        task.deferred_base = t.storage().data();
        task.deferred_bytes = nbytes;
        task.deferred_probe = kernels::quick_probe(cpu_view);
        continue;
      }
      if (!copy && task.cacheable && rec.cached_fingerprint(task, contiguous, cpu)) continue;
      try {
        thread_local std::vector<uint64_t> chunks;  // reused: no allocation per tensor
        at::Tensor host;
        const OpguardRecordCudaChunkHashes on_device = t.device().is_cuda() && !copy ? cuda_chunk_hashes() : nullptr;
        if (on_device != nullptr) {
          // Hashed on the device, on torch's current stream: after the
          // kernels that wrote the tensor, before any queued later.
          c10::DeviceGuard device(t.device());
          void* stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(t.device()).native_handle();
          view.data = t.const_data_ptr();
          char error[256] = {};
          if (on_device(&view, stream, &chunks, error, sizeof(error)) != 0) throw Error(error);
        } else {
          host = t.device().is_cpu() ? t : t.cpu();
          view.data = host.const_data_ptr();
          kernels::chunk_hashes(view, &chunks, rec.pool.get());
        }
        m.fingerprint = kernels::combine_chunk_hashes(m.dtype, view.sizes, view.ndim,
                                                      static_cast<std::size_t>(task.numel()) * dtype_size(m.dtype),
                                                      chunks.data(), chunks.size());
        if (copy) {
          task.bytes.resize(static_cast<std::size_t>(task.numel()) * dtype_size(m.dtype));
          kernels::gather_contiguous(view, task.bytes.data());
          task.has_bytes = true;
          pending.queued_bytes += task.bytes.size();
        }
        if (task.cacheable) rec.cache_chunks(task, contiguous, chunks, cpu);
      } catch (const std::exception&) {
        // A tensor we cannot read (freed device memory, an exotic layout):
        // keep the event without this fingerprint.
        m.flags |= formats::kTensorNotFingerprinted;
        std::vector<uint8_t>().swap(task.bytes);
        task.has_bytes = false;
      }
    }
  }

  void add_ivalue(const c10::IValue& iv, const std::string& name, bool written, IntKind int_kind) {
    if (iv.isTensor()) {
      add_tensor(iv.toTensor(), name, written);
      return;
    }
    Value v;
    v.name = name;
    v.mutated = written;
    if (iv.isTensorList() || (iv.isList() && iv.toListRef().size() > 0 &&
                              (iv.toListRef()[0].isTensor() || iv.toListRef()[0].isNone()) &&
                              !iv.isIntList() && !iv.isDoubleList() && !iv.isBoolList())) {
      auto list = iv.toListRef();
      v.kind = ValueKind::kTensorList;
      v.list_len = static_cast<int32_t>(list.size());
      add(std::move(v));
      for (const auto& element : list) {
        if (element.isTensor()) {
          add_tensor(element.toTensor(), name, written);
        } else {
          Value none;
          none.kind = ValueKind::kNone;
          none.name = name;
          add(std::move(none));
        }
      }
      return;
    }
    if (iv.isNone()) {
      v.kind = ValueKind::kNone;
    } else if (iv.isBool()) {
      v.kind = ValueKind::kBool;
      v.text = iv.toBool() ? "true" : "false";
    } else if (iv.isInt()) {
      if (int_kind == IntKind::kScalarType) {
        v.kind = ValueKind::kScalarType;
        auto d = to_dtype(static_cast<c10::ScalarType>(iv.toInt()));
        v.text = d ? std::string(dtype_name(*d)) : std::to_string(iv.toInt());
      } else if (int_kind == IntKind::kLayout) {
        v.kind = ValueKind::kLayout;
        std::ostringstream s;
        s << static_cast<c10::Layout>(iv.toInt());
        v.text = s.str();
      } else if (int_kind == IntKind::kMemoryFormat) {
        v.kind = ValueKind::kMemoryFormat;
        std::ostringstream s;
        s << static_cast<c10::MemoryFormat>(iv.toInt());
        v.text = s.str();
      } else {
        v.kind = ValueKind::kInt;
        v.text = std::to_string(iv.toInt());
      }
    } else if (iv.isDouble()) {
      v.kind = ValueKind::kDouble;
      v.text = hex_double(iv.toDouble());
    } else if (iv.isComplexDouble()) {
      v.kind = ValueKind::kComplex;
      auto c = iv.toComplexDouble();
      v.text = "(" + hex_double(c.real()) + "," + hex_double(c.imag()) + ")";
    } else if (iv.isString()) {
      v.kind = ValueKind::kString;
      v.text = iv.toStringRef();
    } else if (iv.isIntList()) {
      v.kind = ValueKind::kIntList;
      std::string s = "[";
      const auto list = iv.toIntList();
      for (std::size_t i = 0; i < list.size(); ++i) s += (i ? "," : "") + std::to_string(list.get(i));
      v.text = s + "]";
    } else if (iv.isDoubleList()) {
      v.kind = ValueKind::kDoubleList;
      std::string s = "[";
      const auto list = iv.toDoubleList();
      for (std::size_t i = 0; i < list.size(); ++i) s += (i ? "," : "") + hex_double(list.get(i));
      v.text = s + "]";
    } else if (iv.isBoolList()) {
      v.kind = ValueKind::kBoolList;
      std::string s = "[";
      const auto list = iv.toBoolList();
      for (std::size_t i = 0; i < list.size(); ++i) s += std::string(i ? "," : "") + (list.get(i) ? "true" : "false");
      v.text = s + "]";
    } else if (iv.isDevice()) {
      v.kind = ValueKind::kDevice;
      v.text = iv.toDevice().str();
    } else if (iv.isGenerator()) {
      add_generator(iv.toGenerator(), name);
      return;
    } else if (iv.isList() && iv.toListRef().empty()) {
      v.kind = ValueKind::kIntList;  // an empty list of any element type
      v.text = "[]";
    } else if (iv.isList()) {
      // A Scalar[] (a foreach optimizer's per-parameter step sizes): numbers
      // of one type are an int_list or a double_list; mixed or complex ones
      // stay `other`, their values in the text (compared, not replayable).
      bool ints = true, doubles = true;
      std::string s = "[";
      for (const auto& e : iv.toListRef()) {
        ints = ints && e.isInt();
        doubles = doubles && e.isDouble();
        if (s.size() > 1) s += ",";
        if (e.isInt()) s += std::to_string(e.toInt());
        else if (e.isDouble()) s += hex_double(e.toDouble());
        else if (e.isComplexDouble())
          s += "(" + hex_double(e.toComplexDouble().real()) + "," + hex_double(e.toComplexDouble().imag()) + ")";
        else if (e.isBool()) s += e.toBool() ? "true" : "false";
        else s += e.tagKind();
      }
      v.kind = ints ? ValueKind::kIntList : doubles ? ValueKind::kDoubleList : ValueKind::kOther;
      v.text = s + "]";
    } else {
      v.kind = ValueKind::kOther;
      v.text = iv.tagKind();
    }
    add(std::move(v));
  }

  // A random generator's state is an argument of the op that draws from it:
  // recorded as a uint8 tensor (the state bytes), fingerprinted and dumped
  // like any input so that diff compares it and replay can restore it.
  void add_generator(at::Generator gen, const std::string& name) {
    at::Tensor state;
    {
      at::RecordFunctionGuard no_recording(false);
      std::lock_guard<std::mutex> lock(gen.mutex());
      state = gen.get_state();
    }
    add_tensor(state, name.empty() ? "<generator>" : name, false);
    values.back().kind = ValueKind::kGenerator;
    values.back().text = gen.device().str();
  }
};

}  // namespace

namespace {

// Fingerprints an event's deferred tensors, on the hashing thread (those a
// training thread has not claimed: run_deferred).
void settle_deferred(RecorderImpl& rec, PendingEvent& pending) {
  for (auto& task : pending.tasks) {
    if (!task || task->deferred_data == nullptr) continue;
    if (task->job) {
      DeferredHashing::instance().run_or_wait(*task->job, run_deferred, &rec);
    } else {
      run_deferred(&rec, *task);  // settled where it was queued (Hasher::push after finish)
    }
  }
}

}  // namespace

// --- callbacks ---------------------------------------------------------------

namespace {

// Whether an op's inputs include a parameter (a leaf tensor that requires
// grad): the next forward pass has begun. (`loss.item()` or a metric after
// the update, before a first mark_step(), must not start the step.)
bool reads_parameter(c10::ArrayRef<const c10::IValue> inputs) {
  for (const c10::IValue& iv : inputs) {
    if (iv.isTensor() && is_parameter(iv.toTensor())) return true;
    if (iv.isTensorList())
      for (const at::Tensor& t : iv.toTensorList().vec())
        if (is_parameter(t)) return true;
  }
  return false;
}

// The autocast state this thread's op runs under (Event::flags).
uint32_t autocast_flags() {
  formats::Autocast a;
  if (at::autocast::is_autocast_enabled(at::kCPU)) a.cpu = to_dtype(at::autocast::get_autocast_dtype(at::kCPU));
  if (at::autocast::is_autocast_enabled(at::kCUDA)) a.cuda = to_dtype(at::autocast::get_autocast_dtype(at::kCUDA));
  return formats::autocast_flags(a);
}

// The default dtype factory ops without a dtype, and type promotion with a
// Python number (an int tensor * 0.5), give their results (Event::flags).
uint32_t default_dtype_flags() {
  const auto d = to_dtype(c10::get_default_dtype_as_scalartype());
  return d ? formats::default_dtype_flags(*d) : 0u;
}

// The scaled_dot_product_attention backends switched off (Event::flags).
uint32_t sdp_flags() {
  const auto& ctx = at::globalContext();
  return formats::sdp_flags({ctx.userEnabledMathSDP(), ctx.userEnabledFlashSDP(), ctx.userEnabledMemEfficientSDP(),
                             ctx.userEnabledCuDNNSDP()});
}

Phase current_phase(const ThreadState& ts) {
  if (!ts.nodes.empty()) return Phase::kBackward;
  const bool grad = at::GradMode::is_enabled();
  // torch.optim steps run under no_grad; an op with grad mode on inside one
  // is the forward pass of the closure the step calls (LBFGS, PyTorch
  // Lightning's optimizer.step(closure)).
  if (!ts.phases.empty() && !(ts.phases.back().optimizer_step && grad)) return ts.phases.back().phase;
  return grad ? Phase::kForward : Phase::kOther;
}

const std::string* current_scope(RecorderImpl& rec, const ThreadState& ts) {
  // A module entered while the node runs (activation checkpointing recomputes
  // the forward inside the node that unpacks its saved tensors) names its
  // own ops, not the node's scope.
  if (!ts.nodes.empty() && ts.nodes.back().scope != nullptr && ts.scopes.size() <= ts.nodes.back().scope_depth)
    return ts.nodes.back().scope;
  if (!ts.scopes.empty()) return ts.scopes.back();
  static const std::string kEmpty;
  return &kEmpty;
}

void init_thread(RecorderImpl& rec, ThreadState& ts) {
  if (ts.initialised && ts.generation == rec.generation) return;
  const uint64_t tid = static_cast<uint64_t>(syscall(SYS_gettid));
  const bool main_thread = tid == static_cast<uint64_t>(getpid());
  const bool keep_stream = ts.initialised;  // a new recorder generation in the same thread
  ts = ThreadState();
  ts.initialised = true;
  ts.generation = rec.generation;
  ts.tid = tid;
  ts.stream = main_thread ? 0 : rec.next_stream.fetch_add(1);
  (void)keep_stream;
}

// The one message a failed recording prints. The manifest is rewritten
// (recording_failed, failure, failed_step) into the space set aside at open;
// under --strict the process then exits with kStrictExitCode.
void fail_once(RecorderImpl& rec, const std::string& message, int64_t step) {
  if (rec.failed.exchange(true)) return;
  // One line: HDF5's messages carry newlines ("time = ...\n, filename = ...").
  std::string what = message;
  std::replace(what.begin(), what.end(), '\n', ' ');
  const std::string at_step = step >= 0 ? " at step " + std::to_string(step) : "";
  if (rec.config.strict) {
    std::fprintf(stderr, "opguard: recording failed%s: %s; --strict was given: aborting the run (exit %d)\n",
                 at_step.c_str(), what.c_str(), kStrictExitCode);
  } else {
    std::fprintf(stderr,
                 "opguard: recording stopped%s: %s; the recording is marked incomplete and the training "
                 "continues unrecorded\n",
                 at_step.c_str(), what.c_str());
  }
  std::fflush(stderr);
  rec.release_space();
  try {
    std::lock_guard<std::mutex> lock(rec.manifest_mutex);
    rec.failure = what;
    rec.failed_step = step;
    if (rec.opened_manifest) rec.write_manifest(RecorderImpl::ManifestState::kFailed);
  } catch (const std::exception& e) {
    // The manifest written at open still says clean_exit 0, but not that the
    // recording failed: say so, once (a reader sees the torn or missing steps).
    std::fprintf(stderr, "opguard: the manifest could not record the failure: %s\n", e.what());
    std::fflush(stderr);
  }
  if (rec.config.strict) std::_Exit(kStrictExitCode);
}

// Applies the queue policy to `bytes` of full contents about to be kept:
// under wait, blocks until the writer has room; under drop, says whether
// they fit (the fingerprints are taken either way).
bool queue_takes(RecorderImpl& rec, uint64_t bytes) {
  if (bytes == 0) return true;
  if (rec.config.queue.policy == QueueFullPolicy::kWait) {
    rec.writer->wait_for_room(bytes);
    return true;
  }
  return rec.writer->has_room(bytes);
}

// Switches RecordFunction back on for this thread when it goes out of scope,
// unless `on` was cleared (an event hides its nested ops from its start
// callback to the end of its end callback).
struct RecordFunctionBackOn {
  bool on;
  ~RecordFunctionBackOn() {
    if (on) at::enableRecordFunction(true);
  }
};

// The running recorder, if this thread records: not in a forked child, not
// on the writer thread.
RecorderImpl* recorder_for_this_thread() {
  if (g_in_forked_child.load(std::memory_order_relaxed) || is_writer_thread()) return nullptr;
  RecorderImpl* recp = g_recorder;
  if (recp == nullptr || !recp->active.load(std::memory_order_acquire)) return nullptr;
  return recp;
}

// Counts an event whose kernel is about to run in g_kernels_in_flight (on_end
// takes it off): the last step of on_start, which cannot throw after it. An
// op that starts inside a parallel region (a program's own at::parallel_for)
// is not counted: its region's workers run the program's ops.
void enter_kernel(Context& ctx) {
  if (!ctx.hides_nested || parallel_region_thread() >= 0) return;
  ctx.in_flight = true;
  g_kernels_in_flight.fetch_add(1, std::memory_order_acq_rel);
}

// The thread torch.compile is compiling on (0: none), between its compile
// callbacks (python/opguard/hooks.py, through opguard_compile_begin/_end).
// torch runs them around one compilation at a time, process-wide.
std::atomic<uint64_t> g_compiling_thread{0};

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  RecorderImpl* recp = recorder_for_this_thread();
  if (recp == nullptr) return nullptr;
  RecorderImpl& rec = *recp;
  ThreadState& ts = t_state;
  init_thread(rec, ts);

  auto op_name = fn.operator_name();
  if (!op_name) {
    // A range, not an operator: scopes, phases, steps, autograd nodes.
    const char* name = fn.name();
    if (name == nullptr) return nullptr;
    if (fn.scope() == at::RecordScope::USER_SCOPE) {
      if (starts_with(name, kScopeRangePrefix)) {
        std::string path = name + std::strlen(kScopeRangePrefix);
        if (!path.empty() && path[0] == '=') {
          path.erase(0, 1);  // an absolute path (the Python hooks name modules in full)
        } else if (!ts.scopes.empty() && !ts.scopes.back()->empty()) {
          path = *ts.scopes.back() + "." + path;
        }
        ts.scopes.push_back(rec.intern_scope(path));
        return std::make_unique<Context>(Context::kScope);
      }
      if (starts_with(name, kPhaseRangePrefix)) {
        auto phase = formats::phase_from_name(name + std::strlen(kPhaseRangePrefix));
        ts.phases.push_back({phase.value_or(Phase::kOther), false});
        return std::make_unique<Context>(Context::kPhase);
      }
      if (std::strcmp(name, kStepRangeName) == 0) {
        Recorder::step();
        return nullptr;
      }
      if (starts_with(name, kOptimizerStepPrefix) || starts_with(name, kOptimizerZeroGradPrefix)) {
        ts.phases.push_back({Phase::kOptimizer, starts_with(name, kOptimizerStepPrefix)});
        auto ctx = std::make_unique<Context>(Context::kOptimizer);
        // An optimizer stepped inside backward (a per-parameter optimizer in
        // a post-accumulate-grad hook) ends no step: the inferred steps do.
        if (starts_with(name, kOptimizerStepPrefix) && ts.nodes.empty()) rec.optimizer_ranges.store(true);
        return ctx;
      }
      return nullptr;
    }
    const bool node_range = fn.scope() == at::RecordScope::BACKWARD_FUNCTION || starts_with(name, kNodePrefix);
    if (node_range) {
      NodeFrame frame;
      frame.node = starts_with(name, kNodePrefix) ? name + std::strlen(kNodePrefix) : name;
      frame.forward_thread = fn.forwardThreadId();
      if (frame.forward_thread == 0 && !ts.nodes.empty()) frame.forward_thread = ts.nodes.back().forward_thread;
      if (fn.seqNr() >= 0) {
        const uint64_t key = (fn.forwardThreadId() << 40) ^ static_cast<uint64_t>(fn.seqNr());
        std::lock_guard<std::mutex> lock(rec.node_mutex);
        auto it = rec.node_scopes.find(key);
        if (it != rec.node_scopes.end()) frame.scope = it->second;
      }
      if (frame.scope != nullptr && !ts.nodes.empty() && ts.nodes.back().node == frame.node) {
        // The engine's "evaluate_function" range around this node (it has no
        // sequence number): the ops it runs after the node itself (the
        // sum_to of validate_outputs) belong to the node's scope too.
        ts.nodes.back().scope = frame.scope;
      }
      if (frame.scope == nullptr && !ts.nodes.empty()) frame.scope = ts.nodes.back().scope;
      frame.scope_depth = ts.scopes.size();
      ts.nodes.push_back(std::move(frame));
      return std::make_unique<Context>(Context::kNode);
    }
    if (fn.scope() == at::RecordScope::FUNCTION && fn.seqNr() >= 0 && ts.nodes.empty() &&
        at::GradMode::is_enabled()) {
      // A Python autograd.Function's apply (its range: the class name and a
      // sequence number), called with grad mode on: its forward runs with
      // grad mode off, yet it is the forward pass of a differentiable op
      // (torch.compile's CompiledFunction, a model's own Function), not
      // `other`.
      ts.phases.push_back({Phase::kForward, false});
      return std::make_unique<Context>(Context::kPhase);
    }
    return nullptr;
  }

  // An operator.
  const int depth = ts.op_depth++;
  if (depth > 0 && fn.seqNr() >= 0 && ts.nodes.empty()) {
    // Remember the module scope of the autograd node this op creates, so
    // that its backward ops carry the same scope. (A nested op seen here runs
    // inside an op that is not an event; an event's nodes are remembered in
    // on_end, from the sequence numbers it consumed.)
    const auto seq = static_cast<uint64_t>(fn.seqNr());
    rec.remember_node_scopes(fn.threadId(), seq, seq + 1, current_scope(rec, ts));
  }
  if (depth > 0) return nullptr;  // nested inside another op: not an event
  // The compiler's ops are not the run's computation, and a run that loads the
  // compiled code from inductor's cache has none of them: not events. Those
  // of torch.compile compiling on this thread (opguard_compile_begin), and
  // ops on FakeTensors under a FakeTensorMode (its tracing; no bytes).
  if (g_compiling_thread.load(std::memory_order_relaxed) == ts.tid) return nullptr;
  if (c10::impl::dispatch_mode_enabled() &&
      c10::impl::TorchDispatchModeTLS::get_mode(c10::impl::TorchDispatchModeKey::FAKE).has_value())
    return nullptr;
  if (g_kernels_in_flight.load(std::memory_order_acquire) > 0 && parallel_region_thread() > 0) {
    // Run by a kernel on one of its workers: part of that kernel's op (a
    // program's own at::parallel_for, outside any op, is recorded).
    rec.ops_on_kernel_workers.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  if (!rec.opened.load(std::memory_order_acquire)) {
    std::call_once(rec.open_once, [&] { rec.open_recording(); });
  }
  if (rec.failed.load(std::memory_order_relaxed) || rec.refused.load() || !rec.writer) return nullptr;

  const OpInfo* op = rec.op_info(fn, *op_name);
  if (op->ignored) return nullptr;

  auto ctx = std::make_unique<Context>(Context::kEvent);
  // The ops this op calls are not events: RecordFunction is off on this
  // thread from here to the end of on_end (settle's own guards then cost
  // nothing: each switch rebuilds libtorch's callback lists). The nodes those
  // ops create get their scope from the sequence numbers in on_end. Other
  // observers (the profiler) do not see the nested ops of a recorded program
  // either. An async range may end on another thread: left alone.
  if (!fn.isAsync()) {
    at::enableRecordFunction(false);
    ctx->hides_nested = true;
  }
  // Should anything below throw, on_end never sees this context: switch back.
  RecordFunctionBackOn restore{ctx->hides_nested};
  if (rec.config.test_observe_only) {
    restore.on = false;  // on_end switches it back, and records nothing without a pending event
    enter_kernel(*ctx);
    return ctx;
  }
  ctx->pending = rec.writer->take_spare();
  if (ts.nodes.empty()) {
    // Before anything can take a sequence number: the op's own node has the
    // number the dispatcher gave fn.seqNr().
    ctx->forward_nodes = true;
    ctx->seq_begin = at::sequence_number::peek();
  }
  PendingEvent& pending = *ctx->pending;
  formats::Event& ev = pending.event;
  const Phase phase = current_phase(ts);
  // At the first event that is not an optimizer op: a program with two
  // optimizers (one per parameter group) steps both, one step; zero_grad
  // after the step stays in it.
  if (phase != Phase::kOptimizer && rec.step_end_pending.load(std::memory_order_relaxed) &&
      rec.step_end_pending.exchange(false))
    end_step();
  if (infers_steps(rec)) {
    // Steps of programs that neither call mark_step() nor run PyTorch's
    // Optimizer.step: a forward op after a backward and an optimizer update
    // (not after a micro-batch's backward alone) starts a new step.
    if (phase == Phase::kBackward) {
      const bool known = !ts.nodes.empty() && ts.nodes.back().forward_thread != 0;
      rec.training_thread.store(known ? ts.nodes.back().forward_thread : fn.threadId(), std::memory_order_relaxed);
      rec.backward_seen.store(true, std::memory_order_relaxed);
    } else if (phase == Phase::kForward && rec.parameters_updated.load(std::memory_order_relaxed) &&
               rec.training_thread.load(std::memory_order_relaxed) == fn.threadId() && reads_parameter(fn.inputs())) {
      end_step();
    }
  }
  ev.stream = ts.stream;
  ev.seq = ts.next_seq++;
  ev.id = formats::make_event_id(ev.stream, ev.seq);
  if (rec.window_closed) {
    const auto& windows = rec.config.policy.windows;
    for (std::size_t w = 0; w < windows.size(); ++w) {
      const auto [wstream, wseq] = window_place(windows[w]);
      if (wstream == ev.stream && ev.seq > wseq + windows[w].radius)
        rec.window_closed[w].store(true, std::memory_order_relaxed);
    }
  }
  ev.thread = ts.tid;
  ev.phase = phase;
  ev.flags = autocast_flags() | default_dtype_flags() | sdp_flags() |
             (at::GradMode::is_enabled() ? formats::kEventGradMode : 0u);
  ev.knobs = current_knobs();
  if (rec.hasher) rec.hasher->note_program_threads(formats::knob_threads(*ev.knobs));
  ev.step = rec.step.load();
  if (!ts.nodes.empty()) ev.node = ts.nodes.back().node;
  pending.op = op;
  pending.scope = current_scope(rec, ts);
  const bool dump = rec.wants_dump(ts, *op, pending.scope, ev.stream, ev.seq, ev.step);
  ctx->dump = dump;

  ValueBuilder inputs(rec, pending, dump, ev.inputs);
  const auto args = fn.inputs();
  // The outputs' slots too: the task vector is allocated once per event.
  pending.tasks.reserve(args.size() + (op->random ? 1 : 0) + op->return_names.size());
  inputs.reserve(args.size() + (op->random ? 1 : 0));
  for (std::size_t i = 0; i < args.size(); ++i) {
    const bool named = i < op->arg_names.size();
    inputs.add_ivalue(args[i], named ? op->arg_names[i] : "", named && op->arg_written[i],
                      named ? op->arg_int_kind[i] : IntKind::kPlain);
    if (named && op->arg_written_unreturned[i]) ctx->written.emplace_back(&op->arg_names[i], args[i]);
  }
  if (op->random) {
    bool has_generator_arg = false;
    for (const auto& v : ev.inputs) has_generator_arg = has_generator_arg || v.kind == ValueKind::kGenerator;
    if (!has_generator_arg) inputs.add_generator(at::detail::getDefaultCPUGenerator(), "<default_generator>");
  }
  // Inputs are hashed now, before the op can overwrite any of them.
  inputs.settle(queue_takes(rec, inputs.dump_bytes()), false);
  ev.t_start_ns = now_ns();
  restore.on = false;  // on_end switches it back
  enter_kernel(*ctx);
  return ctx;
}

// A copy from a CUDA tensor into host memory with non_blocking=True returns
// before the device has written the host bytes: they are only there once the
// stream that runs the copy is done. Before the host outputs of an op with a
// CUDA input are hashed, that device's current stream is waited for (what the
// program itself must do before it reads them; a blocking copy has already).
void wait_for_device_to_host(const PendingEvent& pending, const std::vector<at::Tensor>& outputs) {
  bool host_output = false;
  for (const at::Tensor& t : outputs) host_output = host_output || (t.defined() && t.device().is_cpu());
  if (!host_output) return;
  for (std::size_t i = 0; i < pending.event.inputs.size() && i < pending.tasks.size(); ++i) {
    const auto& task = pending.tasks[i];
    if (!task || task->meta.device.rfind("cuda", 0) != 0) continue;
    try {
      const c10::Device device(task->meta.device);
      const auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
      impl->synchronizeStream(impl->getStream(device));
    } catch (const std::exception&) {
      // No CUDA runtime to ask: hash what is there.
    }
    return;
  }
}

void on_end(const at::RecordFunction& fn, at::ObserverContext* raw) {
  auto* ctx = static_cast<Context*>(raw);
  // RecordFunction comes back on when this returns (however it returns),
  // after the outputs are hashed.
  RecordFunctionBackOn reenable{ctx != nullptr && ctx->hides_nested};
  if (ctx != nullptr && ctx->in_flight) g_kernels_in_flight.fetch_sub(1, std::memory_order_acq_rel);
  if (g_in_forked_child.load(std::memory_order_relaxed) || is_writer_thread()) return;
  RecorderImpl* recp = g_recorder;
  if (recp == nullptr) return;
  RecorderImpl& rec = *recp;
  ThreadState& ts = t_state;
  if (!ts.initialised || ts.generation != rec.generation) return;
  if (ctx == nullptr) {
    if (fn.operator_name() && ts.op_depth > 0) --ts.op_depth;
    return;
  }
  switch (ctx->kind) {
    case Context::kScope:
      if (!ts.scopes.empty()) ts.scopes.pop_back();
      return;
    case Context::kPhase:
      if (!ts.phases.empty()) ts.phases.pop_back();
      return;
    case Context::kOptimizer:
      if (!ts.phases.empty()) ts.phases.pop_back();
      if (std::strncmp(fn.name(), kOptimizerStepPrefix, std::strlen(kOptimizerStepPrefix)) == 0 &&
          !rec.explicit_steps.load() && ts.phases.empty() && ts.nodes.empty())
        rec.step_end_pending.store(true);
      return;
    case Context::kNode:
      if (!ts.nodes.empty()) ts.nodes.pop_back();
      return;
    case Context::kEvent:
      break;
  }
  if (ts.op_depth > 0) --ts.op_depth;
  if (ctx->forward_nodes && ctx->pending) {
    const uint64_t seq_end = at::sequence_number::peek();
    if (seq_end > ctx->seq_begin) rec.remember_node_scopes(fn.threadId(), ctx->seq_begin, seq_end, ctx->pending->scope);
  }
  if (!ctx->pending || !rec.active.load() || rec.failed.load() || !rec.writer) return;
  PendingEvent& pending = *ctx->pending;
  formats::Event& ev = pending.event;
  ev.t_end_ns = now_ns();
  const OpInfo& op = *pending.op;
  const bool dump = ctx->dump;
  ValueBuilder outputs(rec, pending, dump, ev.outputs);
  const auto& outs = fn.outputs();
  if (is_collective(fn.name())) {
    for (const at::Tensor& t : wait_for_collective(outs)) rec.forget_fingerprints(t);
    outputs.outputs_now = true;
  }
  outputs.reserve(outs.size());
  for (std::size_t i = 0; i < outs.size(); ++i) {
    outputs.add_ivalue(outs[i], i < op.return_names.size() ? op.return_names[i] : "", false,
                       IntKind::kPlain);
  }
  for (const auto& [name, iv] : ctx->written) {
    // What the op wrote and did not return, as it left it: named like the
    // argument, marked written.
    const std::size_t first = ev.outputs.size();
    outputs.add_ivalue(iv, *name, false, IntKind::kPlain);
    for (std::size_t k = first; k < ev.outputs.size(); ++k) ev.outputs[k].mutated = true;
  }
  ctx->written.clear();
  wait_for_device_to_host(pending, outputs.tensors);
  outputs.settle(queue_takes(rec, outputs.dump_bytes() + pending.queued_bytes), true);
  if (pending.queued_bytes > 0) {
    const uint64_t total = rec.dumped_bytes.fetch_add(pending.queued_bytes) + pending.queued_bytes;
    if (rec.config.policy.budget_bytes > 0 && total > rec.config.policy.budget_bytes)
      rec.budget_exhausted.store(true);
  }
  ev.step = rec.step.load();
  rec.events.fetch_add(1, std::memory_order_relaxed);
  if (rec.hasher) {
    rec.hasher->enqueue(std::move(ctx->pending));
  } else {
    rec.writer->enqueue(std::move(ctx->pending));
  }
}

// --- SIGTERM and SIGINT: finish the recording, then die of it ---------------
// A cluster ends a job with SIGTERM (then SIGKILL after a grace period), a
// user with Ctrl-C, and their default action killed the process with the
// writer steps behind: the recording lost every queued step. Where the program
// has no handler of its own for the signal, the recorder's writes a byte to a
// pipe; a thread of the recorder stops the recording (the queue drains, the
// manifest says where it ended), restores the default action and raises the
// signal again. Training goes on meanwhile. A program that installs its own
// handler replaces this one, and ends through exit() and the recorder's exit
// handler. SIGTERM is taken when the recording starts; SIGINT only at the
// first event: a preloaded recorder starts before Python initialises, and
// Python installs its KeyboardInterrupt handler only where SIGINT still has
// the default action (Python's Ctrl-C goes through sitecustomize's exit
// handler instead, opguard_stop_recording below).
int g_term_pipe[2] = {-1, -1};
std::atomic<int> g_term_signal{0};

void on_term_signal(int sig) {
  const int saved = errno;
  g_term_signal.store(sig);
  const char byte = 1;
  if (::write(g_term_pipe[1], &byte, 1) < 0) {
    // Nothing async-signal-safe to do: the default action is gone.
  }
  errno = saved;
}

// The pipe and the thread that reads it, once per process.
bool start_signal_thread() {
  static const bool started = [] {
    if (::pipe2(g_term_pipe, O_CLOEXEC) != 0) return false;
    std::thread([] {
      char byte = 0;
      while (::read(g_term_pipe[0], &byte, 1) < 0 && errno == EINTR) {
      }
      const int sig = g_term_signal.load();
      try {
        if (RecorderImpl* rec = g_recorder) {
          std::lock_guard<std::mutex> lock(rec->manifest_mutex);
          if (sig == 0) rec->manifest.info["stopped_after_windows"] = "1";
          else rec->manifest.info["ended_by_signal"] = sig == SIGINT ? "SIGINT" : "SIGTERM";
        }
        stop_recording();
      } catch (...) {
        // The signal's action below is what matters now.
      }
      if (sig == 0) std::_Exit(0);  // --stop-after-windows: the windows are written
      ::signal(sig, SIG_DFL);
      ::kill(::getpid(), sig);
    }).detach();
    return true;
  }();
  return started;
}

// Takes `sig` where it still has its default action (not where the program
// handles or ignores it: a job started in the background ignores SIGINT).
void take_signal(int sig) {
  struct sigaction old {};
  if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler != SIG_DFL || (old.sa_flags & SA_SIGINFO)) return;
  if (!start_signal_thread()) return;
  struct sigaction act {};
  act.sa_handler = on_term_signal;
  ::sigemptyset(&act.sa_mask);
  act.sa_flags = SA_RESTART;
  ::sigaction(sig, &act, nullptr);
}

void on_fork_child() {
  g_in_forked_child.store(true);
  DeferredHashing::instance().forked();
  // The child has no thread reading the pipe: SIGTERM and SIGINT must kill it
  // as before (a DataLoader's workers are ended so).
  for (int sig : {SIGTERM, SIGINT}) {
    struct sigaction now {};
    if (::sigaction(sig, nullptr, &now) == 0 && now.sa_handler == on_term_signal) ::signal(sig, SIG_DFL);
  }
}

}  // namespace

// --- recording directory and manifest ------------------------------------------

void RecorderImpl::open_recording() {
  try {
    if (::mkdir(config.out_dir.c_str(), 0777) != 0 && errno != EEXIST)
      throw IoError("cannot create the recording directory " + config.out_dir + ": " + std::strerror(errno));
    if (::mkdir(rank_dir.c_str(), 0777) != 0 && errno != EEXIST)
      throw IoError("cannot create " + rank_dir + ": " + std::strerror(errno));
    // One process per rank directory: a launcher (torchrun) or a second
    // program in the same command line must not interleave with the rank.
    const std::string lock_path = rank_dir + "/owner.pid";
    int fd = ::open(lock_path.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
    if (fd < 0) {
      refused.store(true);
      std::fprintf(stderr,
                   "opguard: %s is already recorded by another process; process %d is not recorded\n",
                   rank_dir.c_str(), static_cast<int>(getpid()));
      opened.store(true);
      return;
    }
    const std::string pid = formats::owner_line();
    if (::write(fd, pid.data(), pid.size()) < 0) {
      // The lock file's content is informational only.
    }
    ::close(fd);
    collect_run_info(manifest);
    {
      std::lock_guard<std::mutex> lock(manifest_mutex);
      write_manifest(ManifestState::kOpen);
      opened_manifest = true;
    }
    take_signal(SIGINT);
    reserve_space();
    // Registered now, not when the library loads: torch's context and HDF5
    // (which closes every file in its own exit handler) are initialised by
    // here, and exit handlers run in reverse order, so the last step is
    // written before either goes away.
    static std::once_flag exit_once;
    std::call_once(exit_once, [] { std::atexit([] { stop_recording(); }); });
    pool = std::make_unique<kernels::HashPool>(config.hash_threads);
    writer = std::make_unique<Writer>(rank_dir, rank, step.load(), config,
                                      [this](const std::string& m, int64_t s) { fail_once(*this, m, s); });
    if (config.defer_hashing)
      hasher = std::make_unique<Hasher>(*writer, [this](PendingEvent& p) { settle_deferred(*this, p); },
                                        config.test_hasher_delay_us);
  } catch (const std::exception& e) {
    fail_once(*this, e.what(), -1);
  }
  opened.store(true, std::memory_order_release);
}

namespace {

// The process's peak resident set (VmHWM), in bytes; 0 if unknown.
uint64_t peak_rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  uint64_t kib = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "VmHWM: %" SCNu64 " kB", &kib) == 1) break;
  }
  std::fclose(f);
  return kib * 1024;
}

}  // namespace

void RecorderImpl::reserve_space() {
  struct stat st {};
  const uint64_t manifest_bytes =
      ::stat((rank_dir + "/manifest.h5").c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  // A rewrite needs one manifest's size while the old one still exists.
  const uint64_t bytes = std::max<uint64_t>(uint64_t{256} << 10, 4 * manifest_bytes);
  reserve_path = rank_dir + "/space.reserve";
  int fd = ::open(reserve_path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  if (fd < 0) throw IoError("cannot create " + reserve_path + ": " + std::strerror(errno));
  const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  ::close(fd);
  if (err != 0) {
    ::unlink(reserve_path.c_str());
    throw IoError("cannot set aside " + std::to_string(bytes) + " bytes in " + reserve_path + ": " +
                  std::strerror(err));
  }
  reserved.store(true);
}

void RecorderImpl::release_space() {
  if (reserved.exchange(false)) ::unlink(reserve_path.c_str());
}

void RecorderImpl::write_manifest(ManifestState state) {
  const bool final_write = state == ManifestState::kFinal;
  manifest.rank = rank;
  manifest.world_size = world_size;
  manifest.info["sampling_policy"] = config.policy.to_string();
  manifest.info["queue"] = config.queue.to_string();
  manifest.info["strict"] = config.strict ? "1" : "0";
  // From the config, not from `hasher`: the manifest is first written before
  // the hashing thread exists, and a killed run keeps that first write.
  manifest.info["fingerprints"] = config.defer_hashing ? "deferred" : "training_thread";
  if (config.test_observe_only) manifest.info["observe_only"] = "1";
  if (!config.command.empty()) manifest.info["record_command"] = config.command;
  if (!config.declared_knobs.empty()) manifest.info["declared_knobs"] = config.declared_knobs;
  if (!failure.empty()) {
    manifest.info["failure"] = failure;
    manifest.info["failed_step"] = std::to_string(failed_step);
  }
  if (final_write) {
    collect_end_info(manifest);
    manifest.info["end_time"] = iso_time_now();
    manifest.info["clean_exit"] = failed.load() ? "0" : "1";
    manifest.info["recording_failed"] = failed.load() ? "1" : "0";
    manifest.info["events"] = std::to_string(writer ? writer->events_written() : 0);
    manifest.info["dropped_tensors"] = std::to_string(dropped.load());
    manifest.info["written_while_deferred"] = std::to_string(written_while_deferred.load());
    manifest.info["ops_on_kernel_workers"] = std::to_string(ops_on_kernel_workers.load());
    manifest.info["peak_queued_bytes"] = std::to_string(writer ? writer->peak_queued_bytes() : 0);
    manifest.info["bytes_written"] = std::to_string(writer ? writer->bytes_written() : 0);
    manifest.info["dump_budget_exhausted"] = budget_exhausted.load() ? "1" : "0";
    manifest.info["steps"] = std::to_string(step.load() + 1);
    manifest.info["peak_rss_bytes"] = std::to_string(peak_rss_bytes());
  } else if (state == ManifestState::kFailed) {
    manifest.info["clean_exit"] = "0";
    manifest.info["recording_failed"] = "1";
    manifest.info["dropped_tensors"] = std::to_string(dropped.load());
    manifest.info["peak_queued_bytes"] = std::to_string(writer ? writer->peak_queued_bytes() : 0);
  } else {
    manifest.info["start_time"] = start_time;
    manifest.info["clean_exit"] = "0";
  }
  formats::write_manifest(rank_dir + "/manifest.h5", manifest);
}

// --- public API --------------------------------------------------------------

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  return (end && *end == '\0' && n >= 0) ? static_cast<int>(n) : fallback;
}

}  // namespace

void start_recording(const RecorderConfig& config) {
  std::lock_guard<std::mutex> lock(g_lifecycle_mutex);
  if (g_recorder != nullptr && g_recorder->active.load())
    throw UsageError("opguard is already recording into " + g_recorder->config.out_dir +
                     ": stop it first (or do not call start under `opguard record`)");
  if (config.out_dir.empty()) throw UsageError("the recording needs an output directory");
  auto* rec = new RecorderImpl();
  rec->config = config;
  if (config.stop_after_windows && !config.policy.windows.empty())
    rec->window_closed = std::make_unique<std::atomic<bool>[]>(config.policy.windows.size());
  rec->ops_re = std::regex(config.policy.ops.empty() ? "." : config.policy.ops, std::regex::ECMAScript);
  rec->scopes_re = std::regex(config.policy.scopes.empty() ? "." : config.policy.scopes, std::regex::ECMAScript);
  rec->rank = env_int("RANK", env_int("LOCAL_RANK", 0));
  rec->world_size = env_int("WORLD_SIZE", 1);
  rec->rank_dir = formats::rank_dir(config.out_dir, rec->rank);
  rec->generation = ++g_generation;
  rec->start_ns = now_ns();
  rec->start_time = iso_time_now();
  static std::once_flag fork_once;
  std::call_once(fork_once, [] { pthread_atfork(nullptr, nullptr, on_fork_child); });
  static std::once_flag term_once;
  std::call_once(term_once, [] { take_signal(SIGTERM); });
  // A previous recorder of this process stays allocated (never freed): a
  // callback already running on another thread may still read it.
  if (config.defer_hashing) install_deferring_allocator();
  g_recorder = rec;
  rec->active.store(true, std::memory_order_release);
  rec->handle = at::addGlobalCallback(
      at::RecordFunctionCallback(on_start, on_end)
          .needsInputs(true)
          .needsOutputs(true)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                   at::RecordScope::USER_SCOPE}));
}

void stop_recording() {
  std::lock_guard<std::mutex> lock(g_lifecycle_mutex);
  RecorderImpl* rec = g_recorder;
  if (rec == nullptr || !rec->active.load()) return;
  if (g_in_forked_child.load()) return;
  at::removeCallback(rec->handle);
  rec->active.store(false);
  if (rec->hasher) rec->hasher->finish();  // hands everything on to the writer
  if (rec->writer) {
    rec->writer->finish();
    if (rec->writer->failed()) rec->failed.store(true);
  }
  if (rec->opened.load() && !rec->refused.load() && rec->writer) {
    // After a failed write the space set aside at open is already given back.
    if (!rec->failed.load()) rec->release_space();
    try {
      std::lock_guard<std::mutex> manifest_lock(rec->manifest_mutex);
      rec->write_manifest(RecorderImpl::ManifestState::kFinal);
    } catch (const std::exception& e) {
      // A failed recording has said so once already (fail_once).
      if (!rec->failed.load())
        std::fprintf(stderr, "opguard: could not write the final manifest: %s\n", e.what());
    }
  }
}

// Module scopes pushed and popped directly, not through a RecordFunction range
// (see opguard_push_scope below). Returns the recorder generation the scope
// was pushed in, 0 when nothing was pushed.
uint64_t push_scope(const char* path) noexcept {
  RecorderImpl* recp = path != nullptr ? recorder_for_this_thread() : nullptr;
  if (recp == nullptr) return 0;
  try {
    ThreadState& ts = t_state;
    init_thread(*recp, ts);
    ts.scopes.push_back(recp->intern_scope(path));
    return ts.generation;
  } catch (const std::exception&) {
    return 0;  // out of memory: the scope is lost, the run goes on
  }
}

void pop_scope(uint64_t token) noexcept {
  if (token == 0) return;
  ThreadState& ts = t_state;
  // A scope pushed under an earlier recorder is gone with that recorder's state.
  if (!ts.initialised || ts.generation != token || ts.scopes.empty()) return;
  ts.scopes.pop_back();
}

}  // namespace opguard::record

// The C entry points of push_scope / pop_scope, for python/opguard/hooks.py
// (through ctypes): a torch.autograd.profiler.record_function range costs two
// dispatcher calls and a TorchScript object per module call, 6.6 us; these
// cost 0.35 us (both timed without a recorder running). The effect is that of
// an "opguard::scope/=<path>" range: `path` is the module's full path; scopes
// nest per thread; pop takes what push returned.
extern "C" __attribute__((visibility("default"))) uint64_t opguard_push_scope(const char* path) noexcept {
  return opguard::record::push_scope(path);
}

extern "C" __attribute__((visibility("default"))) void opguard_pop_scope(uint64_t token) noexcept {
  opguard::record::pop_scope(token);
}

// Stops the recording (as at exit), for python/boot/sitecustomize.py's
// Python exit handler: a Python program that dies of an uncaught
// KeyboardInterrupt re-raises SIGINT after its own exit handlers, and C's
// exit handlers, where the recording is otherwise finished, never run.
extern "C" __attribute__((visibility("default"))) void opguard_stop_recording() noexcept {
  try {
    opguard::record::stop_recording();
  } catch (...) {
    // The recorder never takes the run down.
  }
}

// torch.compile starts and ends compiling (torch._dynamo's compile callbacks:
// a traced frame, a backward compiled at its first run): the operators the
// calling thread runs in between are not events. End may come from another
// thread.
extern "C" __attribute__((visibility("default"))) void opguard_compile_begin() noexcept {
  opguard::record::g_compiling_thread.store(static_cast<uint64_t>(syscall(SYS_gettid)), std::memory_order_relaxed);
}

extern "C" __attribute__((visibility("default"))) void opguard_compile_end() noexcept {
  opguard::record::g_compiling_thread.store(0, std::memory_order_relaxed);
}

namespace opguard {

using record::g_recorder;
using record::RecorderImpl;

void Recorder::start(const RecorderOptions& options) {
  record::RecorderConfig config;
  config.out_dir = options.out_dir;
  config.policy = record::parse_policy(options.policy);
  config.queue = record::parse_queue(options.queue);
  config.strict = options.strict;
  config.hash_threads = options.hash_threads;
  config.defer_hashing = options.defer_hashing;
  config.test_writer_delay_us = record::test_writer_delay_from_env();
  config.test_hasher_delay_us = record::test_hasher_delay_from_env();
  config.test_observe_only = record::test_observe_only_from_env();
  // The program's own start, unlike `opguard record`'s preload (whose
  // directory the CLI made empty, and where a second process of the command
  // line is refused at its first event): a directory that holds this rank's
  // recording already is an error the program sees, not a stderr line.
  const std::string owner =
      formats::rank_dir(options.out_dir, record::env_int("RANK", record::env_int("LOCAL_RANK", 0))) + "/owner.pid";
  if (!options.out_dir.empty() && ::access(owner.c_str(), F_OK) == 0)
    throw IoError(options.out_dir + " already holds a recording of this rank: choose a new directory");
  record::start_recording(config);
}

void Recorder::stop() { record::stop_recording(); }

bool Recorder::active() {
  RecorderImpl* rec = g_recorder;
  return rec != nullptr && rec->active.load();
}

// Ends the current step: the program's call (Recorder::step, mark_step,
// torch.ops.opguard.step) or the recorder's own (an Optimizer.step range, an
// inferred step).
void record::end_step() {
  RecorderImpl* rec = g_recorder;
  if (rec == nullptr || !rec->active.load()) return;
  rec->step.fetch_add(1);
  if (rec->window_closed && !rec->stop_requested.load()) {
    // --stop-after-windows: every window passed; the recorder's thread
    // finishes the recording (this step included) and ends the process.
    bool all = true;
    for (std::size_t w = 0; w < rec->config.policy.windows.size(); ++w) all = all && rec->window_closed[w].load();
    if (all && !rec->stop_requested.exchange(true) && start_signal_thread()) on_term_signal(0);
  }
  rec->backward_seen.store(false, std::memory_order_relaxed);
  rec->parameters_updated.store(false, std::memory_order_relaxed);
  if (rec->writer && !rec->failed.load()) {
    if (rec->hasher) {
      rec->hasher->end_step();
    } else {
      rec->writer->end_step();
    }
  }
}

// From the first of the program's own calls on, only they end steps (the
// optimizer's ranges no longer do: docs/RECORD.md, "Steps").
void Recorder::step() {
  RecorderImpl* rec = g_recorder;
  if (rec == nullptr || !rec->active.load()) return;
  rec->explicit_steps.store(true);
  rec->step_end_pending.store(false);
  record::end_step();
}

void Recorder::mark(const at::Tensor& tensor, const std::string& name) { record::mark_tensor(tensor, name); }

RecorderStats Recorder::stats() {
  RecorderStats s;
  RecorderImpl* rec = g_recorder;
  if (rec == nullptr) return s;
  s.events = rec->events.load();
  s.dropped_tensors = rec->dropped.load();
  s.bytes_written = rec->writer ? rec->writer->bytes_written() : 0;
  s.step = rec->step.load();
  s.failed = rec->failed.load();
  return s;
}

}  // namespace opguard
