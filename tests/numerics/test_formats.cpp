// Tests of the format registry (named and spelled small floats, INT grids), the element
// formats of block quantization and the MXFP4 scale rules. Expected values are written from
// the specs (OCP MX v1.0, the UE5M3 paper, PTX, docs/formats.md) by hand, or computed by
// independent slow references in this file (grid enumeration in double) — never by the code
// under test.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "fp4/numerics/block_quant.h"
#include "fp4/base/error.h"
#include "fp4/numerics/format.h"
#include "fp4/recipe/recipe.h"

using namespace fp4;
namespace fs = std::filesystem;

namespace {

uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }

// ------------------------------------------------------------------ hand tables

/// Non-negative values of the small formats, magnitude code 0, 1, 2, ... written out by hand
/// from the format definitions (field 0: m·2^(1−bias−M); else (1 + m/2^M)·2^(field−bias)).
const std::vector<double> kE2M1Pos = {0, 0.5, 1, 1.5, 2, 3, 4, 6};  // OCP MX v1.0 table
const std::vector<double> kE1M2Pos = {0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75};  // bias 1
const std::vector<double> kE3M0Pos = {0, 0.25, 0.5, 1, 2, 4, 8, 16};            // bias 3
const std::vector<double> kE2M3Pos = {                                          // OCP FP6
    0,   0.125, 0.25,  0.375, 0.5, 0.625, 0.75, 0.875,  // subnormals m/8
    1,   1.125, 1.25,  1.375, 1.5, 1.625, 1.75, 1.875,  // 2^0
    2,   2.25,  2.5,   2.75,  3,   3.25,  3.5,  3.75,   // 2^1
    4,   4.5,   5,     5.5,   6,   6.5,   7,    7.5};   // 2^2, max 7.5
const std::vector<double> kE3M2Pos = {                  // OCP FP6
    0,    0.0625, 0.125, 0.1875,  // subnormals m/16
    0.25, 0.3125, 0.375, 0.4375,  // 2^-2
    0.5,  0.625,  0.75,  0.875,   // 2^-1
    1,    1.25,   1.5,   1.75,    // 2^0
    2,    2.5,    3,     3.5,     // 2^1
    4,    5,      6,     7,       // 2^2
    8,    10,     12,    14,      // 2^3
    16,   20,     24,    28};     // 2^4, max 28

/// Value of magnitude code `mag` of an IEEE-like format, written in double in the test
/// (the definition of docs/formats.md; used for the 8-bit formats next to hand anchors).
double ref_value(int M, int bias, int mag, bool subnormals = true) {
  const int field = mag >> M, m = mag & ((1 << M) - 1);
  if (field == 0 && subnormals) return std::ldexp(double(m), 1 - bias - M);
  return std::ldexp(1.0 + double(m) / double(1 << M), field - bias);
}
std::vector<double> ref_grid(int M, int bias, int n_mag, bool subnormals = true) {
  std::vector<double> g;
  for (int c = 0; c < n_mag; ++c) g.push_back(ref_value(M, bias, c, subnormals));
  return g;
}

struct Named {
  const char* name;
  int bits;
  bool sign;
  int E, M, bias;
  double max;
  int reserved;             ///< reserved top magnitude codes
  std::vector<double> pos;  ///< values of magnitude codes 0..max_code
};

std::vector<Named> named_table() {
  return {
      {"e2m1", 4, true, 2, 1, 1, 6.0, 0, kE2M1Pos},
      {"e1m2", 4, true, 1, 2, 1, 1.75, 0, kE1M2Pos},
      {"e3m0", 4, true, 3, 0, 3, 16.0, 0, kE3M0Pos},
      {"e2m3", 6, true, 2, 3, 1, 7.5, 0, kE2M3Pos},
      {"e3m2", 6, true, 3, 2, 3, 28.0, 0, kE3M2Pos},
      {"e4m3", 8, true, 4, 3, 7, 448.0, 1, ref_grid(3, 7, 0x7F)},        // 0x7F NaN
      {"e5m2", 8, true, 5, 2, 15, 57344.0, 4, ref_grid(2, 15, 0x7C)},    // 0x7C Inf, NaNs
      {"ue4m3", 7, false, 4, 3, 7, 448.0, 1, ref_grid(3, 7, 0x7F)},      // 0x7F NaN
      {"ue5m3", 8, false, 5, 3, 15, 61440.0, 8, ref_grid(3, 15, 0xF8)},  // field 31 reserved
      {"ue5m3-ptx", 8, false, 5, 3, 15, 114688.0, 1, ref_grid(3, 15, 0xFF)},  // 0xFF NaN
      {"ue8m0", 8, false, 8, 0, 127, std::ldexp(1.0, 127), 1,
       ref_grid(0, 127, 0xFF, /*subnormals=*/false)},  // 2^(c−127), 0xFF NaN
  };
}

/// Index of the RNE result of a ≥ 0 on a sorted positive grid (saturating). Ties go to the
/// even significand: for M ≥ 1 that is the even magnitude code; for M = 0 every normal
/// significand is 1 (odd), so a tie rounds up, except the tie between 0 and the smallest
/// value (significand 0, even), which rounds to 0 (docs/numerics.md "Rounding a magnitude").
size_t ref_rne_index(const std::vector<double>& g, double a, int M) {
  if (a >= g.back()) return g.size() - 1;
  const size_t i = static_cast<size_t>(std::upper_bound(g.begin(), g.end(), a) - g.begin()) - 1;
  const double dlo = a - g[i], dhi = g[i + 1] - a;
  if (dlo < dhi) return i;
  if (dlo > dhi) return i + 1;
  if (M == 0) return g[i] == 0.0 ? i : i + 1;
  return (i % 2 == 0) ? i : i + 1;
}

const FloatFormat& F(const char* n) { return parse_float_format(n); }

}  // namespace

// ---------------------------------------------------------------- named formats

TEST(Formats, NamedDescriptorsMatchTheirSpecs) {
  for (const Named& n : named_table()) {
    SCOPED_TRACE(n.name);
    const FloatFormat& f = F(n.name);
    EXPECT_STREQ(f.name, n.name);
    EXPECT_EQ(f.bits(), n.bits);
    EXPECT_EQ(f.has_sign, n.sign);
    EXPECT_EQ(f.exp_bits, n.E);
    EXPECT_EQ(f.frac_bits, n.M);
    EXPECT_EQ(f.bias, n.bias);
    EXPECT_EQ(double(f.max_finite), n.max);
    EXPECT_EQ(f.reserved_top, n.reserved);
    EXPECT_EQ(f.max_code() + 1, static_cast<int>(n.pos.size()));
    EXPECT_EQ(n.pos.back(), n.max);  // the table's last value is the spec's max
  }
  // The existing constants are the same objects as the parsed names.
  EXPECT_EQ(&F("e2m1"), &kE2M1);
  EXPECT_EQ(&F("ue5m3"), &kUE5M3);
  EXPECT_EQ(&F("ue5m3-ptx"), &kUE5M3PTX);
  EXPECT_EQ(&F("e4m3"), &kE4M3);
  EXPECT_EQ(&F("ue8m0"), &kUE8M0);
  EXPECT_EQ(&F("UE4M3"), &kUE4M3);  // case-insensitive
  EXPECT_EQ(named_float_formats().size(), named_table().size());
}

