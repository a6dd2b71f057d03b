// Where a job runs: its nodes, its environment, its resources and its cluster section.
#include "common/address.h"
#include "job/task_env.h"
#include "jobspec/decoder.h"

namespace trainctl::jobspec {

namespace {

// Readers for Decoder::Field: a container image (no spaces), a Kubernetes object's name.
auto ImageReader(Decoder& d) {
  return [&d](const Node& v, const std::string& path) -> std::optional<std::string> {
    auto s = d.String(v, path);
    if (s && (s->empty() || s->find_first_of(" \t\n") != std::string::npos)) {
      d.Error(v, path, "expected a container image such as registry.example.com/trainctl:1.0, got " + Quote(*s));
      return std::nullopt;
    }
    return s;
  };
}

auto NameReader(Decoder& d) {
  return [&d](const Node& v, const std::string& path) -> std::optional<std::string> {
    auto s = d.String(v, path);
    if (s && !Decoder::IsDnsLabel(*s)) {
      d.Error(v, path, "expected a Kubernetes object name (lowercase letters, digits and '-'), got " + Quote(*s));
      return std::nullopt;
    }
    return s;
  };
}

}  // namespace

void Decoder::DecodeNodes(const Node& n, NodesSpec* out) {
  const std::string expected = "expected a node count (2), a range (\"1:4\") or a mapping {min: 1, max: 4}";
  if (n.kind == Kind::kScalar) {
    size_t colon = n.scalar.find(':');
    if (colon == std::string::npos) {
      if (auto v = Int(n, "nodes", 1, kMaxJobNodes)) out->min = out->max = static_cast<int>(*v);
      return;
    }
    Node lo = n, hi = n;
    lo.scalar = n.scalar.substr(0, colon);
    hi.scalar = n.scalar.substr(colon + 1);
    auto min = Int(lo, "nodes (min)", 1, kMaxJobNodes);
    auto max = Int(hi, "nodes (max)", 1, kMaxJobNodes);
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
    auto lo = Int(*min, "nodes.min", 1, kMaxJobNodes);
    auto hi = Int(*max, "nodes.max", 1, kMaxJobNodes);
    if (lo && hi) {
      out->min = static_cast<int>(*lo);
      out->max = static_cast<int>(*hi);
    }
  } else {
    Error(n, "nodes", expected + ", got " + n.KindName());
    return;
  }
  if (out->min > out->max) {
    Error(n, "nodes", "min (" + std::to_string(out->min) + ") is larger than max (" + std::to_string(out->max) + ")");
  }
}

void Decoder::DecodeEnv(const Node& n, const std::string& prefix,
                        std::vector<std::pair<std::string, std::string>>* out) {
  Note(prefix, {{"type", "object"},
                {"additionalProperties", kScalar},
                {"propertyNames", {{"pattern", "^[A-Za-z_][A-Za-z0-9_]*$"}}}});
  if (n.kind != Kind::kMap) {
    Error(n, prefix, std::string("expected a mapping of NAME: value, got ") + n.KindName());
    return;
  }
  for (const auto& [key, value] : n.map) {
    std::string path = prefix + "." + key;
    bool valid_name = !key.empty() && !std::isdigit(static_cast<unsigned char>(key[0])) &&
                      std::all_of(key.begin(), key.end(),
                                  [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
    if (!valid_name) {
      Error(value, prefix,
            "invalid variable name " + Quote(key) + ": expected letters, digits and _, not starting with a digit");
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

void Decoder::DecodeResources(const Node& n, const std::string& p, ResourcesSpec* out) {
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
      if (b.ok())
        out->memory_bytes = *b;
      else
        Error(*m, p + ".memory", b.status().message());
    }
  }
  if (const Node* g = Child(n, "gpus")) {
    if (auto v = Int(*g, p + ".gpus", 0, 1024)) out->gpus = static_cast<int>(*v);
  }
}

// The `cluster:` section: what `trainctl render` needs for Kubernetes, Slurm and MPI.
void Decoder::DecodeCluster(const Node& n, ClusterSpec* c) {
  const std::string p = "cluster";
  if (!Section(n, p,
               {"image", "image_pull_secret", "namespace", "token_secret", "storage", "stage", "tensorboard",
                "tensorboard_image", "eval_resources", "tensorboard_resources", "metrics_port", "pod_monitor",
                "node_selector", "tolerations"})) {
    return;
  }
  auto image = ImageReader(*this);
  auto name = NameReader(*this);
  Field(n, p, "image", &c->image, image);
  Field(n, p, "tensorboard_image", &c->tensorboard_image, image);
  Field(n, p, "image_pull_secret", &c->image_pull_secret, name);
  Field(n, p, "namespace", &c->namespace_, name);
  Field(n, p, "token_secret", &c->token_secret, name);
  Field(n, p, "tensorboard", &c->tensorboard, Boolean());
  Field(n, p, "pod_monitor", &c->pod_monitor, Boolean());
  if (const Node* port = Child(n, "metrics_port")) {
    if (auto v = Int(*port, p + ".metrics_port", 0, 65535)) c->metrics_port = static_cast<int>(*v);
  }
  if (const Node* r = Child(n, "eval_resources")) DecodeResources(*r, p + ".eval_resources", &c->eval_resources);
  if (const Node* r = Child(n, "tensorboard_resources")) {
    DecodeResources(*r, p + ".tensorboard_resources", &c->tensorboard_resources);
  }
  if (const Node* st = Child(n, "storage")) DecodeStorage(*st, p + ".storage", &c->storage);
  if (const Node* st = Child(n, "stage")) DecodeStage(*st, p + ".stage", &c->stage);
  DecodePlacement(n, p, c);
}

// cluster.storage: the job's volume (a claim of its own, or one that exists).
void Decoder::DecodeStorage(const Node& st, const std::string& sp, StorageSpec* storage) {
  if (!Section(st, sp, {"claim", "class", "size", "mount"})) return;
  auto name = NameReader(*this);
  Field(st, sp, "claim", &storage->claim, name);
  Field(st, sp, "class", &storage->storage_class, name);
  Field(st, sp, "size", &storage->size, [&](const Node& v, const std::string& path) {
    auto s = String(v, path);
    static const std::vector<std::string> units = {"", "Ki", "Mi", "Gi", "Ti", "Pi", "k", "M", "G", "T", "P"};
    size_t digits = s ? s->find_first_not_of("0123456789") : 0;
    if (s &&
        (digits == 0 || std::find(units.begin(), units.end(), s->substr(std::min(digits, s->size()))) == units.end())) {
      Error(v, path, "expected a size such as 100Gi, got " + Quote(*s));
      return std::optional<std::string>();
    }
    return s;
  });
  Field(st, sp, "mount", &storage->mount, [&](const Node& v, const std::string& path) {
    auto s = String(v, path);
    if (s && (s->size() < 2 || (*s)[0] != '/')) {
      Error(v, path, "expected an absolute directory such as /mnt/shared, got " + Quote(*s));
      return std::optional<std::string>();
    }
    return s;
  });
}

// cluster.stage: the dataset archive staged onto the volume before the job starts: an http(s) URL,
// or s3://BUCKET/KEY read with SigV4 and the credentials of the Secret `credentials` names.
void Decoder::DecodeStage(const Node& st, const std::string& sp, StageSpec* stage) {
  if (!Section(st, sp, {"url", "sha256", "credentials"})) return;
  Field(st, sp, "url", &stage->url, [&](const Node& v, const std::string& path) {
    auto s = String(v, path);
    if (!s) return s;
    if (s->rfind("s3://", 0) == 0) {
      // The stage script puts the key into the request's path as it is: only characters that
      // need no percent-encoding (and so sign the same in curl and in the server).
      const std::string rest = s->substr(5);
      const size_t slash = rest.find('/');
      if (slash == 0 || slash == std::string::npos || slash + 1 == rest.size() ||
          rest.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~/") !=
              std::string::npos) {
        Error(v, path, "expected s3://BUCKET/KEY (letters, digits and - . _ ~ / in the key), got " + Quote(*s));
        return std::optional<std::string>();
      }
    } else if (s->rfind("https://", 0) != 0 && s->rfind("http://", 0) != 0) {
      Error(v, path, "expected an s3://, http:// or https:// URL of a dataset archive, got " + Quote(*s));
      return std::optional<std::string>();
    }
    return s;
  });
  Field(st, sp, "sha256", &stage->sha256, [&](const Node& v, const std::string& path) {
    auto s = String(v, path);
    if (s && (s->size() != 64 || s->find_first_not_of("0123456789abcdef") != std::string::npos)) {
      Error(v, path, "expected 64 lowercase hex digits, got " + Quote(*s));
      return std::optional<std::string>();
    }
    return s;
  });
  Field(st, sp, "credentials", &stage->credentials, NameReader(*this));
  const bool s3 = stage->url.rfind("s3://", 0) == 0;
  if (s3 && stage->credentials.empty()) {
    Error(st, sp + ".credentials",
          "an s3:// URL needs the name of a Secret in the job's namespace with AWS_ACCESS_KEY_ID and "
          "AWS_SECRET_ACCESS_KEY (optional: AWS_SESSION_TOKEN, AWS_REGION, AWS_ENDPOINT_URL)");
  } else if (!s3 && !stage->url.empty() && !stage->credentials.empty()) {
    Error(st, sp + ".credentials", "credentials are for an s3:// URL; " + Quote(stage->url) + " is fetched as it is");
  }
}

// cluster.node_selector and cluster.tolerations: where the pods may run.
void Decoder::DecodePlacement(const Node& n, const std::string& p, ClusterSpec* c) {
  Note(p + ".node_selector", {{"type", "object"}, {"additionalProperties", kScalar}});
  Note(p + ".tolerations", {{"type", "array"}});
  if (const Node* ns = Child(n, "node_selector")) {
    if (ns->kind != Kind::kMap) {
      Error(*ns, p + ".node_selector", std::string("expected a mapping of label: value, got ") + ns->KindName());
    } else {
      for (const auto& [key, value] : ns->map) {
        const std::string path = p + ".node_selector." + key;
        if (!IsLabelKey(key)) {
          Error(value, p + ".node_selector",
                "expected a Kubernetes label key (letters, digits, '-', '_', '.', an "
                "optional prefix/ such as kubernetes.io/), got " +
                    Quote(key));
        } else if (auto v = String(value, path); v && !IsLabelValue(*v)) {
          Error(value, path,
                "expected a Kubernetes label value (at most 63 letters, digits, '-', '_' or '.', "
                "starting and ending with a letter or digit), got " +
                    Quote(*v));
        } else if (v) {
          c->node_selector.emplace_back(key, *v);
        }
      }
    }
  }
  if (const Node* tl = Child(n, "tolerations")) {
    if (tl->kind != Kind::kSeq) {
      Error(*tl, p + ".tolerations",
            std::string("expected a list of {key, operator, value, effect}, got ") + tl->KindName());
      return;
    }
    for (size_t i = 0; i < tl->seq.size(); ++i) {
      const std::string tp = p + ".tolerations[" + std::to_string(i) + "]";
      const Node& t = tl->seq[i];
      if (!Section(t, tp, {"key", "operator", "value", "effect"})) continue;
      Toleration tol;
      Field(t, tp, "key", &tol.key, [&](const Node& v, const std::string& path) {
        auto s = String(v, path);
        if (s && !s->empty() && !IsLabelKey(*s)) {
          Error(v, path, "expected a taint's key, a Kubernetes label key such as nvidia.com/gpu, got " + Quote(*s));
          return std::optional<std::string>();
        }
        return s;
      });
      Field(t, tp, "value", &tol.value, [&](const Node& v, const std::string& path) {
        auto s = String(v, path);
        if (s && !IsLabelValue(*s)) {
          Error(v, path,
                "expected a taint's value, a Kubernetes label value (at most 63 letters, digits, '-', "
                "'_' or '.'), got " +
                    Quote(*s));
          return std::optional<std::string>();
        }
        return s;
      });
      Field(t, tp, "operator", &tol.op, OneOfThese({"Equal", "Exists"}));
      Field(t, tp, "effect", &tol.effect, OneOfThese({"NoSchedule", "PreferNoSchedule", "NoExecute"}));
      c->tolerations.push_back(tol);
    }
  }
}

}  // namespace trainctl::jobspec
