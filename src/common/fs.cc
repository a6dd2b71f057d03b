#include "common/fs.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>

#include "common/random.h"

namespace trainctl {
namespace {

Status WriteAll(int fd, std::string_view data, const std::string& path) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("writing " + path, errno);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return Status::Ok();
}

}  // namespace

Status AtomicWriteFileAt(int dir_fd, const std::string& dir, const std::string& name, std::string_view data, int mode) {
  // A temporary name of our own (O_EXCL: never one someone planted), in the same directory.
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; attempt < 16 && fd < 0; ++attempt) {
    tmp = "." + name + ".tmp." + RandomHex(6);
    fd = ::openat(dir_fd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) return ErrnoStatus("creating a temporary file in " + dir, errno);
  const std::string shown = dir + "/" + tmp;
  auto fail = [&](Status st) {
    ::close(fd);
    ::unlinkat(dir_fd, tmp.c_str(), 0);
    return st;
  };
  if (::fchmod(fd, static_cast<mode_t>(mode)) != 0) return fail(ErrnoStatus("chmod " + shown, errno));
  if (Status st = WriteAll(fd, data, shown); !st.ok()) return fail(st);
  if (::fsync(fd) != 0) return fail(ErrnoStatus("fsync " + shown, errno));
  if (::close(fd) != 0) {
    ::unlinkat(dir_fd, tmp.c_str(), 0);
    return ErrnoStatus("closing " + shown, errno);
  }
  if (::renameat(dir_fd, tmp.c_str(), dir_fd, name.c_str()) != 0) {
    int err = errno;
    ::unlinkat(dir_fd, tmp.c_str(), 0);
    return ErrnoStatus("renaming " + shown + " to " + dir + "/" + name, err);
  }
  if (::fsync(dir_fd) != 0) return ErrnoStatus("fsync of directory " + dir, errno);
  return Status::Ok();
}

Status AtomicWriteFile(const std::string& path, std::string_view data, int mode) {
  std::filesystem::path p(path);
  const std::string dir = p.has_parent_path() ? p.parent_path().string() : ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return ErrnoStatus("opening directory " + dir, errno);
  Status st = AtomicWriteFileAt(dfd, dir, p.filename().string(), data, mode);
  ::close(dfd);
  return st;
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

Status OverwriteFile(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("cannot open " + path, errno);
  Status st;
  if (::pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    st = ErrnoStatus("cannot write " + path, errno);
  } else if (::ftruncate(fd, static_cast<off_t>(text.size())) != 0) {
    st = ErrnoStatus("cannot cut " + path, errno);
  }
  ::close(fd);
  return st;
}

Result<int> OpenRegularFile(const std::string& path, struct stat* out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("cannot open " + path, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus("cannot inspect " + path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    const char* what = S_ISDIR(st.st_mode)    ? "a directory"
                       : S_ISFIFO(st.st_mode) ? "a FIFO"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                       : S_ISBLK(st.st_mode)  ? "a block device"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "not a regular file";
    return InvalidArgument(path + " is " + what + ", not a file");
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  if (out) *out = st;
  return fd;
}

std::string ReadFrom(const std::string& path, int64_t offset, int64_t max_bytes) {
  struct stat st {};
  auto fd = OpenRegularFile(path, &st);
  if (!fd.ok()) return "";
  // What it held when opened: a file that grows meanwhile is read again for the rest.
  const int64_t want = std::min<int64_t>(max_bytes, std::max<int64_t>(0, st.st_size - offset));
  std::string out(static_cast<size_t>(want), '\0');
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::pread(*fd, out.data() + got, out.size() - got, offset + static_cast<int64_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(*fd);
  out.resize(got);
  return out;
}

std::string ReadTail(const std::string& path, int64_t bytes) {
  struct stat st {};
  auto fd = OpenRegularFile(path, &st);
  if (!fd.ok()) return "";
  ::close(*fd);
  return ReadFrom(path, std::max<int64_t>(0, st.st_size - bytes), bytes);
}

Result<std::string> ReadAll(int fd, const std::string& path, int64_t max_bytes) {
  std::string out;
  char buf[65536];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("reading " + path, errno);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (static_cast<int64_t>(out.size()) > max_bytes) {
      std::string limit =
          max_bytes % (1 << 20) == 0 ? std::to_string(max_bytes >> 20) + " MiB" : std::to_string(max_bytes) + " bytes";
      return InvalidArgument(path + " is larger than " + limit);
    }
  }
  return out;
}

Result<std::string> ReadFile(const std::string& path, int64_t max_bytes) {
  ASSIGN_OR_RETURN(const int fd, OpenRegularFile(path));
  auto out = ReadAll(fd, path, max_bytes);
  ::close(fd);
  return out;
}

Status MakeDirs(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return Internal("cannot create directory " + path + ": " + ec.message());
  return Status::Ok();
}

void RemoveAll(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

Status PrivateDir(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) return ErrnoStatus("cannot create " + path, errno);
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return ErrnoStatus("cannot inspect " + path, errno);
  if (S_ISLNK(st.st_mode)) return PermissionDenied(path + " is a symbolic link; refusing to follow it");
  if (!S_ISDIR(st.st_mode)) return PermissionDenied(path + " is not a directory");
  if (st.st_uid != ::geteuid()) {
    return PermissionDenied(path + " belongs to uid " + std::to_string(st.st_uid) + ", not to this user (uid " +
                            std::to_string(::geteuid()) + "); refusing to use it");
  }
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%03o", st.st_mode & 0777);
    return PermissionDenied(path + " has mode " + mode + "; it must be private (700)");
  }
  return Status::Ok();
}

long RaiseOpenFileLimit(long wanted) {
  struct rlimit rl {};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return -1;
  if (rl.rlim_cur == RLIM_INFINITY || static_cast<long>(rl.rlim_cur) >= wanted) return static_cast<long>(rl.rlim_cur);
  rlim_t target = static_cast<rlim_t>(wanted);
  if (rl.rlim_max != RLIM_INFINITY && target > rl.rlim_max) target = rl.rlim_max;
  rl.rlim_cur = target;
  (void)::setrlimit(RLIMIT_NOFILE, &rl);
  ::getrlimit(RLIMIT_NOFILE, &rl);
  return static_cast<long>(rl.rlim_cur);
}

}  // namespace trainctl
