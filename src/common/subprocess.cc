#include "common/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <thread>

#include "common/fs.h"
#include "common/strings.h"

extern char** environ;

namespace trainctl {
namespace {

bool IsExecutableFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// Only async-signal-safe calls from here on: the parent may have other threads.
[[noreturn]] void ChildExec(const SpawnOptions& o, const char* path, char** argv, char** envp, const cpu_set_t* cpus,
                            pid_t parent, int err_fd) {
  auto die = [err_fd](int err) {
    ssize_t ignored = ::write(err_fd, &err, sizeof err);
    (void)ignored;
    ::_exit(127);
  };
  if (o.new_process_group) ::setpgid(0, 0);
  if (o.die_with_parent) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);
  }
  for (int sig = 1; sig < NSIG; ++sig) ::signal(sig, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  int in = o.stdin_fd >= 0 ? o.stdin_fd : ::open("/dev/null", O_RDONLY);
  if (in < 0 || ::dup2(in, 0) < 0) die(errno);
  if (o.output_fd >= 0) {
    if (::dup2(o.output_fd, 1) < 0 || ::dup2(o.output_fd, 2) < 0) die(errno);
  }
  if (o.stderr_fd >= 0 && ::dup2(o.stderr_fd, 2) < 0) die(errno);
  if (o.pass_fd > 2 && ::fcntl(o.pass_fd, F_SETFD, 0) != 0) die(errno);
  if (!o.cwd.empty() && ::chdir(o.cwd.c_str()) != 0) die(errno);
  if (cpus && ::sched_setaffinity(0, sizeof *cpus, cpus) != 0) die(errno);
  ::execve(path, argv, envp);
  die(errno);
  ::_exit(127);
}

}  // namespace

std::optional<std::string> GetEnv(const std::vector<std::string>& env, const std::string& key) {
  for (const auto& kv : env) {
    if (kv.size() > key.size() && kv.compare(0, key.size(), key) == 0 && kv[key.size()] == '=') {
      return kv.substr(key.size() + 1);
    }
  }
  return std::nullopt;
}

std::vector<std::string> CurrentEnvironment() {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) env.emplace_back(*e);
  return env;
}

void SetEnv(std::vector<std::string>* env, const std::string& key, const std::string& value) {
  std::string prefix = key + "=";
  for (auto& kv : *env) {
    if (kv.compare(0, prefix.size(), prefix) == 0) {
      kv = prefix + value;
      return;
    }
  }
  env->push_back(prefix + value);
}

std::string SelfExe() {
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return "trainctl";
  std::string path(self, static_cast<size_t>(n));
  // Replaced while running (a package upgrade, a rebuild): the kernel reports the old file as
  // deleted. Workers restarted later run the file now at that path.
  constexpr std::string_view kDeleted = " (deleted)";
  if (path.ends_with(kDeleted) && ::access(path.c_str(), X_OK) != 0) {
    path.resize(path.size() - kDeleted.size());
  }
  return path;
}

Result<std::string> FindExecutable(const std::string& name, const std::vector<std::string>& env) {
  if (name.empty()) return InvalidArgument("empty command");
  if (name.find('/') != std::string::npos) {
    if (IsExecutableFile(name)) return name;
    return NotFound(name + " is not an executable file");
  }
  std::string path = GetEnv(env, "PATH").value_or("");
  if (path.empty()) {
    const char* own = ::getenv("PATH");
    path = own ? own : "/usr/local/bin:/usr/bin:/bin";
  }
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    std::string dir = path.substr(start, end - start);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (IsExecutableFile(candidate)) return candidate;
    start = end + 1;
  }
  return NotFound("'" + name + "' was not found in PATH");
}

