// Probe-matched FP4 GEMM emulation vs the FP32 GEMM (fp4::sgemm, oneDNN); docs/gemm.md
// "Implementation and speed".
// Shapes: M = N = K = 512, M = 4096, N = K = 256 and M = 4096, N = K = 1024 (C = A·Bᵀ,
// A [M, K], B [N, K]; the portable kernel only on the two smaller ones).
//
//   BM_Sgemm            fp4::sgemm on the already-dequantized FP32 operands
//   BM_DecodedGemm      fp4::decoded_gemm: dequantize both QuantizedTensors, then sgemm
//   BM_ProbeGemm        fp4::probe_gemm, default kernel (probe_gemm_auto_kernel: AVX-512 VNNI,
//                       else AVX2, else portable; the label names it)
//   BM_ProbeGemmAvx2    fp4::probe_gemm, AVX2 kernel (skipped without AVX2)
//   BM_ProbeGemmPortable  fp4::probe_gemm, portable kernel
//   BM_ProbeVsSgemm     sgemm and probe_gemm (default kernel, named in the label) measured
//                       alternately in one loop (robust on a shared, noisy machine): counters
//                       sgemm_GFLOPs, probe_GFLOPs, ratio = probe time / sgemm time and
//                       throughput = sgemm time / probe time (probe throughput as a fraction of
//                       the FP32 GEMM's; the target is ≥ 0.5 at 4096 × 1024 × 1024)
//   BM_GemmBf16         fp4::gemm_bf16 (native BF16 operands, FP32 accumulate), C = A·Bᵀ or,
//                       with ta = 1, C [M, N] = Aᵀ·B (wgrad-like, A stored [K, M], B [K, N])
//   BM_Bf16VsSgemm      fp4::gemm_bf16 and fp4::sgemm on the same (BF16-valued) operands,
//                       alternately in one loop: counters bf16_GFLOPs, sgemm_GFLOPs and
//                       speedup = sgemm time / gemm_bf16 time. Shapes (M, N, K, ta):
//                       4096×1024×1024 (fprop-like), 4096×128×1024 (skinny N) and
//                       1024×1024×4096 with ta = 1 (wgrad-like: long contraction).
//   BM_BlockScaledVsDecoded  the two decoded FP4 GEMM modes on the same block-scaled operands,
//                       alternately in one loop: fp4::gemm_block_scaled (decoded-bf16: BF16
//                       copies, the BF16 GEMM, the decode scales on the output; its path in the
//                       label) and fp4::sgemm of the decoded FP32 operands (decoded): counters
//                       bf16_GFLOPs, sgemm_GFLOPs, speedup = sgemm time / block-scaled time.
//                       Shapes as a Linear calls it (A·Bᵀ): fprop-like and wgrad-like, the tiny
//                       config's and 4096 × 1024 × 1024 (block_scaled_shapes).
//   BM_Bf16BlockedVsNative  fp4::gemm_bf16 on its blocked path (FP4_BF16_GEMM=blocked: oneDNN's
//                       brgemm, weights written in its blocked layout per call) and its native
//                       path (gemm:jit), alternately in one loop: counters native_GFLOPs,
//                       blocked_GFLOPs, blocked_over_native (time ratio); the bf16 and the
//                       block-scaled shapes, each once; the label names the blocked
//                       implementation.
//   BM_PeakFmaVsDpbf16  one core's register-only peak of VFMADD231PS and VDPBF16PS on 512-bit
//                       vectors (12 independent accumulators each, alternately): counters
//                       fma_GFLOPs (16 FMAs per instruction), dpbf16_GFLOPs (32 multiply-adds
//                       per instruction) and bf16_over_fp32. What decides whether a BF16 GEMM
//                       without AMX can beat the FP32 one (docs/gemm.md "Which path a CPU
//                       takes"). Skipped without AVX512-BF16.
// GFLOP/s counts 2·M·N·K per call. probe_gemm's time includes packing its operands from the
// unpacked QuantizedTensors (it is part of the call). Run, e.g.:
//   build/bench_gemm --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <tuple>
#include <vector>

#include "fp4/numerics/bf16.h"
#include "fp4/numerics/block_quant.h"
#include "fp4/gemm/gemm.h"
#include "fp4/gemm/probe_gemm.h"

