// AVX2 kernel of the probe-matched FP4 GEMM (ProbeKernel::Avx2): the native FP4 GEMM's
// chunked arithmetic of docs/numerics.md "GEMM emulation" (64-product chunks, each summed
// exactly and rounded once to FP32 with RNE, RTZ accumulation of the chunk sums from +0 in K
// order, snap to the 1/1024 grid with RNE, then α), bit for bit, for CPUs with AVX2 and FMA
// but no AVX-512 VNNI. Rules and exactness arguments: include/fp4/gemm/probe_gemm.h,
// src/gemm/probe_gemm.cpp (file comment), docs/gemm.md.
//
// Scalar twin: probe_impl::probe_output (src/gemm/probe_gemm.cpp, ProbeKernel::Portable).
// Test: tests/gemm/test_probe_gemm.cpp runs every test against every available kernel and an
// independent exact reference, bit for bit (ProbeGemm.*, ProbeGemmHand.*, ProbeGemmAlpha.*,
// ProbeGemmKernels.*). Benchmark: BM_ProbeVsSgemm in bench/bench_gemm.cpp.
//
// Layout (shared with the AVX-512 kernel, probe_gemm_impl.h): B packed in panels of 32
// columns, per group of 4 k one 4-byte word n_b + 12 ∈ [0, 24] (unsigned) per column; A's
// n_a = 2q ∈ [−12, 12] (signed) per element; −12·Σ n_a per (row, segment) undoes the offset.
// A tile is 4 rows × 16 columns (half a panel); the kernel does the two halves in turn.
//
// Integer dot products without saturation. Per group of 4 k, vpmaddubsw multiplies the 32
// bytes of B (8 columns × 4 k, unsigned) with A's 4 bytes broadcast to every 32-bit lane
// (signed) and adds adjacent pairs into int16: lane 2c holds u[k]·a[k] + u[k+1]·a[k+1] of
// column c, lane 2c + 1 the same for k + 2, k + 3. vpmaddubsw saturates to int16, but
// |u·a + u'·a'| ≤ 2·24·12 = 576, far below 2^15 − 1, so it never saturates. The pairs are
// accumulated with vpaddw (int16, wrapping) over one segment, lane 2c starting from the
// row's correction −12·Σ n_a (|corr| ≤ 12·12·64 = 9216) and lane 2c + 1 from 0: a segment
// lies inside one 64-chunk, so at most 16 groups add up, every partial sum of pairs is
// bounded by 16·576 = 9216, and a lane never exceeds 9216 + 9216 = 18432 < 2^15: no wrap
// either. (Padding columns of the last panel hold stale bytes of an earlier call's panels;
// whatever their int16 sums, their scale c_b/2 and their factor f_b are 0, so they add 0, and
// they are never stored.) At the end of the segment
// vpmaddwd with ones adds the two int16 lanes of a column into int32 (exact), giving
// D_s = Σ n_a·(n_b + 12) − 12·Σ n_a = Σ n_a·n_b exactly (|D_s| ≤ 144·64).
//
// Chunk sum in int32 (when the tile's spans allow it; probe_gemm.cpp, "Integer chunk sums"):
// vpmullw forms w = f_a·f_b (< 2^15) in both int16 halves of each column's lane, and vpmaddwd
// of the segment's int16 pair sums with w gives (corr + Σ pairs)·w = D_s·w in int32, exactly
// (each product ≤ 18432·32767 < 2^30); the chunk's int32 sum I stays below 2^29. Per chunk,
// vcvtdq2ps rounds I once (RNE) and the product with the normal float 2^(emin_a + emin_b − 2)
// is exact.
//
// Otherwise the chunk sum in double: D_s (int32 → double, exact) times (c_a/2)·(c_b/2) (exact: at most 8 + 8
// significant bits) is added with one FMA to the chunk's double accumulators; the product is
// exact, and the span bound (file comment of probe_gemm.cpp) makes every partial sum exact, so
// the FMA's one rounding never rounds and the order does not matter. Outputs whose span bound
// exceeds the limit are recomputed by the driver with the exact multi-word sum, as for the
// AVX-512 kernel. Per chunk, vcvtpd2ps rounds the exact sum once to FP32 (RNE, the default
// MXCSR the library requires: round to nearest, no FTZ/DAZ).
//
// RTZ accumulation without a rounding-mode switch. AVX2 has no embedded rounding, so
// acc' = RTZ(acc + s) is computed from the RNE sum: s' = fl(acc + s) and its exact error
// e = (acc + s) − s' (TwoSum: six FP32 operations, exact for finite sums, subnormals included).
// If e = 0 or e has the sign of s', s' is already the FP32 value nearest zero not beyond the
// exact sum; otherwise the exact sum lies strictly between s' and its neighbour toward zero
// (within half an ulp of s'), and the result is that neighbour: the bit pattern of s' minus 1
// (sign–magnitude; s' ≠ 0 since a nonzero exact sum of floats never rounds to 0). An overflow
// of s' to ±Inf, or an Inf/NaN operand, makes e non-finite: the kernel flags the tile and
// recomputes its outputs with the scalar twin (which then saturates at ±FLT_MAX or propagates
// Inf/NaN as IEEE says); only UE8M0 scales near 2^127 get there.
//
// Snap: for |x| < 2^13, x·1024 is exact and below 2^23, vroundps with RNE rounds it to an
// integer, and ·2^-10 is exact; |x| ≥ 2^13 is already on the grid (and Inf passes through).
// The sign of zero is kept (RNE of a small negative value is −0). Then vmulps by α (RNE).
//
// Every step is exact or the one IEEE rounding the rules prescribe, so the kernel's bits equal
// the portable kernel's and do not depend on the tiling or the thread count.
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <type_traits>

