// Small floating-point formats of the FP4 recipes: element format E2M1 and the block-scale
// formats UE5M3 (paper and PTX conventions), E4M3 (fn) and UE8M0.
// Contract: shared/NUMERICS.md, sections "Formats" and "Rounding a magnitude".
#pragma once
#include <bit>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace fp4 {

/// Rounding mode of a cast to a small format. RNE: round to nearest, ties to even.
/// SR8: the published 8-bit midpoint stochastic rounding, up = δ + (2r+1)/512 ≥ 1 with
/// r ∈ {0..255} (NUMERICS.md "Rounding a magnitude").
enum class Rounding { RNE, SR8 };

/// Block-scale formats. UE5M3 is the paper's convention (max 61440 = code 0xF7, exponent
/// field 31 reserved); UE5M3_PTX is the PTX convention (only 0xFF is NaN, max 0xFE = 114688).
enum class ScaleFormat { UE5M3, UE5M3_PTX, E4M3, UE8M0 };

/// Description of a small binary floating-point format (sign optional, IEEE-like with
/// subnormals). `max_finite` is the saturation value; codes above it are never produced.
struct FloatFormat {
  const char* name;
  bool has_sign;
  int exp_bits;
  int frac_bits;
  int bias;
  float max_finite;
  bool subnormals;  ///< false only for UE8M0 (no fraction bits, no subnormals)
};

/// E2M1: sign, 2 exponent bits, 1 fraction bit, bias 1, max 6, no Inf/NaN.
extern const FloatFormat kE2M1;
/// UE5M3 paper convention: max 61440 (0xF7), min normal 2^-14, min subnormal 2^-17.
extern const FloatFormat kUE5M3;
/// UE5M3 PTX convention: max 114688 (0xFE).
extern const FloatFormat kUE5M3PTX;
/// E4M3 (fn): max 448 (0x7E); used unsigned as the NVFP4 block scale.
extern const FloatFormat kE4M3;
/// UE8M0: powers of two 2^-127..2^127 (OCP MX block scale).
extern const FloatFormat kUE8M0;

/// Descriptor of a scale format.
const FloatFormat& scale_format_desc(ScaleFormat f);
/// Parse "ue5m3", "ue5m3-ptx", "e4m3", "ue8m0". Throws std::invalid_argument naming the value.
ScaleFormat parse_scale_format(const std::string& s);
/// Canonical lower-case name, inverse of parse_scale_format.
const char* scale_format_name(ScaleFormat f);

/// Round a magnitude a ≥ 0 (finite) onto the grid of `fmt` in FP32 arithmetic exactly as
/// NUMERICS.md "Rounding a magnitude": subnormal floor, RNE or SR8 with random byte `r`,
/// saturation to fmt.max_finite. Returns the rounded value (≥ 0). For UE8M0 (no fraction
/// bits, no subnormals) the result is a power of two in [2^-127, 2^127] or 0: its exponent
/// floor is −bias = −127 (field 0 is the normal 2^-127), not 1 − bias, and its RNE tie
/// 1.5·2^k rounds up to 2^(k+1) (lo = 1 is odd). +Inf saturates to max_finite.
/// Throws std::invalid_argument if `a` is negative or NaN (−0 is treated as 0).
float round_magnitude(float a, const FloatFormat& fmt, Rounding mode, uint8_t r = 0);

/// E2M1 decode: code 0..15 → value; 0..7 = {0, .5, 1, 1.5, 2, 3, 4, 6}, 8..15 negatives
/// (8 is −0). Only the low 4 bits of `code` are used.
float e2m1_decode(uint8_t code);
/// E2M1 encode of any finite FP32 `x`: round |x| (RNE or SR8 with byte r), saturate to ±6,
/// reapply sign. Returns the 4-bit code (sign in bit 3; −0 for negative values rounding to 0,
/// including x = −0). ±Inf saturates to ±6; throws std::invalid_argument for NaN.
uint8_t e2m1_encode(float x, Rounding mode, uint8_t r = 0);

/// Scale-format encode of a magnitude a ≥ 0 already rounded onto the format's grid
/// (i.e. a == round_magnitude(a, fmt, ...)). Returns the 8-bit code.
/// Throws std::invalid_argument if `a` is not representable (off the grid, above max_finite,
/// negative, NaN/Inf, or 0 in UE8M0, which has no zero).
uint8_t scale_encode(float a, ScaleFormat f);
/// Scale-format decode of an 8-bit code. Throws std::invalid_argument for reserved/NaN codes
/// (UE5M3 0xF8..0xFF, UE5M3_PTX 0xFF, UE8M0 0xFF, E4M3 0x7F and every code with the sign bit
/// 0x80 set: block scales are unsigned).
float scale_decode(uint8_t code, ScaleFormat f);

