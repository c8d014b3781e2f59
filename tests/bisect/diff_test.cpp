// Classification on crafted recordings whose answer is known (DESIGN.md,
// Rules 1-3). A small simulator stands in for a deterministic program: every
// op's output fingerprint is a hash of the op, its argument texts and its input
// fingerprints, so a change anywhere flows downstream exactly as real bits do,
// and a test can perturb one op's output (a kernel that computes other bits).

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <xxhash.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <set>

#include "opguard/bisect/bisect.h"
#include "opguard/bisect/diff.h"
#include "opguard/core/error.h"
#include "../support/process.h"
#include "recording_builder.h"

namespace {

using namespace opguard;
using namespace opguard::testing;
using bisect::EventClass;
namespace fmts = opguard::formats;

uint64_t mix(const std::string& op, const std::vector<uint64_t>& words) {
  std::string buf = op;
  for (uint64_t w : words) buf.append(reinterpret_cast<const char*>(&w), sizeof(w));
  return XXH3_64bits(buf.data(), buf.size());
}

// Runs ops of one program on fingerprints. Storages are numbered per run.
class Sim {
 public:
  explicit Sim(Run& run) : run_(run) {}
  int64_t step = 0;
  Phase phase = Phase::kForward;
  std::string scope;
  std::set<std::string> perturb;  // "op@scope" whose outputs get other bits
  int perturb_call = -1;          // only that call of the perturbed op (-1: all)
  std::optional<uint32_t> knobs;  // every op's Event::knobs

  // A tensor from outside the recording (a batch, a loaded parameter).
  T outside(uint64_t fp, std::vector<int64_t> sizes = {4}) { return T{next_storage_++, 0, fp, sizes}; }

  // An op with tensor inputs `in` and non-tensor arguments `args`; returns its
  // fresh output.
  T call(const std::string& op, const std::vector<T>& in, const std::vector<Value>& args = {},
         std::vector<int64_t> sizes = {4}) {
    T out{next_storage_++, 0, 0, sizes};
    out.fp = output_fp(op, in, args);
    Op o = make(op, in, args);
    o.outputs = {tensor("", out)};
    last_id = run_.add(step, o);
    return out;
  }
  // In place: `self` is read and written; returns its new state.
  T inplace(const std::string& op, T& self, const std::vector<T>& others = {}) {
    std::vector<T> in = {self};
    in.insert(in.end(), others.begin(), others.end());
    T out = self;
    out.version = self.version + 1;
    out.fp = output_fp(op, in, {});
    Op o = make(op, in, {});
    o.inputs[0].mutated = true;
    o.outputs = {tensor("", out)};
    last_id = run_.add(step, o);
    self = out;
    return out;
  }
  // A view: same storage, other geometry.
  T view(const std::string& op, const T& base, std::vector<int64_t> sizes, std::vector<int64_t> strides) {
    T out = base;
    out.sizes = sizes;
    out.strides = strides;
    out.fp = mix(op + "view", {base.fp});
    Op o = make(op, {base}, {});
    o.outputs = {tensor("", out)};
    last_id = run_.add(step, o);
    return out;
  }
  uint64_t last_id = 0;

 private:
  Op make(const std::string& op, const std::vector<T>& in, const std::vector<Value>& args) {
    Op o;
    o.name = op;
    o.scope = scope;
    o.knobs = knobs;
    o.phase = phase;
    const char* names[] = {"self", "other", "third", "fourth"};
    for (std::size_t i = 0; i < in.size(); ++i) o.inputs.push_back(tensor(names[i % 4], in[i]));
    for (const auto& a : args) o.inputs.push_back(a);
    return o;
  }
  uint64_t output_fp(const std::string& op, const std::vector<T>& in, const std::vector<Value>& args) {
    std::vector<uint64_t> words;
    for (const auto& t : in) words.push_back(t.fp);
    std::string key = op;
    for (const auto& a : args) key += "|" + a.text + (a.kind == ValueKind::kGenerator ? std::to_string(a.tensor.fingerprint) : "");
    uint64_t fp = mix(key, words);
    const int call = calls_[op + "@" + scope]++;
    if (perturb.count(op + "@" + scope) && (perturb_call < 0 || perturb_call == call)) fp ^= 0x5a5a5a5aULL;
    return fp;
  }
  Run& run_;
  uint64_t next_storage_ = 1;
  std::map<std::string, int> calls_;
};

// A two-layer MLP training step: forward, backward, an SGD update of both
// weights, then the next step reads the updated weights.
struct Model {
  T w1, w2, batch;
};

void train(Sim& s, int steps, const std::function<void(Sim&, int)>& before_step = {}) {
  Model m;
  m.w1 = s.outside(11);
  m.w2 = s.outside(12);
  for (int step = 0; step < steps; ++step) {
    s.step = step;
    if (before_step) before_step(s, step);
    s.phase = Phase::kForward;
    m.batch = s.outside(100 + step);
    s.scope = "fc1";
    T h = s.call("aten::mm", {m.batch, m.w1});
    s.scope = "act";
    T a = s.call("aten::gelu", {h}, {arg("approximate", ValueKind::kString, "none")});
    s.scope = "fc2";
    T y = s.call("aten::mm", {a, m.w2});
    s.scope = "loss";
    T loss = s.call("aten::sum", {y}, {}, {});
    s.phase = Phase::kBackward;
    s.scope = "fc2";
    T g2 = s.call("aten::mm", {loss, a});
    T ga = s.call("aten::mm", {loss, m.w2});
    s.scope = "act";
    T gh = s.call("aten::gelu_backward", {ga, h});
    s.scope = "fc1";
    T g1 = s.call("aten::mm", {gh, m.batch});
    s.phase = Phase::kOptimizer;
    s.scope = "";
    s.inplace("aten::add_", m.w1, {g1});
    s.inplace("aten::add_", m.w2, {g2});
  }
}

struct Diffed {
  bisect::DiffReport report;
  std::map<std::string, EventClass> by_suspect_id;  // "step:op@id" is not needed: ids are unique per run
  std::vector<bisect::EventVerdict> events;
};

Diffed diff(const Run& ref, const Run& sus, TempDir& dir, bisect::DiffOptions options = {}) {
  std::filesystem::remove_all(dir / "ref");
  std::filesystem::remove_all(dir / "sus");
  ref.write(dir / "ref");
  sus.write(dir / "sus");
  options.list_events = true;
  Diffed d;
  d.report = bisect::diff_recordings(dir / "ref", dir / "sus", options);
  d.events = d.report.events;
  for (const auto& e : d.events)
    if (e.suspect_id) d.by_suspect_id[*e.suspect_id] = e.cls;
  return d;
}

int count(const Diffed& d, EventClass c) {
  int n = 0;
  for (const auto& e : d.events) n += e.cls == c;
  return n;
}

// The MLP trained in both runs; `configure` sets up the suspect's simulator.
Diffed diff_training(TempDir& dir, int steps, const std::function<void(Sim&)>& configure = {},
                     bisect::DiffOptions options = {}, int suspect_steps = -1) {
  Run a, b;
  Sim sa(a), sb(b);
  if (configure) configure(sb);
  train(sa, steps);
  train(sb, suspect_steps < 0 ? steps : suspect_steps);
  return diff(a, b, dir, options);
}

}  // namespace

TEST_CASE("two runs under the same config have no divergent operator") {
  TempDir dir;
  auto d = diff_training(dir, 3);
  CHECK_FALSE(d.report.diverged);
  CHECK_FALSE(d.report.first_divergent);
  CHECK(d.report.totals.counts[0] == 3 * 10);
  CHECK(count(d, EventClass::kSame) == 30);
  CHECK(d.report.events_reference == 30);
}

TEST_CASE("one op changed in the middle: it is the origin, its consumers propagated, the rest same") {
  TempDir dir;
  auto d = diff_training(dir, 3, [](Sim& s) {
    s.perturb = {"aten::gelu@act"};
    s.perturb_call = 1;  // step 1 only
  });
  REQUIRE(d.report.first_divergent);
  const auto& f = *d.report.first_divergent;
  CHECK(f.cls == EventClass::kOrigin);
  CHECK(f.op == "aten::gelu");
  CHECK(f.step == 1);
  CHECK(f.scope == "act");
  CHECK(f.phase == "forward");
  CHECK(f.reference_id == std::optional<std::string>("11"));
  CHECK(f.suspect_id == std::optional<std::string>("11"));
  REQUIRE(f.differing.size() == 1);
  CHECK(f.differing[0].output);
  // Step 0 and everything of step 1 before gelu (batch mm) are same.
  for (const auto& e : d.events) {
    INFO(e.op << " " << e.suspect_id.value_or("-") << " " << bisect::event_class_name(e.cls));
    const int id = std::stoi(*e.suspect_id);
    if (id < 11) CHECK(e.cls == EventClass::kSame);
    if (id == 11) CHECK(e.cls == EventClass::kOrigin);
  }
  // Downstream of gelu in step 1: fc2 mm, sum, both fc2 backward mms,
  // gelu_backward (reads ga), fc1 mm, both add_ (w1, w2): all propagated. The
  // backward mm of w2's grad input (loss x w2) reads a propagated loss.
  CHECK(d.by_suspect_id["12"] == EventClass::kPropagated);  // fc2 mm
  CHECK(d.by_suspect_id["13"] == EventClass::kPropagated);  // sum
  CHECK(d.by_suspect_id["18"] == EventClass::kPropagated);  // add_ w1
  CHECK(count(d, EventClass::kOrigin) == 1);
  CHECK(count(d, EventClass::kEntered) == 0);
  CHECK(count(d, EventClass::kUnmatched) == 0);
  // Step 2: every event reads the changed weights: nothing is a new origin.
  CHECK(d.report.origins.size() == 1);
  CHECK(d.report.diverged);
}

