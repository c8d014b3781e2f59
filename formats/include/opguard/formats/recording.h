#pragma once
// The recording format, version kFormatVersion (docs/FORMAT.md is the
// specification; this header is its C++ face). No torch types here: tensors are
// described by TensorMeta and their bytes travel as plain buffers, so readers
// (diff, ls, show) and the fuzzer compile without torch.
//
// On disk, a recording is a directory:
//   DIR/rank<R>/manifest.h5            written at start, rewritten at a clean end
//   DIR/rank<R>/step<S:08d>.h5         one file per completed step (atomic rename)
//   DIR/rank<R>/step<S:08d>.h5.tmp     a step the process died in (torn)
// Each step file is self-contained: event columns, value columns, dims, and the
// full tensors that the sampling policy asked for under /data.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <memory>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "opguard/core/dtype.h"

namespace opguard::formats {

// This version number is the layout of the files, not opguard's version: bump it
// when a group, dataset, column or attribute changes meaning or disappears.
inline constexpr int kFormatVersion = 4;

enum class Phase : uint8_t { kForward = 0, kBackward = 1, kOptimizer = 2, kOther = 3 };
const char* phase_name(Phase p);
std::optional<Phase> phase_from_name(const std::string& name);

// What an argument or return value is. Non-tensor values keep their exact value
// in Value::text (doubles as C99 hex floats, so they round-trip bit for bit).
enum class ValueKind : uint8_t {
  kNone = 0,
  kTensor = 1,
  kTensorList = 2,  // header row; its `list_len` element rows follow it (kTensor or kNone)
  kInt = 3,
  kDouble = 4,
  kBool = 5,
  kString = 6,
  kIntList = 7,     // text "[1,2,3]"
  kDoubleList = 8,  // text "[0x1p+0,0x1.8p+1]"
  kBoolList = 9,
  kScalarType = 10,  // text: dtype name ("float32")
  kDevice = 11,      // text: "cpu", "cuda:0"
  kLayout = 12,
  kMemoryFormat = 13,
  kGenerator = 14,  // text: the generator's device; tensor: its state as a uint8 tensor
  kComplex = 15,    // text "(re,im)" in hex floats
  kOther = 16,      // text: a best-effort repr; compared as text, not replayable
};
const char* value_kind_name(ValueKind k);
// Whether a value of this kind has a TensorMeta (tensors and generator states).
inline bool carries_tensor(ValueKind k) { return k == ValueKind::kTensor || k == ValueKind::kGenerator; }

// TensorMeta::flags bits.
enum TensorFlags : uint8_t {
  kTensorUninitialized = 1 << 0,  // bits are uninitialised memory: no fingerprint taken
  kTensorHasData = 1 << 1,        // full contents stored under /data (TensorMeta::data_index)
  kTensorDropped = 1 << 2,        // full contents wanted, but the queue was full under policy=drop
  kTensorNotFingerprinted = 1 << 3,  // device or layout opguard cannot hash (sparse, meta, ...)
  kTensorWrappedNumber = 1 << 4,     // a Python number the dispatcher wrapped in a 0-dim tensor
  kTensorRequiresGrad = 1 << 5,      // requires_grad: a leaf (a parameter) unless kTensorNonLeaf
  kTensorNonLeaf = 1 << 6,           // with kTensorRequiresGrad: computed by an op autograd recorded
};
// The flags that describe the tensor, not the state of its bits.
constexpr uint8_t kTensorDescriptionFlags = kTensorWrappedNumber | kTensorRequiresGrad | kTensorNonLeaf;

struct TensorMeta {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t storage_offset = 0;
  std::string device = "cpu";
  uint64_t fingerprint = 0;  // kernels::fingerprint of the logical contents
  uint8_t flags = 0;
  // Identity within one recording: the same storage has the same id while it
  // lives; `version` is torch's version counter at the time of the record. Used
  // for dataflow (which event produced the bits an input carries).
  uint64_t storage_id = 0;
  uint32_t version = 0;
  int64_t data_index = -1;  // index n of /data/<n> in the same step file, or -1

