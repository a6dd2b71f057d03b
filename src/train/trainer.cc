// The training loop (trainer.h); RunTrainer, which sets a worker up for it, is in worker.cc.
#include "train/trainer.h"

#include <ATen/Parallel.h>
#include <sys/resource.h>
#include <torch/cuda.h>
#include <torch/nn/functional/loss.h>
#include <torch/utils.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <sstream>
#include <thread>

#include "checkpoint/meta.h"
#include "comm/progress.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/strings.h"
#include "data/image_stream.h"
#if TRAINCTL_HAVE_ONEDNN
#include "kernels/onednn.h"
#endif
#include "job/paths.h"
#include "job/snapshots.h"
#include "train/evaluate.h"
#include "train/schedule.h"

namespace trainctl::train {

int64_t WorkerBatch(const TrainerSpec& t, int world) {
  return t.global_batch_size > 0 ? t.global_batch_size / world : t.batch_size;
}

Status TrainState::SyncBuffers() {
  // The communicator's own stream does not wait for the kernels that wrote them.
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
  for (auto& b : model->buffers()) {
    RETURN_IF_ERROR(comm->Broadcast(b.data_ptr(), b.numel() * b.element_size(), 0));
  }
  return Status::Ok();
}

void TrainState::MoveTo(const ResumePoint& p) {
  step = p.step;
  epoch = p.epoch;
  batch_in_epoch = p.samples_in_epoch / (batch * world);
  if (batch_in_epoch >= steps_per_epoch) {
    ++epoch;
    batch_in_epoch = 0;
  }
}

namespace {

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

// A rank's timeline in the round's key space; a restart records again, under its own keys.
std::string TimelineKey(int restart, int rank) {
  return "timeline/" + std::to_string(restart) + "/" + std::to_string(rank);
}

}  // namespace

Trainer::Trainer(TrainerOptions o, std::unique_ptr<StepStrategy> strategy)
    : spec_(std::move(o.spec)),
      t_(spec_.trainer),
      env_(std::move(o.env)),
      store_(o.store),
      strategy_(std::move(strategy)),
      watchdog_(o.watchdog),
      begun_(o.begun),
      connected_(o.connected),
      loaded_(o.connected) {
  s_.rank = o.rank;
  s_.world = o.world;
  s_.device = o.device;
  s_.comm = o.comm;
  if (const char* hang = std::getenv("TRAINCTL_FAULT_HANG")) {
    int rank = -1;
    long long step = -1;
    char phase[16] = "forward";
    if (std::sscanf(hang, "%d:%lld:%15s", &rank, &step, phase) >= 2 && rank == o.rank) {
      hang_at_step_ = step;
      hang_phase_ = std::string(phase) == "gradients" ? comm::Phase::kGradients : comm::Phase::kForward;
    }
  }
}

void Trainer::Enter(comm::Phase phase) {
  if (watchdog_) watchdog_->Enter(phase);
  if (phase == hang_phase_ && s_.step == hang_at_step_) {
    LOG_WARN("TRAINCTL_FAULT_HANG: rank {} hangs at step {} in {}", s_.rank, s_.step, comm::PhaseName(phase));
    while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

Trainer::~Trainer() = default;

data::SamplerOptions Trainer::Sampling() const {
  return {s_.rank, s_.world, static_cast<uint64_t>(t_.seed), true, true};
}

Status Trainer::Setup() {
  s_.batch = WorkerBatch(t_, s_.world);
  if (s_.batch < 1) return InvalidArgument("trainer.global_batch_size is smaller than the world size");
  ASSIGN_OR_RETURN(train_set_, LoadSplit(t_.data, /*train=*/true, &norm_));
  if (t_.eval) {
    ASSIGN_OR_RETURN(test_set_, LoadSplit(t_.data, /*train=*/false));
  }
  // A streamed folder's decode threads: this worker's share of the machine's CPUs (or the spec's).
  for (data::ImageSet* set : {&train_set_, &test_set_}) {
    if (!set->stream) continue;
    const int threads =
        t_.data.threads > 0 ? t_.data.threads : data::DefaultDecodeThreads(std::max(1, env_.local_world_size));
    set->stream->Configure(threads, static_cast<uint64_t>(t_.seed), spec_.output_dir + "/skipped-images.txt");
  }
  if (s_.rank == 0) {
    for (const data::ImageSet* set : {&train_set_, &test_set_}) {
      if (!set->origin.empty()) LOG_INFO("{}", set->origin);
      if (set->skipped.empty()) continue;
      // One line, every name in a file beside the run's other output.
      const std::string file = spec_.output_dir + "/skipped-images.txt";
      const Status st = data::RecordSkipped(file, set->skipped);  // beside the streams' own
      LOG_WARN("{} picture file(s) skipped, not pictures that decode (data.bad_images: skip; {}), first: {}",
               set->skipped.size(), st.ok() ? "every name in " + file : st.message(), set->skipped[0]);
    }
  }
  s_.steps_per_epoch = data::ShardSize(train_set_.count, Sampling()) / s_.batch;
  if (s_.steps_per_epoch < 1) {
    return InvalidArgument("the training set (" + std::to_string(train_set_.count) +
                           " images) is smaller than one global batch (" + std::to_string(s_.batch * s_.world) + ")");
  }
  s_.total_steps = s_.steps_per_epoch * t_.epochs;
  if (t_.max_steps > 0) s_.total_steps = std::min(s_.total_steps, t_.max_steps);
  loaded_ = Clock::now();

  torch::manual_seed(static_cast<uint64_t>(t_.seed));
  std::function<bool(const std::vector<LayerSpec>&)> random = [&](const std::vector<LayerSpec>& layers) {
    return std::any_of(layers.begin(), layers.end(), [&](const LayerSpec& l) {
      return (l.kind == LayerSpec::Kind::kDropout && l.p > 0) || random(l.body);
    });
  };
  // A TorchScript module may hold dropout too: its layers are not known here.
  random_layers_ = (t_.model == "layers" && random(t_.layers)) || t_.model == "torchscript";
  classes_ = t_.data.dataset == "synthetic" ? t_.data.classes : train_set_.num_classes;
  train_set_.num_classes = test_set_.num_classes = classes_;
  models::InputShape shape{train_set_.channels, train_set_.rows, train_set_.cols, classes_};
  if (t_.model == "torchscript") {
    ASSIGN_OR_RETURN(module_file_, checkpoint::ReadModuleFile(t_.torchscript));
  }
  try {
    ASSIGN_OR_RETURN(s_.model, models::MakeModel(t_.model, shape, t_.layers, module_file_ ? &*module_file_ : nullptr));
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("cannot build the model: ") + e.what());
  }
  s_.model->to(s_.device);
  s_.model->train();
  std::vector<torch::Tensor> params;
  for (auto& p : s_.model->parameters()) params.push_back(p);
  s_.reducer = std::make_unique<GradientReducer>(params, s_.comm, size_t(t_.bucket_mb * (1 << 20)), ChannelsLast());
  s_.optimizer = std::make_unique<Optimizer>(t_.optimizer, s_.reducer->flat_params(), s_.reducer->flat_grads());
  checkpoints_ = std::make_unique<checkpoint::CheckpointDir>(spec_.checkpoint_dir, t_.keep_last);
  RETURN_IF_ERROR(strategy_->Setup(s_));
  // In-memory snapshots hold what every rank has; with parameter servers the shards hold it.
  // Only in this run's own private directory (its agent made it), readable by this user alone.
  if (t_.snapshot_every > 0 && !env_.run_id.empty() && strategy_->Collective()) {
    auto dir = SnapshotDirOf(env_.run_id);
    if (dir.ok()) {
      snapshots_ = std::make_unique<checkpoint::CheckpointDir>(*dir, 1, 0600);
    } else if (env_.local_rank == 0) {
      LOG_WARN("in-memory snapshots are off: {}", dir.status().message());
    }
  }
  if (s_.rank == 0 && module_file_) {
    // The run keeps the module it trains beside its model and its checkpoints: what eval,
    // predict and the dashboard load (checkpoint/module_file.h), checked against the hash the
    // checkpoints record, never the path the spec named (its file may change, or go).
    for (const std::string& dir : {spec_.output_dir, spec_.checkpoint_dir}) {
      RETURN_IF_ERROR(MakeDirs(dir));
      RETURN_IF_ERROR(AtomicWriteFile(dir + "/" + checkpoint::kModuleCopyName, module_file_->bytes));
    }
  }
  if (s_.rank == 0) {
    ASSIGN_OR_RETURN(auto* j, metrics::JsonLines::Open(paths::MetricsJsonl(spec_.output_dir)));
    jsonl_.reset(j);
    ASSIGN_OR_RETURN(auto* e, metrics::EventWriter::Open(paths::TensorBoardDir(spec_.output_dir)));
    events_.reset(e);
  }
  return Status::Ok();
}

checkpoint::Checkpoint Trainer::Snapshot(bool with_optimizer) {
  checkpoint::Checkpoint c;
  c.step = s_.step;
  AddModuleState(*s_.model, &c.tensors);
  c.metadata = {{"model", t_.model},
                {"dataset", t_.data.dataset},
                {"data_dir", t_.data.dir},
                {"shape", std::to_string(train_set_.channels) + "," + std::to_string(train_set_.rows) + "," +
                              std::to_string(train_set_.cols)},
                {"norm_mean", JoinFloats(norm_.mean)},
                {"norm_std", JoinFloats(norm_.std)}};
  c.metadata["classes"] = std::to_string(classes_);
  if (t_.data.dataset == "imagefolder") {
    c.metadata["class_names"] = Join(train_set_.class_names, "\n");
    c.metadata["crop_pct"] = fmt::format("{}", t_.data.crop_pct > 0          ? t_.data.crop_pct
                                               : t_.data.random_resized_crop ? 0.875
                                                                             : 1.0);
    if (t_.data.test_dir.empty()) {
      c.metadata["holdout"] = fmt::format("{}", t_.data.holdout);
    } else {
      c.metadata["test_dir"] = t_.data.test_dir;
    }
  }
  if (t_.model == "layers") c.metadata["layers"] = LayersToJson(t_.layers);
  if (module_file_) {
    c.metadata["torchscript"] = checkpoint::kModuleCopyName;
    c.metadata["torchscript_sha256"] = module_file_->sha256;
  }
  c.metadata["run_id"] = env_.run_id;  // a snapshot is read only by the run that wrote it
  if (with_optimizer) {
    for (auto& [name, t] : s_.optimizer->State()) {
      c.tensors.push_back(ToBlob("optimizer." + name, s_.reducer->ToCanonical(t)));
    }
    c.metadata["optimizer.steps"] = std::to_string(s_.optimizer->steps());
    c.metadata["epoch"] = std::to_string(s_.epoch);
    c.metadata["batch_in_epoch"] = std::to_string(s_.batch_in_epoch);
    c.metadata["global_batch"] = std::to_string(s_.batch * s_.world);
    c.metadata["world_size"] = std::to_string(s_.world);
  }
  return c;
}

Status Trainer::SaveCheckpoint() {
  Enter(comm::Phase::kCheckpoint);
  RETURN_IF_ERROR(s_.SyncBuffers());
  last_saved_ = true;
  if (s_.rank != 0) return Status::Ok();
  RETURN_IF_ERROR(strategy_->BeforeSave(s_));
  Status st = checkpoints_->Save(Snapshot(/*with_optimizer=*/true));
  if (st.ok()) LOG_DEBUG("checkpoint at step {}", s_.step);
  return st;
}

// Keeps the training state in memory (tmpfs) for a fast, nearly lossless restart. After the buffer
// sync every rank holds the same state, so the first worker on each node keeps a copy: whichever
// node hosts rank 0 after a restart finds one there. A failure to write it costs only that speed,
// so it is logged, not fatal.
Status Trainer::SaveSnapshot() {
  Enter(comm::Phase::kCheckpoint);
  RETURN_IF_ERROR(s_.SyncBuffers());
  if (env_.local_rank != 0) return Status::Ok();
  if (Status st = snapshots_->Save(Snapshot(/*with_optimizer=*/true)); !st.ok()) {
    LOG_WARN("in-memory snapshot at step {} not kept: {}", s_.step, st.message());
  }
  return Status::Ok();
}

Status Trainer::Export() {
  if (s_.rank != 0) return Status::Ok();
  ASSIGN_OR_RETURN(std::string bytes, checkpoint::Encode(Snapshot(/*with_optimizer=*/false)));
  std::string path = paths::Model(spec_.output_dir);
  RETURN_IF_ERROR(AtomicWriteFile(path, bytes));
  LOG_INFO("model exported to {}", path);
  return Status::Ok();
}

// trainer.timeline_steps: the steps after the first log window (whose first steps warm the caches
// and the allocator up), or the run's last ones when it is too short to skip a window.
void Trainer::StartTimeline() {
  const int64_t n = t_.timeline_steps;
  const int64_t skip = std::clamp<int64_t>(s_.total_steps - s_.step - n, 0, t_.log_every);
  timeline_ = std::make_unique<metrics::Timeline>(s_.step + skip + 1, s_.step + skip + n);
  if (s_.rank == 0) {
    LOG_INFO("recording the timeline of steps {} to {}", timeline_->first(),
             std::min(timeline_->last(), s_.total_steps));
  }
}

// Leaves this rank's timeline in the store for rank 0, once: when its last step is done, or
// when training ends before that.
void Trainer::PublishTimeline() {
  if (timeline_published_) return;
  timeline_published_ = true;
  const std::string role = spec_.roles.empty() ? "" : env_.role_name + "-" + std::to_string(env_.role_rank);
  Status st = store_->Set(TimelineKey(env_.restart_count, s_.rank),
                          timeline_->Events(env_.group_rank, env_.host, s_.rank, role));
  if (!st.ok()) LOG_WARN("this rank's timeline is lost: {}", st.message());
}

// Rank 0, at the end: every rank's timeline from the store, in one trace. A rank whose part does
// not come within timeouts.collective is named and the others written: the timeline is an aid to
// the job, not its result.
void Trainer::WriteTimeline() {
  std::vector<std::string> parts;
  const auto deadline = Clock::now() + spec_.timeouts.collective;
  for (int r = 0; r < s_.world; ++r) {
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
  LOG_INFO(
      "timeline of steps {} to {} ({} of {} ranks) written to {}: open it in "
      "https://ui.perfetto.dev or chrome://tracing",
      timeline_->first(), std::min(timeline_->last(), s_.step), parts.size(), s_.world, path);
}

// Rank 0: the newest valid checkpoint or in-memory snapshot, loaded into the model and the
// optimizer; position = {found, step, samples done in the epoch, epoch}.
Status Trainer::LoadNewest(ResumePoint* p, int64_t* opt_steps) {
  std::vector<std::pair<std::string, torch::Tensor>> opt_state = s_.optimizer->State();
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
        return InvalidArgument("checkpoint " + from->PathFor(ckpt->step) + " holds model '" + ckpt->Meta("model") +
                               "', the spec trains '" + t_.model + "'; use another checkpoint_dir or remove it");
      }
      if (t_.model == "layers" && ckpt->Meta("layers") != LayersToJson(t_.layers)) {
        return InvalidArgument("checkpoint " + from->PathFor(ckpt->step) + " holds another declared model (" +
                               ckpt->Meta("layers") +
                               ") than the spec's trainer.model.layers; use another "
                               "checkpoint_dir or remove it");
      }
      // The training position; an exported model (weights only) in checkpoint_dir lacks it.
      ASSIGN_OR_RETURN(checkpoint::Position position, checkpoint::ReadPosition(*ckpt, from->PathFor(ckpt->step)));
      RETURN_IF_ERROR(LoadModuleState(*s_.model, *ckpt));
      for (auto& [name, t] : opt_state) {
        const checkpoint::Blob* b = ckpt->Find("optimizer." + name);
        if (!b) return InvalidArgument("checkpoint " + from->PathFor(ckpt->step) + " lacks optimizer state " + name);
        torch::Tensor canonical = torch::empty({s_.reducer->canonical_numel()}, t.options());
        RETURN_IF_ERROR(CopyBlob(*b, canonical));
        s_.reducer->FromCanonical(canonical, t);
      }
      *opt_steps = position.optimizer_steps;
      p->found = 1;
      p->step = ckpt->step;
      p->samples_in_epoch = position.samples_in_epoch();
      p->epoch = position.epoch;
      LOG_INFO("resuming from {} (step {}, epoch {})", from->PathFor(ckpt->step), ckpt->step, p->epoch + 1);
    } else if (ckpt.status().code() != Code::kNotFound) {
      return ckpt.status();
    }
  }
  return Status::Ok();
}

