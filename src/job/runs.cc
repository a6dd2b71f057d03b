#include "job/runs.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/address.h"
#include "common/fs.h"
#include "common/json_field.h"
#include "common/subprocess.h"
#include "job/paths.h"
#include "job/run_status.h"

namespace trainctl::runs {

namespace fs = std::filesystem;

std::string IndexDir() {
  const auto env = CurrentEnvironment();
  if (auto d = GetEnv(env, "TRAINCTL_STATE_DIR"); d && !d->empty()) return *d + "/runs";
  if (auto d = GetEnv(env, "XDG_STATE_HOME"); d && !d->empty()) return *d + "/trainctl/runs";
  std::string home = GetEnv(env, "HOME").value_or("");
  if (home.empty()) {  // the user's own home from the password database, never a shared /tmp
    if (const passwd* pw = ::getpwuid(::getuid()); pw != nullptr && pw->pw_dir != nullptr) home = pw->pw_dir;
  }
  return home.empty() ? std::string() : home + "/.local/state/trainctl/runs";
}

namespace {

// Whether a file or directory is the caller's own (or root's) and none but its owner can write it.
Status Trusted(const struct stat& st, const std::string& path, bool directory) {
  const uid_t me = ::geteuid();
  if (st.st_uid != me && st.st_uid != 0) {
    return PermissionDenied(path + " belongs to user " + std::to_string(st.st_uid) +
                            ", not to you; trainctl trusts only run files of yours");
  }
  if (directory && (st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return PermissionDenied("the run index " + path + " can be written by other users (mode " + mode +
                            "), who could plant runs in it for stop to signal; make it yours alone (chmod go-w " +
                            path + ") or set TRAINCTL_STATE_DIR to a directory of your own");
  }
  return Status::Ok();
}

// The index directory, checked: kNotFound when there is none yet.
Result<std::string> CheckedIndexDir() {
  const std::string dir = IndexDir();
  if (dir.empty()) return InvalidArgument("no state directory: set HOME or TRAINCTL_STATE_DIR");
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return NotFound(dir + ": no runs yet");
  if (!S_ISDIR(st.st_mode)) return PermissionDenied(dir + " is not a directory (a link?); trainctl will not use it");
  RETURN_IF_ERROR(Trusted(st, dir, true));
  return dir;
}

// One entry of the index, read without blocking (a FIFO), following no link, a regular file of
// the caller's own, at most 64 KiB.
Result<std::string> ReadEntry(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return NotFound(path + ": " + std::strerror(errno));
  struct stat st {};
  Status ok = ::fstat(fd, &st) != 0             ? Internal(path + ": " + std::strerror(errno))
              : !S_ISREG(st.st_mode)            ? PermissionDenied(path + ": not a regular file")
              : st.st_size > (int64_t{1} << 16) ? InvalidArgument(path + ": larger than a run entry")
                                                : Trusted(st, path, false);
  std::string text;
  if (ok.ok()) {
    text.resize(static_cast<size_t>(st.st_size));
    const ssize_t n = ::pread(fd, text.data(), text.size(), 0);
    if (n < 0) ok = Internal(path + ": " + std::strerror(errno));
    text.resize(n > 0 ? static_cast<size_t>(n) : 0);
  }
  ::close(fd);
  if (!ok.ok()) return ok;
  return text;
}

}  // namespace

Status CheckIndex() {
  auto dir = CheckedIndexDir();
  return dir.ok() || dir.status().code() == Code::kNotFound ? Status::Ok() : dir.status();
}

std::string RunEntry::ToJson() const {
  return nlohmann::json{{"name", name},
                        {"run_id", run_id},
                        {"output_dir", output_dir},
                        {"host", host},
                        {"target", target},
                        {"nodes", nodes},
                        {"procs_per_node", procs_per_node},
                        {"tasks", tasks},
                        {"pid", pid},
                        {"start_ticks", start_ticks},
                        {"started", started},
                        {"slurm_job_id", slurm_job_id},
                        {"cgroup", cgroup}}
      .dump();
}

Result<RunEntry> RunEntry::FromJson(const std::string& text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object()) return InvalidArgument("not a run entry");
  RunEntry e;
  try {
    e.name = j.at("name").get<std::string>();
    e.run_id = j.at("run_id").get<std::string>();
    e.output_dir = j.at("output_dir").get<std::string>();
    e.host = j.value("host", "");
    e.target = j.value("target", "local");
    e.nodes = j.value("nodes", 0);
    e.procs_per_node = j.value("procs_per_node", 0);
    e.tasks = j.value("tasks", 0);
    e.pid = j.value("pid", int64_t{0});
    e.start_ticks = j.value("start_ticks", int64_t{0});
    e.started = j.value("started", int64_t{0});
    e.slurm_job_id = j.value("slurm_job_id", "");
    e.cgroup = j.value("cgroup", "");
  } catch (const nlohmann::json::exception& ex) {
    return InvalidArgument(std::string("not a run entry: ") + ex.what());
  }
  return e;
}

std::vector<RunEntry> List() {
  std::vector<RunEntry> out;
  auto dir = CheckedIndexDir();
  if (!dir.ok()) return out;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(*dir, ec)) {
    if (f.path().extension() != ".json") continue;
    auto text = ReadEntry(f.path().string());
    if (!text.ok()) continue;
    if (auto e = RunEntry::FromJson(*text); e.ok()) out.push_back(*e);
  }
  std::sort(out.begin(), out.end(), [](const RunEntry& a, const RunEntry& b) {
    // Within a second, the launcher's start time since boot (clock ticks) orders them.
    return a.started != b.started ? a.started > b.started : a.start_ticks > b.start_ticks;
  });
  return out;
}

