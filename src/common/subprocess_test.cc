#include "common/subprocess.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fork_server.h"

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

// This test binary, started as a fork server (the test below), serves before gtest's main runs
// (glibc passes a constructor main's arguments). Each copy checks what its requester relies on
// and exits with a bit per failed check.
constexpr const char* kEnvRequester = "TRAINCTL_FORK_TEST_REQUESTER";
__attribute__((constructor)) void ServeIfStartedAsAForkServer(int argc, char** argv, char**) {
  if (!std::getenv(kEnvForkServerFd)) return;
  auto request = ServeForks(argc, argv);
  if (!request) ::_exit(100);
  const char* requester = std::getenv(kEnvRequester);
  auto cmdline = testing::ProcStrings(::getpid(), "cmdline");
  while (!cmdline.empty() && cmdline.back().empty()) cmdline.pop_back();
  int failed = 0;
  if (!requester || ::getppid() != std::atoi(requester)) failed |= 1;   // the requester's child
  if (::getpgrp() != ::getpid()) failed |= 2;                          // leads its own group
  if (cmdline.empty() || cmdline.back() != *request) failed |= 4;      // its own last argument
  if (std::getenv(kEnvForkServerFd) || std::getenv("LD_BIND_NOW")) failed |= 8;  // the server's alone
  ::_exit(failed);
}

TEST(ForkServer, CopiesAreTheCallersChildrenWithTheirOwnLastArgument) {
  SpawnOptions o;
  o.argv = {SelfExe(), "--gtest_filter=-*", "---"};  // the placeholder: requests of up to 3 bytes
  o.env = CurrentEnvironment();
  SetEnv(&o.env, kEnvRequester, std::to_string(::getpid()));
  auto server = ForkServer::Start(o);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto copy_exit = [&](const std::string& value) {
    auto pid = server->Fork(value);
    if (!pid.ok()) return -1;
    int status = 0;
    if (::waitpid(*pid, &status, 0) != *pid || !WIFEXITED(status)) return -2;
    return WEXITSTATUS(status);
  };
  EXPECT_EQ(copy_exit("7"), 0);
  EXPECT_EQ(copy_exit("abc"), 0);
  auto too_long = server->Fork("abcd");
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.status().message().find("cannot fork abcd"), std::string::npos) << too_long.status().ToString();
  EXPECT_EQ(copy_exit("42"), 0) << "the server goes on after a request it refused";
  // Closing the channel ends the server.
  const pid_t server_pid = server->pid();
  { ForkServer closing = std::move(*server); }
  int status = 0;
  EXPECT_TRUE(testing::Eventually([&] { return ::waitpid(server_pid, &status, WNOHANG) == server_pid; },
                                  std::chrono::seconds(10)));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST(Subprocess, FindExecutableUsesThePathOfTheGivenEnvironment) {
  EXPECT_TRUE(FindExecutable("sh", {"PATH=/bin:/usr/bin"}).ok());
  EXPECT_FALSE(FindExecutable("sh", {"PATH=/nonexistent"}).ok());
}

}  // namespace
}  // namespace trainctl
