#include "common/fs.h"

#include <gtest/gtest.h>

#include "tests/test_util.h"
#include <sys/stat.h>

#include <filesystem>

namespace trainctl {
namespace {

namespace fs = std::filesystem;

size_t Entries(const testing::Scratch& s) {
  return std::distance(fs::directory_iterator(s.path("")), fs::directory_iterator());
}

TEST(Fs, AtomicWriteReplacesContentAndLeavesNoTemporaryFile) {
  testing::Scratch s;
  std::string path = s.path("status.json");
  ASSERT_TRUE(AtomicWriteFile(path, "first").ok());
  ASSERT_TRUE(AtomicWriteFile(path, "second").ok());
  EXPECT_EQ(*ReadFile(path), "second");
  EXPECT_EQ(Entries(s), 1u);
}

TEST(Fs, FailedAtomicWriteKeepsTheOldFile) {
  testing::Scratch s;
  std::string path = s.path("spec.json");
  ASSERT_TRUE(AtomicWriteFile(path, "good").ok());
  // A directory where the rename must land: the rename fails after the data was written.
  fs::create_directories(s.path("blocker/x"));
  Status st = AtomicWriteFile(s.path("blocker"), "new");
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(*ReadFile(path), "good");
  EXPECT_EQ(Entries(s), 2u);  // spec.json and blocker: no temporary left behind
}

// In place, for a full disk: shorter text leaves nothing of the old behind; no file, no link.
TEST(Fs, OverwriteFileWritesInPlace) {
  testing::Scratch s;
  s.Write("status.json", "{\"state\": \"running\", \"padding\": \"................\"}\n");
  ASSERT_TRUE(OverwriteFile(s.path("status.json"), "{\"state\": \"succeeded\"}\n").ok());
  EXPECT_EQ(s.Read("status.json"), "{\"state\": \"succeeded\"}\n");
  EXPECT_FALSE(OverwriteFile(s.path("none.json"), "x").ok());
  fs::create_symlink(s.path("status.json"), s.path("link.json"));
  EXPECT_FALSE(OverwriteFile(s.path("link.json"), "x").ok());
}

TEST(Fs, ReadFileBoundsAndErrors) {
  testing::Scratch s;
  std::string path = s.path("big");
  ASSERT_TRUE(AtomicWriteFile(path, std::string(1000, 'x')).ok());
  EXPECT_EQ(ReadFile(path, 100).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ReadFile(s.path("missing")).status().code(), Code::kNotFound);
  EXPECT_FALSE(ReadFile(s.path("")).ok());
}

}  // namespace
}  // namespace trainctl