Status Trainer::LogStep(double loss_sum, double count, double lr, double seconds, int64_t samples, double data_seconds,
                        double comm_seconds) {
  // The loss summed over the ranks, and each rank's waiting in its own slot: the rank that waited
  // least is the one the others waited for (a straggler, `trainctl top`).
  std::vector<float> buf(2 + s_.world, 0.0f);
  buf[0] = float(loss_sum);
  buf[1] = float(count);
  buf[2 + s_.rank] = float(comm_seconds);
  RETURN_IF_ERROR(s_.comm->AllReduceSum(buf.data(), buf.size()));
  if (s_.rank != 0) return Status::Ok();
  double loss = buf[0] / std::max(1.0f, buf[1]);
  double rate = seconds > 0 ? samples / seconds : 0;
  double eta = rate > 0 ? double(s_.total_steps - s_.step) * s_.batch * s_.world / rate : 0;
  std::vector<std::pair<std::string, double>> record = {{"step", double(s_.step)},
                                                        {"epoch", double(s_.epoch + 1)},
                                                        {"loss", loss},
                                                        {"lr", lr},
                                                        {"samples_per_s", rate},
                                                        {"restart", double(env_.restart_count)},
                                                        {"window_steps", count},
                                                        {"window_seconds", seconds},
                                                        {"data_seconds", data_seconds},
                                                        {"comm_seconds", comm_seconds}};
  if (s_.world > 1 && strategy_->Collective()) {
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
  RETURN_IF_ERROR(events_->AddScalar("train/loss", loss, s_.step, now));
  RETURN_IF_ERROR(events_->AddScalar("train/lr", lr, s_.step, now));
  RETURN_IF_ERROR(events_->AddScalar("train/samples_per_s", rate, s_.step, now));
  std::printf(
      "%s\n",
      metrics::ProgressLine(s_.epoch + 1, t_.epochs, s_.batch_in_epoch, s_.steps_per_epoch, loss, rate, eta).c_str());
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
  std::vector<float> rates(s_.world, 0.0f);
  rates[s_.rank] = work_seconds_ > 0 ? float(double(work_items_) / work_seconds_) : 0.0f;
  RETURN_IF_ERROR(s_.comm->AllReduceSum(rates.data(), rates.size()));
  double total = 0;
  for (float r : rates) total += r;
  if (total <= 0) return Status::Ok();
  std::vector<double> weights(s_.world);
  for (int r = 0; r < s_.world; ++r) {
    weights[r] = 0.5 * double(shares_[r]) / double(s_.batch * s_.world) + 0.5 * rates[r] / total;
  }
  shares_ = data::SplitBatch(weights, s_.batch * s_.world, std::max<int64_t>(1, s_.batch / 8));
  work_seconds_ = 0;
  work_items_ = 0;
  return Status::Ok();
}

Status Trainer::TrainEpoch(int64_t epoch, int64_t first_batch) {
  int64_t count = s_.steps_per_epoch - first_batch;
  if (t_.max_steps > 0) count = std::min(count, t_.max_steps - s_.step);
  auto epoch_start = Clock::now();
  auto window_start = epoch_start;
  int64_t window_samples = 0;
  // The loss stays on the device until it is logged: reading it every step would make the CPU
  // wait for the GPU every step.
  torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).device(s_.device));
  double loss_count = 0;
  double lr = 0;
  auto last_status = epoch_start;
  // Where each log window's time went (`trainctl top`): waiting for the next batch, waiting for
  // the other ranks' gradients (or the parameter servers), and the rest: compute.
  double window_data = 0, epoch_comm = 0;
  // A record of the steps since the last (every log_every steps, and the epoch's last ones).
  auto record = [&]() -> Status {
    Enter(comm::Phase::kCollective);
    const double comm = strategy_->TakeWaitSeconds(s_);
    epoch_comm += comm;
    RETURN_IF_ERROR(LogStep(loss_sum.item<double>(), loss_count, lr, SecondsSince(window_start), window_samples,
                            window_data, comm));
    window_data = 0;
    loss_sum.zero_();
    loss_count = 0;
    window_samples = 0;
    window_start = Clock::now();
    return Status::Ok();
  };
  for (int64_t i = 0; i < count; ++i) {
    if (timeline_ && s_.step == timeline_->last()) {  // the steps are all there
      Enter(comm::Phase::kRecording);
      PublishTimeline();
    }
    // On a GPU the phases are the host's: its kernels run behind it, and it waits for them only
    // where it reads a result (a log line, a checkpoint).
    metrics::Timeline::Step phases(timeline_.get(), s_.step + 1);
    auto stepped = Step(phases, &window_data, &lr);
    if (!stepped.ok()) return stepped.status();
    const torch::Tensor& loss = *stepped;
    loss_sum.add_(loss.detach());
    loss_count += 1;
    window_samples += s_.batch * s_.world;
    if (s_.step % t_.log_every == 0) {
      RETURN_IF_ERROR(record());
      phases.End("log");
    }
    if (t_.checkpoint_every > 0 && s_.step % t_.checkpoint_every == 0) {
      RETURN_IF_ERROR(SaveCheckpoint());
      phases.End("checkpoint");
    } else if (snapshots_ && s_.step % t_.snapshot_every == 0) {
      RETURN_IF_ERROR(SaveSnapshot());
      phases.End("snapshot");
    }
    if (env_.tty && s_.rank == 0 && Clock::now() - last_status > std::chrono::milliseconds(250)) {
      last_status = Clock::now();
      double rate = (i + 1) * s_.batch * s_.world / std::max(1e-9, SecondsSince(epoch_start));
      double eta = double(s_.total_steps - s_.step) * s_.batch * s_.world / rate;
      std::printf("%s\r", metrics::ProgressLine(epoch + 1, t_.epochs, s_.batch_in_epoch, s_.steps_per_epoch,
                                                loss.item<float>(), rate, eta)
                              .c_str());
      std::fflush(stdout);
    }
  }
  // The steps since the last record (an epoch's or a max_steps run's last, fewer than log_every):
  // recorded too, so that the samples and steps metrics.jsonl (and Prometheus) count are all of them.
  if (loss_count > 0) RETURN_IF_ERROR(record());
  double seconds = SecondsSince(epoch_start);
  const double waited = epoch_comm + strategy_->TakeWaitSeconds(s_);
  return EndEpoch(epoch, first_batch, count, seconds, waited);
}