#include "probe_gemm_impl.h"

namespace fp4::probe_impl {

#if defined(__x86_64__) && defined(__GNUC__)
#define FP4_AVX2 __attribute__((target("avx2,fma")))
#define FP4_AVX2_INLINE inline __attribute__((target("avx2,fma"), always_inline))

bool cpu_has_avx2_fma() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

FP4_AVX2 unsigned convert_codes_avx2(const uint8_t* codes, int8_t* n, int64_t K) {
  const __m256i table =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kTwiceE2M1)));
  const __m256i low = _mm256_set1_epi8(15);
  __m256i all = _mm256_setzero_si256();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + k));
    all = _mm256_or_si256(all, c);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(n + k),
                        _mm256_shuffle_epi8(table, _mm256_and_si256(c, low)));
  }
  const __m256i hi = _mm256_andnot_si256(low, all);  // any bit above the low 4
  return (_mm256_testz_si256(hi, hi) ? 0u : 16u) | convert_codes(codes + k, n + k, K - k);
}

namespace {

/// The 4 bytes at p broadcast to every 32-bit lane.
FP4_AVX2 inline __m256i bcast4(const int8_t* p) {
  int32_t a4;
  std::memcpy(&a4, p, 4);
  return _mm256_set1_epi32(a4);
}

/// acc16 += vpmaddubsw(b, a): int16 pair sums, |pair| ≤ 576 (file comment). The empty asm
/// pins the sum in a register: without it GCC reassociates a segment's 32 additions into a
/// tree of products first, which needs more than 16 registers and spills to the stack.
FP4_AVX2 inline __m256i mac16(__m256i acc16, __m256i b_u8, __m256i a_s8) {
  __m256i r = _mm256_add_epi16(acc16, _mm256_maddubs_epi16(b_u8, a_s8));
  asm("" : "+x"(r));
  return r;
}

/// acc = RTZ_fp32(acc + s) per lane for finite results (file comment); lanes where the TwoSum
/// error is not finite are marked in `bad` (all ones).
FP4_AVX2 inline __m256 add_rtz8(__m256 a, __m256 b, __m256i& bad) {
  const __m256 s = _mm256_add_ps(a, b);
  const __m256 bv = _mm256_sub_ps(s, a);
  const __m256 av = _mm256_sub_ps(s, bv);
  const __m256 e = _mm256_add_ps(_mm256_sub_ps(a, av), _mm256_sub_ps(b, bv));
  const __m256i si = _mm256_castps_si256(s), ei = _mm256_castps_si256(e);
  // −1 where e and s have different signs and e ≠ 0 (then step s one ulp toward zero).
  const __m256i differ = _mm256_srai_epi32(_mm256_xor_si256(si, ei), 31);
  const __m256i nz = _mm256_castps_si256(_mm256_cmp_ps(e, _mm256_setzero_ps(), _CMP_NEQ_OQ));
  const __m256i expo = _mm256_set1_epi32(0x7F800000);
  bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(_mm256_and_si256(ei, expo), expo));
  return _mm256_castsi256_ps(_mm256_add_epi32(si, _mm256_and_si256(differ, nz)));
}

