// A new user's first hour, from a directory other than the checkout: every example runs as
// shipped, jobs are named as kubectl names pods (logs, status, eval, predict), mistakes are named
// with what was meant, and trainctl installs onto PATH. docs/cli.md, README's Quick start.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>

#include "checkpoint/checkpoint.h"
#include "common/exit_codes.h"
#include "common/strings.h"
#include "tests/test_util.h"

namespace trainctl::testing {
namespace {

using std::chrono::seconds;
using Env = std::vector<std::pair<std::string, std::string>>;

const std::string kSrc = TRAINCTL_SOURCE_DIR;

// Each example as shipped, run from a scratch directory (its program paths are relative to the
// spec's own directory, not to where trainctl runs), made brief with --set; the trained ones then
// evaluated and tried by their job's name.
TEST(FirstHour, EveryExampleRunsAsShippedFromAnotherDirectory) {
  Scratch s;
  const Env env = {{"TRAINCTL_STATE_DIR", s.path("state")}};
  const std::vector<std::string> brief_training = {
      "--set", "trainer.epochs=1",           "--set", "trainer.data.limit=256",
      "--set", "trainer.data.test_limit=64", "--set", "trainer.threads=1"};
  struct Example {
    std::string file;
    std::vector<std::string> sets;
    std::string shows;  // a line of its output
  };
  std::vector<Example> examples = {
      {"hello.yaml", {}, "hello from rank 3 of 4"},
      {"ddp.yaml", {"--set", "env.STEPS=3", "--set", "nodes=1"}, "step   2  loss"},
      {"tensorflow.yaml", {"--set", "roles[1].replicas=2"}, "worker 1 saw ps 0,ps 1"},
      {"fashion-mnist.yaml", brief_training, "test accuracy"},
      {"your-model.yaml", brief_training, "test accuracy"},
      {"parameter-server.yaml", brief_training, "[chief-0]"},
      {"streamed-jpegs.yaml", brief_training, "test accuracy"},
  };
  std::vector<std::string> shipped;
  for (const auto& e : std::filesystem::directory_iterator(kSrc + "/examples")) {
    if (e.path().extension() == ".yaml") shipped.push_back(e.path().filename());
  }
  EXPECT_EQ(shipped.size(), examples.size()) << "an example without a test here";
  for (const auto& e : examples) {
    std::vector<std::string> argv = {"run", kSrc + "/examples/" + e.file};
    argv.insert(argv.end(), e.sets.begin(), e.sets.end());
    auto v = Trainctl({"validate", kSrc + "/examples/" + e.file}, s.path(""), seconds(60), env);
    EXPECT_EQ(v.exit.code, 0) << e.file << "\n" << v.output;
    auto r = Trainctl(argv, s.path(""), seconds(300), env);
    EXPECT_EQ(r.exit.code, 0) << e.file << "\n" << r.output;
    EXPECT_NE(r.output.find(e.shows), std::string::npos) << e.file << "\n" << r.output;
  }
  // Trained models by their job's name: the final model, as eval and predict take it.
  auto eval = Trainctl({"eval", "fashion-mnist", "--limit", "32"}, s.path(""), seconds(120), env);
  EXPECT_EQ(eval.exit.code, 0) << eval.output;
  EXPECT_NE(eval.output.find("Accuracy of the network on the 32 test images"), std::string::npos) << eval.output;
  auto by_dir = Trainctl({"eval", "--checkpoint", "runs/your-model", "--limit", "32", "-o", "json"}, s.path(""),
                         seconds(120), env);
  EXPECT_EQ(by_dir.exit.code, 0) << "a run's output directory\n" << by_dir.output;
  // The README's own images, shipped with the examples.
  auto predicted = Trainctl({"predict", "--checkpoint", "fashion-mnist", kSrc + "/examples/images/ankle-boot.png",
                             kSrc + "/examples/images/pullover.png"},
                            s.path(""), seconds(120), env);
  EXPECT_EQ(predicted.exit.code, 0) << predicted.output;
  EXPECT_NE(predicted.output.find("ankle-boot.png: "), std::string::npos) << predicted.output;
  EXPECT_NE(predicted.output.find("pullover.png: "), std::string::npos) << predicted.output;
  auto nosuch = Trainctl({"eval", "no-such-job"}, s.path(""), seconds(30), env);
  EXPECT_EQ(nosuch.exit.code, kExitInvalidSpec);
  EXPECT_NE(nosuch.output.find("no-such-job: no such model file or directory, nor a job run on this machine"),
            std::string::npos)
      << nosuch.output;
}

// A program or script that is not there is a spec error before anything starts (no restart
// spent), in validate and run alike, named with the path it was looked for at.
TEST(FirstHour, AMissingScriptIsASpecErrorAndSpendsNoRestart) {
  Scratch s;
  ASSERT_TRUE(MakeDirs(s.path("specs")).ok());
  s.Write("specs/job.yaml", "name: nosuch\ncommand: [python3, train.py]\nrestart: {max_restarts: 3}\n");
  for (const char* verb : {"validate", "run"}) {
    auto r = Trainctl({verb, "specs/job.yaml"}, s.path(""), seconds(60), {{"TRAINCTL_STATE_DIR", s.path("state")}});
    EXPECT_EQ(r.exit.code, kExitInvalidSpec) << verb << "\n" << r.output;
    EXPECT_NE(r.output.find("specs/job.yaml: command[1]: " + s.path("specs/train.py") +
                            ": no such script (a relative path is relative to the spec file's directory)"),
              std::string::npos)
        << verb << "\n"
        << r.output;
    EXPECT_EQ(r.output.find("restart"), std::string::npos) << r.output;
  }
  // Next to the spec, it runs, in the directory trainctl runs in.
  s.Write("specs/train.py", "import os\nprint('ran in', os.getcwd())\n");
  auto ok = Trainctl({"run", "specs/job.yaml"}, s.path(""), seconds(60), {{"TRAINCTL_STATE_DIR", s.path("state")}});
  EXPECT_EQ(ok.exit.code, 0) << ok.output;
  EXPECT_NE(ok.output.find("ran in " + std::filesystem::path(s.path("")).parent_path().string() + "\n"),
            std::string::npos)
      << ok.output;
}

// Mistakes named with what was meant: a flag's typo, a value given by --set, no verb at all.
TEST(FirstHour, MistakesAreNamedWithWhatWasMeant) {
  Scratch s;
  s.Write("job.yaml", "name: j\ncommand: ['true']\n");
  auto plain = Trainctl({}, s.path(""));
  EXPECT_EQ(plain.exit.code, 0) << plain.output;
  EXPECT_NE(plain.output.find("torchrun"), std::string::npos) << "the verbs\n" << plain.output;
  auto typo = Trainctl({"validate", "job.yaml", "--sett", "a=b"}, s.path(""));
  EXPECT_EQ(typo.exit.code, kExitInvalidSpec);
  EXPECT_NE(typo.output.find("trainctl validate: unknown flag \"--sett\"; did you mean --set?"), std::string::npos)
      << typo.output;
  auto set = Trainctl({"validate", kSrc + "/examples/fashion-mnist.yaml", "--set", "trainer.data.dir=/nonexistent"},
                      s.path(""));
  EXPECT_EQ(set.exit.code, kExitInvalidSpec);
  EXPECT_NE(set.output.find("--set trainer.data.dir=/nonexistent: trainer.data.dir: "), std::string::npos)
      << set.output;
  // Each verb's help: the job exit codes where the verb runs a job, not on ps or schema.
  EXPECT_NE(Trainctl({"run", "--help"}, s.path("")).output.find("Exit codes:"), std::string::npos);
  for (const char* verb : {"ps", "schema", "logs"}) {
    EXPECT_EQ(Trainctl({verb, "--help"}, s.path("")).output.find("Exit codes:"), std::string::npos) << verb;
  }
  EXPECT_NE(Trainctl({"--help"}, s.path("")).output.find("MPIJob"), std::string::npos) << "render's formats";
}

// logs and status as kubectl's: a job by name, -f before or after it, a rank it does not have is
// an error; without a job, which ones there are.
TEST(FirstHour, LogsAndStatusTakeAJobAsKubectlTakesAPod) {
  Scratch s;
  const Env env = {{"TRAINCTL_STATE_DIR", s.path("state")}};
  auto none = Trainctl({"logs"}, s.path(""), seconds(30), env);
  EXPECT_EQ(none.exit.code, kExitInvalidSpec);
  EXPECT_NE(none.output.find("name the job: a job run on this machine by its name or run id (trainctl ps lists them"),
            std::string::npos)
      << none.output;
  s.Write("two.yaml", "name: two\nprocs_per_node: 2\ncommand: [sh, -c, 'echo line of $RANK']\n");
  ASSERT_EQ(Trainctl({"run", "two.yaml"}, s.path(""), seconds(60), env).exit.code, 0);
  for (const std::vector<std::string>& argv : {std::vector<std::string>{"logs", "-f", "two"}, {"logs", "two", "-f"}}) {
    auto r = Trainctl(argv, s.path(""), seconds(30), env);
    EXPECT_EQ(r.exit.code, 0) << argv[1] << "\n" << r.output;
    EXPECT_NE(r.output.find("[worker-1] line of 1"), std::string::npos) << r.output;
  }
  auto rank = Trainctl({"logs", "two", "--rank", "7"}, s.path(""), seconds(30), env);
  EXPECT_EQ(rank.exit.code, kExitInvalidSpec) << rank.output;
  EXPECT_NE(rank.output.find("has no task of rank 7; its 2 tasks, by rank: worker-0, worker-1"), std::string::npos)
      << rank.output;
  auto listed = Trainctl({"status"}, s.path(""), seconds(30), env);
  EXPECT_NE(listed.output.find("recent: two"), std::string::npos) << listed.output;
  for (const char* verb : {"status", "logs"}) {
    auto help = Trainctl({verb, "--help"}, s.path(""));
    EXPECT_NE(help.output.find("a job run on this machine, by its name"), std::string::npos) << help.output;
    EXPECT_EQ(help.output.find("the job spec (YAML)"), std::string::npos) << help.output;
  }
}

// kubectl apply of rendered manifests needs the store token's Secret: render says how to make it.
TEST(FirstHour, RenderSaysHowToMakeTheTokenSecret) {
  Scratch s;
  auto r = Trainctl({"render", kSrc + "/examples/hello.yaml", "-o", s.path("out")}, s.path(""));
  EXPECT_EQ(r.exit.code, 0) << r.output;
  EXPECT_NE(r.output.find("kubectl create secret generic hello-token -n default --from-literal=token="),
            std::string::npos)
      << r.output;
}

// cmake --install (what scripts/dev install runs) puts trainctl in PREFIX/bin and its plugins where
// it finds them: the installed binary reaches LibTorch's part.
TEST(FirstHour, InstallPutsTrainctlAndItsPluginsUnderThePrefix) {
  Scratch s;
  const std::string build = std::filesystem::path(TRAINCTL_BIN).parent_path().parent_path();
  auto installed = RunProgram({"cmake", "--install", build, "--prefix", s.path("prefix")}, s.path(""));
  ASSERT_EQ(installed.exit.code, 0) << installed.output;
  const std::string exe = s.path("prefix/bin/trainctl");
  ASSERT_TRUE(Exists(exe));
  EXPECT_TRUE(Exists(s.path("prefix/lib/trainctl/trainctl-torch.so")));
  s.Write("garbage.safetensors", "not a model");
  auto r = RunProgram({exe, "eval", "--checkpoint", s.path("garbage.safetensors")}, s.path(""));
  EXPECT_NE(r.exit.code, 0);
  EXPECT_EQ(r.output.find("the LibTorch part of trainctl"), std::string::npos) << "the plugin was found\n" << r.output;
  EXPECT_NE(r.output.find("garbage.safetensors"), std::string::npos) << r.output;
}

// A folder of `classes` class folders of the shipped Fashion-MNIST JPEGs (examples/fashion-jpegs),
// `per` pictures each, at `dir`.
void PicturesFolder(const Scratch& s, const std::string& dir, int classes, int per) {
  namespace fs = std::filesystem;
  const std::string from = kSrc + "/examples/fashion-jpegs/train";
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(from)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  for (int c = 0; c < classes; ++c) {
    fs::create_directories(s.path(dir + "/" + names[c]));
    int n = 0;
    for (const auto& e : fs::directory_iterator(from + "/" + names[c])) {
      if (n++ == per) break;
      fs::copy_file(e.path(), s.path(dir + "/" + names[c] + "/" + e.path().filename().string()));
    }
  }
}

double FinalAccuracy(const Scratch& s, const std::string& out) {
  double acc = -1;
  for (const auto& line : SplitLines(s.Read(out + "/metrics.jsonl"))) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("test_accuracy")) acc = j["test_accuracy"].get<double>();
  }
  return acc;
}

