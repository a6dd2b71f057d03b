// A timeline of what the ranks of a job did in a range of training steps (trainer.timeline_steps),
// in the Chrome trace-event format that https://ui.perfetto.dev and chrome://tracing open, as
// Horovod's timeline: one row per rank, grouped by node, one span per phase of each step. It shows
// which rank the others waited for in which step, and in which phase it lost the time.
//
// Each rank records its own spans in memory (a few hundred bytes per step; nothing is written
// while it trains), turns them into a JSON array of trace events, and the trainer gathers the
// arrays into one file. Times are the system clock's, in microseconds: on one host every rank
// reads the same clock; across hosts they are as close as the hosts' clocks (NTP: about a
// millisecond). No torch here. Not thread safe: the training thread records.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace trainctl::metrics {

class Timeline {
 public:
  using Clock = std::chrono::system_clock;

  // Records steps first..last (numbered from 1, both included).
  Timeline(int64_t first, int64_t last) : first_(first), last_(last) {}

  int64_t first() const { return first_; }
  int64_t last() const { return last_; }
  bool Records(int64_t step) const { return step >= first_ && step <= last_; }
  bool empty() const { return spans_.empty(); }

  // A span of phase `name` (a string that outlives the timeline: a literal) in `step`, if the
  // timeline records that step; `items` >= 0: the batch's size, shown with it.
  void Add(const char* name, int64_t step, Clock::time_point start, Clock::time_point end, int64_t items = -1);

  // This rank's spans as a JSON array of trace events: complete events ("ph": "X") on thread
  // `rank` of process `node`, each with its step, and the names of both rows ("node N (host)",
  // "rank R", with `role` in brackets when given) so that a merged trace reads without a legend.
  std::string Events(int node, const std::string& host, int rank, const std::string& role = "") const;

  // The phases of one step, back to back: each End(name) closes the span that began where the
  // previous one ended (or at construction), and the destructor adds a "step" span around them,
  // with the step's items if Items() said. Costs a branch when the timeline is null or does not
  // record the step.
  class Step {
   public:
    Step(Timeline* t, int64_t step);
    ~Step();
    void End(const char* name);
    void Items(int64_t items) { items_ = items; }
    Step(const Step&) = delete;
    Step& operator=(const Step&) = delete;

   private:
    Timeline* t_;  // null: not recording this step
    int64_t step_, items_ = -1;
    Clock::time_point start_, last_;
  };

 private:
  struct Span {
    const char* name;
    int64_t step;
    int64_t start_us, duration_us;
    int64_t items;  // -1: not said
  };
  int64_t first_, last_;
  std::vector<Span> spans_;
};

// One Chrome trace from the ranks' event arrays (Timeline::Events, one per rank, in any order):
// {"traceEvents": [...], "displayTimeUnit": "ms"}. An array that is not valid JSON is an error
// that names its position in `ranks`.
Result<std::string> MergeTimelines(const std::vector<std::string>& ranks);

}  // namespace trainctl::metrics
