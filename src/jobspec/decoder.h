// The job spec's decoder, shared by jobspec/'s sources and no one else: `Decoder` turns the
// layered tree (tree.h) into a JobSpec, collecting every problem with its origin, and in schema
// mode notes what each field takes. A section a file: decode.cc the top level, decode_trainer.cc
// the trainer (its model, data, optimizer and schedule), decode_cluster.cc nodes, env, resources
// and cluster, decode_roles.cc roles; schema.cc makes the JSON Schema by running the decoder.
#pragma once

#include <algorithm>
#include <cctype>
#include <climits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/strings.h"
#include "jobspec/job_spec.h"
#include "jobspec/tree.h"

namespace trainctl::jobspec {

using Kind = Node::Kind;

inline constexpr int kMaxJobNodes = 10000;
inline constexpr int kMaxProcsPerNode = 1024;
inline constexpr int kMaxRestarts = 100000;

// What a scalar field takes: the decoder reads any YAML scalar as text.
inline const nlohmann::json kScalar = {{"type", {"string", "number", "boolean"}}};

class Decoder {
 public:
  std::vector<std::pair<Origin, std::string>> errors;
  const Node* model_node_ = nullptr;  // trainer.model, when it declares layers
  // Schema mode (JobSpecSchema): each accessor notes here, by path, what it takes.
  nlohmann::json* schema = nullptr;

  // Merges `fragment` into the schema at `path` ("trainer.data.shape[1]": [N] is the list's items);
  // what an earlier note said wins.
  void Note(const std::string& path, const nlohmann::json& fragment) {
    if (!schema) return;
    nlohmann::json* at = schema;
    size_t start = 0;
    while (start < path.size()) {
      size_t end = path.find_first_of(".[", start);
      const std::string key = path.substr(start, end == std::string::npos ? std::string::npos : end - start);
      if (!key.empty()) {
        if (!at->contains("type")) (*at)["type"] = "object";
        at = &(*at)["properties"][key];
      }
      while (end != std::string::npos && path[end] == '[') {
        if (!at->contains("type")) (*at)["type"] = "array";
        at = &(*at)["items"];
        end = path.find(']', end);
        end = end == std::string::npos ? end : end + 1;
      }
      if (end == std::string::npos) break;
      start = path[end] == '.' ? end + 1 : end;
    }
    for (const auto& [k, v] : fragment.items()) {
      if (!at->contains(k)) (*at)[k] = v;
    }
  }

  void Error(const Node& at, const std::string& path, const std::string& message) {
    errors.emplace_back(at.origin, at.origin.ToString() + ": " + path + ": " + message);
  }

  // All problems, in the order of the files and lines they point at.
  std::string Report() {
    std::stable_sort(errors.begin(), errors.end(), [](const auto& a, const auto& b) {
      return std::tie(a.first.source, a.first.line) < std::tie(b.first.source, b.first.line);
    });
    std::vector<std::string> lines;
    for (const auto& e : errors) lines.push_back(e.second);
    return Join(lines, "\n");
  }

  // Rejects keys that are not in `allowed`, with a did-you-mean.
  void CheckKeys(const Node& map, const std::string& prefix, const std::vector<std::string>& allowed) {
    Note(prefix, {{"type", "object"}, {"additionalProperties", false}});
    for (const auto& key : allowed) Note(prefix.empty() ? key : prefix + "." + key, nlohmann::json::object());
    for (const auto& [key, value] : map.map) {
      if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
      std::string path = prefix.empty() ? key : prefix + "." + key;
      std::string guess = ClosestMatch(key, allowed);
      std::string hint = guess.empty() ? "expected one of: " + Join(allowed, ", ") : "did you mean '" + guess + "'?";
      // Fields users put one level too high, as other tools have them.
      static const std::map<std::string, std::string> kBelongs = {
          {"trainer.augment", "trainer.data.augment"},
          {"trainer.lr", "trainer.optimizer.lr"},
          {"trainer.momentum", "trainer.optimizer.momentum"},
          {"trainer.weight_decay", "trainer.optimizer.weight_decay"},
          {"trainer.shape", "trainer.data.shape"},
          {"trainer.dataset", "trainer.data.dataset"},
          {"trainer.layers", "trainer.model.layers"},
          {"trainer.torchscript", "trainer.model.torchscript"}};
      if (auto it = kBelongs.find(path); it != kBelongs.end()) hint = "it belongs in " + it->second;
      Error(value, path, "unknown field; " + hint);
    }
  }

