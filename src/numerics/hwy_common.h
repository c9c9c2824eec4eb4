// The Highway helpers that the fast quantizers (quant_fast.cpp) and packers (pack_fast.cpp)
// share; not a public header. Per target: 2^k from bit patterns (Pow2), RNE or SR onto a scale
// grid (RoundMag), the tensor-scaled block scale, the SR offsets, the E2M1 clamp, exponent and
// RNA steps, block and tile amax, the walk of whole vectors over blocks that are not whole
// vectors (each lane's block: LaneBlockRel, LookupBlocks), round_bf16 lane-wise, the vertical
// RHT16 and a tile's gather indices.
// Compiled once: the scale parameters of a call (tensor scales, scale grid, SR key), the
// argument checks of the quantize-transposes and their plain transpose. Contract:
// docs/numerics.md "Rounding a magnitude", "Quantizing one operand", "Random Hadamard
// transform", "BF16 boundary".
//
// Every helper does the scalar reference's IEEE operations, in its order, lane-wise (the files'
// comments say why the bits match); no multiply-add is fused (-ffp-contract=off; Mul and Add).
//
// Two sections, written as Highway's own -inl.h headers are:
//  * the plain one (an ordinary include guard) is compiled once;
//  * the per-target one is compiled once per target: its guard flips with HWY_TARGET_TOGGLE,
//    which hwy/foreach_target.h flips each time it re-includes the source. It is read only
//    after <hwy/highway.h> (HWY_NAMESPACE defined), so a source includes this header twice: in
//    its once-compiled declarations (the plain section), and after <hwy/highway.h> in its
//    per-target part, where `using namespace fp4::hwy_common::HWY_NAMESPACE;` brings the
//    helpers into the source's own per-target namespace.

// ------------------------------------------------------------------------------------------
// Plain section (compiled once).
#ifndef FP4_NUMERICS_HWY_COMMON_H_
#define FP4_NUMERICS_HWY_COMMON_H_

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "fp4/numerics/bf16.h"
#include "fp4/numerics/block_quant.h"
#include "fp4/numerics/format.h"
#include "fp4/numerics/philox.h"

