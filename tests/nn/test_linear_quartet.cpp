// The Linear under Quartet II's quantizers (the quartet2 recipe: fp4.forward_quantizer =
// "quartet2-rtn", fp4.backward_quantizer = "ms-eden"; docs/numerics.md "MS-EDEN in a Linear"):
// fprop, dgrad and wgrad bit for bit against a composition built here from the numerics
// functions (quartet_rtn_quantize_dequantize, hadamard_rows, ms_eden_quantize) and the same
// FP32 GEMM, on shapes whose inner dims need zero padding; the backward's mean over re-drawn
// rotations and scale SR against the exact straight-through gradient (an unbiasedness test with
// a confidence bound); per-call signs; the recipe's parsing, serialisation and refusals.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "fp4/base/error.h"
#include "fp4/gemm/gemm.h"
#include "fp4/nn/linear.h"
#include "fp4/numerics/hadamard.h"
#include "fp4/numerics/ms_eden.h"
#include "fp4/config/settings.h"
#include "fp4/numerics/format.h"
#include "fp4/recipe/recipe.h"

using namespace fp4;
namespace fs = std::filesystem;

namespace {

const fs::path kRecipes = fs::path(FP4_SOURCE_DIR) / "configs/recipes";

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) return false;
  return true;
}

float amax(const std::vector<float>& x) {
  float m = 0;
  for (float v : x) m = std::max(m, std::fabs(v));
  return m;
}

/// srcᵀ (transposed: src is [cols, rows]) or src, [rows, cols], zero-padded to [rows, cols_p].
std::vector<float> padded(const std::vector<float>& src, int64_t rows, int64_t cols,
                          bool transposed, int64_t cols_p) {
  std::vector<float> out(size_t(rows * cols_p), 0.f);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      out[size_t(i * cols_p + j)] = transposed ? src[size_t(j * rows + i)] : src[size_t(i * cols + j)];
  return out;
}

/// One MS-EDEN operand as the docs spell it: padded, transformed, its amax, quantized, decoded.
std::vector<float> eden_operand(const std::vector<float>& src, int64_t rows, int64_t cols,
                                bool transposed, int64_t cols_p, const HadamardTransform& h,
                                const SrKey& key) {
  std::vector<float> t = padded(src, rows, cols, transposed, cols_p);
  hadamard_rows(t.data(), rows, cols_p, h);
  MsEdenSpec spec;
  spec.group = h.n;
  const MsEdenQuantized q = ms_eden_quantize(t.data(), rows, cols_p, spec, amax(t), key);
  ms_eden_dequantize(q, t.data());
  return t;
}

Recipe quartet2() { return load_recipe("quartet2", kRecipes); }

struct Grads {
  std::vector<float> Y, dX, dW;
};

Grads run_linear(const Recipe& r, const std::vector<float>& X, const std::vector<float>& W,
                 const std::vector<float>& dY, int64_t M, int64_t K, int64_t N, int64_t step,
                 int micro = 0, int threads = 0) {
  Grads g;
  g.Y.assign(size_t(M * N), 0.f);
  g.dX.assign(size_t(M * K), 0.f);
  g.dW.assign(size_t(N * K), 0.f);
  std::vector<float> Wc = W;
  nn::Linear lin(7, K, N, LinearPlan::uniform(r, LinearMode::FP4));
  lin.bind(Wc.data(), g.dW.data());
  nn::StepContext ctx;
  ctx.step = step;
  ctx.seed = 99;
  ctx.hadamard_seed = 5;
  ctx.micro = micro;
  const int saved = omp_get_max_threads();
  if (threads > 0) omp_set_num_threads(threads);
  lin.forward(X.data(), g.Y.data(), M, ctx);
  lin.backward(dY.data(), g.dX.data(), M, ctx);
  omp_set_num_threads(saved);
  return g;
}

}  // namespace

