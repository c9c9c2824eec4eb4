// Small floating-point formats: constants, rounding, encode/decode.
// Contract: docs/numerics.md "Formats" and "Rounding a magnitude". The rounding algorithm
// itself lives in fp4::detail::round_magnitude_params (format.h) so that the hot loops of
// block_quant.cpp can inline it; this file gives it its FloatFormat-level interface.
#include "fp4/numerics/format.h"

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace fp4 {

// Named conventions; sources in docs/formats.md. Fields: name, sign, E, M, bias, max finite,
// subnormals, reserved top magnitude codes.
const FloatFormat kE2M1{"e2m1", true, 2, 1, 1, 6.0f, true, 0};                // OCP MX v1.0
const FloatFormat kUE5M3{"ue5m3", false, 5, 3, 15, 61440.0f, true, 8};        // paper: field 31
const FloatFormat kUE5M3PTX{"ue5m3-ptx", false, 5, 3, 15, 114688.0f, true, 1};  // PTX: 0xFF NaN
const FloatFormat kE4M3{"e4m3", true, 4, 3, 7, 448.0f, true, 1};              // OCP: 0x7F NaN
const FloatFormat kUE8M0{"ue8m0", false, 8, 0, 127, 0x1p127f, false, 1};      // OCP: 0xFF NaN
const FloatFormat kE1M2{"e1m2", true, 1, 2, 1, 1.75f, true, 0};               // Ascend FLOAT4_E1M2
const FloatFormat kE3M0{"e3m0", true, 3, 0, 3, 16.0f, true, 0};               // IEEE-like
const FloatFormat kE2M3{"e2m3", true, 2, 3, 1, 7.5f, true, 0};                // OCP MX v1.0 FP6
const FloatFormat kE3M2{"e3m2", true, 3, 2, 3, 28.0f, true, 0};               // OCP MX v1.0 FP6
const FloatFormat kUE4M3{"ue4m3", false, 4, 3, 7, 448.0f, true, 1};           // unsigned E4M3
const FloatFormat kE5M2{"e5m2", true, 5, 2, 15, 57344.0f, true, 4};           // OCP FP8: Inf, NaN

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

const char* rounding_name(Rounding m) {
  switch (m) {
    case Rounding::SR8: return "sr8";
    case Rounding::RNA: return "rna";
    default: return "rne";
  }
}

Rounding parse_rounding_name(const std::string& s) {
  for (Rounding m : {Rounding::RNE, Rounding::SR8, Rounding::RNA})
    if (s == rounding_name(m)) return m;
  throw std::invalid_argument("unknown rounding '" + s + "' (valid choices: rne, sr8, rna)");
}

float round_magnitude(float a, const FloatFormat& fmt, Rounding mode, uint8_t r) {
  if (!(a >= 0.0f)) {
    throw std::invalid_argument("round_magnitude: magnitude must be >= 0 and not NaN, got " +
                                fmt_float(a));
  }
  return detail::round_magnitude_params(a, fmt.frac_bits, detail::rounding_emin(fmt), fmt.max_finite,
                                        mode, r);
}

float e2m1_decode(uint8_t code) { return e2m1_value(code); }

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

// ------------------------------------------------------------------ format registry

namespace {

std::string lower(const std::string& s) {
  std::string o = s;
  for (char& c : o)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return o;
}

/// Parse a decimal number without sign or leading zeros ("0" allowed) at s[i..]; returns -1
/// on failure and advances i past the digits.
int parse_small_uint(const std::string& s, size_t& i) {
  const size_t i0 = i;
  int v = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
    v = v * 10 + (s[i] - '0');
    if (v > 99) return -1;
    ++i;
  }
  if (i == i0 || (s[i0] == '0' && i - i0 > 1)) return -1;
  return v;
}

/// Value of the largest unreserved code of an IEEE-like format (field, m from max_code()).
float ieee_like_max(bool subnormals, int E, int M, int bias, int reserved) {
  const int mag = (1 << (E + M)) - 1 - reserved;
  const int field = mag >> M, m = mag & ((1 << M) - 1);
  if (field == 0 && subnormals) return std::ldexp(static_cast<float>(m), 1 - bias - M);
  return std::ldexp(static_cast<float>((1 << M) + m), field - bias - M);
}

/// Spelled formats, created on first use and kept for the program's life (stable addresses:
/// std::deque never moves its elements). At most 2·(sum over E of allowed M) entries.
struct SpelledRegistry {
  std::mutex mu;
  std::deque<std::string> names;
  std::deque<FloatFormat> formats;
};
SpelledRegistry& spelled_registry() {
  static SpelledRegistry r;
  return r;
}

const char* kNamedList =
    "e2m1, e1m2, e3m0, e2m3, e3m2, e4m3, e5m2, ue4m3, ue5m3, ue5m3-ptx, ue8m0, or a spelled "
    "[u]e<E>m<M> with E >= 1, M >= 0 and at most 8 bits (e.g. e3m4, ue6m2)";

}  // namespace

