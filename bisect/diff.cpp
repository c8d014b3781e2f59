// opguard diff: read two recordings step by step, align each (rank, step,
// phase) by signature, classify every aligned pair in the suspect's execution
// order while tracking where each tensor's bits came from (dataflow.h), and
// collect the evidence for the divergence sources. Memory holds two steps of
// each run at a time (the one compared, the next one being read) plus the
// dataflow state.

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <set>
#include <string_view>
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
                                             "events", "dropped_tensors", "peak_rss_bytes", "written_while_deferred",
                                             "ops_on_kernel_workers"};

// Compared only where both runs have them: a run without intra-op workers (1
// thread) has no workers' denormal state to record.
const std::set<std::string> kInfoOfBoth = {"flush_denormal_workers_at_end"};

constexpr int kNumPhases = 4;

std::string fingerprint_text(const TensorMeta& m) {
  switch (bits_state(m)) {
    case BitsState::kHashed: return fmt::format("{:016x}", m.fingerprint);
    case BitsState::kUninitialized: return "<uninitialized>";
    case BitsState::kUnknown: return "<not fingerprinted>";
  }
  return "";
}

// How the two events' calls differ in the state that chooses an op's kernel
// beside its arguments' bits (recorded in the event and tensor flags; replay
// sets it again): "" where they agree or a recording predates the flag.
std::string state_difference(const Event& a, const Event& b) {
  std::vector<std::string> parts;
  const std::string ac_a = formats::autocast_text(formats::autocast_of(a.flags));
  const std::string ac_b = formats::autocast_text(formats::autocast_of(b.flags));
  if (ac_a != ac_b) parts.push_back(fmt::format("autocast {} | {}", ac_a.empty() ? "off" : ac_a, ac_b.empty() ? "off" : ac_b));
  const auto dd_a = formats::default_dtype_of(a.flags), dd_b = formats::default_dtype_of(b.flags);
  if (dd_a && dd_b && *dd_a != *dd_b)
    parts.push_back(fmt::format("default dtype {} | {}", dtype_name(*dd_a), dtype_name(*dd_b)));
  // Recordings before the attention backends were recorded hold 0 (all on):
  // only a recording that has them can differ.
  const auto sdp_a = formats::sdp_backends_of(a.flags), sdp_b = formats::sdp_backends_of(b.flags);
  if (sdp_a != sdp_b)
    parts.push_back(fmt::format("attention backends {} | {}", formats::sdp_text(sdp_a), formats::sdp_text(sdp_b)));
  if (a.knobs && b.knobs && *a.knobs != *b.knobs) {
    const auto ka = formats::knobs_of(*a.knobs), kb = formats::knobs_of(*b.knobs);
    auto on_off = [](bool v) { return v ? "on" : "off"; };
    if (ka.threads != kb.threads) parts.push_back(fmt::format("threads {} | {}", ka.threads, kb.threads));
    if (ka.mkldnn != kb.mkldnn) parts.push_back(fmt::format("oneDNN {} | {}", on_off(ka.mkldnn), on_off(kb.mkldnn)));
    if (ka.deterministic != kb.deterministic)
      parts.push_back(fmt::format("deterministic algorithms {} | {}", on_off(ka.deterministic), on_off(kb.deterministic)));
    if (ka.matmul_precision != kb.matmul_precision)
      parts.push_back(fmt::format("float32 matmul precision {} | {}", ka.matmul_precision, kb.matmul_precision));
    if (ka.flush_denormal != kb.flush_denormal)
      parts.push_back(fmt::format("denormals flushed {} | {}", on_off(ka.flush_denormal), on_off(kb.flush_denormal)));
    if (ka.gpu && kb.gpu) {
      const auto &ga = *ka.gpu, &gb = *kb.gpu;
      auto flag = [&](const char* what, bool x, bool y) {
        if (x != y) parts.push_back(fmt::format("{} {} | {}", what, on_off(x), on_off(y)));
      };
      flag("TF32 cuBLAS matmul", ga.tf32_cublas, gb.tf32_cublas);
      flag("TF32 cuDNN convolution", ga.tf32_cudnn, gb.tf32_cudnn);
      flag("cuDNN benchmark", ga.cudnn_benchmark, gb.cudnn_benchmark);
      flag("cuDNN deterministic", ga.cudnn_deterministic, gb.cudnn_deterministic);
      const auto ra = formats::reduction_text(ga.fp16_reduction, ga.bf16_reduction);
      const auto rb = formats::reduction_text(gb.fp16_reduction, gb.bf16_reduction);
      if (ra != rb) parts.push_back(fmt::format("reduced-precision GEMM reduction {} | {}", ra, rb));
    }
  }
  // Grad mode and requires_grad only where both recordings have the flags
  // (recorded together with the default dtype).
  const bool grad_recorded = (a.flags & b.flags & formats::kEventDefaultDtype) != 0;
  auto on = [](uint32_t f) { return (f & formats::kEventGradMode) ? "on" : "off"; };
  if (grad_recorded && ((a.flags ^ b.flags) & formats::kEventGradMode))
    parts.push_back(fmt::format("grad mode {} | {}", on(a.flags), on(b.flags)));
  auto grad = [](uint8_t f) {
    if (!(f & formats::kTensorRequiresGrad)) return "does not require grad";
    return (f & formats::kTensorNonLeaf) ? "requires grad (computed)" : "requires grad (a leaf)";
  };
  constexpr uint8_t kGradFlags = formats::kTensorRequiresGrad | formats::kTensorNonLeaf;
  for (std::size_t i = 0; grad_recorded && i < a.inputs.size() && i < b.inputs.size(); ++i) {
    const Value& va = a.inputs[i];
    const Value& vb = b.inputs[i];
    if (va.kind != ValueKind::kTensor || vb.kind != ValueKind::kTensor) continue;
    if (((va.tensor.flags ^ vb.tensor.flags) & kGradFlags) == 0) continue;
    parts.push_back(fmt::format("{} {} | {}", va.name.empty() ? fmt::format("input {}", i) : va.name,
                                grad(va.tensor.flags), grad(vb.tensor.flags)));
  }
  if (parts.empty()) return "";
  std::string text = "the runs called it in other states: ";
  for (std::size_t i = 0; i < parts.size(); ++i) text += (i ? "; " : "") + parts[i];
  return text + " (kernels choose their path by these; replay sets each run's: docs/REPLAY.md)";
}

std::string value_text(const Value& v) {
  if (formats::carries_tensor(v.kind)) return fingerprint_text(v.tensor);
  if (v.kind == ValueKind::kTensorList) return fmt::format("list of {}", v.list_len);
  if (v.kind == ValueKind::kNone) return "None";
  return v.text;
}

