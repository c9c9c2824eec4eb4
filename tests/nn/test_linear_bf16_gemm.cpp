// A Linear under linear.gemm = "decoded-bf16" (docs/gemm.md "Decoded FP4 on the BF16 GEMM"):
// fprop, dgrad and wgrad against the composition written out here (each operand's q·c_b from
// the scalar twin quantize_block_scaled, an FP64 product, the two tensor decode scales), within
// the FP32-summation bound; bit-identical for 1, 2 and 3 threads; close to the decoded mode.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "fp4/gemm/gemm.h"
#include "fp4/nn/linear.h"
#include "fp4/numerics/block_quant.h"
#include "fp4/numerics/hadamard.h"
#include "fp4/recipe/recipe.h"

using namespace fp4;

namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}
std::vector<float> transpose(const std::vector<float>& a, int64_t r, int64_t c) {
  std::vector<float> t(a.size());
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) t[j * r + i] = a[i * c + j];
  return t;
}
float amax(const std::vector<float>& v) { return tensor_amax(v.data(), int64_t(v.size())); }

/// An operand as the decoded-bf16 GEMM takes it: q·c_b and its tensor decode scale.
struct Scaled {
  std::vector<float> v;
  double gd;
};
Scaled scaled(const std::vector<float>& x, int64_t r, int64_t c, const BlockQuantSpec& s, float g,
              const SrKey* key) {
  Scaled o{std::vector<float>(x.size()), tensor_decode_scale(s, g)};
  quantize_block_scaled(x.data(), r, c, s, g, s.rounding == Rounding::SR8 ? key : nullptr, o.v.data());
  return o;
}

/// got [m, n] against (A [m,k] · B [n,k]ᵀ)·gd_a·gd_b in FP64 (+ old), within γ_(k+1)·Σ|a·b|·s and
/// a few FP32 roundings of the result.
void expect_product(const std::vector<float>& got, const Scaled& A, const Scaled& B, int64_t m,
                    int64_t n, int64_t k, const std::vector<float>* old, const char* what) {
  const double u = std::ldexp(1.0, -24), gk = (k + 1) * u / (1 - (k + 1) * u), s = A.gd * B.gd;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double e = 0, mag = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double t = double(A.v[i * k + p]) * B.v[j * k + p];
        e += t, mag += std::fabs(t);
      }
      const double want = e * s + (old ? double((*old)[i * n + j]) : 0.0);
      ASSERT_LE(std::fabs(got[i * n + j] - want), gk * mag * s + 4 * u * std::fabs(want) + 1e-40)
          << what << " [" << i << ", " << j << "]";
    }
}

Recipe bf16_gemm_recipe(ScaleFormat sf, bool rht, bool w2d) {
  Recipe r;
  r.name = "test";
  r.mode = LinearMode::FP4;
  r.scale_format = sf;
  r.block = 16;
  r.weight_2d = w2d;
  r.amax_interval = 1;
  r.rht_wgrad = rht;
  r.round_dy = Rounding::SR8;
  r.gemm = GemmMode::DecodedBf16;
  return r;
}

struct Case {
  ScaleFormat sf;
  bool rht, w2d;
  Bf16GemmPath path;
};
class LinearBf16Gemm : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    saved_ = gemm_bf16_path();
    if (GetParam().path == Bf16GemmPath::Native && !gemm_bf16_native_available())
      GTEST_SKIP() << "no native BF16 matmul here: the widened case covers this CPU";
    if (GetParam().path == Bf16GemmPath::Blocked && !gemm_bf16_blocked_available())
      GTEST_SKIP() << "no brgemm BF16 matmul here";
    gemm_bf16_set_path(GetParam().path);
  }
  void TearDown() override { gemm_bf16_set_path(saved_); }
  Bf16GemmPath saved_{};
};

struct LinRun {
  std::vector<float> Y, dX, dW;
};
LinRun run_linear(const Recipe& r, const std::vector<float>& X, std::vector<float> W,
               const std::vector<float>& dY, const std::vector<float>& dX0, int64_t M, int64_t K,
               int64_t N) {
  LinRun o{std::vector<float>(size_t(M * N)), dX0, std::vector<float>(size_t(N * K), 0.25f)};
  nn::Linear lin(7, K, N, LinearPlan::uniform(r, LinearMode::FP4));
  lin.bind(W.data(), o.dW.data());
  nn::StepContext ctx;
  ctx.step = 3;
  ctx.seed = 99;
  lin.forward(X.data(), o.Y.data(), M, ctx);
  lin.backward(dY.data(), o.dX.data(), M, ctx);
  return o;
}

