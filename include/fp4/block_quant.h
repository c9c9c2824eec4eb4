// Block-scaled FP4 quantization of one GEMM operand: E2M1 elements, one 8-bit block scale
// per block (1-D blocks along the contraction dim or 2-D tiles for weights), one FP32
// tensor scale from a tensor reference amax g.
// Contract: shared/NUMERICS.md "Quantizing one operand" (exact FP32 operation order).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "fp4/format.h"
#include "fp4/philox.h"

namespace fp4 {

/// How one operand is quantized.
struct BlockQuantSpec {
  ScaleFormat scale_format = ScaleFormat::UE5M3;
  int block = 16;        ///< block length along the last dim (1-D), or tile side (2-D)
  bool two_d = false;    ///< block × block tiles (weights) instead of 1 × block
  float target = 448.f;  ///< scale target T
  Rounding rounding = Rounding::RNE;  ///< element rounding (scales are always RNE)
};

/// A quantized operand, unpacked for inspection: one E2M1 code per byte.
/// Shapes: x is [rows, cols]; blocks form a grid [block_rows, block_cols] with
/// block_rows = rows (1-D) or ceil(rows / block) (2-D), block_cols = ceil(cols / block).
struct QuantizedTensor {
  int64_t rows = 0, cols = 0;
  BlockQuantSpec spec;
  float g = 0.f;   ///< tensor reference amax used
  float ge = 1.f;  ///< tensor encode scale (T·6)/g, 1 if g == 0, capped at FLT_MAX
  float gd = 1.f;  ///< tensor decode scale 1/ge
  int64_t block_rows = 0, block_cols = 0;
  std::vector<float> block_amax;     ///< a_b, [block_rows, block_cols]
  std::vector<uint8_t> scale_codes;  ///< c_b encoded in spec.scale_format
  std::vector<float> scales;         ///< c_b decoded (after the zero → 1 guard)
  std::vector<uint8_t> codes;        ///< E2M1 codes, [rows, cols]
};

/// max |x_i| over n FP32 values (0 for n == 0). Throws std::invalid_argument if any value is
/// NaN or Inf (the message gives the first such index) or n < 0.
float tensor_amax(const float* x, int64_t n);

/// Quantize x [rows, cols] (row-major FP32) with tensor reference g ≥ 0 (finite).
/// `sr` supplies random bytes when spec.rounding == SR8: element (i, j) uses
/// sr_byte(*sr, i·cols + j). `sr` may be null for RNE.
/// Throws std::invalid_argument on block ≤ 0, negative shape, negative/non-finite g,
/// target T ≤ 0 or non-finite, null sr with SR8, or non-finite x (the message gives the
/// first bad index). Scales are always RNE; UE8M0 goes through the same steps (RNE power-of-two
/// scale, tensor scale kept) — the MXFP4-specific scale rules are not implemented here.
/// Edge case: if e_b = 1/d_b overflows to +Inf (tiny g and tiny blocks), x·e_b saturates to
/// ±6 and 0·Inf is taken as 0. Parallel over block-rows (OpenMP); bits do not depend on the
/// thread count.
QuantizedTensor quantize_blocks(const float* x, int64_t rows, int64_t cols,
                                const BlockQuantSpec& spec, float g, const SrKey* sr);

/// x̂ = q · d_b with d_b = c_b · gd, written to out [rows, cols].
/// Throws std::invalid_argument if the QuantizedTensor's vectors/shapes are inconsistent.
void dequantize(const QuantizedTensor& q, float* out);

/// Fused quantize → dequantize into out [rows, cols] (may alias x). Bit-identical to
/// dequantize(quantize_blocks(x, ...)), without materialising codes. Same errors; out may
/// alias x exactly (not partially). If it throws, out is left partly written.
void quantize_dequantize(const float* x, int64_t rows, int64_t cols, const BlockQuantSpec& spec,
                         float g, const SrKey* sr, float* out);

/// Tensor reference of one (layer, role): current amax (D = 1) or periodic sample-and-hold
/// (NUMERICS.md "Tensor reference g"). At 1-based step t the held value is refreshed iff
/// the cache is empty or t − t_last ≥ D; several calls within one step reuse that step's value.
class TensorReference {
 public:
  /// Throws std::invalid_argument if interval < 1.
  explicit TensorReference(int interval = 1);
  /// The reference for step t; calls `current_amax` only when refreshing.
  float get(int64_t step, const std::function<float()>& current_amax);
  bool has_value() const { return has_; }
  int64_t last_refresh() const { return t_last_; }
  float held() const { return g_; }
  int interval() const { return interval_; }
  void reset() { has_ = false; }

 private:
  int interval_;
  bool has_ = false;
  int64_t t_last_ = 0;
  float g_ = 0.f;
};

}  // namespace fp4
