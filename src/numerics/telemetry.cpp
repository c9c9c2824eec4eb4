// Numerics telemetry (see fp4/numerics/telemetry.h).
#include "fp4/numerics/telemetry.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "fp4/numerics/pack_fast.h"
#include "fp4/numerics/qtensor.h"

namespace fp4 {

int log2_ratio_bin(double v) {
  int e = 0;
  std::frexp(v, &e);  // v = m·2^e, m in [0.5, 1): floor(log2 v) = e − 1
  const int b = std::clamp(e - 1, -QuantStats::kRatioBias,
                           QuantStats::kRatioBins - 1 - QuantStats::kRatioBias);
  return b + QuantStats::kRatioBias;
}

namespace {
// quant_stats of q, the quantization of x with reference g (per tensor) or q.row_g (per row),
// whose decoded values are xh [rows, cols] (dequantize(q)).
QuantStats stats_of(const QuantizedTensor& q, const std::vector<float>& xh, const float* x,
                    int64_t rows, int64_t cols, const BlockQuantSpec& spec, float g) {
  QuantStats s;
  const FloatFormat& sf = spec_scale_format(spec);
  const bool per_row = !q.row_ge.empty();
  const auto bc = static_cast<size_t>(std::max<int64_t>(q.block_cols, 1));
  // The block-scale multiplier and the reference of block b (its row's when per row).
  auto mult_of = [&](size_t b) { return (per_row ? q.row_ge[b / bc] : q.ge) * (1.0f / spec.element.max()); };
  auto ref_of = [&](size_t b) { return per_row ? double(q.row_g[b / bc]) : double(g); };
  const size_t nb = q.scales.size();
  // The scale a block needs, a_b·T/g (= a_b·ge/6 with ge = 6T/g), is "clipped" when RNE to the
  // scale format without its max would give more than max_finite: beyond the midpoint
  // max + ulp(max)/2. (Comparing with max itself would count the block holding the tensor amax,
  // whose needed scale is T up to one FP32 rounding of the encode scale.)
  int e_max = 0;
  std::frexp(sf.max_finite, &e_max);  // max_finite = m·2^e_max, m in [0.5, 1)
  const float clip_above = sf.max_finite + std::ldexp(0.5f, e_max - 1 - sf.frac_bits);
  int64_t sat = 0, guard = 0;
  std::vector<uint8_t> guarded(nb, 0);
  for (size_t b = 0; b < nb; ++b) {
    const float a = q.block_amax[b];
    // MX rules have no tensor scale: there a scale code at the format max counts.
    const float mult = mult_of(b);
    if (spec.scale_rule == ScaleRule::TensorScaled ? a * mult > clip_above
                                                   : q.scales[b] >= sf.max_finite)
      ++sat;
    if (spec.scale_rule == ScaleRule::TensorScaled && a > 0 && round_magnitude(std::min(a * mult, sf.max_finite), sf, Rounding::RNE) == 0.0f)
      ++guard, guarded[b] = 1;
  }
  int64_t nonzero = 0, zeroed = 0;
  double err = 0, norm = 0;
  float amax = 0;
  for (int64_t i = 0; i < rows * cols; ++i) {
    const double d = double(x[i]) - xh[static_cast<size_t>(i)];
    err += d * d;
    norm += double(x[i]) * x[i];
    amax = std::max(amax, std::fabs(x[i]));
    if (x[i] != 0) {
      ++nonzero;
      if (xh[static_cast<size_t>(i)] == 0.0f) ++zeroed;  // decoded value, any element format
    }
  }
  // Histograms. Under the MX rules the ratio is to this operand's max|x| (no g).
  s.scale_format = &sf;
  s.ratio_to_g = spec.scale_rule == ScaleRule::TensorScaled;
  for (size_t b = 0; b < nb; ++b) {
    const double a = q.block_amax[b];
    const double r = s.ratio_to_g ? ref_of(b) : double(amax);
    if (a == 0)
      ++s.zero_blocks;
    else if (guarded[b])
      ++s.guarded_blocks;
    else
      ++s.scale_code_blocks[q.scale_codes[b]];
    if (a > 0 && r > 0) ++s.log2_amax_ratio_blocks[size_t(log2_ratio_bin(a / r))];
  }
  s.saturated_blocks = nb ? double(sat) / nb : 0;
  s.zero_guard_blocks = nb ? double(guard) / nb : 0;
  s.zeroed_nonzeros = nonzero ? double(zeroed) / nonzero : 0;
  s.rel_error = norm > 0 ? std::sqrt(err / norm) : 0;
  s.has_staleness = spec.scale_rule == ScaleRule::TensorScaled && !per_row;  // MX: g unused
  if (s.has_staleness) s.staleness = g > 0 ? double(amax) / g : (amax > 0 ? INFINITY : 1.0);
  return s;
}

// stats_of of a scalar quantizer's result q, decoded by the scalar dequantize.
QuantStats stats_of_decoded(const QuantizedTensor& q, const float* x, int64_t rows, int64_t cols,
                            const BlockQuantSpec& spec, float g) {
  std::vector<float> xh(static_cast<size_t>(rows * cols));
  dequantize(q, xh.data());
  return stats_of(q, xh, x, rows, cols, spec, g);
}

// quant_stats where spec has a fused packer (pack_fast.h: bit-identical to
// pack(quantize_blocks(...)), and dequantize_fast to dequantize): codes, scales, scale codes
// and tensor scales through unpack, and the block amax a_b (max |x| over each block or tile),
// which a packed tensor does not store, from x.
QuantStats stats_fused(const float* x, int64_t rows, int64_t cols, const BlockQuantSpec& spec,
                       float g, const SrKey* sr) {
  const QTensor t = quantize_pack_fast(x, rows, cols, spec, g, sr);  // validates the arguments
  std::vector<float> xh(static_cast<size_t>(rows * cols));
  dequantize_fast(t, xh.data());
  QuantizedTensor q;
  unpack(t, q);
  q.spec = spec;
  const int64_t B = spec.block, bc = q.block_cols;
  q.block_amax.assign(static_cast<size_t>(q.block_rows * bc), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    float* a = q.block_amax.data() + (spec.two_d ? r / B : r) * bc;
    const float* xr = x + r * cols;
    for (int64_t b = 0; b < bc; ++b) {
      float m = a[b];
      for (int64_t c = b * B; c < std::min(cols, (b + 1) * B); ++c)
        m = std::max(m, std::fabs(xr[c]));
      a[b] = m;
    }
  }
  return stats_of(q, xh, x, rows, cols, spec, g);
}
}  // namespace

QuantStats quant_stats(const float* x, int64_t rows, int64_t cols, const BlockQuantSpec& spec,
                       float g, const SrKey* sr) {
  if (pack_fast_slow_path(spec).empty()) return stats_fused(x, rows, cols, spec, g, sr);
  return stats_of_decoded(quantize_blocks(x, rows, cols, spec, g, sr), x, rows, cols, spec, g);
}

QuantStats quant_stats_rows(const float* x, int64_t rows, int64_t cols, const BlockQuantSpec& spec,
                            const float* row_g, const SrKey* sr) {
  return stats_of_decoded(quantize_blocks_rows(x, rows, cols, spec, row_g, sr), x, rows, cols, spec,
                          0.f);
}

}  // namespace fp4
