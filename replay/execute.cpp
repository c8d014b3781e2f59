// Rebuilds a recorded event's arguments as IValues and calls the operator
// through the dispatcher. The only file of opguard_replay with torch headers.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/headeronly/version.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>

#include "decomposed.h"
#include "execute.h"
#include "opguard/core/openmp_team.h"
#include "opguard/core/written_arguments.h"
#include "strided.h"

namespace opguard::replay::detail {
namespace {

using formats::TensorMeta;
using formats::Value;
using formats::ValueKind;

// Thrown while building arguments; becomes a cannot-replay verdict.
struct CannotReplay {
  CannotReason reason;
  std::string message;
};

std::optional<c10::ScalarType> to_scalar_type(DType d) {
  switch (d) {
    case DType::kFloat64: return c10::ScalarType::Double;
    case DType::kFloat32: return c10::ScalarType::Float;
    case DType::kFloat16: return c10::ScalarType::Half;
    case DType::kBFloat16: return c10::ScalarType::BFloat16;
    case DType::kInt8: return c10::ScalarType::Char;
    case DType::kInt16: return c10::ScalarType::Short;
    case DType::kInt32: return c10::ScalarType::Int;
    case DType::kInt64: return c10::ScalarType::Long;
    case DType::kUInt8: return c10::ScalarType::Byte;
    case DType::kBool: return c10::ScalarType::Bool;
    case DType::kComplex64: return c10::ScalarType::ComplexFloat;
    case DType::kComplex128: return c10::ScalarType::ComplexDouble;
    case DType::kUInt16: return c10::ScalarType::UInt16;
    case DType::kUInt32: return c10::ScalarType::UInt32;
    case DType::kUInt64: return c10::ScalarType::UInt64;
    case DType::kFloat8E4M3: return c10::ScalarType::Float8_e4m3fn;
    case DType::kFloat8E5M2: return c10::ScalarType::Float8_e5m2;
  }
  return std::nullopt;
}

std::optional<DType> to_dtype(c10::ScalarType t) {
  for (int i = 0; i < kNumDTypes; ++i) {
    auto d = static_cast<DType>(i);
    if (to_scalar_type(d) == t) return d;
  }
  return std::nullopt;
}

// Exactly the recorder's formatting, so that non-tensor outputs compare as text.
std::string hex_double(double d) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%a", d);
  return buf;
}

double parse_double(const std::string& text) {
  // strtod reads C99 hex floats ("0x1.8p+1", "-0x0p+0", "inf", "nan") exactly.
  char* end = nullptr;
  double d = std::strtod(text.c_str(), &end);
  if (end == text.c_str())
    throw CannotReplay{CannotReason::kUnsupportedValue, "'" + text + "' is not a recorded double"};
  return d;
}

int64_t parse_int(const std::string& text) {
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str())
    throw CannotReplay{CannotReason::kUnsupportedValue, "'" + text + "' is not a recorded integer"};
  return v;
}

// "[a,b,c]" -> {"a","b","c"}
std::vector<std::string> list_items(const std::string& text) {
  std::vector<std::string> items;
  if (text.size() < 2 || text.front() != '[' || text.back() != ']')
    throw CannotReplay{CannotReason::kUnsupportedValue, "'" + text + "' is not a recorded list"};
  std::string cur;
  for (std::size_t i = 1; i + 1 < text.size(); ++i) {
    if (text[i] == ',') {
      items.push_back(cur);
      cur.clear();
    } else {
      cur += text[i];
    }
  }
  if (!cur.empty()) items.push_back(cur);
  return items;
}

// Whether a recorded tensor required grad, and how (kTensorRequiresGrad,
// kTensorNonLeaf). Kernels choose their path by it (matmul folds a 3-d operand
// into one mm when the other operand requires grad, whatever the grad mode;
// convolution and CUDA's attention backends look at it under grad mode), so
// replay sets it again. Only floating and complex tensors can require grad.
enum class Grad { kNone, kLeaf, kNonLeaf };
Grad grad_of(const TensorMeta& m) {
  if (!(m.flags & formats::kTensorRequiresGrad)) return Grad::kNone;
  const auto st = to_scalar_type(m.dtype);
  if (!st || !(at::isFloatingType(*st) || at::isComplexType(*st))) return Grad::kNone;
  return (m.flags & formats::kTensorNonLeaf) ? Grad::kNonLeaf : Grad::kLeaf;
}

// Marks t, a tensor that requires no grad, as one autograd computed: it
// requires grad and is not a leaf (an op may write it in place under grad
// mode), and it stays what it was otherwise: the same memory and layout, not a
// view (detach_ refuses views). Its grad_fn is a node that refuses to run:
// replay never runs backward through it.
void mark_computed(at::Tensor& t) {
  torch::autograd::create_gradient_edge(
      t, std::make_shared<torch::autograd::Error>("a replayed input: opguard runs no backward through it"));
}

