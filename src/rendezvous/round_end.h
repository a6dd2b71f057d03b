// The end of a round, the other half of its life (rendezvous.h is the join and the close).
//
// A round ends for every node at once: whoever first sees why (an agent whose task failed or
// whose tasks completed the job's success, the agent watching a node that went silent, the local
// launcher that saw an agent die, group rank 0 admitting waiting nodes) records it by
// compare-and-set under round/<r>/end (job/records.h); the first record wins and every agent acts
// on it. The job's restart budget is computed here and nowhere else: the count travels in the
// round's state and end record, so a node that leaves and rejoins cannot reset it.
#pragma once

#include <string>

#include "job/records.h"
#include "store/store.h"

namespace trainctl {

// restart.max_restarts: how many rounds may end in a failure (and, counted apart, how many
// single-task restarts roles with on_failure: restart_task may spend) before the job fails.
struct RestartBudget {
  int max_restarts = 0;
  // Whether the job ends with a round that ended so: a failure that is final (a configuration
  // error, task restarts spent) or one past the budget. Success and membership changes spend none.
  bool Spent(const FailureRecord& end) const { return end.failure() && (end.final || end.restarts > max_restarts); }
  // The restarts the job has done once `end` is recorded (what status.json reports).
  int Done(const FailureRecord& end) const {
    return end.final || end.restarts < max_restarts ? end.restarts : max_restarts;
  }
  // Whether the job's `n`-th restart of one task (on_failure: restart_task) or of one node's agent
  // by the local launcher, counted from 1, is within the budget.
  bool RestartFits(int n) const { return n <= max_restarts; }
  // The restarts of single tasks to report once `counted` were taken (the count may run past it).
  int TaskRestartsDone(int counted) const { return counted < max_restarts ? counted : max_restarts; }
};

// Records why round `round` ended, unless someone already did, and for a failure the job's last
// failure and restarts done; returns the record that won, and in `won` whether it was `rec`.
Result<FailureRecord> EndRound(Store& store, int round, const FailureRecord& rec, const RestartBudget& budget,
                               bool* won);

// The newest round that has closed; -1 when none has (round 0 is still open) or the store cannot say.
int NewestClosedRound(Store& store);

// A node whose agent died (a local launcher saw it), while its round is seen to.
struct LostNode {
  std::string id;    // its node id in the rounds (host:pid)
  std::string exit;  // "signal 9 (SIGKILL)"
  int seen_round;    // NewestClosedRound when it died (-1: none): it is in that round or the next
};
struct LostRound {
  bool settled = false;       // its round has ended (or a round after it closed without it)
  bool budget_spent = false;  // and that end leaves no restart: the job ends with it
};
// Ends the newest round if `lost` is a member and it has not ended yet, as its peers would once
// they missed its heartbeat (timeouts.heartbeat later); that spends a restart, as any lost node
// does. An agent that died while joining is in no closed round yet: not settled, look again.
Result<LostRound> EndRoundOfLostNode(Store& store, const LostNode& lost, const RestartBudget& budget);

}  // namespace trainctl