namespace fp4::hwy_common {

/// Upper bound on the FP32 lanes of any x86 target (AVX-512: 16); scratch buffers are padded
/// with it.
constexpr int64_t kMaxLanes = 64;
/// Calls on at least this many elements run on OpenMP threads (as block_quant.cpp); never
/// changes bits.
constexpr int64_t kParallelMin = int64_t{1} << 14;

/// What the block scales of one call need (plain data, shared by all targets); the kernel plans
/// of both files extend it.
struct ScaleParams {
  float mult = 1.f, gd = 1.f;  ///< ge·fl(1/6) and 1/ge, as block_quant.cpp
  float ge = 1.f;              ///< the tensor encode scale itself (Four Over Six's base)
  int sfrac = 0, semin = 0;    ///< scale format's fraction bits and exponent floor
  float smax = 0.f;            ///< scale format's max finite
  bool sub_pow2 = false;       ///< scale rounding needs subnormal powers of two (UE8M0)
  bool sr = false;             ///< SR8 elements
  bool rna = false;            ///< RNA elements (ties away from zero)
  /// Write the block-scaled operand q·c_b instead of x̂ = q·d_b: the kernels' output multiplier
  /// dv is c_b (the encode scale e_b = 1/d_b is unchanged), so the tensor decode scale gd is
  /// left for the GEMM's output (docs/gemm.md "Decoded FP4 on the BF16 GEMM").
  bool block_scaled_out = false;
  SrKey key{};
};

/// The tensor scales of reference g and target T (also one row's, for a per-row reference), and
/// the scale parameters of E2M1 elements under spec with tensor reference g (sr: the SR key,
/// read when spec rounds SR8). The tensor scales are exactly block_quant.cpp's tensor_scales
/// (emax 6): ge = T·6/g (1 when g = 0), at most FLT_MAX, gd = 1/ge, mult = ge·fl(1/6).
inline void set_tensor_scales(ScaleParams& p, float target, float g) {
  float ge = g == 0.0f ? 1.0f : (target * 6.0f) / g;
  ge = std::min(ge, FLT_MAX);
  p.ge = ge;
  p.gd = 1.0f / ge;
  p.mult = ge * (1.0f / 6.0f);
}
inline void set_scale_params(ScaleParams& p, const BlockQuantSpec& spec, float g, const SrKey* sr) {
  set_tensor_scales(p, spec.target, g);
  const FloatFormat& fmt = scale_format_desc(spec.scale_format);
  p.sfrac = fmt.frac_bits;
  p.semin = detail::rounding_emin(fmt);
  p.smax = fmt.max_finite;
  // q = e − frac ranges over [emin − frac, floor(log2 max) − frac]; 2^q and 2^−q must be normal
  // for the cheap power-of-two path.
  const int emax = std::ilogb(fmt.max_finite);
  p.sub_pow2 = p.semin - p.sfrac < -126 || -(emax - p.sfrac) < -126;
  p.sr = spec.rounding == Rounding::SR8;
  p.rna = spec.rounding == Rounding::RNA;
  if (p.sr) p.key = *sr;
}

/// The shape checks of a quantize-transpose of x [rows, cols]: rows, cols ≥ 0, and, with an
/// rht_n-point Hadamard transform (rht_n > 0; 0 = none), rows a multiple of rht_n. Throws std::invalid_argument whose message starts with
/// `where`.
inline void check_transposed_shape(const char* where, int64_t rows, int64_t cols, int rht_n) {
  if (rows < 0 || cols < 0) {
    throw std::invalid_argument(std::string(where) + ": negative shape [" + std::to_string(rows) +
                                ", " + std::to_string(cols) + "]");
  }
  if (rht_n > 0 && rows % rht_n != 0) {
    throw std::invalid_argument(std::string(where) + ": rows = " + std::to_string(rows) +
                                " is not a multiple of " + std::to_string(rht_n) + " (the RHT works on " +
                                std::to_string(rht_n) + "-long chunks along the rows of x)");
  }
}

/// out [cols, rows] = xᵀ, cache-blocked (a copy: the bits never depend on the threads).
inline void transpose(const float* x, int64_t rows, int64_t cols, float* out) {
  constexpr int64_t T = 32;
#pragma omp parallel for collapse(2) schedule(static) if (rows * cols >= kParallelMin)
  for (int64_t i0 = 0; i0 < rows; i0 += T)
    for (int64_t j0 = 0; j0 < cols; j0 += T) {
      const int64_t i1 = std::min(rows, i0 + T), j1 = std::min(cols, j0 + T);
      for (int64_t i = i0; i < i1; ++i)
        for (int64_t j = j0; j < j1; ++j) out[j * rows + i] = x[i * cols + j];
    }
}

}  // namespace fp4::hwy_common

#endif  // FP4_NUMERICS_HWY_COMMON_H_

// ------------------------------------------------------------------------------------------
// Per-target section (compiled once per target, after <hwy/highway.h>).
#if defined(HWY_NAMESPACE)
#if defined(FP4_NUMERICS_HWY_COMMON_TOGGLE) == defined(HWY_TARGET_TOGGLE)
#ifdef FP4_NUMERICS_HWY_COMMON_TOGGLE
#undef FP4_NUMERICS_HWY_COMMON_TOGGLE
#else
#define FP4_NUMERICS_HWY_COMMON_TOGGLE
#endif

#include <hwy/highway.h>

#include <bit>

#include "fp4/numerics/hadamard.h"

HWY_BEFORE_NAMESPACE();
namespace fp4::hwy_common::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using VF = hn::Vec<DF>;
using VI = hn::Vec<DI>;
using D8 = hn::Rebind<uint8_t, DF>;  ///< one byte per FP32 lane

