#include "common/socket.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>

namespace trainctl {

int ConnectOnce(const std::string& host, uint16_t port, Clock::time_point deadline, const std::function<bool()>& stop) {
  struct addrinfo hints {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  struct addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return -EHOSTUNREACH;
  int result = -ECONNREFUSED;
  for (auto* ai = res; ai; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      struct pollfd p {
        fd, POLLOUT, 0
      };
      bool stopped = false;
      while (true) {
        const Duration left = Remaining(deadline);
        rc = ::poll(&p, 1,
                    static_cast<int>((stop ? std::min<Duration>(left, std::chrono::milliseconds(100)) : left).count()));
        if (rc < 0 && errno == EINTR) continue;
        if (rc != 0 || Clock::now() >= deadline) break;
        if (stop && stop()) {
          stopped = true;
          break;
        }
      }
      if (stopped) {
        ::close(fd);
        result = -ECANCELED;
        break;
      }
      int err = 0;
      socklen_t len = sizeof err;
      if (rc == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
        rc = 0;
      } else {
        errno = rc == 0 ? ETIMEDOUT : (err ? err : errno);
        rc = -1;
      }
    }
    if (rc == 0) {
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      result = fd;
      break;
    }
    result = -errno;
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return result;
}

int ConnectUnix(const std::string& path) {
  struct sockaddr_un a {};
  a.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof a.sun_path) return -ENAMETOOLONG;
  std::memcpy(a.sun_path, path.data(), path.size());
  if (path[0] == '@') a.sun_path[0] = '\0';  // abstract: no file, no trailing NUL in the name
  const auto len =
      static_cast<socklen_t>(offsetof(struct sockaddr_un, sun_path) + path.size() + (path[0] == '@' ? 0 : 1));
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  // A Unix socket connects at once or fails at once (EAGAIN: the listener's backlog is full).
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), len) != 0) {
    const int err = errno;
    ::close(fd);
    return -(err == EINPROGRESS ? EAGAIN : err);
  }
  return fd;
}

bool SendAll(int fd, std::string_view data, Clock::time_point deadline) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      struct pollfd p {
        fd, POLLOUT, 0
      };
      if (::poll(&p, 1, static_cast<int>(Remaining(deadline).count())) <= 0) return false;
      continue;
    }
    return false;
  }
  return true;
}

int RecvAll(int fd, char* out, size_t size, Clock::time_point deadline) {
  size_t off = 0;
  while (off < size) {
    struct pollfd p {
      fd, POLLIN, 0
    };
    int rc = ::poll(&p, 1, static_cast<int>(Remaining(deadline).count()));
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) return -1;
    ssize_t n = ::recv(fd, out + off, size - off, 0);
    if (n == 0) return 0;
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return -2;
    }
    off += static_cast<size_t>(n);
  }
  return 1;
}

}  // namespace trainctl
