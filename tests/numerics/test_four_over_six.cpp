// Four Over Six (4/6) block-scale selection (docs/numerics.md "Four Over Six"; Cook et al.,
// arXiv 2512.02010; Transformer Engine's NVFP4BlockScaling nvfp4_4over6): hand-computed blocks,
// the fused and two-step scalar paths, the fast entry points (which route 4/6 to the scalar
// reference and name it as a slow path), and an independent transcription of Transformer
// Engine's published algorithm, compared bit for bit for E4M3 scales.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "fp4/numerics/block_quant.h"
#include "fp4/numerics/pack_fast.h"
#include "fp4/numerics/qtensor.h"
#include "fp4/numerics/quant_fast.h"
#include "support/quant_test_inputs.h"

using namespace fp4;
using namespace fp4::testing;

namespace {

/// E4M3 scales, T = 256 and g = 1536: ge = (256·6)/1536 = 1 and the 4/6 error's
/// v = q·c·1536/1536 = q·c exactly, so every error below is in the input's own units.
BlockQuantSpec hand_spec(FourOverSix mode) {
  BlockQuantSpec s;
  s.scale_format = ScaleFormat::E4M3;
  s.target = 256.f;
  s.four_over_six = mode;
  return s;
}

/// The block scale 4/6 picks for one 16-long block (the rest zero) under `mode`.
float picked_scale(std::vector<float> block, FourOverSix mode) {
  block.resize(16, 0.f);
  return quantize_blocks(block.data(), 1, 16, hand_spec(mode), 1536.f, nullptr).scales[0];
}

std::vector<float> qdq(const std::vector<float>& x, int64_t rows, int64_t cols,
                       const BlockQuantSpec& s, float g, const SrKey* sr) {
  std::vector<float> out(x.size());
  quantize_dequantize(x.data(), rows, cols, s, g, sr, out.data());
  return out;
}

std::vector<float> two_step(const std::vector<float>& x, int64_t rows, int64_t cols,
                            const BlockQuantSpec& s, float g, const SrKey* sr) {
  std::vector<float> out(x.size());
  dequantize(quantize_blocks(x.data(), rows, cols, s, g, sr), out.data());
  return out;
}

}  // namespace

// Amax 6 → map-to-6 scale c6 = 6/6 = 1 (grid ±{0, .5, 1, 1.5, 2, 3, 4, 6}), map-to-4 scale
// c4 = 1.5 (grid ·1.5: {0, .75, 1.5, 2.25, 3, 4.5, 6, 9}).
TEST(FourOverSix, HandComputedBlocks) {
  // {6, 5, 1, 1, 1, 1}: c6 makes one big error (5 → 4 by RNE, |e| = 1), c4 four small ones
  // (5 → 4.5: .5; each 1 → .75: .25). MAE: 1 vs .5 + 4·.25 = 1.5, 6 wins; MSE: 1 vs
  // .25 + 4·.0625 = .5, 4 wins.
  const std::vector<float> big_vs_small = {6, 5, 1, 1, 1, 1};
  EXPECT_EQ(picked_scale(big_vs_small, FourOverSix::MAE), 1.0f);
  EXPECT_EQ(picked_scale(big_vs_small, FourOverSix::MSE), 1.5f);
  // {6, 1, 1, 2, .5}: exact on c6's grid (error 0), not on c4's → 6 under both.
  for (FourOverSix m : {FourOverSix::MAE, FourOverSix::MSE})
    EXPECT_EQ(picked_scale({6, 1, 1, 2, .5f}, m), 1.0f);
  // {6, 4.5, 3}: 4.5 → 4 under c6 (tie, RNE to the even code; error .5), exact under c4.
  for (FourOverSix m : {FourOverSix::MAE, FourOverSix::MSE})
    EXPECT_EQ(picked_scale({6, 4.5f, 3}, m), 1.5f);
  // Ties keep map-to-6, as Transformer Engine's err_map4 < err_map6: {6} alone (both 0), and
  // {6, 5.25}: c6 rounds 5.25 → 6, c4 rounds 5.25·fl(1/1.5) = 3.5 → 4 (RNE), i.e. 6 — both .75.
  for (FourOverSix m : {FourOverSix::MAE, FourOverSix::MSE}) {
    EXPECT_EQ(picked_scale({6}, m), 1.0f);
    EXPECT_EQ(picked_scale({6, 5.25f}, m), 1.0f);
  }
  // Off: the contract's single scale, whatever the block.
  EXPECT_EQ(picked_scale(big_vs_small, FourOverSix::Off), 1.0f);
  // Amax at g under T = 448 (no headroom): c4 = min(1.5·448, 448) = 448 = c6, a tie → 6.
  BlockQuantSpec s = hand_spec(FourOverSix::MSE);
  s.target = 448.f;
  std::vector<float> edge(16, 0.f);
  edge[0] = 1536.f, edge[1] = 1200.f;
  EXPECT_EQ(quantize_blocks(edge.data(), 1, 16, s, 1536.f, nullptr).scales[0], 448.f);
}

