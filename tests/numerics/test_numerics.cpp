// Tests of the scalar reference FP4 numerics against docs/numerics.md.
// Expected values come from the contract, from hand calculation (worked in the comments) or
// from independent slow references written here (grid enumeration in double, direct
// Random123 calls, naive Hadamard products) — never from the code under test.
#include <Random123/philox.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "fp4/numerics/block_quant.h"
#include "fp4/numerics/format.h"
#include "fp4/numerics/hadamard.h"
#include "fp4/numerics/philox.h"

using namespace fp4;

namespace {

uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }

/// All non-negative finite values of a format, in code order, from the formula of the
/// "Formats" table (computed in double; independent of scale_decode).
std::vector<double> grid_values(int exp_bits, int frac_bits, int bias, int n_codes) {
  std::vector<double> g;
  for (int code = 0; code < n_codes; ++code) {
    const int e = code >> frac_bits, m = code & ((1 << frac_bits) - 1);
    const double scale = std::ldexp(1.0, frac_bits);
    g.push_back(e == 0 ? std::ldexp(m / scale, 1 - bias) : std::ldexp(1.0 + m / scale, e - bias));
  }
  (void)exp_bits;
  return g;
}
const std::vector<double>& grid_e2m1() {
  static const std::vector<double> g = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return g;
}
const std::vector<double>& grid_ue5m3() {
  static const std::vector<double> g = grid_values(5, 3, 15, 0xF8);  // fields 0..30
  return g;
}
const std::vector<double>& grid_ue5m3_ptx() {
  static const std::vector<double> g = grid_values(5, 3, 15, 0xFF);  // 0..0xFE
  return g;
}
const std::vector<double>& grid_e4m3() {
  static const std::vector<double> g = grid_values(4, 3, 7, 0x7F);  // 0..0x7E
  return g;
}

/// Index i of the largest grid value <= a (a < max).
size_t lower_index(const std::vector<double>& grid, double a) {
  return static_cast<size_t>(std::upper_bound(grid.begin(), grid.end(), a) - grid.begin()) - 1;
}

/// Independent RNE: nearest grid value, ties to the even code; saturating.
double ref_rne(const std::vector<double>& grid, double a) {
  if (a >= grid.back()) return grid.back();
  const size_t i = lower_index(grid, a);
  const double dlo = a - grid[i], dhi = grid[i + 1] - a;  // exact in double here
  if (dlo < dhi) return grid[i];
  if (dlo > dhi) return grid[i + 1];
  return (i % 2 == 0) ? grid[i] : grid[i + 1];
}

/// Independent RNA: nearest grid value, ties to the larger magnitude; saturating.
double ref_rna(const std::vector<double>& grid, double a) {
  if (a >= grid.back()) return grid.back();
  const size_t i = lower_index(grid, a);
  return a - grid[i] < grid[i + 1] - a ? grid[i] : grid[i + 1];  // exact in double here
}

/// Independent SR8: number of r in 0..255 that round a up, from the exact fractional
/// position δ = (a − lo)/(hi − lo): up iff (2r+1)/512 ≥ 1 − δ.
int ref_sr_up_count(double delta) {
  int n = 0;
  for (int r = 0; r < 256; ++r) n += (2.0 * r + 1.0) / 512.0 >= 1.0 - delta;
  return n;
}

/// Contract formulas of "Quantizing one operand", restated here for the tests.
struct RefTensorScales {
  float ge, gd, mult;
};
RefTensorScales ref_tensor_scales(float g, float T) {
  float ge = (T * 6.0f) / g;
  if (g == 0.0f) ge = 1.0f;
  ge = std::min(ge, FLT_MAX);
  return {ge, 1.0f / ge, ge * (1.0f / 6.0f)};
}

std::vector<float> random_tensor(std::mt19937& rng, int kind, size_t n) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::cauchy_distribution<float> cd(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) {
    switch (kind) {
      case 0: x = nd(rng); break;                                      // normal
      case 1: x = std::clamp(cd(rng), -1e30f, 1e30f); break;           // heavy-tailed
      case 2: x = nd(rng) * 1e-30f; break;                             // tiny
      case 3: x = nd(rng) * 1e-41f; break;                             // FP32 subnormals
      case 4: x = nd(rng) * 1e30f; break;                              // huge
      default: x = (rng() % 4 == 0) ? 0.f : nd(rng) * std::ldexp(1.f, int(rng() % 60) - 30);
    }
  }
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

// ---------------------------------------------------------------------------------- formats

TEST(Format, E2M1RneTable) {
  const float in[] = {-100, -0.75, -0.25, 0, 0.25, 0.5, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 100};
  const float want[] = {-6, -1, -0.0f, 0, 0, 0.5, 1, 1, 2, 2, 4, 4, 6};
  for (size_t i = 0; i < std::size(in); ++i) {
    const float got = e2m1_decode(e2m1_encode(in[i], Rounding::RNE));
    EXPECT_EQ(got, want[i]) << "x = " << in[i];
    EXPECT_EQ(std::signbit(got), std::signbit(want[i])) << "sign of x = " << in[i];
  }
  EXPECT_EQ(e2m1_encode(-0.25f, Rounding::RNE), 8);  // −0
  EXPECT_EQ(e2m1_encode(-0.0f, Rounding::RNE), 8);
  EXPECT_EQ(e2m1_encode(0.25f, Rounding::RNE), 0);
}

TEST(Format, E2M1RnaTable) {
  // Round to nearest, ties away from zero (Quartet II's thresholds ≥ 0.25, 0.75, …, 5).
  const float in[] = {-100, -5, -3.5, -0.75, -0.25, -0.0f, 0, 0.25, 0.5, 0.75, 1.25, 1.75, 2.5,
                      3.5, 5, 6, 100, std::nextafter(0.25f, 0.f), 0.25f - 0x1p-26f,
                      std::nextafter(5.f, 0.f), std::nextafter(2.5f, 0.f)};
  const float want[] = {-6, -6, -4, -1, -0.5, -0.0f, 0, 0.5, 0.5, 1, 1.5, 2, 3,
                        4, 6, 6, 6, 0, 0, 4, 2};
  for (size_t i = 0; i < std::size(in); ++i) {
    const float got = e2m1_decode(e2m1_encode(in[i], Rounding::RNA));
    EXPECT_EQ(got, want[i]) << "x = " << in[i];
    EXPECT_EQ(std::signbit(got), std::signbit(want[i])) << "sign of x = " << in[i];
  }
  EXPECT_EQ(e2m1_encode(-0.25f, Rounding::RNA), 9);  // −0.5
  EXPECT_EQ(e2m1_encode(INFINITY, Rounding::RNA), 7);
  EXPECT_EQ(e2m1_encode(-0.1f, Rounding::RNA), 8);  // −0
  EXPECT_EQ(std::string(rounding_name(Rounding::RNA)), "rna");
  EXPECT_EQ(parse_rounding_name("rna"), Rounding::RNA);
  EXPECT_THROW(parse_rounding_name("rnz"), std::invalid_argument);
}

TEST(Format, E2M1DecodeAll16) {
  const float table[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0f, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(bits_of(e2m1_decode(static_cast<uint8_t>(c))), bits_of(table[c])) << c;
    EXPECT_EQ(e2m1_encode(table[c], Rounding::RNE), c) << c;  // grid values are fixed points
  }
  EXPECT_EQ(e2m1_decode(0x17), 6.0f);  // only the low nibble counts
}

TEST(Format, E2M1SaturationAndErrors) {
  EXPECT_EQ(e2m1_encode(INFINITY, Rounding::RNE), 7);
  EXPECT_EQ(e2m1_encode(-INFINITY, Rounding::SR8, 255), 15);
  EXPECT_EQ(e2m1_encode(FLT_MAX, Rounding::RNE), 7);
  EXPECT_EQ(e2m1_encode(1e-45f, Rounding::SR8, 255), 0);  // δ tiny: never up
  EXPECT_THROW(e2m1_encode(NAN, Rounding::RNE), std::invalid_argument);
}

