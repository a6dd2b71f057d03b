#include "render/k8s/render.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>

#include "common/duration.h"
#include "common/strings.h"
#include "job/agent_command.h"
#include "job/paths.h"

namespace trainctl::k8s {

using nlohmann::json;

// The URL travels in the environment, never through the shell's parser. An s3:// URL is read with
// curl's SigV4 (path-style, from AWS_ENDPOINT_URL or AWS's regional endpoint), its credentials
// from a Secret by way of the environment and handed to curl on its standard input, never in an
// argument. Exit 2 (no retry: the Job's podFailurePolicy fails it at once) is a refusal that
// trying again cannot mend, said in one line: a 4xx answer with S3's error code, a checksum that
// does not match (a 5xx answer, once curl's retries are spent, exits 1: the Job tries again).
const char* const kStageScript = R"(set -eu
mkdir -p "$DEST"
cd "$DEST"
if [ -e .trainctl-staged ]; then echo "already staged in $DEST"; exit 0; fi
region=${AWS_REGION:-us-east-1}
case "$URL" in
  s3://*)
    endpoint=${AWS_ENDPOINT_URL:-https://s3.$region.amazonaws.com}
    src="${endpoint%/}/${URL#s3://}"
    code=$( { printf 'user = "%s:%s"\n' "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY"
              if [ -n "${AWS_SESSION_TOKEN:-}" ]; then printf 'header = "x-amz-security-token: %s"\n' "$AWS_SESSION_TOKEN"; fi
            } | curl -sS -K - --aws-sigv4 "aws:amz:$region:s3" -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" \
                --retry 5 --max-time 3600 -o .download -w '%{http_code}' "$src") ;;
  *) code=$(curl -sSL --retry 5 --max-time 3600 -o .download -w '%{http_code}' "$URL") ;;
esac
if [ "$code" != 200 ]; then
  reason=$(sed -n 's:.*<Code>\([A-Za-z]*\)</Code>.*:\1:p' .download 2>/dev/null | head -n 1)
  case "$reason" in
    SignatureDoesNotMatch) hint=": the secret key is not the access key's" ;;
    InvalidAccessKeyId) hint=": the store knows no such access key" ;;
    NoSuchBucket) hint=": no such bucket" ;;
    NoSuchKey) hint=": no such key in the bucket" ;;
    AccessDenied) hint=": the key may not read it" ;;
    *) hint="" ;;
  esac
  rm -f .download
  echo "stage: GET $URL failed: HTTP $code${reason:+ $reason}$hint" >&2
  case "$code" in 4*) exit 2 ;; *) exit 1 ;; esac
fi
if [ -n "$SHA256" ]; then
  got=$(sha256sum .download | cut -d' ' -f1)
  if [ "$got" != "$SHA256" ]; then
    rm -f .download
    echo "stage: $URL has sha256 $got, not cluster.stage.sha256 $SHA256" >&2
    exit 2
  fi
fi
name=$(basename "${URL%%\?*}")
case "$name" in
  *.tar.gz|*.tgz) tar -xzf .download ;;
  *.tar) tar -xf .download ;;
  *.zip) unzip -q .download ;;
  *.gz) gunzip -c .download > "${name%.gz}" ;;
  *) cp .download "$name" ;;
esac
rm -f .download
touch .trainctl-staged
echo "staged $URL into $DEST"
)";

const char* const kEtcdImage = "quay.io/coreos/etcd:v3.5.15";

namespace {

constexpr const char* kSpecDir = "/etc/trainctl";
constexpr int kUid = 1000;  // the image's non-root user (deploy/Dockerfile)

std::string Under(const std::string& mount, const std::string& path) {
  if (path.empty()) return mount;
  return path[0] == '/' ? path : mount + "/" + path;
}

// A Kubernetes quantity from bytes: the largest binary unit that divides it.
std::string Bytes(int64_t b) {
  static const char* units[] = {"Ki", "Mi", "Gi", "Ti"};
  std::string unit;
  for (const char* u : units) {
    if (b % 1024 != 0) break;
    b /= 1024;
    unit = u;
  }
  return std::to_string(b) + unit;
}

std::string Cpus(double cpus) {
  long long milli = std::llround(cpus * 1000);
  return milli % 1000 == 0 ? std::to_string(milli / 1000) : std::to_string(milli) + "m";
}

struct Names {
  std::string job, ns, svc, spec, data, token, etcd, stage, eval, tensorboard, submitter;
  explicit Names(const JobSpec& s)
      : job(s.name),
        ns(s.cluster.namespace_),
        svc(s.name),
        spec(s.name + "-spec"),
        data(s.cluster.storage.claim.empty() ? s.name + "-data" : s.cluster.storage.claim),
        token(s.cluster.token_secret.empty() ? s.name + "-token" : s.cluster.token_secret),
        etcd(s.name + "-etcd"),
        stage(s.name + "-stage"),
        eval(s.name + "-eval"),
        tensorboard(s.name + "-tensorboard"),
        submitter(s.name + "-submitter") {}
};

class Renderer {
 public:
  Renderer(const JobSpec& spec, const std::string& format)
      : s_(spec), pod_(PodSpec(spec)), c_(spec.cluster), n_(spec), format_(format) {}

  std::vector<json> All() {
    std::vector<json> out;
    out.push_back(Object("v1", "ServiceAccount", n_.job, "job", {{"automountServiceAccountToken", false}}));
    out.push_back(Object("v1", "ConfigMap", n_.spec, "job", {{"data", {{"job.json", JobSpecToJson(pod_, 2) + "\n"}}}}));
    if (c_.storage.claim.empty()) out.push_back(Claim());
    out.push_back(Policy());
    if (format_ == "job") out.push_back(HeadlessService());
    if (Etcd()) {
      out.push_back(EtcdSet());
      out.push_back(Service(n_.etcd, "etcd", 2379, "client"));
    }
    if (!c_.stage.url.empty()) out.push_back(StageJob());
    if (format_ == "pytorchjob") {
      out.push_back(PyTorchJob());
    } else if (format_ == "tfjob") {
      out.push_back(TFJob());
    } else if (format_ == "mpijob") {
      out.push_back(MPIJob());
    } else if (format_ == "trainjob") {
      out.push_back(TrainJob());
    } else if (s_.roles.empty()) {
      out.push_back(IndexedJob());
    } else {
      for (const auto& role : s_.roles) out.push_back(RoleJob(role));
    }
    if (c_.pod_monitor) out.push_back(PodMonitor());
    if (s_.trainer.enabled) out.push_back(EvalJob());
    if (c_.tensorboard) {
      out.push_back(TensorBoard());
      out.push_back(Service(n_.tensorboard, "tensorboard", 6006, "http"));
    }
    out.push_back(SubmitterRole());
    return out;
  }

