// The 2 x 2 max-pool (and ReLU) of 8 windows in AVX2 registers, for MaxPool2x2Relu and for the
// convolutions that pool their own output before writing it (kernels/ops.cc, kernels/conv_pool.cc).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace trainctl::kernels {

// Where a window's gradient goes: the first (0-3, row-major: a b / c d) of its four that equals
// the output; with a ReLU, none where the output is not positive.
constexpr uint8_t kNoWindow = 4;

#if defined(__x86_64__)
// relu(max(a, b, c, d)) lane by lane (kRelu false: max(a, b, c, d)), NaN propagating as ATen's
// max_pool2d does, and each lane's winner (or kNoWindow, with kRelu) as an int32. Branch-free.
template <bool kRelu = true>
__attribute__((target("avx2"))) inline __m256 MaxPool8(__m256 a, __m256 b, __m256 c, __m256 d, __m256i* win) {
  __m256 m = _mm256_max_ps(_mm256_max_ps(a, b), _mm256_max_ps(c, d));
  const __m256 nan = _mm256_or_ps(_mm256_cmp_ps(a, b, _CMP_UNORD_Q), _mm256_cmp_ps(c, d, _CMP_UNORD_Q));
  m = _mm256_blendv_ps(m, _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d)), nan);
  if constexpr (kRelu) m = _mm256_max_ps(_mm256_setzero_ps(), m);  // max returns a NaN second operand
  // Later candidates first, so that the first equal one is what remains.
  __m256 k = _mm256_set1_ps(3.0f);
  k = _mm256_blendv_ps(k, _mm256_set1_ps(2.0f), _mm256_cmp_ps(c, m, _CMP_EQ_OQ));
  k = _mm256_blendv_ps(k, _mm256_set1_ps(1.0f), _mm256_cmp_ps(b, m, _CMP_EQ_OQ));
  k = _mm256_blendv_ps(k, _mm256_setzero_ps(), _mm256_cmp_ps(a, m, _CMP_EQ_OQ));
  if constexpr (kRelu) {
    k = _mm256_blendv_ps(_mm256_set1_ps(kNoWindow), k, _mm256_cmp_ps(m, _mm256_setzero_ps(), _CMP_GT_OQ));
  }
  *win = _mm256_cvttps_epi32(k);
  return m;
}

// 8 such int32 as 8 bytes at dst, and back.
__attribute__((target("avx2"))) inline void StoreWindows8(__m256i k, uint8_t* dst) {
  const __m128i k16 = _mm_packs_epi32(_mm256_castsi256_si128(k), _mm256_extracti128_si256(k, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(dst), _mm_packus_epi16(k16, k16));
}

__attribute__((target("avx2"))) inline __m256i LoadWindows8(const uint8_t* src) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src)));
}

// The gradient g of 8 windows' outputs where one of their positions won, 0 elsewhere: each
// channel's share of the bias's gradient.
__attribute__((target("avx2"))) inline __m256 WonGrad8(__m256i win, __m256 g) {
  return _mm256_and_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(kNoWindow), win)), g);
}

// The gradient g of 8 windows' outputs as it reaches their position q (0-3): g where q won, 0
// elsewhere.
__attribute__((target("avx2"))) inline __m256 WindowGrad8(__m256i win, __m256 g, int q) {
  return _mm256_and_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(win, _mm256_set1_epi32(q))), g);
}
#endif

}  // namespace trainctl::kernels