TEST(Format, UE5M3RneCases) {
  const float in[] = {0, 0x1p-18f, 0x1p-17f, 0x1p-14f, 61440, 100000};
  const float want[] = {0, 0, 0x1p-17f, 0x1p-14f, 61440, 61440};
  for (size_t i = 0; i < std::size(in); ++i) {
    EXPECT_EQ(round_magnitude(in[i], kUE5M3, Rounding::RNE), want[i]) << in[i];
  }
  // 2^-18 is the tie between 0 and 2^-17 → even (0); 3·2^-18 is the tie 2^-17 / 2^-16 → 2^-16.
  EXPECT_EQ(round_magnitude(3 * 0x1p-18f, kUE5M3, Rounding::RNE), 0x1p-16f);
  // 61440·(1 + 1/32) lies between 61440 and the reserved 65536: saturates.
  EXPECT_EQ(round_magnitude(63360.f, kUE5M3, Rounding::RNE), 61440.f);
  EXPECT_EQ(scale_encode(61440.f, ScaleFormat::UE5M3), 0xF7);
  EXPECT_EQ(scale_encode(1.0f, ScaleFormat::UE5M3), 0x78);  // field 15, m 0
  EXPECT_EQ(scale_encode(0x1p-17f, ScaleFormat::UE5M3), 0x01);
  EXPECT_EQ(scale_encode(0x1p-14f, ScaleFormat::UE5M3), 0x08);
}

TEST(Format, ScaleCodesRoundTrip) {
  struct Case {
    ScaleFormat f;
    int n_codes;
    const std::vector<double>* grid;
  };
  const Case cases[] = {{ScaleFormat::UE5M3, 248, &grid_ue5m3()},
                        {ScaleFormat::UE5M3_PTX, 255, &grid_ue5m3_ptx()},
                        {ScaleFormat::E4M3, 127, &grid_e4m3()}};
  for (const auto& c : cases) {
    ASSERT_EQ(static_cast<int>(c.grid->size()), c.n_codes);
    const FloatFormat& fmt = scale_format_desc(c.f);
    for (int code = 0; code < c.n_codes; ++code) {
      const float v = scale_decode(static_cast<uint8_t>(code), c.f);
      EXPECT_EQ(static_cast<double>(v), (*c.grid)[code]) << fmt.name << " code " << code;
      EXPECT_EQ(round_magnitude(v, fmt, Rounding::RNE), v) << fmt.name << " code " << code;
      EXPECT_EQ(scale_encode(round_magnitude(v, fmt, Rounding::RNE), c.f), code) << fmt.name;
    }
    for (int code = c.n_codes; code < 256; ++code) {
      EXPECT_THROW(scale_decode(static_cast<uint8_t>(code), c.f), std::invalid_argument)
          << fmt.name << " code " << code;
    }
  }
  // UE8M0: code k + 127 ↔ 2^k for k = −127..127; 0xFF is NaN.
  for (int code = 0; code < 255; ++code) {
    const float v = scale_decode(static_cast<uint8_t>(code), ScaleFormat::UE8M0);
    EXPECT_EQ(v, std::ldexp(1.0f, code - 127));
    EXPECT_EQ(round_magnitude(v, kUE8M0, Rounding::RNE), v);
    EXPECT_EQ(scale_encode(v, ScaleFormat::UE8M0), code);
  }
  EXPECT_THROW(scale_decode(0xFF, ScaleFormat::UE8M0), std::invalid_argument);
}

TEST(Format, ScaleMaxima) {
  // UE5M3 PTX: max 0xFE = 1.75·2^16 = 114688.
  EXPECT_EQ(kUE5M3PTX.max_finite, 114688.f);
  EXPECT_EQ(round_magnitude(1e6f, kUE5M3PTX, Rounding::RNE), 114688.f);
  EXPECT_EQ(round_magnitude(65536.f, kUE5M3PTX, Rounding::RNE), 65536.f);  // field 31 valid
  EXPECT_EQ(scale_encode(114688.f, ScaleFormat::UE5M3_PTX), 0xFE);
  EXPECT_EQ(scale_decode(0xF8, ScaleFormat::UE5M3_PTX), 65536.f);
  EXPECT_THROW(scale_decode(0xF8, ScaleFormat::UE5M3), std::invalid_argument);
  EXPECT_THROW(scale_encode(65536.f, ScaleFormat::UE5M3), std::invalid_argument);
  // E4M3: max 448 (0x7E), min subnormal 2^-9 (0x01).
  EXPECT_EQ(round_magnitude(1000.f, kE4M3, Rounding::RNE), 448.f);
  EXPECT_EQ(round_magnitude(464.f, kE4M3, Rounding::RNE), 448.f);  // tie 448/480 → sat
  EXPECT_EQ(scale_encode(448.f, ScaleFormat::E4M3), 0x7E);
  EXPECT_EQ(scale_decode(0x7E, ScaleFormat::E4M3), 448.f);
  EXPECT_EQ(scale_decode(0x01, ScaleFormat::E4M3), 0x1p-9f);
  EXPECT_EQ(round_magnitude(0x1p-9f, kE4M3, Rounding::RNE), 0x1p-9f);
  EXPECT_EQ(round_magnitude(0x1p-10f, kE4M3, Rounding::RNE), 0.f);          // tie → even 0
  EXPECT_EQ(round_magnitude(0x1.8p-10f, kE4M3, Rounding::RNE), 0x1p-9f);    // 0.75 ulp → up
  EXPECT_EQ(scale_encode(0x1p-9f, ScaleFormat::E4M3), 0x01);
  EXPECT_EQ(scale_encode(1.0f, ScaleFormat::E4M3), 0x38);  // field 7
  EXPECT_THROW(scale_decode(0x7F, ScaleFormat::E4M3), std::invalid_argument);
  EXPECT_THROW(scale_decode(0x80, ScaleFormat::E4M3), std::invalid_argument);
  // UE8M0 saturates at 2^127.
  EXPECT_EQ(round_magnitude(FLT_MAX, kUE8M0, Rounding::RNE), 0x1p127f);
  EXPECT_EQ(scale_encode(0x1p127f, ScaleFormat::UE8M0), 0xFE);
}

TEST(Format, UE8M0Rounding) {
  for (int k = -126; k <= 126; ++k) {
    const float p = std::ldexp(1.0f, k);
    EXPECT_EQ(round_magnitude(p, kUE8M0, Rounding::RNE), p);
    EXPECT_EQ(round_magnitude(1.4f * p, kUE8M0, Rounding::RNE), p) << k;
    EXPECT_EQ(round_magnitude(1.6f * p, kUE8M0, Rounding::RNE), 2 * p) << k;
    // Tie 1.5·2^k: lo = 1 is odd, so the contract's rule rounds up.
    EXPECT_EQ(round_magnitude(1.5f * p, kUE8M0, Rounding::RNE), 2 * p) << k;
  }
  EXPECT_EQ(round_magnitude(0x1p-127f, kUE8M0, Rounding::RNE), 0x1p-127f);
  EXPECT_EQ(round_magnitude(0x1.8p-128f, kUE8M0, Rounding::RNE), 0x1p-127f);
  EXPECT_EQ(round_magnitude(0x1p-128f, kUE8M0, Rounding::RNE), 0.f);  // tie with lo = 0 even
  EXPECT_EQ(round_magnitude(0.f, kUE8M0, Rounding::RNE), 0.f);
  EXPECT_THROW(scale_encode(0.f, ScaleFormat::UE8M0), std::invalid_argument);  // no zero code
}

TEST(Format, ScaleEncodeRejectsNonRepresentable) {
  EXPECT_THROW(scale_encode(1.1f, ScaleFormat::UE5M3), std::invalid_argument);
  EXPECT_THROW(scale_encode(70000.f, ScaleFormat::UE5M3), std::invalid_argument);
  EXPECT_THROW(scale_encode(-1.f, ScaleFormat::UE5M3), std::invalid_argument);
  EXPECT_THROW(scale_encode(NAN, ScaleFormat::E4M3), std::invalid_argument);
  EXPECT_THROW(scale_encode(INFINITY, ScaleFormat::UE5M3_PTX), std::invalid_argument);
  EXPECT_THROW(scale_encode(0x1p-18f, ScaleFormat::UE5M3), std::invalid_argument);
  EXPECT_THROW(scale_encode(1.5f, ScaleFormat::UE8M0), std::invalid_argument);
  EXPECT_THROW(round_magnitude(-1.f, kUE5M3, Rounding::RNE), std::invalid_argument);
  EXPECT_THROW(round_magnitude(NAN, kE2M1, Rounding::RNE), std::invalid_argument);
  EXPECT_EQ(round_magnitude(INFINITY, kUE5M3, Rounding::RNE), 61440.f);
}

