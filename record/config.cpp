#include "opguard/record/config.h"

#include <cstdlib>
#include <regex>
#include <sstream>

#include "opguard/core/error.h"
#include "opguard/formats/recording.h"

namespace opguard::record {
namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

int64_t parse_int(const std::string& text, const std::string& what) {
  if (text.empty()) throw UsageError(what + " is empty: give a whole number");
  std::size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used, 10);
  } catch (const std::exception&) {
    throw UsageError(what + " '" + text + "' is not a whole number");
  }
  if (used != text.size()) throw UsageError(what + " '" + text + "' is not a whole number");
  return v;
}

void check_regex(const std::string& re, const std::string& what) {
  try {
    std::regex compiled(re, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw UsageError(what + " '" + re + "' is not a valid regular expression: " + e.what());
  }
}

}  // namespace

uint64_t parse_bytes(const std::string& text) {
  if (text.empty()) throw UsageError("a byte count is empty: give e.g. 512M or 2G");
  uint64_t scale = 1;
  std::string digits = text;
  switch (text.back()) {
    case 'K': case 'k': scale = uint64_t{1} << 10; digits.pop_back(); break;
    case 'M': case 'm': scale = uint64_t{1} << 20; digits.pop_back(); break;
    case 'G': case 'g': scale = uint64_t{1} << 30; digits.pop_back(); break;
    case 'T': case 't': scale = uint64_t{1} << 40; digits.pop_back(); break;
    default: break;
  }
  const int64_t v = parse_int(digits, "byte count");
  if (v < 0) throw UsageError("byte count '" + text + "' is negative");
  // 2^62 bytes and up wrapped around (18014398509481985K became 1024 bytes).
  if (static_cast<uint64_t>(v) > (uint64_t{1} << 62) / scale)
    throw UsageError("byte count '" + text + "' is too large: at most 4096P");
  return static_cast<uint64_t>(v) * scale;
}

StepRange parse_step_range(const std::string& text) {
  auto parts = split(text, ':');
  StepRange r;
  if (parts.size() == 1) {
    r.first = r.last = parse_int(parts[0], "step");
  } else if (parts.size() == 2) {
    r.first = parse_int(parts[0], "first step");
    r.last = parse_int(parts[1], "last step");
  } else {
    throw UsageError("step range '" + text + "' is not STEP or FIRST:LAST");
  }
  if (r.first < 0 || r.last < r.first)
    throw UsageError("step range '" + text + "' is empty or negative");
  return r;
}

EventWindow parse_window(const std::string& text) {
  auto colon = text.rfind(':');
  std::string id_text = colon == std::string::npos ? text : text.substr(0, colon);
  EventWindow w;
  auto id = formats::parse_event_id(id_text);
  if (!id) throw UsageError("event id '" + id_text + "' is not an event id such as 1234 or 2.57");
  w.event_id = *id;
  w.radius = 32;
  if (colon != std::string::npos) {
    const int64_t r = parse_int(text.substr(colon + 1), "window radius");
    if (r < 0) throw UsageError("window radius in '" + text + "' is negative");
    w.radius = static_cast<uint64_t>(r);
  }
  return w;
}

bool SamplingPolicy::dumps_anything() const {
  return all || !steps.empty() || every > 0 || !ops.empty() || !scopes.empty() || !windows.empty();
}

// Text form: ';'-separated key=value items, e.g.
//   all;steps=1:3,7;every=5;ops=softmax|layer_norm;scopes=^blocks\.1;around=120:16;budget=2G
// A regex may not contain ';'.
SamplingPolicy parse_policy(const std::string& text) {
  SamplingPolicy p;
  if (text.empty()) return p;
  for (const auto& item : split(text, ';')) {
    if (item.empty()) continue;
    auto eq = item.find('=');
    const std::string key = item.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (key == "all") {
      p.all = true;
    } else if (key == "steps") {
      for (const auto& r : split(value, ',')) p.steps.push_back(parse_step_range(r));
    } else if (key == "every") {
      p.every = parse_int(value, "--dump-every");
      if (p.every <= 0) throw UsageError("--dump-every must be a positive number of steps");
    } else if (key == "ops") {
      check_regex(value, "--dump-ops");
      p.ops = value;
    } else if (key == "scopes") {
      check_regex(value, "--dump-scopes");
      p.scopes = value;
    } else if (key == "around") {
      for (const auto& w : split(value, ',')) p.windows.push_back(parse_window(w));
    } else if (key == "budget") {
      p.budget_bytes = parse_bytes(value);
    } else {
      throw UsageError("sampling policy item '" + item +
                       "' is unknown: use all, steps=, every=, ops=, scopes=, around= or budget=");
    }
  }
  return p;
}