// The candidates' base is fl(fl(a_b / 6)·ge), Transformer Engine's order, not the contract's
// a_b·fl(ge·fl(1/6)): the search finds blocks where the two orders round to different scales
// (map-to-6), and the quantizer must pick one of the first order's candidates.
TEST(FourOverSix, OperationOrderOfCandidateScales) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> ug(100.f, 4000.f);
  for (ScaleFormat f : {ScaleFormat::E4M3, ScaleFormat::UE5M3}) {
    const FloatFormat& sf = scale_format_desc(f);
    auto cand = [&](float v) {
      const float c = round_magnitude(std::min(v, sf.max_finite), sf, Rounding::RNE);
      return c == 0.f ? 1.f : c;
    };
    int found = 0;
    // Scan the floats a_b around 6·m/ge for midpoints m = 9.5·2^k of the scale grid (both
    // formats have 3 fraction bits: 9, 10 → 9.5; E4M3 up to 448).
    for (int it = 0; it < 2000 && found < 20; ++it) {
      const float g = ug(rng), T = 256.f;
      const float ge = std::min((T * 6.f) / g, FLT_MAX);
      const float m = std::ldexp(9.5f, it % 5 - 3);
      float a = 6.f * m / ge;
      for (int k = 0; k < 32; ++k) a = std::nextafter(a, 0.f);
      for (int k = 0; k < 64 && found < 20; ++k, a = std::nextafter(a, FLT_MAX)) {
        if (a > g) break;
        const float te = (a / 6.f) * ge, alt = a * (ge * (1.f / 6.f));
        const float t6 = cand(te), t4 = cand(te * 1.5f), a6 = cand(alt);
        if (a6 == t6 || a6 == t4) continue;  // the other order's map-to-6 is neither candidate
        ++found;
        BlockQuantSpec s = hand_spec(FourOverSix::MAE);
        s.scale_format = f;
        std::vector<float> x(16, 0.f);
        x[0] = a, x[1] = a / 6.f, x[2] = a / 3.f;  // near 6, 1, 2 of map-to-6's grid: 6 wins
        const float c = quantize_blocks(x.data(), 1, 16, s, g, nullptr).scales[0];
        ASSERT_TRUE(c == t6 || c == t4) << "a " << a << " g " << g << " got " << c;
      }
    }
    EXPECT_GT(found, 0) << scale_format_name(f);
  }
}

TEST(FourOverSix, ParseNamesAndErrors) {
  for (FourOverSix m : {FourOverSix::Off, FourOverSix::MAE, FourOverSix::MSE})
    EXPECT_EQ(parse_four_over_six(four_over_six_name(m)), m);
  EXPECT_THROW(parse_four_over_six("MAE"), std::invalid_argument);
  // MX rules have no tensor scale: refused.
  BlockQuantSpec s = hand_spec(FourOverSix::MAE);
  s.scale_format = ScaleFormat::UE8M0;
  s.scale_rule = ScaleRule::MxTe;
  std::vector<float> x(16, 1.f);
  EXPECT_THROW(quantize_blocks(x.data(), 1, 16, s, 1.f, nullptr), std::invalid_argument);
  EXPECT_THROW(quantize_dequantize_fast(x.data(), 1, 16, s, 1.f, nullptr, x.data()),
               std::invalid_argument);
}

