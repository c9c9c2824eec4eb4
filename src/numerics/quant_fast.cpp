// Fast twins of the scalar block quantizers (block_quant.cpp): Highway SIMD, several x86 targets
// chosen at run time, OpenMP over fixed work units. Contract: quant_fast.h, docs/numerics.md
// "Quantizing one operand", "Rounding a magnitude" and "Random Hadamard transform".
//
// Why the bits match the scalar reference. Every FP32 operation of the reference is done here
// as the same IEEE operation, in the same order, on the same operands, just in vector lanes:
//  * tensor scales ge, gd, mult: computed once, by the same scalar expressions;
//  * block amax: max of |x| bit patterns (exact, order-free);
//  * block scale: c = a_b·mult, min(c, scale_max), detail::round_magnitude_params (RNE) written
//    lane-wise (RoundMag in hwy_common.h: the same clamp, exponent field, power-of-two
//    scalings — built from bit patterns, subnormal powers included for UE8M0 — truncation, δ,
//    tie/SR test), zero guard, d_b = c_b·gd, e_b = 1/d_b (a true IEEE division, never a
//    reciprocal estimate);
//  * element: y = x·e_b, NaN (0·Inf) → 0, E2M1 rounding (SR8: RoundMag; RNE: an IEEE add of a
//    magic constant whose spacing is the grid's, proven equal in RoundE2M1Rne; RNA: the
//    reference's truncation and exact δ ≥ 0.5 test, E2M1RnaSteps), copysign, ·d_b;
//  * RHT: the same sign multiply, the same four butterfly stages (a + b, a − b) in the same
//    order, and ·0.25, lane-wise over 16 rows instead of along one 16-long row (Rht16Load in
//    hwy_common.h); the BF16 variant adds fp4::round_bf16 of the inputs and of the outputs,
//    lane-wise on the bit patterns (the same integer add of 0x7FFF + bit 16, the same NaN rule);
//  * SR bytes: Philox4x32-10 lane-wise (32×32→64-bit products via MulEven), same counters and
//    keys as philox.cpp, bytes stored in the same little-endian order.
// No multiply-add is ever fused: the project compiles with -ffp-contract=off and this file uses
// Mul and Add separately (never MulAdd), also on the FMA-capable targets.
//
// Speed. The row kernel is one pass per block-row (amax, Lanes block scales at a time, elements);
// blocks that are not whole vectors (8 on AVX-512) are walked in whole vectors, each lane's
// scales looked up from its block (docs/numerics.md "Block sizes and the fast path").
// The quantize-transpose works on tiles of lcm(B, 16) rows × Lanes columns: vertical loads
// (and the RHT as vertical butterflies), one block per lane for amax and scales, a gather per
// output vector. Its output lines are scattered (one per column), so for large outputs it uses
// streaming stores, which skip reading every output line first (3× faster here at 64 MiB);
// tests force every store mode on every target (quant_fast_stream_min_bytes).
// BF16 output (the decoded-BF16 GEMM's operands, Plan::out16): the same kernels write each
// output row, or each column run of a tile, to a per-thread FP32 buffer that stays in L1 and
// convert it there (StoreBf16Bits, the RNE of bf16.h); the quantize-transpose then takes tiles
// of 32 rows, so that a column run is one 64-byte line of BF16, streamed for large outputs.
//
// Dispatch: foreach_target.h compiles the kernels below once per target in HWY_TARGETS; the
// HWY_ONCE section keeps one table of them, and fp4/numerics/hwy_dispatch.h (shared with
// pack_fast.cpp and layers_fast.cpp) picks the best target this CPU and FP4_MAX_CPU_ISA allow;
// quant_fast_use_target() lets tests run every target. The helpers this file shares with
// pack_fast.cpp (the lane-wise rounding and block-scale pieces, amax, the vertical RHT, the
// scale parameters, the argument checks, the plain transpose) are in hwy_common.h.

// ------------------------------------------------------------------------------------------
// Shared declarations (compiled once; this file is re-included once per target).
#ifndef FP4_NUMERICS_QUANT_FAST_SHARED_
#define FP4_NUMERICS_QUANT_FAST_SHARED_

// GCC 12's avx512fintrin.h builds masked intrinsics on _mm512_undefined_*() and then warns that
// the "undefined" source is used uninitialized once they are inlined here (a known false
// positive of those headers, not of this code).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "fp4/numerics/quant_fast.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <numeric>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "fp4/base/error.h"
#include "fp4/numerics/format.h"
#include "fp4/numerics/hadamard.h"
#include "hwy_common.h"  // the plain section; its per-target section is included below

namespace fp4::qf {

using hwy_common::kMaxLanes;

/// Everything a kernel needs about one call (plain data, shared by all targets): the block
/// scales' parameters (hwy_common::ScaleParams: tensor scales, scale grid, SR key) and these.
struct Plan : hwy_common::ScaleParams {
  const float* x = nullptr;
  float* out = nullptr;
  int64_t rows = 0, cols = 0;  ///< shape of x
  int64_t B = 16;              ///< block length (or tile side for two_d)
  bool two_d = false;
  int64_t block_rows = 0, block_cols = 0;  ///< row kernel's block grid
  /// MX scale rule (E2M1 elements, UE8M0 scales only): 0 = tensor-scaled, 1 = mx-te
  /// (2^ceil(log2(a_b/6))), 2 = mx-ocp (2^(floor(log2 a_b) − 2)); mult = gd = 1 then.
  int mx = 0;
  int kmin = 0, kmax = 0;  ///< MX: the scale format's exponent range (UE8M0: −127, 127)
  bool rht = false;  ///< transposed kernel: RHT16 along rows first
  bool rht_bf16 = false;  ///< with rht: the BF16 variant (rht16_rows_bf16)
  const float* rht_signs = kRhtSigns;  ///< with rht: the 16 signs (a 16-point HadamardTransform's)
  int64_t panel_rows = 16, panel_cols = 64;  ///< transposed kernel: work unit (panel) of x
  /// Transposed kernel: rows of x per tile, a whole number of blocks (tile_rows(): B, or for
  /// blocks that are not a multiple of 16 the smallest multiple of both, e.g. 16 for B = 8).
  int64_t H = 16;
  /// Write whole 64-byte output lines with non-temporal (streaming) stores where the kernel can
  /// (aligned, complete lines); set by the driver for large outputs. Never changes values.
  bool stream = false;
  int64_t out_mis = 0;  ///< (address of out mod 64) / 4: output misalignment in floats
  /// Four Over Six (row kernel; docs/numerics.md "Four Over Six"): 0 off, 1 MAE, 2 MSE; its
  /// error reads the tensor reference g and divides by denom = fl(T·6).
  int fos = 0;
  float g = 0.f, denom = 0.f;
  /// Row kernel, row-scaled operand (1-D blocks, tensor-scaled): row r's reference row_g[r]
  /// replaces g in mult and gd (quantize_dequantize_rows); null: the call's g.
  const float* row_g = nullptr;
  float target = 448.f;  ///< T, for the per-row tensor scales
  /// BF16 output (bit patterns) in place of out: each output row (row kernel) or column run of
  /// a tile (transposed kernel) is written to Scratch::stage as FP32, then converted into out16
  /// (StoreBf16Bits, hwy_common.h); never with Plan::stream (see stream16). The layout is out's.
  uint16_t* out16 = nullptr;
  /// Transposed kernel with out16: write each column run of a tile (H = 32 rows: one 64-byte
  /// line of BF16) with a streaming store; set by the driver for large, aligned outputs.
  bool stream16 = false;
};

/// Per-thread buffers of one call, sized for the largest target.
struct Scratch {
  std::vector<float> amax, d, e;  ///< per block of one block-row (row kernel) or tile
  std::vector<uint64_t> sr;       ///< SR bytes, 8 per word (Philox output, 16 bytes per block)
  std::vector<uint64_t> sr2;      ///< second SR buffer (unaligned column runs)
  std::vector<uint32_t> ctr;      ///< Philox counters of a tile
  std::vector<float> tile;        ///< transposed kernel: [H][lanes] tile
  std::vector<float> dT, eT;      ///< transposed kernel, H > B: scales per column [lanes][ld]
  std::vector<float> carry;       ///< transposed kernel, misaligned streaming: 16 per column
  std::vector<float> pad;         ///< 2·kMaxLanes: a zero-padded vector and its result
  std::vector<uint8_t> padsr;     ///< kMaxLanes SR bytes of the padded vector
  std::vector<float> err4, err6;  ///< Four Over Six: per block of a block-row, its two errors
  std::vector<float> terms;       ///< Four Over Six: one block's error terms (B + kMaxLanes)
  std::vector<float> stage;       ///< BF16 output (Plan::out16): one output row or column run

