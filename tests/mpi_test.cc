// `trainctl run --target mpi`: the agents start under Open MPI's real mpirun (Debian's
// openmpi-bin), here on one machine, and the job behaves as it does with local agents: ranks,
// restarts, Ctrl-C, no process left behind.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <thread>

#include "tests/test_util.h"

namespace trainctl::testing {
namespace {

std::string Spec(const std::string& name, const std::string& out, const std::string& body) {
  return "name: " + name + "\nnodes: 2\nprocs_per_node: 2\noutput_dir: " + out + "\n" + body;
}

// Processes whose command line mentions this job's run (mpirun and the agents it started).
std::vector<pid_t> RunProcesses(const std::string& job) {
  return LiveProcesses([&](pid_t pid) {
    auto argv = ProcStrings(pid, "cmdline");
    auto run = std::find(argv.begin(), argv.end(), "--run-id");
    return run != argv.end() && run + 1 != argv.end() && run[1].rfind(job + "-", 0) == 0;
  });
}

void RequireMpirun() {
  ASSERT_TRUE(FindExecutable("mpirun", CurrentEnvironment()).ok())
      << "these tests run Open MPI's mpirun: apt-get install openmpi-bin (scripts/dev deps does)";
}

TEST(Mpi, AgentsStartedByMpirunRunTheJobWithTheirRanks) {
  RequireMpirun();
  Scratch s;
  std::string spec =
      s.Write("job.yaml",
              Spec("mpi-ranks", s.path("out"),
                   "command: [sh, -c, 'echo rank=$RANK of $WORLD_SIZE node=$GROUP_RANK mpi=$OMPI_COMM_WORLD_SIZE']\n"));
  auto r = Trainctl({"run", spec, "--target", "mpi"}, s.path(""));
  ASSERT_EQ(r.exit.code, 0) << r.output;
  EXPECT_NE(r.output.find("started 2 node(s) x 2 worker(s) under mpirun"), std::string::npos) << r.output;
  // The agents are mpirun's processes (its environment reaches the workers), one per node.
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE(r.output.find("rank=" + std::to_string(rank) + " of 4 node=" + std::to_string(rank / 2) + " mpi=2"),
              std::string::npos)
        << r.output;
  }
}

// Two nodes on this one machine named as hosts (localhost,localhost): an agent per mention, the
// store on loopback, which both reach.
TEST(Mpi, ThisMachineNamedTwiceRunsTwoNodesWithALoopbackStore) {
  RequireMpirun();
  Scratch s;
  std::string spec = s.Write(
      "job.yaml",
      Spec("mpi-twice", s.path("out"), "command: [sh, -c, 'echo rank=$RANK of $WORLD_SIZE node=$GROUP_RANK']\n"));
  auto r = Trainctl({"run", spec, "--target", "mpi", "--hosts", "localhost,localhost"}, s.path(""));
  ASSERT_EQ(r.exit.code, 0) << r.output;
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE(r.output.find("rank=" + std::to_string(rank) + " of 4 node=" + std::to_string(rank / 2)),
              std::string::npos)
        << r.output;
  }
}

TEST(Mpi, AFailedWorkerIsRestartedAcrossTheMpiAgents) {
  RequireMpirun();
  Scratch s;
  std::string spec = s.Write(
      "job.yaml", Spec("mpi-restart", s.path("out"),
                       "command: [sh, -c, 'if [ $TORCHELASTIC_RESTART_COUNT = 0 ] && [ $RANK = 3 ]; then exit 7; fi; "
                       "echo done $RANK']\n"));
  auto r = Trainctl({"run", spec, "--target", "mpi"}, s.path(""));
  ASSERT_EQ(r.exit.code, 0) << r.output;
  EXPECT_NE(r.output.find("restarting the worker group (restart 1 of 3)"), std::string::npos) << r.output;
  // Rank 3 failed the first time: its one "done" is the restarted group's. (Lines of the first
  // group's other ranks may come before or after the restart's log line.)
  EXPECT_EQ(CountLines(r.output, "] done 3"), 1) << r.output;
  EXPECT_NE(s.Read("out/status.json").find("\"restarts\": 1"), std::string::npos) << s.Read("out/status.json");
}

TEST(Mpi, SigtermStopsMpirunTheAgentsAndTheWorkers) {
  RequireMpirun();
  Scratch s;
  std::string spec = s.Write("job.yaml", Spec("mpi-stop", s.path("out"), "command: [sleep, '600']\n"));
  Background job({"run", spec, "--target", "mpi"}, s.path(""), s.path("run.log"));
  ASSERT_TRUE(Eventually([&] { return ProcessesWithEnv({"TRAINCTL_JOB_NAME=mpi-stop"}).size() == 4; },
                         std::chrono::seconds(30)))
      << job.Output();
  auto workers = ProcessesWithEnv({"TRAINCTL_JOB_NAME=mpi-stop"});
  auto run = RunProcesses("mpi-stop");
  EXPECT_GE(run.size(), 3u);  // mpirun and two agents
  ASSERT_EQ(::kill(job.pid(), SIGTERM), 0);
  ExitInfo exit = job.Wait(std::chrono::seconds(60));
  EXPECT_EQ(exit.code, 130) << job.Output();
  for (pid_t p : workers) EXPECT_TRUE(ProcessGone(p)) << "worker " << p << " left behind";
  for (pid_t p : run) EXPECT_TRUE(ProcessGone(p)) << "mpirun or agent " << p << " left behind";
}

