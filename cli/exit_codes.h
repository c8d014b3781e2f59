#pragma once
// The exit codes of every opguard verb (README, "Exit codes"). Exceptions turn
// into these in one place: run_cli() in cli.cpp.

namespace opguard::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitInternal = 1;   // a bug in opguard (InternalError, unexpected exception)
inline constexpr int kExitUsage = 2;      // bad command line or config string
inline constexpr int kExitDiverged = 3;   // a verb that promises it found a divergence
inline constexpr int kExitNothing = 4;    // bisect, repro: good and bad give the same bits (nothing to bisect)
inline constexpr int kExitFormat = 65;    // bad, foreign or incompatible recording or bundle
inline constexpr int kExitIo = 74;        // cannot write the output (also: recorder --strict abort)
// The training process's exit code when its recorder failed under --strict
// (record::kStrictExitCode; record_command.cpp checks that they agree).
inline constexpr int kExitStrictAbort = kExitIo;
inline constexpr int kExitLaunch = 127;   // the program to record could not be started

}  // namespace opguard::cli
