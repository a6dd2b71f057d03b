// The job spec's top level: turns the layered tree into a JobSpec, collecting every problem with
// its origin; the sections it hands to Decoder's other files (decoder.h).
#include "common/address.h"
#include "jobspec/decoder.h"

namespace trainctl::jobspec {

Result<JobSpec> Decode(const Node& root);

namespace {

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

const std::vector<std::string> kTopLevel = {"name",     "nodes",      "procs_per_node", "cpu_bind",       "command",
                                            "args",     "env",        "working_dir",    "resources",      "restart",
                                            "timeouts", "rendezvous", "output_dir",     "checkpoint_dir", "trainer",
                                            "cluster",  "roles",      "preload"};

// name: a DNS label, as Kubernetes names its objects.
void DecodeName(Decoder& d, const Node& root, JobSpec* spec) {
  if (const Node* n = Decoder::Child(root, "name")) {
    if (auto s = d.String(*n, "name")) {
      if (Decoder::IsDnsLabel(*s)) {
        spec->name = *s;
      } else {
        d.Error(*n, "name",
                "expected lowercase letters, digits and '-' (a DNS label, at most 63 "
                "characters, as Kubernetes names need), got " +
                    Quote(*s));
      }
    }
  } else {
    d.Error(root, "name", "required field is missing; expected a job name such as my-job");
  }
}

// The job's own program: command (or the built-in trainer, or roles), args, env, working_dir and
// the modules a warm interpreter preloads.
void DecodeProgram(Decoder& d, const Node& root, JobSpec* spec) {
  const Node* trainer = Decoder::Child(root, "trainer");
  const Node* roles = Decoder::Child(root, "roles");
  const Node* command = Decoder::Child(root, "command");
  if (trainer && command) {
    d.Error(*command, "command",
            "a job runs either its own program (command) or the built-in "
            "trainer (trainer), not both; remove one");
    if (d.schema) (void)d.Command(*command, "command");  // schema mode reads both
  } else if (const Node* n = command) {
    if (auto c = d.Command(*n, "command")) spec->command = *c;
  } else if (!trainer && !roles) {
    d.Error(root, "command",
            "required field is missing; expected the worker program, for example "
            "command: [python3, train.py], or a trainer: section for the built-in "
            "trainer");
  }
  if (const Node* n = Decoder::Child(root, "args")) {
    if (auto list = d.StringList(*n, "args")) spec->args = *list;
  }
  if (const Node* n = Decoder::Child(root, "env")) d.DecodeEnv(*n, "env", &spec->env);
  if (const Node* n = Decoder::Child(root, "working_dir")) {
    if (auto s = d.String(*n, "working_dir")) spec->working_dir = *s;
  }
  if (const Node* n = Decoder::Child(root, "preload")) {
    if (auto list = d.StringList(*n, "preload")) {
      for (size_t i = 0; i < list->size(); ++i) {
        if (!IsPythonModuleName((*list)[i])) {
          d.Error(n->seq[i], "preload[" + std::to_string(i) + "]",
                  "expected a Python module name such as torch or torchvision.models, got " + Quote((*list)[i]));
        }
      }
      spec->preload = *list;
    }
  }
}

// restart: the job's budget of worker-group restarts and their back-off.
void DecodeRestart(Decoder& d, const Node& n, RestartSpec* r) {
  if (n.kind != Kind::kMap) {
    d.Error(n, "restart", std::string("expected a mapping {max_restarts, backoff, backoff_max}, got ") + n.KindName());
  } else {
    d.CheckKeys(n, "restart", {"max_restarts", "backoff", "backoff_max"});
    if (const Node* m = Decoder::Child(n, "max_restarts")) {
      if (auto v = d.Int(*m, "restart.max_restarts", 0, kMaxRestarts)) {
        r->max_restarts = static_cast<int>(*v);
      }
    }
    if (const Node* m = Decoder::Child(n, "backoff")) {
      if (auto v = d.DurationField(*m, "restart.backoff")) r->backoff = *v;
    }
    if (const Node* m = Decoder::Child(n, "backoff_max")) {
      if (auto v = d.DurationField(*m, "restart.backoff_max")) r->backoff_max = *v;
    }
  }
}

// timeouts: each a duration; those that cannot be 0 say so.
void DecodeTimeouts(Decoder& d, const Node& n, TimeoutsSpec* t) {
  if (n.kind != Kind::kMap) {
    d.Error(n, "timeouts",
            std::string(
                "expected a mapping {rendezvous, stop_grace, job, last_call, heartbeat, collective, finish}, got ") +
                n.KindName());
  } else {
    d.CheckKeys(n, "timeouts", {"rendezvous", "stop_grace", "job", "last_call", "heartbeat", "collective", "finish"});
    struct {
      const char* key;
      Duration* out;
      bool zero_ok;
    } fields[] = {{"rendezvous", &t->rendezvous, false},
                  {"stop_grace", &t->stop_grace, true},
                  {"job", &t->job, true},
                  {"last_call", &t->last_call, true},
                  {"heartbeat", &t->heartbeat, false},
                  {"collective", &t->collective, false},
                  {"finish", &t->finish, true}};
    for (auto& f : fields) {
      const Node* m = Decoder::Child(n, f.key);
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

// What the trainer section needs of the rest of the spec: roles for parameter servers, a global
// batch the workers share evenly, no args (they go with a command).
void CheckTheTrainerFits(Decoder& d, const Node& root, const Node& trainer, bool roles, const JobSpec& spec) {
  if (!roles && spec.trainer.strategy == "parameter_server") {
    d.Error(*trainer.Find("strategy"), "trainer.strategy",
            "parameter_server needs roles: a ps role and a worker role, for example roles: "
            "[{name: ps, replicas: 1}, {name: worker, replicas: 2}]");
  }

  if (spec.trainer.global_batch_size > 0 && spec.trainer.global_batch_size % TrainingWorkers(spec) != 0) {
    const Node* g = trainer.Find("global_batch_size");
    d.Error(*g, "trainer.global_batch_size",
            "expected a multiple of the number of training workers (" + std::to_string(TrainingWorkers(spec)) +
                (spec.roles.empty() ? " = nodes x procs_per_node" : " = chief and worker replicas") + "), got " +
                std::to_string(spec.trainer.global_batch_size));
  }
  if (!spec.args.empty()) {
    d.Error(*root.Find("args"), "args",
            "args go with command; the built-in trainer takes its "
            "settings from the trainer section");
  }
}

}  // namespace

Result<JobSpec> DecodeWith(Decoder& d, const Node& root) {
  JobSpec spec;
  if (root.kind == Kind::kNull) {
    return InvalidArgument(root.origin.source +
                           ": empty job spec; expected a mapping with at least 'name' and 'command'");
  }
  if (root.kind != Kind::kMap) {
    return InvalidArgument(root.origin.ToString() +
                           ": expected a mapping of job fields (name: ..., "
                           "command: [...]), got " +
                           root.KindName());
  }
  d.CheckKeys(root, "", kTopLevel);

  DecodeName(d, root, &spec);

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
  DecodeProgram(d, root, &spec);
  if (const Node* n = Decoder::Child(root, "resources")) d.DecodeResources(*n, "resources", &spec.resources);

  if (const Node* n = Decoder::Child(root, "restart")) DecodeRestart(d, *n, &spec.restart);
  if (const Node* n = Decoder::Child(root, "timeouts")) DecodeTimeouts(d, *n, &spec.timeouts);
  if (const Node* n = Decoder::Child(root, "rendezvous")) {
    if (auto url = d.String(*n, "rendezvous")) {
      if (auto parsed = ParseEtcdUrl(*url); parsed.ok()) {
        spec.rendezvous = *url;
      } else {
        d.Error(*n, "rendezvous", parsed.status().message() + " (leave the field out for the embedded store)");
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
  if (trainer) CheckTheTrainerFits(d, root, *trainer, roles != nullptr, spec);
  if (!d.errors.empty()) return InvalidArgument(d.Report());
  if (spec.output_dir.empty()) spec.output_dir = "runs/" + spec.name;
  if (spec.checkpoint_dir.empty()) spec.checkpoint_dir = spec.output_dir + "/checkpoints";
  return spec;
}

Result<JobSpec> Decode(const Node& root) {
  Decoder d;
  return DecodeWith(d, root);
}

}  // namespace trainctl::jobspec
