// The built-in data-parallel trainer: one process per rank, started by the agent as
// `trainctl train` with the torchrun environment. See docs/trainer.md.
#include <charconv>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/cuda.h>
#include <torch/nn/functional/loss.h>
#include <torch/utils.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "common/duration.h"
#include "common/exit_codes.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/subprocess.h"
#include "data/sampler.h"
#include "checkpoint/meta.h"
#include "metrics/metrics.h"
#include "metrics/timeline.h"
#if TRAINCTL_HAVE_ONEDNN
#include "models/onednn.h"
#endif
#include "store/open_store.h"
#include "job/error_file.h"
#include "job/keys.h"
#include "job/paths.h"
#include "job/runs.h"
#include "job/snapshots.h"
#include "job/task_env.h"
#include <nlohmann/json.hpp>

#include "comm/ps/ps.h"
#include "train/entry.h"
#include "train/evaluate.h"
#include "train/optimizer.h"
#include "train/ps_server.h"
#include "train/reducer.h"
#include "train/schedule.h"

namespace trainctl::train {
namespace {

struct Batch {
  torch::Tensor x, y;
};

// The training batches in order, from batch `first` of `epoch` on, into the epochs after it (one
// source for a whole run). For a GPU a thread builds the next ones (at most kDepth ahead), in
// page-locked memory, while the GPU computes, and an epoch's first batches are ready as the one
// before ends; each batch's copy to the GPU runs on a stream of its own, one step ahead, beside
// the kernels of the step before it (on the compute stream, a ResNet-50 batch's 38.5 MB would
// hold up every step's kernels while it crosses the bus). On the CPU the worker builds each
// itself, when it needs it: its cores are busy with the step, so a thread would not overlap
// anything, and waking it each step preempted the compute threads (about one preemption per step
// and worker, and in a synchronous job every rank waits for the one preempted). A batch of small
// images takes microseconds to build.
class BatchSource {
 public:
  // The shuffled order of an epoch's samples: this rank's shard, whose step s is its items
  // [s x batch, (s + 1) x batch); or, with `stride` > batch, the order every shard is cut from,
  // whose step s is the global batch [s x stride, (s + 1) x stride), of which the rank reads the
  // part SetShare() names.
  using Order = std::function<std::vector<int64_t>(int64_t epoch)>;
  BatchSource(const data::ImageSet& set, const Normalizer& norm, Order order, int64_t steps_per_epoch,
              int64_t batch, int64_t stride, int64_t epoch, int64_t first, const torch::Device& device)
      : set_(set), norm_(norm), order_(std::move(order)), steps_per_epoch_(steps_per_epoch),
        batch_(batch), stride_(stride), count_(batch), epoch_(epoch), next_(first), device_(device) {
    if (!device.is_cuda()) return;
    gpu_.emplace(device.type());
    copy_stream_ = gpu_->getStreamFromGlobalPool(device);
    thread_ = std::thread([this] {
      while (true) {
        Batch out = Make();
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || queue_.size() < kDepth; });
        if (stop_) return;
        queue_.push_back(std::move(out));
        cv_.notify_all();
      }
    });
  }
  ~BatchSource() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // The items of the next global batch that Next() reads: `count` from `offset` (the CPU only:
  // a GPU's batches are made ahead).
  void SetShare(int64_t offset, int64_t count) {
    offset_ = offset;
    count_ = count;
  }

  // The next batch; on a GPU, on the device, ready for the kernels queued after this call.
  Batch Next() {
    if (!gpu_) return Make();
    if (!ahead_) ahead_ = Send(Pop());
    Upload now = std::move(*ahead_);
    ahead_ = Send(Pop());  // the next step's copy, queued before this step's kernels
    const c10::Stream compute = gpu_->getStream(device_);
    now.copied.block(compute);
    // Allocated for the copy stream: not to be reused before the compute stream is done with them.
    for (const torch::Tensor* t : {&now.batch.x, &now.batch.y}) {
      gpu_->recordDataPtrOnStream(t->storage().data_ptr(), compute);
    }
    return std::move(now.batch);
  }

 private:
  // A batch on its way to the GPU: its copy is queued on copy_stream_ and done when `copied` is.
  // (The pinned host memory's allocator records the copy too: it reuses it only after.)
  struct Upload {
    Upload(const Batch& host, const torch::Device& device, const c10::Stream& stream)
        : copied(device.type()) {
      c10::StreamGuard on(stream);
      batch.x = host.x.to(device, /*non_blocking=*/true);
      batch.y = host.y.to(device, /*non_blocking=*/true);
      copied.record(stream);
    }
    Batch batch;
    c10::Event copied;
  };
  Upload Send(const Batch& host) { return {host, device_, *copy_stream_}; }

  // The thread's next batch.
  Batch Pop() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !queue_.empty(); });
    Batch b = std::move(queue_.front());
    queue_.pop_front();
    cv_.notify_all();
    return b;
  }

  // The next batch (on the thread, if there is one).
  Batch Make() {
    if (indices_.empty() || next_ == steps_per_epoch_) {
      if (next_ == steps_per_epoch_) ++epoch_, next_ = 0;
      indices_ = order_(epoch_);
    }
    Batch out;
    if (gpu_) {
      out.x = torch::empty({batch_, set_.channels, set_.rows, set_.cols},
                           torch::TensorOptions().dtype(torch::kFloat32).pinned_memory(true));
      out.y = torch::empty({batch_}, torch::TensorOptions().dtype(torch::kInt64).pinned_memory(true));
    }
    FillBatch(set_, indices_.data() + next_ * stride_ + offset_, count_, norm_, &out.x, &out.y);
    ++next_;
    return out;
  }

  static constexpr size_t kDepth = 2;
  const data::ImageSet& set_;
  const Normalizer& norm_;
  Order order_;
  const int64_t steps_per_epoch_, batch_, stride_;
  int64_t offset_ = 0, count_;  // the part of each step's items this rank reads
  int64_t epoch_, next_;  // where the next batch is
  std::vector<int64_t> indices_;  // epoch_'s order
  const torch::Device device_;
  std::optional<c10::impl::VirtualGuardImpl> gpu_;  // a GPU's streams and events
  std::optional<c10::Stream> copy_stream_;
  std::optional<Upload> ahead_;  // the next batch, on its way
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> queue_;
  bool stop_ = false;
  std::thread thread_;
};

// trainer.precision: bf16: autocast's mixed precision, as torch.autocast(device, torch.bfloat16)
// around the forward pass: the ops autocast lists (convolutions, matrix products) multiply in
// bf16 on the device's own path; parameters, gradients and the optimizer stay f32. The loss is
// computed outside, in f32.
class Autocast {
 public:
  Autocast(bool bf16, const torch::Device& device) : on_(bf16), cuda_(device.is_cuda()) {
    if (!on_) return;
    if (cuda_) {
      at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
      at::autocast::set_enabled(true);
    } else {
      at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
      at::autocast::set_cpu_enabled(true);
    }
    at::autocast::increment_nesting();
  }
  ~Autocast() {
    if (!on_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    if (cuda_) at::autocast::set_enabled(false);
    else at::autocast::set_cpu_enabled(false);
  }
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  bool on_, cuda_;
};

// Each training rank's batch: trainer.global_batch_size split evenly among `world` ranks, else
// trainer.batch_size. Below 1 when the global batch is smaller than the world.
int64_t WorkerBatch(const TrainerSpec& t, int world) {
  return t.global_batch_size > 0 ? t.global_batch_size / world : t.batch_size;
}

// One forward and backward of the spec's model on a batch of zeros shaped as a worker's, in a
// worker server before it makes copies: what LibTorch and oneDNN make on first use (oneDNN's
// primitives and the kernels it generates for them, the dispatcher's caches) is then made once,
// and each copy finds it made. Nothing here may start a thread (the server would then refuse to
// serve): one compute thread, the CPU only, and no backward where LibTorch has a GPU backend
// (its autograd engine starts a thread per GPU at the first backward). The copies reseed. On the
// 2-core VM the example's first step in a copy took 45-59 ms instead of 124-152.
bool WarmUp(const JobSpec& spec, const data::ImageSet& set) {
  const TrainerSpec& t = spec.trainer;
  if (t.device == "cuda" || set.count < 1) return false;
  bool accelerator = false;
  for (int type = 0; type < static_cast<int>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES); ++type) {
    const auto d = static_cast<c10::DeviceType>(type);
    const bool cpu_queue = d == c10::DeviceType::CPU || d == c10::DeviceType::Meta || d == c10::DeviceType::Lazy;
    if (!cpu_queue && c10::impl::hasDeviceGuardImpl(d)) accelerator = true;
  }
  const int classes = t.data.dataset == "synthetic" ? t.data.classes : set.num_classes;
  const int64_t batch = WorkerBatch(t, std::max(1, TrainingWorkers(spec)));
  if (batch < 1) return false;  // the workers refuse such a spec
  // The primitives are made for the batch's shape (a batch of 1 or 8 saved half as much), so the
  // step is a worker's whole step, made before any copy starts: for large inputs (ImageNet's) it
  // would hold the first copies back longer than their first steps gain.
  constexpr int64_t kMaxPixels = int64_t{1} << 20;
  if (batch * set.image_bytes() > kMaxPixels) return false;
  try {
    at::set_num_threads(1);
    auto model = models::MakeModel(t.model, {set.channels, set.rows, set.cols, classes});
    if (!model.ok()) return false;
    (*model)->train();
    torch::Tensor x = torch::zeros({batch, set.channels, set.rows, set.cols});
    if (t.memory_format == "channels_last") x = x.contiguous(torch::MemoryFormat::ChannelsLast);
    torch::Tensor logits;
    {
      Autocast autocast(t.precision == "bf16", torch::Device(torch::kCPU));
      logits = (*model)->forward(x);
    }
    if (!accelerator) {
      torch::nn::functional::cross_entropy(logits.to(torch::kFloat32), torch::zeros({batch}, torch::kLong)).backward();
    }
  } catch (const std::exception& e) {
    // Nothing is lost: each copy makes what it needs on first use, as an exec'd worker does.
    LOG_DEBUG("worker server: the warm-up step failed: {}", e.what());
    return false;
  }
  return true;
}

