// Causal multi-head / grouped-query attention forward/backward (see fp4/nn/layers.h).
//
// Formulas, per (batch b, query head h), with Q, O the [T, hd] slices of head h, K, V those of
// its KV head, and s = 1/sqrt(hd):
//   S  = s · Q Kᵀ                         (only j ≤ i is used)
//   P  = softmax_row(S) with max subtraction: P[i,j] = exp(S[i,j] − m_i) / Σ_{j'≤i} exp(S[i,j'] − m_i)
//   O  = P V
// Backward (dO given):
//   dP = dO Vᵀ
//   dS[i,j] = P[i,j] · (dP[i,j] − Σ_{j'≤i} P[i,j'] dP[i,j'])      (softmax Jacobian)
//   dQ += s · dS K,   dK += s · dSᵀ Q,   dV += Pᵀ dO
//
// Grouped-query attention: query head h reads K, V of KV head h / G (G = H / Hkv), and dK, dV
// of a KV head are the sums of its G query heads' dK, dV above.
//
// Implementation: in the forward every (b, h) pair is handled start to finish by one OpenMP
// thread; in the backward every (b, KV head) pair is, its G query heads one after another in
// ascending h (each adds its finished dK, dV products to the KV head's rows, the same
// additions in the same order as the scalar twin; K and Vᵀ are packed once per group). So
// each output element is produced by one thread in a fixed order and results are
// bit-identical for any thread count; with G = 1 this is the multi-head kernel unchanged.
// The head slices are packed into zero-padded per-thread buffers (T and hd rounded up to 16)
// and the products run through a register-blocked micro-kernel
// (Simd<VW>::kMR rows × 16·kNV columns; AVX-512: 8 × 32, AVX2: 4 × 16, baseline: 4 × 16)
// whose every lane computes acc = fma(a, b, acc) from +0 with k ascending over the whole
// contraction range (never split), using explicit fused multiply-adds (the project builds
// with -ffp-contract=off, so nothing is contracted behind our back): vfmadd231ps through
// inline asm on AVX-512 and AVX2 (the intrinsics would need a target attribute on every
// inlined template between them and the per-ISA entry points), and std::fma per lane in the
// baseline build (a correctly rounded fma gives the same bits however it is computed; glibc's
// fmaf uses the FMA instruction when the CPU has one and an exact software path otherwise).
// The block shape only decides which outputs are computed together, never the operations
// that produce one output, so all variants give bit-identical results.
//
// Data flow: the forward walks row blocks of kMR queries: scores into a small [kMR, Tp]
// buffer, row softmax there, the att rows streamed out, then P V for the block; the [T, T]
// scores never go through a workspace. The backward does the same for dP, dS (streamed to
// `scratch`) and dQ, and also scatters dS and P into column panels ([Tp, kMR] per block of
// columns) so that dK = dSᵀ Q and dV = Pᵀ dO, which run down the columns, read contiguous
// memory. att and ds are written with streaming stores as one run of whole cache lines
// (RowStreamer).
//
// The row softmax and the backward's row dot product are vectorized with a fixed order that
// does not depend on the vector width: term j of a row goes to partial j mod 16 (16 partials,
// j ascending), and the partials are combined by a fixed pairwise tree (tree16 of
// layers_internal.h for sums; max_tree16 below for the max, with the select max(a, b) =
// b > a ? b : a). exp is exp_v, the lane-wise copy of internal::exp_scalar (the project's
// multiply/add-only expf, also used by cross-entropy and SwiGLU).
//
// The kernels match the plain scalar twin in attention_ref.cpp (detail::attention_*_ref)
// bit for bit (tests/test_attention_twin.cpp). Sums over the causal range never include the
// masked terms above the diagonal (see Tri below) and vector tails mask the lanes j > i, so
// neither the zero padding nor whatever lies above the diagonal can change a bit.
//
// The vector helpers below pass and return 32/64-byte vectors; they are always inlined into
// functions built for the matching target, so the -Wpsabi note about the ABI does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

#include "fp4/cpu_isa.h"

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
#include "layers_internal.h"

