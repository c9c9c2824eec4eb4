// Block-scaled FP4 quantization of one GEMM operand: E2M1 elements (or another element
// format, docs/formats.md), one 8-bit block scale per block (1-D blocks along the contraction
// dim or 2-D tiles for weights), one FP32 tensor scale from a tensor reference amax g — or,
// with the MXFP4 scale rules, power-of-two block scales and no tensor scale.
// Contract: docs/numerics.md "Quantizing one operand" (exact FP32 operation order).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fp4/numerics/format.h"
#include "fp4/numerics/philox.h"

namespace fp4 {

/// How the block scales c_b are chosen (docs/numerics.md "Quantizing one operand").
///  * TensorScaled (default, "tensor-scaled"): the contract's steps with tensor scale
///    ge = (T·emax)/g and c_b = RNE_scale(min(a_b·(ge·fl(1/emax)), scale_max)), emax = the
///    element format's max (E2M1: 6, exactly as docs/numerics.md).
///  * MxTe ("mx-te"): MXFP4 as Transformer Engine computes it: no tensor scale (ge = gd = 1),
///    c_b = 2^ceil(log2(a_b/emax)), the smallest power of two with a_b/c_b ≤ emax, so no
///    element clips.
///  * MxOcp ("mx-ocp"): OCP MX v1.0 section 6.3: no tensor scale,
///    c_b = 2^(floor(log2 a_b) − emax_exp) with emax_exp = floor(log2 emax) (E2M1: 2, the
///    exponent of the largest normal element), elements saturating to ±emax.
/// Both MX rules need a power-of-two scale format (frac_bits = 0: UE8M0, or a spelled
/// ue<E>m0); the exponent is computed exactly (integer exponents and exact comparisons, no
/// log2f) and clamped to the scale format's range (UE8M0: 2^−127..2^127). A zero block
/// (a_b = 0) gets c_b = 1 (UE8M0 code 127), the same zero-block guard as the tensor-scaled
/// rule; its elements are all 0, so x̂ does not depend on that choice.
enum class ScaleRule { TensorScaled, MxTe, MxOcp };
/// "tensor-scaled", "mx-te", "mx-ocp". Throws std::invalid_argument naming the value.
ScaleRule parse_scale_rule(const std::string& s);
const char* scale_rule_name(ScaleRule r);

/// Four Over Six (4/6) block-scale selection (Cook et al., "Four Over Six: More Accurate NVFP4
/// Quantization with Adaptive Block Scaling", arXiv 2512.02010; Transformer Engine's
/// NVFP4BlockScaling nvfp4_4over6). Each block is quantized twice, with its amax mapped to
/// emax (E2M1: 6) and to emax/1.5 (E2M1: 4), and keeps the candidate of lower error, summed in
/// FP32 over the block: Off (default, "off") = one candidate, the contract's steps; MAE ("mae")
/// = Σ|x̂ − x|; MSE ("mse") = Σ(x̂ − x)². Exact operation order and tie rule (map-to-6 wins):
/// docs/numerics.md "Four Over Six". Needs the tensor-scaled rule (refused with the MX rules).
enum class FourOverSix { Off, MAE, MSE };
/// "off", "mae", "mse". Throws std::invalid_argument naming the value and the choices.
FourOverSix parse_four_over_six(const std::string& s);
const char* four_over_six_name(FourOverSix f);

/// The largest block length (1-D) or tile side (2-D) fp4train accepts anywhere: recipes
/// ([fp4] block), `fp4train quant` / `gemm --block` and the Python quantize functions. The
/// formats in use have 16 or 32; 256 leaves room for studies and bounds the scratch of a block.
inline constexpr int kMaxBlock = 256;

/// "" if `block` is a valid block length (1..kMaxBlock), else why not: "must be an integer in
/// 1..256 (as a recipe's fp4.block), got N", for the caller to prefix with the option or
/// argument that gave it (`quant --block`, `gemm --a-block`, Python's `block`).
std::string block_length_error(int block);

/// How one operand is quantized.
struct BlockQuantSpec {
  ScaleFormat scale_format = ScaleFormat::UE5M3;
  int block = 16;        ///< block length along the last dim (1-D), or tile side (2-D)
  bool two_d = false;    ///< block × block tiles (weights) instead of 1 × block
  float target = 448.f;  ///< scale target T
  Rounding rounding = Rounding::RNE;  ///< element rounding (scales are always RNE)
  ElementFormat element{};  ///< element format (default E2M1: the contract's behaviour)
  ScaleRule scale_rule = ScaleRule::TensorScaled;
  /// A block-scale format outside the ScaleFormat enum (e.g. ue4m3, ue6m2; see
  /// parse_block_scale_format). When non-null it overrides scale_format. Must point to a
  /// descriptor of static lifetime (every FloatFormat from parse_float_format is).
  const FloatFormat* scale_desc = nullptr;
  /// Four Over Six block-scale selection (FourOverSix; Off = the contract's single scale).
  FourOverSix four_over_six = FourOverSix::Off;

