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

/// Counter tag (last counter word, low 16 bits) of the MS-EDEN scale-SR stream: "ED".
inline constexpr uint32_t kEdenTag = 0x4544u;

/// Uniform u ∈ [0, 1) number `index` of the MS-EDEN scale-SR stream of `key` (one per block
/// scale, index = row-major block index; docs/numerics.md "MS-EDEN (Quartet II)"):
/// Philox4x32-10 with sr_byte's key and counter (index / 4, step, layer·2^8 + operand·2^4 +
/// gemm, micro·2^16 + kEdenTag), w = 32-bit word index % 4 of the output, u = (w >> 8)·2^−24
/// (24 random bits, exact in FP32). The tag differs from the element SR's 0x5352, so the two
/// streams never share a Philox block. Streams are distinct for the first 2^34 scales.
float eden_uniform(const SrKey& key, uint64_t index);

}  // namespace fp4