std::string JoinFloats(const std::vector<float>& v) {
  std::ostringstream s;
  s.precision(9);
  for (size_t i = 0; i < v.size(); ++i) s << (i ? "," : "") << v[i];
  return s.str();
}


double PeakRssMb() {
  struct rusage ru;
  ::getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;  // Linux reports KiB
}


// Everything one training process holds.
class Trainer {
 public:
  // `ps`: the parameter servers, for the parameter_server strategy (then `comm` is a group of
  // one); null for allreduce. `store`: the round's key space, where the ranks leave their
  // timelines (trainer.timeline_steps) for rank 0.
  Trainer(JobSpec spec, const TaskEnv& env, int rank, int world, comm::Communicator* comm,
          torch::Device device, Store* store, comm::ps::Client* ps = nullptr)
      : spec_(std::move(spec)), t_(spec_.trainer), env_(env), rank_(rank), world_(world), comm_(comm),
        device_(device), store_(store), ps_(ps) {}

  // When RunTrainer began, and when its collectives were connected: for the start's debug line.
  void SetStartTimes(Clock::time_point begun, Clock::time_point connected) {
    begun_ = begun;
    connected_ = connected;
  }
  Status Run();

 private:
  Status Setup();
  Status Resume();
  Status LoadNewest(int64_t position[4], int64_t* opt_steps);
  Status ResumeFromShards();
  Status PsStep();
  Status FetchFromShards();
  Status FinishWithShards();
  Status TrainEpoch(int64_t epoch, int64_t first_batch);
  Status EvalEpoch(int64_t epoch);
  Status SyncBuffers();
  Status SaveCheckpoint();
  Status SaveSnapshot();
  Status Export();
  void StartTimeline();
  void PublishTimeline();
  void WriteTimeline();
  checkpoint::Checkpoint Snapshot(bool with_optimizer);
  // One metrics line: the window's loss, rate, and where its time went (rank 0's).
  Status LogStep(double loss_sum, double count, double lr, double seconds, int64_t samples,
                 double data_seconds, double comm_seconds);
  bool Done() const { return t_.max_steps > 0 && step_ >= t_.max_steps; }
  // This rank's shard of each epoch, shuffled, the short last batch dropped: the epoch's length
  // (Setup) and its order (the batches) from one definition.
  data::SamplerOptions Sampling() const { return {rank_, world_, static_cast<uint64_t>(t_.seed), true, true}; }
  // trainer.memory_format; the spec allows channels_last with the allreduce strategy only.
  bool ChannelsLast() const { return t_.memory_format == "channels_last"; }
  // trainer.balance: speed (the spec allows it on the CPU with allreduce), with a peer to
  // balance against.
  bool Balanced() const { return t_.balance == "speed" && world_ > 1; }
  Status Rebalance();

  JobSpec spec_;
  const TrainerSpec& t_;
  const TaskEnv env_;
  int rank_, world_;  // among the training tasks
  comm::Communicator* comm_;
  torch::Device device_;
  Store* store_;
  comm::ps::Client* ps_;      // parameter_server strategy: the shards; else null
  int64_t ps_version_ = 0;    // the shards' version of this worker's parameters
  double ps_wait_seconds_ = 0;  // in PushPull since the last epoch's report
  torch::Tensor ps_host_params_, ps_host_grads_;  // a GPU's parameters and gradients, staged

  data::ImageSet train_set_, test_set_;
  Normalizer norm_;
  std::shared_ptr<models::Classifier> model_;
  std::unique_ptr<GradientReducer> reducer_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<checkpoint::CheckpointDir> checkpoints_;
  std::unique_ptr<checkpoint::CheckpointDir> snapshots_;  // in memory (/dev/shm); may be null
  std::unique_ptr<metrics::JsonLines> jsonl_;
  std::unique_ptr<metrics::EventWriter> events_;
  std::unique_ptr<metrics::Timeline> timeline_;  // trainer.timeline_steps; else null
  bool timeline_published_ = false;

  int classes_ = 0;
  int64_t batch_ = 0;           // per rank
  int64_t steps_per_epoch_ = 0;
  int64_t total_steps_ = 0;
  int64_t step_ = 0;            // optimizer steps done, job-wide
  int64_t epoch_ = 0;           // current epoch
  int64_t batch_in_epoch_ = 0;  // batches done in the current epoch
  bool last_saved_ = false;
  // Balanced(): each rank's part of the global batch (batch_ each at first), and this rank's
  // computing (its batches, forward and backward) since the last Rebalance().
  std::vector<int64_t> shares_;
  double work_seconds_ = 0;
  int64_t work_items_ = 0;
  std::unique_ptr<BatchSource> batches_;  // the training batches; last: it reads train_set_, norm_
  Clock::time_point begun_ = Clock::now(), connected_ = begun_, loaded_ = begun_;
};

Status Trainer::Setup() {
  batch_ = WorkerBatch(t_, world_);
  if (batch_ < 1) return InvalidArgument("trainer.global_batch_size is smaller than the world size");
  ASSIGN_OR_RETURN(train_set_, LoadSplit(t_.data, /*train=*/true, &norm_));
  if (t_.eval) {
    ASSIGN_OR_RETURN(test_set_, LoadSplit(t_.data, /*train=*/false));
  }
  steps_per_epoch_ = data::ShardSize(train_set_.count, Sampling()) / batch_;
  if (steps_per_epoch_ < 1) {
    return InvalidArgument("the training set (" + std::to_string(train_set_.count) +
                           " images) is smaller than one global batch (" +
                           std::to_string(batch_ * world_) + ")");
  }
  total_steps_ = steps_per_epoch_ * t_.epochs;
  if (t_.max_steps > 0) total_steps_ = std::min(total_steps_, t_.max_steps);
  loaded_ = Clock::now();

  torch::manual_seed(static_cast<uint64_t>(t_.seed));
  classes_ = t_.data.dataset == "synthetic" ? t_.data.classes : train_set_.num_classes;
  train_set_.num_classes = test_set_.num_classes = classes_;
  models::InputShape shape{train_set_.channels, train_set_.rows, train_set_.cols, classes_};
  try {
    ASSIGN_OR_RETURN(model_, models::MakeModel(t_.model, shape));
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("cannot build the model: ") + e.what());
  }
  model_->to(device_);
  model_->train();
  std::vector<torch::Tensor> params;
  for (auto& p : model_->parameters()) params.push_back(p);
  reducer_ = std::make_unique<GradientReducer>(params, comm_, size_t(t_.bucket_mb * (1 << 20)),
                                               ChannelsLast());
  optimizer_ = std::make_unique<Optimizer>(t_.optimizer, reducer_->flat_params(), reducer_->flat_grads());
  checkpoints_ = std::make_unique<checkpoint::CheckpointDir>(spec_.checkpoint_dir, t_.keep_last);
  if (ps_ && device_.is_cuda()) {
    ps_host_params_ = torch::empty_like(reducer_->flat_params(), torch::TensorOptions().device(torch::kCPU));
    ps_host_grads_ = torch::empty_like(ps_host_params_);
  }
  // In-memory snapshots hold what every rank has; with parameter servers the shards hold it.
  // Only in this run's own private directory (its agent made it), readable by this user alone.
  if (t_.snapshot_every > 0 && !env_.run_id.empty() && !ps_) {
    auto dir = SnapshotDirOf(env_.run_id);
    if (dir.ok()) {
      snapshots_ = std::make_unique<checkpoint::CheckpointDir>(*dir, 1, 0600);
    } else if (env_.local_rank == 0) {
      LOG_WARN("in-memory snapshots are off: {}", dir.status().message());
    }
  }
  if (rank_ == 0) {
    ASSIGN_OR_RETURN(auto* j, metrics::JsonLines::Open(paths::MetricsJsonl(spec_.output_dir)));
    jsonl_.reset(j);
    ASSIGN_OR_RETURN(auto* e, metrics::EventWriter::Open(paths::TensorBoardDir(spec_.output_dir)));
    events_.reset(e);
  }
  return Status::Ok();
}

