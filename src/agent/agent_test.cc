// The agent's policies in-process: a fake machine (a clock the agent's own waits move, its waits
// for store keys and the rendezvous's among them; tasks whose exits each test scripts) and a
// MemoryStore, so that a restart budget, a back-off, a lost peer or a scale-up with an hour's last
// call is tested in milliseconds without starting a process. The process tests
// (tests/cli_test.cc and others) cover the same agent on the real machine.
#include "agent/agent.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <thread>

#include "agent/launch.h"
#include "common/exit_codes.h"
#include "common/subprocess.h"
#include "job/keys.h"
#include "job/paths.h"
#include "store/memory/memory_store.h"

namespace trainctl {
namespace {

using namespace std::chrono_literals;

// How a task ends: after `after` (from its start, on the fake clock) with exit code `code`.
struct Fate {
  Duration after;
  int code;
};
// (the group's start, counted from 1; local rank; that task's attempt in the round, from 0):
// its fate, or nullopt to run until stopped.
using Script = std::function<std::optional<Fate>(int start, int local_rank, int attempt)>;

class FakeEnv;

class FakeTasks : public TaskGroup {
 public:
  FakeTasks(FakeEnv* env, int start) : env_(env), start_(start) {}
  Status Start(const std::vector<WorkerLaunch>& workers) override;
  Status Restart(int local_rank, const WorkerLaunch& launch) override;
  std::vector<WorkerExit> ReapExited() override;
  std::vector<pid_t> Pids() const override {
    std::vector<pid_t> pids;
    for (const auto& t : tasks_) pids.push_back(t.exited ? 0 : 1000 + t.launch.local_rank);
    return pids;
  }
  bool Exited(int local_rank) const override { return tasks_[local_rank].exited; }
  void StopSome(const std::vector<int>& local_ranks, Duration) override {
    for (int l : local_ranks) tasks_[l].exited = true;
  }
  void Stop(Duration) override;
  std::vector<std::pair<int, std::string>> KillStuck(Duration, Duration) override { return {}; }
  std::vector<std::string> Tail(int local_rank, Duration) override {
    return {"last words of " + tasks_[local_rank].launch.label};
  }
  int WaitSignal(Duration wait) override;

 private:
  struct Fake {
    WorkerLaunch launch;
    int attempt = 0;
    Clock::time_point started;
    std::optional<Fate> fate;
    bool exited = false;
  };
  void Begin(Fake* t);
  FakeEnv* env_;
  int start_;
  std::vector<Fake> tasks_;
};

class FakeEnv : public AgentEnv {
 public:
  explicit FakeEnv(Script script) : script_(std::move(script)) {}
  Clock::time_point Now() const override { return now_; }
  // Time passes only as the agent waits; a task's exit due meanwhile ends the wait then.
  int WaitSignal(Duration wait) override {
    const Clock::time_point until = now_ + std::max(wait, Duration(1));
    if (next_exit_ && *next_exit_ <= until) {
      now_ = std::max(now_, *next_exit_);
      next_exit_.reset();
      return SIGCHLD;
    }
    now_ = until;
    return 0;
  }
  // Keys that are not there yet: the whole wait passes on this clock, at once.
  Result<std::pair<size_t, std::string>> WaitForAny(Store& store, const std::vector<std::string>& keys,
                                                    Duration timeout) override {
    ASSIGN_OR_RETURN(auto values, store.TryGetMany(keys));
    for (size_t i = 0; i < values.size(); ++i) {
      if (values[i]) return std::make_pair(i, *values[i]);
    }
    now_ += std::max(timeout, Duration(1));
    return Timeout("no " + keys[0]);
  }
  int StopSignal() override {
    if (stop_at_ && now_ >= *stop_at_) {
      stop_at_.reset();
      return SIGTERM;
    }
    return 0;
  }
  std::optional<std::string> GetEnv(const std::string&) const override { return std::nullopt; }
  long Pid() const override { return 4242; }
  std::unique_ptr<TaskGroup> NewTaskGroup(bool, WorkerForks*) override {
    return std::make_unique<FakeTasks>(this, ++groups_);
  }

