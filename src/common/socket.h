// Blocking-with-deadline socket helpers shared by the TCP clients (the store, parameter servers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "common/duration.h"

namespace trainctl {

// One non-blocking connect attempt, bounded by `deadline`, with TCP_NODELAY. Returns the fd
// (non-blocking, close-on-exec) or -errno. `stop`, when given, is asked every 100 ms while the
// attempt waits: true ends it with -ECANCELED.
int ConnectOnce(const std::string& host, uint16_t port, Clock::time_point deadline,
                const std::function<bool()>& stop = nullptr);
// The same for a Unix-domain socket: `path` is a file, or "@name" for the abstract namespace.
// -ECONNREFUSED while nothing listens there, -EAGAIN while its backlog is full (retry both).
int ConnectUnix(const std::string& path);
// Sends all of `data`; false on an error or when `deadline` passes.
bool SendAll(int fd, std::string_view data, Clock::time_point deadline);
// Reads exactly `size` bytes. 1: read, 0: peer closed, -1: timed out, -2: error.
int RecvAll(int fd, char* out, size_t size, Clock::time_point deadline);

}  // namespace trainctl
