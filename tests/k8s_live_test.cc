// trainctl against a live Kubernetes (scripts/cluster/cluster, started by the Live.ClusterUp
// fixture and stopped by Live.ClusterDown): what the API server enforces (Pod Security admission,
// RBAC, the upstream CRDs' schemas) and what the cluster does with the jobs (real pods training,
// the Job's replacement of a deleted pod, podFailurePolicy), through trainctl's own verbs.
// Each test works in a namespace of its own labelled to enforce the "restricted" profile.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "tests/s3_server.h"
#include "tests/test_util.h"

namespace trainctl::testing {
namespace {

using json = nlohmann::json;
const std::string kSrc = TRAINCTL_SOURCE_DIR;
const std::string kCluster = kSrc + "/scripts/cluster/cluster";

using Env = std::vector<std::pair<std::string, std::string>>;

std::vector<std::string> Verb(const std::string& verb, std::vector<std::string> spec,
                              std::vector<std::string> more = {}) {
  spec.insert(spec.begin(), verb);
  spec.insert(spec.end(), more.begin(), more.end());
  return spec;
}

// Waits for `trainctl status` of `spec` (as `env` says: KUBECONFIG) to leave "running"; returns its
// JSON, and its last output in `last`.
json WaitForEnd(const std::vector<std::string>& spec, Duration timeout, std::string* last, const Env& env = {}) {
  json status = json::object();
  Eventually(
      [&] {
        auto r = Trainctl(Verb("status", spec, {"--json"}), kSrc, std::chrono::seconds(60), env);
        *last = r.output;
        try {
          status = json::parse(r.output);
        } catch (const json::exception&) {
          return false;
        }
        return status.value("state", "") != "running";
      },
      timeout);
  return status;
}

// The cluster's KUBECONFIG and kubectl, from `cluster env`, for this process and every child.
class Live : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto r = RunProgram({kCluster, "env"}, kSrc);
    std::istringstream lines(r.output);
    for (std::string line; std::getline(lines, line);) {
      std::smatch m;
      if (!std::regex_match(line, m, std::regex("export ([A-Z]+)=(.*)"))) continue;
      std::string value = m[2];
      if (auto pos = value.find("$PATH"); pos != std::string::npos) value.replace(pos, 5, ::getenv("PATH"));
      ::setenv(m[1].str().c_str(), value.c_str(), 1);
    }
  }

  void SetUp() override {
    ns_ = "live-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++);
    ASSERT_EQ(Kubectl({"create", "namespace", ns_}).exit.code, 0);
    auto label = Kubectl({"label", "namespace", ns_, "pod-security.kubernetes.io/enforce=restricted",
                          "pod-security.kubernetes.io/warn=restricted"});
    ASSERT_EQ(label.exit.code, 0) << label.output;
  }
  void TearDown() override { Kubectl({"delete", "namespace", ns_, "--wait=false"}); }

  static CommandResult Kubectl(std::vector<std::string> args, const std::string& input_file = "",
                               Duration timeout = std::chrono::seconds(60)) {
    args.insert(args.begin(), "kubectl");
    args.insert(args.begin() + 1, "--request-timeout=30s");
    if (!input_file.empty()) args.insert(args.end(), {"-f", input_file});
    return RunProgram(args, kSrc, timeout);
  }
  static json KubectlJson(std::vector<std::string> args) {
    args.insert(args.end(), {"-o", "json"});
    auto r = Kubectl(args);
    EXPECT_EQ(r.exit.code, 0) << r.output;
    try {
      return json::parse(r.output);
    } catch (const json::exception&) {
      ADD_FAILURE() << r.output;
      return json::object();
    }
  }
  // The namespace's pods that `selector` selects.
  json Pods(const std::string& selector) {
    return KubectlJson({"get", "pods", "-n", ns_, "-l", selector}).value("items", json::array());
  }
  // What `kubectl get KINDS -o name` lists in the namespace (of what `selector` selects) once it
  // lists `left` objects or fewer, or after `timeout`: the controllers delete what a job owns.
  std::string Left(const std::string& kinds, const std::string& selector = "", size_t left = 0,
                   Duration timeout = std::chrono::seconds(90)) {
    std::vector<std::string> args = {"get", kinds, "-n", ns_, "-o", "name"};
    if (!selector.empty()) args.insert(args.end(), {"-l", selector});
    std::string out;
    Eventually(
        [&] {
          auto r = Kubectl(args);
          out = r.exit.code == 0 ? r.output : "kubectl failed: " + r.output;
          return r.exit.code == 0 && size_t(CountLines(r.output, "/")) <= left;
        },
        timeout);
    return out;
  }
  // `trainctl submit SPEC` (with `env`: its KUBECONFIG), its time noted for Finish.
  CommandResult Submit(const std::vector<std::string>& spec, const Env& env = {}) {
    submitted_ = Clock::now();
    return Trainctl(Verb("submit", spec), kSrc, std::chrono::seconds(120), env);
  }
  // `trainctl status` followed to the job's end, which must be success (else the failure shows
  // `kinds` of the namespace); prints the seconds from Submit to the end. The final status, and
  // status's last output in `last`.
  json Finish(const std::vector<std::string>& spec, Duration timeout, const std::string& kinds, std::string* last,
              const Env& env = {}) {
    json status = WaitForEnd(spec, timeout, last, env);
    EXPECT_EQ(status.value("state", ""), "succeeded")
        << *last << Kubectl({"get", kinds, "-n", ns_, "-o", "wide"}).output;
    std::printf("%s: %s %.0f s after submit\n", ::testing::UnitTest::GetInstance()->current_test_info()->name(),
                status.value("state", "?").c_str(), std::chrono::duration<double>(Clock::now() - submitted_).count());
    return status;
  }

  // The rendered objects, as the API's JSON (kubectl's client-side reading of the YAML: one JSON
  // document per object).
  static json Objects(const std::string& manifests) {
    auto r = Kubectl({"create", "--dry-run=client", "-o", "json", "-f", manifests});
    EXPECT_EQ(r.exit.code, 0) << r.output;
    json all = json::array();
    std::istringstream in(r.output);
    try {
      while (in >> std::ws && in.peek() != EOF) {
        json o;
        in >> o;
        all.push_back(o);
      }
    } catch (const json::exception& e) {
      ADD_FAILURE() << e.what() << "\n" << r.output;
    }
    return all;
  }