/// 2^-10·RNE(2^10·x), then times α (RNE).
FP4_AVX2 inline __m256 finish8(__m256 x, __m256 alpha) {
  const __m256 absx = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
  const __m256 big = _mm256_cmp_ps(absx, _mm256_set1_ps(8192.0f), _CMP_GE_OQ);
  const __m256 r = _mm256_mul_ps(
      _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1024.0f)),
                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
      _mm256_set1_ps(1.0f / 1024.0f));
  return _mm256_mul_ps(_mm256_blendv_ps(r, x, big), alpha);
}

/// Double path: D = the int32 dots of one int16 accumulator (8 columns; the correction is
/// already in it); d[0..8) += D·(c_a/2)·(c_b/2), exact (file comment).
FP4_AVX2_INLINE void seg_epilogue(__m256i acc16, __m256d sa, const double* sb, double* d) {
  const __m256i D = _mm256_madd_epi16(acc16, _mm256_set1_epi16(1));
  const __m256d lo = _mm256_cvtepi32_pd(_mm256_castsi256_si128(D));
  const __m256d hi = _mm256_cvtepi32_pd(_mm256_extracti128_si256(D, 1));
  const __m256d slo = _mm256_mul_pd(_mm256_loadu_pd(sb), sa);
  const __m256d shi = _mm256_mul_pd(_mm256_loadu_pd(sb + 4), sa);
  _mm256_store_pd(d, _mm256_fmadd_pd(lo, slo, _mm256_load_pd(d)));
  _mm256_store_pd(d + 4, _mm256_fmadd_pd(hi, shi, _mm256_load_pd(d + 4)));
}

/// Integer path: w = f_a·f_b in both int16 halves of each column's lane (< 2^15, file
/// comment), vpmaddwd gives D·w in int32 exactly, added to ia[0..8).
FP4_AVX2_INLINE void seg_epilogue_int(__m256i acc16, __m256i fa16, const int32_t* fb, int32_t* ia) {
  const __m256i w = _mm256_mullo_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(fb)), fa16);
  __m256i* p = reinterpret_cast<__m256i*>(ia);
  _mm256_store_si256(p, _mm256_add_epi32(_mm256_load_si256(p), _mm256_madd_epi16(acc16, w)));
}

/// int16 lanes (corr, 0) in every 32-bit lane: the start of a column's two pair-sum lanes, so
/// that vpmaddwd later yields (Σ u·n_a + corr)·w = D·w directly.
FP4_AVX2 inline __m256i corr16(int32_t corr) { return _mm256_set1_epi32(corr & 0xFFFF); }

/// The int16 pair-sum accumulators of one segment for a 4 × 16 tile (row r: v[2r] columns
/// 0..7, v[2r + 1] columns 8..15), started from each row's correction.
struct Seg16 {
  __m256i v[8];
};

/// One group of 4 k: 2 loads of B, 4 broadcasts of A, 8 vpmaddubsw + vpaddw.
FP4_AVX2_INLINE void group4(Seg16& a16, const uint8_t* bk, const int8_t* ak, int64_t Kp) {
  const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bk));
  const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bk + 32));
