// The local launcher's parts in-process: the report and status.json a run ends with (from the
// records its agents leave in a MemoryStore, or a store that is gone), the store it hosts, the
// spec its agents read, and the agent supervisor driving stand-in agents (a shell script as
// LaunchOptions::self_exe) so that a failing, killed or overdue agent is tested without a job.
// tests/cli_test.cc and others run the same launcher with real agents.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/cpus.h"
#include "common/exit_codes.h"
#include "common/subprocess.h"
#include "job/keys.h"
#include "job/records.h"
#include "job/run_status.h"
#include "launch/local/agent_supervisor.h"
#include "launch/local/local_launcher.h"
#include "launch/local/report.h"
#include "store/memory/memory_store.h"
#include "store/open_store.h"
#include "store/tcp/tcp_store.h"

namespace trainctl {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/trainctl-launch-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

JobSpec SpecIn(const std::string& dir, int nodes) {
  JobSpec spec;
  spec.name = "parts";
  spec.nodes.min = spec.nodes.max = nodes;
  spec.output_dir = dir + "/out";
  spec.command = {"true"};
  fs::create_directories(spec.output_dir);
  return spec;
}

FailureRecord TaskFailure(int rank, int64_t error_time, const std::string& error) {
  FailureRecord r;
  r.kind = FailureKind::kTask;
  r.round = 1;
  r.restarts = 3;
  r.rank = r.local_rank = rank;
  r.role = "worker";
  r.task_index = rank;
  r.exit = "exit code 1";
  r.error = error;
  r.error_time = error_time;
  return r;
}

TEST(Report, ASucceededRunSaysSoWithItsRestarts) {
  TempDir dir;
  JobSpec spec = SpecIn(dir.path(), 2);
  MemoryStore store;
  ASSERT_TRUE(store.Set(keys::kRestarts, "2").ok());
  EXPECT_EQ(ReportRun(spec, store, "parts-1", Clock::now(), kExitOk, ""), kExitOk);
  RunStatus st = ReadRunStatus(spec.output_dir);
  EXPECT_EQ(st.run_id, "parts-1");
  EXPECT_EQ(st.state, RunState::kSucceeded);
  ASSERT_TRUE(st.restarts.has_value());
  EXPECT_EQ(*st.restarts, 2);
  EXPECT_FALSE(st.failure.has_value());
}

TEST(Report, TheFirstFailureByErrorFilesIsTheRootCause) {
  TempDir dir;
  JobSpec spec = SpecIn(dir.path(), 2);
  MemoryStore store;
  // Rank 1 was seen failing first, but rank 0 raised earlier (its error file's time).
  ASSERT_TRUE(store.Set(keys::kLastFailure, TaskFailure(1, 2000, "RuntimeError: peer gone").ToJson()).ok());
  ASSERT_TRUE(store.Set(keys::RoundRootCause(1), TaskFailure(0, 1000, "ValueError: bad batch").ToJson()).ok());
  ASSERT_TRUE(store.Set(keys::kRestarts, "3").ok());
  testing::internal::CaptureStderr();
  EXPECT_EQ(ReportRun(spec, store, "parts-2", Clock::now(), kExitWorkerFailed, ""), kExitWorkerFailed);
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("root cause"), std::string::npos) << said;
  EXPECT_NE(said.find("ValueError: bad batch"), std::string::npos) << said;
  RunStatus st = ReadRunStatus(spec.output_dir);
  EXPECT_EQ(st.state, RunState::kFailed);
  ASSERT_TRUE(st.failure.has_value());
  EXPECT_EQ(st.failure->rank, 1);
  ASSERT_TRUE(st.root_cause.has_value());
  EXPECT_EQ(st.root_cause->rank, 0);
  EXPECT_EQ(st.root_cause->error, "ValueError: bad batch");
}

