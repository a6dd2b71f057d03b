#include "agent/file_timer.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>

namespace trainctl {

Result<std::unique_ptr<FileTimerServer>> FileTimerServer::Start(const std::string& given) {
  std::string path = given, dir;
  if (path.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/trainctl-timer-XXXXXX";
    if (::mkdtemp(templ.data()) == nullptr)
      return Internal("cannot make a directory for the file timer: " + std::string(std::strerror(errno)));
    dir = templ;
    path = dir + "/timer";
  }
  if (::mkfifo(path.c_str(), 0600) != 0) {
    const int err = errno;
    if (!dir.empty()) ::rmdir(dir.c_str());
    return InvalidArgument("TORCHELASTIC_TIMER_FILE " + path + ": cannot make a FIFO there: " + std::strerror(err));
  }
  const int r = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  const int w = r >= 0 ? ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC) : -1;
  if (r < 0 || w < 0) {
    const int err = errno;
    if (r >= 0) ::close(r);
    ::unlink(path.c_str());
    if (!dir.empty()) ::rmdir(dir.c_str());
    return Internal("cannot open the file timer's FIFO " + path + ": " + std::strerror(err));
  }
  return std::unique_ptr<FileTimerServer>(new FileTimerServer(path, dir, r, w));
}

FileTimerServer::~FileTimerServer() {
  ::close(read_fd_);
  ::close(write_fd_);
  ::unlink(path_.c_str());
  if (!dir_.empty()) ::rmdir(dir_.c_str());
}

std::vector<FileTimerServer::Expired> FileTimerServer::Poll(const std::vector<pid_t>& workers) {
  char buf[8192];
  for (ssize_t n; (n = ::read(read_fd_, buf, sizeof buf)) > 0;) {
    partial_.append(buf, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl; (nl = partial_.find('\n', start)) != std::string::npos; start = nl + 1) {
      // A request is at most PIPE_BUF bytes (torch's client refuses longer ones); anything else is dropped.
      auto j = nlohmann::json::parse(partial_.substr(start, nl - start), nullptr, false);
      if (!j.is_object() || !j.contains("pid") || !j["pid"].is_number_integer() || !j.contains("scope_id") ||
          !j["scope_id"].is_string() || !j.contains("expiration_time") || !j["expiration_time"].is_number()) {
        continue;
      }
      const auto key = std::make_pair(static_cast<pid_t>(j["pid"].get<int64_t>()), j["scope_id"].get<std::string>());
      const double expires = j["expiration_time"].get<double>();
      const int sig = j.contains("signal") && j["signal"].is_number_integer() ? j["signal"].get<int>() : 0;
      if (expires < 0) {
        timers_.erase(key);
      } else if (timers_.size() < 100000) {
        timers_[key] = {expires, sig};
      }
    }
    partial_.erase(0, start);
    if (partial_.size() > 65536) partial_.clear();
  }
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::map<pid_t, Expired> due;  // per pid: its earliest expired timer with a signal
  std::map<pid_t, double> earliest;
  for (const auto& [key, t] : timers_) {
    if (t.expires > now || t.signal <= 0 || t.signal >= 65) continue;
    auto it = earliest.find(key.first);
    if (it == earliest.end() || t.expires < it->second) {
      earliest[key.first] = t.expires;
      due[key.first] = {key.first, key.second, t.signal, 0};
    }
  }
  // The worker that is `pid`, or whose process group it is in (each worker leads one: `sh -c
  // "python3 ..."`): its index, or workers.size().
  auto worker_of = [&](pid_t pid) {
    const pid_t group = ::getpgid(pid);
    return static_cast<size_t>(
        std::find_if(workers.begin(), workers.end(), [&](pid_t w) { return w > 0 && (w == pid || w == group); }) -
        workers.begin());
  };
  auto ours = [&](pid_t pid) { return worker_of(pid) < workers.size(); };
  std::vector<Expired> out;
  for (auto [pid, e] : due) {
    e.worker = worker_of(pid);
    if (e.worker >= workers.size()) continue;  // not the agent's: never signalled
    ::kill(pid, e.signal);
    out.push_back(e);
    for (auto it = timers_.begin(); it != timers_.end();)
      it = it->first.first == pid ? timers_.erase(it) : std::next(it);
  }
  // Timers of pids that are none of ours (gone, or never ours) are dropped once expired.
  for (auto it = timers_.begin(); it != timers_.end();) {
    it = it->second.expires <= now && !ours(it->first.first) ? timers_.erase(it) : std::next(it);
  }
  return out;
}

}  // namespace trainctl
