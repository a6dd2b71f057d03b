#include "agent/agent.h"

#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "agent/launch.h"
#include "agent/warm_python.h"
#include "agent/worker_group.h"
#include "common/address.h"
#include "common/cpus.h"
#include "common/exit_codes.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "job/error_file.h"
#include "job/keys.h"
#include "job/paths.h"
#include "job/snapshots.h"
#include "rendezvous/rendezvous.h"

namespace trainctl {

namespace {
// How long a task may be stopped (state T), or in uninterruptible sleep (D: a hung device or
// file system, where a checkpoint on a slow NFS server may legitimately wait a while), before it
// is killed and named as the job's failure.
constexpr Duration kStoppedFor = std::chrono::seconds(5);
constexpr Duration kBlockedFor = std::chrono::seconds(30);
// The longest one wait on the store: what it waits for (a stop among it) wakes it sooner, and a
// stop signal interrupts it; this bounds what a missed wake-up could cost.
constexpr Duration kLongestWait = std::chrono::seconds(5);

// A Python program's failure to import a module (ModuleNotFoundError or ImportError) as the last
// line of its traceback, or as the exception its error file records.
bool ImportFailure(const std::vector<std::string>& last_lines, const std::string& error) {
  auto is_import = [](std::string_view line) {
    return line.starts_with("ModuleNotFoundError: ") || line.starts_with("ImportError: ");
  };
  if (is_import(error)) return true;
  for (auto it = last_lines.rbegin(); it != last_lines.rend(); ++it) {
    std::string_view line = *it;
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
    if (line.empty()) continue;
    return is_import(line);  // the last line a traceback prints is its exception
  }
  return false;
}

// How soon after its first start an import error counts as one no restart can mend: imports come
// first in a program, training after.
constexpr Duration kImportWindow = std::chrono::seconds(30);
}  // namespace

struct Agent::Outcome {
  // kEnded: the round ended (failure or membership change, in `end`); kSucceeded: the job is done.
  enum Kind { kSucceeded, kEnded, kStopped, kError } kind = kError;
  int code = kExitError;
  std::string message;
  FailureRecord end;
  bool reported = false;  // this agent wrote `end` (and logs it)
};

struct Agent::Round {
  int round = 0;
  RoundInfo info;
  std::vector<RoleSpec> roles;
  std::vector<Task> all;           // every task of the round, by rank (jobs with roles: TF_CONFIG)
  std::vector<Task> mine;          // this node's, by local rank
  int world_size = 0;              // the round's tasks
  int deciders = 0;                // tasks whose success decides the job's
  std::string master;              // MASTER_ADDR:MASTER_PORT
  std::vector<std::string> addrs;  // every task's host:port, for TF_CONFIG (jobs with roles)
  // Once its tasks have started.
  std::unique_ptr<TaskGroup> group;
  std::vector<WorkerLaunch> launches;  // by local rank
  std::vector<int> task_restarts;      // by local rank
  std::map<int, std::string> stuck;    // local rank -> why trainctl killed it
  Clock::time_point started;           // when its tasks were started
  // Liveness: its heartbeat, and the one of the node it watches in the ring.
  int watched = 0;
  std::string watched_beat;
  Clock::time_point watched_seen, next_beat, next_stuck_check;
  int64_t beats = 0;
  const RoleSpec& RoleOf(const Task& t) const { return *FindRole(roles, t.role); }
};

Agent::Agent(AgentOptions options, Store* store, AgentEnv* env)
    : o_(std::move(options)), store_(store), env_(env ? env : &ProcessEnv()) {
  node_id_ = NodeId(o_.host, env_->Pid());
  // As torchrun's agent: with TORCHELASTIC_ENABLE_FILE_TIMER=1 it serves the workers' file timers
  // at TORCHELASTIC_TIMER_FILE (the one given, or a FIFO of its own).
  std::string enabled = env_->GetEnv("TORCHELASTIC_ENABLE_FILE_TIMER").value_or("");
  std::string path = env_->GetEnv("TORCHELASTIC_TIMER_FILE").value_or("");
  for (const auto& [k, v] : o_.spec.env) {
    if (k == "TORCHELASTIC_ENABLE_FILE_TIMER") enabled = v;
    if (k == "TORCHELASTIC_TIMER_FILE") path = v;
  }
  if (enabled == "1") {
    auto timers = FileTimerServer::Start(path);
    if (timers.ok()) {
      timers_ = std::move(*timers);
    } else {
      LOG_WARN("no file timers for this node's workers: {}", timers.status().message());
    }
  }
}

Duration Agent::ByJobSize(Duration per_1000_nodes, Duration least, Duration most) const {
  return std::clamp<Duration>(per_1000_nodes * o_.spec.nodes.max / 1000, least, std::max(least, most));
}

Status Agent::CheckStop() {
  if (Status st = CheckStopSignal(); !st.ok()) return st;
  ASSIGN_OR_RETURN(auto stop, store_->TryGet(keys::kStop));
  if (stop) return Aborted(*stop);
  return Status::Ok();
}

Status Agent::CheckStopSignal() {
  if (int sig = env_->StopSignal()) {
    std::string reason = std::string("interrupted by SIG") + ::sigabbrev_np(sig) + " on " + node_id_;
    if (o_.leave_on_signal) return Aborted(reason + ": this node leaves the job, the others go on without it");
    auto ignored = store_->CompareSet(keys::kStop, "", StopRecord{reason, kExitInterrupted}.ToJson());
    return Aborted(reason);
  }
  return Status::Ok();
}

WorkerLaunch Agent::Launch(const Round& r, const Task& t, int task_restarts) const {
  LaunchSite site;
  site.run_id = o_.run_id;
  site.store_addr = o_.store_addr;
  site.store_token = o_.store_token;
  site.store_prefix = o_.store_prefix;
  site.host = o_.host;
  site.color_output = o_.color_output;
  if (timers_) site.timer_file = timers_->path();
  site.env = CurrentEnvironment();
  if (o_.spec.cpu_bind == "cores") site.cpus = AffinityCpus();
  site.self_exe = SelfExe();
  site.debug = spdlog::get_level() <= spdlog::level::debug;
  LaunchRound round;
  round.round = r.round;
  round.info = r.info;
  round.world_size = r.world_size;
  round.master = r.master;
  round.all = &r.all;
  round.addrs = &r.addrs;
  return PlanLaunch(o_.spec, r.RoleOf(t), round, t, task_restarts, site);
}

void Agent::AddTaskError(const Round& r, const Task& t, int task_restarts, FailureRecord* rec) const {
  const std::string path = paths::ErrorFile(o_.spec.output_dir, t.role, t.index, r.round, task_restarts);
  auto read = ReadErrorFile(path);
  if (!read.ok()) {
    LOG_WARN("ignoring the error file of {} {}: {}", t.role, t.index, read.status().message());
    return;
  }
  if (!read->has_value()) return;
  rec->error = (*read)->message;
  rec->traceback = (*read)->traceback;
  rec->error_time = (*read)->timestamp;
  rec->error_time_ns = (*read)->time_ns;
}

void Agent::PostRootCause(const Round& r, const std::vector<int>& task_restarts, const FailureRecord* failed) {
  std::optional<FailureRecord> first;
  for (const auto& t : r.mine) {
    FailureRecord rec = NewFailure(FailureKind::kTask, r.round, r.info.group_rank);
    rec.rank = t.rank;
    rec.local_rank = t.local;
    rec.role = t.role;
    rec.task_index = t.index;
    rec.log_path = paths::TaskLog(o_.spec.output_dir, t.role, t.index);
    if (failed && failed->rank == t.rank) {  // read already (and a bad file warned of once)
      rec.error = failed->error;
      rec.traceback = failed->traceback;
      rec.error_time = failed->error_time;
      rec.error_time_ns = failed->error_time_ns;
      rec.exited_ns = failed->exited_ns;
    } else {
      AddTaskError(r, t, task_restarts[t.local], &rec);
    }
    if (rec.error.empty() || rec.error_time <= 0) continue;
    rec.exit = "raised " + rec.error;
    if (!first || rec.Before(*first)) first = rec;
  }
  if (!first) return;
  const std::string mine = first->ToJson();
  std::string expected;
  for (int tries = 0; tries < 16; ++tries) {
    auto now = store_->CompareSet(keys::RoundRootCause(r.round), expected, mine);
    if (!now.ok() || *now == mine) return;
    auto theirs = FailureRecord::FromJson(*now);
    if (!theirs.ok() || !first->Before(*theirs)) return;
    expected = *now;
  }
}

FailureRecord Agent::NewFailure(FailureKind kind, int round, int group_rank) const {
  FailureRecord rec;
  rec.kind = kind;
  rec.round = round;
  rec.node_rank = group_rank;
  rec.host = node_id_;
  return rec;
}

Result<std::string> Agent::WaitForKey(int round, const std::string& key) {
  const auto deadline = env_->Now() + o_.spec.timeouts.rendezvous;
  // One wait on the store for the key, a stop, or the round's end (a peer failed to start).
  const std::vector<std::string> wake_on = {key, keys::kStop, keys::RoundEnd(round)};
  while (true) {
    RETURN_IF_ERROR(CheckStopSignal());
    auto got = env_->WaitForAny(*store_, wake_on, std::min(env_->Remaining(deadline), kLongestWait));
    if (got.ok() && got->first == 0) return std::move(got->second);
    if (got.ok() && got->first == 1) return Aborted(got->second);
    if (got.ok()) return Aborted("round " + std::to_string(round) + " ended while starting");
    if (got.status().code() != Code::kTimeout && got.status().code() != Code::kAborted) return got.status();
    if (env_->Now() >= deadline) {
      return Timeout("no " + key + " within timeouts.rendezvous (" + FormatDuration(o_.spec.timeouts.rendezvous) + ")");
    }
  }
}

Result<std::vector<std::string>> Agent::ExchangeTaskAddrs(const Round& r) {
  nlohmann::json mine = nlohmann::json::array();
  ASSIGN_OR_RETURN(task_ports_, LeasePorts(o_.host, r.mine.size()));
  for (int port : task_ports_.ports()) mine.push_back(JoinHostPort(o_.host, port));
  RETURN_IF_ERROR(store_->Set(keys::RoundTaskAddrs(r.round, r.info.group_rank), mine.dump()));
  std::vector<std::string> addrs(r.all.size());
  for (int node = 0; node < r.info.group_world_size; ++node) {
    std::vector<std::string> theirs;
    if (node == r.info.group_rank) {
      theirs = mine.get<std::vector<std::string>>();
    } else {
      ASSIGN_OR_RETURN(std::string text, WaitForKey(r.round, keys::RoundTaskAddrs(r.round, node)));
      try {
        theirs = nlohmann::json::parse(text).get<std::vector<std::string>>();
      } catch (const nlohmann::json::exception& e) {
        return Internal("node " + std::to_string(node) + "'s task addresses are malformed: " + e.what());
      }
    }
    std::vector<Task> tasks = TasksOfNode(r.all, node);
    if (theirs.size() != tasks.size()) {
      return Internal("node " + std::to_string(node) + " published " + std::to_string(theirs.size()) +
                      " task addresses for " + std::to_string(tasks.size()) + " tasks");
    }
    for (size_t i = 0; i < tasks.size(); ++i) addrs[tasks[i].rank] = theirs[i];
  }
  return addrs;
}

// This agent is not in round `round` (it was full): wait, as a node waiting to join, until the
// round ends (then join the next), the job succeeds, or it is stopped. The round's members see
// the waiting count and end their round to admit it (see RunRound).
Agent::Outcome Agent::WaitOutRound(int round, const RoundInfo& full) {
  Outcome out;
  bool waiting = false;  // said so, and counted (a round that has ended already needs neither)
  while (true) {
    if (Status st = CheckStop(); !st.ok()) return Stopped(st);
    auto end = store_->TryGet(keys::RoundEnd(round));
    if (!end.ok()) {
      out.message = "lost the job's store: " + end.status().ToString();
      return out;
    }
    if (!end->has_value()) {
      if (!waiting && !full.closed) {  // a dead agent this one replaces holds this node's rank there
        LOG_INFO(
            "round {} holds this node's rank for the agent it replaces: waiting to join the job at the "
            "next round",
            round);
        waiting = true;
      } else if (!waiting) {
        LOG_INFO("round {} is full ({} of max {} nodes): waiting to join the job at the next round", round,
                 full.group_world_size, o_.spec.nodes.max);
        if (auto n = store_->Add(keys::RoundWaiting(round), 1); !n.ok()) {
          out.message = "lost the job's store: " + n.status().ToString();
          return out;
        }
        waiting = true;
      }
      env_->WaitSignal(std::chrono::milliseconds(200));
      continue;
    }
    auto rec = FailureRecord::FromJson(**end);
    if (!rec.ok()) {
      out.message = rec.status().message();
      return out;
    }
    if (rec->kind == FailureKind::kSucceeded) {
      LOG_INFO("the job finished before this node could join it");
      out.kind = Outcome::kSucceeded;
      out.code = kExitOk;
      return out;
    }
    out.kind = Outcome::kEnded;
    out.end = *rec;
    return out;
  }
}

Agent::Outcome Agent::Stopped(const Status& why) {
  Outcome out;
  StopRecord stop{why.message(), kExitInterrupted};
  StopRecord parsed;
  if (StopRecord::FromJson(why.message(), &parsed)) stop = parsed;
  out.kind = Outcome::kStopped;
  out.code = stop.code;
  out.message = stop.reason;
  return out;
}

Agent::Outcome Agent::Error(int code, const std::string& message) {
  Outcome out;
  out.kind = Outcome::kError;
  out.code = code;
  out.message = message;
  return out;
}

Agent::Outcome Agent::EndWith(const Round& r, const FailureRecord& rec) {
  Outcome out;
  auto won = EndRound(*store_, r.round, rec, RestartBudget{o_.spec.restart.max_restarts}, &out.reported);
  if (!won.ok()) return Error(kExitError, "lost the job's store: " + won.status().ToString());
  out.kind = Outcome::kEnded;
  out.end = *won;
  return out;
}

Agent::Outcome Agent::EndAndStop(Round& r, const FailureRecord& rec, bool root_cause) {
  Outcome o = EndWith(r, rec);  // first, so peers stop their tasks meanwhile
  r.group->Stop(o_.spec.timeouts.stop_grace);
  if (root_cause) PostRootCause(r, r.task_restarts, &rec);
  return o;
}

Agent::Outcome Agent::RunRound(int round, int restarts) {
  Round r;
  r.round = round;
  if (auto o = Rendezvous(restarts, &r)) return *o;  // RENDEZVOUS
  if (auto o = StartTasks(&r)) return *o;            // the tasks start
  return Watch(r);                                   // HEALTHY until the round ends
}

std::optional<Agent::Outcome> Agent::Rendezvous(int restarts, Round* r) {
  const JobSpec& s = o_.spec;
  RendezvousOptions ro;
  ro.min_nodes = s.nodes.min;
  ro.max_nodes = s.nodes.max;
  ro.last_call = s.timeouts.last_call;
  ro.timeout = s.timeouts.rendezvous;
  ro.rank_hint = o_.node_rank;
  ro.node_id = node_id_;
  ro.replaces = o_.replaces;
  ro.check = [this] { return CheckStop(); };
  ro.now = [this] { return env_->Now(); };
  ro.wait_for_any = [this](Store& store, const std::vector<std::string>& keys, Duration timeout) {
    return env_->WaitForAny(store, keys, timeout);
  };
  // The stop key wakes the wait, and a stop signal interrupts it: no polling for either.
  ro.interrupt_keys = {keys::kStop};
  ro.check_every = kLongestWait;
  LOG_DEBUG("round {}: joining as {}", r->round, node_id_);
  auto joined = JoinRound(*store_, r->round, restarts, ro);
  if (!joined.ok()) {
    const Status& st = joined.status();
    if (st.code() == Code::kAborted) return Stopped(st);
    if (st.code() == Code::kTimeout) return Error(kExitRendezvousTimeout, st.message());
    return Error(kExitError, "rendezvous failed: " + st.ToString());
  }
  if (!joined->has_value()) {
    auto peek = PeekRound(*store_, r->round);
    if (!peek.ok() || !peek->has_value())
      return Error(kExitError, "rendezvous round " + std::to_string(r->round) + " vanished");
    return WaitOutRound(r->round, **peek);
  }
  r->info = **joined;
  const RoundInfo& info = r->info;
  log::SetContext(s.name, "node=" + std::to_string(info.group_rank), info.restarts);
  if (o_.group_rank) o_.group_rank->store(info.group_rank);
  r->roles = JobRoles(s, info.group_world_size);
  std::vector<RoleSize> sizes;
  for (const auto& role : r->roles) sizes.push_back({role.name, role.replicas});
  // Every task only where the job's roles need each other's addresses; else this node's alone.
  if (!s.roles.empty()) r->all = PlaceTasks(sizes, info.group_world_size);
  r->mine = PlaceNodeTasks(sizes, info.group_world_size, info.group_rank);
  for (const auto& role : r->roles) {
    r->world_size += role.replicas;
    r->deciders += role.success ? role.replicas : 0;
  }
  if (info.group_rank == 0 && (r->round > 0 || info.group_world_size < s.nodes.max)) {
    LOG_INFO("round {}: {} node(s), world size {} (restart {} of {})", r->round, info.group_world_size, r->world_size,
             info.restarts, s.restart.max_restarts);
  }
  return std::nullopt;
}

std::optional<Agent::Outcome> Agent::StartTasks(Round* rp) {
  const JobSpec& s = o_.spec;
  Round& r = *rp;
  // Where rank 0 serves torch's store, and (jobs with roles) every task's own address.
  auto stopped_or_error = [&](const Status& st, const std::string& what) -> Outcome {
    if (st.code() == Code::kAborted) {
      // A stop, or the round ended while this node was starting: a peer failed to start.
      auto end = store_->TryGet(keys::RoundEnd(r.round));
      if (end.ok() && end->has_value()) {
        if (auto rec = FailureRecord::FromJson(**end); rec.ok()) {
          Outcome out;
          out.kind = rec->kind == FailureKind::kSucceeded ? Outcome::kSucceeded : Outcome::kEnded;
          out.code = kExitOk;
          out.end = *rec;
          return out;
        }
      }
      return Stopped(st);
    }
    return Error(kExitError, what + ": " + st.ToString());
  };
  if (r.info.group_rank == 0) {
    auto lease = LeasePorts(o_.host, 1);
    if (!lease.ok()) return Error(kExitError, lease.status().message());
    master_port_ = std::move(*lease);
    r.master = JoinHostPort(o_.host, master_port_.ports().front());
    if (Status st = store_->Set(keys::RoundMaster(r.round), r.master); !st.ok()) {
      return Error(kExitError, "lost the job's store: " + st.ToString());
    }
  } else {
    auto got = WaitForKey(r.round, keys::RoundMaster(r.round));
    if (!got.ok()) return stopped_or_error(got.status(), "no master address for round " + std::to_string(r.round));
    r.master = *got;
  }
  if (!s.roles.empty()) {
    auto addrs = ExchangeTaskAddrs(r);
    if (!addrs.ok()) return stopped_or_error(addrs.status(), "cannot learn the tasks' addresses");
    r.addrs = std::move(*addrs);
  }

  for (const auto& t : r.mine) r.launches.push_back(Launch(r, t, 0));
  if (s.cpu_bind == "cores") {  // as Slurm's --cpu-bind=verbose says where tasks run
    std::string where;
    for (const auto& w : r.launches)
      where += (where.empty() ? "" : ", ") + w.label + " on CPU " + FormatCpuList(w.cpus);
    LOG_INFO("cpu_bind: cores: {}", where);
  }
  r.group = env_->NewTaskGroup(o_.color_output, &forks_);
  r.task_restarts.assign(r.mine.size(), 0);
  LOG_DEBUG("round {}: node {} of {}, master {}, starting {} tasks", r.round, r.info.group_rank,
            r.info.group_world_size, r.master, r.launches.size());
  const int forked_before = forks_.forked();
  r.started = env_->Now();
  Status st = r.group->Start(r.launches);
  if (st.ok() && forks_.forked() > forked_before) {
    LOG_DEBUG("round {}: {} of {} tasks copied from a worker server (LibTorch, or preloaded Python modules)", r.round,
              forks_.forked() - forked_before, r.launches.size());
  }
  if (!st.ok()) {
    FailureRecord rec = NewFailure(FailureKind::kStart, r.round, r.info.group_rank);
    rec.restarts = r.info.restarts;  // no restart follows: the job ends here
    rec.final = true;
    rec.rank = r.mine[0].rank;
    rec.local_rank = 0;
    rec.role = r.mine[0].role;
    rec.task_index = r.mine[0].index;
    rec.exit = st.message();
    return EndWith(r, rec);
  }
  // Liveness: each agent bumps its heartbeat key and watches the next node's (a ring), so a
  // lost node is seen by one peer at a cost that does not grow with the job.
  r.watched = (r.info.group_rank + 1) % r.info.group_world_size;
  r.watched_seen = r.next_beat = env_->Now();
  r.next_stuck_check = env_->Now() + std::chrono::seconds(1);
  return std::nullopt;
}

Agent::Outcome Agent::FinishRound(Round& r, const FailureRecord& rec) {
  const JobSpec& s = o_.spec;
  Outcome out;
  if (rec.kind != FailureKind::kSucceeded) {
    r.group->Stop(s.timeouts.stop_grace);
    PostRootCause(r, r.task_restarts);
    out.kind = Outcome::kEnded;
    out.end = rec;
    return out;
  }
  // Roles with `finish` end on their own (the evaluator's last model); the rest stop now.
  std::vector<int> now, later;
  for (const auto& t : r.mine) {
    if (!r.group->Exited(t.local)) (r.RoleOf(t).finish ? later : now).push_back(t.local);
  }
  r.group->StopSome(now, s.timeouts.stop_grace);
  const auto deadline = env_->Now() + s.timeouts.finish;
  bool said = false;
  for (auto left = later; !left.empty() && env_->Now() < deadline;) {
    if (!said) {
      LOG_INFO("the job succeeded; waiting up to {} (timeouts.finish) for {} task(s) to finish",
               FormatDuration(s.timeouts.finish), left.size());
      said = true;
    }
    r.group->WaitSignal(o_.poll_interval);
    if (env_->StopSignal()) break;
    for (const WorkerExit& e : r.group->ReapExited()) {
      const Task& t = r.mine[e.local_rank];
      if (!e.exit.success())
        LOG_WARN("{} {} ended with {} after the job succeeded", t.role, t.index, e.exit.Describe());
      left.erase(std::remove(left.begin(), left.end(), e.local_rank), left.end());
    }
  }
  r.group->Stop(s.timeouts.stop_grace);  // what did not finish in time, and the process groups
  out.kind = Outcome::kSucceeded;
  out.code = kExitOk;
  return out;
}

void Agent::KillStuckTasks(Round& r) {
  // A task that cannot make progress (stopped, or stuck in the kernel) is killed and so named as
  // the failure, rather than found by its peers' collective timeout a minute later.
  if (env_->Now() >= r.next_stuck_check) {
    r.next_stuck_check = env_->Now() + std::chrono::seconds(1);
    for (const auto& [local, why] : r.group->KillStuck(kStoppedFor, kBlockedFor)) {
      const Task& t = r.mine[local];
      LOG_WARN("{} {} (rank {}) was {}: killed, so that the job goes on without waiting for it", t.role, t.index,
               t.rank, why);
      r.stuck[local] = why;
    }
  }
  if (timers_) {
    for (const auto& x : timers_->Poll(r.group->Pids())) {
      const Task& t = r.mine[x.worker];
      const std::string why = "past its file timer " + Quote(x.scope) + " (torch's expires(), TORCHELASTIC_TIMER_FILE)";
      LOG_WARN("{} {} (rank {}) is {}: sent signal {}", t.role, t.index, t.rank, why, x.signal);
      r.stuck[static_cast<int>(x.worker)] = why;
    }
  }
}

std::optional<Agent::Outcome> Agent::OnTaskExit(Round& r, const WorkerExit& e) {
  const JobSpec& s = o_.spec;
  const Task& t = r.mine[e.local_rank];
  const RoleSpec& role = r.RoleOf(t);
  if (e.exit.success()) {
    if (!role.success) return std::nullopt;
    auto n = store_->Add(keys::RoundSucceeded(r.round), 1);
    if (!n.ok()) {
      r.group->Stop(s.timeouts.stop_grace);
      return Error(kExitError, "lost the job's store: " + n.status().ToString());
    }
    if (*n != r.deciders) return std::nullopt;
    // The last one: the job has succeeded.
    FailureRecord rec = NewFailure(FailureKind::kSucceeded, r.round, r.info.group_rank);
    rec.restarts = r.info.restarts;
    rec.exit = "the job succeeded";
    Outcome o = EndWith(r, rec);
    return o.kind == Outcome::kError ? o : FinishRound(r, o.end);
  }
  // A failure, unless the job succeeded a moment ago and this task lost what it needed.
  auto end = store_->TryGet(keys::RoundEnd(r.round));
  if (end.ok() && end->has_value()) {
    if (auto rec = FailureRecord::FromJson(**end); rec.ok() && rec->kind == FailureKind::kSucceeded) {
      return FinishRound(r, *rec);
    }
  }
  FailureRecord rec = NewFailure(FailureKind::kTask, r.round, r.info.group_rank);
  rec.restarts = r.info.restarts + 1;
  rec.rank = e.rank;
  rec.local_rank = e.local_rank;
  rec.role = t.role;
  rec.task_index = t.index;
  rec.pid = e.pid;
  rec.exited_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  rec.exit = e.exit.Describe();
  if (auto it = r.stuck.find(e.local_rank); it != r.stuck.end()) {
    rec.exit += " from trainctl: it was " + it->second;
    r.stuck.erase(it);
  }
  rec.log_path = r.launches[e.local_rank].log_path;
  rec.last_lines = r.group->Tail(e.local_rank, std::chrono::milliseconds(500));
  AddTaskError(r, t, r.task_restarts[e.local_rank], &rec);
  if (role.command.empty() && !e.exit.signaled && e.exit.code == kExitInvalidSpec) {
    // The built-in trainer's verdict: its configuration can never work. No restart.
    rec.kind = FailureKind::kConfig;
    rec.restarts = r.info.restarts;
    rec.final = true;
    return EndAndStop(r, rec, /*root_cause=*/true);
  }
  if (!role.command.empty() && r.info.restarts == 0 && r.task_restarts[e.local_rank] == 0 &&
      env_->Now() - r.started < kImportWindow && ImportFailure(rec.last_lines, rec.error)) {
    // A Python program that could not import what it needs, at its first start: every restart
    // would fail the same way, so none is spent (as for a program that cannot be run).
    rec.kind = FailureKind::kConfig;
    rec.restarts = r.info.restarts;
    rec.final = true;
    rec.exit +=
        " at its first start with an import error: a restart would fail the same way, so none is spent "
        "(install the module for " +
        role.command[0] + ", or run an interpreter that has it)";
    return EndAndStop(r, rec, /*root_cause=*/true);
  }
  if (role.on_failure == "ignore") {
    LOG_WARN("{}; the job goes on without it ({}.on_failure: ignore)", rec.Summary(), t.role);
    // For status.json; the job goes on even if the store missed it.
    if (store_->Add(keys::kIgnoredFailures, 1).ok()) {
      (void)store_->Set(keys::kLastIgnoredFailure, rec.ToJson());
    }
    return std::nullopt;
  }
  if (role.on_failure == "restart_task") {
    auto n = store_->Add(keys::kTaskRestarts, 1);
    if (n.ok() && RestartBudget{s.restart.max_restarts}.RestartFits(*n)) {
      const int again = ++r.task_restarts[e.local_rank];
      LOG_WARN("{}; restarting it alone (task restart {} of {})", rec.Summary(), *n, s.restart.max_restarts);
      Status st = r.group->Restart(e.local_rank, Launch(r, t, again));
      if (st.ok()) return std::nullopt;
      rec.exit += "; its restart failed: " + st.message();
    }
    rec.restarts = r.info.restarts;  // no group restart: the task budget is spent, the job fails
    rec.final = true;
    rec.exit += " (restart.max_restarts: " + std::to_string(s.restart.max_restarts) + " task restarts spent)";
  }
  return EndAndStop(r, rec, /*root_cause=*/true);
}

std::optional<Agent::Outcome> Agent::Beat(Round& r) {
  const JobSpec& s = o_.spec;
  if (env_->Now() < r.next_beat) return std::nullopt;
  r.next_beat = env_->Now() + std::max<Duration>(Duration(100), s.timeouts.heartbeat / 5);
  Status st = store_->Set(keys::RoundHeartbeat(r.round, r.info.group_rank), std::to_string(++r.beats));
  auto beat =
      st.ok() ? store_->TryGet(keys::RoundHeartbeat(r.round, r.watched)) : Result<std::optional<std::string>>(st);
  if (!beat.ok()) {
    r.group->Stop(s.timeouts.stop_grace);
    return Error(kExitError, "lost the job's store: " + beat.status().ToString());
  }
  if (beat->value_or("") != r.watched_beat) {
    r.watched_beat = beat->value_or("");
    r.watched_seen = env_->Now();
  } else if (r.watched != r.info.group_rank && env_->Now() - r.watched_seen >= s.timeouts.heartbeat) {
    FailureRecord rec = NewFailure(FailureKind::kNodeLost, r.round, r.watched);
    rec.restarts = r.info.restarts + 1;
    auto host = RoundNodeId(*store_, r.round, r.watched);
    rec.host = host.ok() ? *host : "node " + std::to_string(r.watched);
    rec.exit = "its agent sent no heartbeat for " + FormatDuration(s.timeouts.heartbeat) + " (timeouts.heartbeat)";
    return EndAndStop(r, rec, /*root_cause=*/false);
  }
  // Scale-up: nodes waiting to join end the round, without spending the restart budget.
  if (r.info.group_rank == 0 && r.info.group_world_size < s.nodes.max) {
    auto waiting = store_->TryGet(keys::RoundWaiting(r.round));
    if (waiting.ok() && waiting->has_value() && std::atoi((*waiting)->c_str()) > 0) {
      FailureRecord rec = NewFailure(FailureKind::kMembership, r.round, r.info.group_rank);
      rec.restarts = r.info.restarts;
      rec.exit = **waiting + " node(s) waiting to join; restarting the worker group with them";
      return EndAndStop(r, rec, /*root_cause=*/false);
    }
  }
  return std::nullopt;
}

Agent::Outcome Agent::Watch(Round& r) {
  const JobSpec& s = o_.spec;
  // Each turn reads the stop request and the round's end in one round trip: a thousand agents
  // polling are a store's whole load otherwise.
  const std::vector<std::string> watched_keys = {keys::kStop, keys::RoundEnd(r.round)};
  // A task's exit (SIGCHLD) and a stop signal wake the loop at once; the store's news (the stop
  // key, a peer's end of the round) is read every `poll`. In a job of one node only this agent
  // ends its rounds and a local launcher nudges it (kNudgeSignal) once it has set the stop key, so
  // it looks every half second: each wake-up preempts a worker on a machine they fill.
  const Duration poll = s.nodes.max == 1
                            ? std::max<Duration>(o_.poll_interval, std::chrono::milliseconds(500))
                            : ByJobSize(std::chrono::milliseconds(250), o_.poll_interval, std::chrono::seconds(1));
  // Once every task of this node has exited (its part is done, the job's is not), only the store
  // can bring news: the watch waits there for the round's end or the stop key, which the store
  // answers the moment one is set, instead of polling.
  auto all_exited = [&] {
    return std::all_of(r.mine.begin(), r.mine.end(), [&](const Task& t) { return r.group->Exited(t.local); });
  };
  while (true) {
    if (all_exited()) {
      // Until the next heartbeat, unless the round ends or the job stops first (read again
      // below); a stop signal interrupts it.
      const Duration wait = std::clamp<Duration>(env_->Remaining(r.next_beat), Duration(1), kLongestWait);
      (void)env_->WaitForAny(*store_, watched_keys, wait);
      // A stop signal that came meanwhile, and what the tasks' children wrote.
      while (r.group->WaitSignal(Duration(0)) != 0) {
      }
    } else {
      r.group->WaitSignal(poll);
    }
    auto seen = store_->TryGetMany(watched_keys);
    Status st = CheckStopSignal();
    if (st.ok() && !seen.ok()) st = seen.status();
    if (st.ok() && (*seen)[0]) st = Aborted(*(*seen)[0]);
    if (!st.ok()) {
      r.group->Stop(s.timeouts.stop_grace);
      if (st.code() == Code::kAborted) return Stopped(st);
      return Error(kExitError, "lost the job's store: " + st.ToString());
    }
    KillStuckTasks(r);
    for (const WorkerExit& e : r.group->ReapExited()) {
      if (auto o = OnTaskExit(r, e)) return *o;
    }
    if (const auto& end = (*seen)[1]) {
      auto rec = FailureRecord::FromJson(*end);
      if (!rec.ok()) {
        r.group->Stop(s.timeouts.stop_grace);
        return Error(kExitError, "lost the job's store: " + rec.status().ToString());
      }
      return FinishRound(r, *rec);
    }
    if (auto o = Beat(r)) return *o;
  }
}

std::optional<int> Agent::AfterRound(const Outcome& out, int* restarts, int* quick_failures, Duration ran_for) {
  const JobSpec& s = o_.spec;
  switch (out.kind) {
    case Outcome::kSucceeded:
      return kExitOk;
    case Outcome::kStopped:
      LOG_INFO("stopped: {}", out.message);
      return out.code;
    case Outcome::kError:
      LOG_ERROR("{}", out.message);
      return out.code;
    case Outcome::kEnded:
      break;
  }
  const FailureRecord& f = out.end;
  if (f.kind == FailureKind::kSucceeded) return kExitOk;
  *restarts = f.restarts;
  if (f.kind == FailureKind::kStart || f.kind == FailureKind::kConfig) {
    if (out.reported) LOG_ERROR("{}; not restarting: it would fail again", f.Summary());
    return f.kind == FailureKind::kConfig ? kExitInvalidSpec : kExitWorkerFailed;
  }
  if (!f.failure()) {
    if (out.reported) LOG_INFO("{}", f.Summary());
    return std::nullopt;
  }
  if (RestartBudget{s.restart.max_restarts}.Spent(f)) {
    if (out.reported) LOG_ERROR("{}; no restarts left (max_restarts: {})", f.Summary(), s.restart.max_restarts);
    return kExitWorkerFailed;
  }
  // Back-off: failures in a row come back ever slower, so a large budget is not spent in a
  // burst; a round that ran for a while starts the count again.
  if (ran_for >= s.restart.backoff_max) *quick_failures = 0;
  Duration delay(0);
  if (*quick_failures > 0) {
    delay = s.restart.backoff;
    for (int i = 1; i < *quick_failures && delay < s.restart.backoff_max; ++i) delay *= 2;
    delay = std::min(delay, s.restart.backoff_max);
  }
  ++*quick_failures;
  if (out.reported) {
    LOG_WARN("{}; restarting the worker group (restart {} of {}){}", f.Summary(), f.restarts, s.restart.max_restarts,
             delay.count() > 0 ? " in " + FormatDuration(delay) + " (restart.backoff: failures in a row)" : "");
    if (!f.last_lines.empty()) LOG_WARN("its last output: {}", f.last_lines.back());
  }
  for (const auto until = env_->Now() + delay; env_->Now() < until;) {
    env_->WaitSignal(std::min<Duration>(env_->Remaining(until), std::chrono::milliseconds(100)));
    if (Status st = CheckStop(); !st.ok()) {
      Outcome stopped = Stopped(st);
      LOG_INFO("stopped: {}", stopped.message);
      return stopped.code;
    }
  }
  return std::nullopt;
}

int Agent::Run() {
  const JobSpec& s = o_.spec;
  // The trainer's in-memory snapshots live as long as the run's agents on this host.
  std::unique_ptr<SnapshotHold> snapshots;
  if (s.trainer.enabled && s.trainer.snapshot_every > 0 && s.trainer.strategy == "allreduce") {
    auto held = SnapshotHold::Acquire(o_.run_id);
    if (held.ok()) {
      snapshots = std::move(*held);
    } else {
      LOG_WARN("in-memory snapshots are off on this node: {}", held.status().message());
    }
  }
  // Orphans of our tasks come back to us instead of init, so none outlives the job unreaped.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  log::SetContext(s.name, o_.node_rank >= 0 ? "node=" + std::to_string(o_.node_rank) : "agent", 0);
  if (Status st = MakeDirs(paths::LogsDir(s.output_dir)); !st.ok()) {
    LOG_ERROR("{}", st.message());
    return kExitError;
  }
  // A node that joins a running job starts at its current round.
  auto current = CurrentRound(*store_);
  if (!current.ok()) {
    LOG_ERROR("cannot read the job's state: {}", current.status().message());
    return kExitError;
  }
  int restarts = 0;
  if (*current > 0) {
    auto peek = PeekRound(*store_, *current);
    if (peek.ok() && peek->has_value()) restarts = (*peek)->restarts;
  }
  int quick_failures = 0;  // failed rounds in a row that lasted less than restart.backoff_max
  for (int round = *current;; ++round) {
    const auto round_started = env_->Now();
    const Outcome out = RunRound(round, restarts);
    const Duration ran_for = std::chrono::duration_cast<Duration>(env_->Now() - round_started);
    if (auto code = AfterRound(out, &restarts, &quick_failures, ran_for)) return *code;
  }
}

}  // namespace trainctl
