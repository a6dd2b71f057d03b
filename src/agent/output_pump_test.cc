// The pump with real pipes: what reaches the terminal (or stdout) and the per-rank log.
#include "agent/output_pump.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "common/fs.h"

namespace trainctl {
namespace {

struct Pumped {
  std::string shown, logged;
};

// Writes `text` as rank 0's output through a pump and returns what it showed and logged.
Pumped Pump(const std::string& text, bool terminal) {
  int out[2], in[2];
  EXPECT_EQ(::pipe(out), 0);
  EXPECT_EQ(::pipe(in), 0);
  char log_path[] = "/tmp/pump-log-XXXXXX";
  int log_fd = ::mkstemp(log_path);
  {
    OutputPump pump(out[1], terminal);
    pump.Add(0, "worker-0", in[0], log_fd);
    pump.Start();
    EXPECT_EQ(::write(in[1], text.data(), text.size()), ssize_t(text.size()));
    ::close(in[1]);
    pump.WaitDrained(0, std::chrono::seconds(10));
    pump.Stop();
  }
  ::close(out[1]);
  Pumped r;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(out[0], buf, sizeof buf)) > 0) r.shown.append(buf, n);
  ::close(out[0]);
  r.logged = *ReadFile(log_path);
  ::unlink(log_path);
  return r;
}

std::string Strip(std::string s) {  // drops the colour codes around the prefix
  for (const char* code : {"\033[36m", "\033[0m"}) {
    for (size_t at; (at = s.find(code)) != std::string::npos;) s.erase(at, std::strlen(code));
  }
  return s;
}

TEST(OutputPump, OnATerminalCarriageReturnLinesAreRedrawnAndNotLogged) {
  Pumped r = Pump("start\n10%\r50%\rdone\n", true);
  EXPECT_EQ(Strip(r.shown), "[worker-0] start\n\r\033[K[worker-0] 10%\r\033[K[worker-0] 50%"
                            "\r\033[K[worker-0] done\n");
  EXPECT_EQ(r.logged, "start\ndone\n");
}

TEST(OutputPump, CrLfEndsAnOrdinaryLine) {
  Pumped r = Pump("a\r\nb\r\n", true);
  EXPECT_EQ(Strip(r.shown), "[worker-0] a\n[worker-0] b\n");
  EXPECT_EQ(r.logged, "a\nb\n");
}

TEST(OutputPump, ElsewhereCarriageReturnIsText) {
  Pumped r = Pump("x\ry\n", false);
  EXPECT_EQ(r.shown, "[worker-0] x\ry\n");
  EXPECT_EQ(r.logged, "x\ry\n");
}

}  // namespace
}  // namespace trainctl
