// The files of a `trainctl bench` result set made for people, beside results.json
// (bench/results.h): results.csv, summary.md and a self-contained report.html (its tables and
// inline SVG charts, no network needed to open it).
#pragma once

#include <string>
#include <vector>

#include "bench/matrix.h"
#include "bench/results.h"
#include "common/status.h"

namespace trainctl::bench {

// Writes results.json, results.csv, summary.md and report.html into `dir` (each atomically).
Status WriteResults(const std::string& dir, const Matrix& m, const std::vector<Figures>& experiments);

}  // namespace trainctl::bench
