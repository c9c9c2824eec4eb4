// Bit-exact tests of the fast (SIMD + OpenMP) quantizers of quant_fast.h against their scalar
// twins in block_quant.h / hadamard.h / philox.h (the contract, docs/numerics.md). Every
// comparison is a memcmp of the FP32 outputs, run on every SIMD target the CPU supports.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "fp4/numerics/block_quant.h"
#include "fp4/base/error.h"
#include "fp4/numerics/format.h"
#include "fp4/numerics/hadamard.h"
#include "fp4/numerics/philox.h"
#include "fp4/numerics/quant_fast.h"
#include "support/quant_test_inputs.h"

using namespace fp4;
using namespace fp4::testing;

namespace {


/// Runs fn once per SIMD target supported here and per store mode (streaming stores forced on
/// for every aligned output, and the default policy, under which these small outputs use plain
/// stores), then restores the defaults.
void for_each_target(const std::function<void(const std::string&)>& fn) {
  for (const std::string& t : quant_fast_targets()) {
    quant_fast_use_target(t);
    for (int64_t stream_min : {int64_t{0}, int64_t{-1}}) {
      quant_fast_stream_min_bytes(stream_min);
      SCOPED_TRACE("SIMD target " + t + (stream_min == 0 ? ", streaming stores" : ", plain stores"));
      fn(t);
    }
  }
  quant_fast_use_target("");
  quant_fast_stream_min_bytes(-1);
}

/// An FP32 output buffer starting `offset` floats after a 64-byte boundary (0: aligned, so the
/// streaming-store paths run; 4: what glibc gives large allocations; others: any misalignment),
/// filled with a marker, with 16 guard floats on each side that must stay untouched.
struct AlignedOut {
  explicit AlignedOut(size_t n, size_t offset = 0)
      : n_(n),
        base_(static_cast<float*>(std::aligned_alloc(64, ((n + 48) * sizeof(float) + 63) / 64 * 64))),
        p_(base_ + 16 + offset) {
    std::fill(base_, base_ + n_ + 48, 12345.f);
  }
  ~AlignedOut() {
    for (float* q = base_; q < p_; ++q) EXPECT_EQ(*q, 12345.f) << "write before the output";
    for (float* q = p_ + n_; q < p_ + n_ + 16; ++q) EXPECT_EQ(*q, 12345.f) << "write after the output";
    std::free(base_);
  }
  AlignedOut(const AlignedOut&) = delete;
  AlignedOut& operator=(const AlignedOut&) = delete;
  float* data() { return p_; }
  std::vector<float> vec() const { return std::vector<float>(p_, p_ + n_); }

 private:
  size_t n_;
  float* base_;
  float* p_;
};

#define EXPECT_BITS_EQ(got, want, what)                                                      \
  do {                                                                                       \
    const int64_t i_ = first_diff(got, want);                                                \
    EXPECT_EQ(i_, -1) << what << ": first difference at " << i_ << ": got "                  \
                      << (i_ >= 0 && size_t(i_) < (got).size() ? (got)[i_] : 0.f) << " want " \
                      << (i_ >= 0 && size_t(i_) < (want).size() ? (want)[i_] : 0.f);       \
  } while (0)

/// t = xᵀ [cols, rows], then the RHT of every 16-long chunk of its rows if rht: the FP32
/// butterfly (rht16_rows) or, with bf16_rht, its BF16 variant (rht16_rows_bf16).
std::vector<float> ref_transpose_rht(const std::vector<float>& x, int64_t rows, int64_t cols,
                                     bool rht, bool bf16_rht) {
  std::vector<float> t(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = x[r * cols + c];
  if (rht && bf16_rht) rht16_rows_bf16(t.data(), cols, rows);
  else if (rht) rht16_rows(t.data(), cols, rows);
  return t;
}

/// Scalar reference of the quantize-transpose: t = xᵀ; RHT(t) if rht; qdq(t).
std::vector<float> ref_transposed(const std::vector<float>& x, int64_t rows, int64_t cols,
                                  const BlockQuantSpec& spec, float g, const SrKey* sr, bool rht,
                                  bool bf16_rht = false) {
  std::vector<float> t = ref_transpose_rht(x, rows, cols, rht, bf16_rht);
  quantize_dequantize(t.data(), cols, rows, spec, g, sr, t.data());
  return t;
}

/// Scalar reference of amax_rht16_transposed (FP32 or BF16 RHT).
float ref_amax_rht(const std::vector<float>& x, int64_t rows, int64_t cols, bool bf16_rht = false) {
  const std::vector<float> t = ref_transpose_rht(x, rows, cols, true, bf16_rht);
  return tensor_amax(t.data(), int64_t(t.size()));
}


/// Compares quantize_dequantize_fast with quantize_dequantize on x [rows, cols] for the
/// current target.
void check_rows(const std::vector<float>& x, int64_t rows, int64_t cols, const BlockQuantSpec& s,
                float g, const std::string& what, size_t offset = 0) {
  std::vector<float> want(x.size());
  AlignedOut out(x.size(), offset);
  const SrKey* key = s.rounding == Rounding::SR8 ? &kKey : nullptr;
  quantize_dequantize(x.data(), rows, cols, s, g, key, want.data());
  quantize_dequantize_fast(x.data(), rows, cols, s, g, key, out.data());
  const std::vector<float> got = out.vec();
  EXPECT_BITS_EQ(got, want, what << " [" << rows << ", " << cols << "] " << spec_str(s) << " g=" << g);
}

void check_transposed(const std::vector<float>& x, int64_t rows, int64_t cols,
                      const BlockQuantSpec& s, float g, bool rht, const std::string& what,
                      size_t offset = 0) {
  const SrKey* key = s.rounding == Rounding::SR8 ? &kKey : nullptr;
  const std::vector<float> want = ref_transposed(x, rows, cols, s, g, key, rht);
  AlignedOut out(x.size(), offset);
  quantize_dequantize_transposed_fast(x.data(), rows, cols, s, g, key, rht, out.data());
  const std::vector<float> got = out.vec();
  EXPECT_BITS_EQ(got, want, what << " [" << rows << ", " << cols << "] " << spec_str(s)
                                 << (rht ? " RHT" : "") << " g=" << g);
}

/// The part of an exception message after the function name ("element 12 is NaN ...").
std::string after_colon(const std::string& s) {
  const size_t p = s.find(": ");
  return p == std::string::npos ? s : s.substr(p + 2);
}

}  // namespace

// ------------------------------------------------------------------------------------------

TEST(QuantFast, TargetsListedAndSelectable) {
  const auto t = quant_fast_targets();
  ASSERT_FALSE(t.empty());
  EXPECT_EQ(quant_fast_target(), t.front());
  for (const auto& name : t) {
    quant_fast_use_target(name);
    EXPECT_EQ(quant_fast_target(), name);
  }
  quant_fast_use_target("");
  EXPECT_EQ(quant_fast_target(), t.front());
  EXPECT_THROW(quant_fast_use_target("NEON"), std::invalid_argument);
  for (ScaleFormat f : kFormats) EXPECT_TRUE(quant_fast_supports(make_spec(f, Rounding::RNE)));
}

TEST(QuantFast, SrBytesMatchScalarPhilox) {
  // 10^6+ bytes per target, from offsets that are and are not multiples of 16, including
  // element indices beyond 2^36 (the counter keeps only the low 32 bits of index / 16).
  std::mt19937_64 rng(1);
  for_each_target([&](const std::string&) {
    const uint64_t starts[] = {0, 1, 15, 16, 17, 1000003, (uint64_t{1} << 36) - 40,
                               (uint64_t{1} << 40) + 5};
    size_t total = 0;
    for (uint64_t first : starts) {
      for (uint64_t n : {uint64_t{1}, uint64_t{15}, uint64_t{33}, uint64_t{200003}}) {
        SrKey k = kKey;
        k.seed = rng();
        k.step = uint32_t(rng());
        k.micro = uint32_t(rng() % 65536);  // the micro-batch index (gradient accumulation)
        std::vector<uint8_t> want(n), got(n, 0xAB);
        sr_bytes(k, first, n, want.data());
        sr_bytes_fast(k, first, n, got.data());
        ASSERT_EQ(std::memcmp(want.data(), got.data(), n), 0) << "first " << first << " n " << n;
        total += n;
      }
    }
    EXPECT_GE(total, size_t{1000000});
  });
}

TEST(QuantFast, AmaxMatchesTensorAmax) {
  std::vector<std::vector<float>> data;
  int seed = 0;
  for (Dist d : kDists)
    for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{17}, size_t{1000003}})
      data.push_back(make_data(d, n, 100 + seed++));
  for_each_target([&](const std::string&) {
    for (const auto& x : data) {
      const int64_t n = int64_t(x.size());
      EXPECT_EQ(std::bit_cast<uint32_t>(amax_fast(x.data(), n)),
                std::bit_cast<uint32_t>(tensor_amax(x.data(), n)))
          << "n=" << n;
    }
    // the maximum in the scalar tail, in the last vector, at the very start
    std::vector<float> x(1000, 1.f);
    for (size_t pos : {size_t{0}, size_t{999}, size_t{990}, size_t{512}}) {
      auto y = x;
      y[pos] = -7.f;
      EXPECT_EQ(amax_fast(y.data(), 1000), 7.f) << pos;
    }
    EXPECT_THROW(amax_fast(x.data(), -1), std::invalid_argument);
  });
}

