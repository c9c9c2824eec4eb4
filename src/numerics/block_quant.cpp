// Block-scaled FP4 quantization of one GEMM operand.
// Contract: docs/numerics.md "Quantizing one operand" (exact FP32 operation order) and
// "Tensor reference g". Both quantize_blocks and the fused quantize_dequantize go through the
// same inline helpers below (tensor_scales, block_scale, quant_mag), which is what makes the
// fused path bit-identical to dequantize(quantize_blocks(...)).
//
// Scale formats: UE5M3 (paper / PTX), E4M3 (NVFP4, scale_max = 448), UE8M0 and any other
// block-scale format (spec.scale_desc) all go through the same steps under the tensor-scaled
// rule, with the scale rounded RNE onto the format's grid. For UE8M0 this is a plain RNE
// power-of-two scale with the tensor scale kept. The MXFP4 rules of docs/numerics.md (no tensor
// scale, TE's round-up 2^ceil(log2(a_b/emax)) or OCP's 2^(floor(log2 a_b) − emax_exp)) are
// ScaleRule::MxTe / MxOcp (mx_block_scale). The zero guard sets c_b = 1 for every format and
// rule; validate() checks that 1 is representable (UE8M0: code 127).
//
// Element formats: E2M1 (the contract), any signed small float, or a uniform integer grid.
// emax = the element format's max replaces the 6 of the contract's formulas; for E2M1 every
// FP32 operation is the one docs/numerics.md spells out (ge = (T·6)/g, mult = ge·fl(1/6)).
#include "fp4/numerics/block_quant.h"

#include "fp4/base/error.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace fp4 {

