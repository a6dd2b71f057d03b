// The built-in trainer as users run it: `trainctl run` with a trainer section, real worker
// processes, real Gloo between them, the real Fashion-MNIST (a few hundred images of it).
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "common/cpus.h"
#include "common/exit_codes.h"
#include "common/strings.h"
#include "tests/etcd_server.h"
#include "tests/test_util.h"

namespace trainctl::testing {
namespace {

std::string Spec(const std::string& name, const std::string& out, const std::string& trainer, int nodes = 1,
                 int procs = 2) {
  return "name: " + name + "\nnodes: " + std::to_string(nodes) + "\nprocs_per_node: " + std::to_string(procs) +
         "\noutput_dir: " + out + "\ntrainer:\n" + trainer;
}

// step -> loss from metrics.jsonl; a later line for the same step wins (a resumed run appends).
std::map<int64_t, std::string> Losses(const std::string& metrics) {
  std::map<int64_t, std::string> out;
  for (const auto& line : SplitLines(metrics)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out[j["step"].get<int64_t>()] = j["loss"].dump();
  }
  return out;
}

// The records of metrics.jsonl that hold `key`.
std::vector<nlohmann::json> Records(const std::string& metrics, const std::string& key) {
  std::vector<nlohmann::json> out;
  for (const auto& line : SplitLines(metrics)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains(key)) out.push_back(std::move(j));
  }
  return out;
}

std::string Digest(const std::string& log) {
  std::smatch m;
  static const std::regex re("final parameters: \\d+ values, crc32c ([0-9a-f]{8})");
  return std::regex_search(log, m, re) ? m[1].str() : "";
}

TEST(Trainer, AllRanksEndWithBitIdenticalParameters) {
  Scratch s;
  // 2 nodes x 2 workers: gradients cross agents and processes; each rank reads its own shard.
  std::string spec = s.Write("job.yaml", Spec("ident", s.path("out"), R"(  model: cnn
  data: {limit: 640, test_limit: 200}
  batch_size: 16
  max_steps: 8
  threads: 1
)",
                                              2, 2));
  auto r = Trainctl({"run", spec}, s.path(""), std::chrono::seconds(120));
  ASSERT_EQ(r.exit.code, 0) << r.output;
  std::string d0 = Digest(s.Read("out/logs/worker-0.log"));
  ASSERT_FALSE(d0.empty()) << s.Read("out/logs/worker-0.log");
  for (int rank = 1; rank < 4; ++rank) {
    EXPECT_EQ(Digest(s.Read("out/logs/worker-" + std::to_string(rank) + ".log")), d0) << rank;
  }
  EXPECT_TRUE(Exists(s.path("out/model.safetensors")));
}

