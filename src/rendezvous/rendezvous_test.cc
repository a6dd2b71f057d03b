#include "rendezvous/rendezvous.h"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>

#include "job/keys.h"
#include "rendezvous/round_end.h"
#include "store/etcd/etcd_store.h"
#include "store/memory/memory_store.h"
#include "store/tcp/tcp_store.h"
#include "tests/etcd_server.h"

namespace trainctl {
namespace {

using namespace std::chrono_literals;

RendezvousOptions Opts(int min, int max, int hint, const std::string& id) {
  RendezvousOptions o;
  o.min_nodes = min;
  o.max_nodes = max;
  o.rank_hint = hint;
  o.node_id = id;
  o.timeout = 10s;
  o.last_call = 10min;  // tests that want a last call set it
  o.poll = 20ms;
  return o;
}

// Joins from one thread per node; returns each node's result.
std::vector<Result<std::optional<RoundInfo>>> JoinAll(Store& store, int round,
                                                      const std::vector<RendezvousOptions>& opts) {
  std::vector<Result<std::optional<RoundInfo>>> out(opts.size(), Internal("not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < opts.size(); ++i) {
    threads.emplace_back([&, i] { out[i] = JoinRound(store, round, 0, opts[i]); });
  }
  for (auto& t : threads) t.join();
  return out;
}

void ExpectDistinctContiguousRanks(Store& store, int nodes) {
  std::vector<RendezvousOptions> opts;
  for (int i = 0; i < nodes; ++i) opts.push_back(Opts(nodes, nodes, -1, "node" + std::to_string(i)));
  auto results = JoinAll(store, 0, opts);
  auto state = PeekRound(store, 0);
  ASSERT_TRUE(state.ok() && state->has_value());
  ASSERT_EQ(static_cast<int>((*state)->nodes.size()), nodes);
  std::set<int> ranks;
  for (int i = 0; i < nodes; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status().ToString();
    ASSERT_TRUE(results[i]->has_value());
    const RoundInfo& info = **results[i];
    EXPECT_EQ(info.group_world_size, nodes);
    ranks.insert(info.group_rank);
    // The round's state has each node's own id at its rank.
    EXPECT_EQ((*state)->nodes[info.group_rank], "node" + std::to_string(i));
    EXPECT_EQ(*RoundNodeId(store, 0, info.group_rank), "node" + std::to_string(i));
  }
  EXPECT_EQ(static_cast<int>(ranks.size()), nodes);
  EXPECT_EQ(*ranks.begin(), 0);
  EXPECT_EQ(*ranks.rbegin(), nodes - 1);
}

TEST(Rendezvous, ArrivingNodesGetDistinctContiguousRanks) {
  MemoryStore store;
  ExpectDistinctContiguousRanks(store, 6);
}

TEST(Rendezvous, ArrivingNodesGetDistinctContiguousRanksOnEtcd) {
  EtcdStoreOptions o;
  o.endpoints = testing::SharedEtcd().endpoints();
  auto etcd = EtcdStore::Connect(o);
  ASSERT_TRUE(etcd.ok()) << etcd.status().ToString();
  PrefixStore store(etcd->get(), "/rendezvous-test/" + std::to_string(::getpid()) + "/");
  ExpectDistinctContiguousRanks(store, 4);
}

// The scale path at a size CI affords (bench/store_scale.cc runs 1024 and 4096): 256 agents, each
// with its own connection to the real embedded store server, in one fixed-size round and then in
// an elastic one that a last call closes.
TEST(Rendezvous, TwoHundredFiftySixAgentsOverTheRealTcpStore) {
  constexpr int kAgents = 256;
  TcpStoreServerOptions so;
  so.token = "t";
  so.max_connections = kAgents + 8;
  auto server = TcpStoreServer::Start(so);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  std::vector<std::unique_ptr<TcpStore>> clients;
  for (int i = 0; i < kAgents; ++i) {
    TcpStoreOptions co;
    co.port = (*server)->port();
    co.token = "t";
    auto c = TcpStore::Connect(co);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    clients.push_back(std::move(*c));
  }
  for (int round = 0; round < 2; ++round) {
    std::vector<Result<std::optional<RoundInfo>>> out(kAgents, Internal("not run"));
    std::vector<std::thread> threads;
    for (int i = 0; i < kAgents; ++i) {
      threads.emplace_back([&, i] {
        // Round 1: elastic, up to twice as many nodes: a last call closes it with those here.
        auto o = round == 0 ? Opts(kAgents, kAgents, -1, "n" + std::to_string(i))
                            : Opts(kAgents / 2, kAgents * 2, -1, "n" + std::to_string(i));
        o.timeout = 60s;
        o.last_call = 500ms;
        o.poll = 100ms;  // the agents' own
        out[i] = JoinRound(*clients[i], round, round, o);
      });
    }
    for (auto& t : threads) t.join();
    auto state = PeekRound(*clients[0], round);
    ASSERT_TRUE(state.ok() && state->has_value());
    const int world = static_cast<int>((*state)->nodes.size());
    std::set<int> ranks;
    int in = 0;
    for (int i = 0; i < kAgents; ++i) {
      ASSERT_TRUE(out[i].ok()) << out[i].status().ToString();
      if (!out[i]->has_value()) continue;  // the elastic round may close before a late thread
      ++in;
      EXPECT_EQ((**out[i]).group_world_size, world);
      EXPECT_EQ((**out[i]).restarts, round);
      EXPECT_EQ((*state)->nodes[(**out[i]).group_rank], "n" + std::to_string(i));
      ranks.insert((**out[i]).group_rank);
    }
    EXPECT_EQ(in, world);
    EXPECT_EQ(static_cast<int>(ranks.size()), world);
    EXPECT_EQ(*ranks.rbegin(), world - 1);
    EXPECT_GE(world, round == 0 ? kAgents : kAgents / 2);
  }
}

TEST(Rendezvous, HintsOrderTheRanksAndCannotBeTakenTwice) {
  MemoryStore store;
  auto results = JoinAll(store, 0, {Opts(3, 3, 2, "c"), Opts(3, 3, -1, "x"), Opts(3, 3, 0, "a")});
  for (auto& r : results) ASSERT_TRUE(r.ok() && r->has_value()) << r.status().ToString();
  EXPECT_EQ((*results[2])->group_rank, 0);
  EXPECT_EQ((*results[0])->group_rank, 1);  // hinted nodes first, by hint; ranks stay contiguous
  EXPECT_EQ((*results[1])->group_rank, 2);

  std::thread other([&] { EXPECT_TRUE(JoinRound(store, 1, 0, Opts(2, 2, 1, "b")).ok()); });
  ASSERT_TRUE(testing::Eventually([&] {
    auto peek = PeekRound(store, 1);
    return peek.ok() && peek->has_value();
  }));
  auto dup = JoinRound(store, 1, 0, Opts(2, 2, 1, "c"));
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("already taken by b"), std::string::npos) << dup.status().message();
  EXPECT_TRUE(JoinRound(store, 1, 0, Opts(2, 2, 0, "a")).ok());
  other.join();
  EXPECT_FALSE(JoinRound(store, 2, 0, Opts(2, 2, 2, "d")).ok());  // out of range
}

// Issue 71's flake (one run in 510): a store whose WaitAny reads its keys one by one (the memory
// store's) can read a member's rank before the closer's batch and the closed key after it; the
// member then took the round as closed without it. Forced here: the first member's wait reads its
// rank, lets the round close, then reads the closed key.
TEST(Rendezvous, AMemberThatSeesTheCloseBeforeItsRankIsStillInTheRound) {
  MemoryStore store;
  RendezvousOptions first = Opts(2, 2, -1, "first");
  std::atomic<int> straddled{0};
  first.wait_for_any = [&](Store& s, const std::vector<std::string>& keys,
                           Duration timeout) -> Result<std::pair<size_t, std::string>> {
    ASSIGN_OR_RETURN(auto rank, s.TryGet(keys[0]));
    if (rank) return std::make_pair(size_t{0}, *rank);
    ASSIGN_OR_RETURN(auto closed, s.WaitAny({keys[1]}, timeout));
    ++straddled;
    return std::make_pair(size_t{1}, closed.second);
  };
  std::vector<Result<std::optional<RoundInfo>>> results(2, Internal("not run"));
  std::thread waiting([&] { results[0] = JoinRound(store, 0, 0, first); });  // slot 0: it waits
  ASSERT_TRUE(testing::Eventually([&] {
    auto peek = PeekRound(store, 0);
    return peek.ok() && peek->has_value();
  }));
  results[1] = JoinRound(store, 0, 0, Opts(2, 2, -1, "second"));  // slot 1: it closes the round
  waiting.join();
  ASSERT_GE(straddled.load(), 1) << "the interleaving was not forced";
  for (auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(r->has_value()) << "a member of the round was told it was left out";
  }
  EXPECT_NE((*results[0])->group_rank, (*results[1])->group_rank);
}

// A local launcher starts a killed agent again with the dead one's id: the rank the dead agent
// still holds in an open round is no conflict for its replacement, which sits that round out;
// anyone else claiming it is still refused.
TEST(Rendezvous, AnAgentReplacingADeadOneSitsOutTheRoundWhereTheDeadOneHoldsItsRank) {
  MemoryStore store;
  std::thread dead([&] { EXPECT_TRUE(JoinRound(store, 0, 0, Opts(2, 2, 1, "host:41")).ok()); });
  ASSERT_TRUE(testing::Eventually([&] {
    auto peek = PeekRound(store, 0);
    return peek.ok() && peek->has_value();
  }));
  RendezvousOptions replacement = Opts(2, 2, 1, "host:42");
  auto dup = JoinRound(store, 0, 0, replacement);
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("already taken by host:41"), std::string::npos) << dup.status().message();
  replacement.replaces = {"host:39", "host:41"};  // a replacement of a replacement knows both
  auto out = JoinRound(store, 0, 0, replacement);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_FALSE(out->has_value());  // not in round 0: it joins the next
  EXPECT_TRUE(JoinRound(store, 0, 0, Opts(2, 2, 0, "host:40")).ok());
  dead.join();
  auto next = JoinAll(store, 1, {Opts(2, 2, 0, "host:40"), replacement});
  for (auto& r : next) ASSERT_TRUE(r.ok() && r->has_value()) << r.status().ToString();
  EXPECT_EQ((*next[1])->group_rank, 1);
}

TEST(Rendezvous, ARoundClosesAtOnceWhenMaxNodesJoin) {
  MemoryStore store;
  auto start = Clock::now();
  auto results = JoinAll(store, 0, {Opts(1, 2, -1, "a"), Opts(1, 2, -1, "b")});  // last call 10 min
  EXPECT_LT(Clock::now() - start, 5s);
  for (auto& r : results) {
    ASSERT_TRUE(r.ok() && r->has_value()) << r.status().ToString();
    EXPECT_EQ((*r)->group_world_size, 2);
  }
}

TEST(Rendezvous, LastCallClosesTheRoundWithFewerThanMaxNodes) {
  MemoryStore store;
  auto o = Opts(1, 3, -1, "a");
  o.last_call = 300ms;
  auto start = Clock::now();
  auto r = JoinRound(store, 0, 0, o);
  auto took = Clock::now() - start;
  ASSERT_TRUE(r.ok() && r->has_value()) << r.status().ToString();
  EXPECT_EQ((*r)->group_world_size, 1);
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 5s);
  EXPECT_EQ(*CurrentRound(store), 0);

