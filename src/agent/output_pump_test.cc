// The pump with real pipes: what reaches the terminal (or stdout) and the per-rank log.
#include "agent/output_pump.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

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
  EXPECT_EQ(Strip(r.shown),
            "[worker-0] start\n\r\033[K[worker-0] 10%\r\033[K[worker-0] 50%"
            "\r\033[K[worker-0] done\n");
  EXPECT_EQ(r.logged, "start\ndone\n");
}

// A worker's escape sequences (clear the screen, set the title, ring the bell) are shown as text
// on a terminal (its colours pass) and in the failure report's tail; elsewhere (a pipe, a file)
// and in the log file the bytes stay as written (finding 9 of issue 49).
TEST(OutputPump, EscapeSequencesAreShownAsTextNotObeyed) {
  const std::string hostile = "\033[2J\033]0;owned\007\033[31mred\033[0m\bx\n";
  Pumped term = Pump(hostile, true);
  EXPECT_EQ(Strip(term.shown),
            "[worker-0] ^[[2J^[]0;owned^G\033[31mred^H"
            "x\n")
      << term.shown;
  Pumped plain = Pump(hostile, false);
  EXPECT_EQ(plain.shown, "[worker-0] " + hostile);
  EXPECT_EQ(plain.logged, hostile);
  int out[2], in[2];
  ASSERT_EQ(::pipe(out), 0);
  ASSERT_EQ(::pipe(in), 0);
  OutputPump pump(out[1], true);
  pump.Add(0, "worker-0", in[0], -1);
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
  EXPECT_EQ(shown,
            "[worker-0] trainctl: its log file is incomplete from here on: No space left on device\n"
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

// The agent's one thread copies the output while it waits: a task that writes far more than its
// pipe holds is never blocked for long, and all of it reaches the log, in order.
TEST(OutputPump, OutputFlowsWhileTheAgentWaits) {
  int in[2];
  ASSERT_EQ(::pipe(in), 0);
  const int out = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  char log_path[] = "/tmp/pump-log-XXXXXX";
  const int log_fd = ::mkstemp(log_path);
  std::string expected;
  for (int i = 0; i < 40000; ++i) expected += "line " + std::to_string(i) + "\n";  // 400 kB
  std::thread task([&] {
    EXPECT_EQ(::write(in[1], expected.data(), expected.size()), ssize_t(expected.size()));
    ::close(in[1]);
  });
  {
    OutputPump pump(out, false);
    pump.Add(0, "worker-0", in[0], log_fd);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (pump.Tail(0).empty() || pump.Tail(0).back() != "line 39999") {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the output stopped flowing";
      pump.WaitSignal(std::chrono::milliseconds(50));
    }
    task.join();
    pump.Stop();
  }
  ::close(out);
  EXPECT_EQ(*ReadFile(log_path), expected);
  ::unlink(log_path);
}

// A stdout that takes nothing (a paused pager, a stopped terminal) stalls the output, never the
// agent's waits (its heartbeats go on); what waited is written once stdout takes it again.
TEST(OutputPump, AStdoutThatTakesNothingDoesNotStallTheWait) {
  int out[2], in[2];
  ASSERT_EQ(::pipe2(out, O_NONBLOCK), 0);
  ASSERT_EQ(::pipe(in), 0);
  std::string filler(4096, 'x');
  while (::write(out[1], filler.data(), filler.size()) > 0) {
  }                                           // full
  ASSERT_EQ(::fcntl(out[1], F_SETFL, 0), 0);  // blocking again, as a terminal is
  OutputPump pump(out[1], false);
  pump.Add(0, "worker-0", in[0], -1);
  ASSERT_EQ(::write(in[1], "hello\n", 6), 6);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 5; ++i) pump.WaitSignal(std::chrono::milliseconds(20));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(pump.Tail(0), std::vector<std::string>{"hello"});  // read, and waiting for stdout
  std::string drained;
  char buf[65536];
  for (ssize_t n; drained.size() < 65536 && (n = ::read(out[0], buf, sizeof buf)) > 0;) drained.append(buf, n);
  ::close(in[1]);
  pump.WaitDrained(0, std::chrono::seconds(10));
  pump.Stop();
  ::close(out[1]);
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) drained.append(buf, n);
  ::close(out[0]);
  EXPECT_NE(drained.find("[worker-0] hello\n"), std::string::npos);
}

}  // namespace
}  // namespace trainctl
