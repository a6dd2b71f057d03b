// The job's store keys: every key that the launcher, the agents, the rendezvous and the workers
// share, relative to the run's prefix (RunPrefix). One place, so two modules never spell a key
// two ways.
#pragma once

#include <string>

namespace trainctl::keys {

// "/trainctl/<run_id>/": the run's own key space on a shared store (etcd) or the embedded one.
std::string RunPrefix(const std::string& run_id);

inline constexpr const char* kSpec = "spec";                                // the resolved spec (JSON)
inline constexpr const char* kStop = "stop";                                // a StopRecord: the job is stopping
inline constexpr const char* kLastFailure = "last_failure";                 // the FailureRecord that ended it
inline constexpr const char* kRestarts = "restarts";                        // worker-group restarts so far
inline constexpr const char* kTaskRestarts = "task_restarts";               // single-task restarts so far
inline constexpr const char* kIgnoredFailures = "ignored_failures";         // counter: failures of roles
inline constexpr const char* kLastIgnoredFailure = "last_ignored_failure";  // with on_failure: ignore
inline constexpr const char* kAgentsStarted = "agents/started";             // counters: a store-serving
inline constexpr const char* kAgentsExited = "agents/exited";               // node 0 waits for the others
inline constexpr const char* kCurrentRound = "round/current";               // newest closed round

// Round r's keys.
std::string RoundState(int round);             // the rendezvous state once closed (rendezvous/)
std::string RoundJoined(int round);            // counter: joins so far (a joiner's slot is its count - 1)
std::string RoundMember(int round, int slot);  // who took the slot: {"id", "hint", "restarts"}
std::string RoundHint(int round, int hint);    // the node id holding a rank hint
std::string RoundRank(int round, int slot);    // "<rank> <world size> <restarts>" of the slot's node, once closed
// "<world size> <restarts>", set once the round is closed: members wait on it (a slot the round
// closed without) and read their rank key instead; its value is for people reading the store.
std::string RoundClosed(int round);
std::string RoundEnd(int round);  // the FailureRecord that ended it (compare-and-set)
// The failure with the earliest error-file timestamp of the round's tasks, those stopped after
// the first exit included (each agent compare-and-sets the earlier one in).
std::string RoundRootCause(int round);
std::string RoundSucceeded(int round);  // counter: tasks that decide success and exited 0
std::string RoundMaster(int round);     // MASTER_ADDR:MASTER_PORT
std::string RoundWaiting(int round);    // counter: nodes waiting to join (scale-up)
std::string RoundHeartbeat(int round, int node);
std::string RoundTaskAddrs(int round, int node);  // JSON list of host:port, one per local task
// The built-in trainer's collectives of round r live under this prefix.
std::string CommPrefix(int round);

}  // namespace trainctl::keys
