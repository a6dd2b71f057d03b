// One suite for every backend (house style): real ranks as threads of this process, Gloo over
// real TCP on loopback, shm over a real /dev/shm segment; rendezvous through a MemoryStore.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <future>
#include <thread>

#if TRAINCTL_HAVE_NCCL
#include <cuda_runtime_api.h>
#endif

#include "comm/communicator.h"
#include "common/fs.h"
#include "store/memory/memory_store.h"

namespace trainctl::comm {
namespace {

Result<std::unique_ptr<Communicator>> Connect(const std::string& backend, Store& store, int rank, int size,
                                              Duration timeout) {
  if (backend == "shm") {
    ShmOptions o;
    o.rank = rank;
    o.size = size;
    o.timeout = timeout;
    o.chunk_bytes = 64 << 10;  // small chunks: the tests cross chunk boundaries
    return ConnectShm(store, o);
  }
  GlooOptions o;
  o.rank = rank;
  o.size = size;
  o.timeout = timeout;
  return ConnectGloo(store, o);
}

class Comm : public ::testing::TestWithParam<std::string> {
 public:
  // Runs fn(rank, communicator) on `size` ranks at once; returns each rank's status.
  std::vector<Status> OnRanks(int size, Duration timeout, const std::function<Status(int, Communicator&)>& fn) {
    return RunRanks(GetParam(), size, timeout, fn);
  }
  static std::vector<Status> RunRanks(const std::string& backend, int size, Duration timeout,
                                      const std::function<Status(int, Communicator&)>& fn);
};

std::vector<Status> Comm::RunRanks(const std::string& backend, int size, Duration timeout,
                                   const std::function<Status(int, Communicator&)>& fn) {
  MemoryStore store;
  std::vector<Status> out(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      auto comm = Connect(backend, store, r, size, timeout);
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

TEST_P(Comm, AllReduceSumsAndEveryRankGetsTheSameBits) {
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

// Twice, with new inputs: the second round checks that inputs and result can be reused.
TEST(Shm, SharedAverageGivesEveryRankTheMeanInTheSameBits) {
  constexpr int kSize = 3;
  constexpr size_t kCount = 100007;  // blocks of 4096 and a partial one
  std::vector<std::vector<float>> got(kSize);
  auto st = Comm::RunRanks("shm", kSize, std::chrono::seconds(30), [&](int r, Communicator& c) {
    auto avg = c.MakeSharedAverage(kCount);
    if (!avg.ok()) return avg.status();
    for (int round = 0; round < 2; ++round) {
      float* in = (*avg)->input();
      for (size_t i = 0; i < kCount / 2; ++i) in[i] = std::sin(float(i) * (r + 1) + round);
      // Rank 2 posts half and is late with the rest: its peers average the posted part first.
      if (r == 2) {
        (*avg)->Post(kCount / 2);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      for (size_t i = kCount / 2; i < kCount; ++i) in[i] = std::sin(float(i) * (r + 1) + round);
      if (Status s = (*avg)->Average(); !s.ok()) return s;
      got[r].assign((*avg)->result(), (*avg)->result() + kCount);  // valid until the next call
      // Every input was zeroed for its next use (the trainer accumulates into it unzeroed).
      for (size_t i = 0; i < kCount; ++i) {
        if (in[i] != 0) return Internal("input " + std::to_string(i) + " of rank " + std::to_string(r) + " not zeroed");
      }
    }
    return Status::Ok();
  });
  for (const auto& s : st) ASSERT_TRUE(s.ok()) << s.ToString();
  for (size_t i = 0; i < kCount; ++i) {
    float want = std::sin(float(i) + 1) + std::sin(float(i) * 2 + 1);  // round 1, in rank order
    want += std::sin(float(i) * 3 + 1);
    ASSERT_EQ(got[0][i], want / 3) << i;
  }
  for (int r = 1; r < kSize; ++r) EXPECT_EQ(got[0], got[r]) << r;
}

// Gloo has no shared memory: every rank hears so, and the communicator goes on working.
TEST(Gloo, SharedAverageIsRefusedAndTheCommunicatorStaysUsable) {
  auto st = Comm::RunRanks("gloo", 2, std::chrono::seconds(30), [&](int, Communicator& c) {
    EXPECT_FALSE(c.MakeSharedAverage(10).ok());
    float x = 1;
    Status s = c.AllReduceSum(&x, 1);
    EXPECT_EQ(x, 2);
    return s;
  });
  for (const auto& s : st) ASSERT_TRUE(s.ok()) << s.ToString();
}

TEST_P(Comm, BroadcastCopiesRootsBytesAndBarrierCompletes) {
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

TEST_P(Comm, APeerThatNeverJoinsTheCollectiveTimesOut) {
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

TEST(HangReport, TheRanksThatNeverReportTheTimeoutAreNamedWithTheirHosts) {
  MemoryStore store;
  for (int r = 0; r < 4; ++r) ASSERT_TRUE(AnnounceRank(store, r, "10.0.0." + std::to_string(r)).ok());
  // Ranks 0 and 3 time out in a collective; rank 1 is stalled and rank 2 cut off: neither reports.
  std::vector<Status> got(4);
  std::vector<std::thread> alive;
  for (int r : {0, 3}) {
    alive.emplace_back([&, r] {
      got[r] = NameStalledRanks(store, r, 4, std::chrono::milliseconds(500),
                                Timeout("allreduce timed out on rank " + std::to_string(r)));
    });
  }
  for (auto& t : alive) t.join();
  for (int r : {0, 3}) {
    EXPECT_EQ(got[r].code(), Code::kTimeout);
    const std::string& m = got[r].message();
    EXPECT_NE(m.find("allreduce timed out on rank " + std::to_string(r)), std::string::npos) << m;
    EXPECT_NE(m.find("stalled or unreachable: rank 1 on "), std::string::npos) << m;
    EXPECT_NE(m.find("(10.0.0.1, pid " + std::to_string(::getpid()) + "), rank 2 on "), std::string::npos) << m;
    EXPECT_EQ(m.find("rank 3 on"), std::string::npos) << m;
  }
}

TEST(Gloo, APeerThatExitsBreaksTheCollectiveAtOnce) {
  auto st = Comm::RunRanks("gloo", 2, std::chrono::seconds(30), [&](int r, Communicator& c) {
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

// A real second process (a peer's pid is what shm watches): it maps the segment, then exits.
TEST(Shm, APeerProcessThatExitsIsReportedWithinASecond) {
  MemoryStore store;
  Result<std::unique_ptr<Communicator>> rank0 = Unavailable("not connected");
  std::thread t([&] { rank0 = Connect("shm", store, 0, 2, std::chrono::seconds(30)); });
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (!(*store.TryGet("shm")).has_value() && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  pid_t child = ::fork();
  if (child == 0) {  // the child has a copy of the store, which now holds the segment's name
    auto rank1 = Connect("shm", store, 1, 2, std::chrono::seconds(5));
    ::_exit(rank1.ok() ? 0 : 1);
  }
  int status = 0;
  ::waitpid(child, &status, 0);  // reaped, as the agent reaps its workers
  t.join();
  ASSERT_EQ(status, 0);
  ASSERT_TRUE(rank0.ok()) << rank0.status().ToString();
  auto start = Clock::now();
  float x = 1;
  Status st = (*rank0)->AllReduceSum(&x, 1);
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("rank 1 (pid " + std::to_string(child) + ") exited"), std::string::npos) << st.ToString();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(1));
}

TEST(Gloo, ARankThatNeverConnectsIsNamed) {
  MemoryStore store;
  auto comm = Connect("gloo", store, 0, 2, std::chrono::milliseconds(300));
  ASSERT_FALSE(comm.ok());
  EXPECT_NE(comm.status().message().find("rank 1"), std::string::npos) << comm.status().ToString();
}

TEST(Shm, RanksThatNeverConnectLeaveNothingBehind) {
  MemoryStore store;
  auto comm = Connect("shm", store, 0, 3, std::chrono::milliseconds(300));
  ASSERT_EQ(comm.status().code(), Code::kTimeout) << comm.status().ToString();
  EXPECT_NE(comm.status().message().find("1 of 3"), std::string::npos) << comm.status().ToString();
  auto name = store.TryGet("shm");
  ASSERT_TRUE(name.ok() && name->has_value());
  EXPECT_FALSE(Exists(**name)) << **name;  // the segment's name is gone from /dev/shm
}

TEST(Shm, ASegmentsNameIsRemovedOnceEveryRankHasIt) {
  MemoryStore store;
  std::vector<Status> st(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      auto c = Connect("shm", store, r, 2, std::chrono::seconds(30));
      st[r] = c.ok() ? (*c)->Barrier() : c.status();
    });
  }
  for (auto& t : ranks) t.join();
  for (const auto& s : st) ASSERT_TRUE(s.ok()) << s.ToString();
  auto name = store.TryGet("shm");
  ASSERT_TRUE(name.ok() && name->has_value());
  EXPECT_EQ((*name)->rfind("/dev/shm/trainctl-", 0), 0u) << **name;
  EXPECT_FALSE(Exists(**name)) << **name;  // rank 0 removed the name once both had mapped it
}

TEST_P(Comm, RejectsARankOutsideTheGroup) {
  MemoryStore store;
  EXPECT_EQ(Connect(GetParam(), store, 2, 2, std::chrono::seconds(1)).status().code(), Code::kInvalidArgument);
}

// NCCL needs one GPU per rank, so one rank here (more on machines with more GPUs is the
// trainer's GPU benchmark's job). Host buffers go through the GPU and come back.
TEST(Nccl, OneRankCollectivesOnHostBuffersOrAClearErrorWithoutNccl) {
  MemoryStore store;
  auto comm = ConnectNccl(store, {});
  if (!NcclAvailable()) {
    ASSERT_FALSE(comm.ok());
    EXPECT_EQ(comm.status().code(), Code::kInvalidArgument);
    EXPECT_NE(comm.status().message().find("built without CUDA and NCCL"), std::string::npos);
    return;
  }
  if (!comm.ok() && comm.status().message().find("GPU") != std::string::npos) {
    GTEST_SKIP() << "no usable GPU: " << comm.status().ToString();
  }
  ASSERT_TRUE(comm.ok()) << comm.status().ToString();
  std::vector<float> data(100003);
  for (size_t i = 0; i < data.size(); ++i) data[i] = float(i) / 7;
  std::vector<float> want = data;
  ASSERT_TRUE((*comm)->AllReduceSum(data.data(), data.size()).ok());
  EXPECT_EQ(data, want);  // one rank: the sum is the value itself
  int64_t header[3] = {4, 5, 6};
  ASSERT_TRUE((*comm)->Broadcast(header, sizeof header, 0).ok());
  EXPECT_EQ(header[2], 6);
  EXPECT_TRUE((*comm)->Barrier().ok());
  EXPECT_EQ((*comm)->Broadcast(header, sizeof header, 1).code(), Code::kInvalidArgument);
}

#if TRAINCTL_HAVE_NCCL
// Queued sums on one GPU: the sum waits on the GPU for what the caller's stream queued before it,
// Join returns without waiting on the host, and a sum that cannot finish (here: the caller's
// stream is held for 4 s by a host function, with a 1 s timeout) is reported as a timeout by the
// watchdog within about the timeout, instead of hanging whoever waits for it.
TEST(Nccl, QueuedSumsFollowTheStreamAndAStuckOneTimesOutInsteadOfHanging) {
  MemoryStore store;
  NcclOptions o;
  o.timeout = std::chrono::seconds(1);
  auto comm = ConnectNccl(store, o);
  if (!comm.ok() && comm.status().message().find("GPU") != std::string::npos) {
    GTEST_SKIP() << "no usable GPU: " << comm.status().ToString();
  }
  ASSERT_TRUE(comm.ok()) << comm.status().ToString();
  auto sum = (*comm)->MakeDeviceAllReduce();
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();

  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const size_t n = 1 << 20;
  float* dev = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dev), n * sizeof(float)), cudaSuccess);
  std::vector<float> host(n, 0.f), back(n);
  for (size_t i = 0; i < n; ++i) host[i] = float(i % 1000) / 8;
  // The values are copied on `stream` right before the sum is queued: one rank's sum leaves them
  // as they are only if it ran after the copy.
  ASSERT_EQ(cudaMemsetAsync(dev, 0, n * sizeof(float), stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(dev, host.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream), cudaSuccess);
  ASSERT_TRUE((*sum)->Enqueue(dev, n, stream).ok());
  ASSERT_TRUE((*sum)->Join(stream).ok());
  ASSERT_EQ(cudaMemcpyAsync(back.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(back, host);

  // Hold the stream on the GPU for 4 s; the sum queued behind it cannot finish in time.
  auto hold = [](void*) { std::this_thread::sleep_for(std::chrono::seconds(4)); };
  ASSERT_EQ(cudaLaunchHostFunc(stream, hold, nullptr), cudaSuccess);
  const auto start = Clock::now();
  ASSERT_TRUE((*sum)->Enqueue(dev, n, stream).ok());
  ASSERT_TRUE((*sum)->Join(stream).ok());
  EXPECT_LT(SecondsSince(start), 0.5);   // queued, not waited for
  Status second = (*sum)->Join(stream);  // waits for the first one's sums: the watchdog ends it
  double waited = SecondsSince(start);
  EXPECT_EQ(second.code(), Code::kTimeout) << second.ToString();
  EXPECT_NE(second.message().find("did not complete within 1s"), std::string::npos) << second.message();
  EXPECT_GT(waited, 0.9);
  EXPECT_LT(waited, 3.5);  // before the stream was released
  float one = 1;
  EXPECT_EQ((*comm)->AllReduceSum(&one, 1).code(), Code::kTimeout);  // the communicator is broken
  cudaStreamSynchronize(stream);
  sum->reset();
  cudaFree(dev);
  cudaStreamDestroy(stream);
}
#endif

INSTANTIATE_TEST_SUITE_P(Backends, Comm, ::testing::Values("gloo", "shm"), [](const auto& info) { return info.param; });

}  // namespace
}  // namespace trainctl::comm
