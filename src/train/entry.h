// Entry points of the torch plugin (trainctl-torch.so), called by the `train` and `eval` verbs.
// No torch in this header: the CLI includes it without LibTorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainctl {
struct JobSpec;
}

namespace trainctl::train {
struct LoadedSplit;
}

namespace trainctl::train {

// `trainctl train`: one worker of a job whose spec has a trainer section. Reads the torchrun
// environment and the spec from the job's store; returns the process exit code.
struct TrainOptions {
  std::string log_level = "info";
};
int RunTrainer(const TrainOptions& options);

// `trainctl eval`: evaluates a checkpoint or exported model on a test set and prints the report.
struct EvalOptions {
  std::string checkpoint;  // a .safetensors file, or a directory: its newest valid checkpoint
  // Instead: a checkpoint directory to watch, evaluating each new checkpoint as it appears, until
  // the run's final model exists in `metrics_dir` and has been evaluated (or SIGINT/SIGTERM).
  std::string watch;
  std::string metrics_dir;  // watch: test accuracy goes to its metrics.jsonl and tensorboard/eval
  // watch: a final model written before this (unix seconds) is an earlier run's and does not end
  // the watch; 0: before the watch began. The evaluator task passes its run's start.
  int64_t since = 0;
  std::string data_dir;         // "": the directory recorded in the checkpoint
  std::string torchscript;      // a TorchScript model's module: "" for the run's copy beside the checkpoint
  int64_t limit = 0;            // evaluate the first N test images (0: all)
  std::string format = "text";  // text | json
  int threads = 0;              // 0: all cores
  int64_t batch = 500;
};
int RunEval(const EvalOptions& options);

// `trainctl predict`: the model's top classes for each image.
struct PredictOptions {
  std::string checkpoint;           // a .safetensors file, or a directory: its newest valid checkpoint
  std::vector<std::string> images;  // PNG, PGM, PPM files, or idx3 image files (every image in them)
  std::string torchscript;          // as EvalOptions'
  int top = 3;
  std::string format = "text";  // text | json
  int threads = 0;
};
int RunPredict(const PredictOptions& options);

// A worker server's preload (agent/worker_forks.h): the splits that the job spec trains and tests
// on, kept in the process for the copies made after it, and one warm-up step of its model. The
// CLI decodes the spec and loads the splits (train/splits.h) while the plugin loads. Returns 0; a
// split that cannot be loaded is left for the workers to report.
struct PreloadOptions {
  const JobSpec* spec = nullptr;
  std::vector<LoadedSplit>* splits = nullptr;  // loaded in load_seconds
  double load_seconds = 0;
  std::string log_level = "info";  // debug: says what it loaded and how long the warm-up took
};
int RunPreload(const PreloadOptions& options);
// The spec a worker server's preload decoded, in that server and its copies (the tasks of the
// agent that started it, whose spec it is); null elsewhere. A copy's task uses it rather than
// fetching and decoding the spec again: one decode per node, not one per task.
const JobSpec* PreloadedSpec();

// `trainctl validate` of a spec whose model is a TorchScript module: loads it (checked as a run
// would, checkpoint/module_file.h) and runs a batch of two of the data's images through it.
// `summary` receives "N parameters; a batch of 2 of CxHxW gives [2, K]"; `error` why it cannot
// train (a pickle saved with torch.save, a state_dict, the wrong number of scores, the wrong
// channels, with the interpreter's reason). Returns 0, or 1 with `error` set.
struct CheckModuleOptions {
  std::string path;
  int channels = 1, rows = 28, cols = 28, classes = 10;
  std::string summary, error;
};
int RunCheckModule(CheckModuleOptions& options);

// The plugin's one exported symbol: verb is "train" (options: TrainOptions), "eval"
// (EvalOptions), "predict" (PredictOptions), "preload" (PreloadOptions) or "check-module"
// (CheckModuleOptions, written to).
// Built from the same sources as the binary, so C++ types cross safely.
using PluginEntry = int (*)(const char* verb, const void* options);
inline constexpr const char* kPluginEntry = "trainctl_torch_entry";

}  // namespace trainctl::train