TEST(Formats, HandAnchors) {
  // OCP MX v1.0: E4M3 max S.1111.110 = 448, min normal 2^-6, min subnormal 2^-9.
  EXPECT_EQ(format_decode(0x7E, kE4M3), 448.f);
  EXPECT_EQ(format_decode(0xFE, kE4M3), -448.f);
  EXPECT_EQ(format_decode(0x08, kE4M3), 0x1p-6f);
  EXPECT_EQ(format_decode(0x01, kE4M3), 0x1p-9f);
  EXPECT_EQ(format_min_normal(kE4M3), 0x1p-6f);
  EXPECT_EQ(format_min_subnormal(kE4M3), 0x1p-9f);
  // E5M2: max S.11110.11 = 57344, min normal 2^-14, min subnormal 2^-16.
  EXPECT_EQ(format_decode(0x7B, F("e5m2")), 57344.f);
  EXPECT_EQ(format_decode(0x04, F("e5m2")), 0x1p-14f);
  EXPECT_EQ(format_decode(0x01, F("e5m2")), 0x1p-16f);
  // E3M2: max 28 (0x1F), min normal 0.25 (0x04), min subnormal 0.0625.
  EXPECT_EQ(format_decode(0x1F, F("e3m2")), 28.f);
  EXPECT_EQ(format_decode(0x3F, F("e3m2")), -28.f);
  EXPECT_EQ(format_min_normal(F("e3m2")), 0.25f);
  EXPECT_EQ(format_min_subnormal(F("e3m2")), 0.0625f);
  // E2M3: max 7.5 (0x1F), min normal 1, min subnormal 0.125.
  EXPECT_EQ(format_decode(0x1F, F("e2m3")), 7.5f);
  EXPECT_EQ(format_min_normal(F("e2m3")), 1.f);
  EXPECT_EQ(format_min_subnormal(F("e2m3")), 0.125f);
  // UE5M3 (paper): 0xF7 = 61440, 0x78 = 1, 0x08 = 2^-14, 0x01 = 2^-17.
  EXPECT_EQ(format_decode(0xF7, kUE5M3), 61440.f);
  EXPECT_EQ(format_decode(0x78, kUE5M3), 1.f);
  EXPECT_EQ(format_decode(0x08, kUE5M3), 0x1p-14f);
  EXPECT_EQ(format_decode(0x01, kUE5M3), 0x1p-17f);
  EXPECT_EQ(format_decode(0xFE, kUE5M3PTX), 114688.f);
  // UE4M3: the NVFP4 scale read as unsigned E4M3: 0x7E = 448, 0x38 = 1.
  EXPECT_EQ(format_decode(0x7E, kUE4M3), 448.f);
  EXPECT_EQ(format_decode(0x38, kUE4M3), 1.f);
  // UE8M0: 2^(code − 127).
  EXPECT_EQ(format_decode(0, kUE8M0), 0x1p-127f);
  EXPECT_EQ(format_decode(127, kUE8M0), 1.f);
  EXPECT_EQ(format_decode(0xFE, kUE8M0), 0x1p127f);
  EXPECT_EQ(format_min_normal(kUE8M0), 0x1p-127f);
  EXPECT_EQ(format_min_subnormal(kUE8M0), 0x1p-127f);
}

TEST(Formats, EveryCodeDecodesToTheSpecTable) {
  for (const Named& n : named_table()) {
    SCOPED_TRACE(n.name);
    const FloatFormat& f = F(n.name);
    const int mag_bits = n.E + n.M;
    const int n_codes = 1 << n.bits;
    for (int code = 0; code < 256; ++code) {
      SCOPED_TRACE(code);
      const int mag = code & ((1 << mag_bits) - 1);
      const bool neg = n.sign && (code >> mag_bits) & 1;
      if (code >= n_codes || mag >= static_cast<int>(n.pos.size())) {
        EXPECT_THROW(format_decode(static_cast<uint8_t>(code), f), std::invalid_argument);
        continue;
      }
      const float v = format_decode(static_cast<uint8_t>(code), f);
      const float want = static_cast<float>(neg ? -n.pos[static_cast<size_t>(mag)] : n.pos[static_cast<size_t>(mag)]);
      EXPECT_EQ(bits_of(v), bits_of(want));  // −0 for the negative zero code
      // round trips: exact encode and rounding encode
      EXPECT_EQ(format_code_of(v, f), code);
      EXPECT_EQ(format_encode(v, f, Rounding::RNE), code);
      EXPECT_EQ(format_encode(v, f, Rounding::SR8, 255), code);  // on the grid: no SR move
    }
  }
}

TEST(Formats, RneTiesAndNeighboursOnEveryGrid) {
  for (const Named& n : named_table()) {
    SCOPED_TRACE(n.name);
    const FloatFormat& f = F(n.name);
    const auto& g = n.pos;
    for (size_t i = 0; i + 1 < g.size(); ++i) {
      const double mid = 0.5 * (g[i] + g[i + 1]);  // exact: at most 5 significant bits
      const float fm = static_cast<float>(mid);
      ASSERT_EQ(double(fm), mid);
      SCOPED_TRACE(mid);
      const double want = g[ref_rne_index(g, mid, n.M)];
      EXPECT_EQ(double(format_round(fm, f, Rounding::RNE)), want);
      EXPECT_EQ(double(format_round(std::nextafter(fm, 0.f), f, Rounding::RNE)), g[i]);
      EXPECT_EQ(double(format_round(std::nextafter(fm, INFINITY), f, Rounding::RNE)), g[i + 1]);
      if (n.sign) {
        EXPECT_EQ(double(format_round(-fm, f, Rounding::RNE)), -want);
      }
    }
  }
  // Hand cases: E2M1 ties 0.25 → 0, 0.75 → 1, 1.25 → 1, 1.75 → 2, 2.5 → 2, 3.5 → 4, 5 → 4.
  const float in[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.f};
  const float out[] = {0.f, 1.f, 1.f, 2.f, 2.f, 4.f, 4.f};
  for (int i = 0; i < 7; ++i) EXPECT_EQ(format_round(in[i], kE2M1, Rounding::RNE), out[i]) << in[i];
  // E3M0 (M = 0): 3 is the tie of 2 and 4 → 4 (significand 1 is odd); 0.125 → 0.
  EXPECT_EQ(format_round(3.f, F("e3m0"), Rounding::RNE), 4.f);
  EXPECT_EQ(format_round(0.125f, F("e3m0"), Rounding::RNE), 0.f);
  // E2M3: 7.25 is the tie of 7 (code 0x1E, even) and 7.5 → 7; 6.75 → 7 (0x1D odd → up).
  EXPECT_EQ(format_round(7.25f, F("e2m3"), Rounding::RNE), 7.f);
  EXPECT_EQ(format_round(6.75f, F("e2m3"), Rounding::RNE), 7.f);
  // E3M2: 26 is the tie of 24 (0x1E) and 28 → 24; 0.03125 (half the min subnormal) → 0.
  EXPECT_EQ(format_round(26.f, F("e3m2"), Rounding::RNE), 24.f);
  EXPECT_EQ(format_round(0.03125f, F("e3m2"), Rounding::RNE), 0.f);
}

