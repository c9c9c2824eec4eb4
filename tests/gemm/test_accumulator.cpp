// The accumulator component (fp4/gemm/accumulator.h; docs/gemm.md "The accumulator",
// docs/numerics.md "GEMM emulation"). Expected values are worked by hand in the comments, or
// come from an independent exact reference written here: BF16 operands as integers times
// powers of two, summed exactly in __int128 and rounded by libgcc's correctly rounded
// __int128 → float conversion (not the component's multi-word sum).
#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include "fp4/gemm/accumulator.h"
#include "fp4/gemm/probe_gemm.h"

using fp4::Accumulator;
using fp4::AccumRounding;

namespace {
const float kUlp1 = std::ldexp(1.0f, -23);  // ulp of 1.0f

Accumulator acc_of(int chunk, AccumRounding r, int snap) {
  Accumulator a;
  a.chunk = chunk;
  a.rounding = r;
  a.snap = snap;
  return a;
}
}  // namespace

// ---- RTZ and RNE additions, by hand ------------------------------------------------------

TEST(AccumulateAdd, PositiveInexactSumTruncatesUnderRtzAndRoundsUpUnderRne) {
  // 1 + 0.75 ulp: RNE rounds to 1 + ulp (0.75 > 0.5), RTZ truncates to 1.
  const float b = 0.75f * kUlp1;
  EXPECT_EQ(fp4::accumulate_add(1.0f, b, AccumRounding::Rtz), 1.0f);
  EXPECT_EQ(fp4::accumulate_add(1.0f, b, AccumRounding::Rne), 1.0f + kUlp1);
}

TEST(AccumulateAdd, NegativeInexactSumTruncatesTowardZero) {
  // −1 − 0.75 ulp: RNE gives −(1 + ulp), RTZ −1 (toward zero, not toward −∞).
  const float b = -0.75f * kUlp1;
  EXPECT_EQ(fp4::accumulate_add(-1.0f, b, AccumRounding::Rtz), -1.0f);
  EXPECT_EQ(fp4::accumulate_add(-1.0f, b, AccumRounding::Rne), -1.0f - kUlp1);
  // 1 − 2^-60 lies just below 1: RTZ gives the FP32 value below 1 (1 − 2^-24), RNE gives 1.
  // (Its double sum rounds to 1, so truncating the double would be wrong: the TwoSum case.)
  const float tiny = std::ldexp(1.0f, -60);
  EXPECT_EQ(fp4::accumulate_add(1.0f, -tiny, AccumRounding::Rtz), 1.0f - std::ldexp(1.0f, -24));
  EXPECT_EQ(fp4::accumulate_add(1.0f, -tiny, AccumRounding::Rne), 1.0f);
  EXPECT_EQ(fp4::accumulate_add(-1.0f, tiny, AccumRounding::Rtz), -(1.0f - std::ldexp(1.0f, -24)));
}

TEST(AccumulateAdd, ExactSumsAreTheSameUnderBothAndZeroIsPositive) {
  for (AccumRounding r : {AccumRounding::Rtz, AccumRounding::Rne}) {
    EXPECT_EQ(fp4::accumulate_add(1.5f, 0.25f, r), 1.75f);
    EXPECT_EQ(fp4::accumulate_add(-3.0f, 1.0f, r), -2.0f);
    EXPECT_EQ(fp4::accumulate_add(1.0f, 0.5f * kUlp1, r) == 1.0f, true);  // tie: even (RNE), trunc (RTZ)
    const float z = fp4::accumulate_add(1.5f, -1.5f, r);
    EXPECT_EQ(z, 0.0f);
    EXPECT_FALSE(std::signbit(z)) << "an exact zero sum is +0 under RNE and RTZ";
  }
  // Overflow of finite operands: RTZ saturates at FLT_MAX, RNE overflows to Inf.
  EXPECT_EQ(fp4::accumulate_add(FLT_MAX, FLT_MAX, AccumRounding::Rtz), FLT_MAX);
  EXPECT_TRUE(std::isinf(fp4::accumulate_add(FLT_MAX, FLT_MAX, AccumRounding::Rne)));
}

// ---- the snap ------------------------------------------------------------------------------

