// The per-row tensor reference (row-scaled operand; docs/numerics.md "Tensor reference g",
// "Per-row reference"): the scalar functions by hand and against the per-tensor quantizer, the
// SIMD twins (row_amax_fast, quantize_dequantize_rows_fast, the row-scaled quantize-transpose)
// bit for bit on every SIMD target, and an independent transcription of Transformer Engine's
// published row-scaled NVFP4 algorithm.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "fp4/base/error.h"
#include "fp4/numerics/block_quant.h"
#include "fp4/numerics/format.h"
#include "fp4/numerics/hadamard.h"
#include "fp4/numerics/quant_fast.h"
#include "support/quant_test_inputs.h"

using namespace fp4;
using namespace fp4::testing;

namespace {

BlockQuantSpec nvfp4_spec(Rounding r = Rounding::RNE, int block = 16) {
  return make_spec(ScaleFormat::E4M3, r, block);
}

std::vector<float> row_amaxes(const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<float> g(static_cast<size_t>(rows));
  row_amax(x.data(), rows, cols, g.data());
  return g;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b, std::string* where) {
  if (a.size() != b.size()) return *where = "sizes differ", false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) {
      *where = "element " + std::to_string(i) + ": " + std::to_string(a[i]) + " vs " +
               std::to_string(b[i]);
      return false;
    }
  }
  return true;
}

#define EXPECT_SAME_BITS(a, b, what)               \
  do {                                             \
    std::string w_;                                \
    EXPECT_TRUE(same_bits(a, b, &w_)) << what << ": " << w_; \
  } while (0)

/// Runs fn once per SIMD target supported here, then restores the best one.
template <class F>
void each_target(F&& fn) {
  for (const std::string& t : quant_fast_targets()) {
    quant_fast_use_target(t);
    SCOPED_TRACE("SIMD target " + t);
    fn();
  }
  quant_fast_use_target("");
}

/// Rows that stress a per-row reference: zero rows (and −0), one huge value among small ones,
/// subnormal rows, a row at FLT_MAX, rows of one repeated value, alternating magnitudes.
std::vector<float> adversarial_rows(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x.data() + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      const float v = nd(rng);
      switch (r % 9) {
        case 0: row[c] = 0.f; break;
        case 1: row[c] = c % 2 ? -0.f : 0.f; break;
        case 2: row[c] = c == cols / 2 ? 3e38f : v * 1e-3f; break;
        case 3: row[c] = v * 1e-41f; break;  // subnormal
        case 4: row[c] = c == 0 ? FLT_MAX : v; break;
        case 5: row[c] = 0.75f; break;        // one repeated value: every block at amax
        case 6: row[c] = c % 2 ? v * 1e30f : v * 1e-30f; break;
        case 7: row[c] = std::numeric_limits<float>::denorm_min() * float(c % 5); break;
        default: row[c] = v; break;
      }
    }
  }
  return x;
}

/// Rows whose block amaxes sweep 128 FP32 ulps across a midpoint of the 3-bit-mantissa scale
/// grid (UE5M3, E4M3) under the row's multiplier: where fl(a_b·fl(ge_r·fl(1/6))) and a
/// reassociated fl(fl(a_b·ge_r)/6) round to different scales (docs/numerics.md "Quantizing one
/// operand": the order is part of the contract). x [rows, 128·16], one block amax per block;
/// g [rows] the rows' references (random in [0.5, 50], above every block amax).
std::vector<float> midpoint_rows(int64_t rows, uint32_t seed, std::vector<float>& g) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> ug(0.5f, 50.f);
  const int64_t cols = 128 * 16;
  std::vector<float> x(static_cast<size_t>(rows * cols), 0.f);
  g.assign(static_cast<size_t>(rows), 0.f);
  for (int64_t r = 0; r < rows; ++r) {
    g[r] = ug(rng);
    const float ge = 448.f * 6.f / g[r];
    const int k = -int(rng() % 6);  // scales 2^-5 .. 1.9: every block amax stays below g
    const double mid = std::ldexp(1.0 + (2 * (rng() % 8) + 1) / 16.0, k);
    float a = static_cast<float>(mid / (static_cast<double>(ge) / 6.0));
    for (int i = 0; i < 64; ++i) a = std::nextafter(a, 0.f);
    for (int64_t b = 0; b < 128; ++b, a = std::nextafter(a, INFINITY)) {
      x[r * cols + 16 * b] = b % 2 ? -a : a;
      x[r * cols + 16 * b + 1 + b % 15] = a * 0.37f;
    }
  }
  return x;
}

