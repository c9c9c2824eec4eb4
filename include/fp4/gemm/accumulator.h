// The probe-matched GEMM's accumulator as a component (docs/gemm.md "The accumulator", steps 2-5
// of its "Probe-matched rules"; docs/numerics.md "GEMM emulation"): how a native FP4
// GEMM adds up its products. Step numbers are docs/gemm.md's (step 1 forms the products):
//
//   2. The K products of one output are cut into chunks of `chunk` consecutive products (the
//      last one shorter when K % chunk != 0).
//   3. Each chunk's sum is computed exactly and rounded ONCE to FP32 (round to nearest even):
//      the chunk's *partial*.
//   4. The partials are accumulated in K order, starting from +0, with FP32 additions rounded
//      to nearest even (`rne`) or toward zero (`rtz`).
//   5. The accumulator is snapped to the grid of multiples of 1/d with round to nearest even,
//      RNE(d·acc)/d (d = 0: no snap).
//
// fp4::probe_gemm (fp4/gemm/probe_gemm.h) runs steps 4 and 5 through accumulate_add and
// snap_to_grid below, and step 3 through the same exact rounding as chunk_sum_rne (the portable
// kernel; its AVX-512 and AVX2 twins implement the default accumulator and are tested bit for bit
// against it). The default, chunk 64 / rtz / d = 1024, is the paper's probe of the Blackwell FP4
// GEMM (arXiv 2609.02846, Appendix C).
//
// Exactness: every function here returns the value its rule defines, bit for bit, on any CPU:
// no step depends on the FP environment's rounding mode (RTZ is computed from the RNE sum and its
// exact TwoSum error), and the snap is exact in double for power-of-two d. Needs the default
// FP environment (round to nearest, no flush-to-zero / denormals-are-zero).
#pragma once
#include <cstdint>
#include <string>

namespace fp4 {

/// Rounding of the FP32 additions of chunk partials.
enum class AccumRounding {
  Rne,  ///< round to nearest, ties to even (IEEE default)
  Rtz,  ///< round toward zero (truncation): the paper's probe of the native GEMM
};

/// "rne" | "rtz".
const char* accum_rounding_name(AccumRounding r);
/// Parses "rne" | "rtz"; throws std::invalid_argument naming `what` and the choices otherwise.
AccumRounding parse_accum_rounding(const std::string& s, const std::string& what = "rounding");

/// The accumulator's knobs. Defaults: the paper's probe (chunk 64, RTZ, snap 1/1024).
struct Accumulator {
  int chunk = 64;                             ///< products per chunk: 16, 32, 64 or 128
  AccumRounding rounding = AccumRounding::Rtz;  ///< additions of partials
  int snap = 1024;                            ///< grid denominator d: 0 (none) or a power of two 1 … 2^16

