// 16-point random Hadamard transform of the NVFP4 recipe's wgrad operands.
// Contract: docs/numerics.md "Random Hadamard transform".
#include "fp4/numerics/hadamard.h"

#include <stdexcept>
#include <string>

#include "fp4/numerics/format.h"

namespace fp4 {

const float kRhtSigns[16] = {+1.f, +1.f, +1.f, -1.f, +1.f, -1.f, -1.f, -1.f,
                             -1.f, -1.f, -1.f, +1.f, -1.f, +1.f, -1.f, -1.f};

namespace {

/// One chunk: y = (x ⊙ s)·H16 / 4. The product with the Sylvester matrix is computed by the
/// four-stage fast Walsh–Hadamard butterfly (a, b) → (a + b, a − b), which yields the natural
/// (Sylvester) order H[i][j] = (−1)^popcount(i & j); H16 is symmetric, so row-vector times H
/// equals H times column vector. The final /4 is an exact scaling by 0.25. docs/numerics.md
/// "Random Hadamard transform" states this order (the papers fix none).
template <bool kBf16>
inline void rht16_chunk(float* x) {
  float y[16];
  for (int i = 0; i < 16; ++i) y[i] = (kBf16 ? round_bf16(x[i]) : x[i]) * kRhtSigns[i];
  for (int h = 1; h < 16; h <<= 1) {
    for (int i = 0; i < 16; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        const float a = y[j], b = y[j + h];
        y[j] = a + b;
        y[j + h] = a - b;
      }
    }
  }
  for (int i = 0; i < 16; ++i) x[i] = kBf16 ? round_bf16(y[i] * 0.25f) : y[i] * 0.25f;
}

template <bool kBf16>
void rht16_rows_t(const char* where, float* x, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0) throw std::invalid_argument(std::string(where) + ": negative shape");
  if (cols % 16 != 0) {
    throw std::invalid_argument(std::string(where) + ": cols = " + std::to_string(cols) +
                                " is not a multiple of 16 (the RHT works on 16-long chunks)");
  }
#pragma omp parallel for schedule(static) if (rows * cols >= (int64_t{1} << 16))
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * cols;
    for (int64_t c = 0; c < cols; c += 16) rht16_chunk<kBf16>(row + c);
  }
}

}  // namespace

void rht16_rows(float* x, int64_t rows, int64_t cols) {
  rht16_rows_t<false>("rht16_rows", x, rows, cols);
}

void rht16_rows_bf16(float* x, int64_t rows, int64_t cols) {
  rht16_rows_t<true>("rht16_rows_bf16", x, rows, cols);
}

void rht16_rows(float* x, int64_t rows, int64_t cols, RhtPrecision precision) {
  if (precision == RhtPrecision::BF16) return rht16_rows_bf16(x, rows, cols);
  rht16_rows(x, rows, cols);
}

const char* rht_precision_name(RhtPrecision p) { return p == RhtPrecision::BF16 ? "bf16" : "fp32"; }

RhtPrecision parse_rht_precision(const std::string& s) {
  if (s == "fp32") return RhtPrecision::FP32;
  if (s == "bf16") return RhtPrecision::BF16;
  throw std::invalid_argument("unknown RHT precision '" + s + "' (valid choices: fp32, bf16)");
}

}  // namespace fp4
