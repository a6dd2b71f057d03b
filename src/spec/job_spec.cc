#include "spec/job_spec.h"

namespace trainctl {

int JobSpec::world_size() const {
  if (roles.empty()) return nodes.max * procs_per_node;
  int total = 0;
  for (const auto& r : roles) total += r.replicas;
  return total;
}

std::vector<RoleSpec> JobRoles(const JobSpec& spec, int nodes) {
  if (!spec.roles.empty()) return spec.roles;
  RoleSpec worker;
  worker.name = "worker";
  worker.replicas = nodes * spec.procs_per_node;
  worker.command = spec.command;
  worker.args = spec.args;
  worker.env = spec.env;
  worker.resources = spec.resources;
  return {worker};
}

int TrainingWorkers(const JobSpec& spec) {
  if (spec.roles.empty()) return spec.world_size();
  int n = 0;
  for (const auto& r : spec.roles) {
    if (r.command.empty() && (r.name == "chief" || r.name == "worker")) n += r.replicas;
  }
  return n;
}

const RoleSpec* FindRole(const std::vector<RoleSpec>& roles, const std::string& name) {
  for (const auto& r : roles) {
    if (r.name == name) return &r;
  }
  return nullptr;
}

}  // namespace trainctl
