// Free-running windows, inputs that share storage, `opguard bisect window`
// and the knob table of docs/REPLAY.md, on window_ops.py: its only
// config-dependent op is a softmax (its bits depend on the CPU capability),
// followed by ops that read it, one in place through a view, and an addmm_
// whose three arguments are one tensor. At the end, --expect under the other
// run's config on the C++ example. No torch headers here, so doctest's CHECK
// is safe.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

#include "../support/process.h"
#include "opguard/core/error.h"
#include "opguard/formats/recording.h"
#include "opguard/replay/replay.h"

using opguard::testing::Result;
using opguard::testing::record_argv;
using opguard::testing::run;
using opguard::testing::TempDir;
namespace formats = opguard::formats;
namespace replay = opguard::replay;

namespace {

const std::string kOpguard = OPGUARD_BIN;
const std::string kWindowOps = OPGUARD_WINDOW_OPS_PY;
const std::string kPython = OPGUARD_PYTHON_BIN;
const std::string kTinyGpt = OPGUARD_TINY_GPT_BIN;

void record(const TempDir& tmp, const std::string& out, const std::vector<std::string>& flags) {
  Result r = run(record_argv(kOpguard, out, flags, {kPython, kWindowOps}), tmp.path().string());
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
}

// The main thread's events in order: id and "op.overload".
struct Events {
  std::vector<std::string> ids, ops;
  std::vector<formats::Event> events;
  // Index of the n-th event whose op is `op` (from `after` on).
  std::size_t find(const std::string& op, std::size_t after = 0) const {
    for (std::size_t i = after; i < ops.size(); ++i)
      if (ops[i] == op) return i;
    FAIL("no event " << op);
    return 0;
  }
};

Events events_of(const std::string& dir) {
  Events e;
  const auto layout = formats::scan_recording(dir);
  for (const auto& [step, path] : layout.ranks.at(0).steps) {
    formats::StepReader reader(path);
    for (const auto& ev : reader.events()) {
      if (ev.stream != 0) continue;
      e.ids.push_back(formats::event_id_string(ev.id));
      e.ops.push_back(ev.op + (ev.overload.empty() ? "" : "." + ev.overload));
      e.events.push_back(ev);
    }
  }
  return e;
}

struct Recordings {
  TempDir tmp;
  std::string full, sparse;
  Recordings() {
    full = tmp / "full";
    record(tmp, full, {"--dump-all"});
    // Only the tensors of softmax, mul and mul_ in full (mul's and mul_'s
    // scalar operands come from outside the window): clone, select and the
    // sum have only fingerprints.
    sparse = tmp / "sparse";
    record(tmp, sparse, {"--dump-ops", "^aten::(softmax|mul|mul_)[.]"});
  }
};

Recordings& recordings() {
  static Recordings r;
  return r;
}

replay::ReplayOptions window_options(const std::string& config, bool free_running) {
  replay::ReplayOptions o;
  o.config = replay::Config::parse(config);
  o.self_exe = kOpguard;
  o.free_running = free_running;
  o.window_keep_going = true;
  return o;
}

// The window from softmax to the row sum of the in-place-modified copy.
struct Chain {
  std::size_t softmax, sum;
};
Chain chain_of(const Events& e) {
  Chain c{e.find("aten::softmax.int"), 0};
  c.sum = e.find("aten::sum.dim_IntList", c.softmax);
  return c;
}

// Same value: tensors by fingerprint (and dtype, sizes), others by text.
bool same_values(const std::vector<formats::Value>& a, const std::vector<formats::Value>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].kind != b[i].kind) return false;
    if (formats::carries_tensor(a[i].kind)) {
      const auto &x = a[i].tensor, &y = b[i].tensor;
      if (x.dtype != y.dtype || x.sizes != y.sizes || x.has_fingerprint() != y.has_fingerprint()) return false;
      if (x.has_fingerprint() && x.fingerprint != y.fingerprint) return false;
    } else if (a[i].text != b[i].text) {
      return false;
    }
  }
  return true;
}

}  // namespace