namespace {

/// Minimum number of elements before the loops go parallel (results never depend on it).
constexpr int64_t kParallelMin = int64_t{1} << 14;

struct TensorScales {
  float ge;    ///< (T·6)/g, 1 if g == 0, capped at FLT_MAX
  float gd;    ///< 1/ge
  float mult;  ///< ge·fl(1/6): the multiplier of a_b, computed first
};

/// ge = (T·emax)/g (1 if g == 0, capped at FLT_MAX), gd = 1/ge, mult = ge·fl(1/emax).
/// With emax = 6 (E2M1) these are exactly the contract's operations.
TensorScales tensor_scales(float g, float target, float emax) {
  TensorScales t;
  t.ge = g == 0.0f ? 1.0f : (target * emax) / g;
  t.ge = std::min(t.ge, FLT_MAX);
  t.gd = 1.0f / t.ge;
  t.mult = t.ge * (1.0f / emax);
  return t;
}

struct ScaleParams {
  int frac, emin;
  float max;
  int kmin, kmax;  ///< power-of-two formats (MX rules): exponents of the smallest and largest value
};

ScaleParams scale_params(const FloatFormat& fmt) {
  return {fmt.frac_bits, detail::rounding_emin(fmt), fmt.max_finite, detail::rounding_emin(fmt),
          std::ilogb(fmt.max_finite)};
}

/// Element format parameters of the hot loops.
struct ElemParams {
  enum Kind { kE2M1Kind, kFloatKind, kIntKind } kind;
  int frac, emin, bias;  ///< rounding parameters (integers: q = 0 via kIntFrac)
  float max_pos, max_neg;  ///< saturation of x ≥ 0 / x < 0 (differ only for int4-style grids)
  float emax;              ///< element max of the scale formulas (E2M1: 6)
  int emax_exp;            ///< floor(log2 emax) (E2M1: 2), the OCP MX rule's emax_elem
  uint32_t sign_bit;       ///< floats: the code's sign bit
  uint32_t int_mask;       ///< integers: two's-complement code mask
};

ElemParams elem_params(const ElementFormat& ef) {
  ElemParams e{};
  if (ef.kind == ElementKind::Float) {
    const FloatFormat& f = *ef.fp;
    e.kind = ef.is_e2m1() ? ElemParams::kE2M1Kind : ElemParams::kFloatKind;
    e.frac = f.frac_bits;
    e.emin = detail::rounding_emin(f);
    e.bias = f.bias;
    e.max_pos = e.max_neg = f.max_finite;
    e.sign_bit = 1u << (f.exp_bits + f.frac_bits);
  } else {
    e.kind = ElemParams::kIntKind;
    e.frac = e.emin = detail::kIntFrac;
    e.max_pos = static_cast<float>(ef.int_max);
    e.max_neg = static_cast<float>(-ef.int_min);
    e.int_mask = (1u << ef.bits()) - 1u;
  }
  e.emax = ef.max();
  e.emax_exp = std::ilogb(e.emax);
  return e;
}

/// c_b = round_scale(min(a_b·mult, scale_max)) RNE; 0 → 1 (zero-block / underflow guard).
/// a_b·mult may overflow to +Inf; the min then saturates it.
inline float block_scale(float a_b, float mult, const ScaleParams& sp) {
  float c = a_b * mult;
  c = std::min(c, sp.max);
  c = detail::round_magnitude_params(c, sp.frac, sp.emin, sp.max, Rounding::RNE, 0);
  return c == 0.0f ? 1.0f : c;
}

/// MXFP4 block scale (ScaleRule::MxTe / MxOcp), exact: a power of two 2^k with
///  MxTe:  k = ceil(log2(a_b/emax)), the smallest k with emax·2^k ≥ a_b — found from the
///         exponents and settled by exact comparisons in double (emax·2^k is exact there);
///  MxOcp: k = floor(log2 a_b) − emax_exp, floor(log2 a_b) = ilogb (exact, also subnormals);
/// clamped to the scale format's exponent range [kmin, kmax]. a_b = 0 gives 1 (zero guard).
inline float mx_block_scale(float a_b, ScaleRule rule, const ElemParams& ep, const ScaleParams& sp) {
  if (a_b == 0.0f) return 1.0f;
  int k = std::ilogb(a_b) - ep.emax_exp;
  if (rule == ScaleRule::MxTe) {
    // a_b ∈ [2^A, 2^(A+1)), emax ∈ [2^B, 2^(B+1)) ⇒ ceil(log2(a_b/emax)) ∈ {A−B, A−B+1}.
    const double a = a_b, m = ep.emax;
    while (std::ldexp(m, k) < a) ++k;
    while (std::ldexp(m, k - 1) >= a) --k;
  }
  k = std::clamp(k, sp.kmin, sp.kmax);
  return detail::pow2f(k);
}

/// Rounded element magnitude of x·e_b (the sign is that of x and is reapplied by the caller),
/// saturating to ep.max_pos (x ≥ 0) or ep.max_neg (x < 0); for E2M1 both are 6.
/// Edge case beyond the contract: when d_b underflows enough that e_b = 1/d_b is +Inf (tiny g
/// with tiny blocks), x·e_b is ±Inf and saturates to ±emax, and 0·Inf = NaN is taken as 0.
inline float quant_mag(float x, float e_b, const ElemParams& ep, Rounding mode, uint8_t r) {
  float y = x * e_b;
  if (y != y) y = 0.0f;  // only 0·Inf can produce NaN here (x finite, e_b > 0)
  const float mx = std::signbit(x) ? ep.max_neg : ep.max_pos;
  return detail::round_magnitude_params(y, ep.frac, ep.emin, mx, mode, r);
}

/// E2M1 code of the magnitude v ∈ {0, .5, 1, 1.5, 2, 3, 4, 6} (indexed by 2v) and sign of x.
inline uint8_t e2m1_code(float v, float x) {
  static constexpr uint8_t kCodeOfTwiceValue[13] = {0, 1, 2, 3, 4, 0, 5, 0, 6, 0, 0, 0, 7};
  return static_cast<uint8_t>(kCodeOfTwiceValue[static_cast<int>(v * 2.0f)] |
                              (std::signbit(x) ? 0x8 : 0x0));
}

/// Element code of the rounded magnitude v and the sign of x, for any element format.
inline uint8_t elem_code(float v, float x, const ElemParams& ep) {
  switch (ep.kind) {
    case ElemParams::kE2M1Kind: return e2m1_code(v, x);
    case ElemParams::kFloatKind:
      return static_cast<uint8_t>(detail::grid_magnitude_code(v, ep.frac, ep.bias, ep.emin) |
                                  (std::signbit(x) ? ep.sign_bit : 0u));
    case ElemParams::kIntKind: {
      const int q = static_cast<int>(v);
      return static_cast<uint8_t>(static_cast<uint32_t>(std::signbit(x) ? -q : q) & ep.int_mask);
    }
  }
  return 0;
}

/// Signed element value of the rounded magnitude v: exactly the decode of elem_code(v, x).
/// Floats keep −0 (their codes have one); integers have no −0.
inline float elem_value(float v, float x, const ElemParams& ep) {
  if (ep.kind == ElemParams::kIntKind && v == 0.0f) return 0.0f;
  return std::copysign(v, x);
}

/// max |x| over [x, x+n) as the bit pattern of |x| (order-preserving for non-negative floats);
/// a result > 0x7F7FFFFF means some element was Inf or NaN.
inline uint32_t amax_bits(const float* x, int64_t n) {
  uint32_t m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::bit_cast<uint32_t>(x[i]) & 0x7FFFFFFFu);
  return m;
}
constexpr uint32_t kMaxFiniteBits = 0x7F7FFFFFu;



/// Everything both paths need about one call.
struct Plan {
  int64_t rows, cols, B, block_rows, block_cols;
  bool two_d;
  TensorScales ts;
  ScaleParams sp;
  ElemParams ep;
  ScaleRule rule;
  Rounding mode;
  const SrKey* sr;
  FourOverSix fos;  ///< Four Over Six selection (Off: the contract's single scale)
  float g;          ///< tensor reference, read by the 4/6 error
  float denom;      ///< fl(T·emax), the 4/6 error's divisor
  const float* row_g = nullptr;  ///< per-row reference [rows] (1-D, tensor-scaled), or null
  float target = 448.f;          ///< T, for the per-row tensor scales
};

