// Small floating-point formats: constants, rounding, encode/decode.
// Contract: shared/NUMERICS.md "Formats" and "Rounding a magnitude". The rounding algorithm
// itself lives in fp4::detail::round_magnitude_params (format.h) so that the hot loops of
// block_quant.cpp can inline it; this file gives it its FloatFormat-level interface.
#include "fp4/format.h"

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <string>

namespace fp4 {

const FloatFormat kE2M1{"e2m1", true, 2, 1, 1, 6.0f, true};
const FloatFormat kUE5M3{"ue5m3", false, 5, 3, 15, 61440.0f, true};
const FloatFormat kUE5M3PTX{"ue5m3-ptx", false, 5, 3, 15, 114688.0f, true};
const FloatFormat kE4M3{"e4m3", true, 4, 3, 7, 448.0f, true};
const FloatFormat kUE8M0{"ue8m0", false, 8, 0, 127, 0x1p127f, false};

namespace {

std::string fmt_float(float a) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(a));
  return buf;
}

/// Largest valid (non-NaN, non-reserved) code of a scale format, i.e. the code of max_finite.
uint8_t max_scale_code(ScaleFormat f) {
  switch (f) {
    case ScaleFormat::UE5M3: return 0xF7;      // exponent field 31 reserved
    case ScaleFormat::UE5M3_PTX: return 0xFE;  // only 0xFF is NaN
    case ScaleFormat::E4M3: return 0x7E;       // 0x7F NaN; 0x80.. carry the sign bit
    case ScaleFormat::UE8M0: return 0xFE;      // 0xFF NaN
  }
  return 0;
}

constexpr float kE2M1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

}  // namespace

const FloatFormat& scale_format_desc(ScaleFormat f) {
  switch (f) {
    case ScaleFormat::UE5M3: return kUE5M3;
    case ScaleFormat::UE5M3_PTX: return kUE5M3PTX;
    case ScaleFormat::E4M3: return kE4M3;
    case ScaleFormat::UE8M0: return kUE8M0;
  }
  throw std::invalid_argument("scale_format_desc: invalid ScaleFormat value");
}

ScaleFormat parse_scale_format(const std::string& s) {
  if (s == "ue5m3") return ScaleFormat::UE5M3;
  if (s == "ue5m3-ptx") return ScaleFormat::UE5M3_PTX;
  if (s == "e4m3") return ScaleFormat::E4M3;
  if (s == "ue8m0") return ScaleFormat::UE8M0;
  throw std::invalid_argument("unknown scale format '" + s +
                              "' (valid choices: ue5m3, ue5m3-ptx, e4m3, ue8m0)");
}

const char* scale_format_name(ScaleFormat f) { return scale_format_desc(f).name; }

float round_magnitude(float a, const FloatFormat& fmt, Rounding mode, uint8_t r) {
  if (!(a >= 0.0f)) {
    throw std::invalid_argument("round_magnitude: magnitude must be >= 0 and not NaN, got " +
                                fmt_float(a));
  }
  return detail::round_magnitude_params(a, fmt.frac_bits, detail::rounding_emin(fmt), fmt.max_finite,
                                        mode, r);
}

float e2m1_decode(uint8_t code) { return kE2M1Values[code & 0xF]; }

uint8_t e2m1_encode(float x, Rounding mode, uint8_t r) {
  if (std::isnan(x)) throw std::invalid_argument("e2m1_encode: NaN input");
  // Rounded magnitude v ∈ {0, .5, 1, 1.5, 2, 3, 4, 6}; 2v ∈ {0,1,2,3,4,6,8,12} indexes codes.
  static constexpr uint8_t kCodeOfTwiceValue[13] = {0, 1, 2, 3, 4, 0, 5, 0, 6, 0, 0, 0, 7};
  const float v = detail::round_magnitude_params(x, kE2M1.frac_bits, 1 - kE2M1.bias,
                                                 kE2M1.max_finite, mode, r);
  const uint8_t mag = kCodeOfTwiceValue[static_cast<int>(v * 2.0f)];
  return static_cast<uint8_t>(mag | (std::signbit(x) ? 0x8 : 0x0));
}

uint8_t scale_encode(float a, ScaleFormat f) {
  const FloatFormat& fmt = scale_format_desc(f);
  auto fail = [&](const char* why) -> std::invalid_argument {
    return std::invalid_argument(std::string("scale_encode: ") + fmt_float(a) +
                                 " is not representable in " + fmt.name + " (" + why + ")");
  };
  if (!(a >= 0.0f) || std::isinf(a)) throw fail("negative, NaN or Inf");
  if (a > fmt.max_finite) throw fail("above the maximum finite value");
  if (a == 0.0f) {
    if (!fmt.subnormals) throw fail("zero has no UE8M0 code");
    return 0;
  }
  const int k = std::ilogb(a);  // exact floor(log2 a), also for FP32 subnormals
  const int emin = detail::rounding_emin(fmt);
  const int frac_one = 1 << fmt.frac_bits;
  int field, mant;
  if (k >= emin) {
    // normal: a = (1 + m/2^frac)·2^k, field = k + bias
    const float m = std::ldexp(a, fmt.frac_bits - k);  // exact, in [2^frac, 2^(frac+1))
    if (m != std::floor(m)) throw fail("not on the format's grid");
    field = k + fmt.bias;
    mant = static_cast<int>(m) - frac_one;
  } else {
    // subnormal (formats with subnormals only): a = m·2^(emin − frac), 1 ≤ m < 2^frac
    if (!fmt.subnormals) throw fail("below the minimum value");
    const float m = std::ldexp(a, fmt.frac_bits - emin);
    if (m != std::floor(m) || m < 1.0f) throw fail("not on the format's grid");
    field = 0;
    mant = static_cast<int>(m);
  }
  const int code = (field << fmt.frac_bits) | mant;
  if (code > max_scale_code(f)) throw fail("reserved code");
  return static_cast<uint8_t>(code);
}

float scale_decode(uint8_t code, ScaleFormat f) {
  const FloatFormat& fmt = scale_format_desc(f);
  if (code > max_scale_code(f)) {
    char buf[128];
    std::snprintf(buf, sizeof buf,
                  "scale_decode: code 0x%02X is reserved/NaN in %s (largest valid code 0x%02X)",
                  code, fmt.name, max_scale_code(f));
    throw std::invalid_argument(buf);
  }
  const int field = code >> fmt.frac_bits;
  const int mant = code & ((1 << fmt.frac_bits) - 1);
  if (!fmt.subnormals) return std::ldexp(1.0f, field - fmt.bias);  // UE8M0: 2^(code − 127)
  if (field == 0) return std::ldexp(static_cast<float>(mant), 1 - fmt.bias - fmt.frac_bits);
  return std::ldexp(static_cast<float>((1 << fmt.frac_bits) + mant),
                    field - fmt.bias - fmt.frac_bits);
}

float round_bf16(float x) {
  uint32_t b = std::bit_cast<uint32_t>(x);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) {
    // NaN: keep sign and top payload, force the quiet bit so truncation stays NaN.
    return std::bit_cast<float>((b | 0x00400000u) & 0xFFFF0000u);
  }
  b += 0x7FFFu + ((b >> 16) & 1u);  // RNE on the low 16 bits; carries into the exponent
  return std::bit_cast<float>(b & 0xFFFF0000u);
}

}  // namespace fp4
