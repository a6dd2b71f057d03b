// WorkerGroup: one agent's local tasks (workers of every role) for one round. Each task leads its
// own process group, so a stop reaches everything it started (data loader processes too).
//
// Not thread-safe: the agent's supervising thread owns it. Expects SIGCHLD to be blocked (see
// BlockSupervisorSignals) so Stop() can wait on it; works, by polling, when it is not.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "agent/output_pump.h"
#include "agent/worker_forks.h"
#include "common/duration.h"
#include "common/status.h"
#include "common/subprocess.h"

namespace trainctl {

struct WorkerLaunch {
  int local_rank = 0;
  int rank = 0;  // global
  std::string label;  // the output prefix: "worker-3", "ps-0"
  std::vector<std::string> argv;
  std::vector<std::string> env;
  std::string cwd;
  std::string log_path;  // appended to
  std::string log_header;  // written to the log before the worker starts
  std::string error_file;  // its TORCHELASTIC_ERROR_FILE (removed before it starts)
  std::vector<int> cpus;   // if not empty: the only CPUs it may run on (cpu_bind)
  // The built-in trainer, or a Python program with `preload`: a copy of a worker server where one
  // can serve (agent/worker_forks.h), whose environment is `shared_env` (env without the task's
  // own variables), a warm interpreter that has imported `preload` if that is not empty.
  bool fork = false;
  std::vector<std::string> shared_env;
  std::vector<std::string> preload;
};

struct WorkerExit {
  int local_rank = 0;
  int rank = 0;
  pid_t pid = 0;
  ExitInfo exit;
};

class WorkerGroup {
 public:
  // `forks`, if given, starts the launches that ask for it and outlives the group.
  explicit WorkerGroup(bool color_output, WorkerForks* forks = nullptr);
  ~WorkerGroup();  // Stop(0)

  // Starts every worker. If one cannot start, stops those already started and returns why.
  Status Start(const std::vector<WorkerLaunch>& workers);
  // Starts the worker at `local_rank` again (it must have exited), with `launch`.
  Status Restart(int local_rank, const WorkerLaunch& launch);
  // Reaps workers that have exited since the last call; never blocks.
  std::vector<WorkerExit> ReapExited();
  bool AllExited() const;
  // Each live worker's pid, by local rank (0 for one that has exited).
  std::vector<pid_t> Pids() const;
  bool Exited(int local_rank) const;
  // Stop() for the workers at `local_ranks` only; the others go on.
  void StopSome(const std::vector<int>& local_ranks, Duration grace);
  // SIGTERM to every live worker's process group, up to `grace` for them to exit, then SIGKILL;
  // returns once all are reaped. Also kills whatever the workers left in their groups.
  void Stop(Duration grace);
  // Workers that cannot make progress, seen in /proc: stopped by a signal (state T, not a
  // debugger's t) for
  // `stopped` or longer, or in uninterruptible sleep (D) for `blocked` or longer. Each is killed
  // (its process group, SIGKILL), so that it is reaped as a failure; returns local rank -> why
  // ("stopped (SIGSTOP) for 5s"). Call every second or so.
  std::vector<std::pair<int, std::string>> KillStuck(Duration stopped, Duration blocked);
  // The last lines of a worker's output, after giving its pipe up to `drain` to reach EOF.
  std::vector<std::string> Tail(int local_rank, Duration drain);

 private:
  struct Worker {
    WorkerLaunch launch;
    pid_t pid = -1;
    bool exited = false;
    char state = 0;                   // its /proc state when last looked at
    Clock::time_point state_since{};  // since when it has been in it
  };
  // How `launch` is started, but for its output.
  static SpawnOptions Options(const WorkerLaunch& launch);
  Result<pid_t> SpawnOne(const WorkerLaunch& launch);
  // SIGTERM to the selected workers' groups, up to `grace`, then SIGKILL; reaps them.
  template <typename Pick>
  void StopWhere(Pick pick, Duration grace);

  bool color_;
  WorkerForks* forks_;
  std::vector<Worker> workers_;
  std::unique_ptr<OutputPump> pump_;
};

}  // namespace trainctl
