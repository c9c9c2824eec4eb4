// FP32 → BF16 bit patterns: bf16_bits and the vectorised to_bf16_bits against the scalar
// twin fp4::round_bf16 (format.h), bit for bit, on specials, ties, subnormals and random bits.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "fp4/numerics/bf16.h"
#include "fp4/numerics/format.h"

namespace {
uint16_t twin(float x) { return uint16_t(std::bit_cast<uint32_t>(fp4::round_bf16(x)) >> 16); }

void expect_twin(const std::vector<float>& in) {
  std::vector<uint16_t> out(in.size() + 1, 0xABCD);
  fp4::to_bf16_bits(in.data(), int64_t(in.size()), out.data());
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(out[i], twin(in[i])) << std::hex << "input bits 0x" << std::bit_cast<uint32_t>(in[i]);
    ASSERT_EQ(fp4::bf16_bits(in[i]), twin(in[i]));
  }
  EXPECT_EQ(out[in.size()], 0xABCD) << "wrote past the end";
  // The FP32-valued twins: round_bf16_array (out of place and in place) and
  // add_round_bf16_array (one FP32 addition onto an accumulator of random values) against the
  // scalar fp4::round_bf16, bit for bit (NaN payloads included: the same expression).
  const int64_t n = int64_t(in.size());
  std::vector<float> r(in.size() + 1, 7.f), inplace = in;
  fp4::round_bf16_array(in.data(), n, r.data());
  fp4::round_bf16_array(inplace.data(), n, inplace.data());
  std::mt19937 g(uint32_t(in.size()));
  std::normal_distribution<float> nd;
  std::vector<float> acc(in.size() + 1), want(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    acc[i] = nd(g);
    want[i] = acc[i] + fp4::round_bf16(in[i]);
  }
  acc[in.size()] = 7.f;
  fp4::add_round_bf16_array(in.data(), n, acc.data());
  for (size_t i = 0; i < in.size(); ++i) {
    const uint32_t w = std::bit_cast<uint32_t>(fp4::round_bf16(in[i]));
    ASSERT_EQ(std::bit_cast<uint32_t>(r[i]), w) << std::hex << "round, input 0x" << std::bit_cast<uint32_t>(in[i]);
    ASSERT_EQ(std::bit_cast<uint32_t>(inplace[i]), w) << std::hex << "in place, input 0x" << std::bit_cast<uint32_t>(in[i]);
    const bool both_nan = std::isnan(acc[i]) && std::isnan(want[i]);
    if (!both_nan) {
      ASSERT_EQ(std::bit_cast<uint32_t>(acc[i]), std::bit_cast<uint32_t>(want[i]))
          << std::hex << "add, input 0x" << std::bit_cast<uint32_t>(in[i]);
    }
  }
  EXPECT_EQ(r[in.size()], 7.f) << "round wrote past the end";
  EXPECT_EQ(acc[in.size()], 7.f) << "add wrote past the end";
}

float from_bits(uint32_t b) { return std::bit_cast<float>(b); }

TEST(Bf16Bits, SpecialsTiesAndSubnormals) {
  std::vector<float> v = {0.f, -0.f, 1.f, -1.f, INFINITY, -INFINITY, FLT_MAX, -FLT_MAX,
                          FLT_MIN, -FLT_MIN, from_bits(1), from_bits(0x8000FFFFu),
                          from_bits(0x00008000u), from_bits(0x00018000u),  // subnormal ties
                          from_bits(0x7F7F8000u), from_bits(0x7F7F7FFFu),  // tie to Inf, below
                          1.f + 0x1p-8f, 1.f + 3 * 0x1p-8f, 1.f + 0x1p-8f + 0x1p-20f,
                          from_bits(0x7FC00000u), from_bits(0xFFC00001u),   // quiet NaNs
                          from_bits(0x7F800001u), from_bits(0xFF80FFFFu),   // signalling NaNs
                          from_bits(0x7FBFFFFFu)};
  expect_twin(v);
  // NaN stays NaN (quiet), never rounds to Inf.
  EXPECT_EQ(fp4::bf16_bits(from_bits(0x7F800001u)), 0x7FC0);
  EXPECT_EQ(fp4::bf16_bits(from_bits(0x7F7F8000u)), 0x7F80);  // FLT_MAX-ish tie rounds to Inf
  EXPECT_EQ(fp4::bf16_bits(from_bits(0x00008000u)), 0x0000);  // tie to even (0)
  EXPECT_EQ(fp4::bf16_bits(from_bits(0x00018000u)), 0x0002);  // tie to even (up)
}

TEST(Bf16Bits, EveryLowHalfForSelectedHighHalves) {
  // All 65536 low halves (every rounding case) under high halves covering ±0, subnormals,
  // normals of several exponents, the largest finite, Inf/NaN; odd lengths exercise tails.
  for (uint32_t hi : {0x0000u, 0x0001u, 0x007Fu, 0x0080u, 0x3F80u, 0x3F81u, 0x4B00u, 0x7F7Fu,
                      0x7F80u, 0x7FC0u, 0x8000u, 0x807Fu, 0xBF80u, 0xFF7Fu, 0xFF80u, 0xFFFFu}) {
    std::vector<float> v(65536 + 7);
    for (uint32_t lo = 0; lo < v.size(); ++lo) v[lo] = from_bits((hi << 16) | (lo & 0xFFFFu));
    expect_twin(v);
  }
}

TEST(Bf16Bits, RandomBitsAndThreadCounts) {
  std::mt19937 g(5);
  std::vector<float> v(1 << 20 | 13);  // several threading chunks plus a ragged tail
  for (auto& x : v) x = from_bits(uint32_t(g()));
  expect_twin(v);
  std::vector<uint16_t> a(v.size()), b(v.size());
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  fp4::to_bf16_bits(v.data(), int64_t(v.size()), a.data());
  omp_set_num_threads(3);
  fp4::to_bf16_bits(v.data(), int64_t(v.size()), b.data());
  omp_set_num_threads(saved);
  EXPECT_EQ(a, b);
  for (float x : {0.5f, -3.f}) {  // keep NaNs out: the comparison below is by value
    std::replace_if(v.begin(), v.end(), [](float y) { return std::isnan(y); }, x);
  }
  std::vector<float> r1(v.size()), r3(v.size()), a1(v.size(), 1.f), a3(v.size(), 1.f);
  omp_set_num_threads(1);
  fp4::round_bf16_array(v.data(), int64_t(v.size()), r1.data());
  fp4::add_round_bf16_array(v.data(), int64_t(v.size()), a1.data());
  omp_set_num_threads(3);
  fp4::round_bf16_array(v.data(), int64_t(v.size()), r3.data());
  fp4::add_round_bf16_array(v.data(), int64_t(v.size()), a3.data());
  omp_set_num_threads(saved);
  EXPECT_EQ(0, std::memcmp(r1.data(), r3.data(), r1.size() * 4));
  EXPECT_EQ(0, std::memcmp(a1.data(), a3.data(), a1.size() * 4));
  fp4::to_bf16_bits(v.data(), 0, a.data());  // n = 0: nothing
  EXPECT_EQ(a, b);
}
}  // namespace
