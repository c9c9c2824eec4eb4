// Fast twins of pack(quantize_blocks(...)) and dequantize(const QTensor&): Highway SIMD, the
// targets of quant_fast.cpp (chosen by quant_fast_use_target / the CPU), OpenMP over fixed
// ranges of block-rows. Contract: pack_fast.h, docs/numerics.md "Formats", "Quantizing one
// operand", "Rounding a magnitude".
//
// Why the bits match the scalar twins.
//  * Tensor scales ge, gd, mult: the same scalar expressions as block_quant.cpp.
//  * Block amax: max of |x| bit patterns (exact, order-free).
//  * Block scale: c = a_b·mult, min(c, scale_max), RNE onto the scale grid lane-wise (RoundMag
//    in hwy_common.h: the steps of detail::round_magnitude_params), zero guard, d_b = c·gd,
//    e_b = 1/d_b (an IEEE division). Scale code: c is on the grid, so its FP32 bits give the code
//    directly — normal c = (1 + mant/2^F)·2^k: code = ((k + bias) << F) | mant
//    = (bits >> (23 − F)) − ((127 − bias) << F); subnormal c (< 2^emin) = m·2^(emin − F):
//    code = m = c·2^(F − emin), exact. UE8M0 (F = 0, bias 127, no subnormals) is the normal
//    formula for all c ∈ [2^−127, 2^127] (2^−127, an FP32 subnormal, has bits >> 23 = 0 =
//    its code). This is scale_encode's result for every on-grid value.
//  * Element code: y = x·e_b, NaN (0·Inf) → 0, a = min(|y|, 6); with e = max(floor(log2 a), 0)
//    ∈ {0, 1, 2} the grid spacing is u = 2^(e−1) and the rounded magnitude is v = n·u for an
//    integer n, whose E2M1 magnitude code is n + 2e (e = 0: n ∈ 0..4 ↦ {0, .5, 1, 1.5, 2};
//    e = 1: n ∈ {2, 3, 4} ↦ {2, 3, 4} = codes 4..6; e = 2: n ∈ {2, 3} ↦ {4, 6} = codes 6, 7).
//    n is computed exactly as quant_fast.cpp computes v (proofs there, RoundE2M1Rne/Sr):
//    RNE: the FP32 sum a + M, M = 1.5·2^(22+e), has spacing u and significand field 2^22 + n,
//    so n = bits(a + M) & (2^22 − 1); SR8: n = trunc(a·2^(1−e) + (2r+1)/512); RNA: n = lo + (δ ≥ .5)
//    with s = a·2^(1−e), lo = trunc(s), δ = s − lo, all exact (E2M1RnaSteps). The sign bit is
//    that of x (−0 and values rounding to 0 keep it, as e2m1_code).
//  * Packing: codes are written as bytes per row, then paired (low nibble = even flat index).
//    Rows whose flat start is odd (odd cols) share their first byte with the previous row; the
//    work is split into ranges that start at even flat indices, and a range is processed in
//    order, so the shared byte is written once, by one thread.
//  * Dequantize: d_b = scale_decode(code)·decode_scale (scale values from a table built with
//    scale_decode itself), then value(code)·d_b — the scalar twin's single multiply. value(code)
//    is built from the code's bits: magnitude m < 2 → m·0.5, else bits (m + 252) << 22; sign
//    bit from bit 3. BF16: round_bf16's integer steps, lane-wise.
// No multiply-add is fused (-ffp-contract=off; Mul and Add only).
//
// The helpers this file shares with quant_fast.cpp (the lane-wise rounding and block-scale
// pieces, amax, the vertical RHT, the scale parameters, the argument checks, the plain
// transpose) are in hwy_common.h.

// ------------------------------------------------------------------------------------------
// Shared declarations (compiled once; this file is re-included once per target).
#ifndef FP4_NUMERICS_PACK_FAST_SHARED_
#define FP4_NUMERICS_PACK_FAST_SHARED_

// See quant_fast.cpp: GCC 12's AVX-512 headers trigger false -Wmaybe-uninitialized warnings.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "fp4/numerics/pack_fast.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "fp4/base/error.h"
#include "fp4/numerics/format.h"
#include "fp4/numerics/hadamard.h"
#include "fp4/numerics/quant_fast.h"
#include "hwy_common.h"  // the plain section; its per-target section is included below

namespace fp4::pf {

using hwy_common::kMaxLanes;
/// SR bytes are generated in windows of at least this many consecutive elements.
constexpr int64_t kSrWindow = 16384;
/// Columns of x per panel of the quantize-transpose (output rows per work item; even, so every
/// panel starts at an even flat index of the output). 128: each row of x is read in 512-byte
/// runs (16 and 32 columns touched one 4 KiB page per 64 or 128 bytes) and the panel buffer
/// (128 × rows floats, 2 MiB at rows = 4096) is about one core's L2 here; 64 and 256 measured
/// slower at [4096, 4096].
constexpr int64_t kPanel = 128;

/// Everything the quantize kernel needs about one call (plain data, shared by all targets): the
/// block scales' parameters (hwy_common::ScaleParams: tensor scales, scale grid, SR key) and
/// these.
struct QPlan : hwy_common::ScaleParams {
  const float* x = nullptr;   ///< row r of the tensor is x + (r − x_row0)·cols
  int64_t x_row0 = 0;
  int64_t x_stride = 0;        ///< floats between rows of x (0: cols)
  uint8_t* packed = nullptr;  ///< (rows·cols + 1)/2 bytes
  uint8_t* scales = nullptr;  ///< block_rows·block_cols bytes
  int64_t rows = 0, cols = 0, B = 16;
  bool two_d = false;
  int64_t block_rows = 0, block_cols = 0;
  int sbias = 0;            ///< scale format's exponent bias
  float ssub = 0.f;         ///< scale values below this are subnormal codes (0: none)
  float ssub_mult = 1.f;    ///< 2^(frac − emin): subnormal value → code
};

/// Per-thread buffers of the quantize kernel.
struct QScratch {
  std::vector<float> amax, e;      ///< per block of one block-row (+ kMaxLanes)
  std::vector<uint8_t> scode;      ///< scale codes of one block-row (+ kMaxLanes)
  std::vector<float> erow;         ///< e_b expanded per element of a row (+ kMaxLanes)
  std::vector<uint8_t> codes;      ///< element codes of one row (+ kMaxLanes)
  std::vector<uint8_t> srw;        ///< SR bytes of the window [sr0, sr1) (+ kMaxLanes)
  int64_t sr0 = 0, sr1 = 0;
  std::vector<float> pad;          ///< kMaxLanes: zero-padded tail of a row
  std::vector<uint8_t> padsr;