// trainer.timeline_steps: timeline.json holds each rank's row with the steps after the first log
// window, each step's phases back to back in the order the trainer runs them, and the ranks'
// clocks agree: no rank's gradient average ends before every rank's backward has (it averages
// their gradients).
TEST(Trainer, TheTimelineShowsEachRanksStepsAndTheirPhases) {
  Scratch s;
  std::string spec = s.Write("job.yaml", Spec("tl", s.path("out"), R"(  model: cnn
  data: {limit: 640, test_limit: 100}
  batch_size: 16
  max_steps: 12
  log_every: 4
  timeline_steps: 5
  threads: 1
  eval: false
)"));
  auto r = Trainctl({"run", spec}, s.path(""), std::chrono::seconds(120));
  ASSERT_EQ(r.exit.code, 0) << r.output;
  EXPECT_NE(r.output.find("timeline of steps 5 to 9 (2 of 2 ranks) written to " + s.path("out/timeline.json")),
            std::string::npos)
      << r.output;
  auto trace = nlohmann::json::parse(s.Read("out/timeline.json"));
  std::map<int, std::string> rows;
  // rank -> step -> the step's spans in the order they start
  std::map<int, std::map<int64_t, std::vector<nlohmann::json>>> spans;
  for (const auto& e : trace.at("traceEvents")) {
    if (e["name"] == "thread_name") rows[e["tid"].get<int>()] = e["args"]["name"].get<std::string>();
    if (e["ph"] == "X") spans[e["tid"].get<int>()][e["args"]["step"].get<int64_t>()].push_back(e);
  }
  EXPECT_EQ(rows, (std::map<int, std::string>{{0, "rank 0"}, {1, "rank 1"}}));
  ASSERT_EQ(spans.size(), 2u);
  auto end = [](const nlohmann::json& e) { return e["ts"].get<int64_t>() + e["dur"].get<int64_t>(); };
  auto find = [](const std::vector<nlohmann::json>& v, const std::string& name) {
    for (const auto& e : v)
      if (e["name"] == name) return e;
    return nlohmann::json();
  };
  for (auto& [rank, steps] : spans) {
    std::vector<int64_t> numbers;
    for (auto& [step, v] : steps) {
      numbers.push_back(step);
      nlohmann::json whole = find(v, "step");
      ASSERT_FALSE(whole.is_null()) << rank << " " << step;
      EXPECT_EQ(whole["args"]["items"], 16);  // the rank's batch
      std::vector<nlohmann::json> phases;
      for (const auto& e : v)
        if (e["name"] != "step") phases.push_back(e);
      std::sort(phases.begin(), phases.end(), [](const auto& a, const auto& b) { return a["ts"] < b["ts"]; });
      std::string names;
      for (size_t i = 0; i < phases.size(); ++i) {
        names += (i ? "," : "") + phases[i]["name"].get<std::string>();
        if (i > 0) EXPECT_EQ(phases[i]["ts"].get<int64_t>(), end(phases[i - 1])) << rank << " " << step;
      }
      EXPECT_EQ(names, step == 8 ? "data,forward,backward,gradient average,optimizer,log"
                                 : "data,forward,backward,gradient average,optimizer");
      EXPECT_EQ(whole["ts"], phases.front()["ts"]);
      EXPECT_EQ(end(whole), end(phases.back()));
    }
    EXPECT_EQ(numbers, (std::vector<int64_t>{5, 6, 7, 8, 9})) << rank;
  }
  for (int64_t step = 5; step <= 9; ++step) {
    for (int a = 0; a < 2; ++a) {
      EXPECT_GE(end(find(spans[a][step], "gradient average")), end(find(spans[1 - a][step], "backward")))
          << "rank " << a << ", step " << step;
    }
  }
}

// A process that keeps `cpu` busy until the object goes: a noisy neighbour on one core.
class Hog {
 public:
  explicit Hog(int cpu) : pid_(::fork()) {
    if (pid_ != 0) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    ::sched_setaffinity(0, sizeof set, &set);
    ::alarm(300);  // not past the test, whatever happens to it
    for (volatile uint64_t i = 0;; i = i + 1) {
    }
  }
  ~Hog() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  Hog(const Hog&) = delete;
  Hog& operator=(const Hog&) = delete;

 private:
  pid_t pid_;
};

// trainer.balance: speed: with every CPU of worker 1 shared with busy processes, worker 1 gets
// a smaller part of each global batch, and the training is the same as with even parts: the
// same global batches, each rank's gradient weighted by its part, so the logged losses follow
// an even run's to rounding (without the weights they miss by 4 % at step 40); every rank ends
// with the same parameters.
TEST(Trainer, BalanceBySpeedGivesASlowerWorkerLessOfTheBatchAndTrainsTheSame) {
  if (AffinityCpus().size() < 2) GTEST_SKIP() << "needs two CPUs, one for each worker";
  Scratch s;
  auto run = [&](const std::string& name, const std::string& balance) {
    std::string spec = s.Write(
        name + ".yaml",
        Spec(name, s.path(name),
             "  model: cnn\n"
             "  data: {limit: 4000, test_limit: 100}\n  batch_size: 32\n  epochs: 2\n  max_steps: 80\n  log_every: 20\n"
             "  threads: 1\n  eval: false\n  snapshot_every: 0\n  optimizer: {name: sgd, lr: 0.02, momentum: 0.9}\n"
             "  balance: " +
                 balance + "\ncpu_bind: cores\n"));
    auto r = Trainctl({"run", spec}, s.path(""), std::chrono::seconds(120));
    EXPECT_EQ(r.exit.code, 0) << r.output;
    return Records(s.Read(name + "/metrics.jsonl"), "loss");
  };
  const auto even = run("even", "even");
  // Four busy processes on each of worker 1's CPUs leave it a fifth of them or less: slower than
  // worker 0 by far even when other tests load worker 0's CPUs too (ctest -j2).
  std::vector<std::unique_ptr<Hog>> hogs;
  for (int cpu : CpuShare(AffinityCpus(), 1, 2)) {
    for (int k = 0; k < 4; ++k) hogs.push_back(std::make_unique<Hog>(cpu));
  }
  const auto balanced = run("balanced", "speed");
  hogs.clear();
  // Steps 20, 40, 60, the first epoch's last 2 (62 steps an epoch), 80.
  ASSERT_EQ(even.size(), 5u);
  ASSERT_EQ(balanced.size(), 5u);
  int64_t widest = 0;
  for (size_t i = 0; i < even.size(); ++i) {
    EXPECT_FALSE(even[i].contains("batch_min"));
    const double a = even[i]["loss"].get<double>(), b = balanced[i]["loss"].get<double>();
    EXPECT_NEAR(a, b, 2e-3 * a) << "step " << even[i]["step"];
    widest = std::max(widest, balanced[i]["batch_max"].get<int64_t>() - balanced[i]["batch_min"].get<int64_t>());
    EXPECT_EQ(balanced[i]["batch_min"].get<int64_t>() + balanced[i]["batch_max"].get<int64_t>(), 64);
  }
  EXPECT_GE(widest, 8) << "worker 1 shared its CPU with a busy process and kept an even part";
  std::string d0 = Digest(s.Read("balanced/logs/worker-0.log"));
  ASSERT_FALSE(d0.empty());
  EXPECT_EQ(Digest(s.Read("balanced/logs/worker-1.log")), d0);
}

// trainer.label_smoothing and the one_cycle schedule reach the loss and the optimizer: with a
// smoothing of 0.5 over 10 classes no logits can bring the loss under the target's entropy
// (1.677), which the same run without smoothing goes well under; the logged learning rate rises
// from lr/25 to lr over 30 % of the steps and falls after.
TEST(Trainer, LabelSmoothingAndTheOneCycleScheduleReachTheLossAndTheOptimizer) {
  Scratch s;
  auto run = [&](const std::string& out, const std::string& smoothing) {
    std::string spec =
        s.Write(out + ".yaml",
                Spec(out, s.path(out),
                     "  model: cnn\n"
                     "  data: {limit: 640, test_limit: 100}\n  batch_size: 32\n  threads: 1\n  deterministic: true\n"
                     "  epochs: 1\n  eval: false\n  log_every: 1\n  label_smoothing: " +
                         smoothing +
                         "\n"
                         "  optimizer: {name: sgd, lr: 0.05, momentum: 0.9}\n  schedule: {name: one_cycle}\n",
                     1, 1));
    auto r = Trainctl({"run", spec}, s.path(""), std::chrono::seconds(120));
    EXPECT_EQ(r.exit.code, 0) << r.output;
    std::vector<std::pair<double, double>> loss_lr;
    for (const auto& j : Records(s.Read(out + "/metrics.jsonl"), "loss")) {
      loss_lr.emplace_back(j["loss"].get<double>(), j["lr"].get<double>());
    }
    return loss_lr;
  };
  const auto smoothed = run("smoothed", "0.5");
  const auto plain = run("plain", "0");
  ASSERT_EQ(smoothed.size(), 20u);
  ASSERT_EQ(plain.size(), 20u);
  double smoothed_min = 1e9, plain_min = 1e9;
  for (size_t i = 0; i < 20; ++i) {
    smoothed_min = std::min(smoothed_min, smoothed[i].first);
    plain_min = std::min(plain_min, plain[i].first);
    EXPECT_EQ(smoothed[i].second, plain[i].second) << "the schedule does not depend on the loss";
  }
  EXPECT_GE(smoothed_min, 1.676);
  EXPECT_LT(plain_min, 1.5);
  EXPECT_NEAR(plain[0].second, 0.05 / 25, 1e-9);
  EXPECT_NEAR(plain[6].second, 0.05, 1e-9);  // step 6 of 20: the top
  EXPECT_LT(plain[19].second, 0.005);
}

// trainer.precision: bf16 follows fp32's curve on a slice of Fashion-MNIST: each epoch's mean
// logged loss within 6 %, the last epoch's test accuracy within two points (the first epoch's,
// mid-warm-up, within five: single steps differ as any two runs' do); and it is not the fp32 run
// again (on a CPU with bf16 instructions the CNN's second convolution multiplies in bf16, so
// the losses differ from the first logged step on).
TEST(Trainer, Bf16FollowsTheFp32LossAndAccuracyCurve) {
  Scratch s;
  auto run = [&](const std::string& precision) {
    std::string spec =
        s.Write(precision + ".yaml",
                Spec(precision, s.path(precision),
                     "  model: cnn\n"
                     "  data: {limit: 4096, test_limit: 1000}\n  batch_size: 64\n  threads: 1\n  deterministic: true\n"
                     "  epochs: 3\n  log_every: 8\n  precision: " +
                         precision +
                         "\n"
                         "  optimizer: {name: sgd, lr: 0.1, momentum: 0.9}\n  schedule: {name: one_cycle}\n",
                     1, 1));
    auto r = Trainctl({"run", spec}, s.path(""), std::chrono::seconds(180));
    EXPECT_EQ(r.exit.code, 0) << r.output;
    std::vector<double> losses, accuracies;
    const std::string metrics = s.Read(precision + "/metrics.jsonl");
    for (const auto& j : Records(metrics, "loss")) losses.push_back(j["loss"].get<double>());
    for (const auto& j : Records(metrics, "test_accuracy")) accuracies.push_back(j["test_accuracy"].get<double>());
    return std::make_tuple(losses, accuracies, s.Read(precision + "/logs/worker-0.log"));
  };
  const auto [fp32_losses, fp32_accuracies, fp32_log] = run("fp32");
  const auto [bf16_losses, bf16_accuracies, bf16_log] = run("bf16");
  EXPECT_NE(bf16_log.find("on cpu in bf16 mixed precision"), std::string::npos) << bf16_log;
  ASSERT_EQ(fp32_losses.size(), 24u);  // 64 steps per epoch, a loss every 8
  ASSERT_EQ(bf16_losses.size(), 24u);
  ASSERT_EQ(fp32_accuracies.size(), 3u);
  ASSERT_EQ(bf16_accuracies.size(), 3u);
  for (size_t e = 0; e < 3; ++e) {
    double fp32_mean = 0, bf16_mean = 0;
    for (size_t i = 8 * e; i < 8 * e + 8; ++i) {
      fp32_mean += fp32_losses[i] / 8;
      bf16_mean += bf16_losses[i] / 8;
    }
    EXPECT_NEAR(bf16_mean, fp32_mean, 0.06 * fp32_mean) << "epoch " << e + 1;
    EXPECT_NEAR(bf16_accuracies[e], fp32_accuracies[e], e == 2 ? 0.02 : 0.05) << "epoch " << e + 1;
  }
  EXPECT_GT(fp32_accuracies[2], 0.75) << "the slice is long enough to learn";
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512bf16")) {
    EXPECT_NE(bf16_losses[0], fp32_losses[0]) << "bf16 computed in fp32";
  }
}

