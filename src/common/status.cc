#include "common/status.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace trainctl {

const char* CodeName(Code code) {
  switch (code) {
    case Code::kOk:
      return "ok";
    case Code::kInvalidArgument:
      return "invalid argument";
    case Code::kNotFound:
      return "not found";
    case Code::kTimeout:
      return "timeout";
    case Code::kUnavailable:
      return "unavailable";
    case Code::kPermissionDenied:
      return "permission denied";
    case Code::kAborted:
      return "aborted";
    case Code::kAlreadyExists:
      return "already exists";
    case Code::kInternal:
      return "internal error";
  }
  return "unknown";
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  return std::string(CodeName(code_)) + ": " + message_;
}

Status ErrnoStatus(const std::string& what, int err) {
  Code code = Code::kInternal;
  if (err == ENOENT) code = Code::kNotFound;
  if (err == EACCES || err == EPERM) code = Code::kPermissionDenied;
  if (err == ETIMEDOUT) code = Code::kTimeout;
  if (err == ECONNREFUSED || err == ECONNRESET || err == EPIPE) code = Code::kUnavailable;
  if (err == EADDRINUSE) code = Code::kAlreadyExists;
  return Status(code, what + ": " + std::strerror(err));
}

void DieReadingFailedResult(const Status& status) {
  std::fprintf(stderr, "trainctl: internal error: the value of a failed result was read: %s\n",
               status.ToString().c_str());
  std::abort();
}

}  // namespace trainctl
