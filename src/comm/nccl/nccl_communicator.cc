// NCCL backend: GPU collectives on the job's GPUs (NVLink, PCIe, InfiniBand or sockets, as NCCL
// chooses), for trainers with `device: cuda`. Built only where CUDA and NCCL are found.
//
// Every call keeps the Communicator contract: it returns once the collective is complete on this
// rank, or after the timeout, with the communicator aborted. NCCL's own calls never block here:
// the communicator is non-blocking (ncclConfig_t::blocking = 0), and completion is polled on a
// CUDA event against the deadline, so a dead or stalled peer gives kTimeout instead of a hang.
// Buffers may be in GPU or host memory: host buffers (small headers, metric counts) go through a
// staging buffer on the GPU. The trainer's gradients instead go through a DeviceAllReduce: sums
// queued in stream order, watched by a thread of its own (see communicator.h).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "comm/communicator.h"

namespace trainctl::comm {
namespace {

constexpr char kIdKey[] = "nccl/unique_id";

std::string CudaError(const char* what, cudaError_t err) { return std::string(what) + ": " + cudaGetErrorString(err); }

class NcclCommunicator : public Communicator {
  friend class NcclDeviceAllReduce;

 public:
  NcclCommunicator(const NcclOptions& o) : rank_(o.rank), size_(o.size), device_(o.device), timeout_(o.timeout) {}
  ~NcclCommunicator() override {
    ::cudaSetDevice(device_);
    if (comm_) {
      if (broken_) {
        ncclCommAbort(comm_);
      } else {
        ncclCommDestroy(comm_);
      }
    }
    if (staging_) ::cudaFree(staging_);
    if (done_) ::cudaEventDestroy(done_);
    if (stream_) ::cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Status Init(Store& store) {
    if (cudaError_t e = ::cudaSetDevice(device_); e != cudaSuccess) {
      return Unavailable(CudaError(("nccl: GPU " + std::to_string(device_)).c_str(), e));
    }
    // A stream of its own that does not synchronize with the legacy default stream, so the
    // collectives overlap the trainer's kernels; the caller orders them (it waits for the data
    // before calling, and the call returns after the collective has finished).
    if (cudaError_t e = ::cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); e != cudaSuccess) {
      return Unavailable(CudaError("nccl: cudaStreamCreate", e));
    }
    if (cudaError_t e = ::cudaEventCreateWithFlags(&done_, cudaEventDisableTiming); e != cudaSuccess) {
      return Unavailable(CudaError("nccl: cudaEventCreate", e));
    }
    ncclUniqueId id;
    if (rank_ == 0) {
      if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) return NcclStatus("ncclGetUniqueId", r);
      RETURN_IF_ERROR(store.Set(kIdKey, std::string(id.internal, sizeof id.internal)));
    } else {
      auto got = store.Get(kIdKey, timeout_);
      if (!got.ok()) {
        return Status(got.status().code(), "nccl: rank 0 did not publish its NCCL id: " + got.status().message());
      }
      if (got->size() != sizeof id.internal) return Internal("nccl: the NCCL id on the store has the wrong size");
      std::memcpy(id.internal, got->data(), sizeof id.internal);
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
    if (r != ncclSuccess && r != ncclInProgress) return NcclStatus("ncclCommInitRank", r);
    return AwaitEnqueued("connect", Clock::now() + timeout_);
  }

  Status AllReduceSum(float* data, size_t count) override {
    if (count == 0) return Status::Ok();
    return Collective("allreduce", data, count * sizeof(float),
                      [&](void* buf) { return ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm_, stream_); });
  }

  Status Broadcast(void* data, size_t bytes, int root) override {
    if (bytes == 0) return Status::Ok();
    RETURN_IF_ERROR(CheckGroup("nccl broadcast", root, size_));
    return Collective("broadcast", data, bytes,
                      [&](void* buf) { return ncclBroadcast(buf, buf, bytes, ncclUint8, root, comm_, stream_); });
  }

  Status Barrier() override {
    float one = 1;
    return AllReduceSum(&one, 1);
  }

  Result<std::unique_ptr<DeviceAllReduce>> MakeDeviceAllReduce() override;

 private:
  Status NcclStatus(const char* what, ncclResult_t r) {
    const char* last = comm_ ? ncclGetLastError(comm_) : nullptr;
    std::string detail = last && *last ? std::string(" (") + last + ")" : "";
    // Remote and system errors are what a lost peer looks like.
    Code code = r == ncclRemoteError || r == ncclSystemError ? Code::kUnavailable : Code::kInternal;
    return Status(code, std::string("nccl: ") + what + ": " + ncclGetErrorString(r) + detail);
  }

