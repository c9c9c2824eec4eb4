// Quantizer throughput: GB/s of FP32 input for the scalar reference and the fast (SIMD +
// OpenMP) quantizers, next to a plain read-and-write-once parallel copy of the same tensor
// measured in the same process. Target: fast kernels ≥ 50% of the copy bandwidth at a 64 MiB
// tensor ([4096, 4096] FP32) on 2 threads.
//
//   ./build/bench_quant --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
//   ./build/bench_quant --benchmark_filter=BlockSizeRatios   # blocks 8 and 32 over 16
//
// Every benchmark reports bytes_per_second = rows·cols·4 bytes of FP32 input per iteration,
// runs with omp_get_max_threads() threads (OMP_NUM_THREADS), and is labelled with the SIMD
// target of the fast kernels. Shapes: the 64 MiB tensor and the training shapes [4096, 256],
// [4096, 1024] (tokens × features).
//
// The packed kernels (pack_fast.h) write a QTensor (4.5 bits per element) instead of FP32:
// BM_Pack* count the same FP32 input bytes; BM_Dequant* count rows·cols·4 bytes of FP32 output
// (the size of the tensor they reconstruct), so every figure compares with the same copy.
#include <benchmark/benchmark.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "fp4/numerics/block_quant.h"
#include "fp4/numerics/hadamard.h"
#include "fp4/numerics/pack_fast.h"
#include "fp4/numerics/qtensor.h"
#include "fp4/numerics/quant_fast.h"

using namespace fp4;

namespace {

/// FP4_BENCH_STREAM_MIN_BYTES=<bytes> overrides the streaming-store threshold of the fast kernels
/// (quant_fast_stream_min_bytes), to compare plain and streaming stores on one shape.
const bool kStreamOverride = [] {
  if (const char* e = std::getenv("FP4_BENCH_STREAM_MIN_BYTES")) {
    quant_fast_stream_min_bytes(std::atoll(e));
    return true;
  }
  return false;
}();

/// A 64-byte aligned FP32 buffer with 16 spare floats (for the misaligned-output variants).
struct Buf {
  explicit Buf(size_t n) : p(static_cast<float*>(std::aligned_alloc(64, (n + 16) * sizeof(float)))) {
    std::fill(p, p + n + 16, 0.f);
  }
  ~Buf() { std::free(p); }
  float* p;
};

struct Tensor {
  int64_t rows, cols;
  Buf x, out;
  std::vector<float> tmp;  ///< scratch of the scalar quantize-transpose
};

/// N(0,1) input of the requested shape (cached per shape) and an output of the same size, both
/// 64-byte aligned (as an aligned allocator would give) and touched before timing.
Tensor& tensor(int64_t rows, int64_t cols) {
  static std::vector<Tensor*> cache;
  for (Tensor* t : cache)
    if (t->rows == rows && t->cols == cols) return *t;
  const size_t n = size_t(rows * cols);
  auto* t = new Tensor{rows, cols, Buf(n), Buf(n), std::vector<float>(n, 0.f)};
  std::mt19937_64 rng(uint64_t(rows * 131 + cols));
  std::normal_distribution<float> nd(0.f, 1.f);
  for (size_t i = 0; i < n; ++i) t->x.p[i] = nd(rng);
  cache.push_back(t);
  return *t;
}

void finish(benchmark::State& state, const Tensor& t) {
  state.SetBytesProcessed(int64_t(state.iterations()) * t.rows * t.cols * int64_t(sizeof(float)));
  state.SetLabel(quant_fast_target() + ", " + std::to_string(omp_get_max_threads()) + " threads" +
                 (kStreamOverride ? ", stream threshold overridden" : ""));
}

BlockQuantSpec spec(Rounding r, ScaleFormat f = ScaleFormat::UE5M3, bool two_d = false) {
  BlockQuantSpec s;
  s.scale_format = f;
  s.rounding = r;
  s.two_d = two_d;
  return s;
}

const SrKey kKey{42, 1, 0, 2, 2};



/// Baseline: read x once, write out once, same threads, static schedule.
void BM_Copy(benchmark::State& state) {
  Tensor& t = tensor(state.range(0), state.range(1));
  const int64_t n = t.rows * t.cols;
  const float* __restrict x = t.x.p;
  float* __restrict o = t.out.p;
  for (auto _ : state) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) o[i] = x[i];
    benchmark::ClobberMemory();
  }
  finish(state, t);
}

