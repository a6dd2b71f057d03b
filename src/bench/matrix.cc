#include "bench/matrix.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <regex>
#include <set>

#include "common/fs.h"
#include "common/strings.h"

namespace trainctl::bench {
namespace {

std::string Where(const std::string& path, const YAML::Node& n, const std::string& field) {
  return path + ":" + std::to_string(n.Mark().line + 1) + ": " + field + ": ";
}

// A value as YAML text that --set parses back to the same value.
std::string Text(const YAML::Node& n) {
  if (n.IsScalar()) {
    if (n.Tag() != "!") return n.Scalar();  // plain: its own text (numbers stay numbers)
    YAML::Emitter e;
    e << YAML::DoubleQuoted << n.Scalar();
    return e.c_str();
  }
  YAML::Emitter e;
  e << YAML::Flow << n;
  return e.c_str();
}

std::string Dir(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string Resolve(const std::string& dir, const std::string& file) {
  return file.empty() || file[0] == '/' ? file : dir + "/" + file;
}

bool Matches(const Point& p, const Point& pattern) {
  for (const auto& want : pattern) {
    auto it = std::find_if(p.begin(), p.end(), [&](const auto& kv) { return kv.first == want.first; });
    if (it == p.end() || it->second != want.second) return false;
  }
  return true;
}

std::string Sanitize(const std::string& s) {
  std::string out;
  for (char c : s) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-') ? c : '_';
  return out;
}

}  // namespace

namespace {

// Reads a matrix file's fields into `m`, each error with its line and field, all of them at once.
class MatrixParser {
 public:
  MatrixParser(const YAML::Node& root, const std::string& path) : root(root), path(path), dir(Dir(path)) {
    m.path = path;
  }

  Result<Matrix> Parse() {
    Known();
    SpecAndLayers();
    AxesAndPoints();
    RunFields();
    Peers();
    if (!errors.empty()) {
      std::string all;
      for (const auto& e : errors) all += (all.empty() ? "" : "\n") + e;
      return InvalidArgument(all);
    }
    return m;  // no axes and no points: one point, the spec as it is
  }

 private:
  void Error(const YAML::Node& n, const std::string& field, const std::string& what) {
    errors.push_back(Where(path, n, field) + what);
  }

  void Known() {
    static const std::set<std::string> known = {"name",    "spec",    "layers",  "set",      "axes",
                                                "include", "exclude", "repeats", "parallel", "target_accuracy",
                                                "peers",   "target",  "upload"};
    for (const auto& kv : root) {
      const std::string key = kv.first.as<std::string>();
      if (!known.count(key)) {
        Error(kv.first, key,
              "unknown field; expected one of name, spec, layers, set, axes, include, exclude, "
              "repeats, parallel, target_accuracy, peers, target, upload");
      }
    }
  }

  void IntField(const char* key, int lo, int hi, int* out) {
    const YAML::Node n = root[key];
    if (!n) return;
    int v = 0;
    if (!n.IsScalar() || !YAML::convert<int>::decode(n, v) || v < lo || v > hi) {
      Error(n, key,
            "expected a whole number from " + std::to_string(lo) + " to " + std::to_string(hi) + ", got " +
                (n.IsScalar() ? "\"" + n.Scalar() + "\"" : std::string("a collection")));
      return;
    }
    *out = v;
  }

  void SpecAndLayers() {
    if (const YAML::Node n = root["name"];
        n && n.IsScalar() && !n.Scalar().empty() && n.Scalar().find_first_of("/ \t\n") == std::string::npos) {
      m.name = n.Scalar();
    } else {
      Error(n ? n : root, "name", "expected the bench's name (no '/' or spaces), the folder its results go in");
    }
    if (const YAML::Node n = root["spec"]; n && n.IsScalar() && !n.Scalar().empty()) {
      m.spec_file = Resolve(dir, n.Scalar());
      if (!Exists(m.spec_file)) Error(n, "spec", "no such file: " + m.spec_file);
    } else if (n && n.IsMap()) {
      m.inline_spec = YAML::Dump(n) + "\n";
    } else {
      Error(n ? n : root, "spec", "expected a job spec: a file (relative to this one) or a mapping");
    }
    if (const YAML::Node n = root["layers"]) {
      if (!n.IsSequence()) Error(n, "layers", "expected a list of spec files");
      for (size_t i = 0; n.IsSequence() && i < n.size(); ++i) {
        const std::string f = n[i].IsScalar() ? Resolve(dir, n[i].Scalar()) : "";
        if (f.empty() || !Exists(f)) Error(n[i], "layers[" + std::to_string(i) + "]", "no such file: " + f);
        m.layers.push_back(f);
      }
    }
    if (const YAML::Node n = root["set"]) {
      if (!n.IsMap()) Error(n, "set", "expected a mapping of field: value, as --set takes them");
      for (const auto& kv : n) m.sets.push_back(kv.first.as<std::string>() + "=" + Text(kv.second));
    }
  }

