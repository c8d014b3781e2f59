// opguard configs: every knob replay, bisect and repro take.

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "opguard/replay/replay.h"
#include "verbs.h"

namespace opguard::cli {
namespace {

constexpr const char* kHelp = R"(List every knob of --config: its values, what it changes in an operator's
numerics, whether it runs the trial in a child process (process-wide knobs),
and whether this build on this machine can apply it.

Examples:
  opguard configs
  opguard configs --json
  opguard replay runB2 --event 1234 --config threads=1,cpu_capability=default)";

}  // namespace

void add_configs_command(CLI::App& app, VerbResult& result) {
  auto json = std::make_shared<bool>(false);
  CLI::App* sub = app.add_subcommand("configs", "List the knobs of --config and whether this build applies them");
  sub->footer(kHelp);
  sub->add_flag("--json", *json, "Machine-readable output");
  sub->callback([json, &result] {
    // The GPU knobs depend on this machine: ask (loads libtorch_cuda once).
    std::string no_cuda;
    const bool cuda = replay::cuda_device_count(&no_cuda) > 0;
    std::vector<replay::KnobInfo> table = replay::knob_table();
    for (auto& k : table) {
      if (!k.needs_cuda || cuda || !k.available) continue;
      if (k.name == "device") {
        k.values += "; cuda:N unavailable here: " + no_cuda;
        continue;
      }
      k.available = false;
      k.unavailable_reason = no_cuda;
    }
    if (*json) {
      nlohmann::json j = nlohmann::json::array();
      for (const auto& k : table) {
        j.push_back({{"name", k.name}, {"values", k.values}, {"changes", k.changes},
                     {"process_wide", k.process_wide}, {"available", k.available},
                     {"unavailable_reason", k.unavailable_reason}, {"needs_cuda", k.needs_cuda}});
      }
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      for (const auto& k : table) {
        std::printf("%-28s %s%s\n", k.name.c_str(), k.available ? "available" : "unavailable",
                    k.process_wide ? ", child process" : ", in process");
        std::printf("    values   %s\n    changes  %s\n", k.values.c_str(), k.changes.c_str());
        if (!k.available) std::printf("    why not  %s\n", k.unavailable_reason.c_str());
      }
    }
    result.exit_code = 0;
  });
}

}  // namespace opguard::cli
