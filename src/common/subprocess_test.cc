#include "common/subprocess.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "common/fork_server.h"
#include "tests/test_util.h"

extern char** environ;

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

// An agent asks whether its launcher is gone or going (ProcessEnding) before it ends what the
// launcher's job left: a live process is not, an exited one (a zombie, then reaped) is.
TEST(Subprocess, ProcessEndingTellsALiveProcessFromAnEndedOne) {
  EXPECT_FALSE(ProcessEnding(::getpid()));
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(go[1]);
    char c;
    (void)!::read(go[0], &c, 1);
    ::_exit(0);
  }
  ::close(go[0]);
  EXPECT_FALSE(ProcessEnding(child)) << "waiting on a pipe";
  ::close(go[1]);  // it exits, and stays a zombie until reaped
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(child), &info, WEXITED | WNOWAIT), 0);
  EXPECT_TRUE(ProcessEnding(child)) << "a zombie";
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  EXPECT_TRUE(ProcessEnding(child)) << "reaped";
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
  EXPECT_TRUE(testing::Eventually([grandchild] { return testing::ProcessGone(grandchild); }, std::chrono::seconds(5)))
      << "grandchild " << grandchild << " survived the timeout";
}

// This test binary, started as a fork server (the test below), serves before gtest's main runs
// (glibc passes a constructor main's arguments). Each copy checks what its requester relies on
// and exits with a bit per failed check.
constexpr const char* kEnvRequester = "TRAINCTL_FORK_TEST_REQUESTER";
__attribute__((constructor)) void ServeIfStartedAsAForkServer(int argc, char** argv, char**) {
  if (!std::getenv(kEnvForkServerFd)) return;
  if (std::getenv("FORK_TEST_THREAD")) {  // a server that has started a thread
    std::thread([] { ::pause(); }).detach();
  }
  auto request = ServeForks(argc, argv);
  if (!request) ::_exit(100);
  if (const char* cwd = std::getenv("FORK_TEST_CWD")) {  // a copy given its own environment
    int failed = 0;
    if (std::getenv(kEnvRequester)) failed |= 1;  // the server's environment is gone
    std::vector<std::string> own;
    for (char** e = environ; *e; ++e) own.emplace_back(*e);
    if (testing::ProcStrings(::getpid(), "environ") != own) failed |= 2;  // what /proc shows too
    char here[4096];
    if (!::getcwd(here, sizeof here) || std::string(here) != cwd) failed |= 4;
    cpu_set_t set;
    if (::sched_getaffinity(0, sizeof set, &set) != 0 || CPU_COUNT(&set) != 1 || !CPU_ISSET(0, &set)) failed |= 8;
    std::printf("copy %s in %s\n", request->c_str(), here);
    std::fflush(stdout);
    ::_exit(failed);
  }
  const char* requester = std::getenv(kEnvRequester);
  auto cmdline = testing::ProcStrings(::getpid(), "cmdline");
  while (!cmdline.empty() && cmdline.back().empty()) cmdline.pop_back();
  int failed = 0;
  if (!requester || ::getppid() != std::atoi(requester)) failed |= 1;            // the requester's child
  if (::getpgrp() != ::getpid()) failed |= 2;                                    // leads its own group
  if (cmdline.empty() || cmdline.back() != *request) failed |= 4;                // its own last argument
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

TEST(ForkServer, ACopyTakesTheEnvironmentDirectoryCpusAndOutputItsRequestGives) {
  SpawnOptions o;
  o.argv = {SelfExe(), "--gtest_filter=-*", "--------"};
  o.env = CurrentEnvironment();
  SetEnv(&o.env, kEnvRequester, std::to_string(::getpid()));
  auto server = ForkServer::Start(o);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  testing::Scratch s;
  const std::string dir = s.path("copy");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  ForkRequest r;
  r.argument = "worker-3";
  r.env = {"PATH=/usr/bin:/bin", "FORK_TEST_CWD=" + dir, "RANK=3", "EMPTY="};
  r.cwd = dir;
  r.cpus = {0};
  r.output_fd = fds[1];
  auto pid = server->Fork(r);
  ::close(fds[1]);
  ASSERT_TRUE(pid.ok()) << pid.status().ToString();
  std::string output;
  char buf[256];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) output.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(*pid, &status, 0), *pid) << "the requester's own child";
  EXPECT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "bits of the checks that failed in the copy";
  EXPECT_EQ(output, "copy worker-3 in " + dir + "\n");

  // A directory it cannot enter: the copy is reaped and the error says why; the server goes on.
  r.cwd = s.path("missing");
  r.output_fd = -1;
  auto missing = server->Fork(r);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message(),
            "cannot set up the copy worker-3 in " + s.path("missing") + ": No such file or directory")
      << missing.status().ToString();
  EXPECT_FALSE(server->broken());
  EXPECT_EQ(::waitpid(-1, &status, WNOHANG), 0) << "no child left to reap but the server";
  // An argument longer than the placeholder is refused before any copy is made.
  r.cwd = dir;
  r.argument = "worker-1000";
  auto too_long = server->Fork(r);
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.status().message().find("cannot fork worker-1000"), std::string::npos);
  const pid_t server_pid = server->pid();
  { ForkServer closing = std::move(*server); }
  EXPECT_EQ(::waitpid(server_pid, &status, 0), server_pid);
}

TEST(ForkServer, AServerWithMoreThanOneThreadServesNoOne) {
  SpawnOptions o;
  o.argv = {SelfExe(), "--gtest_filter=-*", "---"};
  o.env = CurrentEnvironment();
  SetEnv(&o.env, "FORK_TEST_THREAD", "1");
  auto server = ForkServer::Start(o);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto pid = server->Fork("1");
  ASSERT_FALSE(pid.ok()) << "a copy of a process with two threads";
  EXPECT_TRUE(server->broken());
  int status = 0;
  ASSERT_EQ(::waitpid(server->pid(), &status, 0), server->pid());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
}

TEST(Subprocess, FindExecutableUsesThePathOfTheGivenEnvironment) {
  EXPECT_TRUE(FindExecutable("sh", {"PATH=/bin:/usr/bin"}).ok());
  EXPECT_FALSE(FindExecutable("sh", {"PATH=/nonexistent"}).ok());
}

}  // namespace
}  // namespace trainctl
