// Bit-exact tests of the packed-QTensor kernels of pack_fast.h against their scalar twins:
//   quantize_pack_fast            vs pack(quantize_blocks(...))
//   quantize_pack_transposed_fast vs pack(quantize_blocks(RHT?(xᵀ)))
//   dequantize_fast               vs dequantize(const QTensor&)
//   dequantize_bf16_fast          vs round_bf16(dequantize(const QTensor&))
// Every comparison is a memcmp of codes, scale codes and FP32/BF16 outputs (and the QTensor's
// scalar fields bit for bit), on every SIMD target the CPU supports (quant_fast_use_target).
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "fp4/numerics/block_quant.h"
#include "fp4/base/error.h"
#include "fp4/numerics/format.h"
#include "fp4/numerics/hadamard.h"
#include "fp4/numerics/pack_fast.h"
#include "fp4/numerics/philox.h"
#include "fp4/numerics/qtensor.h"
#include "fp4/numerics/quant_fast.h"
#include "support/quant_test_inputs.h"

using namespace fp4;
using namespace fp4::testing;

namespace {


/// Runs fn once per SIMD target supported here, then restores the default target.
void for_each_target(const std::function<void(const std::string&)>& fn) {
  for (const std::string& t : quant_fast_targets()) {
    quant_fast_use_target(t);
    SCOPED_TRACE("SIMD target " + t);
    fn(t);
  }
  quant_fast_use_target("");
}


uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }

/// Every field of two QTensors, bit for bit.
void expect_same(const QTensor& got, const QTensor& want, const std::string& what) {
  EXPECT_EQ(got.rows, want.rows) << what;
  EXPECT_EQ(got.cols, want.cols) << what;
  EXPECT_EQ(got.block, want.block) << what;
  EXPECT_EQ(got.two_d, want.two_d) << what;
  EXPECT_EQ(got.scale_format, want.scale_format) << what;
  EXPECT_EQ(got.scale_rule, want.scale_rule) << what;
  EXPECT_EQ(got.element_format, want.element_format) << what;
  EXPECT_EQ(bits(got.decode_scale), bits(want.decode_scale)) << what;
  EXPECT_EQ(bits(got.reference), bits(want.reference)) << what;
  EXPECT_EQ(bits(got.target), bits(want.target)) << what;
  EXPECT_EQ(got.facts, want.facts) << what;
  const int64_t ic = first_diff(got.packed, want.packed);
  EXPECT_EQ(ic, -1) << what << ": packed codes differ first at byte " << ic << " (got 0x" << std::hex
                    << (ic >= 0 && size_t(ic) < got.packed.size() ? int(got.packed[size_t(ic)]) : -1)
                    << ", want 0x"
                    << (ic >= 0 && size_t(ic) < want.packed.size() ? int(want.packed[size_t(ic)]) : -1)
                    << std::dec << ")";
  const int64_t is = first_diff(got.scale_codes, want.scale_codes);
  EXPECT_EQ(is, -1) << what << ": scale codes differ first at block " << is;
}

/// round_bf16 of the scalar dequantized values, as BF16 bit patterns.
std::vector<uint16_t> bf16_of(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = uint16_t(bits(round_bf16(v[i])) >> 16);
  return o;
}

/// dequantize_fast and dequantize_bf16_fast of t against the scalar twins.
void check_dequant(const QTensor& t, const std::string& what) {
  const size_t n = size_t(t.rows * t.cols);
  std::vector<float> want(n), got(n, 12345.f);
  dequantize(t, want.data());
  dequantize_fast(t, got.data());
  const int64_t i = first_diff(got, want);
  EXPECT_EQ(i, -1) << what << ": dequantize_fast differs first at " << i << ": got "
                   << (i >= 0 ? got[size_t(i)] : 0.f) << " want " << (i >= 0 ? want[size_t(i)] : 0.f);
  std::vector<uint16_t> gb(n + 1, 0xABCD);
  dequantize_bf16_fast(t, gb.data());
  EXPECT_EQ(gb[n], 0xABCD) << what << ": write after the BF16 output";
  gb.pop_back();
  const int64_t j = first_diff(gb, bf16_of(want));
  EXPECT_EQ(j, -1) << what << ": dequantize_bf16_fast differs first at " << j;
}

