// Quantized GEMM emulation: decoded (dequantize + FP32 sgemm) and probe-matched (the native
// FP4 GEMM's chunked arithmetic, bit-exact). Contract: docs/numerics.md "GEMM emulation";
// rules and exactness arguments restated in include/fp4/gemm/probe_gemm.h and docs/gemm.md.
//
// How the probe-matched result is computed exactly and fast
// ---------------------------------------------------------
// Lattice. An E2M1 value is q = n/2 with n ∈ {0, ±1, ±2, ±3, ±4, ±6, ±8, ±12}. Every block scale
// of the four contract formats has at most 4 significant bits: c = m·2^e with an integer
// m ∈ [8, 15] (frexp-normalised). So one operand value is q·c = n·m·2^(e−1) and one product is
// (n_a·n_b)·(m_a·m_b)·2^(e_a+e_b−2), an integer of at most 144·225 = 32400 < 2^15 times a power
// of two. (Spelled scale formats with up to 7 fraction bits are handled the same way with
// m < 2^8 and a correspondingly smaller span limit, below.)
//
// Segments. Along K, a *segment* is a maximal run of k inside one block of A, one block of B
// and one 64-chunk, so both scales are constant on it. Its contribution is
//     D_s · (c_a/2)·(c_b/2)   with   D_s = Σ_{k in s} n_a[k]·n_b[k]  (an exact int32 dot),
// |D_s| ≤ 144·64 < 2^14. D_s·(c_a/2)·(c_b/2) is exact in double (at most 14 + 8 significant
// bits, 14 + 16 with 8-bit scale mantissas).
//
// Chunk sum exact in double (fast path). Within a chunk, let u_s = e_a,s + e_b,s and
// span = max u_s − min u_s over segments whose operands are not all zero. Every term is an
// integer multiple of 2^(min u − 2) and the whole chunk is bounded by
//     Σ_k |n_a n_b m_a m_b| · 2^(max u − 2) ≤ 64·32400·2^span · 2^(min u − 2) < 2^(21 + span) units,
// so every partial sum, in any order, is an integer below 2^53 units when span ≤ 32: each double
// addition is exact, and the final conversion double → float is the single RNE rounding of the
// exact chunk sum. (Exponents stay far inside double's range: |u| ≤ 2·160.) In general the
// limit is 53 − bitlength(64·144·max m_a·max m_b), i.e. 32 for 4-bit scale mantissas. We bound
// span per output by span_A(row i, chunk) + span_B(row j, chunk) (exponent ranges of the
// nonzero segments, precomputed per row); the rare outputs where that bound exceeds the limit
// (block scales of one row 2^16 or more apart inside one 64-chunk, on both sides) are
// recomputed with an exact multi-word integer sum and explicit RNE
// (detail::round_exact_terms_rne, fp4/gemm/accumulator.h).
//
// Integer chunk sums (SIMD kernels, the common case). Write each scale as c = m·2^e and let
// emin be the least e over a chunk's nonzero segments of one row (per operand). Then a
// segment's term is D·(m_a·2^(e_a − emin_a))·(m_b·2^(e_b − emin_b))·2^(emin_a + emin_b − 2)
// = D·f_a·f_b·2^E, with the integer factors f precomputed per (row, segment) while packing
// (0 for an all-zero segment, whose D is 0). If span_A + span_B ≤ 15 − bitlength(mmax_a·mmax_b)
// (7 for 4-bit mantissas: 15·15·2^7 = 28800), then w = f_a·f_b < 2^15 is an exact int16
// product (vpmullw); |D| ≤ 144·64 < 2^15 so vpmaddwd forms D·w exactly in int32; and the chunk
// sum I = Σ D·w is bounded by 64·144·32767 < 2^29: exact in int32 in any order. The chunk's
// exact value is I·2^E, and its one RNE rounding to FP32 is vcvtdq2ps(I) (RNE to 24 bits)
// times 2^E, exact because 2^E is a normal float: each operand's emin is kept within ±62
// (kIntExpBand), so E + 127 ∈ [1, 249], and a nonzero |I|·2^E ≥ 2^-126 never reaches the
// subnormal range where a second rounding could differ. (An overflow gives ±Inf exactly
// where the correctly rounded sum does: IEEE decides overflow after rounding to 24 bits, and
// RNE24(I)·2^E ≥ 2^128 is that case; from there each kernel goes on as on the double path,
// the AVX2 kernel by its scalar fallback, the AVX-512 kernel through vaddps {rz-sae}.) For
// spelled scale formats with wider mantissas the limit shrinks: 5 for 5-bit mantissas on both
// sides, 3 for 8-bit against 4-bit, and −1 (never) for 8-bit on both. A tile takes this path for a chunk when all of its outputs allow it (the
// largest span over its rows and columns), else the double path below; in training about 86%
// of chunks take it (tiny config, ue5m3-b16-paper, 120 steps). The int16 multiplier holds w
// in both halves of a lane for the AVX2 kernel (whose int16 pair sums both need it) and in
// the low half, with 0 above, for the AVX-512 kernel (whose D is an int32 lane < 2^15).
//
// Accumulator. The chunk length (64 above), the rounding of the partials' additions (RTZ) and
// the snap (1/1024) are ProbeGemmOptions::accumulator's (fp4/gemm/accumulator.h): the portable
// kernel runs that component's accumulate_add and snap_to_grid, for any accumulator; the SIMD
// kernels implement the default one (chunk 64, RTZ, 1/1024), and the others run the portable
// kernel. The arguments below hold for any chunk ≤ 128 with 64 replaced by the chunk.
//
// Kernels. Portable: per output, int32 segment dots, double chunk sums, accumulate_add, snap.
// AVX-512 VNNI: B packed in panels of 32 columns as bytes n_b + 12 (unsigned), A's n_a as the
// broadcast signed bytes, vpdpbusd accumulating from −12·Σ n_a so that the result is D_s; per
// segment the 4×32 tile's D_s are accumulated as D_s·f_a·f_b in int32 (integer path) or
// converted to double and accumulated as D_s·(c_a/2)·(c_b/2);
// per chunk one RNE conversion to FP32 (vcvtdq2ps times 2^E on the integer path, vcvtpd2ps
// on the double path) and one RTZ addition. AVX2 (src/gemm/probe_gemm_avx2.cpp): the same panels,
// vpmaddubsw int16 pair sums per segment (no saturation, argued there), the same integer or
// double epilogues, RTZ from the RNE sum and its TwoSum error. Every step is exact or a
// single IEEE rounding, so all kernels give the same bits; tests compare each with an
// independent reference.
//
// RTZ accumulation. The AVX-512 kernel uses the hardware's FP32 addition with embedded
// round-toward-zero (vaddps {rz-sae}), which is IEEE RTZ by definition; the AVX2 kernel has
// no embedded rounding and corrects the RNE sum with its exact TwoSum error. The portable
// path uses the accumulator component's add_rtz: the double sum of two floats is NOT always exact (exponents
// further apart than 29 need more than 53 bits: 1 − 2^-60 rounds to 1 in double, whose
// truncation would be wrong), so it computes the TwoSum error term and corrects the
// truncation with it.
//
// Snap: 2^-10·RNE(2^10·x): exact in double (x·1024 exact, rint exact, /1024 exact, and the
// result fits FP32 since it is either x itself (|x| ≥ 2^13) or k·2^-10 with |k| < 2^23); the
// AVX-512 kernel uses vrndscaleps with 10 fraction bits and RNE, the same function, and the AVX2
// kernel vroundps(x·1024, RNE)·2^-10 for |x| < 2^13.
#include "fp4/base/cpu_isa.h"
#include "fp4/base/int_math.h"
#include "fp4/gemm/probe_gemm.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <array>
#include <bit>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "fp4/gemm/gemm.h"
#include "probe_gemm_impl.h"

