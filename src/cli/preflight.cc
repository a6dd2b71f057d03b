#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "agent/warm_python.h"
#include "checkpoint/module_file.h"
#include "cli/verbs.h"
#include "common/cpus.h"
#include "common/fs.h"
#include "common/subprocess.h"
#include "data/dataset.h"
#include "data/file_list.h"
#include "jobspec/layers.h"

namespace trainctl::cli {

namespace {

// Where in `command` the script an interpreter runs is (python3 -u train.py, bash run.sh): its
// index, or 0 when it runs none (python3 -c, python3 -m, sh -c) or is no interpreter.
size_t ScriptIndex(const std::vector<std::string>& command) {
  if (command.empty()) return 0;
  const std::string exe = std::filesystem::path(command[0]).filename().string();
  const bool python = exe.rfind("python", 0) == 0, shell = exe == "sh" || exe == "bash" || exe == "dash";
  if (!python && !shell) return 0;
  for (size_t i = 1; i < command.size(); ++i) {
    const std::string& a = command[i];
    if (a == "-c" || (python && a == "-m") || a == "-" || a == "--") return 0;
    if (a.empty() || a[0] != '-') return i;
    if ((python && (a == "-W" || a == "-X")) || (shell && a == "-o")) ++i;  // the option's value
  }
  return 0;
}

// `path` against `base`: "" when it is absolute, a bare name (a program on the PATH) or empty.
std::string Against(const std::string& base, const std::string& path, bool bare_is_path) {
  if (path.empty() || path[0] == '/' || (bare_is_path && path.find('/') == std::string::npos)) return "";
  return (std::filesystem::path(base) / path).lexically_normal().string();
}

// Whether the built-in trainer's model can train on this machine at all: its parameters (with
// their gradients, the optimizer's state and the reducer's copy: 4x) and the activations a batch
// keeps for backward (its outputs, their gradients, and what the layers save: 3x), in float32,
// for each of the job's workers (a local job runs them all here), against the memory this
// process may use. An estimate: what passes may still run short; what fails cannot fit. A model
// of 844 trillion parameters, or three 65536-channel convolutions on large images, is refused
// here rather than when its first worker asks for the memory.
Status CheckModelFits(const JobSpec& spec) {
  const TrainerSpec& t = spec.trainer;
  if (!t.enabled || t.device != "cpu") return Status::Ok();  // a GPU's memory is not this machine's
  const auto layers = t.model == "layers" ? std::optional<std::vector<LayerSpec>>(t.layers) : BuiltinLayers(t.model);
  if (!layers) return Status::Ok();  // TorchScript: its layers are known once it is loaded
  auto summary = SummarizeModel(*layers, ImageShape(t.data), ClassCount(t.data));
  if (!summary.ok()) return Status::Ok();  // the decoder reports what does not fit
  const int workers = std::max(1, TrainingWorkers(spec));
  const double batch = t.global_batch_size > 0 ? std::ceil(double(t.global_batch_size) / workers) : t.batch_size;
  const double params = 4.0 * 4 * static_cast<double>(summary->params);
  const double activations = 3.0 * 4 * summary->activations * batch;
  const double need = workers * (params + activations), have = static_cast<double>(UsableMemoryBytes());
  if (need <= have) return Status::Ok();
  auto gib = [](double bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, bytes >= 1e15 ? "%.3g GiB" : "%.1f GiB", bytes / (1 << 30));
    return std::string(buf);
  };
  return InvalidArgument("trainer.model: training it needs about " + gib(need) + " of memory (" +
                         std::to_string(workers) + (workers == 1 ? " worker" : " workers") + " x (" +
                         std::to_string(summary->params) +
                         " parameters with their gradients and optimizer state: " + gib(params) +
                         "; the activations of a batch of " + std::to_string(int64_t(batch)) + ": " + gib(activations) +
                         ")); this machine has " + gib(have) + " (trainctl validate prints the layer table)");
}

}  // namespace

std::string ProgramBase(const JobSpec& spec, const std::string& spec_file) {
  if (!spec.working_dir.empty()) return AbsolutePath(spec.working_dir);
  if (spec_file.empty() || spec_file == "-" || !Exists(spec_file)) return AbsolutePath(".");
  return std::filesystem::path(AbsolutePath(spec_file)).parent_path().string();
}

void ResolveProgramPaths(JobSpec* spec, const std::string& base) {
  auto resolve = [&](std::vector<std::string>& command) {
    if (command.empty()) return;
    if (std::string p = Against(base, command[0], true); !p.empty()) command[0] = p;
    if (size_t i = ScriptIndex(command); i > 0) {
      if (std::string p = Against(base, command[i], false); !p.empty()) command[i] = p;
    }
  };
  resolve(spec->command);
  for (auto& role : spec->roles) resolve(role.command);
  // The trainer's files, by the same rule: the data's folders, the module.
  for (std::string* path : {&spec->trainer.data.dir, &spec->trainer.data.test_dir, &spec->trainer.torchscript}) {
    if (std::string p = Against(base, *path, false); !p.empty()) *path = p;
  }
}

Result<std::string> ResolveFolderShape(JobSpec* spec) {
  DataSpec& d = spec->trainer.data;
  if (!spec->trainer.enabled || d.dataset != "imagefolder" || d.shape.size() == 3 || d.dir.empty())
    return std::string();
  std::string first;
  ASSIGN_OR_RETURN(d.shape, data::FolderShape(d.dir, &first));
  return "trainer.data.shape: [" + std::to_string(d.shape[0]) + ", " + std::to_string(d.shape[1]) + ", " +
         std::to_string(d.shape[2]) + "], the first training picture's (" + first + "); set it for another size";
}

