// The CNN's two convolution layers on the CPU (kernels/ops.h), each relu(max_pool2d(conv3x3(x) + b,
// 2)) (or without the relu) in kernels of our own on AVX2 and FMA: the convolution's output is pooled while it is still
// in cache, and backward builds the convolution's output gradient from the pooled one and the
// window bytes, an image at a time. Between the two layers the activation and its gradient are
// channels-last (N x H x W x C in memory, PyTorch's ChannelsLast memory format): what both
// layers' kernels read and write with whole-register loads, 8 channels at a time.
//
// The first layer (ImageConvPoolRelu), on an image of 1 or 3 channels, directly: a window's
// 2 x 2 outputs for 16 channels are summed over the 9 x C taps in registers and pooled there; the
// weight's gradient takes each window's gradient only at the position that won it. Neither the
// convolution's output nor its gradient (P positions x O channels) goes to memory.
//
// The second (ConvPoolRelu) by Winograd's F(2x2, 3x3). Each 2 x 2 block of outputs (a tile) comes
// from the 4 x 4 block of inputs around it. With
//   Bt = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1],
//   At = [1 1 1 0; 0 1 -1 -1],
// the tile's output for output channel o is At (sum_i (G w[o][i] Gt) .* (Bt x_i B)) A: the 16
// positions of the transformed 4 x 4 blocks are 16 independent matrix products
//   M[p] (tiles x O) = V[p] (tiles x I) * U[p] (I x O),
// 16 multiplications a tile and channel pair instead of 4 x 9 = 36 (2.25x fewer); the
// transforms are additions. A tile's 2 x 2 outputs are exactly one pooling window: the output
// transform pools them in registers. One image at a time, so that its transformed input
// (16 x tiles x I) and products (16 x tiles x O) stay in the core's L2 cache.
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "common/cpus.h"
#include "kernels/ops.h"
#include "kernels/pool_avx2.h"
#include "kernels/simd.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace trainctl::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

#if defined(__x86_64__)
// Room for n floats in buf, which grows and never shrinks: a buffer that serves two shapes in
// turn (the backward's 32 and 64 channels) is not refilled with zeros at each change.
inline void Room(std::vector<float>* buf, size_t n) {
  if (buf->size() < n) buf->resize(n);
}

// G x for a column x of 3: 4 values, G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1].
__attribute__((target("avx2,fma"))) inline void KernelColumn(__m256 x0, __m256 x1, __m256 x2, __m256 y[4]) {
  const __m256 half = _mm256_set1_ps(0.5f);
  y[0] = x0;
  y[1] = _mm256_mul_ps(half, _mm256_add_ps(_mm256_add_ps(x0, x1), x2));
  y[2] = _mm256_mul_ps(half, _mm256_add_ps(_mm256_sub_ps(x0, x1), x2));
  y[3] = x2;
}

// U[p][i][o] = (G g Gt)[p] for the 3 x 3 kernel g from input channel i to output channel o of a
// weight O x I x 3 x 3. For the input gradient (`flip`) the roles swap: the kernel from the
// output's gradient channel o to input channel i is w[o][i] rotated by 180 degrees, so U is then
// [p][o][i] (its inputs are the O channels of the gradient).
__attribute__((target("avx2,fma"))) void WeightTransform(const float* w, int64_t o_count, int64_t i_count, bool flip,
                                                         float* u) {
  const int64_t in = flip ? o_count : i_count, out = flip ? i_count : o_count;
  // The kernels as rows x 9 taps x columns, so that 8 columns' tap is one load (I and O are
  // multiples of 16).
  thread_local std::vector<float> taps;
  Room(&taps, in * 9 * out);
  for (int64_t o = 0; o < o_count; ++o) {
    for (int64_t i = 0; i < i_count; ++i) {
      const float* k = w + (o * i_count + i) * 9;
      const int64_t row = flip ? o : i, col = flip ? i : o;
      for (int e = 0; e < 9; ++e) taps[(row * 9 + e) * out + col] = k[flip ? 8 - e : e];
    }
  }
  for (int64_t row = 0; row < in; ++row) {
    for (int64_t col = 0; col < out; col += 8) {
      const float* k = taps.data() + row * 9 * out + col;
      __m256 t[3][4];  // G g, by columns
      for (int c = 0; c < 3; ++c) {
        KernelColumn(_mm256_loadu_ps(k + c * out), _mm256_loadu_ps(k + (3 + c) * out),
                     _mm256_loadu_ps(k + (6 + c) * out), t[c]);
      }
      for (int r = 0; r < 4; ++r) {  // (G g) Gt: row r of G g through G
        __m256 v[4];
        KernelColumn(t[0][r], t[1][r], t[2][r], v);
        for (int c = 0; c < 4; ++c) _mm256_storeu_ps(u + ((r * 4 + c) * in + row) * out + col, v[c]);
      }
    }
  }
}

}  // namespace

