// `trainctl train` (a worker of the built-in trainer) and `trainctl eval`. Both run code that
// needs LibTorch, which lives in the plugin trainctl-torch.so next to this binary (or in
// ../lib/trainctl/), loaded only here: every other verb starts without paying for libtorch.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "agent/worker_forks.h"
#include "checkpoint/checkpoint.h"
#include "cli/verbs.h"
#include "common/duration.h"
#include "common/exit_codes.h"
#include "common/fork_server.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/plugin.h"
#include "common/strings.h"
#include "job/paths.h"
#include "job/run_status.h"
#include "job/runs.h"
#include "jobspec/job_spec.h"
#include "monitor/view.h"
#include "train/entry.h"
#include "train/splits.h"

namespace trainctl::cli {
namespace {

int CallPlugin(const char* verb, const void* options) {
  auto entry = PluginFunction<train::PluginEntry>(kTorchPlugin, train::kPluginEntry);
  if (!entry.ok()) {
    std::fprintf(stderr, "trainctl %s: the LibTorch part of trainctl: %s\n", verb, entry.status().message().c_str());
    return kExitError;
  }
  return (*entry)(verb, options);  // the plugin stays loaded until exit
}

// A worker server (agent/worker_forks.h): load LibTorch once, then make a copy of this process
// for each worker. Returns in each copy. A server that cannot serve exits, and the agent then
// starts each worker as a process of its own. The built-in trainer's data is read and inflated
// by a second thread while the plugin loads (0.4 s and 0.6 s for Fashion-MNIST on a 2-core VM);
// the thread has ended before any copy is made.
void ServeWorkersIfAsked(const GlobalFlags& flags) {
  if (!std::getenv(kEnvForkServerFd)) return;
  train::PreloadOptions o;
  o.log_level = flags.log_level;
  std::optional<JobSpec> spec;
  std::vector<train::LoadedSplit> splits;
  std::thread loader;
  if (const char* json = std::getenv(kEnvPreloadSpec)) {
    if (auto decoded = JobSpecFromJson(json); decoded.ok()) {
      spec = std::move(*decoded);
      o.spec = &*spec;
      o.splits = &splits;
      loader = std::thread([&] {
        const auto start = Clock::now();
        splits = train::LoadSplitsToKeep(spec->trainer.data, spec->trainer.eval);
        o.load_seconds = SecondsSince(start);
      });
    }
  }
  auto entry = PluginFunction<train::PluginEntry>(kTorchPlugin, train::kPluginEntry);
  if (loader.joinable()) loader.join();
  if (!entry.ok()) std::exit(kExitError);  // each worker says why, as a process of its own
  if (o.spec) (*entry)("preload", &o);
  ServeForks(flags.argc, flags.argv);  // exits if LibTorch started a thread as it loaded
}

// What a run's output directory holds to evaluate: its model.safetensors, else the directory of its
// checkpoints (a run still training, or one that ended before it exported); "" when neither.
std::string RunModel(const std::string& dir) {
  if (Exists(paths::Model(dir))) return paths::Model(dir);
  std::string checkpoints;
  if (auto job = ReadFile(paths::JobJson(dir), 1 << 20); job.ok()) {
    auto j = nlohmann::json::parse(*job, nullptr, false);
    if (j.is_object() && j.contains("checkpoint_dir") && j["checkpoint_dir"].is_string()) {
      checkpoints = j["checkpoint_dir"].get<std::string>();
    }
  }
  // A moved run's checkpoints moved with it (previous/<run id>/checkpoints).
  if (checkpoints.empty() || !IsDirectory(checkpoints) || checkpoints.rfind(dir, 0) != 0)
    checkpoints = dir + "/checkpoints";
  return IsDirectory(checkpoints) && !checkpoint::CheckpointDir(checkpoints, 1).List().empty() ? checkpoints : "";
}

// The file a model path means: itself, or a checkpoint directory's newest checkpoint file.
std::string NewestFile(const std::string& model) {
  if (!IsDirectory(model)) return model;
  const auto files = checkpoint::CheckpointDir(model, 1).List();
  return files.empty() ? model : files.back();
}

// Says on stderr which run and file `verb` uses, and, for a run still training, that it is (its
// newest checkpoint, not a final model): eval's and predict's figures are that model's.
void SayModel(const std::string& verb, const std::string& model, const std::string& run) {
  const std::string file = NewestFile(model);
  const std::string base = std::filesystem::path(file).filename().string();
  std::string step;
  if (base.rfind("ckpt-", 0) == 0) step = ", step " + std::to_string(std::atoll(base.c_str() + 5));
  std::fprintf(stderr, "trainctl %s: %s%s%s\n", verb.c_str(), run.empty() ? "" : (run + ": ").c_str(), file.c_str(),
               step.c_str());
}

// "run ID of job NAME", and that it is still running (so a checkpoint, not its final model).
std::string RunLabel(const std::string& run_id, const std::string& job, RunState state) {
  return "run " + run_id + " of job " + job +
         (state == RunState::kRunning ? " (still running: its newest checkpoint)" : "");
}

// RunLabel for the run of a model path: the status.json of its output directory (the file's
// directory, or the one above a checkpoints/ directory); "" when none names a run.
std::string RunOfModel(const std::string& model) {
  std::filesystem::path dir = std::filesystem::absolute(model).lexically_normal();
  if (!IsDirectory(model) || dir.filename().empty()) dir = dir.parent_path();  // a file, or "dir/"
  for (int up = 0; up < 2 && !dir.empty(); ++up, dir = dir.parent_path()) {
    const RunStatus st = ReadRunStatus(dir.string());
    if (!st.run_id.empty()) return RunLabel(st.run_id, st.job, st.state);
  }
  return "";
}

// A model as users name it: a model or checkpoint file, a checkpoint directory, a run's output
// directory (its model.safetensors, else its checkpoints), or a job run here by its run id (that
// run's model, wherever a rerun moved it) or its name, as kubectl names a pod. A name whose runs
// wrote to several output directories means the one in (or under) the working directory, else is
// refused with each; a directory that holds no model is a job's name when a job has it. The run
// and file it comes to are said on stderr.
Result<std::string> ModelPath(const std::string& verb, const std::string& arg) {
  std::string path_note;  // why a directory of that name was not taken
  if (Exists(arg)) {
    std::string model = !IsDirectory(arg) ? arg : RunModel(arg);
    if (model.empty() && IsDirectory(arg) && !checkpoint::CheckpointDir(arg, 1).List().empty()) model = arg;
    if (!model.empty()) {
      SayModel(verb, model, RunOfModel(model));
      return model;
    }
    path_note = arg +
                " is a directory here without a model or checkpoint (no model.safetensors, checkpoints/ or "
                "ckpt-*.safetensors in it)";
  }
  auto found = runs::Find(arg);  // the index's checks, and its error naming the jobs
  if (!found.ok()) {
    if (!path_note.empty()) return InvalidArgument(path_note + ", and no job of that name ran on this machine");
    return NotFound(arg +
                    ": no such model file or directory, nor a job run on this machine (trainctl ps lists "
                    "them)");
  }
  if (!path_note.empty())
    std::fprintf(stderr, "trainctl %s: %s; taking it as the job's name\n", verb.c_str(), path_note.c_str());
  const bool by_id = found->run_id == arg;
  struct Candidate {
    runs::RunEntry entry;
    std::string model;
    RunState state;
  };
  std::vector<Candidate> with;                    // the runs that have a model, newest first
  std::vector<std::string> without;               // newer runs of the job that have no model
  for (const runs::RunEntry& e : runs::List()) {  // newest first
    if (by_id ? e.run_id != arg : e.name != arg) continue;
    const monitor::RunView v = monitor::View(e);
    const std::string model = RunModel(v.dir);
    if (model.empty()) {
      if (by_id) {
        return NotFound("run " + e.run_id + " of job " + e.name + " wrote no model and no checkpoint (" +
                        RunStateName(v.state) + "; trainctl status " + e.run_id + " says how it ended)");
      }
      if (with.empty()) without.push_back(e.run_id + " (" + std::string(RunStateName(v.state)) + ")");
      continue;
    }
    with.push_back({e, model, v.state});
  }
  if (with.empty()) {
    return NotFound("job " + arg + ": none of its runs wrote a model or a checkpoint (" + Join(without, ", ") + ")");
  }
  // Several output directories: the working directory's own, else the user says which.
  std::vector<Candidate> here;
  std::set<std::string> dirs;
  std::error_code ec;
  const std::string cwd = std::filesystem::current_path(ec).string() + "/";
  for (const auto& c : with) {
    dirs.insert(c.entry.output_dir);
    if ((c.entry.output_dir + "/").rfind(cwd, 0) == 0) here.push_back(c);
  }
  const Candidate* chosen = &with.front();
  if (dirs.size() > 1) {
    std::set<std::string> here_dirs;
    for (const auto& c : here) here_dirs.insert(c.entry.output_dir);
    if (here_dirs.size() != 1) {
      std::vector<std::string> each;
      std::set<std::string> named;
      for (const auto& c : with) {
        if (named.insert(c.entry.output_dir).second) {
          each.push_back(c.entry.run_id + " (" + RunStateName(c.state) + ", in " + c.entry.output_dir + ")");
        }
      }
      return InvalidArgument("job " + arg + " ran in " + std::to_string(dirs.size()) + " output directories" +
                             (here_dirs.empty() ? ", none of them under this one" : ", several under this one") + ": " +
                             Join(each, "; ") + ". Give the run id, or the output directory, to say which");
    }
    chosen = &here.front();
  }
  if (!without.empty() && chosen == &with.front()) {
    std::fprintf(stderr, "trainctl %s: job %s: its newest run%s %s wrote no model; using run %s\n", verb.c_str(),
                 arg.c_str(), without.size() > 1 ? "s" : "", Join(without, ", ").c_str(), chosen->entry.run_id.c_str());
  }
  SayModel(verb, chosen->model, RunLabel(chosen->entry.run_id, chosen->entry.name, chosen->state));
  return chosen->model;
}

}  // namespace

Result<std::string> CheckScriptedModel(const std::string& path, const std::vector<int64_t>& shape, int classes) {
  train::CheckModuleOptions o;
  o.path = path;
  o.channels = static_cast<int>(shape[0]);
  o.rows = static_cast<int>(shape[1]);
  o.cols = static_cast<int>(shape[2]);
  o.classes = classes;
  auto entry = PluginFunction<train::PluginEntry>(kTorchPlugin, train::kPluginEntry);
  if (!entry.ok()) return Internal("the LibTorch part of trainctl: " + entry.status().message());
  if ((*entry)("check-module", &o) != 0) return InvalidArgument(o.error);
  return o.summary;
}

namespace {

constexpr const char* kTorchscriptHelp =
    "a TorchScript model's module (.pt): the file it was trained with, checked against the hash its "
    "checkpoint records (default: the copy its run keeps beside the checkpoint; a module is code, and "
    "trainctl never loads one a checkpoint's metadata names)";

}  // namespace

void AddTrain(CLI::App& app, const GlobalFlags& flags, int* code) {
  CLI::App* cmd = app.add_subcommand("train",
                                     "Run one worker of the built-in trainer (started by the agent for jobs with a "
                                     "trainer section; reads the torchrun environment)");
  // Which task this is, for ps: the agent passes it, and a worker server's copies write theirs
  // over the server's placeholder.
  cmd->add_option("--task", "")->group("");
  cmd->callback([&flags, code] {
    ServeWorkersIfAsked(flags);
    train::TrainOptions o;
    o.log_level = flags.log_level;
    const int exit_code = CallPlugin("train", &o);
    // Static destructors would now unregister LibTorch's thousands of operators, writing every
    // page of its registry: in a worker copied from a server (agent/worker_forks.h), each such
    // page is a copy-on-write fault, about 1 s of CPU in all on a 2-core VM. The trainer has
    // closed its files; what is left is the logger's and stdio's buffers.
    spdlog::default_logger()->flush();
    std::fflush(nullptr);
    ::_exit(exit_code);
  });
}

void AddEval(CLI::App& app, const GlobalFlags& flags, int* code) {
  auto o = std::make_shared<train::EvalOptions>();
  CLI::App* cmd = app.add_subcommand("eval",
                                     "Evaluate a trained model on its test set: overall and per-class accuracy and the "
                                     "confusion matrix");
  auto* job = cmd->add_option("job", o->checkpoint,
                              "a job run on this machine, by name or run id (trainctl ps): its model, or its newest "
                              "checkpoint while it trains; the same as --checkpoint JOB");
  auto* checkpoint =
      cmd->add_option("--checkpoint", o->checkpoint,
                      "a model or checkpoint (.safetensors: <output_dir>/model.safetensors, or a "
                      "checkpoint file), a checkpoint directory (its newest valid checkpoint), a run's output "
                      "directory, or a job's name or run id");
  job->excludes(checkpoint);
  auto* watch = cmd->add_option("--watch", o->watch,
                                "a checkpoint directory: evaluate each checkpoint as it appears (a sidecar evaluator), "
                                "appending test accuracy to metrics.jsonl and tensorboard/eval/ in --metrics-dir; ends "
                                "once the run's final model.safetensors appears there, or on Ctrl-C");
  checkpoint->excludes(watch);
  job->excludes(watch);
  cmd->add_option("--metrics-dir", o->metrics_dir,
                  "--watch: the run's output directory (default: the checkpoint directory's parent)")
      ->needs(watch);
  cmd->add_option("--data", o->data_dir, "directory with the test set (default: the one the model was trained on)");
  cmd->add_option("--torchscript", o->torchscript, kTorchscriptHelp);
  cmd->add_option("--limit", o->limit, "evaluate only the first N test images")->check(CLI::NonNegativeNumber);
  cmd->add_option("-o,--output", o->format, "text or json")
      ->capture_default_str()
      ->check(CLI::IsMember({"text", "json"}));
  cmd->add_option("--threads", o->threads, "compute threads (default: all cores)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--batch", o->batch, "images per forward pass")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->callback([o, code] {
    if (o->checkpoint.empty() == o->watch.empty()) {
      std::fprintf(stderr,
                   "trainctl eval: give a job (trainctl eval JOB) or a model with --checkpoint, or a "
                   "checkpoint directory to follow with --watch\n");
      *code = kExitInvalidSpec;
      return;
    }
    if (!o->checkpoint.empty()) {
      auto model = ModelPath("eval", o->checkpoint);
      if (!model.ok()) {
        *code = Fail("eval", model.status());
        return;
      }
      o->checkpoint = *model;
    }
    if (!o->watch.empty() && !IsDirectory(o->watch)) {
      std::fprintf(stderr, "trainctl eval: --watch %s: not a directory\n", o->watch.c_str());
      *code = kExitInvalidSpec;
      return;
    }
    *code = CallPlugin("eval", o.get());
  });
}

void AddPredict(CLI::App& app, const GlobalFlags& flags, int* code) {
  (void)flags;
  auto o = std::make_shared<train::PredictOptions>();
  CLI::App* cmd = app.add_subcommand(
      "predict", "Try a trained model on images: the most likely classes of each, with their probabilities");
  cmd->add_option("--checkpoint", o->checkpoint,
                  "a model or checkpoint (.safetensors), a checkpoint directory (its newest valid checkpoint), "
                  "a run's output directory, or a job run on this machine by name or run id (trainctl ps)")
      ->required();
  cmd->add_option("images", o->images,
                  "PNG, JPEG, PGM or PPM files (grey and colour converted as the model needs; of the model's size, "
                  "or any size for a model trained on an image folder: resized and centre-cropped as its pictures), "
                  "or idx3 image files (every image in them)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--torchscript", o->torchscript, kTorchscriptHelp);
  cmd->add_option("-k,--top", o->top, "how many classes to show per image")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("-o,--output", o->format, "text or json")
      ->capture_default_str()
      ->check(CLI::IsMember({"text", "json"}));
  cmd->add_option("--threads", o->threads, "compute threads (default: all cores)")->check(CLI::NonNegativeNumber);
  cmd->callback([o, code] {
    auto model = ModelPath("predict", o->checkpoint);
    if (!model.ok()) {
      *code = Fail("predict", model.status());
      return;
    }
    o->checkpoint = *model;
    *code = CallPlugin("predict", o.get());
  });
}

}  // namespace trainctl::cli
