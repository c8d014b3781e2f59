// The recorder inside this process (opguard::Recorder), on crafted op
// sequences whose events are known.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>
#include <torch/library.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <map>
#include <set>
#include <thread>

#include "opguard/core/error.h"
#include "opguard/core/openmp_team.h"
#include "opguard/formats/recording.h"
#include "opguard/kernels/fingerprint.h"
#include "opguard/record/recorder.h"
#include "opguard/record/scope.h"

// doctest after the torch headers (STYLE.md: glog's CHECK).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

namespace fs = std::filesystem;
using opguard::formats::Event;
using opguard::formats::StepReader;

namespace {

std::string temp_dir() {
  char tmpl[] = "/tmp/opguard-record-test-XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  return std::string(tmpl) + "/rec";
}

uint64_t fp_of(const at::Tensor& t0) {
  at::Tensor t = t0.contiguous();
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
  opguard::DType d = t.scalar_type() == at::kFloat ? opguard::DType::kFloat32
                     : t.scalar_type() == at::kDouble ? opguard::DType::kFloat64
                     : t.scalar_type() == at::kLong ? opguard::DType::kInt64
                     : opguard::DType::kUInt8;
  opguard::kernels::TensorView v{d, sizes.data(), nullptr, static_cast<int>(sizes.size()), t.const_data_ptr()};
  return opguard::kernels::fingerprint(v);
}

struct Recorded {
  std::vector<Event> events;  // all steps, in order
  opguard::formats::RecordingLayout layout;
  std::string dir;
};

Recorded read_all(const std::string& dir) {
  Recorded r;
  r.dir = dir;
  r.layout = opguard::formats::scan_recording(dir);
  REQUIRE(r.layout.ranks.size() == 1);
  for (const auto& [step, path] : r.layout.ranks[0].steps) {
    StepReader reader(path);
    for (const auto& e : reader.events()) r.events.push_back(e);
  }
  return r;
}

template <typename Fn>
Recorded record(Fn&& body, const std::string& policy = "") {
  const std::string dir = temp_dir();
  opguard::RecorderOptions options;
  options.out_dir = dir;
  options.policy = policy;
  opguard::Recorder::start(options);
  body();
  opguard::Recorder::stop();
  return read_all(dir);
}

std::vector<const Event*> find_ops(const Recorded& r, const std::string& op) {
  std::vector<const Event*> out;
  for (const auto& e : r.events)
    if (e.op == op) out.push_back(&e);
  return out;
}

}  // namespace

TEST_CASE("every top-level operator is one event and the ops inside it are not") {
  at::Tensor x = at::ones({4, 3});
  at::Tensor w = at::ones({2, 3});
  at::Tensor b = at::zeros({2});
  auto r = record([&] { at::linear(x, w, b); });
  auto linear = find_ops(r, "aten::linear");
  REQUIRE(linear.size() == 1);
  REQUIRE(find_ops(r, "aten::addmm").empty());  // nested inside linear
  REQUIRE(linear[0]->inputs.size() == 3);
  REQUIRE(linear[0]->inputs[0].name == "input");
  REQUIRE(linear[0]->inputs[0].tensor.fingerprint == fp_of(x));
  REQUIRE(linear[0]->outputs.size() == 1);
  REQUIRE(linear[0]->outputs[0].tensor.sizes == std::vector<int64_t>{4, 2});
  REQUIRE(linear[0]->outputs[0].tensor.fingerprint == fp_of(at::linear(x, w, b)));
  REQUIRE(linear[0]->schema.find("aten::linear(Tensor input") == 0);
}

TEST_CASE("events built in the writer's recycled event objects carry only their own values") {
  // The writer hands written events back to the hook to be refilled. Events
  // of a five-argument op are written (the step ends: the writer takes them
  // at once), then a one-argument op runs in the recycled objects.
  at::Tensor bias = at::ones({3, 2});
  at::Tensor a = at::full({3, 4}, 0.5f);
  at::Tensor b = at::full({4, 2}, 0.25f);
  constexpr int kOps = 400;
  std::vector<at::Tensor> negs;
  auto r = record([&] {
    for (int i = 0; i < kOps; ++i) at::addmm(bias, a, b);
    opguard::mark_step();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    for (int i = 0; i < kOps; ++i) negs.push_back(at::full({5}, static_cast<float>(i)).neg());
  });
  REQUIRE(find_ops(r, "aten::addmm").size() == kOps);
  auto neg = find_ops(r, "aten::neg");
  REQUIRE(neg.size() == kOps);
  for (int i = 0; i < kOps; ++i) {
    const Event& e = *neg[i];
    REQUIRE(e.op == "aten::neg");
    REQUIRE(e.step == 1);
    REQUIRE(e.inputs.size() == 1);
    REQUIRE(e.inputs[0].name == "self");
    REQUIRE(e.inputs[0].tensor.sizes == std::vector<int64_t>{5});
    REQUIRE(e.inputs[0].tensor.fingerprint == fp_of(at::full({5}, static_cast<float>(i))));
    REQUIRE(e.outputs.size() == 1);
    REQUIRE(e.outputs[0].tensor.fingerprint == fp_of(negs[i]));
    REQUIRE(e.outputs[0].tensor.flags == 0);
  }
}

TEST_CASE("a tensor an op overwrites in place is fingerprinted before the write") {
  at::Tensor x = at::ones({1000});
  const uint64_t ones_fp = fp_of(x);
  const uint64_t twos_fp = fp_of(at::full({1000}, 2.0f));
  auto r = record([&] {
    at::Tensor y = x.mul(3);  // reads x: queued, hashed later
    x.add_(1);                // overwrites x: the queued read must see ones
  });
  auto mul = find_ops(r, "aten::mul");
  auto add = find_ops(r, "aten::add_");
  REQUIRE(mul.size() == 1);
  REQUIRE(add.size() == 1);
  REQUIRE(mul[0]->inputs[0].tensor.fingerprint == ones_fp);
  REQUIRE(add[0]->inputs[0].mutated);
  REQUIRE(add[0]->inputs[0].tensor.fingerprint == ones_fp);
  REQUIRE(add[0]->outputs[0].tensor.fingerprint == twos_fp);
  REQUIRE(add[0]->outputs[0].tensor.storage_id == add[0]->inputs[0].tensor.storage_id);
  REQUIRE(add[0]->outputs[0].tensor.version == add[0]->inputs[0].tensor.version + 1);
}

