// Rendezvous: agents meet in numbered rounds on a Store and get their node (group) ranks.
//
// Joining round r is an atomic add to "round/<r>/joined": the count it returns, less one, is the
// joiner's slot, and the joiner records itself under "round/<r>/member/<slot>" ({"id": "host:pid",
// "hint": n, "restarts": k}). A rank hint is claimed first, by compare-and-set of
// "round/<r>/hint/<n>", so two nodes can never hold the same one. No join rewrites anything
// another joiner wrote: a join costs the store three small operations whatever the round's size.
// A round closes
//   - at once when max nodes have joined (the joiner of the last slot closes it), or
//   - `last_call` after an agent first saw at least min nodes joined (the first joiner closes it
//     then, with the slots taken by then; any other two seconds later, should it have died; a slot
//     taken but not filled within a second, its agent dead, is left out).
// Closing writes the round's state once, by compare-and-set from nothing, so exactly one closer
// wins: "round/<r>/state" = {"v": 1, "restarts": k, "closed": true, "nodes": [{"id", "hint"}...]}
// with the nodes in rank order: nodes with a rank hint (the launcher's node index) first, by hint,
// then the others in the order they joined; the restart count is the first joiner's. The winner
// then gives each slot in the round its rank ("round/<r>/rank/<slot>" = "<rank> <world size>
// <restarts>"), which that slot's member waits on (one small value, not the state of all of
// them), and sets "round/<r>/closed" = "<world size> <restarts>", which wakes the others.
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
  int rank_hint = -1;                          // the launcher's node index (Slurm, Kubernetes); -1: none
  std::string node_id;                         // "host:pid", unique per agent (NodeId); shown in errors
  // The ids of the dead agents that this one replaces (a local launcher starts a killed node's
  // agent again, and that one may be killed in turn): a rank hint one of them still holds in an
  // unfinished round is no conflict; this agent waits for that round's end instead, as a node
  // that found it full.
  std::vector<std::string> replaces;
  Duration poll = std::chrono::milliseconds(100);  // an elastic round's count, read this often
  // Called between waits for the round to close, at least this often; a non-ok status ends the
  // join with that status (a stop request). The wait itself ends as the round closes, as one of
  // `interrupt_keys` is set (the agent's stop key: check() is asked at once), or as the store's
  // wait is interrupted (kAborted: a stop signal; check() is asked too).
  std::function<Status()> check;
  Duration check_every = std::chrono::milliseconds(500);
  std::vector<std::string> interrupt_keys;
  // The clock the round's deadlines and windows are on, and the wait for one of several keys to
  // be set (the first set, by index, and its value; or kTimeout): the agent's
  // (agent/agent_env.h), whose tests move a clock of their own. Unset: the steady clock, and the
  // store's own WaitAny.
  std::function<Clock::time_point()> now;
  std::function<Result<std::pair<size_t, std::string>>(Store&, const std::vector<std::string>& keys, Duration timeout)>
      wait_for_any;
};

struct RoundInfo {
  int round = 0;
  int restarts = 0;  // the job's restarts before this round (from the round's state)
  int group_rank = 0;
  int group_world_size = 1;
  bool closed = true;  // false only from PeekRound of an open round
  // Node ids: by group rank once closed, else by arrival. PeekRound fills it; JoinRound leaves
  // it empty (a thousand agents each reading every id is what made rounds slow): RoundNodeId.
  std::vector<std::string> nodes;
};

// An agent's id in the rounds: "host:pid", or "host/address:pid" when its peers reach it at
// `host`, an address other than loopback.
std::string NodeId(const std::string& host, long pid);

// Joins round `round`, creating its state with `restarts` if this agent is the first.
// Returns the round once it is closed with this agent in it, or std::nullopt when it closed
// without this agent (it was full, or an agent it replaces holds its rank hint). Errors: kTimeout
// when fewer than min nodes joined in time, naming who joined and the missing hinted ranks;
// kInvalidArgument when the hint is out of range or taken by another node; kAborted (or whatever
// `check` returned) on a stop.
Result<std::optional<RoundInfo>> JoinRound(Store& store, int round, int restarts, const RendezvousOptions& options);

// Reads round `round`'s state without joining: nullopt when no agent has joined it yet.
// The info's group_rank is -1 (the reader is not in it).
Result<std::optional<RoundInfo>> PeekRound(Store& store, int round);

// The id (host:pid) of the node with group rank `rank` in closed round `round`.
Result<std::string> RoundNodeId(Store& store, int round, int rank);

// The newest round that any agent has closed ("round/current"); 0 when none has.
Result<int> CurrentRound(Store& store);

}  // namespace trainctl