/// quantize_pack_fast against pack(quantize_blocks(...)), then the dequantizers on the result.
void check_pack(const std::vector<float>& x, int64_t rows, int64_t cols, const BlockQuantSpec& s,
                float g, const std::string& what, bool dequant = true) {
  const SrKey* key = s.rounding == Rounding::SR8 ? &kKey : nullptr;
  const std::string w = what + " [" + std::to_string(rows) + ", " + std::to_string(cols) + "] " +
                        spec_str(s) + " g=" + std::to_string(g);
  const QTensor want = pack(quantize_blocks(x.data(), rows, cols, s, g, key), {{"k", "v"}});
  const QTensor got = quantize_pack_fast(x.data(), rows, cols, s, g, key, {{"k", "v"}});
  expect_same(got, want, w);
  if (dequant) check_dequant(want, w);
}

/// Scalar reference of the packed quantize-transpose.
QTensor ref_pack_transposed(const std::vector<float>& x, int64_t rows, int64_t cols,
                            const BlockQuantSpec& spec, float g, const SrKey* sr, bool rht) {
  std::vector<float> t(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = x[size_t(r * cols + c)];
  if (rht) rht16_rows(t.data(), cols, rows);
  return pack(quantize_blocks(t.data(), cols, rows, spec, g, sr));
}

float ref_amax_rht(const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<float> t(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = x[size_t(r * cols + c)];
  rht16_rows(t.data(), cols, rows);
  return tensor_amax(t.data(), int64_t(t.size()));
}

/// quantize_pack_transposed_fast against its reference composition.
void check_pack_t(const std::vector<float>& x, int64_t rows, int64_t cols, const BlockQuantSpec& s,
                  float g, bool rht, const std::string& what) {
  const SrKey* key = s.rounding == Rounding::SR8 ? &kKey : nullptr;
  expect_same(quantize_pack_transposed_fast(x.data(), rows, cols, s, g, key, rht),
              ref_pack_transposed(x, rows, cols, s, g, key, rht),
              what + " T" + (rht ? " RHT" : "") + " [" + std::to_string(rows) + ", " +
                  std::to_string(cols) + "] " + spec_str(s) + " g=" + std::to_string(g));
}

std::string after_colon(const std::string& s) {
  const size_t p = s.find(": ");
  return p == std::string::npos ? s : s.substr(p + 2);
}

}  // namespace

// ------------------------------------------------------------------------------------------

TEST(PackFast, RandomBitExact) {
  // Per target: 4 scale formats × RNE/SR8 × 1-D/2-D × 4 distributions, each on ~2.7·10^5
  // elements (≥ 10^6 per format, rounding and layout; 1.7·10^7 per target), with the current
  // amax and with held references too small (saturating scales) or too large. Odd column
  // counts put every other row's first code in a high nibble.
  struct Shape {
    int64_t rows, cols;
    int block;
  };
  const Shape shapes[] = {{257, 1040, 16}, {129, 2071, 16}, {300, 901, 32}, {61, 4433, 16}};
  struct Case {
    std::vector<float> x;
    Shape sh;
    BlockQuantSpec spec;
    float g;
    QTensor want;
  };
  std::vector<Case> cases;
  int k = 0;
  size_t total = 0;
  for (ScaleFormat f : kFormats)
    for (Rounding r : kRoundings)
      for (bool two_d : {false, true})
        for (Dist d : kDists) {
          const Shape sh = shapes[k % 4];
          Case c;
          c.sh = sh;
          c.x = make_data(d, size_t(sh.rows * sh.cols), 1000 + k);
          c.spec = make_spec(f, r, sh.block, two_d);
          const float amax = tensor_amax(c.x.data(), int64_t(c.x.size()));
          const float gmul[] = {1.f, 1.f, 1e-3f, 1e3f};
          c.g = std::min(amax * gmul[(k / 4) % 4], FLT_MAX);
          c.want = pack(quantize_blocks(c.x.data(), sh.rows, sh.cols, c.spec, c.g,
                                        r == Rounding::SR8 ? &kKey : nullptr));
          total += c.x.size();
          cases.push_back(std::move(c));
          ++k;
        }
  EXPECT_GE(total, size_t{16'000'000});
  for_each_target([&](const std::string&) {
    QTensor reused;  // the buffer-reusing overload, across shapes
    for (const Case& c : cases) {
      const std::string w = spec_str(c.spec) + " [" + std::to_string(c.sh.rows) + ", " +
                            std::to_string(c.sh.cols) + "] g=" + std::to_string(c.g);
      const SrKey* key = c.spec.rounding == Rounding::SR8 ? &kKey : nullptr;
      expect_same(quantize_pack_fast(c.x.data(), c.sh.rows, c.sh.cols, c.spec, c.g, key), c.want, w);
      quantize_pack_fast(c.x.data(), c.sh.rows, c.sh.cols, c.spec, c.g, key, reused);
      expect_same(reused, c.want, w + " (reused QTensor)");
      check_dequant(c.want, w);
    }
  });
}

TEST(PackFast, DequantizeArbitraryCodesBitExact) {
  // Random packed bytes (all 16 codes in both nibbles, −0 included), random valid scale codes
  // of every format (subnormal, max and the zero-guard 1), and decode scales from tiny to huge
  // (products overflow to ±Inf and 0·Inf gives NaN, which BF16 keeps quiet). ≥ 10^6 elements per
  // kernel and target, odd shapes and blocks included.
  std::mt19937_64 rng(77);
  std::vector<QTensor> ts;
  size_t total = 0;
  // decode scales a loaded file may hold, NaN (quiet and signalling) and Inf included
  const float gds[] = {1.f, 3.7e-5f, 1e30f, FLT_MAX, 1e-38f, 1e-45f, 0.1f, INFINITY,
                       std::numeric_limits<float>::quiet_NaN(), std::bit_cast<float>(0x7F800001u)};
  int k = 0;
  for (ScaleFormat f : kFormats) {
    std::vector<uint8_t> valid;
    for (int c = 0; c < 256; ++c) {
      try {
        (void)scale_decode(uint8_t(c), f);
        valid.push_back(uint8_t(c));
      } catch (const std::invalid_argument&) {
      }
    }
    for (auto [rows, cols, block, two_d] :
         {std::tuple<int64_t, int64_t, int, bool>{512, 512, 16, false}, {300, 333, 16, true},
          {77, 1001, 32, false}, {129, 130, 7, true}, {1, 1, 16, false}, {3, 5, 3, false}}) {
      QTensor t;
      t.rows = rows;
      t.cols = cols;
      t.block = block;
      t.two_d = two_d;
      t.scale_format = f;
      t.decode_scale = gds[k++ % 10];
      t.packed.resize(size_t((rows * cols + 1) / 2));
      for (auto& b : t.packed) b = uint8_t(rng());
      t.scale_codes.resize(size_t(t.block_rows() * t.block_cols()));
      for (auto& c : t.scale_codes) c = valid[rng() % valid.size()];
      total += size_t(rows * cols);
      ts.push_back(std::move(t));
    }
  }
  EXPECT_GE(total, size_t{1'000'000});
  for_each_target([&](const std::string&) {
    for (const QTensor& t : ts)
      check_dequant(t, std::string(scale_format_name(t.scale_format)) + " [" +
                           std::to_string(t.rows) + ", " + std::to_string(t.cols) + "] gd=" +
                           std::to_string(t.decode_scale));
  });
}

TEST(PackFast, TransposedRandomBitExact) {
  struct Shape {
    int64_t rows, cols;
    int block;
  };
  // rows % 16 == 0 runs the buffer-free panel kernel (272 with blocks of 32: a last block of
  // 16 rows); other row counts the transpose-then-row-kernel path.
  const Shape rht_shapes[] = {{1024, 256, 16}, {512, 515, 16}, {272, 1031, 32}, {2048, 129, 16}};
  const Shape plain_shapes[] = {{1024, 257, 16}, {517, 503, 16}, {272, 1030, 32}, {2047, 131, 16}};
  struct Case {
    std::vector<float> x;
    Shape sh;
    BlockQuantSpec spec;
    float g;
    bool rht;
    QTensor want;
  };
  std::vector<Case> cases;
  int k = 0;
  for (ScaleFormat f : kFormats)
    for (Rounding r : kRoundings)
      for (bool rht : {false, true})
        for (Dist d : kDists) {
          const Shape sh = rht ? rht_shapes[k % 4] : plain_shapes[k % 4];
          Case c;
          c.sh = sh;
          c.rht = rht;
          c.x = make_data(d, size_t(sh.rows * sh.cols), 5000 + k);
          c.spec = make_spec(f, r, sh.block, k % 5 == 0);
          c.g = rht ? ref_amax_rht(c.x, sh.rows, sh.cols) : tensor_amax(c.x.data(), int64_t(c.x.size()));
          c.want = ref_pack_transposed(c.x, sh.rows, sh.cols, c.spec, c.g,
                                       r == Rounding::SR8 ? &kKey : nullptr, rht);
          cases.push_back(std::move(c));
          ++k;
        }
  for_each_target([&](const std::string&) {
    for (const Case& c : cases) {
      const QTensor got = quantize_pack_transposed_fast(
          c.x.data(), c.sh.rows, c.sh.cols, c.spec, c.g,
          c.spec.rounding == Rounding::SR8 ? &kKey : nullptr, c.rht);
      expect_same(got, c.want, spec_str(c.spec) + (c.rht ? " RHT" : "") + " [" +
                                   std::to_string(c.sh.rows) + ", " + std::to_string(c.sh.cols) + "]");
    }
  });
}

// The reusing overload: one QTensor through calls of other shapes, specs and paths (the
// buffer-free panel kernel, the row-kernel path, 2-D tiles) gives what fresh calls give and
// keeps its facts.
TEST(PackFast, TransposedIntoReusedTensor) {
  QTensor reused;
  reused.facts = {{"recipe", "kept"}};
  int k = 0;
  for (const auto& [rows, cols, block, two_d, rht] :
       std::vector<std::tuple<int64_t, int64_t, int, bool, bool>>{
           {512, 200, 16, false, true}, {96, 33, 32, false, false}, {515, 70, 16, false, false},
           {512, 200, 16, false, false}, {64, 48, 16, true, false}, {512, 200, 16, false, true}}) {
    const auto x = make_data(Dist::Normal, size_t(rows * cols), 900 + k++);
    for (Rounding r : kRoundings) {
      const BlockQuantSpec s = make_spec(ScaleFormat::UE5M3, r, block, two_d);
      const float g = rht ? ref_amax_rht(x, rows, cols) : tensor_amax(x.data(), rows * cols);
      const SrKey* key = r == Rounding::SR8 ? &kKey : nullptr;
      quantize_pack_transposed_fast(x.data(), rows, cols, s, g, key, rht, reused);
      const std::string what = spec_str(s) + (rht ? " RHT [" : " [") + std::to_string(rows) +
                               ", " + std::to_string(cols) + "]";
      expect_same(reused, quantize_pack_transposed_fast(x.data(), rows, cols, s, g, key, rht, {{"recipe", "kept"}}), what);
      EXPECT_EQ(reused.facts.at("recipe"), "kept") << what;
    }
  }
}

TEST(PackFast, ExactTiesAtEveryGridPoint) {
  // Exact E2M1 ties and grid points at power-of-two and arbitrary block scales (tie_inputs).
  for (ScaleFormat f : kFormats) {
    for (Rounding r : kRoundings) {
      const TieInputs in = tie_inputs(f, r);
      const auto& [x, x2, rows, cols, g, g2, exact_hits] = in;
      EXPECT_GT(exact_hits, 400);
      for_each_target([&](const std::string&) {
        check_pack(x, rows, cols, make_spec(f, r, 16), g, "pow2 ties");
        check_pack(x, rows, cols, make_spec(f, r, 16, true), g, "pow2 ties 2D");
        check_pack(x2, int64_t(x2.size()) / 16, 16, make_spec(f, r, 16), g2, "exact ties");
        check_pack(x2, int64_t(x2.size()) / 64, 64, make_spec(f, r, 16), g2, "exact ties");
        // odd column count: ties in both nibble positions
        const std::vector<float> x3(x2.begin(), x2.begin() + 63 * 99);
        check_pack(x3, 63, 99, make_spec(f, r, 16), g2, "exact ties, odd cols");
      });
    }
  }
}

TEST(PackFast, SrThresholdsExact) {
  // e_b = 1 (g = T·6, block amax 6): y = lo + (1 − (2r+1)/512)·ulp exactly for the element's
  // own SR byte r (δ + off == 1: rounds up), one and two floats below/above, and tiny scaled
  // copies (the lo = 0 interval). Every grid interval, both signs; even and odd column counts.
  for (int64_t cols : {64, 63}) {
    const int64_t rows = 256;
    std::vector<uint8_t> r(size_t(rows * cols));
    sr_bytes(kKey, 0, uint64_t(rows * cols), r.data());
    std::vector<float> x(size_t(rows * cols));
    const float los[] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f};
    const float ulps[] = {0.5f, 0.5f, 0.5f, 0.5f, 1.f, 1.f, 2.f};
    for (int64_t i = 0; i < rows * cols; ++i) {
      if ((i % cols) % 16 == 0) {
        x[size_t(i)] = 6.f;  // block amax 6 → e_b = 1
        continue;
      }
      const int k = int(i % 7);
      const float delta = 1.f - float(2 * int(r[size_t(i)]) + 1) / 512.f;
      float y = los[k] + delta * ulps[k];
      switch ((i / 7) % 6) {
        case 0: break;
        case 1: y = std::nextafter(y, 0.f); break;
        case 2: y = std::nextafter(y, 10.f); break;
        case 3: y = std::nextafter(std::nextafter(y, 0.f), 0.f); break;
        case 4: y = std::nextafter(std::nextafter(y, 10.f), 10.f); break;
        case 5: y = std::ldexp(y, -int(i % 40)); break;
      }
      x[size_t(i)] = (i % 5 == 0) ? -y : y;
    }
    const float g = 448.f * 6.f;
    for_each_target([&](const std::string&) {
      for (ScaleFormat f : kFormats) check_pack(x, rows, cols, make_spec(f, Rounding::SR8), g, "SR thresholds");
    });
  }
}