 private:
  bool Etcd() const { return s_.rendezvous.empty() && s_.nodes.min < s_.nodes.max; }

  json Labels(const std::string& component) const {
    return {{"app.kubernetes.io/name", "trainctl"},
            {"app.kubernetes.io/instance", n_.job},
            {"app.kubernetes.io/component", component},
            {"trainctl.dev/job", n_.job}};
  }

  json Meta(const std::string& name, const std::string& component) const {
    return {{"name", name}, {"namespace", n_.ns}, {"labels", Labels(component)}};
  }

  json Object(const std::string& api, const std::string& kind, const std::string& name, const std::string& component,
              json rest) const {
    json o = {{"apiVersion", api}, {"kind", kind}, {"metadata", Meta(name, component)}};
    o.update(rest);
    return o;
  }

  // The "restricted" Pod Security Standard, for pods and for containers.
  static json PodSecurity() {
    return {{"runAsNonRoot", true},
            {"runAsUser", kUid},
            {"runAsGroup", kUid},
            {"fsGroup", kUid},
            {"seccompProfile", {{"type", "RuntimeDefault"}}}};
  }
  static json ContainerSecurity() {
    return {{"allowPrivilegeEscalation", false},
            {"readOnlyRootFilesystem", true},
            {"runAsNonRoot", true},
            {"capabilities", {{"drop", {"ALL"}}}}};
  }

  json Volumes(bool read_only_data) const {
    json data = {{"name", "data"}, {"persistentVolumeClaim", {{"claimName", n_.data}}}};
    if (read_only_data) data["persistentVolumeClaim"]["readOnly"] = true;
    return json::array({data,
                        {{"name", "spec"}, {"configMap", {{"name", n_.spec}}}},
                        {{"name", "tmp"}, {"emptyDir", json::object()}},
                        // Shared memory for the one-node collectives and the in-memory snapshot;
                        // a container's own /dev/shm is 64 MiB.
                        {{"name", "shm"}, {"emptyDir", {{"medium", "Memory"}}}}});
  }

  json Mounts(bool read_only_data) const {
    json data = {{"name", "data"}, {"mountPath", c_.storage.mount}};
    if (read_only_data) data["readOnly"] = true;
    return json::array({data,
                        {{"name", "spec"}, {"mountPath", kSpecDir}, {"readOnly", true}},
                        {{"name", "tmp"}, {"mountPath", "/tmp"}},
                        {{"name", "shm"}, {"mountPath", "/dev/shm"}}});
  }

  json Container(const std::string& name, const std::string& image, json command, json env,
                 bool read_only_data = false) const {
    json c = {{"name", name},
              {"image", image},
              {"imagePullPolicy", "IfNotPresent"},
              {"command", std::move(command)},
              {"env", std::move(env)},
              {"workingDir", c_.storage.mount},
              {"volumeMounts", Mounts(read_only_data)},
              {"securityContext", ContainerSecurity()}};
    c["env"].push_back({{"name", "HOME"}, {"value", "/tmp"}});  // the root filesystem is read-only
    return c;
  }

  // A pod of `component`. Only the pods that train (the workers) get the spec's node selector and
  // tolerations: eval, TensorBoard, staging, etcd and an MPI launcher neither
  // need a GPU node nor should hold one (a TensorBoard pinned to a GPU node keeps the autoscaler
  // from removing it).
  json PodTemplate(const std::string& component, json containers, json init = json::array(),
                   bool read_only_data = false) const {
    const bool trains = component == "worker";
    json spec = {{"serviceAccountName", n_.job},        {"automountServiceAccountToken", false},
                 {"enableServiceLinks", false},         {"securityContext", PodSecurity()},
                 {"containers", std::move(containers)}, {"volumes", Volumes(read_only_data)}};
    if (!init.empty()) spec["initContainers"] = std::move(init);
    if (trains && !c_.node_selector.empty()) {
      json sel = json::object();
      for (const auto& [k, v] : c_.node_selector) sel[k] = v;
      spec["nodeSelector"] = sel;
    }
    if (trains && !c_.tolerations.empty()) {
      json tol = json::array();
      for (const auto& t : c_.tolerations) {
        json one = {{"operator", t.op}};
        if (!t.key.empty()) one["key"] = t.key;
        if (!t.value.empty()) one["value"] = t.value;
        if (!t.effect.empty()) one["effect"] = t.effect;
        tol.push_back(one);
      }
      spec["tolerations"] = tol;
    }
    if (!c_.image_pull_secret.empty()) spec["imagePullSecrets"] = {{{"name", c_.image_pull_secret}}};
    return {{"metadata", {{"labels", Labels(component)}}}, {"spec", spec}};
  }

  // An init container that waits for `file` on the shared volume, for at most `limit`.
  json WaitFor(const std::string& what, const std::string& file, Duration limit) const {
    const long long tries = std::max<long long>(1, limit.count() / 5000);
    std::string script = "i=0\nuntil [ -e \"$WAIT_FILE\" ]; do\n  i=$((i+1))\n  if [ \"$i\" -gt " +
                         std::to_string(tries) + " ]; then\n    echo \"trainctl: gave up after " +
                         FormatDuration(limit) + " waiting for " + what + " ($WAIT_FILE)\" >&2\n" +
                         "    exit 1\n  fi\n  sleep 5\ndone\n";
    return Container("wait-" + what, c_.image, {"sh", "-c", script}, {{{"name", "WAIT_FILE"}, {"value", file}}}, true);
  }

  std::string StagedMarker() const { return pod_.trainer.data.dir + "/.trainctl-staged"; }