Plan make_plan(int64_t rows, int64_t cols, const BlockQuantSpec& spec, float g, const SrKey* sr) {
  Plan p;
  p.rows = rows;
  p.cols = cols;
  p.B = spec.block;
  p.two_d = spec.two_d;
  p.block_cols = (cols + p.B - 1) / p.B;
  p.block_rows = spec.two_d ? (rows + p.B - 1) / p.B : rows;
  p.ep = elem_params(spec.element);
  p.rule = spec.scale_rule;
  p.ts = p.rule == ScaleRule::TensorScaled ? tensor_scales(g, spec.target, p.ep.emax)
                                           : TensorScales{1.0f, 1.0f, 1.0f};  // no tensor scale
  p.sp = scale_params(spec_scale_format(spec));
  p.mode = spec.rounding;
  p.sr = sr;
  p.fos = spec.four_over_six;
  p.g = g;
  p.denom = spec.target * p.ep.emax;
  return p;
}

/// The 4/6 error of quantizing xs [n] with block scale c (docs/numerics.md "Four Over Six"):
/// Σ over i in order, from 0, of |v_i − x_i| (MAE) or (v_i − x_i)² (MSE) in FP32, where
/// v_i = fl(fl(fl(q_i·c)·g) / fl(T·emax)) and q_i is the signed element x_i rounds to under c.
inline float four_over_six_error(const float* xs, int64_t n, float c, const Plan& p,
                                 const uint8_t* sr_row) {
  const float e = 1.0f / (c * p.ts.gd);
  float err = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t r = p.mode == Rounding::SR8 ? sr_row[i] : 0;
    const float q = elem_value(quant_mag(xs[i], e, p.ep, p.mode, r), xs[i], p.ep);
    const float diff = ((q * c) * p.g) / p.denom - xs[i];
    err += p.fos == FourOverSix::MSE ? diff * diff : std::fabs(diff);
  }
  return err;
}

/// Four Over Six block scales of block-row [r0, r1): per block the candidates
/// (detail::four_over_six_candidates), the error of each summed per row, then over the rows in
/// order (2-D tiles); c4 only if its error is strictly lower. err_buf holds 2·block_cols floats.
void four_over_six_scales(const float* x, const Plan& p, int64_t r0, int64_t r1,
                          const float* amax_buf, float* scale_buf, uint8_t* sr_buf,
                          float* err_buf) {
  float* err4 = err_buf;
  float* err6 = err_buf + p.block_cols;
  std::fill(err_buf, err_buf + 2 * p.block_cols, 0.0f);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t base = r * p.cols;
    if (p.mode == Rounding::SR8) sr_bytes(*p.sr, static_cast<uint64_t>(base), p.cols, sr_buf);
    for (int64_t bc = 0; bc < p.block_cols; ++bc) {
      const int64_t c0 = bc * p.B, n = std::min(p.cols, c0 + p.B) - c0;
      const auto [c4, c6] = detail::four_over_six_candidates(amax_buf[bc], p.ts.ge, p.ep.emax,
                                                             p.sp.frac, p.sp.emin, p.sp.max);
      const uint8_t* sr_row = p.mode == Rounding::SR8 ? sr_buf + c0 : nullptr;
      err4[bc] += four_over_six_error(x + base + c0, n, c4, p, sr_row);
      err6[bc] += four_over_six_error(x + base + c0, n, c6, p, sr_row);
    }
  }
  for (int64_t bc = 0; bc < p.block_cols; ++bc) {
    const auto [c4, c6] = detail::four_over_six_candidates(amax_buf[bc], p.ts.ge, p.ep.emax,
                                                           p.sp.frac, p.sp.emin, p.sp.max);
    scale_buf[bc] = err4[bc] < err6[bc] ? c4 : c6;
  }
}