TEST_CASE("the first divergent op's state note names the CUDA knobs that differ, where both runs recorded them") {
  // A GPU run with TF32 cuBLAS matmul and cuDNN benchmark on, bf16 reductions
  // off, against one under torch's defaults: the note names the three. A
  // reference recorded before the CUDA knobs were (bit 13 clear) names none.
  const uint32_t cpu = fmts::knob_bits(4, true, false, false, 0);
  fmts::GpuKnobs tf32;
  tf32.tf32_cublas = true;
  tf32.cudnn_benchmark = true;
  tf32.bf16_reduction = false;
  for (const bool ref_has_gpu : {true, false}) {
    TempDir dir;
    Run a, b;
    Sim sa(a), sb(b);
    sa.knobs = cpu | (ref_has_gpu ? fmts::gpu_knob_bits({}) : 0u);
    sb.knobs = cpu | fmts::gpu_knob_bits(tf32);
    sb.perturb = {"aten::gelu@act"};
    train(sa, 2);
    train(sb, 2);
    const auto d = diff(a, b, dir);
    REQUIRE(d.report.first_divergent);
    const auto& f = *d.report.first_divergent;
    CHECK(f.op == "aten::gelu");
    INFO(f.state_note);
    if (ref_has_gpu) {
      CHECK(f.state_note.find("TF32 cuBLAS matmul off | on") != std::string::npos);
      CHECK(f.state_note.find("cuDNN benchmark off | on") != std::string::npos);
      CHECK(f.state_note.find("reduced-precision GEMM reduction on | fp16") != std::string::npos);
      CHECK(f.state_note.find("cuDNN convolution") == std::string::npos);  // equal in both
      CHECK(f.state_note.find("threads") == std::string::npos);
    } else {
      CHECK(f.state_note.empty());
    }
  }
}

TEST_CASE("an event that consumes only unchanged tensors after an origin stays same") {
  TempDir dir;
  Run a, b;
  for (Run* r : {&a, &b}) {
    Sim s(*r);
    if (r == &b) s.perturb = {"aten::exp@"};
    T x = s.outside(1);
    T y = s.call("aten::exp", {x});
    T z = s.call("aten::tanh", {x});  // independent of exp
    s.call("aten::add", {y, z});
    s.call("aten::mul", {z, z});
  }
  auto d = diff(a, b, dir);
  CHECK(d.by_suspect_id["0"] == EventClass::kOrigin);
  CHECK(d.by_suspect_id["1"] == EventClass::kSame);
  CHECK(d.by_suspect_id["2"] == EventClass::kPropagated);
  CHECK(d.by_suspect_id["3"] == EventClass::kSame);
  REQUIRE(d.report.first_divergent);
  CHECK(d.report.first_divergent->op == "aten::exp");
}

TEST_CASE("an inserted, a deleted and a fused op are unmatched and everything else aligns as same") {
  TempDir dir;
  Run a, b;
  // Reference: exp, tanh, mul, add, neg, sin, cos. Suspect: exp, extra, tanh,
  // fused_mul_add, sin, cos (neg deleted, mul+add fused). The fused op computes
  // the add's bits, so sin and cos stay same.
  auto op = [](const char* name, std::vector<Value> in, T out) { return Op{name, std::move(in), {tensor("", out)}}; };
  const T x{1, 0, 10}, e{2, 0, 20}, t{3, 0, 30}, m{4, 0, 40}, sum{5, 0, 50}, n{6, 0, 60}, sn{7, 0, 70}, cs{8, 0, 80};
  a.add(0, op("aten::exp", {tensor("self", x)}, e));
  a.add(0, op("aten::tanh", {tensor("self", e)}, t));
  a.add(0, op("aten::mul", {tensor("self", t), tensor("other", x)}, m));
  a.add(0, op("aten::add", {tensor("self", m), tensor("other", x)}, sum));
  a.add(0, op("aten::neg", {tensor("self", x)}, n));
  a.add(0, op("aten::sin", {tensor("self", sum)}, sn));
  a.add(0, op("aten::cos", {tensor("self", sn)}, cs));
  b.add(0, op("aten::exp", {tensor("self", x)}, e));
  b.add(0, op("aten::extra", {tensor("self", x)}, T{9, 0, 90}));
  b.add(0, op("aten::tanh", {tensor("self", e)}, t));
  b.add(0, op("aten::fused_mul_add", {tensor("self", t), tensor("other", x)}, sum));
  b.add(0, op("aten::sin", {tensor("self", sum)}, sn));
  b.add(0, op("aten::cos", {tensor("self", sn)}, cs));
  auto d = diff(a, b, dir);
  CHECK(count(d, EventClass::kUnmatched) == 5);  // extra, fused (suspect); mul, add, neg (reference)
  CHECK(d.report.totals.unmatched_suspect == 2);
  CHECK(d.report.totals.unmatched_reference == 3);
  CHECK(count(d, EventClass::kSame) == 4);  // exp, tanh, sin, cos
  CHECK(d.by_suspect_id["4"] == EventClass::kSame);
  CHECK(d.by_suspect_id["5"] == EventClass::kSame);
  CHECK_FALSE(d.report.first_divergent);
  REQUIRE(d.report.first_unmatched);
  CHECK(d.report.first_unmatched->op == "aten::extra");
  CHECK(d.report.diverged);  // unmatched events are a difference
}

namespace {

// Reference: h = relu(x); y = linear(h, w, bias) in scope mlp.proj; z = add(y, h).
// Suspect: the same linear computed as a 2-way row-parallel split (tensor_split
// of h and w, two partial linears, two adds), which the alignment cannot pair
// with the reference's one op. `split_fp` is the fingerprint of the split's
// result (the reference's y is 500). `h_fp` changes h in the suspect only.
void tensor_parallel_runs(Run& a, Run& b, uint64_t split_fp, uint64_t h_fp = 20) {
  auto op = [](const char* name, std::vector<Value> in, std::vector<T> out, const char* scope = "mlp.proj") {
    Op o{name, std::move(in), {}, scope};
    for (const auto& t : out) o.outputs.push_back(tensor("", t));
    return o;
  };
  for (Run* r : {&a, &b}) {
    const bool suspect = r == &b;
    const T x{1, 0, 10, {2, 4}};
    const T h{2, 0, suspect ? h_fp : 20, {2, 4}}, w{3, 1, 30, {3, 4}}, bias{4, 1, 40, {3}};
    r->add(0, op("aten::normal_", {tensor("self", T{3, 0, 0, {3, 4}, DType::kFloat32, 0, {}, 1}, true)}, {w}, "mlp"));
    r->add(0, op("aten::zero_", {tensor("self", T{4, 0, 0, {3}, DType::kFloat32, 0, {}, 1}, true)}, {bias}, "mlp"));
    r->add(0, op("aten::relu", {tensor("self", x)}, {h}, "mlp.act"));
    T y{5, 0, 500, {2, 3}};
    if (!suspect) {
      r->add(0, op("aten::linear", {tensor("input", h), tensor("weight", w), tensor("bias", bias)}, {y}));
    } else {
      const T h0{2, 0, 21, {2, 2}, DType::kFloat32, 0, {4, 1}}, h1{2, 0, 22, {2, 2}, DType::kFloat32, 2, {4, 1}};
      const T w0{3, 1, 31, {3, 2}, DType::kFloat32, 0, {4, 1}}, w1{3, 1, 32, {3, 2}, DType::kFloat32, 2, {4, 1}};
      const T p0{6, 0, 60, {2, 3}}, p1{7, 0, 70, {2, 3}}, s{8, 0, 80, {2, 3}};
      y.fp = split_fp;
      r->add(0, op("aten::tensor_split", {tensor("self", h)}, {h0, h1}));
      r->add(0, op("aten::tensor_split", {tensor("self", w)}, {w0, w1}));
      r->add(0, op("aten::linear", {tensor("input", h0), tensor("weight", w0)}, {p0}));
      r->add(0, op("aten::linear", {tensor("input", h1), tensor("weight", w1)}, {p1}));
      r->add(0, op("aten::add", {tensor("self", p0), tensor("other", p1)}, {s}));
      r->add(0, op("aten::add", {tensor("self", s), tensor("other", bias)}, {y}));
    }
    r->add(0, op("aten::add", {tensor("self", y), tensor("other", h)}, {T{9, 0, y.fp ^ 0x77, {2, 3}}}, "mlp"));
  }
}

}  // namespace

TEST_CASE("a split of one op into others that changes the result is an origin: the region, named by the "
          "reference's op, with its reader") {
  TempDir dir;
  Run a, b;
  tensor_parallel_runs(a, b, 501);
  auto d = diff(a, b, dir);
  REQUIRE(d.report.first_divergent);
  const auto& f = *d.report.first_divergent;
  CHECK(f.cls == EventClass::kOrigin);
  REQUIRE(f.region);
  CHECK(f.op == "aten::linear");
  CHECK(f.scope == "mlp.proj");
  CHECK(f.reference_id == std::optional<std::string>("3"));
  CHECK(f.suspect_id == std::optional<std::string>("3"));  // the split's first event
  CHECK(f.region->reference_events == 1);
  CHECK(f.region->suspect_events == 6);
  CHECK(f.region->suspect_ops.front() == "aten::tensor_split");
  CHECK(f.region->consumer_id == "9");
  CHECK(f.region->consumer_op == "aten::add");
  CHECK(f.region->consumer_input == 0);
  CHECK(f.region->reference_bits == fmt::format("{:016x}", 500));
  CHECK(f.region->suspect_bits == fmt::format("{:016x}", 501));
  CHECK(d.by_suspect_id["9"] == EventClass::kPropagated);
  CHECK(count(d, EventClass::kOrigin) == 0);  // the region is a source, not an event class
  CHECK(d.report.origins.size() == 1);
  const std::string text = bisect::report_text(d.report);
  CHECK(text.find("origin: a region") != std::string::npos);
  CHECK(text.find("opguard replay") != std::string::npos);
  const auto j = nlohmann::json::parse(bisect::report_json(d.report));
  CHECK(j["first_divergent"]["region"]["suspect_events"] == 6);
  CHECK(j["first_divergent"]["region"]["reference_ops"][0] == "aten::linear");
}