// eval by run id evaluates that run's model, wherever a rerun moved it (a 3-class run, then a
// 4-class rerun in the same output directory); a run that wrote no model is an error, not an
// answer; eval by the job's name takes its newest run that has a model, saying which, when the
// newest failed before writing one (a configuration error only a worker could find).
TEST(FirstHour, EvalTakesTheRunItIsGivenAndAJobsNewestModel) {
  Scratch s;
  const Env env = {{"TRAINCTL_STATE_DIR", s.path("state")}};
  PicturesFolder(s, "three", 3, 20);
  PicturesFolder(s, "four", 4, 20);
  auto job = [&](const std::string& dir, const std::string& model) {
    return s.Write("job.yaml", "name: folders\nprocs_per_node: 1\noutput_dir: " + s.path("out") +
                                   "\ntrainer:\n  model: " + model + "\n  data: {dataset: imagefolder, dir: " + dir +
                                   ", shape: [1, 28, 28]}\n"
                                   "  batch_size: 8\n  max_steps: 3\n  threads: 1\n");
  };
  ASSERT_EQ(Trainctl({"run", job("three", "cnn")}, s.path(""), seconds(120), env).exit.code, 0);
  const std::string first = ReadStatus(s)["run_id"];
  ASSERT_EQ(Trainctl({"run", job("four", "cnn")}, s.path(""), seconds(120), env).exit.code, 0);
  auto older = Trainctl({"eval", first, "-o", "json"}, s.path(""), seconds(60), env);
  ASSERT_EQ(older.exit.code, 0) << older.output;
  EXPECT_EQ(nlohmann::json::parse(older.output.substr(older.output.find('{')))["classes"].size(), 3u) << older.output;
  auto newer = Trainctl({"eval", "folders", "-o", "json"}, s.path(""), seconds(60), env);
  ASSERT_EQ(newer.exit.code, 0) << newer.output;
  EXPECT_EQ(nlohmann::json::parse(newer.output.substr(newer.output.find('{')))["classes"].size(), 4u) << newer.output;
  // A rerun that fails before it writes a model (a module of 5 scores for 4 classes: only the
  // worker, loading it, finds that), then the job by name: the newest run with a model, named.
  auto made = RunProgram({TRAINCTL_TEST_PYTHON, "-c",
                          "import sys, torch, torch.nn as nn\n"
                          "torch.jit.script(nn.Sequential(nn.Flatten(), nn.Linear(784, 5))).save(sys.argv[1])\n",
                          s.path("five.pt")},
                         s.path(""));
  ASSERT_EQ(made.exit.code, 0) << made.output;
  auto failed = Trainctl({"run", job("four", "{torchscript: five.pt}")}, s.path(""), seconds(120), env);
  ASSERT_NE(failed.exit.code, 0) << failed.output;
  const std::string failed_id = ReadStatus(s)["run_id"];
  auto by_id = Trainctl({"eval", failed_id}, s.path(""), seconds(60), env);
  EXPECT_EQ(by_id.exit.code, kExitInvalidSpec) << by_id.output;
  EXPECT_NE(by_id.output.find("run " + failed_id + " of job folders wrote no model and no checkpoint"),
            std::string::npos)
      << by_id.output;
  auto by_name = Trainctl({"eval", "folders", "-o", "json"}, s.path(""), seconds(60), env);
  ASSERT_EQ(by_name.exit.code, 0) << by_name.output;
  EXPECT_NE(by_name.output.find("its newest run " + failed_id + " (failed) wrote no model; using run "),
            std::string::npos)
      << by_name.output;
}