namespace fp4 {

using namespace probe_impl;

namespace {
/// One operand's part of α = g_a·g_b / ((T_a·6)(T_b·6)): (g, fl(T·6)); (1, 1) where the
/// quantizer used ge = gd = 1 instead of (T·6)/g (the g = 0 guard and the MX scale rules).
struct AlphaPart {
  float num, den;
};
AlphaPart alpha_part(const QuantizedTensor& q) {
  if (q.spec.scale_rule != ScaleRule::TensorScaled || q.g == 0.0f) return {1.0f, 1.0f};
  return {q.g, q.spec.target * 6.0f};
}
}  // namespace

float probe_gemm_alpha(const QuantizedTensor& a, const QuantizedTensor& b, AlphaRule rule) {
  const AlphaPart pa = alpha_part(a), pb = alpha_part(b);
  const float num = pa.num * pb.num;  // fl(g_a·g_b)
  const float den = pa.den * pb.den;  // fl(fl(T_a·6)·fl(T_b·6))
  if (rule == AlphaRule::Reciprocal) return num * (1.0f / den);  // fl(num · fl(1/den))
  return num / den;
}

namespace {

/// Bound on span_A + span_B under which the chunk sum in double is exact (see file comment):
/// every chunk sum is < 2^(bitlength(64·144·max m_a·max m_b) + span) units and must stay ≤ 2^53.
int span_limit(int mmax_a, int mmax_b, int64_t chunk) {
  const int64_t bound = chunk * 144 * mmax_a * mmax_b;
  return 53 - (64 - std::countl_zero(static_cast<uint64_t>(bound)));
}
/// Bound on span_A + span_B under which the SIMD kernels' integer chunk path is exact: the
/// product of factors f_a·f_b ≤ mmax_a·mmax_b·2^span must stay below 2^15 (file comment).
int int_span_limit(int mmax_a, int mmax_b) {
  return 15 - (64 - std::countl_zero(static_cast<uint64_t>(mmax_a) * static_cast<uint64_t>(mmax_b)));
}

/// %.9g (std::to_string prints small scales as 0.000000).
std::string fmt_g(float x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(x));
  return buf;
}

/// Shapes, element format and tensor scales (codes are checked while packing).
void check_tensor(const char* name, const QuantizedTensor& q) {
  const std::string w = std::string("probe_gemm: operand ") + name;
  const int64_t B = q.spec.block;
  if (B <= 0) throw std::invalid_argument(w + ": block must be > 0, got " + std::to_string(B));
  if (q.rows < 0 || q.cols < 0 || q.codes.size() != static_cast<size_t>(q.rows * q.cols) ||
      q.scales.size() != static_cast<size_t>(q.block_rows * q.block_cols) ||
      q.block_cols != (q.cols + B - 1) / B ||
      q.block_rows != (q.spec.two_d ? (q.rows + B - 1) / B : q.rows)) {
    throw std::invalid_argument(w + ": inconsistent QuantizedTensor shapes (rows " +
                                std::to_string(q.rows) + ", cols " + std::to_string(q.cols) +
                                ", block grid " + std::to_string(q.block_rows) + "x" +
                                std::to_string(q.block_cols) + ")");
  }
  if (!q.spec.element.is_e2m1()) {
    throw std::invalid_argument(w + ": element format " + q.spec.element.name() +
                                " is not supported; the probe-matched GEMM models the native "
                                "E2M1 FP4 GEMM (use the decoded mode)");
  }
  if (!q.row_gd.empty()) {
    throw std::invalid_argument(w + ": a row-scaled operand (one reference per row) is not "
                                "supported; the probe-matched GEMM applies one alpha per operand "
                                "pair (docs/numerics.md \"Per-row reference\"; use the decoded mode)");
  }
  if (!(q.gd > 0.0f) || std::isinf(q.gd)) {
    throw std::invalid_argument(w + ": tensor decode scale gd must be finite and > 0, got " +
                                std::to_string(q.gd));
  }
  // α is computed from g and T (the contract's formula), the decoded values use gd: they must
  // agree, as quantize_blocks sets them (block_quant.h).
  if (q.spec.scale_rule == ScaleRule::TensorScaled) {
    const float T = q.spec.target;
    if (!(q.g >= 0.0f) || std::isinf(q.g) || !(T > 0.0f) || std::isinf(T)) {
      throw std::invalid_argument(w + ": tensor reference g = " + fmt_g(q.g) +
                                  " and target T = " + fmt_g(T) +
                                  " must be finite, g >= 0 and T > 0");
    }
    const float ge = q.g == 0.0f ? 1.0f : std::min((T * 6.0f) / q.g, FLT_MAX);
    if (q.ge != ge || q.gd != 1.0f / ge) {
      throw std::invalid_argument(
          w + ": tensor scales ge = " + fmt_g(q.ge) + ", gd = " + fmt_g(q.gd) +
          " do not follow from g = " + fmt_g(q.g) + " and T = " + fmt_g(T) +
          " (ge = (T·6)/g, 1 if g = 0, at most FLT_MAX; gd = 1/ge)");
    }
  } else if (q.ge != 1.0f || q.gd != 1.0f) {
    throw std::invalid_argument(w + ": the MX scale rules have no tensor scale (ge = gd = 1), " +
                                "got ge = " + fmt_g(q.ge) + ", gd = " + fmt_g(q.gd));
  }
}

Plan make_plan(int64_t K, int64_t block_a, int64_t block_b, const Accumulator& acc) {
  Plan p;
  p.K = K;
  p.acc = acc;
  const int64_t ch = acc.chunk;
  p.nchunk = (K + ch - 1) / ch;
  int64_t k = 0, p0 = 0;
  p.chunk_first.push_back(0);
  while (k < K) {
    const int64_t k1 = std::min({K, (k / block_a + 1) * block_a, (k / block_b + 1) * block_b,
                                 (k / ch + 1) * ch});
    Segment s{k, k1, p0, round_up(k1 - k, 4), {k / block_a, k / block_b}};
    p.contiguous &= s.p0 == s.k0;
    p.segs.push_back(s);
    p0 += s.plen;
    k = k1;
    if (k % ch == 0 || k == K) p.chunk_first.push_back(static_cast<int64_t>(p.segs.size()));
  }
  p.Kp = p0;
  for (int64_t i = 0; i < static_cast<int64_t>(p.segs.size()); ++i) {
    const Segment& sg = p.segs[static_cast<size_t>(i)];
    p.groups16 &= sg.p0 % 16 == 0 && sg.plen % 16 == 0;
    for (int w = 0; w < 2; ++w) p.bcol_is_s[w] &= sg.bc[w] == i;
  }
  p.nseg = static_cast<int64_t>(p.segs.size());
  return p;
}

/// c = mant·2^ex exactly (mant < 2^24) for a finite c > 0; returns false otherwise.
inline bool split_scale(float c, uint32_t& mant, int& ex) {
  const uint32_t bits = std::bit_cast<uint32_t>(c);
  const uint32_t field = bits >> 23;  // sign bit included: negative values fail here
  if (!(c > 0.0f) || field >= 255) return false;
  mant = field ? ((bits & 0x7FFFFFu) | 0x800000u) : (bits & 0x7FFFFFu);
  ex = field ? static_cast<int>(field) - 150 : -149;
  return true;
}

/// Fraction bits block scale c needs (0 for powers of two, 3 for the contract's formats), or
/// 99 if c is not finite and > 0.
inline int scale_frac_bits(float c) {
  uint32_t mant = 0;
  int ex = 0;
  if (!split_scale(c, mant, ex)) return 99;
  return 31 - std::countl_zero(mant) - std::countr_zero(mant);
}

/// Size P's buffers (reusing their capacity) and zero the padding rows; rows < `rows` are
/// written completely by pack_row.
void init_packed(Packed& P, const Plan& pl, int64_t rows, int64_t rows_alloc, int F) {
  P.rows = rows;
  P.mmax = (2 << F) - 1;  // m < 2^(F+1)
  P.n.resize(static_cast<size_t>(rows_alloc * pl.Kp));
  P.hs.resize(static_cast<size_t>(rows_alloc * pl.nseg));
  P.corr.resize(static_cast<size_t>(rows_alloc * pl.nseg));
  std::fill(P.n.begin() + rows * pl.Kp, P.n.end(), int8_t{0});
  std::fill(P.hs.begin() + rows * pl.nseg, P.hs.end(), 0.0);
  std::fill(P.corr.begin() + rows * pl.nseg, P.corr.end(), 0);
  P.man.resize(static_cast<size_t>(rows * pl.nseg));
  P.ex.resize(static_cast<size_t>(rows * pl.nseg));
  P.span.resize(static_cast<size_t>(rows * pl.nchunk));
  P.fac.resize(static_cast<size_t>(rows_alloc * pl.nseg));
  P.emin.resize(static_cast<size_t>(rows_alloc * pl.nchunk));
  P.ispan.resize(static_cast<size_t>(rows_alloc * pl.nchunk));
  std::fill(P.fac.begin() + rows * pl.nseg, P.fac.end(), int16_t{0});
  std::fill(P.emin.begin() + rows * pl.nchunk, P.emin.end(), int16_t{0});
  std::fill(P.ispan.begin() + rows * pl.nchunk, P.ispan.end(), int16_t{0});
}

/// Σ n[0..len) and whether any is nonzero: 8 bytes at a time, each biased to n + 12 ∈ [0, 24]
/// so that one multiply sums the 8 bytes of a word (≤ 192) without carries between bytes.
inline void seg_stats(const int8_t* n, int64_t len, int32_t& sum, bool& nz) {
  uint64_t any = 0;
  int32_t s = 0;
  int64_t k = 0;
  for (; k + 8 <= len; k += 8) {
    uint64_t w;
    std::memcpy(&w, n + k, 8);
    any |= w;
    w = ((w & 0x7F7F7F7F7F7F7F7Full) + 0x0C0C0C0C0C0C0C0Cull) ^ (w & 0x8080808080808080ull);
    s += static_cast<int32_t>((w * 0x0101010101010101ull) >> 56) - 8 * kNOffset;
  }
  for (; k < len; ++k) {
    any |= static_cast<uint8_t>(n[k]);
    s += n[k];
  }
  sum = s;
  nz = any != 0;
}

}  // namespace

