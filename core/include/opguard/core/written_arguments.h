// The arguments an operator writes and does not return, by its schema's alias
// annotations: `Tensor(a!)[] self` of `_foreach_add_(...) -> ()`, or
// `Tensor(a!) running_mean` of a batch norm that returns other tensors (an
// in-place op returning `Tensor(a!)` returns what it writes). The recorder
// appends their state after the op to the event's outputs (docs/FORMAT.md,
// "/events"), so that an op whose only result is what it writes in place is
// compared like any other; replay and the repro bundles return them in the
// same places. One rule for all of them, here.
//
// Header-only, and only for files that include torch (record/recorder.cpp,
// replay/execute.cpp): opguard_core itself does not.
#pragma once

#include <ATen/core/function_schema.h>

#include <vector>

namespace opguard {

inline std::vector<bool> written_not_returned(const c10::FunctionSchema& schema) {
  std::vector<bool> out;
  for (const auto& arg : schema.arguments()) {
    const c10::AliasInfo* alias = arg.alias_info();
    bool returned = false;
    if (alias != nullptr && alias->isWrite()) {
      for (const auto& ret : schema.returns()) {
        const c10::AliasInfo* r = ret.alias_info();
        if (r == nullptr) continue;
        for (const auto& set : alias->beforeSets()) returned = returned || r->beforeSets().count(set) > 0;
      }
    }
    out.push_back(alias != nullptr && alias->isWrite() && !returned);
  }
  return out;
}

}  // namespace opguard