/// 2^k lane-wise for k in [−149, 127], as detail::pow2f: normal pattern, or (kSub) the
/// subnormal 1 << (k + 149) for k < −126.
template <bool kSub>
HWY_INLINE VF Pow2(VI k) {
  const DF df;
  const DI di;
  const VI normal = hn::ShiftLeft<23>(hn::Add(k, hn::Set(di, 127)));
  if constexpr (!kSub) {
    return hn::BitCast(df, normal);
  } else {
    const VI sh = hn::And(hn::Add(k, hn::Set(di, 149)), hn::Set(di, 31));
    const VI sub = hn::Set(di, 1) << sh;
    return hn::BitCast(df, hn::IfThenElse(hn::Gt(k, hn::Set(di, -127)), normal, sub));
  }
}

/// detail::round_magnitude_params lane-wise (see format.h for why each step is exact):
/// |a|, clamp to maxf, e = max(field − 127, emin), q = e − frac, s = a·2^−q, lo = trunc(s),
/// δ = s − lo, up (RNE: δ > .5 or δ == .5 and lo odd; SR: δ + off ≥ 1), (lo + up)·2^q, clamp.
/// The powers of two are built from bit patterns (Pow2), subnormal ones included for UE8M0.
template <bool kSR, bool kSub>
HWY_INLINE VF RoundMag(VF a, int frac, int emin, float maxf, VF sroff) {
  const DF df;
  const DI di;
  const VF maxv = hn::Set(df, maxf);
  a = hn::Abs(a);
  a = hn::IfThenElse(hn::Lt(a, maxv), a, maxv);
  const VI field = hn::ShiftRight<23>(hn::BitCast(di, a));
  const VI e = hn::Max(hn::Sub(field, hn::Set(di, 127)), hn::Set(di, emin));
  const VI q = hn::Sub(e, hn::Set(di, frac));
  const VF s = hn::Mul(a, Pow2<kSub>(hn::Neg(q)));
  const VI loi = hn::ConvertTo(di, s);
  const VF delta = hn::Sub(s, hn::ConvertTo(df, loi));
  VI up;
  if constexpr (kSR) {
    up = hn::IfThenElseZero(hn::RebindMask(di, hn::Ge(hn::Add(delta, sroff), hn::Set(df, 1.0f))),
                            hn::Set(di, 1));
  } else {
    (void)sroff;
    const VF half = hn::Set(df, 0.5f);
    const auto gt = hn::RebindMask(di, hn::Gt(delta, half));
    const auto tie_odd = hn::And(hn::RebindMask(di, hn::Eq(delta, half)),
                                 hn::TestBit(loi, hn::Set(di, 1)));
    up = hn::IfThenElseZero(hn::Or(gt, tie_odd), hn::Set(di, 1));
  }
  const VF res = hn::Mul(hn::ConvertTo(df, hn::Add(loi, up)), Pow2<kSub>(q));
  return hn::IfThenElse(hn::Lt(res, maxv), res, maxv);
}

/// The tensor-scaled block scale of the amax lanes, as block_quant.cpp's block_scale then
/// `d = c_b·gd; e = 1/d`: c = a_b·mult, min(c, scale_max), RNE onto the scale grid (RoundMag),
/// the zero-block guard (c = 0 → 1). Returns c_b; dv = d_b (decode), ev = e_b = 1/d_b (encode;
/// a true IEEE division, never a reciprocal estimate).
template <bool kSub>
HWY_INLINE VF TensorScaledBlockScale(VF amax, const ScaleParams& p, VF& dv, VF& ev) {
  const DF df;
  const VF maxv = hn::Set(df, p.smax);
  VF c = hn::Mul(amax, hn::Set(df, p.mult));
  c = hn::IfThenElse(hn::Lt(maxv, c), maxv, c);  // std::min(c, max)
  c = RoundMag<false, kSub>(c, p.sfrac, p.semin, p.smax, hn::Zero(df));
  c = hn::IfThenElse(hn::Eq(c, hn::Zero(df)), hn::Set(df, 1.0f), c);  // zero-block guard
  dv = hn::Mul(c, hn::Set(df, p.gd));
  ev = hn::Div(hn::Set(df, 1.0f), dv);
  if (p.block_scaled_out) dv = c;  // q·c_b: e_b stays 1/(c_b·gd)
  return c;
}