  explicit QScratch(const QPlan& p) {
    const size_t nb = static_cast<size_t>(p.block_cols + kMaxLanes);
    amax.assign(nb, 0.f);
    e.assign(nb, 0.f);
    scode.assign(nb, 0);
    erow.assign(static_cast<size_t>(p.cols + kMaxLanes), 1.f);
    codes.assign(static_cast<size_t>(p.cols + kMaxLanes), 0);
    if (p.sr) srw.assign(static_cast<size_t>(std::max(p.cols, kSrWindow) + kMaxLanes), 0);
    pad.assign(kMaxLanes, 0.f);
    padsr.assign(kMaxLanes, 0);
  }
};

/// Everything the dequantize kernel needs.
struct DPlan {
  const uint8_t* packed = nullptr;
  const uint8_t* scales = nullptr;
  const float* scale_value = nullptr;  ///< [256] scale_decode(code) (valid codes)
  float gd = 1.f;
  int64_t rows = 0, cols = 0, B = 16;
  bool two_d = false;
  int64_t block_cols = 0;
  float* out = nullptr;
  uint16_t* out_bf16 = nullptr;
};

struct DScratch {
  std::vector<float> drow;      ///< d_b expanded per element of a row (+ kMaxLanes)
  std::vector<uint8_t> codes;   ///< element codes of one row (+ 2·kMaxLanes)
  std::vector<float> vals;      ///< kMaxLanes: tail of a row
  explicit DScratch(const DPlan& p)
      : drow(static_cast<size_t>(p.cols + kMaxLanes), 0.f),
        codes(static_cast<size_t>(p.cols + 2 * kMaxLanes), 0),
        vals(kMaxLanes, 0.f) {}
};

/// The kernels of one SIMD target.
struct Kernels {
  const char* name;
  /// Block-rows [br0, br1) of p, in order. False if one holds a non-finite value (the codes of
  /// that block-row and later ones are not written).
  bool (*pack_rows)(const QPlan& p, int64_t br0, int64_t br1, QScratch& s);
  /// Rows [r0, r1) of p into p.out (FP32) or p.out_bf16.
  void (*unpack_rows)(const DPlan& p, int64_t r0, int64_t r1, DScratch& s);
  /// The quantize-transpose's panel (TransposePanel below).
  void (*transpose_panel)(const float* x, int64_t rows, int64_t cols, int64_t c0, int64_t w,
                          bool rht, float* buf, int64_t ld);
  /// The quantize-transpose of one panel straight to packed codes (PackPanelT below).
  bool (*pack_panel)(const QPlan& p, const float* x, int64_t c0, int64_t w, bool rht,
                     const uint8_t* srb, float* tile);
};

}  // namespace fp4::pf

#endif  // FP4_NUMERICS_PACK_FAST_SHARED_

// ------------------------------------------------------------------------------------------
// Per-target kernels.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "pack_fast.cpp"  // found via the room's own src/ dir (fp4_room)
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "hwy_common.h"  // its per-target section: Pow2, RoundMag, ... (once per target)

HWY_BEFORE_NAMESPACE();
namespace fp4::pf::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace fp4::hwy_common::HWY_NAMESPACE;  // DF, DI, VF, VI, D8 and the shared helpers

/// Block scales of the amax lanes: e_b = 1/(c_b·gd) (TensorScaledBlockScale) and the scale
/// code of c_b.
template <bool kSub>
HWY_INLINE void BlockScales(VF amax, const QPlan& p, VF& ev, VI& code) {
  const DF df;
  const DI di;
  VF dv;
  const VF c = TensorScaledBlockScale<kSub>(amax, p, dv, ev);
  const VI bits = hn::BitCast(di, c);
  const VI normal = hn::Sub(hn::ShiftRightSame(bits, 23 - p.sfrac),
                            hn::Set(di, (127 - p.sbias) << p.sfrac));
  const VI sub = hn::ConvertTo(di, hn::Mul(c, hn::Set(df, p.ssub_mult)));
  code = hn::IfThenElse(hn::RebindMask(di, hn::Lt(c, hn::Set(df, p.ssub))), sub, normal);
}

/// E2M1 codes (0..15) of x·e (see the file comment for the proof of n + 2e); kR is the element
/// rounding (RNE, SR8 with offsets off, or RNA: n from E2M1RnaSteps, hwy_common.h).
template <Rounding kR>
HWY_INLINE VI CodesVec(VF x, VF ev, VF off) {
  const DF df;
  const DI di;
  VF y = hn::Mul(x, ev);
  y = hn::IfThenZeroElse(hn::IsNaN(y), y);  // 0·Inf (e_b overflowed) is taken as 0
  VI e;
  const VF a = E2M1Clamp(y, e);
  VI n;
  if constexpr (kR == Rounding::SR8) {
    const VF inv_u = hn::BitCast(df, hn::ShiftLeft<23>(hn::Sub(hn::Set(di, 128), e)));  // 2^(1−e)
    n = hn::ConvertTo(di, hn::Add(hn::Mul(a, inv_u), off));
  } else if constexpr (kR == Rounding::RNA) {
    (void)off;
    n = E2M1RnaSteps(a, e);
  } else {
    (void)off;
    const VF m = hn::BitCast(df, hn::Add(hn::Set(di, 0x4AC00000), hn::ShiftLeft<23>(e)));
    n = hn::And(hn::BitCast(di, hn::Add(a, m)), hn::Set(di, 0x3FFFFF));
  }
  const VI sign = hn::And(hn::ShiftRight<28>(hn::BitCast(di, x)), hn::Set(di, 8));
  return hn::Or(hn::Add(n, hn::ShiftLeft<1>(e)), sign);
}

/// dst[k] = c[2k] | c[2k+1] << 4 for k < npairs (c values < 16).
HWY_INLINE void PackPairs(const uint8_t* c, int64_t npairs, uint8_t* dst) {
  int64_t k = 0;
#if HWY_TARGET != HWY_SCALAR  // one-lane target: bytes cannot be regrouped in a vector
  const hn::ScalableTag<int16_t> d16;
  const hn::Repartition<uint8_t, decltype(d16)> d8;   // 2 bytes per int16 lane
  const hn::Rebind<uint8_t, decltype(d16)> d8h;       // 1 byte per int16 lane
  const int64_t N = static_cast<int64_t>(hn::Lanes(d16));
  const auto lo8 = hn::Set(d16, 0xFF);
  for (; k + N <= npairs; k += N) {
    const auto w = hn::BitCast(d16, hn::LoadU(d8, c + 2 * k));  // c[2k] | c[2k+1] << 8
    const auto b = hn::And(hn::Or(w, hn::ShiftRight<4>(w)), lo8);
    hn::StoreU(hn::DemoteTo(d8h, b), d8h, dst + k);
  }
#endif
  for (; k < npairs; ++k) dst[k] = static_cast<uint8_t>(c[2 * k] | (c[2 * k + 1] << 4));
}

