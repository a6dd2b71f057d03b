// Collectives among real Gloo ranks (threads of this process, real TCP on loopback), rendezvous
// through a MemoryStore.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <future>
#include <thread>

#include "comm/communicator.h"
#include "store/memory/memory_store.h"

namespace trainctl::comm {
namespace {

// Runs fn(rank, communicator) on `size` ranks at once; returns each rank's status.
std::vector<Status> OnRanks(int size, Duration timeout,
                            const std::function<Status(int, Communicator&)>& fn) {
  MemoryStore store;
  std::vector<Status> out(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      GlooOptions o;
      o.rank = r;
      o.size = size;
      o.timeout = timeout;
      auto comm = ConnectGloo(store, o);
      if (!comm.ok()) {
        out[r] = comm.status();
        return;
      }
      out[r] = fn(r, **comm);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

TEST(Gloo, AllReduceSumsAndEveryRankGetsTheSameBits) {
  constexpr int kSize = 3;
  constexpr size_t kCount = 100003;  // not a multiple of the ring's chunking
  std::vector<std::vector<float>> data(kSize);
  auto st = OnRanks(kSize, std::chrono::seconds(30), [&](int r, Communicator& c) {
    EXPECT_EQ(c.rank(), r);
    EXPECT_EQ(c.size(), kSize);
    data[r].resize(kCount);
    for (size_t i = 0; i < kCount; ++i) data[r][i] = std::sin(float(i) * (r + 1)) / 3.0f;
    return c.AllReduceSum(data[r].data(), kCount);
  });
  for (const auto& s : st) ASSERT_TRUE(s.ok()) << s.ToString();
  for (size_t i = 0; i < kCount; i += 997) {
    float want = 0;
    for (int r = 0; r < kSize; ++r) want += std::sin(float(i) * (r + 1)) / 3.0f;
    EXPECT_NEAR(data[0][i], want, 1e-5) << i;
  }
  for (int r = 1; r < kSize; ++r) {
    EXPECT_EQ(std::memcmp(data[0].data(), data[r].data(), kCount * sizeof(float)), 0) << r;
  }
}

TEST(Gloo, BroadcastCopiesRootsBytesAndBarrierCompletes) {
  constexpr int kSize = 2;
  std::vector<std::string> got(kSize);
  auto st = OnRanks(kSize, std::chrono::seconds(30), [&](int r, Communicator& c) {
    std::string buf = r == 1 ? "from rank one" : "xxxxxxxxxxxxx";
    if (Status s = c.Broadcast(buf.data(), buf.size(), 1); !s.ok()) return s;
    got[r] = buf;
    return c.Barrier();
  });
  for (const auto& s : st) ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(got[0], "from rank one");
  EXPECT_EQ(got[1], "from rank one");
}

TEST(Gloo, APeerThatNeverJoinsTheCollectiveTimesOut) {
  auto start = Clock::now();
  std::promise<void> rank0_done;
  auto done = rank0_done.get_future();
  auto st = OnRanks(2, std::chrono::milliseconds(1500), [&](int r, Communicator& c) {
    if (r == 1) {  // rank 1 stays connected but skips the allreduce, like a stalled process
      done.wait_for(std::chrono::seconds(20));
      return Status::Ok();
    }
    float x = 1;
    Status s = c.AllReduceSum(&x, 1);
    rank0_done.set_value();
    return s;
  });
  EXPECT_TRUE(st[1].ok());
  EXPECT_EQ(st[0].code(), Code::kTimeout) << st[0].ToString();
  EXPECT_NE(st[0].message().find("rank 0"), std::string::npos) << st[0].ToString();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(20));
}

TEST(Gloo, APeerThatExitsBreaksTheCollectiveAtOnce) {
  auto st = OnRanks(2, std::chrono::seconds(30), [&](int r, Communicator& c) {
    if (r == 1) return Status::Ok();  // rank 1 leaves: its sockets close
    float x = 1;
    Status s = c.AllReduceSum(&x, 1);
    if (s.ok()) return s;
    // Broken for good: the next call fails without touching the network.
    Status again = c.AllReduceSum(&x, 1);
    EXPECT_NE(again.message().find("broken"), std::string::npos) << again.ToString();
    return s;
  });
  EXPECT_EQ(st[0].code(), Code::kUnavailable) << st[0].ToString();
}

TEST(Gloo, ARankThatNeverConnectsIsNamed) {
  MemoryStore store;
  GlooOptions o;
  o.rank = 0;
  o.size = 2;
  o.timeout = std::chrono::milliseconds(300);
  auto comm = ConnectGloo(store, o);
  ASSERT_FALSE(comm.ok());
  EXPECT_NE(comm.status().message().find("rank 1"), std::string::npos) << comm.status().ToString();
}

TEST(Gloo, RejectsARankOutsideTheGroup) {
  MemoryStore store;
  GlooOptions o;
  o.rank = 2;
  o.size = 2;
  EXPECT_EQ(ConnectGloo(store, o).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace trainctl::comm
