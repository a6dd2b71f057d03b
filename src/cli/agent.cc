#include <unistd.h>

#include <cstdio>
#include <ctime>

#include "agent/start.h"
#include "cli/verbs.h"
#include "common/fork_server.h"
#include "common/log.h"
#include "common/subprocess.h"
#include "job/agent_command.h"
#include "job/runs.h"
#include "monitor/prometheus.h"

namespace trainctl::cli {

namespace {

// The agent's /metrics on every interface (a pod's IP), guarded by the job's token. The node of
// group rank 0 exports the run's series (its files are on the volume every pod shares, so one
// node speaks for the run); the others answer with no series, and Prometheus' `up` says they live.
Result<std::shared_ptr<void>> ServeMetrics(const JobSpec& spec, const std::string& run_id, int port,
                                           const std::string& token, const std::atomic<int>* group_rank) {
  runs::RunEntry e;
  e.name = spec.name;
  e.run_id = run_id;
  e.output_dir = spec.output_dir;
  e.nodes = spec.nodes.max;
  e.procs_per_node = spec.procs_per_node;
  e.tasks = spec.world_size();
  e.pid = ::getpid();
  e.start_ticks = runs::StartTicks(e.pid);
  e.started = std::time(nullptr);
  auto exporter = std::make_shared<monitor::MetricsExporter>();
  auto render = [e, exporter, group_rank] {
    return exporter->Render(group_rank->load() == 0 ? std::vector<runs::RunEntry>{e} : std::vector<runs::RunEntry>{});
  };
  ASSIGN_OR_RETURN(auto server, monitor::MetricsServer::Start("0.0.0.0", port, token, render));
  LOG_DEBUG("serving /metrics on port {}", server->port());
  return std::shared_ptr<void>(std::move(server));
}

}  // namespace

void AddAgent(CLI::App& app, const GlobalFlags& flags, int* code) {
  auto* cmd = app.add_subcommand(
      "agent", std::string("Run one node's agent (started by the launchers; the store's URL, tcp://host:port, "
                           "unix:@name or etcd://host:port[,...], and token come from ") +
                   kEnvStoreAddr + " and " + kEnvStoreToken + ")");
  static AgentProcessOptions storage;
  AgentProcessOptions* f = &storage;
  auto* rank = cmd->add_option("--node-rank", f->node_rank, "this node's rank; -1: by arrival")->capture_default_str();
  cmd->add_option("--task", f->task,
                  "ROLE:INDEX: this node runs that one task of the spec's roles (a pod per task, "
                  "as the rendered TFJob and per-role Jobs run)")
      ->excludes(rank);
  cmd->add_option("--run-id", f->run_id, "the job run's id")->required();
  cmd->add_option("--host", f->host, "this node's address for its peers; auto: its host name")->capture_default_str();
  cmd->add_flag("--color", f->color, "colour the [worker-N] prefixes");
  cmd->add_flag("--leave-on-signal", f->leave_on_signal,
                "a stop signal (SIGTERM, SIGINT) takes this node out of the job instead of stopping "
                "it: the other nodes go on at a new round, as when a node is lost (what a Kubernetes "
                "pod's SIGTERM means: the pod is going away)");
  cmd->add_option("--replaces", f->replaces,
                  "HOST:PID[,...]: the dead agents of this node that this one takes the place of (the "
                  "local launcher starts a killed agent again so): a node rank one of them still holds "
                  "in an unfinished round is not a conflict")
      ->delimiter(',')
      ->allow_extra_args(false)
      ->group("");  // the launcher's, not a user's
  cmd->add_option("--metrics-port", f->metrics_port,
                  "serve Prometheus metrics at /metrics on this port, on every interface, with the "
                  "job's token as a bearer token (0: not)")
      ->check(CLI::Range(0, 65535));
  f->serve_metrics = ServeMetrics;
  cmd->add_option("--spec", f->spec_file,
                  "the job spec (YAML, or the JSON that render writes) instead of the store's copy: "
                  "for agents that a cluster engine starts")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--serve-store", f->serve_store,
                "node 0 serves the job's store itself, on every interface at the port of the "
                "tcp:// URL, with the job's token (for clusters without an etcd; needs --spec)");
  cmd->callback([f, &flags, code] {
    log::SetLevel(flags.log_level);
    // A local job's launcher starts one agent this way and has it fork the others, whose
    // --node-rank (the last argument) each copy rewrites: common/fork_server.h.
    static JobSpec copies_spec;  // a fork server's, which its copies share
    if (std::getenv(kEnvForkServerFd)) PrepareAgentCopies(f, &copies_spec);
    const auto node_rank = ServeForks(flags.argc, flags.argv);
    if (node_rank) f->node_rank = std::atoi(node_rank->c_str());
    BlockSupervisorSignals();
    *code = RunAgentProcess(*f);
    if (node_rank) {
      // A copy ends here: returning would run the destructors of the server's state (the command
      // line's parser, the logger), whose every page it shares copy-on-write and would copy
      // first, only to free it (an eighth of a 1024-node job's CPU on a VM). Its own work is done and
      // written; stdio is flushed.
      std::fflush(nullptr);
      ::_exit(*code);
    }
  });
}

}  // namespace trainctl::cli