// trainer.eval_every: 2 over 3 epochs evaluates after epoch 2 and after the last, not after 1.
TEST(Trainer, EvalEveryEvaluatesEveryNthEpochAndTheLast) {
  Scratch s;
  std::string spec =
      s.Write("job.yaml", Spec("every", s.path("out"),
                               "  model: cnn\n"
                               "  data: {limit: 640, test_limit: 100}\n  batch_size: 64\n  threads: 1\n  epochs: 3\n"
                               "  eval_every: 2\n",
                               1, 1));
  auto r = Trainctl({"run", spec}, s.path(""), std::chrono::seconds(120));
  ASSERT_EQ(r.exit.code, 0) << r.output;
  std::vector<int> evaluated;
  for (const auto& j : Records(s.Read("out/metrics.jsonl"), "test_accuracy"))
    evaluated.push_back(j["epoch"].get<int>());
  EXPECT_EQ(evaluated, (std::vector<int>{2, 3}));
}

// The trainer of the resume tests. 640 images / (2 workers x 32) = 10 steps per epoch: the runs
// cross an epoch boundary, and a stop at step 7 falls mid-epoch, between checkpoints.
std::string ResumableTrainer(int max_steps, const std::string& device = "cpu") {
  return "  model: cnn\n  device: " + device +
         "\n  data: {limit: 640, test_limit: 300}\n"
         "  batch_size: 32\n  threads: 1\n  deterministic: true\n  epochs: 2\n  eval: false\n"
         "  log_every: 1\n  checkpoint_every: 4\n  optimizer: {name: sgd, lr: 0.05, momentum: 0.9}\n"
         "  max_steps: " +
         std::to_string(max_steps) + "\n";
}

// The 14 steps' losses of the uninterrupted run in a/ and of the one stopped at step 7 and
// resumed in b/ are the same, and training moved them.
void ExpectResumedLossesEqualUninterrupted(const Scratch& s) {
  auto a = Losses(s.Read("a/metrics.jsonl"));
  auto b = Losses(s.Read("b/metrics.jsonl"));
  ASSERT_EQ(a.size(), 14u);
  ASSERT_EQ(b.size(), 14u);
  for (int64_t step = 1; step <= 14; ++step) EXPECT_EQ(a[step], b[step]) << "step " << step;
  EXPECT_NE(a[1], a[14]);  // it did learn something
}

// In b/: the trainer `trainer(steps)` stopped at step 7 and resumed to 14, whose losses are those
// of the uninterrupted run already in a/.
void StopAndResume(const Scratch& s, const std::function<std::string(int)>& trainer) {
  auto first = Trainctl({"run", s.Write("b1.yaml", Spec("part", s.path("b"), trainer(7)))}, s.path(""),
                        std::chrono::seconds(120));
  ASSERT_EQ(first.exit.code, 0) << first.output;
  auto second = Trainctl({"run", "--resume", s.Write("b2.yaml", Spec("part", s.path("b"), trainer(14)))}, s.path(""),
                         std::chrono::seconds(120));
  ASSERT_EQ(second.exit.code, 0) << second.output;
  EXPECT_NE(second.output.find("resuming from"), std::string::npos) << second.output;
  ExpectResumedLossesEqualUninterrupted(s);
}

TEST(Trainer, AResumedRunHasTheSameLossesAsAnUninterruptedOne) {
  Scratch s;
  auto whole = Trainctl({"run", s.Write("a.yaml", Spec("whole", s.path("a"), ResumableTrainer(14)))}, s.path(""),
                        std::chrono::seconds(120));
  ASSERT_EQ(whole.exit.code, 0) << whole.output;
  StopAndResume(s, [](int steps) { return ResumableTrainer(steps); });
}

// A streamed folder of JPEGs with random resized crops and flips (examples/fashion-jpegs):
// each picture's crop comes from (seed, epoch, index), so a run stopped mid-epoch and resumed
// draws what the uninterrupted one drew, step for step; the log says how the folder is read.
std::string StreamedTrainer(int max_steps) {
  const std::string pics = std::string(TRAINCTL_SOURCE_DIR) + "/examples/fashion-jpegs";
  return "  model: cnn\n  data: {dataset: imagefolder, dir: " + pics + "/train, test_dir: " + pics +
         "/test, shape: [1, 32, 32], load: stream, threads: 2, augment: {random_resized_crop: true, "
         "scale: [0.3, 1.0], flip: true}}\n  batch_size: 32\n  threads: 1\n  deterministic: true\n  epochs: 2\n"
         "  eval: false\n  log_every: 1\n  checkpoint_every: 4\n  optimizer: {name: sgd, lr: 0.05, momentum: 0.9}\n"
         "  max_steps: " +
         std::to_string(max_steps) + "\n";
}

TEST(Trainer, AStreamedFolderWithRandomCropsResumesExactly) {
  Scratch s;
  auto whole = Trainctl({"run", s.Write("a.yaml", Spec("whole", s.path("a"), StreamedTrainer(14)))}, s.path(""),
                        std::chrono::seconds(120));
  ASSERT_EQ(whole.exit.code, 0) << whole.output;
  EXPECT_NE(whole.output.find("600 training images in 10 classes"), std::string::npos) << whole.output;
  EXPECT_NE(whole.output.find("streamed, each batch decoded as it is used (load: stream)"), std::string::npos)
      << whole.output;
  StopAndResume(s, StreamedTrainer);
}

// The layers of a model declared in the spec: the fast recipe's batch-norm CNN (issue 48), with a
// residual block so that every kind of parameter-holding layer is in it.
const char* kDeclaredLayers = R"(  model:
    layers:
      - conv: {channels: 16, padding: 1}
      - maxpool: 2
      - batchnorm
      - relu
      - residual:
          - conv: {channels: 16, padding: 1, bias: false}
          - batchnorm
      - conv: {channels: 32, stride: 2, padding: 1}
      - batchnorm
      - relu
      - flatten
      - dropout: 0.1
      - linear
)";

