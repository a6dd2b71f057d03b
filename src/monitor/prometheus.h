// The runs on this machine in Prometheus' text exposition format (version 0.0.4), for the
// dashboard's /metrics. Names follow Prometheus' conventions: the trainctl_ prefix, base units
// (seconds), _total for counters; every series carries the job and run_id labels.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "job/runs.h"
#include "monitor/view.h"

namespace trainctl::monitor {

// Incremental reader of runs' metrics.jsonl files: each scrape parses only what was appended.
// Thread-safe.
class MetricsExporter {
 public:
  // The exposition text for `runs`: every family's HELP and TYPE, and each run's series.
  std::string Render(const std::vector<runs::RunEntry>& runs);

 private:
  struct Figures {
    double steps = 0, samples = 0, loss = -1, accuracy = -1, comm = 0, data = 0, restart = 0;
    std::vector<double> buckets;  // step-duration histogram: counts per upper bound
    double count = 0, sum = 0;
  };
  struct Totals : Figures {
    JsonLinesFollower file;
  };
  void Update(Totals* t, const std::string& path);

  std::mutex mu_;
  std::map<std::string, Totals> totals_;  // by run id
};

// An HTTP server of /metrics alone, for the agents in pods (`trainctl agent --metrics-port`):
// every request needs `Authorization: Bearer TOKEN` (the job's token; Prometheus reads it from
// the job's Secret). `render` gives the body of each scrape; it runs on the server's threads.
class MetricsServer {
 public:
  // Binds host:port (port 0: any free one) and serves until destroyed; kUnavailable when it cannot.
  static Result<std::unique_ptr<MetricsServer>> Start(const std::string& host, int port, const std::string& token,
                                                      std::function<std::string()> render);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;
  int port() const;

 private:
  struct Impl;
  explicit MetricsServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Prometheus label value escaping: backslash, double quote and newline.
std::string EscapeLabel(const std::string& value);

}  // namespace trainctl::monitor
