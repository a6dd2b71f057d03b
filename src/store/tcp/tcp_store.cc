#include "store/tcp/tcp_store.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <thread>

#include "common/socket.h"
#include "store/memory/memory_store.h"
#include "store/tcp/wire.h"

namespace trainctl {
namespace {

using wire::Op;
using wire::Reply;

}  // namespace

Result<std::unique_ptr<TcpStore>> TcpStore::Connect(const TcpStoreOptions& options) {
  std::unique_ptr<TcpStore> store(new TcpStore(options));
  auto deadline = Clock::now() + options.connect_timeout;
  auto stopped = [&] { return Aborted("stopped while connecting to the store at " + store->Where()); };
  store->connecting_ = true;
  int fd;
  // The server may still be starting: retry until the deadline a refused connection, and a host
  // that has no name or route yet (a pod starting: its headless Service publishes its name once
  // it is ready, a NetworkPolicy admits a new pod a moment after it starts).
  while (true) {
    fd = store->ConnectOnce(deadline);
    if (fd >= 0) break;
    if (fd == -ECANCELED || store->Stopping()) return stopped();
    const bool later =
        fd == -ECONNREFUSED || fd == -ETIMEDOUT || fd == -EAGAIN || fd == -EHOSTUNREACH || fd == -ENETUNREACH;
    if (Clock::now() >= deadline || !later) {
      if (fd == -EHOSTUNREACH) {  // ConnectOnce's answer for a name that does not resolve, too
        return Unavailable("cannot connect to the store at " + store->Where() +
                           ": its name does not resolve or there is no route to it");
      }
      return ErrnoStatus("cannot connect to the store at " + store->Where(), -fd);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  store->fd_ = fd;
  Status st = store->EnsureConnected();
  if (!st.ok() && store->Stopping()) return stopped();
  RETURN_IF_ERROR(st);
  store->connecting_ = false;
  return store;
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
}

std::string TcpStore::Where() const {
  return options_.unix_path.empty() ? options_.host + ":" + std::to_string(options_.port)
                                    : "unix:" + options_.unix_path;
}

int TcpStore::ConnectOnce(Clock::time_point deadline) const {
  const std::function<bool()> stop = [this] { return Stopping(); };
  return options_.unix_path.empty() ? trainctl::ConnectOnce(options_.host, options_.port, deadline, stop)
                                    : ConnectUnix(options_.unix_path);
}

Status TcpStore::EnsureConnected() {
  // Called with mu_ held (or before the store is shared). fd_ >= 0 but not yet greeted happens
  // only in Connect(); a dropped connection is retried once, without waiting.
  bool greet = false;
  if (fd_ < 0) {
    int fd = ConnectOnce(Clock::now() + options_.io_timeout);
    if (fd < 0) return ErrnoStatus("store at " + Where() + " is unreachable", -fd);
    fd_ = fd;
    greet = true;
  } else {
    greet = !greeted_;
  }
  if (!greet) return Status::Ok();
  auto deadline = Clock::now() + options_.io_timeout;
  wire::Writer w;
  w.U8(static_cast<uint8_t>(Op::kHello)).I64(wire::kProtocolVersion).Str(options_.token);
  std::string body;
  in_.clear();
  const int rc = SendAll(fd_, w.Frame(), deadline) ? ReadFrame(&body, deadline) : -2;
  if (rc != 1) {
    ::close(fd_);
    fd_ = -1;
    return Unavailable("store at " + Where() + " closed the connection during the handshake");
  }
  if (static_cast<Reply>(body[0]) != Reply::kOk) {
    ::close(fd_);
    fd_ = -1;
    if (static_cast<Reply>(body[0]) == Reply::kUnauthorized) {
      return PermissionDenied("store at " + Where() + " refused the token");
    }
    std::string msg;
    wire::Reader r(std::string_view(body).substr(1));
    r.Str(&msg);
    return Unavailable("store at " + Where() + " refused the connection: " + msg);
  }
  greeted_ = true;
  return Status::Ok();
}

int TcpStore::ReadFrame(std::string* body, Clock::time_point deadline, bool interruptible) {
  interruptible = interruptible && options_.interrupt_fd >= 0;
  while (true) {
    const int got = wire::TakeFrame(&in_, body, wire::kMaxFrameBytes);
    if (got == 1 && in_.empty() && in_.capacity() > 4096) std::string().swap(in_);  // a long reply's room
    if (got == 1) return body->empty() ? -3 : 1;
    if (got < 0) return -3;
    struct pollfd p[2] = {{fd_, POLLIN, 0}, {options_.interrupt_fd, POLLIN, 0}};
    const Duration slice =
        connecting_ ? std::min<Duration>(Remaining(deadline), std::chrono::milliseconds(100)) : Remaining(deadline);
    const int ready = ::poll(p, interruptible ? 2 : 1, static_cast<int>(slice.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready > 0 && interruptible && p[1].revents && !p[0].revents) return -5;
    if (ready == 0 && Stopping()) return -4;
    if (ready == 0 && Clock::now() < deadline) continue;
    if (ready == 0) return -1;
    // A reply that fits the stack buffer is read there (the connection keeps no buffer between
    // calls); a longer one is read straight into place once its length is known.
    char small[4096];
    size_t want = sizeof small;
    if (in_.size() >= wire::kFrameHeaderBytes) {  // within kMaxFrameBytes: TakeFrame said so
      want = std::max<size_t>(want, wire::kFrameHeaderBytes + static_cast<size_t>(wire::FrameRest(in_)) - in_.size());
    }
    const size_t had = in_.size();
    if (want > sizeof small) in_.resize(had + want);
    char* into = want > sizeof small ? in_.data() + had : small;
    const ssize_t n = ::recv(fd_, into, want, 0);
    const int err = errno;
    if (want > sizeof small) {
      in_.resize(had + static_cast<size_t>(std::max<ssize_t>(n, 0)));
    } else if (n > 0) {
      in_.append(small, static_cast<size_t>(n));
    }
    if (n == 0) return 0;
    if (n < 0) {
      if (err == EINTR || err == EAGAIN) continue;
      errno = err;
      return -2;
    }
  }
}

Result<std::vector<TcpStore::RawReply>> TcpStore::CallMany(const std::string& frames, Duration wait, size_t replies) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) greeted_ = false;
  RETURN_IF_ERROR(EnsureConnected());
  auto deadline = Clock::now() + wait + options_.io_timeout;
  auto drop = [this](const std::string& what) {
    in_.clear();
    ::close(fd_);
    fd_ = -1;
    greeted_ = false;
    return Unavailable("store at " + Where() + ": " + what);
  };
  if (!SendAll(fd_, frames, deadline)) return drop("sending the request failed");
  std::vector<RawReply> out;
  out.reserve(replies);
  std::string body;
  for (size_t i = 0; i < replies; ++i) {
    const int rc = ReadFrame(&body, deadline, wait > Duration(0));
    if (rc == -5) {
      static_cast<void>(drop("interrupted"));  // the connection goes; what the caller hears is Aborted
      return Aborted("a wait on the store at " + Where() + " was interrupted");
    }
    if (rc == 0) return drop("the server closed the connection");
    if (rc == -1) return drop("no reply within " + FormatDuration(wait + options_.io_timeout));
    if (rc == -3) return drop("malformed reply");
    if (rc < 0) return drop(std::string("receive failed: ") + std::strerror(errno));
    out.emplace_back(static_cast<uint8_t>(body[0]), body.substr(1));
  }
  return out;
}

Result<TcpStore::RawReply> TcpStore::Call(const std::string& frame, Duration wait) {
  ASSIGN_OR_RETURN(auto replies, CallMany(frame, wait, 1));
  return std::move(replies[0]);
}

namespace {

Status ReplyError(uint8_t reply, const std::string& fields, const std::string& where) {
  std::string msg;
  wire::Reader r(fields);
  r.Str(&msg);
  if (static_cast<Reply>(reply) == Reply::kUnauthorized) {
    return PermissionDenied("store at " + where + ": " + msg);
  }
  if (msg.rfind("store key", 0) == 0) return InvalidArgument(msg);
  return Internal("store at " + where + ": " + (msg.empty() ? "request failed" : msg));
}

// The reply's single string field; an error status when the reply is not kOk.
Result<std::string> StringReply(const std::pair<uint8_t, std::string>& reply, const std::string& where) {
  if (reply.first != static_cast<uint8_t>(Reply::kOk)) return ReplyError(reply.first, reply.second, where);
  std::string value;
  wire::Reader r(reply.second);
  if (!r.Str(&value)) return Internal("store at " + where + ": malformed reply");
  return value;
}

// A try-get's reply: the value, or std::nullopt for kNotFound.
Result<std::optional<std::string>> OptionalReply(const std::pair<uint8_t, std::string>& reply,
                                                 const std::string& where) {
  if (reply.first == static_cast<uint8_t>(Reply::kNotFound)) return std::optional<std::string>();
  ASSIGN_OR_RETURN(std::string value, StringReply(reply, where));
  return std::optional<std::string>(std::move(value));
}

// A reply that carries nothing but kOk.
Status OkReply(const std::pair<uint8_t, std::string>& reply, const std::string& where) {
  if (reply.first != static_cast<uint8_t>(Reply::kOk)) return ReplyError(reply.first, reply.second, where);
  return Status::Ok();
}

std::string SetFrame(const std::string& key, const std::string& value) {
  wire::Writer w;
  w.U8(static_cast<uint8_t>(Op::kSet)).Str(key).Str(value);
  return w.Frame();
}

std::string TryGetFrame(const std::string& key) {
  wire::Writer w;
  w.U8(static_cast<uint8_t>(Op::kTryGet)).Str(key);
  return w.Frame();
}

Result<int64_t> IntReply(const std::pair<uint8_t, std::string>& reply, const std::string& where) {
  if (reply.first != static_cast<uint8_t>(Reply::kOk)) return ReplyError(reply.first, reply.second, where);
  int64_t value = 0;
  wire::Reader r(reply.second);
  if (!r.I64(&value)) return Internal("store at " + where + ": malformed reply");
  return value;
}

}  // namespace

Status TcpStore::Set(const std::string& key, const std::string& value) {
  ASSIGN_OR_RETURN(auto reply, Call(SetFrame(key, value), Duration(0)));
  return OkReply(reply, Where());
}

Result<std::string> TcpStore::Get(const std::string& key, Duration timeout) {
  wire::Writer w;
  w.U8(static_cast<uint8_t>(Op::kGet)).Str(key).I64(std::max<int64_t>(1, timeout.count()));
  ASSIGN_OR_RETURN(auto reply, Call(w.Frame(), timeout));
  if (reply.first == static_cast<uint8_t>(Reply::kTimeout) || reply.first == static_cast<uint8_t>(Reply::kNotFound)) {
    return KeysTimeout({key}, timeout);
  }
  return StringReply(reply, Where());
}

Result<std::optional<std::string>> TcpStore::TryGet(const std::string& key) {
  ASSIGN_OR_RETURN(auto reply, Call(TryGetFrame(key), Duration(0)));
  return OptionalReply(reply, Where());
}

Result<int64_t> TcpStore::Add(const std::string& key, int64_t delta) {
  wire::Writer w;
  w.U8(static_cast<uint8_t>(Op::kAdd)).Str(key).I64(delta);
  ASSIGN_OR_RETURN(auto reply, Call(w.Frame(), Duration(0)));
  return IntReply(reply, Where());
}

Result<std::string> TcpStore::CompareSet(const std::string& key, const std::string& expected,
                                         const std::string& desired) {
  wire::Writer w;
  w.U8(static_cast<uint8_t>(Op::kCompareSet)).Str(key).Str(expected).Str(desired);
  ASSIGN_OR_RETURN(auto reply, Call(w.Frame(), Duration(0)));
  return StringReply(reply, Where());
}

Status TcpStore::Wait(const std::vector<std::string>& keys, Duration timeout) {
  wire::Writer w;
  w.U8(static_cast<uint8_t>(Op::kWait)).I64(static_cast<int64_t>(keys.size()));
  for (const auto& k : keys) w.Str(k);
  w.I64(std::max<int64_t>(1, timeout.count()));
  ASSIGN_OR_RETURN(auto reply, Call(w.Frame(), timeout));
  if (reply.first == static_cast<uint8_t>(Reply::kTimeout)) return KeysTimeout(keys, timeout);
  return OkReply(reply, Where());
}

Status TcpStore::MultiSet(const std::vector<std::pair<std::string, std::string>>& pairs) {
  if (pairs.empty()) return Status::Ok();
  std::string frames;
  for (const auto& [key, value] : pairs) frames += SetFrame(key, value);
  ASSIGN_OR_RETURN(auto replies, CallMany(frames, Duration(0), pairs.size()));
  for (const auto& reply : replies) RETURN_IF_ERROR(OkReply(reply, Where()));
  return Status::Ok();
}

Result<std::vector<std::optional<std::string>>> TcpStore::TryGetMany(const std::vector<std::string>& keys) {
  std::vector<std::optional<std::string>> values;
  if (keys.empty()) return values;
  std::string frames;
  for (const auto& key : keys) frames += TryGetFrame(key);
  ASSIGN_OR_RETURN(auto replies, CallMany(frames, Duration(0), keys.size()));
  for (const auto& reply : replies) {
    ASSIGN_OR_RETURN(auto value, OptionalReply(reply, Where()));
    values.push_back(std::move(value));
  }
  return values;
}

Result<std::pair<size_t, std::string>> TcpStore::WaitAny(const std::vector<std::string>& keys, Duration timeout) {
  if (keys.empty()) return InvalidArgument("WaitAny needs a key");
  wire::Writer w;
  w.U8(static_cast<uint8_t>(Op::kWaitAny)).I64(static_cast<int64_t>(keys.size()));
  for (const auto& k : keys) w.Str(k);
  w.I64(std::max<int64_t>(1, timeout.count()));
  ASSIGN_OR_RETURN(auto reply, Call(w.Frame(), timeout));
  if (reply.first == static_cast<uint8_t>(Reply::kTimeout)) return KeysTimeout(keys, timeout, true);
  RETURN_IF_ERROR(OkReply(reply, Where()));
  int64_t index = -1;
  std::string value;
  wire::Reader r(reply.second);
  if (!r.I64(&index) || !r.Str(&value) || index < 0 || index >= static_cast<int64_t>(keys.size())) {
    return Internal("store at " + Where() + ": malformed reply");
  }
  return std::make_pair(static_cast<size_t>(index), std::move(value));
}

Result<bool> TcpStore::Delete(const std::string& key) {
  wire::Writer w;
  w.U8(static_cast<uint8_t>(Op::kDelete)).Str(key);
  ASSIGN_OR_RETURN(auto reply, Call(w.Frame(), Duration(0)));
  ASSIGN_OR_RETURN(int64_t existed, IntReply(reply, Where()));
  return existed != 0;
}

}  // namespace trainctl
