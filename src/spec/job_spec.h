// JobSpec: everything trainctl knows about a job, after parsing, layering and validation.
// Documented for users in docs/job-spec.md.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/duration.h"
#include "common/status.h"

namespace trainctl {

struct NodesSpec {
  int min = 1;  // the job runs with fewer than max but never fewer than min nodes
  int max = 1;  // the local launcher starts max nodes
};

struct ResourcesSpec {  // per worker process; used by the cluster targets
  double cpus = 0;        // 0: not set
  int64_t memory_bytes = 0;
  int gpus = 0;
};

struct RestartSpec {
  int max_restarts = 3;  // worker-group restarts allowed for the whole job, not per node
};

struct TimeoutsSpec {
  Duration rendezvous = std::chrono::minutes(5);  // all nodes must join within this
  Duration stop_grace = std::chrono::seconds(10); // SIGTERM, then SIGKILL after this
  Duration job = Duration(0);                     // whole-job deadline; 0: none
};

struct JobSpec {
  std::string name;                      // DNS-1123 label: [a-z0-9-], at most 63 chars
  NodesSpec nodes;
  int procs_per_node = 1;
  std::vector<std::string> command;      // the worker program and its first arguments
  std::vector<std::string> args;         // appended to command
  std::vector<std::pair<std::string, std::string>> env;  // in spec order
  std::string working_dir;               // empty: where trainctl runs
  ResourcesSpec resources;
  RestartSpec restart;
  TimeoutsSpec timeouts;
  std::string rendezvous;                // "": the launcher's embedded store; or etcd://h:p[,h:p]
  std::string output_dir;                // default runs/<name>
  std::string checkpoint_dir;            // default <output_dir>/checkpoints

  int world_size() const { return nodes.max * procs_per_node; }
};

// Where a spec comes from: files layered in order, then --set overrides in order.
struct SpecSources {
  std::vector<std::string> files;
  std::vector<std::string> sets;
};

// Loads, layers, validates. On failure the status (kInvalidArgument) lists every problem found,
// one per line, each as "file:line: field: what was expected, got what".
Result<JobSpec> LoadJobSpec(const SpecSources& sources);
// The same for text already in memory (tests, stdin); `source` names it in errors.
Result<JobSpec> ParseJobSpec(const std::string& yaml, const std::string& source);

// The environment variables that trainctl sets for every worker; a spec may not set them.
const std::vector<std::string>& ReservedEnvNames();

// Lossless round trip through JSON, used to hand the resolved spec to agents.
std::string JobSpecToJson(const JobSpec& spec, int indent = -1);
Result<JobSpec> JobSpecFromJson(const std::string& json);

}  // namespace trainctl
