#pragma once
// Child processes for trials that need process state this process does not
// have (ATEN_CPU_CAPABILITY, env: knobs; replay.cpp decides). One child per
// distinct environment, started on its first trial and kept: it loads torch
// once and then serves every later trial under that environment, so a bisect
// that shrinks the inputs under another CPU capability pays the start-up once,
// not once per trial. Torch-free.
//
// Protocol over a socket that is the child's stdin and its stdout (the child
// moves its own stdout to stderr first, so that nothing a library prints can
// reach the socket): a request is "<bytes>\n<request JSON>"; an answer is
// "<kind> <bytes>\n<payload>", kind r (payload: the outcome JSON), u (a usage
// error: its message) or e (any other error: its message). The child exits
// when its stdin closes.

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace opguard::replay::detail {

struct ServerAnswer {
  char kind = 'r';      // r, u or e, as above
  std::string payload;
};

// Sends `request` to the child for (self_exe, env_overrides), starting it
// first where there is none or the last one has exited. nullopt: the child
// died before it answered (it crashed on this request); *exit_status then
// holds its exit status (128+N for signal N) and the next call starts a new
// one. Throws LaunchError if no child can be started.
std::optional<ServerAnswer> call_trial_server(const std::string& self_exe, const std::vector<std::string>& env_overrides,
                                              const std::string& request, int* exit_status);

// The child's side: serves requests from stdin until it closes. `serve` runs
// one request and returns the outcome JSON; it may throw.
int serve_trials(std::string (*serve)(const std::string& request));

// For tests: the pids of the children now running, and how many were started.
std::vector<pid_t> trial_server_pids();
int trial_servers_started();

}  // namespace opguard::replay::detail
