// Small floating-point formats of the FP4 recipes: element format E2M1 and the block-scale
// formats UE5M3 (paper and PTX conventions), E4M3 (fn) and UE8M0; plus a registry of named
// and spelled small floats ([u]e<E>m<M>) and integer element grids (int4, int4-sym), with
// encode/decode/round for any of them through the same rounding algorithm.
// Contract: docs/numerics.md, sections "Formats" and "Rounding a magnitude"; the formats
// beyond the contract's four: docs/formats.md.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace fp4 {

/// Rounding mode of a cast to a small format. RNE: round to nearest, ties to even.
/// SR8: the published 8-bit midpoint stochastic rounding, up = δ + (2r+1)/512 ≥ 1 with
/// r ∈ {0..255}. RNA: round to nearest, ties away from zero (IEEE 754-2019 §4.3.1
/// roundTiesToAway; PTX's `.rna`), up = δ ≥ 0.5 — the threshold rounding of Quartet II's
/// forward pass (docs/numerics.md "Rounding a magnitude").
enum class Rounding { RNE, SR8, RNA };
/// Canonical lower-case name of a rounding mode: "rne", "sr8", "rna" (recipes, CLI, Python).
const char* rounding_name(Rounding m);
/// Inverse of rounding_name. Throws std::invalid_argument "unknown rounding '<s>' (valid
/// choices: rne, sr8, rna)" for anything else; callers prefix the key or option.
Rounding parse_rounding_name(const std::string& s);

/// Block-scale formats. UE5M3 is the paper's convention (max 61440 = code 0xF7, exponent
/// field 31 reserved); UE5M3_PTX is the PTX convention (only 0xFF is NaN, max 0xFE = 114688).
enum class ScaleFormat { UE5M3, UE5M3_PTX, E4M3, UE8M0 };

/// Description of a small binary floating-point format (sign optional, IEEE-like with
/// subnormals). `max_finite` is the saturation value; codes above it are never produced.
///
/// Code layout (at most 8 bits): [sign] exponent field, fraction field, i.e.
/// `s eee…e mm…m` with the sign (if any) in bit bits()−1. A magnitude code `mag` (the code
/// without its sign bit) decodes as
///   field = mag >> frac_bits, m = mag & (2^frac_bits − 1)
///   field == 0 and subnormals:  m · 2^(1 − bias − frac_bits)
///   otherwise:                  (1 + m/2^frac_bits) · 2^(field − bias)
/// The top `reserved_top` magnitude codes (per sign) are reserved for NaN/Inf or unused by
/// the convention (UE5M3: 8, the whole exponent field 31; E4M3: 1, the NaN 0x7F; E5M2: 4, Inf
/// and NaNs; UE8M0: 1, NaN 0xFF). `max_finite` is the value of the largest unreserved code.
/// Every format here, named or spelled `[u]e<E>m<M>`, comes from parse_float_format;
/// docs/formats.md lists them with their sources.
struct FloatFormat {
  const char* name;
  bool has_sign;
  int exp_bits;
  int frac_bits;
  int bias;
  float max_finite;
  bool subnormals;  ///< false only for UE8M0 (no fraction bits, no subnormals)
  int reserved_top = 0;  ///< how many of the top magnitude codes are reserved (see above)

