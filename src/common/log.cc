#include "common/log.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <mutex>

namespace trainctl::log {
namespace {

std::once_flag g_init;
std::mutex g_context_mu;
std::string g_context;  // "[job=... node=... restart=...] ", or ""

// %* in the pattern: the context as it is when a line is written, so that setting it (each
// agent does, twice) costs a string, not a new formatter.
class ContextFlag : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg&, const std::tm&, spdlog::memory_buf_t& dest) override {
    std::lock_guard<std::mutex> lock(g_context_mu);
    dest.append(g_context.data(), g_context.data() + g_context.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<ContextFlag>(); }
};

void EnsureStderrLogger() {
  std::call_once(g_init, [] {
    auto logger = spdlog::stderr_color_mt("trainctl");
    spdlog::set_default_logger(logger);
    auto formatter = std::make_unique<spdlog::pattern_formatter>();
    formatter->add_flag<ContextFlag>('*').set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ %*%v");
    spdlog::set_formatter(std::move(formatter));
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
  std::lock_guard<std::mutex> lock(g_context_mu);
  g_context = ctx.empty() ? "" : "[" + ctx + "] ";
}

}  // namespace trainctl::log