/// The one kernel behind both entry points. Processes block-row `br` (one row for 1-D blocks,
/// `B` rows for 2-D tiles): amax of every block, c_b, then every element. Reads all of the
/// block-row's inputs before writing any of its outputs, so `out` may alias `x`.
/// Sink receives per block (br, bc, a_b, c_b) and per element (index, magnitude v, x).
/// Returns false (and writes nothing) if the block-row holds a non-finite value.
template <class BlockSink, class ElemSink>
bool process_block_row(const float* x, const Plan& p, int64_t br, float* amax_buf,
                       float* scale_buf, uint8_t* sr_buf, float* err_buf, BlockSink&& on_block,
                       ElemSink&& on_elem) {
  const int64_t r0 = p.two_d ? br * p.B : br;
  const int64_t r1 = p.two_d ? std::min(p.rows, r0 + p.B) : br + 1;
  // 0. tensor scales: the call's, or this row's (row-scaled operand: 1-D, br is the row)
  const TensorScales ts = p.row_g ? tensor_scales(p.row_g[br], p.target, p.ep.emax) : p.ts;
  // 1. block amax (zero padding does not change a max of magnitudes)
  for (int64_t bc = 0; bc < p.block_cols; ++bc) {
    const int64_t c0 = bc * p.B, c1 = std::min(p.cols, c0 + p.B);
    uint32_t m = 0;
    for (int64_t r = r0; r < r1; ++r) m = std::max(m, amax_bits(x + r * p.cols + c0, c1 - c0));
    if (m > kMaxFiniteBits) return false;
    amax_buf[bc] = std::bit_cast<float>(m);
  }
  // 2. block scales (Four Over Six: the lower-error of two candidates; never row-scaled,
  // validate_row_quant refuses the pair)
  if (p.fos != FourOverSix::Off) {
    four_over_six_scales(x, p, r0, r1, amax_buf, scale_buf, sr_buf, err_buf);
  } else {
    for (int64_t bc = 0; bc < p.block_cols; ++bc) {
      scale_buf[bc] = p.rule == ScaleRule::TensorScaled
                          ? block_scale(amax_buf[bc], ts.mult, p.sp)
                          : mx_block_scale(amax_buf[bc], p.rule, p.ep, p.sp);
    }
  }
  for (int64_t bc = 0; bc < p.block_cols; ++bc) on_block(br, bc, amax_buf[bc], scale_buf[bc]);
  // 3. elements
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t base = r * p.cols;
    if (p.mode == Rounding::SR8) sr_bytes(*p.sr, static_cast<uint64_t>(base), p.cols, sr_buf);
    for (int64_t bc = 0; bc < p.block_cols; ++bc) {
      const int64_t c0 = bc * p.B, c1 = std::min(p.cols, c0 + p.B);
      const float d = scale_buf[bc] * ts.gd;  // d_b = c_b·gd
      const float e = 1.0f / d;                 // e_b = 1/d_b, then multiply
      if (p.mode == Rounding::SR8) {
        for (int64_t c = c0; c < c1; ++c) {
          const float xv = x[base + c];
          on_elem(base + c, quant_mag(xv, e, p.ep, Rounding::SR8, sr_buf[c]), xv, d);
        }
      } else {
        for (int64_t c = c0; c < c1; ++c) {
          const float xv = x[base + c];
          on_elem(base + c, quant_mag(xv, e, p.ep, p.mode, 0), xv, d);  // RNE or RNA
        }
      }
    }
  }
  return true;
}

/// Run process_block_row over all block-rows, in parallel, with per-thread buffers.
/// Throws (after the parallel region) if any input was non-finite.
template <class BlockSink, class ElemSink>
void run_all(const char* where, const float* x, const Plan& p, BlockSink on_block,
             ElemSink on_elem) {
  std::atomic<bool> bad{false};
  const bool par = p.rows * p.cols >= kParallelMin && p.block_rows > 1;
#pragma omp parallel if (par)
  {
    std::vector<float> amax_buf(static_cast<size_t>(p.block_cols));
    std::vector<float> scale_buf(static_cast<size_t>(p.block_cols));
    std::vector<uint8_t> sr_buf(p.mode == Rounding::SR8 ? static_cast<size_t>(p.cols) : 0);
    std::vector<float> err_buf(p.fos != FourOverSix::Off ? 2 * static_cast<size_t>(p.block_cols) : 0);
#pragma omp for schedule(static)
    for (int64_t br = 0; br < p.block_rows; ++br) {
      if (!process_block_row(x, p, br, amax_buf.data(), scale_buf.data(), sr_buf.data(),
                             err_buf.data(), on_block, on_elem)) {
        bad.store(true, std::memory_order_relaxed);
      }
    }
  }
  // A block-row with a non-finite value is never written, so every non-finite input is still
  // in x (even when out aliases x) and the scan finds the first one.
  if (bad.load()) detail::throw_non_finite(where, x, p.rows * p.cols);
}

}  // namespace

void detail::throw_non_finite(const char* where, const float* x, int64_t n) {
  int64_t i = 0;
  while (i < n && std::isfinite(x[i])) ++i;
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s: element %lld is %s (inputs must be finite)", where,
                static_cast<long long>(i), i < n && std::isnan(x[i]) ? "NaN" : "Inf");
  throw NonFiniteError(buf);
}

