// A run's status.json: what its launcher (or, under `trainctl torchrun`, a host's agent) says
// about the run while it runs and once it has ended. One type for every writer (the launcher, the
// torchrun host) and every reader (ps/status, the dashboard and /metrics, bench, the run index).
// docs/cli.md (run: "At the end <output_dir>/status.json holds ...") describes it for scripts.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"
#include "job/records.h"

namespace trainctl {

// How a run stands. status.json holds the first seven by name (RunStateName); the last three are
// what a reader concludes and never written: no status.json of the run yet while its launcher
// lives (starting), a launcher gone without writing the end (lost), nothing readable (unknown).
enum class RunState {
  kUnknown,
  kRunning,
  kSucceeded,
  kFailed,
  kRendezvousTimeout,
  kInterrupted,
  kTimedOut,
  kError,
  kStarting,
  kLost,
};
// "running", "succeeded", "failed", "rendezvous-timeout", "interrupted", "timed-out", "error",
// "starting", "lost", "unknown".
const char* RunStateName(RunState state);
// The state of that name; kUnknown for any other (a file another version wrote, or edited).
RunState ParseRunState(std::string_view name);
// Whether the job failed: failed, lost, timed out or an error (not interrupted: a person stopped
// it; not a rendezvous timeout: it never started).
bool JobFailed(RunState state);

struct RunStatus {
  std::string job;
  std::string run_id;
  RunState state = RunState::kUnknown;  // kUnknown when the file is missing or unreadable
  // While it runs: the process that writes the end, and when it started (unix seconds).
  int64_t pid = 0;
  int64_t started = 0;
  // Once it has ended.
  std::optional<int> exit_code;
  std::optional<int> restarts;          // the job's restarts (rounds that ended in a failure)
  std::string elapsed;                  // "1m30s"
  std::optional<int> task_restarts;     // single-task restarts (restart.policy: task)
  std::optional<int> ignored_failures;  // failures the job went on without (on_failure: ignore)
  std::optional<FailureRecord> last_ignored_failure;
  std::optional<FailureRecord> failure;     // the round that ended the job
  std::optional<FailureRecord> root_cause;  // the first failure, when it was not `failure`
  std::string store_error;                  // the job's store was lost: why

  bool known() const { return !run_id.empty(); }
  // How a run ended with trainctl exit `code`: its state (StateOfExit) and code.
  static RunStatus Ended(std::string job, std::string run_id, int code, std::string elapsed);

  // Absent fields are left out.
  nlohmann::json ToJson() const;
  // From a file a user may have edited or another version written: a field of another type is
  // as if missing, and a failure record is read field by field (what is there is kept).
  static RunStatus FromJson(const nlohmann::json& j);
};

// The state status.json records for a run that ended with trainctl exit `code`.
RunState StateOfExit(int code);

// <output_dir>/status.json; an empty RunStatus when it is missing or not JSON.
RunStatus ReadRunStatus(const std::string& output_dir);
// Writes it atomically. When that fails (a full disk), writes the shortest form (job, run id,
// state, exit code) over the old file in place, whose blocks exist already, so that a finished run
// is not taken for a lost one; the error says which happened.
Status WriteRunStatus(const std::string& output_dir, const RunStatus& status);

}  // namespace trainctl