/// (2r+1)/512 for the next Lanes() SR bytes, as detail::sr8_offset.
HWY_INLINE VF SrOffsets(const uint8_t* r) {
  const DF df;
  const DI di;
  const VI v = hn::PromoteTo(di, hn::LoadU(D8(), r));
  const VI t = hn::Or(hn::ShiftLeft<1>(v), hn::Set(di, 1));
  return hn::Mul(hn::ConvertTo(df, t), hn::Set(df, 1.0f / 512.0f));
}

/// The E2M1 grid around |y| (y not NaN): returns a = min(|y|, 6) and sets its exponent
/// e = max(floor(log2 a), 0) ∈ {0, 1, 2}; the grid spacing there is u = 2^(e−1).
HWY_INLINE VF E2M1Clamp(VF y, VI& e) {
  const DF df;
  const DI di;
  const VF six = hn::Set(df, 6.0f);
  VF a = hn::Abs(y);
  a = hn::IfThenElse(hn::Lt(a, six), a, six);
  e = hn::Max(hn::Sub(hn::ShiftRight<23>(hn::BitCast(di, a)), hn::Set(di, 127)), hn::Zero(di));
  return a;
}

/// RNA (round to nearest, ties away from zero) of a = min(|y|, 6) with exponent e from
/// E2M1Clamp, as the count n of grid spacings u = 2^(e−1) (result n·u): the steps of
/// detail::round_magnitude_params with q = e − 1. s = a·2^(1−e) is exact (a power-of-two
/// scaling, s < 4), lo = trunc(s) and δ = s − lo are exact, n = lo + (δ ≥ 0.5). An add-and-round
/// trick (as RNE's) would not do: fl(s + 0.5) rounds up for s = 0.5 − 2^−25. n·u ≤ 6 (a ≤ 6 is
/// on the grid), so no clamp is needed.
HWY_INLINE VI E2M1RnaSteps(VF a, VI e) {
  const DF df;
  const DI di;
  const VF inv_u = hn::BitCast(df, hn::ShiftLeft<23>(hn::Sub(hn::Set(di, 128), e)));  // 2^(1−e)
  const VF s = hn::Mul(a, inv_u);
  const VI lo = hn::ConvertTo(di, s);
  const VF delta = hn::Sub(s, hn::ConvertTo(df, lo));
  return hn::Add(lo, hn::IfThenElseZero(hn::RebindMask(di, hn::Ge(delta, hn::Set(df, 0.5f))),
                                        hn::Set(di, 1)));
}

/// |v|'s bit pattern (ordered as |v| is, for finite and infinite values).
HWY_INLINE VI AbsBits(VF v) {
  const DI di;
  return hn::And(hn::BitCast(di, v), hn::Set(di, 0x7FFFFFFF));
}

/// Lane t's block relative to lane 0's, for a vector whose lane 0 is element o0 (0 ≤ o0 < B)
/// of a block of B: rel[t] = (o0 + t) / B, by `kmax` compares (kmax = (B + Lanes − 2) / B,
/// the largest value rel can take). The walks along rows (and columns) of blocks that are not
/// whole vectors look their lanes' block scales up with it (LookupBlocks).
HWY_INLINE VI LaneBlockRel(int64_t o0, int64_t B, int64_t kmax) {
  const DI di;
  const VI v = hn::Iota(di, static_cast<int32_t>(o0));
  VI rel = hn::Zero(di);
  for (int64_t k = 1; k <= kmax; ++k) {
    const VI last = hn::Set(di, static_cast<int32_t>(k * B - 1));  // last element of block k − 1
    rel = hn::Sub(rel, hn::VecFromMask(di, hn::Gt(v, last)));
  }
  return rel;
}

/// v[t] = a[rel[t]] (rel[t] < Lanes; a holds Lanes readable floats): each lane's block scale.
HWY_INLINE VF LookupBlocks(const float* a, VI rel) {
  const DF df;
  return hn::TableLookupLanes(hn::LoadU(df, a), hn::IndicesFromVec(df, rel));
}

