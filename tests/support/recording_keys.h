#pragma once
// Test support: what must be equal between two recordings of the same program
// under the same config (not thread ids, not times), event by event. Needs
// opguard_formats, no torch.

#include <string>
#include <vector>

#include "opguard/formats/recording.h"

namespace opguard::testing {

inline std::string event_key(const formats::Event& e) {
  std::string s = formats::event_id_string(e.id) + " " + std::to_string(e.step) + " " +
                  formats::phase_name(e.phase) + " " + e.op + "." + e.overload + " [" + e.scope + "] " + e.node;
  for (const auto* values : {&e.inputs, &e.outputs}) {
    s += " |";
    for (const auto& v : *values) {
      s += " " + std::string(formats::value_kind_name(v.kind)) + ":" + v.name + "=" + v.text;
      if (v.kind == formats::ValueKind::kTensor || v.kind == formats::ValueKind::kGenerator) {
        s += "/" + std::string(dtype_name(v.tensor.dtype));
        for (auto d : v.tensor.sizes) s += "x" + std::to_string(d);
        s += v.tensor.has_fingerprint() ? "#" + std::to_string(v.tensor.fingerprint) : "#none";
        s += "f" + std::to_string(v.tensor.flags);
      }
    }
  }
  return s;
}

// The keys of one step file's events, in file order.
inline std::vector<std::string> step_keys(const std::string& step_file) {
  formats::StepReader reader(step_file);
  std::vector<std::string> keys;
  for (const auto& e : reader.events()) keys.push_back(event_key(e));
  return keys;
}

// Every event of one rank, step files in step order.
inline std::vector<formats::Event> events_of(const std::string& dir, int rank = 0) {
  auto layout = formats::scan_recording(dir);
  std::vector<formats::Event> out;
  for (const auto& r : layout.ranks) {
    if (r.rank != rank) continue;
    for (const auto& [step, path] : r.steps) {
      formats::StepReader reader(path);
      out.insert(out.end(), reader.events().begin(), reader.events().end());
    }
  }
  return out;
}

}  // namespace opguard::testing
