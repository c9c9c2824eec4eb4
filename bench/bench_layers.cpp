// Non-GEMM layer kernels: each fast kernel (layers_fast.cpp: Highway SIMD + OpenMP) next to its
// scalar twin (layers_ref.cpp, one thread, no vectors), at training shapes, in one process, so
// the fast/twin ratio of every kernel can be read from one run:
//
//   ./build/bench_layers --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
//
// Fast kernels run with omp_get_max_threads() threads (OMP_NUM_THREADS) on the SIMD target
// quant_fast_target() names (FP4_BENCH_TARGET=<name> overrides it); every benchmark is labelled
// with both. bytes_per_second counts the FP32 bytes each kernel must read and write once.
// Shapes: BT = 4096 tokens, C = 512 and 768, F = 2048, H·hd = C with hd = 64, V = 4096 and 50304
// (V = 50304 with BT = 512 rows, to keep the logits at 100 MB), optimizer over 16M parameters.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "fp4/nn/run_config.h"
#include "fp4/nn/layers.h"
#include "fp4/nn/model.h"
#include "fp4/numerics/quant_fast.h"
#include "fp4/train/train.h"

using namespace fp4;
using namespace fp4::nn;

namespace {

const bool kTargetOverride = [] {
  if (const char* e = std::getenv("FP4_BENCH_TARGET")) {
    quant_fast_use_target(e);
    return true;
  }
  return false;
}();

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(g);
  return v;
}

constexpr bool kFast = true, kTwin = false;

void label(benchmark::State& st, bool fast, double bytes_per_iter) {
  st.SetLabel(fast ? quant_fast_target() + " threads=" + std::to_string(omp_get_max_threads())
                   : std::string("twin 1 thread"));
  st.SetBytesProcessed(static_cast<int64_t>(bytes_per_iter) * st.iterations());
}

constexpr int64_t kBT = 4096;

template <bool F>
void BM_RmsNormFwd(benchmark::State& st) {
  const int64_t C = st.range(0);
  auto x = randn(kBT * C, 1), w = randn(C, 2);
  std::vector<float> out(kBT * C), rstd(kBT);
  for (auto _ : st) {
    if (F) rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), kBT, C, 1e-5f);
    else nn::detail::rmsnorm_forward_ref(out.data(), rstd.data(), x.data(), w.data(), kBT, C, 1e-5f);
    benchmark::DoNotOptimize(out.data());
  }
  label(st, F, 8.0 * kBT * C);
}

template <bool F>
void BM_RmsNormBwd(benchmark::State& st) {
  const int64_t C = st.range(0);
  auto x = randn(kBT * C, 1), w = randn(C, 2), g = randn(kBT * C, 3);
  std::vector<float> dx(kBT * C), dw(C), rstd(kBT, 1.0f);
  for (auto _ : st) {
    if (F) rmsnorm_backward(dx.data(), dw.data(), g.data(), x.data(), w.data(), rstd.data(), kBT, C);
    else nn::detail::rmsnorm_backward_ref(dx.data(), dw.data(), g.data(), x.data(), w.data(),
                                      rstd.data(), kBT, C);
    benchmark::DoNotOptimize(dx.data());
  }
  label(st, F, 16.0 * kBT * C);
}

template <bool F>
void BM_RopeFwd(benchmark::State& st) {
  const int64_t C = st.range(0), hd = 64, H = C / hd, T = 1024, B = kBT / T;
  auto x = randn(kBT * C, 1);
  for (auto _ : st) {
    if (F) rope_forward(x.data(), B, T, H, hd, 10000.f);
    else nn::detail::rope_forward_ref(x.data(), B, T, H, hd, 10000.f);
    benchmark::DoNotOptimize(x.data());
  }
  label(st, F, 8.0 * kBT * C);
}

template <bool F>
void BM_RopeBwd(benchmark::State& st) {
  const int64_t C = st.range(0), hd = 64, H = C / hd, T = 1024, B = kBT / T;
  auto x = randn(kBT * C, 1);
  for (auto _ : st) {
    if (F) rope_backward(x.data(), B, T, H, hd, 10000.f);
    else nn::detail::rope_backward_ref(x.data(), B, T, H, hd, 10000.f);
    benchmark::DoNotOptimize(x.data());
  }
  label(st, F, 8.0 * kBT * C);
}

template <bool F>
void BM_SqReluFwd(benchmark::State& st) {
  const int64_t n = kBT * 2048;
  auto x = randn(n, 1);
  std::vector<float> out(n);
  for (auto _ : st) {
    if (F) squared_relu_forward(out.data(), x.data(), n);
    else nn::detail::squared_relu_forward_ref(out.data(), x.data(), n);
    benchmark::DoNotOptimize(out.data());
  }
  label(st, F, 8.0 * n);
}

template <bool F>
void BM_SqReluBwd(benchmark::State& st) {
  const int64_t n = kBT * 2048;
  auto x = randn(n, 1), g = randn(n, 2);
  std::vector<float> dx(n);
  for (auto _ : st) {
    if (F) squared_relu_backward(dx.data(), g.data(), x.data(), n);
    else nn::detail::squared_relu_backward_ref(dx.data(), g.data(), x.data(), n);
    benchmark::DoNotOptimize(dx.data());
  }
  label(st, F, 16.0 * n);
}