/// Write the n codes c[0..n) of flat elements [start, start + n) into packed. `carry` holds
/// the code of start − 1 when start is odd and receives the code of start + n − 1 when
/// start + n is odd; that byte is written now only if start + n == total (high nibble 0).
HWY_INLINE void PackRun(const uint8_t* c, int64_t n, int64_t start, int64_t total,
                        uint8_t* packed, uint8_t& carry) {
  if (n == 0) return;
  if (start & 1) {
    packed[start >> 1] = static_cast<uint8_t>(carry | (c[0] << 4));
    ++c;
    ++start;
    --n;
  }
  PackPairs(c, n >> 1, packed + (start >> 1));
  if (n & 1) {
    carry = c[n - 1];
    if (start + n == total) packed[(start + n) >> 1] = carry;
  }
}

template <Rounding kR, bool kSub>
bool PackRowsT(const QPlan& p, int64_t br0, int64_t br1, QScratch& s) {
  constexpr bool kSR = kR == Rounding::SR8;
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const int64_t cols = p.cols, B = p.B, nbc = p.block_cols;
  const int64_t total = p.rows * cols;
  const int64_t xs = p.x_stride != 0 ? p.x_stride : cols;
  const int64_t row_end = p.two_d ? std::min(p.rows, br1 * B) : br1;  // rows of this range
  uint8_t carry = 0;
  float* am = s.amax.data();
  for (int64_t br = br0; br < br1; ++br) {
    const int64_t r0 = p.two_d ? br * B : br;
    const int64_t r1 = p.two_d ? std::min(p.rows, r0 + B) : br + 1;
    // 1. block amax
    if (!BlockRowAmax(p.x + (r0 - p.x_row0) * xs, xs, r1 - r0, cols, B, nbc, am)) return false;
    // 2. block scales and their codes, Lanes blocks at a time
    for (int64_t bc = 0; bc < nbc; bc += N) {
      VF ev;
      VI code;
      BlockScales<kSub>(hn::LoadU(df, am + bc), p, ev, code);
      hn::StoreU(ev, df, s.e.data() + bc);
      hn::StoreU(hn::DemoteTo(D8(), code), D8(), s.scode.data() + bc);
    }
    std::memcpy(p.scales + br * nbc, s.scode.data(), static_cast<size_t>(nbc));
    // 3. e_b per element of a row
    float* er = s.erow.data();
    if (B % N == 0) {
      for (int64_t bc = 0; bc < nbc; ++bc) {
        const VF ev = hn::Set(df, s.e[static_cast<size_t>(bc)]);
        const int64_t c0 = bc * B, c1 = std::min(cols, c0 + B);
        for (int64_t j = c0; j < c1; j += N) hn::StoreU(ev, df, er + j);
      }
    } else {
      // Blocks that are not whole vectors (8 on 16 lanes): a walk of whole vectors along the
      // row, each lane's e_b looked up from its block (the row kernel's of quant_fast.cpp).
      const int64_t qN = N / B, rN = N % B, kmax = (B + N - 2) / B;
      int64_t bc0 = 0, o0 = 0;
      VI rel = LaneBlockRel(0, B, kmax);
      for (int64_t j = 0; j < cols; j += N) {  // the last store may run into erow's spare
        hn::StoreU(LookupBlocks(s.e.data() + bc0, rel), df, er + j);
        BlockWalkStep(B, qN, rN, bc0, o0);
        if (rN != 0) rel = LaneBlockRel(o0, B, kmax);
      }
    }
    // 4. element codes, row by row, then packed
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t start = r * cols;
      const float* xr = p.x + (r - p.x_row0) * xs;
      const uint8_t* srp = nullptr;
      if constexpr (kSR) {
        if (start < s.sr0 || start + cols > s.sr1) {
          s.sr0 = start;
          s.sr1 = std::min(row_end * cols, start + std::max(cols, kSrWindow));
          sr_bytes_fast(p.key, static_cast<uint64_t>(s.sr0), static_cast<uint64_t>(s.sr1 - s.sr0),
                        s.srw.data());
        }
        srp = s.srw.data() + (start - s.sr0);
      }
      uint8_t* cr = s.codes.data();
      int64_t j = 0;
      for (; j + N <= cols; j += N) {
        const VF off = kSR ? SrOffsets(srp + j) : hn::Zero(df);
        const VI code = CodesVec<kR>(hn::LoadU(df, xr + j), hn::LoadU(df, er + j), off);
        hn::StoreU(hn::DemoteTo(D8(), code), D8(), cr + j);
      }
      if (j < cols) {
        float* px = s.pad.data();
        uint8_t* psr = s.padsr.data();
        for (int64_t t = 0; t < N; ++t) {
          px[t] = j + t < cols ? xr[j + t] : 0.0f;
          if constexpr (kSR) psr[t] = j + t < cols ? srp[j + t] : 0;
        }
        const VF off = kSR ? SrOffsets(psr) : hn::Zero(df);
        const VI code = CodesVec<kR>(hn::LoadU(df, px), hn::LoadU(df, er + j), off);
        hn::StoreU(hn::DemoteTo(D8(), code), D8(), cr + j);  // codes has kMaxLanes spare
      }
      PackRun(cr, cols, start, total, p.packed, carry);
    }
  }
  return true;
}

/// The quantize-transpose's input panel: buf [w][rows] = columns [c0, c0 + w) of x [rows, cols]
/// (w ≤ kPanel), each 16-long chunk along rows RHT-transformed first if rht (rows % 16 == 0):
/// per column the operations of hadamard.cpp's rht16_chunk (sign multiply, butterflies
/// h = 1, 2, 4, 8 as (a + b, a − b), ·0.25), done lane-wise over the tile's columns. Chunks of
/// 16 rows of x are copied (whole 256-byte runs per row for a full panel) into a tile
/// [16][kPanel] in L1, then transposed with gathers of Lanes rows (a copy: the bits are x's).
void TransposePanel(const float* x, int64_t rows, int64_t cols, int64_t c0, int64_t w, bool rht,
                    float* buf, int64_t ld) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  alignas(64) float tile[16 * kPanel] = {};
  const VI gidx = RowIndices(kPanel);
  const bool vec_t = 16 % N == 0;  // Lanes ≤ 16 divides a full chunk
  for (int64_t r0 = 0; r0 < rows; r0 += 16) {
    const int64_t h = std::min<int64_t>(16, rows - r0);
    if (w == kPanel) {
      for (int64_t i = 0; i < h; ++i) {
        const float* xr = x + (r0 + i) * cols + c0;
        for (int64_t k = 0; k < kPanel; k += N) hn::StoreU(hn::LoadU(df, xr + k), df, tile + i * kPanel + k);
      }
    } else {
      for (int64_t i = 0; i < h; ++i) {
        std::memcpy(tile + i * kPanel, x + (r0 + i) * cols + c0, static_cast<size_t>(w) * 4);
      }
    }
    if (rht) {  // h == 16
      for (int64_t k = 0; k < kPanel; k += N) {
        VF v[16];
        Rht16Load(tile + k, kPanel, v, /*bf16=*/false);
        for (int i = 0; i < 16; ++i) hn::StoreU(v[i], df, tile + i * kPanel + k);
      }
    }
    if (h == 16 && vec_t) {
      for (int64_t j = 0; j < w; ++j) {
        float* o = buf + j * ld + r0;
        for (int64_t i = 0; i < 16; i += N)
          hn::StoreU(hn::GatherIndex(df, tile + i * kPanel + j, gidx), df, o + i);
      }
    } else {
      for (int64_t j = 0; j < w; ++j) {
        float* o = buf + j * ld + r0;
        for (int64_t i = 0; i < h; ++i) o[i] = tile[i * kPanel + j];
      }
    }
  }
}

