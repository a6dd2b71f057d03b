// Batch norm in training and the ReLU after it, on float CPU activations (kernels/ops.h): one pass
// for the statistics and one for the output forward, one for the gradient's two sums and one for
// the input's gradient backward. The activation is channels-last (N x H x W x C in memory) in
// every pass: a row is one position's C channels, and with C a multiple of 8 the AVX2 loops take
// 8 channels of a row at a time (the AVX-512 ones 16, with C a multiple of 16: the same loops,
// kernels/batchnorm_simd.inc). Sums are in
// double, over fixed runs of rows added in order (the vector loops add 8 rows in f32 first), so
// that the result does not depend on the number of threads.
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/cpus.h"
#include "kernels/ops.h"
#include "kernels/simd.h"

namespace trainctl::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

constexpr int64_t kRun = 512;  // rows per partial sum

// Two sums per channel (2 x c doubles) over `rows` rows: fn(first, end, partial) adds a run's
// into partial; the runs among LibTorch's threads, their sums then added in order.
template <typename Fn>
std::vector<double> SumRows(int64_t rows, int64_t c, const Fn& fn) {
  const int64_t runs = (rows + kRun - 1) / kRun;
  std::vector<double> part(std::max<int64_t>(runs, 1) * 2 * c, 0.0);
  at::parallel_for(0, runs, 1, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) fn(k * kRun, std::min(rows, (k + 1) * kRun), part.data() + k * 2 * c);
  });
  for (int64_t k = 1; k < runs; ++k) {
    for (int64_t j = 0; j < 2 * c; ++j) part[j] += part[k * 2 * c + j];
  }
  part.resize(2 * c);
  return part;
}

template <typename Fn>
void ForRows(int64_t rows, const Fn& fn) {
  at::parallel_for(0, rows, kRun, [&](int64_t begin, int64_t end) { fn(begin, end); });
}

// Each pass, portable and (C a multiple of 8) AVX2. x, y, g, dx: rows x c.
// Statistics of x less a shift (a value of each channel, so that the sum of squares does not
// cancel where the mean is large against the spread): out[j] += x - k, out[c + j] += (x - k)^2.
void StatsPortable(const float* x, int64_t r0, int64_t r1, int64_t c, const float* k, double* out) {
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t j = 0; j < c; ++j) {
      const double v = x[r * c + j] - k[j];
      out[j] += v;
      out[c + j] += v * v;
    }
  }
}

// y = x * scale + shift, then the ReLU if asked.
void NormalizePortable(const float* x, int64_t r0, int64_t r1, int64_t c, const float* scale, const float* shift,
                       bool relu, float* y) {
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t j = 0; j < c; ++j) {
      const float v = x[r * c + j] * scale[j] + shift[j];
      y[r * c + j] = relu ? std::max(v, 0.0f) : v;
    }
  }
}

// The gradient past the ReLU (where the output is positive) and its sums: out[j] += g,
// out[c + j] += g * (x - mean) * invstd.
void GradSumsPortable(const float* x, const float* y, const float* g, int64_t r0, int64_t r1, int64_t c,
                      const float* mean, const float* invstd, bool relu, double* out) {
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t j = 0; j < c; ++j) {
      const float gv = relu && !(y[r * c + j] > 0) ? 0.0f : g[r * c + j];
      out[j] += gv;
      out[c + j] += static_cast<double>(gv) * ((x[r * c + j] - mean[j]) * invstd[j]);
    }
  }
}

// dx = k * (g - mg - (x - mean) * invstd * mgx), g past the ReLU.
void InputGradPortable(const float* x, const float* y, const float* g, int64_t r0, int64_t r1, int64_t c,
                       const float* mean, const float* invstd, const float* k, const float* mg, const float* mgx,
                       bool relu, float* dx) {
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t j = 0; j < c; ++j) {
      const float gv = relu && !(y[r * c + j] > 0) ? 0.0f : g[r * c + j];
      const float xh = (x[r * c + j] - mean[j]) * invstd[j];
      dx[r * c + j] = k[j] * (gv - mg[j] - xh * mgx[j]);
    }
  }
}

// The vector loops sum in f32 over kSub rows, then add that in double: a conversion to double per
// element cost more than the rest of the pass.
constexpr int64_t kSub = 8;

}  // namespace

// The four passes at each vector width: one text, kernels/batchnorm_simd.inc.
#define TRAINCTL_SIMD_BODY "kernels/batchnorm_simd.inc"
#include "kernels/each_width.inc"

