// Counter-based random bits for stochastic rounding (Random123 Philox4x32-10, the
// generator cuRAND uses). docs/numerics.md: random bits keyed by (seed, step, layer, operand,
// GEMM, element), so results do not depend on thread count or scheduling.
#pragma once
#include <cstdint>

namespace fp4 {

/// Identifies one stream of SR random bytes. Byte `i` of the stream (element index i of the
/// quantized operand, row-major over the operand as quantized) is a pure function of
/// (seed, step, layer, operand, gemm, i).
struct SrKey {
  uint64_t seed = 0;
  uint32_t step = 0;     ///< 1-based optimizer step
  uint32_t layer = 0;    ///< linear-layer index in the model
  uint32_t operand = 0;  ///< 0 = X, 1 = W, 2 = dY
  uint32_t gemm = 0;     ///< 0 = fprop, 1 = dgrad, 2 = wgrad
  uint32_t micro = 0;    ///< micro-batch index within the step (global over ranks), < 2^16
};

/// The random byte for element `index` of stream `key`: Philox4x32-10 with key
/// (seed low, seed high) and counter (index / 16, step, layer·2^8 + operand·2^4 + gemm,
/// micro·2^16 + 0x5352 "SR"), byte index % 16 of the 128-bit output (little-endian words).
uint8_t sr_byte(const SrKey& key, uint64_t index);

/// Fill out[0..n) with sr_byte(key, first + j). Faster than n calls (one Philox call per
/// 16 bytes); identical bytes.
void sr_bytes(const SrKey& key, uint64_t first, uint64_t n, uint8_t* out);

}  // namespace fp4