TEST(Format, ParseScaleFormat) {
  for (ScaleFormat f : {ScaleFormat::UE5M3, ScaleFormat::UE5M3_PTX, ScaleFormat::E4M3,
                        ScaleFormat::UE8M0}) {
    EXPECT_EQ(parse_scale_format(scale_format_name(f)), f);
  }
  EXPECT_STREQ(scale_format_name(ScaleFormat::UE5M3_PTX), "ue5m3-ptx");
  try {
    parse_scale_format("fp8");
    FAIL() << "no throw";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("fp8"), std::string::npos) << msg;
    EXPECT_NE(msg.find("ue5m3-ptx"), std::string::npos) << msg;
    EXPECT_NE(msg.find("e4m3"), std::string::npos) << msg;
  }
}

TEST(Format, RoundBf16) {
  EXPECT_EQ(round_bf16(1.0f), 1.0f);
  EXPECT_EQ(round_bf16(1.0f + 0x1p-8f), 1.0f);                  // tie → even
  EXPECT_EQ(round_bf16(1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f);    // tie → even (up)
  EXPECT_EQ(round_bf16(1.0f + 0x1p-8f + 0x1p-20f), 1.0f + 0x1p-7f);
  EXPECT_EQ(round_bf16(-1.0f - 0x1p-8f - 0x1p-20f), -1.0f - 0x1p-7f);
  EXPECT_EQ(round_bf16(FLT_MAX), INFINITY);
  EXPECT_EQ(round_bf16(-INFINITY), -INFINITY);
  EXPECT_TRUE(std::isnan(round_bf16(NAN)));
  EXPECT_EQ(bits_of(round_bf16(0.1f)) & 0xFFFFu, 0u);
}

// --------------------------------------------------------------------------------- rounding

TEST(Rounding, SrEightBitThresholds) {
  // 0.75: e = 0, q = −1, s = 1.5, δ = .5: up iff .5 + (2r+1)/512 ≥ 1 iff r ≥ 128.
  EXPECT_EQ(round_magnitude(0.75f, kE2M1, Rounding::SR8, 127), 0.5f);
  EXPECT_EQ(round_magnitude(0.75f, kE2M1, Rounding::SR8, 128), 1.0f);
  int up75 = 0, up625 = 0;
  for (int r = 0; r < 256; ++r) {
    up75 += round_magnitude(0.75f, kE2M1, Rounding::SR8, static_cast<uint8_t>(r)) == 1.0f;
    up625 += round_magnitude(0.625f, kE2M1, Rounding::SR8, static_cast<uint8_t>(r)) == 1.0f;
  }
  EXPECT_EQ(up75, 128);
  EXPECT_EQ(up625, 64);  // δ = .25: (2r+1) ≥ 384 iff r ≥ 192
  // grid values never move, whatever r
  for (int r = 0; r < 256; ++r) {
    EXPECT_EQ(round_magnitude(3.0f, kE2M1, Rounding::SR8, static_cast<uint8_t>(r)), 3.0f);
  }
}

TEST(Rounding, MatchesIndependentReference) {
  struct Case {
    const FloatFormat* fmt;
    const std::vector<double>* grid;
  };
  const Case cases[] = {{&kE2M1, &grid_e2m1()},
                        {&kUE5M3, &grid_ue5m3()},
                        {&kUE5M3PTX, &grid_ue5m3_ptx()},
                        {&kE4M3, &grid_e4m3()}};
  std::mt19937 rng(1234);
  for (const auto& c : cases) {
    const auto& grid = *c.grid;
    std::vector<float> inputs = {0.f, 1e-45f, FLT_MIN, 1e30f, FLT_MAX};
    // every grid point, midpoints, quarter points and their FP32 neighbours
    for (size_t i = 0; i + 1 < grid.size(); ++i) {
      for (double t : {0.0, 0.25, 0.5, 0.75}) {
        const float v = static_cast<float>(grid[i] + t * (grid[i + 1] - grid[i]));
        inputs.insert(inputs.end(), {v, std::nextafter(v, 0.f), std::nextafter(v, INFINITY)});
      }
    }
    // log-uniform over the format's range and beyond
    const double lo_exp = std::log2(grid[1]) - 3, hi_exp = std::log2(grid.back()) + 2;
    std::uniform_real_distribution<double> ue(lo_exp, hi_exp);
    for (int i = 0; i < 20000; ++i) inputs.push_back(static_cast<float>(std::exp2(ue(rng))));

    for (float a : inputs) {
      const double want = ref_rne(grid, a);
      ASSERT_EQ(static_cast<double>(round_magnitude(a, *c.fmt, Rounding::RNE)), want)
          << c.fmt->name << " a = " << a;
      ASSERT_EQ(static_cast<double>(round_magnitude(a, *c.fmt, Rounding::RNA)), ref_rna(grid, a))
          << c.fmt->name << " RNA a = " << a;
      // SR8
      int up = 0;
      const double lo = a >= grid.back() ? grid.back() : grid[lower_index(grid, a)];
      if (a >= grid.back()) {
        for (int r = 0; r < 256; r += 15) {
          ASSERT_EQ(round_magnitude(a, *c.fmt, Rounding::SR8, static_cast<uint8_t>(r)),
                    grid.back());
        }
        continue;
      }
      const double hi = grid[lower_index(grid, a) + 1];
      bool seen_up = false;
      for (int r = 0; r < 256; ++r) {
        const double got = round_magnitude(a, *c.fmt, Rounding::SR8, static_cast<uint8_t>(r));
        ASSERT_TRUE(got == lo || got == hi) << c.fmt->name << " a = " << a << " r = " << r;
        if (got == hi && hi != lo) {
          ++up;
          seen_up = true;
        } else {
          ASSERT_FALSE(seen_up) << "up must be monotone in r";
        }
      }
      const double delta = (a - lo) / (hi - lo);
      // The contract's FP32 sum δ + (2r+1)/512 may round up by ≤ 2^-25 when δ has bits below
      // 2^-24 (only for inputs far below the format's smallest step), never down.
      const int exact = ref_sr_up_count(delta);
      const int loose = ref_sr_up_count(delta + 0x1p-25);
      ASSERT_GE(up, exact) << c.fmt->name << " a = " << a;
      ASSERT_LE(up, loose) << c.fmt->name << " a = " << a;
    }
  }
}

// ------------------------------------------------------------------------------ block quant

TEST(BlockQuant, BlockAmax1DTailPadded) {
  const std::vector<float> x = {1, 2, 3, 4, 100};
  BlockQuantSpec spec;
  spec.block = 4;
  const QuantizedTensor q = quantize_blocks(x.data(), 1, 5, spec, 100.f, nullptr);
  ASSERT_EQ(q.block_rows, 1);
  ASSERT_EQ(q.block_cols, 2);
  EXPECT_EQ(q.block_amax, (std::vector<float>{4, 100}));
}

TEST(BlockQuant, BlockAmax2DTiles) {
  std::vector<float> x(20);
  for (int i = 0; i < 20; ++i) x[i] = static_cast<float>(i + 1);
  BlockQuantSpec spec;
  spec.block = 2;
  spec.two_d = true;
  const QuantizedTensor q = quantize_blocks(x.data(), 4, 5, spec, 20.f, nullptr);
  ASSERT_EQ(q.block_rows, 2);
  ASSERT_EQ(q.block_cols, 3);
  EXPECT_EQ(q.block_amax, (std::vector<float>{7, 9, 10, 17, 19, 20}));
  // every element of a tile shares the tile's scale: check through the dequantized values
  std::vector<float> out(20);
  dequantize(q, out.data());
  for (int r = 0; r < 4; ++r) {
    for (int c = 0; c < 5; ++c) {
      const float d = q.scales[(r / 2) * 3 + c / 2] * q.gd;
      EXPECT_EQ(out[r * 5 + c], e2m1_decode(q.codes[r * 5 + c]) * d);
    }
  }
}

TEST(BlockQuant, AllZeroTensor) {
  const std::vector<float> x(2 * 17, 0.f);
  for (ScaleFormat f : {ScaleFormat::UE5M3, ScaleFormat::UE5M3_PTX, ScaleFormat::E4M3,
                        ScaleFormat::UE8M0}) {
    BlockQuantSpec spec;
    spec.scale_format = f;
    spec.block = 16;
    const QuantizedTensor q = quantize_blocks(x.data(), 2, 17, spec, 0.f, nullptr);
    EXPECT_EQ(q.ge, 1.f);
    EXPECT_EQ(q.gd, 1.f);
    ASSERT_EQ(q.scale_codes.size(), 4u);
    const uint8_t one = scale_encode(1.0f, f);
    for (size_t b = 0; b < 4; ++b) {
      EXPECT_EQ(q.scale_codes[b], one);
      EXPECT_EQ(q.scales[b], 1.0f);
    }
    if (f == ScaleFormat::UE5M3) {
      EXPECT_EQ(one, 0x78);
    }
    if (f == ScaleFormat::UE8M0) {
      EXPECT_EQ(one, 127);
    }
    std::vector<float> out(x.size(), 7.f);
    quantize_dequantize(x.data(), 2, 17, spec, 0.f, nullptr, out.data());
    for (float v : out) EXPECT_EQ(bits_of(v), 0u);
  }
}

TEST(BlockQuant, HeldReferenceHeadroom) {
  const std::vector<float> x = {1, 2, 3, 40};
  BlockQuantSpec spec;
  spec.block = 4;
  spec.target = 448.f;
  // g = 4 (held while the tensor grew 10×): ge = 672, c = 40·112 = 4480 → UE5M3 4608.
  QuantizedTensor q = quantize_blocks(x.data(), 1, 4, spec, 4.f, nullptr);
  EXPECT_EQ(q.ge, 672.f);
  EXPECT_LT(q.scales[0], 61440.f);
  EXPECT_EQ(q.scales[0], 4608.f);
  std::vector<float> out(4);
  dequantize(q, out.data());
  EXPECT_NEAR(out[3], 40.f, 0.04f * 40.f);
  // g = 1e-40: ge saturates at FLT_MAX, the block scale clips at 61440, output stays finite.
  q = quantize_blocks(x.data(), 1, 4, spec, 1e-40f, nullptr);
  EXPECT_EQ(q.ge, FLT_MAX);
  EXPECT_EQ(q.scale_codes[0], 0xF7);
  dequantize(q, out.data());
  for (float v : out) EXPECT_TRUE(std::isfinite(v)) << v;
}

TEST(BlockQuant, HandComputed) {
  // T = 448, g = 448: ge = 2688/448 = 6, gd = fl(1/6), mult = 6·fl(1/6) = 1 + 2^-25.6… → 1.
  // Block amax 3 → c = 3 = 1.5·2^1 (UE5M3 code 16<<3 | 4 = 0x84). d = 3·fl(1/6) → 0.5 in
  // FP32, e = 2. x·e = [6, 2.5, −0.6, 1.4] → E2M1 [6, 2 (tie, even), −0.5, 1.5].
  const std::vector<float> x = {3.f, 1.25f, -0.3f, 0.7f};
  BlockQuantSpec spec;
  spec.block = 4;
  const QuantizedTensor q = quantize_blocks(x.data(), 1, 4, spec, 448.f, nullptr);
  EXPECT_EQ(q.ge, 6.f);
  EXPECT_EQ(q.scales[0], 3.f);
  EXPECT_EQ(q.scale_codes[0], 0x84);
  EXPECT_EQ(q.codes, (std::vector<uint8_t>{7, 4, 9, 3}));
  std::vector<float> out(4);
  dequantize(q, out.data());
  EXPECT_EQ(out, (std::vector<float>{3.f, 1.f, -0.25f, 0.75f}));
  // g = 2688: ge = 1 = gd; amax 6 → c = 6·fl(1/6) → 1; x = [.3, −1, 2.5, 6] → [.5, −1, 2, 6].
  const std::vector<float> y = {0.3f, -1.f, 2.5f, 6.f};
  quantize_dequantize(y.data(), 1, 4, spec, 2688.f, nullptr, out.data());
  EXPECT_EQ(out, (std::vector<float>{0.5f, -1.f, 2.f, 6.f}));
}

TEST(BlockQuant, OperationOrderOfBlockScale) {
  // Search for (g, a_b) where fl(fl(a_b·ge)/6) and fl(a_b·fl(ge·fl(1/6))) round to different
  // UE5M3 scales, then check quantize_blocks follows the contract (multiplier first).
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> ug(0.5f, 50.f);
  bool found = false;
  for (int trial = 0; trial < 2000 && !found; ++trial) {
    const float g = ug(rng);
    const RefTensorScales ts = ref_tensor_scales(g, 448.f);
    const int k = static_cast<int>(rng() % 20) - 5;
    const double mid = std::ldexp(1.0 + (2 * (rng() % 8) + 1) / 16.0, k);  // a UE5M3 midpoint
    float a = static_cast<float>(mid / (static_cast<double>(ts.ge) / 6.0));
    for (int i = 0; i < 64; ++i) a = std::nextafter(a, 0.f);
    for (int i = 0; i < 128 && !found; ++i, a = std::nextafter(a, INFINITY)) {
      const double s_contract = ref_rne(grid_ue5m3(), a * ts.mult);
      const double s_reassoc = ref_rne(grid_ue5m3(), (a * ts.ge) / 6.0f);
      if (s_contract == s_reassoc) continue;
      found = true;
      std::vector<float> x(16, 0.f);
      x[5] = -a;
      BlockQuantSpec spec;
      const QuantizedTensor q = quantize_blocks(x.data(), 1, 16, spec, g, nullptr);
      EXPECT_EQ(q.block_amax[0], a);
      EXPECT_EQ(static_cast<double>(q.scales[0]), s_contract) << "g = " << g << " a = " << a;
      EXPECT_NE(static_cast<double>(q.scales[0]), s_reassoc);
    }
  }
  EXPECT_TRUE(found) << "no distinguishing case found";
}

TEST(BlockQuant, OperationOrderOfElementScale) {
  // Search for x where round(fl(x·fl(1/d_b))) ≠ round(fl(x/d_b)); the contract multiplies.
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> ug(0.5f, 50.f), ua(1.f, 60.f);
  const double mids[] = {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0};
  bool found = false;
  for (int trial = 0; trial < 4000 && !found; ++trial) {
    const float g = ug(rng), amax = ua(rng);
    const RefTensorScales ts = ref_tensor_scales(g, 448.f);
    float c = static_cast<float>(ref_rne(grid_ue5m3(), std::min(amax * ts.mult, 61440.f)));
    if (c == 0.f) c = 1.f;
    const float d = c * ts.gd, e = 1.0f / d;
    const double mid = mids[rng() % std::size(mids)];
    float x = static_cast<float>(mid * d);
    if (!(x < amax)) continue;
    for (int i = 0; i < 32; ++i) x = std::nextafter(x, 0.f);
    for (int i = 0; i < 64 && !found; ++i, x = std::nextafter(x, INFINITY)) {
      const double q_contract = ref_rne(grid_e2m1(), x * e);
      const double q_divide = ref_rne(grid_e2m1(), x / d);
      if (q_contract == q_divide) continue;
      found = true;
      const std::vector<float> row = {amax, x};
      BlockQuantSpec spec;
      std::vector<float> out(2);
      quantize_dequantize(row.data(), 1, 2, spec, g, nullptr, out.data());
      EXPECT_EQ(static_cast<double>(out[1]), static_cast<double>(static_cast<float>(q_contract) * d));
      EXPECT_NE(static_cast<double>(out[1]), static_cast<double>(static_cast<float>(q_divide) * d));
    }
  }
  EXPECT_TRUE(found) << "no distinguishing case found";
}

TEST(BlockQuant, SrUsesElementByteOfKey) {
  // Element (i, j) rounds with sr_byte(key, i·cols + j); recompute every element from the
  // contract formulas and e2m1_encode.
  std::mt19937 rng(5);
  const int rows = 5, cols = 33;
  const std::vector<float> x = random_tensor(rng, 0, rows * cols);
  SrKey key{99, 3, 1, 2, 2};
  for (bool two_d : {false, true}) {
    BlockQuantSpec spec;
    spec.block = 8;
    spec.two_d = two_d;
    spec.rounding = Rounding::SR8;
    const float g = 0.7f * tensor_amax(x.data(), rows * cols);
    const QuantizedTensor q = quantize_blocks(x.data(), rows, cols, spec, g, &key);
    const RefTensorScales ts = ref_tensor_scales(g, spec.target);
    for (int i = 0; i < rows; ++i) {
      for (int j = 0; j < cols; ++j) {
        const int br = two_d ? i / 8 : i, bc = j / 8;
        float a = 0.f;
        for (int r = (two_d ? br * 8 : i); r < (two_d ? std::min(rows, br * 8 + 8) : i + 1); ++r)
          for (int cc = bc * 8; cc < std::min(cols, bc * 8 + 8); ++cc)
            a = std::max(a, std::fabs(x[r * cols + cc]));
        float c = static_cast<float>(ref_rne(grid_ue5m3(), std::min(a * ts.mult, 61440.f)));
        if (c == 0.f) c = 1.f;
        const float e = 1.0f / (c * ts.gd);
        const uint8_t want =
            e2m1_encode(x[i * cols + j] * e, Rounding::SR8, sr_byte(key, uint64_t(i) * cols + j));
        ASSERT_EQ(q.codes[i * cols + j], want) << i << "," << j;
      }
    }
  }
}

TEST(BlockQuant, FusedMatchesTwoStepBitForBit) {
  std::mt19937 rng(2024);
  const int shapes[][2] = {{1, 1}, {3, 17}, {5, 33}, {16, 16}, {33, 65}, {64, 48}};
  const ScaleFormat fmts[] = {ScaleFormat::UE5M3, ScaleFormat::UE5M3_PTX, ScaleFormat::E4M3,
                              ScaleFormat::UE8M0};
  const float g_factors[] = {1.f, 0.01f, 100.f, 0.f};
  SrKey key{12345, 7, 3, 2, 1};
  size_t total[2] = {0, 0};
  for (int kind = 0; kind < 6; ++kind) {
    for (const auto& sh : shapes) {
      const int rows = sh[0], cols = sh[1];
      const std::vector<float> x = random_tensor(rng, kind, size_t(rows) * cols);
      const float amax = tensor_amax(x.data(), rows * cols);
      for (Rounding mode : {Rounding::RNE, Rounding::SR8}) {
        for (int block : {16, 32, 5}) {
          for (bool two_d : {false, true}) {
            BlockQuantSpec spec;
            spec.scale_format = fmts[rng() % 4];
            spec.block = block;
            spec.two_d = two_d;
            spec.rounding = mode;
            spec.target = (rng() % 3 == 0) ? 2048.f : 448.f;
            const float g = amax * g_factors[rng() % 4];
            const QuantizedTensor q = quantize_blocks(x.data(), rows, cols, spec, g, &key);
            std::vector<float> two(x.size()), fused(x.size());
            dequantize(q, two.data());
            quantize_dequantize(x.data(), rows, cols, spec, g, &key, fused.data());
            ASSERT_TRUE(same_bits(two, fused))
                << "kind " << kind << " shape " << rows << "x" << cols << " block " << block
                << " 2d " << two_d << " fmt " << scale_format_name(spec.scale_format);
            std::vector<float> inplace = x;  // out aliases x
            quantize_dequantize(inplace.data(), rows, cols, spec, g, &key, inplace.data());
            ASSERT_TRUE(same_bits(two, inplace));
            for (float v : fused) ASSERT_TRUE(std::isfinite(v));
            total[mode == Rounding::SR8] += x.size();
          }
        }
      }
    }
  }
  EXPECT_GE(total[0], 100000u);
  EXPECT_GE(total[1], 100000u);
}

TEST(BlockQuant, ThreadCountDoesNotChangeBits) {
  std::mt19937 rng(3);
  const int rows = 256, cols = 1000;
  const std::vector<float> x = random_tensor(rng, 1, size_t(rows) * cols);
  SrKey key{1, 2, 3, 2, 2};
  const int saved = omp_get_max_threads();
  for (Rounding mode : {Rounding::RNE, Rounding::SR8}) {
    for (bool two_d : {false, true}) {
      BlockQuantSpec spec;
      spec.rounding = mode;
      spec.two_d = two_d;
      std::vector<float> out[3];
      std::vector<uint8_t> codes[3];
      const int threads[3] = {1, 2, 4};
      for (int t = 0; t < 3; ++t) {
        omp_set_num_threads(threads[t]);
        const float g = tensor_amax(x.data(), rows * cols);
        out[t].resize(x.size());
        quantize_dequantize(x.data(), rows, cols, spec, g, &key, out[t].data());
        codes[t] = quantize_blocks(x.data(), rows, cols, spec, g, &key).codes;
      }
      EXPECT_TRUE(same_bits(out[0], out[1]));
      EXPECT_TRUE(same_bits(out[0], out[2]));
      EXPECT_EQ(codes[0], codes[1]);
      EXPECT_EQ(codes[0], codes[2]);
    }
  }
  omp_set_num_threads(saved);
}

TEST(BlockQuant, Errors) {
  std::vector<float> x = {1, 2, 3, 4};
  BlockQuantSpec spec;
  std::vector<float> out(4);
  spec.block = 0;
  EXPECT_THROW(quantize_blocks(x.data(), 1, 4, spec, 4.f, nullptr), std::invalid_argument);
  EXPECT_THROW(quantize_dequantize(x.data(), 1, 4, spec, 4.f, nullptr, out.data()),
               std::invalid_argument);
  spec.block = 16;
  EXPECT_THROW(quantize_blocks(x.data(), 1, 4, spec, -1.f, nullptr), std::invalid_argument);
  EXPECT_THROW(quantize_blocks(x.data(), 1, 4, spec, NAN, nullptr), std::invalid_argument);
  EXPECT_THROW(quantize_blocks(x.data(), 1, 4, spec, INFINITY, nullptr), std::invalid_argument);
  spec.target = 0.f;
  EXPECT_THROW(quantize_blocks(x.data(), 1, 4, spec, 4.f, nullptr), std::invalid_argument);
  spec.target = 448.f;
  spec.rounding = Rounding::SR8;
  EXPECT_THROW(quantize_blocks(x.data(), 1, 4, spec, 4.f, nullptr), std::invalid_argument);
  spec.rounding = Rounding::RNE;
  x[2] = NAN;
  try {
    quantize_dequantize(x.data(), 2, 2, spec, 4.f, nullptr, out.data());
    FAIL() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("element 2"), std::string::npos) << e.what();
  }
  x[2] = -INFINITY;
  EXPECT_THROW(quantize_blocks(x.data(), 1, 4, spec, 4.f, nullptr), std::invalid_argument);
}

