#include "train/reducer.h"

#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/cuda.h>

#include <algorithm>

#include "common/duration.h"
#include "common/log.h"

#if TRAINCTL_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace trainctl::train {
namespace {

// The calling thread's current CUDA stream (a cudaStream_t) on `device`, for the communicator.
void* CurrentStream(const torch::Device& device) {
#if TRAINCTL_TORCH_CUDA
  return c10::cuda::getCurrentCUDAStream(device.index()).stream();
#else
  (void)device;
  return nullptr;  // unreachable: without CUDA in LibTorch there is no GPU tensor
#endif
}

}  // namespace

GradientReducer::GradientReducer(std::vector<torch::Tensor> params, comm::Communicator* comm, size_t bucket_bytes,
                                 bool channels_last)
    : comm_(comm),
      params_(std::move(params)),
      offsets_(params_.size()),
      dense_offsets_(params_.size()),
      channels_last_(channels_last),
      device_(params_.empty() ? torch::Device(torch::kCPU) : params_[0].device()) {
  // Reverse order: the last layers' gradients come first in backward. On a GPU each parameter
  // starts on a 64-byte boundary: channels-last kernels load 16 bytes at a time, and ResNet-50 in
  // channels-last failed with a CUDA error when parameters lay at 4-byte offsets (the likely
  // cause; not yet run on a GPU since).
  const int64_t align = device_.is_cuda() ? 16 : 1;
  int64_t total = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    total = (total + align - 1) / align * align;
    offsets_[k] = total;
    dense_offsets_[k] = dense_numel_;
    total += params_[k].numel();
    dense_numel_ += params_[k].numel();
  }
  auto options = torch::TensorOptions().dtype(torch::kFloat32).device(device_);
  flat_params_ = torch::empty({total}, options);
  if (device_.is_cpu() && comm_->size() > 1) {
    auto shared = comm_->MakeSharedAverage(total);
    if (shared.ok()) {
      shared_ = std::move(*shared);
    } else if (shared.status().code() != Code::kInvalidArgument) {  // none, or too large to try
      LOG_WARN("gradients go through allreduce, not shared memory: {}", shared.status().message());
    }
  }
  if (device_.is_cuda()) {
    auto sum = comm_->MakeDeviceAllReduce();
    if (sum.ok()) {
      device_sum_ = std::move(*sum);
    } else if (sum.status().code() != Code::kInvalidArgument) {
      LOG_WARN("gradients go through allreduce calls, not queued sums: {}", sum.status().message());
    }
  }
  if (shared_) {
    flat_grads_ = torch::from_blob(shared_->input(), {total}, options).zero_();
    flat_mean_ = torch::from_blob(const_cast<float*>(shared_->result()), {total}, options);
  } else {
    flat_grads_ = flat_mean_ = torch::zeros({total}, options);
  }

  const int64_t bucket_numel = std::max<int64_t>(1, bucket_bytes / sizeof(float));
  std::vector<size_t> bucket_of(params_.size());
  for (size_t k = params_.size(); k-- > 0;) {
    torch::Tensor& p = params_[k];
    if (buckets_.empty() || buckets_.back().numel >= bucket_numel) {
      buckets_.push_back(Bucket{offsets_[k], 0, 0, 0, nullptr});
      if (device_.is_cuda() && !device_sum_) {
        buckets_.back().queued = std::make_shared<c10::Event>(device_.type());
      }
    }
    Bucket& b = buckets_.back();
    torch::NoGradGuard no_grad;
    torch::Tensor param_view = ViewOf(flat_params_, k);
    param_view.copy_(p);
    p.set_data(param_view);
    p.mutable_grad() = ViewOf(flat_grads_, k);
    b.numel = offsets_[k] + p.numel() - b.offset;  // the padding before it too
    b.expected += 1;
    bucket_of[k] = buckets_.size() - 1;
  }
  // A rank alone on the CPU (the parameter_server strategy's workers) has nothing to reduce: no
  // hooks, no thread; backward's gradients are the result.
  alone_ = comm_->size() == 1 && device_.is_cpu();
  if (alone_) return;
  for (size_t k = 0; k < params_.size(); ++k) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[k]);
    size_t bucket = bucket_of[k];
    acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, bucket](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
          OnGradReady(bucket);
          return outputs;
        }));
    accumulators_.push_back(std::move(acc));
  }
  if (!shared_ && !device_sum_) thread_ = std::thread([this] { CommLoop(); });
}

