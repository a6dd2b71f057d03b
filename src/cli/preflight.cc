#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "cli/verbs.h"
#include "common/fs.h"
#include "common/subprocess.h"
#include "data/dataset.h"

namespace trainctl::cli {

Status Preflight(const JobSpec& spec, const std::string& spec_file) {
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
          problems.push_back(spec_file + ": trainer.model.torchscript: " + ts + ": " +
                             (in ? "a directory" : std::strerror(errno)) +
                             "; expected a file saved with torch.jit.script(model).save(path)");
        } else if (!in.read(head, 2) || head[0] != 'P' || head[1] != 'K') {
          problems.push_back(spec_file + ": trainer.model.torchscript: " + ts +
                             ": not a TorchScript module (a zip archive); expected a file saved with "
                             "torch.jit.script(model).save(path)");
        }
      }
      std::string dir = d.dir.empty() ? data::kFashionMnistDir : d.dir;
      if (Status st = data::CheckDataDir(d.dataset, dir); !st.ok()) {
        problems.push_back(spec_file + ": trainer.data: " + st.message());
      }
      if (!d.test_dir.empty()) {
        if (Status st = data::CheckDataDir(d.dataset, d.test_dir); !st.ok()) {
          problems.push_back(spec_file + ": trainer.data.test_dir: " + st.message());
        }
      }
      continue;
    }
    std::vector<std::string> env = CurrentEnvironment();
    for (const auto& [k, v] : role.env) SetEnv(&env, k, v);
    std::string program = role.command[0];
    if (program.find('/') != std::string::npos && program[0] != '/' && !spec.working_dir.empty()) {
      program = spec.working_dir + "/" + program;
    }
    if (auto found = FindExecutable(program, env); !found.ok()) {
      problems.push_back(spec_file + ": " + field + ": " + found.status().message());
    }
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
      problems.push_back(spec_file + ": " + field + ": " + dir + " is a file, expected a directory");
    } else if (IsDirectory(at) && ::access(at.c_str(), W_OK | X_OK) != 0) {
      problems.push_back(spec_file + ": " + field + ": cannot write in " + at + " (" + std::strerror(errno) + ")");
    } else if (!IsDirectory(at)) {
      problems.push_back(spec_file + ": " + field + ": " + at + " is a file, expected a directory");
    }
  }
#if !TRAINCTL_BUILT_WITH_NCCL
  if (spec.trainer.enabled && spec.trainer.device == "cuda") {
    problems.push_back(spec_file + ": trainer.device: cuda needs a trainctl built with CUDA and NCCL "
                                   "(scripts/dev gpu-build, see docs/trainer.md); this one is CPU-only");
  }
#endif
  if (problems.empty()) return Status::Ok();
  std::string all;
  for (const auto& p : problems) all += (all.empty() ? "" : "\n") + p;
  return InvalidArgument(all);
}

}  // namespace trainctl::cli