  void for_rows(const Plan& p) {
    const size_t nb = static_cast<size_t>(p.block_cols + kMaxLanes);
    amax.assign(nb, 0.f);
    d.assign(nb, 0.f);
    e.assign(nb, 0.f);
    if (p.sr) sr.assign(static_cast<size_t>(2 * (p.cols / 16 + 2 + kMaxLanes)), 0);
    if (p.fos != 0) {
      err4.assign(nb, 0.f);
      err6.assign(nb, 0.f);
      terms.assign(static_cast<size_t>(p.B + kMaxLanes), 0.f);
    }
    if (p.out16) stage.assign(static_cast<size_t>(p.cols + kMaxLanes), 0.f);
    common();
  }
  void for_cols(const Plan& p) {
    const int64_t nb = p.H / p.B;  // blocks per tile
    amax.assign(kMaxLanes, 0.f);
    d.assign(static_cast<size_t>(nb * kMaxLanes), 0.f);
    e.assign(static_cast<size_t>(nb * kMaxLanes), 0.f);
    if (nb > 1) {
      dT.assign(static_cast<size_t>(kMaxLanes * (nb + kMaxLanes)), 0.f);
      eT.assign(static_cast<size_t>(kMaxLanes * (nb + kMaxLanes)), 0.f);
    }
    if (p.sr) {
      const size_t inst = static_cast<size_t>(kMaxLanes * (p.H / 16 + 2) + kMaxLanes);
      sr.assign(2 * inst, 0);
      sr2.assign(static_cast<size_t>(2 * (p.H / 16 + 2 + kMaxLanes)), 0);
      ctr.assign(inst, 0);
    }
    tile.assign(static_cast<size_t>(std::max<int64_t>(p.H, 16) * kMaxLanes), 0.f);
    if (p.stream) carry.assign(static_cast<size_t>(p.panel_cols * 16), 0.f);
    if (p.out16) stage.assign(static_cast<size_t>(std::max<int64_t>(p.H, 16) + kMaxLanes), 0.f);
    common();
  }
  void for_rht_amax() {
    tile.assign(static_cast<size_t>(16 * kMaxLanes), 0.f);
    common();
  }
  void common() {
    pad.assign(2 * kMaxLanes, 0.f);
    padsr.assign(kMaxLanes, 0);
  }
};

/// The kernels of one SIMD target.
struct Kernels {
  const char* name;
  /// Row kernel: block-row `br` of p (1-D: one row; 2-D: B rows). False (nothing written) if
  /// the block-row holds a non-finite value.
  bool (*rows)(const Plan& p, int64_t br, Scratch& s);
  /// Transposed kernel: work unit `unit` (panel unit / ncp, unit % ncp of x, ncp the number of
  /// column panels) of the quantize-transpose. False if the unit (after the RHT) holds a
  /// non-finite value; earlier tiles may be written.
  bool (*cols)(const Plan& p, int64_t unit, Scratch& s);
  /// max |x| bit pattern over x[0..n).
  uint32_t (*amax)(const float* x, int64_t n);
  /// max |RHT| bit pattern over x rows [16·strip, 16·strip + 16), all columns.
  /// bf16: of the BF16 variant (rht16_rows_bf16); signs: the 16 signs of the transform.
  uint32_t (*amax_rht)(const float* x, int64_t rows, int64_t cols, int64_t strip, bool bf16,
                       const float* signs, Scratch& s);
  /// 16·n_inst SR bytes of the Philox blocks b0 .. b0 + n_inst − 1 into out, which must have room
  /// for kMaxLanes extra blocks.
  void (*philox)(const SrKey& key, uint64_t b0, int64_t n_inst, uint64_t* out);
};

}  // namespace fp4::qf

#endif  // FP4_NUMERICS_QUANT_FAST_SHARED_

// ------------------------------------------------------------------------------------------
// Per-target kernels.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "quant_fast.cpp"  // found via the room's own src/ dir (fp4_room)
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "hwy_common.h"  // its per-target section: Pow2, RoundMag, ... (once per target)

HWY_BEFORE_NAMESPACE();
namespace fp4::qf::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace fp4::hwy_common::HWY_NAMESPACE;  // DF, DI, VF, VI and the shared helpers

/// Block scales of the amax lanes: d_b (decode) and e_b = 1/d_b (encode), as block_quant.cpp's
/// block_scale then `d = c_b·gd; e = 1/d` (tensor-scaled: TensorScaledBlockScale).
template <bool kSub>
HWY_INLINE void BlockScales(VF amax, const Plan& p, VF& dv, VF& ev) {
  const DF df;
  if (p.mx != 0) {
    // block_quant.cpp's mx_block_scale for E2M1 (emax 6, emax_exp 2), exactly: with
    // A = floor(log2 a_b) (the exponent field − 127 for a normal a_b), OCP takes k = A − 2; TE's
    // ceil(log2(a_b/6)) is A − 2 when a_b ≤ 6·2^(A−2) = 1.5·2^A, else A − 1, and a_b > 1.5·2^A
    // iff its fraction field exceeds 0x400000. A subnormal a_b (field 0, A taken as −127 ≥ its
    // true exponent) gives k ≤ −128 either way, clamped to kmin = −127 like the reference's.
    const DI di;
    const VI bits = hn::BitCast(di, amax);
    VI k = hn::Sub(hn::ShiftRight<23>(bits), hn::Set(di, 127 + 2));
    if (p.mx == 1) {
      const auto up = hn::Gt(hn::And(bits, hn::Set(di, 0x7FFFFF)), hn::Set(di, 0x400000));
      k = hn::Add(k, hn::IfThenElseZero(up, hn::Set(di, 1)));
    }
    k = hn::Min(hn::Max(k, hn::Set(di, p.kmin)), hn::Set(di, p.kmax));
    VF c = Pow2<kSub>(k);
    c = hn::IfThenElse(hn::Eq(amax, hn::Zero(df)), hn::Set(df, 1.0f), c);  // zero-block guard
    dv = hn::Mul(c, hn::Set(df, p.gd));  // gd = 1 under the MX rules: dv = c_b either way
    ev = hn::Div(hn::Set(df, 1.0f), dv);
    return;
  }
  (void)TensorScaledBlockScale<kSub>(amax, p, dv, ev);
}

/// RNE of |y| (not NaN) onto the E2M1 grid, equal to RoundMag<false, false>(y, 1, 0, 6, ·) but
/// cheaper: after the clamp a = min(|y|, 6), the exponent e = max(floor(log2 a), 0) ∈ {0, 1, 2}
/// gives the grid spacing u = 2^(e−1), and with M = 1.5·2^(22+e) = 3·2^22·u the FP32 sum a + M
/// lies in [2^(22+e), 2^(23+e)), whose spacing is exactly u: the IEEE add rounds a to the
/// nearest multiple of u, ties to an even multiple (M/u = 3·2^22 is even, so the parity is that
/// of lo + up in the reference), which is the reference's RNE; (a + M) − M is then exact. The
/// largest result is 6 (a ≤ 6 = 3·u for e = 2), so no final clamp is needed.
HWY_INLINE VF RoundE2M1Rne(VF y) {
  const DF df;
  const DI di;
  VI e;
  const VF a = E2M1Clamp(y, e);
  const VF m = hn::BitCast(df, hn::Add(hn::Set(di, 0x4AC00000), hn::ShiftLeft<23>(e)));  // 3·2^21·2^e
  return hn::Sub(hn::Add(a, m), m);
}

/// SR8 of |y| (not NaN) onto the E2M1 grid with offsets off = (2r+1)/512, equal to
/// RoundMag<true, false>(y, 1, 0, 6, off) but cheaper. With a = min(|y|, 6), e ∈ {0, 1, 2} and
/// spacing u = 2^(e−1) as above, s = a/u < 4 is exact and the reference computes lo = ⌊s⌋,
/// δ = s − lo, up = fl(δ + off) ≥ 1, result (lo + up)·u. Here: t = fl(s + off), result ⌊t⌋·u.
/// Same decision: if lo = 0 then δ = s and t is the reference's sum itself. If lo ≥ 1, s is a
/// multiple of 2^−23 (s ∈ [1, 2)) or 2^−22 (s ∈ [2, 4)) and off of 2^−9, so δ + off (< 2) is
/// exact in FP32, and s + off is exact too unless it is ≥ 2 with s < 2 or ≥ 4 with s ≥ 3 — cases
/// where s + off ≥ lo + 1 already holds and RNE cannot take it below the integer lo + 1. So
/// ⌊t⌋ = lo + up (off < 1), and ⌊t⌋·u ≤ 3·2 = 6 needs no clamp.
HWY_INLINE VF RoundE2M1Sr(VF y, VF off) {
  const DF df;
  const DI di;
  VI e;
  const VF a = E2M1Clamp(y, e);
  const VF inv_u = hn::BitCast(df, hn::ShiftLeft<23>(hn::Sub(hn::Set(di, 128), e)));  // 2^(1−e)
  const VF u = hn::BitCast(df, hn::ShiftLeft<23>(hn::Add(e, hn::Set(di, 126))));      // 2^(e−1)
  const VF t = hn::Add(hn::Mul(a, inv_u), off);
  return hn::Mul(hn::ConvertTo(df, hn::ConvertTo(di, t)), u);
}

/// RNA of |y| (not NaN) onto the E2M1 grid: E2M1RnaSteps (hwy_common.h) times the spacing u.
HWY_INLINE VF RoundE2M1Rna(VF y) {
  const DF df;
  const DI di;
  VI e;
  const VF a = E2M1Clamp(y, e);
  const VF u = hn::BitCast(df, hn::ShiftLeft<23>(hn::Add(e, hn::Set(di, 126))));  // 2^(e−1)
  return hn::Mul(hn::ConvertTo(df, E2M1RnaSteps(a, e)), u);
}

/// x̂ = copysign(round_E2M1(x·e_b), x)·d_b, as block_quant.cpp's quant_mag + copysign·d;
/// kR is the element rounding (RNE, SR8 with offsets sroff, or RNA).
template <Rounding kR>
HWY_INLINE VF QdqVec(VF x, VF ev, VF dv, VF sroff) {
  VF y = hn::Mul(x, ev);
  y = hn::IfThenZeroElse(hn::IsNaN(y), y);  // 0·Inf (e_b overflowed) is taken as 0
  // E2M1 (kE2M1): 1 fraction bit, exponent floor 1 − bias = 0, max 6; powers of two 2^±1 only.
  VF v;
  if constexpr (kR == Rounding::SR8) {
    v = RoundE2M1Sr(y, sroff);
  } else if constexpr (kR == Rounding::RNA) {
    (void)sroff;
    v = RoundE2M1Rna(y);
  } else {
    (void)sroff;
    v = RoundE2M1Rne(y);
  }
  return hn::Mul(hn::CopySignToAbs(v, x), dv);
}

/// Store v at p: a non-temporal store if `stream` (p then must be vector-aligned), else StoreU.
HWY_INLINE void Put(VF v, float* p, bool stream) {
  const DF df;
  if (stream) {
    hn::Stream(v, df, p);
  } else {
    hn::StoreU(v, df, p);
  }
}

// ---------------------------------------------------------------- Philox4x32-10 (SR bytes)