TEST(QuantFast, RowsRandomBitExact) {
  // Per target: 4 scale formats × RNE/SR8 × 1-D/2-D × 4 distributions, each on ~2.7·10^5
  // elements (so ≥ 10^6 per format, rounding and layout), with the current amax and with held
  // references that are too small (saturating scales) or too large.
  struct Shape {
    int64_t rows, cols;
    int block;
  };
  const Shape shapes[] = {{257, 1040, 16}, {129, 2071, 16}, {300, 900, 32}, {61, 4433, 16}};
  // Reference outputs are computed once and reused for every target.
  struct Case {
    std::vector<float> x;
    Shape sh;
    BlockQuantSpec spec;
    float g;
    std::vector<float> want;
  };
  std::vector<Case> cases;
  int k = 0;
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
          c.want.resize(c.x.size());
          quantize_dequantize(c.x.data(), sh.rows, sh.cols, c.spec, c.g,
                              r == Rounding::SR8 ? &kKey : nullptr, c.want.data());
          cases.push_back(std::move(c));
          ++k;
        }
  for_each_target([&](const std::string&) {
    size_t n = 0;
    for (const Case& c : cases) {
      // output offsets from a 64-byte boundary: aligned, glibc's 16 bytes, odd ones
      const size_t offsets[] = {0, 4, 1, 15, 8};
      AlignedOut out(c.x.size(), offsets[n++ % 5]);
      quantize_dequantize_fast(c.x.data(), c.sh.rows, c.sh.cols, c.spec, c.g,
                               c.spec.rounding == Rounding::SR8 ? &kKey : nullptr, out.data());
      const std::vector<float> got = out.vec();
      EXPECT_BITS_EQ(got, c.want, spec_str(c.spec) << " [" << c.sh.rows << ", " << c.sh.cols
                                                   << "] g=" << c.g);
    }
  });
}

TEST(QuantFast, TransposedRandomBitExact) {
  // Per target: 4 formats × RNE/SR8 × RHT on/off × 4 distributions on ~2.6·10^5 elements each.
  // Without RHT the token count need not be a multiple of 16 (ragged last block).
  struct Shape {
    int64_t rows, cols;
    int block;
  };
  const Shape rht_shapes[] = {{1024, 256, 16}, {512, 515, 16}, {256, 1030, 32}, {2048, 129, 16}};
  const Shape plain_shapes[] = {{1000, 257, 16}, {517, 503, 16}, {250, 1030, 32}, {2047, 131, 16}};
  struct Case {
    std::vector<float> x;
    Shape sh;
    BlockQuantSpec spec;
    float g;
    bool rht;
    std::vector<float> want;
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
          c.spec = make_spec(f, r, sh.block);
          const float amax = rht ? ref_amax_rht(c.x, sh.rows, sh.cols)
                                 : tensor_amax(c.x.data(), int64_t(c.x.size()));
          const float gmul[] = {1.f, 1.f, 1e-3f, 1e3f};
          c.g = std::min(amax * gmul[(k / 4) % 4], FLT_MAX);
          c.want = ref_transposed(c.x, sh.rows, sh.cols, c.spec, c.g,
                                  r == Rounding::SR8 ? &kKey : nullptr, rht);
          cases.push_back(std::move(c));
          ++k;
        }
  for_each_target([&](const std::string&) {
    size_t n = 0;
    for (const Case& c : cases) {
      // output offsets from a 64-byte boundary: aligned, glibc's 16 bytes, odd ones
      const size_t offsets[] = {0, 4, 1, 15, 8};
      AlignedOut out(c.x.size(), offsets[n++ % 5]);
      quantize_dequantize_transposed_fast(c.x.data(), c.sh.rows, c.sh.cols, c.spec, c.g,
                                          c.spec.rounding == Rounding::SR8 ? &kKey : nullptr,
                                          c.rht, out.data());
      const std::vector<float> got = out.vec();
      EXPECT_BITS_EQ(got, c.want, spec_str(c.spec) << (c.rht ? " RHT" : "") << " [" << c.sh.rows
                                                   << ", " << c.sh.cols << "] g=" << c.g);
    }
  });
}

TEST(QuantFast, TransposedSlowPathsBitExact) {
  // 2-D tiles of xᵀ and RHT with a block that is not a multiple of 16 take the composed path.
  const auto x = make_data(Dist::Normal, 96 * 70, 77);
  const float g = tensor_amax(x.data(), int64_t(x.size()));
  for_each_target([&](const std::string&) {
    for (Rounding r : kRoundings) {
      check_transposed(x, 96, 70, make_spec(ScaleFormat::UE5M3, r, 16, true), g, false, "2D");
      check_transposed(x, 96, 70, make_spec(ScaleFormat::E4M3, r, 8), ref_amax_rht(x, 96, 70),
                       true, "RHT block 8");
      check_transposed(x, 96, 70, make_spec(ScaleFormat::E4M3, r, 48), ref_amax_rht(x, 96, 70),
                       true, "RHT block 48");
    }
  });
}

