// Numerics telemetry of one quantized operand: why a recipe is stable or not.
// Issue 3 §5; definitions follow docs/numerics.md "Quantizing one operand" and "Tensor reference g".
#pragma once
#include <cstdint>

#include "fp4/block_quant.h"

namespace fp4 {

struct QuantStats {
  double saturated_blocks = 0;  ///< fraction of blocks whose needed scale a_b·T/(6·g) rounds above the scale format's max (clipped)
  double zero_guard_blocks = 0; ///< fraction of blocks with a_b > 0 whose scale rounded to 0
                                ///< and was replaced by 1 (underflow; all-zero blocks excluded;
                                ///< always 0 under the MX scale rules, which have no guard)
  double zeroed_nonzeros = 0;   ///< fraction of nonzero inputs whose E2M1 value is ±0
  double rel_error = 0;         ///< ‖x − x̂‖₂ / ‖x‖₂ (0 for an all-zero x)
  double staleness = 1;         ///< current amax / reference g (1 under current scaling);
                                ///< meaningless, and left at 1, when !has_staleness
  bool has_staleness = true;    ///< false under the MX scale rules: no reference g is used
                                ///< (nor measured), so there is no staleness to report
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
  return r;
}

/// Statistics of quantizing x [rows, cols] with `spec` and reference g, exactly as
/// quantize_blocks does it (same SR bytes when `sr` is given), any element format. Slow-ish
/// (allocates the unpacked codes); meant for every telemetry_interval steps, not every step.
/// Throws what quantize_blocks throws.
QuantStats quant_stats(const float* x, int64_t rows, int64_t cols, const BlockQuantSpec& spec,
                       float g, const SrKey* sr);

}  // namespace fp4
