// opguard diff: the first divergent operator of two recordings.

#include <fmt/format.h>

#include <cstdio>
#include <sstream>
#include <string>

#include "exit_codes.h"
#include "opguard/bisect/diff.h"
#include "opguard/core/error.h"
#include "verbs.h"

namespace opguard::cli {
namespace {

constexpr const char* kHelp = R"(Align the events of two recordings per rank, step and phase by signature (op,
overload, scope, tensor shapes and dtypes), classify every aligned pair
(same, origin, origin-args, propagated, entered, unmatched: docs/DIFF.md) and
name the first divergent operator: the first event that produced different bits
from bitwise-equal inputs (origin), or where different bits came in without an
operator (entered). Prints the manifest differences first, then the first
divergent operator with its evidence, the next divergence sources and a summary
per step and phase.

Cross-rank mode (--ranks A,B) compares two ranks of one data-parallel run on
what the replicas must agree on: the optimizer phase and collective outputs.

Examples:
  opguard diff runA runB
  opguard diff runA runB --trace divergence.json --max-origins 10
  opguard diff runA runB --rank 1 --steps 3:5 --json > diff.json
  opguard diff run --ranks 0,1

Exit code: 0 the runs agree bitwise, 3 they diverge, 2 bad options,
65 a directory is not a readable recording, 74 the trace cannot be written.)";

// "3" or "2:5" (inclusive), "3:" or ":5".
void parse_steps(const std::string& text, bisect::DiffOptions& o) {
  auto number = [&](const std::string& s) {
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(s, &used);
    } catch (const std::exception&) {
      used = std::string::npos;
    }
    if (used != s.size() || v < 0) throw UsageError(fmt::format("--steps '{}' is not a step or a range such as 2:5", text));
    return static_cast<int64_t>(v);
  };
  const auto colon = text.find(':');
  if (colon == std::string::npos) {
    o.first_step = o.last_step = number(text);
  } else {
    if (colon > 0) o.first_step = number(text.substr(0, colon));
    if (colon + 1 < text.size()) o.last_step = number(text.substr(colon + 1));
  }
  if (o.first_step && o.last_step && *o.first_step > *o.last_step)
    throw UsageError(fmt::format("--steps '{}' ends before it starts", text));
}

std::pair<int, int> parse_ranks(const std::string& text) {
  std::istringstream in(text);
  int a = -1, b = -1;
  char comma = 0;
  std::string rest;
  if (!(in >> a >> comma >> b) || comma != ',' || (in >> rest) || a < 0 || b < 0)
    throw UsageError(fmt::format("--ranks '{}' is not two ranks such as 0,1", text));
  return {a, b};
}

}  // namespace

void add_diff_command(CLI::App& app, VerbResult& result) {
  struct Options {
    std::string reference, suspect, steps, ranks;
    int rank = -1;
    bool json = false;
    bisect::DiffOptions diff;
  };
  auto o = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand("diff", "Align two recordings and name the first divergent operator");
  sub->footer(kHelp);
  sub->add_option("reference", o->reference, "Reference recording")->required();
  sub->add_option("suspect", o->suspect, "Suspect recording (not with --ranks)");
  sub->add_option("--rank", o->rank, "Only this rank")->check(non_negative());
  CLI::Option* steps = sub->add_option("--steps", o->steps, "Report only these steps: 3, 2:5, 3: or :5");
  sub->add_option("--max-origins", o->diff.max_origins, "Divergence sources listed (default 5)");
  sub->add_option("--trace", o->diff.trace_path, "Write a Chrome trace-event JSON file (Perfetto)");
  sub->add_option("--ranks", o->ranks, "Cross-rank mode: compare ranks A,B of one run");
  CLI::Option* json = sub->add_flag("--json", o->json, "Machine-readable report (schema opguard-diff/1, docs/DIFF.md)");
  sub->add_flag("--events", o->diff.list_events, "With --json: list every event and its class")->needs(json);
  sub->callback([o, steps, &result] {
    bisect::DiffOptions options = o->diff;
    if (steps->count() > 0 && o->steps.empty()) throw UsageError("--steps is empty: give a step or a range such as 2:5");
    if (!o->steps.empty()) parse_steps(o->steps, options);
    if (o->rank >= 0) options.rank = o->rank;
    options.opguard_command = executable_dir() + "/opguard";
    bisect::DiffReport report;
    if (!o->ranks.empty()) {
      if (!o->suspect.empty()) throw UsageError("--ranks compares ranks of one recording: give one directory");
      if (options.rank) throw UsageError("--rank and --ranks do not go together");
      const auto [a, b] = parse_ranks(o->ranks);
      report = bisect::diff_ranks(o->reference, a, b, options);
    } else {
      if (o->suspect.empty()) throw UsageError("diff needs two recordings (REF SUSPECT), or one with --ranks A,B");
      report = bisect::diff_recordings(o->reference, o->suspect, options);
    }
    const std::string text = o->json ? bisect::report_json(report) : bisect::report_text(report);
    std::fputs(text.c_str(), stdout);
    result.exit_code = report.diverged ? kExitDiverged : kExitOk;
  });
}

}  // namespace opguard::cli
