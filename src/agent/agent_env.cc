#include "agent/agent_env.h"

#include <unistd.h>

#include "agent/worker_group.h"

namespace trainctl {
namespace {

class Process : public AgentEnv {
 public:
  Clock::time_point Now() const override { return Clock::now(); }
  int WaitSignal(Duration wait) override { return trainctl::WaitSignal(wait); }
  int StopSignal() override { return trainctl::StopSignal(); }
  Result<std::pair<size_t, std::string>> WaitForAny(Store& store, const std::vector<std::string>& keys,
                                                    Duration timeout) override {
    return store.WaitAny(keys, timeout);
  }
  std::optional<std::string> GetEnv(const std::string& name) const override {
    const char* v = std::getenv(name.c_str());
    return v ? std::optional<std::string>(v) : std::nullopt;
  }
  long Pid() const override { return ::getpid(); }
  std::unique_ptr<TaskGroup> NewTaskGroup(bool color_output, WorkerForks* forks) override {
    return std::make_unique<WorkerGroup>(color_output, forks);
  }
};

}  // namespace

AgentEnv& ProcessEnv() {
  static Process env;
  return env;
}

}  // namespace trainctl
