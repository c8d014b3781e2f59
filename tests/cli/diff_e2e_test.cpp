// opguard diff on the real training programs of examples/: each recorded twice
// under the same config (no divergence) and with one numerics knob changed (the
// first divergent operator is one that knob affects, checked independently of
// the diff code by check_first_divergent.py, which reads the HDF5 with h5py).

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <set>

#include "../support/process.h"
#include "../support/recording_keys.h"

using opguard::testing::Result;
using opguard::testing::record_argv;
using opguard::testing::run;
using opguard::testing::TempDir;

namespace {

const std::string kOpguard = OPGUARD_BIN;
const std::string kTinyGpt = OPGUARD_TINY_GPT_BIN;
const std::string kPython = OPGUARD_PYTHON_BIN;
const std::string kTinyGptPy = OPGUARD_TINY_GPT_PY;
const std::string kChecker = OPGUARD_CHECK_FIRST_DIVERGENT;

void record(const TempDir& tmp, const std::string& out, const std::vector<std::string>& program,
            const std::vector<std::string>& env = {}, const std::vector<std::string>& flags = {}) {
  Result r = run(record_argv(kOpguard, out, flags, program), tmp.path().string(), env);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
}

nlohmann::json diff_json(const TempDir& tmp, const std::string& a, const std::string& b, int expect_exit,
                         const std::vector<std::string>& extra = {}) {
  std::vector<std::string> cmd = {kOpguard, "diff", a, b, "--json"};
  cmd.insert(cmd.end(), extra.begin(), extra.end());
  Result r = run(cmd, tmp.path().string());
  INFO(r.err);
  REQUIRE(r.exit_code == expect_exit);
  return nlohmann::json::parse(r.out);
}

// The diff's answer, checked by reading the recordings directly.
void check_independently(const TempDir& tmp, const std::string& a, const std::string& b, const std::string& id) {
  Result r = run({kPython, kChecker, a, b, id}, tmp.path().string());
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  MESSAGE(r.out);
}

}  // namespace

TEST_CASE("the C++ example recorded twice under the same config: no divergence, exit 0") {
  TempDir tmp;
  const std::vector<std::string> prog = {kTinyGpt, "--steps", "3", "--threads", "2"};
  record(tmp, tmp / "a", prog);
  record(tmp, tmp / "b", prog);
  auto j = diff_json(tmp, tmp / "a", tmp / "b", 0);
  CHECK(j["diverged"] == false);
  CHECK(j["first_divergent"].is_null());
  CHECK(j["totals"]["counts"]["same"].get<int64_t>() == j["events_suspect"].get<int64_t>());
  CHECK(j["events_suspect"].get<int64_t>() > 1000);
}

TEST_CASE("a divergence inside an in-place foreach op (an optimizer step's form on GPUs) is named at that op, not "
          "at the first op that reads what it wrote") {
  // _foreach_addcmul_ returns nothing: the recorder records the lists it
  // writes, after the op, as its outputs. It rounds with FMA under avx2 and
  // without under the default capability; every input comes from arange and
  // exact arithmetic (the same bits under both). Before, the diff named the
  // cat that reads the lists, as bits changed outside the dispatcher.
  TempDir tmp;
  std::ofstream(tmp / "foreach.py") << "import torch\n"
                                       "torch.set_num_threads(1)\n"
                                       "base = torch.arange(4099, dtype=torch.float32)\n"
                                       "p = [base / 7 - 3 * i for i in range(3)]\n"
                                       "g = [base / 13 + i for i in range(3)]\n"
                                       "d = [base / 11 + 0.5 + i for i in range(3)]\n"
                                       "torch._foreach_addcmul_(p, g, d, value=0.1)\n"
                                       "print(torch.cat(p).sum().item())\n";
  const std::vector<std::string> prog = {kPython, tmp / "foreach.py"};
  record(tmp, tmp / "ref", prog, {"ATEN_CPU_CAPABILITY=default"});
  record(tmp, tmp / "sus", prog, {"ATEN_CPU_CAPABILITY=avx2"});
  auto j = diff_json(tmp, tmp / "ref", tmp / "sus", 3);
  REQUIRE(j["first_divergent"].is_object());
  const auto& f = j["first_divergent"];
  CHECK(f["op"] == "aten::_foreach_addcmul_");
  CHECK(f["class"] == "origin");
  check_independently(tmp, tmp / "ref", tmp / "sus", f["suspect_id"]);
}