Result<pid_t> Spawn(const SpawnOptions& o) {
  if (o.argv.empty()) return InvalidArgument("empty command");
  ASSIGN_OR_RETURN(std::string path, FindExecutable(o.argv[0], o.env));
  std::vector<char*> argv, envp;
  for (const auto& a : o.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : o.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int c : o.cpus) {
    if (c < 0 || c >= CPU_SETSIZE)
      return InvalidArgument("no CPU " + std::to_string(c) + " to run " + o.argv[0] + " on");
    CPU_SET(c, &cpus);
  }
  int err_pipe[2];
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) return ErrnoStatus("pipe", errno);
  pid_t parent = ::getpid();
  // vfork: the child borrows this process's memory until it execs, instead of copying its page
  // tables (a launcher serving a thousand agents' store is a large process to copy, once per
  // agent). ChildExec only makes system calls, on its own stack frame, and never returns.
  pid_t pid = ::vfork();
  if (pid < 0) {
    int err = errno;
    ::close(err_pipe[0]);
    ::close(err_pipe[1]);
    return ErrnoStatus("vfork", err);
  }
  if (pid == 0) {
    ::close(err_pipe[0]);
    ChildExec(o, path.c_str(), argv.data(), envp.data(), o.cpus.empty() ? nullptr : &cpus, parent, err_pipe[1]);
  }
  ::close(err_pipe[1]);
  if (o.new_process_group) ::setpgid(pid, pid);  // also here: no race with an early kill(-pid)
  int child_errno = 0;
  ssize_t n;
  do {
    n = ::read(err_pipe[0], &child_errno, sizeof child_errno);
  } while (n < 0 && errno == EINTR);
  ::close(err_pipe[0]);
  if (n > 0) {
    int status;
    ::waitpid(pid, &status, 0);
    return ErrnoStatus("cannot run " + o.argv[0] + (o.cwd.empty() ? "" : " in " + o.cwd), child_errno);
  }
  return pid;
}

ExitInfo ExitInfo::FromWaitStatus(int status) {
  ExitInfo info;
  if (WIFSIGNALED(status)) {
    info.signaled = true;
    info.signal = WTERMSIG(status);
  } else {
    info.code = WEXITSTATUS(status);
  }
  return info;
}

std::string ExitInfo::Describe() const {
  if (!signaled) return "exit code " + std::to_string(code);
  const char* abbrev = ::sigabbrev_np(signal);
  return "signal " + std::to_string(signal) + (abbrev ? std::string(" (SIG") + abbrev + ")" : "");
}

Result<CommandResult> RunCommand(const SpawnOptions& options, Duration timeout) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return ErrnoStatus("pipe", errno);
  SpawnOptions o = options;
  o.output_fd = fds[1];
  auto spawned = Spawn(o);
  ::close(fds[1]);
  if (!spawned.ok()) {
    ::close(fds[0]);
    return spawned.status();
  }
  pid_t pid = *spawned;
  CommandResult result;
  auto deadline = Clock::now() + timeout;
  char buf[65536];
  while (true) {
    struct pollfd p {
      fds[0], POLLIN, 0
    };
    int left = static_cast<int>(Remaining(deadline).count());
    int rc = ::poll(&p, 1, left);
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) {
      result.timed_out = true;
      break;
    }
    ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    result.output.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (true) {
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) return ErrnoStatus("waitpid", errno);
    if (result.timed_out || Clock::now() >= deadline) {
      result.timed_out = true;
      ::kill(-pid, SIGKILL);
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (o.new_process_group) ::kill(-pid, SIGKILL);  // nothing it started outlives it
  result.exit = ExitInfo::FromWaitStatus(status);
  return result;
}

}  // namespace trainctl

namespace trainctl {

namespace {
sigset_t SignalSet(std::initializer_list<int> signals) {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : signals) sigaddset(&set, sig);
  return set;
}
sigset_t SupervisorSet() { return SignalSet({SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT, kNudgeSignal}); }
sigset_t StopSet() { return SignalSet({SIGINT, SIGTERM, SIGHUP, SIGQUIT}); }
// Reads the (blocked) signals of `set` as poll sees them; -1 where there is none to be had.
int SignalFd(const sigset_t& set) { return ::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC); }
}  // namespace

void BlockSupervisorSignals() {
  sigset_t set = SupervisorSet();
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
}

namespace {
std::atomic<int> g_stop_signal{0};
}  // namespace

int StopSignal() {
  if (int sig = g_stop_signal.load()) return sig;
  // One that came while this process waited on something else (a socket, a peer) is still
  // pending: taken now, so that every waiting loop that asks ends within its own period.
  const sigset_t stops = StopSet();
  const struct timespec zero = {0, 0};
  if (int sig = ::sigtimedwait(&stops, nullptr, &zero); sig > 0) {
    int none = 0;
    g_stop_signal.compare_exchange_strong(none, sig);
  }
  return g_stop_signal.load();
}

