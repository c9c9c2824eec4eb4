// Probe-matched FP4 GEMM emulation vs the FP32 GEMM (fp4::sgemm, oneDNN), issue 3 section 6.
// Shapes: M = N = K = 512 and M = 4096, N = K = 256 (C = A·Bᵀ, A [M, K], B [N, K]).
//
//   BM_Sgemm            fp4::sgemm on the already-dequantized FP32 operands
//   BM_DecodedGemm      fp4::decoded_gemm: dequantize both QuantizedTensors, then sgemm
//   BM_ProbeGemm        fp4::probe_gemm, default kernel (AVX-512 VNNI where available)
//   BM_ProbeGemmPortable  fp4::probe_gemm, portable kernel
//   BM_ProbeVsSgemm     both measured alternately in one loop (robust on a shared, noisy
//                       machine): counters sgemm_GFLOPs, probe_GFLOPs and ratio = probe time /
//                       sgemm time
// GFLOP/s counts 2·M·N·K per call. probe_gemm's time includes packing its operands from the
// unpacked QuantizedTensors (it is part of the call). Run, e.g.:
//   build/bench_gemm --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <tuple>
#include <vector>

#include "fp4/block_quant.h"
#include "fp4/gemm.h"
#include "fp4/probe_gemm.h"

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
  for (auto _ : st) {
    fp4::probe_gemm(p.qa, p.qb, p.c.data(), fp4::ProbeGemmOptions{k});
    benchmark::ClobberMemory();
  }
  set_flops(st, p);
}
void BM_ProbeGemm(benchmark::State& st) { probe_bench(st, fp4::ProbeKernel::Auto); }
void BM_ProbeGemmPortable(benchmark::State& st) { probe_bench(st, fp4::ProbeKernel::Portable); }

void BM_ProbeVsSgemm(benchmark::State& st) {
  Problem& p = problem(st.range(0), st.range(1), st.range(2));
  using clock = std::chrono::steady_clock;
  double ts = 0.0, tp = 0.0;
  int64_t n = 0;
  for (auto _ : st) {
    const auto t0 = clock::now();
    run_sgemm(p);
    benchmark::ClobberMemory();
    const auto t1 = clock::now();
    fp4::probe_gemm(p.qa, p.qb, p.c.data());
    benchmark::ClobberMemory();
    const auto t2 = clock::now();
    ts += std::chrono::duration<double>(t1 - t0).count();
    tp += std::chrono::duration<double>(t2 - t1).count();
    ++n;
  }
  const double flop = 2.0 * double(p.M) * double(p.N) * double(p.K) * double(n);
  st.counters["sgemm_GFLOPs"] = flop / ts * 1e-9;
  st.counters["probe_GFLOPs"] = flop / tp * 1e-9;
  st.counters["ratio"] = tp / ts;
}

void shapes(benchmark::internal::Benchmark* b) {
  b->Args({512, 512, 512})->Args({4096, 256, 256})->ArgNames({"M", "N", "K"});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(BM_Sgemm)->Apply(shapes);
BENCHMARK(BM_DecodedGemm)->Apply(shapes);
BENCHMARK(BM_ProbeGemm)->Apply(shapes);
BENCHMARK(BM_ProbeGemmPortable)->Apply(shapes);
BENCHMARK(BM_ProbeVsSgemm)->Apply(shapes);

}  // namespace

BENCHMARK_MAIN();
