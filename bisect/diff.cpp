// opguard diff: read two recordings step by step, align each (rank, step,
// phase) by signature, classify every aligned pair in the suspect's execution
// order while tracking where each tensor's bits came from (dataflow.h), and
// collect the evidence for the divergence sources. Memory holds one step of
// each run at a time plus the dataflow state.

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <tuple>
#include <unordered_map>

#include "align.h"
#include "dataflow.h"
#include "opguard/bisect/diff.h"
#include "opguard/core/error.h"
#include "opguard/formats/recording.h"
#include "opguard/formats/rerecord.h"
#include "trace.h"

namespace opguard::bisect {

const char* event_class_name(EventClass c) {
  switch (c) {
    case EventClass::kSame: return "same";
    case EventClass::kOrigin: return "origin";
    case EventClass::kOriginArgs: return "origin-args";
    case EventClass::kPropagated: return "propagated";
    case EventClass::kEntered: return "entered";
    case EventClass::kUnmatched: return "unmatched";
  }
  return "unknown";
}

namespace {

using formats::Event;
using formats::StepReader;
using formats::TensorMeta;
using formats::Value;
using formats::ValueKind;

// Manifest keys that differ between any two runs and say nothing about numerics.
const std::set<std::string> kVolatileInfo = {"start_time", "end_time", "pid", "bytes_written", "peak_queued_bytes",
                                             "events", "dropped_tensors", "peak_rss_bytes"};

constexpr int kNumPhases = 4;

std::string fingerprint_text(const TensorMeta& m) {
  switch (bits_state(m)) {
    case BitsState::kHashed: return fmt::format("{:016x}", m.fingerprint);
    case BitsState::kUninitialized: return "<uninitialized>";
    case BitsState::kUnknown: return "<not fingerprinted>";
  }
  return "";
}

std::string value_text(const Value& v) {
  if (formats::carries_tensor(v.kind)) return fingerprint_text(v.tensor);
  if (v.kind == ValueKind::kTensorList) return fmt::format("list of {}", v.list_len);
  if (v.kind == ValueKind::kNone) return "None";
  return v.text;
}

bool tensors_equal(const TensorMeta& a, const TensorMeta& b) {
  if (a.dtype != b.dtype || a.sizes != b.sizes) return false;
  const BitsState sa = bits_state(a), sb = bits_state(b);
  if (sa != sb) return false;
  return sa != BitsState::kHashed || a.fingerprint == b.fingerprint;
}

bool values_equal(const Value& a, const Value& b) {
  if (a.kind != b.kind) return false;
  if (formats::carries_tensor(a.kind)) return tensors_equal(a.tensor, b.tensor);
  if (a.kind == ValueKind::kTensorList) return a.list_len == b.list_len;
  return a.text == b.text;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// An argument the op only writes (out=): its old bits are not read, so they do
// not take part in the comparison of inputs.
bool is_write_only(const Event& e, const Value& v) {
  return v.mutated && (v.name == "out" || e.overload == "out" || ends_with(e.overload, "_out"));
}

// The alignment signature (DESIGN.md, Rule 3): op, overload, scope and the
// structure of every value (kind; dtype and shape of tensors), never their bits
// or non-tensor values, so that a changed argument still aligns.
uint64_t signature(const Event& e, std::string& buf) {
  buf.clear();
  auto add = [&](const void* p, std::size_t n) { buf.append(static_cast<const char*>(p), n); };
  auto add_string = [&](const std::string& s) { add(s.c_str(), s.size() + 1); };
  add_string(e.op);
  add_string(e.overload);
  add_string(e.scope);
  auto add_values = [&](const std::vector<Value>& values) {
    const uint64_t n = values.size();
    add(&n, sizeof(n));
    for (const auto& v : values) {
      const uint8_t kind = static_cast<uint8_t>(v.kind);
      add(&kind, 1);
      if (formats::carries_tensor(v.kind)) {
        const uint8_t dt = static_cast<uint8_t>(v.tensor.dtype);
        add(&dt, 1);
        const uint64_t nd = v.tensor.sizes.size();
        add(&nd, sizeof(nd));
        add(v.tensor.sizes.data(), nd * sizeof(int64_t));
      } else if (v.kind == ValueKind::kTensorList) {
        add(&v.list_len, sizeof(v.list_len));
      }
    }
  };
  add_values(e.inputs);
  add_values(e.outputs);
  return XXH3_64bits(buf.data(), buf.size());
}

// A suspect event of the dataflow table: what a later event names as the
// producer of its bits.
struct FlowEvent {
  uint64_t id = 0;
  std::optional<uint64_t> reference_id;
  int64_t step = 0;
  int32_t op = 0;  // index into Engine::op_names_
  int32_t gap = -1;  // unmatched events: their gap (RankState::gaps)
};

// A gap of the alignment: a maximal run of events only one run has, between
// the same two aligned events (UnmatchedRegion, diff.h).
struct Gap {
  UnmatchedRegion region;
  int64_t step = 0;
  formats::Phase phase = formats::Phase::kOther;
  std::string reference_op, reference_overload, reference_scope;  // its first reference event
  std::string suspect_scope;
  std::optional<uint64_t> reference_id, suspect_id;  // first event of each side
  int64_t t_start_ns = 0, t_end_ns = 0;  // of the suspect's first event
  uint32_t stream = 0;
  // An event of the gap read bits that differed from the reference's and that
  // no event of the gap made: what the gap computed may differ because of its
  // inputs, so it is not a source.
  bool tainted = false;
  bool reported = false;
  void add(const Event& e, bool reference) {
    auto& ids = reference ? region.reference_ids : region.suspect_ids;
    auto& ops = reference ? region.reference_ops : region.suspect_ops;
    auto& count = reference ? region.reference_events : region.suspect_events;
    if (count == 0) {
      if (reference) {
        reference_op = e.op, reference_overload = e.overload, reference_scope = e.scope, reference_id = e.id;
      } else {
        suspect_scope = e.scope, suspect_id = e.id, t_start_ns = e.t_start_ns, t_end_ns = e.t_end_ns;
        stream = e.stream;
      }
    }
    ++count;
    if (ids.size() < UnmatchedRegion::kMaxRegionEvents) {
      ids.push_back(formats::event_id_string(e.id));
      ops.push_back(e.overload.empty() ? e.op : e.op + "." + e.overload);
    }
  }
};

// The comparison of one aligned pair, value by value.
struct PairComparison {
  std::vector<char> input_differs, output_differs;
  bool tensor_input_differs = false;
  bool argument_differs = false;  // a non-tensor argument or a generator state
  bool outputs_differ = false;
};

PairComparison compare_pair(const Event& a, const Event& b) {
  PairComparison c;
  c.input_differs.assign(b.inputs.size(), 0);
  c.output_differs.assign(b.outputs.size(), 0);
  for (std::size_t k = 0; k < b.inputs.size(); ++k) {
    const Value& vb = b.inputs[k];
    if (k >= a.inputs.size()) {
      c.input_differs[k] = 1;
      c.argument_differs = true;
      continue;
    }
    const Value& va = a.inputs[k];
    if (vb.kind == ValueKind::kTensor && is_write_only(b, vb)) continue;
    if (values_equal(va, vb)) continue;
    c.input_differs[k] = 1;
    if (va.kind == ValueKind::kTensor && vb.kind == ValueKind::kTensor) c.tensor_input_differs = true;
    else c.argument_differs = true;
  }
  for (std::size_t k = 0; k < b.outputs.size(); ++k) {
    if (k < a.outputs.size() && values_equal(a.outputs[k], b.outputs[k])) continue;
    c.output_differs[k] = 1;
    c.outputs_differ = true;
  }
  if (a.outputs.size() != b.outputs.size()) c.outputs_differ = true;
  return c;
}


struct Side {
  std::string dir;
  formats::RecordingLayout layout;
  std::map<int, formats::Manifest> manifests;
  const formats::RankFiles* rank(int r) const {
    for (const auto& f : layout.ranks)
      if (f.rank == r) return &f;
    return nullptr;
  }
};

Side open_side(const std::string& dir) {
  Side s;
  s.dir = dir;
  s.layout = formats::scan_recording(dir);
  for (const auto& r : s.layout.ranks) s.manifests[r.rank] = formats::read_manifest(r.manifest_path);
  return s;
}

using formats::shell_quote;

// State of one rank's comparison, carried across its steps.
struct RankState {
  int reference_rank = 0;
  int suspect_rank = 0;
  Dataflow flow;
  std::vector<FlowEvent> events;
  std::vector<DivergentEvent> found;  // divergence sources, execution order, at most max(1, max_origins)
  std::optional<DivergentEvent> first_unmatched;
  // This step's forward events by scope: the last one, and the last one whose
  // bits differed. Backward ops read tensors that a forward op saved for them
  // without returning them (layer_norm's mean and rstd, log_softmax inside
  // cross_entropy): those storages are unseen by the recording, and the
  // forward events of the same scope are where they came from.
  struct ScopeProducers {
    int32_t last = -1;
    int32_t last_divergent = -1;
  };
  std::unordered_map<std::string, ScopeProducers> forward_by_scope;
  std::vector<Gap> gaps;              // every gap of the alignment so far
  std::vector<int32_t> gap_of_suspect;  // this step: the gap of each suspect event, -1 when aligned
};

class Engine {
 public:
  Engine(const Side& reference, const Side& suspect, const DiffOptions& options, DiffReport& report, bool ranks_mode)
      : ref_(reference), sus_(suspect), options_(options), report_(report), ranks_mode_(ranks_mode) {
    if (!options.trace_path.empty()) trace_ = std::make_unique<TraceLog>(options.trace_event_limit);
  }

  void run_rank(int reference_rank, int suspect_rank);
  void finish();

 private:
  void diff_step(RankState& rs, int64_t step, const StepReader* ref, const StepReader* sus, bool in_range);
  void classify(RankState& rs, const StepReader* ref, const StepReader* sus, const Event* a, const Event& b,
                bool in_range, PhaseSummary& summary, const std::vector<Event>& sus_events,
                const std::vector<int32_t>& order, std::size_t position);
  bool replicated(const Event& e) const;
  void mark_unmatched(RankState& rs, const Event& b, int32_t self, int32_t suspect_index) const;
  void report_gap(RankState& rs, const StepReader* ref, const StepReader* sus, const Event& a, const Event& b,
                  int32_t gap, int input);
  void add_found(RankState& rs, DivergentEvent d) const;
  int32_t intern_op(const std::string& op);
  DivergentEvent describe(const RankState& rs, const Event* a, const Event* b, EventClass cls,
                          const PairComparison* cmp, int64_t call_index) const;
  void add_evidence(DivergentEvent& d, const StepReader* ref, const StepReader* sus, const Event& a, const Event& b,
                    bool output, std::size_t position) const;
  std::string rerecord_command(const Side& side, int rank, uint64_t id) const;
  void add_rerecord(const RankState& rs, DivergentEvent& d, uint64_t reference_id, uint64_t suspect_id) const;
  PhaseSummary& summary(int rank, int64_t step, formats::Phase phase);

  const Side& ref_;
  const Side& sus_;
  const DiffOptions& options_;
  DiffReport& report_;
  bool ranks_mode_;
  std::vector<std::string> op_names_;
  std::unordered_map<std::string, int32_t> op_index_;
  std::map<std::tuple<int, int64_t, int>, PhaseSummary> summaries_;
  std::vector<DivergentEvent> found_;
  std::vector<DivergentEvent> unmatched_;
  std::unique_ptr<TraceLog> trace_;
  std::string signature_buffer_;
};

int32_t Engine::intern_op(const std::string& op) {
  auto it = op_index_.find(op);
  if (it != op_index_.end()) return it->second;
  const int32_t i = static_cast<int32_t>(op_names_.size());
  op_names_.push_back(op);
  op_index_.emplace(op, i);
  return i;
}

PhaseSummary& Engine::summary(int rank, int64_t step, formats::Phase phase) {
  auto [it, inserted] = summaries_.try_emplace({rank, step, static_cast<int>(phase)});
  if (inserted) {
    it->second.rank = rank;
    it->second.step = step;
    it->second.phase = formats::phase_name(phase);
  }
  return it->second;
}

// Cross-rank mode compares what data-parallel replicas must agree on: the
// optimizer (it updates replicated parameters from all-reduced gradients) and
// the outputs of collectives.
bool Engine::replicated(const Event& e) const {
  if (!ranks_mode_) return true;
  return e.phase == formats::Phase::kOptimizer || e.op.rfind("c10d::", 0) == 0;
}

// A gap stays a candidate source while every tensor its events read carries
// bits equal to the reference's (made by an event whose outputs were equal in
// both runs) or made inside the gap. Bits of unknown provenance (never
// produced in the recording, changed outside the dispatcher) taint it too: a
// gap is named as a source only on evidence.
void Engine::mark_unmatched(RankState& rs, const Event& b, int32_t self, int32_t suspect_index) const {
  const int32_t gap = rs.gap_of_suspect[suspect_index];
  rs.events[self].gap = gap;
  if (gap < 0) return;
  Gap& g = rs.gaps[gap];
  for (const Value& v : b.inputs) {
    if (g.tainted) break;
    if (v.kind != ValueKind::kTensor || is_write_only(b, v)) continue;
    const Provenance p = rs.flow.provenance(v.tensor);
    g.tainted = !p.known || (p.differs && (p.event < 0 || rs.events[p.event].gap != gap));
  }
}

void Engine::add_found(RankState& rs, DivergentEvent d) const {
  const std::size_t keep = static_cast<std::size_t>(std::max(1, options_.max_origins));
  rs.found.push_back(std::move(d));
  // Gaps are found where their result is read, after later events may have
  // been listed: keep execution order.
  std::stable_sort(rs.found.begin(), rs.found.end(), [](const DivergentEvent& x, const DivergentEvent& y) {
    return std::tie(x.step, x.t_start_ns) < std::tie(y.step, y.t_start_ns);
  });
  if (rs.found.size() > keep) rs.found.pop_back();
}

void Engine::report_gap(RankState& rs, const StepReader* ref, const StepReader* sus, const Event& a, const Event& b,
                        int32_t gap_index, int input) {
  Gap& g = rs.gaps[gap_index];
  if (g.reported) return;
  g.reported = true;
  DivergentEvent d;
  d.cls = EventClass::kOrigin;
  d.rank = rs.suspect_rank;
  d.reference_rank = rs.reference_rank;
  d.step = g.step;
  d.phase = formats::phase_name(g.phase);
  const bool one_reference_op = g.region.reference_events == 1;
  d.op = one_reference_op ? g.reference_op : g.region.suspect_ops.empty() ? b.op : g.region.suspect_ops.front();
  d.overload = one_reference_op ? g.reference_overload : "";
  d.scope = one_reference_op ? g.reference_scope : g.suspect_id ? g.suspect_scope : b.scope;
  if (one_reference_op) d.reference_id = formats::event_id_string(*g.reference_id);
  const uint64_t shown = g.suspect_id.value_or(b.id);
  d.suspect_id = formats::event_id_string(shown);
  d.stream = g.suspect_id ? g.stream : b.stream;
  d.t_start_ns = g.suspect_id ? g.t_start_ns : b.t_start_ns;
  d.t_end_ns = g.suspect_id ? g.t_end_ns : b.t_end_ns;
  d.outputs_differ = true;
  UnmatchedRegion r = g.region;
  r.consumer_id = formats::event_id_string(b.id);
  r.consumer_op = b.overload.empty() ? b.op : b.op + "." + b.overload;
  r.consumer_input = input;
  r.reference_bits = value_text(a.inputs[input]);
  r.suspect_bits = value_text(b.inputs[input]);
  d.region = std::move(r);
  d.show_command = fmt::format("{} show {} --event {}{}", options_.opguard_command, shell_quote(sus_.dir),
                               formats::event_id_string(shown),
                               rs.suspect_rank != 0 ? fmt::format(" --rank {}", rs.suspect_rank) : "");
  // The differing result as its reader saw it in both runs.
  add_evidence(d, ref, sus, a, b, false, static_cast<std::size_t>(input));
  if (!d.evidence_note.empty()) add_rerecord(rs, d, g.reference_id.value_or(a.id), shown);
  add_found(rs, std::move(d));
}

std::string Engine::rerecord_command(const Side& side, int rank, uint64_t id) const {
  auto m = side.manifests.find(rank);
  if (m == side.manifests.end()) return "";
  return formats::rerecord_command(m->second, side.dir, formats::event_id_string(id), options_.dump_radius,
                                   options_.opguard_command);
}

// The commands that re-record the window around the event in each run, for
// evidence where only fingerprints exist.
void Engine::add_rerecord(const RankState& rs, DivergentEvent& d, uint64_t reference_id, uint64_t suspect_id) const {
  const std::string cmd_b = rerecord_command(sus_, rs.suspect_rank, suspect_id);
  const std::string cmd_a = rerecord_command(ref_, rs.reference_rank, reference_id);
  if (cmd_a.empty() && cmd_b.empty())
    d.evidence_note += " (the manifests hold no record command: re-run the programs under opguard record "
                       "--dump-around ID)";
  d.rerecord_command = cmd_a.empty() ? cmd_b : cmd_b.empty() || cmd_a == cmd_b ? cmd_a : cmd_a + "\n" + cmd_b;
}

void Engine::add_evidence(DivergentEvent& d, const StepReader* ref, const StepReader* sus, const Event& a,
                          const Event& b, bool output, std::size_t position) const {
  const auto& va = output ? a.outputs : a.inputs;
  const auto& vb = output ? b.outputs : b.inputs;
  if (position >= va.size() || position >= vb.size() || !formats::carries_tensor(vb[position].kind) ||
      !formats::carries_tensor(va[position].kind))
    return;
  const TensorMeta& ma = va[position].tensor;
  const TensorMeta& mb = vb[position].tensor;
  const bool has_a = (ma.flags & formats::kTensorHasData) && ref != nullptr;
  const bool has_b = (mb.flags & formats::kTensorHasData) && sus != nullptr;
  if (!has_a || !has_b) {
    std::string missing = !has_a && !has_b ? "neither recording holds" : !has_a ? "the reference does not hold"
                                                                                  : "the suspect does not hold";
    if (d.evidence_note.empty())
      d.evidence_note = fmt::format("only fingerprints: {} the full tensors of this event; re-record the window "
                                    "around it with the command below (in both runs) for element-wise metrics",
                                    missing);
    return;
  }
  const auto da = ref->read_tensor(ma);
  const auto db = sus->read_tensor(mb);
  if (da.dtype != db.dtype || da.bytes.size() != db.bytes.size()) return;
  TensorEvidence e;
  e.output = output;
  e.position = static_cast<int>(position);
  e.name = vb[position].name;
  e.dtype = std::string(dtype_name(mb.dtype));
  e.sizes = mb.sizes;
  e.metrics = kernels::compare_contiguous(db.dtype, da.bytes.data(), db.bytes.data(), mb.numel());
  d.evidence.push_back(std::move(e));
}

DivergentEvent Engine::describe(const RankState& rs, const Event* a, const Event* b, EventClass cls,
                                const PairComparison* cmp, int64_t call_index) const {
  const Event& e = b ? *b : *a;
  DivergentEvent d;
  d.cls = cls;
  d.rank = rs.suspect_rank;
  d.reference_rank = rs.reference_rank;
  d.step = e.step;
  d.phase = formats::phase_name(e.phase);
  d.stream = e.stream;
  d.scope = e.scope;
  d.op = e.op;
  d.overload = e.overload;
  d.call_index = call_index;
  if (a) d.reference_id = formats::event_id_string(a->id);
  if (b) d.suspect_id = formats::event_id_string(b->id);
  d.t_start_ns = e.t_start_ns;
  d.t_end_ns = e.t_end_ns;
  const Side& shown = b ? sus_ : ref_;
  d.show_command = fmt::format("{} show {} --event {}{}", options_.opguard_command, shell_quote(shown.dir),
                               formats::event_id_string(e.id),
                               (b ? rs.suspect_rank : rs.reference_rank) != 0
                                   ? fmt::format(" --rank {}", b ? rs.suspect_rank : rs.reference_rank)
                                   : "");
  if (cmp && a && b) {
    d.outputs_differ = cmp->outputs_differ;
    auto add = [&](bool output, const std::vector<Value>& va, const std::vector<Value>& vb,
                   const std::vector<char>& differs) {
      for (std::size_t k = 0; k < vb.size(); ++k) {
        if (!differs[k]) continue;
        DifferingValue v;
        v.output = output;
        v.position = static_cast<int>(k);
        v.name = vb[k].name;
        v.kind = formats::value_kind_name(vb[k].kind);
        v.reference = k < va.size() ? value_text(va[k]) : "<missing>";
        v.suspect = value_text(vb[k]);
        d.differing.push_back(std::move(v));
      }
    };
    add(false, a->inputs, b->inputs, cmp->input_differs);
    add(true, a->outputs, b->outputs, cmp->output_differs);
  }
  return d;
}

void Engine::classify(RankState& rs, const StepReader* ref, const StepReader* sus, const Event* a, const Event& b,
                      bool in_range, PhaseSummary& sum, const std::vector<Event>& sus_events,
                      const std::vector<int32_t>& order, std::size_t position) {
  const int32_t self = static_cast<int32_t>(rs.events.size());
  FlowEvent fe;
  fe.id = b.id;
  if (a) fe.reference_id = a->id;
  fe.step = b.step;
  fe.op = intern_op(b.op);
  rs.events.push_back(fe);

  EventClass cls = EventClass::kUnmatched;
  PairComparison cmp;
  BitsSource source;
  int source_input = -1;
  const bool compared = a != nullptr && replicated(b);
  if (a == nullptr) mark_unmatched(rs, b, self, order[position]);
  // Differing inputs whose bits a clean gap made: that gap is a source.
  std::vector<std::pair<int32_t, int>> gap_sources;  // (gap, input position)
  if (a != nullptr) {
    cmp = compare_pair(*a, b);
    if (!compared) {
      cls = EventClass::kSame;  // not compared (cross-rank mode): counted apart
    } else if (ranks_mode_ && b.op.rfind("c10d::", 0) == 0) {
      // A collective's inputs differ across ranks by design; its outputs must not.
      cls = cmp.outputs_differ ? EventClass::kOrigin : EventClass::kSame;
    } else if (cmp.tensor_input_differs) {
      // Which input's bits have no divergent producer? That one entered.
      bool any_entered = false;
      BitsSource first_propagated;
      int first_propagated_input = -1;
      for (std::size_t k = 0; k < b.inputs.size(); ++k) {
        if (!cmp.input_differs[k] || b.inputs[k].kind != ValueKind::kTensor) continue;
        BitsSource s = rs.flow.explain(b.inputs[k].tensor);
        // A backward op reads what its forward op saved: a tensor, or a view
        // of one, that no event returned. The forward events of its scope made it.
        if ((s.unseen || s.view_unseen) && b.phase == formats::Phase::kBackward) {
          auto it = rs.forward_by_scope.find(b.scope);
          if (it != rs.forward_by_scope.end()) {
            s.kind = it->second.last_divergent >= 0 ? BitsSource::kPropagated : BitsSource::kEnteredOutside;
            s.event = it->second.last_divergent >= 0 ? it->second.last_divergent : it->second.last;
          }
        }
        if (s.kind == BitsSource::kPropagated) {
          const int32_t gap = s.event >= 0 ? rs.events[s.event].gap : -1;
          if (gap >= 0 && !rs.gaps[gap].tainted) gap_sources.emplace_back(gap, static_cast<int>(k));
          if (first_propagated_input < 0) first_propagated = s, first_propagated_input = static_cast<int>(k);
        } else if (!any_entered) {
          any_entered = true;
          source = s;
          source_input = static_cast<int>(k);
        }
      }
      if (any_entered) {
        cls = EventClass::kEntered;
      } else {
        cls = EventClass::kPropagated;
        source = first_propagated;
        source_input = first_propagated_input;
      }
    } else if (cmp.argument_differs) {
      cls = EventClass::kOriginArgs;
    } else {
      cls = cmp.outputs_differ ? EventClass::kOrigin : EventClass::kSame;
    }
  }

  // Dataflow: inputs first (they were read before the op wrote anything), then
  // what the op wrote.
  const bool unmatched = a == nullptr;
  for (std::size_t k = 0; k < b.inputs.size(); ++k) {
    const Value& v = b.inputs[k];
    if (v.kind != ValueKind::kTensor || v.tensor.storage_id == 0) continue;
    rs.flow.observe_input(v.tensor, self, unmatched || (compared && cmp.input_differs[k]));
  }
  for (std::size_t k = 0; k < b.outputs.size(); ++k) {
    const Value& v = b.outputs[k];
    if (v.kind != ValueKind::kTensor || v.tensor.storage_id == 0) continue;
    const bool differs = unmatched || (compared && cmp.output_differs[k]);
    bool aliases_input = false, writes_input = false;
    for (const auto& in : b.inputs) {
      if (in.kind != ValueKind::kTensor || in.tensor.storage_id != v.tensor.storage_id) continue;
      aliases_input = true;
      writes_input = writes_input || in.mutated;
    }
    if (aliases_input && !writes_input) rs.flow.record_alias(v.tensor, self, differs);
    else rs.flow.record_write(v.tensor, self, differs, true);
  }
  // Arguments the op wrote but did not return: their new bits are unknown.
  for (const auto& in : b.inputs) {
    if (in.kind != ValueKind::kTensor || !in.mutated || in.tensor.storage_id == 0) continue;
    bool returned = false;
    for (const auto& out : b.outputs)
      returned = returned || (out.kind == ValueKind::kTensor && out.tensor.storage_id == in.tensor.storage_id);
    if (!returned) rs.flow.record_write(in.tensor, self, unmatched || cls != EventClass::kSame, false);
  }

  if (b.phase == formats::Phase::kForward) {
    auto& producers = rs.forward_by_scope[b.scope];
    producers.last = self;
    if (unmatched || (compared && cls != EventClass::kSame)) producers.last_divergent = self;
  }

  if (trace_) {
    const auto& outs = b.outputs;
    const TensorMeta* first_out = nullptr;
    for (const auto& o : outs)
      if (o.kind == ValueKind::kTensor) {
        first_out = &o.tensor;
        break;
      }
    trace_->add_suspect(rs.suspect_rank, b, a, unmatched ? EventClass::kUnmatched : cls, first_out);
  }

  if (!in_range) return;
  for (const auto& [gap, input] : gap_sources) report_gap(rs, ref, sus, *a, b, gap, input);
  if (options_.list_events)
    report_.events.push_back({rs.suspect_rank, b.step, formats::phase_name(b.phase), b.op,
                              a ? std::optional<std::string>(formats::event_id_string(a->id)) : std::nullopt,
                              formats::event_id_string(b.id), cls, compared || unmatched});
  if (!compared && !unmatched) {
    ++sum.not_compared;
    return;
  }
  ++sum.counts[static_cast<int>(cls)];
  if (unmatched) ++sum.unmatched_suspect;
  if (unmatched) {
    if (!rs.first_unmatched) rs.first_unmatched = describe(rs, nullptr, &b, cls, nullptr, 0);
    return;
  }
  if (!is_divergence_source(cls)) return;
  const std::size_t keep = static_cast<std::size_t>(std::max(1, options_.max_origins));
  if (rs.found.size() >= keep) return;
  int64_t call_index = 0;
  for (std::size_t p = 0; p < position; ++p) {
    const Event& e = sus_events[order[p]];
    call_index += e.phase == b.phase && e.op == b.op && e.scope == b.scope;
  }
  DivergentEvent d = describe(rs, a, &b, cls, &cmp, call_index);
  d.collective_equal_inputs = !ranks_mode_ && cls == EventClass::kOrigin && b.op.rfind("c10d::", 0) == 0;
  if (cls == EventClass::kEntered) {
    const Value& in = b.inputs[source_input];
    d.entered_input = in.name.empty() ? fmt::format("input {}", source_input) : in.name;
    d.entered_side = source.kind == BitsSource::kEnteredReference ? "reference" : "suspect";
    if (source.event >= 0) {
      const FlowEvent& p = rs.events[source.event];
      d.producer_id = formats::event_id_string(p.id);
      if (p.reference_id) d.producer_reference_id = formats::event_id_string(*p.reference_id);
      d.producer_op = op_names_[p.op];
      d.producer_step = p.step;
    }
    add_evidence(d, ref, sus, *a, b, false, static_cast<std::size_t>(source_input));
  } else {
    for (std::size_t k = 0; k < b.outputs.size(); ++k)
      if (cmp.output_differs[k]) add_evidence(d, ref, sus, *a, b, true, k);
  }
  if (d.evidence.empty() && d.evidence_note.empty() && cls == EventClass::kOriginArgs && !cmp.outputs_differ)
    d.evidence_note = "outputs are bitwise equal; only an argument differs";
  if (!d.evidence_note.empty()) add_rerecord(rs, d, a->id, b.id);
  add_found(rs, std::move(d));
}

void Engine::diff_step(RankState& rs, int64_t step, const StepReader* ref, const StepReader* sus, bool in_range) {
  static const std::vector<Event> kNone;
  const auto& re = ref ? ref->events() : kNone;
  const auto& se = sus ? sus->events() : kNone;
  if (in_range) {
    report_.events_reference += static_cast<int64_t>(re.size());
    report_.events_suspect += static_cast<int64_t>(se.size());
  }
  // Per phase, each run's events in (stream, seq) order; alignment per phase.
  auto by_phase = [](const std::vector<Event>& events) {
    std::array<std::vector<int32_t>, kNumPhases> out;
    for (std::size_t i = 0; i < events.size(); ++i) {
      const int p = static_cast<int>(events[i].phase);
      out[p < kNumPhases ? p : kNumPhases - 1].push_back(static_cast<int32_t>(i));
    }
    for (auto& v : out)
      std::sort(v.begin(), v.end(), [&](int32_t x, int32_t y) {
        return std::tie(events[x].stream, events[x].seq) < std::tie(events[y].stream, events[y].seq);
      });
    return out;
  };
  const auto rp = by_phase(re), sp = by_phase(se);
  std::vector<int32_t> partner(se.size(), -1);
  std::vector<char> ref_matched(re.size(), 0);
  rs.gap_of_suspect.assign(se.size(), -1);
  std::vector<uint64_t> sa, sb;
  for (int p = 0; p < kNumPhases; ++p) {
    if (rp[p].empty() && sp[p].empty()) continue;
    summary(rs.suspect_rank, step, static_cast<formats::Phase>(p));
    sa.resize(rp[p].size());
    sb.resize(sp[p].size());
    for (std::size_t i = 0; i < sa.size(); ++i) sa[i] = signature(re[rp[p][i]], signature_buffer_);
    for (std::size_t j = 0; j < sb.size(); ++j) sb[j] = signature(se[sp[p][j]], signature_buffer_);
    int32_t open_gap = -1;
    for (const AlignStep& s : align_sequences(sa.data(), sa.size(), sb.data(), sb.size())) {
      if (s.a >= 0 && s.b >= 0) {
        partner[sp[p][s.b]] = rp[p][s.a];
        ref_matched[rp[p][s.a]] = 1;
        open_gap = -1;
        continue;
      }
      if (open_gap < 0) {
        open_gap = static_cast<int32_t>(rs.gaps.size());
        rs.gaps.emplace_back();
        rs.gaps.back().step = step;
        rs.gaps.back().phase = static_cast<formats::Phase>(p);
      }
      if (s.b >= 0) {
        rs.gap_of_suspect[sp[p][s.b]] = open_gap;
        rs.gaps[open_gap].add(se[sp[p][s.b]], false);
      } else {
        rs.gaps[open_gap].add(re[rp[p][s.a]], true);
      }
    }
  }
  // The suspect's execution order: start time, then stream and position.
  std::vector<int32_t> order(se.size());
  for (std::size_t j = 0; j < order.size(); ++j) order[j] = static_cast<int32_t>(j);
  std::sort(order.begin(), order.end(), [&](int32_t x, int32_t y) {
    return std::tie(se[x].t_start_ns, se[x].stream, se[x].seq) < std::tie(se[y].t_start_ns, se[y].stream, se[y].seq);
  });
  for (std::size_t pos = 0; pos < order.size(); ++pos) {
    const Event& b = se[order[pos]];
    const int32_t i = partner[order[pos]];
    classify(rs, ref, sus, i >= 0 ? &re[i] : nullptr, b, in_range, summary(rs.suspect_rank, step, b.phase), se,
             order, pos);
  }
  for (std::size_t i = 0; i < re.size(); ++i) {
    if (ref_matched[i]) continue;
    if (trace_) trace_->add_reference_only(rs.reference_rank, re[i]);
    if (!in_range) continue;
    if (options_.list_events)
      report_.events.push_back({rs.suspect_rank, step, formats::phase_name(re[i].phase), re[i].op,
                                formats::event_id_string(re[i].id), std::nullopt, EventClass::kUnmatched, true});
    auto& sum = summary(rs.suspect_rank, step, re[i].phase);
    ++sum.counts[static_cast<int>(EventClass::kUnmatched)];
    ++sum.unmatched_reference;
    if (!rs.first_unmatched) rs.first_unmatched = describe(rs, &re[i], nullptr, EventClass::kUnmatched, nullptr, 0);
  }
}

void Engine::run_rank(int reference_rank, int suspect_rank) {
  RankState rs;
  rs.reference_rank = reference_rank;
  rs.suspect_rank = suspect_rank;
  const formats::RankFiles* rf = ref_.rank(reference_rank);
  const formats::RankFiles* sf = sus_.rank(suspect_rank);
  std::map<int64_t, std::pair<std::string, std::string>> steps;
  for (const auto& [s, path] : rf->steps) steps[s].first = path;
  for (const auto& [s, path] : sf->steps) steps[s].second = path;
  auto torn = [&](const formats::RankFiles* f, const char* run) {
    for (const auto& [s, path] : f->torn) {
      report_.torn_steps.push_back({run, f->rank, s, path});
      report_.notes.push_back(fmt::format("{} rank {} step {} is torn (the process died while writing it): not compared",
                                          run, f->rank, s));
    }
  };
  torn(rf, "reference");
  torn(sf, "suspect");
  for (const auto& [step, paths] : steps) {
    if (options_.last_step && step > *options_.last_step) break;
    const bool in_range = !options_.first_step || step >= *options_.first_step;
    rs.forward_by_scope.clear();
    std::unique_ptr<StepReader> ref, sus;
    if (!paths.first.empty()) ref = std::make_unique<StepReader>(paths.first);
    if (!paths.second.empty()) sus = std::make_unique<StepReader>(paths.second);
    if (in_range && (!ref || !sus)) {
      report_.diverged = true;
      report_.notes.push_back(fmt::format("step {} of rank {} is only in the {}", step, suspect_rank,
                                          ref ? "reference" : "suspect"));
    }
    diff_step(rs, step, ref.get(), sus.get(), in_range);
  }
  for (auto& f : rs.found) found_.push_back(std::move(f));
  if (rs.first_unmatched) unmatched_.push_back(std::move(*rs.first_unmatched));
}

void Engine::finish() {
  // Causal order across ranks: an event counts from when its divergence can
  // have arisen. A collective with equal local inputs diverged through some
  // rank's contribution, which was made before the collective ended; ordered
  // by its start it could come before the operator on the other rank that
  // really diverged first, and be named instead of it.
  auto when = [](const DivergentEvent& d) { return d.collective_equal_inputs ? d.t_end_ns : d.t_start_ns; };
  auto earlier = [&](const DivergentEvent& x, const DivergentEvent& y) {
    return std::make_tuple(x.step, when(x), x.rank) < std::make_tuple(y.step, when(y), y.rank);
  };
  for (auto& x : found_) {
    if (!x.collective_equal_inputs) continue;
    for (const auto& y : found_) {
      if (y.rank == x.rank || y.collective_equal_inputs || !earlier(y, x)) continue;
      x.cause_note = fmt::format("its inputs on rank {} are bitwise equal in both runs: the collective carried the "
                                 "divergence of rank {} ({} {}{})",
                                 x.rank, y.rank, y.op, y.suspect_id ? "event " : "", y.suspect_id.value_or(""));
      break;
    }
  }
  std::stable_sort(found_.begin(), found_.end(), earlier);
  if (!found_.empty()) report_.first_divergent = found_.front();
  for (std::size_t i = 0; i < found_.size() && static_cast<int>(i) < options_.max_origins; ++i)
    report_.origins.push_back(found_[i]);
  std::stable_sort(unmatched_.begin(), unmatched_.end(), earlier);
  if (!unmatched_.empty()) report_.first_unmatched = unmatched_.front();
  PhaseSummary& t = report_.totals;
  t.phase = "all";
  for (auto& [key, s] : summaries_) {
    for (int c = 0; c < kNumEventClasses; ++c) t.counts[c] += s.counts[c];
    t.unmatched_reference += s.unmatched_reference;
    t.unmatched_suspect += s.unmatched_suspect;
    t.not_compared += s.not_compared;
    report_.summary.push_back(s);
  }
  for (int c = 0; c < kNumEventClasses; ++c)
    if (c != static_cast<int>(EventClass::kSame) && t.counts[c] > 0) report_.diverged = true;
  if (trace_) {
    trace_->write(options_.trace_path, report_);
    report_.trace_path = options_.trace_path;
    report_.trace_truncated = trace_->truncated();
  }
}

void diff_manifests(const Side& ref, const Side& sus, const std::vector<std::pair<int, int>>& ranks,
                    DiffReport& report) {
  std::map<std::tuple<std::string, std::string, std::optional<std::string>, std::optional<std::string>>,
           std::vector<int>>
      found;
  for (const auto& [ra, rb] : ranks) {
    const formats::Manifest& a = ref.manifests.at(ra);
    const formats::Manifest& b = sus.manifests.at(rb);
    auto compare = [&](const char* section, const std::map<std::string, std::string>& x,
                       const std::map<std::string, std::string>& y, bool skip_volatile) {
      std::set<std::string> keys;
      for (const auto& kv : x) keys.insert(kv.first);
      for (const auto& kv : y) keys.insert(kv.first);
      for (const auto& k : keys) {
        if (skip_volatile && kVolatileInfo.count(k)) continue;
        auto ix = x.find(k), iy = y.find(k);
        std::optional<std::string> vx, vy;
        if (ix != x.end()) vx = ix->second;
        if (iy != y.end()) vy = iy->second;
        if (vx != vy) found[{section, k, vx, vy}].push_back(rb);
      }
    };
    compare("info", a.info, b.info, true);
    compare("env", a.env, b.env, false);
    std::map<std::string, std::string> ma = {{"format_version", std::to_string(a.format_version)},
                                             {"world_size", std::to_string(a.world_size)}};
    std::map<std::string, std::string> mb = {{"format_version", std::to_string(b.format_version)},
                                             {"world_size", std::to_string(b.world_size)}};
    compare("manifest", ma, mb, false);
  }
  for (auto& [key, rs] : found) {
    ManifestDifference d;
    std::tie(d.section, d.key, d.reference, d.suspect) = key;
    d.ranks = rs;
    report.manifest_differences.push_back(std::move(d));
  }
  // Numerics knobs first: they are usually the first hint.
  auto rank_of = [](const ManifestDifference& d) {
    if (d.section == "env") return 0;
    if (d.section == "manifest") return 1;
    static const std::set<std::string> kContext = {"argv", "record_command", "cwd", "hostname", "sampling_policy",
                                                   "program", "queue", "strict"};
    return kContext.count(d.key) ? 3 : 2;
  };
  std::stable_sort(report.manifest_differences.begin(), report.manifest_differences.end(),
                   [&](const ManifestDifference& x, const ManifestDifference& y) { return rank_of(x) < rank_of(y); });
}

}  // namespace

DiffReport diff_recordings(const std::string& reference, const std::string& suspect, const DiffOptions& options) {
  if (options.max_origins < 0) throw UsageError("--max-origins must be 0 or more");
  const Side ref = open_side(reference);
  const Side sus = open_side(suspect);
  DiffReport report;
  report.reference_dir = reference;
  report.suspect_dir = suspect;
  std::vector<std::pair<int, int>> ranks;
  std::set<int> all;
  for (const auto& r : ref.layout.ranks) all.insert(r.rank);
  for (const auto& r : sus.layout.ranks) all.insert(r.rank);
  if (options.rank && !all.count(*options.rank))
    throw UsageError(fmt::format("neither {} nor {} has rank {}", reference, suspect, *options.rank));
  for (int r : all) {
    if (options.rank && r != *options.rank) continue;
    if (!ref.rank(r) || !sus.rank(r)) {
      report.diverged = true;
      report.notes.push_back(
          fmt::format("rank {} is only in the {}: not compared", r, ref.rank(r) ? "reference" : "suspect"));
      continue;
    }
    ranks.push_back({r, r});
    report.ranks.push_back(r);
  }
  diff_manifests(ref, sus, ranks, report);
  Engine engine(ref, sus, options, report, false);
  for (const auto& [ra, rb] : ranks) engine.run_rank(ra, rb);
  engine.finish();
  return report;
}

DiffReport diff_ranks(const std::string& run, int rank_a, int rank_b, const DiffOptions& options) {
  if (options.max_origins < 0) throw UsageError("--max-origins must be 0 or more");
  if (rank_a == rank_b) throw UsageError("--ranks needs two different ranks, such as 0,1");
  const Side side = open_side(run);
  for (int r : {rank_a, rank_b})
    if (!side.rank(r)) throw UsageError(fmt::format("{} has no rank {}", run, r));
  DiffReport report;
  report.mode = "ranks";
  report.reference_dir = run;
  report.suspect_dir = run;
  report.ranks = {rank_a, rank_b};
  diff_manifests(side, side, {{rank_a, rank_b}}, report);
  // Rank and world size differ by construction; the rest should not.
  auto& md = report.manifest_differences;
  md.erase(std::remove_if(md.begin(), md.end(),
                          [](const ManifestDifference& d) {
                            return d.key == "RANK" || d.key == "LOCAL_RANK" || d.key == "rank" || d.key == "pid";
                          }),
           md.end());
  Engine engine(side, side, options, report, true);
  engine.run_rank(rank_a, rank_b);
  engine.finish();
  return report;
}

}  // namespace opguard::bisect
