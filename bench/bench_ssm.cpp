// SSD scan (fp4/nn/ssm.h): the fast chunked kernels (ssm.cpp: vector mm tiles + OpenMP over
// (b, h) forward / (b, g) backward) next to their scalar twins (ssm_ref.cpp, one thread) at a
// tiny-model shape B = 16, T = 256, H = 8, P = 64, G = 1, N = 64, Q = 64:
//
//   ./build/bench_ssm --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
//
// GFLOP/s counts the multiply-adds of the matrix products of the chunked algorithm as
// implemented (2 FLOP each; triangular products count their triangle; the products the
// kernels skip because an operand is the zero state are not counted), per chunk of q rows:
//   forward,  per group: C Bᵀ (lower triangle) q(q+1)N;
//             per head:  (Gm ∘ M) X q(q+1)P, C S_prev 2qNP (not in the first chunk), state
//                        update 2qNP (not after the last chunk);
//   backward, per group: C Bᵀ q(q+1)N again, dG_sum B and dG_sumᵀ C 2q(q+1)N;
//             per head:  dY Xᵀ and Wᵀ dY 2q(q+1)P, dY S_prev and Cᵀ dyo 2 × 2qNP (not in the
//                        first chunk), B dS and X dSᵀ 2 × 2qNP (not in the last chunk)
// (the elementwise work, the O(q²) decay terms, the dot products and the exps are not
// counted).
#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "fp4/nn/ssm.h"

using namespace fp4::nn;

namespace {

constexpr SsdDims kDims{16, 256, 8, 64, 1, 64, 64};

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(g);
  return v;
}

struct Data {
  SsdDims d = kDims;
  int64_t ld = d.H * d.P + 2 * d.G * d.N, lddt = d.H;
  size_t R = static_cast<size_t>(d.B * d.T);
  std::vector<float> xbc = randn(R * ld, 1), dt = randn(R * lddt, 2, 0.5f),
                     dt_bias = randn(d.H, 3, 0.5f), A_log = randn(d.H, 4, 0.5f),
                     D = randn(d.H, 5), dy = randn(R * d.H * d.P, 6);
  std::vector<float> y = std::vector<float>(R * d.H * d.P),
                     ws = std::vector<float>(ssd_workspace_floats(d)),
                     dxbc = std::vector<float>(R * ld), ddt = std::vector<float>(R * lddt),
                     g1 = std::vector<float>(d.H), g2 = std::vector<float>(d.H),
                     g3 = std::vector<float>(d.H);
  const float* x() const { return xbc.data(); }
  const float* B() const { return xbc.data() + d.H * d.P; }
  const float* C() const { return xbc.data() + d.H * d.P + d.G * d.N; }
  template <bool Fast>
  void fwd() {
    (Fast ? ssd_scan_forward : ssd_scan_forward_ref)(y.data(), ws.data(), x(), ld, B(), ld, C(),
                                                      ld, dt.data(), lddt, dt_bias.data(),
                                                      A_log.data(), D.data(), d);
  }
  template <bool Fast>
  void bwd() {
    (Fast ? ssd_scan_backward : ssd_scan_backward_ref)(
        dxbc.data(), dxbc.data() + d.H * d.P, dxbc.data() + d.H * d.P + d.G * d.N, ddt.data(),
        g1.data(), g2.data(), g3.data(), dy.data(), ws.data(), x(), ld, B(), ld, C(), ld,
        dt.data(), lddt, dt_bias.data(), A_log.data(), D.data(), d);
  }
};

double flops(bool fwd, bool bwd) {
  const SsdDims& d = kDims;
  double per_group = 0.0, per_head = 0.0;
  for (int64_t t0 = 0; t0 < d.T; t0 += d.Q) {
    const double q = static_cast<double>(std::min(d.Q, d.T - t0)), N = d.N, P = d.P;
    const double first = t0 == 0 ? 0.0 : 1.0, last = t0 + d.Q >= d.T ? 0.0 : 1.0;
    if (fwd) {
      per_group += q * (q + 1) * N;
      per_head += q * (q + 1) * P + first * 2 * q * N * P + last * 2 * q * N * P;
    }
    if (bwd) {
      per_group += 3 * q * (q + 1) * N;
      per_head += 2 * q * (q + 1) * P + first * 4 * q * N * P + last * 4 * q * N * P;
    }
  }
  return static_cast<double>(d.B) *
         (per_group * static_cast<double>(d.G) + per_head * static_cast<double>(d.H));
}

