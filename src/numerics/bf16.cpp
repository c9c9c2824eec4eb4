// FP32 → BF16 bit patterns, vectorised: bf16_bits (bf16.h) over arrays.
#include "fp4/numerics/bf16.h"

#include <omp.h>

#include <algorithm>

#include "fp4/base/cpu_isa.h"

namespace fp4 {
namespace {
// One contiguous range, written so that GCC vectorises it (`omp simd`; the select is a
// blend). The body is compiled three times, for AVX-512, AVX2 and baseline x86-64; the
// integer operations are exact, so every build computes the same bits. The build is chosen
// once per process from the CPU and FP4_MAX_CPU_ISA (fp4/base/cpu_isa.h), so the AVX2 cap runs what
// an AVX2-only CPU runs (test_bf16 and its .isa_avx2 copy compare it with bf16_bits).
[[gnu::always_inline]] inline void convert_body(const float* __restrict in, int64_t n,
                                                uint16_t* __restrict out) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_bits(in[i]);
}
__attribute__((target("avx512f,avx512bw"))) void convert_avx512(const float* __restrict in,
                                                                int64_t n,
                                                                uint16_t* __restrict out) {
  convert_body(in, n, out);
}
__attribute__((target("avx2"))) void convert_avx2(const float* __restrict in, int64_t n,
                                                  uint16_t* __restrict out) {
  convert_body(in, n, out);
}
void convert_base(const float* __restrict in, int64_t n, uint16_t* __restrict out) {
  convert_body(in, n, out);
}

using ConvertFn = void (*)(const float*, int64_t, uint16_t*);
ConvertFn pick_convert() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      cpu_isa_allowed(CpuIsa::Avx512))
    return convert_avx512;
  if (__builtin_cpu_supports("avx2") && cpu_isa_allowed(CpuIsa::Avx2)) return convert_avx2;
  return convert_base;
}
const ConvertFn convert_range = pick_convert();
}  // namespace

void to_bf16_bits(const float* in, int64_t n, uint16_t* out) {
  if (n <= 0) return;
  constexpr int64_t kChunk = int64_t(1) << 16;  // elements per task (fixed, not per thread)
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  if (chunks == 1) return convert_range(in, n, out);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t i0 = c * kChunk, m = std::min(kChunk, n - i0);
    convert_range(in + i0, m, out + i0);
  }
}

}  // namespace fp4