TEST_CASE("a parameter frozen in one run: the matmul that reads it is the origin, and the diff says the runs called "
          "it with other requires_grad") {
  // matmul folds its 3-d operand into one mm when the other operand requires
  // grad and runs this transposed one as a bmm otherwise: the same bits in,
  // other bits out. A matrix-vector product: the small bmm is ATen's own loop,
  // the mm MKL's, which sum in other orders on Intel and AMD CPUs alike (a
  // 4 x 5 weight differed on an Intel CPU only, and only without MKL_CBWR).
  // Nothing in the configs differs: the event and tensor flags do.
  TempDir tmp;
  std::ofstream(tmp / "frozen.py") << "import sys\n"
                                      "import torch\n"
                                      "torch.manual_seed(0)\n"
                                      "torch.set_num_threads(1)\n"
                                      "w = torch.randn(20, 1, requires_grad=sys.argv[1] == 'train')\n"
                                      "x = torch.randn(17, 8, 20).transpose(0, 1)\n"
                                      "print(float(torch.matmul(x, w).sum()))\n";
  record(tmp, tmp / "ref", {kPython, tmp / "frozen.py", "train"}, {"MKL_CBWR"});
  record(tmp, tmp / "sus", {kPython, tmp / "frozen.py", "frozen"}, {"MKL_CBWR"});
  auto j = diff_json(tmp, tmp / "ref", tmp / "sus", 3);
  REQUIRE(j["first_divergent"].is_object());
  const auto& f = j["first_divergent"];
  CHECK(f["op"] == "aten::matmul");
  CHECK(f["class"] == "origin");
  CHECK(f.value("state_note", "").find("other requires grad (a leaf) | does not require grad") != std::string::npos);
  check_independently(tmp, tmp / "ref", tmp / "sus", f["suspect_id"]);
}

TEST_CASE("the C++ example with 1 vs 2 threads: the first divergent operator is a reduction with equal inputs") {
  TempDir tmp;
  record(tmp, tmp / "ref", {kTinyGpt, "--steps", "3", "--threads", "2"});
  record(tmp, tmp / "sus", {kTinyGpt, "--steps", "3", "--threads", "1"});
  auto j = diff_json(tmp, tmp / "ref", tmp / "sus", 3, {"--trace", tmp / "trace.json"});
  REQUIRE(j["first_divergent"].is_object());
  const auto& f = j["first_divergent"];
  CHECK(f["class"] == "origin");
  // Threads split reductions: over rows (sum, mean, the weight and bias grads
  // of layer_norm and embedding) or the inner dimension of a matmul.
  static const std::set<std::string> kReductions = {
      "aten::sum", "aten::mean", "aten::native_layer_norm_backward", "aten::embedding_backward",
      "aten::embedding_dense_backward", "aten::mm", "aten::bmm", "aten::addmm", "aten::matmul"};
  CHECK(kReductions.count(f["op"].get<std::string>()) == 1);
  // The manifests name the knob.
  bool threads_named = false;
  for (const auto& d : j["manifest_differences"]) threads_named = threads_named || d["key"] == "threads";
  CHECK(threads_named);
  check_independently(tmp, tmp / "ref", tmp / "sus", f["suspect_id"]);

  // The trace opens as trace-event JSON and marks the first divergent operator.
  std::ifstream in(tmp / "trace.json");
  auto trace = nlohmann::json::parse(in);
  int marked = 0;
  for (const auto& e : trace["traceEvents"])
    marked += e["ph"] == "X" && e["name"].get<std::string>().rfind("FIRST DIVERGENT", 0) == 0;
  CHECK(marked == 1);

  // The printed re-record commands give full tensors, and then evidence.
  const std::string commands = f["rerecord_command"];
  REQUIRE_FALSE(commands.empty());
  Result rr = run({"/bin/sh", "-c", commands + " >/dev/null"}, tmp.path().string());
  REQUIRE(rr.exit_code == 0);
  const std::string id = f["suspect_id"];
  auto j2 = diff_json(tmp, tmp / ("ref-around-" + id), tmp / ("sus-around-" + id), 3);
  REQUIRE(j2["first_divergent"].is_object());
  CHECK(j2["first_divergent"]["suspect_id"] == id);
  REQUIRE(j2["first_divergent"]["evidence"].size() >= 1);
  const auto& m = j2["first_divergent"]["evidence"][0]["metrics"];
  CHECK(m["differing"].get<int64_t>() > 0);
  CHECK(m["max_ulp"].get<uint64_t>() > 0);
}

