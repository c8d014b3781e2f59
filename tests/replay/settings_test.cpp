// A trial's settings in a process that set them itself: the replay library
// called from a program (not the opguard binary) that used PyTorch 2.9's
// per-backend precision API. Torch headers here, to set that state; doctest
// after them (STYLE.md: glog's CHECK).

#include <ATen/Context.h>

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fstream>

#include "../support/process.h"
#include "../support/recording_keys.h"
#include "opguard/formats/recording.h"
#include "opguard/replay/replay.h"

using opguard::testing::record_argv;
using opguard::testing::Result;
using opguard::testing::run;
using opguard::testing::TempDir;
namespace replay = opguard::replay;

TEST_CASE("a trial sets and restores the CPU's matmul precision per backend: in a process that mixed the legacy and "
          "the per-backend API, and leaving the CUDA one alone") {
  // libtorch's legacy float32MatmulPrecision() throws in such a process: a
  // trial read it to restore it afterwards, and its legacy setter also set
  // the CUDA matmul precision, which is the tf32_cublas knob's.
  TempDir tmp;
  std::ofstream(tmp / "mm.py") << "import torch\n"
                                  "torch.manual_seed(0)\n"
                                  "a = torch.randn(64, 64)\n"
                                  "print(torch.mm(a, a.t()).sum().item())\n";
  Result rec = run(record_argv(OPGUARD_BIN, tmp / "rec", {"--dump-all"}, {OPGUARD_PYTHON_BIN, tmp / "mm.py"}),
                   tmp.path().string());
  INFO(rec.err);
  REQUIRE(rec.exit_code == 0);
  std::string mm;
  for (const auto& e : opguard::testing::events_of(tmp / "rec"))
    if (e.op == "aten::mm") mm = opguard::formats::event_id_string(e.id);
  REQUIRE(!mm.empty());

  auto& ctx = at::globalContext();
  using B = at::Float32Backend;
  using O = at::Float32Op;
  using P = at::Float32Precision;
  ctx.setFloat32MatmulPrecision("highest");
  ctx.setFloat32Precision(B::CUDA, O::MATMUL, P::TF32);
  CHECK_THROWS(ctx.float32MatmulPrecision());
  for (const char* v : {"highest", "high", "medium"}) {
    CAPTURE(v);
    replay::ReplayOptions o;
    o.config = replay::Config::parse(std::string("float32_matmul_precision=") + v);
    o.self_exe = OPGUARD_BIN;
    const auto r = replay::replay_event(tmp / "rec", mm, o);
    INFO(r.message);
    CHECK((r.verdict == replay::Verdict::kReproduces || r.verdict == replay::Verdict::kDiffers));
    CHECK(r.config.find(std::string("float32_matmul_precision=") + v) != std::string::npos);
    CHECK(ctx.float32Precision(B::MKLDNN, O::MATMUL) == P::IEEE);
    CHECK(ctx.float32Precision(B::CUDA, O::MATMUL) == P::TF32);
  }
  replay::ReplayOptions plain;
  plain.self_exe = OPGUARD_BIN;
  CHECK(replay::replay_event(tmp / "rec", mm, plain).verdict == replay::Verdict::kReproduces);
}