// The fused quantizer equals dequantize(quantize_blocks) bit for bit, for every scale format,
// element format, rounding, 1-D and 2-D, ragged shapes, held and current references.
TEST(FourOverSix, FusedMatchesTwoStepBitForBit) {
  const ElementFormat elems[] = {ElementFormat{}, parse_element_format("e2m3"),
                                 parse_element_format("int4")};
  for (FourOverSix m : {FourOverSix::MAE, FourOverSix::MSE})
    for (ScaleFormat f : {ScaleFormat::UE5M3, ScaleFormat::E4M3, ScaleFormat::UE8M0})
      for (const ElementFormat& ef : elems)
        for (Rounding r : kRoundings)
          for (bool two_d : {false, true})
            for (Dist d : kDists) {
              const int64_t rows = 37, cols = 53;
              const auto x = make_data(d, rows * cols, 17 + int(d));
              BlockQuantSpec s = make_spec(f, r, 16, two_d);
              s.element = ef;
              s.four_over_six = m;
              const float amax = tensor_amax(x.data(), rows * cols);
              for (float g : {amax, amax * 0.25f, amax * 50.f}) {
                const auto a = qdq(x, rows, cols, s, g, &kKey);
                const auto b = two_step(x, rows, cols, s, g, &kKey);
                ASSERT_EQ(first_diff(a, b), -1) << spec_str(s) << " " << ef.name() << " g " << g;
              }
            }
}

// 4/6 changes the scales of some blocks (and only ever to c4 or c6).
TEST(FourOverSix, PicksBothCandidatesOnRandomData) {
  const int64_t rows = 64, cols = 256;
  const auto x = make_data(Dist::Normal, rows * cols, 5);
  BlockQuantSpec s = make_spec(ScaleFormat::E4M3, Rounding::RNE);
  s.target = 256.f;
  s.four_over_six = FourOverSix::MSE;
  const float g = tensor_amax(x.data(), rows * cols);
  const QuantizedTensor q = quantize_blocks(x.data(), rows, cols, s, g, nullptr);
  int n4 = 0, n6 = 0;
  for (size_t b = 0; b < q.scales.size(); ++b) {
    const float base = (q.block_amax[b] / 6.f) * q.ge;
    const float c6 = round_magnitude(std::min(base, 448.f), scale_format_desc(ScaleFormat::E4M3),
                                     Rounding::RNE);
    const float c4 = round_magnitude(std::min(base * 1.5f, 448.f),
                                     scale_format_desc(ScaleFormat::E4M3), Rounding::RNE);
    ASSERT_TRUE(q.scales[b] == c6 || q.scales[b] == c4) << b;
    n4 += q.scales[b] == c4 && c4 != c6;
    n6 += q.scales[b] == c6 && c4 != c6;
  }
  EXPECT_GT(n4, 20);
  EXPECT_GT(n6, 20);
}

// The fast entry points equal the scalar reference bit for bit on every SIMD target: the row
// kernel has a 4/6 twin (1-D and 2-D), the quantize-transpose composes the transpose (and RHT:
// 4/6 + RHT is allowed) with it, the packer packs the scalar quantization; the last two are
// named as slow paths.
TEST(FourOverSix, FastPathsEqualTheScalarReference) {
  const int64_t rows = 48, cols = 80;
  const auto x = make_data(Dist::Normal, rows * cols, 9);
  for (const std::string& t : quant_fast_targets()) {
    quant_fast_use_target(t);
    for (FourOverSix m : {FourOverSix::MAE, FourOverSix::MSE})
      for (ScaleFormat f : {ScaleFormat::UE5M3, ScaleFormat::E4M3})
        for (Rounding r : kRoundings)
          for (bool two_d : {false, true}) {
            BlockQuantSpec s = make_spec(f, r, 16, two_d);
            s.four_over_six = m;
            EXPECT_TRUE(quant_fast_supports(s));
            EXPECT_EQ(quant_fast_slow_path(s, false, false), "");
            EXPECT_NE(pack_fast_slow_path(s).find("Four Over Six"), std::string::npos);
            const float g = tensor_amax(x.data(), rows * cols);
            std::vector<float> fast(x.size());
            quantize_dequantize_fast(x.data(), rows, cols, s, g, &kKey, fast.data());
            ASSERT_EQ(first_diff(fast, qdq(x, rows, cols, s, g, &kKey)), -1) << t << spec_str(s);
            if (two_d) continue;
            EXPECT_NE(quant_fast_slow_path(s, true, true).find("Four Over Six"), std::string::npos);
            for (bool rht : {false, true}) {
              std::vector<float> tr(x.size());
              for (int64_t i = 0; i < rows; ++i)
                for (int64_t j = 0; j < cols; ++j) tr[j * rows + i] = x[i * cols + j];
              if (rht) rht16_rows(tr.data(), cols, rows);
              const float gt = tensor_amax(tr.data(), rows * cols);
              std::vector<float> got(x.size());
              quantize_dequantize_transposed_fast(x.data(), rows, cols, s, gt, &kKey, rht,
                                                  got.data());
              ASSERT_EQ(first_diff(got, qdq(tr, cols, rows, s, gt, &kKey)), -1)
                  << t << spec_str(s) << " rht " << rht;
            }
            const QTensor packed = quantize_pack_fast(x.data(), rows, cols, s, g, &kKey);
            const QTensor ref = pack(quantize_blocks(x.data(), rows, cols, s, g, &kKey));
            EXPECT_EQ(packed.packed, ref.packed) << t << spec_str(s);
            EXPECT_EQ(packed.scale_codes, ref.scale_codes) << t << spec_str(s);
          }
  }
  quant_fast_use_target("");
}