  Script script_;
  Clock::time_point now_ = Clock::now();
  std::optional<Clock::time_point> next_exit_;
  std::optional<Clock::time_point> stop_at_;  // a SIGTERM arrives then
  int groups_ = 0;
  std::vector<Clock::time_point> starts;    // when each group started
  std::vector<Clock::time_point> failures;  // when a task exited non-zero
  std::vector<WorkerLaunch> restarted;      // single-task restarts
  int stops = 0;
};

int FakeTasks::WaitSignal(Duration wait) { return env_->WaitSignal(wait); }

void FakeTasks::Begin(Fake* t) {
  t->started = env_->now_;
  t->exited = false;
  t->fate = env_->script_(start_, t->launch.local_rank, t->attempt);
  if (t->fate) {
    const auto due = t->started + t->fate->after;
    if (!env_->next_exit_ || due < *env_->next_exit_) env_->next_exit_ = due;
  }
}

Status FakeTasks::Start(const std::vector<WorkerLaunch>& workers) {
  env_->starts.push_back(env_->now_);
  for (const auto& w : workers) {
    Fake t;
    t.launch = w;
    tasks_.push_back(t);
  }
  for (auto& t : tasks_) Begin(&t);
  return Status::Ok();
}

Status FakeTasks::Restart(int local_rank, const WorkerLaunch& launch) {
  env_->restarted.push_back(launch);
  Fake& t = tasks_[local_rank];
  t.launch = launch;
  ++t.attempt;
  Begin(&t);
  return Status::Ok();
}

std::vector<WorkerExit> FakeTasks::ReapExited() {
  std::vector<WorkerExit> out;
  for (auto& t : tasks_) {
    if (t.exited || !t.fate || t.started + t.fate->after > env_->now_) continue;
    t.exited = true;
    WorkerExit e;
    e.local_rank = t.launch.local_rank;
    e.rank = t.launch.rank;
    e.pid = 1000 + t.launch.local_rank;
    e.exit.code = t.fate->code;
    out.push_back(e);
    if (t.fate->code != 0) env_->failures.push_back(env_->now_);
  }
  // The next exit still due, for WaitSignal.
  env_->next_exit_.reset();
  for (auto& t : tasks_) {
    if (t.exited || !t.fate) continue;
    const auto due = t.started + t.fate->after;
    if (!env_->next_exit_ || due < *env_->next_exit_) env_->next_exit_ = due;
  }
  return out;
}

void FakeTasks::Stop(Duration) {
  ++env_->stops;
  for (auto& t : tasks_) t.exited = true;
}

// A job spec for these tests, with an output directory of its own.
class AgentPolicy : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/agent-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  AgentOptions Options(const std::string& yaml, int node_rank = 0) {
    auto spec = ParseJobSpec("name: policy\ncommand: [/bin/true]\noutput_dir: " + dir_ + "\n" + yaml, "policy.yaml");
    EXPECT_TRUE(spec.ok()) << spec.status().ToString();
    AgentOptions o;
    if (spec.ok()) o.spec = *spec;
    o.node_rank = node_rank;
    o.run_id = "policy-1";
    return o;
  }
  std::optional<FailureRecord> End(int round) {
    auto text = store_.TryGet(keys::RoundEnd(round));
    if (!text.ok() || !text->has_value()) return std::nullopt;
    auto rec = FailureRecord::FromJson(**text);
    return rec.ok() ? std::optional<FailureRecord>(*rec) : std::nullopt;
  }
  std::string Key(const std::string& key) {
    auto v = store_.TryGet(key);
    return v.ok() && v->has_value() ? **v : "(none)";
  }

  std::string dir_;
  MemoryStore store_;
};

Duration Since(Clock::time_point a, Clock::time_point b) { return std::chrono::duration_cast<Duration>(b - a); }

// restart_job: a failed task ends the round and the group starts again, failures in a row
// backing off (0, backoff, 2 x backoff), until the failure past max_restarts ends the job.
TEST_F(AgentPolicy, AFailedTaskRestartsTheGroupWithBackOffUntilTheBudgetIsSpent) {
  FakeEnv env([](int, int local, int) -> std::optional<Fate> {
    if (local == 1) return Fate{1s, 1};
    return std::nullopt;
  });
  Agent agent(Options("procs_per_node: 2\nrestart: {max_restarts: 2, backoff: 10s, backoff_max: 60s}\n"), &store_,
              &env);
  EXPECT_EQ(agent.Run(), kExitWorkerFailed);
  ASSERT_EQ(env.starts.size(), 3u);
  ASSERT_EQ(env.failures.size(), 3u);
  EXPECT_LT(Since(env.failures[0], env.starts[1]), 1s);   // the first failure: at once
  EXPECT_GE(Since(env.failures[1], env.starts[2]), 10s);  // then restart.backoff
  EXPECT_LT(Since(env.failures[1], env.starts[2]), 11s);
  EXPECT_EQ(Key(keys::kRestarts), "2");
  auto last = FailureRecord::FromJson(Key(keys::kLastFailure));
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->round, 2);
  EXPECT_EQ(last->rank, 1);
  EXPECT_EQ(last->exit, "exit code 1");
  EXPECT_EQ(last->restarts, 3);
  EXPECT_EQ(last->last_lines, std::vector<std::string>{"last words of worker-1"});
  EXPECT_EQ(env.stops, 3);  // each failed round stopped its other task
}

