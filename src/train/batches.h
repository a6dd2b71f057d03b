// The training loop's inputs: the batches in order (made ahead and copied to a GPU on a stream
// of their own, or made when asked on the CPU), and the scope of bf16 autocast around a forward
// pass. Used by the trainer and by the worker server's warm-up step.
#pragma once

#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/types.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "common/status.h"
#include "data/dataset.h"
#include "train/torch_data.h"

namespace trainctl::train {

struct Batch {
  torch::Tensor x, y;
  Status error;  // a streamed set's (a file that does not decode, with data.bad_images: fail)
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
// images takes microseconds to build. A streamed image folder's next batch is decoded by its own
// threads (data/image_stream.h) while a step computes, on either.
//
// Threads: every method from one thread (the training thread); `set` and `norm` must outlive it.
class BatchSource {
 public:
  // The shuffled order of an epoch's samples: this rank's shard, whose step s is its items
  // [s x batch, (s + 1) x batch); or, with `stride` > batch, the order every shard is cut from,
  // whose step s is the global batch [s x stride, (s + 1) x stride), of which the rank reads the
  // part SetShare() names.
  using Order = std::function<std::vector<int64_t>(int64_t epoch)>;
  // `augment`: the training batches' augmentation (its epoch is set here).
  BatchSource(const data::ImageSet& set, const Normalizer& norm, Order order, int64_t steps_per_epoch, int64_t batch,
              int64_t stride, int64_t epoch, int64_t first, const torch::Device& device, Augment augment = {});
  ~BatchSource();
  BatchSource(const BatchSource&) = delete;
  BatchSource& operator=(const BatchSource&) = delete;

  // The items of the next global batch that Next() reads: `count` from `offset` (the CPU only:
  // a GPU's batches are made ahead).
  void SetShare(int64_t offset, int64_t count) {
    offset_ = offset;
    count_ = count;
  }

  // The next batch; on a GPU, on the device, ready for the kernels queued after this call.
  Batch Next();

 private:
  // A batch on its way to the GPU: its copy is queued on copy_stream_ and done when `copied` is.
  // (The pinned host memory's allocator records the copy too: it reuses it only after.)
  struct Upload {
    Upload(const Batch& host, const torch::Device& device, const c10::Stream& stream);
    Batch batch;
    c10::Event copied;
  };
  Upload Send(const Batch& host) { return {host, device_, *copy_stream_}; }
  Batch Pop();   // the thread's next batch
  Batch Make();  // the next batch (on the thread, if there is one)

  static constexpr size_t kDepth = 2;
  const data::ImageSet& set_;
  const Normalizer& norm_;
  // A streamed set on a GPU: batches cross as bytes (a quarter of the floats) and are normalized
  // there, by these (per channel, in 0..255 units, on the device).
  bool bytes_ = false;
  torch::Tensor mean255_, std255_;
  Order order_;
  const int64_t steps_per_epoch_, batch_, stride_;
  Augment augment_;
  int64_t offset_ = 0, count_;    // the part of each step's items this rank reads
  int64_t epoch_, next_;          // where the next batch is
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
// computed outside, in f32. A scope: on from construction to destruction, on this thread.
class Autocast {
 public:
  Autocast(bool bf16, const torch::Device& device);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  bool on_, cuda_;
};

}  // namespace trainctl::train
