// `trainctl render --format helm` as Helm users run the chart, with the real Helm 4 (scripts/dev
// installs it under tests/k8s/.helm): `helm lint --strict`, `helm template` compared object by
// object with `trainctl render` of the same spec and layers (every example, every workload
// format, environments given at install time), the Kubernetes schema of what it makes, its
// values.schema.json refusing what trainctl refuses, `helm package`, and what `lookup` sees on a
// cluster (the token kept across upgrades, a changed spec refused) against a stand-in API server.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <thread>

#include "common/strings.h"
#include "tests/test_util.h"

namespace trainctl::testing {
namespace {

const std::string kSrc = TRAINCTL_SOURCE_DIR;
const std::string kHelm = kSrc + "/tests/k8s/.helm/helm";

void RequireTools() {
  ASSERT_TRUE(fs::exists(kHelm)) << "run scripts/dev deps to install Helm 4 under tests/k8s/.helm";
  ASSERT_TRUE(fs::exists(kSrc + "/tests/k8s/node_modules/kubernetes-models"))
      << "run `npm ci --prefix tests/k8s` (scripts/dev deps does)";
}

// helm with its state in the scratch directory, never the user's; `kubeconfig` for a cluster.
CommandResult Helm(const Scratch& s, std::vector<std::string> args, const std::string& kubeconfig = "") {
  std::vector<std::string> argv = {"env",
                                   "HELM_CACHE_HOME=" + s.path("helm/cache"),
                                   "HELM_CONFIG_HOME=" + s.path("helm/config"),
                                   "HELM_DATA_HOME=" + s.path("helm/data"),
                                   "KUBECONFIG=" + (kubeconfig.empty() ? s.path("helm/none") : kubeconfig),
                                   kHelm};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunProgram(argv, kSrc);
}

// The chart of `spec` for `workload` under DIR/<name>.
std::string Chart(const Scratch& s, const std::string& dir, const std::string& spec, const std::string& workload) {
  auto r = Trainctl({"render", spec, "--format", "helm", "--workload", workload, "-o", s.path(dir)}, kSrc);
  EXPECT_EQ(r.exit.code, 0) << r.output;
  return s.path(dir);
}

// What `helm template` makes of a chart (stdout only: the objects), written to `out`; its path.
std::string Template(const Scratch& s, const std::string& chart, const std::string& release, const std::string& ns,
                     const std::vector<std::string>& values, const std::string& out) {
  std::vector<std::string> argv = {"env",
                                   "HELM_CACHE_HOME=" + s.path("helm/cache"),
                                   "HELM_CONFIG_HOME=" + s.path("helm/config"),
                                   "HELM_DATA_HOME=" + s.path("helm/data"),
                                   "KUBECONFIG=" + s.path("helm/none"),
                                   "sh",
                                   "-c",
                                   "exec \"$0\" \"$@\" 2>\"" + s.path(out + ".err") + "\"",
                                   kHelm,
                                   "template",
                                   release,
                                   chart,
                                   "--namespace",
                                   ns};
  argv.insert(argv.end(), values.begin(), values.end());
  auto r = RunProgram(argv, kSrc);
  EXPECT_EQ(r.exit.code, 0) << r.output << s.Read(out + ".err");
  return s.Write(out, r.output);
}

TEST(Helm, TheChartMakesWhatRenderMakesForEveryExampleFormatAndEnvironment) {
  RequireTools();
  Scratch s;
  // A null deletes what the base spec (the chart's values) sets: its default applies.
  const std::string nulls = s.Write("nulls.yaml",
                                    "cluster: {namespace: null}\nresources: {memory: null}\n"
                                    "trainer: {threads: null}\n");
  // Numbers and booleans in quotes: trainctl reads them as what the field takes, and so must the
  // chart's schema.
  const std::string quoted = s.Write("quoted.yaml",
                                     "name: quoted\nnodes: \"2\"\nprocs_per_node: '2'\n"
                                     "command: [python3, train.py]\ntimeouts: {job: \"1h\"}\n"
                                     "restart: {max_restarts: \"5\"}\n"
                                     "cluster: {tensorboard: \"false\", metrics_port: \"9400\"}\n");
  struct Case {
    std::string spec, workload, ns;
    std::vector<std::string> layers;  // given to render and, at install time, to helm
  };
  const std::string base = "examples/k8s/base.yaml";
  const std::vector<Case> cases = {
      {base, "job", "ml", {}},
      {base, "job", "ml-dev", {"-f", "examples/k8s/dev.yaml"}},
      {base, "job", "ml-prod", {"-f", "examples/k8s/prod.yaml"}},  // elastic: etcd; staging; tolerations
      {base,
       "job",
       "ml",
       {"--set", "nodes=3", "--set", "resources.memory=3Gi", "--set", "resources.cpus=500m", "--set",
        "timeouts.job=1h30m15.5s", "--set", "cluster.pod_monitor=true"}},
      {base,
       "job",
       "ml",
       {"--set", "cluster.tensorboard=false", "--set", "cluster.metrics_port=0", "--set", "resources.gpus=1", "--set",
        "cluster.storage.claim=shared"}},
      {base, "pytorchjob", "ml", {}},
      {base, "job", "default", {"-f", nulls, "--set", "restart.max_restarts=7"}},
      {base, "pytorchjob", "ml-prod", {"-f", "examples/k8s/prod.yaml"}},
      {base, "tfjob", "ml", {"--set", "cluster.token_secret=team-token"}},
      // Part of the side pods' resources: the rest stays the default, field by field.
      {base,
       "job",
       "ml",
       {"--set", "cluster.eval_resources.cpus=0.25", "--set", "cluster.tensorboard_resources.memory=1Gi"}},
      {base, "mpijob", "ml", {}},
      {base, "trainjob", "ml", {}},
      {"examples/hello.yaml", "job", "default", {}},
      {"examples/ddp.yaml", "job", "default", {}},
      {"examples/fashion-mnist.yaml", "job", "default", {}},
      {"examples/parameter-server.yaml", "job", "default", {}},  // roles: a Job per role
      {"examples/parameter-server.yaml", "tfjob", "default", {}},
      {"examples/tensorflow.yaml", "tfjob", "default", {}},
      {quoted, "job", "default", {}},
  };
  std::vector<std::string> made;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const std::string id = std::to_string(i) + "-" + c.workload;
    SCOPED_TRACE(id + ": " + c.spec + " " + Join(c.layers, " "));
    const std::string chart = Chart(s, "chart-" + id, c.spec, c.workload);
    auto lint = Helm(s, {"lint", "--strict", chart, "--namespace", c.ns});
    EXPECT_EQ(lint.exit.code, 0) << lint.output;
    EXPECT_NE(lint.output.find("1 chart(s) linted, 0 chart(s) failed"), std::string::npos) << lint.output;

    std::vector<std::string> render = {c.spec, "--format", c.workload};
    render.insert(render.end(), c.layers.begin(), c.layers.end());
    const std::string plain = RenderManifests(s, id + "-render.yaml", render, kSrc);
    auto name = Trainctl({"validate", c.spec, "--print", "--fields-only"}, kSrc);
    const std::string release = nlohmann::json::parse(name.output).at("name");
    const std::string helm = Template(s, chart, release, c.ns, c.layers, id + "-helm.yaml");
    auto same = RunProgram({"node", kSrc + "/tests/k8s/compare.mjs", plain, helm, "--helm", TRAINCTL_BIN}, kSrc);
    EXPECT_EQ(same.exit.code, 0) << same.output;
    EXPECT_NE(same.output.find("the same "), std::string::npos) << same.output;
    // The chart's own objects: the token Secret unless the spec names one, and the `helm test` pod
    // (but for mpijob, whose store has no stable name).
    const bool named = std::find(c.layers.begin(), c.layers.end(), "cluster.token_secret=team-token") != c.layers.end();
    EXPECT_EQ(same.output.find("(the store token)") != std::string::npos, !named) << same.output;
    EXPECT_EQ(same.output.find("helm.sh/hook test") != std::string::npos, c.workload != "mpijob") << same.output;
    made.push_back(helm);
  }
  // What the chart makes, its Secret and test pod included, is what the API server accepts.
  std::vector<std::string> argv = {"node", kSrc + "/tests/k8s/validate.mjs"};
  argv.insert(argv.end(), made.begin(), made.end());
  auto valid = RunProgram(argv, kSrc);
  EXPECT_EQ(valid.exit.code, 0) << valid.output;
  EXPECT_EQ(CountLines(valid.output, "INVALID"), 0) << valid.output;
  EXPECT_NE(valid.output.find("Secret/fashion-mnist-token: valid"), std::string::npos) << valid.output;
  EXPECT_NE(valid.output.find("Pod/fashion-mnist-test-store: valid"), std::string::npos) << valid.output;
}

TEST(Helm, ChartFilesLabelsTokenAndPackage) {
  RequireTools();
  Scratch s;
  const std::string chart = Chart(s, "fashion-mnist", "examples/k8s/base.yaml", "job");
  // values.yaml is the spec as written (layers merged, no defaults filled in), and Helm reads it so.
  YAML::Node values = YAML::LoadFile(chart + "/values.yaml");
  EXPECT_EQ(values["name"].as<std::string>(), "fashion-mnist");
  EXPECT_EQ(values["resources"]["memory"].as<std::string>(), "2Gi");
  EXPECT_FALSE(values["timeouts"]) << "defaults stay out of the values";
  EXPECT_NE(ReadFile(chart + "/values.yaml")->find("lr: 0.05\n"), std::string::npos) << "no float noise";
  YAML::Node meta = YAML::LoadFile(chart + "/Chart.yaml");
  EXPECT_EQ(meta["apiVersion"].as<std::string>(), "v2");
  EXPECT_EQ(meta["name"].as<std::string>(), "fashion-mnist");
  auto version = Trainctl({"--version"}, kSrc);
  EXPECT_NE(version.output.find(meta["appVersion"].as<std::string>()), std::string::npos) << version.output;
  EXPECT_TRUE(meta["kubeVersion"]);
  EXPECT_EQ(*ReadFile(chart + "/values.schema.json"), Trainctl({"schema"}, kSrc).output + "\n");

  const std::string a = *ReadFile(Template(s, chart, "fashion-mnist", "ml", {}, "a.yaml"));
  const std::string b = *ReadFile(Template(s, chart, "fashion-mnist", "ml", {}, "b.yaml"));
  std::map<std::string, YAML::Node> objects;
  for (const auto& doc : YAML::LoadAll(a)) {
    if (doc.IsMap()) objects[doc["kind"].as<std::string>() + "/" + doc["metadata"]["name"].as<std::string>()] = doc;
  }
  // Helm's labels on every object; the pods' templates keep only the selector labels, so a new
  // chart version never changes a Job's (immutable) pod template.
  for (const auto& [key, o] : objects) {
    auto labels = o["metadata"]["labels"];
    EXPECT_EQ(labels["app.kubernetes.io/managed-by"].as<std::string>(), "Helm") << key;
    EXPECT_EQ(labels["app.kubernetes.io/instance"].as<std::string>(), "fashion-mnist") << key;
    EXPECT_NE(labels["helm.sh/chart"].as<std::string>().find("fashion-mnist-"), std::string::npos) << key;
    EXPECT_EQ(o["metadata"]["namespace"].as<std::string>(), "ml") << key;
  }
  EXPECT_FALSE(objects["Job/fashion-mnist"]["spec"]["template"]["metadata"]["labels"]["helm.sh/chart"]);
  EXPECT_EQ(objects["PersistentVolumeClaim/fashion-mnist-data"]["metadata"]["annotations"]["helm.sh/resource-policy"]
                .as<std::string>(),
            "keep");
  // The token: 64 hex digits made at install, never in the values, a new one for each install.
  auto token = [](const std::string& yaml) {
    std::smatch m;
    EXPECT_TRUE(std::regex_search(yaml, m, std::regex("\n  token: ([A-Za-z0-9+/=]+)\n"))) << yaml;
    return m.size() > 1 ? m[1].str() : "";
  };
  const std::string decoded = RunProgram({"sh", "-c", "echo " + token(a) + " | base64 -d"}, kSrc).output;
  EXPECT_TRUE(std::regex_match(decoded, std::regex("[0-9a-f]{64}"))) << decoded;
  EXPECT_NE(token(a), token(b));
  EXPECT_EQ(s.Read("fashion-mnist/values.yaml").find(decoded), std::string::npos);

  auto notes = Helm(s, {"install", "fashion-mnist", chart, "--namespace", "ml", "--dry-run=client"});
  EXPECT_EQ(notes.exit.code, 0) << notes.output;
  EXPECT_NE(notes.output.find("kubectl get pods -n ml -l trainctl.dev/job=fashion-mnist"), std::string::npos)
      << notes.output;
  EXPECT_NE(notes.output.find("helm test fashion-mnist -n ml"), std::string::npos) << notes.output;

  auto packaged = Helm(s, {"package", chart, "--destination", s.path("packages")});
  EXPECT_EQ(packaged.exit.code, 0) << packaged.output;
  auto version_text = meta["version"].as<std::string>();
  const std::string tgz = s.path("packages/fashion-mnist-" + version_text + ".tgz");
  ASSERT_TRUE(fs::exists(tgz)) << packaged.output;
  // The packaged chart installs the same objects.
  const std::string from_tgz = Template(s, tgz, "fashion-mnist", "ml", {}, "tgz.yaml");
  auto same = RunProgram({"node", kSrc + "/tests/k8s/compare.mjs", s.path("a.yaml"), from_tgz}, kSrc);
  EXPECT_NE(same.output.find("Secret/fashion-mnist-token: /data/token"), std::string::npos) << same.output;
  EXPECT_EQ(CountLines(same.output, ": /"), 1) << "only the random token differs:\n" << same.output;
}

TEST(Helm, TheValuesSchemaRefusesWhatTrainctlRefusesNamingTheField) {
  RequireTools();
  Scratch s;
  const std::string chart = Chart(s, "fashion-mnist", "examples/k8s/base.yaml", "job");
  struct Case {
    std::string set, helm_says, trainctl_says;
  };
  const std::vector<Case> cases = {
      {"trainer.epocs=3", "at '/trainer': additional properties 'epocs' not allowed", "trainer.epocs"},
      {"nodes=0", "at '/nodes'", "nodes"},
      {"cluster.tensorboard=sometimes", "at '/cluster/tensorboard'", "cluster.tensorboard"},
      {"resources.gpus=-1", "at '/resources/gpus'", "resources.gpus"},
  };
  for (const auto& c : cases) {
    auto helm = Helm(s, {"template", "fashion-mnist", chart, "-n", "ml", "--set", c.set});
    EXPECT_NE(helm.exit.code, 0) << c.set;
    EXPECT_NE(helm.output.find(c.helm_says), std::string::npos) << c.set << ": " << helm.output;
    auto trainctl = Trainctl({"validate", "examples/k8s/base.yaml", "--set", c.set}, kSrc);
    EXPECT_EQ(trainctl.exit.code, 2) << c.set;
    EXPECT_NE(trainctl.output.find(c.trainctl_says), std::string::npos) << c.set << ": " << trainctl.output;
  }
  // The namespace is the release's: a spec that names another is refused, saying which.
  auto ns = Helm(s, {"template", "fashion-mnist", chart, "-n", "default"});
  EXPECT_NE(ns.exit.code, 0);
  EXPECT_NE(ns.output.find("cluster.namespace: the spec says ml, and the release is installed in default; "
                           "install it with --namespace ml"),
            std::string::npos)
      << ns.output;
}

TEST(Helm, UserStringsWithTemplateBracesComeOutLiterally) {
  RequireTools();
  Scratch s;
  const std::string spec = s.Write("braces.yaml",
                                   "name: braces\n"
                                   "command: [sh, -c, 'echo {{ .Release.Name }} {{ fail 1 }}']\n"
                                   "env: {GREETING: '{{ .Values.name }}'}\n");
  const std::string chart = Chart(s, "braces", spec, "job");
  auto lint = Helm(s, {"lint", "--strict", chart});
  EXPECT_EQ(lint.exit.code, 0) << lint.output;
  const std::string helm = Template(s, chart, "braces", "default", {}, "helm.yaml");
  const std::string plain = RenderManifests(s, "render.yaml", {spec}, kSrc);
  auto same = RunProgram({"node", kSrc + "/tests/k8s/compare.mjs", plain, helm, "--helm", TRAINCTL_BIN}, kSrc);
  EXPECT_EQ(same.exit.code, 0) << same.output;
  for (const auto& doc : YAML::LoadAll(*ReadFile(helm))) {
    if (!doc.IsMap() || doc["kind"].as<std::string>() != "ConfigMap") continue;
    auto job = nlohmann::json::parse(doc["data"]["job.json"].as<std::string>());
    EXPECT_EQ(job["command"][2], "echo {{ .Release.Name }} {{ fail 1 }}") << job.dump();
    EXPECT_EQ(job["env"]["GREETING"], "{{ .Values.name }}") << job.dump();
  }
}

// Every key of a parsed document, at any depth.
void Keys(const YAML::Node& n, std::set<std::string>* out) {
  if (n.IsMap()) {
    for (const auto& kv : n) {
      out->insert(kv.first.Scalar());
      Keys(kv.second, out);
    }
  } else if (n.IsSequence()) {
    for (const auto& v : n) Keys(v, out);
  }
}

// Issue 71: the red team's line breaks (a carriage return, U+2028, U+2029) in a spec's strings go
// through the chart's values.yaml (trainctl's emitter, read by Helm's Go YAML parser) and its
// templates (toYaml) and come out as the same strings, with no field of their own. (NEL, which
// Helm reads as a space however it is written, render refuses: src/render/k8s/render_test.cc.)
TEST(Helm, HostileLineBreaksInValuesComeOutAsThemselves) {
  RequireTools();
  Scratch s;
  const std::string command = "echo a\n\r      hostNetwork: true\r      hostPID: true";
  const std::string note = "x\xe2\x80\xa8hostPID: true\xe2\x80\xa9y\rz\r\n  - k: v";
  const std::string spec = s.Write("hostile.yaml",
                                   "name: hostile\n"
                                   "command: [sh, -c, \"echo a\\n\\r      hostNetwork: true\\r      hostPID: true\"]\n"
                                   "env: {NOTE: \"x\\u2028hostPID: true\\u2029y\\rz\\r\\n  - k: v\"}\n");
  const std::string chart = Chart(s, "hostile", spec, "job");
  auto lint = Helm(s, {"lint", "--strict", chart});
  EXPECT_EQ(lint.exit.code, 0) << lint.output;
  const std::string helm = Template(s, chart, "hostile", "default", {}, "helm.yaml");
  const std::string plain = RenderManifests(s, "render.yaml", {spec}, kSrc);
  auto same = RunProgram({"node", kSrc + "/tests/k8s/compare.mjs", plain, helm, "--helm", TRAINCTL_BIN}, kSrc);
  EXPECT_EQ(same.exit.code, 0) << same.output;
  int configmaps = 0;
  for (const std::string& file : {helm, plain}) {
    for (const auto& doc : YAML::LoadAll(*ReadFile(file))) {
      std::set<std::string> keys;
      Keys(doc, &keys);
      EXPECT_EQ(keys.count("hostNetwork") + keys.count("hostPID"), 0u) << file;
      if (!doc.IsMap() || doc["kind"].as<std::string>() != "ConfigMap") continue;
      ++configmaps;
      auto job = nlohmann::json::parse(doc["data"]["job.json"].as<std::string>());
      EXPECT_EQ(job["command"][2], command) << job.dump();
      EXPECT_EQ(job["env"]["NOTE"], note) << job.dump();
    }
  }
  EXPECT_EQ(configmaps, 2);
}

// A stand-in API server (tests/k8s/apiserver_standin.py): discovery plus GETs of the objects
// under a directory, for `lookup` in `helm template --dry-run=server`.
class Cluster {
 public:
  explicit Cluster(const Scratch& s) : s_(s) {
    SpawnOptions o;
    o.argv = {"python3", kSrc + "/tests/k8s/apiserver_standin.py", s.path("cluster"), s.path("cluster.port")};
    o.env = CurrentEnvironment();
    o.cwd = kSrc;
    fs::create_directories(s.path("cluster"));
    auto pid = Spawn(o);
    EXPECT_TRUE(pid.ok()) << pid.status().ToString();
    pid_ = pid.ok() ? *pid : -1;
    for (int i = 0; i < 100 && !fs::exists(s.path("cluster.port")); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    s.Write("kubeconfig",
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
            "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:" +
                s.Read("cluster.port") +
                "'}}]\n"
                "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {}}]\n");
  }
  ~Cluster() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  void Put(const std::string& ns, const std::string& resource, const nlohmann::json& o) {
    fs::create_directories(s_.path("cluster/" + ns + "/" + resource));
    s_.Write("cluster/" + ns + "/" + resource + "/" + o["metadata"]["name"].get<std::string>() + ".json", o.dump());
  }
  CommandResult Template(const std::string& chart, std::vector<std::string> values) {
    std::vector<std::string> args = {"template", "fashion-mnist",    chart,          "-n",
                                     "ml",       "--dry-run=server", "--is-upgrade", "--disable-openapi-validation"};
    args.insert(args.end(), values.begin(), values.end());
    return Helm(s_, args, s_.path("kubeconfig"));
  }

 private:
  const Scratch& s_;
  pid_t pid_ = -1;
};

TEST(Helm, OnAClusterTheTokenIsKeptAndAChangedSpecIsRefused) {
  RequireTools();
  Scratch s;
  const std::string chart = Chart(s, "fashion-mnist", "examples/k8s/base.yaml", "job");
  Cluster cluster(s);
  // Revision 1, as installed: its spec ConfigMap and its token Secret.
  std::string first;
  for (const auto& doc : YAML::LoadAll(*ReadFile(Template(s, chart, "fashion-mnist", "ml", {}, "r1.yaml")))) {
    if (doc.IsMap() && doc["kind"].as<std::string>() == "ConfigMap") first = doc["data"]["job.json"].as<std::string>();
  }
  ASSERT_FALSE(first.empty());
  cluster.Put("ml", "configmaps",
              {{"apiVersion", "v1"},
               {"kind", "ConfigMap"},
               {"metadata", {{"name", "fashion-mnist-spec"}, {"namespace", "ml"}}},
               {"data", {{"job.json", first}}}});
  const std::string token = "YWJjZGVm";  // base64 "abcdef"
  nlohmann::json secret = {{"apiVersion", "v1"},
                           {"kind", "Secret"},
                           {"metadata",
                            {{"name", "fashion-mnist-token"},
                             {"namespace", "ml"},
                             {"annotations", {{"meta.helm.sh/release-name", "fashion-mnist"}}}}},
                           {"data", {{"token", token}}}};
  cluster.Put("ml", "secrets", secret);

  // Revision 2 with the same spec: the token is the one the cluster has.
  auto same = cluster.Template(chart, {});
  ASSERT_EQ(same.exit.code, 0) << same.output;
  EXPECT_NE(same.output.find("  token: " + token + "\n"), std::string::npos) << same.output;

  // Revision 2 with a changed spec: refused, saying what to do.
  auto changed = cluster.Template(chart, {"--set", "trainer.epochs=9"});
  EXPECT_NE(changed.exit.code, 0);
  EXPECT_NE(changed.output.find("the job fashion-mnist exists in namespace ml with another spec, and a Kubernetes "
                                "Job's pods cannot change: helm uninstall fashion-mnist -n ml"),
            std::string::npos)
      << changed.output;

  // A token Secret that is not the release's (trainctl submit made it): used as it is, not made.
  secret["metadata"].erase("annotations");
  cluster.Put("ml", "secrets", secret);
  auto adopted = cluster.Template(chart, {});
  ASSERT_EQ(adopted.exit.code, 0) << adopted.output;
  EXPECT_EQ(adopted.output.find("kind: Secret"), std::string::npos) << adopted.output;
  EXPECT_NE(adopted.output.find("name: fashion-mnist-token"), std::string::npos) << "the pods still read it";
}

TEST(Helm, BadChartRequestsAreNamed) {
  Scratch s;
  auto r = Trainctl({"render", "examples/k8s/base.yaml", "--format", "helm"}, kSrc);
  EXPECT_EQ(r.exit.code, 2);
  EXPECT_NE(r.output.find("--format helm writes a chart's directory; give it with -o DIR"), std::string::npos)
      << r.output;
  r = Trainctl({"render", "examples/k8s/base.yaml", "--workload", "tfjob"}, kSrc);
  EXPECT_EQ(r.exit.code, 2);
  EXPECT_NE(r.output.find("--workload goes with --format helm"), std::string::npos) << r.output;
  r = Trainctl(
      {"render", "examples/parameter-server.yaml", "--format", "helm", "--workload", "pytorchjob", "-o", s.path("c")},
      kSrc);
  EXPECT_EQ(r.exit.code, 2);
  EXPECT_NE(r.output.find("roles: --format pytorchjob runs one role"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(s.path("c")));
}

}  // namespace
}  // namespace trainctl::testing
