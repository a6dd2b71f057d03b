#include "jobspec/job_spec.h"

#include <algorithm>

#include "job/tasks.h"

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

std::vector<int64_t> ImageShape(const DataSpec& data) {
  if (data.dataset == "synthetic" || data.dataset == "imagefolder") return data.shape;
  if (data.dataset == "cifar10") return {3, 32, 32};
  return {1, 28, 28};  // fashion-mnist, mnist
}

int ClassCount(const DataSpec& data) {
  if (data.dataset == "imagefolder") return 0;  // its class folders, known once it is read
  return data.dataset == "synthetic" ? data.classes : 10;
}

int TrainingWorkers(const JobSpec& spec) {
  if (spec.roles.empty()) return spec.world_size();
  int n = 0;
  for (const auto& r : spec.roles) {
    if (r.command.empty() && TrainingRole(r.name)) n += r.replicas;
  }
  return n;
}

std::string DescribeTasks(const JobSpec& spec, bool programs) {
  auto program = [&](const std::vector<std::string>& command) {
    if (command.empty()) return std::string("built-in trainer");
    std::string out;
    for (const auto& w : command) out += (out.empty() ? "" : " ") + w;
    return out;
  };
  const std::string nodes = std::to_string(spec.nodes.max) + " node(s)";
  if (spec.roles.empty()) {
    const std::string workers = nodes + " x " + std::to_string(spec.procs_per_node) + " worker(s)";
    if (!programs) return workers;
    return workers + ", " + (spec.trainer.enabled ? "built-in trainer" : "command: " + program(spec.command));
  }
  std::string roles;
  for (const auto& r : spec.roles) {
    roles += (roles.empty() ? "" : ", ") + r.name + " x" + std::to_string(r.replicas) +
             (programs ? " (" + program(r.command) + ")" : "");
  }
  return nodes + ", roles: " + roles;
}

ResourcesSpec NodeResources(const JobSpec& spec) {
  const auto roles = JobRoles(spec, spec.nodes.max);
  std::vector<RoleSize> sizes;
  for (const auto& r : roles) sizes.push_back({r.name, r.replicas});
  std::vector<ResourcesSpec> nodes(spec.nodes.max);
  for (const auto& t : PlaceTasks(sizes, spec.nodes.max)) {
    const ResourcesSpec& r = FindRole(roles, t.role)->resources;
    nodes[t.node].cpus += r.cpus;
    nodes[t.node].memory_bytes += r.memory_bytes;
    nodes[t.node].gpus += r.gpus;
  }
  ResourcesSpec most;
  for (const auto& n : nodes) {
    most.cpus = std::max(most.cpus, n.cpus);
    most.memory_bytes = std::max(most.memory_bytes, n.memory_bytes);
    most.gpus = std::max(most.gpus, n.gpus);
  }
  return most;
}

const RoleSpec* FindRole(const std::vector<RoleSpec>& roles, const std::string& name) {
  for (const auto& r : roles) {
    if (r.name == name) return &r;
  }
  return nullptr;
}

}  // namespace trainctl