/// One step of a walk of whole vectors along a run of blocks of B: lane 0 moves from element
/// o0 of block bc0 to the element Lanes further on (qN = Lanes / B, rN = Lanes % B).
HWY_INLINE void BlockWalkStep(int64_t B, int64_t qN, int64_t rN, int64_t& bc0, int64_t& o0) {
  bc0 += qN;
  o0 += rN;
  if (o0 >= B) {
    o0 -= B;
    ++bc0;
  }
}

/// Block amax where B divides Lanes (B < Lanes, so B is a power of two): for each whole vector
/// of the nrows rows at x (row stride `stride`; columns j .. j + Lanes), the max of |x| bits
/// over the rows, then over each group of B lanes (log2 B lane swaps: t ↔ t xor s), and the
/// groups' maxima (lanes 0, B, 2B, ...) stored compacted at am[j / B ...] (Lanes floats
/// written; the later ones are overwritten or padding). Returns the number of blocks done
/// (whole vectors only), or −1 if a block holds a NaN or Inf.
HWY_INLINE int64_t SegmentedBlockAmax(const float* x, int64_t stride, int64_t nrows, int64_t cols,
                                      int64_t B, float* am) {
  const DF df;
  const DI di;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  alignas(64) int32_t idx[kMaxLanes];
  using IdxI = decltype(hn::SetTableIndices(di, idx));
  IdxI swap[8];
  int nswap = 0;
  for (int64_t s = 1; s < B; s <<= 1) {
    for (int64_t t = 0; t < N; ++t) idx[t] = static_cast<int32_t>(t ^ s);
    swap[nswap++] = hn::SetTableIndices(di, idx);
  }
  for (int64_t t = 0; t < N; ++t) idx[t] = static_cast<int32_t>(std::min(t * B, N - 1));
  const IdxI compact = hn::SetTableIndices(di, idx);
  const VI finite_max = hn::Set(di, 0x7F7FFFFF);
  int64_t j = 0;
  for (; j + N <= cols; j += N) {
    VI m = hn::Zero(di);
    for (int64_t r = 0; r < nrows; ++r) m = hn::Max(m, AbsBits(hn::LoadU(df, x + r * stride + j)));
    if (!hn::AllFalse(di, hn::Gt(m, finite_max))) return -1;
    for (int k = 0; k < nswap; ++k) m = hn::Max(m, hn::TableLookupLanes(m, swap[k]));
    hn::StoreU(hn::BitCast(df, hn::TableLookupLanes(m, compact)), df, am + j / B);
  }
  return j / B;
}

/// Block amax of one row where blocks are whole vectors (B % Lanes == 0, Lanes > 1): groups of
/// Lanes blocks, each block's vectors maxed lane-wise, then the Lanes vectors reduced together
/// in log2(Lanes) levels of pairwise (ConcatEven, ConcatOdd) maxima, so that lane b of the
/// result is block b's max (one vector per group instead of one horizontal max per block).
/// Writes am[0 .. returned) (whole groups only); −1 if a block holds a NaN or Inf. Not on the
/// one-lane target (no ConcatOdd there; one lane needs no horizontal max).
#if HWY_TARGET != HWY_SCALAR
HWY_INLINE int64_t GroupedBlockAmax(const float* x, int64_t cols, int64_t B, float* am) {
  const DF df;
  const DI di;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const VI finite_max = hn::Set(di, 0x7F7FFFFF);
  VI v[kMaxLanes];
  int64_t bc = 0;
  for (; (bc + N) * B <= cols; bc += N) {
    for (int64_t k = 0; k < N; ++k) {
      const float* xb = x + (bc + k) * B;
      VI m = AbsBits(hn::LoadU(df, xb));
      for (int64_t j = N; j < B; j += N) m = hn::Max(m, AbsBits(hn::LoadU(df, xb + j)));
      v[k] = m;
    }
    for (int64_t n = N; n > 1; n /= 2)
      for (int64_t k = 0; k < n / 2; ++k)
        v[k] = hn::Max(hn::ConcatOdd(di, v[2 * k + 1], v[2 * k]),
                       hn::ConcatEven(di, v[2 * k + 1], v[2 * k]));
    if (!hn::AllFalse(di, hn::Gt(v[0], finite_max))) return -1;
    hn::StoreU(hn::BitCast(df, v[0]), df, am + bc);
  }
  return bc;
}
#endif