  /// chunk 64, RTZ, d = 1024: the case the SIMD kernels of probe_gemm implement.
  bool is_default() const { return chunk == 64 && rounding == AccumRounding::Rtz && snap == 1024; }
  /// Throws std::invalid_argument naming the knob when chunk is not 16, 32, 64 or 128, or snap
  /// is not 0 or a power of two in [1, 65536].
  void check() const;
  /// "chunk 64, rtz, snap 1/1024" (snap "none" for d = 0).
  std::string describe() const;
};

/// One accumulation step: fl(acc + partial) rounded by `r`. RTZ is exact IEEE round-toward-zero
/// (computed without changing the FP environment); an overflow of finite operands gives
/// ±FLT_MAX under RTZ and ±Inf under RNE. Inf/NaN operands follow IEEE (as their sum does not
/// depend on the rounding). An exact zero sum is +0 under both (as IEEE, for RNE and RTZ, except
/// (−0) + (−0) = −0). Never throws.
float accumulate_add(float acc, float partial, AccumRounding r);

/// RNE(d·x)/d, the snap to multiples of 1/d: exact (sign of zero kept, so a tiny negative x
/// gives −0; Inf/NaN pass through; |x| ≥ 2^23/d is already on the grid and unchanged). d = 0
/// returns x. Precondition (not checked here; Accumulator::check checks it): d is 0 or a power
/// of two ≤ 2^16. Never throws.
float snap_to_grid(float x, int d);

/// Steps 4 and 5 for one output: acc = +0; acc = accumulate_add(acc, partials[c], rounding) for
/// c = 0 … n − 1; returns snap_to_grid(acc, snap). `chunk` is not used (the partials are given).
/// Throws std::invalid_argument on n < 0 or a bad accumulator (Accumulator::check).
float accumulate_partials(const float* partials, int64_t n, const Accumulator& acc);

/// accumulate_partials of each row: out[i] (FP32, [rows]) from partials [rows, chunks]
/// (row-major FP32). Rows are independent (OpenMP over rows; bits do not depend on the thread
/// count). Throws std::invalid_argument on negative sizes or a bad accumulator.
void accumulate_partials_rows(const float* partials, int64_t rows, int64_t chunks,
                              const Accumulator& acc, float* out);

/// Step 3: the exact sum of x[k]·w[k], k < n, rounded once to FP32 (RNE, IEEE binary32 with
/// subnormals; overflow to ±Inf). FP32 operands (BF16 values are FP32 values): each product is
/// exact in double and the sum is exact in a multi-word integer, so the result does not depend
/// on the order of the products. An exact zero gives +0. Throws std::invalid_argument on
/// n < 0, n > 4096, or a non-finite operand (named with its index).
float chunk_sum_rne(const float* x, const float* w, int64_t n);

/// The chunked dot product Σ_k x[k]·w[k], k < K (FP32 operands): chunk_sum_rne over each chunk of
/// `acc.chunk` products, then accumulate_partials. Throws std::invalid_argument on K < 0, a
/// non-finite operand, or a bad accumulator.
float chunked_dot(const float* x, const float* w, int64_t K, const Accumulator& acc);

/// Step 3 for row pairs: partials[i, c] = chunk_sum_rne over chunk c of row i of x and w
/// ([rows, K] row-major FP32), for c < ceil(K / chunk); partials is [rows, ceil(K / chunk)]
/// (FP32, row-major). accumulate_partials_rows of it is chunked_dot_rows. OpenMP over rows; bits
/// do not depend on the thread count. Throws std::invalid_argument on negative sizes, a chunk
/// not in 1 … 4096, or a non-finite operand (named with its row and element).
void chunk_partials_rows(const float* x, const float* w, int64_t rows, int64_t K, int chunk,
                         float* partials);

/// chunked_dot of row pairs: out[i] = chunked_dot(x + i·K, w + i·K, K) for x, w [rows, K]
/// (row-major FP32), out [rows]. OpenMP over rows; bits do not depend on the thread count.
/// Throws as chunked_dot, naming the row.
void chunked_dot_rows(const float* x, const float* w, int64_t rows, int64_t K,
                      const Accumulator& acc, float* out);

/// chunked_dot_rows on BF16 operands (uint16_t bit patterns [rows, K]), each widened exactly to
/// FP32 first. Throws as chunked_dot_rows (a BF16 Inf/NaN is a non-finite operand).
void chunked_dot_rows_bf16(const uint16_t* x, const uint16_t* w, int64_t rows, int64_t K,
                           const Accumulator& acc, float* out);

namespace detail {
/// v·2^u: one term of an exact sum.
struct ExactTerm {
  int64_t v;
  int u;
};
/// RNE rounding to FP32 of the exact value Σ t[i].v·2^(t[i].u), for |v| < 2^62 and n ≤ 4096
/// (any exponents whose spread fits an int): two's-complement sum on 64-bit words, then IEEE
/// binary32 rounding with subnormals and overflow to ±Inf. An exact zero gives +0. The exact
/// step 3 of probe_gemm (its fallback when a chunk's scales are too far apart for double) and of
/// chunk_sum_rne.
float round_exact_terms_rne(const ExactTerm* t, int n);
}  // namespace detail

}  // namespace fp4