#pragma GCC unroll 4
  for (int r = 0; r < kMR; ++r) {
    const __m256i a = bcast4(ak + r * Kp);
    a16.v[2 * r] = mac16(a16.v[2 * r], b0, a);
    a16.v[2 * r + 1] = mac16(a16.v[2 * r + 1], b1, a);
  }
}

/// One 4 × 16 tile: rows i0.. of A, columns [16·h, 16·h + 16) of panel p; the first `rows`
/// rows and `cols` columns are written to c. Returns false if the tile must be recomputed by
/// the scalar twin (a non-finite RTZ addition).
FP4_AVX2 bool half_tile(const Plan& pl, const Packed& A, const Panels& BP, int64_t i0, int64_t p,
                        int h, float alpha, float* c, int64_t ldc, int64_t rows, int64_t cols) {
  static_assert(kMR == 4 && kNR == 32, "the kernel is written for 4 x 16 half panels");
  const int64_t Kp = pl.Kp, ns = pl.nseg, nc = pl.nchunk;
  const int8_t* an = A.n.data() + i0 * Kp;
  const double* sa = A.hs.data() + i0 * ns;
  const int32_t* corr = A.corr.data() + i0 * ns;
  const int16_t* fa = A.fac.data() + i0 * ns;
  const int16_t* ea = A.emin.data() + i0 * nc;
  const uint8_t* bpan = BP.bytes.data() + p * Kp * kNR + h * 64;  // 16 columns × 4 bytes
  const double* sb = BP.hs.data() + p * ns * kNR + h * 16;
  const int32_t* fbp = BP.fb.data() + p * ns * kNR + h * 16;
  const int32_t* ebp = BP.eb.data() + p * nc * kNR + h * 16;
  alignas(32) float acc[kMR][16] = {};  // FP32 RTZ accumulators
  alignas(32) double dacc[kMR][16] = {};   // the current chunk's exact sums (double path)
  alignas(32) int32_t iacc[kMR][16] = {};  // the current chunk's exact sums (integer path)
  __m256i bad = _mm256_setzero_si256();
  for (int64_t ch = 0; ch < nc; ++ch) {
    const bool use_int = tile_takes_int_path(A, BP, nc, i0, p, ch, h, h);
#pragma GCC unroll 4
    for (int r = 0; r < kMR; ++r) {
      if (use_int) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(&iacc[r][0]), _mm256_setzero_si256());
        _mm256_store_si256(reinterpret_cast<__m256i*>(&iacc[r][8]), _mm256_setzero_si256());
      } else {
        for (int q = 0; q < 16; q += 4) _mm256_store_pd(&dacc[r][q], _mm256_setzero_pd());
      }
    }
    for (int64_t s = pl.chunk_first[ch]; s < pl.chunk_first[ch + 1]; ++s) {
      const Segment& sg = pl.segs[static_cast<size_t>(s)];
      // int16 accumulators start from the correction −12·Σ n_a (|corr| ≤ 12·12·64 = 9216, so
      // the lane holding it stays within 9216 + 9216 < 2^15; file comment).
      Seg16 a16;
#pragma GCC unroll 4
      for (int r = 0; r < kMR; ++r) a16.v[2 * r] = a16.v[2 * r + 1] = corr16(corr[r * ns + s]);
      const uint8_t* bk = bpan + sg.p0 * kNR;
      const int8_t* ak = an + sg.p0;
      if (sg.plen == 16) {  // blocks of 16 (the recipes'): unrolled
        group4(a16, bk, ak, Kp);
        group4(a16, bk + 4 * kNR, ak + 4, Kp);
        group4(a16, bk + 8 * kNR, ak + 8, Kp);
        group4(a16, bk + 12 * kNR, ak + 12, Kp);
      } else {
        for (int64_t kk = 0; kk < sg.plen; kk += 4) group4(a16, bk + kk * kNR, ak + kk, Kp);
      }
      if (use_int) {
        const int32_t* fbs = fbp + s * kNR;
#pragma GCC unroll 4
        for (int r = 0; r < kMR; ++r) {
          const __m256i f = _mm256_set1_epi16(fa[r * ns + s]);
          seg_epilogue_int(a16.v[2 * r], f, fbs, &iacc[r][0]);
          seg_epilogue_int(a16.v[2 * r + 1], f, fbs + 8, &iacc[r][8]);
        }
      } else {
        const double* sbs = sb + s * kNR;
#pragma GCC unroll 4
        for (int r = 0; r < kMR; ++r) {
          const __m256d sr = _mm256_set1_pd(sa[r * ns + s]);
          seg_epilogue(a16.v[2 * r], sr, sbs, &dacc[r][0]);
          seg_epilogue(a16.v[2 * r + 1], sr, sbs + 8, &dacc[r][8]);
        }
      }
    }
    // Chunk epilogue: one RNE rounding to FP32, then the RTZ accumulation.