const std::vector<const FloatFormat*>& named_float_formats() {
  static const std::vector<const FloatFormat*> v = {&kE2M1, &kE1M2,  &kE3M0,  &kE2M3,
                                                    &kE3M2, &kE4M3,  &kE5M2,  &kUE4M3,
                                                    &kUE5M3, &kUE5M3PTX, &kUE8M0};
  return v;
}

const FloatFormat& parse_float_format(const std::string& name) {
  const std::string s = lower(name);
  for (const FloatFormat* f : named_float_formats())
    if (s == f->name) return *f;
  // [u]e<E>m<M>
  size_t i = 0;
  const bool has_sign = !(i < s.size() && s[i] == 'u');
  if (!has_sign) ++i;
  int E = -1, M = -1;
  if (i < s.size() && s[i] == 'e') {
    ++i;
    E = parse_small_uint(s, i);
    if (E >= 0 && i < s.size() && s[i] == 'm') {
      ++i;
      M = parse_small_uint(s, i);
    }
  }
  if (E < 0 || M < 0 || i != s.size()) {
    throw std::invalid_argument("unknown format '" + name + "' (valid: " + kNamedList + ")");
  }
  const int bits = (has_sign ? 1 : 0) + E + M;
  if (E < 1 || bits > 8) {
    throw std::invalid_argument("format '" + name + "' is not supported: " +
                                (E < 1 ? std::string("it needs at least 1 exponent bit")
                                       : "it has " + std::to_string(bits) +
                                             " bits (sign + E + M must be at most 8)") +
                                " (valid: " + kNamedList + ")");
  }
  const std::string canon = std::string(has_sign ? "" : "u") + "e" + std::to_string(E) + "m" +
                            std::to_string(M);
  SpelledRegistry& reg = spelled_registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  for (const FloatFormat& f : reg.formats)
    if (canon == f.name) return f;
  reg.names.push_back(canon);
  const int bias = (1 << (E - 1)) - 1;
  reg.formats.push_back(FloatFormat{reg.names.back().c_str(), has_sign, E, M, bias,
                                    ieee_like_max(true, E, M, bias, 0), true, 0});
  return reg.formats.back();
}

const FloatFormat& parse_block_scale_format(const std::string& name) {
  static const char* kValid =
      "valid: ue5m3, ue5m3-ptx, e4m3, ue8m0, ue4m3, or a spelled ue<E>m<M> of at most 8 bits";
  const FloatFormat* fp;
  try {
    fp = &parse_float_format(name);
  } catch (const std::invalid_argument&) {
    throw std::invalid_argument("unknown block-scale format '" + name + "' (" + kValid + ")");
  }
  const FloatFormat& f = *fp;
  if (f.has_sign && &f != &kE4M3) {
    throw std::invalid_argument("'" + name + "' is not a block-scale format: block scales are " +
                                "unsigned (try 'u" + f.name + "'; " + kValid + ")");
  }
  if (round_magnitude(1.0f, f, Rounding::RNE) != 1.0f) {
    throw std::invalid_argument("'" + name +
                                "' cannot be a block-scale format: it cannot represent 1.0, "
                                "which the zero-block guard needs");
  }
  return f;
}