Result<torch::Tensor> Trainer::Step(metrics::Timeline::Step& phases, double* data_seconds, double* lr) {
  const auto fetch = Clock::now();
  Enter(comm::Phase::kData);
  if (Balanced()) {
    int64_t offset = 0;
    for (int r = 0; r < s_.rank; ++r) offset += shares_[r];
    batches_->SetShare(offset, shares_[s_.rank]);
  }
  Batch b = batches_->Next();
  RETURN_IF_ERROR(b.error);
  *data_seconds += SecondsSince(fetch);
  phases.Items(b.x.size(0));
  if (ChannelsLast()) b.x = b.x.contiguous(torch::MemoryFormat::ChannelsLast);
  phases.End("data");
  s_.reducer->ZeroGrad();
  // Dropout's masks come from the generator: seeded from the step and rank, so a resumed run
  // draws what the uninterrupted one drew (the generator's state is in no checkpoint).
  if (random_layers_) {
    torch::manual_seed(static_cast<uint64_t>(t_.seed) * 0x9E3779B97F4A7C15ull +
                       static_cast<uint64_t>(s_.step) * 65537u + static_cast<uint64_t>(s_.rank));
  }
  torch::Tensor logits;
  Enter(comm::Phase::kForward);
  {
    Autocast autocast(t_.precision == "bf16", s_.device);
    logits = s_.model->forward(b.x);
  }
  torch::Tensor loss = torch::nn::functional::cross_entropy(
      logits.to(torch::kFloat32), b.y,
      torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(t_.label_smoothing));
  // A rank's loss is the mean over its items; weighted by its part of the global batch, the
  // ranks' average is the mean over the global batch, as with even parts.
  if (Balanced() && shares_[s_.rank] != s_.batch) loss = loss * (double(shares_[s_.rank]) / double(s_.batch));
  phases.End("forward");
  Enter(comm::Phase::kBackward);
  loss.backward();
  phases.End("backward");
  if (Balanced()) {
    work_seconds_ += SecondsSince(fetch);
    work_items_ += b.x.size(0);
  }
  Enter(comm::Phase::kGradients);
  RETURN_IF_ERROR(s_.reducer->Finish());
  Enter(comm::Phase::kApply);
  *lr = LearningRate(t_.optimizer, t_.schedule, s_.step, s_.total_steps, s_.world);
  if (strategy_->Collective()) phases.End("gradient average");
  RETURN_IF_ERROR(strategy_->Apply(s_, *lr));
  phases.End(strategy_->ApplyPhase());
  ++s_.step;
  ++s_.batch_in_epoch;
  last_saved_ = false;
  if (watchdog_) watchdog_->StepDone(SecondsSince(fetch));
  if (Balanced() && s_.step % kBalanceEvery == 0) {
    Enter(comm::Phase::kCollective);
    RETURN_IF_ERROR(Rebalance());
    phases.End("balance");
  }
  return loss;
}

