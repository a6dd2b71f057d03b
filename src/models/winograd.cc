// Conv3x3Winograd (models/ops.h): Winograd's F(2x2, 3x3) on AVX2 and FMA.
//
// Each 2 x 2 block of outputs (a tile) comes from the 4 x 4 block of inputs around it. With
//   Bt = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1],
//   At = [1 1 1 0; 0 1 -1 -1],
// the tile's output for output channel o is At (sum_i (G w[o][i] Gt) .* (Bt x_i B)) A: the 16
// positions of the transformed 4 x 4 blocks are 16 independent matrix products
//   M[p] (tiles x O) = V[p] (tiles x I) * U[p] (I x O),
// 16 multiplications a tile and channel pair instead of 4 x 9 = 36 (2.25x fewer); the
// transforms are additions. One image at a time, so that its transformed input (16 x tiles x I)
// and products (16 x tiles x O) stay in the core's L2 cache.
#include "models/ops.h"

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace trainctl::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

#if defined(__x86_64__)
// U[p][i][o] = (G g Gt)[p] for the 3 x 3 kernel g from input channel i to output channel o of a
// weight O x I x 3 x 3. For the input gradient (`flip`) the roles swap: the kernel from the
// output's gradient channel o to input channel i is w[o][i] rotated by 180 degrees, so U is then
// [p][o][i] (its inputs are the O channels of the gradient).
void WeightTransform(const float* w, int64_t o_count, int64_t i_count, bool flip, float* u) {
  const int64_t in = flip ? o_count : i_count, out = flip ? i_count : o_count;
  for (int64_t o = 0; o < o_count; ++o) {
    for (int64_t i = 0; i < i_count; ++i) {
      const float* k = w + (o * i_count + i) * 9;
      float g[3][3];
      for (int r = 0; r < 3; ++r) {
        for (int c = 0; c < 3; ++c) g[r][c] = flip ? k[(2 - r) * 3 + 2 - c] : k[r * 3 + c];
      }
      float t[4][3];  // G g
      for (int c = 0; c < 3; ++c) {
        t[0][c] = g[0][c];
        t[1][c] = 0.5f * (g[0][c] + g[1][c] + g[2][c]);
        t[2][c] = 0.5f * (g[0][c] - g[1][c] + g[2][c]);
        t[3][c] = g[2][c];
      }
      const int64_t row = flip ? o : i, col = flip ? i : o;
      for (int r = 0; r < 4; ++r) {
        const float v[4] = {t[r][0], 0.5f * (t[r][0] + t[r][1] + t[r][2]), 0.5f * (t[r][0] - t[r][1] + t[r][2]),
                            t[r][2]};
        for (int c = 0; c < 4; ++c) u[((r * 4 + c) * in + row) * out + col] = v[c];
      }
    }
  }
}

