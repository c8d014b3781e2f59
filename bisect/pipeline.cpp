// bisect run: two recordings in, a minimal repro bundle out. diff names the
// first divergent operator; where the reference holds only its fingerprints,
// both programs are re-recorded around it with full tensors (the command the
// manifest holds; runs under a fixed config are deterministic, so the event
// keeps its id); the reference's event is replayed under both runs' recorded
// configs, bisect config names the knobs, shrink cuts the inputs, and
// write_bundle writes what a kernel team runs.

#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "opguard/bisect/bisect.h"
#include "opguard/bisect/diff.h"
#include "opguard/bisect/repro.h"
#include "opguard/core/error.h"
#include "opguard/formats/recording.h"
#include "opguard/formats/rerecord.h"
#include "opguard/formats/tensor_view.h"
#include "trials.h"

namespace opguard::bisect {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

bool has_full_inputs(const formats::Event& ev) {
  for (const auto& v : ev.inputs) {
    if (!formats::carries_tensor(v.kind)) continue;
    const auto& m = v.tensor;
    if (m.flags & formats::kTensorUninitialized) continue;
    if (m.numel() == 0) continue;
    if ((m.flags & formats::kTensorHasData) == 0) return false;
  }
  return true;
}

formats::Manifest manifest_of(const std::string& dir, int rank) {
  for (const auto& r : formats::scan_recording(dir).ranks)
    if (r.rank == rank) return formats::read_manifest(r.manifest_path);
  throw UsageError(fmt::format("{} has no rank {}: opguard ls lists its ranks", dir, rank));
}

// The re-recording must have computed what the recording holds: event
// `event`'s fingerprints equal in both. A program that read something of its
// own that the manifest does not hold (an environment variable, an input
// file, the time) runs otherwise the second time, and bisecting the
// re-recording's tensors would explain another run.
void require_same_bits(const std::string& recording, const std::string& rerecorded, int rank, const std::string& event,
                       int radius) {
  const auto was = detail::load_event(recording, rank, event);
  const auto now = detail::load_event(rerecorded, rank, event);
  auto compare = [&](const std::vector<formats::Value>& a, const std::vector<formats::Value>& b, const char* side) {
    for (std::size_t k = 0; k < a.size() && k < b.size(); ++k) {
      if (!formats::carries_tensor(a[k].kind) || !formats::carries_tensor(b[k].kind)) continue;
      const auto& ma = a[k].tensor;
      const auto& mb = b[k].tensor;
      if (formats::bits_state(ma) != formats::BitsState::kHashed ||
          formats::bits_state(mb) != formats::BitsState::kHashed || ma.fingerprint == mb.fingerprint)
        continue;
      throw FormatError(fmt::format(
          "the re-recording {} did not compute what {} holds: {} {} of event {} ({}) has fingerprint {:016x} there "
          "and {:016x} here, so the program ran otherwise (an environment variable, input file or seed of its own "
          "that the manifest does not hold); re-record it yourself with --dump-around {}:{} and run bisect on that",
          rerecorded, recording, side, a[k].name.empty() ? std::to_string(k) : a[k].name, event, was.op,
          ma.fingerprint, mb.fingerprint, event, radius));
    }
  };
  compare(was.inputs, now.inputs, "input");
  compare(was.outputs, now.outputs, "output");
}

// Runs the manifest's record command with --dump-around into
// `work/<name>-around-ID`; returns that directory. Its output goes to a log
// beside it, named in the error when it fails.
std::string rerecord(const std::string& recording, int rank, const std::string& event, const fs::path& work,
                     const std::string& name, const RunOptions& o) {
  const auto m = manifest_of(recording, rank);
  const std::string base = (work / name).string();
  const std::string cmd = formats::rerecord_command(m, base, event, o.dump_radius, formats::shell_quote(o.self_exe),
                                                   formats::numerics_env_here());
  if (cmd.empty())
    throw FormatError(fmt::format("{} holds only fingerprints for event {} and its manifest has no record command: "
                                  "re-record the program with --dump-around {} and run bisect on those recordings",
                                  recording, event, event));
  const std::string out = base + "-around-" + event;
  const std::string log = out + ".log";
  std::error_code ignored;
  fs::remove_all(out, ignored);
  const int rc = std::system(("(" + cmd + ") >" + formats::shell_quote(log) + " 2>&1").c_str());
  if (rc != 0 || !fs::exists(out))
    throw FormatError(fmt::format("re-recording {} around event {} failed (exit status {}): see {}", recording, event,
                                  rc, log));
  return out;
}

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

RunResult bisect_run(const RunOptions& o) {
  const auto t_all = Clock::now();
  RunResult result;
  auto say = [&](const std::string& line) {
    if (o.progress) o.progress(line);
  };
  auto stage = [&](const char* name, Clock::time_point t0) { result.stages.push_back(StageTime{name, since(t0)}); };
  auto finish = [&]() -> RunResult& {
    result.seconds = since(t_all);
    return result;
  };
  if (o.out_dir.empty()) throw UsageError("bisect run needs an output directory (-o DIR)");
  const fs::path out = fs::absolute(o.out_dir);
  if (fs::exists(out) && !fs::is_directory(out))
    throw IoError(fmt::format("{} exists and is not a directory: name a new one with -o", out.string()));
  // Its work/ and bundle/ are written afresh: never over what is there (the
  // recordings being compared, a previous run's bundle).
  if (fs::exists(out) && !fs::is_empty(out))
    throw IoError(fmt::format("{} is not empty: name a new or empty directory with -o", out.string()));
  const fs::path work = out / "work";
  const bool created_out = !fs::exists(out);
  std::error_code ec;
  fs::create_directories(work, ec);  // now: an unwritable -o fails before the stages run
  if (ec) throw IoError(fmt::format("cannot create {}: {}", work.string(), ec.message()));

  // 1. diff
  auto t0 = Clock::now();
  say(fmt::format("diff {} {}", o.reference, o.suspect));
  DiffOptions dopt;
  dopt.rank = o.rank;
  dopt.max_origins = 1;
  dopt.opguard_command = o.self_exe;
  DiffReport report;
  try {
    report = diff_recordings(o.reference, o.suspect, dopt);
  } catch (...) {
    // A recording it cannot read: leave no empty directories behind.
    fs::remove(work, ec);
    if (created_out) fs::remove(out, ec);
    throw;
  }
  stage("diff", t0);
  if (!report.first_divergent) {
    // Diverged without a source: events only one run has, or a missing step
    // or rank. No operator to bisect (exit 4), and nothing wrong with the
    // recordings.
    result.status = report.diverged ? RunResult::Status::kNothingToBisect : RunResult::Status::kNoDivergence;
    result.message = report.diverged
                         ? "the runs diverge, but no operator produced different bits from equal inputs (events "
                           "only one run has, or a missing step): opguard diff shows them"
                         : "the runs do not diverge: nothing to bisect";
    return finish();
  }
  const DivergentEvent& fd = *report.first_divergent;
  result.op = fd.op;
  result.scope = fd.scope;
  result.phase = fd.phase;
  result.step = fd.step;
  if (fd.region && !fd.reference_id) {
    result.status = RunResult::Status::kNotReplayable;
    result.message = fmt::format("the first divergence is a region where the reference ran {} ops and the suspect {} "
                                 "others: bisect run replays a region of one reference op; try opguard bisect window "
                                 "on the reference's events",
                                 fd.region->reference_events, fd.region->suspect_events);
    return finish();
  }
  if (fd.cls == EventClass::kEntered || !fd.reference_id || !fd.suspect_id) {
    result.status = RunResult::Status::kNotReplayable;
    result.message = fmt::format("the first divergence entered {} without an operator producing it (data from "
                                 "outside the recording): there is no op to replay; opguard diff shows where",
                                 fd.op);
    return finish();
  }
  if (fd.cls == EventClass::kOriginArgs) {
    // The programs passed the op other values (a learning rate, a seed): no
    // config of the op's makes its bits from the reference's arguments.
    std::string args;
    bool generators_only = true;
    for (const auto& v : fd.differing) {
      if (v.output) continue;
      args += (args.empty() ? "" : ", ") + (v.name.empty() ? "input " + std::to_string(v.position) : v.name);
      generators_only = generators_only && v.kind == "generator";
    }
    result.status = RunResult::Status::kNothingToBisect;
    result.message = fmt::format(
        "the first divergent operator {} (event {}) was called with other arguments ({}): {}; no config of the op "
        "makes the suspect's bits from the reference's arguments, so there is nothing to replay; opguard diff shows "
        "the values",
        fd.op, *fd.suspect_id, args,
        generators_only && !args.empty()
            ? "its random generator was in another state (another seed, or draws the recording does not show)"
            : "the programs passed other values (a learning rate, a seed)");
    return finish();
  }
  if (fd.saved_reader) {
    result.status = RunResult::Status::kNotReplayable;
    result.message = fmt::format(
        "the first divergent operator {} (event {}) returned equal bits; a tensor it saved for the backward pass "
        "differs ({} of {}, event {}), and replay compares returned outputs only: bisect it with a program that "
        "runs its backward under each config",
        fd.op, *fd.suspect_id, fd.saved_input, fd.saved_reader_op, *fd.saved_reader);
    return finish();
  }
  result.event = *fd.reference_id;
  say(fmt::format("first divergent operator: {} (event {}, step {}, {}{})", fd.op, result.event, fd.step, fd.phase,
                  fd.scope.empty() ? "" : ", scope " + fd.scope));

  // 2. full tensors, re-recorded if needed
  t0 = Clock::now();
  std::string ref = o.reference, sus = o.suspect;
  std::string sus_event = *fd.suspect_id;
  if (!has_full_inputs(detail::load_event(ref, o.rank, result.event))) {
    say(fmt::format("re-recording {} around event {} with full tensors (--dump-around {}:{})",
                    fd.region ? "the reference" : "both runs", result.event,
                    result.event, o.dump_radius));
    ref = rerecord(o.reference, o.rank, result.event, work, "reference", o);
    // A region's suspect bits are the fingerprint its reader saw: only the
    // reference's op is replayed.
    if (!fd.region) sus = rerecord(o.suspect, o.rank, sus_event, work, "suspect", o);
    const auto ev = detail::load_event(ref, o.rank, result.event);
    if (ev.op != fd.op || !has_full_inputs(ev))
      throw FormatError(fmt::format("the re-recording {} has {} at event {}, without full inputs, where the diff saw "
                                    "{}: the program is not deterministic under its config", ref, ev.op,
                                    result.event, fd.op));
    require_same_bits(o.reference, ref, o.rank, result.event, o.dump_radius);
    if (!fd.region) require_same_bits(o.suspect, sus, o.rank, sus_event, o.dump_radius);
    stage("re-record", t0);
    result.rerecorded = true;
  }
  result.recording = ref;

  // 3. replay under both recorded configs
  t0 = Clock::now();
  // Declared knobs (a parallel decomposition the program applies itself)
  // take part like recorded ones.
  replay::Config good = replay::recorded_config(ref, o.rank).overlaid(replay::declared_config(ref, o.rank));
  replay::Config bad = replay::recorded_config(sus, o.rank).overlaid(replay::declared_config(sus, o.rank));
  if (!fd.region) {
    // The in-process knobs each run's divergent op ran under, where its
    // recording has them per op, replace the run's (the manifest's values at
    // the start and a clean end). The attention backends are recorded per op
    // only: a trial that leaves them unset runs the replayed op with the
    // reference's; where the runs had other ones, both configs name theirs.
    const auto ev_good = detail::load_event(ref, o.rank, result.event);
    const auto ev_bad = detail::load_event(sus, o.rank, sus_event);
    good = replay::with_event_knobs(good, ev_good);
    bad = replay::with_event_knobs(bad, ev_bad);
    const auto sdp_good = formats::sdp_backends_of(ev_good.flags);
    const auto sdp_bad = formats::sdp_backends_of(ev_bad.flags);
    if (sdp_good != sdp_bad) {
      good.set("sdpa_backend", formats::sdp_text(sdp_good));
      bad.set("sdpa_backend", formats::sdp_text(sdp_bad));
    }
  }
  say(fmt::format("replaying event {} under the reference's config ({}) and the suspect's ({})", result.event,
                  good.to_string(), bad.to_string()));
  TrialTarget target{ref, result.event, o.rank, o.self_exe, {}};
  {
    replay::ReplayOptions ro;
    ro.rank = o.rank;
    ro.from_recorded = false;
    ro.self_exe = o.self_exe;
    ro.config = bad;
    if (!fd.region) {
      ro.expect_dir = sus;
      ro.expect_event = sus_event;
      ro.expect_rank = o.rank;
    }
    auto r = replay::replay_event(ref, result.event, ro);
    if (fd.region && r.verdict != replay::Verdict::kCannotReplay) {
      // Does the op under the suspect's config give what the suspect's region
      // gave, as its reader saw it?
      bool found = false;
      for (const auto& out : r.outputs) found = found || fmt::format("{:016x}", out.replayed_fingerprint) == fd.region->suspect_bits;
      r.verdict = found ? replay::Verdict::kReproduces : replay::Verdict::kDiffers;
      r.message = fmt::format("no output has the bits {} that {} (event {}) read in the suspect",
                              fd.region->suspect_bits, fd.region->consumer_op, fd.region->consumer_id);
    }
    result.suspect_bits_explained = r.verdict == replay::Verdict::kReproduces;
    if (r.verdict == replay::Verdict::kDiffers)
      result.bundle_note = fmt::format("note: replayed under the suspect's recorded config, event {} does not give "
                                       "the suspect's recorded bits ({}): something outside the recorded knobs "
                                       "differs too", result.event, r.message);
  }
  stage("replay", t0);

  // 4. bisect config
  t0 = Clock::now();
  say(fmt::format("bisect config: ddmin over {} differing knob(s)", config_differences(good, bad).size()));
  result.config = bisect_config(ConfigSearchOptions{target, good, bad});
  stage("bisect config", t0);
  if (result.config->nothing_to_bisect) {
    result.status = RunResult::Status::kNothingToBisect;
    result.message = result.config->message;
    // A region under the same knobs: the programs compute it in other ops.
    if (fd.region && config_differences(good, bad).empty())
      result.message = fmt::format("the suspect ran {} other ops where the reference ran {} ({}), under the same "
                                   "knobs: the programs differ there, not a knob; nothing to bisect (opguard diff "
                                   "shows both sides)",
                                   fd.region->suspect_events, fd.op, fd.scope.empty() ? "top level" : fd.scope);
    return finish();
  }
  std::string knobs;
  for (const auto& k : result.config->minimal) knobs += (knobs.empty() ? "" : ", ") + k.text();
  say(fmt::format("knob set: {} ({} trials)", knobs, result.config->trial_count));

  // 5. shrink, between good and good with only the knobs found
  t0 = Clock::now();
  const replay::Config minimal_bad = apply_changes(good, result.config->minimal);
  say("shrinking the inputs while the two configs still differ");
  ShrinkOptions sopt;
  sopt.target = target;
  sopt.good = good;
  sopt.bad = minimal_bad;
  sopt.max_trials = o.shrink_max_trials;
  result.shrink = shrink_inputs(sopt);
  stage("shrink", t0);
  say(fmt::format("inputs {} -> {} bytes ({} trials)", result.shrink->original_bytes, result.shrink->final_bytes,
                  result.shrink->trials));
  result.status = RunResult::Status::kFound;
  result.message = fmt::format("{}{} (event {}, step {}, {}){} gives other bits when {}", fd.op,
                               fd.scope.empty() ? "" : " in " + fd.scope, result.event, fd.step, fd.phase,
                               fd.region ? fmt::format(", which the suspect ran as {} other ops,",
                                                       fd.region->suspect_events)
                                         : "",
                               knobs);

  // 6. bundle
  if (o.write_bundle) {
    t0 = Clock::now();
    const std::string bundle = (out / "bundle").string();
    say("writing the repro bundle to " + bundle);
    fs::remove_all(bundle, ec);
    BundleSpec spec;
    spec.recording_dir = ref;
    spec.rank = o.rank;
    spec.event = result.event;
    spec.good = good;
    spec.bad = minimal_bad;
    spec.whole_configs = true;  // as the trials above ran them
    for (const auto& k : result.config->minimal) spec.knobs_found.push_back(k.knob);
    spec.slices = result.shrink->slices;
    spec.finding = result.message + ".";
    spec.self_exe = o.self_exe;
    BundleResult b;
    try {
      b = write_bundle(spec, bundle);
    } catch (const FormatError& e) {
      // The finding stands without a bundle; say why there is none.
      b.reproduced = false;
      b.message = e.what();
    }
    if (b.reproduced) {
      result.bundle_dir = bundle;
      if (!o.python.empty()) {
        say("checking the bundle: repro.py");
        CheckOptions copt;
        copt.python = o.python;
        const CheckResult c = check_bundle(bundle, copt);
        result.bundle_note += std::string(result.bundle_note.empty() ? "" : "; ") +
                              (c.reproduced ? "repro.py reproduces the divergence"
                                            : "repro.py did NOT reproduce the divergence: " + c.message);
      }
    } else {
      result.bundle_note += std::string(result.bundle_note.empty() ? "" : "; ") + "no bundle: " + b.message;
    }
    stage("bundle", t0);
  }
  return finish();
}

}  // namespace opguard::bisect