#if HWY_TARGET == HWY_SCALAR
// One-lane target (the generic x86-64 baseline with GCC < 12.3, where Highway's EMU128 is off):
// 64-bit lanes cannot be split into 32-bit halves, so Philox runs as plain integer code.
HWY_INLINE void PhiloxOne(const SrKey& key, uint32_t c0, uint64_t* out) {
  uint32_t c1 = key.step, c2 = (key.layer << 8) + (key.operand << 4) + key.gemm,
           c3 = (key.micro << 16) + 0x5352u;
  uint32_t k0 = static_cast<uint32_t>(key.seed), k1 = static_cast<uint32_t>(key.seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t{0xD2511F53u} * c0, p1 = uint64_t{0xCD9E8D57u} * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  out[0] = c0 | (uint64_t{c1} << 32);
  out[1] = c2 | (uint64_t{c3} << 32);
}

void PhiloxContig(const SrKey& key, uint64_t b0, int64_t n_inst, uint64_t* out) {
  for (int64_t i = 0; i < n_inst; ++i) {
    PhiloxOne(key, static_cast<uint32_t>(b0 + static_cast<uint64_t>(i)), out + 2 * i);
  }
}

HWY_INLINE void PhiloxCounters(const SrKey& key, const uint32_t* ctr, int64_t n_inst,
                               uint64_t* out) {
  for (int64_t i = 0; i < n_inst; ++i) PhiloxOne(key, ctr[i], out + 2 * i);
}

HWY_INLINE void PhiloxStrided(const SrKey& key, uint64_t first, uint64_t stride, int64_t per,
                              int64_t n_inst, uint32_t* /*ctr*/, uint64_t* out) {
  for (int64_t t = 0; t < n_inst; ++t) {
    const uint64_t b = first + static_cast<uint64_t>(t / per) * stride + static_cast<uint64_t>(t % per);
    PhiloxOne(key, static_cast<uint32_t>(b), out + 2 * t);
  }
}
#else
/// Philox4x32-10 of the counters (c0 lanes, step, layer/operand/gemm word, micro·2^16 + 0x5352)
/// under the key, in 64-bit lanes holding 32-bit words; stores 16 bytes per lane (v0 | v1 << 32 then
/// v2 | v3 << 32, little-endian: byte b of the block is word b/4 >> 8·(b%4), as philox.cpp).
HWY_INLINE void PhiloxStore(const SrKey& key, hn::Vec<hn::ScalableTag<uint64_t>> c0,
                            uint64_t* out) {
  const hn::ScalableTag<uint64_t> d64;
  const hn::Repartition<uint32_t, decltype(d64)> d32;
  using V64 = hn::Vec<decltype(d64)>;
  const V64 lo_mask = hn::Set(d64, 0xFFFFFFFFull);
  const auto m0 = hn::BitCast(d32, hn::Set(d64, 0xD2511F53ull));
  const auto m1 = hn::BitCast(d32, hn::Set(d64, 0xCD9E8D57ull));
  V64 c1 = hn::Set(d64, static_cast<uint64_t>(key.step));
  V64 c2 = hn::Set(d64, static_cast<uint64_t>(
                            static_cast<uint32_t>((key.layer << 8) + (key.operand << 4) + key.gemm)));
  V64 c3 = hn::Set(d64, static_cast<uint64_t>(static_cast<uint32_t>((key.micro << 16) + 0x5352u)));
  uint32_t k0 = static_cast<uint32_t>(key.seed), k1 = static_cast<uint32_t>(key.seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const V64 p0 = hn::MulEven(hn::BitCast(d32, c0), m0);  // M0·ctr0, full 64-bit product
    const V64 p1 = hn::MulEven(hn::BitCast(d32, c2), m1);  // M1·ctr2
    const V64 n0 = hn::Xor(hn::Xor(hn::ShiftRight<32>(p1), c1), hn::Set(d64, uint64_t{k0}));
    const V64 n1 = hn::And(p1, lo_mask);
    const V64 n2 = hn::Xor(hn::Xor(hn::ShiftRight<32>(p0), c3), hn::Set(d64, uint64_t{k1}));
    const V64 n3 = hn::And(p0, lo_mask);
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += 0x9E3779B9u;  // key bump between rounds (the last bump is unused)
    k1 += 0xBB67AE85u;
  }
  const V64 lo = hn::Or(c0, hn::ShiftLeft<32>(c1));
  const V64 hi = hn::Or(c2, hn::ShiftLeft<32>(c3));
  hn::StoreInterleaved2(lo, hi, d64, out);
}

/// Blocks b0 .. b0 + n_inst − 1 (counter word 0 = low 32 bits of the block index); writes whole
/// vectors, i.e. up to Lanes − 1 extra blocks.
void PhiloxContig(const SrKey& key, uint64_t b0, int64_t n_inst, uint64_t* out) {
  const hn::ScalableTag<uint64_t> d64;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d64));
  const auto lo_mask = hn::Set(d64, 0xFFFFFFFFull);
  for (int64_t i = 0; i < n_inst; i += N) {
    const auto c0 = hn::And(hn::Iota(d64, b0 + static_cast<uint64_t>(i)), lo_mask);
    PhiloxStore(key, c0, out + 2 * i);
  }
}

/// Blocks with the given counter words ctr[0..n_inst) (ctr padded to whole vectors).
HWY_INLINE void PhiloxCounters(const SrKey& key, const uint32_t* ctr, int64_t n_inst,
                               uint64_t* out) {
  const hn::ScalableTag<uint64_t> d64;
  const hn::Rebind<uint32_t, decltype(d64)> d32h;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d64));
  for (int64_t i = 0; i < n_inst; i += N) {
    PhiloxStore(key, hn::PromoteTo(d64, hn::LoadU(d32h, ctr + i)), out + 2 * i);
  }
}

/// Blocks first + (t / per)·stride + t % per for t < n_inst (the column runs of a transposed
/// tile: per blocks per column, columns `stride` blocks apart). Counters are computed in
/// registers when per is a power of two (stride < 2^32); otherwise through ctr (scratch).
HWY_INLINE void PhiloxStrided(const SrKey& key, uint64_t first, uint64_t stride, int64_t per,
                              int64_t n_inst, uint32_t* ctr, uint64_t* out) {
  const hn::ScalableTag<uint64_t> d64;
  const hn::Repartition<uint32_t, decltype(d64)> d32;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d64));
  if ((per & (per - 1)) == 0 && stride < (uint64_t{1} << 32)) {
    const int shift = std::countr_zero(static_cast<uint64_t>(per));
    const auto lo_mask = hn::Set(d64, 0xFFFFFFFFull);
    const auto kmask = hn::Set(d64, static_cast<uint64_t>(per - 1));
    const auto sv = hn::BitCast(d32, hn::Set(d64, stride));
    const auto fv = hn::Set(d64, first);
    for (int64_t i = 0; i < n_inst; i += N) {
      const auto t = hn::Iota(d64, static_cast<uint64_t>(i));
      const auto col = hn::ShiftRightSame(t, shift);
      const auto b = hn::Add(hn::Add(fv, hn::MulEven(hn::BitCast(d32, col), sv)), hn::And(t, kmask));
      PhiloxStore(key, hn::And(b, lo_mask), out + 2 * i);
    }
    return;
  }
  for (int64_t t = 0; t < n_inst; ++t) {
    ctr[t] = static_cast<uint32_t>(first + static_cast<uint64_t>(t / per) * stride +
                                   static_cast<uint64_t>(t % per));
  }
  PhiloxCounters(key, ctr, n_inst, out);
}
#endif  // HWY_TARGET == HWY_SCALAR

/// SR bytes of elements first .. first + n − 1 of the operand: returns a pointer into buf
/// (which needs 2·(n/16 + 2 + kMaxLanes) words).
HWY_INLINE const uint8_t* SrRun(const SrKey& key, uint64_t first, int64_t n, uint64_t* buf) {
  const uint64_t b0 = first / 16, b1 = (first + static_cast<uint64_t>(n) - 1) / 16;
  PhiloxContig(key, b0, static_cast<int64_t>(b1 - b0 + 1), buf);
  return reinterpret_cast<const uint8_t*>(buf) + (first % 16);
}

// ---------------------------------------------------------------- tensor amax

uint32_t AmaxBits(const float* x, int64_t n) {
  const DF df;
  const DI di;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  VI m0 = hn::Zero(di), m1 = hn::Zero(di), m2 = hn::Zero(di), m3 = hn::Zero(di);
  int64_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    m0 = hn::Max(m0, AbsBits(hn::LoadU(df, x + i)));
    m1 = hn::Max(m1, AbsBits(hn::LoadU(df, x + i + N)));
    m2 = hn::Max(m2, AbsBits(hn::LoadU(df, x + i + 2 * N)));
    m3 = hn::Max(m3, AbsBits(hn::LoadU(df, x + i + 3 * N)));
  }
  for (; i + N <= n; i += N) m0 = hn::Max(m0, AbsBits(hn::LoadU(df, x + i)));
  const VI m = hn::Max(hn::Max(m0, m1), hn::Max(m2, m3));
  uint32_t r = static_cast<uint32_t>(hn::GetLane(hn::MaxOfLanes(di, m)));
  for (; i < n; ++i) r = std::max(r, std::bit_cast<uint32_t>(x[i]) & 0x7FFFFFFFu);
  return r;
}

// ---------------------------------------------------------------- row kernel

/// One vector of a block: out[0..k) = QdqVec(x[0..k)) for k < Lanes, through a zero-padded copy
/// (so partial vectors run the same lane code as full ones).
template <Rounding kR>
HWY_INLINE void QdqPartial(const float* x, const uint8_t* sr, int64_t k, VF ev, VF dv,
                           Scratch& s, float* out) {
  constexpr bool kSR = kR == Rounding::SR8;
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  float* px = s.pad.data();
  float* po = px + kMaxLanes;
  uint8_t* psr = s.padsr.data();
  for (int64_t t = 0; t < N; ++t) {
    px[t] = t < k ? x[t] : 0.0f;
    if constexpr (kSR) psr[t] = t < k ? sr[t] : 0;
  }
  const VF off = kSR ? SrOffsets(psr) : hn::Zero(df);
  hn::StoreU(QdqVec<kR>(hn::LoadU(df, px), ev, dv, off), df, po);
  for (int64_t t = 0; t < k; ++t) out[t] = po[t];
}

// ---------------------------------------------------------------- Four Over Six (row kernel)

