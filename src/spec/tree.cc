#include "spec/tree.h"

#include <yaml-cpp/yaml.h>

#include <cctype>

namespace trainctl::spec {
namespace {

struct Converter {
  std::string source;
  int line_offset = 0;  // for --set values, lines are meaningless
  size_t nodes = 0;

  Status Convert(const YAML::Node& in, int depth, Node* out) {
    if (++nodes > kMaxNodes) {
      return InvalidArgument(source + ": document too large (more than " +
                             std::to_string(kMaxNodes) + " nodes after expanding aliases)");
    }
    out->origin.source = source;
    out->origin.line = line_offset ? 0 : in.Mark().line + 1;
    if (depth > kMaxDepth) {
      return InvalidArgument(out->origin.ToString() + ": nested more than " +
                             std::to_string(kMaxDepth) + " levels deep");
    }
    switch (in.Type()) {
      case YAML::NodeType::Undefined:
      case YAML::NodeType::Null:
        out->kind = Node::Kind::kNull;
        return Status::Ok();
      case YAML::NodeType::Scalar:
        out->kind = Node::Kind::kScalar;
        out->scalar = in.Scalar();
        return Status::Ok();
      case YAML::NodeType::Sequence:
        out->kind = Node::Kind::kSeq;
        for (const auto& item : in) {
          out->seq.emplace_back();
          RETURN_IF_ERROR(Convert(item, depth + 1, &out->seq.back()));
        }
        return Status::Ok();
      case YAML::NodeType::Map:
        out->kind = Node::Kind::kMap;
        for (const auto& kv : in) {
          Origin key_origin{source, line_offset ? 0 : kv.first.Mark().line + 1};
          if (!kv.first.IsScalar()) {
            return InvalidArgument(key_origin.ToString() + ": keys must be plain names");
          }
          const std::string key = kv.first.Scalar();
          if (out->Find(key)) {
            return InvalidArgument(key_origin.ToString() + ": " + key + ": duplicate key");
          }
          out->map.emplace_back(key, Node{});
          RETURN_IF_ERROR(Convert(kv.second, depth + 1, &out->map.back().second));
          // A key with no value ("name:") is reported at the key's line.
          if (out->map.back().second.kind == Node::Kind::kNull) {
            out->map.back().second.origin = key_origin;
          }
        }
        return Status::Ok();
    }
    return Internal("unknown YAML node type");
  }
};

Result<Node> ParseWith(const std::string& text, Converter& conv) {
  if (text.find('\0') != std::string::npos) {
    return InvalidArgument(conv.source + ": binary data, not a YAML text file");
  }
  std::vector<YAML::Node> docs;
  try {
    docs = YAML::LoadAll(text);
  } catch (const YAML::Exception& e) {
    Origin at{conv.source, conv.line_offset ? 0 : e.mark.line + 1};
    return InvalidArgument(at.ToString() + ": invalid YAML: " + e.msg);
  } catch (const std::exception& e) {
    return InvalidArgument(conv.source + ": invalid YAML: " + e.what());
  }
  if (docs.size() > 1) {
    return InvalidArgument(conv.source + ": expected one YAML document, found " +
                           std::to_string(docs.size()) + " (separated by ---)");
  }
  Node root;
  root.origin = {conv.source, conv.line_offset ? 0 : 1};
  if (docs.empty()) return root;
  try {
    RETURN_IF_ERROR(conv.Convert(docs[0], 0, &root));
  } catch (const YAML::Exception& e) {
    return InvalidArgument(conv.source + ": invalid YAML: " + e.msg);
  }
  return root;
}

// One step of a --set path: a key, or an index into a list.
struct PathStep {
  std::string key;
  long index = -1;
};

Result<std::vector<PathStep>> ParsePath(const std::string& path, const std::string& flag) {
  std::vector<PathStep> steps;
  size_t i = 0;
  auto bad = [&](const std::string& why) {
    return InvalidArgument(flag + ": " + why + "; expected key=value with a path like "
                           "restart.max_restarts or args[0]");
  };
  while (i < path.size()) {
    size_t start = i;
    while (i < path.size() && path[i] != '.' && path[i] != '[') ++i;
    if (i == start) return bad("empty key in the path");
    steps.push_back({path.substr(start, i - start)});
    while (i < path.size() && path[i] == '[') {
      size_t close = path.find(']', i);
      if (close == std::string::npos) return bad("unclosed [");
      std::string num = path.substr(i + 1, close - i - 1);
      if (num.empty() || num.size() > 6 ||
          !std::all_of(num.begin(), num.end(), [](char c) { return std::isdigit(c); })) {
        return bad("list index must be a number");
      }
      steps.push_back({"", std::stol(num)});
      i = close + 1;
    }
    if (i < path.size()) {
      if (path[i] != '.') return bad("unexpected '" + std::string(1, path[i]) + "'");
      ++i;
      if (i == path.size()) return bad("path ends with '.'");
    }
  }
  if (steps.empty()) return bad("empty key");
  return steps;
}

}  // namespace

std::string Origin::ToString() const {
  if (line > 0) return source + ":" + std::to_string(line);
  return source;
}

const Node* Node::Find(const std::string& key) const {
  for (const auto& kv : map) {
    if (kv.first == key) return &kv.second;
  }
  return nullptr;
}

Node* Node::Find(const std::string& key) {
  return const_cast<Node*>(static_cast<const Node*>(this)->Find(key));
}

const char* Node::KindName() const {
  switch (kind) {
    case Kind::kNull: return "nothing";
    case Kind::kScalar: return "a value";
    case Kind::kSeq: return "a list";
    case Kind::kMap: return "a mapping";
  }
  return "?";
}

Result<Node> ParseYaml(const std::string& text, const std::string& source) {
  if (text.size() > kMaxFileBytes) {
    return InvalidArgument(source + ": file is larger than " + std::to_string(kMaxFileBytes >> 20) +
                           " MiB; a job spec is a few kilobytes");
  }
  Converter conv{source};
  return ParseWith(text, conv);
}

void Merge(Node* base, const Node& overlay) {
  if (base->kind != Node::Kind::kMap || overlay.kind != Node::Kind::kMap) {
    *base = overlay;
    return;
  }
  for (const auto& [key, value] : overlay.map) {
    Node* existing = base->Find(key);
    if (value.kind == Node::Kind::kNull) {
      std::erase_if(base->map, [&key](const auto& kv) { return kv.first == key; });
    } else if (existing) {
      Merge(existing, value);
    } else {
      base->map.emplace_back(key, value);
    }
  }
}

Status ApplySet(Node* root, const std::string& assignment) {
  const std::string flag = "--set " + assignment;
  size_t eq = assignment.find('=');
  if (eq == std::string::npos) {
    return InvalidArgument(flag + ": expected key=value, for example --set restart.max_restarts=5");
  }
  ASSIGN_OR_RETURN(auto steps, ParsePath(assignment.substr(0, eq), flag));
  Converter conv{flag, 1};
  std::string text = assignment.substr(eq + 1);
  Node value;
  value.origin = {flag, 0};
  if (text.empty()) {
    value.kind = Node::Kind::kScalar;  // "--set key=" means the empty string
  } else {
    ASSIGN_OR_RETURN(value, ParseWith(text, conv));
  }
  Node* cur = root;
  for (size_t i = 0; i < steps.size(); ++i) {
    const PathStep& step = steps[i];
    if (step.index >= 0) {
      if (cur->kind != Node::Kind::kSeq) {
        return InvalidArgument(flag + ": [" + std::to_string(step.index) +
                               "] indexes a list, but that field is " + cur->KindName());
      }
      if (step.index > static_cast<long>(cur->seq.size())) {
        return InvalidArgument(flag + ": index " + std::to_string(step.index) +
                               " is past the end of the list (length " +
                               std::to_string(cur->seq.size()) + ")");
      }
      if (step.index == static_cast<long>(cur->seq.size())) {
        cur->seq.emplace_back();
        cur->seq.back().origin = value.origin;
      }
      cur = &cur->seq[step.index];
    } else {
      if (cur->kind != Node::Kind::kMap) {
        cur->kind = Node::Kind::kMap;
        cur->seq.clear();
        cur->scalar.clear();
        cur->origin = value.origin;
      }
      Node* next = cur->Find(step.key);
      if (!next) {
        cur->map.emplace_back(step.key, Node{});
        next = &cur->map.back().second;
        next->origin = value.origin;
      }
      cur = next;
    }
  }
  if (value.kind == Node::Kind::kNull) value.origin = {flag, 0};
  *cur = value;
  return Status::Ok();
}

}  // namespace trainctl::spec
