#pragma once
// Replaying the all-reduces of a multi-rank recording (docs/KERNELS.md, "NCCL"):
// the i-th c10d::allreduce_ of every rank is one collective; its recorded
// inputs (every rank's, recorded in full with --dump-ops '^c10d::allreduce_$')
// are summed again by kernels::reduce_partials in each emulated order and,
// where this build has NCCL and the machine enough GPUs, by NCCL under chosen
// NCCL_ALGO / NCCL_PROTO; each result is compared bitwise with the recorded
// output. Torch-free. The reduce op is taken to be SUM (the recorder stores
// c10d's ReduceOp as an opaque object; all_reduce's default).

#include <cstdint>
#include <string>
#include <vector>

namespace opguard::replay {

struct AllreduceTrial {
  std::string how;        // "emulated sequential", "emulated ring", "nccl Ring/Simple", ...
  bool ran = true;        // false: not possible here (why in `note`)
  bool equal = false;     // every byte equal to the recorded output
  int64_t differing = 0;  // elements whose bits differ from the recorded output
  std::string note;
};

struct AllreduceReplay {
  int64_t index = 0;  // the index-th all-reduce of each rank
  int64_t step = 0;
  std::vector<std::string> events;  // its event id on each rank
  std::string dtype;
  int64_t numel = 0;
  bool outputs_agree = true;  // every rank recorded the same output bits
  std::vector<AllreduceTrial> trials;
};

struct AllreduceOptions {
  // NCCL trials, "ALGO/PROTO" each ("Ring/Simple", "Tree/LL"; "" for NCCL's
  // own choice). Empty: no NCCL trial.
  std::vector<std::string> nccl_configs;
};

// Every all-reduce whose tensor input every rank holds in full. Throws
// UsageError when the ranks recorded different numbers of all-reduces or none
// holds its inputs, FormatError for a bad recording.
std::vector<AllreduceReplay> replay_allreduces(const std::string& recording_dir, const AllreduceOptions& options = {});

}  // namespace opguard::replay
