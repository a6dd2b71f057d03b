// The built-in trainer's in-memory snapshots live in /dev/shm/trainctl-snapshots-<uid>/<run-id>/
// on each host (job/paths.h): inside a directory private to the user, so another local user can
// neither plant a snapshot there, nor read one, nor redirect the writes through a link (both
// directories are made with mode 0700, or checked to be this user's own and private; a link is
// never followed).
//
// Each agent holds its run's directory while the run lasts (a shared lock on its .lock file); the
// last to let go removes it. A directory that nobody holds is left from a run whose agents were
// killed: the next agent on the host removes it.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"

namespace trainctl {

class SnapshotHold {
 public:
  // Makes (or checks) the directories and takes the lock; removes what runs that are gone left.
  // kPermissionDenied when the location is not private to this user.
  static Result<std::unique_ptr<SnapshotHold>> Acquire(const std::string& run_id);
  ~SnapshotHold();  // removes the directory unless another agent of the run still holds it
  const std::string& dir() const { return dir_; }

 private:
  SnapshotHold(std::string dir, int fd) : dir_(std::move(dir)), fd_(fd) {}
  std::string dir_;
  int fd_;
};

// For a task: the run's directory if it is there and private to this user, else why not.
Result<std::string> SnapshotDirOf(const std::string& run_id);

}  // namespace trainctl
