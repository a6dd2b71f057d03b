// The error file of a task (torchrun's TORCHELASTIC_ERROR_FILE): what a failing program writes
// about its exception before it exits. Programs decorated with torch's `@record` write it (torch's
// own JSON, below); the built-in trainer writes the same. The agent reads it after a failure, so
// the report shows the exception and its traceback, and so the failure that happened first across
// every rank and node (the root cause) can be told from the ones it caused.
//
// Format: {"message": {"message": "ValueError: ...", "extraInfo": {"py_callstack": "Traceback...",
// "timestamp": "1700000000"}}}; torch also writes {"message": "text"} when it passes a child's
// error on. The bytes come from the task: everything is checked, nothing is trusted.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace trainctl {

struct TaskError {
  std::string message;    // "ValueError: bad input"
  std::string traceback;  // Python's formatted traceback, or ""
  int64_t timestamp = 0;  // unix seconds when the program wrote it; 0 when the file has none
  // The same, finer where the file tells more (its modification time, when it lies in that second),
  // so failures of one second are told apart; 0 when timestamp is.
  int64_t time_ns = 0;
};

inline constexpr int64_t kMaxErrorFileBytes = 1 << 20;

// kInvalidArgument naming `path` and what is wrong (not JSON, no message, a timestamp that is not
// a number). Messages and tracebacks longer than 64 KiB are cut (the end of a traceback kept).
Result<TaskError> ParseErrorFile(std::string_view bytes, const std::string& path);
// nullopt when there is no file at `path`; errors for one larger than kMaxErrorFileBytes, one
// that cannot be read or parsed.
Result<std::optional<TaskError>> ReadErrorFile(const std::string& path);
// The JSON torch's @record writes, for a program of ours.
std::string ErrorFileJson(const TaskError& error);

}  // namespace trainctl