// With augmentation: the resumed run must draw each image's shift and mirror as the uninterrupted one.
std::string DeclaredTrainer(int max_steps) {
  std::string t = ResumableTrainer(max_steps);
  t.replace(t.find("  model: cnn\n"), 13, kDeclaredLayers);
  return t.replace(t.find("test_limit: 300}"), 16, "test_limit: 300, augment: {crop_padding: 2, flip: true}}");
}

// A declared model trains, resumes exactly from its checkpoint, and is evaluated and used for
// predictions from the exported file alone (the layers travel in its metadata); a checkpoint of
// another declaration is refused, not loaded into the wrong layers.
TEST(Trainer, ADeclaredModelTrainsResumesExactlyAndIsEvaluatedFromItsFile) {
  Scratch s;
  const std::string spec_a = s.Write("a.yaml", Spec("whole", s.path("a"), DeclaredTrainer(14)));
  auto valid = Trainctl({"validate", spec_a}, s.path(""));
  ASSERT_EQ(valid.exit.code, 0) << valid.output;
  EXPECT_NE(valid.output.find("model: 1x28x28 images in, 10 classes out"), std::string::npos) << valid.output;
  EXPECT_NE(valid.output.find("4.0  block1.conv1  conv 3x3 pad 1, 16, no bias"), std::string::npos) << valid.output;
  EXPECT_NE(valid.output.find("total parameters: 22,922"), std::string::npos) << valid.output;
  auto whole = Trainctl({"run", spec_a}, s.path(""), std::chrono::seconds(120));
  ASSERT_EQ(whole.exit.code, 0) << whole.output;
  EXPECT_NE(whole.output.find("a declared model of 11 layers"), std::string::npos) << whole.output;
  StopAndResume(s, DeclaredTrainer);

  auto eval = Trainctl({"eval", "--checkpoint", s.path("a/model.safetensors"), "--limit", "200", "-o", "json"},
                       s.path(""), std::chrono::seconds(60));
  ASSERT_EQ(eval.exit.code, 0) << eval.output;
  EXPECT_NE(eval.output.find("\"accuracy\""), std::string::npos) << eval.output;
  auto predict = Trainctl({"predict", "--checkpoint", s.path("a/model.safetensors"),
                           "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz", "--top", "1"},
                          s.path(""), std::chrono::seconds(60));
  ASSERT_EQ(predict.exit.code, 0) << predict.output.substr(0, 2000);
  EXPECT_NE(predict.output.find("t10k-images-idx3-ubyte.gz[9999]:"), std::string::npos);

  // The same output directory, one more channel in the last convolution: not this model's state.
  std::string other = DeclaredTrainer(14);
  other.replace(other.find("channels: 32"), 12, "channels: 48");
  auto refused = Trainctl({"run", "--resume", s.Write("c.yaml", Spec("part", s.path("b"), other))}, s.path(""),
                          std::chrono::seconds(120));
  EXPECT_EQ(refused.exit.code, kExitInvalidSpec) << refused.output;  // no restart spent on it
  EXPECT_NE(refused.output.find("holds another declared model"), std::string::npos) << refused.output;
}

// A model from PyTorch (trainer.model: {torchscript: ...}, a batch-norm CNN that Debian's PyTorch
// scripted) trains on two ranks with identical parameters, resumes exactly, and is evaluated from
// the model file.
TEST(Trainer, ATorchScriptModelTrainsResumesExactlyAndIsEvaluated) {
  Scratch s;
  auto made = RunProgram(
      {TRAINCTL_TEST_PYTHON, std::string(TRAINCTL_SOURCE_DIR) + "/tests/python/scripted_models.py", s.path("models")},
      s.path(""));
  ASSERT_EQ(made.exit.code, 0) << made.output;
  auto trainer = [&](int steps) {
    std::string t = ResumableTrainer(steps);
    return t.replace(t.find("  model: cnn\n"), 13, "  model: {torchscript: " + s.path("models/bn_cnn.pt") + "}\n");
  };
  auto whole = Trainctl({"run", s.Write("a.yaml", Spec("whole", s.path("a"), trainer(14)))}, s.path(""),
                        std::chrono::seconds(120));
  ASSERT_EQ(whole.exit.code, 0) << whole.output;
  EXPECT_NE(whole.output.find("training the TorchScript module"), std::string::npos) << whole.output;
  EXPECT_EQ(Digest(s.Read("a/logs/worker-1.log")), Digest(s.Read("a/logs/worker-0.log")));
  StopAndResume(s, trainer);
  // The run keeps the module it trained beside its model and checkpoints; eval loads that copy
  // (the spec's file may change or go), checked against the hash the model records.
  EXPECT_EQ(s.Read("a/model.pt"), s.Read("models/bn_cnn.pt"));
  EXPECT_EQ(s.Read("a/checkpoints/model.pt"), s.Read("models/bn_cnn.pt"));
  std::filesystem::rename(s.path("models/bn_cnn.pt"), s.path("bn_cnn.pt"));
  auto eval = Trainctl({"eval", "--checkpoint", s.path("a/model.safetensors"), "--limit", "100"}, s.path(""),
                       std::chrono::seconds(60));
  ASSERT_EQ(eval.exit.code, 0) << eval.output;
  EXPECT_NE(eval.output.find("Accuracy of the network on the 100 test images"), std::string::npos) << eval.output;
  // Another module in its place is not the one it was trained with: refused, both ways.
  std::filesystem::copy_file(s.path("models/resnet.pt"), s.path("a/model.pt"),
                             std::filesystem::copy_options::overwrite_existing);
  for (const std::vector<std::string>& named :
       {std::vector<std::string>{}, {"--torchscript", s.path("models/resnet.pt")}}) {
    std::vector<std::string> args = {"eval", "--checkpoint", s.path("a/model.safetensors"), "--limit", "100"};
    args.insert(args.end(), named.begin(), named.end());
    auto other = Trainctl(args, s.path(""), std::chrono::seconds(60));
    EXPECT_EQ(other.exit.code, kExitError) << other.output;
    EXPECT_NE(other.output.find("not the TorchScript module " + s.path("a/model.safetensors") + " was trained with"),
              std::string::npos)
        << other.output;
  }
  // The module the user names, when it is the one: evaluated.
  auto named = Trainctl(
      {"eval", "--checkpoint", s.path("a/model.safetensors"), "--limit", "100", "--torchscript", s.path("bn_cnn.pt")},
      s.path(""), std::chrono::seconds(60));
  EXPECT_EQ(named.exit.code, 0) << named.output;
  std::filesystem::rename(s.path("bn_cnn.pt"), s.path("models/bn_cnn.pt"));
  // A file that is not a module is a pre-flight error: no worker starts, no restart is spent.
  s.Write("notes.pt", "not a module");
  std::string t = ResumableTrainer(2);
  t.replace(t.find("  model: cnn\n"), 13, "  model: {torchscript: " + s.path("notes.pt") + "}\n");
  auto refused = Trainctl({"run", s.Write("c.yaml", Spec("bad", s.path("c"), t))}, s.path(""));
  EXPECT_EQ(refused.exit.code, kExitInvalidSpec) << refused.output;
  EXPECT_NE(refused.output.find("trainer.model.torchscript: " + s.path("notes.pt") + ": not a TorchScript module"),
            std::string::npos)
      << refused.output;
}

