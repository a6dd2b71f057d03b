#include "agent/output_pump.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "common/strings.h"
#include "common/subprocess.h"

namespace trainctl {
namespace {

constexpr size_t kMaxLine = 64 * 1024;  // longer lines are cut into pieces
constexpr size_t kAtomicWrite = 4096;   // PIPE_BUF: writes up to this never interleave
constexpr size_t kMaxQueued = 1 << 20;  // for stdout, before the tasks' pipes are left to fill

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

OutputPump::OutputPump(int out_fd, bool color) : out_fd_(out_fd), color_(color) {}

OutputPump::~OutputPump() { Stop(); }

void OutputPump::Add(int id, const std::string& label, int read_fd, int log_fd, const std::string& times_path) {
  static const char* kColors[] = {"\033[36m", "\033[32m", "\033[33m", "\033[35m",
                                  "\033[34m", "\033[96m", "\033[92m", "\033[93m"};
  Stream s;
  s.fd = read_fd;
  s.log_fd = log_fd;
  s.times_path = times_path;
  std::string tag = "[" + label + "] ";
  s.prefix = color_ ? std::string(kColors[id % 8]) + tag + "\033[0m" : tag;
  current_[id] = next_key_;
  streams_[next_key_++] = std::move(s);
}

void OutputPump::Consume(Stream& s, const char* data, size_t n, bool flush_partial) {
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
    if (s.log_fd >= 0 && s.times_fd < 0 && !s.times_path.empty()) {
      // Best effort: without it only `logs --since` reads the whole log.
      s.times_fd = ::open(s.times_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (s.times_fd < 0) s.times_path.clear();
    }
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
    std::string shown =
        (status_shown_ ? "\r\033[K" : "") + s.prefix + (color_ ? SafeForTerminal(line, true) : line) + "\n";
    status_shown_ = false;
    if (!out.empty() && out.size() + shown.size() > kAtomicWrite) Queue(std::move(out));
    out += shown;
    s.tail.push_back(SafeForTerminal(line, false));  // for failure reports: plain text
    if (s.tail.size() > kTailLines) s.tail.pop_front();
  }
  s.partial.erase(0, start);
  Queue(std::move(out));
}

void OutputPump::Queue(std::string text) {
  if (text.empty()) return;
  out_bytes_ += text.size();
  out_.push_back(std::move(text));
}

void OutputPump::Read(Stream& s) {
  char buf[65536];
  const ssize_t n = ::read(s.fd, buf, sizeof buf);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  Consume(s, buf, n > 0 ? static_cast<size_t>(n) : 0, n <= 0);
  if (n <= 0) s.eof = true;
}

int OutputPump::Turn(Duration timeout, bool signals) {
  std::vector<pollfd> fds;
  std::vector<Stream*> polled;
  if (out_bytes_ < kMaxQueued) {  // else the writers wait, their pipes full, until stdout drains
    for (auto& [key, s] : streams_) {
      if (s.eof || s.fd < 0) continue;
      fds.push_back({s.fd, POLLIN, 0});
      polled.push_back(&s);
    }
  }
  const bool writing = !out_.empty();
  if (writing) fds.push_back({out_fd_, POLLOUT, 0});
  int sig = 0;
  if (signals) {
    sig = trainctl::WaitSignalOrReady(timeout, &fds);
  } else if (::poll(fds.data(), fds.size(), static_cast<int>(timeout.count())) <= 0) {
    return 0;
  }
  for (size_t i = 0; i < polled.size(); ++i) {
    if (fds[i].revents) Read(*polled[i]);
  }
  if (writing && fds.back().revents) {
    // One piece: a pipe with room for PIPE_BUF bytes takes it without blocking.
    std::string& piece = out_.front();
    const ssize_t w = ::write(out_fd_, piece.data(), piece.size());
    if (w > 0 || (w < 0 && errno != EINTR && errno != EAGAIN)) {  // a closed stdout: dropped
      const size_t done = w > 0 ? static_cast<size_t>(w) : piece.size();
      out_bytes_ -= done;
      if (done < piece.size()) {
        piece.erase(0, done);
      } else {
        out_.pop_front();
      }
    }
  }
  return sig;
}

int OutputPump::WaitSignal(Duration timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    if (int sig = Turn(Remaining(deadline), true)) return sig;
    if (Clock::now() >= deadline) return 0;
  }
}

OutputPump::Stream* OutputPump::Current(int id) {
  auto key = current_.find(id);
  auto it = key == current_.end() ? streams_.end() : streams_.find(key->second);
  return it == streams_.end() ? nullptr : &it->second;
}

void OutputPump::WaitDrained(int id, Duration timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    const Stream* s = Current(id);  // looked up again each turn: a turn may end streams
    if (!s || s->eof || stopped_ || Clock::now() >= deadline) return;
    Turn(Remaining(deadline), false);
  }
}

std::vector<std::string> OutputPump::Tail(int id) {
  const Stream* s = Current(id);
  if (!s) return {};
  return {s->tail.begin(), s->tail.end()};
}

void OutputPump::Stop() {
  if (stopped_) return;
  stopped_ = true;
  for (auto& [key, s] : streams_) {
    // What is there already, without waiting for writers that are still alive.
    for (int i = 0; i < 64 && !s.eof && s.fd >= 0; ++i) {
      pollfd p{s.fd, POLLIN, 0};
      if (::poll(&p, 1, 0) <= 0) break;
      Read(s);
    }
    if (!s.partial.empty() && !s.eof) Consume(s, "", 0, true);
    if (s.fd >= 0) ::close(s.fd);
    if (s.log_fd >= 0) ::close(s.log_fd);
    if (s.times_fd >= 0) ::close(s.times_fd);
    s.fd = s.log_fd = s.times_fd = -1;
  }
  for (const auto& piece : out_) WriteFully(out_fd_, piece.data(), piece.size());
  out_.clear();
  out_bytes_ = 0;
}

}  // namespace trainctl
