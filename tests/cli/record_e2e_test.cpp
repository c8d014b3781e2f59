// opguard record / ls / show on the real training programs of examples/.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "../support/process.h"
#include "../support/recording_keys.h"
#include "opguard/formats/recording.h"

using opguard::testing::event_key;
using opguard::testing::events_of;
using opguard::testing::Result;
using opguard::testing::record_argv;
using opguard::testing::run;
using opguard::testing::TempDir;
namespace fmts = opguard::formats;

namespace {

const std::string kOpguard = OPGUARD_BIN;
const std::string kTinyGpt = OPGUARD_TINY_GPT_BIN;
const std::string kPython = OPGUARD_PYTHON_BIN;
const std::string kTinyGptPy = OPGUARD_TINY_GPT_PY;

std::vector<std::string> cpp_example(const std::vector<std::string>& extra = {}) {
  std::vector<std::string> cmd = {kTinyGpt, "--steps", "3"};
  cmd.insert(cmd.end(), extra.begin(), extra.end());
  return cmd;
}

std::vector<std::string> py_example(const std::vector<std::string>& extra = {}) {
  std::vector<std::string> cmd = {kPython, kTinyGptPy, "--steps", "3"};
  cmd.insert(cmd.end(), extra.begin(), extra.end());
  return cmd;
}

Result record(const TempDir& tmp, const std::string& out, const std::vector<std::string>& program,
              const std::vector<std::string>& flags = {}) {
  return run(record_argv(kOpguard, out, flags, program), tmp.path().string());
}

void require_same_recording(const std::string& a, const std::string& b) {
  auto ea = events_of(a), eb = events_of(b);
  REQUIRE(ea.size() == eb.size());
  REQUIRE(ea.size() > 100);
  std::size_t fingerprints = 0;
  for (std::size_t i = 0; i < ea.size(); ++i) {
    const std::string ka = event_key(ea[i]), kb = event_key(eb[i]);
    if (ka != kb) {
      INFO("event " << i << "\n  " << ka << "\n  " << kb);
      REQUIRE(ka == kb);
    }
    for (const auto& v : ea[i].outputs) fingerprints += v.tensor.has_fingerprint() ? 1 : 0;
  }
  REQUIRE(fingerprints > ea.size() / 2);
}

// Runs a Python program (source written to tmp/<script>) unrecorded and under
// `opguard record --out OUT`; both must succeed, print the same (the programs
// print their results' bits) and raise no error in the recorder's callbacks.
// Returns the recorded run.
Result record_unchanged(const TempDir& tmp, const std::string& script, const std::string& source,
                        const std::string& out, const std::vector<std::string>& args = {}) {
  std::ofstream(tmp / script) << source;
  std::vector<std::string> program = {kPython, tmp / script};
  program.insert(program.end(), args.begin(), args.end());
  Result plain = run(program, tmp.path().string());
  INFO(plain.err);
  REQUIRE(plain.exit_code == 0);
  Result recorded = record(tmp, out, program);
  INFO(recorded.err);
  REQUIRE(recorded.exit_code == 0);
  REQUIRE(recorded.out == plain.out);
  REQUIRE(recorded.err.find("Exception in RecordFunction callback") == std::string::npos);
  return recorded;
}

}  // namespace

TEST_CASE("recording the C++ example does not change its loss or its parameters") {
  TempDir tmp;
  Result plain = run(cpp_example({"--out-params", tmp / "plain.bin"}), tmp.path().string());
  REQUIRE(plain.exit_code == 0);
  Result rec = record(tmp, tmp / "rec", cpp_example({"--out-params", tmp / "rec.bin"}));
  INFO(rec.err);
  REQUIRE(rec.exit_code == 0);
  REQUIRE(rec.out == plain.out);
  REQUIRE(opguard::testing::read_file(tmp / "rec.bin") == opguard::testing::read_file(tmp / "plain.bin"));
  REQUIRE(opguard::testing::read_file(tmp / "rec.bin").size() > 1000);
}

TEST_CASE("recording the Python example does not change its loss or its parameters") {
  TempDir tmp;
  Result plain = run(py_example({"--out-params", tmp / "plain.bin"}), tmp.path().string());
  REQUIRE(plain.exit_code == 0);
  Result rec = record(tmp, tmp / "rec", py_example({"--out-params", tmp / "rec.bin"}));
  INFO(rec.err);
  REQUIRE(rec.exit_code == 0);
  REQUIRE(rec.out == plain.out);
  REQUIRE(opguard::testing::read_file(tmp / "rec.bin") == opguard::testing::read_file(tmp / "plain.bin"));
}