void detail::validate_block_quant(const char* where, int64_t rows, int64_t cols, const BlockQuantSpec& spec, float g,
              const SrKey* sr) {
  // The message prefix is built only on error: a std::string here would allocate per call.
  if (rows < 0 || cols < 0) {
    throw std::invalid_argument(std::string(where) + ": negative shape [" + std::to_string(rows) + ", " +
                                std::to_string(cols) + "]");
  }
  if (spec.block <= 0) {
    throw std::invalid_argument(std::string(where) + ": block must be > 0, got " + std::to_string(spec.block));
  }
  if (!(g >= 0.0f) || std::isinf(g)) {
    throw std::invalid_argument(std::string(where) + ": tensor reference g must be finite and >= 0, got " +
                                std::to_string(g));
  }
  if (!(spec.target > 0.0f) || std::isinf(spec.target)) {
    throw std::invalid_argument(std::string(where) + ": scale target T must be finite and > 0, got " +
                                std::to_string(spec.target));
  }
  if (spec.rounding == Rounding::SR8 && sr == nullptr) {
    throw std::invalid_argument(std::string(where) + ": SR8 rounding needs an SrKey (sr is null)");
  }
  const ElementFormat& ef = spec.element;
  if (ef.kind == ElementKind::Float) {
    if (ef.fp == nullptr || !ef.fp->has_sign || ef.fp->bits() > 8) {
      throw std::invalid_argument(std::string(where) + ": element format must be a signed float format of at most "
                                  "8 bits (got " + (ef.fp ? std::string(ef.fp->name) : "null") + ")");
    }
  } else if (ef.kind == ElementKind::Int) {
    if (!(ef.int_min >= -128 && ef.int_min < 0 && ef.int_max > 0 && ef.int_max <= 127)) {
      throw std::invalid_argument(std::string(where) + ": integer element grid must have -128 <= int_min < 0 < "
                                  "int_max <= 127, got [" + std::to_string(ef.int_min) + ", " +
                                  std::to_string(ef.int_max) + "]");
    }
  } else {
    throw std::invalid_argument(std::string(where) + ": invalid ElementKind value");
  }
  const FloatFormat& sf = spec_scale_format(spec);  // throws on an invalid enum value
  if (round_magnitude(1.0f, sf, Rounding::RNE) != 1.0f) {
    throw std::invalid_argument(std::string(where) + ": scale format " + sf.name +
                                " cannot represent 1.0 (needed by the zero-block guard)");
  }
  switch (spec.scale_rule) {
    case ScaleRule::TensorScaled: break;
    case ScaleRule::MxTe:
    case ScaleRule::MxOcp:
      if (sf.frac_bits != 0) {
        throw std::invalid_argument(std::string(where) + ": scale rule " + scale_rule_name(spec.scale_rule) +
                                    " needs a power-of-two scale format (ue8m0 or ue<E>m0), got " +
                                    sf.name);
      }
      break;
    default: throw std::invalid_argument(std::string(where) + ": invalid ScaleRule value");
  }
  if (spec.four_over_six != FourOverSix::Off) {
    if (spec.four_over_six != FourOverSix::MAE && spec.four_over_six != FourOverSix::MSE)
      throw std::invalid_argument(std::string(where) + ": invalid FourOverSix value");
    if (spec.scale_rule != ScaleRule::TensorScaled)
      throw std::invalid_argument(std::string(where) + ": Four Over Six needs the tensor-scaled rule "
                                  "(a scale format with a tensor scale), not scale rule " +
                                  scale_rule_name(spec.scale_rule));
  }
}

detail::FourOverSixCandidates detail::four_over_six_candidates(float a_b, float ge, float emax,
                                                               int frac, int emin, float smax) {
  const float base = (a_b / emax) * ge;  // Transformer Engine's order (docs/numerics.md)
  auto scale = [&](float s) {
    s = round_magnitude_params(std::min(s, smax), frac, emin, smax, Rounding::RNE, 0);
    return s == 0.0f ? 1.0f : s;
  };
  return {scale(base * 1.5f), scale(base)};
}

FourOverSix parse_four_over_six(const std::string& s) {
  if (s == "off") return FourOverSix::Off;
  if (s == "mae") return FourOverSix::MAE;
  if (s == "mse") return FourOverSix::MSE;
  throw std::invalid_argument("unknown Four Over Six mode '" + s + "' (valid choices: off, mae, mse)");
}

const char* four_over_six_name(FourOverSix f) {
  switch (f) {
    case FourOverSix::Off: return "off";
    case FourOverSix::MAE: return "mae";
    case FourOverSix::MSE: return "mse";
  }
  return "?";
}

void detail::validate_row_quant(const char* where, int64_t rows, int64_t cols,
                                const BlockQuantSpec& spec, const float* row_g, const SrKey* sr) {
  validate_block_quant(where, rows, cols, spec, 0.0f, sr);
  if (spec.two_d)
    throw std::invalid_argument(std::string(where) +
                                ": a per-row reference needs 1-D blocks (a 2-D tile spans rows)");
  if (spec.scale_rule != ScaleRule::TensorScaled)
    throw std::invalid_argument(std::string(where) + ": a per-row reference needs the " +
                                "tensor-scaled rule (scale rule " +
                                scale_rule_name(spec.scale_rule) + " has no tensor scale)");
  if (spec.four_over_six != FourOverSix::Off)
    throw std::invalid_argument(std::string(where) + ": a per-row reference with Four Over Six "
                                "is not implemented (the 4/6 error reads one tensor reference)");
  if (rows > 0 && row_g == nullptr)
    throw std::invalid_argument(std::string(where) + ": row_g is null");
  for (int64_t r = 0; r < rows; ++r) {
    if (!(row_g[r] >= 0.0f) || std::isinf(row_g[r]))
      throw std::invalid_argument(std::string(where) + ": row reference g of row " +
                                  std::to_string(r) + " must be finite and >= 0, got " +
                                  std::to_string(row_g[r]));
  }
}

