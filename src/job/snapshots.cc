#include "job/snapshots.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "common/fs.h"
#include "job/paths.h"

namespace trainctl {
namespace {

constexpr auto kStaleAge = std::chrono::seconds(60);  // a lockless directory younger is starting

int OpenLock(const std::string& dir, bool create) {
  return ::open((dir + "/.lock").c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | (create ? O_CREAT : 0), 0600);
}

// Removes the directories of runs whose agents are all gone (nobody holds their lock).
void RemoveStale(const std::string& root, const std::string& keep) {
  std::error_code ec;
  const auto now = std::filesystem::file_time_type::clock::now();
  for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
    const std::string dir = entry.path().string();
    if (entry.path().filename() == keep || !entry.is_directory(ec) || entry.is_symlink(ec)) continue;
    auto mtime = std::filesystem::last_write_time(entry.path(), ec);
    if (ec || now - mtime < kStaleAge) continue;
    int fd = OpenLock(dir, false);
    bool held = fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) != 0;
    if (fd >= 0) ::close(fd);
    if (!held) RemoveAll(dir);
  }
}

}  // namespace

Result<std::unique_ptr<SnapshotHold>> SnapshotHold::Acquire(const std::string& run_id) {
  const std::string root = paths::SnapshotRoot(), dir = paths::SnapshotDir(run_id);
  RETURN_IF_ERROR(PrivateDir(root));
  RemoveStale(root, run_id);
  RETURN_IF_ERROR(PrivateDir(dir));
  int fd = OpenLock(dir, true);
  if (fd < 0) return ErrnoStatus("cannot open " + dir + "/.lock", errno);
  if (::flock(fd, LOCK_SH) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoStatus("cannot lock " + dir + "/.lock", err);
  }
  return std::unique_ptr<SnapshotHold>(new SnapshotHold(dir, fd));
}

SnapshotHold::~SnapshotHold() {
  // The last holder gets the lock to itself: then no agent of the run is left on this host.
  if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) RemoveAll(dir_);
  ::close(fd_);
}

Result<std::string> SnapshotDirOf(const std::string& run_id) {
  const std::string root = paths::SnapshotRoot(), dir = paths::SnapshotDir(run_id);
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return NotFound(dir + " does not exist (its agent could not make it)");
  RETURN_IF_ERROR(PrivateDir(root));
  RETURN_IF_ERROR(PrivateDir(dir));
  return dir;
}

}  // namespace trainctl
