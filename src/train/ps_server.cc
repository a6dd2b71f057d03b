#include "train/ps_server.h"

#include <ATen/Parallel.h>

#include <cstring>

#include "comm/ps/ps.h"
#include "common/address.h"
#include "common/cpus.h"
#include "common/exit_codes.h"
#include "common/log.h"
#include "common/subprocess.h"
#include "train/optimizer.h"
#include "train/schedule.h"

namespace trainctl::train {
namespace {

constexpr int64_t kBlock = 4096;

// out[i] = (g[0][i] + ... + g[n-1][i]) / d for i in [begin, end): added in worker order and
// divided, the shared-memory allreduce's arithmetic, so sync is its update bit for bit. Whole
// blocks have a constant length and no pointer aliases another, so the compiler vectorizes them.
void AverageBlock(const float* const* g, int n, float d, int64_t begin, int64_t end, float* __restrict out) {
  if (end - begin != kBlock) {
    for (int64_t i = begin; i < end; ++i) {
      float sum = g[0][i];
      for (int k = 1; k < n; ++k) sum += g[k][i];
      out[i] = sum / d;
    }
    return;
  }
  float* __restrict o = out + begin;
  const float* __restrict first = g[0] + begin;
  for (int64_t i = 0; i < kBlock; ++i) o[i] = first[i];
  for (int k = 1; k < n; ++k) {
    const float* __restrict next = g[k] + begin;
    for (int64_t i = 0; i < kBlock; ++i) o[i] += next[i];
  }
  for (int64_t i = 0; i < kBlock; ++i) o[i] /= d;
}

// The trainer's own optimizer (the allreduce strategy's update rules) over one shard.
class TorchShardOptimizer : public comm::ps::ShardOptimizer {
 public:
  TorchShardOptimizer(const TrainerSpec& t, int64_t count, int64_t total_steps, int workers)
      : t_(t),
        total_steps_(total_steps),
        workers_(workers),
        params_(torch::zeros({count})),
        grads_(torch::zeros({count})),
        opt_(t.optimizer, params_, grads_) {}
  float* params() override { return params_.data_ptr<float>(); }
  std::vector<std::pair<std::string, float*>> state() override {
    std::vector<std::pair<std::string, float*>> out;
    for (auto& [name, t] : opt_.State()) out.emplace_back(name, t.data_ptr<float>());
    return out;
  }
  int64_t steps() const override { return opt_.steps(); }
  void set_steps(int64_t steps) override { opt_.set_steps(steps); }
  void Apply(const float* const* grads, int n, int divisor, int64_t step) override {
    float* out = grads_.data_ptr<float>();
    const float d = static_cast<float>(divisor);
    // The workers wait for this (sync): the shard's threads share it.
    at::parallel_for(0, grads_.numel(), kBlock, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; b += kBlock) AverageBlock(grads, n, d, b, std::min(end, b + kBlock), out);
    });
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
  // In a sync step the workers wait while a shard averages and applies: its threads take the
  // cores the workers leave, shared among the node's parameter servers.
  const int shards_here = std::max(1, env.role_world_size / std::max(1, env.group_world_size));
  at::set_num_threads(t.threads > 0 ? t.threads : std::max(1, UsableCpus() / shards_here));
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
  LOG_INFO("parameter server {} of {} ({}) serving {} worker(s) on {}", env.role_rank, env.role_world_size,
           o.async ? "async" : "sync", o.workers, env.task_addr);
  while (!StopSignal()) WaitSignal(std::chrono::seconds(1));
  const int64_t dropped = (*server)->dropped();
  (*server)->Stop();
  if (dropped > 0) LOG_INFO("{} stale gradient push(es) dropped (max_staleness: {})", dropped, o.max_staleness);
  return kExitOk;
}

}  // namespace trainctl::train