TEST_CASE("the crafted program has the dataflow the tests rely on: softmax read by mul, clone, an in-place mul_ "
          "on a view of the clone, and a sum of the whole clone") {
  const auto e = events_of(recordings().full);
  const auto c = chain_of(e);
  const auto inplace = e.find("aten::mul_.Tensor", c.softmax);
  CHECK(inplace < c.sum);
  const auto clone = e.find("aten::clone", c.softmax);
  // The sum reads the clone's storage at the version the in-place write left,
  // through a geometry no event of the window produced at that version.
  const auto& sum_in = e.events[c.sum].inputs[0].tensor;
  CHECK(sum_in.storage_id == e.events[clone].outputs[0].tensor.storage_id);
  CHECK(sum_in.version == e.events[inplace].outputs[0].tensor.version);
  CHECK(sum_in.sizes != e.events[inplace].outputs[0].tensor.sizes);
}

TEST_CASE("a free-running window under the recorded config reproduces every event and feeds each later event "
          "the replayed outputs it reads, also through an in-place write on a view") {
  const auto e = events_of(recordings().full);
  const auto c = chain_of(e);
  const auto results = replay::replay_window(recordings().full, e.ids[c.softmax],
                                             static_cast<int64_t>(c.sum - c.softmax + 1), window_options("", true));
  REQUIRE(results.size() == c.sum - c.softmax + 1);
  for (const auto& r : results) {
    INFO(r.event << " " << r.op << ": " << r.message);
    CHECK(r.verdict == replay::Verdict::kReproduces);
  }
  CHECK(results.front().fed_inputs == 0);  // the window's first event has its recorded inputs
  CHECK(results.back().fed_inputs == 1);   // the sum reads the clone after mul_
  for (const auto& r : results)
    if (r.op == "aten::clone" || r.op == "aten::mul_") CHECK(r.fed_inputs >= 1);
}

TEST_CASE("free-running needs full inputs only where the window does not produce them: clone, select and sum, "
          "recorded as fingerprints, get theirs from the replay") {
  const auto e = events_of(recordings().sparse);
  const auto c = chain_of(e);
  const auto clone = e.find("aten::clone", c.softmax);
  for (auto k : {clone, e.find("aten::select.int", c.softmax), c.sum}) {
    INFO(e.ops[k]);
    CHECK((e.events[k].inputs[0].tensor.flags & formats::kTensorHasData) == 0);
  }
  const int64_t n = static_cast<int64_t>(c.sum - c.softmax + 1);
  const auto free = replay::replay_window(recordings().sparse, e.ids[c.softmax], n, window_options("", true));
  REQUIRE(static_cast<int64_t>(free.size()) == n);
  for (const auto& r : free) {
    INFO(r.event << " " << r.op << ": " << r.message);
    CHECK(r.verdict == replay::Verdict::kReproduces);
  }
  CHECK(free[clone - c.softmax].fed_inputs == 1);
  // Teacher-forced, the clone has no recorded inputs.
  const auto forced = replay::replay_window(recordings().sparse, e.ids[c.softmax], n, window_options("", false));
  REQUIRE(forced.size() > clone - c.softmax);
  CHECK(forced[clone - c.softmax].verdict == replay::Verdict::kCannotReplay);
  CHECK(forced[clone - c.softmax].reason == replay::CannotReason::kInputsNotRecorded);
}

