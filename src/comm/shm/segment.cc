#include "comm/shm/segment.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "common/random.h"

namespace trainctl::comm {

std::string NewSegmentName() { return "/dev/shm/trainctl-" + RandomHex(16); }

Result<int> CreateSegment(const std::string& name, size_t bytes) {
  int fd = ::open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoStatus("shm: cannot create " + name, errno);
  if (int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
    ::close(fd);
    ::unlink(name.c_str());
    return ErrnoStatus("shm: cannot reserve " + std::to_string(bytes >> 20) + " MiB for " + name, err);
  }
  return fd;
}

Result<int> OpenSegment(const std::string& name, size_t bytes) {
  if (name.rfind("/dev/shm/trainctl-", 0) != 0 || name.find('/', 18) != std::string::npos) {
    return InvalidArgument("shm: " + name + " is not a trainctl segment");
  }
  int fd = ::open(name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("shm: cannot open " + name, errno);
  struct stat st {};
  Status bad;
  if (::fstat(fd, &st) != 0) {
    bad = ErrnoStatus("shm: cannot stat " + name, errno);
  } else if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    bad = PermissionDenied("shm: " + name + " is not a private file of this user");
  } else if (static_cast<size_t>(st.st_size) != bytes) {
    bad = InvalidArgument("shm: " + name + " holds " + std::to_string(st.st_size) + " bytes, expected " +
                          std::to_string(bytes));
  }
  if (!bad.ok()) {
    ::close(fd);
    return bad;
  }
  return fd;
}

}  // namespace trainctl::comm