TEST_CASE("a split whose result is bitwise equal is no divergence; a split that reads bits that already differed "
          "is not named") {
  TempDir dir;
  {
    Run a, b;
    tensor_parallel_runs(a, b, 500);
    auto d = diff(a, b, dir);
    CHECK_FALSE(d.report.first_divergent);
    CHECK(d.by_suspect_id["9"] == EventClass::kSame);
  }
  {
    // h differs (relu is the origin): the split reads it, so the split is
    // propagated like its reader, and relu stays the first divergent operator.
    Run a, b;
    tensor_parallel_runs(a, b, 501, 29);
    auto d = diff(a, b, dir);
    REQUIRE(d.report.first_divergent);
    CHECK(d.report.first_divergent->op == "aten::relu");
    CHECK_FALSE(d.report.first_divergent->region);
    CHECK(d.report.origins.size() == 1);
    CHECK(d.by_suspect_id["9"] == EventClass::kPropagated);
  }
}

TEST_CASE("ops of different autograd nodes never align, even where op, scope and shapes coincide: a split that "
          "gives the unsplit bits is no divergence, only events one run has") {
  // tiny_gpt --tp 2 at --width 128 on a CPU whose MKL gives the unsplit bits
  // for two shards of 256: the reference's backward transposes the gradient
  // [256,128] for its AddmmBackward0, the suspect a weight shard's transpose,
  // also [256,128], for a partial linear's MmBackward0. Paired, they made the
  // split a region whose "result differs where it is read".
  TempDir dir;
  Run a, b;
  tensor_parallel_runs(a, b, 500);
  const T grad{20, 0, 900, {2, 3}};
  Op ref_t{"aten::t", {tensor("self", grad)}, {tensor("", T{20, 0, 901, {3, 2}, DType::kFloat32, 0, {1, 3}})},
           "mlp.proj", Phase::kBackward, "", "AddmmBackward0"};
  a.add(0, ref_t);
  const T w0_t{3, 1, 33, {2, 3}, DType::kFloat32, 0, {1, 4}};  // the shard's transpose: a view of w's storage
  Op sus_t{"aten::t", {tensor("self", w0_t)}, {tensor("", T{3, 1, 34, {3, 2}, DType::kFloat32, 0, {4, 1}})},
           "mlp.proj", Phase::kBackward, "", "MmBackward0"};
  b.add(0, sus_t);
  auto d = diff(a, b, dir);
  CHECK_FALSE(d.report.first_divergent);
  CHECK(d.report.origins.empty());
  CHECK(d.by_suspect_id["9"] == EventClass::kSame);
  CHECK(d.by_suspect_id["10"] == EventClass::kUnmatched);
  CHECK(count(d, EventClass::kPropagated) == 0);
  CHECK(bisect::report_text(d.report).find("runs diverge in structure only") != std::string::npos);
  // bisect run: no operator to bisect (exit 4), not a bad recording.
  bisect::RunOptions run;
  run.reference = dir / "ref";
  run.suspect = dir / "sus";
  run.out_dir = dir / "out";
  const bisect::RunResult r = bisect::bisect_run(run);
  CHECK(r.status == bisect::RunResult::Status::kNothingToBisect);
  CHECK(r.message.find("no operator produced different bits") != std::string::npos);
}

TEST_CASE("a gap that also reads bits that already differed is not a source, even where its reader's bits come "
          "from a part of it that read equal inputs") {
  TempDir dir;
  Run a, b;
  auto op = [](const char* name, std::vector<Value> in, std::vector<T> out) {
    Op o{name, std::move(in), {}, "blk"};
    for (const auto& t : out) o.outputs.push_back(tensor("", t));
    return o;
  };
  for (Run* r : {&a, &b}) {
    const bool suspect = r == &b;
    const T x{1, 0, 10}, w{2, 1, 20};
    r->add(0, op("aten::normal_", {tensor("self", T{2, 0, 0, {4}, DType::kFloat32, 0, {}, 1}, true)}, {w}));
    const T h{3, 0, suspect ? 31u : 30u};  // relu is an origin
    r->add(0, op("aten::relu", {tensor("self", x)}, {h}));
    const T wv{2, 1, suspect ? 41u : 40u, {2}};
    if (suspect) {
      r->add(0, op("aten::tensor_split", {tensor("self", h)}, {T{3, 0, 32, {2}}}));  // reads the differing h
      r->add(0, op("aten::narrow", {tensor("self", w)}, {wv}));                      // reads the equal w
    } else {
      r->add(0, op("aten::slice", {tensor("self", w)}, {wv}));
    }
    r->add(0, op("aten::neg", {tensor("self", wv)}, {T{4, 0, suspect ? 51u : 50u, {2}}}));
  }
  auto d = diff(a, b, dir);
  REQUIRE(d.report.first_divergent);
  CHECK(d.report.first_divergent->op == "aten::relu");
  CHECK(d.report.origins.size() == 1);  // the gap is not listed as a second source
  for (const auto& o : d.report.origins) CHECK_FALSE(o.region);
}

namespace {

// Attention as one op in the reference and spelled out in the suspect, which
// first builds a mask with ops of its own (transformers' eager attention
// against its sdpa one): two gaps, the second reading what the first made and
// Python numbers the dispatcher wrapped. `c_fp`: the suspect's cos output (25
// is the reference's), which only the mask reads. `reshape`: the reference
// reshapes the attention's output, a second op of its own. `unsqueezes`: more
// ops in the suspect's mask. `literal`: the spelled-out attention also
// multiplies by a tensor whose bits the program wrote without an operator into
// memory an aten::empty made, as torch.tensor(1.0) does: an empty of the
// attention's own (kLiteralInGap) or one both runs ran before (kFilledBefore).
enum Literal { kNoLiteral, kLiteralInGap, kFilledBefore };
void spelled_out_attention_runs(Run& a, Run& b, uint64_t c_fp, bool reshape = false, int unsqueezes = 0,
                                Literal literal = kNoLiteral) {
  auto op = [](const char* name, std::vector<Value> in, std::vector<T> out, const char* scope) {
    Op o{name, std::move(in), {}, scope};
    for (const auto& t : out) o.outputs.push_back(tensor("", t));
    return o;
  };
  auto number = [](uint64_t storage, uint64_t fp) {  // a wrapped Python number: no event made it
    return tensor("other", T{storage, 0, fp, {}, DType::kFloat64, 0, {}, fmts::kTensorWrappedNumber});
  };
  for (Run* r : {&a, &b}) {
    const bool suspect = r == &b;
    const T x{1, 0, 10}, w{2, 1, 30}, h{3, 0, 20}, hn{4, 0, 21}, c{6, 0, suspect ? c_fp : 25};
    r->add(0, op("aten::normal_", {tensor("self", T{2, 0, 0, {4}, DType::kFloat32, 0, {}, 1}, true)}, {w}, "model"));
    r->add(0, op("aten::relu", {tensor("self", x)}, {h}, "model"));
    r->add(0, op("aten::cos", {tensor("self", x)}, {c}, "model"));
    const T fresh{20, 0, 0, {}, DType::kFloat32, 0, {}, fmts::kTensorUninitialized}, filled_in{20, 0, 0x3f80, {}};
    if (literal == kFilledBefore) r->add(0, op("aten::empty", {}, {fresh}, "model"));
    const T mask{11, 0, 110, {4}, DType::kBool};
    if (suspect) {  // gap 1: the mask
      T positions{10, 0, 100, {4}, DType::kInt64};
      r->add(0, op("aten::arange", {}, {positions}, "model"));
      for (int k = 0; k < unsqueezes; ++k) {
        const T next{positions.storage, 0, positions.fp + 1, {4}, DType::kInt64, 0, {1}};
        r->add(0, op("aten::unsqueeze", {tensor("self", positions)}, {next}, "model"));
        positions = next;
      }
      r->add(0, op("aten::le", {tensor("self", positions), tensor("other", c)}, {mask}, "model"));
    }
    r->add(0, op("aten::layer_norm", {tensor("input", h)}, {hn}, "attn.ln"));
    T y{5, 0, 500};
    if (!suspect) {
      if (!reshape) {
        r->add(0, op("aten::scaled_dot_product_attention", {tensor("query", hn), tensor("key", w)}, {y}, "attn"));
      } else {
        const T heads{15, 0, 150, {2, 2}};
        r->add(0, op("aten::scaled_dot_product_attention", {tensor("query", hn), tensor("key", w)}, {heads}, "attn"));
        r->add(0, op("aten::reshape", {tensor("self", heads)}, {y}, "attn"));
      }
    } else {  // gap 2: attention spelled out, reading the mask
      const T scores{12, 0, 120}, scaled{13, 0, 130}, filled{14, 0, 140};
      y.fp = 501;
      r->add(0, op("aten::matmul", {tensor("self", hn), tensor("other", w)}, {scores}, "attn"));
      Value scale = number(77, 0x3fd0);
      if (literal != kNoLiteral) {
        if (literal == kLiteralInGap) r->add(0, op("aten::empty", {}, {fresh}, "attn"));
        r->add(0, op("aten::to", {tensor("self", filled_in)}, {filled_in}, "attn"));  // the first to read the bits
        r->add(0, op("aten::lift_fresh", {tensor("self", filled_in)}, {filled_in}, "attn"));
        scale = tensor("other", filled_in);
      }
      r->add(0, op("aten::mul", {tensor("self", scores), scale}, {scaled}, "attn"));
      r->add(0, op("aten::masked_fill", {tensor("self", scaled), tensor("mask", mask), number(78, 0xfff0)}, {filled},
                   "attn"));
      r->add(0, op("aten::softmax", {tensor("self", filled)}, {y}, "attn"));
    }
    r->add(0, op("aten::add", {tensor("self", y), tensor("other", h)}, {T{9, 0, y.fp ^ 0x77}}, "model"));
  }
}

}  // namespace