// A failure in a row after a round that ran past backoff_max restarts at once again.
TEST_F(AgentPolicy, ARoundThatRanLongerThanBackOffMaxRestartsTheCountOfFailuresInARow) {
  FakeEnv env([](int start, int, int) -> std::optional<Fate> {
    if (start == 3) return Fate{1s, 0};
    return Fate{start == 2 ? 90s : 1s, 1};
  });
  Agent agent(Options("restart: {max_restarts: 3, backoff: 10s, backoff_max: 60s}\n"), &store_, &env);
  EXPECT_EQ(agent.Run(), kExitOk);
  ASSERT_EQ(env.starts.size(), 3u);
  EXPECT_LT(Since(env.failures[1], env.starts[2]), 1s);
  EXPECT_EQ(End(2)->kind, FailureKind::kSucceeded);
  EXPECT_EQ(End(2)->restarts, 2);
  EXPECT_EQ(Key(keys::kRestarts), "2");
}

// restart_task: the failed task alone starts again (its peers go on), from the same budget
// counted apart; once that is spent, the job fails with a record that says so.
TEST_F(AgentPolicy, RestartTaskRestartsOneTaskAloneUntilTaskRestartsAreSpent) {
  FakeEnv env([](int, int local, int) -> std::optional<Fate> {
    if (local == 0) return Fate{2s, 1};  // every attempt fails
    return std::nullopt;
  });
  Agent agent(Options("roles: [{name: worker, replicas: 2, on_failure: restart_task}]\nrestart: {max_restarts: 2}\n"),
              &store_, &env);
  EXPECT_EQ(agent.Run(), kExitWorkerFailed);
  EXPECT_EQ(env.starts.size(), 1u);  // never a group restart
  ASSERT_EQ(env.restarted.size(), 2u);
  EXPECT_NE(env.restarted[0].log_header.find("task restart 1"), std::string::npos) << env.restarted[0].log_header;
  EXPECT_NE(env.restarted[1].log_header.find("task restart 2"), std::string::npos);
  EXPECT_EQ(Key(keys::kTaskRestarts), "3");
  auto end = End(0);
  ASSERT_TRUE(end.has_value());
  EXPECT_TRUE(end->final);
  EXPECT_NE(end->exit.find("task restarts spent"), std::string::npos) << end->exit;
}

// on_failure: ignore (the evaluator's default): reported, counted, and the job goes on to succeed.
TEST_F(AgentPolicy, AnIgnoredFailureIsCountedAndTheJobGoesOn) {
  FakeEnv env([](int, int local, int) -> std::optional<Fate> {
    if (local == 2) return Fate{1s, 7};  // the evaluator
    return Fate{5s, 0};
  });
  Agent agent(Options("roles: [{name: worker, replicas: 2}, {name: evaluator}]\n"), &store_, &env);
  EXPECT_EQ(agent.Run(), kExitOk);
  EXPECT_EQ(env.starts.size(), 1u);
  EXPECT_EQ(Key(keys::kIgnoredFailures), "1");
  auto ignored = FailureRecord::FromJson(Key(keys::kLastIgnoredFailure));
  ASSERT_TRUE(ignored.ok());
  EXPECT_EQ(ignored->role, "evaluator");
  EXPECT_EQ(ignored->exit, "exit code 7");
  EXPECT_EQ(End(0)->kind, FailureKind::kSucceeded);
  EXPECT_EQ(Key(keys::kRestarts), "(none)");
}