  Scratch s_;
  std::string ns_;
  Clock::time_point submitted_ = Clock::now();
  static inline int counter_ = 0;
};

// The pod a TrainJob's node gets: the torch-distributed runtime's (a container "node" and an
// image, v2.3.0's manifests/base/runtimes/torch_distributed.yaml) with the trainer's image,
// command, env and resources on that container, then trainctl's runtime patch over it: the
// pod-level fields set, the container's fields set by name.
json TrainJobPod(const json& spec) {
  const json& trainer = spec["trainer"];
  json node = {{"name", "node"},
               {"image", trainer["image"]},
               {"command", trainer["command"]},
               {"env", trainer.value("env", json::array())}};
  if (trainer.contains("resourcesPerNode")) node["resources"] = trainer["resourcesPerNode"];
  json pod = {{"containers", {node}}};
  const json& patch = spec["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
                          ["template"]["spec"]["template"];
  for (const auto& [k, v] : patch["spec"].items()) {
    if (k != "containers") pod[k] = v;
  }
  for (const auto& c : patch["spec"].value("containers", json::array())) {
    for (auto& mine : pod["containers"]) {
      if (mine["name"] == c["name"]) mine.update(c);
    }
  }
  return {{"metadata", patch.value("metadata", json::object())}, {"spec", pod}};
}

// Every pod template inside `o` (a Job's, a Deployment's, each replica spec's of an operator's
// kind), as found by shape: an object whose spec has containers; a TrainJob's runtime patch is a
// patch, not a pod (TrainJobPod).
void PodTemplates(const json& o, const std::string& where, std::vector<std::pair<std::string, json>>* out) {
  if (o.is_object()) {
    if (o.contains("runtimePatches")) {
      out->push_back({where + " (the runtime's node pod, trainctl's patch applied)", TrainJobPod(o)});
      return;
    }
    if (o.contains("spec") && o["spec"].is_object() && o["spec"].contains("containers")) {
      out->push_back({where, o});
      return;
    }
    for (const auto& [k, v] : o.items()) PodTemplates(v, where + "." + k, out);
  } else if (o.is_array()) {
    for (size_t i = 0; i < o.size(); ++i) PodTemplates(o[i], where + "[" + std::to_string(i) + "]", out);
  }
}

// Every pod of every format trainctl renders is admitted under "restricted": each pod template
// is created as a Pod, server-side and dry-run, in the restricted namespace (its ServiceAccounts
// applied first, for the ServiceAccount admission). The operators' kinds themselves pass the
// upstream CRDs' schemas on the server: those of the operators the cluster runs, as they installed
// them, and Trainer v2.3's TrainJob CRD (tests/k8s/crds/fetched, from its Go module). The PyTorchJob and TFJob also
// pass the Training Operator's validating webhook.
TEST_F(Live, EveryPodOfEveryFormatIsAdmittedUnderRestricted) {
  auto crds =
      Kubectl({"apply", "--server-side", "-f", kSrc + "/tests/k8s/crds/fetched/trainer.kubeflow.org_trainjobs.yaml"});
  ASSERT_EQ(crds.exit.code, 0) << crds.output;
  for (const std::string crd :
       {"pytorchjobs.kubeflow.org", "tfjobs.kubeflow.org", "mpijobs.kubeflow.org", "trainjobs.trainer.kubeflow.org"}) {
    ASSERT_EQ(Kubectl({"wait", "--for=condition=Established", "crd/" + crd, "--timeout=60s"}).exit.code, 0) << crd;
  }
  const std::string base = kSrc + "/examples/k8s/base.yaml";
  const std::string ns = "cluster.namespace=" + ns_;
  struct Case {
    std::string name;
    std::vector<std::string> args;
  };
  std::vector<Case> cases = {
      {"job", {base, "--set", ns}},
      {"job-prod", {base, "-f", kSrc + "/examples/k8s/prod.yaml", "--set", ns}},  // elastic, etcd, staging
      {"job-roles", {kSrc + "/examples/parameter-server.yaml", "--set", ns}},
      {"pytorchjob", {base, "--format", "pytorchjob", "--set", ns}},
      {"tfjob", {kSrc + "/examples/parameter-server.yaml", "--format", "tfjob", "--set", ns}},
      {"mpijob", {base, "--format", "mpijob", "--set", ns, "--set", "cluster.image=trainctl:mpi"}},
      {"trainjob", {base, "--format", "trainjob", "--set", ns}},
      {"ddp", {kSrc + "/examples/ddp.yaml", "--set", ns}},  // a user program, no trainer
  };
  int pods = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string manifests = RenderManifests(s_, c.name + ".yaml", c.args, kSrc);
    json objects = Objects(manifests);
    ASSERT_FALSE(objects.empty());
    // The whole set against the server's own validation (schemas, CRDs, immutable defaults).
    auto dry = Kubectl({"apply", "--server-side", "--dry-run=server", "-n", ns_}, manifests);
    EXPECT_EQ(dry.exit.code, 0) << dry.output;
    EXPECT_EQ(dry.output.find("would violate PodSecurity"), std::string::npos) << dry.output;
    // And against the server's OpenAPI schema, field by field, as kubectl checks a List of them
    // (a List is what GitOps tools and `kubectl get -o json` hand on).
    s_.Write("list.json", json({{"apiVersion", "v1"}, {"kind", "List"}, {"items", objects}}).dump());
    auto schema =
        Kubectl({"create", "--dry-run=client", "--validate=true", "-o", "name", "-n", ns_}, s_.path("list.json"));
    EXPECT_EQ(schema.exit.code, 0) << schema.output;
    for (const auto& o : objects) {
      if (o.value("kind", "") != "ServiceAccount") continue;
      s_.Write("sa.json", o.dump());
      EXPECT_EQ(Kubectl({"apply", "--server-side", "-n", ns_}, s_.path("sa.json")).exit.code, 0);
    }
    for (const auto& o : objects) {
      std::vector<std::pair<std::string, json>> templates;
      PodTemplates(o.value("spec", json::object()),
                   o.value("kind", "") + "/" + o["metadata"].value("name", "") + ".spec", &templates);
      for (const auto& [where, t] : templates) {
        json pod = {{"apiVersion", "v1"},
                    {"kind", "Pod"},
                    {"metadata", {{"name", "admission-" + std::to_string(pods++)}, {"namespace", ns_}}},
                    {"spec", t["spec"]}};
        s_.Write("pod.json", pod.dump());
        auto r = Kubectl({"create", "--dry-run=server", "-n", ns_}, s_.path("pod.json"));
        EXPECT_EQ(r.exit.code, 0) << where << ": " << r.output;
      }
    }
  }
  EXPECT_GE(pods, 20);  // every format's workers, launchers, stores, eval, TensorBoard, staging
  std::printf("%d pod templates admitted under restricted\n", pods);

  // The namespace does enforce it: the first worker's pod, allowed to escalate, is refused.
  json objects = Objects(s_.path("job.yaml"));
  std::vector<std::pair<std::string, json>> templates;
  for (const auto& o : objects) PodTemplates(o.value("spec", json::object()), "", &templates);
  ASSERT_FALSE(templates.empty());
  json spec = templates[0].second["spec"];
  spec["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = true;
  s_.Write("bad-pod.json", json({{"apiVersion", "v1"},
                                 {"kind", "Pod"},
                                 {"metadata", {{"name", "escalating"}, {"namespace", ns_}}},
                                 {"spec", spec}})
                               .dump());
  auto refused = Kubectl({"create", "--dry-run=server", "-n", ns_}, s_.path("bad-pod.json"));
  EXPECT_NE(refused.exit.code, 0) << refused.output;
  EXPECT_NE(refused.output.find("violates PodSecurity \"restricted:latest\": allowPrivilegeEscalation != false"),
            std::string::npos)
      << refused.output;
}

// The example job as docs/cluster.md submits it, cut only to what two cores hold.
std::vector<std::string> BaseExample(const std::string& ns) {
  return {kSrc + "/examples/k8s/base.yaml",
          "--set",
          "cluster.namespace=" + ns,
          "--set",
          "resources.cpus=0.45",  // 2 pods of 2 workers: 1.8 cores
          "--set",
          "cluster.eval_resources.cpus=0.2",
          "--set",
          "cluster.eval_resources.memory=1Gi",
          "--set",
          "cluster.tensorboard=false"};  // its image cannot be pulled here
}

// A restricted pod that tries to open a TCP connection to `address` (once, for 5 s) and prints
// "open" or "closed"; `labels` make it one of the job's pods or not.
std::string Probe(const std::string& ns, const std::string& name, const json& labels, const std::string& address) {
  json pod = {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata", {{"name", name}, {"namespace", ns}, {"labels", labels}}},
      {"spec",
       {{"restartPolicy", "Never"},
        {"securityContext",
         {{"runAsNonRoot", true}, {"runAsUser", 1000}, {"seccompProfile", {{"type", "RuntimeDefault"}}}}},
        {"containers",
         {{{"name", "probe"},
           {"image", "trainctl:latest"},
           {"imagePullPolicy", "IfNotPresent"},
           {"command",
            {"bash", "-c", "timeout 5 bash -c '</dev/tcp/" + address + "' 2>/dev/null && echo open || echo closed"}},
           {"securityContext", {{"allowPrivilegeEscalation", false}, {"capabilities", {{"drop", {"ALL"}}}}}}}}}}}};
  return pod.dump();
}

// The eval Job's report (`trainctl eval -o json`: accuracy, per class) from its pod's log.
json EvalReport(const std::string& ns, std::string* last) {
  json report = json::object();
  Eventually(
      [&] {
        auto r = RunProgram({"kubectl", "--request-timeout=30s", "logs", "-n", ns, "job/fashion-mnist-eval"}, kSrc);
        *last = r.output;
        auto brace = r.output.find('{');
        if (r.exit.code != 0 || brace == std::string::npos) return false;
        try {
          report = json::parse(r.output.substr(brace));
          return true;
        } catch (const json::exception&) {
          return false;
        }
      },
      std::chrono::minutes(5));
  return report;
}

// Fashion-MNIST in real pods (Indexed Jobs, the store's headless Service, the claim the default
// class binds), followed through trainctl's verbs from submit to delete.
TEST_F(Live, TheExampleTrainsInPodsAndTheVerbsFollowIt) {
  const auto spec = BaseExample(ns_);
  auto submit = Submit(spec);
  ASSERT_EQ(submit.exit.code, 0) << submit.output;
  EXPECT_NE(submit.output.find("submitted fashion-mnist to namespace " + ns_), std::string::npos) << submit.output;

  // The job's NetworkPolicy, enforced (kube-network-policies): the store on node 0's pod answers
  // a pod of the job, and not a pod outside it.
  std::string store;
  ASSERT_TRUE(Eventually(
      [&] {
        for (const auto& p : Pods("trainctl.dev/job=fashion-mnist,app.kubernetes.io/component=worker,"
                                  "batch.kubernetes.io/job-completion-index=0")) {
          if (p["status"].value("phase", "") == "Running" && !p["status"].value("podIP", "").empty()) {
            store = p["status"].value("podIP", "") + "/29400";
          }
        }
        return !store.empty();
      },
      std::chrono::minutes(3)))
      << Kubectl({"get", "pods", "-n", ns_, "-o", "wide"}).output;
  auto probe = [&](const std::string& name, const json& labels) {
    s_.Write(name + ".json", Probe(ns_, name, labels, store));
    EXPECT_EQ(Kubectl({"apply", "-n", ns_}, s_.path(name + ".json")).exit.code, 0);
    std::string out;
    Eventually(
        [&] {
          auto phase = Kubectl({"get", "pod", name, "-n", ns_, "-o", "jsonpath={.status.phase}"});
          if (phase.output != "Succeeded" && phase.output != "Failed") return false;
          out = Kubectl({"logs", name, "-n", ns_}).output;
          return true;
        },
        std::chrono::seconds(90));
    Kubectl({"delete", "pod", name, "-n", ns_, "--wait=false"});
    return out;
  };
  std::string inside;
  for (int i = 0; i < 20 && inside.find("open") == std::string::npos; ++i) {  // until the agent listens
    inside = probe("inside-" + std::to_string(i), {{"trainctl.dev/job", "fashion-mnist"}});
  }
  EXPECT_EQ(inside, "open\n");
  EXPECT_EQ(probe("outside", json::object()), "closed\n");

  std::string last;
  json status = Finish(spec, std::chrono::minutes(12), "pods", &last);
  std::set<std::string> components;
  for (const auto& pod : status["pods"]) components.insert(pod.value("component", ""));
  EXPECT_TRUE(components.count("worker")) << last;
  EXPECT_GE(status["pods"].size(), 2u) << last;

  // Every worker pod's lines, each prefixed with its pod.
  auto logs = Trainctl(Verb("logs", spec), kSrc);
  EXPECT_EQ(logs.exit.code, 0) << logs.output;
  for (const std::string pod : {"fashion-mnist-0-", "fashion-mnist-1-"}) {
    EXPECT_TRUE(std::regex_search(logs.output, std::regex("(^|\n)\\[pod/" + pod))) << pod << "\n" << logs.output;
  }
  // The eval Job: the trained model's test accuracy, per class, as the example reaches locally.
  json report = EvalReport(ns_, &last);
  EXPECT_GE(report.value("accuracy", 0.0), 0.85) << last;
  EXPECT_EQ(report.value("images", 0), 10000) << last;
  ASSERT_EQ(report["classes"].size(), 10u) << last;
  EXPECT_EQ(report["classes"][0].value("name", ""), "T-shirt/top") << last;

  // delete: nothing labelled with the job is left but its volume and its token.
  auto del = Trainctl(Verb("delete", spec), kSrc);
  EXPECT_EQ(del.exit.code, 0) << del.output;
  const std::string left = Left("all,configmaps,secrets,pvc,networkpolicies,roles,rolebindings,serviceaccounts",
                                "trainctl.dev/job=fashion-mnist", 2);
  EXPECT_EQ(CountLines(left, "/"), 2) << left;
  EXPECT_NE(left.find("persistentvolumeclaim/fashion-mnist-data"), std::string::npos) << left;
  EXPECT_NE(left.find("secret/fashion-mnist-token"), std::string::npos) << left;
}

// The dataset staged from S3: the project's S3 server (versitygw, which checks signatures) on the
// bridge's address, where the pods reach it, the credentials in a Secret. With a wrong secret the
// stage Job fails at once (its podFailurePolicy: one pod, no retries), its log names the server's
// code, `status` says staging failed, and no worker starts; with the right one the workers train
// on what the stage Job fetched.
TEST_F(Live, TheDatasetIsStagedFromS3AndAWrongSecretFailsTheStageAtOnce) {
  S3Server server(s_.path("s3"), "10.244.0.1");
  ASSERT_TRUE(server.ok()) << server.Log();
  ASSERT_EQ(
      RunProgram({"tar", "-czf", s_.path("fashion-mnist.tar.gz"), "-C", "/usr/share/datasets/fashion-mnist", "."}, kSrc)
          .exit.code,
      0);
  ASSERT_EQ(server.Request("trainctl/datasets/fashion-mnist.tar.gz", s_.path("fashion-mnist.tar.gz")).code, 200);
  const std::string sha =
      RunProgram({"sh", "-c", "sha256sum fashion-mnist.tar.gz | cut -c1-64"}, s_.path("")).output.substr(0, 64);
  auto secret = [&](const std::string& secret_key) {
    s_.Write("s3.env", "AWS_ACCESS_KEY_ID=" + server.Var("AWS_ACCESS_KEY_ID") +
                           "\nAWS_SECRET_ACCESS_KEY=" + secret_key + "\nAWS_ENDPOINT_URL=" + server.endpoint() + "\n");
    Kubectl({"delete", "secret", "s3-readers", "-n", ns_, "--ignore-not-found"});
    auto r = Kubectl({"create", "secret", "generic", "s3-readers", "-n", ns_, "--from-env-file=" + s_.path("s3.env")});
    EXPECT_EQ(r.exit.code, 0) << r.output;
  };
  auto spec = BaseExample(ns_);
  spec.insert(spec.end(), {"--set", "cluster.stage.url=s3://trainctl/datasets/fashion-mnist.tar.gz", "--set",
                           "cluster.stage.sha256=" + sha, "--set", "cluster.stage.credentials=s3-readers", "--set",
                           "trainer.epochs=1", "--set", "trainer.max_steps=40",
                           // Room for the stage pod (1 CPU) beside the workers (2 pods of 2 x 0.2)
                           // and eval (0.2) on 2 cores: the workers are scheduled at once and wait
                           // in their init containers, so with BaseExample's 1.8 cores for them the
                           // stage pod fit only when the scheduler took it first (once in CI it did
                           // not, and nothing ran for 4 minutes).
                           "--set", "resources.cpus=0.2"});
  auto gone = [&] { EXPECT_EQ(Left("jobs,pods", "trainctl.dev/job=fashion-mnist", 0, std::chrono::seconds(120)), ""); };

  secret("not-the-secret");
  auto submit = Submit(spec);
  ASSERT_EQ(submit.exit.code, 0) << submit.output;
  std::string last;
  json status = WaitForEnd(spec, std::chrono::minutes(4), &last);
  EXPECT_EQ(status.value("state", "").rfind("failed: staging the dataset failed", 0), 0u) << last;
  json stage = KubectlJson({"get", "job", "fashion-mnist-stage", "-n", ns_});
  EXPECT_EQ(stage["status"].value("failed", 0), 1) << "one try: exit 2 is final\n" << stage.dump(1);
  auto logs = Trainctl(Verb("logs", spec, {"--component", "stage"}), kSrc);
  EXPECT_NE(logs.output.find("HTTP 403 SignatureDoesNotMatch"), std::string::npos) << logs.output;
  EXPECT_EQ(logs.output.find(server.Var("AWS_SECRET_ACCESS_KEY")), std::string::npos);
  for (const auto& pod : status["pods"]) {
    if (pod.value("component", "") == "worker") {
      EXPECT_EQ(pod.value("phase", ""), "Pending") << last;
    }
  }
  EXPECT_EQ(Trainctl(Verb("delete", spec), kSrc).exit.code, 0);
  gone();

  secret(server.Var("AWS_SECRET_ACCESS_KEY"));
  submit = Submit(spec);
  ASSERT_EQ(submit.exit.code, 0) << submit.output;
  status = Finish(spec, std::chrono::minutes(10), "jobs,pods", &last);  // staged, and 40 steps trained
  logs = Trainctl(Verb("logs", spec, {"--component", "stage"}), kSrc);
  EXPECT_NE(
      logs.output.find("staged s3://trainctl/datasets/fashion-mnist.tar.gz into /mnt/trainctl/datasets/fashion-mnist"),
      std::string::npos)
      << logs.output;
  EXPECT_EQ(Trainctl(Verb("delete", spec), kSrc).exit.code, 0);
  gone();
}

// A worker pod deleted mid-training (its node lost, a spot instance reclaimed): the Job makes a
// new pod for its index, the agents rejoin at a new round, training resumes from the last
// snapshot and finishes with the accuracy of an undisturbed run. Prints the time from the
// deletion to node 0's first training step after the restart (log_every 10 steps).
TEST_F(Live, ADeletedWorkerPodIsReplacedAndTheJobFinishes) {
  auto spec = BaseExample(ns_);
  spec.insert(spec.end(), {"--set", "trainer.log_every=10"});
  auto submit = Submit(spec);
  ASSERT_EQ(submit.exit.code, 0) << submit.output;
  const std::vector<std::string> node0 = {
      "logs",      "-n", ns_,
      "--tail=-1", "-l", "trainctl.dev/job=fashion-mnist,batch.kubernetes.io/job-completion-index=0"};
  std::string log;
  ASSERT_TRUE(Eventually(
      [&] {  // well into training: the second epoch
        log = Kubectl(node0).output;
        return log.find("epoch 2/5 [") != std::string::npos;
      },
      std::chrono::minutes(5)))
      << log << Kubectl({"get", "pods", "-n", ns_, "-o", "wide"}).output;
  auto deleted = Kubectl({"delete", "pod", "-n", ns_, "--wait=false", "-l",
                          "trainctl.dev/job=fashion-mnist,batch.kubernetes.io/job-completion-index=1"});
  ASSERT_EQ(deleted.exit.code, 0) << deleted.output;
  const auto t0 = Clock::now();
  // Node 0's log, from its first line of the next round on: a training step there means every
  // rank trains (each step's allreduce waits for all of them).
  const std::regex step("(^|\n)\\[worker-0\\] epoch \\d/5 \\[");
  ASSERT_TRUE(Eventually(
      [&] {
        log = Kubectl(node0).output;
        auto restart = log.find("restart=1]");
        return restart != std::string::npos && std::regex_search(log.substr(restart), step);
      },
      std::chrono::minutes(4)))
      << log << Kubectl({"get", "pods", "-n", ns_, "-o", "wide"}).output;
  const double recovered = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("a deleted worker pod: every rank training again %.1f s after the deletion\n", recovered);

  std::string last;
  Finish(spec, std::chrono::minutes(10), "pods", &last);
  json report = EvalReport(ns_, &last);
  EXPECT_GE(report.value("accuracy", 0.0), 0.85) << last;
  std::printf("test accuracy after the restart: %.4f\n", report.value("accuracy", 0.0));
}

// The PyTorchJob under the real Training Operator (the cluster runs it beside the control plane,
// with its webhook): Worker pods only, wired by the operator's per-replica Services and its
// replica-index labels, none refused by "restricted". A Worker pod deleted mid-run is made again
// by the operator and its agent rejoins; status, logs and delete follow the PyTorchJob.
TEST_F(Live, APyTorchJobTrainsUnderTheTrainingOperatorThroughALostWorkerPod) {
  auto spec = BaseExample(ns_);
  spec.insert(spec.end(), {"--format", "pytorchjob", "--set", "trainer.epochs=1", "--set", "trainer.max_steps=300",
                           "--set", "trainer.log_every=10"});
  auto submit = Submit(spec);
  ASSERT_EQ(submit.exit.code, 0) << submit.output;
  const std::string job = "trainctl.dev/job=fashion-mnist";
  const std::vector<std::string> node0 = {"logs",      "-n", ns_,
                                          "--tail=-1", "-l", job + ",training.kubeflow.org/replica-index=0"};
  std::string log;
  ASSERT_TRUE(Eventually(
      [&] {
        log = Kubectl(node0).output;
        return log.find("epoch 1/1 [") != std::string::npos;
      },
      std::chrono::minutes(5)))
      << log << Kubectl({"get", "pytorchjobs,pods,events", "-n", ns_, "-o", "wide"}).output;
  json first = Pods(job + ",training.kubeflow.org/replica-index=1");
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0]["spec"].value("initContainers", json::array()).size(), 0u) << first[0]["spec"].dump();
  auto deleted = Kubectl({"delete", "pod", "-n", ns_, "--wait=false", first[0]["metadata"].value("name", "")});
  ASSERT_EQ(deleted.exit.code, 0) << deleted.output;
  const auto t0 = Clock::now();
  const std::regex step("(^|\n)\\[worker-0\\] epoch 1/1 \\[");
  ASSERT_TRUE(Eventually(
      [&] {  // a step on node 0 after the new round: every rank trains again
        log = Kubectl(node0).output;
        auto restart = log.find("restart=1]");
        return restart != std::string::npos && std::regex_search(log.substr(restart), step);
      },
      std::chrono::minutes(4)))
      << log << Kubectl({"get", "pods", "-n", ns_, "-o", "wide"}).output;
  std::printf("a deleted PyTorchJob Worker pod: every rank training again %.1f s after the deletion\n",
              std::chrono::duration<double>(Clock::now() - t0).count());
  json again = Pods(job + ",training.kubeflow.org/replica-index=1");
  ASSERT_EQ(again.size(), 1u);
  EXPECT_NE(again[0]["metadata"].value("uid", ""), first[0]["metadata"].value("uid", ""));

  std::string last;
  json status = Finish(spec, std::chrono::minutes(8), "pytorchjobs,pods", &last);
  EXPECT_EQ(status.value("succeeded", 0), 2) << last;
  auto logs = Trainctl(Verb("logs", spec), kSrc);
  EXPECT_EQ(logs.exit.code, 0) << logs.output;
  for (const std::string pod : {"fashion-mnist-worker-0", "fashion-mnist-worker-1"}) {
    EXPECT_TRUE(std::regex_search(logs.output, std::regex("(^|\n)\\[pod/" + pod + "/"))) << pod << "\n" << logs.output;
  }
  auto del = Trainctl(Verb("delete", spec), kSrc);
  EXPECT_EQ(del.exit.code, 0) << del.output;
  EXPECT_EQ(Left("pytorchjobs,pods,services"), "");  // the PyTorchJob, and with it the operator's pods and Services
}

