// llama.cpp's Q8_0 activation quantization (fp4/numerics/q8_0.h): binary16 rounding worked by
// hand and against F16C's conversion where the CPU has it, and Q8_0 blocks worked by hand from
// ggml-cpu's x86 quantize_row_q8_0.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <immintrin.h>

#include "fp4/numerics/q8_0.h"

namespace {

TEST(RoundFp16, HandCases) {
  EXPECT_EQ(fp4::round_fp16(1.0f), 1.0f);
  EXPECT_EQ(fp4::round_fp16(1.0f + 0x1p-11f), 1.0f);                // tie: to even (1.0)
  EXPECT_EQ(fp4::round_fp16(1.0f + 3 * 0x1p-11f), 1.0f + 0x1p-9f);  // tie: to even (…10)
  EXPECT_EQ(fp4::round_fp16(1.0f + 0x1p-11f + 0x1p-20f), 1.0f + 0x1p-10f);
  EXPECT_EQ(fp4::round_fp16(-1.0f / 127), -0.00787353515625f);  // 1032·2^-17
  EXPECT_EQ(fp4::round_fp16(65504.0f), 65504.0f);
  EXPECT_EQ(fp4::round_fp16(65519.0f), 65504.0f);
  EXPECT_EQ(fp4::round_fp16(65520.0f), INFINITY);  // the midpoint to 2^16: to even, Inf
  EXPECT_EQ(fp4::round_fp16(-1e9f), -INFINITY);
  EXPECT_EQ(fp4::round_fp16(0x1p-24f), 0x1p-24f);      // smallest subnormal
  EXPECT_EQ(fp4::round_fp16(0x1p-25f), 0.0f);          // half of it: to even, 0
  EXPECT_EQ(fp4::round_fp16(3 * 0x1p-26f), 0x1p-24f);  // 0.75 of it: up
  EXPECT_EQ(fp4::round_fp16(0x1p-14f + 0x1p-25f),
            0x1p-14f);  // subnormal step 2^-24 above 2^-14 too
  EXPECT_TRUE(std::isnan(fp4::round_fp16(NAN)));
}

// F16C's vcvtps2ph (rounding mode 0, RNE) then vcvtph2ps: what ggml's FP32 → FP16 is on x86.
__attribute__((target("f16c"))) float f16c_round(float x) { return _cvtsh_ss(_cvtss_sh(x, 0)); }

TEST(RoundFp16, TwinOfF16c) {
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "no F16C on this CPU";
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> bits;
  int checked = 0;
  for (int i = 0; i < 1000000; ++i) {
    // Random bit patterns over the whole FP32 range, and values near binary16's range.
    float x = std::bit_cast<float>(bits(rng));
    if (i % 2) x = std::ldexp(float(bits(rng) % 4096) / 4096.0f + 0.5f, int(bits(rng) % 46) - 28);
    if (std::isnan(x)) continue;
    ASSERT_EQ(std::bit_cast<uint32_t>(fp4::round_fp16(x)), std::bit_cast<uint32_t>(f16c_round(x)))
        << "x = " << x;
    ++checked;
  }
  EXPECT_GT(checked, 900000);
}

TEST(Q80, HandBlocks) {
  // Row 0: amax 127, so d = 1 and id = 1: q = x rounded half to even.
  // Row 1: amax 1: d = fp16(1/127) = 1032·2^-17, id = 127; 0.5·127 = 63.5 → 64 (even).
  // Row 2: all zeros (amax 0: id = 0, d = 0).
  std::vector<float> x(3 * 32, 0.0f), want(3 * 32, 0.0f);
  const float r0[] = {127, -63.5f, 0.5f, 1.5f, 2.5f, -0.49f};
  const float w0[] = {127, -64, 0, 2, 2, -0.0f};
  for (int j = 0; j < 6; ++j) x[j] = r0[j], want[j] = w0[j];
  const float d = 0.00787353515625f;
  const float r1[] = {1.0f, 0.5f, -0.25f, 1.0f / 127};
  const float q1[] = {127, 64, -32, 1};  // 0.25·127 = 31.75 → 32
  for (int j = 0; j < 4; ++j) x[32 + j] = r1[j], want[32 + j] = q1[j] * d;
  std::vector<float> out(x.size(), -7.0f);
  fp4::q8_0_quantize_dequantize(x.data(), 3, 32, out.data());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(out[i], want[i]) << "element " << i;
  EXPECT_EQ(out[33], 0.50390625f);
  EXPECT_EQ(out[32], 0.99993896484375f);
}

TEST(Q80, AliasesAndRefusals) {
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i) x[i] = std::sin(float(i)) * 3;
  std::vector<float> out(64);
  fp4::q8_0_quantize_dequantize(x.data(), 1, 64, out.data());
  fp4::q8_0_quantize_dequantize(x.data(), 1, 64, x.data());  // in place
  EXPECT_EQ(x, out);
  for (int i = 0; i < 64; ++i) EXPECT_LE(std::fabs(out[i]), 3.0f * 1.001f);
  EXPECT_THROW(fp4::q8_0_quantize_dequantize(x.data(), 1, 48, out.data()), std::invalid_argument);
  EXPECT_THROW(fp4::q8_0_quantize_dequantize(x.data(), -1, 32, out.data()), std::invalid_argument);
  x[5] = INFINITY;
  EXPECT_THROW(fp4::q8_0_quantize_dequantize(x.data(), 1, 64, out.data()), std::invalid_argument);
}

}  // namespace