namespace fp4::nn {
namespace {

namespace in = internal;

constexpr int64_t kPad = 16;  // T and hd are padded to multiples of this (≥ every kMR, 16 | NR)
// Below this much work (B·H·T²·hd) the (b, h) loop runs on the calling thread only.
constexpr int64_t kParallelMin = int64_t{1} << 16;

// Native vectors of VW floats / int32 (16: AVX-512, 8: AVX2, 4: SSE2) with the operations
// that are not plain GCC vector-extension arithmetic (which -ffp-contract=off keeps unfused):
// broadcast (a shuffle that GCC emits as vbroadcastss), fused multiply-add, and a streaming
// store. Everything here is always inlined into the per-ISA entry points (target attributes),
// so the asm operands get the right registers. kMR × kNV is the micro-kernel's main block
// (rows × 16-column groups).
template <int VW>
struct Simd;
template <>
struct Simd<16> {
  typedef float V __attribute__((vector_size(64)));
  typedef float U __attribute__((vector_size(64), aligned(4), may_alias));
  typedef int32_t I __attribute__((vector_size(64)));
  static constexpr int kMR = 8, kNV = 2;  // 8 × 32: 16 zmm accumulators
  [[gnu::always_inline]] static inline V set1(float x) { return __builtin_shuffle(V{x}, I{}); }
  [[gnu::always_inline]] static inline V fma(V a, V b, V c) {
    asm("vfmadd231ps %2, %1, %0" : "+v"(c) : "v"(a), "v"(b));
    return c;
  }
  // Non-temporal store to a 64-byte-aligned p.
  [[gnu::always_inline]] static inline void stream(float* p, V v) {
    asm("vmovntps %1, %0" : "=m"(*reinterpret_cast<V*>(p)) : "v"(v));
  }
};
template <>
struct Simd<8> {
  typedef float V __attribute__((vector_size(32)));
  typedef float U __attribute__((vector_size(32), aligned(4), may_alias));
  typedef int32_t I __attribute__((vector_size(32)));
  static constexpr int kMR = 4, kNV = 1;  // 4 × 16: 8 ymm accumulators
  [[gnu::always_inline]] static inline V set1(float x) { return __builtin_shuffle(V{x}, I{}); }
  [[gnu::always_inline]] static inline V fma(V a, V b, V c) {
    asm("vfmadd231ps %2, %1, %0" : "+x"(c) : "x"(a), "x"(b));
    return c;
  }
  [[gnu::always_inline]] static inline void stream(float* p, V v) {
    asm("vmovntps %1, %0" : "=m"(*reinterpret_cast<V*>(p)) : "x"(v));
  }
};
template <>
struct Simd<4> {
  typedef float V __attribute__((vector_size(16)));
  typedef float U __attribute__((vector_size(16), aligned(4), may_alias));
  typedef int32_t I __attribute__((vector_size(16)));
  static constexpr int kMR = 4, kNV = 1;  // 4 × 16
  [[gnu::always_inline]] static inline V set1(float x) { return V{x, x, x, x}; }
  [[gnu::always_inline]] static inline V fma(V a, V b, V c) {
    return V{std::fma(a[0], b[0], c[0]), std::fma(a[1], b[1], c[1]),
             std::fma(a[2], b[2], c[2]), std::fma(a[3], b[3], c[3])};
  }
  [[gnu::always_inline]] static inline void stream(float* p, V v) {
    asm("movntps %1, %0" : "=m"(*reinterpret_cast<V*>(p)) : "x"(v));
  }
};

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Which k each micro-kernel row r sums over (diag is the block's first row index):
//   kFull:  k0 ≤ k < k1                        (S = Q Kᵀ, dP = dO Vᵀ)
//   kLower: k0 ≤ k < k1 and k ≤ diag + r       (O = P V, dQ = dS K: j ≤ i)
//   kUpper: k0 ≤ k < k1 and k ≥ diag + r       (dK = dSᵀ Q, dV = Pᵀ dO: i ≥ j)
// The triangular modes skip the masked terms instead of multiplying what is stored above
// the diagonal. For finite zeros that would change no bit (an accumulator that starts at +0
// is never −0, so fma(0, x, acc) leaves it unchanged), but 0·inf = NaN would leak a
// non-finite value from token j into rows i < j, and the kernels no longer even store zeros
// there; skipping keeps the kernel causal for any input and makes it a plain causal sum, as
// in the scalar twin (attention_ref.cpp).
enum Tri { kFull, kLower, kUpper };

// C[r, 0:16·NV] = Σ_k A(r, k) · B[k, 0:16·NV] for r < MR, k ascending over the range selected
// by Tri (above), one fma per term, where A(r, k) = A[r·sr + k·sk] (sr/sk select A or Aᵀ) and
// B rows have stride ldb. Accumulators are MR × (16·NV / VW) native vectors, starting at +0.
// kLower needs k0 ≤ diag < k1 ≤ diag + MR; kUpper needs k0 == diag.
template <int VW, int MR, int NV, int Tri = kFull>
[[gnu::always_inline]] inline void micro(int64_t k0, int64_t k1, const float* A, int64_t sr,
                                         int64_t sk, const float* B, int64_t ldb, float* C,
                                         int64_t ldc, int64_t diag = 0) {
  using S = Simd<VW>;
  typedef typename S::V V;
  typedef typename S::U U;  // for loads/stores straight from float arrays
  constexpr int NB = 16 * NV / VW;
  V acc[MR][NB];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int n = 0; n < NB; ++n) acc[r][n] = V{};
  // Triangular head (kUpper) / tail (kLower): steps k = diag + t, t < MR, k < k1, where
  // row r takes part iff r ≥ t (kLower) or r ≤ t (kUpper). Fully unrolled, so the row masks
  // are compile-time constants.
  auto tri_steps = [&]() __attribute__((always_inline)) {
#pragma GCC unroll 16
    for (int t = 0; t < MR; ++t) {
      const int64_t k = diag + t;
      if (k >= k1) break;
      V b[NB];
#pragma GCC unroll 8
      for (int n = 0; n < NB; ++n) b[n] = *reinterpret_cast<const U*>(B + k * ldb + n * VW);
      const float* a = A + k * sk;
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        if (Tri == kLower ? r < t : r > t) continue;
        const V ar = S::set1(a[r * sr]);
#pragma GCC unroll 8
        for (int n = 0; n < NB; ++n) acc[r][n] = S::fma(ar, b[n], acc[r][n]);
      }
    }
  };
  int64_t kmain0 = k0, kmain1 = k1;
  if constexpr (Tri == kUpper) {
    tri_steps();
    kmain0 = std::min(k1, diag + MR);
  } else if constexpr (Tri == kLower) {
    kmain1 = diag;
  }
  for (int64_t k = kmain0; k < kmain1; ++k) {
    V b[NB];
#pragma GCC unroll 8
    for (int n = 0; n < NB; ++n) b[n] = *reinterpret_cast<const U*>(B + k * ldb + n * VW);
    const float* a = A + k * sk;
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const V ar = S::set1(a[r * sr]);
#pragma GCC unroll 8
      for (int n = 0; n < NB; ++n) acc[r][n] = S::fma(ar, b[n], acc[r][n]);
    }
  }
  if constexpr (Tri == kLower) tri_steps();
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int n = 0; n < NB; ++n) *reinterpret_cast<U*>(C + r * ldc + n * VW) = acc[r][n];
}