  /// Field-wise equality (floats by ==), for round-trip checks (tests/fuzz/).
  bool operator==(const BlockQuantSpec&) const = default;
};

/// The effective block-scale format of a spec: *scale_desc if set, else the enum's descriptor.
const FloatFormat& spec_scale_format(const BlockQuantSpec& spec);
/// Choose the block-scale format by name (parse_block_scale_format): the four ScaleFormat
/// conventions set scale_format and clear scale_desc; any other (ue4m3, ue6m2, ...) sets
/// scale_desc. Throws std::invalid_argument naming the value.
void set_scale_format(BlockQuantSpec& spec, const std::string& name);

/// A quantized operand, unpacked for inspection: one element code per byte (E2M1: 4 bits,
/// sign in bit 3; other floats: sign in the top bit of their width; integers: two's complement).
/// Shapes: x is [rows, cols]; blocks form a grid [block_rows, block_cols] with
/// block_rows = rows (1-D) or ceil(rows / block) (2-D), block_cols = ceil(cols / block).
struct QuantizedTensor {
  int64_t rows = 0, cols = 0;
  BlockQuantSpec spec;
  float g = 0.f;   ///< tensor reference amax used
  float ge = 1.f;  ///< tensor encode scale (T·emax)/g (E2M1: (T·6)/g), 1 if g == 0, capped
                   ///< at FLT_MAX; 1 under the MX scale rules
  float gd = 1.f;  ///< tensor decode scale 1/ge
  int64_t block_rows = 0, block_cols = 0;
  std::vector<float> block_amax;     ///< a_b, [block_rows, block_cols]
  std::vector<uint8_t> scale_codes;  ///< c_b encoded in spec_scale_format(spec)
  std::vector<float> scales;         ///< c_b decoded (after the zero → 1 guard)
  std::vector<uint8_t> codes;        ///< element codes (spec.element), [rows, cols]
  /// Row-scaled operand (quantize_blocks_rows; docs/numerics.md "Tensor reference g", "Per-row
  /// reference"): one reference per row, [rows] each, and then g = 0, ge = gd = 1 above are
  /// unused. Empty for the per-tensor case (every other quantizer).
  std::vector<float> row_g, row_ge, row_gd;
};

/// max |x_i| over n FP32 values (0 for n == 0). Throws std::invalid_argument if any value is
/// NaN or Inf (the message gives the first such index) or n < 0.
float tensor_amax(const float* x, int64_t n);

/// Quantize x [rows, cols] (row-major FP32) with tensor reference g ≥ 0 (finite).
/// `sr` supplies random bytes when spec.rounding == SR8: element (i, j) uses
/// sr_byte(*sr, i·cols + j). `sr` may be null for RNE.
/// Throws std::invalid_argument on block ≤ 0, negative shape, negative/non-finite g,
/// target T ≤ 0 or non-finite, null sr with SR8, or non-finite x (the message gives the
/// first bad index). Also throws std::invalid_argument for an element format that is not
/// signed / not a valid integer grid, a scale format that cannot represent 1.0, or an MX scale
/// rule with a scale format that is not a power of two (frac_bits ≠ 0).
/// Scales are always RNE under the tensor-scaled rule; UE8M0 there goes through the same steps
/// (RNE power-of-two scale, tensor scale kept). The MXFP4 rules are spec.scale_rule (ScaleRule);
/// under them g and T are validated but unused.
/// With spec.four_over_six (docs/numerics.md "Four Over Six") c_b is the lower-error of two
/// candidates; throws std::invalid_argument for 4/6 under an MX scale rule.
/// Elements: round x·e_b onto spec.element's grid (RNE or SR8), saturating to ±emax (int4:
/// +7, −8). Edge case: if e_b = 1/d_b overflows to +Inf (tiny g and tiny blocks), x·e_b
/// saturates to ±emax and 0·Inf is taken as 0. Parallel over block-rows (OpenMP); bits do not
/// depend on the thread count.
QuantizedTensor quantize_blocks(const float* x, int64_t rows, int64_t cols,
                                const BlockQuantSpec& spec, float g, const SrKey* sr);

/// x̂ = q · d_b with d_b = c_b · gd, written to out [rows, cols].
/// Throws std::invalid_argument if the QuantizedTensor's vectors/shapes are inconsistent, or
/// (element formats other than E2M1, whose codes use only their low 4 bits) a code is not a
/// valid code of spec.element.
void dequantize(const QuantizedTensor& q, float* out);

/// Throws std::invalid_argument if x̂ = dequantize(q) (xhat [rows, cols]) of the finite input
/// x [rows, cols] holds ±Inf. Only the mx-te rule (docs/formats.md) does that, because it never
/// clips: a block with amax above 6·2^125 ≈ 2.55e38 gets the scale 2^126, an element x with
/// |x| ≥ 3.5·2^126 ≈ 2.98e38 rounds (RNE) to ±4, and 4·2^126 = 2^128 overflows FP32 (under
/// SR8, |x| above 3·2^126 may round up to 4). The message names `where`, the element [row,
/// col] and its value, its block [row, col], the block amax and scale, and why. The fused
/// quantizers (quantize_dequantize and its fast twin) return the IEEE ±Inf instead. Throws
/// nothing when every x̂ is finite.
void check_dequantized_finite(const char* where, const QuantizedTensor& q, const float* x,
                              const float* xhat);

/// Fused quantize → dequantize into out [rows, cols] (may alias x). Bit-identical to
/// dequantize(quantize_blocks(x, ...)), without materialising codes. Same errors; out may
/// alias x exactly (not partially). If it throws, out is left partly written.
void quantize_dequantize(const float* x, int64_t rows, int64_t cols, const BlockQuantSpec& spec,
                         float g, const SrKey* sr, float* out);

/// q·c_b of a QuantizedTensor into out [rows, cols]: dequantize with the tensor decode scale left
/// out (d_b = c_b · 1 = c_b exactly), the block-scaled operand of the decoded-BF16 GEMM. Throws
/// what dequantize throws, and std::invalid_argument for a row-scaled tensor (row_gd set: one
/// decode scale per row, not per tensor).
void dequantize_block_scaled(const QuantizedTensor& q, float* out);

/// The tensor decode scale gd of quantize_blocks(x, ·, spec, g, ·) without quantizing:
/// 1/ge with ge = (T·emax)/g (1 for g == 0, capped at FLT_MAX) under the tensor-scaled rule,
/// exactly 1 under the MX rules (docs/numerics.md "Quantizing one operand"). Throws
/// std::invalid_argument for a negative/NaN/Inf g, T ≤ 0 or non-finite, or an invalid element
/// format (as quantize_blocks).
float tensor_decode_scale(const BlockQuantSpec& spec, float g);

/// The block-scaled operand of the decoded-BF16 GEMM (docs/gemm.md "Decoded FP4 on the BF16
/// GEMM"): out [rows, cols] = q · c_b, each element's code decoded times its block's scale, the
/// tensor decode scale gd left out (x̂ = (q · c_b) · gd up to the rounding of d_b = c_b · gd).
/// Exactly dequantize_block_scaled(quantize_blocks(x, rows, cols, spec, g, sr)): the
/// codes and scales are quantize_blocks' (e_b = 1/(c_b · gd) as ever). For E2M1 elements with
/// UE5M3 or E4M3 scales every value is exact in BF16. Same errors as quantize_blocks; out
/// must not overlap x. Row-scaled operands are not covered (one gd per tensor).
void quantize_block_scaled(const float* x, int64_t rows, int64_t cols, const BlockQuantSpec& spec,
                           float g, const SrKey* sr, float* out);

// ---- Per-row reference (row-scaled operand; docs/numerics.md "Tensor reference g", "Per-row
// reference"; Transformer Engine's NVFP4 `row_scaled_activation`).

/// out[r] = max_c |x[r, c]| for x [rows, cols] (row-major FP32), out [rows]; exact (a max).
/// Throws NonFiniteError naming the first non-finite element, std::invalid_argument on a
/// negative shape. The scalar twin of row_amax_fast (quant_fast.h).
void row_amax(const float* x, int64_t rows, int64_t cols, float* out);

/// quantize_blocks with one tensor reference per row: row r uses g_r = row_g[r] (≥ 0, finite)
/// in every step of docs/numerics.md "Quantizing one operand" (ge_r = fl(fl(T·emax)/g_r), 1 if
/// g_r == 0, min FLT_MAX; gd_r = fl(1/ge_r); mult_r = fl(ge_r·fl(1/emax)); c_b, d_b = c_b·gd_r,
/// e_b, q as there). x [rows, cols], row_g [rows]. Fills q.row_g / row_ge / row_gd ([rows]);
/// q.g = 0, q.ge = q.gd = 1 are unused. Needs 1-D blocks (spec.two_d false: a tile spans rows)
/// and the tensor-scaled rule (the MX rules have no tensor scale); throws std::invalid_argument
/// naming the problem otherwise, for a bad row_g[r] (naming r), and for what quantize_blocks
/// throws. SR8 as quantize_blocks.
QuantizedTensor quantize_blocks_rows(const float* x, int64_t rows, int64_t cols,
                                     const BlockQuantSpec& spec, const float* row_g,
                                     const SrKey* sr);

/// Fused quantize → dequantize with one reference per row: bit-identical to
/// dequantize(quantize_blocks_rows(...)) into out [rows, cols] (may alias x exactly). Same
/// errors. With every row_g[r] = g it equals quantize_dequantize(..., g, ...) bit for bit.
void quantize_dequantize_rows(const float* x, int64_t rows, int64_t cols,
                              const BlockQuantSpec& spec, const float* row_g, const SrKey* sr,
                              float* out);

/// Tensor reference of one (layer, role): current amax (D = 1) or periodic sample-and-hold
/// (docs/numerics.md "Tensor reference g"). At 1-based step t the held value is refreshed iff
/// the cache is empty or t − t_last ≥ D; several calls within one step reuse that step's value.
class TensorReference {
 public:
  /// Throws std::invalid_argument if interval < 1.
  explicit TensorReference(int interval = 1);
  /// The reference for step t; calls `current_amax()` (any callable returning float) only
  /// when refreshing. A template, not std::function, so that no call allocates.
  template <class F>
  float get(int64_t step, F&& current_amax) {
    if (!has_ || step - t_last_ >= interval_) {
      g_ = current_amax();
      t_last_ = step;
      has_ = true;
    }
    return g_;
  }
  /// Refresh to v at step t unconditionally (a per-call D = 1 reference); returns v.
  float set(int64_t step, float v) {
    g_ = v, t_last_ = step, has_ = true;
    return v;
  }
  bool has_value() const { return has_; }
  int64_t last_refresh() const { return t_last_; }
  float held() const { return g_; }
  int interval() const { return interval_; }
  void reset() { has_ = false; }
  /// Restore a saved state (checkpoint resume): has_value(), last_refresh(), held().
  void restore(bool has_value, int64_t last_refresh, float held) {
    has_ = has_value, t_last_ = last_refresh, g_ = held;
  }