/// 8 packed bytes of 16 codes c[0..16) (each < 16): byte k = c[2k] | c[2k+1] << 4.
HWY_INLINE void Pack16(const uint8_t* c, uint8_t* dst) {
  for (int h = 0; h < 2; ++h) {
    uint64_t w;
    std::memcpy(&w, c + 8 * h, 8);                       // little-endian: byte i = c[8h + i]
    w = (w | (w >> 4)) & 0x00FF00FF00FF00FFull;          // even bytes: c[2k] | c[2k+1] << 4
    w = (w | (w >> 8)) & 0x0000FFFF0000FFFFull;          // gather them: 2 bytes per 32 bits
    const uint32_t b = static_cast<uint32_t>(w | (w >> 16));
    std::memcpy(dst + 4 * h, &b, 4);
  }
}

#if HWY_TARGET != HWY_SCALAR  // one-lane target: bytes cannot be regrouped in a vector
/// dst[i·ldd + j] = src[j·lds + i] for i, j < 16: a 16 × 16 byte transpose in four rounds of
/// 128-bit interleaves (of bytes, then of 16-, 32- and 64-bit lanes). A copy.
HWY_INLINE void Transpose16x16Bytes(const uint8_t* src, int64_t lds, uint8_t* dst, int64_t ldd) {
  const hn::Full128<uint8_t> d8;
  const hn::Full128<uint16_t> d16;
  const hn::Full128<uint32_t> d32;
  const hn::Full128<uint64_t> d64;
  hn::Vec<decltype(d8)> a[16], r1[2][8];
  hn::Vec<decltype(d16)> r2[4][4];
  hn::Vec<decltype(d32)> r3[8][2];
  for (int j = 0; j < 16; ++j) a[j] = hn::LoadU(d8, src + j * lds);
  // r1[h][k]: 16-bit lane t = rows 2k, 2k+1 of column 8h + t
  for (int k = 0; k < 8; ++k) {
    r1[0][k] = hn::InterleaveLower(d8, a[2 * k], a[2 * k + 1]);
    r1[1][k] = hn::InterleaveUpper(d8, a[2 * k], a[2 * k + 1]);
  }
  // r2[q][k]: 32-bit lane t = rows 4k .. 4k+3 of column 4q + t
  for (int h = 0; h < 2; ++h)
    for (int k = 0; k < 4; ++k) {
      const auto x0 = hn::BitCast(d16, r1[h][2 * k]), x1 = hn::BitCast(d16, r1[h][2 * k + 1]);
      r2[2 * h][k] = hn::InterleaveLower(d16, x0, x1);
      r2[2 * h + 1][k] = hn::InterleaveUpper(d16, x0, x1);
    }
  // r3[o][k]: 64-bit lane t = rows 8k .. 8k+7 of column 2o + t
  for (int q = 0; q < 4; ++q)
    for (int k = 0; k < 2; ++k) {
      const auto y0 = hn::BitCast(d32, r2[q][2 * k]), y1 = hn::BitCast(d32, r2[q][2 * k + 1]);
      r3[2 * q][k] = hn::InterleaveLower(d32, y0, y1);
      r3[2 * q + 1][k] = hn::InterleaveUpper(d32, y0, y1);
    }
  // columns 2o and 2o + 1, rows 0 .. 15
  for (int o = 0; o < 8; ++o) {
    const auto z0 = hn::BitCast(d64, r3[o][0]), z1 = hn::BitCast(d64, r3[o][1]);
    hn::StoreU(hn::BitCast(d8, hn::InterleaveLower(d64, z0, z1)), d8, dst + (2 * o) * ldd);
    hn::StoreU(hn::BitCast(d8, hn::InterleaveUpper(d64, z0, z1)), d8, dst + (2 * o + 1) * ldd);
  }
}

/// Pack16 of 16 columns at once: the codes c[t·ldc + j] (t < 16 rows, j < 16 columns, each
/// < 16) give out[j·16 + k] = c[2k][j] | c[2k+1][j] << 4 for k < 8, column j's 8 packed bytes
/// (out[j·16 + 8 .. 16) are zero). Rows are paired into nibbles lane-wise (a 16-bit shift
/// cannot carry between bytes < 16) into the first 8 rows of a 16 × 16 block, which
/// Transpose16x16Bytes turns into one row per column.
HWY_INLINE void PackColumns16(const uint8_t* c, int64_t ldc, uint8_t* out) {
  const hn::Full128<uint8_t> d8;
  const hn::Full128<uint16_t> d16;
  alignas(16) uint8_t rows[16 * 16] = {};
  for (int k = 0; k < 8; ++k) {
    const auto hi = hn::ShiftLeft<4>(hn::BitCast(d16, hn::LoadU(d8, c + (2 * k + 1) * ldc)));
    hn::Store(hn::Or(hn::LoadU(d8, c + 2 * k * ldc), hn::BitCast(d8, hi)), d8, rows + 16 * k);
  }
  Transpose16x16Bytes(rows, 16, out, 16);
}
#endif