ScaleRule parse_scale_rule(const std::string& s) {
  if (s == "tensor-scaled") return ScaleRule::TensorScaled;
  if (s == "mx-te") return ScaleRule::MxTe;
  if (s == "mx-ocp") return ScaleRule::MxOcp;
  throw std::invalid_argument("unknown scale rule '" + s +
                              "' (valid choices: tensor-scaled, mx-te, mx-ocp)");
}

const char* scale_rule_name(ScaleRule r) {
  switch (r) {
    case ScaleRule::TensorScaled: return "tensor-scaled";
    case ScaleRule::MxTe: return "mx-te";
    case ScaleRule::MxOcp: return "mx-ocp";
  }
  return "?";
}

const FloatFormat& spec_scale_format(const BlockQuantSpec& spec) {
  return spec.scale_desc ? *spec.scale_desc : scale_format_desc(spec.scale_format);
}

std::string block_length_error(int block) {
  if (block >= 1 && block <= kMaxBlock) return "";
  return "must be an integer in 1.." + std::to_string(kMaxBlock) + " (as a recipe's fp4.block), got " +
         std::to_string(block);
}

void set_scale_format(BlockQuantSpec& spec, const std::string& name) {
  const FloatFormat& f = parse_block_scale_format(name);
  ScaleFormat e;
  if (scale_format_of(f, &e)) {
    spec.scale_format = e;
    spec.scale_desc = nullptr;
  } else {
    spec.scale_desc = &f;
  }
}

float tensor_amax(const float* x, int64_t n) {
  if (n < 0) throw std::invalid_argument("tensor_amax: negative length");
  uint32_t m = 0;
#pragma omp parallel for reduction(max : m) schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::bit_cast<uint32_t>(x[i]) & 0x7FFFFFFFu);
  if (m > kMaxFiniteBits) detail::throw_non_finite("tensor_amax", x, n);
  return std::bit_cast<float>(m);
}

namespace {
/// quantize_blocks' work once validated and planned (per-tensor or per-row scales in p); the
/// tensor-scale fields of the result are the caller's to fill.
QuantizedTensor quantize_planned(const char* where, const float* x, const Plan& p,
                                 const BlockQuantSpec& spec) {
  QuantizedTensor q;
  q.rows = p.rows;
  q.cols = p.cols;
  q.spec = spec;
  q.block_rows = p.block_rows;
  q.block_cols = p.block_cols;
  const size_t nb = static_cast<size_t>(p.block_rows * p.block_cols);
  q.block_amax.assign(nb, 0.0f);
  q.scales.assign(nb, 1.0f);
  q.scale_codes.assign(nb, 0);
  q.codes.assign(static_cast<size_t>(p.rows * p.cols), 0);
  float* amax = q.block_amax.data();
  float* scales = q.scales.data();
  uint8_t* codes = q.codes.data();
  const int64_t bcols = p.block_cols;
  const ElemParams ep = p.ep;
  auto on_block = [=](int64_t br, int64_t bc, float a_b, float c_b) {
    amax[br * bcols + bc] = a_b;
    scales[br * bcols + bc] = c_b;
  };
  if (ep.kind == ElemParams::kE2M1Kind) {
    run_all(where, x, p, on_block,
            [=](int64_t idx, float v, float xv, float) { codes[idx] = e2m1_code(v, xv); });
  } else {
    run_all(where, x, p, on_block,
            [=](int64_t idx, float v, float xv, float) { codes[idx] = elem_code(v, xv, ep); });
  }
  if (spec.scale_desc) {
    for (size_t b = 0; b < nb; ++b) q.scale_codes[b] = format_code_of(q.scales[b], *spec.scale_desc);
  } else {
    for (size_t b = 0; b < nb; ++b) q.scale_codes[b] = scale_encode(q.scales[b], spec.scale_format);
  }
  return q;
}

/// quantize_dequantize's work once validated and planned.
void quantize_dequantize_planned(const char* where, const float* x, const Plan& p, float* out) {
  if (p.ep.kind == ElemParams::kE2M1Kind) {
    run_all(
        where, x, p, [](int64_t, int64_t, float, float) {},
        [=](int64_t idx, float v, float xv, float d) {
          // ±v is exactly e2m1_decode(e2m1_code(v, xv)); then x̂ = q·d_b as in dequantize.
          out[idx] = std::copysign(v, xv) * d;
        });
  } else {
    const ElemParams ep = p.ep;
    run_all(
        where, x, p, [](int64_t, int64_t, float, float) {},
        [=](int64_t idx, float v, float xv, float d) {
          // elem_value is exactly element_decode(elem_code(v, xv)).
          out[idx] = elem_value(v, xv, ep) * d;
        });
  }
}

/// The plan of a per-row call (validated by detail::validate_row_quant).
Plan make_row_plan(int64_t rows, int64_t cols, const BlockQuantSpec& spec, const float* row_g,
                   const SrKey* sr) {
  Plan p = make_plan(rows, cols, spec, 0.0f, sr);
  p.row_g = row_g;
  p.target = spec.target;
  return p;
}
}  // namespace