// trainer.memory_format: checkpoints hold each tensor in its own order whatever the layout, so a
// run stopped at step 7 in channels_last and resumed in contiguous follows
// the uninterrupted contiguous run, step for step. Saved as laid out, the momentum buffer would
// come back scrambled. The losses agree to 1e-5: with the CNN's own oneDNN kernels bit for bit,
// with ATen's (a GPU build's CPU path) channels_last rounds differently in the last digits.
TEST(Trainer, ACheckpointResumesInAnotherMemoryFormat) {
  Scratch s;
  auto run = [&](const std::string& file, const std::string& out, int steps, const std::string& format, bool resume) {
    std::string spec = s.Write(
        file, Spec("layout-" + out, s.path(out), ResumableTrainer(steps) + "  memory_format: " + format + "\n"));
    std::vector<std::string> args = {"run", spec};
    if (resume) args.insert(args.begin() + 1, "--resume");
    return Trainctl(args, s.path(""), std::chrono::seconds(120));
  };
  auto whole = run("a.yaml", "a", 14, "contiguous", false);
  ASSERT_EQ(whole.exit.code, 0) << whole.output;
  auto first = run("b1.yaml", "b", 7, "channels_last", false);
  ASSERT_EQ(first.exit.code, 0) << first.output;
  EXPECT_NE(s.Read("b/logs/worker-0.log").find("on cpu, channels last"), std::string::npos)
      << s.Read("b/logs/worker-0.log");
  auto second = run("b2.yaml", "b", 14, "contiguous", true);
  ASSERT_EQ(second.exit.code, 0) << second.output;
  EXPECT_NE(second.output.find("resuming from"), std::string::npos) << second.output;
  auto a = Losses(s.Read("a/metrics.jsonl"));
  auto b = Losses(s.Read("b/metrics.jsonl"));
  ASSERT_EQ(a.size(), 14u);
  ASSERT_EQ(b.size(), 14u);
  for (int64_t step = 1; step <= 14; ++step) {
    EXPECT_NEAR(std::stod(b[step]), std::stod(a[step]), 1e-5 * std::stod(a[step])) << "step " << step;
  }
  EXPECT_NE(a[1], a[14]);  // it did learn something
}

// `device: cuda`: on a trainctl built with CUDA and NCCL and a machine with a GPU, training on the
// GPU resumes exactly (deterministic mode) and its model evaluates on the CPU; elsewhere the
// worker says why it cannot use a GPU.
TEST(Trainer, DeviceCudaTrainsOnTheGpuOrSaysWhyItCannot) {
  Scratch s;
  auto spec = [&](const std::string& file, const std::string& name, const std::string& out, int steps) {
    return s.Write(file,
                   Spec(name, s.path(out), ResumableTrainer(steps, "cuda"), 1, 1) + "restart: {max_restarts: 0}\n");
  };
  auto whole = Trainctl({"run", spec("a.yaml", "whole", "a", 14)}, s.path(""), std::chrono::seconds(120));
  // Either way a configuration error (exit code 2), not a failure that spends the restart budget.
  if (!TRAINCTL_HAVE_NCCL) {  // found before anything starts
    EXPECT_EQ(whole.exit.code, 2) << whole.output;
    EXPECT_NE(whole.output.find("trainer.device: cuda needs a trainctl built with CUDA and NCCL"), std::string::npos)
        << whole.output;
    auto checked = Trainctl({"validate", s.path("a.yaml")}, s.path(""));
    EXPECT_EQ(checked.exit.code, 2) << checked.output;
    EXPECT_NE(checked.output.find("trainer.device: cuda needs a trainctl built with CUDA and NCCL"), std::string::npos)
        << checked.output;
    return;
  }
  if (!Exists("/dev/nvidiactl")) {  // the worker finds out, and says it no restart can help
    EXPECT_EQ(whole.exit.code, 2) << whole.output;
    EXPECT_NE(s.Read("a/logs/worker-0.log").find("trainer.device: cuda, but this worker cannot use a GPU"),
              std::string::npos)
        << s.Read("a/logs/worker-0.log");
    EXPECT_NE(whole.output.find("failed with an error no restart can fix"), std::string::npos) << whole.output;
    GTEST_SKIP() << "built with NCCL, but there is no GPU here";
  }
  ASSERT_EQ(whole.exit.code, 0) << whole.output;
  EXPECT_NE(s.Read("a/logs/worker-0.log").find("images) on cuda:0"), std::string::npos)
      << s.Read("a/logs/worker-0.log");
  auto first = Trainctl({"run", spec("b1.yaml", "part", "b", 7)}, s.path(""), std::chrono::seconds(120));
  ASSERT_EQ(first.exit.code, 0) << first.output;
  auto second = Trainctl({"run", "--resume", spec("b2.yaml", "part", "b", 14)}, s.path(""), std::chrono::seconds(120));
  ASSERT_EQ(second.exit.code, 0) << second.output;
  EXPECT_NE(second.output.find("resuming from"), std::string::npos) << second.output;
  ExpectResumedLossesEqualUninterrupted(s);
  auto e = Trainctl({"eval", "--checkpoint", s.path("a/model.safetensors"), "-o", "json"}, s.path(""));
  ASSERT_EQ(e.exit.code, 0) << e.output;
  EXPECT_GT(nlohmann::json::parse(e.output.substr(e.output.find('{')))["accuracy"].get<double>(), 0.3) << e.output;
}

TEST(Trainer, ACorruptNewestCheckpointFallsBackToTheOneBefore) {
  Scratch s;
  auto trainer = [](int max_steps) {
    return "  model: cnn\n  data: {limit: 640}\n  batch_size: 32\n  threads: 1\n  eval: false\n"
           "  checkpoint_every: 4\n  max_steps: " +
           std::to_string(max_steps) + "\n";
  };
  auto first = Trainctl({"run", s.Write("a.yaml", Spec("fallback", s.path("out"), trainer(7)))}, s.path(""),
                        std::chrono::seconds(120));
  ASSERT_EQ(first.exit.code, 0) << first.output;
  std::string newest = s.path("out/checkpoints/ckpt-0000000007.safetensors");
  ASSERT_TRUE(Exists(newest));
  std::filesystem::resize_file(newest, std::filesystem::file_size(newest) / 2);  // a torn write
  auto second = Trainctl({"run", "--resume", s.Write("b.yaml", Spec("fallback", s.path("out"), trainer(9)))},
                         s.path(""), std::chrono::seconds(120));
  ASSERT_EQ(second.exit.code, 0) << second.output;
  EXPECT_NE(second.output.find("skipping checkpoint " + newest), std::string::npos) << second.output;
  EXPECT_NE(second.output.find("resuming from " + s.path("out/checkpoints/ckpt-0000000004")), std::string::npos)
      << second.output;

  // An exported model (weights, no training position) put where a checkpoint goes is named as
  // such, not trained from as if it were one.
  std::string last = s.path("out/checkpoints/ckpt-0000000009.safetensors");
  ASSERT_TRUE(Exists(last));
  std::filesystem::copy_file(s.path("out/model.safetensors"), last, std::filesystem::copy_options::overwrite_existing);
  auto third = Trainctl({"run", "--resume", s.Write("c.yaml", Spec("fallback", s.path("out"), trainer(11)))},
                        s.path(""), std::chrono::seconds(120));
  // A configuration error: reported at once, without spending the restart budget on it.
  EXPECT_EQ(third.exit.code, 2) << third.output;
  EXPECT_NE(third.output.find("failed with an error no restart can fix"), std::string::npos) << third.output;
  EXPECT_EQ(CountLines(third.output, "restarting the worker group"), 0) << third.output;
  EXPECT_NE(third.output.find(last + ": metadata field 'optimizer.steps' is missing, expected a whole "
                                     "number from 0 to 1099511627776 (is it an exported model, not a checkpoint?)"),
            std::string::npos)
      << third.output;
  // The trainer wrote its error file as torch's @record would; the report quotes it.
  EXPECT_NE(third.output.find("  error: invalid argument: " + last + ": metadata field"), std::string::npos)
      << third.output;
  EXPECT_NE(s.Read("out/logs/errors/worker-0.r0.t0.json").find("\"message\":\"invalid argument: "), std::string::npos);
}

