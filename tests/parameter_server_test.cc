// The built-in trainer's parameter_server strategy as users run it: `trainctl run` with ps and
// worker roles, real processes, real Fashion-MNIST (a few hundred images of it).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "common/exit_codes.h"
#include "common/strings.h"
#include "tests/test_util.h"

namespace trainctl::testing {
namespace {

using std::chrono::seconds;

std::string Digest(const std::string& log) {
  std::smatch m;
  static const std::regex re("final parameters: \\d+ values, crc32c ([0-9a-f]{8})");
  return std::regex_search(log, m, re) ? m[1].str() : "";
}

// 640 images, batch 16: 20 steps per epoch with 2 workers.
std::string Trainer(const std::string& extra) {
  return "trainer:\n  model: cnn\n  data: {limit: 640, test_limit: 200}\n  batch_size: 16\n"
         "  threads: 1\n  optimizer: {name: sgd, lr: 0.05, momentum: 0.9}\n" +
         extra;
}

pid_t TaskPid(const std::string& role, int index, const std::string& job) {
  auto pids = ProcessesWithEnv({"ROLE_NAME=" + role, "ROLE_RANK=" + std::to_string(index), "TRAINCTL_JOB_NAME=" + job});
  return pids.size() == 1 ? pids[0] : -1;
}

// Runs `trainer` as 2 allreduce workers (shm) and as 1 sync ps with 2 workers, in s/ar and s/ps:
// the same final parameters on every worker, bit for bit.
void ExpectPsTrainsAsAllreduce(Scratch& s, const std::string& trainer) {
  auto ar = Trainctl({"run", s.Write("ar.yaml", "name: ar\nprocs_per_node: 2\noutput_dir: " + s.path("ar") + "\n" +
                                                    trainer + "  backend: shm\n")},
                     s.path(""), seconds(120));
  ASSERT_EQ(ar.exit.code, 0) << ar.output;
  auto ps = Trainctl({"run", s.Write("ps.yaml", "name: ps\noutput_dir: " + s.path("ps") + "\n" + trainer +
                                                    "  strategy: parameter_server\n"
                                                    "roles: [{name: ps}, {name: worker, replicas: 2}]\n")},
                     s.path(""), seconds(120));
  ASSERT_EQ(ps.exit.code, 0) << ps.output;
  const std::string d = Digest(s.Read("ar/logs/worker-0.log"));
  ASSERT_FALSE(d.empty()) << s.Read("ar/logs/worker-0.log");
  EXPECT_EQ(Digest(s.Read("ps/logs/worker-0.log")), d) << s.Read("ps/logs/worker-0.log");
  EXPECT_EQ(Digest(s.Read("ps/logs/worker-1.log")), d);
  EXPECT_NE(s.Read("ps/logs/ps-0.log").find("parameter server 0 of 1 (sync) serving 2 worker(s)"), std::string::npos);
}

// sync is the allreduce update, step for step: the same seed and data give the same bits.
TEST(ParameterServer, SyncTrainsBitForBitAsAllreduce) {
  Scratch s;
  ExpectPsTrainsAsAllreduce(s, Trainer("  deterministic: true\n  seed: 3\n  max_steps: 12\n  eval: false\n"));
}

// A model from PyTorch (trainer.model: {torchscript: ...}) on parameter servers: the same
// updates as allreduce on the same scripted module, bit for bit.
TEST(ParameterServer, ATorchScriptModelTrainsAsUnderAllreduce) {
  Scratch s;
  auto made = RunProgram(
      {TRAINCTL_TEST_PYTHON, std::string(TRAINCTL_SOURCE_DIR) + "/tests/python/scripted_models.py", s.path("models")},
      s.path(""));
  ASSERT_EQ(made.exit.code, 0) << made.output;
  std::string trainer = Trainer("  deterministic: true\n  seed: 5\n  max_steps: 8\n  eval: false\n");
  trainer.replace(trainer.find("  model: cnn\n"), 13, "  model: {torchscript: " + s.path("models/bn_cnn.pt") + "}\n");
  ExpectPsTrainsAsAllreduce(s, trainer);
  EXPECT_NE(s.Read("ps/logs/worker-0.log").find("training the TorchScript module"), std::string::npos)
      << s.Read("ps/logs/worker-0.log");
}

// The seed's layout in small: 2 ps, 3 workers and a chief of the built-in trainer, and an
// evaluator that evaluates each checkpoint as it appears.
TEST(ParameterServer, PsWorkersChiefAndAnEvaluatorWatchingCheckpoints) {
  Scratch s;
  auto r = Trainctl({"run", s.Write("job.yaml", "name: tf-layout\noutput_dir: " + s.path("out") + "\n" +
                                                    Trainer("  strategy: parameter_server\n  epochs: 2\n"
                                                            "  max_steps: 12\n  checkpoint_every: 4\n"
                                                            "  eval: false\n") +
                                                    "roles:\n  - {name: ps, replicas: 2}\n"
                                                    "  - {name: worker, replicas: 3}\n  - {name: chief}\n"
                                                    "  - {name: evaluator}\n")},
                    s.path(""), seconds(120));
  ASSERT_EQ(r.exit.code, 0) << r.output;
  EXPECT_NE(s.Read("out/logs/chief-0.log").find("model exported to"), std::string::npos);
  EXPECT_TRUE(Exists(s.path("out/model.safetensors")));
  // The evaluator wrote a test accuracy for the final checkpoint (and for any other it saw).
  std::map<int64_t, double> evaluated;
  for (const auto& line : SplitLines(s.Read("out/metrics.jsonl"))) {
    auto j = nlohmann::json::parse(line);
    if (j.value("source", "") == "evaluator") evaluated[j["step"]] = j["test_accuracy"];
  }
  ASSERT_TRUE(evaluated.count(12)) << s.Read("out/metrics.jsonl") << s.Read("out/logs/evaluator-0.log");
  EXPECT_GT(evaluated[12], 0.3);  // 12 steps of a CNN on Fashion-MNIST: far above chance
  EXPECT_LE(evaluated[12], 1.0);
  EXPECT_TRUE(fs::exists(s.path("out/tensorboard/eval")));
  EXPECT_EQ(ReadStatus(s, "out")["state"], "succeeded");
  EXPECT_TRUE(ProcessesWithEnv({"TRAINCTL_JOB_NAME=tf-layout"}).empty());
}

// An evaluator that starts only after the final model was exported (late on a busy machine, or
// restarted) evaluates the run's last checkpoint and ends, instead of watching for a final model
// newer than its own start until the job's timeout: the model was written in its run. Its command
// waits for the export, then runs the built-in evaluator.
TEST(ParameterServer, AnEvaluatorStartedAfterTheExportEvaluatesTheLastCheckpointAndEnds) {
  Scratch s;
  const std::string out = s.path("out");
  auto r = Trainctl({"run", s.Write("job.yaml", "name: late-eval\noutput_dir: " + out + "\n" +
                                                    Trainer("  max_steps: 8\n  eval: false\n") +
                                                    "roles:\n  - {name: worker}\n"
                                                    "  - {name: evaluator, command: [sh, -c, 'while [ ! -e " +
                                                    out +
                                                    "/model.safetensors ]; do sleep 0.1; done; sleep 1.1; "
                                                    "exec \"$0\" train --task evaluator-0', " TRAINCTL_BIN "]}\n")},
                    s.path(""), seconds(60));
  ASSERT_EQ(r.exit.code, 0) << r.output;
  std::map<int64_t, double> evaluated;
  for (const auto& line : SplitLines(s.Read("out/metrics.jsonl"))) {
    auto j = nlohmann::json::parse(line);
    if (j.value("source", "") == "evaluator") evaluated[j["step"]] = j["test_accuracy"];
  }
  EXPECT_EQ(evaluated.size(), 1u) << s.Read("out/metrics.jsonl") << s.Read("out/logs/evaluator-0.log");
  EXPECT_TRUE(evaluated.count(8)) << s.Read("out/logs/evaluator-0.log");
  EXPECT_EQ(ReadStatus(s, "out")["state"], "succeeded");
}

// async: a worker SIGKILLed mid-run is restarted alone and goes on from its own step; the others
// never stop and the job spends no group restart.
TEST(ParameterServer, AnAsyncWorkerKilledMidRunIsReplacedWithoutAGroupRestart) {
  Scratch s;
  Background job({"run", s.Write("job.yaml", "name: async-kill\noutput_dir: " + s.path("out") + "\n" +
                                                 Trainer("  strategy: parameter_server\n"
                                                         "  parameter_server: {mode: async}\n"
                                                         "  epochs: 100\n  max_steps: 400\n  log_every: 5\n"
                                                         "  eval: false\n") +
                                                 "roles: [{name: ps}, {name: worker, replicas: 2}]\n"
                                                 "restart: {max_restarts: 2}\n")},
                 s.path(""), s.path("run.log"));
  // Worker 1 itself has trained (its steps are on the parameter servers), not only worker 0: on a
  // loaded machine it may start late, and a worker killed before its first push starts over.
  ASSERT_TRUE(Eventually(
      [&] {
        return CountLines(s.Read("out/metrics.jsonl"), "\"loss\"") >= 4 &&
               s.Read("out/logs/worker-1.log").find("epoch 1:") != std::string::npos;
      },
      seconds(60)))
      << job.Output();
  pid_t worker1 = TaskPid("worker", 1, "async-kill");
  ASSERT_GT(worker1, 0);
  const pid_t worker0 = TaskPid("worker", 0, "async-kill");
  ASSERT_EQ(::kill(worker1, SIGKILL), 0);
  ExitInfo exit = job.Wait(seconds(120));
  ASSERT_EQ(exit.code, 0) << job.Output();
  auto st = ReadStatus(s, "out");
  EXPECT_EQ(st["restarts"], 0) << st;
  EXPECT_EQ(st["task_restarts"], 1) << st;
  EXPECT_NE(job.Output().find("restarting it alone (task restart 1 of 2)"), std::string::npos) << job.Output();
  EXPECT_NE(s.Read("out/logs/worker-1.log").find("going on from step"), std::string::npos)
      << s.Read("out/logs/worker-1.log");
  // Worker 0 ran from start to end in one process.
  EXPECT_EQ(CountLines(s.Read("out/logs/worker-0.log"), "=== trainctl: run"), 1);
  EXPECT_NE(worker0, -1);
}

// A lost ps shard: the group restarts and the shards are restored from the newest checkpoint; in
// deterministic mode the run ends with the parameters of a run that lost nothing.
TEST(ParameterServer, ALostPsIsRestoredFromTheNewestCheckpoint) {
  Scratch s;
  const std::string trainer = Trainer(
      "  strategy: parameter_server\n  deterministic: true\n"
      "  epochs: 10\n  max_steps: 120\n  checkpoint_every: 10\n"
      "  eval: false\n");
  const std::string roles = "roles: [{name: ps, replicas: 2}, {name: worker, replicas: 2}]\n";
  auto whole =
      Trainctl({"run", s.Write("a.yaml", "name: ps-whole\noutput_dir: " + s.path("a") + "\n" + trainer + roles)},
               s.path(""), seconds(120));
  ASSERT_EQ(whole.exit.code, 0) << whole.output;
  Background job({"run", s.Write("b.yaml", "name: ps-lost\noutput_dir: " + s.path("b") + "\n" + trainer + roles +
                                               "restart: {max_restarts: 1}\n")},
                 s.path(""), s.path("run.log"));
  ASSERT_TRUE(Eventually([&] { return fs::exists(s.path("b/checkpoints/ckpt-0000000020.safetensors")); }, seconds(60)))
      << job.Output();
  pid_t ps1 = TaskPid("ps", 1, "ps-lost");
  ASSERT_GT(ps1, 0);
  ASSERT_EQ(::kill(ps1, SIGKILL), 0);
  ExitInfo exit = job.Wait(seconds(120));
  ASSERT_EQ(exit.code, 0) << job.Output();
  EXPECT_EQ(ReadStatus(s, "b")["restarts"], 1);
  EXPECT_NE(s.Read("b/logs/worker-0.log").find("resuming from " + s.path("b/checkpoints/ckpt-")), std::string::npos)
      << s.Read("b/logs/worker-0.log");
  const std::string d = Digest(s.Read("a/logs/worker-0.log"));
  ASSERT_FALSE(d.empty());
  EXPECT_EQ(Digest(s.Read("b/logs/worker-0.log")), d) << "the restored run ended elsewhere";
}

}  // namespace
}  // namespace trainctl::testing