// Gemm's blocks at each vector width: one text, kernels/gemm_simd.inc.
#define TRAINCTL_SIMD_BODY "kernels/gemm_simd.inc"
#include "kernels/each_width.inc"

namespace {

// Relaxed: set by tests between calls, read by every product.
std::atomic<bool> avx512_products{CpuHasAvx512()};

// C (rows x cols, row stride cols) = or += A B, A rows x k with strides (a_row, a_k), B k x cols
// (row stride cols), cols a multiple of 16: blocks of 6 rows by 16 columns; on AVX-512 by 32
// columns (a last 16 by 16).
__attribute__((target("avx2,fma"))) void Gemm(const float* a, int64_t rows, int64_t a_row, int64_t a_k, const float* b,
                                              int64_t k, int64_t cols, float* c, bool add) {
  if (avx512_products.load(std::memory_order_relaxed)) {
    int64_t j = 0;
    for (; j + 32 <= cols; j += 32) avx512::Strip<2>(a, rows, a_row, a_k, b + j, k, cols, c + j, add);
    if (j < cols) avx512::Strip<1>(a, rows, a_row, a_k, b + j, k, cols, c + j, add);
    return;
  }
  for (int64_t j = 0; j < cols; j += 16) avx2::Strip<2>(a, rows, a_row, a_k, b + j, k, cols, c + j, add);
}

// An h x w x c plane in a zero border of 1: zeroed only when its shape changes (not only its
// size: a plane of 6 x 10 would otherwise keep data where one of 10 x 6 has its border); whoever
// fills it writes only the inside.
struct Plane {
  std::vector<float> data;
  int64_t c = 0, h = 0, w = 0;
};

struct Scratch {
  // One image's input H x W x I and its output's gradient H x W x O, each bordered; V; M; an
  // output (or a gradient) with the channels of a position adjacent; the first layer's image,
  // bordered.
  Plane hwc, ghwc, image;
  std::vector<float> v, m, out;
};

// The plane's (h + 2) x (w + 2) x c floats for an h x w x c inside, its border zero.
inline float* Bordered(Plane* plane, int64_t c, int64_t h, int64_t w) {
  if (plane->c != c || plane->h != h || plane->w != w) {
    plane->data.assign(static_cast<size_t>((h + 2) * (w + 2) * c), 0.0f);
    plane->c = c;
    plane->h = h;
    plane->w = w;
  }
  return plane->data.data();
}

// dst (cols x rows) = src (rows x cols) transposed, dst[j * rows + i] = src[i * cols + j]: 8 x 8
// blocks in registers, what is left of the edges one by one.
__attribute__((target("avx2,fma"))) void Transpose(const float* src, int64_t rows, int64_t cols, float* dst) {
  const int64_t r8 = rows / 8 * 8, c8 = cols / 8 * 8;
  for (int64_t i = 0; i < r8; i += 8) {
    for (int64_t j = 0; j < c8; j += 8) {
      __m256 r[8], t[8], s[8];
      for (int k = 0; k < 8; ++k) r[k] = _mm256_loadu_ps(src + (i + k) * cols + j);
      for (int k = 0; k < 8; k += 2) {  // rows k, k + 1 interleaved: r0 r1 pairs of columns 0 1 | 4 5, 2 3 | 6 7
        t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
        t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
      }
      for (int k = 0; k < 8; k += 4) {  // 4 rows' column q | q + 4 in s[k + q]
        s[k] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(1, 0, 1, 0));
        s[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(3, 2, 3, 2));
        s[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(1, 0, 1, 0));
        s[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(3, 2, 3, 2));
      }
      for (int q = 0; q < 4; ++q) {
        _mm256_storeu_ps(dst + (j + q) * rows + i, _mm256_permute2f128_ps(s[q], s[q + 4], 0x20));
        _mm256_storeu_ps(dst + (j + q + 4) * rows + i, _mm256_permute2f128_ps(s[q], s[q + 4], 0x31));
      }
    }
  }
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = i < r8 ? c8 : 0; j < cols; ++j) dst[j * rows + i] = src[i * cols + j];
  }
}