void label(benchmark::State& st, bool fast, double fl) {
  st.SetLabel(fast ? "fast threads=" + std::to_string(omp_get_max_threads())
                   : std::string("twin 1 thread"));
  st.counters["GFLOP"] =
      benchmark::Counter(fl * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

template <bool Fast>
void BM_SsdFwd(benchmark::State& st) {
  Data dd;
  for (auto _ : st) {
    dd.fwd<Fast>();
    benchmark::DoNotOptimize(dd.y.data());
  }
  label(st, Fast, flops(true, false));
}
template <bool Fast>
void BM_SsdBwd(benchmark::State& st) {
  Data dd;
  dd.fwd<Fast>();
  for (auto _ : st) {
    dd.bwd<Fast>();
    benchmark::DoNotOptimize(dd.dxbc.data());
  }
  label(st, Fast, flops(false, true));
}
template <bool Fast>
void BM_SsdFwdBwd(benchmark::State& st) {
  Data dd;
  for (auto _ : st) {
    dd.fwd<Fast>();
    dd.bwd<Fast>();
    benchmark::DoNotOptimize(dd.dxbc.data());
  }
  label(st, Fast, flops(true, true));
}

#define FP4_PAIR(BM)                                                                      \
  BENCHMARK(BM<true>)->Name(#BM "/fast")->Unit(benchmark::kMillisecond)->UseRealTime(); \
  BENCHMARK(BM<false>)->Name(#BM "/twin")->Unit(benchmark::kMillisecond)->UseRealTime()

// Conv1d + SiLU and gated RMSNorm at the same config (configs/nemotron-h-tiny.toml): conv over
// C' = d_inner + 2·G·N = 640 channels of the in_proj output (row stride 2·d_inner + 2·G·N + H),
// W = 4; norm over [B·T, d_inner = 512], G = 1, z of the same row stride. GFLOP counts the
// conv's multiply-adds (2·W per output, forward; 3× that backward) and the norm's ~6 FLOPs
// per element (rough; both are memory- and exp-bound).
struct ConvNormData {
  int64_t B = kDims.B, T = kDims.T, di = kDims.H * kDims.P, C = di + 2 * kDims.G * kDims.N,
          W = 4, Din = 2 * di + 2 * kDims.G * kDims.N + kDims.H;
  size_t R = static_cast<size_t>(B * T);
  std::vector<float> zx = randn(R * Din, 11), w = randn(C * W, 12, 0.5f), bias = randn(C, 13),
                     out = std::vector<float>(R * C), dout = randn(R * C, 14),
                     dzx = std::vector<float>(R * Din), dw = std::vector<float>(C * W),
                     db = std::vector<float>(C), y = randn(R * di, 15), nw = randn(di, 16),
                     yn = std::vector<float>(R * di), rstd = std::vector<float>(R),
                     dyn = randn(R * di, 17), dy = std::vector<float>(R * di),
                     dnw = std::vector<float>(di);
};
template <bool Fast>
void BM_ConvFwd(benchmark::State& st) {
  ConvNormData c;
  for (auto _ : st) {
    (Fast ? ssm_conv_forward : ssm_conv_forward_ref)(c.out.data(), c.zx.data() + c.di, c.Din,
                                                      c.w.data(), c.bias.data(), c.B, c.T, c.C,
                                                      c.W);
    benchmark::DoNotOptimize(c.out.data());
  }
  label(st, Fast, 2.0 * c.W * c.C * static_cast<double>(c.R));
}
template <bool Fast>
void BM_ConvBwd(benchmark::State& st) {
  ConvNormData c;
  for (auto _ : st) {
    (Fast ? ssm_conv_backward : ssm_conv_backward_ref)(
        c.dzx.data() + c.di, c.dw.data(), c.db.data(), c.dout.data(), c.zx.data() + c.di, c.Din,
        c.w.data(), c.bias.data(), c.B, c.T, c.C, c.W);
    benchmark::DoNotOptimize(c.dzx.data());
  }
  label(st, Fast, 6.0 * c.W * c.C * static_cast<double>(c.R));
}
template <bool Fast>
void BM_NormFwd(benchmark::State& st) {
  ConvNormData c;
  for (auto _ : st) {
    (Fast ? gated_rmsnorm_forward : gated_rmsnorm_forward_ref)(
        c.yn.data(), c.rstd.data(), c.y.data(), c.zx.data(), c.Din, c.nw.data(),
        static_cast<int64_t>(c.R), c.di, 1, 1e-5f);
    benchmark::DoNotOptimize(c.yn.data());
  }
  label(st, Fast, 6.0 * c.di * static_cast<double>(c.R));
}
template <bool Fast>
void BM_NormBwd(benchmark::State& st) {
  ConvNormData c;
  gated_rmsnorm_forward(c.yn.data(), c.rstd.data(), c.y.data(), c.zx.data(), c.Din, c.nw.data(),
                        static_cast<int64_t>(c.R), c.di, 1, 1e-5f);
  for (auto _ : st) {
    (Fast ? gated_rmsnorm_backward : gated_rmsnorm_backward_ref)(
        c.dy.data(), c.dzx.data(), c.dnw.data(), c.dyn.data(), c.y.data(), c.zx.data(), c.Din,
        c.nw.data(), c.rstd.data(), static_cast<int64_t>(c.R), c.di, 1);
    benchmark::DoNotOptimize(c.dy.data());
  }
  label(st, Fast, 12.0 * c.di * static_cast<double>(c.R));
}

FP4_PAIR(BM_SsdFwd);
FP4_PAIR(BM_SsdBwd);
FP4_PAIR(BM_SsdFwdBwd);
FP4_PAIR(BM_ConvFwd);
FP4_PAIR(BM_ConvBwd);
FP4_PAIR(BM_NormFwd);
FP4_PAIR(BM_NormBwd);

}  // namespace

BENCHMARK_MAIN();
