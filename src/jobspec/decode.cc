// Turns the layered tree into a JobSpec, collecting every problem with its origin.
#include <algorithm>
#include <cctype>
#include <functional>
#include <map>
#include <climits>
#include <optional>
#include <tuple>

#include <nlohmann/json.hpp>

#include "common/address.h"
#include "common/strings.h"
#include "job/task_env.h"
#include "jobspec/job_spec.h"
#include "jobspec/tree.h"

namespace trainctl::jobspec {

Result<JobSpec> Decode(const Node& root);

namespace {

using Kind = Node::Kind;

constexpr int kMaxNodes = 10000;
constexpr int kMaxProcsPerNode = 1024;
constexpr int kMaxRestarts = 100000;

// A dotted Python module name: torch, torchvision.models, _private.
bool IsPythonModuleName(const std::string& name) {
  if (name.empty()) return false;
  bool start = true;
  for (char c : name) {
    if (c == '.') {
      if (start) return false;
      start = true;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_' ||
               (!start && std::isdigit(static_cast<unsigned char>(c)))) {
      start = false;
    } else {
      return false;
    }
  }
  return !start;
}

// What a scalar field takes: the decoder reads any YAML scalar as text.
const nlohmann::json kScalar = {{"type", {"string", "number", "boolean"}}};

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
      std::string hint = guess.empty() ? "expected one of: " + Join(allowed, ", ")
                                       : "did you mean '" + guess + "'?";
      // Fields users put one level too high, as other tools have them.
      static const std::map<std::string, std::string> kBelongs = {
          {"trainer.augment", "trainer.data.augment"}, {"trainer.lr", "trainer.optimizer.lr"},
          {"trainer.momentum", "trainer.optimizer.momentum"}, {"trainer.weight_decay", "trainer.optimizer.weight_decay"},
          {"trainer.shape", "trainer.data.shape"},    {"trainer.dataset", "trainer.data.dataset"},
          {"trainer.layers", "trainer.model.layers"}, {"trainer.torchscript", "trainer.model.torchscript"}};
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
    bool digits = i < s.size() &&
                  std::all_of(s.begin() + i, s.end(), [](char c) { return std::isdigit(c); });
    if (!digits) {
      Error(n, path, expected + ", got " + Quote(s));
      return std::nullopt;
    }
    errno = 0;
    char* end = nullptr;
    long long v = std::strtoll(s.c_str(), &end, 10);
    if (errno == ERANGE || v < min || v > max) {
      Error(n, path, expected + " from " + std::to_string(min) + " to " + std::to_string(max) +
                         ", got " + Quote(s));
      return std::nullopt;
    }
    return v;
  }