TEST_CASE("two recordings of the C++ example have identical fingerprints for every event") {
  TempDir tmp;
  REQUIRE(record(tmp, tmp / "a", cpp_example({"--dropout", "0.1"})).exit_code == 0);
  REQUIRE(record(tmp, tmp / "b", cpp_example({"--dropout", "0.1"})).exit_code == 0);
  require_same_recording(tmp / "a", tmp / "b");
}

TEST_CASE("two recordings of the Python example have identical fingerprints for every event") {
  TempDir tmp;
  REQUIRE(record(tmp, tmp / "a", py_example()).exit_code == 0);
  REQUIRE(record(tmp, tmp / "b", py_example()).exit_code == 0);
  require_same_recording(tmp / "a", tmp / "b");
}

TEST_CASE("the C++ recording has forward, backward and optimizer events with module scopes, per step") {
  TempDir tmp;
  REQUIRE(record(tmp, tmp / "rec", cpp_example()).exit_code == 0);
  auto events = events_of(tmp / "rec");
  std::map<fmts::Phase, int> phases;
  std::set<std::string> backward_scopes, forward_scopes;
  std::set<int64_t> steps;
  for (const auto& e : events) {
    ++phases[e.phase];
    steps.insert(e.step);
    if (e.phase == fmts::Phase::kBackward && !e.node.empty()) backward_scopes.insert(e.scope);
    if (e.phase == fmts::Phase::kForward) forward_scopes.insert(e.scope);
  }
  REQUIRE(phases[fmts::Phase::kForward] > 50);
  REQUIRE(phases[fmts::Phase::kBackward] > 50);
  REQUIRE(phases[fmts::Phase::kOptimizer] > 20);
  REQUIRE(forward_scopes.count("blocks.1.attn") == 1);
  REQUIRE(forward_scopes.count("blocks.0.mlp.fc") == 1);
  REQUIRE(backward_scopes.count("blocks.0.mlp.fc") == 1);
  REQUIRE(steps.count(0) == 1);
  REQUIRE(steps.count(2) == 1);
  auto layout = fmts::scan_recording(tmp / "rec");
  REQUIRE(layout.ranks[0].steps.size() >= 3);
  REQUIRE(layout.ranks[0].torn.empty());
  auto manifest = fmts::read_manifest(layout.ranks[0].manifest_path);
  REQUIRE(manifest.info.at("clean_exit") == "1");
  REQUIRE(manifest.info.at("torch_version").rfind("2.11", 0) == 0);
  REQUIRE(manifest.info.count("cpu_capability") == 1);
}

TEST_CASE("the Python recording gets module scopes and steps without any change to the program") {
  TempDir tmp;
  REQUIRE(record(tmp, tmp / "rec", py_example()).exit_code == 0);
  auto events = events_of(tmp / "rec");
  std::set<std::string> scopes, backward_scopes;
  std::set<int64_t> steps;
  int optimizer = 0;
  for (const auto& e : events) {
    scopes.insert(e.scope);
    steps.insert(e.step);
    if (e.phase == fmts::Phase::kOptimizer) ++optimizer;
    if (e.phase == fmts::Phase::kBackward) backward_scopes.insert(e.scope);
  }
  REQUIRE(scopes.count("blocks.1.attn.proj") == 1);
  REQUIRE(scopes.count("blocks.0.mlp.fc") == 1);
  REQUIRE(backward_scopes.count("blocks.0.mlp.fc") == 1);
  REQUIRE(optimizer > 20);
  REQUIRE(steps.count(2) == 1);  // from PyTorch's Optimizer.step ranges
}

