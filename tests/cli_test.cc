// End-to-end: the real trainctl binary running real worker processes (POSIX sh programs).
#include <sys/syscall.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/cpus.h"
#include "common/exit_codes.h"
#include "job/keys.h"
#include "jobspec/job_spec.h"
#include "store/etcd/etcd_store.h"
#include "store/tcp/tcp_store.h"
#include "test_util.h"
#include "tests/etcd_server.h"

namespace trainctl::testing {
namespace {

using std::chrono::seconds;

TEST(Cli, HelpListsVerbsAndExitCodes) {
  Scratch s;
  auto r = Trainctl({"--help"}, s.path(""));
  EXPECT_EQ(r.exit.code, 0);
  for (const char* want : {"run", "validate", "Exit codes:", "130"}) {
    EXPECT_NE(r.output.find(want), std::string::npos) << want << "\n" << r.output;
  }
  for (const char* verb : {"run", "validate", "agent"}) {
    auto v = Trainctl({verb, "--help"}, s.path(""));
    EXPECT_EQ(v.exit.code, 0) << verb;
    EXPECT_NE(v.output.find("Usage"), std::string::npos) << v.output;
  }
  auto bad = Trainctl({"frobnicate"}, s.path(""));
  EXPECT_EQ(bad.exit.code, kExitInvalidSpec);
  EXPECT_EQ(Trainctl({"--version"}, s.path("")).exit.code, 0);
}

// A typo in the verb gets a did-you-mean and the list of verbs; global flags go before or after it.
TEST(Cli, AnUnknownVerbIsNamedAndGlobalFlagsGoAnywhere) {
  Scratch s;
  auto typo = Trainctl({"trian"}, s.path(""));
  EXPECT_EQ(typo.exit.code, kExitInvalidSpec);
  EXPECT_NE(typo.output.find("trainctl: unknown verb \"trian\"; did you mean 'train'?"), std::string::npos)
      << typo.output;
  EXPECT_NE(typo.output.find("verbs: run, validate,"), std::string::npos) << typo.output;
  auto far = Trainctl({"--log-level", "warn", "frobnicate", "x.yaml"}, s.path(""));
  EXPECT_EQ(far.exit.code, kExitInvalidSpec);
  EXPECT_NE(far.output.find("unknown verb \"frobnicate\"\n"), std::string::npos) << far.output;
  s.Write("job.yaml", "name: g\ncommand: [sh, -c, 'exit 0']\n");
  for (const auto& argv : std::vector<std::vector<std::string>>{{"run", "job.yaml", "--log-level", "debug"},
                                                                {"--log-level", "debug", "run", "job.yaml"}}) {
    auto r = Trainctl(argv, s.path(""));
    EXPECT_EQ(r.exit.code, 0) << r.output;
    EXPECT_NE(r.output.find(" D [job=g"), std::string::npos) << "no debug lines:\n" << r.output;
  }
  auto bad = Trainctl({"validate", "job.yaml", "--log-level", "loud"}, s.path(""));
  EXPECT_EQ(bad.exit.code, kExitInvalidSpec);
  EXPECT_NE(bad.output.find("--log-level"), std::string::npos) << bad.output;
}

TEST(Cli, ValidateReportsFileLineAndField) {
  Scratch s;
  std::string job = s.Write("job.yaml", "name: demo\ncommand: [x]\nprocs_per_node: 2\nnodes: two\n");
  auto r = Trainctl({"validate", "job.yaml"}, s.path(""));
  EXPECT_EQ(r.exit.code, kExitInvalidSpec);
  EXPECT_NE(r.output.find("job.yaml:4: nodes: expected a positive integer, got \"two\""), std::string::npos)
      << r.output;

  s.Write("ok.yaml", "name: demo\ncommand: [python3, t.py]\n");
  s.Write("t.py", "print('the script validate looks for next to the spec')\n");
  s.Write("prod.yaml", "nodes: 3\n");
  auto ok = Trainctl({"validate", "ok.yaml", "-f", "prod.yaml", "--set", "procs_per_node=2"}, s.path(""));
  EXPECT_EQ(ok.exit.code, 0) << ok.output;
  EXPECT_NE(ok.output.find("3 node(s) x 2 worker(s)"), std::string::npos) << ok.output;
  auto printed = Trainctl({"validate", "ok.yaml", "--print"}, s.path(""));
  EXPECT_EQ(nlohmann::json::parse(printed.output)["name"], "demo");
  // What --print shows is a spec: validated again, it is the same job.
  s.Write("printed.json", printed.output);
  auto again = Trainctl({"validate", "printed.json", "--print"}, s.path(""));
  EXPECT_EQ(again.exit.code, 0) << again.output;
  EXPECT_EQ(again.output, printed.output);
}

TEST(Cli, WorkersGetTheTorchrunEnvironment) {
  Scratch s;
  WriteSpec(s, R"(name: envjob
nodes: 2
procs_per_node: 2
command: [sh, -c, 'env > {out}/env-$RANK.txt']
env: {MY_SETTING: hello}
output_dir: {out}/out
)");
  auto r = Trainctl({"run", "job.yaml"}, s.path(""));
  ASSERT_EQ(r.exit.code, 0) << r.output;
  std::set<std::string> ports;
  for (int rank = 0; rank < 4; ++rank) {
    std::string env = s.Read("env-" + std::to_string(rank) + ".txt");
    ASSERT_FALSE(env.empty()) << "rank " << rank << " did not run";
    auto has = [&env](const std::string& kv) { return env.find("\n" + kv + "\n") != std::string::npos; };
    EXPECT_TRUE(has("RANK=" + std::to_string(rank))) << env;
    EXPECT_TRUE(has("LOCAL_RANK=" + std::to_string(rank % 2)));
    EXPECT_TRUE(has("WORLD_SIZE=4"));
    EXPECT_TRUE(has("LOCAL_WORLD_SIZE=2"));
    EXPECT_TRUE(has("GROUP_RANK=" + std::to_string(rank / 2)));
    EXPECT_TRUE(has("ROLE_RANK=" + std::to_string(rank)));
    EXPECT_TRUE(has("ROLE_WORLD_SIZE=4"));
    EXPECT_TRUE(has("MASTER_ADDR=127.0.0.1"));
    EXPECT_TRUE(has("TORCHELASTIC_RESTART_COUNT=0"));
    EXPECT_TRUE(has("TORCHELASTIC_MAX_RESTARTS=3"));
    EXPECT_TRUE(has("TRAINCTL_JOB_NAME=envjob"));
    EXPECT_TRUE(has("TRAINCTL_OUTPUT_DIR=" + s.path("out")));
    EXPECT_TRUE(has("TRAINCTL_CHECKPOINT_DIR=" + s.path("out/checkpoints")));
    EXPECT_TRUE(has("MY_SETTING=hello"));
    EXPECT_TRUE(has("OMP_NUM_THREADS=1"));
    EXPECT_NE(env.find("TORCHELASTIC_RUN_ID=envjob-"), std::string::npos);
    EXPECT_NE(env.find("TRAINCTL_STORE_TOKEN="), std::string::npos);
    EXPECT_EQ(env.find("TRAINCTL_AGENT_TOKEN"), std::string::npos);  // not leaked under this name
    size_t p = env.find("\nMASTER_PORT=");
    ASSERT_NE(p, std::string::npos);
    ports.insert(env.substr(p + 13, env.find('\n', p + 1) - p - 13));
  }
  EXPECT_EQ(ports.size(), 1u) << "every rank must see the same MASTER_PORT";
  EXPECT_EQ(ReadStatus(s)["state"], "succeeded");
}

// The CPUs of a /proc/PID/status Cpus_allowed_list line ("Cpus_allowed_list:\t0-3,6").
std::vector<int> AllowedCpus(const std::string& status_line) {
  std::vector<int> cpus;
  std::stringstream list(status_line.substr(status_line.find(':') + 1));
  std::string range;
  while (std::getline(list, range, ',')) {
    const size_t dash = range.find('-');
    const int first = std::stoi(range), last = dash == std::string::npos ? first : std::stoi(range.substr(dash + 1));
    for (int c = first; c <= last; ++c) cpus.push_back(c);
  }
  return cpus;
}

// cpu_bind: cores gives each of a node's workers its own share of the CPUs (this process's, which
// the launcher and its agent inherit); without it every worker may run on all of them.
TEST(Cli, CpuBindCoresGivesEachWorkerItsOwnCpus) {
  Scratch s;
  for (const std::string bind : {"none", "cores"}) {
    WriteSpec(s, "name: bind\nprocs_per_node: 2\ncpu_bind: " + bind +
                     "\ncommand: [sh, -c, 'grep Cpus_allowed_list /proc/self/status > {out}/" + bind +
                     "-$LOCAL_RANK.txt']\noutput_dir: {out}/out-" + bind + "\n");
    auto r = Trainctl({"run", "job.yaml"}, s.path(""));
    ASSERT_EQ(r.exit.code, 0) << r.output;
    for (int rank = 0; rank < 2; ++rank) {
      const std::string line = s.Read(bind + "-" + std::to_string(rank) + ".txt");
      ASSERT_NE(line.find("Cpus_allowed_list:"), std::string::npos) << line;
      EXPECT_EQ(AllowedCpus(line), bind == "none" ? AffinityCpus() : CpuShare(AffinityCpus(), rank, 2))
          << bind << ", rank " << rank << ": " << line;
    }
    // Where each task runs, said as the job starts.
    const std::string said = "cpu_bind: cores: worker-0 on CPU " + FormatCpuList(CpuShare(AffinityCpus(), 0, 2)) +
                             ", worker-1 on CPU " + FormatCpuList(CpuShare(AffinityCpus(), 1, 2));
    EXPECT_EQ(r.output.find(said) != std::string::npos, bind == "cores") << r.output;
  }
}

TEST(Cli, OutputIsPrefixedPerRankAndSavedPerRank) {
  Scratch s;
  WriteSpec(s, R"(name: logs
procs_per_node: 3
command: [sh, -c, 'echo "line one from $RANK"; echo "to stderr from $RANK" >&2; printf "no newline $RANK"']
output_dir: {out}/out
)");
  auto r = Trainctl({"run", "job.yaml"}, s.path(""));
  ASSERT_EQ(r.exit.code, 0) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    std::string R = std::to_string(rank);
    EXPECT_EQ(CountLines(r.output, "[worker-" + R + "] line one from " + R), 1) << r.output;
    EXPECT_EQ(CountLines(r.output, "[worker-" + R + "] to stderr from " + R), 1);
    EXPECT_EQ(CountLines(r.output, "[worker-" + R + "] no newline " + R), 1);
    std::string log = s.Read("out/logs/worker-" + R + ".log");
    EXPECT_NE(log.find("\nline one from " + R + "\n"), std::string::npos) << log;
    EXPECT_NE(log.find("to stderr from " + R), std::string::npos);
    EXPECT_EQ(log.find("[worker-"), std::string::npos) << "the log holds the raw lines";
    EXPECT_TRUE(Exists(s.path("out/logs/worker-" + R + ".log.times"))) << "logs --since reads the time marks";
  }
}

TEST(Cli, AFailedWorkerRestartsTheWholeGroupOnEveryNode) {
  Scratch s;
  // Rank 3 fails on the first attempt once all four workers have started (else a worker could be
  // stopped before it printed anything), and every worker succeeds on the second.
  WriteSpec(s, R"(name: flaky
nodes: 2
procs_per_node: 2
command: [sh, -c, 'echo "start $RANK attempt $TORCHELASTIC_RESTART_COUNT"; echo $RANK >> {out}/started-$TORCHELASTIC_RESTART_COUNT; if [ "$RANK" = 3 ] && [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then i=0; while [ $(wc -l < {out}/started-0) -lt 4 ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; exit 9; fi; [ "$TORCHELASTIC_RESTART_COUNT" = 1 ] || sleep 20']
restart: {max_restarts: 2}
timeouts: {stop_grace: 2s}
output_dir: {out}/out
)");
  auto r = Trainctl({"run", "job.yaml"}, s.path(""));
  ASSERT_EQ(r.exit.code, 0) << r.output;
  for (int rank = 0; rank < 4; ++rank) {
    std::string R = std::to_string(rank);
    EXPECT_EQ(CountLines(r.output, "] start " + R + " attempt 0"), 1) << r.output;
    EXPECT_EQ(CountLines(r.output, "] start " + R + " attempt 1"), 1) << r.output;
  }
  EXPECT_NE(r.output.find("worker 3 (rank 3"), std::string::npos);
  EXPECT_NE(r.output.find("restarting the worker group (restart 1 of 2)"), std::string::npos);
  EXPECT_EQ(ReadStatus(s)["restarts"], 1);
  EXPECT_EQ(ReadStatus(s)["state"], "succeeded");
}

TEST(Cli, SpentRestartBudgetReportsTheRootCause) {
  Scratch s;
  WriteSpec(s, R"(name: broken
procs_per_node: 2
command: [sh, -c, 'if [ "$RANK" = 1 ]; then echo "loading data"; echo "ValueError: bad shard 7" >&2; exit 7; fi; sleep 20']
restart: {max_restarts: 1}
timeouts: {stop_grace: 1s}
output_dir: {out}/out
)");
  auto r = Trainctl({"run", "job.yaml"}, s.path(""));
  EXPECT_EQ(r.exit.code, kExitWorkerFailed) << r.output;
  EXPECT_NE(r.output.find("job broken failed after 1 restart(s) (max_restarts: 1): worker 1 (rank 1"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("failed: exit code 7"), std::string::npos);
  EXPECT_NE(r.output.find("| ValueError: bad shard 7"), std::string::npos);
  EXPECT_NE(r.output.find("log: " + s.path("out/logs/worker-1.log")), std::string::npos);
  auto st = ReadStatus(s);
  EXPECT_EQ(st["state"], "failed");
  EXPECT_EQ(st["exit_code"], kExitWorkerFailed);
  EXPECT_EQ(st["failure"]["rank"], 1);
}

TEST(Cli, DeathBySignalIsNamed) {
  Scratch s;
  WriteSpec(s, R"(name: segv
command: [sh, -c, 'kill -SEGV $$']
restart: {max_restarts: 0}
output_dir: {out}/out
)");
  auto r = Trainctl({"run", "job.yaml"}, s.path(""));
  EXPECT_EQ(r.exit.code, kExitWorkerFailed);
  EXPECT_NE(r.output.find("failed: signal 11 (SIGSEGV)"), std::string::npos) << r.output;
}

TEST(Cli, AProgramThatCannotStartIsASpecError) {
  Scratch s;
  WriteSpec(s, "name: typo\ncommand: [pythn3, train.py]\noutput_dir: {out}/out\n");
  auto r = Trainctl({"run", "job.yaml"}, s.path(""));
  EXPECT_EQ(r.exit.code, kExitInvalidSpec);
  EXPECT_NE(r.output.find("job.yaml: command: 'pythn3' was not found in PATH"), std::string::npos) << r.output;
}

// A program that ran once and then cannot start (it removed itself): one restart happened, and
// status.json says 1 in both places, not a restart that never was.
TEST(Cli, AStartFailureAfterARestartIsCountedOnce) {
  Scratch s;
  s.Write("prog.sh", "#!/bin/sh\nrm -f \"$0\"\nexit 1\n");
  ASSERT_EQ(::chmod(s.path("prog.sh").c_str(), 0755), 0);
  WriteSpec(s, "name: gone\ncommand: [./prog.sh]\nrestart: {max_restarts: 3, backoff: 10ms}\noutput_dir: {out}/out\n");
  auto r = Trainctl({"run", "job.yaml"}, s.path(""));
  EXPECT_EQ(r.exit.code, kExitWorkerFailed) << r.output;
  // Named as it was found: next to the spec (a relative program path is the spec's directory's).
  EXPECT_NE(r.output.find("could not start: " + s.path("prog.sh") + " is not an executable file"), std::string::npos)
      << r.output;
  auto status = nlohmann::json::parse(s.Read("out/status.json"));
  EXPECT_EQ(status["restarts"], 1) << status.dump();
  EXPECT_EQ(status["failure"]["restarts"], 1) << status.dump();
  EXPECT_EQ(status["failure"]["kind"], "start") << status.dump();
}

TEST(Cli, JobTimeoutStopsTheJob) {
  Scratch s;
  WriteSpec(s, R"(name: slow
command: [sleep, "60"]
timeouts: {job: 500ms, stop_grace: 1s}
output_dir: {out}/out
)");
  auto r = Trainctl({"run", "job.yaml"}, s.path(""), seconds(30));
  EXPECT_EQ(r.exit.code, kExitJobTimeout) << r.output;
  EXPECT_NE(r.output.find("ran longer than timeouts.job (500ms)"), std::string::npos) << r.output;
  EXPECT_EQ(ReadStatus(s)["state"], "timed-out");
}

// Starts a 2 x 2 job whose workers each start a background child, and returns once every worker
// has written "<its pid> <child pid>" to pids and its agent's pid to agents.
std::unique_ptr<Background> StartJobWithGrandchildren(const Scratch& s) {
  WriteSpec(s, R"(name: grandchildren
nodes: 2
procs_per_node: 2
command: [sh, -c, 'sleep 300 & echo "$$ $!" >> {out}/pids; echo "$PPID" >> {out}/agents; wait']
output_dir: {out}/out
)");
  auto job = std::make_unique<Background>(std::vector<std::string>{"run", "job.yaml"}, s.path(""), s.path("log"));
  EXPECT_TRUE(Eventually([&] { return ReadPids(s.path("pids")).size() == 8; }));
  return job;
}

// Ctrl-C (SIGINT) or SIGTERM to trainctl stops every process it started.
class InterruptTest : public ::testing::TestWithParam<int> {};

TEST_P(InterruptTest, StopsEverythingAndLeavesNoOrphans) {
  Scratch s;
  auto job = StartJobWithGrandchildren(s);
  std::vector<pid_t> pids = ReadPids(s.path("pids"));
  for (pid_t agent : ReadPids(s.path("agents"))) pids.push_back(agent);
  ::kill(job->pid(), GetParam());
  ExitInfo exit = job->Wait(seconds(30));
  EXPECT_EQ(exit.code, kExitInterrupted) << job->Output();
  for (pid_t p : pids) {
    EXPECT_TRUE(Eventually([p] { return ProcessGone(p); }, seconds(5))) << "pid " << p << " outlived trainctl";
  }
  EXPECT_EQ(ReadStatus(s)["state"], "interrupted");
}

INSTANTIATE_TEST_SUITE_P(Signals, InterruptTest, ::testing::Values(SIGINT, SIGTERM),
                         [](const auto& info) { return info.param == SIGINT ? "SIGINT" : "SIGTERM"; });

// A node whose tasks have all finished waits on the store for the job's end; a stop still reaches
// it (through the job's stop key: it has no task to be signalled through), and it ends with the
// job.
TEST(Cli, ANodeWhoseTasksAreDoneStopsWithTheJob) {
  Scratch s;
  WriteSpec(s, R"(name: done-early
nodes: 3
command: [sh, -c, 'echo "$PPID" >> {out}/agents; if [ "$GROUP_RANK" = 0 ]; then echo "$$ $PPID" > {out}/early; exit 0; fi; sleep 300']
timeouts: {stop_grace: 2s}
output_dir: {out}/out
)");
  Background job({"run", "job.yaml"}, s.path(""), s.path("log"));
  ASSERT_TRUE(
      Eventually([&] { return ReadPids(s.path("agents")).size() == 3 && ReadPids(s.path("early")).size() == 2; }));
  const pid_t early = ReadPids(s.path("early"))[0], its_agent = ReadPids(s.path("early"))[1];
  ASSERT_TRUE(Eventually([early] { return ProcessGone(early); }, seconds(10)));
  // Its agent now waits in a read of the store (poll), not in a timed wait for signals.
  auto in_syscall = [](pid_t p) {
    std::ifstream in("/proc/" + std::to_string(p) + "/syscall");
    long nr = -1;
    in >> nr;
    return nr;
  };
#ifdef SYS_poll
  const long kStoreRead = SYS_poll;
#else
  const long kStoreRead = SYS_ppoll;
#endif
  EXPECT_TRUE(Eventually([&] { return in_syscall(its_agent) == kStoreRead; }, seconds(10)))
      << "the agent of the finished node is in syscall " << in_syscall(its_agent);
  ::kill(job.pid(), SIGTERM);
  ExitInfo exit = job.Wait(seconds(30));
  EXPECT_EQ(exit.code, kExitInterrupted) << job.Output();
  for (pid_t agent : ReadPids(s.path("agents"))) {
    EXPECT_TRUE(Eventually([agent] { return ProcessGone(agent); }, seconds(5)))
        << "agent " << agent << " outlived the job";
  }
  EXPECT_EQ(ReadStatus(s)["state"], "interrupted");
}

TEST(Cli, WorkersThatIgnoreSigtermAreKilledAfterTheGracePeriod) {
  Scratch s;
  WriteSpec(s, R"(name: stubborn
procs_per_node: 2
command: [sh, -c, 'trap "" TERM; echo $$ >> {out}/pids; while true; do sleep 1; done']
timeouts: {stop_grace: 500ms}
output_dir: {out}/out
)");
  Background job({"run", "job.yaml"}, s.path(""), s.path("log"));
  ASSERT_TRUE(Eventually([&] { return ReadPids(s.path("pids")).size() == 2; }));
  auto start = Clock::now();
  ::kill(job.pid(), SIGINT);
  ExitInfo exit = job.Wait(seconds(30));
  EXPECT_EQ(exit.code, kExitInterrupted);
  EXPECT_LT(Clock::now() - start, seconds(10));
  for (pid_t p : ReadPids(s.path("pids"))) {
    EXPECT_TRUE(Eventually([p] { return ProcessGone(p); }, seconds(5))) << p;
  }
}

TEST(Cli, KillingTrainctlWithSigkillStillStopsEveryWorker) {
  Scratch s;
  auto job = StartJobWithGrandchildren(s);
  ::kill(job->pid(), SIGKILL);  // no chance to clean up: the agents must notice on their own
  job->Wait(seconds(10));
  for (pid_t p : ReadPids(s.path("pids"))) {
    EXPECT_TRUE(Eventually([p] { return ProcessGone(p); }, seconds(20))) << "pid " << p << " orphaned";
  }
}

// An agent SIGKILLed: its workers get SIGTERM from the kernel (they die with their parent), and
// what they started in the background comes to trainctl, a subreaper, which stops it. (It used to
// be reparented to init and outlive the job.) The launcher starts the agent again (docs/cli.md,
// "Killed agent"), and the next round's tasks go with a stop as everything else does.
TEST(Cli, ASigkilledAgentsWorkersLeaveNothingBehind) {
  Scratch s;
  auto job = StartJobWithGrandchildren(s);
  const std::vector<pid_t> agents = ReadPids(s.path("agents"));
  const std::vector<pid_t> first = ReadPids(s.path("pids"));
  ASSERT_FALSE(agents.empty());
  ASSERT_EQ(::kill(agents[0], SIGKILL), 0);
  for (pid_t p : first) {
    EXPECT_TRUE(Eventually([p] { return ProcessGone(p); }, seconds(5))) << "pid " << p << " outlived its round";
  }
  ASSERT_TRUE(Eventually([&] { return ReadPids(s.path("pids")).size() == 16; })) << job->Output();
  ::kill(job->pid(), SIGTERM);
  ExitInfo exit = job->Wait(seconds(30));
  EXPECT_EQ(exit.code, kExitInterrupted) << job->Output();
  EXPECT_EQ(ReadStatus(s)["restarts"], 1);
  for (pid_t p : ReadPids(s.path("pids"))) {
    EXPECT_TRUE(Eventually([p] { return ProcessGone(p); }, seconds(5))) << "pid " << p << " outlived the job";
  }
}

// SIGTERM while hundreds of agents are still starting stops the job at once, and everything it
// started is gone soon after.
TEST(Cli, ASignalDuringALargeStartUpIsHonoured) {
  Scratch s;
  WriteSpec(s,
            "name: big\nnodes: 400\ncommand: [sleep, '60']\ntimeouts: {rendezvous: 60s, stop_grace: 2s}\n"
            "output_dir: {out}/out\n");
  Background job({"run", "job.yaml"}, s.path(""), s.path("log"));
  ASSERT_TRUE(Eventually(
      [&] {
        return !ProcessesWithEnv({"TRAINCTL_AGENT_STORE=" + std::string()}).empty() ||
               !LiveProcesses([&](pid_t p) {
                  auto argv = ProcStrings(p, "cmdline");
                  return argv.size() > 3 && std::find(argv.begin(), argv.end(), "agent") != argv.end() &&
                         std::find(argv.begin(), argv.end(), "--run-id") != argv.end() &&
                         argv[std::find(argv.begin(), argv.end(), "--run-id") - argv.begin() + 1].rfind("big-", 0) == 0;
                }).empty();
      },
      seconds(30)));
  const auto start = Clock::now();
  ::kill(job.pid(), SIGTERM);
  ExitInfo exit = job.Wait(seconds(60));
  EXPECT_EQ(exit.code, kExitInterrupted) << job.Output();
  EXPECT_LT(Clock::now() - start, seconds(15)) << job.Output();
  EXPECT_TRUE(Eventually(
      [] {
        return LiveProcesses([](pid_t p) {
                 auto argv = ProcStrings(p, "cmdline");
                 auto it = std::find(argv.begin(), argv.end(), "--run-id");
                 return it != argv.end() && it + 1 != argv.end() && (it + 1)->rfind("big-", 0) == 0;
               })
            .empty();
      },
      seconds(15)))
      << "agents outlived the job";
}

// The scale path end to end at a size CI affords: 256 agent processes meet in one round on the
// job's store, each starts its task, and the job succeeds (rendezvous_test does 1024 in threads).
TEST(Cli, AJobOf256NodesSucceeds) {
  Scratch s;
  WriteSpec(s, "name: wide\nnodes: 256\ncommand: [sh, -c, 'echo $RANK > /dev/null']\noutput_dir: {out}/out\n");
  auto r = Trainctl({"run", "job.yaml"}, s.path(""), seconds(120));
  ASSERT_EQ(r.exit.code, kExitOk) << r.output;
  EXPECT_EQ(ReadStatus(s)["state"], "succeeded");
  EXPECT_EQ(ReadStatus(s)["restarts"], 0);
  int logs = 0;
  for (int rank = 0; rank < 256; ++rank)
    logs += Exists(s.path("out/logs/worker-" + std::to_string(rank) + ".log")) ? 1 : 0;
  EXPECT_EQ(logs, 256);
}

// Whether the kernel gives transparent huge pages to a process that asks (madvise).
bool TransparentHugePages() {
  auto mode = ReadFile("/sys/kernel/mm/transparent_hugepage/enabled");
  return mode.ok() && mode->find("[never]") == std::string::npos;
}

// The KiB of a process's executable mappings held in anonymous huge pages.
long HugeCodeKiB(pid_t pid) {
  std::ifstream smaps("/proc/" + std::to_string(pid) + "/smaps");
  long kib = 0;
  bool code = false;
  for (std::string line; std::getline(smaps, line);) {
    std::istringstream in(line);
    std::string first, second;
    in >> first >> second;
    if (first.find('-') != std::string::npos && second.size() == 4) {
      code = second == "r-xp";
    } else if (code && first == "AnonHugePages:") {
      kib += std::stol(second);
    }
  }
  return kib;
}

// A local job's agents are forked from one exec'd agent (common/fork_server.h); to the user and
// to the launcher each is what an exec'd `trainctl agent` was: the launcher's child, leading its
// own process group, with its own command line, and nothing of the fork server in its tasks'
// environment. The server is gone once the agents have started, and a SIGTERM stops them all.
TEST(Cli, ALocalJobsAgentsAreTheLaunchersChildrenWithTheirOwnCommandLines) {
  Scratch s;
  WriteSpec(s,
            "name: forked\nnodes: 12\ncommand: [sh, -c, 'env > {out}/env-$RANK; echo $PPID > {out}/agent-$RANK; "
            "exec sleep 60']\ntimeouts: {stop_grace: 2s}\noutput_dir: {out}/out\n");
  Background job({"run", "job.yaml"}, s.path(""), s.path("log"));
  ASSERT_TRUE(Eventually(
      [&] {
        for (int rank = 0; rank < 12; ++rank) {
          if (ReadPids(s.path("agent-" + std::to_string(rank))).empty()) return false;
        }
        return true;
      },
      seconds(60)))
      << job.Output();
  // "pid (comm) state ppid pgrp ..."
  auto stat = [](pid_t pid) {
    auto text = ReadFile("/proc/" + std::to_string(pid) + "/stat");
    std::istringstream in(text.ok() ? text->substr(text->rfind(')') + 1) : "");
    std::string state;
    pid_t ppid = 0, pgrp = 0;
    in >> state >> ppid >> pgrp;
    return std::make_pair(ppid, pgrp);
  };
  std::string run_id;
  for (int rank = 0; rank < 12; ++rank) {
    SCOPED_TRACE("node " + std::to_string(rank));
    const pid_t agent = ReadPids(s.path("agent-" + std::to_string(rank)))[0];
    EXPECT_EQ(stat(agent), std::make_pair(job.pid(), agent));
    auto argv = ProcStrings(agent, "cmdline");
    while (!argv.empty() && argv.back().empty()) argv.pop_back();  // a rank shorter than the widest
    ASSERT_GE(argv.size(), 5u);
    if (run_id.empty()) run_id = argv[argv.size() - 3];
    EXPECT_EQ(std::vector<std::string>(argv.end() - 5, argv.end()),
              (std::vector<std::string>{"agent", "--run-id", run_id, "--node-rank", std::to_string(rank)}));
    const std::string env = s.Read("env-" + std::to_string(rank));
    EXPECT_EQ(env.find("TRAINCTL_FORK_SERVER_FD"), std::string::npos) << env;
    EXPECT_EQ(env.find("LD_BIND_NOW"), std::string::npos) << env;
    // The server took the store's token out of the environment it copies (and read the spec).
    EXPECT_EQ(env.find("TRAINCTL_AGENT_TOKEN"), std::string::npos) << env;
    // A task that wrote nothing has a log and no time marks beside it (a file fewer a task).
    EXPECT_TRUE(Exists(s.path("out/logs/worker-" + std::to_string(rank) + ".log")));
    EXPECT_FALSE(Exists(s.path("out/logs/worker-" + std::to_string(rank) + ".log.times")));
  }
  EXPECT_EQ(run_id.rfind("forked-", 0), 0u) << run_id;
  // The server moved its code onto huge pages, which each copy maps with the fork
  // (common/huge_text.h), where the kernel has transparent huge pages.
  if (TransparentHugePages()) {
    for (int rank = 0; rank < 12; ++rank) {
      const pid_t agent = ReadPids(s.path("agent-" + std::to_string(rank)))[0];
      EXPECT_GE(HugeCodeKiB(agent), 2048) << "node " << rank;
    }
  }
  auto of_run = [&] {
    return LiveProcesses([&](pid_t p) {
      auto argv = ProcStrings(p, "cmdline");
      return std::find(argv.begin(), argv.end(), run_id) != argv.end();
    });
  };
  EXPECT_EQ(of_run().size(), 12u) << "the fork server outlived the start of the agents";
  ::kill(job.pid(), SIGTERM);
  EXPECT_EQ(job.Wait(seconds(60)).code, kExitInterrupted) << job.Output();
  EXPECT_TRUE(Eventually([&] { return of_run().empty(); }, seconds(15))) << "agents outlived the job";
}

// TRAINCTL_HUGE_TEXT=0 leaves the fork server's code the executable's (for a profiler).
TEST(Cli, HugeTextZeroLeavesTheAgentsCodeTheExecutables) {
  Scratch s;
  WriteSpec(s,
            "name: small-pages\nnodes: 2\ncommand: [sh, -c, 'echo $PPID > {out}/agent-$RANK; exec sleep 60']\n"
            "timeouts: {stop_grace: 2s}\n");
  Background job({"run", "job.yaml"}, s.path(""), s.path("log"), {{"TRAINCTL_HUGE_TEXT", "0"}});
  ASSERT_TRUE(Eventually([&] { return !ReadPids(s.path("agent-1")).empty() && !ReadPids(s.path("agent-0")).empty(); },
                         seconds(60)))
      << job.Output();
  for (const char* file : {"agent-0", "agent-1"}) {
    const pid_t agent = ReadPids(s.path(file))[0];
    EXPECT_EQ(HugeCodeKiB(agent), 0) << file;
    const auto maps = ReadFile("/proc/" + std::to_string(agent) + "/maps");
    ASSERT_TRUE(maps.ok());
    EXPECT_NE(maps->find("r-xp"), std::string::npos);
    EXPECT_NE(maps->find(std::filesystem::canonical(TRAINCTL_BIN).string() + "\n"), std::string::npos) << *maps;
  }
  ::kill(job.pid(), SIGTERM);
  EXPECT_EQ(job.Wait(seconds(60)).code, kExitInterrupted) << job.Output();
}

// While the tasks run, a one-node job's launcher and agent sleep until something happens (a
// task's exit, a signal, a deadline), reading the store twice a second: on a machine the workers
// fill, every wake-up of theirs preempts a worker. A stop still reaches the tasks.
TEST(Cli, AOneNodeJobsLauncherAndAgentRarelyWakeWhileTheTasksRun) {
  Scratch s;
  WriteSpec(s,
            "name: quiet\ncommand: [sh, -c, 'echo $PPID > {out}/agent; exec sleep 60']\n"
            "timeouts: {stop_grace: 2s}\noutput_dir: {out}/out\n");
  Background job({"run", "job.yaml"}, s.path(""), s.path("log"));
  ASSERT_TRUE(Eventually([&] { return !ReadPids(s.path("agent")).empty(); }, seconds(60))) << job.Output();
  const pid_t agent = ReadPids(s.path("agent"))[0];
  // Voluntary context switches of every thread of a process: each is a sleep, so one wake-up.
  auto switches = [](pid_t pid) {
    int64_t n = 0;
    std::error_code ec;
    for (const auto& task : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
      std::ifstream in(task.path() / "status");
      for (std::string line; std::getline(in, line);) {
        if (line.rfind("voluntary_ctxt_switches:", 0) == 0) n += std::atoll(line.substr(line.find(':') + 1).c_str());
      }
    }
    return n;
  };
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // past the round's start
  const int64_t launcher0 = switches(job.pid()), agent0 = switches(agent);
  std::this_thread::sleep_for(seconds(3));
  const int64_t launcher = switches(job.pid()) - launcher0, woke = switches(agent) - agent0;
  // Polling every 50 ms, as before, was about 40 a second each.
  EXPECT_LT(launcher, 30) << "the launcher woke " << launcher << " times in 3 s";
  EXPECT_LT(woke, 30) << "the agent woke " << woke << " times in 3 s";
  ::kill(job.pid(), SIGTERM);
  EXPECT_EQ(job.Wait(seconds(60)).code, kExitInterrupted) << job.Output();
  EXPECT_NE(::kill(agent, 0), 0) << "the agent outlived the job";
}

TEST(Cli, AJobTooLargeForThisMachineIsRefused) {
  Scratch s;
  WriteSpec(s, "name: huge\nnodes: 10000\nprocs_per_node: 1024\ncommand: [sleep, '1']\noutput_dir: {out}/out\n");
  auto r = Trainctl({"run", "job.yaml"}, s.path(""));
  EXPECT_EQ(r.exit.code, kExitInvalidSpec) << r.output;
  EXPECT_NE(r.output.find(
                "10000 node(s) x 1024 worker(s) is 10240000 tasks on this machine, more than trainctl starts on one"),
            std::string::npos)
      << r.output;
}

// Failures in a row come back ever slower (restart.backoff), so a large budget is not spent in a
// burst: the first restart at once, then 300 ms, then 600 ms.
TEST(Cli, RestartsAfterFailuresInARowBackOff) {
  Scratch s;
  WriteSpec(s,
            "name: backoff\ncommand: [sh, -c, 'exit 4']\nrestart: {max_restarts: 3, backoff: 300ms}\n"
            "output_dir: {out}/out\n");
  const auto start = Clock::now();
  auto r = Trainctl({"run", "job.yaml"}, s.path(""));
  EXPECT_EQ(r.exit.code, kExitWorkerFailed) << r.output;
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(900));
  EXPECT_NE(r.output.find("restarting the worker group (restart 1 of 3)\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(restart 2 of 3) in 300ms (restart.backoff: failures in a row)"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("(restart 3 of 3) in 600ms"), std::string::npos) << r.output;
  EXPECT_EQ(ReadStatus(s)["restarts"], 3);
}

// What can never work is found before anything starts, by run and validate alike.
TEST(Cli, DirectoriesInTheWayAreFoundBeforeTheJobStarts) {
  Scratch s;
  s.Write("file", "not a directory");
  WriteSpec(s, "name: dirs\ncommand: [\"true\"]\noutput_dir: {out}out\ncheckpoint_dir: {out}file\n");
  for (const char* verb : {"run", "validate"}) {
    auto r = Trainctl({verb, "job.yaml"}, s.path(""));
    EXPECT_EQ(r.exit.code, kExitInvalidSpec) << r.output;
    EXPECT_NE(r.output.find("job.yaml: checkpoint_dir: " + s.path("file") + " is a file, expected a directory"),
              std::string::npos)
        << r.output;
  }
}

TEST(Cli, AJobCanRendezvousOnEtcd) {
  const std::string endpoint = SharedEtcd().endpoints()[0];
  Scratch s;
  std::string url = "etcd://" + endpoint;
  WriteSpec(s, "name: on-etcd\nnodes: 2\nprocs_per_node: 2\nrendezvous: " + url +
                   "\ncommand: [sh, -c, 'echo \"$RANK $TRAINCTL_STORE_ADDR\" >> {out}/ranks']\n"
                   "output_dir: {out}/out\n");
  auto r = Trainctl({"run", "job.yaml"}, s.path(""));
  ASSERT_EQ(r.exit.code, 0) << r.output;
  std::string ranks = s.Read("ranks");
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(CountLines(ranks, std::to_string(rank) + " " + url), 1) << ranks;
  }
  // The rounds were held on etcd, under this run's own prefix.
  std::string run_id = ReadStatus(s)["run_id"];
  EtcdStoreOptions o;
  o.endpoints = {endpoint};
  auto store = std::move(EtcdStore::Connect(o).value());
  auto state = nlohmann::json::parse(**store->TryGet("/trainctl/" + run_id + "/round/0/state"));
  EXPECT_EQ(state["nodes"].size(), 2u) << state;
  EXPECT_TRUE(state["closed"].get<bool>()) << state;
  // Every one of the 4 tasks reported its success there, and the round ended with the job's.
  EXPECT_EQ(**store->TryGet("/trainctl/" + run_id + "/round/0/succeeded"), "4");
  EXPECT_NE(store->TryGet("/trainctl/" + run_id + "/round/0/end")->value_or("").find("\"succeeded\""),
            std::string::npos);
}

// The job's rounds on an etcd that speaks only TLS and wants a user's password: the URL names
// the CA and the user, the password comes from the environment of every process of the job.
TEST(Cli, AJobCanRendezvousOnEtcdWithTlsAndAuth) {
  EtcdCluster etcd(1, "127.0.0.1", {true, false, "trainctl", "pa55 word"});
  Scratch s;
  const std::string url = "etcds://" + etcd.endpoints()[0] + "?ca=" + etcd.cert("ca.pem") + "&user=trainctl";
  WriteSpec(s, "name: secure-etcd\nnodes: 2\nprocs_per_node: 2\nrendezvous: \"" + url +
                   "\"\ncommand: [sh, -c, 'echo $RANK >> {out}/ranks']\noutput_dir: {out}/out\n");
  auto r = Trainctl({"run", "job.yaml"}, s.path(""), seconds(60), {{"TRAINCTL_ETCD_PASSWORD", "pa55 word"}});
  ASSERT_EQ(r.exit.code, 0) << r.output;
  EXPECT_EQ(CountLines(s.Read("ranks"), ""), 4);
  auto no_password = Trainctl({"run", "job.yaml"}, s.path(""), seconds(60));
  EXPECT_NE(no_password.exit.code, 0);
  EXPECT_NE(no_password.output.find("etcd user trainctl: set TRAINCTL_ETCD_PASSWORD to its password"),
            std::string::npos)
      << no_password.output;
  auto wrong = Trainctl({"run", "job.yaml"}, s.path(""), seconds(60), {{"TRAINCTL_ETCD_PASSWORD", "guess"}});
  EXPECT_NE(wrong.exit.code, 0);
  EXPECT_NE(wrong.output.find("etcd refused user trainctl"), std::string::npos) << wrong.output;
}

// etcd lost while the job runs: the job ends, and its report names the cause.
TEST(Cli, AnEtcdLostMidJobIsNamedInTheReport) {
  EtcdCluster etcd(1);
  Scratch s;
  WriteSpec(s, "name: lost-etcd\nrendezvous: etcd://" + etcd.endpoints()[0] +
                   "\ncommand: [sh, -c, 'echo up > {out}/up; exec sleep 60']\ntimeouts: {stop_grace: 1s}\n"
                   "output_dir: {out}/out\n");
  Background job({"run", "job.yaml"}, s.path(""), s.path("log"));
  ASSERT_TRUE(Eventually([&] { return Exists(s.path("up")); })) << job.Output();
  const auto start = Clock::now();
  etcd.Kill(0);
  ExitInfo exit = job.Wait(seconds(60));
  EXPECT_EQ(exit.code, kExitError) << job.Output();
  EXPECT_LT(Clock::now() - start, seconds(30)) << job.Output();
  EXPECT_NE(job.Output().find("lost the job's store"), std::string::npos) << job.Output();
  EXPECT_NE(ReadStatus(s)["store_error"].get<std::string>().find("etcd request kv/range failed"), std::string::npos)
      << ReadStatus(s);
}

TEST(Cli, AnUnreachableEtcdIsReportedNotWaitedOnForever) {
  Scratch s;
  WriteSpec(s,
            "name: no-etcd\nrendezvous: etcd://127.0.0.1:1\ntimeouts: {rendezvous: 1s}\n"
            "command: [\"true\"]\noutput_dir: {out}/out\n");
  auto r = Trainctl({"run", "job.yaml"}, s.path(""), seconds(30));
  EXPECT_EQ(r.exit.code, kExitError) << r.output;
  EXPECT_NE(r.output.find("cannot reach the job's store: cannot reach etcd at 127.0.0.1:1"), std::string::npos)
      << r.output;
}

// While the launcher waits for an etcd that is not there, Ctrl-C and SIGTERM end the wait within
// a second: exit 130, status.json says interrupted, and the job's cgroup is gone.
TEST(Cli, AStopSignalEndsTheWaitForAnEtcdThatIsNotThere) {
  for (int sig : {SIGINT, SIGTERM}) {
    Scratch s;
    const std::vector<std::pair<std::string, std::string>> env = {{"TRAINCTL_STATE_DIR", s.path("state")}};
    WriteSpec(s, "name: no-etcd\nrendezvous: etcd://127.0.0.1:9\ncommand: [\"true\"]\noutput_dir: {out}/out\n");
    Background run({"run", "job.yaml"}, s.path(""), s.path("run.log"), env);
    ASSERT_TRUE(Eventually([&] { return Exists(s.path("out/status.json")); })) << run.Output();
    const std::string id = nlohmann::json::parse(s.Read("out/status.json"))["run_id"];
    std::this_thread::sleep_for(seconds(2));  // into the wait for etcd
    const auto signalled = Clock::now();
    ::kill(run.pid(), sig);
    EXPECT_EQ(run.Wait(seconds(10)).code, kExitInterrupted) << run.Output();
    EXPECT_LT(Clock::now() - signalled, std::chrono::milliseconds(1500)) << run.Output();
    EXPECT_EQ(ReadStatus(s)["state"], "interrupted") << s.Read("out/status.json");
    auto entry = nlohmann::json::parse(s.Read("state/runs/" + id + ".json"), nullptr, false);
    if (entry.is_object() && !entry.value("cgroup", "").empty()) {
      EXPECT_FALSE(Exists(entry["cgroup"].get<std::string>())) << "the job's cgroup was left behind";
    }
  }
}

// An agent run by hand against a store: the way other launchers start it.
class AgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TcpStoreServerOptions so;
    so.token = "agent-test-token";
    server_ = std::move(TcpStoreServer::Start(so).value());
    TcpStoreOptions co;
    co.port = server_->port();
    co.token = so.token;
    store_ = std::make_unique<PrefixStore>(std::move(TcpStore::Connect(co).value()), "/trainctl/run-1/");
  }
  void Publish(const std::string& yaml) {
    auto spec = ParseJobSpec(yaml, "job.yaml");
    ASSERT_TRUE(spec.ok()) << spec.status().message();
    ASSERT_TRUE(store_->Set(keys::kSpec, JobSpecToJson(*spec)).ok());
  }
  CommandResult RunAgent(const std::string& token) {
    return Trainctl(
        {"agent", "--node-rank", "0", "--run-id", "run-1"}, scratch_.path(""), seconds(60),
        {{"TRAINCTL_AGENT_STORE", "127.0.0.1:" + std::to_string(server_->port())}, {"TRAINCTL_AGENT_TOKEN", token}});
  }
  Scratch scratch_;
  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<PrefixStore> store_;
};

