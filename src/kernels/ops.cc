#include "kernels/ops.h"

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/cpus.h"
#include "kernels/pool_avx2.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace trainctl::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// Forward: out = relu(max of the window a b / c d) (R false: the max alone) and a byte saying
// which of the four gets the window's gradient (kNoWindow, kernels/pool_avx2.h); backward scatters
// the gradient by those bytes alone, without reading the input again.

// B lanes per position: kBlock in the blocked layout (a position's 16 channels side by side), 1 in
// N x C x H x W (a plane is one channel's H x W).
template <int64_t B, bool R>
void PoolForwardPlanePortable(const float* x, int64_t h, int64_t w, float* out, uint8_t* win) {
  for (int64_t i = 0; i < h / 2; ++i) {
    const float* r0 = x + 2 * i * w * B;
    const float* r1 = r0 + w * B;
    for (int64_t k = 0; k < w * B; k += 2 * B) {
      for (int64_t l = 0; l < B; ++l, ++out, ++win) {
        const float a = r0[k + l], b = r0[k + B + l], c = r1[k + l], d = r1[k + B + l];
        float m = std::max(std::max(a, b), std::max(c, d));
        if (a != a || b != b || c != c || d != d) m = a + b + c + d;
        *out = !R || m > 0 || m != m ? m : 0.0f;
        *win = R && !(m > 0) ? kNoWindow : a == m ? 0 : b == m ? 1 : c == m ? 2 : 3;
      }
    }
  }
}

template <int64_t B>
void PoolBackwardPlanePortable(const uint8_t* win, const float* g, int64_t h, int64_t w, float* dx) {
  for (int64_t i = 0; i < h / 2; ++i) {
    const int64_t r0 = 2 * i * w * B, r1 = r0 + w * B;
    for (int64_t k = 0; k < w * B; k += 2 * B) {
      for (int64_t l = 0; l < B; ++l, ++win, ++g) {
        const int64_t p[4] = {r0 + k + l, r0 + k + B + l, r1 + k + l, r1 + k + B + l};
        for (int q = 0; q < 4; ++q) dx[p[q]] = q == *win ? *g : 0.0f;
      }
    }
  }
}

using ForwardFn = void (*)(const float*, int64_t, int64_t, float*, uint8_t*);
using BackwardFn = void (*)(const uint8_t*, const float*, int64_t, int64_t, float*);

#if defined(__x86_64__)
// The same with AVX2, a position's 16 channels as two registers of 8; no branches.
template <bool R>
__attribute__((target("avx2"))) inline __m256 Forward8(const float* a, const float* b, const float* c, const float* d,
                                                       __m256i* win) {
  return MaxPool8<R>(_mm256_loadu_ps(a), _mm256_loadu_ps(b), _mm256_loadu_ps(c), _mm256_loadu_ps(d), win);
}

template <bool R>
__attribute__((target("avx2"))) void PoolForwardPlaneAvx2(const float* x, int64_t h, int64_t w, float* out,
                                                          uint8_t* win) {
  for (int64_t i = 0; i < h / 2; ++i) {
    const float* r0 = x + 2 * i * w * kBlock;
    const float* r1 = r0 + w * kBlock;
    for (int64_t k = 0; k < w * kBlock; k += 2 * kBlock, out += kBlock, win += kBlock) {
      __m256i lo, hi;
      _mm256_storeu_ps(out, Forward8<R>(r0 + k, r0 + k + kBlock, r1 + k, r1 + k + kBlock, &lo));
      _mm256_storeu_ps(out + 8, Forward8<R>(r0 + k + 8, r0 + k + kBlock + 8, r1 + k + 8, r1 + k + kBlock + 8, &hi));
      StoreWindows8(lo, win);
      StoreWindows8(hi, win + 8);
    }
  }
}

__attribute__((target("avx2"))) void PoolBackwardPlaneAvx2(const uint8_t* win, const float* g, int64_t h, int64_t w,
                                                           float* dx) {
  for (int64_t i = 0; i < h / 2; ++i) {
    const int64_t r0 = 2 * i * w * kBlock, r1 = r0 + w * kBlock;
    for (int64_t k = 0; k < w * kBlock; k += 2 * kBlock, win += kBlock, g += kBlock) {
      for (int64_t l = 0; l < kBlock; l += 8) {
        const __m256i v = LoadWindows8(win + l);
        const __m256 gv = _mm256_loadu_ps(g + l);
        float* to[4] = {dx + r0 + k + l, dx + r0 + k + kBlock + l, dx + r1 + k + l, dx + r1 + k + kBlock + l};
        for (int q = 0; q < 4; ++q) _mm256_storeu_ps(to[q], WindowGrad8(v, gv, q));
      }
    }
  }
}