/// The quantize-transpose of one panel, without a buffer: output rows [c0, c0 + w) of p (the
/// columns c0.. of x [rows = p.cols, cols = p.rows], w ≤ kPanel), blocks of p.B (a multiple of
/// 16) along the rows of x; needs rows % 16 == 0. For each block-row of x (h = min(B, rows − r0)
/// rows): the rows' kPanel-column runs are copied into `tile` [B][kPanel] (in L1; columns ≥ w
/// must be zero on entry), RHT-transformed per 16 rows if rht (the operations of
/// TransposePanel), then Lanes columns at a time the block amax (a vertical max: one block
/// per lane) and block scales (BlockScales, the row kernel's), then 16 rows at a time the
/// codes by CodesVec in the tile's orientation (lanes are columns, each lane its column's e_b;
/// the SR bytes transposed to match by Transpose16x16Bytes), nibble-packed and transposed per
/// 16 columns (PackColumns16) and written, 8 bytes per column, straight into p.packed at the
/// output row's flat offset (even: rows and r0 are). (The one-lane HWY_SCALAR target gathers
/// each column's 16 elements instead and packs them with Pack16.) srb holds the SR bytes of
/// the panel's output rows, srb[j·rows + r] for element (c0 + j, r). The operations per value
/// are the row kernel's, so the bits are those of PackRowsT on the transposed operand. False
/// on a non-finite value (after the RHT); earlier blocks may be written.
template <Rounding kR, bool kSub>
bool PackPanelT(const QPlan& p, const float* x, int64_t c0, int64_t w, bool rht,
                const uint8_t* srb, float* tile) {
  constexpr bool kSR = kR == Rounding::SR8;
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const int64_t rows = p.cols, cols = p.rows, B = p.B, nbc = p.block_cols;
  alignas(64) float ev_arr[kPanel + kMaxLanes];
  alignas(64) uint8_t scode[kPanel + kMaxLanes];
#if HWY_TARGET != HWY_SCALAR
  // 16 rows of codes and of SR bytes in the tile's orientation, and 16 columns' packed bytes
  alignas(64) uint8_t ct[16 * kPanel] = {};
  alignas(64) uint8_t srt[16 * kPanel] = {};
  alignas(64) uint8_t pk[16 * 16];
#else
  const VI gidx = RowIndices(kPanel);
  alignas(64) uint8_t cb[16 + kMaxLanes];
#endif
  const int64_t wv = (w + N - 1) / N * N;  // columns processed as whole vectors (≤ kPanel)
  for (int64_t r0 = 0; r0 < rows; r0 += B) {
    const int64_t h = std::min(B, rows - r0);  // a multiple of 16
    // 1. the block-row's runs of x (columns ≥ w stay zero)
    for (int64_t i = 0; i < h; ++i) {
      const float* xr = x + (r0 + i) * cols + c0;
      float* t = tile + i * kPanel;
      if (w == kPanel) {
        for (int64_t k = 0; k < kPanel; k += N) hn::StoreU(hn::LoadU(df, xr + k), df, t + k);
      } else {
        std::memcpy(t, xr, static_cast<size_t>(w) * 4);
      }
    }
    // 2. RHT16 along the rows of x, lane-wise over the columns (TransposePanel's operations)
    if (rht) {
      for (int64_t g = 0; g < h; g += 16) {
        for (int64_t k = 0; k < wv; k += N) {
          VF v[16];
          float* t = tile + g * kPanel + k;
          Rht16Load(t, kPanel, v, /*bf16=*/false);
          for (int i = 0; i < 16; ++i) hn::StoreU(v[i], df, t + i * kPanel);
        }
      }
    }
    // 3. block amax of each column (vertical max of |x| bits), block scales and their codes
    for (int64_t k = 0; k < wv; k += N) {
      VI m;
      if (!ColumnAmaxBits(tile + k, kPanel, h, m)) return false;
      VF ev;
      VI code;
      BlockScales<kSub>(hn::BitCast(df, m), p, ev, code);
      hn::StoreU(ev, df, ev_arr + k);
      hn::StoreU(hn::DemoteTo(D8(), code), D8(), scode + k);
    }
    const int64_t bc = r0 / B;
    for (int64_t j = 0; j < w; ++j) p.scales[(c0 + j) * nbc + bc] = scode[j];
#if HWY_TARGET != HWY_SCALAR
    // 4. 16 rows at a time: codes in the tile's orientation (lanes are columns, each with its
    // block's e_b; SR bytes transposed to match), then per 16 columns nibble-packed and
    // transposed (PackColumns16) into 8 bytes of each column's output row
    for (int64_t i = 0; i < h; i += 16) {
      if constexpr (kSR) {  // srt[t·kPanel + j] = srb[j·rows + r0 + i + t]
        for (int64_t j0 = 0; j0 < w; j0 += 16) {
          if (j0 + 16 <= w) {
            Transpose16x16Bytes(srb + j0 * rows + r0 + i, rows, srt + j0, kPanel);
          } else {  // the last columns, the rest zero
            alignas(16) uint8_t part[16 * 16] = {};
            for (int64_t j = j0; j < w; ++j)
              std::memcpy(part + (j - j0) * 16, srb + j * rows + r0 + i, 16);
            Transpose16x16Bytes(part, 16, srt + j0, kPanel);
          }
        }
      }
      for (int64_t t = 0; t < 16; ++t)
        for (int64_t k = 0; k < wv; k += N) {
          const VF off = kSR ? SrOffsets(srt + t * kPanel + k) : hn::Zero(df);
          const VI code = CodesVec<kR>(hn::LoadU(df, tile + (i + t) * kPanel + k),
                                       hn::LoadU(df, ev_arr + k), off);
          hn::StoreU(hn::DemoteTo(D8(), code), D8(), ct + t * kPanel + k);
        }
      for (int64_t j0 = 0; j0 < w; j0 += 16) {
        PackColumns16(ct + j0, kPanel, pk);
        for (int64_t j = j0; j < std::min(w, j0 + 16); ++j)
          std::memcpy(p.packed + ((c0 + j) * rows + r0 + i) / 2, pk + (j - j0) * 16, 8);
      }
    }
#else
    // 4. codes of each column's block, 16 elements (8 packed bytes) at a time
    for (int64_t j = 0; j < w; ++j) {
      const VF ev = hn::Set(df, ev_arr[j]);
      const int64_t flat = (c0 + j) * rows + r0;
      const uint8_t* sj = kSR ? srb + j * rows + r0 : nullptr;
      for (int64_t i = 0; i < h; i += 16) {
        for (int64_t q = 0; q < 16; q += N) {
          const VF xv = hn::GatherIndex(df, tile + (i + q) * kPanel + j, gidx);
          const VF off = kSR ? SrOffsets(sj + i + q) : hn::Zero(df);
          hn::StoreU(hn::DemoteTo(D8(), CodesVec<kR>(xv, ev, off)), D8(), cb + q);
        }
        Pack16(cb, p.packed + (flat + i) / 2);
      }
    }
#endif
  }
  return true;
}

template <Rounding kR>
bool PackPanelR(const QPlan& p, const float* x, int64_t c0, int64_t w, bool rht,
                const uint8_t* srb, float* tile) {
  return p.sub_pow2 ? PackPanelT<kR, true>(p, x, c0, w, rht, srb, tile)
                    : PackPanelT<kR, false>(p, x, c0, w, rht, srb, tile);
}

bool PackPanel(const QPlan& p, const float* x, int64_t c0, int64_t w, bool rht,
               const uint8_t* srb, float* tile) {
  if (p.sr) return PackPanelR<Rounding::SR8>(p, x, c0, w, rht, srb, tile);
  return p.rna ? PackPanelR<Rounding::RNA>(p, x, c0, w, rht, srb, tile)
               : PackPanelR<Rounding::RNE>(p, x, c0, w, rht, srb, tile);
}

template <Rounding kR>
bool PackRowsR(const QPlan& p, int64_t br0, int64_t br1, QScratch& s) {
  return p.sub_pow2 ? PackRowsT<kR, true>(p, br0, br1, s) : PackRowsT<kR, false>(p, br0, br1, s);
}

