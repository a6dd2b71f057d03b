#include "common/duration.h"

#include <gtest/gtest.h>

namespace trainctl {
namespace {

TEST(ParseDuration, AcceptsUnitsAndCombinations) {
  EXPECT_EQ(ParseDuration("30s")->count(), 30000);
  EXPECT_EQ(ParseDuration("250ms")->count(), 250);
  EXPECT_EQ(ParseDuration("1h30m")->count(), 5400000);
  EXPECT_EQ(ParseDuration("2.5s")->count(), 2500);
  EXPECT_EQ(ParseDuration("10")->count(), 10000);  // bare number: seconds
  EXPECT_EQ(ParseDuration("0")->count(), 0);
}

TEST(ParseDuration, RejectsJunkWithTheExpectedForm) {
  for (const char* bad : {"", "abc", "10x", "-5s", "s", "1s5", "5m-3s"}) {
    auto d = ParseDuration(bad);
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_NE(d.status().message().find("expected a duration"), std::string::npos) << bad;
  }
  auto huge = ParseDuration("99999999999999999999h");
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("longer than 30 days"), std::string::npos);
}

// A failed Result read as if it held a value stops the process naming the status, where an
// unchecked read would go on with garbage or crash without a word.
TEST(ResultDeathTest, ReadingAFailedResultAbortsNamingItsStatus) {
  Result<Duration> failed = ParseDuration("10x");
  EXPECT_DEATH((void)failed->count(), "failed result was read: invalid argument: .*expected a duration");
  EXPECT_DEATH((void)*Result<int>(Unavailable("etcd went away")), "unavailable: etcd went away");
}

TEST(FormatDuration, RoundTripsCommonValues) {
  EXPECT_EQ(FormatDuration(Duration(0)), "0s");
  EXPECT_EQ(FormatDuration(Duration(250)), "250ms");
  EXPECT_EQ(FormatDuration(Duration(5400000)), "1h30m");
  EXPECT_EQ(FormatDuration(Duration(2500)), "2.5s");
}

TEST(ParseBytes, KubernetesQuantities) {
  EXPECT_EQ(*ParseBytes("512Mi"), 512LL << 20);
  EXPECT_EQ(*ParseBytes("4Gi"), 4LL << 30);
  EXPECT_EQ(*ParseBytes("1G"), 1000000000LL);
  EXPECT_EQ(*ParseBytes("1000"), 1000);
  EXPECT_FALSE(ParseBytes("4GB").ok());
  EXPECT_FALSE(ParseBytes("lots").ok());
  EXPECT_FALSE(ParseBytes("99999999Ti").ok());
}

}  // namespace
}  // namespace trainctl