TEST_CASE("a Python program's steps are its optimizer steps: gradient accumulation, an optimizer in backward, "
          "a compiled optimizer step, a closure") {
  // Two micro-batches a step under torch.optim (the first step too, before any
  // Optimizer.step range was seen); a per-parameter optimizer stepped in a
  // post-accumulate-grad hook (ranges inside backward end no step: the
  // recorder infers the steps); a compiled Optimizer.step (dynamo drops its
  // range: inferred too, its tracing's FakeTensor writes are no update); an
  // Optimizer.step(closure) whose closure runs the forward and backward passes
  // (LBFGS, Lightning): the closure's forward ops are forward, its zero_grad's
  // ops optimizer ops. A program that calls torch.ops.opguard.step() after
  // its Optimizer.step ends each step once (the range ended one more, and the
  // steps were 0, 2, 4). Two optimizers (one per parameter group) stepped one
  // after the other: one step, not two.
  TempDir tmp;
  const std::string source =
      "import sys, torch\n"
      "torch.manual_seed(0)\n"
      "torch.set_num_threads(1)\n"
      "mode, micro = sys.argv[1], int(sys.argv[2])\n"
      "m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))\n"
      "if mode == 'in_backward':\n"
      "    opts = {p: torch.optim.SGD([p], lr=0.1) for p in m.parameters()}\n"
      "    def hook(p):\n"
      "        opts[p].step()\n"
      "        opts[p].zero_grad()\n"
      "    for p in m.parameters():\n"
      "        p.register_post_accumulate_grad_hook(hook)\n"
      "    step = lambda: None\n"
      "else:\n"
      "    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)\n"
      "    step = torch.compile(opt.step, backend='eager') if mode == 'compiled' else opt.step\n"
      "if mode == 'two_optimizers':\n"
      "    opts = [torch.optim.SGD(m[0].parameters(), lr=0.1), torch.optim.Adam(m[2].parameters(), lr=1e-3)]\n"
      "    def step():\n"
      "        for o in opts:\n"
      "            o.step()\n"
      "            o.zero_grad()\n"
      "if mode == 'explicit':\n"
      "    def step():\n"
      "        opt.step()\n"
      "        if hasattr(torch.ops.opguard, 'step'):  # recorded (the unrecorded run has no such op)\n"
      "            torch.ops.opguard.step()\n"
      "if mode == 'closure':\n"
      "    def closure():\n"
      "        opt.zero_grad(set_to_none=False)\n"
      "        loss = m(torch.randn(8, 16)).pow(2).mean()\n"
      "        loss.backward()\n"
      "        return loss\n"
      "    step = lambda: opt.step(closure)\n"
      "for s in range(3):\n"
      "    for i in range(micro):\n"
      "        m(torch.randn(8, 16)).pow(2).mean().backward()\n"
      "    step()\n"
      "    if mode not in ('in_backward', 'closure', 'two_optimizers'):\n"
      "        opt.zero_grad()\n";
  for (const auto& [mode, micro] : std::vector<std::pair<std::string, int>>{
           {"ranges", 2}, {"in_backward", 1}, {"compiled", 2}, {"closure", 0}, {"explicit", 1},
           {"two_optimizers", 1}}) {
    INFO("mode " << mode);
    const std::string out = tmp / ("rec_" + mode);
    record_unchanged(tmp, "steps.py", source, out, {mode, std::to_string(micro)});
    std::map<int64_t, int> forward_linear;
    std::set<fmts::Phase> zero_phases;
    for (const auto& e : events_of(out)) {
      if (e.op == "aten::linear" && e.phase == fmts::Phase::kForward) ++forward_linear[e.step];
      if (e.op == "aten::_foreach_zero_" || e.op == "aten::zero_") zero_phases.insert(e.phase);
    }
    const int linear = 2 * std::max(micro, 1);
    CHECK(forward_linear == std::map<int64_t, int>{{0, linear}, {1, linear}, {2, linear}});
    if (mode == "closure") CHECK(zero_phases == std::set<fmts::Phase>{fmts::Phase::kOptimizer});
  }
}

TEST_CASE("the Python package records a program from inside: record(), step(), mark(), and a used directory refused") {
  // python/opguard: torch.ops.opguard.* behind `with opguard.record(DIR)`,
  // found on PYTHONPATH as the README says. A second start into the same
  // directory printed a line on stderr and recorded nothing (the directory
  // already held the rank's recording); it raises now.
  TempDir tmp;
  std::ofstream(tmp / "api.py") << "import sys, torch, opguard\n"
                                    "torch.manual_seed(0)\n"
                                    "torch.set_num_threads(1)\n"
                                    "m = torch.nn.Linear(8, 8)\n"
                                    "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                                    "with opguard.record(sys.argv[1]):\n"
                                    "    assert opguard.active()\n"
                                    "    for s in range(3):\n"
                                    "        loss = m(torch.randn(4, 8)).pow(2).mean()\n"
                                    "        opt.zero_grad()\n"
                                    "        loss.backward()\n"
                                    "        opt.step()\n"
                                    "        opguard.step()\n"
                                    "    opguard.mark(m.weight, 'final_weight')\n"
                                    "assert not opguard.active()\n"
                                    "try:\n"
                                    "    opguard.start(sys.argv[1])\n"
                                    "except RuntimeError as e:\n"
                                    "    print('refused:', str(e).splitlines()[0])\n"
                                    "else:\n"
                                    "    sys.exit('a second recording into the same directory was not refused')\n";
  const std::string out = tmp / "rec";
  Result r = run({kPython, tmp / "api.py", out}, tmp.path().string(), {std::string("PYTHONPATH=") + OPGUARD_PYTHON_PACKAGE_DIR});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("refused: ") != std::string::npos);
  CHECK(r.out.find("already holds a recording") != std::string::npos);
  std::map<int64_t, int> linear;
  int marks = 0;
  for (const auto& e : events_of(out)) {
    linear[e.step] += e.op == "aten::linear";
    marks += e.op == "opguard::mark";
  }
  CHECK(linear == std::map<int64_t, int>{{0, 1}, {1, 1}, {2, 1}, {3, 0}});
  CHECK(marks == 1);
  Result ls = run({kOpguard, "ls", out}, tmp.path().string());
  CHECK(ls.exit_code == 0);
  CHECK(ls.out.find("clean exit") != std::string::npos);
}