QuantizedTensor quantize_blocks(const float* x, int64_t rows, int64_t cols,
                                const BlockQuantSpec& spec, float g, const SrKey* sr) {
  detail::validate_block_quant("quantize_blocks", rows, cols, spec, g, sr);
  const Plan p = make_plan(rows, cols, spec, g, sr);
  QuantizedTensor q = quantize_planned("quantize_blocks", x, p, spec);
  q.g = g;
  q.ge = p.ts.ge;
  q.gd = p.ts.gd;
  return q;
}

void row_amax(const float* x, int64_t rows, int64_t cols, float* out) {
  if (rows < 0 || cols < 0) throw std::invalid_argument("row_amax: negative shape");
  bool bad = false;
  for (int64_t r = 0; r < rows; ++r) {
    const uint32_t m = amax_bits(x + r * cols, cols);
    bad = bad || m > kMaxFiniteBits;
    out[r] = std::bit_cast<float>(m);
  }
  if (bad) detail::throw_non_finite("row_amax", x, rows * cols);
}

QuantizedTensor quantize_blocks_rows(const float* x, int64_t rows, int64_t cols,
                                     const BlockQuantSpec& spec, const float* row_g,
                                     const SrKey* sr) {
  detail::validate_row_quant("quantize_blocks_rows", rows, cols, spec, row_g, sr);
  const Plan p = make_row_plan(rows, cols, spec, row_g, sr);
  QuantizedTensor q = quantize_planned("quantize_blocks_rows", x, p, spec);
  q.g = 0.0f, q.ge = q.gd = 1.0f;  // unused: the per-row scales below
  q.row_g.assign(row_g, row_g + rows);
  for (int64_t r = 0; r < rows; ++r) {
    const TensorScales t = tensor_scales(row_g[r], spec.target, p.ep.emax);
    q.row_ge.push_back(t.ge);
    q.row_gd.push_back(t.gd);
  }
  return q;
}

void quantize_dequantize_rows(const float* x, int64_t rows, int64_t cols,
                              const BlockQuantSpec& spec, const float* row_g, const SrKey* sr,
                              float* out) {
  detail::validate_row_quant("quantize_dequantize_rows", rows, cols, spec, row_g, sr);
  quantize_dequantize_planned("quantize_dequantize_rows", x,
                              make_row_plan(rows, cols, spec, row_g, sr), out);
}

void check_dequantized_finite(const char* where, const QuantizedTensor& q, const float* x,
                              const float* xhat) {
  const int64_t n = q.rows * q.cols;
  int64_t i = 0;
  while (i < n && std::isfinite(xhat[i])) ++i;
  if (i == n) return;
  const int64_t r = i / q.cols, c = i % q.cols, B = q.spec.block;
  const int64_t br = q.spec.two_d ? r / B : r, bc = c / B;
  const size_t b = static_cast<size_t>(br * q.block_cols + bc);
  const uint8_t code = q.codes[static_cast<size_t>(i)];
  const float v = q.spec.element.is_e2m1() ? e2m1_decode(code) : element_decode(code, q.spec.element);
  const bool te = q.spec.scale_rule == ScaleRule::MxTe;
  char buf[640];
  std::snprintf(buf, sizeof buf,
                "%s: element [%lld, %lld] = %.9g dequantizes to %cInf under scale rule %s: its "
                "block [%lld, %lld] has amax %.9g and decode scale %.9g (block scale %.9g = "
                "2^%d), and the element rounds to %g, whose product with it exceeds FLT_MAX "
                "(%s)",
                where, static_cast<long long>(r), static_cast<long long>(c),
                static_cast<double>(x[i]), std::signbit(xhat[i]) ? '-' : '+',
                scale_rule_name(q.spec.scale_rule), static_cast<long long>(br),
                static_cast<long long>(bc), static_cast<double>(q.block_amax[b]),
                static_cast<double>(q.scales[b] * q.gd), static_cast<double>(q.scales[b]),
                std::ilogb(q.scales[b]), static_cast<double>(v),
                te ? "mx-te never clips, so finite values from about 2.98e38 overflow; scale the "
                     "input down, or use mx-ocp, which saturates"
                   : "scale the input down");
  throw std::invalid_argument(buf);
}