bool PackRows(const QPlan& p, int64_t br0, int64_t br1, QScratch& s) {
  if (p.sr) return PackRowsR<Rounding::SR8>(p, br0, br1, s);
  return p.rna ? PackRowsR<Rounding::RNA>(p, br0, br1, s) : PackRowsR<Rounding::RNE>(p, br0, br1, s);
}

// ---------------------------------------------------------------- dequantize

/// c[2k] = p[k] & 15, c[2k+1] = p[k] >> 4 for k < nbytes.
HWY_INLINE void UnpackNibbles(const uint8_t* p, int64_t nbytes, uint8_t* c) {
  int64_t k = 0;
#if HWY_TARGET != HWY_SCALAR  // one-lane target: bytes cannot be regrouped in a vector
  const hn::ScalableTag<uint16_t> d16;
  const hn::Rebind<uint8_t, decltype(d16)> d8h;      // 1 byte per lane
  const hn::Repartition<uint8_t, decltype(d16)> d8;  // 2 bytes per lane
  const int64_t N = static_cast<int64_t>(hn::Lanes(d16));
  for (; k + N <= nbytes; k += N) {
    const auto w = hn::PromoteTo(d16, hn::LoadU(d8h, p + k));
    const auto v = hn::Or(hn::And(w, hn::Set(d16, 0x0F)), hn::ShiftLeft<4>(hn::And(w, hn::Set(d16, 0xF0))));
    hn::StoreU(hn::BitCast(d8, v), d8, c + 2 * k);  // lo byte, hi byte (little-endian)
  }
#endif
  for (; k < nbytes; ++k) {
    c[2 * k] = p[k] & 0xF;
    c[2 * k + 1] = static_cast<uint8_t>(p[k] >> 4);
  }
}

/// e2m1_decode of the code lanes (0..15): magnitude m < 2 → m·0.5, else bits (m + 252) << 22;
/// sign bit from bit 3 (code 8 is −0).
HWY_INLINE VF DecodeE2M1(VI code) {
  const DF df;
  const DI di;
  const VI m = hn::And(code, hn::Set(di, 7));
  const VF small = hn::Mul(hn::ConvertTo(df, m), hn::Set(df, 0.5f));
  const VF big = hn::BitCast(df, hn::ShiftLeft<22>(hn::Add(m, hn::Set(di, 252))));
  const VF mag = hn::IfThenElse(hn::RebindMask(df, hn::Lt(m, hn::Set(di, 2))), small, big);
  const VI sign = hn::ShiftLeft<28>(hn::And(code, hn::Set(di, 8)));
  return hn::BitCast(df, hn::Or(hn::BitCast(di, mag), sign));
}

template <bool kBf16>
void UnpackRowsT(const DPlan& p, int64_t r0, int64_t r1, DScratch& s) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const int64_t cols = p.cols, B = p.B, nbc = p.block_cols;
  const hn::Rebind<uint16_t, DF> d16;
  float* dr = s.drow.data();
  int64_t have_br = -1;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t br = p.two_d ? r / B : r;
    if (br != have_br) {  // d_b = scale_decode(code)·decode_scale, expanded per element
      const uint8_t* sc = p.scales + br * nbc;
      for (int64_t bc = 0; bc < nbc; ++bc) {
        const float d = p.scale_value[sc[bc]] * p.gd;
        const int64_t c0 = bc * B, c1 = std::min(cols, c0 + B);
        if (B % N == 0) {
          const VF dv = hn::Set(df, d);
          for (int64_t j = c0; j < c1; j += N) hn::StoreU(dv, df, dr + j);
        } else {
          for (int64_t j = c0; j < c1; ++j) dr[j] = d;
        }
      }
      have_br = br;
    }
    // codes of the row's elements, from flat index start
    const int64_t start = r * cols;
    uint8_t* c = s.codes.data();
    int64_t first = 0;  // codes[first..first + cols) are this row's
    if (start & 1) {
      // byte (start − 1)/2 holds element start − 1 (low) and start (high)
      UnpackNibbles(p.packed + (start >> 1), (cols + 2) / 2, c);
      first = 1;
    } else {
      UnpackNibbles(p.packed + (start >> 1), (cols + 1) / 2, c);
    }
    const uint8_t* cr = c + first;
    int64_t j = 0;
    for (; j + N <= cols; j += N) {
      const VI code = hn::PromoteTo(DI(), hn::LoadU(D8(), cr + j));
      const VF v = hn::Mul(DecodeE2M1(code), hn::LoadU(df, dr + j));
      if constexpr (kBf16) {
        hn::StoreU(hn::DemoteTo(d16, Bf16Bits(v)), d16, p.out_bf16 + start + j);
      } else {
        hn::StoreU(v, df, p.out + start + j);
      }
    }
    if (j < cols) {  // codes and drow have kMaxLanes spare (stale but finite) entries
      const VI code = hn::PromoteTo(DI(), hn::LoadU(D8(), cr + j));
      const VF v = hn::Mul(DecodeE2M1(code), hn::LoadU(df, dr + j));
      if constexpr (kBf16) {
        alignas(64) uint16_t tmp[kMaxLanes];
        hn::StoreU(hn::DemoteTo(d16, Bf16Bits(v)), d16, tmp);
        std::memcpy(p.out_bf16 + start + j, tmp, static_cast<size_t>(cols - j) * 2);
      } else {
        hn::StoreU(v, df, s.vals.data());
        std::memcpy(p.out + start + j, s.vals.data(), static_cast<size_t>(cols - j) * 4);
      }
    }
  }
}

void UnpackRows(const DPlan& p, int64_t r0, int64_t r1, DScratch& s) {
  if (p.out_bf16 != nullptr) {
    UnpackRowsT<true>(p, r0, r1, s);
  } else {
    UnpackRowsT<false>(p, r0, r1, s);
  }
}

}  // namespace fp4::pf::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