/// For reference: the same copy with streaming (non-temporal) stores, which the fast kernels
/// use for outputs ≥ 16 MiB (quant_fast_stream_min_bytes).
void BM_CopyStream(benchmark::State& state) {
  Tensor& t = tensor(state.range(0), state.range(1));
  const int64_t n = t.rows * t.cols;
  const float* __restrict x = t.x.p;
  float* __restrict o = t.out.p;
  for (auto _ : state) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i += 4) _mm_stream_ps(o + i, _mm_loadu_ps(x + i));  // n % 4 == 0
    _mm_sfence();
    benchmark::ClobberMemory();
  }
  finish(state, t);
}

void BM_QdqScalar(benchmark::State& state) {
  Tensor& t = tensor(state.range(0), state.range(1));
  const Rounding r = state.range(2) ? Rounding::SR8 : Rounding::RNE;
  const float g = tensor_amax(t.x.p, t.rows * t.cols);
  for (auto _ : state) {
    quantize_dequantize(t.x.p, t.rows, t.cols, spec(r), g, &kKey, t.out.p);
    benchmark::ClobberMemory();
  }
  finish(state, t);
}

void BM_QdqFast(benchmark::State& state) {
  Tensor& t = tensor(state.range(0), state.range(1));
  const Rounding r = state.range(2) ? Rounding::SR8 : Rounding::RNE;
  const float g = amax_fast(t.x.p, t.rows * t.cols);
  for (auto _ : state) {
    quantize_dequantize_fast(t.x.p, t.rows, t.cols, spec(r), g, &kKey, t.out.p);
    benchmark::ClobberMemory();
  }
  finish(state, t);
}

/// Weights: 16 × 16 tiles (E4M3 scales, as nvfp4 recipes; the format does not change speed).
void BM_QdqFast2D(benchmark::State& state) {
  Tensor& t = tensor(state.range(0), state.range(1));
  const float g = amax_fast(t.x.p, t.rows * t.cols);
  for (auto _ : state) {
    quantize_dequantize_fast(t.x.p, t.rows, t.cols, spec(Rounding::RNE, ScaleFormat::E4M3, true),
                             g, nullptr, t.out.p);
    benchmark::ClobberMemory();
  }
  finish(state, t);
}

/// Today's wgrad path: transpose (cache-blocked, parallel) → optional RHT → scalar qdq.
void BM_TransposedScalar(benchmark::State& state) {
  Tensor& t = tensor(state.range(0), state.range(1));
  const Rounding r = state.range(2) ? Rounding::SR8 : Rounding::RNE;
  const bool rht = state.range(3) != 0;
  const float g = rht ? amax_rht16_transposed(t.x.p, t.rows, t.cols)
                      : amax_fast(t.x.p, t.rows * t.cols);
  for (auto _ : state) {
    const int64_t R = t.rows, C = t.cols;
    const float* x = t.x.p;
    float* o = t.tmp.data();
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t i0 = 0; i0 < R; i0 += 32)
      for (int64_t j0 = 0; j0 < C; j0 += 32)
        for (int64_t i = i0; i < std::min(R, i0 + 32); ++i)
          for (int64_t j = j0; j < std::min(C, j0 + 32); ++j) o[j * R + i] = x[i * C + j];
    if (rht) rht16_rows(t.tmp.data(), C, R);
    quantize_dequantize(t.tmp.data(), C, R, spec(r), g, &kKey, t.out.p);
    benchmark::ClobberMemory();
  }
  finish(state, t);
}

void BM_TransposedFast(benchmark::State& state) {
  Tensor& t = tensor(state.range(0), state.range(1));
  const Rounding r = state.range(2) ? Rounding::SR8 : Rounding::RNE;
  const bool rht = state.range(3) != 0;
  const float g = rht ? amax_rht16_transposed(t.x.p, t.rows, t.cols)
                      : amax_fast(t.x.p, t.rows * t.cols);
  for (auto _ : state) {
    quantize_dequantize_transposed_fast(t.x.p, t.rows, t.cols, spec(r), g, &kKey, rht,
                                        t.out.p);
    benchmark::ClobberMemory();
  }
  finish(state, t);
}

