#include "launch/local/local_launcher.h"

#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>

#include "common/address.h"
#include "common/cgroup.h"
#include "common/cpus.h"
#include "common/exit_codes.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/random.h"
#include "common/subprocess.h"
#include "job/agent_command.h"
#include "job/keys.h"
#include "job/paths.h"
#include "job/run_status.h"
#include "job/runs.h"
#include "launch/local/agent_supervisor.h"
#include "launch/local/report.h"
#include "store/open_store.h"
#include "store/tcp/tcp_store.h"

namespace trainctl {

JobSpec AgentsSpec(const JobSpec& spec, const LaunchOptions& options) {
  JobSpec s = spec;
  if (options.placement != "local" || spec.nodes.max <= 1) return s;
  const int cpus = std::max(1, UsableCpus());
  const auto least = std::chrono::ceil<std::chrono::seconds>(std::chrono::milliseconds(40) * spec.nodes.max / cpus);
  if (least > s.timeouts.heartbeat) {
    LOG_INFO("timeouts.heartbeat: {} instead of {}, as {} agents share {} CPU(s) here", FormatDuration(least),
             FormatDuration(s.timeouts.heartbeat), spec.nodes.max, cpus);
    s.timeouts.heartbeat = least;
  }
  return s;
}

Result<std::unique_ptr<TcpStoreServer>> HostStore(const JobSpec& spec, const LaunchOptions& options,
                                                  const std::string& token, std::string* url) {
  *url = spec.rendezvous;
  if (!url->empty()) return std::unique_ptr<TcpStoreServer>();
  TcpStoreServerOptions so;
  so.host = options.store_host;
  so.token = token;
  // Every process of a local job runs here: a Unix socket serves them faster than loopback TCP.
  so.unix_socket = options.placement == "local" && IsLoopbackHost(options.store_host);
  auto server = ServeJobStore(so, spec.store_clients());
  if (!server.ok()) return Status(server.status().code(), "cannot start the job's store: " + server.status().message());
  *url = (*server)->url();
  return server;
}

std::string Elapsed(Clock::time_point start) {
  return FormatDuration(std::chrono::duration_cast<Duration>(Clock::now() - start));
}

runs::RunEntry RunEntryFor(const JobSpec& spec, const std::string& run_id, const std::string& target) {
  runs::RunEntry entry;
  entry.name = spec.name;
  entry.run_id = run_id;
  entry.output_dir = spec.output_dir;
  entry.host = HostName();
  entry.target = target;
  entry.nodes = spec.nodes.max;
  entry.procs_per_node = spec.roles.empty() ? spec.procs_per_node : 0;
  entry.tasks = spec.world_size();
  entry.pid = ::getpid();
  entry.start_ticks = runs::StartTicks(entry.pid);
  entry.started = static_cast<int64_t>(std::time(nullptr));
  return entry;
}

Status WriteRunningStatus(const runs::RunEntry& entry) {
  RunStatus running;
  running.job = entry.name;
  running.run_id = entry.run_id;
  running.state = RunState::kRunning;
  running.pid = entry.pid;
  running.started = entry.started;
  return WriteRunStatus(entry.output_dir, running);
}

namespace {

// The output directory for a run that holds its lock: an earlier run's files moved aside unless
// resumed, the logs' directory made.
Status PrepareOutput(const JobSpec& spec, const LaunchOptions& options) {
  if (!options.resume) {
    ASSIGN_OR_RETURN(std::string moved, runs::MovePreviousRunAside(spec.output_dir, spec.checkpoint_dir));
    if (!moved.empty()) {
      LOG_INFO("{} held an earlier run, moved to {}: this run starts from scratch ({})", spec.output_dir, moved,
               options.verb == "torchrun" ? "trainctl torchrun starts each run afresh; a script resumes from its "
                                            "own checkpoints"
                                          : "--resume would continue it");
    }
  } else if (spec.trainer.enabled && !runs::HasCheckpoint(spec.checkpoint_dir)) {
    LOG_WARN("--resume: no checkpoint in {}; this run starts from scratch", spec.checkpoint_dir);
  }
  RETURN_IF_ERROR(MakeDirs(paths::LogsDir(spec.output_dir)));
  if (spec.cpu_bind == "cores" && spec.nodes.max > 1 && options.placement == "local") {
    LOG_WARN(
        "cpu_bind: cores with {} nodes on this one machine: each node's agent shares out the "
        "same CPUs, so the nodes' tasks run on one another's cores",
        spec.nodes.max);
  }
  return Status::Ok();
}

// The job's own cgroup, where the system allows one: what its processes start, daemons that
// double-forked away included, ends with it (when the launcher returns, or by `trainctl
// stop`/`ps` should the launcher be killed).
struct CgroupGuard {
  std::string dir;
  ~CgroupGuard() {
    if (!dir.empty()) KillJobCgroup(dir);
  }
};

}  // namespace

int LocalLauncher::Run(const JobSpec& spec, const LaunchOptions& options) {
  const auto start = Clock::now();
  // Orphans of the job's processes (a SIGKILLed agent's workers' children) come here, not to init.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  const std::string run_id = spec.name + "-" + RandomHex(4);
  const std::string token = RandomHex(32);
  log::SetContext(spec.name, "launcher", -1);
  auto fail = [](const Status& st) {
    LOG_ERROR("{}", st.message());
    return kExitError;
  };

  // One live run per output directory.
  auto lock = runs::OutputLock::Acquire(spec.output_dir, run_id);
  if (!lock.ok()) {
    std::fprintf(stderr, "trainctl run: %s\n", lock.status().message().c_str());
    return lock.status().code() == Code::kInvalidArgument ? kExitInvalidSpec : kExitError;
  }
  if (Status st = PrepareOutput(spec, options); !st.ok()) return fail(st);
  runs::RunEntry entry = RunEntryFor(spec, run_id, options.placement);
  CgroupGuard cgroup{options.placement == "local" ? MakeJobCgroup(run_id) : ""};
  entry.cgroup = cgroup.dir;
  if (cgroup.dir.empty()) LOG_DEBUG("no cgroup of its own for this job (no cgroup2 this user may write)");
  if (options.placement == "slurm") entry.slurm_job_id = GetEnv(CurrentEnvironment(), "SLURM_JOB_ID").value_or("");
  if (Status st = runs::Register(entry); !st.ok()) LOG_WARN("trainctl ps will not list this run: {}", st.message());
  if (Status st = WriteRunningStatus(entry); !st.ok()) return fail(st);
  if (Status st = AtomicWriteFile(paths::JobJson(spec.output_dir), JobSpecToJson(spec, 2) + "\n"); !st.ok()) {
    return fail(st);
  }

  // From here a run that cannot start says how it ended in status.json, as one that ran does.
  auto end_early = [&](const Status& st) {
    const int code = st.code() == Code::kAborted ? kExitInterrupted : kExitError;
    LOG_ERROR("{}", st.message());
    if (Status w = WriteRunStatus(spec.output_dir, RunStatus::Ended(spec.name, run_id, code, Elapsed(start)));
        !w.ok()) {
      LOG_WARN("{}", w.message());
    }
    return code;
  };
  std::string store_url;
  auto server = HostStore(spec, options, token, &store_url);
  if (!server.ok()) return end_early(server.status());
  const Duration connect_timeout = std::min<Duration>(spec.timeouts.rendezvous, std::chrono::seconds(30));
  auto client = OpenStore(store_url, token, connect_timeout, [] { return StopSignal() != 0; });
  if (!client.ok()) {
    return end_early(Status(client.status().code(), "cannot reach the job's store: " + client.status().message()));
  }
  PrefixStore store(client->get(), keys::RunPrefix(run_id));
  store.FailFastOnceLost();  // a store lost mid-job is reported, not waited on for every record
  if (Status st = store.Set(keys::kSpec, JobSpecToJson(AgentsSpec(spec, options))); !st.ok()) return end_early(st);

  std::vector<std::string> env = CurrentEnvironment();
  SetEnv(&env, kEnvStoreAddr, store_url);
  SetEnv(&env, kEnvStoreToken, token);
  if (!cgroup.dir.empty()) SetEnv(&env, kEnvCgroup, cgroup.dir);  // each agent moves into it first
  AgentSupervisor agents(spec, options, run_id, store, std::move(env), start);
  agents.StartAgents();
  agents.Supervise();
  agents.Finish();

  const int code = ReportRun(spec, store, run_id, start, agents.code, agents.stop_reason);
  RemoveAll(paths::SnapshotDir(run_id));  // agents remove it too, unless they were killed
  // What a killed agent's workers left behind came to this subreaper: nothing outlives the job.
  KillChildren(std::chrono::seconds(1));
  client->reset();
  if (*server) (*server)->Stop();
  return code;
}

}  // namespace trainctl
