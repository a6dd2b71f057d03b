// What the agent needs from the machine, behind one seam (as leveldb's Env): the clock, waiting
// for signals and for store keys (the rendezvous waits on it too), this process's environment and
// id, and the group of task processes a round runs.
// ProcessEnv() is the real machine; tests hand the agent a fake one (a clock they move, tasks
// whose exits they script) and run its policies in-process against a MemoryStore.
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/duration.h"
#include "common/status.h"
#include "common/subprocess.h"
#include "store/store.h"

namespace trainctl {

class WorkerForks;

struct WorkerLaunch {
  int local_rank = 0;
  int rank = 0;       // global
  std::string label;  // the output prefix: "worker-3", "ps-0"
  std::vector<std::string> argv;
  std::vector<std::string> env;
  std::string cwd;
  std::string log_path;    // appended to
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

// One agent's tasks for one round (agent/worker_group.h runs them as processes).
class TaskGroup {
 public:
  virtual ~TaskGroup() = default;
  // Starts every task. If one cannot start, stops those already started and returns why.
  virtual Status Start(const std::vector<WorkerLaunch>& workers) = 0;
  // Starts the task at `local_rank` again (it must have exited), with `launch`.
  virtual Status Restart(int local_rank, const WorkerLaunch& launch) = 0;
  // The tasks that have exited since the last call; never blocks.
  virtual std::vector<WorkerExit> ReapExited() = 0;
  // Each live task's pid, by local rank (0 for one that has exited).
  virtual std::vector<pid_t> Pids() const = 0;
  virtual bool Exited(int local_rank) const = 0;
  // Stop() for the tasks at `local_ranks` only; the others go on.
  virtual void StopSome(const std::vector<int>& local_ranks, Duration grace) = 0;
  // Asks every live task to stop, up to `grace`, then kills it; returns once all have exited.
  virtual void Stop(Duration grace) = 0;
  // Tasks that cannot make progress (stopped for `stopped`, in uninterruptible sleep for
  // `blocked`), killed so that they are reaped as failures: local rank -> why.
  virtual std::vector<std::pair<int, std::string>> KillStuck(Duration stopped, Duration blocked) = 0;
  // The last lines of a task's output, after giving it up to `drain` to end.
  virtual std::vector<std::string> Tail(int local_rank, Duration drain) = 0;
  // AgentEnv::WaitSignal, copying the tasks' output meanwhile: how the agent waits while they run.
  virtual int WaitSignal(Duration wait) = 0;
};

class AgentEnv {
 public:
  virtual ~AgentEnv() = default;
  virtual Clock::time_point Now() const = 0;
  // Waits up to `wait` for a signal the agent handles (a task's exit, a stop, a nudge); returns
  // it, or 0 when none came. A stop signal is left pending for StopSignal.
  virtual int WaitSignal(Duration wait) = 0;
  // A pending stop signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT), taken; 0 when there is none.
  virtual int StopSignal() = 0;
  // Waits up to `timeout` for one of `keys` to be set in `store`: the first set, by index, and its
  // value; or kTimeout. On this clock: the real one waits on the store (which answers as a key is
  // set, and ends the wait with kAborted on a stop signal); a test's moves its clock.
  virtual Result<std::pair<size_t, std::string>> WaitForAny(Store& store, const std::vector<std::string>& keys,
                                                            Duration timeout) = 0;
  // A variable of this process's environment.
  virtual std::optional<std::string> GetEnv(const std::string& name) const = 0;
  virtual long Pid() const = 0;
  // An empty group for a round's tasks; `forks` (the agent's worker servers) outlives it.
  virtual std::unique_ptr<TaskGroup> NewTaskGroup(bool color_output, WorkerForks* forks) = 0;
  // The time left until `deadline`, never negative.
  Duration Remaining(Clock::time_point deadline) const { return trainctl::Remaining(deadline, Now()); }
};

// This process on this machine: the steady clock, BlockSupervisorSignals' signals, WorkerGroup.
AgentEnv& ProcessEnv();

}  // namespace trainctl
