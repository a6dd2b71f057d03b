#include "train/optimizer.h"

#include <cmath>

#include "common/cpus.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace trainctl::train {
namespace {

#if defined(__x86_64__)
// torch.optim.SGD's update in one pass over the flat buffers instead of five ATen operations
// (each reading and writing all of them), rounded as those operations round: ATen's vectorized
// add with a factor, a + f * b, is one fused multiply-add; the momentum's mul_ then add_ are two
// roundings. (This file is compiled with -ffp-contract=off, so that the compiler fuses nothing
// else.) `first`: the momentum buffer starts as the first step's gradient.
__attribute__((target("avx2,fma"))) void SgdStep(float* p, const float* g, float* buf, int64_t n, float lr, float wd,
                                                 float m, bool nesterov, bool first) {
  const __m256 vwd = _mm256_set1_ps(wd), vm = _mm256_set1_ps(m), vlr = _mm256_set1_ps(-lr);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 vp = _mm256_loadu_ps(p + i);
    __m256 d = _mm256_loadu_ps(g + i);
    if (wd != 0) d = _mm256_fmadd_ps(vp, vwd, d);
    if (m != 0) {
      const __m256 b = first ? d : _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(buf + i), vm), d);
      _mm256_storeu_ps(buf + i, b);
      d = nesterov ? _mm256_fmadd_ps(b, vm, d) : b;
    }
    _mm256_storeu_ps(p + i, _mm256_fmadd_ps(d, vlr, vp));
  }
  for (; i < n; ++i) {
    float d = g[i];
    if (wd != 0) d = std::fma(p[i], wd, d);
    if (m != 0) {
      const float b = first ? d : buf[i] * m + d;
      buf[i] = b;
      d = nesterov ? std::fma(b, m, d) : b;
    }
    p[i] = std::fma(d, -lr, p[i]);
  }
}
#endif

bool FlatCpuFloats(const torch::Tensor& t) {
  return t.device().is_cpu() && t.scalar_type() == torch::kFloat && t.is_contiguous();
}

}  // namespace

Optimizer::Optimizer(const OptimizerSpec& spec, torch::Tensor params, torch::Tensor grads)
    : spec_(spec), params_(std::move(params)), grads_(std::move(grads)) {
  buf1_ = torch::zeros_like(params_);
  if (spec_.name == "adam") buf2_ = torch::zeros_like(params_);
  scratch_ = torch::empty_like(params_);
}

void Optimizer::Step(double lr) {
  torch::NoGradGuard no_grad;
#if defined(__x86_64__)
  static const bool avx2_fma = CpuHasAvx2Fma();
  if (spec_.name != "adam" && avx2_fma && FlatCpuFloats(params_) && FlatCpuFloats(grads_) && FlatCpuFloats(buf1_)) {
    SgdStep(params_.data_ptr<float>(), grads_.data_ptr<float>(), buf1_.data_ptr<float>(), params_.numel(),
            static_cast<float>(lr), static_cast<float>(spec_.weight_decay), static_cast<float>(spec_.momentum),
            spec_.nesterov, steps_ == 0);
    ++steps_;
    return;
  }
#endif
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
    if (steps_ == 0)
      buf1_.copy_(g);
    else
      buf1_.mul_(spec_.momentum).add_(g);
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
