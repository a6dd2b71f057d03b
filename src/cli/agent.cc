#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <thread>

#include "agent/agent.h"
#include "cli/verbs.h"
#include "common/exit_codes.h"
#include "common/log.h"
#include "common/subprocess.h"
#include "common/fs.h"
#include "launch/local/local_launcher.h"
#include "store/open_store.h"
#include "store/tcp/tcp_store.h"

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
    std::string spec;
    bool serve_store = false;
  };
  static Flags flags_storage;
  Flags* f = &flags_storage;
  cmd->add_option("--node-rank", f->node_rank, "this node's rank; -1: by arrival")->capture_default_str();
  cmd->add_option("--run-id", f->run_id, "the job run's id")->required();
  cmd->add_option("--host", f->host, "this node's address for its peers; auto: its host name")
      ->capture_default_str();
  cmd->add_flag("--color", f->color, "colour the [worker-N] prefixes");
  cmd->add_option("--spec", f->spec,
                  "the job spec (YAML, or the JSON that render writes) instead of the store's copy: "
                  "for agents that a cluster engine starts")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--serve-store", f->serve_store,
                "node 0 serves the job's store itself, on every interface at the port of the "
                "tcp:// URL, with the job's token (for clusters without an etcd; needs --spec)");
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
    std::optional<JobSpec> file_spec;
    if (!f->spec.empty()) {
      auto text = ReadFile(f->spec);
      auto loaded = !text.ok() ? Result<JobSpec>(text.status())
                    : (!text->empty() && (*text)[0] == '{') ? JobSpecFromJson(*text)
                                                            : ParseJobSpec(*text, f->spec);
      if (!loaded.ok()) {
        LOG_ERROR("{}: {}", f->spec, loaded.status().message());
        *code = kExitInvalidSpec;
        return;
      }
      file_spec = *loaded;
    }
    // Node 0 hosts the store when no launcher does (a cluster engine started every agent).
    std::unique_ptr<TcpStoreServer> server;
    if (f->serve_store && f->node_rank == 0) {
      std::string host;
      uint16_t port = 0;
      Status st = !file_spec ? InvalidArgument("--serve-store needs --spec")
                  : addr.rfind("tcp://", 0) != 0
                      ? InvalidArgument("--serve-store needs a tcp:// store URL, got " + addr)
                      : ParseHostPort(addr.substr(6), &host, &port);
      TcpStoreServerOptions so;
      so.host = "0.0.0.0";
      so.port = port;
      so.token = token;
      auto started = st.ok() ? TcpStoreServer::Start(so) : Result<std::unique_ptr<TcpStoreServer>>(st);
      if (!started.ok()) {
        LOG_ERROR("cannot serve the job's store: {}", started.status().message());
        *code = started.status().code() == Code::kInvalidArgument ? kExitInvalidSpec : kExitError;
        return;
      }
      server = std::move(*started);
    }
    auto client = OpenStore(server ? "tcp://127.0.0.1:" + std::to_string(server->port()) : addr, token,
                            file_spec ? file_spec->timeouts.rendezvous : std::chrono::seconds(30));
    if (!client.ok()) {
      LOG_ERROR("{}", client.status().message());
      *code = client.status().code() == Code::kInvalidArgument ? kExitInvalidSpec : kExitError;
      return;
    }
    LOG_DEBUG("connected to the job's store{}", server ? " (served here)" : " at " + addr);
    const std::string prefix = "/trainctl/" + f->run_id + "/";
    PrefixStore store(std::move(*client), prefix);
    if (server) {
      if (Status st = store.Set(keys::kSpec, JobSpecToJson(*file_spec)); !st.ok()) {
        LOG_ERROR("{}", st.message());
        *code = kExitError;
        return;
      }
    }
    auto spec = [&]() -> Result<JobSpec> {
      if (file_spec) return *file_spec;
      ASSIGN_OR_RETURN(std::string json, store.Get(keys::kSpec, std::chrono::seconds(30)));
      return JobSpecFromJson(json);
    }();
    if (!spec.ok()) {
      LOG_ERROR("cannot read the job spec from the store: {}", spec.status().message());
      *code = kExitError;
      return;
    }
    LOG_DEBUG("job spec of {} read{}", spec->name, file_spec ? " from " + f->spec : " from the store");
    AgentOptions o;
    o.spec = *spec;
    o.node_rank = f->node_rank;
    o.run_id = f->run_id;
    o.host = f->host;
    if (o.host == "auto") {
      char name[256] = {};
      ::gethostname(name, sizeof name - 1);
      o.host = name;
    }
    o.store_addr = addr;
    o.store_token = token;
    o.store_prefix = prefix;
    o.color_output = f->color;
    auto started = store.Add(keys::kAgentsStarted, 1);
    Agent agent(o, &store);
    *code = agent.Run();
    auto exited = store.Add(keys::kAgentsExited, 1);
    if (server && started.ok() && exited.ok()) {
      // The store goes when this process does: first let the other agents see how the job ended.
      const auto deadline = Clock::now() + spec->timeouts.stop_grace + std::chrono::seconds(5);
      while (Clock::now() < deadline) {
        auto all = store.Add(keys::kAgentsStarted, 0);
        auto done = store.Add(keys::kAgentsExited, 0);
        if (!all.ok() || !done.ok() || *done >= *all) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
  });
}

}  // namespace trainctl::cli