TEST_F(AgentTest, RendezvousTimeoutNamesTheMissingNodesAndExits4) {
  Publish(
      "name: rdzv\nnodes: 2\ncommand: [\"true\"]\ntimeouts: {rendezvous: 500ms}\n"
      "output_dir: " +
      scratch_.path("out") + "\n");
  auto r = RunAgent("agent-test-token");
  EXPECT_EQ(r.exit.code, kExitRendezvousTimeout) << r.output;
  EXPECT_NE(r.output.find("1 of 2 nodes joined within 500ms (joined: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("; missing node rank(s) 1"), std::string::npos) << r.output;
}

// A task that cannot start fails the job at once, and no restart is counted (status.json used to
// count one that never happened).
TEST_F(AgentTest, ATaskThatCannotStartSpendsNoRestart) {
  Publish("name: nostart\ncommand: [/nonexistent/program]\nrestart: {max_restarts: 5}\noutput_dir: " +
          scratch_.path("out") + "\n");
  auto r = RunAgent("agent-test-token");
  EXPECT_EQ(r.exit.code, kExitWorkerFailed) << r.output;
  EXPECT_NE(r.output.find("could not start: /nonexistent/program is not an executable file; not restarting"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(store_->TryGet("restarts")->value_or(""), "0");
}

TEST_F(AgentTest, AWrongTokenIsRefused) {
  Publish("name: auth\ncommand: [\"true\"]\noutput_dir: " + scratch_.path("out") + "\n");
  auto r = RunAgent("not-the-token-at-all");
  EXPECT_EQ(r.exit.code, kExitError) << r.output;
  EXPECT_NE(r.output.find("refused the token"), std::string::npos) << r.output;
  EXPECT_FALSE(store_->TryGet("round/0/joined")->has_value()) << "nothing was written";
  // A token too short to be secret is refused before it is tried.
  auto guessable = RunAgent("secret");
  EXPECT_EQ(guessable.exit.code, kExitInvalidSpec) << guessable.output;
  EXPECT_NE(guessable.output.find("at least 16 characters"), std::string::npos) << guessable.output;
}

// Agents and every verb start without cpp-httplib and OpenSSL (a third of a process start, paid
// 1024 times by a 1024-node job): trainctl-http.so brings them to what speaks HTTP.
TEST(Cli, TheHttpLibrariesAreLoadedOnlyByWhatSpeaksHttp) {
  Scratch s;
  auto r = Trainctl({"--version"}, s.path(""), seconds(30), {{"LD_DEBUG", "files"}});
  ASSERT_EQ(r.exit.code, 0) << r.output;
  EXPECT_NE(r.output.find("file=libyaml-cpp"), std::string::npos) << "the loader's trace:\n" << r.output;
  for (const char* lib : {"file=libssl", "file=libcrypto", "file=libcpp-httplib", "trainctl-http.so"}) {
    EXPECT_EQ(r.output.find(lib), std::string::npos) << lib << " loaded:\n" << r.output;
  }
  WriteSpec(s,
            "name: http\nrendezvous: etcd://127.0.0.1:1\ntimeouts: {rendezvous: 1s}\n"
            "command: [\"true\"]\noutput_dir: {out}/out\n");
  auto etcd = Trainctl({"run", "job.yaml"}, s.path(""), seconds(30), {{"LD_DEBUG", "files"}});
  EXPECT_NE(etcd.output.find("trainctl-http.so"), std::string::npos) << etcd.output;
  EXPECT_NE(etcd.output.find("file=libssl"), std::string::npos) << etcd.output;
}

// Your own image (docs/own-program.md): `scripts/dev bundle` gives trainctl with the libraries it
// needs; in a root holding only glibc, the C++ runtime, sh and the bundle (none of trainctl's
// Debian libraries), a job of 2 nodes x 2 workers runs, and a job on etcd loads trainctl-http.so
// (cpp-httplib, OpenSSL) from the bundle. Needs root (a mount namespace, chroot).
TEST(Cli, TheBundleRunsJobsInAnImageWithOnlyGlibcAndSh) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root for chroot";
  Scratch s;
  const std::string root = s.path("image");
  auto sh = [](const std::string& script) {
    return RunProgram({"sh", "-ec", script}, TRAINCTL_SOURCE_DIR, seconds(60));
  };
  auto bundled = sh("bash scripts/dev bundle " + root + "/opt/trainctl " TRAINCTL_BIN);
  ASSERT_EQ(bundled.exit.code, 0) << bundled.output;
  EXPECT_TRUE(Exists(root + "/opt/trainctl/lib/libyaml-cpp.so.0.7")) << bundled.output;
  EXPECT_FALSE(Exists(root + "/opt/trainctl/lib/libc.so.6")) << "glibc is the image's";
  EXPECT_TRUE(Exists(root + "/opt/trainctl/lib/trainctl/trainctl-http.so")) << bundled.output;
  auto made = sh("R=" + root +
                 "; mkdir -p $R/lib/x86_64-linux-gnu $R/lib64 $R/bin $R/proc $R/dev $R/tmp; "
                 "for l in libc.so.6 libm.so.6 libstdc++.so.6 libgcc_s.so.1; do "
                 "cp -L /lib/x86_64-linux-gnu/$l $R/lib/x86_64-linux-gnu/; done; "
                 "cp -L /lib64/ld-linux-x86-64.so.2 $R/lib64/; cp -L /bin/sh $R/bin/sh");
  ASSERT_EQ(made.exit.code, 0) << made.output;
  s.Write("image/job.yaml",
          "name: own\nnodes: 2\nprocs_per_node: 2\n"
          "command: [/bin/sh, -c, 'echo \"rank $RANK of $WORLD_SIZE\"']\noutput_dir: /tmp/out\n");
  s.Write("image/etcd.yaml",
          "name: on-etcd\nrendezvous: etcd://127.0.0.1:1\ntimeouts: {rendezvous: 1s}\n"
          "command: [/bin/sh, -c, 'true']\noutput_dir: /tmp/etcd-out\n");
  auto in_image = [&](const std::string& spec) {
    return sh("unshare --mount --fork sh -ec 'mount -t proc proc " + root + "/proc; mount --rbind /dev " + root +
              "/dev; mount --make-rslave " + root + "/dev; chroot " + root + " /opt/trainctl/bin/trainctl run " + spec +
              "'");
  };
  auto etcd = in_image("/etcd.yaml");
  EXPECT_EQ(etcd.exit.code, kExitError) << etcd.output;
  EXPECT_NE(etcd.output.find("cannot reach etcd at 127.0.0.1:1"), std::string::npos) << "the plugin loaded:\n"
                                                                                     << etcd.output;
  auto r = in_image("/job.yaml");
  EXPECT_EQ(r.exit.code, 0) << r.output;
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE(r.output.find("[worker-" + std::to_string(rank) + "] rank " + std::to_string(rank) + " of 4"),
              std::string::npos)
        << r.output;
  }
  EXPECT_NE(r.output.find("job own succeeded"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace trainctl::testing