#pragma GCC unroll 4
    for (int r = 0; r < kMR; ++r) {
      const __m256i er = _mm256_set1_epi32(ea[r * nc + ch]);
#pragma GCC unroll 4
      for (int q = 0; q < 16; q += 8) {
        __m256 f;
        if (use_int) {
          // I·2^(emin_a + emin_b − 2): vcvtdq2ps is the one RNE rounding of I, the power of
          // two (a normal float: biased exponent in [1, 249]) scales it exactly.
          const __m256i e = _mm256_add_epi32(
              er, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ebp + ch * kNR + q)));
          f = _mm256_mul_ps(
              _mm256_cvtepi32_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(&iacc[r][q]))),
              _mm256_castsi256_ps(_mm256_slli_epi32(e, 23)));
        } else {
          f = _mm256_set_m128(_mm256_cvtpd_ps(_mm256_load_pd(&dacc[r][q + 4])),
                              _mm256_cvtpd_ps(_mm256_load_pd(&dacc[r][q])));
        }
        _mm256_store_ps(&acc[r][q], add_rtz8(_mm256_load_ps(&acc[r][q]), f, bad));
      }
    }
  }
  if (!_mm256_testz_si256(bad, bad)) return false;
  const __m256 al = _mm256_set1_ps(alpha);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int r = 0; r < kMR && r < rows; ++r)
    for (int q = 0; q < 16 && q < cols; q += 8) {
      const __m256 y = finish8(_mm256_load_ps(&acc[r][q]), al);
      if (cols - q >= 8) {
        _mm256_storeu_ps(c + r * ldc + q, y);
      } else {
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(cols - q)), lane);
        _mm256_maskstore_ps(c + r * ldc + q, mask, y);
      }
    }
  return true;
}

}  // namespace

FP4_AVX2 void avx2_tile(const Plan& pl, const Packed& A, const Packed& B, const Panels& BP,
                        int64_t i0, int64_t p, float alpha, int limit, float* c, int64_t ldc,
                        int64_t rows, int64_t cols) {
  for (int h = 0; h < 2; ++h) {
    const int64_t hc = std::min<int64_t>(cols - 16 * h, 16);
    if (hc <= 0) break;
    if (half_tile(pl, A, BP, i0, p, h, alpha, c + 16 * h, ldc, rows, hc)) continue;
    // Overflow or Inf/NaN somewhere in the tile: the scalar twin for each of its outputs.
    for (int64_t r = 0; r < rows && r < kMR; ++r)
      for (int64_t j = 0; j < hc; ++j)
        c[r * ldc + 16 * h + j] = probe_output(pl, A, i0 + r, B, p * kNR + 16 * h + j, alpha, limit);
  }
}

#else
bool cpu_has_avx2_fma() { return false; }
unsigned convert_codes_avx2(const uint8_t* codes, int8_t* n, int64_t K) {
  return convert_codes(codes, n, K);
}
void avx2_tile(const Plan&, const Packed&, const Packed&, const Panels&, int64_t, int64_t, float,
               int, float*, int64_t, int64_t, int64_t) {
  throw std::logic_error("probe_gemm: the AVX2 kernel is not built for this target");
}
#endif

}  // namespace fp4::probe_impl
