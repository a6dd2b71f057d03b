#include "rendezvous/rendezvous.h"

#include "common/strings.h"

namespace trainctl {
namespace {

std::string RoundKey(int round, const std::string& leaf) {
  return "round/" + std::to_string(round) + "/" + leaf;
}

}  // namespace

Result<RoundInfo> JoinRound(Store& store, int round, const RendezvousOptions& o) {
  auto deadline = Clock::now() + o.timeout;
  RoundInfo info;
  info.round = round;
  info.group_world_size = o.nnodes;
  if (o.node_rank >= o.nnodes) {
    return InvalidArgument("node rank " + std::to_string(o.node_rank) + " is out of range for " +
                           std::to_string(o.nnodes) + " nodes");
  }
  int rank = o.node_rank;
  if (rank < 0) {
    ASSIGN_OR_RETURN(int64_t arrived, store.Add(RoundKey(round, "arrivals"), 1));
    if (arrived > o.nnodes) {
      return InvalidArgument("rendezvous round " + std::to_string(round) + " already has all " +
                             std::to_string(o.nnodes) + " nodes");
    }
    rank = static_cast<int>(arrived - 1);
  }
  std::string claim_key = RoundKey(round, "node/" + std::to_string(rank));
  ASSIGN_OR_RETURN(std::string holder, store.CompareSet(claim_key, "", o.node_id));
  if (holder != o.node_id) {
    return InvalidArgument("node rank " + std::to_string(rank) + " in round " +
                           std::to_string(round) + " is already taken by " + holder);
  }
  info.group_rank = rank;
  ASSIGN_OR_RETURN(int64_t joined, store.Add(RoundKey(round, "joined"), 1));
  if (joined == o.nnodes) {
    RETURN_IF_ERROR(store.Set(RoundKey(round, "closed"), "1"));
    return info;
  }
  Status waited;
  do {
    if (o.check) RETURN_IF_ERROR(o.check());
    waited = store.Wait({RoundKey(round, "closed")}, std::min(Remaining(deadline), Duration(200)));
    if (waited.ok()) return info;
    if (waited.code() != Code::kTimeout) return waited;
  } while (Clock::now() < deadline);
  std::vector<std::string> missing;
  for (int r = 0; r < o.nnodes && missing.size() < 16; ++r) {
    auto got = store.TryGet(RoundKey(round, "node/" + std::to_string(r)));
    if (got.ok() && !got->has_value()) missing.push_back(std::to_string(r));
  }
  auto now_joined = store.TryGet(RoundKey(round, "joined"));
  std::string count = now_joined.ok() && now_joined->has_value() ? **now_joined : "?";
  return Timeout("rendezvous round " + std::to_string(round) + ": " + count + " of " +
                 std::to_string(o.nnodes) + " nodes joined within " + FormatDuration(o.timeout) +
                 (missing.empty() ? "" : "; missing node rank(s) " + Join(missing, ", ")));
}

}  // namespace trainctl
