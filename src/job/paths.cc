#include "job/paths.h"

#include <unistd.h>

namespace trainctl::paths {

std::string LogsDir(const std::string& output_dir) { return output_dir + "/logs"; }
std::string TaskLog(const std::string& output_dir, const std::string& role, int index) {
  return LogsDir(output_dir) + "/" + role + "-" + std::to_string(index) + ".log";
}
std::string ErrorFile(const std::string& output_dir, const std::string& role, int index, int round, int task_restarts) {
  return LogsDir(output_dir) + "/errors/" + role + "-" + std::to_string(index) + ".r" + std::to_string(round) + ".t" +
         std::to_string(task_restarts) + ".json";
}
std::string JobJson(const std::string& output_dir) { return output_dir + "/job.json"; }
std::string StatusJson(const std::string& output_dir) { return output_dir + "/status.json"; }
std::string MetricsJsonl(const std::string& output_dir) { return output_dir + "/metrics.jsonl"; }
std::string Timeline(const std::string& output_dir) { return output_dir + "/timeline.json"; }
std::string TensorBoardDir(const std::string& output_dir) { return output_dir + "/tensorboard"; }
std::string Model(const std::string& output_dir) { return output_dir + "/model.safetensors"; }
std::string SnapshotRoot() { return "/dev/shm/trainctl-snapshots-" + std::to_string(::geteuid()); }
std::string SnapshotDir(const std::string& run_id) { return SnapshotRoot() + "/" + run_id; }

}  // namespace trainctl::paths