checkpoint::Checkpoint Trainer::Snapshot(bool with_optimizer) {
  checkpoint::Checkpoint c;
  c.step = step_;
  AddModuleState(*model_, &c.tensors);
  c.metadata = {{"model", t_.model},
                {"dataset", t_.data.dataset},
                {"data_dir", t_.data.dir},
                {"shape", std::to_string(train_set_.channels) + "," + std::to_string(train_set_.rows) +
                              "," + std::to_string(train_set_.cols)},
                {"norm_mean", JoinFloats(norm_.mean)},
                {"norm_std", JoinFloats(norm_.std)}};
  c.metadata["classes"] = std::to_string(classes_);
  c.metadata["run_id"] = env_.run_id;  // a snapshot is read only by the run that wrote it
  if (with_optimizer) {
    for (auto& [name, t] : optimizer_->State()) {
      c.tensors.push_back(ToBlob("optimizer." + name, reducer_->ToCanonical(t)));
    }
    c.metadata["optimizer.steps"] = std::to_string(optimizer_->steps());
    c.metadata["epoch"] = std::to_string(epoch_);
    c.metadata["batch_in_epoch"] = std::to_string(batch_in_epoch_);
    c.metadata["global_batch"] = std::to_string(batch_ * world_);
    c.metadata["world_size"] = std::to_string(world_);
  }
  return c;
}

Status Trainer::SyncBuffers() {
  // The communicator's own stream does not wait for the kernels that wrote them.
  if (device_.is_cuda()) torch::cuda::synchronize(device_.index());
  for (auto& b : model_->buffers()) {
    RETURN_IF_ERROR(comm_->Broadcast(b.data_ptr(), b.numel() * b.element_size(), 0));
  }
  return Status::Ok();
}

Status Trainer::SaveCheckpoint() {
  RETURN_IF_ERROR(SyncBuffers());
  last_saved_ = true;
  if (rank_ != 0) return Status::Ok();
  if (ps_) RETURN_IF_ERROR(FetchFromShards());
  Status st = checkpoints_->Save(Snapshot(/*with_optimizer=*/true));
  if (st.ok()) LOG_DEBUG("checkpoint at step {}", step_);
  return st;
}

// Keeps the training state in memory (tmpfs) for a fast, nearly lossless restart. After the buffer
// sync every rank holds the same state, so the first worker on each node keeps a copy: whichever
// node hosts rank 0 after a restart finds one there. A failure to write it costs only that speed,
// so it is logged, not fatal.
Status Trainer::SaveSnapshot() {
  RETURN_IF_ERROR(SyncBuffers());
  if (env_.local_rank != 0) return Status::Ok();
  if (Status st = snapshots_->Save(Snapshot(/*with_optimizer=*/true)); !st.ok()) {
    LOG_WARN("in-memory snapshot at step {} not kept: {}", step_, st.message());
  }
  return Status::Ok();
}

Status Trainer::Export() {
  if (rank_ != 0) return Status::Ok();
  ASSIGN_OR_RETURN(std::string bytes, checkpoint::Encode(Snapshot(/*with_optimizer=*/false)));
  std::string path = paths::Model(spec_.output_dir);
  RETURN_IF_ERROR(AtomicWriteFile(path, bytes));
  LOG_INFO("model exported to {}", path);
  return Status::Ok();
}

// A rank's timeline in the round's key space; a restart records again, under its own keys.
std::string TimelineKey(int restart, int rank) {
  return "timeline/" + std::to_string(restart) + "/" + std::to_string(rank);
}

// trainer.timeline_steps: the steps after the first log window (whose first steps warm the caches
// and the allocator up), or the run's last ones when it is too short to skip a window.
void Trainer::StartTimeline() {
  const int64_t n = t_.timeline_steps;
  const int64_t skip = std::clamp<int64_t>(total_steps_ - step_ - n, 0, t_.log_every);
  timeline_ = std::make_unique<metrics::Timeline>(step_ + skip + 1, step_ + skip + n);
  if (rank_ == 0) {
    LOG_INFO("recording the timeline of steps {} to {}", timeline_->first(),
             std::min(timeline_->last(), total_steps_));
  }
}

// Leaves this rank's timeline in the store for rank 0, once: when its last step is done, or
// when training ends before that.
void Trainer::PublishTimeline() {
  if (timeline_published_) return;
  timeline_published_ = true;
  const std::string role = spec_.roles.empty() ? "" : env_.role_name + "-" + std::to_string(env_.role_rank);
  Status st = store_->Set(TimelineKey(env_.restart_count, rank_),
                          timeline_->Events(env_.group_rank, env_.host, rank_, role));
  if (!st.ok()) LOG_WARN("this rank's timeline is lost: {}", st.message());
}

// Rank 0, at the end: every rank's timeline from the store, in one trace. A rank whose part does
// not come within timeouts.collective is named and the others written: the timeline is an aid to
// the job, not its result.
void Trainer::WriteTimeline() {
  std::vector<std::string> parts;
  const auto deadline = Clock::now() + spec_.timeouts.collective;
  for (int r = 0; r < world_; ++r) {
    const auto left = std::chrono::duration_cast<Duration>(deadline - Clock::now());
    auto part = store_->Get(TimelineKey(env_.restart_count, r), std::max<Duration>(left, Duration(1)));
    if (part.ok()) {
      parts.push_back(std::move(*part));
    } else {
      LOG_WARN("the timeline lacks rank {}: {}", r, part.status().message());
    }
  }
  const std::string path = paths::Timeline(spec_.output_dir);
  auto trace = metrics::MergeTimelines(parts);
  Status st = trace.ok() ? AtomicWriteFile(path, *trace) : trace.status();
  if (!st.ok()) {
    LOG_WARN("no timeline written: {}", st.message());
    return;
  }
  LOG_INFO("timeline of steps {} to {} ({} of {} ranks) written to {}: open it in "
           "https://ui.perfetto.dev or chrome://tracing",
           timeline_->first(), std::min(timeline_->last(), step_), parts.size(), world_, path);
}

// Rank 0 reads the newest valid checkpoint and broadcasts it, so ranks on hosts without the
// shared checkpoint directory resume too.
Status Trainer::Resume() {
  if (ps_) return ResumeFromShards();
  int64_t header[4] = {0, 0, 0, 0};  // found, step, samples done in the epoch, epoch
  std::vector<std::pair<std::string, torch::Tensor>> opt_state = optimizer_->State();
  int64_t opt_steps = 0;
  if (rank_ == 0) RETURN_IF_ERROR(LoadNewest(header, &opt_steps));
  RETURN_IF_ERROR(comm_->Broadcast(header, sizeof header, 0));
  RETURN_IF_ERROR(reducer_->BroadcastParameters());
  RETURN_IF_ERROR(SyncBuffers());
  if (!header[0]) return Status::Ok();
  RETURN_IF_ERROR(comm_->Broadcast(&opt_steps, sizeof opt_steps, 0));
  for (auto& [name, t] : opt_state) {
    RETURN_IF_ERROR(comm_->Broadcast(t.data_ptr(), t.numel() * t.element_size(), 0));
  }
  optimizer_->set_steps(opt_steps);
  step_ = header[1];
  epoch_ = header[3];
  // The same position in the epoch's sample order, even if the world size changed.
  batch_in_epoch_ = header[2] / (batch_ * world_);
  if (batch_in_epoch_ >= steps_per_epoch_) {
    ++epoch_;
    batch_in_epoch_ = 0;
  }
  return Status::Ok();
}