  /// Code width in bits: sign + exponent + fraction (1..8). UE4M3 is 7, E2M1 4, UE8M0 8.
  int bits() const { return (has_sign ? 1 : 0) + exp_bits + frac_bits; }
  /// Largest unreserved magnitude code (the code of max_finite): 2^(E+M) − 1 − reserved_top.
  int max_code() const { return (1 << (exp_bits + frac_bits)) - 1 - reserved_top; }
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
/// E1M2 (Huawei Ascend FLOAT4_E1M2 convention): bias 1, max 1.75, a uniform grid of step 0.25.
extern const FloatFormat kE1M2;
/// E3M0: bias 3 (IEEE-like), powers of two 0.25..16 and 0, no Inf/NaN.
extern const FloatFormat kE3M0;
/// E2M3 (OCP MX FP6): bias 1, max 7.5, no Inf/NaN.
extern const FloatFormat kE2M3;
/// E3M2 (OCP MX FP6): bias 3, max 28, no Inf/NaN.
extern const FloatFormat kE3M2;
/// UE4M3: unsigned E4M3 (7 bits), max 448 (0x7E), 0x7F reserved (NaN) — the NVFP4 scale as
/// hardware reads it (E4M3 with the sign bit zero).
extern const FloatFormat kUE4M3;
/// E5M2 (OCP FP8): bias 15, max 57344; exponent field 31 reserved (Inf, NaN).
extern const FloatFormat kE5M2;

/// Look up a format by name (ASCII case-insensitive): the named conventions e2m1, e1m2, e3m0,
/// e2m3, e3m2, e4m3, e5m2, ue4m3, ue5m3, ue5m3-ptx, ue8m0, or a spelled `[u]e<E>m<M>`
/// (E ≥ 1, M ≥ 0, no leading zeros, sign + E + M ≤ 8 bits) with IEEE-like bias 2^(E−1) − 1,
/// subnormals and no reserved codes (no Inf/NaN). A named convention wins over the spelling
/// rule (`e4m3` is E4M3fn with 0x7F NaN, not the IEEE-like 480). The returned reference lives
/// for the whole program (spelled formats are created once and kept).
/// Throws std::invalid_argument naming the value and the valid choices.
const FloatFormat& parse_float_format(const std::string& name);
/// Every named convention, in the order of docs/formats.md.
const std::vector<const FloatFormat*>& named_float_formats();

/// Parse a block-scale format name: any format of parse_float_format that is unsigned
/// (`ue…`), plus `e4m3` (the NVFP4 convention: E4M3 codes with the sign bit zero). Block
/// scales are positive, so other signed formats are rejected with a hint to spell `u…`.
/// The format must represent 1.0 exactly (the zero-block guard sets c_b = 1). Throws
/// std::invalid_argument naming the value.
const FloatFormat& parse_block_scale_format(const std::string& name);
/// The ScaleFormat enum value of a descriptor, if it is one of the four (by identity, or by
/// name for the same convention); false otherwise.
bool scale_format_of(const FloatFormat& fmt, ScaleFormat* out);

/// Decode a code of `fmt` (only codes < 2^bits() are valid). Signed formats: sign bit set
/// gives the negative (−0 for a zero magnitude). Throws std::invalid_argument for a code
/// ≥ 2^bits() or a reserved code (magnitude above max_code()).
float format_decode(uint8_t code, const FloatFormat& fmt);
/// Round any finite FP32 x onto `fmt` (docs/numerics.md "Rounding a magnitude": RNE or SR8 with
/// random byte r, saturating to ±max_finite, sign reapplied; ±Inf saturate). Returns the
/// value (−0 for negative inputs rounding to zero). Throws std::invalid_argument for NaN and
/// for negative values (other than −0) in an unsigned format.
float format_round(float x, const FloatFormat& fmt, Rounding mode, uint8_t r = 0);
/// Encode: format_round, then the code (sign bit set for negative x, including −0 and
/// negative values rounding to zero, as e2m1_encode). Same errors as format_round, plus
/// std::invalid_argument when the result is 0 in a format without zero (UE8M0).
/// format_encode(x, kE2M1, ...) == e2m1_encode(x, ...) for every x.
uint8_t format_encode(float x, const FloatFormat& fmt, Rounding mode, uint8_t r = 0);
/// Exact encode of a value already on the grid of `fmt` (no rounding): the code whose
/// decode is `v` (sign bit for negative v or −0 in signed formats). Throws
/// std::invalid_argument if `v` is off the grid, above max_finite, NaN/Inf, negative in an
/// unsigned format, or zero in UE8M0.
uint8_t format_code_of(float v, const FloatFormat& fmt);
/// Smallest positive normal value 2^(1 − bias) (UE8M0: 2^−127).
float format_min_normal(const FloatFormat& fmt);
/// Smallest positive value: 2^(1 − bias − frac_bits) with subnormals (equal to
/// format_min_normal when frac_bits == 0), 2^−127 for UE8M0.
float format_min_subnormal(const FloatFormat& fmt);

/// Element format of block quantization: a signed small float (FloatFormat) or a uniform
/// integer grid [int_min, int_max] (`int4`: −8..7, `int4-sym`: −7..7). Codes: the float's
/// own code (sign in the top bit), or the integer in two's complement over bits() bits.
enum class ElementKind { Float, Int };
struct ElementFormat {
  ElementKind kind = ElementKind::Float;
  const FloatFormat* fp = &kE2M1;  ///< Float: the format (static lifetime); unused for Int
  int int_min = 0;                 ///< Int: smallest integer of the grid (< 0)
  int int_max = 0;                 ///< Int: largest integer of the grid (> 0)

  /// The element maximum of the scale formulas: fp->max_finite (E2M1: 6) or int_max
  /// (int4 and int4-sym: 7). Negative int4 values may reach int_min = −8.
  float max() const { return kind == ElementKind::Float ? fp->max_finite : static_cast<float>(int_max); }
  /// Code width in bits (E2M1 4, E2M3 6, int4 4).
  int bits() const;
  /// Canonical name: the float's name, or "int<N>" / "int<N>-sym".
  std::string name() const;
  /// True for the default E2M1 element format (the contract's).
  bool is_e2m1() const { return kind == ElementKind::Float && fp == &kE2M1; }

