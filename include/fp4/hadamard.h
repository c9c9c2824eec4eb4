// 16-point random Hadamard transform (RHT) of the NVFP4 recipe's wgrad operands.
// Contract: shared/NUMERICS.md "Random Hadamard transform".
#pragma once
#include <cstdint>

namespace fp4 {

/// The fixed sign vector s shared by all layers for the whole run.
extern const float kRhtSigns[16];

/// In place, every 16-long chunk of every row of x [rows, cols] becomes (x ⊙ s) · H16 / 4,
/// H16 the Sylvester Hadamard matrix (H[i][j] = (−1)^popcount(i & j)). The transform is
/// orthogonal, so applying it to both operands along a contraction dim leaves the product
/// unchanged. Throws std::invalid_argument if cols % 16 != 0.
void rht16_rows(float* x, int64_t rows, int64_t cols);

}  // namespace fp4