  // A node that comes later finds the round closed without it: it is not in this round.
  auto late = JoinRound(store, 0, 0, Opts(1, 3, -1, "b"));
  ASSERT_TRUE(late.ok()) << late.status().ToString();
  EXPECT_FALSE(late->has_value());
  auto peek = PeekRound(store, 0);
  ASSERT_TRUE(peek.ok() && peek->has_value());
  EXPECT_EQ((*peek)->nodes, std::vector<std::string>{"a"});
}

// An agent that dies between taking a slot and filling it: an elastic round closes without it
// after a second; a fixed-size round cannot, and its timeout names the slot.
TEST(Rendezvous, ASlotTakenAndNeverFilledDoesNotHoldUpAnElasticRound) {
  MemoryStore store;
  ASSERT_TRUE(store.Add("round/0/joined", 1).ok());  // slot 0, and no record: the dead agent
  auto o = Opts(1, 3, -1, "a");
  o.last_call = 200ms;
  o.timeout = 60s;
  auto start = Clock::now();
  auto r = JoinRound(store, 0, 0, o);
  ASSERT_TRUE(r.ok() && r->has_value()) << r.status().ToString();
  EXPECT_EQ((*r)->group_world_size, 1);
  EXPECT_EQ((*r)->group_rank, 0);
  EXPECT_LT(Clock::now() - start, 15s);  // the last call, the first joiner's two seconds, one for the slot

  ASSERT_TRUE(store.Add("round/1/joined", 1).ok());
  auto fixed = Opts(2, 2, -1, "a");
  fixed.timeout = 500ms;
  auto f = JoinRound(store, 1, 0, fixed);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), Code::kTimeout);
  EXPECT_NE(f.status().message().find("slot 0 was taken and never filled"), std::string::npos) << f.status().message();
}