TEST(QuantFast, AmaxRhtMatchesReference) {
  struct Case {
    std::vector<float> x;
    int64_t rows, cols;
    float want;
  };
  std::vector<Case> cases;
  int seed = 0;
  for (Dist d : kDists)
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{16, 1}, {32, 17}, {1024, 1000},
                              {4096, 257}}) {
      Case c{make_data(d, size_t(rows * cols), 900 + seed++), rows, cols, 0.f};
      c.want = ref_amax_rht(c.x, rows, cols);
      cases.push_back(std::move(c));
    }
  for_each_target([&](const std::string&) {
    for (const Case& c : cases) {
      EXPECT_EQ(std::bit_cast<uint32_t>(amax_rht16_transposed(c.x.data(), c.rows, c.cols)),
                std::bit_cast<uint32_t>(c.want))
          << "[" << c.rows << ", " << c.cols << "]";
    }
    const std::vector<float> x(15 * 4, 1.f);
    EXPECT_THROW(amax_rht16_transposed(x.data(), 15, 4), std::invalid_argument);
    EXPECT_EQ(amax_rht16_transposed(x.data(), 0, 4), 0.f);
  });
}

TEST(QuantFast, ExactTiesAtEveryGridPoint) {
  // Exact E2M1 ties and grid points at power-of-two and arbitrary block scales (tie_inputs).
  for (ScaleFormat f : kFormats) {
    for (Rounding r : kRoundings) {
      const TieInputs in = tie_inputs(f, r);
      const auto& [x, x2, rows, cols, g, g2, exact_hits] = in;
      EXPECT_GT(exact_hits, 400);
      for_each_target([&](const std::string&) {
        check_rows(x, rows, cols, make_spec(f, r, 16), g, "pow2 ties");
        check_rows(x, rows, cols, make_spec(f, r, 16, true), g, "pow2 ties 2D");
        check_rows(x2, int64_t(x2.size()) / 16, 16, make_spec(f, r, 16), g2, "exact ties");
        check_rows(x2, int64_t(x2.size()) / 64, 64, make_spec(f, r, 16), g2, "exact ties");
        check_transposed(x2, 64, int64_t(x2.size()) / 64, make_spec(f, r, 16), g2, false,
                         "exact ties transposed");
      });
    }
  }
}

TEST(QuantFast, SrThresholdsExact) {
  // With e_b = 1 (g = T·6, block amax 6), set y = lo + 1 − (2r+1)/512 exactly for the element's
  // own SR byte r (so δ + (2r+1)/512 == 1 exactly: rounds up), the floats one and two ulps below
  // and above it, and tiny scaled copies (the lo = 0 interval, where the FP32 sum δ + off itself
  // rounds). Covers every grid interval, both signs.
  const int64_t rows = 256, cols = 64;
  std::vector<uint8_t> r(size_t(rows * cols));
  sr_bytes(kKey, 0, uint64_t(rows * cols), r.data());
  std::vector<float> x(size_t(rows * cols));
  // start and ulp of each E2M1 interval: [0, .5), [.5, 1), [1, 1.5), [1.5, 2) ulp .5;
  // [2, 3), [3, 4) ulp 1; [4, 6) ulp 2
  const float los[] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f};
  const float ulps[] = {0.5f, 0.5f, 0.5f, 0.5f, 1.f, 1.f, 2.f};
  for (int64_t i = 0; i < rows * cols; ++i) {
    if (i % 16 == 0) {
      x[size_t(i)] = 6.f;  // block amax 6 → e_b = 1
      continue;
    }
    const int k = int(i % 7);
    const float delta = 1.f - float(2 * int(r[size_t(i)]) + 1) / 512.f;  // exact
    float y = los[k] + delta * ulps[k];                                    // exact
    switch ((i / 7) % 6) {
      case 0: break;                                   // δ + off == 1 exactly: up
      case 1: y = std::nextafter(y, 0.f); break;       // one ulp below: down
      case 2: y = std::nextafter(y, 10.f); break;      // one ulp above
      case 3: y = std::nextafter(std::nextafter(y, 0.f), 0.f); break;
      case 4: y = std::nextafter(std::nextafter(y, 10.f), 10.f); break;
      case 5: y = std::ldexp(y, -int(i % 40)); break;   // tiny: the lo = 0 interval, fine bits
    }
    x[size_t(i)] = (i % 5 == 0) ? -y : y;
  }
  const float g = 448.f * 6.f;
  for_each_target([&](const std::string&) {
    for (ScaleFormat f : kFormats) check_rows(x, rows, cols, make_spec(f, Rounding::SR8), g, "SR thresholds");
  });
}

TEST(QuantFast, RnaTiesExact) {
  // RNA (ties away) at every E2M1 half-way point, its FP32 neighbours and the lo = 0 interval's
  // fine bits (rna_tie_inputs), rows and transposed (with and without the RHT), both signs.
  const int64_t rows = 256, cols = 64;
  const std::vector<float> x = rna_tie_inputs(rows, cols);
  const float g = 448.f * 6.f;
  for_each_target([&](const std::string&) {
    for (ScaleFormat f : kFormats) {
      check_rows(x, rows, cols, make_spec(f, Rounding::RNA), g, "RNA ties");
      check_transposed(x, rows, cols, make_spec(f, Rounding::RNA), g, false, "RNA ties T");
      check_transposed(x, rows, cols, make_spec(f, Rounding::RNA), g, true, "RNA ties T RHT");
    }
  });
}

