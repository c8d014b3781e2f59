// opguard repro on the C++ example: record one dumped step, bundle the softmax
// whose bits ATEN_CPU_CAPABILITY=default changes (PLATFORM.md, tests/replay),
// then build the bundle's repro.cpp with CMake against the venv's libtorch,
// run it and repro.py, and check that both say "reproduced" with the same
// metrics; no absolute path of this machine in the bundle; refusals for
// identical configs and for output directories that would write elsewhere.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "../support/process.h"

using opguard::testing::read_file;
using opguard::testing::Result;
using opguard::testing::run;
using opguard::testing::TempDir;
namespace fs = std::filesystem;

namespace {

const std::string kOpguard = OPGUARD_BIN;
const std::string kTinyGpt = OPGUARD_TINY_GPT_BIN;
const std::string kPython = OPGUARD_PYTHON_BIN;
const std::string kCMake = OPGUARD_CMAKE_BIN;
const std::string kSourceDir = OPGUARD_SOURCE_DIR;
const std::string kBuildDir = OPGUARD_BUILD_DIR;

// Knobs both configs set explicitly: the bundle must not depend on the
// capability this machine would pick by itself (avx512 here, maybe not on CI).
const std::string kGood = "cpu_capability=avx2";
const std::string kBad = "cpu_capability=default";

// `opguard repro` of one event of `rec` into `bundle`, good threads=1 against
// `bad`; returns the bundle's manifest.json.
nlohmann::json write_bundle(const TempDir& tmp, const std::string& rec, const std::string& event,
                            const std::string& bad, const std::string& bundle) {
  Result w = run({kOpguard, "repro", rec, "--event", event, "--good", "threads=1", "--bad", bad, "-o", bundle},
                 tmp.path().string());
  INFO(w.out << w.err);
  REQUIRE(w.exit_code == 0);
  std::ifstream mf(fs::path(bundle) / "manifest.json");
  return nlohmann::json::parse(mf);
}

// The id of the first event of `op` in step 1 (dumped in full), read with h5py.
std::string first_event(const TempDir& tmp, const std::string& rec, const std::string& op) {
  const std::string script =
      "import h5py,sys\n"
      "f=h5py.File(sys.argv[1]+'/rank0/step00000001.h5','r')\n"
      "blob,off=f['strings'][()].tobytes(),f['string_offsets'][()]\n"
      "ops=[blob[off[i]:off[i+1]].decode() for i in f['events/op'][:]]\n"
      "print(int(f['events/id'][ops.index(sys.argv[2])]))\n";
  Result r = run({kPython, "-c", script, rec, op}, tmp.path().string());
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  return r.out.substr(0, r.out.find('\n'));
}

// The lines that state metrics ("output 0 ... differ ..."), for comparing the two programs.
std::vector<std::string> metric_lines(const std::string& out) {
  std::vector<std::string> lines;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("output ", 0) == 0) lines.push_back(line);
  return lines;
}

struct Recording {
  TempDir tmp;
  std::string rec, event;
  Recording() {
    rec = (tmp / "rec");
    Result r = run({kOpguard, "record", "--out", rec, "--dump-steps", "1", "--", kTinyGpt, "--steps", "2"},
                   tmp.path().string());
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    event = first_event(tmp, rec, "aten::softmax");
  }
};

Recording& recording() {
  static Recording r;
  return r;
}

}  // namespace