  /// Field-wise equality (floats by ==), for round-trip checks (tests/fuzz/).
  bool operator==(const ElementFormat&) const = default;
};
/// Parse an element format: any signed name of parse_float_format (e2m1, e1m2, e3m0, e2m3,
/// e3m2, e4m3, e5m2, e<E>m<M>), or `int<N>` (−2^(N−1)..2^(N−1)−1) / `int<N>-sym`
/// (±(2^(N−1)−1)) for N in 2..8 (`int4`, `int4-sym`). Throws std::invalid_argument naming
/// the value (unsigned formats are rejected: elements carry a sign).
ElementFormat parse_element_format(const std::string& name);
/// Decode an element code. Throws std::invalid_argument for codes outside the format
/// (≥ 2^bits(), reserved float codes, or integers outside [int_min, int_max]).
float element_decode(uint8_t code, const ElementFormat& ef);
/// Round x (finite) onto the element grid and encode it: floats as format_encode; integers
/// round |x| to an integer (RNE: ties to even; SR8 as docs/numerics.md with ulp 1), saturate to
/// int_max (x ≥ 0) or −int_min (x < 0), reapply the sign (no −0: zero is code 0).
/// Throws std::invalid_argument for NaN.
uint8_t element_encode(float x, const ElementFormat& ef, Rounding mode, uint8_t r = 0);

/// Descriptor of a scale format.
const FloatFormat& scale_format_desc(ScaleFormat f);
/// Parse "ue5m3", "ue5m3-ptx", "e4m3", "ue8m0". Throws std::invalid_argument naming the value.
ScaleFormat parse_scale_format(const std::string& s);
/// Canonical lower-case name, inverse of parse_scale_format.
const char* scale_format_name(ScaleFormat f);

/// Round a magnitude a ≥ 0 (finite) onto the grid of `fmt` in FP32 arithmetic exactly as
/// docs/numerics.md "Rounding a magnitude": subnormal floor, RNE, RNA or SR8 with random byte `r`,
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

/// E2M1 encode with ties away (RNA), as threshold comparisons on |x| (≥ 0.25, 0.75, 1.25, 1.75,
/// 2.5, 3.5, 5: the number passed is the magnitude code), sign from x: the arithmetic of Quartet
/// II's rtn_fp4, inline for its per-element loops. Bit-identical to e2m1_encode(x,
/// Rounding::RNA) for every non-NaN x, ±Inf and −0 included (tests/numerics/test_ms_eden.cpp
/// `MsEden.RnaLadderIsE2m1EncodeRna`); x must not be NaN (not checked).
inline uint8_t e2m1_encode_rna(float x) {
  const float a = std::fabs(x);
  const int m = int(a >= 0.25f) + int(a >= 0.75f) + int(a >= 1.25f) + int(a >= 1.75f) +
                int(a >= 2.5f) + int(a >= 3.5f) + int(a >= 5.0f);
  return static_cast<uint8_t>(m | (std::signbit(x) ? 0x8 : 0x0));
}
/// The value of an E2M1 code, inline (e2m1_decode's table; low 4 bits used).
inline float e2m1_value(uint8_t code) {
  static constexpr float kValues[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                        -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  return kValues[code & 0xF];
}

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

/// Exponent floor of the rounding rule for `fmt`: 1 − bias (docs/numerics.md's subnormal floor)
/// for formats with subnormals; −bias for UE8M0, whose exponent field 0 is the normal value
/// 2^−127 (no fraction bits, no subnormals), so that its whole range [2^−127, 2^127] is reachable.
inline int rounding_emin(const FloatFormat& fmt) { return fmt.subnormals ? 1 - fmt.bias : -fmt.bias; }

/// (2r+1)/512 for r in 0..255: the SR8 offsets (exact in FP32).
inline float sr8_offset(uint8_t r) { return static_cast<float>(2 * int(r) + 1) * (1.0f / 512.0f); }

/// The algorithm of docs/numerics.md "Rounding a magnitude", spelled out for the hot paths;
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
/// The same steps hold for every format parse_float_format accepts (frac_bits ≤ 7, so s < 256;
/// emin ≥ −127; max_finite < 2^65 except UE8M0's 2^127). A uniform integer grid is this rule
/// with q = 0: frac_bits = emin = 7 gives e = 7 and q = 0 for every a < 256 (see kIntFrac).
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
  } else if (mode == Rounding::RNA) {
    up = static_cast<int>(delta >= 0.5f);  // ties away from zero (δ is exact)
  } else {
    up = static_cast<int>(delta + sr8_offset(r) >= 1.0f);
  }
  const float res = static_cast<float>(loi + up) * pow2f(q);
  return res < max_finite ? res : max_finite;
}

/// Parameters that make round_magnitude_params round to integers (q = 0) for magnitudes
/// below 256: frac_bits = emin = kIntFrac.
inline constexpr int kIntFrac = 7;

/// Magnitude code of a positive value v that is on the grid of `fmt` and an FP32 normal
/// number (true for every element value of a signed format here: min subnormal ≥ 2^−69):
/// exponent field and fraction read from v's FP32 bits. v == 0 gives 0.
inline uint32_t grid_magnitude_code(float v, int frac_bits, int bias, int emin) {
  const uint32_t b = std::bit_cast<uint32_t>(v);
  const int k = static_cast<int>(b >> 23) - 127;
  if (v == 0.0f) return 0;
  if (k >= emin) {
    const uint32_t mant = (b & 0x7FFFFFu) >> (23 - frac_bits);
    return (static_cast<uint32_t>(k + bias) << frac_bits) | mant;
  }
  // subnormal of the format: v = m·2^(emin − frac)
  return static_cast<uint32_t>(v * pow2f(frac_bits - emin));
}

}  // namespace detail

}  // namespace fp4
