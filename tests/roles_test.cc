// Jobs of several roles, end to end: the real trainctl binary running real processes of every
// role, a TF_CONFIG client that finds its peers over sockets, and each role's lifecycle.
#include <nlohmann/json.hpp>

#include "common/exit_codes.h"
#include "test_util.h"

namespace trainctl::testing {
namespace {

using std::chrono::seconds;

// No process of the run is left: every task carries TORCHELASTIC_RUN_ID in its environment.
void ExpectNoTaskLeft(const Scratch& s) {
  const std::string run_id = ReadStatus(s)["run_id"];
  EXPECT_TRUE(ProcessesWithEnv({"TORCHELASTIC_RUN_ID=" + run_id}).empty()) << "a task outlived run " << run_id;
}

class TfConfig : public ::testing::TestWithParam<int> {};

// 2 ps, 3 workers, a chief and an evaluator, on 1 or 2 nodes: every task finds its peers from
// TF_CONFIG alone, the chief's success ends the job, the ps and workers (servers that never end
// by themselves) are stopped, and the evaluator finishes.
TEST_P(TfConfig, AClientThatReadsOnlyTfConfigFindsItsPeers) {
  Scratch s;
  WriteSpec(s, "name: tf\nnodes: " + std::to_string(GetParam()) + R"(
command: [)" TRAINCTL_TEST_PYTHON R"(, )" TRAINCTL_SOURCE_DIR R"(/examples/tensorflow.py]
env: {OUT: {out}}
roles:
  - {name: ps, replicas: 2}
  - {name: worker, replicas: 3}
  - {name: chief}
  - {name: evaluator}
timeouts: {stop_grace: 5s}
output_dir: {out}/out
)");
  auto r = Trainctl({"run", "job.yaml"}, s.path(""), seconds(90));
  ASSERT_EQ(r.exit.code, 0) << r.output;
  EXPECT_EQ(s.Read("chief.txt"), "worker 0 saw ps 0,ps 1\nworker 1 saw ps 0,ps 1\nworker 2 saw ps 0,ps 1\n");
  EXPECT_EQ(s.Read("evaluator.txt"), "evaluator 0 saw chief,ps,worker\n");
  auto st = ReadStatus(s);
  EXPECT_EQ(st["state"], "succeeded") << st;
  EXPECT_EQ(st["restarts"], 0);
  for (const char* log : {"ps-0", "ps-1", "worker-0", "worker-2", "chief-0", "evaluator-0"}) {
    EXPECT_TRUE(fs::exists(s.path("out/logs/") + log + ".log")) << log;
  }
  ExpectNoTaskLeft(s);
}

INSTANTIATE_TEST_SUITE_P(Nodes, TfConfig, ::testing::Values(1, 2));

TEST(Roles, EveryTaskGetsItsRoleRankAndSize) {
  Scratch s;
  WriteSpec(s, R"(name: ranks
command: [sh, -c, 'echo "$RANK $ROLE_NAME $ROLE_RANK $ROLE_WORLD_SIZE $LOCAL_RANK $WORLD_SIZE" > {out}/task-$RANK']
roles:
  - {name: ps, replicas: 2, success: true}
  - {name: worker, replicas: 3}
output_dir: {out}/out
)");
  auto r = Trainctl({"run", "job.yaml"}, s.path(""));
  ASSERT_EQ(r.exit.code, 0) << r.output;
  EXPECT_EQ(s.Read("task-0"), "0 ps 0 2 0 5\n");
  EXPECT_EQ(s.Read("task-1"), "1 ps 1 2 1 5\n");
  EXPECT_EQ(s.Read("task-2"), "2 worker 0 3 2 5\n");
  EXPECT_EQ(s.Read("task-4"), "4 worker 2 3 4 5\n");
  // Output is prefixed with the task, as kubetail shows pods.
  EXPECT_EQ(CountLines(r.output, "[ps-1]"), 0);  // they print nothing to stdout
}

// A failed ps restarts the whole group from the job's budget; status.json names the role.
TEST(Roles, AFailedPsRestartsTheGroupAndIsNamed) {
  Scratch s;
  WriteSpec(s, R"(name: psfail
roles:
  - name: ps
    command: [sh, -c, 'echo start >> {out}/ps-starts; if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then i=0; while [ ! -s {out}/worker-0-starts ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; echo shard lost; exit 3; fi; exec sleep 60']
  - name: worker
    replicas: 2
    command: [sh, -c, 'echo start >> {out}/worker-$ROLE_RANK-starts; if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then exec sleep 60; fi; i=0; while [ $(grep -c start {out}/ps-starts) -lt 2 ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done']
restart: {max_restarts: 2}
timeouts: {stop_grace: 2s}
output_dir: {out}/out
)");
  // The ps fails once worker 0 has started (else the group's stop can come before the worker's
  // first line, on a busy machine), so that its second start shows the group restarted; the
  // workers of the second round end once the ps has said it started again (else the job can
  // succeed, and stop the ps, before its shell writes that line: 1 run in 5 did).
  auto r = Trainctl({"run", "job.yaml"}, s.path(""));
  ASSERT_EQ(r.exit.code, 0) << r.output;
  EXPECT_NE(r.output.find("ps 0 (rank 0, node 0 on"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("failed: exit code 3; restarting the worker group (restart 1 of 2)"), std::string::npos)
      << r.output;
  EXPECT_EQ(CountLines(s.Read("worker-0-starts"), "start"), 2);  // the group restarted
  EXPECT_EQ(CountLines(s.Read("ps-starts"), "start"), 2);
  auto st = ReadStatus(s);
  EXPECT_EQ(st["restarts"], 1) << st;
  ExpectNoTaskLeft(s);

  // Past the budget, the report names the role and task index.
  Scratch s2;
  WriteSpec(s2, R"(name: psfail2
roles:
  - {name: ps, replicas: 2, command: [sh, -c, 'if [ "$ROLE_RANK" = 1 ]; then echo shard 1 lost; exit 4; fi; exec sleep 60']}
  - {name: worker, command: [sleep, "60"]}
restart: {max_restarts: 0}
timeouts: {stop_grace: 2s}
output_dir: {out}/out
)");
  auto failed = Trainctl({"run", "job.yaml"}, s2.path(""));
  EXPECT_EQ(failed.exit.code, kExitWorkerFailed) << failed.output;
  EXPECT_NE(failed.output.find("failed after 0 restart(s) (max_restarts: 0): ps 1 (rank 1"), std::string::npos)
      << failed.output;
  EXPECT_NE(failed.output.find("| shard 1 lost"), std::string::npos);
  auto st2 = ReadStatus(s2);
  EXPECT_EQ(st2["failure"]["role"], "ps") << st2;
  EXPECT_EQ(st2["failure"]["task_index"], 1);
  EXPECT_EQ(st2["failure"]["kind"], "task");
  ExpectNoTaskLeft(s2);
}

// The evaluator's failure does not fail the job (its default on_failure: ignore), and it is
// reported; with on_failure: restart_job it would.
TEST(Roles, AnEvaluatorFailureIsReportedNotFatal) {
  Scratch s;
  WriteSpec(s, R"(name: evalfail
roles:
  - {name: worker, replicas: 2, command: [sh, -c, 'sleep 0.3']}
  - {name: evaluator, command: [sh, -c, 'echo no checkpoint yet; exit 5']}
output_dir: {out}/out
)");
  auto r = Trainctl({"run", "job.yaml"}, s.path(""));
  ASSERT_EQ(r.exit.code, 0) << r.output;
  EXPECT_NE(r.output.find("evaluator 0 (rank 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the job goes on without it (evaluator.on_failure: ignore)"), std::string::npos);
  auto st = ReadStatus(s);
  EXPECT_EQ(st["state"], "succeeded");
  EXPECT_EQ(st["ignored_failures"], 1) << st;
  EXPECT_EQ(st["last_ignored_failure"]["role"], "evaluator");
  EXPECT_EQ(st["restarts"], 0);

  Scratch s2;
  WriteSpec(s2, R"(name: evalfatal
roles:
  - {name: worker, command: [sleep, "30"]}
  - {name: evaluator, command: [sh, -c, 'exit 5'], on_failure: restart_job}
restart: {max_restarts: 0}
timeouts: {stop_grace: 2s}
output_dir: {out}/out
)");
  auto fatal = Trainctl({"run", "job.yaml"}, s2.path(""));
  EXPECT_EQ(fatal.exit.code, kExitWorkerFailed) << fatal.output;
}

// on_failure: restart_task restarts the failed task alone: its peers keep running.
TEST(Roles, ATaskRestartLeavesItsPeersRunning) {
  Scratch s;
  WriteSpec(s, R"(name: taskrestart
roles:
  - name: worker
    replicas: 3
    on_failure: restart_task
    command: [sh, -c, 'echo "$TRAINCTL_TASK_RESTARTS" >> {out}/starts-$ROLE_RANK; if [ "$ROLE_RANK" = 1 ] && [ "$TRAINCTL_TASK_RESTARTS" = 0 ]; then exit 9; fi; sleep 1']
restart: {max_restarts: 1}
output_dir: {out}/out
)");
  auto r = Trainctl({"run", "job.yaml"}, s.path(""));
  ASSERT_EQ(r.exit.code, 0) << r.output;
  EXPECT_EQ(s.Read("starts-0"), "0\n");  // never restarted
  EXPECT_EQ(s.Read("starts-2"), "0\n");
  EXPECT_EQ(s.Read("starts-1"), "0\n1\n");
  EXPECT_NE(r.output.find("restarting it alone (task restart 1 of 1)"), std::string::npos) << r.output;
  auto st = ReadStatus(s);
  EXPECT_EQ(st["restarts"], 0) << st;
  EXPECT_EQ(st["task_restarts"], 1);

  // The same budget: a second failure past it fails the job, without a group restart.
  Scratch s2;
  WriteSpec(s2, R"(name: taskbudget
roles:
  - {name: worker, replicas: 2, on_failure: restart_task, command: [sh, -c, 'if [ "$ROLE_RANK" = 1 ]; then exit 9; fi; sleep 20']}
restart: {max_restarts: 1}
timeouts: {stop_grace: 2s}
output_dir: {out}/out
)");
  auto spent = Trainctl({"run", "job.yaml"}, s2.path(""));
  EXPECT_EQ(spent.exit.code, kExitWorkerFailed) << spent.output;
  EXPECT_NE(spent.output.find("task restarts spent"), std::string::npos) << spent.output;
  EXPECT_EQ(ReadStatus(s2)["restarts"], 0);
  ExpectNoTaskLeft(s2);
}

// Without a chief every worker decides: the job ends when the last worker does, and the ps that
// never ends by itself is stopped then, not before.
TEST(Roles, WithoutAChiefEveryWorkerDecidesAndServicesAreStopped) {
  Scratch s;
  WriteSpec(s, R"(name: no-chief
roles:
  - {name: ps, command: [sh, -c, 'trap "echo ps stopped > {out}/ps.txt; exit 0" TERM; while true; do sleep 0.05; done']}
  - {name: worker, replicas: 2, command: [sh, -c, 'sleep 0.$((ROLE_RANK * 5 + 2)); echo done >> {out}/workers.txt']}
timeouts: {stop_grace: 5s}
output_dir: {out}/out
)");
  auto r = Trainctl({"run", "job.yaml"}, s.path(""));
  ASSERT_EQ(r.exit.code, 0) << r.output;
  EXPECT_EQ(CountLines(s.Read("workers.txt"), "done"), 2);
  EXPECT_EQ(s.Read("ps.txt"), "ps stopped\n");
  ExpectNoTaskLeft(s);
}

}  // namespace
}  // namespace trainctl::testing