GradientReducer::~GradientReducer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // The gradients live in shared_'s memory, which goes with it.
  if (shared_) {
    for (auto& p : params_) p.mutable_grad() = torch::Tensor();
  }
}

// Parameter k's view of a flat buffer laid out as flat_params_.
torch::Tensor GradientReducer::ViewOf(const torch::Tensor& flat, size_t k) const {
  const torch::Tensor& p = params_[k];
  torch::Tensor v = flat.narrow(0, offsets_[k], p.numel());
  if (channels_last_ && p.dim() == 4) {
    auto s = p.sizes();
    return v.view({s[0], s[2], s[3], s[1]}).permute({0, 3, 1, 2});
  }
  return v.view(p.sizes());
}

torch::Tensor GradientReducer::ToCanonical(const torch::Tensor& flat) const {
  torch::NoGradGuard no_grad;
  torch::Tensor out = torch::empty({dense_numel_}, flat.options());
  for (size_t k = 0; k < params_.size(); ++k) {
    out.narrow(0, dense_offsets_[k], params_[k].numel()).view(params_[k].sizes()).copy_(ViewOf(flat, k));
  }
  return out;
}

void GradientReducer::FromCanonical(const torch::Tensor& canonical, torch::Tensor flat) const {
  torch::NoGradGuard no_grad;
  for (size_t k = 0; k < params_.size(); ++k) {
    ViewOf(flat, k).copy_(canonical.narrow(0, dense_offsets_[k], params_[k].numel()).view(params_[k].sizes()));
  }
}

Status GradientReducer::BroadcastParameters() {
  // The communicator's own stream does not wait for the kernels that wrote them.
  if (device_.is_cuda()) torch::cuda::synchronize(device_.index());
  return comm_->Broadcast(flat_params_.data_ptr(), flat_params_.numel() * sizeof(float), 0);
}

void GradientReducer::ZeroGrad() {
  if (shared_) {
    // The shared average hands out its inputs zeroed: it cleared them as it read them.
    if (shared_->input() != flat_grads_.data_ptr<float>()) UseGradBuffer(shared_->input());
  } else {
    flat_grads_.zero_();
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& b : buckets_) b.ready = 0;
  next_to_reduce_ = 0;
  launched_ = 0;
  armed_ = true;
}

// The shared average takes each step's gradients in one of two buffers, in turn: the
// parameters' .grad() become views of the one in use.
void GradientReducer::UseGradBuffer(float* data) {
  auto it = std::find_if(grad_buffers_.begin(), grad_buffers_.end(),
                         [&](const GradBuffer& b) { return b.flat.data_ptr<float>() == data; });
  if (it == grad_buffers_.end()) {
    GradBuffer b;
    b.flat = torch::from_blob(data, flat_grads_.sizes(), flat_grads_.options());
    for (size_t k = 0; k < params_.size(); ++k) b.views.push_back(ViewOf(b.flat, k));
    it = grad_buffers_.insert(grad_buffers_.end(), std::move(b));
  }
  flat_grads_ = it->flat;
  for (size_t k = 0; k < params_.size(); ++k) params_[k].mutable_grad() = it->views[k];
}

