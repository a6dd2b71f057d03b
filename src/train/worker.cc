// `trainctl train`: a task of a job with a trainer section, set up for its part (a training
// rank, a parameter server, the evaluator) from the torchrun environment and the job's store.
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>

#include "comm/progress.h"
#include "common/exit_codes.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/subprocess.h"
#include "job/error_file.h"
#include "job/keys.h"
#include "job/runs.h"
#include "store/open_store.h"
#include "train/entry.h"
#include "train/ps_server.h"
#include "train/trainer.h"

namespace trainctl::train {

namespace {

// A configuration error (kInvalidArgument: a dataset that is not there, a checkpoint of another
// model, a GPU this build cannot use) fails the same way every time: exit code 2 tells the agent
// not to spend the restart budget on it. Anything else may pass (a peer lost). The error file
// torchrun's contract asks for, as torch's @record writes it: the agent reads it for the report
// and to find the first failure across ranks.
int Fail(const std::string& error_file, const Status& st) {
  LOG_ERROR("{}", st.message());
  if (!error_file.empty()) {
    TaskError e{std::string(CodeName(st.code())) + ": " + st.message(), "", static_cast<int64_t>(std::time(nullptr))};
    if (Status w = AtomicWriteFile(error_file, ErrorFileJson(e)); !w.ok()) LOG_WARN("{}", w.message());
  }
  return st.code() == Code::kInvalidArgument ? kExitInvalidSpec : kExitError;
}

// The device this worker trains on (device: cuda: one GPU per worker of the node, by local rank),
// and LibTorch's threads and determinism set for it.
Result<torch::Device> SetUpDevice(const TrainerSpec& t, const TaskEnv& env) {
  torch::Device device(torch::kCPU);
  if (t.device == "cuda") {
    if (!torch::cuda::is_available()) {
      return InvalidArgument(
          "trainer.device: cuda, but this worker cannot use a GPU: either this trainctl was built "
          "against a LibTorch without CUDA (Debian's is CPU-only; see docs/trainer.md, GPUs) or "
          "no GPU is visible (nvidia-smi, CUDA_VISIBLE_DEVICES)");
    }
    if (!comm::NcclAvailable()) {
      return InvalidArgument(
          "trainer.device: cuda needs the NCCL backend, and this trainctl "
          "was built without NCCL (see docs/trainer.md, GPUs)");
    }
    // One GPU per worker on each node, as torchrun scripts use LOCAL_RANK. NCCL refuses two
    // ranks on one GPU, so more workers than GPUs is a spec error, said before NCCL says it.
    const int gpus = static_cast<int>(torch::cuda::device_count());
    if (env.local_world_size > gpus) {
      return InvalidArgument("trainer.device: cuda: " + std::to_string(env.local_world_size) +
                             " workers on this node but " + std::to_string(gpus) +
                             " GPU(s); expected procs_per_node at most " + std::to_string(gpus) +
                             " (one GPU per worker)");
    }
    device = torch::Device(torch::kCUDA, env.local_rank % gpus);
    // Deterministic cuBLAS needs a fixed workspace, chosen before the first cuBLAS call.
    if (t.deterministic) ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  }
  const char* omp = std::getenv("OMP_NUM_THREADS");
  int threads = t.threads > 0 ? t.threads : omp && *omp ? std::atoi(omp) : 1;
  at::set_num_interop_threads(1);
  at::set_num_threads(std::max(1, threads));
  if (t.deterministic) at::globalContext().setDeterministicAlgorithms(true, false);
  // Every training batch has the same shape (the sampler drops a short last batch): cuDNN times
  // its algorithms once. The fastest one is not always deterministic.
  if (device.is_cuda()) at::globalContext().setBenchmarkCuDNN(t.cudnn_benchmark && !t.deterministic);
  return device;
}

// How this training rank exchanges gradients: with the parameter servers (`*ps`, and a local
// communicator for the rest), or a collective among the workers: NCCL on GPUs, shared memory
// when every rank is on this host, else Gloo over TCP.
struct Exchange {
  std::unique_ptr<comm::Communicator> comm;
  std::unique_ptr<comm::ps::Client> ps;
};
// `host`: this task's address for its peers.
Result<Exchange> Connect(const JobSpec& spec, const TaskEnv& env, const std::string& host, int rank, int world,
                         const torch::Device& device, Store& comm_store, Duration comm_timeout) {
  const TrainerSpec& t = spec.trainer;
  Exchange x;
  if (t.strategy == "parameter_server") {  // no collective among the workers
    comm::ps::ClientOptions po;
    try {
      po.shards = nlohmann::json::parse(env.tf_config).at("cluster").at("ps").get<std::vector<std::string>>();
    } catch (const nlohmann::json::exception& e) {
      return Internal(std::string("TF_CONFIG names no parameter servers: ") + e.what());
    }
    po.token = env.store_token;
    po.worker = rank;
    po.local_host = host;
    po.timeout = spec.timeouts.collective;
    ASSIGN_OR_RETURN(x.ps, comm::ps::Client::Connect(po));
    x.comm = comm::ConnectLocal();
    return x;
  }
  const bool one_node = env.group_world_size == 1 || (spec.roles.empty() && env.local_world_size == world);
  const bool nccl = device.is_cuda();  // the spec allows only nccl (or auto) with cuda
  const bool shm = !nccl && (t.backend == "shm" || (t.backend == "auto" && one_node));
  if (nccl) {
    comm::NcclOptions no;
    no.rank = rank;
    no.size = world;
    no.device = device.index();
    no.timeout = comm_timeout;
    ASSIGN_OR_RETURN(x.comm, comm::ConnectNccl(comm_store, no));
  } else if (shm) {
    comm::ShmOptions so;
    so.rank = rank;
    so.size = world;
    so.timeout = comm_timeout;
    ASSIGN_OR_RETURN(x.comm, comm::ConnectShm(comm_store, so));
  } else {
    comm::GlooOptions go;
    go.rank = rank;
    go.size = world;
    go.host = host;
    go.timeout = comm_timeout;
    ASSIGN_OR_RETURN(x.comm, comm::ConnectGloo(comm_store, go));
  }
  return x;
}

// A rank that stops making progress is named within seconds, not at the collective timeout: the
// others end the group (comm/progress.h). Its own store client: the loop's is not shared.
std::unique_ptr<comm::ProgressWatchdog> StartWatchdog(const TaskEnv& env, int rank, int world, comm::Communicator* comm,
                                                      Duration limit) {
  auto own = OpenStore(env.store_addr, env.store_token);
  if (!own.ok()) {
    LOG_WARN("no progress watchdog: {}", own.status().message());
    return nullptr;
  }
  comm::ProgressOptions po;
  po.rank = rank;
  po.size = world;
  po.limit = limit;
  po.behind = [comm] { return comm->Behind(); };
  return std::make_unique<comm::ProgressWatchdog>(
      std::make_unique<PrefixStore>(std::move(*own), env.store_prefix + keys::CommPrefix(env.round)), po,
      [error_file = env.error_file](const Status& st) {
        const int code = Fail(error_file, st);
        std::fflush(nullptr);
        ::_exit(code);
      });
}

// The evaluator's part: each checkpoint as it appears, until the run's final model.
int RunEvaluator(const JobSpec& spec, const TaskEnv& env) {
  EvalOptions watch;
  watch.watch = spec.checkpoint_dir;
  watch.metrics_dir = spec.output_dir;
  watch.threads = spec.trainer.threads;
  watch.limit = spec.trainer.data.test_limit;
  // A final model from before this run is not its end; one written since the run began is,
  // even if this evaluator started after it (a late start on a busy machine, a restart).
  watch.since = runs::RunStarted(spec.output_dir, env.run_id);
  return RunEval(watch);
}

}  // namespace

int RunTrainer(const TrainOptions& options) {
  const auto begun = Clock::now();
  log::SetLevel(options.log_level);
  auto env = TaskEnv::FromProcess();
  if (!env.ok()) {
    std::fprintf(stderr,
                 "trainctl train: runs as a task of a job (trainctl run JOB.yaml with a "
                 "trainer section): %s\n",
                 env.status().message().c_str());
    return kExitInvalidSpec;
  }
  const std::string error_file = env->error_file;
  auto fail = [&error_file](const Status& st) { return Fail(error_file, st); };
  auto client = OpenStore(env->store_addr, env->store_token);
  if (!client.ok()) return fail(client.status());
  PrefixStore store(client->get(), env->store_prefix);
  // The spec: decoded once per node by the worker server this task is a copy of, else from the store.
  auto spec = [&]() -> Result<JobSpec> {
    if (const JobSpec* preloaded = PreloadedSpec()) return *preloaded;
    ASSIGN_OR_RETURN(std::string json, store.Get(keys::kSpec, std::chrono::seconds(30)));
    return JobSpecFromJson(json);
  }();
  if (!spec.ok()) return fail(spec.status());
  // The task's part: a job without roles is all workers; with roles, each role has its part.
  const std::string part = spec->roles.empty() ? "worker" : env->role_name;
  log::SetContext(
      spec->name,
      spec->roles.empty() ? "rank=" + std::to_string(env->rank) : part + "=" + std::to_string(env->role_rank),
      env->restart_count);
  if (part == "ps") return RunParameterServer(*spec, *env);
  if (part == "evaluator") return RunEvaluator(*spec, *env);
  if (!TrainingRole(part)) {
    return fail(InvalidArgument("the built-in trainer has no part for the role " + part));
  }
  // Training rank: a chief first, then the workers by index.
  const bool has_chief = FindRole(spec->roles, "chief") != nullptr;
  const int rank = spec->roles.empty() ? env->rank : part == "chief" ? 0 : (has_chief ? 1 : 0) + env->role_rank;
  // Without roles the round's size (an elastic job shrinks and grows); roles are fixed.
  const int world = spec->roles.empty() ? env->world_size : TrainingWorkers(*spec);
  auto device = SetUpDevice(spec->trainer, *env);
  if (!device.ok()) return fail(device.status());

  // A fresh key space per rendezvous round (a membership change starts a round, not a restart).
  PrefixStore comm_store(client->get(), env->store_prefix + keys::CommPrefix(env->round));
  // A hang is reported within timeouts.collective: the collective gives up a little earlier and
  // the rest goes to finding out which ranks are stalled (NameStalledRanks).
  const Duration stall_grace = std::min<Duration>(spec->timeouts.collective / 10, std::chrono::seconds(3));
  const Duration comm_timeout = spec->timeouts.collective - stall_grace;
  const std::string host = env->host.empty() ? "127.0.0.1" : env->host;
  auto exchange = Connect(*spec, *env, host, rank, world, *device, comm_store, comm_timeout);
  if (!exchange.ok()) return fail(exchange.status());
  if (Status st = comm::AnnounceRank(comm_store, rank, host); !st.ok()) return fail(st);
  comm::ps::Client* ps = exchange->ps.get();
  std::unique_ptr<comm::ProgressWatchdog> watchdog;
  if (!ps && world > 1) watchdog = StartWatchdog(*env, rank, world, exchange->comm.get(), comm_timeout);

  try {
    TrainerOptions o;
    o.spec = *spec;
    o.env = *env;
    o.rank = rank;
    o.world = world;
    o.comm = exchange->comm.get();
    o.device = *device;
    o.store = &comm_store;
    o.begun = begun;
    o.connected = Clock::now();
    o.watchdog = watchdog.get();
    Trainer trainer(std::move(o), ps ? ParameterServerStrategy(ps) : AllreduceStrategy());
    Status st = trainer.Run();
    if (st.code() == Code::kTimeout && !ps) {
      st = comm::NameStalledRanks(comm_store, rank, world, stall_grace, st);
    }
    if (!st.ok()) return fail(st);
  } catch (const std::exception& e) {  // LibTorch reports errors as c10::Error
    return fail(Status(Code::kInternal, std::string("LibTorch: ") + e.what()));
  }
  return kExitOk;
}

}  // namespace trainctl::train
