// JSON of replay results (--json, and the parent/child protocol of
// process-wide trials) and of child requests.

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>

#include "opguard/core/error.h"
#include "replay_internal.h"

namespace opguard::replay {
namespace {

using nlohmann::json;

// JSON has no Inf or NaN: write them as strings so the child's metrics survive.
json number(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  return d;
}
double number_from(const json& j) {
  if (j.is_string()) {
    const auto s = j.get<std::string>();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
    return s == "inf" ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
  }
  return j.get<double>();
}

std::string hex64(uint64_t v) { return fmt::format("{:016x}", v); }
uint64_t from_hex64(const json& j) { return std::stoull(j.get<std::string>(), nullptr, 16); }

json metrics_json(const kernels::CompareResult& m) {
  json j;
  j["dtype"] = std::string(dtype_name(m.dtype));
  j["numel"] = m.numel;
  j["differing"] = m.differing;
  j["floating"] = m.floating;
  j["max_ulp"] = m.max_ulp == kernels::kUlpInfinite ? json("inf") : json(m.max_ulp);
  j["max_abs_error"] = number(m.max_abs_error);
  j["max_rel_error"] = number(m.max_rel_error);
  j["first_index"] = m.first_index;
  j["first_recorded"] = number(m.first_a);
  j["first_replayed"] = number(m.first_b);
  j["first_recorded_bits"] = hex64(m.first_a_bits);
  j["first_replayed_bits"] = hex64(m.first_b_bits);
  j["nan_recorded"] = m.nan_a;
  j["nan_replayed"] = m.nan_b;
  j["inf_recorded"] = m.inf_a;
  j["inf_replayed"] = m.inf_b;
  return j;
}

kernels::CompareResult metrics_from(const json& j) {
  kernels::CompareResult m;
  m.dtype = dtype_from_name(j.at("dtype").get<std::string>()).value_or(DType::kFloat32);
  m.numel = j.at("numel");
  m.differing = j.at("differing");
  m.floating = j.at("floating");
  m.max_ulp = j.at("max_ulp").is_string() ? kernels::kUlpInfinite : j.at("max_ulp").get<uint64_t>();
  m.max_abs_error = number_from(j.at("max_abs_error"));
  m.max_rel_error = number_from(j.at("max_rel_error"));
  m.first_index = j.at("first_index");
  m.first_a = number_from(j.at("first_recorded"));
  m.first_b = number_from(j.at("first_replayed"));
  m.first_a_bits = from_hex64(j.at("first_recorded_bits"));
  m.first_b_bits = from_hex64(j.at("first_replayed_bits"));
  m.nan_a = j.at("nan_recorded");
  m.nan_b = j.at("nan_replayed");
  m.inf_a = j.at("inf_recorded");
  m.inf_b = j.at("inf_replayed");
  return m;
}

json result_json(const ReplayResult& r) {
  json j;
  j["event"] = r.event;
  j["rank"] = r.rank;
  j["step"] = r.step;
  j["phase"] = r.phase;
  j["op"] = r.op;
  j["overload"] = r.overload;
  j["scope"] = r.scope;
  j["config"] = r.config;
  j["child_process"] = r.child_process;
  j["verdict"] = verdict_name(r.verdict);
  j["reason"] = cannot_reason_name(r.reason);
  j["message"] = r.message;
  j["seconds"] = r.seconds;
  j["input_bytes"] = r.input_bytes;
  j["fed_inputs"] = r.fed_inputs;
  j["outputs"] = json::array();
  for (const auto& o : r.outputs) {
    json oj;
    oj["index"] = o.index;
    oj["name"] = o.name;
    oj["kind"] = o.kind;
    oj["equal"] = o.equal;
    oj["compared"] = o.compared;
    oj["note"] = o.note;
    oj["recorded_fingerprint"] = hex64(o.recorded_fingerprint);
    oj["replayed_fingerprint"] = hex64(o.replayed_fingerprint);
    oj["recorded_text"] = o.recorded_text;
    oj["replayed_text"] = o.replayed_text;
    oj["sizes"] = o.sizes;
    oj["dtype"] = o.dtype;
    if (o.has_metrics) oj["metrics"] = metrics_json(o.metrics);
    j["outputs"].push_back(std::move(oj));
  }
  return j;
}

Verdict verdict_from(const std::string& s) {
  if (s == "reproduces") return Verdict::kReproduces;
  if (s == "differs") return Verdict::kDiffers;
  return Verdict::kCannotReplay;
}

CannotReason reason_from(const std::string& s) {
  for (int i = 0; i <= static_cast<int>(CannotReason::kWrittenOutside); ++i)
    if (s == cannot_reason_name(static_cast<CannotReason>(i))) return static_cast<CannotReason>(i);
  return CannotReason::kChildFailed;
}

ReplayResult result_from(const json& j) {
  ReplayResult r;
  r.event = j.at("event");
  r.rank = j.at("rank");
  r.step = j.at("step");
  r.phase = j.at("phase");
  r.op = j.at("op");
  r.overload = j.at("overload");
  r.scope = j.at("scope");
  r.config = j.at("config");
  r.child_process = j.at("child_process");
  r.verdict = verdict_from(j.at("verdict"));
  r.reason = reason_from(j.at("reason"));
  r.message = j.at("message");
  r.seconds = j.at("seconds");
  r.input_bytes = j.at("input_bytes");
  r.fed_inputs = j.value("fed_inputs", 0);
  for (const auto& oj : j.at("outputs")) {
    OutputResult o;
    o.index = oj.at("index");
    o.name = oj.at("name");
    o.kind = oj.at("kind");
    o.equal = oj.at("equal");
    o.compared = oj.at("compared");
    o.note = oj.at("note");
    o.recorded_fingerprint = from_hex64(oj.at("recorded_fingerprint"));
    o.replayed_fingerprint = from_hex64(oj.at("replayed_fingerprint"));
    o.recorded_text = oj.at("recorded_text");
    o.replayed_text = oj.at("replayed_text");
    o.sizes = oj.at("sizes").get<std::vector<int64_t>>();
    o.dtype = oj.at("dtype");
    if (oj.contains("metrics")) {
      o.has_metrics = true;
      o.metrics = metrics_from(oj.at("metrics"));
    }
    r.outputs.push_back(std::move(o));
  }
  return r;
}

}  // namespace

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::kReproduces: return "reproduces";
    case Verdict::kDiffers: return "differs";
    case Verdict::kCannotReplay: return "cannot-replay";
  }
  return "cannot-replay";
}