TEST_CASE("the Python example with ATEN_CPU_CAPABILITY default vs avx2: the first divergent operator is a vectorised kernel") {
  TempDir tmp;
  const std::vector<std::string> prog = {kPython, kTinyGptPy, "--steps", "2"};
  record(tmp, tmp / "ref", prog, {"ATEN_CPU_CAPABILITY=avx2"});
  record(tmp, tmp / "same", prog, {"ATEN_CPU_CAPABILITY=avx2"});
  record(tmp, tmp / "sus", prog, {"ATEN_CPU_CAPABILITY=default"});
  auto same = diff_json(tmp, tmp / "ref", tmp / "same", 0);
  CHECK(same["diverged"] == false);
  auto j = diff_json(tmp, tmp / "ref", tmp / "sus", 3);
  REQUIRE(j["first_divergent"].is_object());
  const auto& f = j["first_divergent"];
  CHECK(f["class"] == "origin");
  // PLATFORM.md: the capability changes ATen's vectorised kernels, randn's
  // (normal_) among them, which initialises the weights.
  static const std::set<std::string> kVectorised = {"aten::normal_", "aten::exp", "aten::tanh", "aten::softmax",
                                                    "aten::_softmax", "aten::layer_norm", "aten::native_layer_norm",
                                                    "aten::log_softmax", "aten::_log_softmax", "aten::gelu"};
  CHECK(kVectorised.count(f["op"].get<std::string>()) == 1);
  check_independently(tmp, tmp / "ref", tmp / "sus", f["suspect_id"]);
}

TEST_CASE("the Python example with scaled_dot_product_attention in bfloat16, 2 vs 1 threads: a named origin, every "
          "event matched") {
  // torch's CPU flash attention runs then; its backward in bf16 allocates
  // buffers on its OpenMP workers at 2 threads, which must not become events
  // (they would be unmatched in the 1-thread run).
  TempDir tmp;
  const std::vector<std::string> prog = {kPython, kTinyGptPy, "--steps", "2", "--attention", "sdpa",
                                         "--dtype", "bfloat16", "--print-every", "0"};
  auto with_threads = [&](const char* n) {
    auto p = prog;
    p.insert(p.end(), {"--threads", n});
    return p;
  };
  record(tmp, tmp / "ref", with_threads("2"));
  record(tmp, tmp / "sus", with_threads("1"));
  auto j = diff_json(tmp, tmp / "ref", tmp / "sus", 3);
  REQUIRE(j["first_divergent"].is_object());
  const auto& f = j["first_divergent"];
  CHECK(f["class"] == "origin");
  CHECK(j["first_unmatched"].is_null());
  CHECK(j["totals"]["counts"]["unmatched"] == 0);
  CHECK(j["events_reference"] == j["events_suspect"]);
  check_independently(tmp, tmp / "ref", tmp / "sus", f["suspect_id"]);
  // The manifests differ in the knob, not in the recorder's counts (the
  // reference's workers ran ops for the kernel; the suspect has none).
  std::set<std::string> keys;
  for (const auto& d : j["manifest_differences"]) keys.insert(d["key"].get<std::string>());
  CHECK(keys.count("threads") == 1);
  CHECK(keys.count("ops_on_kernel_workers") == 0);

  std::size_t flash_backward = 0;
  for (const auto& e : opguard::testing::events_of(tmp / "ref")) {
    INFO(e.op << " on stream " << e.stream);
    CHECK(e.stream == 0);
    flash_backward += e.op == "aten::_scaled_dot_product_flash_attention_for_cpu_backward" ? 1 : 0;
  }
  CHECK(flash_backward == 4);  // 2 blocks, 2 steps
  const auto layout = opguard::formats::scan_recording(tmp / "ref");
  const auto manifest = opguard::formats::read_manifest(layout.ranks.at(0).manifest_path);
  CHECK(manifest.info.at("ops_on_kernel_workers") != "0");
}