// An R x 16 block of C (row stride `ldc`) = or += A B, for A R x k (element (r, c) at
// a[r * a_row + c * a_k]) and B k x 16 (row stride `ldb`): 2R accumulators in registers over k.
template <int R>
__attribute__((target("avx2,fma"))) inline void Block(const float* a, int64_t a_row, int64_t a_k, const float* b,
                                                      int64_t ldb, int64_t k, float* c, int64_t ldc, bool add) {
  __m256 acc[R][2];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    acc[r][0] = add ? _mm256_loadu_ps(c + r * ldc) : _mm256_setzero_ps();
    acc[r][1] = add ? _mm256_loadu_ps(c + r * ldc + 8) : _mm256_setzero_ps();
  }
  for (int64_t kk = 0; kk < k; ++kk) {
    const __m256 b0 = _mm256_loadu_ps(b + kk * ldb), b1 = _mm256_loadu_ps(b + kk * ldb + 8);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 x = _mm256_broadcast_ss(a + r * a_row + kk * a_k);
      acc[r][0] = _mm256_fmadd_ps(x, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(x, b1, acc[r][1]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(c + r * ldc, acc[r][0]);
    _mm256_storeu_ps(c + r * ldc + 8, acc[r][1]);
  }
}

// C (rows x cols, row stride cols) = or += A B, A rows x k with strides (a_row, a_k), B k x cols
// (row stride cols), cols a multiple of 16: blocks of 6 rows by 16 columns.
__attribute__((target("avx2,fma"))) void Gemm(const float* a, int64_t rows, int64_t a_row, int64_t a_k,
                                              const float* b, int64_t k, int64_t cols, float* c, bool add) {
  for (int64_t j = 0; j < cols; j += 16) {
    int64_t r = 0;
    for (; r + 6 <= rows; r += 6) Block<6>(a + r * a_row, a_row, a_k, b + j, cols, k, c + r * cols + j, cols, add);
    const float* ar = a + r * a_row;
    float* cr = c + r * cols + j;
    switch (rows - r) {
      case 1: Block<1>(ar, a_row, a_k, b + j, cols, k, cr, cols, add); break;
      case 2: Block<2>(ar, a_row, a_k, b + j, cols, k, cr, cols, add); break;
      case 3: Block<3>(ar, a_row, a_k, b + j, cols, k, cr, cols, add); break;
      case 4: Block<4>(ar, a_row, a_k, b + j, cols, k, cr, cols, add); break;
      case 5: Block<5>(ar, a_row, a_k, b + j, cols, k, cr, cols, add); break;
      default: break;
    }
  }
}

struct Scratch {
  // The input H x W x I in a zero border, V, M, the output (or its gradient) H x W x O.
  std::vector<float> hwc, v, m, out;
};

// dst[(r * row_stride + q) * c + ch] = x[(ch * h + r) * w + q]: one image's c x h x w with the
// channels of a position adjacent, rows `row_stride` positions apart.
__attribute__((target("avx2,fma"))) inline void ChannelsLast(const float* x, int64_t c, int64_t h, int64_t w,
                                                             int64_t row_stride, float* dst) {
  for (int64_t ch = 0; ch < c; ++ch) {
    for (int64_t r = 0; r < h; ++r) {
      const float* src = x + (ch * h + r) * w;
      float* row = dst + r * row_stride * c + ch;
      for (int64_t q = 0; q < w; ++q) row[q * c] = src[q];
    }
  }
}

// V[p][t][i] = (Bt d B)[p] for each tile t's 4 x 4 block d of input channel i of one image x
// (in x h x w, h and w even), into s->v.
__attribute__((target("avx2,fma"))) void TransformInput(const float* x, int64_t in, int64_t h, int64_t w,
                                                        Scratch* s) {
  const int64_t wp = w + 2, th = h / 2, tw = w / 2, tiles = th * tw;
  // The channels of a position adjacent, in a zero border: each transform below works on 8
  // channels at a time with whole-register loads. Only the inside is written: the border stays
  // zero from the first image of this size.
  if (s->hwc.size() != static_cast<size_t>((h + 2) * wp * in)) s->hwc.assign((h + 2) * wp * in, 0.0f);
  s->v.resize(16 * tiles * in);
  float *hwc = s->hwc.data(), *v = s->v.data();
  ChannelsLast(x, in, h, w, wp, hwc + (wp + 1) * in);
  for (int64_t ty = 0; ty < th; ++ty) {
    for (int64_t tx = 0; tx < tw; ++tx) {
      const int64_t t = ty * tw + tx;
      for (int64_t c = 0; c < in; c += 8) {
        __m256 d[4][4], b[4][4];
        for (int r = 0; r < 4; ++r) {
          for (int q = 0; q < 4; ++q) d[r][q] = _mm256_loadu_ps(hwc + ((2 * ty + r) * wp + 2 * tx + q) * in + c);
        }
        for (int q = 0; q < 4; ++q) {  // Bt d
          b[0][q] = _mm256_sub_ps(d[0][q], d[2][q]);
          b[1][q] = _mm256_add_ps(d[1][q], d[2][q]);
          b[2][q] = _mm256_sub_ps(d[2][q], d[1][q]);
          b[3][q] = _mm256_sub_ps(d[1][q], d[3][q]);
        }
        for (int r = 0; r < 4; ++r) {  // (Bt d) B
          float* vp = v + ((r * 4) * tiles + t) * in + c;
          _mm256_storeu_ps(vp, _mm256_sub_ps(b[r][0], b[r][2]));
          _mm256_storeu_ps(vp + tiles * in, _mm256_add_ps(b[r][1], b[r][2]));
          _mm256_storeu_ps(vp + 2 * tiles * in, _mm256_sub_ps(b[r][2], b[r][1]));
          _mm256_storeu_ps(vp + 3 * tiles * in, _mm256_sub_ps(b[r][1], b[r][3]));
        }
      }
    }
  }
}

// One image: x (in x h x w, h and w even) to y (out x h x w), plus bias[o] if bias is given.
__attribute__((target("avx2,fma"))) void Image(const float* x, int64_t in, int64_t h, int64_t w, const float* u,
                                               const float* bias, int64_t out, float* y, Scratch* s) {
  const int64_t th = h / 2, tw = w / 2, tiles = th * tw;
  TransformInput(x, in, h, w, s);
  s->m.resize(16 * tiles * out);
  s->out.resize(h * w * out);
  float *v = s->v.data(), *m = s->m.data(), *o = s->out.data();
  for (int64_t p = 0; p < 16; ++p) {  // M[p] (tiles x out) = V[p] (tiles x in) U[p] (in x out)
    Gemm(v + p * tiles * in, tiles, in, 1, u + p * in * out, in, out, m + p * tiles * out, /*add=*/false);
  }
  // The tile's outputs At m A, into H x W x O, then to O x H x W.
  for (int64_t ty = 0; ty < th; ++ty) {
    for (int64_t tx = 0; tx < tw; ++tx) {
      const int64_t t = ty * tw + tx;
      for (int64_t c = 0; c < out; c += 8) {
        __m256 mm[4][4], a[2][4];
        for (int r = 0; r < 4; ++r) {
          for (int q = 0; q < 4; ++q) mm[r][q] = _mm256_loadu_ps(m + ((r * 4 + q) * tiles + t) * out + c);
        }
        for (int q = 0; q < 4; ++q) {  // At m
          a[0][q] = _mm256_add_ps(_mm256_add_ps(mm[0][q], mm[1][q]), mm[2][q]);
          a[1][q] = _mm256_sub_ps(_mm256_sub_ps(mm[1][q], mm[2][q]), mm[3][q]);
        }
        const __m256 bv = bias ? _mm256_loadu_ps(bias + c) : _mm256_setzero_ps();
        for (int r = 0; r < 2; ++r) {  // (At m) A
          float* op = o + ((2 * ty + r) * w + 2 * tx) * out + c;
          _mm256_storeu_ps(op, _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a[r][0], a[r][1]), a[r][2]), bv));
          _mm256_storeu_ps(op + out, _mm256_add_ps(_mm256_sub_ps(_mm256_sub_ps(a[r][1], a[r][2]), a[r][3]), bv));
        }
      }
    }
  }
  for (int64_t c = 0; c < out; ++c) {
    float* dst = y + c * h * w;
    for (int64_t q = 0; q < h * w; ++q) dst[q] = o[q * out + c];
  }
}