  bool has_fingerprint() const {
    return (flags & (kTensorUninitialized | kTensorNotFingerprinted)) == 0;
  }
  int64_t numel() const;  // product of sizes (1 for 0-d); -1 if a size is negative or it overflows
};

struct Value {
  ValueKind kind = ValueKind::kNone;
  std::string name;  // schema argument name ("self", "other", "out"); outputs: "" or the return name
  std::string text;  // non-tensor value, see ValueKind
  TensorMeta tensor;  // carries_tensor(kind) only
  int32_t list_len = 0;  // kTensorList only
  bool mutated = false;  // schema marks this argument as written (in-place or out=)
};

struct Event {
  uint64_t id = 0;      // see event_id_string
  uint32_t stream = 0;  // 0: the process's main thread; others numbered by first event
  uint64_t seq = 0;     // position in its stream
  uint64_t thread = 0;  // OS thread id
  int64_t step = 0;
  Phase phase = Phase::kOther;
  std::string op;        // "aten::addmm"
  std::string overload;  // "" or "out", "Tensor", ...
  std::string schema;    // full schema text
  std::string scope;     // module scope path "blocks.1.attn.proj", "" at top
  std::string node;      // autograd node ("MmBackward0") for backward events, else ""
  int64_t t_start_ns = 0;  // CLOCK_MONOTONIC, nanoseconds
  int64_t t_end_ns = 0;
  uint32_t flags = 0;  // the autocast state the op ran under (autocast_flags), kEventGradMode
  // The in-process knobs the op ran under (knob_bits); nullopt where the
  // step file has no /events/knobs column (recorded before it existed) or
  // the row is 0.
  std::optional<uint32_t> knobs;
  std::vector<Value> inputs;
  std::vector<Value> outputs;
};

// Event::flags: bit 0 autocast on for CPU ops, bits 8-15 its dtype code;
// bit 1 autocast on for CUDA ops, bits 16-23 its dtype code; bit 2
// (kEventGradMode) grad mode on; bit 3 (kEventDefaultDtype): bits 24-31 hold
// the default dtype (torch.get_default_dtype()) the op ran under.
constexpr uint32_t kEventGradMode = 1u << 2;
constexpr uint32_t kEventDefaultDtype = 1u << 3;
inline uint32_t default_dtype_flags(DType d) { return kEventDefaultDtype | (static_cast<uint32_t>(d) << 24); }
// The recorded default dtype, nullopt where the event has none (recorded
// before the flag existed). Throws FormatError on a dtype code this opguard
// does not know.
std::optional<DType> default_dtype_of(uint32_t event_flags);
struct Autocast {
  std::optional<DType> cpu, cuda;  // the autocast dtype where autocast is on
  bool operator==(const Autocast& o) const { return cpu == o.cpu && cuda == o.cuda; }
};
inline uint32_t autocast_flags(const Autocast& a) {
  uint32_t f = 0;
  if (a.cpu) f |= 1u | (static_cast<uint32_t>(*a.cpu) << 8);
  if (a.cuda) f |= 2u | (static_cast<uint32_t>(*a.cuda) << 16);
  return f;
}
// Throws FormatError on a dtype code this opguard does not know.
Autocast autocast_of(uint32_t event_flags);
// Event::flags bits 4-7: the scaled_dot_product_attention backends the
// program had switched off when the op ran (torch.nn.attention.sdpa_kernel,
// torch.backends.cuda.enable_*_sdp): the op picks its kernel among the others,
// on the CPU too (flash or math). 0, every backend on, is torch's default and
// what recordings made before the bits existed hold.
struct SdpBackends {
  bool math = true, flash = true, efficient = true, cudnn = true;
  bool operator==(const SdpBackends& o) const {
    return math == o.math && flash == o.flash && efficient == o.efficient && cudnn == o.cudnn;
  }
  bool operator!=(const SdpBackends& o) const { return !(*this == o); }
};
constexpr uint32_t kEventSdpMathOff = 1u << 4, kEventSdpFlashOff = 1u << 5, kEventSdpEfficientOff = 1u << 6,
                   kEventSdpCudnnOff = 1u << 7;
inline uint32_t sdp_flags(const SdpBackends& b) {
  return (b.math ? 0u : kEventSdpMathOff) | (b.flash ? 0u : kEventSdpFlashOff) |
         (b.efficient ? 0u : kEventSdpEfficientOff) | (b.cudnn ? 0u : kEventSdpCudnnOff);
}
inline SdpBackends sdp_backends_of(uint32_t f) {
  return {!(f & kEventSdpMathOff), !(f & kEventSdpFlashOff), !(f & kEventSdpEfficientOff), !(f & kEventSdpCudnnOff)};
}
// "all", "none", or the backends on joined by '+' in the order math, flash,
// efficient, cudnn ("math", "flash+math" is spelled "math+flash"): the values
// of replay's sdpa_backend knob.
std::string sdp_text(const SdpBackends& b);
// The inverse of sdp_text, in any order; nullopt for anything else.
std::optional<SdpBackends> parse_sdp(const std::string& text);
// "cpu=bfloat16", "cpu=bfloat16,cuda=float16", "" when autocast is off.
std::string autocast_text(const Autocast& a);

// Event::knobs (/events/knobs): the in-process knobs an op ran under, read
// by the recorder per op (the manifest has them only at the start and at a
// clean end). Bits 0-7 intra-op threads (1-255, more read as 255), bit 8
// oneDNN on, bit 9 deterministic algorithms, bit 10 denormals flushed on
// the op's thread (MXCSR FTZ and DAZ), bits 11-12 float32 matmul precision
// of the CPU's oneDNN matmul (0 highest, 1 high, 2 medium: ieee, tf32, bf16).
// Bit 13: the CUDA knobs are recorded, in bits 14-19: cuBLAS fp32 matmul in
// TF32, cuDNN fp32 convolutions in TF32, cuDNN benchmark, cuDNN
// deterministic, fp16 and bf16 GEMMs allowed to reduce in reduced precision.
// Bits above 19 are not used (a reader ignores them). 0: not recorded.
struct GpuKnobs {
  bool tf32_cublas = false, tf32_cudnn = true, cudnn_benchmark = false, cudnn_deterministic = false;
  bool fp16_reduction = true, bf16_reduction = true;  // reduced-precision reductions allowed
  bool operator==(const GpuKnobs& o) const {
    return tf32_cublas == o.tf32_cublas && tf32_cudnn == o.tf32_cudnn && cudnn_benchmark == o.cudnn_benchmark &&
           cudnn_deterministic == o.cudnn_deterministic && fp16_reduction == o.fp16_reduction &&
           bf16_reduction == o.bf16_reduction;
  }
  bool operator!=(const GpuKnobs& o) const { return !(*this == o); }
};
struct EventKnobs {
  int threads = 1;
  bool mkldnn = true, deterministic = false, flush_denormal = false;
  std::string matmul_precision = "highest";  // highest | high | medium
  std::optional<GpuKnobs> gpu;               // nullopt: recorded before bit 13 existed
};
constexpr uint32_t kKnobsGpuRecorded = 1u << 13;
// Throws FormatError on a precision other than highest, high or medium.
uint32_t knob_bits(const EventKnobs& k);
// The same from the values as libtorch gives them; precision 0 highest, 1
// high, 2 medium.
inline uint32_t knob_bits(int threads, bool mkldnn, bool deterministic, bool flush_denormal, uint32_t precision) {
  const auto t = static_cast<uint32_t>(threads < 1 ? 1 : threads > 255 ? 255 : threads);
  return t | (mkldnn ? 1u << 8 : 0u) | (deterministic ? 1u << 9 : 0u) | (flush_denormal ? 1u << 10 : 0u) |
         ((precision & 3u) << 11);
}
// The intra-op threads of knob bits (0: not recorded).
inline int knob_threads(uint32_t bits) { return static_cast<int>(bits & 0xffu); }
// Bits 13-19 for the CUDA knobs (kKnobsGpuRecorded included).
inline uint32_t gpu_knob_bits(const GpuKnobs& g) {
  return kKnobsGpuRecorded | (g.tf32_cublas ? 1u << 14 : 0u) | (g.tf32_cudnn ? 1u << 15 : 0u) |
         (g.cudnn_benchmark ? 1u << 16 : 0u) | (g.cudnn_deterministic ? 1u << 17 : 0u) |
         (g.fp16_reduction ? 1u << 18 : 0u) | (g.bf16_reduction ? 1u << 19 : 0u);
}
// Throws FormatError where the bits hold no thread count or an unknown precision.
EventKnobs knobs_of(uint32_t bits);
// The value of replay's reduced_precision_reduction knob: "on" (fp16 and
// bf16 allowed), "off" (neither), "fp16" or "bf16" (that one only).
std::string reduction_text(bool fp16, bool bf16);
// The CUDA knobs as replay's knob names and values (tf32_cublas=on, ...,
// reduced_precision_reduction=fp16), the names the manifest's keys also use.
std::vector<std::pair<std::string, std::string>> gpu_knob_values(const GpuKnobs& g);

// Event ids: stream in the top 16 bits, the position in that stream below.
// Events of the main thread print as plain numbers ("1234"); others as
// "<stream>.<seq>" ("2.57"), so the training thread's ids never shift because
// another thread dispatched more or fewer ops.
inline uint64_t make_event_id(uint32_t stream, uint64_t seq) {
  return (static_cast<uint64_t>(stream) << 48) | (seq & ((uint64_t{1} << 48) - 1));
}
std::string event_id_string(uint64_t id);
// "aten::add.Tensor": an op with its overload (none: the op alone), as the reports spell it.
std::string op_text(const std::string& op, const std::string& overload);
std::optional<uint64_t> parse_event_id(const std::string& text);
// The one error sentence of every verb asked for an event a recording lacks;
// `why` (e.g. "; step 3 is torn ...") goes before the pointer to ls --events.
std::string no_event_message(const std::string& dir, const std::string& event, int rank, const std::string& why = "");

// Free-form key/value facts about a run (see docs/FORMAT.md for the keys that
// opguard writes), plus the numerics-relevant environment variables.
struct Manifest {
  int format_version = kFormatVersion;
  int rank = 0;
  int world_size = 1;
  std::map<std::string, std::string> info;  // "program", "argv", "torch_version", "threads", ...
  std::map<std::string, std::string> env;   // OMP_NUM_THREADS, ATEN_CPU_CAPABILITY, ...
};

// A full tensor as written to /data/<n>: logical shape, row-major contiguous
// bytes (the recorded strides stay in TensorMeta).
struct TensorData {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> sizes;
  std::vector<uint8_t> bytes;
};

// Writes one step file. Not thread-safe: one writer thread owns it. Data is
// written as it arrives; add_event copies an event into the event and value
// tables in memory (the caller may reuse it), which close() writes before it
// renames <path>.tmp to <path>. Throws IoError / FormatError.
class StepWriter {
 public:
  // `full_tensors`: the file is expected to hold /data datasets (a dataset
  // per tensor): HDF5 then allocates metadata in 64 KiB blocks, which writes
  // thousands of datasets faster and leaves up to 64 KiB of slack in the file.
  StepWriter(const std::string& path, int rank, int64_t step, bool full_tensors = false);
  ~StepWriter();  // closes without renaming if close() was not called (torn)
  StepWriter(const StepWriter&) = delete;
  StepWriter& operator=(const StepWriter&) = delete;