Status Register(const RunEntry& entry, size_t keep) {
  const std::string dir = IndexDir();
  if (dir.empty()) return InvalidArgument("no state directory: set HOME or TRAINCTL_STATE_DIR");
  const bool made = !Exists(dir);
  RETURN_IF_ERROR(MakeDirs(dir));
  if (made) ::chmod(dir.c_str(), 0700);  // the index is this user's alone, whatever the umask
  RETURN_IF_ERROR(CheckedIndexDir().status());
  RETURN_IF_ERROR(AtomicWriteFile(dir + "/" + entry.run_id + ".json", entry.ToJson() + "\n", 0600));
  // Counting the entries is enough until there are more than `keep`: reading and parsing them all
  // is for the pruning only.
  size_t count = 0;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir, ec)) count += f.path().extension() == ".json";
  if (count <= keep) return Status::Ok();
  auto all = List();
  for (size_t i = keep; i < all.size(); ++i) {
    if (!Alive(all[i])) ::unlink((dir + "/" + all[i].run_id + ".json").c_str());
  }
  return Status::Ok();
}

Result<RunEntry> Find(const std::string& job) {
  RETURN_IF_ERROR(CheckIndex());
  auto all = List();
  for (const auto& e : all) {
    if (e.run_id == job) return e;
  }
  for (const auto& e : all) {  // newest first: a name means its latest run
    if (e.name == job) return e;
  }
  std::vector<std::string> names;
  for (const auto& e : all) {
    if (std::find(names.begin(), names.end(), e.name) == names.end()) names.push_back(e.name);
  }
  std::string known;
  for (size_t i = 0; i < names.size() && i < 10; ++i) known += (i ? ", " : "") + names[i];
  return NotFound("no run of a job named or with run id '" + job + "' on this machine" +
                  (known.empty() ? " (no runs yet)" : "; jobs: " + known) + "; trainctl ps lists them");
}

int64_t StartTicks(int64_t pid) {
  if (pid <= 0) return 0;
  auto stat = ReadFile("/proc/" + std::to_string(pid) + "/stat", 1 << 14);
  if (!stat.ok()) return 0;
  // Field 2 (comm) may hold spaces and parentheses: count from the last ')'.
  const size_t close = stat->rfind(')');
  if (close == std::string::npos) return 0;
  const char* p = stat->c_str() + close + 1;
  if (p[0] == ' ' && (p[1] == 'Z' || p[1] == 'X')) return 0;  // exited, not yet reaped: gone
  for (int field = 2; field < 22 && *p; ++p) {                // the space before field N starts field N
    if (*p == ' ') ++field;
  }
  return std::strtoll(p, nullptr, 10);
}