TEST(Formats, SaturationAndSigns) {
  for (const Named& n : named_table()) {
    SCOPED_TRACE(n.name);
    const FloatFormat& f = F(n.name);
    const float mx = static_cast<float>(n.max);
    EXPECT_EQ(format_round(mx, f, Rounding::RNE), mx);
    EXPECT_EQ(format_round(FLT_MAX, f, Rounding::RNE), mx);
    EXPECT_EQ(format_round(INFINITY, f, Rounding::SR8, 255), mx);
    EXPECT_EQ(format_code_of(mx, f), f.max_code() | 0);
    EXPECT_EQ(format_encode(INFINITY, f, Rounding::RNE), f.max_code());
    EXPECT_THROW(format_round(NAN, f, Rounding::RNE), std::invalid_argument);
    EXPECT_THROW(format_code_of(std::nextafter(mx, INFINITY), f), std::invalid_argument);
    if (n.sign) {
      EXPECT_EQ(format_round(-FLT_MAX, f, Rounding::RNE), -mx);
      EXPECT_EQ(format_encode(-0.f, f, Rounding::RNE), 1 << (n.E + n.M));  // −0 code
    } else {
      EXPECT_THROW(format_round(-1.f, f, Rounding::RNE), std::invalid_argument);
      EXPECT_THROW(format_code_of(-1.f, f), std::invalid_argument);
      EXPECT_EQ(bits_of(format_round(-0.f, f, Rounding::RNE)), 0u);  // unsigned: +0
    }
  }
  // UE8M0 has no zero: tiny values round to 0 and cannot be encoded.
  EXPECT_THROW(format_encode(1e-39f, kUE8M0, Rounding::RNE), std::invalid_argument);
  EXPECT_THROW(format_code_of(0.f, kUE8M0), std::invalid_argument);
  EXPECT_THROW(format_code_of(1.1f, kE2M1), std::invalid_argument);  // off the grid
}

TEST(Formats, GenericEncodeEqualsE2M1EncodeAndScaleEncode) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 3.f);
  for (int i = 0; i < 20000; ++i) {
    const float x = nd(rng);
    const uint8_t r = static_cast<uint8_t>(rng());
    ASSERT_EQ(format_encode(x, kE2M1, Rounding::RNE), e2m1_encode(x, Rounding::RNE)) << x;
    ASSERT_EQ(format_encode(x, kE2M1, Rounding::SR8, r), e2m1_encode(x, Rounding::SR8, r)) << x;
  }
  for (ScaleFormat sf :
       {ScaleFormat::UE5M3, ScaleFormat::UE5M3_PTX, ScaleFormat::E4M3, ScaleFormat::UE8M0}) {
    const FloatFormat& f = scale_format_desc(sf);
    const int top = sf == ScaleFormat::E4M3 ? 0x7E : f.max_code();
    for (int c = 0; c <= top; ++c) {
      const float v = scale_decode(static_cast<uint8_t>(c), sf);
      ASSERT_EQ(bits_of(format_decode(static_cast<uint8_t>(c), f)), bits_of(v)) << f.name << c;
      ASSERT_EQ(format_code_of(v, f), scale_encode(v, sf)) << f.name << c;
    }
  }
}

TEST(Formats, SrOnAFineGrid) {
  // E2M3 at 1.0625 (δ = 0.5 of the ulp 0.125): up iff 0.5 + (2r+1)/512 ≥ 1 ⇔ r ≥ 128.
  int up = 0;
  for (int r = 0; r < 256; ++r) {
    const float v = format_round(1.0625f, F("e2m3"), Rounding::SR8, static_cast<uint8_t>(r));
    ASSERT_TRUE(v == 1.0f || v == 1.125f) << v;
    up += v == 1.125f;
  }
  EXPECT_EQ(up, 128);
}

// -------------------------------------------------------------- spelled formats

TEST(Formats, SpelledE3M4AndUE6M2) {
  const FloatFormat& a = F("e3m4");
  EXPECT_STREQ(a.name, "e3m4");
  EXPECT_EQ(a.bits(), 8);
  EXPECT_EQ(a.bias, 3);  // 2^(3−1) − 1
  EXPECT_EQ(a.reserved_top, 0);
  EXPECT_TRUE(a.subnormals);
  EXPECT_EQ(a.max_finite, 31.f);  // (1 + 15/16)·2^(7−3)
  EXPECT_EQ(format_min_normal(a), 0.25f);
  EXPECT_EQ(format_min_subnormal(a), 0x1p-6f);  // 2^(1−3−4)
  EXPECT_EQ(format_decode(0x7F, a), 31.f);
  EXPECT_EQ(format_decode(0xFF, a), -31.f);
  EXPECT_EQ(format_decode(0x30, a), 1.f);  // field 3, m 0
  EXPECT_EQ(format_decode(0x01, a), 0x1p-6f);
  EXPECT_EQ(format_round(1.03125f, a, Rounding::RNE), 1.0f);  // tie of 1 (even) and 1.0625
  EXPECT_EQ(format_round(1.09375f, a, Rounding::RNE), 1.125f);  // tie of 1.0625 (odd), 1.125
  EXPECT_EQ(format_round(100.f, a, Rounding::RNE), 31.f);
  const auto grid_a = ref_grid(4, 3, 128);
  for (int c = 0; c < 256; ++c) {
    const double want = (c & 0x80 ? -1 : 1) * grid_a[static_cast<size_t>(c & 0x7F)];
    ASSERT_EQ(double(format_decode(static_cast<uint8_t>(c), a)), want) << c;
    ASSERT_EQ(format_code_of(format_decode(static_cast<uint8_t>(c), a), a), c);
  }

  const FloatFormat& b = F("ue6m2");
  EXPECT_EQ(b.bits(), 8);
  EXPECT_FALSE(b.has_sign);
  EXPECT_EQ(b.bias, 31);
  EXPECT_EQ(b.max_finite, 7516192768.f);  // 1.75·2^32
  EXPECT_EQ(format_min_normal(b), 0x1p-30f);
  EXPECT_EQ(format_min_subnormal(b), 0x1p-32f);
  EXPECT_EQ(format_decode(0x7C, b), 1.f);  // field 31
  const auto grid_b = ref_grid(2, 31, 256);
  for (int c = 0; c < 256; ++c) {
    ASSERT_EQ(double(format_decode(static_cast<uint8_t>(c), b)), grid_b[static_cast<size_t>(c)]) << c;
    ASSERT_EQ(format_code_of(format_decode(static_cast<uint8_t>(c), b), b), c);
  }
  // Parsed once, same object afterwards; case-insensitive.
  EXPECT_EQ(&F("E3M4"), &a);
  EXPECT_EQ(&F("ue6m2"), &b);
  // A spelled format with one exponent bit: ue1m3, bias 0, a uniform grid 0..3.75 step 0.25.
  const FloatFormat& c = F("ue1m3");
  EXPECT_EQ(c.bias, 0);
  EXPECT_EQ(c.max_finite, 3.75f);
  EXPECT_EQ(format_decode(1, c), 0.25f);
  EXPECT_EQ(format_decode(8, c), 2.f);
}

