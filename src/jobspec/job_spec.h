// JobSpec: everything trainctl knows about a job, after parsing, layering and validation.
// Documented for users in docs/job-spec.md.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/duration.h"
#include "common/status.h"
#include "jobspec/layers.h"

namespace trainctl {

struct NodesSpec {
  int min = 1;  // the job runs with fewer than max but never fewer than min nodes
  int max = 1;  // the local launcher starts max nodes
};

struct ResourcesSpec {  // per worker process; used by the cluster targets
  double cpus = 0;      // 0: not set
  int64_t memory_bytes = 0;
  int gpus = 0;
};

struct RestartSpec {
  int max_restarts = 3;  // worker-group restarts allowed for the whole job, not per node
  // Failures in a row come back ever slower: the first restart is at once, each next one after a
  // round that failed within backoff_max waits backoff, then twice that, ... up to backoff_max.
  Duration backoff = std::chrono::seconds(1);
  Duration backoff_max = std::chrono::seconds(30);
};

struct TimeoutsSpec {
  Duration rendezvous = std::chrono::minutes(5);   // all nodes must join within this
  Duration stop_grace = std::chrono::seconds(10);  // SIGTERM, then SIGKILL after this
  Duration job = Duration(0);                      // whole-job deadline; 0: none
  // Elastic rounds: once min nodes have joined, wait this long for more before closing.
  Duration last_call = std::chrono::seconds(3);
  // A node whose agent has not heartbeated for this long is lost; its round ends.
  Duration heartbeat = std::chrono::seconds(10);
  // Once the job has succeeded: how long roles with `finish` (the evaluator) get to end.
  Duration finish = std::chrono::minutes(5);
  // A collective (allreduce, broadcast, barrier) of the built-in trainer that does not complete
  // in this long fails, naming the ranks that never arrived.
  Duration collective = std::chrono::seconds(60);
};

// The built-in trainer (`trainer:` in a spec, instead of `command:`). docs/job-spec.md lists the
// fields; the trainer itself lives in src/train/.
struct DataSpec {
  std::string dataset = "fashion-mnist";  // fashion-mnist | mnist | cifar10 | imagefolder | synthetic
  std::string dir;                        // "": Debian's Fashion-MNIST for fashion-mnist
  // imagefolder (a folder per class, torchvision's layout): the test images' folder; without it
  // the fraction `holdout` of dir's images, chosen by a hash of their paths, is the test split.
  std::string test_dir;
  double holdout = 0.1;
  std::string bad_images = "skip";  // imagefolder: a file that does not decode: skip | fail
  // augment: training images shifted by up to crop_padding pixels each way, and mirrored half the
  // time (torchvision's RandomCrop with padding, RandomHorizontalFlip); any dataset.
  int crop_padding = 0;
  bool flip = false;
  // imagefolder, augment: torchvision's RandomResizedCrop(scale, ratio) for the training images
  // (streamed: decoded anew each epoch); evaluation then resizes and centre-crops.
  bool random_resized_crop = false;
  std::vector<double> scale = {0.08, 1.0}, ratio = {3.0 / 4, 4.0 / 3};
  // imagefolder: how much of the resized picture the centre view keeps (data/image_view.h); 0:
  // 0.875 with random_resized_crop (torchvision's Resize(256), CenterCrop(224)), else 1.
  double crop_pct = 0;
  // imagefolder: memory (decoded once, kept) | stream (each batch's files decoded as used) |
  // auto (memory while the decoded pictures take at most a quarter of this machine's memory).
  std::string load = "auto";
  int threads = 0;          // imagefolder: decode threads per worker (0: its share of the CPUs)
  int64_t limit = 0;        // use the first N training images (0: all)
  int64_t test_limit = 0;   // use the first N test images (0: all)
  int64_t samples = 10000;  // synthetic: images in the training set
  // synthetic, imagefolder: channels, rows, cols; an image folder's, when left out (empty), its
  // first training picture's (data::FolderShape), which run and validate fill in and say.
  std::vector<int64_t> shape = {1, 28, 28};
  int classes = 10;  // synthetic
};

struct OptimizerSpec {
  std::string name = "sgd";  // sgd | adam
  double lr = 0.01;
  double momentum = 0.9;  // sgd
  double weight_decay = 0;
  bool nesterov = false;                          // sgd
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adam
};

struct ScheduleSpec {
  std::string name = "constant";  // constant | step | cosine | one_cycle
  int64_t warmup_steps = 0;       // linear warm-up from 0 to lr (one_cycle: the rise's length)
  int64_t step_size = 0;          // step: multiply by gamma every step_size steps
  double gamma = 0.1;
  double min_lr = 0;                 // cosine, one_cycle: the floor
  bool scale_by_world_size = false;  // lr *= world size (the linear scaling rule)
};

// trainer.parameter_server: how the parameter-server strategy applies gradients.
struct ParameterServerSpec {
  std::string mode = "sync";  // sync: every worker's gradients each step | async: as they arrive
  int max_staleness = 8;      // async: a gradient computed on parameters older than this many
                              // updates is dropped (and counted), not applied
};

// The most steps trainer.timeline_steps may ask for: each rank's timeline (about 0.8 KB a step)
// travels through the job's store, and etcd keeps values under 1.5 MiB.
inline constexpr int64_t kMaxTimelineSteps = 1000;

struct TrainerSpec {
  bool enabled = false;
  // allreduce: every worker holds the parameters, gradients are averaged among the workers;
  // parameter_server: the parameters and optimizer state are sharded over the ps role's tasks.
  std::string strategy = "allreduce";
  ParameterServerSpec parameter_server;
  // cnn | resnet18 | resnet50, or "layers": the model that `layers` declares (trainer.model:
  // {layers: [...]}), named (NameLayers) and checked against the data's shape when decoded.
  std::string model = "cnn";
  std::vector<LayerSpec> layers;
  // "torchscript" (trainer.model: {torchscript: path}): a module PyTorch saved with
  // torch.jit.script(model).save(path); the path as given (relative: to where trainctl runs).
  std::string torchscript;
  DataSpec data;
  int epochs = 1;
  int64_t max_steps = 0;  // stop after this many steps; 0: run all epochs
  int batch_size = 64;    // per worker
  // even: every worker reads batch_size items a step | speed: the global batch is split by the
  // workers' measured speed (CPU, allreduce), so a worker on a slower core reads fewer.
  std::string balance = "even";
  int global_batch_size = 0;  // if set: split evenly among workers (wins over batch_size)
  OptimizerSpec optimizer;
  ScheduleSpec schedule;
  double label_smoothing = 0;  // the cross-entropy's target: 1 - e on the class, e/C spread
  int64_t seed = 0;
  bool deterministic = false;      // same seed, same world size: the same losses, bit for bit
  int threads = 0;                 // compute threads per worker; 0: OMP_NUM_THREADS
  std::string precision = "fp32";  // fp32 | bf16: mixed precision (autocast's) for the forward pass
  std::string device = "cpu";      // cpu | cuda
  // contiguous | channels_last (N,H,W,C): how 4-D weights, their gradients and the images lie
  // in memory. Checkpoints do not depend on it.
  std::string memory_format = "contiguous";
  bool cudnn_benchmark = false;  // GPU: cuDNN times its algorithms once per shape (not with deterministic)
  std::string backend = "auto";  // auto (nccl for cuda, shm on one node, else gloo) | gloo | shm | nccl
  double bucket_mb = 1;          // gradient bucket size for the overlapped allreduce
  int64_t checkpoint_every = 0;  // steps; 0: at the end of each epoch
  int keep_last = 3;
  // Steps between in-memory snapshots of the training state (each node keeps one in /dev/shm for
  // the job's run); a restart resumes from the newer of it and the newest checkpoint. 0: off.
  int64_t snapshot_every = 20;
  int64_t log_every = 50;  // steps between metric lines
  // Steps whose phases every rank records for <output_dir>/timeline.json (a Chrome trace), after
  // the first log window. 0: off.
  int64_t timeline_steps = 0;
  bool eval = true;    // test accuracy after every epoch
  int eval_every = 1;  // epochs between evaluations; the last epoch is always evaluated
  // `trainctl run` continues the previous run in output_dir from its newest checkpoint (as
  // `run --resume`); false: that run's files are moved aside and training starts from scratch.
  bool resume = false;
};

// Where and how the job runs on a cluster engine (`trainctl render`); the local launcher ignores
// it. docs/cluster.md explains each target.
struct StorageSpec {
  std::string claim;                    // an existing PersistentVolumeClaim; "": render <name>-data
  std::string storage_class;            // of the rendered claim ("": the cluster's default); RWX
  std::string size = "10Gi";            // of the rendered claim
  std::string mount = "/mnt/trainctl";  // where pods mount it: runs/ and datasets/ live there
};

struct StageSpec {
  std::string url;          // an archive (.tar, .tar.gz, .tgz, .zip, .gz) fetched into datasets/<name>
  std::string sha256;       // checked when set
  std::string credentials;  // s3:// only: the Secret with AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, ...
};

struct Toleration {
  std::string key, op = "Equal", value, effect;  // op: Equal | Exists
};

struct ClusterSpec {
  std::string image = "trainctl:latest";
  std::string image_pull_secret;  // a Secret with registry credentials
  std::string namespace_ = "default";
  std::string token_secret;  // Secret (key "token") with the store token; "": <name>-token
  StorageSpec storage;
  StageSpec stage;
  bool tensorboard = true;
  std::string tensorboard_image = "tensorflow/tensorflow:2.15.0";
  // The pods that do not train: the eval Job's (a ResNet-50 on a CPU, its test set in batches;
  // it holds them from the job's start, waiting for the model) and TensorBoard's.
  ResourcesSpec eval_resources{2, int64_t{4} << 30, 0};
  ResourcesSpec tensorboard_resources{0.5, int64_t{2} << 30, 0};
  int metrics_port = 9400;   // each pod's agent serves /metrics here (the job's token); 0: not
  bool pod_monitor = false;  // render a PodMonitor (Prometheus Operator) that scrapes it
  std::vector<std::pair<std::string, std::string>> node_selector;
  std::vector<Toleration> tolerations;
};

// One role of a job of several (`roles:`): `replicas` tasks that run the same program. A job
// without `roles` has one role, `worker`, of nodes x procs_per_node tasks (see JobRoles).
struct RoleSpec {
  std::string name;                                      // a DNS label: ps, worker, chief, evaluator, launcher...
  int replicas = 1;                                      // tasks of this role in the whole job
  std::vector<std::string> command;                      // resolved: the role's own, else the job's; empty when
  std::vector<std::string> args;                         // the built-in trainer plays the role
  std::vector<std::pair<std::string, std::string>> env;  // the job's env, then the role's
  ResourcesSpec resources;                               // per task; resolved: the role's own, else the job's
  // The job succeeds once every task of every role with `success` has exited 0. Defaults: chief
  // or launcher roles when the job has one; else every role but ps and evaluator.
  bool success = true;
  // What a task's failure does: restart_job (the whole group restarts, from restart.max_restarts),
  // restart_task (this task alone restarts, from the same budget; async parameter-server workers)
  // or ignore (reported, the job goes on; the evaluator's default).
  std::string on_failure = "restart_job";
  // Once the job has succeeded, tasks of this role may finish on their own for up to
  // timeouts.finish (the evaluator's default, so it evaluates the final model); other roles still
  // running (ps) are stopped at once.
  bool finish = false;
};

struct JobSpec {
  std::string name;  // DNS-1123 label: [a-z0-9-], at most 63 chars
  NodesSpec nodes;
  int procs_per_node = 1;
  // "cores": each of a node's tasks runs on its own share of the CPUs its agent may use
  // (CpuShare in common/cpus.h), as Slurm's --cpu-bind=cores and mpirun's --bind-to core do;
  // "none": the scheduler moves them where it likes.
  std::string cpu_bind = "none";
  std::vector<std::string> command;                      // the worker program and its first arguments; empty
                                                         // when the built-in trainer runs (trainer.enabled)
  std::vector<std::string> args;                         // appended to command
  std::vector<std::pair<std::string, std::string>> env;  // in spec order
  std::string working_dir;                               // empty: where trainctl runs
  // Python modules a warm interpreter per node imports once; the job's Python workers are forked
  // from it (agent/warm_python.h). Empty: each worker starts its own interpreter.
  std::vector<std::string> preload;
  ResourcesSpec resources;
  RestartSpec restart;
  TimeoutsSpec timeouts;
  std::string rendezvous;      // "": the launcher's embedded store; or etcd://h:p[,h:p]
  std::string output_dir;      // default runs/<name>
  std::string checkpoint_dir;  // default <output_dir>/checkpoints
  TrainerSpec trainer;
  ClusterSpec cluster;
  std::vector<RoleSpec> roles;  // empty: one role, worker (see JobRoles)