namespace {

struct Problem {
  int64_t M, N, K;
  fp4::QuantizedTensor qa, qb;
  std::vector<float> da, db, c;
};

/// Normal data quantized with the ue5m3-b16 recipe's operand specs (A: 1-D blocks of 16,
/// B: 16×16 tiles, T = 448, g = current amax), built once per shape.
Problem& problem(int64_t M, int64_t N, int64_t K) {
  static std::map<std::tuple<int64_t, int64_t, int64_t>, std::unique_ptr<Problem>> cache;
  auto& p = cache[{M, N, K}];
  if (!p) {
    p = std::make_unique<Problem>();
    p->M = M;
    p->N = N;
    p->K = K;
    std::mt19937_64 rng(42);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> a(static_cast<size_t>(M * K)), b(static_cast<size_t>(N * K));
    for (float& v : a) v = nd(rng);
    for (float& v : b) v = nd(rng) * 0.02f;
    fp4::BlockQuantSpec sa, sb;
    sb.two_d = true;
    p->qa = fp4::quantize_blocks(a.data(), M, K, sa, fp4::tensor_amax(a.data(), M * K), nullptr);
    p->qb = fp4::quantize_blocks(b.data(), N, K, sb, fp4::tensor_amax(b.data(), N * K), nullptr);
    p->da.resize(a.size());
    p->db.resize(b.size());
    fp4::dequantize(p->qa, p->da.data());
    fp4::dequantize(p->qb, p->db.data());
    p->c.resize(static_cast<size_t>(M * N));
  }
  return *p;
}

void set_flops(benchmark::State& st, const Problem& p) {
  st.counters["GFLOP/s"] = benchmark::Counter(2e-9 * double(p.M) * double(p.N) * double(p.K),
                                              benchmark::Counter::kIsIterationInvariantRate);
}

void run_sgemm(Problem& p) {
  fp4::sgemm(false, true, p.M, p.N, p.K, 1.0f, p.da.data(), p.K, p.db.data(), p.K, 0.0f,
             p.c.data(), p.N);
}

void BM_Sgemm(benchmark::State& st) {
  Problem& p = problem(st.range(0), st.range(1), st.range(2));
  for (auto _ : st) {
    run_sgemm(p);
    benchmark::ClobberMemory();
  }
  set_flops(st, p);
}

void BM_DecodedGemm(benchmark::State& st) {
  Problem& p = problem(st.range(0), st.range(1), st.range(2));
  for (auto _ : st) {
    fp4::decoded_gemm(p.qa, p.qb, p.c.data());
    benchmark::ClobberMemory();
  }
  set_flops(st, p);
}

void probe_bench(benchmark::State& st, fp4::ProbeKernel k) {
  Problem& p = problem(st.range(0), st.range(1), st.range(2));
  if (k == fp4::ProbeKernel::Avx512Vnni && !fp4::probe_gemm_avx512_available()) {
    st.SkipWithError("no AVX-512 VNNI on this CPU");
    return;
  }
  if (k == fp4::ProbeKernel::Avx2 && !fp4::probe_gemm_avx2_available()) {
    st.SkipWithError("no AVX2 on this CPU");
    return;
  }
  st.SetLabel(fp4::probe_kernel_name(k == fp4::ProbeKernel::Auto ? fp4::probe_gemm_auto_kernel() : k));
  for (auto _ : st) {
    fp4::probe_gemm(p.qa, p.qb, p.c.data(), fp4::ProbeGemmOptions{k, {}});
    benchmark::ClobberMemory();
  }
  set_flops(st, p);
}
void BM_ProbeGemm(benchmark::State& st) { probe_bench(st, fp4::ProbeKernel::Auto); }
void BM_ProbeGemmPortable(benchmark::State& st) { probe_bench(st, fp4::ProbeKernel::Portable); }
void BM_ProbeGemmAvx2(benchmark::State& st) { probe_bench(st, fp4::ProbeKernel::Avx2); }

// Seconds spent in a and in b over the benchmark's n iterations, each iteration calling a and
// then b (each followed by ClobberMemory), so that a busy machine slows both alike.
struct Alternated {
  double ta = 0.0, tb = 0.0;
  int64_t n = 0;
};
template <class A, class B>
Alternated alternate(benchmark::State& st, A&& a, B&& b) {
  using clock = std::chrono::steady_clock;
  Alternated r;
  for (auto _ : st) {
    const auto t0 = clock::now();
    a();
    benchmark::ClobberMemory();
    const auto t1 = clock::now();
    b();
    benchmark::ClobberMemory();
    const auto t2 = clock::now();
    r.ta += std::chrono::duration<double>(t1 - t0).count();
    r.tb += std::chrono::duration<double>(t2 - t1).count();
    ++r.n;
  }
  return r;
}

void BM_ProbeVsSgemm(benchmark::State& st) {
  Problem& p = problem(st.range(0), st.range(1), st.range(2));
  const Alternated t = alternate(
      st, [&] { run_sgemm(p); }, [&] { fp4::probe_gemm(p.qa, p.qb, p.c.data()); });
  const double ts = t.ta, tp = t.tb;
  const int64_t n = t.n;
  const double flop = 2.0 * double(p.M) * double(p.N) * double(p.K) * double(n);
  st.counters["sgemm_GFLOPs"] = flop / ts * 1e-9;
  st.counters["probe_GFLOPs"] = flop / tp * 1e-9;
  st.counters["ratio"] = tp / ts;
  st.counters["throughput"] = ts / tp;
  st.SetLabel(fp4::probe_kernel_name(fp4::probe_gemm_auto_kernel()));
}

// BF16 operands (bit patterns, and the same values as FP32 for sgemm), built once per shape.
struct Bf16Problem {
  int64_t M, N, K;
  bool ta;
  std::vector<uint16_t> a, b;
  std::vector<float> fa, fb, c;
  int64_t lda() const { return ta ? M : K; }
  int64_t ldb() const { return ta ? N : K; }  // ta: B [K, N]; else B [N, K] (transposed)
};
Bf16Problem& bf16_problem(int64_t M, int64_t N, int64_t K, bool ta) {
  static std::map<std::tuple<int64_t, int64_t, int64_t, bool>, std::unique_ptr<Bf16Problem>> cache;
  auto& p = cache[{M, N, K, ta}];
  if (!p) {
    p = std::make_unique<Bf16Problem>();
    *p = Bf16Problem{M, N, K, ta, {}, {}, {}, {}, {}};
    std::mt19937_64 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    p->fa.resize(static_cast<size_t>(M * K));
    p->fb.resize(static_cast<size_t>(N * K));
    for (float& v : p->fa) v = nd(rng);
    for (float& v : p->fb) v = nd(rng);
    p->a.resize(p->fa.size());
    p->b.resize(p->fb.size());
    fp4::to_bf16_bits(p->fa.data(), M * K, p->a.data());
    fp4::to_bf16_bits(p->fb.data(), N * K, p->b.data());
    for (size_t i = 0; i < p->a.size(); ++i) p->fa[i] = fp4::bf16_value(p->a[i]);
    for (size_t i = 0; i < p->b.size(); ++i) p->fb[i] = fp4::bf16_value(p->b[i]);
    p->c.resize(static_cast<size_t>(M * N));
  }
  return *p;
}
void run_bf16(Bf16Problem& p) {
  fp4::gemm_bf16(p.ta, !p.ta, p.M, p.N, p.K, p.a.data(), p.lda(), p.b.data(), p.ldb(), false,
                 p.c.data(), p.N);
}
void run_sgemm_bf16_values(Bf16Problem& p) {
  fp4::sgemm(p.ta, !p.ta, p.M, p.N, p.K, 1.0f, p.fa.data(), p.lda(), p.fb.data(), p.ldb(), 0.0f,
             p.c.data(), p.N);
}

void BM_GemmBf16(benchmark::State& st) {
  Bf16Problem& p = bf16_problem(st.range(0), st.range(1), st.range(2), st.range(3) != 0);
  for (auto _ : st) {
    run_bf16(p);
    benchmark::ClobberMemory();
  }
  st.SetLabel(fp4::gemm_bf16_impl(p.ta, !p.ta, p.M, p.N, p.K, p.lda(), p.ldb(), p.N, false));
  st.counters["GFLOP/s"] = benchmark::Counter(2e-9 * double(p.M) * double(p.N) * double(p.K),
                                              benchmark::Counter::kIsIterationInvariantRate);
}

// A BF16-operand GEMM (run_bf16) and fp4::sgemm on the same values, alternately in one loop:
// counters bf16_GFLOPs, sgemm_GFLOPs and speedup = sgemm time / run_bf16 time.
template <class F>
void bf16_vs_sgemm(benchmark::State& st, Bf16Problem& p, F&& run_bf16) {
  const Alternated t = alternate(st, run_bf16, [&] { run_sgemm_bf16_values(p); });
  const double tb = t.ta, ts = t.tb;
  const int64_t n = t.n;
  const double flop = 2.0 * double(p.M) * double(p.N) * double(p.K) * double(n);
  st.counters["bf16_GFLOPs"] = flop / tb * 1e-9;
  st.counters["sgemm_GFLOPs"] = flop / ts * 1e-9;
  st.counters["speedup"] = ts / tb;
}

void BM_Bf16VsSgemm(benchmark::State& st) {
  Bf16Problem& p = bf16_problem(st.range(0), st.range(1), st.range(2), st.range(3) != 0);
  bf16_vs_sgemm(st, p, [&] { run_bf16(p); });
}

void BM_BlockScaledVsDecoded(benchmark::State& st) {
  Bf16Problem& p = bf16_problem(st.range(0), st.range(1), st.range(2), st.range(3) != 0);
  fp4::BlockScaledGemmScratch scratch;
  // the BF16-valued operands stand in for q·c_b (the GEMM is value-blind)
  bf16_vs_sgemm(st, p, [&] {
    fp4::gemm_block_scaled(p.ta, !p.ta, p.M, p.N, p.K, p.fa.data(), 0.5f, p.fb.data(), 0.25f,
                           false, p.c.data(), scratch);
  });
  st.SetLabel(fp4::gemm_bf16_description());
}

// gemm_bf16's blocked path (oneDNN's brgemm with its blocked weights; the weights packed on
// every call, as a Linear's GEMM does) against its native path (gemm:jit), alternately in one
// loop, each timed call under gemm_bf16_set_path (inside the timed call: an atomic store):
// counters native_GFLOPs, blocked_GFLOPs and blocked_over_native = blocked time / native time.
// Skipped where oneDNN offers no brgemm.
void BM_Bf16BlockedVsNative(benchmark::State& st) {
  if (!fp4::gemm_bf16_blocked_available()) {
    st.SkipWithError("oneDNN offers no brgemm BF16 matmul on this CPU");
    return;
  }
  Bf16Problem& p = bf16_problem(st.range(0), st.range(1), st.range(2), st.range(3) != 0);
  const fp4::Bf16GemmPath saved = fp4::gemm_bf16_path();
  auto on = [&](fp4::Bf16GemmPath path) {
    return [&p, path] {
      fp4::gemm_bf16_set_path(path);
      run_bf16(p);
    };
  };
  const Alternated t =
      alternate(st, on(fp4::Bf16GemmPath::Native), on(fp4::Bf16GemmPath::Blocked));
  const double tn = t.ta, tb = t.tb;
  const int64_t n = t.n;
  const std::string impl = fp4::gemm_bf16_impl(p.ta, !p.ta, p.M, p.N, p.K, p.lda(), p.ldb(), p.N,
                                               false);
  fp4::gemm_bf16_set_path(saved);
  const double flop = 2.0 * double(p.M) * double(p.N) * double(p.K) * double(n);
  st.counters["native_GFLOPs"] = flop / tn * 1e-9;
  st.counters["blocked_GFLOPs"] = flop / tb * 1e-9;
  st.counters["blocked_over_native"] = tb / tn;
  st.SetLabel(impl);
}

// Register-only loops of n rounds of 12 independent 512-bit multiply-adds (the unrolled rounds
// keep every accumulator in a register); the sum of the accumulators is returned so that the
// loop is not removed.
__attribute__((target("avx512f"))) inline float sum_lanes(const __m512 (&acc)[12]) {
  alignas(64) float lanes[16];
  float s = 0.0f;
  for (int i = 0; i < 12; ++i) {
    _mm512_store_ps(lanes, acc[i]);
    for (float v : lanes) s += v;
  }
  return s;
}
__attribute__((target("avx512f"), noinline)) float fma_rounds(int64_t n, float x) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(x * float(i));
  const __m512 a = _mm512_set1_ps(1.0001f), b = _mm512_set1_ps(0.9999f);
  for (int64_t i = 0; i < n; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) acc[j] = _mm512_fmadd_ps(a, b, acc[j]);
  }
  return sum_lanes(acc);
}
__attribute__((target("avx512f,avx512bf16"), noinline)) float dpbf16_rounds(int64_t n, float x) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(x * float(i));
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3f7f);
  for (int64_t i = 0; i < n; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], a, b);
  }
  return sum_lanes(acc);
}

