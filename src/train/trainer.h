// The built-in data-parallel trainer: one process per training rank, started by the agent as
// `trainctl train` with the torchrun environment (RunTrainer, train/entry.h). See docs/trainer.md.
//
// The loop (Trainer) owns the data, the model, the metrics and the checkpoints; how a step's
// gradients become the next parameters, and where the training state lives between steps, is the
// StepStrategy's: averaged among the ranks and applied by each (allreduce), or pushed to
// parameter servers that apply them (parameter_server). Both see the same TrainState.
//
// Threads: one, the training thread (the reducer and the batch source keep threads of their own).
// Errors travel as Status: kInvalidArgument for what fails the same way every time (the agent
// spends no restart on it), kTimeout for a stalled peer, anything else for a lost one.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "comm/communicator.h"
#include "comm/ps/ps.h"
#include "common/duration.h"
#include "common/status.h"
#include "data/dataset.h"
#include "data/sampler.h"
#include "job/task_env.h"
#include "jobspec/job_spec.h"
#include "metrics/metrics.h"
#include "metrics/timeline.h"
#include "models/models.h"
#include "store/store.h"
#include "train/batches.h"
#include "train/optimizer.h"
#include "train/reducer.h"
#include "train/torch_data.h"

namespace trainctl::comm {
class ProgressWatchdog;
enum class Phase : int;
}  // namespace trainctl::comm

namespace trainctl::train {

// Each training rank's batch: trainer.global_batch_size split evenly among `world` ranks, else
// trainer.batch_size. Below 1 when the global batch is smaller than the world.
int64_t WorkerBatch(const TrainerSpec& t, int world);

// Where training resumes: a checkpoint's position, broadcast from rank 0 as 4 whole numbers.
struct ResumePoint {
  int64_t found = 0;             // 1 when a checkpoint or snapshot was loaded
  int64_t step = 0;              // optimizer steps done, job-wide
  int64_t samples_in_epoch = 0;  // of the global batch's order
  int64_t epoch = 0;
};

// What the loop and its step strategy share: the round, the model's flat parameters and their
// optimizer, and the position in training.
struct TrainState {
  int rank = 0, world = 1;  // among the training tasks
  torch::Device device{torch::kCPU};
  comm::Communicator* comm = nullptr;
  std::shared_ptr<models::Classifier> model;
  std::unique_ptr<GradientReducer> reducer;
  std::unique_ptr<Optimizer> optimizer;
  int64_t batch = 0;  // per rank
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
  int64_t step = 0;            // optimizer steps done, job-wide
  int64_t epoch = 0;           // current epoch
  int64_t batch_in_epoch = 0;  // batches done in the current epoch

  // Every rank takes rank 0's buffers (batch norm's running statistics).
  Status SyncBuffers();
  // The same position in an epoch's sample order, whatever the world size when it was saved.
  void MoveTo(const ResumePoint& p);
};

// Where the newest saved state is (the trainer's checkpoint directory and in-memory snapshots).
class StateSource {
 public:
  virtual ~StateSource() = default;
  // Rank 0: loads the newest valid checkpoint or snapshot into the model and the optimizer's
  // state; `p->found` is 0 when there is none. `optimizer_steps`: the optimizer's step count.
  virtual Status LoadNewest(ResumePoint* p, int64_t* optimizer_steps) = 0;
};

// How a step's gradients, averaged by the reducer's Finish(), become the next parameters.
class StepStrategy {
 public:
  virtual ~StepStrategy() = default;
  // After the model, the reducer and the optimizer exist.
  virtual Status Setup(TrainState&) { return Status::Ok(); }
  // Brings every rank's state to where training resumes, and `s`'s position with it.
  virtual Status Resume(TrainState& s, StateSource& saved) = 0;
  // Applies a step's gradients at `lr`; names its phase for the timeline ("optimizer").
  virtual Status Apply(TrainState& s, double lr) = 0;
  virtual const char* ApplyPhase() const = 0;
  // Rank 0, before it saves a checkpoint: brings the whole state into `s` (if it lives elsewhere).
  virtual Status BeforeSave(TrainState&) { return Status::Ok(); }
  // After the last step (every rank).
  virtual Status Finish(TrainState&) { return Status::Ok(); }
  // Seconds spent waiting for the others since the last call; resets the count.
  virtual double TakeWaitSeconds(TrainState& s) = 0;
  virtual const char* WaitName() const = 0;  // "gradient allreduce"
  // Whether the ranks meet in collectives after each step (then they evaluate together and their
  // waits are compared), and keep in-memory snapshots of what every rank holds.
  virtual bool Collective() const = 0;
};
std::unique_ptr<StepStrategy> AllreduceStrategy();
// `ps`: connected to the job's shards; must outlive the strategy.
std::unique_ptr<StepStrategy> ParameterServerStrategy(comm::ps::Client* ps);

struct TrainerOptions {
  JobSpec spec;
  TaskEnv env;
  int rank = 0, world = 1;             // among the training tasks
  comm::Communicator* comm = nullptr;  // for the parameter_server strategy a group of one
  torch::Device device{torch::kCPU};
  // The round's key space, where the ranks leave their timelines (trainer.timeline_steps) for
  // rank 0.
  Store* store = nullptr;
  // When RunTrainer began, and when its collectives were connected: for the start's debug line.
  Clock::time_point begun = Clock::now(), connected = begun;
  // Told each phase of the training loop and each step's time (comm/progress.h); may be null.
  comm::ProgressWatchdog* watchdog = nullptr;
};

// Everything one training process holds.
class Trainer : private StateSource {
 public:
  Trainer(TrainerOptions o, std::unique_ptr<StepStrategy> strategy);
  ~Trainer() override;
  // Trains to the end of the spec's epochs (or max_steps), saves and exports the model.
  Status Run();

