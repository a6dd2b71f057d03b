// The resolved spec as JSON: a job spec in the spec's own field names (defaults filled in,
// nothing left to inherit), so it is both what agents and workers read and a valid spec a user
// can run again (`validate --print`, <output_dir>/job.json). Reading it back is parsing a spec.
#include <nlohmann/json.hpp>

#include "jobspec/job_spec.h"
#include "jobspec/tree.h"

namespace trainctl::jobspec {
Result<JobSpec> Decode(const Node& root);
Result<std::vector<LayerSpec>> DecodeLayerList(const Node& n, const std::string& path);
}  // namespace trainctl::jobspec

namespace trainctl {

using nlohmann::ordered_json;

namespace {

ordered_json Env(const std::vector<std::pair<std::string, std::string>>& env) {
  ordered_json out = ordered_json::object();
  for (const auto& [k, v] : env) out[k] = v;
  return out;
}

ordered_json Resources(const ResourcesSpec& r) {
  ordered_json out = ordered_json::object();
  if (r.cpus > 0) out["cpus"] = r.cpus;
  if (r.memory_bytes > 0) out["memory"] = std::to_string(r.memory_bytes);
  if (r.gpus > 0) out["gpus"] = r.gpus;
  return out;
}

// Sets key to value unless it is empty: the spec's fields that refuse "" mean "unset" by absence.
void SetIf(ordered_json& j, const char* key, const std::string& value) {
  if (!value.empty()) j[key] = value;
}

ordered_json Layers(const std::vector<LayerSpec>& layers) {
  ordered_json out = ordered_json::array();
  for (const LayerSpec& in : layers) {
    using K = LayerSpec::Kind;
    const LayerSpec l = WithDefaults(in);
    ordered_json f = ordered_json::object();
    switch (l.kind) {
      case K::kConv:
        f = {{"channels", l.out},    {"kernel", l.kernel}, {"stride", l.stride},
             {"padding", l.padding}, {"groups", l.groups}, {"bias", l.bias}};
        break;
      case K::kLinear:
        if (l.out > 0) f["features"] = l.out;
        f["bias"] = l.bias;
        break;
      case K::kMaxPool:
      case K::kAvgPool:
        f = {{"kernel", l.kernel}, {"stride", l.stride}, {"padding", l.padding}};
        break;
      case K::kDropout:
        f = {{"p", l.p}};
        break;
      case K::kResidual:
        f = {{"layers", Layers(l.body)}, {"projection", l.projection}};
        break;
      default:
        break;
    }
    if (!l.name.empty()) f["name"] = l.name;
    if (f.empty())
      out.push_back(LayerKindName(l.kind));
    else
      out.push_back({{LayerKindName(l.kind), f}});
  }
  return out;
}

ordered_json Trainer(const TrainerSpec& t) {
  ordered_json data = {{"dataset", t.data.dataset},
                       {"limit", t.data.limit},
                       {"test_limit", t.data.test_limit},
                       {"samples", t.data.samples}};
  if (!t.data.shape.empty()) data["shape"] = t.data.shape;  // an image folder's first picture's, unresolved
  data["classes"] = t.data.classes;
  SetIf(data, "dir", t.data.dir);
  if (t.data.crop_padding > 0 || t.data.flip || t.data.random_resized_crop) {
    data["augment"] = {{"crop_padding", t.data.crop_padding}, {"flip", t.data.flip}};
    if (t.data.random_resized_crop) {
      data["augment"]["random_resized_crop"] = true;
      data["augment"]["scale"] = t.data.scale;
      data["augment"]["ratio"] = t.data.ratio;
    }
  }
  if (t.data.dataset == "imagefolder") {
    SetIf(data, "test_dir", t.data.test_dir);
    if (t.data.test_dir.empty()) data["holdout"] = t.data.holdout;
    data["bad_images"] = t.data.bad_images;
    data["load"] = t.data.load;
    data["threads"] = t.data.threads;
    data["crop_pct"] = t.data.crop_pct;
  }
  const OptimizerSpec& o = t.optimizer;
  ordered_json optimizer = {
      {"name", o.name},         {"lr", o.lr},       {"momentum", o.momentum}, {"weight_decay", o.weight_decay},
      {"nesterov", o.nesterov}, {"beta1", o.beta1}, {"beta2", o.beta2},       {"eps", o.eps}};
  const ScheduleSpec& s = t.schedule;
  ordered_json schedule = {{"name", s.name},
                           {"warmup_steps", s.warmup_steps},
                           {"gamma", s.gamma},
                           {"min_lr", s.min_lr},
                           {"scale_by_world_size", s.scale_by_world_size}};
  if (s.step_size > 0) schedule["step_size"] = s.step_size;
  ordered_json j = {
      {"strategy", t.strategy},
      {"parameter_server", {{"mode", t.parameter_server.mode}, {"max_staleness", t.parameter_server.max_staleness}}},
      {"model", t.model == "layers"        ? ordered_json{{"layers", Layers(t.layers)}}
                : t.model == "torchscript" ? ordered_json{{"torchscript", t.torchscript}}
                                           : ordered_json(t.model)},
      {"data", data},
      {"epochs", t.epochs},
      {"max_steps", t.max_steps},
      {"batch_size", t.batch_size}};
  if (t.global_batch_size > 0) j["global_batch_size"] = t.global_batch_size;
  j.update(ordered_json{{"optimizer", optimizer},
                        {"schedule", schedule},
                        {"label_smoothing", t.label_smoothing},
                        {"seed", t.seed},
                        {"deterministic", t.deterministic},
                        {"threads", t.threads},
                        {"device", t.device},
                        {"memory_format", t.memory_format},
                        {"cudnn_benchmark", t.cudnn_benchmark},
                        {"precision", t.precision},
                        {"backend", t.backend},
                        {"bucket_mb", t.bucket_mb},
                        {"checkpoint_every", t.checkpoint_every},
                        {"keep_last", t.keep_last},
                        {"snapshot_every", t.snapshot_every},
                        {"log_every", t.log_every},
                        {"eval", t.eval},
                        {"eval_every", t.eval_every},
                        {"resume", t.resume}});
  if (t.timeline_steps > 0) j["timeline_steps"] = t.timeline_steps;
  if (t.balance != "even") j["balance"] = t.balance;
  return j;
}

ordered_json Cluster(const ClusterSpec& c) {
  ordered_json j = {{"image", c.image}};
  SetIf(j, "image_pull_secret", c.image_pull_secret);
  j["namespace"] = c.namespace_;
  SetIf(j, "token_secret", c.token_secret);
  ordered_json storage = {{"size", c.storage.size}, {"mount", c.storage.mount}};
  SetIf(storage, "claim", c.storage.claim);
  SetIf(storage, "class", c.storage.storage_class);
  j["storage"] = storage;
  if (!c.stage.url.empty()) {
    ordered_json stage = {{"url", c.stage.url}};
    SetIf(stage, "sha256", c.stage.sha256);
    SetIf(stage, "credentials", c.stage.credentials);
    j["stage"] = stage;
  }
  j["tensorboard"] = c.tensorboard;
  j["tensorboard_image"] = c.tensorboard_image;
  j["eval_resources"] = Resources(c.eval_resources);
  j["tensorboard_resources"] = Resources(c.tensorboard_resources);
  j["metrics_port"] = c.metrics_port;
  j["pod_monitor"] = c.pod_monitor;
  if (!c.node_selector.empty()) j["node_selector"] = Env(c.node_selector);
  if (!c.tolerations.empty()) {
    ordered_json tolerations = ordered_json::array();
    for (const auto& t : c.tolerations) {
      ordered_json one = {{"operator", t.op}};
      SetIf(one, "key", t.key);
      SetIf(one, "value", t.value);
      SetIf(one, "effect", t.effect);
      tolerations.push_back(one);
    }
    j["tolerations"] = tolerations;
  }
  return j;
}

}  // namespace

std::string JobSpecToJson(const JobSpec& s, int indent) {
  ordered_json j = {{"name", s.name}};
  if (s.nodes.min == s.nodes.max) {
    j["nodes"] = s.nodes.max;
  } else {
    j["nodes"] = {{"min", s.nodes.min}, {"max", s.nodes.max}};
  }
  if (s.roles.empty()) j["procs_per_node"] = s.procs_per_node;
  if (s.cpu_bind != "none") j["cpu_bind"] = s.cpu_bind;
  if (!s.command.empty()) j["command"] = s.command;
  if (!s.args.empty()) j["args"] = s.args;
  if (!s.env.empty()) j["env"] = Env(s.env);
  SetIf(j, "working_dir", s.working_dir);
  if (!s.preload.empty()) j["preload"] = s.preload;
  j["resources"] = Resources(s.resources);
  j["restart"] = {{"max_restarts", s.restart.max_restarts},
                  {"backoff", FormatDuration(s.restart.backoff)},
                  {"backoff_max", FormatDuration(s.restart.backoff_max)}};
  const TimeoutsSpec& t = s.timeouts;
  j["timeouts"] = {{"rendezvous", FormatDuration(t.rendezvous)},
                   {"stop_grace", FormatDuration(t.stop_grace)},
                   {"job", FormatDuration(t.job)},
                   {"last_call", FormatDuration(t.last_call)},
                   {"heartbeat", FormatDuration(t.heartbeat)},
                   {"collective", FormatDuration(t.collective)},
                   {"finish", FormatDuration(t.finish)}};
  SetIf(j, "rendezvous", s.rendezvous);
  j["output_dir"] = s.output_dir;
  j["checkpoint_dir"] = s.checkpoint_dir;
  if (s.trainer.enabled) j["trainer"] = Trainer(s.trainer);
  j["cluster"] = Cluster(s.cluster);
  if (!s.roles.empty()) {
    ordered_json roles = ordered_json::array();
    for (const auto& r : s.roles) {
      ordered_json role = {{"name", r.name}, {"replicas", r.replicas}};
      if (!r.command.empty()) role["command"] = r.command;
      if (!r.args.empty()) role["args"] = r.args;
      if (!r.env.empty()) role["env"] = Env(r.env);
      role["resources"] = Resources(r.resources);
      role["success"] = r.success;
      role["on_failure"] = r.on_failure;
      role["finish"] = r.finish;
      roles.push_back(role);
    }
    j["roles"] = roles;
  }
  return j.dump(indent);
}

namespace {

// The JSON as the tree that reading YAML builds (keys in document order; strings are quoted
// values; numbers and booleans plain ones, as written), so the resolved spec is decoded and
// checked as a spec file is. Every agent reads it: JSON's parser is several times faster than
// YAML's on the same text.
Status JsonTree(const ordered_json& j, int depth, jobspec::Node* out) {
  if (depth > jobspec::kMaxDepth)
    return InvalidArgument("nested deeper than " + std::to_string(jobspec::kMaxDepth) + " levels");
  out->origin = {"resolved job spec", 0};
  if (j.is_object()) {
    out->kind = jobspec::Node::Kind::kMap;
    out->map.reserve(j.size());
    for (const auto& [key, value] : j.items()) {
      out->map.emplace_back(key, jobspec::Node());
      RETURN_IF_ERROR(JsonTree(value, depth + 1, &out->map.back().second));
    }
  } else if (j.is_array()) {
    out->kind = jobspec::Node::Kind::kSeq;
    out->seq.resize(j.size());
    for (size_t i = 0; i < j.size(); ++i) RETURN_IF_ERROR(JsonTree(j[i], depth + 1, &out->seq[i]));
  } else if (j.is_string()) {
    out->kind = jobspec::Node::Kind::kScalar;
    out->scalar = j.get<std::string>();
    out->quoted = true;
  } else if (!j.is_null()) {
    out->kind = jobspec::Node::Kind::kScalar;
    out->scalar = j.dump();
  }
  return Status::Ok();
}

}  // namespace

std::string LayersToJson(const std::vector<LayerSpec>& layers) { return Layers(layers).dump(); }

Result<std::vector<LayerSpec>> LayersFromJson(const std::string& text, const std::string& source) {
  const ordered_json j = ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument(source + ": the model's layers are not JSON");
  jobspec::Node root;
  if (Status st = JsonTree(j, 0, &root); !st.ok())
    return InvalidArgument(source + ": the model's layers: " + st.message());
  auto layers = jobspec::DecodeLayerList(root, "layers");
  if (!layers.ok()) return InvalidArgument(source + ": " + layers.status().message());
  NameLayers(&*layers);
  return layers;
}

Result<JobSpec> JobSpecFromJson(const std::string& text) {
  auto invalid = [](const std::string& why) { return InvalidArgument("the resolved job spec is not valid: " + why); };
  const ordered_json j = ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid("not JSON");
  jobspec::Node root;
  if (Status st = JsonTree(j, 0, &root); !st.ok()) return invalid(st.message());
  auto spec = jobspec::Decode(root);
  if (!spec.ok()) return invalid(spec.status().message());
  return spec;
}

}  // namespace trainctl
