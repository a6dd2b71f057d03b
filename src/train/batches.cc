#include "train/batches.h"

#include <ATen/autocast_mode.h>
#include <c10/core/StreamGuard.h>

namespace trainctl::train {

BatchSource::BatchSource(const data::ImageSet& set, const Normalizer& norm, Order order, int64_t steps_per_epoch,
                         int64_t batch, int64_t stride, int64_t epoch, int64_t first, const torch::Device& device,
                         Augment augment)
    : set_(set),
      norm_(norm),
      order_(std::move(order)),
      steps_per_epoch_(steps_per_epoch),
      batch_(batch),
      stride_(stride),
      augment_(augment),
      count_(batch),
      epoch_(epoch),
      next_(first),
      device_(device) {
  if (!device.is_cuda()) return;
  gpu_.emplace(device.type());
  if (set.stream) {
    bytes_ = true;
    mean255_ = torch::tensor(norm.mean).mul(255).view({1, -1, 1, 1}).to(device);
    std255_ = torch::tensor(norm.std).mul(255).view({1, -1, 1, 1}).to(device);
  }
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

BatchSource::~BatchSource() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Batch BatchSource::Next() {
  if (!gpu_) return Make();
  if (!ahead_) ahead_ = Send(Pop());
  Upload now = std::move(*ahead_);
  ahead_ = Send(Pop());  // the next step's copy, queued before this step's kernels
  const c10::Stream compute = gpu_->getStream(device_);
  now.copied.block(compute);
  // Allocated for the copy stream: not to be reused before the compute stream is done with them.
  for (const torch::Tensor* t : {&now.batch.x, &now.batch.y}) {
    if (t->defined()) gpu_->recordDataPtrOnStream(t->storage().data_ptr(), compute);
  }
  if (bytes_ && now.batch.error.ok()) now.batch.x = now.batch.x.to(torch::kFloat32).sub_(mean255_).div_(std255_);
  return std::move(now.batch);
}

BatchSource::Upload::Upload(const Batch& host, const torch::Device& device, const c10::Stream& stream)
    : copied(device.type()) {
  c10::StreamGuard on(stream);
  batch.error = host.error;
  if (host.error.ok()) {
    batch.x = host.x.to(device, /*non_blocking=*/true);
    batch.y = host.y.to(device, /*non_blocking=*/true);
  }
  copied.record(stream);
}

Batch BatchSource::Pop() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !queue_.empty(); });
  Batch b = std::move(queue_.front());
  queue_.pop_front();
  cv_.notify_all();
  return b;
}

Batch BatchSource::Make() {
  if (indices_.empty() || next_ == steps_per_epoch_) {
    if (next_ == steps_per_epoch_) ++epoch_, next_ = 0;
    indices_ = order_(epoch_);
  }
  Batch out;
  if (gpu_) {
    out.x = torch::empty({batch_, set_.channels, set_.rows, set_.cols},
                         torch::TensorOptions().dtype(bytes_ ? torch::kUInt8 : torch::kFloat32).pinned_memory(true));
    out.y = torch::empty({batch_}, torch::TensorOptions().dtype(torch::kInt64).pinned_memory(true));
  }
  augment_.epoch = epoch_;
  out.error = FillBatch(set_, indices_.data() + next_ * stride_ + offset_, count_, norm_, &out.x, &out.y, &augment_);
  ++next_;
  // The next batch's images come from memory while this step computes (to the outer caches:
  // the step's own data would push them out of the inner ones), or a streamed set's are decoded.
  if ((!gpu_ || set_.stream) && next_ < steps_per_epoch_) {
    PrefetchImages(set_, indices_.data() + next_ * stride_ + offset_, count_, epoch_);
  }
  return out;
}

Autocast::Autocast(bool bf16, const torch::Device& device) : on_(bf16), cuda_(device.is_cuda()) {
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

Autocast::~Autocast() {
  if (!on_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  if (cuda_)
    at::autocast::set_enabled(false);
  else
    at::autocast::set_cpu_enabled(false);
}

}  // namespace trainctl::train
