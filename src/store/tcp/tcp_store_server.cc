#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

#include "common/strings.h"
#include "common/log.h"
#include "store/memory/memory_store.h"
#include "store/tcp/tcp_store.h"
#include "store/tcp/wire.h"

namespace trainctl {
namespace {

using wire::Op;
using wire::Reply;

constexpr int64_t kMaxWaitMs = 24LL * 3600 * 1000;
constexpr size_t kMaxWaitKeys = 4096;

struct Conn {
  int fd = -1;
  std::string in, out;
  bool authed = false;
  bool closing = false;  // close once `out` is flushed
  bool dead = false;
  Clock::time_point accepted;
  bool waiting = false;
  Op wait_op = Op::kWait;
  std::vector<std::string> wait_keys;
  Clock::time_point deadline;
};

wire::Writer ReplyOf(Reply reply) {
  wire::Writer w;
  w.U8(static_cast<uint8_t>(reply));
  return w;
}

void Send(Conn* c, const wire::Writer& reply) { c->out += reply.Frame(); }

void SendError(Conn* c, Reply reply, const std::string& message) {
  Send(c, ReplyOf(reply).Str(message));
}

void Flush(Conn* c) {
  while (!c->out.empty()) {
    ssize_t n = ::send(c->fd, c->out.data(), c->out.size(), MSG_NOSIGNAL);
    if (n > 0) {
      c->out.erase(0, static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;
    } else {
      c->dead = true;
      return;
    }
  }
}

}  // namespace

struct TcpStoreServer::State {
  KvTable table;
  std::map<int, Conn> conns;

  // Completes waits whose keys now all exist.
  void WakeWaiters() {
    for (auto& [fd, c] : conns) {
      if (!c.waiting || !table.HasAll(c.wait_keys)) continue;
      c.waiting = false;
      if (c.wait_op == Op::kGet) {
        Send(&c, ReplyOf(Reply::kOk).Str(*table.Find(c.wait_keys[0])));
      } else {
        Send(&c, ReplyOf(Reply::kOk));
      }
    }
  }

  void ExpireWaiters(Clock::time_point now) {
    for (auto& [fd, c] : conns) {
      if (c.waiting && now >= c.deadline) {
        c.waiting = false;
        Send(&c, ReplyOf(Reply::kTimeout));
      }
    }
  }

  // Returns true if the table changed.
  bool Handle(Conn* c, const std::string& body, const std::string& token) {
    wire::Reader r(body);
    uint8_t op_byte = 0;
    if (!r.U8(&op_byte)) {
      SendError(c, Reply::kError, "empty request");
      c->closing = true;
      return false;
    }
    Op op = static_cast<Op>(op_byte);
    auto malformed = [c] {
      SendError(c, Reply::kError, "malformed request");
      c->closing = true;
      return false;
    };
    if (!c->authed) {
      int64_t version = 0;
      std::string presented;
      if (op != Op::kHello || !r.I64(&version) || !r.Str(&presented) ||
          !ConstantTimeEquals(presented, token)) {
        SendError(c, Reply::kUnauthorized, "the job's store token is required");
        c->closing = true;
        return false;
      }
      if (version != wire::kProtocolVersion) {
        SendError(c, Reply::kError, "unsupported protocol version " + std::to_string(version));
        c->closing = true;
        return false;
      }
      c->authed = true;
      Send(c, ReplyOf(Reply::kOk));
      return false;
    }
    std::string key, value, expected;
    int64_t n = 0;
    switch (op) {
      case Op::kSet:
        if (!r.Str(&key) || !r.Str(&value)) return malformed();
        table.Set(key, value);
        Send(c, ReplyOf(Reply::kOk));
        return true;
      case Op::kGet:
      case Op::kTryGet: {
        if (!r.Str(&key)) return malformed();
        if (op == Op::kGet && !r.I64(&n)) return malformed();
        if (const std::string* v = table.Find(key)) {
          Send(c, ReplyOf(Reply::kOk).Str(*v));
        } else if (op == Op::kTryGet || n <= 0) {
          Send(c, ReplyOf(Reply::kNotFound));
        } else {
          c->waiting = true;
          c->wait_op = Op::kGet;
          c->wait_keys = {key};
          c->deadline = Clock::now() + Duration(std::min(n, kMaxWaitMs));
        }
        return false;
      }
      case Op::kAdd: {
        if (!r.Str(&key) || !r.I64(&n)) return malformed();
        auto v = table.Add(key, n);
        if (!v.ok()) {
          SendError(c, Reply::kError, v.status().message());
          return false;
        }
        Send(c, ReplyOf(Reply::kOk).I64(*v));
        return true;
      }
      case Op::kCompareSet: {
        if (!r.Str(&key) || !r.Str(&expected) || !r.Str(&value)) return malformed();
        Send(c, ReplyOf(Reply::kOk).Str(table.CompareSet(key, expected, value)));
        return true;
      }
      case Op::kWait: {
        int64_t count = 0;
        if (!r.I64(&count) || count < 0 || count > static_cast<int64_t>(kMaxWaitKeys)) {
          return malformed();
        }
        std::vector<std::string> keys(static_cast<size_t>(count));
        for (auto& k : keys) {
          if (!r.Str(&k)) return malformed();
        }
        if (!r.I64(&n)) return malformed();
        if (table.HasAll(keys)) {
          Send(c, ReplyOf(Reply::kOk));
        } else if (n <= 0) {
          Send(c, ReplyOf(Reply::kTimeout));
        } else {
          c->waiting = true;
          c->wait_op = Op::kWait;
          c->wait_keys = std::move(keys);
          c->deadline = Clock::now() + Duration(std::min(n, kMaxWaitMs));
        }
        return false;
      }
      case Op::kDelete: {
        if (!r.Str(&key)) return malformed();
        Send(c, ReplyOf(Reply::kOk).I64(table.Erase(key) ? 1 : 0));
        return true;
      }
      default:
        return malformed();
    }
  }