TEST(LinearQuartet, MatchesItsReferenceComposition) {
  // M = 48 tokens and N = 40 outputs: both inner dims of the backward padded to 128.
  const Recipe r = quartet2();
  const int64_t M = 48, K = 32, N = 40;
  const auto X = randn(size_t(M * K), 1), W = randn(size_t(N * K), 2, 0.1f),
             dY = randn(size_t(M * N), 3, 1e-3f);
  const Grads got = run_linear(r, X, W, dY, M, K, N, 3, 1);

  // fprop: Quartet II's forward quantizer on X and W, current per-tensor amax
  std::vector<float> Xq(X.size()), Wq(W.size());
  quartet_rtn_quantize_dequantize(X.data(), M, K, amax(X), Xq.data());
  quartet_rtn_quantize_dequantize(W.data(), N, K, amax(W), Wq.data());
  std::vector<float> Y(size_t(M * N));
  sgemm(false, true, M, N, K, 1.f, Xq.data(), K, Wq.data(), K, 0.f, Y.data(), N);
  EXPECT_TRUE(same_bits(got.Y, Y)) << "fprop";

  // the call's transform: per-call signs of (hadamard_seed 5, layer 7, step 3, micro 1)
  const HadamardTransform h = HadamardTransform::make(128, HadamardSigns::PerCall,
                                                      RhtPrecision::FP32, 5, 7, 3, 1);
  // dgrad over N (padded to 128): dY [M, N] and Ŵᵀ [K, N]; SR keys (op, gemm) = (2, 1), (1, 1)
  const auto a = eden_operand(dY, M, N, false, 128, h, SrKey{99, 3, 7, 2, 1, 1});
  const auto b = eden_operand(Wq, K, N, true, 128, h, SrKey{99, 3, 7, 1, 1, 1});
  std::vector<float> dX(size_t(M * K), 0.f);
  sgemm(false, true, M, K, 128, 1.f, a.data(), 128, b.data(), 128, 1.f, dX.data(), K);
  EXPECT_TRUE(same_bits(got.dX, dX)) << "dgrad";
  // wgrad over the tokens (padded to 128): dYᵀ [N, M] and X̂ᵀ [K, M]; keys (2, 2), (0, 2)
  const auto c = eden_operand(dY, N, M, true, 128, h, SrKey{99, 3, 7, 2, 2, 1});
  const auto d = eden_operand(Xq, K, M, true, 128, h, SrKey{99, 3, 7, 0, 2, 1});
  std::vector<float> dW(size_t(N * K), 0.f);
  sgemm(false, true, N, K, 128, 1.f, c.data(), 128, d.data(), 128, 1.f, dW.data(), K);
  EXPECT_TRUE(same_bits(got.dW, dW)) << "wgrad";

  // any thread count, the same bits; another micro-batch, another rotation
  const Grads t1 = run_linear(r, X, W, dY, M, K, N, 3, 1, 1), t2 = run_linear(r, X, W, dY, M, K, N, 3, 1, 2);
  EXPECT_TRUE(same_bits(t1.dX, t2.dX) && same_bits(t1.dW, t2.dW)) << "thread count";
  EXPECT_TRUE(same_bits(t1.dW, got.dW));
  const Grads m0 = run_linear(r, X, W, dY, M, K, N, 3, 0);
  EXPECT_FALSE(same_bits(m0.dW, got.dW)) << "per-call signs: micro-batch 0 and 1 share a rotation";
}

TEST(LinearQuartet, ThreadCountAndMissingDxAtThreadedSizes) {
  // Operands above the OpenMP thresholds of quartet_rtn, ms_eden_quantize and hadamard_rows
  // (M = 512 tokens, K = 128, N = 136 padded to 256): 1 and 2 threads give the same bits; a
  // backward without dX (an input that needs no gradient) gives the same dW.
  const Recipe r = quartet2();
  const int64_t M = 512, K = 128, N = 136;
  const auto X = randn(size_t(M * K), 21), W = randn(size_t(N * K), 22, 0.1f),
             dY = randn(size_t(M * N), 23, 1e-3f);
  const Grads one = run_linear(r, X, W, dY, M, K, N, 2, 0, 1), two = run_linear(r, X, W, dY, M, K, N, 2, 0, 2);
  EXPECT_TRUE(same_bits(one.Y, two.Y) && same_bits(one.dX, two.dX) && same_bits(one.dW, two.dW));
  std::vector<float> dW(size_t(N * K), 0.f), Y(size_t(M * N)), Wc = W;
  nn::Linear lin(7, K, N, LinearPlan::uniform(r, LinearMode::FP4));
  lin.bind(Wc.data(), dW.data());
  nn::StepContext ctx;
  ctx.step = 2, ctx.seed = 99, ctx.hadamard_seed = 5;
  lin.forward(X.data(), Y.data(), M, ctx);
  lin.backward(dY.data(), nullptr, M, ctx);
  EXPECT_TRUE(same_bits(dW, one.dW)) << "dW without dX";
}