bool scale_format_of(const FloatFormat& fmt, ScaleFormat* out) {
  for (ScaleFormat f :
       {ScaleFormat::UE5M3, ScaleFormat::UE5M3_PTX, ScaleFormat::E4M3, ScaleFormat::UE8M0}) {
    if (&fmt == &scale_format_desc(f)) {
      if (out) *out = f;
      return true;
    }
  }
  return false;
}

// ------------------------------------------------------------- generic encode/decode

float format_decode(uint8_t code, const FloatFormat& fmt) {
  const int nb = fmt.bits();
  const int mag_bits = fmt.exp_bits + fmt.frac_bits;
  const int mag = code & ((1 << mag_bits) - 1);
  if (code >= (1 << nb) || mag > fmt.max_code()) {
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "format_decode: code 0x%02X is %s in %s (largest valid magnitude code 0x%02X)",
                  code, code >= (1 << nb) ? "wider than the format" : "reserved", fmt.name,
                  fmt.max_code());
    throw std::invalid_argument(buf);
  }
  const bool neg = fmt.has_sign && ((code >> mag_bits) & 1);
  const int field = mag >> fmt.frac_bits;
  const int m = mag & ((1 << fmt.frac_bits) - 1);
  float v;
  if (!fmt.subnormals) {
    v = std::ldexp(static_cast<float>((1 << fmt.frac_bits) + m), field - fmt.bias - fmt.frac_bits);
  } else if (field == 0) {
    v = std::ldexp(static_cast<float>(m), 1 - fmt.bias - fmt.frac_bits);
  } else {
    v = std::ldexp(static_cast<float>((1 << fmt.frac_bits) + m), field - fmt.bias - fmt.frac_bits);
  }
  return neg ? -v : v;
}

float format_round(float x, const FloatFormat& fmt, Rounding mode, uint8_t r) {
  if (std::isnan(x)) throw std::invalid_argument(std::string("format_round: NaN input (") + fmt.name + ")");
  if (!fmt.has_sign && x < 0.0f) {
    throw std::invalid_argument("format_round: " + fmt_float(x) + " is negative; " + fmt.name +
                                " is unsigned");
  }
  const float v = detail::round_magnitude_params(x, fmt.frac_bits, detail::rounding_emin(fmt),
                                                 fmt.max_finite, mode, r);
  return (fmt.has_sign && std::signbit(x)) ? -v : v;
}

uint8_t format_code_of(float v, const FloatFormat& fmt) {
  auto fail = [&](const char* why) -> std::invalid_argument {
    return std::invalid_argument(std::string("format_code_of: ") + fmt_float(v) +
                                 " is not representable in " + fmt.name + " (" + why + ")");
  };
  if (std::isnan(v) || std::isinf(v)) throw fail("NaN or Inf");
  const bool neg = std::signbit(v);
  if (neg && !fmt.has_sign && v != 0.0f) throw fail("negative value in an unsigned format");
  const float a = std::fabs(v);
  if (a > fmt.max_finite) throw fail("above the maximum finite value");
  int mag;
  if (a == 0.0f) {
    if (!fmt.subnormals) throw fail("the format has no zero");
    mag = 0;
  } else {
    const int k = std::ilogb(a);  // exact floor(log2 a), also for FP32 subnormals
    const int emin = detail::rounding_emin(fmt);
    if (k >= emin) {
      const float m = std::ldexp(a, fmt.frac_bits - k);  // exact, in [2^frac, 2^(frac+1))
      if (m != std::floor(m)) throw fail("not on the format's grid");
      mag = ((k + fmt.bias) << fmt.frac_bits) | (static_cast<int>(m) - (1 << fmt.frac_bits));
    } else {
      if (!fmt.subnormals) throw fail("below the minimum value");
      const float m = std::ldexp(a, fmt.frac_bits - emin);
      if (m != std::floor(m) || m < 1.0f) throw fail("not on the format's grid");
      mag = static_cast<int>(m);
    }
  }
  if (mag > fmt.max_code()) throw fail("reserved code");
  const int sign = (neg && fmt.has_sign) ? 1 << (fmt.exp_bits + fmt.frac_bits) : 0;
  return static_cast<uint8_t>(mag | sign);
}