TEST(BlockQuant, TensorAmax) {
  const std::vector<float> x = {1.f, -7.5f, 3.f, -0.f};
  EXPECT_EQ(tensor_amax(x.data(), 4), 7.5f);
  EXPECT_EQ(tensor_amax(x.data(), 0), 0.f);
  std::vector<float> big(100000, 1.f);
  big[77777] = -9.f;
  EXPECT_EQ(tensor_amax(big.data(), 100000), 9.f);
  big[4242] = NAN;
  big[50000] = INFINITY;
  try {
    tensor_amax(big.data(), 100000);
    FAIL() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("4242"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------------- philox

TEST(Philox, BytesMatchSingleBytesAndRandom123) {
  const SrKey key{0x123456789ABCDEFull, 17, 5, 2, 1};
  std::vector<uint8_t> buf(1000);
  sr_bytes(key, 13, buf.size(), buf.data());
  r123::Philox4x32 gen;
  const r123::Philox4x32::key_type k = {{0x89ABCDEFu, 0x01234567u}};
  for (size_t j = 0; j < buf.size(); ++j) {
    const uint64_t i = 13 + j;
    ASSERT_EQ(buf[j], sr_byte(key, i)) << i;
    const r123::Philox4x32::ctr_type c = {
        {static_cast<uint32_t>(i / 16), 17u, (5u << 8) + (2u << 4) + 1u, 0x5352u}};
    const auto out = gen(c, k);
    ASSERT_EQ(buf[j], static_cast<uint8_t>(out.v[(i % 16) / 4] >> (8 * (i % 4)))) << i;
  }
  sr_bytes(key, 0, 0, nullptr);  // n = 0 is a no-op
}

// The micro-batch index enters the fourth counter word as micro·2^16 + 0x5352 (philox.h), so
// micro-batch 0 keeps the streams of runs without micro-batching.
TEST(Philox, MicroBatchIndexEntersTheFourthCounterWord) {
  r123::Philox4x32 gen;
  const r123::Philox4x32::key_type k = {{0x89ABCDEFu, 0x01234567u}};
  for (uint32_t micro : {1u, 7u, 65535u}) {
    SrKey key{0x123456789ABCDEFull, 17, 5, 2, 1};
    key.micro = micro;
    std::vector<uint8_t> buf(200);
    sr_bytes(key, 3, buf.size(), buf.data());
    for (size_t j = 0; j < buf.size(); ++j) {
      const uint64_t i = 3 + j;
      const r123::Philox4x32::ctr_type c = {{static_cast<uint32_t>(i / 16), 17u,
                                             (5u << 8) + (2u << 4) + 1u, (micro << 16) + 0x5352u}};
      const auto out = gen(c, k);
      ASSERT_EQ(buf[j], static_cast<uint8_t>(out.v[(i % 16) / 4] >> (8 * (i % 4)))) << micro << " " << i;
      ASSERT_EQ(buf[j], sr_byte(key, i));
    }
  }
}

TEST(Philox, DistinctStreams) {
  const SrKey base{42, 1, 0, 2, 1};
  std::vector<SrKey> keys(8, base);
  keys[7].micro = 1;
  keys[1].step = 2;
  keys[2].layer = 1;
  keys[3].operand = 0;
  keys[4].gemm = 2;
  keys[5].seed = 43;
  keys[6].seed = 42 + (1ull << 32);
  std::vector<std::vector<uint8_t>> streams;
  for (const auto& k : keys) {
    std::vector<uint8_t> b(64);
    sr_bytes(k, 0, 64, b.data());
    streams.push_back(b);
  }
  for (size_t a = 0; a < streams.size(); ++a)
    for (size_t b = a + 1; b < streams.size(); ++b) EXPECT_NE(streams[a], streams[b]) << a << b;
}

TEST(Philox, RoughlyUniformBytes) {
  const SrKey key{7, 1, 0, 2, 0};
  std::vector<uint8_t> b(1 << 16);
  sr_bytes(key, 0, b.size(), b.data());
  std::vector<int> hist(256, 0);
  for (uint8_t v : b) ++hist[v];
  double chi2 = 0;
  for (int h : hist) chi2 += (h - 256.0) * (h - 256.0) / 256.0;
  EXPECT_LT(chi2, 350.0);  // 255 dof: mean 255, sd 22.6
  EXPECT_GT(chi2, 170.0);
}

// ------------------------------------------------------------------------------------- RHT

TEST(Rht, HandComputedChunks) {
  // e_3: s_3 = −1, row 3 of H16 is [+,−,−,+] repeated, so y = −[+,−,−,+]·… / 4.
  std::vector<float> x(16, 0.f);
  x[3] = 1.f;
  rht16_rows(x.data(), 1, 16);
  const float p = 0.25f, m = -0.25f;
  EXPECT_EQ(x, (std::vector<float>{m, p, p, m, m, p, p, m, m, p, p, m, m, p, p, m}));
  // x = s: x ⊙ s = all ones, ones · H16 = [16, 0, …, 0], /4 → [4, 0, …].
  std::vector<float> s(kRhtSigns, kRhtSigns + 16);
  rht16_rows(s.data(), 1, 16);
  std::vector<float> want(16, 0.f);
  want[0] = 4.f;
  EXPECT_EQ(s, want);
  // e_0 + e_1 (signs +, +): (H[0][j] + H[1][j]) / 4 = [.5, 0, .5, 0, …].
  std::vector<float> y(32, 0.f);
  y[16] = 1.f;
  y[17] = 1.f;  // second chunk of the row; the first stays zero
  rht16_rows(y.data(), 1, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.f);
    EXPECT_EQ(y[16 + j], j % 2 == 0 ? 0.5f : 0.f) << j;
  }
}

TEST(Rht, MatchesNaiveAndPreservesProducts) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  const int M = 4, N = 3, K = 64;
  std::vector<float> A(M * K), B(N * K);
  for (auto& v : A) v = nd(rng);
  for (auto& v : B) v = nd(rng);
  std::vector<float> A2 = A, B2 = B;
  rht16_rows(A2.data(), M, K);
  rht16_rows(B2.data(), N, K);
  // naive (x ⊙ s)·H16/4 in double with H[i][j] = (−1)^popcount(i & j)
  for (int r = 0; r < M; ++r) {
    for (int c0 = 0; c0 < K; c0 += 16) {
      for (int j = 0; j < 16; ++j) {
        double acc = 0;
        for (int i = 0; i < 16; ++i)
          acc += A[r * K + c0 + i] * kRhtSigns[i] * (std::popcount(unsigned(i & j)) % 2 ? -1 : 1);
        EXPECT_NEAR(A2[r * K + c0 + j], acc / 4, 1e-5 * (1 + std::fabs(acc)));
      }
    }
  }
  double maxc = 0, maxerr = 0;
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < N; ++j) {
      double c = 0, c2 = 0;
      for (int k = 0; k < K; ++k) {
        c += double(A[i * K + k]) * B[j * K + k];
        c2 += double(A2[i * K + k]) * B2[j * K + k];
      }
      maxc = std::max(maxc, std::fabs(c));
      maxerr = std::max(maxerr, std::fabs(c - c2));
    }
  }
  EXPECT_LT(maxerr, 1e-5 * maxc);
  // inverse: y·H16/4 then ⊙ s recovers x (H16·H16 = 16·I)
  std::vector<float> back = A2;
  rht16_rows(back.data(), M, K);  // = (y ⊙ s)·H/4
  for (int r = 0; r < M; ++r) {
    for (int c0 = 0; c0 < K; c0 += 16) {
      for (int j = 0; j < 16; ++j) {
        double acc = 0;  // y·H/4, computed naively from the first transform's output
        for (int i = 0; i < 16; ++i)
          acc += A2[r * K + c0 + i] * (std::popcount(unsigned(i & j)) % 2 ? -1 : 1);
        EXPECT_NEAR(acc / 4 * kRhtSigns[j], A[r * K + c0 + j], 1e-5);
      }
    }
  }
}