TEST(QuantFast, AdversarialBlocksAndShapes) {
  std::mt19937_64 rng(9);
  const auto inputs = adversarial_inputs(rng);
  const int64_t col_list[] = {1, 15, 16, 17, 33, 48};
  for_each_target([&](const std::string&) {
    for (const auto& [name, v] : inputs) {
      const float amax = tensor_amax(v.data(), int64_t(v.size()));
      const float gs[] = {amax, 0.f, 1e-38f, FLT_MIN, std::numeric_limits<float>::denorm_min(),
                          1e30f, FLT_MAX};
      for (ScaleFormat f : kFormats)
        for (Rounding r : kRoundings)
          for (float g : gs)
            for (int64_t cols : col_list) {
              const int64_t rows = std::min<int64_t>(int64_t(v.size()) / cols, 80);
              const std::vector<float> x(v.begin(), v.begin() + rows * cols);
              check_rows(x, rows, cols, make_spec(f, r, 16), g, name, size_t(cols % 7));
              check_rows(x, rows, cols, make_spec(f, r, 16, true), g, name + " 2D", 4);
              check_transposed(x, rows, cols, make_spec(f, r, 16), g, false, name + " T", size_t(cols % 5));
              if (rows % 16 == 0)
                check_transposed(x, rows, cols, make_spec(f, r, 16), g, true, name + " T RHT", 4);
            }
    }
    // 1×1 tensors, and odd block sizes
    for (float v : {0.f, -0.f, 1.f, -3.5f, 1e-45f, 3e38f}) {
      const std::vector<float> x{v};
      for (ScaleFormat f : kFormats)
        for (Rounding r : kRoundings) {
          for (float g : {std::fabs(v), 0.f, 1.f}) {
            check_rows(x, 1, 1, make_spec(f, r, 16), g, "1x1");
            check_rows(x, 1, 1, make_spec(f, r, 16, true), g, "1x1 2D");
            check_transposed(x, 1, 1, make_spec(f, r, 16), g, false, "1x1 T");
          }
        }
    }
    const auto x = make_data(Dist::Normal, 37 * 53, 5);
    const float g = tensor_amax(x.data(), int64_t(x.size()));
    for (int block : {1, 3, 7, 8, 20, 64, 100})
      for (Rounding r : kRoundings) {
        check_rows(x, 37, 53, make_spec(ScaleFormat::UE5M3, r, block), g, "odd block");
        check_rows(x, 37, 53, make_spec(ScaleFormat::E4M3, r, block, true), g, "odd block 2D");
        check_transposed(x, 37, 53, make_spec(ScaleFormat::UE8M0, r, block), g, false, "odd block T");
      }
  });
}

TEST(QuantFast, InPlaceAliasing) {
  const auto x = make_data(Dist::Cauchy, 100 * 77, 31);
  const float g = tensor_amax(x.data(), int64_t(x.size()));
  for_each_target([&](const std::string&) {
    for (bool two_d : {false, true})
      for (Rounding r : kRoundings) {
        const BlockQuantSpec s = make_spec(ScaleFormat::UE5M3, r, 16, two_d);
        std::vector<float> want(x.size()), io = x;
        quantize_dequantize(x.data(), 100, 77, s, g, &kKey, want.data());
        quantize_dequantize_fast(io.data(), 100, 77, s, g, &kKey, io.data());
        EXPECT_BITS_EQ(io, want, "in place " << spec_str(s));
        // 16-multiple rows in buffers at several alignments: the streaming-store paths in place
        std::vector<float> want2(96 * 64);
        quantize_dequantize(x.data(), 96, 64, s, g, &kKey, want2.data());
        for (size_t offset : {0, 4, 7}) {
          AlignedOut a(96 * 64, offset);
          std::copy(x.begin(), x.begin() + 96 * 64, a.data());
          quantize_dequantize_fast(a.data(), 96, 64, s, g, &kKey, a.data());
          EXPECT_BITS_EQ(a.vec(), want2, "in place, offset " << offset << " " << spec_str(s));
        }
      }
  });
}

TEST(QuantFast, NonFiniteInputsThrowLikeScalar) {
  for_each_target([&](const std::string&) {
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()}) {
      for (int64_t pos : {int64_t{0}, int64_t{17}, int64_t{4000}, int64_t{64 * 96 - 1}}) {
        auto x = make_data(Dist::Normal, 64 * 96, 3);
        x[size_t(pos)] = bad;
        std::string want_msg;
        try {
          tensor_amax(x.data(), int64_t(x.size()));
        } catch (const NonFiniteError& e) {
          want_msg = after_colon(e.what());
        }
        ASSERT_FALSE(want_msg.empty());
        try {
          amax_fast(x.data(), int64_t(x.size()));
          ADD_FAILURE() << "amax_fast did not throw";
        } catch (const NonFiniteError& e) {
          EXPECT_EQ(after_colon(e.what()), want_msg);
        }
        for (bool two_d : {false, true}) {
          const BlockQuantSpec s = make_spec(ScaleFormat::UE5M3, Rounding::SR8, 16, two_d);
          std::vector<float> out(x.size()), io = x;
          EXPECT_THROW(quantize_dequantize(x.data(), 64, 96, s, 1.f, &kKey, out.data()),
                       NonFiniteError);
          try {
            quantize_dequantize_fast(io.data(), 64, 96, s, 1.f, &kKey, io.data());  // in place too
            ADD_FAILURE() << "quantize_dequantize_fast did not throw";
          } catch (const NonFiniteError& e) {
            EXPECT_EQ(after_colon(e.what()), want_msg);
          }
        }
        for (bool rht : {false, true}) {
          std::vector<float> out(x.size());
          EXPECT_THROW(quantize_dequantize_transposed_fast(x.data(), 64, 96,
                                                           make_spec(ScaleFormat::E4M3, Rounding::RNE),
                                                           1.f, nullptr, rht, out.data()),
                       NonFiniteError);
        }
        EXPECT_THROW(amax_rht16_transposed(x.data(), 64, 96), NonFiniteError);
      }
    }
    // finite inputs whose RHT overflows: the reference throws too
    std::vector<float> x(16 * 4, 3e38f);
    std::vector<float> out(x.size());
    EXPECT_THROW(ref_amax_rht(x, 16, 4), NonFiniteError);
    EXPECT_THROW(amax_rht16_transposed(x.data(), 16, 4), NonFiniteError);
    EXPECT_THROW(quantize_dequantize_transposed_fast(x.data(), 16, 4, make_spec(ScaleFormat::E4M3, Rounding::RNE),
                                                     1.f, nullptr, true, out.data()),
                 NonFiniteError);
  });
}

TEST(QuantFast, BadArgumentsThrowLikeScalar) {
  const std::vector<float> x(64, 1.f);
  std::vector<float> out(64);
  const BlockQuantSpec ok = make_spec(ScaleFormat::UE5M3, Rounding::RNE);
  auto bad_block = ok;
  bad_block.block = 0;
  auto bad_t = ok;
  bad_t.target = 0.f;
  const auto sr = make_spec(ScaleFormat::UE5M3, Rounding::SR8);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto both_throw = [&](int64_t rows, int64_t cols, const BlockQuantSpec& s, float g, const SrKey* k) {
    EXPECT_THROW(quantize_dequantize(x.data(), rows, cols, s, g, k, out.data()), std::invalid_argument);
    EXPECT_THROW(quantize_dequantize_fast(x.data(), rows, cols, s, g, k, out.data()), std::invalid_argument);
    EXPECT_THROW(quantize_dequantize_transposed_fast(x.data(), cols, rows, s, g, k, false, out.data()),
                 std::invalid_argument);
  };
  both_throw(-1, 4, ok, 1.f, nullptr);
  both_throw(4, 4, bad_block, 1.f, nullptr);
  both_throw(4, 4, bad_t, 1.f, nullptr);
  both_throw(4, 4, ok, -1.f, nullptr);
  both_throw(4, 4, ok, nan, nullptr);
  both_throw(4, 4, ok, INFINITY, nullptr);
  both_throw(4, 4, sr, 1.f, nullptr);
  // RHT needs rows % 16 == 0
  EXPECT_THROW(quantize_dequantize_transposed_fast(x.data(), 8, 8, ok, 1.f, nullptr, true, out.data()),
               std::invalid_argument);
  // empty tensors are fine
  EXPECT_NO_THROW(quantize_dequantize_fast(x.data(), 0, 5, ok, 1.f, nullptr, out.data()));
  EXPECT_NO_THROW(quantize_dequantize_transposed_fast(x.data(), 0, 5, ok, 1.f, nullptr, true, out.data()));
  EXPECT_EQ(amax_fast(x.data(), 0), 0.f);
}

