#pragma once
// c10d collectives are dispatcher ops (c10d::allreduce_, c10d::broadcast_, ...)
// that return a Work handle before the backend has written their outputs: Gloo
// runs the collective on its own thread. The recorder fingerprints outputs in
// the op's end callback, so it waits for the Work first; otherwise an
// all-reduce's recorded output would be its input, or a torn mix of both.

#include <vector>

namespace at {
class Tensor;
}
namespace c10 {
class IValue;
}

namespace opguard::record {

// True for ops whose outputs a backend writes after the op returns.
bool is_collective(const char* op_name);

// Waits for every c10d Work among an op's outputs and returns the output
// tensors (also those inside tensor lists): the backend wrote them without
// bumping their version counters, so hashes cached for their storages are
// stale. Never throws: a failed collective fails again in the program's own
// wait(). Waiting changes when the training thread blocks, not what it computes.
std::vector<at::Tensor> wait_for_collective(const std::vector<c10::IValue>& outputs);

}  // namespace opguard::record
