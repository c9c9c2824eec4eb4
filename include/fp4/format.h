// Small floating-point formats of the FP4 recipes: element format E2M1 and the block-scale
// formats UE5M3 (paper and PTX conventions), E4M3 (fn) and UE8M0.
// Contract: shared/NUMERICS.md, sections "Formats" and "Rounding a magnitude".
#pragma once
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
/// bits, no subnormals) the result is a power of two in [2^-127, 2^127] or 0.
float round_magnitude(float a, const FloatFormat& fmt, Rounding mode, uint8_t r = 0);

/// E2M1 decode: code 0..15 → value; 0..7 = {0, .5, 1, 1.5, 2, 3, 4, 6}, 8..15 negatives
/// (8 is −0). Only the low 4 bits of `code` are used.
float e2m1_decode(uint8_t code);
/// E2M1 encode of any finite FP32 `x`: round |x| (RNE or SR8 with byte r), saturate to ±6,
/// reapply sign. Returns the 4-bit code (sign in bit 3; −0 for negative values rounding to 0).
uint8_t e2m1_encode(float x, Rounding mode, uint8_t r = 0);

/// Scale-format encode of a magnitude a ≥ 0 already rounded onto the format's grid
/// (i.e. a == round_magnitude(a, fmt, ...)). Returns the 8-bit code.
/// Throws std::invalid_argument if `a` is not representable.
uint8_t scale_encode(float a, ScaleFormat f);
/// Scale-format decode of an 8-bit code. Throws std::invalid_argument for reserved/NaN codes.
float scale_decode(uint8_t code, ScaleFormat f);

/// BF16 round-to-nearest-even of an FP32 value, returned as FP32 (low 16 bits zero).
/// NaN stays NaN; overflow rounds to ±Inf as in IEEE.
float round_bf16(float x);

}  // namespace fp4