void BM_PeakFmaVsDpbf16(benchmark::State& st) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bf16")) {
    st.SkipWithError("no AVX512-BF16 on this CPU");
    return;
  }
  constexpr int64_t kRounds = 1 << 22;
  float sink = 0.0f;
  const Alternated t = alternate(
      st, [&] { sink += fma_rounds(kRounds, 1.0f); },
      [&] { sink += dpbf16_rounds(kRounds, 1.0f); });
  benchmark::DoNotOptimize(sink);
  const double instr = 12.0 * double(kRounds) * double(t.n);
  st.counters["fma_GFLOPs"] = instr * 32.0 / t.ta * 1e-9;
  st.counters["dpbf16_GFLOPs"] = instr * 64.0 / t.tb * 1e-9;
  st.counters["bf16_over_fp32"] = (64.0 / t.tb) / (32.0 / t.ta);
}

void bf16_shapes(benchmark::internal::Benchmark* b) {
  b->Args({4096, 1024, 1024, 0})->Args({4096, 128, 1024, 0})->Args({1024, 1024, 4096, 1});
  b->Args({256, 256, 4096, 1})->Args({256, 256, 4096, 0})->Args({1024, 1024, 4096, 0});
  b->ArgNames({"M", "N", "K", "ta"})->Unit(benchmark::kMillisecond)->UseRealTime();
}

