#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include "common/fs.h"
#include "common/log.h"
#include "common/strings.h"
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
  uint32_t events = 0;  // what epoll watches for it
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

void SendError(Conn* c, Reply reply, const std::string& message) { Send(c, ReplyOf(reply).Str(message)); }

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
  // The serving thread's event loop (Serve): epoll over the listener, the wake-up pipe and the
  // connections; a turn costs what happened in it, not a pass over every connection (thousands
  // of agents each waiting on a key).
  TcpStoreServer* server = nullptr;
  int ep = -1;
  int max_connections = 0;
  bool listening = true;
  std::set<int> strangers;           // connections that have not presented the token yet
  Clock::time_point accept_again{};  // at the open-file limit: accept nothing until then
  char buf[65536];

  bool Watch(int op, int fd, uint32_t events);
  void ReadFrom(Conn* c);
  bool CloseOldestStranger();
  void Settle();
  Clock::time_point ExpireStrangers(Clock::time_point now, Clock::time_point until);
  void AcceptAll();
  void Run();  // until Stop() writes to the wake-up pipe, or epoll fails

  KvTable table;
  std::map<int, Conn> conns;
  // A waiting connection is listed under one key it still lacks; a change to that key looks at it
  // again. So a change costs what waits on that key, not a pass over every connection.
  std::unordered_map<std::string, std::vector<int>> waiting_on;
  std::set<std::pair<Clock::time_point, int>> deadlines;  // of the waiting connections
  std::set<int> touched;  // connections with replies to send or requests to run this turn

  Conn* Find(int fd) {
    auto it = conns.find(fd);
    return it == conns.end() ? nullptr : &it->second;
  }

  // The first of a WaitAny's keys that exists, or -1.
  int FirstPresent(const Conn* c) const {
    for (size_t i = 0; i < c->wait_keys.size(); ++i) {
      if (table.Find(c->wait_keys[i])) return static_cast<int>(i);
    }
    return -1;
  }

  // Takes a WaitAny's listings off its keys' lists (the key that woke it was taken already), so
  // that waits that come and go leave nothing behind.
  void Unlist(const Conn* c) {
    if (c->wait_op != Op::kWaitAny) return;
    for (const auto& k : c->wait_keys) {
      auto it = waiting_on.find(k);
      if (it == waiting_on.end()) continue;
      auto& fds = it->second;
      fds.erase(std::remove(fds.begin(), fds.end(), c->fd), fds.end());
      if (fds.empty()) waiting_on.erase(it);
    }
  }

  // Lists `c` under a key its wait lacks (a WaitAny: under each of its keys); false when it needs
  // none (a WaitAny: one of them exists).
  bool ListWaiter(Conn* c) {
    if (c->wait_op == Op::kWaitAny) {
      if (FirstPresent(c) >= 0) return false;
      Unlist(c);  // never twice on one list
      for (const auto& k : c->wait_keys) waiting_on[k].push_back(c->fd);
      return true;
    }
    for (const auto& k : c->wait_keys) {
      if (!table.Find(k)) {
        waiting_on[k].push_back(c->fd);
        return true;
      }
    }
    return false;
  }

  void StartWait(Conn* c, Op op, std::vector<std::string> keys, Clock::time_point deadline) {
    c->waiting = true;
    c->wait_op = op;
    c->wait_keys = std::move(keys);
    c->deadline = deadline;
    deadlines.insert({deadline, c->fd});
    ListWaiter(c);
  }

  void EndWait(Conn* c) {
    Unlist(c);
    c->waiting = false;
    deadlines.erase({c->deadline, c->fd});
    touched.insert(c->fd);
  }

  // Completes the waits listed under `key` whose keys now all exist; lists the others again.
  void WakeWaiters(const std::string& key) {
    auto it = waiting_on.find(key);
    if (it == waiting_on.end()) return;
    std::vector<int> fds = std::move(it->second);
    waiting_on.erase(it);
    for (int fd : fds) {
      Conn* c = Find(fd);
      if (!c || !c->waiting || c->dead) continue;  // gone, or its wait ended (fds are reused)
      if (ListWaiter(c)) continue;
      EndWait(c);
      if (c->wait_op == Op::kGet) {
        Send(c, ReplyOf(Reply::kOk).Str(*table.Find(c->wait_keys[0])));
      } else if (c->wait_op == Op::kWaitAny) {
        const int i = FirstPresent(c);
        Send(c, ReplyOf(Reply::kOk).I64(i).Str(*table.Find(c->wait_keys[static_cast<size_t>(i)])));
      } else {
        Send(c, ReplyOf(Reply::kOk));
      }
    }
  }

  // Ends the waits whose deadline has passed; returns the next deadline (or `later`).
  Clock::time_point ExpireWaiters(Clock::time_point now, Clock::time_point later) {
    while (!deadlines.empty() && deadlines.begin()->first <= now) {
      Conn* c = Find(deadlines.begin()->second);
      deadlines.erase(deadlines.begin());
      if (!c || !c->waiting) continue;
      Unlist(c);
      c->waiting = false;
      touched.insert(c->fd);
      Send(c, ReplyOf(Reply::kTimeout));
    }
    return deadlines.empty() ? later : std::min(later, deadlines.begin()->first);
  }

  // Returns true if the table changed (at `*changed`).
  bool Handle(Conn* c, const std::string& body, const std::string& token, std::string* changed) {
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
      if (op != Op::kHello || !r.I64(&version) || !r.Str(&presented) || !ConstantTimeEquals(presented, token)) {
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
        *changed = std::move(key);
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
          StartWait(c, Op::kGet, {key}, Clock::now() + Duration(std::min(n, kMaxWaitMs)));
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
        *changed = std::move(key);
        return true;
      }
      case Op::kCompareSet: {
        if (!r.Str(&key) || !r.Str(&expected) || !r.Str(&value)) return malformed();
        Send(c, ReplyOf(Reply::kOk).Str(table.CompareSet(key, expected, value)));
        *changed = std::move(key);
        return true;
      }
      case Op::kWait:
      case Op::kWaitAny: {
        int64_t count = 0;
        if (!r.I64(&count) || count < 0 || count > static_cast<int64_t>(kMaxWaitKeys)) {
          return malformed();
        }
        std::vector<std::string> keys(static_cast<size_t>(count));
        for (auto& k : keys) {
          if (!r.Str(&k)) return malformed();
        }
        if (!r.I64(&n) || (op == Op::kWaitAny && keys.empty())) return malformed();
        const std::string* any = nullptr;
        int64_t index = 0;
        for (; op == Op::kWaitAny && !any && index < count; ++index) any = table.Find(keys[index]);
        if (op == Op::kWait ? table.HasAll(keys) : any != nullptr) {
          Send(c, op == Op::kWait ? ReplyOf(Reply::kOk) : ReplyOf(Reply::kOk).I64(index - 1).Str(*any));
        } else if (n <= 0) {
          Send(c, ReplyOf(Reply::kTimeout));
        } else {
          StartWait(c, op, std::move(keys), Clock::now() + Duration(std::min(n, kMaxWaitMs)));
        }
        return false;
      }
      case Op::kDelete: {
        if (!r.Str(&key)) return malformed();
        Send(c, ReplyOf(Reply::kOk).I64(table.Erase(key) ? 1 : 0));
        return false;  // a key gone completes no wait
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
      std::string changed;
      if (Handle(c, body, token, &changed)) WakeWaiters(changed);
    }
  }
};

