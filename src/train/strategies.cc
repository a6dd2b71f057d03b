// The two step strategies (trainer.h): allreduce, and parameter servers.
#include <torch/cuda.h>

#include <algorithm>
#include <thread>

#include "common/log.h"
#include "train/trainer.h"

namespace trainctl::train {
namespace {

// Every rank averages the gradients with the others (the reducer) and applies the optimizer to
// its own copy of the parameters, which stay bit-identical across ranks.
class Allreduce : public StepStrategy {
 public:
  // Rank 0 reads the newest valid checkpoint and broadcasts it, so ranks on hosts without the
  // shared checkpoint directory resume too.
  Status Resume(TrainState& s, StateSource& saved) override {
    ResumePoint p;
    std::vector<std::pair<std::string, torch::Tensor>> opt_state = s.optimizer->State();
    int64_t opt_steps = 0;
    if (s.rank == 0) RETURN_IF_ERROR(saved.LoadNewest(&p, &opt_steps));
    RETURN_IF_ERROR(s.comm->Broadcast(&p, sizeof p, 0));
    RETURN_IF_ERROR(s.reducer->BroadcastParameters());
    RETURN_IF_ERROR(s.SyncBuffers());
    if (!p.found) return Status::Ok();
    RETURN_IF_ERROR(s.comm->Broadcast(&opt_steps, sizeof opt_steps, 0));
    for (auto& [name, t] : opt_state) {
      RETURN_IF_ERROR(s.comm->Broadcast(t.data_ptr(), t.numel() * t.element_size(), 0));
    }
    s.optimizer->set_steps(opt_steps);
    s.MoveTo(p);
    return Status::Ok();
  }
  Status Apply(TrainState& s, double lr) override {
    s.optimizer->Step(lr);
    return Status::Ok();
  }
  const char* ApplyPhase() const override { return "optimizer"; }
  double TakeWaitSeconds(TrainState& s) override { return s.reducer->TakeWaitSeconds(); }
  const char* WaitName() const override { return "gradient allreduce"; }
  bool Collective() const override { return true; }
};

float* HostFloats(const torch::Tensor& device_or_host, const torch::Tensor& staging) {
  return (staging.defined() ? staging : device_or_host).data_ptr<float>();
}

// Each worker pushes its gradients to the shards, which apply the optimizer, and pulls the
// parameters back; the shards hold the training state between steps.
class ParameterServers : public StepStrategy {
 public:
  explicit ParameterServers(comm::ps::Client* ps) : ps_(ps) {}

  Status Setup(TrainState& s) override {
    if (s.device.is_cuda()) {  // a GPU's parameters and gradients, staged in host memory
      host_params_ = torch::empty_like(s.reducer->flat_params(), torch::TensorOptions().device(torch::kCPU));
      host_grads_ = torch::empty_like(host_params_);
    }
    return Status::Ok();
  }

  // Rank 0 gives the shards their parameters and optimizer state (the seeded model's, or the
  // newest checkpoint's) unless they already hold them (rank 0 alone was replaced); every worker
  // then pulls them and goes on from its own step (a replaced async worker) or the shards'
  // starting step.
  Status Resume(TrainState& s, StateSource& saved) override {
    torch::Tensor params = s.reducer->flat_params();
    const int64_t count = params.numel();
    if (s.rank == 0 && !ps_->initialized()) {
      ResumePoint p;
      int64_t opt_steps = 0;
      RETURN_IF_ERROR(saved.LoadNewest(&p, &opt_steps));
      if (host_params_.defined()) host_params_.copy_(params);
      std::vector<std::pair<std::string, torch::Tensor>> opt = s.optimizer->State();
      std::vector<torch::Tensor> host;
      std::vector<std::pair<std::string, const float*>> state;
      for (auto& [name, t] : opt) {
        host.push_back(t.cpu().contiguous());
        state.emplace_back(name, host.back().data_ptr<float>());
      }
      RETURN_IF_ERROR(
          ps_->Init(HostFloats(params, host_params_), count, state, opt_steps, p.found ? p.step : 0, s.total_steps));
    } else {
      RETURN_IF_ERROR(ps_->WaitInitialized());
    }
    ASSIGN_OR_RETURN(version_, ps_->Pull(HostFloats(params, host_params_), count));
    if (host_params_.defined()) params.copy_(host_params_);
    s.step = ps_->steps_done() > 0 ? ps_->steps_done() : ps_->init_step();
    s.epoch = s.step / s.steps_per_epoch;
    s.batch_in_epoch = s.step % s.steps_per_epoch;
    if (s.step > 0) {
      LOG_INFO("going on from step {} (epoch {}) with the parameter servers' state", s.step, s.epoch + 1);
    }
    return Status::Ok();
  }

