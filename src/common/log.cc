#include "common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <mutex>

namespace trainctl::log {
namespace {

std::once_flag g_init;

void EnsureStderrLogger() {
  std::call_once(g_init, [] {
    auto logger = spdlog::stderr_color_mt("trainctl");
    spdlog::set_default_logger(logger);
    spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ %v");
  });
}

}  // namespace

bool SetLevel(const std::string& name) {
  EnsureStderrLogger();
  auto level = spdlog::level::from_str(name);
  if (level == spdlog::level::off && name != "off") return false;
  spdlog::set_level(level);
  return true;
}

void SetContext(const std::string& job, const std::string& role, int restart) {
  EnsureStderrLogger();
  std::string ctx;
  auto add = [&ctx](const std::string& field) {
    if (!ctx.empty()) ctx += ' ';
    ctx += field;
  };
  if (!job.empty()) add("job=" + job);
  if (!role.empty()) add(role);
  if (restart >= 0) add("restart=" + std::to_string(restart));
  // '%' would be read as a pattern flag.
  std::string escaped;
  for (char c : ctx) {
    escaped += c;
    if (c == '%') escaped += '%';
  }
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ [" + escaped + "] %v");
}

}  // namespace trainctl::log