TEST(Formats, BadNamesAreClearInvalidArguments) {
  for (const char* bad : {"", "fp8", "e0m3", "e5m3", "ue9m0", "e3m", "em2", "e03m2", "e2m1x",
                          "uu", "int4", "e2m-1", "e99999m1"}) {
    SCOPED_TRACE(bad);
    try {
      parse_float_format(bad);
      ADD_FAILURE() << "no throw";
    } catch (const std::invalid_argument& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("'" + std::string(bad) + "'"), std::string::npos) << m;
    }
  }
  try {
    parse_float_format("e5m3");
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("9 bits"), std::string::npos) << e.what();
  }
  // Block-scale formats: unsigned (or e4m3), 1.0 representable.
  EXPECT_EQ(&parse_block_scale_format("ue4m3"), &kUE4M3);
  EXPECT_EQ(&parse_block_scale_format("e4m3"), &kE4M3);
  EXPECT_EQ(&parse_block_scale_format("ue6m2"), &F("ue6m2"));
  for (const char* bad : {"e5m2", "e2m1", "fp8", "ue1m0"}) {  // ue1m0 = {0, 2}: no 1.0
    SCOPED_TRACE(bad);
    try {
      parse_block_scale_format(bad);
      ADD_FAILURE() << "no throw";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
  // Element formats: signed floats and integer grids.
  EXPECT_THROW(parse_element_format("ue5m3"), std::invalid_argument);
  EXPECT_THROW(parse_element_format("int9"), std::invalid_argument);
  EXPECT_THROW(parse_element_format("int1"), std::invalid_argument);
  EXPECT_THROW(parse_element_format("int4-asym"), std::invalid_argument);
  EXPECT_THROW(parse_element_format("bogus"), std::invalid_argument);
  EXPECT_TRUE(parse_element_format("e2m1").is_e2m1());
  EXPECT_EQ(parse_element_format("E2M3").name(), "e2m3");
  EXPECT_THROW(parse_scale_rule("mx"), std::invalid_argument);
  EXPECT_EQ(parse_scale_rule("mx-te"), ScaleRule::MxTe);
  EXPECT_STREQ(scale_rule_name(ScaleRule::MxOcp), "mx-ocp");
  EXPECT_STREQ(scale_rule_name(ScaleRule::TensorScaled), "tensor-scaled");
}

// ------------------------------------------------------------------ INT grids

TEST(Formats, Int4Grids) {
  const ElementFormat i4 = parse_element_format("int4");
  const ElementFormat s4 = parse_element_format("int4-sym");
  EXPECT_EQ(i4.kind, ElementKind::Int);
  EXPECT_EQ(i4.int_min, -8);
  EXPECT_EQ(i4.int_max, 7);
  EXPECT_EQ(s4.int_min, -7);
  EXPECT_EQ(s4.int_max, 7);
  EXPECT_EQ(i4.bits(), 4);
  EXPECT_EQ(s4.bits(), 4);
  EXPECT_EQ(i4.max(), 7.f);
  EXPECT_EQ(s4.max(), 7.f);
  EXPECT_EQ(i4.name(), "int4");
  EXPECT_EQ(s4.name(), "int4-sym");
  // Two's-complement nibbles: 0..7 = 0..7, 8..15 = −8..−1.
  const int want[16] = {0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1};
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(element_decode(static_cast<uint8_t>(c), i4), float(want[c])) << c;
    if (c == 8) {
      EXPECT_THROW(element_decode(8, s4), std::invalid_argument);
    } else {
      EXPECT_EQ(element_decode(static_cast<uint8_t>(c), s4), float(want[c])) << c;
    }
    EXPECT_EQ(element_encode(float(want[c]), i4, Rounding::RNE), c);
  }
  EXPECT_THROW(element_decode(16, i4), std::invalid_argument);
  // RNE ties to the even integer; saturation +7 / −8 (int4), ±7 (int4-sym); no −0.
  const struct { float x; int i4, s4; } cases[] = {
      {0.5f, 0, 0},  {1.5f, 2, 2},   {2.5f, 2, 2},   {-2.5f, -2, -2}, {3.49f, 3, 3},
      {6.5f, 6, 6},  {7.4f, 7, 7},   {7.5f, 7, 7},   {100.f, 7, 7},   {-7.4f, -7, -7},
      {-7.5f, -8, -7}, {-8.f, -8, -7}, {-9.f, -8, -7}, {-0.4f, 0, 0},  {-0.f, 0, 0},
      {-0.5f, 0, 0}, {-1.5f, -2, -2}, {INFINITY, 7, 7}, {-INFINITY, -8, -7}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.x);
    EXPECT_EQ(element_encode(c.x, i4, Rounding::RNE), c.i4 & 0xF);
    EXPECT_EQ(element_encode(c.x, s4, Rounding::RNE), c.s4 & 0xF);
  }
  // SR8 with ulp 1: 2.25 goes up iff 0.25 + (2r+1)/512 ≥ 1 ⇔ r ≥ 192 (64 of 256).
  int up = 0;
  for (int r = 0; r < 256; ++r) up += element_encode(2.25f, i4, Rounding::SR8, uint8_t(r)) == 3;
  EXPECT_EQ(up, 64);
  EXPECT_THROW(element_encode(NAN, i4, Rounding::RNE), std::invalid_argument);
}

// ------------------------------------------------------------- MXFP4 scale rules

namespace {
struct MxCase {
  float amax;
  float te_scale;  ///< 2^ceil(log2(amax/6))
  float ocp_scale; ///< 2^(floor(log2 amax) − 2)
  float te_xhat, ocp_xhat;  ///< the dequantized amax element
};
}  // namespace

