// MS-EDEN quantization of one backward-GEMM operand (Quartet II). Contract: ms_eden.h and
// docs/numerics.md "MS-EDEN (Quartet II)". Each stage below names the part of Quartet II's
// eden_1x16s_fp4_kernel (src/models/quantization/schemes/quartet_2.py) it implements; the
// FP32 operations are that kernel's, in its order, with two choices it leaves open fixed here:
// the EDEN sums are accumulated left to right (Triton's tl.sum is a tree of unspecified
// shape), and the scale SR draws its uniform from Philox (eden_uniform), not tl.rand.
#include "fp4/numerics/ms_eden.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "fp4/numerics/block_quant.h"
#include "fp4/numerics/format.h"

namespace fp4 {

namespace {

constexpr uint8_t kE4M3MaxCode = 0x7E;  // 448; 0x7F is NaN

void validate(int64_t rows, int64_t cols, const MsEdenSpec& s, float g) {
  auto fail = [](const std::string& why) {
    throw std::invalid_argument("ms_eden_quantize: " + why);
  };
  if (rows < 0 || cols < 0) fail("negative shape");
  if (s.block <= 0) fail("block must be > 0, got " + std::to_string(s.block));
  if (s.group <= 0 || s.group % s.block != 0 || s.group > kMaxBlock)
    fail("group must be a positive multiple of block (" + std::to_string(s.block) + ") up to " +
         std::to_string(kMaxBlock) + ", got " + std::to_string(s.group));
  if (cols % s.group != 0)
    fail("cols (" + std::to_string(cols) + ") must be a multiple of group (" +
         std::to_string(s.group) + "): the Hadamard groups tile the rows");
  if (!(g >= 0.0f) || std::isinf(g)) fail("tensor reference g must be finite and >= 0");
  if (!(s.scale_max > 0.0f) || std::isinf(s.scale_max)) fail("scale_max must be finite and > 0");
  if (!(s.val_max > 0.0f) || std::isinf(s.val_max)) fail("val_max must be finite and > 0");
}

/// "# amax" (tensor scale): s_dec = fl(fl(g / scale_max) / val_max), 1 when g == 0.
float tensor_decode_scale(float g, const MsEdenSpec& s) {
  return g == 0.0f ? 1.0f : (g / s.scale_max) / s.val_max;
}

/// "# scale": c_b = RNE_E4M3(fl(fl(a_b / val_max) / s_dec)) (saturating at 448), 0 → 1. A 0/0
/// (a_b = 0 with an underflowed s_dec) is taken as 0.
float block_scale(const float* xb, int n, float s_dec, float val_max) {
  float a = 0.0f;
  for (int i = 0; i < n; ++i) a = std::max(a, std::fabs(xb[i]));
  float c = (a / val_max) / s_dec;
  if (c != c) c = 0.0f;
  c = round_magnitude(c, kE4M3, Rounding::RNE);
  return c == 0.0f ? 1.0f : c;
}

/// Σ xs² and Σ xs·q over one Hadamard group, FP32, left to right.
struct EdenSums {
  float num = 0.0f;
  float den = 0.0f;
};

/// "# quantize" and the EDEN sums of one block: xs = x / fl(c_b · s_dec) (0/0 taken as 0),
/// q = RNA_E2M1(xs) (Quartet II's thresholds ≥ 0.25, 0.75, …, 5: ties away from zero).
void quantize_block(const float* xb, int n, float c, float s_dec, uint8_t* codes, EdenSums& sums) {
  const float d = c * s_dec;
  for (int i = 0; i < n; ++i) {
    float xs = xb[i] / d;
    if (xs != xs) xs = 0.0f;
    codes[i] = e2m1_encode_rna(xs);
    sums.num = sums.num + xs * xs;
    sums.den = sums.den + xs * e2m1_value(codes[i]);
  }
}

/// "# Calculate EDEN scale": Σxs² / Σxs·q, 1 when the denominator is 0 (and, unlike Quartet II,
/// when the ratio is not finite: only with g far below the operand's amax).
float eden_correction(const EdenSums& s) {
  if (s.den == 0.0f) return 1.0f;
  const float corr = s.num / s.den;
  return std::isfinite(corr) ? corr : 1.0f;
}

/// One row: per group, its blocks' scales and codes, the group's correction, then each block's
/// corrected scale and its stochastic rounding ("# Apply EDEN scale").
void quantize_row(const float* xr, int64_t r, const SrKey& key, MsEdenQuantized& q) {
  const MsEdenSpec& s = q.spec;
  const int per_group = s.group / s.block;
  for (int64_t gc = 0; gc < q.group_cols; ++gc) {
    EdenSums sums;
    const int64_t b0 = r * q.block_cols + gc * per_group;
    for (int k = 0; k < per_group; ++k) {
      const int64_t c0 = (gc * per_group + k) * s.block;
      const float c = block_scale(xr + c0, s.block, q.s_dec, s.val_max);
      q.block_scales[b0 + k] = c;
      quantize_block(xr + c0, s.block, c, q.s_dec, q.codes.data() + r * q.cols + c0, sums);
    }
    const float corr = eden_correction(sums);
    q.correction[r * q.group_cols + gc] = corr;
    for (int64_t b = b0; b < b0 + per_group; ++b) {
      q.corrected[b] = q.block_scales[b] * corr;
      q.scales[b] = ms_eden_round_scale(q.corrected[b],
                                        eden_uniform(key, static_cast<uint64_t>(b)));
      q.scale_codes[b] = format_code_of(q.scales[b], kE4M3);
    }
  }
}

}  // namespace

float ms_eden_round_scale(float c, float u) {
  if (!(c >= 0.0f))
    throw std::invalid_argument("ms_eden_round_scale: scale must be >= 0 and not NaN");
  const float n = round_magnitude(c, kE4M3, Rounding::RNE);
  const uint8_t b = format_code_of(n, kE4M3);
  float down = n, up = n;
  if (n > c) {
    down = format_decode(static_cast<uint8_t>(b - 1), kE4M3);  // n > c ≥ 0, so b ≥ 1
  } else {
    if (b == kE4M3MaxCode) return n;  // no code above 448 (Quartet II: NaN → never up)
    up = format_decode(static_cast<uint8_t>(b + 1), kE4M3);
  }
  const float p = (c - down) / (up - down);
  return u < p ? up : down;
}

void quartet_rtn_quantize_dequantize(const float* x, int64_t rows, int64_t cols, float g,
                                     float* out) {
  if (rows < 0 || cols < 0)
    throw std::invalid_argument("quartet_rtn_quantize_dequantize: negative shape");
  if (!(g >= 0.0f) || std::isinf(g))
    throw std::invalid_argument("quartet_rtn_quantize_dequantize: tensor reference g must be "
                                "finite and >= 0");
  for (int64_t i = 0; i < rows * cols; ++i)
    if (!std::isfinite(x[i])) detail::throw_non_finite("quartet_rtn_quantize_dequantize", x, rows * cols);
  constexpr int kBlock = 16;    // Quartet_II_fn.group_size
  constexpr float kValMax = 6;  // 6 / forward_scale_override (1.0)
  MsEdenSpec s;
  s.scale_max = kQuartetRtnScaleMax;
  s.val_max = kValMax;
  const float s_dec = tensor_decode_scale(g, s);  // "# amax"
#pragma omp parallel for schedule(static) if (rows * cols >= (int64_t{1} << 14))
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c0 = 0; c0 < cols; c0 += kBlock) {
      const int n = static_cast<int>(std::min<int64_t>(kBlock, cols - c0));
      const float* xb = x + r * cols + c0;
      const float c = block_scale(xb, n, s_dec, kValMax);  // "# scale"
      const float d = c * s_dec;                           // s_enc_b_inv
      float* ob = out + r * cols + c0;
      for (int i = 0; i < n; ++i) {  // "# quantize", "# dequantize"
        float xs = xb[i] / d;
        if (xs != xs) xs = 0.0f;
        ob[i] = e2m1_value(e2m1_encode_rna(xs)) * d;
      }
    }
}

