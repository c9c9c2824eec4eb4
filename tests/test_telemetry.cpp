// Numerics telemetry against hand-computed statistics (docs/numerics.md "Quantizing one operand").
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "fp4/telemetry.h"

using namespace fp4;

namespace {
BlockQuantSpec spec4() {
  BlockQuantSpec s;
  s.block = 4;
  return s;
}

TEST(Telemetry, HandComputedBlockOfFour) {
  // g = 4, T = 448: ge = 672, c_b = RNE_UE5M3(40·112 = 4480) = 4608, d_b = 4608/672 = 48/7.
  // x/d_b = [0.146, 0.292, 0.4375, 5.83] → E2M1 [0, 0.5, 0.5, 6] → x̂ = [0, 24/7, 24/7, 288/7].
  const float x[] = {1, 2, 3, 40};
  const QuantStats s = quant_stats(x, 1, 4, spec4(), 4.f, nullptr);
  const double e0 = 1, e1 = 2 - 24.0 / 7, e2 = 3 - 24.0 / 7, e3 = 40 - 288.0 / 7;
  const double rel = std::sqrt((e0 * e0 + e1 * e1 + e2 * e2 + e3 * e3) / (1 + 4 + 9 + 1600));
  EXPECT_NEAR(s.rel_error, rel, 1e-6);
  EXPECT_DOUBLE_EQ(s.zeroed_nonzeros, 0.25);  // the 1 became 0
  EXPECT_DOUBLE_EQ(s.saturated_blocks, 0.0);
  EXPECT_DOUBLE_EQ(s.zero_guard_blocks, 0.0);
  EXPECT_DOUBLE_EQ(s.staleness, 10.0);  // current amax 40 over the held 4
}

TEST(Telemetry, TinyReferenceSaturatesEveryScale) {
  const float x[] = {1, 2, 3, 40, 5, 6, 7, 8};
  const QuantStats s = quant_stats(x, 1, 8, spec4(), 1e-30f, nullptr);
  EXPECT_DOUBLE_EQ(s.saturated_blocks, 1.0);
  EXPECT_GT(s.staleness, 1e30);
}

TEST(Telemetry, UnderflowingBlockHitsTheZeroGuardButAllZeroBlocksDoNot) {
  // Block 0 tiny against g = 1e10: a_b·(ge/6) ≈ 4.5e-38 rounds to UE5M3 0 → guard → c_b = 1.
  // Block 1 is all zero: its guard is harmless and not counted. Block 2 is ordinary.
  const float x[] = {1e-30f, 0, 0, 0, 0, 0, 0, 0, 1e10f, 1, 1, 1};
  const QuantStats s = quant_stats(x, 1, 12, spec4(), 1e10f, nullptr);
  EXPECT_DOUBLE_EQ(s.zero_guard_blocks, 1.0 / 3);
  EXPECT_DOUBLE_EQ(s.saturated_blocks, 0.0);
  // Nonzeros: 1e-30 and the three 1s (1/(1e10/448) ≪ 0.25) quantize to 0; 1e10 does not.
  EXPECT_DOUBLE_EQ(s.zeroed_nonzeros, 4.0 / 5);
  EXPECT_DOUBLE_EQ(s.staleness, 1.0);
}

TEST(Telemetry, AllZeroTensor) {
  const std::vector<float> x(17, 0.f);
  const QuantStats s = quant_stats(x.data(), 1, 17, BlockQuantSpec{}, 0.f, nullptr);
  EXPECT_EQ(s.rel_error, 0.0);
  EXPECT_EQ(s.zeroed_nonzeros, 0.0);
  EXPECT_EQ(s.zero_guard_blocks, 0.0);
  EXPECT_EQ(s.staleness, 1.0);
}
}  // namespace

namespace {
TEST(Telemetry, ZeroedCountUsesDecodedValuesForAnyElementFormat) {
  // E2M3 code 8 is +1.0, not a zero: nothing here quantizes to zero, and x̂ = x exactly
  // (g = 7.5 = the E2M3 max, T·max/g maps the block onto the grid without rounding error).
  BlockQuantSpec s;
  s.element = parse_element_format("e2m3");
  s.block = 4;
  const float x[] = {7.5f, 1.f, -1.f, 2.f};
  const QuantStats st = quant_stats(x, 1, 4, s, 7.5f, nullptr);
  EXPECT_EQ(st.zeroed_nonzeros, 0.0);
}
}  // namespace

namespace {
TEST(Telemetry, E4M3BlockAtTheTensorAmaxIsNotSaturatedButAStaleOneIs) {
  // E4M3, T = 448, g = 40: the needed scale is a_b·448/40. Block 0 (a_b = 40) needs exactly
  // 448 = E4M3's max: representable, not clipped. Block 1 (a_b = 42 > g, a stale reference)
  // needs 470.4, beyond the midpoint 464 between 448 and the next E4M3 step 480: clipped.
  BlockQuantSpec s = spec4();
  s.scale_format = ScaleFormat::E4M3;
  const float x[] = {1, 2, 3, 40, 1, 1, 1, 42};
  const QuantStats st = quant_stats(x, 1, 8, s, 40.f, nullptr);
  EXPECT_DOUBLE_EQ(st.saturated_blocks, 0.5);
  // The clip threshold is the midpoint 448 + 32/2 = 464 (E4M3's ulp at 448 is 32): a block of
  // amax 41.4 needs 463.68 (rounds to 448, not clipped), one of 41.5 needs 464.8 (clipped).
  // g = 3 (an amax not a power of two) makes the encode scale 448·6/3 inexact in FP32; the
  // amax block must still not count.
  const float y[] = {41.4f, 0, 0, 0, 41.5f, 0, 0, 0};
  EXPECT_DOUBLE_EQ(quant_stats(y, 1, 8, s, 40.f, nullptr).saturated_blocks, 0.5);
  const float z[] = {3, 1, 1, 1, 2.9f, 0, 0, 0};
  EXPECT_DOUBLE_EQ(quant_stats(z, 1, 8, s, 3.f, nullptr).saturated_blocks, 0.0);
}
}  // namespace