/// The BF16 RHT (fp4.rht_precision = "bf16") against the FP32 one, RNE, in one loop: each
/// iteration times one call of each, alternately; counter bf16_over_fp32 = Σ t_bf16 / Σ t_fp32.
void BM_TransposedRhtBf16VsFp32(benchmark::State& state) {
  Tensor& t = tensor(state.range(0), state.range(1));
  const float g32 = amax_rht16_transposed(t.x.p, t.rows, t.cols);
  const float g16 = amax_rht16_transposed(t.x.p, t.rows, t.cols, RhtPrecision::BF16);
  using clk = std::chrono::steady_clock;
  double t32 = 0, t16 = 0;
  for (auto _ : state) {
    const auto a = clk::now();
    quantize_dequantize_transposed_fast(t.x.p, t.rows, t.cols, spec(Rounding::RNE), g32, nullptr,
                                        true, RhtPrecision::FP32, t.out.p);
    benchmark::ClobberMemory();
    const auto b = clk::now();
    quantize_dequantize_transposed_fast(t.x.p, t.rows, t.cols, spec(Rounding::RNE), g16, nullptr,
                                        true, RhtPrecision::BF16, t.out.p);
    benchmark::ClobberMemory();
    const auto c = clk::now();
    t32 += std::chrono::duration<double>(b - a).count();
    t16 += std::chrono::duration<double>(c - b).count();
  }
  state.counters["bf16_over_fp32"] = t32 > 0 ? t16 / t32 : 0;
  finish(state, t);
}

/// Blocks of 8 and 32 against blocks of 16 (docs/performance.md "Block sizes and the
/// quantizer's fast path"), in one loop: each iteration times one call of the kernel per block
/// size, alternately, so that a busy machine slows all three alike. Kernel (arg 2): 0 rows
/// (fprop X, dgrad dY), 1 2-D tiles (weights), 2 quantize-transpose (wgrad), 3 packed rows,
/// 4 packed quantize-transpose (probe-matched GEMMs); arg 3: SR8. Counters b8_over_b16 and
/// b32_over_b16 = Σ t_B / Σ t_16; the time and bytes are those of the three calls together.
void BM_BlockSizeRatios(benchmark::State& state) {
  Tensor& t = tensor(state.range(0), state.range(1));
  const int kernel = int(state.range(2));
  const Rounding r = state.range(3) ? Rounding::SR8 : Rounding::RNE;
  const float g = amax_fast(t.x.p, t.rows * t.cols);
  QTensor q;
  auto call = [&](int block) {
    BlockQuantSpec s = spec(r, ScaleFormat::UE5M3, kernel == 1);
    s.block = block;
    switch (kernel) {
      case 0:
      case 1: quantize_dequantize_fast(t.x.p, t.rows, t.cols, s, g, &kKey, t.out.p); break;
      case 2:
        quantize_dequantize_transposed_fast(t.x.p, t.rows, t.cols, s, g, &kKey, false, t.out.p);
        break;
      case 3: quantize_pack_fast(t.x.p, t.rows, t.cols, s, g, &kKey, q); break;
      default: quantize_pack_transposed_fast(t.x.p, t.rows, t.cols, s, g, &kKey, false, q); break;
    }
    benchmark::ClobberMemory();
  };
  using clk = std::chrono::steady_clock;
  const int blocks[3] = {8, 16, 32};
  double sec[3] = {0, 0, 0};
  for (auto _ : state) {
    for (int i = 0; i < 3; ++i) {
      const auto a = clk::now();
      call(blocks[i]);
      sec[i] += std::chrono::duration<double>(clk::now() - a).count();
    }
  }
  state.counters["b8_over_b16"] = sec[1] > 0 ? sec[0] / sec[1] : 0;
  state.counters["b32_over_b16"] = sec[1] > 0 ? sec[2] / sec[1] : 0;
  finish(state, t);
}

/// The fast kernels writing to an output that is only 16-byte aligned (what std::vector's large
/// allocations give with glibc): plain stores, no streaming.
void BM_QdqFastUnaligned(benchmark::State& state) {
  Tensor& t = tensor(state.range(0), state.range(1));
  const float g = amax_fast(t.x.p, t.rows * t.cols);
  for (auto _ : state) {
    quantize_dequantize_fast(t.x.p, t.rows, t.cols, spec(Rounding::RNE), g, nullptr, t.out.p + 4);
    benchmark::ClobberMemory();
  }
  finish(state, t);
}

