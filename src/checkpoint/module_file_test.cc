#include "checkpoint/module_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>

#include "tests/test_util.h"

namespace trainctl::checkpoint {
namespace {

// Writes a zip archive with Python's zipfile: `entries` name -> size in zeros; `deflate` compresses.
std::string Zip(const testing::Scratch& s, const std::string& name, int64_t zeros, bool deflate) {
  const std::string script =
      "import sys, zipfile\n"
      "with zipfile.ZipFile(sys.argv[1], 'w', zipfile.ZIP_DEFLATED if sys.argv[3] == '1' else zipfile.ZIP_STORED) as "
      "z:\n"
      "    z.writestr('archive/data.pkl', b'\\x80\\x02}q\\x00.')\n"
      "    z.writestr('archive/data/0', bytes(int(sys.argv[2])))\n"
      "    z.writestr('archive/version', b'3\\n')\n";
  auto r = testing::RunProgram(
      {TRAINCTL_TEST_PYTHON, "-c", script, s.path(name), std::to_string(zeros), deflate ? "1" : "0"}, s.path(""));
  EXPECT_EQ(r.exit.code, 0) << r.output;
  return s.path(name);
}

TEST(ModuleFile, AModuleIsReadWholeAndKnownByItsHash) {
  testing::Scratch s;
  const std::string path = Zip(s, "net.pt", 4096, false);
  auto m = ReadModuleFile(path);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->bytes, s.Read("net.pt"));
  auto sum = testing::RunProgram({"sha256sum", path}, s.path(""));
  EXPECT_EQ(m->sha256, sum.output.substr(0, 64));
  // Deflated, but no larger unpacked than twice the file: a module saved so is taken.
  EXPECT_TRUE(ReadModuleFile(Zip(s, "small-deflated.pt", 100000, true)).ok());
}

TEST(ModuleFile, WhatIsNotAModuleOrCannotBeReadIsNamedAtOnce) {
  testing::Scratch s;
  s.Write("notes.pt", "not a module");
  auto notes = ReadModuleFile(s.path("notes.pt"));
  ASSERT_FALSE(notes.ok());
  EXPECT_EQ(notes.status().code(), Code::kInvalidArgument);
  EXPECT_NE(notes.status().message().find(s.path("notes.pt") + ": not a TorchScript module (a zip archive)"),
            std::string::npos)
      << notes.status().message();
  ASSERT_EQ(::mkfifo(s.path("fifo.pt").c_str(), 0600), 0);
  const auto start = std::chrono::steady_clock::now();
  auto fifo = ReadModuleFile(s.path("fifo.pt"));
  ASSERT_FALSE(fifo.ok());
  EXPECT_NE(fifo.status().message().find("is a FIFO, not a file"), std::string::npos) << fifo.status().message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  EXPECT_EQ(ReadModuleFile(s.path("missing.pt")).status().code(), Code::kNotFound);
  // 200 MB of zeros deflated into a few hundred kilobytes: refused before anything inflates it.
  const std::string bomb = Zip(s, "bomb.pt", 200 << 20, true);
  auto refused = ReadModuleFile(bomb);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("(a zip bomb; PyTorch stores its records uncompressed)"), std::string::npos)
      << refused.status().message();
  // Cut short: its central directory is gone.
  std::string whole = s.Read(Zip(s, "net.pt", 4096, false).substr(s.path("").size()));
  s.Write("cut.pt", whole.substr(0, whole.size() / 2));
  auto cut = ReadModuleFile(s.path("cut.pt"));
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.status().message().find("without its central directory"), std::string::npos) << cut.status().message();
}

// A module is code: one another user could have written (the file, or a directory it is in, open
// to them, or the file theirs) is refused, naming why; a sticky directory (/tmp) is no such opening.
// A zip64 locator whose directory offset lies past the end of a file too short to hold one
// (found by fuzz/checkpoint_fuzz.cc, its seed zip64-locator-past-the-end.pt): refused, read
// nowhere outside the bytes.
TEST(ModuleFile, AZip64DirectoryPastTheEndIsRefusedNotRead) {
  std::string bytes = "PK\x06\x07" + std::string(4, '\0');                 // the locator: disk, then the offset
  for (int i = 0; i < 8; ++i) bytes += static_cast<char>(i == 5 ? 1 : 0);  // 2^40
  bytes += std::string("\x01\0\0\0", 4);
  bytes += "PK\x05\x06" + std::string(6, '\0') + std::string(10, '\xff') + std::string(2, '\0');
  ASSERT_EQ(bytes.size(), 42u);
  const Status st = CheckModuleArchive(bytes, "model.pt");
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("model.pt: a corrupt zip64 directory"), std::string::npos) << st.message();
}

TEST(ModuleFile, OneAnotherUserCouldHaveWrittenIsRefused) {
  testing::Scratch s;
  ASSERT_TRUE(MakeDirs(s.path("open")).ok() && MakeDirs(s.path("sticky")).ok() && MakeDirs(s.path("mine")).ok());
  const std::string mine = Zip(s, "mine/net.pt", 64, false);
  ASSERT_TRUE(ReadModuleFile(mine).ok());
  ::chmod(mine.c_str(), 0666);
  auto writable = ReadModuleFile(mine);
  ASSERT_FALSE(writable.ok());
  EXPECT_EQ(writable.status().code(), Code::kPermissionDenied);
  EXPECT_NE(writable.status().message().find("every user may write it (mode 0666)); refusing to load it"),
            std::string::npos)
      << writable.status().message();
  const std::string in_open = Zip(s, "open/net.pt", 64, false);
  ::chmod(s.path("open").c_str(), 0777);
  auto open = ReadModuleFile(in_open);
  ASSERT_FALSE(open.ok());
  EXPECT_NE(open.status().message().find("its directory " + s.path("open") +
                                         " is open to others: every user may write it (mode 0777)"),
            std::string::npos)
      << open.status().message();
  const std::string in_sticky = Zip(s, "sticky/net.pt", 64, false);
  ::chmod(s.path("sticky").c_str(), 01777);
  EXPECT_TRUE(ReadModuleFile(in_sticky).ok()) << ReadModuleFile(in_sticky).status().message();
  if (::geteuid() == 0) {
    ASSERT_EQ(::chown(in_sticky.c_str(), 65534, 65534), 0);
    auto theirs = ReadModuleFile(in_sticky);
    ASSERT_FALSE(theirs.ok());
    EXPECT_NE(theirs.status().message().find("it belongs to uid 65534, not to this user (uid 0) or root"),
              std::string::npos)
        << theirs.status().message();
  }
}

}  // namespace
}  // namespace trainctl::checkpoint