/// Four Over Six error terms of one vector, lane-wise as block_quant.cpp's four_over_six_error:
/// q = copysign(round_E2M1(x·e_b), x) (QdqVec's element), v = fl(fl(fl(q·c)·g) / denom),
/// then |v − x| (MAE) or (v − x)² (MSE).
template <Rounding kR>
HWY_INLINE VF FosTerms(VF x, VF ev, VF cv, const Plan& p, VF off) {
  const DF df;
  VF y = hn::Mul(x, ev);
  y = hn::IfThenZeroElse(hn::IsNaN(y), y);
  VF m;
  if constexpr (kR == Rounding::SR8) {
    m = RoundE2M1Sr(y, off);
  } else if constexpr (kR == Rounding::RNA) {
    (void)off;
    m = RoundE2M1Rna(y);
  } else {
    (void)off;
    m = RoundE2M1Rne(y);
  }
  const VF q = hn::CopySignToAbs(m, x);
  const VF v = hn::Div(hn::Mul(hn::Mul(q, cv), hn::Set(df, p.g)), hn::Set(df, p.denom));
  const VF diff = hn::Sub(v, x);
  return p.fos == 2 ? hn::Mul(diff, diff) : hn::Abs(diff);
}

/// The 4/6 error of quantizing x[0..len) with block scale c: the terms in lanes (a zero-padded
/// last vector), then summed from 0 in element order in scalar FP32, as the reference does.
template <Rounding kR>
float FosBlockError(const float* x, const uint8_t* sr, int64_t len, float c, const Plan& p,
                    Scratch& s) {
  constexpr bool kSR = kR == Rounding::SR8;
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const float d = c * p.gd;
  const VF ev = hn::Set(df, 1.0f / d), cv = hn::Set(df, c);
  float* t = s.terms.data();
  int64_t j = 0;
  for (; j + N <= len; j += N) {
    const VF off = kSR ? SrOffsets(sr + j) : hn::Zero(df);
    hn::StoreU(FosTerms<kR>(hn::LoadU(df, x + j), ev, cv, p, off), df, t + j);
  }
  if (j < len) {
    float* px = s.pad.data();
    uint8_t* psr = s.padsr.data();
    for (int64_t k = 0; k < N; ++k) {
      px[k] = j + k < len ? x[j + k] : 0.0f;
      if constexpr (kSR) psr[k] = j + k < len ? sr[j + k] : 0;
    }
    const VF off = kSR ? SrOffsets(psr) : hn::Zero(df);
    hn::StoreU(FosTerms<kR>(hn::LoadU(df, px), ev, cv, p, off), df, t + j);
  }
  float err = 0.0f;
  for (int64_t k = 0; k < len; ++k) err += t[k];
  return err;
}

/// Four Over Six block scales of block-row [r0, r1) into s.d, s.e (block_quant.cpp's
/// four_over_six_scales): per block the two candidates (detail::four_over_six_candidates),
/// each row's error, summed over the rows in order; c4 only if its error is strictly lower.
template <Rounding kR>
void FosScales(const Plan& p, int64_t r0, int64_t r1, Scratch& s) {
  constexpr bool kSR = kR == Rounding::SR8;
  const int64_t cols = p.cols, B = p.B, nbc = p.block_cols;
  std::fill(s.err4.begin(), s.err4.begin() + nbc, 0.0f);
  std::fill(s.err6.begin(), s.err6.begin() + nbc, 0.0f);
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = p.x + r * cols;
    const uint8_t* srp = nullptr;
    if constexpr (kSR) srp = SrRun(p.key, static_cast<uint64_t>(r * cols), cols, s.sr.data());
    for (int64_t bc = 0; bc < nbc; ++bc) {
      const int64_t c0 = bc * B, len = std::min(B, cols - c0);
      const auto [c4, c6] =
          detail::four_over_six_candidates(s.amax[bc], p.ge, 6.0f, p.sfrac, p.semin, p.smax);
      const uint8_t* sb = kSR ? srp + c0 : nullptr;
      s.err4[bc] += FosBlockError<kR>(xr + c0, sb, len, c4, p, s);
      s.err6[bc] += FosBlockError<kR>(xr + c0, sb, len, c6, p, s);
    }
  }
  for (int64_t bc = 0; bc < nbc; ++bc) {
    const auto [c4, c6] =
        detail::four_over_six_candidates(s.amax[bc], p.ge, 6.0f, p.sfrac, p.semin, p.smax);
    const float c = s.err4[bc] < s.err6[bc] ? c4 : c6;
    const float d = c * p.gd;  // d_b = c_b·gd, e_b = 1/d_b
    s.d[bc] = p.block_scaled_out ? c : d;  // the output multiplier: c_b for q·c_b
    s.e[bc] = 1.0f / d;
  }
}

template <Rounding kR, bool kSub>
bool RowsT(const Plan& p, int64_t br, Scratch& s) {
  constexpr bool kSR = kR == Rounding::SR8;
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const int64_t cols = p.cols, B = p.B, nbc = p.block_cols;
  const int64_t r0 = p.two_d ? br * B : br;
  const int64_t r1 = p.two_d ? std::min(p.rows, r0 + B) : br + 1;
  // Streaming stores write whole 64-byte lines: with cols % 16 == 0 every vector of a row is a
  // whole line (or half of one, 8 lanes) if out is 64-byte aligned (mis == 0). Otherwise
  // (16-lane targets only) each line is the previous vector's last `mis` values and this one's
  // first 16 − mis, assembled in registers; a row's first and last lines are shared with the
  // neighbouring rows and written with masked plain stores.
  bool stream = p.stream && cols % 16 == 0;
  if (stream && p.out_mis != 0 && N != 16) stream = false;
  const int64_t mis = stream ? p.out_mis : 0;
  const auto keep_first = hn::FirstN(df, static_cast<size_t>(mis));  // lanes t < mis
  alignas(64) int32_t rot_arr[kMaxLanes];
  for (int64_t t = 0; t < N; ++t) rot_arr[t] = static_cast<int32_t>((t - mis + N) % N);
  const auto rot = hn::SetTableIndices(df, rot_arr);  // Rot(v)[t] = v[(t − mis) mod 16]
  float* am = s.amax.data();
  // 1. block amax over the whole block-row (read everything before writing: out may alias x)
  if (!BlockRowAmax(p.x + r0 * cols, cols, r1 - r0, cols, B, nbc, am)) return false;
  // 2. block scales, Lanes blocks at a time (Four Over Six: the lower-error candidate)
  if (p.fos != 0) {
    FosScales<kR>(p, r0, r1, s);
  } else {
    for (int64_t bc = 0; bc < nbc; bc += N) {
      VF dv, ev;
      BlockScales<kSub>(hn::LoadU(df, am + bc), p, dv, ev);
      hn::StoreU(dv, df, s.d.data() + bc);
      hn::StoreU(ev, df, s.e.data() + bc);
    }
  }
  // 3. elements. Blocks of whole vectors (B % Lanes == 0) one at a time, their scales
  // broadcast; other blocks (e.g. 8 on 16 lanes) in a walk of whole vectors along the row,
  // each lane's scales looked up from its block (LaneBlockRel, LookupBlocks).
  const bool walk = B % N != 0;
  const int64_t qN = N / B, rN = N % B, kmax = (B + N - 2) / B;
  const VI rel0 = LaneBlockRel(0, B, kmax);
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = p.x + r * cols;
    float* orow = p.out16 ? s.stage.data() : p.out + r * cols;
    const uint8_t* srp = nullptr;
    if constexpr (kSR) srp = SrRun(p.key, static_cast<uint64_t>(r * cols), cols, s.sr.data());
    VF prev = hn::Zero(df);  // misaligned streaming: Rot of the previous vector
    auto put = [&](VF v, int64_t j) {
      if (mis == 0) {
        Put(v, orow + j, stream);
        return;
      }
      const VF rv = hn::TableLookupLanes(v, rot);
      if (j == 0) {
        hn::BlendedStore(rv, hn::Not(keep_first), df, orow - mis);  // orow[0, 16 − mis)
      } else {
        hn::Stream(hn::IfThenElse(keep_first, prev, rv), df, orow + j - mis);
      }
      prev = rv;
    };
    if (!walk) {
      for (int64_t bc = 0; bc < nbc; ++bc) {
        const int64_t c0 = bc * B, len = std::min(B, cols - c0);
        const VF dv = hn::Set(df, s.d[bc]);
        const VF ev = hn::Set(df, s.e[bc]);
        int64_t j = c0;
        const int64_t c1 = c0 + len;
        for (; j + N <= c1; j += N) {
          const VF off = kSR ? SrOffsets(srp + j) : hn::Zero(df);
          put(QdqVec<kR>(hn::LoadU(df, xr + j), ev, dv, off), j);
        }
        if (j < c1) QdqPartial<kR>(xr + j, kSR ? srp + j : nullptr, c1 - j, ev, dv, s, orow + j);
      }
    } else {
      int64_t bc0 = 0, o0 = 0, j = 0;
      VI rel = rel0;
      for (; j + N <= cols; j += N) {
        const VF dv = LookupBlocks(s.d.data() + bc0, rel);
        const VF ev = LookupBlocks(s.e.data() + bc0, rel);
        const VF off = kSR ? SrOffsets(srp + j) : hn::Zero(df);
        put(QdqVec<kR>(hn::LoadU(df, xr + j), ev, dv, off), j);
        BlockWalkStep(B, qN, rN, bc0, o0);
        if (rN != 0) rel = LaneBlockRel(o0, B, kmax);
      }
      if (j < cols) {
        QdqPartial<kR>(xr + j, kSR ? srp + j : nullptr, cols - j,
                        LookupBlocks(s.e.data() + bc0, rel), LookupBlocks(s.d.data() + bc0, rel), s,
                        orow + j);
      }
    }
    if (mis != 0) hn::BlendedStore(prev, keep_first, df, orow + cols - mis);  // last mis values
    if (p.out16) StoreBf16Bits(orow, cols, p.out16 + r * cols);
  }
  if (stream) hwy::FlushStream();
  return true;
}

template <Rounding kR>
bool RowsR(const Plan& p, int64_t br, Scratch& s) {
  return p.sub_pow2 ? RowsT<kR, true>(p, br, s) : RowsT<kR, false>(p, br, s);
}

bool Rows(const Plan& p, int64_t br, Scratch& s) {
  if (p.row_g) {  // row-scaled: this row's tensor scales, by the same expressions
    Plan rp = p;
    hwy_common::set_tensor_scales(rp, p.target, p.row_g[br]);
    rp.row_g = nullptr;
    return Rows(rp, br, s);
  }
  if (p.sr) return RowsR<Rounding::SR8>(p, br, s);
  return p.rna ? RowsR<Rounding::RNA>(p, br, s) : RowsR<Rounding::RNE>(p, br, s);
}

