// Causal attention kernels (src/nn/attention.cpp) next to their scalar twin
// (detail::attention_*_ref) and a verbatim copy of the previous kernel (4 × 16 register
// block, separate multiply and add, scalar softmax with std::exp; namespace old_attn below,
// AVX-512 build only), in one process, so speedups are same-process ratios:
//
//   ./build/bench_attention --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
//
// Shapes (B·H, T, hd) = (64, 512, 64) and (48, 1024, 64), laid out as the training configs
// do: configs/small.toml (B = 8, H = 8, C = 512) and configs/gpt2-124m.toml (B = 4, H = 12,
// C = 768), so the head slices have the real row stride C.
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

namespace old_attn {
// ---- verbatim copy of src/nn/attention.cpp before the FMA rewrite (kernel part only) ----
constexpr int64_t kNR = 16;  // micro-kernel columns (one 64-byte vector)
constexpr int64_t kMR = 4;   // micro-kernel rows
constexpr int64_t kPad = 16; // T and hd are padded to multiples of this (≥ kMR, kNR)

// Native vector of VW floats (16: AVX-512, 8: AVX2, 4: SSE2).
template <int VW>
struct Vec;
template <>
struct Vec<16> {
  typedef float type __attribute__((vector_size(64)));
  typedef float unaligned __attribute__((vector_size(64), aligned(4), may_alias));
};
template <>
struct Vec<8> {
  typedef float type __attribute__((vector_size(32)));
  typedef float unaligned __attribute__((vector_size(32), aligned(4), may_alias));
};
template <>
struct Vec<4> {
  typedef float type __attribute__((vector_size(16)));
  typedef float unaligned __attribute__((vector_size(16), aligned(4), may_alias));
};

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Which k each micro-kernel row r sums over (diag is the block's first row index):
//   kFull:  k0 ≤ k < k1                        (S = Q Kᵀ, dP = dO Vᵀ)
//   kLower: k0 ≤ k < k1 and k ≤ diag + r       (O = P V, dQ = dS K: j ≤ i)
//   kUpper: k0 ≤ k < k1 and k ≥ diag + r       (dK = dSᵀ Q, dV = Pᵀ dO: i ≥ j)
// The triangular modes skip the masked terms instead of multiplying the zeros stored above
// the diagonal. For finite inputs that changes no bit (an accumulator that starts at +0 is
// never −0, so adding 0·x = ±0 leaves it unchanged), but 0·inf = NaN would leak a
// non-finite value from token j into rows i < j; skipping keeps the kernel causal for any
// input and makes it a plain causal sum, as in the scalar twin (attention_ref.cpp).
enum Tri { kFull, kLower, kUpper };

// C[r, 0:16] = Σ_k A(r, k) · B[k, 0:16] for r < kMR, k ascending over the range selected by
// Tri (above), where A(r, k) = A[r·sr + k·sk] (sr/sk select A or Aᵀ) and B rows have stride
// ldb. Accumulators are kMR × (16 / VW) native vectors of VW lanes, starting at +0.
// kLower needs k0 ≤ diag < k1 ≤ diag + kMR; kUpper needs k0 == diag.
template <int VW, int Tri = kFull>
[[gnu::always_inline]] inline void micro(int64_t k0, int64_t k1, const float* A, int64_t sr,
                                         int64_t sk, const float* B, int64_t ldb, float* C,
                                         int64_t ldc, int64_t diag = 0) {
  typedef typename Vec<VW>::type V;
  typedef typename Vec<VW>::unaligned U;  // for loads/stores straight from float arrays
  constexpr int NV = kNR / VW;
  V acc[kMR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < kMR; ++r)
#pragma GCC unroll 4
    for (int n = 0; n < NV; ++n) acc[r][n] = V{};
  // Triangular head (kUpper) / tail (kLower): steps k = diag + t, t < kMR, k < k1, where
  // row r takes part iff r ≥ t (kLower) or r ≤ t (kUpper). Fully unrolled, so the row masks
  // are compile-time constants.
  auto tri_steps = [&]() __attribute__((always_inline)) {
#pragma GCC unroll 16
    for (int t = 0; t < kMR; ++t) {
      const int64_t k = diag + t;
      if (k >= k1) break;
      V b[NV];
#pragma GCC unroll 4
      for (int n = 0; n < NV; ++n) b[n] = *reinterpret_cast<const U*>(B + k * ldb + n * VW);
      const float* a = A + k * sk;
#pragma GCC unroll 16
      for (int r = 0; r < kMR; ++r) {
        if (Tri == kLower ? r < t : r > t) continue;
        const float ar = a[r * sr];
#pragma GCC unroll 4
        for (int n = 0; n < NV; ++n) acc[r][n] += ar * b[n];
      }
    }
  };
  int64_t kmain0 = k0, kmain1 = k1;
  if constexpr (Tri == kUpper) {
    tri_steps();
    kmain0 = std::min(k1, diag + kMR);
  } else if constexpr (Tri == kLower) {
    kmain1 = diag;
  }
  for (int64_t k = kmain0; k < kmain1; ++k) {
    V b[NV];
#pragma GCC unroll 4
    for (int n = 0; n < NV; ++n) b[n] = *reinterpret_cast<const U*>(B + k * ldb + n * VW);
    const float* a = A + k * sk;
#pragma GCC unroll 16
    for (int r = 0; r < kMR; ++r) {
      const float ar = a[r * sr];
#pragma GCC unroll 4
      for (int n = 0; n < NV; ++n) acc[r][n] += ar * b[n];
    }
  }
  if constexpr (Tri == kLower) tri_steps();
#pragma GCC unroll 16
  for (int r = 0; r < kMR; ++r)
#pragma GCC unroll 4
    for (int n = 0; n < NV; ++n) *reinterpret_cast<U*>(C + r * ldc + n * VW) = acc[r][n];
}

struct Dims {
  int64_t T, C, H, hd, Tp, hdp;
  float scale;
};

// Floats of per-thread workspace needed by the forward / backward head kernels.
inline int64_t fwd_ws_floats(const Dims& d) { return 3 * d.Tp * d.hdp + d.Tp * d.Tp; }
inline int64_t bwd_ws_floats(const Dims& d) { return 4 * d.Tp * d.hdp + 2 * d.Tp * d.Tp; }

// Packs src[t·C + c] (t < T, c < hd) into dst [Tp, hdp] row-major, zero padded.
[[gnu::always_inline]] inline void pack_rows(float* dst, const float* src, const Dims& d) {
  for (int64_t t = 0; t < d.Tp; ++t) {
    float* o = dst + t * d.hdp;
    if (t < d.T) {
      std::memcpy(o, src + t * d.C, sizeof(float) * d.hd);
      std::fill(o + d.hd, o + d.hdp, 0.0f);
    } else {
      std::fill(o, o + d.hdp, 0.0f);
    }
  }
}

// Packs the transpose: dst [hdp, Tp], dst[c·Tp + t] = src[t·C + c], zero padded.
[[gnu::always_inline]] inline void pack_cols(float* dst, const float* src, const Dims& d) {
  std::fill(dst, dst + d.hdp * d.Tp, 0.0f);
  for (int64_t t = 0; t < d.T; ++t)
    for (int64_t c = 0; c < d.hd; ++c) dst[c * d.Tp + t] = src[t * d.C + c];
}

// One (b, h) forward. q/k/v/out point at the head's first column of token 0 of batch b;
// att points at the [T, T] probability block of (b, h).
template <int VW>
[[gnu::always_inline]] inline void head_forward(float* out, float* att, const float* q,
                                                const float* k, const float* v, const Dims& d,
                                                float* ws) {
  const int64_t T = d.T, Tp = d.Tp, hdp = d.hdp;
  float* Q = ws;               // [Tp, hdp]
  float* Kt = Q + Tp * hdp;    // [hdp, Tp]
  float* V = Kt + hdp * Tp;    // [Tp, hdp]
  float* S = V + Tp * hdp;     // [Tp, Tp] scores, then probabilities
  pack_rows(Q, q, d);
  pack_cols(Kt, k, d);
  pack_rows(V, v, d);

  // S[i, j] = Σ_c Q[i, c] Kᵀ[c, j] for the column blocks that touch j ≤ i.
  for (int64_t i0 = 0; i0 < Tp; i0 += kMR)
    for (int64_t n0 = 0; n0 < i0 + kMR; n0 += kNR)
      micro<VW>(0, d.hd, Q + i0 * hdp, hdp, 1, Kt + n0, Tp, S + i0 * Tp + n0, Tp);

  // Row softmax over j ≤ i with max subtraction; S row becomes P (zero for j > i).
  for (int64_t i = 0; i < Tp; ++i) {
    float* s = S + i * Tp;
    if (i >= T) {
      std::fill(s, s + Tp, 0.0f);
      continue;
    }
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j <= i; ++j) {
      s[j] *= d.scale;
      m = std::max(m, s[j]);
    }
    float sum = 0.0f;
    for (int64_t j = 0; j <= i; ++j) {
      s[j] = std::exp(s[j] - m);
      sum += s[j];
    }
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j <= i; ++j) s[j] *= inv;
    std::fill(s + i + 1, s + Tp, 0.0f);
    std::memcpy(att + i * T, s, sizeof(float) * T);
  }

