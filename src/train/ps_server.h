// The ps role of the built-in trainer's parameter_server strategy: one shard of the parameters
// and of the optimizer's state, served on the task's own address (TRAINCTL_TASK_ADDR) with the
// job's token until the agent stops it. See comm/ps/ps.h for what a shard does.
#pragma once

#include "job/task_env.h"
#include "jobspec/job_spec.h"

namespace trainctl::train {

// Returns the process's exit code (0 once stopped by SIGTERM or SIGINT).
int RunParameterServer(const JobSpec& spec, const TaskEnv& env);

}  // namespace trainctl::train