  void AxesAndPoints() {
    if (const YAML::Node n = root["axes"]) {
      if (!n.IsMap()) Error(n, "axes", "expected a mapping of field: [values...]");
      for (const auto& kv : n) {
        const std::string key = kv.first.as<std::string>();
        if (!kv.second.IsSequence() || kv.second.size() == 0) {
          Error(kv.second, "axes." + key, "expected a non-empty list of values");
          continue;
        }
        std::vector<std::string> values;
        for (const auto& v : kv.second) values.push_back(Text(v));
        m.axes.emplace_back(key, values);
      }
    }
    for (const char* which : {"include", "exclude"}) {
      const YAML::Node n = root[which];
      if (!n) continue;
      if (!n.IsSequence()) Error(n, which, "expected a list of {field: value, ...} points");
      for (size_t i = 0; n.IsSequence() && i < n.size(); ++i) {
        if (!n[i].IsMap() || n[i].size() == 0) {
          Error(n[i], std::string(which) + "[" + std::to_string(i) + "]", "expected a mapping of field: value");
          continue;
        }
        Point p;
        for (const auto& kv : n[i]) p.emplace_back(kv.first.as<std::string>(), Text(kv.second));
        (std::string(which) == "include" ? m.include : m.exclude).push_back(p);
      }
    }
  }

  void RunFields() {
    IntField("repeats", 1, 1000, &m.repeats);
    IntField("parallel", 1, 256, &m.parallel);
    if (const YAML::Node n = root["target_accuracy"]) {
      double v = -1;
      if (!n.IsScalar() || !YAML::convert<double>::decode(n, v) || v <= 0 || v > 1) {
        Error(n, "target_accuracy", "expected a test accuracy between 0 and 1, such as 0.9");
      }
      m.target_accuracy = v;
    }
    if (const YAML::Node n = root["upload"]) {
      if (!n.IsMap() || !n["url"] || !n["url"].IsScalar()) {
        Error(n, "upload", "expected {url: s3://BUCKET/PREFIX, endpoint: URL, region: NAME}");
      } else {
        for (const auto& kv : n) {
          const std::string k = kv.first.as<std::string>();
          if (k != "url" && k != "endpoint" && k != "region") {
            Error(kv.first, "upload." + k, "unknown field; expected url, endpoint or region");
          } else if (!kv.second.IsScalar()) {
            Error(kv.second, "upload." + k, "expected a string");
          }
        }
        m.upload.url = n["url"].Scalar();
        if (n["endpoint"] && n["endpoint"].IsScalar()) m.upload.endpoint = n["endpoint"].Scalar();
        if (n["region"] && n["region"].IsScalar()) m.upload.region = n["region"].Scalar();
        if (m.upload.url.rfind("s3://", 0) != 0) Error(n["url"], "upload.url", "expected s3://BUCKET[/PREFIX]");
      }
    }
    if (const YAML::Node n = root["target"]) {
      if (!n.IsScalar() || (n.Scalar() != "local" && n.Scalar() != "slurm" && n.Scalar() != "k8s")) {
        Error(n, "target",
              "expected local (this machine), slurm (an sbatch per experiment) or k8s (an Argo "
              "Workflow, submitted with kubectl)");
      } else {
        m.target = n.Scalar();
      }
    }
  }

  // A peer's {field} must be a field the points give a value (or {repeat}); anything else would
  // reach the peer as literal text.
  void CheckHoles(const YAML::Node& at, const std::string& field, const std::string& text,
                  const std::vector<std::string>& fields) {
    static const std::regex hole(R"(\{([A-Za-z_][A-Za-z0-9_.\[\]-]*)\})");
    for (std::sregex_iterator it(text.begin(), text.end(), hole), end; it != end; ++it) {
      const std::string name = (*it)[1];
      if (std::find(fields.begin(), fields.end(), name) != fields.end()) continue;
      const std::string near = ClosestMatch(name, fields);
      Error(at, field,
            "{" + name + "} names no axis of the matrix" + (near.empty() ? "" : "; did you mean {" + near + "}?") +
                " (placeholders: {" + Join(fields, "}, {") + "})");
    }
  }

  void Peers() {
    std::vector<std::string> fields = {"repeat"};
    for (const auto& [k, v] : m.axes) fields.push_back(k);
    for (const auto& p : m.include) {
      for (const auto& [k, v] : p) fields.push_back(k);
    }
    if (const YAML::Node n = root["peers"]) {
      if (!n.IsSequence()) Error(n, "peers", "expected a list of {name, command}");
      std::set<std::string> names = {"trainctl"};
      for (size_t i = 0; n.IsSequence() && i < n.size(); ++i) {
        const std::string field = "peers[" + std::to_string(i) + "]";
        if (!n[i].IsMap()) {
          Error(n[i], field, "expected {name, command}");
          continue;
        }
        Peer p;
        if (n[i]["name"] && n[i]["name"].IsScalar()) p.name = n[i]["name"].Scalar();
        if (p.name.empty() || p.name != Sanitize(p.name) || !names.insert(p.name).second) {
          Error(n[i], field + ".name", "expected a name of its own (letters, digits, '.', '-'), not \"trainctl\"");
        }
        const YAML::Node c = n[i]["command"];
        if (!c || !c.IsSequence() || c.size() == 0) {
          Error(n[i], field + ".command", "expected the program and its arguments as a list");
        } else {
          for (const auto& a : c) p.command.push_back(a.IsScalar() ? a.Scalar() : Text(a));
          for (size_t j = 0; j < c.size(); ++j) {
            CheckHoles(c[j], field + ".command[" + std::to_string(j) + "]", p.command[j], fields);
          }
        }
        if (const YAML::Node w = n[i]["workers"]) {
          int count = 0;
          if (w.IsScalar() && (w.Scalar().find('{') != std::string::npos ||
                               (YAML::convert<int>::decode(w, count) && count >= 1 && count <= 1000000))) {
            p.workers = w.Scalar();
            CheckHoles(w, field + ".workers", p.workers, fields);
          } else {
            Error(w, field + ".workers", "expected the peer's number of worker processes, or \"{field}\"");
          }
        }
        m.peers.push_back(p);
      }
    }
  }

