#include "common/cpus.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "common/fs.h"

namespace trainctl {
namespace {

// "QUOTA PERIOD" in microseconds (cgroup v2's cpu.max); nullopt for "max" or anything else.
std::optional<double> ParseQuota(const std::string& quota, const std::string& period) {
  try {
    size_t end = 0;
    long long q = std::stoll(quota, &end);
    if (end != quota.size() || q <= 0) return std::nullopt;
    long long p = std::stoll(period, &end);
    if (end != period.size() || p <= 0) return std::nullopt;
    return double(q) / double(p);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \n\t"), e = s.find_last_not_of(" \n\t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

}  // namespace

std::optional<double> CgroupCpuQuota(const std::string& root, const std::string& self_cgroup) {
  std::optional<double> best;
  auto take = [&](std::optional<double> q) {
    if (q && (!best || *q < *best)) best = q;
  };
  // cgroup v2: the line "0::/path"; every cgroup from it up to the root may limit it.
  std::istringstream lines(self_cgroup);
  std::string line, v2_path;
  bool v2 = false;
  while (std::getline(lines, line)) {
    if (line.rfind("0::", 0) == 0) {
      v2 = true;
      v2_path = line.substr(3);
    }
  }
  if (v2 && Exists(root + "/cgroup.controllers")) {
    std::string path = v2_path;
    while (true) {
      auto text = ReadFile(root + path + "/cpu.max", 4096);
      if (text.ok()) {
        std::istringstream fields(Trim(*text));
        std::string quota, period;
        fields >> quota >> period;
        take(ParseQuota(quota, period));
      }
      if (path.empty() || path == "/") break;
      path = path.substr(0, path.find_last_of('/'));
    }
    return best;
  }
  // cgroup v1 (the container's own cpu controller is mounted at root/cpu).
  auto quota = ReadFile(root + "/cpu/cpu.cfs_quota_us", 4096);
  auto period = ReadFile(root + "/cpu/cpu.cfs_period_us", 4096);
  if (quota.ok() && period.ok()) take(ParseQuota(Trim(*quota), Trim(*period)));
  return best;
}

int UsableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  int cpus = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  auto self = ReadFile("/proc/self/cgroup", 1 << 16);
  if (self.ok()) {
    if (auto quota = CgroupCpuQuota("/sys/fs/cgroup", *self)) {
      cpus = std::min(cpus, static_cast<int>(std::floor(*quota)));
    }
  }
  return std::max(1, cpus);
}

}  // namespace trainctl
