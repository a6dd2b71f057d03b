// This CPU's arithmetic peak on one core, fp32 and bf16, to set the trainer's achieved FLOP/s
// beside (issue 25, part 2): independent chains of AVX-512 fused multiply-adds (16 fp32 lanes,
// 2 FLOP each) and of AVX512-BF16 dot products (vdpbf16ps: 32 bf16 products summed into 16 fp32
// lanes, 64 FLOP), enough chains in flight to hide their latency; on a CPU without AVX-512, chains
// of AVX2 fused multiply-adds (8 fp32 lanes). One thread; pin it with
// taskset for a clean figure. Built on demand: cmake --build build --target peak_flops.
//   build/src/peak_flops [seconds per measurement, default 1]
#include <immintrin.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace {

constexpr int kChains = 12;
constexpr long kInner = 1 << 16;

double Seconds() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// GFLOP/s of `kernel` (which does `flops_per_call` each call) over about `seconds`.
template <typename Kernel>
double Measure(Kernel kernel, double flops_per_call, double seconds) {
  kernel();  // warm up (and let the clock ramp)
  long calls = 0;
  const double start = Seconds();
  double now = start;
  while (now - start < seconds) {
    kernel();
    ++calls;
    now = Seconds();
  }
  return flops_per_call * static_cast<double>(calls) / (now - start) / 1e9;
}

volatile float sink;

// What the chains computed, kept, so that the compiler cannot drop them.
__attribute__((target("avx512f"))) void Keep(__m512 sum) {
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  float total = 0;
  for (float f : lanes) total += f;
  sink = total;
}

__attribute__((target("avx2"))) void Keep(__m256 sum) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  float total = 0;
  for (float f : lanes) total += f;
  sink = total;
}

__attribute__((target("avx512f"))) void Fp32() {
  __m512 acc[kChains];
#pragma GCC unroll 16
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(0.001f);
  for (long n = 0; n < kInner; ++n) {
#pragma GCC unroll 16  // the chains in registers, not in memory
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  __m512 sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm512_add_ps(sum, acc[i]);
  Keep(sum);
}

__attribute__((target("avx2,fma"))) void Fp32Avx2() {
  __m256 acc[kChains];
#pragma GCC unroll 16
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(0.001f);
  for (long n = 0; n < kInner; ++n) {
#pragma GCC unroll 16
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  __m256 sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm256_add_ps(sum, acc[i]);
  Keep(sum);
}

__attribute__((target("avx512f,avx512bf16"))) void Bf16() {
  __m512 acc[kChains];
#pragma GCC unroll 16
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5f), _mm512_set1_ps(0.25f));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.001f), _mm512_set1_ps(0.002f));
  for (long n = 0; n < kInner; ++n) {
#pragma GCC unroll 16
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  __m512 sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm512_add_ps(sum, acc[i]);
  Keep(sum);
}

}  // namespace

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 1.0;
  __builtin_cpu_init();
  const double per_call = static_cast<double>(kInner) * kChains;
  if (!__builtin_cpu_supports("avx512f")) {
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
      std::fprintf(stderr, "peak_flops: this CPU has neither AVX-512 nor AVX2 with FMA\n");
      return 1;
    }
    std::printf("fp32 (AVX2 FMA; no AVX-512 here): %.1f GFLOP/s per core\n",
                Measure(Fp32Avx2, per_call * 8 * 2, seconds));
    std::printf("bf16: this CPU has no AVX512-BF16\n");
    return 0;
  }
  std::printf("fp32 (AVX-512 FMA): %.1f GFLOP/s per core\n", Measure(Fp32, per_call * 16 * 2, seconds));
  if (__builtin_cpu_supports("avx512bf16")) {
    std::printf("bf16 (AVX512-BF16 dot products): %.1f GFLOP/s per core\n", Measure(Bf16, per_call * 32 * 2, seconds));
  } else {
    std::printf("bf16: this CPU has no AVX512-BF16\n");
  }
  return 0;
}
