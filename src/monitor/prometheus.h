// The runs on this machine in Prometheus' text exposition format (version 0.0.4), for the
// dashboard's /metrics. Names follow Prometheus' conventions: the trainctl_ prefix, base units
// (seconds), _total for counters; every series carries the job and run_id labels.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "job/runs.h"

namespace trainctl::monitor {

// Incremental reader of runs' metrics.jsonl files: each scrape parses only what was appended.
// Thread-safe.
class MetricsExporter {
 public:
  // The exposition text for `runs`.
  std::string Render(const std::vector<runs::RunEntry>& runs);

 private:
  struct Totals {
    std::string path;
    long offset = 0;  // bytes of the file parsed so far
    double steps = 0, samples = 0, loss = -1, accuracy = -1, comm = 0, data = 0, restart = 0;
    std::vector<double> buckets;  // step-duration histogram: counts per upper bound
    double count = 0, sum = 0;
  };
  void Update(Totals* t, const std::string& path);

  std::mutex mu_;
  std::map<std::string, Totals> totals_;  // by run id
};

// Prometheus label value escaping: backslash, double quote and newline.
std::string EscapeLabel(const std::string& value);

}  // namespace trainctl::monitor