TEST_CASE("what an op writes and does not return is recorded after it as outputs; what it returns is not repeated") {
  // _foreach_add_ returns nothing: its outputs are the list it wrote, as it
  // left it (named and marked like the argument). add_ returns what it writes:
  // one output. (A divergence inside a foreach op would otherwise be seen
  // first by the op that reads the list.)
  std::vector<at::Tensor> xs = {at::ones({5000}), at::full({300}, 3.0f)};
  std::vector<at::Tensor> ys = {at::ones({5000}), at::ones({300})};
  const uint64_t before0 = fp_of(xs[0]), before1 = fp_of(xs[1]);
  const uint64_t after0 = fp_of(at::full({5000}, 2.0f)), after1 = fp_of(at::full({300}, 4.0f));
  at::Tensor z = at::ones({8});
  auto r = record([&] {
    at::_foreach_add_(xs, ys);
    z.add_(1);
    at::cat(xs);
  });
  auto foreach = find_ops(r, "aten::_foreach_add_");
  REQUIRE(foreach.size() == 1);
  const Event& e = *foreach[0];
  REQUIRE(e.inputs[0].kind == opguard::formats::ValueKind::kTensorList);
  CHECK(e.inputs[1].tensor.fingerprint == before0);
  CHECK(e.inputs[2].tensor.fingerprint == before1);
  REQUIRE(e.outputs.size() == 3);
  CHECK(e.outputs[0].kind == opguard::formats::ValueKind::kTensorList);
  CHECK(e.outputs[0].name == "self");
  CHECK(e.outputs[0].list_len == 2);
  for (const auto& v : e.outputs) CHECK(v.mutated);
  CHECK(e.outputs[1].tensor.fingerprint == after0);
  CHECK(e.outputs[2].tensor.fingerprint == after1);
  CHECK(e.outputs[1].tensor.storage_id == e.inputs[1].tensor.storage_id);
  CHECK(e.outputs[1].tensor.version == e.inputs[1].tensor.version + 1);
  auto add = find_ops(r, "aten::add_");
  REQUIRE(add.size() == 1);
  CHECK(add[0]->outputs.size() == 1);
  CHECK_FALSE(add[0]->outputs[0].mutated);
  // The cat reads the lists the foreach op produced.
  auto cat = find_ops(r, "aten::cat");
  REQUIRE(cat.size() == 1);
  CHECK(cat[0]->inputs[1].tensor.fingerprint == after0);
}

TEST_CASE("grad mode and requires_grad are recorded: a parameter is a leaf, an activation computed") {
  // Kernels choose their path by them (matmul folds a 3-d operand into one mm
  // when the other requires grad), so replay needs both.
  namespace f = opguard::formats;
  at::Tensor w = at::randn({4, 5}).requires_grad_(true);
  at::Tensor x = at::randn({3, 4});
  auto r = record([&] {
    at::Tensor h = at::mm(x, w);  // grad mode on: w a leaf that requires grad
    at::relu(h);                  // h computed
    at::NoGradGuard no_grad;
    at::neg(w);
  });
  auto mm = find_ops(r, "aten::mm");
  REQUIRE(mm.size() == 1);
  CHECK((mm[0]->flags & f::kEventGradMode));
  CHECK((mm[0]->inputs[0].tensor.flags & (f::kTensorRequiresGrad | f::kTensorNonLeaf)) == 0);
  CHECK((mm[0]->inputs[1].tensor.flags & (f::kTensorRequiresGrad | f::kTensorNonLeaf)) == f::kTensorRequiresGrad);
  CHECK((mm[0]->outputs[0].tensor.flags & (f::kTensorRequiresGrad | f::kTensorNonLeaf)) ==
        (f::kTensorRequiresGrad | f::kTensorNonLeaf));
  auto relu = find_ops(r, "aten::relu");
  REQUIRE(relu.size() == 1);
  CHECK((relu[0]->inputs[0].tensor.flags & f::kTensorNonLeaf));
  auto neg = find_ops(r, "aten::neg");
  REQUIRE(neg.size() == 1);
  CHECK_FALSE((neg[0]->flags & f::kEventGradMode));
  CHECK((neg[0]->inputs[0].tensor.flags & f::kTensorRequiresGrad));
  CHECK_FALSE((neg[0]->outputs[0].tensor.flags & f::kTensorRequiresGrad));
}

TEST_CASE("a storage keeps its id while it lives, and storages made and freed by the thousand each get their own") {
  // Thousands of short-lived outputs make the recorder sweep its table of
  // storages (and reuse their addresses) while `acc` lives throughout.
  at::Tensor acc = at::zeros({4});
  constexpr int kOps = 5000;
  auto r = record([&] {
    for (int i = 0; i < kOps; ++i) {
      at::Tensor x = at::full({4}, static_cast<float>(i)).neg();
      acc.add_(x);
    }
  });
  auto neg = find_ops(r, "aten::neg");
  auto add = find_ops(r, "aten::add_");
  REQUIRE(neg.size() == kOps);
  REQUIRE(add.size() == kOps);
  std::set<uint64_t> outputs;
  for (const Event* e : neg) outputs.insert(e->outputs[0].tensor.storage_id);
  REQUIRE(outputs.size() == kOps);  // a new storage each time, whatever its address
  const uint64_t acc_id = add[0]->inputs[0].tensor.storage_id;
  REQUIRE(outputs.count(acc_id) == 0);
  for (int i = 0; i < kOps; ++i) {
    REQUIRE(add[i]->inputs[0].tensor.storage_id == acc_id);
    REQUIRE(add[i]->inputs[0].tensor.version == add[0]->inputs[0].tensor.version + static_cast<uint32_t>(i));
    REQUIRE(add[i]->inputs[1].tensor.storage_id == neg[i]->outputs[0].tensor.storage_id);
  }
}