TEST(SnapToGrid, TiesToEvenOnTheGrid) {
  const float g = 1.0f / 1024.0f;
  EXPECT_EQ(fp4::snap_to_grid(1.5f * g, 1024), 2.0f * g);   // 1.5 → 2
  EXPECT_EQ(fp4::snap_to_grid(2.5f * g, 1024), 2.0f * g);   // 2.5 → 2 (even)
  EXPECT_EQ(fp4::snap_to_grid(3.5f * g, 1024), 4.0f * g);   // 3.5 → 4 (even)
  EXPECT_EQ(fp4::snap_to_grid(-2.5f * g, 1024), -2.0f * g);
  EXPECT_EQ(fp4::snap_to_grid(2.4f * g, 1024), 2.0f * g);
  // The same value on coarser and finer grids: 2.5/1024 = 0.625/256 → 1/256; = 10/4096 exactly.
  EXPECT_EQ(fp4::snap_to_grid(2.5f * g, 256), 1.0f / 256.0f);
  EXPECT_EQ(fp4::snap_to_grid(2.5f * g, 4096), 2.5f * g);
  const float neg = fp4::snap_to_grid(-0.3f * g, 1024);  // rounds to −0: the sign is kept
  EXPECT_EQ(neg, 0.0f);
  EXPECT_TRUE(std::signbit(neg));
  // Values with no bits below the grid are unchanged, however large.
  EXPECT_EQ(fp4::snap_to_grid(12345.0f, 1024), 12345.0f);
  EXPECT_EQ(fp4::snap_to_grid(3.0e30f, 4096), 3.0e30f);
  EXPECT_TRUE(std::isinf(fp4::snap_to_grid(INFINITY, 1024)));
}

TEST(SnapToGrid, ZeroMeansNoSnap) {
  std::mt19937 gen(7);
  std::normal_distribution<float> n(0.0f, 1e-3f);
  for (int i = 0; i < 1000; ++i) {
    const float x = n(gen);
    EXPECT_EQ(std::bit_cast<uint32_t>(fp4::snap_to_grid(x, 0)), std::bit_cast<uint32_t>(x));
  }
  // accumulate_partials with d = 0 is the plain accumulation.
  const float p[3] = {1.0f, 0.75f * kUlp1, 1e-7f};
  const float none = fp4::accumulate_partials(p, 3, acc_of(64, AccumRounding::Rtz, 0));
  EXPECT_EQ(none, fp4::accumulate_add(fp4::accumulate_add(fp4::accumulate_add(0.0f, p[0], AccumRounding::Rtz),
                                                          p[1], AccumRounding::Rtz),
                                      p[2], AccumRounding::Rtz));
  EXPECT_EQ(none, 1.0f);  // 1 + 0.75 ulp → 1; + 1e-7 (< ulp 1.19e-7) → 1
}

// ---- partials, chunk sums and chunked dots --------------------------------------------------

TEST(AccumulatePartials, FromPlusZeroInOrderThenSnap) {
  // Partials 0.5, 0.75 ulp(1)... : acc = 0.5 (exact), + 0.5 = 1, + 0.75 ulp → 1 (RTZ) or 1 + ulp
  // (RNE); snap 1/1024 → 1 in both; no snap keeps 1 + ulp under RNE.
  const float p[3] = {0.5f, 0.5f, 0.75f * kUlp1};
  EXPECT_EQ(fp4::accumulate_partials(p, 3, acc_of(64, AccumRounding::Rtz, 1024)), 1.0f);
  EXPECT_EQ(fp4::accumulate_partials(p, 3, acc_of(64, AccumRounding::Rne, 1024)), 1.0f);
  EXPECT_EQ(fp4::accumulate_partials(p, 3, acc_of(64, AccumRounding::Rne, 0)), 1.0f + kUlp1);
  EXPECT_EQ(fp4::accumulate_partials(p, 0, Accumulator{}), 0.0f);
  // Rows: each row is accumulate_partials of its own partials.
  const float rows[2][3] = {{0.5f, 0.5f, 0.75f * kUlp1}, {-1.0f, -0.75f * kUlp1, 0.0f}};
  float out[2];
  fp4::accumulate_partials_rows(&rows[0][0], 2, 3, acc_of(64, AccumRounding::Rne, 0), out);
  EXPECT_EQ(out[0], 1.0f + kUlp1);
  EXPECT_EQ(out[1], -1.0f - kUlp1);
}