// Rank 0: the newest valid checkpoint or in-memory snapshot, loaded into the model and the
// optimizer; position = {found, step, samples done in the epoch, epoch}.
Status Trainer::LoadNewest(int64_t header[4], int64_t* opt_steps) {
  std::vector<std::pair<std::string, torch::Tensor>> opt_state = optimizer_->State();
  {
    std::vector<std::string> skipped;
    auto ckpt = checkpoints_->LoadLatest(&skipped);
    const checkpoint::CheckpointDir* from = checkpoints_.get();
    // A snapshot is this run's own: none exists before its first restart, and one that names
    // another run is not resumed from.
    if (snapshots_ && (env_.restart_count > 0 || env_.round > 0)) {
      auto snap = snapshots_->LoadLatest(&skipped);
      if (snap.ok() && snap->Meta("run_id") != env_.run_id) {
        skipped.push_back(snapshots_->PathFor(snap->step) + ": written by run '" + snap->Meta("run_id") +
                          "', not this one");
        snap = NotFound("");
      }
      if (snap.ok() && (!ckpt.ok() || snap->step > ckpt->step)) {
        ckpt = std::move(snap);
        from = snapshots_.get();
      }
    }
    for (const auto& s : skipped) LOG_WARN("skipping checkpoint {}", s);
    if (ckpt.ok()) {
      if (ckpt->Meta("model") != t_.model) {
        return InvalidArgument("checkpoint " + from->PathFor(ckpt->step) + " holds model '" +
                               ckpt->Meta("model") + "', the spec trains '" + t_.model +
                               "'; use another checkpoint_dir or remove it");
      }
      // The training position; an exported model (weights only) in checkpoint_dir lacks it.
      ASSIGN_OR_RETURN(checkpoint::Position position, checkpoint::ReadPosition(*ckpt, from->PathFor(ckpt->step)));
      RETURN_IF_ERROR(LoadModuleState(*model_, *ckpt));
      for (auto& [name, t] : opt_state) {
        const checkpoint::Blob* b = ckpt->Find("optimizer." + name);
        if (!b) return InvalidArgument("checkpoint " + from->PathFor(ckpt->step) +
                                       " lacks optimizer state " + name);
        torch::Tensor canonical = torch::empty({reducer_->canonical_numel()}, t.options());
        RETURN_IF_ERROR(CopyBlob(*b, canonical));
        reducer_->FromCanonical(canonical, t);
      }
      *opt_steps = position.optimizer_steps;
      header[0] = 1;
      header[1] = ckpt->step;
      header[2] = position.samples_in_epoch();
      header[3] = position.epoch;
      LOG_INFO("resuming from {} (step {}, epoch {})", from->PathFor(ckpt->step), ckpt->step,
               header[3] + 1);
    } else if (ckpt.status().code() != Code::kNotFound) {
      return ckpt.status();
    }
  }
  return Status::Ok();
}

namespace {
float* HostFloats(const torch::Tensor& device_or_host, const torch::Tensor& staging) {
  return (staging.defined() ? staging : device_or_host).data_ptr<float>();
}
}  // namespace

// Parameter servers: rank 0 gives the shards their parameters and optimizer state (the seeded
// model's, or the newest checkpoint's) unless they already hold them (rank 0 alone was replaced);
// every worker then pulls them and goes on from its own step (a replaced async worker) or the
// shards' starting step.
Status Trainer::ResumeFromShards() {
  torch::Tensor params = reducer_->flat_params();
  const int64_t count = params.numel();
  if (rank_ == 0 && !ps_->initialized()) {
    int64_t header[4] = {0, 0, 0, 0};
    int64_t opt_steps = 0;
    RETURN_IF_ERROR(LoadNewest(header, &opt_steps));
    if (ps_host_params_.defined()) ps_host_params_.copy_(params);
    std::vector<std::pair<std::string, torch::Tensor>> opt = optimizer_->State();
    std::vector<torch::Tensor> host;
    std::vector<std::pair<std::string, const float*>> state;
    for (auto& [name, t] : opt) {
      host.push_back(t.cpu().contiguous());
      state.emplace_back(name, host.back().data_ptr<float>());
    }
    RETURN_IF_ERROR(ps_->Init(HostFloats(params, ps_host_params_), count, state, opt_steps,
                              header[0] ? header[1] : 0, total_steps_));
  } else {
    RETURN_IF_ERROR(ps_->WaitInitialized());
  }
  ASSIGN_OR_RETURN(ps_version_, ps_->Pull(HostFloats(params, ps_host_params_), count));
  if (ps_host_params_.defined()) params.copy_(ps_host_params_);
  step_ = ps_->steps_done() > 0 ? ps_->steps_done() : ps_->init_step();
  epoch_ = step_ / steps_per_epoch_;
  batch_in_epoch_ = step_ % steps_per_epoch_;
  if (step_ > 0) {
    LOG_INFO("going on from step {} (epoch {}) with the parameter servers' state", step_, epoch_ + 1);
  }
  return Status::Ok();
}

// One step with parameter servers: push this worker's gradients, take the parameters back.
Status Trainer::PsStep() {
  torch::Tensor params = reducer_->flat_params(), grads = reducer_->flat_grads();
  if (ps_host_grads_.defined()) ps_host_grads_.copy_(grads);
  const auto start = Clock::now();
  struct Timed {
    double* total;
    Clock::time_point start;
    ~Timed() { *total += SecondsSince(start); }
  } timed{&ps_wait_seconds_, start};
  ASSIGN_OR_RETURN(ps_version_, ps_->PushPull(HostFloats(grads, ps_host_grads_),
                                              HostFloats(params, ps_host_params_), params.numel(),
                                              ps_version_, step_ + 1));
  if (ps_host_params_.defined()) params.copy_(ps_host_params_);
  return Status::Ok();
}

// Rank 0, for a checkpoint: the shards' parameters and optimizer state, into this worker's.
Status Trainer::FetchFromShards() {
  torch::Tensor params = reducer_->flat_params();
  ASSIGN_OR_RETURN(comm::ps::ShardState st, ps_->FetchState(params.numel()));
  torch::NoGradGuard no_grad;
  params.copy_(torch::from_blob(st.params.data(), {params.numel()}));
  for (auto& [name, t] : optimizer_->State()) {
    auto it = std::find_if(st.state.begin(), st.state.end(), [&](const auto& e) { return e.first == name; });
    if (it == st.state.end()) return Internal("the parameter servers hold no optimizer state " + name);
    t.copy_(torch::from_blob(it->second.data(), {t.numel()}));
  }
  optimizer_->set_steps(st.optimizer_steps);
  return Status::Ok();
}

