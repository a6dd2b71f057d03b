#include "rendezvous/rendezvous.h"

#include <gtest/gtest.h>

#include <set>
#include <thread>

#include "store/memory/memory_store.h"

namespace trainctl {
namespace {

RendezvousOptions Opts(int nnodes, int rank, const std::string& id) {
  RendezvousOptions o;
  o.nnodes = nnodes;
  o.node_rank = rank;
  o.node_id = id;
  o.timeout = std::chrono::seconds(10);
  return o;
}

TEST(Rendezvous, ArrivingNodesGetDistinctContiguousRanks) {
  MemoryStore store;
  constexpr int kNodes = 5;
  std::vector<int> ranks(kNodes, -1);
  std::vector<std::thread> threads;
  for (int i = 0; i < kNodes; ++i) {
    threads.emplace_back([&, i] {
      auto r = JoinRound(store, 0, Opts(kNodes, -1, "node" + std::to_string(i)));
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(r->group_world_size, kNodes);
      ranks[i] = r->group_rank;
    });
  }
  for (auto& t : threads) t.join();
  std::set<int> unique(ranks.begin(), ranks.end());
  EXPECT_EQ(unique, (std::set<int>{0, 1, 2, 3, 4}));
}

TEST(Rendezvous, FixedRanksAreKeptAndCannotBeTakenTwice) {
  MemoryStore store;
  std::thread other([&] { ASSERT_TRUE(JoinRound(store, 0, Opts(2, 1, "b")).ok()); });
  auto mine = JoinRound(store, 0, Opts(2, 0, "a"));
  other.join();
  ASSERT_TRUE(mine.ok());
  EXPECT_EQ(mine->group_rank, 0);
  auto dup = JoinRound(store, 0, Opts(2, 1, "c"));
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("already taken by b"), std::string::npos);
  EXPECT_FALSE(JoinRound(store, 1, Opts(2, 2, "d")).ok());  // out of range
}

TEST(Rendezvous, TimeoutNamesTheMissingNodes) {
  MemoryStore store;
  auto o = Opts(3, 0, "a");
  o.timeout = std::chrono::milliseconds(300);
  auto r = JoinRound(store, 0, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kTimeout);
  EXPECT_NE(r.status().message().find("1 of 3 nodes joined"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("missing node rank(s) 1, 2"), std::string::npos);
}

TEST(Rendezvous, ACheckCanAbortTheWait) {
  MemoryStore store;
  auto o = Opts(2, 0, "a");
  o.timeout = std::chrono::minutes(5);
  int calls = 0;
  o.check = [&calls] { return ++calls >= 3 ? Aborted("stop requested") : Status::Ok(); };
  auto start = Clock::now();
  auto r = JoinRound(store, 0, o);
  EXPECT_EQ(r.status().code(), Code::kAborted);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
}

TEST(Rendezvous, RoundsAreIndependent) {
  MemoryStore store;
  ASSERT_TRUE(JoinRound(store, 0, Opts(1, -1, "a")).ok());
  auto next = JoinRound(store, 1, Opts(1, -1, "a"));
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->round, 1);
  EXPECT_EQ(next->group_rank, 0);
}

}  // namespace
}  // namespace trainctl
