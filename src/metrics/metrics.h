// Metric sinks for training: JSON lines (metrics.jsonl, one object per line, for scripts) and
// TensorBoard event files (events.out.tfevents.*, so `tensorboard --logdir <output_dir>` shows
// the curves), plus the terminal progress line. No torch here.
//
// Not thread safe: the trainer's main thread writes. Every line and every event is flushed as it
// is written, so a reader (or a crash) never sees half a record beyond the last one.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace trainctl::metrics {

// CRC-32C (Castagnoli), as TFRecord files use; and TFRecord's masked form of it.
uint32_t Crc32c(const void* data, size_t size);
uint32_t MaskedCrc32c(const void* data, size_t size);

// Appends TensorBoard scalar events to <dir>/events.out.tfevents.<time>.<host>.
class EventWriter {
 public:
  ~EventWriter();
  static Result<EventWriter*> Open(const std::string& dir);  // caller owns the result
  Status AddScalar(const std::string& tag, double value, int64_t step, double wall_time);
  const std::string& path() const { return path_; }

 private:
  EventWriter(std::FILE* f, std::string path) : file_(f), path_(std::move(path)) {}
  Status WriteRecord(const std::string& payload);
  std::FILE* file_;
  std::string path_;
};

// Appends one JSON object per line to a file.
class JsonLines {
 public:
  ~JsonLines();
  static Result<JsonLines*> Open(const std::string& path);  // caller owns the result
  // Numbers first, then strings (JSON-escaped here), each in the order given. Non-finite
  // numbers are written as null.
  Status Write(const std::vector<std::pair<std::string, double>>& numbers,
               const std::vector<std::pair<std::string, std::string>>& strings = {});

 private:
  explicit JsonLines(std::FILE* f) : file_(f) {}
  std::FILE* file_;
};

// "epoch 2/5 [#########.........] 45% 1234/2740 loss 0.3121 1520 samples/s ETA 12s (job 1m02s)":
// the ETA of this epoch (what the bar shows), then the job's (eta_seconds) when epochs remain.
std::string ProgressLine(int64_t epoch, int64_t epochs, int64_t step_in_epoch, int64_t steps_per_epoch, double loss,
                         double samples_per_s, double eta_seconds, int bar_width = 20);

}  // namespace trainctl::metrics
