#include "job/tasks.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

namespace trainctl {

std::vector<Task> PlaceTasks(const std::vector<RoleSize>& roles, int nodes) {
  std::vector<Task> tasks;
  size_t count = 0;
  for (const auto& r : roles) count += static_cast<size_t>(std::max(0, r.replicas));
  tasks.reserve(count);  // every agent of a 1024-node job places all 1024 tasks
  for (const auto& r : roles) {
    for (int i = 0; i < r.replicas; ++i) {
      Task t;
      t.rank = static_cast<int>(tasks.size());
      t.role = r.name;
      t.index = i;
      t.role_size = r.replicas;
      tasks.push_back(t);
    }
  }
  const int64_t total = static_cast<int64_t>(tasks.size());
  nodes = std::max(1, nodes);
  for (int n = 0; n < nodes; ++n) {
    const int64_t first = n * total / nodes, end = (n + 1) * total / nodes;
    for (int64_t t = first; t < end; ++t) {
      tasks[t].node = n;
      tasks[t].local = static_cast<int>(t - first);
      tasks[t].local_size = static_cast<int>(end - first);
    }
  }
  return tasks;
}

std::vector<Task> TasksOfNode(const std::vector<Task>& tasks, int node) {
  std::vector<Task> out;
  for (const auto& t : tasks) {
    if (t.node == node) out.push_back(t);
  }
  return out;
}

std::vector<Task> PlaceNodeTasks(const std::vector<RoleSize>& roles, int nodes, int node) {
  int64_t total = 0;
  for (const auto& r : roles) total += std::max(0, r.replicas);
  nodes = std::max(1, nodes);
  const int64_t first = node * total / nodes, end = (node + 1) * total / nodes;
  std::vector<Task> out;
  int64_t role_first = 0;  // the rank of the role's first task
  for (const auto& r : roles) {
    const int64_t role_end = role_first + std::max(0, r.replicas);
    for (int64_t t = std::max(first, role_first); t < std::min(end, role_end); ++t) {
      Task task;
      task.rank = static_cast<int>(t);
      task.role = r.name;
      task.index = static_cast<int>(t - role_first);
      task.role_size = r.replicas;
      task.node = node;
      task.local = static_cast<int>(t - first);
      task.local_size = static_cast<int>(end - first);
      out.push_back(std::move(task));
    }
    role_first = role_end;
  }
  return out;
}

std::string TfConfig(const std::vector<Task>& tasks, const std::vector<std::string>& addrs, const Task& task) {
  // Kubeflow leaves the evaluator out of the cluster: TensorFlow's strategies would otherwise
  // wait for it to take part in training.
  nlohmann::json cluster = nlohmann::json::object();
  for (const auto& t : tasks) {
    if (t.role == "evaluator") continue;
    cluster[t.role].push_back(t.rank < static_cast<int>(addrs.size()) ? addrs[t.rank] : "");
  }
  return nlohmann::json{
      {"cluster", cluster}, {"task", {{"type", task.role}, {"index", task.index}}}, {"environment", "cloud"}}
      .dump();
}

}  // namespace trainctl