  // A pod's requests and limits: `tasks` tasks of `r` each (a node's workers, or one task).
  static json PodResources(const ResourcesSpec& r, int tasks) {
    json amounts = json::object();
    if (r.cpus > 0) amounts["cpu"] = Cpus(r.cpus * tasks);
    if (r.memory_bytes > 0) amounts["memory"] = Bytes(r.memory_bytes * tasks);
    json res = json::object();
    if (!amounts.empty()) res = {{"requests", amounts}, {"limits", amounts}};
    if (r.gpus > 0) res["limits"]["nvidia.com/gpu"] = r.gpus * tasks;
    return res;
  }
  json Resources() const { return PodResources(s_.resources, s_.procs_per_node); }
  // Requests and limits of a pod that does not train (eval, TensorBoard, staging, the MPI
  // launcher, etcd): enough for it, so it is neither starved on a busy node nor unbounded.
  static json SideResources(double cpus, int64_t memory_mib) {
    ResourcesSpec r;
    r.cpus = cpus;
    r.memory_bytes = memory_mib << 20;
    return PodResources(r, 1);
  }

  // The agent, one per pod. `rank` ("ROLE:INDEX" for a pod per task) and `store` are what this
  // format's pods know of themselves; `resources` the pod's.
  json AgentContainer(const std::string& name, const std::string& rank, const std::string& store,
                      const std::string& uid_label, json resources = nullptr) const {
    AgentCommand agent;
    agent.spec_file = std::string(kSpecDir) + "/job.json";
    agent.run_id = "$(TRAINCTL_RUN_ID)";
    (rank.find(':') != std::string::npos ? agent.task : agent.node_rank) = rank;
    agent.host = "$(POD_IP)";
    agent.serve_store = store.rfind("tcp://", 0) == 0;
    agent.metrics_port = c_.metrics_port;
    // A pod's SIGTERM is the pod going away (deleted, evicted, drained), not the job's end: the
    // Job replaces the pod and the other agents go on at a new round (trainctl delete removes
    // them all).
    agent.leave_on_signal = true;
    json command = agent.Argv();
    json env = {{{"name", "POD_IP"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "status.podIP"}}}}}},
                {{"name", "TRAINCTL_RUN_ID"}, {"value", n_.job}},
                {{"name", kEnvStoreAddr}, {"value", store}},
                {{"name", kEnvStoreToken}, {"valueFrom", {{"secretKeyRef", {{"name", n_.token}, {"key", "token"}}}}}}};
    if (!uid_label.empty()) {
      // Unique per submitted Job object: state an earlier job left in an etcd is never reused.
      json uid = {{"name", "JOB_UID"},
                  {"valueFrom", {{"fieldRef", {{"fieldPath", "metadata.labels['" + uid_label + "']"}}}}}};
      env.insert(env.begin() + 1, uid);
      env[2]["value"] = n_.job + "-$(JOB_UID)";
    }
    json c = Container(name, c_.image, command, env);
    c["ports"] = {{{"name", "store"}, {"containerPort", kStorePort}}};
    if (c_.metrics_port > 0) c["ports"].push_back({{"name", "metrics"}, {"containerPort", c_.metrics_port}});
    json res = resources.is_null() ? Resources() : resources;
    if (!res.empty()) c["resources"] = res;
    return c;
  }

  // Adds an environment variable read from the pod's own labels (a replica index).
  static void EnvFromLabel(json& container, const std::string& name, const std::string& label) {
    json var = {{"name", name}, {"valueFrom", {{"fieldRef", {{"fieldPath", "metadata.labels['" + label + "']"}}}}}};
    container["env"].insert(container["env"].begin(), var);
  }

  json Init() const {
    json init = json::array();
    if (!c_.stage.url.empty()) {
      init.push_back(WaitFor("dataset", StagedMarker(), std::chrono::hours(1)));
    }
    return init;
  }

  std::string StoreUrl(const std::string& node0) const {
    if (!s_.rendezvous.empty()) return s_.rendezvous;
    if (Etcd()) return "etcd://" + n_.etcd + ":2379";
    return "tcp://" + node0 + ":" + std::to_string(kStorePort);
  }

  json IndexedJob() const {
    const bool elastic = s_.nodes.min < s_.nodes.max;
    json tmpl = PodTemplate("worker",
                            {AgentContainer("trainctl", elastic ? "-1" : "$(JOB_COMPLETION_INDEX)",
                                            StoreUrl(n_.job + "-0." + n_.svc), "batch.kubernetes.io/controller-uid")},
                            Init());
    return AgentJob(n_.job, s_.nodes.max, tmpl);
  }

  // An Indexed Job of `pods` agents (pod i: completion index i) of the pod template `tmpl`.
  json AgentJob(const std::string& name, int pods, json tmpl) const {
    tmpl["spec"]["subdomain"] = n_.svc;
    tmpl["spec"]["restartPolicy"] = "Never";
    json spec = {
        {"completionMode", "Indexed"},
        {"completions", pods},
        {"parallelism", pods},
        // A pod lost with its node is replaced and rejoins; trainctl's own restart budget
        // (restart.max_restarts) governs worker failures, so an agent that exits with a verdict
        // (invalid spec 2, budget spent 3, rendezvous timeout 4, job timeout 5) ends the Job.
        {"backoffLimit", s_.restart.max_restarts},
        {"podFailurePolicy",
         {{"rules",
           {{{"action", "FailJob"},
             {"onExitCodes", {{"containerName", "trainctl"}, {"operator", "In"}, {"values", {2, 3, 4, 5}}}}},
            {{"action", "Ignore"}, {"onPodConditions", {{{"type", "DisruptionTarget"}, {"status", "True"}}}}}}}}},
        {"template", tmpl}};
    if (s_.timeouts.job.count() > 0) {
      spec["activeDeadlineSeconds"] = std::max<int64_t>(1, s_.timeouts.job.count() / 1000);
    }
    return Object("batch/v1", "Job", name, "worker", {{"spec", spec}});
  }

  // Kubeflow's PyTorchJob: Worker pods only, as the TFJob's without roles. The operator's
  // per-replica Services give the first pod the name <job>-worker-0, which serves the store, and
  // each pod learns its index from the replica-index label; the container must be "pytorch".
  // No Master: with one, the Training Operator adds its own init container to every Worker
  // (init-pytorch: alpine as root, no securityContext), which a "restricted" namespace refuses
  // (seen on the live cluster); trainctl's agents wait for the store themselves.
  json PyTorchJob() const {
    const bool elastic = s_.nodes.min < s_.nodes.max;
    json c = AgentContainer("pytorch", elastic ? "-1" : "$(REPLICA_INDEX)", StoreUrl(n_.job + "-worker-0"), "");
    EnvFromLabel(c, "REPLICA_INDEX", "training.kubeflow.org/replica-index");
    json tmpl = PodTemplate("worker", {c}, Init());
    // As the TFJob's: trainctl's verdicts (exit codes 1-127) fail the job; 128+ (a signal: a lost
    // node, OOM) restart the pod. Without a Master the job succeeds when every Worker has.
    json replicas = {{"Worker", {{"replicas", s_.nodes.max}, {"restartPolicy", "ExitCode"}, {"template", tmpl}}}};
    json spec = {{"runPolicy", RunPolicy(s_.restart.max_restarts)}, {"pytorchReplicaSpecs", replicas}};
    return Object("kubeflow.org/v1", "PyTorchJob", n_.job, "worker", {{"spec", spec}});
  }

  json RunPolicy(int backoff) const {
    json p = {{"cleanPodPolicy", "None"}, {"backoffLimit", backoff}};
    if (s_.timeouts.job.count() > 0) p["activeDeadlineSeconds"] = std::max<int64_t>(1, s_.timeouts.job.count() / 1000);
    return p;
  }

  // One Indexed Job per role of a job with roles: a pod per task, each with its role's
  // resources; the pods of every role share the headless Service, so the first task's pod
  // (<job>-<first role>-0.<job>) serves the store.
  json RoleJob(const RoleSpec& role) const {
    const std::string name = n_.job + "-" + role.name;
    json c =
        AgentContainer("trainctl", role.name + ":$(JOB_COMPLETION_INDEX)",
                       StoreUrl(n_.job + "-" + s_.roles[0].name + "-0." + n_.svc), "", PodResources(role.resources, 1));
    json tmpl = PodTemplate("worker", {c}, Init());
    tmpl["metadata"]["labels"]["trainctl.dev/role"] = role.name;
    json o = AgentJob(name, role.replicas, tmpl);
    o["metadata"]["labels"]["trainctl.dev/role"] = role.name;
    return o;
  }

  // Kubeflow's TFJob: a replica type per role (a pod per task) or, without roles, Worker pods of
  // procs_per_node workers each. The operator's per-replica Services give the first task's pod
  // the name <job>-<type>-0; each pod learns its index from the operator's replica-index label.
  // trainctl's agents run the tasks and set TF_CONFIG themselves (on addresses they reserve).
  json TFJob() const {
    static const std::map<std::string, std::string> types = {
        {"chief", "Chief"}, {"master", "Master"}, {"ps", "PS"}, {"worker", "Worker"}, {"evaluator", "Evaluator"}};
    const std::string first = s_.roles.empty() ? "worker" : s_.roles[0].name;
    const std::string store = StoreUrl(n_.job + "-" + first + "-0");
    auto replica = [&](int replicas, const std::string& rank, json resources, const std::string& role) {
      json c = AgentContainer("tensorflow", rank, store, "", std::move(resources));
      EnvFromLabel(c, "REPLICA_INDEX", "training.kubeflow.org/replica-index");
      json tmpl = PodTemplate("worker", {c}, Init());
      if (!role.empty()) tmpl["metadata"]["labels"]["trainctl.dev/role"] = role;
      // Exit codes 1-127 (trainctl's verdicts) fail the job; 128+ (a signal: a lost node, OOM) restart the pod.
      return json{{"replicas", replicas}, {"restartPolicy", "ExitCode"}, {"template", tmpl}};
    };
    json replicas = json::object();
    bool decider = false;
    if (s_.roles.empty()) {
      replicas["Worker"] = replica(s_.nodes.max, "$(REPLICA_INDEX)", Resources(), "");
    } else {
      for (const auto& r : s_.roles) {
        replicas[types.at(r.name)] =
            replica(r.replicas, r.name + ":$(REPLICA_INDEX)", PodResources(r.resources, 1), r.name);
        decider = decider || r.name == "chief" || r.name == "master";
      }
    }
    json spec = {{"runPolicy", RunPolicy(s_.restart.max_restarts)}, {"tfReplicaSpecs", replicas}};
    // Without a chief, every worker decides the job's success, as trainctl's agents do.
    if (!decider) spec["successPolicy"] = "AllWorkers";
    return Object("kubeflow.org/v1", "TFJob", n_.job, "worker", {{"spec", spec}});
  }

  // The MPI Operator's MPIJob (v2beta1): the launcher runs `trainctl run --target mpi` on the
  // operator's hostfile, so mpirun starts one agent per worker pod over ssh; the workers run
  // sshd as the image's non-root user on port 2222 (deploy/Dockerfile's mpi stage), with the
  // operator's keys at sshAuthMountPath. The launcher serves the job's store on its pod IP.
  json MPIJob() const {
    // `run --target mpi` waits for every worker's sshd first (a new pod's first connections may
    // be dropped while the cluster's NetworkPolicy enforcer admits it: on the live cluster,
    // mpirun's first ssh failed with "Resource temporarily unavailable", and 12 s later trained).
    json launch = {"trainctl",          "run",          std::string(kSpecDir) + "/job.json",
                   "--target",          "mpi",          "--hostfile",
                   "/etc/mpi/hostfile", "--store-host", "$(POD_IP)",
                   "--resume"};  // a restarted launcher pod continues the run
    json env = {{{"name", "POD_IP"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "status.podIP"}}}}}}};
    json launcher = Container("launcher", c_.image, launch, env);
    launcher["resources"] = SideResources(0.5, 1024);  // mpirun and the job's store
    json worker = Container("worker", c_.image, {"/usr/sbin/sshd", "-De"}, json::array());
    worker["ports"] = {{{"name", "ssh"}, {"containerPort", 2222}}, {{"name", "store"}, {"containerPort", kStorePort}}};
    // Ready once sshd answers: the operator makes the launcher only then (WaitForWorkersReady), and
    // the workers' names in its hostfile resolve only for ready pods (seen on the live cluster:
    // "ssh: Could not resolve hostname" at once, without them).
    worker["readinessProbe"] = {{"tcpSocket", {{"port", 2222}}}, {"periodSeconds", 2}};
    json res = Resources();
    if (!res.empty()) worker["resources"] = res;
    json launcher_tmpl = PodTemplate("launcher", {launcher}, Init());
    json worker_tmpl = PodTemplate("worker", {worker});
    json spec = {{"slotsPerWorker", 1},
                 {"launcherCreationPolicy", "WaitForWorkersReady"},
                 {"runPolicy", RunPolicy(0)},  // trainctl restarts the workers itself
                 {"sshAuthMountPath", "/home/trainctl/.ssh"},
                 {"mpiImplementation", "OpenMPI"},
                 {"mpiReplicaSpecs",
                  {{"Launcher", {{"replicas", 1}, {"restartPolicy", "Never"}, {"template", launcher_tmpl}}},
                   {"Worker", {{"replicas", s_.nodes.max}, {"restartPolicy", "Never"}, {"template", worker_tmpl}}}}}};
    return Object("kubeflow.org/v2beta1", "MPIJob", n_.job, "worker", {{"spec", spec}});
  }

  // Kubeflow Trainer v2 (v2.3): a TrainJob on the torch-distributed runtime, whose JobSet gives
  // node i the name <job>-node-0-i.<job> and JOB_COMPLETION_INDEX = i. What the runtime's pod
  // lacks comes in a runtime patch of trainctl's own: the job's labels (the NetworkPolicy selects
  // by them), account, volumes, the restricted security contexts, the node selector,
  // tolerations and pull secret, and the node container's mounts.
  json TrainJob() const {
    // A fresh run id per submission: the JobSet's uid, which JobSet labels each pod with.
    json c = AgentContainer("node", "$(JOB_COMPLETION_INDEX)", StoreUrl(n_.job + "-node-0-0." + n_.job),
                            "jobset.sigs.k8s.io/jobset-uid");
    json trainer = {{"image", c_.image},
                    {"command", c["command"]},
                    {"env", c["env"]},
                    {"numNodes", s_.nodes.max},
                    {"numProcPerNode", s_.procs_per_node}};
    if (c.contains("resources")) trainer["resourcesPerNode"] = c["resources"];
    json pod = PodTemplate("worker", json::array());
    json patch = {
        {"containers",
         {{{"name", "node"}, {"volumeMounts", c["volumeMounts"]}, {"securityContext", c["securityContext"]}}}}};
    for (const char* k :
         {"serviceAccountName", "securityContext", "volumes", "nodeSelector", "tolerations", "imagePullSecrets"}) {
      if (pod["spec"].contains(k)) patch[k] = pod["spec"][k];
    }
    json node = {{"name", "node"},
                 {"template", {{"spec", {{"template", {{"metadata", pod["metadata"]}, {"spec", patch}}}}}}}};
    json runtime_patch = {{"manager", "trainctl.dev/render"},
                          {"trainingRuntimeSpec", {{"template", {{"spec", {{"replicatedJobs", {node}}}}}}}}};
    json spec = {
        {"runtimeRef",
         {{"name", "torch-distributed"}, {"kind", "ClusterTrainingRuntime"}, {"apiGroup", "trainer.kubeflow.org"}}},
        {"trainer", trainer},
        {"runtimePatches", {runtime_patch}}};
    return Object("trainer.kubeflow.org/v1alpha1", "TrainJob", n_.job, "worker", {{"spec", spec}});
  }

  json Claim() const {
    json spec = {{"accessModes", {"ReadWriteMany"}}, {"resources", {{"requests", {{"storage", c_.storage.size}}}}}};
    if (!c_.storage.storage_class.empty()) spec["storageClassName"] = c_.storage.storage_class;
    return Object("v1", "PersistentVolumeClaim", n_.data, "storage", {{"spec", spec}});
  }

  // Only the job's own pods reach its pods, on any port (the store, Gloo, NCCL, etcd); the agents' metrics port
  // (token-guarded) is open to the cluster's Prometheus, wherever it runs.
  json Policy() const {
    json job_pods = {{"matchLabels", {{"trainctl.dev/job", n_.job}}}};
    json ingress = {{{"from", {{{"podSelector", job_pods}}}}}};
    if (c_.metrics_port > 0) {
      ingress.push_back({{"from", {{{"namespaceSelector", json::object()}}}},
                         {"ports", {{{"protocol", "TCP"}, {"port", c_.metrics_port}}}}});
    }
    return Object("networking.k8s.io/v1", "NetworkPolicy", n_.job, "network",
                  {{"spec", {{"podSelector", job_pods}, {"policyTypes", {"Ingress"}}, {"ingress", ingress}}}});
  }

  // The Prometheus Operator's PodMonitor: every pod of the job with a `metrics` port, scraped with
  // the job's token from its Secret. The series' own `job` label (the trainctl job) is kept.
  json PodMonitor() const {
    json endpoint = {{"port", "metrics"},
                     {"path", "/metrics"},
                     {"honorLabels", true},
                     {"interval", "15s"},
                     {"authorization", {{"type", "Bearer"}, {"credentials", {{"name", n_.token}, {"key", "token"}}}}}};
    return Object(
        "monitoring.coreos.com/v1", "PodMonitor", n_.job, "monitoring",
        {{"spec",
          {{"selector", {{"matchLabels", {{"trainctl.dev/job", n_.job}}}}}, {"podMetricsEndpoints", {endpoint}}}}});
  }

  // Stable DNS names <job>-<index>.<job> for the Indexed Job's pods.
  json HeadlessService() const {
    return Object("v1", "Service", n_.svc, "worker",
                  {{"spec",
                    {{"clusterIP", "None"},
                     {"publishNotReadyAddresses", true},
                     {"selector", {{"trainctl.dev/job", n_.job}, {"app.kubernetes.io/component", "worker"}}},
                     {"ports", {{{"name", "store"}, {"port", kStorePort}}}}}}});
  }

  json Service(const std::string& name, const std::string& component, int port, const std::string& port_name) const {
    return Object("v1", "Service", name, component,
                  {{"spec",
                    {{"selector", {{"trainctl.dev/job", n_.job}, {"app.kubernetes.io/component", component}}},
                     {"ports", {{{"name", port_name}, {"port", port}, {"targetPort", port}}}}}}});
  }

  json EtcdSet() const {
    json command = {"etcd",
                    "--name",
                    n_.etcd + "-0",
                    "--data-dir",
                    "/tmp/etcd",
                    "--listen-client-urls",
                    "http://0.0.0.0:2379",
                    "--advertise-client-urls",
                    "http://" + n_.etcd + ":2379",
                    "--listen-peer-urls",
                    "http://127.0.0.1:2380"};
    json c = Container("etcd", kEtcdImage, command, json::array());
    c["ports"] = {{{"name", "client"}, {"containerPort", 2379}}};
    c.erase("workingDir");
    c["volumeMounts"] = {{{"name", "tmp"}, {"mountPath", "/tmp"}}};
    c["resources"] = SideResources(0.5, 1024);
    json tmpl = PodTemplate("etcd", {c});
    tmpl["spec"]["volumes"] = {{{"name", "tmp"}, {"emptyDir", json::object()}}};
    return Object(
        "apps/v1", "StatefulSet", n_.etcd, "etcd",
        {{"spec",
          {{"serviceName", n_.etcd},
           {"replicas", 1},
           {"selector", {{"matchLabels", {{"trainctl.dev/job", n_.job}, {"app.kubernetes.io/component", "etcd"}}}}},
           {"template", tmpl}}}});
  }

  json StageJob() const {
    json env = {{{"name", "URL"}, {"value", c_.stage.url}},
                {{"name", "SHA256"}, {"value", c_.stage.sha256}},
                {{"name", "DEST"}, {"value", pod_.trainer.data.dir}}};
    if (!c_.stage.credentials.empty()) {
      const std::pair<const char*, bool> keys[] = {{"AWS_ACCESS_KEY_ID", false},
                                                   {"AWS_SECRET_ACCESS_KEY", false},
                                                   {"AWS_SESSION_TOKEN", true},
                                                   {"AWS_REGION", true},
                                                   {"AWS_ENDPOINT_URL", true}};
      for (const auto& [key, optional] : keys) {
        json ref = {{"name", c_.stage.credentials}, {"key", key}};
        if (optional) ref["optional"] = true;
        env.push_back({{"name", key}, {"valueFrom", {{"secretKeyRef", ref}}}});
      }
    }
    json stage = Container("stage", c_.image, {"sh", "-c", kStageScript}, env);
    stage["resources"] = SideResources(1, 1024);
    json tmpl = PodTemplate("stage", {stage});
    tmpl["spec"]["restartPolicy"] = "Never";
    // Exit 2: a refusal that another try cannot mend (a wrong key, no such object, a checksum).
    json failure = {{"rules",
                     {{{"action", "FailJob"},
                       {"onExitCodes", {{"containerName", "stage"}, {"operator", "In"}, {"values", {2}}}}}}}};
    return Object("batch/v1", "Job", n_.stage, "stage",
                  {{"spec",
                    {{"backoffLimit", 3},
                     {"activeDeadlineSeconds", 4 * 3600},
                     {"podFailurePolicy", failure},
                     {"template", tmpl}}}});
  }

  json EvalJob() const {
    const std::string model = paths::Model(pod_.output_dir);
    // Waits for the trained model as long as the job may run (timeouts.job, else a week).
    const Duration limit = s_.timeouts.job.count() > 0 ? s_.timeouts.job : Duration(std::chrono::hours(24 * 7));
    json command = {"trainctl", "eval", "--checkpoint", model, "-o", "json"};
    json c = Container("eval", c_.image, command, json::array(), true);
    c["resources"] = PodResources(c_.eval_resources, 1);
    json tmpl = PodTemplate("eval", {c}, {WaitFor("model", model, limit)}, true);
    tmpl["spec"]["restartPolicy"] = "Never";
    return Object("batch/v1", "Job", n_.eval, "eval", {{"spec", {{"backoffLimit", 2}, {"template", tmpl}}}});
  }

  json TensorBoard() const {
    json command = {"tensorboard", "--logdir", pod_.output_dir, "--host", "0.0.0.0", "--port", "6006"};
    json c = Container("tensorboard", c_.tensorboard_image, command, json::array(), true);
    c["ports"] = {{{"name", "http"}, {"containerPort", 6006}}};
    c["resources"] = PodResources(c_.tensorboard_resources, 1);
    json tmpl = PodTemplate("tensorboard", {c}, json::array(), true);
    return Object(
        "apps/v1", "Deployment", n_.tensorboard, "tensorboard",
        {{"spec",
          {{"replicas", 1},
           {"selector",
            {{"matchLabels", {{"trainctl.dev/job", n_.job}, {"app.kubernetes.io/component", "tensorboard"}}}}},
           {"template", tmpl}}}});
  }

  // What `trainctl submit/status/logs/delete` need in the namespace, and nothing more: no
  // wildcards, no cluster scope. Bind it to the people or CI accounts that run the job.
  json SubmitterRole() const {
    const json manage = {"get", "list", "create", "patch", "delete"};
    json rules = {
        {{"apiGroups", {""}},
         {"resources", {"configmaps", "services", "serviceaccounts", "persistentvolumeclaims"}},
         {"verbs", manage}},
        {{"apiGroups", {""}}, {"resources", {"secrets"}}, {"verbs", {"get", "create"}}},
        // delete --data: the job's token, by name (a Secret that submit may have made).
        {{"apiGroups", {""}}, {"resources", {"secrets"}}, {"resourceNames", {n_.token}}, {"verbs", {"delete"}}},
        {{"apiGroups", {""}}, {"resources", {"pods"}}, {"verbs", {"get", "list", "watch"}}},
        {{"apiGroups", {""}}, {"resources", {"pods/log"}}, {"verbs", {"get"}}},
        {{"apiGroups", {"batch"}},
         {"resources", {"jobs"}},
         {"verbs", {"get", "list", "watch", "create", "patch", "delete"}}},
        {{"apiGroups", {"apps"}}, {"resources", {"deployments", "statefulsets"}}, {"verbs", manage}},
        {{"apiGroups", {"networking.k8s.io"}}, {"resources", {"networkpolicies"}}, {"verbs", manage}}};
    static const std::map<std::string, std::pair<std::string, std::string>> kinds = {
        {"pytorchjob", {"kubeflow.org", "pytorchjobs"}},
        {"tfjob", {"kubeflow.org", "tfjobs"}},
        {"mpijob", {"kubeflow.org", "mpijobs"}},
        {"trainjob", {"trainer.kubeflow.org", "trainjobs"}}};
    if (auto it = kinds.find(format_); it != kinds.end()) {
      rules.push_back({{"apiGroups", {it->second.first}},
                       {"resources", {it->second.second}},
                       {"verbs", {"get", "list", "watch", "create", "patch", "delete"}}});
    }
    return Object("rbac.authorization.k8s.io/v1", "Role", n_.submitter, "rbac", {{"rules", rules}});
  }

  const JobSpec& s_;
  JobSpec pod_;
  const ClusterSpec& c_;
  Names n_;
  std::string format_;
};