/// BF16 round-to-nearest-even of an FP32 value, returned as FP32 (low 16 bits zero).
/// NaN stays NaN; overflow rounds to ±Inf as in IEEE.
float round_bf16(float x);

namespace detail {

/// 2^k as an FP32 value, for k in [-149, 127] (built from the bit pattern, so exact and
/// cheaper than ldexpf; k < -126 gives the subnormal power of two). Both patterns are computed
/// and one is selected, so no branch is needed.
inline float pow2f(int k) {
  const uint32_t normal = static_cast<uint32_t>(k + 127) << 23;
  const uint32_t subnormal = 1u << ((k + 149) & 31);
  return std::bit_cast<float>(k >= -126 ? normal : subnormal);
}

/// Exponent floor of the rounding rule for `fmt`: 1 − bias (NUMERICS.md's subnormal floor)
/// for formats with subnormals; −bias for UE8M0, whose exponent field 0 is the normal value
/// 2^−127 (no fraction bits, no subnormals), so that its whole range [2^−127, 2^127] is reachable.
inline int rounding_emin(const FloatFormat& fmt) { return fmt.subnormals ? 1 - fmt.bias : -fmt.bias; }

/// (2r+1)/512 for r in 0..255: the SR8 offsets (exact in FP32).
inline float sr8_offset(uint8_t r) { return static_cast<float>(2 * int(r) + 1) * (1.0f / 512.0f); }

/// The algorithm of NUMERICS.md "Rounding a magnitude", spelled out for the hot paths;
/// fp4::round_magnitude is this function with the parameters of a FloatFormat.
///   a          value whose magnitude |a| is rounded (the sign bit is ignored, so callers
///              may pass x·e_b directly); ±Inf saturates like any value ≥ max_finite.
///              NaN returns max_finite: callers must exclude it.
///   frac_bits  fraction bits of the format (0..3 for every format here)
///   emin       exponent floor (rounding_emin): 1 − bias, or −bias for UE8M0
///   max_finite saturation value (on the grid, ≤ 2^127)
/// Every step is exact in FP32 except the SR sum, which the contract defines in FP32:
///  * |a| is first clamped to max_finite. Rounding is monotone and max_finite is on the grid
///    (it rounds to itself: δ = 0), so this gives exactly the contract's final
///    min(…, max_finite) for every a, and keeps the steps below in range.
///  * floor(log2 a) is the unbiased exponent field for a normal FP32 a. A zero or FP32-subnormal
///    a (field 0) is below 2^−126 ≤ 2^emin for every format here, and field 0 gives −127 ≤ emin,
///    so e = max(field − 127, emin) is exactly max(floor(log2 a), emin).
///  * s = a·2^−q is a scaling by a power of two whose result lies in [0, 2^(frac+1)):
///    exact (a normal number or zero, or an exact upward scaling of a subnormal).
///  * lo = floor(s): 0 ≤ s < 16, so truncation to int is floor, and exact.
///  * δ = s − lo is exact (the fractional bits of s).
///  * (lo + up)·2^q: a small integer times a power of two, exact; it is ≤ max_finite ≤ 2^127
///    (a ≤ max_finite, which is on the grid, and rounding is monotone), so nothing overflows;
///    the final min is the contract's and is kept for clarity.
/// The RNE/SR conditions use non-short-circuit operators so the compiler emits no branches.
inline float round_magnitude_params(float a, int frac_bits, int emin, float max_finite,
                                    Rounding mode, uint8_t r) {
  a = std::bit_cast<float>(std::bit_cast<uint32_t>(a) & 0x7FFFFFFFu);  // |a| (−0 → +0)
  a = a < max_finite ? a : max_finite;                                  // saturate (Inf, NaN too)
  const int field = static_cast<int>(std::bit_cast<uint32_t>(a) >> 23);
  const int e = field - 127 > emin ? field - 127 : emin;  // max(floor(log2 a), emin)
  const int q = e - frac_bits;
  const float s = a * pow2f(-q);
  const int loi = static_cast<int>(s);
  const float delta = s - static_cast<float>(loi);
  int up;
  if (mode == Rounding::RNE) {
    up = static_cast<int>(delta > 0.5f) | (static_cast<int>(delta == 0.5f) & (loi & 1));
  } else {
    up = static_cast<int>(delta + sr8_offset(r) >= 1.0f);
  }
  const float res = static_cast<float>(loi + up) * pow2f(q);
  return res < max_finite ? res : max_finite;
}

}  // namespace detail

}  // namespace fp4