TEST_CASE("a bundle for softmax under cpu_capability avx2 vs default builds and reproduces, in C++ and in Python") {
  auto& R = recording();
  TempDir tmp;
  const std::string bundle = (tmp / "bundle");
  Result w = run({kOpguard, "repro", R.rec, "--event", R.event, "--good", kGood, "--bad", kBad, "-o", bundle},
                 tmp.path().string());
  INFO(w.out << w.err);
  REQUIRE(w.exit_code == 0);
  for (const char* f : {"inputs.h5", "expected_good.h5", "expected_bad.h5", "manifest.json", "README.md", "repro.py",
                        "repro.cpp", "CMakeLists.txt"})
    CHECK(fs::is_regular_file(fs::path(bundle) / f));
  // Nothing else: the trials' scratch directory is gone.
  CHECK(std::distance(fs::directory_iterator(bundle), fs::directory_iterator{}) == 8);

  std::ifstream mf(fs::path(bundle) / "manifest.json");
  const auto manifest = nlohmann::json::parse(mf);
  CHECK(manifest["format"] == "opguard-bundle/1");
  CHECK(manifest["operator"]["name"] == "aten::softmax");
  CHECK(manifest["knobs_found"] == nlohmann::json::array({"cpu_capability"}));
  CHECK(manifest["good"]["config"].get<std::string>().find("cpu_capability=avx2") != std::string::npos);
  CHECK(manifest["bad"]["config"].get<std::string>().find("cpu_capability=default") != std::string::npos);
  CHECK(manifest["environment"]["torch_version"].get<std::string>().size() > 0);
  // softmax(Tensor self, int dim, ScalarType? dtype): the non-tensor arguments are there.
  REQUIRE(manifest["arguments"].size() == 3);
  CHECK(manifest["arguments"][1]["kind"] == "int");
  const int64_t differing = manifest["outputs"][0]["metrics"]["differing"];
  CHECK(differing > 0);

  // No absolute path of this machine in any file of the bundle.
  for (const auto& e : fs::directory_iterator(bundle)) {
    const std::string text = read_file(e.path().string());
    for (const std::string& path : {tmp.path().string(), R.tmp.path().string(), kSourceDir, kBuildDir,
                                    fs::path(kPython).parent_path().parent_path().string()}) {
      INFO(e.path().filename().string() << " holds " << path);
      CHECK(text.find(path) == std::string::npos);
    }
  }

  // repro.py: torch and h5py only.
  Result py = run({kPython, bundle + "/repro.py", "--strict"}, tmp.path().string());
  INFO(py.out << py.err);
  CHECK(py.exit_code == 0);
  CHECK(py.out.find("REPRODUCED: good and bad give different bits") != std::string::npos);
  const auto py_metrics = metric_lines(py.out);
  REQUIRE(py_metrics.size() == 1);
  CHECK(py_metrics[0].find(std::to_string(differing) + " of ") != std::string::npos);

  // repro.cpp: CMake against the venv's libtorch and the system HDF5, then run.
  Result cpp = opguard::testing::build_and_run_repro(kPython, kCMake, bundle, tmp / "repro-build", tmp.path().string());
  INFO(cpp.out << cpp.err);
  CHECK(cpp.exit_code == 0);
  CHECK(cpp.out.find("REPRODUCED: good and bad give different bits") != std::string::npos);
  // The two programs measure the same divergence (same elements, ULP, errors).
  CHECK(metric_lines(cpp.out) == py_metrics);

  // opguard repro check re-runs repro.py and confirms it.
  Result check = run({kOpguard, "repro", "check", bundle, "--python", kPython}, tmp.path().string());
  INFO(check.out << check.err);
  CHECK(check.exit_code == 0);
  CHECK(check.out.find("still reproduces") != std::string::npos);

  // A recorded BLAS variable that neither config sets (the recorded run did not
  // have it) is removed in repro.py's children whatever the caller exports: a
  // sitecustomize on PYTHONPATH logs what each child sees.
  const fs::path spy = tmp / "spy";
  fs::create_directory(spy);
  std::ofstream(spy / "sitecustomize.py")
      << "import os, sys\n"
         "if '--child' in sys.argv:\n"
         "    with open(os.environ['OPGUARD_TEST_SPY_LOG'], 'a') as f:\n"
         "        f.write(os.environ.get('MKL_ENABLE_INSTRUCTIONS', '<unset>') + '\\n')\n";
  const std::string spy_log = (tmp / "spy.log");
  Result spied = run({kOpguard, "repro", "check", bundle, "--python", kPython}, tmp.path().string(),
                     {"PYTHONPATH=" + spy.string(), "OPGUARD_TEST_SPY_LOG=" + spy_log, "MKL_ENABLE_INSTRUCTIONS=AVX2"});
  INFO(spied.out << spied.err);
  CHECK(spied.exit_code == 0);
  CHECK(read_file(spy_log) == "<unset>\n<unset>\n");  // the good and the bad child
  // repro.cpp removes the same variables (its children are the program itself).
  CHECK(read_file(bundle + "/repro.cpp").find("\"MKL_ENABLE_INSTRUCTIONS\"") != std::string::npos);

  // A bundle whose expected bits are swapped no longer reproduces exactly:
  // check fails (exit 4) and repro.py --strict exits 1.
  const std::string swapped = (tmp / "swapped");
  fs::copy(bundle, swapped);
  fs::remove(fs::path(swapped) / "expected_good.h5");
  fs::copy_file(fs::path(swapped) / "expected_bad.h5", fs::path(swapped) / "expected_good.h5");
  Result bad_check = run({kOpguard, "repro", "check", swapped, "--python", kPython}, tmp.path().string());
  INFO(bad_check.out << bad_check.err);
  CHECK(bad_check.exit_code == 4);
  CHECK(bad_check.out.find("DIFFER from expected_good.h5") != std::string::npos);
}