  // O = P V, k (= j) restricted to the causal range of the row block.
  alignas(64) float tile[kMR * kNR];
  for (int64_t i0 = 0; i0 < T; i0 += kMR) {
    const int64_t k1 = std::min(i0 + kMR, T);
    for (int64_t n0 = 0; n0 < d.hd; n0 += kNR) {
      micro<VW, kLower>(0, k1, S + i0 * Tp, Tp, 1, V + n0, hdp, tile, kNR, i0);
      for (int64_t r = 0; r < kMR && i0 + r < T; ++r)
        for (int64_t c = 0; c < kNR && n0 + c < d.hd; ++c)
          out[(i0 + r) * d.C + n0 + c] = tile[r * kNR + c];
    }
  }
}

// One (b, h) backward; ds points at the head's [T, T] block of `scratch`.
template <int VW>
[[gnu::always_inline]] inline void head_backward(float* dq, float* dk, float* dv, float* ds,
                                                 const float* dout, const float* q,
                                                 const float* k, const float* v,
                                                 const float* att, const Dims& d, float* ws) {
  const int64_t T = d.T, Tp = d.Tp, hdp = d.hdp;
  float* Q = ws;                // [Tp, hdp]
  float* K = Q + Tp * hdp;      // [Tp, hdp]
  float* dO = K + Tp * hdp;     // [Tp, hdp]
  float* Vt = dO + Tp * hdp;    // [hdp, Tp]
  float* P = Vt + hdp * Tp;     // [Tp, Tp]
  float* D = P + Tp * Tp;       // [Tp, Tp] dP, then dS
  pack_rows(Q, q, d);
  pack_rows(K, k, d);
  pack_rows(dO, dout, d);
  pack_cols(Vt, v, d);
  for (int64_t i = 0; i < Tp; ++i) {
    float* p = P + i * Tp;
    if (i < T) {
      std::memcpy(p, att + i * T, sizeof(float) * T);
      std::fill(p + T, p + Tp, 0.0f);
    } else {
      std::fill(p, p + Tp, 0.0f);
    }
  }

  // dP = dO Vᵀ on the causal column blocks.
  for (int64_t i0 = 0; i0 < Tp; i0 += kMR)
    for (int64_t n0 = 0; n0 < i0 + kMR; n0 += kNR)
      micro<VW>(0, d.hd, dO + i0 * hdp, hdp, 1, Vt + n0, Tp, D + i0 * Tp + n0, Tp);

  // dS = scale · P ⊙ (dP − rowsum(P ⊙ dP)); zero for j > i. Also written to `ds`.
  for (int64_t i = 0; i < Tp; ++i) {
    float* g = D + i * Tp;
    if (i >= T) {
      std::fill(g, g + Tp, 0.0f);
      continue;
    }
    const float* p = P + i * Tp;
    float dot = 0.0f;
    for (int64_t j = 0; j <= i; ++j) dot += p[j] * g[j];
    for (int64_t j = 0; j <= i; ++j) g[j] = p[j] * (g[j] - dot) * d.scale;
    std::fill(g + i + 1, g + Tp, 0.0f);
    std::memcpy(ds + i * T, g, sizeof(float) * T);
  }

  alignas(64) float tile[kMR * kNR];
  // dQ += dS K: row i needs j ≤ i only.
  for (int64_t i0 = 0; i0 < T; i0 += kMR) {
    const int64_t k1 = std::min(i0 + kMR, T);
    for (int64_t n0 = 0; n0 < d.hd; n0 += kNR) {
      micro<VW, kLower>(0, k1, D + i0 * Tp, Tp, 1, K + n0, hdp, tile, kNR, i0);
      for (int64_t r = 0; r < kMR && i0 + r < T; ++r)
        for (int64_t c = 0; c < kNR && n0 + c < d.hd; ++c)
          dq[(i0 + r) * d.C + n0 + c] += tile[r * kNR + c];
    }
  }
  // dK += dSᵀ Q and dV += Pᵀ dO: row j needs i ≥ j only (A read transposed: sr = 1).
  for (int64_t j0 = 0; j0 < T; j0 += kMR) {
    for (int64_t n0 = 0; n0 < d.hd; n0 += kNR) {
      micro<VW, kUpper>(j0, T, D + j0, 1, Tp, Q + n0, hdp, tile, kNR, j0);
      for (int64_t r = 0; r < kMR && j0 + r < T; ++r)
        for (int64_t c = 0; c < kNR && n0 + c < d.hd; ++c)
          dk[(j0 + r) * d.C + n0 + c] += tile[r * kNR + c];
      micro<VW, kUpper>(j0, T, P + j0, 1, Tp, dO + n0, hdp, tile, kNR, j0);
      for (int64_t r = 0; r < kMR && j0 + r < T; ++r)
        for (int64_t c = 0; c < kNR && n0 + c < d.hd; ++c)
          dv[(j0 + r) * d.C + n0 + c] += tile[r * kNR + c];
    }
  }
}

