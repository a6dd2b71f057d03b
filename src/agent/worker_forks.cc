#include "agent/worker_forks.h"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "agent/warm_python.h"
#include "common/log.h"
#include "common/strings.h"

namespace trainctl {
namespace {

// The server's last argument: each copy writes its own over it, so it must be as long as the
// longest (a task such as "evaluator-0", "worker-1023").
const std::string kPlaceholder = "(worker server)" + std::string(17, ' ');

// How long a request may wait for a server that is still loading LibTorch (0.75 s alone; several
// agents' servers loading at once on a busy machine take longer), or a warm interpreter importing
// its modules (import torch alone: 1.7 s).
constexpr Duration kLoadTimeout = std::chrono::seconds(30);
constexpr Duration kImportTimeout = std::chrono::seconds(90);

}  // namespace

WorkerForks::WorkerForks() {
  const char* off = std::getenv(kEnvWorkerServer);
  enabled_ = !off || std::strcmp(off, "0") != 0;
}

WorkerForks::~WorkerForks() {
  std::vector<pid_t> pids;
  for (auto& s : servers_) {
    if (s.server) pids.push_back(s.server->pid());
    s.server.reset();  // closes the channel: the server exits
  }
  for (pid_t pid : pids) {
    const auto deadline = Clock::now() + std::chrono::seconds(2);
    int status;
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      if (Clock::now() >= deadline) {  // still loading, or stuck: it serves no one now
        ::kill(-pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        break;
      }
      WaitSignal(Duration(10));
    }
  }
}

WorkerForks::Server* WorkerForks::Find(const Plan& plan, const SpawnOptions& spawn,
                                       const std::vector<std::string>& shared_env) {
  for (auto& s : servers_) {
    if (s.argv == plan.server_argv && s.env == shared_env && s.cwd == spawn.cwd) return &s;
  }
  Server s{plan.server_argv, shared_env, spawn.cwd, plan.load_timeout, std::nullopt};
  SpawnOptions o;
  o.argv = plan.server_argv;
  o.env = shared_env;
  o.cwd = spawn.cwd;  // its output: the agent's own (a server that cannot serve says why there)
  auto started = ForkServer::Start(o);
  if (started.ok()) {
    s.server.emplace(std::move(*started));
  } else {
    LOG_DEBUG("cannot start a worker server: {}; starting each worker on its own", started.status().message());
  }
  servers_.push_back(std::move(s));
  return &servers_.back();
}

std::optional<WorkerForks::Plan> WorkerForks::PlanFor(const SpawnOptions& spawn,
                                                      const std::vector<std::string>& preload) {
  if (!enabled_ || !spawn.new_process_group || !spawn.die_with_parent || spawn.stdin_fd >= 0 || spawn.stderr_fd >= 0 ||
      spawn.pass_fd >= 0) {
    return std::nullopt;
  }
  if (!preload.empty()) {
    auto warm = PlanWarmPython(spawn.argv, preload, spawn.cwd);
    if (!warm.ok()) {
      if (std::find(said_.begin(), said_.end(), warm.status().message()) == said_.end()) {
        LOG_INFO("preload: {}; it starts its own interpreter", warm.status().message());
        said_.push_back(warm.status().message());
      }
      return std::nullopt;
    }
    return Plan{std::move(warm->server_argv), std::move(warm->argument), kImportTimeout};
  }
  if (spawn.argv.size() < 2 || spawn.argv.back().size() > kPlaceholder.size()) return std::nullopt;
  Plan plan{{spawn.argv.begin(), spawn.argv.end() - 1}, spawn.argv.back(), kLoadTimeout};
  plan.server_argv.push_back(kPlaceholder);
  return plan;
}

void WorkerForks::Prepare(const SpawnOptions& spawn, const std::vector<std::string>& shared_env,
                          const std::vector<std::string>& preload) {
  if (auto plan = PlanFor(spawn, preload)) Find(*plan, spawn, shared_env);
}

Result<pid_t> WorkerForks::Start(const SpawnOptions& spawn, const std::vector<std::string>& shared_env,
                                 const std::vector<std::string>& preload) {
  auto plan = PlanFor(spawn, preload);
  if (!plan) return Spawn(spawn);
  Server* s = Find(*plan, spawn, shared_env);
  if (s->server) {
    ForkRequest r;
    r.argument = plan->argument;
    r.env = spawn.env;
    r.cwd = spawn.cwd;
    r.cpus = spawn.cpus;
    r.output_fd = spawn.output_fd;
    auto pid = s->server->Fork(r, s->load_timeout);
    if (pid.ok()) {
      ++forked_;
      return pid;
    }
    if (!preload.empty() && pid.status().code() != Code::kUnavailable) {  // else the interpreter said why as it ended
      LOG_INFO("preload: the warm interpreter (pid {}) could not start {}: {}; each worker starts its own interpreter",
               s->server->pid(), Join(spawn.argv, " "), pid.status().message());
    } else {
      LOG_DEBUG("the worker server (pid {}) could not start {}: {}; starting each worker on its own", s->server->pid(),
                Join(spawn.argv, " "), pid.status().message());
    }
    const pid_t server = s->server->pid();
    s->server.reset();
    ::kill(-server, SIGKILL);
    int status;
    ::waitpid(server, &status, 0);
  }
  return Spawn(spawn);
}

}  // namespace trainctl