// Image folders as a new user brings them: a test folder of one class is fine, one with a class
// training lacks is refused by validate (not only by run), an empty class folder is refused as
// torchvision refuses it, and without a shape the first picture's is taken and said. A spec
// validated from another directory finds its folders relative to itself.
TEST(FirstHour, ImageFoldersAreCheckedAsTheyWillBeRead) {
  Scratch s;
  PicturesFolder(s, "specs/train", 3, 10);
  PicturesFolder(s, "specs/test", 1, 5);
  const std::string spec = s.Write("specs/job.yaml",
                                   "name: f\ntrainer:\n  model: cnn\n  data: {dataset: imagefolder, "
                                   "dir: train, test_dir: test}\n");
  auto ok = Trainctl({"validate", "specs/job.yaml"}, s.path(""));
  ASSERT_EQ(ok.exit.code, 0) << ok.output;
  EXPECT_NE(ok.output.find("data: " + s.path("specs/train") + ": 30 training and 5 test images in 3 classes"),
            std::string::npos)
      << ok.output;
  EXPECT_NE(ok.output.find("trainer.data.shape: [1, "), std::string::npos) << ok.output;
  EXPECT_NE(ok.output.find("], the first training picture's ("), std::string::npos) << ok.output;
  namespace fs = std::filesystem;
  fs::create_directories(s.path("specs/test/Zebra"));
  fs::copy_file(fs::directory_iterator(kSrc + "/examples/fashion-jpegs/test/Bag")->path(),
                s.path("specs/test/Zebra/1.jpg"));
  auto extra = Trainctl({"validate", spec}, s.path(""));
  EXPECT_EQ(extra.exit.code, kExitInvalidSpec) << extra.output;
  EXPECT_NE(extra.output.find("trainer.data.test_dir: " + s.path("specs/test") + "/Zebra: a class the training folder"),
            std::string::npos)
      << extra.output;
  fs::remove_all(s.path("specs/test/Zebra"));
  fs::create_directories(s.path("specs/train/Empty"));
  auto empty = Trainctl({"validate", spec}, s.path(""));
  EXPECT_EQ(empty.exit.code, kExitInvalidSpec) << empty.output;
  EXPECT_NE(empty.output.find("specs/train/Empty: an empty class folder"), std::string::npos) << empty.output;
  // With the shape given (nothing decodes a first picture), the same: never "valid" first.
  auto shaped = Trainctl({"validate", spec, "--set", "trainer.data.shape=[1, 28, 28]"}, s.path(""));
  EXPECT_EQ(shaped.exit.code, kExitInvalidSpec) << shaped.output;
  EXPECT_NE(shaped.output.find("trainer.data: " + s.path("specs/train") + "/Empty: an empty class folder"),
            std::string::npos)
      << shaped.output;
  EXPECT_EQ(shaped.output.find(": valid: "), std::string::npos) << shaped.output;
}

