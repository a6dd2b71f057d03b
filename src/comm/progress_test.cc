#include "comm/progress.h"

#include <gtest/gtest.h>

#include <future>
#include <optional>

#include "store/memory/memory_store.h"

namespace trainctl::comm {
namespace {

using std::chrono::milliseconds;

ProgressOptions Quick(int rank) {
  ProgressOptions o;
  o.rank = rank;
  o.size = 2;
  o.floor = milliseconds(300);
  o.limit = std::chrono::seconds(20);
  o.publish_after = milliseconds(100);
  o.poll = milliseconds(20);
  return o;
}

// Two ranks on one store, each with a watchdog that records what it would have ended with.
struct Group {
  MemoryStore store;
  std::promise<std::string> stalled;
  std::unique_ptr<ProgressWatchdog> Watch(int rank) {
    auto report = [this, rank](const Status& st) {
      EXPECT_EQ(rank, 0);
      stalled.set_value(st.message());
    };
    return std::make_unique<ProgressWatchdog>(std::make_unique<PrefixStore>(&store, "job/"), Quick(rank), report);
  }
  // What rank 0 reported within `within`, if anything.
  std::optional<std::string> Report(Duration within) {
    auto f = stalled.get_future();
    if (f.wait_for(within) != std::future_status::ready) return std::nullopt;
    return f.get();
  }
};

void Steps(ProgressWatchdog& w, int n) {
  for (int i = 0; i < n; ++i) {
    w.Enter(Phase::kForward);
    w.Enter(Phase::kGradients);
    w.StepDone(0.01);
  }
}

TEST(Progress, ARankStuckComputingIsNamedWithItsHostAndPhaseAfterTheBound) {
  Group g;
  ASSERT_TRUE(g.store.Set("job/rank/1/host", "node-b (10.0.0.2:4000, pid 77)").ok());
  auto r0 = g.Watch(0), r1 = g.Watch(1);
  Steps(*r0, 3);
  Steps(*r1, 3);
  const auto start = Clock::now();
  r0->Enter(Phase::kGradients);  // waits for rank 1, which never comes
  r1->Enter(Phase::kForward);
  auto report = g.Report(std::chrono::seconds(5));
  ASSERT_TRUE(report.has_value());
  EXPECT_GE(Clock::now() - start, milliseconds(300)) << "named before the bound";
  EXPECT_NE(report->find("rank 1 on node-b (10.0.0.2:4000, pid 77) is stuck in the forward pass"), std::string::npos)
      << *report;
  EXPECT_NE(report->find("after 3 steps"), std::string::npos) << *report;
}

TEST(Progress, ARankThatNeverReportsIsNamedStalled) {
  Group g;
  auto r0 = g.Watch(0);  // rank 1 has no watchdog: a frozen or cut-off process publishes nothing
  Steps(*r0, 3);
  r0->Enter(Phase::kGradients);
  auto report = g.Report(std::chrono::seconds(5));
  ASSERT_TRUE(report.has_value());
  EXPECT_NE(report->find("rank 1 is stalled or unreachable: no progress reported"), std::string::npos) << *report;
}

// A rank saving a checkpoint, loading data or evaluating is not stuck however long it takes (the
// collective's own timeout still holds); nor is one that waits in a collective too; nor is anyone
// before the first steps are measured.
TEST(Progress, SlowPhasesByNatureRanksThatWaitTooAndTheFirstStepsAreWaitedFor) {
  for (Phase slow : {Phase::kCheckpoint, Phase::kData, Phase::kEvaluating, Phase::kGradients}) {
    Group g;
    auto r0 = g.Watch(0), r1 = g.Watch(1);
    Steps(*r0, 3);
    Steps(*r1, 3);
    r0->Enter(Phase::kGradients);
    r1->Enter(slow);
    EXPECT_FALSE(g.Report(std::chrono::milliseconds(1500)).has_value()) << PhaseName(slow);
  }
  Group g;
  auto r0 = g.Watch(0), r1 = g.Watch(1);
  Steps(*r0, 2);
  r0->Enter(Phase::kGradients);
  r1->Enter(Phase::kForward);
  EXPECT_FALSE(g.Report(std::chrono::milliseconds(1500)).has_value()) << "the first steps";
}

// A finished rank's watchdog stops at once, not at its next poll: every worker's exit waited for it
// (up to 250 ms at the default poll, at the end of every job).
TEST(Progress, AWatchdogStopsWithoutWaitingForItsPoll) {
  MemoryStore store;
  ProgressOptions o = Quick(0);
  o.poll = std::chrono::seconds(60);
  auto w = std::make_unique<ProgressWatchdog>(std::make_unique<PrefixStore>(&store, "job/"), o, [](const Status&) {});
  const auto start = Clock::now();
  w.reset();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
}

}  // namespace
}  // namespace trainctl::comm
