#include <nlohmann/json.hpp>
#include <regex>

#include "common/fs.h"
#include "jobspec/job_spec.h"
#include "jobspec/tree.h"

namespace trainctl {
namespace jobspec {
Result<JobSpec> Decode(const Node& root);
}  // namespace jobspec

namespace {

Result<jobspec::Node> Layered(const SpecSources& sources) {
  if (sources.files.empty()) return InvalidArgument("no job spec given; pass a YAML file");
  jobspec::Node root;
  bool first = true;
  for (const auto& file : sources.files) {
    ASSIGN_OR_RETURN(std::string text, ReadFile(file, jobspec::kMaxFileBytes));
    ASSIGN_OR_RETURN(jobspec::Node layer, jobspec::ParseYaml(text, file));
    if (layer.kind != jobspec::Node::Kind::kMap && layer.kind != jobspec::Node::Kind::kNull) {
      return InvalidArgument(layer.origin.ToString() +
                             ": expected a mapping of job fields (name: ..., command: [...]), got " + layer.KindName());
    }
    if (first) {
      root = std::move(layer);
      first = false;
    } else if (layer.kind == jobspec::Node::Kind::kMap) {
      jobspec::Merge(&root, layer);
    }
  }
  for (const auto& set : sources.sets) RETURN_IF_ERROR(jobspec::ApplySet(&root, set));
  return root;
}

nlohmann::json Typed(const jobspec::Node& n) {
  switch (n.kind) {
    case jobspec::Node::Kind::kNull:
      return nullptr;
    case jobspec::Node::Kind::kSeq: {
      nlohmann::json a = nlohmann::json::array();
      for (const auto& v : n.seq) a.push_back(Typed(v));
      return a;
    }
    case jobspec::Node::Kind::kMap: {
      nlohmann::json o = nlohmann::json::object();
      for (const auto& [k, v] : n.map) o[k] = Typed(v);
      return o;
    }
    case jobspec::Node::Kind::kScalar:
      break;
  }
  const std::string& s = n.scalar;
  if (n.quoted) return s;
  if (s == "true" || s == "false") return s == "true";
  static const std::regex integer("-?(0|[1-9][0-9]{0,17})"), real("-?(0|[1-9][0-9]*)?(\\.[0-9]+)?([eE][-+]?[0-9]+)?");
  if (std::regex_match(s, integer)) return std::stoll(s);
  if (!s.empty() && s != "-" && std::regex_match(s, real) && s.find_first_of("0123456789") != std::string::npos) {
    return std::stod(s);
  }
  return s;
}

}  // namespace

Result<JobSpec> LoadJobSpec(const SpecSources& sources) {
  ASSIGN_OR_RETURN(jobspec::Node root, Layered(sources));
  return jobspec::Decode(root);
}

Result<std::string> LayeredSpecJson(const SpecSources& sources) {
  ASSIGN_OR_RETURN(jobspec::Node root, Layered(sources));
  return Typed(root).dump();
}

Result<JobSpec> ParseJobSpec(const std::string& yaml, const std::string& source) {
  ASSIGN_OR_RETURN(jobspec::Node root, jobspec::ParseYaml(yaml, source));
  return jobspec::Decode(root);
}

}  // namespace trainctl