// The end of training with parameter servers: every worker says so; rank 0 waits for all of them
// (async workers end at their own pace) before it saves the final state.
Status Trainer::FinishWithShards() {
  ASSIGN_OR_RETURN(int64_t done, ps_->Done());
  if (rank_ != 0) return Status::Ok();
  auto said = Clock::now();
  while (done < world_) {
    if (Clock::now() - said > std::chrono::seconds(30)) {
      LOG_INFO("waiting for {} of {} workers to finish their steps", world_ - done, world_);
      said = Clock::now();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ASSIGN_OR_RETURN(done, ps_->DoneCount());
  }
  last_saved_ = false;  // the final state is the shards' now
  return Status::Ok();
}

Status Trainer::LogStep(double loss_sum, double count, double lr, double seconds, int64_t samples,
                        double data_seconds, double comm_seconds) {
  // The loss summed over the ranks, and each rank's waiting in its own slot: the rank that waited
  // least is the one the others waited for (a straggler, `trainctl top`).
  std::vector<float> buf(2 + world_, 0.0f);
  buf[0] = float(loss_sum);
  buf[1] = float(count);
  buf[2 + rank_] = float(comm_seconds);
  RETURN_IF_ERROR(comm_->AllReduceSum(buf.data(), buf.size()));
  if (rank_ != 0) return Status::Ok();
  double loss = buf[0] / std::max(1.0f, buf[1]);
  double rate = seconds > 0 ? samples / seconds : 0;
  double eta = rate > 0 ? double(total_steps_ - step_) * batch_ * world_ / rate : 0;
  std::vector<std::pair<std::string, double>> record = {{"step", double(step_)},
                                                        {"epoch", double(epoch_ + 1)},
                                                        {"loss", loss},
                                                        {"lr", lr},
                                                        {"samples_per_s", rate},
                                                        {"restart", double(env_.restart_count)},
                                                        {"window_steps", count},
                                                        {"window_seconds", seconds},
                                                        {"data_seconds", data_seconds},
                                                        {"comm_seconds", comm_seconds}};
  if (world_ > 1 && !ps_) {
    const auto [least, most] = std::minmax_element(buf.begin() + 2, buf.end());
    record.insert(record.end(), {{"comm_seconds_min", *least},
                                 {"comm_seconds_max", *most},
                                 {"slowest_rank", double(least - (buf.begin() + 2))}});
  }
  if (Balanced()) {  // the parts of the global batch the ranks read now
    const auto [least, most] = std::minmax_element(shares_.begin(), shares_.end());
    record.insert(record.end(), {{"batch_min", double(*least)}, {"batch_max", double(*most)}});
  }
  record.emplace_back("time", WallSeconds());
  RETURN_IF_ERROR(jsonl_->Write(record));
  double now = WallSeconds();
  RETURN_IF_ERROR(events_->AddScalar("train/loss", loss, step_, now));
  RETURN_IF_ERROR(events_->AddScalar("train/lr", lr, step_, now));
  RETURN_IF_ERROR(events_->AddScalar("train/samples_per_s", rate, step_, now));
  std::printf("%s\n", metrics::ProgressLine(epoch_ + 1, t_.epochs, batch_in_epoch_,
                                             steps_per_epoch_, loss, rate, eta)
                          .c_str());
  std::fflush(stdout);
  return Status::Ok();
}

// Steps between two splits of the global batch (trainer.balance: speed): often enough to follow a
// core that slows down for seconds (a shared host's other guests), rare enough that its
// allreduce of one number per rank costs nothing.
constexpr int64_t kBalanceEvery = 20;

// Every rank's items per second since the last split, summed into one vector (each rank adds
// its own slot, so every rank holds the same bits) and split alike on every rank. The new parts
// go halfway from the old ones to the rates': a core that stays slower is followed within a few
// splits, and a moment's noise in 20 steps' timing moves the parts half as much.
Status Trainer::Rebalance() {
  std::vector<float> rates(world_, 0.0f);
  rates[rank_] = work_seconds_ > 0 ? float(double(work_items_) / work_seconds_) : 0.0f;
  RETURN_IF_ERROR(comm_->AllReduceSum(rates.data(), rates.size()));
  double total = 0;
  for (float r : rates) total += r;
  if (total <= 0) return Status::Ok();
  std::vector<double> weights(world_);
  for (int r = 0; r < world_; ++r) {
    weights[r] = 0.5 * double(shares_[r]) / double(batch_ * world_) + 0.5 * rates[r] / total;
  }
  shares_ = data::SplitBatch(weights, batch_ * world_, std::max<int64_t>(1, batch_ / 8));
  work_seconds_ = 0;
  work_items_ = 0;
  return Status::Ok();
}

Status Trainer::TrainEpoch(int64_t epoch, int64_t first_batch) {
  int64_t count = steps_per_epoch_ - first_batch;
  if (t_.max_steps > 0) count = std::min(count, t_.max_steps - step_);
  auto epoch_start = Clock::now();
  auto window_start = epoch_start;
  int64_t window_samples = 0;
  // The loss stays on the device until it is logged: reading it every step would make the CPU
  // wait for the GPU every step.
  torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).device(device_));
  double loss_count = 0;
  double lr = 0;
  auto last_status = epoch_start;
  // Where each log window's time went (`trainctl top`): waiting for the next batch, waiting for
  // the other ranks' gradients (or the parameter servers), and the rest: compute.
  double window_data = 0, epoch_comm = 0, ps_mark = ps_wait_seconds_;
  for (int64_t i = 0; i < count; ++i) {
    if (timeline_ && step_ == timeline_->last()) PublishTimeline();  // the steps are all there
    // On a GPU the phases are the host's: its kernels run behind it, and it waits for them only
    // where it reads a result (a log line, a checkpoint).
    metrics::Timeline::Step phases(timeline_.get(), step_ + 1);
    const auto fetch = Clock::now();
    if (Balanced()) {
      int64_t offset = 0;
      for (int r = 0; r < rank_; ++r) offset += shares_[r];
      batches_->SetShare(offset, shares_[rank_]);
    }
    Batch b = batches_->Next();
    window_data += SecondsSince(fetch);
    phases.Items(b.x.size(0));
    if (ChannelsLast()) b.x = b.x.contiguous(torch::MemoryFormat::ChannelsLast);
    phases.End("data");
    reducer_->ZeroGrad();
    torch::Tensor logits;
    {
      Autocast autocast(t_.precision == "bf16", device_);
      logits = model_->forward(b.x);
    }
    torch::Tensor loss = torch::nn::functional::cross_entropy(
        logits.to(torch::kFloat32), b.y,
        torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(t_.label_smoothing));
    // A rank's loss is the mean over its items; weighted by its part of the global batch, the
    // ranks' average is the mean over the global batch, as with even parts.
    if (Balanced() && shares_[rank_] != batch_) loss = loss * (double(shares_[rank_]) / double(batch_));
    phases.End("forward");
    loss.backward();
    phases.End("backward");
    if (Balanced()) {
      work_seconds_ += SecondsSince(fetch);
      work_items_ += b.x.size(0);
    }
    RETURN_IF_ERROR(reducer_->Finish());
    lr = LearningRate(t_.optimizer, t_.schedule, step_, total_steps_, world_);
    if (ps_) {
      RETURN_IF_ERROR(PsStep());  // the shards apply the optimizer
      phases.End("push and pull");
    } else {
      phases.End("gradient average");
      optimizer_->Step(lr);
      phases.End("optimizer");
    }
    ++step_;
    ++batch_in_epoch_;
    last_saved_ = false;
    if (Balanced() && step_ % kBalanceEvery == 0) {
      RETURN_IF_ERROR(Rebalance());
      phases.End("balance");
    }
    loss_sum.add_(loss.detach());
    loss_count += 1;
    window_samples += batch_ * world_;
    if (step_ % t_.log_every == 0) {
      double comm = ps_ ? ps_wait_seconds_ - ps_mark : reducer_->TakeWaitSeconds();
      if (ps_) ps_mark = ps_wait_seconds_;
      else epoch_comm += comm;
      RETURN_IF_ERROR(LogStep(loss_sum.item<double>(), loss_count, lr, SecondsSince(window_start),
                              window_samples, window_data, comm));
      window_data = 0;
      loss_sum.zero_();
      loss_count = 0;
      window_samples = 0;
      window_start = Clock::now();
      phases.End("log");
    }
    if (t_.checkpoint_every > 0 && step_ % t_.checkpoint_every == 0) {
      RETURN_IF_ERROR(SaveCheckpoint());
      phases.End("checkpoint");
    } else if (snapshots_ && step_ % t_.snapshot_every == 0) {
      RETURN_IF_ERROR(SaveSnapshot());
      phases.End("snapshot");
    }
    if (env_.tty && rank_ == 0 && Clock::now() - last_status > std::chrono::milliseconds(250)) {
      last_status = Clock::now();
      double rate = (i + 1) * batch_ * world_ / std::max(1e-9, SecondsSince(epoch_start));
      double eta = double(total_steps_ - step_) * batch_ * world_ / rate;
      std::printf("%s\r", metrics::ProgressLine(epoch + 1, t_.epochs, batch_in_epoch_,
                                               steps_per_epoch_, loss.item<float>(), rate, eta)
                               .c_str());
      std::fflush(stdout);
    }
  }
  double seconds = SecondsSince(epoch_start);
  double waited = epoch_comm + reducer_->TakeWaitSeconds();
  if (ps_) std::swap(waited, ps_wait_seconds_), ps_wait_seconds_ = 0;
  LOG_INFO("epoch {}: {:.2f} s training, {:.2f} s of it waiting for the {}", epoch + 1, seconds,
           waited, ps_ ? "parameter servers" : "gradient allreduce");
  if (rank_ == 0 && count > 0) {
    RETURN_IF_ERROR(jsonl_->Write({{"epoch", double(epoch + 1)},
                                   {"step", double(step_)},
                                   {"epoch_seconds", seconds},
                                   {"epoch_samples_per_s", count * batch_ * world_ / seconds},
                                   {ps_ ? "ps_wait_seconds" : "allreduce_wait_seconds", waited},
                                   {"peak_rss_mb", PeakRssMb()},
                                   {"time", WallSeconds()}}));
  }
  return Status::Ok();
}