void BM_TransposedFastUnaligned(benchmark::State& state) {
  Tensor& t = tensor(state.range(0), state.range(1));
  const float g = amax_fast(t.x.p, t.rows * t.cols);
  for (auto _ : state) {
    quantize_dequantize_transposed_fast(t.x.p, t.rows, t.cols, spec(Rounding::RNE), g, nullptr,
                                        false, t.out.p + 4);
    benchmark::ClobberMemory();
  }
  finish(state, t);
}

void BM_AmaxScalar(benchmark::State& state) {
  Tensor& t = tensor(state.range(0), state.range(1));
  for (auto _ : state) benchmark::DoNotOptimize(tensor_amax(t.x.p, t.rows * t.cols));
  finish(state, t);
}

void BM_AmaxFast(benchmark::State& state) {
  Tensor& t = tensor(state.range(0), state.range(1));
  for (auto _ : state) benchmark::DoNotOptimize(amax_fast(t.x.p, t.rows * t.cols));
  finish(state, t);
}

void BM_AmaxRhtFast(benchmark::State& state) {
  Tensor& t = tensor(state.range(0), state.range(1));
  for (auto _ : state) benchmark::DoNotOptimize(amax_rht16_transposed(t.x.p, t.rows, t.cols));
  finish(state, t);
}

/// Fused quantize → packed QTensor (1-D blocks), into a reused QTensor (no allocation).
void BM_PackFast(benchmark::State& state) {
  Tensor& t = tensor(state.range(0), state.range(1));
  const Rounding r = state.range(2) ? Rounding::SR8 : Rounding::RNE;
  const float g = amax_fast(t.x.p, t.rows * t.cols);
  QTensor q;
  for (auto _ : state) {
    quantize_pack_fast(t.x.p, t.rows, t.cols, spec(r), g, &kKey, q);
    benchmark::ClobberMemory();
  }
  finish(state, t);
}

/// Its scalar twin: pack(quantize_blocks(...)).
void BM_PackScalar(benchmark::State& state) {
  Tensor& t = tensor(state.range(0), state.range(1));
  const Rounding r = state.range(2) ? Rounding::SR8 : Rounding::RNE;
  const float g = tensor_amax(t.x.p, t.rows * t.cols);
  for (auto _ : state) {
    QTensor q = pack(quantize_blocks(t.x.p, t.rows, t.cols, spec(r), g, &kKey));
    benchmark::DoNotOptimize(q.packed.data());
  }
  finish(state, t);
}

/// Weights: 16 × 16 tiles, E4M3 scales, RNE, packed.
void BM_PackFast2D(benchmark::State& state) {
  Tensor& t = tensor(state.range(0), state.range(1));
  const float g = amax_fast(t.x.p, t.rows * t.cols);
  QTensor q;
  for (auto _ : state) {
    quantize_pack_fast(t.x.p, t.rows, t.cols, spec(Rounding::RNE, ScaleFormat::E4M3, true), g,
                       nullptr, q);
    benchmark::ClobberMemory();
  }
  finish(state, t);
}

/// Packed quantize-transpose (fp4/numerics/pack_fast.h), into a reused QTensor as quantize_pack_fast
/// above (a fresh QTensor per call would time the kernel zeroing new pages).
void BM_PackTransposedFast(benchmark::State& state) {
  Tensor& t = tensor(state.range(0), state.range(1));
  const Rounding r = state.range(2) ? Rounding::SR8 : Rounding::RNE;
  const bool rht = state.range(3) != 0;
  const float g = rht ? amax_rht16_transposed(t.x.p, t.rows, t.cols)
                      : amax_fast(t.x.p, t.rows * t.cols);
  QTensor q;
  for (auto _ : state) {
    quantize_pack_transposed_fast(t.x.p, t.rows, t.cols, spec(r), g, &kKey, rht, q);
    benchmark::DoNotOptimize(q.packed.data());
  }
  finish(state, t);
}

/// Packed QTensor of the benchmark tensor (1-D, UE5M3, RNE), cached per shape.
const QTensor& packed(int64_t rows, int64_t cols) {
  static std::vector<std::pair<std::pair<int64_t, int64_t>, QTensor*>> cache;
  for (auto& [k, q] : cache)
    if (k.first == rows && k.second == cols) return *q;
  Tensor& t = tensor(rows, cols);
  auto* q = new QTensor(quantize_pack_fast(t.x.p, rows, cols, spec(Rounding::RNE),
                                           amax_fast(t.x.p, rows * cols), nullptr));
  cache.push_back({{rows, cols}, q});
  return *q;
}