// As a Linear calls gemm_block_scaled (C = A·Bᵀ, ta = 0): fprop-like M = 4096 tokens with the
// tiny config's (N, K) (256, 256), (1024, 256), (256, 1024) and 4096 × 1024 × 1024; wgrad-like
// (N, K, tokens) = (256, 256, 4096) and (1024, 1024, 4096).
void block_scaled_shapes(benchmark::internal::Benchmark* b) {
  b->Args({4096, 256, 256, 0})->Args({4096, 1024, 256, 0})->Args({4096, 256, 1024, 0});
  b->Args({4096, 1024, 1024, 0})->Args({256, 256, 4096, 0})->Args({1024, 1024, 4096, 0});
  b->ArgNames({"M", "N", "K", "ta"})->Unit(benchmark::kMillisecond)->UseRealTime();
}

// bf16_shapes, then those of block_scaled_shapes it lacks (each problem once).
void blocked_shapes(benchmark::internal::Benchmark* b) {
  bf16_shapes(b);
  b->Args({4096, 256, 256, 0})->Args({4096, 1024, 256, 0})->Args({4096, 256, 1024, 0});
}

void small_shapes(benchmark::internal::Benchmark* b) {
  b->Args({512, 512, 512})->Args({4096, 256, 256})->ArgNames({"M", "N", "K"});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}
void shapes(benchmark::internal::Benchmark* b) {
  small_shapes(b);
  b->Args({4096, 1024, 1024});
}

BENCHMARK(BM_Sgemm)->Apply(shapes);
BENCHMARK(BM_DecodedGemm)->Apply(shapes);
BENCHMARK(BM_ProbeGemm)->Apply(shapes);
BENCHMARK(BM_ProbeGemmAvx2)->Apply(shapes);
BENCHMARK(BM_ProbeGemmPortable)->Apply(small_shapes);
BENCHMARK(BM_ProbeVsSgemm)->Apply(shapes);
BENCHMARK(BM_GemmBf16)->Apply(bf16_shapes);
BENCHMARK(BM_Bf16VsSgemm)->Apply(bf16_shapes);
BENCHMARK(BM_BlockScaledVsDecoded)->Apply(block_scaled_shapes);
BENCHMARK(BM_Bf16BlockedVsNative)->Apply(blocked_shapes);
BENCHMARK(BM_PeakFmaVsDpbf16)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