  // Breaks the communicator: NCCL's kernels are stopped, and every later call fails.
  Status Break(Status st) {
    if (!broken_ && comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    broken_ = true;
    error_ = st;
    return st;
  }

  // Non-blocking NCCL calls may return before they are enqueued; waits until they are.
  Status AwaitEnqueued(const char* what, Clock::time_point deadline) {
    while (true) {
      ncclResult_t state = ncclSuccess;
      if (ncclResult_t r = ncclCommGetAsyncError(comm_, &state); r != ncclSuccess) {
        return Break(NcclStatus(what, r));
      }
      if (state == ncclSuccess) return Status::Ok();
      if (state != ncclInProgress) return Break(NcclStatus(what, state));
      if (Clock::now() >= deadline) return Break(TimedOut(what));
      std::this_thread::yield();
    }
  }

  Status TimedOut(const char* what) {
    return Timeout("nccl " + std::string(what) + " did not complete within " + FormatDuration(timeout_) + " on rank " +
                   std::to_string(rank_) + " of " + std::to_string(size_));
  }

  template <typename Enqueue>
  Status Collective(const char* what, void* data, size_t bytes, Enqueue enqueue) {
    std::unique_lock<std::mutex> lock(mu_);
    if (broken_) return error_;
    const Clock::time_point deadline = Clock::now() + timeout_;
    // The calling thread may not be the one that connected (the reducer's thread).
    RETURN_IF_ERROR(Check(::cudaSetDevice(device_), "nccl"));
    cudaPointerAttributes attr{};
    const bool on_host = ::cudaPointerGetAttributes(&attr, data) != cudaSuccess ||
                         (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged);
    ::cudaGetLastError();  // clear what cudaPointerGetAttributes may have set for a host pointer
    void* buf = data;
    if (on_host) {
      RETURN_IF_ERROR(EnsureStaging(bytes));
      buf = staging_;
      RETURN_IF_ERROR(
          Check(::cudaMemcpyAsync(buf, data, bytes, cudaMemcpyHostToDevice, stream_), "nccl: copy to the GPU"));
    }
    ncclResult_t r = enqueue(buf);
    if (r != ncclSuccess && r != ncclInProgress) return Break(NcclStatus(what, r));
    RETURN_IF_ERROR(AwaitEnqueued(what, deadline));
    if (on_host) {
      RETURN_IF_ERROR(
          Check(::cudaMemcpyAsync(data, buf, bytes, cudaMemcpyDeviceToHost, stream_), "nccl: copy from the GPU"));
    }
    RETURN_IF_ERROR(Check(::cudaEventRecord(done_, stream_), "nccl: cudaEventRecord"));
    // A step's collectives take microseconds to milliseconds: spin briefly, then back off.
    Status st = AwaitEvent(done_, what, deadline, lock, /*spin=*/true, nullptr);
    return st.ok() || broken_ ? st : Break(st);
  }

  // Waits until `event` (recorded on stream_ after a collective) has happened, with `lock` (on
  // mu_) released while polling; looks at NCCL's error state now and then, since a peer's failure
  // may show there before the deadline. Returns the failure, or a timeout at `deadline`, for the
  // caller to Break() with; gives up quietly when `*stop` becomes true.
  Status AwaitEvent(cudaEvent_t event, const char* what, Clock::time_point deadline, std::unique_lock<std::mutex>& lock,
                    bool spin, const std::atomic<bool>* stop) {
    for (int polls = 0;; ++polls) {
      if (broken_) return error_;
      lock.unlock();
      cudaError_t e = ::cudaEventQuery(event);
      lock.lock();
      if (e == cudaSuccess) return Status::Ok();
      if (broken_) return error_;
      if (e != cudaErrorNotReady) return Unavailable(CudaError("nccl: waiting for the collective", e));
      if (stop && stop->load()) return Status::Ok();
      if (polls % 1024 == 1023) {
        ncclResult_t state = ncclSuccess;
        ncclCommGetAsyncError(comm_, &state);
        if (state != ncclSuccess && state != ncclInProgress) return NcclStatus(what, state);
        if (Clock::now() >= deadline) return TimedOut(what);
      }
      lock.unlock();
      if (spin && polls < 4096) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(spin ? 50 : 100));
      }
      lock.lock();
    }
  }

  // A CUDA call's result: a failure breaks the communicator. Under mu_.
  Status Check(cudaError_t e, const char* what) {
    return e == cudaSuccess ? Status::Ok() : Break(Unavailable(CudaError(what, e)));
  }

  // Makes `later` wait for the work queued so far on `earlier`, through `event`. Under mu_.
  Status Order(cudaStream_t earlier, cudaStream_t later, cudaEvent_t event) {
    RETURN_IF_ERROR(Check(::cudaSetDevice(device_), "nccl"));
    RETURN_IF_ERROR(Check(::cudaEventRecord(event, earlier), "nccl: cudaEventRecord"));
    return Check(::cudaStreamWaitEvent(later, event, 0), "nccl: cudaStreamWaitEvent");
  }