TEST(MxScaleRules, HandComputedE2M1) {
  // Worked by hand. Each case is one block [amax, 0, −amax, amax/2] with UE8M0 scales.
  const MxCase cases[] = {
      // a = 6: TE 6·2^0 ≥ 6 → 1; OCP floor(log2 6) = 2 → 2^0. 6/1 = 6.
      {6.f, 1.f, 1.f, 6.f, 6.f},
      // a = 7: TE 6 < 7 → 2: 7/2 = 3.5 ties to 4 → 8. OCP 2^0 = 1: 7 saturates to 6.
      {7.f, 2.f, 1.f, 8.f, 6.f},
      // a = 0.3: TE 6·2^-5 = 0.1875 < 0.3 ≤ 6·2^-4 → 2^-4; OCP floor(log2 0.3) = −2 → 2^-4.
      //          0.3·16 = 4.8 → 4 → 0.25.
      {0.3f, 0.0625f, 0.0625f, 0.25f, 0.25f},
      // a = 3: TE 6·2^-1 = 3 ≥ 3 → 0.5; OCP floor(log2 3) = 1 → 2^-1. 3/0.5 = 6.
      {3.f, 0.5f, 0.5f, 3.f, 3.f},
      // a = 4: TE 3 < 4 ≤ 6 → 1; OCP 2^0. 4.
      {4.f, 1.f, 1.f, 4.f, 4.f},
      // a = 12.5: TE 12 < 12.5 → 4: 3.125 → 3 → 12. OCP 2^(3−2) = 2: 6.25 → 6 → 12.
      {12.5f, 4.f, 2.f, 12.f, 12.f},
      // a = 13: TE 4: 3.25 → 3 → 12. OCP 2: 6.5 saturates → 6 → 12.
      {13.f, 4.f, 2.f, 12.f, 12.f},
      // a = 1000: TE 6·2^7 = 768 < 1000 ≤ 1536 → 256: 3.90625 → 4 → 1024.
      //           OCP floor(log2 1000) = 9 → 2^7 = 128: 7.8125 → 6 → 768.
      {1000.f, 256.f, 128.f, 1024.f, 768.f},
  };
  for (const MxCase& c : cases) {
    SCOPED_TRACE(c.amax);
    const std::vector<float> x = {c.amax, 0.f, -c.amax, c.amax * 0.5f};
    for (ScaleRule rule : {ScaleRule::MxTe, ScaleRule::MxOcp}) {
      BlockQuantSpec spec;
      spec.scale_format = ScaleFormat::UE8M0;
      spec.block = 4;
      spec.scale_rule = rule;
      const QuantizedTensor q = quantize_blocks(x.data(), 1, 4, spec, 123.f, nullptr);
      const float want_scale = rule == ScaleRule::MxTe ? c.te_scale : c.ocp_scale;
      const float want_xhat = rule == ScaleRule::MxTe ? c.te_xhat : c.ocp_xhat;
      EXPECT_EQ(q.ge, 1.f);  // no tensor scale
      EXPECT_EQ(q.gd, 1.f);
      ASSERT_EQ(q.scales.size(), 1u);
      EXPECT_EQ(q.scales[0], want_scale) << scale_rule_name(rule);
      EXPECT_EQ(q.scale_codes[0], 127 + std::ilogb(want_scale)) << scale_rule_name(rule);
      std::vector<float> out(4), fused(4);
      dequantize(q, out.data());
      quantize_dequantize(x.data(), 1, 4, spec, 123.f, nullptr, fused.data());
      EXPECT_EQ(out[0], want_xhat) << scale_rule_name(rule);
      EXPECT_EQ(out[2], -want_xhat) << scale_rule_name(rule);
      EXPECT_EQ(bits_of(out[1]), 0u);
      for (int i = 0; i < 4; ++i) EXPECT_EQ(bits_of(out[i]), bits_of(fused[i])) << i;
    }
  }
}

TEST(MxScaleRules, ZeroTinyAndHugeBlocks) {
  BlockQuantSpec spec;
  spec.scale_format = ScaleFormat::UE8M0;
  spec.block = 2;
  const std::vector<float> x = {0.f, -0.f,           // zero block → scale 1 (code 127)
                                1e-40f, 0.f,         // FP32 subnormal: exponent clamps at −127
                                FLT_MAX, -1.f};      // top of the range
  for (ScaleRule rule : {ScaleRule::MxTe, ScaleRule::MxOcp}) {
    SCOPED_TRACE(scale_rule_name(rule));
    spec.scale_rule = rule;
    const QuantizedTensor q = quantize_blocks(x.data(), 1, 6, spec, 0.f, nullptr);
    EXPECT_EQ(q.scales[0], 1.f);
    EXPECT_EQ(q.scale_codes[0], 127);
    EXPECT_EQ(q.scales[1], 0x1p-127f);
    EXPECT_EQ(q.scale_codes[1], 0);
    // FLT_MAX = (2 − 2^-23)·2^127: TE ceil(log2(FLT_MAX/6)) = 126; OCP 127 − 2 = 125.
    EXPECT_EQ(q.scales[2], rule == ScaleRule::MxTe ? 0x1p126f : 0x1p125f);
    std::vector<float> out(6);
    dequantize(q, out.data());
    EXPECT_EQ(bits_of(out[0]), 0u);
    EXPECT_EQ(bits_of(out[1]), bits_of(-0.f));
    EXPECT_EQ(out[2], 0.f);  // 1e-40·2^127 ≈ 0.017 → 0
    // OCP: FLT_MAX/2^125 ≈ 8 saturates to 6 → 6·2^125. (TE: 3.99… → 4 → 2^128 overflows to
    // Inf in FP32: a documented edge of a rule that never clips.)
    if (rule == ScaleRule::MxOcp) {
      EXPECT_EQ(out[4], 6.f * 0x1p125f);
      EXPECT_NO_THROW(check_dequantized_finite("t", q, x.data(), out.data()));
    } else {
      // TE: x̂ = +Inf; check_dequantized_finite (what `fp4train quant` runs) names the element,
      // its block scale and why, instead of letting the Inf through (docs/formats.md
      // "`mx-te` and `mx-ocp` (MXFP4)", "Edge: overflow near FLT_MAX").
      EXPECT_EQ(out[4], std::numeric_limits<float>::infinity());
      try {
        check_dequantized_finite("t", q, x.data(), out.data());
        ADD_FAILURE() << "no throw";
      } catch (const std::invalid_argument& e) {
        const std::string m = e.what();
        for (const char* want : {"t: element [0, 4]", "+Inf", "mx-te", "2^126", "rounds to 4",
                                 "mx-ocp"})
          EXPECT_NE(m.find(want), std::string::npos) << want << " not in: " << m;
      }
    }
  }
  // mx-te, RNE, by hand: the scale is 2^126 for a block amax above 6·2^125; elements round to
  // 4 (x̂ = 2^128 = Inf) from 3.5·2^126 ≈ 2.9777e38 on, to 3 (finite) below it.
  spec.scale_rule = ScaleRule::MxTe;
  for (const auto& [v, overflows] : std::vector<std::pair<float, bool>>{
           {3.5f * 0x1p126f, true}, {std::nextafter(3.5f * 0x1p126f, 0.f), false},
           {-3e38f, true}, {2.9e38f, false}}) {
    const std::vector<float> y = {v, 1.f};
    const QuantizedTensor q = quantize_blocks(y.data(), 1, 2, spec, 0.f, nullptr);
    std::vector<float> out(2);
    dequantize(q, out.data());
    EXPECT_EQ(q.scales[0], 0x1p126f) << v;
    if (overflows) {
      EXPECT_THROW(check_dequantized_finite("t", q, y.data(), out.data()), std::invalid_argument) << v;
    } else {
      EXPECT_EQ(out[0], std::copysign(3.f * 0x1p126f, v)) << v;
      EXPECT_NO_THROW(check_dequantized_finite("t", q, y.data(), out.data())) << v;
    }
  }
}

