// TorchrunHostLauncher: one host's part of a job of several hosts under `trainctl torchrun`, each
// host running the same command line (as torchrun's own launcher does): this host's agent,
// joining the job's store (or serving it, on the endpoint's host), listed in the run index here
// with a status.json in the spec's output_dir for `trainctl ps/logs/stop`. No lock on the output
// directory and nothing moved aside: the hosts may share it. (A job of one host runs under
// LocalLauncher, as `trainctl run` does.)
#pragma once

#include "agent/start.h"
#include "launch/launcher.h"

namespace trainctl {

class TorchrunHostLauncher : public Launcher {
 public:
  // `agent`: how this host's agent finds the job (its store, node rank, address); its spec is
  // the one Run is given.
  explicit TorchrunHostLauncher(AgentProcessOptions agent) : agent_(std::move(agent)) {}
  int Run(const JobSpec& spec, const LaunchOptions& options) override;

 private:
  AgentProcessOptions agent_;
};

}  // namespace trainctl
