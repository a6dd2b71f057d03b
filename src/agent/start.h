// The whole life of an agent process (`trainctl agent`): find the job's store from the
// environment (job/agent_command.h), serve it on node 0 when no launcher does, read the spec, run
// the Agent, and on node 0 keep the store up until the other agents have seen how the job ended.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "jobspec/job_spec.h"

namespace trainctl {

struct AgentProcessOptions {
  int node_rank = -1;  // -1: by arrival
  std::string task;    // "ROLE:INDEX": the node that runs that one task (pod per task)
  std::string run_id;
  // The job's store (URL) and token; empty: from the environment (kEnvStoreAddr, kEnvStoreToken),
  // where a launcher or a cluster engine's manifest puts them for `trainctl agent`.
  std::string store_addr, store_token;
  std::string host = "127.0.0.1";     // this node's address for peers; "auto": its host name
  std::vector<std::string> replaces;  // the ids of the dead agents this one replaces (AgentOptions)
  std::string spec_file;              // "" : the spec from the store
  const JobSpec* spec = nullptr;      // instead of spec_file (trainctl torchrun builds it in memory)
  bool serve_store = false;           // node 0 serves the store (needs spec_file)
  // With serve_store: when the store's port is in use here already (another command on this
  // machine serves it, as torchrun's c10d backend allows), join it by arrival instead.
  bool join_if_served = false;
  bool color = false;
  bool leave_on_signal = false;  // AgentOptions::leave_on_signal
  // The job's cgroup (its directory), entered already (by a fork server, PrepareAgentCopies);
  // "": the one the environment names (kEnvCgroup), entered first thing.
  std::string cgroup;
  // Serves the node's Prometheus metrics on metrics_port while the agent runs (0: not). The
  // server lives in the monitor module, which the agent does not link: the CLI passes it in.
  int metrics_port = 0;
  using MetricsServer =
      std::function<Result<std::shared_ptr<void>>(const JobSpec& spec, const std::string& run_id, int port,
                                                  const std::string& token, const std::atomic<int>* group_rank)>;
  MetricsServer serve_metrics;
};

// Returns the process's exit code. Expects BlockSupervisorSignals() and the log level set.
int RunAgentProcess(const AgentProcessOptions& options);

// For the fork server of a local job's agents (common/fork_server.h), before it serves: what each
// copy would do alike, done once. Enters the job's cgroup (the copies are born in it), takes the
// store's URL and token from the environment into `*options`, and reads and decodes the job's
// spec from the store into `*spec`, where options->spec then points. What fails is left for each
// copy to do, and report, itself. Starts no thread and writes nothing to stdio (ServeForks).
void PrepareAgentCopies(AgentProcessOptions* options, JobSpec* spec);

}  // namespace trainctl