  // Returns the child of a mapping, or nullptr when absent or null.
  static const Node* Child(const Node& map, const std::string& key) {
    const Node* n = map.Find(key);
    return (n && n->kind != Kind::kNull) ? n : nullptr;
  }

  bool ExpectScalar(const Node& n, const std::string& path, const std::string& expected) {
    nlohmann::json note = kScalar;
    note["description"] = expected;
    Note(path, note);
    if (n.kind == Kind::kScalar) return true;
    Error(n, path, expected + ", got " + n.KindName());
    return false;
  }

  std::optional<long long> Int(const Node& n, const std::string& path, long long min, long long max) {
    const std::string expected = min >= 1 ? "expected a positive integer" : "expected a whole number";
    Note(path, {{"type", "integer"}, {"minimum", min}, {"maximum", max}});
    if (!ExpectScalar(n, path, expected)) return std::nullopt;
    const std::string& s = n.scalar;
    size_t i = (!s.empty() && (s[0] == '+' || s[0] == '-')) ? 1 : 0;
    bool digits = i < s.size() && std::all_of(s.begin() + i, s.end(), [](char c) { return std::isdigit(c); });
    if (!digits) {
      Error(n, path, expected + ", got " + Quote(s));
      return std::nullopt;
    }
    errno = 0;
    char* end = nullptr;
    long long v = std::strtoll(s.c_str(), &end, 10);
    if (errno == ERANGE || v < min || v > max) {
      Error(n, path, expected + " from " + std::to_string(min) + " to " + std::to_string(max) + ", got " + Quote(s));
      return std::nullopt;
    }
    return v;
  }

  std::optional<double> Double(const Node& n, const std::string& path, double min, double max) {
    const std::string expected = "expected a number from " + FormatNumber(min) + " to " + FormatNumber(max);
    Note(path, {{"type", "number"}, {"minimum", min}, {"maximum", max}});
    if (!ExpectScalar(n, path, expected)) return std::nullopt;
    char* end = nullptr;
    errno = 0;
    double v = std::strtod(n.scalar.c_str(), &end);
    if (n.scalar.empty() || end != n.scalar.c_str() + n.scalar.size() || errno == ERANGE || !(v >= min && v <= max)) {
      Error(n, path, expected + ", got " + Quote(n.scalar));
      return std::nullopt;
    }
    return v;
  }

  std::optional<bool> Bool(const Node& n, const std::string& path) {
    Note(path, {{"type", "boolean"}});
    if (!ExpectScalar(n, path, "expected true or false")) return std::nullopt;
    if (n.scalar == "true") return true;
    if (n.scalar == "false") return false;
    Error(n, path, "expected true or false, got " + Quote(n.scalar));
    return std::nullopt;
  }

  // One of `allowed`, with a did-you-mean.
  std::optional<std::string> OneOf(const Node& n, const std::string& path, const std::vector<std::string>& allowed) {
    Note(path, {{"type", "string"}, {"enum", allowed}});
    auto s = String(n, path);
    if (!s) return std::nullopt;
    if (std::find(allowed.begin(), allowed.end(), *s) != allowed.end()) return s;
    std::string guess = ClosestMatch(*s, allowed);
    Error(n, path,
          "expected one of " + Join(allowed, ", ") + ", got " + Quote(*s) +
              (guess.empty() ? "" : "; did you mean '" + guess + "'?"));
    return std::nullopt;
  }

  static std::string FormatNumber(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
  }

