// OutputPump: copies task output to this process's stdout, each line prefixed with its task
// ("[worker-3] loss 0.42", "[ps-0] ...", as kubetail shows pods), and unprefixed to a per-task log
// file; keeps the last lines of each task for failure reports. One thread for all of an agent's
// tasks.
//
// On a terminal (`color`), a line a worker ends with '\r' instead of '\n' is a status line (a
// progress bar redrawn in place): it is shown over the previous status line and the next line
// clears it; it goes to neither the log file nor the tail. Elsewhere '\r' is ordinary text.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/duration.h"

namespace trainctl {

class OutputPump {
 public:
  static constexpr size_t kTailLines = 20;

  // `out_fd` is where prefixed lines go (stdout); `color` colours the prefixes.
  OutputPump(int out_fd, bool color);
  ~OutputPump();  // Stop()

  // Takes ownership of `read_fd` (a pipe read end) and `log_fd` (may be -1); `label` is the
  // prefix ("worker-3"). Before or after Start(); adding `id` again (a restarted task) makes the
  // new stream the one WaitDrained and Tail look at, while the old one drains.
  void Add(int id, const std::string& label, int read_fd, int log_fd, int times_fd = -1);
  void Start();
  // Waits until `id`'s pipe reached end of file (every writer is gone) or `timeout` passed.
  void WaitDrained(int id, Duration timeout);
  std::vector<std::string> Tail(int id);
  // Stops the thread after copying what is already readable; closes all fds. Idempotent.
  void Stop();

 private:
  struct Stream {
    int fd = -1;
    int log_fd = -1;
    int times_fd = -1;          // <log>.times: "OFFSET UNIX_SECONDS" lines, for `logs --since`
    int64_t last_mark = -1;     // unix seconds of the last line written there
    std::string prefix;
    std::string partial;
    std::deque<std::string> tail;
    bool eof = false;
    bool log_failed = false;    // a write to log_fd failed (said once)
  };
  void Loop();
  // Handles freshly read bytes; returns the prefixed text to write to out_fd_.
  std::string Consume(Stream& s, const char* data, size_t n, bool flush_partial);
  void WriteOut(const std::string& text);

  int out_fd_;
  bool color_;
  bool status_shown_ = false;  // a status line is on the terminal now (pump thread only)
  int wake_[2] = {-1, -1};
  std::mutex mu_;
  std::condition_variable drained_;
  std::map<int, Stream> streams_;  // by a key of their own: a restarted task gets a new one
  std::map<int, int> current_;     // task id -> its newest stream's key
  int next_key_ = 0;
  std::thread thread_;
  bool started_ = false;
  bool stopped_ = false;
};

}  // namespace trainctl
