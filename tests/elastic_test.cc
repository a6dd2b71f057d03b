// Elastic, fault-tolerant jobs as users run them: real launcher, agents and workers, rounds held
// on a real etcd, a node killed, a node joining a running job, the job's restart budget.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "common/exit_codes.h"
#include "common/strings.h"
#include "tests/etcd_server.h"
#include "tests/test_util.h"

namespace trainctl::testing {
namespace {

using std::chrono::seconds;

// The agent process for `node` of run `run_id`, or -1.
pid_t AgentPid(const std::string& run_id, int node) {
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    auto argv = ProcStrings(std::stoi(name), "cmdline");
    auto has = [&](const std::string& flag, const std::string& value) {
      auto it = std::find(argv.begin(), argv.end(), flag);
      return it != argv.end() && it + 1 != argv.end() && *(it + 1) == value;
    };
    if (has("--run-id", run_id) && has("--node-rank", std::to_string(node))) return std::stoi(name);
  }
  return -1;
}

std::string RunId(const std::string& output) {
  std::smatch m;
  static const std::regex re("run ([a-z0-9-]+); logs in");
  return std::regex_search(output, m, re) ? m[1].str() : "";
}

// Each worker appends "round group_rank world_size restarts pid" to {out}/rounds when it starts.
// Then it waits; once {out}/fail exists, the worker of group rank 1 exits 9, the others exit 0.
constexpr const char* kWorker =
    "echo \"$TRAINCTL_ROUND $GROUP_RANK $WORLD_SIZE $TORCHELASTIC_RESTART_COUNT $$\" >> {out}/rounds; "
    "while [ ! -e {out}/fail ]; do sleep 0.05; done; [ \"$GROUP_RANK\" = 1 ] && exit 9; exit 0";

std::string Fill(const Scratch& s, std::string text) {
  for (size_t pos; (pos = text.find("{out}")) != std::string::npos;) text.replace(pos, 5, s.path(""));
  return text;
}

// Lines of {out}/rounds that start with `prefix` ("round group_rank world restarts").
int Started(const Scratch& s, const std::string& prefix) {
  int n = 0;
  for (const auto& line : SplitLines(s.Read("rounds"))) n += line.rfind(prefix + " ", 0) == 0;
  return n;
}

TEST(Elastic, ALostNodeShrinksTheJobAJoiningNodeGrowsItAndTheBudgetIsTheJobs) {
  const std::string etcd = "etcd://" + SharedEtcd().endpoints()[0];
  Scratch s;
  std::string spec =
      s.Write("job.yaml",
              Fill(s, "name: elastic\nnodes: {min: 1, max: 2}\nrendezvous: " + etcd +
                          "\n"
                          "restart: {max_restarts: 1}\ntimeouts: {heartbeat: 1s, last_call: 500ms, stop_grace: 2s}\n"
                          "command: [sh, -c, '" +
                          std::string(kWorker) + "']\noutput_dir: {out}/out\n"));
  Background job({"run", spec}, s.path(""), s.path("run.log"));

  // Round 0: both nodes.
  ASSERT_TRUE(Eventually([&] { return Started(s, "0 0 2 0") == 1 && Started(s, "0 1 2 0") == 1; }))
      << s.Read("rounds") << job.Output();
  const std::string run_id = RunId(job.Output());
  ASSERT_FALSE(run_id.empty()) << job.Output();
  pid_t agent1 = AgentPid(run_id, 1);
  ASSERT_GT(agent1, 0);
  pid_t worker1 = -1;
  for (const auto& line : SplitLines(s.Read("rounds"))) {
    if (line.rfind("0 1 2 0 ", 0) == 0) worker1 = std::stoi(line.substr(8));
  }

  // Node 1 is lost (its agent killed): the launcher sees it die and ends the round at once
  // (node 0 would miss its heartbeat a second later), and node 0 goes on alone. That is a
  // failure: it spends the one restart the job has.
  ASSERT_EQ(::kill(agent1, SIGKILL), 0);
  ASSERT_TRUE(Eventually([&] { return Started(s, "1 0 1 1") == 1; }, seconds(20))) << s.Read("rounds") << job.Output();
  EXPECT_TRUE(Eventually([&] { return ProcessGone(worker1); }, seconds(5))) << "orphaned worker";
  EXPECT_NE(job.Output().find("the agent for node 1 died: signal 9 (SIGKILL); the job goes on with the other nodes"),
            std::string::npos)
      << job.Output();
  EXPECT_NE(job.Output().find("round 1: 1 node(s), world size 1 (restart 1 of 1)"), std::string::npos);

  // A new node joins the running job: it is admitted at the next round, and the membership
  // change spends nothing (with max_restarts 1 spent, a spend would have ended the job).
  Background joiner({"agent", "--run-id", run_id}, s.path(""), s.path("joiner.log"), {{"TRAINCTL_AGENT_STORE", etcd}});
  ASSERT_TRUE(Eventually([&] { return Started(s, "2 0 2 1") == 1 && Started(s, "2 1 2 1") == 1; }, seconds(20)))
      << s.Read("rounds") << job.Output() << joiner.Output();
  EXPECT_NE(job.Output().find("1 node(s) waiting to join"), std::string::npos) << job.Output();
  EXPECT_NE(joiner.Output().find("round 1 is full (1 of max 2 nodes)"), std::string::npos) << joiner.Output();

  // The next failure is past the job's budget, though the node it happens on never restarted.
  s.Write("fail", "");
  ExitInfo exit = job.Wait(seconds(30));
  EXPECT_EQ(exit.code, kExitWorkerFailed) << job.Output();
  EXPECT_EQ(joiner.Wait(seconds(30)).code, kExitWorkerFailed) << joiner.Output();
  EXPECT_NE(job.Output().find("job elastic failed after 1 restart(s) (max_restarts: 1): worker 1 (rank 1"),
            std::string::npos)
      << job.Output();
  auto status = nlohmann::json::parse(s.Read("out/status.json"));
  EXPECT_EQ(status["restarts"], 1) << status;
  EXPECT_EQ(Started(s, "3"), 0) << s.Read("rounds");
}

// The pids of the workers that {out}/rounds says started with `prefix`.
std::vector<pid_t> WorkerPids(const Scratch& s, const std::string& prefix) {
  std::vector<pid_t> pids;
  for (const auto& line : SplitLines(s.Read("rounds"))) {
    if (line.rfind(prefix + " ", 0) == 0) pids.push_back(std::stoi(line.substr(line.rfind(' ') + 1)));
  }
  return pids;
}

// A fixed-size job's agent killed (the OOM killer, a kill) is started again by the local launcher,
// as Kubernetes replaces a pod: the launcher ends the round at once (the heartbeat here would take
// a minute), which spends a restart, and the job goes on with every node in the next round. Once
// the budget is spent, the next killed agent ends the job, reported as a lost node.
TEST(Elastic, AKilledAgentOfAFixedSizeJobIsStartedAgainWithinTheRestartBudget) {
  for (int killed : {0, 1}) {
    SCOPED_TRACE("the agent of node " + std::to_string(killed) + " killed");
    Scratch s;
    std::string spec = s.Write(
        "job.yaml",
        Fill(s,
             "name: fixed\nnodes: 2\nrestart: {max_restarts: 1}\ntimeouts: {stop_grace: 2s, heartbeat: 60s}\n"
             "command: [sh, -c, 'echo \"$TRAINCTL_ROUND $GROUP_RANK $WORLD_SIZE $TORCHELASTIC_RESTART_COUNT $$\" "
             ">> {out}/rounds; while [ ! -e {out}/done ]; do sleep 0.05; done']\noutput_dir: {out}/out\n"));
    Background job({"run", spec}, s.path(""), s.path("run.log"));
    ASSERT_TRUE(Eventually([&] { return Started(s, "0 0 2 0") + Started(s, "0 1 2 0") == 2; }))
        << s.Read("rounds") << job.Output();
    const std::string run_id = RunId(job.Output());
    const std::vector<pid_t> first = WorkerPids(s, "0");
    pid_t agent = AgentPid(run_id, killed);
    ASSERT_GT(agent, 0);
    ASSERT_EQ(::kill(agent, SIGKILL), 0);
    // Round 1 has both nodes again, and round 0's workers are gone.
    ASSERT_TRUE(Eventually([&] { return Started(s, "1 0 2 1") + Started(s, "1 1 2 1") == 2; }))
        << s.Read("rounds") << job.Output();
    for (pid_t p : first) EXPECT_TRUE(Eventually([p] { return ProcessGone(p); }, seconds(10))) << p;
    EXPECT_NE(job.Output().find("the agent for node " + std::to_string(killed) +
                                " died: signal 9 (SIGKILL); started it again"),
              std::string::npos)
        << job.Output();
    pid_t again = AgentPid(run_id, killed);
    ASSERT_GT(again, 0);
    EXPECT_NE(again, agent);

    if (killed == 0) {  // the job goes on to succeed
      s.Write("done", "");
      ExitInfo exit = job.Wait(seconds(30));
      EXPECT_EQ(exit.code, kExitOk) << job.Output();
      EXPECT_EQ(ReadStatus(s)["restarts"], 1) << s.Read("out/status.json");
      continue;
    }
    // The one restart is spent: the next killed agent ends the job.
    ASSERT_EQ(::kill(again, SIGKILL), 0);
    ExitInfo exit = job.Wait(seconds(30));
    EXPECT_EQ(exit.code, kExitWorkerFailed) << job.Output();
    EXPECT_NE(job.Output().find("job fixed failed after 1 restart(s) (max_restarts: 1): node 1 ("), std::string::npos)
        << job.Output();
    EXPECT_NE(job.Output().find("was lost: its agent died: signal 9 (SIGKILL)"), std::string::npos) << job.Output();
    auto status = ReadStatus(s);
    EXPECT_EQ(status["failure"]["kind"], "node_lost") << status;
    auto shown = Trainctl({"status", run_id}, s.path(""), seconds(30));
    EXPECT_NE(shown.output.find("failure   node 1 ("), std::string::npos) << shown.output;
    EXPECT_NE(shown.output.find("was lost: its agent died: signal 9 (SIGKILL)"), std::string::npos) << shown.output;
    EXPECT_EQ(Started(s, "2"), 0) << s.Read("rounds");
    for (pid_t p : WorkerPids(s, "1")) EXPECT_TRUE(Eventually([p] { return ProcessGone(p); }, seconds(10))) << p;
  }
}

// A task that is stopped (SIGSTOP) is named as the failure within seconds, with its
// last line, instead of by its peers' collective timeout a minute later (finding 8 of issue 49).
TEST(Elastic, AStoppedTaskIsNamedWithinSeconds) {
  Scratch s;
  s.Write("job.yaml", "name: stuck\nprocs_per_node: 2\nrestart: {max_restarts: 0}\noutput_dir: " + s.path("out") +
                          "\ncommand: [sh, -c, 'echo rank $RANK working; if [ $RANK = 1 ]; then kill -STOP $$; fi; "
                          "sleep 120']\n");
  const auto start = Clock::now();
  auto r = Trainctl({"run", "job.yaml"}, s.path(""), seconds(60));
  EXPECT_EQ(r.exit.code, kExitWorkerFailed) << r.output;
  EXPECT_LT(SecondsSince(start), 40) << r.output;  // not the minute of a collective timeout
  EXPECT_NE(r.output.find("worker 1 (rank 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("from trainctl: it was stopped (SIGSTOP) for 5"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 1 working"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace trainctl::testing