TEST_CASE("a Python module called on its own before its model gets its full scope once the model is called") {
  // A probe of one block before training named it the outermost module (the
  // empty path) and its layers "fc", "ln" for the whole run: the training's
  // blocks.1 looked like another block.
  TempDir tmp;
  const std::string source =
      "import torch\n"
      "torch.manual_seed(0)\n"
      "class Block(torch.nn.Module):\n"
      "    def __init__(self):\n"
      "        super().__init__()\n"
      "        self.fc = torch.nn.Linear(16, 16)\n"
      "    def forward(self, x):\n"
      "        return x + self.fc(x)\n"
      "class Model(torch.nn.Module):\n"
      "    def __init__(self):\n"
      "        super().__init__()\n"
      "        self.blocks = torch.nn.ModuleList([Block(), Block()])\n"
      "    def forward(self, x):\n"
      "        for b in self.blocks:\n"
      "            x = b(x)\n"
      "        return x\n"
      "m = Model()\n"
      "x = torch.randn(8, 16)\n"
      "with torch.no_grad():\n"
      "    m.blocks[1](x)\n"
      "m(x).sum().backward()\n";
  const std::string out = tmp / "rec";
  record_unchanged(tmp, "probe.py", source, out);
  std::vector<std::string> linear_scopes;
  for (const auto& e : events_of(out))
    if (e.op == "aten::linear") linear_scopes.push_back(e.scope);
  CHECK(linear_scopes == std::vector<std::string>{"fc", "blocks.0.fc", "blocks.1.fc"});
}

TEST_CASE("Python module scopes through the recorder's C calls equal those of RecordFunction ranges") {
  TempDir tmp;
  // Under `opguard record` the hooks take opguard_push_scope / opguard_pop_scope
  // from the preloaded recorder; OPGUARD_TEST_PY_SCOPE_RANGES=1 makes them open
  // record_function ranges instead (the path without the recorder's symbols).
  std::ofstream(tmp / "which.py") << "import torch\nfrom opguard import hooks\n"
                                     "print('calls' if hooks._push is not None else 'ranges')\n";
  Result direct = record(tmp, tmp / "w1", {kPython, tmp / "which.py"});
  REQUIRE(direct.out == "calls\n");
  Result ranges = run(record_argv(kOpguard, tmp / "w2", {}, {kPython, tmp / "which.py"}), tmp.path().string(),
                      {"OPGUARD_TEST_PY_SCOPE_RANGES=1"});
  REQUIRE(ranges.out == "ranges\n");

  REQUIRE(record(tmp, tmp / "calls", py_example({"--steps", "2"})).exit_code == 0);
  REQUIRE(run(record_argv(kOpguard, tmp / "ranges", {}, py_example({"--steps", "2"})), tmp.path().string(),
              {"OPGUARD_TEST_PY_SCOPE_RANGES=1"})
              .exit_code == 0);
  // Same events, scopes, nodes and fingerprints, event by event.
  require_same_recording(tmp / "calls", tmp / "ranges");
  std::set<std::string> scopes;
  for (const auto& e : events_of(tmp / "calls")) scopes.insert(e.scope);
  REQUIRE(scopes.count("blocks.1.attn.proj") == 1);
}

TEST_CASE("a torch.compile program is recorded without a crash and with unchanged bits") {
  // Dynamo traces the global module hooks (they must not break its tracing)
  // and runs the ops on FakeTensors, whose storages hold no bytes (the
  // recorder must not read them); the compiled code then runs for real.
  TempDir tmp;
  const std::string source =
      "import hashlib, sys, torch\n"
      "torch.manual_seed(0)\n"
      "torch.set_num_threads(1)\n"
      "m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))\n"
      "opt = torch.optim.AdamW(m.parameters(), lr=1e-2)\n"
      "f = torch.compile(m, backend=sys.argv[1])\n"
      "x, y = torch.randn(8, 16), torch.randn(8, 4)\n"
      "for step in range(3):\n"
      "    loss = torch.nn.functional.mse_loss(f(x), y)\n"
      "    opt.zero_grad()\n"
      "    loss.backward()\n"
      "    opt.step()\n"
      "h = hashlib.sha256(b''.join(p.detach().numpy().tobytes() for p in m.parameters()))\n"
      "print(loss.detach().numpy().tobytes().hex(), h.hexdigest())\n";
  for (const char* backend : {"eager", "aot_eager", "inductor"}) {
    INFO("backend " << std::string(backend));
    const std::string out = tmp / (std::string("rec_") + backend);
    record_unchanged(tmp, "compiled.py", source, out, {backend});  // loss and parameters, bit for bit
    std::size_t fingerprinted = 0;
    for (const auto& e : events_of(out))
      for (const auto& v : e.outputs) fingerprinted += v.tensor.has_fingerprint() ? 1 : 0;
    CHECK(fingerprinted > 20);
  }
}