// Products of a row block [i0, i0 + MR) over output columns [0, ncols) (ncols a multiple of
// 16): main blocks of 16·kNV columns, then 16-column blocks for the rest. `call(n0, nv)` is
// invoked once per block with nv = kNV or 1 as a std::integral_constant.
template <int VW, class F>
[[gnu::always_inline]] inline void col_blocks(int64_t ncols, F&& call) {
  constexpr int NV = Simd<VW>::kNV;
  int64_t n0 = 0;
  for (; n0 + 16 * NV <= ncols; n0 += 16 * NV) call(n0, std::integral_constant<int, NV>{});
  if constexpr (NV > 1)
    for (; n0 < ncols; n0 += 16) call(n0, std::integral_constant<int, 1>{});
}

// exp lane-wise: internal::exp_scalar's operations in its order (see layers_internal.h).
template <int VW>
[[gnu::always_inline]] inline typename Simd<VW>::V exp_v(typename Simd<VW>::V x) {
  using S = Simd<VW>;
  typedef typename S::V V;
  typedef typename S::I I;
  const V lo = S::set1(in::kExpLo), hi = S::set1(in::kExpHi);
  const V magic = S::set1(in::kRoundMagic);
  V xc = x >= lo ? x : lo;
  xc = xc <= hi ? xc : hi;
  const V t = xc * S::set1(in::kLog2e) + magic;
  const V kf = t - magic;
  const I k = (I)t - (I)magic;
  const V r = (xc - kf * S::set1(in::kLn2Hi)) - kf * S::set1(in::kLn2Lo);
  const V z = r * r;
  V p = S::set1(in::kExpP0) * r + S::set1(in::kExpP1);
  p = p * r + S::set1(in::kExpP2);
  p = p * r + S::set1(in::kExpP3);
  p = p * r + S::set1(in::kExpP4);
  p = p * r + S::set1(in::kExpP5);
  V y = (p * z + r) + S::set1(1.0f);
  const I k1 = k >> 1, k2 = k - k1;
  y = y * (V)((k1 + 127) << 23);
  y = y * (V)((k2 + 127) << 23);
  y = x > hi ? S::set1(std::numeric_limits<float>::infinity()) : y;
  y = x < lo ? V{} : y;
  y = x != x ? x : y;
  return y;
}

// The max of 16 partials by a fixed pairwise tree (as tree16): p[i] = mx(p[i], p[i+8]),
// p[i] = mx(p[i], p[i+4]), p[i] = mx(p[i], p[i+2]), then mx(p[0], p[1]), with
// mx(a, b) = b > a ? b : a. Overwrites p. Same as attention_ref.cpp's copy.
inline float max_tree16(float* p) {
  auto mx = [](float a, float b) { return b > a ? b : a; };
  for (int i = 0; i < 8; ++i) p[i] = mx(p[i], p[i + 8]);
  for (int i = 0; i < 4; ++i) p[i] = mx(p[i], p[i + 4]);
  for (int i = 0; i < 2; ++i) p[i] = mx(p[i], p[i + 2]);
  return mx(p[0], p[1]);
}

// Lane-index vector {0, 1, …, VW − 1}.
template <int VW>
[[gnu::always_inline]] inline typename Simd<VW>::I lane_iota() {
  typename Simd<VW>::I v;
  for (int l = 0; l < VW; ++l) v[l] = l;
  return v;
}

