#include <nlohmann/json.hpp>

#include "spec/job_spec.h"

namespace trainctl {

using nlohmann::json;

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(DataSpec, dataset, dir, limit, test_limit, samples,
                                                shape, classes)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(OptimizerSpec, name, lr, momentum, weight_decay,
                                                nesterov, beta1, beta2, eps)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(ScheduleSpec, name, warmup_steps, step_size, gamma,
                                                min_lr, scale_by_world_size)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(ParameterServerSpec, mode, max_staleness)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(TrainerSpec, enabled, strategy, parameter_server, model, data, epochs,
                                                max_steps, batch_size, global_batch_size,
                                                optimizer, schedule, seed, deterministic, threads,
                                                device, backend, bucket_mb, checkpoint_every, keep_last,
                                                snapshot_every, log_every, eval)

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(StorageSpec, claim, storage_class, size, mount)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(StageSpec, url, sha256)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(Toleration, key, op, value, effect)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(ClusterSpec, image, image_pull_secret, namespace_,
                                                token_secret, storage, stage, tensorboard,
                                                tensorboard_image, node_selector, tolerations)

namespace {

json EnvToJson(const std::vector<std::pair<std::string, std::string>>& env) {
  json out = json::array();
  for (const auto& [k, v] : env) out.push_back({k, v});
  return out;
}
std::vector<std::pair<std::string, std::string>> EnvFromJson(const json& j) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& kv : j) out.emplace_back(kv.at(0).get<std::string>(), kv.at(1).get<std::string>());
  return out;
}
json ResourcesToJson(const ResourcesSpec& r) {
  return {{"cpus", r.cpus}, {"memory_bytes", r.memory_bytes}, {"gpus", r.gpus}};
}
ResourcesSpec ResourcesFromJson(const json& j) {
  ResourcesSpec r;
  r.cpus = j.at("cpus").get<double>();
  r.memory_bytes = j.at("memory_bytes").get<int64_t>();
  r.gpus = j.at("gpus").get<int>();
  return r;
}

}  // namespace

std::string JobSpecToJson(const JobSpec& s, int indent) {
  json env = EnvToJson(s.env);
  json j = {
      {"name", s.name},
      {"nodes", {{"min", s.nodes.min}, {"max", s.nodes.max}}},
      {"procs_per_node", s.procs_per_node},
      {"command", s.command},
      {"args", s.args},
      {"env", env},
      {"working_dir", s.working_dir},
      {"resources", ResourcesToJson(s.resources)},
      {"restart", {{"max_restarts", s.restart.max_restarts}}},
      {"timeouts_ms",
       {{"rendezvous", s.timeouts.rendezvous.count()},
        {"stop_grace", s.timeouts.stop_grace.count()},
        {"job", s.timeouts.job.count()},
        {"last_call", s.timeouts.last_call.count()},
        {"heartbeat", s.timeouts.heartbeat.count()},
        {"collective", s.timeouts.collective.count()},
        {"finish", s.timeouts.finish.count()}}},
      {"rendezvous", s.rendezvous},
      {"output_dir", s.output_dir},
      {"checkpoint_dir", s.checkpoint_dir},
  };
  if (s.trainer.enabled) j["trainer"] = s.trainer;
  j["cluster"] = s.cluster;
  if (!s.roles.empty()) {
    json roles = json::array();
    for (const auto& r : s.roles) {
      roles.push_back({{"name", r.name}, {"replicas", r.replicas}, {"command", r.command},
                       {"args", r.args}, {"env", EnvToJson(r.env)},
                       {"resources", ResourcesToJson(r.resources)}, {"success", r.success},
                       {"on_failure", r.on_failure}, {"finish", r.finish}});
    }
    j["roles"] = roles;
  }
  return j.dump(indent);
}

Result<JobSpec> JobSpecFromJson(const std::string& text) {
  try {
    json j = json::parse(text);
    JobSpec s;
    s.name = j.at("name").get<std::string>();
    s.nodes.min = j.at("nodes").at("min").get<int>();
    s.nodes.max = j.at("nodes").at("max").get<int>();
    s.procs_per_node = j.at("procs_per_node").get<int>();
    s.command = j.at("command").get<std::vector<std::string>>();
    s.args = j.at("args").get<std::vector<std::string>>();
    s.env = EnvFromJson(j.at("env"));
    s.working_dir = j.at("working_dir").get<std::string>();
    s.resources = ResourcesFromJson(j.at("resources"));
    s.restart.max_restarts = j.at("restart").at("max_restarts").get<int>();
    const json& t = j.at("timeouts_ms");
    s.timeouts.rendezvous = Duration(t.at("rendezvous").get<int64_t>());
    s.timeouts.stop_grace = Duration(t.at("stop_grace").get<int64_t>());
    s.timeouts.job = Duration(t.at("job").get<int64_t>());
    s.timeouts.last_call = Duration(t.at("last_call").get<int64_t>());
    s.timeouts.heartbeat = Duration(t.at("heartbeat").get<int64_t>());
    s.timeouts.collective = Duration(t.at("collective").get<int64_t>());
    if (t.contains("finish")) s.timeouts.finish = Duration(t.at("finish").get<int64_t>());
    s.rendezvous = j.at("rendezvous").get<std::string>();
    s.output_dir = j.at("output_dir").get<std::string>();
    s.checkpoint_dir = j.at("checkpoint_dir").get<std::string>();
    if (j.contains("trainer")) s.trainer = j.at("trainer").get<TrainerSpec>();
    if (j.contains("cluster")) s.cluster = j.at("cluster").get<ClusterSpec>();
    if (j.contains("roles")) {
      for (const auto& r : j.at("roles")) {
        RoleSpec role;
        role.name = r.at("name").get<std::string>();
        role.replicas = r.at("replicas").get<int>();
        role.command = r.at("command").get<std::vector<std::string>>();
        role.args = r.at("args").get<std::vector<std::string>>();
        role.env = EnvFromJson(r.at("env"));
        role.resources = ResourcesFromJson(r.at("resources"));
        role.success = r.at("success").get<bool>();
        role.on_failure = r.at("on_failure").get<std::string>();
        role.finish = r.at("finish").get<bool>();
        if (role.replicas < 1 || role.name.empty()) return InvalidArgument("resolved job spec has a bad role");
        s.roles.push_back(std::move(role));
      }
    }
    if ((s.command.empty() && !s.trainer.enabled && s.roles.empty()) || s.procs_per_node < 1 ||
        s.nodes.min < 1 || s.nodes.max < s.nodes.min) {
      return InvalidArgument("resolved job spec is inconsistent");
    }
    return s;
  } catch (const json::exception& e) {
    return InvalidArgument(std::string("resolved job spec is not valid: ") + e.what());
  }
}

}  // namespace trainctl