TEST_CASE("bundles of an op under autocast, of one with a wrapped Python number, of a matmul of tensors that "
          "require grad and of a factory op under a float64 default dtype give the recorded bits, in Python and in C++") {
  // tests/replay/mixed_ops.py: a bf16-autocast linear split over 2 shards
  // (tp=2), x * 0.1 in float64 (dtype=fp64: x is cast, 0.1 stays the Python
  // double it was), and a matmul of a parameter and a non-contiguous 3-d
  // activation under grad mode (tp=2). The programs must run the op as it was
  // recorded (--strict: the exact bits of expected_good.h5 and
  // expected_bad.h5): the linear under autocast, the 0.1 as a number, the
  // matmul's shards folded into mm as requires_grad makes them, the linspace
  // (no dtype argument) in float64, the default dtype the script set.
  TempDir tmp;
  const std::string rec = tmp / "mixed";
  // With MKL's default code path (the suite sets MKL_CBWR=COMPATIBLE), where
  // the matmul's small mm and bmm round differently: a bundle that ran a bmm
  // would not give the recorded bits.
  Result r = run({kOpguard, "record", "--out", rec, "--dump-all", "--", kPython, OPGUARD_MIXED_OPS_PY},
                 tmp.path().string(), {"MKL_CBWR"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  Result ls = run({kOpguard, "ls", rec, "--events", "--json"}, tmp.path().string());
  REQUIRE(ls.exit_code == 0);
  const auto listed = nlohmann::json::parse(ls.out);
  auto nth = [&](const std::string& op, int n) {
    for (const auto& ev : listed["ranks"][0]["steps"][0]["events"])
      if (ev["op"] == op && n-- == 0) return ev["id"].get<std::string>();
    FAIL("no " << op);
    return std::string();
  };
  struct Case {
    std::string op;
    int nth;
    std::string bad, autocast, kind;
    bool grad_mode;  // the script runs them all under grad mode (Python's default)
    nlohmann::json grad;  // the manifest's grad list of argument 1, null: none
    std::string default_dtype;
  };
  for (const Case& c :
       {Case{"aten::linear", 0, "tp=2", "bfloat16", "tensor", true, nullptr, "float32"},
        Case{"aten::mul.Tensor", 0, "dtype=fp64", "", "wrapped_number", true, nullptr, "float32"},
        Case{"aten::matmul", 1, "tp=2", "", "tensor", true, nlohmann::json::array({"leaf"}), "float32"},
        Case{"aten::linspace", 0, "cpu_capability=default", "", "double", true, nullptr, "float64"}}) {
    INFO(c.op);
    const std::string name = c.op.substr(6, c.op.find('.') == std::string::npos ? std::string::npos : c.op.find('.') - 6);
    const std::string bundle = tmp / (name + "-bundle");
    const auto manifest = write_bundle(tmp, rec, nth(c.op, c.nth), c.bad, bundle);
    CHECK(manifest["autocast_cpu"] == c.autocast);
    CHECK(manifest["grad_mode"] == c.grad_mode);
    CHECK(manifest["default_dtype"] == c.default_dtype);
    CHECK(manifest["arguments"][1]["kind"] == c.kind);
    CHECK(manifest["arguments"][1].value("grad", nlohmann::json()) == c.grad);
    if (!c.grad.is_null()) CHECK(manifest["arguments"][0]["grad"] == nlohmann::json::array({"computed"}));
    Result py = run({kPython, fs::path(bundle) / "repro.py", "--strict"}, tmp.path().string());
    INFO(py.out << py.err);
    CHECK(py.exit_code == 0);
    Result cpp = opguard::testing::build_and_run_repro(kPython, kCMake, bundle, tmp / (name + "-build"),
                                                       tmp.path().string());
    INFO(cpp.out << cpp.err);
    CHECK(cpp.exit_code == 0);
  }
}

TEST_CASE("a bundle of attention run under sdpa_kernel(MATH) runs it with the math backend, in Python and in C++") {
  // tests/replay/sdpa_ops.py math: the op's backends are recorded per event;
  // a config without sdpa_backend runs the recorded ones (math), and
  // sdpa_backend=all lets the CPU pick flash. The op also has a dropout
  // argument, so the bundle sets the default generator's state (repro.cpp
  // did not compile such a bundle before: the generator is a const reference).
  TempDir tmp;
  const std::string rec = tmp / "attention";
  Result r = run({kOpguard, "record", "--out", rec, "--dump-all", "--", kPython, OPGUARD_SDPA_OPS_PY, "math"},
                 tmp.path().string());
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const std::string bundle = tmp / "bundle";
  // Event 3: three randn, then the attention.
  const auto manifest = write_bundle(tmp, rec, "3", "sdpa_backend=all", bundle);
  CHECK(manifest["operator"]["name"] == "aten::scaled_dot_product_attention");
  CHECK(manifest["sdpa_backend"] == "math");
  Result py = run({kPython, fs::path(bundle) / "repro.py", "--strict"}, tmp.path().string());
  INFO(py.out << py.err);
  CHECK(py.exit_code == 0);
  Result cpp = opguard::testing::build_and_run_repro(kPython, kCMake, bundle, tmp / "build", tmp.path().string());
  INFO(cpp.out << cpp.err);
  CHECK(cpp.exit_code == 0);
}

TEST_CASE("a bundle of an op that ran with denormals flushed on the main thread only runs it so, in Python and in C++") {
  // tests/replay/denormal_ops.py flush late big: the program starts its
  // intra-op worker before torch.set_flush_denormal(True), and the worker's
  // half of the 2**20 products stays denormal (flush_denormal=main). The
  // bundle's programs must start their workers unflushed before they set the
  // flag (--strict: the recorded bits); flush_denormal=on flushes all.
  if (std::thread::hardware_concurrency() < 2) {
    MESSAGE("SKIPPED: one CPU, no intra-op worker thread");
    return;
  }
  TempDir tmp;
  const std::string rec = tmp / "flushed";
  Result r = run({kOpguard, "record", "--out", rec, "--dump-all", "--", kPython, OPGUARD_DENORMAL_OPS_PY, "flush",
                  "late", "big"},
                 tmp.path().string());
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("524288") != std::string::npos);  // the program's count of flushed products
  Result ls = run({kOpguard, "ls", rec, "--events", "--json"}, tmp.path().string());
  REQUIRE(ls.exit_code == 0);
  const auto listed = nlohmann::json::parse(ls.out);
  std::string mul;
  for (const auto& ev : listed["ranks"][0]["steps"][0]["events"])
    if (ev["op"] == "aten::mul.Tensor") mul = ev["id"].get<std::string>();
  REQUIRE_FALSE(mul.empty());
  const std::string bundle = tmp / "bundle";
  Result w = run({kOpguard, "repro", rec, "--event", mul, "--good", "flush_denormal=main", "--bad",
                  "flush_denormal=on", "-o", bundle},
                 tmp.path().string());
  INFO(w.out << w.err);
  REQUIRE(w.exit_code == 0);
  Result py = run({kPython, fs::path(bundle) / "repro.py", "--strict"}, tmp.path().string());
  INFO(py.out << py.err);
  CHECK(py.exit_code == 0);
  CHECK(py.out.find("524288 of 1048576") != std::string::npos);
  Result cpp = opguard::testing::build_and_run_repro(kPython, kCMake, bundle, tmp / "build", tmp.path().string());
  INFO(cpp.out << cpp.err);
  CHECK(cpp.exit_code == 0);
  CHECK(metric_lines(cpp.out) == metric_lines(py.out));
}

TEST_CASE("--slices outside a dimension, near 2^63, twice on one dimension, or on one of two dimensions of a size "
          "alone is refused: exit 2, no bundle") {
  // native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd,
  // weight, bias, mask): the rows of grad_out, input, mean and rstd are one
  // dimension of the op. A start near 2^63 passed the bounds check
  // (start + length overflowed) and a cut of grad_out's rows alone passed
  // the op's own checks; both bundles held bytes from outside the tensors.
  auto& R = recording();
  TempDir tmp;
  const std::string event = first_event(tmp, R.rec, "aten::native_layer_norm_backward");
  for (const char* slices : {"0:0:9223372036854775807:1", "0:0:18446744073709551615:1", "0:0:0:1",
                             "0:0:0:1,0:0:0:1"}) {
    INFO(slices);
    const std::string bundle = tmp / "bundle";
    Result w = run({kOpguard, "repro", R.rec, "--event", event, "--good", "threads=1", "--bad", "threads=2", "-o",
                    bundle, "--slices", slices},
                   tmp.path().string());
    INFO(w.out << w.err);
    CHECK(w.exit_code == 2);
    CHECK(std::count(w.err.begin(), w.err.end(), '\n') == 1);
    CHECK_FALSE(fs::exists(fs::path(bundle) / "manifest.json"));
  }
  Result alone = run({kOpguard, "repro", R.rec, "--event", event, "--good", "threads=1", "--bad", "threads=2", "-o",
                      tmp / "alone", "--slices", "0:0:0:1"},
                     tmp.path().string());
  CHECK(alone.err.find("cut every dimension of that size alike") != std::string::npos);
}

TEST_CASE("identical good and bad configs: nothing to reproduce, exit 4, no bundle") {
  auto& R = recording();
  TempDir tmp;
  const std::string bundle = (tmp / "same");
  Result w = run({kOpguard, "repro", R.rec, "--event", R.event, "--good", kGood, "--bad", kGood, "-o", bundle},
                 tmp.path().string());
  INFO(w.out << w.err);
  CHECK(w.exit_code == 4);
  CHECK(w.err.find("nothing to reproduce") != std::string::npos);
  CHECK_FALSE(fs::exists(bundle));
}

TEST_CASE("repro refuses output directories that would write outside them, and check refuses a foreign manifest") {
  auto& R = recording();
  TempDir tmp;
  const std::string outside = (tmp / "outside.txt");
  {
    std::ofstream(outside) << "untouched";
  }
  // A directory holding a symlink where a bundle file would go.
  const fs::path planted = tmp / "planted";
  fs::create_directory(planted);
  fs::create_symlink(outside, planted / "inputs.h5");
  Result a = run({kOpguard, "repro", R.rec, "--event", R.event, "--good", kGood, "--bad", kBad, "-o", planted.string()},
                 tmp.path().string());
  INFO(a.err);
  CHECK(a.exit_code == 74);  // the output cannot be written there
  CHECK(a.err.find("not empty") != std::string::npos);
  // -o itself a symlink to another directory.
  fs::create_directory(tmp / "elsewhere");
  fs::create_directory_symlink(tmp / "elsewhere", tmp / "link");
  Result b = run({kOpguard, "repro", R.rec, "--event", R.event, "--good", kGood, "--bad", kBad, "-o", (tmp / "link")},
                 tmp.path().string());
  INFO(b.err);
  CHECK(b.exit_code == 74);
  CHECK(b.err.find("symbolic link") != std::string::npos);
  CHECK(fs::is_empty(tmp / "elsewhere"));
  CHECK(read_file(outside) == "untouched");

  // check: a manifest naming files outside the bundle is refused before anything runs.
  const fs::path fake = tmp / "fake";
  fs::create_directory(fake);
  for (const char* f : {"inputs.h5", "expected_good.h5", "expected_bad.h5", "README.md", "repro.py", "repro.cpp",
                        "CMakeLists.txt"})
    std::ofstream(fake / f) << "x";
  std::ofstream(fake / "manifest.json") << R"({"format": "opguard-bundle/1", "files": ["../outside.txt"]})";
  Result c = run({kOpguard, "repro", "check", fake.string(), "--python", kPython}, tmp.path().string());
  INFO(c.out << c.err);
  CHECK(c.exit_code == 65);
  Result d = run({kOpguard, "repro", "check", (tmp / "nothing-here"), "--python", kPython}, tmp.path().string());
  CHECK(d.exit_code == 65);  // as a missing recording is for the other verbs
}