std::string SamplingPolicy::to_string() const {
  std::ostringstream out;
  const char* sep = "";
  if (all) {
    out << "all";
    sep = ";";
  }
  if (!steps.empty()) {
    out << sep << "steps=";
    for (std::size_t i = 0; i < steps.size(); ++i)
      out << (i ? "," : "") << steps[i].first << ":" << steps[i].last;
    sep = ";";
  }
  if (every > 0) {
    out << sep << "every=" << every;
    sep = ";";
  }
  if (!ops.empty()) {
    out << sep << "ops=" << ops;
    sep = ";";
  }
  if (!scopes.empty()) {
    out << sep << "scopes=" << scopes;
    sep = ";";
  }
  if (!windows.empty()) {
    out << sep << "around=";
    for (std::size_t i = 0; i < windows.size(); ++i)
      out << (i ? "," : "") << formats::event_id_string(windows[i].event_id) << ":"
          << windows[i].radius;
    sep = ";";
  }
  if (budget_bytes > 0) out << sep << "budget=" << budget_bytes;
  return out.str();
}

QueueConfig parse_queue(const std::string& text) {
  QueueConfig q;
  if (text.empty()) return q;
  for (const auto& item : split(text, ';')) {
    if (item.empty()) continue;
    auto eq = item.find('=');
    const std::string key = item.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (key == "bytes") {
      q.max_bytes = parse_bytes(value);
      if (q.max_bytes == 0) throw UsageError("--queue-bytes must be more than 0");
    } else if (key == "policy") {
      if (value == "wait") q.policy = QueueFullPolicy::kWait;
      else if (value == "drop") q.policy = QueueFullPolicy::kDrop;
      else throw UsageError("queue policy '" + value + "' is unknown: use wait or drop");
    } else {
      throw UsageError("queue item '" + item + "' is unknown: use bytes= or policy=");
    }
  }
  return q;
}

std::string QueueConfig::to_string() const {
  return "bytes=" + std::to_string(max_bytes) +
         ";policy=" + (policy == QueueFullPolicy::kWait ? "wait" : "drop");
}

namespace {

uint32_t delay_from_env(const char* name) {
  const char* delay = std::getenv(name);
  if (delay == nullptr || *delay == '\0') return 0;
  const int64_t us = parse_int(delay, name);
  if (us < 0 || us > 1000000) throw UsageError(std::string(name) + " must be between 0 and 1000000");
  return static_cast<uint32_t>(us);
}

}  // namespace

uint32_t test_writer_delay_from_env() { return delay_from_env(kEnvTestWriterDelay); }
uint32_t test_hasher_delay_from_env() { return delay_from_env(kEnvTestHasherDelay); }
bool test_observe_only_from_env() {
  const char* v = std::getenv(kEnvTestObserveOnly);
  return v != nullptr && std::string(v) == "1";
}

std::optional<RecorderConfig> RecorderConfig::from_env() {
  const char* out = std::getenv(kEnvOut);
  if (out == nullptr || *out == '\0') return std::nullopt;
  RecorderConfig c;
  c.out_dir = out;
  auto get = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v ? v : "");
  };
  c.policy = parse_policy(get(kEnvPolicy));
  c.queue = parse_queue(get(kEnvQueue));
  c.strict = get(kEnvStrict) == "1";
  c.stop_after_windows = get(kEnvStopAfterWindows) == "1";
  if (c.stop_after_windows && c.policy.windows.empty())
    throw UsageError("--stop-after-windows needs --dump-around: it ends the program after the windows");
  const std::string threads = get(kEnvHashThreads);
  if (!threads.empty()) {
    c.hash_threads = static_cast<int>(parse_int(threads, kEnvHashThreads));
    if (c.hash_threads < 1 || c.hash_threads > 256)
      throw UsageError("--hash-threads must be between 1 and 256");
  }
  const std::string defer = get(kEnvDeferHashing);
  if (!defer.empty() && defer != "0" && defer != "1")
    throw UsageError(std::string(kEnvDeferHashing) + " must be 0 or 1");
  c.defer_hashing = defer != "0";
  c.command = get(kEnvCommand);
  c.declared_knobs = get(kEnvDeclared);
  c.test_writer_delay_us = test_writer_delay_from_env();
  c.test_hasher_delay_us = test_hasher_delay_from_env();
  c.test_observe_only = test_observe_only_from_env();
  return c;
}

}  // namespace opguard::record