TEST(RowScaled, HandComputedSmallRowKeepsItsResolution) {
  // Two rows of 16, NVFP4 (E4M3 scales, T = 448). Row 0 holds 2688 = T·6 (and zeros); row 1
  // holds u·{0, .5, 1, 1.5, 2, 3, 4, 6} with u = 448·2^-20, so g_1 = 6u = 2688·2^-20.
  const float u = 448.f * std::ldexp(1.f, -20);
  const float grid[8] = {0, .5f, 1, 1.5f, 2, 3, 4, 6};
  std::vector<float> x(32, 0.f);
  x[0] = 2688.f;
  for (int c = 0; c < 8; ++c) x[16 + c] = -u * grid[c];  // negative: codes 8..15
  const BlockQuantSpec s = nvfp4_spec();
  const std::vector<float> g = row_amaxes(x, 2, 16);
  ASSERT_EQ(g[0], 2688.f);
  ASSERT_EQ(g[1], 6.f * u);

  // Per row: ge_1 = 2688/g_1 = 2^20 exactly, gd_1 = 2^-20, mult_1 = 2^20·fl(1/6);
  // c_b = g_1·mult_1 = fl(2688·fl(1/6)) rounds to 448 (E4M3 0x7E), d_b = 448·2^-20 = u,
  // e_b = fl(1/u), x·e_b lands on each grid point: codes 8 + c (−0 for c = 0: 8).
  const QuantizedTensor q = quantize_blocks_rows(x.data(), 2, 16, s, g.data(), nullptr);
  ASSERT_EQ(q.row_ge.size(), 2u);
  EXPECT_EQ(q.row_ge[0], 1.f);
  EXPECT_EQ(q.row_ge[1], std::ldexp(1.f, 20));
  EXPECT_EQ(q.row_gd[1], std::ldexp(1.f, -20));
  EXPECT_EQ(q.scales[0], 448.f);
  EXPECT_EQ(q.scales[1], 448.f);
  EXPECT_EQ(q.scale_codes[1], 0x7E);
  EXPECT_EQ(q.codes[0], 7);  // 2688·(1/448) = 6
  for (int c = 0; c < 8; ++c) EXPECT_EQ(q.codes[16 + c], 8 + c) << "row 1 col " << c;
  std::vector<float> xh(32);
  dequantize(q, xh.data());
  for (int i = 0; i < 32; ++i) EXPECT_EQ(xh[i], x[i]) << i;  // exact: every value on the grid

  // Per tensor (g = 2688, ge = 1): row 1's block scale g_1·fl(1/6) ≈ 4.3e-4 is below half the
  // smallest E4M3 subnormal (2^-10), rounds to 0, takes the guard scale 1, and every element
  // of row 1 rounds to (−)0: the small row loses all its resolution.
  const QuantizedTensor t = quantize_blocks(x.data(), 2, 16, s, 2688.f, nullptr);
  EXPECT_EQ(t.scales[1], 1.f);
  for (int c = 0; c < 8; ++c) EXPECT_EQ(t.codes[16 + c], 8) << "row 1 col " << c;
  // Row 0 is the same either way (its own amax is the tensor's).
  for (int c = 0; c < 16; ++c) EXPECT_EQ(t.codes[c], q.codes[c]);

  // The fused function equals dequantize(quantize_blocks_rows(...)).
  std::vector<float> fused(32);
  quantize_dequantize_rows(x.data(), 2, 16, s, g.data(), nullptr, fused.data());
  EXPECT_SAME_BITS(fused, xh, "fused");
}

TEST(RowScaled, EqualsPerTensorWhenEveryRowHasTheSameReference) {
  const int64_t rows = 37, cols = 77;
  for (Dist d : kDists)
    for (ScaleFormat f : kFormats)
      for (Rounding r : kRoundings) {
        const auto x = make_data(d, size_t(rows * cols), 11);
        const BlockQuantSpec s = make_spec(f, r, 16);
        const float g = tensor_amax(x.data(), rows * cols);
        const std::vector<float> gs(size_t(rows), g);
        std::vector<float> a(x.size()), b(x.size());
        quantize_dequantize(x.data(), rows, cols, s, g, &kKey, a.data());
        quantize_dequantize_rows(x.data(), rows, cols, s, gs.data(), &kKey, b.data());
        EXPECT_SAME_BITS(a, b, spec_str(s));
      }
}

