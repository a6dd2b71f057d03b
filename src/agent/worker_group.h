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

#include "agent/agent_env.h"
#include "agent/output_pump.h"
#include "agent/worker_forks.h"
#include "common/duration.h"
#include "common/status.h"
#include "common/subprocess.h"

namespace trainctl {

class WorkerGroup : public TaskGroup {
 public:
  // `forks`, if given, starts the launches that ask for it and outlives the group.
  explicit WorkerGroup(bool color_output, WorkerForks* forks = nullptr);
  ~WorkerGroup() override;  // Stop(0)

  // Starts every worker. If one cannot start, stops those already started and returns why.
  Status Start(const std::vector<WorkerLaunch>& workers) override;
  // Starts the worker at `local_rank` again (it must have exited), with `launch`.
  Status Restart(int local_rank, const WorkerLaunch& launch) override;
  // Reaps workers that have exited since the last call; never blocks.
  std::vector<WorkerExit> ReapExited() override;
  bool AllExited() const;
  // Each live worker's pid, by local rank (0 for one that has exited).
  std::vector<pid_t> Pids() const override;
  bool Exited(int local_rank) const override;
  // Stop() for the workers at `local_ranks` only; the others go on.
  void StopSome(const std::vector<int>& local_ranks, Duration grace) override;
  // SIGTERM to every live worker's process group, up to `grace` for them to exit, then SIGKILL;
  // returns once all are reaped. Also kills whatever the workers left in their groups.
  void Stop(Duration grace) override;
  // Workers that cannot make progress, seen in /proc: stopped by a signal (state T, not a
  // debugger's t) for
  // `stopped` or longer, or in uninterruptible sleep (D) for `blocked` or longer. Each is killed
  // (its process group, SIGKILL), so that it is reaped as a failure; returns local rank -> why
  // ("stopped (SIGSTOP) for 5s"). Call every second or so.
  std::vector<std::pair<int, std::string>> KillStuck(Duration stopped, Duration blocked) override;
  // The last lines of a worker's output, after giving its pipe up to `drain` to reach EOF.
  std::vector<std::string> Tail(int local_rank, Duration drain) override;
  int WaitSignal(Duration wait) override;

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