/// RNE of a finite double onto BF16's 8 significant bits (normal range), written without the
/// library's bit tricks: scale the value so that one BF16 ulp is 1 and use nearbyint (ties to
/// even in the default rounding mode).
static double bf16_rne_independent(double v) {
  if (v == 0) return v;
  const int e = std::ilogb(v);
  return std::nearbyint(std::ldexp(v, 7 - e)) * std::ldexp(1.0, e - 7);
}

TEST(Rht, Bf16VariantMatchesItsDefinition) {
  // Hand-computed: x = (1, 2^-8, 0, …), s_0 = s_1 = +1, H[1][j] = (−1)^(j & 1), so the exact
  // transform is (1 ± 2^-8)/4. FP32 keeps it; BF16 rounds 1 + 2^-8 (a tie between 1 and
  // 1 + 2^-7) to even, 1, and 1 − 2^-8 = 255/256 is a BF16 value.
  std::vector<float> a(16, 0.f);
  a[0] = 1.f;
  a[1] = 0x1p-8f;
  std::vector<float> b = a;
  rht16_rows(a.data(), 1, 16);
  rht16_rows_bf16(b.data(), 1, 16);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(a[j], j % 2 == 0 ? 0.25f + 0x1p-10f : 0.25f - 0x1p-10f) << j;
    EXPECT_EQ(b[j], j % 2 == 0 ? 0.25f : 0.25f - 0x1p-10f) << j;
  }
  // Inputs are rounded first: 1 + 2^-10 → 1, and the tie 1 + 3·2^-8 → 1 + 2^-6 (even).
  for (auto [in, rounded] : {std::pair<float, float>{1.f + 0x1p-10f, 1.f}, {1.f + 0x3p-8f, 1.f + 0x1p-6f}}) {
    std::vector<float> c(16, 0.f);
    c[0] = in;
    rht16_rows_bf16(c.data(), 1, 16);
    for (int j = 0; j < 16; ++j) EXPECT_EQ(c[j], rounded * 0.25f) << in << " j " << j;
  }
  // Independent: inputs of magnitude [1, 256) (so every FP32 partial sum is exact), BF16-rounded
  // by an independent rule, transformed exactly in double, rounded to BF16 the same way.
  std::mt19937 rng(31);
  std::uniform_real_distribution<float> ud(0.f, 1.f);
  const int rows = 8, cols = 64;
  std::vector<float> x(rows * cols);
  for (auto& v : x)
    v = rng() % 9 == 0 ? 0.f : (1.f + ud(rng)) * float(1 << (rng() % 8)) * ((rng() & 1) ? -1.f : 1.f);
  std::vector<float> y = x;
  rht16_rows_bf16(y.data(), rows, cols);
  for (int r = 0; r < rows; ++r)
    for (int c0 = 0; c0 < cols; c0 += 16)
      for (int j = 0; j < 16; ++j) {
        double acc = 0;
        for (int i = 0; i < 16; ++i)
          acc += bf16_rne_independent(x[r * cols + c0 + i]) * kRhtSigns[i] *
                 (std::popcount(unsigned(i & j)) % 2 ? -1 : 1);
        EXPECT_EQ(double(y[r * cols + c0 + j]), bf16_rne_independent(acc / 4))
            << "row " << r << " col " << c0 + j;
      }
  // Any inputs (wide exponent spread, FP32 subnormals): exactly round_bf16 ∘ FP32 RHT ∘
  // round_bf16, the stated order.
  for (int kind = 0; kind < 6; ++kind) {
    std::mt19937 r2(300 + kind);
    std::vector<float> z = random_tensor(r2, kind, 4 * 48);
    std::vector<float> want = z;
    for (auto& v : want) v = round_bf16(v);
    rht16_rows(want.data(), 4, 48);
    for (auto& v : want) v = round_bf16(v);
    rht16_rows_bf16(z.data(), 4, 48);
    EXPECT_TRUE(same_bits(z, want)) << "kind " << kind;
  }
  std::vector<float> e(40, 1.f);
  EXPECT_THROW(rht16_rows_bf16(e.data(), 2, 20), std::invalid_argument);
  EXPECT_THROW(rht16_rows(e.data(), 1, 8, RhtPrecision::BF16), std::invalid_argument);
  EXPECT_EQ(parse_rht_precision("bf16"), RhtPrecision::BF16);
  EXPECT_EQ(std::string(rht_precision_name(parse_rht_precision("fp32"))), "fp32");
  EXPECT_THROW(parse_rht_precision("fp16"), std::invalid_argument);
}