  // Returns the data index to put into TensorMeta::data_index.
  int64_t write_tensor(DType dtype, const std::vector<int64_t>& sizes, const void* bytes,
                       std::size_t nbytes);
  void add_event(const Event& event);
  void close();  // write event tables, flush, close, rename
  // After a failed write (disk full): closes the file without writing more of
  // it (HDF5's remaining writes go to an anonymous memory file; a file whose
  // flush already failed stays open, see h5::created_file). The .tmp on disk
  // is left as it was, partial; the caller removes it. Never throws.
  void abandon();
  std::size_t bytes_written() const { return bytes_written_; }

 private:
  struct Impl;
  Impl* impl_;
  std::size_t bytes_written_ = 0;
};

// An allocator whose value-less construct leaves elements default-initialised
// (for numbers: unset), so that a Column resized for HDF5 to fill is not
// zeroed first (zeroing cost about 6% of reading a step file).
template <typename T>
struct DefaultInitAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  DefaultInitAllocator() = default;
  template <typename U>
  DefaultInitAllocator(const DefaultInitAllocator<U>&) noexcept {}
  template <typename U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
template <typename T>
using Column = std::vector<T, DefaultInitAllocator<T>>;

// The event and value tables of one step file as stored (docs/FORMAT.md, "Step
// file"): one vector per column, strings as rows of the file's string table.
// StepReader validates them before handing them out: every string index,
// value range, /dims range and /data index is in range, every phase, kind and
// dtype code is known, and every tensor list lies inside its event's values.
// The /dims range and /data index of value rows whose kind carries no tensor
// are not checked.
struct StepColumns {
  struct Events {
    Column<uint64_t> id, seq, thread, value_begin;
    Column<uint32_t> stream, op, overload, schema, scope, node, flags, n_inputs, n_outputs;
    Column<uint32_t> knobs;  // empty: the file has no /events/knobs column
    Column<int64_t> step, t_start_ns, t_end_ns;
    Column<uint8_t> phase;
    std::size_t size() const { return id.size(); }
  } events;
  struct Values {
    Column<uint8_t> kind, dtype, flags, mutated, ndim;
    Column<uint32_t> name, text, device, version;
    Column<int32_t> list_len;
    Column<uint64_t> fingerprint, storage_id, dims_offset;
    Column<int64_t> storage_offset, data_index;
    std::size_t size() const { return kind.size(); }
  } values;
  Column<int64_t> dims;
  Column<char> strings;             // /strings: the distinct strings back to back
  Column<uint64_t> string_offsets;  // /string_offsets: string i is [offsets[i], offsets[i+1])

