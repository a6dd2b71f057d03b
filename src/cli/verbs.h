// One function per verb: each adds its subcommand to the app and, when it runs, stores the
// exit code in *code. The verbs stay thin: they parse flags and call the modules.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "common/subprocess.h"
#include "jobspec/job_spec.h"

namespace trainctl::cli {

struct GlobalFlags {
  std::string log_level = "info";
  int argc = 0;  // main's, as the process was started (a forked agent rewrites its last one)
  char** argv = nullptr;
};

void AddRun(CLI::App& app, const GlobalFlags& flags, int* code);
void AddValidate(CLI::App& app, const GlobalFlags& flags, int* code);
void AddSchema(CLI::App& app, const GlobalFlags& flags, int* code);  // the spec's JSON Schema
void AddAgent(CLI::App& app, const GlobalFlags& flags, int* code);
void AddTrain(CLI::App& app, const GlobalFlags& flags, int* code);
void AddEval(CLI::App& app, const GlobalFlags& flags, int* code);
void AddPredict(CLI::App& app, const GlobalFlags& flags, int* code);
void AddTorchrun(CLI::App& app, const GlobalFlags& flags, int* code);
void AddRender(CLI::App& app, const GlobalFlags& flags, int* code);
// A spec's TorchScript module loaded by the torch plugin and run on a batch of the data's shape
// (train/entry.h: RunCheckModule), for validate: its summary line, or why it cannot train.
Result<std::string> CheckScriptedModel(const std::string& path, const std::vector<int64_t>& shape, int classes);
// pipeline: a spec's image-folder input pipeline alone, measured (cli/pipeline.cc).
void AddPipeline(CLI::App& app, const GlobalFlags& flags, int* code);
// bench: an experiment matrix run and reported; bench compare (cli/bench.cc).
void AddBench(CLI::App& app, const GlobalFlags& flags, int* code);
// submit, status, logs, delete: a job on Kubernetes, through kubectl (status and logs also take
// a local job's name, below).
void AddClusterVerbs(CLI::App& app, const GlobalFlags& flags, int* code);
// ps, stop: jobs run on this machine (cli/local_jobs.cc).
void AddLocalJobVerbs(CLI::App& app, const GlobalFlags& flags, int* code);

// The spec-source flags shared by run and validate: FILE, -f FILE (repeatable), --set K=V.
struct SpecFlags {
  std::string file;
  std::vector<std::string> files;
  std::vector<std::string> sets;
  void Add(CLI::App* cmd, const std::string& name = "spec", const std::string& what = "the job spec (YAML)");
  SpecSources Sources() const;
};

// kubectl with `args`, fed `input` on stdin from memory; kNotFound when kubectl is not on the PATH,
// kUnavailable past 120 s. KubectlWhy: its verdict when it failed (its last line, not its retries).
Result<CommandResult> Kubectl(const std::vector<std::string>& args, const std::string& input = "");
std::string KubectlWhy(const CommandResult& r);

// Whether status/logs were given a local job (a name or run id that is not a spec file).
bool IsLocalJob(const SpecFlags& flags);
// status and logs of a job run on this machine; trainctl exit codes.
int LocalStatus(const std::string& job, bool as_json);
int LocalLogs(const std::string& job, bool follow, int rank, const std::string& role, const std::string& since);

// The flag of `cmd` (or of trainctl itself) nearest to `arg` ("--sett" or "--sett=x": "--set"); ""
// when none is near.
std::string NearestFlag(const CLI::App& cmd, const std::string& arg);

// `path` made absolute against the current directory and normalized; "" stays "".
std::string AbsolutePath(const std::string& path);

// The directory relative paths in a spec's commands are resolved against: working_dir when the
// spec sets one (the workers run there), else the directory of the spec file (`spec_file`; the
// current directory for "-" or a command line).
std::string ProgramBase(const JobSpec& spec, const std::string& spec_file);
// Makes each command's program and script (python3 train.py, sh run.sh) absolute against `base`
// (ProgramBase), as a local run starts them; a command looked up on the PATH stays as it is. So
// are the trainer's data.dir, data.test_dir and model.torchscript: one rule for every path a spec
// names, wherever trainctl runs.
void ResolveProgramPaths(JobSpec* spec, const std::string& base);

// An image folder's trainer.data.shape when the spec leaves it out: its first training picture's
// (data::FolderShape), filled in. The line that says so ("" when there was nothing to fill);
// kInvalidArgument when no picture tells.
Result<std::string> ResolveFolderShape(JobSpec* spec);

// What can never succeed, found before anything starts: a program that cannot be run, a missing
// dataset. Every problem, one per line, each starting with `spec_file`.
// A problem with a field that a --set in `sets` gave is blamed on that --set.
Status Preflight(const JobSpec& spec, const std::string& spec_file, const std::vector<std::string>& sets = {});

// What renders for Kubernetes but would not run there: a program that trainctl's own image lacks
// (python3, torchrun...), a script that is a file on this machine only. One line each, to print
// as warnings before render and submit.
// A trainctl image of the wrong stage (the CPU one for trainer.device: cuda, one without the mpi
// stage for `format` mpijob) is one too.
std::vector<std::string> ClusterWarnings(const JobSpec& spec, const std::string& spec_file, const std::string& format);

// Prints "trainctl VERB: message" to stderr; returns the exit code: 2 for what the user asked
// wrongly (kNotFound, kInvalidArgument: a missing program, an unknown job), else 1.
int Fail(const std::string& verb, const Status& st);

// Loads the spec; on error prints every problem to stderr and returns nullopt.
std::optional<JobSpec> LoadOrReport(const SpecFlags& flags);

}  // namespace trainctl::cli
