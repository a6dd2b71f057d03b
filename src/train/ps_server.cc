#include "train/ps_server.h"

#include <ATen/Parallel.h>

#include <cstring>

#include "comm/ps/ps.h"
#include "common/address.h"
#include "common/exit_codes.h"
#include "common/log.h"
#include "common/subprocess.h"
#include "train/optimizer.h"
#include "train/schedule.h"

namespace trainctl::train {
namespace {

// The trainer's own optimizer (the allreduce strategy's update rules) over one shard.
class TorchShardOptimizer : public comm::ps::ShardOptimizer {
 public:
  TorchShardOptimizer(const TrainerSpec& t, int64_t count, int64_t total_steps, int workers)
      : t_(t), total_steps_(total_steps), workers_(workers), params_(torch::zeros({count})),
        grads_(torch::zeros({count})), opt_(t.optimizer, params_, grads_) {}
  float* params() override { return params_.data_ptr<float>(); }
  std::vector<std::pair<std::string, float*>> state() override {
    std::vector<std::pair<std::string, float*>> out;
    for (auto& [name, t] : opt_.State()) out.emplace_back(name, t.data_ptr<float>());
    return out;
  }
  int64_t steps() const override { return opt_.steps(); }
  void set_steps(int64_t steps) override { opt_.set_steps(steps); }
  void Apply(const float* grad, int64_t step) override {
    std::memcpy(grads_.data_ptr<float>(), grad, grads_.numel() * sizeof(float));
    opt_.Step(LearningRate(t_.optimizer, t_.schedule, step, total_steps_, workers_));
  }

 private:
  const TrainerSpec& t_;
  int64_t total_steps_;
  int workers_;
  torch::Tensor params_, grads_;
  Optimizer opt_;
};

}  // namespace

int RunParameterServer(const JobSpec& spec, const TaskEnv& env) {
  const TrainerSpec& t = spec.trainer;
  std::string host;
  uint16_t port = 0;
  if (Status st = ParseHostPort(env.task_addr, &host, &port); !st.ok()) {
    LOG_ERROR("a parameter server needs its own address (TRAINCTL_TASK_ADDR): {}", st.message());
    return kExitError;
  }
  at::set_num_threads(t.threads > 0 ? t.threads : 1);
  BlockSupervisorSignals();  // before the server's threads: they inherit it, this one waits
  comm::ps::ServerOptions o;
  o.host = host;
  o.port = port;
  o.token = env.store_token;
  o.workers = TrainingWorkers(spec);
  o.async = t.parameter_server.mode == "async";
  o.max_staleness = t.parameter_server.max_staleness;
  o.timeout = spec.timeouts.collective;
  o.make_optimizer = [&t, workers = o.workers](int64_t count, int64_t total_steps) {
    return std::make_unique<TorchShardOptimizer>(t, count, total_steps, workers);
  };
  auto server = comm::ps::Server::Start(o);
  if (!server.ok()) {
    LOG_ERROR("{}", server.status().message());
    return kExitError;
  }
  LOG_INFO("parameter server {} of {} ({}) serving {} worker(s) on {}", env.role_rank,
           env.role_world_size, o.async ? "async" : "sync", o.workers, env.task_addr);
  while (!StopSignal()) WaitSignal(std::chrono::seconds(1));
  const int64_t dropped = (*server)->dropped();
  (*server)->Stop();
  if (dropped > 0) LOG_INFO("{} stale gradient push(es) dropped (max_staleness: {})", dropped, o.max_staleness);
  return kExitOk;
}

}  // namespace trainctl::train
