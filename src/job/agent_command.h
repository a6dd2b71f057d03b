// The agent's command line: `trainctl agent ...`, which every launcher builds (the local
// launcher's processes, mpirun and srun, Kubernetes pods, Slurm scripts). One builder, so the
// flags the agent parses and the flags the launchers pass never drift apart.
#pragma once

#include <string>
#include <vector>

namespace trainctl {

// The store's URL and token reach an agent in these variables, never in argv (argv is public).
inline constexpr const char* kEnvStoreAddr = "TRAINCTL_AGENT_STORE";
inline constexpr const char* kEnvStoreToken = "TRAINCTL_AGENT_TOKEN";

struct AgentCommand {
  std::string trainctl = "trainctl";  // the binary, as the node sees it
  std::string log_level;              // "" leaves the default
  std::string node_rank;              // a number, "-1" (by arrival), or "$(VAR)" in a manifest
  std::string task;                   // instead: "ROLE:INDEX", the one task this node runs
  std::string run_id;                 // the run's id, or "$(VAR)"
  std::string host;                   // "" leaves the default (127.0.0.1); "auto"; "$(POD_IP)"
  std::string spec_file;              // --spec: agents a cluster engine starts read it there
  std::vector<std::string> replaces;  // --replaces: the ids (host:pid) of the dead agents it replaces
  bool serve_store = false;           // --serve-store (needs spec_file)
  bool color = false;                 // --color
  bool leave_on_signal = false;       // --leave-on-signal: a signal takes the node out, not the job
  int metrics_port = 0;               // --metrics-port: serve /metrics there (0: not)

  std::vector<std::string> Argv() const;
};

}  // namespace trainctl
