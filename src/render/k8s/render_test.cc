// What every rendered manifest promises, checked on the objects themselves: the restricted Pod
// Security Standard, no secret in any manifest, namespaced minimal RBAC, a NetworkPolicy that
// admits only the job's pods, and the pod's view of the spec. The schema, kustomize and golden
// checks run the binary (tests/k8s_test.cc).
#include "render/k8s/render.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <random>

namespace trainctl::k8s {
namespace {

using nlohmann::json;

JobSpec Parse(const std::string& yaml) {
  auto spec = ParseJobSpec(yaml, "test.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  return spec.ok() ? *spec : JobSpec{};
}

const std::string kSpec = R"(name: fm
nodes: 2
procs_per_node: 4
resources: {cpus: 1.5, memory: 2Gi, gpus: 1}
trainer: {model: cnn, data: {dir: datasets/fm}}
cluster:
  image: registry.example.com/trainctl:1
  namespace: ml
  stage: {url: "https://example.com/fm.tar.gz"}
  node_selector: {pool: gpu}
  tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
)";

// Every pod template in an object: a Job's, a Deployment's, each Kubeflow replica's.
std::vector<json> PodTemplates(const json& o) {
  std::vector<json> out;
  if (!o.contains("spec")) return out;  // (const operator[] on a missing key is undefined)
  const json& spec = o.at("spec");
  if (spec.contains("template")) out.push_back(spec.at("template"));
  for (const char* replicas : {"pytorchReplicaSpecs", "tfReplicaSpecs", "mpiReplicaSpecs"}) {
    if (!spec.contains(replicas)) continue;
    for (const auto& [type, r] : spec.at(replicas).items()) out.push_back(r.at("template"));
  }
  return out;
}

std::vector<json> All(const JobSpec& spec) {
  std::vector<json> all;
  for (const auto& format : kFormats) {
    for (auto& o : Render(spec, format)) all.push_back(o);
  }
  return all;
}

TEST(Render, EveryPodMeetsTheRestrictedPodSecurityStandard) {
  JobSpec elastic = Parse(kSpec + "\n");
  elastic.nodes.min = 1;  // with the rendered etcd
  int pods = 0;
  for (const JobSpec& spec : {Parse(kSpec), elastic}) {
    for (const auto& o : All(spec)) {
      for (const auto& t : PodTemplates(o)) {
        ++pods;
        const std::string what = o["kind"].get<std::string>() + "/" + o["metadata"]["name"].get<std::string>();
        const json& ps = t["spec"]["securityContext"];
        EXPECT_EQ(ps["runAsNonRoot"], true) << what;
        EXPECT_GT(ps["runAsUser"].get<int>(), 0) << what;
        EXPECT_EQ(ps["seccompProfile"]["type"], "RuntimeDefault") << what;
        EXPECT_FALSE(t["spec"].contains("hostNetwork") || t["spec"].contains("hostPID") ||
                     t["spec"].contains("hostIPC"))
            << what;
        EXPECT_EQ(t["spec"]["automountServiceAccountToken"], false) << what;
        for (const auto& v : t["spec"]["volumes"]) EXPECT_FALSE(v.contains("hostPath")) << what;
        json containers = t["spec"]["containers"];
        for (const auto& c : t["spec"].value("initContainers", json::array())) containers.push_back(c);
        for (const auto& c : containers) {
          const json& cs = c["securityContext"];
          EXPECT_EQ(cs["allowPrivilegeEscalation"], false) << what << " " << c["name"];
          EXPECT_EQ(cs["capabilities"]["drop"], json::array({"ALL"})) << what;
          EXPECT_FALSE(cs["capabilities"].contains("add")) << what;
          EXPECT_FALSE(cs.value("privileged", false)) << what;
          for (const auto& e : c["env"]) {
            // The store token comes from its Secret; no manifest holds it.
            if (e["name"].get<std::string>().find("TOKEN") != std::string::npos) {
              EXPECT_FALSE(e.contains("value")) << what << " " << e;
              EXPECT_TRUE(e["valueFrom"].contains("secretKeyRef")) << what;
            }
          }
        }
      }
    }
  }
  EXPECT_GE(pods, 12);  // workers, stage, eval, tensorboard, etcd, in both formats
}

TEST(Render, RbacIsNamespacedMinimalAndWithoutWildcards) {
  for (const auto& o : All(Parse(kSpec))) {
    EXPECT_NE(o["kind"], "ClusterRole");
    EXPECT_NE(o["kind"], "ClusterRoleBinding");
    EXPECT_EQ(o["metadata"]["namespace"], "ml") << o["kind"];
    EXPECT_EQ(o["metadata"]["labels"]["trainctl.dev/job"], "fm") << o["kind"];
    if (o["kind"] != "Role") continue;
    for (const auto& rule : o["rules"]) {
      for (const char* field : {"apiGroups", "resources", "verbs"}) {
        for (const auto& v : rule[field]) EXPECT_NE(v.get<std::string>().find('*'), 0u) << rule;
      }
      for (const auto& v : rule["verbs"]) {
        EXPECT_NE(v, "escalate");
        EXPECT_NE(v, "bind");
        EXPECT_NE(v, "impersonate");
      }
      // Secrets: create the token, read it back, delete it by name (delete --data); never list
      // every secret of the namespace, nor delete another.
      if (rule["resources"].front() == "secrets" && !rule.contains("resourceNames")) {
        EXPECT_EQ(rule["verbs"], json::array({"get", "create"}));
      } else if (rule["resources"].front() == "secrets") {
        EXPECT_EQ(rule["resourceNames"], json::array({"fm-token"}));
        EXPECT_EQ(rule["verbs"], json::array({"delete"}));
      }
    }
  }
}

TEST(Render, OnlyTheJobsOwnPodsReachItsPods) {
  for (const auto& o : Render(Parse(kSpec), "job")) {
    if (o["kind"] != "NetworkPolicy") continue;
    const json job_pods = {{"matchLabels", {{"trainctl.dev/job", "fm"}}}};
    EXPECT_EQ(o["spec"]["podSelector"], job_pods);
    EXPECT_EQ(o["spec"]["policyTypes"], json::array({"Ingress"}));
    // The job's pods from each other; the agents' metrics port (token-guarded) from any namespace.
    EXPECT_EQ(o["spec"]["ingress"],
              json::parse(R"([{"from": [{"podSelector": {"matchLabels": {"trainctl.dev/job": "fm"}}}]},
        {"from": [{"namespaceSelector": {}}], "ports": [{"protocol": "TCP", "port": 9400}]}])"));
    for (const auto& p : Render(Parse(kSpec + "  metrics_port: 0\n"), "job")) {
      if (p["kind"] == "NetworkPolicy") {
        EXPECT_EQ(p["spec"]["ingress"].size(), 1u) << p.dump();
      }
    }
    return;
  }
  FAIL() << "no NetworkPolicy rendered";
}

// A PyTorchJob of Workers only, each pod's agent ranked by the operator's replica-index label and
// node 0 (the operator's Service <job>-worker-0) serving the store: with a Master, the Training
// Operator would add its own init container to the Workers, which "restricted" refuses.
TEST(Render, APyTorchJobHasWorkersOnlyRankedByTheOperatorsIndexLabel) {
  for (const auto& o : Render(Parse(kSpec), "pytorchjob")) {
    if (o["kind"] != "PyTorchJob") continue;
    const json& replicas = o["spec"]["pytorchReplicaSpecs"];
    ASSERT_EQ(replicas.size(), 1u) << replicas.dump();
    ASSERT_TRUE(replicas.contains("Worker")) << replicas.dump();
    EXPECT_EQ(replicas["Worker"]["replicas"], 2);
    const json& c = replicas["Worker"]["template"]["spec"]["containers"][0];
    EXPECT_EQ(c["name"], "pytorch");
    EXPECT_NE(c["command"].dump().find(R"x("--node-rank","$(REPLICA_INDEX)")x"), std::string::npos) << c["command"];
    EXPECT_NE(
        c["env"].dump().find(
            R"({"name":"REPLICA_INDEX","valueFrom":{"fieldRef":{"fieldPath":"metadata.labels['training.kubeflow.org/replica-index']"}}})"),
        std::string::npos)
        << c["env"];
    EXPECT_NE(c["env"].dump().find(R"("value":"tcp://fm-worker-0:29400")"), std::string::npos) << c["env"];
    return;
  }
  FAIL() << "no PyTorchJob rendered";
}

// Prometheus Operator users get a PodMonitor that scrapes every agent's metrics port with the
// job's token; the agents are told to serve it.
TEST(Render, APodMonitorScrapesTheAgentsWithTheJobsToken) {
  for (const std::string format : {"job", "pytorchjob"}) {
    const auto objects = Render(Parse(kSpec + "  pod_monitor: true\n  metrics_port: 9500\n"), format);
    const json* monitor = nullptr;
    for (const auto& o : objects) {
      if (o["kind"] == "PodMonitor") monitor = &o;
      if (o["kind"] != "Job" && o["kind"] != "PyTorchJob") continue;
      if (o["metadata"]["name"] != "fm") continue;
      const json& c = format == "job" ? o["spec"]["template"]["spec"]["containers"][0]
                                      : o["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0];
      const std::string argv = c["command"].dump();
      EXPECT_NE(argv.find(R"("--metrics-port","9500")"), std::string::npos) << argv;
      EXPECT_NE(c["ports"].dump().find(R"({"containerPort":9500,"name":"metrics"})"), std::string::npos) << c["ports"];
    }
    ASSERT_NE(monitor, nullptr) << format;
    EXPECT_EQ((*monitor)["apiVersion"], "monitoring.coreos.com/v1");
    EXPECT_EQ((*monitor)["spec"]["selector"]["matchLabels"]["trainctl.dev/job"], "fm");
    const json& ep = (*monitor)["spec"]["podMetricsEndpoints"][0];
    EXPECT_EQ(ep["port"], "metrics");
    EXPECT_EQ(ep["authorization"]["credentials"]["name"], "fm-token");
  }
  // Without it, none.
  for (const auto& o : Render(Parse(kSpec), "job")) EXPECT_NE(o["kind"], "PodMonitor");
  // Formats whose pods have no metrics port say so.
  auto spec = Parse(kSpec + "  pod_monitor: true\n");
  Status st = CheckFormat(spec, "mpijob");
  EXPECT_NE(st.message().find("cluster.pod_monitor"), std::string::npos) << st.message();
  st = CheckFormat(Parse(kSpec + "  pod_monitor: true\n  metrics_port: 0\n"), "job");
  EXPECT_NE(st.message().find("metrics_port"), std::string::npos) << st.message();
}

TEST(Render, WorkersGetOneNodeEachWithGpusSelectorsAndTheStagedData) {
  auto objects = Render(Parse(kSpec), "job");
  const json* job = nullptr;
  for (const auto& o : objects) {
    if (o["kind"] == "Job" && o["metadata"]["name"] == "fm") job = &o;
  }
  ASSERT_NE(job, nullptr);
  EXPECT_EQ((*job)["spec"]["completionMode"], "Indexed");
  EXPECT_EQ((*job)["spec"]["completions"], 2);
  const json& pod = (*job)["spec"]["template"]["spec"];
  const json& c = pod["containers"][0];
  // Per node: procs_per_node x the per-worker resources.
  EXPECT_EQ(c["resources"]["limits"]["nvidia.com/gpu"], 4);
  EXPECT_EQ(c["resources"]["limits"]["cpu"], "6");
  EXPECT_EQ(c["resources"]["requests"]["memory"], "8Gi");
  EXPECT_EQ(pod["nodeSelector"], json({{"pool", "gpu"}}));
  EXPECT_EQ(pod["tolerations"][0]["key"], "nvidia.com/gpu");
  EXPECT_EQ(pod["subdomain"], "fm");
  // The workers wait for the staging Job's marker before they start.
  ASSERT_EQ(pod["initContainers"].size(), 1u);
  EXPECT_EQ(pod["initContainers"][0]["env"][0]["value"], "/mnt/trainctl/datasets/fm/.trainctl-staged");
  // The spec they read has its directories on the shared volume.
  std::string spec_json;
  for (const auto& o : objects) {
    if (o["kind"] == "ConfigMap") spec_json = o["data"]["job.json"];
  }
  auto pod_spec = JobSpecFromJson(spec_json);
  ASSERT_TRUE(pod_spec.ok()) << pod_spec.status().ToString();
  EXPECT_EQ(pod_spec->output_dir, "/mnt/trainctl/runs/fm");
  EXPECT_EQ(pod_spec->checkpoint_dir, "/mnt/trainctl/runs/fm/checkpoints");
  EXPECT_EQ(pod_spec->trainer.data.dir, "/mnt/trainctl/datasets/fm");
}

// A GPU cluster's spec (issue 75): only the pods that train get the GPU node selector and
// tolerations; every other pod has requests and limits of its own; every Kubeflow v1 format
// restarts a pod for a signal and fails for trainctl's verdicts; a TrainJob's run id is fresh per
// submission (its JobSet's uid), as the Job format's is (its Job's uid).
TEST(Render, OnlyTrainingPodsHoldGpuNodesAndEveryOtherPodHasResources) {
  JobSpec elastic = Parse(kSpec);
  elastic.nodes.min = 1;  // with the rendered etcd
  int side = 0, training = 0;
  for (const JobSpec& spec : {Parse(kSpec), elastic}) {
    for (const auto& o : All(spec)) {
      for (const auto& t : PodTemplates(o)) {
        const std::string component = t["metadata"]["labels"]["app.kubernetes.io/component"];
        const std::string what =
            o["kind"].get<std::string>() + "/" + o["metadata"]["name"].get<std::string>() + " " + component;
        const json& pod = t["spec"];
        if (component == "worker") {
          ++training;
          EXPECT_EQ(pod["nodeSelector"], json({{"pool", "gpu"}})) << what;
          continue;
        }
        ++side;
        EXPECT_FALSE(pod.contains("nodeSelector")) << what;
        EXPECT_FALSE(pod.contains("tolerations")) << what;
        for (const auto& c : pod["containers"]) {
          EXPECT_TRUE(c["resources"]["requests"].contains("cpu")) << what;
          EXPECT_TRUE(c["resources"]["limits"].contains("memory")) << what;
          EXPECT_FALSE(c["resources"]["limits"].contains("nvidia.com/gpu")) << what;
        }
      }
      for (const char* replicas : {"pytorchReplicaSpecs", "tfReplicaSpecs"}) {
        if (!o.contains("spec") || !o["spec"].contains(replicas)) continue;
        for (const auto& [type, r] : o["spec"][replicas].items()) EXPECT_EQ(r["restartPolicy"], "ExitCode") << type;
      }
      if (o["kind"] == "TrainJob") {
        const json& env = o["spec"]["trainer"]["env"];
        std::string uid_from, run_id;
        for (const auto& e : env) {
          if (e["name"] == "JOB_UID") uid_from = e["valueFrom"]["fieldRef"]["fieldPath"];
          if (e["name"] == "TRAINCTL_RUN_ID") run_id = e["value"];
        }
        EXPECT_EQ(uid_from, "metadata.labels['jobset.sigs.k8s.io/jobset-uid']");
        EXPECT_EQ(run_id, "fm-$(JOB_UID)");
      }
    }
  }
  EXPECT_GE(training, 8);
  EXPECT_GE(side, 6);  // eval, TensorBoard, staging, the MPI launcher, etcd
}

// submit gives the PyTorchJob's and TFJob's agents a fresh run id (their pods see no uid of the
// object); the formats whose pods read one from a uid label keep theirs.
TEST(Render, SubmitGivesTheTrainingOperatorsFormatsAFreshRunId) {
  for (const char* format : {"pytorchjob", "tfjob", "job", "trainjob"}) {
    auto objects = Render(Parse(kSpec), format);
    SetSubmissionRunId(&objects, "fm-0123abcd");
    int agents = 0;
    const bool fresh = std::string(format) == "pytorchjob" || std::string(format) == "tfjob";
    for (const auto& o : objects) {
      for (const auto& t : PodTemplates(o)) {
        for (const auto& c : t["spec"]["containers"]) {
          for (const auto& e : c.value("env", json::array())) {
            if (e["name"] != "TRAINCTL_RUN_ID") continue;
            ++agents;
            EXPECT_EQ(e["value"], fresh ? "fm-0123abcd" : "fm-$(JOB_UID)") << format;
          }
        }
      }
    }
    EXPECT_EQ(agents > 0, std::string(format) != "trainjob") << format;  // a TrainJob's env is its trainer's
  }
}

TEST(Render, ElasticJobsGetAnEtcdAndRanksByArrival) {
  JobSpec spec = Parse(kSpec);
  spec.nodes.min = 1;
  bool etcd = false;
  for (const auto& o : Render(spec, "job")) {
    if (o["kind"] == "StatefulSet") etcd = o["metadata"]["name"] == "fm-etcd";
    if (o["kind"] == "Job" && o["metadata"]["name"] == "fm") {
      const json& c = o["spec"]["template"]["spec"]["containers"][0];
      auto cmd = c["command"].get<std::vector<std::string>>();
      auto rank = std::find(cmd.begin(), cmd.end(), "--node-rank");
      ASSERT_NE(rank, cmd.end());
      EXPECT_EQ(rank[1], "-1");
      EXPECT_EQ(std::find(cmd.begin(), cmd.end(), "--serve-store"), cmd.end());
      EXPECT_EQ(c["env"][3]["value"], "etcd://fm-etcd:2379");
    }
  }
  EXPECT_TRUE(etcd);
}

TEST(Render, YamlQuotesWhatAYaml11ReaderWouldMisread) {
  std::string y = ToYaml({json{{"a", "yes"},
                               {"b", "8080"},
                               {"c", ""},
                               {"d", "plain"},
                               {"e", "x: y"},
                               {"f", "two\nlines\n"},
                               {"g", 3},
                               {"h", false}}});
  // (the literal block keeps its one final newline; the blank line after it is yaml-cpp's)
  EXPECT_EQ(y, "a: \"yes\"\nb: \"8080\"\nc: \"\"\nd: plain\ne: \"x: y\"\nf: |\n  two\n  lines\n\ng: 3\nh: false\n");
}

// What a YAML reader builds from the text, as JSON with every scalar as its text.
json AsRead(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map: {
      json o = json::object();
      for (const auto& kv : n) o[kv.first.Scalar()] = AsRead(kv.second);
      return o;
    }
    case YAML::NodeType::Sequence: {
      json a = json::array();
      for (const auto& v : n) a.push_back(AsRead(v));
      return a;
    }
    case YAML::NodeType::Scalar:
      return n.Scalar();
    default:
      return nullptr;
  }
}

// The rendered object with every scalar as its text, as AsRead gives it.
json AsText(const json& j) {
  if (j.is_object()) {
    json o = json::object();
    for (const auto& [k, v] : j.items()) o[k] = AsText(v);
    return o;
  }
  if (j.is_array()) {
    json a = json::array();
    for (const auto& v : j) a.push_back(AsText(v));
    return a;
  }
  if (j.is_string()) return j;
  if (j.is_null()) return nullptr;
  return YAML::Load(ToYaml({json{{"v", j}}}))["v"].Scalar();
}

// Random text of what breaks YAML: every line break (LF, CR, NEL, U+2028, U+2029), indicators,
// quotes, tabs, spaces at either end, document markers, words YAML 1.1 reads as booleans, the
// red team's fields, control bytes, non-ASCII letters.
std::string HostileText(std::mt19937_64& rng) {
  static const std::vector<std::string> pieces = {"\n",
                                                  "\r",
                                                  "\r\n",
                                                  "\xc2\x85",
                                                  "\xe2\x80\xa8",
                                                  "\xe2\x80\xa9",
                                                  "\t",
                                                  " ",
                                                  "  ",
                                                  ": ",
                                                  "- ",
                                                  "#",
                                                  "'",
                                                  "\"",
                                                  "\\",
                                                  "|",
                                                  ">",
                                                  "{",
                                                  "}",
                                                  "[",
                                                  "]",
                                                  ",",
                                                  "&a",
                                                  "*a",
                                                  "!",
                                                  "%",
                                                  "@",
                                                  "`",
                                                  "---",
                                                  "...",
                                                  "yes",
                                                  "on",
                                                  "~",
                                                  "hostNetwork: true",
                                                  "      hostPID: true",
                                                  "a",
                                                  "zone",
                                                  "1",
                                                  "0x1F",
                                                  "\x7f",
                                                  "\x01",
                                                  "\xc3\xa9",
                                                  "\xf0\x9f\x98\x80"};
  std::string s;
  const int n = static_cast<int>(rng() % 9);
  for (int i = 0; i < n; ++i) s += pieces[rng() % pieces.size()];
  return s;
}

// Issue 71: a string with a carriage return or U+2028 wrote hostNetwork: true into the pods.
// Whatever text reaches a manifest, a YAML reader gets back that text in the same place and
// nothing else: the documents read back equal the objects rendered.
TEST(Render, AnyStringReadsBackAsItselfAndAddsNoField) {
  std::mt19937_64 rng(71);
  int documents = 0;
  for (int round = 0; round < 60; ++round) {
    JobSpec spec = Parse(kSpec);
    spec.cluster.node_selector = {{"pool", HostileText(rng)}, {HostileText(rng) + "k", HostileText(rng)}};
    spec.cluster.tolerations[0].key = HostileText(rng);
    spec.output_dir = "runs/" + HostileText(rng);
    spec.trainer.data.dir = HostileText(rng) + "d";
    spec.cluster.stage.url = "https://example.com/" + HostileText(rng);
    spec.env = {{"NOTE", HostileText(rng)}};
    for (const auto& format : kFormats) {
      const std::vector<json> objects = Render(spec, format);
      const std::string text = ToYaml(objects);
      std::vector<YAML::Node> read;
      try {
        read = YAML::LoadAll(text);
      } catch (const YAML::Exception& e) {
        FAIL() << format << ": the rendered YAML does not parse: " << e.what() << "\n" << text;
      }
      ASSERT_EQ(read.size(), objects.size()) << format;
      for (size_t i = 0; i < objects.size(); ++i, ++documents) {
        ASSERT_EQ(AsRead(read[i]), AsText(objects[i])) << format << " document " << i << ":\n" << text;
      }
    }
  }
  EXPECT_GT(documents, 500);
}

// What Kubernetes' own YAML readers would change is refused before anything is rendered: kubectl,
// kustomize and Helm read U+0085 (NEL) as a space, escaped or not (tests/helm_test.cc shows the
// rest of the red team's line breaks coming through Helm as themselves).
TEST(Render, TextThatKubectlWouldReadAsSomethingElseIsRefusedNamingTheField) {
  JobSpec spec = Parse(kSpec);
  spec.env = {{"A", "fine\r\xe2\x80\xa8"}, {"NOTE", "y\xc2\x85z"}};
  for (const auto& format : kFormats) {
    const Status st = CheckFormat(spec, format);
    ASSERT_FALSE(st.ok()) << format;
    EXPECT_EQ(st.message().rfind("env.NOTE: holds U+0085 (NEL), which kubectl, kustomize and Helm read as a space", 0),
              0u)
        << st.message();
  }
  spec.env.pop_back();
  EXPECT_TRUE(CheckFormat(spec, "job").ok());
}

// The spec's own check: a line break, a control byte or a space in a node selector or a
// toleration is refused with the field named, as Kubernetes would refuse it later.
TEST(Render, ValidateRefusesLabelsKubernetesWouldRefuse) {
  for (const std::string& bad :
       {std::string("node_selector: {zone: \"a\\n\\r      hostNetwork: true\"}"),
        std::string("node_selector: {zone: \"a\\u2028hostPID: true\"}"), std::string("node_selector: {\"zo ne\": a}"),
        std::string("tolerations: [{key: \"k\\rx\", operator: Exists}]"),
        std::string("tolerations: [{key: k, value: \"v\\u0085\"}]")}) {
    auto spec = ParseJobSpec("name: fm\ncommand: [\"true\"]\ncluster:\n  " + bad + "\n", "job.yaml");
    ASSERT_FALSE(spec.ok()) << bad;
    EXPECT_NE(spec.status().message().find("job.yaml:4"), std::string::npos) << spec.status().message();
    EXPECT_NE(
        spec.status().message().find(bad.rfind("node", 0) == 0 ? "cluster.node_selector" : "cluster.tolerations[0]"),
        std::string::npos)
        << spec.status().message();
  }
  EXPECT_TRUE(
      ParseJobSpec("name: fm\ncommand: [\"true\"]\ncluster:\n  node_selector: {node.kubernetes.io/instance-type: "
                   "p4d.24xlarge, pool: \"\"}\n  tolerations: [{key: nvidia.com/gpu, operator: Exists}]\n",
                   "job.yaml")
          .ok());
}

}  // namespace
}  // namespace trainctl::k8s
