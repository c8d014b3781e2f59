// The all-reduces of a multi-rank recording, summed again (allreduce.h).

#include "opguard/replay/allreduce.h"

#include <fmt/format.h>

#include <cstring>

#include "opguard/core/error.h"
#include "opguard/formats/recording.h"
#include "opguard/kernels/decompose.h"
#include "opguard/kernels/nccl.h"

namespace opguard::replay {
namespace {

// One rank's view of one all-reduce: input 0 is the tensor-list header, 1 its
// tensor; outputs likewise.
struct Collective {
  std::string event;
  int64_t step = 0;
  DType dtype = DType::kFloat32;
  int64_t numel = 0;
  bool full = false;  // input and output recorded in full
  std::vector<uint8_t> input, output;
};

std::vector<Collective> collectives_of(const formats::RankFiles& files) {
  std::vector<Collective> out;
  for (const auto& [step, path] : files.steps) {
    formats::StepReader reader(path);
    for (const auto& ev : reader.events()) {
      if (ev.op != "c10d::allreduce_") continue;
      Collective c;
      c.event = formats::event_id_string(ev.id);
      c.step = ev.step;
      if (ev.inputs.size() >= 2 && ev.outputs.size() >= 2 && ev.inputs[1].kind == formats::ValueKind::kTensor &&
          ev.outputs[1].kind == formats::ValueKind::kTensor) {
        const auto& in = ev.inputs[1].tensor;
        const auto& res = ev.outputs[1].tensor;
        c.dtype = in.dtype;
        c.numel = in.numel();
        c.full = (in.flags & formats::kTensorHasData) && (res.flags & formats::kTensorHasData) && in.numel() == res.numel();
        if (c.full) {
          c.input = reader.read_tensor(in).bytes;
          c.output = reader.read_tensor(res).bytes;
        }
      }
      out.push_back(std::move(c));
    }
  }
  return out;
}

int64_t differing_elements(const std::vector<uint8_t>& a, const uint8_t* b, std::size_t element_size) {
  int64_t n = 0;
  for (std::size_t i = 0; i + element_size <= a.size(); i += element_size)
    n += std::memcmp(a.data() + i, b + i, element_size) != 0;
  return n;
}

AllreduceTrial judged(std::string how, const std::vector<uint8_t>& recorded, const uint8_t* got, std::size_t es) {
  AllreduceTrial t;
  t.how = std::move(how);
  t.differing = differing_elements(recorded, got, es);
  t.equal = t.differing == 0;
  return t;
}

AllreduceTrial not_ran(std::string how, const char* why) {
  AllreduceTrial t;
  t.how = std::move(how);
  t.ran = false;
  t.note = why;
  return t;
}

}  // namespace

std::vector<AllreduceReplay> replay_allreduces(const std::string& dir, const AllreduceOptions& options) {
  const auto layout = formats::scan_recording(dir);
  const int world = static_cast<int>(layout.ranks.size());
  if (world < 2) throw UsageError(fmt::format("{} has {} rank(s); an all-reduce replay needs a multi-rank recording", dir, world));
  std::vector<std::vector<Collective>> per_rank;
  for (const auto& r : layout.ranks) per_rank.push_back(collectives_of(r));
  for (int r = 1; r < world; ++r)
    if (per_rank[r].size() != per_rank[0].size())
      throw UsageError(fmt::format("rank {} of {} recorded {} all-reduces and rank {} {}: the ranks do not line up",
                                   layout.ranks[r].rank, dir, per_rank[r].size(), layout.ranks[0].rank,
                                   per_rank[0].size()));
  std::vector<AllreduceReplay> out;
  for (std::size_t i = 0; i < per_rank[0].size(); ++i) {
    bool full = true;
    for (int r = 0; r < world; ++r) {
      const auto& c = per_rank[r][i];
      full = full && c.full && c.dtype == per_rank[0][i].dtype && c.numel == per_rank[0][i].numel;
    }
    if (!full) continue;
    const Collective& first = per_rank[0][i];
    AllreduceReplay rep;
    rep.index = static_cast<int64_t>(i);
    rep.step = first.step;
    rep.dtype = std::string(dtype_name(first.dtype));
    rep.numel = first.numel;
    std::vector<const void*> inputs;
    for (int r = 0; r < world; ++r) {
      rep.events.push_back(per_rank[r][i].event);
      rep.outputs_agree = rep.outputs_agree && per_rank[r][i].output == first.output;
      inputs.push_back(per_rank[r][i].input.data());
    }
    const std::size_t es = dtype_size(first.dtype);
    std::vector<uint8_t> got(first.output.size());
    for (auto order : {kernels::ReduceOrder::kSequential, kernels::ReduceOrder::kRing, kernels::ReduceOrder::kTree}) {
      const std::string how = "emulated " + std::string(kernels::reduce_order_name(order));
      try {
        kernels::reduce_partials(first.dtype, inputs.data(), world, first.numel, {order}, got.data());
        rep.trials.push_back(judged(how, first.output, got.data(), es));
      } catch (const UsageError& e) {
        rep.trials.push_back(not_ran(how, e.what()));
      }
    }
    for (const auto& cfg : options.nccl_configs) {
      const auto slash = cfg.find('/');
      kernels::NcclOptions nccl;
      nccl.algo = cfg.substr(0, slash);
      if (slash != std::string::npos) nccl.proto = cfg.substr(slash + 1);
      const std::string how = "nccl " + (cfg.empty() ? std::string("default") : cfg);
      try {
        const auto res = kernels::nccl_allreduce(first.dtype, inputs.data(), world, first.numel, nccl);
        rep.trials.push_back(judged(how, first.output, res.front().data(), es));
      } catch (const Error& e) {
        rep.trials.push_back(not_ran(how, e.what()));
      }
    }
    out.push_back(std::move(rep));
  }
  if (out.empty())
    throw UsageError(fmt::format("{} holds no all-reduce whose inputs every rank recorded in full: re-record with "
                                 "--dump-ops '^c10d::allreduce_$'", dir));
  return out;
}

}  // namespace opguard::replay