template <bool F>
void BM_SwigluFwd(benchmark::State& st) {
  const int64_t Fd = 2048;
  auto x = randn(kBT * 2 * Fd, 1, 2.0f);
  std::vector<float> out(kBT * Fd);
  for (auto _ : st) {
    if (F) swiglu_forward(out.data(), x.data(), kBT, Fd);
    else nn::detail::swiglu_forward_ref(out.data(), x.data(), kBT, Fd);
    benchmark::DoNotOptimize(out.data());
  }
  label(st, F, 12.0 * kBT * Fd);
}

template <bool F>
void BM_SwigluBwd(benchmark::State& st) {
  const int64_t Fd = 2048;
  auto x = randn(kBT * 2 * Fd, 1, 2.0f), g = randn(kBT * Fd, 2);
  std::vector<float> dx(kBT * 2 * Fd);
  for (auto _ : st) {
    if (F) swiglu_backward(dx.data(), g.data(), x.data(), kBT, Fd);
    else nn::detail::swiglu_backward_ref(dx.data(), g.data(), x.data(), kBT, Fd);
    benchmark::DoNotOptimize(dx.data());
  }
  label(st, F, 28.0 * kBT * Fd);
}

int64_t ce_rows(int64_t V) { return V > 8192 ? 512 : kBT; }

template <bool F>
void BM_CrossEntropyFwd(benchmark::State& st) {
  const int64_t V = st.range(0), BT = ce_rows(V);
  auto z = randn(BT * V, 1, 3.0f);
  std::vector<int32_t> y(BT);
  for (int64_t t = 0; t < BT; ++t) y[t] = static_cast<int32_t>((t * 7919) % V);
  for (auto _ : st) {
    double l = F ? cross_entropy_forward(nullptr, z.data(), y.data(), BT, V)
                 : nn::detail::cross_entropy_forward_ref(nullptr, z.data(), y.data(), BT, V);
    benchmark::DoNotOptimize(l);
  }
  label(st, F, 4.0 * BT * V);
}

template <bool F>
void BM_CrossEntropyBwd(benchmark::State& st) {
  const int64_t V = st.range(0), BT = ce_rows(V);
  auto z = randn(BT * V, 1, 3.0f);
  std::vector<float> dz(BT * V);
  std::vector<int32_t> y(BT);
  for (int64_t t = 0; t < BT; ++t) y[t] = static_cast<int32_t>((t * 7919) % V);
  for (auto _ : st) {
    if (F) cross_entropy_backward(dz.data(), z.data(), y.data(), BT, V, 1.0f / BT);
    else nn::detail::cross_entropy_backward_ref(dz.data(), z.data(), y.data(), BT, V, 1.0f / BT);
    benchmark::DoNotOptimize(dz.data());
  }
  label(st, F, 8.0 * BT * V);
}

template <bool F>
void BM_ResidualAdd(benchmark::State& st) {
  const int64_t n = kBT * st.range(0);
  auto x = randn(n, 1), r = randn(n, 2);
  for (auto _ : st) {
    if (F) residual_add(x.data(), r.data(), n);
    else nn::detail::residual_add_ref(x.data(), r.data(), n);
    benchmark::DoNotOptimize(x.data());
  }
  label(st, F, 12.0 * n);
}

constexpr int64_t kParams = int64_t{1} << 24;

template <bool F>
void BM_AdamW(benchmark::State& st) {
  TrainConfig c;
  AdamW opt(kParams, c);
  auto p = randn(kParams, 1), g = randn(kParams, 2, 1e-3f);
  std::vector<ParamInfo> infos(1);
  infos[0].offset = 0;
  infos[0].size = kParams;
  int t = 0;
  for (auto _ : st) {
    ++t;
    if (F) opt.step(p.data(), g.data(), infos, 1e-3, t);
    else opt.step_ref(p.data(), g.data(), infos, 1e-3, t);
    benchmark::DoNotOptimize(p.data());
  }
  label(st, F, 28.0 * kParams);
}

template <bool F>
void BM_ClipGradNorm(benchmark::State& st) {
  auto g = randn(kParams, 2, 1e-3f);
  for (auto _ : st) {
    // max_norm 0: the norm only (a clip would also rescale g every iteration).
    double n = F ? clip_grad_norm(g.data(), kParams, 0.0)
                 : fp4::detail::clip_grad_norm_ref(g.data(), kParams, 0.0);
    benchmark::DoNotOptimize(n);
  }
  label(st, F, 4.0 * kParams);
}

#define FP4_PAIR(BM, ...)                                                                \
  BENCHMARK(BM<kFast>)->Name(#BM "/fast") __VA_ARGS__->Unit(benchmark::kMillisecond)->UseRealTime(); \
  BENCHMARK(BM<kTwin>)->Name(#BM "/twin") __VA_ARGS__->Unit(benchmark::kMillisecond)->UseRealTime()

FP4_PAIR(BM_RmsNormFwd, ->Arg(512)->Arg(768));
FP4_PAIR(BM_RmsNormBwd, ->Arg(512)->Arg(768));
FP4_PAIR(BM_RopeFwd, ->Arg(768));
FP4_PAIR(BM_RopeBwd, ->Arg(768));
FP4_PAIR(BM_SqReluFwd, );
FP4_PAIR(BM_SqReluBwd, );
FP4_PAIR(BM_SwigluFwd, );
FP4_PAIR(BM_SwigluBwd, );
FP4_PAIR(BM_CrossEntropyFwd, ->Arg(4096)->Arg(50304));
FP4_PAIR(BM_CrossEntropyBwd, ->Arg(4096)->Arg(50304));
FP4_PAIR(BM_ResidualAdd, ->Arg(768));
FP4_PAIR(BM_AdamW, );
FP4_PAIR(BM_ClipGradNorm, );

}  // namespace

BENCHMARK_MAIN();