namespace probe_impl {

/// n[k] = 2·e2m1_decode(codes[k] & 15) for k < K; returns the OR of all codes (> 15 iff a
/// code is out of range).
unsigned convert_codes(const uint8_t* codes, int8_t* n, int64_t K) {
  unsigned all = 0;
  for (int64_t k = 0; k < K; ++k) {
    all |= codes[k];
    n[k] = kTwiceE2M1[codes[k] & 15];
  }
  return all;
}
}  // namespace probe_impl

namespace {

#if defined(__x86_64__) && defined(__GNUC__)
// GCC 12's AVX-512 intrinsics pass _mm512_undefined_*() (a self-initialised variable) as the
// merge source of unmasked operations, which -Wuninitialized flags once inlined (here and in
// simd_tile below).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
/// convert_codes with a 64-byte table shuffle (vpshufb); same results.
__attribute__((target("avx512f,avx512bw"))) unsigned convert_codes_avx512(const uint8_t* codes,
                                                                         int8_t* n, int64_t K) {
  const __m512i table = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kTwiceE2M1)));
  const __m512i low = _mm512_set1_epi8(15);
  __m512i all = _mm512_setzero_si512();
  int64_t k = 0;
  for (; k + 64 <= K; k += 64) {
    const __m512i c = _mm512_loadu_si512(codes + k);
    all = _mm512_or_si512(all, c);
    _mm512_storeu_si512(n + k, _mm512_shuffle_epi8(table, _mm512_and_si512(c, low)));
  }
  const __m512i hi = _mm512_andnot_si512(low, all);  // any bit above the low 4
  return (_mm512_test_epi8_mask(hi, hi) ? 16u : 0u) | convert_codes(codes + k, n + k, K - k);
}
#pragma GCC diagnostic pop
#endif

/// Problems pack_row reports (OR-ed over rows; the caller throws or retries after packing).
enum PackFlags : unsigned { kBadCode = 1, kBadScale = 2, kWiderScale = 4 };

/// The kernel a call runs (ProbeKernel with Auto resolved).
enum class Impl { Portable, Avx512, Avx2, Avx512Emu };

/// Stage 1 of pack_row: n = 2q for row `codes` in the packed layout (zero padding), converted
/// with the vector width of `impl` (every width gives the same bytes). Returns the OR of the
/// codes (> 15 iff one is out of range).
unsigned convert_row(const uint8_t* codes, const Plan& pl, int8_t* n, Impl impl) {
  const int64_t K = pl.K;
  unsigned all = 0;
  if (pl.contiguous) {
#if defined(__x86_64__) && defined(__GNUC__)
    all = impl == Impl::Avx512 ? convert_codes_avx512(codes, n, K)
          : impl == Impl::Avx2 ? convert_codes_avx2(codes, n, K)
                               : convert_codes(codes, n, K);
#else
    (void)impl;
    all = convert_codes(codes, n, K);
#endif
    std::fill(n + K, n + pl.Kp, int8_t{0});
    return all;
  }
  for (const Segment& sg : pl.segs) {
    for (int64_t k = sg.k0; k < sg.k1; ++k) {
      all |= codes[k];
      n[sg.p0 + (k - sg.k0)] = kTwiceE2M1[codes[k] & 15];
    }
    std::fill(n + sg.p0 + (sg.k1 - sg.k0), n + sg.p0 + sg.plen, int8_t{0});
  }
  return all;
}

/// One row's per-segment outputs (pointers into Packed at the row; nz is scratch).
struct RowOut {
  double* hs;
  int32_t* corr;
  uint8_t* man;
  int16_t* ex;
  uint8_t* nz;
};

/// Stage 2a: the correction −12·Σ n and whether any n is nonzero, per segment. Where every
/// segment starts and ends on a multiple of 16 (Plan::groups16: blocks of 16, 32, ...), each
/// 16 bytes are summed with SSE2 (part of every x86-64 CPU): psadbw of the bytes n + 12 ∈
/// [0, 24] adds each half exactly (≤ 192), and Σ n = that − 16·12. Same values as seg_stats.
void segment_sums(const Plan& pl, const int8_t* n, const RowOut& o) {
#if defined(__SSE2__)
  if (pl.groups16) {
    const __m128i bias = _mm_set1_epi8(kNOffset), zero = _mm_setzero_si128();
    for (int64_t s = 0; s < pl.nseg; ++s) {
      const Segment& sg = pl.segs[static_cast<size_t>(s)];
      __m128i sum = zero, any = zero;
      for (int64_t p = sg.p0; p < sg.p0 + sg.plen; p += 16) {
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(n + p));
        any = _mm_or_si128(any, v);
        sum = _mm_add_epi64(sum, _mm_sad_epu8(_mm_add_epi8(v, bias), zero));
      }
      const int32_t biased = _mm_cvtsi128_si32(sum) +
                             _mm_cvtsi128_si32(_mm_unpackhi_epi64(sum, sum));
      o.corr[s] = -kNOffset * (biased - kNOffset * static_cast<int32_t>(sg.plen));
      o.nz[s] = _mm_movemask_epi8(_mm_cmpeq_epi8(any, zero)) != 0xFFFF;
    }
    return;
  }
#endif
  for (int64_t s = 0; s < pl.nseg; ++s) {
    const Segment& sg = pl.segs[static_cast<size_t>(s)];
    int32_t sum;
    bool nz;
    seg_stats(n + sg.p0, sg.plen, sum, nz);
    o.corr[s] = -kNOffset * sum;
    o.nz[s] = nz;
  }
}

/// Stage 2b, the reference: each segment's block scale c = mant·2^ex = m·2^e with
/// m = mant·2^-sh ∈ [2^F, 2^(F+1)), for any c (FP32 subnormals included); c/2 in double.
/// Returns kBadScale (c not finite and > 0; m, e then follow from c = 8) and kWiderScale (c
/// needs more than F fraction bits).
unsigned split_scales_each(const Plan& pl, const float* scales, int which, int F, const RowOut& o) {
  unsigned flags = 0;
  for (int64_t s = 0; s < pl.nseg; ++s) {
    const float cb = scales[pl.segs[static_cast<size_t>(s)].bc[which]];
    uint32_t mant = 8;
    int ex = 0;
    if (!split_scale(cb, mant, ex)) {
      flags |= kBadScale;
      mant = 8;
    }
    const int top = 31 - std::countl_zero(mant), sh = top - F;
    if (top - std::countr_zero(mant) > F) flags |= kWiderScale;
    o.hs[s] = static_cast<double>(cb) * 0.5;
    o.man[s] = static_cast<uint8_t>(sh >= 0 ? mant >> sh : mant << -sh);
    o.ex[s] = static_cast<int16_t>(ex + sh);
  }
  return flags;
}

