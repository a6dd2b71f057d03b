#include "models/ops.h"

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <array>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif


namespace trainctl::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// The four corners of every 2x2 window, as strided views of an N x C x H x W tensor.
std::array<torch::Tensor, 4> Corners(const torch::Tensor& x) {
  auto v = x.view({x.size(0), x.size(1), x.size(2) / 2, 2, x.size(3) / 2, 2});
  return {v.select(3, 0).select(4, 0), v.select(3, 0).select(4, 1), v.select(3, 1).select(4, 0),
          v.select(3, 1).select(4, 1)};
}

// The gradient of one output row, written to its two input rows: each window's gradient goes to
// the first of its four values, in row-major order, that equals the window's maximum, and the
// others get zero. SSE2 (every x86-64 has it) four windows at a time, without branches: the
// comparisons are coin flips on real activations.
void UnpoolRow(const float* r0, const float* r1, const float* m, const float* g, int64_t ow,
               float* d0, float* d1) {
  int64_t j = 0;
#if defined(__SSE2__)
  for (; j + 4 <= ow; j += 4) {
    __m128 x0 = _mm_loadu_ps(r0 + 2 * j), x1 = _mm_loadu_ps(r0 + 2 * j + 4);
    __m128 y0 = _mm_loadu_ps(r1 + 2 * j), y1 = _mm_loadu_ps(r1 + 2 * j + 4);
    __m128 a = _mm_shuffle_ps(x0, x1, _MM_SHUFFLE(2, 0, 2, 0));  // even columns of row 0
    __m128 b = _mm_shuffle_ps(x0, x1, _MM_SHUFFLE(3, 1, 3, 1));  // odd columns of row 0
    __m128 c = _mm_shuffle_ps(y0, y1, _MM_SHUFFLE(2, 0, 2, 0));
    __m128 d = _mm_shuffle_ps(y0, y1, _MM_SHUFFLE(3, 1, 3, 1));
    __m128 mx = _mm_loadu_ps(m + j), gv = _mm_loadu_ps(g + j);
    __m128 ea = _mm_cmpeq_ps(a, mx);
    __m128 eb = _mm_andnot_ps(ea, _mm_cmpeq_ps(b, mx));
    __m128 taken = _mm_or_ps(ea, eb);
    __m128 ec = _mm_andnot_ps(taken, _mm_cmpeq_ps(c, mx));
    taken = _mm_or_ps(taken, ec);
    __m128 ga = _mm_and_ps(ea, gv), gb = _mm_and_ps(eb, gv), gc = _mm_and_ps(ec, gv);
    __m128 gd = _mm_andnot_ps(taken, gv);
    _mm_storeu_ps(d0 + 2 * j, _mm_unpacklo_ps(ga, gb));
    _mm_storeu_ps(d0 + 2 * j + 4, _mm_unpackhi_ps(ga, gb));
    _mm_storeu_ps(d1 + 2 * j, _mm_unpacklo_ps(gc, gd));
    _mm_storeu_ps(d1 + 2 * j + 4, _mm_unpackhi_ps(gc, gd));
  }
#endif
  for (; j < ow; ++j) {
    float v[4] = {r0[2 * j], r0[2 * j + 1], r1[2 * j], r1[2 * j + 1]};
    int k = v[0] == m[j] ? 0 : v[1] == m[j] ? 1 : v[2] == m[j] ? 2 : 3;
    d0[2 * j] = k == 0 ? g[j] : 0.0f;
    d0[2 * j + 1] = k == 1 ? g[j] : 0.0f;
    d1[2 * j] = k == 2 ? g[j] : 0.0f;
    d1[2 * j + 1] = k == 3 ? g[j] : 0.0f;
  }
}

// Forward: the elementwise maximum of the four corner views (vectorized, no branches; NaN
// propagates). Backward: UnpoolRow.
class MaxPool2x2Function : public torch::autograd::Function<MaxPool2x2Function> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x) {
    x = x.contiguous();
    auto k = Corners(x);
    torch::Tensor out = torch::maximum(torch::maximum(k[0], k[1]), torch::maximum(k[2], k[3]));
    ctx->save_for_backward({x, out});
    return out;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& out = saved[1];
    torch::Tensor g = grads[0].contiguous();
    torch::Tensor dx = torch::empty_like(x);
    const int64_t planes = x.size(0) * x.size(1), w = x.size(3);
    const int64_t oh = out.size(2), ow = out.size(3);
    const float* xp = x.data_ptr<float>();
    const float* mp = out.data_ptr<float>();
    const float* gp = g.data_ptr<float>();
    float* dp = dx.data_ptr<float>();
    at::parallel_for(0, planes * oh, 16, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {  // output row; input rows 2 row, 2 row + 1
        const int64_t in = row * 2 * w, o = row * ow;
        UnpoolRow(xp + in, xp + in + w, mp + o, gp + o, ow, dp + in, dp + in + w);
      }
    });
    return {dx};
  }
};

}  // namespace

torch::Tensor MaxPool2x2(const torch::Tensor& x) {
  TORCH_CHECK(x.dim() == 4 && x.size(2) % 2 == 0 && x.size(3) % 2 == 0 &&
                  x.scalar_type() == torch::kFloat32 && x.device().is_cpu(),
              "MaxPool2x2 takes an N x C x H x W float CPU tensor with even H and W");
  return MaxPool2x2Function::apply(x);
}

}  // namespace trainctl::models
