// FailureRecord: why a round ended, written to the store (compare-and-set, first one wins) by the
// agent that saw it, so every agent restarts for the same reason and the launcher can print the
// root cause. Membership changes (a node waiting to join) end a round too, without spending the
// job's restart budget.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace trainctl {

struct FailureRecord {
  // "worker" (a worker exited non-zero), "start" (could not start one), "node_lost" (an agent
  // stopped heartbeating), "membership" (nodes are waiting to join; not a failure)
  std::string kind;
  int round = 0;
  int restarts = 0;        // the job's restarts once this round has ended
  bool failure() const { return kind != "membership"; }
  int node_rank = 0;
  std::string host;
  int rank = -1;           // global rank of the failed worker
  int local_rank = -1;
  int pid = 0;
  std::string exit;        // "exit code 1", "signal 9 (SIGKILL)"; or the start error
  std::string log_path;
  std::vector<std::string> last_lines;

  std::string ToJson() const;
  static Result<FailureRecord> FromJson(const std::string& json);
  // "worker rank 2 (node 0 on host, local rank 2, pid 41) failed: exit code 1"
  std::string Summary() const;
  // Summary plus the log path and the last lines, indented, for the final report.
  std::string Report() const;
};

}  // namespace trainctl