// A .pt that run would refuse is refused by validate, which loads it and runs a batch of the
// data's shape: torch.save(model) (a pickle), a state_dict, a module of 5 scores for 10 classes,
// one that expects 3 channels of 1-channel data (its cause said). A good one's summary is shown.
TEST(FirstHour, ValidateRefusesWhatRunWouldRefuseOfATorchScriptModule) {
  Scratch s;
  auto made = RunProgram({TRAINCTL_TEST_PYTHON, "-c",
                          "import sys, torch, torch.nn as nn\n"
                          "d = sys.argv[1]\n"
                          "torch.save(nn.Linear(4, 2), d + '/pickled.pt')\n"
                          "torch.save(nn.Linear(4, 2).state_dict(), d + '/state.pt')\n"
                          "torch.jit.script(nn.Sequential(nn.Flatten(), nn.Linear(784, 5))).save(d + '/five.pt')\n"
                          "torch.jit.script(nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 26 * 26, "
                          "10))).save(d + '/rgb.pt')\n"
                          "torch.jit.script(nn.Sequential(nn.Flatten(), nn.Linear(784, 10))).save(d + '/good.pt')\n",
                          s.path("")},
                         s.path(""));
  ASSERT_EQ(made.exit.code, 0) << made.output;
  for (const auto& [file, why] :
       std::vector<std::pair<std::string, std::string>>{{"pickled.pt",
                                                         "not a TorchScript module LibTorch can load (save it with "
                                                         "torch.jit.script(model).save(path), not torch.save)"},
                                                        {"state.pt", "not a TorchScript module LibTorch can load"},
                                                        {"five.pt", "expected [2, 10], one score per class"},
                                                        {"rgb.pt", "to have 3 channels, but got 1 channels instead"}}) {
    s.Write("job.yaml", "name: m\ntrainer: {model: {torchscript: " + file + "}}\n");
    auto r = Trainctl({"validate", "job.yaml"}, s.path(""), seconds(60));
    EXPECT_EQ(r.exit.code, kExitInvalidSpec) << file << "\n" << r.output;
    EXPECT_NE(r.output.find(why), std::string::npos) << file << "\n" << r.output;
    EXPECT_EQ(r.output.find(": valid: "), std::string::npos) << r.output;
  }
  s.Write("job.yaml", "name: m\ntrainer: {model: {torchscript: good.pt}}\n");
  auto good = Trainctl({"validate", "job.yaml"}, s.path(""), seconds(60));
  EXPECT_EQ(good.exit.code, 0) << good.output;
  EXPECT_NE(good.output.find("7850 parameters; a batch of 2 images of 1x28x28 gives [2, 10] scores"), std::string::npos)
      << good.output;
}