  // Pushes this worker's gradients, takes the parameters back.
  Status Apply(TrainState& s, double) override {
    torch::Tensor params = s.reducer->flat_params(), grads = s.reducer->flat_grads();
    if (host_grads_.defined()) host_grads_.copy_(grads);
    const auto start = Clock::now();
    auto pushed = ps_->PushPull(HostFloats(grads, host_grads_), HostFloats(params, host_params_), params.numel(),
                                version_, s.step + 1);
    wait_seconds_ += SecondsSince(start);
    if (!pushed.ok()) return pushed.status();
    version_ = *pushed;
    if (host_params_.defined()) params.copy_(host_params_);
    return Status::Ok();
  }
  const char* ApplyPhase() const override { return "push and pull"; }

  // The shards' parameters and optimizer state, into this worker's.
  Status BeforeSave(TrainState& s) override {
    torch::Tensor params = s.reducer->flat_params();
    ASSIGN_OR_RETURN(comm::ps::ShardState st, ps_->FetchState(params.numel()));
    torch::NoGradGuard no_grad;
    params.copy_(torch::from_blob(st.params.data(), {params.numel()}));
    for (auto& [name, t] : s.optimizer->State()) {
      auto it = std::find_if(st.state.begin(), st.state.end(), [&](const auto& e) { return e.first == name; });
      if (it == st.state.end()) return Internal("the parameter servers hold no optimizer state " + name);
      t.copy_(torch::from_blob(it->second.data(), {t.numel()}));
    }
    s.optimizer->set_steps(st.optimizer_steps);
    return Status::Ok();
  }

  // Every worker says it is done; rank 0 waits for all of them (async workers end at their own
  // pace) before it saves the final state.
  Status Finish(TrainState& s) override {
    ASSIGN_OR_RETURN(int64_t done, ps_->Done());
    if (s.rank != 0) return Status::Ok();
    auto said = Clock::now();
    while (done < s.world) {
      if (Clock::now() - said > std::chrono::seconds(30)) {
        LOG_INFO("waiting for {} of {} workers to finish their steps", s.world - done, s.world);
        said = Clock::now();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      ASSIGN_OR_RETURN(done, ps_->DoneCount());
    }
    return Status::Ok();
  }

  double TakeWaitSeconds(TrainState&) override { return std::exchange(wait_seconds_, 0.0); }
  const char* WaitName() const override { return "parameter servers"; }
  // The workers share no collective (async ones are not even in step): rank 0 evaluates alone,
  // and the shards hold what snapshots would.
  bool Collective() const override { return false; }

 private:
  comm::ps::Client* ps_;
  int64_t version_ = 0;                     // the shards' version of this worker's parameters
  double wait_seconds_ = 0;                 // in PushPull since the last TakeWaitSeconds
  torch::Tensor host_params_, host_grads_;  // a GPU's parameters and gradients, staged
};

}  // namespace

std::unique_ptr<StepStrategy> AllreduceStrategy() { return std::make_unique<Allreduce>(); }
std::unique_ptr<StepStrategy> ParameterServerStrategy(comm::ps::Client* ps) {
  return std::make_unique<ParameterServers>(ps);
}

}  // namespace trainctl::train