// A plane of n positions of c channels from channels-first (src[ch * n + q]) to channels-last
// (dst[q * c + ch]), and back.
inline void ChannelsLast(const float* src, int64_t c, int64_t n, float* dst) { Transpose(src, c, n, dst); }
inline void ChannelsFirst(const float* src, int64_t c, int64_t n, float* dst) { Transpose(src, n, c, dst); }

// V[p][t][i] = (Bt d B)[p] for each tile t's 4 x 4 block d of channel i of hwc, an h x w x c
// plane in a zero border (h and w even), into s->v. 8 channels at a time, whole-register loads.
__attribute__((target("avx2,fma"))) void TransformTiles(const float* hwc, int64_t c, int64_t h, int64_t w, Scratch* s) {
  const int64_t wp = w + 2, th = h / 2, tw = w / 2, tiles = th * tw;
  Room(&s->v, 16 * tiles * c);
  float* v = s->v.data();
  for (int64_t ty = 0; ty < th; ++ty) {
    for (int64_t tx = 0; tx < tw; ++tx) {
      const int64_t t = ty * tw + tx;
      for (int64_t ch = 0; ch < c; ch += 8) {
        __m256 d[4][4], b[4][4];
        for (int r = 0; r < 4; ++r) {
          for (int q = 0; q < 4; ++q) d[r][q] = _mm256_loadu_ps(hwc + ((2 * ty + r) * wp + 2 * tx + q) * c + ch);
        }
        for (int q = 0; q < 4; ++q) {  // Bt d
          b[0][q] = _mm256_sub_ps(d[0][q], d[2][q]);
          b[1][q] = _mm256_add_ps(d[1][q], d[2][q]);
          b[2][q] = _mm256_sub_ps(d[2][q], d[1][q]);
          b[3][q] = _mm256_sub_ps(d[1][q], d[3][q]);
        }
        for (int r = 0; r < 4; ++r) {  // (Bt d) B
          float* vp = v + ((r * 4) * tiles + t) * c + ch;
          _mm256_storeu_ps(vp, _mm256_sub_ps(b[r][0], b[r][2]));
          _mm256_storeu_ps(vp + tiles * c, _mm256_add_ps(b[r][1], b[r][2]));
          _mm256_storeu_ps(vp + 2 * tiles * c, _mm256_sub_ps(b[r][2], b[r][1]));
          _mm256_storeu_ps(vp + 3 * tiles * c, _mm256_sub_ps(b[r][1], b[r][3]));
        }
      }
    }
  }
}

// The same for one image's input x (h x w x in, channels-last), by way of s->hwc.
__attribute__((target("avx2,fma"))) void TransformInput(const float* x, int64_t in, int64_t h, int64_t w, Scratch* s) {
  float* hwc = Bordered(&s->hwc, in, h, w);
  for (int64_t r = 0; r < h; ++r) {
    std::memcpy(hwc + ((r + 1) * (w + 2) + 1) * in, x + r * w * in, w * in * sizeof(float));
  }
  TransformTiles(hwc, in, h, w, s);
}

// M[p] (tiles x out) = V[p] (tiles x in) U[p] (in x out) for the 16 positions, into s->m.
void Products(const float* u, int64_t tiles, int64_t in, int64_t out, Scratch* s) {
  Room(&s->m, 16 * tiles * out);
  for (int64_t p = 0; p < 16; ++p) {
    Gemm(s->v.data() + p * tiles * in, tiles, in, 1, u + p * in * out, in, out, s->m.data() + p * tiles * out,
         /*add=*/false);
  }
}

// Tile t's 2 x 2 outputs At m A (o[row][column]) for the 8 channels from c, of M (16 x tiles x out).
__attribute__((target("avx2,fma"))) inline void TileOutputs(const float* m, int64_t tiles, int64_t t, int64_t out,
                                                            int64_t c, __m256 o[2][2]) {
  __m256 mm[4][4], a[2][4];
  for (int r = 0; r < 4; ++r) {
    for (int q = 0; q < 4; ++q) mm[r][q] = _mm256_loadu_ps(m + ((r * 4 + q) * tiles + t) * out + c);
  }
  for (int q = 0; q < 4; ++q) {  // At m
    a[0][q] = _mm256_add_ps(_mm256_add_ps(mm[0][q], mm[1][q]), mm[2][q]);
    a[1][q] = _mm256_sub_ps(_mm256_sub_ps(mm[1][q], mm[2][q]), mm[3][q]);
  }
  for (int r = 0; r < 2; ++r) {  // (At m) A
    o[r][0] = _mm256_add_ps(_mm256_add_ps(a[r][0], a[r][1]), a[r][2]);
    o[r][1] = _mm256_sub_ps(_mm256_sub_ps(a[r][1], a[r][2]), a[r][3]);
  }
}