/// Stage 2b for the SIMD kernels: split_scales_each's results when every scale of the row is a
/// normal positive FP32 (exponent field 1..254, sign 0), with no branch per segment: then
/// mant = 2^23 + fraction, top = 23 and sh = 23 − F ≥ 16, so m = 2^F + (fraction >> sh),
/// e = field − 150 + sh = field − 127 − F, and c needs more than F fraction bits iff one of
/// the fraction's low sh bits is set. A row with any other scale (an FP32 subnormal, or one
/// that pack_row reports) goes through split_scales_each.
unsigned split_scales_normal(const Plan& pl, const float* scales, int which, int F,
                             const RowOut& o) {
  // The row's scales in segment order (no copy where segment s is block column s).
  thread_local std::vector<float> gathered;
  const float* cs = scales;
  if (!pl.bcol_is_s[which]) {
    gathered.resize(static_cast<size_t>(pl.nseg));
    for (int64_t s = 0; s < pl.nseg; ++s)
      gathered[static_cast<size_t>(s)] = scales[pl.segs[static_cast<size_t>(s)].bc[which]];
    cs = gathered.data();
  }
  const int sh = 23 - F;
  const uint32_t low = (uint32_t{1} << sh) - 1, fmask = (uint32_t{1} << F) - 1;
  uint32_t odd = 0, wide = 0;
  double* __restrict hs = o.hs;
  uint8_t* __restrict man = o.man;
  int16_t* __restrict ex = o.ex;
#pragma omp simd reduction(| : odd, wide)
  for (int64_t s = 0; s < pl.nseg; ++s) {
    const uint32_t bits = std::bit_cast<uint32_t>(cs[s]), field = bits >> 23;  // sign included
    odd |= static_cast<uint32_t>(field - 1 >= 254u);
    wide |= bits & low;
    hs[s] = static_cast<double>(cs[s]) * 0.5;
    man[s] = static_cast<uint8_t>(((bits >> sh) & fmask) | (fmask + 1));
    ex[s] = static_cast<int16_t>(static_cast<int>(field) - 127 - F);
  }
  if (odd) return split_scales_each(pl, scales, which, F, o);
  return wide ? kWiderScale : 0u;
}

/// Stage 3: per chunk, the span of e over its nonzero segments and, for the SIMD kernels'
/// integer chunk path, emin, ispan and the factors f = m·2^(e − emin) (0 for an all-zero
/// segment; file comment).
void chunk_spans(const Plan& pl, int64_t r, const RowOut& o, Packed& P, bool simd) {
  const int64_t ns = pl.nseg, nc = pl.nchunk;
  int16_t* fac = P.fac.data() + r * ns;
  for (int64_t c = 0; c < nc; ++c) {
    const int64_t s0 = pl.chunk_first[static_cast<size_t>(c)],
                  s1 = pl.chunk_first[static_cast<size_t>(c + 1)];
    int lo = INT_MAX, hi = INT_MIN;
    for (int64_t s = s0; s < s1; ++s) {  // over the nonzero segments only
      lo = std::min(lo, o.nz[s] ? static_cast<int>(o.ex[s]) : INT_MAX);
      hi = std::max(hi, o.nz[s] ? static_cast<int>(o.ex[s]) : INT_MIN);
    }
    const int span = hi >= lo ? hi - lo : 0, emin = hi >= lo ? lo : 0;
    const size_t oc = static_cast<size_t>(r * nc + c);
    P.span[oc] = static_cast<int16_t>(span);
    if (!simd) continue;  // the portable kernel has no integer path
    const bool int_ok = span <= kIntMaxSpan && emin >= -kIntExpBand && emin <= kIntExpBand;
    P.ispan[oc] = int_ok ? static_cast<int16_t>(span) : kNoIntPath;
    P.emin[oc] = static_cast<int16_t>(int_ok ? emin : 0);
    for (int64_t s = s0; s < s1; ++s)
      fac[s] = int_ok && o.nz[s] ? static_cast<int16_t>(o.man[s] << (o.ex[s] - emin)) : int16_t{0};
  }
}

/// Pack row r of q (operand `which`: 0 = A, 1 = B) with scale mantissas m ∈ [2^F, 2^(F+1)):
/// n = 2q per element, and per (row, segment) c/2, the correction, m and e, per (row, chunk)
/// the span and, for the SIMD kernels' integer chunk path, the factors f, emin and ispan (file
/// comment). The portable kernel, the SIMD kernels' scalar twin, splits the scales one segment
/// at a time (split_scales_each); the SIMD kernels take split_scales_normal, which gives the
/// same values. Returns PackFlags: a code > 15 (the row is then packed from the low 4 bits), a
/// scale that is not finite and > 0, or one needing more than F fraction bits (then m is not
/// exact).
unsigned pack_row(const QuantizedTensor& q, const Plan& pl, int which, int F, int64_t r, Packed& P,
                  Impl impl) {
  const int64_t ns = pl.nseg;
  // 1. n = 2q: [Kp] bytes.
  int8_t* n = P.n.data() + r * pl.Kp;
  const unsigned all = convert_row(q.codes.data() + r * q.cols, pl, n, impl);
  // 2. Per segment [nseg]: −12·Σ n, nonzero, c/2, m, e.
  thread_local std::vector<uint8_t> nz;
  nz.resize(static_cast<size_t>(ns));
  const RowOut o{P.hs.data() + r * ns, P.corr.data() + r * ns, P.man.data() + r * ns,
                 P.ex.data() + r * ns, nz.data()};
  segment_sums(pl, n, o);
  const int64_t br = q.spec.two_d ? r / q.spec.block : r;
  const float* scales = q.scales.data() + br * q.block_cols;
  const unsigned split = impl == Impl::Portable ? split_scales_each(pl, scales, which, F, o)
                                                : split_scales_normal(pl, scales, which, F, o);
  // 3. Per chunk [nchunk]: span; the integer path's emin, ispan and f [nseg].
  chunk_spans(pl, r, o, P, impl != Impl::Portable);
  return (all > 15 ? kBadCode : 0u) | split;
}

int max_span_of(const Packed& P) {
  int m = 0;
  for (int16_t s : P.span) m = std::max(m, static_cast<int>(s));
  return m;
}

[[noreturn]] void throw_bad_scale(const char* name, const QuantizedTensor& q) {
  size_t b = 0;
  while (b + 1 < q.scales.size() && scale_frac_bits(q.scales[b]) <= 7) ++b;
  throw std::invalid_argument(std::string("probe_gemm: operand ") + name + ": block scale " +
                              std::to_string(b) + " = " + std::to_string(q.scales[b]) +
                              " must be finite, > 0 and have at most 8 significant bits");
}

/// Largest number of fraction bits any block scale of q needs (> 7: unsupported).
int max_scale_frac_bits(const QuantizedTensor& q) {
  int f = 0;
  for (float c : q.scales) f = std::max(f, scale_frac_bits(c));
  return f;
}

[[noreturn]] void throw_bad_code(const char* name, const QuantizedTensor& q) {
  size_t i = 0;
  while (i < q.codes.size() && q.codes[i] <= 15) ++i;
  throw std::invalid_argument(std::string("probe_gemm: operand ") + name + ": E2M1 code " +
                              std::to_string(i < q.codes.size() ? q.codes[i] : 0) +
                              " at element " + std::to_string(i) + " is not in 0..15");
}

// ---- exact scalar building blocks -------------------------------------------------------

/// RTZ addition of FP32 values: the accumulator component's (fp4/gemm/accumulator.h).
inline float add_rtz(float a, float b) { return accumulate_add(a, b, AccumRounding::Rtz); }
/// The default snap, 2^-10·RNE(2^10·x): the accumulator component's snap_to_grid.
inline float snap1024(float x) { return snap_to_grid(x, 1 << kProbeSnapBits); }
/// The accumulator's snap of acc, then times α (RNE).
inline float finish(float acc, float alpha, int snap) { return snap_to_grid(acc, snap) * alpha; }

