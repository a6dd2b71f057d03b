#include "agent/worker_group.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "common/duration.h"
#include "common/fs.h"

namespace trainctl {

WorkerGroup::WorkerGroup(bool color_output, WorkerForks* forks) : color_(color_output), forks_(forks) {}

WorkerGroup::~WorkerGroup() { Stop(Duration(0)); }

SpawnOptions WorkerGroup::Options(const WorkerLaunch& launch) {
  SpawnOptions o;
  o.argv = launch.argv;
  o.env = launch.env;
  o.cwd = launch.cwd;
  o.cpus = launch.cpus;
  return o;
}

// Spawns one worker with its output going to the pump (and its log file).
Result<pid_t> WorkerGroup::SpawnOne(const WorkerLaunch& launch) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return ErrnoStatus("pipe", errno);
  int log_fd = -1;
  if (!launch.log_path.empty()) {
    log_fd = ::open(launch.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) {
      int err = errno;
      ::close(fds[0]);
      ::close(fds[1]);
      return ErrnoStatus("cannot open worker log " + launch.log_path, err);
    }
    if (!launch.log_header.empty()) {
      ssize_t ignored = ::write(log_fd, launch.log_header.data(), launch.log_header.size());
      (void)ignored;
    }
  }
  if (!launch.error_file.empty()) {  // a fresh one: what an earlier attempt wrote is not this one's
    const std::string dir = launch.error_file.substr(0, launch.error_file.rfind('/'));
    if (Status st = MakeDirs(dir); !st.ok()) {
      ::close(fds[0]);
      ::close(fds[1]);
      if (log_fd >= 0) ::close(log_fd);
      return st;
    }
    ::unlink(launch.error_file.c_str());
  }
  SpawnOptions o = Options(launch);
  o.output_fd = fds[1];
  auto pid = forks_ && launch.fork ? forks_->Start(o, launch.shared_env, launch.preload) : Spawn(o);
  ::close(fds[1]);
  if (!pid.ok()) {
    ::close(fds[0]);
    if (log_fd >= 0) ::close(log_fd);
    return pid.status();
  }
  pump_->Add(launch.rank, launch.label.empty() ? "worker-" + std::to_string(launch.rank) : launch.label, fds[0], log_fd,
             launch.log_path.empty() ? "" : launch.log_path + ".times");
  return *pid;
}

Status WorkerGroup::Start(const std::vector<WorkerLaunch>& launches) {
  pump_ = std::make_unique<OutputPump>(STDOUT_FILENO, color_);
  workers_.clear();
  if (forks_) {
    for (const auto& launch : launches) {
      if (launch.fork) forks_->Prepare(Options(launch), launch.shared_env, launch.preload);
    }
  }
  for (const auto& launch : launches) {
    auto pid = SpawnOne(launch);
    if (!pid.ok()) {
      Stop(Duration(0));
      return pid.status();
    }
    workers_.push_back({launch, *pid, false});
  }
  return Status::Ok();
}

Status WorkerGroup::Restart(int local_rank, const WorkerLaunch& launch) {
  for (auto& w : workers_) {
    if (w.launch.local_rank != local_rank) continue;
    if (!w.exited) return Internal("worker " + launch.label + " is still running");
    ::kill(-w.pid, SIGKILL);  // whatever the old worker left in its group
    ASSIGN_OR_RETURN(pid_t pid, SpawnOne(launch));
    w = {launch, pid, false};
    return Status::Ok();
  }
  return NotFound("no worker with local rank " + std::to_string(local_rank));
}

std::vector<WorkerExit> WorkerGroup::ReapExited() {
  std::vector<WorkerExit> out;
  for (auto& w : workers_) {
    if (w.exited) continue;
    int status = 0;
    pid_t r = ::waitpid(w.pid, &status, WNOHANG);
    if (r == w.pid) {
      w.exited = true;
      out.push_back({w.launch.local_rank, w.launch.rank, w.pid, ExitInfo::FromWaitStatus(status)});
    }
  }
  return out;
}

bool WorkerGroup::AllExited() const {
  return std::all_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.exited; });
}

bool WorkerGroup::Exited(int local_rank) const {
  for (const auto& w : workers_) {
    if (w.launch.local_rank == local_rank) return w.exited;
  }
  return true;
}

