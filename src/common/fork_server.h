// A fork server: a process started once (exec'd, so it is single-threaded and has done nothing
// yet) that makes copies of itself on request. Each copy is the requester's own child (clone
// with CLONE_PARENT), so the requester waits for it, signals its process group and gets its exit
// status exactly as if it had spawned it, without paying for an exec and the dynamic loader's
// relocations again: a local job of 1024 nodes starts its agents this way (about 3 ms of CPU
// each when exec'd on a 2-core VM).
//
// The server's argv ends with a placeholder argument; a copy overwrites it in place with its
// request (which must fit), so /proc/PID/cmdline and ps show each copy's own command line.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>

#include "common/duration.h"
#include "common/status.h"
#include "common/subprocess.h"

namespace trainctl {

// The variable that names the server's end of the channel in its environment ("FD[,NAME...]":
// and the variables the server's starter added for it alone, which it unsets).
inline constexpr const char* kEnvForkServerFd = "TRAINCTL_FORK_SERVER_FD";

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

  // A copy whose placeholder argument reads `value` (at most the placeholder's length); it leads
  // its own process group and gets SIGTERM when the caller's thread dies. Waits up to `timeout`.
  Result<pid_t> Fork(const std::string& value, Duration timeout = std::chrono::seconds(10));
  pid_t pid() const { return pid_; }

 private:
  ForkServer(pid_t pid, int fd) : pid_(pid), fd_(fd) {}
  pid_t pid_ = -1;
  int fd_ = -1;
};

// In a process that may have been started as a fork server (kEnvForkServerFd set): serves
// requests until the channel closes, then exits; returns in each copy, with its request. Returns
// nullopt at once in a process not started as one. Call before starting any thread.
std::optional<std::string> ServeForks(int argc, char** argv);

}  // namespace trainctl