// ---------------------------------------------------------------- RHT16 (vertical)

/// Copy rows [r0, r0 + h) × cols [c0, c0 + w) of x into the tile T [h][Lanes], zero-padding
/// columns w..Lanes.
HWY_INLINE void LoadTile(const float* x, int64_t cols, int64_t r0, int64_t h, int64_t c0,
                         int64_t w, float* T) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  if (w == N) {
    for (int64_t i = 0; i < h; ++i) hn::StoreU(hn::LoadU(df, x + (r0 + i) * cols + c0), df, T + i * N);
  } else {
    for (int64_t i = 0; i < h; ++i) {
      const float* xr = x + (r0 + i) * cols + c0;
      for (int64_t j = 0; j < N; ++j) T[i * N + j] = j < w ? xr[j] : 0.0f;
    }
  }
}

// ---------------------------------------------------------------- transposed kernel

template <Rounding kR, bool kSub, bool kRht>
bool ColsT(const Plan& p, int64_t unit, Scratch& s) {
  constexpr bool kSR = kR == Rounding::SR8;
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const int64_t rows = p.rows, cols = p.cols, B = p.B, H = p.H;
  // A unit is a panel of x: rows [pr0, pr1) (whole tiles) × columns [pc0, pc1).
  const int64_t ncp = (cols + p.panel_cols - 1) / p.panel_cols;
  const int64_t pr0 = (unit / ncp) * p.panel_rows, pr1 = std::min(rows, pr0 + p.panel_rows);
  const int64_t pc0 = (unit % ncp) * p.panel_cols, pc1 = std::min(cols, pc0 + p.panel_cols);
  float* T = s.tile.data();
  const VI gidx = RowIndices(N);
  uint8_t* srb = reinterpret_cast<uint8_t*>(s.sr.data());
  // A tile of H rows holds H / B blocks per column; with more than one (B not a multiple of
  // 16), each column's output vectors walk over its blocks, their lanes' scales looked up from
  // the column's run of scales in dT, eT (ld apart), as the row kernel's walk does.
  const int64_t ld = H / B + kMaxLanes;
  const int64_t qN = N / B, rN = N % B, kmax = (B + N - 2) / B;
  const VI rel0 = LaneBlockRel(0, B, kmax);

  // Streaming stores write whole 64-byte lines of the output rows. With rows % 16 == 0 and
  // tiles of multiples of 16 rows, every output row starts at the same offset `mis` (floats)
  // from a line boundary. mis == 0: each tile's vectors are whole aligned lines. mis != 0 (e.g.
  // the 16-byte alignment of glibc's large allocations), 16-lane targets only: the line ending
  // in this tile is the previous tile's last `mis` values (kept per column in s.carry, already
  // rotated) followed by this tile's first 16 − mis, assembled in registers; the unit's first
  // and last partial lines (shared with the neighbouring unit) use masked plain stores.
  bool stream = p.stream && rows % 16 == 0 && H % 16 == 0;
  if (stream && p.out_mis != 0 && N != 16) stream = false;
  const int64_t mis = stream ? p.out_mis : 0;
  const auto keep_first = hn::FirstN(df, static_cast<size_t>(mis));  // lanes t < mis
  alignas(64) int32_t rot_arr[kMaxLanes];
  for (int64_t t = 0; t < N; ++t) rot_arr[t] = static_cast<int32_t>((t - mis + N) % N);
  const auto rot = hn::SetTableIndices(df, rot_arr);  // Rot(v)[t] = v[(t − mis) mod 16]

  auto tile = [&](int64_t r0, int64_t c0) -> bool {
    const int64_t h = std::min(H, rows - r0);
    const int64_t nbt = (h + B - 1) / B;  // blocks per column in this tile
    // SR bytes of a column run are whole Philox blocks when the runs start and end on
    // multiples of 16 of the operand's flat index c·rows + r.
    const bool sr_aligned = rows % 16 == 0 && r0 % 16 == 0 && h % 16 == 0;
    const int64_t w = std::min(N, pc1 - c0);
    // 1. tile [h][N] (columns ≥ w zero), RHT applied per 16 rows
    if constexpr (kRht) {
      if (w == N) {
        for (int64_t g = 0; g < h; g += 16) {
          VF v[16];
          Rht16Load(p.x + (r0 + g) * cols + c0, cols, v, p.rht_bf16, p.rht_signs);
          for (int i = 0; i < 16; ++i) hn::StoreU(v[i], df, T + (g + i) * N);
        }
      } else {
        LoadTile(p.x, cols, r0, h, c0, w, T);
        for (int64_t g = 0; g < h; g += 16) {
          VF v[16];
          Rht16Load(T + g * N, N, v, p.rht_bf16, p.rht_signs);
          for (int i = 0; i < 16; ++i) hn::StoreU(v[i], df, T + (g + i) * N);
        }
      }
    } else {
      LoadTile(p.x, cols, r0, h, c0, w, T);
    }
    // 2. block amax of each column (one block per lane), block scales: block k's in
    // s.d, s.e [k·N, k·N + N); with several blocks, also per column in dT, eT [j·ld + k]
    for (int64_t k = 0; k < nbt; ++k) {
      VI m;
      if (!ColumnAmaxBits(T + k * B * N, N, std::min(B, h - k * B), m)) return false;
      VF dv, ev;
      BlockScales<kSub>(hn::BitCast(df, m), p, dv, ev);
      hn::StoreU(dv, df, s.d.data() + k * N);
      hn::StoreU(ev, df, s.e.data() + k * N);
    }
    if (nbt > 1) {
      for (int64_t j = 0; j < w; ++j)
        for (int64_t k = 0; k < nbt; ++k) {
          s.dT[j * ld + k] = s.d[k * N + j];
          s.eT[j * ld + k] = s.e[k * N + j];
        }
    }
    // 3. SR bytes of the w column runs: srb[j·h + i] is the byte of element (c0 + j, r0 + i)
    if constexpr (kSR) {
      if (sr_aligned) {
        // Philox blocks (c·rows + r0)/16 + k, k < h/16, for columns c = c0 + j, in that order.
        const int64_t per = h / 16;
        const uint64_t first = (static_cast<uint64_t>(c0) * static_cast<uint64_t>(rows) +
                                static_cast<uint64_t>(r0)) / 16;
        PhiloxStrided(p.key, first, static_cast<uint64_t>(rows / 16), per, w * per, s.ctr.data(),
                      s.sr.data());
      } else {
        for (int64_t j = 0; j < w; ++j) {
          const uint64_t first = static_cast<uint64_t>(c0 + j) * static_cast<uint64_t>(rows) +
                                 static_cast<uint64_t>(r0);
          std::memcpy(srb + j * h, SrRun(p.key, first, h, s.sr2.data()), static_cast<size_t>(h));
        }
      }
    }
    // 4. each column of the tile is one output row segment out[c, r0 .. r0 + h)
    for (int64_t j = 0; j < w; ++j) {
      VF dv = hn::Set(df, s.d[j]);
      VF ev = hn::Set(df, s.e[j]);
      float* o = p.out16 ? s.stage.data() : p.out + (c0 + j) * rows + r0;
      const uint8_t* sj = kSR ? srb + j * h : nullptr;
      // the walk over the column's blocks (nbt > 1): scales of the vector at i, then a step
      int64_t bc0 = 0, o0 = 0;
      VI rel = rel0;
      auto scales = [&]() {
        if (nbt == 1) return;
        dv = LookupBlocks(s.dT.data() + j * ld + bc0, rel);
        ev = LookupBlocks(s.eT.data() + j * ld + bc0, rel);
        BlockWalkStep(B, qN, rN, bc0, o0);
        if (rN != 0) rel = LaneBlockRel(o0, B, kmax);
      };
      if (mis == 0) {
        int64_t i = 0;
        for (; i + N <= h; i += N) {
          scales();
          const VF xv = hn::GatherIndex(df, T + i * N + j, gidx);
          const VF off = kSR ? SrOffsets(sj + i) : hn::Zero(df);
          Put(QdqVec<kR>(xv, ev, dv, off), o + i, stream);
        }
        if (i < h) {
          scales();
          float col[kMaxLanes];
          for (int64_t t = 0; t < h - i; ++t) col[t] = T[(i + t) * N + j];
          QdqPartial<kR>(col, kSR ? sj + i : nullptr, h - i, ev, dv, s, o + i);
        }
      } else {
        // Misaligned streaming (N == 16, h % 16 == 0): vector k covers o[16k, 16k + 16); the
        // aligned line starting at o + 16k − mis is Rot(prev)[t < mis] | Rot(v_k)[t ≥ mis].
        float* carry = s.carry.data() + (c0 + j - pc0) * 16;
        VF prev = hn::LoadU(df, carry);  // Rot of the previous tile's last vector
        for (int64_t i = 0; i < h; i += 16) {
          scales();
          const VF xv = hn::GatherIndex(df, T + i * N + j, gidx);
          const VF off = kSR ? SrOffsets(sj + i) : hn::Zero(df);
          const VF r = hn::TableLookupLanes(QdqVec<kR>(xv, ev, dv, off), rot);
          if (i == 0 && r0 == pr0) {
            // the unit's first line is shared with the previous unit: plain masked store of
            // this tile's part, o[0, 16 − mis) (lanes mis.. of the line)
            hn::BlendedStore(r, hn::Not(keep_first), df, o - mis);
          } else {
            hn::Stream(hn::IfThenElse(keep_first, prev, r), df, o + i - mis);
          }
          prev = r;
        }
        hn::StoreU(prev, df, carry);
        if (r0 + H >= pr1) {
          // the unit's last line is shared with the next unit: o[h − mis, h) (lanes < mis)
          hn::BlendedStore(prev, keep_first, df, o + h - mis);
        }
      }
      if (p.out16) {
        uint16_t* dst = p.out16 + (c0 + j) * rows + r0;
#if HWY_TARGET != HWY_SCALAR
        if (p.stream16) {  // whole lines of BF16 (h = 32, a multiple of 2N), streamed
          const hn::Repartition<uint16_t, DF> d16;
          alignas(64) uint16_t line[2 * kMaxLanes];
          for (int64_t i = 0; i < h; i += 2 * N) {
            StoreBf16Bits(o + i, 2 * N, line);
            hn::Stream(hn::Load(d16, line), d16, dst + i);
          }
          continue;
        }
#endif
        StoreBf16Bits(o, h, dst);
      }
    }
    return true;
  };

  if (stream || p.stream16) {
    // Streaming: strip by strip (x read sequentially along its rows), all columns per strip.
    for (int64_t r0 = pr0; r0 < pr1; r0 += H)
      for (int64_t c0 = pc0; c0 < pc1; c0 += N)
        if (!tile(r0, c0)) return false;
    hwy::FlushStream();
  } else {
    // Plain stores: down the rows for each column tile, so every output row receives pr1 − pr0
    // contiguous floats per visit and the unit touches few enough 4 KiB pages for the TLB.
    for (int64_t c0 = pc0; c0 < pc1; c0 += N)
      for (int64_t r0 = pr0; r0 < pr1; r0 += H)
        if (!tile(r0, c0)) return false;
  }
  return true;
}

