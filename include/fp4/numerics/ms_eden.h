// MS-EDEN quantization of one backward-GEMM operand, the backward quantizer of Quartet II
// (Panferov, Schultheis, Tabesh, Alistarh 2026, arXiv 2601.22813; code IST-DASLab/Quartet-II,
// src/models/quantization/schemes/quartet_2.py, eden_1x16s_fp4_kernel): NVFP4 (E2M1 elements
// rounded to nearest with ties away, E4M3 block scales of 16 elements, an FP32 tensor scale
// with Quartet II's reduced scale maximum) of an operand already Hadamard-transformed along its
// inner (contraction) dim, with EDEN's correction Σx²/Σx·q per Hadamard group applied to the
// group's block scales, which are then rounded stochastically onto E4M3.
// Contract: docs/numerics.md "MS-EDEN (Quartet II)" (the exact FP32 operation order).
#pragma once
#include <cstdint>
#include <vector>

#include "fp4/numerics/philox.h"

namespace fp4 {

/// Quartet II's val_max = 6 / backward_scale_override with backward_scale_override
/// = (17/16)·0.93 (quartet_2.py, Quartet_II_fn): the division done in double (Python folds the
/// constexpr), then rounded to FP32 as the kernel uses it: 6.0721… .
inline constexpr float kMsEdenValMax = static_cast<float>(6.0 / (17.0 / 16.0 * 0.93));

/// The constants of one MS-EDEN quantization (defaults: Quartet II's).
struct MsEdenSpec {
  int block = 16;  ///< elements per E4M3 block scale, along cols (Quartet II group_size 16)
  /// Elements per EDEN correction group along cols = the Hadamard size (Quartet II's sweep:
  /// hadamard_dim 128; its research Linear defaults to 32). A multiple of block, ≤ 256.
  int group = 128;
  float scale_max = 255.99f;      ///< scales_max: below E4M3's 448, room for the correction
  float val_max = kMsEdenValMax;  ///< element maximum of the scale formulas (6/override)

  /// Field-wise equality (floats by ==).
  bool operator==(const MsEdenSpec&) const = default;
};

/// One MS-EDEN-quantized operand [rows, cols]; blocks [rows, block_cols], groups
/// [rows, group_cols]. x̂ = fl(fl(q · scale_b) · s_dec) (ms_eden_dequantize).
struct MsEdenQuantized {
  int64_t rows = 0, cols = 0;
  MsEdenSpec spec;
  float g = 0.f;      ///< tensor reference amax (of the transformed operand)
  float s_dec = 1.f;  ///< tensor decode scale fl(fl(g / scale_max) / val_max); 1 if g == 0
  int64_t block_cols = 0, group_cols = 0;
  std::vector<uint8_t> codes;        ///< E2M1 codes (RNA), [rows, cols], sign in bit 3
  std::vector<float> block_scales;   ///< c_b: RNE E4M3 block scale before EDEN (0 → 1 guard)
  std::vector<float> correction;     ///< EDEN factor of each group, [rows, group_cols]
  std::vector<float> corrected;      ///< fl(c_b · correction), before the scale SR
  std::vector<float> scales;         ///< final block scales (E4M3 values after the SR)
  std::vector<uint8_t> scale_codes;  ///< their E4M3 codes
};

/// MS-EDEN quantization of x [rows, cols] (row-major FP32, finite), already Hadamard-transformed
/// along cols in groups of spec.group, with tensor reference g ≥ 0 (Quartet II: the current
/// amax of the transformed operand) and the scale-SR stream `key` (eden_uniform; block scale
/// (r, b) draws number r·block_cols + b). Steps and FP32 order: docs/numerics.md "MS-EDEN
/// (Quartet II)". OpenMP over rows; bits do not depend on the thread count.
/// Throws std::invalid_argument for a negative shape, block ≤ 0, group not a positive multiple
/// of block or above 256, cols % group ≠ 0, g negative/NaN/Inf, scale_max or val_max not
/// positive and finite; fp4::NonFiniteError (naming the first bad index) for NaN/Inf in x.
MsEdenQuantized ms_eden_quantize(const float* x, int64_t rows, int64_t cols, const MsEdenSpec& spec,
                                 float g, const SrKey& key);

/// x̂ [rows, cols] of q: fl(fl(e2m1(code) · scales[b]) · s_dec), Quartet II's order
/// (x_fp4 * scales * s_dec). Throws std::invalid_argument if q's vectors do not match its shape.
void ms_eden_dequantize(const MsEdenQuantized& q, float* out);

/// The scale maximum of Quartet II's forward quantizer (scales_max = 447.99 in
/// rtn_1x16s_fp4_kernel, src/models/quantization/quantizers/nvfp4_triton.py), as FP32.
inline constexpr float kQuartetRtnScaleMax = 447.99f;

/// Quartet II's forward quantizer, quantize-dequantize: x̂ [rows, cols] of x [rows, cols]
/// (row-major FP32, finite) with tensor reference g ≥ 0 (Quartet II: the current amax of the
/// whole tensor, x.abs().max()). Blocks of 16 along cols (a ragged last block takes the
/// remaining columns), E4M3 block scales, E2M1 elements rounded to nearest with ties away
/// (its threshold comparisons), in rtn_1x16s_fp4_kernel's FP32 order with scale_override 1
/// (Quartet_II_fn.forward_scale_override):
///   s_dec = fl(fl(g / 447.99) / 6), 1 if g == 0;  c_b = RNE_E4M3(fl(fl(a_b / 6) / s_dec)), 0 → 1;
///   d_b = fl(c_b · s_dec);  q = RNA_E2M1(fl(x / d_b));  x̂ = fl(q · d_b).
/// docs/numerics.md "Quartet II's forward quantizer". `in` and `out` may alias. OpenMP over rows;
/// bits do not depend on the thread count. Throws std::invalid_argument for a negative shape or
/// g negative/NaN/Inf; fp4::NonFiniteError (naming the first bad index) for NaN/Inf in x.
void quartet_rtn_quantize_dequantize(const float* x, int64_t rows, int64_t cols, float g,
                                     float* out);

/// Quartet II's stochastic rounding of a corrected scale c ≥ 0 (or +Inf) onto E4M3 with a
/// uniform u ∈ [0, 1): n = RNE_E4M3(c) (saturating at 448); if n > c the neighbours are
/// (code(n) − 1, n), else (n, code(n) + 1); p = fl(fl(c − down) / fl(up − down));
/// result up if u < p, else down. c ≥ 448 (no code above) gives 448. E[result] = c up to the
/// 2^−24 resolution of u. Throws std::invalid_argument for negative or NaN c.
float ms_eden_round_scale(float c, float u);

}  // namespace fp4