TEST_CASE("the output of empty and the old content its first writer overwrites are marked uninitialised") {
  auto r = record([&] {
    at::Tensor t = at::empty({16});
    t.fill_(2.0);
    at::Tensor u = t.mul(2);
  });
  auto empty = find_ops(r, "aten::empty");
  auto fill = find_ops(r, "aten::fill_");
  REQUIRE(empty.size() == 1);
  REQUIRE(fill.size() == 1);
  REQUIRE((empty[0]->outputs[0].tensor.flags & opguard::formats::kTensorUninitialized));
  REQUIRE_FALSE(empty[0]->outputs[0].tensor.has_fingerprint());
  REQUIRE((fill[0]->inputs[0].tensor.flags & opguard::formats::kTensorUninitialized));
  REQUIRE(fill[0]->outputs[0].tensor.has_fingerprint());
  REQUIRE(fill[0]->outputs[0].tensor.fingerprint == fp_of(at::full({16}, 2.0f)));
  auto mul = find_ops(r, "aten::mul");
  REQUIRE(mul.size() == 1);
  REQUIRE(mul[0]->inputs[0].tensor.has_fingerprint());  // initialised by then
}

TEST_CASE("backward ops are events of phase backward with the scope of their forward op") {
  at::Tensor x = at::ones({3, 4});
  at::Tensor w = at::full({4, 2}, 0.5).set_requires_grad(true);
  auto r = record([&] {
    at::Tensor y;
    {
      opguard::Scope s("layer");
      y = at::mm(x, w);
    }
    at::Tensor loss = y.sum();
    loss.backward();
    opguard::mark_step();
  });
  bool found_mm_backward = false;
  for (const auto& e : r.events) {
    if (e.phase == opguard::formats::Phase::kBackward && e.node == "MmBackward0" && e.op == "aten::mm") {
      found_mm_backward = true;
      REQUIRE(e.scope == "layer");
    }
  }
  REQUIRE(found_mm_backward);
  auto mm = find_ops(r, "aten::mm");
  REQUIRE(mm[0]->phase == opguard::formats::Phase::kForward);
  REQUIRE(mm[0]->scope == "layer");
}

TEST_CASE("the autograd nodes that the ops inside a composite op create carry the composite op's scope") {
  // at::linear is one event; the addmm (or mm) and t it calls are not, and
  // they create the nodes whose backward ops must still say "proj".
  at::Tensor x = at::ones({3, 4});
  at::Tensor w = at::full({2, 4}, 0.5).set_requires_grad(true);
  at::Tensor b = at::zeros({2}).set_requires_grad(true);
  auto r = record([&] {
    at::Tensor y;
    {
      opguard::Scope s("proj");
      y = at::linear(x, w, b);
    }
    y.sum().backward();
    opguard::mark_step();
  });
  REQUIRE(find_ops(r, "aten::linear").size() == 1);
  REQUIRE(find_ops(r, "aten::addmm").empty());
  std::set<std::string> nodes;
  for (const auto& e : r.events) {
    if (e.phase != opguard::formats::Phase::kBackward || e.node.empty() || e.node == "SumBackward0") continue;
    if (e.node.rfind("torch::autograd::AccumulateGrad", 0) == 0) continue;
    nodes.insert(e.node);
    CAPTURE(e.node);
    CAPTURE(e.op);
    REQUIRE(e.scope == "proj");
  }
  MESSAGE("backward nodes of linear: " << nodes.size());
  REQUIRE(nodes.count("AddmmBackward0") == 1);
}

TEST_CASE("RecordFunction is on again after a recorded op, also when the op throws") {
  auto r = record([&] {
    REQUIRE(at::isRecordFunctionEnabled());
    at::Tensor y = at::ones({2, 2}).add(1);
    REQUIRE(at::isRecordFunctionEnabled());
    REQUIRE_THROWS(at::mm(at::ones({2, 3}), at::ones({2, 3})));
    REQUIRE(at::isRecordFunctionEnabled());
    at::Tensor z = y.mul(2);
    opguard::mark_step();
  });
  REQUIRE(find_ops(r, "aten::mul").size() == 1);
}

TEST_CASE("mark_step ends a step: events after it are in the next step file") {
  at::Tensor x = at::ones({8});
  auto r = record([&] {
    x.mul(2);
    opguard::mark_step();
    x.mul(3);
    x.mul(4);
    opguard::mark_step();
  });
  REQUIRE(r.layout.ranks[0].steps.size() == 2);
  auto mul = find_ops(r, "aten::mul");
  REQUIRE(mul.size() == 3);
  REQUIRE(mul[0]->step == 0);
  REQUIRE(mul[1]->step == 1);
  REQUIRE(mul[2]->step == 1);
  REQUIRE(mul[1]->id == mul[0]->id + 1);  // main thread: consecutive ids
}

// A training loop without mark_step() or an Optimizer.step range (a C++
// program on libtorch's optimizers, a compiled optimizer step): the recorder
// infers the steps. Two micro-batches a step (a forward right after a
// backward, no update between) stay in one step; an initialisation that
// writes the parameter before any backward is no update; an update after a
// backward ends the step at the next forward op of the training thread, also
// when that thread is not the process's main thread.
void sgd_steps(at::Tensor& w, int steps, int micro_batches) {
  {
    at::NoGradGuard no_grad;
    w.mul_(0.5);  // initialisation
  }
  at::Tensor x = at::ones({3, 4});
  for (int s = 0; s < steps; ++s) {
    for (int m = 0; m < micro_batches; ++m) at::mm(x, w).sum().backward();
    at::NoGradGuard no_grad;
    w.sub_(w.grad() * 0.1);
    w.mutable_grad().zero_();
  }
}

void require_inferred_steps(const Recorded& r, int steps, int micro_batches) {
  REQUIRE(r.layout.ranks[0].steps.size() == static_cast<std::size_t>(steps));
  std::map<int64_t, int> forward_mm, updates;
  for (const auto& e : r.events) {
    if (e.op == "aten::mm" && e.phase == opguard::formats::Phase::kForward) ++forward_mm[e.step];
    if (e.op == "aten::sub_") ++updates[e.step];
  }
  for (int s = 0; s < steps; ++s) {
    CAPTURE(s);
    CHECK(forward_mm[s] == micro_batches);
    CHECK(updates[s] == 1);
  }
}