// One image's share of the transformed weight gradient: du[p] (in x out) += V[p]^T (A gy At)[p],
// for x (in x h x w) and the output's gradient gy (out x h x w): since y = At (sum U .* V) A per
// tile, the gradient of U[p][i][o] is the sum over tiles of V[p][t][i] (A gy_t At)[p][o].
__attribute__((target("avx2,fma"))) void ImageWeightGrad(const float* x, const float* gy, int64_t in, int64_t h,
                                                         int64_t w, int64_t out, float* du, Scratch* s) {
  const int64_t th = h / 2, tw = w / 2, tiles = th * tw;
  TransformInput(x, in, h, w, s);
  s->out.resize(h * w * out);
  s->m.resize(16 * tiles * out);
  float *ghwc = s->out.data(), *m = s->m.data();
  ChannelsLast(gy, out, 1, h * w, h * w, ghwc);  // no border: the plane as one row
  for (int64_t ty = 0; ty < th; ++ty) {
    for (int64_t tx = 0; tx < tw; ++tx) {
      const int64_t t = ty * tw + tx;
      for (int64_t c = 0; c < out; c += 8) {
        __m256 g[2][2], a[4][2];
        for (int r = 0; r < 2; ++r) {
          for (int q = 0; q < 2; ++q) g[r][q] = _mm256_loadu_ps(ghwc + ((2 * ty + r) * w + 2 * tx + q) * out + c);
        }
        for (int q = 0; q < 2; ++q) {  // A g, A = [1 0; 1 1; 1 -1; 0 -1]
          a[0][q] = g[0][q];
          a[1][q] = _mm256_add_ps(g[0][q], g[1][q]);
          a[2][q] = _mm256_sub_ps(g[0][q], g[1][q]);
          a[3][q] = _mm256_sub_ps(_mm256_setzero_ps(), g[1][q]);
        }
        for (int r = 0; r < 4; ++r) {  // (A g) At
          float* mp = m + ((r * 4) * tiles + t) * out + c;
          _mm256_storeu_ps(mp, a[r][0]);
          _mm256_storeu_ps(mp + tiles * out, _mm256_add_ps(a[r][0], a[r][1]));
          _mm256_storeu_ps(mp + 2 * tiles * out, _mm256_sub_ps(a[r][0], a[r][1]));
          _mm256_storeu_ps(mp + 3 * tiles * out, _mm256_sub_ps(_mm256_setzero_ps(), a[r][1]));
        }
      }
    }
  }
  for (int64_t p = 0; p < 16; ++p) {
    // du[p] (in x out) += V[p]^T (in x tiles) G[p] (tiles x out)
    Gemm(s->v.data() + p * tiles * in, in, 1, in, m + p * tiles * out, tiles, out, du + p * in * out, /*add=*/true);
  }
}