TEST_CASE("batches from DataLoader worker processes: the changed op is named, not the set_ that brings a batch in") {
  // The main process rebuilds each batch a worker sends with aten::set_ of a
  // Storage, in the order the batches arrive. The diff named such a set_ the
  // origin (its Storage argument recorded as text, equal, its output not),
  // before the op the suspect changed, and in runs that did not diverge.
  TempDir tmp;
  std::ofstream(tmp / "loader.py") << "import sys, torch\n"
                                       "torch.manual_seed(0)\n"
                                       "torch.set_num_threads(1)\n"
                                       "scale = float(sys.argv[1])\n"
                                       "class Data(torch.utils.data.Dataset):\n"
                                       "    def __len__(self): return 64\n"
                                       "    def __getitem__(self, i):\n"
                                       "        g = torch.Generator().manual_seed(i)\n"
                                       "        return torch.randn(16, generator=g), i % 4\n"
                                       "m1, m2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)\n"
                                       "opt = torch.optim.SGD([*m1.parameters(), *m2.parameters()], lr=0.1)\n"
                                       "loader = torch.utils.data.DataLoader(Data(), batch_size=16, num_workers=2)\n"
                                       "step = 0\n"
                                       "for epoch in range(2):\n"
                                       "    for x, y in loader:\n"
                                       "        h = m1(x) * (scale if step == 2 else 1.0)\n"
                                       "        loss = torch.nn.functional.cross_entropy(m2(torch.relu(h)), y)\n"
                                       "        opt.zero_grad()\n"
                                       "        loss.backward()\n"
                                       "        opt.step()\n"
                                       "        step += 1\n"
                                       "print(loss.item())\n";
  record(tmp, tmp / "ref", {kPython, tmp / "loader.py", "1.0"});
  record(tmp, tmp / "sus", {kPython, tmp / "loader.py", "1.000001"});
  record(tmp, tmp / "again", {kPython, tmp / "loader.py", "1.0"});
  // The same program again: the batches may arrive in another order, which
  // moves their set_ to other steps; the runs agree.
  CHECK(diff_json(tmp, tmp / "ref", tmp / "again", 0)["diverged"] == false);
  int set_events = 0;
  for (const auto& e : opguard::testing::events_of(tmp / "ref")) set_events += e.op == "aten::set_";
  CHECK(set_events >= 8);  // a batch and its labels per step
  const auto j = diff_json(tmp, tmp / "ref", tmp / "sus", 3);
  REQUIRE(j["first_divergent"].is_object());
  CHECK(j["first_divergent"]["op"] == "aten::mul");
  CHECK(j["first_divergent"]["step"] == 2);
  CHECK(j["first_divergent"]["class"] == "origin-args");  // the Python number, wrapped in a tensor
}

