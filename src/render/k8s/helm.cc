// `trainctl render --format helm`: the chart's templates are files under chart/ compiled in; what
// they need of trainctl itself (its defaults, the workload format, shared scripts) is written
// into templates/_trainctl.tpl from the same code that renders the manifests.
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string_view>
#include <utility>

#include "render/k8s/render.h"

namespace trainctl::k8s {

extern const std::pair<std::string_view, std::string_view> kChartFiles[];  // chart_files.cc
extern const int kChartFileCount;

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

// `value` with its strings typed as `schema` says where they spell its integer, number or boolean:
// a spec may quote them (`nodes: "2"`; trainctl reads the text), Helm's schema check would not.
json Typed(json value, const json& schema) {
  for (const char* choice : {"anyOf", "oneOf"}) {  // the first alternative that types it
    if (!schema.contains(choice)) continue;
    for (const json& alternative : schema[choice]) {
      json typed = Typed(value, alternative);
      if (typed != value) return typed;
    }
    return value;
  }
  if (value.is_object()) {
    const json* properties = schema.contains("properties") ? &schema["properties"] : nullptr;
    const json* others = schema.contains("additionalProperties") && schema["additionalProperties"].is_object()
                             ? &schema["additionalProperties"]
                             : nullptr;
    for (auto& [key, child] : value.items()) {
      if (properties && properties->contains(key))
        child = Typed(child, (*properties)[key]);
      else if (others)
        child = Typed(child, *others);
    }
  } else if (value.is_array() && schema.contains("items") && schema["items"].is_object()) {
    for (auto& item : value) item = Typed(item, schema["items"]);
  } else if (value.is_string() && schema.contains("type") && schema["type"].is_string()) {
    const std::string& text = value.get_ref<const std::string&>();
    const std::string& type = schema["type"].get_ref<const std::string&>();
    const char* begin = text.c_str();
    const char* end = begin + text.size();
    if (type == "boolean" && (text == "true" || text == "false")) return text == "true";
    if (type == "integer") {
      long long n = 0;
      auto [stop, error] = std::from_chars(begin + (text.size() > 1 && text[0] == '+'), end, n);
      if (!text.empty() && error == std::errc() && stop == end) return n;
    }
    if (type == "number") {
      char* stop = nullptr;
      const double d = std::strtod(begin, &stop);
      if (!text.empty() && stop == end && std::isfinite(d)) return d;
    }
  }
  return value;
}

}  // namespace

std::map<std::string, std::string> HelmChart(const JobSpec& spec, const std::string& values, const std::string& format,
                                             const std::string& version) {
  std::map<std::string, std::string> files;
  for (int i = 0; i < kChartFileCount; ++i) {
    const auto& [path, text] = kChartFiles[i];
    if (path.rfind("workloads/", 0) == 0) {
      if (path == "workloads/" + format + ".yaml") files["templates/workload.yaml"] = text;
    } else {
      files[std::string(path)] = text;
    }
  }
  files["Chart.yaml"] =
      "# Written by trainctl render --format helm; the chart of one job. Its values are the job spec:\n"
      "#   helm install " +
      spec.name +
      " DIR -n NAMESPACE [-f dev.yaml] [--set trainer.epochs=3]\n"
      "apiVersion: v2\n"
      "name: " +
      spec.name +
      "\n"
      "description: " +
      GoString("trainctl job " + spec.name + ": " + DescribeTasks(spec, false) + " (" + format + ")") +
      "\n"
      "type: application\n"
      "version: " +
      version +
      "\n"
      "appVersion: " +
      GoString(version) +
      "\n"
      // Indexed Jobs with podFailurePolicy and the controller-uid label.
      "kubeVersion: \">=1.27.0-0\"\n"
      "keywords: [trainctl, training, " +
      format + "]\n";
  files["values.yaml"] =
      "# The job spec (trainctl's own field names, docs/job-spec.md), as trainctl render was given it\n"
      "# (numbers and booleans written in quotes written as such).\n"
      "# Layer environments over it as over any spec: helm install NAME . -f dev.yaml --set nodes=4\n"
      "# values.schema.json refuses what trainctl would (trainctl schema); `trainctl validate` checks\n"
      "# the rest (files, programs).\n" +
      ToYaml({Typed(json::parse(values), json::parse(JobSpecSchema()))});
  files["values.schema.json"] = JobSpecSchema() + "\n";
  files["templates/_trainctl.tpl"] = "{{/* Written by trainctl render --format helm " + version +
                                     ": what the templates take from trainctl. */}}\n"
                                     "{{- define \"trainctl.format\" -}}" +
                                     format +
                                     "{{- end -}}\n"
                                     "{{- define \"trainctl.defaults\" -}}" +
                                     Defaults() +
                                     "{{- end -}}\n"
                                     "{{- define \"trainctl.etcdImage\" -}}" +
                                     kEtcdImage +
                                     "{{- end -}}\n"
                                     "{{- define \"trainctl.stageScript\" -}}{{ " +
                                     GoString(kStageScript) + " }}{{- end -}}\n";
  return files;
}

}  // namespace trainctl::k8s