Status Trainer::EvalEpoch(int64_t epoch) {
  RETURN_IF_ERROR(SyncBuffers());
  // With parameter servers the workers share no collective (async ones are not even in step):
  // rank 0 evaluates alone.
  if (ps_ && rank_ != 0) return Status::Ok();
  const int eval_rank = ps_ ? 0 : rank_, eval_world = ps_ ? 1 : world_;
  int64_t n = test_set_.count;
  Confusion c = Evaluate(*model_, test_set_, n * eval_rank / eval_world, n * (eval_rank + 1) / eval_world, norm_);
  std::vector<float> counts(c.counts.begin(), c.counts.end());
  RETURN_IF_ERROR(comm_->AllReduceSum(counts.data(), counts.size()));
  c.counts.assign(counts.begin(), counts.end());
  if (rank_ == 0) {
    RETURN_IF_ERROR(jsonl_->Write({{"epoch", double(epoch + 1)},
                                   {"step", double(step_)},
                                   {"test_accuracy", c.accuracy()},
                                   {"time", WallSeconds()}}));
    RETURN_IF_ERROR(events_->AddScalar("test/accuracy", c.accuracy(), step_, WallSeconds()));
    std::printf("epoch %lld/%d: test accuracy %.4f (%.0f images)\n", (long long)epoch + 1, t_.epochs,
                c.accuracy(), c.total());
    std::fflush(stdout);
  }
  return Status::Ok();
}

Status Trainer::Run() {
  RETURN_IF_ERROR(Setup());
  const auto set_up = Clock::now();
  RETURN_IF_ERROR(Resume());
  auto seconds = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  LOG_DEBUG("ready to train {:.3f} s after the trainer began: the store, the spec and the collectives {:.3f} s, "
            "the data {:.3f} s, the model {:.3f} s, resuming {:.3f} s", seconds(begun_, Clock::now()),
            seconds(begun_, connected_), seconds(connected_, loaded_), seconds(loaded_, set_up),
            seconds(set_up, Clock::now()));
  if (rank_ == 0) {
    LOG_INFO("training {} on {} ({} images) on {}{}{}, {} workers x batch {}, {} steps per epoch, {} epochs",
             t_.model, t_.data.dataset, train_set_.count, device_.str(),
             t_.precision == "bf16" ? " in bf16 mixed precision" : "",
             ChannelsLast() ? ", channels last" : "", world_, batch_, steps_per_epoch_,
             t_.epochs);
    if (Balanced()) {
      LOG_INFO("balance: speed: each global batch of {} is split by the workers' speed, every {} steps",
               batch_ * world_, kBalanceEvery);
    } else if (t_.balance == "speed") {
      LOG_WARN("trainer.balance: speed, but this round has one worker: there is nothing to balance");
    }
#if TRAINCTL_HAVE_ONEDNN
    if (t_.precision == "bf16" && device_.is_cpu() && !models::Bf16Convolutions()) {
      LOG_WARN("trainer.precision: bf16, but this CPU has no bf16 instructions (AVX512-BF16 or AMX): "
               "the CNN stays fp32, other models' convolutions are emulated, slower than fp32");
    }
#endif
  }
  if (t_.timeline_steps > 0) StartTimeline();
  shares_.assign(world_, batch_);
  batches_ = std::make_unique<BatchSource>(
      train_set_, norm_,
      [count = train_set_.count, so = Sampling(), whole = Balanced()](int64_t e) {
        return whole ? data::EpochOrder(count, e, so) : data::ShardIndices(count, e, so);
      },
      steps_per_epoch_, batch_, Balanced() ? batch_ * world_ : batch_, epoch_, batch_in_epoch_, device_);
  while (epoch_ < t_.epochs && !Done()) {
    RETURN_IF_ERROR(TrainEpoch(epoch_, batch_in_epoch_));
    if (batch_in_epoch_ < steps_per_epoch_) break;  // max_steps ended it mid-epoch
    if (t_.eval && ((epoch_ + 1) % t_.eval_every == 0 || epoch_ + 1 == t_.epochs)) {
      RETURN_IF_ERROR(EvalEpoch(epoch_));
    }
    ++epoch_;
    batch_in_epoch_ = 0;
    if (t_.checkpoint_every == 0) RETURN_IF_ERROR(SaveCheckpoint());
  }
  batches_.reset();
  if (timeline_) PublishTimeline();
  if (ps_) RETURN_IF_ERROR(FinishWithShards());
  if (!last_saved_) RETURN_IF_ERROR(SaveCheckpoint());
  if (timeline_ && rank_ == 0) WriteTimeline();
  // Every rank logs a digest of its final parameters: data parallelism keeps them bit-identical,
  // and a rank that drifted is easy to spot.
  torch::Tensor flat = reducer_->ToCanonical(reducer_->flat_params()).cpu();
  LOG_INFO("final parameters: {} values, crc32c {:08x}", flat.numel(),
           metrics::Crc32c(flat.data_ptr(), flat.numel() * sizeof(float)));
  return Export();
}

}  // namespace