 private:
  Status Setup();
  Status LoadNewest(ResumePoint* p, int64_t* optimizer_steps) override;
  Status TrainEpoch(int64_t epoch, int64_t first_batch);
  // One training step: a batch, forward, backward, the gradients exchanged and applied at `*lr`.
  // Adds the seconds spent waiting for the batch to `*data_seconds`; returns the step's loss.
  Result<torch::Tensor> Step(metrics::Timeline::Step& phases, double* data_seconds, double* lr);
  // The skips `stream` counted since the last call, logged (when any) for `when`.
  void LogSkipped(data::ImageStream& stream, const std::string& when);
  // The epoch's end: its line in the log and, on rank 0, in metrics.jsonl (`count` steps in `seconds`).
  Status EndEpoch(int64_t epoch, int64_t first_batch, int64_t count, double seconds, double waited);
  Status EvalEpoch(int64_t epoch);
  Status SaveCheckpoint();
  Status SaveSnapshot();
  Status Export();
  void StartTimeline();
  void PublishTimeline();
  void WriteTimeline();
  checkpoint::Checkpoint Snapshot(bool with_optimizer);
  // One metrics line: the window's loss, rate, and where its time went (rank 0's).
  Status LogStep(double loss_sum, double count, double lr, double seconds, int64_t samples, double data_seconds,
                 double comm_seconds);
  bool Done() const { return t_.max_steps > 0 && s_.step >= t_.max_steps; }
  // This rank's shard of each epoch, shuffled, the short last batch dropped: the epoch's length
  // (Setup) and its order (the batches) from one definition.
  data::SamplerOptions Sampling() const;
  // trainer.memory_format; the spec allows channels_last with the allreduce strategy only.
  bool ChannelsLast() const { return t_.memory_format == "channels_last"; }
  // trainer.balance: speed (the spec allows it on the CPU with allreduce), with a peer to
  // balance against.
  bool Balanced() const { return t_.balance == "speed" && s_.world > 1; }
  Status Rebalance();

  const JobSpec spec_;
  const TrainerSpec& t_;
  const TaskEnv env_;
  Store* store_;
  std::unique_ptr<StepStrategy> strategy_;
  TrainState s_;

  data::ImageSet train_set_, test_set_;
  Normalizer norm_;
  std::unique_ptr<checkpoint::CheckpointDir> checkpoints_;
  std::unique_ptr<checkpoint::CheckpointDir> snapshots_;  // in memory (/dev/shm); may be null
  std::unique_ptr<metrics::JsonLines> jsonl_;
  std::unique_ptr<metrics::EventWriter> events_;
  std::unique_ptr<metrics::Timeline> timeline_;  // trainer.timeline_steps; else null
  bool timeline_published_ = false;

  int classes_ = 0;
  bool random_layers_ = false;                         // the model draws from the generator when training (dropout)
  std::optional<checkpoint::ModuleFile> module_file_;  // trainer.model.torchscript's, as read
  bool last_saved_ = false;
  comm::ProgressWatchdog* watchdog_;
  // TRAINCTL_FAULT_HANG=RANK:STEP[:forward|gradients] (for tests of the watchdog): that rank's
  // training thread hangs as that step enters the phase (the forward pass by default), neither
  // stopped nor blocked in the kernel (which the agent sees in /proc), its other threads alive.
  int64_t hang_at_step_ = -1;
  comm::Phase hang_phase_{};  // set with hang_at_step_
  void Enter(comm::Phase phase);
  // Balanced(): each rank's part of the global batch (batch each at first), and this rank's
  // computing (its batches, forward and backward) since the last Rebalance().
  std::vector<int64_t> shares_;
  double work_seconds_ = 0;
  int64_t work_items_ = 0;
  std::unique_ptr<BatchSource> batches_;  // the training batches; last: it reads train_set_, norm_
  Clock::time_point begun_, connected_, loaded_;
};

}  // namespace trainctl::train