void GradientReducer::OnGradReady(size_t bucket) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!armed_) return;  // a backward outside training (none today): nothing to reduce
  Bucket& b = buckets_[bucket];
  if (++b.ready < b.expected) return;
  if (shared_ || device_sum_) {
    // The complete buckets in front, in index order as every rank has them: peers that finish
    // backward first average them (shared), or their sums are queued behind their gradients.
    while (launched_ < buckets_.size() && buckets_[launched_].ready == buckets_[launched_].expected) {
      LaunchOnDevice(buckets_[launched_++]);
    }
    if (shared_ && launched_ > 0) {
      shared_->Post(buckets_[launched_ - 1].offset + buckets_[launched_ - 1].numel);
    }
    return;
  }
  MarkQueued(b);
  cv_.notify_all();
}

// Queues the bucket's sum behind its gradients on the calling thread's stream (device_sum_ only);
// the first failure is kept for Finish().
void GradientReducer::LaunchOnDevice(const Bucket& b) {
  if (!device_sum_ || !error_.ok()) return;
  error_ = device_sum_->Enqueue(flat_grads_.data_ptr<float>() + b.offset, b.numel, CurrentStream(device_));
}

// The calling thread's current stream is the one backward (or the training thread) queued the
// bucket's gradients on.
void GradientReducer::MarkQueued(Bucket& b) {
  if (!b.queued) return;
  c10::impl::VirtualGuardImpl guard(device_.type());
  b.queued->record(guard.getStream(device_));
}

// Reduces buckets strictly in index order, so every rank issues the same collectives in the
// same order whatever order its hooks fire in.
void GradientReducer::CommLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] {
      return stopping_ ||
             (armed_ && launched_ < buckets_.size() && buckets_[launched_].ready >= buckets_[launched_].expected);
    });
    if (stopping_) return;
    Bucket b = buckets_[launched_++];
    Status st;
    if (error_.ok()) {
      lock.unlock();
      if (b.queued) {
        while (!b.queued->query()) std::this_thread::yield();
      }
      st = comm_->AllReduceSum(flat_grads_.data_ptr<float>() + b.offset, b.numel);
      lock.lock();
    }
    if (!st.ok() && error_.ok()) error_ = st;
    next_to_reduce_ = launched_;
    cv_.notify_all();
  }
}

double GradientReducer::TakeWaitSeconds() {
  double s = wait_seconds_;
  wait_seconds_ = 0;
  return s;
}

Status GradientReducer::Finish() {
  if (alone_) return Status::Ok();
  auto start = Clock::now();
  if (shared_) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      armed_ = false;  // posts belong to this step
    }
    Status st = shared_->Average();
    wait_seconds_ += SecondsSince(start);
    return st;
  }
  if (device_sum_) {
    Status st;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Buckets whose parameters took no part in this step: their zero gradients, in order.
      while (launched_ < buckets_.size()) LaunchOnDevice(buckets_[launched_++]);
      armed_ = false;
      st = error_;
    }
    // Not counted as waiting: Join waits for the GPU to finish the step before, and the sums
    // in it run beside its kernels, so the host cannot tell them apart.
    if (st.ok()) st = device_sum_->Join(CurrentStream(device_));
    if (!st.ok()) return st;
    if (comm_->size() > 1) flat_grads_.div_(static_cast<float>(comm_->size()));
    return Status::Ok();
  }
  std::unique_lock<std::mutex> lock(mu_);
  // Parameters that took no part in this step's graph never fire their hooks: their gradient
  // stays zero, and their buckets are released here (after the gradients queued so far).
  for (auto& b : buckets_) {
    if (b.ready < b.expected) {
      b.ready = b.expected;
      MarkQueued(b);
    }
  }
  cv_.notify_all();
  cv_.wait(lock, [&] { return next_to_reduce_ == buckets_.size(); });
  armed_ = false;
  Status st = error_;
  lock.unlock();
  wait_seconds_ += SecondsSince(start);
  if (!st.ok()) return st;
  if (comm_->size() > 1) flat_grads_.div_(static_cast<float>(comm_->size()));
  return Status::Ok();
}

}  // namespace trainctl::train