const char* cannot_reason_name(CannotReason r) {
  switch (r) {
    case CannotReason::kNone: return "";
    case CannotReason::kInputsNotRecorded: return "inputs-not-recorded";
    case CannotReason::kOpUnknown: return "op-unknown";
    case CannotReason::kUnsupportedValue: return "unsupported-argument";
    case CannotReason::kOpFailed: return "op-failed";
    case CannotReason::kNothingToCompare: return "nothing-to-compare";
    case CannotReason::kChildFailed: return "child-failed";
    case CannotReason::kWrittenOutside: return "input-written-outside-dispatcher";
  }
  return "";
}

std::string to_json(const std::vector<ReplayResult>& results) {
  json j = json::array();
  for (const auto& r : results) j.push_back(result_json(r));
  return j.dump(2);
}

std::vector<ReplayResult> results_from_json(const std::string& text) {
  std::vector<ReplayResult> out;
  try {
    for (const auto& j : json::parse(text)) out.push_back(result_from(j));
  } catch (const json::exception& e) {
    throw InternalError(std::string("replay results are not valid JSON: ") + e.what());
  }
  return out;
}

namespace detail {

std::string request_to_json(const Request& r) {
  json j;
  j["mode"] = r.mode == Request::Mode::kAll ? "all" : r.mode == Request::Mode::kWindow ? "window" : "event";
  j["dir"] = r.dir;
  j["rank"] = r.rank;
  j["config"] = r.config;
  j["event_knobs"] = r.event_knobs;
  j["user_config"] = r.user_config;
  j["event"] = r.event;
  j["window"] = r.window;
  j["expect_dir"] = r.expect_dir;
  j["expect_event"] = r.expect_event;
  j["expect_rank"] = r.expect_rank;
  j["slices"] = json::array();
  for (const auto& s : r.slices) j["slices"].push_back({s.argument, s.dim, s.start, s.length});
  if (!r.save_dir.empty()) j["save_dir"] = r.save_dir;
  if (r.free_running) j["free_running"] = true;
  if (r.keep_going) j["keep_going"] = true;
  return j.dump();
}

Request request_from_json(const std::string& text) {
  try {
    const json j = json::parse(text);
    Request r;
    const std::string mode = j.at("mode");
    r.mode = mode == "all" ? Request::Mode::kAll : mode == "window" ? Request::Mode::kWindow : Request::Mode::kEvent;
    r.dir = j.at("dir");
    r.rank = j.at("rank");
    r.config = j.at("config");
    r.event_knobs = j.value("event_knobs", false);
    r.user_config = j.value("user_config", "");
    r.event = j.at("event");
    r.window = j.at("window");
    r.expect_dir = j.at("expect_dir");
    r.expect_event = j.at("expect_event");
    r.expect_rank = j.at("expect_rank");
    if (j.contains("slices"))
      for (const auto& s : j.at("slices"))
        r.slices.push_back(InputSlice{s.at(0).get<int>(), s.at(1).get<int>(), s.at(2).get<int64_t>(),
                                      s.at(3).get<int64_t>()});
    if (j.contains("save_dir")) r.save_dir = j.at("save_dir");
    r.free_running = j.value("free_running", false);
    r.keep_going = j.value("keep_going", false);
    return r;
  } catch (const json::exception& e) {
    throw UsageError(std::string("a child trial takes the request JSON that opguard writes itself: ") + e.what());
  }
}

std::string outcome_to_json(const Outcome& o) {
  json j;
  j["skipped"] = o.skipped;
  j["results"] = json::array();
  for (const auto& r : o.results) j["results"].push_back(result_json(r));
  return j.dump();
}

Outcome outcome_from_json(const std::string& text) {
  try {
    const json j = json::parse(text);
    Outcome o;
    o.skipped = j.at("skipped");
    for (const auto& r : j.at("results")) o.results.push_back(result_from(r));
    return o;
  } catch (const json::exception& e) {
    throw InternalError(std::string("the child trial printed no valid result: ") + e.what());
  }
}

}  // namespace detail
}  // namespace opguard::replay