namespace {
std::vector<float> te_inputs(int rows, int cols, uint64_t seed);
}  // namespace

// The row kernel's 4/6 twin against the scalar reference, bit for bit, on every target: random
// data of four distributions and adversarial blocks (grid points and midpoints, candidate
// ties, zeros, outliers, constant blocks), block sizes that are and are not whole vectors,
// ragged shapes, 1-D and 2-D, RNE and SR8, every scale format of the kernel, held, current
// and zero references.
TEST(FourOverSix, RowKernelTwinBitExact) {
  const int64_t shapes[][2] = {{37, 53}, {32, 128}, {5, 7}};
  for (const std::string& t : quant_fast_targets()) {
    quant_fast_use_target(t);
    for (int block : {2, 8, 12, 16, 24, 32})
      for (FourOverSix m : {FourOverSix::MAE, FourOverSix::MSE})
        for (ScaleFormat f : kFormats)
          for (Rounding r : kRoundings)
            for (bool two_d : {false, true})
              for (int data = 0; data < 5; ++data)
                for (const auto& sh : shapes) {
                  const int64_t rows = sh[0], cols = sh[1];
                  if (data == 4 && cols % 16 != 0) continue;
                  const std::vector<float> x =
                      data < 4 ? make_data(kDists[data], rows * cols, 100 + data + block)
                               : te_inputs(int(rows), int(cols), 7 + block);
                  BlockQuantSpec s = make_spec(f, r, block, two_d);
                  s.four_over_six = m;
                  const float amax = tensor_amax(x.data(), rows * cols);
                  for (float g : {amax, amax * 0.3f, amax * 20.f, 0.f}) {
                    std::vector<float> fast(x.size());
                    quantize_dequantize_fast(x.data(), rows, cols, s, g, &kKey, fast.data());
                    const auto ref = qdq(x, rows, cols, s, g, &kKey);
                    ASSERT_EQ(first_diff(fast, ref), -1)
                        << t << " " << spec_str(s) << " " << four_over_six_name(m) << " data "
                        << data << " shape " << rows << "x" << cols << " g " << g;
                  }
                }
  }
  quant_fast_use_target("");
}

// Work is split per block-row: the bits do not depend on the thread count (both paths).
TEST(FourOverSix, ThreadCountDoesNotChangeBits) {
  const int64_t rows = 256, cols = 256;  // above the parallel threshold
  const auto x = make_data(Dist::Cauchy, rows * cols, 21);
  for (bool two_d : {false, true}) {
    BlockQuantSpec s = make_spec(ScaleFormat::E4M3, Rounding::SR8, 16, two_d);
    s.four_over_six = FourOverSix::MSE;
    const float g = tensor_amax(x.data(), rows * cols);
    std::vector<float> a(x.size()), b(x.size()), c(x.size()), d(x.size());
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    quantize_dequantize(x.data(), rows, cols, s, g, &kKey, a.data());
    quantize_dequantize_fast(x.data(), rows, cols, s, g, &kKey, c.data());
    omp_set_num_threads(4);
    quantize_dequantize(x.data(), rows, cols, s, g, &kKey, b.data());
    quantize_dequantize_fast(x.data(), rows, cols, s, g, &kKey, d.data());
    omp_set_num_threads(saved);
    EXPECT_EQ(first_diff(a, b), -1) << two_d;
    EXPECT_EQ(first_diff(c, d), -1) << two_d;
    EXPECT_EQ(first_diff(a, c), -1) << two_d;
  }
}