// Softmax of row s[0:L] (L ≥ 1) in place: s[j] ← s[j]·scale; m = max (16 partials, j mod 16,
// max_tree16); e[j] = exp(s[j] − m); sum = 16 partials + tree16; s[j] ← e[j]·(1/sum).
// Reads and writes s up to round_up(L, 16) (lanes j ≥ L are masked out of the max and the sum
// and left with unspecified values).
template <int VW>
[[gnu::always_inline]] inline void softmax_row(float* s, int64_t L, float scale) {
  using S = Simd<VW>;
  typedef typename S::V V;
  typedef typename S::U U;
  typedef typename S::I I;
  constexpr int NA = 16 / VW;
  const I iota = lane_iota<VW>();
  const V vscale = S::set1(scale);
  const V ninf = S::set1(-std::numeric_limits<float>::infinity());
  V mx[NA], sm[NA];
  for (int a = 0; a < NA; ++a) mx[a] = ninf, sm[a] = V{};
  for (int64_t j0 = 0; j0 < L; j0 += 16)
#pragma GCC unroll 4
    for (int a = 0; a < NA; ++a) {
      U* p = reinterpret_cast<U*>(s + j0 + a * VW);
      V x = *p * vscale;
      *p = x;
      x = iota + static_cast<int32_t>(j0 + a * VW) < static_cast<int32_t>(L) ? x : ninf;
      mx[a] = x > mx[a] ? x : mx[a];
    }
  alignas(64) float part[16];
  for (int a = 0; a < NA; ++a) *reinterpret_cast<U*>(part + a * VW) = mx[a];
  const V m = S::set1(max_tree16(part));
  for (int64_t j0 = 0; j0 < L; j0 += 16)
#pragma GCC unroll 4
    for (int a = 0; a < NA; ++a) {
      U* p = reinterpret_cast<U*>(s + j0 + a * VW);
      V e = exp_v<VW>(*p - m);
      e = iota + static_cast<int32_t>(j0 + a * VW) < static_cast<int32_t>(L) ? e : V{};
      *p = e;
      sm[a] = sm[a] + e;
    }
  for (int a = 0; a < NA; ++a) *reinterpret_cast<U*>(part + a * VW) = sm[a];
  const V inv = S::set1(1.0f / in::tree16(part));
  for (int64_t j0 = 0; j0 < L; j0 += VW) {
    U* p = reinterpret_cast<U*>(s + j0);
    *p = *p * inv;
  }
}

// Softmax Jacobian of row g[0:L] in place (p the probabilities): dot = Σ_j fma(p[j], g[j], ·)
// over 16 partials (j mod 16) + tree16; g[j] ← (p[j]·(g[j] − dot))·scale. Reads p and g up to
// round_up(L, 16) (lanes j ≥ L are masked out of the dot and left unspecified).
template <int VW>
[[gnu::always_inline]] inline void softmax_grad_row(float* g, const float* p, int64_t L,
                                                    float scale) {
  using S = Simd<VW>;
  typedef typename S::V V;
  typedef typename S::U U;
  typedef typename S::I I;
  constexpr int NA = 16 / VW;
  const I iota = lane_iota<VW>();
  V dt[NA];
  for (int a = 0; a < NA; ++a) dt[a] = V{};
  for (int64_t j0 = 0; j0 < L; j0 += 16)
#pragma GCC unroll 4
    for (int a = 0; a < NA; ++a) {
      const I keep = iota + static_cast<int32_t>(j0 + a * VW) < static_cast<int32_t>(L);
      const V pv = keep ? *reinterpret_cast<const U*>(p + j0 + a * VW) : V{};
      const V gv = keep ? *reinterpret_cast<const U*>(g + j0 + a * VW) : V{};
      dt[a] = S::fma(pv, gv, dt[a]);
    }
  alignas(64) float part[16];
  for (int a = 0; a < NA; ++a) *reinterpret_cast<U*>(part + a * VW) = dt[a];
  const V dot = S::set1(in::tree16(part));
  const V vscale = S::set1(scale);
  for (int64_t j0 = 0; j0 < L; j0 += VW) {
    U* gp = reinterpret_cast<U*>(g + j0);
    *gp = *reinterpret_cast<const U*>(p + j0) * (*gp - dot) * vscale;
  }
}

// Shapes of one call: T tokens, H query heads sharing Hkv key/value heads (G = H / Hkv per
// group), head size hd; row strides ldq = H·hd (q, out, dq, dout) and ldkv = Hkv·hd (k, v, dk,
// dv); Tp, hdp: T and hd rounded up to kPad.
struct Dims {
  int64_t T, H, Hkv, G, hd, ldq, ldkv, Tp, hdp;
  float scale;
};

// Floats of per-thread workspace needed by the forward / backward head kernels.
// (kPad ≥ every variant's kMR: the row-block buffer; backward: one more row, Pr, and the
// column panels of dS and P, Tp² floats each.)
inline int64_t fwd_ws_floats(const Dims& d) { return 3 * d.Tp * d.hdp + kPad * d.Tp; }
inline int64_t bwd_ws_floats(const Dims& d) {
  return 4 * d.Tp * d.hdp + (kPad + 1) * d.Tp + 2 * d.Tp * d.Tp;
}