// The TrainJob under the real Kubeflow Trainer and JobSet (scripts/cluster/operators): Trainer
// makes the torch-distributed runtime's JobSet with trainctl's runtime patch, JobSet its Indexed
// Job of two node pods; a node pod deleted mid-run is replaced by the Job and rejoins the round.
// The image is trainctl:dev: a TrainJob's node cannot say IfNotPresent, and :latest is pulled.
TEST_F(Live, ATrainJobTrainsUnderTrainerAndJobSetThroughALostNodePod) {
  auto spec = BaseExample(ns_);
  spec.insert(spec.end(), {"--format", "trainjob", "--set", "cluster.image=trainctl:dev", "--set", "trainer.epochs=1",
                           "--set", "trainer.max_steps=300", "--set", "trainer.log_every=10"});
  auto submit = Submit(spec);
  ASSERT_EQ(submit.exit.code, 0) << submit.output;
  EXPECT_EQ(submit.output.find("warning"), std::string::npos) << submit.output;
  const std::string job = "trainctl.dev/job=fashion-mnist";
  const std::string index = ",batch.kubernetes.io/job-completion-index=";
  const std::vector<std::string> node0 = {"logs", "-n", ns_, "--tail=-1", "-l", job + index + "0"};
  std::string log;
  ASSERT_TRUE(Eventually(
      [&] {
        log = Kubectl(node0).output;
        return log.find("epoch 1/1 [") != std::string::npos;
      },
      std::chrono::minutes(5)))
      << log << Kubectl({"get", "trainjobs,jobsets,jobs,pods,events", "-n", ns_, "-o", "wide"}).output;
  json first = Pods(job + index + "1");
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0]["metadata"]["labels"].value("jobset.sigs.k8s.io/jobset-name", ""), "fashion-mnist");
  auto deleted = Kubectl({"delete", "pod", "-n", ns_, "--wait=false", first[0]["metadata"].value("name", "")});
  ASSERT_EQ(deleted.exit.code, 0) << deleted.output;
  const auto t0 = Clock::now();
  const std::regex step("(^|\n)\\[worker-0\\] epoch 1/1 \\[");
  ASSERT_TRUE(Eventually(
      [&] {  // a step on node 0 after the new round: every rank trains again
        log = Kubectl(node0).output;
        auto restart = log.find("restart=1]");
        return restart != std::string::npos && std::regex_search(log.substr(restart), step);
      },
      std::chrono::minutes(4)))
      << log << Kubectl({"get", "pods", "-n", ns_, "-o", "wide"}).output;
  std::printf("a deleted TrainJob node pod: every rank training again %.1f s after the deletion\n",
              std::chrono::duration<double>(Clock::now() - t0).count());
  json again = Pods(job + index + "1");
  ASSERT_EQ(again.size(), 1u);
  EXPECT_NE(again[0]["metadata"].value("uid", ""), first[0]["metadata"].value("uid", ""));

  std::string last;
  json status = Finish(spec, std::chrono::minutes(8), "trainjobs,jobsets,jobs,pods", &last);
  EXPECT_EQ(status.value("succeeded", 0), 2) << last;  // the node pods, not the JobSet's one Job
  auto logs = Trainctl(Verb("logs", spec), kSrc);
  EXPECT_EQ(logs.exit.code, 0) << logs.output;
  for (const std::string pod : {"fashion-mnist-node-0-0-", "fashion-mnist-node-0-1-"}) {
    EXPECT_TRUE(std::regex_search(logs.output, std::regex("(^|\n)\\[pod/" + pod))) << pod << "\n" << logs.output;
  }
  auto del = Trainctl(Verb("delete", spec), kSrc);
  EXPECT_EQ(del.exit.code, 0) << del.output;
  EXPECT_EQ(Left("trainjobs,jobsets,jobs,pods,services"), "");  // Trainer's JobSet goes with it, and JobSet's Jobs
}