  // Runs the requests already buffered on `c`, one at a time (a waiting request holds the rest).
  void ProcessBuffered(Conn* c, const std::string& token) {
    std::string body;
    while (!c->waiting && !c->closing && !c->dead) {
      int got = wire::TakeFrame(&c->in, &body, c->authed ? wire::kMaxFrameBytes : wire::kMaxHelloBytes);
      if (got == 0) break;
      if (got < 0) {
        SendError(c, c->authed ? Reply::kError : Reply::kUnauthorized,
                  c->authed ? "request larger than the 64 MiB limit" : "the job's store token is required");
        c->closing = true;
        c->in.clear();
        break;
      }
      if (Handle(c, body, token)) WakeWaiters();
    }
  }
};

TcpStoreServer::TcpStoreServer(TcpStoreServerOptions options, int listen_fd, int wake_fd[2],
                               uint16_t port)
    : options_(std::move(options)),
      listen_fd_(listen_fd),
      wake_read_(wake_fd[0]),
      wake_write_(wake_fd[1]),
      port_(port),
      state_(std::make_unique<State>()) {}

Result<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(const TcpStoreServerOptions& options) {
  if (options.token.empty()) return InvalidArgument("the store server needs a token");
  struct addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  struct addrinfo* res = nullptr;
  std::string port_text = std::to_string(options.port);
  int gai = ::getaddrinfo(options.host.c_str(), port_text.c_str(), &hints, &res);
  if (gai != 0) {
    return InvalidArgument("cannot resolve store address " + options.host + ": " + gai_strerror(gai));
  }
  int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    ::freeaddrinfo(res);
    return ErrnoStatus("socket", errno);
  }
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, res->ai_addr, res->ai_addrlen) != 0 || ::listen(fd, 512) != 0) {
    int err = errno;
    ::freeaddrinfo(res);
    ::close(fd);
    return ErrnoStatus("cannot listen on " + options.host + ":" + port_text, err);
  }
  ::freeaddrinfo(res);
  struct sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  uint16_t port = ntohs(addr.ss_family == AF_INET6
                            ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                            : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  int wake[2];
  if (::pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    ::close(fd);
    return ErrnoStatus("pipe", errno);
  }
  std::unique_ptr<TcpStoreServer> server(new TcpStoreServer(options, fd, wake, port));
  server->thread_ = std::thread([s = server.get()] { s->Serve(); });
  return server;
}

TcpStoreServer::~TcpStoreServer() { Stop(); }

void TcpStoreServer::Stop() {
  if (stopping_.exchange(true)) return;
  char b = 1;
  ssize_t ignored = ::write(wake_write_, &b, 1);
  (void)ignored;
  if (thread_.joinable()) thread_.join();
  for (auto& [fd, c] : state_->conns) ::close(fd);
  state_->conns.clear();
  ::close(listen_fd_);
  ::close(wake_read_);
  ::close(wake_write_);
}

namespace {

// How many connections the open-file limit leaves room for, keeping some for the process itself
// (the launcher writes status.json, agents and workers start, logs open).
int FdRoom(int wanted) {
  struct rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return wanted;
  const long room = static_cast<long>(rl.rlim_cur) - 64;
  return static_cast<int>(std::max(8L, std::min<long>(wanted, room)));
}

}  // namespace