template <Rounding kR, bool kRht>
bool ColsR(const Plan& p, int64_t unit, Scratch& s) {
  return p.sub_pow2 ? ColsT<kR, true, kRht>(p, unit, s) : ColsT<kR, false, kRht>(p, unit, s);
}

template <Rounding kR>
bool ColsRht(const Plan& p, int64_t unit, Scratch& s) {
  return p.rht ? ColsR<kR, true>(p, unit, s) : ColsR<kR, false>(p, unit, s);
}

bool Cols(const Plan& p, int64_t unit, Scratch& s) {
  if (p.sr) return ColsRht<Rounding::SR8>(p, unit, s);
  return p.rna ? ColsRht<Rounding::RNA>(p, unit, s) : ColsRht<Rounding::RNE>(p, unit, s);
}

uint32_t AmaxRht(const float* x, int64_t rows, int64_t cols, int64_t strip, bool bf16,
                 const float* signs, Scratch& s) {
  (void)rows;
  const DF df;
  const DI di;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const int64_t r0 = strip * 16;
  VI m = hn::Zero(di);
  for (int64_t c0 = 0; c0 < cols; c0 += N) {
    const int64_t w = std::min(N, cols - c0);
    VF v[16];
    if (w == N) {
      Rht16Load(x + r0 * cols + c0, cols, v, bf16, signs);
    } else {
      LoadTile(x, cols, r0, 16, c0, w, s.tile.data());
      Rht16Load(s.tile.data(), N, v, bf16, signs);
    }
    for (int i = 0; i < 16; ++i) m = hn::Max(m, AbsBits(v[i]));
  }
  return static_cast<uint32_t>(hn::GetLane(hn::MaxOfLanes(di, m)));
}

}  // namespace fp4::qf::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

// ------------------------------------------------------------------------------------------
// Dispatch and public API (compiled once).
#if HWY_ONCE
#include "fp4/numerics/hwy_dispatch.h"
namespace fp4 {
namespace qf {
namespace {

using hwy_common::kParallelMin;
/// Work unit (panel of x) of the transposed kernel: rows (rounded down to whole blocks, at
/// least one) × columns (a multiple of every target's lane count).
constexpr int64_t kPanelRows = 128;
constexpr int64_t kPanelCols = 128;

/// Rows of x per tile of the transposed kernel (Plan::H) for blocks of B: B itself when it is
/// a multiple of 16; else the smallest multiple of both B and 16 (16 for B = 8, 48 for B = 24),
/// so that a column of a tile fills whole vectors, its SR bytes are whole Philox blocks and the
/// RHT's 16-row chunks lie inside it; B again when that multiple would exceed 256 rows (odd B
/// over 16, ...), where each block's last vector is a partial one.
int64_t tile_rows(int64_t B) {
  if (B % 16 == 0) return B;
  const int64_t l = B / std::gcd(B, int64_t{16}) * 16;
  return l <= 256 ? l : B;
}

/// Outputs of at least this many bytes are written with streaming (non-temporal) stores when
/// their address allows it (64-byte aligned): they would not stay in a core's caches anyway, and
/// skipping the read-for-ownership of every output line is what lets the quantize-transpose
/// (whose output lines are scattered) run near copy speed. Smaller outputs stay in the caches
/// for the GEMM that consumes them. Measured here (bench_quant): the transposed kernel gains
/// from 16 MiB up (1.6× at [4096, 1024]); the row kernel, whose stores are sequential, loses
/// ~10% at 16 MiB and gains ~25% at 64 MiB.
constexpr int64_t kStreamMinBytesRows = int64_t{32} << 20;
constexpr int64_t kStreamMinBytesTransposed = int64_t{16} << 20;
/// Test/benchmark override of both thresholds (quant_fast_stream_min_bytes); < 0: defaults.
std::atomic<int64_t> g_stream_min_bytes{-1};

/// Work unit of the streaming transposed kernel: rows of x (whole blocks, at least one) ×
/// columns (a multiple of every target's lane count). Tall units keep the partial output lines
/// at unit edges (misaligned out: masked plain stores, each costing a line read) rare; measured
/// at [4096, 4096]: 256 × 4096 and 1024 × 1024 are equally fast aligned, 1024 × 1024 is
/// faster misaligned, 64-row units are 2× slower misaligned.
constexpr int64_t kStreamUnitRows = 1024;
constexpr int64_t kStreamUnitCols = 1024;

/// Whether an output of `bytes` is large enough for streaming stores: default_min_bytes, or the
/// test/benchmark override (quant_fast_stream_min_bytes).
bool stream_size(int64_t bytes, int64_t default_min_bytes) {
  const int64_t o = g_stream_min_bytes.load(std::memory_order_relaxed);
  return bytes >= (o >= 0 ? o : default_min_bytes);
}

/// Whether an output of n floats at `out` is written with streaming stores (the kernels handle
/// any float-aligned out; see Plan::out_mis).
bool use_stream(const float* out, int64_t n, int64_t default_min_bytes) {
  return stream_size(n * int64_t{sizeof(float)}, default_min_bytes) &&
         reinterpret_cast<uintptr_t>(out) % sizeof(float) == 0;
}

#define FP4_QF_KERNELS(NS, NAME) \
  Kernels { NAME, &NS::Rows, &NS::Cols, &NS::AmaxBits, &NS::AmaxRht, &NS::PhiloxContig }

/// Targets compiled in, supported by this CPU and allowed by FP4_MAX_CPU_ISA, best first
/// (fp4/numerics/hwy_dispatch.h: the dispatch shared with pack_fast.cpp and layers_fast.cpp).
#define FP4_QF_ENTRY(NS, TARGET) {TARGET, FP4_QF_KERNELS(NS, hwy_dispatch::target_name(TARGET))},
const hwy_dispatch::Table<Kernels>& table() {
  static const hwy_dispatch::Table<Kernels> t({FP4_HWY_FOR_EACH_TARGET(FP4_QF_ENTRY)});
  return t;
}
#undef FP4_QF_ENTRY
const std::vector<Kernels>& available() { return table().runnable(); }

std::atomic<const Kernels*> g_active{nullptr};

const Kernels& active() {
  const Kernels* k = g_active.load(std::memory_order_acquire);
  if (k == nullptr) {
    k = &available().front();
    g_active.store(k, std::memory_order_release);
  }
  return *k;
}

#undef FP4_QF_KERNELS

/// For the transposed kernels: name the first non-finite element of x [rows, cols], or say that
/// only the RHT of x overflowed.
[[noreturn]] void throw_non_finite_2d(const char* where, const float* x, int64_t rows,
                                      int64_t cols) {
  const int64_t n = rows * cols;
  int64_t i = 0;
  while (i < n && std::isfinite(x[i])) ++i;
  char buf[200];
  if (i < n) {
    std::snprintf(buf, sizeof buf, "%s: element (%lld, %lld) of x is %s (inputs must be finite)",
                  where, static_cast<long long>(i / cols), static_cast<long long>(i % cols),
                  std::isnan(x[i]) ? "NaN" : "Inf");
  } else {
    std::snprintf(buf, sizeof buf,
                  "%s: the 16-point RHT of x overflows FP32 (inputs must transform to finite "
                  "values)",
                  where);
  }
  throw NonFiniteError(buf);
}

bool known_scale_format(ScaleFormat f) {
  return f == ScaleFormat::UE5M3 || f == ScaleFormat::UE5M3_PTX || f == ScaleFormat::E4M3 ||
         f == ScaleFormat::UE8M0;
}

Plan make_plan(const float* x, float* out, int64_t rows, int64_t cols, const BlockQuantSpec& spec,
               float g, const SrKey* sr) {
  Plan p;
  p.x = x;
  p.out = out;
  p.rows = rows;
  p.cols = cols;
  p.B = spec.block;
  p.two_d = spec.two_d;
  p.block_cols = (cols + p.B - 1) / p.B;
  p.block_rows = spec.two_d ? (rows + p.B - 1) / p.B : rows;
  hwy_common::set_scale_params(p, spec, g, sr);
  if (spec.scale_rule != ScaleRule::TensorScaled) {  // MX: no tensor scale (block_quant.cpp)
    const FloatFormat& fmt = scale_format_desc(spec.scale_format);
    p.mx = spec.scale_rule == ScaleRule::MxTe ? 1 : 2;
    p.mult = p.gd = 1.0f;
    p.kmin = detail::rounding_emin(fmt);
    p.kmax = std::ilogb(fmt.max_finite);
  }
  p.fos = static_cast<int>(spec.four_over_six);  // Off 0, MAE 1, MSE 2
  p.g = g;
  p.denom = spec.target * 6.0f;
  return p;
}

/// The calling thread's Scratch, kept from call to call: its for_* methods assign (the same
/// values as a fresh Scratch) into the capacity already there, so steady-state calls allocate
/// nothing. OpenMP's pool threads live as long as the process, and with them their scratch.
Scratch& thread_scratch() {
  thread_local Scratch s;
  return s;
}

}  // namespace
}  // namespace qf

bool quant_fast_supports(const BlockQuantSpec& spec) {
  // The SIMD kernels implement E2M1 elements with tensor-scaled block scales of the
  // ScaleFormat enum, and the MX rules with UE8M0 scales (MXFP4); other element formats,
  // spelled scale formats and MX rules on other formats run the scalar reference.
  const bool rule_ok = spec.scale_rule == ScaleRule::TensorScaled ||
                       ((spec.scale_rule == ScaleRule::MxTe || spec.scale_rule == ScaleRule::MxOcp) &&
                        spec.scale_format == ScaleFormat::UE8M0);
  return qf::known_scale_format(spec.scale_format) && spec.block > 0 && spec.element.is_e2m1() &&
         spec.scale_desc == nullptr && rule_ok;
}

namespace {
/// quant_fast_force_slow_path's switch: −1 until read from FP4_TEST_FORCE_SLOW_PATH.
std::atomic<int> g_force_slow{-1};

bool forced_slow() {
  int f = g_force_slow.load(std::memory_order_relaxed);
  if (f < 0) {
    const char* e = std::getenv("FP4_TEST_FORCE_SLOW_PATH");
    f = e != nullptr && std::string(e) == "1" ? 1 : 0;
    g_force_slow.store(f, std::memory_order_relaxed);
  }
  return f == 1;
}

/// Why spec has no SIMD kernel (quant_fast_supports is false): the element or scale format
/// or scale rule the kernels do not implement.
std::string unsupported_reason(const BlockQuantSpec& spec) {
  if (!spec.element.is_e2m1()) return "element format " + spec.element.name();
  const FloatFormat& f = spec_scale_format(spec);
  if (spec.scale_rule != ScaleRule::TensorScaled && spec.scale_format != ScaleFormat::UE8M0)
    return std::string("scale rule ") + scale_rule_name(spec.scale_rule) + " with scale format " +
           f.name;
  return std::string("scale format ") + f.name;
}
}  // namespace

std::string quant_fast_slow_path(const BlockQuantSpec& spec, bool transposed, bool rht) {
  return quant_fast_slow_path(spec, transposed, rht, 16);
}

std::string quant_fast_slow_path(const BlockQuantSpec& spec, bool transposed, bool rht,
                                 int hadamard_n) {
  if (forced_slow()) return "scalar reference quantizer (forced by a test hook)";
  if (rht && !transposed)
    return "separate Hadamard pass (scalar " + std::to_string(hadamard_n) +
           "-point hadamard_rows along the dgrad contraction dim N, then the row kernel)";
  if (rht && hadamard_n != 16)
    return "composed quantize-transpose (FP32 transpose, scalar " + std::to_string(hadamard_n) +
           "-point hadamard_rows, row kernel: only the 16-point transform is fused)";
  if (!quant_fast_supports(spec))
    return "scalar reference quantizer (" + unsupported_reason(spec) + " has no SIMD kernel)";
  if (!transposed) return "";
  if (spec.two_d)
    return "composed quantize-transpose (FP32 transpose, then the row kernel: 2-D tiles of the "
           "transposed operand)";
  if (spec.four_over_six != FourOverSix::Off)
    return std::string("composed quantize-transpose (FP32 transpose, ") +
           (rht ? "scalar RHT, " : "") + "then the row kernel: Four Over Six has no transposed kernel)";
  if (rht && qf::tile_rows(spec.block) % 16 != 0)
    return "composed quantize-transpose (FP32 transpose, scalar RHT, row kernel: the RHT's "
           "16-row chunks straddle tiles of block " +
           std::to_string(spec.block) + ")";
  return "";
}

std::string quant_fast_slow_path_row_scaled(const BlockQuantSpec& spec, bool transposed, bool rht) {
  const std::string base = quant_fast_slow_path(spec, false, false);
  if (!base.empty() || !transposed) return base;
  return std::string("composed quantize-transpose (FP32 transpose, ") + (rht ? "RHT, " : "") +
         "per-row amax, row kernel: a per-row reference of the transposed operand)";
}

void quant_fast_force_slow_path(bool on) {
  g_force_slow.store(on ? 1 : 0, std::memory_order_relaxed);
}

float amax_fast(const float* x, int64_t n) {
  if (n < 0) throw std::invalid_argument("amax_fast: negative length");
  constexpr int64_t kChunk = int64_t{1} << 15;
  const int64_t nch = (n + kChunk - 1) / kChunk;
  const qf::Kernels& k = qf::active();
  uint32_t m = 0;
#pragma omp parallel for reduction(max : m) schedule(static) if (n >= qf::kParallelMin)
  for (int64_t ch = 0; ch < nch; ++ch) {
    const int64_t i0 = ch * kChunk;
    m = std::max(m, k.amax(x + i0, std::min(kChunk, n - i0)));
  }
  if (m > 0x7F7FFFFFu) detail::throw_non_finite("amax_fast", x, n);
  return std::bit_cast<float>(m);
}

namespace {
// An FP32 buffer of at least n floats for the BF16-output variants' composed paths, per thread
// and grown only when too small (so a training loop's steady state allocates nothing).
float* staging(int64_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < static_cast<size_t>(n)) buf.resize(static_cast<size_t>(n));
  return buf.data();
}

// quantize_dequantize_fast (block_scaled false: x̂ = q·d_b) and quantize_block_scaled_fast
// (true: q·c_b); `where` names the public function in errors.
// With out16 (block_scaled only) the output is BF16 bit patterns in out16 and out is unused.
void rows_driver(const char* where, const float* x, int64_t rows, int64_t cols,
                 const BlockQuantSpec& spec, float g, const SrKey* sr, bool block_scaled,
                 float* out, uint16_t* out16 = nullptr) {
  detail::validate_block_quant(where, rows, cols, spec, g, sr);
  if (!quant_fast_supports(spec)) {
    if (out16) {  // the scalar twin, then the conversion
      float* t = staging(rows * cols);
      quantize_block_scaled(x, rows, cols, spec, g, sr, t);
      to_bf16_bits(t, rows * cols, out16);
    } else if (block_scaled) {
      quantize_block_scaled(x, rows, cols, spec, g, sr, out);
    } else {
      quantize_dequantize(x, rows, cols, spec, g, sr, out);
    }
    return;
  }
  if (rows == 0 || cols == 0) return;
  qf::Plan p = qf::make_plan(x, out, rows, cols, spec, g, sr);
  p.block_scaled_out = block_scaled;
  p.out16 = out16;
  p.stream = !out16 && qf::use_stream(out, rows * cols, qf::kStreamMinBytesRows);
  p.out_mis = static_cast<int64_t>(reinterpret_cast<uintptr_t>(out) % 64 / 4);
  const qf::Kernels& k = qf::active();
  std::atomic<bool> bad{false};
  const bool par = rows * cols >= qf::kParallelMin && p.block_rows > 1;
#pragma omp parallel if (par)
  {
    qf::Scratch& s = qf::thread_scratch();
    s.for_rows(p);
#pragma omp for schedule(static)
    for (int64_t br = 0; br < p.block_rows; ++br) {
      if (!k.rows(p, br, s)) bad.store(true, std::memory_order_relaxed);
    }
  }
  // A block-row with a non-finite value is never written, so every non-finite input is still
  // in x (even when out aliases x) and the scan finds the first one.
  if (bad.load()) detail::throw_non_finite(where, x, rows * cols);
}
}  // namespace

