// Files: atomic writes (never a half-written file where a good one was) and bounded reads.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace trainctl {

// Writes `data` to `path` atomically: a temporary file in the same directory, fsync, rename over
// `path`, fsync of the directory. On error the old file (if any) is untouched and the temporary
// file is removed.
Status AtomicWriteFile(const std::string& path, std::string_view data, int mode = 0644);
bool Exists(const std::string& path);
bool IsDirectory(const std::string& path);
// Reads a whole file; fails with kInvalidArgument if it is larger than `max_bytes`.
Result<std::string> ReadFile(const std::string& path, int64_t max_bytes = 64 << 20);
// What `path` holds from byte `offset` on (what was appended since an earlier read), or "" when
// it cannot be opened; for files that grow while they are read (logs, metrics).
std::string ReadFrom(const std::string& path, int64_t offset);
// The last `bytes` bytes of `path` (the first line may be cut), or "" when it cannot be opened.
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
