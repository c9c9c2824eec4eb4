// 16-point random Hadamard transform (RHT) of the NVFP4 recipe's wgrad operands.
// Contract: docs/numerics.md "Random Hadamard transform".
#pragma once
#include <cstdint>
#include <string>

namespace fp4 {

/// Arithmetic of the RHT (recipe key fp4.rht_precision; docs/numerics.md "Random Hadamard
/// transform"): FP32 (the default, rht16_rows) or the reference implementation's BF16 matmul
/// with BF16 output (rht16_rows_bf16).
enum class RhtPrecision { FP32, BF16 };
/// "fp32", "bf16".
const char* rht_precision_name(RhtPrecision p);
/// Parse "fp32" | "bf16"; throws std::invalid_argument naming the value and the choices.
RhtPrecision parse_rht_precision(const std::string& s);

/// The fixed sign vector s shared by all layers for the whole run.
extern const float kRhtSigns[16];

/// In place, every 16-long chunk of every row of x [rows, cols] becomes (x ⊙ s) · H16 / 4,
/// H16 the Sylvester Hadamard matrix (H[i][j] = (−1)^popcount(i & j)). The transform is
/// orthogonal, so applying it to both operands along a contraction dim leaves the product
/// unchanged. Throws std::invalid_argument if cols % 16 != 0.
void rht16_rows(float* x, int64_t rows, int64_t cols);

/// The BF16 variant, in place on x [rows, cols] (cols % 16 == 0): every 16-long chunk of every
/// row becomes z = round_bf16(((round_bf16(x) ⊙ s)·H16) · 0.25): inputs rounded to BF16 (RNE),
/// the sign products exact, the same FP32 butterfly (same order) as rht16_rows, the exact ·0.25,
/// and the output rounded to BF16 (RNE, fp4::round_bf16). The values written are BF16 values
/// held in FP32. Throws std::invalid_argument if cols % 16 != 0 or a shape is negative.
void rht16_rows_bf16(float* x, int64_t rows, int64_t cols);

/// rht16_rows or rht16_rows_bf16, by `precision`.
void rht16_rows(float* x, int64_t rows, int64_t cols, RhtPrecision precision);

}  // namespace fp4
