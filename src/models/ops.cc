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

// One output row: the windows of input rows r0 and r1 (2 * ow values each), from window j on.
// Forward: out = relu(max of the window), NaN propagating. Backward: the window's gradient goes
// to the first of its four values, in row-major order, that equals the output, if the output is
// positive; every other input gets zero.
void ForwardRow(const float* r0, const float* r1, int64_t j, int64_t ow, float* out) {
  for (; j < ow; ++j) {
    const float a = r0[2 * j], b = r0[2 * j + 1], c = r1[2 * j], d = r1[2 * j + 1];
    float m = std::max(std::max(a, b), std::max(c, d));
    if (a != a || b != b || c != c || d != d) m = a + b + c + d;  // NaN
    out[j] = m > 0 || m != m ? m : 0.0f;
  }
}

void BackwardRow(const float* r0, const float* r1, const float* out, const float* g, int64_t j,
                 int64_t ow, float* d0, float* d1) {
  for (; j < ow; ++j) {
    const float m = out[j], gv = m > 0 ? g[j] : 0.0f;
    const int k = r0[2 * j] == m ? 0 : r0[2 * j + 1] == m ? 1 : r1[2 * j] == m ? 2 : 3;
    d0[2 * j] = k == 0 ? gv : 0.0f;
    d0[2 * j + 1] = k == 1 ? gv : 0.0f;
    d1[2 * j] = k == 2 ? gv : 0.0f;
    d1[2 * j + 1] = k == 3 ? gv : 0.0f;
  }
}

using ForwardFn = void (*)(const float*, const float*, int64_t, float*);
using BackwardFn = void (*)(const float*, const float*, const float*, const float*, int64_t,
                            float*, float*);

void ForwardRowPortable(const float* r0, const float* r1, int64_t ow, float* out) {
  ForwardRow(r0, r1, 0, ow, out);
}
void BackwardRowPortable(const float* r0, const float* r1, const float* out, const float* g,
                         int64_t ow, float* d0, float* d1) {
  BackwardRow(r0, r1, out, g, 0, ow, d0, d1);
}

#if defined(__x86_64__)
// AVX2, eight windows at a time and without branches (the comparisons are coin flips on real
// activations); a row's last windows go through masked loads and stores, so rows as short as a
// Fashion-MNIST CNN's (14 and 7 windows) are vectorized whole. Splitting even and odd columns
// works within 128-bit lanes, so the windows come in the order 0 1 4 5 2 3 6 7; swapping the
// middle 64-bit blocks (0xD8) converts either way.
struct Lanes {
  __m256i lo, hi, out;  // the first 8 and the next 8 input values, and the 8 outputs
};

// All ones in the first n of 8 lanes.
__attribute__((target("avx2"))) inline __m256i FirstLanes(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

__attribute__((target("avx2"))) inline Lanes TailMasks(int64_t windows) {
  return {FirstLanes(2 * windows), FirstLanes(2 * windows - 8), FirstLanes(windows)};
}

__attribute__((target("avx2"))) inline __m256 Load(const float* p, __m256i mask, bool full) {
  return full ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, mask);
}

__attribute__((target("avx2"))) inline void Store(float* p, __m256 v, __m256i mask, bool full) {
  if (full) {
    _mm256_storeu_ps(p, v);
  } else {
    _mm256_maskstore_ps(p, mask, v);
  }
}

__attribute__((target("avx2"))) inline __m256 SwapMiddle(__m256 v) {
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(v), 0xD8));
}

// The four values of 8 windows: a b in the first input row, c d in the second.
struct Windows {
  __m256 a, b, c, d;
};
__attribute__((target("avx2"))) inline Windows LoadWindows(const float* r0, const float* r1,
                                                          const Lanes& m, bool full) {
  __m256 x0 = Load(r0, m.lo, full), x1 = Load(r0 + 8, m.hi, full);
  __m256 y0 = Load(r1, m.lo, full), y1 = Load(r1 + 8, m.hi, full);
  return {_mm256_shuffle_ps(x0, x1, _MM_SHUFFLE(2, 0, 2, 0)),
          _mm256_shuffle_ps(x0, x1, _MM_SHUFFLE(3, 1, 3, 1)),
          _mm256_shuffle_ps(y0, y1, _MM_SHUFFLE(2, 0, 2, 0)),
          _mm256_shuffle_ps(y0, y1, _MM_SHUFFLE(3, 1, 3, 1))};
}

__attribute__((target("avx2"))) void ForwardRowAvx2(const float* r0, const float* r1, int64_t ow,
                                                    float* out) {
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t j = 0; j < ow; j += 8) {
    const bool full = j + 8 <= ow;
    const Lanes mask = full ? Lanes{} : TailMasks(ow - j);
    Windows w = LoadWindows(r0 + 2 * j, r1 + 2 * j, mask, full);
    __m256 m = _mm256_max_ps(_mm256_max_ps(w.a, w.b), _mm256_max_ps(w.c, w.d));
    __m256 nan = _mm256_or_ps(_mm256_cmp_ps(w.a, w.b, _CMP_UNORD_Q), _mm256_cmp_ps(w.c, w.d, _CMP_UNORD_Q));
    m = _mm256_blendv_ps(m, _mm256_add_ps(_mm256_add_ps(w.a, w.b), _mm256_add_ps(w.c, w.d)), nan);
    m = _mm256_max_ps(zero, m);  // relu; a NaN in the second operand is what max returns
    Store(out + j, SwapMiddle(m), mask.out, full);
  }
}

