// Causal multi-head attention forward/backward (see fp4/nn/layers.h).
//
// Formulas, per (batch b, head h), with Q, K, V, O the [T, hd] head slices and s = 1/sqrt(hd):
//   S  = s · Q Kᵀ                         (only j ≤ i is used)
//   P  = softmax_row(S) with max subtraction: P[i,j] = exp(S[i,j] − m_i) / Σ_{j'≤i} exp(S[i,j'] − m_i)
//   O  = P V
// Backward (dO given):
//   dP = dO Vᵀ
//   dS[i,j] = P[i,j] · (dP[i,j] − Σ_{j'≤i} P[i,j'] dP[i,j'])      (softmax Jacobian)
//   dQ += s · dS K,   dK += s · dSᵀ Q,   dV += Pᵀ dO
//
// Implementation: every (b, h) pair is handled start to finish by one OpenMP thread, so each
// output element is produced by one thread in a fixed order and results are bit-identical
// for any thread count. The head slices are packed into zero-padded per-thread buffers
// (T and hd rounded up to 16) and the products run through a register-blocked micro-kernel
// (MR rows × 16 columns, k ascending, separate multiply and add since the project builds
// with -ffp-contract=off). The kernel uses GCC vector extensions; it is compiled for AVX-512,
// AVX2 and baseline x86-64 and picked at run time. Because every lane does the same scalar
// multiply-then-add sequence, all three variants give bit-identical results, and they match
// the plain scalar twin in attention_ref.cpp (detail::attention_*_ref) bit for bit
// (tests/test_attention_twin.cpp). Sums over the causal range never include the masked
// zeros above the diagonal (see Tri below), so the zero padding cannot change a bit.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>

#include "fp4/nn/layers.h"

namespace fp4::nn {
namespace {

constexpr int64_t kNR = 16;  // micro-kernel columns (one 64-byte vector)
constexpr int64_t kMR = 4;   // micro-kernel rows
constexpr int64_t kPad = 16; // T and hd are padded to multiples of this (≥ kMR, kNR)
// Below this much work (B·H·T²·hd) the (b, h) loop runs on the calling thread only.
constexpr int64_t kParallelMin = int64_t{1} << 16;

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

using FwdFn = void (*)(float*, float*, const float*, const float*, const float*, const Dims&,
                       float*);
using BwdFn = void (*)(float*, float*, float*, float*, const float*, const float*, const float*,
                       const float*, const float*, const Dims&, float*);

#define FP4_ATTN_VARIANT(SUFFIX, TARGET, VW)                                                      \
  TARGET void head_forward_##SUFFIX(float* out, float* att, const float* q, const float* k,  \
                                    const float* v, const Dims& d, float* ws) {              \
    head_forward<VW>(out, att, q, k, v, d, ws);                                                   \
  }                                                                                           \
  TARGET void head_backward_##SUFFIX(float* dq, float* dk, float* dv, float* ds,             \
                                     const float* dout, const float* q, const float* k,      \
                                     const float* v, const float* att, const Dims& d,        \
                                     float* ws) {                                             \
    head_backward<VW>(dq, dk, dv, ds, dout, q, k, v, att, d, ws);                                 \
  }

FP4_ATTN_VARIANT(avx512, __attribute__((target("avx512f"))), 16)
FP4_ATTN_VARIANT(avx2, __attribute__((target("avx2"))), 8)
FP4_ATTN_VARIANT(base, , 4)
#undef FP4_ATTN_VARIANT

enum class Isa { kAvx512, kAvx2, kBase };
Isa detect_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return Isa::kAvx512;
  if (__builtin_cpu_supports("avx2")) return Isa::kAvx2;
  return Isa::kBase;
}
// The variant in use: the best the CPU supports, unless a test forced another one.
Isa g_isa = detect_isa();
FwdFn pick_forward() {
  return g_isa == Isa::kAvx512 ? head_forward_avx512
         : g_isa == Isa::kAvx2 ? head_forward_avx2
                               : head_forward_base;
}
BwdFn pick_backward() {
  return g_isa == Isa::kAvx512 ? head_backward_avx512
         : g_isa == Isa::kAvx2 ? head_backward_avx2
                               : head_backward_base;
}

struct AlignedFree {
  void operator()(float* p) const { std::free(p); }
};
// The calling thread's packing workspace of at least n floats (64-byte aligned, contents
// undefined). Kept from call to call and grown only when too small, so steady-state calls
// allocate nothing; OpenMP's pool threads live as long as the process, and with them theirs.
float* thread_ws(int64_t n) {
  thread_local std::unique_ptr<float[], AlignedFree> p;
  thread_local int64_t cap = 0;
  if (n > cap) {
    const size_t bytes = static_cast<size_t>(round_up(n * static_cast<int64_t>(sizeof(float)), 64));
    p.reset();
    p.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
    if (!p) throw std::bad_alloc();
    cap = n;
  }
  return p.get();
}

Dims make_dims(int64_t T, int64_t C, int64_t H, const char* fn) {
  if (T <= 0 || C <= 0 || H <= 0 || C % H != 0)
    throw std::invalid_argument(std::string(fn) + ": need T, C, H > 0 and C % H == 0 (got T=" +
                                std::to_string(T) + ", C=" + std::to_string(C) +
                                ", H=" + std::to_string(H) + ")");
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

}  // namespace

void attention_forward(float* out, float* att, const float* q, const float* k, const float* v,
                       int64_t B, int64_t T, int64_t C, int64_t H) {
  if (B <= 0) return;
  const Dims d = make_dims(T, C, H, "attention_forward");
  const FwdFn fn = pick_forward();
#pragma omp parallel if (B * H * T * T * d.hd >= kParallelMin)
  {
    float* ws = thread_ws(fwd_ws_floats(d));
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < B * H; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const int64_t off = b * T * C + h * d.hd;
      fn(out + off, att + bh * T * T, q + off, k + off, v + off, d, ws);
    }
  }
}

void attention_backward(float* dq, float* dk, float* dv, float* scratch, const float* dout,
                        const float* q, const float* k, const float* v, const float* att,
                        int64_t B, int64_t T, int64_t C, int64_t H) {
  if (B <= 0) return;
  const Dims d = make_dims(T, C, H, "attention_backward");
  const BwdFn fn = pick_backward();
#pragma omp parallel if (B * H * T * T * d.hd >= kParallelMin)
  {
    float* ws = thread_ws(bwd_ws_floats(d));
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < B * H; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const int64_t off = b * T * C + h * d.hd;
      fn(dq + off, dk + off, dv + off, scratch + bh * T * T, dout + off, q + off, k + off,
         v + off, att + bh * T * T, d, ws);
    }
  }
}

namespace detail {
bool set_attention_isa(AttentionIsa isa) {
  const Isa best = detect_isa();
  Isa want = best;
  switch (isa) {
    case AttentionIsa::kAuto: want = best; break;
    case AttentionIsa::kAvx512: want = Isa::kAvx512; break;
    case AttentionIsa::kAvx2: want = Isa::kAvx2; break;
    case AttentionIsa::kScalarTwin: want = Isa::kBase; break;
  }
  const bool ok = want == Isa::kBase || (want == Isa::kAvx2 && best != Isa::kBase) ||
                  (want == Isa::kAvx512 && best == Isa::kAvx512);
  if (ok) g_isa = want;
  return ok;
}
}  // namespace detail

}  // namespace fp4::nn
