// Trace-event format: https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU
// One process per run and rank, one thread track per recorded stream, "X"
// slices with the recorded durations, "s"/"f" flow arrows between aligned
// events that are not `same`, a "C" counter of the diverging events per step,
// and a global instant event at the first divergent operator.

#include "trace.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <set>

#include "opguard/core/error.h"

namespace opguard::bisect {
namespace {

// Chrome's reserved colour names (catapult's color_scheme.html).
const char* class_colour(EventClass c) {
  switch (c) {
    case EventClass::kSame: return "good";
    case EventClass::kOrigin: return "terrible";
    case EventClass::kOriginArgs: return "bad";
    case EventClass::kPropagated: return "yellow";
    case EventClass::kEntered: return "black";
    case EventClass::kUnmatched: return "grey";
  }
  return "grey";
}

int process_id(int run, int rank) { return 2 * rank + run + 1; }

}  // namespace

int32_t TraceLog::intern(const std::string& s) {
  auto it = index_.find(s);
  if (it != index_.end()) return it->second;
  const int32_t i = static_cast<int32_t>(names_.size());
  names_.push_back(s);
  index_.emplace(s, i);
  return i;
}

bool TraceLog::full(int run) {
  if (slices_[run].size() < limit_) return false;
  truncated_ = true;
  return true;
}

TraceLog::Slice TraceLog::make(int rank, const formats::Event& e, EventClass cls) {
  Slice s;
  s.rank = rank;
  s.stream = e.stream;
  s.t0 = e.t_start_ns;
  s.t1 = std::max(e.t_end_ns, e.t_start_ns);
  s.step = e.step;
  s.phase = static_cast<uint8_t>(e.phase);
  s.cls = cls;
  s.id = e.id;
  s.op = intern(formats::op_text(e.op, e.overload));
  s.scope = intern(e.scope);
  return s;
}

void TraceLog::add_suspect(int rank, const formats::Event& b, const formats::Event* a, EventClass cls,
                           const formats::TensorMeta* first_output) {
  if (full(1) || (a && full(0))) return;
  Slice sb = make(rank, b, cls);
  if (first_output && first_output->has_fingerprint()) {
    sb.has_fingerprint = true;
    sb.fingerprint = first_output->fingerprint;
  }
  if (a) {
    Slice sa = make(rank, *a, cls);
    for (const auto& o : a->outputs) {
      if (o.kind != formats::ValueKind::kTensor) continue;
      sa.has_fingerprint = o.tensor.has_fingerprint();
      sa.fingerprint = o.tensor.fingerprint;
      break;
    }
    sa.partner = static_cast<int64_t>(slices_[1].size());
    sb.partner = static_cast<int64_t>(slices_[0].size());
    slices_[0].push_back(sa);
  }
  slices_[1].push_back(sb);
}

void TraceLog::add_reference_only(int rank, const formats::Event& a) {
  if (full(0)) return;
  slices_[0].push_back(make(rank, a, EventClass::kUnmatched));
}

void TraceLog::write(const std::string& path, const DiffReport& report) const {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw IoError(fmt::format("cannot write the trace {}: {}", path, std::strerror(errno)));
  const std::string dirs[2] = {report.reference_dir, report.suspect_dir};
  const char* runs[2] = {"reference", "suspect"};
  // Each run's clock starts at its first event, so the two runs line up.
  int64_t origin[2];
  for (int run = 0; run < 2; ++run) {
    origin[run] = std::numeric_limits<int64_t>::max();
    for (const auto& s : slices_[run]) origin[run] = std::min(origin[run], s.t0);
  }
  auto us = [&](int run, int64_t t) { return static_cast<double>(t - origin[run]) / 1000.0; };
  // Evidence of the listed origins, by (rank, suspect id).
  std::map<std::pair<int, std::string>, const DivergentEvent*> evidence;
  for (const auto& d : report.origins)
    if (d.suspect_id) evidence[{d.rank, *d.suspect_id}] = &d;
  const DivergentEvent* first = report.first_divergent ? &*report.first_divergent : nullptr;

  bool comma = false;
  out << "{\"displayTimeUnit\":\"ns\",\"otherData\":" << nlohmann::json{{"tool", "opguard diff"},
                                                                       {"reference", report.reference_dir},
                                                                       {"suspect", report.suspect_dir},
                                                                       {"truncated", truncated_}}
                                                             .dump()
      << ",\"traceEvents\":[\n";
  auto emit = [&](const nlohmann::json& j) {
    if (comma) out << ",\n";
    out << j.dump();
    comma = true;
  };
  for (int run = 0; run < 2; ++run) {
    std::set<std::pair<int, uint32_t>> tracks;
    for (const auto& s : slices_[run]) tracks.insert({s.rank, s.stream});
    std::set<int> ranks;
    for (const auto& t : tracks) ranks.insert(t.first);
    for (int r : ranks) {
      const int pid = process_id(run, r);
      emit({{"ph", "M"}, {"name", "process_name"}, {"pid", pid},
            {"args", {{"name", fmt::format("{} {} rank {}", runs[run], dirs[run], r)}}}});
      emit({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
    }
    for (const auto& [r, stream] : tracks)
      emit({{"ph", "M"}, {"name", "thread_name"}, {"pid", process_id(run, r)}, {"tid", stream + 1},
            {"args", {{"name", stream == 0 ? std::string("stream 0 (main thread)") : fmt::format("stream {}", stream)}}}});
  }
  for (int run = 0; run < 2; ++run) {
    for (const auto& s : slices_[run]) {
      const std::string& op = names_[s.op];
      const std::string id = formats::event_id_string(s.id);
      const bool is_first = first && run == 1 && first->rank == s.rank && first->suspect_id == id;
      std::string name = s.cls == EventClass::kSame ? op : fmt::format("{} [{}]", op, event_class_name(s.cls));
      if (is_first) name = "FIRST DIVERGENT " + name;
      nlohmann::json args = {{"id", id},
                             {"step", s.step},
                             {"phase", formats::phase_name(static_cast<formats::Phase>(s.phase))},
                             {"scope", names_[s.scope]},
                             {"class", event_class_name(s.cls)}};
      if (s.has_fingerprint) args["output_fingerprint"] = fmt::format("{:016x}", s.fingerprint);
      if (s.partner >= 0) {
        const Slice& p = slices_[1 - run][s.partner];
        args[run == 0 ? "suspect_id" : "reference_id"] = formats::event_id_string(p.id);
      }
      if (run == 1) {
        auto e = evidence.find({s.rank, id});
        if (e != evidence.end()) {
          nlohmann::json metrics = nlohmann::json::array();
          for (const auto& ev : e->second->evidence)
            metrics.push_back({{"value", fmt::format("{} {}", ev.output ? "output" : "input", ev.position)},
                               {"differing", ev.metrics.differing},
                               {"numel", ev.metrics.numel},
                               {"max_ulp", ev.metrics.max_ulp},
                               {"max_abs_error", ev.metrics.max_abs_error},
                               {"max_rel_error", ev.metrics.max_rel_error}});
          args["metrics"] = metrics;
        }
      }
      emit({{"ph", "X"}, {"name", name}, {"cat", event_class_name(s.cls)}, {"cname", class_colour(s.cls)},
            {"pid", process_id(run, s.rank)}, {"tid", s.stream + 1}, {"ts", us(run, s.t0)},
            {"dur", static_cast<double>(s.t1 - s.t0) / 1000.0}, {"args", args}});
      if (is_first)
        emit({{"ph", "i"}, {"s", "g"}, {"name", "first divergent operator: " + op + " (" + id + ")"},
              {"pid", process_id(run, s.rank)}, {"tid", s.stream + 1}, {"ts", us(run, s.t0)}, {"cname", "terrible"}});
    }
  }
  // Flow arrows between aligned events that differ (all pairs would bury the
  // view under arrows between identical events).
  uint64_t flow_id = 1;
  for (const auto& s : slices_[1]) {
    if (s.partner < 0 || s.cls == EventClass::kSame) continue;
    const Slice& a = slices_[0][s.partner];
    emit({{"ph", "s"}, {"id", flow_id}, {"name", "aligned"}, {"cat", "alignment"}, {"pid", process_id(0, a.rank)},
          {"tid", a.stream + 1}, {"ts", us(0, a.t0)}});
    emit({{"ph", "f"}, {"bp", "e"}, {"id", flow_id}, {"name", "aligned"}, {"cat", "alignment"},
          {"pid", process_id(1, s.rank)}, {"tid", s.stream + 1}, {"ts", us(1, s.t0)}});
    ++flow_id;
  }
  // Divergence magnitude: events whose bits differ, per step, on each suspect rank.
  std::map<std::pair<int, int64_t>, std::pair<int64_t, int64_t>> per_step;  // -> (start, count)
  for (const auto& s : slices_[1]) {
    auto it = per_step.find({s.rank, s.step});
    if (it == per_step.end()) it = per_step.emplace(std::make_pair(s.rank, s.step), std::make_pair(s.t0, int64_t{0})).first;
    it->second.first = std::min(it->second.first, s.t0);
    it->second.second += s.cls != EventClass::kSame;
  }
  for (const auto& [key, v] : per_step)
    emit({{"ph", "C"}, {"name", "diverging events per step"}, {"pid", process_id(1, key.first)},
          {"ts", us(1, v.first)}, {"args", {{"events", v.second}}}});
  out << "\n]}\n";
  out.flush();
  if (!out) throw IoError(fmt::format("cannot write the trace {}: {}", path, std::strerror(errno)));
}

}  // namespace opguard::bisect