TEST(Rendezvous, TheRoundKeepsTheRestartCountOfItsFirstJoiner) {
  MemoryStore store;
  std::thread first([&] {
    auto r = JoinRound(store, 3, 2, Opts(2, 2, -1, "a"));
    ASSERT_TRUE(r.ok() && r->has_value());
    EXPECT_EQ((*r)->restarts, 2);
  });
  ASSERT_TRUE(testing::Eventually([&] {
    auto peek = PeekRound(store, 3);
    return peek.ok() && peek->has_value();
  }));
  auto second = JoinRound(store, 3, 0, Opts(2, 2, -1, "b"));
  first.join();
  ASSERT_TRUE(second.ok() && second->has_value());
  EXPECT_EQ((*second)->restarts, 2);
  EXPECT_EQ(*CurrentRound(store), 3);
}

TEST(Rendezvous, TimeoutNamesWhoJoinedAndTheMissingNodes) {
  MemoryStore store;
  auto o = Opts(3, 3, 0, "host-a:12");
  o.timeout = 300ms;
  auto r = JoinRound(store, 0, 0, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kTimeout);
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("1 of 3 nodes joined"), std::string::npos) << m;
  EXPECT_NE(m.find("joined: host-a:12"), std::string::npos) << m;
  EXPECT_NE(m.find("missing node rank(s) 1, 2"), std::string::npos) << m;

  auto elastic = Opts(2, 4, -1, "b");
  elastic.timeout = 200ms;
  auto e = JoinRound(store, 1, 0, elastic);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("1 of at least 2 (max 4) nodes joined"), std::string::npos)
      << e.status().message();
}

