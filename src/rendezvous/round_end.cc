#include "rendezvous/round_end.h"

#include <algorithm>

#include "job/keys.h"
#include "rendezvous/rendezvous.h"

namespace trainctl {

Result<FailureRecord> EndRound(Store& store, int round, const FailureRecord& rec, const RestartBudget& budget,
                               bool* won) {
  const std::string json = rec.ToJson();
  ASSIGN_OR_RETURN(std::string now, store.CompareSet(keys::RoundEnd(round), "", json));
  *won = now == json;
  if (*won && rec.failure()) {
    RETURN_IF_ERROR(store.Set(keys::kLastFailure, json));
    RETURN_IF_ERROR(store.Set(keys::kRestarts, std::to_string(budget.Done(rec))));
  }
  return FailureRecord::FromJson(now);
}

int NewestClosedRound(Store& store) {
  auto round = CurrentRound(store);
  if (!round.ok()) return -1;
  auto info = PeekRound(store, *round);
  return info.ok() && info->has_value() && (*info)->closed ? *round : *round - 1;
}

Result<LostRound> EndRoundOfLostNode(Store& store, const LostNode& lost, const RestartBudget& budget) {
  ASSIGN_OR_RETURN(int round, CurrentRound(store));
  ASSIGN_OR_RETURN(auto info, PeekRound(store, round));
  LostRound out;
  if (!info || !info->closed) return out;
  auto member = std::find(info->nodes.begin(), info->nodes.end(), lost.id);
  if (member == info->nodes.end()) {
    out.settled = round > lost.seen_round;
    return out;
  }
  FailureRecord rec;
  rec.kind = FailureKind::kNodeLost;
  rec.round = round;
  rec.restarts = info->restarts + 1;
  rec.node_rank = static_cast<int>(member - info->nodes.begin());
  rec.host = lost.id;
  rec.exit = "its agent died: " + lost.exit;
  bool won = false;
  ASSIGN_OR_RETURN(FailureRecord end, EndRound(store, round, rec, budget, &won));
  // A round that had ended already (the agent died on its way to the next one) leaves it to that
  // next round, unless that one closed too.
  out.settled = won || round > lost.seen_round;
  out.budget_spent = budget.Spent(end);
  return out;
}

}  // namespace trainctl
