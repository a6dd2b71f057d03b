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

// A worker's escape sequences (clear the screen, set the title, ring the bell) are shown as text
// on a terminal (its colours pass) and in the failure report's tail; elsewhere (a pipe, a file)
// and in the log file the bytes stay as written (finding 9 of issue 49).
TEST(OutputPump, EscapeSequencesAreShownAsTextNotObeyed) {
  const std::string hostile = "\033[2J\033]0;owned\007\033[31mred\033[0m\bx\n";
  Pumped term = Pump(hostile, true);
  EXPECT_EQ(Strip(term.shown), "[worker-0] ^[[2J^[]0;owned^G\033[31mred^H" "x\n") << term.shown;
  Pumped plain = Pump(hostile, false);
  EXPECT_EQ(plain.shown, "[worker-0] " + hostile);
  EXPECT_EQ(plain.logged, hostile);
  int out[2], in[2];
  ASSERT_EQ(::pipe(out), 0);
  ASSERT_EQ(::pipe(in), 0);
  OutputPump pump(out[1], true);
  pump.Add(0, "worker-0", in[0], -1);
  pump.Start();
  ASSERT_EQ(::write(in[1], hostile.data(), hostile.size()), ssize_t(hostile.size()));
  ::close(in[1]);
  pump.WaitDrained(0, std::chrono::seconds(10));
  EXPECT_EQ(pump.Tail(0), (std::vector<std::string>{"^[[2J^[]0;owned^G^[[31mred^[[0m^Hx"}));
  pump.Stop();
  ::close(out[0]);
  ::close(out[1]);
}

// A log file that cannot be written (a full disk: /dev/full) is said once, where it is seen, and
// the output still flows (finding 9 of issue 49: the log was cut silently).
TEST(OutputPump, ALogThatCannotBeWrittenIsSaidOnce) {
  int out[2], in[2];
  ASSERT_EQ(::pipe(out), 0);
  ASSERT_EQ(::pipe(in), 0);
  const int full = ::open("/dev/full", O_WRONLY | O_CLOEXEC);
  ASSERT_GE(full, 0);
  std::string shown;
  {
    OutputPump pump(out[1], false);
    pump.Add(0, "worker-0", in[0], full);
    pump.Start();
    const std::string text = "one\ntwo\nthree\n";
    ASSERT_EQ(::write(in[1], text.data(), text.size()), ssize_t(text.size()));
    ::close(in[1]);
    pump.WaitDrained(0, std::chrono::seconds(10));
    pump.Stop();
  }
  ::close(out[1]);
  char buf[4096];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) shown.append(buf, n);
  ::close(out[0]);
  EXPECT_EQ(shown, "[worker-0] trainctl: its log file is incomplete from here on: No space left on device\n"
                   "[worker-0] one\n[worker-0] two\n[worker-0] three\n");
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
