#include "common/cpus.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "common/fs.h"
#include "tests/test_util.h"

namespace trainctl {
namespace {

// A cgroup v2 tree as the kernel shows it: the container's limit of 1.5 CPUs sits on an
// ancestor, its own cgroup has none; the smallest one on the way up applies.
TEST(Cpus, TheSmallestCgroupV2QuotaOnThePathUpApplies) {
  testing::Scratch s;
  ASSERT_TRUE(MakeDirs(s.path("kubepods/pod1/ctr")).ok());
  ASSERT_TRUE(AtomicWriteFile(s.path("cgroup.controllers"), "cpu memory\n").ok());
  ASSERT_TRUE(AtomicWriteFile(s.path("kubepods/cpu.max"), "400000 100000\n").ok());
  ASSERT_TRUE(AtomicWriteFile(s.path("kubepods/pod1/cpu.max"), "150000 100000\n").ok());
  ASSERT_TRUE(AtomicWriteFile(s.path("kubepods/pod1/ctr/cpu.max"), "max 100000\n").ok());
  auto q = CgroupCpuQuota(s.path(""), "0::/kubepods/pod1/ctr\n");
  ASSERT_TRUE(q.has_value());
  EXPECT_DOUBLE_EQ(*q, 1.5);
  // The same tree seen from inside a cgroup namespace: the container is the root.
  ASSERT_TRUE(AtomicWriteFile(s.path("cpu.max"), "50000 100000\n").ok());
  q = CgroupCpuQuota(s.path(""), "0::/\n");
  ASSERT_TRUE(q.has_value());
  EXPECT_DOUBLE_EQ(*q, 0.5);
}

TEST(Cpus, NoQuotaOrAnUnreadableOneMeansNoLimit) {
  testing::Scratch s;
  ASSERT_TRUE(AtomicWriteFile(s.path("cgroup.controllers"), "cpu\n").ok());
  ASSERT_TRUE(AtomicWriteFile(s.path("cpu.max"), "max 100000\n").ok());
  EXPECT_FALSE(CgroupCpuQuota(s.path(""), "0::/\n").has_value());
  ASSERT_TRUE(AtomicWriteFile(s.path("cpu.max"), "lots 100000\n").ok());
  EXPECT_FALSE(CgroupCpuQuota(s.path(""), "0::/\n").has_value());
  EXPECT_FALSE(CgroupCpuQuota(s.path("missing"), "0::/\n").has_value());
}

TEST(Cpus, CgroupV1QuotaOverPeriod) {
  testing::Scratch s;
  ASSERT_TRUE(MakeDirs(s.path("cpu")).ok());
  ASSERT_TRUE(AtomicWriteFile(s.path("cpu/cpu.cfs_quota_us"), "300000\n").ok());
  ASSERT_TRUE(AtomicWriteFile(s.path("cpu/cpu.cfs_period_us"), "100000\n").ok());
  const std::string v1 = "12:cpu,cpuacct:/docker/abc\n11:memory:/docker/abc\n";
  auto q = CgroupCpuQuota(s.path(""), v1);
  ASSERT_TRUE(q.has_value());
  EXPECT_DOUBLE_EQ(*q, 3.0);
  ASSERT_TRUE(AtomicWriteFile(s.path("cpu/cpu.cfs_quota_us"), "-1\n").ok());
  EXPECT_FALSE(CgroupCpuQuota(s.path(""), v1).has_value());
}

// Consecutive shares that cover every CPU once, the larger first; with fewer CPUs than tasks,
// one CPU each, in turn.
TEST(Cpus, ASharePerTaskCoversTheCpusOnce) {
  const std::vector<int> sixteen = [] {
    std::vector<int> v;
    for (int c = 0; c < 16; ++c) v.push_back(c);
    return v;
  }();
  for (int i = 0; i < 16; ++i) EXPECT_EQ(CpuShare(sixteen, i, 16), std::vector<int>{i});
  EXPECT_EQ(CpuShare(sixteen, 1, 4), (std::vector<int>{4, 5, 6, 7}));
  const std::vector<int> five = {2, 3, 5, 8, 9};  // a mask with holes: its own numbers
  EXPECT_EQ(CpuShare(five, 0, 2), (std::vector<int>{2, 3, 5}));
  EXPECT_EQ(CpuShare(five, 1, 2), (std::vector<int>{8, 9}));
  EXPECT_EQ(CpuShare(five, 0, 1), five);
  EXPECT_EQ(CpuShare({0, 1}, 2, 3), std::vector<int>{0});
  EXPECT_EQ(CpuShare({0, 1}, 1, 3), std::vector<int>{1});
  EXPECT_TRUE(CpuShare({0, 1}, 3, 3).empty());
  EXPECT_TRUE(CpuShare({}, 0, 1).empty());
}

TEST(Cpus, CpuListsReadAsTheKernelWritesThem) {
  EXPECT_EQ(FormatCpuList({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(FormatCpuList({5}), "5");
  EXPECT_EQ(FormatCpuList({}), "");
}

// Spinning while it waits is safe for a process only where no other one needs its CPU.
TEST(Cpus, EachHasACpuOfItsOwnWhenTheMasksAllowIt) {
  const std::vector<int> four = {0, 1, 2, 3};
  EXPECT_TRUE(EachHasACpuOfItsOwn({four, four, four, four}, std::nullopt));         // not bound, enough
  EXPECT_FALSE(EachHasACpuOfItsOwn({four, four, four, four, four}, std::nullopt));  // too many
  EXPECT_TRUE(EachHasACpuOfItsOwn({{0}, {1}, {2}, {3}}, std::nullopt));             // cpu_bind: cores
  EXPECT_TRUE(EachHasACpuOfItsOwn({{0, 1}, {2, 3}}, std::nullopt));
  EXPECT_FALSE(EachHasACpuOfItsOwn({{0}, {1}, {0}}, std::nullopt));   // more tasks than CPUs, bound
  EXPECT_FALSE(EachHasACpuOfItsOwn({{0, 1}, {1, 2}}, std::nullopt));  // overlapping
  EXPECT_FALSE(EachHasACpuOfItsOwn({four, {0}}, std::nullopt));
  EXPECT_FALSE(EachHasACpuOfItsOwn({{0}, {1}, {2}, {3}}, 3.5));  // a quota of fewer CPUs
  EXPECT_TRUE(EachHasACpuOfItsOwn({four, four}, 2.0));
}

// This machine: at least one CPU, and no more than the affinity mask has.
TEST(Cpus, UsableCpusIsBetweenOneAndTheAffinityMask) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  EXPECT_GE(UsableCpus(), 1);
  EXPECT_LE(UsableCpus(), CPU_COUNT(&set));
}

}  // namespace
// ATEN_CPU_CAPABILITY=avx2 (or default) holds the trainer's own kernels to AVX2 as it holds
// LibTorch's: what an AVX2-only machine runs, measured on an AVX-512 one.
TEST(Cpus, AtensCapabilitySwitchHoldsOurKernelsToAvx2Too) {
  const char* before = std::getenv("ATEN_CPU_CAPABILITY");
  const std::string saved = before ? before : "";
  for (const char* held : {"avx2", "default"}) {
    ::setenv("ATEN_CPU_CAPABILITY", held, 1);
    EXPECT_FALSE(CpuHasAvx512()) << held;
  }
  ::setenv("ATEN_CPU_CAPABILITY", "avx512", 1);
  const bool avx512 = CpuHasAvx512();
  ::unsetenv("ATEN_CPU_CAPABILITY");
  EXPECT_EQ(CpuHasAvx512(), avx512);
#if defined(__x86_64__)
  EXPECT_EQ(avx512, __builtin_cpu_supports("avx512f") != 0);
#endif
  if (before) ::setenv("ATEN_CPU_CAPABILITY", saved.c_str(), 1);
}

}  // namespace trainctl
