#include "agent/agent.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "agent/failure.h"
#include "agent/worker_group.h"
#include "common/exit_codes.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/subprocess.h"
#include "rendezvous/rendezvous.h"

namespace trainctl {

namespace keys {
std::string RoundEnd(int round) { return "round/" + std::to_string(round) + "/end"; }
std::string RoundSucceeded(int round) { return "round/" + std::to_string(round) + "/succeeded"; }
std::string RoundMaster(int round) { return "round/" + std::to_string(round) + "/master"; }
std::string RoundWaiting(int round) { return "round/" + std::to_string(round) + "/waiting"; }
std::string RoundHeartbeat(int round, int node) {
  return "round/" + std::to_string(round) + "/heartbeat/" + std::to_string(node);
}
}  // namespace keys

std::string StopRecord(const std::string& reason, int code) {
  return nlohmann::json{{"reason", reason}, {"code", code}}.dump();
}

bool ParseStopRecord(const std::string& text, std::string* reason, int* code) {
  try {
    auto j = nlohmann::json::parse(text);
    *reason = j.at("reason").get<std::string>();
    *code = j.at("code").get<int>();
    return true;
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

namespace {

// A port that is free on `host` now. The worker that becomes rank 0 binds it moments later
// (torch's TCPStore uses SO_REUSEADDR), as torchrun does.
Result<int> FreePort(const std::string& host) {
  struct addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  struct addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), "0", &hints, &res) != 0) {
    return InvalidArgument("cannot resolve this node's address " + host);
  }
  int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int rc = fd < 0 ? -1 : ::bind(fd, res->ai_addr, res->ai_addrlen);
  ::freeaddrinfo(res);
  if (rc != 0) {
    int err = errno;
    if (fd >= 0) ::close(fd);
    return ErrnoStatus("cannot find a free port on " + host, err);
  }
  struct sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                          : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

std::string HostName() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

}  // namespace

struct Agent::Outcome {
  // kEnded: the round ended (failure or membership change, in `end`); kWaited: this agent was not
  // in the round and it ended (in `end`); kSucceeded: the job is done.
  enum Kind { kSucceeded, kEnded, kStopped, kError } kind = kError;
  int code = kExitError;
  std::string message;
  FailureRecord end;
  bool reported = false;  // this agent wrote `end` (and logs it)
};

Agent::Agent(AgentOptions options, Store* store) : o_(std::move(options)), store_(store) {
  // "host:pid", or "host/address:pid" when peers reach this node at another address than loopback.
  std::string where = o_.host == "127.0.0.1" || o_.host == "::1" ? HostName() : HostName() + "/" + o_.host;
  node_id_ = where + ":" + std::to_string(::getpid());
}

Status Agent::CheckStop() {
  if (int sig = StopSignal()) {
    std::string reason = std::string("interrupted by SIG") + ::sigabbrev_np(sig) + " on " + node_id_;
    auto ignored = store_->CompareSet(keys::kStop, "", StopRecord(reason, kExitInterrupted));
    return Aborted(reason);
  }
  ASSIGN_OR_RETURN(auto stop, store_->TryGet(keys::kStop));
  if (stop) return Aborted(*stop);
  return Status::Ok();
}

std::vector<std::string> Agent::WorkerEnv(int local_rank, int group_rank, int group_world_size,
                                          const std::string& master, int restart) const {
  const JobSpec& s = o_.spec;
  std::vector<std::string> env = CurrentEnvironment();
  for (const auto& [k, v] : s.env) SetEnv(&env, k, v);
  // Defaults a user or the spec may override.
  if (!GetEnv(env, "OMP_NUM_THREADS")) {
    int threads = s.resources.cpus >= 1 ? static_cast<int>(s.resources.cpus) : 1;
    SetEnv(&env, "OMP_NUM_THREADS", std::to_string(threads));
  }
  if (!GetEnv(env, "PYTHONUNBUFFERED")) SetEnv(&env, "PYTHONUNBUFFERED", "1");
  // Output reaches a terminal: workers may redraw a status line with '\r' (see OutputPump).
  if (o_.color_output) SetEnv(&env, "TRAINCTL_TTY", "1");

  int nproc = s.procs_per_node;
  int world = group_world_size * nproc;
  int rank = group_rank * nproc + local_rank;
  size_t colon = master.rfind(':');
  const std::pair<const char*, std::string> contract[] = {
      {"RANK", std::to_string(rank)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"WORLD_SIZE", std::to_string(world)},
      {"LOCAL_WORLD_SIZE", std::to_string(nproc)},
      {"GROUP_RANK", std::to_string(group_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(group_world_size)},
      {"ROLE_NAME", "default"},
      {"ROLE_RANK", std::to_string(rank)},
      {"ROLE_WORLD_SIZE", std::to_string(world)},
      {"MASTER_ADDR", master.substr(0, colon)},
      {"MASTER_PORT", master.substr(colon + 1)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(s.restart.max_restarts)},
      {"TORCHELASTIC_RUN_ID", o_.run_id},
      {"TORCHELASTIC_USE_AGENT_STORE", "False"},
      {"TRAINCTL_JOB_NAME", s.name},
      {"TRAINCTL_RUN_ID", o_.run_id},
      {"TRAINCTL_OUTPUT_DIR", s.output_dir},
      {"TRAINCTL_CHECKPOINT_DIR", s.checkpoint_dir},
      {"TRAINCTL_STORE_ADDR", o_.store_addr},
      {"TRAINCTL_STORE_TOKEN", o_.store_token},
      {"TRAINCTL_STORE_PREFIX", o_.store_prefix},
      {"TRAINCTL_HOST", o_.host},
  };
  for (const auto& [k, v] : contract) SetEnv(&env, k, v);
  return env;
}

FailureRecord Agent::NewFailure(const std::string& kind, int round, int group_rank) const {
  FailureRecord rec;
  rec.kind = kind;
  rec.round = round;
  rec.node_rank = group_rank;
  rec.host = node_id_;
  return rec;
}

// Records why round `round` ended, unless another agent already did; returns the record that won.
Result<FailureRecord> Agent::EndRound(int round, const FailureRecord& rec, bool* won) {
  std::string json = rec.ToJson();
  ASSIGN_OR_RETURN(std::string now, store_->CompareSet(keys::RoundEnd(round), "", json));
  *won = now == json;
  if (*won && rec.failure()) {
    RETURN_IF_ERROR(store_->Set(keys::kLastFailure, json));
    // Restarts done: a failure past the budget ends the job instead of restarting it.
    int done = std::min(rec.restarts, o_.spec.restart.max_restarts);
    RETURN_IF_ERROR(store_->Set(keys::kRestarts, std::to_string(done)));
  }
  return FailureRecord::FromJson(now);
}

// This agent is not in round `round` (it was full): wait, as a node waiting to join, until the
// round ends (then join the next), the job succeeds, or it is stopped. The round's members see
// the waiting count and end their round to admit it (see RunRound).
Agent::Outcome Agent::WaitOutRound(int round, const RoundInfo& full) {
  Outcome out;
  LOG_INFO("round {} is full ({} of max {} nodes): waiting to join the job at the next round", round,
           full.group_world_size, o_.spec.nodes.max);
  if (auto n = store_->Add(keys::RoundWaiting(round), 1); !n.ok()) {
    out.message = "lost the job's store: " + n.status().ToString();
    return out;
  }
  while (true) {
    WaitSignal(std::chrono::milliseconds(200));
    if (Status st = CheckStop(); !st.ok()) return Stopped(st);
    auto end = store_->TryGet(keys::RoundEnd(round));
    auto done = store_->TryGet(keys::RoundSucceeded(round));
    if (!end.ok() || !done.ok()) {
      out.message = "lost the job's store: " + (end.ok() ? done.status() : end.status()).ToString();
      return out;
    }
    if (end->has_value()) {
      auto rec = FailureRecord::FromJson(**end);
      if (!rec.ok()) {
        out.message = rec.status().message();
        return out;
      }
      out.kind = Outcome::kEnded;
      out.end = *rec;
      return out;
    }
    if (done->has_value() && std::atoi((*done)->c_str()) >= full.group_world_size) {
      LOG_INFO("the job finished before this node could join it");
      out.kind = Outcome::kSucceeded;
      out.code = kExitOk;
      return out;
    }
  }
}

Agent::Outcome Agent::Stopped(const Status& why) {
  Outcome out;
  std::string reason = why.message();
  int code = kExitInterrupted;
  std::string parsed;
  if (ParseStopRecord(why.message(), &parsed, &code)) reason = parsed;
  out.kind = Outcome::kStopped;
  out.code = code;
  out.message = reason;
  return out;
}

Agent::Outcome Agent::RunRound(int round, int restarts) {
  const JobSpec& s = o_.spec;
  Outcome out;
  auto error = [&out](int code, const std::string& message) {
    out.kind = Outcome::kError;
    out.code = code;
    out.message = message;
    return out;
  };
  auto ended = [&](FailureRecord rec) {
    auto won = EndRound(round, rec, &out.reported);
    if (!won.ok()) return error(kExitError, "lost the job's store: " + won.status().ToString());
    out.kind = Outcome::kEnded;
    out.end = *won;
    return out;
  };

  RendezvousOptions ro;
  ro.min_nodes = s.nodes.min;
  ro.max_nodes = s.nodes.max;
  ro.last_call = s.timeouts.last_call;
  ro.timeout = s.timeouts.rendezvous;
  ro.rank_hint = o_.node_rank;
  ro.node_id = node_id_;
  ro.check = [this] { return CheckStop(); };
  LOG_DEBUG("round {}: joining as {}", round, node_id_);
  auto joined = JoinRound(*store_, round, restarts, ro);
  if (!joined.ok()) {
    const Status& st = joined.status();
    if (st.code() == Code::kAborted) return Stopped(st);
    if (st.code() == Code::kTimeout) return error(kExitRendezvousTimeout, st.message());
    return error(kExitError, "rendezvous failed: " + st.ToString());
  }
  if (!joined->has_value()) {
    auto peek = PeekRound(*store_, round);
    if (!peek.ok() || !peek->has_value()) return error(kExitError, "rendezvous round " + std::to_string(round) + " vanished");
    return WaitOutRound(round, **peek);
  }
  const RoundInfo info = **joined;
  const int restart = info.restarts;
  log::SetContext(s.name, "node=" + std::to_string(info.group_rank), restart);
  if (info.group_rank == 0 && (round > 0 || info.group_world_size < s.nodes.max)) {
    LOG_INFO("round {}: {} node(s), world size {} (restart {} of {})", round, info.group_world_size,
             info.group_world_size * s.procs_per_node, restart, s.restart.max_restarts);
  }

  std::string master;
  if (info.group_rank == 0) {
    auto port = FreePort(o_.host);
    if (!port.ok()) return error(kExitError, port.status().message());
    master = o_.host + ":" + std::to_string(*port);
    if (Status st = store_->Set(keys::RoundMaster(round), master); !st.ok()) {
      return error(kExitError, "lost the job's store: " + st.ToString());
    }
  } else {
    auto got = store_->Get(keys::RoundMaster(round), s.timeouts.rendezvous);
    if (!got.ok()) return error(kExitError, "no master address for round " + std::to_string(round) +
                                                ": " + got.status().ToString());
    master = *got;
  }

  std::vector<WorkerLaunch> launches;
  std::vector<std::string> argv = s.command;
  argv.insert(argv.end(), s.args.begin(), s.args.end());
  if (s.trainer.enabled) {  // the built-in trainer: this same binary, `trainctl train`
    bool debug = spdlog::get_level() <= spdlog::level::debug;
    argv = {SelfExe(), "--log-level", debug ? "debug" : "info", "train"};
  }
  for (int local = 0; local < s.procs_per_node; ++local) {
    WorkerLaunch w;
    w.local_rank = local;
    w.rank = info.group_rank * s.procs_per_node + local;
    w.argv = argv;
    w.env = WorkerEnv(local, info.group_rank, info.group_world_size, master, restart);
    SetEnv(&w.env, "TRAINCTL_ROUND", std::to_string(round));
    w.cwd = s.working_dir;
    w.log_path = s.output_dir + "/logs/worker-" + std::to_string(w.rank) + ".log";
    w.log_header = "=== trainctl: run " + o_.run_id + ", round " + std::to_string(round) +
                   ", restart " + std::to_string(restart) + " ===\n";
    launches.push_back(std::move(w));
  }

  WorkerGroup group(o_.color_output);
  LOG_DEBUG("round {}: node {} of {}, master {}, starting {} workers", round, info.group_rank,
            info.group_world_size, master, launches.size());
  if (Status st = group.Start(launches); !st.ok()) {
    FailureRecord rec = NewFailure("start", round, info.group_rank);
    rec.restarts = restart + 1;
    rec.rank = launches[0].rank;
    rec.local_rank = 0;
    rec.exit = st.message();
    return ended(rec);
  }

  // Liveness: each agent bumps its heartbeat key and watches the next node's (a ring), so a
  // lost node is seen by one peer at a cost that does not grow with the job.
  const Duration hb_every = std::max<Duration>(Duration(100), s.timeouts.heartbeat / 5);
  const int watched = (info.group_rank + 1) % info.group_world_size;
  std::string watched_beat;
  auto watched_seen = Clock::now();
  auto next_beat = Clock::now();
  int64_t beats = 0;

  bool reported_success = false;
  while (true) {
    WaitSignal(o_.poll_interval);
    if (Status st = CheckStop(); !st.ok()) {
      group.Stop(s.timeouts.stop_grace);
      if (st.code() == Code::kAborted) return Stopped(st);
      return error(kExitError, "lost the job's store: " + st.ToString());
    }
    for (const WorkerExit& e : group.ReapExited()) {
      if (e.exit.success()) continue;
      FailureRecord rec = NewFailure("worker", round, info.group_rank);
      rec.restarts = restart + 1;
      rec.rank = e.rank;
      rec.local_rank = e.local_rank;
      rec.pid = e.pid;
      rec.exit = e.exit.Describe();
      rec.log_path = launches[e.local_rank].log_path;
      rec.last_lines = group.Tail(e.local_rank, std::chrono::milliseconds(500));
      Outcome o = ended(rec);  // first, so peers stop their workers meanwhile
      group.Stop(s.timeouts.stop_grace);
      return o;
    }
    auto end = store_->TryGet(keys::RoundEnd(round));
    if (!end.ok()) {
      group.Stop(s.timeouts.stop_grace);
      return error(kExitError, "lost the job's store: " + end.status().ToString());
    }
    if (end->has_value()) {
      group.Stop(s.timeouts.stop_grace);
      auto rec = FailureRecord::FromJson(**end);
      if (!rec.ok()) return error(kExitError, rec.status().message());
      out.kind = Outcome::kEnded;
      out.end = *rec;
      return out;
    }
    if (Clock::now() >= next_beat && !reported_success) {
      next_beat = Clock::now() + hb_every;
      Status st = store_->Set(keys::RoundHeartbeat(round, info.group_rank), std::to_string(++beats));
      auto beat = st.ok() ? store_->TryGet(keys::RoundHeartbeat(round, watched))
                          : Result<std::optional<std::string>>(st);
      if (!beat.ok()) {
        group.Stop(s.timeouts.stop_grace);
        return error(kExitError, "lost the job's store: " + beat.status().ToString());
      }
      if (beat->value_or("") != watched_beat) {
        watched_beat = beat->value_or("");
        watched_seen = Clock::now();
      } else if (watched != info.group_rank && Clock::now() - watched_seen >= s.timeouts.heartbeat) {
        FailureRecord rec = NewFailure("node_lost", round, watched);
        rec.restarts = restart + 1;
        rec.host = info.nodes[watched];
        rec.exit = "its agent sent no heartbeat for " + FormatDuration(s.timeouts.heartbeat) +
                   " (timeouts.heartbeat)";
        Outcome o = ended(rec);  // first, so peers stop their workers meanwhile
        group.Stop(s.timeouts.stop_grace);
        return o;
      }
      // Scale-up: nodes waiting to join end the round, without spending the restart budget.
      if (info.group_rank == 0 && info.group_world_size < s.nodes.max) {
        auto waiting = store_->TryGet(keys::RoundWaiting(round));
        if (waiting.ok() && waiting->has_value() && std::atoi((*waiting)->c_str()) > 0) {
          FailureRecord rec = NewFailure("membership", round, info.group_rank);
          rec.restarts = restart;
          rec.exit = **waiting + " node(s) waiting to join; restarting the worker group with them";
          Outcome o = ended(rec);  // first, so peers stop their workers meanwhile
          group.Stop(s.timeouts.stop_grace);
          return o;
        }
      }
    }
    if (!reported_success && group.AllExited()) {
      // Every local worker exited 0 (a failure would have ended the round above).
      if (auto n = store_->Add(keys::RoundSucceeded(round), 1); !n.ok()) {
        return error(kExitError, "lost the job's store: " + n.status().ToString());
      }
      reported_success = true;
    }
    if (reported_success) {
      auto n = store_->TryGet(keys::RoundSucceeded(round));
      if (n.ok() && n->has_value() && std::atoll((*n)->c_str()) >= info.group_world_size) {
        group.Stop(Duration(0));  // reaps nothing; cleans up the workers' process groups
        out.kind = Outcome::kSucceeded;
        out.code = kExitOk;
        return out;
      }
    }
  }
}

int Agent::Run() {
  const JobSpec& s = o_.spec;
  // The trainer's in-memory snapshot lives as long as this agent's part in the job.
  struct RemoveSnapshot {
    std::string dir;
    ~RemoveSnapshot() { RemoveAll(dir); }
  } remove_snapshot{SnapshotDir(o_.run_id)};
  // Orphans of our workers come back to us instead of init, so none outlives the job unreaped.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  log::SetContext(s.name, o_.node_rank >= 0 ? "node=" + std::to_string(o_.node_rank) : "agent", 0);
  if (Status st = MakeDirs(s.output_dir + "/logs"); !st.ok()) {
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
  for (int round = *current;; ++round) {
    Outcome out = RunRound(round, restarts);
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
    restarts = f.restarts;
    if (f.kind == "start") {
      if (out.reported) LOG_ERROR("{}", f.Summary());
      return kExitWorkerFailed;
    }
    if (!f.failure()) {
      if (out.reported) LOG_INFO("{}", f.Summary());
      continue;
    }
    if (f.restarts > s.restart.max_restarts) {
      if (out.reported) {
        LOG_ERROR("{}; no restarts left (max_restarts: {})", f.Summary(), s.restart.max_restarts);
      }
      return kExitWorkerFailed;
    }
    if (out.reported) {
      LOG_WARN("{}; restarting the worker group (restart {} of {})", f.Summary(), f.restarts,
               s.restart.max_restarts);
      if (!f.last_lines.empty()) LOG_WARN("its last output: {}", f.last_lines.back());
    }
  }
}

}  // namespace trainctl