TEST_CASE("tensor subclasses, activation checkpointing and autocast are recorded with unchanged bits") {
  // A wrapper subclass (its storage holds no bytes: not fingerprinted, the ops
  // its __torch_dispatch__ runs on the inner tensors are), non-reentrant
  // checkpointing (forward recomputed inside backward) and bf16 autocast.
  TempDir tmp;
  record_unchanged(tmp, "features.py",
      "import torch\n"
      "from torch.testing._internal.two_tensor import TwoTensor\n"
      "from torch.utils.checkpoint import checkpoint\n"
      "torch.manual_seed(0)\n"
      "torch.set_num_threads(1)\n"
      "a = torch.randn(4, 4)\n"
      "y = (TwoTensor(a, a * 2) @ TwoTensor(a, a * 3)).sum()\n"
      "m = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))\n"
      "x = torch.randn(8, 4, requires_grad=True)\n"
      "checkpoint(lambda z: m(z).relu().sum(), x, use_reentrant=False).backward()\n"
      "with torch.autocast('cpu', dtype=torch.bfloat16):\n"
      "    z = m(x)\n"
      "print(y.a.item().hex(), y.b.item().hex(), x.grad.sum().item().hex(), str(z.dtype),\n"
      "      z.float().sum().item().hex(), m[0].weight.grad.sum().item().hex())\n",
      tmp / "rec");
  std::set<std::string> scopes;
  // The forward recomputed inside backward: each op in its module's scope
  // (they took the scope of the node that unpacked them, `2` for all).
  std::set<std::pair<std::string, std::string>> recomputed;
  for (const auto& e : events_of(tmp / "rec")) {
    scopes.insert(e.scope);
    if (e.phase == fmts::Phase::kBackward && (e.op == "aten::linear" || e.op == "aten::gelu"))
      recomputed.insert({e.op, e.scope});
  }
  CHECK(scopes.count("0") == 1);  // m's first Linear, also in the recomputed forward
  CHECK(recomputed == std::set<std::pair<std::string, std::string>>{
                          {"aten::linear", "0"}, {"aten::gelu", "1"}, {"aten::linear", "2"}});
}

TEST_CASE("a Python autograd.Function called with grad mode on runs its forward in phase forward, under no_grad "
          "in phase other") {
  // Its forward runs with grad mode off (torch.compile's CompiledFunction is
  // one): its ops were in phase other, and aligned with nothing in a run
  // whose model spells the same ops out.
  TempDir tmp;
  record_unchanged(tmp, "function.py",
      "import torch\n"
      "class Square(torch.autograd.Function):\n"
      "    @staticmethod\n"
      "    def forward(ctx, x):\n"
      "        ctx.save_for_backward(x)\n"
      "        return torch.square(x)\n"
      "    @staticmethod\n"
      "    def backward(ctx, g):\n"
      "        x, = ctx.saved_tensors\n"
      "        return g * 2 * x\n"
      "torch.manual_seed(0)\n"
      "x = torch.randn(8, requires_grad=True)\n"
      "Square.apply(x).sum().backward()\n"
      "with torch.no_grad():\n"
      "    y = Square.apply(x)\n"
      "print(x.grad.sum().item().hex(), y.sum().item().hex())\n",
      tmp / "rec");
  std::vector<fmts::Phase> square;
  for (const auto& e : events_of(tmp / "rec"))
    if (e.op == "aten::square") square.push_back(e.phase);
  CHECK(square == std::vector<fmts::Phase>{fmts::Phase::kForward, fmts::Phase::kOther});
}

