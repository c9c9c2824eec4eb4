// FP32 → BF16 bit patterns, vectorised: bf16_bits (bf16.h) over arrays.
#include "fp4/numerics/bf16.h"

#include <omp.h>

#include <algorithm>

#include "fp4/base/cpu_isa.h"

namespace fp4 {
namespace {
// One contiguous range per kernel, written so that GCC vectorises it (`omp simd`; the select
// is a blend). Each body is compiled three times, for AVX-512, AVX2 and baseline x86-64; the
// integer operations (and the one FP32 addition of add_round) are exact IEEE operations, so
// every build computes the same bits. The build is chosen once per process from the CPU and
// FP4_MAX_CPU_ISA (fp4/base/cpu_isa.h), so the AVX2 cap runs what an AVX2-only CPU runs
// (test_bf16 and its .isa_avx2 copy compare each kernel with the scalar bf16_bits).
struct ToBits {
  using Out = uint16_t;
  [[gnu::always_inline]] static inline void body(const float* __restrict in, int64_t n, uint16_t* __restrict out) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_bits(in[i]);
  }
};
struct Round {  // may run in place: in == out is elementwise, so no restrict
  using Out = float;
  [[gnu::always_inline]] static inline void body(const float* in, int64_t n, float* out) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_value(bf16_bits(in[i]));
  }
};
struct AddRound {
  using Out = float;
  [[gnu::always_inline]] static inline void body(const float* __restrict in, int64_t n, float* __restrict acc) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) acc[i] += bf16_value(bf16_bits(in[i]));
  }
};
template <class K>
__attribute__((target("avx512f,avx512bw"))) void run_avx512(const float* in, int64_t n,
                                                            typename K::Out* out) {
  K::body(in, n, out);
}
template <class K>
__attribute__((target("avx2"))) void run_avx2(const float* in, int64_t n, typename K::Out* out) {
  K::body(in, n, out);
}
template <class K>
void run_base(const float* in, int64_t n, typename K::Out* out) {
  K::body(in, n, out);
}
enum class Build { Avx512, Avx2, Base };
Build pick_build() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      cpu_isa_allowed(CpuIsa::Avx512))
    return Build::Avx512;
  if (__builtin_cpu_supports("avx2") && cpu_isa_allowed(CpuIsa::Avx2)) return Build::Avx2;
  return Build::Base;
}
const Build build = pick_build();

template <class K>
void run_range(const float* in, int64_t n, typename K::Out* out) {
  switch (build) {
    case Build::Avx512: return run_avx512<K>(in, n, out);
    case Build::Avx2: return run_avx2<K>(in, n, out);
    case Build::Base: return run_base<K>(in, n, out);
  }
}
// Fixed chunks of elements per task (not per thread): elementwise, so any split gives the same bits.
template <class K>
void run(const float* in, int64_t n, typename K::Out* out) {
  if (n <= 0) return;
  constexpr int64_t kChunk = int64_t(1) << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  if (chunks == 1) return run_range<K>(in, n, out);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t i0 = c * kChunk, m = std::min(kChunk, n - i0);
    run_range<K>(in + i0, m, out + i0);
  }
}
}  // namespace

void to_bf16_bits(const float* in, int64_t n, uint16_t* out) { run<ToBits>(in, n, out); }
void round_bf16_array(const float* in, int64_t n, float* out) { run<Round>(in, n, out); }
void add_round_bf16_array(const float* in, int64_t n, float* acc) { run<AddRound>(in, n, acc); }

}  // namespace fp4