// The recorded layout rebuilt: a zero-filled storage large enough for the
// recorded sizes, strides and storage offset, the row-major bits scattered into
// it, and a strided view on it. Zero fill makes bytes outside the view (and
// uninitialised buffers) the same in every trial. `shared` (optional) is the
// storage of inputs that alias each other (see shared_storages): then the view
// is made on it, and it already holds the bits. With `device` (device=cuda:N)
// the storage is built on the CPU and copied there whole, layout and all.
at::Tensor make_tensor(const TensorMeta& m, const formats::TensorData* data, const std::string& what,
                       const at::Tensor* shared, const std::optional<c10::Device>& device) {
  if (m.device != "cpu" && !device)
    throw CannotReplay{CannotReason::kUnsupportedValue, what + " was recorded on " + m.device +
                                                            ": replay it there with --config device=" + m.device};
  auto st = to_scalar_type(m.dtype);
  if (!st) throw CannotReplay{CannotReason::kUnsupportedValue, what + " has a dtype this libtorch lacks"};
  const int ndim = static_cast<int>(m.sizes.size());
  if (static_cast<int>(m.strides.size()) != ndim)
    throw CannotReplay{CannotReason::kUnsupportedValue, what + " has no recorded strides"};
  const int64_t numel = m.numel();
  at::Tensor storage = shared != nullptr ? *shared : at::zeros({storage_extent(m)}, at::TensorOptions().dtype(*st));
  if (data != nullptr && numel > 0 && shared == nullptr) {
    const std::size_t es = dtype_size(m.dtype);
    if (data->bytes.size() != static_cast<std::size_t>(numel) * es)
      throw CannotReplay{CannotReason::kInputsNotRecorded, what + ": the stored tensor has the wrong size"};
    // Overlapping views (stride 0) get the same bits several times, which is
    // what the recording saw.
    scatter_view(m, es, data->bytes.data(), static_cast<uint8_t*>(storage.data_ptr()));
  }
  // A wrapped Python number stays on the CPU (ops on any device take it).
  const bool wrapped = (m.flags & formats::kTensorWrappedNumber) != 0 && ndim == 0;
  if (device && shared == nullptr && !wrapped) storage = storage.to(*device);
  // set_ rather than as_strided: the result owns its storage and is not a view,
  // like the tensors ops such as detach_ insist on.
  at::Tensor t = at::empty({0}, storage.options());
  t.set_(storage.storage(), m.storage_offset, m.sizes, m.strides);
  if (wrapped) t.unsafeGetTensorImpl()->set_wrapped_number(true);
  switch (grad_of(m)) {
    case Grad::kNone: break;
    case Grad::kLeaf: t.requires_grad_(true); break;
    case Grad::kNonLeaf: mark_computed(t); break;
  }
  return t;
}

// Inputs the recording shows sharing one storage (the same storage id: the
// same tensor passed twice, a view of another input, an in-place op on a view
// of its other argument) get one rebuilt storage, so that an in-place op
// writes where the other input reads, as it did when recorded. Only tensors of
// one dtype on the CPU are grouped; a storage seen through two dtypes (a
// reinterpreting view) is rebuilt once per input, as before. Keyed by storage
// id; inputs with a storage of their own are absent.
std::map<uint64_t, at::Tensor> shared_storages(const formats::Event& ev,
                                               const std::vector<const formats::TensorData*>& data,
                                               const std::optional<c10::Device>& device) {
  std::map<uint64_t, std::vector<std::size_t>> groups;
  for (std::size_t i = 0; i < ev.inputs.size(); ++i) {
    const Value& v = ev.inputs[i];
    if (v.kind == ValueKind::kTensor && v.tensor.storage_id != 0 && (v.tensor.device == "cpu" || device) &&
        v.tensor.strides.size() == v.tensor.sizes.size())
      groups[v.tensor.storage_id].push_back(i);
  }
  std::map<uint64_t, at::Tensor> shared;
  for (const auto& [id, members] : groups) {
    if (members.size() < 2) continue;
    const DType dtype = ev.inputs[members.front()].tensor.dtype;
    int64_t extent = 0;
    bool one_dtype = true;
    for (std::size_t i : members) {
      one_dtype = one_dtype && ev.inputs[i].tensor.dtype == dtype;
      extent = std::max(extent, storage_extent(ev.inputs[i].tensor));
    }
    auto st = to_scalar_type(dtype);
    if (!one_dtype || !st) continue;
    at::Tensor storage = at::zeros({extent}, at::TensorOptions().dtype(*st));
    const std::size_t es = dtype_size(dtype);
    for (std::size_t i : members) {
      const TensorMeta& m = ev.inputs[i].tensor;
      if (data[i] == nullptr || m.numel() <= 0) continue;
      if (data[i]->bytes.size() != static_cast<std::size_t>(m.numel()) * es)
        throw CannotReplay{CannotReason::kInputsNotRecorded,
                           "argument '" + ev.inputs[i].name + "': the stored tensor has the wrong size"};
      scatter_view(m, es, data[i]->bytes.data(), static_cast<uint8_t*>(storage.data_ptr()));
    }
    shared.emplace(id, device ? storage.to(*device) : storage);
  }
  return shared;
}

at::Tensor state_tensor(const Value& v, const formats::TensorData* data) {
  if (data == nullptr)
    throw CannotReplay{CannotReason::kInputsNotRecorded, "the generator state of '" + v.name + "' is not recorded in full"};
  if (v.text != "cpu")
    throw CannotReplay{CannotReason::kUnsupportedValue, "a " + v.text + " generator cannot be replayed on the CPU"};
  return make_tensor(v.tensor, data, "generator state", nullptr, std::nullopt).contiguous();
}

c10::TypePtr unwrap_optional(c10::TypePtr t, bool* optional = nullptr) {
  if (auto o = t->cast<c10::OptionalType>()) {
    if (optional) *optional = true;
    return o->getElementType();
  }
  if (optional) *optional = false;
  return t;
}

c10::Layout parse_layout(const std::string& s) {
  if (s == "Strided") return c10::kStrided;
  if (s == "Sparse") return c10::kSparse;
  if (s == "SparseCsr") return c10::kSparseCsr;
  if (s == "SparseCsc") return c10::kSparseCsc;
  if (s == "SparseBsr") return c10::kSparseBsr;
  if (s == "SparseBsc") return c10::kSparseBsc;
  if (s == "Mkldnn") return c10::kMkldnn;
  if (s == "Jagged") return c10::kJagged;
  throw CannotReplay{CannotReason::kUnsupportedValue, "layout '" + s + "' is unknown"};
}

