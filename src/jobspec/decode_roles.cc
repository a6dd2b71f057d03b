// A job's roles (parameter servers, workers, a chief, an evaluator): each role as it says, then
// what it inherits from the job and the defaults that depend on the other roles.
#include "jobspec/decoder.h"

namespace trainctl::jobspec {

void Decoder::DecodeRoles(const Node& n, JobSpec* spec, std::vector<RoleFields>* fields) {
  Note("roles", {{"type", "array"}, {"minItems", 1}});
  if (n.kind != Kind::kSeq || n.seq.empty()) {
    Error(n, "roles",
          std::string("expected a list of roles such as [{name: ps, replicas: 2}, "
                      "{name: worker, replicas: 4}], got ") +
              (n.kind == Kind::kSeq ? "an empty list" : n.KindName()));
    return;
  }
  for (size_t i = 0; i < n.seq.size(); ++i) {
    const Node& r = n.seq[i];
    const std::string p = "roles[" + std::to_string(i) + "]";
    if (!Section(r, p,
                 {"name", "replicas", "command", "args", "env", "resources", "success", "on_failure", "finish"})) {
      continue;
    }
    RoleSpec role;
    RoleFields f;
    f.node = &r;
    if (const Node* nm = Child(r, "name")) {
      if (auto s = String(*nm, p + ".name")) {
        if (!IsDnsLabel(*s)) {
          Error(*nm, p + ".name",
                "expected a role name of lowercase letters, digits and '-' "
                "(ps, worker, chief, evaluator, ...), got " +
                    Quote(*s));
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
      if (auto v = Int(*c, p + ".replicas", 1, kMaxJobNodes)) role.replicas = static_cast<int>(*v);
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
void Decoder::ResolveRoles(const Node& root, JobSpec* spec, const std::vector<RoleFields>& fields) {
  const Node& roles_node = *root.Find("roles");
  const bool trainer = spec->trainer.enabled;
  const bool ps_strategy = trainer && spec->trainer.strategy == "parameter_server";
  if (const Node* ppn = Child(root, "procs_per_node")) {
    Error(*ppn, "procs_per_node",
          "goes with a job without roles; with roles, give each role's "
          "replicas (they are spread over the nodes)");
  }
  if (spec->nodes.min < spec->nodes.max) {
    Error(*root.Find("nodes"), "nodes",
          "a job with roles runs on a fixed number of nodes; expected one count such as 2, got "
          "the range " +
              std::to_string(spec->nodes.min) + ":" + std::to_string(spec->nodes.max));
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
      if (it != env.end())
        it->second = kv.second;
      else
        env.push_back(kv);
    }
    r.env = std::move(env);
    if (!f.own_resources) r.resources = spec->resources;
    const bool builtin = r.command.empty();
    if (!f.has_success) {
      r.success =
          decider_named ? (r.name == "chief" || r.name == "launcher") : (r.name != "ps" && r.name != "evaluator");
    }
    if (!f.has_on_failure) {
      r.on_failure = r.name == "evaluator" ? "ignore"
                     : ps_strategy && spec->trainer.parameter_server.mode == "async" && builtin && r.name == "worker"
                         ? "restart_task"
                         : "restart_job";
    }
    if (!f.has_finish) r.finish = r.name == "evaluator";
    if (r.success) ++deciders;
    if (builtin && !trainer) {
      Error(*f.node, p + ".command",
            "required field is missing; expected the role's program, "
            "for example command: [python3, " +
                r.name + ".py], or a job-wide command or trainer section");
    } else if (builtin) {
      static const std::vector<std::string> parts = {"ps", "worker", "chief", "evaluator"};
      if (std::find(parts.begin(), parts.end(), r.name) == parts.end()) {
        Error(*f.node, p + ".name",
              "the built-in trainer has parts for the roles ps, worker, chief and evaluator; "
              "role " +
                  Quote(r.name) + " needs its own command");
      } else if (r.name == "ps" && !ps_strategy) {
        Error(*f.node, p + ".name",
              "a ps role of the built-in trainer needs trainer.strategy: "
              "parameter_server (give the role its own command to run "
              "your own parameter servers)");
      } else if ((r.name == "chief" || r.name == "evaluator") && r.replicas != 1) {
        Error(*f.node, p + ".replicas",
              "the built-in trainer runs one " + r.name + ", got " + std::to_string(r.replicas));
      }
    }
  }
  if (deciders == 0) {
    Error(roles_node, "roles",
          "no role decides the job's success; set success: true on the "
          "role whose tasks finish the job (by default chief or launcher, "
          "else every role but ps and evaluator)");
  }
  if (ps_strategy) {
    const RoleSpec* ps = FindRole(spec->roles, "ps");
    bool workers = false;
    for (const auto& r : spec->roles) workers = workers || (r.command.empty() && TrainingRole(r.name));
    if (!ps || !ps->command.empty() || !workers) {
      Error(roles_node, "roles",
            "trainer.strategy: parameter_server needs a ps role and a "
            "worker (or chief) role of the built-in trainer");
    }
  }
  if (total < spec->nodes.max) {
    Error(roles_node, "roles",
          "the roles have " + std::to_string(total) +
              " task(s) in all, "
              "fewer than the " +
              std::to_string(spec->nodes.max) + " nodes; every node runs at least one task");
  }
}

}  // namespace trainctl::jobspec