TEST(ChunkSum, RoundedOnceNotPerAddition) {
  // 1 + 2^-24 + 2^-24 = 1 + 2^-23 exactly, an FP32 value. Added one by one in FP32 (RNE), each
  // 2^-24 is a tie that rounds to even (1): the sequential sum would be 1.
  const float x[3] = {1.0f, std::ldexp(1.0f, -24), std::ldexp(1.0f, -24)};
  const float w[3] = {1.0f, 1.0f, 1.0f};
  EXPECT_EQ(fp4::chunk_sum_rne(x, w, 3), 1.0f + kUlp1);
  // Exact cancellation gives +0; products of subnormal-range values are exact too.
  const float y[2] = {3.0f, -3.0f};
  EXPECT_EQ(fp4::chunk_sum_rne(y, w, 2), 0.0f);
  EXPECT_FALSE(std::signbit(fp4::chunk_sum_rne(y, w, 2)));
  const float s[1] = {std::ldexp(1.0f, -140)}, t[1] = {std::ldexp(1.0f, -9)};
  EXPECT_EQ(fp4::chunk_sum_rne(s, t, 1), std::ldexp(1.0f, -149));  // 2^-149, the smallest subnormal
  const float u[1] = {std::ldexp(1.0f, -141)};
  EXPECT_EQ(fp4::chunk_sum_rne(u, t, 1), 0.0f);  // 2^-150, half of it: a tie, to even (0)
  const float v[1] = {std::ldexp(3.0f, -142)};
  EXPECT_EQ(fp4::chunk_sum_rne(v, t, 1), std::ldexp(1.0f, -149));  // 0.75 of it: up
}

TEST(ChunkedDot, TheChunkLengthDecidesWhatIsRoundedWhere) {
  // K = 32: x[0] = 1, x[16] = 0.75 ulp(1), the rest 0; w = 1. Chunk 16: partials 1 and 0.75 ulp,
  // their RTZ sum is 1, RNE sum 1 + ulp. Chunk 32: one partial, the exact 1 + 0.75 ulp rounded
  // once (RNE) to 1 + ulp, whatever the rounding of additions. No snap.
  std::vector<float> x(32, 0.0f), w(32, 1.0f);
  x[0] = 1.0f;
  x[16] = 0.75f * kUlp1;
  EXPECT_EQ(fp4::chunked_dot(x.data(), w.data(), 32, acc_of(16, AccumRounding::Rtz, 0)), 1.0f);
  EXPECT_EQ(fp4::chunked_dot(x.data(), w.data(), 32, acc_of(16, AccumRounding::Rne, 0)), 1.0f + kUlp1);
  EXPECT_EQ(fp4::chunked_dot(x.data(), w.data(), 32, acc_of(32, AccumRounding::Rtz, 0)), 1.0f + kUlp1);
  // With the default snap (1/1024) all three are 1.
  EXPECT_EQ(fp4::chunked_dot(x.data(), w.data(), 32, acc_of(32, AccumRounding::Rtz, 1024)), 1.0f);
}

namespace {
/// Independent reference for BF16 operands: each BF16 value is m·2^e with |m| < 2^8, each product
/// (m_a·m_b)·2^(e_a+e_b); a chunk's products are summed exactly in __int128 at the chunk's least
/// exponent, then rounded by the __int128 → float conversion (libgcc: correctly rounded, RNE) and
/// scaled by 2^emin (exact unless the result underflows; the test data stays far above that).
float ref_chunk_bf16(const uint16_t* a, const uint16_t* b, int64_t n) {
  struct P { __int128 m; int e; };
  std::vector<P> ps;
  int emin = INT32_MAX;
  for (int64_t k = 0; k < n; ++k) {
    auto split = [](uint16_t h, int64_t& m, int& e) {
      const int field = (h >> 7) & 0xFF;
      m = field ? (h & 0x7F) | 0x80 : (h & 0x7F);
      e = (field ? field : 1) - 127 - 7;
      if (h & 0x8000) m = -m;
    };
    int64_t ma, mb;
    int ea, eb;
    split(a[k], ma, ea);
    split(b[k], mb, eb);
    if (ma == 0 || mb == 0) continue;
    ps.push_back({static_cast<__int128>(ma * mb), ea + eb});
    emin = std::min(emin, ea + eb);
  }
  if (ps.empty()) return 0.0f;
  __int128 s = 0;
  for (const P& p : ps) {
    EXPECT_LT(p.e - emin, 100) << "reference range exceeded";
    s += p.m << (p.e - emin);
  }
  return std::ldexp(static_cast<float>(s), emin);
}
uint16_t to_bf16(float f) {  // RNE
  const uint32_t u = std::bit_cast<uint32_t>(f);
  return static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}
float bf16_f(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }
}  // namespace

