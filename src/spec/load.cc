#include "common/fs.h"
#include "spec/job_spec.h"
#include "spec/tree.h"

namespace trainctl {
namespace spec {
Result<JobSpec> Decode(const Node& root);
}  // namespace spec

Result<JobSpec> LoadJobSpec(const SpecSources& sources) {
  if (sources.files.empty()) return InvalidArgument("no job spec given; pass a YAML file");
  spec::Node root;
  bool first = true;
  for (const auto& file : sources.files) {
    ASSIGN_OR_RETURN(std::string text, ReadFile(file, spec::kMaxFileBytes));
    ASSIGN_OR_RETURN(spec::Node layer, spec::ParseYaml(text, file));
    if (layer.kind != spec::Node::Kind::kMap && layer.kind != spec::Node::Kind::kNull) {
      return InvalidArgument(layer.origin.ToString() +
                             ": expected a mapping of job fields (name: ..., command: [...]), got " +
                             layer.KindName());
    }
    if (first) {
      root = std::move(layer);
      first = false;
    } else if (layer.kind == spec::Node::Kind::kMap) {
      spec::Merge(&root, layer);
    }
  }
  for (const auto& set : sources.sets) RETURN_IF_ERROR(spec::ApplySet(&root, set));
  return spec::Decode(root);
}

Result<JobSpec> ParseJobSpec(const std::string& yaml, const std::string& source) {
  ASSIGN_OR_RETURN(spec::Node root, spec::ParseYaml(yaml, source));
  return spec::Decode(root);
}

}  // namespace trainctl