c10::MemoryFormat parse_memory_format(const std::string& s) {
  if (s == "Contiguous") return c10::MemoryFormat::Contiguous;
  if (s == "Preserve") return c10::MemoryFormat::Preserve;
  if (s == "ChannelsLast") return c10::MemoryFormat::ChannelsLast;
  if (s == "ChannelsLast3d") return c10::MemoryFormat::ChannelsLast3d;
  throw CannotReplay{CannotReason::kUnsupportedValue, "memory format '" + s + "' is unknown"};
}

bool parse_bool(const std::string& s) { return s == "true" || s == "1" || s == "True"; }

// One non-tensor value as the IValue the schema argument of type `type` takes.
c10::IValue scalar_ivalue(const Value& v, const c10::TypePtr& type) {
  switch (v.kind) {
    case ValueKind::kNone: {
      const auto inner = unwrap_optional(type);
      if (inner->kind() == c10::TypeKind::TensorType && !type->cast<c10::OptionalType>()) return at::Tensor();
      return c10::IValue();
    }
    case ValueKind::kInt: return c10::IValue(parse_int(v.text));
    case ValueKind::kDouble: return c10::IValue(parse_double(v.text));
    case ValueKind::kBool: return c10::IValue(parse_bool(v.text));
    case ValueKind::kString: return c10::IValue(v.text);
    case ValueKind::kComplex: {
      const auto comma = v.text.find(',');
      if (v.text.size() < 5 || comma == std::string::npos)
        throw CannotReplay{CannotReason::kUnsupportedValue, "'" + v.text + "' is not a recorded complex"};
      const double re = parse_double(v.text.substr(1, comma - 1));
      const double im = parse_double(v.text.substr(comma + 1, v.text.size() - comma - 2));
      return c10::IValue(c10::complex<double>(re, im));
    }
    case ValueKind::kScalarType: {
      if (auto d = dtype_from_name(v.text))
        if (auto st = to_scalar_type(*d)) return c10::IValue(static_cast<int64_t>(*st));
      return c10::IValue(parse_int(v.text));  // the recorder's fallback: the enum value
    }
    case ValueKind::kLayout: return c10::IValue(static_cast<int64_t>(parse_layout(v.text)));
    case ValueKind::kMemoryFormat: return c10::IValue(static_cast<int64_t>(parse_memory_format(v.text)));
    case ValueKind::kDevice: {
      try {
        return c10::IValue(c10::Device(v.text));
      } catch (const c10::Error&) {
        throw CannotReplay{CannotReason::kUnsupportedValue, "device '" + v.text + "' is unknown"};
      }
    }
    case ValueKind::kIntList:
    case ValueKind::kDoubleList:
    case ValueKind::kBoolList: {
      // The recorder writes an empty list of any element type as "[]" (kIntList):
      // the schema says which list it is.
      const auto items = list_items(v.text);
      c10::TypePtr elem;
      if (auto list = unwrap_optional(type)->cast<c10::ListType>()) elem = unwrap_optional(list->getElementType());
      const auto elem_kind = elem ? elem->kind() : c10::TypeKind::IntType;
      if (elem_kind == c10::TypeKind::NumberType && v.kind != ValueKind::kBoolList) {
        // Scalar[]: ints stay ints (they promote otherwise than doubles).
        c10::impl::GenericList out(c10::NumberType::get());
        for (const auto& s : items)
          out.push_back(v.kind == ValueKind::kDoubleList ? c10::IValue(parse_double(s)) : c10::IValue(parse_int(s)));
        return c10::IValue(out);
      }
      if (v.kind == ValueKind::kDoubleList || elem_kind == c10::TypeKind::FloatType) {
        std::vector<double> out;
        for (const auto& s : items) out.push_back(parse_double(s));
        return c10::IValue(out);
      }
      if (v.kind == ValueKind::kBoolList || elem_kind == c10::TypeKind::BoolType) {
        c10::List<bool> out;
        for (const auto& s : items) out.push_back(parse_bool(s));
        return c10::IValue(out);
      }
      if (elem_kind == c10::TypeKind::TensorType && items.empty()) {
        auto list_type = unwrap_optional(type)->cast<c10::ListType>();
        if (list_type->getElementType()->cast<c10::OptionalType>())
          return c10::IValue(c10::List<std::optional<at::Tensor>>());
        return c10::IValue(c10::List<at::Tensor>());
      }
      std::vector<int64_t> out;
      for (const auto& s : items) out.push_back(parse_int(s));
      return c10::IValue(out);
    }
    default:
      throw CannotReplay{CannotReason::kUnsupportedValue,
                         std::string("argument '") + v.name + "' is a " + formats::value_kind_name(v.kind) +
                             " (" + v.text + "), which replay cannot rebuild"};
  }
}

// torch.set_flush_denormal sets FTZ and DAZ in the calling thread's MXCSR
// only. The intra-op threads keep what they were created with (a thread
// starts with its creator's), so a trial's setting missed the workers an
// earlier parallel kernel had started (a trial flushed the denormals of its
// own chunk and not the worker's), and a setting that did reach them, by
// their being created under it, stayed for the trials after. Sets every
// intra-op thread's, then this thread's: the program's state where it called
// torch.set_flush_denormal after its first parallel op (`main`), or cleared
// it after (`workers`), as well as before (`on`).
void set_flush_denormal(FlushDenormal f) {
  if (at::get_num_threads() > 1 && !at::in_parallel_region())
    on_every_openmp_thread([](bool value) { at::globalContext().setFlushDenormal(value); }, f.workers);
  at::globalContext().setFlushDenormal(f.caller);
}

