#include "common/subprocess.h"

#include <gtest/gtest.h>
#include <signal.h>

#include "tests/test_util.h"

namespace trainctl {
namespace {

SpawnOptions Sh(const std::string& script) {
  SpawnOptions o;
  o.argv = {"sh", "-c", script};
  o.env = CurrentEnvironment();
  return o;
}

TEST(Subprocess, CapturesOutputAndExitCode) {
  auto r = RunCommand(Sh("echo out; echo err >&2; exit 3"), std::chrono::seconds(10));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->output, "out\nerr\n");
  EXPECT_EQ(r->exit.code, 3);
  EXPECT_EQ(r->exit.Describe(), "exit code 3");
}

TEST(Subprocess, DescribesDeathBySignal) {
  auto r = RunCommand(Sh("kill -SEGV $$"), std::chrono::seconds(10));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->exit.signaled);
  EXPECT_EQ(r->exit.Describe(), "signal 11 (SIGSEGV)");
}

TEST(Subprocess, MissingProgramIsAnErrorNotACrash) {
  SpawnOptions o;
  o.argv = {"no-such-program-trainctl"};
  o.env = CurrentEnvironment();
  auto pid = Spawn(o);
  ASSERT_FALSE(pid.ok());
  EXPECT_NE(pid.status().message().find("not found in PATH"), std::string::npos);
  o.argv = {"/"};
  EXPECT_FALSE(Spawn(o).ok());
}

TEST(Subprocess, BadWorkingDirectoryIsReportedByName) {
  SpawnOptions o = Sh("true");
  o.cwd = "/no/such/dir";
  auto pid = Spawn(o);
  ASSERT_FALSE(pid.ok());
  EXPECT_NE(pid.status().message().find("/no/such/dir"), std::string::npos);
}

TEST(Subprocess, TimeoutKillsTheWholeProcessGroup) {
  auto r = RunCommand(Sh("sleep 30 & echo $!; wait"), std::chrono::seconds(2));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->timed_out);
  ASSERT_FALSE(r->output.empty()) << "the shell never reported its child";
  pid_t grandchild = std::stoi(r->output);
  // The grandchild is gone, or a zombie waiting for init: never still running. SIGKILL is
  // delivered asynchronously, so allow it a moment to land.
  EXPECT_TRUE(testing::Eventually([grandchild] { return testing::ProcessGone(grandchild); },
                                  std::chrono::seconds(5)))
      << "grandchild " << grandchild << " survived the timeout";
}

TEST(Subprocess, FindExecutableUsesThePathOfTheGivenEnvironment) {
  EXPECT_TRUE(FindExecutable("sh", {"PATH=/bin:/usr/bin"}).ok());
  EXPECT_FALSE(FindExecutable("sh", {"PATH=/nonexistent"}).ok());
}

}  // namespace
}  // namespace trainctl