TEST_CASE("without mark_step or optimizer ranges, a step ends at the forward after a backward and an update") {
  SUBCASE("one micro-batch a step") {
    at::Tensor w = at::full({4, 2}, 0.5).set_requires_grad(true);
    require_inferred_steps(record([&] { sgd_steps(w, 3, 1); }), 3, 1);
  }
  SUBCASE("gradient accumulation over two micro-batches") {
    at::Tensor w = at::full({4, 2}, 0.5).set_requires_grad(true);
    require_inferred_steps(record([&] { sgd_steps(w, 3, 2); }), 3, 2);
  }
  SUBCASE("training on a thread other than the main thread") {
    at::Tensor w = at::full({4, 2}, 0.5).set_requires_grad(true);
    require_inferred_steps(record([&] { std::thread([&] { sgd_steps(w, 3, 2); }).join(); }), 3, 2);
  }
  SUBCASE("a read of the loss after the update, then mark_step: the program's steps, none inferred before") {
    // The inferred boundary waits for a forward op that reads a parameter;
    // loss.item() does not, and mark_step() then takes over.
    at::Tensor w = at::full({4, 2}, 0.5).set_requires_grad(true);
    at::Tensor x = at::ones({3, 4});
    auto r = record([&] {
      for (int s = 0; s < 3; ++s) {
        at::Tensor loss = at::mm(x, w).sum();
        loss.backward();
        {
          at::NoGradGuard no_grad;
          w.sub_(w.grad() * 0.1);
          w.mutable_grad().zero_();
        }
        (void)loss.item<float>();
        opguard::mark_step();
      }
    });
    CHECK(r.layout.ranks[0].steps.size() == 3);
    // Each step holds its update and the read of its loss.
    std::vector<int64_t> updates, reads;
    for (const auto& e : r.events) {
      if (e.op == "aten::sub_") updates.push_back(e.step);
      if (e.op == "aten::item") reads.push_back(e.step);
    }
    CHECK(updates == std::vector<int64_t>{0, 1, 2});
    CHECK(reads == std::vector<int64_t>{0, 1, 2});
  }
}

TEST_CASE("the sampling policy stores full tensors for the steps it names only") {
  at::Tensor x = at::arange(10, at::kFloat);
  auto r = record(
      [&] {
        x.mul(2);
        opguard::mark_step();
        x.mul(3);
        opguard::mark_step();
      },
      "steps=1");
  auto mul = find_ops(r, "aten::mul");
  REQUIRE(mul.size() == 2);
  REQUIRE_FALSE((mul[0]->outputs[0].tensor.flags & opguard::formats::kTensorHasData));
  REQUIRE((mul[1]->outputs[0].tensor.flags & opguard::formats::kTensorHasData));
  StepReader reader(r.layout.ranks[0].steps[1].second);
  auto data = reader.read_tensor(mul[1]->outputs[0].tensor.data_index);
  at::Tensor expected = x.mul(3);
  REQUIRE(data.bytes.size() == 40);
  REQUIRE(std::memcmp(data.bytes.data(), expected.const_data_ptr(), 40) == 0);
}

TEST_CASE("a random op carries the generator state as an input, which differs with the seed") {
  auto run = [&](uint64_t seed) {
    return record([&] {
      at::manual_seed(seed);
      at::randn({32});
    });
  };
  auto a = run(1), b = run(1), c = run(2);
  auto gen_fp = [](const Recorded& r) {
    auto randn = find_ops(r, "aten::randn");
    REQUIRE(randn.size() == 1);
    for (const auto& v : randn[0]->inputs)
      if (v.kind == opguard::formats::ValueKind::kGenerator) return v.tensor.fingerprint;
    FAIL("randn has no generator input");
    return uint64_t{0};
  };
  REQUIRE(gen_fp(a) == gen_fp(b));
  REQUIRE(gen_fp(a) != gen_fp(c));
  REQUIRE(find_ops(a, "aten::randn")[0]->outputs[0].tensor.fingerprint ==
          find_ops(b, "aten::randn")[0]->outputs[0].tensor.fingerprint);
}

TEST_CASE("events of another thread form their own stream and do not shift the main thread's ids") {
  at::Tensor x = at::ones({8});
  auto r = record([&] {
    x.mul(2);
    std::thread t([&] {
      x.mul(5);
      x.mul(6);
    });
    t.join();
    x.mul(3);
  });
  auto mul = find_ops(r, "aten::mul");
  REQUIRE(mul.size() == 4);
  std::vector<uint64_t> main_ids, other_ids;
  for (const auto* e : mul) (e->stream == 0 ? main_ids : other_ids).push_back(e->id);
  REQUIRE(main_ids.size() == 2);
  REQUIRE(other_ids.size() == 2);
  REQUIRE(main_ids[1] == main_ids[0] + 1);
  REQUIRE((other_ids[0] >> 48) != 0);
}

TEST_CASE("an output directory that cannot be created stops the recording but not the program") {
  char tmpl[] = "/tmp/opguard-record-test-XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  const std::string file = std::string(tmpl) + "/a-file";
  FILE* f = std::fopen(file.c_str(), "w");
  REQUIRE(f != nullptr);
  std::fclose(f);
  opguard::RecorderOptions options;
  options.out_dir = file + "/rec";  // under a regular file: mkdir fails even as root
  opguard::Recorder::start(options);
  at::Tensor y = at::ones({4}).mul(2);
  opguard::Recorder::stop();
  REQUIRE(y.sum().item<float>() == 8.0f);
  REQUIRE(opguard::Recorder::stats().failed);
}