bool ends_with(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The diff's own string pool: every string of every step file it reads gets an
// id, equal for equal strings across files, so that comparing ops, scopes and
// non-tensor values is comparing integers. Strings are kept for the report.
class StringPool {
 public:
  int32_t intern(std::string_view s) {
    auto it = index_.find(s);
    if (it != index_.end()) return it->second;
    OPGUARD_CHECK(strings_.size() < INT32_MAX);
    const auto id = static_cast<int32_t>(strings_.size());
    strings_.emplace_back(s);  // a deque: earlier strings, and the views into them, stay put
    index_.emplace(strings_.back(), id);
    return id;
  }
  const std::string& operator[](int32_t id) const { return strings_[static_cast<std::size_t>(id)]; }

 private:
  std::deque<std::string> strings_;
  std::unordered_map<std::string_view, int32_t> index_;
};

// One step file of one run as the diff reads it: the reader's validated columns
// (no Event objects on the hot path), each of the file's strings as a pool id,
// and the view geometry of each tensor value (computed by load_step).
struct StepEvents {
  const StepReader* reader = nullptr;
  const formats::StepColumns* c = nullptr;
  const uint64_t* geometry = nullptr;  // by value row
  std::vector<int32_t> ids;            // string table row -> StringPool id

  StepEvents(const StepReader* r, const std::vector<uint64_t>& geometry_by_row, StringPool& pool)
      : reader(r), c(r ? &r->columns() : nullptr), geometry(geometry_by_row.data()) {
    if (!c) return;
    ids.resize(c->string_count());
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = pool.intern(c->string(static_cast<uint32_t>(i)));
  }
  std::size_t size() const { return c ? c->events.size() : 0; }
  formats::Phase phase(std::size_t i) const { return static_cast<formats::Phase>(c->events.phase[i]); }
  int32_t op(std::size_t i) const { return ids[c->events.op[i]]; }
  int32_t overload(std::size_t i) const { return ids[c->events.overload[i]]; }
  int32_t scope(std::size_t i) const { return ids[c->events.scope[i]]; }
  // Value rows of event i: inputs [first_input, first_output), outputs [first_output, end).
  std::size_t first_input(std::size_t i) const { return c->events.value_begin[i]; }
  std::size_t first_output(std::size_t i) const { return first_input(i) + c->events.n_inputs[i]; }
  std::size_t end(std::size_t i) const { return first_output(i) + c->events.n_outputs[i]; }
  ValueKind kind(std::size_t r) const { return static_cast<ValueKind>(c->values.kind[r]); }
  const int64_t* sizes(std::size_t r) const { return c->dims.data() + c->values.dims_offset[r]; }
  TensorBits bits(std::size_t r) const {
    const auto& v = c->values;
    return {v.storage_id[r], geometry[r], v.version[r], formats::bits_state(v.flags[r]), v.fingerprint[r]};
  }
};

// Row ra of A and row rb of B: equal kind, and equal bits (tensors: dtype,
// shape, bits state and fingerprint), list length or value text.
// `unknown_equal`: a tensor that either run did not fingerprint compares by
// dtype and shape only (an output: no evidence of other bits).
bool values_equal(const StepEvents& A, std::size_t ra, const StepEvents& B, std::size_t rb,
                  bool unknown_equal = false) {
  const auto& va = A.c->values;
  const auto& vb = B.c->values;
  if (va.kind[ra] != vb.kind[rb]) return false;
  const ValueKind kind = A.kind(ra);
  if (formats::carries_tensor(kind)) {
    if (va.dtype[ra] != vb.dtype[rb] || va.ndim[ra] != vb.ndim[rb]) return false;
    const int64_t *sa = A.sizes(ra), *sb = B.sizes(rb);
    for (uint8_t d = 0; d < va.ndim[ra]; ++d)  // a loop, not std::equal: a memcmp call for two or three sizes
      if (sa[d] != sb[d]) return false;
    const BitsState state = formats::bits_state(va.flags[ra]);
    const BitsState other = formats::bits_state(vb.flags[rb]);
    if (unknown_equal && (state == BitsState::kUnknown || other == BitsState::kUnknown)) return true;
    if (state != other) return false;
    return state != BitsState::kHashed || va.fingerprint[ra] == vb.fingerprint[rb];
  }
  if (kind == ValueKind::kTensorList) return va.list_len[ra] == vb.list_len[rb];
  return A.ids[va.text[ra]] == B.ids[vb.text[rb]];
}

// An argument the op only writes (out=): its old bits are not read, so they do
// not take part in the comparison of inputs.
bool is_write_only(const StepEvents& s, std::size_t event, std::size_t r, const StringPool& pool) {
  if (!s.c->values.mutated[r]) return false;
  const std::string& overload = pool[s.overload(event)];
  return s.c->string(s.c->values.name[r]) == "out" || overload == "out" || ends_with(overload, "_out");
}

// Whether an argument of the event is a Storage (set_'s source): recorded as
// the text "Storage", it does not show the bits it brings in. (Other objects
// of kind other, a quantized op's packed weights, stay compared as text:
// naming their readers instead would be worse where the op itself differs.)
bool has_storage_input(const StepEvents& s, std::size_t event) {
  for (std::size_t r = s.first_input(event); r < s.first_output(event); ++r)
    if (s.kind(r) == ValueKind::kOther && s.c->string(s.c->values.text[r]) == "Storage") return true;
  return false;
}

// An event that only brings data in from outside the recording: a set_ of a
// Storage, or the zero-element empty() it is given (how a DataLoader's main
// process rebuilds a batch its worker processes sent, when the batch arrives).
// Batches arrive in a timing-dependent order, so such an event may be in one
// run only at its place: not a divergence in structure (its readers are
// compared as any other).
// Whether the event `id` of step `s` has a tensor of storage `storage` among
// its values (false where the step has no such event).
bool reference_event_touches(const StepEvents& s, uint64_t id, uint64_t storage) {
  for (std::size_t e = 0; e < s.size(); ++e) {
    if (s.c->events.id[e] != id) continue;
    for (std::size_t r = s.first_input(e); r < s.end(e); ++r)
      if (formats::carries_tensor(s.kind(r)) && s.c->values.storage_id[r] == storage) return true;
    return false;
  }
  return true;  // not in this step: nothing to say
}

bool brings_data_in(const StepEvents& s, std::size_t event, const StringPool& pool) {
  if (has_storage_input(s, event)) return true;
  if (std::string_view(pool[s.op(event)]).rfind("aten::empty", 0) != 0) return false;
  if (s.first_output(event) + 1 != s.end(event)) return false;
  const std::size_t out = s.first_output(event);
  if (s.kind(out) != ValueKind::kTensor) return false;
  const int64_t* sizes = s.sizes(out);
  bool zero = false;
  for (uint8_t d = 0; d < s.c->values.ndim[out]; ++d) zero = zero || sizes[d] == 0;
  if (!zero) return false;
  // Only the empty tensor a set_ of a Storage then fills (activation
  // checkpointing makes zero-element empties of its own).
  const uint64_t id = s.c->values.storage_id[out];
  for (std::size_t e = 0; e < s.size(); ++e) {
    const std::size_t self = s.first_input(e);
    if (self < s.first_output(e) && s.kind(self) == ValueKind::kTensor && s.c->values.storage_id[self] == id &&
        id != 0 && has_storage_input(s, e))
      return true;
  }
  return false;
}

// The alignment signature (DESIGN.md, Rule 3): op, overload, scope, autograd
// node and the structure of every value (kind; dtype and shape of tensors), never their bits
// or non-tensor values, so that a changed argument still aligns. Names enter
// as hashes of their text (`string_hash`, per row of the string table): equal
// across files without any shared state, so that the helper thread that reads
// a step file computes its signatures too.
//
// The words are folded into one running state, each by a bijection of the
// state (rotate, xor the word, multiply by an odd constant, xor-shift): two
// word sequences of one length that differ in one word never get equal
// signatures. No buffer is written: bytes written through a char pointer made
// the compiler reload every column pointer after each one (130 ns per event;
// the diff of 1M events spent 0.26 s in signatures, now about half that).
class SignatureHash {
 public:
  void add(uint64_t word) {
    h_ = ((h_ << 23) | (h_ >> 41)) ^ word;
    h_ *= 0x9fb21c651e98df25ULL;
    h_ ^= h_ >> 28;
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 0x243f6a8885a308d3ULL;
};

uint64_t signature(const formats::StepColumns& c, const std::vector<uint64_t>& string_hash, std::size_t i) {
  const auto& e = c.events;
  const auto& v = c.values;
  const std::size_t begin = e.value_begin[i], middle = begin + e.n_inputs[i], end = middle + e.n_outputs[i];
  SignatureHash h;
  h.add(string_hash[e.op[i]]);
  h.add(string_hash[e.overload[i]]);
  h.add(string_hash[e.scope[i]]);
  // The autograd node a backward op runs for: ops of two different nodes
  // (AddmmBackward0's t of the gradient, MmBackward0's t of a weight shard)
  // are different computations even where their shapes coincide.
  h.add(string_hash[e.node[i]]);
  auto add_values = [&](std::size_t first, std::size_t last) {
    h.add(last - first);
    for (std::size_t r = first; r < last; ++r) {
      const auto kind = static_cast<ValueKind>(v.kind[r]);
      if (formats::carries_tensor(kind)) {
        h.add(uint64_t{v.kind[r]} | uint64_t{v.dtype[r]} << 8 | uint64_t{v.ndim[r]} << 16);
        const int64_t* sizes = c.dims.data() + v.dims_offset[r];
        for (uint8_t d = 0; d < v.ndim[r]; ++d) h.add(static_cast<uint64_t>(sizes[d]));
      } else if (kind == ValueKind::kTensorList) {
        h.add(uint64_t{v.kind[r]} | uint64_t{static_cast<uint32_t>(v.list_len[r])} << 8);
      } else {
        h.add(v.kind[r]);
      }
    }
  };
  add_values(begin, middle);
  add_values(middle, end);
  return h.value();
}

// One step file read for the diff: its reader, its events' signatures and
// the view geometry (formats::view_geometry) of its tensor values.
struct LoadedStep {
  std::unique_ptr<StepReader> reader;
  std::vector<uint64_t> signatures;  // by event
  std::vector<uint64_t> geometry;    // by value row, suspect only (the dataflow's run); 0 without a tensor
};

// Runs on a helper thread (Engine::run_rank): touches nothing shared but HDF5,
// which serialises its own calls. No file: an empty LoadedStep.
LoadedStep load_step(const std::string& path, bool with_geometry) {
  LoadedStep s;
  if (path.empty()) return s;
  s.reader = std::make_unique<StepReader>(path);
  const formats::StepColumns& c = s.reader->columns();
  std::vector<uint64_t> string_hash(c.string_count());
  for (std::size_t k = 0; k < string_hash.size(); ++k) {
    const std::string_view text = c.string(static_cast<uint32_t>(k));
    string_hash[k] = XXH3_64bits(text.data(), text.size());
  }
  s.signatures.resize(c.events.size());
  for (std::size_t i = 0; i < s.signatures.size(); ++i) s.signatures[i] = signature(c, string_hash, i);
  if (!with_geometry) return s;
  const auto& v = c.values;
  s.geometry.assign(v.size(), 0);
  for (std::size_t r = 0; r < v.size(); ++r) {
    if (!formats::carries_tensor(static_cast<ValueKind>(v.kind[r]))) continue;
    const int64_t* d = c.dims.data() + v.dims_offset[r];
    s.geometry[r] = formats::view_geometry(static_cast<DType>(v.dtype[r]), v.storage_offset[r], d, d + v.ndim[r],
                                           v.ndim[r]);
  }
  return s;
}

// A suspect event of the dataflow table: what a later event names as the
// producer of its bits.
struct FlowEvent {
  uint64_t id = 0;
  std::optional<uint64_t> reference_id;
  int64_t step = 0;
  int32_t op = 0;    // StringPool id
  int32_t gap = -1;  // unmatched events: their gap (RankState::gaps)
  // Its outputs' bits came from a Storage argument, which the recording does
  // not hold (has_storage_input), and differ: data from outside the recording.
  bool brings_outside = false;
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
  // Where it was tainted by bits of unknown provenance (not by bits that
  // already differed): the first such read, for the note of a region that
  // is not named (note_withheld).
  std::optional<uint64_t> unknown_reader_id;
  std::string unknown_reader_op;
  int unknown_input = -1;
  bool reported = false;
  // Earlier gaps whose results its events read (a mask built by ops only one
  // run has, then read by the other ops it has instead of one): clean when
  // they are. Named, the gap is one region with them (region_gaps).
  std::vector<int32_t> upstream;
  void add(const StepEvents& s, std::size_t i, const StringPool& pool, bool reference) {
    const auto& e = s.c->events;
    auto& ids = reference ? region.reference_ids : region.suspect_ids;
    auto& ops = reference ? region.reference_ops : region.suspect_ops;
    auto& count = reference ? region.reference_events : region.suspect_events;
    const std::string& op = pool[s.op(i)];
    const std::string& overload = pool[s.overload(i)];
    if (count == 0) {
      if (reference) {
        reference_op = op, reference_overload = overload, reference_scope = pool[s.scope(i)], reference_id = e.id[i];
      } else {
        suspect_scope = pool[s.scope(i)], suspect_id = e.id[i], t_start_ns = e.t_start_ns[i], t_end_ns = e.t_end_ns[i];
        stream = e.stream[i];
      }
    }
    ++count;
    ids.push_back(formats::event_id_string(e.id[i]));
    ops.push_back(formats::op_text(op, overload));
    keep_ends(ids);
    keep_ends(ops);
  }
  // All of a list up to kMaxRegionEvents, else its first and last halves.
  static void keep_ends(std::vector<std::string>& v) {
    constexpr auto half = static_cast<std::ptrdiff_t>(UnmatchedRegion::kMaxRegionEvents / 2);
    if (v.size() > UnmatchedRegion::kMaxRegionEvents) v.erase(v.begin() + half, v.end() - half);
  }
  // Appends `other`'s events to this one's (`other` ran later).
  void merge(const Gap& other) {
    if (region.reference_events == 0 && other.region.reference_events > 0) {
      reference_op = other.reference_op, reference_overload = other.reference_overload;
      reference_scope = other.reference_scope, reference_id = other.reference_id;
    }
    if (!suspect_id && other.suspect_id) {
      suspect_scope = other.suspect_scope, suspect_id = other.suspect_id, stream = other.stream;
      t_start_ns = other.t_start_ns, t_end_ns = other.t_end_ns;
    }
    // Each list holds its own ends, so the ends of the two together are right.
    auto append = [](std::vector<std::string>& to, const std::vector<std::string>& from) {
      to.insert(to.end(), from.begin(), from.end());
      keep_ends(to);
    };
    append(region.reference_ids, other.region.reference_ids);
    append(region.reference_ops, other.region.reference_ops);
    append(region.suspect_ids, other.region.suspect_ids);
    append(region.suspect_ops, other.region.suspect_ops);
    region.reference_events += other.region.reference_events;
    region.suspect_events += other.region.suspect_events;
  }
};

// The comparison of one aligned pair, value by value. One object is reused for
// every pair (no allocation per event).
struct PairComparison {
  std::vector<char> input_differs, output_differs;
  bool tensor_input_differs = false;
  bool argument_differs = false;  // a non-tensor argument or a generator state
  bool outputs_differ = false;
};

void compare_pair(const StepEvents& A, std::size_t a, const StepEvents& B, std::size_t b, const StringPool& pool,
                  PairComparison& c) {
  const std::size_t a_in = A.first_input(a), a_n_in = A.first_output(a) - a_in;
  const std::size_t a_out = A.first_output(a), a_n_out = A.end(a) - a_out;
  const std::size_t b_in = B.first_input(b), b_n_in = B.first_output(b) - b_in;
  const std::size_t b_out = B.first_output(b), b_n_out = B.end(b) - b_out;
  c.input_differs.assign(b_n_in, 0);
  c.output_differs.assign(b_n_out, 0);
  c.tensor_input_differs = c.argument_differs = c.outputs_differ = false;
  // A tensor one run did not fingerprint is no evidence that its bits differ:
  // one written without the dispatcher before the hashing thread got to it
  // (torch.compile's kernels fill what an out= op returned, and reuse the
  // buffers it read) is hashed in one run and not in the other, by timing.
  // Such inputs are marked kUnknownInput until the outputs are compared.
  constexpr char kUnknownInput = 2;
  bool unknown_inputs = false;
  for (std::size_t k = 0; k < b_n_in; ++k) {
    if (k >= a_n_in) {
      c.input_differs[k] = 1;
      c.argument_differs = true;
      continue;
    }
    if (B.kind(b_in + k) == ValueKind::kTensor && is_write_only(B, b, b_in + k, pool)) continue;
    if (values_equal(A, a_in + k, B, b_in + k)) continue;
    const bool tensors = A.kind(a_in + k) == ValueKind::kTensor && B.kind(b_in + k) == ValueKind::kTensor;
    if (tensors && values_equal(A, a_in + k, B, b_in + k, true)) {
      c.input_differs[k] = kUnknownInput;
      unknown_inputs = true;
      continue;
    }
    c.input_differs[k] = 1;
    // A Python number the dispatcher wrapped in a tensor (x * 0.5) is an
    // argument of the call, not data an earlier op made.
    const bool number = tensors && (A.c->values.flags[a_in + k] & formats::kTensorWrappedNumber) &&
                        (B.c->values.flags[b_in + k] & formats::kTensorWrappedNumber);
    if (tensors && !number) c.tensor_input_differs = true;
    else c.argument_differs = true;
  }
  // An output so compares by dtype and shape: its readers see the bits.
  for (std::size_t k = 0; k < b_n_out; ++k) {
    if (k < a_n_out && values_equal(A, a_out + k, B, b_out + k, true)) continue;
    c.output_differs[k] = 1;
    c.outputs_differ = true;
  }
  if (a_n_out != b_n_out) c.outputs_differ = true;
  // An input so is compared with nothing: with equal outputs the op is same;
  // with other outputs it is never named an origin on bits it did not
  // compare, and those inputs count as differing (propagated or entered).
  if (!unknown_inputs) return;
  const bool count_as_differing = !c.tensor_input_differs && c.outputs_differ;
  for (char& d : c.input_differs)
    if (d == kUnknownInput) d = count_as_differing ? 1 : 0;
  if (count_as_differing) c.tensor_input_differs = true;
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
  // The first region whose differing result was read but that is not named
  // because it read bits of unknown provenance (note_withheld).
  struct Withheld {
    int64_t step = 0;
    int64_t t_start_ns = 0;
    std::string note;
  };
  std::optional<Withheld> withheld;
  bool any_unknown_taint = false;  // some gap has unknown_reader_id (note_withheld's quick exit)
  // This step's forward events by scope: the last one, and the last one whose
  // bits differed. Backward ops read tensors that a forward op saved for them
  // without returning them (layer_norm's mean and rstd, log_softmax inside
  // cross_entropy): those storages are unseen by the recording, and the
  // forward events of the same scope are where they came from.
  struct ScopeProducers {
    int32_t last = -1;
    int32_t last_divergent = -1;
    // `last`'s place in this step: its reference event (-1: unmatched), its
    // suspect event and its position in the suspect's order; how many forward
    // events the scope ran this step.
    int32_t last_reference = -1;
    std::size_t last_suspect = 0, last_position = 0;
    int count = 0;
    bool last_compared = false;  // cross-rank mode: false where replicas need not agree
  };
  std::vector<ScopeProducers> forward_by_scope;  // by StringPool id of the scope (last = -1: none this step)
  // The last backward-phase event of each scope this step that was not same
  // (-1: none): a forward op recomputed during backward (activation
  // checkpointing) makes what the scope's backward ops read.
  std::vector<int32_t> backward_divergent_by_scope;
  std::vector<Gap> gaps;                // every gap of the alignment so far
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
  void diff_step(RankState& rs, int64_t step, const LoadedStep& ref, const LoadedStep& sus, bool in_range);
  // Suspect event b (of `se`) and its aligned reference event a (of `re`), or a = -1.
  void classify(RankState& rs, const StepEvents& re, const StepEvents& se, int32_t a, std::size_t b, bool in_range,
                PhaseSummary& summary, const std::vector<int32_t>& order, std::size_t position);
  bool replicated(const StepEvents& s, std::size_t i) const;
  void mark_unmatched(RankState& rs, const StepEvents& se, std::size_t b, int32_t self) const;
  void note_withheld(RankState& rs, const StepEvents& se, std::size_t b, int32_t gap, int input) const;
  void report_gap(RankState& rs, const StepEvents& re, const StepEvents& se, std::size_t a, std::size_t b,
                  int32_t gap, int input);
  void add_found(RankState& rs, DivergentEvent d) const;
  void saved_origin(RankState& rs, const StepEvents& re, const StepEvents& se, const RankState::ScopeProducers& made,
                    std::size_t reader, int input, const std::vector<int32_t>& order, bool in_range);
  void add_rerecord(const RankState& rs, DivergentEvent& d, uint64_t reference_id, uint64_t suspect_id) const;
  bool collective(int32_t op) const { return pool_[op].rfind("c10d::", 0) == 0; }
  DivergentEvent describe(const RankState& rs, const Event* a, const Event* b, EventClass cls,
                          const PairComparison* cmp, int64_t call_index) const;
  void add_evidence(DivergentEvent& d, const StepReader* ref, const StepReader* sus, const Event& a, const Event& b,
                    bool output, std::size_t position) const;
  std::string rerecord_command(const Side& side, int rank, uint64_t id) const;
  PhaseSummary& summary(int rank, int64_t step, formats::Phase phase);

  const Side& ref_;
  const Side& sus_;
  const DiffOptions& options_;
  DiffReport& report_;
  bool ranks_mode_;
  StringPool pool_;
  std::map<std::tuple<int, int64_t, int>, PhaseSummary> summaries_;
  std::vector<DivergentEvent> found_;
  std::vector<DivergentEvent> unmatched_;
  std::vector<RankState::Withheld> withheld_;  // each rank's first
  std::unique_ptr<TraceLog> trace_;
  PairComparison cmp_;  // the pair being classified
};

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
bool Engine::replicated(const StepEvents& s, std::size_t i) const {
  if (!ranks_mode_) return true;
  return s.phase(i) == formats::Phase::kOptimizer || collective(s.op(i));
}

std::string Engine::rerecord_command(const Side& side, int rank, uint64_t id) const {
  auto m = side.manifests.find(rank);
  if (m == side.manifests.end()) return "";
  // Unset where the run had none: the numerics variables of the shell that
  // runs diff, and those the other run had (a shell that runs the command may
  // export what that run had, MKL_CBWR=COMPATIBLE).
  std::vector<std::string> unset = formats::numerics_env_here();
  for (const Side* s : {&ref_, &sus_})
    for (const auto& [r, manifest] : s->manifests)
      for (const auto& [name, value] : manifest.env) unset.push_back(name);
  return formats::rerecord_command(m->second, side.dir, formats::event_id_string(id), options_.dump_radius,
                                   options_.opguard_command, unset);
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

// The gap and every gap whose results it read, transitively.
std::vector<int32_t> upstream_closure(const RankState& rs, int32_t gap) {
  std::vector<int32_t> todo{gap}, out;
  while (!todo.empty()) {
    const int32_t g = todo.back();
    todo.pop_back();
    if (std::find(out.begin(), out.end(), g) != out.end()) continue;
    out.push_back(g);
    const auto& up = rs.gaps[static_cast<std::size_t>(g)].upstream;
    todo.insert(todo.end(), up.begin(), up.end());
  }
  return out;
}

// The gaps of one region (region_gaps) as one.
Gap merged_region(const RankState& rs, const std::vector<int32_t>& parts) {
  Gap g = rs.gaps[static_cast<std::size_t>(parts.front())];
  for (std::size_t k = 1; k < parts.size(); ++k) g.merge(rs.gaps[static_cast<std::size_t>(parts[k])]);
  return g;
}

// A gap is clean when neither it nor a gap whose results it read is tainted.
bool gap_clean(const RankState& rs, int32_t gap) {
  for (int32_t g : upstream_closure(rs, gap))
    if (rs.gaps[static_cast<std::size_t>(g)].tainted) return false;
  return true;
}

// The gaps of one region (upstream_closure) in the order their first suspect
// events ran.
std::vector<int32_t> region_gaps(const RankState& rs, int32_t gap) {
  auto out = upstream_closure(rs, gap);
  std::sort(out.begin(), out.end(), [&](int32_t x, int32_t y) {
    const Gap& gx = rs.gaps[static_cast<std::size_t>(x)];
    const Gap& gy = rs.gaps[static_cast<std::size_t>(y)];
    return std::tie(gx.step, gx.t_start_ns, x) < std::tie(gy.step, gy.t_start_ns, y);
  });
  return out;
}

// A gap stays a candidate source while every tensor its events read carries
// bits equal to the reference's (made by an event whose outputs were equal in
// both runs) or made inside the gap, which includes memory an event of the
// gap made and the program filled without an operator. Other bits of unknown
// provenance (never produced in the recording, changed outside the
// dispatcher) taint it too: a gap is named as a source only on evidence.
//
// Bits made by an earlier gap are the exception: the gaps are then one region
// (region_gaps), clean while that gap is.
void Engine::mark_unmatched(RankState& rs, const StepEvents& se, std::size_t b, int32_t self) const {
  const int32_t gap = rs.gap_of_suspect[b];
  rs.events[static_cast<std::size_t>(self)].gap = gap;
  if (gap < 0) return;
  Gap& g = rs.gaps[static_cast<std::size_t>(gap)];
  for (std::size_t r = se.first_input(b); r < se.first_output(b) && !g.tainted; ++r) {
    if (se.kind(r) != ValueKind::kTensor || is_write_only(se, b, r, pool_)) continue;
    // A Python number the dispatcher wrapped is made at the call: a constant
    // of the code only this run has, as bits made inside the gap are.
    if (se.c->values.flags[r] & formats::kTensorWrappedNumber) continue;
    const Provenance p = rs.flow.provenance(se.bits(r));
    if (!p.known) {
      // Memory an op of this gap made and the program then filled without an
      // operator (torch.tensor(1.0) fills an aten::empty; numpy into a fresh
      // buffer) holds data of the code only this run has, as a wrapped number.
      const bool filled_here = p.last_writer >= 0 && rs.events[static_cast<std::size_t>(p.last_writer)].gap == gap;
      if (!filled_here) {
        g.tainted = true;
        rs.any_unknown_taint = true;
        g.unknown_reader_id = se.c->events.id[b];
        g.unknown_reader_op = formats::op_text(pool_[se.op(b)], pool_[se.overload(b)]);
        g.unknown_input = static_cast<int>(r - se.first_input(b));
      }
      continue;
    }
    if (!p.differs) continue;
    const int32_t from = p.event < 0 ? -1 : rs.events[static_cast<std::size_t>(p.event)].gap;
    if (from == gap) continue;
    if (from >= 0 && gap_clean(rs, from)) {
      if (std::find(g.upstream.begin(), g.upstream.end(), from) == g.upstream.end()) g.upstream.push_back(from);
      continue;
    }
    g.tainted = true;
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

// A forward event whose inputs and returned outputs were equal in both runs,
// and a tensor it saved for the backward pass differs: backward event
// `reader` of the suspect read it as input `input`. The forward event is the
// origin (DivergentEvent::saved_reader); its phase's summary counts it so.
void Engine::saved_origin(RankState& rs, const StepEvents& re, const StepEvents& se,
                          const RankState::ScopeProducers& made, std::size_t reader, int input,
                          const std::vector<int32_t>& order, bool in_range) {
  const std::size_t b = made.last_suspect;
  const auto a = static_cast<std::size_t>(made.last_reference);
  const formats::Phase phase = se.phase(b);
  if (!in_range) return;
  PhaseSummary& sum = summary(rs.suspect_rank, se.c->events.step[b], phase);
  --sum.counts[static_cast<int>(EventClass::kSame)];
  ++sum.counts[static_cast<int>(EventClass::kOrigin)];
  if (options_.list_events) {
    const std::string id = formats::event_id_string(se.c->events.id[b]);
    for (auto it = report_.events.rbegin(); it != report_.events.rend(); ++it)
      if (it->rank == rs.suspect_rank && it->suspect_id == id) {
        it->cls = EventClass::kOrigin;
        break;
      }
  }
  int64_t call_index = 0;
  for (std::size_t p = 0; p < made.last_position; ++p) {
    const auto e = static_cast<std::size_t>(order[p]);
    call_index += se.phase(e) == phase && se.op(e) == se.op(b) && se.scope(e) == se.scope(b);
  }
  const Event eb = se.reader->event(b);
  const Event ea = re.reader->event(a);
  PairComparison cmp;
  compare_pair(re, a, se, b, pool_, cmp);
  DivergentEvent d = describe(rs, &ea, &eb, EventClass::kOrigin, &cmp, call_index);
  d.state_note = state_difference(ea, eb);
  const Event er = se.reader->event(reader);
  d.saved_reader = formats::event_id_string(er.id);
  d.saved_reader_op = formats::op_text(er.op, er.overload);
  d.saved_input = er.inputs[static_cast<std::size_t>(input)].name.empty()
                      ? fmt::format("input {}", input)
                      : er.inputs[static_cast<std::size_t>(input)].name;
  d.saved_candidates = made.count;
  add_found(rs, std::move(d));
}

// A region whose differing result event b read (input `input`) and that is
// not named because it, or a region whose results it read, read bits of
// unknown provenance: said in a note, so that the diff of a program whose
// compiled kernels (torch.compile) write memory outside the dispatcher says
// where its runs part and why no operator is named there. Regions tainted
// only by bits that already differed get no note: what made those bits is
// classified on its own.
void Engine::note_withheld(RankState& rs, const StepEvents& se, std::size_t b, int32_t gap, int input) const {
  const auto parts = region_gaps(rs, gap);
  const Gap* unknown = nullptr;
  for (int32_t p : parts) {
    const Gap& part = rs.gaps[static_cast<std::size_t>(p)];
    if (part.unknown_reader_id && (unknown == nullptr || *part.unknown_reader_id < *unknown->unknown_reader_id))
      unknown = &part;
  }
  if (unknown == nullptr) return;
  const Gap g = merged_region(rs, parts);
  auto side = [](int64_t n, const std::vector<std::string>& ops, const std::vector<std::string>& ids) {
    if (n == 0) return std::string("none");
    std::string t = fmt::format("{} op{} from event {} ({}", n, n == 1 ? "" : "s", ids.front(), ops.front());
    if (n > 1) t += fmt::format(" ... {}", ops.back());
    return t + ")";
  };
  const std::string swapped =
      ranks_mode_ ? fmt::format("opguard diff {} --ranks {},{}", shell_quote(sus_.dir), rs.suspect_rank, rs.reference_rank)
                  : fmt::format("opguard diff {} {}", shell_quote(sus_.dir), shell_quote(ref_.dir));
  RankState::Withheld w;
  w.step = g.step;
  w.t_start_ns = g.t_start_ns;
  w.note = fmt::format(
      "rank {} step {} {}: a region that does not align (reference: {}; suspect: {}) returned bits that differ, "
      "read by {} (event {}, input {}), and is not named: its event {} ({}) read input {}, bits that no operator of "
      "the recording made (memory written outside the dispatcher: kernels that torch.compile generated, numpy, a "
      "custom extension), so its inputs are not known to be equal in both runs (where the reference's ops of the "
      "region read only bits that operators made, `{}` compares it from the reference's side)",
      rs.suspect_rank, g.step, formats::phase_name(g.phase),
      side(g.region.reference_events, g.region.reference_ops, g.region.reference_ids),
      side(g.region.suspect_events, g.region.suspect_ops, g.region.suspect_ids),
      formats::op_text(pool_[se.op(b)], pool_[se.overload(b)]), formats::event_id_string(se.c->events.id[b]), input,
      formats::event_id_string(*unknown->unknown_reader_id), unknown->unknown_reader_op, unknown->unknown_input,
      swapped);
  rs.withheld = std::move(w);
}

void Engine::report_gap(RankState& rs, const StepEvents& re, const StepEvents& se, std::size_t a, std::size_t b,
                        int32_t gap_index, int input) {
  // One region with the gaps whose results it read; reported once, where the
  // first of its results that differs is read.
  const auto parts = region_gaps(rs, gap_index);
  for (int32_t p : parts)
    if (rs.gaps[static_cast<std::size_t>(p)].reported) return;
  for (int32_t p : parts) rs.gaps[static_cast<std::size_t>(p)].reported = true;
  const Gap g = merged_region(rs, parts);
  const Event ea = re.reader->event(a);
  const Event eb = se.reader->event(b);
  DivergentEvent d;
  d.cls = EventClass::kOrigin;
  d.rank = rs.suspect_rank;
  d.reference_rank = rs.reference_rank;
  d.step = g.step;
  d.phase = formats::phase_name(g.phase);
  const bool one_reference_op = g.region.reference_events == 1;
  d.op = one_reference_op ? g.reference_op : g.region.suspect_ops.empty() ? eb.op : g.region.suspect_ops.front();
  d.overload = one_reference_op ? g.reference_overload : "";
  d.scope = g.region.reference_events > 0 ? g.reference_scope : g.suspect_id ? g.suspect_scope : eb.scope;
  if (one_reference_op) d.reference_id = formats::event_id_string(*g.reference_id);
  const uint64_t shown = g.suspect_id.value_or(eb.id);
  d.suspect_id = formats::event_id_string(shown);
  d.stream = g.suspect_id ? g.stream : eb.stream;
  d.t_start_ns = g.suspect_id ? g.t_start_ns : eb.t_start_ns;
  d.t_end_ns = g.suspect_id ? g.t_end_ns : eb.t_end_ns;
  d.outputs_differ = true;
  UnmatchedRegion r = g.region;
  r.consumer_id = formats::event_id_string(eb.id);
  r.consumer_op = formats::op_text(eb.op, eb.overload);
  r.consumer_input = input;
  r.reference_bits = value_text(ea.inputs[static_cast<std::size_t>(input)]);
  r.suspect_bits = value_text(eb.inputs[static_cast<std::size_t>(input)]);
  d.region = std::move(r);
  d.show_command = fmt::format("{} show {} --event {}{}", options_.opguard_command, shell_quote(sus_.dir),
                               formats::event_id_string(shown),
                               rs.suspect_rank != 0 ? fmt::format(" --rank {}", rs.suspect_rank) : "");
  // The differing result as its reader saw it in both runs.
  add_evidence(d, re.reader, se.reader, ea, eb, false, static_cast<std::size_t>(input));
  if (!d.evidence_note.empty()) add_rerecord(rs, d, g.reference_id.value_or(ea.id), shown);
  add_found(rs, std::move(d));
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
                                    "around it with the command below (in both runs) for element-wise metrics; it sets "
                                    "the environment variables that change numerics as the run had them, and no "
                                    "other: add the program's own (the recording does not hold them)",
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

void Engine::classify(RankState& rs, const StepEvents& re, const StepEvents& se, int32_t a, std::size_t b,
                      bool in_range, PhaseSummary& sum, const std::vector<int32_t>& order, std::size_t position) {
  const formats::StepColumns::Events& ev = se.c->events;
  const formats::StepColumns::Values& val = se.c->values;
  const int32_t self = static_cast<int32_t>(rs.events.size());
  const int32_t op = se.op(b);
  const formats::Phase phase = se.phase(b);
  FlowEvent fe;
  fe.id = ev.id[b];
  if (a >= 0) fe.reference_id = re.c->events.id[a];
  fe.step = ev.step[b];
  fe.op = op;
  // One run only: its bits are the other run's nowhere, and where they came
  // from a Storage, their readers are entered, not fed by a region.
  if (a < 0) fe.brings_outside = has_storage_input(se, b);
  rs.events.push_back(fe);

  const std::size_t in_begin = se.first_input(b), out_begin = se.first_output(b), end = se.end(b);
  const std::size_t n_in = out_begin - in_begin;
  auto is_tensor = [&](std::size_t r) { return se.kind(r) == ValueKind::kTensor; };

  EventClass cls = EventClass::kUnmatched;
  PairComparison& cmp = cmp_;
  BitsSource source;
  int source_input = -1;
  const bool compared = a >= 0 && replicated(se, b);
  if (a < 0) mark_unmatched(rs, se, b, self);
  // Differing inputs whose bits a clean gap made: that gap is a source.
  std::vector<std::pair<int32_t, int>> gap_sources;  // (gap, input position); empty on the hot path
  if (a >= 0) {
    compare_pair(re, static_cast<std::size_t>(a), se, b, pool_, cmp);
    if (!compared) {
      cls = EventClass::kSame;  // not compared (cross-rank mode): counted apart
    } else if (ranks_mode_ && collective(op)) {
      // A collective's inputs differ across ranks by design; its outputs must not.
      cls = cmp.outputs_differ ? EventClass::kOrigin : EventClass::kSame;
    } else if (cmp.tensor_input_differs) {
      // Which input's bits have no divergent producer? That one entered.
      bool any_entered = false;
      BitsSource first_propagated;
      int first_propagated_input = -1;
      for (std::size_t k = 0; k < n_in; ++k) {
        if (!cmp.input_differs[k] || !is_tensor(in_begin + k)) continue;
        // A Python number the call wrapped is an argument (compare_pair).
        if (val.flags[in_begin + k] & formats::kTensorWrappedNumber) continue;
        BitsSource s = rs.flow.explain(se.bits(in_begin + k));
        // A backward op reads what its forward op saved: a tensor, or a view
        // of one, that no event returned. The forward events of its scope made
        // it; where none of them returned other bits, one computed this
        // tensor otherwise from equal inputs: an origin (saved_origin).
        if ((s.unseen || s.view_unseen) && phase == formats::Phase::kBackward) {
          const auto scope = static_cast<std::size_t>(se.scope(b));
          if (scope < rs.backward_divergent_by_scope.size() && rs.backward_divergent_by_scope[scope] >= 0) {
            s.kind = BitsSource::kPropagated;
            s.event = rs.backward_divergent_by_scope[scope];
          } else if (scope < rs.forward_by_scope.size() && rs.forward_by_scope[scope].last >= 0) {
            RankState::ScopeProducers& made = rs.forward_by_scope[scope];
            if (made.last_divergent < 0 && made.last_reference >= 0 && made.last_compared) {
              saved_origin(rs, re, se, made, b, static_cast<int>(k), order, in_range);
              made.last_divergent = made.last;
            }
            s.kind = made.last_divergent >= 0 ? BitsSource::kPropagated : BitsSource::kEnteredOutside;
            s.event = made.last_divergent >= 0 ? made.last_divergent : made.last;
          }
        }
        // Bits an op brought in from an argument the recording does not
        // hold: they entered here, at their first reader that differs.
        if (s.kind == BitsSource::kPropagated && s.event >= 0 && rs.events[static_cast<std::size_t>(s.event)].brings_outside)
          s.kind = BitsSource::kEnteredOutside;
        if (s.kind == BitsSource::kPropagated) {
          const int32_t gap = s.event >= 0 ? rs.events[static_cast<std::size_t>(s.event)].gap : -1;
          if (gap >= 0 && gap_clean(rs, gap)) gap_sources.emplace_back(gap, static_cast<int>(k));
          else if (gap >= 0 && in_range && rs.any_unknown_taint && !rs.withheld)
            note_withheld(rs, se, b, gap, static_cast<int>(k));
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
    } else if (cmp.outputs_differ && has_storage_input(se, b)) {
      // set_ of a Storage (the batches a DataLoader's worker processes send,
      // in the order they arrive; torch.load): the outputs' bits come from
      // an argument the recording does not hold. No evidence that the op
      // computed them otherwise: the first reader of other bits is entered.
      cls = EventClass::kSame;
      rs.events.back().brings_outside = true;
    } else {
      cls = cmp.outputs_differ ? EventClass::kOrigin : EventClass::kSame;
    }
  }

  // Dataflow: inputs first (they were read before the op wrote anything), then
  // what the op wrote.
  const bool unmatched = a < 0;
  for (std::size_t k = 0; k < n_in; ++k) {
    const std::size_t r = in_begin + k;
    if (!is_tensor(r) || val.storage_id[r] == 0) continue;
    rs.flow.observe_input(se.bits(r), self, unmatched || (compared && cmp.input_differs[k]));
  }
  for (std::size_t r = out_begin; r < end; ++r) {
    if (!is_tensor(r) || val.storage_id[r] == 0) continue;
    const bool differs = unmatched || (compared && cmp.output_differs[r - out_begin]);
    bool aliases_input = false, writes_input = false;
    for (std::size_t q = in_begin; q < out_begin; ++q) {
      if (!is_tensor(q) || val.storage_id[q] != val.storage_id[r]) continue;
      aliases_input = true;
      writes_input = writes_input || val.mutated[q];
    }
    if (aliases_input && !writes_input) rs.flow.record_alias(se.bits(r), self, differs);
    else rs.flow.record_write(se.bits(r), self, differs, true);
  }
  // Arguments the op wrote but did not return: their new bits are unknown.
  for (std::size_t q = in_begin; q < out_begin; ++q) {
    if (!is_tensor(q) || !val.mutated[q] || val.storage_id[q] == 0) continue;
    bool returned = false;
    for (std::size_t r = out_begin; r < end; ++r) returned = returned || (is_tensor(r) && val.storage_id[r] == val.storage_id[q]);
    if (!returned) rs.flow.record_write(se.bits(q), self, unmatched || cls != EventClass::kSame, false);
  }

  if (phase == formats::Phase::kForward) {
    const auto scope = static_cast<std::size_t>(se.scope(b));
    if (scope >= rs.forward_by_scope.size()) rs.forward_by_scope.resize(scope + 1);
    auto& producers = rs.forward_by_scope[scope];
    producers.last = self;
    producers.last_reference = a;
    producers.last_suspect = b;
    producers.last_position = position;
    producers.last_compared = compared;
    ++producers.count;
    if (unmatched || (compared && cls != EventClass::kSame)) producers.last_divergent = self;
  } else if (phase == formats::Phase::kBackward && (unmatched || (compared && cls != EventClass::kSame))) {
    const auto scope = static_cast<std::size_t>(se.scope(b));
    if (scope >= rs.backward_divergent_by_scope.size()) rs.backward_divergent_by_scope.resize(scope + 1, -1);
    rs.backward_divergent_by_scope[scope] = self;
  }

  // Event objects only off the hot path: for the trace, the event list and the
  // events the report describes.
  if (trace_) {
    const Event eb = se.reader->event(b);
    const Event ea = a >= 0 ? re.reader->event(static_cast<std::size_t>(a)) : Event{};
    const TensorMeta* first_out = nullptr;
    for (const auto& o : eb.outputs)
      if (o.kind == ValueKind::kTensor) {
        first_out = &o.tensor;
        break;
      }
    trace_->add_suspect(rs.suspect_rank, eb, a >= 0 ? &ea : nullptr, unmatched ? EventClass::kUnmatched : cls,
                        first_out);
  }

  if (!in_range) return;
  for (const auto& [gap, input] : gap_sources) report_gap(rs, re, se, static_cast<std::size_t>(a), b, gap, input);
  if (options_.list_events)
    report_.events.push_back({rs.suspect_rank, ev.step[b], formats::phase_name(phase), pool_[op],
                              a >= 0 ? std::optional<std::string>(formats::event_id_string(re.c->events.id[a]))
                                     : std::nullopt,
                              formats::event_id_string(ev.id[b]), cls, compared || unmatched});
  if (!compared && !unmatched) {
    ++sum.not_compared;
    return;
  }
  if (unmatched && brings_data_in(se, b, pool_)) {
    ++sum.unmatched_data_in;
    return;
  }
  ++sum.counts[static_cast<int>(cls)];
  if (unmatched) ++sum.unmatched_suspect;
  if (unmatched) {
    if (!rs.first_unmatched) {
      const Event eb = se.reader->event(b);
      rs.first_unmatched = describe(rs, nullptr, &eb, cls, nullptr, 0);
    }
    return;
  }
  if (!is_divergence_source(cls)) return;
  const std::size_t keep = static_cast<std::size_t>(std::max(1, options_.max_origins));
  if (rs.found.size() >= keep) return;
  int64_t call_index = 0;
  for (std::size_t p = 0; p < position; ++p) {
    const auto e = static_cast<std::size_t>(order[p]);
    call_index += se.phase(e) == phase && se.op(e) == op && se.scope(e) == se.scope(b);
  }
  const Event eb = se.reader->event(b);
  const Event ea = re.reader->event(static_cast<std::size_t>(a));
  DivergentEvent d = describe(rs, &ea, &eb, cls, &cmp, call_index);
  d.collective_equal_inputs = !ranks_mode_ && cls == EventClass::kOrigin && collective(op);
  d.state_note = state_difference(ea, eb);
  if (cls == EventClass::kEntered) {
    const Value& in = eb.inputs[source_input];
    d.entered_input = in.name.empty() ? fmt::format("input {}", source_input) : in.name;
    d.entered_side = source.kind == BitsSource::kEnteredReference ? "reference" : "suspect";
    if (source.event >= 0) {
      const FlowEvent& p = rs.events[source.event];
      d.producer_id = formats::event_id_string(p.id);
      if (p.reference_id) d.producer_reference_id = formats::event_id_string(*p.reference_id);
      d.producer_op = pool_[p.op];
      d.producer_step = p.step;
      d.brought_in = p.brings_outside;
      if (source.kind == BitsSource::kEnteredReference && p.reference_id && p.step == ev.step[b])
        d.reference_read_other = !reference_event_touches(
            re, *p.reference_id, re.c->values.storage_id[re.first_input(static_cast<std::size_t>(a)) + source_input]);
    }
    add_evidence(d, re.reader, se.reader, ea, eb, false, static_cast<std::size_t>(source_input));
  } else {
    for (std::size_t k = 0; k < eb.outputs.size(); ++k)
      if (cmp.output_differs[k]) add_evidence(d, re.reader, se.reader, ea, eb, true, k);
  }
  if (d.evidence.empty() && d.evidence_note.empty() && cls == EventClass::kOriginArgs && !cmp.outputs_differ)
    d.evidence_note = eb.outputs.empty() && ea.outputs.empty()
                          ? "no outputs recorded (the call did not return: activation checkpointing stops its "
                            "recomputation inside an op); an argument differs"
                          : "outputs are bitwise equal; only an argument differs";
  if (!d.evidence_note.empty()) add_rerecord(rs, d, ea.id, eb.id);
  add_found(rs, std::move(d));
}

void Engine::diff_step(RankState& rs, int64_t step, const LoadedStep& ref_step, const LoadedStep& sus_step,
                       bool in_range) {
  const StepReader* ref = ref_step.reader.get();
  const StepEvents re(ref, ref_step.geometry, pool_), se(sus_step.reader.get(), sus_step.geometry, pool_);
  if (in_range) {
    report_.events_reference += static_cast<int64_t>(re.size());
    report_.events_suspect += static_cast<int64_t>(se.size());
  }
  // Per phase, each run's events in (stream, seq) order; alignment per phase.
  // Recordings are usually in that order already: sorting is skipped then.
  auto by_phase = [](const StepEvents& s) {
    std::array<std::vector<int32_t>, kNumPhases> out;
    if (!s.c) return out;
    const auto& e = s.c->events;
    for (std::size_t i = 0; i < s.size(); ++i) out[e.phase[i]].push_back(static_cast<int32_t>(i));
    auto before = [&](int32_t x, int32_t y) { return std::tie(e.stream[x], e.seq[x]) < std::tie(e.stream[y], e.seq[y]); };
    for (auto& v : out)
      if (!std::is_sorted(v.begin(), v.end(), before)) std::sort(v.begin(), v.end(), before);
    return out;
  };
  const auto rp = by_phase(re), sp = by_phase(se);
  std::vector<int32_t> partner(se.size(), -1);
  std::vector<char> ref_matched(re.size(), 0);
  rs.gap_of_suspect.assign(se.size(), -1);
  std::vector<uint64_t> sa, sb;
  std::array<PhaseSummary*, kNumPhases> sums{};
  PhaseSummary out_of_range;  // a step read only for dataflow: no summary row
  for (int p = 0; p < kNumPhases; ++p) {
    if (rp[p].empty() && sp[p].empty()) continue;
    sums[p] = in_range ? &summary(rs.suspect_rank, step, static_cast<formats::Phase>(p)) : &out_of_range;
    sa.resize(rp[p].size());
    sb.resize(sp[p].size());
    for (std::size_t i = 0; i < sa.size(); ++i) sa[i] = ref_step.signatures[rp[p][i]];
    for (std::size_t j = 0; j < sb.size(); ++j) sb[j] = sus_step.signatures[sp[p][j]];
    int32_t open_gap = -1;
    std::vector<AlignStep> script = align_sequences(sa.data(), sa.size(), sb.data(), sb.size());
    // Where a run of events one side has could sit in several places (two
    // models of one architecture, one evaluated in one run only), the pairs
    // with the most equal values decide.
    slide_gaps(script, sa.data(), sb.data(), [&](int32_t i, int32_t j) {
      const auto ea = static_cast<std::size_t>(rp[p][i]), eb = static_cast<std::size_t>(sp[p][j]);
      const std::size_t ra = re.first_input(ea), rb = se.first_input(eb);
      if (re.end(ea) - ra != se.end(eb) - rb) return int64_t{0};
      int64_t equal = 0;
      for (std::size_t k = 0; k < re.end(ea) - ra; ++k) equal += values_equal(re, ra + k, se, rb + k);
      return equal;
    });
    for (const AlignStep& s : script) {
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
      Gap& g = rs.gaps[static_cast<std::size_t>(open_gap)];
      if (s.b >= 0) {
        rs.gap_of_suspect[static_cast<std::size_t>(sp[p][s.b])] = open_gap;
        g.add(se, static_cast<std::size_t>(sp[p][s.b]), pool_, false);
      } else {
        g.add(re, static_cast<std::size_t>(rp[p][s.a]), pool_, true);
      }
    }
  }
  // The suspect's execution order: start time, then stream and position.
  std::vector<int32_t> order(se.size());
  for (std::size_t j = 0; j < order.size(); ++j) order[j] = static_cast<int32_t>(j);
  if (se.c) {
    const auto& e = se.c->events;
    auto before = [&](int32_t x, int32_t y) {
      return std::tie(e.t_start_ns[x], e.stream[x], e.seq[x]) < std::tie(e.t_start_ns[y], e.stream[y], e.seq[y]);
    };
    if (!std::is_sorted(order.begin(), order.end(), before)) std::sort(order.begin(), order.end(), before);
  }
  for (std::size_t pos = 0; pos < order.size(); ++pos) {
    const auto b = static_cast<std::size_t>(order[pos]);
    classify(rs, re, se, partner[b], b, in_range, *sums[static_cast<int>(se.phase(b))], order, pos);
  }
  for (std::size_t i = 0; i < re.size(); ++i) {
    if (ref_matched[i]) continue;
    const formats::Phase phase = re.phase(i);
    if (trace_) trace_->add_reference_only(rs.reference_rank, ref->event(i));
    if (!in_range) continue;
    if (options_.list_events)
      report_.events.push_back({rs.suspect_rank, step, formats::phase_name(phase), pool_[re.op(i)],
                                formats::event_id_string(re.c->events.id[i]), std::nullopt, EventClass::kUnmatched,
                                true});
    auto& sum = *sums[static_cast<int>(phase)];
    if (brings_data_in(re, i, pool_)) {
      ++sum.unmatched_data_in;
      continue;
    }
    ++sum.counts[static_cast<int>(EventClass::kUnmatched)];
    ++sum.unmatched_reference;
    if (!rs.first_unmatched) {
      const Event ea = ref->event(i);
      rs.first_unmatched = describe(rs, &ea, nullptr, EventClass::kUnmatched, nullptr, 0);
    }
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
  // The steps in range, each read (and its signatures computed) on a helper
  // thread while the one before it is compared (where HDF5 is a thread-safe
  // build, as Debian's is; it serialises its own calls; else in turn):
  // reading and comparing overlap, and two steps of each run are in memory.
  std::vector<std::pair<int64_t, const std::pair<std::string, std::string>*>> todo;
  for (const auto& [step, paths] : steps) {
    if (options_.last_step && step > *options_.last_step) break;
    todo.emplace_back(step, &paths);
  }
  // The two runs' files of a step are read on two helpers: HDF5 serialises
  // the reads, but one run's signatures are computed while the other's file is read.
  struct Readers {
    std::future<LoadedStep> ref, sus;
  };
  const auto policy = formats::concurrent_step_reads() ? std::launch::async : std::launch::deferred;
  auto open = [policy](const std::pair<std::string, std::string>* paths) {
    return Readers{std::async(policy, load_step, paths->first, false),
                   std::async(policy, load_step, paths->second, true)};
  };
  Readers next;
  if (!todo.empty()) next = open(todo.front().second);
  for (std::size_t k = 0; k < todo.size(); ++k) {
    const int64_t step = todo[k].first;
    struct {
      LoadedStep ref, sus;
    } current{next.ref.get(), next.sus.get()};  // rethrows the reader's FormatError
    if (k + 1 < todo.size()) next = open(todo[k + 1].second);
    const bool in_range = !options_.first_step || step >= *options_.first_step;
    rs.forward_by_scope.assign(rs.forward_by_scope.size(), {});
    rs.backward_divergent_by_scope.assign(rs.backward_divergent_by_scope.size(), -1);
    if (in_range && (!current.ref.reader || !current.sus.reader)) {
      report_.diverged = true;
      report_.notes.push_back(fmt::format("step {} of rank {} is only in the {}", step, suspect_rank,
                                          current.ref.reader ? "reference" : "suspect"));
    }
    diff_step(rs, step, current.ref, current.sus, in_range);
  }
  for (auto& f : rs.found) found_.push_back(std::move(f));
  if (rs.first_unmatched) unmatched_.push_back(std::move(*rs.first_unmatched));
  if (rs.withheld) withheld_.push_back(std::move(*rs.withheld));
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
  // A region not named (note_withheld) that ran before the first divergent
  // operator, or where there is none: the earliest one.
  std::stable_sort(withheld_.begin(), withheld_.end(), [](const RankState::Withheld& x, const RankState::Withheld& y) {
    return std::tie(x.step, x.t_start_ns) < std::tie(y.step, y.t_start_ns);
  });
  if (!withheld_.empty()) {
    const auto& w = withheld_.front();
    const auto& f = report_.first_divergent;
    if (!f || std::tie(w.step, w.t_start_ns) < std::tie(f->step, f->t_start_ns)) report_.notes.push_back(w.note);
  }
  std::stable_sort(unmatched_.begin(), unmatched_.end(), earlier);
  if (!unmatched_.empty()) report_.first_unmatched = unmatched_.front();
  PhaseSummary& t = report_.totals;
  t.phase = "all";
  for (auto& [key, s] : summaries_) {
    for (int c = 0; c < kNumEventClasses; ++c) t.counts[c] += s.counts[c];
    t.unmatched_reference += s.unmatched_reference;
    t.unmatched_suspect += s.unmatched_suspect;
    t.unmatched_data_in += s.unmatched_data_in;
    t.not_compared += s.not_compared;
    report_.summary.push_back(s);
  }
  for (int c = 0; c < kNumEventClasses; ++c)
    if (c != static_cast<int>(EventClass::kSame) && t.counts[c] > 0) report_.diverged = true;
  if (t.unmatched_data_in > 0)
    report_.notes.push_back(fmt::format(
        "{} event(s) that bring data in from outside the recording (set_ of a Storage, the empty tensor it "
        "fills: a DataLoader's batches, rebuilt as they arrive) are in one run only at their place; not counted "
        "as a divergence: what reads their bits is compared",
        t.unmatched_data_in));
  const int64_t propagated = t.counts[static_cast<int>(EventClass::kPropagated)];
  if (options_.first_step && !report_.first_divergent && propagated > 0)
    report_.notes.push_back(fmt::format(
        "{} event(s) in the steps reported read bits that already differed before step {}: the divergence started "
        "earlier; run diff without --steps, or with an earlier first step, to name it",
        propagated, *options_.first_step));
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
        if (skip_volatile && kInfoOfBoth.count(k) && (!vx || !vy)) continue;
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
                                                   "program", "queue", "strict", "fingerprints"};
    return kContext.count(d.key) ? 3 : 2;
  };
  std::stable_sort(report.manifest_differences.begin(), report.manifest_differences.end(),
                   [&](const ManifestDifference& x, const ManifestDifference& y) { return rank_of(x) < rank_of(y); });
}

// A --steps range that selects none of the compared ranks' complete steps
// would report nothing compared as "the runs agree": refused instead (a torn
// step is never compared).
void check_step_range(const Side& a, const Side& b, const std::vector<std::pair<int, int>>& ranks,
                      const DiffOptions& options) {
  if (!options.first_step && !options.last_step) return;
  std::set<int64_t> steps;
  for (const auto& [ra, rb] : ranks) {
    for (const formats::RankFiles* f : {a.rank(ra), b.rank(rb)}) {
      for (const auto& [step, path] : f->steps) steps.insert(step);
    }
  }
  for (int64_t step : steps) {
    if ((!options.first_step || step >= *options.first_step) && (!options.last_step || step <= *options.last_step))
      return;
  }
  std::string range = fmt::format("{}:{}", options.first_step ? std::to_string(*options.first_step) : "",
                                  options.last_step ? std::to_string(*options.last_step) : "");
  if (options.first_step && options.first_step == options.last_step) range = std::to_string(*options.first_step);
  if (steps.empty())
    throw UsageError(fmt::format("--steps {} selects no step: the recordings have no complete step", range));
  throw UsageError(fmt::format("--steps {} selects no step: the recordings' complete steps are {} to {}", range,
                               *steps.begin(), *steps.rbegin()));
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
  check_step_range(ref, sus, ranks, options);
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
  check_step_range(side, side, {{rank_a, rank_b}}, options);
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