// Strings that a YAML 1.1 reader (kubectl's) would take for something else are quoted.
bool NeedsQuotes(const std::string& s) {
  if (s.empty()) return true;
  static const std::set<std::string> words = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~", "="};
  std::string lower = s;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (words.count(lower)) return true;
  if (std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '-' || s[0] == '+' || s[0] == '.') {
    return true;
  }
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) ||
          std::string_view("_-./:$()'[]@=,+").find(c) != std::string_view::npos)) {
      return true;
    }
  }
  return s.find(": ") != std::string::npos || s.back() == ':';
}

// Whether `s` reads back from a literal block (`|`) exactly as it is: printable ASCII and line
// feeds only (a carriage return, NEL, U+2028 or U+2029 is a line break to a YAML reader that the
// block would not indent, so it could end the block and write fields of its own), one final line
// feed (what `|` keeps), and a first line that starts with neither a space nor a line feed (which
// would need an indentation indicator). Anything else is double-quoted, every byte outside
// printable ASCII escaped (the emitter's EscapeNonAscii).
bool LiteralReadsBack(const std::string& s) {
  if (s.size() < 2 || s.back() != '\n' || s[s.size() - 2] == '\n' || s[0] == ' ' || s[0] == '\n') return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return c == '\n' || (c >= 0x20 && c <= 0x7e); });
}