TEST(Trainer, AKilledWorkerResumesFromTheInMemorySnapshotExactly) {
  Scratch s;
  // Checkpoints only at the end: what the restart resumes from is the snapshot in /dev/shm.
  const std::string trainer =
      "  model: cnn\n  data: {limit: 1280}\n  batch_size: 32\n  threads: 1\n"
      "  deterministic: true\n  epochs: 3\n  max_steps: 50\n  eval: false\n  log_every: 1\n"
      "  checkpoint_every: 1000\n  snapshot_every: 4\n  optimizer: {name: sgd, lr: 0.05, momentum: 0.9}\n";
  auto whole =
      Trainctl({"run", s.Write("a.yaml", Spec("whole", s.path("a"), trainer))}, s.path(""), std::chrono::seconds(120));
  ASSERT_EQ(whole.exit.code, 0) << whole.output;

  Background job({"run", s.Write("b.yaml", Spec("snap", s.path("b"), trainer))}, s.path(""), s.path("run.log"));
  int64_t seen = 0;
  ASSERT_TRUE(Eventually(
      [&] {
        auto losses = Losses(Exists(s.path("b/metrics.jsonl")) ? s.Read("b/metrics.jsonl") : "");
        seen = losses.empty() ? 0 : losses.rbegin()->first;
        return seen >= 6;
      },
      std::chrono::seconds(60)))
      << job.Output();
  auto rank1 = ProcessesWithEnv({"RANK=1", "TRAINCTL_JOB_NAME=snap"});
  ASSERT_EQ(rank1.size(), 1u);
  ASSERT_EQ(::kill(rank1[0], SIGKILL), 0);
  ExitInfo exit = job.Wait(std::chrono::seconds(120));
  const std::string out = job.Output();
  ASSERT_EQ(exit.code, 0) << out;

  std::smatch m;
  static const std::regex re(
      "resuming from (/dev/shm/trainctl-snapshots-\\d+/[^/ ]+)/ckpt-\\d+\\.safetensors \\(step (\\d+),");
  ASSERT_TRUE(std::regex_search(out, m, re)) << out;
  // Step `seen` was logged before the kill, but its snapshot may not be written yet: the one
  // before it, at most snapshot_every (4) steps back, is.
  EXPECT_GE(std::stoll(m[2].str()), seen - 4) << "more than snapshot_every steps lost";
  EXPECT_FALSE(Exists(m[1].str())) << "the snapshot outlived the job";

  auto a = Losses(s.Read("a/metrics.jsonl"));
  auto b = Losses(s.Read("b/metrics.jsonl"));
  ASSERT_EQ(a.size(), 50u);
  ASSERT_EQ(b.size(), 50u);
  for (int64_t step = 1; step <= 50; ++step) EXPECT_EQ(a[step], b[step]) << "step " << step;
}

// The parent pid of a process, from /proc/<pid>/stat (0 when it is gone).
pid_t ParentOf(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(in, line);
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(line.substr(close + 2));
  char state;
  pid_t ppid = 0;
  rest >> state >> ppid;
  return ppid;
}

TEST(Trainer, WorkersCopiedFromAServerWithLibTorchLoadedTrainAsExecdOnes) {
  Scratch s;
  const std::string trainer =
      "  model: cnn\n  data: {limit: 1280}\n  batch_size: 32\n  threads: 1\n"
      "  deterministic: true\n  epochs: 3\n  max_steps: 40\n  eval: false\n  log_every: 1\n"
      "  checkpoint_every: 1000\n  snapshot_every: 4\n  optimizer: {name: sgd, lr: 0.05, momentum: 0.9}\n";
  // Each worker exec'd, as without servers.
  auto execd = Trainctl({"--log-level", "debug", "run", s.Write("a.yaml", Spec("execd", s.path("a"), trainer))},
                        s.path(""), std::chrono::seconds(120), {{"TRAINCTL_WORKER_SERVER", "0"}});
  ASSERT_EQ(execd.exit.code, 0) << execd.output;
  EXPECT_EQ(CountLines(execd.output, "copied from a worker server"), 0) << execd.output;

  Background job({"--log-level", "debug", "run", s.Write("b.yaml", Spec("copied", s.path("b"), trainer))}, s.path(""),
                 s.path("run.log"));
  ASSERT_TRUE(
      Eventually([&] { return Losses(Exists(s.path("b/metrics.jsonl")) ? s.Read("b/metrics.jsonl") : "").size() >= 6; },
                 std::chrono::seconds(60)))
      << job.Output();
  // A copy's environment is its own, in /proc as for getenv (top and tools find tasks there).
  auto rank1 = ProcessesWithEnv({"RANK=1", "LOCAL_RANK=1", "TRAINCTL_JOB_NAME=copied"});
  ASSERT_EQ(rank1.size(), 1u) << job.Output();
  auto cmdline = ProcStrings(rank1[0], "cmdline");
  ASSERT_GE(cmdline.size(), 2u);
  EXPECT_EQ(cmdline[cmdline.size() - 2], "--task");
  EXPECT_EQ(cmdline.back(), "worker-1") << "ps shows the copy's own task";
  // The agent's child, as an exec'd worker is, beside the server it was copied from.
  const pid_t agent = ParentOf(rank1[0]);
  auto agent_cmdline = ProcStrings(agent, "cmdline");
  ASSERT_TRUE(std::find(agent_cmdline.begin(), agent_cmdline.end(), "agent") != agent_cmdline.end());
  auto servers = LiveProcesses([&](pid_t pid) {
    auto c = ProcStrings(pid, "cmdline");
    return ParentOf(pid) == agent && !c.empty() && c.back().rfind("(worker server)", 0) == 0;
  });
  ASSERT_EQ(servers.size(), 1u);
  auto server_env = ProcStrings(servers[0], "environ");
  EXPECT_TRUE(std::none_of(server_env.begin(), server_env.end(), [](const std::string& kv) {
    return kv.rfind("RANK=", 0) == 0 || kv.rfind("TRAINCTL_STORE", 0) == 0;
  })) << "the server holds no task's variables, nor the store's address and token";
  ASSERT_EQ(::kill(rank1[0], SIGKILL), 0);
  ExitInfo exit = job.Wait(std::chrono::seconds(120));
  const std::string out = job.Output();
  ASSERT_EQ(exit.code, 0) << out;
  // Both rounds' workers were copies, and the restart resumed them exactly.
  EXPECT_EQ(CountLines(out, "2 of 2 tasks copied from a worker server"), 2) << out;
  // The server loaded the data (on a second thread while LibTorch loaded) for its copies.
  EXPECT_GE(CountLines(out, "worker server: the data (1280 training images) loaded in"), 1) << out;
  auto a = Losses(s.Read("a/metrics.jsonl"));
  auto b = Losses(s.Read("b/metrics.jsonl"));
  ASSERT_EQ(a.size(), 40u);
  ASSERT_EQ(b.size(), 40u);
  for (int64_t step = 1; step <= 40; ++step) EXPECT_EQ(a[step], b[step]) << "step " << step;
  EXPECT_EQ(Digest(s.Read("b/logs/worker-0.log")), Digest(s.Read("a/logs/worker-0.log")));
  EXPECT_NE(std::find(server_env.begin(), server_env.end(), "TRAINCTL_JOB_NAME=copied"), server_env.end());
  EXPECT_TRUE(
      Eventually([&] { return ProcessesWithEnv({"TRAINCTL_JOB_NAME=copied"}).empty(); }, std::chrono::seconds(5)))
      << "the server or a worker outlived the job";
}

