#pragma once

namespace opguard::cli {

// Parses argv, runs the verb and returns the process exit code. Never throws.
int run_cli(int argc, char** argv);

}  // namespace opguard::cli
