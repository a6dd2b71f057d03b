#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "common/socket.h"
#include "store/memory/memory_store.h"
#include "store/tcp/tcp_store.h"
#include "store/tcp/wire.h"

namespace trainctl {
namespace {

using wire::Op;
using wire::Reply;

}  // namespace

Result<std::unique_ptr<TcpStore>> TcpStore::Connect(const TcpStoreOptions& options) {
  std::unique_ptr<TcpStore> store(new TcpStore(options));
  auto deadline = Clock::now() + options.connect_timeout;
  int fd;
  // The server may still be starting: retry refused connections until the deadline.
  while (true) {
    fd = ConnectOnce(options.host, options.port, deadline);
    if (fd >= 0) break;
    if (Clock::now() >= deadline || (fd != -ECONNREFUSED && fd != -ETIMEDOUT)) {
      return ErrnoStatus("cannot connect to the store at " + store->Where(), -fd);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  store->fd_ = fd;
  RETURN_IF_ERROR(store->EnsureConnected());
  return store;
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
}

std::string TcpStore::Where() const {
  return options_.host + ":" + std::to_string(options_.port);
}

Status TcpStore::EnsureConnected() {
  // Called with mu_ held (or before the store is shared). fd_ >= 0 but not yet greeted happens
  // only in Connect(); a dropped connection is retried once, without waiting.
  bool greet = false;
  if (fd_ < 0) {
    int fd = ConnectOnce(options_.host, options_.port, Clock::now() + options_.io_timeout);
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
  char header[4];
  std::string body;
  bool sent = SendAll(fd_, w.Frame(), deadline);
  int rc = sent ? RecvAll(fd_, header, 4, deadline) : -2;
  if (rc == 1) {
    uint32_t n = 0;
    for (int i = 0; i < 4; ++i) n |= static_cast<uint32_t>(static_cast<uint8_t>(header[i])) << (8 * i);
    if (n == 0 || n > wire::kMaxFrameBytes) {
      rc = -2;
    } else {
      body.resize(n);
      rc = RecvAll(fd_, body.data(), n, deadline);
    }
  }
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

Result<std::pair<uint8_t, std::string>> TcpStore::Call(const std::string& frame, Duration wait) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) greeted_ = false;
  RETURN_IF_ERROR(EnsureConnected());
  auto deadline = Clock::now() + wait + options_.io_timeout;
  auto drop = [this](const std::string& what) {
    ::close(fd_);
    fd_ = -1;
    greeted_ = false;
    return Unavailable("store at " + Where() + ": " + what);
  };
  if (!SendAll(fd_, frame, deadline)) return drop("sending the request failed");
  char header[4];
  int rc = RecvAll(fd_, header, 4, deadline);
  if (rc == 0) return drop("the server closed the connection");
  if (rc == -1) return drop("no reply within " + FormatDuration(wait + options_.io_timeout));
  if (rc < 0) return drop(std::string("receive failed: ") + std::strerror(errno));
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= static_cast<uint32_t>(static_cast<uint8_t>(header[i])) << (8 * i);
  if (n == 0 || n > wire::kMaxFrameBytes) return drop("malformed reply");
  std::string body(n, '\0');
  rc = RecvAll(fd_, body.data(), n, deadline);
  if (rc != 1) return drop("the reply was cut off");
  uint8_t reply = static_cast<uint8_t>(body[0]);
  return std::make_pair(reply, body.substr(1));
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

Result<int64_t> IntReply(const std::pair<uint8_t, std::string>& reply, const std::string& where) {
  if (reply.first != static_cast<uint8_t>(Reply::kOk)) return ReplyError(reply.first, reply.second, where);
  int64_t value = 0;
  wire::Reader r(reply.second);
  if (!r.I64(&value)) return Internal("store at " + where + ": malformed reply");
  return value;
}

}  // namespace

Status TcpStore::Set(const std::string& key, const std::string& value) {
  wire::Writer w;
  w.U8(static_cast<uint8_t>(Op::kSet)).Str(key).Str(value);
  ASSIGN_OR_RETURN(auto reply, Call(w.Frame(), Duration(0)));
  if (reply.first != static_cast<uint8_t>(Reply::kOk)) return ReplyError(reply.first, reply.second, Where());
  return Status::Ok();
}

Result<std::string> TcpStore::Get(const std::string& key, Duration timeout) {
  wire::Writer w;
  w.U8(static_cast<uint8_t>(Op::kGet)).Str(key).I64(std::max<int64_t>(1, timeout.count()));
  ASSIGN_OR_RETURN(auto reply, Call(w.Frame(), timeout));
  if (reply.first == static_cast<uint8_t>(Reply::kTimeout) ||
      reply.first == static_cast<uint8_t>(Reply::kNotFound)) {
    return KeysTimeout({key}, timeout);
  }
  return StringReply(reply, Where());
}

Result<std::optional<std::string>> TcpStore::TryGet(const std::string& key) {
  wire::Writer w;
  w.U8(static_cast<uint8_t>(Op::kTryGet)).Str(key);
  ASSIGN_OR_RETURN(auto reply, Call(w.Frame(), Duration(0)));
  if (reply.first == static_cast<uint8_t>(Reply::kNotFound)) return std::optional<std::string>();
  ASSIGN_OR_RETURN(std::string value, StringReply(reply, Where()));
  return std::optional<std::string>(std::move(value));
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
  if (reply.first != static_cast<uint8_t>(Reply::kOk)) return ReplyError(reply.first, reply.second, Where());
  return Status::Ok();
}

Result<bool> TcpStore::Delete(const std::string& key) {
  wire::Writer w;
  w.U8(static_cast<uint8_t>(Op::kDelete)).Str(key);
  ASSIGN_OR_RETURN(auto reply, Call(w.Frame(), Duration(0)));
  ASSIGN_OR_RETURN(int64_t existed, IntReply(reply, Where()));
  return existed != 0;
}

}  // namespace trainctl
