#include "common/cgroup.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "common/fs.h"
#include "common/strings.h"

namespace trainctl {

namespace {

// The cgroup2 mount point, from /proc/self/mountinfo ("" when there is none).
std::string Cgroup2Mount() {
  auto info = ReadFile("/proc/self/mountinfo", 1 << 20);
  if (!info.ok()) return "";
  for (const auto& line : SplitLines(*info)) {
    const size_t dash = line.find(" - ");
    if (dash == std::string::npos || line.compare(dash + 3, 8, "cgroup2 ") != 0) continue;
    const auto fields = Split(line.substr(0, dash), ' ');
    if (fields.size() > 4) return fields[4];
  }
  return "";
}

// This process's cgroup2 path ("0::/path" in /proc/self/cgroup).
std::string OwnCgroup() {
  auto text = ReadFile("/proc/self/cgroup", 1 << 16);
  if (!text.ok()) return "";
  for (const auto& line : SplitLines(*text)) {
    if (line.rfind("0::", 0) == 0) return line.substr(3);
  }
  return "";
}

// A control file takes one write (no temporary file, no truncation).
bool WriteControl(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  return ok;
}

// Only a directory named as trainctl names them, on the cgroup2 mount, is ever killed.
bool IsJobCgroup(const std::string& dir) {
  const std::string mount = Cgroup2Mount();
  return !mount.empty() && dir.rfind(mount + "/", 0) == 0 && dir.find("/../") == std::string::npos &&
         std::filesystem::path(dir).filename().string().rfind("trainctl-", 0) == 0 && IsDirectory(dir) &&
         Exists(dir + "/cgroup.procs");
}

}  // namespace

std::string MakeJobCgroup(const std::string& run_id) {
  const std::string mount = Cgroup2Mount(), own = OwnCgroup();
  if (mount.empty() || own.empty() || own.find("..") != std::string::npos) return "";
  const std::string parent = mount + (own == "/" ? "" : own), dir = parent + "/trainctl-" + run_id;
  // Jobs whose launcher was killed and whose processes are all gone leave an empty cgroup: those
  // a minute old (a live job's agents are in its own within a second) are removed.
  std::error_code ec;
  const auto stale = std::filesystem::file_time_type::clock::now() - std::chrono::minutes(1);
  for (const auto& e : std::filesystem::directory_iterator(parent, ec)) {
    if (e.path().filename().string().rfind("trainctl-", 0) != 0 || !e.is_directory(ec)) continue;
    if (e.last_write_time(ec) < stale && !CgroupPopulated(e.path().string())) ::rmdir(e.path().c_str());
  }
  if (::mkdir(dir.c_str(), 0755) != 0) return "";
  // Moving a process in needs write access to cgroup.procs here (and of the common ancestor).
  if (::access((dir + "/cgroup.procs").c_str(), W_OK) != 0) {
    ::rmdir(dir.c_str());
    return "";
  }
  return dir;
}

Status EnterCgroup(const std::string& dir) {
  if (!IsJobCgroup(dir)) return InvalidArgument(dir + " is not a job's cgroup");
  return WriteControl(dir + "/cgroup.procs", "0\n") ? Status::Ok() : Internal("cannot move into " + dir);
}

Status LeaveCgroup(const std::string& dir) {
  if (!IsJobCgroup(dir)) return InvalidArgument(dir + " is not a job's cgroup");
  const std::string parent = std::filesystem::path(dir).parent_path().string();
  return WriteControl(parent + "/cgroup.procs", "0\n") ? Status::Ok() : Internal("cannot move out of " + dir);
}

bool CgroupPopulated(const std::string& dir) {
  if (!IsJobCgroup(dir)) return false;
  auto events = ReadFile(dir + "/cgroup.events", 4096);
  if (events.ok()) return events->find("populated 1") != std::string::npos;
  auto procs = ReadFile(dir + "/cgroup.procs", 1 << 20);
  return procs.ok() && !procs->empty();
}

int KillJobCgroup(const std::string& dir) {
  if (!IsJobCgroup(dir)) return -1;
  auto procs = ReadFile(dir + "/cgroup.procs", 1 << 20);
  const int held = procs.ok() ? static_cast<int>(SplitLines(*procs).size()) : 0;
  if (held > 0 && !WriteControl(dir + "/cgroup.kill", "1\n")) {
    for (const auto& pid : SplitLines(procs.ok() ? *procs : "")) ::kill(std::atoi(pid.c_str()), SIGKILL);
  }
  // The kill is asynchronous: the cgroup empties as its processes exit, and rmdir says EBUSY
  // until it has (and for a moment after, while the last ones are torn down). A loaded machine
  // takes a while; the first empty moment is taken.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (true) {
    if (!CgroupPopulated(dir) && (::rmdir(dir.c_str()) == 0 || errno != EBUSY)) break;
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return held;
}

}  // namespace trainctl