  // Every task of the job at full size (nodes.max).
  int world_size() const;
  // The most clients the job's store has at once: an agent per node and a client per task; a
  // built-in trainer's task has a second, its progress watchdog's (comm/progress.h).
  int store_clients() const { return nodes.max + world_size() * (trainer.enabled ? 2 : 1); }
};

// The roles a round of `nodes` nodes runs: the spec's roles, or one role `worker` of
// nodes x procs_per_node tasks running the job's command (or the built-in trainer).
std::vector<RoleSpec> JobRoles(const JobSpec& spec, int nodes);
// Whether a role of the built-in trainer trains the model (its chief and workers), as opposed to
// holding parameters (ps) or evaluating checkpoints (evaluator).
inline bool TrainingRole(const std::string& role) { return role == "chief" || role == "worker"; }
// The images a dataset holds (channels, rows, cols), and its classes: what a declared model takes
// and outputs.
std::vector<int64_t> ImageShape(const DataSpec& data);
int ClassCount(const DataSpec& data);
// A declared model's layers as the spec's JSON writes them (every field, names included), and
// back, checked as a spec's are: checkpoints record them so eval and predict rebuild the model.
std::string LayersToJson(const std::vector<LayerSpec>& layers);
Result<std::vector<LayerSpec>> LayersFromJson(const std::string& json, const std::string& source);

// How many tasks train with the built-in trainer: every task of a job without roles, else the
// tasks of its chief and worker roles that run the trainer.
int TrainingWorkers(const JobSpec& spec);
// "2 node(s) x 4 worker(s), command: python3 train.py"; with roles "1 node(s), roles: ps x2,
// worker x3 (built-in trainer)".
// Without `programs`, only the counts: "2 node(s) x 4 worker(s)", "1 node(s), roles: ps x2, ...".
std::string DescribeTasks(const JobSpec& spec, bool programs = true);
// What the busiest node needs, field by field: the sum of the resources of the tasks it runs
// (procs_per_node workers' for a job without roles) on nodes.max nodes.
ResourcesSpec NodeResources(const JobSpec& spec);
// The role named `name`, or nullptr.
const RoleSpec* FindRole(const std::vector<RoleSpec>& roles, const std::string& name);

// Where a spec comes from: files layered in order, then --set overrides in order.
struct SpecSources {
  std::vector<std::string> files;
  std::vector<std::string> sets;
};

// Loads, layers, validates. On failure the status (kInvalidArgument) lists every problem found,
// one per line, each as "file:line: field: what was expected, got what".
Result<JobSpec> LoadJobSpec(const SpecSources& sources);
// The layered spec as written (files merged, --set applied), before defaults, as JSON: plain
// scalars typed as YAML reads them (numbers, true/false), quoted ones strings. A Helm chart's values.
Result<std::string> LayeredSpecJson(const SpecSources& sources);
// The same for text already in memory (tests, stdin); `source` names it in errors.
Result<JobSpec> ParseJobSpec(const std::string& yaml, const std::string& source);

// The job spec's JSON Schema (draft-07), for editors (yaml-language-server), Helm's
// values.schema.json and `trainctl schema`. Generated from the decoder itself: every accessor
// notes what it takes while a document holding every field is decoded.
std::string JobSpecSchema(int indent = 2);

// Lossless round trip through JSON, used to hand the resolved spec to agents.
std::string JobSpecToJson(const JobSpec& spec, int indent = -1);
Result<JobSpec> JobSpecFromJson(const std::string& json);

}  // namespace trainctl
