#include "models/ops.h"

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace trainctl::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// Forward: out = relu(max of the window a b / c d), NaN propagating (as ATen). Backward: the
// window's gradient goes to the first of a b c d that equals the output, if the output is
// positive; the others get zero. Per channel, the 16 channels of a position side by side.
void PoolForwardPlanePortable(const float* x, int64_t h, int64_t w, float* out) {
  for (int64_t i = 0; i < h / 2; ++i) {
    const float* r0 = x + 2 * i * w * kBlock;
    const float* r1 = r0 + w * kBlock;
    for (int64_t k = 0; k < w * kBlock; k += 2 * kBlock) {
      for (int64_t l = 0; l < kBlock; ++l, ++out) {
        const float a = r0[k + l], b = r0[k + kBlock + l], c = r1[k + l], d = r1[k + kBlock + l];
        float m = std::max(std::max(a, b), std::max(c, d));
        if (a != a || b != b || c != c || d != d) m = a + b + c + d;
        *out = m > 0 || m != m ? m : 0.0f;
      }
    }
  }
}

void PoolBackwardPlanePortable(const float* x, const float* out, const float* g, int64_t h,
                               int64_t w, float* dx) {
  for (int64_t i = 0; i < h / 2; ++i) {
    const int64_t r0 = 2 * i * w * kBlock, r1 = r0 + w * kBlock;
    for (int64_t k = 0; k < w * kBlock; k += 2 * kBlock) {
      for (int64_t l = 0; l < kBlock; ++l, ++out, ++g) {
        const int64_t p[4] = {r0 + k + l, r0 + k + kBlock + l, r1 + k + l, r1 + k + kBlock + l};
        const int first = x[p[0]] == *out ? 0 : x[p[1]] == *out ? 1 : x[p[2]] == *out ? 2 : 3;
        for (int q = 0; q < 4; ++q) dx[p[q]] = q == first && *out > 0 ? *g : 0.0f;
      }
    }
  }
}

using ForwardFn = void (*)(const float*, int64_t, int64_t, float*);
using BackwardFn = void (*)(const float*, const float*, const float*, int64_t, int64_t, float*);

#if defined(__x86_64__)
// The same with AVX2, a position's 16 channels as two registers of 8; no branches.
__attribute__((target("avx2"))) inline __m256 Forward8(const float* a, const float* b,
                                                       const float* c, const float* d) {
  const __m256 va = _mm256_loadu_ps(a), vb = _mm256_loadu_ps(b);
  const __m256 vc = _mm256_loadu_ps(c), vd = _mm256_loadu_ps(d);
  __m256 m = _mm256_max_ps(_mm256_max_ps(va, vb), _mm256_max_ps(vc, vd));
  __m256 nan = _mm256_or_ps(_mm256_cmp_ps(va, vb, _CMP_UNORD_Q), _mm256_cmp_ps(vc, vd, _CMP_UNORD_Q));
  m = _mm256_blendv_ps(m, _mm256_add_ps(_mm256_add_ps(va, vb), _mm256_add_ps(vc, vd)), nan);
  return _mm256_max_ps(_mm256_setzero_ps(), m);  // relu; max returns a NaN second operand
}

__attribute__((target("avx2"))) void PoolForwardPlaneAvx2(const float* x, int64_t h, int64_t w,
                                                          float* out) {
  for (int64_t i = 0; i < h / 2; ++i) {
    const float* r0 = x + 2 * i * w * kBlock;
    const float* r1 = r0 + w * kBlock;
    for (int64_t k = 0; k < w * kBlock; k += 2 * kBlock, out += kBlock) {
      for (int64_t l = 0; l < kBlock; l += 8) {
        const int64_t j = k + l;
        _mm256_storeu_ps(out + l, Forward8(r0 + j, r0 + j + kBlock, r1 + j, r1 + j + kBlock));
      }
    }
  }
}

