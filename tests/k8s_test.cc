// `trainctl render --target k8s` as users run it: every manifest checked against the Kubernetes
// OpenAPI schema (kubernetes-models, tests/k8s/validate.mjs), kustomize overlays built with the
// real `kubectl kustomize` and compared with what the layered spec renders, golden files, and the
// pod's own command line run here: node 0 serving the store, node 1 joining it, a real job.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <yaml-cpp/yaml.h>

#include <csignal>
#include <nlohmann/json.hpp>
#include <regex>

#include "tests/s3_server.h"
#include "tests/test_util.h"

namespace trainctl::testing {
namespace {

const std::string kSrc = TRAINCTL_SOURCE_DIR;

CommandResult Exec(std::vector<std::string> argv, const std::string& cwd = kSrc) { return RunProgram(argv, cwd); }

// The schema checker needs its npm packages (scripts/dev installs them).
void RequireNodeModules() {
  ASSERT_TRUE(fs::exists(kSrc + "/tests/k8s/node_modules/kubernetes-models"))
      << "run `npm ci --prefix tests/k8s` (scripts/dev deps does) to install the schema checker";
}

std::string Render(const Scratch& s, const std::string& out, std::vector<std::string> args) {
  return RenderManifests(s, out, std::move(args), kSrc);
}

TEST(K8s, EveryRenderedManifestPassesTheKubernetesSchema) {
  RequireNodeModules();
  Scratch s;
  const std::string base = kSrc + "/examples/k8s/base.yaml";
  std::vector<std::string> files = {
      Render(s, "job.yaml", {base}),
      Render(s, "prod.yaml", {base, "-f", kSrc + "/examples/k8s/prod.yaml"}),  // elastic, etcd, staging
      Render(s, "dev.yaml", {base, "-f", kSrc + "/examples/k8s/dev.yaml"}),
      Render(s, "pytorchjob.yaml",
             {base, "--format", "pytorchjob", "--set", "resources.gpus=1", "--set", "cluster.pod_monitor=true"}),
      Render(s, "ddp.yaml", {kSrc + "/examples/ddp.yaml"}),  // a user program, no trainer
  };
  std::vector<std::string> argv = {"node", kSrc + "/tests/k8s/validate.mjs"};
  argv.insert(argv.end(), files.begin(), files.end());
  auto r = Exec(argv);
  EXPECT_EQ(r.exit.code, 0) << r.output;
  int objects = 0;
  for (const auto& f : files) objects += CountLines(*ReadFile(f), "---") + 1;
  EXPECT_EQ(CountLines(r.output, ": valid"), objects) << r.output;
  EXPECT_EQ(CountLines(r.output, "INVALID"), 0) << r.output;
  EXPECT_NE(r.output.find("PodMonitor/fashion-mnist: valid"), std::string::npos) << r.output;

  // The checker itself rejects what the API server would.
  std::string bad = s.Read("job.yaml");
  bad = std::regex_replace(bad, std::regex("completions: 2"), "completions: two");
  auto rejected = Exec({"node", kSrc + "/tests/k8s/validate.mjs", s.Write("bad.yaml", bad)});
  EXPECT_EQ(rejected.exit.code, 1) << rejected.output;
  EXPECT_NE(rejected.output.find("Job/fashion-mnist: INVALID: data/spec/completions must be integer"),
            std::string::npos)
      << rejected.output;
  bad = std::regex_replace(s.Read("pytorchjob.yaml"), std::regex("honorLabels: true"), "honorLabels: sometimes");
  rejected = Exec({"node", kSrc + "/tests/k8s/validate.mjs", s.Write("bad-monitor.yaml", bad)});
  EXPECT_EQ(rejected.exit.code, 1) << rejected.output;
  EXPECT_NE(rejected.output.find("PodMonitor/fashion-mnist: INVALID"), std::string::npos) << rejected.output;
}

// Every workload format, for a job without roles and for jobs with roles: the custom resources
// against the upstream Kubeflow CRDs (tests/k8s/crds), everything else against Kubernetes'.
TEST(K8s, EveryFormatPassesTheUpstreamCrdsAndTheKubernetesSchema) {
  RequireNodeModules();
  Scratch s;
  const std::string base = kSrc + "/examples/k8s/base.yaml";
  const std::string ps = kSrc + "/examples/parameter-server.yaml";
  const std::string tf = kSrc + "/examples/tensorflow.yaml";
  std::vector<std::string> files = {
      Render(s, "tfjob.yaml", {base, "--format", "tfjob"}),
      Render(s, "mpijob.yaml", {base, "--format", "mpijob"}),
      Render(s, "trainjob.yaml", {base, "--format", "trainjob", "--set", "cluster.node_selector.pool=cpu"}),
      Render(s, "ps-tfjob.yaml", {ps, "--format", "tfjob"}),
      Render(s, "ps-job.yaml", {ps}),
      Render(s, "tf-tfjob.yaml", {tf, "--format", "tfjob"}),
      Render(s, "tf-job.yaml", {tf, "--format", "job"}),
  };
  std::vector<std::string> argv = {"node", kSrc + "/tests/k8s/validate.mjs"};
  argv.insert(argv.end(), files.begin(), files.end());
  auto r = Exec(argv);
  EXPECT_EQ(r.exit.code, 0) << r.output;
  EXPECT_EQ(CountLines(r.output, "INVALID"), 0) << r.output;
  for (const char* kind : {"TFJob/fashion-mnist", "MPIJob/fashion-mnist", "TrainJob/fashion-mnist",
                           "TFJob/parameter-server", "Job/tensorflow-ps", "Job/tensorflow-evaluator"}) {
    EXPECT_NE(r.output.find(std::string(kind) + ": valid"), std::string::npos) << kind << "\n" << r.output;
  }
  // Each role's pods get that role's resources: a ps pod 2 CPUs, a worker pod 4.
  const std::string tfjob = s.Read("tf-tfjob.yaml");
  EXPECT_NE(tfjob.find("PS:"), std::string::npos);
  EXPECT_NE(tfjob.find("Evaluator:"), std::string::npos);
  EXPECT_EQ(CountLines(tfjob, "cpu: \"4\""), 4) << tfjob;  // worker and chief, requests and limits
  // A custom resource with a field its CRD lacks is refused, as a strict API server would.
  std::string bad = std::regex_replace(s.Read("mpijob.yaml"), std::regex("slotsPerWorker"), "slotsPerWorkers");
  auto rejected = Exec({"node", kSrc + "/tests/k8s/validate.mjs", s.Write("bad.yaml", bad)});
  EXPECT_EQ(rejected.exit.code, 1) << rejected.output;
  EXPECT_NE(rejected.output.find("MPIJob/fashion-mnist: INVALID: against the MPIJob CRD: /spec must NOT "
                                 "have additional properties (slotsPerWorkers)"),
            std::string::npos)
      << rejected.output;
}

// A program that trainctl's own image lacks, and a script that exists only here: render and
// submit warn, naming the field and the way out; a job the image can run gets no warning.
TEST(K8s, AProgramTrainctlsImageLacksIsWarnedAbout) {
  Scratch s;
  auto ddp = Trainctl({"render", "examples/ddp.yaml", "-o", s.path("ddp")}, kSrc);
  EXPECT_EQ(ddp.exit.code, 0) << ddp.output;
  EXPECT_NE(ddp.output.find("warning: examples/ddp.yaml: command: runs /usr/bin/python3, which trainctl's own image "
                            "(trainctl:latest) does not have, and ddp.py is a file on this machine, which "
                            "the pods do not see; set cluster.image"),
            std::string::npos)
      << ddp.output;
  EXPECT_NE(ddp.output.find("(docs/own-program.md)"), std::string::npos) << ddp.output;
  auto tf = Trainctl({"render", "examples/tensorflow.yaml", "-o", s.path("tf"), "--set",
                      "cluster.image=registry.example.com/ml/trainctl:0.1.0"},
                     kSrc);
  EXPECT_NE(tf.output.find("warning: examples/tensorflow.yaml: roles[0].command: runs python3"), std::string::npos)
      << tf.output;
  // trainctl's own image of a stage that cannot run the job: the CPU one for a GPU trainer, one
  // without sshd for an MPIJob.
  auto gpu = Trainctl({"render", "examples/k8s/base.yaml", "--set", "trainer.device=cuda", "-o", s.path("gpu")}, kSrc);
  EXPECT_EQ(gpu.exit.code, 0) << gpu.output;
  EXPECT_NE(gpu.output.find("warning: examples/k8s/base.yaml: trainer.device: cuda needs trainctl's CUDA image "
                            "(deploy/Dockerfile.cuda"),
            std::string::npos)
      << gpu.output;
  auto mpi = Trainctl({"render", "examples/k8s/base.yaml", "--format", "mpijob", "-o", s.path("mpi")}, kSrc);
  EXPECT_EQ(mpi.exit.code, 0) << mpi.output;
  EXPECT_NE(mpi.output.find("warning: examples/k8s/base.yaml: --format mpijob: the workers run sshd and the launcher "
                            "mpirun, which only deploy/Dockerfile's mpi stage has"),
            std::string::npos)
      << mpi.output;
  // An image the kubelet pulls on every start of a TrainJob's node (whose pull policy Trainer
  // cannot set): tagged latest, or not tagged (a registry's port is no tag).
  for (const std::string image : {"trainctl:latest", "registry.example.com:5000/ml/trainctl"}) {
    auto tj = Trainctl({"render", "examples/k8s/base.yaml", "--format", "trainjob", "--set", "cluster.image=" + image,
                        "-o", s.path("tj")},
                       kSrc);
    EXPECT_EQ(tj.exit.code, 0) << tj.output;
    EXPECT_NE(tj.output.find("warning: examples/k8s/base.yaml: cluster.image: " + image +
                             " is pulled from its "
                             "registry each time a TrainJob's node starts"),
              std::string::npos)
        << tj.output;
  }
  for (const std::vector<std::string>& quiet :
       {std::vector<std::string>{"render", "examples/ddp.yaml", "--set", "cluster.image=me/pytorch:2", "-o",
                                 s.path("own")},
        {"render", "examples/k8s/base.yaml", "--set", "trainer.device=cuda", "--set", "cluster.image=trainctl:cuda",
         "-o", s.path("cuda")},
        {"render", "examples/k8s/base.yaml", "--format", "mpijob", "--set", "cluster.image=trainctl:mpi", "-o",
         s.path("mpi-ok")},
        {"render", "examples/tensorflow.yaml", "--set", "cluster.image=trainctl:python", "-o", s.path("py")},
        {"render", "examples/hello.yaml", "-o", s.path("hello")},
        {"render", "examples/k8s/base.yaml", "--format", "trainjob", "--set", "cluster.image=trainctl:dev", "-o",
         s.path("tj-dev")},
        {"render", "examples/k8s/base.yaml", "--format", "trainjob", "--set",
         "cluster.image=registry.example.com:5000/trainctl@sha256:" + std::string(64, 'a'), "-o", s.path("tj-digest")},
        {"render", "examples/k8s/base.yaml", "-o", s.path("base")}}) {
    auto r = Trainctl(quiet, kSrc);
    EXPECT_EQ(r.exit.code, 0) << r.output;
    EXPECT_EQ(r.output.find("warning"), std::string::npos) << quiet[1] << ": " << r.output;
  }
}

// Re-rendered with fewer environments, the overlays no --env names are gone; an output directory
// given with a trailing slash is not printed with two.
TEST(K8s, KustomizeRemovesOverlaysNoLongerNamed) {
  Scratch s;
  const std::string base = "examples/k8s/base.yaml";
  auto both = Trainctl({"render", base, "--format", "kustomize", "-o", s.path("deploy/"), "--env",
                        "dev=examples/k8s/dev.yaml", "--env", "prod=examples/k8s/prod.yaml"},
                       kSrc);
  ASSERT_EQ(both.exit.code, 0) << both.output;
  EXPECT_EQ(both.output.find("//"), std::string::npos) << both.output;
  ASSERT_TRUE(fs::exists(s.path("deploy/overlays/prod/kustomization.yaml")));
  ASSERT_TRUE(MakeDirs(s.path("deploy/overlays/mine")).ok());
  s.Write("deploy/overlays/mine/notes.txt", "a directory of the user's own, not an overlay\n");
  auto one = Trainctl(
      {"render", base, "--format", "kustomize", "-o", s.path("deploy"), "--env", "dev=examples/k8s/dev.yaml"}, kSrc);
  ASSERT_EQ(one.exit.code, 0) << one.output;
  EXPECT_NE(one.output.find("removed " + s.path("deploy") + "/overlays/prod, which no --env names now"),
            std::string::npos)
      << one.output;
  EXPECT_FALSE(fs::exists(s.path("deploy/overlays/prod")));
  EXPECT_TRUE(fs::exists(s.path("deploy/overlays/dev/kustomization.yaml")));
  EXPECT_TRUE(fs::exists(s.path("deploy/overlays/mine/notes.txt")));
}

// The batch script runs `trainctl` from the nodes' PATH: a warning when it is not even on this
// machine's, none once it is or once --trainctl gives its path.
TEST(Render, ASlurmScriptWarnsWhenTrainctlIsNotOnThePath) {
  Scratch s;
  const std::vector<std::string> render = {"render", "examples/hello.yaml", "--target", "slurm", "-o", s.path("jobs/")};
  auto bare = Trainctl(render, kSrc, std::chrono::seconds(60), {{"PATH", "/usr/bin:/bin"}});
  EXPECT_EQ(bare.exit.code, 0) << bare.output;
  EXPECT_NE(bare.output.find("warning: the script runs 'trainctl' from the nodes' PATH, and it is not on this "
                             "machine's (this one is " +
                             std::string(TRAINCTL_BIN) + ")"),
            std::string::npos)
      << bare.output;
  EXPECT_NE(bare.output.find("wrote " + s.path("jobs") + "/hello.sbatch;"), std::string::npos) << bare.output;
  ASSERT_EQ(::symlink(TRAINCTL_BIN, s.path("trainctl").c_str()), 0);
  auto on_path = Trainctl(render, kSrc, std::chrono::seconds(60), {{"PATH", s.path("") + ":/usr/bin:/bin"}});
  EXPECT_EQ(on_path.output.find("warning"), std::string::npos) << on_path.output;
  auto render_abs = render;
  render_abs.insert(render_abs.end(), {"--trainctl", "/shared/bin/trainctl"});
  auto given = Trainctl(render_abs, kSrc, std::chrono::seconds(60), {{"PATH", "/usr/bin:/bin"}});
  EXPECT_EQ(given.output.find("warning"), std::string::npos) << given.output;
  EXPECT_NE(s.Read("jobs/hello.sbatch").find("/shared/bin/trainctl"), std::string::npos);
}

TEST(K8s, AFormatThatCannotExpressTheJobSaysWhy) {
  Scratch s;
  const std::string ps = kSrc + "/examples/parameter-server.yaml";
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {{ps, "--format", "pytorchjob"}, "roles: --format pytorchjob runs one role of identical workers"},
           {{ps, "--format", "mpijob"}, "roles: --format mpijob runs one role"},
           {{kSrc + "/examples/tensorflow.yaml", "--format", "tfjob", "--set", "roles[3].name=importer"},
            "roles[3].name: --format tfjob has the replica types chief, master, ps, worker and evaluator"},
           {{kSrc + "/examples/k8s/base.yaml", "--format", "mpijob", "--set", "nodes=1:3"},
            "nodes: --format mpijob runs a fixed number of nodes"},
           {{kSrc + "/examples/k8s/base.yaml", "--format", "trainjob", "--set", "cluster.stage.url=https://x/d.tgz"},
            "cluster.stage: --format trainjob cannot wait for the data-staging Job"}}) {
    std::vector<std::string> args = {"render"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    auto r = Trainctl(args, s.path(""));
    EXPECT_EQ(r.exit.code, 2) << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << r.output;
  }
}

TEST(K8s, KustomizeOverlaysBuildTheSameObjectsAsTheLayeredSpec) {
  RequireNodeModules();
  Scratch s;
  const std::string base = kSrc + "/examples/k8s/base.yaml";
  auto r = Trainctl({"render", base, "--format", "kustomize", "-o", s.path("deploy"), "--env",
                     "dev=" + kSrc + "/examples/k8s/dev.yaml", "--env", "prod=" + kSrc + "/examples/k8s/prod.yaml"},
                    kSrc);
  ASSERT_EQ(r.exit.code, 0) << r.output;
  for (const std::string env : {"dev", "prod"}) {
    auto built = Exec({"kubectl", "kustomize", s.path("deploy/overlays/" + env)});
    ASSERT_EQ(built.exit.code, 0) << built.output;
    // kubectl's warnings (deprecated fields, kept for kustomize 2) go to stderr, mixed in here.
    std::string yaml = std::regex_replace(built.output, std::regex("(^|\n)(# Warning|E\\d{4})[^\n]*"), "$1");
    const std::string direct = Render(s, env + "-direct.yaml", {base, "-f", kSrc + "/examples/k8s/" + env + ".yaml"});
    auto same = Exec({"node", kSrc + "/tests/k8s/compare.mjs", s.Write(env + "-kustomize.yaml", yaml), direct});
    EXPECT_EQ(same.exit.code, 0) << env << ":\n" << same.output;
    auto valid = Exec({"node", kSrc + "/tests/k8s/validate.mjs", s.path(env + "-kustomize.yaml")});
    EXPECT_EQ(valid.exit.code, 0) << valid.output;
  }
  // prod's own objects (the etcd of its elastic job, the staging Job) are the overlay's.
  EXPECT_TRUE(fs::exists(s.path("deploy/overlays/prod/statefulset-fashion-mnist-etcd.yaml")));
  EXPECT_TRUE(fs::exists(s.path("deploy/overlays/prod/job-fashion-mnist-stage.yaml")));
  EXPECT_FALSE(fs::exists(s.path("deploy/base/job-fashion-mnist-stage.yaml")));
}

TEST(K8s, RenderedManifestsMatchTheGoldenFiles) {
  // After a deliberate change: TRAINCTL_UPDATE_GOLDEN=1 ctest -R Golden, and review the diff.
  struct Case {
    std::string golden;
    std::vector<std::string> args;
  };
  const std::string base = kSrc + "/examples/k8s/base.yaml";
  std::vector<Case> cases = {{"k8s-prod.yaml", {"render", base, "-f", kSrc + "/examples/k8s/prod.yaml"}},
                             {"k8s-pytorchjob.yaml", {"render", base, "--format", "pytorchjob"}}};
  for (const auto& c : cases) {
    auto r = Trainctl(c.args, kSrc);
    ASSERT_EQ(r.exit.code, 0) << r.output;
    const std::string path = kSrc + "/tests/golden/" + c.golden;
    if (std::getenv("TRAINCTL_UPDATE_GOLDEN")) {
      ASSERT_TRUE(AtomicWriteFile(path, r.output).ok());
    }
    auto golden = ReadFile(path);
    ASSERT_TRUE(golden.ok()) << golden.status().ToString();
    EXPECT_EQ(r.output, *golden) << c.golden
                                 << " differs; if the change is intended, rerun with "
                                    "TRAINCTL_UPDATE_GOLDEN=1 and review the diff";
  }
}

TEST(K8s, BadRenderRequestsAreNamed) {
  auto r = Trainctl({"render", kSrc + "/examples/k8s/base.yaml", "--format", "kustomize"}, kSrc);
  EXPECT_EQ(r.exit.code, 2);
  EXPECT_NE(r.output.find("give it with -o DIR"), std::string::npos) << r.output;
  Scratch s;
  std::string spec = s.Write("bad.yaml",
                             "name: x\ncommand: [true]\ncluster:\n  namespace: Prod\n"
                             "  storage: {size: lots}\n  stag: {}\n");
  r = Trainctl({"render", spec}, kSrc);
  EXPECT_EQ(r.exit.code, 2);
  EXPECT_NE(r.output.find("bad.yaml:4: cluster.namespace: expected a Kubernetes object name"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("cluster.storage.size: expected a size such as 100Gi, got \"lots\""), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("cluster.stag: unknown field; did you mean 'stage'?"), std::string::npos) << r.output;
}

// No cluster is reachable from the test machines: these check what users see when theirs is not.
TEST(K8s, ClusterVerbsNameAnUnreachableClusterAndAMissingKubectl) {
  Scratch s;
  const std::string spec = kSrc + "/examples/k8s/base.yaml";
  const std::string kubeconfig =
      s.Write("kubeconfig",
              "apiVersion: v1\nkind: Config\nclusters:\n"
              "- cluster: {server: \"https://127.0.0.1:" +
                  std::to_string(FreePort()) +
                  "\"}\n  name: c\n"
                  "contexts:\n- context: {cluster: c, user: u}\n  name: c\ncurrent-context: c\n"
                  "users:\n- name: u\n  user: {token: t}\n");
  for (const std::string verb : {"submit", "status", "logs", "delete"}) {
    auto r = Trainctl({verb, spec}, s.path(""), std::chrono::seconds(60), {{"KUBECONFIG", kubeconfig}});
    EXPECT_EQ(r.exit.code, 1) << verb << ": " << r.output;
    EXPECT_NE(r.output.find("trainctl " + verb + ": "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("refused"), std::string::npos) << verb << ": " << r.output;
    // One line saying why, not kubectl's log of its retries ("E1123 12:00:00 memcache.go:265] ...").
    EXPECT_FALSE(std::regex_search(r.output, std::regex("(^|\n)E\\d{4} "))) << verb << ": " << r.output;
    EXPECT_EQ(CountLines(r.output, "refused"), 1) << verb << ": " << r.output;
    EXPECT_NE(r.output.find("that is the cluster of kubectl's context c in KUBECONFIG=" + kubeconfig),
              std::string::npos)
        << verb << ": " << r.output;
  }
  // No kubeconfig at all: kubectl's default localhost:8080, and what to set.
  auto none = Trainctl({"submit", spec}, s.path(""), std::chrono::seconds(60),
                       {{"KUBECONFIG", s.path("no-such-kubeconfig")}, {"HOME", s.path("")}});
  EXPECT_EQ(none.exit.code, 1) << none.output;
  EXPECT_NE(none.output.find("kubectl has no current context in KUBECONFIG=" + s.path("no-such-kubeconfig") +
                             ": set KUBECONFIG to your cluster's kubeconfig"),
            std::string::npos)
      << none.output;
  auto r = Trainctl({"status", spec}, s.path(""), std::chrono::seconds(60), {{"PATH", s.path("")}});
  EXPECT_EQ(r.exit.code, 2) << r.output;
  EXPECT_NE(r.output.find("trainctl status: kubectl is not on the PATH"), std::string::npos) << r.output;
}

// What a pod of a rendered Indexed Job runs, with the values Kubernetes would substitute.
struct PodCommand {
  std::string job;  // the Indexed Job's name
  int completions = 0;
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> env;
  std::string spec_json;
};

// Every Indexed Job's pod command (one for a job without roles, one per role otherwise).
std::vector<PodCommand> PodsFromManifests(const std::string& yaml) {
  std::vector<PodCommand> pods;
  std::string spec_json;
  for (const auto& doc : YAML::LoadAll(yaml)) {
    const std::string kind = doc["kind"].as<std::string>();
    if (kind == "ConfigMap") spec_json = doc["data"]["job.json"].as<std::string>();
    if (kind != "Job" || !doc["spec"]["completionMode"]) continue;  // the workers' Indexed Jobs
    PodCommand pc;
    pc.job = doc["metadata"]["name"].as<std::string>();
    pc.completions = doc["spec"]["completions"].as<int>();
    const YAML::Node c = doc["spec"]["template"]["spec"]["containers"][0];
    for (const auto& a : c["command"]) pc.argv.push_back(a.as<std::string>());
    for (const auto& e : c["env"]) {
      if (e["value"]) pc.env.emplace_back(e["name"].as<std::string>(), e["value"].as<std::string>());
    }
    pods.push_back(pc);
  }
  for (auto& p : pods) p.spec_json = spec_json;
  return pods;
}

PodCommand FromManifests(const std::string& yaml) {
  auto pods = PodsFromManifests(yaml);
  return pods.empty() ? PodCommand{} : pods[0];
}

// The pods of `pods` (pod i of each: completion index i) as processes here, the last Job's
// first: the first pod serves the store (at `node0`, a regex of its in-cluster address), the
// others wait for it. The shared volume is the directory `volume`; each agent's metrics port is
// a free one of this machine, in `metrics_ports` by start order.
struct Pods {
  std::vector<std::unique_ptr<Background>> agents;
  std::vector<int> metrics_ports;
  std::string run_id;
};
Pods StartPods(const Scratch& s, const std::vector<PodCommand>& pods, const std::string& node0,
               const std::string& volume) {
  Pods out;
  fs::create_directories(volume);
  const std::string spec_file = s.Write("job.json", pods.at(0).spec_json);
  const std::string port = std::to_string(FreePort());
  for (int p = static_cast<int>(pods.size()) - 1; p >= 0; --p) {
    for (int index = pods[p].completions - 1; index >= 0; --index) {
      auto substitute = [&](std::string v) {
        v = std::regex_replace(v, std::regex(node0 + ":29400"), "127.0.0.1:" + port);
        v = std::regex_replace(v, std::regex("\\$\\(JOB_COMPLETION_INDEX\\)"), std::to_string(index));
        v = std::regex_replace(v, std::regex("\\$\\(POD_IP\\)"), "127.0.0.1");
        v = std::regex_replace(v, std::regex("\\$\\(JOB_UID\\)"), "0f0e");
        return std::regex_replace(v, std::regex("/etc/trainctl/job.json"), spec_file);
      };
      std::vector<std::pair<std::string, std::string>> env = {{"TRAINCTL_AGENT_TOKEN", "t0ken-of-the-job"}};
      for (const auto& [k, v] : pods[p].env) {
        if (k != "TRAINCTL_RUN_ID")
          env.emplace_back(k, substitute(v));
        else
          out.run_id = substitute(v);
      }
      std::vector<std::string> args;
      EXPECT_EQ(pods[p].argv.at(0), "trainctl");
      for (size_t i = 1; i < pods[p].argv.size(); ++i) {
        if (pods[p].argv[i - 1] == "--metrics-port") {  // every pod has its own IP; here they share one
          out.metrics_ports.push_back(FreePort());
          args.push_back(std::to_string(out.metrics_ports.back()));
        } else {
          args.push_back(pods[p].argv[i] == "$(TRAINCTL_RUN_ID)" ? out.run_id : substitute(pods[p].argv[i]));
        }
      }
      out.agents.push_back(
          std::make_unique<Background>(args, volume, s.path(pods[p].job + std::to_string(index) + ".log"), env));
    }
  }
  return out;
}

TEST(K8s, TheRenderedPodCommandRunsTheJobWithNodeZeroServingTheStore) {
  Scratch s;
  // The shared volume is a directory here; pods would mount the claim at the same path.
  std::string spec = s.Write("job.yaml",
                             "name: podjob\nnodes: 2\nprocs_per_node: 1\n"
                             "trainer:\n  model: cnn\n  data: {limit: 256, test_limit: 64}\n"
                             "  batch_size: 16\n  max_steps: 4\n  threads: 1\n"
                             "cluster:\n  storage: {mount: " +
                                 s.path("volume") + "}\n");
  auto r = Trainctl({"render", spec}, s.path(""));
  ASSERT_EQ(r.exit.code, 0) << r.output;
  PodCommand pod = FromManifests(r.output);
  ASSERT_FALSE(pod.argv.empty()) << r.output;
  ASSERT_FALSE(pod.spec_json.empty());
  Pods pods = StartPods(s, {pod}, "podjob-0\\.podjob", s.path("volume"));
  EXPECT_EQ(pods.run_id, "podjob-0f0e");
  for (auto& n : pods.agents) {
    ExitInfo exit = n->Wait(std::chrono::seconds(120));
    EXPECT_EQ(exit.code, 0) << n->Output();
  }
  EXPECT_TRUE(fs::exists(s.path("volume/runs/podjob/model.safetensors")));
  EXPECT_NE(s.Read("podjob0.log").find("2 workers x batch 16"), std::string::npos) << s.Read("podjob0.log");
}

// The stage Job as a pod runs it: its rendered script, under the image's sh (dash), with the
// environment its manifest gives (the Secret's keys as the kubelet would inject them), against a
// real S3 server that checks signatures. The archive is fetched, checked, unpacked and marked; a
// wrong secret, a missing key or bucket and a checksum mismatch each fail it with exit 2 (which
// the Job's podFailurePolicy makes final) and one line that says which; no secret is rendered.
TEST(K8s, TheStageJobFetchesTheDatasetFromS3WithTheSecretsCredentials) {
  Scratch s;
  S3Server server(s.path("s3"));
  ASSERT_TRUE(server.ok()) << server.Log();
  s.Write("data/train/a.txt", "first\n");
  s.Write("data/train/b.txt", "second\n");
  ASSERT_EQ(Exec({"tar", "-czf", s.path("set.tar.gz"), "-C", s.path("data"), "train"}).exit.code, 0);
  ASSERT_EQ(server.Request("trainctl/datasets/set.tar.gz", s.path("set.tar.gz")).code, 200);
  const std::string sha = Exec({"sh", "-c", "sha256sum set.tar.gz | cut -c1-64"}, s.path("")).output.substr(0, 64);

  auto render = [&](const std::string& url, const std::string& sum) {
    const std::string spec = s.Write("job.yaml",
                                     "name: staged\nnodes: 1\ntrainer: {model: cnn}\ncluster:\n"
                                     "  stage: {url: '" +
                                         url + "', sha256: '" + sum + "', credentials: s3-readers}\n");
    auto r = Trainctl({"render", spec}, s.path(""));
    EXPECT_EQ(r.exit.code, 0) << r.output;
    return r.output;
  };
  // Runs the stage container's command with the environment its manifest names.
  auto stage = [&](const std::string& manifests, const std::string& secret, const std::string& dest) {
    YAML::Node job;
    for (const auto& doc : YAML::LoadAll(manifests)) {
      if (doc["kind"].as<std::string>() == "Job" && doc["metadata"]["name"].as<std::string>() == "staged-stage")
        job = doc;
    }
    EXPECT_TRUE(job) << manifests;
    if (!job) return CommandResult{};
    const YAML::Node rule = job["spec"]["podFailurePolicy"]["rules"][0];
    EXPECT_EQ(rule["action"].as<std::string>(), "FailJob");
    EXPECT_EQ(rule["onExitCodes"]["values"][0].as<int>(), 2);
    const YAML::Node c = job["spec"]["template"]["spec"]["containers"][0];
    SpawnOptions o;
    for (const auto& a : c["command"]) o.argv.push_back(a.as<std::string>());
    o.env = {"PATH=/usr/bin:/bin"};
    for (const auto& e : c["env"]) {
      const std::string name = e["name"].as<std::string>();
      if (e["value"]) {
        o.env.push_back(name + "=" + (name == "DEST" ? dest : e["value"].as<std::string>()));
        continue;
      }
      const YAML::Node ref = e["valueFrom"]["secretKeyRef"];
      EXPECT_EQ(ref["name"].as<std::string>(), "s3-readers") << name;
      EXPECT_EQ(ref["key"].as<std::string>(), name);
      std::string v = name == "AWS_SECRET_ACCESS_KEY" && !secret.empty() ? secret : server.Var(name);
      if (!v.empty())
        o.env.push_back(name + "=" + v);
      else
        EXPECT_TRUE(ref["optional"] && ref["optional"].as<bool>()) << name << " is required but the Secret has none";
    }
    o.cwd = s.path("");
    auto r = RunCommand(o, std::chrono::seconds(120));
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : CommandResult{};
  };

  const std::string good = render("s3://trainctl/datasets/set.tar.gz", sha);
  EXPECT_EQ(good.find(server.Var("AWS_SECRET_ACCESS_KEY")), std::string::npos);
  EXPECT_EQ(good.find(server.Var("AWS_ACCESS_KEY_ID")), std::string::npos);
  auto ok = stage(good, "", s.path("volume/ok"));
  EXPECT_EQ(ok.exit.code, 0) << ok.output;
  EXPECT_EQ(s.Read("volume/ok/train/b.txt"), "second\n");
  EXPECT_TRUE(fs::exists(s.path("volume/ok/.trainctl-staged")));
  EXPECT_FALSE(fs::exists(s.path("volume/ok/.download")));
  EXPECT_EQ(ok.output.find(server.Var("AWS_SECRET_ACCESS_KEY")), std::string::npos) << ok.output;
  auto again = stage(good, "", s.path("volume/ok"));
  EXPECT_NE(again.output.find("already staged in"), std::string::npos) << again.output;

  struct Refusal {
    std::string url, sum, secret, says;
  };
  const std::vector<Refusal> refusals = {
      {"s3://trainctl/datasets/set.tar.gz", sha, "not-the-secret",
       "GET s3://trainctl/datasets/set.tar.gz failed: HTTP 403 SignatureDoesNotMatch: the secret key is not the access "
       "key's"},
      {"s3://trainctl/datasets/none.tar.gz", sha, "", "failed: HTTP 404 NoSuchKey: no such key in the bucket"},
      {"s3://no-such-bucket/set.tar.gz", sha, "", "failed: HTTP 404 NoSuchBucket: no such bucket"},
      {"s3://trainctl/datasets/set.tar.gz", std::string(64, '0'), "",
       "stage: s3://trainctl/datasets/set.tar.gz has sha256 " + sha + ", not cluster.stage.sha256 " +
           std::string(64, '0')}};
  int i = 0;
  for (const auto& f : refusals) {
    const std::string dest = s.path("volume/refused" + std::to_string(i++));
    auto r = stage(render(f.url, f.sum), f.secret, dest);
    EXPECT_EQ(r.exit.code, 2) << f.url << "\n" << r.output;
    EXPECT_NE(r.output.find(f.says), std::string::npos) << r.output;
    EXPECT_EQ(CountLines(r.output, "stage: "), 1) << "one line says why\n" << r.output;
    EXPECT_FALSE(fs::exists(dest + "/.trainctl-staged"));
    EXPECT_FALSE(fs::exists(dest + "/.download"));
  }
}

// A stage URL the stage Job could not fetch as written is refused by validate, naming the field.
TEST(K8s, AStageUrlItCannotFetchIsRefusedNamingTheField) {
  Scratch s;
  struct Case {
    std::string stage, says;
  };
  const std::vector<Case> cases = {
      {"{url: 's3://bucket/my key.tar'}", "cluster.stage.url: expected s3://BUCKET/KEY"},
      {"{url: 's3://bucket'}", "cluster.stage.url: expected s3://BUCKET/KEY"},
      {"{url: 's3://bucket/k.tar'}", "cluster.stage.credentials: an s3:// URL needs the name of a Secret"},
      {"{url: 'https://example.com/k.tar', credentials: s3}",
       "cluster.stage.credentials: credentials are for an s3:// URL"},
      {"{url: 'ftp://example.com/k.tar'}", "expected an s3://, http:// or https:// URL"},
      {"{url: 's3://b/k.tar', credentials: Not_A_Name}",
       "cluster.stage.credentials: expected a Kubernetes object name"}};
  for (const auto& c : cases) {
    const std::string spec =
        s.Write("job.yaml", "name: staged\nnodes: 1\ntrainer: {model: cnn}\ncluster:\n  stage: " + c.stage + "\n");
    auto r = Trainctl({"validate", spec}, s.path(""));
    EXPECT_EQ(r.exit.code, 2) << c.stage << "\n" << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << c.stage << "\n" << r.output;
  }
}

// The pods' agents serve /metrics with the job's token: a real Prometheus, configured as the
// rendered PodMonitor says (bearer token from the job's Secret), scrapes both pods; the pod of
// group rank 0 speaks for the run, the other has no series; a request without the token is refused.
TEST(K8s, ThePodsServeMetricsThatARealPrometheusScrapesWithTheJobsToken) {
  Scratch s;
  std::string spec = s.Write("job.yaml",
                             "name: watched\nnodes: 2\nprocs_per_node: 1\n"
                             "trainer:\n  model: cnn\n  data: {limit: 512, test_limit: 64}\n"
                             "  batch_size: 8\n  epochs: 1000\n  threads: 1\n  eval: false\n"
                             "cluster:\n  storage: {mount: " +
                                 s.path("volume") +
                                 "}\n"
                                 "  pod_monitor: true\n");
  auto r = Trainctl({"render", spec}, s.path(""));
  ASSERT_EQ(r.exit.code, 0) << r.output;
  auto monitor = YAML::Load("{}");
  for (const auto& doc : YAML::LoadAll(r.output)) {
    if (doc["kind"].as<std::string>() == "PodMonitor") monitor = doc;
  }
  ASSERT_TRUE(monitor["spec"]) << r.output;
  const YAML::Node ep = monitor["spec"]["podMetricsEndpoints"][0];
  EXPECT_EQ(ep["authorization"]["credentials"]["name"].as<std::string>(), "watched-token");
  Pods pods = StartPods(s, {FromManifests(r.output)}, "watched-0\\.watched", s.path("volume"));
  ASSERT_EQ(pods.metrics_ports.size(), 2u);

  const int port = FreePort();
  std::string targets;
  for (int p : pods.metrics_ports)
    targets += (targets.empty() ? "'127.0.0.1:" : ", '127.0.0.1:") + std::to_string(p) + "'";
  s.Write("prometheus.yml",
          "global: {scrape_interval: 1s}\nscrape_configs:\n  - job_name: pods\n"
          "    metrics_path: " +
              ep["path"].as<std::string>() +
              "\n"
              "    honor_labels: " +
              ep["honorLabels"].as<std::string>() +
              "\n"
              "    authorization: {type: " +
              ep["authorization"]["type"].as<std::string>() +
              ", credentials: t0ken-of-the-job}\n"
              "    static_configs: [{targets: [" +
              targets + "]}]\n");
  SpawnOptions po;
  po.argv = {"prometheus", "--config.file=" + s.path("prometheus.yml"), "--storage.tsdb.path=" + s.path("tsdb"),
             "--web.listen-address=127.0.0.1:" + std::to_string(port)};
  po.env = CurrentEnvironment();
  po.output_fd = ::open(s.path("prometheus.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  auto prometheus = Spawn(po);
  ::close(po.output_fd);
  ASSERT_TRUE(prometheus.ok()) << prometheus.status().ToString();
  auto query = [&](const std::string& q) {
    auto got = RunProgram(
        {"python3", "-c",
         "import sys,urllib.request,urllib.parse;print(urllib.request.urlopen("
         "'http://127.0.0.1:" +
             std::to_string(port) + "/api/v1/query?query='+urllib.parse.quote(sys.argv[1])).read().decode())",
         q},
        s.path(""));
    return nlohmann::json::parse(got.output, nullptr, false);
  };
  nlohmann::json steps, up;
  const bool scraped = Eventually(
      [&] {
        steps = query("trainctl_train_steps_total{job=\"watched\"}");
        up = query("up");
        return steps.is_object() && steps["data"]["result"].size() == 1 &&
               std::stod(steps["data"]["result"][0]["value"][1].get<std::string>()) > 0 && up.is_object() &&
               up["data"]["result"].size() == 2 && up["data"]["result"][0]["value"][1] == "1" &&
               up["data"]["result"][1]["value"][1] == "1";
      },
      std::chrono::seconds(90));
  EXPECT_TRUE(scraped) << steps << "\n" << up << "\n" << s.Read("prometheus.log") << s.Read("watched0.log");
  // Without the token: 401.
  auto plain = RunProgram({"python3", "-c",
                           "import urllib.request,urllib.error\ntry:\n urllib.request.urlopen("
                           "'http://127.0.0.1:" +
                               std::to_string(pods.metrics_ports[1]) +
                               "/metrics')\n"
                               "except urllib.error.HTTPError as e:\n print(e.code)"},
                          s.path(""));
  EXPECT_EQ(plain.output, "401\n");
  for (auto& a : pods.agents) ::kill(a->pid(), SIGTERM);
  for (auto& a : pods.agents) a->Wait(std::chrono::seconds(60));
  ::kill(*prometheus, SIGTERM);
  ::waitpid(*prometheus, nullptr, 0);
}

// A job with roles rendered as one Indexed Job per role: every pod's agent runs its one task
// (--task ROLE:$(JOB_COMPLETION_INDEX)), the first task's pod serves the store, and the tasks
// get their roles, indexes and TF_CONFIG.
TEST(K8s, ThePodPerTaskCommandsOfAJobWithRolesRunIt) {
  Scratch s;
  std::string spec = s.Write("job.yaml",
                             "name: roles\n"
                             "command: [sh, -c, 'echo \"$ROLE_NAME $ROLE_RANK $WORLD_SIZE\" > " +
                                 s.path("volume") + "/task-$RANK; echo \"$TF_CONFIG\" > " + s.path("volume") +
                                 "/tf-$RANK']\n"
                                 "roles: [{name: ps, success: true}, {name: worker, replicas: 2}]\n"
                                 "cluster:\n  storage: {mount: " +
                                 s.path("volume") + "}\n");
  auto r = Trainctl({"render", spec}, s.path(""));
  ASSERT_EQ(r.exit.code, 0) << r.output;
  auto pods = PodsFromManifests(r.output);
  ASSERT_EQ(pods.size(), 2u) << r.output;
  EXPECT_EQ(pods[0].job, "roles-ps");
  EXPECT_EQ(pods[1].job, "roles-worker");
  EXPECT_EQ(pods[1].completions, 2);
  for (const auto& p : pods) EXPECT_NE(std::find(p.argv.begin(), p.argv.end(), "--task"), p.argv.end());
  Pods started = StartPods(s, pods, "roles-ps-0\\.roles", s.path("volume"));
  for (auto& a : started.agents) {
    ExitInfo exit = a->Wait(std::chrono::seconds(60));
    EXPECT_EQ(exit.code, 0) << a->Output();
  }
  EXPECT_EQ(s.Read("volume/task-0"), "ps 0 3\n");
  EXPECT_EQ(s.Read("volume/task-1"), "worker 0 3\n");
  EXPECT_EQ(s.Read("volume/task-2"), "worker 1 3\n");
  EXPECT_NE(s.Read("volume/tf-2").find("\"task\":{\"index\":1,\"type\":\"worker\"}"), std::string::npos)
      << s.Read("volume/tf-2");
}

}  // namespace
}  // namespace trainctl::testing
