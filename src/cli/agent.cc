#include <cstdlib>

#include "agent/agent.h"
#include "cli/verbs.h"
#include "common/exit_codes.h"
#include "common/log.h"
#include "common/subprocess.h"
#include "launch/local/local_launcher.h"
#include "store/open_store.h"

namespace trainctl::cli {

void AddAgent(CLI::App& app, const GlobalFlags& flags, int* code) {
  auto* cmd = app.add_subcommand(
      "agent", "Run one node's agent (started by the launchers; the store's URL, tcp://host:port "
               "or etcd://host:port[,...], and token come from TRAINCTL_AGENT_STORE and "
               "TRAINCTL_AGENT_TOKEN)");
  struct Flags {
    int node_rank = -1;
    std::string run_id;
    std::string host = "127.0.0.1";
    bool color = false;
  };
  static Flags flags_storage;
  Flags* f = &flags_storage;
  cmd->add_option("--node-rank", f->node_rank, "this node's rank; -1: by arrival")->capture_default_str();
  cmd->add_option("--run-id", f->run_id, "the job run's id")->required();
  cmd->add_option("--host", f->host, "this node's address for its peers")->capture_default_str();
  cmd->add_flag("--color", f->color, "colour the [worker-N] prefixes");
  cmd->callback([f, &flags, code] {
    log::SetLevel(flags.log_level);
    BlockSupervisorSignals();
    const char* addr_env = std::getenv(kEnvStoreAddr);
    const char* token_env = std::getenv(kEnvStoreToken);
    if (!addr_env) {
      std::fprintf(stderr, "trainctl agent: %s must be set to the job's store URL\n", kEnvStoreAddr);
      *code = kExitInvalidSpec;
      return;
    }
    const std::string addr = addr_env, token = token_env ? token_env : "";
    // The token must not leak into the workers' environment under this name.
    ::unsetenv(kEnvStoreToken);
    ::unsetenv(kEnvStoreAddr);
    auto client = OpenStore(addr, token);
    if (!client.ok()) {
      LOG_ERROR("{}", client.status().message());
      *code = client.status().code() == Code::kInvalidArgument ? kExitInvalidSpec : kExitError;
      return;
    }
    const std::string prefix = "/trainctl/" + f->run_id + "/";
    PrefixStore store(std::move(*client), prefix);
    auto spec_json = store.Get(keys::kSpec, std::chrono::seconds(30));
    auto spec = spec_json.ok() ? JobSpecFromJson(*spec_json) : Result<JobSpec>(spec_json.status());
    if (!spec.ok()) {
      LOG_ERROR("cannot read the job spec from the store: {}", spec.status().message());
      *code = kExitError;
      return;
    }
    AgentOptions o;
    o.spec = *spec;
    o.node_rank = f->node_rank;
    o.run_id = f->run_id;
    o.host = f->host;
    o.store_addr = addr;
    o.store_token = token;
    o.store_prefix = prefix;
    o.color_output = f->color;
    Agent agent(o, &store);
    *code = agent.Run();
  });
}

}  // namespace trainctl::cli