TcpStoreServer::TcpStoreServer(TcpStoreServerOptions options, int listen_fd, int wake_fd[2], uint16_t port,
                               std::string unix_name)
    : options_(std::move(options)),
      listen_fd_(listen_fd),
      wake_read_(wake_fd[0]),
      wake_write_(wake_fd[1]),
      port_(port),
      unix_name_(std::move(unix_name)),
      state_(std::make_unique<State>()) {}

namespace {

// Whether the process at the other end of the Unix socket `fd` runs as this one's user (or root).
bool OwnUsersProcess(int fd) {
  struct ucred peer {};
  socklen_t len = sizeof peer;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0) return false;
  if (peer.uid == ::geteuid() || peer.uid == 0) return true;
  LOG_DEBUG("store server: refused a connection from uid {} (pid {})", peer.uid, peer.pid);
  return false;
}

// A listening socket on host:port (port 0: any free one). Returns the fd and the port.
Result<std::pair<int, uint16_t>> ListenTcp(const std::string& host, uint16_t port, int backlog) {
  struct addrinfo hints {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  struct addrinfo* res = nullptr;
  std::string port_text = std::to_string(port);
  int gai = ::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &res);
  if (gai != 0) {
    return InvalidArgument("cannot resolve store address " + host + ": " + gai_strerror(gai));
  }
  int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    ::freeaddrinfo(res);
    return ErrnoStatus("socket", errno);
  }
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, res->ai_addr, res->ai_addrlen) != 0 || ::listen(fd, backlog) != 0) {
    int err = errno;
    ::freeaddrinfo(res);
    ::close(fd);
    return ErrnoStatus("cannot listen on " + host + ":" + port_text, err);
  }
  ::freeaddrinfo(res);
  struct sockaddr_storage addr {};
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return std::make_pair(fd, ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                                             : reinterpret_cast<sockaddr_in*>(&addr)->sin_port));
}