TEST_CASE("bits written without the dispatcher are entered where an op first reads them, not that op's origin") {
  // torch bumps a tensor's version for operators only: an optimizer that
  // updates the parameters through numpy (as a fused optimizer called without
  // the dispatcher does) leaves their versions, and a buffer that empty()
  // made and numpy filled looks never written. Before the recorder checked
  // its cache and its never-written buffers against the memory
  // (kernels::probe), the next op got the stale fingerprint or none, and the
  // diff named it the origin. Memory that nothing wrote stays unhashed: the
  // meta-device module's parameters that to_empty() makes.
  TempDir tmp;
  std::ofstream(tmp / "outside.py") << "import sys, torch\n"
                                        "torch.manual_seed(0)\n"
                                        "torch.set_num_threads(1)\n"
                                        "lr, fill, scale = (float(a) for a in sys.argv[1:4])\n"
                                        "m = torch.nn.Linear(8, 8)\n"
                                        "x = torch.randn(4, 8) * torch.tensor([scale] * 8)  # bits from Python\n"
                                        "for step in range(3):\n"
                                        "    loss = m(x).pow(2).mean()\n"
                                        "    m.zero_grad()\n"
                                        "    loss.backward()\n"
                                        "    for p in m.parameters():\n"
                                        "        p.detach().numpy()[:] -= lr * p.grad.numpy()\n"
                                        "with torch.device('meta'):\n"
                                        "    n = torch.nn.Linear(64, 64)\n"
                                        "n = n.to_empty(device='cpu')\n"
                                        "buf = torch.empty(8)\n"
                                        "buf.numpy()[:] = fill\n"
                                        "buf.mul_(2)\n"
                                        "print((m(x) + buf).sum().item())\n";
  auto prog = [&](const char* lr, const char* fill, const char* scale) {
    return std::vector<std::string>{kPython, tmp / "outside.py", lr, fill, scale};
  };
  record(tmp, tmp / "ref", prog("0.1", "1", "1"));
  record(tmp, tmp / "same", prog("0.1", "1", "1"));
  record(tmp, tmp / "lr", prog("0.2", "1", "1"));
  record(tmp, tmp / "fill", prog("0.1", "2", "1"));
  record(tmp, tmp / "scale", prog("0.1", "1", "3"));
  CHECK(diff_json(tmp, tmp / "ref", tmp / "same", 0)["diverged"] == false);
  int never_written = 0;  // to_empty: the parameters' empty memory, its metadata checked, no bits read
  for (const auto& e : opguard::testing::events_of(tmp / "ref")) {
    if (e.op != "aten::_has_compatible_shallow_copy_type") continue;
    for (const auto& v : e.inputs) never_written += (v.tensor.flags & opguard::formats::kTensorUninitialized) ? 1 : 0;
  }
  CHECK(never_written >= 2);

  auto lr = diff_json(tmp, tmp / "ref", tmp / "lr", 3)["first_divergent"];
  REQUIRE(lr.is_object());
  CHECK(lr["class"] == "entered");
  CHECK(lr["op"] == "aten::linear");  // the forward of step 1 reads the parameters first
  CHECK(lr["entered"]["input"] == "weight");
  CHECK(lr["entered"]["side"] == "suspect");

  auto fill = diff_json(tmp, tmp / "ref", tmp / "fill", 3)["first_divergent"];
  REQUIRE(fill.is_object());
  CHECK(fill["class"] == "entered");
  CHECK(fill["op"] == "aten::mul_");  // reads its self, which numpy wrote
  CHECK(fill["entered"]["input"] == "self");

  // torch.tensor(list) fills the memory of an aten::empty without an
  // operator: its first reader (a copy to the target dtype and device)
  // gets the data. It was flagged uninitialised, and the diff named the
  // first op that overwrote it (detach_) the origin.
  auto scale = diff_json(tmp, tmp / "ref", tmp / "scale", 3)["first_divergent"];
  REQUIRE(scale.is_object());
  CHECK(scale["class"] == "entered");
  CHECK(scale["op"] == "aten::to");
  CHECK(scale["step"] == 0);
}

TEST_CASE("softmax spelled out with a torch.tensor literal is a region named by the softmax") {
  // torch.tensor(1.0) writes the number into the buffer of an aten::empty
  // without an operator, then calls aten::to and aten::lift_fresh: bits of
  // unknown provenance, which made the diff name no operator at all.
  TempDir tmp;
  std::ofstream(tmp / "literal.py") << "import sys, torch\n"
                                        "torch.manual_seed(0)\n"
                                        "torch.set_num_threads(1)\n"
                                        "m = torch.nn.Linear(16, 16)\n"
                                        "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                                        "x = torch.randn(8, 16)\n"
                                        "for step in range(2):\n"
                                        "    h = m(x)\n"
                                        "    if sys.argv[1] == 'softmax':\n"
                                        "        p = torch.softmax(h, dim=-1)\n"
                                        "    else:\n"
                                        "        e = torch.exp(h - h.amax(dim=-1, keepdim=True))\n"
                                        "        p = e / e.sum(dim=-1, keepdim=True) * torch.tensor(1.0)\n"
                                        "    loss = (p * p).sum()\n"
                                        "    opt.zero_grad()\n"
                                        "    loss.backward()\n"
                                        "    opt.step()\n";
  record(tmp, tmp / "ref", {kPython, tmp / "literal.py", "softmax"});
  record(tmp, tmp / "sus", {kPython, tmp / "literal.py", "spelled"});
  auto f = diff_json(tmp, tmp / "ref", tmp / "sus", 3)["first_divergent"];
  REQUIRE(f.is_object());
  CHECK(f["class"] == "origin");
  CHECK(f["op"] == "aten::softmax");
  CHECK(f["step"] == 0);
  REQUIRE(f["region"].is_object());
  std::set<std::string> ops;
  for (const auto& o : f["region"]["suspect_ops"]) ops.insert(o.get<std::string>());
  CHECK(ops.count("aten::empty.memory_format") == 1);
  CHECK(ops.count("aten::lift_fresh") == 1);
  CHECK(ops.count("aten::exp") == 1);
}

