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
      std::string dir = d.dir.empty() ? data::kFashionMnistDir : d.dir;
      if (Status st = data::CheckDataDir(d.dataset, dir); !st.ok()) {
        problems.push_back(spec_file + ": trainer.data: " + st.message());
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
  if (problems.empty()) return Status::Ok();
  std::string all;
  for (const auto& p : problems) all += (all.empty() ? "" : "\n") + p;
  return InvalidArgument(all);
}

}  // namespace trainctl::cli
