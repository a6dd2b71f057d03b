// The job's contracts: what the agent writes, tasks read back the same; placement and TF_CONFIG.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/subprocess.h"
#include "job/agent_command.h"
#include "job/records.h"
#include "job/run_status.h"
#include "job/runs.h"
#include "job/task_env.h"
#include "job/tasks.h"

namespace trainctl {
namespace {

// The run index (what `trainctl ps` lists) keeps the newest `keep` entries, and every entry
// whose launcher still runs however old it is; it stays untouched until it holds more.
TEST(Runs, TheIndexKeepsTheNewestEntriesAndEveryLiveOne) {
  char tmpl[] = "/tmp/runs-test-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  ASSERT_EQ(::setenv("TRAINCTL_STATE_DIR", tmpl, 1), 0);
  const auto entry = [](const std::string& id, int64_t started, bool live) {
    runs::RunEntry e;
    e.name = "job";
    e.run_id = id;
    e.output_dir = "/nonexistent";
    e.started = started;
    e.pid = live ? ::getpid() : 0;
    e.start_ticks = live ? runs::StartTicks(::getpid()) : 0;
    return e;
  };
  const auto ids = [] {
    std::vector<std::string> out;
    for (const auto& e : runs::List()) out.push_back(e.run_id);
    return out;
  };
  ASSERT_TRUE(runs::Register(entry("live", 100, true), 3).ok());  // the oldest, but running
  for (int i = 1; i <= 3; ++i) ASSERT_TRUE(runs::Register(entry("r" + std::to_string(i), 100 + i, false), 3).ok());
  EXPECT_EQ(ids(), (std::vector<std::string>{"r3", "r2", "r1", "live"}));  // four: the live one stays
  ASSERT_TRUE(runs::Register(entry("r4", 104, false), 3).ok());
  ASSERT_TRUE(runs::Register(entry("r5", 105, false), 3).ok());
  EXPECT_EQ(ids(), (std::vector<std::string>{"r5", "r4", "r3", "live"}));
  ::unsetenv("TRAINCTL_STATE_DIR");
  std::filesystem::remove_all(tmpl);
}

// The evaluator task's "since": its own run's start from status.json, else 0 (its own start).
TEST(Runs, ARunsStartComesFromItsStatusFileAndNoOthers) {
  char dir[] = "/tmp/runs-started-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string status = std::string(dir) + "/status.json";
  auto write = [&](const std::string& text) {
    FILE* f = std::fopen(status.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(text.c_str(), f);
    std::fclose(f);
  };
  EXPECT_EQ(runs::RunStarted(dir, "job-1"), 0) << "no status.json";
  write(R"({"job": "job", "run_id": "job-1", "started": 1795764436, "state": "running"})");
  EXPECT_EQ(runs::RunStarted(dir, "job-1"), 1795764436);
  EXPECT_EQ(runs::RunStarted(dir, "job-2"), 0) << "another run's status";
  write(R"({"run_id": "job-1", "started": "yesterday"})");
  EXPECT_EQ(runs::RunStarted(dir, "job-1"), 0);
  write(R"({"run_id": 7, "started": 1795764436})");
  EXPECT_EQ(runs::RunStarted(dir, "job-1"), 0) << "a run id of another type (this threw type_error)";
  write("{\"run_id\": \"job-1\", \"sta");
  EXPECT_EQ(runs::RunStarted(dir, "job-1"), 0) << "a torn file";
  std::filesystem::remove_all(dir);
}

TEST(TaskEnv, WhatTheAgentWritesATaskReadsBack) {
  TaskEnv e;
  e.rank = 5;
  e.local_rank = 1;
  e.world_size = 6;
  e.local_world_size = 3;
  e.group_rank = 1;
  e.group_world_size = 2;
  e.role_name = "ps";
  e.role_rank = 1;
  e.role_world_size = 2;
  e.master_addr = "10.0.0.1";
  e.master_port = 29500;
  e.restart_count = 2;
  e.max_restarts = 3;
  e.run_id = "job-1a2b";
  e.tf_config = R"({"task":{"type":"ps","index":1}})";
  e.job_name = "job";
  e.output_dir = "/out";
  e.checkpoint_dir = "/out/ck";
  e.store_addr = "tcp://10.0.0.1:4000";
  e.store_token = "secret";
  e.store_prefix = "/trainctl/job-1a2b/";
  e.host = "10.0.0.2";
  e.task_addr = "10.0.0.2:4100";
  e.round = 4;
  e.task_restarts = 1;
  e.tty = true;
  std::vector<std::string> env = {"PATH=/bin", "RANK=99"};
  e.ApplyTo(&env);
  // torchrun's names, as a PyTorch program reads them.
  EXPECT_EQ(GetEnv(env, "RANK"), "5");
  EXPECT_EQ(GetEnv(env, "ROLE_NAME"), "ps");
  EXPECT_EQ(GetEnv(env, "MASTER_PORT"), "29500");
  EXPECT_EQ(GetEnv(env, "TORCHELASTIC_RUN_ID"), "job-1a2b");
  EXPECT_EQ(GetEnv(env, "TORCHELASTIC_USE_AGENT_STORE"), "False");
  EXPECT_EQ(GetEnv(env, "PATH"), "/bin");
  auto back = TaskEnv::FromEnv(env);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->rank, 5);
  EXPECT_EQ(back->local_world_size, 3);
  EXPECT_EQ(back->role_name, "ps");
  EXPECT_EQ(back->role_rank, 1);
  EXPECT_EQ(back->master_addr, "10.0.0.1");
  EXPECT_EQ(back->tf_config, e.tf_config);
  EXPECT_EQ(back->store_token, "secret");
  EXPECT_EQ(back->task_addr, "10.0.0.2:4100");
  EXPECT_EQ(back->round, 4);
  EXPECT_EQ(back->task_restarts, 1);
  EXPECT_TRUE(back->tty);
}

TEST(TaskEnv, AJobWithoutRolesHasNoTfConfig) {
  TaskEnv e;
  e.store_addr = "tcp://127.0.0.1:1";
  std::vector<std::string> env;
  e.ApplyTo(&env);
  EXPECT_FALSE(GetEnv(env, "TF_CONFIG"));
  EXPECT_FALSE(GetEnv(env, "TRAINCTL_TASK_ADDR"));
  EXPECT_FALSE(GetEnv(env, "TRAINCTL_TTY"));
}

TEST(TaskEnv, MissingOrMalformedVariablesAreNamed) {
  auto missing = TaskEnv::FromEnv({"WORLD_SIZE=2", "TRAINCTL_STORE_ADDR=tcp://x:1"});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("RANK is not set"), std::string::npos);
  auto bad = TaskEnv::FromEnv({"RANK=one", "WORLD_SIZE=2", "TRAINCTL_STORE_ADDR=tcp://x:1"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("RANK=one: expected a whole number"), std::string::npos);
  auto outside = TaskEnv::FromEnv({"RANK=2", "WORLD_SIZE=2", "TRAINCTL_STORE_ADDR=tcp://x:1"});
  EXPECT_FALSE(outside.ok());
}

TEST(TaskEnv, ReservedNamesCoverEverythingTheAgentSets) {
  TaskEnv e;
  e.tf_config = "{}";
  e.task_addr = "h:1";
  e.tty = true;
  std::vector<std::string> env;
  e.ApplyTo(&env);
  for (const auto& kv : env) {
    const std::string name = kv.substr(0, kv.find('='));
    EXPECT_TRUE(IsReservedEnvName(name)) << name;
  }
  EXPECT_TRUE(IsReservedEnvName("TRAINCTL_ANYTHING"));
  EXPECT_FALSE(IsReservedEnvName("DATA_DIR"));
}

TEST(Records, FailureAndStopRecordsRoundTrip) {
  FailureRecord r;
  r.kind = FailureKind::kTask;
  r.round = 3;
  r.restarts = 2;
  r.node_rank = 1;
  r.host = "h:12";
  r.rank = 4;
  r.local_rank = 1;
  r.role = "ps";
  r.task_index = 0;
  r.pid = 77;
  r.exit = "exit code 3";
  r.last_lines = {"a", "b"};
  auto back = FailureRecord::FromJson(r.ToJson());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->ToJson(), r.ToJson());
  EXPECT_EQ(back->Summary(), "ps 0 (rank 4, node 1 on h:12, local rank 1, pid 77) failed: exit code 3");
  EXPECT_TRUE(back->failure());
  r.kind = FailureKind::kSucceeded;
  EXPECT_FALSE(r.failure());
  EXPECT_EQ(FailureRecord::FromJson(r.ToJson())->kind, FailureKind::kSucceeded);
  EXPECT_FALSE(FailureRecord::FromJson("{\"kind\": \"worker\"}").ok());
  EXPECT_FALSE(FailureRecord::FromJson("not json").ok());

