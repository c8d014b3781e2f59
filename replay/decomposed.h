#pragma once
// Parallelism knobs (tp, microbatches, reduce) applied to a recorded op: the op
// is computed the way a tensor-parallel or micro-batched run computes it, on
// shards of its reduction dimension, and the partial results are summed in the
// chosen order by kernels/decompose (docs/KERNELS.md). Private to
// opguard_replay; included only by the torch-including execute.cpp.

#include <ATen/core/stack.h>

#include <optional>
#include <string>

#include "opguard/formats/recording.h"

namespace opguard::replay::detail {

struct Settings;

// Whether `settings` sets a parallelism knob at all.
bool has_parallelism_knob(const Settings& settings);

// `stack` holds the op's arguments. When a parallelism knob applies to `ev`,
// computes the decomposed result, leaves the outputs on `stack` (as callBoxed
// would) and returns true; otherwise leaves `stack` alone and returns false,
// and the caller runs the op as it is. Either way `*note` says what the knob
// did or why it does not apply to this op (one sentence). Throws what the
// partial ops throw (the caller reports it as the op failing).
bool run_decomposed(const formats::Event& ev, const Settings& settings, torch::jit::Stack& stack,
                    std::string* note);

}  // namespace opguard::replay::detail
