// Internal to src/gemm/probe_gemm*.cpp (not a public header): the packed operand layouts that
// the probe-matched GEMM's kernels share, and the kernels' entry points. The exactness
// arguments are in src/gemm/probe_gemm.cpp (file comment) and docs/gemm.md.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "fp4/gemm/probe_gemm.h"

namespace fp4::probe_impl {

/// n = 2q for each E2M1 code.
inline constexpr int8_t kTwiceE2M1[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
/// Offset making B's n_b unsigned for the SIMD kernels' u8 × s8 dot products (vpdpbusd,
/// vpmaddubsw); undone by −12·Σ n_a.
inline constexpr int kNOffset = 12;

/// Tile shape of the SIMD kernels (rows of A padded to a multiple of kMR; B packed in panels
/// of kNR columns).
inline constexpr int kMR = 4;
inline constexpr int kNRV = 2;  // 16-column vectors per AVX-512 tile
inline constexpr int kNR = 16 * kNRV;

/// Along-K plan shared by both operands: segments (runs with constant scales of A and B inside
/// one chunk of the accumulator), each padded to a multiple of 4 in the packed layout.
struct Segment {
  int64_t k0, k1;   ///< [k0, k1) in K
  int64_t p0;       ///< offset in the packed (padded) K layout, multiple of 4
  int64_t plen;     ///< padded length, multiple of 4 (≤ chunk: a segment lies in one chunk)
  int64_t bc[2];    ///< block column of operand A (0) and B (1)
};
struct Plan {
  Accumulator acc;       ///< the accumulator (chunk, rounding of the partials' additions, snap)
  int64_t K = 0, Kp = 0, nchunk = 0, nseg = 0;
  bool contiguous = true;  ///< p0 == k0 for every segment: packed layout = K layout + tail pad
  std::vector<Segment> segs;
  bool bcol_is_s[2] = {true, true};  ///< segs[s].bc[w] == s for every s (segment = block)
  bool groups16 = true;              ///< every segment's p0 and plen are multiples of 16
  std::vector<int64_t> chunk_first;  ///< [nchunk + 1]: segments of chunk c are [first[c], first[c+1])
};

/// One operand in lattice form: n = 2q per element in the padded K layout, and per
/// (row, segment) its block scale (c/2 in double; m and e) and the correction −12·Σ n that
/// undoes the SIMD kernels' +12 offset on the other operand.
struct Packed {
  int64_t rows = 0;
  std::vector<int8_t> n;      ///< [rows_alloc][Kp], zero padded (rows_alloc ≥ rows)
  std::vector<double> hs;     ///< [rows_alloc][nseg] c/2 (0 in padding rows)
  std::vector<int32_t> corr;  ///< [rows_alloc][nseg] −12·Σ n over the segment (0 in padding rows)
  std::vector<uint8_t> man;   ///< [rows][nseg] m
  std::vector<int16_t> ex;    ///< [rows][nseg] e
  std::vector<int16_t> span;  ///< [rows][nchunk] max e − min e over the chunk's nonzero segments
  int max_span = 0;
  int mmax = 15;              ///< bound on m: 2^(F+1) − 1
  // The SIMD kernels' integer chunk path (src/gemm/probe_gemm.cpp, "Integer chunk sums"): per
  // (row, segment) the factor f = m·2^(e − emin) (0 for an all-zero segment), per (row, chunk)
  // emin (the least e of the chunk's nonzero segments, 0 if none) and ispan (span, or
  // kNoIntPath when the chunk cannot take the integer path: span > kIntMaxSpan or emin outside
  // ±kIntExpBand). Padding rows: f = 0, emin = 0, ispan = 0.
  std::vector<int16_t> fac;    ///< [rows_alloc][nseg]
  std::vector<int16_t> emin;   ///< [rows_alloc][nchunk]
  std::vector<int16_t> ispan;  ///< [rows_alloc][nchunk]
};

/// Integer chunk path limits: a factor m·2^span must fit int16 for every m < 2^8 (span ≤ 7),
/// and 2^(emin_a + emin_b − 2) must be a normal FP32 power of two (|emin| ≤ 62 each).
inline constexpr int kIntMaxSpan = 7;
inline constexpr int kIntExpBand = 62;
inline constexpr int16_t kNoIntPath = 99;
/// The FP32 exponent bias minus 2: eb = emin_b + kIntExpBias per column is the biased
/// exponent field of 2^(emin_b − 2); the kernels add emin_a and shift it into place.
inline constexpr int kIntExpBias = 127 - 2;

/// B packed for the SIMD kernels in panels of kNR columns: [panel][Kp/4][kNR][4] bytes
/// n_b + 12 (unsigned, the u8 operand; A's signed n_a is the broadcast s8 operand), and c_b/2
/// per (panel, segment, column). Padding columns have scale 0 (their bytes are never used
/// unscaled).
struct Panels {
  int64_t npan = 0;
  std::vector<uint8_t> bytes;
  std::vector<double> hs;
  /// Integer chunk path, per (panel, segment, column): B's factor f_b as the int32 lane the
  /// kernel multiplies (AVX2: f_b in both int16 halves, for its int16 pair sums; AVX-512:
  /// f_b in the low half, 0 in the high half, for its int32 dots); 0 in padding columns.
  std::vector<int32_t> fb;
  std::vector<int32_t> eb;      ///< [panel][nchunk][kNR] emin_b + kIntExpBias (padding: kIntExpBias)
  std::vector<int16_t> hspan;   ///< [panel][nchunk][2] max ispan over each 16-column half
  /// Largest span_A + span_B for which f_a·f_b < 2^15 (15 − bitlength(mmax_a·mmax_b); 7 for
  /// the contract's 4-bit scale mantissas).
  int int_limit = 0;
};

/// Whether chunk ch of a SIMD tile takes the integer path: the tile's kMR rows of A from i0
/// and the 16-column halves [h0, h1] of panel p (the AVX2 kernel's half tile: h0 = h1; the
/// AVX-512 kernel's whole panel: 0, 1) allow it when their largest ispan on each side adds up
/// to at most BP.int_limit (every output of the tile then does; file comment of
/// probe_gemm.cpp, "Integer chunk sums").
inline bool tile_takes_int_path(const Packed& A, const Panels& BP, int64_t nc, int64_t i0,
                                int64_t p, int64_t ch, int h0, int h1) {
  int span_a = 0, span_b = 0;
  for (int r = 0; r < kMR; ++r) span_a = std::max<int>(span_a, A.ispan[static_cast<size_t>((i0 + r) * nc + ch)]);
  for (int h = h0; h <= h1; ++h) span_b = std::max<int>(span_b, BP.hspan[static_cast<size_t>((p * nc + ch) * 2 + h)]);
  return span_a + span_b <= BP.int_limit;
}

/// The portable (scalar) kernel for one output C[i, j]: exact double chunk sums when the span
/// bound allows (span_A + span_B ≤ limit), the multi-word exact sum otherwise. The scalar twin
/// of both SIMD kernels, and their fallback.
float probe_output(const Plan& pl, const Packed& A, int64_t i, const Packed& B, int64_t j,
                   float alpha, int limit);

/// n[k] = 2·e2m1_decode(codes[k] & 15) for k < K; returns the OR of all codes (> 15 iff a
/// code is out of range).
unsigned convert_codes(const uint8_t* codes, int8_t* n, int64_t K);

/// True if this CPU (and build) can run the AVX2 kernel (AVX2 and FMA).
bool cpu_has_avx2_fma();
/// convert_codes with a 32-byte table shuffle (vpshufb); same results. AVX2 only.
unsigned convert_codes_avx2(const uint8_t* codes, int8_t* n, int64_t K);
/// The AVX2 kernel (src/gemm/probe_gemm_avx2.cpp) for the kMR × kNR output tile of rows
/// i0.. of A and panel p of B, written to c (row stride ldc): its first `rows` rows and `cols`
/// columns. B is the packed operand behind the panel (for the scalar fallback).
void avx2_tile(const Plan& pl, const Packed& A, const Packed& B, const Panels& BP, int64_t i0,
               int64_t p, float alpha, int limit, float* c, int64_t ldc, int64_t rows,
               int64_t cols);

}  // namespace fp4::probe_impl