  std::size_t string_count() const { return string_offsets.empty() ? 0 : string_offsets.size() - 1; }
  std::string_view string(uint32_t i) const {
    return {strings.data() + string_offsets[i], static_cast<std::size_t>(string_offsets[i + 1] - string_offsets[i])};
  }
};

// Reads one step file. Throws FormatError with a one-sentence message for
// anything truncated, corrupt, foreign or of another version. The tables are
// read and validated when it opens; events() builds Event objects from them on
// its first call (thread-safe), event(i) builds one.
class StepReader {
 public:
  explicit StepReader(const std::string& path);
  ~StepReader();
  StepReader(const StepReader&) = delete;
  StepReader& operator=(const StepReader&) = delete;

  int rank() const;
  int64_t step() const;
  const StepColumns& columns() const;
  std::size_t event_count() const { return columns().events.size(); }
  Event event(std::size_t i) const;  // i < event_count()
  const std::vector<Event>& events() const;
  // Reads /data/<data_index> exactly as stored (no conversion). Throws
  // FormatError if it does not exist or its HDF5 type disagrees with its dtype
  // attribute.
  TensorData read_tensor(int64_t data_index) const;
  // The same for meta.data_index, and also checks that the stored dtype and
  // sizes are the ones `meta` describes.
  TensorData read_tensor(const TensorMeta& meta) const;
  std::size_t data_count() const;  // number of /data/<n> datasets (n = 0 .. data_count-1)
  const std::string& path() const;

