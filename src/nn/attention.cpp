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
// bit for bit (tests/nn/test_attention_twin.cpp). Sums over the causal range never include the
// masked terms above the diagonal (see Tri below) and vector tails mask the lanes j > i, so
// neither the zero padding nor whatever lies above the diagonal can change a bit.
//
// The vector helpers below pass and return 32/64-byte vectors; they are always inlined into
// functions built for the matching target, so the -Wpsabi note about the ABI does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

#include "fp4/base/cpu_isa.h"
#include "fp4/base/int_math.h"

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

// Which k each micro-kernel row r sums over (diag is the block's first row index):
//   kFull:  k0 ≤ k < k1                        (S = Q Kᵀ, dP = dO Vᵀ)
//   kLower: k0 ≤ k < k1 and k ≤ diag + r       (O = P V, dQ = dS K: j ≤ i)
//   kUpper: k0 ≤ k < k1 and k ≥ diag + r       (dK = dSᵀ Q, dV = Pᵀ dO: i ≥ j)
// The triangular modes skip the masked terms instead of multiplying what is stored above
// the diagonal. For finite zeros that would change at most the sign of a zero (fma(0, x, acc)
// leaves acc unchanged unless acc is −0, which a sum from +0 reaches only when its nonzero
// products are negative and underflow to −0), but 0·inf = NaN would leak a
// non-finite value from token j into rows i < j, and the kernels no longer even store zeros
// there; skipping keeps the kernel causal for any input and makes it a plain causal sum, as
// in the scalar twin (attention_ref.cpp).
enum Tri { kFull, kLower, kUpper };

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

// The 16-lane vector types and micro-kernel block shared by the native AVX-512 body and its
// emulated twin (namespace emu), so both run the same 8 × 32 blocks.
struct Lanes16 {
  typedef float V __attribute__((vector_size(64)));
  typedef float U __attribute__((vector_size(64), aligned(4), may_alias));
  typedef int32_t I __attribute__((vector_size(64)));
  static constexpr int kMR = 8, kNV = 2;  // 8 × 32: 16 zmm accumulators
};

namespace native {

// Native vectors of VW floats / int32 (16: AVX-512, 8: AVX2, 4: SSE2) with the operations
// that are not plain GCC vector-extension arithmetic (which -ffp-contract=off keeps unfused):
// broadcast (a shuffle that GCC emits as vbroadcastss), fused multiply-add, and a streaming
// store. Everything here is always inlined into the per-ISA entry points (target attributes),
// so the asm operands get the right registers. kMR × kNV is the micro-kernel's main block
// (rows × 16-column groups).
template <int VW>
struct Simd;
template <>
struct Simd<16> : Lanes16 {
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

#include "attention_body.inc"
}  // namespace native

// The AVX-512 body (16 lanes, the 8 × 32 micro-kernel, the same blocks, loops and streaming
// order) on any x86-64 CPU: 64-byte GCC vectors, which the baseline build lowers to SSE2,
// with the fused multiply-add as std::fma per lane (correctly rounded however it is computed,
// so the same bits as vfmadd231ps) and plain stores for the streaming ones. Not used for
// training: detail::set_attention_isa(kEmu16) selects it so that tests run the wide body's
// blocking against the scalar twin on machines without AVX-512 (CTest label `emulated`).
namespace emu {
template <int VW>
struct Simd;
template <>
struct Simd<16> : Lanes16 {  // the native Simd<16>'s types and blocks
  [[gnu::always_inline]] static inline V set1(float x) {
    V v;
    for (int l = 0; l < 16; ++l) v[l] = x;
    return v;
  }
  [[gnu::always_inline]] static inline V fma(V a, V b, V c) {
    for (int l = 0; l < 16; ++l) c[l] = std::fma(a[l], b[l], c[l]);
    return c;
  }
  [[gnu::always_inline]] static inline void stream(float* p, V v) {
    std::memcpy(p, &v, sizeof v);
  }
};
#include "attention_body.inc"
}  // namespace emu

using FwdFn = void (*)(float*, float*, const float*, const float*, const float*, const Dims&,
                       float*);
using BwdFn = void (*)(float*, float*, float*, float*, const float*, const float*, const float*,
                       const float*, const float*, const Dims&, float*, bool);

#define FP4_ATTN_VARIANT(SUFFIX, TARGET, NS, VW)                                              \
  TARGET void head_forward_##SUFFIX(float* out, float* att, const float* q, const float* k,  \
                                    const float* v, const Dims& d, float* ws) {              \
    NS::head_forward<VW>(out, att, q, k, v, d, ws);                                          \
  }                                                                                           \
  TARGET void head_backward_##SUFFIX(float* dq, float* dk, float* dv, float* ds,             \
                                     const float* dout, const float* q, const float* k,      \
                                     const float* v, const float* att, const Dims& d,        \
                                     float* ws, bool pack_kv) {                               \
    NS::head_backward<VW>(dq, dk, dv, ds, dout, q, k, v, att, d, ws, pack_kv);               \
  }

FP4_ATTN_VARIANT(avx512, __attribute__((target("avx512f"))), native, 16)
FP4_ATTN_VARIANT(avx2, __attribute__((target("avx2,fma"))), native, 8)
FP4_ATTN_VARIANT(base, , native, 4)
FP4_ATTN_VARIANT(emu16, , emu, 16)
#undef FP4_ATTN_VARIANT

enum class Isa { kAvx512, kAvx2, kBase, kEmu16 };
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
  switch (g_isa) {
    case Isa::kAvx512: return head_forward_avx512;
    case Isa::kAvx2: return head_forward_avx2;
    case Isa::kEmu16: return head_forward_emu16;
    case Isa::kBase: break;
  }
  return head_forward_base;
}
BwdFn pick_backward() {
  switch (g_isa) {
    case Isa::kAvx512: return head_backward_avx512;
    case Isa::kAvx2: return head_backward_avx2;
    case Isa::kEmu16: return head_backward_emu16;
    case Isa::kBase: break;
  }
  return head_backward_base;
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
    case AttentionIsa::kEmu16: want = Isa::kEmu16; break;
  }
  const bool ok = want == Isa::kBase || want == Isa::kEmu16 || (want == Isa::kAvx2 && best != Isa::kBase) ||
                  (want == Isa::kAvx512 && best == Isa::kAvx512);
  if (ok) g_isa = want;
  return ok;
}
}  // namespace detail

}  // namespace fp4::nn
