// LocalLauncher: runs a job from this machine. Serves the job's TCP store (on loopback unless
// LaunchOptions::store_host says otherwise, with a fresh token per run) unless the spec names an
// etcd cluster as `rendezvous:`; starts the agents, one `trainctl agent` process per node here or
// one per host under mpirun (LaunchOptions::placement); forwards Ctrl-C and SIGTERM to them,
// enforces timeouts.job, and prints the failure report at the end. Leaves
// <output_dir>/status.json (state, exit code, restarts, failure) for scripts.
#pragma once

#include <memory>
#include <string>

#include "job/runs.h"
#include "launch/launcher.h"
#include "store/tcp/tcp_store.h"

namespace trainctl {

class LocalLauncher : public Launcher {
 public:
  int Run(const JobSpec& spec, const LaunchOptions& options) override;
};

// The job's store: served here (on a Unix socket for a job of this machine, else TCP at
// options.store_host), `*url` its address; or none when the spec names an etcd cluster (`*url` is
// then the spec's `rendezvous:`).
Result<std::unique_ptr<TcpStoreServer>> HostStore(const JobSpec& spec, const LaunchOptions& options,
                                                  const std::string& token, std::string* url);

// The spec the agents read. A local job's agents share this machine's CPUs: with hundreds a CPU
// one can wait seconds for its turn (1024 on 2 CPUs: up to 7 s between two of its steps), which
// the peer watching its heartbeat must not take for a lost node. So its heartbeat timeout is at
// least 40 ms per agent a CPU, in whole seconds (1024 agents on 2 CPUs: 21 s; 4096: 82 s), and
// says so in the log when that raises it.
JobSpec AgentsSpec(const JobSpec& spec, const LaunchOptions& options);

// What `trainctl ps/logs/stop` know of a run that this process drives (the launcher, or a host's
// agent under `trainctl torchrun`): its entry in the run index, written by Register.
runs::RunEntry RunEntryFor(const JobSpec& spec, const std::string& run_id, const std::string& target);
// The run's status.json while it runs (state "running", this process, when it started).
Status WriteRunningStatus(const runs::RunEntry& entry);
// The time since `start`, as status.json records a run's ("1m30s").
std::string Elapsed(Clock::time_point start);

}  // namespace trainctl