// The weight gradient (out x in x 3 x 3) of the convolution of x by the output's gradient gy.
// Images in fixed groups, each group's sum apart, then the groups' sums in order: the same result
// whatever the number of threads.
torch::Tensor WeightGrad(const torch::Tensor& x, const torch::Tensor& gy) {
  constexpr int64_t kGroup = 8;
  const int64_t n = x.size(0), in = x.size(1), h = x.size(2), w = x.size(3), out = gy.size(1);
  const int64_t groups = (n + kGroup - 1) / kGroup, size = 16 * in * out;
  std::vector<float> du(std::max<int64_t>(groups, 1) * size, 0.0f);  // zeros for an empty batch
  const float *xp = x.data_ptr<float>(), *gp = gy.data_ptr<float>();
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    thread_local Scratch scratch;
    for (int64_t k = begin; k < end; ++k) {
      for (int64_t i = k * kGroup; i < std::min(n, (k + 1) * kGroup); ++i) {
        ImageWeightGrad(xp + i * in * h * w, gp + i * out * h * w, in, h, w, out, du.data() + k * size, &scratch);
      }
    }
  });
  for (int64_t k = 1; k < groups; ++k) {
    for (int64_t e = 0; e < size; ++e) du[e] += du[k * size + e];
  }
  // dw = Gt du G for each (o, i); Gt = [1 .5 .5 0; 0 .5 -.5 0; 0 .5 .5 1].
  static constexpr float kGt[3][4] = {{1, 0.5f, 0.5f, 0}, {0, 0.5f, -0.5f, 0}, {0, 0.5f, 0.5f, 1}};
  torch::Tensor dw = torch::empty({out, in, 3, 3}, x.options());
  float* dwp = dw.data_ptr<float>();
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t i = 0; i < in; ++i) {
      float t[3][4] = {};  // Gt du
      for (int r = 0; r < 3; ++r) {
        for (int a = 0; a < 4; ++a) {
          for (int b = 0; b < 4; ++b) t[r][b] += kGt[r][a] * du[((a * 4 + b) * in + i) * out + o];
        }
      }
      for (int r = 0; r < 3; ++r) {
        for (int c = 0; c < 3; ++c) {
          float sum = 0;
          for (int b = 0; b < 4; ++b) sum += t[r][b] * kGt[c][b];
          dwp[((o * in + i) * 3 + r) * 3 + c] = sum;
        }
      }
    }
  }
  return dw;
}

