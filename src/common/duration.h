// Durations and quantities as written in job specs: "30s", "5m", "1h30m", "250ms", "0";
// memory as "512Mi", "4Gi", "1G", "1000".
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace trainctl {

using Duration = std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// Parses "1h30m", "90s", "250ms", "2.5s"; a bare number is seconds. Rejects negatives and values
// over 30 days. The error says what was expected.
Result<Duration> ParseDuration(std::string_view text);
// "1m30s", "250ms", "0s".
std::string FormatDuration(Duration d);
// Parses a Kubernetes-style quantity of bytes: plain, k/M/G/T (powers of 10), Ki/Mi/Gi/Ti.
Result<int64_t> ParseBytes(std::string_view text);

// Milliseconds left until `deadline`, never negative: from now, or from `now` on another clock
// (an agent's, which its tests move).
Duration Remaining(Clock::time_point deadline);
Duration Remaining(Clock::time_point deadline, Clock::time_point now);

// Seconds since the Unix epoch (wall clock), for records that leave this process.
double WallSeconds();
// Seconds elapsed since `start` on the steady clock.
double SecondsSince(Clock::time_point start);

}  // namespace trainctl
