// Parallelism knobs on one device (docs/KERNELS.md, "Decompositions"). Which
// ops a knob applies to, and why:
//
//   tp=P          splits the contraction (reduction) dimension of mm, addmm,
//                 linear, matmul and bmm into P shards, as a row-parallel
//                 linear splits its input features (or a column-parallel one
//                 the output features of its input gradient). Each partial is
//                 the op itself on the shards (views of the recorded inputs);
//                 addmm's `self` and linear's `bias` are added once, after the
//                 sum, as Megatron's RowParallelLinear adds its bias.
//   microbatches=M  splits the batch of a gradient reduction over the batch
//                 into M micro-batches: in the backward phase, an mm or matmul
//                 whose first operand is a transposed matrix (autograd's weight
//                 gradient, dW = dY^T X, contracts over the batch rows) and a
//                 sum.dim_IntList over dimension 0 (a bias gradient).
//   reduce=ORDER  the order the P or M partials are summed in; default ring for
//                 tp (an all-reduce), sequential for microbatches (gradient
//                 accumulation).
//
// A backward weight gradient is batch-split, never tp-split, and a forward or
// input-gradient matmul the other way round: a knob set for the other kind
// says so in the note and the op runs as recorded.

#include "decomposed.h"

#include <ATen/ATen.h>

#include <functional>
#include <vector>

#include "execute.h"
#include "opguard/kernels/decompose.h"

namespace opguard::replay::detail {
namespace {

enum class Split { kFeature, kBatch };

std::optional<DType> reducible_dtype(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return DType::kFloat32;
    case c10::ScalarType::Double: return DType::kFloat64;
    case c10::ScalarType::BFloat16: return DType::kBFloat16;
    default: return std::nullopt;
  }
}

// One decomposable op: the operands whose shared dimension is split, and how
// a partial and the final result are computed.
struct Form {
  Split split = Split::kFeature;
  at::Tensor a, b;  // b undefined: a single-operand reduction (sum)
  int64_t a_dim = 0, b_dim = 0;
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> partial;
  std::function<at::Tensor(const at::Tensor&)> finish = [](const at::Tensor& s) { return s; };
  std::string partial_op;
};

bool is_transposed_matrix(const at::Tensor& t) {
  return t.dim() == 2 && t.size(0) > 1 && t.stride(0) == 1 && t.stride(1) >= t.size(0);
}

// The decomposable form of `ev`, or nullopt with *why set.
std::optional<Form> form_of(const formats::Event& ev, const torch::jit::Stack& stack, std::string* why) {
  const std::string op = formats::op_text(ev.op, ev.overload);
  const bool backward = ev.phase == formats::Phase::kBackward;
  auto tensor_at = [&](std::size_t i) -> at::Tensor {
    return i < stack.size() && stack[i].isTensor() ? stack[i].toTensor() : at::Tensor();
  };
  Form f;
  if (op == "aten::mm" || op == "aten::bmm" || op == "aten::matmul") {
    f.a = tensor_at(0);
    f.b = tensor_at(1);
    if (!f.a.defined() || !f.b.defined() || f.a.dim() < 1 || f.b.dim() < 1) {
      *why = op + " has no two tensor operands";
      return std::nullopt;
    }
    f.a_dim = f.a.dim() - 1;
    f.b_dim = f.b.dim() == 1 ? 0 : f.b.dim() - 2;
    f.partial_op = op;
    if (op == "aten::mm") f.partial = [](const at::Tensor& x, const at::Tensor& y) { return at::mm(x, y); };
    else if (op == "aten::bmm") f.partial = [](const at::Tensor& x, const at::Tensor& y) { return at::bmm(x, y); };
    else f.partial = [](const at::Tensor& x, const at::Tensor& y) { return at::matmul(x, y); };
    if (backward && op != "aten::bmm" && is_transposed_matrix(f.a)) f.split = Split::kBatch;
    return f;
  }
  if (op == "aten::addmm") {
    const at::Tensor self = tensor_at(0);
    f.a = tensor_at(1);
    f.b = tensor_at(2);
    if (!self.defined() || !f.a.defined() || !f.b.defined() || stack.size() < 5) {
      *why = "aten::addmm has not the arguments of its schema";
      return std::nullopt;
    }
    const c10::Scalar beta = stack[3].toScalar(), alpha = stack[4].toScalar();
    f.a_dim = 1;
    f.b_dim = 0;
    f.partial_op = "aten::mm";
    f.partial = [](const at::Tensor& x, const at::Tensor& y) { return at::mm(x, y); };
    f.finish = [self, beta, alpha](const at::Tensor& s) {
      const at::Tensor scaled = alpha.equal(1) ? s : at::mul(s, alpha);
      return beta.equal(0) ? scaled : at::add(scaled, self, beta);
    };
    if (backward && is_transposed_matrix(f.a)) f.split = Split::kBatch;
    return f;
  }
  if (op == "aten::linear") {
    f.a = tensor_at(0);
    f.b = tensor_at(1);
    const at::Tensor bias = tensor_at(2);
    if (!f.a.defined() || !f.b.defined() || f.a.dim() < 1 || f.b.dim() != 2) {
      *why = "aten::linear has not the arguments of its schema";
      return std::nullopt;
    }
    f.a_dim = f.a.dim() - 1;
    f.b_dim = 1;
    f.partial_op = "aten::linear without bias";
    f.partial = [](const at::Tensor& x, const at::Tensor& w) { return at::linear(x, w); };
    if (bias.defined()) f.finish = [bias](const at::Tensor& s) { return at::add(s, bias); };
    return f;
  }
  if (op == "aten::sum.dim_IntList" && backward) {
    f.a = tensor_at(0);
    if (!f.a.defined() || f.a.dim() < 1 || stack.size() < 4) {
      *why = "aten::sum.dim_IntList has not the arguments of its schema";
      return std::nullopt;
    }
    std::vector<int64_t> dims;
    if (!stack[1].isNone()) dims = stack[1].toIntVector();
    bool over_batch = dims.empty();  // an empty dim list sums everything
    for (int64_t d : dims) over_batch = over_batch || d == 0 || d == -f.a.dim();
    if (!over_batch) {
      *why = "this sum does not reduce dimension 0 (the batch)";
      return std::nullopt;
    }
    const bool keepdim = stack[2].toBool();
    const std::optional<c10::ScalarType> dtype =
        stack[3].isNone() ? std::nullopt : std::optional<c10::ScalarType>(stack[3].toScalarType());
    f.split = Split::kBatch;
    f.a_dim = 0;
    f.partial_op = "aten::sum.dim_IntList";
    f.partial = [dims, keepdim, dtype](const at::Tensor& x, const at::Tensor&) {
      return at::sum(x, dims.empty() ? at::OptionalIntArrayRef() : at::OptionalIntArrayRef(dims), keepdim, dtype);
    };
    return f;
  }
  *why = op + " is not decomposed (tp: mm, addmm, linear, matmul, bmm; microbatches: backward weight gradients "
              "(mm/matmul/addmm of a transposed matrix) and sums over dimension 0)";
  return std::nullopt;
}

}  // namespace