TEST_CASE("an op replaced by others that first build what they read with ops of their own (a mask) is one region, "
          "named by the replaced op; Python numbers they read do not hide it") {
  TempDir dir;
  Run a, b;
  spelled_out_attention_runs(a, b, 25);
  auto d = diff(a, b, dir);
  REQUIRE(d.report.first_divergent);
  const auto& f = *d.report.first_divergent;
  CHECK(f.cls == EventClass::kOrigin);
  REQUIRE(f.region);
  CHECK(f.op == "aten::scaled_dot_product_attention");
  CHECK(f.scope == "attn");
  CHECK(f.reference_id == std::optional<std::string>("4"));
  CHECK(f.suspect_id == std::optional<std::string>("3"));  // the mask's first op
  CHECK(f.region->reference_events == 1);
  CHECK(f.region->suspect_events == 6);
  CHECK(f.region->suspect_ops ==
        std::vector<std::string>{"aten::arange", "aten::le", "aten::matmul", "aten::mul", "aten::masked_fill",
                                 "aten::softmax"});
  CHECK(f.region->consumer_op == "aten::add");
  CHECK(d.report.origins.size() == 1);

  // Two ops of the reference: named by the suspect's first, and bisect run
  // says that it replays regions of one reference op (exit 65), not that data
  // entered from outside.
  Run a2, b2;
  spelled_out_attention_runs(a2, b2, 25, true);
  auto d2 = diff(a2, b2, dir);
  REQUIRE(d2.report.first_divergent);
  REQUIRE(d2.report.first_divergent->region);
  CHECK(d2.report.first_divergent->region->reference_events == 2);
  CHECK(d2.report.first_divergent->op == "aten::arange");
  CHECK_FALSE(d2.report.first_divergent->reference_id);
  bisect::RunOptions run;
  run.reference = dir / "ref";
  run.suspect = dir / "sus";
  run.out_dir = dir / "out";
  const bisect::RunResult r = bisect::bisect_run(run);
  CHECK(r.status == bisect::RunResult::Status::kNotReplayable);
  CHECK(r.message.find("is a region where the reference ran 2 ops") != std::string::npos);
  CHECK(d2.report.first_divergent->scope == "attn");  // the reference's ops', not the mask's

  // A long region lists its first and last 8 events, and how many between.
  Run a3, b3;
  spelled_out_attention_runs(a3, b3, 25, false, 20);
  auto d3 = diff(a3, b3, dir);
  REQUIRE(d3.report.first_divergent);
  REQUIRE(d3.report.first_divergent->region);
  const auto& g = *d3.report.first_divergent->region;
  CHECK(g.suspect_events == 26);
  REQUIRE(g.suspect_ids.size() == 16);
  CHECK(g.suspect_ops.front() == "aten::arange");
  CHECK(g.suspect_ops[7] == "aten::unsqueeze");
  CHECK(g.suspect_ops[8] == "aten::unsqueeze");
  CHECK(g.suspect_ops.back() == "aten::softmax");
  CHECK(g.suspect_ids.front() == "3");
  CHECK(g.suspect_ids.back() == "29");
  CHECK(bisect::report_text(d3.report).find("aten::unsqueeze (event 10), ... 10 more ..., aten::unsqueeze (event 21)") !=
        std::string::npos);
}

TEST_CASE("a region may read a tensor literal it made (torch.tensor(1.0)), not memory from before it that the "
          "program wrote without an operator") {
  TempDir dir;
  Run a, b;
  spelled_out_attention_runs(a, b, 25, false, 0, kLiteralInGap);
  auto d = diff(a, b, dir);
  REQUIRE(d.report.first_divergent);
  const auto& f = *d.report.first_divergent;
  REQUIRE(f.region);
  CHECK(f.op == "aten::scaled_dot_product_attention");
  CHECK(f.region->suspect_events == 9);
  CHECK(f.region->suspect_ops[3] == "aten::empty");

  Run a2, b2;
  spelled_out_attention_runs(a2, b2, 25, false, 0, kFilledBefore);
  auto d2 = diff(a2, b2, dir);
  CHECK_FALSE(d2.report.first_divergent);
  for (const auto& o : d2.report.origins) CHECK_FALSE(o.region);
  // Not named, but said where the runs part and why (what a torch.compile'd
  // program against its eager run gets: its kernels write outside the dispatcher).
  REQUIRE(d2.report.notes.size() == 1);
  const std::string& note = d2.report.notes.front();
  CAPTURE(note);
  CHECK(note.find("a region that does not align (reference: 1 op from event 5 (aten::scaled_dot_product_attention); "
                  "suspect: 6 ops from event 7 (aten::matmul ... aten::softmax)) returned bits that differ, read by "
                  "aten::add (event 13, input 0), and is not named: its event 8 (aten::to) read input 0, bits that no "
                  "operator of the recording made") != std::string::npos);
  CHECK(bisect::report_text(d2.report).find("note: rank 0 step 0 forward: a region") != std::string::npos);
  // The literal made inside the region: named, no note.
  CHECK(d.report.notes.empty());
}

TEST_CASE("a region whose mask read bits that already differed is not named: the op that made them is") {
  TempDir dir;
  Run a, b;
  spelled_out_attention_runs(a, b, 26);  // cos is an origin; only the mask reads its output
  auto d = diff(a, b, dir);
  REQUIRE(d.report.first_divergent);
  CHECK(d.report.first_divergent->op == "aten::cos");
  CHECK_FALSE(d.report.first_divergent->region);
  for (const auto& o : d.report.origins) CHECK_FALSE(o.region);
  CHECK(d.report.notes.empty());  // bits that already differed: their maker is classified, no note
}

TEST_CASE("a changed non-tensor argument is origin-args; so is another random generator state") {
  TempDir dir;
  {
    Run a, b;
    for (Run* r : {&a, &b}) {
      Sim s(*r);
      T x = s.outside(1);
      T g = s.call("aten::gelu", {x}, {arg("approximate", ValueKind::kString, r == &a ? "none" : "tanh")});
      s.call("aten::neg", {g});
    }
    auto d = diff(a, b, dir);
    REQUIRE(d.report.first_divergent);
    CHECK(d.report.first_divergent->cls == EventClass::kOriginArgs);
    CHECK(d.report.first_divergent->op == "aten::gelu");
    bool named = false;
    for (const auto& v : d.report.first_divergent->differing)
      named = named || (v.name == "approximate" && v.reference == "none" && v.suspect == "tanh");
    CHECK(named);
    CHECK(d.by_suspect_id["1"] == EventClass::kPropagated);
  }
  {
    Run a, b;
    for (Run* r : {&a, &b}) {
      Sim s(*r);
      T x = s.outside(1);
      T y = s.call("aten::dropout", {x}, {arg("p", ValueKind::kDouble, "0x1p-1"), generator(r == &a ? 5 : 6)});
      s.call("aten::neg", {y});
    }
    auto d = diff(a, b, dir);
    REQUIRE(d.report.first_divergent);
    CHECK(d.report.first_divergent->cls == EventClass::kOriginArgs);
    CHECK(d.report.first_divergent->op == "aten::dropout");
  }
}

namespace {

// An op with one output, appended to step 0 of `r`.
void add_op(Run& r, const char* name, std::vector<Value> in, const T& out, const char* scope) {
  Op o{name, std::move(in), {}, scope};
  o.outputs.push_back(tensor("", out));
  r.add(0, o);
}

// Tensor flags of a tensor the suspect did not fingerprint (a buffer the
// compiled code filled, hashed in time in the reference only).
uint8_t unhashed_in(bool suspect) { return suspect ? static_cast<uint8_t>(fmts::kTensorNotFingerprinted) : 0; }

}  // namespace

TEST_CASE("an output one run did not fingerprint is no evidence of other bits: its op is not named, its reader is") {
  // torch.compile's kernels write the buffer an out= op returned without the
  // dispatcher; the hashing thread got to it first in one run only, and the
  // diff named the out= op the origin (a bmm.out under 2 vs 1 threads).
  TempDir dir;
  for (const bool reader_differs : {false, true}) {
    CAPTURE(reader_differs);
    Run a, b;
    for (Run* r : {&a, &b}) {
      const bool suspect = r == &b;
      const T x{1, 0, 10};
      add_op(*r, "aten::relu", {tensor("self", x)}, T{2, 0, 20}, "attn");
      const T y{3, 0, 30, {4}, DType::kFloat32, 0, {}, unhashed_in(suspect)};
      add_op(*r, "aten::bmm", {tensor("self", x)}, y, "attn");  // event 1
      const T filled{3, 0, suspect && reader_differs ? 41u : 40u};  // what the compiled kernel left there
      add_op(*r, "aten::neg", {tensor("self", filled)}, T{4, 0, 50}, "attn");  // event 2
    }
    auto d = diff(a, b, dir);
    CHECK(d.by_suspect_id["1"] == EventClass::kSame);
    if (!reader_differs) {
      CHECK_FALSE(d.report.first_divergent);
      continue;
    }
    REQUIRE(d.report.first_divergent);
    CHECK(d.report.first_divergent->cls == EventClass::kEntered);
    CHECK(d.report.first_divergent->op == "aten::neg");
    REQUIRE(d.report.first_divergent->producer_id);
    CHECK(*d.report.first_divergent->producer_id == "1");
  }
}