// The TFJob of the parameter-server example under the real Training Operator: PS, Worker, Chief
// and Evaluator replicas, a pod per task; the chief decides the job's success.
TEST_F(Live, ATFJobWithRolesTrainsUnderTheTrainingOperator) {
  const std::vector<std::string> spec = {kSrc + "/examples/parameter-server.yaml",
                                         "--format",
                                         "tfjob",
                                         "--set",
                                         "cluster.namespace=" + ns_,
                                         "--set",
                                         "cluster.tensorboard=false",
                                         "--set",
                                         "trainer.epochs=1",
                                         "--set",
                                         "trainer.max_steps=150"};
  auto submit = Submit(spec);
  ASSERT_EQ(submit.exit.code, 0) << submit.output;
  std::string last;
  Finish(spec, std::chrono::minutes(10), "tfjobs,pods", &last);
  std::set<std::string> types;
  for (const auto& p : Pods("trainctl.dev/job=parameter-server,training.kubeflow.org/replica-type")) {
    types.insert(p["metadata"]["labels"].value("training.kubeflow.org/replica-type", ""));
  }
  EXPECT_EQ(types, (std::set<std::string>{"chief", "evaluator", "ps", "worker"}));
  auto chief =
      Kubectl({"logs", "-n", ns_, "-l", "trainctl.dev/job=parameter-server,trainctl.dev/role=chief", "--tail=-1"});
  EXPECT_NE(chief.output.find("step"), std::string::npos) << chief.output;
  EXPECT_EQ(Trainctl(Verb("delete", spec), kSrc).exit.code, 0);
}

