// Files: atomic writes (never a half-written file where a good one was) and bounded reads.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

struct stat;

namespace trainctl {

// Writes `data` to `path` atomically: a temporary file in the same directory, fsync, rename over
// `path`, fsync of the directory. On error the old file (if any) is untouched and the temporary
// file is removed.
Status AtomicWriteFile(const std::string& path, std::string_view data, int mode = 0644);
// The same in the directory open as `dir_fd` (`dir` names it in errors), `name` a file name in it:
// for a directory checked once and then used by its descriptor, so that nobody can swap it
// between the check and the write. The temporary is created exclusively, following no link.
Status AtomicWriteFileAt(int dir_fd, const std::string& dir, const std::string& name, std::string_view data,
                         int mode = 0644);
bool Exists(const std::string& path);
bool IsDirectory(const std::string& path);
// Every reader below opens without blocking (a FIFO, or a device that never answers, hangs
// nothing) and reads only a regular file: a FIFO, device (/dev/zero), socket or directory is
// refused with kInvalidArgument naming what it is. Each reads a bounded amount.
//
// Opens `path` for reading as above; the descriptor is close-on-exec and blocking again (a
// regular file's reads do not wait anyway). `st`, when given, receives its fstat.
Result<int> OpenRegularFile(const std::string& path, struct stat* st = nullptr);
// Reads a whole file; fails with kInvalidArgument if it is larger than `max_bytes`.
Result<std::string> ReadFile(const std::string& path, int64_t max_bytes = 64 << 20);
// The rest of what the open descriptor `fd` reads (`path` names it in errors), as ReadFile: at most
// `max_bytes`. Leaves `fd` open.
Result<std::string> ReadAll(int fd, const std::string& path, int64_t max_bytes);
// What `path` holds from byte `offset` on (what was appended since an earlier read), at most
// `max_bytes` and no further than its size when opened, or "" when it cannot be opened or is not
// a regular file; for files that grow while they are read (logs, metrics): read again for more.
std::string ReadFrom(const std::string& path, int64_t offset, int64_t max_bytes = 64 << 20);
// The last `bytes` bytes of `path` (the first line may be cut), or "" as ReadFrom.
std::string ReadTail(const std::string& path, int64_t bytes);
// mkdir -p.
Status MakeDirs(const std::string& path);
// Writes `text` over the existing regular file at `path`, in place (no new file: for when the
// disk is full and an atomic write cannot make its temporary), then cuts it to that length.
Status OverwriteFile(const std::string& path, const std::string& text);
// rm -rf, best effort (for cleanup: errors are ignored).
void RemoveAll(const std::string& path);
// Raises this process's soft limit of open files to at least `wanted` (up to the hard limit), for
// a server with that many clients. Returns the soft limit in force afterwards.
long RaiseOpenFileLimit(long wanted);
// Makes `path` a directory private to this user (mode 0700), or checks that the one there is:
// a directory, not a link, owned by this user, closed to everyone else. kPermissionDenied names
// what is wrong (someone else's directory, a symlink, a mode others can enter). Only the last
// component is created.
Status PrivateDir(const std::string& path);

}  // namespace trainctl
