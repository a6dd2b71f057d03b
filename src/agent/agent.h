// Agent: supervises one node's workers for a job. It joins a rendezvous round, starts its
// workers with the torchrun-compatible environment, streams their output, and watches both its
// workers and the job's shared state on the store:
//
//   INIT -> RENDEZVOUS -> HEALTHY -> SUCCEEDED            (every node's workers exited 0)
//                           |-> FAILED -> (restart budget left) -> RENDEZVOUS of the next round
//                           |-> FAILED -> (budget spent) -> exit kExitWorkerFailed
//                           |-> STOPPED (signal or job stop) -> exit with the stop's code
//
// A failure anywhere ends the round for every node: the first agent to see it records it with
// compare-and-set under round/<r>/end, and all agents stop their workers and join round r+1.
// Failures are a worker exiting non-zero and a node lost (the agent watching it in a ring saw no
// heartbeat for timeouts.heartbeat). Elastic jobs (nodes.min < nodes.max) go on with the nodes
// that join the next round. A node arriving while a round runs waits (round/<r>/waiting); group
// rank 0 then ends the round to admit it, as a membership change that spends no restart.
// The restart budget is the job's: the count travels in the round's state and end record, so a
// node that leaves and rejoins cannot reset it.
#pragma once

#include <string>

#include "agent/failure.h"
#include "rendezvous/rendezvous.h"
#include "spec/job_spec.h"
#include "store/store.h"

namespace trainctl {

struct AgentOptions {
  JobSpec spec;                 // output and checkpoint dirs already absolute
  int node_rank = -1;           // -1: assigned by arrival order
  std::string run_id;
  std::string host = "127.0.0.1";  // this node's address for peers (MASTER_ADDR when rank 0)
  std::string store_addr;       // host:port, handed to workers
  std::string store_token;      // handed to workers
  std::string store_prefix;     // handed to workers
  bool color_output = false;
  Duration poll_interval = std::chrono::milliseconds(50);
};

class Agent {
 public:
  // `store` is the job's store, already prefixed with the run's key space; not owned.
  Agent(AgentOptions options, Store* store);
  // Runs until the job ends; returns a trainctl exit code. Expects BlockSupervisorSignals().
  int Run();

 private:
  struct Outcome;
  Outcome RunRound(int round, int restarts);
  Outcome WaitOutRound(int round, const RoundInfo& full);
  Outcome Stopped(const Status& why);
  Result<FailureRecord> EndRound(int round, const FailureRecord& rec, bool* won);
  std::vector<std::string> WorkerEnv(int local_rank, int group_rank, int group_world_size,
                                     const std::string& master, int restart) const;
  Status CheckStop();
  FailureRecord NewFailure(const std::string& kind, int round, int group_rank) const;

  AgentOptions o_;
  Store* store_;
  std::string node_id_;
};

// Store keys shared by the agent and the launcher (relative to the run's prefix).
namespace keys {
inline constexpr const char* kSpec = "spec";
inline constexpr const char* kStop = "stop";                  // {"reason": ..., "code": N}
inline constexpr const char* kLastFailure = "last_failure";   // FailureRecord JSON
inline constexpr const char* kRestarts = "restarts";          // restarts so far
inline constexpr const char* kAgentsStarted = "agents/started";  // counters: a store-serving
inline constexpr const char* kAgentsExited = "agents/exited";    // node 0 waits for the others
std::string RoundEnd(int round);
std::string RoundSucceeded(int round);
std::string RoundMaster(int round);
std::string RoundWaiting(int round);                 // nodes waiting to join (scale-up)
std::string RoundHeartbeat(int round, int node);
}  // namespace keys

// Encodes/decodes the stop key's value.
std::string StopRecord(const std::string& reason, int code);
bool ParseStopRecord(const std::string& text, std::string* reason, int* code);

}  // namespace trainctl