TEST(MxScaleRules, OtherElementFormatsAndErrors) {
  // E2M3 (max 7.5, emax_exp 2), a = 7.6: TE 7.5 < 7.6 → 2; OCP floor(log2 7.6) = 2 → 1.
  BlockQuantSpec spec;
  spec.scale_format = ScaleFormat::UE8M0;
  spec.block = 2;
  spec.element = parse_element_format("e2m3");
  const std::vector<float> x = {7.6f, 1.1f};
  spec.scale_rule = ScaleRule::MxTe;
  QuantizedTensor q = quantize_blocks(x.data(), 1, 2, spec, 1.f, nullptr);
  EXPECT_EQ(q.scales[0], 2.f);
  EXPECT_EQ(element_decode(q.codes[0], spec.element), 3.75f);  // 3.8 → 3.75
  EXPECT_EQ(element_decode(q.codes[1], spec.element), 0.5f);   // 0.55 → 0.5
  spec.scale_rule = ScaleRule::MxOcp;
  q = quantize_blocks(x.data(), 1, 2, spec, 1.f, nullptr);
  EXPECT_EQ(q.scales[0], 1.f);
  EXPECT_EQ(element_decode(q.codes[0], spec.element), 7.5f);   // saturates
  EXPECT_EQ(element_decode(q.codes[1], spec.element), 1.125f);  // 1.1 → 1.125
  // int4 (emax 7, emax_exp 2), a = 7.5: TE 7 < 7.5 → 2; OCP 2^0 = 1, saturating to 7.
  spec.element = parse_element_format("int4");
  const std::vector<float> y = {7.5f, -7.5f};
  spec.scale_rule = ScaleRule::MxTe;
  q = quantize_blocks(y.data(), 1, 2, spec, 1.f, nullptr);
  EXPECT_EQ(q.scales[0], 2.f);
  EXPECT_EQ(q.codes[0], 4);         // 3.75 → 4
  EXPECT_EQ(q.codes[1], 0xC);       // −4
  spec.scale_rule = ScaleRule::MxOcp;
  q = quantize_blocks(y.data(), 1, 2, spec, 1.f, nullptr);
  EXPECT_EQ(q.scales[0], 1.f);
  EXPECT_EQ(q.codes[0], 7);         // 7.5 saturates to +7
  EXPECT_EQ(q.codes[1], 8);         // −7.5 ties to −8 (even), inside the grid
  // The MX rules need a power-of-two scale format.
  spec.scale_format = ScaleFormat::UE5M3;
  try {
    quantize_blocks(y.data(), 1, 2, spec, 1.f, nullptr);
    ADD_FAILURE() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("power-of-two"), std::string::npos) << e.what();
  }
}

// ------------------------------------------------- block quantization, other elements

namespace {

float f32(double v) { return static_cast<float>(v); }

/// Independent reference of docs/numerics.md "Quantizing one operand" (tensor-scaled, 1-D blocks)
/// for an element grid: every FP32 step is the double operation rounded to float (exact
/// emulation: products of floats are exact in double; quotients are correctly rounded twice
/// without error since 53 ≥ 2·24 + 2). Grid rounding by enumeration (ref_rne_index).
/// Floats keep the sign of x on a zero result (−0 code); integer grids give +0.
std::vector<float> ref_quantize(const std::vector<float>& x, int64_t rows, int64_t cols, int B,
                                float T, float g, float emax, const std::vector<double>& pos_grid,
                                const std::vector<double>& neg_grid, int elem_M, bool is_int) {
  const std::vector<double> sg = ref_grid(3, 15, 0xF8);  // UE5M3 (paper)
  float ge = g == 0.f ? 1.f : f32(double(f32(double(T) * emax)) / g);
  ge = std::min(ge, FLT_MAX);
  const float gd = f32(1.0 / ge);
  const float mult = f32(double(ge) * f32(1.0 / emax));
  std::vector<float> out(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c0 = 0; c0 < cols; c0 += B) {
      const int64_t c1 = std::min<int64_t>(cols, c0 + B);
      float a = 0;
      for (int64_t c = c0; c < c1; ++c) a = std::max(a, std::fabs(x[size_t(r * cols + c)]));
      float cb = std::min(f32(double(a) * mult), 61440.f);
      cb = f32(sg[ref_rne_index(sg, cb, 3)]);
      if (cb == 0.f) cb = 1.f;
      const float d = f32(double(cb) * gd), e = f32(1.0 / d);
      for (int64_t c = c0; c < c1; ++c) {
        const float xv = x[size_t(r * cols + c)];
        const float y = f32(double(xv) * e);
        const auto& grid = std::signbit(xv) ? neg_grid : pos_grid;
        double qv = grid[ref_rne_index(grid, std::fabs(double(y)), elem_M)];
        if (std::signbit(xv)) qv = -qv;
        if (is_int && qv == 0.0) qv = 0.0;  // integers have no −0 code
        out[size_t(r * cols + c)] = f32(qv * d);
      }
    }
  }
  return out;
}

std::vector<float> test_tensor(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = (rng() % 8 == 0) ? 0.f : nd(rng) * std::ldexp(1.f, int(rng() % 8) - 4);
  return v;
}

}  // namespace

