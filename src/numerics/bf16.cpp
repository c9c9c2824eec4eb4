// FP32 → BF16 bit patterns, vectorised: bf16_bits (bf16.h) over arrays.
#include "fp4/bf16.h"

#include <omp.h>

#include <algorithm>

namespace fp4 {
namespace {
// One contiguous range, written so that GCC vectorises it (`omp simd`; the select is a
// blend). target_clones compiles AVX-512 and AVX2 versions next to the baseline one; the
// integer operations are exact, so every clone computes the same bits.
__attribute__((target_clones("avx512f", "avx2", "default"))) void convert_range(
    const float* __restrict in, int64_t n, uint16_t* __restrict out) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_bits(in[i]);
}
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
