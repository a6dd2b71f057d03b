// The job spec's JSON Schema (`trainctl schema`), made by the decoder itself: each accessor notes
// what its field takes, on documents that grow until no new key appears.
#include "jobspec/decoder.h"

namespace trainctl::jobspec {

namespace {

Node MapNode() {
  Node n;
  n.kind = Kind::kMap;
  return n;
}

// A stand-in value of what `s` takes, to reach what lies under it on the next pass.
Node Placeholder(const nlohmann::json& s) {
  Node n;
  const std::string type = s.contains("type") && s["type"].is_string() ? s["type"].get<std::string>() : "";
  if (type == "array") {
    n.kind = Kind::kSeq;
    n.seq.push_back(Placeholder(s.value("items", nlohmann::json::object())));
  } else if (type == "object" || s.empty()) {
    n = MapNode();
  } else {
    n.kind = Kind::kScalar;
    n.scalar = "1";
  }
  return n;
}

// Adds every key the schema knows and the document lacks; lists get one element. Whether it added.
bool Fill(Node* n, const nlohmann::json& s) {
  bool added = false;
  const std::string type = s.contains("type") && s["type"].is_string() ? s["type"].get<std::string>() : "";
  if (type == "array" && n->kind != Kind::kSeq) {
    *n = Placeholder(s);
    return true;
  }
  if (n->kind == Kind::kSeq && s.contains("items")) {
    for (auto& e : n->seq) added |= Fill(&e, s["items"]);
  }
  if (n->kind == Kind::kMap && s.contains("properties")) {
    for (const auto& [key, sub] : s["properties"].items()) {
      Node* child = n->Find(key);
      if (!child) {
        n->map.emplace_back(key, Placeholder(sub));
        added = true;
        child = &n->map.back().second;
      }
      added |= Fill(child, sub);
    }
  }
  return added;
}

}  // namespace

namespace {
nlohmann::json JobSpecSchemaJson() {
  nlohmann::json schema = {{"type", "object"}};
  Node doc = MapNode();
  // The decoder notes what it reads; a document with every key it named is read again until no
  // new key appears (each pass reaches one level deeper).
  for (int pass = 0; pass < 16; ++pass) {
    Decoder d;
    d.schema = &schema;
    (void)DecodeWith(d, doc);
    if (!Fill(&doc, schema)) break;
  }
  // What one accessor cannot say: nodes is a count, a range string or {min, max}.
  nlohmann::json range = schema["properties"]["nodes"];
  range["required"] = {"min", "max"};
  range.erase("description");
  schema["properties"]["nodes"] = {{"description", "a node count (2), a range (\"1:4\") or a mapping {min: 1, max: 4}"},
                                   {"anyOf",
                                    {{{"type", "integer"}, {"minimum", 1}, {"maximum", kMaxJobNodes}},
                                     {{"type", "string"}, {"pattern", "^[0-9]+:[0-9]+$"}},
                                     range}}};
  // trainer.model: a name, or a declared model whose layers nest (a residual block's body).
  nlohmann::json layers = {{"type", "array"}, {"minItems", 1}, {"items", {{"$ref", "#/definitions/layer"}}}};
  auto fields = [](nlohmann::json props) {
    return nlohmann::json{{"type", "object"}, {"additionalProperties", false}, {"properties", std::move(props)}};
  };
  const nlohmann::json count = {{"type", "integer"}, {"minimum", 1}};
  const nlohmann::json name = {{"type", "string"},
                               {"pattern", "^[A-Za-z0-9_]+(\\.[A-Za-z0-9_]+)*$"},
                               {"description", "the parameters' prefix in checkpoints (conv1, layer1.0)"}};
  const nlohmann::json window =
      fields({{"kernel", count}, {"stride", count}, {"padding", {{"type", "integer"}, {"minimum", 0}}}});
  nlohmann::json kinds = nlohmann::json::array();
  kinds.push_back(
      {{"enum", {"relu", "gelu", "flatten", "global_avgpool", "batchnorm", "dropout", "maxpool", "avgpool", "linear"}},
       {"description", "a layer with its defaults (linear: the classes, as the last layer)"}});
  auto one = [&](const std::string& kind, nlohmann::json shorthand, nlohmann::json object) {
    nlohmann::json alt = {{"type", "object"},
                          {"additionalProperties", false},
                          {"required", {kind}},
                          {"minProperties", 1},
                          {"maxProperties", 1}};
    alt["properties"][kind] = {{"anyOf", {std::move(shorthand), std::move(object)}}};
    kinds.push_back(std::move(alt));
  };
  one("conv", count,
      fields({{"channels", count},
              {"kernel", count},
              {"stride", count},
              {"padding", {{"type", "integer"}, {"minimum", 0}}},
              {"groups", count},
              {"bias", {{"type", "boolean"}}},
              {"name", name}}));
  one("linear", count, fields({{"features", count}, {"bias", {{"type", "boolean"}}}, {"name", name}}));
  one("maxpool", count, window);
  one("avgpool", count, window);
  one("batchnorm", {{"type", "null"}}, fields({{"name", name}}));
  one("dropout", {{"type", "number"}, {"minimum", 0}, {"exclusiveMaximum", 1}},
      fields({{"p", {{"type", "number"}, {"minimum", 0}, {"exclusiveMaximum", 1}}}}));
  one("residual", layers,
      fields({{"layers", layers}, {"projection", {{"enum", {"auto", "conv", "none"}}}}, {"name", name}}));
  schema["definitions"]["layer"] = {{"anyOf", kinds}};
  schema["properties"]["trainer"]["properties"]["model"] = {
      {"description",
       "cnn, resnet18, resnet50, a model declared as a list of layers, or a TorchScript module's "
       "path (docs/trainer.md)"},
      {"anyOf",
       {{{"enum", {"cnn", "resnet18", "resnet50"}}},
        fields({{"layers", layers}, {"torchscript", {{"type", "string"}, {"minLength", 1}}}})}}};
  schema["required"] = {"name"};
  schema["$schema"] = "http://json-schema.org/draft-07/schema#";
  schema["$id"] = "https://trainctl.dev/schema/job-spec.json";
  schema["title"] = "trainctl job spec";
  schema["description"] = "A trainctl job (docs/job-spec.md); generated by the decoder that trainctl run uses.";
  return schema;
}
}  // namespace

}  // namespace trainctl::jobspec

namespace trainctl {
std::string JobSpecSchema(int indent) { return jobspec::JobSpecSchemaJson().dump(indent) + "\n"; }
}  // namespace trainctl