inline int32_t dot_i8(const int8_t* a, const int8_t* b, int64_t n) {
  int32_t s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t k = 0; k < n; ++k) s += static_cast<int32_t>(a[k]) * static_cast<int32_t>(b[k]);
  return s;
}

}  // namespace

namespace probe_impl {

/// One output with the portable scalar path; exact double chunk sums when the span bound
/// allows, the multi-word sum otherwise.
float probe_output(const Plan& pl, const Packed& A, int64_t i, const Packed& B, int64_t j,
                   float alpha, int limit) {
  const int64_t Kp = pl.Kp, ns = pl.nseg, nc = pl.nchunk;
  const int8_t* na = A.n.data() + i * Kp;
  const int8_t* nb = B.n.data() + j * Kp;
  float acc = 0.0f;
  detail::ExactTerm terms[kProbeMaxChunk];  // a chunk has at most `chunk` segments
  for (int64_t c = 0; c < nc; ++c) {
    const bool in_double =
        A.span[static_cast<size_t>(i * nc + c)] + B.span[static_cast<size_t>(j * nc + c)] <= limit;
    double sum = 0.0;
    int nt = 0;
    for (int64_t s = pl.chunk_first[c]; s < pl.chunk_first[c + 1]; ++s) {
      const Segment& sg = pl.segs[static_cast<size_t>(s)];
      const int32_t D = dot_i8(na + sg.p0, nb + sg.p0, sg.plen);
      const size_t oa = static_cast<size_t>(i * ns + s), ob = static_cast<size_t>(j * ns + s);
      if (in_double) {
        sum += static_cast<double>(D) * (A.hs[oa] * B.hs[ob]);
      } else if (D != 0) {
        terms[nt++] = {static_cast<int64_t>(D) * A.man[oa] * B.man[ob], A.ex[oa] + B.ex[ob] - 2};
      }
    }
    const float chunk = in_double ? static_cast<float>(sum) : detail::round_exact_terms_rne(terms, nt);
    acc = accumulate_add(acc, chunk, pl.acc.rounding);
  }
  return finish(acc, alpha, pl.acc.snap);
}

}  // namespace probe_impl

