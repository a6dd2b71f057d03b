// Rendezvous: agents meet in numbered rounds on a Store and get their node (group) ranks.
//
// Round r's state is one JSON value under "round/<r>/state":
//   {"v": version, "restarts": k, "closed": bool, "nodes": [{"id": "host:pid", "hint": n}, ...]}
// and it only ever changes by compare-and-set from the exact value read, so two agents can never
// both believe they added the last node or closed the round. A round closes
//   - at once when max nodes have joined (the join that makes it full closes it), or
//   - `last_call` after an agent first saw at least min nodes in it (any agent may close it then).
// When it closes, ranks are assigned deterministically and contiguously: nodes with a rank hint
// (the launcher's node index) first, by hint, then the others in the order they joined.
//
// An agent that finds a round closed without it is not in that round: it waits for the round to
// end (see the agent) and joins the next one. That is how a node joins a running job (scale-up).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/duration.h"
#include "store/store.h"

namespace trainctl {

struct RendezvousOptions {
  int min_nodes = 1;
  int max_nodes = 1;
  Duration last_call = std::chrono::seconds(3);
  Duration timeout = std::chrono::minutes(5);  // the whole join, from the first call
  int rank_hint = -1;       // the launcher's node index (Slurm, Kubernetes); -1: none
  std::string node_id;      // "host:pid", unique per agent; shown in errors
  Duration poll = std::chrono::milliseconds(100);
  // Called between short waits; a non-ok status ends the join with that status (a stop request).
  std::function<Status()> check;
};

struct RoundInfo {
  int round = 0;
  int restarts = 0;              // the job's restarts before this round (from the round's state)
  int group_rank = 0;
  int group_world_size = 1;
  bool closed = true;              // false only from PeekRound of an open round
  std::vector<std::string> nodes;  // node ids: by group rank once closed, else by arrival
};

// Joins round `round`, creating its state with `restarts` if this agent is the first.
// Returns the round once it is closed with this agent in it, or std::nullopt when it closed
// without this agent (it was full). Errors: kTimeout when fewer than min nodes joined in time,
// naming who joined and the missing hinted ranks; kInvalidArgument when the hint is out of range
// or taken by another node; kAborted (or whatever `check` returned) on a stop.
Result<std::optional<RoundInfo>> JoinRound(Store& store, int round, int restarts,
                                           const RendezvousOptions& options);

// Reads round `round`'s state without joining: nullopt when no agent has joined it yet.
// The info's group_rank is -1 (the reader is not in it).
Result<std::optional<RoundInfo>> PeekRound(Store& store, int round);

// The newest round that any agent has closed ("round/current"); 0 when none has.
Result<int> CurrentRound(Store& store);

}  // namespace trainctl