void Trainer::LogSkipped(data::ImageStream& stream, const std::string& when) {
  const size_t fresh = stream.TakeSkipped().size();
  const data::SkipCount c = stream.TakeSkipCount();
  if (c.count == 0) return;
  // Each rank its own shard's, every epoch; every name once in the file, whichever rank skipped it.
  LOG_WARN("{}: {} picture file(s) skipped ({} not skipped before), each {} (data.bad_images: skip; {}), first: {}",
           when, c.count, fresh,
           stream.options().leave_out_bad ? "left out of the test's figures" : "replaced by the next that decodes",
           c.file_error.empty() ? "every name in " + spec_.output_dir + "/skipped-images.txt" : c.file_error, c.first);
}

Status Trainer::EndEpoch(int64_t epoch, int64_t first_batch, int64_t count, double seconds, double waited) {
  LOG_INFO("epoch {}: {:.2f} s training, {:.2f} s of it waiting for the {}", epoch + 1, seconds, waited,
           strategy_->WaitName());
  if (train_set_.stream) LogSkipped(*train_set_.stream, "epoch " + std::to_string(epoch + 1));
  if (s_.rank == 0 && count > 0) {
    // An epoch begun by a resume or cut by max_steps is a part of one: its seconds are not an epoch's.
    const bool part = first_batch > 0 || s_.batch_in_epoch < s_.steps_per_epoch;
    RETURN_IF_ERROR(jsonl_->Write({{"epoch", double(epoch + 1)},
                                   {"step", double(s_.step)},
                                   {part ? "part_epoch_seconds" : "epoch_seconds", seconds},
                                   {"epoch_samples_per_s", count * s_.batch * s_.world / seconds},
                                   {strategy_->Collective() ? "allreduce_wait_seconds" : "ps_wait_seconds", waited},
                                   {"peak_rss_mb", PeakRssMb()},
                                   {"time", WallSeconds()}}));
  }
  return Status::Ok();
}

