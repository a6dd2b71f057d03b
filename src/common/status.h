// Status and Result<T>: how expected failures travel in trainctl. No exceptions cross module
// boundaries; CHECK-style aborts are only for programmer invariants, never for user input.
#pragma once

#include <optional>
#include <string>
#include <utility>

namespace trainctl {

enum class Code {
  kOk = 0,
  kInvalidArgument,  // bad user input (spec, flags)
  kNotFound,
  kTimeout,           // a deadline passed
  kUnavailable,       // a peer or server went away
  kPermissionDenied,  // wrong or missing token
  kAborted,           // stopped on purpose (signal, job stop)
  kAlreadyExists,     // taken already (an address in use)
  kInternal,
};

const char* CodeName(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return Status(); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // "timeout: rendezvous round 0: 1 of 2 nodes joined" ; "ok" for success.
  std::string ToString() const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {Code::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {Code::kNotFound, std::move(m)}; }
inline Status Timeout(std::string m) { return {Code::kTimeout, std::move(m)}; }
inline Status Unavailable(std::string m) { return {Code::kUnavailable, std::move(m)}; }
inline Status PermissionDenied(std::string m) { return {Code::kPermissionDenied, std::move(m)}; }
inline Status Aborted(std::string m) { return {Code::kAborted, std::move(m)}; }
inline Status Internal(std::string m) { return {Code::kInternal, std::move(m)}; }
// A Status from errno: "what: strerror(errno)".
Status ErrnoStatus(const std::string& what, int err);

// Reading the value of a failed Result is a programmer error: it aborts, printing the status,
// instead of reading an empty value.
[[noreturn]] void DieReadingFailedResult(const Status& status);

// Result<T>: a value or a non-ok Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}          // NOLINT
  Result(Status status) : status_(std::move(status)) {}  // NOLINT
  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & { return Checked(), *value_; }
  const T& value() const& { return Checked(), *value_; }
  T&& value() && { return Checked(), std::move(*value_); }
  T& operator*() & { return Checked(), *value_; }
  const T& operator*() const& { return Checked(), *value_; }
  T* operator->() { return Checked(), &*value_; }
  const T* operator->() const { return Checked(), &*value_; }

 private:
  void Checked() const {
    if (!value_.has_value()) [[unlikely]]
      DieReadingFailedResult(status_);
  }

  std::optional<T> value_;
  Status status_;
};

}  // namespace trainctl

#define TRAINCTL_CONCAT_INNER(a, b) a##b
#define TRAINCTL_CONCAT(a, b) TRAINCTL_CONCAT_INNER(a, b)

#define RETURN_IF_ERROR(expr)        \
  do {                               \
    ::trainctl::Status _st = (expr); \
    if (!_st.ok()) return _st;       \
  } while (0)

#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(tmp).value()

#define ASSIGN_OR_RETURN(lhs, expr) ASSIGN_OR_RETURN_IMPL(TRAINCTL_CONCAT(_res_, __LINE__), lhs, expr)