__attribute__((target("avx2"))) void PoolBackwardPlaneAvx2(const float* x, const float* out,
                                                           const float* g, int64_t h, int64_t w,
                                                           float* dx) {
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t i = 0; i < h / 2; ++i) {
    const int64_t r0 = 2 * i * w * kBlock, r1 = r0 + w * kBlock;
    for (int64_t k = 0; k < w * kBlock; k += 2 * kBlock, out += kBlock, g += kBlock) {
      for (int64_t l = 0; l < kBlock; l += 8) {
        const int64_t a = r0 + k + l, b = a + kBlock, c = r1 + k + l, d = c + kBlock;
        const __m256 m = _mm256_loadu_ps(out + l);
        const __m256 gv = _mm256_and_ps(_mm256_loadu_ps(g + l), _mm256_cmp_ps(m, zero, _CMP_GT_OQ));
        const __m256 ea = _mm256_cmp_ps(_mm256_loadu_ps(x + a), m, _CMP_EQ_OQ);
        const __m256 eb = _mm256_andnot_ps(ea, _mm256_cmp_ps(_mm256_loadu_ps(x + b), m, _CMP_EQ_OQ));
        __m256 taken = _mm256_or_ps(ea, eb);
        const __m256 ec = _mm256_andnot_ps(taken, _mm256_cmp_ps(_mm256_loadu_ps(x + c), m, _CMP_EQ_OQ));
        taken = _mm256_or_ps(taken, ec);  // d takes what a, b and c leave
        _mm256_storeu_ps(dx + a, _mm256_and_ps(ea, gv));
        _mm256_storeu_ps(dx + b, _mm256_and_ps(eb, gv));
        _mm256_storeu_ps(dx + c, _mm256_and_ps(ec, gv));
        _mm256_storeu_ps(dx + d, _mm256_andnot_ps(taken, gv));
      }
    }
  }
}

// A static initializer may run before libgcc's own, which fills in what cpu_supports reads.
const bool kAvx2 = [] {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") != 0;
}();
const ForwardFn kForward = kAvx2 ? PoolForwardPlaneAvx2 : PoolForwardPlanePortable;
const BackwardFn kBackward = kAvx2 ? PoolBackwardPlaneAvx2 : PoolBackwardPlanePortable;
#else
const ForwardFn kForward = PoolForwardPlanePortable;
const BackwardFn kBackward = PoolBackwardPlanePortable;
#endif

// Planes are independent: split them among LibTorch's threads.
template <typename Fn>
void ForEachPlane(int64_t planes, const Fn& fn) {
  at::parallel_for(0, planes, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) fn(p);
  });
}

class PoolFunction : public torch::autograd::Function<PoolFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x) {
    x = x.contiguous();
    const int64_t h = x.size(2), w = x.size(3), in = h * w * kBlock, on = in / 4;
    torch::Tensor out = torch::empty({x.size(0), x.size(1), h / 2, w / 2, kBlock}, x.options());
    const float* xp = x.data_ptr<float>();
    float* op = out.data_ptr<float>();
    ForEachPlane(x.size(0) * x.size(1), [&](int64_t p) { kForward(xp + p * in, h, w, op + p * on); });
    ctx->save_for_backward({x, out});
    return out;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& out = saved[1];
    torch::Tensor g = grads[0].contiguous();
    torch::Tensor dx = torch::empty_like(x);
    const int64_t h = x.size(2), w = x.size(3), in = h * w * kBlock, on = in / 4;
    const float* xp = x.data_ptr<float>();
    const float* mp = out.data_ptr<float>();
    const float* gp = g.data_ptr<float>();
    float* dp = dx.data_ptr<float>();
    ForEachPlane(x.size(0) * x.size(1), [&](int64_t p) {
      kBackward(xp + p * in, mp + p * on, gp + p * on, h, w, dp + p * in);
    });
    return {dx};
  }
};

}  // namespace

void CheckBlocked(const torch::Tensor& x, const char* what) {
  TORCH_CHECK(x.dim() == 5 && x.size(4) == kBlock && x.scalar_type() == torch::kFloat32 &&
                  x.device().is_cpu(),
              what, " takes a blocked N x C/16 x H x W x 16 float CPU tensor");
}

torch::Tensor ToBlocked(const torch::Tensor& x) {
  TORCH_CHECK(x.dim() == 4 && x.size(1) % kBlock == 0, "ToBlocked takes N x C x H x W, C a multiple of 16");
  return x.reshape({x.size(0), x.size(1) / kBlock, kBlock, x.size(2), x.size(3)})
      .permute({0, 1, 3, 4, 2})
      .contiguous();
}

torch::Tensor FromBlocked(const torch::Tensor& x) {
  CheckBlocked(x, "FromBlocked");
  return x.permute({0, 1, 4, 2, 3}).reshape({x.size(0), x.size(1) * kBlock, x.size(2), x.size(3)});
}

torch::Tensor MaxPool2x2Relu(const torch::Tensor& x) {
  CheckBlocked(x, "MaxPool2x2Relu");
  TORCH_CHECK(x.size(2) % 2 == 0 && x.size(3) % 2 == 0, "MaxPool2x2Relu takes even H and W");
  return PoolFunction::apply(x);
}

}  // namespace trainctl::models