// Packs src[t·ld + c] (t < T, c < hd) into dst [Tp, hdp] row-major, zero padded.
[[gnu::always_inline]] inline void pack_rows(float* dst, const float* src, int64_t ld,
                                             const Dims& d) {
  for (int64_t t = 0; t < d.Tp; ++t) {
    float* o = dst + t * d.hdp;
    if (t < d.T) {
      std::memcpy(o, src + t * ld, sizeof(float) * d.hd);
      std::fill(o + d.hd, o + d.hdp, 0.0f);
    } else {
      std::fill(o, o + d.hdp, 0.0f);
    }
  }
}

// Packs the transpose: dst [hdp, Tp], dst[c·Tp + t] = src[t·ld + c], zero padded. Blocks of
// 16 tokens × 64 channels go through a small local tile: the source rows are read once,
// contiguously, and every 16-float destination run is one cache line (a direct transpose
// reads or writes with a power-of-two stride, ld or Tp, and thrashes the L1 sets).
[[gnu::always_inline]] inline void pack_cols(float* dst, const float* src, int64_t ld,
                                             const Dims& d) {
  alignas(64) float blk[16][64];
  for (int64_t t0 = 0; t0 < d.Tp; t0 += 16) {
    const int64_t nt = std::clamp<int64_t>(d.T - t0, 0, 16);
    for (int64_t c0 = 0; c0 < d.hdp; c0 += 64) {
      const int64_t nc = std::min<int64_t>(64, d.hdp - c0);
      const int64_t ncv = std::clamp<int64_t>(d.hd - c0, 0, nc);  // valid channels
      for (int64_t t = 0; t < 16; ++t) {
        const float* sr = src + (t0 + t) * ld + c0;
        const int64_t n = t < nt ? ncv : 0;
        for (int64_t c = 0; c < n; ++c) blk[t][c] = sr[c];
        for (int64_t c = n; c < nc; ++c) blk[t][c] = 0.0f;
      }
      for (int64_t c = 0; c < nc; ++c) {
        float* o = dst + (c0 + c) * d.Tp + t0;
        for (int64_t t = 0; t < 16; ++t) o[t] = blk[t][c];
      }
    }
  }
}

// Writes the rows of one head's [T, T] block, in order (row i: src[0:n], then zeros to T), as
// one stream of streaming (non-temporal) stores: att and ds rows are written once and read
// back only by the backward pass (or the caller), much later, so there is no point in
// fetching their lines first. Every 64-byte line inside the block is written whole with one
// vector store per VW floats; a line shared by two rows (T not a multiple of 16 or an
// unaligned block) is assembled in `line` from the end of one row and the start of the next.
// Only the partial lines at the two ends of the block, which neighbouring heads share, get
// plain stores. Call stream_fence() before another thread may read the block.
template <int VW>
struct RowStreamer {
  using S = Simd<VW>;
  typedef typename S::V V;
  typedef typename S::U U;
  float* base;
  int64_t T;
  bool plain;        // T < 32 (or a misaligned base): plain stores only
  static constexpr int64_t kNone = std::numeric_limits<int64_t>::min();
  int64_t pend = kNone;  // block index of the aligned line held in `line`, or kNone
  alignas(64) float line[16];

  RowStreamer(float* b, int64_t t)
      : base(b), T(t), plain(t < 32 || reinterpret_cast<uintptr_t>(b) % sizeof(float) != 0) {}

  // Block index of the first 64-byte-aligned element at or after element e.
  int64_t align_up(int64_t e) const {
    const int64_t off = static_cast<int64_t>((reinterpret_cast<uintptr_t>(base) / sizeof(float) + e) % 16);
    return off == 0 ? e : e + 16 - off;
  }

  [[gnu::always_inline]] void row(int64_t i, const float* src, int64_t n) {
    float* dst = base + i * T;
    if (plain) {
      std::memcpy(dst, src, sizeof(float) * n);
      std::fill(dst + n, dst + T, 0.0f);
      return;
    }
    auto at = [&](int64_t j) { return j < n ? src[j] : 0.0f; };
    const int64_t start = i * T, end = start + T;
    // a: first line start ≥ start; b_: last line start ≤ end (a < b_ as T ≥ 32).
    const int64_t a = align_up(start), b_ = align_up(end) == end ? end : align_up(end) - 16;
    // Head [start, a): completes the pending line (tail of row i − 1) or, for the first row,
    // is shared with the previous head's block: plain stores.
    if (a > start) {
      if (pend != kNone && pend == a - 16) {
        for (int64_t e = start; e < a; ++e) line[e - pend] = at(e - start);
        S::stream(base + pend, *reinterpret_cast<const V*>(line));
        if constexpr (VW < 16)
          for (int v = VW; v < 16; v += VW) S::stream(base + pend + v, *reinterpret_cast<const V*>(line + v));
        pend = kNone;
      } else {
        for (int64_t e = start; e < a; ++e) base[e] = at(e - start);
      }
    }
    // Middle [a, b_): whole aligned lines.
    const typename S::I iota = lane_iota<VW>();
    int64_t j = a - start;
    const int64_t jm = b_ - start;
    for (; j + VW <= std::min(n, jm); j += VW) S::stream(dst + j, *reinterpret_cast<const U*>(src + j));
    if (j < n && j < jm) {  // the vector holding element n − 1
      const V v = *reinterpret_cast<const U*>(src + j);
      S::stream(dst + j, iota + static_cast<int32_t>(j) < static_cast<int32_t>(n) ? v : V{});
      j += VW;
    }
    for (; j < jm; j += VW) S::stream(dst + j, V{});
    // Tail [b_, end): held until the next row completes the line.
    if (b_ < end) {
      pend = b_;
      for (int64_t e = b_; e < end; ++e) line[e - b_] = at(e - start);
    }
  }