// A listening Unix socket under a fresh name in the abstract namespace (the kernel's autobind: no
// file to clean up, no name to collide with). Returns the fd and "@name".
Result<std::pair<int, std::string>> ListenUnixAbstract(int backlog) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus("socket", errno);
  struct sockaddr_un a {};
  a.sun_family = AF_UNIX;
  socklen_t len = sizeof(sa_family_t);  // only the family: the kernel picks a name
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(fd, backlog) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoStatus("cannot listen on a Unix socket", err);
  }
  len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const size_t name = len - offsetof(struct sockaddr_un, sun_path);  // the leading NUL included
  return std::make_pair(fd, "@" + std::string(a.sun_path + 1, name > 0 ? name - 1 : 0));
}

}  // namespace

Result<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(const TcpStoreServerOptions& options) {
  if (options.token.empty()) return InvalidArgument("the store server needs a token");
  // Every client of a big job may connect at once (the kernel caps this at net.core.somaxconn).
  const int backlog = std::max(512, options.max_connections);
  int fd = -1;
  uint16_t port = 0;
  std::string unix_name;
  if (options.unix_socket) {
    ASSIGN_OR_RETURN(std::tie(fd, unix_name), ListenUnixAbstract(backlog));
  } else {
    ASSIGN_OR_RETURN(std::tie(fd, port), ListenTcp(options.host, options.port, backlog));
  }
  int wake[2];
  if (::pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    ::close(fd);
    return ErrnoStatus("pipe", errno);
  }
  std::unique_ptr<TcpStoreServer> server(new TcpStoreServer(options, fd, wake, port, unix_name));
  server->thread_ = std::thread([s = server.get()] { s->Serve(); });
  return server;
}

std::string TcpStoreServer::url() const {
  return unix_name_.empty() ? "tcp://" + options_.host + ":" + std::to_string(port_) : "unix:" + unix_name_;
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
  struct rlimit rl {};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return wanted;
  const long room = static_cast<long>(rl.rlim_cur) - 64;
  return static_cast<int>(std::max(8L, std::min<long>(wanted, room)));
}

}  // namespace

bool TcpStoreServer::State::Watch(int op, int fd, uint32_t events) {
  struct epoll_event e {};
  e.events = events;
  e.data.fd = fd;
  return ::epoll_ctl(ep, op, fd, &e) == 0;
}