bool Alive(const RunEntry& e) {
  if (!e.host.empty() && e.host != HostName()) {
    const RunStatus s = ReadRunStatus(e.output_dir);
    return s.run_id == e.run_id && s.state == RunState::kRunning;
  }
  return e.pid > 0 && e.start_ticks > 0 && StartTicks(e.pid) == e.start_ticks;
}

Result<std::unique_ptr<OutputLock>> OutputLock::Acquire(const std::string& output_dir, const std::string& run_id) {
  RETURN_IF_ERROR(MakeDirs(output_dir));
  const std::string path = output_dir + "/.trainctl.lock";
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return Internal("cannot open " + path + ": " + std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    std::string holder(256, '\0');
    ssize_t n = ::pread(fd, holder.data(), holder.size() - 1, 0);
    holder.resize(n > 0 ? n : 0);
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0')) holder.pop_back();
    ::close(fd);
    return InvalidArgument(output_dir + " is in use by the live run " + (holder.empty() ? "?" : holder) +
                           "; stop it (trainctl stop), wait for it, or give this run another output_dir");
  }
  const std::string me = run_id + " (pid " + std::to_string(::getpid()) + ")\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
    // The lock holds without its note; only the message to a second run is poorer.
  }
  return std::unique_ptr<OutputLock>(new OutputLock(fd));
}

OutputLock::~OutputLock() { ::close(fd_); }

int64_t RunStarted(const std::string& output_dir, const std::string& run_id) {
  const RunStatus s = ReadRunStatus(output_dir);
  return s.run_id == run_id ? s.started : 0;
}

bool HasCheckpoint(const std::string& dir) {
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir, ec)) {
    if (f.path().extension() == ".safetensors") return true;
  }
  return false;
}

Result<std::string> MovePreviousRunAside(const std::string& output_dir, const std::string& checkpoint_dir) {
  std::vector<std::string> names = {"logs",        "job.json",     "status.json", "metrics.jsonl", "model.safetensors",
                                    "tensorboard", "timeline.json"};
  const bool own_checkpoints = checkpoint_dir == output_dir + "/checkpoints";
  if (own_checkpoints) names.push_back("checkpoints");
  bool any = false;
  for (const auto& n : names) any = any || Exists(output_dir + "/" + n);
  std::error_code ec;
  const bool checkpoints = !own_checkpoints && HasCheckpoint(checkpoint_dir);
  if (!any && !checkpoints) return std::string();
  // Its run id, from its status.json; else when it was written.
  std::string id = ReadRunStatus(output_dir).run_id;
  if (id.empty() || id.find('/') != std::string::npos || id[0] == '.') {
    id = "run-" + std::to_string(static_cast<int64_t>(std::time(nullptr)));
  }
  std::string to = output_dir + "/previous/" + id;
  for (int n = 2; Exists(to); ++n) to = output_dir + "/previous/" + id + "." + std::to_string(n);
  RETURN_IF_ERROR(MakeDirs(to));
  for (const auto& n : names) {
    const std::string from = output_dir + "/" + n;
    if (!Exists(from) && !fs::is_symlink(from, ec)) continue;
    if (::rename(from.c_str(), (to + "/" + n).c_str()) != 0) {
      return Internal("cannot move " + from + " to " + to + ": " + std::strerror(errno));
    }
  }
  if (checkpoints) {
    RETURN_IF_ERROR(MakeDirs(to + "/checkpoints"));
    for (const auto& f : fs::directory_iterator(checkpoint_dir, ec)) {
      if (!f.is_regular_file()) continue;
      const std::string dest = to + "/checkpoints/" + f.path().filename().string();
      if (::rename(f.path().c_str(), dest.c_str()) != 0) {
        return Internal("cannot move " + f.path().string() + " to " + dest + ": " + std::strerror(errno) +
                        " (checkpoint_dir must be on the same filesystem as output_dir)");
      }
    }
  }
  return to;
}

}  // namespace trainctl::runs
