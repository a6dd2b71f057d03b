// submit, status, logs, delete: a rendered job on a Kubernetes cluster, through the user's own
// kubectl (its kubeconfig, context and credentials). Each takes the job's spec, as run does.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "cli/verbs.h"
#include "common/exit_codes.h"
#include "common/random.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "job/runs.h"
#include "render/k8s/render.h"

namespace trainctl::cli {

namespace {
constexpr auto kKubectlTimeout = std::chrono::seconds(120);
}  // namespace

// kubectl with `args`, fed `input` on stdin from memory (manifests, the token: never a file).
Result<CommandResult> Kubectl(const std::vector<std::string>& args, const std::string& input) {
  SpawnOptions o;
  o.env = CurrentEnvironment();
  auto exe = FindExecutable("kubectl", o.env);
  if (!exe.ok()) {
    return NotFound(
        "kubectl is not on the PATH; install it (Debian: kubernetes-client) and point "
        "it at the cluster (KUBECONFIG)");
  }
  o.argv = {*exe};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  int fd = -1;
  if (!input.empty()) {
    fd = ::memfd_create("trainctl-kubectl-stdin", MFD_CLOEXEC);
    if (fd < 0 || ::write(fd, input.data(), input.size()) != static_cast<ssize_t>(input.size()) ||
        ::lseek(fd, 0, SEEK_SET) != 0) {
      if (fd >= 0) ::close(fd);
      return Internal("cannot hand kubectl its input");
    }
    o.stdin_fd = fd;
  }
  auto r = RunCommand(o, kKubectlTimeout);
  if (fd >= 0) ::close(fd);
  if (r.ok() && r->timed_out) {
    return Unavailable("kubectl " + args[0] + " did not finish within 120s: " + r->output);
  }
  return r;
}

// kubectl's own verdict when it fails: its last line (the ones before are its retries' logs).
std::string KubectlWhy(const CommandResult& r) {
  auto lines = SplitLines(r.output);
  while (!lines.empty() && lines.back().find_first_not_of(" \t\r") == std::string::npos) lines.pop_back();
  std::string why = lines.empty() ? "kubectl ended with " + r.exit.Describe() : lines.back();
  // No cluster answered: which one kubectl tried, from which kubeconfig, and how to choose another.
  for (const char* unreachable : {"connection to the server", "Unable to connect to the server", "no such host",
                                  "i/o timeout", "connection refused"}) {
    if (why.find(unreachable) == std::string::npos) continue;
    const char* env = std::getenv("KUBECONFIG");
    const std::string config =
        env && *env ? std::string("KUBECONFIG=") + env : "~/.kube/config (KUBECONFIG is not set)";
    auto context = Kubectl({"config", "current-context"});
    std::string name;
    if (context.ok() && context->exit.success()) {
      name = context->output;
      while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
    }
    why += name.empty() ? "; kubectl has no current context in " + config +
                              ": set KUBECONFIG to your cluster's kubeconfig, or choose a context (kubectl config "
                              "get-contexts lists them; kubectl config use-context NAME)"
                        : "; that is the cluster of kubectl's context " + name + " in " + config +
                              ": check that it is up, or choose another context (kubectl config get-contexts, "
                              "kubectl config use-context NAME)";
    break;
  }
  return why;
}

namespace {

using nlohmann::json;

struct Common {
  SpecFlags spec;
  std::string format = "job";
};

void AddCommon(CLI::App* cmd, Common* c, bool local_too = false) {
  if (local_too) {
    c->spec.Add(cmd, "job",
                "a job run on this machine, by its name (its newest run) or run id (trainctl ps lists "
                "them); or a Kubernetes job's spec file");
  } else {
    c->spec.Add(cmd);
  }
  cmd->add_option("--format", c->format,
                  "what was submitted: job (Indexed Jobs), pytorchjob, tfjob, mpijob or trainjob")
      ->capture_default_str()
      ->check(CLI::IsMember(k8s::kFormats));
}

// status and logs without a job: which jobs there are to name (as kubectl logs wants its pod).
Status NoJobGiven() {
  std::vector<std::string> names;
  for (const auto& e : runs::List()) {
    if (std::find(names.begin(), names.end(), e.name) == names.end() && names.size() < 8) names.push_back(e.name);
  }
  return InvalidArgument(
      "name the job: a job run on this machine by its name or run id (" +
      (names.empty() ? std::string("trainctl ps lists them; none has run yet") : "recent: " + Join(names, ", ")) +
      "), or a Kubernetes job by its spec file");
}

std::string Selector(const JobSpec& s, const std::string& component = "") {
  return "trainctl.dev/job=" + s.name + (component.empty() ? "" : ",app.kubernetes.io/component=" + component);
}

std::string WorkloadKind(const std::string& format) {
  if (format == "pytorchjob") return "pytorchjobs.kubeflow.org";
  if (format == "tfjob") return "tfjobs.kubeflow.org";
  if (format == "mpijob") return "mpijobs.kubeflow.org";
  if (format == "trainjob") return "trainjobs.trainer.kubeflow.org";
  return "jobs.batch";
}

// The Secret holding the job's store token: cluster.token_secret, else <name>-token.
std::string TokenSecret(const JobSpec& s) {
  return s.cluster.token_secret.empty() ? s.name + "-token" : s.cluster.token_secret;
}

int Submit(const JobSpec& s, const std::string& format) {
  if (Status st = k8s::CheckFormat(s, format); !st.ok()) {
    std::fprintf(stderr, "trainctl submit: %s\n", st.message().c_str());
    return kExitInvalidSpec;
  }
  const std::string& ns = s.cluster.namespace_;
  const std::string secret = TokenSecret(s);
  // The store token: a Secret made once, from a random value that only the cluster keeps.
  auto got = Kubectl({"get", "secret", secret, "-n", ns, "-o", "name", "--ignore-not-found"});
  if (!got.ok()) return Fail("submit", got.status());
  if (got->exit.code != 0) {
    return Fail("submit", Unavailable("cannot reach the cluster: " + KubectlWhy(*got)));
  }
  if (got->output.empty()) {
    json obj = {{"apiVersion", "v1"},
                {"kind", "Secret"},
                {"type", "Opaque"},
                {"metadata", {{"name", secret}, {"namespace", ns}, {"labels", {{"trainctl.dev/job", s.name}}}}},
                {"stringData", {{"token", RandomHex(32)}}}};
    auto made = Kubectl({"create", "-f", "-"}, obj.dump());
    if (!made.ok()) return Fail("submit", made.status());
    if (made->exit.code != 0)
      return Fail("submit", Unavailable("cannot create the token Secret " + secret + ": " + KubectlWhy(*made)));
  }
  auto objects = k8s::Render(s, format);
  // Not the submitters' Role: it is what lets them submit, so whoever administers the namespace
  // applies it (from `trainctl render`) and binds it; its holders cannot manage Roles themselves.
  std::erase_if(objects, [&](const json& o) {
    return o.value("kind", "") == "Role" && o["metadata"].value("name", "") == s.name + "-submitter";
  });
  k8s::SetSubmissionRunId(&objects, s.name + "-" + RandomHex(4));  // as a local run's: <name>-<8 hex>
  auto applied = Kubectl({"apply", "-f", "-"}, k8s::ToYaml(objects));
  if (!applied.ok()) return Fail("submit", applied.status());
  std::fputs(applied->output.c_str(), stdout);
  if (applied->exit.code != 0) return Fail("submit", Unavailable("kubectl apply failed"));
  std::printf(
      "submitted %s to namespace %s; follow it with trainctl status/logs, remove it with "
      "trainctl delete\n",
      s.name.c_str(), ns.c_str());
  return kExitOk;
}

int ShowStatus(const JobSpec& s, const std::string& format, bool as_json) {
  const std::string& ns = s.cluster.namespace_;
  // A job with roles rendered as Jobs has one Job per role: their states are merged below.
  const bool per_role = format == "job" && !s.roles.empty();
  auto job = per_role ? Kubectl({"get", "jobs.batch", "-n", ns, "-l", Selector(s, "worker"), "-o", "json"})
                      : Kubectl({"get", WorkloadKind(format), s.name, "-n", ns, "-o", "json"});
  if (!job.ok()) return Fail("status", job.status());
  if (job->exit.code != 0) return Fail("status", Unavailable(KubectlWhy(*job)));
  auto pods = Kubectl({"get", "pods", "-n", ns, "-l", Selector(s), "-o", "json"});
  if (!pods.ok()) return Fail("status", pods.status());
  if (pods->exit.code != 0) return Fail("status", Unavailable(KubectlWhy(*pods)));
  try {
    json j = json::parse(job->output), p = json::parse(pods->output);
    json objects = per_role ? j.value("items", json::array()) : json::array({j});
    json st = {{"active", 0}, {"succeeded", 0}, {"failed", 0}};
    std::string state = "running";
    int done = 0;
    for (const auto& o : objects) {
      const json ost = o.value("status", json::object());
      // A Job counts its pods in its status; a Kubeflow kind per replica type (Worker, PS, ...).
      json counts = ost.contains("replicaStatuses") ? ost["replicaStatuses"] : json::array({ost});
      for (const auto& [type, c] : counts.items()) {
        for (const char* k : {"active", "succeeded", "failed"}) st[k] = st[k].get<int>() + c.value(k, 0);
      }
      for (const auto& c : ost.value("conditions", json::array())) {
        if (c.value("status", "") != "True") continue;
        const std::string type = c.value("type", "");
        if (type == "Complete" || type == "Succeeded") ++done;
        if (type == "Failed") state = "failed: " + c.value("reason", "") + " " + c.value("message", "");
      }
    }
    if (state == "running" && done > 0 && done == static_cast<int>(objects.size())) state = "succeeded";
    // A TrainJob counts the JobSet's Jobs, not pods (jobsStatus): its node pods are counted here.
    if (format == "trainjob") {
      st = {{"active", 0}, {"succeeded", 0}, {"failed", 0}};
      for (const auto& pod : p.value("items", json::array())) {
        if (pod["metadata"]["labels"].value("app.kubernetes.io/component", "") != "worker") continue;
        const std::string phase = pod["status"].value("phase", "");
        const char* k = phase == "Succeeded" ? "succeeded" : phase == "Failed" ? "failed" : "active";
        st[k] = st[k].get<int>() + 1;
      }
    }
    // The workers wait for the dataset as long as an hour: a stage Job that failed is the job's end.
    if (state == "running" && !s.cluster.stage.url.empty()) {
      auto stage = Kubectl({"get", "jobs.batch", s.name + "-stage", "-n", ns, "-o", "json"});
      if (stage.ok() && stage->exit.code == 0) {
        for (const auto& c :
             json::parse(stage->output).value("status", json::object()).value("conditions", json::array())) {
          if (c.value("type", "") == "Failed" && c.value("status", "") == "True") {
            state = "failed: staging the dataset failed (" + c.value("reason", "") +
                    "; `trainctl logs --component stage` "
                    "says why): " +
                    c.value("message", "");
          }
        }
      }
    }
    json out = {{"job", s.name},
                {"namespace", ns},
                {"state", state},
                {"active", st.value("active", 0)},
                {"succeeded", st.value("succeeded", 0)},
                {"failed", st.value("failed", 0)},
                {"pods", json::array()}};
    for (const auto& pod : p.value("items", json::array())) {
      int restarts = 0;
      for (const auto& cs : pod["status"].value("containerStatuses", json::array()))
        restarts += cs.value("restartCount", 0);
      out["pods"].push_back({{"name", pod["metadata"].value("name", "")},
                             {"component", pod["metadata"]["labels"].value("app.kubernetes.io/component", "")},
                             {"phase", pod["status"].value("phase", "")},
                             {"node", pod["spec"].value("nodeName", "")},
                             {"restarts", restarts}});
    }
    if (as_json) {
      std::printf("%s\n", out.dump(2).c_str());
    } else {
      std::printf("job %s (namespace %s): %s; pods active %d, succeeded %d, failed %d\n", s.name.c_str(), ns.c_str(),
                  state.c_str(), out["active"].get<int>(), out["succeeded"].get<int>(), out["failed"].get<int>());
      for (const auto& pod : out["pods"]) {
        std::printf("  %-40s %-12s %-10s %s\n", pod["name"].get<std::string>().c_str(),
                    pod["component"].get<std::string>().c_str(), pod["phase"].get<std::string>().c_str(),
                    pod["node"].get<std::string>().c_str());
      }
    }
    return state.rfind("failed", 0) == 0 ? kExitWorkerFailed : kExitOk;
  } catch (const json::exception& e) {
    return Fail("status", Internal(std::string("kubectl's answer is not the JSON expected: ") + e.what()));
  }
}

// `logs` of a job submitted to Kubernetes: kubectl logs of its pods (kubectl itself with --follow).
int KubernetesLogs(const JobSpec& spec, const std::string& component, const std::string& since, bool follow) {
  std::vector<std::string> args = {"logs",
                                   "-n",
                                   spec.cluster.namespace_,
                                   "-l",
                                   Selector(spec, component),
                                   "--prefix",
                                   "--all-containers=true",
                                   "--tail=-1",
                                   "--max-log-requests=" + std::to_string(std::max(5, spec.nodes.max + 1))};
  if (!since.empty()) args.push_back("--since=" + since);  // kubectl's own --since
  if (follow) {
    // Streams until the user stops it: kubectl replaces this process.
    auto exe = FindExecutable("kubectl", CurrentEnvironment());
    if (!exe.ok()) {
      return Fail("logs", NotFound("kubectl is not on the PATH"));
    }
    std::vector<char*> argv = {const_cast<char*>("kubectl")};
    args.push_back("--follow");
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(exe->c_str(), argv.data());
    return Fail("logs", Internal("cannot run " + *exe));
  }
  auto r = Kubectl(args);
  if (!r.ok()) {
    return Fail("logs", r.status());
  }
  if (r->exit.code != 0) {  // kubectl's verdict, not its retries' log lines
    return Fail("logs", Unavailable(KubectlWhy(*r)));
  }
  std::fputs(r->output.c_str(), stdout);
  return kExitOk;
}

// `delete`: every object that submit made (its volume and token Secret too `with_data`), with
// no more than the submitters' Role allows: the objects by the job's label, the token by its
// name (the Role may delete that one Secret, and list none).
int DeleteJob(const JobSpec& spec, const std::string& format, bool with_data) {
  std::string kinds = WorkloadKind(format) +
                      ",jobs.batch,deployments.apps,statefulsets.apps,services,configmaps,"
                      "networkpolicies.networking.k8s.io,serviceaccounts";
  if (with_data) kinds += ",persistentvolumeclaims";
  const std::string& ns = spec.cluster.namespace_;
  std::vector<std::vector<std::string>> calls = {
      {"delete", kinds, "-n", ns, "-l", Selector(spec), "--ignore-not-found", "--wait=false"}};
  if (with_data) {
    calls.push_back({"delete", "secret", TokenSecret(spec), "-n", ns, "--ignore-not-found", "--wait=false"});
  }
  for (const auto& call : calls) {
    auto r = Kubectl(call);
    if (!r.ok()) return Fail("delete", r.status());
    if (r->exit.code != 0) return Fail("delete", Unavailable(KubectlWhy(*r)));
    std::fputs(r->output.c_str(), stdout);
  }
  return kExitOk;
}

}  // namespace

void AddClusterVerbs(CLI::App& app, const GlobalFlags& flags, int* code) {
  (void)flags;
  static Common submit_c, status_c, logs_c, delete_c;
  auto* submit = app.add_subcommand("submit",
                                    "Submit the job to the Kubernetes cluster of kubectl's current context: create "
                                    "the store token's Secret if it is missing, then apply the rendered manifests");
  AddCommon(submit, &submit_c);
  submit->callback([code] {
    auto spec = LoadOrReport(submit_c.spec);
    if (spec) {
      for (const auto& w : ClusterWarnings(*spec, submit_c.spec.Sources().files[0], submit_c.format)) {
        std::fprintf(stderr, "warning: %s\n", w.c_str());
      }
    }
    *code = spec ? Submit(*spec, submit_c.format) : kExitInvalidSpec;
  });

  static bool status_json = false;
  auto* status = app.add_subcommand("status",
                                    "A job's state (exit 3 if it failed): a job on this machine by its "
                                    "name or run id, or a submitted Kubernetes job by its spec and its pods");
  AddCommon(status, &status_c, true);
  status->add_flag("--json", status_json, "print JSON");
  status->callback([code] {
    if (status_c.spec.file.empty() && status_c.spec.files.empty()) {
      *code = Fail("status", NoJobGiven());
      return;
    }
    if (IsLocalJob(status_c.spec)) {
      *code = LocalStatus(status_c.spec.file, status_json);
      return;
    }
    auto spec = LoadOrReport(status_c.spec);
    *code = spec ? ShowStatus(*spec, status_c.format, status_json) : kExitInvalidSpec;
  });

  static bool follow = false;
  static int log_rank = -1;
  static std::string log_role;
  static std::string log_since;
  static std::string component = "worker";
  auto* logs = app.add_subcommand("logs",
                                  "A job's output, each line prefixed with its task (a job on this "
                                  "machine by its name or run id) or its pod (a Kubernetes job by its spec)");
  AddCommon(logs, &logs_c, true);
  logs->add_flag("--follow", follow, "keep streaming until the job ends (a -f without a file is --follow)");
  logs->add_option("--rank", log_rank, "a job on this machine: only this rank's output");
  logs->add_option("--role", log_role, "a job on this machine: only this role's tasks");
  logs->add_option("--since", log_since, "only what was written in this last while (10m, 30s; to the second)");
  logs->add_option("--component", component,
                   "worker, launcher, stage, eval, tensorboard or etcd (default: worker; launcher for "
                   "--format mpijob, whose agents write through mpirun there)")
      ->check(CLI::IsMember({"worker", "launcher", "stage", "eval", "tensorboard", "etcd"}));
  logs->callback([code, logs] {
    if (logs_c.spec.file.empty() && logs_c.spec.files.empty()) {
      *code = Fail("logs", NoJobGiven());
      return;
    }
    if (IsLocalJob(logs_c.spec)) {
      *code = LocalLogs(logs_c.spec.file, follow, log_rank, log_role, log_since);
      return;
    }
    auto spec = LoadOrReport(logs_c.spec);
    if (!spec) {
      *code = kExitInvalidSpec;
      return;
    }
    // An MPIJob's agents are started by mpirun in the launcher, which prints their lines; its
    // Worker pods' own log is sshd's.
    const bool chosen = logs->get_option("--component")->count() > 0;
    *code = KubernetesLogs(*spec, !chosen && logs_c.format == "mpijob" ? "launcher" : component, log_since, follow);
  });

  static bool with_data = false;
  auto* del = app.add_subcommand("delete",
                                 "Delete every object of the submitted job; the data volume "
                                 "and the token Secret stay unless --data");
  AddCommon(del, &delete_c);
  del->add_flag("--data", with_data,
                "also delete the job's PersistentVolumeClaim (its datasets, "
                "checkpoints, metrics) and its token Secret");
  del->callback([code] {
    auto spec = LoadOrReport(delete_c.spec);
    if (!spec) {
      *code = kExitInvalidSpec;
      return;
    }
    *code = DeleteJob(*spec, delete_c.format, with_data);
  });
}

}  // namespace trainctl::cli
