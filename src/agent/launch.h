// A task's launch worked out from the job, its round and the task alone: the command, the
// environment (torchrun's variables and trainctl's, on the agent's own), the CPUs, the log and
// the error file. Nothing is started and no state is read: the agent gives what it knows.
#pragma once

#include <string>
#include <vector>

#include "agent/agent_env.h"
#include "job/tasks.h"
#include "jobspec/job_spec.h"
#include "rendezvous/rendezvous.h"

namespace trainctl {

// What the agent knows of itself.
struct LaunchSite {
  std::string run_id, store_addr, store_token, store_prefix, host;
  bool color_output = false;     // its output reaches a terminal
  std::string timer_file;        // TORCHELASTIC_TIMER_FILE it serves for its workers ("" for none)
  std::vector<std::string> env;  // its environment ("K=V"), which each task's starts from
  std::vector<int> cpus;         // the CPUs it may use, which cpu_bind: cores shares out
  std::string self_exe;          // this binary, which runs the built-in trainer
  bool debug = false;            // it logs at debug level, and so does the trainer
};

// The round the task runs in.
struct LaunchRound {
  int round = 0;
  RoundInfo info;
  int world_size = 0;                               // the round's tasks
  std::string master;                               // MASTER_ADDR:MASTER_PORT
  const std::vector<Task>* all = nullptr;           // every task, by rank (for TF_CONFIG)
  const std::vector<std::string>* addrs = nullptr;  // every task's host:port, or empty (no TF_CONFIG)
};

// The launch of task `t` of `role` (its `task_restarts`-th restart within the round).
WorkerLaunch PlanLaunch(const JobSpec& spec, const RoleSpec& role, const LaunchRound& round, const Task& t,
                        int task_restarts, const LaunchSite& site);

}  // namespace trainctl
