#include "common/cpus.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <sstream>
#include <string_view>

#include "common/fs.h"
#include "common/strings.h"

namespace trainctl {
namespace {

// "QUOTA PERIOD" (microseconds, as cgroup v2's cpu.max has them) in CPUs; nullopt for "max",
// a negative quota (v1's "none") or anything else.
std::optional<double> ParseQuota(const std::string& text) {
  std::istringstream fields(text);
  std::string quota, period, extra;
  if (!(fields >> quota >> period) || fields >> extra) return std::nullopt;
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

}  // namespace

std::optional<double> CgroupCpuQuota(const std::string& root, const std::string& self_cgroup) {
  std::optional<double> best;
  auto take = [&](std::optional<double> q) {
    if (q && (!best || *q < *best)) best = q;
  };
  // cgroup v2: the line "0::/path"; every cgroup from it up to the root may limit it.
  std::optional<std::string> v2_path;
  for (const std::string& line : SplitLines(self_cgroup)) {
    if (line.rfind("0::", 0) == 0) v2_path = line.substr(3);
  }
  if (v2_path && Exists(root + "/cgroup.controllers")) {
    std::string path = *v2_path;
    while (true) {
      if (auto text = ReadFile(root + path + "/cpu.max", 4096); text.ok()) take(ParseQuota(*text));
      if (path.empty() || path == "/") break;
      path = path.substr(0, path.find_last_of('/'));
    }
    return best;
  }
  // cgroup v1 (the container's own cpu controller is mounted at root/cpu).
  auto quota = ReadFile(root + "/cpu/cpu.cfs_quota_us", 4096);
  auto period = ReadFile(root + "/cpu/cpu.cfs_period_us", 4096);
  if (quota.ok() && period.ok()) take(ParseQuota(*quota + " " + *period));
  return best;
}

std::vector<int> AffinityCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

std::vector<int> CpuShare(const std::vector<int>& cpus, int index, int count) {
  const int n = static_cast<int>(cpus.size());
  if (n == 0 || count <= 0 || index < 0 || index >= count) return {};
  if (n < count) return {cpus[index % n]};
  // Share i starts at i * n / count rounded up: the sizes differ by at most one, the larger ones first.
  auto start = [&](int i) { return static_cast<int>((static_cast<int64_t>(i) * n + count - 1) / count); };
  return std::vector<int>(cpus.begin() + start(index), cpus.begin() + start(index + 1));
}

std::string FormatCpuList(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    out += (out.empty() ? "" : ",") + std::to_string(cpus[i]) + (j > i ? "-" + std::to_string(cpus[j]) : "");
    i = j + 1;
  }
  return out;
}

std::optional<double> OwnCpuQuota() {
  auto self = ReadFile("/proc/self/cgroup", 1 << 16);
  if (!self.ok()) return std::nullopt;
  return CgroupCpuQuota("/sys/fs/cgroup", *self);
}

int64_t UsableMemoryBytes() {
  int64_t bytes = static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGESIZE);
  auto self = ReadFile("/proc/self/cgroup", 1 << 16);
  std::optional<std::string> path;
  for (const std::string& line : SplitLines(self.ok() ? *self : "")) {
    if (line.rfind("0::", 0) == 0) path = line.substr(3);
  }
  while (path) {
    if (auto text = ReadFile("/sys/fs/cgroup" + *path + "/memory.max", 4096); text.ok()) {
      const long long limit = std::atoll(text->c_str());
      if (limit > 0) bytes = std::min<int64_t>(bytes, limit);  // "max": none
    }
    if (path->empty() || *path == "/") break;
    path = path->substr(0, path->find_last_of('/'));
  }
  return bytes;
}

int UsableCpus() {
  int cpus = static_cast<int>(AffinityCpus().size());
  if (auto quota = OwnCpuQuota()) cpus = std::min(cpus, static_cast<int>(std::floor(*quota)));
  return std::max(1, cpus);
}

bool EachHasACpuOfItsOwn(const std::vector<std::vector<int>>& masks, std::optional<double> quota) {
  const size_t n = masks.size();
  if (quota && std::floor(*quota) < static_cast<double>(n)) return false;
  if (std::all_of(masks.begin(), masks.end(), [&](const std::vector<int>& m) { return m == masks[0]; })) {
    return n == 0 || masks[0].size() >= n;
  }
  std::set<int> seen;
  for (const auto& m : masks) {
    if (m.empty()) return false;
    for (int c : m) {
      if (!seen.insert(c).second) return false;  // a CPU two of them may run on
    }
  }
  return true;
}

bool CpuHasAvx2() {
#if defined(__x86_64__)
  __builtin_cpu_init();  // a static initializer may run before libgcc's own, which fills it in
  return __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

bool CpuHasAvx2Fma() {
#if defined(__x86_64__)
  return CpuHasAvx2() && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

bool CpuHasAvx512() {
#if defined(__x86_64__)
  if (const char* held = std::getenv("ATEN_CPU_CAPABILITY")) {
    if (std::string_view(held) == "avx2" || std::string_view(held) == "default") return false;
  }
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
#else
  return false;
#endif
}

}  // namespace trainctl
