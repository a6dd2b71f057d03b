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

// Forward: out = relu(max of the window a b / c d), NaN propagating (as ATen), and which of the
// four gets the window's gradient: the first (0-3, row-major) that equals the output when the
// output is positive, else none (kNone). Backward scatters the gradient by those bytes alone,
// without reading the input again. Per channel: a position's 16 channels lie side by side.
constexpr uint8_t kNone = 4;

void PoolForwardPlanePortable(const float* x, int64_t h, int64_t w, float* out, uint8_t* win) {
  for (int64_t i = 0; i < h / 2; ++i) {
    const float* r0 = x + 2 * i * w * kBlock;
    const float* r1 = r0 + w * kBlock;
    for (int64_t k = 0; k < w * kBlock; k += 2 * kBlock) {
      for (int64_t l = 0; l < kBlock; ++l, ++out, ++win) {
        const float a = r0[k + l], b = r0[k + kBlock + l], c = r1[k + l], d = r1[k + kBlock + l];
        float m = std::max(std::max(a, b), std::max(c, d));
        if (a != a || b != b || c != c || d != d) m = a + b + c + d;
        *out = m > 0 || m != m ? m : 0.0f;
        *win = !(m > 0) ? kNone : a == m ? 0 : b == m ? 1 : c == m ? 2 : 3;
      }
    }
  }
}

void PoolBackwardPlanePortable(const uint8_t* win, const float* g, int64_t h, int64_t w, float* dx) {
  for (int64_t i = 0; i < h / 2; ++i) {
    const int64_t r0 = 2 * i * w * kBlock, r1 = r0 + w * kBlock;
    for (int64_t k = 0; k < w * kBlock; k += 2 * kBlock) {
      for (int64_t l = 0; l < kBlock; ++l, ++win, ++g) {
        const int64_t p[4] = {r0 + k + l, r0 + k + kBlock + l, r1 + k + l, r1 + k + kBlock + l};
        for (int q = 0; q < 4; ++q) dx[p[q]] = q == *win ? *g : 0.0f;
      }
    }
  }
}

using ForwardFn = void (*)(const float*, int64_t, int64_t, float*, uint8_t*);
using BackwardFn = void (*)(const uint8_t*, const float*, int64_t, int64_t, float*);

#if defined(__x86_64__)
// The same with AVX2, a position's 16 channels as two registers of 8; no branches.
// The winner of 8 windows as 8 int32 lanes.
__attribute__((target("avx2"))) inline __m256 Forward8(const float* a, const float* b,
                                                       const float* c, const float* d,
                                                       __m256i* win) {
  const __m256 va = _mm256_loadu_ps(a), vb = _mm256_loadu_ps(b);
  const __m256 vc = _mm256_loadu_ps(c), vd = _mm256_loadu_ps(d);
  __m256 m = _mm256_max_ps(_mm256_max_ps(va, vb), _mm256_max_ps(vc, vd));
  __m256 nan = _mm256_or_ps(_mm256_cmp_ps(va, vb, _CMP_UNORD_Q), _mm256_cmp_ps(vc, vd, _CMP_UNORD_Q));
  m = _mm256_blendv_ps(m, _mm256_add_ps(_mm256_add_ps(va, vb), _mm256_add_ps(vc, vd)), nan);
  m = _mm256_max_ps(_mm256_setzero_ps(), m);  // relu; max returns a NaN second operand
  // Later candidates first, so that the first equal one is what remains.
  __m256 k = _mm256_set1_ps(3.0f);
  k = _mm256_blendv_ps(k, _mm256_set1_ps(2.0f), _mm256_cmp_ps(vc, m, _CMP_EQ_OQ));
  k = _mm256_blendv_ps(k, _mm256_set1_ps(1.0f), _mm256_cmp_ps(vb, m, _CMP_EQ_OQ));
  k = _mm256_blendv_ps(k, _mm256_setzero_ps(), _mm256_cmp_ps(va, m, _CMP_EQ_OQ));
  k = _mm256_blendv_ps(_mm256_set1_ps(kNone), k, _mm256_cmp_ps(m, _mm256_setzero_ps(), _CMP_GT_OQ));
  *win = _mm256_cvttps_epi32(k);
  return m;
}

__attribute__((target("avx2"))) void PoolForwardPlaneAvx2(const float* x, int64_t h, int64_t w,
                                                          float* out, uint8_t* win) {
  for (int64_t i = 0; i < h / 2; ++i) {
    const float* r0 = x + 2 * i * w * kBlock;
    const float* r1 = r0 + w * kBlock;
    for (int64_t k = 0; k < w * kBlock; k += 2 * kBlock, out += kBlock, win += kBlock) {
      __m256i lo, hi;
      _mm256_storeu_ps(out, Forward8(r0 + k, r0 + k + kBlock, r1 + k, r1 + k + kBlock, &lo));
      _mm256_storeu_ps(out + 8, Forward8(r0 + k + 8, r0 + k + kBlock + 8, r1 + k + 8, r1 + k + kBlock + 8, &hi));
      // 16 int32 to 16 bytes: packing works within 128-bit lanes, the permute restores the order.
      __m256i w16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xD8);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(win),
                       _mm_packus_epi16(_mm256_castsi256_si128(w16), _mm256_extracti128_si256(w16, 1)));
    }
  }
}

__attribute__((target("avx2"))) void PoolBackwardPlaneAvx2(const uint8_t* win, const float* g,
                                                           int64_t h, int64_t w, float* dx) {
  for (int64_t i = 0; i < h / 2; ++i) {
    const int64_t r0 = 2 * i * w * kBlock, r1 = r0 + w * kBlock;
    for (int64_t k = 0; k < w * kBlock; k += 2 * kBlock, win += kBlock, g += kBlock) {
      for (int64_t l = 0; l < kBlock; l += 8) {
        const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(win + l)));
        const __m256 gv = _mm256_loadu_ps(g + l);
        float* to[4] = {dx + r0 + k + l, dx + r0 + k + kBlock + l, dx + r1 + k + l, dx + r1 + k + kBlock + l};
        for (int q = 0; q < 4; ++q) {
          const __m256 is = _mm256_castsi256_ps(_mm256_cmpeq_epi32(v, _mm256_set1_epi32(q)));
          _mm256_storeu_ps(to[q], _mm256_and_ps(is, gv));
        }
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
    torch::Tensor win = torch::empty(out.sizes(), torch::kUInt8);
    const float* xp = x.data_ptr<float>();
    float* op = out.data_ptr<float>();
    uint8_t* wp = win.data_ptr<uint8_t>();
    ForEachPlane(x.size(0) * x.size(1), [&](int64_t p) { kForward(xp + p * in, h, w, op + p * on, wp + p * on); });
    ctx->save_for_backward({win});  // not x: it is freed as soon as nothing else holds it
    ctx->saved_data["input_sizes"] = x.sizes().vec();
    return out;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const torch::Tensor win = ctx->get_saved_variables()[0];
    torch::Tensor g = grads[0].contiguous();
    torch::Tensor dx = torch::empty(ctx->saved_data["input_sizes"].toIntVector(), g.options());
    const int64_t h = dx.size(2), w = dx.size(3), in = h * w * kBlock, on = in / 4;
    const uint8_t* wp = win.data_ptr<uint8_t>();
    const float* gp = g.data_ptr<float>();
    float* dp = dx.data_ptr<float>();
    ForEachPlane(dx.size(0) * dx.size(1), [&](int64_t p) { kBackward(wp + p * on, gp + p * on, h, w, dp + p * in); });
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