TEST(PackFast, RnaTiesExact) {
  // RNA codes at every E2M1 half-way point and its neighbours (rna_tie_inputs), even and odd
  // column counts.
  for (int64_t cols : {64, 63}) {
    const int64_t rows = 256;
    const std::vector<float> x = rna_tie_inputs(rows, cols);
    for_each_target([&](const std::string&) {
      for (ScaleFormat f : kFormats) {
        check_pack(x, rows, cols, make_spec(f, Rounding::RNA), 448.f * 6.f, "RNA ties");
        check_pack_t(x, rows, cols, make_spec(f, Rounding::RNA), 448.f * 6.f, false, "RNA ties");
        check_pack_t(x, rows, cols, make_spec(f, Rounding::RNA), 448.f * 6.f, true, "RNA ties");
      }
    });
  }
}

TEST(PackFast, AdversarialBlocksAndShapes) {
  std::mt19937_64 rng(9);
  auto inputs = adversarial_inputs(rng);
  inputs.push_back({"all zero", std::vector<float>(64 * 48, 0.f)});
  {
    std::vector<float> v(64 * 48);  // ±6 and just above with ge = 1 (g = T·6): c_b = 1
    for (size_t i = 0; i < v.size(); ++i) {
      const float vals[] = {6.f, -6.f, std::nextafter(6.f, 7.f), -std::nextafter(6.f, 7.f), 5.f, 7.f};
      v[i] = vals[(i * 7) % 6];
    }
    inputs.push_back({"±6 with ge = 1", v});
  }
  const int64_t col_list[] = {1, 15, 16, 17, 33, 48, 47};
  for_each_target([&](const std::string&) {
    for (const auto& [name, v] : inputs) {
      const float amax = tensor_amax(v.data(), int64_t(v.size()));
      const float gs[] = {amax, 0.f, 1e-38f, FLT_MIN, std::numeric_limits<float>::denorm_min(),
                          1e30f, FLT_MAX, 448.f * 6.f};
      for (ScaleFormat f : kFormats)
        for (Rounding r : kRoundings)
          for (float g : gs)
            for (int64_t cols : col_list) {
              const int64_t rows = std::min<int64_t>(int64_t(v.size()) / cols, 41);  // odd rows
              const std::vector<float> x(v.begin(), v.begin() + rows * cols);
              check_pack(x, rows, cols, make_spec(f, r, 16), g, name);
              check_pack(x, rows, cols, make_spec(f, r, 16, true), g, name + " 2D");
              check_pack_t(x, rows, cols, make_spec(f, r, 16), g, false, name);
              if (cols % 2 == 1) {  // RHT needs rows % 16 == 0: the first 32 rows
                const std::vector<float> x32(v.begin(), v.begin() + 32 * cols);
                check_pack_t(x32, 32, cols, make_spec(f, r, 16), g, true, name);
              }
            }
    }
    // 1×1 tensors (one half-filled byte)
    for (float v : {0.f, -0.f, 1.f, -3.5f, 1e-45f, 3e38f, -6.f, 6.5f}) {
      const std::vector<float> x{v};
      for (ScaleFormat f : kFormats)
        for (Rounding r : kRoundings)
          for (float g : {std::fabs(v), 0.f, 1.f, 448.f * 6.f}) {
            check_pack(x, 1, 1, make_spec(f, r, 16), g, "1x1");
            check_pack(x, 1, 1, make_spec(f, r, 16, true), g, "1x1 2D");
            const QTensor t = quantize_pack_transposed_fast(x.data(), 1, 1, make_spec(f, r, 16), g,
                                                            r == Rounding::SR8 ? &kKey : nullptr, false);
            expect_same(t, ref_pack_transposed(x, 1, 1, make_spec(f, r, 16), g,
                                               r == Rounding::SR8 ? &kKey : nullptr, false),
                        "1x1 T");
          }
    }
    // block sizes that are not multiples of the lane count, odd tiles (B·cols odd: block-rows
    // start at odd flat indices), shapes whose rows are not a multiple of the block
    const auto x = make_data(Dist::Normal, 37 * 53, 5);
    const float g = tensor_amax(x.data(), int64_t(x.size()));
    for (int block : {1, 2, 3, 7, 8, 20, 32, 64, 100})
      for (Rounding r : kRoundings) {
        check_pack(x, 37, 53, make_spec(ScaleFormat::UE5M3, r, block), g, "odd block");
        check_pack(x, 37, 53, make_spec(ScaleFormat::E4M3, r, block, true), g, "odd block 2D");
        check_pack(x, 53, 37, make_spec(ScaleFormat::UE8M0, r, block, true), g, "odd block 2D");
        check_pack_t(x, 37, 53, make_spec(ScaleFormat::UE5M3, r, block), g, false, "odd block");
        check_pack_t(x, 37, 53, make_spec(ScaleFormat::E4M3, r, block, true), g, false, "odd block 2D");
        const std::vector<float> x48(x.begin(), x.begin() + 48 * 37);
        check_pack_t(x48, 48, 37, make_spec(ScaleFormat::E4M3, r, block), g, true, "odd block");
      }
  });
}