MsEdenQuantized ms_eden_quantize(const float* x, int64_t rows, int64_t cols, const MsEdenSpec& spec,
                                 float g, const SrKey& key) {
  validate(rows, cols, spec, g);
  for (int64_t i = 0; i < rows * cols; ++i)
    if (!std::isfinite(x[i])) detail::throw_non_finite("ms_eden_quantize", x, rows * cols);
  MsEdenQuantized q;
  q.rows = rows, q.cols = cols, q.spec = spec, q.g = g;
  q.s_dec = tensor_decode_scale(g, spec);
  q.block_cols = cols / spec.block;
  q.group_cols = cols / spec.group;
  const auto nb = static_cast<size_t>(rows * q.block_cols);
  q.codes.assign(static_cast<size_t>(rows * cols), 0);
  q.block_scales.assign(nb, 0.0f);
  q.correction.assign(static_cast<size_t>(rows * q.group_cols), 0.0f);
  q.corrected.assign(nb, 0.0f);
  q.scales.assign(nb, 0.0f);
  q.scale_codes.assign(nb, 0);
#pragma omp parallel for schedule(static) if (rows * cols >= (int64_t{1} << 14))
  for (int64_t r = 0; r < rows; ++r) quantize_row(x + r * cols, r, key, q);
  return q;
}

void ms_eden_dequantize(const MsEdenQuantized& q, float* out) {
  const auto n = static_cast<size_t>(q.rows * q.cols);
  if (q.rows < 0 || q.cols < 0 || q.spec.block <= 0 || q.codes.size() != n ||
      q.block_cols != q.cols / q.spec.block ||
      q.scales.size() != static_cast<size_t>(q.rows * q.block_cols))
    throw std::invalid_argument("ms_eden_dequantize: codes/scales do not match the shape");
  for (int64_t r = 0; r < q.rows; ++r)
    for (int64_t c = 0; c < q.cols; ++c) {
      const float s = q.scales[r * q.block_cols + c / q.spec.block];
      out[r * q.cols + c] = (e2m1_value(q.codes[r * q.cols + c]) * s) * q.s_dec;
    }
}

}  // namespace fp4