  // Plain stores for a line left pending by the last row (shared with the next head's block).
  void finish() {
    if (pend == kNone) return;
    std::memcpy(base + pend, line, sizeof(float) * (T * T - pend));
    pend = kNone;
  }
};
inline void stream_fence() { __builtin_ia32_sfence(); }

// out[(i0 + r)·ld + c] (=, or += if Acc) tile[r·NRt + c − n0] for the rows < T and columns
// < hd of a tile at (i0, n0) with MR rows and NRt columns.
template <int VW, bool Acc, int MR>
[[gnu::always_inline]] inline void put_tile(float* out, const float* tile, int64_t NRt,
                                            int64_t i0, int64_t n0, int64_t ld, const Dims& d) {
  typedef typename Simd<VW>::U U;
  const int64_t rows = std::min<int64_t>(MR, d.T - i0), cols = std::min(NRt, d.hd - n0);
  for (int64_t r = 0; r < rows; ++r) {
    float* o = out + (i0 + r) * ld + n0;
    const float* t = tile + r * NRt;
    if (cols == NRt) {  // whole tile row: vectors (the same one add per element)
      for (int64_t c = 0; c < NRt; c += VW) {
        U* ov = reinterpret_cast<U*>(o + c);
        const U tv = *reinterpret_cast<const U*>(t + c);
        if constexpr (Acc)
          *ov = *ov + tv;
        else
          *ov = tv;
      }
      continue;
    }
    for (int64_t c = 0; c < cols; ++c) {
      if constexpr (Acc)
        o[c] += t[c];
      else
        o[c] = t[c];
    }
  }
}

// One (b, h) forward. q/out point at query head h's first column of token 0 of batch b (row
// stride ldq), k/v at those of its KV head h / G (row stride ldkv); att points at the [T, T]
// probability block of (b, h). Row blocks of MR queries are done
// start to finish (scores, softmax, att rows, P V) through a small [MR, Tp] buffer that stays
// in cache, so the [T, T] scores never travel to memory except as the att output.
template <int VW>
[[gnu::always_inline]] inline void head_forward(float* out, float* att, const float* q,
                                                const float* k, const float* v, const Dims& d,
                                                float* ws) {
  constexpr int MR = Simd<VW>::kMR;
  const int64_t T = d.T, Tp = d.Tp, hdp = d.hdp;
  float* Q = ws;               // [Tp, hdp]
  float* Kt = Q + Tp * hdp;    // [hdp, Tp]
  float* V = Kt + hdp * Tp;    // [Tp, hdp]
  float* Sb = V + Tp * hdp;    // [MR, Tp] scores, then probabilities, of one row block
  pack_rows(Q, q, d.ldq, d);
  pack_cols(Kt, k, d.ldkv, d);
  pack_rows(V, v, d.ldkv, d);

  alignas(64) float tile[MR * 16 * Simd<VW>::kNV];
  RowStreamer<VW> att_out(att, T);
  for (int64_t i0 = 0; i0 < T; i0 += MR) {
    // Sb[r, j] = Σ_c Q[i0 + r, c] Kᵀ[c, j] for the 16-column groups that touch j ≤ i0 + r.
    col_blocks<VW>(round_up(i0 + MR, 16), [&](int64_t n0, auto nv) {
      micro<VW, MR, decltype(nv)::value>(0, d.hd, Q + i0 * hdp, hdp, 1, Kt + n0, Tp, Sb + n0,
                                         Tp);
    });
    // Row softmax over j ≤ i; Sb row becomes P for j ≤ i, copied to att (zeros for j > i).
    // Rows i ≥ T (last block only) are read by P V below (k < T) but never used: zeros.
    for (int64_t r = 0; r < MR; ++r) {
      const int64_t i = i0 + r;
      float* s = Sb + r * Tp;
      if (i >= T) {
        std::fill(s, s + T, 0.0f);
        continue;
      }
      softmax_row<VW>(s, i + 1, d.scale);
      att_out.row(i, s, i + 1);
    }
    // O = P V for the block, k (= j) restricted to the causal range of each row.
    const int64_t k1 = std::min(i0 + MR, T);
    col_blocks<VW>(hdp, [&](int64_t n0, auto nv) {
      micro<VW, MR, decltype(nv)::value, kLower>(0, k1, Sb, Tp, 1, V + n0, hdp, tile, 16 * nv,
                                                 i0);
      put_tile<VW, false, MR>(out, tile, 16 * nv, i0, n0, d.ldq, d);
    });
  }
  att_out.finish();
  stream_fence();  // the att rows were written with streaming stores
}