// Settings apply for one trial and are undone afterwards, so that --all and
// bisect's trials do not leak into each other.
class SettingsScope {
 public:
  // `recorded_sdp`: the backends the event ran with, where the trial does
  // not set them.
  SettingsScope(const Settings& s, const formats::SdpBackends& recorded_sdp) {
    auto& ctx = at::globalContext();
    threads_ = at::get_num_threads();
    mkldnn_ = ctx.userEnabledMkldnn();
    deterministic_ = ctx.deterministicAlgorithms();
    deterministic_warn_ = ctx.deterministicAlgorithmsWarnOnly();
    if (s.threads) at::set_num_threads(*s.threads);
    if (s.mkldnn) ctx.setUserEnabledMkldnn(*s.mkldnn);
    if (s.deterministic) ctx.setDeterministicAlgorithms(*s.deterministic, false);
    if (s.matmul_precision) {
      // The knob is the CPU's (oneDNN's) fp32 matmul precision, as the
      // recorder reads it; set through the per-backend API, which leaves the
      // CUDA one alone and, unlike the legacy float32MatmulPrecision(), does
      // not throw once a program mixed the legacy and the per-backend API.
      using P = at::Float32Precision;
      const std::string& v = *s.matmul_precision;
      const P want = v == "high" ? P::TF32 : v == "medium" ? P::BF16 : P::IEEE;
      const P now = ctx.float32Precision(at::Float32Backend::MKLDNN, at::Float32Op::MATMUL);
      if (want != now && !(want == P::IEEE && now == P::NONE)) {
        precision_ = now;
        ctx.setFloat32Precision(at::Float32Backend::MKLDNN, at::Float32Op::MATMUL, want);
      }
    }
    if (s.flush_denormal) {
      // After the thread count: every thread the trial's kernels run on.
      flush_ = true;
      set_flush_denormal(*s.flush_denormal);
    }
    sdp_ = {ctx.userEnabledMathSDP(), ctx.userEnabledFlashSDP(), ctx.userEnabledMemEfficientSDP(),
            ctx.userEnabledCuDNNSDP()};
    const formats::SdpBackends sdp = s.sdpa_backend.value_or(recorded_sdp);
    set_sdp(sdp.math, sdp.flash, sdp.efficient, sdp.cudnn);
    // The GPU knobs (validated against a CUDA device when the config was parsed).
    gpu_ = s.tf32_cublas || s.tf32_cudnn || s.cudnn_benchmark || s.cudnn_deterministic || s.fp16_reduction ||
           s.bf16_reduction;
    if (!gpu_) return;
    tf32_cublas_ = ctx.allowTF32CuBLAS();
    tf32_cudnn_ = ctx.allowTF32CuDNN();
    benchmark_ = ctx.benchmarkCuDNN();
    cudnn_deterministic_ = ctx.deterministicCuDNN();
    fp16_reduction_ = ctx.allowFP16ReductionCuBLAS();
    bf16_reduction_ = ctx.allowBF16ReductionCuBLAS();
    if (s.tf32_cublas) ctx.setAllowTF32CuBLAS(*s.tf32_cublas);
    if (s.tf32_cudnn) ctx.setAllowTF32CuDNN(*s.tf32_cudnn);
    if (s.cudnn_benchmark) ctx.setBenchmarkCuDNN(*s.cudnn_benchmark);
    if (s.cudnn_deterministic) ctx.setDeterministicCuDNN(*s.cudnn_deterministic);
    if (s.fp16_reduction) ctx.setAllowFP16ReductionCuBLAS(*s.fp16_reduction);
    if (s.bf16_reduction) ctx.setAllowBF16ReductionCuBLAS(*s.bf16_reduction);
  }
  ~SettingsScope() {
    auto& ctx = at::globalContext();
    // Before the thread count goes back: the trial's threads, all of them.
    if (flush_) set_flush_denormal({});
    if (at::get_num_threads() != threads_) at::set_num_threads(threads_);
    ctx.setUserEnabledMkldnn(mkldnn_);
    ctx.setDeterministicAlgorithms(deterministic_, deterministic_warn_);
    if (precision_) ctx.setFloat32Precision(at::Float32Backend::MKLDNN, at::Float32Op::MATMUL, *precision_);
    set_sdp(sdp_[0], sdp_[1], sdp_[2], sdp_[3]);
    if (!gpu_) return;
    ctx.setAllowTF32CuBLAS(tf32_cublas_);
    ctx.setAllowTF32CuDNN(tf32_cudnn_);
    ctx.setBenchmarkCuDNN(benchmark_);
    ctx.setDeterministicCuDNN(cudnn_deterministic_);
    using R = at::CuBLASReductionOption;
    ctx.setAllowFP16ReductionCuBLAS(fp16_reduction_ == R::AllowReducedPrecisionWithSplitK,
                                    fp16_reduction_ != R::DisallowReducedPrecisionDisallowSplitK);
    ctx.setAllowBF16ReductionCuBLAS(bf16_reduction_ == R::AllowReducedPrecisionWithSplitK,
                                    bf16_reduction_ != R::DisallowReducedPrecisionDisallowSplitK);
  }
  SettingsScope(const SettingsScope&) = delete;
  SettingsScope& operator=(const SettingsScope&) = delete;

