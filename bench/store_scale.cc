// The job's store and rendezvous at scale (issue 25, part 3), one process, real sockets:
//   rendezvous N   N agents' rendezvous (the real JoinRound, each agent a thread with its own
//                  TcpStore connection and token) against the real embedded store server: the
//                  time from the first join to the last agent knowing its rank;
//   pattern N      the same key pattern on trainctl's store and on PyTorch's c10d::TCPStore (the
//                  one torchrun uses), side by side: N clients, each add(joined) -> set(member/i)
//                  -> the last sets "closed" -> wait(closed) -> get(member/(i+1)%N), then K rounds
//                  of set/get/add on its own keys; ops/s over all clients.
// Build: cmake --build build --target store_scale; run: build/bench/store_scale [N...]
#include <unistd.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <barrier>
#include <cstdio>
#include <thread>

#include "common/fs.h"
#include "rendezvous/rendezvous.h"
#include "store/tcp/tcp_store.h"

namespace trainctl {
namespace {

double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

// Resident memory now, in KiB (/proc/self/statm).
long RssKb() {
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return resident * (::sysconf(_SC_PAGESIZE) / 1024);
}

std::unique_ptr<TcpStoreServer> Server(int clients) {
  TcpStoreServerOptions so;
  so.token = "bench-token";
  so.max_connections = clients + 16;
  auto server = TcpStoreServer::Start(so);
  if (!server.ok()) {
    std::fprintf(stderr, "store server: %s\n", server.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(*server);
}

std::vector<std::unique_ptr<TcpStore>> Clients(uint16_t port, int n) {
  std::vector<std::unique_ptr<TcpStore>> clients(n);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = t; i < n; i += 8) {
        TcpStoreOptions co;
        co.port = port;
        co.token = "bench-token";
        co.io_timeout = std::chrono::seconds(120);
        auto c = TcpStore::Connect(co);
        if (!c.ok()) {
          std::fprintf(stderr, "client %d: %s\n", i, c.status().ToString().c_str());
          std::exit(1);
        }
        clients[i] = std::move(*c);
      }
    });
  }
  for (auto& t : threads) t.join();
  return clients;
}

void Rendezvous(int n) {
  auto server = Server(n);
  const long rss0 = RssKb();
  auto clients = Clients(server->port(), n);
  const long per_client = (RssKb() - rss0) * 1024 / n;  // bytes: a client and its server side
  std::barrier start(n + 1);
  std::vector<int> ranks(n, -1);
  std::vector<std::thread> agents;
  for (int i = 0; i < n; ++i) {
    agents.emplace_back([&, i] {
      RendezvousOptions o;
      o.min_nodes = o.max_nodes = n;
      o.node_id = "agent-" + std::to_string(i);
      o.timeout = std::chrono::minutes(2);
      start.arrive_and_wait();
      auto r = JoinRound(*clients[i], 0, 0, o);
      if (r.ok() && r->has_value()) ranks[i] = (*r)->group_rank;
      else std::fprintf(stderr, "agent %d: %s\n", i, r.ok() ? "not in the round" : r.status().ToString().c_str());
    });
  }
  start.arrive_and_wait();
  const auto t0 = Clock::now();
  for (auto& a : agents) a.join();
  const double took = Seconds(t0);
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  bool ok = true;
  for (int i = 0; i < n; ++i) ok = ok && sorted[i] == i;
  std::printf("rendezvous %5d agents: %.3f s, ranks %s, %.1f KiB per connection (client and server side)\n",
              n, took, ok ? "0..N-1 distinct" : "WRONG", per_client / 1024.0);
}

// The key pattern, through `ops` (a store's add/set/get/wait as lambdas), for client i of n.
struct Ops {
  std::function<int64_t(const std::string&, int64_t)> add;
  std::function<void(const std::string&, const std::string&)> set;
  std::function<std::string(const std::string&)> get;
  std::function<void(const std::string&)> wait;
};

constexpr int kRounds = 20;

