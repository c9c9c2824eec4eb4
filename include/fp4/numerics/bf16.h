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

}  // namespace fp4