TEST(Rht, RejectsColsNotMultipleOf16) {
  std::vector<float> x(40, 1.f);
  EXPECT_THROW(rht16_rows(x.data(), 2, 20), std::invalid_argument);
  EXPECT_THROW(rht16_rows(x.data(), 1, 8), std::invalid_argument);
  EXPECT_NO_THROW(rht16_rows(x.data(), 0, 16));
}

// ------------------------------------------------------------------------ Hadamard of any size
// docs/numerics.md "Random Hadamard transform", "Sizes, roles and sign policies".

namespace {
/// Naive (x ⊙ s)·H_n·c in double for one n-chunk, H[i][j] = (−1)^popcount(i & j).
std::vector<double> naive_hadamard(const float* x, const HadamardTransform& h) {
  std::vector<double> y(size_t(h.n), 0.0);
  for (int j = 0; j < h.n; ++j)
    for (int i = 0; i < h.n; ++i)
      y[size_t(j)] += double(x[i]) * h.signs[size_t(i)] * (std::popcount(unsigned(i & j)) % 2 ? -1 : 1);
  for (auto& v : y) v *= double(h.scale());
  return y;
}
}  // namespace

TEST(Hadamard, Te16IsTodaysRht16Bitwise) {
  // n = 16 with the fixed signs is rht16_rows / rht16_rows_bf16, bit for bit, on random and
  // adversarial inputs (random_tensor kinds: wide spreads, subnormals, zeros, ties).
  for (RhtPrecision p : {RhtPrecision::FP32, RhtPrecision::BF16}) {
    const HadamardTransform h = HadamardTransform::make(16, HadamardSigns::Fixed, p, 77, 3, 9);
    EXPECT_TRUE(std::equal(kRhtSigns, kRhtSigns + 16, h.signs.begin())) << "fixed 16 = TE's";
    EXPECT_EQ(h.scale(), 0.25f);
    for (int kind = 0; kind < 6; ++kind) {
      std::mt19937 rng(500 + kind);
      std::vector<float> a = random_tensor(rng, kind, 5 * 64), b = a;
      hadamard_rows(a.data(), 5, 64, h);
      rht16_rows(b.data(), 5, 64, p);
      EXPECT_TRUE(same_bits(a, b)) << "kind " << kind << " " << rht_precision_name(p);
    }
  }
}