  std::optional<double> Double(const Node& n, const std::string& path, double min, double max) {
    const std::string expected = "expected a number from " + FormatNumber(min) + " to " +
                                 FormatNumber(max);
    Note(path, {{"type", "number"}, {"minimum", min}, {"maximum", max}});
    if (!ExpectScalar(n, path, expected)) return std::nullopt;
    char* end = nullptr;
    errno = 0;
    double v = std::strtod(n.scalar.c_str(), &end);
    if (n.scalar.empty() || end != n.scalar.c_str() + n.scalar.size() || errno == ERANGE ||
        !(v >= min && v <= max)) {
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
  std::optional<std::string> OneOf(const Node& n, const std::string& path,
                                   const std::vector<std::string>& allowed) {
    Note(path, {{"type", "string"}, {"enum", allowed}});
    auto s = String(n, path);
    if (!s) return std::nullopt;
    if (std::find(allowed.begin(), allowed.end(), *s) != allowed.end()) return s;
    std::string guess = ClosestMatch(*s, allowed);
    Error(n, path, "expected one of " + Join(allowed, ", ") + ", got " + Quote(*s) +
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

  // trainer.model: a model's name, or {layers: [...]} (jobspec/layers.h).
  void DecodeModel(const Node& n, const std::string& path, TrainerSpec* t) {
    if (schema) return;  // JobSpecSchemaJson describes it
    if (n.kind == Kind::kScalar) {
      if (auto v = OneOf(n, path, {"cnn", "resnet18", "resnet50"})) t->model = *v;
      return;
    }
    if (n.kind != Kind::kMap) {
      Error(n, path, std::string("expected cnn, resnet18, resnet50, {layers: [...]} or {torchscript: model.pt}, got ") +
                         n.KindName());
      return;
    }
    CheckKeys(n, path, {"layers", "torchscript"});
    const Node* layers = Child(n, "layers");
    if (const Node* ts = Child(n, "torchscript")) {
      if (layers) {
        Error(*ts, path + ".torchscript", "goes without layers: a model is declared or loaded, not both");
      } else if (auto v = String(*ts, path + ".torchscript")) {
        if (v->empty()) {
          Error(*ts, path + ".torchscript", "expected the path of a module saved with torch.jit.script(model).save(path)");
        } else {
          t->model = "torchscript";
          t->torchscript = *v;
        }
      }
      return;
    }
    if (!layers) {
      Error(n, path, "expected cnn, resnet18, resnet50, {layers: [...]} or {torchscript: model.pt}, got a mapping "
                     "without either");
      return;
    }
    std::vector<LayerSpec> out;
    if (DecodeLayers(*layers, path + ".layers", 0, &out)) {
      t->model = "layers";
      t->layers = std::move(out);
      model_node_ = &n;
    }
  }

  bool DecodeLayers(const Node& n, const std::string& path, int depth, std::vector<LayerSpec>* out) {
    if (n.kind != Kind::kSeq || n.seq.empty()) {
      Error(n, path, std::string("expected a list of layers such as [{conv: 16}, relu, flatten, linear], got ") +
                         (n.kind == Kind::kSeq ? "an empty list" : n.KindName()));
      return false;
    }
    if (depth >= 8) {
      Error(n, path, "residual blocks nested more than 8 deep");
      return false;
    }
    bool ok = true;
    for (size_t i = 0; i < n.seq.size(); ++i) {
      LayerSpec l;
      if (DecodeLayer(n.seq[i], path + "[" + std::to_string(i) + "]", depth, &l)) {
        out->push_back(std::move(l));
      } else {
        ok = false;
      }
    }
    return ok;
  }

  // A layer: its kind alone (relu), a kind and its size ({conv: 16}), or a kind and its fields
  // ({conv: {channels: 16, stride: 2}}); a residual block's body as {residual: [layers]}.
  bool DecodeLayer(const Node& n, const std::string& path, int depth, LayerSpec* l) {
    using LK = LayerSpec::Kind;
    l->origin = n.origin.ToString();
    std::string kind;
    const Node* args = nullptr;
    if (n.kind == Kind::kScalar) {
      kind = n.scalar;
    } else if (n.kind == Kind::kMap && n.map.size() == 1) {
      kind = n.map[0].first;
      args = n.map[0].second.kind == Kind::kNull ? nullptr : &n.map[0].second;
    } else {
      Error(n, path, "expected a layer: its kind (relu), or a mapping of one kind to its size or fields "
                     "({conv: 16}, {conv: {channels: 16, stride: 2}}), got " +
                         (n.kind == Kind::kMap ? "a mapping of " + std::to_string(n.map.size()) + " keys"
                                               : std::string(n.KindName())));
      return false;
    }
    const std::vector<std::string> kinds = LayerKindNames();
    const auto k = LayerKindFromName(kind);
    if (!k) {
      const std::string guess = ClosestMatch(kind, kinds);
      Error(n, path, "unknown layer " + Quote(kind) + "; " +
                         (guess.empty() ? "expected one of " + Join(kinds, ", ") : "did you mean '" + guess + "'?"));
      return false;
    }
    l->kind = *k;
    const std::string lp = path + "." + kind;
    const size_t before = errors.size();
    auto size_of = [&](const Node& v) {
      switch (*k) {
        case LK::kConv: if (auto x = Int(v, lp, 1, 1 << 16)) l->out = *x; break;
        case LK::kLinear: if (auto x = Int(v, lp, 1, 1 << 24)) l->out = *x; break;
        case LK::kMaxPool:
        case LK::kAvgPool: if (auto x = Int(v, lp, 1, 1024)) l->kernel = *x; break;
        case LK::kDropout: if (auto x = Double(v, lp, 0, 0.999)) l->p = *x; break;
        default: Error(v, lp, kind + " takes no size; expected " + kind + " alone"); break;
      }
    };
    std::vector<std::string> fields;
    switch (*k) {
      case LK::kConv: fields = {"channels", "kernel", "stride", "padding", "groups", "bias", "name"}; break;
      case LK::kLinear: fields = {"features", "bias", "name"}; break;
      case LK::kMaxPool:
      case LK::kAvgPool: fields = {"kernel", "stride", "padding"}; break;
      case LK::kBatchNorm: fields = {"name"}; break;
      case LK::kDropout: fields = {"p"}; break;
      case LK::kResidual: fields = {"layers", "projection", "name"}; break;
      default: break;
    }
    if (!args) {
      if (*k == LK::kConv) Error(n, path, "conv needs its output channels; expected {conv: 16} or {conv: {channels: 16}}");
      if (*k == LK::kResidual) Error(n, path, "expected {residual: [layers]}, the block's body");
    } else if (args->kind == Kind::kScalar) {
      size_of(*args);
    } else if (args->kind == Kind::kSeq && *k == LK::kResidual) {
      DecodeLayers(*args, lp, depth + 1, &l->body);
    } else if (fields.empty()) {
      Error(*args, lp, kind + " takes no fields; expected " + kind + " alone");
    } else if (Section(*args, lp, fields)) {
      const Node& a = *args;
      auto int_in = [this](long long lo, long long hi) {
        return [this, lo, hi](const Node& c, const std::string& fp) { return Int(c, fp, lo, hi); };
      };
      Field(a, lp, "channels", &l->out, int_in(1, 1 << 16));
      Field(a, lp, "features", &l->out, int_in(1, 1 << 24));
      Field(a, lp, "kernel", &l->kernel, int_in(1, 1024));
      Field(a, lp, "stride", &l->stride, int_in(1, 1024));
      Field(a, lp, "padding", &l->padding, int_in(0, 1024));
      Field(a, lp, "groups", &l->groups, int_in(1, 1 << 16));
      Field(a, lp, "bias", &l->bias, [this](const Node& c, const std::string& fp) { return Bool(c, fp); });
      Field(a, lp, "p", &l->p, [this](const Node& c, const std::string& fp) { return Double(c, fp, 0, 0.999); });
      Field(a, lp, "projection", &l->projection, [this](const Node& c, const std::string& fp) {
        return OneOf(c, fp, {"auto", "conv", "none"});
      });
      if (const Node* nm = Child(a, "name")) {
        if (auto v = String(*nm, lp + ".name")) {
          const bool ok = !v->empty() && v->front() != '.' && v->back() != '.' && v->find("..") == std::string::npos &&
                          std::all_of(v->begin(), v->end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.'; });
          if (ok) l->name = *v;
          else Error(*nm, lp + ".name", "expected letters, digits, _ and dots between them (layer1.0), got " + Quote(*v));
        }
      }
      if (*k == LK::kConv && !Child(a, "channels")) Error(a, lp + ".channels", "required; expected the output channels");
      if (*k == LK::kResidual) {
        if (const Node* body = Child(a, "layers")) DecodeLayers(*body, lp + ".layers", depth + 1, &l->body);
        else Error(a, lp + ".layers", "required; expected the block's body, a list of layers");
      }
    }
    return errors.size() == before;
  }

  // After the trainer's data is known: a declared model's names, and its shapes checked.
  void CheckModel(TrainerSpec* t) {
    if (t->model != "layers" || !model_node_) return;
    NameLayers(&t->layers);
    std::vector<std::string> names;
    std::function<void(const std::vector<LayerSpec>&)> collect = [&](const std::vector<LayerSpec>& ls) {
      for (const auto& l : ls) {
        if (!l.name.empty()) {
          if (std::find(names.begin(), names.end(), l.name) != names.end()) {
            errors.emplace_back(model_node_->origin, l.origin + ": trainer.model.layers: two layers are named " +
                                                         Quote(l.name) + "; expected each name once");
          }
          names.push_back(l.name);
        }
        collect(l.body);
      }
    };
    collect(t->layers);
    // An image folder without a shape takes its first picture's, known once it is read.
    if (!ImageShape(t->data).empty()) {
      auto summary = SummarizeModel(t->layers, ImageShape(t->data), ClassCount(t->data));
      if (!summary.ok()) errors.emplace_back(model_node_->origin, summary.status().message());
    }
  }

  void DecodeTrainer(const Node& n, TrainerSpec* t) {
    const std::string p = "trainer";
    if (!Section(n, p, {"strategy", "parameter_server", "model", "data", "epochs", "max_steps", "batch_size", "balance",
                        "global_batch_size", "optimizer", "schedule", "label_smoothing", "seed", "deterministic",
                        "threads", "device", "memory_format", "cudnn_benchmark", "precision", "backend", "bucket_mb", "checkpoint_every", "keep_last", "snapshot_every",
                        "log_every", "timeline_steps", "eval", "eval_every", "resume"})) {
      return;
    }
    t->enabled = true;
    auto int_in = [this](long long lo, long long hi) {
      return [this, lo, hi](const Node& c, const std::string& path) { return Int(c, path, lo, hi); };
    };
    auto num_in = [this](double lo, double hi) {
      return [this, lo, hi](const Node& c, const std::string& path) { return Double(c, path, lo, hi); };
    };
    auto boolean = [this](const Node& c, const std::string& path) { return Bool(c, path); };
    auto one_of = [this](std::vector<std::string> allowed) {
      return [this, allowed](const Node& c, const std::string& path) { return OneOf(c, path, allowed); };
    };
    constexpr long long kBig = 1LL << 40;
    Field(n, p, "strategy", &t->strategy, one_of({"allreduce", "parameter_server"}));
    if (const Node* ps = Child(n, "parameter_server")) {
      const std::string pp = p + ".parameter_server";
      if (Section(*ps, pp, {"mode", "max_staleness"})) {
        Field(*ps, pp, "mode", &t->parameter_server.mode, one_of({"sync", "async"}));
        Field(*ps, pp, "max_staleness", &t->parameter_server.max_staleness, int_in(0, 1 << 20));
      }
    }
    if (const Node* m = Child(n, "model")) DecodeModel(*m, p + ".model", t);
    Field(n, p, "epochs", &t->epochs, int_in(1, 100000));
    Field(n, p, "max_steps", &t->max_steps, int_in(0, kBig));
    Field(n, p, "batch_size", &t->batch_size, int_in(1, 1 << 20));
    Field(n, p, "global_batch_size", &t->global_batch_size, int_in(1, 1 << 30));
    Field(n, p, "label_smoothing", &t->label_smoothing, num_in(0, 0.999));
    Field(n, p, "seed", &t->seed, int_in(0, kBig));
    Field(n, p, "deterministic", &t->deterministic, boolean);
    Field(n, p, "resume", &t->resume, boolean);
    Field(n, p, "threads", &t->threads, int_in(0, 1024));
    Field(n, p, "device", &t->device, one_of({"cpu", "cuda"}));
    Field(n, p, "memory_format", &t->memory_format, one_of({"contiguous", "channels_last"}));
    if (const Node* m = Child(n, "memory_format"); m && t->memory_format == "channels_last" &&
                                                  t->strategy == "parameter_server") {
      Error(*m, p + ".memory_format", "channels_last needs strategy: allreduce (the parameter servers keep "
                                      "contiguous shards); expected contiguous");
    }
    Field(n, p, "balance", &t->balance, one_of({"even", "speed"}));
    if (const Node* b = Child(n, "balance"); b && t->balance == "speed") {
      const char* why = t->deterministic                    ? "it follows the workers' timing, which no two runs share; "
                                                              "expected even with deterministic: true"
                        : t->strategy == "parameter_server" ? "it splits the global batch of an allreduce step; expected "
                                                              "even with strategy: parameter_server"
                        : t->device == "cuda"               ? "a GPU's batches are prepared ahead, and GPUs run alike; "
                                                              "expected even with device: cuda"
                                                            : nullptr;
      if (why) Error(*b, p + ".balance", std::string("speed: ") + why);
    }
    Field(n, p, "cudnn_benchmark", &t->cudnn_benchmark, boolean);
    Field(n, p, "precision", &t->precision, one_of({"fp32", "bf16"}));
    Field(n, p, "backend", &t->backend, one_of({"auto", "gloo", "shm", "nccl"}));
    if (const Node* b = Child(n, "backend"); b && t->backend != "auto" &&
                                             (t->backend == "nccl") != (t->device == "cuda")) {
      Error(*b, p + ".backend", t->device == "cuda"
                                    ? "expected nccl or auto with device: cuda (GPU memory goes through NCCL)"
                                    : "nccl needs device: cuda; expected auto, gloo or shm for the CPU");
    }
    Field(n, p, "bucket_mb", &t->bucket_mb, num_in(0.001, 1024));
    Field(n, p, "checkpoint_every", &t->checkpoint_every, int_in(0, kBig));
    Field(n, p, "keep_last", &t->keep_last, int_in(1, 1000));
    Field(n, p, "snapshot_every", &t->snapshot_every, int_in(0, kBig));
    Field(n, p, "log_every", &t->log_every, int_in(1, kBig));
    Field(n, p, "timeline_steps", &t->timeline_steps, int_in(0, kMaxTimelineSteps));
    Field(n, p, "eval", &t->eval, boolean);
    Field(n, p, "eval_every", &t->eval_every, int_in(1, 100000));

    if (const Node* d = Child(n, "data")) {
      const std::string dp = p + ".data";
      if (Section(*d, dp, {"dataset", "dir", "test_dir", "holdout", "bad_images", "augment", "limit", "test_limit",
                           "samples", "shape", "classes", "load", "threads", "crop_pct"})) {
        DataSpec& ds = t->data;
        Field(*d, dp, "dataset", &ds.dataset,
              one_of({"fashion-mnist", "mnist", "cifar10", "imagefolder", "synthetic"}));
        Field(*d, dp, "dir", &ds.dir, [this](const Node& c, const std::string& path) {
          return String(c, path);
        });
        Field(*d, dp, "test_dir", &ds.test_dir, [this](const Node& c, const std::string& path) {
          return String(c, path);
        });
        Field(*d, dp, "holdout", &ds.holdout, num_in(0, 0.9));
        Field(*d, dp, "bad_images", &ds.bad_images, one_of({"skip", "fail"}));
        if (const Node* a = Child(*d, "augment")) {
          const std::string ap = dp + ".augment";
          if (Section(*a, ap, {"crop_padding", "flip", "random_resized_crop", "scale", "ratio"})) {
            Field(*a, ap, "crop_padding", &ds.crop_padding, int_in(0, 256));
            Field(*a, ap, "flip", &ds.flip, boolean);
            Field(*a, ap, "random_resized_crop", &ds.random_resized_crop, boolean);
            for (const auto& [key, out, lo, hi] : {std::tuple<const char*, std::vector<double>*, double, double>{
                                                       "scale", &ds.scale, 0.0001, 1.0},
                                                   {"ratio", &ds.ratio, 0.01, 100.0}}) {
              const Node* r = Child(*a, key);
              if (!r) continue;
              const std::string rp = ap + "." + key;
              Note(rp, {{"type", "array"}, {"minItems", 2}, {"maxItems", 2}});
              if (r->kind != Kind::kSeq || r->seq.size() != 2) {
                Error(*r, rp, std::string("expected [low, high] such as ") +
                                  (std::string(key) == "scale" ? "[0.08, 1.0]" : "[0.75, 1.333]"));
                continue;
              }
              auto a0 = Double(r->seq[0], rp + "[0]", lo, hi), a1 = Double(r->seq[1], rp + "[1]", lo, hi);
              if (a0 && a1 && *a0 > *a1) Error(*r, rp, "expected [low, high] with low <= high");
              if (a0 && a1) *out = {*a0, *a1};
              if (!ds.random_resized_crop) Error(*r, rp, "goes with random_resized_crop: true");
            }
          }
        }
        Field(*d, dp, "load", &ds.load, one_of({"auto", "stream", "memory"}));
        Field(*d, dp, "threads", &ds.threads, int_in(0, 1024));
        Field(*d, dp, "crop_pct", &ds.crop_pct, num_in(0, 1));  // 0: by augment (job_spec.h)
        Field(*d, dp, "limit", &ds.limit, int_in(0, kBig));
        Field(*d, dp, "test_limit", &ds.test_limit, int_in(0, kBig));
        Field(*d, dp, "samples", &ds.samples, int_in(1, kBig));
        Field(*d, dp, "classes", &ds.classes, int_in(2, 4096));
        if (const Node* sh = Child(*d, "shape")) {
          Note(dp + ".shape", {{"type", "array"}, {"minItems", 3}, {"maxItems", 3}});
          if (schema && sh->kind != Kind::kSeq) Int(Node(), dp + ".shape[0]", 1, 4096);
          if (sh->kind != Kind::kSeq || sh->seq.size() != 3) {
            Error(*sh, dp + ".shape", "expected [channels, rows, cols] such as [3, 32, 32]");
          } else {
            std::vector<int64_t> shape;
            for (size_t i = 0; i < 3; ++i) {
              if (auto v = Int(sh->seq[i], dp + ".shape[" + std::to_string(i) + "]", 1, 4096)) {
                shape.push_back(*v);
              }
            }
            if (shape.size() == 3) ds.shape = shape;
          }
        }
        const bool folder = ds.dataset == "imagefolder";
        if (folder && !Child(*d, "shape")) ds.shape.clear();  // the first training picture's (FolderShape)
        for (const char* key : {"test_dir", "holdout", "bad_images", "load", "threads", "crop_pct"}) {
          if (const Node* k = Child(*d, key); k && !folder) {
            Error(*k, dp + "." + key, "goes with dataset: imagefolder");
          }
        }
        if (ds.random_resized_crop && !folder) {
          Error(*Child(*Child(*d, "augment"), "random_resized_crop"), dp + ".augment.random_resized_crop",
                "goes with dataset: imagefolder (pictures of any size; the other datasets' images have theirs)");
        } else if (ds.random_resized_crop && ds.load == "memory") {
          Error(*Child(*d, "load"), dp + ".load",
                "memory keeps each picture decoded once; augment.random_resized_crop decodes a new crop of it "
                "every epoch: load: stream (or auto)");
        }
        if (const Node* k = Child(*d, "holdout"); k && !ds.test_dir.empty()) {
          Error(*k, dp + ".holdout", "goes without test_dir: the test images come from test_dir, or are held out of dir");
        }
        bool needs_dir = ds.dataset == "mnist" || ds.dataset == "cifar10" || folder;
        if (needs_dir && ds.dir.empty()) {
          Error(*d, dp + ".dir", "required for " + ds.dataset + "; expected the directory with " +
                                     (ds.dataset == "mnist"  ? "the idx files"
                                      : folder               ? "a folder per class of images"
                                                             : "data_batch_N.bin and test_batch.bin"));
        }
      }
    }
    if (const Node* o = Child(n, "optimizer")) {
      const std::string op = p + ".optimizer";
      if (Section(*o, op, {"name", "lr", "momentum", "weight_decay", "nesterov", "beta1", "beta2",
                           "eps"})) {
        OptimizerSpec& os = t->optimizer;
        Field(*o, op, "name", &os.name, one_of({"sgd", "adam"}));
        Field(*o, op, "lr", &os.lr, num_in(0, 100));
        Field(*o, op, "momentum", &os.momentum, num_in(0, 1));
        Field(*o, op, "weight_decay", &os.weight_decay, num_in(0, 10));
        Field(*o, op, "nesterov", &os.nesterov, boolean);
        Field(*o, op, "beta1", &os.beta1, num_in(0, 0.999999));
        Field(*o, op, "beta2", &os.beta2, num_in(0, 0.999999999));
        Field(*o, op, "eps", &os.eps, num_in(0, 1));
      }
    }
    if (const Node* sc = Child(n, "schedule")) {
      const std::string sp = p + ".schedule";
      if (Section(*sc, sp, {"name", "warmup_steps", "step_size", "gamma", "min_lr",
                            "scale_by_world_size"})) {
        ScheduleSpec& ss = t->schedule;
        Field(*sc, sp, "name", &ss.name, one_of({"constant", "step", "cosine", "one_cycle"}));
        Field(*sc, sp, "warmup_steps", &ss.warmup_steps, int_in(0, kBig));
        Field(*sc, sp, "step_size", &ss.step_size, int_in(1, kBig));
        Field(*sc, sp, "gamma", &ss.gamma, num_in(0, 1));
        Field(*sc, sp, "min_lr", &ss.min_lr, num_in(0, 100));
        Field(*sc, sp, "scale_by_world_size", &ss.scale_by_world_size, boolean);
        if (ss.name == "step" && ss.step_size == 0) {
          Error(*sc, sp + ".step_size", "required for the step schedule; expected the number of "
                                        "steps between LR drops, such as 1000");
        }
      }
    }
    CheckModel(t);
  }

  // A program and its first arguments: a list, or one word.
  std::optional<std::vector<std::string>> Command(const Node& n, const std::string& path) {
    Note(path, {{"type", {"string", "array"}}, {"items", kScalar}, {"minItems", 1},
                {"description", "the program and its arguments, such as [python3, train.py]"}});
    if (n.kind == Kind::kScalar) {
      if (n.scalar.find_first_of(" \t") != std::string::npos) {
        Error(n, path, "expected a list such as [python3, train.py], got the string " +
                           Quote(n.scalar) + " (trainctl runs no shell)");
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
      Error(n, path, std::string("expected a list of strings such as [python3, train.py], got ") +
                         n.KindName());
      return std::nullopt;
    }
    std::vector<std::string> out;
    bool ok = true;
    for (size_t i = 0; i < n.seq.size(); ++i) {
      auto s = String(n.seq[i], path + "[" + std::to_string(i) + "]");
      if (s) out.push_back(*s); else ok = false;
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

  void DecodeNodes(const Node& n, NodesSpec* out) {
    const std::string expected =
        "expected a node count (2), a range (\"1:4\") or a mapping {min: 1, max: 4}";
    if (n.kind == Kind::kScalar) {
      size_t colon = n.scalar.find(':');
      if (colon == std::string::npos) {
        if (auto v = Int(n, "nodes", 1, kMaxNodes)) out->min = out->max = static_cast<int>(*v);
        return;
      }
      Node lo = n, hi = n;
      lo.scalar = n.scalar.substr(0, colon);
      hi.scalar = n.scalar.substr(colon + 1);
      auto min = Int(lo, "nodes (min)", 1, kMaxNodes);
      auto max = Int(hi, "nodes (max)", 1, kMaxNodes);
      if (min && max) {
        out->min = static_cast<int>(*min);
        out->max = static_cast<int>(*max);
      }
    } else if (n.kind == Kind::kMap) {
      CheckKeys(n, "nodes", {"min", "max"});
      const Node* min = Child(n, "min");
      const Node* max = Child(n, "max");
      if (!min || !max) {
        Error(n, "nodes", "a mapping needs both min and max, for example {min: 1, max: 4}");
        return;
      }
      auto lo = Int(*min, "nodes.min", 1, kMaxNodes);
      auto hi = Int(*max, "nodes.max", 1, kMaxNodes);
      if (lo && hi) {
        out->min = static_cast<int>(*lo);
        out->max = static_cast<int>(*hi);
      }
    } else {
      Error(n, "nodes", expected + ", got " + n.KindName());
      return;
    }
    if (out->min > out->max) {
      Error(n, "nodes", "min (" + std::to_string(out->min) + ") is larger than max (" +
                            std::to_string(out->max) + ")");
    }
  }

  void DecodeEnv(const Node& n, const std::string& prefix,
                 std::vector<std::pair<std::string, std::string>>* out) {
    Note(prefix, {{"type", "object"}, {"additionalProperties", kScalar},
                  {"propertyNames", {{"pattern", "^[A-Za-z_][A-Za-z0-9_]*$"}}}});
    if (n.kind != Kind::kMap) {
      Error(n, prefix, std::string("expected a mapping of NAME: value, got ") + n.KindName());
      return;
    }
    for (const auto& [key, value] : n.map) {
      std::string path = prefix + "." + key;
      bool valid_name = !key.empty() && !std::isdigit(static_cast<unsigned char>(key[0])) &&
                        std::all_of(key.begin(), key.end(), [](char c) {
                          return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
                        });
      if (!valid_name) {
        Error(value, prefix, "invalid variable name " + Quote(key) +
                                 ": expected letters, digits and _, not starting with a digit");
        continue;
      }
      if (IsReservedEnvName(key)) {
        Error(value, path, "reserved: trainctl sets " + key + " for every task");
        continue;
      }
      if (value.kind == Kind::kNull) {
        out->emplace_back(key, "");
      } else if (auto s = String(value, path)) {
        out->emplace_back(key, *s);
      }
    }
  }

  void DecodeResources(const Node& n, const std::string& p, ResourcesSpec* out) {
    if (n.kind != Kind::kMap) {
      Error(n, p, std::string("expected a mapping {cpus, memory, gpus}, got ") + n.KindName());
      return;
    }
    CheckKeys(n, p, {"cpus", "memory", "gpus"});
    if (const Node* c = Child(n, "cpus")) {
      if (ExpectScalar(*c, p + ".cpus", "expected a CPU count such as 2, 0.5 or 500m")) {
        std::string s = c->scalar;
        double scale = 1;
        if (!s.empty() && s.back() == 'm') {
          s.pop_back();
          scale = 0.001;
        }
        char* end = nullptr;
        double v = std::strtod(s.c_str(), &end);
        if (s.empty() || end != s.c_str() + s.size() || !(v > 0) || v * scale > 1e6) {
          Error(*c, p + ".cpus", "expected a CPU count such as 2, 0.5 or 500m, got " + Quote(c->scalar));
        } else {
          out->cpus = v * scale;
        }
      }
    }
    if (const Node* m = Child(n, "memory")) {
      if (ExpectScalar(*m, p + ".memory", "expected a size such as 4Gi")) {
        auto b = ParseBytes(m->scalar);
        if (b.ok()) out->memory_bytes = *b; else Error(*m, p + ".memory", b.status().message());
      }
    }
    if (const Node* g = Child(n, "gpus")) {
      if (auto v = Int(*g, p + ".gpus", 0, 1024)) out->gpus = static_cast<int>(*v);
    }
  }

  // The `cluster:` section: what `trainctl render` needs for Kubernetes, Slurm and MPI.
  void DecodeCluster(const Node& n, ClusterSpec* c) {
    const std::string p = "cluster";
    if (!Section(n, p, {"image", "image_pull_secret", "namespace", "token_secret", "storage", "stage",
                        "tensorboard", "tensorboard_image", "metrics_port", "pod_monitor", "node_selector",
                        "tolerations"})) {
      return;
    }
    auto image = [&](const Node& v, const std::string& path) -> std::optional<std::string> {
      auto s = String(v, path);
      if (s && (s->empty() || s->find_first_of(" \t\n") != std::string::npos)) {
        Error(v, path, "expected a container image such as registry.example.com/trainctl:1.0, got " +
                           Quote(*s));
        return std::nullopt;
      }
      return s;
    };
    auto name = [&](const Node& v, const std::string& path) -> std::optional<std::string> {
      auto s = String(v, path);
      if (s && !IsDnsLabel(*s)) {
        Error(v, path, "expected a Kubernetes object name (lowercase letters, digits and '-'), got " +
                           Quote(*s));
        return std::nullopt;
      }
      return s;
    };
    Field(n, p, "image", &c->image, image);
    Field(n, p, "tensorboard_image", &c->tensorboard_image, image);
    Field(n, p, "image_pull_secret", &c->image_pull_secret, name);
    Field(n, p, "namespace", &c->namespace_, name);
    Field(n, p, "token_secret", &c->token_secret, name);
    Field(n, p, "tensorboard", &c->tensorboard, [&](const Node& v, const std::string& path) { return Bool(v, path); });
    Field(n, p, "pod_monitor", &c->pod_monitor, [&](const Node& v, const std::string& path) { return Bool(v, path); });
    if (const Node* port = Child(n, "metrics_port")) {
      if (auto v = Int(*port, p + ".metrics_port", 0, 65535)) c->metrics_port = static_cast<int>(*v);
    }
    if (const Node* st = Child(n, "storage")) {
      const std::string sp = p + ".storage";
      if (Section(*st, sp, {"claim", "class", "size", "mount"})) {
        Field(*st, sp, "claim", &c->storage.claim, name);
        Field(*st, sp, "class", &c->storage.storage_class, name);
        Field(*st, sp, "size", &c->storage.size, [&](const Node& v, const std::string& path) {
          auto s = String(v, path);
          static const std::vector<std::string> units = {"", "Ki", "Mi", "Gi", "Ti", "Pi", "k", "M", "G", "T", "P"};
          size_t digits = s ? s->find_first_not_of("0123456789") : 0;
          if (s && (digits == 0 || std::find(units.begin(), units.end(),
                                              s->substr(std::min(digits, s->size()))) == units.end())) {
            Error(v, path, "expected a size such as 100Gi, got " + Quote(*s));
            return std::optional<std::string>();
          }
          return s;
        });
        Field(*st, sp, "mount", &c->storage.mount, [&](const Node& v, const std::string& path) {
          auto s = String(v, path);
          if (s && (s->size() < 2 || (*s)[0] != '/')) {
            Error(v, path, "expected an absolute directory such as /mnt/shared, got " + Quote(*s));
            return std::optional<std::string>();
          }
          return s;
        });
      }
    }
    if (const Node* st = Child(n, "stage")) {
      const std::string sp = p + ".stage";
      if (Section(*st, sp, {"url", "sha256"})) {
        Field(*st, sp, "url", &c->stage.url, [&](const Node& v, const std::string& path) {
          auto s = String(v, path);
          if (s && s->rfind("https://", 0) != 0 && s->rfind("http://", 0) != 0) {
            Error(v, path, "expected an http:// or https:// URL of a dataset archive, got " + Quote(*s));
            return std::optional<std::string>();
          }
          return s;
        });
        Field(*st, sp, "sha256", &c->stage.sha256, [&](const Node& v, const std::string& path) {
          auto s = String(v, path);
          if (s && (s->size() != 64 || s->find_first_not_of("0123456789abcdef") != std::string::npos)) {
            Error(v, path, "expected 64 lowercase hex digits, got " + Quote(*s));
            return std::optional<std::string>();
          }
          return s;
        });
      }
    }
    Note(p + ".node_selector", {{"type", "object"}, {"additionalProperties", kScalar}});
    Note(p + ".tolerations", {{"type", "array"}});
    if (const Node* ns = Child(n, "node_selector")) {
      if (ns->kind != Kind::kMap) {
        Error(*ns, p + ".node_selector", std::string("expected a mapping of label: value, got ") + ns->KindName());
      } else {
        for (const auto& [key, value] : ns->map) {
          if (auto v = String(value, p + ".node_selector." + key)) c->node_selector.emplace_back(key, *v);
        }
      }
    }
    if (const Node* tl = Child(n, "tolerations")) {
      if (tl->kind != Kind::kSeq) {
        Error(*tl, p + ".tolerations", std::string("expected a list of {key, operator, value, effect}, got ") +
                                           tl->KindName());
        return;
      }
      for (size_t i = 0; i < tl->seq.size(); ++i) {
        const std::string tp = p + ".tolerations[" + std::to_string(i) + "]";
        const Node& t = tl->seq[i];
        if (!Section(t, tp, {"key", "operator", "value", "effect"})) continue;
        Toleration tol;
        auto str = [&](const Node& v, const std::string& path) { return String(v, path); };
        Field(t, tp, "key", &tol.key, str);
        Field(t, tp, "value", &tol.value, str);
        Field(t, tp, "operator", &tol.op, [&](const Node& v, const std::string& path) {
          return OneOf(v, path, {"Equal", "Exists"});
        });
        Field(t, tp, "effect", &tol.effect, [&](const Node& v, const std::string& path) {
          return OneOf(v, path, {"NoSchedule", "PreferNoSchedule", "NoExecute"});
        });
        c->tolerations.push_back(tol);
      }
    }
  }

  // What a role says of itself; the rest is resolved once the whole spec is read (ResolveRoles).
  struct RoleFields {
    const Node* node = nullptr;
    bool own_command = false, own_args = false, own_resources = false;
    bool has_success = false, has_on_failure = false, has_finish = false;
  };

  void DecodeRoles(const Node& n, JobSpec* spec, std::vector<RoleFields>* fields) {
    Note("roles", {{"type", "array"}, {"minItems", 1}});
    if (n.kind != Kind::kSeq || n.seq.empty()) {
      Error(n, "roles", std::string("expected a list of roles such as [{name: ps, replicas: 2}, "
                                    "{name: worker, replicas: 4}], got ") +
                            (n.kind == Kind::kSeq ? "an empty list" : n.KindName()));
      return;
    }
    for (size_t i = 0; i < n.seq.size(); ++i) {
      const Node& r = n.seq[i];
      const std::string p = "roles[" + std::to_string(i) + "]";
      if (!Section(r, p, {"name", "replicas", "command", "args", "env", "resources", "success",
                          "on_failure", "finish"})) {
        continue;
      }
      RoleSpec role;
      RoleFields f;
      f.node = &r;
      if (const Node* nm = Child(r, "name")) {
        if (auto s = String(*nm, p + ".name")) {
          if (!IsDnsLabel(*s)) {
            Error(*nm, p + ".name", "expected a role name of lowercase letters, digits and '-' "
                                    "(ps, worker, chief, evaluator, ...), got " + Quote(*s));
          } else if (const RoleSpec* other = FindRole(spec->roles, *s)) {
            Error(*nm, p + ".name", "duplicate role name " + Quote(*s) + "; role names must differ");
            (void)other;
          } else {
            role.name = *s;
          }
        }
      } else {
        Error(r, p + ".name", "required field is missing; expected a role name such as worker");
      }
      if (const Node* c = Child(r, "replicas")) {
        if (auto v = Int(*c, p + ".replicas", 1, kMaxNodes)) role.replicas = static_cast<int>(*v);
      }
      if (const Node* c = Child(r, "command")) {
        if (auto cmd = Command(*c, p + ".command")) role.command = *cmd;
        f.own_command = true;
      }
      if (const Node* c = Child(r, "args")) {
        if (auto list = StringList(*c, p + ".args")) role.args = *list;
        f.own_args = true;
      }
      if (const Node* c = Child(r, "env")) DecodeEnv(*c, p + ".env", &role.env);
      if (const Node* c = Child(r, "resources")) {
        DecodeResources(*c, p + ".resources", &role.resources);
        f.own_resources = true;
      }
      if (const Node* c = Child(r, "success")) {
        if (auto v = Bool(*c, p + ".success")) role.success = *v;
        f.has_success = true;
      }
      if (const Node* c = Child(r, "on_failure")) {
        if (auto v = OneOf(*c, p + ".on_failure", {"restart_job", "restart_task", "ignore"})) {
          role.on_failure = *v;
        }
        f.has_on_failure = true;
      }
      if (const Node* c = Child(r, "finish")) {
        if (auto v = Bool(*c, p + ".finish")) role.finish = *v;
        f.has_finish = true;
      }
      if (role.name.empty()) role.name = "#" + std::to_string(i);  // keeps indices aligned
      spec->roles.push_back(std::move(role));
      fields->push_back(f);
    }
  }

  // Fills in what each role inherits from the job and the defaults that depend on the other
  // roles, and checks the roles fit the rest of the spec.
  void ResolveRoles(const Node& root, JobSpec* spec, const std::vector<RoleFields>& fields) {
    const Node& roles_node = *root.Find("roles");
    const bool trainer = spec->trainer.enabled;
    const bool ps_strategy = trainer && spec->trainer.strategy == "parameter_server";
    if (const Node* ppn = Child(root, "procs_per_node")) {
      Error(*ppn, "procs_per_node", "goes with a job without roles; with roles, give each role's "
                                    "replicas (they are spread over the nodes)");
    }
    if (spec->nodes.min < spec->nodes.max) {
      Error(*root.Find("nodes"), "nodes",
            "a job with roles runs on a fixed number of nodes; expected one count such as 2, got "
            "the range " + std::to_string(spec->nodes.min) + ":" + std::to_string(spec->nodes.max));
    }
    bool decider_named = FindRole(spec->roles, "chief") || FindRole(spec->roles, "launcher");
    int deciders = 0, total = 0;
    for (size_t i = 0; i < spec->roles.size(); ++i) {
      RoleSpec& r = spec->roles[i];
      const RoleFields& f = fields[i];
      const std::string p = "roles[" + std::to_string(i) + "]";
      total += r.replicas;
      if (!f.own_command) {
        r.command = spec->command;
        if (!f.own_args) r.args = spec->args;
      }
      std::vector<std::pair<std::string, std::string>> env = spec->env;
      for (const auto& kv : r.env) {
        auto it = std::find_if(env.begin(), env.end(), [&](const auto& e) { return e.first == kv.first; });
        if (it != env.end()) it->second = kv.second; else env.push_back(kv);
      }
      r.env = std::move(env);
      if (!f.own_resources) r.resources = spec->resources;
      const bool builtin = r.command.empty();
      if (!f.has_success) {
        r.success = decider_named ? (r.name == "chief" || r.name == "launcher")
                                  : (r.name != "ps" && r.name != "evaluator");
      }
      if (!f.has_on_failure) {
        r.on_failure = r.name == "evaluator"                                 ? "ignore"
                       : ps_strategy && spec->trainer.parameter_server.mode == "async" &&
                               builtin && r.name == "worker"
                           ? "restart_task"
                           : "restart_job";
      }
      if (!f.has_finish) r.finish = r.name == "evaluator";
      if (r.success) ++deciders;
      if (builtin && !trainer) {
        Error(*f.node, p + ".command", "required field is missing; expected the role's program, "
                                       "for example command: [python3, " + r.name +
                                           ".py], or a job-wide command or trainer section");
      } else if (builtin) {
        static const std::vector<std::string> parts = {"ps", "worker", "chief", "evaluator"};
        if (std::find(parts.begin(), parts.end(), r.name) == parts.end()) {
          Error(*f.node, p + ".name",
                "the built-in trainer has parts for the roles ps, worker, chief and evaluator; "
                "role " + Quote(r.name) + " needs its own command");
        } else if (r.name == "ps" && !ps_strategy) {
          Error(*f.node, p + ".name", "a ps role of the built-in trainer needs trainer.strategy: "
                                      "parameter_server (give the role its own command to run "
                                      "your own parameter servers)");
        } else if ((r.name == "chief" || r.name == "evaluator") && r.replicas != 1) {
          Error(*f.node, p + ".replicas", "the built-in trainer runs one " + r.name + ", got " +
                                              std::to_string(r.replicas));
        }
      }
    }
    if (deciders == 0) {
      Error(roles_node, "roles", "no role decides the job's success; set success: true on the "
                                 "role whose tasks finish the job (by default chief or launcher, "
                                 "else every role but ps and evaluator)");
    }
    if (ps_strategy) {
      const RoleSpec* ps = FindRole(spec->roles, "ps");
      bool workers = false;
      for (const auto& r : spec->roles) workers = workers || (r.command.empty() && TrainingRole(r.name));
      if (!ps || !ps->command.empty() || !workers) {
        Error(roles_node, "roles", "trainer.strategy: parameter_server needs a ps role and a "
                                   "worker (or chief) role of the built-in trainer");
      }
    }
    if (total < spec->nodes.max) {
      Error(roles_node, "roles", "the roles have " + std::to_string(total) + " task(s) in all, "
                                 "fewer than the " + std::to_string(spec->nodes.max) +
                                 " nodes; every node runs at least one task");
    }
  }

  static bool IsDnsLabel(const std::string& s) {
    if (s.empty() || s.size() > 63) return false;
    auto ok = [](char c) { return (c >= 'a' && c <= 'z') || std::isdigit(c) || c == '-'; };
    return std::all_of(s.begin(), s.end(), ok) && s.front() != '-' && s.back() != '-';
  }
};

const std::vector<std::string> kTopLevel = {
    "name",      "nodes",       "procs_per_node", "cpu_bind",   "command",    "args",
    "env",       "working_dir", "resources",      "restart",    "timeouts",
    "rendezvous", "output_dir", "checkpoint_dir", "trainer",    "cluster",
    "roles",     "preload"};

}  // namespace

Result<JobSpec> DecodeWith(Decoder& d, const Node& root) {
  JobSpec spec;
  if (root.kind == Kind::kNull) {
    return InvalidArgument(root.origin.source +
                           ": empty job spec; expected a mapping with at least 'name' and 'command'");
  }
  if (root.kind != Kind::kMap) {
    return InvalidArgument(root.origin.ToString() + ": expected a mapping of job fields (name: ..., "
                           "command: [...]), got " + root.KindName());
  }
  d.CheckKeys(root, "", kTopLevel);

  if (const Node* n = Decoder::Child(root, "name")) {
    if (auto s = d.String(*n, "name")) {
      if (Decoder::IsDnsLabel(*s)) {
        spec.name = *s;
      } else {
        d.Error(*n, "name", "expected lowercase letters, digits and '-' (a DNS label, at most 63 "
                            "characters, as Kubernetes names need), got " + Quote(*s));
      }
    }
  } else {
    d.Error(root, "name", "required field is missing; expected a job name such as my-job");
  }

  if (const Node* n = Decoder::Child(root, "nodes")) d.DecodeNodes(*n, &spec.nodes);
  if (const Node* n = Decoder::Child(root, "procs_per_node")) {
    if (auto v = d.Int(*n, "procs_per_node", 1, kMaxProcsPerNode)) spec.procs_per_node = static_cast<int>(*v);
  }
  if (const Node* n = Decoder::Child(root, "cpu_bind")) {
    if (auto v = d.OneOf(*n, "cpu_bind", {"none", "cores"})) spec.cpu_bind = *v;
  }

  const Node* trainer = Decoder::Child(root, "trainer");
  if (trainer) d.DecodeTrainer(*trainer, &spec.trainer);
  const Node* roles = Decoder::Child(root, "roles");
  std::vector<Decoder::RoleFields> role_fields;
  if (roles) d.DecodeRoles(*roles, &spec, &role_fields);
  const Node* command = Decoder::Child(root, "command");
  if (trainer && command) {
    d.Error(*command, "command", "a job runs either its own program (command) or the built-in "
                                 "trainer (trainer), not both; remove one");
    if (d.schema) (void)d.Command(*command, "command");  // schema mode reads both
  } else if (const Node* n = command) {
    if (auto c = d.Command(*n, "command")) spec.command = *c;
  } else if (!trainer && !roles) {
    d.Error(root, "command", "required field is missing; expected the worker program, for example "
                             "command: [python3, train.py], or a trainer: section for the built-in "
                             "trainer");
  }
  if (const Node* n = Decoder::Child(root, "args")) {
    if (auto list = d.StringList(*n, "args")) spec.args = *list;
  }
  if (const Node* n = Decoder::Child(root, "env")) d.DecodeEnv(*n, "env", &spec.env);
  if (const Node* n = Decoder::Child(root, "working_dir")) {
    if (auto s = d.String(*n, "working_dir")) spec.working_dir = *s;
  }
  if (const Node* n = Decoder::Child(root, "preload")) {
    if (auto list = d.StringList(*n, "preload")) {
      for (size_t i = 0; i < list->size(); ++i) {
        if (!IsPythonModuleName((*list)[i])) {
          d.Error(n->seq[i], "preload[" + std::to_string(i) + "]",
                  "expected a Python module name such as torch or torchvision.models, got " + Quote((*list)[i]));
        }
      }
      spec.preload = *list;
    }
  }
  if (const Node* n = Decoder::Child(root, "resources")) d.DecodeResources(*n, "resources", &spec.resources);

  if (const Node* n = Decoder::Child(root, "restart")) {
    if (n->kind != Kind::kMap) {
      d.Error(*n, "restart", std::string("expected a mapping {max_restarts, backoff, backoff_max}, got ") + n->KindName());
    } else {
      d.CheckKeys(*n, "restart", {"max_restarts", "backoff", "backoff_max"});
      if (const Node* m = Decoder::Child(*n, "max_restarts")) {
        if (auto v = d.Int(*m, "restart.max_restarts", 0, kMaxRestarts)) {
          spec.restart.max_restarts = static_cast<int>(*v);
        }
      }
      if (const Node* m = Decoder::Child(*n, "backoff")) {
        if (auto v = d.DurationField(*m, "restart.backoff")) spec.restart.backoff = *v;
      }
      if (const Node* m = Decoder::Child(*n, "backoff_max")) {
        if (auto v = d.DurationField(*m, "restart.backoff_max")) spec.restart.backoff_max = *v;
      }
    }
  }
  if (const Node* n = Decoder::Child(root, "timeouts")) {
    if (n->kind != Kind::kMap) {
      d.Error(*n, "timeouts", std::string("expected a mapping {rendezvous, stop_grace, job, last_call, heartbeat, collective, finish}, got ") +
                                  n->KindName());
    } else {
      d.CheckKeys(*n, "timeouts",
                  {"rendezvous", "stop_grace", "job", "last_call", "heartbeat", "collective", "finish"});
      struct { const char* key; Duration* out; bool zero_ok; } fields[] = {
          {"rendezvous", &spec.timeouts.rendezvous, false},
          {"stop_grace", &spec.timeouts.stop_grace, true},
          {"job", &spec.timeouts.job, true},
          {"last_call", &spec.timeouts.last_call, true},
          {"heartbeat", &spec.timeouts.heartbeat, false},
          {"collective", &spec.timeouts.collective, false},
          {"finish", &spec.timeouts.finish, true}};
      for (auto& f : fields) {
        const Node* m = Decoder::Child(*n, f.key);
        if (!m) continue;
        std::string path = std::string("timeouts.") + f.key;
        if (auto v = d.DurationField(*m, path)) {
          if (!f.zero_ok && v->count() == 0) {
            d.Error(*m, path, "must be longer than 0s");
          } else {
            *f.out = *v;
          }
        }
      }
    }
  }
  if (const Node* n = Decoder::Child(root, "rendezvous")) {
    if (auto url = d.String(*n, "rendezvous")) {
      if (auto parsed = ParseEtcdUrl(*url); parsed.ok()) {
        spec.rendezvous = *url;
      } else {
        d.Error(*n, "rendezvous", parsed.status().message() +
                                      " (leave the field out for the embedded store)");
      }
    }
  }
  if (const Node* n = Decoder::Child(root, "output_dir")) {
    if (auto s = d.String(*n, "output_dir")) spec.output_dir = *s;
  }
  if (const Node* n = Decoder::Child(root, "checkpoint_dir")) {
    if (auto s = d.String(*n, "checkpoint_dir")) spec.checkpoint_dir = *s;
  }

  if (const Node* n = Decoder::Child(root, "cluster")) d.DecodeCluster(*n, &spec.cluster);
  if (roles && !spec.roles.empty() && role_fields.size() == spec.roles.size()) {
    d.ResolveRoles(root, &spec, role_fields);
  }
  if (trainer && !roles && spec.trainer.strategy == "parameter_server") {
    d.Error(*trainer->Find("strategy"), "trainer.strategy",
            "parameter_server needs roles: a ps role and a worker role, for example roles: "
            "[{name: ps, replicas: 1}, {name: worker, replicas: 2}]");
  }

  if (trainer && spec.trainer.global_batch_size > 0 &&
      spec.trainer.global_batch_size % TrainingWorkers(spec) != 0) {
    const Node* g = trainer->Find("global_batch_size");
    d.Error(*g, "trainer.global_batch_size",
            "expected a multiple of the number of training workers (" +
                std::to_string(TrainingWorkers(spec)) +
                (spec.roles.empty() ? " = nodes x procs_per_node" : " = chief and worker replicas") +
                "), got " + std::to_string(spec.trainer.global_batch_size));
  }
  if (trainer && !spec.args.empty()) {
    d.Error(*root.Find("args"), "args", "args go with command; the built-in trainer takes its "
                                        "settings from the trainer section");
  }
  if (!d.errors.empty()) return InvalidArgument(d.Report());
  if (spec.output_dir.empty()) spec.output_dir = "runs/" + spec.name;
  if (spec.checkpoint_dir.empty()) spec.checkpoint_dir = spec.output_dir + "/checkpoints";
  return spec;
}

Result<JobSpec> Decode(const Node& root) {
  Decoder d;
  return DecodeWith(d, root);
}

Result<std::vector<LayerSpec>> DecodeLayerList(const Node& n, const std::string& path) {
  Decoder d;
  std::vector<LayerSpec> layers;
  d.DecodeLayers(n, path, 0, &layers);
  if (!d.errors.empty()) return InvalidArgument(d.Report());
  return layers;
}

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
  schema["properties"]["nodes"] = {
      {"description", "a node count (2), a range (\"1:4\") or a mapping {min: 1, max: 4}"},
      {"anyOf", {{{"type", "integer"}, {"minimum", 1}, {"maximum", kMaxNodes}},
                 {{"type", "string"}, {"pattern", "^[0-9]+:[0-9]+$"}},
                 range}}};
  // trainer.model: a name, or a declared model whose layers nest (a residual block's body).
  nlohmann::json layers = {{"type", "array"}, {"minItems", 1}, {"items", {{"$ref", "#/definitions/layer"}}}};
  auto fields = [](nlohmann::json props) {
    return nlohmann::json{{"type", "object"}, {"additionalProperties", false}, {"properties", std::move(props)}};
  };
  const nlohmann::json count = {{"type", "integer"}, {"minimum", 1}};
  const nlohmann::json name = {{"type", "string"}, {"pattern", "^[A-Za-z0-9_]+(\\.[A-Za-z0-9_]+)*$"},
                               {"description", "the parameters' prefix in checkpoints (conv1, layer1.0)"}};
  const nlohmann::json window = fields({{"kernel", count}, {"stride", count},
                                        {"padding", {{"type", "integer"}, {"minimum", 0}}}});
  nlohmann::json kinds = nlohmann::json::array();
  kinds.push_back({{"enum", {"relu", "gelu", "flatten", "global_avgpool", "batchnorm", "dropout", "maxpool",
                             "avgpool", "linear"}},
                   {"description", "a layer with its defaults (linear: the classes, as the last layer)"}});
  auto one = [&](const std::string& kind, nlohmann::json shorthand, nlohmann::json object) {
    nlohmann::json alt = {{"type", "object"}, {"additionalProperties", false}, {"required", {kind}}, {"minProperties", 1},
                          {"maxProperties", 1}};
    alt["properties"][kind] = {{"anyOf", {std::move(shorthand), std::move(object)}}};
    kinds.push_back(std::move(alt));
  };
  one("conv", count, fields({{"channels", count}, {"kernel", count}, {"stride", count},
                             {"padding", {{"type", "integer"}, {"minimum", 0}}}, {"groups", count},
                             {"bias", {{"type", "boolean"}}}, {"name", name}}));
  one("linear", count, fields({{"features", count}, {"bias", {{"type", "boolean"}}}, {"name", name}}));
  one("maxpool", count, window);
  one("avgpool", count, window);
  one("batchnorm", {{"type", "null"}}, fields({{"name", name}}));
  one("dropout", {{"type", "number"}, {"minimum", 0}, {"exclusiveMaximum", 1}},
      fields({{"p", {{"type", "number"}, {"minimum", 0}, {"exclusiveMaximum", 1}}}}));
  one("residual", layers, fields({{"layers", layers}, {"projection", {{"enum", {"auto", "conv", "none"}}}}, {"name", name}}));
  schema["definitions"]["layer"] = {{"anyOf", kinds}};
  schema["properties"]["trainer"]["properties"]["model"] = {
      {"description", "cnn, resnet18, resnet50, a model declared as a list of layers, or a TorchScript module's "
                      "path (docs/trainer.md)"},
      {"anyOf", {{{"enum", {"cnn", "resnet18", "resnet50"}}},
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