 private:
  int interval_;
  bool has_ = false;
  int64_t t_last_ = 0;
  float g_ = 0.f;
};

namespace detail {
/// Throws NonFiniteError "<where>: element i is NaN|Inf (inputs must be finite)" for the first
/// non-finite element of x [n]; the one message of every quantizer and amax kernel.
[[noreturn]] void throw_non_finite(const char* where, const float* x, int64_t n);

/// The argument checks shared by every block quantizer (scalar and SIMD), throwing
/// std::invalid_argument prefixed with `where`: negative shape, block ≤ 0, g negative/NaN/Inf,
/// T ≤ 0 or non-finite, SR8 without a key, unsupported element or scale format.
void validate_block_quant(const char* where, int64_t rows, int64_t cols, const BlockQuantSpec& spec,
                          float g, const SrKey* sr);

/// The two Four Over Six candidate block scales of a block with amax a_b ≥ 0 (docs/numerics.md
/// "Four Over Six"): base = fl(fl(a_b / emax)·ge), c6 = RNE onto the scale grid (fraction bits
/// `frac`, exponent floor `emin`, max `smax`) of min(base, smax), c4 the same of fl(base·1.5);
/// each 0 → 1 (zero guard). The one home of these steps for the scalar quantizer and its SIMD
/// twin. Throws nothing.
struct FourOverSixCandidates {
  float c4, c6;
};
FourOverSixCandidates four_over_six_candidates(float a_b, float ge, float emax, int frac, int emin,
                                               float smax);
/// validate_block_quant for a per-row reference: also 1-D blocks, the tensor-scaled rule, and
/// every row_g[r] finite and ≥ 0 (the message names r). row_g may be null only if rows == 0.
void validate_row_quant(const char* where, int64_t rows, int64_t cols, const BlockQuantSpec& spec,
                        const float* row_g, const SrKey* sr);
}  // namespace detail

}  // namespace fp4
