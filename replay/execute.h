#pragma once
// The torch side of replay behind a torch-free interface: execute.cpp is the
// one file of opguard_replay that includes the dispatcher (STYLE.md, build
// speed). Everything else (finding events, reading tensors, comparing,
// child processes, JSON) stays out of torch's headers.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "opguard/formats/recording.h"
#include "opguard/replay/replay.h"
#include "replay_internal.h"

namespace opguard::replay::detail {

// The in-process knobs of one trial; unset means "leave as it is".
struct Settings {
  std::optional<int> threads;
  std::optional<bool> mkldnn;
  std::optional<bool> deterministic;
  std::optional<FlushDenormal> flush_denormal;
  std::optional<std::string> matmul_precision;  // highest | high | medium
  std::optional<DType> dtype;                   // cast floating inputs, cast outputs back
  bool capture_call = false;                    // fill ExecResult::call
  // Parallelism knobs (decomposed.h): shards of a matmul's reduction dimension,
  // micro-batches of a gradient over the batch, and the order partials are
  // summed in (sequential | ring | tree).
  std::optional<int> tp, microbatches;
  std::optional<std::string> reduce;
  // device=cuda:N: inputs are rebuilt on the CPU and copied there, outputs
  // copied back before they are compared. The GPU knobs apply around the call.
  std::optional<std::string> device;
  std::optional<bool> tf32_cublas, tf32_cudnn, cudnn_benchmark, cudnn_deterministic;
  std::optional<bool> fp16_reduction, bf16_reduction;  // reduced_precision_reduction, set together
  // The scaled_dot_product_attention backends enabled; unset: those the
  // event records (all of them in recordings made before it did).
  std::optional<formats::SdpBackends> sdpa_backend;
};

// One output value, flattened like the recorder flattens them (a tensor list
// is a kTensorList header followed by its elements).
struct OutValue {
  formats::ValueKind kind = formats::ValueKind::kNone;
  std::string text;  // non-tensors, formatted as the recorder formats them
  DType dtype = DType::kFloat32;
  std::vector<int64_t> sizes, strides;
  std::vector<uint8_t> bytes;  // tensors: row-major contiguous
  bool bytes_valid = false;    // false: a dtype or device opguard cannot read back
  int64_t storage_offset = 0;  // set for the arguments of CallArg only
};

// One argument exactly as the op received it (Settings::capture_call), for the
// repro bundle: after defaults are filled in, slices applied and, with a dtype
// knob, inputs cast.
struct CallArg {
  std::string name;  // schema argument name; "<default_generator>": the default CPU generator's state
  std::string type;  // schema type as text ("Tensor", "int[1]", "ScalarType?")
  bool kwarg_only = false;
  // tensor, tensor_list, optional_tensor_list, none, int, double, bool,
  // complex, string, int_list, double_list, bool_list, scalar_type, layout,
  // memory_format, device, generator, default_generator
  std::string kind;
  std::string text;   // scalars: doubles in C99 hex, scalar types by dtype name, lists "[a,b]"
  int64_t code = 0;   // scalar_type, layout, memory_format: the enum's integer value
  bool written = false;  // the op writes it and does not return it (core/written_arguments.h)
  std::vector<OutValue> tensors;  // the tensor, the list's elements (kNone for None), the generator state
  // Per element of `tensors`: "leaf" (requires grad, a leaf), "computed"
  // (requires grad, computed by an op autograd recorded) or "".
  std::vector<std::string> grad;
};

struct ExecResult {
  CannotReason reason = CannotReason::kNone;  // kNone: the op ran
  std::string message;
  std::vector<OutValue> outputs;
  double seconds = 0.0;
  std::vector<CallArg> call;  // with Settings::capture_call, when the op ran
  std::string note;  // what a parallelism knob did, or why it does not apply to this op
  // The arguments the schema marks as written (Value::mutated; tensor-list
  // elements too), as they are after the call: index into ev.inputs and the
  // bits (cast back to the recorded dtype under a dtype knob). Free-running
  // windows feed them to later readers.
  std::vector<std::pair<std::size_t, OutValue>> mutated;
};

// `data[i]` holds the full contents of ev.inputs[i] (row-major) or is null:
// then the input is an uninitialised buffer (allocated, contents unspecified)
// or not a tensor. The caller has checked that every tensor input with
// observable bits has its data.
ExecResult execute(const formats::Event& ev, const std::vector<const formats::TensorData*>& data,
                   const Settings& settings);

// at::get_cpu_capability() in lower case ("avx2"), as ATEN_CPU_CAPABILITY spells it.
std::string process_cpu_capability();
int process_threads();

// What this process's libtorch is and runs on, for the repro bundle's
// manifest: torch_version, cpu_capability, threads, and from the build
// configuration cuda_version, cudnn_version, blas, mkldnn, nccl ("built in"
// or absent).
std::vector<std::pair<std::string, std::string>> torch_environment();

}  // namespace opguard::replay::detail
