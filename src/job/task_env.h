// TaskEnv: the environment every task of a job gets, typed, both ways. The agent writes it
// (ApplyTo) into each task's environment; the built-in trainer and any other program of ours read
// it back (FromEnv). The names are torchrun's (so PyTorch programs run unchanged), TF_CONFIG as
// Kubeflow's TFJob sets it (so TensorFlow-style programs find their peers), and TRAINCTL_* for
// what is trainctl's own. docs/cli.md lists them for users.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace trainctl {

struct TaskEnv {
  // torchrun's contract.
  int rank = 0;                      // RANK: this task among all tasks of the job
  int local_rank = 0;                // LOCAL_RANK: among the tasks of this node
  int world_size = 1;                // WORLD_SIZE
  int local_world_size = 1;          // LOCAL_WORLD_SIZE
  int group_rank = 0;                // GROUP_RANK: this node's rank
  int group_world_size = 1;          // GROUP_WORLD_SIZE: nodes in the round
  std::string role_name = "worker";  // ROLE_NAME
  int role_rank = 0;                 // ROLE_RANK: this task among the tasks of its role (its task index)
  int role_world_size = 1;           // ROLE_WORLD_SIZE: tasks of this role
  std::string master_addr;           // MASTER_ADDR, MASTER_PORT: where rank 0 serves torch's store
  int master_port = 0;
  int restart_count = 0;  // TORCHELASTIC_RESTART_COUNT: the job's worker-group restarts so far
  int max_restarts = 0;   // TORCHELASTIC_MAX_RESTARTS
  std::string run_id;     // TORCHELASTIC_RUN_ID (and TRAINCTL_RUN_ID)
  // TORCHELASTIC_ERROR_FILE: where the task writes its exception if it fails (torch's @record
  // does); a fresh path for every attempt, read by the agent (job/error_file.h).
  std::string error_file;

  // TF_CONFIG, JSON, exactly as Kubeflow's TFJob sets it; "" (unset) for jobs without roles.
  std::string tf_config;

  // trainctl's own.
  std::string job_name;        // TRAINCTL_JOB_NAME
  std::string output_dir;      // TRAINCTL_OUTPUT_DIR
  std::string checkpoint_dir;  // TRAINCTL_CHECKPOINT_DIR
  std::string store_addr;      // TRAINCTL_STORE_ADDR: the job's store (URL), token, key prefix
  std::string store_token;     // TRAINCTL_STORE_TOKEN
  std::string store_prefix;    // TRAINCTL_STORE_PREFIX
  std::string host;            // TRAINCTL_HOST: this node's address for its peers
  std::string task_addr;       // TRAINCTL_TASK_ADDR: host:port reserved for this task ("" if none)
  int round = 0;               // TRAINCTL_ROUND: the rendezvous round the task started in
  int task_restarts = 0;       // TRAINCTL_TASK_RESTARTS: times this task alone was restarted
  bool tty = false;            // TRAINCTL_TTY: output reaches a terminal (redraw status lines)

  // Sets every variable above in `env` ("KEY=VALUE" entries), replacing what was there.
  void ApplyTo(std::vector<std::string>* env) const;
  // Reads them back. Errors (kInvalidArgument) name the variable that is missing or malformed;
  // RANK, WORLD_SIZE and TRAINCTL_STORE_ADDR are required, the rest have the defaults above.
  static Result<TaskEnv> FromEnv(const std::vector<std::string>& env);
  // FromEnv of this process's environment.
  static Result<TaskEnv> FromProcess();
};

// The variables trainctl sets for every task that a job spec's env may not set (TRAINCTL_* are
// reserved as a prefix too).
const std::vector<std::string>& ReservedEnvNames();
bool IsReservedEnvName(const std::string& name);

}  // namespace trainctl
