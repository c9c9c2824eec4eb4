// How a quantized GEMM is emulated: the recipe field `[linear] gemm` (docs/numerics.md "GEMM
// emulation"). A header of its own so that recipes (and the parsers' fuzz build) can name the
// mode without the GEMM kernels.
#pragma once
#include <string>

namespace fp4 {

/// Decoded: operands quantized, decoded to FP32 and multiplied by oneDNN (the default).
/// ProbeMatched: fp4::probe_gemm, the accumulation order of the reference hardware.
enum class GemmMode { Decoded, ProbeMatched };

/// Parse "decoded" or "probe-matched". Throws std::invalid_argument naming the value and the
/// valid choices.
GemmMode parse_gemm_mode(const std::string& s);
/// Canonical name, inverse of parse_gemm_mode: "decoded", "probe-matched".
const char* gemm_mode_name(GemmMode m);

}  // namespace fp4
