// Agent: supervises one node's tasks for a job. It joins a rendezvous round, starts the tasks
// that its node runs (job/tasks.h: the tasks of every role, spread over the nodes) with the
// torchrun-compatible environment (job/task_env.h), streams their output, and watches both its
// tasks and the job's shared state on the store:
//
//   INIT -> RENDEZVOUS -> HEALTHY -> SUCCEEDED            (the tasks that decide success exited 0)
//                           |-> FAILED -> (restart budget left) -> RENDEZVOUS of the next round
//                           |-> FAILED -> (budget spent) -> exit kExitWorkerFailed
//                           |-> STOPPED (signal or job stop) -> exit with the stop's code
//
// A round ends for every node at once: the first agent to see why records it with
// compare-and-set under round/<r>/end (job/records.h), and all agents act on that record.
// - Success: each task of a role with `success` that exits 0 is counted; the agent whose count
//   completes the set records the success. Every agent then stops its remaining tasks: roles
//   with `finish` (the evaluator) get timeouts.finish to end on their own, the rest (ps, workers
//   after a chief) are stopped at once. A task that fails once the job has succeeded is not a
//   failure.
// - Failure: a task exiting non-zero does what its role's on_failure says: restart_job ends the
//   round (every node stops its tasks and joins round r+1 while the restart budget lasts);
//   restart_task starts that task alone again (counted in task_restarts, against the same
//   budget); ignore reports it and goes on. A node lost (the agent watching it in a ring saw no
//   heartbeat for timeouts.heartbeat) ends the round too.
// Elastic jobs (nodes.min < nodes.max) go on with the nodes that join the next round. A node
// arriving while a round runs waits (round/<r>/waiting); group rank 0 then ends the round to
// admit it, as a membership change that spends no restart. The restart budget is the job's: the
// count travels in the round's state and end record, so a node that leaves and rejoins cannot
// reset it.
#pragma once

#include <atomic>
#include <optional>
#include <string>

#include "agent/agent_env.h"
#include "agent/file_timer.h"
#include "agent/worker_forks.h"
#include "common/address.h"
#include "job/records.h"
#include "job/task_env.h"
#include "job/tasks.h"
#include "jobspec/job_spec.h"
#include "rendezvous/rendezvous.h"
#include "rendezvous/round_end.h"
#include "store/store.h"

namespace trainctl {

struct AgentOptions {
  JobSpec spec;        // output and checkpoint dirs already absolute
  int node_rank = -1;  // -1: assigned by arrival order
  std::string run_id;
  std::string host = "127.0.0.1";     // this node's address for peers (MASTER_ADDR when rank 0)
  std::vector<std::string> replaces;  // the ids of the dead agents this one replaces (RendezvousOptions)
  std::string store_addr;             // URL, handed to tasks
  std::string store_token;            // handed to tasks
  std::string store_prefix;           // handed to tasks
  bool color_output = false;
  // A stop signal (SIGTERM, SIGINT) takes this node out of the job instead of stopping the job:
  // the others go on at a new round, as when a node is lost. A Kubernetes pod's SIGTERM means
  // the pod is going away (deleted, evicted, its node drained), not that the job should end.
  bool leave_on_signal = false;
  std::atomic<int>* group_rank = nullptr;  // if set: this node's group rank in the current round
  // How often a round's watch reads the store (the stop key, the round's end; a task's exit
  // wakes it at once). Jobs of many nodes read less often: 0.25 ms x nodes, up to 1 s, so
  // that a thousand agents polling do not become the store's whole load; a job of one node every
  // 500 ms, since its launcher nudges it to stop (kNudgeSignal).
  Duration poll_interval = std::chrono::milliseconds(50);
};

// The states of the diagram above, each a method: Rendezvous (join round r, place the tasks),
// StartTasks (the master's and the tasks' addresses, the tasks), Watch (HEALTHY: stop requests,
// the tasks' exits in OnTaskExit, stuck tasks, the heartbeat ring and scale-up in Beat, the
// round's end by anyone), FinishRound (the tasks stopped or let finish), and AfterRound (FAILED:
// the budget, the back-off, or the end of the job).
class Agent {
 public:
  // `store` is the job's store, already prefixed with the run's key space; not owned. `env` (not
  // owned; ProcessEnv() when null) is the machine: tests give a fake one.
  Agent(AgentOptions options, Store* store, AgentEnv* env = nullptr);
  // Runs until the job ends; returns a trainctl exit code. Expects BlockSupervisorSignals() (with
  // ProcessEnv).
  int Run();