bool ProcessEnding(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid);
  // "pid (comm) state ppid pgrp session tty_nr tpgid flags ..."; comm may hold spaces and ')'.
  auto stat = ReadFile(dir + "/stat", 4096);
  if (!stat.ok()) return true;
  const size_t close = stat->rfind(')');
  if (close == std::string::npos) return true;
  std::istringstream fields(stat->substr(close + 1));
  char state = 0;
  long skip = 0;
  unsigned long flags = 0;
  fields >> state >> skip >> skip >> skip >> skip >> skip >> flags;
  constexpr unsigned long kExiting = 0x4;  // PF_EXITING
  if (state == 'Z' || state == 'X' || (flags & kExiting)) return true;
  // A killed process's threads each hold SIGKILL pending until they exit.
  auto status = ReadFile(dir + "/status", 1 << 16);
  if (!status.ok()) return true;
  for (const std::string& line : SplitLines(*status)) {
    if (line.rfind("SigPnd:", 0) == 0 || line.rfind("ShdPnd:", 0) == 0) {
      const unsigned long long pending = std::strtoull(line.c_str() + 7, nullptr, 16);
      if (pending & (1ULL << (SIGKILL - 1))) return true;
    }
  }
  return false;
}

bool IsStopSignal(int sig) { return sig == SIGINT || sig == SIGTERM || sig == SIGHUP || sig == SIGQUIT; }

int StopSignalFd() {
  static const int fd = SignalFd(StopSet());
  return fd;
}

namespace {
int Took(int sig) {
  if (IsStopSignal(sig)) {
    int none = 0;
    g_stop_signal.compare_exchange_strong(none, sig);
  }
  return sig;
}
}  // namespace

int WaitSignalOrReady(Duration timeout, std::vector<struct pollfd>* fds) {
  // The supervisor's signals are blocked, so they stay pending until taken: a signal fd reads
  // them as poll sees them.
  static const int signals = SignalFd(SupervisorSet());
  const auto deadline = Clock::now() + timeout;
  while (true) {
    for (auto& p : *fds) p.revents = 0;
    // Without a signal fd (none to be had): the fds, and the signals every 20 ms.
    Duration wait = Remaining(deadline);
    if (signals < 0) {
      if (int sig = WaitSignal(Duration(0))) return sig;
      wait = std::min(wait, Duration(20));
    }
    fds->push_back({signals, POLLIN, 0});
    const int rc = ::poll(fds->data(), fds->size() - (signals < 0 ? 1 : 0),
                          static_cast<int>(std::min<int64_t>(wait.count(), INT32_MAX)));
    const bool signalled = signals >= 0 && rc > 0 && fds->back().revents != 0;
    fds->pop_back();
    if (signalled) {
      signalfd_siginfo info;
      if (::read(signals, &info, sizeof info) == sizeof info) return Took(static_cast<int>(info.ssi_signo));
    }
    if (rc < 0 && errno != EINTR) return 0;
    if (rc > 0 && std::any_of(fds->begin(), fds->end(), [](const pollfd& p) { return p.revents != 0; })) return 0;
    if (Clock::now() >= deadline) return 0;
  }
}

int WaitSignal(Duration timeout) {
  sigset_t set = SupervisorSet();
  struct timespec ts;
  ts.tv_sec = timeout.count() / 1000;
  ts.tv_nsec = (timeout.count() % 1000) * 1000000;
  int sig = ::sigtimedwait(&set, nullptr, &ts);
  return sig < 0 ? 0 : Took(sig);
}

}  // namespace trainctl

namespace trainctl {

void KillChildren(Duration wait, const std::vector<pid_t>& spare) {
  std::vector<pid_t> children;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream in(task.path() / "children");
    for (pid_t pid; in >> pid;) {
      if (std::find(spare.begin(), spare.end(), pid) == spare.end()) children.push_back(pid);
    }
  }
  if (!spare.empty()) wait = Duration(0);
  const pid_t own_group = ::getpgrp();
  for (pid_t pid : children) {
    pid_t group = ::getpgid(pid);
    if (group > 0 && group != own_group) ::kill(-group, SIGKILL);
    ::kill(pid, SIGKILL);
  }
  const auto deadline = Clock::now() + wait;
  for (size_t reaped = 0; reaped < children.size() && Clock::now() < deadline;) {
    int status;
    pid_t r = ::waitpid(-1, &status, WNOHANG);
    if (r < 0) break;  // ECHILD: none left
    if (r == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    } else {
      ++reaped;
    }
  }
}

}  // namespace trainctl