// --------------------------------------------------------------------------------------------
// An independent transcription of Transformer Engine's 4/6 quantizer (written from its
// published algorithm: transformer_engine/pytorch/custom_recipes/reference_nvfp4.py
// `_quantize_blockwise_4over6_reference` and common/cast/nvfp4 quantize_4over6_nvfp4.cuh), in
// plain FP32 as TE computes it. E2M1 elements, E4M3 block scales, 1×16 blocks or 16×16 tiles.
namespace te46 {

/// RNE onto E4M3 (bias 7, 3 fraction bits, subnormal quantum 2^-9) of v in [0, 448].
float to_e4m3(float v) {
  if (v == 0.f) return 0.f;
  const int e = std::max(std::ilogb(v), -6);
  const double quantum = std::ldexp(1.0, e - 3);
  return static_cast<float>(std::nearbyint(v / quantum) * quantum);  // exact in double
}

/// E2M1 value of a clamped |v| ≤ 6 by the nearest-even thresholds of TE's cast_to_fp4x2.
float e2m1(float v) {
  const float a = std::fabs(v);
  float m;
  if (a <= 0.25f) m = 0.f;
  else if (a < 0.75f) m = 0.5f;
  else if (a <= 1.25f) m = 1.f;
  else if (a < 1.75f) m = 1.5f;
  else if (a <= 2.5f) m = 2.f;
  else if (a < 3.5f) m = 3.f;
  else if (a <= 5.f) m = 4.f;
  else m = 6.f;
  return v < 0 ? -m : m;
}

struct Result {
  std::vector<float> scale;  ///< chosen E4M3 block scale per block
  std::vector<float> q;      ///< chosen E2M1 value per element
};

/// x [rows, cols], cols % 16 == 0 (and rows % 16 == 0 for tiles); g > 0 the tensor amax;
/// e4m3_max 448 or 256 (nvfp4_4over6_e4m3_use_256); mse picks the error mode.
Result quantize(const std::vector<float>& x, int rows, int cols, float g, float e4m3_max,
                bool mse, bool tiles) {
  const float s_enc = std::min((e4m3_max * 6.f) / g, FLT_MAX);
  const float s_dec = 1.f / s_enc;
  const float denom = 6.f * e4m3_max;
  const int ty = tiles ? 16 : 1, nbr = rows / ty, nbc = cols / 16;
  Result res{std::vector<float>(size_t(nbr) * nbc), std::vector<float>(x.size())};
  for (int br = 0; br < nbr; ++br)
    for (int bc = 0; bc < nbc; ++bc) {
      float amax = 0.f;
      for (int r = br * ty; r < (br + 1) * ty; ++r)
        for (int c = bc * 16; c < bc * 16 + 16; ++c) amax = std::max(amax, std::fabs(x[r * cols + c]));
      const float base = amax / 6.f * s_enc;
      const float sf[2] = {to_e4m3(std::min(base * 1.5f, 448.f)), to_e4m3(std::min(base, 448.f))};
      float err[2] = {0.f, 0.f};
      std::vector<float> cand[2];
      for (int k = 0; k < 2; ++k) {
        const float enc = std::min(1.f / (sf[k] * s_dec), FLT_MAX);
        for (int r = br * ty; r < (br + 1) * ty; ++r) {
          float row_err = 0.f;  // each row of a tile first, as TE's per-thread partials
          for (int c = bc * 16; c < bc * 16 + 16; ++c) {
            const float xv = x[r * cols + c];
            const float q = e2m1(std::clamp(xv * enc, -6.f, 6.f));
            cand[k].push_back(q);
            const float diff = q * sf[k] * g / denom - xv;
            row_err = row_err + (mse ? diff * diff : std::fabs(diff));
          }
          err[k] = err[k] + row_err;
        }
      }
      const int pick = err[0] < err[1] ? 0 : 1;
      res.scale[size_t(br) * nbc + bc] = sf[pick];
      size_t i = 0;
      for (int r = br * ty; r < (br + 1) * ty; ++r)
        for (int c = bc * 16; c < bc * 16 + 16; ++c) res.q[size_t(r) * cols + c] = cand[pick][i++];
    }
  return res;
}

}  // namespace te46

