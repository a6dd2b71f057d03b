#include "job/keys.h"

namespace trainctl::keys {
namespace {
std::string Round(int round, const char* what) { return "round/" + std::to_string(round) + "/" + what; }
}  // namespace

std::string RunPrefix(const std::string& run_id) { return "/trainctl/" + run_id + "/"; }
std::string RoundState(int round) { return Round(round, "state"); }
std::string RoundClosed(int round) { return Round(round, "closed"); }
std::string RoundJoined(int round) { return Round(round, "joined"); }
std::string RoundMember(int round, int slot) { return Round(round, "member/") + std::to_string(slot); }
std::string RoundHint(int round, int hint) { return Round(round, "hint/") + std::to_string(hint); }
std::string RoundRank(int round, int slot) { return Round(round, "rank/") + std::to_string(slot); }
std::string RoundEnd(int round) { return Round(round, "end"); }
std::string RoundRootCause(int round) { return Round(round, "root_cause"); }
std::string RoundSucceeded(int round) { return Round(round, "succeeded"); }
std::string RoundMaster(int round) { return Round(round, "master"); }
std::string RoundWaiting(int round) { return Round(round, "waiting"); }
std::string RoundHeartbeat(int round, int node) { return Round(round, "heartbeat/") + std::to_string(node); }
std::string RoundTaskAddrs(int round, int node) { return Round(round, "tasks/") + std::to_string(node); }
std::string CommPrefix(int round) { return "comm/" + std::to_string(round) + "/"; }

}  // namespace trainctl::keys