TEST(RowScaled, EachRowIsItsOwnPerTensorCall) {
  // Row r of the per-row call equals quantizing row r alone with g = g_r (RNE: SR bytes are
  // keyed by the flat index, which a one-row call restarts); codes and scales likewise.
  const int64_t rows = 23, cols = 50;
  auto x = adversarial_rows(rows, cols, 5);
  for (ScaleFormat f : kFormats)
    for (int block : {16, 32, 7}) {
      const BlockQuantSpec s = make_spec(f, Rounding::RNE, block);
      const auto g = row_amaxes(x, rows, cols);
      const QuantizedTensor q = quantize_blocks_rows(x.data(), rows, cols, s, g.data(), nullptr);
      for (int64_t r = 0; r < rows; ++r) {
        const QuantizedTensor one = quantize_blocks(x.data() + r * cols, 1, cols, s, g[r], nullptr);
        EXPECT_EQ(q.row_ge[r], one.ge);
        EXPECT_EQ(q.row_gd[r], one.gd);
        for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(q.codes[r * cols + c], one.codes[c]) << r;
        for (int64_t b = 0; b < q.block_cols; ++b)
          ASSERT_EQ(q.scales[r * q.block_cols + b], one.scales[b]) << r;
      }
      std::vector<float> a(x.size()), b(x.size());
      dequantize(q, a.data());
      quantize_dequantize_rows(x.data(), rows, cols, s, g.data(), nullptr, b.data());
      EXPECT_SAME_BITS(a, b, "two-step vs fused " << spec_str(s));
    }
}