/// The block amax of a block-row: am[bc] = max |x| over block bc (exact, order-free: the max
/// of the bit patterns), for the nbc = ceil(cols / B) blocks of B columns of the nrows rows at
/// x (row stride `stride`), then Lanes zeros after them. Blocks that divide a vector go
/// through SegmentedBlockAmax, a single row's blocks of whole vectors through
/// GroupedBlockAmax; the others (and the rest) block by block, in whole vectors and
/// a masked last one (a plain load that stays inside the block-row's rows; the block-row's
/// very last elements one at a time). False (am partly written) if a block holds a NaN or Inf.
HWY_INLINE bool BlockRowAmax(const float* x, int64_t stride, int64_t nrows, int64_t cols, int64_t B,
                             int64_t nbc, float* am) {
  const DF df;
  const DI di;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  int64_t bc = 0;
  if (B < N && N % B == 0) {
    bc = SegmentedBlockAmax(x, stride, nrows, cols, B, am);
    if (bc < 0) return false;
  }
#if HWY_TARGET != HWY_SCALAR
  if (nrows == 1 && N > 1 && B % N == 0) {
    bc = GroupedBlockAmax(x, cols, B, am);
    if (bc < 0) return false;
  }
#endif
  const float* x_end = x + (nrows - 1) * stride + cols;  // one past the last element read
  for (; bc < nbc; ++bc) {
    const int64_t c0 = bc * B, len = std::min(B, cols - c0);
    VI m = hn::Zero(di);
    uint32_t mt = 0;
    for (int64_t r = 0; r < nrows; ++r) {
      const float* xr = x + r * stride + c0;
      int64_t j = 0;
      for (; j + N <= len; j += N) m = hn::Max(m, AbsBits(hn::LoadU(df, xr + j)));
      if (j < len && xr + j + N <= x_end) {
        const auto first = hn::FirstN(di, static_cast<size_t>(len - j));
        m = hn::Max(m, hn::IfThenElseZero(first, AbsBits(hn::LoadU(df, xr + j))));
        continue;
      }
      for (; j < len; ++j) mt = std::max(mt, std::bit_cast<uint32_t>(xr[j]) & 0x7FFFFFFFu);
    }
    const uint32_t a = std::max(static_cast<uint32_t>(hn::GetLane(hn::MaxOfLanes(di, m))), mt);
    if (a > 0x7F7FFFFFu) return false;
    am[bc] = std::bit_cast<float>(a);
  }
  for (int64_t bc2 = nbc; bc2 < nbc + N; ++bc2) am[bc2] = 0.0f;
  return true;
}

/// Column amax of a tile: m = max |x| bit pattern over rows i < h of the Lanes floats at
/// t + i·ld (one block per lane). False if a lane holds a NaN or Inf.
HWY_INLINE bool ColumnAmaxBits(const float* t, int64_t ld, int64_t h, VI& m) {
  const DF df;
  const DI di;
  m = hn::Zero(di);
  for (int64_t i = 0; i < h; ++i) m = hn::Max(m, AbsBits(hn::LoadU(df, t + i * ld)));
  return hn::AllFalse(di, hn::Gt(m, hn::Set(di, 0x7F7FFFFF)));
}

/// Gather indices t·ld of the Lanes rows of a tile whose rows are ld floats apart.
HWY_INLINE VI RowIndices(int64_t ld) {
  const DI di;
  const int64_t N = static_cast<int64_t>(hn::Lanes(di));
  alignas(64) int32_t idx_arr[kMaxLanes];
  for (int64_t t = 0; t < N; ++t) idx_arr[t] = static_cast<int32_t>(t * ld);
  return hn::LoadU(di, idx_arr);
}

