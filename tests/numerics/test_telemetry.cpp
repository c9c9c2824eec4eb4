// Numerics telemetry against hand-computed statistics (docs/numerics.md "Quantizing one operand").
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "fp4/numerics/pack_fast.h"
#include "fp4/numerics/quant_fast.h"
#include "fp4/numerics/telemetry.h"

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

namespace {
// Block histograms (docs/evaluation.md "Numerics telemetry", `scale_hist`), hand-computed from
// the contract (docs/numerics.md).
uint32_t total(const std::array<uint32_t, 256>& h) {
  uint32_t t = 0;
  for (uint32_t v : h) t += v;
  return t;
}

TEST(TelemetryHistograms, HandComputedCodesAndRatios) {
  // UE5M3, T = 448. Block 0: a_b = 40, g = 4: c_b = RNE(40·448/4 = 4480) = 4608 = 1.125·2^12,
  // code (12 + 15)·8 + 1 = 217; a_b/g = 10, floor(log2 10) = 3.
  // Block 1: a_b = 4 = g: c_b = 448 = 1.75·2^8, code 23·8 + 6 = 190; ratio 1, bin 0.
  // Block 2: all zero: stored c_b = 1.0 (the guard), code 15·8 = 120; no ratio (a_b = 0).
  // Block 3: a_b = 1e-30: needed scale 1.1e-28 underflows UE5M3: the guard stores 1.0,
  // code 120; a_b/g = 2.5e-31, floor(log2) = -102, clamped to -96.
  const float x[] = {1, 2, 3, 40, 4, 0, 0, 1, 0, 0, 0, 0, 1e-30f, 0, 0, 0};
  const QuantStats s = quant_stats(x, 1, 16, spec4(), 4.f, nullptr);
  ASSERT_NE(s.scale_format, nullptr);
  EXPECT_STREQ(s.scale_format->name, "ue5m3");
  EXPECT_TRUE(s.ratio_to_g);
  EXPECT_EQ(s.scale_code_blocks[217], 1u);
  EXPECT_EQ(s.scale_code_blocks[190], 1u);
  // Blocks 2 (all zero) and 3 (guarded) store code 120 (1.0) but are counted apart.
  EXPECT_EQ(s.scale_code_blocks[120], 0u);
  EXPECT_EQ(s.zero_blocks, 1u);
  EXPECT_EQ(s.guarded_blocks, 1u);
  EXPECT_EQ(total(s.scale_code_blocks), 2u);
  const int B = QuantStats::kRatioBias;
  EXPECT_EQ(s.log2_amax_ratio_blocks[size_t(B + 3)], 1u);
  EXPECT_EQ(s.log2_amax_ratio_blocks[size_t(B + 0)], 1u);
  EXPECT_EQ(s.log2_amax_ratio_blocks[0], 1u);  // -96, the clamp
  uint32_t n = 0;
  for (uint32_t v : s.log2_amax_ratio_blocks) n += v;
  EXPECT_EQ(n, 3u);  // the all-zero block has no ratio
}

TEST(TelemetryHistograms, Log2BinsAreExactAtPowersOfTwo) {
  const int B = QuantStats::kRatioBias;
  EXPECT_EQ(log2_ratio_bin(1.0), B + 0);
  EXPECT_EQ(log2_ratio_bin(std::nextafter(1.0, 0.0)), B - 1);
  EXPECT_EQ(log2_ratio_bin(2.0), B + 1);
  EXPECT_EQ(log2_ratio_bin(0.75), B - 1);
  EXPECT_EQ(log2_ratio_bin(std::ldexp(1.0, -96)), 0);
  EXPECT_EQ(log2_ratio_bin(std::ldexp(1.0, -200)), 0);
  EXPECT_EQ(log2_ratio_bin(std::ldexp(1.0, 31)), QuantStats::kRatioBins - 1);
  EXPECT_EQ(log2_ratio_bin(1e300), QuantStats::kRatioBins - 1);
}

TEST(TelemetryHistograms, MxRulesMeasureAgainstTheOperandAmax) {
  // OCP MX, UE8M0 scales, no g: the ratio is to max|x| = 40. Block 0 (a_b = 40): bin 0;
  // block 1 (a_b = 5): 5/40 = 0.125, bin -3. Codes are UE8M0 2^(code - 127): every block's
  // scale is a power of two, so both land in codes 0..254 and sum to 2.
  BlockQuantSpec sp = spec4();
  sp.scale_format = ScaleFormat::UE8M0;
  sp.scale_rule = ScaleRule::MxOcp;
  const float x[] = {1, 2, 3, 40, 5, 1, 1, 1};
  const QuantStats s = quant_stats(x, 1, 8, sp, 0.f, nullptr);
  EXPECT_FALSE(s.ratio_to_g);
  const int B = QuantStats::kRatioBias;
  EXPECT_EQ(s.log2_amax_ratio_blocks[size_t(B + 0)], 1u);
  EXPECT_EQ(s.log2_amax_ratio_blocks[size_t(B - 3)], 1u);
  EXPECT_EQ(total(s.scale_code_blocks), 2u);
  // OCP: c_b = 2^(floor(log2 a_b) - emax(E2M1) = 2): 40 → 2^(5-2) = 8 (code 130), 5 → 2^0 (127).
  EXPECT_EQ(s.scale_code_blocks[130], 1u);
  EXPECT_EQ(s.scale_code_blocks[127], 1u);
}

TEST(TelemetryHistograms, WorstOfKeepsTheFirstMicroBatchHistograms) {
  const float a[] = {1, 2, 3, 40}, b[] = {1, 1, 1, 1};
  const QuantStats sa = quant_stats(a, 1, 4, spec4(), 4.f, nullptr);
  const QuantStats sb = quant_stats(b, 1, 4, spec4(), 4.f, nullptr);
  ASSERT_NE(sa.scale_code_blocks, sb.scale_code_blocks);
  const QuantStats w = worst_of(sa, sb);
  EXPECT_EQ(w.scale_code_blocks, sa.scale_code_blocks);
  EXPECT_EQ(w.log2_amax_ratio_blocks, sa.log2_amax_ratio_blocks);
  EXPECT_EQ(w.rel_error, std::max(sa.rel_error, sb.rel_error));  // the scalars: the worst
}
}  // namespace