// One string, as a key or a value: plain where every YAML reader reads it as this string, a
// literal block for a script (values only), else double-quoted.
void EmitString(YAML::Emitter& out, const std::string& s, bool key) {
  if (!key && LiteralReadsBack(s))
    out << YAML::Literal << s;
  else if (NeedsQuotes(s))
    out << YAML::DoubleQuoted << s;
  else
    out << s;
}

void Emit(YAML::Emitter& out, const json& j) {
  switch (j.type()) {
    case json::value_t::object:
      if (j.empty()) {
        out << YAML::Flow << YAML::BeginMap << YAML::EndMap;
        return;
      }
      out << YAML::BeginMap;
      for (auto it = j.begin(); it != j.end(); ++it) {
        out << YAML::Key;
        EmitString(out, it.key(), true);
        out << YAML::Value;
        Emit(out, it.value());
      }
      out << YAML::EndMap;
      return;
    case json::value_t::array:
      if (j.empty()) {
        out << YAML::Flow << YAML::BeginSeq << YAML::EndSeq;
        return;
      }
      out << YAML::BeginSeq;
      for (const auto& v : j) Emit(out, v);
      out << YAML::EndSeq;
      return;
    case json::value_t::string:
      EmitString(out, j.get_ref<const std::string&>(), false);
      return;
    case json::value_t::boolean:
      out << j.get<bool>();
      return;
    case json::value_t::number_integer:
      out << j.get<int64_t>();
      return;
    case json::value_t::number_unsigned:
      out << j.get<uint64_t>();
      return;
    case json::value_t::number_float:
      out << ShortestNumber(j.get<double>());
      return;
    default:
      out << YAML::Null;
      return;
  }
}

