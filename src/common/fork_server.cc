#include "common/fork_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>

namespace trainctl {

Result<ForkServer> ForkServer::Start(SpawnOptions options) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return ErrnoStatus("socketpair", errno);
  // Above the standard streams, which Spawn replaces in the child.
  if (sv[1] < 3) {
    int moved = ::fcntl(sv[1], F_DUPFD_CLOEXEC, 3);
    ::close(sv[1]);
    sv[1] = moved;
  }
  if (sv[1] < 0) {
    int err = errno;
    ::close(sv[0]);
    return ErrnoStatus("fcntl", err);
  }
  // The server binds every symbol as it starts (once), not each copy lazily on its first call
  // (a tenth of a copy's CPU); a copy does not pass LD_BIND_NOW on unless it was there already.
  std::string value = std::to_string(sv[1]);
  if (!GetEnv(options.env, "LD_BIND_NOW")) {
    SetEnv(&options.env, "LD_BIND_NOW", "1");
    value += ",LD_BIND_NOW";
  }
  SetEnv(&options.env, kEnvForkServerFd, value);
  options.pass_fd = sv[1];
  auto pid = Spawn(options);
  ::close(sv[1]);
  if (!pid.ok()) {
    ::close(sv[0]);
    return pid.status();
  }
  return ForkServer(*pid, sv[0]);
}

ForkServer::ForkServer(ForkServer&& other) noexcept : pid_(other.pid_), fd_(other.fd_) { other.fd_ = -1; }

ForkServer::~ForkServer() {
  if (fd_ >= 0) ::close(fd_);
}

Result<pid_t> ForkServer::Fork(const std::string& value, Duration timeout) {
  if (fd_ < 0) return Unavailable("the fork server failed earlier");
  // Any failure leaves the channel out of step (a late answer would be taken for the next one):
  // it is closed, and the server exits.
  auto fail = [this](Status st) {
    ::close(fd_);
    fd_ = -1;
    return st;
  };
  if (::send(fd_, value.data(), value.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(value.size())) {
    return fail(ErrnoStatus("the fork server", errno));
  }
  const auto deadline = Clock::now() + timeout;
  int32_t reply = 0;
  while (true) {
    pollfd p{fd_, POLLIN, 0};
    int rc = ::poll(&p, 1, static_cast<int>(Remaining(deadline).count()));
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) return fail(Timeout("the fork server did not answer within " + FormatDuration(timeout)));
    ssize_t n = ::recv(fd_, &reply, sizeof reply, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n != sizeof reply) return fail(Unavailable("the fork server ended"));
    break;
  }
  if (reply <= 0) return ErrnoStatus("cannot fork " + value, -reply);
  // Also here, as Spawn does: no race with an early kill(-pid).
  ::setpgid(reply, reply);
  return static_cast<pid_t>(reply);
}

std::optional<std::string> ServeForks(int argc, char** argv) {
  const char* named = std::getenv(kEnvForkServerFd);
  if (!named) return std::nullopt;
  // "FD[,NAME...]": the channel, and variables set for this process alone.
  const std::string value = named;
  const int fd = std::atoi(value.c_str());
  for (size_t comma = value.find(','); comma != std::string::npos;) {
    const size_t next = value.find(',', comma + 1);
    ::unsetenv(value.substr(comma + 1, next - comma - 1).c_str());
    comma = next;
  }
  ::unsetenv(kEnvForkServerFd);  // not the copies' (nor their children's) to see
  // Only the channel Start made (a variable left in a user's environment names no such socket).
  int type = 0;
  socklen_t len = sizeof type;
  if (fd < 3 || ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_SEQPACKET ||
      ::fcntl(fd, F_SETFD, FD_CLOEXEC) != 0 || argc < 2) {
    return std::nullopt;
  }
  const pid_t parent = ::getppid();
  char* slot = argv[argc - 1];
  const size_t room = ::strlen(slot);
  while (true) {
    char request[256];
    ssize_t n = ::recv(fd, request, sizeof request, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) std::exit(0);  // the requester closed the channel, or is gone
    int32_t reply;
    if (static_cast<size_t>(n) > room) {
      reply = -E2BIG;
    } else {
      // A fork whose child is the requester's: the exit signal is this process's own (SIGCHLD).
      // The raw system call skips glibc's fork handlers, which a process that never started a
      // thread does not need.
      long pid = ::syscall(SYS_clone, CLONE_PARENT, 0, 0, 0, 0);
      if (pid == 0) {
        ::close(fd);
        ::setpgid(0, 0);
        ::prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (::getppid() != parent) ::_exit(127);  // the requester died meanwhile
        ::memset(slot, 0, room);
        ::memcpy(slot, request, static_cast<size_t>(n));
        return std::string(request, static_cast<size_t>(n));
      }
      reply = pid < 0 ? -errno : static_cast<int32_t>(pid);
    }
    if (::send(fd, &reply, sizeof reply, MSG_NOSIGNAL) != sizeof reply) std::exit(0);
  }
}

}  // namespace trainctl
