// The job's store and rendezvous at scale (issue 25, part 3), one process, real sockets:
//   rendezvous N   N agents' rendezvous (the real JoinRound, each agent a thread with its own
//                  TcpStore connection and token) against the real embedded store server: the
//                  time from the first join to the last agent knowing its rank;
//   pattern N      the same key pattern on trainctl's store and on PyTorch's c10d::TCPStore (the
//                  one torchrun uses), side by side: N clients, each add(joined) -> set(member/i)
//                  -> the last sets "closed" -> wait(closed) -> get(member/(i+1)%N), then K rounds
//                  of set/get/add on its own keys; ops/s over all clients. trainctl's store runs
//                  it twice: on loopback TCP, and on the Unix socket that local jobs use; beside
//                  them, the ceiling of each transport (an echo server, no store behind it).
// Both run on TCP and on the Unix socket. Build: cmake --build build --target store_scale; run:
// build/src/store_scale [N...]
#include <malloc.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <barrier>
#include <cstdio>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "common/fs.h"
#include "rendezvous/rendezvous.h"
#include "store/tcp/tcp_store.h"

namespace trainctl {
namespace {

double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

// Heap bytes in use now, over every arena (what the process has allocated and not freed; unlike
// the resident size, not flattered or inflated by memory an earlier run freed).
long HeapBytes() {
  const struct mallinfo2 m = ::mallinfo2();
  return static_cast<long>(m.uordblks + m.hblkhd);
}

// The store server on loopback TCP, or on a Unix socket (as a local job's launcher serves it).
std::unique_ptr<TcpStoreServer> Server(int clients, bool unix_socket) {
  TcpStoreServerOptions so;
  so.token = "bench-token";
  so.max_connections = clients + 16;
  so.unix_socket = unix_socket;
  auto server = TcpStoreServer::Start(so);
  if (!server.ok()) {
    std::fprintf(stderr, "store server: %s\n", server.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(*server);
}

std::vector<std::unique_ptr<TcpStore>> Clients(const TcpStoreServer& server, int n) {
  std::vector<std::unique_ptr<TcpStore>> clients(n);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = t; i < n; i += 8) {
        TcpStoreOptions co;
        co.port = server.port();
        if (server.url().rfind("unix:", 0) == 0) co.unix_path = server.url().substr(5);
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

const char* Transport(bool unix_socket) { return unix_socket ? "unix" : "tcp"; }

void Rendezvous(int n, bool unix_socket) {
  auto server = Server(n, unix_socket);
  const long heap0 = HeapBytes();
  auto clients = Clients(*server, n);
  const long per_client = (HeapBytes() - heap0) / n;  // bytes: a client and its server side
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
      if (r.ok() && r->has_value())
        ranks[i] = (*r)->group_rank;
      else
        std::fprintf(stderr, "agent %d: %s\n", i, r.ok() ? "not in the round" : r.status().ToString().c_str());
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
  std::printf("rendezvous %5d agents (%s): %.3f s, ranks %s, %.1f KiB per connection (client and server side)\n", n,
              Transport(unix_socket), took, ok ? "0..N-1 distinct" : "WRONG", per_client / 1024.0);
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

double TrainctlPattern(int n, bool unix_socket) {
  auto server = Server(n, unix_socket);
  auto clients = Clients(*server, n);
  std::vector<Ops> ops(n);
  for (int i = 0; i < n; ++i) {
    TcpStore* c = clients[i].get();
    ops[i].add = [c](const std::string& k, int64_t d) { return *c->Add(k, d); };
    ops[i].set = [c](const std::string& k, const std::string& v) { (void)c->Set(k, v); };
    ops[i].get = [c](const std::string& k) { return *c->Get(k, std::chrono::seconds(120)); };
    ops[i].wait = [c](const std::string& k) { (void)c->Wait({k}, std::chrono::seconds(120)); };
  }
  return RunPattern(n, ops);
}

// What this machine's sockets allow a request-reply protocol: one thread echoing over epoll, n
// clients each sending a 32-byte request and reading the reply, as many times as the pattern's
// operations. No store behind it: the ceiling for any one-thread server on the same transport.
double PingPong(int n, bool unix_socket) {
  const int per_client = 5 + 3 * kRounds;
  int domain = unix_socket ? AF_UNIX : AF_INET;
  int listener = ::socket(domain, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_storage addr{};
  socklen_t len = unix_socket ? sizeof(sa_family_t) : sizeof(sockaddr_in);
  addr.ss_family = static_cast<sa_family_t>(domain);  // unix: autobind; tcp: 127.0.0.1, any port
  if (!unix_socket) reinterpret_cast<sockaddr_in*>(&addr)->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(listener, 4096) != 0) {
    std::perror("ping-pong listener");
    std::exit(1);
  }
  len = sizeof addr;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  std::thread echo([&] {
    int ep = ::epoll_create1(EPOLL_CLOEXEC);
    epoll_event e{EPOLLIN, {.fd = listener}};
    ::epoll_ctl(ep, EPOLL_CTL_ADD, listener, &e);
    std::vector<epoll_event> ready(1024);
    char buf[4096];
    for (int closed = 0; closed < n;) {
      const int got = ::epoll_wait(ep, ready.data(), static_cast<int>(ready.size()), 120000);
      if (got <= 0) break;
      for (int i = 0; i < got; ++i) {
        const int fd = ready[i].data.fd;
        if (fd == listener) {
          const int c = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
          int one = 1;
          if (!unix_socket) ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          epoll_event ce{EPOLLIN, {.fd = c}};
          ::epoll_ctl(ep, EPOLL_CTL_ADD, c, &ce);
        } else if (const ssize_t m = ::recv(fd, buf, sizeof buf, 0); m > 0) {
          (void)!::send(fd, buf, static_cast<size_t>(m), MSG_NOSIGNAL);
        } else {
          ::close(fd);
          ++closed;
        }
      }
    }
    ::close(ep);
  });
  std::vector<int> fds(n);
  for (int& fd : fds) {
    fd = ::socket(domain, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (!unix_socket) ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
      std::perror("ping-pong connect");
      std::exit(1);
    }
  }
  std::barrier start(n + 1);
  std::vector<std::thread> clients;
  for (int fd : fds) {
    clients.emplace_back([&, fd] {
      char b[32] = {};
      start.arrive_and_wait();
      for (int k = 0; k < per_client; ++k) {
        if (::send(fd, b, sizeof b, MSG_NOSIGNAL) != sizeof b) break;
        for (size_t got = 0; got < sizeof b;) {
          const ssize_t m = ::recv(fd, b + got, sizeof b - got, 0);
          if (m <= 0) return;
          got += static_cast<size_t>(m);
        }
      }
    });
  }
  start.arrive_and_wait();
  const auto t0 = Clock::now();
  for (auto& t : clients) t.join();
  const double took = Seconds(t0);
  for (int fd : fds) ::close(fd);
  echo.join();
  ::close(listener);
  return took;
}

void ComparePattern(int n) {
  const double ops_per_client = 5 + 3 * kRounds;
  const double tcp_s = TrainctlPattern(n, false), unix_s = TrainctlPattern(n, true);
  double torch_s;
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
      ops[i].set = [c](const std::string& k, const std::string& v) {
        c->set(k, std::vector<uint8_t>(v.begin(), v.end()));
      };
      ops[i].get = [c](const std::string& k) {
        auto v = c->get(k);
        return std::string(v.begin(), v.end());
      };
      ops[i].wait = [c](const std::string& k) { c->wait({k}); };
    }
    torch_s = RunPattern(n, ops);
  }
  const double total = ops_per_client * n;
  const double echo_tcp_s = PingPong(n, false), echo_unix_s = PingPong(n, true);
  std::printf(
      "pattern %5d clients: TCPStore (tcp) %.0f ops/s; trainctl tcp %.0f ops/s, %.2fx; trainctl unix "
      "%.0f ops/s, %.2fx; the sockets' request-reply ceiling: tcp %.0f, unix %.0f round trips/s\n",
      n, total / torch_s, total / tcp_s, torch_s / tcp_s, total / unix_s, torch_s / unix_s, total / echo_tcp_s,
      total / echo_unix_s);
}

}  // namespace
}  // namespace trainctl

int main(int argc, char** argv) {
  std::vector<int> sizes;
  for (int i = 1; i < argc; ++i) sizes.push_back(std::atoi(argv[i]));
  if (sizes.empty()) sizes = {256, 1024, 4096};
  trainctl::RaiseOpenFileLimit(3 * sizes.back() + 256);
  for (int n : sizes) {
    for (bool unix_socket : {false, true}) trainctl::Rendezvous(n, unix_socket);
  }
  for (int n : sizes) {
    if (n <= 2048) trainctl::ComparePattern(n);  // TCPStore runs out of descriptors past that here
  }
  return 0;
}