// The first field of `j` (the spec's own names: a dotted path, list items in brackets) whose key
// or text holds `bytes`; "" when none does.
std::string FieldHolding(const json& j, const std::string& path, std::string_view bytes) {
  if (j.is_string()) return j.get_ref<const std::string&>().find(bytes) != std::string::npos ? path : "";
  size_t i = 0;
  for (auto it = j.begin(); j.is_structured() && it != j.end(); ++it, ++i) {
    const std::string at =
        j.is_object() ? (path.empty() ? "" : path + ".") + it.key() : path + "[" + std::to_string(i) + "]";
    if (j.is_object() && it.key().find(bytes) != std::string::npos) return at;
    if (std::string found = FieldHolding(*it, at, bytes); !found.empty()) return found;
  }
  return "";
}

std::string Key(const json& o) {
  return o.at("kind").get<std::string>() + "/" + o.at("metadata").at("name").get<std::string>();
}

std::string FileName(const json& o) {
  std::string kind = o.at("kind").get<std::string>();
  std::transform(kind.begin(), kind.end(), kind.begin(), [](unsigned char c) { return std::tolower(c); });
  return kind + "-" + o.at("metadata").at("name").get<std::string>() + ".yaml";
}

}  // namespace

JobSpec PodSpec(const JobSpec& spec) {
  JobSpec p = spec;
  // A job with roles runs one task per pod: as many nodes as tasks.
  if (!p.roles.empty()) p.nodes.min = p.nodes.max = p.world_size();
  const std::string& mount = spec.cluster.storage.mount;
  p.output_dir = Under(mount, spec.output_dir);
  p.checkpoint_dir = Under(mount, spec.checkpoint_dir);
  p.working_dir = Under(mount, spec.working_dir);
  if (p.trainer.enabled) {
    DataSpec& d = p.trainer.data;
    if (!spec.cluster.stage.url.empty() && d.dir.empty())
      d.dir = mount + "/datasets/" + spec.name;
    else if (!d.dir.empty())
      d.dir = Under(mount, d.dir);
    if (!d.test_dir.empty()) d.test_dir = Under(mount, d.test_dir);  // a test folder, as its training folder
    if (!p.trainer.torchscript.empty()) p.trainer.torchscript = Under(mount, p.trainer.torchscript);
  }
  return p;
}

