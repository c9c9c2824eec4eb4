// Random Hadamard transforms (RHT) of the backward GEMMs' operands: TE's 16-point RHT of the
// NVFP4 recipe's wgrad operands, and its generalisation to 16/32/64/128 points, dgrad and/or
// wgrad operands and three sign policies. Contract: docs/numerics.md "Random Hadamard transform".
#pragma once
#include <array>
#include <cstdint>
#include <string>

namespace fp4 {

/// Arithmetic of the RHT (recipe key fp4.rht_precision; docs/numerics.md "Random Hadamard
/// transform"): FP32 (the default, rht16_rows) or the reference implementation's BF16 matmul
/// with BF16 output (rht16_rows_bf16).
enum class RhtPrecision { FP32, BF16 };
/// "fp32", "bf16".
const char* rht_precision_name(RhtPrecision p);
/// Parse "fp32" | "bf16"; throws std::invalid_argument naming the value and the choices.
RhtPrecision parse_rht_precision(const std::string& s);

/// The fixed sign vector s shared by all layers for the whole run.
extern const float kRhtSigns[16];

/// In place, every 16-long chunk of every row of x [rows, cols] becomes (x ⊙ s) · H16 / 4,
/// H16 the Sylvester Hadamard matrix (H[i][j] = (−1)^popcount(i & j)). The transform is
/// orthogonal, so applying it to both operands along a contraction dim leaves the product
/// unchanged. Throws std::invalid_argument if cols % 16 != 0.
void rht16_rows(float* x, int64_t rows, int64_t cols);

/// The BF16 variant, in place on x [rows, cols] (cols % 16 == 0): every 16-long chunk of every
/// row becomes z = round_bf16(((round_bf16(x) ⊙ s)·H16) · 0.25): inputs rounded to BF16 (RNE),
/// the sign products exact, the same FP32 butterfly (same order) as rht16_rows, the exact ·0.25,
/// and the output rounded to BF16 (RNE, fp4::round_bf16). The values written are BF16 values
/// held in FP32. Throws std::invalid_argument if cols % 16 != 0 or a shape is negative.
void rht16_rows_bf16(float* x, int64_t rows, int64_t cols);

/// rht16_rows or rht16_rows_bf16, by `precision`.
void rht16_rows(float* x, int64_t rows, int64_t cols, RhtPrecision precision);

// ---- Hadamard transforms of any supported size (docs/numerics.md "Random Hadamard transform",
// "Sizes, roles and sign policies").

/// The largest transform size n (hadamard_size_valid: 16, 32, 64, 128).
inline constexpr int kMaxHadamard = 128;
/// Whether n is a supported transform size: 16, 32, 64 or 128.
bool hadamard_size_valid(int n);

/// How the sign vector s of a transform is chosen (recipe key fp4.hadamard_signs):
/// Fixed: one vector for every layer and the whole run (TE's kRhtSigns for n = 16; for larger n
/// a constant Philox draw, hadamard_signs); PerLayer: one vector per layer, drawn once from
/// (run seed, layer); PerStep: re-drawn at every optimizer step from (run seed, layer, step);
/// PerCall: re-drawn at every backward call, from (run seed, layer, step, micro-batch), Quartet
/// II's re-randomisation (the same as PerStep with one micro-batch per step).
enum class HadamardSigns { Fixed, PerLayer, PerStep, PerCall };
/// "fixed", "per-layer", "per-step", "per-call".
const char* hadamard_signs_name(HadamardSigns p);
/// Parse "fixed" | "per-layer" | "per-step" | "per-call"; throws std::invalid_argument naming the value and
/// the choices.
HadamardSigns parse_hadamard_signs(const std::string& s);

/// The sign vector s [n] (entries ±1.0f) of policy p for layer `layer` at 1-based optimizer step
/// `step` of a run with seed `seed`; a pure function of its arguments (no state, so threads,
/// processes and resumed runs all see the same signs). Fixed with n = 16 is kRhtSigns; any other
/// case draws s_i = +1 if bit i of a Philox4x32-10 stream is 0, else −1, with the stream keyed as
/// docs/numerics.md "Stochastic-rounding bits (Philox keys)" but with purpose tag 0x4844 ("HD")
/// instead of 0x5352 ("SR"), so sign bits never coincide with SR bytes: key (seed low, seed high),
/// counter (micro', step', layer', n·2^16 + 0x4844), with (seed, layer', step', micro') =
/// (0, 0, 0, 0) for Fixed (the vector is the same in every run), (seed, layer, 0, 0) for
/// PerLayer, (seed, layer, step, 0) for PerStep and (seed, layer, step, micro) for PerCall
/// (`micro`: the 0-based micro-batch of the step, StepContext::micro); the 128 output bits are
/// the four words little-endian. Throws std::invalid_argument if n is not a supported size.
void hadamard_signs(int n, HadamardSigns p, uint64_t seed, uint32_t layer, uint32_t step,
                    float* out, uint32_t micro = 0);

/// One resolved transform: size n, its signs s[0..n) and its arithmetic. The value a Linear
/// builds per call (hadamard_signs); kernels read nothing else.
struct HadamardTransform {
  int n = 16;
  RhtPrecision precision = RhtPrecision::FP32;
  std::array<float, kMaxHadamard> signs{};  ///< s[0..n), ±1.0f; the rest unused
  /// The transform of size n with signs of policy p (hadamard_signs). Throws as hadamard_signs.
  static HadamardTransform make(int n, HadamardSigns p, RhtPrecision precision, uint64_t seed,
                                uint32_t layer, uint32_t step, uint32_t micro = 0);
  /// TE's 16-point RHT (kRhtSigns) with `precision`: what rht16_rows computes.
  static HadamardTransform te16(RhtPrecision precision = RhtPrecision::FP32);
  /// The scale c_n of the transform: RNE-to-FP32 of 1/√n for FP32 (0.25 and 0.125 exactly for
  /// n = 16, 64), RNE-to-BF16 of 1/√n for the BF16 variant (the BF16 matrix entry ±c_n of a BF16
  /// matmul; the same value for n = 16, 64).
  float scale() const;
};

/// In place, every n-long chunk of every row of x [rows, cols] (FP32, row-major) becomes
/// (x ⊙ s)·H_n · c_n (h.scale()), H_n the Sylvester Hadamard matrix, by the log2(n)-stage
/// butterfly (a, b) → (a + b, a − b) with strides 1, 2, .., n/2 (rht16_rows' order, generalised).
/// With RhtPrecision::BF16 the inputs and outputs are rounded to BF16 (RNE) as in
/// rht16_rows_bf16. For h = HadamardTransform::te16(p) the bits equal rht16_rows(x, rows, cols,
/// p). Parallel over rows; bits never depend on the thread count. Throws std::invalid_argument
/// if h.n is not a supported size, cols % h.n != 0 or a shape is negative.
void hadamard_rows(float* x, int64_t rows, int64_t cols, const HadamardTransform& h);

}  // namespace fp4