bool has_parallelism_knob(const Settings& s) { return s.tp || s.microbatches || s.reduce; }

bool run_decomposed(const formats::Event& ev, const Settings& s, torch::jit::Stack& stack, std::string* note) {
  // std::string rather than {fmt}: this file sees torch's bundled fmt headers.
  using std::to_string;
  note->clear();
  if (!has_parallelism_knob(s)) return false;
  const std::string op = formats::op_text(ev.op, ev.overload);
  if (!s.tp && !s.microbatches) {
    *note = "reduce=" + *s.reduce + " has no effect without tp or microbatches: " + op + " ran as recorded";
    return false;
  }
  std::string set_knobs;
  if (s.tp) set_knobs += "tp=" + to_string(*s.tp);
  if (s.microbatches) set_knobs += (set_knobs.empty() ? "" : ",") + std::string("microbatches=") + to_string(*s.microbatches);
  std::string why;
  auto form = form_of(ev, stack, &why);
  if (!form) {
    *note = set_knobs + " does not apply: " + why + "; it ran as recorded";
    return false;
  }
  const bool batch = form->split == Split::kBatch;
  const std::optional<int> parts = batch ? s.microbatches : s.tp;
  if (!parts) {
    *note = batch ? "tp=" + to_string(*s.tp) + " does not apply: " + op +
                        " here is a gradient reduced over the batch (microbatches=M splits it); it ran as recorded"
                  : "microbatches=" + to_string(*s.microbatches) + " does not apply: " + op +
                        " here reduces over features, not the batch (tp=P splits it); it ran as recorded";
    return false;
  }
  const std::string knob = std::string(batch ? "microbatches=" : "tp=") + to_string(*parts);
  if (*parts == 1) {
    *note = knob + ": one shard is the undecomposed op; " + op + " ran as recorded";
    return false;
  }
  const int64_t k = form->a.size(form->a_dim);
  if (form->b.defined() && form->b.size(form->b_dim) != k) {
    *note = knob + " does not apply: the operands of " + op + " disagree in their reduction dimension; it ran as "
            "recorded";
    return false;
  }
  if (k < *parts) {
    *note = knob + " does not apply: the reduction dimension of " + op + " has only " + to_string(k) +
            " elements; it ran as recorded";
    return false;
  }
  kernels::ReduceSpec spec;
  spec.order = batch ? kernels::ReduceOrder::kSequential : kernels::ReduceOrder::kRing;
  if (s.reduce) spec.order = *kernels::reduce_order_from_name(*s.reduce);  // Config::parse checked the name
  std::vector<at::Tensor> partials;
  std::string sizes;
  for (int r = 0; r < *parts; ++r) {
    const auto sh = kernels::shard_of(k, *parts, r);
    const at::Tensor a = form->a.narrow(form->a_dim, sh.begin, sh.end - sh.begin);
    const at::Tensor b = form->b.defined() ? form->b.narrow(form->b_dim, sh.begin, sh.end - sh.begin) : at::Tensor();
    partials.push_back(form->partial(a, b).contiguous());
    sizes += (r ? "," : "") + to_string(sh.end - sh.begin);
  }
  const auto dtype = reducible_dtype(partials.front().scalar_type());
  if (!dtype) {
    *note = knob + " does not apply: emulated reductions sum float32, float64 and bfloat16, not " +
            std::string(c10::toString(partials.front().scalar_type())) + "; " + op + " ran as recorded";
    return false;
  }
  std::vector<const void*> ptrs;
  for (const auto& p : partials) ptrs.push_back(p.const_data_ptr());
  at::Tensor sum = at::empty_like(partials.front());
  kernels::reduce_partials(*dtype, ptrs.data(), *parts, sum.numel(), spec, sum.data_ptr());
  stack.clear();
  stack.emplace_back(form->finish(sum));
  const std::string order(kernels::reduce_order_name(spec.order));
  *note = knob + " reduce=" + order + ": " + op + " computed as " + to_string(*parts) + " partials of " +
          form->partial_op + " over shards [" + sizes + "] of its " + to_string(k) +
          (batch ? " batch rows" : " reduction elements") + ", summed in " + order + " order";
  return true;
}

}  // namespace opguard::replay::detail
