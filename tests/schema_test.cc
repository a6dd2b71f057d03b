// `trainctl schema`: the job spec's JSON Schema, checked with an independent validator (ajv,
// tests/k8s/schema.mjs) against trainctl's own decoder: every example is valid for both, and for
// every field of the schema a value of the wrong kind, a value past each bound and an unknown key
// beside it are refused by both.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>

#include "tests/test_util.h"

namespace trainctl::testing {
namespace {

using nlohmann::json;
const std::string kSrc = TRAINCTL_SOURCE_DIR;

struct Case {
  std::string file, path, what;
};

// A spec from which `path` ("trainer.data.limit", "roles[0].env") can be set.
std::string BaseFor(const std::string& path) {
  if (path.rfind("trainer", 0) == 0) return "name: s\ntrainer: {}\n";
  if (path.rfind("roles", 0) == 0) return "name: s\ncommand: [\"true\"]\nroles: [{name: worker}]\n";
  return "name: s\ncommand: [\"true\"]\n";
}

// `doc` with `path` set to `value` (YAML text); maps are created on the way, "[0]" is a list's first.
std::string With(const std::string& base, const std::string& path, const std::string& value) {
  YAML::Node doc = YAML::Load(base);
  YAML::Node at = doc;
  std::vector<std::string> steps;
  for (size_t start = 0; start <= path.size();) {
    size_t end = path.find('.', start);
    steps.push_back(path.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  for (size_t i = 0; i < steps.size(); ++i) {
    std::string key = steps[i];
    const bool index = key.size() > 3 && key.compare(key.size() - 3, 3, "[0]") == 0;
    if (index) key.resize(key.size() - 3);
    if (i + 1 == steps.size() && !index) {
      at[key] = YAML::Load(value);
      break;
    }
    if (!at[key]) at[key] = index ? YAML::Load("[{}]") : YAML::Node(YAML::NodeType::Map);
    YAML::Node next = index ? at[key][0] : at[key];
    if (index && i + 1 == steps.size()) {
      at[key][0] = YAML::Load(value);
      break;
    }
    at.reset(next);
  }
  YAML::Emitter e;
  e << doc;
  return std::string(e.c_str()) + "\n";
}

// Every field of the schema: (path, its schema).
void Fields(const json& s, const std::string& path, std::vector<std::pair<std::string, json>>* out) {
  if (s.contains("properties")) {
    for (const auto& [k, sub] : s["properties"].items()) {
      const std::string p = path.empty() ? k : path + "." + k;
      out->emplace_back(p, sub);
      Fields(sub, p, out);
    }
  }
  if (s.contains("items") && s["items"].is_object() && s["items"].contains("properties")) {
    Fields(s["items"], path + "[0]", out);
  }
}

bool IsObject(const json& s) { return s.contains("type") && s["type"] == "object"; }

TEST(Schema, TheSchemaAndTheDecoderAgreeOnEveryField) {
  Scratch s;
  auto r = Trainctl({"schema", "-o", s.path("schema.json")}, s.path(""));
  ASSERT_EQ(r.exit.code, 0) << r.output;
  const json schema = json::parse(s.Read("schema.json"));
  EXPECT_EQ(schema["$schema"], "http://json-schema.org/draft-07/schema#");
  std::vector<std::pair<std::string, json>> fields;
  Fields(schema, "", &fields);
  ASSERT_GT(fields.size(), 80u) << "every field of docs/job-spec.md";
  for (const char* f :
       {"trainer.optimizer.lr", "cluster.storage.mount", "roles[0].on_failure", "timeouts.heartbeat",
        "cluster.metrics_port", "trainer.parameter_server.max_staleness", "cluster.tolerations[0].effect"}) {
    EXPECT_TRUE(std::any_of(fields.begin(), fields.end(), [&](const auto& x) { return x.first == f; })) << f;
  }

  // Valid for both: every example that is a whole spec.
  std::vector<std::string> valid;
  for (const auto& e : fs::directory_iterator(kSrc + "/examples")) {
    if (e.path().extension() == ".yaml") valid.push_back(e.path().string());
  }
  valid.push_back(kSrc + "/examples/k8s/base.yaml");
  // The bases the refused cases below start from, each valid for both.
  for (const char* path : {"trainer.epochs", "roles[0].name", "env"}) {
    valid.push_back(s.Write(std::string("base-") + path[0] + ".yaml", With(BaseFor(path), "nodes", "1")));
  }
  std::vector<std::string> argv = {"node", kSrc + "/tests/k8s/schema.mjs", s.path("schema.json")};
  argv.insert(argv.end(), valid.begin(), valid.end());
  auto ok = RunProgram(argv, s.path(""));
  EXPECT_EQ(ok.exit.code, 0) << ok.output;
  EXPECT_EQ(CountLines(ok.output, ": valid"), static_cast<int>(valid.size())) << ok.output;
  for (const auto& f : valid) EXPECT_EQ(Trainctl({"validate", f}, s.path("")).exit.code, 0) << f;

  // Refused by both: for every field, a value of the wrong kind and one past each bound; an
  // unknown key in every mapping.
  std::vector<Case> bad;
  int n = 0;
  auto add = [&](const std::string& path, const std::string& value, const std::string& what) {
    const std::string file = s.Write("bad-" + std::to_string(n++) + ".yaml", With(BaseFor(path), path, value));
    bad.push_back({file, path, path + " = " + value + " (" + what + ")"});
  };
  for (const auto& [path, sub] : fields) {
    add(path, IsObject(sub) ? "[1, 2]" : "{wrong: 1}", "wrong kind");
    if (IsObject(sub) && sub.value("additionalProperties", json(true)) == json(false)) {
      add(path + ".no_such_field", "1", "unknown key");
    }
    if (sub.contains("minimum") && sub["minimum"].is_number_integer()) {
      add(path, std::to_string(sub["minimum"].get<long long>() - 1), "below the minimum");
    }
    if (sub.contains("maximum") && sub["maximum"].is_number_integer() &&
        sub["maximum"].get<long long>() < (1LL << 50)) {
      add(path, std::to_string(sub["maximum"].get<long long>() + 1), "above the maximum");
    }
    if (sub.contains("enum")) add(path, "not-one-of-them", "not in the enum");
  }
  add("no_such_field", "1", "unknown key");
  argv = {"node", kSrc + "/tests/k8s/schema.mjs", s.path("schema.json")};
  for (const auto& c : bad) argv.push_back(c.file);
  auto refused = RunProgram(argv, s.path(""));
  for (const auto& c : bad) {
    EXPECT_NE(refused.output.find(c.file + ": INVALID"), std::string::npos) << "the schema takes " << c.what << "\n"
                                                                            << s.Read(c.file.substr(s.path("").size()));
    auto v = Trainctl({"validate", c.file}, s.path(""));
    EXPECT_EQ(v.exit.code, 2) << "trainctl takes " << c.what << "\n" << v.output;
    EXPECT_NE(v.output.find(": " + c.path + ": "), std::string::npos) << "trainctl names the field: " << c.what << "\n"
                                                                      << v.output;
  }
  EXPECT_GT(bad.size(), 150u);
}

}  // namespace
}  // namespace trainctl::testing
