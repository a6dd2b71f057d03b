#include "common/sha256.h"

#include <gtest/gtest.h>

#include <random>
#include <sstream>

#include "common/subprocess.h"
#include "tests/test_util.h"

namespace trainctl {
namespace {

TEST(Sha256, KnownDigests) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  Sha256 million;
  const std::string a(1000, 'a');
  for (int i = 0; i < 1000; ++i) million.Update(a);
  EXPECT_EQ(million.HexDigest(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// Every length around the block and padding boundaries, fed in pieces of every size, agrees with
// coreutils' sha256sum.
TEST(Sha256, AgreesWithSha256sumForEveryLengthAndSplit) {
  testing::Scratch s;
  std::mt19937 rng(7);
  std::string bytes;
  for (int i = 0; i < 200; ++i) bytes += static_cast<char>(rng());
  std::string script;
  for (size_t n : {0, 1, 55, 56, 57, 63, 64, 65, 119, 120, 127, 128, 129, 200}) {
    s.Write("b" + std::to_string(n), bytes.substr(0, n));
    script += "sha256sum b" + std::to_string(n) + ";";
  }
  auto r = testing::RunProgram({"sh", "-c", script}, s.path(""));
  ASSERT_EQ(r.exit.code, 0) << r.output;
  std::istringstream lines(r.output);
  for (size_t n : {0, 1, 55, 56, 57, 63, 64, 65, 119, 120, 127, 128, 129, 200}) {
    std::string digest, name;
    lines >> digest >> name;
    const std::string text = bytes.substr(0, n);
    EXPECT_EQ(Sha256Hex(text), digest) << n;
    for (size_t piece : {1, 3, 63, 64, 65}) {
      Sha256 h;
      for (size_t at = 0; at < text.size(); at += piece) h.Update(std::string_view(text).substr(at, piece));
      EXPECT_EQ(h.HexDigest(), digest) << n << " in pieces of " << piece;
    }
  }
}

}  // namespace
}  // namespace trainctl