TEST(Rendezvous, ACheckCanAbortTheWait) {
  MemoryStore store;
  auto o = Opts(2, 2, 0, "a");
  o.timeout = std::chrono::minutes(5);
  int calls = 0;
  o.check = [&calls] { return ++calls >= 3 ? Aborted("stop requested") : Status::Ok(); };
  auto start = Clock::now();
  auto r = JoinRound(store, 0, 0, o);
  EXPECT_EQ(r.status().code(), Code::kAborted);
  EXPECT_LT(Clock::now() - start, 5s);
}

TEST(Rendezvous, RoundsAreIndependent) {
  MemoryStore store;
  ASSERT_TRUE(JoinRound(store, 0, 0, Opts(1, 1, -1, "a")).ok());
  auto next = JoinRound(store, 1, 1, Opts(1, 1, -1, "a"));
  ASSERT_TRUE(next.ok() && next->has_value());
  EXPECT_EQ((*next)->round, 1);
  EXPECT_EQ((*next)->group_rank, 0);
  EXPECT_EQ((*next)->restarts, 1);
}

// A round ends once: the first record wins, and only a failure spends the budget and becomes the
// job's last failure. The budget is one rule for the agents and the launcher alike.
TEST(RoundEnd, TheFirstRecordWinsAndOnlyAFailureSpendsTheBudget) {
  MemoryStore store;
  const RestartBudget budget{2};
  FailureRecord membership;
  membership.kind = FailureKind::kMembership;
  membership.round = 0;
  membership.exit = "1 node(s) waiting to join";
  bool won = false;
  auto end = EndRound(store, 0, membership, budget, &won);
  ASSERT_TRUE(end.ok()) << end.status().ToString();
  EXPECT_TRUE(won);
  EXPECT_FALSE(*store.TryGet(keys::kRestarts));  // no restart spent
  FailureRecord failure;
  failure.kind = FailureKind::kTask;
  failure.round = 0;
  failure.restarts = 1;
  end = EndRound(store, 0, failure, budget, &won);  // too late: round 0 has ended
  ASSERT_TRUE(end.ok());
  EXPECT_FALSE(won);
  EXPECT_EQ(end->kind, FailureKind::kMembership);

  failure.round = 1;
  ASSERT_TRUE(EndRound(store, 1, failure, budget, &won).ok());
  EXPECT_TRUE(won);
  EXPECT_EQ(**store.TryGet(keys::kRestarts), "1");
  EXPECT_FALSE(budget.Spent(failure));
  failure.restarts = 3;  // past max_restarts: the job ends, and reports the 2 it did
  EXPECT_TRUE(budget.Spent(failure));
  EXPECT_EQ(budget.Done(failure), 2);
  failure.restarts = 0;
  failure.final = true;  // a configuration error: no restart, whatever is left
  EXPECT_TRUE(budget.Spent(failure));
  EXPECT_EQ(budget.Done(failure), 0);
  membership.restarts = 9;
  EXPECT_FALSE(budget.Spent(membership));
  EXPECT_TRUE(budget.RestartFits(2));
  EXPECT_FALSE(budget.RestartFits(3));
  EXPECT_EQ(budget.TaskRestartsDone(1), 1);
  EXPECT_EQ(budget.TaskRestartsDone(5), 2);  // counted past the budget by the task that was refused
}