 private:
  struct Outcome;
  struct Round;  // what one round of this node runs
  Outcome RunRound(int round, int restarts);
  // nullopt: go on to the next state; an outcome ends the round.
  std::optional<Outcome> Rendezvous(int restarts, Round* r);
  std::optional<Outcome> StartTasks(Round* r);
  Outcome Watch(Round& r);
  std::optional<Outcome> OnTaskExit(Round& r, const WorkerExit& e);
  std::optional<Outcome> Beat(Round& r);
  void KillStuckTasks(Round& r);
  // The round ended with `rec` (this agent's or a peer's): stop, or let finish, the tasks.
  Outcome FinishRound(Round& r, const FailureRecord& rec);
  // The exit code once the job is over, or nullopt to join the next round (after the back-off).
  std::optional<int> AfterRound(const Outcome& out, int* restarts, int* quick_failures, Duration ran_for);
  Outcome WaitOutRound(int round, const RoundInfo& full);
  Outcome Stopped(const Status& why);
  static Outcome Error(int code, const std::string& message);
  // Records `rec` as the round's end (the first record wins): the outcome is the winner.
  Outcome EndWith(const Round& r, const FailureRecord& rec);
  // EndWith, then this node's tasks stopped (and, for a task's failure, the root cause posted).
  Outcome EndAndStop(Round& r, const FailureRecord& rec, bool root_cause);
  // Waits for `key`, checking for a stop and for the round's end meanwhile.
  Result<std::string> WaitForKey(int round, const std::string& key);
  // Every task's host:port (by rank), for TF_CONFIG: this node reserves its tasks' ports.
  Result<std::vector<std::string>> ExchangeTaskAddrs(const Round& r);
  WorkerLaunch Launch(const Round& r, const Task& task, int task_restarts) const;
  // kAborted when a stop was requested (a signal here, or the job's stop key); store errors.
  Status CheckStop();
  Status CheckStopSignal();  // only the signal: the stop key is read with other keys
  // An interval that grows with the job, `per_1000_nodes` x nodes / 1000 within [least, most]:
  // how often agents read the store (the round's watch; the stop key while waiting for a round
  // to close or the job to end), so that a stop reaches small jobs at once and a thousand agents
  // polling are not the store's whole load.
  Duration ByJobSize(Duration per_1000_nodes, Duration least, Duration most) const;
  FailureRecord NewFailure(FailureKind kind, int round, int group_rank) const;
  // The task's error file (its exception, traceback, time) into `rec`; a bad file is named in a
  // warning and left out.
  void AddTaskError(const Round& r, const Task& t, int task_restarts, FailureRecord* rec) const;
  // Once this node's tasks of a failed round have stopped: the earliest error among their error
  // files, compare-and-set into the round's root cause unless a peer's is earlier. `failed`: the
  // task whose failure ended the round, its error file read already.
  void PostRootCause(const Round& r, const std::vector<int>& task_restarts, const FailureRecord* failed = nullptr);

  AgentOptions o_;
  Store* store_;
  AgentEnv* env_;
  WorkerForks forks_;  // the built-in trainer's worker servers, across rounds
  std::string node_id_;
  // The ports handed to this round's tasks (TF_CONFIG) and, on node 0, the master port: held for
  // the round, so that no other agent on the host hands them out before the tasks bind them.
  PortLease task_ports_, master_port_;
  // torch's file timers (TORCHELASTIC_ENABLE_FILE_TIMER=1 in the job's or the agent's environment).
  std::unique_ptr<FileTimerServer> timers_;
};

}  // namespace trainctl