TEST(PackFast, ThreadCountDoesNotChangeBits) {
  // Large enough to run in parallel; odd cols (shared bytes at row starts) and 2-D tiles with
  // an odd block × odd cols (block-rows paired so that ranges start at even flat indices).
  const auto x = make_data(Dist::Normal, 1021 * 273, 8);
  const float g = tensor_amax(x.data(), int64_t(x.size()));
  const float grht = ref_amax_rht(x, 1008, 273);
  const int saved = omp_get_max_threads();
  for_each_target([&](const std::string&) {
    std::vector<QTensor> res;
    std::vector<std::vector<float>> deq;
    std::vector<std::vector<uint16_t>> deqb;
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      std::vector<QTensor> ts;
      ts.push_back(quantize_pack_fast(x.data(), 1021, 273, make_spec(ScaleFormat::UE5M3, Rounding::SR8), g, &kKey));
      ts.push_back(quantize_pack_fast(x.data(), 1021, 273, make_spec(ScaleFormat::E4M3, Rounding::RNE, 16, true), g, nullptr));
      ts.push_back(quantize_pack_fast(x.data(), 1021, 273, make_spec(ScaleFormat::UE5M3, Rounding::SR8, 7, true), g, &kKey));
      ts.push_back(quantize_pack_transposed_fast(x.data(), 1008, 273, make_spec(ScaleFormat::E4M3, Rounding::SR8), grht, &kKey, true));
      std::vector<float> d;
      std::vector<uint16_t> db;
      for (const QTensor& t : ts) {
        std::vector<float> o(size_t(t.rows * t.cols));
        std::vector<uint16_t> ob(o.size());
        dequantize_fast(t, o.data());
        dequantize_bf16_fast(t, ob.data());
        d.insert(d.end(), o.begin(), o.end());
        db.insert(db.end(), ob.begin(), ob.end());
      }
      if (res.empty()) {
        res = ts;
        deq.push_back(d);
        deqb.push_back(db);
        continue;
      }
      for (size_t i = 0; i < ts.size(); ++i) expect_same(ts[i], res[i], std::to_string(threads) + " threads, tensor " + std::to_string(i));
      EXPECT_EQ(first_diff(d, deq[0]), -1) << threads << " threads";
      EXPECT_EQ(first_diff(db, deqb[0]), -1) << threads << " threads";
    }
  });
  omp_set_num_threads(saved);
}

