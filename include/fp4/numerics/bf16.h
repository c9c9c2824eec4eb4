// FP32 → BF16 bit patterns (round-to-nearest-even), the operand format of fp4::gemm_bf16.
#pragma once
#include <bit>
#include <cstdint>

namespace fp4 {

/// BF16 bit pattern of `x` rounded to nearest even: the upper 16 bits of fp4::round_bf16(x)
/// (format.h). NaN stays NaN (sign and top payload kept, quiet bit forced); finite values
/// above the BF16 range round to ±Inf as in IEEE; subnormals are rounded, never flushed.
inline uint16_t bf16_bits(float x) {
  uint32_t b = std::bit_cast<uint32_t>(x);
  const uint32_t nan = (b | 0x00400000u) >> 16;
  const uint32_t rne = (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((b & 0x7FFFFFFFu) > 0x7F800000u ? nan : rne);
}

/// FP32 value of a BF16 bit pattern (exact).
inline float bf16_value(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }

/// out[i] = bf16_bits(in[i]) for i in [0, n): in [n] FP32, out [n] BF16 bit patterns (may not
/// alias in). Branch-free integer code vectorised by the compiler (AVX-512 / AVX2 clones
/// picked at load time), OpenMP over fixed element ranges; elementwise, so the bits never
/// depend on the thread count or the target. n ≤ 0 does nothing.
void to_bf16_bits(const float* in, int64_t n, uint16_t* out);
/// out[i] = bf16_value(bf16_bits(in[i])) (= fp4::round_bf16, format.h) for i in [0, n): the
/// recipe's BF16 boundary and BF16 outputs (docs/numerics.md "BF16 boundary"), FP32 in and out;
/// `out` may be `in` (in place). Vectorised and threaded as to_bf16_bits; bits never depend on
/// the thread count or the target. n ≤ 0 does nothing.
void round_bf16_array(const float* in, int64_t n, float* out);
/// acc[i] += bf16_value(bf16_bits(in[i])) for i in [0, n) (one FP32 RNE addition per element):
/// a linear's own dX rounded to BF16 and added to the input gradient others may share.
/// `in` must not alias `acc`. Vectorised and threaded as to_bf16_bits. n ≤ 0 does nothing.
void add_round_bf16_array(const float* in, int64_t n, float* acc);

}  // namespace fp4