 private:
  static void set_sdp(bool math, bool flash, bool efficient, bool cudnn) {
    auto& ctx = at::globalContext();
    ctx.setSDPUseMath(math);
    ctx.setSDPUseFlash(flash);
    ctx.setSDPUseMemEfficient(efficient);
    ctx.setSDPUseCuDNN(cudnn);
  }
  bool gpu_ = false, tf32_cublas_ = false, tf32_cudnn_ = true, benchmark_ = false, cudnn_deterministic_ = false;
  at::CuBLASReductionOption fp16_reduction_{}, bf16_reduction_{};
  std::array<bool, 4> sdp_{};
  int threads_ = 1;
  bool mkldnn_ = true, deterministic_ = false, deterministic_warn_ = false, flush_ = false;
  std::optional<at::Float32Precision> precision_;  // the CPU's matmul precision before, where the trial changed it
};

// The autocast state the event was recorded under, around the call. A CPU
// event replayed on a CUDA device (device=cuda) gets its CPU autocast there.
class AutocastScope {
 public:
  AutocastScope(formats::Autocast a, const std::optional<c10::Device>& device) {
    if (device && device->is_cuda() && !a.cuda) a.cuda = a.cpu;
    std::vector<std::pair<at::DeviceType, std::optional<at::ScalarType>>> wanted;
    for (const auto& [type, dtype] : {std::pair{at::kCPU, a.cpu}, std::pair{at::kCUDA, a.cuda}}) {
      const auto st = dtype ? to_scalar_type(*dtype) : std::nullopt;
      if (dtype && !st)
        throw CannotReplay{CannotReason::kUnsupportedValue, "the op ran under autocast to a dtype this libtorch lacks"};
      wanted.emplace_back(type, st);
    }
    for (const auto& [type, st] : wanted) {
      saved_.push_back({type, at::autocast::is_autocast_enabled(type), at::autocast::get_autocast_dtype(type)});
      at::autocast::set_autocast_enabled(type, st.has_value());
      if (st) at::autocast::set_autocast_dtype(type, *st);
    }
  }
  ~AutocastScope() {
    for (const auto& s : saved_) {
      at::autocast::set_autocast_enabled(s.type, s.enabled);
      at::autocast::set_autocast_dtype(s.type, s.dtype);
    }
    at::autocast::clear_cache();
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  struct Saved {
    at::DeviceType type;
    bool enabled;
    at::ScalarType dtype;
  };
  std::vector<Saved> saved_;
};

// The default dtype the op ran under (torch.set_default_dtype: factory ops
// without a dtype, an int tensor * 0.5), where the event records one; put back
// after the call.
class DefaultDtypeScope {
 public:
  explicit DefaultDtypeScope(std::optional<DType> d) : saved_(c10::get_default_dtype()) {
    if (!d) return;
    const auto st = to_scalar_type(*d);
    if (!st || !at::isFloatingType(*st))
      throw CannotReplay{CannotReason::kUnsupportedValue, "the op ran under a default dtype this libtorch cannot set"};
    c10::set_default_dtype(caffe2::TypeMeta::fromScalarType(*st));
  }
  ~DefaultDtypeScope() { c10::set_default_dtype(saved_); }
  DefaultDtypeScope(const DefaultDtypeScope&) = delete;
  DefaultDtypeScope& operator=(const DefaultDtypeScope&) = delete;

 private:
  caffe2::TypeMeta saved_;
};

// A replayed output copied to the CPU, layout kept (tensors and lists of them).
c10::IValue on_cpu(const c10::IValue& iv) {
  if (iv.isTensor()) {
    const at::Tensor& t = iv.toTensor();
    return t.defined() && !t.device().is_cpu() ? c10::IValue(t.cpu()) : iv;
  }
  if (iv.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : iv.toTensorVector()) out.push_back(t.defined() && !t.device().is_cpu() ? t.cpu() : t);
    return c10::IValue(out);
  }
  if (iv.isTuple()) {
    std::vector<c10::IValue> elems;
    for (const auto& e : iv.toTupleRef().elements()) elems.push_back(on_cpu(e));
    return c10::IValue(c10::ivalue::Tuple::create(std::move(elems)));
  }
  return iv;
}

at::Tensor cast_input(at::Tensor t, const Settings& s) {
  if (!s.dtype || !t.defined() || !at::isFloatingType(t.scalar_type())) return t;
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) return t;  // a Python number stays one
  return t.to(*to_scalar_type(*s.dtype));
}