// One (b, h) backward; ds points at the head's [T, T] block of `scratch`. Row blocks of MR
// queries: dP (in a small [MR, Tp] buffer), the softmax Jacobian, the ds rows and dQ. Each dS
// and P row is also scattered, MR columns at a time, into column panels (panel b holds
// columns b·MR..b·MR + MR of every row i as [Tp, MR]: a contiguous stream for the kUpper
// products dK = dSᵀ Q and dV = Pᵀ dO, which read column j over rows i ≥ j).
// dq, dout, q: query head h (stride ldq); dk, dv, k, v: its KV head (stride ldkv). The query
// heads of one KV head are run one after another on the same thread and workspace, so
// pack_kv = false (every head of a group but the first) reuses the packed K and Vᵀ of the
// previous call, which must have been for the same KV head.
template <int VW>
[[gnu::always_inline]] inline void head_backward(float* dq, float* dk, float* dv, float* ds,
                                                 const float* dout, const float* q,
                                                 const float* k, const float* v,
                                                 const float* att, const Dims& d, float* ws,
                                                 bool pack_kv) {
  constexpr int MR = Simd<VW>::kMR;
  const int64_t T = d.T, Tp = d.Tp, hdp = d.hdp;
  float* Q = ws;                // [Tp, hdp]
  float* K = Q + Tp * hdp;      // [Tp, hdp]
  float* dO = K + Tp * hdp;     // [Tp, hdp]
  float* Vt = dO + Tp * hdp;    // [hdp, Tp]
  float* Db = Vt + hdp * Tp;    // [MR, Tp] dP, then dS, of one row block
  float* Pr = Db + MR * Tp;     // [Tp] copy of an att row whose 16-lane tail would leave att
  float* Dp = Pr + Tp;          // [Tp / MR][Tp, MR] column panels of dS (i ≥ j used)
  float* Pp = Dp + Tp * Tp;     // [Tp / MR][Tp, MR] the same panels of P
  pack_rows(Q, q, d.ldq, d);
  pack_rows(dO, dout, d.ldq, d);
  if (pack_kv) {
    pack_rows(K, k, d.ldkv, d);
    pack_cols(Vt, v, d.ldkv, d);
  }

  alignas(64) float tile[MR * 16 * Simd<VW>::kNV];
  RowStreamer<VW> ds_out(ds, T);
  for (int64_t i0 = 0; i0 < T; i0 += MR) {
    // dP = dO Vᵀ on the 16-column groups that touch j ≤ i.
    col_blocks<VW>(round_up(i0 + MR, 16), [&](int64_t n0, auto nv) {
      micro<VW, MR, decltype(nv)::value>(0, d.hd, dO + i0 * hdp, hdp, 1, Vt + n0, Tp, Db + n0,
                                         Tp);
    });
    // dS = scale · P ⊙ (dP − rowsum(P ⊙ dP)) for j ≤ i, written to `ds` (zero for j > i).
    for (int64_t r = 0; r < MR; ++r) {
      const int64_t i = i0 + r;
      float* g = Db + r * Tp;
      if (i >= T) {  // read by dQ below (k < T), never used
        std::fill(g, g + T, 0.0f);
        continue;
      }
      const float* p = att + i * T;
      if (i * T + round_up(i + 1, 16) > T * T) {  // the vector tail would read past att
        std::memcpy(Pr, p, sizeof(float) * (i + 1));
        p = Pr;
      }
      softmax_grad_row<VW>(g, p, i + 1, d.scale);
      ds_out.row(i, g, i + 1);
      // Panels: columns j0..j0 + MR of row i for j0 ≤ i (lanes j > i hold values that the
      // kUpper products never read).
      for (int64_t j0 = 0; j0 <= i; j0 += MR) {
        std::memcpy(Dp + (j0 * Tp + i * MR), g + j0, sizeof(float) * MR);
        std::memcpy(Pp + (j0 * Tp + i * MR), p + j0, sizeof(float) * MR);
      }
    }
    // dQ += dS K: row i needs j ≤ i only.
    const int64_t k1 = std::min(i0 + MR, T);
    col_blocks<VW>(hdp, [&](int64_t n0, auto nv) {
      micro<VW, MR, decltype(nv)::value, kLower>(0, k1, Db, Tp, 1, K + n0, hdp, tile, 16 * nv,
                                                 i0);
      put_tile<VW, true, MR>(dq, tile, 16 * nv, i0, n0, d.ldq, d);
    });
  }
  ds_out.finish();
  stream_fence();  // the ds rows were written with streaming stores
  // dK += dSᵀ Q and dV += Pᵀ dO: row j needs i ≥ j only; A(r, i) = panel[i·MR + r].
  for (int64_t j0 = 0; j0 < T; j0 += MR)
    col_blocks<VW>(hdp, [&](int64_t n0, auto nv) {
      constexpr int NV = decltype(nv)::value;
      micro<VW, MR, NV, kUpper>(j0, T, Dp + j0 * Tp, 1, MR, Q + n0, hdp, tile, 16 * nv, j0);
      put_tile<VW, true, MR>(dk, tile, 16 * nv, j0, n0, d.ldkv, d);
      micro<VW, MR, NV, kUpper>(j0, T, Pp + j0 * Tp, 1, MR, dO + n0, hdp, tile, 16 * nv, j0);
      put_tile<VW, true, MR>(dv, tile, 16 * nv, j0, n0, d.ldkv, d);
    });
}

