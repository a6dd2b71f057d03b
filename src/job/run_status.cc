#include "job/run_status.h"

#include "common/exit_codes.h"
#include "common/fs.h"
#include "common/json_field.h"
#include "job/paths.h"

namespace trainctl {

using nlohmann::json;

namespace {

// An integer field, or nothing when it is missing or of another type (two fallbacks agree only
// when the field holds the value).
std::optional<int> OptionalInt(const json& j, const char* key) {
  const int a = JsonField(j, key, 0);
  return a == JsonField(j, key, 1) ? std::optional<int>(a) : std::nullopt;
}

std::optional<FailureRecord> Record(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_object()) return std::nullopt;
  return FailureRecord::FromJsonValue(*it);
}

}  // namespace

json RunStatus::ToJson() const {
  json j = json::object();
  auto text = [&](const char* key, const std::string& v) {
    if (!v.empty()) j[key] = v;
  };
  text("job", job);
  text("run_id", run_id);
  if (state != RunState::kUnknown) j["state"] = RunStateName(state);
  if (pid > 0) j["pid"] = pid;
  if (started > 0) j["started"] = started;
  if (exit_code) j["exit_code"] = *exit_code;
  if (restarts) j["restarts"] = *restarts;
  text("elapsed", elapsed);
  if (task_restarts) j["task_restarts"] = *task_restarts;
  if (ignored_failures) j["ignored_failures"] = *ignored_failures;
  if (last_ignored_failure) j["last_ignored_failure"] = last_ignored_failure->ToJsonValue();
  if (failure) j["failure"] = failure->ToJsonValue();
  if (root_cause) j["root_cause"] = root_cause->ToJsonValue();
  text("store_error", store_error);
  return j;
}

RunStatus RunStatus::FromJson(const json& j) {
  RunStatus s;
  if (!j.is_object()) return s;
  s.job = JsonField(j, "job", std::string());
  s.run_id = JsonField(j, "run_id", std::string());
  s.state = ParseRunState(JsonField(j, "state", std::string()));
  s.pid = JsonField(j, "pid", int64_t{0});
  s.started = JsonField(j, "started", int64_t{0});
  s.exit_code = OptionalInt(j, "exit_code");
  s.restarts = OptionalInt(j, "restarts");
  s.elapsed = JsonField(j, "elapsed", std::string());
  s.task_restarts = OptionalInt(j, "task_restarts");
  s.ignored_failures = OptionalInt(j, "ignored_failures");
  s.last_ignored_failure = Record(j, "last_ignored_failure");
  s.failure = Record(j, "failure");
  s.root_cause = Record(j, "root_cause");
  s.store_error = JsonField(j, "store_error", std::string());
  return s;
}

RunStatus RunStatus::Ended(std::string job, std::string run_id, int code, std::string elapsed) {
  RunStatus s;
  s.job = std::move(job);
  s.run_id = std::move(run_id);
  s.state = StateOfExit(code);
  s.exit_code = code;
  s.elapsed = std::move(elapsed);
  return s;
}

namespace {

constexpr std::pair<RunState, const char*> kStateNames[] = {
    {RunState::kUnknown, "unknown"},
    {RunState::kRunning, "running"},
    {RunState::kSucceeded, "succeeded"},
    {RunState::kFailed, "failed"},
    {RunState::kRendezvousTimeout, "rendezvous-timeout"},
    {RunState::kInterrupted, "interrupted"},
    {RunState::kTimedOut, "timed-out"},
    {RunState::kError, "error"},
    {RunState::kStarting, "starting"},
    {RunState::kLost, "lost"},
};

}  // namespace

const char* RunStateName(RunState state) {
  for (const auto& [s, name] : kStateNames) {
    if (s == state) return name;
  }
  return "unknown";
}

RunState ParseRunState(std::string_view name) {
  for (const auto& [s, n] : kStateNames) {
    if (n == name) return s;
  }
  return RunState::kUnknown;
}

bool JobFailed(RunState state) {
  return state == RunState::kFailed || state == RunState::kLost || state == RunState::kTimedOut ||
         state == RunState::kError;
}

RunState StateOfExit(int code) {
  switch (code) {
    case kExitOk:
      return RunState::kSucceeded;
    case kExitInvalidSpec:
    case kExitWorkerFailed:
      return RunState::kFailed;
    case kExitRendezvousTimeout:
      return RunState::kRendezvousTimeout;
    case kExitInterrupted:
      return RunState::kInterrupted;
    case kExitJobTimeout:
      return RunState::kTimedOut;
    default:
      return RunState::kError;
  }
}

RunStatus ReadRunStatus(const std::string& output_dir) {
  auto text = ReadFile(paths::StatusJson(output_dir), 1 << 20);
  return RunStatus::FromJson(text.ok() ? json::parse(*text, nullptr, false) : json());
}

Status WriteRunStatus(const std::string& output_dir, const RunStatus& status) {
  const std::string path = paths::StatusJson(output_dir);
  const Status st = AtomicWriteFile(path, status.ToJson().dump(2) + "\n");
  if (st.ok() || status.state == RunState::kRunning) return st;
  RunStatus brief;  // the state as written, not derived again from the code
  brief.job = status.job;
  brief.run_id = status.run_id;
  brief.state = status.state;
  brief.exit_code = status.exit_code;
  const Status over = OverwriteFile(path, brief.ToJson().dump() + "\n");
  return Status(st.code(),
                st.message() + "; " + (over.ok() ? "wrote its short form over the old one" : over.message()));
}

}  // namespace trainctl