struct AlignedFree {
  void operator()(float* p) const { std::free(p); }
};
std::unique_ptr<float[], AlignedFree> alloc_ws(int64_t n) {
  const size_t bytes = static_cast<size_t>(round_up(n * static_cast<int64_t>(sizeof(float)), 64));
  return std::unique_ptr<float[], AlignedFree>(static_cast<float*>(std::aligned_alloc(64, bytes)));
}
Dims make_dims(int64_t T, int64_t C, int64_t H) {
  Dims d;
  d.T = T;
  d.C = C;
  d.H = H;
  d.hd = C / H;
  d.Tp = round_up(T, kPad);
  d.hdp = round_up(d.hd, kPad);
  d.scale = 1.0f / std::sqrt(static_cast<float>(d.hd));
  return d;
}
__attribute__((target("avx512f"))) void head_forward_avx512(float* out, float* att,
                                                            const float* q, const float* k,
                                                            const float* v, const Dims& d,
                                                            float* ws) {
  head_forward<16>(out, att, q, k, v, d, ws);
}
__attribute__((target("avx512f"))) void head_backward_avx512(
    float* dq, float* dk, float* dv, float* ds, const float* dout, const float* q,
    const float* k, const float* v, const float* att, const Dims& d, float* ws) {
  head_backward<16>(dq, dk, dv, ds, dout, q, k, v, att, d, ws);
}
void forward(float* out, float* att, const float* q, const float* k, const float* v, int64_t B,
             int64_t T, int64_t C, int64_t H) {
  const Dims d = make_dims(T, C, H);
#pragma omp parallel
  {
    auto ws = alloc_ws(fwd_ws_floats(d));
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < B * H; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const int64_t off = b * T * C + h * d.hd;
      head_forward_avx512(out + off, att + bh * T * T, q + off, k + off, v + off, d, ws.get());
    }
  }
}
void backward(float* dq, float* dk, float* dv, float* scratch, const float* dout,
              const float* q, const float* k, const float* v, const float* att, int64_t B,
              int64_t T, int64_t C, int64_t H) {
  const Dims d = make_dims(T, C, H);
#pragma omp parallel
  {
    auto ws = alloc_ws(bwd_ws_floats(d));
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < B * H; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const int64_t off = b * T * C + h * d.hd;
      head_backward_avx512(dq + off, dk + off, dv + off, scratch + bh * T * T, dout + off,
                           q + off, k + off, v + off, att + bh * T * T, d, ws.get());
    }
  }
}
}  // namespace old_attn