TEST(QuantFast, ThreadCountDoesNotChangeBits) {
  const auto x = make_data(Dist::Normal, 1024 * 272, 8);
  const float g = tensor_amax(x.data(), int64_t(x.size()));
  const float grht = ref_amax_rht(x, 1024, 272);
  const int saved = omp_get_max_threads();
  for_each_target([&](const std::string&) {
    std::vector<std::vector<float>> res;
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      std::vector<float> a(x.size()), b(x.size()), c(x.size()), d(x.size());
      quantize_dequantize_fast(x.data(), 1024, 272, make_spec(ScaleFormat::UE5M3, Rounding::SR8), g, &kKey, a.data());
      quantize_dequantize_fast(x.data(), 1024, 272, make_spec(ScaleFormat::E4M3, Rounding::SR8, 16, true), g, &kKey,
                               b.data());
      quantize_dequantize_transposed_fast(x.data(), 1024, 272, make_spec(ScaleFormat::UE5M3, Rounding::SR8), g,
                                          &kKey, false, c.data());
      quantize_dequantize_transposed_fast(x.data(), 1024, 272, make_spec(ScaleFormat::E4M3, Rounding::SR8), grht,
                                          &kKey, true, d.data());
      EXPECT_EQ(amax_fast(x.data(), int64_t(x.size())), g);
      EXPECT_EQ(amax_rht16_transposed(x.data(), 1024, 272), grht);
      a.insert(a.end(), b.begin(), b.end());
      a.insert(a.end(), c.begin(), c.end());
      a.insert(a.end(), d.begin(), d.end());
      res.push_back(std::move(a));
    }
    EXPECT_BITS_EQ(res[1], res[0], "2 vs 1 threads");
    EXPECT_BITS_EQ(res[2], res[0], "3 vs 1 threads");
  });
  omp_set_num_threads(saved);
}

namespace {
// Specs outside the SIMD path (other element formats, MX rules on spelled formats, spelled scale formats)
// must fall back to the scalar reference, so the fast entry points still match it bit for bit.
TEST(QuantFast, OtherFormatsFallBackToTheScalarReference) {
  std::mt19937 gen(11);
  std::normal_distribution<float> d;
  const int64_t rows = 33, cols = 48;
  std::vector<float> x(rows * cols);
  for (auto& v : x) v = d(gen);
  const float g = fp4::tensor_amax(x.data(), rows * cols);
  std::vector<fp4::BlockQuantSpec> specs(4);
  specs[0].element = fp4::parse_element_format("int4");
  specs[1].element = fp4::parse_element_format("e2m3");
  fp4::set_scale_format(specs[2], "ue6m0");  // MX rule on a spelled power-of-two format (MX
  specs[2].scale_rule = fp4::ScaleRule::MxTe;  // with UE8M0 runs SIMD: MxRulesBitExact)
  fp4::set_scale_format(specs[3], "ue4m3");
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_FALSE(fp4::quant_fast_supports(specs[i])) << i;
    std::vector<float> a(x.size()), b(x.size()), t(x.size()), c(x.size());
    fp4::quantize_dequantize(x.data(), rows, cols, specs[i], g, nullptr, a.data());
    fp4::quantize_dequantize_fast(x.data(), rows, cols, specs[i], g, nullptr, b.data());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "rows, spec " << i;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t cc = 0; cc < cols; ++cc) t[cc * rows + r] = x[r * cols + cc];
    fp4::quantize_dequantize(t.data(), cols, rows, specs[i], g, nullptr, a.data());
    fp4::quantize_dequantize_transposed_fast(x.data(), rows, cols, specs[i], g, nullptr, false,
                                             c.data());
    EXPECT_EQ(0, std::memcmp(a.data(), c.data(), a.size() * 4)) << "transposed, spec " << i;
  }
}
}  // namespace

// MXFP4 (mx-te / mx-ocp with UE8M0 scales) runs the SIMD path and matches the scalar
// mx_block_scale bit for bit: random data of every distribution, the TE boundary
// a_b = 1.5·2^A (and its neighbours), powers of two, zero / subnormal / huge blocks, 1-D and
// 2-D, blocks of 32 and 16 and odd ones, the quantize-transpose with and without the RHT.
TEST(QuantFast, MxRulesBitExact) {
  auto mx = [](ScaleRule rule, Rounding r, int block, bool two_d = false) {
    BlockQuantSpec s = make_spec(ScaleFormat::UE8M0, r, block, two_d);
    s.scale_rule = rule;
    return s;
  };
  for (ScaleRule rule : {ScaleRule::MxTe, ScaleRule::MxOcp})
    EXPECT_TRUE(quant_fast_supports(mx(rule, Rounding::RNE, 32)));
  BlockQuantSpec spelled = mx(ScaleRule::MxTe, Rounding::RNE, 32);
  set_scale_format(spelled, "ue6m0");
  EXPECT_FALSE(quant_fast_supports(spelled));  // spelled formats: scalar reference

  std::vector<std::pair<std::string, std::vector<float>>> inputs;
  for (Dist d : kDists) inputs.push_back({"dist", make_data(d, 96 * 70, 600 + int(d))});
  {
    // Block maxima exactly at, just below and just above 1.5·2^A, 2^A and 6·2^k, over a wide
    // range of A (including subnormal and near-FLT_MAX blocks); one block per 32 elements.
    std::vector<float> v(96 * 70, 0.f);
    std::mt19937 rng(4);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (size_t i = 0; i < v.size(); ++i) {
      const size_t blk = i / 32;
      const int A = int(blk % 260) - 140;  // 2^−140 .. 2^119
      const float base[] = {1.5f, 1.0f, 1.75f, 1.25f, 1.5f};
      float m = std::ldexp(base[blk % 5], A);
      if (blk % 7 == 1) m = std::nextafter(m, 0.f);
      if (blk % 7 == 2) m = std::nextafter(m, 1e38f);
      v[i] = i % 32 == 5 ? (blk % 2 ? -m : m) : u(rng) * m;
    }
    v[100] = 3.4e38f;
    inputs.push_back({"TE boundaries", v});
  }
  for_each_target([&](const std::string&) {
    for (const auto& [name, v] : inputs)
      for (ScaleRule rule : {ScaleRule::MxTe, ScaleRule::MxOcp})
        for (Rounding r : kRoundings) {
          const float g = tensor_amax(v.data(), int64_t(v.size()));  // unused by the MX rules
          check_rows(v, 96, 70, mx(rule, r, 32), g, name, 1);
          check_rows(v, 96, 70, mx(rule, r, 32, true), g, name + " 2D", 4);
          check_rows(v, 96, 70, mx(rule, r, 16), g, name + " b16", 0);
          check_rows(v, 96, 70, mx(rule, r, 7), g, name + " b7", 0);
          check_transposed(v, 96, 70, mx(rule, r, 32), g, false, name + " T", 3);
          check_transposed(v, 96, 70, mx(rule, r, 32), ref_amax_rht(v, 96, 70), true,
                           name + " T RHT", 0);
        }
  });
}