template <typename Pick>
void WorkerGroup::StopWhere(Pick pick, Duration grace) {
  for (auto& w : workers_) {
    if (pick(w) && !w.exited) {
      ::kill(-w.pid, SIGTERM);
      ::kill(-w.pid, SIGCONT);  // a stopped (SIGSTOP) worker only acts on SIGTERM once resumed
    }
  }
  auto all_exited = [&] {
    return std::all_of(workers_.begin(), workers_.end(), [&](const Worker& w) { return !pick(w) || w.exited; });
  };
  auto deadline = Clock::now() + grace;
  while (!all_exited()) {
    // Reap only the picked workers: the others' exits are the caller's to see.
    for (auto& w : workers_) {
      int status = 0;
      if (pick(w) && !w.exited && ::waitpid(w.pid, &status, WNOHANG) == w.pid) w.exited = true;
    }
    if (all_exited() || Clock::now() >= deadline) break;
    WaitSignal(std::min(Remaining(deadline), Duration(20)));  // the output flows meanwhile
  }
  for (auto& w : workers_) {
    if (!pick(w)) continue;
    ::kill(-w.pid, SIGKILL);  // stragglers, and anything the worker left in its group
    if (!w.exited) {
      int status;
      while (::waitpid(w.pid, &status, 0) < 0 && errno == EINTR) {
      }
      w.exited = true;
    }
  }
}

void WorkerGroup::StopSome(const std::vector<int>& local_ranks, Duration grace) {
  StopWhere(
      [&](const Worker& w) {
        return std::find(local_ranks.begin(), local_ranks.end(), w.launch.local_rank) != local_ranks.end();
      },
      grace);
}

void WorkerGroup::Stop(Duration grace) {
  StopWhere([](const Worker&) { return true; }, grace);
  // Grandchildren orphaned by a worker were reparented to this (subreaper) agent and have just
  // been sent SIGKILL with their group: reap them, bounded. By group: the agent's other children
  // (a worker server) live on.
  auto reap_deadline = Clock::now() + std::chrono::seconds(1);
  for (bool left = !workers_.empty(); left && Clock::now() < reap_deadline;) {
    left = false;
    for (const auto& w : workers_) {
      int status;
      pid_t r;
      while ((r = ::waitpid(-w.pid, &status, WNOHANG)) > 0) {
      }
      left = left || r == 0;  // one of its group has yet to exit; ECHILD: none left
    }
    if (left) WaitSignal(Duration(10));
  }
  if (pump_) pump_->Stop();
}

int WorkerGroup::WaitSignal(Duration wait) { return pump_ ? pump_->WaitSignal(wait) : trainctl::WaitSignal(wait); }

std::vector<std::string> WorkerGroup::Tail(int local_rank, Duration drain) {
  for (const auto& w : workers_) {
    if (w.launch.local_rank != local_rank) continue;
    if (!pump_) return {};
    pump_->WaitDrained(w.launch.rank, drain);
    return pump_->Tail(w.launch.rank);
  }
  return {};
}

std::vector<std::pair<int, std::string>> WorkerGroup::KillStuck(Duration stopped, Duration blocked) {
  std::vector<std::pair<int, std::string>> out;
  const auto now = Clock::now();
  for (size_t i = 0; i < workers_.size(); ++i) {
    Worker& w = workers_[i];
    if (w.exited || w.pid <= 0) continue;
    auto stat = ReadFile("/proc/" + std::to_string(w.pid) + "/stat", 1 << 14);
    const size_t close = stat.ok() ? stat->rfind(')') : std::string::npos;
    const char state = close != std::string::npos && close + 2 < stat->size() ? (*stat)[close + 2] : 0;
    if (state != w.state) {
      w.state = state;
      w.state_since = now;
      continue;
    }
    const Duration in_state = std::chrono::duration_cast<Duration>(now - w.state_since);
    std::string why;
    // T: stopped by a signal. Not t: a debugger's stop, which its user means.
    if (state == 'T' && in_state >= stopped) {
      why = "stopped (SIGSTOP) for " + FormatDuration(in_state);
    } else if (state == 'D' && in_state >= blocked) {
      why = "in uninterruptible sleep (state D: a hung device or file system) for " + FormatDuration(in_state);
    }
    if (why.empty()) continue;
    ::kill(-w.pid, SIGKILL);
    ::kill(w.pid, SIGKILL);
    out.emplace_back(static_cast<int>(i), why);
  }
  return out;
}

std::vector<pid_t> WorkerGroup::Pids() const {
  std::vector<pid_t> out;
  for (const auto& w : workers_) out.push_back(w.exited ? 0 : w.pid);
  return out;
}

}  // namespace trainctl
