// bisect shrink: cut the event's tensor inputs down, one dimension at a time,
// while the good and the bad config still give different bits. Per dimension:
// halve (keep the first half, else the second), and when neither half keeps
// the divergence, cut smaller pieces (a quarter, an eighth, ... one element)
// from either end. Every dimension of the same size and window is cut with
// it (see cut() below); a cut the op refuses is just a failed trial. Passes
// repeat until one changes nothing or the trial budget is spent. The final
// slices are replayed once more, uncached: bits that change from run to run
// (an op reading past a cut input) do not count as a divergence.

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>

#include "opguard/bisect/bisect.h"
#include "opguard/core/error.h"
#include "trials.h"

namespace opguard::bisect {
namespace {

struct Dim {
  int argument = 0;
  int dim = 0;
  int64_t size = 0;  // recorded
  int64_t start = 0, length = 0;
};

std::vector<replay::InputSlice> slices_of(const std::vector<Dim>& dims) {
  std::vector<replay::InputSlice> s;
  for (const auto& d : dims)
    if (d.length < d.size) s.push_back(replay::InputSlice{d.argument, d.dim, d.start, d.length});
  return s;
}

uint64_t bytes_of(const formats::TensorMeta& m, const std::vector<int64_t>& sizes) {
  uint64_t n = dtype_size(m.dtype);
  for (auto s : sizes) n *= static_cast<uint64_t>(s);
  return n;
}

}  // namespace

ShrinkResult shrink_inputs(const ShrinkOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  ShrinkResult result;
  const formats::Event ev = detail::load_event(options.target.recording, options.target.rank, options.target.event);
  std::vector<Dim> dims;
  for (int a = 0; a < static_cast<int>(ev.inputs.size()); ++a) {
    const auto& v = ev.inputs[a];
    if (v.kind != formats::ValueKind::kTensor) continue;
    InputShape shape{a, v.name, std::string(dtype_name(v.tensor.dtype)), v.tensor.sizes,
                     bytes_of(v.tensor, v.tensor.sizes), (v.tensor.flags & formats::kTensorHasData) != 0};
    result.original.push_back(shape);
    result.original_bytes += shape.bytes;
    for (int d = 0; d < static_cast<int>(v.tensor.sizes.size()); ++d)
      if (v.tensor.sizes[d] > 1) dims.push_back(Dim{a, d, v.tensor.sizes[d], 0, v.tensor.sizes[d]});
  }
  // The largest dimensions first: they buy the most bytes per trial.
  std::stable_sort(dims.begin(), dims.end(), [](const Dim& x, const Dim& y) { return x.size > y.size; });
  for (const auto& s : options.target.slices) {
    for (auto& d : dims)
      if (d.argument == s.argument && d.dim == s.dim) d.start = s.start, d.length = s.length;
  }

  detail::TrialRunner runner(options.target);
  enum class Try { kKeeps, kLoses, kFailed };
  auto attempt = [&](const std::vector<Dim>& candidate) {
    const auto slices = slices_of(candidate);
    const auto& g = runner.run(options.good, slices);
    const auto& b = runner.run(options.bad, slices);
    if (!g.ran || !b.ran) return Try::kFailed;
    return g.bits != b.bits ? Try::kKeeps : Try::kLoses;
  };
  {
    const auto& g = runner.run(options.good, slices_of(dims));
    const auto& b = runner.run(options.bad, slices_of(dims));
    detail::require_ran(g, "good", options.good);
    detail::require_ran(b, "bad", options.bad);
    result.diverges = g.bits != b.bits;
  }
  if (!result.diverges) {
    result.message = fmt::format("{} gives the same bits under the good and the bad config: nothing to shrink", ev.op);
  }
  // Cut [start, start+length) of dims[i] to [start+offset, start+offset+len),
  // and with it every dimension of the same recorded size and window: those
  // are, as a rule, one dimension of the op seen by several arguments (mm's
  // inner dimension, the rows of layer_norm's input, mean and gradient). A cut
  // of one of them alone can pass shape checks an op does not make and read
  // past the end of a smaller input: its "divergence" would be garbage.
  std::set<std::string> tried;
  auto cut = [&](std::size_t i, int64_t offset, int64_t len) {
    if (result.trials >= options.max_trials) {
      result.budget_exhausted = true;
      return false;
    }
    auto candidate = dims;
    const Dim was = dims[i];
    for (auto& d : candidate) {
      if (d.size == was.size && d.start == was.start && d.length == was.length) {
        d.start += offset;
        d.length = len;
      }
    }
    // Members of one group propose the same cuts: count each candidate once.
    if (!tried.insert(detail::slices_text(slices_of(candidate))).second) return false;
    ++result.trials;
    if (attempt(candidate) != Try::kKeeps) return false;
    dims = candidate;
    ++result.accepted;
    return true;
  };
  bool progress = result.diverges;
  while (progress && !result.budget_exhausted) {
    progress = false;
    for (std::size_t i = 0; i < dims.size() && !result.budget_exhausted; ++i) {
      int64_t step = dims[i].length / 2;
      while (step >= 1 && dims[i].length > 1 && !result.budget_exhausted) {
        const int64_t len = dims[i].length - step;
        if (cut(i, 0, len) || cut(i, step, len)) {
          progress = true;
          step = std::min(step, dims[i].length / 2);
        } else {
          step /= 2;
        }
      }
    }
  }
  result.slices = slices_of(dims);
  const auto& g = runner.run(options.good, result.slices);
  const auto& b = runner.run(options.bad, result.slices);
  result.good_bits = g.bits;
  result.bad_bits = b.bits;
  if (!result.slices.empty()) {
    const auto g2 = runner.run_again(options.good, result.slices);
    const auto b2 = runner.run_again(options.bad, result.slices);
    if (g2.bits != g.bits || b2.bits != b.bits) {
      result.message = "the shrunk inputs gave other bits when replayed again (the op read outside them): kept the "
                       "recorded inputs";
      for (auto& d : dims) d.start = 0, d.length = d.size;
      result.slices.clear();
      result.good_bits = runner.run(options.good, {}).bits;
      result.bad_bits = runner.run(options.bad, {}).bits;
    }
  }
  for (const auto& shape : result.original) {
    InputShape f = shape;
    for (const auto& d : dims)
      if (d.argument == f.argument) f.sizes[d.dim] = d.length;
    const auto& meta = ev.inputs[f.argument].tensor;
    f.bytes = bytes_of(meta, f.sizes);
    result.final_bytes += f.bytes;
    result.final.push_back(std::move(f));
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace opguard::bisect