  // DeviceAllReduce's calls, under mu_.
  Status EnqueueSum(float* data, size_t count, cudaStream_t after, cudaEvent_t ready) {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_) return error_;
    if (count == 0) return Status::Ok();
    RETURN_IF_ERROR(Order(after, stream_, ready));
    ncclResult_t r = ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm_, stream_);
    if (r != ncclSuccess && r != ncclInProgress) return Break(NcclStatus("allreduce", r));
    return AwaitEnqueued("allreduce", Clock::now() + timeout_);
  }

  Status RecordJoin(cudaEvent_t joined, cudaStream_t waiter) {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_) return error_;
    return Order(stream_, waiter, joined);
  }

  Status EnsureStaging(size_t bytes) {
    if (bytes <= staging_bytes_) return Status::Ok();
    if (staging_) ::cudaFree(staging_);
    staging_ = nullptr;
    staging_bytes_ = 0;
    RETURN_IF_ERROR(Check(::cudaMalloc(&staging_, bytes), "nccl: staging buffer"));
    staging_bytes_ = bytes;
    return Status::Ok();
  }

  int rank_, size_, device_;
  Duration timeout_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  void* staging_ = nullptr;
  size_t staging_bytes_ = 0;
  bool broken_ = false;
  Status error_;
  // Taken by every call, and by the DeviceAllReduce's watchdog, which may abort the communicator
  // from its thread.
  std::mutex mu_;
};

class NcclDeviceAllReduce : public DeviceAllReduce {
 public:
  explicit NcclDeviceAllReduce(NcclCommunicator& comm) : comm_(comm) {}
  ~NcclDeviceAllReduce() override {
    {
      // Under mu_, so that the watchdog cannot miss it between its check and its wait.
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    // Events with work still pending are released once it completes.
    if (ready_) ::cudaEventDestroy(ready_);
    if (joined_) ::cudaEventDestroy(joined_);
  }

  Status Init() {
    for (cudaEvent_t* e : {&ready_, &joined_}) {
      if (cudaError_t err = ::cudaEventCreateWithFlags(e, cudaEventDisableTiming); err != cudaSuccess) {
        return Unavailable(CudaError("nccl: cudaEventCreate", err));
      }
    }
    watchdog_ = std::thread([this] { Watch(); });
    return Status::Ok();
  }

  Status Enqueue(float* data, size_t count, void* stream) override {
    return comm_.EnqueueSum(data, count, static_cast<cudaStream_t>(stream), ready_);
  }

  Status Join(void* stream) override {
    {
      // The watchdog clears this by the previous Join's deadline at the latest.
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !outstanding_ || !failed_.ok(); });
      if (!failed_.ok()) return failed_;
    }
    RETURN_IF_ERROR(comm_.RecordJoin(joined_, static_cast<cudaStream_t>(stream)));
    {
      std::lock_guard<std::mutex> lock(mu_);
      outstanding_ = true;
      joined_at_ = Clock::now();
    }
    cv_.notify_all();
    return Status::Ok();
  }

 private:
  void Watch() {
    ::cudaSetDevice(comm_.device_);
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stopping_ || outstanding_; });
      if (stopping_) return;
      const Clock::time_point deadline = joined_at_ + comm_.timeout_;
      lock.unlock();
      {
        std::unique_lock<std::mutex> comm_lock(comm_.mu_);
        Status st = comm_.AwaitEvent(joined_, "allreduce", deadline, comm_lock, /*spin=*/false, &stopping_);
        if (!st.ok() && !comm_.broken_) {
          // Join() reports it now: aborting may take until the stream gets past what it waits for.
          {
            std::lock_guard<std::mutex> l(mu_);
            failed_ = st;
          }
          cv_.notify_all();
          comm_.Break(st);  // every later call returns it
        }
      }
      lock.lock();
      outstanding_ = false;
      cv_.notify_all();
    }
  }

  NcclCommunicator& comm_;
  cudaEvent_t ready_ = nullptr;   // recorded on the caller's stream before each sum
  cudaEvent_t joined_ = nullptr;  // recorded on the communicator's stream at each Join
  std::mutex mu_;
  std::condition_variable cv_;
  bool outstanding_ = false;           // joined_ not yet seen complete by the watchdog
  Status failed_;                      // the watchdog's verdict, once it gave up
  std::atomic<bool> stopping_{false};  // set under mu_; read without it while polling
  Clock::time_point joined_at_;
  std::thread watchdog_;
};

Result<std::unique_ptr<DeviceAllReduce>> NcclCommunicator::MakeDeviceAllReduce() {
  auto sum = std::make_unique<NcclDeviceAllReduce>(*this);
  RETURN_IF_ERROR(sum->Init());
  return std::unique_ptr<DeviceAllReduce>(std::move(sum));
}

}  // namespace

bool NcclAvailable() { return true; }

Result<std::unique_ptr<Communicator>> ConnectNccl(Store& store, const NcclOptions& options) {
  RETURN_IF_ERROR(CheckGroup("nccl", options.rank, options.size));
  auto comm = std::make_unique<NcclCommunicator>(options);
  RETURN_IF_ERROR(comm->Init(store));
  return std::unique_ptr<Communicator>(std::move(comm));
}

}  // namespace trainctl::comm
