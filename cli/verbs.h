#pragma once
// Each verb lives in its own file (<verb>_command.cpp) with its help text and
// options; it adds a subcommand to the app and returns the exit code through
// `*exit_code` when run.

#include <CLI/CLI.hpp>

#include <string>

namespace opguard::cli {

struct VerbResult {
  int exit_code = 0;
};

void add_record_command(CLI::App& app, VerbResult& result);
void add_ls_command(CLI::App& app, VerbResult& result);
void add_show_command(CLI::App& app, VerbResult& result);
void add_diff_command(CLI::App& app, VerbResult& result);
void add_replay_command(CLI::App& app, VerbResult& result);
void add_repro_command(CLI::App& app, VerbResult& result);
void add_configs_command(CLI::App& app, VerbResult& result);
void add_bisect_command(CLI::App& app, VerbResult& result);
// `opguard bisect window`, added by add_bisect_command to its subcommand.
void add_bisect_window_subcommand(CLI::App& bisect, VerbResult& result);

// An option's check: a whole number of at least 1 ("--window: 0 is not a count of 1 or more").
const CLI::Validator& at_least_one();
const CLI::Validator& non_negative();  // a rank, a step

// The directory holding the running opguard executable.
std::string executable_dir();

}  // namespace opguard::cli
