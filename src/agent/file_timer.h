// torch's file-based expiration timers, served as torchrun's agent serves them when a job sets
// TORCHELASTIC_ENABLE_FILE_TIMER=1: the workers' TORCHELASTIC_TIMER_FILE names a FIFO to which
// torch.distributed.elastic.timer.FileTimerClient writes one JSON line per acquire or release
// ({"version": 1, "pid", "scope_id", "expiration_time": unix seconds (negative: release),
// "signal"}). A worker whose timer expires gets its signal. Unlike torch's server, only the
// agent's own workers are ever signalled, whatever pid a line names. Not thread-safe: the agent's
// supervising loop polls it.
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace trainctl {

class FileTimerServer {
 public:
  // Makes the FIFO (mode 0600) at `path`, or in a private temporary directory when `path` is "".
  static Result<std::unique_ptr<FileTimerServer>> Start(const std::string& path);
  ~FileTimerServer();  // closes and removes the FIFO (and its directory, if it made one)
  FileTimerServer(const FileTimerServer&) = delete;
  FileTimerServer& operator=(const FileTimerServer&) = delete;

  const std::string& path() const { return path_; }

  struct Expired {
    pid_t pid;
    std::string scope;
    int signal;
    size_t worker;  // the index in `workers` of the worker it is, or whose process group it is in
  };
  // Takes the requests written since the last call; signals each pid that is one of `workers` or in
  // one's process group whose timer has expired (with the signal of its earliest expired timer
  // that has one) and forgets its timers.
  std::vector<Expired> Poll(const std::vector<pid_t>& workers);

 private:
  FileTimerServer(std::string path, std::string dir, int read_fd, int write_fd)
      : path_(std::move(path)), dir_(std::move(dir)), read_fd_(read_fd), write_fd_(write_fd) {}
  struct Timer {
    double expires;
    int signal;
  };
  std::string path_, dir_;
  int read_fd_, write_fd_;  // the writer end keeps reads from ending while no worker has it open
  std::string partial_;
  std::map<std::pair<pid_t, std::string>, Timer> timers_;
};

}  // namespace trainctl
