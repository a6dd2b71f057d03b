#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "agent/warm_python.h"
#include "cli/verbs.h"
#include "common/fs.h"
#include "common/subprocess.h"
#include "data/dataset.h"

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
        // A TorchScript module is a zip archive: what LibTorch reads is checked when a worker loads it.
        char head[2] = {};
        std::ifstream in(ts, std::ios::binary);
        if (!in || IsDirectory(ts)) {
          problems.push_back(source("trainer.model.torchscript") + ": trainer.model.torchscript: " + ts + ": " +
                             (in ? "a directory" : std::strerror(errno)) +
                             "; expected a file saved with torch.jit.script(model).save(path)");
        } else if (!in.read(head, 2) || head[0] != 'P' || head[1] != 'K') {
          problems.push_back(source("trainer.model.torchscript") + ": trainer.model.torchscript: " + ts +
                             ": not a TorchScript module (a zip archive); expected a file saved with "
                             "torch.jit.script(model).save(path)");
        }
      }
      std::string dir = d.dir.empty() ? data::kFashionMnistDir : d.dir;
      if (Status st = data::CheckDataDir(d.dataset, dir); !st.ok()) {
        problems.push_back(source("trainer.data") + ": trainer.data: " + st.message());
      }
      if (!d.test_dir.empty()) {
        if (Status st = data::CheckDataDir(d.dataset, d.test_dir); !st.ok()) {
          problems.push_back(source("trainer.data.test_dir") + ": trainer.data.test_dir: " + st.message());
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
      problems.push_back(source(field) + ": " + field + "[" + std::to_string(i) + "]: " + role.command[i] + ": no such " +
                         "script (" + (spec.working_dir.empty() ? "a relative path is relative to the spec file's directory"
                                                                : "a relative path is relative to working_dir") + ")");
    }
  }
  if (!spec.preload.empty() &&
      std::none_of(roles.begin(), roles.end(), [](const RoleSpec& r) { return !r.command.empty() && IsPythonInterpreter(r.command[0]); })) {
    problems.push_back(source("preload") + ": preload: no task runs a Python interpreter, so nothing would be " +
                       "preloaded; preload serves commands such as [python3, train.py] and [python3, -m, package.module]");
  }
  // Directories the job writes: a file in the way, or a place it cannot write, would fail only
  // once a worker saves its first checkpoint, an epoch in.
  for (const auto& [field, dir] : {std::pair<std::string, std::string>{"output_dir", spec.output_dir},
                                   {"checkpoint_dir", spec.checkpoint_dir}}) {
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
#if !TRAINCTL_BUILT_WITH_NCCL
  if (spec.trainer.enabled && spec.trainer.device == "cuda") {
    problems.push_back(source("trainer.device") + ": trainer.device: cuda needs a trainctl built with CUDA and NCCL "
                                   "(scripts/dev gpu-build, see docs/trainer.md); this one is CPU-only");
  }
#endif
  if (problems.empty()) return Status::Ok();
  std::string all;
  for (const auto& p : problems) all += (all.empty() ? "" : "\n") + p;
  return InvalidArgument(all);
}

}  // namespace trainctl::cli
