// What trainctl shows about the runs on this machine (`ps`, `status`, `logs`, `top`, the
// dashboard and its /metrics): read from the run index (job/runs.h), each run's output directory
// and /proc. Nothing here writes; every function is safe to call from several threads.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/duration.h"
#include "job/run_status.h"
#include "job/runs.h"

namespace trainctl::monitor {

// A JSON file, or null when it is missing or not JSON.
nlohmann::json ReadJson(const std::string& path);

// A run's state: its status.json, corrected for a launcher that is gone without writing the end.
// `dir` holds the run's files: its output_dir, or previous/<run id>/ there once a later run has
// moved them aside.
struct RunView {
  runs::RunEntry entry;
  RunStatus status;
  RunState state = RunState::kUnknown;  // status.state, or starting, lost, unknown
  bool alive = false;
  std::string dir;
};
RunView View(const runs::RunEntry& e);

std::string Elapsed(const RunView& v);                // "14s", or status.json's elapsed
std::string Progress(const std::string& output_dir);  // "epoch 3 step 1200 loss 0.4120 acc 0.9100" or "-"
std::string Tasks(const runs::RunEntry& e);           // "2x2", or "7 tasks" for a job with roles
// "step 350: 106.1 steps/s, ...; a step: 1 % data, 97 % compute, 2 % communication ..." or "".
std::string StepSplit(const std::string& output_dir);

// Follows a JSON-lines file as it grows (a run's metrics.jsonl): each Read parses only the whole
// lines appended since the last one. On the first Read, and when the file is another path than
// the one followed or shorter than what was read (a later run moved or replaced it), Read calls
// `start_over` first (the caller drops what it gathered) and reads from the beginning. One follower per file; the
// caller locks when several threads share it.
class JsonLinesFollower {
 public:
  void Read(const std::string& path, const std::function<void()>& start_over,
            const std::function<void(const nlohmann::json&)>& each);
  int64_t offset() const { return offset_; }  // bytes read so far: 0 until a whole line was

 private:
  std::string path_;
  int64_t offset_ = 0;
};

// The log files under `dir` (<role>-<index>.log) in rank order, optionally only one role or rank;
// `spec` is the run's job.json (ranks of a job with roles follow its roles).
std::vector<std::string> LogFiles(const std::string& dir, const std::string& role, int rank,
                                  const nlohmann::json& spec);

// Each task of the run whose launcher is `launcher_pid`, measured over `interval` (which this
// call sleeps): CPU as % of one core, resident memory and threads, its child processes included.
struct TaskStats {
  int rank = -1;
  std::string label;  // worker-0, ps-1
  int64_t pid = 0;
  double cpu_percent = 0;
  double rss_mib = 0;
  int threads = 0;
};
std::vector<TaskStats> SampleTasks(int64_t launcher_pid, Duration interval);

}  // namespace trainctl::monitor