namespace {

#if defined(__x86_64__)
const bool kAvx2Fma = CpuHasAvx2Fma();
#else
const bool kAvx2Fma = false;
#endif

// The passes for c channels on this CPU: AVX-512 for multiples of 16 (where AllowAvx512Products
// lets it), AVX2 for multiples of 8, else portable.
struct Passes {
  decltype(&StatsPortable) stats;
  decltype(&NormalizePortable) normalize;
  decltype(&GradSumsPortable) grad_sums;
  decltype(&InputGradPortable) input_grad;
};
Passes PassesFor(int64_t c) {
#if defined(__x86_64__)
  if (kAvx2Fma && c % 16 == 0 && Avx512Products()) {
    return {avx512::Stats, avx512::Normalize, avx512::GradSums, avx512::InputGrad};
  }
  if (kAvx2Fma && c % 8 == 0) return {avx2::Stats, avx2::Normalize, avx2::GradSums, avx2::InputGrad};
#endif
  return {StatsPortable, NormalizePortable, GradSumsPortable, InputGradPortable};
}

torch::Tensor Floats(const std::vector<float>& v) { return torch::tensor(v, torch::kFloat32); }

class BatchNormFunction : public torch::autograd::Function<BatchNormFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, torch::Tensor weight, torch::Tensor bias,
                               torch::Tensor running_mean, torch::Tensor running_var, double momentum, double eps,
                               bool relu) {
    x = x.contiguous(at::MemoryFormat::ChannelsLast);
    const int64_t c = x.size(1), rows = x.numel() / std::max<int64_t>(c, 1);
    const Passes passes = PassesFor(c);
    const float* xp = x.data_ptr<float>();
    const std::vector<float> first(xp, xp + c);  // the shift: the first position's values
    const std::vector<double> sums =
        SumRows(rows, c, [&](int64_t r0, int64_t r1, double* out) { passes.stats(xp, r0, r1, c, first.data(), out); });
    std::vector<float> mean(c), invstd(c), scale(c), shift(c), var_unbiased(c);
    const torch::Tensor wc = weight.contiguous(), bc = bias.contiguous();
    const float *w = wc.data_ptr<float>(), *b = bc.data_ptr<float>();
    for (int64_t j = 0; j < c; ++j) {
      const double d = sums[j] / rows, m = first[j] + d, var = std::max(0.0, sums[c + j] / rows - d * d);
      mean[j] = static_cast<float>(m);
      invstd[j] = static_cast<float>(1.0 / std::sqrt(var + eps));
      var_unbiased[j] = static_cast<float>(rows > 1 ? var * rows / (rows - 1) : var);
      scale[j] = w[j] * invstd[j];
      shift[j] = b[j] - mean[j] * scale[j];
    }
    torch::Tensor y = torch::empty_like(x, at::MemoryFormat::ChannelsLast);
    float* yp = y.data_ptr<float>();
    ForRows(rows,
            [&](int64_t r0, int64_t r1) { passes.normalize(xp, r0, r1, c, scale.data(), shift.data(), relu, yp); });
    if (running_mean.numel() > 0) {  // an empty tensor: none (undefined ones do not pass apply)
      running_mean.mul_(1 - momentum).add_(Floats(mean), momentum);
      running_var.mul_(1 - momentum).add_(Floats(var_unbiased), momentum);
    }
    ctx->save_for_backward({x, y, weight});
    ctx->saved_data["mean"] = Floats(mean);
    ctx->saved_data["invstd"] = Floats(invstd);
    ctx->saved_data["relu"] = relu;
    return y;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &y = saved[1], &weight = saved[2];
    const torch::Tensor mean = ctx->saved_data["mean"].toTensor(), invstd = ctx->saved_data["invstd"].toTensor();
    const bool relu = ctx->saved_data["relu"].toBool();
    const torch::Tensor g = grads[0].contiguous(at::MemoryFormat::ChannelsLast);
    const int64_t c = x.size(1), rows = x.numel() / std::max<int64_t>(c, 1);
    const Passes passes = PassesFor(c);
    const float *xp = x.data_ptr<float>(), *yp = y.data_ptr<float>(), *gp = g.data_ptr<float>();
    const float *mp = mean.data_ptr<float>(), *ip = invstd.data_ptr<float>();
    const std::vector<double> sums = SumRows(rows, c, [&](int64_t r0, int64_t r1, double* out) {
      passes.grad_sums(xp, yp, gp, r0, r1, c, mp, ip, relu, out);
    });
    std::vector<float> dbias(c), dweight(c), k(c), mg(c), mgx(c);
    const torch::Tensor wc = weight.contiguous();
    const float* w = wc.data_ptr<float>();
    for (int64_t j = 0; j < c; ++j) {
      dbias[j] = static_cast<float>(sums[j]);
      dweight[j] = static_cast<float>(sums[c + j]);
      k[j] = w[j] * ip[j];
      mg[j] = static_cast<float>(sums[j] / rows);
      mgx[j] = static_cast<float>(sums[c + j] / rows);
    }
    torch::Tensor dx;
    if (ctx->needs_input_grad(0)) {
      dx = torch::empty_like(x, at::MemoryFormat::ChannelsLast);
      float* dp = dx.data_ptr<float>();
      ForRows(rows, [&](int64_t r0, int64_t r1) {
        passes.input_grad(xp, yp, gp, r0, r1, c, mp, ip, k.data(), mg.data(), mgx.data(), relu, dp);
      });
    }
    return {dx,
            Floats(dweight),
            Floats(dbias),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

torch::Tensor BatchNormRelu(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                            const torch::Tensor& running_mean, const torch::Tensor& running_var, double momentum,
                            double eps, bool relu) {
  TORCH_CHECK(x.dim() == 4 && x.scalar_type() == torch::kFloat32 && x.device().is_cpu() && x.size(0) > 0,
              "BatchNormRelu takes a non-empty N x C x H x W float CPU tensor");
  const int64_t c = x.size(1);
  for (const torch::Tensor* t : {&weight, &bias}) {
    TORCH_CHECK(t->dim() == 1 && t->size(0) == c && t->scalar_type() == torch::kFloat32 && t->device().is_cpu(),
                "BatchNormRelu takes a C-long float CPU weight and bias");
  }
  TORCH_CHECK(running_mean.defined() == running_var.defined() &&
                  (!running_mean.defined() ||
                   (running_mean.numel() == c && running_var.numel() == c &&
                    running_mean.scalar_type() == torch::kFloat32 && running_var.scalar_type() == torch::kFloat32)),
              "BatchNormRelu takes C-long float running statistics, or none");
  TORCH_CHECK(x.numel() / c > 1, "BatchNormRelu in training needs more than one value per channel");
  const torch::Tensor none = torch::empty({0});
  return BatchNormFunction::apply(x, weight, bias, running_mean.defined() ? running_mean : none,
                                  running_var.defined() ? running_var : none, momentum, eps, relu);
}

}  // namespace trainctl::kernels
