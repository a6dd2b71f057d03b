// The trainer section of a job spec: the built-in trainer, its model, data, optimizer and schedule.
#include <tuple>

#include "jobspec/decoder.h"
#include "jobspec/layers.h"

namespace trainctl::jobspec {

constexpr long long kBig = 1LL << 40;  // "no bound" for counts of steps and samples

void Decoder::DecodeTrainer(const Node& n, TrainerSpec* t) {
  const std::string p = "trainer";
  if (!Section(n, p,
               {"strategy",
                "parameter_server",
                "model",
                "data",
                "epochs",
                "max_steps",
                "batch_size",
                "balance",
                "global_batch_size",
                "optimizer",
                "schedule",
                "label_smoothing",
                "seed",
                "deterministic",
                "threads",
                "device",
                "memory_format",
                "cudnn_benchmark",
                "precision",
                "backend",
                "bucket_mb",
                "checkpoint_every",
                "keep_last",
                "snapshot_every",
                "log_every",
                "timeline_steps",
                "eval",
                "eval_every",
                "resume"})) {
    return;
  }
  t->enabled = true;
  Field(n, p, "strategy", &t->strategy, OneOfThese({"allreduce", "parameter_server"}));
  if (const Node* ps = Child(n, "parameter_server")) {
    const std::string pp = p + ".parameter_server";
    if (Section(*ps, pp, {"mode", "max_staleness"})) {
      Field(*ps, pp, "mode", &t->parameter_server.mode, OneOfThese({"sync", "async"}));
      Field(*ps, pp, "max_staleness", &t->parameter_server.max_staleness, IntIn(0, 1 << 20));
    }
  }
  if (const Node* m = Child(n, "model")) DecodeModel(*m, p + ".model", t);
  Field(n, p, "epochs", &t->epochs, IntIn(1, 100000));
  Field(n, p, "max_steps", &t->max_steps, IntIn(0, kBig));
  Field(n, p, "batch_size", &t->batch_size, IntIn(1, 1 << 20));
  Field(n, p, "global_batch_size", &t->global_batch_size, IntIn(1, 1 << 30));
  Field(n, p, "label_smoothing", &t->label_smoothing, NumIn(0, 0.999));
  Field(n, p, "seed", &t->seed, IntIn(0, kBig));
  Field(n, p, "deterministic", &t->deterministic, Boolean());
  Field(n, p, "resume", &t->resume, Boolean());
  Field(n, p, "threads", &t->threads, IntIn(0, 1024));
  Field(n, p, "device", &t->device, OneOfThese({"cpu", "cuda"}));
  Field(n, p, "memory_format", &t->memory_format, OneOfThese({"contiguous", "channels_last"}));
  if (const Node* m = Child(n, "memory_format");
      m && t->memory_format == "channels_last" && t->strategy == "parameter_server") {
    Error(*m, p + ".memory_format",
          "channels_last needs strategy: allreduce (the parameter servers keep "
          "contiguous shards); expected contiguous");
  }
  Field(n, p, "balance", &t->balance, OneOfThese({"even", "speed"}));
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
  Field(n, p, "cudnn_benchmark", &t->cudnn_benchmark, Boolean());
  Field(n, p, "precision", &t->precision, OneOfThese({"fp32", "bf16"}));
  Field(n, p, "backend", &t->backend, OneOfThese({"auto", "gloo", "shm", "nccl"}));
  if (const Node* b = Child(n, "backend");
      b && t->backend != "auto" && (t->backend == "nccl") != (t->device == "cuda")) {
    Error(*b, p + ".backend",
          t->device == "cuda" ? "expected nccl or auto with device: cuda (GPU memory goes through NCCL)"
                              : "nccl needs device: cuda; expected auto, gloo or shm for the CPU");
  }
  Field(n, p, "bucket_mb", &t->bucket_mb, NumIn(0.001, 1024));
  Field(n, p, "checkpoint_every", &t->checkpoint_every, IntIn(0, kBig));
  Field(n, p, "keep_last", &t->keep_last, IntIn(1, 1000));
  Field(n, p, "snapshot_every", &t->snapshot_every, IntIn(0, kBig));
  Field(n, p, "log_every", &t->log_every, IntIn(1, kBig));
  Field(n, p, "timeline_steps", &t->timeline_steps, IntIn(0, kMaxTimelineSteps));
  Field(n, p, "eval", &t->eval, Boolean());
  Field(n, p, "eval_every", &t->eval_every, IntIn(1, 100000));

  if (const Node* d = Child(n, "data")) DecodeData(*d, p + ".data", &t->data);
  if (const Node* o = Child(n, "optimizer")) DecodeOptimizer(*o, p + ".optimizer", &t->optimizer);
  if (const Node* sc = Child(n, "schedule")) DecodeSchedule(*sc, p + ".schedule", &t->schedule);
  CheckModel(t);
}

// trainer.data: the dataset, where it is, how it is read and how big its images are.
void Decoder::DecodeData(const Node& d, const std::string& dp, DataSpec* ds_out) {
  DataSpec& ds = *ds_out;
  if (!Section(d, dp,
               {"dataset", "dir", "test_dir", "holdout", "bad_images", "augment", "limit", "test_limit", "samples",
                "shape", "classes", "load", "threads", "crop_pct"})) {
    return;
  }
  Field(d, dp, "dataset", &ds.dataset, OneOfThese({"fashion-mnist", "mnist", "cifar10", "imagefolder", "synthetic"}));
  Field(d, dp, "dir", &ds.dir, Text());
  Field(d, dp, "test_dir", &ds.test_dir, Text());
  Field(d, dp, "holdout", &ds.holdout, NumIn(0, 0.9));
  Field(d, dp, "bad_images", &ds.bad_images, OneOfThese({"skip", "fail"}));
  if (const Node* a = Child(d, "augment")) DecodeAugment(*a, dp + ".augment", &ds);
  Field(d, dp, "load", &ds.load, OneOfThese({"auto", "stream", "memory"}));
  Field(d, dp, "threads", &ds.threads, IntIn(0, 1024));
  Field(d, dp, "crop_pct", &ds.crop_pct, NumIn(0, 1));  // 0: by augment (job_spec.h)
  Field(d, dp, "limit", &ds.limit, IntIn(0, kBig));
  Field(d, dp, "test_limit", &ds.test_limit, IntIn(0, kBig));
  Field(d, dp, "samples", &ds.samples, IntIn(1, kBig));
  Field(d, dp, "classes", &ds.classes, IntIn(2, 4096));
  if (const Node* sh = Child(d, "shape")) {
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
  if (folder && !Child(d, "shape")) ds.shape.clear();  // the first training picture's (FolderShape)
  for (const char* key : {"test_dir", "holdout", "bad_images", "load", "threads", "crop_pct"}) {
    if (const Node* k = Child(d, key); k && !folder) {
      Error(*k, dp + "." + key, "goes with dataset: imagefolder");
    }
  }
  if (ds.random_resized_crop && !folder) {
    Error(*Child(*Child(d, "augment"), "random_resized_crop"), dp + ".augment.random_resized_crop",
          "goes with dataset: imagefolder (pictures of any size; the other datasets' images have theirs)");
  } else if (ds.random_resized_crop && ds.load == "memory") {
    Error(*Child(d, "load"), dp + ".load",
          "memory keeps each picture decoded once; augment.random_resized_crop decodes a new crop of it "
          "every epoch: load: stream (or auto)");
  }
  if (const Node* k = Child(d, "holdout"); k && !ds.test_dir.empty()) {
    Error(*k, dp + ".holdout", "goes without test_dir: the test images come from test_dir, or are held out of dir");
  }
  bool needs_dir = ds.dataset == "mnist" || ds.dataset == "cifar10" || folder;
  if (needs_dir && ds.dir.empty()) {
    Error(d, dp + ".dir",
          "required for " + ds.dataset + "; expected the directory with " +
              (ds.dataset == "mnist" ? "the idx files"
               : folder              ? "a folder per class of images"
                                     : "data_batch_N.bin and test_batch.bin"));
  }
}

// trainer.data.augment: crops and flips; ImageNet's random resized crops with their scale and ratio.
void Decoder::DecodeAugment(const Node& a, const std::string& ap, DataSpec* ds_out) {
  DataSpec& ds = *ds_out;
  if (!Section(a, ap, {"crop_padding", "flip", "random_resized_crop", "scale", "ratio"})) return;
  Field(a, ap, "crop_padding", &ds.crop_padding, IntIn(0, 256));
  Field(a, ap, "flip", &ds.flip, Boolean());
  Field(a, ap, "random_resized_crop", &ds.random_resized_crop, Boolean());
  for (const auto& [key, out, lo, hi] :
       {std::tuple<const char*, std::vector<double>*, double, double>{"scale", &ds.scale, 0.0001, 1.0},
        {"ratio", &ds.ratio, 0.01, 100.0}}) {
    const Node* r = Child(a, key);
    if (!r) continue;
    const std::string rp = ap + "." + key;
    Note(rp, {{"type", "array"}, {"minItems", 2}, {"maxItems", 2}});
    if (r->kind != Kind::kSeq || r->seq.size() != 2) {
      Error(*r, rp,
            std::string("expected [low, high] such as ") +
                (std::string(key) == "scale" ? "[0.08, 1.0]" : "[0.75, 1.333]"));
      continue;
    }
    auto a0 = Double(r->seq[0], rp + "[0]", lo, hi), a1 = Double(r->seq[1], rp + "[1]", lo, hi);
    if (a0 && a1 && *a0 > *a1) Error(*r, rp, "expected [low, high] with low <= high");
    if (a0 && a1) *out = {*a0, *a1};
    if (!ds.random_resized_crop) Error(*r, rp, "goes with random_resized_crop: true");
  }
}

// trainer.optimizer: SGD or Adam and their settings.
void Decoder::DecodeOptimizer(const Node& o, const std::string& op, OptimizerSpec* os_out) {
  OptimizerSpec& os = *os_out;
  if (!Section(o, op, {"name", "lr", "momentum", "weight_decay", "nesterov", "beta1", "beta2", "eps"})) return;
  Field(o, op, "name", &os.name, OneOfThese({"sgd", "adam"}));
  Field(o, op, "lr", &os.lr, NumIn(0, 100));
  Field(o, op, "momentum", &os.momentum, NumIn(0, 1));
  Field(o, op, "weight_decay", &os.weight_decay, NumIn(0, 10));
  Field(o, op, "nesterov", &os.nesterov, Boolean());
  Field(o, op, "beta1", &os.beta1, NumIn(0, 0.999999));
  Field(o, op, "beta2", &os.beta2, NumIn(0, 0.999999999));
  Field(o, op, "eps", &os.eps, NumIn(0, 1));
}

// trainer.schedule: the learning rate's schedule.
void Decoder::DecodeSchedule(const Node& sc, const std::string& sp, ScheduleSpec* ss_out) {
  ScheduleSpec& ss = *ss_out;
  if (!Section(sc, sp, {"name", "warmup_steps", "step_size", "gamma", "min_lr", "scale_by_world_size"})) return;
  Field(sc, sp, "name", &ss.name, OneOfThese({"constant", "step", "cosine", "one_cycle"}));
  Field(sc, sp, "warmup_steps", &ss.warmup_steps, IntIn(0, kBig));
  Field(sc, sp, "step_size", &ss.step_size, IntIn(1, kBig));
  Field(sc, sp, "gamma", &ss.gamma, NumIn(0, 1));
  Field(sc, sp, "min_lr", &ss.min_lr, NumIn(0, 100));
  Field(sc, sp, "scale_by_world_size", &ss.scale_by_world_size, Boolean());
  if (ss.name == "step" && ss.step_size == 0) {
    Error(sc, sp + ".step_size",
          "required for the step schedule; expected the number of "
          "steps between LR drops, such as 1000");
  }
}

// trainer.model: a model's name, or {layers: [...]} (jobspec/layers.h).
void Decoder::DecodeModel(const Node& n, const std::string& path, TrainerSpec* t) {
  if (schema) return;  // JobSpecSchemaJson describes it
  if (n.kind == Kind::kScalar) {
    if (auto v = OneOf(n, path, {"cnn", "resnet18", "resnet50"})) t->model = *v;
    return;
  }
  if (n.kind != Kind::kMap) {
    Error(n, path,
          std::string("expected cnn, resnet18, resnet50, {layers: [...]} or {torchscript: model.pt}, got ") +
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
        Error(*ts, path + ".torchscript",
              "expected the path of a module saved with torch.jit.script(model).save(path)");
      } else {
        t->model = "torchscript";
        t->torchscript = *v;
      }
    }
    return;
  }
  if (!layers) {
    Error(n, path,
          "expected cnn, resnet18, resnet50, {layers: [...]} or {torchscript: model.pt}, got a mapping "
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

bool Decoder::DecodeLayers(const Node& n, const std::string& path, int depth, std::vector<LayerSpec>* out) {
  if (n.kind != Kind::kSeq || n.seq.empty()) {
    Error(n, path,
          std::string("expected a list of layers such as [{conv: 16}, relu, flatten, linear], got ") +
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
bool Decoder::DecodeLayer(const Node& n, const std::string& path, int depth, LayerSpec* l) {
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
    Error(n, path,
          "expected a layer: its kind (relu), or a mapping of one kind to its size or fields "
          "({conv: 16}, {conv: {channels: 16, stride: 2}}), got " +
              (n.kind == Kind::kMap ? "a mapping of " + std::to_string(n.map.size()) + " keys"
                                    : std::string(n.KindName())));
    return false;
  }
  const std::vector<std::string> kinds = LayerKindNames();
  const auto k = LayerKindFromName(kind);
  if (!k) {
    const std::string guess = ClosestMatch(kind, kinds);
    Error(n, path,
          "unknown layer " + Quote(kind) + "; " +
              (guess.empty() ? "expected one of " + Join(kinds, ", ") : "did you mean '" + guess + "'?"));
    return false;
  }
  l->kind = *k;
  const std::string lp = path + "." + kind;
  const size_t before = errors.size();
  auto size_of = [&](const Node& v) {
    switch (*k) {
      case LK::kConv:
        if (auto x = Int(v, lp, 1, 1 << 16)) l->out = *x;
        break;
      case LK::kLinear:
        if (auto x = Int(v, lp, 1, 1 << 24)) l->out = *x;
        break;
      case LK::kMaxPool:
      case LK::kAvgPool:
        if (auto x = Int(v, lp, 1, 1024)) l->kernel = *x;
        break;
      case LK::kDropout:
        if (auto x = Double(v, lp, 0, 0.999)) l->p = *x;
        break;
      default:
        Error(v, lp, kind + " takes no size; expected " + kind + " alone");
        break;
    }
  };
  std::vector<std::string> fields;
  switch (*k) {
    case LK::kConv:
      fields = {"channels", "kernel", "stride", "padding", "groups", "bias", "name"};
      break;
    case LK::kLinear:
      fields = {"features", "bias", "name"};
      break;
    case LK::kMaxPool:
    case LK::kAvgPool:
      fields = {"kernel", "stride", "padding"};
      break;
    case LK::kBatchNorm:
      fields = {"name"};
      break;
    case LK::kDropout:
      fields = {"p"};
      break;
    case LK::kResidual:
      fields = {"layers", "projection", "name"};
      break;
    default:
      break;
  }
  if (!args) {
    if (*k == LK::kConv)
      Error(n, path, "conv needs its output channels; expected {conv: 16} or {conv: {channels: 16}}");
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
                        std::all_of(v->begin(), v->end(), [](char c) {
                          return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
                        });
        if (ok)
          l->name = *v;
        else
          Error(*nm, lp + ".name", "expected letters, digits, _ and dots between them (layer1.0), got " + Quote(*v));
      }
    }
    if (*k == LK::kConv && !Child(a, "channels")) Error(a, lp + ".channels", "required; expected the output channels");
    if (*k == LK::kResidual) {
      if (const Node* body = Child(a, "layers"))
        DecodeLayers(*body, lp + ".layers", depth + 1, &l->body);
      else
        Error(a, lp + ".layers", "required; expected the block's body, a list of layers");
    }
  }
  return errors.size() == before;
}

// After the trainer's data is known: a declared model's names, and its shapes checked.
void Decoder::CheckModel(TrainerSpec* t) {
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

Result<std::vector<LayerSpec>> DecodeLayerList(const Node& n, const std::string& path) {
  Decoder d;
  std::vector<LayerSpec> layers;
  d.DecodeLayers(n, path, 0, &layers);
  if (!d.errors.empty()) return InvalidArgument(d.Report());
  return layers;
}

}  // namespace trainctl::jobspec
