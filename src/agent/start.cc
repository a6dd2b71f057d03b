#include "agent/start.h"

#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <thread>

#include "agent/agent.h"
#include "common/address.h"
#include "common/cgroup.h"
#include "common/exit_codes.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/subprocess.h"
#include "job/agent_command.h"
#include "job/keys.h"
#include "job/tasks.h"
#include "store/open_store.h"
#include "store/tcp/tcp_store.h"

namespace trainctl {
namespace {

// The spec an agent that a cluster engine started reads: YAML, or the JSON that render writes.
Result<JobSpec> ReadSpecFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  if (!text.empty() && text[0] == '{') return JobSpecFromJson(text);
  return ParseJobSpec(text, path);
}

// The node that runs task ROLE:INDEX when every node runs one task (a pod per task).
Result<int> TaskNodeRank(const JobSpec& spec, const std::string& task) {
  const size_t colon = task.rfind(':');
  const std::string role = task.substr(0, colon);
  const RoleSpec* r = FindRole(spec.roles, role);
  int index = -1;
  if (colon != std::string::npos) index = std::atoi(task.c_str() + colon + 1);
  if (colon == std::string::npos || !r || task.find_first_not_of("0123456789", colon + 1) != std::string::npos ||
      index < 0 || index >= r->replicas) {
    return InvalidArgument("expected ROLE:INDEX naming one of the spec's tasks, such as worker:0");
  }
  if (spec.nodes.max != spec.world_size()) {
    return InvalidArgument("needs one task per node, but the spec has " + std::to_string(spec.world_size()) +
                           " tasks on " + std::to_string(spec.nodes.max) + " nodes");
  }
  std::vector<RoleSize> sizes;
  for (const auto& x : spec.roles) sizes.push_back({x.name, x.replicas});
  for (const auto& t : PlaceTasks(sizes, spec.nodes.max)) {
    if (t.role == role && t.index == index) return t.node;
  }
  return InvalidArgument("no such task");
}

int CodeFor(const Status& st) { return st.code() == Code::kInvalidArgument ? kExitInvalidSpec : kExitError; }

// The job's store URL and token: the options', else the environment's (unset then: the token must
// not reach the tasks under this name).
Result<std::pair<std::string, std::string>> StoreCredentials(const AgentProcessOptions& f) {
  const char* addr_env = std::getenv(kEnvStoreAddr);
  const char* token_env = std::getenv(kEnvStoreToken);
  std::string addr = !f.store_addr.empty() ? f.store_addr : addr_env ? addr_env : "";
  std::string token = !f.store_token.empty() ? f.store_token : token_env ? token_env : "";
  ::unsetenv(kEnvStoreToken);
  ::unsetenv(kEnvStoreAddr);
  if (addr.empty()) return InvalidArgument(std::string(kEnvStoreAddr) + " must be set to the job's store URL");
  if (addr.rfind("etcd", 0) != 0 && token.size() < 16) {
    // A guessable token opens the job's store (and with it the workers' commands) to its network.
    return InvalidArgument(std::string(kEnvStoreToken) +
                           " must hold the job's token, at least 16 characters (for "
                           "example openssl rand -hex 32); it has " +
                           std::to_string(token.size()));
  }
  return std::make_pair(std::move(addr), std::move(token));
}

// Serves the job's store on node 0 as `addr` (tcp://HOST:PORT) says: on loopback only when it
// names loopback (torchrun's 127.0.0.1, [::1] or localhost), else on every interface (a pod's or a
// host's address). Fills `*server` and `*served` (the URL this agent reaches it at), or, when this
// machine serves it already and `join_if_served`, sets `*node_rank` to -1 (by arrival). Returns the
// exit code when it can do neither.
std::optional<int> ServeStore(const AgentProcessOptions& f, const std::optional<JobSpec>& spec, const std::string& addr,
                              const std::string& token, int* node_rank, std::unique_ptr<TcpStoreServer>* server,
                              std::string* served) {
  std::string host;
  uint16_t port = 0;
  Status st = !spec                          ? InvalidArgument("--serve-store needs --spec")
              : addr.rfind("tcp://", 0) != 0 ? InvalidArgument("--serve-store needs a tcp:// store URL, got " + addr)
                                             : ParseHostPort(addr.substr(6), &host, &port);
  TcpStoreServerOptions so;
  const bool loopback = st.ok() && IsLoopbackHost(host);
  so.host = !loopback ? "0.0.0.0" : host == "localhost" ? "127.0.0.1" : host;
  so.port = port;
  so.token = token;
  auto started = st.ok() ? ServeJobStore(so, spec->store_clients()) : Result<std::unique_ptr<TcpStoreServer>>(st);
  if (!started.ok() && f.join_if_served && started.status().code() == Code::kAlreadyExists) {
    LOG_INFO("joining the job's store at {}: this machine serves it already (port {} in use)", addr.substr(6), port);
    *node_rank = -1;  // by arrival, as every other joining node
    return std::nullopt;
  }
  if (!started.ok()) {
    LOG_ERROR("cannot serve the job's store: {}", started.status().message());
    return CodeFor(started.status());
  }
  *server = std::move(*started);
  *served = "tcp://" + JoinHostPort(loopback ? so.host : "127.0.0.1", (*server)->port());
  LOG_INFO("serving the job's store at {} ({}, with the job's token)", addr.substr(6),
           loopback ? "on loopback only" : "on every interface");
  return std::nullopt;
}

// Until every agent that started has exited, or `within` has passed.
void WaitForTheOtherAgents(Store& store, Duration within) {
  const auto deadline = Clock::now() + within;
  while (Clock::now() < deadline) {
    auto all = store.Add(keys::kAgentsStarted, 0);
    auto done = store.Add(keys::kAgentsExited, 0);
    if (!all.ok() || !done.ok() || *done >= *all) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// Into the job's cgroup that the launcher names (kEnvCgroup) before anything starts, so that all
// it starts is in it; the cgroup's directory, or "" when there is none to enter.
std::string EnterTheJobsCgroup() {
  std::string cgroup;
  if (const char* dir = std::getenv(kEnvCgroup)) {
    if (Status st = EnterCgroup(dir); !st.ok()) {
      LOG_WARN("{}", st.message());
    } else {
      cgroup = dir;
    }
    ::unsetenv(kEnvCgroup);
  }
  return cgroup;
}

// The spec an agent is given (--spec, or a cluster engine's in-process one) and its node rank
// (--task names it); the exit code when either is wrong.
std::optional<int> GivenSpecAndRank(const AgentProcessOptions& f, std::optional<JobSpec>* file_spec, int* node_rank) {
  if (f.spec) *file_spec = *f.spec;
  if (!f.spec_file.empty()) {
    auto loaded = ReadSpecFile(f.spec_file);
    if (!loaded.ok()) {
      LOG_ERROR("{}: {}", f.spec_file, loaded.status().message());
      return kExitInvalidSpec;
    }
    *file_spec = *loaded;
  }
  *node_rank = f.node_rank;
  if (!f.task.empty()) {  // a pod per task: its node is the task's
    auto rank = *file_spec ? TaskNodeRank(**file_spec, f.task) : Result<int>(InvalidArgument("needs --spec"));
    if (!rank.ok()) {
      LOG_ERROR("--task {}: {}", f.task, rank.status().message());
      return kExitInvalidSpec;
    }
    *node_rank = *rank;
  }
  return std::nullopt;
}

// The job's spec: the one given, else the store's (the launcher's, or node 0's that serves it).
Result<JobSpec> TheJobsSpec(Store& store, const std::optional<JobSpec>& file_spec) {
  if (file_spec) return *file_spec;
  ASSIGN_OR_RETURN(std::string json, store.Get(keys::kSpec, std::chrono::seconds(30)));
  return JobSpecFromJson(json);
}

}  // namespace

void PrepareAgentCopies(AgentProcessOptions* f, JobSpec* spec) {
  if (f->cgroup.empty()) f->cgroup = EnterTheJobsCgroup();
  if (f->spec || !f->spec_file.empty() || f->serve_store) return;
  auto credentials = StoreCredentials(*f);
  if (!credentials.ok()) return;
  f->store_addr = credentials->first;
  f->store_token = credentials->second;
  if (IsEtcdUrl(f->store_addr)) return;  // its client is a plugin, which may start threads
  auto client = OpenStore(f->store_addr, f->store_token, std::chrono::seconds(30), [] { return StopSignal() != 0; });
  if (!client.ok()) return;
  PrefixStore store(std::move(*client), keys::RunPrefix(f->run_id));
  auto read = TheJobsSpec(store, std::nullopt);
  if (!read.ok()) return;
  *spec = std::move(*read);
  f->spec = spec;
}  // the connection closes: a copy makes its own

int RunAgentProcess(const AgentProcessOptions& f) {
  const std::string cgroup = f.cgroup.empty() ? EnterTheJobsCgroup() : f.cgroup;
  // A local job's launcher ends the job's cgroup when the job ends. Should it die (SIGKILL: the
  // agent gets its death signal and stops its tasks), the agent does so as it exits: what the
  // tasks left (double-forked daemons) goes with the job, without waiting for a later ps or stop.
  const pid_t launcher = ::getppid();
  struct EndIfOrphaned {
    const std::string& cgroup;
    pid_t launcher;
    ~EndIfOrphaned() {
      // The launcher's spawning thread may be dead (the stop signal came from its death) while its
      // other threads are still torn down: getppid() names it a moment longer.
      if (cgroup.empty() || (::getppid() == launcher && !ProcessEnding(launcher))) return;
      if (Status st = LeaveCgroup(cgroup); !st.ok()) return;
      const int ended = KillJobCgroup(cgroup);
      if (ended > 0) LOG_WARN("the launcher is gone: ended the {} process(es) left in the job's cgroup", ended);
    }
  } end_if_orphaned{cgroup, launcher};
  auto credentials = StoreCredentials(f);
  if (!credentials.ok()) {
    std::fprintf(stderr, "trainctl agent: %s\n", credentials.status().message().c_str());
    return kExitInvalidSpec;
  }
  const auto& [addr, token] = *credentials;
  std::optional<JobSpec> file_spec;
  int node_rank = -1;
  if (auto code = GivenSpecAndRank(f, &file_spec, &node_rank)) return *code;
  // Node 0 hosts the store when no launcher does (a cluster engine started every agent).
  std::unique_ptr<TcpStoreServer> server;
  std::string served;  // the URL this agent reaches its own store at
  if (f.serve_store && node_rank == 0) {
    if (auto code = ServeStore(f, file_spec, addr, token, &node_rank, &server, &served)) return *code;
  }
  // Its waits on keys end at a stop signal (StopSignalFd): the agent never polls for one.
  auto client = OpenStore(
      server ? served : addr, token, file_spec ? file_spec->timeouts.rendezvous : std::chrono::seconds(30),
      [] { return StopSignal() != 0; }, StopSignalFd());
  if (!client.ok()) {
    LOG_ERROR("{}", client.status().message());
    return client.status().code() == Code::kAborted ? kExitInterrupted : CodeFor(client.status());
  }
  LOG_DEBUG("connected to the job's store{}", server ? " (served here)" : " at " + addr);
  const std::string prefix = keys::RunPrefix(f.run_id);
  PrefixStore store(std::move(*client), prefix);
  store.FailFastOnceLost();  // once lost, the agent says so and ends, instead of waiting again
  if (server) {
    if (Status st = store.Set(keys::kSpec, JobSpecToJson(*file_spec)); !st.ok()) {
      LOG_ERROR("{}", st.message());
      return kExitError;
    }
  }
  auto spec = TheJobsSpec(store, file_spec);
  if (!spec.ok()) {
    LOG_ERROR("cannot read the job spec from the store: {}", spec.status().message());
    return kExitError;
  }
  LOG_DEBUG("job spec of {} read{}", spec->name, file_spec ? " from " + f.spec_file : " from the store");
  // Declared before the server that reads it, so it outlives the server.
  std::atomic<int> group_rank{-1};
  std::shared_ptr<void> metrics;
  if (f.metrics_port > 0 && f.serve_metrics) {
    auto served = f.serve_metrics(*spec, f.run_id, f.metrics_port, token, &group_rank);
    if (!served.ok()) {
      LOG_ERROR("cannot serve metrics on port {}: {}", f.metrics_port, served.status().message());
      return CodeFor(served.status());
    }
    metrics = std::move(*served);
  }
  AgentOptions o;
  o.spec = *spec;
  o.group_rank = &group_rank;
  o.node_rank = node_rank;
  o.run_id = f.run_id;
  o.host = f.host;
  if (o.host == "auto") o.host = HostName();
  o.replaces = f.replaces;
  o.store_addr = addr;
  o.store_token = token;
  o.store_prefix = prefix;
  o.color_output = f.color;
  o.leave_on_signal = f.leave_on_signal;
  auto started = store.Add(keys::kAgentsStarted, 1);
  Agent agent(o, &store);
  const int code = agent.Run();
  auto exited = store.Add(keys::kAgentsExited, 1);
  // The store goes when this process does: first let the other agents see how the job ended.
  if (server && started.ok() && exited.ok())
    WaitForTheOtherAgents(store, spec->timeouts.stop_grace + std::chrono::seconds(5));
  return code;
}

}  // namespace trainctl