namespace {
// dequantize (unit_gd false: x̂ = q·c_b·gd) and dequantize_block_scaled (true: q·c_b, the tensor
// and per-row decode scales left out; d = c_b·1 = c_b exactly).
void dequantize_with(const QuantizedTensor& q, bool unit_gd, float* out) {
  const int64_t B = q.spec.block;
  if (!q.row_gd.empty() && (q.spec.two_d || q.row_gd.size() != static_cast<size_t>(q.rows)))
    throw std::invalid_argument("dequantize: per-row decode scales need 1-D blocks, one per row");
  if (B <= 0 || q.rows < 0 || q.cols < 0 ||
      q.codes.size() != static_cast<size_t>(q.rows * q.cols) ||
      q.scales.size() != static_cast<size_t>(q.block_rows * q.block_cols) ||
      q.block_cols != (q.cols + B - 1) / B ||
      q.block_rows != (q.spec.two_d ? (q.rows + B - 1) / B : q.rows)) {
    throw std::invalid_argument("dequantize: inconsistent QuantizedTensor shapes");
  }
  // Element decode table: E2M1 keeps e2m1_decode (low 4 bits); other formats decode through
  // a table of their valid codes, and any other code is an error.
  const bool e2m1 = q.spec.element.is_e2m1();
  float lut[256];
  if (!e2m1) {
    const ElementFormat& ef = q.spec.element;
    if (ef.kind == ElementKind::Float ? ef.fp == nullptr || ef.fp->bits() > 8
                                      : !(ef.int_min < 0 && ef.int_max > 0 && ef.int_min >= -128 &&
                                          ef.int_max <= 127)) {
      throw std::invalid_argument("dequantize: invalid element format in the QuantizedTensor");
    }
    const int nb = ef.bits();
    bool valid[256];
    for (int c = 0; c < 256; ++c) {
      bool ok = c < (1 << nb);
      if (ok && ef.kind == ElementKind::Float) {
        ok = (c & ((1 << (ef.fp->exp_bits + ef.fp->frac_bits)) - 1)) <= ef.fp->max_code();
      } else if (ok) {
        const int v = (c & (1 << (nb - 1))) ? c - (1 << nb) : c;
        ok = v >= ef.int_min && v <= ef.int_max;
      }
      valid[c] = ok;
      lut[c] = ok ? element_decode(static_cast<uint8_t>(c), ef) : 0.0f;
    }
    for (size_t i = 0; i < q.codes.size(); ++i) {
      if (!valid[q.codes[i]]) {
        throw std::invalid_argument("dequantize: element " + std::to_string(i) + " has code " +
                                    std::to_string(q.codes[i]) + ", not a valid " +
                                    q.spec.element.name() + " code");
      }
    }
  }
  const bool par = q.rows * q.cols >= kParallelMin;
#pragma omp parallel for schedule(static) if (par)
  for (int64_t r = 0; r < q.rows; ++r) {
    const int64_t br = q.spec.two_d ? r / B : r;
    for (int64_t bc = 0; bc < q.block_cols; ++bc) {
      const float gd = unit_gd ? 1.0f : q.row_gd.empty() ? q.gd : q.row_gd[static_cast<size_t>(r)];
      const float d = q.scales[static_cast<size_t>(br * q.block_cols + bc)] * gd;
      const int64_t c1 = std::min(q.cols, (bc + 1) * B);
      if (e2m1) {
        for (int64_t c = bc * B; c < c1; ++c) {
          out[r * q.cols + c] = e2m1_decode(q.codes[static_cast<size_t>(r * q.cols + c)]) * d;
        }
      } else {
        for (int64_t c = bc * B; c < c1; ++c) {
          out[r * q.cols + c] = lut[q.codes[static_cast<size_t>(r * q.cols + c)]] * d;
        }
      }
    }
  }
}

}  // namespace

void dequantize(const QuantizedTensor& q, float* out) { dequantize_with(q, false, out); }

void dequantize_block_scaled(const QuantizedTensor& q, float* out) {
  if (!q.row_gd.empty())
    throw std::invalid_argument("dequantize_block_scaled: a row-scaled QuantizedTensor has one "
                                "decode scale per row, not one per tensor");
  dequantize_with(q, true, out);
}

void quantize_dequantize(const float* x, int64_t rows, int64_t cols, const BlockQuantSpec& spec,
                         float g, const SrKey* sr, float* out) {
  detail::validate_block_quant("quantize_dequantize", rows, cols, spec, g, sr);
  quantize_dequantize_planned("quantize_dequantize", x, make_plan(rows, cols, spec, g, sr), out);
}

float tensor_decode_scale(const BlockQuantSpec& spec, float g) {
  static const SrKey unused{};  // the rounding of the elements does not enter gd
  detail::validate_block_quant("tensor_decode_scale", 0, 0, spec, g, &unused);
  return make_plan(0, 0, spec, g, nullptr).ts.gd;
}

void quantize_block_scaled(const float* x, int64_t rows, int64_t cols, const BlockQuantSpec& spec,
                           float g, const SrKey* sr, float* out) {
  dequantize_block_scaled(quantize_blocks(x, rows, cols, spec, g, sr), out);
}

TensorReference::TensorReference(int interval) : interval_(interval) {
  if (interval < 1) {
    throw std::invalid_argument("TensorReference: interval D must be >= 1, got " +
                                std::to_string(interval));
  }
}

}  // namespace fp4