TEST_CASE("under cpu_capability=default, teacher-forced only softmax differs; free-running its difference reaches "
          "every later event that reads it") {
  const auto e = events_of(recordings().full);
  const auto c = chain_of(e);
  const int64_t n = static_cast<int64_t>(c.sum - c.softmax + 1);
  const std::string from = e.ids[c.softmax - 1];  // the view before softmax: equal under every capability
  const auto forced = replay::replay_window(recordings().full, from, n + 1,
                                            window_options("cpu_capability=default", false));
  const auto free = replay::replay_window(recordings().full, from, n + 1,
                                          window_options("cpu_capability=default", true));
  REQUIRE(forced.size() == static_cast<std::size_t>(n + 1));
  REQUIRE(free.size() == static_cast<std::size_t>(n + 1));
  CHECK(forced[0].child_process);
  CHECK(forced[0].verdict == replay::Verdict::kReproduces);
  CHECK(free[0].verdict == replay::Verdict::kReproduces);
  CHECK(forced[1].op == "aten::softmax");
  CHECK(forced[1].verdict == replay::Verdict::kDiffers);
  CHECK(free[1].verdict == replay::Verdict::kDiffers);
  for (std::size_t k = 2; k < forced.size(); ++k) {
    INFO(forced[k].event << " " << forced[k].op);
    CHECK(forced[k].verdict == replay::Verdict::kReproduces);
    CHECK(free[k].verdict == replay::Verdict::kDiffers);
  }
  // Without window_keep_going both stop at the first event that differs.
  auto stop = window_options("cpu_capability=default", true);
  stop.window_keep_going = false;
  const auto stopped = replay::replay_window(recordings().full, from, n + 1, stop);
  CHECK(stopped.size() == 2);
  CHECK(stopped.back().op == "aten::softmax");
}

TEST_CASE("inputs that share one storage are rebuilt as views of one storage: addmm_ of a tensor with itself "
          "replays bitwise") {
  const auto e = events_of(recordings().full);
  const auto k = e.find("aten::addmm_");
  const auto& in = e.events[k].inputs;
  REQUIRE(in.size() >= 3);
  // The recording shows self, mat1 and mat2 are one tensor.
  CHECK(in[0].tensor.storage_id != 0);
  CHECK(in[1].tensor.storage_id == in[0].tensor.storage_id);
  CHECK(in[2].tensor.storage_id == in[0].tensor.storage_id);
  replay::ReplayOptions o;
  o.self_exe = kOpguard;
  const auto r = replay::replay_event(recordings().full, e.ids[k], o);
  INFO(r.message);
  CHECK(r.verdict == replay::Verdict::kReproduces);
}

TEST_CASE("opguard bisect window names softmax as the first op of the smallest sub-window that still ends in the "
          "divergence, exit 4 when good and bad agree, 2 for a reversed window") {
  TempDir scratch;
  const auto e = events_of(recordings().full);
  const auto c = chain_of(e);
  const std::string from = e.ids[0], to = e.ids[c.sum];
  Result r = run({kOpguard, "bisect", "window", recordings().full, "--from", from, "--to", to, "--bad",
                  "cpu_capability=default", "--json"}, scratch.path().string());
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["schema"] == "opguard-bisect-window/1");
  CHECK(j["nothing_to_bisect"] == false);
  CHECK(j["start"] == e.ids[c.softmax]);
  CHECK(j["start_op"] == "aten::softmax.int");
  CHECK(j["first_differing"] == e.ids[c.softmax]);
  CHECK(j["sub_window_events"] == static_cast<int64_t>(c.sum - c.softmax + 1));
  CHECK(j["window_events"] == static_cast<int64_t>(c.sum + 1));
  CHECK(j["events"].back()["differs"] == true);
  // Each trial is two window replays; a binary search over the starts.
  CHECK(j["replays"] == 2 * static_cast<int>(j["trials"].size()));
  CHECK(j["trials"].size() <= 8);

  Result same = run({kOpguard, "bisect", "window", recordings().full, "--from", e.ids[c.softmax], "--to", to,
                     "--bad", "threads=2"}, scratch.path().string());
  INFO(same.out << same.err);
  CHECK(same.exit_code == 4);
  CHECK(same.out.find("nothing to bisect") != std::string::npos);

  CHECK(run({kOpguard, "bisect", "window", recordings().full, "--from", to, "--to", from, "--bad", "threads=1"},
            scratch.path().string()).exit_code == 2);
  CHECK(run({kOpguard, "bisect", "window", recordings().full, "--from", from, "--to", "99999", "--bad", "threads=1"},
            scratch.path().string()).exit_code == 2);
}