Status Trainer::EvalEpoch(int64_t epoch) {
  Enter(comm::Phase::kEvaluating);
  RETURN_IF_ERROR(s_.SyncBuffers());
  // Without collectives among the workers rank 0 evaluates alone.
  const bool together = strategy_->Collective();
  if (!together && s_.rank != 0) return Status::Ok();
  const int eval_rank = together ? s_.rank : 0, eval_world = together ? s_.world : 1;
  int64_t n = test_set_.count;
  ASSIGN_OR_RETURN(Confusion c,
                   Evaluate(*s_.model, test_set_, n * eval_rank / eval_world, n * (eval_rank + 1) / eval_world, norm_));
  if (test_set_.stream) LogSkipped(*test_set_.stream, "epoch " + std::to_string(epoch + 1) + "'s test");
  std::vector<float> counts(c.counts.begin(), c.counts.end());
  RETURN_IF_ERROR(s_.comm->AllReduceSum(counts.data(), counts.size()));
  c.counts.assign(counts.begin(), counts.end());
  if (s_.rank == 0) {
    RETURN_IF_ERROR(jsonl_->Write({{"epoch", double(epoch + 1)},
                                   {"step", double(s_.step)},
                                   {"test_accuracy", c.accuracy()},
                                   {"time", WallSeconds()}}));
    RETURN_IF_ERROR(events_->AddScalar("test/accuracy", c.accuracy(), s_.step, WallSeconds()));
    std::printf("epoch %lld/%d: test accuracy %.4f (%.0f images)\n", (long long)epoch + 1, t_.epochs, c.accuracy(),
                c.total());
    std::fflush(stdout);
  }
  return Status::Ok();
}

