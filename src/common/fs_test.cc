#include "common/fs.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "tests/test_util.h"

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

// What a run directory holds may be planted: a FIFO, a device, a huge sparse file. Every reader
// returns at once, refuses what is not a regular file (naming it), and reads a bounded amount.
TEST(Fs, ReadersNeverBlockReadOnlyRegularFilesAndReadABoundedAmount) {
  testing::Scratch s;
  const std::string fifo = s.path("status.json");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto start = std::chrono::steady_clock::now();
  auto r = ReadFile(fifo);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(r.status().message(), fifo + " is a FIFO, not a file");
  EXPECT_EQ(ReadFrom(fifo, 0), "");
  EXPECT_EQ(ReadTail(fifo, 100), "");
  auto zero = ReadFile("/dev/zero");
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().message(), "/dev/zero is a character device, not a file");
  fs::create_symlink("/dev/zero", s.path("metrics.jsonl"));
  EXPECT_EQ(ReadTail(s.path("metrics.jsonl"), 1 << 20), "");
  EXPECT_EQ(ReadFrom(s.path("metrics.jsonl"), 0), "");
  EXPECT_EQ(ReadFile(s.path("")).status().message(), s.path("") + " is a directory, not a file");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  // 8 GB of a sparse log: the tail is its last bytes; from an offset, at most what was asked.
  const std::string log = s.path("worker-0.log");
  { std::ofstream(log) << "first line\n"; }
  fs::resize_file(log, uint64_t{8} << 30);
  { std::ofstream(log, std::ios::app) << "last line\n"; }
  EXPECT_EQ(ReadTail(log, 10), "last line\n");
  EXPECT_EQ(ReadFrom(log, 0, 11), "first line\n");
  EXPECT_EQ(ReadFrom(log, 0, 1 << 20).size(), size_t{1} << 20);
  EXPECT_EQ(ReadFrom(log, (int64_t{8} << 30) + 10), "") << "past the end";
  EXPECT_EQ(ReadFile(log, 1 << 20).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace trainctl