// One image's convolution, without bias, of what s->v holds (in channels) by u, to y (h x w x out,
// channels-last).
__attribute__((target("avx2,fma"))) void Image(const float* u, int64_t in, int64_t h, int64_t w, int64_t out, float* y,
                                               Scratch* s) {
  const int64_t th = h / 2, tw = w / 2, tiles = th * tw;
  Products(u, tiles, in, out, s);
  const float* m = s->m.data();
  for (int64_t ty = 0; ty < th; ++ty) {
    for (int64_t tx = 0; tx < tw; ++tx) {
      for (int64_t c = 0; c < out; c += 8) {
        __m256 tile[2][2];
        TileOutputs(m, tiles, ty * tw + tx, out, c, tile);
        for (int r = 0; r < 2; ++r) {
          float* op = y + ((2 * ty + r) * w + 2 * tx) * out + c;
          _mm256_storeu_ps(op, tile[r][0]);
          _mm256_storeu_ps(op + out, tile[r][1]);
        }
      }
    }
  }
}

// One image x (h x w x in, channels-last) convolved by u, plus bias, each tile's 2 x 2 outputs pooled and
// ReLU'd (R: or not): y (out x h/2 x w/2) and the window bytes win (tiles x out).
template <bool R>
__attribute__((target("avx2,fma"))) void ImagePool(const float* x, int64_t in, int64_t h, int64_t w, const float* u,
                                                   const float* bias, int64_t out, float* y, uint8_t* win, Scratch* s) {
  const int64_t tiles = h / 2 * (w / 2);
  TransformInput(x, in, h, w, s);
  Products(u, tiles, in, out, s);
  Room(&s->out, tiles * out);
  const float* m = s->m.data();
  float* o = s->out.data();
  for (int64_t t = 0; t < tiles; ++t) {
    for (int64_t c = 0; c < out; c += 8) {
      __m256 tile[2][2];
      TileOutputs(m, tiles, t, out, c, tile);
      const __m256 b = _mm256_loadu_ps(bias + c);
      __m256i k;
      _mm256_storeu_ps(o + t * out + c, MaxPool8<R>(_mm256_add_ps(tile[0][0], b), _mm256_add_ps(tile[0][1], b),
                                                    _mm256_add_ps(tile[1][0], b), _mm256_add_ps(tile[1][1], b), &k));
      StoreWindows8(k, win + t * out + c);
    }
  }
  ChannelsFirst(o, out, tiles, y);
}

// The convolution's output gradient, inside the bordered plane ghwc ((h + 2) x (w + 2) x out),
// from one image's pooled gradient gt and window bytes win (both tiles x out): each window's
// gradient where it went, zeros elsewhere. Adds each channel's sum to db.
__attribute__((target("avx2,fma"))) void Unpool(const float* gt, const uint8_t* win, int64_t h, int64_t w, int64_t out,
                                                float* ghwc, float* db) {
  const int64_t th = h / 2, tw = w / 2, wp = w + 2;
  float* dst = ghwc + (wp + 1) * out;  // the inside's first position
  for (int64_t c = 0; c < out; c += 8) {
    __m256 sum = _mm256_loadu_ps(db + c);
    for (int64_t ty = 0; ty < th; ++ty) {
      for (int64_t tx = 0; tx < tw; ++tx) {
        const int64_t t = ty * tw + tx;
        const __m256i k = LoadWindows8(win + t * out + c);
        const __m256 gv = _mm256_loadu_ps(gt + t * out + c);
        sum = _mm256_add_ps(sum, WonGrad8(k, gv));
        for (int r = 0; r < 2; ++r) {
          float* gp = dst + ((2 * ty + r) * wp + 2 * tx) * out + c;
          _mm256_storeu_ps(gp, WindowGrad8(k, gv, 2 * r));
          _mm256_storeu_ps(gp + out, WindowGrad8(k, gv, 2 * r + 1));
        }
      }
    }
    _mm256_storeu_ps(db + c, sum);
  }
}

