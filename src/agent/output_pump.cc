#include "agent/output_pump.h"

#include <ctime>

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/strings.h"

namespace trainctl {
namespace {

constexpr size_t kMaxLine = 64 * 1024;  // longer lines are cut into pieces
constexpr size_t kAtomicWrite = 4096;   // PIPE_BUF: writes up to this never interleave

// Returns 0, or the errno of a failed write (stdout gone, a full disk): the pipes are drained all
// the same, so that workers never block.
int WriteFully(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return 0;
}

}  // namespace

OutputPump::OutputPump(int out_fd, bool color) : out_fd_(out_fd), color_(color) {
  if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) wake_[0] = wake_[1] = -1;
}

OutputPump::~OutputPump() {
  Stop();
  if (wake_[0] >= 0) ::close(wake_[0]);
  if (wake_[1] >= 0) ::close(wake_[1]);
}

void OutputPump::Add(int id, const std::string& label, int read_fd, int log_fd, int times_fd) {
  static const char* kColors[] = {"\033[36m", "\033[32m", "\033[33m", "\033[35m",
                                  "\033[34m", "\033[96m", "\033[92m", "\033[93m"};
  Stream s;
  s.fd = read_fd;
  s.log_fd = log_fd;
  s.times_fd = times_fd;
  std::string tag = "[" + label + "] ";
  s.prefix = color_ ? std::string(kColors[id % 8]) + tag + "\033[0m" : tag;
  {
    std::lock_guard<std::mutex> lock(mu_);
    current_[id] = next_key_;
    streams_[next_key_++] = std::move(s);
  }
  if (started_) {  // the loop polls a fixed set of fds: wake it to add this one
    char b = 'a';
    ssize_t ignored = ::write(wake_[1], &b, 1);
    (void)ignored;
  }
}

void OutputPump::Start() {
  started_ = true;
  thread_ = std::thread([this] { Loop(); });
}

std::string OutputPump::Consume(Stream& s, const char* data, size_t n, bool flush_partial) {
  std::string out;
  s.partial.append(data, n);
  size_t start = 0;
  while (true) {
    size_t nl = color_ ? s.partial.find_first_of("\r\n", start) : s.partial.find('\n', start);
    if (nl != std::string::npos && s.partial[nl] == '\r') {
      if (nl + 1 < s.partial.size() && s.partial[nl + 1] == '\n') {
        ++nl;  // "\r\n": an ordinary line end
      } else if (nl + 1 == s.partial.size() && !flush_partial) {
        break;  // the '\n' of a "\r\n" may come with the next read
      } else {
        out += "\r\033[K" + s.prefix + SafeForTerminal(std::string_view(s.partial).substr(start, nl - start), true);
        status_shown_ = true;
        start = nl + 1;
        continue;
      }
    }
    bool cut = nl == std::string::npos && s.partial.size() - start >= kMaxLine;
    if (nl == std::string::npos && !cut && !(flush_partial && start < s.partial.size())) break;
    size_t end = nl != std::string::npos ? nl : (cut ? start + kMaxLine : s.partial.size());
    std::string line = s.partial.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();  // a "\r\n" line end
    start = nl != std::string::npos ? nl + 1 : end;
    if (s.log_fd >= 0 && s.times_fd >= 0) {
      // A time mark at most once a second: what follows the offset was written at or after it.
      const int64_t now = static_cast<int64_t>(std::time(nullptr));
      if (now != s.last_mark) {
        const off_t at = ::lseek(s.log_fd, 0, SEEK_END);
        const std::string mark = std::to_string(at) + " " + std::to_string(now) + "\n";
        if (at >= 0) WriteFully(s.times_fd, mark.data(), mark.size());
        s.last_mark = now;
      }
    }
    if (s.log_fd >= 0) {
      std::string raw = line + "\n";
      if (int err = WriteFully(s.log_fd, raw.data(), raw.size()); err != 0 && !s.log_failed) {
        // Said once, where it is seen: the log file lacks what follows (a full disk, say).
        s.log_failed = true;
        out += s.prefix + "trainctl: its log file is incomplete from here on: " + std::strerror(err) + "\n";
      }
    }
    // On a terminal, shown as text: a worker's escape sequences do not drive it (colours pass).
    std::string shown = (status_shown_ ? "\r\033[K" : "") + s.prefix + (color_ ? SafeForTerminal(line, true) : line) + "\n";
    status_shown_ = false;
    if (!out.empty() && out.size() + shown.size() > kAtomicWrite) {
      WriteOut(out);
      out.clear();
    }
    out += shown;
    s.tail.push_back(SafeForTerminal(line, false));  // for failure reports: plain text
    if (s.tail.size() > kTailLines) s.tail.pop_front();
  }
  s.partial.erase(0, start);
  return out;
}

void OutputPump::WriteOut(const std::string& text) { WriteFully(out_fd_, text.data(), text.size()); }

void OutputPump::Loop() {
  char buf[65536];
  std::vector<struct pollfd> fds;
  std::vector<int> ranks;
  bool stopping = false;
  while (true) {
    fds.clear();
    ranks.clear();
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [rank, s] : streams_) {
        if (s.eof) continue;
        fds.push_back({s.fd, POLLIN, 0});
        ranks.push_back(rank);
      }
    }
    if (fds.empty() && stopping) return;
    fds.push_back({wake_[0], POLLIN, 0});  // a stop, or a stream added (a restarted task)
    // When stopping, take only what is already there.
    int rc = ::poll(fds.data(), fds.size(), stopping ? 0 : -1);
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0 && stopping) return;
    if (fds.back().revents) {
      char drain[64];
      for (ssize_t n; (n = ::read(wake_[0], drain, sizeof drain)) > 0;) {
        for (ssize_t i = 0; i < n; ++i) stopping = stopping || drain[i] == 's';
      }
    }
    for (size_t i = 0; i + 1 < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      std::string out;
      {
        std::lock_guard<std::mutex> lock(mu_);
        Stream& s = streams_[ranks[i]];
        out = Consume(s, buf, n > 0 ? static_cast<size_t>(n) : 0, n <= 0);
        if (n <= 0) s.eof = true;
      }
      if (!out.empty()) WriteOut(out);
      if (n <= 0) drained_.notify_all();
    }
  }
}

void OutputPump::WaitDrained(int id, Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  drained_.wait_for(lock, timeout, [&] {
    auto key = current_.find(id);
    auto it = key == current_.end() ? streams_.end() : streams_.find(key->second);
    return it == streams_.end() || it->second.eof || stopped_;
  });
}

std::vector<std::string> OutputPump::Tail(int id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto key = current_.find(id);
  auto it = key == current_.end() ? streams_.end() : streams_.find(key->second);
  if (it == streams_.end()) return {};
  return {it->second.tail.begin(), it->second.tail.end()};
}

void OutputPump::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  if (started_) {
    char b = 's';
    ssize_t ignored = ::write(wake_[1], &b, 1);
    (void)ignored;
    thread_.join();
  }
  drained_.notify_all();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [rank, s] : streams_) {
    if (!s.partial.empty() && !s.eof) {
      std::string out = Consume(s, "", 0, true);
      WriteOut(out);
    }
    if (s.fd >= 0) ::close(s.fd);
    if (s.log_fd >= 0) ::close(s.log_fd);
    if (s.times_fd >= 0) ::close(s.times_fd);
    s.fd = s.log_fd = s.times_fd = -1;
  }
}

}  // namespace trainctl