TEST(Report, AStoreThatIsGoneIsTheErrorWhateverTheAgentsSaid) {
  TempDir dir;
  JobSpec spec = SpecIn(dir.path(), 1);
  TcpStoreServerOptions so;
  so.token = "t0ken";
  auto server = TcpStoreServer::Start(so);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto client = OpenStore((*server)->url(), "t0ken", 5s);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  (*server)->Stop();
  EXPECT_EQ(ReportRun(spec, **client, "parts-3", Clock::now(), kExitOk, ""), kExitError);
  RunStatus st = ReadRunStatus(spec.output_dir);
  EXPECT_EQ(st.exit_code.value_or(-1), kExitError);
  EXPECT_FALSE(st.store_error.empty());
}

TEST(HostStore, ALocalJobGetsAUnixSocketAndAnEtcdJobNoServer) {
  TempDir dir;
  JobSpec spec = SpecIn(dir.path(), 2);
  LaunchOptions local;
  std::string url;
  auto served = HostStore(spec, local, "t0ken", &url);
  ASSERT_TRUE(served.ok()) << served.status().ToString();
  ASSERT_TRUE(*served);
  EXPECT_EQ(url.rfind("unix:@", 0), 0u) << url;
  auto client = OpenStore(url, "t0ken", 5s);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  EXPECT_TRUE((*client)->Set("k", "v").ok());

  LaunchOptions mpi;
  mpi.placement = "mpi";
  auto tcp = HostStore(spec, mpi, "t0ken", &url);
  ASSERT_TRUE(tcp.ok());
  EXPECT_EQ(url.rfind("tcp://127.0.0.1:", 0), 0u) << url;

  spec.rendezvous = "etcd://127.0.0.1:2379";
  auto none = HostStore(spec, local, "t0ken", &url);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(*none);
  EXPECT_EQ(url, "etcd://127.0.0.1:2379");
}

TEST(AgentsSpec, TheHeartbeatGrowsOnlyWhereAgentsCrowdTheCpus) {
  TempDir dir;
  const int cpus = std::max(1, UsableCpus());
  LaunchOptions local;
  JobSpec few = SpecIn(dir.path(), 2);
  EXPECT_EQ(AgentsSpec(few, local).timeouts.heartbeat, few.timeouts.heartbeat);
  JobSpec crowd = SpecIn(dir.path(), 1000 * cpus);  // 40 s at 40 ms an agent a CPU
  EXPECT_EQ(AgentsSpec(crowd, local).timeouts.heartbeat, Duration(40s));
  crowd.timeouts.heartbeat = 60s;  // already more: kept
  EXPECT_EQ(AgentsSpec(crowd, local).timeouts.heartbeat, Duration(60s));
  LaunchOptions slurm;  // one agent a node of the allocation: no crowd here
  slurm.placement = "slurm";
  crowd.timeouts.heartbeat = 10s;
  EXPECT_EQ(AgentsSpec(crowd, slurm).timeouts.heartbeat, Duration(10s));
}

// A stand-in for `trainctl agent`: for node rank N it does what $AGENT_N says (an exit code; CODE@S:
// that code after S seconds; "sleep": until nudged or stopped; "die": SIGKILL itself unless it
// replaces a dead agent), and leaves a line in $AGENT_LOG.
constexpr const char* kStandIn = R"(#!/bin/sh
rank=""; prev=""; replaces=no
for a in "$@"; do
  [ "$prev" = "--node-rank" ] && rank=$a
  [ "$a" = "--replaces" ] && replaces=yes
  prev=$a
done
case "$rank" in -*) exit 0;; esac  # started as the fork server: serves no one
echo "$rank replaces=$replaces" >> "$AGENT_LOG"
eval "what=\${AGENT_$rank:-0}"
case $what in
  sleep) trap 'kill $! 2>/dev/null; exit 0' URG TERM; sleep 30 & wait $!; exit 0;;
  die) [ $replaces = yes ] && exit 0; kill -9 $$;;
  *@*) sleep ${what#*@}; exit ${what%@*};;
  *) exit $what;;
esac
)";

