#include "launch/local/agent_supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sstream>
#include <thread>

#include "common/fork_server.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/socket.h"
#include "common/strings.h"
#include "job/agent_command.h"
#include "job/keys.h"
#include "job/paths.h"
#include "job/records.h"
#include "rendezvous/rendezvous.h"

namespace trainctl {

// mpirun's stderr, passed on line by line (the agents' own lines come through it), except Open
// MPI's help texts: a block between two rules of dashes, dozens of lines of generic advice. Each
// becomes one line with its first sentence; everything mpirun said is kept in `log_path`.
class MpirunStderr {
 public:
  MpirunStderr(int read_fd, std::string log_path)
      : fd_(read_fd),
        log_path_(std::move(log_path)),
        log_(std::fopen(log_path_.c_str(), "w")),
        thread_([this] { Loop(); }) {}
  ~MpirunStderr() { Finish(Duration(0)); }
  // Reads until every writer has closed the pipe, or for at most `wait` more.
  void Finish(Duration wait) {
    if (!thread_.joinable()) return;
    deadline_ns_ = (Clock::now() + wait).time_since_epoch().count();
    thread_.join();
    ::close(fd_);
    if (log_) std::fclose(log_);
  }

 private:
  void Loop() {
    std::string pending;
    char buf[65536];
    while (true) {
      pollfd p{fd_, POLLIN, 0};
      int n = ::poll(&p, 1, 100);
      if (n == 0) {
        if (Clock::now().time_since_epoch().count() >= deadline_ns_.load()) break;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      ssize_t got = n < 0 ? -1 : ::read(fd_, buf, sizeof buf);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) break;
      if (log_) std::fwrite(buf, 1, got, log_);
      pending.append(buf, got);
      for (size_t eol; (eol = pending.find('\n')) != std::string::npos; pending.erase(0, eol + 1)) {
        Line(pending.substr(0, eol));
      }
    }
    if (!pending.empty()) Line(pending);
    if (in_block_) EndBlock();
    if (log_) std::fflush(log_);
  }
  void Line(const std::string& line) {
    const bool rule = line.size() >= 20 && line.find_first_not_of('-') == std::string::npos;
    if (rule) {
      if (in_block_) {
        EndBlock();
      } else {
        in_block_ = true;
        first_.clear();
      }
    } else if (in_block_) {
      if (first_.empty() && line.find_first_not_of(" \t") != std::string::npos) first_ = line;
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
  }
  void EndBlock() {
    in_block_ = false;
    std::fprintf(stderr, "mpirun: %s (Open MPI's whole message is in %s)\n", first_.c_str(), log_path_.c_str());
  }

  int fd_;
  std::string log_path_;
  FILE* log_;
  bool in_block_ = false;
  std::string first_;
  std::atomic<Clock::rep> deadline_ns_{Clock::time_point::max().time_since_epoch().count()};
  std::thread thread_;
};

namespace {

// The command that starts every agent at once: srun, one per node of the Slurm allocation; or
// mpirun, one per host (or nodes.max agents here). The store's address and token travel in the
// environment (mpirun's -x NAME copies it without putting the value in argv).
std::vector<std::string> PlacementArgv(const JobSpec& spec, const LaunchOptions& options,
                                       std::vector<std::string> agent) {
  const std::string n = std::to_string(spec.nodes.max);
  if (options.placement == "slurm") {
    std::vector<std::string> argv = {"srun", "--nodes=" + n, "--ntasks=" + n, "--ntasks-per-node=1",
                                     // trainctl handles a failed agent; Slurm must not end the step
                                     "--kill-on-bad-exit=0", "--cpu-bind=none", "--export=ALL"};
    argv.insert(argv.end(), agent.begin(), agent.end());
    argv.insert(argv.end(), {"--host", "auto"});
    return argv;
  }
  std::vector<std::string> argv = {"mpirun", "-np", n,
                                   // the agent's workers use the cores; MPI must not pin it to one
                                   "--bind-to", "none", "-x", kEnvStoreAddr, "-x", kEnvStoreToken};
  if (::geteuid() == 0) argv.push_back("--allow-run-as-root");
  if (!options.mpi_hosts.empty()) argv.insert(argv.end(), {"--host", options.mpi_hosts});
  if (!options.mpi_hostfile.empty()) argv.insert(argv.end(), {"--hostfile", options.mpi_hostfile});
  if (options.mpi_hosts.empty() && options.mpi_hostfile.empty()) {
    argv.push_back("--oversubscribe");  // N agents on this machine, whatever its core count
  } else {
    // One agent per host; a host named twice in --hosts (localhost,localhost: two nodes on one
    // machine) has a slot per mention, and one agent per slot.
    std::vector<std::string> named;
    bool repeated = false;
    for (const auto& h : Split(options.mpi_hosts, ',')) {
      const std::string host = h.substr(0, h.find(':'));
      repeated = repeated || std::find(named.begin(), named.end(), host) != named.end();
      named.push_back(host);
    }
    argv.insert(argv.end(), {"--map-by", repeated ? "slot" : "ppr:1:node"});
    agent.insert(agent.end(), {"--host", "auto"});  // each agent's own host name
  }
  argv.insert(argv.end(), agent.begin(), agent.end());
  return argv;
}

// The hosts mpirun reaches over ssh: those of --hosts and of the hostfile (a line's first word,
// its comment left out), each once, less this machine's own names (mpirun starts agents there
// without ssh).
std::vector<std::string> SshHosts(const LaunchOptions& options) {
  std::vector<std::string> named;
  for (const auto& h : Split(options.mpi_hosts, ',')) named.push_back(h.substr(0, h.find(':')));
  if (!options.mpi_hostfile.empty()) {
    auto text = ReadFile(options.mpi_hostfile);  // unreadable: mpirun says so, in its words
    for (const auto& line : text.ok() ? SplitLines(*text) : std::vector<std::string>{}) {
      std::istringstream words(line.substr(0, line.find('#')));
      if (std::string first; words >> first) named.push_back(first);
    }
  }
  char self[256] = {0};
  ::gethostname(self, sizeof self - 1);
  std::vector<std::string> hosts;
  for (const auto& h : named) {
    if (h.empty() || h == "localhost" || h == "127.0.0.1" || h == self) continue;
    if (std::find(hosts.begin(), hosts.end(), h) == hosts.end()) hosts.push_back(h);
  }
  return hosts;
}

// Why no sshd answers at `name`:`port` within 2 s; empty when one does (its banner begins "SSH-").
std::string SshdSilence(const std::string& name, uint16_t port) {
  const auto deadline = Clock::now() + std::chrono::seconds(2);
  int fd = ConnectOnce(name, port, deadline);
  if (fd == -EHOSTUNREACH || fd == -ENETUNREACH) return "its name does not resolve, or there is no route to it";
  if (fd == -ECONNREFUSED) return "the connection was refused";
  if (fd < 0) return "no answer";
  char banner[4];
  const int got = RecvAll(fd, banner, sizeof banner, deadline);
  ::close(fd);
  if (got == 1 && std::memcmp(banner, "SSH-", 4) == 0) return "";
  return got == -1 ? "it accepted the connection but sent no ssh banner" : "it answered, but not as an sshd";
}

// Waits, up to `limit`, until the sshd of every host mpirun will reach answers, at the name and
// port ssh gives it (`ssh -G` with mpirun's ssh arguments, OMPI_MCA_plm_rsh_args: the ssh
// configuration's Port lines count, as the MPI Operator's 2222 does). mpirun gives up on a host
// whose sshd is not up yet (a pod just started, a node still booting) with an ssh error; this
// names the host instead, and waits as a rendezvous does. kAborted when a stop signal comes first.
Status AwaitSshd(const LaunchOptions& options, Duration limit) {
  const auto deadline = Clock::now() + limit;
  const char* env_args = std::getenv("OMPI_MCA_plm_rsh_args");
  const std::string rsh_args = env_args ? env_args : "";
  for (const auto& host : SshHosts(options)) {
    SpawnOptions o;
    o.argv = {"ssh"};
    std::istringstream args(rsh_args);
    for (std::string a; args >> a;) o.argv.push_back(a);
    o.argv.insert(o.argv.end(), {"-G", host});
    o.env = CurrentEnvironment();
    auto config = RunCommand(o, std::chrono::seconds(10));
    if (!config.ok() || !config->exit.success()) return Status::Ok();  // no ssh here: mpirun says so
    std::string name = host;
    int port = 22;
    for (const auto& line : SplitLines(config->output)) {
      if (line.rfind("hostname ", 0) == 0) name = line.substr(9);
      if (line.rfind("port ", 0) == 0) port = std::atoi(line.c_str() + 5);
    }
    const std::string where = host + "'s sshd (" + name + " port " + std::to_string(port) + ")";
    bool said = false;
    for (std::string why; !(why = SshdSilence(name, uint16_t(port))).empty();) {
      if (Clock::now() >= deadline) {
        return Status(Code::kTimeout,
                      where + " did not answer within timeouts.rendezvous (" + FormatDuration(limit) + "): " + why);
      }
      if (!said) LOG_INFO("waiting for {} before mpirun starts: {}", where, why);
      said = true;
      if (int sig = WaitSignal(std::chrono::seconds(1)); IsStopSignal(sig)) {
        return Status(Code::kAborted,
                      std::string("interrupted by SIG") + ::sigabbrev_np(sig) + " while waiting for " + where);
      }
    }
  }
  return Status::Ok();
}

// The agent this launcher starts for `node_rank`.
AgentCommand LaunchedAgent(const LaunchOptions& options, const std::string& run_id, const std::string& node_rank) {
  AgentCommand agent;
  agent.trainctl = options.self_exe;
  agent.log_level = options.log_level;
  agent.node_rank = node_rank;
  agent.run_id = run_id;
  agent.color = options.color_output;
  return agent;
}

// The fork server of a local job's agents: `trainctl agent` whose last argument, the node rank,
// is a placeholder as wide as the largest rank: -1, -01, -001... (by arrival, so that nothing
// takes the server for the agent of a node). nullopt (the agents are exec'd) if it cannot start.
std::optional<ForkServer> StartAgentForkServer(const JobSpec& spec, const LaunchOptions& options,
                                               const std::string& run_id, const std::vector<std::string>& env) {
  const size_t width = std::max<size_t>(2, std::to_string(spec.nodes.max - 1).size());
  SpawnOptions o;
  o.argv = LaunchedAgent(options, run_id, "-" + std::string(width - 2, '0') + "1").Argv();
  auto rank = std::find(o.argv.begin(), o.argv.end(), "--node-rank");
  std::rotate(rank, rank + 2, o.argv.end());  // last: each copy rewrites it
  o.env = env;
  auto server = ForkServer::Start(o);
  if (!server.ok()) {
    LOG_DEBUG("cannot start the agents' fork server: {}; exec'ing each agent", server.status().message());
    return std::nullopt;
  }
  return std::move(*server);
}

}  // namespace

Duration AgentGrace(const JobSpec& spec) { return spec.timeouts.stop_grace + std::chrono::seconds(5); }

AgentSupervisor::AgentSupervisor(const JobSpec& spec, const LaunchOptions& options, const std::string& run_id,
                                 Store& store, std::vector<std::string> env, Clock::time_point start)
    : spec_(spec),
      options_(options),
      run_id_(run_id),
      store_(store),
      env_(std::move(env)),
      start_(start),
      one_(options.placement != "local"),
      elastic_(spec.nodes.min < spec.nodes.max) {}

AgentSupervisor::~AgentSupervisor() = default;

void AgentSupervisor::Finish() {
  if (mpirun_stderr_) mpirun_stderr_->Finish(std::chrono::seconds(1));
}

LostAgent AgentSupervisor::Lost(const AgentProc& a, const ExitInfo& exit) {
  // A local agent's id: this machine's loopback address (AgentOptions::host) and its pid.
  return LostAgent{{NodeId("127.0.0.1", a.pid), exit.Describe(), NewestClosedRound(store_)}, a.node};
}

LostRound AgentSupervisor::SeeTo(const LostAgent& l) {
  auto r = EndRoundOfLostNode(store_, l, RestartBudget{spec_.restart.max_restarts});
  if (!r.ok()) LOG_WARN("cannot end the round of a lost agent ({}): {}", l.id, r.status().message());
  return r.ok() ? *r : LostRound{};
}

void AgentSupervisor::BeginStop(const std::string& reason, int stop_code) {
  if (stopping_) return;
  stopping_ = true;
  stop_reason = reason;
  if (stop_code != kExitOk && code == kExitOk) code = stop_code;
  auto ignored = store_.CompareSet(keys::kStop, "", StopRecord{reason, stop_code}.ToJson());
  // Local agents read the stop key at their next look (a job of one node looks every half
  // second); the nudge makes it now.
  if (!one_) {
    for (const AgentProc& a : agents_) {
      if (!a.done) ::kill(a.pid, kNudgeSignal);
    }
  }
  kill_at_ = Clock::now() + AgentGrace(spec_);
}

void AgentSupervisor::StartAgents() {
  // Local agents: one is exec'd as a fork server, the others are its copies (the launcher's
  // children all the same); an agent exec'd costs a 2-core machine ~3 ms of CPU, a copy a tenth.
  if (options_.placement == "mpi") {
    if (Status st = AwaitSshd(options_, spec_.timeouts.rendezvous); !st.ok()) {
      LOG_ERROR("{}", st.message());
      BeginStop(st.message(), st.code() == Code::kAborted ? kExitInterrupted : kExitRendezvousTimeout);
      return;
    }
  }
  std::optional<ForkServer> forks =
      !one_ && spec_.nodes.max > 1 ? StartAgentForkServer(spec_, options_, run_id_, env_) : std::nullopt;
  for (int node = 0; node < (one_ ? 1 : spec_.nodes.max); ++node) {
    // Ctrl-C or SIGTERM while hundreds of agents start: stop now, not once all have started.
    if (int sig = WaitSignal(Duration(0)); IsStopSignal(sig)) {
      BeginStop(std::string("interrupted by SIG") + ::sigabbrev_np(sig) + " while starting the agents",
                kExitInterrupted);
      break;
    }
    const AgentCommand agent = LaunchedAgent(options_, run_id_, std::to_string(one_ ? -1 : node));
    SpawnOptions o;
    o.argv = agent.Argv();
    if (one_) o.argv = PlacementArgv(spec_, options_, o.argv);
    o.env = env_;
    const std::string name = one_ ? o.argv[0] : "the agent for node " + std::to_string(node);
    int pipe_fds[2] = {-1, -1};
    if (options_.placement == "mpi" && ::pipe2(pipe_fds, O_CLOEXEC) == 0) {
      o.stderr_fd = pipe_fds[1];
      mpirun_stderr_ = std::make_unique<MpirunStderr>(pipe_fds[0], paths::LogsDir(spec_.output_dir) + "/mpirun.log");
    }
    Result<pid_t> pid = forks ? forks->Fork(agent.node_rank) : Spawn(o);
    // A server that did not answer in time may yet have forked this node's agent: starting
    // another could run the node twice. Any other failure forked nothing.
    if (forks && !pid.ok() && pid.status().code() != Code::kTimeout) {
      LOG_DEBUG("the agents' fork server: {}; exec'ing the rest", pid.status().message());
      forks.reset();
      pid = Spawn(o);
    }
    if (pipe_fds[1] >= 0) ::close(pipe_fds[1]);
    if (!pid.ok()) {
      LOG_ERROR("cannot start {}: {}", name, pid.status().message());
      BeginStop("could not start every agent", kExitError);
      break;
    }
    agents_.push_back({name, *pid, false, one_ ? -1 : node});
  }
  forks.reset();  // it exits; Supervise reaps it with the orphans
  if (!stopping_) {
    LOG_INFO("started {}{}, run {}; logs in {}", DescribeTasks(spec_, /*programs=*/false),
             one_ ? " under " + agents_.front().name : "", run_id_, paths::LogsDir(spec_.output_dir));
  }
}

void AgentSupervisor::Replace(const AgentProc& a, const ExitInfo& exit) {
  const LostAgent l = Lost(a, exit);
  const LostRound now = SeeTo(l);
  if (now.budget_spent) {  // its peers end the job (no restarts left) and report it
    LOG_ERROR("{} died: {}; no restarts left (max_restarts: {})", a.name, exit.Describe(), spec_.restart.max_restarts);
    return;
  }
  if (!RestartBudget{spec_.restart.max_restarts}.RestartFits(replaced_ + 1)) {
    LOG_ERROR("{} died: {}, after it was started again {} time(s) (max_restarts: {})", a.name, exit.Describe(),
              replaced_, spec_.restart.max_restarts);
    BeginStop(a.name + " died: " + exit.Describe(), kExitError);
    return;
  }
  AgentCommand agent = LaunchedAgent(options_, run_id_, std::to_string(a.node));
  // It and the node's earlier agents that may still hold its rank in an open round.
  agent.replaces = {l.id};
  for (const LostAgent& before : lost_) {
    if (before.node == l.node) agent.replaces.push_back(before.id);
  }
  SpawnOptions o;
  o.argv = agent.Argv();
  o.env = env_;
  Result<pid_t> pid = Spawn(o);
  if (!pid.ok()) {
    LOG_ERROR("{} died: {}; cannot start it again: {}", a.name, exit.Describe(), pid.status().message());
    BeginStop(a.name + " died and could not be started again", kExitError);
    return;
  }
  ++replaced_;
  LOG_WARN("{} died: {}; started it again (pid {}), to rejoin the job at its next round", a.name, exit.Describe(),
           *pid);
  if (!now.settled) lost_.push_back(l);
  agents_.push_back({a.name, *pid, false, a.node});
}

void AgentSupervisor::OnExit(AgentProc& a, const ExitInfo& exit) {
  a.done = true;
  if (exit.success()) {
    any_succeeded_ = true;
  } else if (exit.signaled && !one_ && !elastic_ && !stopping_) {
    const AgentProc dead = a;  // Replace adds to agents_
    Replace(dead, exit);
  } else if (exit.signaled && elastic_ && !stopping_) {
    // An elastic job goes on without the node, in a new round with the nodes that are left: a
    // local agent's round is ended now, others' when their peers miss its heartbeat.
    LOG_WARN("{} died: {}; the job goes on with the other nodes (nodes.min: {})", a.name, exit.Describe(),
             spec_.nodes.min);
    if (lost_code_ == kExitOk) lost_code_ = kExitError;
    if (!one_) {
      const LostAgent l = Lost(a, exit);
      if (!SeeTo(l).settled) lost_.push_back(l);
    }
  } else {
    int exit_code = exit.signaled ? kExitError : exit.code;
    std::string why = a.name + " ended with " + exit.Describe();
    if (exit.signaled) {
      LOG_ERROR("{} died: {}", a.name, exit.Describe());
    } else if (!IsTrainctlExitCode(exit_code)) {  // mpirun's or srun's own failure, not an agent's
      why += ": it could not run the agents (see its lines above" +
             std::string(mpirun_stderr_ ? ", and " + paths::LogsDir(spec_.output_dir) + "/mpirun.log)" : ")");
      exit_code = kExitError;
    }
    if (code == kExitOk) code = exit_code;
    BeginStop(why, exit_code);
  }
}

void AgentSupervisor::Supervise() {
  const bool has_deadline = spec_.timeouts.job.count() > 0;
  const auto job_deadline = start_ + spec_.timeouts.job;
  int signals_seen = 0;
  while (true) {
    // An agent's exit (SIGCHLD) and a stop signal end the wait at once; the rest are deadlines.
    Duration wait = std::chrono::seconds(1);
    if (stopping_) wait = std::min(wait, Remaining(kill_at_));
    if (has_deadline) wait = std::min(wait, Remaining(job_deadline));
    int sig = WaitSignal(std::max(wait, Duration(1)));
    if (IsStopSignal(sig)) {
      if (++signals_seen > 1) {
        LOG_WARN("second {}: killing everything now", ::sigabbrev_np(sig));
        kill_at_ = Clock::now();
      }
      BeginStop(std::string("interrupted by SIG") + ::sigabbrev_np(sig), kExitInterrupted);
    }
    if (has_deadline && Clock::now() >= job_deadline) {
      BeginStop("the job ran longer than timeouts.job (" + FormatDuration(spec_.timeouts.job) + ")", kExitJobTimeout);
    }
    int status = 0;
    bool killed_agent = false;
    for (pid_t p; (p = ::waitpid(-1, &status, WNOHANG)) > 0;) {
      // Not an agent: an orphan that a dead agent's worker left, adopted by this subreaper.
      auto it = std::find_if(agents_.begin(), agents_.end(), [p](const AgentProc& a) { return a.pid == p; });
      if (it == agents_.end()) continue;
      const ExitInfo exit = ExitInfo::FromWaitStatus(status);
      killed_agent |= exit.signaled;
      OnExit(*it, exit);
    }
    // A killed agent's workers came to this subreaper (they die with their agent, but what they
    // started need not): they belonged to its round, which has ended, so they go now, not with the job.
    if (killed_agent && !one_) {
      std::vector<pid_t> live;
      for (const AgentProc& a : agents_) {
        if (!a.done) live.push_back(a.pid);
      }
      KillChildren(Duration(0), live);
    }
    // A lost agent that had not joined a round yet: end the round it is in once that closes.
    std::erase_if(lost_, [&](const LostAgent& l) { return stopping_ || SeeTo(l).settled; });
    if (std::all_of(agents_.begin(), agents_.end(), [](const AgentProc& a) { return a.done; })) {
      if (!any_succeeded_ && code == kExitOk) code = lost_code_;
      return;
    }
    if (stopping_ && Clock::now() >= kill_at_) {
      for (auto& a : agents_) {
        if (!a.done) ::kill(-a.pid, SIGKILL);
      }
    }
  }
}

}  // namespace trainctl