// N x C x H x W: a plane is one channel's rows; 8 windows of a row pair at a time, their left and
// right columns split out of 16 adjacent floats. A row's last block is partial where W/2 is not a
// multiple of 8 (28 -> 14, 14 -> 7): masked loads, and stores through a buffer (a masked store
// costs many times a plain one on AMD's Zen), never past the row's end.
__attribute__((target("avx2"))) inline __m256i FirstLanes(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// n (1-16) floats from p as the even-indexed ones and the odd-indexed ones; lanes past n are 0.
__attribute__((target("avx2"))) inline void LoadPairs(const float* p, int64_t n, __m256* even, __m256* odd) {
  const __m256 lo = n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, FirstLanes(n));
  const __m256 hi = n >= 16 ? _mm256_loadu_ps(p + 8)
                    : n > 8 ? _mm256_maskload_ps(p + 8, FirstLanes(n - 8))
                            : _mm256_setzero_ps();
  *even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0x88)), 0xD8));
  *odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0xDD)), 0xD8));
}

// The inverse: even and odd interleaved, the first n (1-16) floats stored at p.
__attribute__((target("avx2"))) inline void StorePairs(float* p, int64_t n, __m256 even, __m256 odd) {
  const __m256 lo = _mm256_unpacklo_ps(even, odd), hi = _mm256_unpackhi_ps(even, odd);
  const __m256 first = _mm256_permute2f128_ps(lo, hi, 0x20), second = _mm256_permute2f128_ps(lo, hi, 0x31);
  if (n >= 16) {
    _mm256_storeu_ps(p, first);
    _mm256_storeu_ps(p + 8, second);
    return;
  }
  alignas(32) float part[16];
  _mm256_store_ps(part, first);
  _mm256_store_ps(part + 8, second);
  std::copy(part, part + n, p);
}

template <bool R>
__attribute__((target("avx2"))) void PoolForwardNchwAvx2(const float* x, int64_t h, int64_t w, float* out,
                                                         uint8_t* win) {
  const int64_t ow = w / 2;
  for (int64_t i = 0; i < h / 2; ++i, out += ow, win += ow) {
    const float* r0 = x + 2 * i * w;
    const float* r1 = r0 + w;
    for (int64_t j = 0; j < ow; j += 8) {
      const int64_t n = std::min<int64_t>(8, ow - j);
      __m256 a, b, c, d;
      __m256i k;
      LoadPairs(r0 + 2 * j, 2 * n, &a, &b);
      LoadPairs(r1 + 2 * j, 2 * n, &c, &d);
      const __m256 m = MaxPool8<R>(a, b, c, d, &k);
      uint8_t bytes[8];
      StoreWindows8(k, bytes);
      if (n == 8) {
        _mm256_storeu_ps(out + j, m);
      } else {
        alignas(32) float part[8];
        _mm256_store_ps(part, m);
        std::copy(part, part + n, out + j);
      }
      std::memcpy(win + j, bytes, n);
    }
  }
}

__attribute__((target("avx2"))) void PoolBackwardNchwAvx2(const uint8_t* win, const float* g, int64_t h, int64_t w,
                                                          float* dx) {
  const int64_t ow = w / 2;
  for (int64_t i = 0; i < h / 2; ++i, win += ow, g += ow) {
    float* r0 = dx + 2 * i * w;
    float* r1 = r0 + w;
    for (int64_t j = 0; j < ow; j += 8) {
      const int64_t n = std::min<int64_t>(8, ow - j);
      const __m256 gv = n == 8 ? _mm256_loadu_ps(g + j) : _mm256_maskload_ps(g + j, FirstLanes(n));
      uint64_t bytes = 0;
      std::memcpy(&bytes, win + j, n);
      const __m256i v = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(bytes)));
      __m256 q[4];
      for (int s = 0; s < 4; ++s) q[s] = WindowGrad8(v, gv, s);
      StorePairs(r0 + 2 * j, 2 * n, q[0], q[1]);
      StorePairs(r1 + 2 * j, 2 * n, q[2], q[3]);
    }
  }
}

const bool kAvx2 = CpuHasAvx2();
// Indexed by [relu][layout], the layout [0] blocked, [1] N x C x H x W.
const ForwardFn kForward[2][2] = {{kAvx2 ? PoolForwardPlaneAvx2<false> : PoolForwardPlanePortable<kBlock, false>,
                                   kAvx2 ? PoolForwardNchwAvx2<false> : PoolForwardPlanePortable<1, false>},
                                  {kAvx2 ? PoolForwardPlaneAvx2<true> : PoolForwardPlanePortable<kBlock, true>,
                                   kAvx2 ? PoolForwardNchwAvx2<true> : PoolForwardPlanePortable<1, true>}};
