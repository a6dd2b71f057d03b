// Where a run's files live: under the spec's output_dir, plus the in-memory snapshot on tmpfs.
// docs/job-spec.md describes the layout for users.
#pragma once

#include <string>

namespace trainctl::paths {

std::string LogsDir(const std::string& output_dir);  // <out>/logs
// <out>/logs/<role>-<index>.log: worker-0.log ... for a job without roles.
std::string TaskLog(const std::string& output_dir, const std::string& role, int index);
// <out>/logs/errors/<role>-<index>.r<round>.t<task restarts>.json: a task's TORCHELASTIC_ERROR_FILE,
// fresh for every attempt.
std::string ErrorFile(const std::string& output_dir, const std::string& role, int index, int round, int task_restarts);
std::string JobJson(const std::string& output_dir);     // the resolved spec the run used
std::string StatusJson(const std::string& output_dir);  // how the run ended
std::string MetricsJsonl(const std::string& output_dir);
std::string TensorBoardDir(const std::string& output_dir);
std::string Model(const std::string& output_dir);     // the exported model.safetensors
std::string Timeline(const std::string& output_dir);  // timeline.json (trainer.timeline_steps)
// Where the built-in trainer keeps the in-memory snapshots of this user's runs on this host (on
// tmpfs): a directory private to the user (job/snapshots.h), one directory per run in it.
std::string SnapshotRoot();
std::string SnapshotDir(const std::string& run_id);

}  // namespace trainctl::paths