TEST(PackFast, NonFiniteInputsThrowLikeScalar) {
  for_each_target([&](const std::string&) {
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()}) {
      for (int64_t pos : {int64_t{0}, int64_t{17}, int64_t{4000}, int64_t{64 * 97 - 1}}) {
        auto x = make_data(Dist::Normal, 64 * 97, 3);
        x[size_t(pos)] = bad;
        for (bool two_d : {false, true}) {
          const BlockQuantSpec s = make_spec(ScaleFormat::UE5M3, Rounding::SR8, 16, two_d);
          std::string want_msg;
          try {
            (void)pack(quantize_blocks(x.data(), 64, 97, s, 1.f, &kKey));
          } catch (const NonFiniteError& e) {
            want_msg = after_colon(e.what());
          }
          ASSERT_FALSE(want_msg.empty());
          try {
            (void)quantize_pack_fast(x.data(), 64, 97, s, 1.f, &kKey);
            ADD_FAILURE() << "quantize_pack_fast did not throw";
          } catch (const NonFiniteError& e) {
            EXPECT_EQ(after_colon(e.what()), want_msg);
          }
        }
        for (bool rht : {false, true})
          EXPECT_THROW((void)quantize_pack_transposed_fast(x.data(), 64, 97, make_spec(ScaleFormat::E4M3, Rounding::RNE),
                                                           1.f, nullptr, rht),
                       NonFiniteError);
      }
    }
    // finite inputs whose RHT overflows: the reference composition throws too
    std::vector<float> x(16 * 4, 3e38f);
    EXPECT_THROW(ref_pack_transposed(x, 16, 4, make_spec(ScaleFormat::E4M3, Rounding::RNE), 1.f, nullptr, true),
                 NonFiniteError);
    EXPECT_THROW((void)quantize_pack_transposed_fast(x.data(), 16, 4, make_spec(ScaleFormat::E4M3, Rounding::RNE),
                                                     1.f, nullptr, true),
                 NonFiniteError);
  });
}

