#include "comm/ps/ps.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>

#include "comm/shm/segment.h"
#include "common/address.h"
#include "common/socket.h"
#include "common/strings.h"

namespace trainctl::comm::ps {
namespace {

enum Op : uint8_t {
  kHello = 1,    // token, worker                      -> info
  kInit,         // total steps, optimizer steps, step, count, names, params, state
  kPull,         //                                    -> version, params
  kPushPull,     // base version, worker step, grads   -> version, params
  kState,        //                                    -> version, optimizer steps, names, params, state
  kDone,         // worker                             -> done count
  kInfo,         // worker                             -> info
  kDoneCount,    //                                    -> done count
  kShmAttach,    // segment name, count: gradients and parameters through shared memory
  kPushPullShm,  // base version, worker step (gradients in the segment) -> version (parameters there)
};
enum Reply : uint8_t { kOk = 0, kError, kUnauthorized };

constexpr uint64_t kMaxPayloadBytes = uint64_t{16} << 30;

// A message of `kind` (an Op or a Reply), its fields to follow (common/wire.h).
wire::Writer Out(uint8_t kind) {
  wire::Writer w;
  w.U8(kind);
  return w;
}
using In = wire::Reader;

// Blocking reads and writes on a server connection. false: closed or broken.
bool RecvExact(int fd, void* out, size_t size) {
  char* p = static_cast<char*>(out);
  for (size_t got = 0; got < size;) {
    ssize_t n = ::recv(fd, p + got, size - got, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return false;
    }
    got += n;
  }
  return true;
}

// A message's kind and the length of its fields.
bool ReadHead(int fd, uint8_t* op, uint64_t* len) {
  char head[wire::kFrameHeaderBytes];
  if (!RecvExact(fd, head, sizeof head)) return false;
  *op = wire::FrameKind(std::string_view(head, sizeof head));
  *len = wire::FrameRest(std::string_view(head, sizeof head));
  return true;
}

bool ReadMessage(int fd, uint64_t max, uint8_t* op, std::string* payload) {
  uint64_t len = 0;
  if (!ReadHead(fd, op, &len) || len > max) return false;
  payload->resize(len);
  return RecvExact(fd, payload->data(), len);
}

// Sends the pieces back to back with gathered writes: no copy into one buffer.
bool SendParts(int fd, std::vector<struct iovec> parts) {
  size_t i = 0;
  while (i < parts.size()) {
    struct msghdr m {};
    m.msg_iov = parts.data() + i;
    m.msg_iovlen = std::min<size_t>(parts.size() - i, 64);
    ssize_t n = ::sendmsg(fd, &m, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    for (size_t left = n; left > 0 && i < parts.size();) {
      size_t take = std::min(left, parts[i].iov_len);
      parts[i].iov_base = static_cast<char*>(parts[i].iov_base) + take;
      parts[i].iov_len -= take;
      left -= take;
      if (parts[i].iov_len == 0) ++i;
    }
    while (i < parts.size() && parts[i].iov_len == 0) ++i;
  }
  return true;
}

bool WriteAll(int fd, const std::string& data) {
  return SendParts(fd, {{const_cast<char*>(data.data()), data.size()}});
}

// The reply to a pull or push: kOk, the version, the parameters, straight from `params`.
bool SendParams(int fd, int64_t version, const float* params, int64_t count) {
  const std::string head = wire::FrameHeader(kOk, sizeof version + count * sizeof(float));
  return SendParts(fd, {{const_cast<char*>(head.data()), head.size()},
                        {&version, sizeof version},
                        {const_cast<float*>(params), count * sizeof(float)}});
}

void SetTimeout(int fd, int option, Duration d) {
  struct timeval tv {};
  tv.tv_sec = d.count() / 1000;
  tv.tv_usec = (d.count() % 1000) * 1000;
  ::setsockopt(fd, SOL_SOCKET, option, &tv, sizeof tv);
}

std::string ErrorReply(const std::string& message) { return Out(kError).Str(message).Frame(); }

}  // namespace

std::pair<int64_t, int64_t> ShardRange(int64_t count, int shards, int index) {
  return {count * index / shards, count * (index + 1) / shards};
}

// What one shard holds; guarded by `mu`.
struct Server::State {
  std::mutex mu;
  std::condition_variable cv;
  bool initialized = false;
  int64_t version = 0;
  int64_t init_step = 0;
  int64_t total_count = 0;
  int64_t count = 0;
  std::unique_ptr<ShardOptimizer> opt;
  std::vector<std::vector<float>> pending;  // sync: each worker's gradients for `version`,
  std::vector<const float*> pending_at;     // here or in its shared-memory segment
  std::vector<bool> arrived;
  int arrived_count = 0;
  std::vector<int64_t> steps_done;  // by worker
  std::vector<bool> done;
  int64_t done_count = 0;
  int64_t dropped = 0;

