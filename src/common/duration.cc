#include "common/duration.h"

#include <cmath>
#include <cstdlib>

namespace trainctl {
namespace {

constexpr double kMaxMs = 30.0 * 24 * 3600 * 1000;

bool ParseNumberPrefix(std::string_view text, size_t* pos, double* out) {
  size_t start = *pos;
  while (*pos < text.size() && (std::isdigit(static_cast<unsigned char>(text[*pos])) || text[*pos] == '.')) {
    ++*pos;
  }
  if (*pos == start) return false;
  std::string num(text.substr(start, *pos - start));
  char* end = nullptr;
  *out = std::strtod(num.c_str(), &end);
  return end == num.c_str() + num.size();
}

}  // namespace

Result<Duration> ParseDuration(std::string_view text) {
  const std::string expected = "expected a duration such as 30s, 5m, 1h30m or 250ms, got \"" + std::string(text) + "\"";
  if (text.empty()) return InvalidArgument(expected);
  size_t pos = 0;
  double total_ms = 0;
  bool bare = true;
  while (pos < text.size()) {
    double value;
    if (!ParseNumberPrefix(text, &pos, &value)) return InvalidArgument(expected);
    size_t unit_start = pos;
    while (pos < text.size() && std::isalpha(static_cast<unsigned char>(text[pos]))) ++pos;
    std::string_view unit = text.substr(unit_start, pos - unit_start);
    double scale;
    if (unit.empty()) {
      if (!bare || pos != text.size()) return InvalidArgument(expected);
      scale = 1000;  // a bare number is seconds
    } else if (unit == "ms") {
      scale = 1;
    } else if (unit == "s") {
      scale = 1000;
    } else if (unit == "m") {
      scale = 60e3;
    } else if (unit == "h") {
      scale = 3600e3;
    } else if (unit == "d") {
      scale = 86400e3;
    } else {
      return InvalidArgument(expected);
    }
    bare = false;
    total_ms += value * scale;
    if (!std::isfinite(total_ms) || total_ms > kMaxMs) {
      return InvalidArgument("duration \"" + std::string(text) + "\" is longer than 30 days");
    }
  }
  return Duration(static_cast<int64_t>(std::llround(total_ms)));
}

std::string FormatDuration(Duration d) {
  int64_t ms = d.count();
  if (ms == 0) return "0s";
  if (ms < 1000) return std::to_string(ms) + "ms";
  std::string out;
  int64_t h = ms / 3600000, m = (ms / 60000) % 60, s = (ms / 1000) % 60, rest = ms % 1000;
  if (h) out += std::to_string(h) + "h";
  if (m) out += std::to_string(m) + "m";
  if (s || rest) {
    out += std::to_string(s);
    if (rest) {
      char buf[8];
      std::snprintf(buf, sizeof buf, ".%03lld", static_cast<long long>(rest));
      std::string frac(buf);
      while (frac.back() == '0') frac.pop_back();
      out += frac;
    }
    out += "s";
  }
  return out;
}

Result<int64_t> ParseBytes(std::string_view text) {
  const std::string expected = "expected a size such as 512Mi, 4Gi or 1G, got \"" + std::string(text) + "\"";
  size_t pos = 0;
  double value;
  if (!ParseNumberPrefix(text, &pos, &value)) return InvalidArgument(expected);
  std::string_view unit = text.substr(pos);
  double scale = 1;
  if (unit.empty())
    scale = 1;
  else if (unit == "k")
    scale = 1e3;
  else if (unit == "M")
    scale = 1e6;
  else if (unit == "G")
    scale = 1e9;
  else if (unit == "T")
    scale = 1e12;
  else if (unit == "Ki")
    scale = 1024.0;
  else if (unit == "Mi")
    scale = 1024.0 * 1024;
  else if (unit == "Gi")
    scale = 1024.0 * 1024 * 1024;
  else if (unit == "Ti")
    scale = 1024.0 * 1024 * 1024 * 1024;
  else
    return InvalidArgument(expected);
  double bytes = value * scale;
  if (!std::isfinite(bytes) || bytes > 9e18) {
    return InvalidArgument("size \"" + std::string(text) + "\" is too large");
  }
  return static_cast<int64_t>(bytes);
}

Duration Remaining(Clock::time_point deadline) { return Remaining(deadline, Clock::now()); }

Duration Remaining(Clock::time_point deadline, Clock::time_point now) {
  auto left = std::chrono::duration_cast<Duration>(deadline - now);
  return left.count() < 0 ? Duration(0) : left;
}

double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double SecondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

}  // namespace trainctl
