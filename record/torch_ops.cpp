// torch.ops.opguard.*: the recorder's controls as dispatcher operators, so a
// Python program reaches them after torch.ops.load_library(libopguard_record.so).

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "opguard/core/error.h"
#include "opguard/record/recorder.h"
#include "recorder_internal.h"

namespace opguard::record {
namespace {

void op_start(std::string out, std::string policy, std::string queue, bool strict) {
  RecorderOptions options;
  options.out_dir = std::move(out);
  options.policy = std::move(policy);
  options.queue = std::move(queue);
  options.strict = strict;
  Recorder::start(options);
}

void op_stop() { Recorder::stop(); }
void op_step() { Recorder::step(); }
bool op_active() { return Recorder::active(); }
// The event itself is the record: the hook sees this call with its tensor.
void op_mark(const at::Tensor&, std::string) {}

}  // namespace

void mark_tensor(const at::Tensor& tensor, const std::string& name) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("opguard::mark", "")
                       .typed<void(const at::Tensor&, std::string)>();
  op.call(tensor, name);
}

}  // namespace opguard::record

TORCH_LIBRARY(opguard, m) {
  m.def("start(str out, str policy='', str queue='', bool strict=False) -> ()",
        &opguard::record::op_start);
  m.def("stop() -> ()", &opguard::record::op_stop);
  m.def("step() -> ()", &opguard::record::op_step);
  m.def("active() -> bool", &opguard::record::op_active);
  m.def("mark(Tensor tensor, str name) -> ()", &opguard::record::op_mark);
}