  std::string Info(int worker) const {
    wire::Writer o = Out(kOk);
    o.I64(initialized)
        .I64(version)
        .I64(worker >= 0 && worker < static_cast<int>(steps_done.size()) ? steps_done[worker] : 0);
    return o.I64(init_step).Frame();
  }
  std::string Params() const {
    wire::Writer o = Out(kOk);
    o.I64(version);
    if (opt) o.Floats(opt->params(), count);
    return o.Frame();
  }
};

Server::Server(ServerOptions options, int listen_fd, int port)
    : o_(std::move(options)), listen_fd_(listen_fd), port_(port), state_(std::make_unique<State>()) {
  state_->steps_done.assign(o_.workers, 0);
  state_->done.assign(o_.workers, false);
  state_->pending.resize(o_.workers);
  state_->pending_at.assign(o_.workers, nullptr);
  state_->arrived.assign(o_.workers, false);
  acceptor_ = std::thread([this] { Accept(); });
}

Result<std::unique_ptr<Server>> Server::Start(const ServerOptions& o) {
  if (o.token.empty()) return InvalidArgument("a parameter server needs the job's token");
  if (o.workers < 1) return InvalidArgument("a parameter server needs at least one worker");
  struct addrinfo hints {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  struct addrinfo* res = nullptr;
  if (::getaddrinfo(o.host.c_str(), std::to_string(o.port).c_str(), &hints, &res) != 0) {
    return InvalidArgument("cannot resolve the parameter server's address " + o.host);
  }
  int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  if (fd >= 0) ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int rc = fd < 0 ? -1 : ::bind(fd, res->ai_addr, res->ai_addrlen);
  ::freeaddrinfo(res);
  if (rc != 0 || ::listen(fd, 128) != 0) {
    int err = errno;
    if (fd >= 0) ::close(fd);
    return ErrnoStatus("cannot listen on " + o.host + ":" + std::to_string(o.port), err);
  }
  struct sockaddr_storage addr {};
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                              : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  return std::unique_ptr<Server>(new Server(o, fd, port));
}

Server::~Server() { Stop(); }

void Server::Stop() {
  if (stopping_.exchange(true)) return;
  ::shutdown(listen_fd_, SHUT_RDWR);
  acceptor_.join();
  ::close(listen_fd_);
  std::unique_lock<std::mutex> lock(conns_mu_);
  for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
  {
    std::lock_guard<std::mutex> state_lock(state_->mu);  // a waiting push sees stopping_
  }
  state_->cv.notify_all();
  conns_cv_.wait(lock, [&] { return fds_.empty(); });
}

int64_t Server::dropped() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->dropped;
}

void Server::Accept() {
  // Every worker holds one connection (and may reconnect once replaced); more is someone else.
  const size_t max_connections = 4 * static_cast<size_t>(o_.workers) + 16;
  while (!stopping_) {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (stopping_) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // EMFILE: let others finish
      continue;
    }
    std::lock_guard<std::mutex> lock(conns_mu_);
    if (stopping_ || fds_.size() >= max_connections) {
      ::close(fd);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fds_.push_back(fd);
    std::thread([this, fd] {
      Serve(fd);
      std::lock_guard<std::mutex> lock(conns_mu_);
      ::close(fd);
      fds_.erase(std::find(fds_.begin(), fds_.end(), fd));
      conns_cv_.notify_all();
    }).detach();
  }
}

bool Server::Greet(int fd, int* worker) {
  // Nothing but a small hello, within 10 s, before the token is checked.
  SetTimeout(fd, SO_RCVTIMEO, std::chrono::seconds(10));
  SetTimeout(fd, SO_SNDTIMEO, o_.timeout);
  uint8_t op = 0;
  std::string payload, token;
  int64_t w = -1;
  if (!ReadMessage(fd, wire::kMaxHelloBytes - wire::kFrameHeaderBytes, &op, &payload) || op != kHello) return false;
  In hello(payload);
  if (!hello.Str(&token) || !hello.I64(&w) || !ConstantTimeEquals(token, o_.token)) {
    WriteAll(fd, Out(kUnauthorized).Str("wrong token").Frame());
    return false;
  }
  if (w < -1 || w >= o_.workers) {
    WriteAll(fd, ErrorReply("worker " + std::to_string(w) + " is not one of the " + std::to_string(o_.workers) +
                            " workers"));
    return false;
  }
  *worker = static_cast<int>(w);
  std::lock_guard<std::mutex> lock(state_->mu);
  return WriteAll(fd, state_->Info(*worker));
}

void Server::Serve(int fd) {
  int worker = -1;
  if (!Greet(fd, &worker)) return;
  SetTimeout(fd, SO_RCVTIMEO, Duration(0));  // an idle worker (evaluating, checkpointing) is fine
  Conn conn;
  uint8_t op = 0;
  uint64_t len = 0;
  std::string payload;
  while (!stopping_ && ReadHead(fd, &op, &len)) {
    if (op == kPushPull || op == kPushPullShm) {
      if (!ServePush(fd, worker, op, len, &conn)) break;
      continue;
    }
    if (len > kMaxPayloadBytes) break;
    payload.resize(len);
    if (!RecvExact(fd, payload.data(), len)) break;
    std::unique_lock<std::mutex> lock(state_->mu);
    const std::string reply = Answer(op, payload, worker, &conn);
    lock.unlock();
    if (!WriteAll(fd, reply)) break;
  }
}

std::string Server::Answer(uint8_t op, const std::string& payload, int worker, Conn* conn) {
  State& s = *state_;
  switch (op) {
    case kInfo:
      return s.Info(worker);
    case kInit:
      return Init(payload);
    case kPull:
      return s.initialized ? s.Params() : ErrorReply("the shard is not initialized yet");
    case kState: {
      if (!s.initialized) return ErrorReply("the shard is not initialized yet");
      auto state = s.opt->state();
      wire::Writer o = Out(kOk);
      o.I64(s.version).I64(s.opt->steps()).I64(static_cast<int64_t>(state.size()));
      for (const auto& [name, buf] : state) o.Str(name);
      o.Floats(s.opt->params(), s.count);
      for (const auto& [name, buf] : state) o.Floats(buf, s.count);
      return o.Frame();
    }
    case kDone:
      if (worker >= 0 && !s.done[worker]) {
        s.done[worker] = true;
        ++s.done_count;
      }
      return Out(kOk).I64(s.done_count).Frame();
    case kDoneCount:
      return Out(kOk).I64(s.done_count).Frame();
    case kShmAttach:
      return ShmAttach(payload, conn);
    default:
      return ErrorReply("unknown request " + std::to_string(op));
  }
}

// The shard's first parameters and optimizer state, from worker 0 (or a checkpoint it read).
std::string Server::Init(const std::string& payload) {
  State& s = *state_;
  In in(payload);
  int64_t total_steps, opt_steps, step, count, nstate;
  if (!in.I64(&total_steps) || !in.I64(&opt_steps) || !in.I64(&step) || !in.I64(&count) || !in.I64(&nstate) ||
      count < 0 || nstate < 0 || nstate > 8) {
    return ErrorReply("malformed init");
  }
  std::vector<std::string> names(nstate);
  bool ok = true;
  for (auto& n : names) ok = ok && in.Str(&n);
  auto opt = ok ? o_.make_optimizer(count, total_steps) : nullptr;
  if (!opt) return ErrorReply("malformed init");
  auto state = opt->state();
  ok = in.Floats(opt->params(), count) && state.size() == names.size();
  for (size_t i = 0; ok && i < state.size(); ++i) ok = state[i].first == names[i] && in.Floats(state[i].second, count);
  if (!ok || !in.done()) {
    return ErrorReply("malformed init: the optimizer's state does not match the shard's");
  }
  opt->set_steps(opt_steps);
  s.opt = std::move(opt);
  s.count = count;
  // A sync version is a step; async, every worker's push is one.
  s.version = o_.async ? step * o_.workers : step;
  s.init_step = step;
  s.initialized = true;
  for (auto& p : s.pending) p.assign(count, 0);
  s.arrived.assign(o_.workers, false);
  s.arrived_count = 0;
  s.steps_done.assign(o_.workers, 0);
  s.cv.notify_all();
  return Out(kOk).Frame();
}

// The worker's segment for this shard: its gradients, then the parameters it gets back.
std::string Server::ShmAttach(const std::string& payload, Conn* conn) {
  State& s = *state_;
  In in(payload);
  std::string name;
  int64_t count = -1;
  if (!in.Str(&name) || !in.I64(&count) || !s.initialized || count != s.count || count <= 0) {
    return ErrorReply("cannot attach a segment for " + std::to_string(count) + " floats");
  }
  const size_t bytes = 2 * count * sizeof(float);
  auto opened = OpenSegment(name, bytes);
  void* base = opened.ok() ? ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, *opened, 0) : MAP_FAILED;
  if (opened.ok()) ::close(*opened);
  if (base == MAP_FAILED) return ErrorReply(opened.ok() ? "cannot map " + name : opened.status().message());
  conn->Unmap();
  conn->base = base;
  conn->bytes = bytes;
  return Out(kOk).Frame();
}

// A push. Over TCP the gradients go straight from the socket into this connection's buffer (no
// lock held), which then changes places with the worker's pending slot; through shared memory
// they are already in the worker's segment. The parameters go back straight from the shard
// (sync: they cannot change until this worker pushes again) or from a copy made under the lock
// (async: other pushes change them any time), over TCP or into the segment. false: the
// connection is done.
bool Server::ServePush(int fd, int worker, uint8_t op, uint64_t len, Conn* c) {
  State& s = *state_;
  int64_t count = 0;
  bool initialized = false;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    count = s.count;
    initialized = s.initialized;
  }
  const bool shm = op == kPushPullShm;
  int64_t head[2];  // base version, worker step
  const uint64_t want = sizeof head + (shm ? 0 : count * sizeof(float));
  if (worker < 0 || !initialized || len != want || (shm && !c->base)) {
    std::string skip;  // refuse it whole, so the connection stays in step
    if (len > kMaxPayloadBytes) return false;
    skip.resize(len);
    return RecvExact(fd, skip.data(), len) &&
           WriteAll(fd, ErrorReply(initialized ? "malformed push" : "the shard is not initialized yet"));
  }
  if (!RecvExact(fd, head, sizeof head)) return false;
  float* grads = shm ? c->grads() : nullptr;
  if (!shm) {
    c->buf.resize(count);
    if (!RecvExact(fd, c->buf.data(), count * sizeof(float))) return false;
    grads = c->buf.data();
  }
  const int64_t base = head[0];
  auto reply = [&](int64_t version, const float* params) {
    if (!shm) return SendParams(fd, version, params, count);
    if (params != c->params()) std::memcpy(c->params(), params, count * sizeof(float));
    return WriteAll(fd, Out(kOk).I64(version).Frame());
  };
  std::unique_lock<std::mutex> lock(s.mu);
  s.steps_done[worker] = head[1];
  if (o_.async) {
    if (s.version - base > o_.max_staleness) {
      ++s.dropped;  // computed on parameters too old to help
    } else {
      const float* one[] = {grads};
      s.opt->Apply(one, 1, o_.workers, s.version / o_.workers);
      ++s.version;
    }
    float* copy = shm ? c->params() : (c->out.resize(count), c->out.data());
    std::memcpy(copy, s.opt->params(), count * sizeof(float));
    const int64_t version = s.version;
    lock.unlock();
    return reply(version, copy);
  }
  if (base != s.version || s.arrived[worker]) {
    const std::string why = "worker " + std::to_string(worker) + " pushed for version " + std::to_string(base) +
                            ", the shard is at version " + std::to_string(s.version);
    lock.unlock();
    return WriteAll(fd, ErrorReply(why));
  }
  if (shm) {
    s.pending_at[worker] = grads;
  } else {
    std::swap(s.pending[worker], c->buf);
    s.pending_at[worker] = s.pending[worker].data();
  }
  s.arrived[worker] = true;
  if (++s.arrived_count == o_.workers) {
    s.opt->Apply(s.pending_at.data(), o_.workers, o_.workers, s.version);
    ++s.version;
    s.arrived.assign(o_.workers, false);
    s.arrived_count = 0;
    s.cv.notify_all();
  } else if (!s.cv.wait_for(lock, o_.timeout, [&] { return s.version > base || stopping_; }) || stopping_) {
    std::string missing;
    for (int w = 0; w < o_.workers; ++w) {
      if (!s.arrived[w]) missing += (missing.empty() ? "" : ", ") + std::to_string(w);
    }
    const std::string why = stopping_ ? "the parameter server is stopping"
                                      : "timed out after " + FormatDuration(o_.timeout) +
                                            " waiting for the gradients of worker(s) " + missing + " for version " +
                                            std::to_string(base);
    lock.unlock();
    return WriteAll(fd, ErrorReply(why));
  }
  const int64_t version = s.version;
  const float* shard = s.opt->params();
  lock.unlock();
  return reply(version, shard);
}