// The MPIJob under the real MPI Operator: its launcher runs `trainctl run --target mpi`, whose
// mpirun starts an agent in each Worker pod over the operator's ssh keys, into sshd run by the
// image's user 1000 on port 2222 (deploy/Dockerfile's mpi stage), all under "restricted".
TEST_F(Live, AnMPIJobTrainsUnderTheMPIOperator) {
  auto spec = BaseExample(ns_);
  spec.insert(spec.end(), {"--format", "mpijob", "--set", "cluster.image=trainctl:mpi", "--set", "trainer.epochs=1",
                           "--set", "trainer.max_steps=150", "--set",
                           "resources.cpus=0.3"});  // beside the launcher's 0.5 and eval's 0.2: 1.9 cores
  auto submit = Submit(spec);
  ASSERT_EQ(submit.exit.code, 0) << submit.output;
  std::string last;
  json status = Finish(spec, std::chrono::minutes(10), "mpijobs,jobs,pods", &last);
  if (status.value("state", "") != "succeeded") {
    ADD_FAILURE()
        << Kubectl({"logs", "-n", ns_, "-l", "trainctl.dev/job=fashion-mnist", "--tail=40", "--prefix"}).output;
  }
  // The launcher's log holds both agents' training, each started by mpirun in its Worker pod.
  auto launcher = Kubectl(
      {"logs", "-n", ns_, "-l", "trainctl.dev/job=fashion-mnist,app.kubernetes.io/component=launcher", "--tail=-1"});
  EXPECT_NE(launcher.output.find("[worker-0]"), std::string::npos) << launcher.output;
  EXPECT_NE(launcher.output.find("[worker-3]"), std::string::npos) << launcher.output;  // 2 pods of 2 workers
  auto logs = Trainctl(Verb("logs", spec), kSrc);
  EXPECT_EQ(logs.exit.code, 0) << logs.output;
  EXPECT_NE(logs.output.find("[pod/fashion-mnist-launcher-"), std::string::npos) << logs.output;
  auto del = Trainctl(Verb("delete", spec), kSrc);
  EXPECT_EQ(del.exit.code, 0) << del.output;
  EXPECT_EQ(Left("mpijobs,pods"), "");
}