TEST(Hadamard, EverySizeMatchesTheNaiveProduct) {
  std::mt19937 rng(41);
  std::normal_distribution<float> nd;
  for (int n : {16, 32, 64, 128}) {
    const HadamardTransform h = HadamardTransform::make(n, HadamardSigns::PerStep,
                                                        RhtPrecision::FP32, 5, 2, 7);
    EXPECT_EQ(double(h.scale()), double(float(1.0 / std::sqrt(double(n))))) << n;
    std::vector<float> x(size_t(3 * 2 * n));
    for (auto& v : x) v = nd(rng);
    std::vector<float> y = x;
    hadamard_rows(y.data(), 3, 2 * n, h);
    for (int64_t c = 0; c < 6; ++c) {  // 6 chunks of n
      const std::vector<double> want = naive_hadamard(x.data() + c * n, h);
      for (int j = 0; j < n; ++j)
        EXPECT_NEAR(y[size_t(c * n + j)], want[size_t(j)], 1e-5 * (1 + std::fabs(want[size_t(j)])))
            << "n " << n << " chunk " << c << " j " << j;
    }
  }
  // The BF16 variant: scale RNE-to-BF16 of 1/√n, inputs and outputs rounded (n = 32, 128 have
  // a scale that BF16 rounds differently from FP32).
  const HadamardTransform b = HadamardTransform::make(128, HadamardSigns::Fixed, RhtPrecision::BF16, 0, 0, 0);
  EXPECT_EQ(b.scale(), round_bf16(float(1.0 / std::sqrt(128.0))));
  EXPECT_NE(b.scale(), float(1.0 / std::sqrt(128.0)));
  // Independent: integer inputs of magnitude < 128 (BF16 values; every FP32 sum exact, and the
  // product of a sum (< 2^14) with the 8-bit c exact in FP32), so each output is the exact
  // value Σ·c rounded once to BF16 by an independent rule.
  std::vector<float> z(2 * 256);
  for (auto& v : z) v = float(int(rng() % 255) - 127);
  const std::vector<float> z0 = z;
  hadamard_rows(z.data(), 2, 256, b);
  for (int64_t c = 0; c < 4; ++c) {
    HadamardTransform unit = b;
    unit.precision = RhtPrecision::FP32;
    const std::vector<double> d = naive_hadamard(z0.data() + c * 128, unit);  // Σ·fl32(c)
    for (int j2 = 0; j2 < 128; ++j2) {
      const double sum = d[size_t(j2)] / double(unit.scale());
      EXPECT_EQ(double(z[size_t(c * 128 + j2)]), bf16_rne_independent(std::nearbyint(sum) * double(b.scale())))
          << "chunk " << c << " j " << j2;
    }
  }
}