TEST_CASE("a bad sampling policy is refused before anything is recorded") {
  opguard::RecorderOptions options;
  options.out_dir = temp_dir();
  options.policy = "steps=banana";
  REQUIRE_THROWS_AS(opguard::Recorder::start(options), opguard::Error);
  REQUIRE_FALSE(opguard::Recorder::active());
  // Byte counts that wrapped around 2^64 (a budget of 2^64 + 1024 was 1024).
  options.policy = "all;budget=18014398509481985K";
  REQUIRE_THROWS_AS(opguard::Recorder::start(options), opguard::UsageError);
  options.policy = "all";
  options.queue = "bytes=99999999999G";
  REQUIRE_THROWS_AS(opguard::Recorder::start(options), opguard::UsageError);
  REQUIRE_FALSE(opguard::Recorder::active());
}

// --- several threads at once ---------------------------------------------------

namespace {

uint64_t os_thread_id() { return static_cast<uint64_t>(::syscall(SYS_gettid)); }

// Lets `n` threads start their ops at the same moment.
class StartLine {
 public:
  explicit StartLine(int n) : left_(n) {}
  void arrive_and_wait() {
    left_.fetch_sub(1);
    while (left_.load() > 0) std::this_thread::yield();
  }

 private:
  std::atomic<int> left_;
};

}  // namespace

TEST_CASE("ops of the main thread, two data threads and a backward on a fourth thread, run at once, are all recorded with their thread") {
  constexpr int kOps = 40;
  constexpr int kWorkers = 3;  // the main thread and two data threads run kOps adds each
  std::vector<at::Tensor> inputs;
  for (int k = 0; k < kWorkers; ++k) inputs.push_back(at::full({32}, static_cast<double>(k + 1)));
  at::Tensor x = at::full({8, 4}, 0.25);
  at::Tensor w = at::full({4, 3}, 0.5).set_requires_grad(true);
  std::vector<uint64_t> tids(kWorkers + 1, 0);
  StartLine start(kWorkers + 1);
  auto r = record([&] {
    auto adds = [&](int k) {
      tids[k] = os_thread_id();
      start.arrive_and_wait();
      for (int i = 0; i < kOps; ++i) inputs[k].add(i);
    };
    std::thread data1(adds, 1), data2(adds, 2);
    std::thread trainer([&] {
      tids[kWorkers] = os_thread_id();
      start.arrive_and_wait();
      at::Tensor loss = at::mm(x, w).sum();
      loss.backward();
    });
    adds(0);
    data1.join();
    data2.join();
    trainer.join();
  });
  REQUIRE(tids[0] == static_cast<uint64_t>(getpid()));
  std::map<uint64_t, std::vector<const Event*>> by_thread;
  for (const auto& e : r.events) by_thread[e.thread].push_back(&e);
  // Every event belongs to one of the four threads: none lost to another's
  // stream, none recorded twice.
  for (const auto& [tid, events] : by_thread) {
    INFO("thread " << tid << " with " << events.size() << " events");
    REQUIRE(std::find(tids.begin(), tids.end(), tid) != tids.end());
  }
  std::set<uint32_t> streams;
  for (int k = 0; k < kWorkers; ++k) {
    const auto& events = by_thread[tids[k]];
    std::vector<const Event*> adds;
    for (const Event* e : events)
      if (e->op == "aten::add") adds.push_back(e);
    REQUIRE(adds.size() == static_cast<std::size_t>(kOps));
    // One stream per thread, its ids consecutive in the order the thread ran them.
    const uint32_t stream = adds[0]->stream;
    REQUIRE(streams.insert(stream).second);
    REQUIRE((stream == 0) == (k == 0));
    for (int i = 0; i < kOps; ++i) {
      REQUIRE(adds[i]->stream == stream);
      REQUIRE(adds[i]->id == opguard::formats::make_event_id(stream, adds[0]->seq + i));
      REQUIRE(adds[i]->inputs[0].tensor.fingerprint == fp_of(inputs[k]));
      REQUIRE(adds[i]->outputs[0].tensor.fingerprint == fp_of(inputs[k].add(i)));
    }
  }
  // The backward pass ran on the thread that called backward(), with its own stream.
  const auto& trained = by_thread[tids[kWorkers]];
  std::size_t backward = 0;
  bool mm_backward = false;
  for (const Event* e : trained) {
    REQUIRE(e->stream == trained[0]->stream);
    if (e->phase != opguard::formats::Phase::kBackward) continue;
    ++backward;
    if (e->node == "MmBackward0" && e->op == "aten::mm") {
      mm_backward = true;
      REQUIRE(e->outputs[0].tensor.fingerprint == fp_of(at::mm(x.t(), at::ones({8, 3}))));
    }
  }
  REQUIRE(streams.count(trained[0]->stream) == 0);
  REQUIRE(backward > 0);
  REQUIRE(mm_backward);
}

TEST_CASE("ops dispatched from torch's worker threads (intra-op parallel_for, inter-op launch) are recorded with the worker's thread") {
  const int old_threads = at::get_num_threads();
  at::set_num_threads(2);
  constexpr int64_t kItems = 8;
  std::vector<at::Tensor> xs;
  for (int64_t i = 0; i < kItems; ++i) xs.push_back(at::full({16}, static_cast<double>(i)));
  std::vector<uint64_t> item_thread(kItems, 0);
  at::Tensor z = at::full({16}, 100.0);
  uint64_t launched_thread = 0;
  auto r = record([&] {
    at::parallel_for(0, kItems, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        item_thread[i] = os_thread_id();
        xs[i].mul(3);
      }
    });
    // The inter-op pool (torch.jit.fork's): always another thread.
    std::promise<void> done;
    at::launch([&] {
      launched_thread = os_thread_id();
      z.mul(5);
      done.set_value();
    });
    done.get_future().wait();
  });
  at::set_num_threads(old_threads);
  const std::set<uint64_t> threads(item_thread.begin(), item_thread.end());
  MESSAGE("at::parallel_for ran the " << kItems << " items on " << threads.size() << " thread(s)");
  auto mul = find_ops(r, "aten::mul");
  REQUIRE(mul.size() == static_cast<std::size_t>(kItems + 1));
  bool saw_launched = false;
  for (const Event* e : mul) {
    if (e->inputs[0].tensor.fingerprint == fp_of(z)) {
      saw_launched = true;
      REQUIRE(launched_thread != static_cast<uint64_t>(getpid()));
      REQUIRE(e->thread == launched_thread);
      REQUIRE(e->stream != 0);
      REQUIRE(e->outputs[0].tensor.fingerprint == fp_of(z.mul(5)));
      continue;
    }
    // Which item: the input's value says.
    int64_t item = -1;
    for (int64_t i = 0; i < kItems; ++i)
      if (e->inputs[0].tensor.fingerprint == fp_of(xs[i])) item = i;
    REQUIRE(item >= 0);
    REQUIRE(e->thread == item_thread[item]);
    REQUIRE(e->outputs[0].tensor.fingerprint == fp_of(xs[item].mul(3)));
  }
  REQUIRE(saw_launched);
}