// The rendered submitter Role is all that submit, status, logs and delete need: they run as a
// ServiceAccount bound to it alone (a kubeconfig with its token), which cannot read another
// namespace's Secrets.
TEST_F(Live, TheSubmitterRoleIsEnoughForEveryVerb) {
  auto spec = BaseExample(ns_);
  spec.insert(spec.end(), {"--set", "trainer.max_steps=20", "--set", "nodes=1"});
  // The administrator's part: the Role (as rendered), an account, its binding, a token.
  const std::string manifests = RenderManifests(s_, "job.yaml", spec, kSrc);
  for (const auto& o : Objects(manifests)) {
    if (o.value("kind", "") != "Role") continue;
    s_.Write("role.json", o.dump());
    ASSERT_EQ(Kubectl({"apply", "-n", ns_}, s_.path("role.json")).exit.code, 0);
  }
  ASSERT_EQ(Kubectl({"create", "serviceaccount", "ci", "-n", ns_}).exit.code, 0);
  ASSERT_EQ(Kubectl({"create", "rolebinding", "ci", "-n", ns_, "--role=fashion-mnist-submitter",
                     "--serviceaccount=" + ns_ + ":ci"})
                .exit.code,
            0);
  auto token = Kubectl({"create", "token", "ci", "-n", ns_, "--duration=1h"});
  ASSERT_EQ(token.exit.code, 0) << token.output;
  json admin = KubectlJson({"config", "view", "--raw", "--minify"});
  const json& cluster = admin["clusters"][0]["cluster"];
  json kubeconfig = {
      {"apiVersion", "v1"},
      {"kind", "Config"},
      {"clusters", {{{"name", "c"}, {"cluster", cluster}}}},
      {"users",
       {{{"name", "ci"}, {"user", {{"token", token.output.substr(0, token.output.find_last_not_of("\n") + 1)}}}}}},
      {"contexts", {{{"name", "ci"}, {"context", {{"cluster", "c"}, {"user", "ci"}, {"namespace", ns_}}}}}},
      {"current-context", "ci"}};
  const std::string config = s_.Write("ci.kubeconfig", kubeconfig.dump());
  const std::vector<std::pair<std::string, std::string>> as_ci = {{"KUBECONFIG", config}};

  auto submit = Submit(spec, as_ci);
  ASSERT_EQ(submit.exit.code, 0) << submit.output;
  std::string last;
  Finish(spec, std::chrono::minutes(8), "pods", &last, as_ci);
  auto logs = Trainctl(Verb("logs", spec), kSrc, std::chrono::seconds(60), as_ci);
  EXPECT_EQ(logs.exit.code, 0) << logs.output;
  EXPECT_NE(logs.output.find("[pod/fashion-mnist-0-"), std::string::npos) << logs.output;
  auto del = Trainctl(Verb("delete", spec, {"--data"}), kSrc, std::chrono::seconds(60), as_ci);
  EXPECT_EQ(del.exit.code, 0) << del.output;
  EXPECT_EQ(Left("all,configmaps,secrets,pvc,networkpolicies,serviceaccounts", "trainctl.dev/job=fashion-mnist"), "")
      << "--data: the volume and the token go too";

  SpawnOptions o;
  o.argv = {"kubectl", "--request-timeout=30s", "get", "secrets", "-n", "default"};
  o.env = CurrentEnvironment();
  SetEnv(&o.env, "KUBECONFIG", config);
  auto outside = RunCommand(o, std::chrono::seconds(60));
  ASSERT_TRUE(outside.ok());
  EXPECT_NE(outside->exit.code, 0) << outside->output;
  EXPECT_NE(outside->output.find("forbidden"), std::string::npos) << outside->output;
}

