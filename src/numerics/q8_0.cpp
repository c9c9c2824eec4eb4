// llama.cpp's Q8_0 activation quantization (fp4/numerics/q8_0.h).
#include "fp4/numerics/q8_0.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace fp4 {

float round_fp16(float x) {
  if (std::isnan(x)) return x;
  const float a = std::fabs(x);
  // binary16: 10 fraction bits, normals from 2^-14, subnormals in steps of 2^-24, max 65504;
  // values from 65520 (the midpoint to 2^16) round to Inf.
  if (a >= 65520.0f) return std::copysign(INFINITY, x);
  int e = 0;
  std::frexp(a, &e);                     // a = m·2^e, m in [0.5, 1)
  const int exp = std::max(e - 1, -14);  // exponent of the binade (subnormals share 2^-14's)
  const float ulp = std::ldexp(1.0f, exp - 10);
  // a / ulp is exact (a power-of-two division); nearbyint rounds half to even.
  const float r = std::nearbyint(a / ulp) * ulp;
  return std::copysign(r, x);
}

void q8_0_quantize_dequantize(const float* x, int64_t rows, int64_t cols, float* out) {
  constexpr int64_t kBlock = 32;
  if (rows < 0 || cols <= 0 || cols % kBlock != 0)
    throw std::invalid_argument("q8_0_quantize_dequantize: cols (" + std::to_string(cols) +
                                ") must be a positive multiple of 32, rows (" +
                                std::to_string(rows) + ") non-negative");
  const int64_t n = rows * cols;
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i]))
      throw std::invalid_argument("q8_0_quantize_dequantize: non-finite value at index " +
                                  std::to_string(i));
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    float amax = 0.0f;
    for (int64_t j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(x[b0 + j]));
    const float d = round_fp16(amax / 127.0f);
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int64_t j = 0; j < kBlock; ++j) {
      const float q = std::nearbyint(x[b0 + j] * id);  // default rounding mode: ties to even
      out[b0 + j] = q * d;
    }
  }
}

}  // namespace fp4