void Server::Conn::Unmap() {
  if (base) ::munmap(base, bytes);
  base = nullptr;
}

// --- Client ---

Client::~Client() {
  for (int fd : fds_) {
    if (fd >= 0) ::close(fd);
  }
  for (auto& l : links_) {
    if (l.base) ::munmap(l.base, l.bytes);
  }
}

// Shards on this worker's own host get a segment each: the gradients are written there and the
// parameters read from there, with only a small message on the socket. The worker creates the
// segment (private to the user), the shard maps it, and the name is removed at once.
void Client::AttachShm(int64_t count) {
  const int shards = static_cast<int>(fds_.size());
  links_.resize(shards);
  for (int i = 0; i < shards; ++i) {
    Link& l = links_[i];
    if (l.tried) continue;
    l.tried = true;
    std::string host;
    uint16_t port = 0;
    if (o_.local_host.empty() || !ParseHostPort(o_.shards[i], &host, &port).ok() || host != o_.local_host) continue;
    auto [begin, end] = ShardRange(count, shards, i);
    const size_t bytes = 2 * (end - begin) * sizeof(float);
    if (bytes == 0) continue;
    const std::string name = NewSegmentName();
    auto fd = CreateSegment(name, bytes);
    if (!fd.ok()) continue;
    void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
    ::close(*fd);
    Status st = base == MAP_FAILED ? Internal("mmap") : Call(i, Out(kShmAttach).Str(name).I64(end - begin));
    if (st.ok()) st = Reply(i, o_.timeout).status();
    ::unlink(name.c_str());  // both sides have it mapped (or it failed): nothing stays in /dev/shm
    if (!st.ok()) {
      if (base != MAP_FAILED) ::munmap(base, bytes);
      continue;  // that shard stays on TCP
    }
    l.base = base;
    l.bytes = bytes;
  }
}

