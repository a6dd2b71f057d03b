// The agents of a local run, for LocalLauncher: started (copies of one fork server here, or one
// srun or mpirun that starts them all), supervised, replaced when a fixed-size job's agent dies of
// a signal, stopped. Apart from the launcher so that tests can drive it with agents of their own
// (LaunchOptions::self_exe).
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "common/duration.h"
#include "common/exit_codes.h"
#include "common/subprocess.h"
#include "jobspec/job_spec.h"
#include "launch/launcher.h"
#include "rendezvous/round_end.h"
#include "store/store.h"

namespace trainctl {

class MpirunStderr;

struct AgentProc {
  std::string name;  // "the agent for node N", or "mpirun"/"srun" for all of them
  pid_t pid = -1;
  bool done = false;
  int node = -1;  // a local job's agent: its node rank
};

// A local job's agent that died of a signal, while the launcher sees to its round.
struct LostAgent : LostNode {
  int node;  // its node rank
};

// The agents of a run: starts them, forwards stop signals, enforces timeouts.job, replaces a fixed
// job's agent that died of a signal (ending its round, as its peers would), and waits for all of
// them. The outcome is `code` and `stop_reason`.
class AgentSupervisor {
 public:
  // `env`: the agents' environment (the store's address and token among it).
  AgentSupervisor(const JobSpec& spec, const LaunchOptions& options, const std::string& run_id, Store& store,
                  std::vector<std::string> env, Clock::time_point start);

  ~AgentSupervisor();

  // Starts every agent (stops early on a stop signal, or when one cannot start).
  void StartAgents();
  // Until every agent has exited: their exits, stop signals, timeouts.job.
  void Supervise();
  // What mpirun's processes still write (they are gone or killed by now).
  void Finish();
  int code = kExitOk;
  std::string stop_reason;

 private:
  void BeginStop(const std::string& reason, int code);
  void OnExit(AgentProc& a, const ExitInfo& exit);
  // A fixed-size job's agent that died of a signal (the OOM killer, a kill) is started again, as
  // Kubernetes replaces a pod: its round is ended at once, which spends a restart, and the new
  // agent joins the next round with the node's rank. At most max_restarts times in all, so an
  // agent that dies before it ever joins a round cannot go round for ever.
  void Replace(const AgentProc& a, const ExitInfo& exit);
  LostAgent Lost(const AgentProc& a, const ExitInfo& exit);
  LostRound SeeTo(const LostAgent& l);

  const JobSpec& spec_;
  const LaunchOptions& options_;
  const std::string& run_id_;
  Store& store_;
  const std::vector<std::string> env_;
  const Clock::time_point start_;
  const bool one_;      // one srun or mpirun starts every agent
  const bool elastic_;  // an elastic job goes on without a lost node
  std::vector<AgentProc> agents_;
  std::unique_ptr<MpirunStderr> mpirun_stderr_;
  bool stopping_ = false;
  Clock::time_point kill_at_;
  bool any_succeeded_ = false;
  int lost_code_ = kExitOk;
  std::vector<LostAgent> lost_;  // lost agents whose round is not settled yet
  int replaced_ = 0;
};

// How long agents get to stop their workers before the launcher kills them.
Duration AgentGrace(const JobSpec& spec);

}  // namespace trainctl