TEST(Mpi, OtherHostsNeedAStoreAddressTheyCanReach) {
  Scratch s;
  std::string spec = s.Write("job.yaml", Spec("mpi-flags", s.path("out"), "command: [true]\n"));
  auto r = Trainctl({"run", spec, "--target", "mpi", "--hosts", "node1,node2"}, s.path(""));
  EXPECT_EQ(r.exit.code, 2);
  EXPECT_NE(r.output.find("agents on other hosts cannot reach a store on 127.0.0.1; give "
                          "--store-host"),
            std::string::npos)
      << r.output;
  r = Trainctl({"run", spec, "--hosts", "node1"}, s.path(""));
  EXPECT_EQ(r.exit.code, 2);
  EXPECT_NE(r.output.find("--hosts and --hostfile go with --target mpi"), std::string::npos) << r.output;
}

// One of this machine's IPv4 addresses, not loopback ("" if it has none): a store other hosts
// could reach listens there.
std::string ThisMachinesAddress() {
  std::string address;
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) == 0) {
    for (ifaddrs* a = all; a && address.empty(); a = a->ifa_next) {
      if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET || (a->ifa_flags & IFF_LOOPBACK)) continue;
      char text[INET_ADDRSTRLEN];
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof text);
      address = text;
    }
    ::freeifaddrs(all);
  }
  return address;
}

// A host's sshd as far as its first line: on 127.0.0.2 (another host to mpirun), listening only
// from `after` on, it sends each connection sshd's banner and closes it, so a wait for the sshd
// ends there and the real ssh that mpirun runs fails at the key exchange.
class BannerOnlySshd {
 public:
  explicit BannerOnlySshd(Duration after) : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(0x7f000002);
    socklen_t len = sizeof a;
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this, listen_at = Clock::now() + after] {
      while (!stop_ && Clock::now() < listen_at) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      ::listen(fd_, 16);
      while (!stop_) {
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, 50) != 1) continue;
        int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c < 0) continue;
        auto ignored = ::write(c, "SSH-2.0-standin\r\n", 17);
        ::close(c);
      }
    });
  }
  ~BannerOnlySshd() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  int port() const { return port_; }

 private:
  int fd_;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// A host whose sshd never answers (here: a name that does not resolve) is waited for up to
// timeouts.rendezvous, at the port mpirun's ssh arguments give, then named with why, and the job
// ends as a rendezvous that timed out does: exit 4, mpirun never started.
TEST(Mpi, AHostWhoseSshdNeverAnswersIsNamedAtTheRendezvousTimeout) {
  RequireMpirun();
  const std::string address = ThisMachinesAddress();
  if (address.empty()) GTEST_SKIP() << "this machine has no IPv4 address but loopback";
  Scratch s;
  std::string spec =
      s.Write("job.yaml", Spec("silent", s.path("out"), "command: [true]\ntimeouts: {rendezvous: 3s}\n"));
  const auto start = Clock::now();
  auto r = Trainctl({"run", spec, "--target", "mpi", "--hosts", "nosuchhost1.invalid", "--store-host", address},
                    s.path(""), std::chrono::seconds(60), {{"OMPI_MCA_plm_rsh_args", "-p 2299"}});
  EXPECT_EQ(r.exit.code, 4) << r.output;
  EXPECT_NE(r.output.find("waiting for nosuchhost1.invalid's sshd (nosuchhost1.invalid port 2299) before mpirun "
                          "starts: its name does not resolve, or there is no route to it"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("nosuchhost1.invalid's sshd (nosuchhost1.invalid port 2299) did not answer within "
                          "timeouts.rendezvous (3s)"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(s.path("out/logs/mpirun.log"))) << "mpirun started:\n" << r.output;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30)) << r.output;
}

// Hosts whose sshd answers but that mpirun cannot reach (ssh fails after the banner): the wait
// ends when the sshd listens, then ssh's own lines, one line for each of Open MPI's help texts
// (whose whole text is in logs/mpirun.log), and exit code 1 with mpirun named, not mpirun's 255.
TEST(Mpi, HostsMpirunCannotReachAreNamedInAFewLines) {
  RequireMpirun();
  const std::string address = ThisMachinesAddress();
  if (address.empty()) GTEST_SKIP() << "this machine has no IPv4 address but loopback";
  BannerOnlySshd sshd(std::chrono::seconds(2));
  const std::string port = std::to_string(sshd.port());
  Scratch s;
  std::string spec = s.Write("job.yaml", Spec("unreachable", s.path("out"), "command: [true]\n"));
  auto r = Trainctl({"run", spec, "--target", "mpi", "--hosts", "127.0.0.2", "--store-host", address}, s.path(""),
                    std::chrono::seconds(60), {{"OMPI_MCA_plm_rsh_args", "-p " + port}});
  EXPECT_EQ(r.exit.code, 1) << r.output;
  EXPECT_NE(r.output.find("waiting for 127.0.0.2's sshd (127.0.0.2 port " + port +
                          ") before mpirun starts: the "
                          "connection was refused"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("127.0.0.2 port " + port), std::string::npos) << "ssh's own line:\n" << r.output;
  EXPECT_NE(r.output.find("job unreachable failed: mpirun ended with exit code"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("it could not run the agents"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("mpirun: ORTE was unable to reliably start one or more daemons. (Open MPI's whole "
                          "message is in " +
                          s.path("out/logs/mpirun.log") + ")"),
            std::string::npos)
      << r.output;
  EXPECT_LE(CountLines(r.output, ""), 10) << r.output;
  EXPECT_EQ(r.output.find("Please check"), std::string::npos) << "Open MPI's advice is in the log, not here:\n"
                                                              << r.output;
  EXPECT_NE(s.Read("out/logs/mpirun.log").find("Please check your PATH"), std::string::npos);
  auto status = nlohmann::json::parse(s.Read("out/status.json"));
  EXPECT_EQ(status["exit_code"], 1);
}

}  // namespace
}  // namespace trainctl::testing