TEST(Hadamard, Size128InverseGivesBackTheInput) {
  // The inverse of x ↦ (x ⊙ s)·H·c is y ↦ (y·H·c) ⊙ s (H symmetric, H·H = n·I): the transform
  // with all-plus signs, then the signs. With c = fl(1/√128) (not exact) the round trip is
  // x·(128·c²) up to FP32 rounding: within 2^-20 of max|x| per chunk. For n = 16 and 64 (c exact)
  // and integer inputs of magnitude < 2^10 every sum is exact: the round trip is exact.
  auto round_trip = [](std::vector<float> x, int n, int64_t rows, int64_t cols) {
    const HadamardTransform h = HadamardTransform::make(n, HadamardSigns::PerStep,
                                                        RhtPrecision::FP32, 123, 4, 56);
    HadamardTransform plain = h;
    std::fill(plain.signs.begin(), plain.signs.end(), 1.f);
    hadamard_rows(x.data(), rows, cols, h);
    hadamard_rows(x.data(), rows, cols, plain);
    for (int64_t i = 0; i < rows * cols; ++i) x[size_t(i)] *= h.signs[size_t(i % n)];
    return x;
  };
  std::mt19937 rng(17);
  std::normal_distribution<float> nd;
  std::vector<float> x(4 * 256);
  for (auto& v : x) v = nd(rng);
  const std::vector<float> back = round_trip(x, 128, 4, 256);
  double worst = 0;
  for (int64_t c = 0; c < 8; ++c) {
    double m = 0;
    for (int j = 0; j < 128; ++j) m = std::max(m, double(std::fabs(x[size_t(c * 128 + j)])));
    for (int j = 0; j < 128; ++j)
      worst = std::max(worst, std::fabs(double(back[size_t(c * 128 + j)]) - x[size_t(c * 128 + j)]) / m);
  }
  EXPECT_LT(worst, 0x1p-20);
  EXPECT_GT(worst, 0.0) << "c = fl(1/sqrt(128)) is inexact: the round trip is not the identity";
  std::vector<float> ints(2 * 128);
  for (auto& v : ints) v = float(int(rng() % 2047) - 1023);
  for (int n : {16, 64}) EXPECT_TRUE(same_bits(round_trip(ints, n, 2, 128), ints)) << n;
}

TEST(Hadamard, SignsArePureFunctionsOfSeedLayerStep) {
  float a[128], b[128];
  auto same = [&](int n) { return std::equal(a, a + n, b); };
  // Reproducible, and per-step signs change with the step, the layer and the seed.
  hadamard_signs(128, HadamardSigns::PerStep, 7, 3, 10, a);
  hadamard_signs(128, HadamardSigns::PerStep, 7, 3, 10, b);
  EXPECT_TRUE(same(128));
  hadamard_signs(128, HadamardSigns::PerStep, 7, 3, 11, b);
  EXPECT_FALSE(same(128)) << "step";
  hadamard_signs(128, HadamardSigns::PerStep, 7, 4, 10, b);
  EXPECT_FALSE(same(128)) << "layer";
  hadamard_signs(128, HadamardSigns::PerStep, 8, 3, 10, b);
  EXPECT_FALSE(same(128)) << "seed";
  // Per-layer: the step does not matter, the layer does.
  hadamard_signs(64, HadamardSigns::PerLayer, 7, 3, 1, a);
  hadamard_signs(64, HadamardSigns::PerLayer, 7, 3, 999, b);
  EXPECT_TRUE(same(64));
  hadamard_signs(64, HadamardSigns::PerLayer, 7, 5, 1, b);
  EXPECT_FALSE(same(64));
  // Fixed: nothing of the run matters; n = 16 is TE's vector.
  hadamard_signs(32, HadamardSigns::Fixed, 7, 3, 1, a);
  hadamard_signs(32, HadamardSigns::Fixed, 99, 8, 50, b);
  EXPECT_TRUE(same(32));
  hadamard_signs(16, HadamardSigns::Fixed, 99, 8, 50, b);
  EXPECT_TRUE(std::equal(b, b + 16, kRhtSigns));
  // The stated key, by an independent Philox call: bit i of the 128-bit output, "HD" tag.
  r123::Philox4x32 gen;
  const r123::Philox4x32::ctr_type ctr = {{0u, 10u, 3u, (128u << 16) + 0x4844u}};
  const r123::Philox4x32::key_type key = {{7u, 0u}};
  const auto out = gen(ctr, key);
  hadamard_signs(128, HadamardSigns::PerStep, 7, 3, 10, a);
  for (int i = 0; i < 128; ++i)
    EXPECT_EQ(a[i], (out.v[i / 32] >> (i % 32)) & 1u ? -1.f : 1.f) << i;
  // Never the SR bytes of the same (seed, step, layer): the purpose tags differ.
  uint8_t sr[16];
  sr_bytes(SrKey{7, 10, 3, 0, 0, 0}, 0, 16, sr);
  uint8_t bits[16] = {};
  for (int i = 0; i < 128; ++i) bits[i / 8] |= uint8_t((a[i] < 0) << (i % 8));
  EXPECT_NE(std::memcmp(bits, sr, 16), 0);
  // Balanced: over 200 layers, about half the signs are −1.
  int neg = 0;
  for (uint32_t l = 0; l < 200; ++l) {
    hadamard_signs(128, HadamardSigns::PerLayer, 1, l, 1, a);
    for (float s : a) neg += s < 0;
  }
  EXPECT_NEAR(neg / (200.0 * 128), 0.5, 0.02);
  EXPECT_THROW(hadamard_signs(48, HadamardSigns::Fixed, 0, 0, 0, a), std::invalid_argument);
  EXPECT_EQ(parse_hadamard_signs("per-step"), HadamardSigns::PerStep);
  EXPECT_EQ(std::string(hadamard_signs_name(parse_hadamard_signs("per-layer"))), "per-layer");
  EXPECT_THROW(parse_hadamard_signs("random"), std::invalid_argument);
}

TEST(Hadamard, ThreadCountDoesNotChangeBitsAndShapesAreChecked) {
  std::mt19937 rng(3);
  std::vector<float> x = random_tensor(rng, 0, 512 * 256);
  const HadamardTransform h = HadamardTransform::make(128, HadamardSigns::PerLayer, RhtPrecision::FP32, 1, 2, 3);
  std::vector<float> a = x, b = x;
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  hadamard_rows(a.data(), 512, 256, h);
  omp_set_num_threads(4);
  hadamard_rows(b.data(), 512, 256, h);
  omp_set_num_threads(saved);
  EXPECT_TRUE(same_bits(a, b));
  HadamardTransform bad = h;
  EXPECT_THROW(hadamard_rows(x.data(), 2, 192, h), std::invalid_argument);  // 192 % 128
  bad.n = 48;
  EXPECT_THROW(hadamard_rows(x.data(), 2, 96, bad), std::invalid_argument);
  EXPECT_NO_THROW(hadamard_rows(x.data(), 0, 128, h));
  EXPECT_FALSE(hadamard_size_valid(256));
  EXPECT_TRUE(hadamard_size_valid(32));
}

// ------------------------------------------------------------------------ tensor reference

TEST(TensorReference, SampleAndHoldD50) {
  TensorReference ref(50);
  std::vector<int64_t> refreshed;
  float amax = 1.f;
  for (int64_t t = 1; t <= 120; ++t) {
    amax *= 1.05f;  // tensor grows every step
    int calls = 0;
    const float now = amax;
    const float g = ref.get(t, [&] {
      ++calls;
      return now;
    });
    if (calls) refreshed.push_back(t);
    EXPECT_LE(calls, 1);
    const int64_t t_last = t >= 101 ? 101 : t >= 51 ? 51 : 1;
    EXPECT_EQ(ref.last_refresh(), t_last);
    if (t != t_last) {
      EXPECT_LT(g, now) << "held value must ignore growth at t = " << t;
    }
    // a second call in the same step reuses the value
    EXPECT_EQ(ref.get(t, [&] {
      ++calls;
      return -1.f;
    }),
              g);
    EXPECT_LE(calls, 1);
  }
  EXPECT_EQ(refreshed, (std::vector<int64_t>{1, 51, 101}));
}

TEST(TensorReference, CurrentScalingD1) {
  TensorReference ref(1);
  int calls = 0;
  for (int64_t t = 1; t <= 10; ++t) {
    EXPECT_EQ(ref.get(t, [&] { return float(++calls); }), float(t));
    EXPECT_EQ(ref.get(t, [&] { return float(++calls) * 100; }), float(t));  // same step
  }
  EXPECT_EQ(calls, 10);
  ref.reset();
  EXPECT_FALSE(ref.has_value());
  EXPECT_EQ(ref.get(10, [] { return 5.f; }), 5.f);
  EXPECT_THROW(TensorReference(0), std::invalid_argument);
}
