#include "agent/worker_forks.h"

#include <signal.h>
#include <sys/wait.h>

#include <cstdlib>
#include <cstring>

#include "common/log.h"

namespace trainctl {
namespace {

// The server's last argument: each copy writes its own over it, so it must be as long as the
// longest (a task such as "evaluator-0", "worker-1023").
const std::string kPlaceholder = "(worker server)" + std::string(17, ' ');

// How long a request may wait for a server that is still loading LibTorch (0.75 s alone; several
// agents' servers loading at once on a busy machine take longer).
constexpr Duration kLoadTimeout = std::chrono::seconds(30);

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

WorkerForks::Server* WorkerForks::Find(const SpawnOptions& spawn, const std::vector<std::string>& shared_env) {
  const std::vector<std::string> argv(spawn.argv.begin(), spawn.argv.end() - 1);
  for (auto& s : servers_) {
    if (s.argv == argv && s.env == shared_env && s.cwd == spawn.cwd) return &s;
  }
  Server s{argv, shared_env, spawn.cwd, std::nullopt};
  SpawnOptions o;
  o.argv = argv;
  o.argv.push_back(kPlaceholder);
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

bool WorkerForks::Forkable(const SpawnOptions& spawn) const {
  return enabled_ && spawn.argv.size() >= 2 && spawn.argv.back().size() <= kPlaceholder.size() &&
         spawn.new_process_group && spawn.die_with_parent && spawn.stdin_fd < 0 && spawn.stderr_fd < 0 &&
         spawn.pass_fd < 0;
}

void WorkerForks::Prepare(const SpawnOptions& spawn, const std::vector<std::string>& shared_env) {
  if (Forkable(spawn)) Find(spawn, shared_env);
}

Result<pid_t> WorkerForks::Start(const SpawnOptions& spawn, const std::vector<std::string>& shared_env) {
  if (!Forkable(spawn)) return Spawn(spawn);
  Server* s = Find(spawn, shared_env);
  if (s->server) {
    ForkRequest r;
    r.argument = spawn.argv.back();
    r.env = spawn.env;
    r.cwd = spawn.cwd;
    r.cpus = spawn.cpus;
    r.output_fd = spawn.output_fd;
    auto pid = s->server->Fork(r, kLoadTimeout);
    if (pid.ok()) {
      ++forked_;
      return pid;
    }
    LOG_DEBUG("the worker server (pid {}) could not start {}: {}; starting each worker on its own",
              s->server->pid(), r.argument, pid.status().message());
    const pid_t server = s->server->pid();
    s->server.reset();
    ::kill(-server, SIGKILL);
    int status;
    ::waitpid(server, &status, 0);
  }
  return Spawn(spawn);
}

}  // namespace trainctl
