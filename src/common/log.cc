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
  // Each pattern set builds a formatter: not again for the context already set (an agent sets
  // its node's again once the rendezvous has ranked it, most often the same).
  const std::string pattern = "%Y-%m-%dT%H:%M:%S.%e %^%L%$ [" + escaped + "] %v";
  static std::mutex mu;
  static std::string current;
  std::lock_guard<std::mutex> lock(mu);
  if (pattern == current) return;
  current = pattern;
  spdlog::set_pattern(pattern);
}

}  // namespace trainctl::log