TEST(LinearQuartet, BackwardIsUnbiasedOverRotationsAndScaleSr) {
  // MS-EDEN's claim (Quartet II §3): E[dX] = dY·Ŵ and E[dW] = dYᵀ·X̂ over the re-drawn
  // rotations and the scale SR, with X̂, Ŵ the forward's quantized operands. Over S steps the
  // mean's error to the exact product (FP64) must fall as 1/√S: below 3 × (one draw's error)
  // / √S; a biased estimator stalls at its bias. The RTN control (the same quantizer without
  // the EDEN correction and scale SR, i.e. x̂ = q·c_b·s_dec) must stay above that bound.
  const Recipe r = quartet2();
  const int64_t M = 128, K = 32, N = 40, S = 1500;
  const auto X = randn(size_t(M * K), 11), W = randn(size_t(N * K), 12, 0.1f),
             dY = randn(size_t(M * N), 13, 1e-3f);
  std::vector<float> Xq(X.size()), Wq(W.size());
  quartet_rtn_quantize_dequantize(X.data(), M, K, amax(X), Xq.data());
  quartet_rtn_quantize_dequantize(W.data(), N, K, amax(W), Wq.data());
  std::vector<double> exact_dx(size_t(M * K), 0.0), exact_dw(size_t(N * K), 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      const double g = dY[size_t(m * N + n)];
      for (int64_t k = 0; k < K; ++k) {
        exact_dx[size_t(m * K + k)] += g * Wq[size_t(n * K + k)];
        exact_dw[size_t(n * K + k)] += g * Xq[size_t(m * K + k)];
      }
    }
  auto rel = [](const std::vector<double>& a, const std::vector<double>& e) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) num += (a[i] - e[i]) * (a[i] - e[i]), den += e[i] * e[i];
    return std::sqrt(num / den);
  };
  std::vector<double> mean_dx(exact_dx.size(), 0.0), mean_dw(exact_dw.size(), 0.0);
  double one_dx = 0, one_dw = 0;
  for (int64_t s = 1; s <= S; ++s) {
    const Grads g = run_linear(r, X, W, dY, M, K, N, s);
    std::vector<double> dx(g.dX.begin(), g.dX.end()), dw(g.dW.begin(), g.dW.end());
    one_dx += rel(dx, exact_dx) / S, one_dw += rel(dw, exact_dw) / S;
    for (size_t i = 0; i < dx.size(); ++i) mean_dx[i] += dx[i] / S;
    for (size_t i = 0; i < dw.size(); ++i) mean_dw[i] += dw[i] / S;
  }
  const double bound_dx = 3 * one_dx / std::sqrt(double(S)), bound_dw = 3 * one_dw / std::sqrt(double(S));
  EXPECT_LT(rel(mean_dx, exact_dx), bound_dx) << "one draw " << one_dx;
  EXPECT_LT(rel(mean_dw, exact_dw), bound_dw) << "one draw " << one_dw;

  // Control: the same rotations without EDEN's correction and SR (scales c_b as computed).
  std::vector<double> rtn_dw(exact_dw.size(), 0.0);
  for (int64_t s = 1; s <= S; ++s) {
    const HadamardTransform h = HadamardTransform::make(128, HadamardSigns::PerCall,
                                                        RhtPrecision::FP32, 5, 7, uint32_t(s), 0);
    auto rtn = [&](const std::vector<float>& src, int64_t rows, int64_t cols) {
      std::vector<float> t = padded(src, rows, cols, true, 128);
      hadamard_rows(t.data(), rows, 128, h);
      MsEdenSpec spec;
      const MsEdenQuantized q = ms_eden_quantize(t.data(), rows, 128, spec, amax(t), SrKey{1, 1, 1, 1, 1});
      for (int64_t i = 0; i < rows * 128; ++i)
        t[size_t(i)] = e2m1_decode(q.codes[size_t(i)]) * q.block_scales[size_t(i / 16)] * q.s_dec;
      return t;
    };
    const auto c = rtn(dY, N, M), d = rtn(Xq, K, M);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        double acc = 0;
        for (int64_t j = 0; j < 128; ++j) acc += double(c[size_t(n * 128 + j)]) * d[size_t(k * 128 + j)];
        rtn_dw[size_t(n * K + k)] += acc / S;
      }
  }
  EXPECT_GT(rel(rtn_dw, exact_dw), bound_dw) << "the RTN control should be visibly biased (test power)";
  std::printf("MS-EDEN over %d draws: mean rel. error dX %.4f dW %.4f (one draw %.3f %.3f; "
              "bounds %.4f %.4f); RTN control dW %.4f\n", int(S), rel(mean_dx, exact_dx),
              rel(mean_dw, exact_dw), one_dx, one_dw, bound_dx, bound_dw, rel(rtn_dw, exact_dw));
}