namespace {

bool needs_fixup(const Plan& pl, const Packed& A, int64_t i, const Packed& B, int64_t j,
                 int limit) {
  const int64_t nc = pl.nchunk;
  for (int64_t c = 0; c < nc; ++c) {
    if (A.span[static_cast<size_t>(i * nc + c)] + B.span[static_cast<size_t>(j * nc + c)] > limit)
      return true;
  }
  return false;
}

// ---- the SIMD kernels' B panels -----------------------------------------------------------

/// Column j of B into its panel (bytes n_b + 12, c_b/2, the integer path's f_b and emin_b);
/// `pairs`: f_b in both int16 halves of its lane (the AVX2 kernel) rather than the low one.
void pack_panel_row(const Plan& pl, const Packed& B, int64_t j, Panels& P, bool pairs) {
  const int64_t Kp = pl.Kp, ns = pl.nseg, p = j / kNR, jj = j % kNR;
  const int8_t* n = B.n.data() + j * Kp;
  uint8_t* dst = P.bytes.data() + p * Kp * kNR + jj * 4;
  // Four bytes at a time: bytewise (x + 12) mod 256 without carries between bytes.
  for (int64_t kg = 0; kg < Kp / 4; ++kg) {
    uint32_t w;
    std::memcpy(&w, n + kg * 4, 4);
    w = ((w & 0x7F7F7F7Fu) + 0x01010101u * kNOffset) ^ (w & 0x80808080u);
    std::memcpy(dst + kg * (kNR * 4), &w, 4);
  }
  for (int64_t s = 0; s < ns; ++s) {
    const size_t o = static_cast<size_t>((p * ns + s) * kNR + jj);
    P.hs[o] = B.hs[static_cast<size_t>(j * ns + s)];
    const uint32_t f = static_cast<uint16_t>(B.fac[static_cast<size_t>(j * ns + s)]);
    P.fb[o] = static_cast<int32_t>(pairs ? f | (f << 16) : f);
  }
  const int64_t nc = pl.nchunk;
  for (int64_t c = 0; c < nc; ++c)
    P.eb[static_cast<size_t>((p * nc + c) * kNR + jj)] = B.emin[static_cast<size_t>(j * nc + c)] + kIntExpBias;
}

/// After the columns [j0, j1) of panel p are packed: the largest ispan of each 16-column half
/// per chunk (halves without real columns: 0).
void finish_panel(const Plan& pl, const Packed& B, int64_t p, int64_t j0, int64_t j1, Panels& P) {
  const int64_t nc = pl.nchunk;
  for (int64_t c = 0; c < nc; ++c)
    for (int h = 0; h < 2; ++h) {
      int16_t m = 0;
      for (int64_t j = std::max(j0, p * kNR + 16 * h); j < std::min(j1, p * kNR + 16 * h + 16); ++j)
        m = std::max(m, B.ispan[static_cast<size_t>(j * nc + c)]);
      P.hspan[static_cast<size_t>((p * nc + c) * 2 + h)] = m;
    }
}

// ---- AVX-512 VNNI kernel ----------------------------------------------------------------

#if defined(__x86_64__) && defined(__GNUC__)
#define FP4_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))

// See convert_codes_avx512 for why these warnings are off.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace avx512 {
// The instructions of the AVX-512 VNNI tile kernel (probe_tile_avx512.inc), as thin wrappers.
using VI = __m512i;  // 16 × int32 (or 64 bytes)
using VD = __m512d;  // 8 × double
using VF = __m512;   // 16 × float

/// acc += Σ_{4 bytes} u8(b)·s8(a) per 32-bit lane, in place (the intrinsic's copy-in/copy-out
/// of the accumulator makes GCC 12 emit a register move per instruction).
FP4_AVX512 inline void dpbusd(VI& acc, VI b_u8, VI a_s8) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(b_u8), "v"(a_s8));
}
/// The 4 bytes at p broadcast to every 32-bit lane.
FP4_AVX512 inline VI bcast4(const int8_t* p) {
  int32_t a4;
  std::memcpy(&a4, p, 4);
  return _mm512_set1_epi32(a4);
}
FP4_AVX512 inline VI set1_epi32(int32_t x) { return _mm512_set1_epi32(x); }
FP4_AVX512 inline VI loadu_si512(const uint8_t* p) { return _mm512_loadu_si512(p); }
FP4_AVX512 inline VD setzero_pd() { return _mm512_setzero_pd(); }
FP4_AVX512 inline VD loadu_pd(const double* p) { return _mm512_loadu_pd(p); }
FP4_AVX512 inline VD set1_pd(double x) { return _mm512_set1_pd(x); }
/// int32 lanes 0..7 / 8..15 of d as doubles (exact).
FP4_AVX512 inline VD cvt_lo_pd(VI d) { return _mm512_cvtepi32_pd(_mm512_castsi512_si256(d)); }
FP4_AVX512 inline VD cvt_hi_pd(VI d) { return _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(d, 1)); }
FP4_AVX512 inline VD fmadd_pd(VD a, VD b, VD c) { return _mm512_fmadd_pd(a, b, c); }
FP4_AVX512 inline VD mul_pd(VD a, VD b) { return _mm512_mul_pd(a, b); }
/// lo (lanes 0..7) and hi (lanes 8..15) rounded to FP32 (RNE).
FP4_AVX512 inline VF cvt_rne_ps(VD lo, VD hi) {
  const __m256 l = _mm512_cvt_roundpd_ps(lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 h = _mm512_cvt_roundpd_ps(hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm512_insertf32x8(_mm512_castps256_ps512(l), h, 1);
}
/// Each int16 half of every 32-bit lane set to x.
FP4_AVX512 inline VI set1_epi16(int16_t x) { return _mm512_set1_epi16(x); }
/// Low 16 bits of the product of each int16 pair.
FP4_AVX512 inline VI mullo_epi16(VI a, VI b) { return _mm512_mullo_epi16(a, b); }
/// Per 32-bit lane: a.lo·b.lo + a.hi·b.hi of its signed int16 halves (vpmaddwd).
FP4_AVX512 inline VI madd_epi16(VI a, VI b) { return _mm512_madd_epi16(a, b); }
FP4_AVX512 inline VI add_epi32(VI a, VI b) { return _mm512_add_epi32(a, b); }
FP4_AVX512 inline VI loadu_epi32(const int32_t* p) { return _mm512_loadu_si512(p); }
/// int32 → FP32, RNE (vcvtdq2ps {rn-sae}).
FP4_AVX512 inline VF cvt_ps(VI x) {
  return _mm512_cvt_roundepi32_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
/// 2^(e − 127) per lane for a biased exponent e ∈ [1, 254].
FP4_AVX512 inline VF pow2_ps(VI e) { return _mm512_castsi512_ps(_mm512_slli_epi32(e, 23)); }
FP4_AVX512 inline VF load_ps(const float* p) { return _mm512_load_ps(p); }
FP4_AVX512 inline void store_ps(float* p, VF v) { _mm512_store_ps(p, v); }
/// a + b rounded toward zero (vaddps {rz-sae}: IEEE RTZ).
FP4_AVX512 inline VF add_rtz_ps(VF a, VF b) {
  return _mm512_add_round_ps(a, b, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
}
FP4_AVX512 inline VF set1_ps(float x) { return _mm512_set1_ps(x); }
/// 2^-10·RNE(2^10·x) per lane: vrndscaleps imm bits 7:4 = 10 fraction bits kept, bit 3 =
/// suppress precision, 1:0 = RNE.
FP4_AVX512 inline VF snap_ps(VF x) { return _mm512_roundscale_ps(x, (kProbeSnapBits << 4) | 0x08); }
FP4_AVX512 inline VF mul_rne_ps(VF a, VF b) {
  return _mm512_mul_round_ps(a, b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
/// Lanes 0..n − 1 of v to p (n ≤ 16).
FP4_AVX512 inline void store_first(float* p, int64_t n, VF v) {
  _mm512_mask_storeu_ps(p, static_cast<__mmask16>((uint32_t{1} << n) - 1), v);
}
#define FP4_TILE_ATTR FP4_AVX512
#include "probe_tile_avx512.inc"
#undef FP4_TILE_ATTR
}  // namespace avx512

#pragma GCC diagnostic pop

namespace avx512_emu {
// The same instructions emulated lane by lane in portable C++ (baseline x86-64), each giving
// the instruction's result by its definition in the Intel SDM: integer ops exactly, double
// fma correctly rounded (std::fma), double → float and float · float in the default RNE mode,
// the RTZ addition by add_rtz (exact, see there), the snap by finish's exact double rounding.
// So simd_tile here is the AVX-512 kernel's code (blocking, loop order, epilogues) on any CPU.
struct VI {
  int32_t v[16];
};
struct VD {
  double v[8];
};
struct VF {
  float v[16];
};
inline void dpbusd(VI& acc, VI b_u8, VI a_s8) {
  uint8_t b[64];
  int8_t a[64];
  std::memcpy(b, b_u8.v, 64);
  std::memcpy(a, a_s8.v, 64);
  for (int l = 0; l < 16; ++l) {
    uint32_t s = static_cast<uint32_t>(acc.v[l]);  // wrap-around int32 sum, as vpdpbusd
    for (int j = 0; j < 4; ++j)
      s += static_cast<uint32_t>(int32_t{b[4 * l + j]} * int32_t{a[4 * l + j]});
    acc.v[l] = static_cast<int32_t>(s);
  }
}
inline VI set1_epi32(int32_t x) {
  VI r;
  for (int32_t& e : r.v) e = x;
  return r;
}
inline VI bcast4(const int8_t* p) {
  int32_t a4;
  std::memcpy(&a4, p, 4);
  return set1_epi32(a4);
}
inline VI loadu_si512(const uint8_t* p) {
  VI r;
  std::memcpy(r.v, p, 64);
  return r;
}
inline VD setzero_pd() { return VD{}; }
inline VD loadu_pd(const double* p) {
  VD r;
  std::memcpy(r.v, p, 64);
  return r;
}
inline VD set1_pd(double x) {
  VD r;
  for (double& e : r.v) e = x;
  return r;
}
inline VD cvt_lo_pd(VI d) {
  VD r;
  for (int l = 0; l < 8; ++l) r.v[l] = d.v[l];
  return r;
}
inline VD cvt_hi_pd(VI d) {
  VD r;
  for (int l = 0; l < 8; ++l) r.v[l] = d.v[8 + l];
  return r;
}
inline VD fmadd_pd(VD a, VD b, VD c) {
  for (int l = 0; l < 8; ++l) c.v[l] = std::fma(a.v[l], b.v[l], c.v[l]);
  return c;
}
inline VD mul_pd(VD a, VD b) {
  for (int l = 0; l < 8; ++l) a.v[l] *= b.v[l];
  return a;
}
inline VF cvt_rne_ps(VD lo, VD hi) {
  VF r;
  for (int l = 0; l < 8; ++l) r.v[l] = static_cast<float>(lo.v[l]);
  for (int l = 0; l < 8; ++l) r.v[8 + l] = static_cast<float>(hi.v[l]);
  return r;
}
inline VI set1_epi16(int16_t x) {
  const uint16_t u = static_cast<uint16_t>(x);
  return set1_epi32(static_cast<int32_t>(uint32_t{u} | (uint32_t{u} << 16)));
}
/// int16 half h (0 = low) of a 32-bit lane, signed.
inline int32_t half16(int32_t lane, int h) {
  return static_cast<int16_t>(static_cast<uint16_t>(static_cast<uint32_t>(lane) >> (16 * h)));
}
inline VI mullo_epi16(VI a, VI b) {
  for (int l = 0; l < 16; ++l) {
    const uint32_t lo = static_cast<uint16_t>(half16(a.v[l], 0) * half16(b.v[l], 0));
    const uint32_t hi = static_cast<uint16_t>(half16(a.v[l], 1) * half16(b.v[l], 1));
    a.v[l] = static_cast<int32_t>(lo | (hi << 16));
  }
  return a;
}
inline VI madd_epi16(VI a, VI b) {
  for (int l = 0; l < 16; ++l) {  // two exact int32 products, wrap-around sum as vpmaddwd
    const uint32_t s = static_cast<uint32_t>(half16(a.v[l], 0) * half16(b.v[l], 0)) +
                       static_cast<uint32_t>(half16(a.v[l], 1) * half16(b.v[l], 1));
    a.v[l] = static_cast<int32_t>(s);
  }
  return a;
}
inline VI add_epi32(VI a, VI b) {
  for (int l = 0; l < 16; ++l)
    a.v[l] = static_cast<int32_t>(static_cast<uint32_t>(a.v[l]) + static_cast<uint32_t>(b.v[l]));
  return a;
}
inline VI loadu_epi32(const int32_t* p) {
  VI r;
  std::memcpy(r.v, p, 64);
  return r;
}
inline VF cvt_ps(VI x) {
  VF r;
  for (int l = 0; l < 16; ++l) r.v[l] = static_cast<float>(x.v[l]);
  return r;
}
inline VF pow2_ps(VI e) {
  VF r;
  for (int l = 0; l < 16; ++l) r.v[l] = std::bit_cast<float>(static_cast<uint32_t>(e.v[l]) << 23);
  return r;
}
inline VF load_ps(const float* p) {
  VF r;
  std::memcpy(r.v, p, 64);
  return r;
}
inline void store_ps(float* p, VF v) { std::memcpy(p, v.v, 64); }
inline VF add_rtz_ps(VF a, VF b) {
  for (int l = 0; l < 16; ++l) a.v[l] = add_rtz(a.v[l], b.v[l]);
  return a;
}
inline VF set1_ps(float x) {
  VF r;
  for (float& e : r.v) e = x;
  return r;
}
inline VF snap_ps(VF x) {
  static_assert(kProbeSnapBits == 10, "snap_ps emulates 10 fraction bits");
  for (float& e : x.v) e = snap1024(e);
  return x;
}
inline VF mul_rne_ps(VF a, VF b) {
  for (int l = 0; l < 16; ++l) a.v[l] *= b.v[l];
  return a;
}
inline void store_first(float* p, int64_t n, VF v) { std::memcpy(p, v.v, sizeof(float) * n); }
#define FP4_TILE_ATTR
#include "probe_tile_avx512.inc"
#undef FP4_TILE_ATTR
}  // namespace avx512_emu

bool cpu_has_avx512_vnni() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512vnni");
}
#else
bool cpu_has_avx512_vnni() { return false; }
namespace avx512 {
void simd_tile(const Plan&, const Packed&, const Panels&, int64_t, int64_t, float, float*,
               int64_t, int64_t, int64_t) {
  throw std::logic_error("probe_gemm: the AVX-512 VNNI kernel is not built for this target");
}
}  // namespace avx512
namespace avx512_emu {
using avx512::simd_tile;
}  // namespace avx512_emu
#endif

struct Workspace {
  Packed a, b;
  Panels panels;
};

/// Pack-once claim: 0 = not packed, 1 = being packed, 2 = ready. The first task to need a
/// row group of A or a panel of B packs it; others wait (yielding) until it is ready. This
/// replaces a barrier between packing and computing, so a thread descheduled on a busy
/// machine holds up the others only if it is descheduled while packing.
template <class Pack>
void ensure_packed(std::atomic<int>& state, const Pack& pack) {
  if (state.load(std::memory_order_acquire) == 2) return;
  int expected = 0;
  if (state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
    pack();
    state.store(2, std::memory_order_release);
    return;
  }
  while (state.load(std::memory_order_acquire) != 2) std::this_thread::yield();
}

/// Rows of A per row group (a multiple of kMR): the unit of A packing and of scheduling.
constexpr int64_t kGroupRows = 64;

}  // namespace

bool probe_gemm_avx512_available() {
  static const bool ok = cpu_has_avx512_vnni() && cpu_isa_allowed(CpuIsa::Avx512);
  return ok;
}

bool probe_gemm_avx2_available() {
  static const bool ok = cpu_has_avx2_fma() && cpu_isa_allowed(CpuIsa::Avx2);
  return ok;
}

ProbeKernel probe_gemm_auto_kernel() {
  if (probe_gemm_avx512_available()) return ProbeKernel::Avx512Vnni;
  if (probe_gemm_avx2_available()) return ProbeKernel::Avx2;
  return ProbeKernel::Portable;
}

const char* probe_kernel_name(ProbeKernel k) {
  switch (k) {
    case ProbeKernel::Auto: return "auto";
    case ProbeKernel::Portable: return "portable";
    case ProbeKernel::Avx512Vnni: return "avx512-vnni";
    case ProbeKernel::Avx2: return "avx2";
    case ProbeKernel::Avx512Emulated: return "avx512-emulated";
  }
  return "?";
}

void probe_gemm(const QuantizedTensor& a, const QuantizedTensor& b, float* c,
                const ProbeGemmOptions& options) {
  check_tensor("A", a);
  check_tensor("B", b);
  if (a.cols != b.cols) {
    throw std::invalid_argument("probe_gemm: K mismatch: A is [" + std::to_string(a.rows) + ", " +
                                std::to_string(a.cols) + "], B is [" + std::to_string(b.rows) +
                                ", " + std::to_string(b.cols) +
                                "] (C = A·Bᵀ needs equal column counts)");
  }
  options.accumulator.check();
  const bool default_acc = options.accumulator.is_default();
  if (!default_acc && options.kernel != ProbeKernel::Auto && options.kernel != ProbeKernel::Portable)
    throw std::invalid_argument(std::string("probe_gemm: kernel ") + probe_kernel_name(options.kernel) +
                                " implements the default accumulator (chunk 64, rtz, snap 1/1024) only, "
                                "not " + options.accumulator.describe() + " (use kernel Auto or Portable)");
  // The SIMD kernels implement the default accumulator; any other runs the portable kernel.
  const ProbeKernel kernel = options.kernel != ProbeKernel::Auto ? options.kernel
                             : default_acc                       ? probe_gemm_auto_kernel()
                                                                 : ProbeKernel::Portable;
  if (kernel == ProbeKernel::Avx512Vnni && !probe_gemm_avx512_available())
    throw std::runtime_error("probe_gemm: this CPU has no AVX-512 VNNI (use kernel Auto)");
  if (kernel == ProbeKernel::Avx2 && !probe_gemm_avx2_available())
    throw std::runtime_error("probe_gemm: this CPU has no AVX2 and FMA (use kernel Auto)");
  const Impl impl = kernel == ProbeKernel::Avx512Vnni       ? Impl::Avx512
                    : kernel == ProbeKernel::Avx2           ? Impl::Avx2
                    : kernel == ProbeKernel::Avx512Emulated ? Impl::Avx512Emu
                                                            : Impl::Portable;
  const bool simd = impl != Impl::Portable;
  const int64_t M = a.rows, N = b.rows, K = a.cols;
  if (M == 0 || N == 0) return;
  const Plan pl = make_plan(K, a.spec.block, b.spec.block, options.accumulator);
  const float alpha = probe_gemm_alpha(a, b, options.alpha);
  // Packing buffers are kept per calling thread and reused (their capacity only grows), so
  // repeated calls do not pay for fresh pages.
  static thread_local Workspace ws;
  Packed& A = ws.a;
  Packed& B = ws.b;
  Panels& BP = ws.panels;
  const int64_t ngroups = (M + kGroupRows - 1) / kGroupRows;
  const int64_t npan = simd ? (N + kNR - 1) / kNR : (N + kGroupRows - 1) / kGroupRows;
  const int64_t pcols = simd ? kNR : kGroupRows;  // columns per panel
  const bool par = M * N * std::max<int64_t>(K, 1) >= (int64_t{1} << 16);
  const int64_t threads = par ? omp_get_max_threads() : 1;
  // Tasks: (row group, range of panels). Whole rows of panels when there are enough groups,
  // else each group's panels split so that every thread has work.
  const int64_t ranges = ngroups >= 2 * threads
                             ? 1
                             : std::min(npan, (4 * threads + ngroups - 1) / ngroups);
  const int64_t tasks = ngroups * ranges;
  int Fa = 3, Fb = 3;  // scale mantissa widths (the contract's formats need 3 fraction bits)
  for (;;) {
    init_packed(A, pl, M, simd ? round_up(M, kMR) : M, Fa);
    init_packed(B, pl, N, N, Fb);
    if (simd) {
      BP.npan = npan;
      BP.bytes.resize(static_cast<size_t>(npan * pl.Kp * kNR));
      BP.hs.resize(static_cast<size_t>(npan * pl.nseg * kNR));
      // Padding columns of the last panel: scale 0 (their bytes are never used unscaled).
      BP.fb.resize(BP.hs.size());
      BP.eb.resize(static_cast<size_t>(npan * pl.nchunk * kNR));
      BP.hspan.resize(static_cast<size_t>(npan * pl.nchunk * 2));
      for (int64_t j = N; j < npan * kNR; ++j) {
        for (int64_t s = 0; s < pl.nseg; ++s) {
          const size_t o = static_cast<size_t>(((j / kNR) * pl.nseg + s) * kNR + j % kNR);
          BP.hs[o] = 0.0;
          BP.fb[o] = 0;
        }
        for (int64_t c = 0; c < pl.nchunk; ++c)
          BP.eb[static_cast<size_t>(((j / kNR) * pl.nchunk + c) * kNR + j % kNR)] = kIntExpBias;
      }
    }
    const int limit = span_limit(A.mmax, B.mmax, pl.acc.chunk);
    BP.int_limit = int_span_limit(A.mmax, B.mmax);
    std::vector<std::atomic<int>> group_state(static_cast<size_t>(ngroups));
    std::vector<std::atomic<int>> panel_state(static_cast<size_t>(npan));
    std::atomic<unsigned> flags_a{0}, flags_b{0};
    // One parallel region, no barrier inside: each task packs what it needs first (once).
#pragma omp parallel for schedule(dynamic, 1) if (par)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t g = t / ranges, rg = t % ranges;
      const int64_t i0 = g * kGroupRows, i1 = std::min(M, i0 + kGroupRows);
      ensure_packed(group_state[static_cast<size_t>(g)], [&] {
        unsigned f = 0;
        for (int64_t i = i0; i < i1; ++i) f |= pack_row(a, pl, 0, Fa, i, A, impl);
        flags_a.fetch_or(f, std::memory_order_relaxed);
      });
      const int64_t p0 = rg * npan / ranges, p1 = (rg + 1) * npan / ranges, len = p1 - p0;
      // Start each group at a different panel so that concurrent tasks pack different panels.
      const int64_t start = len ? (g * len / ngroups) % len : 0;
      for (int64_t q = 0; q < len; ++q) {
        const int64_t p = p0 + (start + q) % len;
        const int64_t j0 = p * pcols, j1 = std::min(N, j0 + pcols);
        ensure_packed(panel_state[static_cast<size_t>(p)], [&] {
          unsigned f = 0;
          for (int64_t j = j0; j < j1; ++j) {
            f |= pack_row(b, pl, 1, Fb, j, B, impl);
            if (simd) pack_panel_row(pl, B, j, BP, impl == Impl::Avx2);
          }
          if (simd) finish_panel(pl, B, p, j0, j1, BP);
          flags_b.fetch_or(f, std::memory_order_relaxed);
        });
        if (impl == Impl::Avx512) {
          for (int64_t r0 = i0; r0 < i1; r0 += kMR)
            avx512::simd_tile(pl, A, BP, r0, p, alpha, c + r0 * N + j0, N, i1 - r0, j1 - j0);
        } else if (impl == Impl::Avx512Emu) {
          for (int64_t r0 = i0; r0 < i1; r0 += kMR)
            avx512_emu::simd_tile(pl, A, BP, r0, p, alpha, c + r0 * N + j0, N, i1 - r0, j1 - j0);
        } else if (impl == Impl::Avx2) {
          for (int64_t r0 = i0; r0 < i1; r0 += kMR)
            avx2_tile(pl, A, B, BP, r0, p, alpha, limit, c + r0 * N + j0, N, i1 - r0, j1 - j0);
        } else {
          for (int64_t i = i0; i < i1; ++i)
            for (int64_t j = j0; j < j1; ++j) c[i * N + j] = probe_output(pl, A, i, B, j, alpha, limit);
        }
      }
    }
    const unsigned fa = flags_a.load(), fb = flags_b.load();
    if (fa & kBadCode) throw_bad_code("A", a);
    if (fb & kBadCode) throw_bad_code("B", b);
    if (fa & kBadScale) throw_bad_scale("A", a);
    if (fb & kBadScale) throw_bad_scale("B", b);
    if (!((fa | fb) & kWiderScale)) break;
    // Some scale needs more than 3 fraction bits (a spelled format): redo with wider m.
    const int na = max_scale_frac_bits(a), nb = max_scale_frac_bits(b);
    if (na > 7) throw_bad_scale("A", a);
    if (nb > 7) throw_bad_scale("B", b);
    if (na <= Fa && nb <= Fb)  // packing and scale_frac_bits disagree: a bug, not bad input
      throw std::logic_error("probe_gemm: packing reported a block scale wider than " +
                             std::to_string(std::max(Fa, Fb)) + " fraction bits, but none is");
    Fa = std::max(Fa, na);
    Fb = std::max(Fb, nb);
  }
  if (!simd) return;  // the portable path already chose exact sums per chunk
  // Outputs whose chunk sums may not be exact in double: recompute them exactly.
  A.max_span = max_span_of(A);
  B.max_span = max_span_of(B);
  const int limit = span_limit(A.mmax, B.mmax, pl.acc.chunk);
  if (A.max_span + B.max_span > limit) {
#pragma omp parallel for schedule(dynamic, 4) if (par)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j)
        if (needs_fixup(pl, A, i, B, j, limit))
          c[i * N + j] = probe_output(pl, A, i, B, j, alpha, limit);
  }
}

void probe_gemm(const QTensor& a, const QTensor& b, float* c, const ProbeGemmOptions& options) {
  thread_local QuantizedTensor ua, ub;  // reused: a training loop's shapes repeat
  try {
    unpack(a, ua);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("probe_gemm: operand A: ") + e.what());
  }
  try {
    unpack(b, ub);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("probe_gemm: operand B: ") + e.what());
  }
  probe_gemm(ua, ub, c, options);
}

