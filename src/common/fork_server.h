// A fork server: a process started once (exec'd, so it is single-threaded and has done nothing
// yet, or only loaded what every copy needs) that makes copies of itself on request. Each copy is
// the requester's own child (clone with CLONE_PARENT), so the requester waits for it, signals its
// process group and gets its exit status exactly as if it had spawned it, without paying for an
// exec and the dynamic loader's relocations again: a local job of 1024 nodes starts its agents
// this way (about 3 ms of CPU each when exec'd on a 2-core VM), and an agent its built-in
// trainer's workers, from a server that has loaded LibTorch once (0.75 s of CPU a process).
//
// The server's argv ends with a placeholder argument; a copy overwrites it in place with its
// request's argument (which must fit), so /proc/PID/cmdline and ps show each copy's own command
// line. A request may also give the copy its own environment (what getenv and
// /proc/PID/environ then say), working directory, CPUs and output, as Spawn would.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "common/duration.h"
#include "common/status.h"
#include "common/subprocess.h"

namespace trainctl {

// The variable that names the server's end of the channel in its environment ("FD[,NAME...]":
// and the variables the server's starter added for it alone, which it unsets).
inline constexpr const char* kEnvForkServerFd = "TRAINCTL_FORK_SERVER_FD";

// What a copy gets besides the server's own state.
struct ForkRequest {
  std::string argument;          // its last argument (at most the placeholder's length)
  std::vector<std::string> env;  // if not empty: its whole environment, "KEY=VALUE"
  std::string cwd;               // if not empty: its working directory
  std::vector<int> cpus;         // if not empty: the only CPUs it may run on
  int output_fd = -1;            // if >= 0: becomes its stdout and stderr
};

class ForkServer {
 public:
  // Starts the server: `options` is its command (argv ending with the placeholder, env), and
  // Spawn's rules apply. Call from the thread that supervises the copies (it becomes their
  // parent for PR_SET_PDEATHSIG), before the copies' requests.
  static Result<ForkServer> Start(SpawnOptions options);
  ForkServer(ForkServer&& other) noexcept;
  ForkServer& operator=(ForkServer&&) = delete;
  // Closes the channel: the server exits (the caller reaps it, as any child).
  ~ForkServer();

  // A copy made as `request` says; it leads its own process group and gets SIGTERM when the
  // caller's thread dies. Waits up to `timeout` (a server still loading what it serves with
  // takes the requests that came meanwhile once it has). A copy that could not be set up as
  // asked (a directory it cannot enter, say) has exited and been reaped; the error says why.
  // After a failure that leaves the channel out of step (a timeout, the server gone) the server
  // is closed and every later request fails at once: broken() says so.
  Result<pid_t> Fork(const ForkRequest& request, Duration timeout = std::chrono::seconds(10));
  Result<pid_t> Fork(const std::string& argument, Duration timeout = std::chrono::seconds(10)) {
    return Fork(ForkRequest{argument, {}, {}, {}, -1}, timeout);
  }
  bool broken() const { return fd_ < 0; }
  pid_t pid() const { return pid_; }

 private:
  ForkServer(pid_t pid, int fd) : pid_(pid), fd_(fd) {}
  pid_t pid_ = -1;
  int fd_ = -1;
};

// In a process that may have been started as a fork server (kEnvForkServerFd set): serves
// requests until the channel closes, then exits; returns in each copy, with its request's
// argument. Returns nullopt at once in a process not started as one. Call before starting any
// thread (a server with more than one exits at once, and its requests fail), and before writing
// anything to a stdio stream (a copy would inherit the buffer).
std::optional<std::string> ServeForks(int argc, char** argv);

}  // namespace trainctl