TEST(ChunkedDot, MatchesAnIndependentExactReferenceOnRandomBf16) {
  std::mt19937 gen(2024);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::student_t_distribution<float> td(3.0f);
  const int64_t rows = 64, K = 333;  // not a multiple of any chunk
  std::vector<uint16_t> x(rows * K), w(rows * K);
  for (int64_t i = 0; i < rows * K; ++i) {
    x[i] = to_bf16(i % 3 == 0 ? td(gen) : nd(gen));
    w[i] = to_bf16(0.25f * nd(gen) + (i % 7 == 0 ? 0.0f : 0.5f * nd(gen)));
  }
  for (int chunk : {16, 32, 64, 128})
    for (AccumRounding r : {AccumRounding::Rtz, AccumRounding::Rne})
      for (int snap : {0, 256, 1024, 4096}) {
        const Accumulator a = acc_of(chunk, r, snap);
        std::vector<float> got(rows);
        fp4::chunked_dot_rows_bf16(x.data(), w.data(), rows, K, a, got.data());
        for (int64_t i = 0; i < rows; ++i) {
          std::vector<float> partials;
          for (int64_t k0 = 0; k0 < K; k0 += chunk)
            partials.push_back(ref_chunk_bf16(&x[i * K + k0], &w[i * K + k0], std::min<int64_t>(chunk, K - k0)));
          // Accumulation by hand: RNE is the FP32 '+'; RTZ steps the RNE sum s one ulp toward
          // zero when Knuth's FP32 TwoSum error e (acc + p = s + e exactly) points toward zero.
          float acc = 0.0f;
          for (float p : partials) {
            volatile float s = acc + p;
            volatile float bv = s - acc;
            const float e = (acc - (s - bv)) + (p - bv);
            float t = s;
            if (r == AccumRounding::Rtz && e != 0.0f && ((e < 0.0f) != (t < 0.0f)))
              t = std::nextafter(t, 0.0f);
            acc = t;
          }
          const float want = snap ? static_cast<float>(std::nearbyint(static_cast<double>(acc) * snap) / snap) : acc;
          ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want))
              << a.describe() << ", row " << i;
          // The FP32 path on the widened values gives the same bits.
          std::vector<float> xf(K), wf(K);
          for (int64_t k = 0; k < K; ++k) xf[k] = bf16_f(x[i * K + k]), wf[k] = bf16_f(w[i * K + k]);
          ASSERT_EQ(std::bit_cast<uint32_t>(fp4::chunked_dot(xf.data(), wf.data(), K, a)),
                    std::bit_cast<uint32_t>(want));
        }
      }
}

TEST(ChunkedDot, BadInputIsNamed) {
  const float x[2] = {1.0f, NAN}, w[2] = {1.0f, 1.0f};
  try {
    (void)fp4::chunked_dot(x, w, 2, Accumulator{});
    FAIL() << "NaN accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("operand x element 1 is not finite"), std::string::npos) << e.what();
  }
  float out[1];
  EXPECT_THROW(fp4::chunked_dot_rows(x, w, 1, 2, Accumulator{}, out), std::invalid_argument);
  EXPECT_THROW(fp4::chunked_dot(w, w, -1, Accumulator{}), std::invalid_argument);
  for (int bad_chunk : {0, 8, 48, 256}) {
    try {
      acc_of(bad_chunk, AccumRounding::Rtz, 1024).check();
      FAIL() << "chunk " << bad_chunk << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("accumulator chunk"), std::string::npos) << e.what();
    }
  }
  for (int bad_snap : {-1, 3, 1000, 131072}) {
    try {
      acc_of(64, AccumRounding::Rtz, bad_snap).check();
      FAIL() << "snap " << bad_snap << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("accumulator snap"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(fp4::parse_accum_rounding("rn"), std::invalid_argument);
  EXPECT_EQ(fp4::parse_accum_rounding("rtz"), AccumRounding::Rtz);
  EXPECT_EQ(fp4::parse_accum_rounding("rne"), AccumRounding::Rne);
  EXPECT_EQ(Accumulator{}.describe(), "chunk 64, rtz, snap 1/1024");
  EXPECT_TRUE(Accumulator{}.is_default());
}
