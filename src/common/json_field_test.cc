#include "common/json_field.h"

#include <gtest/gtest.h>

namespace trainctl {
namespace {

using nlohmann::json;

TEST(JsonField, AFieldOfAnotherTypeIsAsIfMissing) {
  const json j = json::parse(R"({"s": "text", "n": 3, "f": 2.5, "b": true, "o": {}, "a": [1]})");
  EXPECT_EQ(JsonField(j, "s", "-"), "text");
  EXPECT_EQ(JsonField(j, "n", "-"), "-");
  EXPECT_EQ(JsonField(j, "missing", "-"), "-");
  EXPECT_EQ(JsonField(j, "n", 0), 3);
  EXPECT_EQ(JsonField(j, "s", 7), 7);
  EXPECT_EQ(JsonField(j, "o", 7), 7);
  EXPECT_EQ(JsonField(j, "a", 1.5), 1.5);
  EXPECT_EQ(JsonField(j, "f", 0.0), 2.5);
  EXPECT_EQ(JsonField(j, "n", 0.0), 3.0);
  EXPECT_EQ(JsonField(j, "b", false), true);
  EXPECT_EQ(JsonField(j, "n", false), false);
  EXPECT_EQ(JsonField(json::array({1}), "n", 4), 4);  // not an object
  EXPECT_EQ(JsonField(json(), "n", 4), 4);
}

TEST(JsonField, AnIntegerOutOfRangeOrNotWholeIsTheFallback) {
  const json j = json::parse(R"({"big": 1e300, "half": 2.5, "whole": 3.0, "neg": -1, "huge": 18446744073709551615,
                                 "two63": 9223372036854775808.0, "i32max": 2147483647, "i32over": 2147483648})");
  EXPECT_EQ(JsonField(j, "big", -1), -1);  // converting 1e300 to int is undefined behaviour
  EXPECT_EQ(JsonField(j, "half", -1), -1);
  EXPECT_EQ(JsonField(j, "whole", -1), 3);
  EXPECT_EQ(JsonField(j, "neg", 0u), 0u);
  EXPECT_EQ(JsonField(j, "neg", 0), -1);
  EXPECT_EQ(JsonField(j, "huge", int64_t{-1}), -1);
  EXPECT_EQ(JsonField(j, "huge", uint64_t{0}), 18446744073709551615u);
  EXPECT_EQ(JsonField(j, "two63", int64_t{-1}), -1);
  EXPECT_EQ(JsonField(j, "i32max", 0), 2147483647);
  EXPECT_EQ(JsonField(j, "i32over", 0), 0);
  EXPECT_EQ(JsonField(j, "i32over", int64_t{0}), 2147483648);
}

TEST(JsonAfterOtherLines, TheDocumentAfterALibrarysWarningLines) {
  EXPECT_EQ(JsonAfterOtherLines("{\"a\": 1}\n"), json({{"a", 1}}));
  EXPECT_EQ(JsonAfterOtherLines("[W NNPACK.cpp:64] Could not initialize NNPACK! Reason: Unsupported hardware.\n"
                                "[{\"top\": [1]}]\n"),
            json::parse(R"([{"top": [1]}])"));
  EXPECT_EQ(JsonAfterOtherLines("note: {not json}\n{\"ok\": true}"), json({{"ok", true}}));
  EXPECT_TRUE(JsonAfterOtherLines("[W] only a warning\n").is_null());
  EXPECT_TRUE(JsonAfterOtherLines("").is_null());
}

}  // namespace
}  // namespace trainctl