int RunTrainer(const TrainOptions& options) {
  const auto begun = Clock::now();
  log::SetLevel(options.log_level);
  auto env = TaskEnv::FromProcess();
  if (!env.ok()) {
    std::fprintf(stderr, "trainctl train: runs as a task of a job (trainctl run JOB.yaml with a "
                         "trainer section): %s\n", env.status().message().c_str());
    return kExitInvalidSpec;
  }
  // A configuration error (kInvalidArgument: a dataset that is not there, a checkpoint of
  // another model, a GPU this build cannot use) fails the same way every time: exit code 2 tells
  // the agent not to spend the restart budget on it. Anything else may pass (a peer lost).
  // The error file torchrun's contract asks for, as torch's @record writes it: the agent reads it
  // for the report and to find the first failure across ranks.
  const std::string error_file = env->error_file;
  auto fail = [error_file](const Status& st) {
    LOG_ERROR("{}", st.message());
    if (!error_file.empty()) {
      TaskError e{std::string(CodeName(st.code())) + ": " + st.message(), "", static_cast<int64_t>(std::time(nullptr))};
      if (Status w = AtomicWriteFile(error_file, ErrorFileJson(e)); !w.ok()) LOG_WARN("{}", w.message());
    }
    return st.code() == Code::kInvalidArgument ? kExitInvalidSpec : kExitError;
  };
  auto client = OpenStore(env->store_addr, env->store_token);
  if (!client.ok()) return fail(client.status());
  PrefixStore store(client->get(), env->store_prefix);
  auto spec_json = store.Get(keys::kSpec, std::chrono::seconds(30));
  if (!spec_json.ok()) return fail(spec_json.status());
  auto spec = JobSpecFromJson(*spec_json);
  if (!spec.ok()) return fail(spec.status());
  // The task's part: a job without roles is all workers; with roles, each role has its part.
  const std::string part = spec->roles.empty() ? "worker" : env->role_name;
  const int restart = env->restart_count;
  log::SetContext(spec->name, spec->roles.empty() ? "rank=" + std::to_string(env->rank)
                                                  : part + "=" + std::to_string(env->role_rank),
                  restart);
  if (part == "ps") return RunParameterServer(*spec, *env);
  if (part == "evaluator") {
    EvalOptions watch;
    watch.watch = spec->checkpoint_dir;
    watch.metrics_dir = spec->output_dir;
    watch.threads = spec->trainer.threads;
    watch.limit = spec->trainer.data.test_limit;
    // A final model from before this run is not its end; one written since the run began is,
    // even if this evaluator started after it (a late start on a busy machine, a restart).
    watch.since = runs::RunStarted(spec->output_dir, env->run_id);
    return RunEval(watch);
  }
  if (!TrainingRole(part)) {
    return fail(InvalidArgument("the built-in trainer has no part for the role " + part));
  }
  // Training rank: a chief first, then the workers by index.
  const bool has_chief = FindRole(spec->roles, "chief") != nullptr;
  const int rank = spec->roles.empty() ? env->rank
                   : part == "chief"   ? 0
                                       : (has_chief ? 1 : 0) + env->role_rank;
  // Without roles the round's size (an elastic job shrinks and grows); roles are fixed.
  const int world = spec->roles.empty() ? env->world_size : TrainingWorkers(*spec);
  const bool ps_strategy = spec->trainer.strategy == "parameter_server";

  const TrainerSpec& t = spec->trainer;
  torch::Device device(torch::kCPU);
  if (t.device == "cuda") {
    if (!torch::cuda::is_available()) {
      return fail(InvalidArgument(
          "trainer.device: cuda, but this worker cannot use a GPU: either this trainctl was built "
          "against a LibTorch without CUDA (Debian's is CPU-only; see docs/trainer.md, GPUs) or "
          "no GPU is visible (nvidia-smi, CUDA_VISIBLE_DEVICES)"));
    }
    if (!comm::NcclAvailable()) {
      return fail(InvalidArgument("trainer.device: cuda needs the NCCL backend, and this trainctl "
                                  "was built without NCCL (see docs/trainer.md, GPUs)"));
    }
    // One GPU per worker on each node, as torchrun scripts use LOCAL_RANK. NCCL refuses two
    // ranks on one GPU, so more workers than GPUs is a spec error, said before NCCL says it.
    const int gpus = static_cast<int>(torch::cuda::device_count());
    if (env->local_world_size > gpus) {
      return fail(InvalidArgument("trainer.device: cuda: " + std::to_string(env->local_world_size) +
                                  " workers on this node but " + std::to_string(gpus) +
                                  " GPU(s); expected procs_per_node at most " + std::to_string(gpus) +
                                  " (one GPU per worker)"));
    }
    device = torch::Device(torch::kCUDA, env->local_rank % gpus);
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

  // Collectives: shared memory when every rank is on this host, else Gloo over TCP.
  // A fresh key space per rendezvous round (a membership change starts a round, not a restart).
  PrefixStore comm_store(client->get(), env->store_prefix + keys::CommPrefix(env->round));
  const bool one_node = env->group_world_size == 1 || (spec->roles.empty() && env->local_world_size == world);
  const bool nccl = device.is_cuda();  // the spec allows only nccl (or auto) with cuda
  const bool shm = !nccl && (t.backend == "shm" || (t.backend == "auto" && one_node));
  // A hang is reported within timeouts.collective: the collective gives up a little earlier and
  // the rest goes to finding out which ranks are stalled (NameStalledRanks).
  const Duration stall_grace = std::min<Duration>(spec->timeouts.collective / 10, std::chrono::seconds(3));
  const Duration comm_timeout = spec->timeouts.collective - stall_grace;
  const std::string host = env->host.empty() ? "127.0.0.1" : env->host;
  Result<std::unique_ptr<comm::Communicator>> comm = Unavailable("");
  std::unique_ptr<comm::ps::Client> ps;
  if (ps_strategy) {  // gradients go to the parameter servers: no collective among the workers
    comm::ps::ClientOptions po;
    try {
      po.shards = nlohmann::json::parse(env->tf_config).at("cluster").at("ps").get<std::vector<std::string>>();
    } catch (const nlohmann::json::exception& e) {
      return fail(Internal(std::string("TF_CONFIG names no parameter servers: ") + e.what()));
    }
    po.token = env->store_token;
    po.worker = rank;
    po.local_host = env->host.empty() ? "127.0.0.1" : env->host;
    po.timeout = spec->timeouts.collective;
    auto connected = comm::ps::Client::Connect(po);
    if (!connected.ok()) return fail(connected.status());
    ps = std::move(*connected);
    comm = comm::ConnectLocal();
  } else if (nccl) {
    comm::NcclOptions no;
    no.rank = rank;
    no.size = world;
    no.device = device.index();
    no.timeout = comm_timeout;
    comm = comm::ConnectNccl(comm_store, no);
  } else if (shm) {
    comm::ShmOptions so;
    so.rank = rank;
    so.size = world;
    so.timeout = comm_timeout;
    comm = comm::ConnectShm(comm_store, so);
  } else {
    comm::GlooOptions go;
    go.rank = rank;
    go.size = world;
    go.host = host;
    go.timeout = comm_timeout;
    comm = comm::ConnectGloo(comm_store, go);
  }
  if (!comm.ok()) return fail(comm.status());
  if (Status st = comm::AnnounceRank(comm_store, rank, host); !st.ok()) return fail(st);

  try {
    Trainer trainer(*spec, *env, rank, world, comm->get(), device, &comm_store, ps.get());
    trainer.SetStartTimes(begun, Clock::now());
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

namespace {

// Evaluates checkpoints on the test set they name, loading that set once.
class CheckpointEvaluator {
 public:
  explicit CheckpointEvaluator(const EvalOptions& o) : o_(o) {}

  Result<std::string> Report(const checkpoint::Checkpoint& ckpt, const std::string& path, double* accuracy) {
    ASSIGN_OR_RETURN(checkpoint::ModelMeta meta, checkpoint::ReadModelMeta(ckpt, path));
    DataSpec ds;
    ds.dataset = meta.dataset;
    ds.dir = o_.data_dir.empty() ? meta.data_dir : o_.data_dir;
    ds.test_limit = o_.limit;
    ds.shape = {meta.channels, meta.rows, meta.cols};
    ds.classes = meta.classes;
    const std::string key = ds.dataset + "\n" + ds.dir + "\n" + ckpt.Meta("shape") + "\n" + ckpt.Meta("classes");
    if (key != test_key_) {
      ASSIGN_OR_RETURN(test_, LoadSplit(ds, /*train=*/false));
      test_key_ = key;
    }
    test_.num_classes = ds.classes;
    models::InputShape in{test_.channels, test_.rows, test_.cols, ds.classes};
    if (in.channels != meta.channels || in.rows != meta.rows || in.cols != meta.cols) {
      return InvalidArgument("the test images are " + std::to_string(in.channels) + "x" +
                             std::to_string(in.rows) + "x" + std::to_string(in.cols) +
                             ", the model was trained on " + ckpt.Meta("shape"));
    }
    try {
      ASSIGN_OR_RETURN(auto model, models::MakeModel(meta.model, in));
      if (Status st = LoadModuleState(*model, ckpt); !st.ok()) return InvalidArgument(path + ": " + st.message());
      Normalizer norm{meta.mean, meta.std};
      Confusion c = Evaluate(*model, test_, 0, test_.count, norm, o_.batch);
      if (accuracy) *accuracy = c.accuracy();
      auto names = ClassNames(ds.dataset, ds.classes);
      return o_.format == "json" ? FormatReportJson(c, names) : FormatReport(c, names);
    } catch (const std::exception& e) {
      return Internal(std::string("LibTorch: ") + e.what());
    }
  }

 private:
  const EvalOptions& o_;
  std::string test_key_;
  data::ImageSet test_;
};

Result<checkpoint::Checkpoint> ReadCheckpoint(const std::string& path) {
  ASSIGN_OR_RETURN(std::string bytes, ReadFile(path, int64_t{8} << 30));
  return checkpoint::Decode(bytes, path);
}

// The evaluator: each new checkpoint in o.watch, as it appears, until the run's final model is
// there (written after its last checkpoint) or a stop signal.
int RunWatch(const EvalOptions& o) {
  BlockSupervisorSignals();  // a stop ends the watch between two evaluations
  const int64_t since = o.since > 0 ? o.since : static_cast<int64_t>(std::time(nullptr));
  const std::string out = o.metrics_dir.empty()
                              ? std::filesystem::path(o.watch).lexically_normal().parent_path().string()
                              : o.metrics_dir;
  auto jsonl = metrics::JsonLines::Open(paths::MetricsJsonl(out));
  auto events = metrics::EventWriter::Open(paths::TensorBoardDir(out) + "/eval");
  if (!jsonl.ok() || !events.ok()) {
    LOG_ERROR("{}", (!jsonl.ok() ? jsonl.status() : events.status()).message());
    return kExitError;
  }
  std::unique_ptr<metrics::JsonLines> jsonl_owner(*jsonl);
  std::unique_ptr<metrics::EventWriter> events_owner(*events);
  LOG_INFO("evaluating each new checkpoint in {} until {} appears", o.watch, paths::Model(out));
  CheckpointEvaluator evaluator(o);
  std::set<std::string> done;
  while (true) {
    // The final model is written after the last checkpoint: look for it first, so that the
    // listing below has every checkpoint it follows. One left from an earlier run does not count.
    struct stat written{};
    const bool final_model = ::stat(paths::Model(out).c_str(), &written) == 0 && written.st_mtim.tv_sec >= since;
    for (const auto& path : checkpoint::CheckpointDir(o.watch, 1).List()) {
      if (done.count(path)) continue;
      auto ckpt = ReadCheckpoint(path);
      if (!ckpt.ok()) {  // pruned (keep_last) since the listing, or not a checkpoint
        LOG_DEBUG("skipping {}: {}", path, ckpt.status().message());
        done.insert(path);
        continue;
      }
      double accuracy = 0;
      auto report = evaluator.Report(*ckpt, path, &accuracy);
      done.insert(path);
      if (!report.ok()) {
        LOG_ERROR("{}", report.status().message());
        return kExitError;
      }
      Status st = jsonl_owner->Write({{"step", double(ckpt->step)}, {"test_accuracy", accuracy}},
                                     {{"source", "evaluator"}});
      if (st.ok()) st = events_owner->AddScalar("test/accuracy", accuracy, ckpt->step, WallSeconds());
      if (!st.ok()) LOG_WARN("{}", st.message());
      std::printf("step %lld: test accuracy %.4f (%s)\n", static_cast<long long>(ckpt->step), accuracy,
                  path.c_str());
      std::fflush(stdout);
    }
    if (final_model || StopSignal()) return kExitOk;
    WaitSignal(std::chrono::seconds(1));
  }
}

}  // namespace

// A model file, or a directory's newest valid checkpoint.
Result<checkpoint::Checkpoint> LoadModelFile(const std::string& path) {
  if (!IsDirectory(path)) return ReadCheckpoint(path);
  checkpoint::CheckpointDir dir(path, 1);
  auto ckpt = dir.LoadLatest();
  if (!ckpt.ok()) return InvalidArgument(path + ": no valid checkpoint: " + ckpt.status().message());
  return ckpt;
}

int RunEval(const EvalOptions& o) {
  if (o.threads > 0) at::set_num_threads(o.threads);
  if (!o.watch.empty()) return RunWatch(o);
  auto fail = [](const std::string& message) {
    std::fprintf(stderr, "trainctl eval: %s\n", message.c_str());
    return kExitError;
  };
  const std::string& path = o.checkpoint;
  auto ckpt = LoadModelFile(path);
  if (!ckpt.ok()) return fail(ckpt.status().message());
  CheckpointEvaluator evaluator(o);
  auto report = evaluator.Report(*ckpt, path, nullptr);
  if (!report.ok()) return fail(report.status().message());
  std::fwrite(report->data(), 1, report->size(), stdout);
  return kExitOk;
}

// Images as the model takes them: `channels` (grey <-> RGB converted), the model's size.
Result<data::ImageSet> LoadImagesFor(const std::string& path, const checkpoint::ModelMeta& meta) {
  char magic[4] = {};
  std::ifstream(path, std::ios::binary).read(magic, sizeof magic);
  // An idx3 image file, or a gzipped one (the Debian packages ship them so).
  const bool idx = std::memcmp(magic, "\0\0\x08\x03", 4) == 0 || std::memcmp(magic, "\x1f\x8b", 2) == 0;
  ASSIGN_OR_RETURN(data::ImageSet set, idx ? data::LoadIdxImages(path) : data::ReadImageFile(path));
  if (set.rows != meta.rows || set.cols != meta.cols) {
    return InvalidArgument(path + ": the image is " + std::to_string(set.cols) + "x" + std::to_string(set.rows) +
                           " pixels; the model takes " + std::to_string(meta.cols) + "x" +
                           std::to_string(meta.rows));
  }
  if (set.channels == meta.channels) return set;
  const int64_t plane = int64_t{set.rows} * set.cols;
  data::ImageSet out = set;
  out.channels = meta.channels;
  out.pixels.resize(set.count * meta.channels * plane);
  for (int64_t i = 0; i < set.count; ++i) {
    const uint8_t* src = set.image(i);
    uint8_t* dst = out.pixels.data() + i * meta.channels * plane;
    for (int64_t k = 0; k < plane; ++k) {
      if (meta.channels == 1) {  // RGB to luma (ITU-R BT.601)
        dst[k] = static_cast<uint8_t>((299 * src[k] + 587 * src[plane + k] + 114 * src[2 * plane + k] + 500) / 1000);
      } else {
        for (int c = 0; c < meta.channels; ++c) dst[c * plane + k] = src[k];
      }
    }
  }
  return out;
}

int RunPredict(const PredictOptions& o) {
  if (o.threads > 0) at::set_num_threads(o.threads);
  auto fail = [](const std::string& message) {
    std::fprintf(stderr, "trainctl predict: %s\n", message.c_str());
    return kExitError;
  };
  auto ckpt = LoadModelFile(o.checkpoint);
  if (!ckpt.ok()) return fail(ckpt.status().message());
  auto meta = checkpoint::ReadModelMeta(*ckpt, o.checkpoint);
  if (!meta.ok()) return fail(meta.status().message());
  const auto names = ClassNames(meta->dataset, meta->classes);
  const int top = std::min(std::max(1, o.top), meta->classes);
  nlohmann::json all = nlohmann::json::array();
  try {
    auto model = models::MakeModel(meta->model, {meta->channels, meta->rows, meta->cols, meta->classes});
    if (!model.ok()) return fail(model.status().message());
    if (Status st = LoadModuleState(**model, *ckpt); !st.ok()) return fail(o.checkpoint + ": " + st.message());
    (*model)->eval();
    torch::NoGradGuard no_grad;
    const Normalizer norm{meta->mean, meta->std};
    for (const auto& path : o.images) {
      auto set = LoadImagesFor(path, *meta);
      if (!set.ok()) return fail(set.status().message());
      for (int64_t first = 0; first < set->count; first += 500) {
        const int64_t n = std::min<int64_t>(500, set->count - first);
        std::vector<int64_t> idx(n);
        for (int64_t i = 0; i < n; ++i) idx[i] = first + i;
        torch::Tensor x, y;
        FillBatch(*set, idx.data(), n, norm, &x, &y);
        torch::Tensor probs = torch::softmax((*model)->forward(x), 1);
        auto [p, c] = probs.topk(top, 1);
        for (int64_t i = 0; i < n; ++i) {
          const std::string label = set->count > 1 ? path + "[" + std::to_string(first + i) + "]" : path;
          nlohmann::json classes = nlohmann::json::array();
          std::string line = label + ":";
          for (int k = 0; k < top; ++k) {
            const int cls = static_cast<int>(c[i][k].item<int64_t>());
            const double prob = p[i][k].item<float>();
            const std::string name = cls < static_cast<int>(names.size()) ? names[cls] : std::to_string(cls);
            classes.push_back({{"class", cls}, {"name", name}, {"probability", prob}});
            char buf[64];
            std::snprintf(buf, sizeof buf, " %.1f %%", prob * 100);
            line += std::string(k ? "," : "") + " " + name + buf;
          }
          if (o.format == "json") {
            all.push_back({{"image", label}, {"top", classes}});
          } else {
            std::printf("%s\n", line.c_str());
          }
        }
      }
    }
  } catch (const std::exception& e) {
    return fail(std::string("LibTorch: ") + e.what());
  }
  if (o.format == "json") std::printf("%s\n", all.dump(2).c_str());
  return kExitOk;
}

int RunPreload(const PreloadOptions& options) {
  log::SetLevel(options.log_level);
  auto spec = JobSpecFromJson(options.spec_json);
  if (!spec.ok()) return 0;
  const auto start = Clock::now();
  const data::ImageSet* train = PreloadSplits(spec->trainer.data, spec->trainer.eval);
  if (!train) {
    LOG_DEBUG("worker server: the training set did not load; each worker will read it and say why");
    return 0;
  }
  const double load_seconds = SecondsSince(start);
  const auto loaded = Clock::now();
  const bool warmed = WarmUp(*spec, *train);
  LOG_DEBUG("worker server: the data ({} training images) loaded in {:.3f} s; {}", train->count, load_seconds,
            warmed ? fmt::format("a warm-up step of {} in {:.3f} s", spec->trainer.model, SecondsSince(loaded))
                   : std::string("no warm-up step"));
  return 0;
}

}  // namespace trainctl::train