TEST_CASE("set_ of a Storage brings bits in from outside the recording: never an origin; its first reader of other "
          "bits is entered, and batches brought in in another order are no divergence") {
  // A DataLoader's worker processes send batches that the main process
  // rebuilds with aten::set_(Tensor, Storage, ...) as they arrive, and
  // torch.load rebuilds tensors the same way. The Storage argument is
  // recorded as text ("Storage"), so the two runs' set_ looked equal in every
  // input with other outputs: the diff named it the origin (of two runs of one
  // program whose batches arrived in another order, and before a real origin).
  auto set_storage = [](Run& r, uint64_t storage, uint64_t fp) {
    add_op(r, "aten::set_", {tensor("self", T{storage, 0, 0, {0}}, true), arg("source", ValueKind::kOther, "Storage")},
           T{storage, 1, fp}, "");
  };
  TempDir dir;
  {
    // A checkpoint with other bits: the copy_ into the parameter reads them.
    Run a, b;
    for (Run* r : {&a, &b}) {
      set_storage(*r, 1, r == &a ? 10 : 11);                                       // event 0
      add_op(*r, "aten::copy_", {tensor("self", T{2, 0, 5}, true), tensor("src", T{1, 1, r == &a ? 10u : 11u})},
             T{2, 1, r == &a ? 10u : 11u}, "");                                    // event 1
    }
    auto d = diff(a, b, dir);
    CHECK(d.by_suspect_id["0"] == EventClass::kSame);
    REQUIRE(d.report.first_divergent);
    CHECK(d.report.first_divergent->cls == EventClass::kEntered);
    CHECK(d.report.first_divergent->op == "aten::copy_");
    CHECK(d.report.first_divergent->entered_input == "src");
    CHECK(d.report.first_divergent->producer_op == "aten::set_");
    CHECK(d.report.first_divergent->brought_in);
  }
  {
    // Two batches brought in in the other order; each reader sees the same bits.
    Run a, b;
    for (Run* r : {&a, &b}) {
      const bool swapped = r == &b;
      set_storage(*r, 1, swapped ? 200 : 100);
      set_storage(*r, 2, swapped ? 100 : 200);
      add_op(*r, "aten::relu", {tensor("self", T{swapped ? 2u : 1u, 1, 100})}, T{3, 0, 300}, "");
      add_op(*r, "aten::relu", {tensor("self", T{swapped ? 1u : 2u, 1, 200})}, T{4, 0, 400}, "");
    }
    auto d = diff(a, b, dir);
    CHECK_FALSE(d.report.first_divergent);
    CHECK_FALSE(d.report.diverged);
  }
  {
    // A batch brought in here by one run only (it arrived earlier than in the
    // other): its empty(0) and set_ are no divergence in structure, and
    // nothing read it.
    Run a, b;
    for (Run* r : {&a, &b}) {
      if (r == &b) {
        add_op(*r, "aten::empty", {arg("size", ValueKind::kIntList, "[0]")}, T{9, 0, 0, {0}}, "");
        set_storage(*r, 9, 555);
      }
      set_storage(*r, 1, 100);
      add_op(*r, "aten::relu", {tensor("self", T{1, 1, 100})}, T{3, 0, 300}, "");
    }
    auto d = diff(a, b, dir);
    CHECK_FALSE(d.report.diverged);
    CHECK(d.report.totals.unmatched_data_in == 2);
    CHECK(d.report.totals.counts[static_cast<int>(EventClass::kUnmatched)] == 0);
  }
  {
    // A zero-element empty no set_ fills (activation checkpointing makes its
    // own) is an event of one run, not data brought in.
    Run a, b;
    for (Run* r : {&a, &b}) {
      if (r == &b) add_op(*r, "aten::empty", {arg("size", ValueKind::kIntList, "[0]")}, T{9, 0, 0, {0}}, "");
      add_op(*r, "aten::relu", {tensor("self", T{1, 0, 100})}, T{3, 0, 300}, "");
    }
    auto d = diff(a, b, dir);
    CHECK(d.report.diverged);
    CHECK(d.report.totals.unmatched_data_in == 0);
    CHECK(d.report.totals.counts[static_cast<int>(EventClass::kUnmatched)] == 1);
    CHECK(d.report.notes.empty());
  }
  {
    // ... and where a reader reads it, with other bits than the other run's
    // reader read, that reader is entered (not fed by a region of one run).
    Run a, b;
    for (Run* r : {&a, &b}) {
      set_storage(*r, 1, 100);
      if (r == &b) set_storage(*r, 9, 555);
      const T read = r == &b ? T{9, 1, 555} : T{1, 1, 100};
      add_op(*r, "aten::relu", {tensor("self", read)}, T{3, 0, r == &b ? 301u : 300u}, "");
    }
    auto d = diff(a, b, dir);
    REQUIRE(d.report.first_divergent);
    CHECK(d.report.first_divergent->op == "aten::relu");
    CHECK(d.report.first_divergent->cls == EventClass::kEntered);
    CHECK(d.report.first_divergent->brought_in);
  }
}

TEST_CASE("a Python number (a wrapped 0-dim tensor) that differs is an argument: origin-args") {
  // x * s with s a Python float the program changed: the dispatcher wraps s
  // in a fresh tensor, which no event made; it was named entered, "changed
  // outside the dispatcher".
  TempDir dir;
  Run a, b;
  for (Run* r : {&a, &b}) {
    const T x{1, 0, 10};
    const T s{2, 0, r == &a ? 20u : 21u, {}, DType::kFloat64, 0, {}, fmts::kTensorWrappedNumber};
    add_op(*r, "aten::mul", {tensor("self", x), tensor("other", s)}, T{3, 0, r == &a ? 30u : 31u}, "");
    // The next step's call (AdamW's add_(denom, eps) with eps changed): its
    // self differs too, from the op above. Propagated; the number was named
    // entered, "data from outside the recording".
    const T s2{4, 0, r == &a ? 20u : 21u, {}, DType::kFloat64, 0, {}, fmts::kTensorWrappedNumber};
    add_op(*r, "aten::add", {tensor("self", T{3, 0, r == &a ? 30u : 31u}), tensor("other", s2)},
           T{5, 0, r == &a ? 50u : 51u}, "");
  }
  auto d = diff(a, b, dir, [] {
    bisect::DiffOptions o;
    o.max_origins = 10;
    return o;
  }());
  REQUIRE(d.report.first_divergent);
  CHECK(d.report.first_divergent->cls == EventClass::kOriginArgs);
  CHECK(d.report.first_divergent->op == "aten::mul");
  CHECK(d.by_suspect_id["1"] == EventClass::kPropagated);
  CHECK(count(d, EventClass::kEntered) == 0);
}

TEST_CASE("two models of one architecture, the first evaluated in the reference only: the suspect's evaluation "
          "pairs with the reference's of the same model, not with the first of equal signatures") {
  // A model and its EMA copy, both `fc1`; the suspect skips the EMA's
  // evaluation. Paired by signature alone, the suspect's model evaluation met
  // the reference's EMA evaluation: "weight entered, changed outside the
  // dispatcher".
  TempDir dir;
  Run a, b;
  for (Run* r : {&a, &b}) {
    const T x{1, 0, 10}, w_model{2, 0, 20}, w_ema{3, 0, 30};
    add_op(*r, "aten::relu", {tensor("self", x)}, T{4, 0, 40}, "");
    if (r == &a) {
      add_op(*r, "aten::linear", {tensor("input", x), tensor("weight", w_ema)}, T{5, 0, 50}, "fc1");
      add_op(*r, "aten::gelu", {tensor("self", T{5, 0, 50})}, T{6, 0, 60}, "act");
    }
    add_op(*r, "aten::linear", {tensor("input", x), tensor("weight", w_model)}, T{7, 0, 70}, "fc1");
    add_op(*r, "aten::gelu", {tensor("self", T{7, 0, 70})}, T{8, 0, 80}, "act");
  }
  auto d = diff(a, b, dir);
  CHECK_FALSE(d.report.first_divergent);
  CHECK(count(d, EventClass::kEntered) == 0);
  CHECK(count(d, EventClass::kSame) == 3);
  CHECK(d.report.totals.unmatched_reference == 2);
}

TEST_CASE("two same-signature computations run in another order: the reference read another tensor, which the "
          "report says instead of memory changed outside the dispatcher") {
  // Parameter groups of equal shapes listed in another order: the updates
  // pair by position, each with the other parameter's.
  TempDir dir;
  for (const bool reordered : {true, false}) {
    CAPTURE(reordered);
    Run a, b;
    for (Run* r : {&a, &b}) {
      const T p{1, 0, 10}, q{2, 0, 20};
      add_op(*r, "aten::relu", {tensor("self", T{5, 0, 50})}, p, "");
      add_op(*r, "aten::neg", {tensor("self", T{5, 0, 50})}, q, "");
      const bool swap = reordered && r == &b;
      // Not reordered: the reference read p with bits its relu did not make
      // (a numpy write): changed outside the dispatcher, as before.
      const T first = swap ? q : r == &a && !reordered ? T{1, 0, 11} : p;
      const T second = swap ? p : q;
      add_op(*r, "aten::exp", {tensor("self", first)}, T{6, 0, swap ? 61u : 60u}, "");
      add_op(*r, "aten::exp", {tensor("self", second)}, T{7, 0, swap ? 71u : 70u}, "");
    }
    auto d = diff(a, b, dir);
    REQUIRE(d.report.first_divergent);
    const auto& f = *d.report.first_divergent;
    CHECK(f.cls == EventClass::kEntered);
    CHECK(f.entered_side == "reference");
    CHECK(f.reference_read_other == reordered);
    CHECK((bisect::report_text(d.report).find("likely not the same computation") != std::string::npos) == reordered);
  }
}