void quantize_dequantize_fast(const float* x, int64_t rows, int64_t cols,
                              const BlockQuantSpec& spec, float g, const SrKey* sr, float* out) {
  rows_driver("quantize_dequantize_fast", x, rows, cols, spec, g, sr, false, out);
}

void quantize_block_scaled_fast(const float* x, int64_t rows, int64_t cols,
                                const BlockQuantSpec& spec, float g, const SrKey* sr, float* out) {
  rows_driver("quantize_block_scaled_fast", x, rows, cols, spec, g, sr, true, out);
}

void quantize_block_scaled_fast(const float* x, int64_t rows, int64_t cols,
                                const BlockQuantSpec& spec, float g, const SrKey* sr,
                                uint16_t* out) {
  rows_driver("quantize_block_scaled_fast", x, rows, cols, spec, g, sr, true, nullptr, out);
}

void row_amax_fast(const float* x, int64_t rows, int64_t cols, float* out) {
  if (rows < 0 || cols < 0) throw std::invalid_argument("row_amax_fast: negative shape");
  const qf::Kernels& k = qf::active();
  std::atomic<bool> bad{false};
#pragma omp parallel for schedule(static) if (rows * cols >= qf::kParallelMin && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const uint32_t m = k.amax(x + r * cols, cols);
    if (m > 0x7F7FFFFFu) bad.store(true, std::memory_order_relaxed);
    out[r] = std::bit_cast<float>(m);
  }
  if (bad.load()) detail::throw_non_finite("row_amax_fast", x, rows * cols);
}

void quantize_dequantize_rows_fast(const float* x, int64_t rows, int64_t cols,
                                   const BlockQuantSpec& spec, const float* row_g,
                                   const SrKey* sr, float* out) {
  const char* where = "quantize_dequantize_rows_fast";
  detail::validate_row_quant(where, rows, cols, spec, row_g, sr);
  if (!quant_fast_supports(spec)) {
    quantize_dequantize_rows(x, rows, cols, spec, row_g, sr, out);
    return;
  }
  if (rows == 0 || cols == 0) return;
  qf::Plan p = qf::make_plan(x, out, rows, cols, spec, 0.0f, sr);
  p.row_g = row_g;
  p.target = spec.target;
  p.stream = qf::use_stream(out, rows * cols, qf::kStreamMinBytesRows);
  p.out_mis = static_cast<int64_t>(reinterpret_cast<uintptr_t>(out) % 64 / 4);
  const qf::Kernels& k = qf::active();
  std::atomic<bool> bad{false};
#pragma omp parallel if (rows * cols >= qf::kParallelMin && rows > 1)
  {
    qf::Scratch& s = qf::thread_scratch();
    s.for_rows(p);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      if (!k.rows(p, r, s)) bad.store(true, std::memory_order_relaxed);
    }
  }
  if (bad.load()) detail::throw_non_finite(where, x, rows * cols);
}