// ------------------------------------------------------------------------------------------
// Dispatch and public API (compiled once).
#if HWY_ONCE
#include "fp4/numerics/hwy_dispatch.h"
namespace fp4 {
namespace pf {
namespace {

using hwy_common::kParallelMin;

#define FP4_PF_KERNELS(NS, NAME) \
  Kernels { NAME, &NS::PackRows, &NS::UnpackRows, &NS::TransposePanel, &NS::PackPanel }

/// Every target compiled in (fp4/numerics/hwy_dispatch.h, named as quant_fast_targets() names
/// them); the one used is the one quant_fast_target() reports, so quant_fast_use_target()
/// selects these kernels too.
#define FP4_PF_ENTRY(NS, TARGET) {TARGET, FP4_PF_KERNELS(NS, hwy_dispatch::target_name(TARGET))},
const hwy_dispatch::Table<Kernels>& compiled() {
  static const hwy_dispatch::Table<Kernels> t({FP4_HWY_FOR_EACH_TARGET(FP4_PF_ENTRY)});
  return t;
}
#undef FP4_PF_ENTRY
#undef FP4_PF_KERNELS

const Kernels& active() {
  const std::string name = quant_fast_target();
  if (const Kernels* k = compiled().find(name)) return *k;
  throw std::logic_error("pack_fast: SIMD target '" + name + "' is not compiled into pack_fast.cpp");
}

/// Whether the fused kernel applies: E2M1 elements, a ScaleFormat enum scale, the
/// tensor-scaled rule (quant_fast_supports's tensor-scaled set), no Four Over Six. pack() also
/// accepts MXFP4 (UE8M0 under mx-te / mx-ocp) and 4/6 scales; those QTensors come from the
/// scalar composition.
bool packable(const BlockQuantSpec& spec) {
  return spec.element.is_e2m1() && spec.scale_desc == nullptr &&
         spec.scale_rule == ScaleRule::TensorScaled && quant_fast_supports(spec) &&
         spec.four_over_six == FourOverSix::Off;
}

/// Valid-code table of a scale format: value[c] = scale_decode(c, f) for valid codes.
struct ScaleTable {
  std::array<float, 256> value{};
  std::array<bool, 256> valid{};
};
const ScaleTable& scale_table(ScaleFormat f) {
  static std::array<ScaleTable, 4> tables;
  static std::once_flag once;
  std::call_once(once, [] {
    for (ScaleFormat g :
         {ScaleFormat::UE5M3, ScaleFormat::UE5M3_PTX, ScaleFormat::E4M3, ScaleFormat::UE8M0}) {
      ScaleTable& t = tables[static_cast<size_t>(g)];
      for (int c = 0; c < 256; ++c) {
        try {
          t.value[static_cast<size_t>(c)] = scale_decode(static_cast<uint8_t>(c), g);
          t.valid[static_cast<size_t>(c)] = true;
        } catch (const std::invalid_argument&) {
          t.valid[static_cast<size_t>(c)] = false;
        }
      }
    }
  });
  (void)scale_format_desc(f);  // throws on an invalid enum value
  return tables[static_cast<size_t>(f)];
}

void check_qtensor(const char* where, const QTensor& t) {
  const std::string w = where;
  if (t.rows < 0 || t.cols < 0 || t.block <= 0) {
    throw std::invalid_argument(w + ": QTensor has a negative shape or block <= 0");
  }
  const int64_t n = t.rows * t.cols;
  if (t.packed.size() != static_cast<size_t>((n + 1) / 2) ||
      t.scale_codes.size() != static_cast<size_t>(t.block_rows() * t.block_cols())) {
    throw std::invalid_argument(w + ": inconsistent QTensor sizes (packed " +
                                std::to_string(t.packed.size()) + " bytes, scale_codes " +
                                std::to_string(t.scale_codes.size()) + " for [" +
                                std::to_string(t.rows) + ", " + std::to_string(t.cols) +
                                "], block " + std::to_string(t.block) + ")");
  }
}

void dequantize_any(const char* where, const QTensor& t, float* out, uint16_t* out_bf16) {
  check_qtensor(where, t);
  const ScaleTable& tab = scale_table(t.scale_format);
  for (uint8_t c : t.scale_codes) {
    if (!tab.valid[c]) (void)scale_decode(c, t.scale_format);  // throws the scalar's error
  }
  if (t.rows == 0 || t.cols == 0) return;
  DPlan p;
  p.packed = t.packed.data();
  p.scales = t.scale_codes.data();
  p.scale_value = tab.value.data();
  p.gd = t.decode_scale;
  p.rows = t.rows;
  p.cols = t.cols;
  p.B = t.block;
  p.two_d = t.two_d;
  p.block_cols = t.block_cols();
  p.out = out;
  p.out_bf16 = out_bf16;
  const Kernels& k = active();
  const bool par = t.rows * t.cols >= (int64_t{1} << 16) && t.rows > 1;
#pragma omp parallel if (par)
  {
    const int nt = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t r0 = t.rows * id / nt, r1 = t.rows * (id + 1) / nt;
    if (r0 < r1) {
      DScratch s(p);
      k.unpack_rows(p, r0, r1, s);
    }
  }
}

}  // namespace
}  // namespace pf

namespace pf {
namespace {

/// The QTensor fields of a packed [rows, cols] operand (as pack() sets them) and the kernel
/// plan that fills its buffers (x left unset).
QPlan start_qtensor(int64_t rows, int64_t cols, const BlockQuantSpec& spec, float g,
                    const SrKey* sr, QTensor& out) {
  QPlan p;
  hwy_common::set_scale_params(p, spec, g, sr);
  out.rows = rows;
  out.cols = cols;
  out.block = spec.block;
  out.two_d = spec.two_d;
  out.scale_format = spec.scale_format;
  out.element_format = "e2m1";
  out.decode_scale = p.gd;
  out.reference = g;
  out.target = spec.target;
  const int64_t n = rows * cols;
  out.packed.resize(static_cast<size_t>((n + 1) / 2));
  out.scale_codes.resize(static_cast<size_t>(out.block_rows() * out.block_cols()));

  p.packed = out.packed.data();
  p.scales = out.scale_codes.data();
  p.rows = rows;
  p.cols = cols;
  p.B = spec.block;
  p.two_d = spec.two_d;
  p.block_rows = out.block_rows();
  p.block_cols = out.block_cols();
  const FloatFormat& fmt = scale_format_desc(spec.scale_format);
  p.sbias = fmt.bias;
  p.ssub = fmt.subnormals ? detail::pow2f(p.semin) : 0.0f;
  p.ssub_mult = fmt.subnormals ? detail::pow2f(p.sfrac - p.semin) : 1.0f;
  return p;
}

/// Thread `id` of `nt`'s contiguous share [u0, u1) of `units` work items (static schedule).
void share(int64_t units, int nt, int id, int64_t& u0, int64_t& u1) {
  u0 = units * id / nt;
  u1 = units * (id + 1) / nt;
}

}  // namespace
}  // namespace pf

std::string pack_fast_slow_path(const BlockQuantSpec& spec) {
  // The row-wise answer covers the forced hook and the specs without any SIMD kernel.
  if (std::string why = quant_fast_slow_path(spec, false, false); !why.empty()) return why;
  if (spec.four_over_six != FourOverSix::Off)
    return "scalar quantize_blocks, then pack (Four Over Six has no fused packer)";
  if (!pf::packable(spec)) return "scalar quantize_blocks, then pack (MXFP4 has no fused packer)";
  return "";
}

void quantize_pack_fast(const float* x, int64_t rows, int64_t cols, const BlockQuantSpec& spec,
                        float g, const SrKey* sr, QTensor& out) {
  const char* where = "quantize_pack_fast";
  detail::validate_block_quant(where, rows, cols, spec, g, sr);
  if (!pf::packable(spec)) {
    // Not fused: the scalar composition packs MXFP4, and throws pack()'s error on what is not
    // QTensor material (or quantize_blocks' NonFiniteError first, as the twin does).
    auto facts = std::move(out.facts);
    out = pack(quantize_blocks(x, rows, cols, spec, g, sr));
    out.facts = std::move(facts);
    return;
  }
  pf::QPlan p = pf::start_qtensor(rows, cols, spec, g, sr, out);
  p.x = x;
  const int64_t n = rows * cols;
  if (n == 0) return;
  // Work ranges start at even flat indices: a block-row holds rows_per·cols elements; if that
  // is odd, block-rows go in pairs.
  const int64_t rows_per = spec.two_d ? spec.block : 1;
  const int64_t unit = (rows_per * cols) % 2 == 0 ? 1 : 2;
  const int64_t units = (p.block_rows + unit - 1) / unit;
  const pf::Kernels& k = pf::active();
  std::atomic<bool> bad{false};
  const bool par = n >= pf::kParallelMin && units > 1;
#pragma omp parallel if (par)
  {
    int64_t u0, u1;
    pf::share(units, omp_get_num_threads(), omp_get_thread_num(), u0, u1);
    const int64_t br0 = u0 * unit, br1 = std::min(p.block_rows, u1 * unit);
    if (br0 < br1) {
      pf::QScratch s(p);
      if (!k.pack_rows(p, br0, br1, s)) bad.store(true, std::memory_order_relaxed);
    }
  }
  if (bad.load()) detail::throw_non_finite(where, x, n);
}

QTensor quantize_pack_fast(const float* x, int64_t rows, int64_t cols, const BlockQuantSpec& spec,
                           float g, const SrKey* sr, std::map<std::string, std::string> facts) {
  QTensor t;
  t.facts = std::move(facts);
  quantize_pack_fast(x, rows, cols, spec, g, sr, t);
  return t;
}

QTensor quantize_pack_transposed_fast(const float* x, int64_t rows, int64_t cols,
                                      const BlockQuantSpec& spec, float g, const SrKey* sr,
                                      bool rht, std::map<std::string, std::string> facts) {
  QTensor q;
  q.facts = std::move(facts);
  quantize_pack_transposed_fast(x, rows, cols, spec, g, sr, rht, q);
  return q;
}

void quantize_pack_transposed_fast(const float* x, int64_t rows, int64_t cols,
                                   const BlockQuantSpec& spec, float g, const SrKey* sr, bool rht,
                                   QTensor& q) {
  const char* where = "quantize_pack_transposed_fast";
  hwy_common::check_transposed_shape(where, rows, cols, rht ? 16 : 0);
  detail::validate_block_quant(where, cols, rows, spec, g, sr);
  const int64_t n = rows * cols;
  bool fused = pf::packable(spec) && !spec.two_d && n > 0;
  if (fused && rows % 16 == 0 && spec.block % 16 == 0) {
    // One pass without a buffer (PackPanelT): panels of kPanel columns of x, each read in
    // block-rows of B rows into an L1 tile and quantized from there straight into the packed
    // output rows. The SR bytes of a panel's output rows are one contiguous run of flat
    // indices, [c0·rows, (c0 + w)·rows), generated per panel.
    pf::QPlan p = pf::start_qtensor(cols, rows, spec, g, sr, q);
    const int64_t panels = (cols + pf::kPanel - 1) / pf::kPanel;
    const pf::Kernels& k = pf::active();
    std::atomic<bool> bad{false};
#pragma omp parallel if (n >= pf::kParallelMin && panels > 1)
    {
      int64_t u0, u1;
      pf::share(panels, omp_get_num_threads(), omp_get_thread_num(), u0, u1);
      if (u0 < u1) {
        std::vector<float> tile(static_cast<size_t>(spec.block * pf::kPanel), 0.0f);
        std::vector<uint8_t> srb(p.sr ? static_cast<size_t>(pf::kPanel * rows + pf::kMaxLanes) : 0);
        for (int64_t u = u0; u < u1 && !bad.load(std::memory_order_relaxed); ++u) {
          const int64_t c0 = u * pf::kPanel, w = std::min(pf::kPanel, cols - c0);
          if (p.sr)
            sr_bytes_fast(p.key, static_cast<uint64_t>(c0 * rows), static_cast<uint64_t>(w * rows),
                          srb.data());
          if (!k.pack_panel(p, x, c0, w, rht, srb.data(), tile.data()))
            bad.store(true, std::memory_order_relaxed);
        }
      }
    }
    if (!bad.load()) return;
    // A non-finite value (in x or its RHT): the composition below throws the reference's error.
  } else if (fused) {
    // One pass: panels of kPanel columns of x are transposed (+ RHT) into a per-thread buffer
    // [kPanel, rows] (row stride ld) that stays in cache, and quantized there by the row kernel as output rows
    // [c0, c0 + kPanel) (1-D blocks: one block-row per output row; panels start at even flat
    // indices, so no byte is shared between threads).
    pf::QPlan p = pf::start_qtensor(cols, rows, spec, g, sr, q);
    const int64_t panels = (cols + pf::kPanel - 1) / pf::kPanel;
    // Rows of the panel buffer one cache line longer than needed, so that a chunk's stores to
    // its kPanel rows do not all map to the same L1 sets (rows of 4 KiB multiples).
    const int64_t ld = rows + 16;
    const pf::Kernels& k = pf::active();
    std::atomic<bool> bad{false};
#pragma omp parallel if (n >= pf::kParallelMin && panels > 1)
    {
      int64_t u0, u1;
      pf::share(panels, omp_get_num_threads(), omp_get_thread_num(), u0, u1);
      if (u0 < u1) {
        pf::QScratch s(p);
        std::vector<float> buf(static_cast<size_t>(pf::kPanel * ld));
        pf::QPlan pp = p;
        pp.x = buf.data();
        pp.x_stride = ld;
        for (int64_t u = u0; u < u1 && !bad.load(std::memory_order_relaxed); ++u) {
          const int64_t c0 = u * pf::kPanel, w = std::min(pf::kPanel, cols - c0);
          k.transpose_panel(x, rows, cols, c0, w, rht, buf.data(), ld);
          pp.x_row0 = c0;
          if (!k.pack_rows(pp, c0, c0 + w, s)) bad.store(true, std::memory_order_relaxed);
        }
      }
    }
    if (!bad.load()) return;
    // A non-finite value (in x or its RHT): the composition below throws the reference's error.
  }
  std::vector<float> t(static_cast<size_t>(n));
  hwy_common::transpose(x, rows, cols, t.data());
  if (rht) rht16_rows(t.data(), cols, rows);
  quantize_pack_fast(t.data(), cols, rows, spec, g, sr, q);
}

void dequantize_fast(const QTensor& t, float* out) {
  pf::dequantize_any("dequantize_fast", t, out, nullptr);
}

void dequantize_bf16_fast(const QTensor& t, uint16_t* out) {
  pf::dequantize_any("dequantize_bf16_fast", t, nullptr, out);
}

}  // namespace fp4
#endif  // HWY_ONCE
