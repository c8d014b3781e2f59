#include "collectives.h"

#include <ATen/record_function.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <cstring>

namespace opguard::record {

bool is_collective(const char* op_name) { return op_name != nullptr && std::strncmp(op_name, "c10d::", 6) == 0; }

std::vector<at::Tensor> wait_for_collective(const std::vector<c10::IValue>& outputs) {
  // Whatever wait() dispatches is not the program's.
  at::RecordFunctionGuard no_recording(false);
  std::vector<at::Tensor> written;
  for (const c10::IValue& value : outputs) {
    if (value.isTensor()) written.push_back(value.toTensor());
    if (value.isTensorList()) {
      for (const at::Tensor& t : value.toTensorVector()) written.push_back(t);
    }
    // A Work is a TorchScript custom-class object: one slot holding a capsule.
    if (!value.isObject()) continue;
    const c10::ivalue::Object& object = value.toObjectRef();
    if (object.slots().size() != 1 || !object.getSlot(0).isCapsule()) continue;
    auto* work = dynamic_cast<c10d::Work*>(object.getSlot(0).toCapsule().get());
    if (work == nullptr) continue;
    try {
      work->wait();
    } catch (...) {
    }
  }
  return written;
}

}  // namespace opguard::record
