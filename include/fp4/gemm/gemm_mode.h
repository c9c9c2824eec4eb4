// How a quantized GEMM is emulated: the recipe field `[linear] gemm` (docs/numerics.md "GEMM
// emulation"). A header of its own so that recipes (and the parsers' fuzz build) can name the
// mode without the GEMM kernels.
#pragma once
#include <string>

namespace fp4 {

/// Decoded: operands quantized, decoded to FP32 (x̂ = q·d_b) and multiplied by oneDNN's FP32
/// GEMM (the default).
/// ProbeMatched: fp4::probe_gemm, the accumulation order of the reference hardware.
/// DecodedBf16: operands quantized to q·c_b (exact in BF16), multiplied by the BF16 GEMM, the
/// two tensor decode scales applied once to the output (fp4::gemm_block_scaled).
enum class GemmMode { Decoded, ProbeMatched, DecodedBf16 };

/// Parse "decoded", "probe-matched" or "decoded-bf16". Throws std::invalid_argument naming the
/// value and the valid choices.
GemmMode parse_gemm_mode(const std::string& s);
/// Canonical name, inverse of parse_gemm_mode: "decoded", "probe-matched", "decoded-bf16".
const char* gemm_mode_name(GemmMode m);

/// The scale targets T that DecodedBf16 takes for UE8M0 block scales under the tensor-scaled
/// rule, [2^-24, 2^48] (docs/gemm.md "Decoded FP4 on the BF16 GEMM"): there c_b ≈ a_b·T/g is a
/// power of two without a bound of its own, so |q·c_b| ≤ 12·T, and T ≤ 2^48 keeps every sum of
/// up to 2^20 products below FP32's overflow (144·T²·2^20 < 2^127), while T ≥ 2^-24 keeps the
/// products of blocks down to 2^-40 below the tensor amax above 2^-126, where the BF16 units
/// flush. UE5M3 and E4M3 scales (bounded) and the MX rules (no tensor scale) need no band.
inline constexpr float kDecodedBf16MinTarget = 0x1p-24f;
inline constexpr float kDecodedBf16MaxTarget = 0x1p48f;
/// Whether target T lies in that band (the recipe reader and decoded_bf16_gemm both ask).
inline bool decoded_bf16_target_in_band(float t) {
  return t >= kDecodedBf16MinTarget && t <= kDecodedBf16MaxTarget;
}

}  // namespace fp4