Status CheckFormat(const JobSpec& spec, const std::string& format) {
  // The emitter escapes NEL as it does every byte outside printable ASCII, but the YAML readers of
  // kubectl, kustomize and Helm fold it into a space even so (escaped or not): the pods would get
  // another value than the spec's. U+2028, U+2029 and CR come through as themselves.
  if (std::string field = FieldHolding(json::parse(JobSpecToJson(spec)), "", "\xc2\x85"); !field.empty()) {
    return InvalidArgument(field +
                           ": holds U+0085 (NEL), which kubectl, kustomize and Helm read as a space; the "
                           "pods would not get the spec's text (write a line break as \\n)");
  }
  const bool elastic = spec.nodes.min < spec.nodes.max;
  if (format == "pytorchjob" || format == "mpijob" || format == "trainjob") {
    if (!spec.roles.empty()) {
      return InvalidArgument("roles: --format " + format +
                             " runs one role of identical workers; "
                             "render jobs with roles with --format job or --format tfjob");
    }
  }
  if ((format == "mpijob" || format == "trainjob" || format == "tfjob") && elastic) {
    return InvalidArgument("nodes: --format " + format + " runs a fixed number of nodes, got the range " +
                           std::to_string(spec.nodes.min) + ":" + std::to_string(spec.nodes.max) +
                           "; use --format job or pytorchjob for elastic jobs");
  }
  if (format == "trainjob" && !spec.cluster.stage.url.empty()) {
    return InvalidArgument(
        "cluster.stage: --format trainjob cannot wait for the data-staging Job "
        "(Trainer v2.3's runtime patches cannot add the init container that waits: they set only "
        "env, mounts and security context of the runtime's own); stage the dataset first or use "
        "--format job");
  }
  if (spec.cluster.pod_monitor && (format == "mpijob" || format == "trainjob")) {
    return InvalidArgument("cluster.pod_monitor: --format " + format + " gives its pods no metrics port (" +
                           (format == "mpijob" ? "mpirun starts the agents" : "a TrainJob's pods have no named ports") +
                           "); use --format job, pytorchjob or tfjob");
  }
  if (spec.cluster.pod_monitor && spec.cluster.metrics_port == 0) {
    return InvalidArgument("cluster.pod_monitor: needs cluster.metrics_port, which is 0 (no metrics served)");
  }
  if (format == "tfjob") {
    static const std::vector<std::string> types = {"chief", "master", "ps", "worker", "evaluator"};
    for (size_t i = 0; i < spec.roles.size(); ++i) {
      if (std::find(types.begin(), types.end(), spec.roles[i].name) == types.end()) {
        return InvalidArgument("roles[" + std::to_string(i) +
                               "].name: --format tfjob has the replica "
                               "types chief, master, ps, worker and evaluator; role \"" +
                               spec.roles[i].name + "\" is none of them (use --format job)");
      }
    }
  }
  if (std::find(kFormats.begin(), kFormats.end(), format) == kFormats.end()) {
    return InvalidArgument("unknown format " + format);
  }
  return Status::Ok();
}