void quantize_dequantize_rows_transposed_fast(const float* x, int64_t rows, int64_t cols,
                                              const BlockQuantSpec& spec, const SrKey* sr,
                                              bool rht, RhtPrecision precision, float* row_g,
                                              float* out) {
  const char* where = "quantize_dequantize_rows_transposed_fast";
  hwy_common::check_transposed_shape(where, rows, cols, rht);
  detail::validate_row_quant(where, 0, rows, spec, nullptr, sr);  // the spec, before any work
  // The composition itself: transpose, RHT, per-row amax, row kernel (quant_fast_slow_path).
  hwy_common::transpose(x, rows, cols, out);
  if (rht) rht16_rows(out, cols, rows, precision);
  row_amax_fast(out, cols, rows, row_g);
  quantize_dequantize_rows_fast(out, cols, rows, spec, row_g, sr, out);
}

void quantize_dequantize_transposed_fast(const float* x, int64_t rows, int64_t cols,
                                         const BlockQuantSpec& spec, float g, const SrKey* sr,
                                         bool rht, float* out) {
  quantize_dequantize_transposed_fast(x, rows, cols, spec, g, sr, rht, RhtPrecision::FP32, out);
}

void quantize_dequantize_transposed_fast(const float* x, int64_t rows, int64_t cols,
                                         const BlockQuantSpec& spec, float g, const SrKey* sr,
                                         bool rht, RhtPrecision precision, float* out) {
  if (!rht) return quantize_dequantize_transposed_fast(x, rows, cols, spec, g, sr, nullptr, out);
  const HadamardTransform h = HadamardTransform::te16(precision);
  quantize_dequantize_transposed_fast(x, rows, cols, spec, g, sr, &h, out);
}

namespace {
// The quantize-transpose of quantize_dequantize_transposed_fast (block_scaled false) and
// quantize_block_scaled_transposed_fast (true).
void cols_driver(const char* where, const float* x, int64_t rows, int64_t cols,
                 const BlockQuantSpec& spec, float g, const SrKey* sr, const HadamardTransform* had,
                 bool block_scaled, float* out, uint16_t* out16 = nullptr) {
  const bool rht = had != nullptr;
  hwy_common::check_transposed_shape(where, rows, cols, rht ? had->n : 0);
  detail::validate_block_quant(where, cols, rows, spec, g, sr);
  if (rows == 0 || cols == 0) return;
  int64_t H = qf::tile_rows(spec.block);
  const bool fast = quant_fast_supports(spec) && !spec.two_d &&
                    !(rht && (H % 16 != 0 || had->n != 16)) &&
                    spec.four_over_six == FourOverSix::Off;
  if (!fast) {
    // The reference composition itself (2-D tiles of xᵀ, RHT chunks straddling tiles, or a
    // transform of more than 16 points; with out16 in an FP32 staging buffer).
    float* t = out16 ? staging(rows * cols) : out;
    hwy_common::transpose(x, rows, cols, t);
    if (rht) hadamard_rows(t, cols, rows, *had);
    rows_driver(block_scaled ? "quantize_block_scaled_fast" : "quantize_dequantize_fast", t, cols,
                rows, spec, g, sr, block_scaled, t, out16);
    return;
  }
  qf::Plan p = qf::make_plan(x, out, rows, cols, spec, g, sr);
  p.block_scaled_out = block_scaled;
  p.out16 = out16;
  p.rht = rht;
  p.rht_bf16 = rht && had->precision == RhtPrecision::BF16;
  if (rht) p.rht_signs = had->signs.data();
  // BF16 out: tiles of 32 rows where the block divides 32, so that a column run is one 64-byte
  // line of BF16 (the values and their order are the same for any H), written with streaming
  // stores where the output is large (the FP32 threshold's element count) and every run is a
  // whole aligned line (out16 64-byte aligned, rows a multiple of 32: every tile has 32 rows).
  const bool lines16 = out16 && H <= 32 && 32 % H == 0;
  if (lines16) H = 32;
  p.stream16 = lines16 && qf::stream_size(rows * cols * 2, qf::kStreamMinBytesTransposed / 2) &&
               reinterpret_cast<uintptr_t>(out16) % 64 == 0 && rows % 32 == 0;
  p.H = H;
  p.stream = !out16 && qf::use_stream(out, rows * cols, qf::kStreamMinBytesTransposed);
  p.out_mis = static_cast<int64_t>(reinterpret_cast<uintptr_t>(out) % 64 / 4);
  if (p.stream || p.stream16) {
    // With streaming stores the output's scattered lines cost no reads, and walking strips of
    // one block of rows across the unit's columns reads x in long runs: the fastest order
    // measured.
    p.panel_rows = std::max<int64_t>(1, qf::kStreamUnitRows / H) * H;
    p.panel_cols = qf::kStreamUnitCols;
  } else {
    p.panel_rows = std::max<int64_t>(1, qf::kPanelRows / H) * H;
    p.panel_cols = qf::kPanelCols;
  }
  const int64_t units = ((rows + p.panel_rows - 1) / p.panel_rows) *
                        ((cols + p.panel_cols - 1) / p.panel_cols);
  const qf::Kernels& k = qf::active();
  std::atomic<bool> bad{false};
  const bool par = rows * cols >= qf::kParallelMin && units > 1;
#pragma omp parallel if (par)
  {
    qf::Scratch& s = qf::thread_scratch();
    s.for_cols(p);
#pragma omp for schedule(static)
    for (int64_t u = 0; u < units; ++u) {
      if (!k.cols(p, u, s)) bad.store(true, std::memory_order_relaxed);
    }
  }
  if (bad.load()) qf::throw_non_finite_2d(where, x, rows, cols);
}
}  // namespace

void quantize_dequantize_transposed_fast(const float* x, int64_t rows, int64_t cols,
                                         const BlockQuantSpec& spec, float g, const SrKey* sr,
                                         const HadamardTransform* had, float* out) {
  cols_driver("quantize_dequantize_transposed_fast", x, rows, cols, spec, g, sr, had, false, out);
}

void quantize_block_scaled_transposed_fast(const float* x, int64_t rows, int64_t cols,
                                           const BlockQuantSpec& spec, float g, const SrKey* sr,
                                           const HadamardTransform* had, float* out) {
  cols_driver("quantize_block_scaled_transposed_fast", x, rows, cols, spec, g, sr, had, true, out);
}

void quantize_block_scaled_transposed_fast(const float* x, int64_t rows, int64_t cols,
                                           const BlockQuantSpec& spec, float g, const SrKey* sr,
                                           const HadamardTransform* had, uint16_t* out) {
  cols_driver("quantize_block_scaled_transposed_fast", x, rows, cols, spec, g, sr, had, true,
              nullptr, out);
}

float amax_rht16_transposed(const float* x, int64_t rows, int64_t cols) {
  return amax_rht16_transposed(x, rows, cols, RhtPrecision::FP32);
}

float amax_rht16_transposed(const float* x, int64_t rows, int64_t cols, RhtPrecision precision) {
  return amax_hadamard_transposed(x, rows, cols, HadamardTransform::te16(precision));
}

float amax_hadamard_transposed(const float* x, int64_t rows, int64_t cols,
                               const HadamardTransform& h) {
  const char* where = "amax_hadamard_transposed";
  hwy_common::check_transposed_shape(where, rows, cols, h.n);
  if (rows == 0 || cols == 0) return 0.0f;
  if (h.n != 16) {  // the reference composition: transpose, transform, amax
    std::vector<float> t(static_cast<size_t>(rows * cols));
    hwy_common::transpose(x, rows, cols, t.data());
    hadamard_rows(t.data(), cols, rows, h);
    const float m = amax_fast(t.data(), rows * cols);
    return m;
  }
  const bool bf16 = h.precision == RhtPrecision::BF16;
  const float* signs = h.signs.data();
  const int64_t strips = rows / 16;
  const qf::Kernels& k = qf::active();
  uint32_t m = 0;
#pragma omp parallel if (rows * cols >= qf::kParallelMin && strips > 1)
  {
    qf::Scratch& s = qf::thread_scratch();
    s.for_rht_amax();
#pragma omp for reduction(max : m) schedule(static)
    for (int64_t st = 0; st < strips; ++st) m = std::max(m, k.amax_rht(x, rows, cols, st, bf16, signs, s));
  }
  if (m > 0x7F7FFFFFu) qf::throw_non_finite_2d(where, x, rows, cols);
  return std::bit_cast<float>(m);
}

void sr_bytes_fast(const SrKey& key, uint64_t first, uint64_t n, uint8_t* out) {
  if (n == 0) return;
  constexpr uint64_t kChunkBlocks = 1024;
  thread_local std::vector<uint64_t> buf;  // per thread, allocated once
  buf.resize(2 * (kChunkBlocks + qf::kMaxLanes));
  const qf::Kernels& k = qf::active();
  uint64_t i = first;
  const uint64_t end = first + n;
  while (i < end) {
    const uint64_t b0 = i / 16;
    const uint64_t b1 = std::min((end - 1) / 16 + 1, b0 + kChunkBlocks);  // one past last block
    k.philox(key, b0, static_cast<int64_t>(b1 - b0), buf.data());
    const uint64_t stop = std::min(end, b1 * 16);
    std::memcpy(out + (i - first), reinterpret_cast<const uint8_t*>(buf.data()) + (i - b0 * 16),
                static_cast<size_t>(stop - i));
    i = stop;
  }
}

std::vector<std::string> quant_fast_targets() {
  std::vector<std::string> names;
  for (const qf::Kernels& k : qf::available()) names.emplace_back(k.name);
  return names;
}

std::string quant_fast_target() { return qf::active().name; }

int64_t quant_fast_stream_min_bytes(int64_t bytes) {
  return qf::g_stream_min_bytes.exchange(bytes < 0 ? -1 : bytes);
}

void quant_fast_use_target(const std::string& name) {
  const auto& av = qf::available();
  if (name.empty()) {
    qf::g_active.store(&av.front(), std::memory_order_release);
    return;
  }
  std::string list;
  for (const qf::Kernels& k : av) {
    if (name == k.name) {
      qf::g_active.store(&k, std::memory_order_release);
      return;
    }
    list += list.empty() ? "" : ", ";
    list += k.name;
  }
  throw std::invalid_argument("quant_fast_use_target: unknown or unsupported SIMD target '" +
                              name + "' (available: " + list + ")");
}

}  // namespace fp4
#endif  // HWY_ONCE
