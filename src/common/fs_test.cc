#include "common/fs.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>

namespace trainctl {
namespace {

namespace fs = std::filesystem;

class FsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("trainctl-fs-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  size_t Entries() { return std::distance(fs::directory_iterator(dir_), fs::directory_iterator()); }
  fs::path dir_;
};

TEST_F(FsTest, AtomicWriteReplacesContentAndLeavesNoTemporaryFile) {
  std::string path = (dir_ / "status.json").string();
  ASSERT_TRUE(AtomicWriteFile(path, "first").ok());
  ASSERT_TRUE(AtomicWriteFile(path, "second").ok());
  EXPECT_EQ(*ReadFile(path), "second");
  EXPECT_EQ(Entries(), 1u);
}

TEST_F(FsTest, FailedAtomicWriteKeepsTheOldFile) {
  std::string path = (dir_ / "spec.json").string();
  ASSERT_TRUE(AtomicWriteFile(path, "good").ok());
  // A directory where the rename must land: the rename fails after the data was written.
  fs::create_directories(dir_ / "blocker" / "x");
  Status st = AtomicWriteFile((dir_ / "blocker").string(), "new");
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(*ReadFile(path), "good");
  EXPECT_EQ(Entries(), 2u);  // spec.json and blocker: no temporary left behind
}

TEST_F(FsTest, ReadFileBoundsAndErrors) {
  std::string path = (dir_ / "big").string();
  ASSERT_TRUE(AtomicWriteFile(path, std::string(1000, 'x')).ok());
  EXPECT_EQ(ReadFile(path, 100).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ReadFile((dir_ / "missing").string()).status().code(), Code::kNotFound);
  EXPECT_FALSE(ReadFile(dir_.string()).ok());
}

}  // namespace
}  // namespace trainctl