// One image's share of the transformed weight gradient: du[p] (in x out) += V[p]^T (A gy At)[p],
// for x (h x w x in, channels-last) and the output's gradient gy in s->ghwc: since
// y = At (sum U .* V) A per tile, the gradient of U[p][i][o] is the sum over tiles of
// V[p][t][i] (A gy_t At)[p][o].
__attribute__((target("avx2,fma"))) void ImageWeightGrad(const float* x, int64_t in, int64_t h, int64_t w, int64_t out,
                                                         float* du, Scratch* s) {
  const int64_t wp = w + 2, th = h / 2, tw = w / 2, tiles = th * tw;
  Room(&s->m, 16 * tiles * out);
  const float* ghwc = s->ghwc.data.data() + (wp + 1) * out;
  float* m = s->m.data();
  for (int64_t ty = 0; ty < th; ++ty) {
    for (int64_t tx = 0; tx < tw; ++tx) {
      const int64_t t = ty * tw + tx;
      for (int64_t c = 0; c < out; c += 8) {
        __m256 g[2][2], a[4][2];
        for (int r = 0; r < 2; ++r) {
          for (int q = 0; q < 2; ++q) g[r][q] = _mm256_loadu_ps(ghwc + ((2 * ty + r) * wp + 2 * tx + q) * out + c);
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
  TransformInput(x, in, h, w, s);
  for (int64_t p = 0; p < 16; ++p) {
    // du[p] (in x out) += V[p]^T (in x tiles) G[p] (tiles x out)
    Gemm(s->v.data() + p * tiles * in, in, 1, in, m + p * tiles * out, tiles, out, du + p * in * out, /*add=*/true);
  }
}

// dw (out x in x 3 x 3) = Gt du G for each (o, i) of the transformed weight gradient du
// (16 x in x out); Gt = [1 .5 .5 0; 0 .5 -.5 0; 0 .5 .5 1]. 8 output channels at a time (du's
// adjacent floats), each entry a sum from zero of all four products in order, each product
// rounded before it is added (this file is compiled without FMA contraction).
__attribute__((target("avx2,fma"))) void WeightGradFromTransformed(const float* du, int64_t in, int64_t out,
                                                                   float* dw) {
  static constexpr float kGt[3][4] = {{1, 0.5f, 0.5f, 0}, {0, 0.5f, -0.5f, 0}, {0, 0.5f, 0.5f, 1}};
  for (int64_t i = 0; i < in; ++i) {
    for (int64_t o = 0; o < out; o += 8) {
      __m256 d[4][4], t[3][4];  // du's 4 x 4 for 8 kernels; Gt du
      for (int a = 0; a < 4; ++a) {
        for (int b = 0; b < 4; ++b) d[a][b] = _mm256_loadu_ps(du + ((a * 4 + b) * in + i) * out + o);
      }
      for (int r = 0; r < 3; ++r) {
        for (int b = 0; b < 4; ++b) {
          t[r][b] = _mm256_setzero_ps();
          for (int a = 0; a < 4; ++a) {
            t[r][b] = _mm256_add_ps(t[r][b], _mm256_mul_ps(_mm256_set1_ps(kGt[r][a]), d[a][b]));
          }
        }
      }
      alignas(32) float k[9][8];  // (Gt du) G, tap by tap
      for (int r = 0; r < 3; ++r) {
        for (int c = 0; c < 3; ++c) {
          __m256 sum = _mm256_setzero_ps();
          for (int b = 0; b < 4; ++b) {
            sum = _mm256_add_ps(sum, _mm256_mul_ps(t[r][b], _mm256_set1_ps(kGt[c][b])));
          }
          _mm256_store_ps(k[r * 3 + c], sum);
        }
      }
      for (int l = 0; l < 8; ++l) {
        for (int e = 0; e < 9; ++e) dw[((o + l) * in + i) * 9 + e] = k[e][l];
      }
    }
  }
}

// The first layer, on x (c x h x w, channels-first) as a bordered h x w x c plane in s->image.
// The tap k = 9 ch + 3 i + j of output position (r, col) is x[ch][r + i - 1][col + j - 1], zero
// outside: the plane at (r + i, col + j). Every sum below runs over the taps in the order of k
// (the forward) or over the positions in row-major order (the weight's gradient), each step one
// FMA from zero or from what the sum held: what the matrix products cols^T W^T and cols G would
// give, cols the image's 9c shifted copies and G the convolution's output gradient, without
// either in memory.
const float* BorderedImage(const float* x, int64_t c, int64_t h, int64_t w, Scratch* s) {
  float* plane = Bordered(&s->image, c, h, w);
  for (int64_t ch = 0; ch < c; ++ch) {
    for (int64_t r = 0; r < h; ++r) {
      float* row = plane + ((r + 1) * (w + 2) + 1) * c + ch;
      const float* src = x + (ch * h + r) * w;
      for (int64_t col = 0; col < w; ++col) row[col * c] = src[col];
    }
  }
  return plane;
}

// db += the sum over `tiles` windows of the gradient g (tiles x out) that each window's winner
// (win) takes, windows in order, 8 channels at a time.
__attribute__((target("avx2,fma"))) void ImageBiasGrad(const float* g, const uint8_t* win, int64_t tiles, int64_t out,
                                                       float* db) {
  for (int64_t o = 0; o < out; o += 8) {
    __m256 sum = _mm256_loadu_ps(db + o);
    for (int64_t t = 0; t < tiles; ++t) {
      sum = _mm256_add_ps(sum, WonGrad8(LoadWindows8(win + t * out + o), _mm256_loadu_ps(g + t * out + o)));
    }
    _mm256_storeu_ps(db + o, sum);
  }
}

}  // namespace

// The first layer's kernels at each vector width: one text, kernels/image_layer_simd.inc.
#define TRAINCTL_SIMD_BODY "kernels/image_layer_simd.inc"
#include "kernels/each_width.inc"

namespace {

// dst[e] += src[e] for n floats.
__attribute__((target("avx2,fma"))) void AddTo(float* dst, const float* src, int64_t n) {
  int64_t e = 0;
  for (; e + 8 <= n; e += 8) {
    _mm256_storeu_ps(dst + e, _mm256_add_ps(_mm256_loadu_ps(dst + e), _mm256_loadu_ps(src + e)));
  }
  for (; e < n; ++e) dst[e] += src[e];
}

// sum over the n images of fn(i, partial), `size` floats: images in fixed groups of 8 among
// LibTorch's threads, each group's sum apart, then the groups' sums in order, so that the result
// is the same whatever the number of threads. Zeros for no images.
template <typename Fn>
std::vector<float> SumOverImages(int64_t n, int64_t size, const Fn& fn) {
  constexpr int64_t kGroup = 8;
  const int64_t groups = (n + kGroup - 1) / kGroup;
  std::vector<float> sums(std::max<int64_t>(groups, 1) * size, 0.0f);
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      for (int64_t i = k * kGroup; i < std::min(n, (k + 1) * kGroup); ++i) fn(i, sums.data() + k * size);
    }
  });
  for (int64_t k = 1; k < groups; ++k) AddTo(sums.data(), sums.data() + k * size, size);
  sums.resize(size);
  return sums;
}

const bool kAvx2Fma = CpuHasAvx2Fma();

torch::Tensor ChannelsLastEmpty(torch::IntArrayRef sizes, const torch::TensorOptions& options) {
  return torch::empty(sizes, options.memory_format(at::MemoryFormat::ChannelsLast));
}

using ImageLayerFn = void (*)(const float*, int64_t, int64_t, int64_t, const float*, const float*, int64_t, float*,
                              uint8_t*, Scratch*);
// [AVX-512][relu][c == 1]
const ImageLayerFn kImageLayer[2][2][2] = {{{avx2::ImageLayerForward<0, false>, avx2::ImageLayerForward<1, false>},
                                            {avx2::ImageLayerForward<0, true>, avx2::ImageLayerForward<1, true>}},
                                           {{avx512::ImageLayerForward<0, false>, avx512::ImageLayerForward<1, false>},
                                            {avx512::ImageLayerForward<0, true>, avx512::ImageLayerForward<1, true>}}};
using ImageGradFn = void (*)(const float*, int64_t, int64_t, int64_t, const float*, const uint8_t*, int64_t, float*,
                             float*, Scratch*);
// [AVX-512][c == 1]
const ImageGradFn kImageGrad[2][2] = {{avx2::ImageLayerBackward<0>, avx2::ImageLayerBackward<1>},
                                      {avx512::ImageLayerBackward<0>, avx512::ImageLayerBackward<1>}};

class ImageConvPoolFunction : public torch::autograd::Function<ImageConvPoolFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, torch::Tensor weight, torch::Tensor bias,
                               bool relu) {
    x = x.contiguous();
    bias = bias.contiguous();
    const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3), out = weight.size(0);
    const int64_t tiles = h / 2 * (w / 2);
    const torch::Tensor wt = weight.reshape({out, 9 * c}).t().contiguous();
    torch::Tensor y = ChannelsLastEmpty({n, out, h / 2, w / 2}, x.options());
    torch::Tensor win = torch::empty({n, tiles, out}, torch::kUInt8);  // our order: tiles x channels
    const float *xp = x.data_ptr<float>(), *wtp = wt.data_ptr<float>(), *bp = bias.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    uint8_t* winp = win.data_ptr<uint8_t>();
    const ImageLayerFn layer = kImageLayer[avx512_products.load(std::memory_order_relaxed)][relu][c == 1];
    at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
      thread_local Scratch scratch;
      for (int64_t i = begin; i < end; ++i) {
        layer(xp + i * c * h * w, c, h, w, wtp, bp, out, yp + i * tiles * out, winp + i * tiles * out, &scratch);
      }
    });
    ctx->save_for_backward({x, win});
    return y;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const uint8_t* winp = saved[1].data_ptr<uint8_t>();
    const torch::Tensor g = grads[0].contiguous(at::MemoryFormat::ChannelsLast);
    const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3), out = g.size(1);
    const int64_t tiles = h / 2 * (w / 2), k = 9 * c;
    const float *xp = x.data_ptr<float>(), *gp = g.data_ptr<float>();
    // dwt (9c x out), then db (out).
    const ImageGradFn grad = kImageGrad[avx512_products.load(std::memory_order_relaxed)][c == 1];
    std::vector<float> sums = SumOverImages(n, k * out + out, [&](int64_t i, float* sum) {
      thread_local Scratch scratch;
      grad(xp + i * c * h * w, c, h, w, gp + i * tiles * out, winp + i * tiles * out, out, sum, sum + k * out,
           &scratch);
    });
    torch::Tensor dwt = torch::from_blob(sums.data(), {k, out}, g.options());
    torch::Tensor db = torch::from_blob(sums.data() + k * out, {out}, g.options());
    return {torch::Tensor(), dwt.t().reshape({out, c, 3, 3}).contiguous(), db.clone(), torch::Tensor()};
  }
};

