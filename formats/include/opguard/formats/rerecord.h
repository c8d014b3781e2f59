#pragma once
// The `opguard record --dump-around` command that re-records an event's window
// with full tensors, built from what the manifest holds (record_command, cwd,
// and the numerics environment). Runs under a fixed config are deterministic,
// so the event keeps its id in the new recording. Used by diff and replay.

#include <string>

#include "opguard/formats/recording.h"

namespace opguard::formats {

// `s` quoted for a POSIX shell: as is when it is made of safe characters
// only, else in single quotes.
std::string shell_quote(const std::string& s);

// "" when the manifest holds no record_command. The new recording goes to
// RECORDING_DIR-around-EVENT_ID, beside the original.
std::string rerecord_command(const Manifest& manifest, const std::string& recording_dir, const std::string& event_id,
                             int radius, const std::string& opguard_command);

}  // namespace opguard::formats
