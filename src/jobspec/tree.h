// A YAML document as a plain tree whose every node remembers where it came from (file and line,
// or the --set flag), so that errors found after layering files and overrides still point at the
// right place. Internal to spec/.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace trainctl::jobspec {

struct Origin {
  std::string source;            // a file path, or "--set key=value"
  int line = 0;                  // 1-based; 0 when not from a file
  std::string ToString() const;  // "job.yaml:4" or "--set nodes=two"
};

struct Node {
  enum class Kind { kNull, kScalar, kSeq, kMap };
  Kind kind = Kind::kNull;
  std::string scalar;                             // kScalar
  bool quoted = false;                            // kScalar written in quotes (a string, whatever it looks like)
  std::vector<Node> seq;                          // kSeq
  std::vector<std::pair<std::string, Node>> map;  // kMap, in document order
  Origin origin;

  // Out of line: a pair of a string and a Node is complete only once Node is (clang needs this).
  Node();
  Node(const Node&);
  Node(Node&&) noexcept;
  Node& operator=(const Node&);
  Node& operator=(Node&&) noexcept;
  ~Node();

  const Node* Find(const std::string& key) const;
  Node* Find(const std::string& key);
  const char* KindName() const;  // "a mapping", "a list", "a value", "null"
};

// Limits that keep hostile input from exhausting memory or stack.
inline constexpr int kMaxDepth = 32;
inline constexpr size_t kMaxNodes = 100000;
inline constexpr size_t kMaxFileBytes = 4 << 20;

// Parses YAML text. `source` names it in errors. An empty document gives a null node.
Result<Node> ParseYaml(const std::string& text, const std::string& source);
// Layers `overlay` onto `base` as Helm layers values files: mappings merge key by key, anything
// else replaces, and a null value deletes the key.
void Merge(Node* base, const Node& overlay);
// Applies one "--set a.b[0].c=value" override; the value is parsed as YAML ("3", "[a, b]").
Status ApplySet(Node* root, const std::string& assignment);

}  // namespace trainctl::jobspec