std::vector<json> Render(const JobSpec& spec, const std::string& format) { return Renderer(spec, format).All(); }

void SetSubmissionRunId(std::vector<json>* objects, const std::string& run_id) {
  for (json& o : *objects) {
    const char* replicas = o.value("kind", "") == "PyTorchJob" ? "pytorchReplicaSpecs"
                           : o.value("kind", "") == "TFJob"    ? "tfReplicaSpecs"
                                                               : nullptr;
    if (!replicas || !o.contains("spec") || !o["spec"].contains(replicas)) continue;
    for (auto& [type, r] : o["spec"][replicas].items()) {
      for (json& c : r["template"]["spec"]["containers"]) {
        for (json& e : c["env"]) {
          if (e.value("name", "") == "TRAINCTL_RUN_ID") e["value"] = run_id;
        }
      }
    }
  }
}

std::string ToYaml(const std::vector<json>& docs) {
  std::string text;
  for (size_t i = 0; i < docs.size(); ++i) {
    YAML::Emitter out;
    out.SetIndent(2);
    out.SetSeqFormat(YAML::Block);
    out.SetOutputCharset(YAML::EscapeNonAscii);  // every quoted byte outside printable ASCII escaped
    Emit(out, docs[i]);
    if (i > 0) text += "---\n";
    text += out.c_str();
    text += "\n";
  }
  return text;
}

std::map<std::string, std::string> Kustomize(const JobSpec& base,
                                             const std::vector<std::pair<std::string, JobSpec>>& envs,
                                             const std::string& format) {
  std::vector<std::vector<json>> env_objects;
  for (const auto& e : envs) env_objects.push_back(Render(e.second, format));
  auto has = [](const std::vector<json>& objects, const std::string& key) {
    return std::any_of(objects.begin(), objects.end(), [&](const json& o) { return Key(o) == key; });
  };
  // The base holds what every environment has; an overlay patches it and adds its own objects
  // (kustomize 2 cannot delete an object in an overlay without leaving an empty one behind).
  std::map<std::string, std::string> files;
  std::map<std::string, json> shared;
  json resources = json::array();
  for (const auto& o : Render(base, format)) {
    const std::string key = Key(o);
    if (!std::all_of(env_objects.begin(), env_objects.end(),
                     [&](const std::vector<json>& objects) { return has(objects, key); })) {
      continue;
    }
    shared[key] = o;
    files["base/" + FileName(o)] = ToYaml({o});
    resources.push_back(FileName(o));
  }
  files["base/kustomization.yaml"] = ToYaml({{{"resources", resources}}});
  for (size_t i = 0; i < envs.size(); ++i) {
    const std::string dir = "overlays/" + envs[i].first + "/";
    json k = {{"bases", {"../../base"}}};
    json own = json::array(), patches = json::array();
    for (const auto& o : env_objects[i]) {
      auto it = shared.find(Key(o));
      if (it == shared.end()) {
        files[dir + FileName(o)] = ToYaml({o});
        own.push_back(FileName(o));
        continue;
      }
      json patch = json::diff(it->second, o);
      if (patch.empty()) continue;
      const std::string name = "patch-" + FileName(o);
      files[dir + name] = ToYaml({patch});
      std::string api = o.at("apiVersion").get<std::string>();
      auto slash = api.find('/');
      json target = {{"version", slash == std::string::npos ? api : api.substr(slash + 1)},
                     {"kind", o.at("kind")},
                     {"name", o.at("metadata").at("name")}};
      if (slash != std::string::npos) target["group"] = api.substr(0, slash);
      patches.push_back({{"target", target}, {"path", name}});
    }
    if (!own.empty()) k["resources"] = own;
    if (!patches.empty()) k["patchesJson6902"] = patches;
    files[dir + "kustomization.yaml"] = ToYaml({k});
  }
  return files;
}

}  // namespace trainctl::k8s
