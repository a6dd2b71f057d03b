#include "job/agent_command.h"

#include "common/strings.h"

namespace trainctl {

std::vector<std::string> AgentCommand::Argv() const {
  std::vector<std::string> argv = {trainctl};
  if (!log_level.empty()) argv.insert(argv.end(), {"--log-level", log_level});
  argv.push_back("agent");
  if (!spec_file.empty()) argv.insert(argv.end(), {"--spec", spec_file});
  argv.insert(argv.end(), {"--run-id", run_id});
  if (!task.empty()) {
    argv.insert(argv.end(), {"--task", task});
  } else {
    argv.insert(argv.end(), {"--node-rank", node_rank.empty() ? "-1" : node_rank});
  }
  if (!host.empty()) argv.insert(argv.end(), {"--host", host});
  if (!replaces.empty()) argv.insert(argv.end(), {"--replaces", Join(replaces, ",")});
  if (serve_store) argv.push_back("--serve-store");
  if (color) argv.push_back("--color");
  if (leave_on_signal) argv.push_back("--leave-on-signal");
  if (metrics_port > 0) argv.insert(argv.end(), {"--metrics-port", std::to_string(metrics_port)});
  return argv;
}

}  // namespace trainctl