// A peer whose heartbeat stops is lost after timeouts.heartbeat: its watcher ends the round,
// which spends a restart (here the last one).
TEST_F(AgentPolicy, APeerWhoseHeartbeatStopsIsLostAfterTheHeartbeatTimeout) {
  FakeEnv env([](int, int, int) { return std::optional<Fate>(); });
  Agent agent(Options("nodes: 2\ntimeouts: {heartbeat: 7s}\nrestart: {max_restarts: 0}\n", 0), &store_, &env);
  // The peer: joins round 0 as node 1, then falls silent.
  std::thread peer([&] {
    RendezvousOptions ro;
    ro.min_nodes = ro.max_nodes = 2;
    ro.rank_hint = 1;
    ro.node_id = "peer:1";
    ro.timeout = 10s;
    (void)JoinRound(store_, 0, 0, ro);
  });
  // The agent starts once the peer has its slot: the agent's clock runs as fast as it waits, and
  // would otherwise pass a rendezvous timeout while the peer's thread starts.
  while (Key(keys::RoundMember(0, 0)) == "(none)") std::this_thread::sleep_for(1ms);
  EXPECT_EQ(agent.Run(), kExitWorkerFailed);
  peer.join();
  ASSERT_EQ(env.starts.size(), 1u);
  const auto began = env.starts[0];  // heartbeats begin with the tasks
  auto end = End(0);
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->kind, FailureKind::kNodeLost);
  EXPECT_EQ(end->Summary(), "node 1 (peer:1) was lost: its agent sent no heartbeat for 7s (timeouts.heartbeat)");
  EXPECT_GE(Since(began, env.Now()), 7s);
  EXPECT_LT(Since(began, env.Now()), 9s);
}

// Scale-up: a node waiting to join ends an elastic round as a membership change, which spends
// no restart; the next round starts the group again.
TEST_F(AgentPolicy, ANodeWaitingToJoinEndsTheRoundWithoutSpendingARestart) {
  FakeEnv env([](int start, int, int) -> std::optional<Fate> {
    if (start == 2) return Fate{3s, 0};
    return std::nullopt;
  });
  ASSERT_TRUE(store_.Set(keys::RoundWaiting(0), "1").ok());
  // An hour's last call: the rendezvous waits on the agent's clock, which moves at once here.
  Agent agent(Options("nodes: {min: 1, max: 2}\ntimeouts: {last_call: 1h, rendezvous: 3h}\n"
                      "restart: {max_restarts: 0}\n"),
              &store_, &env);
  const auto start = env.Now();
  EXPECT_EQ(agent.Run(), kExitOk);
  EXPECT_GE(env.Now() - start, std::chrono::hours(2));  // two rounds' last calls
  EXPECT_EQ(env.starts.size(), 2u);
  auto end = End(0);
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->kind, FailureKind::kMembership);
  EXPECT_EQ(end->restarts, 0);
  EXPECT_EQ(Key(keys::kRestarts), "(none)");
  EXPECT_EQ(End(1)->kind, FailureKind::kSucceeded);
}

// A stop signal stops the tasks and records why for the whole job; the agent exits 130.
TEST_F(AgentPolicy, AStopSignalStopsTheTasksAndTellsTheJob) {
  FakeEnv env([](int, int, int) { return std::optional<Fate>(); });
  env.stop_at_ = env.Now() + 30s;
  Agent agent(Options(""), &store_, &env);
  EXPECT_EQ(agent.Run(), kExitInterrupted);
  EXPECT_EQ(env.stops, 1);
  StopRecord stop;
  ASSERT_TRUE(StopRecord::FromJson(Key(keys::kStop), &stop));
  EXPECT_EQ(stop.reason, "interrupted by SIGTERM on " + NodeId("127.0.0.1", 4242));
  EXPECT_EQ(stop.code, kExitInterrupted);
}

// With leave_on_signal (a Kubernetes pod's agent), the signal takes this node out and leaves the
// job to the others: its tasks stop, it exits 130, and no stop is recorded for the job.
TEST_F(AgentPolicy, WithLeaveOnSignalAStopSignalTakesOnlyThisNodeOut) {
  FakeEnv env([](int, int, int) { return std::optional<Fate>(); });
  env.stop_at_ = env.Now() + 30s;
  AgentOptions o = Options("");
  o.leave_on_signal = true;
  Agent agent(o, &store_, &env);
  EXPECT_EQ(agent.Run(), kExitInterrupted);
  EXPECT_EQ(env.stops, 1);
  EXPECT_EQ(Key(keys::kStop), "(none)");
}