TEST(RowScaled, Errors) {
  const std::vector<float> x(32, 1.f);
  const std::vector<float> g{1.f, 1.f};
  float out[32];
  BlockQuantSpec tiles = nvfp4_spec();
  tiles.two_d = true;
  EXPECT_THROW(quantize_dequantize_rows(x.data(), 2, 16, tiles, g.data(), nullptr, out),
               std::invalid_argument);
  BlockQuantSpec mx = make_spec(ScaleFormat::UE8M0, Rounding::RNE, 32);
  mx.scale_rule = ScaleRule::MxTe;
  EXPECT_THROW(quantize_blocks_rows(x.data(), 2, 16, mx, g.data(), nullptr), std::invalid_argument);
  for (float bad : {-1.f, INFINITY, NAN}) {
    const std::vector<float> gb{1.f, bad};
    try {
      quantize_dequantize_rows_fast(x.data(), 2, 16, nvfp4_spec(), gb.data(), nullptr, out);
      ADD_FAILURE() << "no throw for g_1 = " << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("row 1"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(quantize_dequantize_rows(x.data(), 2, 16, nvfp4_spec(Rounding::SR8), g.data(),
                                        nullptr, out),
               std::invalid_argument);
  std::vector<float> xn = x;
  xn[20] = NAN;
  EXPECT_THROW(quantize_dequantize_rows(xn.data(), 2, 16, nvfp4_spec(), g.data(), nullptr, out),
               NonFiniteError);
  EXPECT_THROW(quantize_dequantize_rows_fast(xn.data(), 2, 16, nvfp4_spec(), g.data(), nullptr, out),
               NonFiniteError);
  float ga[2];
  EXPECT_THROW(row_amax(xn.data(), 2, 16, ga), NonFiniteError);
  EXPECT_THROW(row_amax_fast(xn.data(), 2, 16, ga), NonFiniteError);
  EXPECT_THROW(row_amax_fast(x.data(), -1, 16, ga), std::invalid_argument);
}

TEST(RowScaledFast, RowAmaxMatchesScalar) {
  each_target([&] {
    for (int64_t cols : {1, 7, 16, 17, 64, 1000, 4099}) {
      const int64_t rows = 29;
      for (const auto& x : {make_data(Dist::Cauchy, size_t(rows * cols), uint64_t(cols)),
                            adversarial_rows(rows, cols, uint32_t(cols))}) {
        std::vector<float> want(rows), got(rows);
        row_amax(x.data(), rows, cols, want.data());
        row_amax_fast(x.data(), rows, cols, got.data());
        EXPECT_SAME_BITS(got, want, "cols " << cols);
        for (int64_t r = 0; r < rows; ++r)
          EXPECT_EQ(want[r], tensor_amax(x.data() + r * cols, cols)) << r;
      }
    }
  });
}

TEST(RowScaledFast, RandomBitExact) {
  // Every target × scale format × rounding × distribution, with the current row amaxes and
  // with references scaled too small (saturating block scales) or too large.
  const int64_t rows = 67, cols = 1040;
  each_target([&] {
    int k = 0;
    for (Dist d : kDists)
      for (ScaleFormat f : kFormats)
        for (Rounding r : kRoundings) {
          const auto x = make_data(d, size_t(rows * cols), 100 + k);
          const BlockQuantSpec s = make_spec(f, r, k % 3 == 2 ? 32 : 16);
          auto g = row_amaxes(x, rows, cols);
          const float mul[] = {1.f, 1e-3f, 1e3f};
          for (float& v : g) v = std::min(v * mul[k % 3], FLT_MAX);
          std::vector<float> want(x.size()), got(x.size());
          quantize_dequantize_rows(x.data(), rows, cols, s, g.data(), &kKey, want.data());
          quantize_dequantize_rows_fast(x.data(), rows, cols, s, g.data(), &kKey, got.data());
          EXPECT_SAME_BITS(got, want, spec_str(s) << " dist " << int(d));
          ++k;
        }
  });
}

TEST(RowScaledFast, AdversarialRowsBitExact) {
  each_target([&] {
    for (int64_t cols : {1, 15, 16, 17, 33, 48, 100})
      for (int block : {16, 32, 8, 7, 1})
        for (ScaleFormat f : kFormats)
          for (Rounding r : kRoundings) {
            const int64_t rows = 27;
            const auto x = adversarial_rows(rows, cols, uint32_t(cols * 31 + block));
            const BlockQuantSpec s = make_spec(f, r, block);
            auto g = row_amaxes(x, rows, cols);
            g[5] = std::numeric_limits<float>::denorm_min();  // tiny references
            g[6] = FLT_MAX;
            g[7] = 0.f;  // a zero reference over nonzero (subnormal) values
            std::vector<float> want(x.size()), got(x.size());
            quantize_dequantize_rows(x.data(), rows, cols, s, g.data(), &kKey, want.data());
            quantize_dequantize_rows_fast(x.data(), rows, cols, s, g.data(), &kKey, got.data());
            EXPECT_SAME_BITS(got, want, spec_str(s) << " cols " << cols);
            // in place (out aliases x)
            std::vector<float> inplace = x;
            quantize_dequantize_rows_fast(inplace.data(), rows, cols, s, g.data(), &kKey,
                                          inplace.data());
            EXPECT_SAME_BITS(inplace, want, "in place " << spec_str(s));
          }
  });
}

TEST(RowScaledFast, OperationOrderAtScaleMidpointsBitExact) {
  // Block amaxes at scale-grid midpoints under each row's multiplier: a kernel that computed
  // mult_r or c_b in another order would round some of these blocks to the neighbouring scale.
  std::vector<float> g;
  const auto x = midpoint_rows(64, 17, g);
  const int64_t rows = 64, cols = 128 * 16;
  each_target([&] {
    for (ScaleFormat f : {ScaleFormat::UE5M3, ScaleFormat::UE5M3_PTX, ScaleFormat::E4M3})
      for (Rounding r : kRoundings) {
        const BlockQuantSpec s = make_spec(f, r, 16);
        std::vector<float> want(x.size()), got(x.size());
        quantize_dequantize_rows(x.data(), rows, cols, s, g.data(), &kKey, want.data());
        quantize_dequantize_rows_fast(x.data(), rows, cols, s, g.data(), &kKey, got.data());
        EXPECT_SAME_BITS(got, want, spec_str(s));
      }
  });
}

TEST(RowScaledFast, TransposedIsTheComposition) {
  // Xᵀ per row (one reference per column of x, after the RHT if any) = transpose, RHT,
  // row_amax, quantize_dequantize_rows of the scalar functions.
  const int64_t rows = 64, cols = 40;
  each_target([&] {
    for (bool rht : {false, true})
      for (RhtPrecision prec : {RhtPrecision::FP32, RhtPrecision::BF16})
        for (Rounding r : kRoundings) {
          auto x = adversarial_rows(rows, cols, 3);
          for (float& v : x)  // keep the RHT finite (its sums of ±FLT_MAX overflow)
            if (std::fabs(v) > 1e30f) v = std::copysign(1e30f, v);
          const BlockQuantSpec s = make_spec(ScaleFormat::E4M3, r, 16);
          std::vector<float> t(x.size());
          for (int64_t i = 0; i < rows; ++i)
            for (int64_t c = 0; c < cols; ++c) t[c * rows + i] = x[i * cols + c];
          if (rht) rht16_rows(t.data(), cols, rows, prec);
          const auto g = row_amaxes(t, cols, rows);
          std::vector<float> want(t.size()), got(t.size()), gg(cols);
          quantize_dequantize_rows(t.data(), cols, rows, s, g.data(), &kKey, want.data());
          quantize_dequantize_rows_transposed_fast(x.data(), rows, cols, s, &kKey, rht, prec,
                                                   gg.data(), got.data());
          EXPECT_SAME_BITS(got, want, "rht " << rht << " " << spec_str(s));
          EXPECT_SAME_BITS(gg, g, "row references");
        }
  });
  EXPECT_NE(quant_fast_slow_path_row_scaled(nvfp4_spec(), true, false), "");
  EXPECT_EQ(quant_fast_slow_path_row_scaled(nvfp4_spec(), false, false), "");
}

// ---------------------------------------------------------------- Transformer Engine
// An independent transcription of Transformer Engine's published row-scaled NVFP4 quantizer
// (NVFP4BlockScaling(row_scaled_activation=True): one FP32 amax per row of the forward
// activation; its reference quantizer's steps, written here from the algorithm): per row r
//   amax_r = max |x_r|;  S_enc = min((448·6)/amax_r, FLT_MAX) (0 → 1);  S_dec = 1/S_enc
//   per 1×16 block: s = min(vec_max · (S_enc · fl(1/6)), FLT_MAX), clamped to 448, cast to
//   E4M3 (round to nearest, ties to even);  enc = min(1/(s · S_dec), FLT_MAX)
//   q = E2M1 code of clamp(x · enc, ±6), ties to even: |v| ≤ .25 → 0, < .75 → .5, ≤ 1.25 → 1,
//   < 1.75 → 1.5, ≤ 2.5 → 2, < 3.5 → 3, ≤ 5 → 4, else 6.

/// RNE onto E4M3 by search over its 126 positive finite values (ties to the even code).
float te_e4m3(float v) {
  float best = 0.f;
  int best_code = 0;
  for (int code = 1; code <= 0x7E; ++code) {
    const int e = code >> 3, m = code & 7;
    const float val = e == 0 ? std::ldexp(float(m), -9) : std::ldexp(1.f + m / 8.f, e - 7);
    const double dn = std::fabs(double(val) - v), db = std::fabs(double(best) - v);
    if (dn < db || (dn == db && (code % 2 == 0) && (best_code % 2 == 1))) best = val, best_code = code;
  }
  return best;
}

/// E2M1 magnitude of TE's threshold table.
float te_e2m1(float a) {
  if (a <= 0.25f) return 0.f;
  if (a < 0.75f) return 0.5f;
  if (a <= 1.25f) return 1.f;
  if (a < 1.75f) return 1.5f;
  if (a <= 2.5f) return 2.f;
  if (a < 3.5f) return 3.f;
  if (a <= 5.f) return 4.f;
  return 6.f;
}

struct TeRowScaled {
  std::vector<float> amax, s_enc, block_scale, value;  // value: signed E2M1 value per element
  std::vector<bool> enc_clamped;  // per block: 1/(s·S_dec) overflowed and was clamped to FLT_MAX
};

TeRowScaled te_row_scaled(const std::vector<float>& x, int64_t rows, int64_t cols) {
  TeRowScaled t;
  const int64_t nb = (cols + 15) / 16;
  t.value.resize(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x.data() + r * cols;
    float amax = 0.f;
    for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(xr[c]));
    float enc = std::min(448.f * 6.f / amax, FLT_MAX);
    if (enc == 0.f) enc = 1.f;
    const float dec = 1.f / enc;
    t.amax.push_back(amax);
    t.s_enc.push_back(enc);
    const float mult = enc * (1.f / 6.f);
    for (int64_t b = 0; b < nb; ++b) {
      float vmax = 0.f;
      const int64_t c1 = std::min(cols, 16 * b + 16);
      for (int64_t c = 16 * b; c < c1; ++c) vmax = std::max(vmax, std::fabs(xr[c]));
      const float s = te_e4m3(std::min(std::min(vmax * mult, FLT_MAX), 448.f));
      t.block_scale.push_back(s);
      const float e = std::min(1.f / (s * dec), FLT_MAX);
      t.enc_clamped.push_back(std::isinf(1.f / (s * dec)));
      for (int64_t c = 16 * b; c < c1; ++c) {
        const float y = std::clamp(xr[c] * e, -6.f, 6.f);
        t.value[r * cols + c] = std::copysign(te_e2m1(std::fabs(y)), y);
      }
    }
  }
  return t;
}

TEST(RowScaledTe, CodesAndScalesMatchAnIndependentTranscription) {
  // Codes and block scales bit for bit, except where docs/numerics.md "Zero handling,
  // compared with Transformer Engine's reference quantizer" says they differ: a block whose
  // E4M3 scale rounds to 0 (TE keeps 0, this project the guard 1; both decode to 0), the
  // encode scale of an all-zero row (TE FLT_MAX, this project 1), and an element encode scale
  // 1/d_b that overflows FP32 (TE clamps it to FLT_MAX; this project keeps +Inf, which
  // saturates the block's nonzero elements: docs/numerics.md "Quantizing one operand").
  const int64_t rows = 45, cols = 72;
  std::vector<std::vector<float>> inputs = {make_data(Dist::Normal, rows * cols, 1),
                                            make_data(Dist::Cauchy, rows * cols, 2),
                                            adversarial_rows(rows, cols, 3)};
  std::vector<float> rowmix = make_data(Dist::Normal, rows * cols, 4);
  for (int64_t r = 0; r < rows; ++r)  // rows spanning 60 binades
    for (int64_t c = 0; c < cols; ++c) rowmix[r * cols + c] *= std::ldexp(1.f, int(r) - 30);
  inputs.push_back(rowmix);
  {  // scale-grid midpoints under each row's multiplier (the row's amax set to its g)
    std::vector<float> g, mid = midpoint_rows(rows, 23, g);
    std::vector<float> cut(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) cut[r * cols + c] = mid[r * 128 * 16 + 16 * 62 + c];  // blocks 62..66: the midpoint
      cut[r * cols + cols - 1] = g[r];
    }
    inputs.push_back(cut);
  }
  int64_t compared = 0, clamped = 0;
  for (const auto& x : inputs) {
    const TeRowScaled te = te_row_scaled(x, rows, cols);
    const auto g = row_amaxes(x, rows, cols);
    const QuantizedTensor q = quantize_blocks_rows(x.data(), rows, cols, nvfp4_spec(), g.data(), nullptr);
    for (int64_t r = 0; r < rows; ++r) {
      EXPECT_EQ(g[r], te.amax[r]);
      if (g[r] > 0) {
        EXPECT_EQ(q.row_ge[r], te.s_enc[r]) << "row " << r;
      }
      for (int64_t b = 0; b < q.block_cols; ++b) {
        const float ts = te.block_scale[r * q.block_cols + b];
        if (ts == 0.f) continue;  // documented: the zero guard
        ASSERT_EQ(q.scales[r * q.block_cols + b], ts) << "row " << r << " block " << b;
        // documented ("Quantizing one operand", edge case): an encode scale 1/d_b that
        // overflows stays +Inf here and saturates; TE clamps it to FLT_MAX
        if (te.enc_clamped[r * q.block_cols + b]) {
          ++clamped;
          continue;
        }
        for (int64_t c = 16 * b; c < std::min(cols, 16 * b + 16); ++c) {
          const float mine = e2m1_decode(q.codes[r * cols + c]);
          const float theirs = te.value[r * cols + c];
          // == : TE writes +0 where this project keeps −0 (the same documented section)
          ASSERT_TRUE(mine == theirs) << "row " << r << " col " << c << ": " << mine << " vs "
                                      << theirs;
          ++compared;
        }
      }
    }
  }
  EXPECT_GT(compared, 10000);
  EXPECT_LT(clamped, 100);  // only the subnormal rows of adversarial_rows
}

}  // namespace
