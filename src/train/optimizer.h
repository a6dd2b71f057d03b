// SGD (momentum, Nesterov, weight decay) and Adam over flat parameter and gradient buffers, with
// PyTorch's update rules (torch.optim.SGD / torch.optim.Adam with one parameter group), so results
// match the same model trained with PyTorch. The state is a few named flat tensors that the
// checkpoint stores and restores.
#pragma once

#include <torch/types.h>

#include <string>
#include <utility>
#include <vector>

#include "jobspec/job_spec.h"

namespace trainctl::train {

class Optimizer {
 public:
  // `params` and `grads` are flat float tensors of the same size (GradientReducer's buffers).
  Optimizer(const OptimizerSpec& spec, torch::Tensor params, torch::Tensor grads);

  void Step(double lr);

  // Named state tensors (views of the optimizer's own buffers) and the step count.
  std::vector<std::pair<std::string, torch::Tensor>> State();
  int64_t steps() const { return steps_; }
  void set_steps(int64_t steps) { steps_ = steps; }

 private:
  OptimizerSpec spec_;
  torch::Tensor params_, grads_;
  torch::Tensor buf1_, buf2_;  // sgd: momentum; adam: exp_avg, exp_avg_sq
  torch::Tensor scratch_;
  int64_t steps_ = 0;
};

}  // namespace trainctl::train