// The launcher's part: an agent it saw die ends the round it is a member of (a lost node, one
// restart), and one that died before its round closed is looked at again later.
TEST(RoundEnd, ALostNodeEndsTheRoundItIsAMemberOf) {
  MemoryStore store;
  auto joined = JoinAll(store, 0, {Opts(2, 2, 0, "a:1"), Opts(2, 2, 1, "b:2")});
  ASSERT_TRUE(joined[0].ok() && joined[1].ok());
  EXPECT_EQ(NewestClosedRound(store), 0);
  auto outsider = EndRoundOfLostNode(store, {"c:3", "signal 9 (SIGKILL)", 0}, RestartBudget{1});
  ASSERT_TRUE(outsider.ok());
  EXPECT_FALSE(outsider->settled);  // not a member of round 0: it would be in round 1
  auto lost = EndRoundOfLostNode(store, {"b:2", "signal 9 (SIGKILL)", 0}, RestartBudget{1});
  ASSERT_TRUE(lost.ok()) << lost.status().ToString();
  EXPECT_TRUE(lost->settled);
  EXPECT_FALSE(lost->budget_spent);
  auto end = FailureRecord::FromJson(**store.TryGet(keys::RoundEnd(0)));
  ASSERT_TRUE(end.ok());
  EXPECT_EQ(end->Summary(), "node 1 (b:2) was lost: its agent died: signal 9 (SIGKILL)");
  EXPECT_EQ(end->restarts, 1);
  // With no restart to spend, the same loss ends the job.
  MemoryStore other;
  JoinAll(other, 0, {Opts(2, 2, 0, "a:1"), Opts(2, 2, 1, "b:2")});
  auto spent = EndRoundOfLostNode(other, {"a:1", "signal 9 (SIGKILL)", 0}, RestartBudget{0});
  ASSERT_TRUE(spent.ok());
  EXPECT_TRUE(spent->budget_spent);
}

}  // namespace
}  // namespace trainctl