const BackwardFn kBackward[2] = {kAvx2 ? PoolBackwardPlaneAvx2 : PoolBackwardPlanePortable<kBlock>,
                                 kAvx2 ? PoolBackwardNchwAvx2 : PoolBackwardPlanePortable<1>};
#else
const ForwardFn kForward[2][2] = {{PoolForwardPlanePortable<kBlock, false>, PoolForwardPlanePortable<1, false>},
                                  {PoolForwardPlanePortable<kBlock, true>, PoolForwardPlanePortable<1, true>}};
const BackwardFn kBackward[2] = {PoolBackwardPlanePortable<kBlock>, PoolBackwardPlanePortable<1>};
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
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, bool relu) {
    x = x.contiguous();
    const bool nchw = x.dim() == 4;
    const int64_t h = x.size(2), w = x.size(3), in = h * w * (nchw ? 1 : kBlock), on = in / 4;
    std::vector<int64_t> sizes = x.sizes().vec();
    sizes[2] = h / 2;
    sizes[3] = w / 2;
    torch::Tensor out = torch::empty(sizes, x.options());
    torch::Tensor win = torch::empty(sizes, torch::kUInt8);
    const float* xp = x.data_ptr<float>();
    float* op = out.data_ptr<float>();
    uint8_t* wp = win.data_ptr<uint8_t>();
    const ForwardFn fn = kForward[relu][nchw];
    ForEachPlane(x.size(0) * x.size(1), [&](int64_t p) { fn(xp + p * in, h, w, op + p * on, wp + p * on); });
    ctx->save_for_backward({win});  // not x: it is freed as soon as nothing else holds it
    ctx->saved_data["input_sizes"] = x.sizes().vec();
    return out;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const torch::Tensor win = ctx->get_saved_variables()[0];
    torch::Tensor g = grads[0].contiguous();
    torch::Tensor dx = torch::empty(ctx->saved_data["input_sizes"].toIntVector(), g.options());
    const bool nchw = dx.dim() == 4;
    const int64_t h = dx.size(2), w = dx.size(3), in = h * w * (nchw ? 1 : kBlock), on = in / 4;
    const uint8_t* wp = win.data_ptr<uint8_t>();
    const float* gp = g.data_ptr<float>();
    float* dp = dx.data_ptr<float>();
    const BackwardFn fn = kBackward[nchw];
    ForEachPlane(dx.size(0) * dx.size(1), [&](int64_t p) { fn(wp + p * on, gp + p * on, h, w, dp + p * in); });
    return {dx, torch::Tensor()};
  }
};

}  // namespace

void CheckBlocked(const torch::Tensor& x, const char* what) {
  TORCH_CHECK(x.dim() == 5 && x.size(4) == kBlock && x.scalar_type() == torch::kFloat32 && x.device().is_cpu(), what,
              " takes a blocked N x C/16 x H x W x 16 float CPU tensor");
}

torch::Tensor ToBlocked(const torch::Tensor& x) {
  TORCH_CHECK(x.dim() == 4 && x.size(1) % kBlock == 0, "ToBlocked takes N x C x H x W, C a multiple of 16");
  if (x.is_contiguous(at::MemoryFormat::ChannelsLast)) {  // N x H x W x C in memory: one copy
    return x.permute({0, 2, 3, 1})
        .reshape({x.size(0), x.size(2), x.size(3), x.size(1) / kBlock, kBlock})
        .permute({0, 3, 1, 2, 4})
        .contiguous();
  }
  return x.reshape({x.size(0), x.size(1) / kBlock, kBlock, x.size(2), x.size(3)}).permute({0, 1, 3, 4, 2}).contiguous();
}

torch::Tensor FromBlocked(const torch::Tensor& x) {
  CheckBlocked(x, "FromBlocked");
  return x.permute({0, 1, 4, 2, 3}).reshape({x.size(0), x.size(1) * kBlock, x.size(2), x.size(3)});
}

torch::Tensor MaxPool2x2Relu(const torch::Tensor& x, bool relu) {
  if (x.dim() != 4) CheckBlocked(x, "MaxPool2x2Relu");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && x.device().is_cpu(), "MaxPool2x2Relu takes a float CPU tensor");
  TORCH_CHECK(x.size(2) % 2 == 0 && x.size(3) % 2 == 0, "MaxPool2x2Relu takes even H and W");
  return PoolFunction::apply(x, relu);
}

}  // namespace trainctl::kernels