/// fp4::round_bf16 lane-wise, before the low 16 bits are cleared: RNE to BF16 adds 0x7FFF +
/// bit 16 to the FP32 bit pattern (integer adds wrap, as the scalar uint32 arithmetic does); a
/// NaN keeps its sign and top payload with the quiet bit forced. The upper 16 bits of the
/// result are the BF16 value.
HWY_INLINE VI Bf16RoundBits(VF v) {
  const DI di;
  const VI b = hn::BitCast(di, v);
  const VI lsb = hn::And(hn::ShiftRight<16>(b), hn::Set(di, 1));
  const VI rne = hn::Add(hn::Add(b, hn::Set(di, 0x7FFF)), lsb);
  const VI nan = hn::Or(b, hn::Set(di, 0x00400000));
  const auto is_nan = hn::Gt(hn::And(b, hn::Set(di, 0x7FFFFFFF)), hn::Set(di, 0x7F800000));
  return hn::IfThenElse(is_nan, nan, rne);
}

/// fp4::round_bf16 lane-wise (Bf16RoundBits with the low 16 bits cleared).
HWY_INLINE VF RoundBf16(VF v) {
  const DF df;
  const DI di;
  return hn::BitCast(df, hn::And(Bf16RoundBits(v), hn::Set(di, static_cast<int32_t>(0xFFFF0000u))));
}

/// round_bf16 lane-wise, returning the upper 16 bits (as int32 lanes 0..65535).
HWY_INLINE VI Bf16Bits(VF v) {
  const DI di;
  const hn::RebindToUnsigned<DF> du;
  return hn::BitCast(di, hn::ShiftRight<16>(hn::BitCast(du, Bf16RoundBits(v))));
}

/// dst[i] = fp4::bf16_bits(src[i]) for i < n (RNE, the NaN rule): Bf16Bits on whole vectors,
/// the last n % Lanes values one at a time.
HWY_INLINE void StoreBf16Bits(const float* src, int64_t n, uint16_t* dst) {
  const DF df;
  const hn::Rebind<uint16_t, DF> d16;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::DemoteTo(d16, Bf16Bits(hn::LoadU(df, src + i))), d16, dst + i);
  for (; i < n; ++i) dst[i] = fp4::bf16_bits(src[i]);
}

/// v[i] = row i of the 16 × Lanes tile at src (row stride `stride`) after the RHT of each
/// column: (x ⊙ s)·H16/4 with hadamard.cpp's rht16_chunk operations (sign multiply, butterflies
/// h = 1, 2, 4, 8 as (a + b, a − b), ·0.25), lane-wise; with bf16 the BF16 variant (inputs and
/// outputs rounded by RoundBf16, as rht16_rows_bf16). s: the 16 signs (kRhtSigns, or any
/// 16-point HadamardTransform's, as hadamard_rows with n = 16).
HWY_INLINE void Rht16Load(const float* src, int64_t stride, VF* v, bool bf16,
                          const float* s = kRhtSigns) {
  const DF df;
  for (int i = 0; i < 16; ++i) {
    VF xi = hn::LoadU(df, src + i * stride);
    if (bf16) xi = RoundBf16(xi);
    v[i] = hn::Mul(xi, hn::Set(df, s[i]));
  }
  for (int h = 1; h < 16; h <<= 1) {
    for (int i = 0; i < 16; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        const VF a = v[j], b = v[j + h];
        v[j] = hn::Add(a, b);
        v[j + h] = hn::Sub(a, b);
      }
    }
  }
  for (int i = 0; i < 16; ++i) v[i] = hn::Mul(v[i], hn::Set(df, 0.25f));
  if (bf16)
    for (int i = 0; i < 16; ++i) v[i] = RoundBf16(v[i]);
}

}  // namespace fp4::hwy_common::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target guard
#endif  // HWY_NAMESPACE