// A run that max_steps ends mid-epoch is evaluated at its end all the same.
TEST(FirstHour, ARunEndedByMaxStepsIsEvaluated) {
  Scratch s;
  s.Write("job.yaml", "name: short\nprocs_per_node: 1\noutput_dir: " + s.path("out") +
                          "\ntrainer:\n  model: cnn\n  data: {limit: 512, test_limit: 100}\n  batch_size: 32\n"
                          "  max_steps: 5\n  threads: 1\n");
  auto r = Trainctl({"run", "job.yaml"}, s.path(""), seconds(120), {{"TRAINCTL_STATE_DIR", s.path("state")}});
  ASSERT_EQ(r.exit.code, 0) << r.output;
  EXPECT_GT(FinalAccuracy(s, "out"), 0.05);
  EXPECT_NE(r.output.find("test accuracy"), std::string::npos) << r.output;
  EXPECT_EQ(s.Read("out/metrics.jsonl").find("\"epoch_seconds\""), std::string::npos) << "a part of an epoch";
  // Every step is in a record (fewer than log_every's 50 here): the samples Prometheus counts.
  double steps = 0, samples = 0;
  for (const auto& line : SplitLines(s.Read("out/metrics.jsonl"))) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("window_steps")) continue;
    steps += j["window_steps"].get<double>();
    samples += j["samples_per_s"].get<double>() * j["window_seconds"].get<double>();
  }
  EXPECT_EQ(steps, 5);
  EXPECT_NEAR(samples, 5 * 32, 0.5);
}

