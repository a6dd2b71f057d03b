#include "jobspec/tree.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/exceptions.h>
#include <yaml-cpp/parser.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <sstream>
#include <unordered_set>

#include "common/strings.h"

namespace trainctl::jobspec {
namespace {

// Builds a Node tree from yaml-cpp's parser events. Used instead of YAML::LoadAll, which loops
// forever on some malformed input in yaml-cpp 0.7 (jbeder/yaml-cpp#1040): we stop at the second
// document. Problems are thrown as SpecError and caught in ParseWith.
struct SpecError {
  Status status;
};

class TreeBuilder : public YAML::EventHandler {
 public:
  TreeBuilder(std::string source, bool with_lines) : source_(std::move(source)), lines_(with_lines) {}

  Node root;

  void OnDocumentStart(const YAML::Mark&) override {
    if (++documents_ > 1) {
      Fail(source_ + ": expected one YAML document, found more (separated by ---)");
    }
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override { Emit(Make(mark, Node::Kind::kNull), anchor); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    auto it = anchors_.find(anchor);
    if (it == anchors_.end()) Fail(At(mark) + ": unknown alias");
    count_ += Count(it->second);
    if (count_ > kMaxNodes) TooLarge();
    Emit(Node(it->second), 0);
  }
  void OnScalar(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                const std::string& value) override {
    // An escaped "\0" would cut an argument or a variable short where programs read C strings;
    // bytes that are not UTF-8 cannot go into the resolved (JSON) spec.
    if (value.find('\0') != std::string::npos) {
      Fail(At(mark) + ": a NUL character (\\0) in " + Quote(value.substr(0, value.find('\0'))) +
           "...; programs get arguments and environment values as C strings, which end at one");
    }
    if (!IsValidUtf8(value)) Fail(At(mark) + ": a value that is not valid UTF-8 text");
    Node n = Make(mark, Node::Kind::kScalar);
    n.scalar = value;
    n.quoted = tag == "!";  // yaml-cpp tags quoted scalars "!", plain ones "?"
    Emit(std::move(n), anchor);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    Open(Make(mark, Node::Kind::kSeq), anchor);
  }
  void OnSequenceEnd() override { Close(); }
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value) override {
    Open(Make(mark, Node::Kind::kMap), anchor);
  }
  void OnMapEnd() override { Close(); }

 private:
  struct Frame {
    Node node;
    YAML::anchor_t anchor = 0;
    bool have_key = false;
    std::string key;
    Origin key_origin;
    std::unordered_set<std::string> keys;  // the mapping's keys so far: a duplicate found in O(1)
  };

  [[noreturn]] void Fail(const std::string& message) { throw SpecError{InvalidArgument(message)}; }
  [[noreturn]] void TooLarge() {
    Fail(source_ + ": document too large (more than " + std::to_string(kMaxNodes) + " nodes after expanding aliases)");
  }
  int Line(const YAML::Mark& mark) const { return lines_ ? mark.line + 1 : 0; }
  std::string At(const YAML::Mark& mark) const { return Origin{source_, Line(mark)}.ToString(); }
  static size_t Count(const Node& n) {
    size_t c = 1;
    for (const auto& child : n.seq) c += Count(child);
    for (const auto& kv : n.map) c += Count(kv.second);
    return c;
  }
  Node Make(const YAML::Mark& mark, Node::Kind kind) {
    if (++count_ > kMaxNodes) TooLarge();
    Node n;
    n.kind = kind;
    n.origin = {source_, Line(mark)};
    return n;
  }
  void Open(Node n, YAML::anchor_t anchor) {
    if (static_cast<int>(stack_.size()) >= kMaxDepth) {
      Fail(n.origin.ToString() + ": nested more than " + std::to_string(kMaxDepth) + " levels deep");
    }
    Frame frame;
    frame.node = std::move(n);
    frame.anchor = anchor;
    stack_.push_back(std::move(frame));
  }
  void Close() {
    Frame f = std::move(stack_.back());
    stack_.pop_back();
    Emit(std::move(f.node), f.anchor);
  }
  // Places a finished node in its parent, or makes it the root.
  void Emit(Node n, YAML::anchor_t anchor) {
    if (anchor) anchors_[anchor] = n;
    if (stack_.empty()) {
      root = std::move(n);
      return;
    }
    Frame& parent = stack_.back();
    if (parent.node.kind == Node::Kind::kSeq) {
      parent.node.seq.push_back(std::move(n));
      return;
    }
    if (!parent.have_key) {
      if (n.kind != Node::Kind::kScalar) Fail(n.origin.ToString() + ": keys must be plain names");
      if (!parent.keys.insert(n.scalar).second) Fail(n.origin.ToString() + ": " + n.scalar + ": duplicate key");
      parent.have_key = true;
      parent.key = n.scalar;
      parent.key_origin = n.origin;
      return;
    }
    // A key with no value ("name:") is reported at the key's line.
    if (n.kind == Node::Kind::kNull) n.origin = parent.key_origin;
    parent.node.map.emplace_back(std::move(parent.key), std::move(n));
    parent.have_key = false;
  }