int Client::shm_shards() const {
  int n = 0;
  for (const auto& l : links_) n += l.base != nullptr;
  return n;
}

Status Client::Call(size_t shard, const wire::Writer& message) {
  if (!SendAll(fds_[shard], message.Frame(), Clock::now() + o_.timeout)) {
    return Unavailable("parameter server " + std::to_string(shard) + " (" + o_.shards[shard] + ") is gone");
  }
  return Status::Ok();
}

Result<std::string> Client::Reply(size_t shard, Duration wait) {
  const std::string where = "parameter server " + std::to_string(shard) + " (" + o_.shards[shard] + ")";
  const auto deadline = Clock::now() + wait;
  char head[wire::kFrameHeaderBytes];
  int rc = RecvAll(fds_[shard], head, sizeof head, deadline);
  const uint64_t len = rc == 1 ? wire::FrameRest(std::string_view(head, sizeof head)) : 0;
  std::string payload;
  if (rc == 1 && len <= kMaxPayloadBytes) {
    payload.resize(len);
    rc = RecvAll(fds_[shard], payload.data(), len, deadline);
  }
  if (rc == -1) return Timeout(where + " did not answer within " + FormatDuration(wait));
  if (rc != 1 || len > kMaxPayloadBytes) return Unavailable(where + " closed the connection");
  if (head[0] == kUnauthorized) return PermissionDenied(where + " refused the job's token");
  if (head[0] != kOk) {
    std::string message;
    In in(payload);
    in.Str(&message);
    return Internal(where + ": " + message);
  }
  return payload;
}

