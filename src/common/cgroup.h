// A job's own cgroup (v2), where the system lets this user make one (root, or a delegated
// subtree such as systemd gives a user's session): every process of the job is in it, daemons
// that double-forked away from their worker included, so that all of them can be ended at once
// (cgroup.kill), even after the launcher was SIGKILLed. Where none can be made, the job runs
// without one and the subreapers (agent, launcher) do what they can. docs/security.md.
#pragma once

#include <string>

#include "common/status.h"

namespace trainctl {

// The environment variable that hands an agent its job's cgroup.
inline constexpr const char* kEnvCgroup = "TRAINCTL_CGROUP";

// Makes <this process's cgroup>/trainctl-<run_id> on the cgroup2 mount; its path, or "" when
// there is no cgroup2 or it cannot be written here.
std::string MakeJobCgroup(const std::string& run_id);
// Moves the calling process (and so everything it starts from now on) into `dir`.
Status EnterCgroup(const std::string& dir);
// Moves the calling process out of `dir` (a job's cgroup) into its parent: for an agent whose
// launcher died, which then ends the job's cgroup (KillJobCgroup) without ending itself first.
Status LeaveCgroup(const std::string& dir);
// Whether `dir` (a job's cgroup) exists and still holds a process.
bool CgroupPopulated(const std::string& dir);
// Kills every process in `dir` (cgroup.kill, else SIGKILL to each), waits up to 5 s for it to
// empty, and removes it (again while the kernel says it is busy). Returns how many processes it
// held; -1 when `dir` is not a job's cgroup.
int KillJobCgroup(const std::string& dir);

}  // namespace trainctl