class AgentSupervisorTest : public testing::Test {
 protected:
  void SetUp() override {
    BlockSupervisorSignals();
    exe_ = dir_.path() + "/agent.sh";
    std::ofstream(exe_) << kStandIn;
    fs::permissions(exe_, fs::perms::owner_all);
    log_ = dir_.path() + "/agents.log";
    options_.self_exe = exe_;
  }
  // Runs a job of `nodes` stand-in agents with $AGENT_N = what[N] to its end.
  void Run(JobSpec& spec, const std::vector<std::string>& what) {
    std::vector<std::string> env = CurrentEnvironment();
    SetEnv(&env, "AGENT_LOG", log_);
    for (size_t n = 0; n < what.size(); ++n) SetEnv(&env, "AGENT_" + std::to_string(n), what[n]);
    supervisor_ = std::make_unique<AgentSupervisor>(spec, options_, run_id_, store_, env, Clock::now());
    const auto start = Clock::now();
    supervisor_->StartAgents();
    supervisor_->Supervise();
    supervisor_->Finish();
    took_ = Clock::now() - start;
  }
  std::string Log() {
    std::ifstream in(log_);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  TempDir dir_;
  std::string exe_, log_;
  LaunchOptions options_;
  const std::string run_id_ = "parts-9";
  MemoryStore store_;
  std::unique_ptr<AgentSupervisor> supervisor_;
  Clock::duration took_{};
};

TEST_F(AgentSupervisorTest, EveryAgentSucceedingIsASucceededJob) {
  JobSpec spec = SpecIn(dir_.path(), 3);
  Run(spec, {"0", "0", "0"});
  EXPECT_EQ(supervisor_->code, kExitOk);
  const std::string log = Log();
  for (const char* rank : {"0 ", "1 ", "2 "}) EXPECT_NE(log.find(rank), std::string::npos) << log;
  EXPECT_FALSE(store_.TryGet(keys::kStop)->has_value());
}

TEST_F(AgentSupervisorTest, AnAgentThatFailsStopsTheOthersWithItsCode) {
  JobSpec spec = SpecIn(dir_.path(), 3);
  // After a second: the others are waiting by then, as agents in a round do.
  Run(spec, {"sleep", std::to_string(kExitWorkerFailed) + "@1", "sleep"});
  EXPECT_EQ(supervisor_->code, kExitWorkerFailed);
  EXPECT_NE(supervisor_->stop_reason.find("the agent for node 1 ended with exit code 3"), std::string::npos)
      << supervisor_->stop_reason;
  // The others were told through the store and nudged, not left to the kill after the grace.
  auto stop = store_.TryGet(keys::kStop);
  ASSERT_TRUE(stop.ok() && stop->has_value());
  StopRecord rec;
  ASSERT_TRUE(StopRecord::FromJson(**stop, &rec));
  EXPECT_EQ(rec.code, kExitWorkerFailed);
  EXPECT_LT(took_, AgentGrace(spec));
}

TEST_F(AgentSupervisorTest, AFixedJobsAgentKilledIsStartedAgainForItsNode) {
  JobSpec spec = SpecIn(dir_.path(), 2);
  Run(spec, {"die", "0"});
  EXPECT_EQ(supervisor_->code, kExitOk);
  const std::string log = Log();
  EXPECT_NE(log.find("0 replaces=no"), std::string::npos) << log;
  EXPECT_NE(log.find("0 replaces=yes"), std::string::npos) << log;
}

TEST_F(AgentSupervisorTest, AKilledAgentIsStartedAgainAtMostMaxRestartsTimes) {
  JobSpec spec = SpecIn(dir_.path(), 1);
  spec.restart.max_restarts = 0;
  Run(spec, {"die"});
  EXPECT_EQ(supervisor_->code, kExitError);
  EXPECT_EQ(Log().find("replaces=yes"), std::string::npos) << Log();
}

TEST_F(AgentSupervisorTest, TimeoutsJobStopsTheAgents) {
  JobSpec spec = SpecIn(dir_.path(), 2);
  spec.timeouts.job = 1s;
  Run(spec, {"sleep", "sleep"});
  EXPECT_EQ(supervisor_->code, kExitJobTimeout);
  EXPECT_NE(supervisor_->stop_reason.find("timeouts.job"), std::string::npos) << supervisor_->stop_reason;
  EXPECT_LT(took_, AgentGrace(spec));
}

}  // namespace
}  // namespace trainctl