// An agent SIGKILLed: its worker server and the copies it made go with it, as exec'd workers do
// (each has PR_SET_PDEATHSIG, and the server also ends when its channel closes). The launcher
// starts the agent again, whose new server and copies a stop ends in turn.
TEST(Trainer, AWorkerServerAndItsCopiesEndWithTheirSigkilledAgent) {
  Scratch s;
  Background job({"run", s.Write("job.yaml", Spec("orphans", s.path("out"),
                                                  "  model: cnn\n  data: {limit: 1280}\n  batch_size: 32\n"
                                                  "  threads: 1\n  epochs: 1000\n  eval: false\n  log_every: 1\n"))},
                 s.path(""), s.path("run.log"));
  ASSERT_TRUE(Eventually(
      [&] { return Losses(Exists(s.path("out/metrics.jsonl")) ? s.Read("out/metrics.jsonl") : "").size() >= 2; },
      std::chrono::seconds(60)))
      << job.Output();
  auto processes = ProcessesWithEnv({"TRAINCTL_JOB_NAME=orphans"});
  ASSERT_EQ(processes.size(), 3u) << "two workers and their server";
  const pid_t agent = ParentOf(processes[0]);
  for (pid_t p : processes) ASSERT_EQ(ParentOf(p), agent);
  ASSERT_EQ(::kill(agent, SIGKILL), 0);
  for (pid_t p : processes) {
    EXPECT_TRUE(Eventually([p] { return ProcessGone(p); }, std::chrono::seconds(5)))
        << "pid " << p << " outlived its agent";
  }
  std::vector<pid_t> next;
  ASSERT_TRUE(Eventually(
      [&] {
        next = ProcessesWithEnv({"TRAINCTL_JOB_NAME=orphans"});
        return next.size() == 3 && ParentOf(next[0]) != agent;
      },
      std::chrono::seconds(60)))
      << job.Output();
  ::kill(job.pid(), SIGTERM);
  ExitInfo exit = job.Wait(std::chrono::seconds(60));
  EXPECT_EQ(exit.code, kExitInterrupted) << job.Output();
  EXPECT_TRUE(
      Eventually([] { return ProcessesWithEnv({"TRAINCTL_JOB_NAME=orphans"}).empty(); }, std::chrono::seconds(5)))
      << "the new server or a worker outlived the job";
}