// An agent's verdict that no restart can change (exit 2: the spec its pod was given is invalid)
// fails the Job at once through its podFailurePolicy, not after backoffLimit retries.
TEST_F(Live, AnInvalidSpecInThePodFailsTheJobAtOnce) {
  auto spec = BaseExample(ns_);
  spec.insert(spec.end(), {"--set", "nodes=1"});
  const std::string manifests = RenderManifests(s_, "job.yaml", spec, kSrc);
  json objects = Objects(manifests);
  bool patched = false;
  for (auto& o : objects) {  // the pods' job.json, as a hand edit or a bad GitOps merge would leave it
    if (o.value("kind", "") != "ConfigMap" || !o.contains("data") || !o["data"].contains("job.json")) continue;
    json job = json::parse(o["data"]["job.json"].get<std::string>());
    job["trainer"]["epochs"] = "many";
    o["data"]["job.json"] = job.dump();
    patched = true;
  }
  ASSERT_TRUE(patched);
  ASSERT_EQ(
      Kubectl({"create", "secret", "generic", "fashion-mnist-token", "-n", ns_, "--from-literal=token=t0"}).exit.code,
      0);
  s_.Write("bad.json", json({{"apiVersion", "v1"}, {"kind", "List"}, {"items", objects}}).dump());
  auto applied = Kubectl({"apply", "-n", ns_}, s_.path("bad.json"));
  ASSERT_EQ(applied.exit.code, 0) << applied.output;
  std::string last;
  const auto started = Clock::now();
  json status = WaitForEnd(spec, std::chrono::minutes(4), &last);
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  EXPECT_EQ(status.value("state", "").rfind("failed: PodFailurePolicy", 0), 0u) << last;
  json jobs = KubectlJson(
      {"get", "jobs.batch", "-n", ns_, "-l", "trainctl.dev/job=fashion-mnist,app.kubernetes.io/component=worker"});
  ASSERT_FALSE(jobs.value("items", json::array()).empty());
  EXPECT_EQ(jobs["items"][0]["status"].value("failed", 0), 1) << jobs.dump(2);  // one pod, no retries
  std::printf("an exit-2 verdict failed the Job %.1f s after apply\n", seconds);
}