uint8_t format_encode(float x, const FloatFormat& fmt, Rounding mode, uint8_t r) {
  const float v = format_round(x, fmt, mode, r);
  if (v == 0.0f && !fmt.subnormals) {
    throw std::invalid_argument("format_encode: " + fmt_float(x) + " rounds to 0, which " +
                                fmt.name + " cannot represent");
  }
  return format_code_of(v, fmt);
}

float format_min_normal(const FloatFormat& fmt) {
  return std::ldexp(1.0f, detail::rounding_emin(fmt));
}

float format_min_subnormal(const FloatFormat& fmt) {
  if (!fmt.subnormals) return format_min_normal(fmt);
  return std::ldexp(1.0f, 1 - fmt.bias - fmt.frac_bits);
}

// ------------------------------------------------------------------ element formats

int ElementFormat::bits() const {
  if (kind == ElementKind::Float) return fp->bits();
  int w = 1;
  while (w < 8 && (int_min < -(1 << (w - 1)) || int_max > (1 << (w - 1)) - 1)) ++w;
  return w;
}

std::string ElementFormat::name() const {
  if (kind == ElementKind::Float) return fp->name;
  const int w = bits();
  return "int" + std::to_string(w) + (int_min == -int_max ? "-sym" : "");
}

ElementFormat parse_element_format(const std::string& name) {
  const std::string s = lower(name);
  ElementFormat ef;
  if (s.rfind("int", 0) == 0) {
    size_t i = 3;
    const int n = parse_small_uint(s, i);
    const bool sym = s.compare(i, std::string::npos, "-sym") == 0;
    if (n < 2 || n > 8 || (i != s.size() && !sym)) {
      throw std::invalid_argument("unknown element format '" + name +
                                  "' (integer grids: int<N> or int<N>-sym with N in 2..8, e.g. "
                                  "int4 = -8..7, int4-sym = -7..7)");
    }
    ef.kind = ElementKind::Int;
    ef.fp = nullptr;
    ef.int_max = (1 << (n - 1)) - 1;
    ef.int_min = sym ? -ef.int_max : -(1 << (n - 1));
    return ef;
  }
  const FloatFormat* f;
  try {
    f = &parse_float_format(s);
  } catch (const std::invalid_argument&) {
    throw std::invalid_argument("unknown element format '" + name +
                                "' (valid: e2m1, e1m2, e3m0, e2m3, e3m2, e4m3, e5m2, a spelled "
                                "e<E>m<M> of at most 8 bits, int4, int4-sym, int<N>[-sym])");
  }
  if (!f->has_sign) {
    std::string hint = "use a signed format";
    if (f->bits() < 8 && f->name[0] == 'u') hint = "try '" + std::string(f->name + 1) + "'";
    throw std::invalid_argument("'" + name + "' cannot be an element format: it is unsigned and "
                                "elements carry a sign (" + hint + ")");
  }
  ef.kind = ElementKind::Float;
  ef.fp = f;
  return ef;
}

float element_decode(uint8_t code, const ElementFormat& ef) {
  if (ef.kind == ElementKind::Float) return format_decode(code, *ef.fp);
  const int w = ef.bits();
  if (code >= (1 << w)) {
    throw std::invalid_argument("element_decode: code " + std::to_string(code) + " is wider than " +
                                ef.name());
  }
  const int v = (code & (1 << (w - 1))) ? static_cast<int>(code) - (1 << w) : code;
  if (v < ef.int_min || v > ef.int_max) {
    throw std::invalid_argument("element_decode: code " + std::to_string(code) + " (" +
                                std::to_string(v) + ") is outside " + ef.name());
  }
  return static_cast<float>(v);
}

uint8_t element_encode(float x, const ElementFormat& ef, Rounding mode, uint8_t r) {
  if (ef.kind == ElementKind::Float) return format_encode(x, *ef.fp, mode, r);
  if (std::isnan(x)) throw std::invalid_argument("element_encode: NaN input");
  const float mx = std::signbit(x) ? static_cast<float>(-ef.int_min) : static_cast<float>(ef.int_max);
  const float v = detail::round_magnitude_params(x, detail::kIntFrac, detail::kIntFrac, mx, mode, r);
  const int q = std::signbit(x) ? -static_cast<int>(v) : static_cast<int>(v);
  return static_cast<uint8_t>(q & ((1 << ef.bits()) - 1));
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
