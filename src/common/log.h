// One logging layer for the whole binary. Every line carries the job, the role (launcher,
// node-N) and the restart count, so interleaved output from several agents stays readable:
//   2026-11-22T11:30:00.123 I [job=hello node=1 restart=2] message
// Thread-safe (spdlog). Logs go to stderr; worker output goes to stdout.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace trainctl::log {

// Sets the level from a name: trace, debug, info, warn, error. Unknown names leave it unchanged
// and return false.
bool SetLevel(const std::string& name);
// Sets the context shown in every line; fields that are empty are left out.
void SetContext(const std::string& job, const std::string& role, int restart);

}  // namespace trainctl::log

#define LOG_DEBUG(...) spdlog::debug(__VA_ARGS__)
#define LOG_INFO(...) spdlog::info(__VA_ARGS__)
#define LOG_WARN(...) spdlog::warn(__VA_ARGS__)
#define LOG_ERROR(...) spdlog::error(__VA_ARGS__)