// A job with roles (parameter servers, workers, a chief, an evaluator), a pod per task.
TEST_F(Live, AJobWithRolesTrainsToTheEnd) {
  const std::vector<std::string> spec = {kSrc + "/examples/parameter-server.yaml",
                                         "--set",
                                         "cluster.namespace=" + ns_,
                                         "--set",
                                         "cluster.tensorboard=false",
                                         "--set",
                                         "trainer.epochs=1",
                                         "--set",
                                         "trainer.max_steps=150"};
  auto submit = Submit(spec);
  ASSERT_EQ(submit.exit.code, 0) << submit.output;
  std::string last;
  Finish(spec, std::chrono::minutes(10), "pods,jobs", &last);
  auto chief =
      Kubectl({"logs", "-n", ns_, "-l", "trainctl.dev/job=parameter-server,trainctl.dev/role=chief", "--tail=-1"});
  EXPECT_NE(chief.output.find("step"), std::string::npos) << chief.output;
  EXPECT_EQ(Trainctl(Verb("delete", spec), kSrc).exit.code, 0);
}

// The Helm chart of `render --format helm` installed against the live API server, the job run,
// and removed by helm uninstall.
TEST_F(Live, TheHelmChartInstallsRunsAndUninstalls) {
  const std::string helm = kSrc + "/tests/k8s/.helm/helm";
  ASSERT_TRUE(fs::exists(helm)) << "scripts/dev deps installs Helm";
  auto spec = BaseExample(ns_);
  spec.insert(spec.end(),
              {"--set", "nodes=1", "--set", "trainer.max_steps=20", "--format", "helm", "-o", s_.path("chart")});
  auto r = Trainctl(Verb("render", spec), kSrc);
  ASSERT_EQ(r.exit.code, 0) << r.output;
  SpawnOptions o;
  o.env = CurrentEnvironment();
  for (const char* k : {"HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"}) SetEnv(&o.env, k, s_.path("helm"));
  o.argv = {helm, "install", "fm", s_.path("chart"), "-n", ns_, "--wait-for-jobs", "--wait", "--timeout", "8m"};
  auto install = RunCommand(o, std::chrono::minutes(9));
  ASSERT_TRUE(install.ok());
  EXPECT_EQ(install->exit.code, 0) << install->output << Kubectl({"get", "pods,jobs", "-n", ns_, "-o", "wide"}).output;
  json jobs = KubectlJson({"get", "jobs.batch", "-n", ns_, "-l", "app.kubernetes.io/component=worker"});
  ASSERT_EQ(jobs.value("items", json::array()).size(), 1u);
  EXPECT_EQ(jobs["items"][0]["status"].value("succeeded", 0), 1) << jobs.dump(2);
  o.argv = {helm, "uninstall", "fm", "-n", ns_, "--wait", "--timeout", "2m"};
  auto uninstall = RunCommand(o, std::chrono::minutes(3));
  ASSERT_TRUE(uninstall.ok());
  EXPECT_EQ(uninstall->exit.code, 0) << uninstall->output;
  EXPECT_EQ(Left("jobs,services,configmaps", "trainctl.dev/job=fashion-mnist"), "");
}

// `render --format kustomize`, two overlays applied with kubectl apply -k, each into the namespace
// its environment names, and removed with kubectl delete -k.
TEST_F(Live, KustomizeOverlaysApply) {
  const std::string dir = s_.path("deploy");
  auto r = Trainctl(
      {"render", kSrc + "/examples/k8s/base.yaml", "--format", "kustomize", "-o", dir, "--env",
       "dev=" + s_.Write("dev.yaml", "nodes: 1\ncluster: {namespace: " + ns_ + "-dev, tensorboard: false}\n"), "--env",
       "small=" + s_.Write("small.yaml", "nodes: 1\nresources: {cpus: 0.2}\ncluster: {namespace: " + ns_ +
                                             "-small, tensorboard: false}\n")},
      kSrc);
  ASSERT_EQ(r.exit.code, 0) << r.output;
  for (const std::string env : {"dev", "small"}) {
    SCOPED_TRACE(env);
    const std::string ns = ns_ + "-" + env;
    ASSERT_EQ(Kubectl({"create", "namespace", ns}).exit.code, 0);
    Kubectl({"label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted"});
    auto applied = Kubectl({"apply", "-k", dir + "/overlays/" + env});
    EXPECT_EQ(applied.exit.code, 0) << applied.output;
    json jobs = KubectlJson({"get", "jobs.batch", "-n", ns, "-l", "app.kubernetes.io/component=worker"});
    EXPECT_EQ(jobs.value("items", json::array()).size(), 1u) << jobs.dump(2);
    auto deleted = Kubectl({"delete", "-k", dir + "/overlays/" + env, "--wait=false"});
    EXPECT_EQ(deleted.exit.code, 0) << deleted.output;
    Kubectl({"delete", "namespace", ns, "--wait=false"});
  }
}

}  // namespace
}  // namespace trainctl::testing
