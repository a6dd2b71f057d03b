// Rendezvous: agents meet in numbered rounds on a Store and get their node (group) ranks.
// Round r lives under "round/<r>/" in the job's key space: a join counter, one claim key per
// node rank (compare-and-set, so two agents can never hold the same rank), and a "closed" key
// set by the agent that completes the round.
//
// This is the fixed-size policy: a round closes when `nnodes` agents have joined. Elastic
// policies (min/max with a last-call window, scale-up at round boundaries) build on the same keys.
#pragma once

#include <functional>
#include <string>

#include "common/duration.h"
#include "store/store.h"

namespace trainctl {

struct RendezvousOptions {
  int nnodes = 1;
  Duration timeout = std::chrono::minutes(5);  // the whole join, from the first call
  int node_rank = -1;      // a fixed rank (launcher, Slurm, Kubernetes index); -1: by arrival
  std::string node_id;     // "host:pid", shown in errors and kept under the claim key
  // Called between short waits; a non-ok status ends the join with that status (a stop request).
  std::function<Status()> check;
};

struct RoundInfo {
  int round = 0;
  int group_rank = 0;
  int group_world_size = 1;
};

// Joins round `round`. Errors: kTimeout naming the node ranks that did not join in time;
// kInvalidArgument when the rank is taken or the round is already full.
Result<RoundInfo> JoinRound(Store& store, int round, const RendezvousOptions& options);

}  // namespace trainctl