namespace {

enum Kind { kNew512, kNew2, kNewBase, kOld512, kTwin };
const char* kKindName[] = {"avx512", "avx2", "base", "old-avx512", "twin"};

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
  if (!detail::set_attention_isa(isa) ||
      (kind == kOld512 && !detail::set_attention_isa(detail::AttentionIsa::kAvx512))) {
    st.SkipWithError("variant not supported on this CPU");
    return false;
  }
  return true;
}

// range(0) = B·H, range(1) = T, range(2) = hd, range(3) = H; Bwd: time the backward (the
// forward runs once, before).
template <Kind K, bool Bwd>
void BM_Attention(benchmark::State& st) {
  if (!select(st, K)) return;
  const int64_t H = st.range(3), T = st.range(1), hd = st.range(2);
  const int64_t B = K == kTwin || K == kNewBase ? 1 : st.range(0) / H, BH = B * H, C = H * hd;
  const size_t act = static_cast<size_t>(B * T * C), att_n = static_cast<size_t>(BH * T * T);
  const auto q = randn(act, 1), k = randn(act, 2), v = randn(act, 3), dout = randn(act, 4);
  std::vector<float> out(act), att(att_n), scratch(Bwd ? att_n : 0);
  std::vector<float> dq(act, 0.0f), dk(act, 0.0f), dv(act, 0.0f);
  auto fwd = [&] {
    if (K == kOld512)
      old_attn::forward(out.data(), att.data(), q.data(), k.data(), v.data(), B, T, C, H);
    else if (K == kTwin)
      detail::attention_forward_ref(out.data(), att.data(), q.data(), k.data(), v.data(), B, T,
                                    C, H);
    else
      attention_forward(out.data(), att.data(), q.data(), k.data(), v.data(), B, T, C, H);
  };
  auto bwd = [&] {
    if (K == kOld512)
      old_attn::backward(dq.data(), dk.data(), dv.data(), scratch.data(), dout.data(), q.data(),
                         k.data(), v.data(), att.data(), B, T, C, H);
    else if (K == kTwin)
      detail::attention_backward_ref(dq.data(), dk.data(), dv.data(), scratch.data(),
                                     dout.data(), q.data(), k.data(), v.data(), att.data(), B,
                                     T, C, H);
    else
      attention_backward(dq.data(), dk.data(), dv.data(), scratch.data(), dout.data(), q.data(),
                         k.data(), v.data(), att.data(), B, T, C, H);
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
              " heads=" + std::to_string(BH));
}

#define FP4_ATTN_BM(K, BWD)                                                            \
  BENCHMARK(BM_Attention<K, BWD>)                                                      \
      ->Name(std::string("BM_Attention") + (BWD ? "Bwd/" : "Fwd/") + kKindName[K])     \
      ->ArgNames({"BH", "T", "hd", "H"})                                               \
      ->Args({64, 512, 64, 8})                                                         \
      ->Args({48, 1024, 64, 12})                                                       \
      ->Unit(benchmark::kMillisecond)                                                  \
      ->UseRealTime()

FP4_ATTN_BM(kNew512, false);
FP4_ATTN_BM(kOld512, false);
FP4_ATTN_BM(kNew2, false);
FP4_ATTN_BM(kNewBase, false);
FP4_ATTN_BM(kTwin, false);
FP4_ATTN_BM(kNew512, true);
FP4_ATTN_BM(kOld512, true);
FP4_ATTN_BM(kNew2, true);
FP4_ATTN_BM(kNewBase, true);
FP4_ATTN_BM(kTwin, true);

}  // namespace

BENCHMARK_MAIN();