void add_output(const c10::IValue& iv, std::vector<OutValue>& out, const formats::Event& ev, bool cast_back) {
  OutValue o;
  if (iv.isTensor()) {
    at::Tensor t = iv.toTensor();
    if (!t.defined()) {
      o.kind = ValueKind::kNone;
      o.text = "undefined";
      out.push_back(std::move(o));
      return;
    }
    const std::size_t pos = out.size();
    if (cast_back && pos < ev.outputs.size() && formats::carries_tensor(ev.outputs[pos].kind) &&
        at::isFloatingType(t.scalar_type()))
      if (auto st = to_scalar_type(ev.outputs[pos].tensor.dtype)) t = t.to(*st);
    o.kind = ValueKind::kTensor;
    auto d = to_dtype(t.scalar_type());
    o.sizes.assign(t.sizes().begin(), t.sizes().end());
    if (t.layout() == c10::kStrided) o.strides.assign(t.strides().begin(), t.strides().end());
    if (d && t.layout() == c10::kStrided && t.device().is_cpu() && t.has_storage()) {
      o.dtype = *d;
      at::Tensor c = t.contiguous();
      o.bytes.resize(static_cast<std::size_t>(c.numel()) * c.element_size());
      if (!o.bytes.empty()) std::memcpy(o.bytes.data(), c.const_data_ptr(), o.bytes.size());
      o.bytes_valid = true;
    }
    out.push_back(std::move(o));
    return;
  }
  if (iv.isTensorList() || iv.isList()) {
    if (iv.isIntList() || iv.isDoubleList() || iv.isBoolList()) {
      std::string s = "[";
      if (iv.isIntList()) {
        o.kind = ValueKind::kIntList;
        const auto l = iv.toIntList();
        for (std::size_t i = 0; i < l.size(); ++i) s += (i ? "," : "") + std::to_string(l.get(i));
      } else if (iv.isDoubleList()) {
        o.kind = ValueKind::kDoubleList;
        const auto l = iv.toDoubleList();
        for (std::size_t i = 0; i < l.size(); ++i) s += (i ? "," : "") + hex_double(l.get(i));
      } else {
        o.kind = ValueKind::kBoolList;
        const auto l = iv.toBoolList();
        for (std::size_t i = 0; i < l.size(); ++i) s += std::string(i ? "," : "") + (l.get(i) ? "true" : "false");
      }
      o.text = s + "]";
      out.push_back(std::move(o));
      return;
    }
    const auto list = iv.toListRef();
    if (list.empty()) {
      // Of no telling element type: what the recording has at this place (a
      // fused optimizer's empty Tensor[] of max_exp_avg_sqs without amsgrad),
      // else "[]" as the recorder writes an empty list of numbers.
      const std::size_t pos = out.size();
      const bool tensors = iv.isTensorList() || (pos < ev.outputs.size() && ev.outputs[pos].kind == ValueKind::kTensorList);
      o.kind = tensors ? ValueKind::kTensorList : ValueKind::kIntList;
      o.text = tensors ? "" : "[]";
      out.push_back(std::move(o));
      return;
    }
    o.kind = ValueKind::kTensorList;
    out.push_back(std::move(o));
    for (const auto& e : list) {
      if (e.isTensor()) {
        add_output(e, out, ev, cast_back);
      } else {
        OutValue none;
        none.kind = ValueKind::kNone;
        out.push_back(std::move(none));
      }
    }
    return;
  }
  if (iv.isNone()) {
    o.kind = ValueKind::kNone;
  } else if (iv.isBool()) {
    o.kind = ValueKind::kBool;
    o.text = iv.toBool() ? "true" : "false";
  } else if (iv.isInt()) {
    o.kind = ValueKind::kInt;
    o.text = std::to_string(iv.toInt());
  } else if (iv.isDouble()) {
    o.kind = ValueKind::kDouble;
    o.text = hex_double(iv.toDouble());
  } else if (iv.isComplexDouble()) {
    o.kind = ValueKind::kComplex;
    auto c = iv.toComplexDouble();
    o.text = "(" + hex_double(c.real()) + "," + hex_double(c.imag()) + ")";
  } else if (iv.isString()) {
    o.kind = ValueKind::kString;
    o.text = iv.toStringRef();
  } else if (iv.isDevice()) {
    o.kind = ValueKind::kDevice;
    o.text = iv.toDevice().str();
  } else {
    o.kind = ValueKind::kOther;
    o.text = iv.tagKind();
  }
  out.push_back(std::move(o));
}

// The argument as the op sees it, for CallArg: its layout and its elements in
// row-major order.
OutValue argument_bits(const at::Tensor& t) {
  OutValue o;
  o.kind = ValueKind::kTensor;
  o.sizes.assign(t.sizes().begin(), t.sizes().end());
  if (t.layout() == c10::kStrided) {
    o.strides.assign(t.strides().begin(), t.strides().end());
    o.storage_offset = t.storage_offset();
  }
  auto d = to_dtype(t.scalar_type());
  if (d && t.layout() == c10::kStrided && t.device().is_cpu() && t.has_storage()) {
    o.dtype = *d;
    at::Tensor c = t.contiguous();
    o.bytes.resize(static_cast<std::size_t>(c.numel()) * c.element_size());
    if (!o.bytes.empty()) std::memcpy(o.bytes.data(), c.const_data_ptr(), o.bytes.size());
    o.bytes_valid = true;
  }
  return o;
}

std::string list_text(const c10::IValue& iv) {
  std::vector<OutValue> one;
  formats::Event none;
  add_output(iv, one, none, false);
  return one.empty() ? std::string("[]") : one.front().text;
}

std::string grad_text(const at::Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return "";
  return t.is_leaf() ? "leaf" : "computed";
}