const bool kWinograd = [] {
  __builtin_cpu_init();  // a static initializer may run before libgcc's own
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}();

// y = the convolution of x (N x in x H x W) whose transformed kernels are u, plus bias if given.
torch::Tensor Convolve(const torch::Tensor& x, const std::vector<float>& u, const float* bias, int64_t out) {
  const int64_t n = x.size(0), in = x.size(1), h = x.size(2), w = x.size(3);
  torch::Tensor y = torch::empty({n, out, h, w}, x.options());
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
    thread_local Scratch scratch;
    for (int64_t i = begin; i < end; ++i) {
      Image(xp + i * in * h * w, in, h, w, u.data(), bias, out, yp + i * out * h * w, &scratch);
    }
  });
  return y;
}

class WinogradFunction : public torch::autograd::Function<WinogradFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, torch::Tensor weight, torch::Tensor bias) {
    x = x.contiguous();
    weight = weight.contiguous();
    bias = bias.contiguous();
    const int64_t o = weight.size(0), i = weight.size(1);
    std::vector<float> u(16 * i * o);
    WeightTransform(weight.data_ptr<float>(), o, i, /*flip=*/false, u.data());
    ctx->save_for_backward({x, weight});
    return Convolve(x, u, bias.data_ptr<float>(), o);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& weight = saved[1];
    const torch::Tensor g = grads[0].contiguous();
    const int64_t o = weight.size(0), i = weight.size(1);
    torch::Tensor dx;
    if (ctx->needs_input_grad(0)) {  // the convolution of g with the rotated kernels, o -> i
      std::vector<float> u(16 * o * i);
      WeightTransform(weight.data_ptr<float>(), o, i, /*flip=*/true, u.data());
      dx = Convolve(g, u, nullptr, i);
    }
    torch::Tensor dw = ctx->needs_input_grad(1) ? WeightGrad(x, g) : torch::Tensor();
    torch::Tensor db = ctx->needs_input_grad(2) ? g.sum({0, 2, 3}) : torch::Tensor();
    return {dx, dw, db};
  }
};
#else
const bool kWinograd = false;
#endif

}  // namespace

bool WinogradConvolutions() { return kWinograd; }

torch::Tensor Conv3x3Winograd(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  TORCH_CHECK(x.dim() == 4 && x.scalar_type() == torch::kFloat32 && x.device().is_cpu() && x.size(1) % 16 == 0 &&
                  x.size(2) % 2 == 0 && x.size(3) % 2 == 0,
              "Conv3x3Winograd takes an N x C x H x W float CPU tensor, C a multiple of 16, H and W even");
  TORCH_CHECK(weight.dim() == 4 && weight.size(0) % 16 == 0 && weight.size(1) == x.size(1) && weight.size(2) == 3 &&
                  weight.size(3) == 3 && bias.dim() == 1 && bias.size(0) == weight.size(0) &&
                  weight.scalar_type() == torch::kFloat32 && bias.scalar_type() == torch::kFloat32 &&
                  weight.device().is_cpu() && bias.device().is_cpu(),
              "Conv3x3Winograd takes an O x C x 3 x 3 float CPU weight, O a multiple of 16, and an O-long bias");
#if defined(__x86_64__)
  if (kWinograd) return WinogradFunction::apply(x, weight, bias);
#endif
  return torch::conv2d(x, weight, bias, 1, 1);
}

}  // namespace trainctl::models
