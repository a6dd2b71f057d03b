#include "agent/failure.h"

#include <nlohmann/json.hpp>

namespace trainctl {

using nlohmann::json;

std::string FailureRecord::ToJson() const {
  return json{{"kind", kind},         {"round", round},       {"restarts", restarts},       {"node_rank", node_rank},
              {"host", host},         {"rank", rank},         {"local_rank", local_rank},
              {"pid", pid},           {"exit", exit},         {"log_path", log_path},
              {"last_lines", last_lines}}
      .dump();
}

Result<FailureRecord> FailureRecord::FromJson(const std::string& text) {
  try {
    json j = json::parse(text);
    FailureRecord r;
    r.kind = j.at("kind").get<std::string>();
    r.round = j.at("round").get<int>();
    r.restarts = j.at("restarts").get<int>();
    r.node_rank = j.at("node_rank").get<int>();
    r.host = j.at("host").get<std::string>();
    r.rank = j.at("rank").get<int>();
    r.local_rank = j.at("local_rank").get<int>();
    r.pid = j.at("pid").get<int>();
    r.exit = j.at("exit").get<std::string>();
    r.log_path = j.at("log_path").get<std::string>();
    r.last_lines = j.at("last_lines").get<std::vector<std::string>>();
    return r;
  } catch (const json::exception& e) {
    return Internal(std::string("malformed failure record: ") + e.what());
  }
}

std::string FailureRecord::Summary() const {
  std::string where = "node " + std::to_string(node_rank) + " on " + host + ", local rank " +
                      std::to_string(local_rank);
  if (kind == "node_lost") return "node " + std::to_string(node_rank) + " (" + host + ") was lost: " + exit;
  if (kind == "membership") return exit;
  if (kind == "start") {
    return "worker rank " + std::to_string(rank) + " (" + where + ") could not start: " + exit;
  }
  return "worker rank " + std::to_string(rank) + " (" + where + ", pid " + std::to_string(pid) +
         ") failed: " + exit;
}

std::string FailureRecord::Report() const {
  std::string out = Summary() + "\n";
  if (!log_path.empty()) out += "  log: " + log_path + "\n";
  if (!last_lines.empty()) {
    out += "  last " + std::to_string(last_lines.size()) + " lines of its output:\n";
    for (const auto& line : last_lines) out += "    | " + line + "\n";
  }
  return out;
}

}  // namespace trainctl