// A task's launch, from the job, the round and the task alone (no process, no store).
LaunchRound TwoNodeRound(const std::vector<Task>* all, const std::vector<std::string>* addrs) {
  LaunchRound r;
  r.round = 3;
  r.info.restarts = 2;
  r.info.group_rank = 1;
  r.info.group_world_size = 2;
  r.world_size = 4;
  r.master = "10.0.0.1:29500";
  r.all = all;
  r.addrs = addrs;
  return r;
}

TEST(PlanLaunch, AProgramGetsTorchrunsVariablesOverTheAgentsEnvironment) {
  JobSpec spec;
  spec.name = "j";
  spec.output_dir = "/runs/j";
  spec.working_dir = "/work";
  RoleSpec role;
  role.name = "worker";
  role.command = {"python3", "train.py"};
  role.args = {"--lr", "0.1"};
  role.env = {{"FOO", "bar"}, {"PYTHONUNBUFFERED", "0"}};
  role.resources.cpus = 2;
  const std::vector<Task> all = PlaceTasks({{"worker", 4}}, 2);
  const std::vector<std::string> none;
  LaunchSite site;
  site.run_id = "j-1234abcd";
  site.env = {"PATH=/bin", "FOO=agent's"};
  site.timer_file = "/tmp/timers";
  const WorkerLaunch w = PlanLaunch(spec, role, TwoNodeRound(&all, &none), all[3], 1, site);
  EXPECT_EQ(w.argv, (std::vector<std::string>{"python3", "train.py", "--lr", "0.1"}));
  EXPECT_FALSE(w.fork) << "no preload: a program of its own";
  EXPECT_EQ(w.rank, 3);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.label, "worker-3");
  EXPECT_EQ(w.cwd, "/work");
  EXPECT_EQ(w.log_path, paths::TaskLog("/runs/j", "worker", 3));
  for (const auto& [k, v] :
       std::vector<std::pair<std::string, std::string>>{{"RANK", "3"},
                                                        {"LOCAL_RANK", "1"},
                                                        {"WORLD_SIZE", "4"},
                                                        {"LOCAL_WORLD_SIZE", "2"},
                                                        {"GROUP_RANK", "1"},
                                                        {"MASTER_ADDR", "10.0.0.1"},
                                                        {"MASTER_PORT", "29500"},
                                                        {"TORCHELASTIC_RESTART_COUNT", "2"},
                                                        {"TORCHELASTIC_RUN_ID", "j-1234abcd"},
                                                        {"TORCHELASTIC_TIMER_FILE", "/tmp/timers"},
                                                        {"PATH", "/bin"},
                                                        {"FOO", "bar"},
                                                        {"OMP_NUM_THREADS", "2"},
                                                        {"PYTHONUNBUFFERED", "0"},
                                                        {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"}}) {
    EXPECT_EQ(GetEnv(w.env, k).value_or("(unset)"), v) << k;
  }
  EXPECT_FALSE(GetEnv(w.env, "TF_CONFIG")) << "no task addresses: no TF_CONFIG";
  EXPECT_TRUE(w.cpus.empty()) << "cpu_bind is not cores";
}

TEST(PlanLaunch, TheBuiltInTrainerIsThisBinaryForkedOnItsShareOfTheCpus) {
  JobSpec spec;
  spec.cpu_bind = "cores";
  RoleSpec role;
  role.name = "worker";
  const std::vector<Task> all = PlaceTasks({{"worker", 4}}, 2);
  const std::vector<std::string> none;
  LaunchSite site;
  site.self_exe = "/opt/trainctl/bin/trainctl";
  site.debug = true;
  site.env = {"OMP_NUM_THREADS=7"};
  site.cpus = {0, 1, 2, 3};
  const WorkerLaunch w = PlanLaunch(spec, role, TwoNodeRound(&all, &none), all[3], 0, site);
  EXPECT_EQ(w.argv, (std::vector<std::string>{"/opt/trainctl/bin/trainctl", "--log-level", "debug", "train", "--task",
                                              "worker-3"}));
  EXPECT_TRUE(w.fork);
  EXPECT_EQ(w.cpus, (std::vector<int>{2, 3})) << "local rank 1 of 2: the second half";
  EXPECT_EQ(GetEnv(w.env, "OMP_NUM_THREADS").value_or(""), "7") << "the user's own is kept";
  EXPECT_TRUE(GetEnv(w.shared_env, kEnvPreloadSpec)) << "the training ranks' server loads the data once";
}

}  // namespace
}  // namespace trainctl