  std::string source_;
  bool lines_;
  int documents_ = 0;
  size_t count_ = 0;
  std::vector<Frame> stack_;
  std::map<YAML::anchor_t, Node> anchors_;
};

// Parses `text`; `with_lines` is false for --set values, whose lines mean nothing.
// The line where flow collections ([...], {...}) first nest deeper than kMaxDepth, or 0. yaml-cpp
// queues a token and a saved position for each open bracket before the builder sees any of them
// (4 MiB of "[" cost it 473 MB), so they are counted first; quoted text and comments are skipped.
int FlowTooDeep(const std::string& text) {
  int depth = 0, line = 1;
  char quote = 0;
  bool comment = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') {
      ++line;
      comment = false;
    } else if (comment) {
    } else if (quote) {
      if (c == '\\' && quote == '"')
        ++i;
      else if (c == quote)
        quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '#' && (i == 0 || text[i - 1] == ' ' || text[i - 1] == '\t' || text[i - 1] == '\n')) {
      comment = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxDepth) return line;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return 0;
}

Result<Node> ParseWith(const std::string& text, const std::string& source, bool with_lines) {
  if (text.find('\0') != std::string::npos) {
    return InvalidArgument(source + ": binary data, not a YAML text file");
  }
  if (const int line = FlowTooDeep(text)) {
    return InvalidArgument(Origin{source, with_lines ? line : 0}.ToString() + ": nested more than " +
                           std::to_string(kMaxDepth) + " levels deep");
  }
  TreeBuilder builder(source, with_lines);
  builder.root.origin = {source, with_lines ? 1 : 0};
  try {
    std::istringstream in(text);
    YAML::Parser parser(in);
    while (parser.HandleNextDocument(builder)) {
    }
  } catch (const SpecError& e) {
    return e.status;
  } catch (const YAML::Exception& e) {
    Origin at{source, with_lines ? e.mark.line + 1 : 0};
    return InvalidArgument(at.ToString() + ": invalid YAML: " + e.msg);
  } catch (const std::exception& e) {
    return InvalidArgument(source + ": invalid YAML: " + e.what());
  }
  return std::move(builder.root);
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
    return InvalidArgument(flag + ": " + why +
                           "; expected key=value with a path like "
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
    if (static_cast<int>(steps.size()) > kMaxDepth) return bad("deeper than " + std::to_string(kMaxDepth) + " levels");
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

Node::Node() = default;
Node::Node(const Node&) = default;
Node::Node(Node&&) noexcept = default;
Node& Node::operator=(const Node&) = default;
Node& Node::operator=(Node&&) noexcept = default;
Node::~Node() = default;

const Node* Node::Find(const std::string& key) const {
  for (const auto& kv : map) {
    if (kv.first == key) return &kv.second;
  }
  return nullptr;
}

Node* Node::Find(const std::string& key) { return const_cast<Node*>(static_cast<const Node*>(this)->Find(key)); }

const char* Node::KindName() const {
  switch (kind) {
    case Kind::kNull:
      return "nothing";
    case Kind::kScalar:
      return "a value";
    case Kind::kSeq:
      return "a list";
    case Kind::kMap:
      return "a mapping";
  }
  return "?";
}

Result<Node> ParseYaml(const std::string& text, const std::string& source) {
  if (text.size() > kMaxFileBytes) {
    return InvalidArgument(source + ": file is larger than " + std::to_string(kMaxFileBytes >> 20) +
                           " MiB; a job spec is a few kilobytes");
  }
  return ParseWith(text, source, true);
}

void Merge(Node* base, const Node& overlay) {
  if (base->kind != Node::Kind::kMap || overlay.kind != Node::Kind::kMap) {
    *base = overlay;
    return;
  }
  for (const auto& [key, value] : overlay.map) {
    Node* existing = base->Find(key);
    if (value.kind == Node::Kind::kNull) {
      const std::string& gone = key;  // (a structured binding; clang 14 cannot capture one)
      std::erase_if(base->map, [&gone](const auto& kv) { return kv.first == gone; });
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
  std::string text = assignment.substr(eq + 1);
  Node value;
  value.origin = {flag, 0};
  if (text.empty()) {
    value.kind = Node::Kind::kScalar;  // "--set key=" means the empty string
  } else {
    ASSIGN_OR_RETURN(value, ParseWith(text, flag, false));
  }
  Node* cur = root;
  for (size_t i = 0; i < steps.size(); ++i) {
    const PathStep& step = steps[i];
    if (step.index >= 0) {
      if (cur->kind != Node::Kind::kSeq) {
        return InvalidArgument(flag + ": [" + std::to_string(step.index) + "] indexes a list, but that field is " +
                               cur->KindName());
      }
      if (step.index > static_cast<long>(cur->seq.size())) {
        return InvalidArgument(flag + ": index " + std::to_string(step.index) +
                               " is past the end of the list (length " + std::to_string(cur->seq.size()) + ")");
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

}  // namespace trainctl::jobspec