TEST(PackFast, BadArgumentsThrowLikeScalar) {
  const std::vector<float> x(64, 1.f);
  const BlockQuantSpec ok = make_spec(ScaleFormat::UE5M3, Rounding::RNE);
  auto bad_block = ok;
  bad_block.block = 0;
  auto bad_t = ok;
  bad_t.target = 0.f;
  const auto sr = make_spec(ScaleFormat::UE5M3, Rounding::SR8);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto both_throw = [&](int64_t rows, int64_t cols, const BlockQuantSpec& s, float g, const SrKey* k) {
    EXPECT_THROW((void)pack(quantize_blocks(x.data(), rows, cols, s, g, k)), std::invalid_argument);
    EXPECT_THROW((void)quantize_pack_fast(x.data(), rows, cols, s, g, k), std::invalid_argument);
    EXPECT_THROW((void)quantize_pack_transposed_fast(x.data(), cols, rows, s, g, k, false),
                 std::invalid_argument);
  };
  both_throw(-1, 4, ok, 1.f, nullptr);
  both_throw(4, 4, bad_block, 1.f, nullptr);
  both_throw(4, 4, bad_t, 1.f, nullptr);
  both_throw(4, 4, ok, -1.f, nullptr);
  both_throw(4, 4, ok, nan, nullptr);
  both_throw(4, 4, ok, INFINITY, nullptr);
  both_throw(4, 4, sr, 1.f, nullptr);
  // specs that are not QTensor material: pack() rejects them, and so does the fast path
  std::vector<BlockQuantSpec> other(3);
  other[0].element = parse_element_format("int4");
  other[1].scale_format = ScaleFormat::UE8M0;  // MX rule, but E2M3 elements: not MXFP4
  other[1].scale_rule = ScaleRule::MxTe;
  other[1].element = parse_element_format("e2m3");
  set_scale_format(other[2], "ue4m3");
  for (const BlockQuantSpec& s : other) {
    std::string want, got;
    try {
      (void)pack(quantize_blocks(x.data(), 4, 16, s, 1.f, nullptr));
    } catch (const std::invalid_argument& e) {
      want = e.what();
    }
    try {
      (void)quantize_pack_fast(x.data(), 4, 16, s, 1.f, nullptr);
    } catch (const std::invalid_argument& e) {
      got = e.what();
    }
    EXPECT_FALSE(want.empty());
    EXPECT_EQ(got, want);
    // non-finite input: quantize_blocks' NonFiniteError comes first, as in the composition
    std::vector<float> y = x;
    y[3] = nan;
    EXPECT_THROW((void)quantize_pack_fast(y.data(), 4, 16, s, 1.f, nullptr), NonFiniteError);
  }
  EXPECT_THROW((void)quantize_pack_transposed_fast(x.data(), 8, 8, ok, 1.f, nullptr, true),
               std::invalid_argument);
  // empty tensors are fine and equal
  for (auto [r, c] : {std::pair<int64_t, int64_t>{0, 5}, {5, 0}, {0, 0}})
    for (bool two_d : {false, true})
      check_pack(x, r, c, make_spec(ScaleFormat::UE5M3, Rounding::RNE, 16, two_d), 1.f, "empty");
}

