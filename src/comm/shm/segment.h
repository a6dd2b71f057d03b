// Files in /dev/shm that processes of one job map (the shm collectives, parameter servers on the
// same host). They are created private to the user (mode 0600, never over an existing file), and
// opened only when they are a regular file of this user of the expected size, never through a
// link: another local user can neither read them nor slip in a file of their own.
#pragma once

#include <cstddef>
#include <string>

#include "common/status.h"

namespace trainctl::comm {

// "/dev/shm/trainctl-<32 random hex digits>".
std::string NewSegmentName();
// Creates the file with its memory reserved (a full /dev/shm is an error here rather than a
// SIGBUS on first touch); returns its fd. On error nothing is left behind.
Result<int> CreateSegment(const std::string& name, size_t bytes);
// Opens a segment another process of this user created: kPermissionDenied for a link, a file of
// another user or one others may read; kInvalidArgument for a size other than `bytes`.
Result<int> OpenSegment(const std::string& name, size_t bytes);

}  // namespace trainctl::comm
