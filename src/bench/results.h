// What `trainctl bench` records of its experiments: figures read from each experiment's own
// records (metrics.jsonl, status.json), aggregates over repeats (MLPerf's way with five or more:
// drop the fastest and the slowest, mean and standard deviation of the rest), scaling efficiency,
// results.json (written and read back here) and `bench compare`. The files made for people
// (results.csv, summary.md, report.html) are bench/report.h's.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/matrix.h"

namespace trainctl::bench {

struct Figures {
  std::string id, system, state = "pending";  // pending | running | succeeded | failed | interrupted
  Point point;
  int repeat = 0;
  int workers = 1;
  int exit_code = -1;
  std::string failure;           // the run's failure report (status.json), or why it could not start
  double started = 0;            // unix seconds
  double wall_seconds = -1;      // start to exit, as bench saw it
  double epoch_seconds = -1;     // median over the epochs
  double samples_per_s = -1;     // median over the epochs
  double test_accuracy = -1;     // the last
  double time_to_accuracy = -1;  // from start to the first test accuracy >= the target
  double peak_rss_mb = -1;
  double comm_wait_seconds = -1;  // summed over the epochs
  int restarts = 0;
  std::vector<std::pair<double, double>> loss;  // (step, loss), at most 200 points

  nlohmann::json ToJson() const;
  // What ToJson wrote; a field of another type (a hand-edited or foreign results.json) is an
  // error that names it. Fields that are missing take their defaults.
  static Result<Figures> FromJson(const nlohmann::json& j);
};

// Reads an experiment's figures from its output directory (metrics.jsonl, status.json); `f`
// carries what bench itself knows (id, point, start, exit).
void ReadFigures(const std::string& output_dir, double target_accuracy, Figures* f);

struct Aggregate {
  std::string key, system;  // key: the system and the point
  Point point;
  int workers = 1, runs = 0, succeeded = 0;
  bool mlperf = false;                  // >= 5 runs: fastest and slowest dropped
  double wall_mean = -1, wall_std = 0;  // start to exit, as bench saw it
  double epoch_mean = -1, epoch_std = 0, rate_mean = -1, rate_std = 0, tta_mean = -1, tta_std = 0;
  double accuracy_mean = -1, rss_max = -1, comm_mean = -1;
  double efficiency = -1;  // per-worker throughput against the fewest-workers point of its group
  int missed = 0;          // runs that did not reach the target accuracy (failed ones included)
};

// Means over the runs that succeeded, but for the time to `target_accuracy` (when > 0): as MLPerf
// scores it, over every run, one that missed the target (or failed) counting as the slowest; no
// figure when one such run is among those that count.
std::vector<Aggregate> Aggregates(const std::vector<Figures>& experiments, double target_accuracy = 0);

// results.json in `dir` (atomically): every experiment's figures and every aggregate's.
Status WriteResultsJson(const std::string& dir, const Matrix& m, const std::vector<Figures>& experiments,
                        const std::vector<Aggregate>& aggregates);

// The experiments of a result set's results.json.
Result<std::vector<Figures>> ReadResults(const std::string& dir);

// A figure as `printf` format `f` writes it; "" for none (negative).
std::string FormatFigure(double v, const char* f = "%.3f");
// A point's fields and values ("batch_size=64, nodes=2"); "(the spec)" for none.
std::string PointText(const Point& p);
// The system and the point's fields other than those that set the workers: the group whose
// fewest-workers configuration scaling efficiency is measured against.
std::string GroupOf(const std::string& system, const Point& p);

// `bench compare`: B against A, point by point; regressions are throughput down or epoch time up
// by more than `threshold` (0.05: 5 %). Returns the table; `regressions` counts them.
std::string Compare(const std::vector<Figures>& a, const std::vector<Figures>& b, double threshold, int* regressions);

}  // namespace trainctl::bench
