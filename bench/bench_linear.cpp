// One training step of a Linear (fprop + dgrad + wgrad) at M = 4096 tokens, K = N = 1024:
// FP32 (the three oneDNN GEMMs alone) versus the shipped FP4 recipes with their own GEMM
// (gemm = "auto": decoded-bf16, the operands' q·c_b on the BF16 GEMM; until 2026-12-06 the
// decoded GEMM, quantize every operand, then the FP32 GEMMs). Target: FP4 ≤ 1.25× FP32.
// BM_LinearStep_ue5m3_b16_probe runs the three GEMMs probe-matched (fp4::probe_gemm, default
// kernel: AVX-512 VNNI or AVX2), the paper's headline recipe; BM_LinearStep_ue5m3_b16_paper adds
// the paper's BF16 interface (configs/recipes/ue5m3-b16-paper.toml: BF16 X and dY, BF16 outputs;
// target: at most 1.2× the fp32 step on both CPU families).
// BM_StepVsFp32/<recipe> times the fp32 step and the recipe's step alternately in one loop
// (robust on a shared, noisy machine) and reports ratio = recipe time / fp32 time, with
// fp32_ms and recipe_ms; the figure for that target is its median for ue5m3-b16-paper.
// Every benchmark runs one untimed step first, so that the buffers a training loop keeps
// (BF16 copies, packing workspaces) are allocated before timing: the steady-state step.
// Run: ./build/bench_linear --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
// and compare the medians (the ratio is what matters on a shared, noisy machine).
#include <benchmark/benchmark.h>

#include <chrono>

#include <filesystem>
#include <random>
#include <vector>

#include "fp4/nn/linear.h"
#include "fp4/recipe/recipe.h"

namespace {
constexpr int64_t kM = 4096, kK = 1024, kN = 1024;

struct Fixture {
  std::vector<float> X, W, dY, Y, dX, dW, dW2;
  Fixture()
      : X(kM * kK), W(kN * kK), dY(kM * kN), Y(kM * kN), dX(kM * kK), dW(kN * kK), dW2(kN * kK) {
    std::mt19937 g(1);
    std::normal_distribution<float> d;
    for (auto& v : X) v = d(g);
    for (auto& v : W) v = 0.02f * d(g);
    for (auto& v : dY) v = 1e-4f * d(g);
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

/// A Linear of the recipe's own mode (block_mode() would put a 1-block model's only block in
/// BF16 for nvfp4-te), accumulating into dW, after one untimed warm-up step.
struct Stepper {
  fp4::nn::Linear lin;
  fp4::nn::StepContext ctx;
  int64_t step = 1;
  Stepper(const fp4::Recipe& r, float* dW) : lin(0, kK, kN, fp4::LinearPlan::uniform(r, r.mode)) {
    lin.bind(fixture().W.data(), dW);
    run_step();
  }
  void run_step() {
    Fixture& f = fixture();
    ctx.step = step++;
    lin.forward(f.X.data(), f.Y.data(), kM, ctx);
    lin.backward(f.dY.data(), f.dX.data(), kM, ctx);
    benchmark::ClobberMemory();
  }
};

void run(benchmark::State& state, const fp4::Recipe& r) {
  Stepper s(r, fixture().dW.data());
  for (auto _ : state) s.run_step();
  state.counters["GFLOP/s"] = benchmark::Counter(6.0 * kM * kN * kK * state.iterations(),
                                                 benchmark::Counter::kIsRate);
}

fp4::Recipe recipe(const char* name) {
  return fp4::load_recipe(name, std::filesystem::path(FP4_BENCH_SOURCE_DIR) / "configs/recipes");
}

void BM_LinearStep_fp32(benchmark::State& s) { run(s, recipe("fp32")); }
void BM_LinearStep_bf16(benchmark::State& s) { run(s, recipe("bf16")); }
void BM_LinearStep_ue5m3_b16(benchmark::State& s) { run(s, recipe("ue5m3-b16")); }
void BM_LinearStep_nvfp4_te(benchmark::State& s) { run(s, recipe("nvfp4-te")); }
void BM_LinearStep_ue5m3_b32(benchmark::State& s) { run(s, recipe("ue5m3-b32")); }
void BM_LinearStep_ue5m3_te(benchmark::State& s) { run(s, recipe("ue5m3-te")); }
void BM_LinearStep_nvfp4_all(benchmark::State& s) { run(s, recipe("nvfp4-all")); }
void BM_LinearStep_mxfp4(benchmark::State& s) { run(s, recipe("mxfp4")); }
void BM_LinearStep_ue5m3_b16_probe(benchmark::State& s) { run(s, recipe("ue5m3-b16-probe")); }
void BM_LinearStep_ue5m3_b16_paper(benchmark::State& s) { run(s, recipe("ue5m3-b16-paper")); }
/// The fp32 step and the recipe's step alternately in one loop: ratio = recipe / fp32 time.
void BM_StepVsFp32(benchmark::State& state, const char* name) {
  Stepper base(recipe("fp32"), fixture().dW.data());
  Stepper other(recipe(name), fixture().dW2.data());
  using clock = std::chrono::steady_clock;
  double t_base = 0.0, t_other = 0.0;
  for (auto _ : state) {
    const auto t0 = clock::now();
    base.run_step();
    const auto t1 = clock::now();
    other.run_step();
    const auto t2 = clock::now();
    t_base += std::chrono::duration<double>(t1 - t0).count();
    t_other += std::chrono::duration<double>(t2 - t1).count();
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["ratio"] = t_other / t_base;
  state.counters["fp32_ms"] = 1e3 * t_base / n;
  state.counters["recipe_ms"] = 1e3 * t_other / n;
}
BENCHMARK_CAPTURE(BM_StepVsFp32, ue5m3_b16_paper, "ue5m3-b16-paper")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_StepVsFp32, ue5m3_b16_probe, "ue5m3-b16-probe")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_StepVsFp32, ue5m3_b16, "ue5m3-b16")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_LinearStep_fp32)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_LinearStep_bf16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_LinearStep_ue5m3_b16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_LinearStep_nvfp4_te)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_LinearStep_ue5m3_b32)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_LinearStep_ue5m3_te)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_LinearStep_nvfp4_all)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_LinearStep_ue5m3_b16_probe)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_LinearStep_ue5m3_b16_paper)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_LinearStep_mxfp4)->Unit(benchmark::kMillisecond)->UseRealTime();
}  // namespace

BENCHMARK_MAIN();