void Pattern(int i, int n, Ops& ops) {
  const std::string me = std::to_string(i);
  if (ops.add("joined", 1) == n) ops.set("closed", "1");
  ops.set("member/" + me, "agent-" + me);
  ops.wait("closed");
  (void)ops.get("member/" + std::to_string((i + 1) % n));  // a get waits for the key
  for (int k = 0; k < kRounds; ++k) {
    ops.set("k/" + me, std::to_string(k));
    (void)ops.get("k/" + me);
    (void)ops.add("count/" + me, 1);
  }
}

double RunPattern(int n, std::vector<Ops>& ops) {
  std::barrier start(n + 1);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      Pattern(i, n, ops[i]);
    });
  }
  start.arrive_and_wait();
  const auto t0 = Clock::now();
  for (auto& t : threads) t.join();
  return Seconds(t0);
}

void ComparePattern(int n) {
  const double ops_per_client = 5 + 3 * kRounds;
  double trainctl_s, torch_s;
  {
    auto server = Server(n);
    auto clients = Clients(server->port(), n);
    std::vector<Ops> ops(n);
    for (int i = 0; i < n; ++i) {
      TcpStore* c = clients[i].get();
      ops[i].add = [c](const std::string& k, int64_t d) { return *c->Add(k, d); };
      ops[i].set = [c](const std::string& k, const std::string& v) { (void)c->Set(k, v); };
      ops[i].get = [c](const std::string& k) { return *c->Get(k, std::chrono::seconds(120)); };
      ops[i].wait = [c](const std::string& k) { (void)c->Wait({k}, std::chrono::seconds(120)); };
    }
    trainctl_s = RunPattern(n, ops);
  }
  {
    c10d::TCPStoreOptions so;
    so.port = 0;
    so.isServer = true;
    so.numWorkers = c10::nullopt;
    so.waitWorkers = false;
    so.timeout = std::chrono::seconds(120);
    auto server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
    const uint16_t port = server->getPort();
    std::vector<c10::intrusive_ptr<c10d::TCPStore>> clients(n);
    std::vector<std::thread> connect;
    for (int t = 0; t < 8; ++t) {
      connect.emplace_back([&, t] {
        for (int i = t; i < n; i += 8) {
          c10d::TCPStoreOptions co;
          co.port = port;
          co.isServer = false;
          co.waitWorkers = false;
          co.timeout = std::chrono::seconds(120);
          clients[i] = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", co);
        }
      });
    }
    for (auto& t : connect) t.join();
    std::vector<Ops> ops(n);
    for (int i = 0; i < n; ++i) {
      c10d::TCPStore* c = clients[i].get();
      ops[i].add = [c](const std::string& k, int64_t d) { return c->add(k, d); };
      ops[i].set = [c](const std::string& k, const std::string& v) { c->set(k, std::vector<uint8_t>(v.begin(), v.end())); };
      ops[i].get = [c](const std::string& k) { auto v = c->get(k); return std::string(v.begin(), v.end()); };
      ops[i].wait = [c](const std::string& k) { c->wait({k}); };
    }
    torch_s = RunPattern(n, ops);
  }
  const double total = ops_per_client * n;
  std::printf("pattern %5d clients: trainctl %.3f s (%.0f ops/s), TCPStore %.3f s (%.0f ops/s), ratio %.2fx\n", n,
              trainctl_s, total / trainctl_s, torch_s, total / torch_s, torch_s / trainctl_s);
}

}  // namespace
}  // namespace trainctl

int main(int argc, char** argv) {
  std::vector<int> sizes;
  for (int i = 1; i < argc; ++i) sizes.push_back(std::atoi(argv[i]));
  if (sizes.empty()) sizes = {256, 1024, 4096};
  trainctl::RaiseOpenFileLimit(3 * sizes.back() + 256);
  for (int n : sizes) trainctl::Rendezvous(n);
  for (int n : sizes) {
    if (n <= 2048) trainctl::ComparePattern(n);  // TCPStore runs out of descriptors past that here
  }
  return 0;
}