TEST_CASE("an input one run did not fingerprint is compared with nothing: same where the outputs agree, never an "
          "origin where they do not") {
  TempDir dir;
  for (const bool outputs_differ : {false, true}) {
    CAPTURE(outputs_differ);
    Run a, b;
    for (Run* r : {&a, &b}) {
      const bool suspect = r == &b;
      add_op(*r, "aten::relu", {tensor("self", T{1, 0, 10})}, T{2, 0, 20}, "mlp");  // event 0
      const T buffer{3, 0, 30, {4}, DType::kFloat32, 0, {}, unhashed_in(suspect)};
      add_op(*r, "aten::mm", {tensor("self", buffer), tensor("other", T{2, 0, 20})},
             T{4, 0, suspect && outputs_differ ? 41u : 40u}, "mlp");  // event 1
    }
    auto d = diff(a, b, dir);
    if (!outputs_differ) {
      CHECK(d.by_suspect_id["1"] == EventClass::kSame);
      CHECK_FALSE(d.report.first_divergent);
      continue;
    }
    REQUIRE(d.report.first_divergent);
    CHECK(d.report.first_divergent->cls == EventClass::kEntered);
    CHECK(d.report.first_divergent->op == "aten::mm");
    CHECK(d.report.first_divergent->entered_input == "self");
  }
}

TEST_CASE("bits written without an operator (numpy) are entered: producer and first consumer named") {
  TempDir dir;
  Run a, b;
  for (Run* r : {&a, &b}) {
    Sim s(*r);
    T x = s.outside(1);
    T y = s.call("aten::exp", {x});                  // event 0
    s.view("aten::resolve_neg", y, {4}, {1});        // event 1: numpy() sees y (same view), writes nothing
    s.call("aten::tanh", {x});                       // event 2
    if (r == &b) y.fp = 4242;  // y written through numpy: same storage and version, other bits
    s.call("aten::neg", {y});  // event 3: first consumer of the changed bits
    s.call("aten::sin", {y});  // event 4: the same bits again
  }
  auto d = diff(a, b, dir);
  REQUIRE(d.report.first_divergent);
  const auto& f = *d.report.first_divergent;
  CHECK(f.cls == EventClass::kEntered);
  CHECK(f.op == "aten::neg");
  CHECK(f.entered_input == "self");
  CHECK(f.entered_side == "suspect");
  REQUIRE(f.producer_id);
  CHECK(*f.producer_id == "0");  // the op that wrote y, not the view that saw it last
  CHECK(f.producer_op == "aten::exp");
  CHECK(d.by_suspect_id["0"] == EventClass::kSame);
  CHECK(d.by_suspect_id["1"] == EventClass::kSame);
  CHECK(d.by_suspect_id["2"] == EventClass::kSame);
  CHECK(d.by_suspect_id["4"] == EventClass::kPropagated);  // not a second entry point
  const std::string text = bisect::report_text(d.report);
  CHECK(text.find("last produced by aten::exp (event 0") != std::string::npos);
}

TEST_CASE("an input batch that differs between the runs is entered, from outside the recording") {
  TempDir dir;
  Run a, b;
  for (Run* r : {&a, &b}) {
    Sim s(*r);
    T w = s.outside(11);
    for (int step = 0; step < 3; ++step) {
      s.step = step;
      T batch = s.outside(r == &b && step == 2 ? 999 : 100 + step);
      s.scope = "fc1";
      T h = s.call("aten::mm", {batch, w});
      s.scope = "";
      s.call("aten::sum", {h});
    }
  }
  auto d = diff(a, b, dir);
  REQUIRE(d.report.first_divergent);
  const auto& f = *d.report.first_divergent;
  CHECK(f.cls == EventClass::kEntered);
  CHECK(f.step == 2);
  CHECK(f.op == "aten::mm");
  CHECK(f.entered_input == "self");
  CHECK_FALSE(f.producer_id);  // no event produced the batch
  CHECK(bisect::report_text(d.report).find("data from outside the recording") != std::string::npos);
  CHECK(d.report.origins.size() == 1);
  CHECK(count(d, EventClass::kPropagated) == 1);  // the sum of step 2
}

TEST_CASE("a divergence in the optimizer of step 3 flags nothing before it; the next step is propagated") {
  TempDir dir;
  auto d = diff_training(dir, 5, [](Sim& s) {
    s.perturb = {"aten::add_@"};
    s.perturb_call = 6;  // add_ is called twice per step: call 6 is w1's update in step 3
  });
  REQUIRE(d.report.first_divergent);
  const auto& f = *d.report.first_divergent;
  CHECK(f.cls == EventClass::kOrigin);
  CHECK(f.step == 3);
  CHECK(f.phase == "optimizer");
  for (const auto& e : d.events) {
    if (e.step < 3 || (e.step == 3 && e.phase != "optimizer")) CHECK(e.cls == EventClass::kSame);
  }
  // Step 4's forward mm reads the changed w1.
  bool step4_propagated = false;
  for (const auto& e : d.events)
    step4_propagated = step4_propagated || (e.step == 4 && e.op == "aten::mm" && e.cls == EventClass::kPropagated);
  CHECK(step4_propagated);
  CHECK(d.report.origins.size() == 1);
}

TEST_CASE("a write through a view of a storage propagates to readers of the whole storage") {
  TempDir dir;
  Run a, b;
  for (Run* r : {&a, &b}) {
    Sim s(*r);
    if (r == &b) s.perturb = {"aten::exp@"};
    T buf = s.call("aten::zeros", {}, {}, {2, 4});   // 0
    T row = s.view("aten::select", buf, {4}, {1});   // 1 (alias of buf)
    T x = s.outside(5);
    T e = s.call("aten::exp", {x});                  // 2: origin
    s.inplace("aten::copy_", row, {e});              // 3: writes row (and so buf)
    T whole = buf;
    whole.version = row.version;
    whole.fp = 31337 + (r == &b);                    // buf's new bits differ
    s.call("aten::sum", {whole});                    // 4: reads buf through its own geometry
  }
  auto d = diff(a, b, dir);
  CHECK(d.by_suspect_id["2"] == EventClass::kOrigin);
  CHECK(d.by_suspect_id["3"] == EventClass::kPropagated);
  CHECK(d.by_suspect_id["4"] == EventClass::kPropagated);
  CHECK(count(d, EventClass::kEntered) == 0);
}

TEST_CASE("a backward op reading a tensor its forward op saved without returning it is propagated from that scope") {
  TempDir dir;
  Run a, b;
  for (Run* r : {&a, &b}) {
    Sim s(*r);
    if (r == &b) s.perturb = {"aten::layer_norm@ln"};
    T x = s.outside(1);
    s.scope = "ln";
    T y = s.call("aten::layer_norm", {x});  // 1: origin; saves mean/rstd internally
    s.phase = Phase::kBackward;
    T mean{1000, 0, r == &b ? 77u : 78u};  // the saved mean: never a top-level output
    Op o{"aten::native_layer_norm_backward", {tensor("grad_out", y), tensor("mean", mean)}, {tensor("", T{1001, 0, 5})},
         "ln", Phase::kBackward};
    r->add(0, o);
  }
  auto d = diff(a, b, dir);
  REQUIRE(d.report.first_divergent);
  CHECK(d.report.first_divergent->op == "aten::layer_norm");
  CHECK(d.by_suspect_id["1"] == EventClass::kPropagated);
  CHECK(count(d, EventClass::kEntered) == 0);
}

TEST_CASE("a forward op that returns equal bits and saved a tensor for backward that differs is the origin, not "
          "memory changed outside the dispatcher (cross_entropy_loss's log-softmax under another CPU capability)") {
  TempDir dir;
  Run a, b;
  for (Run* r : {&a, &b}) {
    Sim s(*r);
    T x = s.outside(1);
    s.call("aten::relu", {x});  // 0: same
    s.scope = "loss";
    T loss = s.call("aten::cross_entropy_loss", {x});  // 1: same loss; its log-softmax differs, unreturned
    s.scope = "";
    s.call("aten::exp", {x});  // 2: same
    s.phase = Phase::kBackward;
    T log_softmax{1000, 0, r == &b ? 77u : 78u};
    Op o{"aten::nll_loss_backward", {tensor("grad_output", loss), tensor("self", log_softmax)},
         {tensor("", T{1001, 0, r == &b ? 5u : 6u})}, "loss", Phase::kBackward};
    r->add(0, o);  // 3
    Op o2{"aten::mul", {tensor("self", T{1001, 0, r == &b ? 5u : 6u})}, {tensor("", T{1002, 0, r == &b ? 7u : 8u})},
          "loss", Phase::kBackward};
    r->add(0, o2);  // 4: reads 3's output
  }
  auto d = diff(a, b, dir);
  REQUIRE(d.report.first_divergent);
  const auto& f = *d.report.first_divergent;
  CHECK(f.op == "aten::cross_entropy_loss");
  CHECK(f.cls == EventClass::kOrigin);
  CHECK(f.suspect_id == "1");
  CHECK(f.saved_reader == "3");
  CHECK(f.saved_input == "self");
  CHECK(f.saved_candidates == 1);
  CHECK(d.by_suspect_id["1"] == EventClass::kOrigin);  // in --events too
  CHECK(d.by_suspect_id["3"] == EventClass::kPropagated);
  CHECK(d.by_suspect_id["4"] == EventClass::kPropagated);
  CHECK(count(d, EventClass::kEntered) == 0);
  CHECK(d.report.totals.counts[static_cast<int>(EventClass::kOrigin)] == 1);  // the summary counts it
  CHECK(bisect::report_text(d.report).find("a tensor it saved for the backward pass without returning it differs") !=
        std::string::npos);
}