TEST_CASE("a torch.compile'd program recorded as it compiles and again from inductor's cache: the runs agree") {
  // The compiler's own ops (on FakeTensors while it traces, real ones for
  // constants and copies; the backward's at its first run) were events: a
  // thousand in the step that compiled, which the run that loaded the compiled
  // code from the cache does not have, so the diff said "diverge in structure only".
  TempDir tmp;
  std::ofstream(tmp / "compiled.py") << "import torch\n"
                                         "torch.manual_seed(0)\n"
                                         "torch.set_num_threads(1)\n"
                                         "m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(),\n"
                                         "                        torch.nn.Linear(128, 64))\n"
                                         "head = torch.nn.LayerNorm(64)\n"
                                         "opt = torch.optim.AdamW(list(m.parameters()) + list(head.parameters()))\n"
                                         "import os\n"
                                         "f = m if os.environ.get('EAGER') == '1' else torch.compile(m)\n"
                                         "x = torch.randn(32, 64)\n"
                                         "for step in range(3):\n"
                                         "    loss = head(f(x)).pow(2).mean()\n"
                                         "    opt.zero_grad()\n"
                                         "    loss.backward()\n"
                                         "    opt.step()\n";
  const std::string cache = "TORCHINDUCTOR_CACHE_DIR=" + tmp / "inductor";
  record(tmp, tmp / "cold", {kPython, tmp / "compiled.py"}, {cache});
  record(tmp, tmp / "cached", {kPython, tmp / "compiled.py"}, {cache});
  const auto cold = opguard::testing::events_of(tmp / "cold");
  CHECK(cold.size() == opguard::testing::events_of(tmp / "cached").size());
  std::size_t addmm = 0;  // the compiled forward calls out to addmm
  for (const auto& e : cold) addmm += e.op == "aten::addmm" ? 1 : 0;
  CHECK(addmm >= 6);
  CHECK(diff_json(tmp, tmp / "cold", tmp / "cached", 0)["diverged"] == false);

  // Against the same program run eagerly: the compiled kernels (inductor's
  // GELU) compute other bits, in memory they write outside the dispatcher, so
  // no operator is named from the eager side; a note says which region parts
  // and why. From the compiled side, whose region the eager ops replace, the
  // region is named.
  record(tmp, tmp / "eager", {kPython, tmp / "compiled.py"}, {cache, "EAGER=1"});
  const auto j = diff_json(tmp, tmp / "eager", tmp / "cold", 3);
  CHECK(j["first_divergent"].is_null());
  REQUIRE(j["notes"].size() == 1);
  const std::string note = j["notes"][0];
  CAPTURE(note);
  CHECK(note.find("rank 0 step 0 forward: a region that does not align (reference: 3 ops") != std::string::npos);
  CHECK(note.find("(aten::addmm.out) read input") != std::string::npos);
  CHECK(note.find("bits that no operator of the recording made") != std::string::npos);
  const auto swapped = diff_json(tmp, tmp / "cold", tmp / "eager", 3);
  REQUIRE(swapped["first_divergent"].is_object());
  CHECK(swapped["first_divergent"]["region"]["suspect_ops"][1] == "aten::gelu");
}

TEST_CASE("opguard diff refuses bad input with a one-line error and a documented exit code") {
  TempDir tmp;
  record(tmp, tmp / "a", {kTinyGpt, "--steps", "1"});
  std::filesystem::create_directories(tmp / "not-a-recording");
  Result r = run({kOpguard, "diff", tmp / "a", tmp / "not-a-recording"}, tmp.path().string());
  CHECK(r.exit_code == 65);
  CHECK(r.err.find("not an opguard recording") != std::string::npos);
  r = run({kOpguard, "diff", tmp / "a"}, tmp.path().string());
  CHECK(r.exit_code == 2);
  r = run({kOpguard, "diff", tmp / "a", tmp / "a", "--steps", "5:2"}, tmp.path().string());
  CHECK(r.exit_code == 2);
  r = run({kOpguard, "diff", tmp / "a", "--ranks", "0,x"}, tmp.path().string());
  CHECK(r.exit_code == 2);
  r = run({kOpguard, "diff", tmp / "a", tmp / "a", "--rank", "7"}, tmp.path().string());
  CHECK(r.exit_code == 2);
  r = run({kOpguard, "diff", tmp / "a", tmp / "a", "--trace", "/nonexistent-dir/t.json"}, tmp.path().string());
  CHECK(r.exit_code == 74);
}
