// OutputPump: copies task output to this process's stdout, each line prefixed with its task
// ("[worker-3] loss 0.42", "[ps-0] ...", as kubetail shows pods), and unprefixed to a per-task log
// file; keeps the last lines of each task for failure reports. No thread of its own: the agent's
// one thread copies the output while it waits (WaitSignal), since a second thread cost each agent
// of a 1024-node job about 2.5 ms of CPU, a ninth of its cost, on a 2-core VM (a process on two
// CPUs: a thread stack, a malloc arena, TLB shootdowns; issue 64).
// What stdout cannot take at once waits here (up to 1 MiB, then the tasks' pipes fill and their
// writers block), so a stalled terminal or a paused pager stalls the output and never the agent.
//
// On a terminal (`color`), a line a worker ends with '\r' instead of '\n' is a status line (a
// progress bar redrawn in place): it is shown over the previous status line and the next line
// clears it; it goes to neither the log file nor the tail. Elsewhere '\r' is ordinary text.
#pragma once

#include <deque>
#include <map>
#include <string>
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
  // prefix ("worker-3"). `times_path`, if not empty, is where the log's time marks go (opened at
  // the first line: a task that writes nothing costs no second file). Adding `id` again (a restarted task) makes the
  // new stream the one WaitDrained and Tail look at, while the old one drains.
  void Add(int id, const std::string& label, int read_fd, int log_fd, const std::string& times_path = "");
  // Copies output until one of the supervisor's signals comes (returned, as trainctl::WaitSignal
  // returns it) or `timeout` passes (0).
  int WaitSignal(Duration timeout);
  // Copies output until `id`'s pipe reached end of file (every writer is gone) or `timeout`
  // passed; takes no signal.
  void WaitDrained(int id, Duration timeout);
  std::vector<std::string> Tail(int id);
  // Copies what is already readable and writes out everything; closes all fds. Idempotent.
  void Stop();

 private:
  struct Stream {
    int fd = -1;
    int log_fd = -1;
    std::string times_path;  // <log>.times: "OFFSET UNIX_SECONDS" lines, for `logs --since`
    int times_fd = -1;       // open once there is a line to mark
    int64_t last_mark = -1;  // unix seconds of the last line written there
    std::string prefix;
    std::string partial;
    std::deque<std::string> tail;
    bool eof = false;
    bool log_failed = false;  // a write to log_fd failed (said once)
  };
  // One wait of at most `timeout` for output, room on stdout or (when `signals`) a signal, and
  // what it allows: copies each readable stream, writes a queued piece. The signal, or 0.
  int Turn(Duration timeout, bool signals);
  // Task `id`'s newest stream; nullptr if it has none.
  Stream* Current(int id);
  void Read(Stream& s);
  // Handles freshly read bytes, queueing the prefixed text for out_fd_.
  void Consume(Stream& s, const char* data, size_t n, bool flush_partial);
  void Queue(std::string text);

  int out_fd_;
  bool color_;
  bool status_shown_ = false;      // a status line is on the terminal now
  std::map<int, Stream> streams_;  // by a key of their own: a restarted task gets a new one
  std::map<int, int> current_;     // task id -> its newest stream's key
  int next_key_ = 0;
  // Prefixed text for out_fd_, in pieces of at most PIPE_BUF (whole lines where they fit), which
  // a pipe takes whole: the lines of the job's agents never interleave on the launcher's stdout.
  std::deque<std::string> out_;
  size_t out_bytes_ = 0;
  bool stopped_ = false;
};

}  // namespace trainctl
