// Random Hadamard transforms: TE's 16-point RHT and the 16/32/64/128-point generalisation.
// Contract: docs/numerics.md "Random Hadamard transform".
#include "fp4/numerics/hadamard.h"

#include <Random123/philox.h>

#include <cmath>
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

/// One chunk of n (16..128) of hadamard_rows: the butterfly of rht16_chunk with n/2 strides and
/// the scale c instead of 0.25.
template <bool kBf16>
inline void hadamard_chunk(float* x, int n, const float* s, float c) {
  float y[kMaxHadamard];
  for (int i = 0; i < n; ++i) y[i] = (kBf16 ? round_bf16(x[i]) : x[i]) * s[i];
  for (int h = 1; h < n; h <<= 1) {
    for (int i = 0; i < n; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        const float a = y[j], b = y[j + h];
        y[j] = a + b;
        y[j + h] = a - b;
      }
    }
  }
  for (int i = 0; i < n; ++i) x[i] = kBf16 ? round_bf16(y[i] * c) : y[i] * c;
}

void check_size(const char* where, int n) {
  if (!hadamard_size_valid(n))
    throw std::invalid_argument(std::string(where) + ": Hadamard size " + std::to_string(n) +
                                " is not one of 16, 32, 64, 128");
}

}  // namespace

bool hadamard_size_valid(int n) { return n == 16 || n == 32 || n == 64 || n == 128; }

const char* hadamard_signs_name(HadamardSigns p) {
  switch (p) {
    case HadamardSigns::PerLayer: return "per-layer";
    case HadamardSigns::PerStep: return "per-step";
    case HadamardSigns::PerCall: return "per-call";
    case HadamardSigns::Fixed: break;
  }
  return "fixed";
}

HadamardSigns parse_hadamard_signs(const std::string& s) {
  if (s == "fixed") return HadamardSigns::Fixed;
  if (s == "per-layer") return HadamardSigns::PerLayer;
  if (s == "per-step") return HadamardSigns::PerStep;
  if (s == "per-call") return HadamardSigns::PerCall;
  throw std::invalid_argument("unknown Hadamard sign policy '" + s +
                              "' (valid choices: fixed, per-layer, per-step, per-call)");
}

void hadamard_signs(int n, HadamardSigns p, uint64_t seed, uint32_t layer, uint32_t step,
                    float* out, uint32_t micro) {
  check_size("hadamard_signs", n);
  if (p == HadamardSigns::Fixed && n == 16) {
    for (int i = 0; i < 16; ++i) out[i] = kRhtSigns[i];
    return;
  }
  // The key of the policy: Fixed ignores the run (seed, layer, step all 0), PerLayer the step,
  // every policy but PerCall the micro-batch.
  if (p == HadamardSigns::Fixed) seed = 0, layer = 0, step = 0;
  if (p == HadamardSigns::PerLayer) step = 0;
  if (p != HadamardSigns::PerCall) micro = 0;
  using Gen = r123::Philox4x32;
  const Gen::key_type key = {{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)}};
  const Gen::ctr_type ctr = {{micro, step, layer, (static_cast<uint32_t>(n) << 16) + 0x4844u}};
  const Gen::ctr_type bits = Gen()(ctr, key);
  for (int i = 0; i < n; ++i) out[i] = (bits.v[i >> 5] >> (i & 31)) & 1u ? -1.f : +1.f;
}

HadamardTransform HadamardTransform::make(int n, HadamardSigns p, RhtPrecision precision,
                                          uint64_t seed, uint32_t layer, uint32_t step,
                                          uint32_t micro) {
  HadamardTransform h;
  h.n = n;
  h.precision = precision;
  hadamard_signs(n, p, seed, layer, step, h.signs.data(), micro);
  return h;
}

HadamardTransform HadamardTransform::te16(RhtPrecision precision) {
  return make(16, HadamardSigns::Fixed, precision, 0, 0, 0);
}

float HadamardTransform::scale() const {
  const float c = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
  return precision == RhtPrecision::BF16 ? round_bf16(c) : c;
}

void hadamard_rows(float* x, int64_t rows, int64_t cols, const HadamardTransform& h) {
  const char* where = "hadamard_rows";
  check_size(where, h.n);
  if (rows < 0 || cols < 0) throw std::invalid_argument(std::string(where) + ": negative shape");
  if (cols % h.n != 0) {
    throw std::invalid_argument(std::string(where) + ": cols = " + std::to_string(cols) +
                                " is not a multiple of the Hadamard size " + std::to_string(h.n));
  }
  const float c = h.scale();
  const bool bf16 = h.precision == RhtPrecision::BF16;
#pragma omp parallel for schedule(static) if (rows * cols >= (int64_t{1} << 16))
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * cols;
    for (int64_t j = 0; j < cols; j += h.n) {
      if (bf16) hadamard_chunk<true>(row + j, h.n, h.signs.data(), c);
      else hadamard_chunk<false>(row + j, h.n, h.signs.data(), c);
    }
  }
}

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