// A job's name that two directories ran means the run in (or under) the working directory, else
// is refused naming each; a directory of that name without a model is taken for the name, said;
// a job still running is evaluated from its newest checkpoint, said with its step; eval and
// predict always name the run and the file.
TEST(FirstHour, EvalByNameTakesTheRunHereAndSaysWhichItTook) {
  Scratch s;
  const Env env = {{"TRAINCTL_STATE_DIR", s.path("state")}};
  const std::string spec =
      "name: twice\nprocs_per_node: 1\noutput_dir: out\ntrainer:\n  model: cnn\n"
      "  data: {limit: 256, test_limit: 64}\n  batch_size: 32\n  max_steps: 3\n  threads: 1\n";
  std::string ids[2];
  for (int i = 0; i < 2; ++i) {
    const std::string dir = i == 0 ? "a" : "b";
    s.Write(dir + "/job.yaml", spec);
    ASSERT_EQ(Trainctl({"run", "job.yaml"}, s.path(dir), seconds(120), env).exit.code, 0);
    ids[i] = ReadStatus(s, dir + "/out")["run_id"];
  }
  auto above = Trainctl({"eval", "twice"}, s.path(""), seconds(60), env);
  EXPECT_EQ(above.exit.code, kExitInvalidSpec) << above.output;
  EXPECT_NE(above.output.find("job twice ran in 2 output directories, several under this one"), std::string::npos)
      << above.output;
  for (const auto& id : ids) EXPECT_NE(above.output.find(id + " (succeeded, in "), std::string::npos) << above.output;
  auto in_a = Trainctl({"eval", "twice", "-o", "json"}, s.path("a"), seconds(60), env);
  ASSERT_EQ(in_a.exit.code, 0) << in_a.output;
  EXPECT_NE(in_a.output.find("trainctl eval: run " + ids[0] + " of job twice: " + s.path("a/out/model.safetensors")),
            std::string::npos)
      << in_a.output;
  auto in_b = Trainctl({"predict", "--checkpoint", "twice", kSrc + "/examples/images/ankle-boot.png"}, s.path("b"),
                       seconds(60), env);
  ASSERT_EQ(in_b.exit.code, 0) << in_b.output;
  EXPECT_NE(in_b.output.find("trainctl predict: run " + ids[1] + " of job twice: "), std::string::npos) << in_b.output;
  // A folder named like the job (a dataset's, say) holds no model: the job's name, said so.
  ASSERT_TRUE(MakeDirs(s.path("a/twice")).ok());
  auto folder = Trainctl({"eval", "twice", "-o", "json"}, s.path("a"), seconds(60), env);
  ASSERT_EQ(folder.exit.code, 0) << folder.output;
  EXPECT_NE(folder.output.find("twice is a directory here without a model or checkpoint"), std::string::npos)
      << folder.output;
  EXPECT_NE(folder.output.find("taking it as the job's name"), std::string::npos) << folder.output;
  ASSERT_TRUE(MakeDirs(s.path("a/nothing")).ok());
  auto nothing = Trainctl({"eval", "nothing"}, s.path("a"), seconds(60), env);
  EXPECT_EQ(nothing.exit.code, kExitInvalidSpec) << nothing.output;
  EXPECT_NE(nothing.output.find("and no job of that name ran on this machine"), std::string::npos) << nothing.output;
  // A run still training: its newest checkpoint, and that it is running.
  s.Write("c/job.yaml",
          "name: busy\nprocs_per_node: 1\noutput_dir: out\ntrainer:\n  model: cnn\n"
          "  data: {limit: 256, test_limit: 64}\n  batch_size: 32\n  epochs: 100000\n"
          "  checkpoint_every: 2\n  threads: 1\n");
  Background busy({"run", "job.yaml"}, s.path("c"), s.path("busy.log"), env);
  ASSERT_TRUE(Eventually([&] { return !checkpoint::CheckpointDir(s.path("c/out/checkpoints"), 1).List().empty(); },
                         seconds(120)))
      << busy.Output();
  auto running = Trainctl({"eval", "busy", "-o", "json"}, s.path("c"), seconds(60), env);
  EXPECT_EQ(running.exit.code, 0) << running.output;
  EXPECT_NE(
      running.output.find("of job busy (still running: its newest checkpoint): " + s.path("c/out/checkpoints/ckpt-")),
      std::string::npos)
      << running.output;
  EXPECT_NE(running.output.find(".safetensors, step "), std::string::npos) << running.output;
  EXPECT_EQ(Trainctl({"stop", "busy"}, s.path("c"), seconds(60), env).exit.code, 0);
  EXPECT_NE(busy.Wait(seconds(60)).code, 0);
}

