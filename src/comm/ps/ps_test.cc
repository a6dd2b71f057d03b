// Parameter servers over real sockets: sync averaging in worker order, async staleness, a
// replaced worker's progress, timeouts that name the missing worker, and the token.
#include "comm/ps/ps.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "common/socket.h"

namespace trainctl::comm::ps {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Plain SGD with a momentum-like counter buffer, so state travels too: params -= 0.5 * grad.
class TestOptimizer : public ShardOptimizer {
 public:
  explicit TestOptimizer(int64_t count) : params_(count), calls_(count) {}
  float* params() override { return params_.data(); }
  std::vector<std::pair<std::string, float*>> state() override { return {{"calls", calls_.data()}}; }
  int64_t steps() const override { return steps_; }
  void set_steps(int64_t s) override { steps_ = s; }
  void Apply(const float* const* grads, int n, int divisor, int64_t step) override {
    for (size_t i = 0; i < params_.size(); ++i) {
      float sum = grads[0][i];
      for (int k = 1; k < n; ++k) sum += grads[k][i];
      params_[i] -= 0.5f * (sum / divisor);
      calls_[i] += 1;
    }
    last_step = step;
    ++steps_;
  }
  int64_t last_step = -1;

 private:
  std::vector<float> params_, calls_;
  int64_t steps_ = 0;
};

struct Cluster {
  std::vector<std::unique_ptr<Server>> servers;
  std::vector<std::string> addrs;
  Cluster(int shards, int workers, bool async, Duration timeout = seconds(10), int staleness = 8) {
    for (int i = 0; i < shards; ++i) {
      ServerOptions o;
      o.token = "tok";
      o.workers = workers;
      o.async = async;
      o.max_staleness = staleness;
      o.timeout = timeout;
      o.make_optimizer = [](int64_t n, int64_t) { return std::make_unique<TestOptimizer>(n); };
      servers.push_back(std::move(Server::Start(o).value()));
      addrs.push_back("127.0.0.1:" + std::to_string(servers.back()->port()));
    }
  }
  std::string local_host;  // "127.0.0.1": the shards are on the workers' host (shared memory)
  std::unique_ptr<Client> Connect(int worker, const std::string& token = "tok", Duration timeout = seconds(10)) {
    ClientOptions o;
    o.shards = addrs;
    o.token = token;
    o.worker = worker;
    o.timeout = timeout;
    o.local_host = local_host;
    auto c = Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }
};

TEST(ParameterServer, ShardsAreContiguousAndBalancedByBytes) {
  int64_t covered = 0;
  for (int i = 0; i < 3; ++i) {
    auto [b, e] = ShardRange(10, 3, i);
    EXPECT_EQ(b, covered);
    EXPECT_GE(e - b, 3);
    EXPECT_LE(e - b, 4);
    covered = e;
  }
  EXPECT_EQ(covered, 10);
}

// The segments of /dev/shm that trainctl made.
int Segments() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    n += e.path().filename().string().rfind("trainctl-", 0) == 0;
  }
  return n;
}

// Over TCP, and through shared memory for shards on the worker's own host.
class Transport : public ::testing::TestWithParam<std::string> {
 protected:
  bool shm() const { return GetParam() == "shm"; }
};
INSTANTIATE_TEST_SUITE_P(ParameterServer, Transport, ::testing::Values("tcp", "shm"));

TEST_P(Transport, SyncAveragesEveryWorkersGradientsInWorkerOrder) {
  const int segments_before = Segments();
  Cluster c(2, 2, /*async=*/false);
  c.local_host = shm() ? "127.0.0.1" : "";
  auto w0 = c.Connect(0), w1 = c.Connect(1);
  EXPECT_FALSE(w0->initialized());
  std::vector<float> init = {1, 2, 3, 4, 5}, calls(5, 0);
  ASSERT_TRUE(w0->Init(init.data(), 5, {{"calls", calls.data()}}, 7, 0, 10).ok());
  ASSERT_TRUE(w1->WaitInitialized().ok());
  std::vector<float> p0(5), p1(5);
  ASSERT_EQ(*w1->Pull(p1.data(), 5), 0);
  EXPECT_EQ(p1, init);
  // Worker 0's push waits for worker 1's; both get version 1's parameters.
  std::vector<float> g0 = {2, 2, 2, 2, 2}, g1 = {4, 0, 4, 0, 4};
  Result<int64_t> v0 = Internal("");
  std::thread t([&] { v0 = w0->PushPull(g0.data(), p0.data(), 5, 0, 1); });
  auto v1 = w1->PushPull(g1.data(), p1.data(), 5, 0, 1);
  t.join();
  ASSERT_TRUE(v0.ok()) << v0.status().ToString();
  ASSERT_TRUE(v1.ok()) << v1.status().ToString();
  EXPECT_EQ(*v0, 1);
  EXPECT_EQ(*v1, 1);
  std::vector<float> want = {1 - 1.5f, 2 - 0.5f, 3 - 1.5f, 4 - 0.5f, 5 - 1.5f};  // p - 0.5 * mean
  EXPECT_EQ(p0, want);
  EXPECT_EQ(p1, want);
  EXPECT_EQ(w0->shm_shards(), shm() ? 2 : 0);
  EXPECT_EQ(Segments(), segments_before) << "a segment's name was left in /dev/shm";
  auto state = w0->FetchState(5);
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  EXPECT_EQ(state->version, 1);
  EXPECT_EQ(state->optimizer_steps, 8);  // 7 given at init, one update since
  EXPECT_EQ(state->params, want);
  ASSERT_EQ(state->state.size(), 1u);
  EXPECT_EQ(state->state[0].second, std::vector<float>(5, 1));
  EXPECT_EQ(*w0->Done(), 1);
  EXPECT_EQ(*w1->DoneCount(), 1);
  EXPECT_EQ(*w1->Done(), 2);
}

