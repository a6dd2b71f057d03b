#include "bench/argo.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>

#include "common/fs.h"
#include "render/k8s/render.h"
#include "render/slurm/sbatch.h"

namespace trainctl::bench {
namespace {

using nlohmann::json;

constexpr const char* kArtifacts = "/tmp/trainctl";
constexpr int kUid = 1000;  // the image's user (deploy/Dockerfile)

// An Argo template/task name: lowercase letters, digits and '-', at most 63, unique by index.
std::string TaskName(size_t index, const std::string& id) {
  std::string s;
  for (char c : id) s += std::isalnum(static_cast<unsigned char>(c)) ? static_cast<char>(std::tolower(c)) : '-';
  s = "e" + std::to_string(index) + "-" + s;
  if (s.size() > 63) s.resize(63);
  while (!s.empty() && s.back() == '-') s.pop_back();
  return s;
}

json Container(const std::string& image, json command, const std::string& mount) {
  return {{"name", "main"},
          {"image", image},
          {"imagePullPolicy", "IfNotPresent"},
          {"command", std::move(command)},
          {"workingDir", mount},
          {"env", {{{"name", "HOME"}, {"value", "/tmp"}}}},
          {"volumeMounts", {{{"name", "data"}, {"mountPath", mount}}}},
          {"securityContext",
           {{"allowPrivilegeEscalation", false}, {"runAsNonRoot", true}, {"capabilities", {{"drop", {"ALL"}}}}}}};
}

json Raw(const std::string& name, const std::string& path, const std::string& data) {
  return {{"artifacts", {{{"name", name}, {"path", path}, {"raw", {{"data", data}}}}}}};
}

}  // namespace

std::string ArgoResultsDir(const JobSpec& base, const Matrix& m, const std::string& stamp) {
  return base.cluster.storage.mount + "/bench/" + m.name + "/" + stamp;
}

Result<std::string> SelfContainedMatrix(const Matrix& m, const std::string& base_file) {
  SpecSources src;
  src.files = {base_file};
  src.files.insert(src.files.end(), m.layers.begin(), m.layers.end());
  src.sets = m.sets;
  ASSIGN_OR_RETURN(JobSpec base, LoadJobSpec(src));
  YAML::Emitter e;
  e << YAML::BeginMap << YAML::Key << "name" << YAML::Value << m.name;
  e << YAML::Key << "spec" << YAML::Value << YAML::Load(JobSpecToJson(base));
  e << YAML::Key << "axes" << YAML::Value << YAML::BeginMap;
  for (const auto& [k, values] : m.axes) {
    e << YAML::Key << k << YAML::Value << YAML::Flow << YAML::BeginSeq;
    for (const auto& v : values) e << YAML::Load(v);
    e << YAML::EndSeq;
  }
  e << YAML::EndMap;
  for (const auto& [which, points] :
       {std::pair<const char*, const std::vector<Point>*>{"include", &m.include}, {"exclude", &m.exclude}}) {
    if (points->empty()) continue;
    e << YAML::Key << which << YAML::Value << YAML::BeginSeq;
    for (const auto& p : *points) {
      e << YAML::Flow << YAML::BeginMap;
      for (const auto& [k, v] : p) e << YAML::Key << k << YAML::Value << YAML::Load(v);
      e << YAML::EndMap;
    }
    e << YAML::EndSeq;
  }
  e << YAML::Key << "repeats" << YAML::Value << m.repeats << YAML::Key << "parallel" << YAML::Value << m.parallel;
  if (m.target_accuracy > 0) e << YAML::Key << "target_accuracy" << YAML::Value << m.target_accuracy;
  if (!m.peers.empty()) {
    e << YAML::Key << "peers" << YAML::Value << YAML::BeginSeq;
    for (const auto& p : m.peers) {
      e << YAML::BeginMap << YAML::Key << "name" << YAML::Value << p.name << YAML::Key << "command" << YAML::Value
        << YAML::Flow << p.command << YAML::EndMap;
    }
    e << YAML::EndSeq;
  }
  if (!m.upload.url.empty()) {
    e << YAML::Key << "upload" << YAML::Value << YAML::BeginMap << YAML::Key << "url" << YAML::Value << m.upload.url;
    if (!m.upload.endpoint.empty()) e << YAML::Key << "endpoint" << YAML::Value << m.upload.endpoint;
    e << YAML::Key << "region" << YAML::Value << m.upload.region << YAML::EndMap;
  }
  e << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

Result<json> ArgoWorkflow(const Matrix& m, const std::string& base_file, const std::string& stamp) {
  SpecSources src;
  src.files = {base_file};
  src.files.insert(src.files.end(), m.layers.begin(), m.layers.end());
  src.sets = m.sets;
  ASSIGN_OR_RETURN(JobSpec base, LoadJobSpec(src));
  const ClusterSpec& c = base.cluster;
  const std::string dir = ArgoResultsDir(base, m, stamp);
  const std::string claim = c.storage.claim.empty() ? base.name + "-data" : c.storage.claim;
  json tasks = json::array(), templates = json::array();
  const auto exps = Experiments(m);
  for (size_t i = 0; i < exps.size(); ++i) {
    const Experiment& e = exps[i];
    const std::string name = TaskName(i, e.id), out = dir + "/experiments/" + e.id + "/output";
    tasks.push_back({{"name", name}, {"template", name}});
    json t = {{"name", name}};
    if (e.system == "trainctl") {
      ASSIGN_OR_RETURN(JobSpec spec, ExperimentSpec(m, base_file, e.point, out, e.repeat));
      const std::string file = std::string(kArtifacts) + "/job.json";
      t["inputs"] = Raw("spec", file, JobSpecToJson(k8s::PodSpec(spec), 2) + "\n");
      t["container"] = Container(c.image, {"trainctl", "run", file}, c.storage.mount);
    } else {
      // The peer's output and exit code are kept for the report; its failure fails only itself.
      std::string cmd;
      for (const auto& a : e.command) cmd += " " + slurm::ShellQuote(a);
      const std::string script = "mkdir -p " + slurm::ShellQuote(out) + " && (" + cmd.substr(1) + ") > " +
                                 slurm::ShellQuote(out + "/stdout.log") + " 2>&1; code=$?; echo $code > " +
                                 slurm::ShellQuote(out + "/exit_code") + "; exit $code";
      t["container"] = Container(c.image, {"sh", "-c", script}, c.storage.mount);
      t["container"]["env"].push_back({{"name", "TRAINCTL_BENCH_OUTPUT"}, {"value", out}});
    }
    templates.push_back(t);
  }
  ASSIGN_OR_RETURN(std::string matrix, SelfContainedMatrix(m, base_file));
  const std::string matrix_file = std::string(kArtifacts) + "/matrix.yaml";
  json report = {
      {"name", "report"},
      {"inputs", Raw("matrix", matrix_file, matrix)},
      {"container", Container(c.image, {"trainctl", "bench", matrix_file, "--collect", dir}, c.storage.mount)}};
  if (!m.upload.url.empty()) {
    // The upload's credentials, from a Secret the user creates: never in the workflow.
    for (const auto& [var, key] : {std::pair<const char*, const char*>{"AWS_ACCESS_KEY_ID", "access_key_id"},
                                   {"AWS_SECRET_ACCESS_KEY", "secret_access_key"}}) {
      report["container"]["env"].push_back(
          {{"name", var}, {"valueFrom", {{"secretKeyRef", {{"name", m.name + "-upload"}, {"key", key}}}}}});
    }
  }
  const json dag = {{"name", "matrix"}, {"dag", {{"failFast", false}, {"tasks", tasks}}}};
  templates.insert(templates.begin(), dag);
  templates.push_back(report);
  json labels = {
      {"app.kubernetes.io/name", "trainctl"}, {"app.kubernetes.io/component", "bench"}, {"trainctl.dev/bench", m.name}};
  json spec = {{"entrypoint", "matrix"},
               {"onExit", "report"},
               {"parallelism", m.parallel},
               {"securityContext",
                {{"runAsNonRoot", true},
                 {"runAsUser", kUid},
                 {"runAsGroup", kUid},
                 {"fsGroup", kUid},
                 {"seccompProfile", {{"type", "RuntimeDefault"}}}}},
               {"volumes", {{{"name", "data"}, {"persistentVolumeClaim", {{"claimName", claim}}}}}},
               {"templates", templates}};
  if (!c.image_pull_secret.empty()) spec["imagePullSecrets"] = {{{"name", c.image_pull_secret}}};
  std::string wf_name = m.name + "-" + stamp;
  std::transform(wf_name.begin(), wf_name.end(), wf_name.begin(),
                 [](unsigned char ch) { return std::isalnum(ch) ? static_cast<char>(std::tolower(ch)) : '-'; });
  return json{{"apiVersion", "argoproj.io/v1alpha1"},
              {"kind", "Workflow"},
              {"metadata", {{"name", wf_name.substr(0, 63)}, {"namespace", c.namespace_}, {"labels", labels}}},
              {"spec", spec}};
}

}  // namespace trainctl::bench
