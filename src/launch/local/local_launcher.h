// LocalLauncher: runs a job from this machine. Serves the job's TCP store (on loopback unless
// LaunchOptions::store_host says otherwise, with a fresh token per run) unless the spec names an
// etcd cluster as `rendezvous:`; starts the agents, one `trainctl agent` process per node here or
// one per host under mpirun (LaunchOptions::placement); forwards Ctrl-C and SIGTERM to them,
// enforces timeouts.job, and prints the failure report at the end. Leaves
// <output_dir>/status.json (state, exit code, restarts, failure) for scripts.
#pragma once

#include "launch/launcher.h"

namespace trainctl {

class LocalLauncher : public Launcher {
 public:
  int Run(const JobSpec& spec, const LaunchOptions& options) override;
};

}  // namespace trainctl