TEST_CASE("the buffers torch's CPU flash attention backward allocates on its OpenMP workers are not events") {
  // In bf16 the backward kernel calls at::empty on each intra-op worker
  // (torch 2.11): those ops belong to its event, not to the workers' threads.
  TempDir tmp;
  record_unchanged(tmp, "sdpa_workers.py",
      "import torch, torch.nn.functional as F\n"
      "torch.manual_seed(0)\n"
      "torch.set_num_threads(2)\n"
      "q, k, v = (torch.randn(2, 4, 32, 16, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))\n"
      "for _ in range(2):\n"
      "    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)\n"
      "    y.float().sum().backward()\n"
      "print(q.grad.float().sum().item().hex(), k.grad.float().sum().item().hex(), v.grad.float().sum().item().hex())\n",
      tmp / "rec");
  std::size_t backward = 0;
  for (const auto& e : events_of(tmp / "rec")) {
    INFO(e.op << " on stream " << e.stream);
    CHECK(e.stream == 0);
    backward += e.op == "aten::_scaled_dot_product_flash_attention_for_cpu_backward" ? 1 : 0;
  }
  CHECK(backward == 2);
  auto layout = fmts::scan_recording(tmp / "rec");
  auto manifest = fmts::read_manifest(layout.ranks[0].manifest_path);
  // Two threads, one worker, one buffer per backward: 2 (a kernel of another
  // torch that allocates elsewhere would make this 0, and the case moot).
  CHECK(manifest.info.at("ops_on_kernel_workers") == "2");
}

TEST_CASE("the recorder's stamp on fresh empty() buffers leaves the program's bits alone") {
  // The recorder sets the probed bytes of a new empty* buffer; the program
  // writes it before it reads it. empty(out=t) keeps t's own memory: not
  // stamped (it holds t's old bits when the size is unchanged).
  TempDir tmp;
  record_unchanged(tmp, "stamp.py",
                   "import torch\n"
                   "t = torch.arange(4.0)\n"
                   "torch.empty(4, out=t)\n"
                   "u = torch.empty(3000)\n"
                   "u[:] = 5\n"
                   "v = torch.tensor([[1.5, -2.0], [0.25, 7.0]])\n"
                   "w = torch.empty(2, 2).copy_(v)\n"
                   "print(t.tolist(), u.sum().item(), (v @ w).tolist())\n",
                   tmp / "rec");
}

TEST_CASE("tensors made under inference_mode are fingerprinted, in-place writes included") {
  // They have no version counter: reading it threw inside the callback (the
  // events were lost, with a stack trace per op on stderr), and the
  // fingerprint cache, keyed on storage and version, must not serve them.
  TempDir tmp;
  record_unchanged(tmp, "infer.py",
                   "import torch\n"
                   "torch.manual_seed(0)\n"
                   "m = torch.nn.Linear(4, 4)\n"
                   "x = torch.randn(2, 4)\n"
                   "with torch.inference_mode():\n"
                   "    y = m(x)\n"
                   "    y.add_(1)\n"
                   "    z = y * 2\n"
                   "print(z.sum().item().hex())\n",
                   tmp / "rec");
  const fmts::Event* add = nullptr;
  const fmts::Event* mul = nullptr;
  auto events = events_of(tmp / "rec");
  for (const auto& e : events) {
    if (e.op == "aten::add_") add = &e;
    if (e.op == "aten::mul" && add != nullptr) mul = &e;
  }
  REQUIRE(add != nullptr);
  REQUIRE(mul != nullptr);
  const auto& before = add->inputs.at(0).tensor;
  const auto& after = add->outputs.at(0).tensor;
  REQUIRE(before.has_fingerprint());
  REQUIRE(after.has_fingerprint());
  CHECK(before.fingerprint != after.fingerprint);  // y + 1 is not y
  CHECK(mul->inputs.at(0).tensor.fingerprint == after.fingerprint);
}

TEST_CASE("vmap, grad, nested, jagged, quantized and sparse tensors are recorded without errors") {
  // Nested tensors refuse sizes() and strides() (the jagged one in Python):
  // reading them threw inside the callback, which lost the event and printed
  // a stack trace per op. Now they are recorded without a shape, unhashed.
  TempDir tmp;
  record_unchanged(tmp, "misc.py",
      "import warnings, torch\n"
      "from torch.func import vmap, grad\n"
      "warnings.simplefilter('ignore')\n"
      "torch.manual_seed(0)\n"
      "x, w = torch.randn(3, 4), torch.randn(4)\n"
      "print(vmap(lambda r: (r * w).sum())(x).sum().item().hex())\n"
      "print(grad(lambda v: (v * v).sum())(w).sum().item().hex())\n"
      "nt = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)])\n"
      "print((nt * 2).to_padded_tensor(0.0).sum().item().hex())\n"
      "njt = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)], layout=torch.jagged)\n"
      "print((njt * 2).values().sum().item().hex())\n"
      "q = torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.qint8)\n"
      "print(q.dequantize().sum().item().hex())\n"
      "print((torch.randn(4, 4).to_sparse() * 2).to_dense().sum().item().hex())\n",
      tmp / "a");
  REQUIRE(record(tmp, tmp / "b", {kPython, tmp / "misc.py"}).exit_code == 0);
  Result diff = run({kOpguard, "diff", tmp / "a", tmp / "b"}, tmp.path().string());
  REQUIRE(diff.exit_code == 0);
  REQUIRE(diff.out.find("runs agree bitwise") != std::string::npos);
}

