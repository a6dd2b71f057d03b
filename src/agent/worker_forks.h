// Worker servers: the built-in trainer's workers made as copies of a `trainctl train` that has
// loaded LibTorch once (common/fork_server.h), instead of each exec'd and loading it again. A
// worker's start was 0.75 s of CPU in the dynamic loader and LibTorch's static constructors on a
// 2-core VM, for every worker at every restart. A job's Python workers, when its spec has
// `preload`, are copies of a warm interpreter that has imported those modules
// (agent/warm_python.h).
//
// One server per kind of launch: the same command but for its last argument (the task, for ps),
// the same environment but for the task's own variables, the same directory. It is started on
// first use, from the agent's supervising thread, and lives across rounds. Where a server cannot
// serve (it failed to start, to load, or to set a copy up) the worker is exec'd as before, and
// that server is not asked again. TRAINCTL_WORKER_SERVER=0 in the agent's environment turns
// servers off.
//
// Not thread-safe: the agent's supervising thread owns it.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "common/fork_server.h"
#include "common/status.h"
#include "common/subprocess.h"

namespace trainctl {

inline constexpr const char* kEnvWorkerServer = "TRAINCTL_WORKER_SERVER";
// In a worker server's environment only: the job spec (JSON) whose training data it loads
// before it makes copies, so that they share the decoded images instead of each inflating them.
inline constexpr const char* kEnvPreloadSpec = "TRAINCTL_WORKER_SERVER_SPEC";

class WorkerForks {
 public:
  WorkerForks();
  // Closes the servers and reaps them.
  ~WorkerForks();
  WorkerForks(const WorkerForks&) = delete;
  WorkerForks& operator=(const WorkerForks&) = delete;

  // Starts the process `spawn` describes. `shared_env` is its environment without the task's own
  // variables (what its server is started with); `preload`, if not empty, the Python modules its
  // warm interpreter imports (spawn then runs a Python interpreter). A copy of a server where one
  // can serve it, else Spawn(spawn).
  Result<pid_t> Start(const SpawnOptions& spawn, const std::vector<std::string>& shared_env,
                      const std::vector<std::string>& preload = {});
  // Starts the server Start would use for `spawn`, if none is there yet, without waiting for it:
  // servers of several kinds of launch (parameter servers, workers, an evaluator) then load at
  // once instead of one after another.
  void Prepare(const SpawnOptions& spawn, const std::vector<std::string>& shared_env,
               const std::vector<std::string>& preload = {});
  // How many processes were copies of a server (for the agent's log and the tests).
  int forked() const { return forked_; }

 private:
  struct Server {
    std::vector<std::string> argv;  // the server's own command
    std::vector<std::string> env;
    std::string cwd;
    Duration load_timeout;             // how long a request may wait for it to be ready
    std::optional<ForkServer> server;  // nullopt: it could not serve
  };
  // How a server would start `spawn`: the server's command, and the copy's argument.
  struct Plan {
    std::vector<std::string> server_argv;
    std::string argument;
    Duration load_timeout;
  };
  // nullopt where `spawn` cannot be a copy of a server.
  std::optional<Plan> PlanFor(const SpawnOptions& spawn, const std::vector<std::string>& preload);
  Server* Find(const Plan& plan, const SpawnOptions& spawn, const std::vector<std::string>& shared_env);

  bool enabled_;
  std::vector<Server> servers_;
  std::vector<std::string> said_;  // why commands could not be copies of a warm interpreter, said once
  int forked_ = 0;
};

}  // namespace trainctl