// ------------------------------------------------------------------------------------------
// The BF16 RHT (recipe key fp4.rht_precision = "bf16", docs/numerics.md "Random Hadamard
// transform"): the fused SIMD quantize-transpose and amax against the reference composition
// t = xᵀ; rht16_rows_bf16(t); quantize_dequantize(t).

namespace {

/// Inputs aimed at the BF16 roundings: FP32 values whose low 16 bits are BF16 ties (0x8000),
/// just below or above a tie, zero or random, over a wide exponent range (FP32 subnormals
/// included); and whole 16-token chunks a·(1, 2^-8, 0, …) (with random signs and positions),
/// whose transform lands exactly on BF16 midpoints (1 ± 2^-8), so the output rounding's ties
/// are hit, plus chunks of ±0 and −0.
std::vector<float> bf16_adversarial(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> x(size_t(rows * cols));
  const uint32_t lows[] = {0x8000u, 0x7FFFu, 0x8001u, 0x0000u, 0xFFFFu};
  for (auto& v : x) {
    const uint32_t sign = (rng() & 1u) << 31;
    const uint32_t field = 1 + rng() % 240;  // 2^-126 .. 2^113 (no overflow after the RHT)
    const uint32_t hi7 = rng() & 0x7Fu;
    const uint32_t low = rng() % 3 == 0 ? (rng() & 0xFFFFu) : lows[rng() % 5];
    uint32_t b = sign | (field << 23) | (hi7 << 16) | low;
    if (rng() % 20 == 0) b = sign | (rng() & 0xFFFFFu);  // FP32 subnormal
    v = std::bit_cast<float>(b);
  }
  // Column c, token chunk [16k, 16k + 16): structured chunks on every third (c, k).
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t k = 0; k < rows / 16; ++k) {
      const uint32_t pick = rng() % 6;
      if (pick > 1) continue;
      const float a = std::ldexp(1.f, int(rng() % 60) - 30) * ((rng() & 1) ? -1.f : 1.f);
      for (int i = 0; i < 16; ++i) x[size_t((16 * k + i) * cols + c)] = pick == 1 ? -0.f : 0.f;
      if (pick == 0) {
        const int p = int(rng() % 16), q = int((p + 1 + rng() % 15) % 16);
        x[size_t((16 * k + p) * cols + c)] = a;
        x[size_t((16 * k + q) * cols + c)] = a * std::ldexp(1.f, -8) * ((rng() & 1) ? -1.f : 1.f);
      }
    }
  return x;
}

}  // namespace

TEST(QuantFast, Bf16RhtBitExact) {
  struct Shape {
    int64_t rows, cols;
    int block;
  };
  // Fused path (block 16 or 32, ragged column counts) and the composed slow paths (block 8,
  // block 48: chunks straddle blocks; 2-D tiles of xᵀ).
  const Shape shapes[] = {{256, 64, 16}, {512, 37, 16}, {256, 130, 32}, {96, 70, 8}, {96, 70, 48}};
  struct Case {
    std::vector<float> x;
    Shape sh;
    BlockQuantSpec spec;
    float g;
    std::vector<float> want;
    float want_amax;
  };
  std::vector<Case> cases;
  int k = 0;
  for (ScaleFormat f : kFormats)
    for (Rounding r : kRoundings)
      for (int dist = 0; dist < 5; ++dist) {
        const Shape sh = shapes[k % 5];
        Case c;
        c.sh = sh;
        c.x = dist < 4 ? make_data(kDists[dist], size_t(sh.rows * sh.cols), 7100 + k)
                       : bf16_adversarial(sh.rows, sh.cols, 7100 + k);
        c.spec = make_spec(f, r, sh.block, k % 7 == 6);
        c.want_amax = ref_amax_rht(c.x, sh.rows, sh.cols, true);
        const float gmul[] = {1.f, 1.f, 1e-3f, 1e3f};
        c.g = std::min(c.want_amax * gmul[(k / 5) % 4], FLT_MAX);
        c.want = ref_transposed(c.x, sh.rows, sh.cols, c.spec, c.g,
                                r == Rounding::SR8 ? &kKey : nullptr, true, true);
        cases.push_back(std::move(c));
        ++k;
      }
  // The BF16 variant is a different function: on these inputs it must differ from the FP32 one.
  size_t differs = 0;
  for (const Case& c : cases)
    differs += ref_transposed(c.x, c.sh.rows, c.sh.cols, c.spec, c.g,
                              c.spec.rounding == Rounding::SR8 ? &kKey : nullptr, true) != c.want;
  EXPECT_GT(differs, cases.size() / 2);
  for_each_target([&](const std::string&) {
    size_t n = 0;
    for (const Case& c : cases) {
      const size_t offsets[] = {0, 4, 1, 15, 8};
      AlignedOut out(c.x.size(), offsets[n++ % 5]);
      quantize_dequantize_transposed_fast(c.x.data(), c.sh.rows, c.sh.cols, c.spec, c.g,
                                          c.spec.rounding == Rounding::SR8 ? &kKey : nullptr, true,
                                          RhtPrecision::BF16, out.data());
      const std::vector<float> got = out.vec();
      EXPECT_BITS_EQ(got, c.want, spec_str(c.spec) << " BF16 RHT [" << c.sh.rows << ", "
                                                   << c.sh.cols << "] g=" << c.g);
      EXPECT_EQ(std::bit_cast<uint32_t>(amax_rht16_transposed(c.x.data(), c.sh.rows, c.sh.cols,
                                                              RhtPrecision::BF16)),
                std::bit_cast<uint32_t>(c.want_amax))
          << "amax [" << c.sh.rows << ", " << c.sh.cols << "]";
    }
    // The FP32 precision of the new overloads is the old function, bit for bit.
    const Case& c = cases[0];
    AlignedOut a(c.x.size()), b(c.x.size());
    quantize_dequantize_transposed_fast(c.x.data(), c.sh.rows, c.sh.cols, c.spec, c.g, &kKey, true,
                                        RhtPrecision::FP32, a.data());
    quantize_dequantize_transposed_fast(c.x.data(), c.sh.rows, c.sh.cols, c.spec, c.g, &kKey, true,
                                        b.data());
    EXPECT_BITS_EQ(a.vec(), b.vec(), "FP32 overload");
    EXPECT_EQ(amax_rht16_transposed(c.x.data(), c.sh.rows, c.sh.cols, RhtPrecision::FP32),
              amax_rht16_transposed(c.x.data(), c.sh.rows, c.sh.cols));
    // Errors as the FP32 RHT: tokens not a multiple of 16; an input that rounds to BF16 Inf.
    const std::vector<float> bad(15 * 4, 1.f);
    EXPECT_THROW(amax_rht16_transposed(bad.data(), 15, 4, RhtPrecision::BF16), std::invalid_argument);
    std::vector<float> big(16 * 4, 1.f);
    big[5] = FLT_MAX;  // finite in FP32, +Inf in BF16
    EXPECT_THROW(amax_rht16_transposed(big.data(), 16, 4, RhtPrecision::BF16), NonFiniteError);
    AlignedOut o(big.size());
    EXPECT_THROW(quantize_dequantize_transposed_fast(big.data(), 16, 4,
                                                     make_spec(ScaleFormat::E4M3, Rounding::RNE),
                                                     1.f, nullptr, true, RhtPrecision::BF16, o.data()),
                 NonFiniteError);
  });
}

