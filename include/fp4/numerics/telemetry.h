// Numerics telemetry of one quantized operand: why a recipe is stable or not.
// The fields: docs/evaluation.md "Numerics telemetry"; definitions follow docs/numerics.md
// "Quantizing one operand" and "Tensor reference g".
#pragma once
#include <array>
#include <cstdint>

#include "fp4/numerics/block_quant.h"
#include "fp4/numerics/format.h"

namespace fp4 {

struct QuantStats {
  double saturated_blocks = 0;  ///< fraction of blocks whose needed scale a_b·T/g (a_b·ge/6) rounds above the scale format's max (clipped)
  double zero_guard_blocks = 0; ///< fraction of blocks with a_b > 0 whose scale rounded to 0
                                ///< and was replaced by 1 (underflow; all-zero blocks excluded;
                                ///< always 0 under the MX scale rules, which have no guard)
  double zeroed_nonzeros = 0;   ///< fraction of nonzero inputs whose E2M1 value is ±0
  double rel_error = 0;         ///< ‖x − x̂‖₂ / ‖x‖₂ (0 for an all-zero x)
  double staleness = 1;         ///< current amax / reference g (1 under current scaling);
                                ///< meaningless, and left at 1, when !has_staleness
  bool has_staleness = true;    ///< false under the MX scale rules: no reference g is used
                                ///< (nor measured), so there is no staleness to report

  // Where the blocks fall (docs/evaluation.md "Numerics telemetry", `scale_hist`): histograms
  // of this one quantization. Merged over micro-batches and ranks they are not: worst_of keeps
  // the first argument's, so a step's histograms are those of its first micro-batch (global
  // micro-batch 0, rank 0's under MPI): the same for any thread or process count, but with
  // micro-batching they cover that one micro-batch only, while the fractions above are the
  // worst over all of them.
  static constexpr int kRatioBins = 128;  ///< log2-ratio bins: floor(log2) in [-96, 31]
  static constexpr int kRatioBias = 96;   ///< bin b is stored at index b + kRatioBias
  /// Blocks per stored block-scale code (QuantizedTensor::scale_codes, in `scale_format`),
  /// counting only blocks with a real scale: not all-zero blocks and not blocks whose scale
  /// underflowed (both store the guard's 1.0, which is not where their scale fell). Those two
  /// are counted in zero_blocks and guarded_blocks; the three sum to the block count.
  std::array<uint32_t, 256> scale_code_blocks{};
  uint32_t zero_blocks = 0;     ///< blocks with a_b = 0
  uint32_t guarded_blocks = 0;  ///< blocks with a_b > 0 whose scale rounded to 0 (the guard)
  /// Blocks with a_b > 0 per bin floor(log2(a_b / r)), clamped to [-96, 31]: r = g, the
  /// tensor reference, under the tensor-scaled rules (ratio_to_g); r = max|x| of this operand
  /// under the MX rules, which have no g. A held g below the current amax gives bins ≥ 0.
  std::array<uint32_t, kRatioBins> log2_amax_ratio_blocks{};
  bool ratio_to_g = true;
  const FloatFormat* scale_format = nullptr;  ///< null until quant_stats fills the histograms
};

/// The worst of two statistics, field by field (max; has_staleness of either): how the
/// micro-batches of a step, and the data-parallel ranks, are merged (exact and
/// order-independent).
inline QuantStats worst_of(const QuantStats& a, const QuantStats& b) {
  QuantStats r;
  r.saturated_blocks = a.saturated_blocks > b.saturated_blocks ? a.saturated_blocks : b.saturated_blocks;
  r.zero_guard_blocks = a.zero_guard_blocks > b.zero_guard_blocks ? a.zero_guard_blocks : b.zero_guard_blocks;
  r.zeroed_nonzeros = a.zeroed_nonzeros > b.zeroed_nonzeros ? a.zeroed_nonzeros : b.zeroed_nonzeros;
  r.rel_error = a.rel_error > b.rel_error ? a.rel_error : b.rel_error;
  r.staleness = a.staleness > b.staleness ? a.staleness : b.staleness;
  r.has_staleness = a.has_staleness || b.has_staleness;
  r.scale_code_blocks = a.scale_code_blocks;  // histograms: the first micro-batch's (above)
  r.zero_blocks = a.zero_blocks;
  r.guarded_blocks = a.guarded_blocks;
  r.log2_amax_ratio_blocks = a.log2_amax_ratio_blocks;
  r.ratio_to_g = a.ratio_to_g;
  r.scale_format = a.scale_format;
  return r;
}

/// floor(log2(v)) of a finite v > 0 (double, exact: from the binary exponent), clamped to
/// [-96, 31], plus kRatioBias: the index of v in QuantStats::log2_amax_ratio_blocks.
int log2_ratio_bin(double v);

/// Statistics of quantizing x [rows, cols] with `spec` and reference g, exactly as
/// quantize_blocks does it (same SR bytes when `sr` is given), any element format. Where the
/// spec has a fused packer (pack_fast_slow_path(spec) empty) the codes come from
/// quantize_pack_fast and the decoded values from dequantize_fast, both bit-identical to the
/// scalar quantize_blocks and dequantize, so the statistics are the same to the last bit.
/// Slow-ish (allocates the unpacked codes and the decoded copy, and sums the error serially);
/// meant for every telemetry_interval steps, not every step.
/// Also fills the two block histograms (scale codes, log2 of a_b / reference).
/// Throws the exception types quantize_blocks throws, on the same inputs (on the fused path
/// the message names quantize_pack_fast).
QuantStats quant_stats(const float* x, int64_t rows, int64_t cols, const BlockQuantSpec& spec,
                       float g, const SrKey* sr);
/// The same for a row-scaled operand (quantize_blocks_rows, row_g [rows]; docs/numerics.md
/// "Per-row reference"): each block's saturation, zero-guard and ratio are taken against its
/// row's reference g_r; no staleness (every g_r is the current amax of its row).
QuantStats quant_stats_rows(const float* x, int64_t rows, int64_t cols, const BlockQuantSpec& spec,
                            const float* row_g, const SrKey* sr);

}  // namespace fp4