  StopRecord stop{"interrupted by SIGINT", 130}, parsed;
  ASSERT_TRUE(StopRecord::FromJson(stop.ToJson(), &parsed));
  EXPECT_EQ(parsed.reason, stop.reason);
  EXPECT_EQ(parsed.code, 130);
  EXPECT_FALSE(StopRecord::FromJson("plain text", &parsed));
}

// status.json: what the launcher writes, ps/status/bench/the dashboard read back the same, and a
// file that a user edited or another version wrote is read for what it holds, never thrown on.
TEST(RunStatus, WhatIsWrittenIsReadBackAndABadFieldIsAsIfMissing) {
  char tmpl[] = "/tmp/run-status-test-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  EXPECT_FALSE(ReadRunStatus(dir).known());  // no file yet

  RunStatus s;
  s.job = "mnist";
  s.run_id = "mnist-1a2b";
  s.state = StateOfExit(3);
  s.exit_code = 3;
  s.restarts = 2;
  s.elapsed = "1m30s";
  s.task_restarts = 0;
  FailureRecord f;
  f.kind = FailureKind::kNodeLost;
  f.round = 2;
  f.host = "h:9";
  f.exit = "its agent died: signal 9 (SIGKILL)";
  s.failure = f;
  ASSERT_TRUE(WriteRunStatus(dir, s).ok());
  const RunStatus back = ReadRunStatus(dir);
  EXPECT_EQ(back.ToJson(), s.ToJson());
  EXPECT_EQ(back.state, RunState::kFailed);
  ASSERT_TRUE(back.failure.has_value());
  EXPECT_EQ(back.failure->Summary(), "node 0 (h:9) was lost: its agent died: signal 9 (SIGKILL)");
  EXPECT_EQ(back.task_restarts, 0);  // present and zero is not absent
  EXPECT_FALSE(back.ignored_failures.has_value());
  EXPECT_FALSE(back.ToJson().contains("pid"));  // absent fields are left out

  // Another version's file: a number as text, a record with fields missing and one mistyped.
  const auto odd = RunStatus::FromJson(nlohmann::json::parse(R"({
    "job": "j", "run_id": "r", "state": "failed", "exit_code": "3", "restarts": 1.5, "started": 17,
    "failure": {"kind": "from-the-future", "rank": "two", "host": "h", "exit": "exit code 1",
                "last_lines": ["x", 7, "y"]},
    "root_cause": "not an object", "extra": true})"));
  EXPECT_EQ(odd.run_id, "r");
  EXPECT_FALSE(odd.exit_code.has_value());
  EXPECT_FALSE(odd.restarts.has_value());
  EXPECT_EQ(odd.started, 17);
  ASSERT_TRUE(odd.failure.has_value());
  EXPECT_EQ(odd.failure->kind, FailureKind::kTask);
  EXPECT_EQ(odd.failure->rank, -1);
  EXPECT_EQ(odd.failure->last_lines, (std::vector<std::string>{"x", "y"}));
  EXPECT_FALSE(odd.root_cause.has_value());
  EXPECT_FALSE(RunStatus::FromJson(nlohmann::json::array()).known());

  EXPECT_STREQ(RunStateName(StateOfExit(0)), "succeeded");
  EXPECT_STREQ(RunStateName(StateOfExit(130)), "interrupted");
  EXPECT_STREQ(RunStateName(StateOfExit(5)), "timed-out");
  EXPECT_STREQ(RunStateName(StateOfExit(77)), "error");
  // Every state's name reads back as it; a name this version does not know (a newer writer's, an
  // edit) reads as unknown, which nothing takes for running or for a failure.
  for (int i = 0; i <= static_cast<int>(RunState::kLost); ++i) {
    const auto state = static_cast<RunState>(i);
    EXPECT_EQ(ParseRunState(RunStateName(state)), state) << RunStateName(state);
  }
  EXPECT_EQ(RunStatus::FromJson(nlohmann::json::parse(R"({"run_id": "r", "state": "paused"})")).state,
            RunState::kUnknown);
  EXPECT_FALSE(JobFailed(RunState::kUnknown));
  EXPECT_TRUE(JobFailed(RunState::kLost));
  EXPECT_FALSE(JobFailed(RunState::kInterrupted));
  std::filesystem::remove_all(dir);
}

TEST(Tasks, OneRoleIsTorchrunsLayout) {
  auto tasks = PlaceTasks({{"worker", 6}}, 2);
  ASSERT_EQ(tasks.size(), 6u);
  for (const auto& t : tasks) {
    EXPECT_EQ(t.node, t.rank / 3);
    EXPECT_EQ(t.local, t.rank % 3);
    EXPECT_EQ(t.local_size, 3);
    EXPECT_EQ(t.index, t.rank);
    EXPECT_EQ(t.role_size, 6);
  }
  EXPECT_EQ(TasksOfNode(tasks, 1).front().rank, 3);
}

TEST(Tasks, RolesAreSpreadOverNodesAndOneTaskPerNodeIsNodeN) {
  std::vector<RoleSize> roles = {{"ps", 2}, {"worker", 3}, {"chief", 1}};
  auto one = PlaceTasks(roles, 1);
  ASSERT_EQ(one.size(), 6u);
  EXPECT_EQ(one[2].role, "worker");
  EXPECT_EQ(one[2].index, 0);
  EXPECT_EQ(one[5].local, 5);
  auto each = PlaceTasks(roles, 6);
  for (const auto& t : each) EXPECT_EQ(t.node, t.rank);
  // Every task is on exactly one node, and nodes' shares differ by at most one.
  auto four = PlaceTasks(roles, 4);
  std::vector<int> per(4, 0);
  for (const auto& t : four) per[t.node]++;
  EXPECT_EQ(*std::max_element(per.begin(), per.end()) - *std::min_element(per.begin(), per.end()), 1);
}

// What each agent places for itself is its share of the whole placement, field by field.
TEST(Tasks, ANodesOwnPlacementIsItsShareOfTheWhole) {
  const std::vector<std::vector<RoleSize>> jobs = {
      {{"worker", 6}}, {{"ps", 2}, {"worker", 3}, {"chief", 1}}, {{"worker", 1024}}, {{"a", 0}, {"b", 5}}};
  for (const auto& roles : jobs) {
    for (int nodes : {1, 2, 3, 4, 6, 7}) {
      const auto all = PlaceTasks(roles, nodes);
      for (int node = 0; node < nodes; ++node) {
        SCOPED_TRACE(std::to_string(nodes) + " nodes, node " + std::to_string(node));
        const auto expected = TasksOfNode(all, node);
        const auto mine = PlaceNodeTasks(roles, nodes, node);
        ASSERT_EQ(mine.size(), expected.size());
        for (size_t i = 0; i < mine.size(); ++i) {
          EXPECT_EQ(std::tie(mine[i].rank, mine[i].role, mine[i].index, mine[i].role_size, mine[i].node, mine[i].local,
                             mine[i].local_size),
                    std::tie(expected[i].rank, expected[i].role, expected[i].index, expected[i].role_size,
                             expected[i].node, expected[i].local, expected[i].local_size));
        }
      }
    }
  }
}

TEST(Tasks, TfConfigIsKubeflowsWithTheEvaluatorOutsideTheCluster) {
  auto tasks = PlaceTasks({{"chief", 1}, {"ps", 2}, {"worker", 2}, {"evaluator", 1}}, 2);
  std::vector<std::string> addrs = {"h0:1", "h0:2", "h0:3", "h1:1", "h1:2", "h1:3"};
  auto w1 = nlohmann::json::parse(TfConfig(tasks, addrs, tasks[4]));
  EXPECT_EQ(w1["task"]["type"], "worker");
  EXPECT_EQ(w1["task"]["index"], 1);
  EXPECT_EQ(w1["environment"], "cloud");
  EXPECT_EQ(w1["cluster"]["chief"], nlohmann::json({"h0:1"}));
  EXPECT_EQ(w1["cluster"]["ps"], nlohmann::json({"h0:2", "h0:3"}));
  EXPECT_EQ(w1["cluster"]["worker"], nlohmann::json({"h1:1", "h1:2"}));
  EXPECT_FALSE(w1["cluster"].contains("evaluator"));
  auto ev = nlohmann::json::parse(TfConfig(tasks, addrs, tasks[5]));
  EXPECT_EQ(ev["task"]["type"], "evaluator");
  EXPECT_EQ(ev["task"]["index"], 0);
}

TEST(AgentCommand, TheFlagsTheAgentParses) {
  AgentCommand c;
  c.trainctl = "/bin/trainctl";
  c.log_level = "debug";
  c.node_rank = "$(JOB_COMPLETION_INDEX)";
  c.run_id = "r";
  c.host = "$(POD_IP)";
  c.spec_file = "/etc/trainctl/job.json";
  c.serve_store = true;
  c.leave_on_signal = true;
  EXPECT_EQ(c.Argv(), (std::vector<std::string>{"/bin/trainctl", "--log-level", "debug", "agent", "--spec",
                                                "/etc/trainctl/job.json", "--run-id", "r", "--node-rank",
                                                "$(JOB_COMPLETION_INDEX)", "--host", "$(POD_IP)", "--serve-store",
                                                "--leave-on-signal"}));
  AgentCommand local;
  local.run_id = "r";
  EXPECT_EQ(local.Argv(), (std::vector<std::string>{"trainctl", "agent", "--run-id", "r", "--node-rank", "-1"}));
}

}  // namespace
}  // namespace trainctl
