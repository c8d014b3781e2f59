#pragma once
// The `opguard record --dump-around` command that re-records an event's window
// with full tensors, built from what the manifest holds (record_command, cwd,
// and the numerics environment). Runs under a fixed config are deterministic,
// so the event keeps its id in the new recording. Used by diff and replay
// (printed) and by bisect run (executed with the shell).
//
// A manifest is input like any other file: the command is built only from a
// record_command in the form `opguard record` writes it (words as shell_quote
// quotes them, one space apart: no unquoted shell syntax) and from environment
// variables the recorder would have recorded (is_numerics_env). Anything else
// in the manifest never reaches a shell.

#include <string>
#include <vector>

#include "opguard/formats/recording.h"

namespace opguard::formats {

// `s` quoted for a POSIX shell: as is when it is made of safe characters
// only, else in single quotes.
std::string shell_quote(const std::string& s);

// Whether `text` is one or more words exactly as shell_quote writes them,
// separated by single spaces: a shell reads it as those words and nothing else.
bool is_shell_quoted_words(const std::string& text);

// The environment variables that can change numerics or placement, which the
// recorder stores in the manifest's /env: OMP_*, MKL_*, ATEN_*, TORCH_*, CUDA_*,
// NCCL_*, RANK, WORLD_SIZE, MASTER_*, GLOO_*, ... (rerecord.cpp has the list).
bool is_numerics_env(const std::string& name);

// The names of this process's environment variables that is_numerics_env accepts.
std::vector<std::string> numerics_env_here();

// "" when the manifest holds no record_command, or one not in the form
// `opguard record` writes. Environment entries other than is_numerics_env
// names are left out. The command ends the program once the window is written
// (--stop-after-windows). The new recording goes to RECORDING_DIR-around-EVENT_ID,
// beside the original. `inherited`: the numerics variables of the environment
// the command will run in (numerics_env_here()); those the manifest lacks are
// removed (`env -u NAME`), so the run sees the recorded environment, not the
// caller's: a run recorded without MKL_CBWR is re-recorded without it.
std::string rerecord_command(const Manifest& manifest, const std::string& recording_dir, const std::string& event_id,
                             int radius, const std::string& opguard_command,
                             const std::vector<std::string>& inherited);

}  // namespace opguard::formats
