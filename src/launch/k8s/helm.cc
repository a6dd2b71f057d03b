// `trainctl render --format helm`: the chart's templates are files under chart/ compiled in; what
// they need of trainctl itself (its defaults, the workload format, shared scripts) is written
// into templates/_trainctl.tpl from the same code that renders the manifests.
#include <nlohmann/json.hpp>

#include "launch/k8s/render.h"

namespace trainctl::k8s {

extern const std::map<std::string, std::string> kChartFiles;

namespace {

using nlohmann::json;

// A Go template string literal (JSON's escapes are Go's).
std::string GoString(const std::string& s) { return json(s).dump(); }

// trainctl's defaults for the fields the templates read, from a minimal spec resolved here.
std::string Defaults() {
  auto spec = ParseJobSpec("name: x\ncommand: [\"true\"]\n", "defaults");
  const json resolved = json::parse(JobSpecToJson(*spec));
  return json{{"cluster", resolved.at("cluster")},
              {"procs_per_node", resolved.at("procs_per_node")},
              {"restart", {{"max_restarts", resolved.at("restart").at("max_restarts")}}}}
      .dump();
}

}  // namespace

std::map<std::string, std::string> HelmChart(const JobSpec& spec, const std::string& values,
                                             const std::string& format, const std::string& version) {
  std::map<std::string, std::string> files;
  for (const auto& [path, text] : kChartFiles) {
    if (path.rfind("workloads/", 0) == 0) {
      if (path == "workloads/" + format + ".yaml") files["templates/workload.yaml"] = text;
    } else {
      files[path] = text;
    }
  }
  files["Chart.yaml"] =
      "# Written by trainctl render --format helm; the chart of one job. Its values are the job spec:\n"
      "#   helm install " + spec.name + " DIR -n NAMESPACE [-f dev.yaml] [--set trainer.epochs=3]\n"
      "apiVersion: v2\n"
      "name: " + spec.name + "\n"
      "description: " + GoString("trainctl job " + spec.name + ": " + DescribeTasks(spec, false) +
                                 " (" + format + ")") + "\n"
      "type: application\n"
      "version: " + version + "\n"
      "appVersion: " + GoString(version) + "\n"
      // Indexed Jobs with podFailurePolicy and the controller-uid label.
      "kubeVersion: \">=1.27.0-0\"\n"
      "keywords: [trainctl, training, " + format + "]\n";
  files["values.yaml"] =
      "# The job spec (trainctl's own field names, docs/job-spec.md), as trainctl render was given it.\n"
      "# Layer environments over it as over any spec: helm install NAME . -f dev.yaml --set nodes=4\n"
      "# values.schema.json refuses what trainctl would (trainctl schema); `trainctl validate` checks\n"
      "# the rest (files, programs).\n" +
      ToYaml({json::parse(values)});
  files["values.schema.json"] = JobSpecSchema() + "\n";
  files["templates/_trainctl.tpl"] =
      "{{/* Written by trainctl render --format helm " + version + ": what the templates take from trainctl. */}}\n"
      "{{- define \"trainctl.format\" -}}" + format + "{{- end -}}\n"
      "{{- define \"trainctl.defaults\" -}}" + Defaults() + "{{- end -}}\n"
      "{{- define \"trainctl.etcdImage\" -}}" + kEtcdImage + "{{- end -}}\n"
      "{{- define \"trainctl.stageScript\" -}}{{ " + GoString(kStageScript) + " }}{{- end -}}\n";
  return files;
}

}  // namespace trainctl::k8s