using FwdFn = void (*)(float*, float*, const float*, const float*, const float*, const Dims&,
                       float*);
using BwdFn = void (*)(float*, float*, float*, float*, const float*, const float*, const float*,
                       const float*, const float*, const Dims&, float*, bool);

#define FP4_ATTN_VARIANT(SUFFIX, TARGET, VW)                                                      \
  TARGET void head_forward_##SUFFIX(float* out, float* att, const float* q, const float* k,  \
                                    const float* v, const Dims& d, float* ws) {              \
    head_forward<VW>(out, att, q, k, v, d, ws);                                                   \
  }                                                                                           \
  TARGET void head_backward_##SUFFIX(float* dq, float* dk, float* dv, float* ds,             \
                                     const float* dout, const float* q, const float* k,      \
                                     const float* v, const float* att, const Dims& d,        \
                                     float* ws, bool pack_kv) {                               \
    head_backward<VW>(dq, dk, dv, ds, dout, q, k, v, att, d, ws, pack_kv);                        \
  }

FP4_ATTN_VARIANT(avx512, __attribute__((target("avx512f"))), 16)
FP4_ATTN_VARIANT(avx2, __attribute__((target("avx2,fma"))), 8)
FP4_ATTN_VARIANT(base, , 4)
#undef FP4_ATTN_VARIANT

enum class Isa { kAvx512, kAvx2, kBase };
Isa detect_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && cpu_isa_allowed(CpuIsa::Avx512)) return Isa::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      cpu_isa_allowed(CpuIsa::Avx2))
    return Isa::kAvx2;
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

Dims make_dims(int64_t T, int64_t H, int64_t Hkv, int64_t hd, const char* fn) {
  in::check_attention_dims(T, H, Hkv, hd, fn);
  Dims d;
  d.T = T;
  d.H = H;
  d.Hkv = Hkv;
  d.G = H / Hkv;
  d.hd = hd;
  d.ldq = H * hd;
  d.ldkv = Hkv * hd;
  d.Tp = round_up(T, kPad);
  d.hdp = round_up(hd, kPad);
  d.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  return d;
}

}  // namespace

void attention_forward(float* out, float* att, const float* q, const float* k, const float* v,
                       int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t hd) {
  if (B <= 0) return;
  const Dims d = make_dims(T, H, Hkv, hd, "attention_forward");
  const FwdFn fn = pick_forward();
  // One (b, query head) per iteration: every output element and att row has one producer.
#pragma omp parallel if (B * H * T * T * d.hd >= kParallelMin)
  {
    float* ws = thread_ws(fwd_ws_floats(d));
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < B * H; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const int64_t offq = b * T * d.ldq + h * hd, offkv = b * T * d.ldkv + (h / d.G) * hd;
      fn(out + offq, att + bh * T * T, q + offq, k + offkv, v + offkv, d, ws);
    }
  }
}

void attention_backward(float* dq, float* dk, float* dv, float* scratch, const float* dout,
                        const float* q, const float* k, const float* v, const float* att,
                        int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t hd) {
  if (B <= 0) return;
  const Dims d = make_dims(T, H, Hkv, hd, "attention_backward");
  const BwdFn fn = pick_backward();
  // One (b, KV head) per iteration, its G query heads in ascending order on that thread: the
  // dk/dv rows of a KV head receive the query heads' contributions in the order h = g·G, …,
  // g·G + G − 1 whatever the thread count (the scalar twin adds them in the same order).
#pragma omp parallel if (B * H * T * T * d.hd >= kParallelMin)
  {
    float* ws = thread_ws(bwd_ws_floats(d));
#pragma omp for schedule(static)
    for (int64_t bg = 0; bg < B * Hkv; ++bg) {
      const int64_t b = bg / Hkv, g = bg % Hkv;
      const int64_t offkv = b * T * d.ldkv + g * hd;
      for (int64_t r = 0; r < d.G; ++r) {
        const int64_t h = g * d.G + r, bh = b * H + h;
        const int64_t offq = b * T * d.ldq + h * hd;
        fn(dq + offq, dk + offkv, dv + offkv, scratch + bh * T * T, dout + offq, q + offq,
           k + offkv, v + offkv, att + bh * T * T, d, ws, r == 0);
      }
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