class ConvPoolFunction : public torch::autograd::Function<ConvPoolFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, torch::Tensor weight, torch::Tensor bias,
                               bool relu) {
    x = x.contiguous(at::MemoryFormat::ChannelsLast);  // as the first layer leaves it
    weight = weight.contiguous();
    bias = bias.contiguous();
    const int64_t n = x.size(0), in = x.size(1), h = x.size(2), w = x.size(3), out = weight.size(0);
    const int64_t tiles = h / 2 * (w / 2);
    std::vector<float> u(16 * in * out);
    WeightTransform(weight.data_ptr<float>(), out, in, /*flip=*/false, u.data());
    // N x C x H x W, for the linear layer after it.
    torch::Tensor y = torch::empty({n, out, h / 2, w / 2}, x.options());
    torch::Tensor win = torch::empty({n, tiles, out}, torch::kUInt8);  // our order: tiles x channels
    const float *xp = x.data_ptr<float>(), *bp = bias.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    uint8_t* wp = win.data_ptr<uint8_t>();
    at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
      thread_local Scratch scratch;
      for (int64_t i = begin; i < end; ++i) {
        (relu ? ImagePool<true> : ImagePool<false>)(xp + i * in * h * w, in, h, w, u.data(), bp, out,
                                                    yp + i * out * tiles, wp + i * tiles * out, &scratch);
      }
    });
    ctx->save_for_backward({x, weight, win});
    return y;
  }

  // An image's output gradient is built once and serves both the input's gradient and the
  // weight's.
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& weight = saved[1];
    const uint8_t* winp = saved[2].data_ptr<uint8_t>();
    const torch::Tensor g = grads[0].contiguous();
    const int64_t n = x.size(0), in = x.size(1), h = x.size(2), w = x.size(3), out = weight.size(0);
    const int64_t tiles = h / 2 * (w / 2), size = 16 * in * out;
    const bool want_dx = ctx->needs_input_grad(0), want_dw = ctx->needs_input_grad(1);
    torch::Tensor dx = want_dx ? ChannelsLastEmpty({n, in, h, w}, x.options()) : torch::Tensor();
    std::vector<float> u;  // the convolution of the output's gradient with the rotated kernels, out -> in
    if (want_dx) {
      u.resize(16 * out * in);
      WeightTransform(weight.data_ptr<float>(), out, in, /*flip=*/true, u.data());
    }
    const float *xp = x.data_ptr<float>(), *gp = g.data_ptr<float>();
    float* dxp = want_dx ? dx.data_ptr<float>() : nullptr;
    // du (16 x in x out), then db (out).
    std::vector<float> sums = SumOverImages(n, size + out, [&](int64_t i, float* du) {
      thread_local Scratch s;
      Room(&s.out, tiles * out);
      ChannelsLast(gp + i * out * tiles, out, tiles, s.out.data());
      float* ghwc = Bordered(&s.ghwc, out, h, w);
      Unpool(s.out.data(), winp + i * tiles * out, h, w, out, ghwc, du + size);
      if (want_dx) {
        TransformTiles(ghwc, out, h, w, &s);
        Image(u.data(), out, h, w, in, dxp + i * in * h * w, &s);
      }
      if (want_dw) ImageWeightGrad(xp + i * in * h * w, in, h, w, out, du, &s);
    });
    torch::Tensor dw, db = torch::from_blob(sums.data() + size, {out}, g.options()).clone();
    if (want_dw) {
      dw = torch::empty({out, in, 3, 3}, x.options());
      WeightGradFromTransformed(sums.data(), in, out, dw.data_ptr<float>());
    }
    return {dx, dw, ctx->needs_input_grad(2) ? db : torch::Tensor(), torch::Tensor()};
  }
};
#else
const bool kAvx2Fma = false;
#endif

}  // namespace