Status Client::Hello(size_t shard) {
  RETURN_IF_ERROR(Call(shard, Out(kHello).Str(o_.token).I64(o_.worker)));
  ASSIGN_OR_RETURN(std::string info, Reply(shard, o_.timeout));
  In in(info);
  int64_t initialized = 0, version = 0, steps_done = 0, init_step = 0;
  if (!in.I64(&initialized) || !in.I64(&version) || !in.I64(&steps_done) || !in.I64(&init_step)) {
    return Internal("parameter server " + std::to_string(shard) + " sent a malformed hello");
  }
  if (shard == 0) {
    initialized_ = initialized;
    steps_done_ = steps_done;
    init_step_ = init_step;
  } else {
    initialized_ = initialized_ && initialized;
  }
  return Status::Ok();
}

Result<std::unique_ptr<Client>> Client::Connect(const ClientOptions& o) {
  std::unique_ptr<Client> c(new Client(o));
  const auto deadline = Clock::now() + o.timeout;
  for (size_t i = 0; i < o.shards.size(); ++i) {
    std::string host;
    uint16_t port = 0;
    RETURN_IF_ERROR(ParseHostPort(o.shards[i], &host, &port));
    int fd = -ECONNREFUSED;
    while (true) {  // the shard may still be starting
      fd = ConnectOnce(host, port, deadline);
      if (fd >= 0 || Clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (fd < 0) {
      return Unavailable("cannot reach parameter server " + std::to_string(i) + " at " + o.shards[i] + " within " +
                         FormatDuration(o.timeout) + ": " + std::strerror(-fd));
    }
    c->fds_.push_back(fd);
    RETURN_IF_ERROR(c->Hello(i));
  }
  return c;
}

Status Client::WaitInitialized() {
  const auto deadline = Clock::now() + o_.timeout;
  while (true) {
    bool all = true;
    for (size_t i = 0; i < fds_.size(); ++i) {
      RETURN_IF_ERROR(Call(i, Out(kInfo).I64(o_.worker)));
      auto info = Reply(i, o_.timeout);
      if (!info.ok()) return info.status();
      In in(*info);
      int64_t initialized = 0, version = 0, steps_done = 0, init_step = 0;
      in.I64(&initialized) && in.I64(&version) && in.I64(&steps_done) && in.I64(&init_step);
      all = all && initialized;
      if (i == 0) {
        steps_done_ = steps_done;
        init_step_ = init_step;
      }
    }
    if (all) {
      initialized_ = true;
      return Status::Ok();
    }
    if (Clock::now() >= deadline) {
      return Timeout("the parameter servers were not initialized by worker 0 within " + FormatDuration(o_.timeout));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

Status Client::Init(const float* params, int64_t count, const std::vector<std::pair<std::string, const float*>>& state,
                    int64_t optimizer_steps, int64_t step, int64_t total_steps) {
  const int shards = static_cast<int>(fds_.size());
  for (int i = 0; i < shards; ++i) {
    auto [begin, end] = ShardRange(count, shards, i);
    wire::Writer o = Out(kInit);
    o.I64(total_steps).I64(optimizer_steps).I64(step).I64(end - begin).I64(static_cast<int64_t>(state.size()));
    for (const auto& [name, buf] : state) o.Str(name);
    o.Floats(params + begin, end - begin);
    for (const auto& [name, buf] : state) o.Floats(buf + begin, end - begin);
    RETURN_IF_ERROR(Call(i, o));
  }
  for (int i = 0; i < shards; ++i) RETURN_IF_ERROR(Reply(i, o_.timeout).status());
  initialized_ = true;
  init_step_ = step;
  return Status::Ok();
}

namespace {

// Reads "version, floats" replies from every shard into `params`; returns the lowest version.
template <typename ReplyFn>
Result<int64_t> GatherParams(int shards, int64_t count, float* params, ReplyFn reply) {
  int64_t lowest = -1;
  for (int i = 0; i < shards; ++i) {
    auto [begin, end] = ShardRange(count, shards, i);
    ASSIGN_OR_RETURN(std::string payload, reply(i));
    In in(payload);
    int64_t version = 0;
    if (!in.I64(&version) || !in.Floats(params + begin, end - begin) || !in.done()) {
      return Internal("parameter server " + std::to_string(i) + " sent " + std::to_string(payload.size()) +
                      " bytes, not its " + std::to_string(end - begin) + " parameters");
    }
    lowest = lowest < 0 ? version : std::min(lowest, version);
  }
  return lowest;
}

}  // namespace

Result<int64_t> Client::Pull(float* params, int64_t count) {
  for (size_t i = 0; i < fds_.size(); ++i) RETURN_IF_ERROR(Call(i, Out(kPull)));
  return GatherParams(static_cast<int>(fds_.size()), count, params, [&](int i) { return Reply(i, o_.timeout); });
}

Result<int64_t> Client::PushPull(const float* grads, float* params, int64_t count, int64_t base, int64_t worker_step) {
  const int shards = static_cast<int>(fds_.size());
  if (links_.empty()) AttachShm(count);
  const auto send_deadline = Clock::now() + o_.timeout;
  for (int i = 0; i < shards; ++i) {
    auto [begin, end] = ShardRange(count, shards, i);
    const bool shm = links_[i].base != nullptr;
    const size_t bytes = (end - begin) * sizeof(float);
    if (shm) std::memcpy(links_[i].base, grads + begin, bytes);
    // The header and the two versions; the gradients follow from where they lie (or through the
    // segment).
    std::string head = wire::FrameHeader(shm ? kPushPullShm : kPushPull, 16 + (shm ? 0 : bytes));
    head.append(reinterpret_cast<const char*>(&base), 8).append(reinterpret_cast<const char*>(&worker_step), 8);
    if (!SendAll(fds_[i], head, send_deadline) ||
        (!shm &&
         !SendAll(fds_[i], std::string_view(reinterpret_cast<const char*>(grads + begin), bytes), send_deadline))) {
      return Unavailable("parameter server " + std::to_string(i) + " (" + o_.shards[i] + ") is gone");
    }
  }
  // A sync shard answers once every worker's gradients are in: up to the timeout, plus a margin
  // so that the shard's own timeout (which names the missing workers) comes first. The
  // parameters go straight into `params`.
  const auto deadline = Clock::now() + o_.timeout + std::chrono::seconds(5);
  int64_t lowest = -1;
  for (int i = 0; i < shards; ++i) {
    auto [begin, end] = ShardRange(count, shards, i);
    const std::string where = "parameter server " + std::to_string(i) + " (" + o_.shards[i] + ")";
    char head[wire::kFrameHeaderBytes];
    int rc = RecvAll(fds_[i], head, sizeof head, deadline);
    const uint64_t len = rc == 1 ? wire::FrameRest(std::string_view(head, sizeof head)) : 0;
    if (rc == 1 && head[0] != kOk) {  // an error: its message
      std::string payload(std::min<uint64_t>(len, 1 << 20), '\0');
      if (RecvAll(fds_[i], payload.data(), payload.size(), deadline) != 1)
        return Unavailable(where + " closed the connection");
      std::string message;
      In(payload).Str(&message);
      if (head[0] == kUnauthorized) return PermissionDenied(where + " refused the job's token");
      return Internal(where + ": " + message);
    }
    int64_t version = 0;
    const bool shm = links_[i].base != nullptr;
    const size_t bytes = (end - begin) * sizeof(float);
    if (rc == 1 && len != sizeof version + (shm ? 0 : bytes)) {
      return Internal(where + " sent " + std::to_string(len) + " bytes, not its version and " +
                      std::to_string(end - begin) + " parameters");
    }
    if (rc == 1) rc = RecvAll(fds_[i], reinterpret_cast<char*>(&version), sizeof version, deadline);
    if (rc == 1 && shm) std::memcpy(params + begin, static_cast<char*>(links_[i].base) + bytes, bytes);
    if (rc == 1 && !shm) rc = RecvAll(fds_[i], reinterpret_cast<char*>(params + begin), bytes, deadline);
    if (rc == -1) return Timeout(where + " did not answer within " + FormatDuration(o_.timeout));
    if (rc != 1) return Unavailable(where + " closed the connection");
    lowest = lowest < 0 ? version : std::min(lowest, version);
  }
  return lowest;
}

Result<ShardState> Client::FetchState(int64_t count) {
  const int shards = static_cast<int>(fds_.size());
  for (int i = 0; i < shards; ++i) RETURN_IF_ERROR(Call(i, Out(kState)));
  ShardState out;
  out.params.resize(count);
  for (int i = 0; i < shards; ++i) {
    auto [begin, end] = ShardRange(count, shards, i);
    auto payload = Reply(i, o_.timeout);
    if (!payload.ok()) return payload.status();
    In in(*payload);
    int64_t version = 0, steps = 0, nstate = 0;
    bool ok = in.I64(&version) && in.I64(&steps) && in.I64(&nstate) && nstate >= 0 && nstate <= 8;
    std::vector<std::string> names(ok ? nstate : 0);
    for (auto& n : names) ok = ok && in.Str(&n);
    if (ok && i == 0) {
      out.version = version;
      out.optimizer_steps = steps;
      for (const auto& n : names) out.state.emplace_back(n, std::vector<float>(count));
    }
    ok = ok && names.size() == out.state.size() && in.Floats(out.params.data() + begin, end - begin);
    for (size_t k = 0; ok && k < names.size(); ++k) {
      ok = names[k] == out.state[k].first && in.Floats(out.state[k].second.data() + begin, end - begin);
    }
    if (!ok || !in.done()) return Internal("parameter server " + std::to_string(i) + " sent a malformed state");
    out.version = std::min(out.version, version);
  }
  return out;
}

Result<int64_t> Client::Count(uint8_t op) {
  RETURN_IF_ERROR(Call(0, Out(op)));
  ASSIGN_OR_RETURN(std::string payload, Reply(0, o_.timeout));
  int64_t n = 0;
  In(payload).I64(&n);
  return n;
}

Result<int64_t> Client::Done() { return Count(kDone); }
Result<int64_t> Client::DoneCount() { return Count(kDoneCount); }

}  // namespace trainctl::comm::ps
