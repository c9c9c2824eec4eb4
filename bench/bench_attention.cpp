// Causal attention kernels (src/nn/attention.cpp), each ISA variant next to the scalar twin
// (detail::attention_*_ref), in one process, so ratios are same-process ratios. (Until
// commit 6913fe2 this file also carried a copy of the previous kernel, for the before/after
// figures in docs/performance.md; check out that commit to rerun them.)
//
//   ./build/bench_attention --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
//
// Shapes (B·H, T, hd) = (64, 512, 64) and (48, 1024, 64), laid out as the training configs
// do: configs/small.toml (B = 8, H = 8, C = 512) and configs/gpt2-124m.toml (B = 4, H = 12,
// C = 768), so the head slices have the real row stride C; plus a grouped-query case
// (Hkv = 2 key/value heads for H = 8 query heads, k/v rows of stride Hkv·hd, as in
// Nemotron-H), which runs the same products per query head; and the attention block of
// configs/nemotron-h-tiny.toml (B = 16, T = 256, H = 4, Hkv = 2, hd = 64), the yardstick of
// bench_ssm's Mamba-2 kernels at the same config.
// items_per_second is FLOP/s of the causal products actually needed: forward QKᵀ and PV,
// 2·2·T(T+1)/2·hd per head; backward dP, dQ, dK, dV, 4·2·T(T+1)/2·hd per head (softmax and
// exp not counted). Kernels run with omp_get_max_threads() threads (OMP_NUM_THREADS); the
// variant is chosen with detail::set_attention_isa (avx512 / avx2 / base = SSE2 with
// std::fma per lane). The twin (one thread) and the base variant run one batch row only (B = 1;
// they are slow, and their rate per head is what matters).
#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "fp4/nn/layers.h"

using namespace fp4::nn;


namespace {

enum Kind { kNew512, kNew2, kNewBase, kTwin };
const char* kKindName[] = {"avx512", "avx2", "base", "twin"};

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(g);
  return v;
}

// Causal FLOPs of one head's products: 2·T(T+1)/2·hd each.
double product_flops(int64_t T, int64_t hd) {
  return 2.0 * static_cast<double>(T) * static_cast<double>(T + 1) / 2.0 *
         static_cast<double>(hd);
}

bool select(benchmark::State& st, Kind kind) {
  detail::AttentionIsa isa = detail::AttentionIsa::kAuto;
  if (kind == kNew512) isa = detail::AttentionIsa::kAvx512;
  if (kind == kNew2) isa = detail::AttentionIsa::kAvx2;
  if (kind == kNewBase) isa = detail::AttentionIsa::kScalarTwin;
  if (!detail::set_attention_isa(isa)) {
    st.SkipWithError("variant not supported on this CPU");
    return false;
  }
  return true;
}

// range(0) = B·H, range(1) = T, range(2) = hd, range(3) = H, range(4) = Hkv; Bwd: time the
// backward (the forward runs once, before).
template <Kind K, bool Bwd>
void BM_Attention(benchmark::State& st) {
  if (!select(st, K)) return;
  const int64_t H = st.range(3), Hkv = st.range(4), T = st.range(1), hd = st.range(2);
  const int64_t B = K == kTwin || K == kNewBase ? 1 : st.range(0) / H, BH = B * H;
  const size_t act = static_cast<size_t>(B * T * H * hd);
  const size_t act_kv = static_cast<size_t>(B * T * Hkv * hd);
  const size_t att_n = static_cast<size_t>(attention_scratch_floats(B, T, H));
  const auto q = randn(act, 1), k = randn(act_kv, 2), v = randn(act_kv, 3);
  const auto dout = randn(act, 4);
  std::vector<float> out(act), att(att_n), scratch(Bwd ? att_n : 0);
  std::vector<float> dq(act, 0.0f), dk(act_kv, 0.0f), dv(act_kv, 0.0f);
  auto fwd = [&] {
    if (K == kTwin)
      detail::attention_forward_ref(out.data(), att.data(), q.data(), k.data(), v.data(), B, T,
                                    H, Hkv, hd);
    else
      attention_forward(out.data(), att.data(), q.data(), k.data(), v.data(), B, T, H, Hkv,
                        hd);
  };
  auto bwd = [&] {
    if (K == kTwin)
      detail::attention_backward_ref(dq.data(), dk.data(), dv.data(), scratch.data(),
                                     dout.data(), q.data(), k.data(), v.data(), att.data(), B,
                                     T, H, Hkv, hd);
    else
      attention_backward(dq.data(), dk.data(), dv.data(), scratch.data(), dout.data(), q.data(),
                         k.data(), v.data(), att.data(), B, T, H, Hkv, hd);
  };
  if (Bwd) fwd();
  for (auto _ : st) {
    if (Bwd)
      bwd();
    else
      fwd();
    benchmark::ClobberMemory();
  }
  detail::set_attention_isa(detail::AttentionIsa::kAuto);
  const double flops = (Bwd ? 4.0 : 2.0) * product_flops(T, hd) * static_cast<double>(BH);
  st.SetItemsProcessed(static_cast<int64_t>(flops) * st.iterations());
  st.SetLabel(std::string(kKindName[K]) + " threads=" +
              std::to_string(K == kTwin ? 1 : omp_get_max_threads()) +
              " heads=" + std::to_string(BH) + " kv_heads=" + std::to_string(B * Hkv));
}

#define FP4_ATTN_BM(K, BWD)                                                            \
  BENCHMARK(BM_Attention<K, BWD>)                                                      \
      ->Name(std::string("BM_Attention") + (BWD ? "Bwd/" : "Fwd/") + kKindName[K])     \
      ->ArgNames({"BH", "T", "hd", "H", "Hkv"})                                        \
      ->Args({64, 512, 64, 8, 8})                                                      \
      ->Args({48, 1024, 64, 12, 12})                                                   \
      ->Args({64, 512, 64, 8, 2})                                                      \
      ->Args({64, 256, 64, 4, 2})                                                      \
      ->Unit(benchmark::kMillisecond)                                                  \
      ->UseRealTime()

FP4_ATTN_BM(kNew512, false);
FP4_ATTN_BM(kNew2, false);
FP4_ATTN_BM(kNewBase, false);
FP4_ATTN_BM(kTwin, false);
FP4_ATTN_BM(kNew512, true);
FP4_ATTN_BM(kNew2, true);
FP4_ATTN_BM(kNewBase, true);
FP4_ATTN_BM(kTwin, true);

}  // namespace

BENCHMARK_MAIN();
