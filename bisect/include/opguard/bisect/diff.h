#pragma once
// opguard diff: align two recordings event by event and name the first
// divergent operator (DESIGN.md, Rules 1-3). No torch: this reads recordings
// through opguard_formats only. docs/DIFF.md documents the classes, the text
// output and the JSON schema that report_json() writes.

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "opguard/kernels/compare.h"

namespace opguard::bisect {

// The class of an event of an aligned pair (a from the reference, b from the
// suspect); kUnmatched is an event present in one run only.
enum class EventClass : uint8_t { kSame = 0, kOrigin, kOriginArgs, kPropagated, kEntered, kUnmatched };
inline constexpr int kNumEventClasses = 6;
const char* event_class_name(EventClass c);  // "same", "origin", "origin-args", ...
// origin, origin-args and entered: where different bits first appear.
inline bool is_divergence_source(EventClass c) {
  return c == EventClass::kOrigin || c == EventClass::kOriginArgs || c == EventClass::kEntered;
}

struct DiffOptions {
  std::optional<int> rank;           // only this rank (default: every rank both runs have)
  std::optional<int64_t> first_step;  // report steps in [first_step, last_step] (inclusive); the
  std::optional<int64_t> last_step;   // steps before first_step are still read for dataflow
  int max_origins = 5;               // divergence sources listed in the report
  std::string trace_path;            // write a Chrome trace-event JSON file there ("" = none)
  std::size_t trace_event_limit = 200000;  // slices per run in the trace; beyond: trace_truncated
  std::string opguard_command = "opguard";  // how printed commands start (the CLI passes its path)
  int dump_radius = 16;              // R of the printed `--dump-around ID:R`
  bool list_events = false;          // fill DiffReport::events (every event in range and its class)
};

// One argument or output that differs between the two events of a pair.
struct DifferingValue {
  bool output = false;
  int position = 0;     // index in Event::inputs or Event::outputs (tensor-list elements count)
  std::string name;     // schema name ("self", "approximate", "<default_generator>"), may be ""
  std::string kind;     // formats::value_kind_name
  std::string reference, suspect;  // fingerprint as 16 hex digits, or the value's text; "<missing>"
};

// compare.h metrics of one differing tensor for which both runs hold full data.
struct TensorEvidence {
  bool output = true;
  int position = 0;
  std::string name;
  std::string dtype;
  std::vector<int64_t> sizes;
  kernels::CompareResult metrics;
};

// A divergence source that is not one operator: the events between the same
// two aligned events that only one recording has (another decomposition of
// the same computation, such as a tensor-parallel split of a matmul; a fused,
// inserted or deleted op), whose inputs in the suspect were bitwise equal to
// the reference's and whose result, read by an aligned event, differs. It is
// reported as an `origin` (DESIGN.md, "Boundary": runs with different
// internals are compared where their dataflow meets again). Each id list
// holds every id up to kMaxRegionEvents, else the first and the last
// kMaxRegionEvents / 2; the counts are complete.
struct UnmatchedRegion {
  static constexpr std::size_t kMaxRegionEvents = 16;
  std::vector<std::string> reference_ids, reference_ops;  // the reference's events of the gap, in order
  std::vector<std::string> suspect_ids, suspect_ops;      // the suspect's
  int64_t reference_events = 0, suspect_events = 0;
  std::string consumer_id, consumer_op;  // the first aligned suspect event that read a differing result of it
  int consumer_input = 0;                // that input's position
  std::string reference_bits, suspect_bits;  // the fingerprints it read (16 hex digits)
};

struct DivergentEvent {
  EventClass cls = EventClass::kSame;
  // Set for an origin that is a region of unmatched events; op, scope and
  // reference_id then name the reference's event when the gap holds exactly
  // one (the operator to replay under the suspect's config), suspect_id the
  // suspect's first event of the gap.
  std::optional<UnmatchedRegion> region;
  int rank = 0;            // the suspect's rank (cross-rank mode: rank B)
  int reference_rank = 0;  // the reference's rank (cross-rank mode: rank A)
  int64_t step = 0;
  std::string phase;
  uint32_t stream = 0;
  std::string scope, op, overload;
  int64_t call_index = 0;  // earlier events with the same op and scope in this step and phase
  std::optional<std::string> reference_id, suspect_id;  // event ids; absent on the side it lacks
  int64_t t_start_ns = 0;  // suspect (or reference, for reference-only events)
  int64_t t_end_ns = 0;
  // A collective (c10d::) whose inputs on this rank are bitwise equal in both
  // runs but whose outputs differ: the difference can have come from another
  // rank's contribution, so it is ordered by when it ended (it cannot end
  // before the other ranks' inputs were made) and, where another rank
  // diverged first, says so in `cause_note`.
  bool collective_equal_inputs = false;
  std::string cause_note;
  // The two runs called the op in other states that decide its kernel (grad
  // mode, autocast, default dtype, inputs requiring grad): "" where they agree.
  std::string state_note;
  bool outputs_differ = false;
  std::vector<DifferingValue> differing;
  // propagated: the event of the suspect that produced the differing bits.
  std::optional<std::string> propagated_from;
  // entered: which input carried bits no operator produced differently, and the
  // suspect's event that last wrote that storage (absent: it came from outside
  // the recording); the consumer is this event.
  std::string entered_input;
  std::string entered_side;  // "suspect": its bits changed after the producer; "reference": the reference's did
  std::optional<std::string> producer_id;           // the suspect's event id
  std::optional<std::string> producer_reference_id;  // the aligned event of the reference, if any
  std::string producer_op;
  int64_t producer_step = 0;
  // The producer brought the bits in from an argument the recording does not
  // hold (set_ of a Storage): data from outside the recording, not changed
  // after it.
  bool brought_in = false;
  // entered on the reference's side, and the reference's op read a storage
  // that the producer's aligned reference event did not touch: the reference
  // read another tensor, so the pair is likely two computations of equal
  // signatures that the runs ran in another order, not memory changed
  // outside the dispatcher (only checked where the producer is in this step).
  bool reference_read_other = false;
  // An origin whose returned outputs are bitwise equal in both runs (as are its
  // inputs), named because a tensor it saved for the backward pass without
  // returning it differs (a composite op's intermediate: cross_entropy_loss's
  // log_softmax). `saved_reader` is the backward event that read it (suspect
  // id), `saved_input` that input's name, `saved_candidates` how many forward
  // events of the scope ran this step (more than one: this one, the last,
  // stands for them). Replay compares returned outputs only.
  std::optional<std::string> saved_reader;
  std::string saved_reader_op, saved_input;
  int saved_candidates = 0;
  // Evidence: full-tensor metrics where both runs hold the data; otherwise a
  // sentence saying what is missing and the command that re-records the window.
  std::vector<TensorEvidence> evidence;
  std::string evidence_note;
  std::string rerecord_command;
  std::string show_command;  // `opguard show SUSPECT --event ID [--rank R]`
};

// The class of one event (DiffOptions::list_events).
struct EventVerdict {
  int rank = 0;
  int64_t step = 0;
  std::string phase;
  std::string op;
  std::optional<std::string> reference_id, suspect_id;
  EventClass cls = EventClass::kSame;
  bool compared = true;  // cross-rank mode: false for events replicas need not agree on
};

struct PhaseSummary {
  int rank = 0;
  int64_t step = 0;
  std::string phase;
  std::array<int64_t, kNumEventClasses> counts{};  // kUnmatched counts both sides
  int64_t unmatched_reference = 0;
  int64_t unmatched_suspect = 0;
  int64_t not_compared = 0;  // cross-rank mode: events whose outputs need not be replicated
  // Events of one run only that bring data in from outside (a DataLoader's
  // set_ of a Storage and the empty tensor it fills): not counted as
  // unmatched, since batches arrive in a timing-dependent order.
  int64_t unmatched_data_in = 0;
};

struct ManifestDifference {
  std::string section;  // "info", "env" or "manifest" (format_version, world_size)
  std::string key;
  std::optional<std::string> reference, suspect;  // absent: the key is missing on that side
  std::vector<int> ranks;
};

struct TornStep {
  std::string run;  // "reference" or "suspect"
  int rank = 0;
  int64_t step = 0;
  std::string path;
};

struct DiffReport {
  std::string mode = "runs";  // "runs" or "ranks"
  std::string reference_dir, suspect_dir;
  std::vector<int> ranks;  // compared ranks (cross-rank mode: {A, B})
  std::vector<ManifestDifference> manifest_differences;
  std::vector<TornStep> torn_steps;
  std::optional<DivergentEvent> first_divergent;  // first origin / origin-args / entered
  std::optional<DivergentEvent> first_unmatched;
  std::vector<DivergentEvent> origins;  // first max_origins divergence sources, execution order
  std::vector<PhaseSummary> summary;    // by rank, step, phase
  std::vector<EventVerdict> events;     // list_events only: suspect execution order, then reference-only events
  PhaseSummary totals;
  int64_t events_reference = 0, events_suspect = 0;  // read, within the step range
  bool diverged = false;  // any event in range other than `same`, or a rank/step missing
  std::vector<std::string> notes;
  std::string trace_path;
  bool trace_truncated = false;
};

// Throws FormatError for a directory that is not a recording, UsageError for a
// --rank neither has.
DiffReport diff_recordings(const std::string& reference, const std::string& suspect, const DiffOptions& options);
// Cross-rank mode: rank_a of `run` is the reference, rank_b the suspect; only
// events whose outputs must agree on data-parallel replicas are compared.
DiffReport diff_ranks(const std::string& run, int rank_a, int rank_b, const DiffOptions& options);

// The report as JSON, schema "opguard-diff/1" (docs/DIFF.md).
std::string report_json(const DiffReport& report);
// The report as the text `opguard diff` prints (docs/DIFF.md, "Text output").
std::string report_text(const DiffReport& report);

}  // namespace opguard::bisect