TEST(BlockQuantFormats, E2M3AndInt4AgainstReference) {
  const int64_t rows = 5, cols = 37;  // a tail block of 5 at block 16
  std::vector<double> int4_pos, int4_neg;
  for (int i = 0; i <= 7; ++i) int4_pos.push_back(i);
  for (int i = 0; i <= 8; ++i) int4_neg.push_back(i);
  const struct {
    const char* name;
    float emax;
    std::vector<double> pos, neg;
    int M;  ///< fraction bits for the tie rule (integers: ties to even, like M ≥ 1)
    bool is_int;
  } cases[] = {{"e2m3", 7.5f, kE2M3Pos, kE2M3Pos, 3, false},
               {"e3m2", 28.f, kE3M2Pos, kE3M2Pos, 2, false},
               {"int4", 7.f, int4_pos, int4_neg, 1, true},
               {"int4-sym", 7.f, int4_pos, int4_pos, 1, true}};
  for (const auto& c : cases) {
    for (uint32_t seed : {1u, 2u, 3u}) {
      for (float gscale : {1.f, 0.25f, 30.f}) {  // held references below and above the amax
        SCOPED_TRACE(std::string(c.name) + " seed " + std::to_string(seed) + " g×" +
                     std::to_string(gscale));
        std::vector<float> x = test_tensor(size_t(rows * cols), seed);
        BlockQuantSpec spec;
        spec.element = parse_element_format(c.name);
        const float g = tensor_amax(x.data(), rows * cols) * gscale;
        const std::vector<float> want =
            ref_quantize(x, rows, cols, 16, 448.f, g, c.emax, c.pos, c.neg, c.M, c.is_int);
        std::vector<float> got(x.size()), fused(x.size());
        const QuantizedTensor q = quantize_blocks(x.data(), rows, cols, spec, g, nullptr);
        dequantize(q, got.data());
        quantize_dequantize(x.data(), rows, cols, spec, g, nullptr, fused.data());
        for (size_t i = 0; i < x.size(); ++i) {
          ASSERT_EQ(bits_of(got[i]), bits_of(want[i])) << i << " x=" << x[i];
          ASSERT_EQ(bits_of(fused[i]), bits_of(want[i])) << i;
          ASSERT_LT(q.codes[i], 1 << spec.element.bits());
        }
        // The tensor scale uses the element max: ge = (T·emax)/g.
        EXPECT_EQ(q.ge, std::min(f32(double(f32(448.0 * c.emax)) / g), FLT_MAX));
      }
    }
    // Exact ties on the element grid: g = T·emax gives ge = 1, and a block with amax = emax
    // gets c_b = fl(emax·fl(1/emax)) rounded to UE5M3 = 1, so d_b = e_b = 1 and every
    // midpoint of the grid arrives as an exact tie (alternating signs).
    SCOPED_TRACE(std::string(c.name) + " ties");
    std::vector<float> t = {c.emax};
    for (size_t i = 0; i + 1 < c.pos.size(); ++i)
      t.push_back(f32((i % 2 ? -0.5 : 0.5) * (c.pos[i] + c.pos[i + 1])));
    const int64_t n = static_cast<int64_t>(t.size());
    BlockQuantSpec spec;
    spec.block = static_cast<int>(n);
    spec.element = parse_element_format(c.name);
    const float g = f32(448.0 * c.emax);
    const QuantizedTensor q = quantize_blocks(t.data(), 1, n, spec, g, nullptr);
    ASSERT_EQ(q.ge, 1.f);
    ASSERT_EQ(q.scales[0], 1.f);
    const std::vector<float> want = ref_quantize(t, 1, n, spec.block, 448.f, g, c.emax, c.pos,
                                                 c.neg, c.M, c.is_int);
    std::vector<float> got(t.size());
    dequantize(q, got.data());
    for (size_t i = 0; i < t.size(); ++i) ASSERT_EQ(bits_of(got[i]), bits_of(want[i])) << t[i];
  }
}

TEST(BlockQuantFormats, Int4HandComputed) {
  // T = 448, emax = 7, g = 448 → ge = (448·7)/448 = 7, mult = 7·fl(1/7).
  // Block [7, −3.5, 2.5, −8]: a = 8, mult = fl(7·fl(1/7)) = 1, c = 8 → UE5M3 8;
  //   d = 8·fl(1/7), e = fl(1/d) = 0.87499994 (just below 7/8):
  //   7·e ≈ 6.125 → 6; −3.5·e ≈ −3.0625 → −3; 2.5·e ≈ 2.1875 → 2; −8·e ≈ −7 → −7.
  BlockQuantSpec spec;
  spec.block = 4;
  spec.element = parse_element_format("int4");
  const std::vector<float> x = {7.f, -3.5f, 2.5f, -8.f};
  const QuantizedTensor q = quantize_blocks(x.data(), 1, 4, spec, 448.f, nullptr);
  EXPECT_EQ(q.ge, 7.f);
  EXPECT_EQ(q.scales[0], 8.f);
  EXPECT_EQ(q.codes, (std::vector<uint8_t>{6, 0xD, 2, 0x9}));
  // A zero and a negative value rounding to zero both give code 0 (integers have no −0).
  const std::vector<float> z = {8.f, -0.01f, 0.f, -0.f};
  const QuantizedTensor qz = quantize_blocks(z.data(), 1, 4, spec, 448.f, nullptr);
  EXPECT_EQ(qz.codes[1], 0);
  EXPECT_EQ(qz.codes[3], 0);
  std::vector<float> out(4), fused(4);
  dequantize(qz, out.data());
  quantize_dequantize(z.data(), 1, 4, spec, 448.f, nullptr, fused.data());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(bits_of(out[i]), bits_of(fused[i])) << i;
  EXPECT_EQ(bits_of(out[1]), 0u);
  // dequantize rejects a code the element format never produces (int4-sym: 0x8 = −8).
  QuantizedTensor bad = qz;
  bad.spec.element = parse_element_format("int4-sym");
  bad.codes[2] = 8;
  EXPECT_THROW(dequantize(bad, out.data()), std::invalid_argument);
  bad.codes[2] = 16;  // wider than 4 bits
  bad.spec.element = parse_element_format("int4");
  EXPECT_THROW(dequantize(bad, out.data()), std::invalid_argument);
}

TEST(BlockQuantFormats, ExplicitE2M1AndScaleDescMatchDefaults) {
  std::vector<float> x = test_tensor(3 * 40, 9);
  const float g = tensor_amax(x.data(), 120);
  BlockQuantSpec a;
  a.scale_format = ScaleFormat::E4M3;
  BlockQuantSpec b = a;
  b.element = parse_element_format("e2m1");
  b.scale_desc = &kE4M3;  // the same convention through the descriptor
  std::vector<float> oa(x.size()), ob(x.size());
  const QuantizedTensor qa = quantize_blocks(x.data(), 3, 40, a, g, nullptr);
  const QuantizedTensor qb = quantize_blocks(x.data(), 3, 40, b, g, nullptr);
  EXPECT_EQ(qa.codes, qb.codes);
  EXPECT_EQ(qa.scale_codes, qb.scale_codes);
  // UE4M3 scales hold the same values as E4M3 for positive scales: same codes too.
  BlockQuantSpec c = a;
  set_scale_format(c, "ue4m3");
  EXPECT_EQ(c.scale_desc, &kUE4M3);
  EXPECT_EQ(&spec_scale_format(c), &kUE4M3);
  const QuantizedTensor qc = quantize_blocks(x.data(), 3, 40, c, g, nullptr);
  EXPECT_EQ(qa.scale_codes, qc.scale_codes);
  EXPECT_EQ(qa.codes, qc.codes);
  // set_scale_format with one of the four uses the enum.
  set_scale_format(c, "ue5m3-ptx");
  EXPECT_EQ(c.scale_desc, nullptr);
  EXPECT_EQ(c.scale_format, ScaleFormat::UE5M3_PTX);
  // A spelled scale format: ue6m2 (max 1.75·2^32) — codes decode to the scales.
  set_scale_format(c, "ue6m2");
  const QuantizedTensor qd = quantize_blocks(x.data(), 3, 40, c, g, nullptr);
  for (size_t i = 0; i < qd.scales.size(); ++i)
    EXPECT_EQ(format_decode(qd.scale_codes[i], F("ue6m2")), qd.scales[i]);
  // Unsigned element formats are rejected.
  BlockQuantSpec bad;
  bad.element.fp = &kUE5M3;
  EXPECT_THROW(quantize_blocks(x.data(), 3, 40, bad, g, nullptr), std::invalid_argument);
}