 private:
  struct Impl;
  Impl* impl_;
};

// Whether StepReaders may be opened on several threads at once: the HDF5
// library opguard runs with is a thread-safe build (it serialises its calls).
bool concurrent_step_reads();

void write_manifest(const std::string& path, const Manifest& manifest);  // atomic (tmp + rename)
Manifest read_manifest(const std::string& path);

// What a recording directory holds, per rank, without reading the events.
struct RankFiles {
  int rank = 0;
  std::string dir;
  std::string manifest_path;
  std::vector<std::pair<int64_t, std::string>> steps;  // complete step files, by step
  std::vector<std::pair<int64_t, std::string>> torn;   // *.tmp left by a process that died
};
struct RecordingLayout {
  std::string dir;
  std::vector<RankFiles> ranks;  // by rank
};
// Throws FormatError ("DIR is not an opguard recording: ...") if DIR has no rank
// with a manifest.
RecordingLayout scan_recording(const std::string& dir);
std::string rank_dir(const std::string& recording_dir, int rank);
std::string step_file_name(int64_t step);  // "step00000012.h5"

// rank<R>/owner.pid (docs/FORMAT.md, "Directory"): the line the recording
// process writes ("PID START": its pid and its start time in clock ticks after
// boot, field 22 of /proc/PID/stat), and whether the process a rank directory's
// owner.pid names still runs. A pid reused by another process since does not
// count (its start time differs); a file of the pid alone (written before the
// start time was) counts if any process has that pid.
std::string owner_line();
bool owner_running(const std::string& rank_dir);

}  // namespace opguard::formats