void BM_DequantScalar(benchmark::State& state) {
  Tensor& t = tensor(state.range(0), state.range(1));
  const QTensor& q = packed(t.rows, t.cols);
  for (auto _ : state) {
    dequantize(q, t.out.p);
    benchmark::ClobberMemory();
  }
  finish(state, t);
}

void BM_DequantFast(benchmark::State& state) {
  Tensor& t = tensor(state.range(0), state.range(1));
  const QTensor& q = packed(t.rows, t.cols);
  for (auto _ : state) {
    dequantize_fast(q, t.out.p);
    benchmark::ClobberMemory();
  }
  finish(state, t);
}

/// BF16 bit patterns (half the output bytes; counted as the FP32 tensor like the others).
void BM_DequantBf16Fast(benchmark::State& state) {
  Tensor& t = tensor(state.range(0), state.range(1));
  const QTensor& q = packed(t.rows, t.cols);
  auto* o = reinterpret_cast<uint16_t*>(t.out.p);
  for (auto _ : state) {
    dequantize_bf16_fast(q, o);
    benchmark::ClobberMemory();
  }
  finish(state, t);
}

const std::vector<std::vector<int64_t>> kShapes = {{4096, 4096}, {4096, 256}, {4096, 1024}};

void Shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"rows", "cols"});
  for (const auto& s : kShapes) b->Args({s[0], s[1]});
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}
void ShapesSr(benchmark::internal::Benchmark* b) {
  b->ArgNames({"rows", "cols", "sr"});
  for (const auto& s : kShapes)
    for (int64_t sr : {0, 1}) b->Args({s[0], s[1], sr});
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}
void ShapesSrRht(benchmark::internal::Benchmark* b) {
  b->ArgNames({"rows", "cols", "sr", "rht"});
  for (const auto& s : kShapes)
    for (auto [sr, rht] : {std::pair<int64_t, int64_t>{0, 0}, {0, 1}, {1, 0}, {1, 1}})
      b->Args({s[0], s[1], sr, rht});
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}

void BlockSizeKernels(benchmark::internal::Benchmark* b) {
  b->ArgNames({"rows", "cols", "kernel", "sr"});
  for (int64_t kernel = 0; kernel < 5; ++kernel)
    for (int64_t sr : {0, 1}) b->Args({4096, 1024, kernel, sr});
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}

}  // namespace

BENCHMARK(BM_Copy)->Apply(Shapes);
BENCHMARK(BM_CopyStream)->Apply(Shapes);
BENCHMARK(BM_QdqScalar)->Apply(ShapesSr);
BENCHMARK(BM_QdqFast)->Apply(ShapesSr);
BENCHMARK(BM_QdqFast2D)->Apply(Shapes);
BENCHMARK(BM_TransposedScalar)->Apply(ShapesSrRht);
BENCHMARK(BM_TransposedFast)->Apply(ShapesSrRht);
BENCHMARK(BM_TransposedRhtBf16VsFp32)->Apply(Shapes);
BENCHMARK(BM_BlockSizeRatios)->Apply(BlockSizeKernels);
BENCHMARK(BM_QdqFastUnaligned)->Apply(Shapes);
BENCHMARK(BM_TransposedFastUnaligned)->Apply(Shapes);
BENCHMARK(BM_PackScalar)->Apply(ShapesSr);
BENCHMARK(BM_PackFast)->Apply(ShapesSr);
BENCHMARK(BM_PackFast2D)->Apply(Shapes);
BENCHMARK(BM_PackTransposedFast)->Apply(ShapesSrRht);
BENCHMARK(BM_DequantScalar)->Apply(Shapes);
BENCHMARK(BM_DequantFast)->Apply(Shapes);
BENCHMARK(BM_DequantBf16Fast)->Apply(Shapes);
BENCHMARK(BM_AmaxScalar)->Apply(Shapes);
BENCHMARK(BM_AmaxFast)->Apply(Shapes);
BENCHMARK(BM_AmaxRhtFast)->Apply(Shapes);

BENCHMARK_MAIN();