// quant_stats takes the fused packer (quantize_pack_fast, then unpack) where the spec has one,
// and quantize_blocks otherwise; both must give the same statistics to the last bit. The
// hook that forces the scalar path gives the reference. Specs with a fused packer (1-D and
// 2-D, blocks 8, 16 and 32, the four named scale formats, RNE, RNA and SR8) on ragged shapes
// and adversarial data: all-zero blocks, tiny blocks that hit the zero guard, outliers that
// saturate against a stale reference, subnormals, signed zeros, ties.
TEST(Telemetry, FusedPackerPathGivesTheScalarQuantizersStatistics) {
  struct Case {
    int64_t rows, cols, block;
    bool two_d;
    ScaleFormat sf;
    Rounding rounding;
    float g_scale;  // reference = g_scale · amax (1: current; < 1 stale, saturating)
  };
  const Case cases[] = {{37, 70, 16, false, ScaleFormat::UE5M3, Rounding::RNE, 1.f},
                        {37, 70, 16, true, ScaleFormat::UE5M3, Rounding::SR8, 1.f},
                        {64, 96, 32, false, ScaleFormat::E4M3, Rounding::SR8, 0.01f},
                        {33, 48, 16, true, ScaleFormat::E4M3, Rounding::RNE, 1e6f},
                        {20, 50, 16, false, ScaleFormat::UE8M0, Rounding::RNE, 1.f},
                        {300, 257, 16, false, ScaleFormat::UE5M3, Rounding::SR8, 0.5f},
                        {40, 44, 8, false, ScaleFormat::UE5M3_PTX, Rounding::RNA, 1.f},
                        {35, 37, 16, true, ScaleFormat::UE5M3_PTX, Rounding::RNA, 1e-4f}};
  std::mt19937 gen(7);
  std::normal_distribution<float> nd;
  for (const Case& c : cases) {
    std::vector<float> x(static_cast<size_t>(c.rows * c.cols));
    for (auto& v : x) v = nd(gen);
    auto at = [&](int64_t r, int64_t j) -> float& {
      return x[static_cast<size_t>(r * c.cols + j)];
    };
    for (int64_t j = 0; j < std::min<int64_t>(c.cols, 40); ++j) at(0, j) = 0.0f;  // zero blocks
    at(1, 0) = -0.0f;
    for (int64_t j = 0; j < 16; ++j) at(2, j) = 1e-40f * static_cast<float>(j + 1);  // subnormals
    // an outlier
    at(3, 1) = 5e4f;
    at(4, 0) = 0.25f;  // ties of E2M1 after scaling by a power of two
    at(4, 1) = 0.75f;
    if (c.two_d) {  // an all-zero tile: rows and columns 16..31
      for (int64_t r = 16; r < 32; ++r)
        for (int64_t j = 16; j < 32; ++j) at(r, j) = 0.0f;
    }
    BlockQuantSpec s;
    s.block = static_cast<int>(c.block);
    s.two_d = c.two_d;
    s.scale_format = c.sf;
    s.rounding = c.rounding;
    const std::string what = std::to_string(c.rows) + "x" + std::to_string(c.cols) + " block " +
                             std::to_string(c.block) + (c.two_d ? " 2-D " : " 1-D ") +
                             scale_format_name(c.sf);
    ASSERT_TRUE(pack_fast_slow_path(s).empty()) << what;
    const float g = c.g_scale * tensor_amax(x.data(), c.rows * c.cols);
    const SrKey key{11, 3, 2, 1, 0, 0};
    const SrKey* k = c.rounding == Rounding::SR8 ? &key : nullptr;
    const QuantStats fast = quant_stats(x.data(), c.rows, c.cols, s, g, k);
    QuantStats ref;
    {
      struct ForceSlow {  // the scalar path for this scope, whatever happens in it
        ForceSlow() { quant_fast_force_slow_path(true); }
        ~ForceSlow() { quant_fast_force_slow_path(false); }
      } slow;
      ASSERT_FALSE(pack_fast_slow_path(s).empty()) << what;
      ref = quant_stats(x.data(), c.rows, c.cols, s, g, k);
    }
    auto bits = [](double v) { return std::bit_cast<uint64_t>(v); };
    EXPECT_EQ(bits(fast.saturated_blocks), bits(ref.saturated_blocks)) << what;
    EXPECT_EQ(bits(fast.zero_guard_blocks), bits(ref.zero_guard_blocks)) << what;
    EXPECT_EQ(bits(fast.zeroed_nonzeros), bits(ref.zeroed_nonzeros)) << what;
    EXPECT_EQ(bits(fast.rel_error), bits(ref.rel_error)) << what;
    EXPECT_EQ(bits(fast.staleness), bits(ref.staleness)) << what;
    EXPECT_EQ(fast.has_staleness, ref.has_staleness) << what;
    EXPECT_EQ(fast.scale_code_blocks, ref.scale_code_blocks) << what;
    EXPECT_EQ(fast.zero_blocks, ref.zero_blocks) << what;
    EXPECT_EQ(fast.guarded_blocks, ref.guarded_blocks) << what;
    EXPECT_EQ(fast.log2_amax_ratio_blocks, ref.log2_amax_ratio_blocks) << what;
    EXPECT_EQ(fast.ratio_to_g, ref.ratio_to_g) << what;
    EXPECT_EQ(fast.scale_format, ref.scale_format) << what;
    // The data exercises what it claims to.
    EXPECT_GT(ref.zero_blocks, 0u) << what;
    if (c.g_scale == 1.f && c.sf == ScaleFormat::UE5M3 && !c.two_d) {
      EXPECT_GT(ref.guarded_blocks, 0u) << what;
    }
    if (c.g_scale < 0.1f) {
      EXPECT_GT(ref.saturated_blocks, 0.0) << what;
    }
  }
}
