#include "job/task_env.h"

#include <algorithm>
#include <charconv>

#include "common/subprocess.h"

namespace trainctl {
namespace {

// One table for both directions, so a variable is never written under one name and read under
// another. `required` variables must be present when reading.
struct IntVar {
  const char* name;
  int TaskEnv::*field;
  bool required;
};
struct StringVar {
  const char* name;
  std::string TaskEnv::*field;
  bool required;
};

constexpr IntVar kInts[] = {
    {"RANK", &TaskEnv::rank, true},
    {"LOCAL_RANK", &TaskEnv::local_rank, false},
    {"WORLD_SIZE", &TaskEnv::world_size, true},
    {"LOCAL_WORLD_SIZE", &TaskEnv::local_world_size, false},
    {"GROUP_RANK", &TaskEnv::group_rank, false},
    {"GROUP_WORLD_SIZE", &TaskEnv::group_world_size, false},
    {"ROLE_RANK", &TaskEnv::role_rank, false},
    {"ROLE_WORLD_SIZE", &TaskEnv::role_world_size, false},
    {"MASTER_PORT", &TaskEnv::master_port, false},
    {"TORCHELASTIC_RESTART_COUNT", &TaskEnv::restart_count, false},
    {"TORCHELASTIC_MAX_RESTARTS", &TaskEnv::max_restarts, false},
    {"TRAINCTL_ROUND", &TaskEnv::round, false},
    {"TRAINCTL_TASK_RESTARTS", &TaskEnv::task_restarts, false},
};

constexpr StringVar kStrings[] = {
    {"ROLE_NAME", &TaskEnv::role_name, false},
    {"MASTER_ADDR", &TaskEnv::master_addr, false},
    {"TORCHELASTIC_RUN_ID", &TaskEnv::run_id, false},
    {"TORCHELASTIC_ERROR_FILE", &TaskEnv::error_file, false},
    {"TF_CONFIG", &TaskEnv::tf_config, false},
    {"TRAINCTL_JOB_NAME", &TaskEnv::job_name, false},
    {"TRAINCTL_OUTPUT_DIR", &TaskEnv::output_dir, false},
    {"TRAINCTL_CHECKPOINT_DIR", &TaskEnv::checkpoint_dir, false},
    {"TRAINCTL_STORE_ADDR", &TaskEnv::store_addr, true},
    {"TRAINCTL_STORE_TOKEN", &TaskEnv::store_token, false},
    {"TRAINCTL_STORE_PREFIX", &TaskEnv::store_prefix, false},
    {"TRAINCTL_HOST", &TaskEnv::host, false},
    {"TRAINCTL_TASK_ADDR", &TaskEnv::task_addr, false},
};

// Written for torchrun's sake, never read back.
constexpr const char* kRunIdAlias = "TRAINCTL_RUN_ID";
constexpr const char* kUseAgentStore = "TORCHELASTIC_USE_AGENT_STORE";
// torch 2.x's torchrun names the signals its agent passes on to the workers (its
// --signals-to-handle default); trainctl's agent stops its workers on the same four.
constexpr const char* kSignalsToHandle = "TORCHELASTIC_SIGNALS_TO_HANDLE";
constexpr const char* kTty = "TRAINCTL_TTY";

}  // namespace

void TaskEnv::ApplyTo(std::vector<std::string>* env) const {
  for (const auto& v : kInts) SetEnv(env, v.name, std::to_string(this->*v.field));
  for (const auto& v : kStrings) {
    const std::string& value = this->*v.field;
    // An empty TF_CONFIG or task address means "none": leave it unset, as Kubeflow does.
    if (value.empty() &&
        (v.field == &TaskEnv::tf_config || v.field == &TaskEnv::task_addr || v.field == &TaskEnv::error_file)) {
      continue;
    }
    SetEnv(env, v.name, value);
  }
  SetEnv(env, kRunIdAlias, run_id);
  SetEnv(env, kUseAgentStore, "False");
  SetEnv(env, kSignalsToHandle, "SIGTERM,SIGINT,SIGHUP,SIGQUIT");
  if (tty) SetEnv(env, kTty, "1");
}

Result<TaskEnv> TaskEnv::FromEnv(const std::vector<std::string>& env) {
  TaskEnv t;
  for (const auto& v : kInts) {
    auto value = GetEnv(env, v.name);
    if (!value) {
      if (v.required) return InvalidArgument(std::string(v.name) + " is not set");
      continue;
    }
    int n = 0;
    auto [end, ec] = std::from_chars(value->data(), value->data() + value->size(), n);
    if (value->empty() || ec != std::errc() || end != value->data() + value->size()) {
      return InvalidArgument(std::string(v.name) + "=" + *value + ": expected a whole number");
    }
    t.*v.field = n;
  }
  for (const auto& v : kStrings) {
    auto value = GetEnv(env, v.name);
    if (!value) {
      if (v.required) return InvalidArgument(std::string(v.name) + " is not set");
      continue;
    }
    t.*v.field = *value;
  }
  t.tty = GetEnv(env, kTty).value_or("") == "1";
  if (t.rank < 0 || t.world_size < 1 || t.rank >= t.world_size) {
    return InvalidArgument("RANK=" + std::to_string(t.rank) + " and WORLD_SIZE=" + std::to_string(t.world_size) +
                           " do not fit together");
  }
  return t;
}

Result<TaskEnv> TaskEnv::FromProcess() { return FromEnv(CurrentEnvironment()); }

const std::vector<std::string>& ReservedEnvNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& v : kInts) out.push_back(v.name);
    for (const auto& v : kStrings) out.push_back(v.name);
    out.push_back(kUseAgentStore);
    out.push_back(kSignalsToHandle);
    return out;
  }();
  return names;
}

bool IsReservedEnvName(const std::string& name) {
  const auto& names = ReservedEnvNames();
  return name.rfind("TRAINCTL_", 0) == 0 || std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace trainctl