namespace {

// A kernel that, like the CPU flash attention's backward, runs ops of its own
// on its intra-op workers: the sum of each row, one row per parallel_for item.
// The threads that ran the rows are noted for the test.
std::vector<uint64_t> g_row_threads;

at::Tensor row_sums_kernel(const at::Tensor& x) {
  at::Tensor out = at::empty({x.size(0)}, x.options());
  g_row_threads.assign(static_cast<std::size_t>(x.size(0)), 0);
  at::parallel_for(0, x.size(0), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      g_row_threads[i] = os_thread_id();
      out.select(0, i).copy_(x.select(0, i).sum());
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(opguard_test, m) { m.def("row_sums(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(opguard_test, CPU, m) { m.impl("row_sums", row_sums_kernel); }

TEST_CASE("ops a kernel runs on its intra-op workers are part of its op, not events of the workers' threads") {
  const int old_threads = at::get_num_threads();
  at::set_num_threads(2);
  auto row_sums = c10::Dispatcher::singleton()
                      .findSchemaOrThrow("opguard_test::row_sums", "")
                      .typed<at::Tensor(const at::Tensor&)>();
  const at::Tensor x = at::arange(64, at::kFloat).reshape({8, 8});
  at::Tensor y;
  auto r = record([&] {
    y = row_sums.call(x);
    y = y.mul(2);
  });
  at::set_num_threads(old_threads);
  const std::set<uint64_t> threads(g_row_threads.begin(), g_row_threads.end());
  MESSAGE("the kernel ran its 8 rows on " << threads.size() << " thread(s)");
  // Two events, both of the calling thread: the kernel's select, sum and
  // copy_ are not events, whichever thread ran them.
  REQUIRE(r.events.size() == 2);
  CHECK(r.events[0].op == "opguard_test::row_sums");
  CHECK(r.events[1].op == "aten::mul");
  for (const Event& e : r.events) CHECK(e.stream == 0);
  CHECK(r.events[1].outputs[0].tensor.fingerprint == fp_of(x.sum(1).mul(2)));
  const auto manifest = opguard::formats::read_manifest(r.layout.ranks[0].manifest_path);
  if (threads.size() > 1) {
    // Each row a worker ran: two selects, a sum and a copy_ (the ops inside
    // them are nested there and not counted).
    const auto on_workers = std::count_if(g_row_threads.begin(), g_row_threads.end(),
                                          [&](uint64_t t) { return t != static_cast<uint64_t>(getpid()); });
    CHECK(manifest.info.at("ops_on_kernel_workers") == std::to_string(4 * on_workers));
  } else {
    MESSAGE("SKIPPED the workers' count: OpenMP ran every row on the calling thread");
  }
  // A program's own parallel_for, after the op: its workers' ops are events
  // (the test above): the count is back to zero when the kernel is done.
  std::vector<at::Tensor> xs;
  for (int i = 0; i < 4; ++i) xs.push_back(at::full({4}, static_cast<double>(i)));
  at::set_num_threads(2);
  auto after = record([&] {
    row_sums.call(x);
    at::parallel_for(0, 4, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) xs[i].mul(3);
    });
  });
  at::set_num_threads(old_threads);
  CHECK(find_ops(after, "opguard_test::row_sums").size() == 1);
  CHECK(find_ops(after, "aten::mul").size() == 4);
  CHECK(after.events.size() == 5);
}

// --- fingerprints taken on the hashing thread (record/deferred.h) ------------

namespace {

// The CPUs this process may run on.
int affinity_cpus() {
  cpu_set_t set;
  return sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
}

// Records `body` with fingerprints deferred to the hashing thread (or not)
// while the program computes on `threads` intra-op threads: 1 leaves the
// hashing thread a core (on a machine of two or more), and only then does the
// recorder defer (deferred.h). `hasher_delay_us`: the hashing thread sleeps
// that long before each event it hashes, so that the program runs ahead of it.
template <typename Fn>
Recorded record_deferred(Fn&& body, bool defer, uint32_t hasher_delay_us = 0, int threads = 1) {
  const std::string dir = temp_dir();
  opguard::RecorderOptions options;
  options.out_dir = dir;
  options.defer_hashing = defer;
  const int old_threads = at::get_num_threads();
  at::set_num_threads(threads);
  if (hasher_delay_us > 0) setenv("OPGUARD_TEST_HASHER_DELAY_US", std::to_string(hasher_delay_us).c_str(), 1);
  opguard::Recorder::start(options);
  unsetenv("OPGUARD_TEST_HASHER_DELAY_US");
  body();
  opguard::Recorder::stop();
  at::set_num_threads(old_threads);
  return read_all(dir);
}

}  // namespace

TEST_CASE("a deferred output that the next op overwrites in place is fingerprinted as its op left it") {
  const at::Tensor x = at::rand({64, 1024});  // outputs of 256 KiB: deferred
  const uint64_t tripled = fp_of(x.mul(3)), plus_one = fp_of(x.mul(3).add(1));
  auto r = record_deferred(
      [&] {
        for (int i = 0; i < 20; ++i) {
          at::Tensor y = x.mul(3);
          y.add_(1);  // the hashing thread sleeps: y's hash has not started
        }
      },
      true, 2000);
  auto mul = find_ops(r, "aten::mul");
  auto add = find_ops(r, "aten::add_");
  REQUIRE(mul.size() == 20);
  REQUIRE(add.size() == 20);
  for (std::size_t i = 0; i < mul.size(); ++i) {
    REQUIRE(mul[i]->outputs[0].tensor.fingerprint == tripled);
    REQUIRE(add[i]->inputs[0].tensor.fingerprint == tripled);
    REQUIRE(add[i]->outputs[0].tensor.fingerprint == plus_one);
  }
}

TEST_CASE("the memory of a deferred output freed at once is not reused before it is hashed") {
  const at::Tensor x = at::rand({64, 1024});
  const uint64_t tripled = fp_of(x.mul(3));
  auto r = record_deferred(
      [&] {
        for (int i = 0; i < 20; ++i) {
          { at::Tensor y = x.mul(3); }  // freed before its hash starts
          at::Tensor z = at::full({64, 1024}, 7.0f);  // the same size: malloc would hand back y's memory
          z.mul_(2);
        }
      },
      true, 2000);
  auto mul = find_ops(r, "aten::mul");
  REQUIRE(mul.size() == 20);
  for (const Event* e : mul) REQUIRE(e->outputs[0].tensor.fingerprint == tripled);
}

TEST_CASE("a deferred output written without the dispatcher before it is hashed is recorded as not fingerprinted") {
  if (affinity_cpus() < 2) {
    MESSAGE("skipped: one CPU, no core for the hashing thread, nothing is deferred");
    return;
  }
  const at::Tensor x = at::rand({64, 1024});
  auto r = record_deferred(
      [&] {
        at::Tensor y = x.mul(3);
        std::memset(y.data_ptr(), 0, y.nbytes());  // numpy or a kernel of the program's own would do this
      },
      true, 20000);
  auto mul = find_ops(r, "aten::mul");
  REQUIRE(mul.size() == 1);
  const auto& out = mul[0]->outputs[0].tensor;
  REQUIRE((out.flags & opguard::formats::kTensorNotFingerprinted));
  REQUIRE_FALSE(out.has_fingerprint());
  // The manifest says how fingerprints were taken, and counts the tensor.
  const auto manifest = opguard::formats::read_manifest(r.layout.ranks[0].manifest_path);
  CHECK(manifest.info.at("fingerprints") == "deferred");
  CHECK(manifest.info.at("written_while_deferred") == "1");
  const auto on_thread = record_deferred([&] { at::Tensor y = x.mul(3); }, false);
  const auto plain = opguard::formats::read_manifest(on_thread.layout.ranks[0].manifest_path);
  CHECK(plain.info.at("fingerprints") == "training_thread");
  CHECK(plain.info.at("written_while_deferred") == "0");
}

TEST_CASE("where the program's threads take every core, outputs are hashed before the op returns, not deferred") {
  // The hashing thread would take a core from the program's own threads
  // (docs/BENCHMARKS.md, "All cores busy"): the recorder hashes on the
  // training thread then, so the same write behind the dispatcher as above
  // comes after the fingerprint, which holds the bits the op left.
  const at::Tensor x = at::rand({64, 1024});
  const uint64_t tripled = fp_of(x.mul(3));
  auto r = record_deferred(
      [&] {
        at::Tensor y = x.mul(3);
        std::memset(y.data_ptr(), 0, y.nbytes());
        at::Tensor z = y.add(1);
      },
      true, 20000, affinity_cpus());
  auto mul = find_ops(r, "aten::mul");
  auto add = find_ops(r, "aten::add");
  REQUIRE(mul.size() == 1);
  REQUIRE(add.size() == 1);
  CHECK(mul[0]->outputs[0].tensor.fingerprint == tripled);
  CHECK(add[0]->inputs[0].tensor.fingerprint == fp_of(at::zeros({64, 1024})));
  const auto manifest = opguard::formats::read_manifest(r.layout.ranks[0].manifest_path);
  CHECK(manifest.info.at("written_while_deferred") == "0");
  CHECK(manifest.info.at("fingerprints") == "deferred");  // the mode asked for; the cores decided
  // Events handed straight to the writer keep their order.
  for (std::size_t i = 1; i < r.events.size(); ++i) CHECK(r.events[i - 1].id < r.events[i].id);
}

TEST_CASE("the manifest records the fp32 precision of oneDNN's convolutions and RNNs, as set and as inherited, at the start and at the end") {
  using B = at::Float32Backend;
  using Op = at::Float32Op;
  using P = at::Float32Precision;
  auto& ctx = at::globalContext();
  struct Restore {
    ~Restore() {
      for (Op op : {Op::ALL, Op::CONV, Op::RNN}) at::globalContext().setFloat32Precision(B::MKLDNN, op, P::NONE);
    }
  } restore;
  const at::Tensor x = at::rand({8, 8});
  ctx.setFloat32Precision(B::MKLDNN, Op::CONV, P::BF16);
  auto r = record([&] {
    at::Tensor y = x.relu();  // the recording opens here: the start's reading
    ctx.setFloat32Precision(B::MKLDNN, Op::CONV, P::NONE);
    ctx.setFloat32Precision(B::MKLDNN, Op::ALL, P::TF32);  // what conv and rnn now inherit
  });
  const auto manifest = opguard::formats::read_manifest(r.layout.ranks[0].manifest_path);
  CHECK(manifest.info.at("mkldnn_conv_fp32_precision") == "bf16");
  CHECK(manifest.info.at("mkldnn_rnn_fp32_precision") == "ieee");
  CHECK(manifest.info.at("mkldnn_conv_fp32_precision_at_end") == "tf32");
  CHECK(manifest.info.at("mkldnn_rnn_fp32_precision_at_end") == "tf32");
  // cuDNN's RNNs: read on a build without CUDA too (torch's default).
  const std::string cudnn_rnn = manifest.info.at("cudnn_rnn_fp32_precision");
  CHECK((cudnn_rnn == "tf32" || cudnn_rnn == "ieee"));
}

TEST_CASE("the manifest says whether the intra-op workers flush denormals: set after the first parallel op, the main "
          "thread's setting does not reach them") {
  // torch.set_flush_denormal sets the calling thread's MXCSR only, and a worker
  // keeps the one it was created with: a program that calls it after its first
  // parallel op runs its parallel ops partly unflushed. The manifest's
  // flush_denormal is the main thread's; flush_denormal_workers_at_end says
  // what the workers do.
  if (std::thread::hardware_concurrency() < 2) {
    MESSAGE("SKIPPED: one CPU, no intra-op worker");
    return;
  }
  const int old_threads = at::get_num_threads();
  at::set_num_threads(2);
  at::Tensor warm = at::ones({1 << 20}).mul(2);  // the workers exist now, not flushing
  auto manifest_of = [](const Recorded& r) {
    return opguard::formats::read_manifest(r.layout.ranks[0].manifest_path);
  };
  at::globalContext().setFlushDenormal(true);
  const auto main_only = manifest_of(record([&] { at::ones({4}).add(1); }));
  CHECK(main_only.info.at("flush_denormal_at_end") == "1");
  CHECK(main_only.info.at("flush_denormal_workers_at_end") == "0");
  // Set on every thread of the team, as a program has it that calls
  // torch.set_flush_denormal before its first parallel op.
  auto set_all = [](bool on) {
    opguard::on_every_openmp_thread([](bool value) { at::globalContext().setFlushDenormal(value); }, on);
  };
  set_all(true);
  const auto everywhere = manifest_of(record([&] { at::ones({4}).add(1); }));
  CHECK(everywhere.info.at("flush_denormal_workers_at_end") == "1");
  set_all(false);
  const auto none = manifest_of(record([&] { at::ones({4}).add(1); }));
  CHECK(none.info.at("flush_denormal_at_end") == "0");
  CHECK(none.info.at("flush_denormal_workers_at_end") == "0");
  // One intra-op thread: no worker to ask.
  at::set_num_threads(1);
  const auto single = manifest_of(record([&] { at::ones({4}).add(1); }));
  CHECK(single.info.count("flush_denormal_workers_at_end") == 0);
  at::set_num_threads(old_threads);
}

TEST_CASE("a recorder that only observes (the benchmarks' OPGUARD_TEST_OBSERVE_ONLY) records no event and says so") {
  const at::Tensor x = at::rand({64, 64});
  setenv("OPGUARD_TEST_OBSERVE_ONLY", "1", 1);
  auto r = record_deferred([&] { at::Tensor y = at::matmul(x, x).relu(); }, true);
  unsetenv("OPGUARD_TEST_OBSERVE_ONLY");
  CHECK(r.events.empty());
  const auto manifest = opguard::formats::read_manifest(r.layout.ranks[0].manifest_path);
  CHECK(manifest.info.at("observe_only") == "1");
  CHECK(manifest.info.at("events") == "0");
  CHECK(at::isRecordFunctionEnabled());  // switched back after every op
  // The next recording records again.
  auto again = record_deferred([&] { at::Tensor y = x.relu(); }, true);
  CHECK(find_ops(again, "aten::relu").size() == 1);
}

TEST_CASE("a deferred input whose cached fingerprint went stale behind the dispatcher is hashed again") {
  // y is hashed (and cached) on the hashing thread while the program sleeps;
  // then its bytes change without the dispatcher (the version stays). The
  // next op's input y is deferred: the hashing thread's cache lookup must see
  // the change (its probe), not serve the stale fingerprint.
  const at::Tensor x = at::rand({64, 1024});
  const uint64_t tripled = fp_of(x.mul(3)), zeros = fp_of(at::zeros({64, 1024}));
  auto r = record_deferred(
      [&] {
        at::Tensor y = x.mul(3);
        at::Tensor z = y.add(1);  // y read: served from the cache, or hashed and cached
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        std::memset(y.data_ptr(), 0, y.nbytes());
        at::Tensor w = y.mul(2);
      },
      true);
  auto mul = find_ops(r, "aten::mul");
  auto add = find_ops(r, "aten::add");
  REQUIRE(mul.size() == 2);
  REQUIRE(add.size() == 1);
  CHECK(mul[0]->outputs[0].tensor.fingerprint == tripled);
  CHECK(add[0]->inputs[0].tensor.fingerprint == tripled);
  CHECK(mul[1]->inputs[0].tensor.fingerprint == zeros);
  CHECK(mul[1]->outputs[0].tensor.fingerprint == zeros);
}

TEST_CASE("fingerprints deferred to the hashing thread equal those taken on the training thread, event by event") {
  // Forward, backward and an SGD update of a two-layer MLP, each tensor at
  // least 64 KiB, whose weights are fresh copies each time.
  const at::Tensor x0 = at::rand({128, 256}), w1_0 = at::rand({256, 256}) - 0.5, w2_0 = at::rand({256, 64}) - 0.5;
  auto body = [&] {
    at::Tensor x = x0.clone();
    at::Tensor w1 = w1_0.clone().requires_grad_(), w2 = w2_0.clone().requires_grad_();
    for (int step = 0; step < 3; ++step) {
      at::Tensor loss = at::matmul(at::gelu(at::matmul(x, w1)), w2).pow(2).mean();
      loss.backward();
      at::NoGradGuard no_grad;
      for (at::Tensor* w : {&w1, &w2}) {
        w->sub_(w->grad() * 0.1);
        w->mutable_grad().zero_();
      }
    }
  };
  auto on_thread = record_deferred(body, false);
  auto deferred = record_deferred(body, true);
  REQUIRE(on_thread.events.size() == deferred.events.size());
  std::size_t tensors = 0;
  for (std::size_t i = 0; i < on_thread.events.size(); ++i) {
    const Event& a = on_thread.events[i];
    const Event& b = deferred.events[i];
    REQUIRE(a.op == b.op);
    for (auto values : {&Event::inputs, &Event::outputs}) {
      REQUIRE((a.*values).size() == (b.*values).size());
      for (std::size_t v = 0; v < (a.*values).size(); ++v) {
        INFO("event " << i << " " << a.op << " value " << v);
        REQUIRE((a.*values)[v].tensor.flags == (b.*values)[v].tensor.flags);
        REQUIRE((a.*values)[v].tensor.fingerprint == (b.*values)[v].tensor.fingerprint);
        tensors += (a.*values)[v].tensor.has_fingerprint() ? 1 : 0;
      }
    }
  }
  MESSAGE(tensors << " fingerprints compared in " << on_thread.events.size() << " events");
  REQUIRE(tensors > 100);
}
