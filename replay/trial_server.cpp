// Child processes that serve trials under one environment each (trial_server.h).

#include "trial_server.h"

#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "opguard/core/error.h"

extern char** environ;

namespace opguard::replay::detail {
namespace {

bool send_all(int fd, const std::string& bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n > 0) done += static_cast<std::size_t>(n);
    else if (n < 0 && errno == EINTR) continue;
    else return false;
  }
  return true;
}

bool read_exact(int fd, std::size_t size, std::string& out) {
  out.resize(size);
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, &out[done], size - done);
    if (n > 0) done += static_cast<std::size_t>(n);
    else if (n < 0 && errno == EINTR) continue;
    else return false;
  }
  return true;
}

// A frame's header line, without its newline. False at end of input or on a
// line longer than any header.
bool read_header(int fd, std::string& line) {
  line.clear();
  for (;;) {
    char c = 0;
    const ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n != 1) return false;
    if (c == '\n') return true;
    if (line.size() >= 32) return false;
    line.push_back(c);
  }
}

bool parse_size(const std::string& text, std::size_t& size) {
  if (text.empty() || text.size() > 19 || text.find_first_not_of("0123456789") != std::string::npos) return false;
  size = static_cast<std::size_t>(std::stoull(text));
  return true;
}

// This process's environment with the overrides applied (NAME=VALUE sets
// NAME, a bare NAME removes it).
std::vector<std::string> child_environment(const std::vector<std::string>& env_overrides) {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string kv = *e;
    const std::string name = kv.substr(0, kv.find('='));
    bool overridden = false;
    for (const auto& o : env_overrides) overridden = overridden || o.substr(0, o.find('=')) == name;
    if (!overridden) env.push_back(kv);
  }
  for (const auto& o : env_overrides)
    if (o.find('=') != std::string::npos) env.push_back(o);
  return env;
}

class Server {
 public:
  Server(const std::string& exe, const std::vector<std::string>& env_overrides) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
      throw LaunchError(std::string("socket for a child trial: ") + std::strerror(errno));
    const std::vector<std::string> argv = {exe, "replay", "--child-server"};
    const auto env = child_environment(env_overrides);
    std::vector<char*> cargv, cenv;
    for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
    cargv.push_back(nullptr);
    for (const auto& e : env) cenv.push_back(const_cast<char*>(e.c_str()));
    cenv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, sv[1], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, sv[1], STDOUT_FILENO);
    const int rc = ::posix_spawn(&pid_, cargv[0], &actions, nullptr, cargv.data(), cenv.data());
    posix_spawn_file_actions_destroy(&actions);
    ::close(sv[1]);
    if (rc != 0) {
      ::close(sv[0]);
      throw LaunchError(fmt::format("cannot start the child trial {}: {}", exe, std::strerror(rc)));
    }
    fd_ = sv[0];
  }
  ~Server() { finish(); }
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  pid_t pid() const { return pid_; }

  // Whether the child has exited (reaped here).
  bool exited() { return reap(WNOHANG); }

  std::optional<ServerAnswer> call(const std::string& request) {
    std::string header;
    std::size_t size = 0;
    ServerAnswer a;
    if (!send_all(fd_, std::to_string(request.size()) + "\n" + request) || !read_header(fd_, header) ||
        header.size() < 3 || header[1] != ' ' || !parse_size(header.substr(2), size) ||
        !read_exact(fd_, size, a.payload))
      return std::nullopt;
    a.kind = header[0];
    return a;
  }

  // Closes the socket (the child then exits) and returns its exit status;
  // a child that has not exited 5 s later is killed.
  int finish() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!reap(WNOHANG) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (!reaped_) {
      ::kill(pid_, SIGKILL);
      reap(0);
    }
    return status_;
  }

 private:
  bool reap(int options) {
    if (reaped_) return true;
    int st = 0;
    pid_t r = 0;
    do r = ::waitpid(pid_, &st, options);
    while (r < 0 && errno == EINTR);
    if (r != pid_) return false;
    reaped_ = true;
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return true;
  }

  pid_t pid_ = 0;
  int fd_ = -1;
  bool reaped_ = false;
  int status_ = 0;
};

struct Servers {
  std::mutex mutex;
  std::map<std::string, std::unique_ptr<Server>> by_env;
  int started = 0;
};

Servers& servers() {
  static Servers s;
  return s;
}

}  // namespace

std::optional<ServerAnswer> call_trial_server(const std::string& self_exe, const std::vector<std::string>& env_overrides,
                                              const std::string& request, int* exit_status) {
  auto& s = servers();
  std::lock_guard<std::mutex> lock(s.mutex);
  std::string key = self_exe;
  for (const auto& o : env_overrides) key += '\n' + o;
  auto& server = s.by_env[key];
  if (server && server->exited()) server.reset();  // it died between trials: not this trial's doing
  if (!server) {
    server = std::make_unique<Server>(self_exe, env_overrides);
    ++s.started;
  }
  auto answer = server->call(request);
  if (!answer) {
    *exit_status = server->finish();
    server.reset();
  }
  return answer;
}

int serve_trials(std::string (*serve)(const std::string& request)) {
  const int out = ::dup(STDOUT_FILENO);  // the socket
  if (out < 0 || ::dup2(STDERR_FILENO, STDOUT_FILENO) < 0) return 1;
  std::string header, request;
  std::size_t size = 0;
  while (read_header(STDIN_FILENO, header) && parse_size(header, size) && read_exact(STDIN_FILENO, size, request)) {
    ServerAnswer a;
    try {
      a.payload = serve(request);
    } catch (const UsageError& e) {
      a = {'u', e.what()};
    } catch (const std::exception& e) {
      a = {'e', e.what()};
    }
    if (!send_all(out, fmt::format("{} {}\n", a.kind, a.payload.size()) + a.payload)) break;
  }
  return 0;
}

std::vector<pid_t> trial_server_pids() {
  auto& s = servers();
  std::lock_guard<std::mutex> lock(s.mutex);
  std::vector<pid_t> pids;
  for (auto& [key, server] : s.by_env)
    if (server && !server->exited()) pids.push_back(server->pid());
  return pids;
}

int trial_servers_started() {
  auto& s = servers();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.started;
}

}  // namespace opguard::replay::detail