TEST_CASE("--stop-after-windows ends a long run once the step that closes its windows is written") {
  // What diff's re-record commands and bisect run use: a window in step 1 of
  // a 60-step run is recorded without running the other 58 steps.
  TempDir tmp;
  const std::vector<std::string> small = {"--width", "32", "--depth", "1", "--seq", "16", "--batch", "4"};
  std::vector<std::string> program = {kTinyGpt, "--steps", "60"};
  program.insert(program.end(), small.begin(), small.end());
  std::vector<std::string> two = {kTinyGpt, "--steps", "2"};
  two.insert(two.end(), small.begin(), small.end());
  REQUIRE(record(tmp, tmp / "first", two).exit_code == 0);
  std::string id;
  for (const auto& e : events_of(tmp / "first"))
    if (e.step == 1 && id.empty()) id = fmts::event_id_string(e.id + 20);
  REQUIRE_FALSE(id.empty());
  Result r = record(tmp, tmp / "stopped", program, {"--dump-around", id + ":4", "--stop-after-windows"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const auto layout = fmts::scan_recording(tmp / "stopped");
  CHECK(layout.ranks[0].steps.size() >= 2);
  CHECK(layout.ranks[0].steps.size() <= 3);  // the window's step, and the one that closed it at most
  CHECK(layout.ranks[0].torn.empty());
  const auto manifest = fmts::read_manifest(layout.ranks[0].manifest_path);
  CHECK(manifest.info.at("stopped_after_windows") == "1");
  CHECK(manifest.info.at("clean_exit") == "1");
  std::size_t full = 0;
  for (const auto& e : events_of(tmp / "stopped"))
    for (const auto& v : e.outputs) full += (v.tensor.flags & fmts::kTensorHasData) ? 1 : 0;
  CHECK(full > 0);  // the window has its full tensors
  Result ls = run({kOpguard, "ls", tmp / "stopped"}, tmp.path().string());
  CHECK(ls.out.find("--stop-after-windows") != std::string::npos);
  // Without a window there is nothing to stop after.
  Result alone = record(tmp, tmp / "alone", program, {"--stop-after-windows"});
  CHECK(alone.exit_code == 2);
  CHECK_FALSE(std::filesystem::exists(tmp / "alone"));
}

TEST_CASE("bad recorder flags, an unwritable output and a missing program fail before training starts") {
  TempDir tmp;
  Result bad = record(tmp, tmp / "rec", cpp_example(), {"--dump-steps", "banana"});
  REQUIRE(bad.exit_code == 2);
  REQUIRE(bad.out.empty());
  REQUIRE(bad.err.find("step") != std::string::npos);
  REQUIRE(std::count(bad.err.begin(), bad.err.end(), '\n') == 1);

  Result regex = record(tmp, tmp / "rec2", cpp_example(), {"--dump-ops", "(unclosed"});
  REQUIRE(regex.exit_code == 2);

  // A declared knob is checked like a replay config: one line, nothing recorded.
  for (const char* declared : {"tp=0", "no_such_knob=1"}) {
    Result bad_declare = record(tmp, tmp / "rec5", cpp_example(), {"--declare", declared});
    INFO(declared << ": " << bad_declare.err);
    CHECK(bad_declare.exit_code == 2);
    CHECK(std::count(bad_declare.err.begin(), bad_declare.err.end(), '\n') == 1);
    CHECK_FALSE(std::filesystem::exists(tmp / "rec5"));
  }

  opguard::testing::run({"touch", tmp / "file"}, tmp.path().string());
  Result unwritable = record(tmp, tmp / "file/rec", cpp_example());
  REQUIRE(unwritable.exit_code == 74);
  REQUIRE(unwritable.out.empty());

  Result missing = record(tmp, tmp / "rec3", {"/no/such/program"});
  REQUIRE(missing.exit_code == 127);
  REQUIRE(missing.err.find("/no/such/program") != std::string::npos);

  Result no_command = run({kOpguard, "record", "--out", tmp / "rec4"}, tmp.path().string());
  REQUIRE(no_command.exit_code == 2);
}

TEST_CASE("a run killed with SIGKILL leaves a recording that ls reads up to the last completed step") {
  TempDir tmp;
  const std::string out = tmp / "rec";
  pid_t launcher = fork();
  if (launcher == 0) {
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    dup2(devnull, 2);
    execl(kOpguard.c_str(), kOpguard.c_str(), "record", "--out", out.c_str(), "--dump-every", "2", "--",
          kTinyGpt.c_str(), "--steps", "100000", static_cast<char*>(nullptr));
    _exit(127);
  }
  // Wait until a few steps are complete, then kill the training process.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  std::size_t complete = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    std::error_code ec;
    complete = 0;
    for (auto& entry : std::filesystem::directory_iterator(out + "/rank0", ec))
      if (entry.path().extension() == ".h5" && entry.path().filename() != "manifest.h5") ++complete;
    if (complete >= 4) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  REQUIRE(complete >= 4);
  const int pid = std::stoi(opguard::testing::read_file(out + "/rank0/owner.pid"));
  REQUIRE(kill(pid, SIGKILL) == 0);
  int status = 0;
  waitpid(launcher, &status, 0);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 128 + SIGKILL);

  Result ls = run({kOpguard, "ls", out, "--json"}, tmp.path().string());
  INFO(ls.err);
  REQUIRE(ls.exit_code == 0);
  auto j = nlohmann::json::parse(ls.out);
  const auto& rank = j["ranks"][0];
  REQUIRE(rank["steps"].size() >= 4);
  REQUIRE(rank["info"]["clean_exit"] == "0");
  // Every complete step reads in full.
  for (const auto& step : rank["steps"]) {
    fmts::StepReader reader(step["file"].get<std::string>());
    REQUIRE(!reader.events().empty());
  }
  Result text = run({kOpguard, "ls", out}, tmp.path().string());
  REQUIRE(text.exit_code == 0);
  if (!rank["torn_steps"].empty()) REQUIRE(text.out.find("torn") != std::string::npos);
}

TEST_CASE("ls and show describe a recording, in text and in JSON") {
  TempDir tmp;
  REQUIRE(record(tmp, tmp / "rec", cpp_example(), {"--dump-steps", "1"}).exit_code == 0);
  Result ls = run({kOpguard, "ls", tmp / "rec", "--json"}, tmp.path().string());
  REQUIRE(ls.exit_code == 0);
  auto j = nlohmann::json::parse(ls.out);
  REQUIRE(j["ranks"][0]["steps"].size() >= 3);
  REQUIRE(j["ranks"][0]["steps"][1]["phases"]["forward"]["full_tensors"].get<int>() > 0);
  REQUIRE(j["ranks"][0]["steps"][0]["phases"]["forward"]["full_tensors"].get<int>() == 0);
  REQUIRE(j["ranks"][0]["info"]["fingerprints"] == "deferred");
  Result text = run({kOpguard, "ls", tmp / "rec"}, tmp.path().string());
  REQUIRE(text.exit_code == 0);
  CHECK(text.out.find("fingerprints deferred") != std::string::npos);

  // The first event of step 1 holds full tensors: show previews them.
  auto events = events_of(tmp / "rec");
  const fmts::Event* first_in_step1 = nullptr;
  for (const auto& e : events)
    if (e.step == 1 && !e.outputs.empty() && e.outputs[0].kind == fmts::ValueKind::kTensor) {
      first_in_step1 = &e;
      break;
    }
  REQUIRE(first_in_step1 != nullptr);
  const std::string id = fmts::event_id_string(first_in_step1->id);
  Result show = run({kOpguard, "show", tmp / "rec", "--event", id}, tmp.path().string());
  REQUIRE(show.exit_code == 0);
  REQUIRE(show.out.find(first_in_step1->op) != std::string::npos);
  REQUIRE(show.out.find("values [") != std::string::npos);
  Result show_json = run({kOpguard, "show", tmp / "rec", "--event", id, "--json"}, tmp.path().string());
  REQUIRE(show_json.exit_code == 0);
  auto sj = nlohmann::json::parse(show_json.out);
  REQUIRE(sj["op"] == first_in_step1->op);
  REQUIRE(sj["outputs"][0]["preview"].size() > 0);

  Result missing = run({kOpguard, "show", tmp / "rec", "--event", "99999999"}, tmp.path().string());
  REQUIRE(missing.exit_code == 2);
  Result garbage = run({kOpguard, "show", tmp / "rec", "--event", "x.y"}, tmp.path().string());
  REQUIRE(garbage.exit_code == 2);
  Result not_recording = run({kOpguard, "ls", tmp.path().string()}, tmp.path().string());
  REQUIRE(not_recording.exit_code == 65);
}
