// The records agents and the launcher exchange through the store: why a round ended
// (FailureRecord, also for the round that ends the job by succeeding, compare-and-set under round/<r>/end, the first
// one wins, so every agent restarts for the same reason and the launcher can print the root cause), and why the job is
// stopping (StopRecord, under "stop"). Membership changes (a node waiting to join) end a round too, without spending
// the job's restart budget.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace trainctl {

enum class FailureKind {
  kTask,        // a task exited non-zero (or was killed)
  kStart,       // a task could not be started (a configuration error: no restart)
  kConfig,      // a built-in task said its configuration can never work (exit code 2): no restart
  kNodeLost,    // an agent stopped heartbeating
  kMembership,  // nodes are waiting to join: not a failure, spends no restart
  kSucceeded,   // every task that decides the job's success exited 0: the job is done
};
// "task", "start", "node_lost", "membership": the names in status.json.
const char* FailureKindName(FailureKind kind);

struct FailureRecord {
  FailureKind kind = FailureKind::kTask;
  int round = 0;
  int restarts = 0;    // the job's restarts once this round has ended
  bool final = false;  // the job ends with it, budget or not (task restarts spent)
  bool failure() const { return kind != FailureKind::kMembership && kind != FailureKind::kSucceeded; }
  int node_rank = 0;
  std::string host;
  int rank = -1;  // global rank of the failed task
  int local_rank = -1;
  std::string role;  // its role and index in the role ("worker", 3)
  int task_index = -1;
  int pid = 0;
  std::string exit;  // "exit code 1", "signal 9 (SIGKILL)"; or the start error
  std::string log_path;
  std::vector<std::string> last_lines;
  // From the task's error file (TORCHELASTIC_ERROR_FILE), when it wrote one.
  std::string error;  // "ValueError: bad input"
  std::string traceback;
  int64_t error_time = 0;     // unix seconds; 0: unknown
  int64_t error_time_ns = 0;  // the same, finer where the error file tells (TaskError::time_ns)
  int64_t exited_ns = 0;      // when its agent saw it exit (unix ns); 0: stopped, or not seen
  // Which of two failures came first: by error time, then by the exits the agents saw, then rank.
  bool Before(const FailureRecord& other) const;

  std::string ToJson() const;
  nlohmann::json ToJsonValue() const;
  // kInternal for text that is not a record (the store is the job's own, so that is a bug).
  static Result<FailureRecord> FromJson(const std::string& json);
  // A record as a file holds it (status.json, which a user may edit or another version wrote):
  // what is there, a missing or mistyped field left at its default, an unknown kind read as kTask.
  static FailureRecord FromJsonValue(const nlohmann::json& j);
  // "worker 2 (rank 2, node 0 on host, local rank 2, pid 41) failed: exit code 1"
  std::string Summary() const;
  // Summary plus the log path and the last lines, indented, for the final report.
  std::string Report() const;
};

struct StopRecord {
  std::string reason;  // "interrupted by SIGINT on host:41"
  int code = 0;        // the exit code the job ends with
  std::string ToJson() const;
  // nullopt-like: false when the text is not a stop record.
  static bool FromJson(const std::string& text, StopRecord* out);
};

}  // namespace trainctl
