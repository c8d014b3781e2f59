// The diff report as JSON (schema "opguard-diff/1") and as text. docs/DIFF.md
// documents both; change the schema name when a field changes meaning.

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>

#include "opguard/bisect/diff.h"
#include "opguard/formats/recording.h"

namespace opguard::bisect {
namespace {

using nlohmann::json;

json optional_json(const std::optional<std::string>& s) { return s ? json(*s) : json(nullptr); }

// JSON has no Inf or NaN: they become strings.
json number_json(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

json ulp_json(uint64_t ulp) { return ulp == kernels::kUlpInfinite ? json("inf") : json(ulp); }

json metrics_json(const kernels::CompareResult& m) {
  return {{"numel", m.numel},
          {"differing", m.differing},
          {"differing_fraction", m.differing_fraction()},
          {"max_ulp", m.floating ? ulp_json(m.max_ulp) : json(nullptr)},
          {"max_abs_error", number_json(m.max_abs_error)},
          {"max_rel_error", m.floating ? number_json(m.max_rel_error) : json(nullptr)},
          {"first_index", m.first_index},
          {"first_reference", number_json(m.first_a)},
          {"first_suspect", number_json(m.first_b)},
          {"first_reference_bits", fmt::format("{:x}", m.first_a_bits)},
          {"first_suspect_bits", fmt::format("{:x}", m.first_b_bits)},
          {"nan", {{"reference", m.nan_a}, {"suspect", m.nan_b}}},
          {"inf", {{"reference", m.inf_a}, {"suspect", m.inf_b}}}};
}

json event_json(const DivergentEvent& d) {
  json j = {{"class", event_class_name(d.cls)},
            {"rank", d.rank},
            {"reference_rank", d.reference_rank},
            {"step", d.step},
            {"phase", d.phase},
            {"stream", d.stream},
            {"scope", d.scope},
            {"op", d.op},
            {"overload", d.overload},
            {"call_index", d.call_index},
            {"reference_id", optional_json(d.reference_id)},
            {"suspect_id", optional_json(d.suspect_id)},
            {"outputs_differ", d.outputs_differ},
            {"show_command", d.show_command}};
  json differing = json::array();
  for (const auto& v : d.differing)
    differing.push_back({{"output", v.output},
                         {"position", v.position},
                         {"name", v.name},
                         {"kind", v.kind},
                         {"reference", v.reference},
                         {"suspect", v.suspect}});
  j["differing"] = differing;
  if (d.region) {
    const UnmatchedRegion& r = *d.region;
    j["region"] = {{"reference_ids", r.reference_ids}, {"reference_ops", r.reference_ops},
                   {"reference_events", r.reference_events}, {"suspect_ids", r.suspect_ids},
                   {"suspect_ops", r.suspect_ops}, {"suspect_events", r.suspect_events},
                   {"consumer_id", r.consumer_id}, {"consumer_op", r.consumer_op},
                   {"consumer_input", r.consumer_input}, {"reference_bits", r.reference_bits},
                   {"suspect_bits", r.suspect_bits}};
  }
  if (d.cls == EventClass::kEntered) {
    j["entered"] = {{"input", d.entered_input},
                    {"side", d.entered_side},
                    {"producer_id", optional_json(d.producer_id)},
                    {"producer_reference_id", optional_json(d.producer_reference_id)},
                    {"producer_op", d.producer_op},
                    {"producer_step", d.producer_step},
                    {"brought_in", d.brought_in},
                    {"reference_read_other", d.reference_read_other}};
  }
  json evidence = json::array();
  for (const auto& e : d.evidence)
    evidence.push_back({{"output", e.output},
                        {"position", e.position},
                        {"name", e.name},
                        {"dtype", e.dtype},
                        {"sizes", e.sizes},
                        {"metrics", metrics_json(e.metrics)}});
  j["evidence"] = evidence;
  j["evidence_note"] = d.evidence_note;
  if (!d.cause_note.empty()) j["cause_note"] = d.cause_note;
  if (!d.state_note.empty()) j["state_note"] = d.state_note;
  if (d.saved_reader)
    j["saved_for_backward"] = {{"reader", *d.saved_reader},
                               {"reader_op", d.saved_reader_op},
                               {"input", d.saved_input},
                               {"forward_events_of_scope", d.saved_candidates}};
  j["rerecord_command"] = d.rerecord_command;
  return j;
}

json summary_json(const PhaseSummary& s) {
  json counts;
  for (int c = 0; c < kNumEventClasses; ++c) counts[event_class_name(static_cast<EventClass>(c))] = s.counts[c];
  return {{"rank", s.rank},
          {"step", s.step},
          {"phase", s.phase},
          {"counts", counts},
          {"unmatched_reference", s.unmatched_reference},
          {"unmatched_suspect", s.unmatched_suspect},
          {"not_compared", s.not_compared},
          {"unmatched_data_in", s.unmatched_data_in}};
}

std::string value_label(bool output, int position, const std::string& name) {
  return fmt::format("{} {}{}", output ? "output" : "input", position, name.empty() ? "" : " (" + name + ")");
}

std::string dims_text(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (std::size_t i = 0; i < d.size(); ++i) s += (i ? "," : "") + std::to_string(d[i]);
  return s + "]";
}

// "aten::a (event 3), aten::b (event 4)"; where the list holds only the
// first and last halves of more (UnmatchedRegion), how many are between.
std::string events_text(const std::vector<std::string>& ops, const std::vector<std::string>& ids, int64_t total) {
  const auto listed = static_cast<int64_t>(ops.size());
  std::string t;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (total > listed && i == ops.size() / 2) t += fmt::format(", ... {} more ...", total - listed);
    t += fmt::format("{}{} (event {})", i ? ", " : "", ops[i], ids[i]);
  }
  return t.empty() ? "nothing" : t;
}

std::string region_text(const DivergentEvent& d, const DiffReport& r) {
  const UnmatchedRegion& g = *d.region;
  std::string t = fmt::format("  {} op{} of the reference, {} of the suspect, that do not align  [origin: a region]\n",
                              g.reference_events, g.reference_events == 1 ? "" : "s", g.suspect_events);
  t += fmt::format("    step {}, rank {}, {}, scope {}\n", d.step, d.rank, d.phase, d.scope.empty() ? "(top)" : d.scope);
  t += fmt::format("    {} ran {}\n", r.reference_dir, events_text(g.reference_ops, g.reference_ids, g.reference_events));
  t += fmt::format("    {} ran {}\n", r.suspect_dir, events_text(g.suspect_ops, g.suspect_ids, g.suspect_events));
  t += "    their inputs are bitwise equal in both runs; their result differs where it is read:\n";
  t += fmt::format("    {} (event {}) input {}: {} | {}\n", g.consumer_op, g.consumer_id, g.consumer_input,
                   g.reference_bits, g.suspect_bits);
  if (g.reference_events == 1)
    t += fmt::format("    replay the reference's op under the suspect's config: opguard replay {} --event {} --config "
                     "KNOBS (the suspect's, declared ones such as tp=2 included), or let opguard bisect run {} {} "
                     "-o DIR find them\n",
                     r.reference_dir, d.reference_id.value_or(""), r.reference_dir, r.suspect_dir);
  return t;
}

std::string event_text(const DivergentEvent& d, const DiffReport& r) {
  std::string t;
  const std::string op = formats::op_text(d.op, d.overload);
  if (d.region) t += region_text(d, r);
  else t += fmt::format("  {}  [{}]\n", op, event_class_name(d.cls));
  if (!d.region) {
    t += fmt::format("    step {}, rank {}, {}, scope {}, call {} of this op in this scope and phase\n", d.step, d.rank,
                     d.phase, d.scope.empty() ? "(top)" : d.scope, d.call_index);
    t += fmt::format("    event {} in {}, {} in {}\n", d.reference_id.value_or("-"), r.reference_dir,
                     d.suspect_id.value_or("-"), r.suspect_dir);
  }
  if (d.cls == EventClass::kOrigin && !d.region && d.saved_reader)
    t += fmt::format("    inputs, arguments and returned outputs bitwise equal; a tensor it saved for the backward pass "
                     "without returning it differs: {} of {} (event {}, backward){}\n",
                     d.saved_input, d.saved_reader_op, *d.saved_reader,
                     d.saved_candidates > 1
                         ? fmt::format(" (the last of the {} forward operators of this scope in this step, any of "
                                       "which may have saved it)", d.saved_candidates)
                         : "");
  else if (d.cls == EventClass::kOrigin && !d.region)
    t += "    inputs and arguments bitwise equal; outputs differ\n";
  if (d.cls == EventClass::kOriginArgs)
    t += fmt::format("    tensor inputs bitwise equal; an argument differs; outputs {}\n",
                     d.outputs_differ ? "differ" : d.evidence_note.rfind("no outputs recorded", 0) == 0 ? "not recorded" : "equal");
  if (!d.state_note.empty()) t += "    " + d.state_note + "\n";
  for (const auto& v : d.differing)
    t += fmt::format("    {} {}: {} | {}\n", value_label(v.output, v.position, v.name), v.kind, v.reference, v.suspect);
  if (d.cls == EventClass::kEntered) {
    t += fmt::format("    {} carries bits that no operator produced differently", d.entered_input);
    if (d.producer_id && d.brought_in)
      t += fmt::format(": brought in by {} (event {}{}, step {}) from an argument the recording does not hold "
                       "(data from outside the recording: a DataLoader worker's batch, a loaded checkpoint)\n",
                       d.producer_op, *d.producer_id,
                       d.producer_reference_id ? ", reference " + *d.producer_reference_id : "", d.producer_step);
    else if (d.producer_id && d.reference_read_other)
      t += fmt::format(": the suspect read what {} made (event {}{}, step {}), equal in both runs, and the reference's "
                       "op read another tensor, not one that event touched: the two ops paired here are likely not the "
                       "same computation (computations of equal signatures run in another order, such as parameter "
                       "groups listed otherwise), rather than memory changed outside the dispatcher\n",
                       d.producer_op, *d.producer_id,
                       d.producer_reference_id ? ", reference " + *d.producer_reference_id : "", d.producer_step);
    else if (d.producer_id)
      t += fmt::format(": last produced by {} (event {}{}, step {}), then changed outside the dispatcher in the {}\n",
                       d.producer_op, *d.producer_id,
                       d.producer_reference_id ? ", reference " + *d.producer_reference_id : "", d.producer_step,
                       d.entered_side);
    else
      t += ": no event of the recording produced them (data from outside the recording)\n";
  }
  for (const auto& e : d.evidence) {
    const auto& m = e.metrics;
    t += fmt::format("    evidence {} {} {}: {} of {} elements differ ({:.3g}%)", value_label(e.output, e.position, e.name),
                     e.dtype, dims_text(e.sizes), m.differing, m.numel, 100.0 * m.differing_fraction());
    if (m.floating)
      t += fmt::format(", max {} ulp, max abs {:.3g}, max rel {:.3g}",
                       m.max_ulp == kernels::kUlpInfinite ? std::string("inf") : std::to_string(m.max_ulp),
                       m.max_abs_error, m.max_rel_error);
    else
      t += fmt::format(", max abs {:.3g}", m.max_abs_error);
    if (m.first_index >= 0)
      t += fmt::format(", first at flat index {}: {:.9g} | {:.9g} (bits {:x} | {:x})", m.first_index, m.first_a, m.first_b,
                       m.first_a_bits, m.first_b_bits);
    if (m.floating) t += fmt::format(", NaN {}|{}, Inf {}|{}", m.nan_a, m.nan_b, m.inf_a, m.inf_b);
    t += "\n";
  }
  if (!d.evidence_note.empty()) t += "    " + d.evidence_note + "\n";
  if (!d.cause_note.empty()) t += "    " + d.cause_note + "\n";
  if (!d.rerecord_command.empty()) {
    std::string cmd = d.rerecord_command;
    for (std::size_t p = 0; (p = cmd.find('\n', p)) != std::string::npos; p += 7) cmd.replace(p, 1, "\n      ");
    t += "      " + cmd + "\n";
  }
  t += "    look at it: " + d.show_command + "\n";
  return t;
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= s.size()) {
    const std::size_t end = s.find('\n', start);
    out.push_back(s.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return out;
}

// One line per difference; a multi-line value (torch's build configuration)
// shows only the lines that differ.
std::string manifest_difference_text(const ManifestDifference& d) {
  const std::string a = d.reference.value_or("<missing>"), b = d.suspect.value_or("<missing>");
  if (a.find('\n') == std::string::npos && b.find('\n') == std::string::npos)
    return fmt::format("  {}.{}: {} | {}\n", d.section, d.key, a, b);
  const auto la = lines(a), lb = lines(b);
  std::string t = fmt::format("  {}.{} (lines that differ):\n", d.section, d.key);
  const std::size_t n = std::max(la.size(), lb.size());
  for (std::size_t i = 0; i < n; ++i) {
    const std::string x = i < la.size() ? la[i] : "", y = i < lb.size() ? lb[i] : "";
    if (x != y) t += fmt::format("    {} | {}\n", x, y);
  }
  return t;
}

// The last line. Runs whose only differences are events one run has (no
// aligned event differs: a tensor-parallel split that happens to give the
// unsplit bits) say so: nothing computed differently where both ran it.
std::string verdict_line(const DiffReport& r) {
  if (!r.diverged) return "runs agree bitwise\n";
  const auto& c = r.totals.counts;
  int64_t differing = 0;
  for (int k = 1; k < kNumEventClasses; ++k)
    if (k != static_cast<int>(EventClass::kUnmatched)) differing += c[k];
  const int64_t unmatched = c[static_cast<int>(EventClass::kUnmatched)];
  if (!r.first_divergent && differing == 0 && unmatched > 0 && r.notes.empty())
    return fmt::format("runs diverge in structure only: {} event(s) only one run has; every aligned event is same\n",
                       unmatched);
  return "runs diverge\n";
}

}  // namespace

std::string report_json(const DiffReport& r) {
  json j = {{"schema", "opguard-diff/1"},
            {"mode", r.mode},
            {"reference", r.reference_dir},
            {"suspect", r.suspect_dir},
            {"ranks", r.ranks},
            {"diverged", r.diverged},
            {"events_reference", r.events_reference},
            {"events_suspect", r.events_suspect}};
  json md = json::array();
  for (const auto& d : r.manifest_differences)
    md.push_back({{"section", d.section},
                  {"key", d.key},
                  {"reference", optional_json(d.reference)},
                  {"suspect", optional_json(d.suspect)},
                  {"ranks", d.ranks}});
  j["manifest_differences"] = md;
  json torn = json::array();
  for (const auto& t : r.torn_steps) torn.push_back({{"run", t.run}, {"rank", t.rank}, {"step", t.step}, {"path", t.path}});
  j["torn_steps"] = torn;
  j["first_divergent"] = r.first_divergent ? event_json(*r.first_divergent) : json(nullptr);
  j["first_unmatched"] = r.first_unmatched ? event_json(*r.first_unmatched) : json(nullptr);
  json origins = json::array();
  for (const auto& d : r.origins) origins.push_back(event_json(d));
  j["origins"] = origins;
  json summary = json::array();
  for (const auto& s : r.summary) summary.push_back(summary_json(s));
  j["summary"] = summary;
  j["totals"] = summary_json(r.totals);
  j["notes"] = r.notes;
  if (!r.events.empty()) {
    json events = json::array();
    for (const auto& e : r.events)
      events.push_back({{"rank", e.rank},
                        {"step", e.step},
                        {"phase", e.phase},
                        {"op", e.op},
                        {"reference_id", optional_json(e.reference_id)},
                        {"suspect_id", optional_json(e.suspect_id)},
                        {"class", e.compared ? event_class_name(e.cls) : "not-compared"}});
    j["events"] = events;
  }
  j["trace"] = r.trace_path.empty() ? json(nullptr) : json(r.trace_path);
  j["trace_truncated"] = r.trace_truncated;
  return j.dump(2) + "\n";
}

std::string report_text(const DiffReport& r) {
  std::string t;
  if (r.mode == "ranks")
    t += fmt::format("opguard diff {} --ranks {},{}: rank {} is the reference, rank {} the suspect\n", r.reference_dir,
                     r.ranks.at(0), r.ranks.at(1), r.ranks.at(0), r.ranks.at(1));
  else
    t += fmt::format("opguard diff {} (reference) {} (suspect)\n", r.reference_dir, r.suspect_dir);
  if (!r.manifest_differences.empty()) {
    t += fmt::format("manifests differ in {} key(s) (reference | suspect):\n", r.manifest_differences.size());
    for (const auto& d : r.manifest_differences) t += manifest_difference_text(d);
  } else if (r.ranks.empty()) {
    t += "manifests not compared: no rank is in both runs\n";
  } else {
    t += "manifests agree (apart from times, pids and sizes)\n";
  }
  for (const auto& n : r.notes) t += "note: " + n + "\n";
  if (r.first_divergent) {
    t += "first divergent operator:\n" + event_text(*r.first_divergent, r);
    if (r.origins.size() > 1) {
      t += fmt::format("further divergence sources ({} listed; --max-origins):\n", r.origins.size() - 1);
      for (std::size_t i = 1; i < r.origins.size(); ++i) t += event_text(r.origins[i], r);
    }
  } else {
    t += "no divergent operator: no origin, origin-args or entered event\n";
  }
  if (r.first_unmatched) t += "first unmatched event:\n" + event_text(*r.first_unmatched, r);
  t += "summary (events per class):\n";
  t += fmt::format("  {:>4} {:>6} {:<9} {:>8} {:>7} {:>11} {:>10} {:>7} {:>9}{}\n", "rank", "step", "phase", "same",
                   "origin", "origin-args", "propagated", "entered", "unmatched", r.mode == "ranks" ? "  not-compared" : "");
  auto row = [&](const PhaseSummary& s, const std::string& rank, const std::string& step) {
    std::string line = fmt::format("  {:>4} {:>6} {:<9}", rank, step, s.phase);
    for (int c = 0; c < kNumEventClasses; ++c) {
      static const int widths[kNumEventClasses] = {8, 7, 11, 10, 7, 9};
      line += fmt::format(" {:>{}}", s.counts[c], widths[c]);
    }
    if (r.mode == "ranks") line += fmt::format("  {:>12}", s.not_compared);
    return line + "\n";
  };
  // Steps in which every event is `same` collapse into one line each run of them.
  std::size_t i = 0;
  while (i < r.summary.size()) {
    auto clean = [&](std::size_t k) {
      const auto& s = r.summary[k];
      int64_t other = 0;
      for (int c = 1; c < kNumEventClasses; ++c) other += s.counts[c];
      return other == 0;
    };
    if (clean(i)) {
      std::size_t k = i;
      int64_t same = 0;
      while (k < r.summary.size() && clean(k) && r.summary[k].rank == r.summary[i].rank) same += r.summary[k++].counts[0];
      if (k - i > 1) {
        // Whole steps, or where a step's other phases have rows of their own,
        // the phases the line stands for.
        const auto& first = r.summary[i];
        const auto& last = r.summary[k - 1];
        const bool whole = (i == 0 || r.summary[i - 1].step != first.step || r.summary[i - 1].rank != first.rank) &&
                           (k == r.summary.size() || r.summary[k].step != last.step || r.summary[k].rank != last.rank);
        const std::string span =
            whole ? fmt::format("steps {}..{}", first.step, last.step)
                  : fmt::format("step {} {} to step {} {}", first.step, first.phase, last.step, last.phase);
        t += fmt::format("  {:>4} {:>6} {:<9} {:>8}   ({}: every event same)\n", first.rank,
                         fmt::format("{}-{}", first.step, last.step), "*", same, span);
        i = k;
        continue;
      }
    }
    t += row(r.summary[i], std::to_string(r.summary[i].rank), std::to_string(r.summary[i].step));
    ++i;
  }
  t += row(r.totals, "all", "all");
  if (!r.trace_path.empty())
    t += fmt::format("trace: {}{} (open it in ui.perfetto.dev or chrome://tracing)\n", r.trace_path,
                     r.trace_truncated ? ", truncated to the first events" : "");
  t += verdict_line(r);
  return t;
}

}  // namespace opguard::bisect