std::vector<CallArg> describe_call(const c10::FunctionSchema& schema, const std::vector<bool>& unreturned,
                                   const torch::jit::Stack& stack,
                                   const std::optional<at::Tensor>& default_state) {
  std::vector<CallArg> out;
  const auto& args = schema.arguments();
  for (std::size_t i = 0; i < stack.size() && i < args.size(); ++i) {
    CallArg a;
    a.name = args[i].name();
    a.type = args[i].real_type()->str();
    a.kwarg_only = args[i].kwarg_only();
    a.written = i < unreturned.size() && unreturned[i];
    const c10::IValue& iv = stack[i];
    const auto inner = unwrap_optional(args[i].real_type());
    if (iv.isTensor()) {
      const at::Tensor& t = iv.toTensor();
      a.kind = !t.defined() ? "none" : t.unsafeGetTensorImpl()->is_wrapped_number() ? "wrapped_number" : "tensor";
      if (t.defined()) {
        a.tensors.push_back(argument_bits(t));
        a.grad.push_back(grad_text(t));
      }
    } else if (iv.isGenerator()) {
      a.kind = "generator";
      a.tensors.push_back(argument_bits(iv.toGenerator().get_state()));
      a.grad.emplace_back();
    } else if (iv.isTensorList()) {
      a.kind = "tensor_list";
      for (const at::Tensor& t : iv.toTensorVector()) {
        a.tensors.push_back(argument_bits(t));
        a.grad.push_back(grad_text(t));
      }
    } else if (iv.isList() && inner->cast<c10::ListType>() &&
               unwrap_optional(inner->cast<c10::ListType>()->getElementType())->kind() == c10::TypeKind::TensorType) {
      a.kind = "optional_tensor_list";
      for (const auto& e : iv.toListRef()) {
        if (e.isTensor() && e.toTensor().defined()) a.tensors.push_back(argument_bits(e.toTensor()));
        else a.tensors.emplace_back();  // kNone
        a.grad.push_back(e.isTensor() ? grad_text(e.toTensor()) : std::string());
      }
    } else if (iv.isIntList() || iv.isDoubleList() || iv.isBoolList() || iv.isList()) {
      const auto elem = inner->cast<c10::ListType>() ? unwrap_optional(inner->cast<c10::ListType>()->getElementType())
                                                    : c10::TypePtr(c10::IntType::get());
      a.kind = iv.isDoubleList() || elem->kind() == c10::TypeKind::FloatType ? "double_list"
               : iv.isBoolList() || elem->kind() == c10::TypeKind::BoolType  ? "bool_list"
                                                                              : "int_list";
      a.text = list_text(iv);
    } else if (iv.isNone()) {
      a.kind = "none";
    } else if (iv.isInt() && inner->kind() == c10::TypeKind::ScalarTypeType) {
      a.kind = "scalar_type";
      a.code = iv.toInt();
      auto d = to_dtype(static_cast<c10::ScalarType>(a.code));
      a.text = d ? std::string(dtype_name(*d)) : std::to_string(a.code);
    } else if (iv.isInt() && inner->kind() == c10::TypeKind::LayoutType) {
      a.kind = "layout";
      a.code = iv.toInt();
      a.text = c10::toString(static_cast<c10::Layout>(a.code));
    } else if (iv.isInt() && inner->kind() == c10::TypeKind::MemoryFormatType) {
      a.kind = "memory_format";
      a.code = iv.toInt();
      std::ostringstream os;
      os << static_cast<c10::MemoryFormat>(a.code);
      a.text = os.str();
    } else {
      std::vector<OutValue> one;
      formats::Event none;
      add_output(iv, one, none, false);
      a.text = one.front().text;
      switch (one.front().kind) {
        case ValueKind::kInt: a.kind = "int"; break;
        case ValueKind::kDouble: a.kind = "double"; break;
        case ValueKind::kBool: a.kind = "bool"; break;
        case ValueKind::kComplex: a.kind = "complex"; break;
        case ValueKind::kString: a.kind = "string"; break;
        case ValueKind::kDevice: a.kind = "device"; break;
        default: a.kind = "other"; break;
      }
    }
    out.push_back(std::move(a));
  }
  if (default_state) {
    CallArg a;
    a.name = "<default_generator>";
    a.kind = "default_generator";
    a.tensors.push_back(argument_bits(*default_state));
    a.grad.emplace_back();
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace

std::string process_cpu_capability() {
  std::string c = at::get_cpu_capability();
  for (char& ch : c) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return c;
}

int process_threads() { return at::get_num_threads(); }

std::vector<std::pair<std::string, std::string>> torch_environment() {
  std::vector<std::pair<std::string, std::string>> env;
  env.emplace_back("torch_version", TORCH_VERSION);
  env.emplace_back("cpu_capability", process_cpu_capability());
  env.emplace_back("threads", std::to_string(at::get_num_threads()));
  // The build settings line of at::show_config(): "KEY=VALUE, KEY=VALUE, ...".
  const std::string config = at::show_config();
  auto setting = [&](const std::string& key) -> std::string {
    const auto at_key = config.find(key + "=");
    if (at_key == std::string::npos) return "";
    const auto begin = at_key + key.size() + 1;
    return config.substr(begin, config.find_first_of(",\n", begin) - begin);
  };
  for (const auto& [name, key] : {std::pair<const char*, const char*>{"cuda_version", "CUDA_VERSION"},
                                  {"cudnn_version", "CUDNN_VERSION"},
                                  {"blas", "BLAS_INFO"}}) {
    const std::string v = setting(key);
    if (!v.empty()) env.emplace_back(name, v);
  }
  if (setting("USE_NCCL") == "1" || setting("USE_NCCL") == "ON")
    env.emplace_back("nccl", "built in (its version is not visible to a CPU trial)");
  const auto dnnl = config.find("MKL-DNN v");
  if (dnnl != std::string::npos)
    env.emplace_back("mkldnn", config.substr(dnnl + 9, config.find_first_of(" \n", dnnl + 9) - dnnl - 9));
  return env;
}

ExecResult execute(const formats::Event& ev, const std::vector<const formats::TensorData*>& data,
                   const Settings& settings) {
  ExecResult result;
  // A recorder in this process (a test linking it, a preload) must not record
  // the replay itself.
  at::RecordFunctionGuard no_recording(false);
  std::optional<c10::OperatorHandle> handle;
  try {
    handle = c10::Dispatcher::singleton().findSchemaOrThrow(ev.op.c_str(), ev.overload.c_str());
  } catch (const c10::Error&) {
    result.reason = CannotReason::kOpUnknown;
    result.message = "this libtorch (" + std::string(TORCH_VERSION) + ") has no operator " +
                     formats::op_text(ev.op, ev.overload);
    return result;
  }
  const auto& schema = handle->schema();
  const auto& args = schema.arguments();
  const std::vector<bool> unreturned = written_not_returned(schema);
  try {
    torch::jit::Stack stack;
    std::optional<at::Tensor> default_state;
    const std::optional<c10::Device> device =
        settings.device ? std::optional<c10::Device>(c10::Device(*settings.device)) : std::nullopt;
    const auto shared = shared_storages(ev, data, device);
    std::vector<std::pair<std::size_t, at::Tensor>> mutated;  // ev.inputs index, the tensor the op writes
    auto shared_of = [&](const TensorMeta& m) -> const at::Tensor* {
      auto it = shared.find(m.storage_id);
      return m.storage_id != 0 && it != shared.end() ? &it->second : nullptr;
    };
    std::size_t arg = 0;
    for (std::size_t i = 0; i < ev.inputs.size(); ++i) {
      const Value& v = ev.inputs[i];
      if (v.kind == ValueKind::kGenerator && device)
        throw CannotReplay{CannotReason::kUnsupportedValue,
                           "the op draws random numbers from a CPU generator whose state the recording holds; "
                           "CUDA's generator is another algorithm, so it replays on the CPU only"};
      if (v.kind == ValueKind::kGenerator && v.name == "<default_generator>") {
        default_state = state_tensor(v, data[i]);
        continue;
      }
      if (arg >= args.size())
        throw CannotReplay{CannotReason::kUnsupportedValue,
                           "the event has more arguments than the schema " + ev.schema};
      const auto& type = args[arg].real_type();
      ++arg;
      if (v.kind == ValueKind::kTensor) {
        stack.emplace_back(cast_input(
            make_tensor(v.tensor, data[i], "argument '" + v.name + "'", shared_of(v.tensor), device), settings));
        if (v.mutated) mutated.emplace_back(i, stack.back().toTensor());
      } else if (v.kind == ValueKind::kGenerator) {
        auto gen = at::detail::createCPUGenerator();
        gen.set_state(state_tensor(v, data[i]));
        stack.emplace_back(gen);
      } else if (v.kind == ValueKind::kTensorList) {
        const auto list_type = unwrap_optional(type)->cast<c10::ListType>();
        const bool optional_elems = list_type && list_type->getElementType()->cast<c10::OptionalType>();
        c10::List<std::optional<at::Tensor>> opt_list;
        c10::List<at::Tensor> list;
        for (int32_t k = 0; k < v.list_len; ++k) {
          ++i;
          if (i >= ev.inputs.size())
            throw CannotReplay{CannotReason::kUnsupportedValue, "tensor list '" + v.name + "' is truncated"};
          const Value& e = ev.inputs[i];
          at::Tensor t;
          if (e.kind == ValueKind::kTensor)
            t = cast_input(make_tensor(e.tensor, data[i], "element of '" + v.name + "'", shared_of(e.tensor), device),
                           settings);
          if (t.defined() && (v.mutated || e.mutated)) mutated.emplace_back(i, t);
          if (optional_elems) {
            opt_list.push_back(t.defined() ? std::optional<at::Tensor>(t) : std::nullopt);
          } else {
            list.push_back(t);
          }
        }
        if (optional_elems) stack.emplace_back(opt_list);
        else stack.emplace_back(list);
      } else {
        stack.push_back(scalar_ivalue(v, type));
        // A factory op's device= follows the trial's device.
        if (device && stack.back().isDevice() && stack.back().toDevice().is_cpu()) stack.back() = c10::IValue(*device);
      }
    }
    for (; arg < args.size(); ++arg) {
      if (!args[arg].default_value())
        throw CannotReplay{CannotReason::kUnsupportedValue,
                           "argument '" + args[arg].name() + "' is neither recorded nor defaulted"};
      stack.push_back(*args[arg].default_value());
    }
    if (settings.capture_call) result.call = describe_call(schema, unreturned, stack, default_state);
    // The arguments the op writes and does not return: the recorder appends
    // them, as the op left them, to the outputs; so does the replay.
    std::vector<c10::IValue> written;
    for (std::size_t a = 0; a < stack.size() && a < unreturned.size(); ++a)
      if (unreturned[a]) written.push_back(stack[a]);
    SettingsScope scope(settings, formats::sdp_backends_of(ev.flags));
    AutocastScope autocast(formats::autocast_of(ev.flags), device);
    DefaultDtypeScope default_dtype(formats::default_dtype_of(ev.flags));
    // The grad mode the op ran under: with inputs that require grad it
    // decides kernels too (see grad_of).
    at::AutoGradMode grad_mode((ev.flags & formats::kEventGradMode) != 0);
    if (default_state) {
      auto gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(*default_state);
    }
    const auto t0 = std::chrono::steady_clock::now();
    try {
      if (!run_decomposed(ev, settings, stack, &result.note)) handle->callBoxed(stack);
    } catch (const std::exception& e) {
      result.reason = CannotReason::kOpFailed;
      std::string what = e.what();
      const auto nl = what.find('\n');
      result.message = ev.op + " failed when replayed: " + (nl == std::string::npos ? what : what.substr(0, nl));
      return result;
    }
    for (auto& iv : written) stack.push_back(std::move(iv));
    if (device) {
      // Outputs come back to the CPU to be compared (the copy waits for the device).
      for (auto& iv : stack) iv = on_cpu(iv);
    }
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (const auto& iv : stack) add_output(iv, result.outputs, ev, settings.dtype.has_value());
    for (auto& [index, t] : mutated) {
      at::Tensor after = device ? t.cpu() : t;
      if (settings.dtype && at::isFloatingType(after.scalar_type()))
        if (auto st = to_scalar_type(ev.inputs[index].tensor.dtype)) after = after.to(*st);
      result.mutated.emplace_back(index, argument_bits(after));
    }
  } catch (const CannotReplay& c) {
    result.reason = c.reason;
    result.message = c.message;
  } catch (const c10::Error& e) {
    result.reason = CannotReason::kUnsupportedValue;
    std::string what = e.what();
    result.message = "rebuilding the arguments failed: " + what.substr(0, what.find('\n'));
  }
  return result;
}

}  // namespace opguard::replay::detail