// ------------------------------------------------------------------------------------------
// Every block size a recipe accepts (fp4.block in 1..256) runs SIMD, also where a block is not
// a whole vector (8 on AVX-512, 4 on AVX2) or a vector does not hold whole blocks (12, 24):
// docs/numerics.md "Block sizes and the fast path". Rows (1-D and 2-D tiles) and the
// quantize-transpose (with and without the RHT), RNE and SR8, ragged edges, every target.
TEST(QuantFast, BlockSizesBitExact) {
  struct Shape {
    int64_t rows, cols;
  };
  const Shape shapes[] = {{96, 64}, {37, 53}, {64, 130}, {48, 200}};
  for_each_target([&](const std::string&) {
    int k = 0;
    for (int block : {8, 32, 4, 12, 24, 2, 40})
      for (Rounding r : kRoundings)
        for (const Shape& sh : shapes) {
          const Dist d = kDists[k % 4];
          const ScaleFormat f = kFormats[k % 4];
          const size_t offset = size_t(k % 5 == 4 ? 4 : 0);
          ++k;
          const auto x = make_data(d, size_t(sh.rows * sh.cols), 7000 + k);
          const float g = tensor_amax(x.data(), int64_t(x.size()));
          check_rows(x, sh.rows, sh.cols, make_spec(f, r, block), g, "block rows", offset);
          check_rows(x, sh.rows, sh.cols, make_spec(f, r, block, true), g, "block 2D", offset);
          check_transposed(x, sh.rows, sh.cols, make_spec(f, r, block), g, false, "block T",
                           offset);
          if (sh.rows % 16 == 0)
            check_transposed(x, sh.rows, sh.cols, make_spec(f, r, block),
                             ref_amax_rht(x, sh.rows, sh.cols), true, "block T RHT", offset);
        }
  });
}

// Blocks of 8 and 32 on the adversarial tensors (zero blocks, values at and above 6·d_b,
// one huge among tiny ones, subnormals), with the references that push scales to their ends.
TEST(QuantFast, BlockSizesAdversarial) {
  std::mt19937_64 rng(19);
  const auto inputs = adversarial_inputs(rng);
  for_each_target([&](const std::string&) {
    for (const auto& [name, v] : inputs) {
      const float amax = tensor_amax(v.data(), int64_t(v.size()));
      for (int block : {8, 32})
        for (ScaleFormat f : kFormats)
          for (Rounding r : kRoundings)
            for (float g : {amax, 0.f, 1e-38f, FLT_MAX})
              for (int64_t cols : {int64_t{8}, int64_t{17}, int64_t{48}}) {
                const int64_t rows = std::min<int64_t>(int64_t(v.size()) / cols, 64);
                const std::vector<float> x(v.begin(), v.begin() + rows * cols);
                const std::string what = name + " block " + std::to_string(block);
                check_rows(x, rows, cols, make_spec(f, r, block), g, what);
                check_rows(x, rows, cols, make_spec(f, r, block, true), g, what + " 2D");
                check_transposed(x, rows, cols, make_spec(f, r, block), g, false, what + " T");
              }
    }
  });
}

// A non-finite element in any block of 8 or 32 makes the fast quantizers throw the scalar
// reference's message (rows, 2-D tiles, in place, the quantize-transpose).
TEST(QuantFast, BlockSizesNonFiniteThrowLikeScalar) {
  for_each_target([&](const std::string&) {
    for (int block : {8, 32})
      for (int64_t pos : {int64_t{0}, int64_t{9}, int64_t{40 * 53 - 1}, int64_t{23 * 53 + 30}}) {
        auto x = make_data(Dist::Normal, 40 * 53, 3);
        x[size_t(pos)] = pos % 2 ? -std::numeric_limits<float>::infinity()
                                 : std::numeric_limits<float>::quiet_NaN();
        std::string want;
        try {
          tensor_amax(x.data(), int64_t(x.size()));
        } catch (const NonFiniteError& e) {
          want = after_colon(e.what());
        }
        ASSERT_FALSE(want.empty());
        for (bool two_d : {false, true}) {
          std::vector<float> io = x;
          try {
            quantize_dequantize_fast(io.data(), 40, 53,
                                     make_spec(ScaleFormat::UE5M3, Rounding::SR8, block, two_d),
                                     1.f, &kKey, io.data());
            ADD_FAILURE() << "no throw, block " << block << " pos " << pos;
          } catch (const NonFiniteError& e) {
            EXPECT_EQ(after_colon(e.what()), want) << "block " << block << " pos " << pos;
          }
        }
        std::vector<float> out(x.size());
        EXPECT_THROW(quantize_dequantize_transposed_fast(
                         x.data(), 40, 53, make_spec(ScaleFormat::E4M3, Rounding::RNE, block), 1.f,
                         nullptr, false, out.data()),
                     NonFiniteError);
      }
  });
}

// Large outputs with streaming stores forced, at blocks 8 and 24: the walks' whole-line stores
// (aligned, and assembled from two vectors on 16-lane targets when out is misaligned).
TEST(QuantFast, BlockSizesStreamingStores) {
  const auto x = make_data(Dist::Normal, 256 * 192, 23);
  const float g = tensor_amax(x.data(), int64_t(x.size()));
  for_each_target([&](const std::string&) {
    for (int block : {8, 24})
      for (Rounding r : kRoundings)
        for (size_t offset : {0, 4, 9}) {
          check_rows(x, 256, 192, make_spec(ScaleFormat::UE5M3, r, block), g, "stream rows",
                     offset);
          check_transposed(x, 256, 192, make_spec(ScaleFormat::UE5M3, r, block), g, false,
                           "stream T", offset);
        }
  });
}

