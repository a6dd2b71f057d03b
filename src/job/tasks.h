// The tasks of a job and the nodes they run on: what every agent computes the same way from the
// spec and the round's size, so that no task is started twice or not at all.
//
// The tasks are numbered in role order (the spec's), then by index within the role; that number
// is the task's RANK. Node n of N runs the contiguous slice [n*T/N, (n+1)*T/N) of the T tasks.
// For a job of one role with P tasks per node that is torchrun's layout (RANK = node*P + local);
// with one task per node (a TFJob's pods) node n runs task n.
#pragma once

#include <string>
#include <vector>

namespace trainctl {

struct RoleSize {
  std::string name;
  int replicas = 1;
};

struct Task {
  int rank = 0;  // among all tasks
  std::string role;
  int index = 0;       // within its role (ROLE_RANK; TF_CONFIG's task index)
  int role_size = 1;   // ROLE_WORLD_SIZE
  int node = 0;        // the node that runs it
  int local = 0;       // among that node's tasks (LOCAL_RANK)
  int local_size = 1;  // tasks on that node (LOCAL_WORLD_SIZE)
};

// Every task of `roles` placed on `nodes` nodes (nodes >= 1), in rank order.
std::vector<Task> PlaceTasks(const std::vector<RoleSize>& roles, int nodes);
// The tasks that node `node` runs, in local order.
std::vector<Task> TasksOfNode(const std::vector<Task>& tasks, int node);
// The same as TasksOfNode(PlaceTasks(roles, nodes), node), without placing the others: what each
// agent of a wide job needs (placing every task in every agent costs the job nodes^2).
std::vector<Task> PlaceNodeTasks(const std::vector<RoleSize>& roles, int nodes, int node);

// TF_CONFIG for `task`, as Kubeflow's TFJob writes it: the cluster map of every role but the
// evaluator (its tasks' addresses, by index), the task's own type and index, and
// "environment": "cloud". `addrs` holds every task's host:port, by rank.
std::string TfConfig(const std::vector<Task>& tasks, const std::vector<std::string>& addrs, const Task& task);

}  // namespace trainctl