// Reads what `c` has sent and runs it (a hello, the requests after it). Before the token, no more
// than a hello's worth is ever buffered.
void TcpStoreServer::State::ReadFrom(Conn* c) {
  touched.insert(c->fd);
  const size_t room =
      c->authed
          ? sizeof buf
          : std::min<size_t>(sizeof buf, wire::kMaxHelloBytes - std::min<size_t>(c->in.size(), wire::kMaxHelloBytes));
  if (room == 0) {
    c->dead = true;
    return;
  }
  ssize_t n = ::recv(c->fd, buf, room, 0);
  if (n > 0) {
    c->in.append(buf, static_cast<size_t>(n));
    ProcessBuffered(c, server->options_.token);
  } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
    c->dead = true;
  }
}

// Closes the oldest connection that has not said hello, to make room for a newcomer. A hello may
// be waiting in a stranger's socket, unread (a server behind on its reading, hundreds of agents
// connecting at once): it is read first, and a stranger that sent the token stays.
bool TcpStoreServer::State::CloseOldestStranger() {
  std::vector<Conn*> order;
  for (int fd : strangers) {
    Conn* c = Find(fd);
    if (c && !c->authed && !c->dead) order.push_back(c);
  }
  std::sort(order.begin(), order.end(), [](const Conn* a, const Conn* b) { return a->accepted < b->accepted; });
  for (Conn* c : order) {
    if (!c->closing) ReadFrom(c);
    if (c->authed) {
      strangers.erase(c->fd);
      continue;
    }
    c->dead = true;  // closed by Settle, without a reply: it never said who it is
    strangers.erase(c->fd);
    return true;
  }
  return false;
}

// Runs what the touched connections have buffered, sends their replies, and closes the dead.
void TcpStoreServer::State::Settle() {
  while (!touched.empty()) {
    const int fd = *touched.begin();
    touched.erase(touched.begin());
    Conn* c = Find(fd);
    if (!c) continue;
    ProcessBuffered(c, server->options_.token);  // a completed wait may have left requests behind it
    Flush(c);
    if (c->authed) strangers.erase(fd);
    if (c->dead || (c->closing && c->out.empty())) {
      if (c->waiting) {
        deadlines.erase({c->deadline, fd});
        Unlist(c);
      }
      strangers.erase(fd);
      ::epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
      ::close(fd);
      conns.erase(fd);
      continue;
    }
    uint32_t events = 0;
    if (!c->waiting && !c->closing) events |= EPOLLIN;
    // A waiting client that gives up (an agent stopped by a signal drops its connection) is
    // seen at once, not at its wait's deadline.
    if (c->waiting) events |= EPOLLRDHUP;
    if (!c->out.empty()) events |= EPOLLOUT;
    if (events != c->events && Watch(EPOLL_CTL_MOD, fd, events)) c->events = events;
  }
}

// Refuses the strangers whose time to present the token has passed; returns `until`, or the
// earliest such time to come.
Clock::time_point TcpStoreServer::State::ExpireStrangers(Clock::time_point now, Clock::time_point until) {
  for (int fd : strangers) {
    Conn* c = Find(fd);
    if (!c || c->closing) continue;
    if (now >= c->accepted + server->options_.auth_timeout) {
      SendError(c, Reply::kUnauthorized, "no token presented in time");
      c->closing = true;
      touched.insert(fd);
    } else {
      until = std::min(until, c->accepted + server->options_.auth_timeout);
    }
  }
  return until;
}