TEST_CASE("docs/REPLAY.md documents every knob of knob_table in its knob table") {
  const std::string doc = opguard::testing::read_file(OPGUARD_REPLAY_DOC);
  REQUIRE(!doc.empty());
  for (const auto& k : replay::knob_table()) {
    INFO(k.name);
    CHECK(doc.find("| `" + k.name + "` |") != std::string::npos);
  }
}

// Issue 4, must hold: a recording made under one config, replayed under the
// config of another run, reproduces that other run's recorded bits for the
// events that diverged because of that config. The C++ example recorded under
// 2 and under 1 intra-op threads (the demo's pair), step 0 in full; the events
// that diverged because of the config are those whose inputs and arguments
// are bitwise equal in both runs and whose outputs are not (diff's `origin`).
TEST_CASE("the reference's events that diverged because of threads, replayed under the suspect's threads=1, give "
          "the suspect's recorded bits; under the reference's own config they do not") {
  TempDir tmp;
  const std::string ref = tmp / "threads2", sus = tmp / "threads1";
  for (const auto& [dir, threads] : {std::pair<std::string, std::string>{ref, "2"}, {sus, "1"}}) {
    Result r = run({kOpguard, "record", "--out", dir, "--dump-steps", "0", "--", kTinyGpt, "--steps", "1",
                    "--threads", threads}, tmp.path().string());
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
  }
  std::map<uint64_t, formats::Event> a, b;
  for (const auto& ev : events_of(ref).events) a.emplace(ev.id, ev);
  for (const auto& ev : events_of(sus).events) b.emplace(ev.id, ev);
  std::vector<std::string> origins;
  for (const auto& [id, ea] : a) {
    auto it = b.find(id);
    if (it == b.end() || it->second.op != ea.op || it->second.overload != ea.overload) continue;
    if (same_values(ea.inputs, it->second.inputs) && !same_values(ea.outputs, it->second.outputs))
      origins.push_back(formats::event_id_string(id));
  }
  // The demo's diff names 5 origins in step 0 (layer_norm backward, sums).
  REQUIRE(origins.size() >= 1);
  MESSAGE(origins.size() << " events diverged because of the thread count");
  for (const auto& id : origins) {
    INFO("event " << id);
    replay::ReplayOptions o;
    o.self_exe = kOpguard;
    o.expect_dir = sus;
    o.expect_event = id;
    const auto own = replay::replay_event(ref, id, o);
    CHECK(own.verdict == replay::Verdict::kDiffers);
    o.config = replay::Config::parse("threads=1");
    const auto explained = replay::replay_event(ref, id, o);
    INFO(explained.op << ": " << explained.message);
    CHECK(explained.verdict == replay::Verdict::kReproduces);
  }
}

TEST_CASE("an operator this libtorch does not have is a cannot-replay verdict (op-unknown) and exit 65, not a crash") {
  TempDir tmp;
  const std::string dir = tmp / "foreign";
  std::filesystem::create_directories(formats::rank_dir(dir, 0));
  formats::write_manifest(formats::rank_dir(dir, 0) + "/manifest.h5", formats::Manifest{});
  {
    formats::StepWriter w(formats::rank_dir(dir, 0) + "/" + formats::step_file_name(0), 0, 0);
    formats::Event ev;
    ev.op = "aten::no_such_operator";
    ev.schema = "aten::no_such_operator(int x) -> int";
    formats::Value x;
    x.kind = formats::ValueKind::kInt;
    x.name = "x";
    x.text = "1";
    ev.inputs.push_back(x);
    w.add_event(ev);
    w.close();
  }
  replay::ReplayOptions o;
  o.self_exe = kOpguard;
  const auto r = replay::replay_event(dir, "0", o);
  CHECK(r.verdict == replay::Verdict::kCannotReplay);
  CHECK(r.reason == replay::CannotReason::kOpUnknown);
  CHECK(r.message.find("no operator aten::no_such_operator") != std::string::npos);
  Result cli = run({kOpguard, "replay", dir, "--event", "0"}, tmp.path().string());
  INFO(cli.out << cli.err);
  CHECK(cli.exit_code == 65);
  CHECK(cli.out.find("op-unknown") != std::string::npos);
}