Status Preflight(const JobSpec& spec, const std::string& spec_file, const std::vector<std::string>& sets) {
  // Where a field's value came from: the --set that gave it (or a part of it), else the spec file.
  auto source = [&](const std::string& field) {
    for (auto it = sets.rbegin(); it != sets.rend(); ++it) {
      const std::string key = it->substr(0, it->find('='));
      auto within = [](const std::string& a, const std::string& b) {  // a is b or inside it
        return a.rfind(b, 0) == 0 && (a.size() == b.size() || a[b.size()] == '.' || a[b.size()] == '[');
      };
      if (within(key, field) || within(field, key)) return "--set " + *it;
    }
    return spec_file;
  };
  std::vector<std::string> problems;
  bool data_checked = false;
  const auto roles = JobRoles(spec, spec.nodes.max);
  for (size_t i = 0; i < roles.size(); ++i) {
    const RoleSpec& role = roles[i];
    const std::string field = spec.roles.empty() ? "command" : "roles[" + std::to_string(i) + "].command";
    if (role.command.empty()) {  // the built-in trainer
      if (data_checked) continue;
      data_checked = true;
      const DataSpec& d = spec.trainer.data;
      if (const std::string& ts = spec.trainer.torchscript; !ts.empty()) {
        // A module is code: a file only this user (or root) could have written, a zip archive
        // that inflates to no more than its size (checkpoint/module_file.h). What LibTorch makes
        // of it is checked when a worker loads it.
        if (auto m = checkpoint::ReadModuleFile(ts); !m.ok()) {
          problems.push_back(source("trainer.model.torchscript") +
                             ": trainer.model.torchscript: " + m.status().message());
        }
      }
      std::string dir = d.dir.empty() ? data::kFashionMnistDir : d.dir;
      if (Status st = data::CheckDataDir(d.dataset, dir); !st.ok()) {
        problems.push_back(source("trainer.data.dir") + ": trainer.data.dir: " + st.message());
      } else if (!d.test_dir.empty() && d.dataset == "imagefolder") {
        // Its classes among the training folder's (a folder may hold one class, or some).
        auto train = data::ListClassFolders(dir), test = data::ListClassFolders(d.test_dir, 1);
        if (!test.ok()) {
          problems.push_back(source("trainer.data.test_dir") + ": trainer.data.test_dir: " + test.status().message());
        } else if (train.ok()) {
          for (const auto& cls : *test) {
            if (std::find(train->begin(), train->end(), cls) == train->end()) {
              problems.push_back(source("trainer.data.test_dir") + ": trainer.data.test_dir: " + d.test_dir + "/" +
                                 cls + ": a class the training folder (" + dir + ") does not have");
            }
          }
        }
      }
      continue;
    }
    std::vector<std::string> env = CurrentEnvironment();
    for (const auto& [k, v] : role.env) SetEnv(&env, k, v);
    // Paths relative to the spec file's directory (or working_dir): ResolveProgramPaths.
    if (auto found = FindExecutable(role.command[0], env); !found.ok()) {
      problems.push_back(source(field) + ": " + field + ": " + found.status().message());
    } else if (size_t i = ScriptIndex(role.command); i > 0 && !Exists(role.command[i])) {
      problems.push_back(source(field) + ": " + field + "[" + std::to_string(i) + "]: " + role.command[i] +
                         ": no such " + "script (" +
                         (!spec.working_dir.empty() ? "a relative path is relative to working_dir"
                          : Exists(spec_file)       ? "a relative path is relative to the spec file's directory"
                                                    : "a relative path is relative to the working directory") +
                         ")");
    }
  }
  if (!spec.preload.empty() && std::none_of(roles.begin(), roles.end(), [](const RoleSpec& r) {
        return !r.command.empty() && IsPythonInterpreter(r.command[0]);
      })) {
    problems.push_back(
        source("preload") + ": preload: no task runs a Python interpreter, so nothing would be " +
        "preloaded; preload serves commands such as [python3, train.py] and [python3, -m, package.module]");
  }
  // Directories the job writes: a file in the way, or a place it cannot write, would fail only
  // once a worker saves its first checkpoint, an epoch in.
  for (const auto& [field, dir] :
       {std::pair<std::string, std::string>{"output_dir", spec.output_dir}, {"checkpoint_dir", spec.checkpoint_dir}}) {
    if (dir.empty()) continue;
    std::string at = dir;
    while (!at.empty() && !Exists(at)) at = std::filesystem::path(at).parent_path().string();
    if (at.empty()) at = ".";
    if (at == dir && !IsDirectory(dir)) {
      problems.push_back(source(field) + ": " + field + ": " + dir + " is a file, expected a directory");
    } else if (IsDirectory(at) && ::access(at.c_str(), W_OK | X_OK) != 0) {
      problems.push_back(source(field) + ": " + field + ": cannot write in " + at + " (" + std::strerror(errno) + ")");
    } else if (!IsDirectory(at)) {
      problems.push_back(source(field) + ": " + field + ": " + at + " is a file, expected a directory");
    }
  }
  if (Status st = CheckModelFits(spec); !st.ok()) problems.push_back(source("trainer.model") + ": " + st.message());
#if !TRAINCTL_BUILT_WITH_NCCL
  if (spec.trainer.enabled && spec.trainer.device == "cuda") {
    problems.push_back(source("trainer.device") +
                       ": trainer.device: cuda needs a trainctl built with CUDA and NCCL "
                       "(scripts/dev gpu-build, see docs/trainer.md); this one is CPU-only");
  }
#endif
  if (problems.empty()) return Status::Ok();
  std::string all;
  for (const auto& p : problems) all += (all.empty() ? "" : "\n") + p;
  return InvalidArgument(all);
}

}  // namespace trainctl::cli