  // A mapping at `path`, with only `keys` allowed; nullptr (and an error) otherwise.
  const Node* Section(const Node& n, const std::string& path, const std::vector<std::string>& keys) {
    if (schema) CheckKeys(Node(), path, keys);  // the keys, whatever this node is
    if (n.kind != Kind::kMap) {
      Error(n, path, "expected a mapping with " + Join(keys, ", ") + ", got " + n.KindName());
      return nullptr;
    }
    CheckKeys(n, path, keys);
    return &n;
  }

  template <typename T, typename F>
  void Field(const Node& map, const std::string& prefix, const std::string& key, T* out, F parse) {
    if (const Node* c = Child(map, key)) {
      if (auto v = parse(*c, prefix + "." + key)) *out = static_cast<T>(*v);
    }
  }

  // Readers for Field: a whole number or a number from lo to hi, a boolean, one of `allowed`, a string.
  auto IntIn(long long lo, long long hi) {
    return [this, lo, hi](const Node& c, const std::string& path) { return Int(c, path, lo, hi); };
  }
  auto NumIn(double lo, double hi) {
    return [this, lo, hi](const Node& c, const std::string& path) { return Double(c, path, lo, hi); };
  }
  auto Boolean() {
    return [this](const Node& c, const std::string& path) { return Bool(c, path); };
  }
  auto OneOfThese(std::vector<std::string> allowed) {
    return [this, allowed](const Node& c, const std::string& path) { return OneOf(c, path, allowed); };
  }
  auto Text() {
    return [this](const Node& c, const std::string& path) { return String(c, path); };
  }

  // The trainer section (decode_trainer.cc).
  void DecodeTrainer(const Node& n, TrainerSpec* t);
  void DecodeData(const Node& n, const std::string& path, DataSpec* ds);
  void DecodeAugment(const Node& n, const std::string& path, DataSpec* ds);
  void DecodeOptimizer(const Node& n, const std::string& path, OptimizerSpec* os);
  void DecodeSchedule(const Node& n, const std::string& path, ScheduleSpec* ss);
  // trainer.model: a model's name, or {layers: [...]} (jobspec/layers.h).
  void DecodeModel(const Node& n, const std::string& path, TrainerSpec* t);

  bool DecodeLayers(const Node& n, const std::string& path, int depth, std::vector<LayerSpec>* out);

  // A layer: its kind alone (relu), a kind and its size ({conv: 16}), or a kind and its fields
  // ({conv: {channels: 16, stride: 2}}); a residual block's body as {residual: [layers]}.
  bool DecodeLayer(const Node& n, const std::string& path, int depth, LayerSpec* l);

  // After the trainer's data is known: a declared model's names, and its shapes checked.
  void CheckModel(TrainerSpec* t);

  // A program and its first arguments: a list, or one word.
  std::optional<std::vector<std::string>> Command(const Node& n, const std::string& path) {
    Note(path, {{"type", {"string", "array"}},
                {"items", kScalar},
                {"minItems", 1},
                {"description", "the program and its arguments, such as [python3, train.py]"}});
    if (n.kind == Kind::kScalar) {
      if (n.scalar.find_first_of(" \t") != std::string::npos) {
        Error(n, path,
              "expected a list such as [python3, train.py], got the string " + Quote(n.scalar) +
                  " (trainctl runs no shell)");
      } else if (n.scalar.empty()) {
        Error(n, path, "expected a program to run, got an empty string");
      } else {
        return std::vector<std::string>{n.scalar};
      }
      return std::nullopt;
    }
    auto list = StringList(n, path);
    if (list && (list->empty() || (*list)[0].empty())) {
      Error(n, path, "expected a program to run, got an empty list");
      return std::nullopt;
    }
    return list;
  }

  std::optional<std::string> String(const Node& n, const std::string& path) {
    if (!ExpectScalar(n, path, "expected a string")) return std::nullopt;
    return n.scalar;
  }

  std::optional<std::vector<std::string>> StringList(const Node& n, const std::string& path) {
    Note(path, {{"type", "array"}, {"items", kScalar}});
    if (n.kind != Kind::kSeq) {
      Error(n, path, std::string("expected a list of strings such as [python3, train.py], got ") + n.KindName());
      return std::nullopt;
    }
    std::vector<std::string> out;
    bool ok = true;
    for (size_t i = 0; i < n.seq.size(); ++i) {
      auto s = String(n.seq[i], path + "[" + std::to_string(i) + "]");
      if (s)
        out.push_back(*s);
      else
        ok = false;
    }
    if (!ok) return std::nullopt;
    return out;
  }