bool WinogradConvolutions() { return kAvx2Fma; }

bool Avx512Products() { return avx512_products.load(std::memory_order_relaxed); }

void AllowAvx512Products(bool allow) {
#if defined(__x86_64__)
  avx512_products.store(allow && CpuHasAvx512(), std::memory_order_relaxed);
#else
  (void)allow;
#endif
}

namespace {

// What both layers take; `image`: the first layer (x takes no gradient) rather than a hidden one
// (C a multiple of 16).
void CheckConvPool(const char* name, const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                   bool image) {
  TORCH_CHECK(x.dim() == 4 && x.scalar_type() == torch::kFloat32 && x.device().is_cpu() && x.size(2) % 2 == 0 &&
                  x.size(3) % 2 == 0 && (image ? !x.requires_grad() : x.size(1) % 16 == 0),
              name, " takes an N x C x H x W float CPU tensor, H and W even, ",
              image ? "that does not require grad" : "C a multiple of 16");
  TORCH_CHECK(weight.dim() == 4 && weight.size(0) % 16 == 0 && weight.size(1) == x.size(1) && weight.size(2) == 3 &&
                  weight.size(3) == 3 && bias.dim() == 1 && bias.size(0) == weight.size(0) &&
                  weight.scalar_type() == torch::kFloat32 && bias.scalar_type() == torch::kFloat32 &&
                  weight.device().is_cpu() && bias.device().is_cpu(),
              name, " takes an O x C x 3 x 3 float CPU weight, O a multiple of 16, and an O-long bias");
}

}  // namespace

// Where the CPU lacks AVX2 or FMA: ATen's convolution, then our pooling.
torch::Tensor ImageConvPoolRelu(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                                bool relu) {
  CheckConvPool("ImageConvPoolRelu", x, weight, bias, /*image=*/true);
#if defined(__x86_64__)
  if (kAvx2Fma) return ImageConvPoolFunction::apply(x, weight, bias, relu);
#endif
  return MaxPool2x2Relu(torch::conv2d(x, weight, bias, 1, 1), relu);
}

torch::Tensor ConvPoolRelu(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias, bool relu) {
  CheckConvPool("ConvPoolRelu", x, weight, bias, /*image=*/false);
#if defined(__x86_64__)
  if (kAvx2Fma) return ConvPoolFunction::apply(x, weight, bias, relu);
#endif
  return MaxPool2x2Relu(torch::conv2d(x, weight, bias, 1, 1), relu);
}

}  // namespace trainctl::kernels