TEST_CASE("activation checkpointing: a backward op reading the mask a recomputed dropout made is propagated from "
          "that dropout, not from the scope's forward ops; a call that recorded no outputs says so") {
  // The suspect recomputes without restoring the generator (preserve_rng_state
  // False): the dropout in backward draws another mask and does not return
  // (checkpoint stops it), and MulBackward0 reads the mask.
  TempDir dir;
  Run a, b;
  for (Run* r : {&a, &b}) {
    const bool suspect = r == &b;
    const T x{1, 0, 10};
    add_op(*r, "aten::relu", {tensor("self", x)}, T{2, 0, 20}, "b1");
    add_op(*r, "aten::dropout", {tensor("input", T{2, 0, 20}), generator(5)}, T{3, 0, 30}, "b1");
    add_op(*r, "aten::add", {tensor("self", T{3, 0, 30})}, T{4, 0, 40}, "b1");
    Op again{"aten::dropout", {tensor("input", T{2, 0, 20}), generator(suspect ? 7 : 5)}, {}, "b1", Phase::kBackward};
    r->add(0, again);  // 3: no outputs
    Op mul{"aten::mul", {tensor("grad", T{9, 0, 90}), tensor("other", T{100, 0, suspect ? 101u : 102u})},
           {tensor("", T{11, 0, suspect ? 111u : 112u})}, "b1", Phase::kBackward};
    r->add(0, mul);  // 4: reads the recomputed mask
  }
  auto d = diff(a, b, dir);
  REQUIRE(d.report.first_divergent);
  const auto& f = *d.report.first_divergent;
  CHECK(f.op == "aten::dropout");
  CHECK(f.phase == "backward");
  CHECK(f.cls == EventClass::kOriginArgs);
  CHECK(f.evidence_note.rfind("no outputs recorded", 0) == 0);
  CHECK(d.by_suspect_id["2"] == EventClass::kSame);  // the forward add is not named
  CHECK(d.by_suspect_id["4"] == EventClass::kPropagated);
  CHECK(count(d, EventClass::kEntered) == 0);
  CHECK(count(d, EventClass::kOrigin) == 0);
}

TEST_CASE("a backward op reading a view its forward op made inside itself (a saved transpose of a weight) is "
          "propagated from that scope, not entered") {
  TempDir dir;
  Run a, b;
  auto op = [](const char* name, std::vector<Value> in, std::vector<T> out, Phase phase = Phase::kForward) {
    Op o{name, std::move(in), {}, "lin", phase};
    for (const auto& t : out) o.outputs.push_back(tensor("", t));
    return o;
  };
  for (Run* r : {&a, &b}) {
    const bool suspect = r == &b;
    const T x{1, 0, 10, {2, 4}}, w{2, 1, 20, {3, 4}};
    r->add(0, op("aten::normal_", {tensor("self", T{2, 0, 0, {3, 4}, DType::kFloat32, 0, {}, 1}, true)}, {w}));
    r->add(0, op("aten::relu", {tensor("self", x)}, {T{3, 0, 30, {2, 4}}}));
    // The origin: linear reads equal x and w and gives other bits.
    r->add(0, op("aten::linear", {tensor("input", T{3, 0, 30, {2, 4}}), tensor("weight", w)},
                 {T{4, 0, suspect ? 41u : 40u, {2, 3}}}));
    // Backward: t of the transposed weight linear saved, a view no event returned.
    const T wt{2, 1, suspect ? 51u : 50u, {4, 3}, DType::kFloat32, 0, {1, 4}};
    r->add(0, op("aten::t", {tensor("self", wt)}, {T{2, 1, 60, {3, 4}}}, Phase::kBackward));
  }
  auto d = diff(a, b, dir);
  REQUIRE(d.report.first_divergent);
  CHECK(d.report.first_divergent->op == "aten::linear");
  CHECK(d.by_suspect_id["3"] == EventClass::kPropagated);
  CHECK(count(d, EventClass::kEntered) == 0);
}

TEST_CASE("origins with full tensors in both runs carry element-wise evidence") {
  TempDir dir;
  Run a, b;
  const float ref_bits[4] = {1.0f, 2.0f, 3.0f, 4.0f};
  float sus_bits[4] = {1.0f, 2.0f, 3.0f, 4.0f};
  uint32_t u;
  std::memcpy(&u, &sus_bits[2], 4);
  u += 3;  // three ULP above 3.0f
  std::memcpy(&sus_bits[2], &u, 4);
  for (Run* r : {&a, &b}) {
    Sim s(*r);
    if (r == &b) s.perturb = {"aten::softmax@"};
    T x = s.outside(1);
    s.call("aten::softmax", {x}, {arg("dim", ValueKind::kInt, "-1")});
    r->attach(0, true, 0, r == &a ? static_cast<const void*>(ref_bits) : sus_bits, sizeof(ref_bits));
  }
  auto d = diff(a, b, dir);
  REQUIRE(d.report.first_divergent);
  const auto& f = *d.report.first_divergent;
  REQUIRE(f.evidence.size() == 1);
  const auto& m = f.evidence[0].metrics;
  CHECK(m.differing == 1);
  CHECK(m.numel == 4);
  CHECK(m.max_ulp == 3);
  CHECK(m.first_index == 2);
  CHECK(m.first_a == 3.0);
  CHECK(f.evidence_note.empty());
  CHECK(f.rerecord_command.empty());
}

TEST_CASE("origins with fingerprints only print the command that re-records the window") {
  TempDir dir;
  Run a, b;
  b.set_env("ATEN_CPU_CAPABILITY", "default");
  for (Run* r : {&a, &b}) {
    Sim s(*r);
    if (r == &b) s.perturb = {"aten::softmax@"};
    T x = s.outside(1);
    s.call("aten::tanh", {x});
    s.call("aten::softmax", {x});
  }
  bisect::DiffOptions o;
  o.opguard_command = "/opt/opguard/bin/opguard";
  // A numerics variable of this process that the recording did not have is
  // removed from the command's environment.
  setenv("OMP_OPGUARD_DIFF_TEST", "1", 1);
  auto d = diff(a, b, dir, o);
  unsetenv("OMP_OPGUARD_DIFF_TEST");
  REQUIRE(d.report.first_divergent);
  const auto& f = *d.report.first_divergent;
  CHECK(f.evidence.empty());
  CHECK(f.evidence_note.find("only fingerprints") != std::string::npos);
  CHECK(f.evidence_note.find("add the program's own") != std::string::npos);  // its variables are not recorded
  CHECK(f.rerecord_command.rfind("cd /work && env -u ", 0) == 0);
  CHECK(f.rerecord_command.find(" -u OMP_OPGUARD_DIFF_TEST ") != std::string::npos);
  CHECK(f.rerecord_command.find(" ATEN_CPU_CAPABILITY=default /opt/opguard/bin/opguard record --out ") !=
        std::string::npos);
  CHECK(f.rerecord_command.find("--dump-around 1:16 -- ./train --steps 5") != std::string::npos);
  // The reference's command unsets what the suspect had (a shell that runs it
  // may have it exported); each name once.
  const std::string ref_cmd = f.rerecord_command.substr(0, f.rerecord_command.find('\n'));
  CHECK(ref_cmd.find(" -u ATEN_CPU_CAPABILITY ") != std::string::npos);
  CHECK(ref_cmd.find(" -u OMP_OPGUARD_DIFF_TEST ") == ref_cmd.rfind(" -u OMP_OPGUARD_DIFF_TEST "));
  // The manifests differ in that knob, and it is listed first.
  REQUIRE_FALSE(d.report.manifest_differences.empty());
  CHECK(d.report.manifest_differences[0].key == "ATEN_CPU_CAPABILITY");
  CHECK_FALSE(d.report.manifest_differences[0].reference);
  CHECK(d.report.manifest_differences.size() == 1);
  // The workers' denormal state of a run with workers against one without
  // (1 thread) is no difference; two values that differ are.
  a.set_info("flush_denormal_workers_at_end", "0");
  auto d2 = diff(a, b, dir, o);
  CHECK(d2.report.manifest_differences.size() == 1);
  b.set_info("flush_denormal_workers_at_end", "1");
  auto d3 = diff(a, b, dir, o);
  CHECK(d3.report.manifest_differences.size() == 2);
}

TEST_CASE("--steps reports only that range while earlier steps still feed the dataflow") {
  TempDir dir;
  bisect::DiffOptions o;
  o.first_step = 2;
  o.last_step = 2;
  auto d = diff_training(dir, 4, [](Sim& s) {
    s.perturb = {"aten::gelu@act"};
    s.perturb_call = 1;
  }, o);
  // The origin is in step 1, outside the range: step 2 is all propagated, no new source.
  CHECK_FALSE(d.report.first_divergent);
  CHECK(count(d, EventClass::kPropagated) == 10);
  CHECK(d.report.events_suspect == 10);
  CHECK(d.report.diverged);
  // ... and says the divergence started before the range.
  REQUIRE(d.report.notes.size() == 1);
  CHECK(d.report.notes[0].find("already differed before step 2") != std::string::npos);
  // Steps read only for the dataflow have no summary rows (they would print as "every event same").
  REQUIRE_FALSE(d.report.summary.empty());
  for (const auto& s : d.report.summary) CHECK(s.step == 2);
}

TEST_CASE("--steps that selects none of the recorded steps is refused, not reported as agreeing") {
  for (auto [first, last] : std::vector<std::pair<std::optional<int64_t>, std::optional<int64_t>>>{
           {9, 9}, {4, std::nullopt}, {std::nullopt, -1}}) {
    TempDir dir;
    bisect::DiffOptions o;
    o.first_step = first;
    o.last_step = last;
    CHECK_THROWS_AS(diff_training(dir, 4, {}, o), UsageError);
  }
  TempDir dir;
  bisect::DiffOptions o;
  o.first_step = 3;  // the last recorded step: compared
  CHECK_FALSE(diff_training(dir, 4, {}, o).report.diverged);
  // Step 3 torn in both runs (both processes died in it): never compared, so not selectable.
  for (const char* run : {"ref", "sus"})
    std::filesystem::rename(std::filesystem::path(dir / run) / "rank0/step00000003.h5",
                            std::filesystem::path(dir / run) / "rank0/step00000003.h5.tmp");
  CHECK_THROWS_AS(bisect::diff_recordings(dir / "ref", dir / "sus", o), UsageError);
  o.first_step = 2;  // step 2 is complete
  CHECK_FALSE(bisect::diff_recordings(dir / "ref", dir / "sus", o).diverged);
}

