// The vector widths the CPU kernels are written once for (kernels/*_simd.inc): a `V` per width,
// in a namespace of its own compiled for that instruction set (avx2: 8 floats a register, with
// FMA; avx512: 16). A kernel's body is included once in each namespace, so the same text becomes
// each width's code and no instruction of the wider set reaches the narrower one. Every operation
// is one instruction's arithmetic, the same in both: a body's results are the same bits at either
// width, which kernels_test checks.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace trainctl::kernels::avx2 {
struct V {
  using F = __m256;
  static constexpr int kLanes = 8;
  static F Zero() { return _mm256_setzero_ps(); }
  static F Set(float v) { return _mm256_set1_ps(v); }
  static F Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static F Add(F a, F b) { return _mm256_add_ps(a, b); }
  static F Sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F Fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }  // a * b + c, one rounding
  // max(floor, v), with v's NaN kept (the second operand, as maxps returns it).
  static F Floor(F floor, F v) { return _mm256_max_ps(floor, v); }
  // g where y > 0, else 0.
  static F WherePositive(F y, F g) { return _mm256_and_ps(_mm256_cmp_ps(y, _mm256_setzero_ps(), _CMP_GT_OQ), g); }
  // Floors e of a row of registers, 8 at a time (the pooling's width): here the registers.
  static __m256 Eight(const F* regs, int e) { return regs[e]; }
  // A register made of the 8-float groups fn(0), fn(1)...: here one.
  template <typename Fn>
  static F Eights(const Fn& fn) {
    return fn(0);
  }
  // Sums of a register's floats in double, lane by lane: lo the first half, hi the second.
  struct Acc {
    __m256d lo, hi;
    Acc() : lo(_mm256_setzero_pd()), hi(_mm256_setzero_pd()) {}  // not implicit: it would lack the target
    void Add(F v) {
      lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
      hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
    }
    void StoreAdding(double* p) const {
      _mm256_storeu_pd(p, _mm256_add_pd(_mm256_loadu_pd(p), lo));
      _mm256_storeu_pd(p + 4, _mm256_add_pd(_mm256_loadu_pd(p + 4), hi));
    }
  };
};
}  // namespace trainctl::kernels::avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f")
namespace trainctl::kernels::avx512 {
struct V {
  using F = __m512;
  static constexpr int kLanes = 16;
  static F Zero() { return _mm512_setzero_ps(); }
  static F Set(float v) { return _mm512_set1_ps(v); }
  static F Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static F Add(F a, F b) { return _mm512_add_ps(a, b); }
  static F Sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F Fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  // floor where it is the greater, else v (NaN included), as AVX2's maxps; not _mm512_max_ps,
  // which GCC 12 builds on an undefined register (-Wmaybe-uninitialized).
  static F Floor(F floor, F v) { return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(floor, v, _CMP_GT_OQ), v, floor); }
  static F WherePositive(F y, F g) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(y, _mm512_setzero_ps(), _CMP_GT_OQ), g);
  }
  // By vector shuffles: GCC 12's extract and insert intrinsics start from an undefined register,
  // and -Wmaybe-uninitialized says so wherever they are inlined.
  static __m256 Eight(const F* regs, int e) {
    const F v = regs[e / 2];
    return e % 2 == 0 ? __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7)
                      : __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  }
  template <typename Fn>
  static F Eights(const Fn& fn) {
    const __m256 lo = fn(0), hi = fn(1);
    return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  }
  struct Acc {
    __m512d lo, hi;
    Acc() : lo(_mm512_setzero_pd()), hi(_mm512_setzero_pd()) {}
    // By vector builtins: GCC 12's conversion intrinsic starts from an undefined register, and
    // -Wmaybe-uninitialized says so wherever it is inlined.
    void Add(F v) {
      lo = _mm512_add_pd(lo, __builtin_convertvector(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7), __m512d));
      hi = _mm512_add_pd(hi,
                         __builtin_convertvector(__builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15), __m512d));
    }
    void StoreAdding(double* p) const {
      _mm512_storeu_pd(p, _mm512_add_pd(_mm512_loadu_pd(p), lo));
      _mm512_storeu_pd(p + 8, _mm512_add_pd(_mm512_loadu_pd(p + 8), hi));
    }
  };
};
}  // namespace trainctl::kernels::avx512
#pragma GCC pop_options
#endif