namespace {

/// Random rows plus adversarial blocks: exact grid points and midpoints at several scales,
/// zeros, one outlier per block, blocks at the tensor amax, constant blocks.
std::vector<float> te_inputs(int rows, int cols, uint64_t seed) {
  std::vector<float> x = make_data(Dist::Normal, size_t(rows) * cols, seed);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> pick(0, 15), kind(0, 5);
  const float grid[] = {0.f, .25f, .5f, .75f, 1.f, 1.25f, 1.5f, 1.75f, 2.f, 2.5f, 3.f, 3.5f,
                        4.f, 5.f, 6.f, 4.5f};
  for (int r = 0; r < rows; ++r)
    for (int bc = 0; bc < cols / 16; ++bc) {
      float* b = &x[size_t(r) * cols + bc * 16];
      switch (kind(rng)) {
        case 0:  // grid points and midpoints, amax 6 at a power-of-two scale
          for (int i = 0; i < 16; ++i) b[i] = grid[pick(rng)] * (pick(rng) < 8 ? 1.f : -1.f);
          b[0] = 6.f;
          for (int i = 0; i < 16; ++i) b[i] = std::ldexp(b[i], r % 5 - 2);
          break;
        case 1: std::fill(b, b + 16, 0.f); break;
        case 2: b[pick(rng)] *= 40.f; break;  // outlier (and often the tensor amax)
        case 3: std::fill(b, b + 16, b[0]); break;
        default: break;
      }
    }
  return x;
}

}  // namespace

TEST(FourOverSix, MatchesAnIndependentTranscriptionOfTransformerEngine) {
  for (bool tiles : {false, true})
    for (bool mse : {false, true})
      for (float e4m3_max : {256.f, 448.f})
        for (uint64_t seed : {1u, 2u, 3u}) {
          const int rows = 64, cols = 128;
          const auto x = te_inputs(rows, cols, seed);
          const float amax = tensor_amax(x.data(), size_t(rows) * cols);
          for (float g : {amax, amax * 0.5f, amax * 4.f}) {
            const te46::Result te = te46::quantize(x, rows, cols, g, e4m3_max, mse, tiles);
            BlockQuantSpec s = make_spec(ScaleFormat::E4M3, Rounding::RNE, 16, tiles);
            s.target = e4m3_max;
            s.four_over_six = mse ? FourOverSix::MSE : FourOverSix::MAE;
            const QuantizedTensor q = quantize_blocks(x.data(), rows, cols, s, g, nullptr);
            int compared = 0;
            for (size_t b = 0; b < te.scale.size(); ++b) {
              // TE keeps an E4M3 scale of 0 for an all-zero (or underflowing) block, where
              // fp4train's zero guard stores 1 (docs/numerics.md "Zero handling, compared with
              // Transformer Engine's reference quantizer"); its elements are 0 either way. The
              // inputs have no underflowing nonzero block (TE and fp4train differ there too).
              if (te.scale[b] == 0.f) {
                ASSERT_EQ(q.block_amax[b], 0.f) << "block " << b;
                EXPECT_EQ(q.scales[b], 1.f);
                continue;
              }
              ++compared;
              ASSERT_EQ(q.scales[b], te.scale[b]) << "block " << b << " tiles " << tiles << " mse "
                                                  << mse << " max " << e4m3_max << " g " << g;
            }
            EXPECT_GT(compared, int(te.scale.size()) * 3 / 4);
            for (size_t i = 0; i < x.size(); ++i) {
              const float ours = e2m1_decode(q.codes[i]);
              ASSERT_TRUE(ours == te.q[i]) << "element " << i << " " << ours << " vs " << te.q[i];
            }
          }
        }
}
