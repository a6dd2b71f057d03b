// LocalLauncher: runs a job from this machine. Serves the job's TCP store (on loopback unless
// LaunchOptions::store_host says otherwise, with a fresh token per run) unless the spec names an
// etcd cluster as `rendezvous:`; starts the agents, one `trainctl agent` process per node here or
// one per host under mpirun (LaunchOptions::placement); forwards Ctrl-C and SIGTERM to them,
// enforces timeouts.job, and prints the failure report at the end. Leaves
// <output_dir>/status.json (state, exit code, restarts, failure) for scripts.
#pragma once

#include "job/runs.h"
#include "launch/launcher.h"

namespace trainctl {

class LocalLauncher : public Launcher {
 public:
  int Run(const JobSpec& spec, const LaunchOptions& options) override;
};

// What `trainctl ps/logs/stop` know of a run that this process drives (the launcher, or a host's
// agent under `trainctl torchrun`): its entry in the run index, written by Register.
runs::RunEntry RunEntryFor(const JobSpec& spec, const std::string& run_id, const std::string& target);
// The run's status.json while it runs (state "running", this process, when it started).
Status WriteRunningStatus(const runs::RunEntry& entry);
// The time since `start`, as status.json records a run's ("1m30s").
std::string Elapsed(Clock::time_point start);

}  // namespace trainctl