// ---------------------------------------------------------------------- recipes

namespace {
struct Scratch {
  fs::path dir = fs::temp_directory_path() / ("fp4test_formats_" + std::to_string(::getpid()));
  Scratch() { fs::create_directories(dir); }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
} g_scratch;

fs::path write_tmp(const std::string& name, const std::string& text) {
  const fs::path p = g_scratch.dir / name;
  std::ofstream(p) << text;
  return p;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(RecipeFormats, NewKeysParseAndRoundTrip) {
  const Recipe a = load_recipe_file(write_tmp(
      "a.toml", "[linear]\nmode = \"fp4\"\n[fp4]\nelement_format = \"int4-sym\"\n"
                "scale_format = \"ue4m3\"\nscale_rule = \"tensor-scaled\"\n"));
  EXPECT_EQ(a.element_format.name(), "int4-sym");
  EXPECT_EQ(a.scale_desc, &kUE4M3);
  EXPECT_EQ(a.scale_rule, ScaleRule::TensorScaled);
  for (const BlockQuantSpec& s : {a.spec_x(), a.spec_w(), a.spec_dy()}) {
    EXPECT_EQ(s.element.kind, ElementKind::Int);
    EXPECT_EQ(s.element.int_min, -7);
    EXPECT_EQ(&spec_scale_format(s), &kUE4M3);
    EXPECT_EQ(s.scale_rule, ScaleRule::TensorScaled);
  }
  EXPECT_TRUE(a.spec_w().two_d);
  EXPECT_EQ(a.spec_dy().rounding, Rounding::SR8);

  const Recipe b = load_recipe_file(write_tmp(
      "b.toml", "[linear]\nmode = \"fp4\"\n[fp4]\nelement_format = \"E2M3\"\n"
                "scale_format = \"ue8m0\"\nscale_rule = \"mx-ocp\"\nblock = 32\n"));
  EXPECT_EQ(b.element_format.name(), "e2m3");  // canonical
  EXPECT_EQ(b.scale_format, ScaleFormat::UE8M0);
  EXPECT_EQ(b.scale_desc, nullptr);
  EXPECT_EQ(b.scale_rule, ScaleRule::MxOcp);
  EXPECT_EQ(b.spec_x().element.fp, &F("e2m3"));
  EXPECT_EQ(b.spec_x().scale_rule, ScaleRule::MxOcp);
  EXPECT_EQ(b.spec_x().block, 32);

  const Recipe c = load_recipe_file(write_tmp(
      "c.toml", "[fp4]\nelement_format = \"e3m4\"\nscale_format = \"ue6m2\"\n"));
  EXPECT_EQ(c.scale_desc, &F("ue6m2"));
  EXPECT_EQ(c.spec_x().element.fp, &F("e3m4"));

  // Defaults are the old behaviour.
  const Recipe d = load_recipe_file(write_tmp("d.toml", "name = \"d\"\n"));
  EXPECT_EQ(d.element_format.name(), "e2m1");
  EXPECT_TRUE(d.spec_x().element.is_e2m1());
  EXPECT_EQ(d.scale_rule, ScaleRule::TensorScaled);
  EXPECT_EQ(d.scale_desc, nullptr);

  // recipe_to_toml writes the new keys; they read back.
  for (const Recipe* r : {&a, &b, &c, &d}) {
    const std::string text = recipe_to_toml(*r);
    EXPECT_NE(text.find("scale_rule = \""), std::string::npos) << text;
    // The typed element format is written back as its canonical name.
    EXPECT_NE(text.find("element_format = \"" + r->element_format.name() + "\"\n"), std::string::npos)
        << text;
    const Recipe back = load_recipe_file(write_tmp("rt.toml", text));
    EXPECT_TRUE(back.element_format == r->element_format);
    EXPECT_EQ(back.scale_format, r->scale_format);
    EXPECT_EQ(back.scale_desc, r->scale_desc);
    EXPECT_EQ(back.scale_rule, r->scale_rule);
    EXPECT_EQ(back.scale_format_str(), r->scale_format_str());
  }
}

TEST(RecipeFormats, ErrorsNameFileKeyAndValue) {
  struct Case {
    const char* file;
    const char* text;
    std::vector<std::string> want;
  };
  const Case cases[] = {
      {"e1.toml", "[fp4]\nelement_format = \"ue5m3\"\n", {"e1.toml", "fp4.element_format", "ue5m3"}},
      {"e2.toml", "[fp4]\nelement_format = \"fp8\"\n", {"e2.toml", "fp4.element_format", "fp8"}},
      {"e3.toml", "[fp4]\nelement_format = 4\n", {"fp4.element_format", "a string"}},
      {"e4.toml", "[fp4]\nscale_format = \"e5m2\"\n", {"e4.toml", "fp4.scale_format", "e5m2"}},
      {"e5.toml", "[fp4]\nscale_format = \"ue9m1\"\n", {"fp4.scale_format", "ue9m1"}},
      {"e6.toml", "[fp4]\nscale_rule = \"mx\"\n", {"e6.toml", "fp4.scale_rule", "\"mx\"", "mx-ocp"}},
      {"e7.toml", "[fp4]\nscale_rule = \"mx-te\"\n", {"fp4.scale_rule", "ue5m3", "mx-te"}},
      {"e8.toml", "[fp4]\nscale_format = \"e4m3\"\nscale_rule = \"mx-ocp\"\n",
       {"fp4.scale_rule", "e4m3"}},
      {"e9.toml", "[fp4]\nelement_format = \"int12\"\n", {"fp4.element_format", "int12"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.file);
    const std::string e = error_of([&] { load_recipe_file(write_tmp(c.file, c.text)); });
    ASSERT_FALSE(e.empty()) << "no UserError";
    for (const std::string& w : c.want) EXPECT_NE(e.find(w), std::string::npos) << e;
  }
}