// MXFP4 (E2M1, UE8M0, mx-te / mx-ocp; docs/formats.md "`mx-te` and `mx-ocp` (MXFP4)") is
// QTensor material too: the fast entry points give pack(quantize_blocks(...)) of the reference,
// and the fast dequantizers its values.
TEST(PackFast, MxRulesPackLikeScalar) {
  const std::vector<float> x = make_data(Dist::Normal, 24 * 70, 9);
  for (ScaleRule rule : {ScaleRule::MxTe, ScaleRule::MxOcp})
    for (Rounding r : {Rounding::RNE, Rounding::SR8})
      for (bool two_d : {false, true}) {
        BlockQuantSpec s = make_spec(ScaleFormat::UE8M0, r, 32, two_d);
        s.scale_rule = rule;
        check_pack(x, 24, 70, s, 0.f, std::string("mx ") + scale_rule_name(rule));
        if (!two_d) check_pack_t(x, 24, 70, s, 0.f, false, std::string("mx ") + scale_rule_name(rule));
      }
}

TEST(PackFast, DequantizeErrorsLikeScalar) {
  const std::vector<float> x = make_data(Dist::Normal, 8 * 40, 4);
  QTensor t = quantize_pack_fast(x.data(), 8, 40, make_spec(ScaleFormat::E4M3, Rounding::RNE), 1.f, nullptr);
  std::vector<float> out(320);
  std::vector<uint16_t> outb(320);
  // a reserved / NaN scale code: the scalar twin's scale_decode message
  for (uint8_t bad : {uint8_t{0x7F}, uint8_t{0x80}, uint8_t{0xFF}}) {
    QTensor b = t;
    b.scale_codes[5] = bad;
    std::string want;
    try {
      dequantize(b, out.data());
    } catch (const std::invalid_argument& e) {
      want = e.what();
    }
    ASSERT_FALSE(want.empty());
    for (int which = 0; which < 2; ++which) {
      try {
        if (which == 0) dequantize_fast(b, out.data());
        else dequantize_bf16_fast(b, outb.data());
        ADD_FAILURE() << "no throw";
      } catch (const std::invalid_argument& e) {
        EXPECT_EQ(std::string(e.what()), want);
      }
    }
  }
  // inconsistent sizes (the scalar twin does not check these; the fast one throws)
  QTensor b = t;
  b.packed.pop_back();
  EXPECT_THROW(dequantize_fast(b, out.data()), std::invalid_argument);
  b = t;
  b.scale_codes.push_back(0);
  EXPECT_THROW(dequantize_bf16_fast(b, outb.data()), std::invalid_argument);
  b = t;
  b.block = 0;
  EXPECT_THROW(dequantize_fast(b, out.data()), std::invalid_argument);
}