TEST(ParameterServer, ASyncVersionThatAWorkerNeverPushesTimesOutNamingIt) {
  Cluster c(1, 3, /*async=*/false, milliseconds(300));
  auto w0 = c.Connect(0);
  std::vector<float> p = {0, 0}, g = {1, 1};
  ASSERT_TRUE(w0->Init(p.data(), 2, {{"calls", p.data()}}, 0, 0, 10).ok());
  auto start = Clock::now();
  auto r = w0->PushPull(g.data(), p.data(), 2, 0, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_LT(Clock::now() - start, seconds(5));
  EXPECT_NE(r.status().message().find("waiting for the gradients of worker(s) 1, 2 for version 0"), std::string::npos)
      << r.status().ToString();
}

TEST_P(Transport, AsyncAppliesEachPushAndDropsStaleOnesAndAReplacementGoesOn) {
  Cluster c(1, 2, /*async=*/true, seconds(10), /*staleness=*/1);
  c.local_host = shm() ? "127.0.0.1" : "";
  auto w0 = c.Connect(0), w1 = c.Connect(1);
  std::vector<float> p = {10}, calls = {0}, g = {2};
  ASSERT_TRUE(w0->Init(p.data(), 1, {{"calls", calls.data()}}, 0, 0, 10).ok());
  // Each push is applied at once, as 1/2 of the gradient: 10 - 0.5 * 1 = 9.5.
  EXPECT_EQ(*w0->PushPull(g.data(), p.data(), 1, 0, 1), 1);
  EXPECT_FLOAT_EQ(p[0], 9.5f);
  EXPECT_EQ(*w0->PushPull(g.data(), p.data(), 1, 1, 2), 2);
  EXPECT_EQ(*w0->PushPull(g.data(), p.data(), 1, 2, 3), 3);
  // Worker 1 computed on version 0: 3 versions old, over the bound of 1: dropped.
  EXPECT_EQ(*w1->PushPull(g.data(), p.data(), 1, 0, 5), 3);
  EXPECT_EQ(c.servers[0]->dropped(), 1);
  EXPECT_EQ(w1->shm_shards(), shm() ? 1 : 0);
  // Worker 1 is replaced: its successor learns the steps it had done.
  w1.reset();
  auto again = c.Connect(1);
  EXPECT_TRUE(again->initialized());
  EXPECT_EQ(again->steps_done(), 5);
}

TEST(ParameterServer, AWrongTokenAndAnOversizeHelloAreRefused) {
  Cluster c(1, 1, false);
  ClientOptions o;
  o.shards = c.addrs;
  o.token = "nope";
  auto bad = Client::Connect(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kPermissionDenied) << bad.status().ToString();
  // A hello that announces 1 GiB is cut off at once, not buffered.
  int fd = ConnectOnce("127.0.0.1", c.servers[0]->port(), Clock::now() + seconds(5));
  ASSERT_GE(fd, 0);
  std::string head(1, '\x01');
  uint64_t len = uint64_t{1} << 30;
  head.append(reinterpret_cast<const char*>(&len), sizeof len);
  ASSERT_TRUE(SendAll(fd, head, Clock::now() + seconds(5)));
  char b;
  EXPECT_EQ(RecvAll(fd, &b, 1, Clock::now() + seconds(5)), 0) << "the server should close it";
  ::close(fd);
  // A worker index outside the job is refused too.
  ClientOptions outside = o;
  outside.token = "tok";
  outside.worker = 5;
  EXPECT_FALSE(Client::Connect(outside).ok());
}

TEST(ParameterServer, AGoneShardIsReportedNotWaitedOn) {
  Cluster c(1, 1, false);
  auto w = c.Connect(0, "tok", seconds(2));
  std::vector<float> p = {1};
  ASSERT_TRUE(w->Init(p.data(), 1, {{"calls", p.data()}}, 0, 0, 10).ok());
  c.servers[0]->Stop();
  auto start = Clock::now();
  auto r = w->Pull(p.data(), 1);
  EXPECT_FALSE(r.ok());
  EXPECT_LT(Clock::now() - start, seconds(3));
}

}  // namespace
}  // namespace trainctl::comm::ps
