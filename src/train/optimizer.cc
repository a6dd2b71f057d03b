#include "train/optimizer.h"

#include <cmath>

namespace trainctl::train {

Optimizer::Optimizer(const OptimizerSpec& spec, torch::Tensor params, torch::Tensor grads)
    : spec_(spec), params_(std::move(params)), grads_(std::move(grads)) {
  buf1_ = torch::zeros_like(params_);
  if (spec_.name == "adam") buf2_ = torch::zeros_like(params_);
  scratch_ = torch::empty_like(params_);
}

void Optimizer::Step(double lr) {
  torch::NoGradGuard no_grad;
  torch::Tensor g = grads_;
  if (spec_.weight_decay != 0) {
    g = torch::add_out(scratch_, grads_, params_, spec_.weight_decay);
  }
  if (spec_.name == "adam") {
    ++steps_;
    buf1_.mul_(spec_.beta1).add_(g, 1 - spec_.beta1);
    buf2_.mul_(spec_.beta2).addcmul_(g, g, 1 - spec_.beta2);
    double correction1 = 1 - std::pow(spec_.beta1, double(steps_));
    double correction2 = 1 - std::pow(spec_.beta2, double(steps_));
    torch::Tensor denom = torch::sqrt_out(scratch_, buf2_).div_(std::sqrt(correction2)).add_(spec_.eps);
    params_.addcdiv_(buf1_, denom, -lr / correction1);
    return;
  }
  if (spec_.momentum != 0) {
    if (steps_ == 0) buf1_.copy_(g); else buf1_.mul_(spec_.momentum).add_(g);
    if (spec_.nesterov) {
      g = g.data_ptr() == scratch_.data_ptr() ? g.add_(buf1_, spec_.momentum)
                                              : torch::add_out(scratch_, g, buf1_, spec_.momentum);
    } else {
      g = buf1_;
    }
  }
  ++steps_;
  params_.add_(g, -lr);
}

std::vector<std::pair<std::string, torch::Tensor>> Optimizer::State() {
  if (spec_.name == "adam") return {{"exp_avg", buf1_}, {"exp_avg_sq", buf2_}};
  if (spec_.momentum != 0) return {{"momentum_buffer", buf1_}};
  return {};
}

}  // namespace trainctl::train