TEST(PackFast, SafetensorsRoundTripOfFastTensor) {
  // The fused result is an ordinary QTensor: save, load, dequantize.
  const auto x = make_data(Dist::Cauchy, 33 * 47, 12);
  const QTensor t = quantize_pack_fast(x.data(), 33, 47, make_spec(ScaleFormat::UE5M3, Rounding::SR8),
                                       tensor_amax(x.data(), 33 * 47), &kKey, {{"role", "dY"}});
  const auto file = std::filesystem::temp_directory_path() / ("fp4test_pf_" + std::to_string(::getpid()) + ".safetensors");
  save_safetensors(t, file);
  const QTensor u = load_safetensors(file);
  std::filesystem::remove(file);
  expect_same(u, t, "round trip");
}

// Blocks of 8 and 32 (and 4, 12, 24, blocks that are not whole vectors on some target) on
// every format and distribution, RNE and SR8, rows, 2-D tiles and the quantize-transpose with
// and without the RHT: docs/numerics.md "Block sizes and the fast path".
TEST(PackFast, BlockSizesBitExact) {
  for_each_target([&](const std::string&) {
    int k = 0;
    for (int block : {8, 32, 4, 12, 24})
      for (Rounding r : kRoundings)
        for (auto [rows, cols] : {std::pair<int64_t, int64_t>{96, 64}, {64, 130}, {48, 37}}) {
          const ScaleFormat f = kFormats[k % 4];
          const auto x = make_data(kDists[k % 4], size_t(rows * cols), 8100 + k);
          ++k;
          const float g = tensor_amax(x.data(), int64_t(x.size()));
          check_pack(x, rows, cols, make_spec(f, r, block), g, "block", false);
          check_pack(x, rows, cols, make_spec(f, r, block, true), g, "block 2D", false);
          check_pack_t(x, rows, cols, make_spec(f, r, block), g, false, "block");
          if (rows % 16 == 0)
            check_pack_t(x, rows, cols, make_spec(f, r, block), ref_amax_rht(x, rows, cols), true,
                         "block");
        }
  });
}

// pack_fast_slow_path: "" for the fused packers (any block, 1-D and 2-D), the scalar
// composition for MXFP4 (docs/performance.md "Block sizes and the quantizer's fast path").
TEST(PackFast, SlowPathNamesMxfp4Only) {
  for (int block : {1, 8, 16, 24, 32, 256})
    for (ScaleFormat f : kFormats)
      for (bool two_d : {false, true})
        EXPECT_EQ(pack_fast_slow_path(make_spec(f, Rounding::SR8, block, two_d)), "") << block;
  BlockQuantSpec mx = make_spec(ScaleFormat::UE8M0, Rounding::RNE, 32);
  mx.scale_rule = ScaleRule::MxTe;
  EXPECT_EQ(pack_fast_slow_path(mx),
            "scalar quantize_blocks, then pack (MXFP4 has no fused packer)");
}