TEST(Trainer, ResNet18TrainsOnCifarShapedDataWithIdenticalRanks) {
  Scratch s;
  std::string spec = s.Write("job.yaml", Spec("resnet", s.path("out"), R"(  model: resnet18
  data: {dataset: synthetic, samples: 64, shape: [3, 32, 32], classes: 10}
  batch_size: 4
  max_steps: 2
  threads: 1
  eval: false
)"));
  auto r = Trainctl({"run", spec}, s.path(""), std::chrono::seconds(120));
  ASSERT_EQ(r.exit.code, 0) << r.output;
  std::string d0 = Digest(s.Read("out/logs/worker-0.log"));
  ASSERT_FALSE(d0.empty());
  EXPECT_EQ(Digest(s.Read("out/logs/worker-1.log")), d0);
  // The export holds torchvision's names, BatchNorm buffers included.
  std::string model = s.Read("out/model.safetensors");
  EXPECT_NE(model.find("\"layer4.1.bn2.running_var\""), std::string::npos);
  EXPECT_NE(model.find("\"fc.weight\""), std::string::npos);
}

TEST(Trainer, EvalReportsPerClassAccuracyAndTheConfusionMatrix) {
  Scratch s;
  std::string spec = s.Write("job.yaml", Spec("evaljob", s.path("out"), R"(  model: cnn
  data: {limit: 512, test_limit: 100}
  batch_size: 32
  threads: 1
)",
                                              1, 1));
  auto r = Trainctl({"run", spec}, s.path(""), std::chrono::seconds(120));
  ASSERT_EQ(r.exit.code, 0) << r.output;
  EXPECT_NE(r.output.find("test accuracy"), std::string::npos) << r.output;

  auto text = Trainctl({"eval", "--checkpoint", s.path("out/model.safetensors"), "--limit", "300"}, s.path(""));
  ASSERT_EQ(text.exit.code, 0) << text.output;
  EXPECT_NE(text.output.find("Accuracy of the network on the 300 test images"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("Accuracy for class: Sneaker"), std::string::npos) << text.output;

  auto js = Trainctl({"eval", "--checkpoint", s.path("out/checkpoints"), "--limit", "300", "-o", "json"}, s.path(""));
  ASSERT_EQ(js.exit.code, 0) << js.output;
  auto j = nlohmann::json::parse(js.output.substr(js.output.find('{')));  // after eval's line on stderr
  EXPECT_EQ(j["images"], 300);
  ASSERT_EQ(j["classes"].size(), 10u);
  ASSERT_EQ(j["confusion_matrix"].size(), 10u);
  int64_t total = 0, diagonal = 0, class_images = 0;
  for (int t = 0; t < 10; ++t) {
    int64_t row = 0;
    for (int p = 0; p < 10; ++p) row += j["confusion_matrix"][t][p].get<int64_t>();
    total += row;
    diagonal += j["confusion_matrix"][t][t].get<int64_t>();
    EXPECT_EQ(j["classes"][t]["images"].get<int64_t>(), row);
    class_images += j["classes"][t]["images"].get<int64_t>();
  }
  EXPECT_EQ(total, 300);
  EXPECT_EQ(class_images, 300);
  EXPECT_DOUBLE_EQ(j["accuracy"].get<double>(), diagonal / 300.0);
  EXPECT_GT(j["accuracy"].get<double>(), 0.3);  // better than chance (0.1) after 16 steps
}

TEST(Trainer, BadInputGivesAClearError) {
  Scratch s;
  std::string missing =
      s.Write("missing.yaml", Spec("nodata", s.path("out"), "  data: {dataset: mnist, dir: /nonexistent}\n"));
  for (const char* verb : {"run", "validate"}) {  // one pre-flight for both
    auto r = Trainctl({verb, missing}, s.path(""));
    EXPECT_EQ(r.exit.code, 2) << verb << "\n" << r.output;
    EXPECT_NE(r.output.find("/nonexistent/train-images-idx3-ubyte"), std::string::npos) << r.output;
  }

  s.Write("bad.safetensors", "not a model");
  auto e = Trainctl({"eval", "--checkpoint", s.path("bad.safetensors")}, s.path(""));
  EXPECT_EQ(e.exit.code, 1) << e.output;
  EXPECT_NE(e.output.find(s.path("bad.safetensors")), std::string::npos) << e.output;
}

TEST(Trainer, AStalledRankIsNamedWithItsHostAndTheJobRecovers) {
  Scratch s;
  std::string spec = s.Write("job.yaml", Spec("stall", s.path("out"), R"(  model: cnn
  data: {limit: 640, test_limit: 100}
  batch_size: 8
  threads: 1
  epochs: 2
  log_every: 1
  checkpoint_every: 10
  eval: false
timeouts: {collective: 2s, stop_grace: 2s}
)"));
  Background job({"run", spec}, s.path(""), s.path("run.log"));
  // Once rank 1 is training and a checkpoint exists, stop rank 1 as a debugger or a stuck NFS
  // read would.
  ASSERT_TRUE(Eventually([&] { return !checkpoint::CheckpointDir(s.path("out/checkpoints"), 1).List().empty(); },
                         std::chrono::seconds(60)))
      << job.Output();
  auto rank1 = ProcessesWithEnv({"RANK=1", "TRAINCTL_JOB_NAME=stall"});
  ASSERT_EQ(rank1.size(), 1u);
  ASSERT_EQ(::kill(rank1[0], SIGSTOP), 0);

  ExitInfo exit = job.Wait(std::chrono::seconds(120));
  const std::string out = job.Output();
  EXPECT_EQ(exit.code, 0) << out;
  EXPECT_NE(out.find("timed out on rank 0 after 1.8s: rank(s) 1 did not arrive"), std::string::npos) << out;
  EXPECT_NE(out.find("stalled or unreachable: rank 1 on "), std::string::npos) << out;
  EXPECT_NE(out.find("pid " + std::to_string(rank1[0]) + ")"), std::string::npos) << out;
  EXPECT_NE(out.find("restarting the worker group (restart 1 of 3)"), std::string::npos) << out;
  EXPECT_NE(out.find("resuming from"), std::string::npos) << out;
  EXPECT_TRUE(ProcessGone(rank1[0])) << "the stopped worker was left behind";
}

// A rank that hangs while computing (neither stopped nor blocked in the kernel, which the agent
// sees in /proc) is named by the others' progress watchdogs within seconds of the bound (10x the
// slowest step, at least 5 s), not at timeouts.collective (60 s): with its host, pid and phase.
TEST(Trainer, ARankThatHangsComputingIsNamedLongBeforeTheCollectiveTimeout) {
  Scratch s;
  std::string spec = s.Write("job.yaml", Spec("hang", s.path("out"), R"(  model: cnn
  data: {limit: 640, test_limit: 100}
  batch_size: 8
  threads: 1
  log_every: 1
  eval: false
restart: {max_restarts: 0}
)"));
  const auto start = Clock::now();
  auto r = Trainctl({"run", spec}, s.path(""), std::chrono::seconds(120), {{"TRAINCTL_FAULT_HANG", "1:12"}});
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_EQ(r.exit.code, 3) << r.output;
  EXPECT_NE(r.output.find("TRAINCTL_FAULT_HANG: rank 1 hangs at step 12"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("no training step for "), std::string::npos) << r.output;
  const size_t named = r.output.find("rank 1 on ");
  ASSERT_NE(named, std::string::npos) << r.output;
  EXPECT_NE(r.output.find(", pid ", named), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("is stuck in the forward pass for ", named), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("after 12 steps", named), std::string::npos) << r.output;
  EXPECT_LT(seconds, 45) << "not named before the collective timeout (60 s):\n" << r.output;
}

// A rank whose training thread stops inside a waiting phase (the gradient exchange) while its
// other threads live on reports "waiting" as the others do: the communicator tells the others it
// has not reached the collective, and it is named as quickly as one stuck computing.
TEST(Trainer, ARankThatStopsInTheGradientExchangeIsNamedLongBeforeTheCollectiveTimeout) {
  Scratch s;
  std::string spec = s.Write("job.yaml", Spec("hang", s.path("out"), R"(  model: cnn
  data: {limit: 640, test_limit: 100}
  batch_size: 8
  threads: 1
  log_every: 1
  eval: false
restart: {max_restarts: 0}
)"));
  const auto start = Clock::now();
  auto r = Trainctl({"run", spec}, s.path(""), std::chrono::seconds(120), {{"TRAINCTL_FAULT_HANG", "1:12:gradients"}});
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_EQ(r.exit.code, 3) << r.output;
  EXPECT_NE(r.output.find("TRAINCTL_FAULT_HANG: rank 1 hangs at step 12 in the gradient exchange"), std::string::npos)
      << r.output;
  const size_t named = r.output.find("rank 1 on ");
  ASSERT_NE(named, std::string::npos) << r.output;
  EXPECT_NE(r.output.find("is stuck in the gradient exchange for ", named), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("has not reached the collective the others wait in", named), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("rank 0 on "), std::string::npos) << "the rank that waited was named:\n" << r.output;
  EXPECT_LT(seconds, 45) << "not named before the collective timeout (60 s):\n" << r.output;
}

TEST(Trainer, TrainingGoesOnWhenOneOfThreeEtcdMembersIsKilled) {
  EtcdCluster etcd(3);
  Scratch s;
  std::string url = "etcd://" + Join(etcd.endpoints(), ",");
  // 2 nodes: the agents' rounds, heartbeats and the Gloo rendezvous all go through etcd.
  std::string spec = s.Write("job.yaml", Spec("etcd3", s.path("out"), R"(  model: cnn
  data: {limit: 1280, test_limit: 100}
  batch_size: 8
  threads: 1
  log_every: 1
  eval: false
rendezvous: )" + url + "\n",
                                              2, 1));
  Background job({"run", spec}, s.path(""), s.path("run.log"));
  ASSERT_TRUE(Eventually([&] { return SplitLines(s.Read("out/metrics.jsonl")).size() >= 5; }, std::chrono::seconds(60)))
      << job.Output();
  etcd.Kill(0);  // the member every client tries first
  ExitInfo exit = job.Wait(std::chrono::seconds(120));
  EXPECT_EQ(exit.code, 0) << job.Output();
  auto status = nlohmann::json::parse(s.Read("out/status.json"));
  EXPECT_EQ(status["restarts"], 0) << job.Output();
  EXPECT_EQ(SplitLines(s.Read("out/metrics.jsonl")).size(), 80u + 1) << s.Read("out/metrics.jsonl");
}

}  // namespace
}  // namespace trainctl::testing
