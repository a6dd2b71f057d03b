// The runs of this user on this machine, for `trainctl ps/status/logs/stop` from any terminal:
// an index of small JSON files (one per run) under the user's state directory, the lock that
// keeps two live runs out of one output directory, and the moving aside of a previous run's
// files when a rerun starts fresh.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace trainctl::runs {

// $TRAINCTL_STATE_DIR, else $XDG_STATE_HOME/trainctl, else ~/.local/state/trainctl; runs/ in it.
std::string IndexDir();

struct RunEntry {
  std::string name, run_id, output_dir, host, target;
  std::string slurm_job_id;  // a run that a Slurm batch job launched: its job id (scancel stops it)
  std::string cgroup;        // the job's own cgroup (common/cgroup.h), "" when it has none
  int nodes = 0, procs_per_node = 0, tasks = 0;
  int64_t pid = 0;          // the launcher
  int64_t start_ticks = 0;  // its start time (/proc/PID/stat field 22): a reused pid is not it
  int64_t started = 0;      // unix seconds
  std::string ToJson() const;
  static Result<RunEntry> FromJson(const std::string& json);
};

// Whether the index can be trusted: a directory of the caller's own (or root's) that no other user
// can write; kPermissionDenied says how to fix it. A missing index is fine (no runs yet). List
// skips an untrusted index, and every entry that is not a regular file of the caller's own.
Status CheckIndex();

// Writes the entry into the index (atomically), pruning the oldest past `keep` entries.
Status Register(const RunEntry& entry, size_t keep = 500);
// Every run in the index, newest first; unreadable entries are skipped.
std::vector<RunEntry> List();
// The run that `job` names: a run id, or a job name (its newest run). kNotFound lists the names.
Result<RunEntry> Find(const std::string& job);

// /proc/PID/stat's start time of `pid`; 0 when there is no such process (or only its zombie).
int64_t StartTicks(int64_t pid);
// Whether the entry's launcher is still running (same pid, same start time). A launcher on
// another host (a Slurm batch host sharing this home directory) is taken at its status.json's word.
bool Alive(const RunEntry& entry);

// An exclusive lock on <output_dir>/.trainctl.lock for the run's lifetime. kInvalidArgument
// names the live run that holds it.
class OutputLock {
 public:
  static Result<std::unique_ptr<OutputLock>> Acquire(const std::string& output_dir, const std::string& run_id);
  ~OutputLock();
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;

 private:
  explicit OutputLock(int fd) : fd_(fd) {}
  int fd_;
};

// When run `run_id` began (unix seconds), from the status.json its launcher keeps in
// `output_dir`; 0 when that file names another run or cannot be read (a cluster engine's job).
int64_t RunStarted(const std::string& output_dir, const std::string& run_id);

// Whether `dir` holds a checkpoint (a .safetensors file).
bool HasCheckpoint(const std::string& dir);

// A previous run's files in `output_dir` (logs, job.json, status.json, metrics, the model, the
// TensorBoard files) and its checkpoints, moved into <output_dir>/previous/<its run id>/ so that a
// new run starts fresh and nothing is lost. Returns that directory, or "" when there was no
// previous run. Only the names trainctl writes are moved.
Result<std::string> MovePreviousRunAside(const std::string& output_dir, const std::string& checkpoint_dir);

}  // namespace trainctl::runs
