#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "jobspec/job_spec.h"
#include "tests/test_util.h"

namespace trainctl {
namespace {

namespace fs = std::filesystem;

std::string Errors(const std::string& yaml) {
  auto spec = ParseJobSpec(yaml, "job.yaml");
  EXPECT_FALSE(spec.ok()) << "accepted:\n" << yaml;
  return spec.ok() ? "" : spec.status().message();
}

const char* kMinimal = "name: demo\ncommand: [python3, train.py]\n";

TEST(JobSpec, FullSpecParses) {
  auto spec = ParseJobSpec(R"(
name: mnist-ddp
nodes: {min: 1, max: 3}
procs_per_node: 4
command: [python3, train.py]
args: [--epochs, "3"]
env: {OMP_NUM_THREADS: 2, DATA: /data}
working_dir: /work
resources: {cpus: 500m, memory: 4Gi, gpus: 1}
restart: {max_restarts: 7}
timeouts: {rendezvous: 90s, stop_grace: 5s, job: 2h}
output_dir: /out
checkpoint_dir: /ckpt
)",
                           "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->name, "mnist-ddp");
  EXPECT_EQ(spec->nodes.min, 1);
  EXPECT_EQ(spec->nodes.max, 3);
  EXPECT_EQ(spec->procs_per_node, 4);
  EXPECT_EQ(spec->world_size(), 12);
  EXPECT_EQ(spec->command, (std::vector<std::string>{"python3", "train.py"}));
  EXPECT_EQ(spec->args, (std::vector<std::string>{"--epochs", "3"}));
  ASSERT_EQ(spec->env.size(), 2u);
  EXPECT_EQ(spec->env[0], (std::pair<std::string, std::string>{"OMP_NUM_THREADS", "2"}));
  EXPECT_DOUBLE_EQ(spec->resources.cpus, 0.5);
  EXPECT_EQ(spec->resources.memory_bytes, 4LL << 30);
  EXPECT_EQ(spec->resources.gpus, 1);
  EXPECT_EQ(spec->restart.max_restarts, 7);
  EXPECT_EQ(spec->timeouts.rendezvous.count(), 90000);
  EXPECT_EQ(spec->timeouts.stop_grace.count(), 5000);
  EXPECT_EQ(spec->timeouts.job.count(), 7200000);
  EXPECT_EQ(spec->checkpoint_dir, "/ckpt");
}

TEST(JobSpec, DefaultsAreFilledIn) {
  auto spec = ParseJobSpec(kMinimal, "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->nodes.max, 1);
  EXPECT_EQ(spec->procs_per_node, 1);
  EXPECT_EQ(spec->restart.max_restarts, 3);
  EXPECT_EQ(spec->output_dir, "runs/demo");
  EXPECT_EQ(spec->checkpoint_dir, "runs/demo/checkpoints");
  EXPECT_EQ(spec->timeouts.rendezvous.count(), 300000);
}

TEST(JobSpec, ErrorNamesFileLineFieldAndExpectation) {
  EXPECT_EQ(Errors("name: demo\ncommand: [x]\nprocs_per_node: 2\nnodes: two\n"),
            "job.yaml:4: nodes: expected a positive integer, got \"two\"");
  EXPECT_EQ(Errors("name: demo\ncommand: [x]\nprocs_per_node: two\n"),
            "job.yaml:3: procs_per_node: expected a positive integer, got \"two\"");
  EXPECT_EQ(Errors("name: demo\ncommand: [x]\nrestart:\n  max_restarts: -1\n"),
            "job.yaml:4: restart.max_restarts: expected a whole number from 0 to 100000, got \"-1\"");
}

TEST(JobSpec, CpuBindIsNoneOrCores) {
  EXPECT_EQ(Errors("name: demo\ncommand: [x]\ncpu_bind: core\n"),
            "job.yaml:3: cpu_bind: expected one of none, cores, got \"core\"; did you mean 'cores'?");
  auto spec = ParseJobSpec("name: demo\ncommand: [x]\n", "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->cpu_bind, "none");
  spec = ParseJobSpec("name: demo\ncommand: [x]\ncpu_bind: cores\n", "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->cpu_bind, "cores");
  // The agents read the spec as the launcher writes it.
  auto again = JobSpecFromJson(JobSpecToJson(*spec));
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(again->cpu_bind, "cores");
}

TEST(JobSpec, TimelineStepsAreBoundedAndReachTheAgents) {
  EXPECT_EQ(Errors("name: demo\ntrainer:\n  timeline_steps: 5000\n"),
            "job.yaml:3: trainer.timeline_steps: expected a whole number from 0 to 1000, got \"5000\"");
  EXPECT_EQ(Errors("name: demo\ntrainer:\n  timeline_step: 5\n"),
            "job.yaml:3: trainer.timeline_step: unknown field; did you mean 'timeline_steps'?");
  auto spec = ParseJobSpec("name: demo\ntrainer:\n  timeline_steps: 200\n", "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->trainer.timeline_steps, 200);
  auto again = JobSpecFromJson(JobSpecToJson(*spec));
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(again->trainer.timeline_steps, 200);
  // Off by default, and then not written: rendered manifests stay as they were.
  spec = ParseJobSpec("name: demo\ntrainer: {}\n", "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->trainer.timeline_steps, 0);
  EXPECT_EQ(JobSpecToJson(*spec).find("timeline"), std::string::npos);
}

TEST(JobSpec, BalanceBySpeedOnlyWhereItCanWork) {
  EXPECT_EQ(Errors("name: demo\ntrainer:\n  balance: fast\n"),
            "job.yaml:3: trainer.balance: expected one of even, speed, got \"fast\"");
  EXPECT_EQ(Errors("name: demo\ntrainer:\n  deterministic: true\n  balance: speed\n"),
            "job.yaml:4: trainer.balance: speed: it follows the workers' timing, which no two runs share; "
            "expected even with deterministic: true");
  EXPECT_NE(Errors("name: demo\ntrainer:\n  strategy: parameter_server\n  balance: speed\nroles:\n"
                   "  - {name: ps}\n  - {name: worker, replicas: 2}\n")
                .find("job.yaml:4: trainer.balance: speed: it splits the global batch of an allreduce step"),
            std::string::npos);
  EXPECT_EQ(Errors("name: demo\ntrainer:\n  device: cuda\n  balance: speed\n"),
            "job.yaml:4: trainer.balance: speed: a GPU's batches are prepared ahead, and GPUs run alike; "
            "expected even with device: cuda");
  auto spec = ParseJobSpec("name: demo\ntrainer:\n  balance: speed\n", "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  auto again = JobSpecFromJson(JobSpecToJson(*spec));
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(again->trainer.balance, "speed");
}

TEST(JobSpec, UnknownKeysGetADidYouMean) {
  EXPECT_EQ(Errors("name: demo\ncommand: [x]\nprocs_per_nod: 2\n"),
            "job.yaml:3: procs_per_nod: unknown field; did you mean 'procs_per_node'?");
  EXPECT_EQ(Errors("name: demo\ncommand: [x]\nrestart: {max_restart: 2}\n"),
            "job.yaml:3: restart.max_restart: unknown field; did you mean 'max_restarts'?");
  std::string far = Errors("name: demo\ncommand: [x]\nzzzzzz: 1\n");
  EXPECT_NE(far.find("unknown field; expected one of: name, nodes"), std::string::npos) << far;
}

TEST(JobSpec, EveryProblemIsReportedAtOnce) {
  std::string e = Errors("nodes: 0\nprocs_per_node: x\n");
  EXPECT_NE(e.find("job.yaml:1: name: required field is missing"), std::string::npos) << e;
  EXPECT_NE(e.find("job.yaml:1: nodes: expected a positive integer from 1 to 10000, got \"0\""), std::string::npos)
      << e;
  EXPECT_NE(e.find("job.yaml:2: procs_per_node"), std::string::npos) << e;
  EXPECT_NE(e.find("command: required field is missing"), std::string::npos) << e;
  EXPECT_LT(e.find("job.yaml:1: nodes"), e.find("job.yaml:2: procs_per_node")) << "in line order";
}

TEST(JobSpec, TrainerSectionParsesAndRoundTrips) {
  auto spec = ParseJobSpec(R"(
name: fm
procs_per_node: 2
trainer:
  model: resnet18
  data: {dataset: cifar10, dir: /data/cifar, limit: 100, test_limit: 10}
  epochs: 3
  global_batch_size: 256
  optimizer: {name: adam, lr: 1e-3, weight_decay: 0.01}
  schedule: {name: cosine, warmup_steps: 100, scale_by_world_size: true}
  deterministic: true
  backend: gloo
  checkpoint_every: 500
)",
                           "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  const TrainerSpec& t = spec->trainer;
  EXPECT_TRUE(t.enabled);
  EXPECT_TRUE(spec->command.empty());
  EXPECT_EQ(t.model, "resnet18");
  EXPECT_EQ(t.data.dataset, "cifar10");
  EXPECT_EQ(t.data.dir, "/data/cifar");
  EXPECT_EQ(t.global_batch_size, 256);
  EXPECT_EQ(t.optimizer.name, "adam");
  EXPECT_DOUBLE_EQ(t.optimizer.lr, 1e-3);
  EXPECT_EQ(t.schedule.warmup_steps, 100);
  EXPECT_TRUE(t.schedule.scale_by_world_size);
  EXPECT_EQ(t.backend, "gloo");
  auto back = JobSpecFromJson(JobSpecToJson(*spec));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(JobSpecToJson(*back), JobSpecToJson(*spec));
}

TEST(JobSpec, TrainerErrorsNameTheField) {
  std::string e = Errors(R"(name: fm
procs_per_node: 2
trainer:
  model: resnet51
  epochs: 0
  data: {dataset: mnist}
  optimizer: {name: sgd, lr: fast}
  global_batch_size: 3
  deterministic: yes
)");
  EXPECT_NE(e.find("job.yaml:4: trainer.model: expected one of cnn, resnet18, resnet50, got "
                   "\"resnet51\"; did you mean 'resnet50'?"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("job.yaml:5: trainer.epochs:"), std::string::npos) << e;
  EXPECT_NE(e.find("job.yaml:6: trainer.data.dir: required for mnist"), std::string::npos) << e;
  EXPECT_NE(e.find("job.yaml:7: trainer.optimizer.lr: expected a number"), std::string::npos) << e;
  EXPECT_NE(e.find("job.yaml:8: trainer.global_batch_size: expected a multiple of the number of "
                   "training workers (2"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("job.yaml:9: trainer.deterministic: expected true or false"), std::string::npos) << e;
  // GPU memory goes through NCCL, and NCCL takes only GPU memory.
  EXPECT_NE(Errors("name: fm\ntrainer:\n  device: cuda\n  backend: gloo\n")
                .find("job.yaml:4: trainer.backend: expected nccl or auto with device: cuda"),
            std::string::npos);
  EXPECT_NE(
      Errors("name: fm\ntrainer:\n  backend: nccl\n").find("job.yaml:3: trainer.backend: nccl needs device: cuda"),
      std::string::npos);
  EXPECT_TRUE(ParseJobSpec("name: fm\ntrainer: {device: cuda, backend: nccl}\n", "job.yaml").ok());
  // The parameter servers hold contiguous shards; the GPU's channels-last layout is the workers'.
  EXPECT_NE(Errors("name: fm\ntrainer:\n  strategy: parameter_server\n  memory_format: channels_last\n")
                .find("job.yaml:4: trainer.memory_format: channels_last needs strategy: allreduce"),
            std::string::npos);
  EXPECT_NE(Errors("name: fm\ntrainer: {memory_format: nhwc}\n").find("trainer.memory_format: expected one of"),
            std::string::npos);
  EXPECT_TRUE(
      ParseJobSpec("name: fm\ntrainer: {memory_format: channels_last, cudnn_benchmark: false}\n", "job.yaml").ok());
  EXPECT_NE(Errors("name: fm\ncommand: [x]\ntrainer: {}\n").find("not both"), std::string::npos);
  EXPECT_NE(Errors("name: fm\n").find("or a trainer: section"), std::string::npos);
}

TEST(JobSpec, WrongTypes) {
  EXPECT_NE(Errors("name: demo\ncommand: {a: 1}\n").find("job.yaml:2: command: expected a list"), std::string::npos);
  EXPECT_NE(Errors("name: demo\ncommand: python3 train.py\n").find("trainctl runs no shell"), std::string::npos);
  EXPECT_NE(Errors(std::string(kMinimal) + "env: [A, B]\n").find("env: expected a mapping"), std::string::npos);
  EXPECT_NE(Errors(std::string(kMinimal) + "nodes: [1]\n").find("nodes: expected a node count"), std::string::npos);
  EXPECT_NE(Errors(std::string(kMinimal) + "args: [[1]]\n").find("args[0]: expected a string"), std::string::npos);
  EXPECT_NE(Errors(std::string(kMinimal) + "timeouts: {job: soon}\n").find("timeouts.job: expected a duration"),
            std::string::npos);
  EXPECT_NE(Errors("name: Demo_Job\ncommand: [x]\n").find("name: expected lowercase"), std::string::npos);
  EXPECT_NE(Errors("- a\n- b\n").find("job.yaml:1: expected a mapping of job fields"), std::string::npos);
}

TEST(JobSpec, RendezvousTakesAnEtcdUrl) {
  auto spec = ParseJobSpec(std::string(kMinimal) + "rendezvous: etcd://10.0.0.1:2379,10.0.0.2:2379\n", "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->rendezvous, "etcd://10.0.0.1:2379,10.0.0.2:2379");
  EXPECT_EQ(ParseJobSpec(kMinimal, "job.yaml")->rendezvous, "");
  for (const char* bad : {"etcd://", "etcd://host", "http://h:1", "etcd://h:1,", "etcd://h:99999"}) {
    std::string e = Errors(std::string(kMinimal) + "rendezvous: \"" + bad + "\"\n");
    EXPECT_NE(e.find("job.yaml:3: rendezvous: expected etcd://host:port"), std::string::npos) << e;
  }
}

TEST(JobSpec, NodeRanges) {
  auto range = ParseJobSpec(std::string(kMinimal) + "nodes: \"2:4\"\n", "job.yaml");
  ASSERT_TRUE(range.ok()) << range.status().message();
  EXPECT_EQ(range->nodes.min, 2);
  EXPECT_EQ(range->nodes.max, 4);
  EXPECT_NE(Errors(std::string(kMinimal) + "nodes: {min: 3, max: 2}\n").find("nodes: min (3) is larger than max (2)"),
            std::string::npos);
  EXPECT_NE(Errors(std::string(kMinimal) + "nodes: {min: 3}\n").find("needs both min and max"), std::string::npos);
}

TEST(JobSpec, ReservedEnvironmentIsRejected) {
  EXPECT_EQ(Errors(std::string(kMinimal) + "env:\n  RANK: 3\n"),
            "job.yaml:4: env.RANK: reserved: trainctl sets RANK for every task");
  EXPECT_NE(Errors(std::string(kMinimal) + "env: {TRAINCTL_X: 1}\n").find("reserved"), std::string::npos);
  EXPECT_NE(Errors(std::string(kMinimal) + "env: {1BAD: 1}\n").find("invalid variable name"), std::string::npos);
}

// What would change a value behind the user's back is refused where it is written: an escaped
// NUL (arguments and environment values reach programs as C strings) and bytes that are not
// UTF-8 (the resolved spec is JSON; a fuzzer found the launcher crashing on them).
TEST(JobSpec, NulsAndInvalidUtf8AreLocatedErrors) {
  EXPECT_EQ(Errors("name: x\ncommand: [sh]\nargs: [\"--data=/a\\0/b\"]\n"),
            "job.yaml:3: a NUL character (\\0) in \"--data=/a\"...; programs get arguments and environment "
            "values as C strings, which end at one");
  EXPECT_EQ(Errors("name: x\ncommand: [sh]\nenv: {A: \"caf\xe9\"}\n"),
            "job.yaml:3: a value that is not valid UTF-8 text");
  auto ok = ParseJobSpec("name: x\ncommand: [sh]\nenv: {A: \"caf\xc3\xa9 \\xff\"}\n", "job.yaml");
  ASSERT_TRUE(ok.ok()) << ok.status().message();  // real UTF-8, and an escape that is a character
  EXPECT_EQ(JobSpecFromJson(JobSpecToJson(*ok))->env[0].second, "caf\xc3\xa9 \xc3\xbf");
}

TEST(JobSpec, HostileInputNeverCrashes) {
  EXPECT_NE(Errors("").find("job.yaml: empty job spec"), std::string::npos);
  EXPECT_NE(Errors("# only a comment\n").find("empty job spec"), std::string::npos);
  EXPECT_NE(Errors(std::string("name: a\0b\n", 10)).find("binary data"), std::string::npos);
  EXPECT_NE(Errors("\x89PNG\r\n\x1a\n\xff\xfe{{{").find("job.yaml"), std::string::npos);
  EXPECT_NE(Errors("name: [unclosed\n").find("job.yaml:"), std::string::npos);
  EXPECT_NE(Errors(std::string(kMinimal) + "procs_per_node: 99999999999999999999999\n").find("from 1 to 1024"),
            std::string::npos);
  EXPECT_NE(Errors(std::string(kMinimal) + "timeouts: {job: 1e308h}\n").find("timeouts.job"), std::string::npos);
  EXPECT_NE(Errors("name: demo\nname: again\ncommand: [x]\n").find("job.yaml:2: name: duplicate key"),
            std::string::npos);
  std::string deep = "env: " + std::string(5000, '[') + std::string(5000, ']') + "\n";
  EXPECT_FALSE(ParseJobSpec(deep, "job.yaml").ok());
  std::string deep_maps = "a:\n";
  for (int i = 1; i < 200; ++i) deep_maps += std::string(i * 2, ' ') + "b:\n";
  EXPECT_NE(Errors(deep_maps).find("nested more than"), std::string::npos);
  // Alias expansion ("billion laughs") is bounded.
  std::string laughs = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
  for (char c = 'b'; c <= 'j'; ++c) {
    laughs += std::string(1, c) + ": &" + c + " [";
    for (int i = 0; i < 10; ++i) laughs += std::string(i ? ", *" : "*") + static_cast<char>(c - 1);
    laughs += "]\n";
  }
  EXPECT_NE(Errors(laughs).find("document too large"), std::string::npos);
  EXPECT_NE(Errors(std::string(5 << 20, ' ')).find("larger than 4 MiB"), std::string::npos);
}

// 4 MiB of "[" (yaml-cpp queued a token per bracket: 473 MB) is refused before the parser sees
// it, at the line where it nests too deep; brackets in quoted text and comments do not count.
TEST(JobSpec, DeepFlowNestingIsRefusedBeforeItIsParsed) {
  auto peak_mb = [] {
    rusage u{};
    ::getrusage(RUSAGE_SELF, &u);
    return u.ru_maxrss / 1024;
  };
  const long before = peak_mb();
  const std::string brackets = "name: a\ncommand: [x]\nenv:\n  A: " + std::string((4 << 20) - 40, '[');
  auto r = ParseJobSpec(brackets, "job.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "job.yaml:4: nested more than 32 levels deep");
  EXPECT_LT(peak_mb() - before, 50);
  auto quoted = ParseJobSpec("name: a\ncommand: [echo, \"" + std::string(100, '[') +
                                 "\", '{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{']\n"
                                 "# [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\n",
                             "job.yaml");
  EXPECT_TRUE(quoted.ok()) << quoted.status().message();
}

TEST(JobSpec, FuzzedInputNeverCrashes) {
  std::mt19937 rng(42);
  const std::string base =
      "name: demo\nnodes: {min: 1, max: 2}\ncommand: [python3, t.py]\nenv: {A: b}\n"
      "timeouts: {job: 1h}\nresources: {memory: 1Gi}\n";
  const std::string alphabet = "{}[]:,-&*!|>'\"#%@`\n\t 0123456789abcxyz\\\x01\xff";
  for (int i = 0; i < 20000; ++i) {
    std::string text = base;
    int edits = 1 + static_cast<int>(rng() % 8);
    for (int e = 0; e < edits; ++e) {
      size_t pos = rng() % (text.size() + 1);
      switch (rng() % 3) {
        case 0:
          text.insert(pos, 1, alphabet[rng() % alphabet.size()]);
          break;
        case 1:
          if (pos < text.size()) text.erase(pos, 1 + rng() % 4);
          break;
        default:
          if (pos < text.size()) text[pos] = alphabet[rng() % alphabet.size()];
      }
    }
    auto spec = ParseJobSpec(text, "fuzz.yaml");  // must return, ok or not
    if (!spec.ok()) {
      EXPECT_FALSE(spec.status().message().empty());
    }
  }
}

TEST(LayeredSpec, LaterFilesMergeMapsReplaceListsAndNullDeletes) {
  testing::Scratch s;
  std::string base = s.Write("base.yaml",
                             "name: demo\ncommand: [python3, train.py]\nargs: [--a, --b]\n"
                             "env: {A: '1', B: '2'}\nrestart: {max_restarts: 1}\n");
  std::string prod = s.Write("prod.yaml", "nodes: 4\nargs: [--prod]\nenv: {B: '3', A: null}\n");
  auto spec = LoadJobSpec({{base, prod}, {}});
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->nodes.max, 4);
  EXPECT_EQ(spec->args, std::vector<std::string>{"--prod"});
  ASSERT_EQ(spec->env.size(), 1u);
  EXPECT_EQ(spec->env[0], (std::pair<std::string, std::string>{"B", "3"}));
  EXPECT_EQ(spec->restart.max_restarts, 1);
}

TEST(LayeredSpec, ErrorsPointAtTheLayerThatSetTheValue) {
  testing::Scratch s;
  std::string base = s.Write("base.yaml", "name: demo\ncommand: [x]\n");
  std::string prod = s.Write("prod.yaml", "# prod\nrestart:\n  max_restarts: lots\n");
  auto spec = LoadJobSpec({{base, prod}, {}});
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().message(), prod + ":3: restart.max_restarts: expected a whole number, got \"lots\"");
}

TEST(LayeredSpec, SetOverridesWithTypedValuesAndIndexes) {
  testing::Scratch s;
  std::string base = s.Write("job.yaml", "name: demo\ncommand: [x]\nargs: [--a, --b]\n");
  auto spec = LoadJobSpec({{base},
                           {"restart.max_restarts=9", "args[1]=--c", "args[2]=--d", "env.NEW=hello",
                            "command=[python3, t.py]", "nodes=1:3"}});
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->restart.max_restarts, 9);
  EXPECT_EQ(spec->args, (std::vector<std::string>{"--a", "--c", "--d"}));
  EXPECT_EQ(spec->env[0].second, "hello");
  EXPECT_EQ(spec->command[1], "t.py");
  EXPECT_EQ(spec->nodes.max, 3);
}

TEST(LayeredSpec, SetErrorsNameTheFlag) {
  testing::Scratch s;
  std::string base = s.Write("job.yaml", "name: demo\ncommand: [x]\n");
  auto bad_value = LoadJobSpec({{base}, {"nodes=two"}});
  ASSERT_FALSE(bad_value.ok());
  EXPECT_EQ(bad_value.status().message().rfind("--set nodes=two: nodes: expected a positive integer, got \"two\"", 0),
            0u)
      << bad_value.status().message();
  auto typo = LoadJobSpec({{base}, {"restart.max_restart=2"}});
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.status().message().find("did you mean 'max_restarts'"), std::string::npos);
  // A path deeper than any field: refused at once (its memory grew with the square of its length).
  std::string deep = "a";
  for (int i = 0; i < 5000; ++i) deep += ".a";
  auto too_deep = LoadJobSpec({{base}, {deep + "=1"}});
  ASSERT_FALSE(too_deep.ok());
  EXPECT_NE(too_deep.status().message().find("deeper than 32 levels"), std::string::npos);
  for (const char* bad : {"noequals", "=3", "a..b=1", "args[x]=1", "args[9]=1", "args[0=1"}) {
    EXPECT_FALSE(LoadJobSpec({{base}, {bad}}).ok()) << bad;
  }
}

TEST(LayeredSpec, MissingOrUnreadableFiles) {
  testing::Scratch s;
  auto missing = LoadJobSpec({{s.path("nope.yaml")}, {}});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("nope.yaml"), std::string::npos);
  auto directory = LoadJobSpec({{s.path("")}, {}});
  ASSERT_FALSE(directory.ok());
  EXPECT_NE(directory.status().message().find("is a directory, not a file"), std::string::npos)
      << directory.status().message();
  s.Write("huge.yaml", std::string((4 << 20) + 1, ' '));
  auto huge = LoadJobSpec({{s.path("huge.yaml")}, {}});
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().message(), s.path("huge.yaml") + " is larger than 4 MiB");
}

TEST(JobSpecJson, RoundTripsEveryField) {
  auto spec = ParseJobSpec(R"(
name: rt
nodes: "2:5"
procs_per_node: 3
command: [a, b]
args: [c]
env: {X: "y z"}
working_dir: /w
resources: {cpus: 2, memory: 1Gi, gpus: 2}
restart: {max_restarts: 4}
timeouts: {rendezvous: 1m, stop_grace: 3s, job: 1h}
)",
                           "rt.yaml");
  ASSERT_TRUE(spec.ok());
  auto back = JobSpecFromJson(JobSpecToJson(*spec));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(JobSpecToJson(*back), JobSpecToJson(*spec));
  EXPECT_FALSE(JobSpecFromJson("{").ok());
  EXPECT_FALSE(JobSpecFromJson("{}").ok());
}

// The seed's TensorFlow layout: parameter servers, workers, a chief and an evaluator.
const char* kRoles = R"(name: tf
command: [python3, task.py]
env: {SHARED: "1", MODE: job}
resources: {cpus: 1}
roles:
  - name: ps
    replicas: 2
    resources: {cpus: 2, memory: 1Gi}
  - name: worker
    replicas: 3
    env: {MODE: worker}
  - name: chief
  - name: evaluator
    command: [python3, eval.py]
    args: [--watch]
)";

TEST(Roles, ParseAndInheritFromTheJob) {
  auto spec = ParseJobSpec(kRoles, "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  ASSERT_EQ(spec->roles.size(), 4u);
  EXPECT_EQ(spec->world_size(), 7);
  const RoleSpec& ps = spec->roles[0];
  EXPECT_EQ(ps.replicas, 2);
  EXPECT_EQ(ps.command, (std::vector<std::string>{"python3", "task.py"}));
  EXPECT_DOUBLE_EQ(ps.resources.cpus, 2);
  EXPECT_EQ(ps.resources.memory_bytes, 1LL << 30);
  const RoleSpec& worker = spec->roles[1];
  EXPECT_DOUBLE_EQ(worker.resources.cpus, 1);  // the job's
  // The job's env, then the role's, which wins.
  EXPECT_EQ(worker.env, (std::vector<std::pair<std::string, std::string>>{{"SHARED", "1"}, {"MODE", "worker"}}));
  EXPECT_EQ(spec->roles[3].command, (std::vector<std::string>{"python3", "eval.py"}));
  EXPECT_EQ(spec->roles[3].args, std::vector<std::string>{"--watch"});
  // TFJob's success policy: with a chief, the chief decides; ps are services; the evaluator's
  // failure is ignored and it may finish after the job succeeds.
  EXPECT_FALSE(ps.success);
  EXPECT_FALSE(worker.success);
  EXPECT_TRUE(spec->roles[2].success);
  EXPECT_FALSE(spec->roles[3].success);
  EXPECT_EQ(ps.on_failure, "restart_job");
  EXPECT_EQ(spec->roles[3].on_failure, "ignore");
  EXPECT_TRUE(spec->roles[3].finish);
  EXPECT_FALSE(worker.finish);
  // Without a chief every worker decides.
  auto no_chief = ParseJobSpec("name: x\ncommand: [a]\nroles: [{name: ps}, {name: worker, replicas: 2}]\n", "j");
  ASSERT_TRUE(no_chief.ok()) << no_chief.status().message();
  EXPECT_FALSE(no_chief->roles[0].success);
  EXPECT_TRUE(no_chief->roles[1].success);
  auto back = JobSpecFromJson(JobSpecToJson(*spec));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(JobSpecToJson(*back), JobSpecToJson(*spec));
}

TEST(Roles, ErrorsAreLocated) {
  EXPECT_EQ(Errors("name: x\ncommand: [a]\nroles:\n  - {name: ps}\n  - {name: ps}\n"),
            "job.yaml:5: roles[1].name: duplicate role name \"ps\"; role names must differ");
  EXPECT_EQ(Errors("name: x\ncommand: [a]\nroles:\n  - {name: worker, replicas: 0}\n"),
            "job.yaml:4: roles[0].replicas: expected a positive integer from 1 to 10000, got \"0\"");
  EXPECT_EQ(Errors("name: x\ncommand: [a]\nroles:\n  - {name: Work_er}\n"),
            "job.yaml:4: roles[0].name: expected a role name of lowercase letters, digits and '-' "
            "(ps, worker, chief, evaluator, ...), got \"Work_er\"");
  EXPECT_NE(Errors("name: x\ncommand: [a]\nroles:\n  - {name: worker, replica: 2}\n")
                .find("job.yaml:4: roles[0].replica: unknown field; did you mean 'replicas'?"),
            std::string::npos);
  EXPECT_NE(Errors("name: x\ncommand: [a]\nprocs_per_node: 2\nroles: [{name: worker}]\n")
                .find("job.yaml:3: procs_per_node: goes with a job without roles"),
            std::string::npos);
  EXPECT_NE(Errors("name: x\ncommand: [a]\nnodes: 1:3\nroles: [{name: worker, replicas: 3}]\n")
                .find("job.yaml:3: nodes: a job with roles runs on a fixed number of nodes"),
            std::string::npos);
  EXPECT_NE(Errors("name: x\nroles:\n  - {name: worker}\n").find("job.yaml:3: roles[0].command: required"),
            std::string::npos);
  EXPECT_NE(Errors("name: x\ncommand: [a]\nroles: [{name: ps}, {name: evaluator}]\n")
                .find("job.yaml:3: roles: no role decides the job's success"),
            std::string::npos);
  EXPECT_NE(
      Errors("name: x\ncommand: [a]\nnodes: 3\nroles: [{name: worker, replicas: 2}]\n").find("fewer than the 3 nodes"),
      std::string::npos);
  EXPECT_NE(Errors("name: x\ncommand: [a]\nroles: []\n").find("job.yaml:3: roles: expected a list of roles"),
            std::string::npos);
  EXPECT_NE(Errors("name: x\ncommand: [a]\nroles: [{name: w, on_failure: retry}]\n")
                .find("roles[0].on_failure: expected one of restart_job, restart_task, ignore"),
            std::string::npos);
  EXPECT_NE(Errors("name: x\ncommand: [a]\nroles: [{name: w, env: {RANK: 1}}]\n").find("roles[0].env.RANK: reserved"),
            std::string::npos);
}

TEST(Roles, TheBuiltInTrainerHasPartsForPsWorkerChiefAndEvaluator) {
  const std::string trainer = "name: x\ntrainer: {epochs: 1, strategy: parameter_server}\n";
  auto ok = ParseJobSpec(trainer +
                             "roles: [{name: ps, replicas: 2}, {name: worker, replicas: 3}, "
                             "{name: evaluator}, {name: importer, command: [sh, import.sh]}]\n",
                         "job.yaml");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(TrainingWorkers(*ok), 3);
  EXPECT_TRUE(ok->roles[0].command.empty());
  EXPECT_EQ(ok->roles[3].command[0], "sh");
  EXPECT_NE(Errors(trainer + "roles: [{name: ps}, {name: worker}, {name: importer}]\n")
                .find("job.yaml:3: roles[2].name: the built-in trainer has parts for the roles ps, "
                      "worker, chief and evaluator; role \"importer\" needs its own command"),
            std::string::npos);
  EXPECT_NE(Errors("name: x\ntrainer: {epochs: 1}\nroles: [{name: ps}, {name: worker}]\n")
                .find("a ps role of the built-in trainer needs trainer.strategy: parameter_server"),
            std::string::npos);
  EXPECT_NE(Errors(trainer + "roles: [{name: worker, replicas: 2}]\n")
                .find("trainer.strategy: parameter_server needs a ps role and a worker"),
            std::string::npos);
  EXPECT_NE(Errors(trainer).find("trainer.strategy: parameter_server needs roles"), std::string::npos);
  // Async workers restart alone by default: a lost worker does not stop the job.
  auto async = ParseJobSpec(
      "name: x\ntrainer: {strategy: parameter_server, parameter_server: "
      "{mode: async}}\nroles: [{name: ps}, {name: worker, replicas: 2}]\n",
      "j");
  ASSERT_TRUE(async.ok()) << async.status().message();
  EXPECT_EQ(async->roles[1].on_failure, "restart_task");
  EXPECT_EQ(async->roles[0].on_failure, "restart_job");
}

TEST(Roles, LayersAndSetReachIntoRoles) {
  testing::Scratch s;
  std::string base = s.Write("job.yaml", kRoles);
  auto spec = LoadJobSpec({{base}, {"roles[1].replicas=16", "roles[0].env.EXTRA=2"}});
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->roles[1].replicas, 16);
  EXPECT_EQ(spec->world_size(), 20);
  EXPECT_EQ(spec->roles[0].env.back(), (std::pair<std::string, std::string>{"EXTRA", "2"}));
  auto bad = LoadJobSpec({{base}, {"roles[1].replicas=none"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "--set roles[1].replicas=none: roles[1].replicas: expected a positive integer, got \"none\"");
}

TEST(Roles, AJobWithoutRolesIsOneWorkerRole) {
  auto spec = ParseJobSpec("name: x\ncommand: [a, b]\nargs: [c]\nprocs_per_node: 3\nnodes: 1:4\n", "j");
  ASSERT_TRUE(spec.ok());
  EXPECT_TRUE(spec->roles.empty());
  auto roles = JobRoles(*spec, 2);
  ASSERT_EQ(roles.size(), 1u);
  EXPECT_EQ(roles[0].name, "worker");
  EXPECT_EQ(roles[0].replicas, 6);
  EXPECT_EQ(roles[0].command, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(roles[0].args, std::vector<std::string>{"c"});
  EXPECT_TRUE(roles[0].success);
  EXPECT_EQ(roles[0].on_failure, "restart_job");
}

// The resolved JSON is itself a spec (`validate --print`, job.json): read back, it resolves to
// the same spec, for jobs with a trainer, roles and a cluster section.
TEST(JobSpecJson, TheResolvedSpecIsAValidSpecOfTheSameJob) {
  const std::vector<std::string> specs = {
      kRoles,
      "name: t\nprocs_per_node: 2\ntrainer: {model: resnet18, global_batch_size: 64, "
      "schedule: {name: step, step_size: 10}, data: {dataset: synthetic, shape: [3, 8, 8]}}\n"
      "cluster: {image: r/t:1, image_pull_secret: pull, token_secret: tok, "
      "storage: {claim: data, class: fast, size: 5Gi}, stage: {url: 'https://x/d.tgz'}, "
      "node_selector: {zone: a}, tolerations: [{key: k, operator: Exists, effect: NoSchedule}]}\n"
      "resources: {cpus: 500m, memory: 3Gi}\nenv: {B: '2', A: '1'}\n",
      "name: ps\ntrainer: {strategy: parameter_server, parameter_server: {mode: async, max_staleness: 3}}\n"
      "roles: [{name: ps, replicas: 2, resources: {cpus: 1}}, {name: worker, replicas: 3}, {name: evaluator}]\n"
      "timeouts: {job: 1h30m, stop_grace: 2.5s}\n"};
  for (const auto& text : specs) {
    auto spec = ParseJobSpec(text, "job.yaml");
    ASSERT_TRUE(spec.ok()) << spec.status().message();
    const std::string json = JobSpecToJson(*spec, 2);
    auto back = ParseJobSpec(json, "job.json");
    ASSERT_TRUE(back.ok()) << back.status().message() << "\n" << json;
    EXPECT_EQ(JobSpecToJson(*back, 2), json);
  }
}

// A generated corpus: random specs over the whole schema (every top-level section, nodes as a
// number, a range or a map, durations and quantities in several units, roles with and without
// their own programs). Each is valid, and parse → print → parse is the identity on every one.
std::string Pick(std::mt19937& rng, const std::vector<std::string>& from) {
  return from[std::uniform_int_distribution<size_t>(0, from.size() - 1)(rng)];
}

std::string GeneratedSpec(std::mt19937& rng, int i) {
  auto coin = [&] { return std::uniform_int_distribution<int>(0, 1)(rng) == 1; };
  auto num = [&](int lo, int hi) { return std::to_string(std::uniform_int_distribution<int>(lo, hi)(rng)); };
  const std::vector<std::string> durations = {"250ms", "3s", "2.5s", "1m", "1m30s", "2h", "90s"};
  std::string y = "name: gen-" + std::to_string(i) + "\n";
  const bool trainer = coin();
  const bool roles = !trainer && coin();  // fixed nodes, and no procs_per_node, with roles
  const int lo = std::uniform_int_distribution<int>(1, 3)(rng);
  const int hi = std::uniform_int_distribution<int>(lo, 6)(rng);
  const int procs = roles ? 1 : std::uniform_int_distribution<int>(1, 8)(rng);
  y += roles ? Pick(rng, {"nodes: " + std::to_string(hi) + "\n"})
             : Pick(rng, {"nodes: " + std::to_string(hi) + "\n",
                          "nodes: \"" + std::to_string(lo) + ":" + std::to_string(hi) + "\"\n",
                          "nodes: {min: " + std::to_string(lo) + ", max: " + std::to_string(hi) + "}\n"});
  if (!roles) y += "procs_per_node: " + std::to_string(procs) + "\n";
  if (trainer) {
    y += "trainer:\n  model: " + Pick(rng, {"cnn", "resnet18", "resnet50"}) + "\n";
    y += "  " +
         Pick(rng,
              {"batch_size: " + num(1, 256),
               "global_batch_size: " + std::to_string(hi * procs * std::uniform_int_distribution<int>(1, 64)(rng))}) +
         "\n";
    if (coin()) y += "  epochs: " + num(1, 20) + "\n";
    if (coin()) y += "  max_steps: " + num(0, 5000) + "\n";
    if (coin()) y += "  seed: " + num(0, 99) + "\n  deterministic: " + Pick(rng, {"true", "false"}) + "\n";
    if (coin()) y += "  threads: " + num(0, 4) + "\n  bucket_mb: " + Pick(rng, {"0.5", "1", "25"}) + "\n";
    if (coin()) y += "  backend: " + Pick(rng, {"auto", "gloo", "shm"}) + "\n";
    if (coin()) y += "  checkpoint_every: " + num(0, 500) + "\n  keep_last: " + num(1, 9) + "\n";
    if (coin())
      y += "  snapshot_every: " + num(0, 100) + "\n  log_every: " + num(1, 100) +
           "\n  eval: " + Pick(rng, {"true", "false"}) + "\n";
    if (coin()) {
      y += "  optimizer: " +
           Pick(rng,
                {"{name: sgd, lr: 0.1, momentum: 0.8, nesterov: true}",
                 "{name: adam, lr: 0.001, beta1: 0.8, beta2: 0.99, eps: 1e-07}", "{name: sgd, weight_decay: 0.0005}"}) +
           "\n";
    }
    if (coin()) {
      y += "  schedule: " +
           Pick(rng, {"{name: step, step_size: " + num(1, 100) + ", gamma: 0.5}",
                      "{name: cosine, warmup_steps: " + num(0, 50) + ", min_lr: 0.0001}",
                      "{name: constant, scale_by_world_size: true}"}) +
           "\n";
    }
    if (coin()) {
      y += "  data: " +
           Pick(rng, {"{dataset: synthetic, samples: " + num(8, 4096) + ", shape: [3, " + num(4, 64) + ", " +
                          num(4, 64) + "], classes: " + num(2, 100) + "}",
                      "{limit: " + num(0, 60000) + ", test_limit: " + num(0, 10000) + "}",
                      "{dataset: mnist, dir: /data/mnist}"}) +
           "\n";
    }
  } else {
    y += "command: " + Pick(rng, {"[python3, train.py]", "[sh, -c, 'echo \"$RANK: #x\"']", "[/opt/app/run]"}) + "\n";
    if (coin()) y += "args: [--lr, '0.1', \"a b\", '']\n";
  }
  if (coin()) y += "env: {" + Pick(rng, {"A: '1', B: two", "PATH_EXTRA: /x:/y", "Z: '', Y: \"q'uote\""}) + "}\n";
  if (coin()) y += "working_dir: /work/" + num(0, 9) + "\n";
  if (coin()) {
    y += "resources: {cpus: " + Pick(rng, {"1", "500m", "2.5"}) + ", memory: " + Pick(rng, {"1Gi", "512Mi", "3G"}) +
         (coin() ? ", gpus: " + num(0, 8) : "") + "}\n";
  }
  if (coin())
    y += "restart: {max_restarts: " + num(0, 100) + ", backoff: " + Pick(rng, durations) + ", backoff_max: 10m}\n";
  if (coin()) {
    y += "timeouts: {rendezvous: " + Pick(rng, durations) + ", stop_grace: " + Pick(rng, durations) +
         ", job: " + Pick(rng, durations) + ", last_call: " + Pick(rng, durations) +
         ", heartbeat: " + Pick(rng, durations) + "}\n";
  }
  if (coin()) y += "rendezvous: etcd://10.0.0." + num(1, 9) + ":2379\n";
  if (coin()) y += "output_dir: /runs/" + num(0, 9) + "\n";
  if (coin()) y += "checkpoint_dir: /ckpt/" + num(0, 9) + "\n";
  if (coin()) {
    y += "cluster:\n  image: registry.example.com/t:" + num(0, 9) + "\n  namespace: ns-" + num(0, 9) + "\n";
    y += Pick(rng, {"  storage: {claim: shared, mount: /mnt/d}\n", "  storage: {class: efs, size: 50Gi}\n", ""});
    if (coin()) y += "  stage: {url: 'https://example.com/d.tgz', sha256: '" + std::string(64, 'a') + "'}\n";
    if (coin()) y += "  tensorboard: false\n";
    if (coin()) y += "  metrics_port: " + num(0, 9999) + "\n  pod_monitor: true\n";
    if (coin()) y += "  node_selector: {pool: gpu}\n  tolerations: [{key: g, operator: Exists, effect: NoSchedule}]\n";
  }
  if (roles) {
    y += "roles:\n";
    y += "  - {name: ps, replicas: " + num(1, 8) + ", resources: {cpus: 2}, env: {R: ps}}\n";
    y += "  - {name: worker, replicas: " + num(hi, 16) + ", on_failure: " + Pick(rng, {"restart_job", "restart_task"}) +
         "}\n";
    if (coin()) y += "  - {name: chief}\n";
    if (coin()) y += "  - {name: evaluator, command: [python3, eval.py], args: [--watch]}\n";
  }
  return y;
}

// Every key the YAML source sets is in the printed spec: the printer drops no field (an identity
// over print alone could not see a field that the printer forgets both times).
void ExpectKeysKept(const YAML::Node& yaml, const nlohmann::json& printed, const std::string& at = "") {
  if (yaml.IsMap()) {
    if (at == "nodes" && !printed.is_object()) return;  // {min, max} is printed as N or "min:max"
    ASSERT_TRUE(printed.is_object()) << at << " is not a map in the printed spec";
    for (const auto& kv : yaml) {
      const std::string key = kv.first.as<std::string>();
      const std::string path = at.empty() ? key : at + "." + key;
      const bool zero = kv.second.IsScalar() && (kv.second.Scalar() == "0" || kv.second.Scalar().empty());
      if (zero) continue;  // the printer leaves out zero values (not set)
      ASSERT_TRUE(printed.contains(key)) << path << " is missing from the printed spec";
      ExpectKeysKept(kv.second, printed[key], path);
    }
  } else if (yaml.IsSequence() && printed.is_array()) {
    ASSERT_EQ(yaml.size(), printed.size()) << at;
    for (size_t i = 0; i < yaml.size(); ++i) ExpectKeysKept(yaml[i], printed[i], at + "[" + std::to_string(i) + "]");
  }
}

TEST(JobSpecJson, ParsePrintParseIsTheIdentityOverAGeneratedCorpus) {
  std::mt19937 rng(20261123);
  for (int i = 0; i < 400; ++i) {
    const std::string yaml = GeneratedSpec(rng, i);
    auto spec = ParseJobSpec(yaml, "gen.yaml");
    ASSERT_TRUE(spec.ok()) << spec.status().message() << "\n" << yaml;
    const std::string json = JobSpecToJson(*spec, 2);
    auto back = ParseJobSpec(json, "printed.json");
    ASSERT_TRUE(back.ok()) << back.status().message() << "\n" << yaml << "\n" << json;
    EXPECT_EQ(JobSpecToJson(*back, 2), json) << yaml;
    ExpectKeysKept(YAML::Load(yaml), nlohmann::json::parse(json));
  }
}

// The same over every example spec (and the Kubernetes example with each of its layers).
TEST(JobSpecJson, ParsePrintParseIsTheIdentityOverTheExamples) {
  const std::string dir = std::string(TRAINCTL_SOURCE_DIR) + "/examples/";
  std::vector<SpecSources> sources;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".yaml") sources.push_back({{e.path().string()}, {}});
  }
  for (const char* layer : {"dev", "prod"}) {
    sources.push_back({{dir + "k8s/base.yaml", dir + "k8s/" + layer + ".yaml"}, {}});
  }
  ASSERT_GE(sources.size(), 7u);
  for (const auto& src : sources) {
    auto spec = LoadJobSpec(src);
    ASSERT_TRUE(spec.ok()) << spec.status().message();
    const std::string json = JobSpecToJson(*spec, 2);
    auto back = ParseJobSpec(json, "printed.json");
    ASSERT_TRUE(back.ok()) << src.files.back() << ": " << back.status().message() << "\n" << json;
    EXPECT_EQ(JobSpecToJson(*back, 2), json) << src.files.back();
    ExpectKeysKept(YAML::LoadFile(src.files.front()), nlohmann::json::parse(json));
  }
}

}  // namespace
}  // namespace trainctl