// quant_fast_slow_path names the paths slower than the SIMD kernels, and only those: none for
// any block 1..256 of the supported formats (rows, 2-D tiles, the quantize-transpose, with the
// RHT wherever a recipe allows it: blocks of multiples of 16); the scalar reference for formats
// without a kernel; the composed quantize-transpose for 2-D tiles of xᵀ. The test hook forces
// one (docs/performance.md "Block sizes and the quantizer's fast path").
TEST(QuantFast, SlowPathNamesOnlySlowPaths) {
  for (int block = 1; block <= kMaxBlock; ++block)
    for (ScaleFormat f : kFormats) {
      const BlockQuantSpec s = make_spec(f, Rounding::SR8, block);
      EXPECT_EQ(quant_fast_slow_path(s, false, false), "") << spec_str(s);
      EXPECT_EQ(quant_fast_slow_path(make_spec(f, Rounding::RNE, block, true), false, false), "");
      EXPECT_EQ(quant_fast_slow_path(s, true, false), "") << spec_str(s);
      if (block % 16 == 0) {
        EXPECT_EQ(quant_fast_slow_path(s, true, true), "") << spec_str(s);
      }
    }
  EXPECT_EQ(quant_fast_slow_path(make_spec(ScaleFormat::UE5M3, Rounding::RNE, 8), true, true), "");
  BlockQuantSpec ue4m3 = make_spec(ScaleFormat::UE5M3, Rounding::RNE);
  set_scale_format(ue4m3, "ue4m3");
  EXPECT_EQ(quant_fast_slow_path(ue4m3, false, false),
            "scalar reference quantizer (scale format ue4m3 has no SIMD kernel)");
  BlockQuantSpec int4 = make_spec(ScaleFormat::UE5M3, Rounding::RNE);
  int4.element = parse_element_format("int4");
  EXPECT_NE(quant_fast_slow_path(int4, true, false).find("element format int4"), std::string::npos);
  EXPECT_NE(quant_fast_slow_path(make_spec(ScaleFormat::E4M3, Rounding::RNE, 16, true), true, false)
                .find("composed quantize-transpose"),
            std::string::npos);
  EXPECT_NE(quant_fast_slow_path(make_spec(ScaleFormat::E4M3, Rounding::RNE, 17), true, true)
                .find("straddle tiles of block 17"),
            std::string::npos);
  quant_fast_force_slow_path(true);
  EXPECT_EQ(quant_fast_slow_path(make_spec(ScaleFormat::UE5M3, Rounding::RNE), false, false),
            "scalar reference quantizer (forced by a test hook)");
  quant_fast_force_slow_path(false);
  EXPECT_EQ(quant_fast_slow_path(make_spec(ScaleFormat::UE5M3, Rounding::RNE), false, false), "");
}

// ------------------------------------------------------------------------------------------
// Hadamard transforms of 16..128 points and any signs (docs/numerics.md "Random Hadamard
// transform", "Sizes, roles and sign policies"): the quantize-transpose and its amax against
// the reference composition (transpose, hadamard_rows, quantize_dequantize), bit for bit, on
// every target, random and adversarial inputs, RNE and SR8, both precisions; 16 points with
// per-step signs run the fused kernel, larger sizes the composed path.
TEST(QuantFast, HadamardTransposedBitExact) {
  struct Case {
    std::vector<float> x;
    int64_t rows, cols;
    BlockQuantSpec spec;
    HadamardTransform h;
    float g;
    std::vector<float> want;
    float want_amax;
  };
  std::vector<Case> cases;
  int k = 0;
  for (int n : {16, 32, 64, 128})
    for (RhtPrecision p : {RhtPrecision::FP32, RhtPrecision::BF16})
      for (int dist = 0; dist < 5; ++dist) {
        Case c;
        c.rows = 256;
        c.cols = 37 + 16 * (k % 3);
        c.x = dist < 4 ? make_data(kDists[dist], size_t(c.rows * c.cols), 8100 + k)
                       : bf16_adversarial(c.rows, c.cols, 8100 + k);
        c.spec = make_spec(kFormats[k % 4], kRoundings[k % 2], k % 3 == 2 ? 32 : 16);
        c.h = HadamardTransform::make(n, k % 2 ? HadamardSigns::PerStep : HadamardSigns::PerLayer,
                                      p, 11, uint32_t(k), 5);
        std::vector<float> t(c.x.size());
        for (int64_t r = 0; r < c.rows; ++r)
          for (int64_t j = 0; j < c.cols; ++j) t[size_t(j * c.rows + r)] = c.x[size_t(r * c.cols + j)];
        hadamard_rows(t.data(), c.cols, c.rows, c.h);
        c.want_amax = tensor_amax(t.data(), int64_t(t.size()));
        const float gmul[] = {1.f, 1.f, 1e-3f, 1e3f};
        c.g = std::min(c.want_amax * gmul[(k / 5) % 4], FLT_MAX);
        const SrKey* key = c.spec.rounding == Rounding::SR8 ? &kKey : nullptr;
        c.want.resize(t.size());
        quantize_dequantize(t.data(), c.cols, c.rows, c.spec, c.g, key, c.want.data());
        cases.push_back(std::move(c));
        ++k;
      }
  for_each_target([&](const std::string&) {
    size_t i = 0;
    for (const Case& c : cases) {
      const size_t offsets[] = {0, 4, 1};
      AlignedOut out(c.x.size(), offsets[i++ % 3]);
      quantize_dequantize_transposed_fast(c.x.data(), c.rows, c.cols, c.spec, c.g,
                                          c.spec.rounding == Rounding::SR8 ? &kKey : nullptr, &c.h,
                                          out.data());
      EXPECT_BITS_EQ(out.vec(), c.want, spec_str(c.spec) << " n=" << c.h.n << " "
                                                         << rht_precision_name(c.h.precision));
      EXPECT_EQ(std::bit_cast<uint32_t>(amax_hadamard_transposed(c.x.data(), c.rows, c.cols, c.h)),
                std::bit_cast<uint32_t>(c.want_amax))
          << "amax n=" << c.h.n;
    }
  });
  // The te16 transform is the rht = true path; rows not a multiple of n are refused.
  const Case& c = cases[0];
  const HadamardTransform te = HadamardTransform::te16();
  AlignedOut a(c.x.size()), b(c.x.size());
  quantize_dequantize_transposed_fast(c.x.data(), c.rows, c.cols, c.spec, c.g, &kKey, &te, a.data());
  quantize_dequantize_transposed_fast(c.x.data(), c.rows, c.cols, c.spec, c.g, &kKey, true, b.data());
  EXPECT_BITS_EQ(a.vec(), b.vec(), "te16");
  const HadamardTransform h64 = HadamardTransform::make(64, HadamardSigns::Fixed, RhtPrecision::FP32, 0, 0, 0);
  AlignedOut o(96 * 4);
  const std::vector<float> x96(96 * 4, 1.f);
  EXPECT_THROW(quantize_dequantize_transposed_fast(x96.data(), 96, 4, c.spec, 1.f, nullptr, &h64, o.data()),
               std::invalid_argument);
  EXPECT_THROW(amax_hadamard_transposed(x96.data(), 96, 4, h64), std::invalid_argument);
  // Slow paths are named: larger transforms of the transposed operand, every dgrad transform.
  const BlockQuantSpec s = make_spec(ScaleFormat::E4M3, Rounding::SR8);
  EXPECT_EQ(quant_fast_slow_path(s, true, true, 16), "");
  EXPECT_NE(quant_fast_slow_path(s, true, true, 64).find("64-point hadamard_rows"), std::string::npos);
  EXPECT_NE(quant_fast_slow_path(s, false, true, 16).find("separate Hadamard pass"), std::string::npos);
  EXPECT_EQ(quant_fast_slow_path(s, false, false, 128), "");
}
