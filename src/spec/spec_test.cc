#include <gtest/gtest.h>

#include "tests/test_util.h"
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "spec/job_spec.h"

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
)", "job.yaml");
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
  EXPECT_NE(e.find("job.yaml:1: nodes: expected a positive integer from 1 to 10000, got \"0\""),
            std::string::npos) << e;
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
)", "job.yaml");
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
                   "\"resnet51\"; did you mean 'resnet50'?"), std::string::npos) << e;
  EXPECT_NE(e.find("job.yaml:5: trainer.epochs:"), std::string::npos) << e;
  EXPECT_NE(e.find("job.yaml:6: trainer.data.dir: required for mnist"), std::string::npos) << e;
  EXPECT_NE(e.find("job.yaml:7: trainer.optimizer.lr: expected a number"), std::string::npos) << e;
  EXPECT_NE(e.find("job.yaml:8: trainer.global_batch_size: expected a multiple of the number of "
                   "training workers (2"), std::string::npos) << e;
  EXPECT_NE(e.find("job.yaml:9: trainer.deterministic: expected true or false"), std::string::npos) << e;
  // GPU memory goes through NCCL, and NCCL takes only GPU memory.
  EXPECT_NE(Errors("name: fm\ntrainer:\n  device: cuda\n  backend: gloo\n")
                .find("job.yaml:4: trainer.backend: expected nccl or auto with device: cuda"),
            std::string::npos);
  EXPECT_NE(Errors("name: fm\ntrainer:\n  backend: nccl\n")
                .find("job.yaml:3: trainer.backend: nccl needs device: cuda"), std::string::npos);
  EXPECT_TRUE(ParseJobSpec("name: fm\ntrainer: {device: cuda, backend: nccl}\n", "job.yaml").ok());
  EXPECT_NE(Errors("name: fm\ncommand: [x]\ntrainer: {}\n").find("not both"), std::string::npos);
  EXPECT_NE(Errors("name: fm\n").find("or a trainer: section"), std::string::npos);
}

TEST(JobSpec, WrongTypes) {
  EXPECT_NE(Errors("name: demo\ncommand: {a: 1}\n").find("job.yaml:2: command: expected a list"),
            std::string::npos);
  EXPECT_NE(Errors("name: demo\ncommand: python3 train.py\n").find("trainctl runs no shell"),
            std::string::npos);
  EXPECT_NE(Errors(std::string(kMinimal) + "env: [A, B]\n").find("env: expected a mapping"),
            std::string::npos);
  EXPECT_NE(Errors(std::string(kMinimal) + "nodes: [1]\n").find("nodes: expected a node count"),
            std::string::npos);
  EXPECT_NE(Errors(std::string(kMinimal) + "args: [[1]]\n").find("args[0]: expected a string"),
            std::string::npos);
  EXPECT_NE(Errors(std::string(kMinimal) + "timeouts: {job: soon}\n")
                .find("timeouts.job: expected a duration"), std::string::npos);
  EXPECT_NE(Errors("name: Demo_Job\ncommand: [x]\n").find("name: expected lowercase"),
            std::string::npos);
  EXPECT_NE(Errors("- a\n- b\n").find("job.yaml:1: expected a mapping of job fields"),
            std::string::npos);
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
  EXPECT_NE(Errors(std::string(kMinimal) + "nodes: {min: 3, max: 2}\n")
                .find("nodes: min (3) is larger than max (2)"), std::string::npos);
  EXPECT_NE(Errors(std::string(kMinimal) + "nodes: {min: 3}\n").find("needs both min and max"),
            std::string::npos);
}

TEST(JobSpec, ReservedEnvironmentIsRejected) {
  EXPECT_EQ(Errors(std::string(kMinimal) + "env:\n  RANK: 3\n"),
            "job.yaml:4: env.RANK: reserved: trainctl sets RANK for every task");
  EXPECT_NE(Errors(std::string(kMinimal) + "env: {TRAINCTL_X: 1}\n").find("reserved"),
            std::string::npos);
  EXPECT_NE(Errors(std::string(kMinimal) + "env: {1BAD: 1}\n").find("invalid variable name"),
            std::string::npos);
}

TEST(JobSpec, HostileInputNeverCrashes) {
  EXPECT_NE(Errors("").find("job.yaml: empty job spec"), std::string::npos);
  EXPECT_NE(Errors("# only a comment\n").find("empty job spec"), std::string::npos);
  EXPECT_NE(Errors(std::string("name: a\0b\n", 10)).find("binary data"), std::string::npos);
  EXPECT_NE(Errors("\x89PNG\r\n\x1a\n\xff\xfe{{{").find("job.yaml"), std::string::npos);
  EXPECT_NE(Errors("name: [unclosed\n").find("job.yaml:"), std::string::npos);
  EXPECT_NE(Errors(std::string(kMinimal) + "procs_per_node: 99999999999999999999999\n")
                .find("from 1 to 1024"), std::string::npos);
  EXPECT_NE(Errors(std::string(kMinimal) + "timeouts: {job: 1e308h}\n").find("timeouts.job"),
            std::string::npos);
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
        case 0: text.insert(pos, 1, alphabet[rng() % alphabet.size()]); break;
        case 1: if (pos < text.size()) text.erase(pos, 1 + rng() % 4); break;
        default: if (pos < text.size()) text[pos] = alphabet[rng() % alphabet.size()];
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
  EXPECT_EQ(spec.status().message(),
            prod + ":3: restart.max_restarts: expected a whole number, got \"lots\"");
}

TEST(LayeredSpec, SetOverridesWithTypedValuesAndIndexes) {
  testing::Scratch s;
  std::string base = s.Write("job.yaml", "name: demo\ncommand: [x]\nargs: [--a, --b]\n");
  auto spec = LoadJobSpec({{base},
                           {"restart.max_restarts=9", "args[1]=--c", "args[2]=--d",
                            "env.NEW=hello", "command=[python3, t.py]", "nodes=1:3"}});
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
  EXPECT_EQ(bad_value.status().message().rfind("--set nodes=two: nodes: expected a positive integer, got \"two\"", 0), 0u)
      << bad_value.status().message();
  auto typo = LoadJobSpec({{base}, {"restart.max_restart=2"}});
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.status().message().find("did you mean 'max_restarts'"), std::string::npos);
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
)", "rt.yaml");
  ASSERT_TRUE(spec.ok());
  auto back = JobSpecFromJson(JobSpecToJson(*spec));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(JobSpecToJson(*back), JobSpecToJson(*spec));
  EXPECT_FALSE(JobSpecFromJson("{").ok());
  EXPECT_FALSE(JobSpecFromJson("{}").ok());
}

}  // namespace
}  // namespace trainctl