TEST_CASE("cross-rank mode compares the optimizer and collectives of two replicas") {
  TempDir dir;
  auto replica = [](Run& r, int rank, bool corrupt) {
    Sim s(r);
    T w = s.outside(11);
    T batch = s.outside(100 + rank);  // every rank has its own batch
    s.scope = "fc";
    T h = s.call("aten::mm", {batch, w});
    s.phase = Phase::kBackward;
    T g = s.call("aten::mm", {h, batch});
    // all-reduce: inputs differ across ranks, outputs must agree.
    T reduced = g;
    reduced.version = g.version + 1;
    reduced.fp = 5555;
    Op ar{"c10d::allreduce_", {tensor("tensors", g, true)}, {tensor("", reduced)}, "", Phase::kBackward};
    r.add(0, ar);
    if (corrupt) reduced.fp = 6666;  // a bit flip in the gradient after the all-reduce
    s.phase = Phase::kOptimizer;
    s.scope = "";
    s.inplace("aten::add_", w, {reduced});
  };
  Run r0(0, 2), r1(1, 2);
  replica(r0, 0, false);
  replica(r1, 1, false);
  r0.write(dir / "run");
  r1.write(dir / "run");
  bisect::DiffOptions o;
  o.list_events = true;
  auto ok = bisect::diff_ranks(dir / "run", 0, 1, o);
  CHECK_FALSE(ok.diverged);
  CHECK(ok.totals.not_compared == 2);
  CHECK(ok.totals.counts[0] == 2);  // all-reduce and add_

  Run c0(0, 2), c1(1, 2);
  replica(c0, 0, false);
  replica(c1, 1, true);
  std::filesystem::remove_all(dir / "run2");
  c0.write(dir / "run2");
  c1.write(dir / "run2");
  auto bad = bisect::diff_ranks(dir / "run2", 0, 1, o);
  CHECK(bad.diverged);
  REQUIRE(bad.first_divergent);
  CHECK(bad.first_divergent->cls == EventClass::kEntered);
  CHECK(bad.first_divergent->op == "aten::add_");
  REQUIRE(bad.first_divergent->producer_id);
  CHECK(bad.first_divergent->producer_op == "c10d::allreduce_");
}

TEST_CASE("two runs of two ranks: an all-reduce that started before the other rank's origin is not named first") {
  // Rank 1's mm is perturbed in the suspect. Rank 0 enters the gradient
  // all-reduce before that mm runs; its local input is equal in both runs,
  // its output differs (rank 1's contribution did). The first divergent
  // operator is rank 1's mm; rank 0's all-reduce says where its bits came from.
  TempDir dir;
  auto rank_run = [](Run& r, int rank, bool suspect) {
    const int64_t mm_start = rank == 0 ? 1000 : 3000;
    T batch{1, 0, static_cast<uint64_t>(100 + rank), {4}};
    T w{2, 0, 11, {4}};
    T g{3, 0, static_cast<uint64_t>(200 + rank), {4}};
    if (suspect && rank == 1) g.fp ^= 0x5a5a;
    r.add_at(0, Op{"aten::mm", {tensor("self", batch), tensor("mat2", w)}, {tensor("", g)}, "fc", Phase::kBackward},
             mm_start, mm_start + 500);
    T reduced = g;
    reduced.version = 1;
    reduced.fp = suspect ? 7777 : 5555;
    r.add_at(0, Op{"c10d::allreduce_", {tensor("tensors", g, true)}, {tensor("", reduced)}, "", Phase::kBackward},
             rank == 0 ? 2000 : 4000, 9000);
    T w2 = w;
    w2.version = 1;
    w2.fp = suspect ? 8888 : 6666;
    r.add_at(0, Op{"aten::add_", {tensor("self", w, true), tensor("other", reduced)}, {tensor("", w2)}, "",
                   Phase::kOptimizer}, 9500, 9600);
  };
  Run a0(0, 2), a1(1, 2), b0(0, 2), b1(1, 2);
  rank_run(a0, 0, false);
  rank_run(a1, 1, false);
  rank_run(b0, 0, true);
  rank_run(b1, 1, true);
  a0.write(dir / "a");
  a1.write(dir / "a");
  b0.write(dir / "b");
  b1.write(dir / "b");
  bisect::DiffOptions o;
  o.max_origins = 10;
  const auto r = bisect::diff_recordings(dir / "a", dir / "b", o);
  REQUIRE(r.first_divergent);
  CHECK(r.first_divergent->rank == 1);
  CHECK(r.first_divergent->op == "aten::mm");
  CHECK(r.first_divergent->cls == EventClass::kOrigin);
  const bisect::DivergentEvent* reduce0 = nullptr;
  for (const auto& d : r.origins)
    if (d.rank == 0 && d.op == "c10d::allreduce_") reduce0 = &d;
  REQUIRE(reduce0 != nullptr);
  CHECK(reduce0->collective_equal_inputs);
  CHECK(reduce0->cause_note.find("rank 1 (aten::mm") != std::string::npos);
}

TEST_CASE("the JSON report follows schema opguard-diff/1") {
  TempDir dir;
  auto d = diff_training(dir, 2, [](Sim& s) { s.perturb = {"aten::gelu@act"}; });
  auto j = nlohmann::json::parse(bisect::report_json(d.report));
  CHECK(j["schema"] == "opguard-diff/1");
  CHECK(j["diverged"] == true);
  CHECK(j["first_divergent"]["class"] == "origin");
  CHECK(j["first_divergent"]["op"] == "aten::gelu");
  CHECK(j["first_divergent"]["suspect_id"] == "1");
  CHECK(j["summary"].is_array());
  // gelu computes other bits in both steps, but in step 1 its input already
  // differs (the weights of step 0's update): propagated there.
  CHECK(j["totals"]["counts"]["origin"] == 1);
  CHECK(j["origins"].size() == 1);
  CHECK(j["events"].size() == 20);
}

TEST_CASE("the trace is trace-event JSON with processes, slices, flows, a counter and the first divergence marked") {
  TempDir dir;
  bisect::DiffOptions o;
  o.trace_path = dir / "trace.json";
  auto d = diff_training(dir, 2, [](Sim& s) { s.perturb = {"aten::gelu@act"}; }, o);
  CHECK(d.report.trace_path == o.trace_path);
  std::ifstream in(o.trace_path);
  auto j = nlohmann::json::parse(in);
  REQUIRE(j["traceEvents"].is_array());
  std::set<std::string> process_names;
  int slices = 0, flows_s = 0, flows_f = 0, counters = 0, marks = 0, first = 0;
  std::set<int> pids;
  for (const auto& e : j["traceEvents"]) {
    REQUIRE(e.contains("ph"));
    REQUIRE(e.contains("pid"));
    const std::string ph = e["ph"];
    if (ph == "M" && e["name"] == "process_name") process_names.insert(e["args"]["name"]);
    if (ph == "X") {
      ++slices;
      CHECK(e["ts"].is_number());
      CHECK(e["dur"].is_number());
      CHECK(e.contains("tid"));
      CHECK(e["args"].contains("class"));
      pids.insert(e["pid"].get<int>());
      first += e["name"].get<std::string>().rfind("FIRST DIVERGENT", 0) == 0;
    }
    flows_s += ph == "s";
    flows_f += ph == "f";
    counters += ph == "C";
    marks += ph == "i";
  }
  CHECK(process_names.size() == 2);
  CHECK(pids.size() == 2);
  CHECK(slices == 40);
  CHECK(flows_s == flows_f);
  CHECK(flows_s > 0);
  CHECK(counters == 2);
  CHECK(marks == 1);
  CHECK(first == 1);
}

TEST_CASE("a directory that is not a recording and a rank neither run has are clear errors") {
  TempDir dir;
  Run a;
  Sim s(a);
  s.call("aten::exp", {s.outside(1)});
  a.write(dir / "ref");
  std::filesystem::create_directories(dir / "empty");
  CHECK_THROWS_AS(bisect::diff_recordings(dir / "ref", dir / "empty", {}), FormatError);
  CHECK_THROWS_AS(bisect::diff_recordings(dir / "missing", dir / "ref", {}), FormatError);
  bisect::DiffOptions o;
  o.rank = 3;
  CHECK_THROWS_AS(bisect::diff_recordings(dir / "ref", dir / "ref", o), UsageError);
  CHECK_THROWS_AS(bisect::diff_ranks(dir / "ref", 0, 0, {}), UsageError);
  CHECK_THROWS_AS(bisect::diff_ranks(dir / "ref", 0, 1, {}), UsageError);
  // A rank only the reference has: not compared, a divergence, and no claim
  // that the manifests agree (there was no pair of them to compare).
  Run a1(1, 2);
  Sim s1(a1);
  s1.call("aten::exp", {s1.outside(1)});
  a1.write(dir / "ref");
  Run b;
  Sim sb(b);
  sb.call("aten::exp", {sb.outside(1)});
  b.write(dir / "sus");
  o.rank = 1;
  const auto only = bisect::diff_recordings(dir / "ref", dir / "sus", o);
  CHECK(only.diverged);
  CHECK(bisect::report_text(only).find("manifests not compared: no rank is in both runs") != std::string::npos);
}

TEST_CASE("a step only one run has is reported and counts as a divergence") {
  TempDir dir;
  auto d = diff_training(dir, 3, {}, {}, 2);
  CHECK(d.report.diverged);
  CHECK_FALSE(d.report.first_divergent);
  CHECK(d.report.totals.unmatched_reference == 10);
  bool noted = false;
  for (const auto& n : d.report.notes) noted = noted || n.find("step 2 of rank 0 is only in the reference") != std::string::npos;
  CHECK(noted);
}