// Bad pictures in a streamed folder under two ranks (issue 75): a truncated JPEG is flagged (not
// decoded with its missing part grey); skipped-images.txt names each bad file once, the first
// one the log names among them, whichever rank skipped it, also for a run max_steps ends; and the
// count is logged every epoch.
TEST(FirstHour, BadPicturesAreCountedEveryEpochAndNamedOnce) {
  Scratch s;
  const Env env = {{"TRAINCTL_STATE_DIR", s.path("state")}};
  PicturesFolder(s, "photos", 3, 24);
  PicturesFolder(s, "test", 3, 6);
  namespace fs = std::filesystem;
  std::vector<std::string> bad;
  for (const auto& e : fs::directory_iterator(s.path("photos"))) {
    for (const auto& f : fs::directory_iterator(e.path())) {
      const std::string cut = e.path().string() + "/cut-" + f.path().filename().string();
      const std::string whole = s.Read(fs::relative(f.path(), s.path("")).string());
      ASSERT_GT(whole.size(), 400u);
      s.Write(fs::relative(cut, s.path("")).string(), whole.substr(0, whole.size() / 2));
      bad.push_back(fs::path(cut).filename().string());
      break;
    }
  }
  ASSERT_EQ(bad.size(), 3u);
  // And one in the test folder: left out of the test's figures, as eval leaves it out.
  for (const auto& e : fs::directory_iterator(s.path("test"))) {
    const auto f = *fs::directory_iterator(e.path());
    const std::string whole = s.Read(fs::relative(f.path(), s.path("")).string());
    s.Write(fs::relative(e.path().string() + "/cut-" + f.path().filename().string(), s.path("")).string(),
            whole.substr(0, whole.size() / 2));
    break;
  }
  auto spec = [&](const std::string& name, const std::string& steps) {
    return s.Write(name + ".yaml", "name: " + name + "\nprocs_per_node: 2\noutput_dir: " + s.path(name) +
                                       "\ntrainer:\n  model: cnn\n  data: {dataset: imagefolder, dir: photos, "
                                       "test_dir: test, shape: [1, 28, 28], load: stream}\n  batch_size: 8\n"
                                       "  threads: 1\n" +
                                       steps);
  };
  for (const auto& [name, steps] : std::vector<std::pair<std::string, std::string>>{
           {"epochs", "  epochs: 3\n"}, {"short", "  epochs: 5\n  max_steps: 5\n"}}) {
    auto r = Trainctl({"run", spec(name, steps)}, s.path(""), seconds(240), env);
    ASSERT_EQ(r.exit.code, 0) << r.output;
    const std::string list = s.Read(name + "/skipped-images.txt");
    int listed = 0;
    for (const auto& b : bad) listed += CountLines(list, b);
    EXPECT_GE(listed, 1) << name << ": " << list;
    for (const auto& line : SplitLines(list)) {
      if (line.empty()) continue;
      EXPECT_EQ(CountLines(list, line), 1) << name << ": listed twice: " << line;
      EXPECT_NE(line.find("cut-"), std::string::npos) << name << ": a good picture listed: " << line;
    }
    // The first the log names is in the file.
    const size_t first = r.output.find("picture file(s) skipped");
    ASSERT_NE(first, std::string::npos) << r.output;
    const size_t named = r.output.find("first: ", first);
    ASSERT_NE(named, std::string::npos) << r.output;
    const std::string first_line = r.output.substr(named + 7, r.output.find('\n', named) - named - 7);
    EXPECT_NE(list.find(first_line), std::string::npos) << first_line << "\n" << list;
    if (name == "epochs") {
      // 18 good test pictures: training's figure and eval's count the same ones.
      EXPECT_NE(r.output.find("epoch 3/3: test accuracy "), std::string::npos) << r.output;
      EXPECT_NE(r.output.find(" (18 images)"), std::string::npos) << r.output;
      auto eval = Trainctl({"eval", "--checkpoint", s.path("epochs/model.safetensors")}, s.path(""), seconds(60), env);
      EXPECT_EQ(eval.exit.code, 0) << eval.output;
      EXPECT_NE(eval.output.find("Accuracy of the network on the 18 test images"), std::string::npos) << eval.output;
      for (int e = 1; e <= 3; ++e) {
        EXPECT_NE(r.output.find("epoch " + std::to_string(e) + ": "), std::string::npos) << r.output;
        EXPECT_TRUE(std::regex_search(
            r.output, std::regex("epoch " + std::to_string(e) + ": [0-9]+ picture file\\(s\\) skipped")))
            << "epoch " << e << "\n"
            << r.output;
      }
    }
  }
}
}  // namespace
}  // namespace trainctl::testing
