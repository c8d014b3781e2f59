#pragma once
// The one error family of opguard. Libraries throw these; cli/ turns them into
// exit codes in one place (cli/exit_codes.h). Messages are one sentence that
// says what to do.

#include <stdexcept>
#include <string>

namespace opguard {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The command line or a config string is malformed (exit 2).
class UsageError : public Error {
 public:
  using Error::Error;
};

// A recording or bundle is missing, truncated, corrupt, foreign or of another
// format version (exit 65).
class FormatError : public Error {
 public:
  using Error::Error;
};

// The file system refused: unwritable directory, disk full (exit 74).
class IoError : public Error {
 public:
  using Error::Error;
};

// The training program could not be started (exit 127).
class LaunchError : public Error {
 public:
  using Error::Error;
};

// An internal invariant broke: a bug in opguard. Stays on in release builds.
class InternalError : public Error {
 public:
  using Error::Error;
};

[[noreturn]] void internal_check_failed(const char* expr, const char* file, int line);

}  // namespace opguard

#define OPGUARD_CHECK(cond)                                                  \
  do {                                                                       \
    if (!(cond)) ::opguard::internal_check_failed(#cond, __FILE__, __LINE__); \
  } while (0)