void TcpStoreServer::Serve() {
  State& s = *state_;
  std::vector<struct pollfd> fds;
  char buf[65536];
  const int max_connections = FdRoom(options_.max_connections);
  // The oldest connection that has not said hello: the one to close for a newcomer.
  auto close_oldest_unauthenticated = [&] {
    Conn* oldest = nullptr;
    for (auto& [fd, c] : s.conns) {
      if (!c.authed && !c.dead && (!oldest || c.accepted < oldest->accepted)) oldest = &c;
    }
    if (oldest) oldest->dead = true;  // closed below, without a reply: it never said who it is
    return oldest != nullptr;
  };
  Clock::time_point accept_again{};  // at the open-file limit: accept nothing until then
  while (true) {
    auto now = Clock::now();
    Duration wait = std::chrono::seconds(1);
    fds.clear();
    fds.push_back({wake_read_, POLLIN, 0});
    int live = 0, strangers = 0;
    for (const auto& [fd, c] : s.conns) {
      live += !c.dead;
      strangers += !c.dead && !c.authed;
    }
    // Full: accept only to replace a stranger (a connection without the token) with a newcomer.
    bool accepting = (live < max_connections || strangers > 0) && now >= accept_again;
    if (now < accept_again) wait = std::min(wait, Remaining(accept_again));
    fds.push_back({listen_fd_, static_cast<short>(accepting ? POLLIN : 0), 0});
    for (auto& [fd, c] : s.conns) {
      short ev = 0;
      if (!c.waiting && !c.closing) ev |= POLLIN;
      if (!c.out.empty()) ev |= POLLOUT;
      fds.push_back({fd, ev, 0});
      if (c.waiting) wait = std::min(wait, Remaining(c.deadline));
      if (!c.authed) wait = std::min(wait, Remaining(c.accepted + options_.auth_timeout));
    }
    int rc = ::poll(fds.data(), fds.size(), static_cast<int>(wait.count()) + 1);
    if (rc < 0 && errno != EINTR) {
      LOG_ERROR("store server: poll failed: {}", std::strerror(errno));
      return;
    }
    if (fds[0].revents) return;  // Stop()
    if (fds[1].revents & POLLIN) {
      while (true) {
        int cfd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (cfd < 0) {
          if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            // Out of descriptors: make room by dropping the oldest stranger, and wait a little
            // rather than poll a listener that stays readable (a spin at 100 % of a core).
            if (!close_oldest_unauthenticated()) accept_again = Clock::now() + std::chrono::milliseconds(100);
          }
          break;
        }
        int one = 1;
        ::setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if ((strangers >= options_.max_unauthenticated || live >= max_connections) &&
            close_oldest_unauthenticated()) {
          --strangers;
          --live;
        }
        if (live >= max_connections) {  // full of the job's own clients: no room
          ::close(cfd);
          break;
        }
        Conn& c = s.conns[cfd];
        c.fd = cfd;
        c.accepted = Clock::now();
        ++live;
        ++strangers;
        if (live >= max_connections && strangers == 0) break;
      }
    }
    for (size_t i = 2; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      auto it = s.conns.find(fds[i].fd);
      if (it == s.conns.end()) continue;
      Conn& c = it->second;
      if (c.dead) continue;
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
        // Before the token, no more than a hello's worth is ever buffered.
        const size_t room = c.authed ? sizeof buf : std::min(sizeof buf, wire::kMaxHelloBytes + 4 - std::min<size_t>(c.in.size(), wire::kMaxHelloBytes + 4));
        if (room == 0) {
          c.dead = true;
          continue;
        }
        ssize_t n = ::recv(c.fd, buf, room, 0);
        if (n > 0) {
          c.in.append(buf, static_cast<size_t>(n));
          s.ProcessBuffered(&c, options_.token);
        } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
          c.dead = true;
        }
      }
    }
    now = Clock::now();
    s.ExpireWaiters(now);
    for (auto& [fd, c] : s.conns) {
      if (!c.authed && !c.closing && now >= c.accepted + options_.auth_timeout) {
        SendError(&c, Reply::kUnauthorized, "no token presented in time");
        c.closing = true;
      }
      // A completed wait may have left requests buffered behind it.
      s.ProcessBuffered(&c, options_.token);
      Flush(&c);
    }
    std::erase_if(s.conns, [](auto& kv) {
      const Conn& c = kv.second;
      if (c.dead || (c.closing && c.out.empty())) {
        ::close(c.fd);
        return true;
      }
      return false;
    });
  }
}

}  // namespace trainctl
