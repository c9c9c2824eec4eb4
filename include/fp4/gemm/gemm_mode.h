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

}  // namespace fp4
