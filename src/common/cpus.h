// How many CPUs this process can keep busy: its affinity mask, capped by the CPU quota of its
// cgroup (a container's CPU limit, as Kubernetes sets it), which the mask does not show.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace trainctl {

// min(CPUs in the affinity mask, the cgroup's quota rounded down), at least 1.
int UsableCpus();
// This process's cgroup CPU quota (CgroupCpuQuota of /proc/self/cgroup), if it has one.
std::optional<double> OwnCpuQuota();

// The memory this process's jobs may use, in bytes: the machine's RAM, capped by the memory.max of
// its cgroup and every cgroup above it (a container's memory limit), where cgroup v2 sets one.
int64_t UsableMemoryBytes();

// The CPUs in this process's affinity mask, in ascending order.
std::vector<int> AffinityCpus();
// Share `index` of `count` (0 <= index < count) of `cpus`, as `cpu_bind: cores` gives a node's
// tasks: consecutive runs of cpus.size() / count CPUs (the first ones one more where it does not
// divide); with fewer CPUs than shares, CPU index % size alone, shared with other tasks.
std::vector<int> CpuShare(const std::vector<int>& cpus, int index, int count);

// "0-3,8,10-11": CPU numbers (ascending) as the kernel lists them (Cpus_allowed_list, taskset -c).
std::string FormatCpuList(const std::vector<int>& cpus);

// Whether processes with these affinity masks (CPU numbers, one list per process) each have a
// CPU of its own, within a CPU quota of `quota` CPUs (none: no quota): one mask for all with at
// least as many CPUs as processes (the kernel spreads them), or masks with no CPU in common
// (cpu_bind: cores). What a waiting process needs to know before it spins.
bool EachHasACpuOfItsOwn(const std::vector<std::vector<int>>& masks, std::optional<double> quota);

// Whether this CPU has AVX2 (what the pooling kernels need), and AVX2 and FMA (what the trainer's
// other x86 kernels need). Safe to call from a static initializer.
bool CpuHasAvx2();
bool CpuHasAvx2Fma();
// AVX-512 Foundation (what the trainer's wide kernels need), with the OS saving its registers;
// false where ATEN_CPU_CAPABILITY (PyTorch's own switch) holds LibTorch to avx2 or default, so
// that one setting holds the whole trainer to what an AVX2-only CPU runs.
bool CpuHasAvx512();

// The CPU quota, in CPUs, that applies to the cgroup named by `self_cgroup` (the text of
// /proc/self/cgroup) under `root` (/sys/fs/cgroup): the smallest cpu.max ("QUOTA PERIOD") from
// that cgroup up to `root` on cgroup v2, else cgroup v1's cpu/cpu.cfs_quota_us over
// cpu.cfs_period_us. nullopt where there is no quota ("max", -1) or nothing can be read.
std::optional<double> CgroupCpuQuota(const std::string& root, const std::string& self_cgroup);

}  // namespace trainctl