__attribute__((target("avx2"))) void BackwardRowAvx2(const float* r0, const float* r1,
                                                     const float* out, const float* g, int64_t ow,
                                                     float* d0, float* d1) {
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t j = 0; j < ow; j += 8) {
    const bool full = j + 8 <= ow;
    const Lanes mask = full ? Lanes{} : TailMasks(ow - j);
    Windows w = LoadWindows(r0 + 2 * j, r1 + 2 * j, mask, full);
    __m256 m = SwapMiddle(Load(out + j, mask.out, full));
    __m256 gv = _mm256_and_ps(SwapMiddle(Load(g + j, mask.out, full)), _mm256_cmp_ps(m, zero, _CMP_GT_OQ));
    __m256 ea = _mm256_cmp_ps(w.a, m, _CMP_EQ_OQ);
    __m256 eb = _mm256_andnot_ps(ea, _mm256_cmp_ps(w.b, m, _CMP_EQ_OQ));
    __m256 taken = _mm256_or_ps(ea, eb);
    __m256 ec = _mm256_andnot_ps(taken, _mm256_cmp_ps(w.c, m, _CMP_EQ_OQ));
    taken = _mm256_or_ps(taken, ec);  // the fourth value takes what the first three leave
    __m256 ga = _mm256_and_ps(ea, gv), gb = _mm256_and_ps(eb, gv), gc = _mm256_and_ps(ec, gv);
    __m256 gd = _mm256_andnot_ps(taken, gv);
    // Interleaving within lanes puts each input row's 16 values back in order.
    Store(d0 + 2 * j, _mm256_unpacklo_ps(ga, gb), mask.lo, full);
    Store(d0 + 2 * j + 8, _mm256_unpackhi_ps(ga, gb), mask.hi, full);
    Store(d1 + 2 * j, _mm256_unpacklo_ps(gc, gd), mask.lo, full);
    Store(d1 + 2 * j + 8, _mm256_unpackhi_ps(gc, gd), mask.hi, full);
  }
}

// A static initializer may run before libgcc's own, which fills in what cpu_supports reads.
const bool kAvx2 = [] {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") != 0;
}();
const ForwardFn kForward = kAvx2 ? ForwardRowAvx2 : ForwardRowPortable;
const BackwardFn kBackward = kAvx2 ? BackwardRowAvx2 : BackwardRowPortable;
#else
const ForwardFn kForward = ForwardRowPortable;
const BackwardFn kBackward = BackwardRowPortable;
#endif

// Rows of all planes are independent: split them among LibTorch's threads.
template <typename Fn>
void ForEachRow(int64_t rows, const Fn& fn) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) fn(row);
  });
}

class MaxPool2x2ReluFunction : public torch::autograd::Function<MaxPool2x2ReluFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x) {
    x = x.contiguous();
    const int64_t w = x.size(3), oh = x.size(2) / 2, ow = w / 2;
    torch::Tensor out = torch::empty({x.size(0), x.size(1), oh, ow}, x.options());
    const float* xp = x.data_ptr<float>();
    float* op = out.data_ptr<float>();
    ForEachRow(x.size(0) * x.size(1) * oh, [&](int64_t row) {  // input rows 2 row, 2 row + 1
      kForward(xp + row * 2 * w, xp + row * 2 * w + w, ow, op + row * ow);
    });
    ctx->save_for_backward({x, out});
    return out;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& out = saved[1];
    torch::Tensor g = grads[0].contiguous();
    torch::Tensor dx = torch::empty_like(x);
    const int64_t w = x.size(3), oh = out.size(2), ow = out.size(3);
    const float* xp = x.data_ptr<float>();
    const float* mp = out.data_ptr<float>();
    const float* gp = g.data_ptr<float>();
    float* dp = dx.data_ptr<float>();
    ForEachRow(x.size(0) * x.size(1) * oh, [&](int64_t row) {
      const int64_t in = row * 2 * w, o = row * ow;
      kBackward(xp + in, xp + in + w, mp + o, gp + o, ow, dp + in, dp + in + w);
    });
    return {dx};
  }
};

}  // namespace

torch::Tensor MaxPool2x2Relu(const torch::Tensor& x) {
  TORCH_CHECK(x.dim() == 4 && x.size(2) % 2 == 0 && x.size(3) % 2 == 0 &&
                  x.scalar_type() == torch::kFloat32 && x.device().is_cpu(),
              "MaxPool2x2Relu takes an N x C x H x W float CPU tensor with even H and W");
  return MaxPool2x2ReluFunction::apply(x);
}

}  // namespace trainctl::models
