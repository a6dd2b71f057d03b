#include "job/records.h"

#include <cstdint>
#include <nlohmann/json.hpp>

#include "common/json_field.h"
#include "common/strings.h"

namespace trainctl {

using nlohmann::json;

namespace {
constexpr std::pair<FailureKind, const char*> kKinds[] = {{FailureKind::kTask, "task"},
                                                          {FailureKind::kStart, "start"},
                                                          {FailureKind::kConfig, "config"},
                                                          {FailureKind::kNodeLost, "node_lost"},
                                                          {FailureKind::kMembership, "membership"},
                                                          {FailureKind::kSucceeded, "succeeded"}};
}  // namespace

const char* FailureKindName(FailureKind kind) {
  for (const auto& [k, name] : kKinds) {
    if (k == kind) return name;
  }
  return "task";
}

json FailureRecord::ToJsonValue() const {
  return json{{"kind", FailureKindName(kind)},
              {"round", round},
              {"restarts", restarts},
              {"final", final},
              {"node_rank", node_rank},
              {"host", host},
              {"rank", rank},
              {"local_rank", local_rank},
              {"role", role},
              {"task_index", task_index},
              {"pid", pid},
              {"exit", exit},
              {"log_path", log_path},
              {"last_lines", last_lines},
              {"error", error},
              {"traceback", traceback},
              {"error_time", error_time},
              {"error_time_ns", error_time_ns},
              {"exited_ns", exited_ns}};
}

std::string FailureRecord::ToJson() const { return ToJsonValue().dump(); }

FailureRecord FailureRecord::FromJsonValue(const json& j) {
  FailureRecord r;
  const std::string kind = JsonField(j, "kind", std::string("task"));
  for (const auto& [k, name] : kKinds) {
    if (kind == name) r.kind = k;
  }
  r.round = JsonField(j, "round", 0);
  r.restarts = JsonField(j, "restarts", 0);
  r.final = JsonField(j, "final", false);
  r.node_rank = JsonField(j, "node_rank", 0);
  r.host = JsonField(j, "host", std::string());
  r.rank = JsonField(j, "rank", -1);
  r.local_rank = JsonField(j, "local_rank", -1);
  r.role = JsonField(j, "role", std::string());
  r.task_index = JsonField(j, "task_index", -1);
  r.pid = JsonField(j, "pid", 0);
  r.exit = JsonField(j, "exit", std::string());
  r.log_path = JsonField(j, "log_path", std::string());
  if (auto it = j.find("last_lines"); it != j.end() && it->is_array()) {
    for (const auto& line : *it) {
      if (line.is_string()) r.last_lines.push_back(line.get<std::string>());
    }
  }
  r.error = JsonField(j, "error", std::string());
  r.traceback = JsonField(j, "traceback", std::string());
  r.error_time = JsonField(j, "error_time", int64_t{0});
  r.error_time_ns = JsonField(j, "error_time_ns", int64_t{0});
  r.exited_ns = JsonField(j, "exited_ns", int64_t{0});
  return r;
}

Result<FailureRecord> FailureRecord::FromJson(const std::string& text) {
  const json j = json::parse(text, nullptr, false);
  if (!j.is_object()) return Internal("malformed failure record: not a JSON object");
  // The fields every version has written; the error file's are optional.
  for (const char* key : {"kind", "round", "restarts", "final", "node_rank", "host", "rank", "local_rank", "role",
                          "task_index", "pid", "exit", "log_path", "last_lines"}) {
    if (!j.contains(key)) return Internal(std::string("malformed failure record: no ") + key);
  }
  const std::string kind = JsonField(j, "kind", std::string());
  bool known = false;
  for (const auto& [k, name] : kKinds) known = known || kind == name;
  if (!known) return Internal("malformed failure record: unknown kind " + kind);
  return FromJsonValue(j);
}

bool FailureRecord::Before(const FailureRecord& o) const {
  auto when = [](const FailureRecord& r) {
    return r.error_time_ns > 0 ? r.error_time_ns : r.error_time * 1'000'000'000;
  };
  if (when(*this) != when(o)) return when(*this) < when(o);
  auto seen = [](const FailureRecord& r) { return r.exited_ns > 0 ? r.exited_ns : INT64_MAX; };
  if (seen(*this) != seen(o)) return seen(*this) < seen(o);
  return rank < o.rank;
}

std::string FailureRecord::Summary() const {
  const std::string task = role + " " + std::to_string(task_index);
  const std::string where = "rank " + std::to_string(rank) + ", node " + std::to_string(node_rank) + " on " + host +
                            ", local rank " + std::to_string(local_rank);
  switch (kind) {
    case FailureKind::kNodeLost:
      return "node " + std::to_string(node_rank) + " (" + host + ") was lost: " + exit;
    case FailureKind::kMembership:
    case FailureKind::kSucceeded:
      return exit;
    case FailureKind::kStart:
      return task + " (" + where + ") could not start: " + exit;
    case FailureKind::kConfig:
      return task + " (" + where + ", pid " + std::to_string(pid) +
             ") failed with an error no restart can fix: " + exit;
    case FailureKind::kTask:
      break;
  }
  return task + " (" + where + (pid > 0 ? ", pid " + std::to_string(pid) : "") + ") failed: " + exit;
}

std::string FailureRecord::Report() const {
  std::string out = Summary() + "\n";
  if (!error.empty()) out += "  error: " + error + "\n";
  if (!log_path.empty()) out += "  log: " + log_path + "\n";
  if (!traceback.empty()) {  // the program's own account: its traceback, not the output's tail
    out += "  traceback (from its error file):\n";
    for (const auto& line : SplitLines(traceback)) out += "    | " + line + "\n";
  } else if (!last_lines.empty()) {
    out += "  last " + std::to_string(last_lines.size()) + " lines of its output:\n";
    for (const auto& line : last_lines) out += "    | " + line + "\n";
  }
  return out;
}

std::string StopRecord::ToJson() const { return json{{"reason", reason}, {"code", code}}.dump(); }

bool StopRecord::FromJson(const std::string& text, StopRecord* out) {
  try {
    auto j = json::parse(text);
    out->reason = j.at("reason").get<std::string>();
    out->code = j.at("code").get<int>();
    return true;
  } catch (const json::exception&) {
    return false;
  }
}

}  // namespace trainctl