  std::optional<Duration> DurationField(const Node& n, const std::string& path) {
    Note(path, {{"type", {"string", "number"}}, {"description", "a duration such as 30s, 5m or 1h30m"}});
    if (!ExpectScalar(n, path, "expected a duration such as 30s or 5m")) return std::nullopt;
    auto d = ParseDuration(n.scalar);
    if (!d.ok()) {
      Error(n, path, d.status().message());
      return std::nullopt;
    }
    return *d;
  }

  // The job's place: nodes, env, resources, cluster (decode_cluster.cc).
  void DecodeNodes(const Node& n, NodesSpec* out);

  void DecodeEnv(const Node& n, const std::string& prefix, std::vector<std::pair<std::string, std::string>>* out);

  void DecodeResources(const Node& n, const std::string& p, ResourcesSpec* out);

  // The `cluster:` section: what `trainctl render` needs for Kubernetes, Slurm and MPI.
  void DecodeCluster(const Node& n, ClusterSpec* c);
  void DecodeStorage(const Node& n, const std::string& path, StorageSpec* storage);
  void DecodeStage(const Node& n, const std::string& path, StageSpec* stage);
  void DecodePlacement(const Node& cluster, const std::string& path, ClusterSpec* c);

  // Roles (decode_roles.cc). What a role says of itself; the rest is resolved once the whole spec is read
  // (ResolveRoles).
  struct RoleFields {
    const Node* node = nullptr;
    bool own_command = false, own_args = false, own_resources = false;
    bool has_success = false, has_on_failure = false, has_finish = false;
  };

  void DecodeRoles(const Node& n, JobSpec* spec, std::vector<RoleFields>* fields);

  // Fills in what each role inherits from the job and the defaults that depend on the other
  // roles, and checks the roles fit the rest of the spec.
  void ResolveRoles(const Node& root, JobSpec* spec, const std::vector<RoleFields>& fields);

  static bool IsDnsLabel(const std::string& s) {
    if (s.empty() || s.size() > 63) return false;
    auto ok = [](char c) { return (c >= 'a' && c <= 'z') || std::isdigit(c) || c == '-'; };
    return std::all_of(s.begin(), s.end(), ok) && s.front() != '-' && s.back() != '-';
  }
  // A Kubernetes label value: empty, or at most 63 of letters, digits, '-', '_' and '.', starting
  // and ending with a letter or digit.
  static bool IsLabelValue(std::string_view s) {
    if (s.empty()) return true;
    auto alnum = [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) != 0 && static_cast<unsigned char>(c) < 0x80;
    };
    auto ok = [&](char c) { return alnum(c) || c == '-' || c == '_' || c == '.'; };
    return s.size() <= 63 && std::all_of(s.begin(), s.end(), ok) && alnum(s.front()) && alnum(s.back());
  }
  // A Kubernetes label key (a qualified name): a non-empty label value, after an optional prefix of
  // a DNS subdomain (at most 253 of lowercase letters, digits, '-' and '.') and '/'.
  static bool IsLabelKey(std::string_view s) {
    const size_t slash = s.find('/');
    if (slash != std::string_view::npos) {
      const std::string_view prefix = s.substr(0, slash);
      auto ok = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.'; };
      if (prefix.empty() || prefix.size() > 253 || !std::all_of(prefix.begin(), prefix.end(), ok) ||
          !std::isalnum(static_cast<unsigned char>(prefix.front())) ||
          !std::isalnum(static_cast<unsigned char>(prefix.back()))) {
        return false;
      }
      s = s.substr(slash + 1);
    }
    return !s.empty() && IsLabelValue(s);
  }
};

// The whole spec, with `d`'s mode (decode.cc).
Result<JobSpec> DecodeWith(Decoder& d, const Node& root);

}  // namespace trainctl::jobspec
