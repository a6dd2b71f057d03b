#include "agent/start.h"
#include "cli/verbs.h"
#include "common/log.h"
#include "common/subprocess.h"
#include "job/agent_command.h"

namespace trainctl::cli {

void AddAgent(CLI::App& app, const GlobalFlags& flags, int* code) {
  auto* cmd = app.add_subcommand(
      "agent", std::string("Run one node's agent (started by the launchers; the store's URL, tcp://host:port "
               "or etcd://host:port[,...], and token come from ") + kEnvStoreAddr + " and " +
               kEnvStoreToken + ")");
  static AgentProcessOptions storage;
  AgentProcessOptions* f = &storage;
  auto* rank = cmd->add_option("--node-rank", f->node_rank, "this node's rank; -1: by arrival")
                   ->capture_default_str();
  cmd->add_option("--task", f->task,
                  "ROLE:INDEX: this node runs that one task of the spec's roles (a pod per task, "
                  "as the rendered TFJob and per-role Jobs run)")
      ->excludes(rank);
  cmd->add_option("--run-id", f->run_id, "the job run's id")->required();
  cmd->add_option("--host", f->host, "this node's address for its peers; auto: its host name")
      ->capture_default_str();
  cmd->add_flag("--color", f->color, "colour the [worker-N] prefixes");
  cmd->add_option("--spec", f->spec_file,
                  "the job spec (YAML, or the JSON that render writes) instead of the store's copy: "
                  "for agents that a cluster engine starts")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--serve-store", f->serve_store,
                "node 0 serves the job's store itself, on every interface at the port of the "
                "tcp:// URL, with the job's token (for clusters without an etcd; needs --spec)");
  cmd->callback([f, &flags, code] {
    log::SetLevel(flags.log_level);
    BlockSupervisorSignals();
    *code = RunAgentProcess(*f);
  });
}

}  // namespace trainctl::cli