TEST(LinearQuartet, RecipeParsesAndRoundTrips) {
  const Recipe r = quartet2();
  EXPECT_EQ(r.forward_quantizer, ForwardQuantizer::QuartetRtn);
  EXPECT_EQ(r.backward_quantizer, BackwardQuantizer::MsEden);
  EXPECT_EQ(r.hadamard_signs, HadamardSigns::PerCall);
  EXPECT_EQ(r.hadamard_size, 128);
  EXPECT_EQ(r.round_dy, Rounding::RNA);
  const LinearPlan p = LinearPlan::uniform(r, LinearMode::FP4);
  EXPECT_TRUE(p.quartet_forward() && p.ms_eden());
  EXPECT_FALSE(LinearPlan::uniform(r, LinearMode::BF16).ms_eden());
  Recipe back = recipe_from_text(recipe_to_toml(r), "round trip");
  back.source = r.source;
  EXPECT_EQ(back, r);
  const Recipe plain = load_recipe("nvfp4-te", kRecipes);
  EXPECT_EQ(recipe_to_toml(plain).find("quantizer"), std::string::npos)
      << "the defaults are not written (earlier runs' recipe.toml unchanged)";
}

TEST(LinearQuartet, RecipeRefusesWhatItsKernelsWouldIgnore) {
  auto refused = [](const std::vector<std::string>& sets, const std::string& key) {
    try {
      load_recipe("quartet2", kRecipes, parse_settings(sets).recipe);
    } catch (const UserError& e) {
      return std::string(e.what()).find(key) != std::string::npos;
    }
    return false;
  };
  EXPECT_TRUE(refused({"rounding.dy=sr8"}, "fp4.backward_quantizer"));
  EXPECT_TRUE(refused({"rounding.x=rne"}, "fp4.forward_quantizer"));
  EXPECT_TRUE(refused({"fp4.weight_2d=true"}, "fp4.forward_quantizer"));
  EXPECT_TRUE(refused({"fp4.scale_format=ue5m3"}, "fp4.forward_quantizer"));
  EXPECT_TRUE(refused({"fp4.amax_interval=50"}, "fp4.forward_quantizer"));
  EXPECT_TRUE(refused({"fp4.hadamard_gemms=[\"wgrad\"]"}, "fp4.backward_quantizer"));
  EXPECT_TRUE(refused({"linear.gemm=probe-matched"}, "linear.gemm"));
  EXPECT_TRUE(refused({"fp4.amax_sample=per-step"}, "fp4.forward_quantizer"));
  EXPECT_TRUE(refused({"fp4.amax_ranks=max"}, "fp4.forward_quantizer"));
  EXPECT_TRUE(refused({"linear.mode=bf16"}, "fp4.forward_quantizer"));
  EXPECT_TRUE(refused({"fp4.forward_quantizer=blocks", "rounding.x=rne", "rounding.w=rne",
                       "fp4.rht_precision=bf16"}, "fp4.backward_quantizer"));
  EXPECT_TRUE(refused({"fp4.backward_quantizer=mirror"}, "fp4.backward_quantizer"));
  // MS-EDEN alone, with the block quantizer forward (X̂, Ŵ of nvfp4 RNE), is accepted
  EXPECT_FALSE(refused({"fp4.forward_quantizer=blocks", "rounding.x=rne", "rounding.w=rne"}, "fp4"));
}

TEST(LinearQuartet, PerCallSignsFollowTheMicroBatchOnly) {
  // "per-call" keys the signs by (seed, layer, step, micro); micro 0 is "per-step" bit for bit,
  // and every other policy ignores micro.
  float a[128], b[128];
  hadamard_signs(128, HadamardSigns::PerCall, 5, 7, 3, a, 0);
  hadamard_signs(128, HadamardSigns::PerStep, 5, 7, 3, b);
  EXPECT_TRUE(std::equal(a, a + 128, b));
  hadamard_signs(128, HadamardSigns::PerCall, 5, 7, 3, b, 1);
  EXPECT_FALSE(std::equal(a, a + 128, b));
  for (HadamardSigns p : {HadamardSigns::Fixed, HadamardSigns::PerLayer, HadamardSigns::PerStep}) {
    hadamard_signs(64, p, 5, 7, 3, a, 0);
    hadamard_signs(64, p, 5, 7, 3, b, 9);
    EXPECT_TRUE(std::equal(a, a + 64, b)) << hadamard_signs_name(p);
  }
  EXPECT_EQ(parse_hadamard_signs("per-call"), HadamardSigns::PerCall);
  EXPECT_STREQ(hadamard_signs_name(HadamardSigns::PerCall), "per-call");
}