// Takes the connections waiting on the listener, while there is room.
void TcpStoreServer::State::AcceptAll() {
  int live = static_cast<int>(conns.size());
  while (true) {
    int cfd = ::accept4(server->listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (cfd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors: make room by dropping the oldest stranger, and wait a little rather
        // than watch a listener that stays readable (a spin at 100 % of a core).
        if (!CloseOldestStranger()) accept_again = Clock::now() + std::chrono::milliseconds(100);
      }
      return;
    }
    if (server->unix_name_.empty()) {
      int one = 1;
      ::setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    } else if (!OwnUsersProcess(cfd)) {
      // A Unix socket names its peer: another user's process is closed before it can try a token
      // (the abstract namespace has no file permissions to keep it out).
      ::close(cfd);
      continue;
    }
    if ((static_cast<int>(strangers.size()) >= server->options_.max_unauthenticated || live >= max_connections) &&
        CloseOldestStranger()) {
      --live;
    }
    if (live >= max_connections) {  // full of the job's own clients: no room
      ::close(cfd);
      return;
    }
    Conn& c = conns[cfd];
    c.fd = cfd;
    c.accepted = Clock::now();
    c.events = EPOLLIN;
    Watch(EPOLL_CTL_ADD, cfd, EPOLLIN);
    ReadFrom(&c);  // its hello, when it came with the connection (the job's clients)
    if (!c.authed) strangers.insert(cfd);
    if (++live >= max_connections && strangers.empty()) return;
  }
}

void TcpStoreServer::State::Run() {
  Watch(EPOLL_CTL_ADD, server->wake_read_, EPOLLIN);
  Watch(EPOLL_CTL_ADD, server->listen_fd_, EPOLLIN);
  std::vector<struct epoll_event> ready(1024);
  while (true) {
    const auto now = Clock::now();
    Clock::time_point until = ExpireStrangers(now, ExpireWaiters(now, now + std::chrono::seconds(1)));
    Settle();
    // Full: accept only to replace a stranger (a connection without the token) with a newcomer.
    const bool accepting =
        (static_cast<int>(conns.size()) < max_connections || !strangers.empty()) && now >= accept_again;
    if (now < accept_again) until = std::min(until, accept_again);
    if (accepting != listening && Watch(EPOLL_CTL_MOD, server->listen_fd_, accepting ? uint32_t{EPOLLIN} : 0u)) {
      listening = accepting;
    }
    const int rc =
        ::epoll_wait(ep, ready.data(), static_cast<int>(ready.size()), static_cast<int>(Remaining(until).count()) + 1);
    if (rc < 0 && errno != EINTR) {
      LOG_ERROR("store server: epoll_wait failed: {}", std::strerror(errno));
      return;
    }
    for (int i = 0; i < std::max(rc, 0); ++i) {
      const int fd = ready[i].data.fd;
      if (fd == server->wake_read_) return;  // Stop()
      if (fd == server->listen_fd_) {
        AcceptAll();
        continue;
      }
      Conn* c = Find(fd);
      if (!c || c->dead) continue;
      touched.insert(fd);
      if (c->waiting && (ready[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))) {
        c->dead = true;
      } else if (ready[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        ReadFrom(c);
      }
    }
    Settle();
  }
}

void TcpStoreServer::Serve() {
  State& s = *state_;
  s.server = this;
  s.max_connections = FdRoom(options_.max_connections);
  s.ep = ::epoll_create1(EPOLL_CLOEXEC);
  if (s.ep < 0) {
    LOG_ERROR("store server: epoll_create1 failed: {}", std::strerror(errno));
    return;
  }
  s.Run();
  ::close(s.ep);
}

Result<std::unique_ptr<TcpStoreServer>> ServeJobStore(TcpStoreServerOptions options, int clients) {
  options.max_connections = std::max(options.max_connections, clients + 64);
  RaiseOpenFileLimit(options.max_connections + 256);
  auto started = TcpStoreServer::Start(options);
  if (!started.ok() && options.unix_socket) {  // Unix sockets refused here (a confined sandbox): TCP
    LOG_DEBUG("the job's store on a Unix socket: {}; serving it on {} instead", started.status().message(),
              options.host);
    options.unix_socket = false;
    started = TcpStoreServer::Start(options);
  }
  return started;
}

}  // namespace trainctl
