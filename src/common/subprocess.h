// Processes: spawn with a clean signal state in a new process group, describe how they ended,
// stop them with SIGTERM, a grace period and SIGKILL.
//
// Callers that supervise children block SIGCHLD (and SIGINT/SIGTERM) in every thread and wait
// for them with sigtimedwait; Spawn() restores default dispositions and an empty signal mask in
// the child before exec, so the child starts as if from a shell.
#pragma once

#include <poll.h>
#include <sys/types.h>

#include <csignal>
#include <optional>
#include <string>
#include <vector>

#include "common/duration.h"
#include "common/status.h"

namespace trainctl {

struct SpawnOptions {
  std::vector<std::string> argv;  // argv[0] is looked up in PATH when it has no '/'
  std::vector<std::string> env;   // the whole environment, "KEY=VALUE"
  std::string cwd;                // empty: the caller's
  int output_fd = -1;             // if >= 0: becomes the child's stdout and stderr
  int stdin_fd = -1;              // if >= 0: becomes stdin; else /dev/null
  int stderr_fd = -1;             // if >= 0: becomes stderr (after output_fd)
  int pass_fd = -1;               // if >= 0: stays open in the child, under its number
  std::vector<int> cpus;          // if not empty: the only CPUs the child may run on
  bool new_process_group = true;  // the child leads its own group (so stops reach its tree)
  // PR_SET_PDEATHSIG: SIGTERM when the parent dies. The kernel ties this to the *thread* that
  // called Spawn(): spawn from a thread that lives as long as the child (the supervisor's).
  bool die_with_parent = true;
};

// Starts a child. Fails (with the reason, e.g. "cannot run python4: No such file or directory")
// when exec fails, so a bad command never looks like a worker crash.
Result<pid_t> Spawn(const SpawnOptions& options);

// How a process ended, from a waitpid status.
struct ExitInfo {
  bool signaled = false;
  int code = 0;    // exit code when !signaled
  int signal = 0;  // signal number when signaled
  bool success() const { return !signaled && code == 0; }
  // "exit code 1", "signal 9 (SIGKILL)"
  std::string Describe() const;
  static ExitInfo FromWaitStatus(int status);
};

// Kills every child this process still has, with its process group, and reaps them (waiting up
// to `wait`): for a subreaper (PR_SET_CHILD_SUBREAPER), also the orphans it adopted. The children
// in `spare` live on; with any, nothing is reaped (waiting would collect their exits too).
void KillChildren(Duration wait, const std::vector<pid_t>& spare = {});

// The environment of this process, as "KEY=VALUE" strings.
std::vector<std::string> CurrentEnvironment();
// The value of KEY in an environment list, if it is there.
std::optional<std::string> GetEnv(const std::vector<std::string>& env, const std::string& key);
// Sets KEY in an environment list, replacing an existing entry.
void SetEnv(std::vector<std::string>* env, const std::string& key, const std::string& value);

// Searches PATH (from `env`, falling back to this process's) for an executable; a name with a '/'
// is checked as is. Returns the resolved path.
Result<std::string> FindExecutable(const std::string& name, const std::vector<std::string>& env);

// The absolute path of this process's executable (/proc/self/exe), or "trainctl" if unknown.
// If the executable was replaced since this process started, the path of its replacement.
std::string SelfExe();

// Runs a command to completion, collecting stdout+stderr; kills it (whole group) after `timeout`.
struct CommandResult {
  ExitInfo exit;
  std::string output;
  bool timed_out = false;
};
Result<CommandResult> RunCommand(const SpawnOptions& options, Duration timeout);

}  // namespace trainctl

namespace trainctl {

// A supervisor's "look again now" (the launcher's to its agents once it has asked the job to
// stop): wakes WaitSignal() and stops nothing. Ignored by default, so one that comes before a
// process blocks it is lost, not fatal.
inline constexpr int kNudgeSignal = SIGURG;

// Blocks SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT and kNudgeSignal in the calling thread (call before
// starting any thread, so all inherit it) and ignores SIGPIPE. Supervisors then take these signals
// with WaitSignal() instead of handlers, and sleep until one comes rather than polling.
void BlockSupervisorSignals();
// Waits up to `timeout` for one of the blocked signals; returns it, or 0 on timeout. A stop signal
// (SIGINT, SIGTERM, SIGHUP, SIGQUIT) is also remembered for StopSignal(), so that code waiting only for
// children (a stop in progress) never swallows a request to stop.
int WaitSignal(Duration timeout);
// WaitSignal(), that also returns (0) as soon as one of `fds` is ready as its events ask
// (revents set): one thread that supervises children and copies their output, where a thread for
// the output cost each agent of a 1024-node job a ninth of its CPU on a 2-core VM.
int WaitSignalOrReady(Duration timeout, std::vector<struct pollfd>* fds);
// An fd that is readable while a stop signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT) is pending, never read
// (StopSignal() takes the signal): what a blocking wait elsewhere polls beside its own fd, so that
// a stop ends it (TcpStoreOptions::interrupt_fd). -1 if the system has no signal fds.
int StopSignalFd();
// SIGINT, SIGTERM, SIGHUP or SIGQUIT (torchrun's four): what WaitSignal() returned asks the process to stop.
bool IsStopSignal(int sig);
// The first stop signal WaitSignal() took, or one pending now (taken by this call), or 0.
int StopSignal();

// Whether process `pid` is gone or on its way out: no such process, its main thread a zombie or
// exiting, or a SIGKILL pending (the whole process killed). A child whose parent's spawning
// thread died (PR_SET_PDEATHSIG fired) may still see getppid() name the parent while its other
// threads are being torn down; this tells that moment from a parent that lives.
bool ProcessEnding(pid_t pid);

}  // namespace trainctl
