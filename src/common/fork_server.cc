#include "common/fork_server.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/prctl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/exit_codes.h"
#include "common/huge_text.h"
#include "common/strings.h"

extern char** environ;

namespace trainctl {
namespace {

// A request on the channel: its argument, directory, CPUs ("0,3") and environment, each ended by
// a NUL (none of them can hold one), with the output descriptor alongside (SCM_RIGHTS). At most
// kMaxRequest bytes: below a Unix socket's default send buffer, which bounds one packet.
constexpr size_t kMaxRequest = 160 << 10;

// The answer: the copy's pid (or -errno when none was made), and 0 or the errno with which
// setting the copy up failed (it has then exited).
struct Reply {
  int32_t pid;
  int32_t error;
};

// What the kernel noted of the server's memory at exec (/proc/self/stat's fields, by proc(5)'s
// 1-based numbers, and the auxiliary vector): the same in every copy, so read once, by the server.
struct ProcMap {
  uint64_t field[53] = {};
  uint64_t auxv[128] = {};
  ssize_t auxv_size = 0;
  int error = 0;  // reading them failed: the errno
};

ProcMap ReadProcMap() {
  ProcMap m;
  char stat[2048];
  int fd = ::open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return m.error = errno, m;
  ssize_t n = ::read(fd, stat, sizeof stat - 1);
  ::close(fd);
  const char* p = n > 0 ? (stat[n] = 0, std::strrchr(stat, ')')) : nullptr;
  if (!p) return m.error = EIO, m;
  for (int i = 3; i < 53 && *p; ++i) {  // the command ends field 2
    while (*p && *p != ' ') ++p;
    while (*p == ' ') ++p;
    m.field[i] = std::strtoull(p, nullptr, 10);
  }
  fd = ::open("/proc/self/auxv", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return m.error = errno, m;
  m.auxv_size = ::read(fd, m.auxv, sizeof m.auxv);
  ::close(fd);
  if (m.auxv_size <= 0) m.error = EIO;
  return m;
}

// What /proc/PID/cmdline and /proc/PID/environ show is the memory the kernel noted at exec, not
// argv and `environ`: end the command line after the copy's own argument (not the placeholder's
// padding), and point the environment at `env_begin` (a copy's strings, back to back; null: the
// server's), as checkpoint/restore tools do. PR_SET_MM_MAP takes the whole map, so the rest is
// passed back as it is (`m`, the server's).
int ShowInProc(const ProcMap& m, const char* arg_end, const char* env_begin, const char* env_end) {
  if (m.error) return m.error;
  prctl_mm_map map{};
  map.start_code = m.field[26];
  map.end_code = m.field[27];
  map.start_stack = m.field[28];
  map.start_data = m.field[45];
  map.end_data = m.field[46];
  map.start_brk = m.field[47];
  map.brk = static_cast<uint64_t>(::syscall(SYS_brk, 0));
  map.arg_start = m.field[48];
  map.arg_end = reinterpret_cast<uint64_t>(arg_end);
  map.env_start = env_begin ? reinterpret_cast<uint64_t>(env_begin) : m.field[50];
  map.env_end = env_begin ? reinterpret_cast<uint64_t>(env_end) : m.field[51];
  map.auxv = const_cast<__u64*>(reinterpret_cast<const __u64*>(m.auxv));
  map.auxv_size = static_cast<uint32_t>(m.auxv_size);
  map.exe_fd = static_cast<uint32_t>(-1);
  if (::prctl(PR_SET_MM, PR_SET_MM_MAP, &map, sizeof map, 0) != 0) return errno;
  return 0;
}

int ThreadCount() {
  DIR* dir = ::opendir("/proc/self/task");
  if (!dir) return -1;
  int n = 0;
  while (const dirent* e = ::readdir(dir)) n += e->d_name[0] != '.';
  ::closedir(dir);
  return n;
}

// In a new copy: what its request asks, its argument written over the placeholder `slot` (of
// `room` bytes). Returns 0 or the errno it failed with. The strings stay for the copy's life
// (environ points into them).
int SetUpCopy(const std::vector<std::string_view>& fields, const ProcMap& proc, int output_fd, char* slot,
              size_t room) {
  const std::string_view cwd = fields[1], cpus = fields[2];
  if (output_fd >= 0) {
    if (::dup2(output_fd, 1) < 0 || ::dup2(output_fd, 2) < 0) return errno;
    ::close(output_fd);
  }
  if (!cwd.empty() && ::chdir(std::string(cwd).c_str()) != 0) return errno;
  if (!cpus.empty()) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (const auto& c : Split(std::string(cpus), ',')) {
      const int cpu = std::atoi(c.c_str());
      if (cpu < 0 || cpu >= CPU_SETSIZE) return EINVAL;
      CPU_SET(cpu, &set);
    }
    if (::sched_setaffinity(0, sizeof set, &set) != 0) return errno;
  }
  const char* env_begin = nullptr;
  const char* env_end = nullptr;
  if (fields.size() > 3) {
    size_t bytes = 0;
    for (size_t i = 3; i < fields.size(); ++i) bytes += fields[i].size() + 1;
    void* block = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (block == MAP_FAILED) return errno;
    char* text = static_cast<char*>(block);
    auto* env = new char*[fields.size() - 2];
    char* at = text;
    for (size_t i = 3; i < fields.size(); ++i) {
      std::memcpy(at, fields[i].data(), fields[i].size());
      at[fields[i].size()] = 0;
      env[i - 3] = at;
      at += fields[i].size() + 1;
    }
    env[fields.size() - 3] = nullptr;
    environ = env;
    env_begin = text;
    env_end = text + bytes;
  }
  ::memset(slot, 0, room);
  ::memcpy(slot, fields[0].data(), fields[0].size());
  // Only where the copy has an environment of its own must /proc show it; a command line that
  // still ends in padding is only untidy.
  const int err = ShowInProc(proc, slot + fields[0].size() + 1, env_begin, env_end);
  return env_begin ? err : 0;
}

}  // namespace

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

Result<pid_t> ForkServer::Fork(const ForkRequest& request, Duration timeout) {
  if (fd_ < 0) return Unavailable("the fork server failed earlier");
  const std::string& value = request.argument;
  std::string message = value + '\0' + request.cwd + '\0';
  for (size_t i = 0; i < request.cpus.size(); ++i) message += (i ? "," : "") + std::to_string(request.cpus[i]);
  message += '\0';
  for (const auto& kv : request.env) message += kv + '\0';
  if (message.size() > kMaxRequest) {
    return InvalidArgument("cannot fork " + value + ": its request takes " + std::to_string(message.size()) +
                           " bytes, more than the fork server's " + std::to_string(kMaxRequest));
  }
  // Any failure leaves the channel out of step (a late answer would be taken for the next one):
  // it is closed, and the server exits.
  auto fail = [this](Status st) {
    ::close(fd_);
    fd_ = -1;
    return st;
  };
  iovec iov{message.data(), message.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (request.output_fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &request.output_fd, sizeof(int));
  }
  if (::sendmsg(fd_, &msg, MSG_NOSIGNAL) != static_cast<ssize_t>(message.size())) {
    return fail(ErrnoStatus("the fork server", errno));
  }
  const auto deadline = Clock::now() + timeout;
  Reply reply{};
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
  if (reply.pid <= 0) return ErrnoStatus("cannot fork " + value, -reply.pid);
  if (reply.error != 0) {  // the copy has exited: reap it
    int status;
    while (::waitpid(reply.pid, &status, 0) < 0 && errno == EINTR) {
    }
    return ErrnoStatus("cannot set up the copy " + value + (request.cwd.empty() ? "" : " in " + request.cwd),
                       reply.error);
  }
  // Also here, as Spawn does: no race with an early kill(-pid).
  ::setpgid(reply.pid, reply.pid);
  return static_cast<pid_t>(reply.pid);
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
  // A copy gets only the thread that forked it: a server with more (a library that started one
  // as it loaded) serves no one, and its requesters start their processes on their own.
  // A thread just joined (a worker server's data loader) may stay listed for a moment.
  int threads = ThreadCount();
  for (int i = 0; i < 20 && threads > 1; ++i) {
    ::usleep(5000);
    threads = ThreadCount();
  }
  if (threads != 1) {
    std::fprintf(stderr, "trainctl: the fork server has %d threads, not 1; starting each process on its own\n",
                 threads);
    ::_exit(kExitError);
  }
  MapTextOnHugePages();  // each copy then maps the server's code with the fork, not page by page
  const pid_t parent = ::getppid();
  char* slot = argv[argc - 1];
  const size_t room = ::strlen(slot);
  // Static: a copy returns from here, and freeing a buffer this size costs it a munmap.
  static char request[kMaxRequest];
  const ProcMap proc = ReadProcMap();
  while (true) {
    iovec iov{request, sizeof request};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    ssize_t n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) ::_exit(0);  // the requester closed the channel, or is gone: nothing to flush
    int output_fd = -1;
    if (cmsghdr* c = CMSG_FIRSTHDR(&msg); c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      std::memcpy(&output_fd, CMSG_DATA(c), sizeof(int));
    }
    std::vector<std::string_view> fields;
    for (size_t at = 0; at < static_cast<size_t>(n);) {
      const void* end = std::memchr(request + at, 0, static_cast<size_t>(n) - at);
      const size_t len = end ? static_cast<const char*>(end) - (request + at) : static_cast<size_t>(n) - at;
      fields.emplace_back(request + at, len);
      at += len + 1;
    }
    Reply reply{0, 0};
    int setup[2] = {-1, -1};
    // A copy that only takes its argument (a local job's agent) cannot fail to be set up: it is
    // answered at once, without waiting for the copy to run (two context switches a copy).
    const bool reports = fields.size() != 3 || output_fd >= 0 || !fields[1].empty() || !fields[2].empty();
    if (fields.size() < 3 || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
      reply.pid = -EPROTO;
    } else if (fields[0].size() > room) {
      reply.pid = -E2BIG;
    } else if (reports && ::pipe2(setup, O_CLOEXEC) != 0) {
      reply.pid = -errno;
    } else {
      // A fork whose child is the requester's: the exit signal is this process's own (SIGCHLD).
      // The raw system call skips glibc's fork handlers and those libraries registered (a
      // worker server has loaded LibTorch): they reset locks and thread pools, which a process
      // that never started a thread has not taken or made.
      long pid = ::syscall(SYS_clone, CLONE_PARENT, 0, 0, 0, 0);
      if (pid == 0) {
        ::close(fd);
        if (setup[0] >= 0) ::close(setup[0]);
        ::setpgid(0, 0);
        ::prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (::getppid() != parent) ::_exit(127);  // the requester died meanwhile
        if (int err = SetUpCopy(fields, proc, output_fd, slot, room)) {
          ssize_t ignored = ::write(setup[1], &err, sizeof err);
          (void)ignored;
          ::_exit(127);
        }
        if (setup[1] >= 0) ::close(setup[1]);
        return std::string(fields[0]);
      }
      if (setup[1] >= 0) ::close(setup[1]);
      reply.pid = pid < 0 ? -errno : static_cast<int32_t>(pid);
      if (pid > 0 && reports) {  // the copy says whether it could be set up: EOF when it could
        int err = 0;
        ssize_t got;
        while ((got = ::read(setup[0], &err, sizeof err)) < 0 && errno == EINTR) {
        }
        if (got == sizeof err) reply.error = err;
      }
      if (setup[0] >= 0) ::close(setup[0]);
    }
    if (output_fd >= 0) ::close(output_fd);
    if (::send(fd, &reply, sizeof reply, MSG_NOSIGNAL) != sizeof reply) ::_exit(0);
  }
}

}  // namespace trainctl
