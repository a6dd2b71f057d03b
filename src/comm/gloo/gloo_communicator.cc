// Gloo backend: a full mesh of TCP pairs set up through the job's Store, ring allreduce.
#include <dlfcn.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <atomic>
#include <cstring>
#include <exception>

#include "comm/communicator.h"

namespace trainctl::comm {
namespace {

using Millis = std::chrono::milliseconds;

// Gloo reports store errors as exceptions; this adapter throws what it cannot do.
class StoreAdapter : public gloo::rendezvous::Store {
 public:
  StoreAdapter(trainctl::Store& store, Duration timeout) : store_(store), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Status st = store_.Set(key, std::string(data.begin(), data.end()));
    if (!st.ok()) throw std::runtime_error("store set " + key + ": " + st.ToString());
  }
  std::vector<char> get(const std::string& key) override {
    auto got = store_.Get(key, timeout_);
    if (!got.ok()) throw std::runtime_error(Missing(key, got.status()));
    return std::vector<char>(got->begin(), got->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const Millis& timeout) override {
    Status st = store_.Wait(keys, std::chrono::duration_cast<Duration>(timeout));
    if (!st.ok()) throw std::runtime_error(Missing(keys.empty() ? "" : keys[0], st));
  }

 private:
  // Gloo's keys are the peers' ranks: say which rank did not show up.
  static std::string Missing(const std::string& key, const Status& st) {
    return "rank " + key + " did not publish its address: " + st.ToString();
  }
  trainctl::Store& store_;
  Duration timeout_;
};

// Gloo's exception messages carry source locations first; keep what follows them.
std::string Describe(const std::exception& e) {
  std::string what = e.what();
  size_t bracket = what.find("] ");
  if (what.rfind('[', 0) == 0 && bracket != std::string::npos) what = what.substr(bracket + 2);
  return what;
}

class GlooCommunicator : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<gloo::Context> context, Duration timeout)
      : context_(std::move(context)), timeout_(std::chrono::duration_cast<Millis>(timeout)) {}

  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }

  Status AllReduceSum(float* data, size_t count) override {
    if (count == 0 || size() == 1) return Status::Ok();
    return Run("allreduce", [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(data, count);
      opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      opts.setTag(tag_++);
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
    });
  }

  Status Broadcast(void* data, size_t bytes, int root) override {
    if (bytes == 0 || size() == 1) return Status::Ok();
    return Run("broadcast", [&] {
      gloo::BroadcastOptions opts(context_);
      auto* p = static_cast<uint8_t*>(data);
      if (rank() == root) opts.setInput(p, bytes);
      opts.setOutput(p, bytes);
      opts.setRoot(root);
      opts.setTag(tag_++);
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
  }

  Status Barrier() override {
    if (size() == 1) return Status::Ok();
    return Run("barrier", [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTag(tag_++);
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

 private:
  template <typename F>
  Status Run(const char* what, F&& f) {
    if (!broken_.empty()) return Unavailable("communicator is broken: " + broken_);
    try {
      f();
      return Status::Ok();
    } catch (const std::exception& e) {
      broken_ = std::string(what) + " failed on rank " + std::to_string(rank()) + ": " + Describe(e);
      bool timeout = broken_.find("imed out") != std::string::npos || broken_.find("imeout") != std::string::npos;
      return timeout ? Timeout(broken_) : Unavailable(broken_);
    }
  }

  std::shared_ptr<gloo::Context> context_;
  Millis timeout_;
  uint32_t tag_ = 0;
  std::string broken_;
};

// A pip-installed LibTorch exports its own, newer Gloo under the same names; if its definitions
// are the ones this process bound, they do not match the headers this file was compiled with, and
// the first collective would crash. Say so instead.
Status CheckGlooIsTheOneCompiledFor() {
  Dl_info info{};
  auto allreduce = static_cast<void (*)(const gloo::AllreduceOptions&)>(&gloo::allreduce);
  if (::dladdr(reinterpret_cast<void*>(allreduce), &info) == 0 || info.dli_fname == nullptr) {
    return Status::Ok();
  }
  const std::string lib = info.dli_fname;
  if (lib.find("libtorch") == std::string::npos) return Status::Ok();
  return InvalidArgument("gloo: this trainctl's LibTorch (" + lib +
                         ") carries its own Gloo, "
                         "which replaces the one trainctl was built with; use trainer.backend: "
                         "shm (one node) or nccl (GPUs), or a trainctl built against Debian's "
                         "LibTorch for CPU jobs across nodes");
}

}  // namespace

Result<std::unique_ptr<Communicator>> ConnectGloo(Store& store, const GlooOptions& o) {
  RETURN_IF_ERROR(CheckGroup("gloo", o.rank, o.size));
  RETURN_IF_ERROR(CheckGlooIsTheOneCompiledFor());
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = o.host;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(o.rank, o.size);
    context->setTimeout(std::chrono::duration_cast<Millis>(o.timeout));
    StoreAdapter adapter(store, o.timeout);
    context->connectFullMesh(adapter, device);
    return std::unique_ptr<Communicator>(new GlooCommunicator(context, o.timeout));
  } catch (const std::exception& e) {
    return Unavailable("gloo: rank " + std::to_string(o.rank) + " of " + std::to_string(o.size) +
                       " could not connect to its peers: " + Describe(e));
  }
}

}  // namespace trainctl::comm