TEST_P(LinearBf16Gemm, ThreeGemmsMatchTheBlockScaledComposition) {
  const Case c = GetParam();
  const int64_t M = 64, K = 40, N = 24;  // K, N not multiples of 16: padded tails
  const Recipe r = bf16_gemm_recipe(c.sf, c.rht, c.w2d);
  auto X = randn(M * K, 1), W = randn(N * K, 2, 0.1f), dY = randn(M * N, 3, 1e-3f);
  X[5] = 30.f;  // an outlier block
  const auto dX0 = randn(M * K, 4, 1e-4f);  // dgrad accumulates into what is there
  const LinRun got = run_linear(r, X, W, dY, dX0, M, K, N);

  // fprop: X blocks along K, W tiles (or blocks along K)
  const Scaled Xs = scaled(X, M, K, r.spec_x(), amax(X), nullptr);
  const Scaled Ws = scaled(W, N, K, r.spec_w(), amax(W), nullptr);
  expect_product(got.Y, Xs, Ws, M, N, K, nullptr, "fprop");
  // dgrad: dY blocks along N (SR, operand 2, GEMM 1); W contracted over N, laid out [K, N]
  const SrKey kd{99, 3, 7, 2, 1};
  const Scaled dYs = scaled(dY, M, N, r.spec_dy(), amax(dY), &kd);
  Scaled Wd;
  if (c.w2d) {
    Wd = {transpose(Ws.v, N, K), Ws.gd};
  } else {
    Wd = scaled(transpose(W, N, K), K, N, r.spec_w(), amax(W), nullptr);
  }
  expect_product(got.dX, dYs, Wd, M, K, N, &dX0, "dgrad");
  // wgrad: dYᵀ [N, M] and Xᵀ [K, M], blocks along tokens, after the RHT if any; dW += product
  auto dYt = transpose(dY, M, N), Xt = transpose(X, M, K);
  if (c.rht) {
    rht16_rows(dYt.data(), N, M);
    rht16_rows(Xt.data(), K, M);
  }
  const SrKey kw{99, 3, 7, 2, 2};
  const std::vector<float> dW0(size_t(N * K), 0.25f);
  const Scaled dYts = scaled(dYt, N, M, r.spec_dy(), amax(dYt), &kw);
  const Scaled Xts = scaled(Xt, K, M, r.spec_x(), amax(Xt), nullptr);
  expect_product(got.dW, dYts, Xts, N, K, M, &dW0, "wgrad");

  // Bit for bit: the operands and the GEMM are deterministic, so each of the three equals
  // gemm_block_scaled of the twin operands (a Linear that fell back to the decoded mode, or fed
  // an x̂ operand, would differ in many bits even where it stays inside the bound above).
  {
    BlockScaledGemmScratch sc;
    std::vector<float> y(size_t(M * N)), dx = dX0, dw = dW0;
    gemm_block_scaled(false, true, M, N, K, Xs.v.data(), float(Xs.gd), Ws.v.data(), float(Ws.gd),
                      false, y.data(), sc);
    gemm_block_scaled(false, true, M, K, N, dYs.v.data(), float(dYs.gd), Wd.v.data(), float(Wd.gd),
                      true, dx.data(), sc);
    gemm_block_scaled(false, true, N, K, M, dYts.v.data(), float(dYts.gd), Xts.v.data(),
                      float(Xts.gd), true, dw.data(), sc);
    EXPECT_EQ(std::memcmp(got.Y.data(), y.data(), y.size() * 4), 0) << "fprop bits";
    EXPECT_EQ(std::memcmp(got.dX.data(), dx.data(), dx.size() * 4), 0) << "dgrad bits";
    EXPECT_EQ(std::memcmp(got.dW.data(), dw.data(), dw.size() * 4), 0) << "wgrad bits";
  }

  // Close to the decoded mode (same codes and scales, other roundings and order).
  Recipe dr = r;
  dr.gemm = GemmMode::Decoded;
  const LinRun dec = run_linear(dr, X, W, dY, dX0, M, K, N);
  for (size_t i = 0; i < dec.Y.size(); ++i) EXPECT_NEAR(got.Y[i], dec.Y[i], 1e-5 * (1 + std::fabs(dec.Y[i])));
  for (size_t i = 0; i < dec.dW.size(); ++i) EXPECT_NEAR(got.dW[i], dec.dW[i], 1e-6);
}

TEST_P(LinearBf16Gemm, ThreadCountDoesNotChangeBits) {
  const Case c = GetParam();
  const int64_t M = 512, K = 256, N = 272;
  const Recipe r = bf16_gemm_recipe(c.sf, c.rht, c.w2d);
  const auto X = randn(M * K, 11), W = randn(N * K, 12, 0.05f), dY = randn(M * N, 13, 1e-3f);
  const std::vector<float> dX0(size_t(M * K), 0.f);
  const int saved = omp_get_max_threads();
  LinRun first;
  for (int team : {1, 2, 3}) {
    omp_set_num_threads(team);
    const LinRun o = run_linear(r, X, W, dY, dX0, M, K, N);
    if (team == 1) {
      first = o;
      continue;
    }
    EXPECT_EQ(std::memcmp(o.Y.data(), first.Y.data(), o.Y.size() * 4), 0) << team << " threads: Y";
    EXPECT_EQ(std::memcmp(o.dX.data(), first.dX.data(), o.dX.size() * 4), 0) << team << " threads: dX";
    EXPECT_EQ(std::memcmp(o.dW.data(), first.dW.data(), o.dW.size() * 4), 0) << team << " threads: dW";
  }
  omp_set_num_threads(saved);
}

INSTANTIATE_TEST_SUITE_P(
    Recipes, LinearBf16Gemm,
    ::testing::Values(Case{ScaleFormat::UE5M3, false, true, Bf16GemmPath::Native},
                      Case{ScaleFormat::E4M3, true, true, Bf16GemmPath::Native},
                      Case{ScaleFormat::UE5M3, false, false, Bf16GemmPath::Native},
                      Case{ScaleFormat::UE5M3, false, true, Bf16GemmPath::Widened},
                      Case{ScaleFormat::E4M3, true, false, Bf16GemmPath::Widened},
                      Case{ScaleFormat::UE5M3, false, true, Bf16GemmPath::Blocked},
                      Case{ScaleFormat::E4M3, true, false, Bf16GemmPath::Blocked}),
    [](const auto& info) {
      const Case& c = info.param;
      return std::string(c.sf == ScaleFormat::UE5M3 ? "ue5m3" : "e4m3") + (c.rht ? "_rht" : "") +
             (c.w2d ? "_2d" : "_1d") +
             (c.path == Bf16GemmPath::Native    ? "_native"
              : c.path == Bf16GemmPath::Blocked ? "_blocked"
                                                : "_widened");
    });

}  // namespace