Status Trainer::Run() {
  RETURN_IF_ERROR(Setup());
  const auto set_up = Clock::now();
  RETURN_IF_ERROR(strategy_->Resume(s_, *this));
  auto seconds = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  LOG_DEBUG(
      "ready to train {:.3f} s after the trainer began: the store, the spec and the collectives {:.3f} s, "
      "the data {:.3f} s, the model {:.3f} s, resuming {:.3f} s",
      seconds(begun_, Clock::now()), seconds(begun_, connected_), seconds(connected_, loaded_),
      seconds(loaded_, set_up), seconds(set_up, Clock::now()));
  if (s_.rank == 0) {
    auto count = [](int64_t n, const char* what) { return std::to_string(n) + " " + what + (n == 1 ? "" : "s"); };
    LOG_INFO("training {} on {} ({}) on {}{}{}, {} x batch {}, {} per epoch, {}",
             t_.model == "layers"        ? "a declared model of " + count(int64_t(t_.layers.size()), "layer")
             : t_.model == "torchscript" ? "the TorchScript module " + t_.torchscript
                                         : t_.model,
             t_.data.dataset, count(train_set_.count, "image"), s_.device.str(),
             t_.precision == "bf16" ? " in bf16 mixed precision" : "", ChannelsLast() ? ", channels last" : "",
             count(s_.world, "worker"), s_.batch, count(s_.steps_per_epoch, "step"), count(t_.epochs, "epoch"));
    if (Balanced()) {
      LOG_INFO("balance: speed: each global batch of {} is split by the workers' speed, every {} steps",
               s_.batch * s_.world, kBalanceEvery);
    } else if (t_.balance == "speed") {
      LOG_WARN("trainer.balance: speed, but this round has one worker: there is nothing to balance");
    }
#if TRAINCTL_HAVE_ONEDNN
    if (t_.precision == "bf16" && s_.device.is_cpu() && !kernels::Bf16Convolutions()) {
      LOG_WARN(
          "trainer.precision: bf16, but this CPU has no bf16 instructions (AVX512-BF16 or AMX): "
          "the CNN stays fp32, other models' convolutions are emulated, slower than fp32");
    }
#endif
  }
  if (t_.timeline_steps > 0) StartTimeline();
  shares_.assign(s_.world, s_.batch);
  batches_ = std::make_unique<BatchSource>(
      train_set_, norm_,
      [count = train_set_.count, so = Sampling(), whole = Balanced()](int64_t e) {
        return whole ? data::EpochOrder(count, e, so) : data::ShardIndices(count, e, so);
      },
      s_.steps_per_epoch, s_.batch, Balanced() ? s_.batch * s_.world : s_.batch, s_.epoch, s_.batch_in_epoch, s_.device,
      Augment{static_cast<int>(t_.data.crop_padding), t_.data.flip, static_cast<uint64_t>(t_.seed), 0});
  int64_t evaluated_at = -1;  // the step of the last evaluation
  while (s_.epoch < t_.epochs && !Done()) {
    RETURN_IF_ERROR(TrainEpoch(s_.epoch, s_.batch_in_epoch));
    if (s_.batch_in_epoch < s_.steps_per_epoch) break;  // max_steps ended it mid-epoch
    if (t_.eval && ((s_.epoch + 1) % t_.eval_every == 0 || s_.epoch + 1 == t_.epochs)) {
      RETURN_IF_ERROR(EvalEpoch(s_.epoch));
      evaluated_at = s_.step;
    }
    ++s_.epoch;
    s_.batch_in_epoch = 0;
    if (t_.checkpoint_every == 0) RETURN_IF_ERROR(SaveCheckpoint());
  }
  // Every run ends evaluated: one that max_steps (or eval_every) ended between evaluations too.
  if (t_.eval && evaluated_at != s_.step && s_.step > 0) {
    RETURN_IF_ERROR(EvalEpoch(std::min<int64_t>(s_.epoch, t_.epochs - 1)));
  }
  batches_.reset();
  if (timeline_) PublishTimeline();
  RETURN_IF_ERROR(strategy_->Finish(s_));
  if (!strategy_->Collective()) last_saved_ = false;  // the final state is elsewhere (the shards')
  if (!last_saved_) RETURN_IF_ERROR(SaveCheckpoint());
  if (timeline_ && s_.rank == 0) WriteTimeline();
  // Every rank logs a digest of its final parameters: data parallelism keeps them bit-identical,
  // and a rank that drifted is easy to spot.
  torch::Tensor flat = s_.reducer->ToCanonical(s_.reducer->flat_params()).cpu();
  LOG_INFO("final parameters: {} values, crc32c {:08x}", flat.numel(),
           metrics::Crc32c(flat.data_ptr(), flat.numel() * sizeof(float)));
  return Export();
}

}  // namespace trainctl::train