  const YAML::Node root;
  const std::string path, dir;
  Matrix m;
  std::vector<std::string> errors;
};

Result<Matrix> Parse(const std::string& text, const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return InvalidArgument(path + ":" + std::to_string(e.mark.line + 1) + ": not YAML: " + e.msg);
  }
  if (!root.IsMap()) return InvalidArgument(path + ": expected a mapping (name, spec, axes, ...)");
  return MatrixParser(root, path).Parse();
}

}  // namespace

Result<Matrix> ParseMatrix(const std::string& text, const std::string& path) {
  try {
    return Parse(text, path);
  } catch (const YAML::Exception& e) {  // a shape the checks above did not foresee (a key that is a list...)
    return InvalidArgument(path + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
}

Result<Matrix> LoadMatrix(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path, 1 << 20));
  return ParseMatrix(text, path);
}

std::vector<Point> Points(const Matrix& m) {
  std::vector<Point> points = {{}};
  for (const auto& [key, values] : m.axes) {
    std::vector<Point> next;
    for (const auto& p : points) {
      for (const auto& v : values) {
        Point q = p;
        q.emplace_back(key, v);
        next.push_back(q);
      }
    }
    points = next;
  }
  std::vector<Point> out;
  for (const auto& p : points) {
    if (std::none_of(m.exclude.begin(), m.exclude.end(), [&](const Point& x) { return Matches(p, x); })) {
      out.push_back(p);
    }
  }
  if (m.axes.empty() && !m.include.empty()) out.clear();  // only the included points
  for (const auto& p : m.include) {
    if (std::none_of(out.begin(), out.end(), [&](const Point& x) { return x == p; })) out.push_back(p);
  }
  return out;
}

std::vector<Experiment> Experiments(const Matrix& m) {
  std::vector<Experiment> out;
  const auto points = Points(m);
  for (int r = 0; r < m.repeats; ++r) {
    for (const auto& p : points) {
      std::string values;
      for (const auto& [k, v] : p) values += "-" + Sanitize(k + "=" + v);
      const std::string rep = m.repeats > 1 ? "-r" + std::to_string(r + 1) : "";
      out.push_back({"trainctl" + values + rep, "trainctl", p, r, {}});
      for (const auto& peer : m.peers) {
        Experiment e{peer.name + values + rep, peer.name, p, r, {}};
        auto filled = [&](std::string a) {
          auto fill = [&a](const std::string& hole, const std::string& v) {
            for (size_t at; (at = a.find(hole)) != std::string::npos;) a.replace(at, hole.size(), v);
          };
          for (const auto& [k, v] : p) fill("{" + k + "}", v);
          fill("{repeat}", std::to_string(r));  // 0-based: a seed of its own for each repeat
          return a;
        };
        for (const std::string& a : peer.command) e.command.push_back(filled(a));
        if (!peer.workers.empty()) e.workers = std::max(0, std::atoi(filled(peer.workers).c_str()));
        out.push_back(e);
      }
    }
  }
  return out;
}

Result<JobSpec> ExperimentSpec(const Matrix& m, const std::string& base_file, const Point& point,
                               const std::string& output_dir, int repeat) {
  SpecSources src;
  src.files = {base_file};
  src.files.insert(src.files.end(), m.layers.begin(), m.layers.end());
  src.sets = m.sets;
  for (const auto& [k, v] : point) src.sets.push_back(k + "=" + v);
  YAML::Emitter quoted;
  quoted << YAML::DoubleQuoted << output_dir;
  src.sets.push_back(std::string("output_dir=") + quoted.c_str());
  // Its own job name, so `ps` and `logs JOB` keep the spec's name for the user's own runs.
  std::string name = "bench-";
  for (char c : m.name) name += std::isalnum(static_cast<unsigned char>(c)) ? static_cast<char>(std::tolower(c)) : '-';
  name = name.substr(0, 63);
  while (name.back() == '-') name.pop_back();
  src.sets.push_back("name=" + name);
  ASSIGN_OR_RETURN(JobSpec spec, LoadJobSpec(src));
  spec.trainer.seed += repeat;
  return spec;
}

}  // namespace trainctl::bench