void decoded_gemm(const QuantizedTensor& a, const QuantizedTensor& b, float* c) {
  if (a.cols != b.cols) {
    throw std::invalid_argument("decoded_gemm: K mismatch: A is [" + std::to_string(a.rows) +
                                ", " + std::to_string(a.cols) + "], B is [" +
                                std::to_string(b.rows) + ", " + std::to_string(b.cols) + "]");
  }
  const int64_t M = a.rows, N = b.rows, K = a.cols;
  std::vector<float> da(static_cast<size_t>(M * K)), db(static_cast<size_t>(N * K));
  dequantize(a, da.data());  // validates shapes
  dequantize(b, db.data());
  if (M == 0 || N == 0) return;
  if (K == 0) {
    std::fill_n(c, M * N, 0.0f);
    return;
  }
  sgemm(false, true, M, N, K, 1.0f, da.data(), K, db.data(), K, 0.0f, c, N);
}

void decoded_bf16_gemm(const QuantizedTensor& a, const QuantizedTensor& b, float* c) {
  if (a.cols != b.cols) {
    throw std::invalid_argument("decoded_bf16_gemm: K mismatch: A is [" + std::to_string(a.rows) +
                                ", " + std::to_string(a.cols) + "], B is [" +
                                std::to_string(b.rows) + ", " + std::to_string(b.cols) + "]");
  }
  for (const QuantizedTensor* t : {&a, &b})
    if (!t->spec.element.is_e2m1() || t->spec.scale_desc != nullptr)
      throw std::invalid_argument(
          std::string("decoded_bf16_gemm: operand ") + (t == &a ? "A" : "B") +
          " has element format " + t->spec.element.name() + " and scale format " +
          spec_scale_format(t->spec).name +
          "; its q·c_b is a BF16 value only for E2M1 with ue5m3, ue5m3-ptx, e4m3 or ue8m0 scales "
          "(use the decoded mode)");
  for (const QuantizedTensor* t : {&a, &b})
    if (t->spec.scale_format == ScaleFormat::UE8M0 && t->spec.scale_rule == ScaleRule::TensorScaled &&
        !decoded_bf16_target_in_band(t->spec.target))
      throw std::invalid_argument(
          std::string("decoded_bf16_gemm: operand ") + (t == &a ? "A" : "B") +
          " has ue8m0 scales under the tensor-scaled rule with scale target " +
          std::to_string(t->spec.target) +
          "; with decoded-bf16 the target must lie in [2^-24, 2^48] (q·c_b ≈ a_b·T/g would leave "
          "the FP32/BF16 range; docs/gemm.md)");
  const int64_t M = a.rows, N = b.rows, K = a.cols;
  auto block_scaled = [](const QuantizedTensor& t, const char* name) {  // q·c_b
    std::vector<float> out(static_cast<size_t>(t.rows * t.cols));
    try {
      dequantize_block_scaled(t, out.data());
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string("decoded_bf16_gemm: operand ") + name + ": " + e.what());
    }
    return out;
  };
  const std::vector<float> va = block_scaled(a, "A"), vb = block_scaled(b, "B");
  BlockScaledGemmScratch scratch;  // K == 0: gemm_block_scaled writes P = 0, so C = +0
  gemm_block_scaled(false, true, M, N, K, va.data(), a.gd, vb.data(), b.gd, false, c, scratch);
}

void quantized_gemm(GemmMode mode, const QuantizedTensor& a, const QuantizedTensor& b, float* c) {
  switch (mode) {
    case GemmMode::Decoded: return decoded_gemm(a, b, c);
    case GemmMode::DecodedBf16: return decoded_bf16_gemm(a, b, c);
    case GemmMode::ProbeMatched: return probe_gemm(a, b, c);
  }
}

}  // namespace fp4
