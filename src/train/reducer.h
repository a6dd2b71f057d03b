// GradientReducer: data-parallel gradient averaging that overlaps communication with backward,
// as PyTorch DDP's reducer does.
//
// At construction the parameters are moved into one flat buffer, and their gradients become views
// of a second one, laid out in reverse registration order (roughly the order backward produces
// them) and cut into buckets of about `bucket_bytes`. A hook on each parameter's gradient
// accumulator counts the gradients that are ready; when a bucket is complete, the reducer's
// thread allreduces it while backward goes on with the rest. Finish() waits for every bucket and
// divides by the world size. The flat buffers also let the optimizer update all parameters in a
// few vectorized operations.
//
// On a GPU the buffers live on the parameters' device. A hook runs when backward has queued a
// gradient's kernels, not when they have run: the hook that completes a bucket queues its sum
// (the communicator's DeviceAllReduce, NCCL) behind them, and Finish() makes the stream wait for
// the sums, so neither waits on the host and the GPU goes from one step to the next without a
// gap; the host runs at most one step ahead. Errors then come back one step late. A backend
// without queued sums gets each bucket from the reducer's thread once an event says it is ready.
//
// Ranks that share memory (the shm backend, CPU) have no thread and no copies: the gradient
// buffer is this rank's input of the communicator's SharedAverage, so backward writes where the
// peers read; a complete bucket is posted to it, and in Finish() the ranks average the posted
// buckets, the rank that finished backward first starting while the others still compute. Then
// flat_grads() is the shared average, and the parameters' .grad() are zero, ready for the next
// backward (the average clears what it has read, so ZeroGrad has nothing to do).
//
// Threads: ZeroGrad/Finish/Broadcast from the training thread only; hooks run on the thread that
// calls backward. Errors (a peer gone, a timeout) come back from Finish(); after one, the reducer
// is unusable and the trainer should exit so the agent can start a new round.
#pragma once

#include <c10/core/Event.h>
#include <torch/types.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "common/status.h"

namespace trainctl::train {

class GradientReducer {
 public:
  // `params` must be leaf tensors that require grad, float32, all on one device (the CPU, or one
  // GPU with a communicator that takes GPU memory). They become views of one flat buffer, their
  // gradients views of another; with `channels_last` the 4-D ones are laid out N,H,W,C there
  // (torch::MemoryFormat::ChannelsLast), the layout GPU convolutions run fastest on.
  GradientReducer(std::vector<torch::Tensor> params, comm::Communicator* comm, size_t bucket_bytes,
                  bool channels_last = false);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Every rank gets rank 0's parameters (call once, before training).
  Status BroadcastParameters();
  // Zeroes the gradients and arms the buckets for the next backward.
  void ZeroGrad();
  // Waits for every bucket's allreduce, then averages; call after backward.
  Status Finish();

  torch::Tensor flat_params() const { return flat_params_; }
  // The averaged gradients, after Finish().
  torch::Tensor flat_grads() const { return flat_mean_; }
  size_t bucket_count() const { return buckets_.size(); }
  // A flat tensor laid out as flat_params() (the optimizer's state is), as the parameters' own
  // elements one after the other (each contiguous, N,C,H,W; no padding between them), and back:
  // what checkpoints hold, so they depend on neither the memory format nor the device.
  torch::Tensor ToCanonical(const torch::Tensor& flat) const;
  void FromCanonical(const torch::Tensor& canonical, torch::Tensor flat) const;
  int64_t canonical_numel() const { return dense_numel_; }  // on a GPU less than the flat buffers
  // Seconds Finish() spent waiting for allreduces since the last call; resets the count. Always
  // 0 with sums queued on the GPU, which overlap its kernels where the host cannot time them.
  double TakeWaitSeconds();

 private:
  struct Bucket {
    int64_t offset = 0, numel = 0;
    int expected = 0;                    // parameters in the bucket
    int ready = 0;                       // gradients accumulated so far in this step
    std::shared_ptr<c10::Event> queued;  // GPU: recorded when the bucket's last gradient is queued
  };
  struct GradBuffer {
    torch::Tensor flat;
    std::vector<torch::Tensor> views;  // one per parameter
  };
  torch::Tensor ViewOf(const torch::Tensor& flat, size_t k) const;
  void UseGradBuffer(float* data);
  void MarkQueued(Bucket& b);
  void LaunchOnDevice(const Bucket& b);
  void OnGradReady(size_t bucket);
  void CommLoop();

  comm::Communicator* comm_;
  bool alone_ = false;  // one CPU rank: nothing to reduce
  std::vector<torch::Tensor> params_;
  std::vector<int64_t> offsets_;        // of each parameter in the flat buffers
  std::vector<int64_t> dense_offsets_;  // in the canonical form
  int64_t dense_numel_ = 0;
  bool channels_last_;
  torch::Device device_;
  std::unique_ptr<comm::SharedAverage> shared_;        // null: buckets and a thread
  std::unique_ptr<comm::DeviceAllReduce> device_sum_;  // GPU: sums queued on the device
  torch::Tensor flat_params_, flat_grads_;
  torch::Tensor flat_mean_;               // flat_grads_, or the shared average
  std::vector<GradBuffer> grad_buffers_;  // shared: the two buffers gradients go to in turn
  std::vector<Bucket> buckets_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // keeps the hooks alive

  std::mutex mu_;
  std::condition_variable cv_;
  size_t next_to_reduce_ = 0;  // buckets below this are done (or failed)
  size_t launched_ = 0;        // buckets handed to the comm thread (or posted, or queued) this step
  bool armed_ = false;
  bool stopping_ = false;
  Status error_;
  double wait_seconds_ = 0;
  std::thread thread_;
};

}  // namespace trainctl::train
