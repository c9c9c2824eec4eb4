// The quantized Linear's three GEMMs (fprop, dgrad, wgrad) against a naive reference that
// quantizes each operand along its GEMM's contraction dimension (docs/numerics.md "Notation")
// with the reference quantizer and multiplies in double; plus FD gradients in FP32 mode
// and the held tensor reference inside a layer.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "fp4/numerics/hadamard.h"
#include "fp4/nn/linear.h"
#include "fp4/recipe/recipe.h"

using namespace fp4;

namespace {
std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
std::vector<float> transpose(const std::vector<float>& a, int64_t r, int64_t c) {
  std::vector<float> t(a.size());
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) t[j * r + i] = a[i * c + j];
  return t;
}
float amax(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}
// Reference quantize-dequantize through the unpacked QuantizedTensor path.
std::vector<float> qdq(const std::vector<float>& x, int64_t r, int64_t c, const BlockQuantSpec& s,
                       float g, const SrKey* key) {
  auto q = quantize_blocks(x.data(), r, c, s, g, s.rounding == Rounding::SR8 ? key : nullptr);
  std::vector<float> out(x.size());
  dequantize(q, out.data());
  return out;
}
// C [m,n] = A [m,k] · B[n,k]ᵀ in double; also returns Σ|a||b| per element for tolerances.
void matmul_nt(const std::vector<float>& A, const std::vector<float>& B, int64_t m, int64_t n,
               int64_t k, std::vector<double>& C, std::vector<double>& mag) {
  C.assign(m * n, 0);
  mag.assign(m * n, 0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < k; ++p) {
        C[i * n + j] += double(A[i * k + p]) * B[j * k + p];
        mag[i * n + j] += std::fabs(double(A[i * k + p]) * B[j * k + p]);
      }
}
void expect_close(const std::vector<float>& got, const std::vector<double>& ref,
                  const std::vector<double>& mag, const char* what) {
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], ref[i], 1e-6 * mag[i] + 1e-30) << what << " element " << i;
}

Recipe fp4_recipe(ScaleFormat sf, bool rht, bool w2d, int D) {
  Recipe r;
  r.name = "test";
  r.mode = LinearMode::FP4;
  r.scale_format = sf;
  r.block = 16;
  r.weight_2d = w2d;
  r.amax_interval = D;
  r.rht_wgrad = rht;
  r.round_dy = Rounding::SR8;
  return r;
}

struct Case {
  ScaleFormat sf;
  bool rht, w2d;
};

class LinearGemms : public ::testing::TestWithParam<Case> {};

TEST_P(LinearGemms, ThreeGemmsMatchNaiveQuantizedReference) {
  const Case c = GetParam();
  const int64_t M = 48, K = 40, N = 24;  // K, N not multiples of 16: padded tails
  const Recipe r = fp4_recipe(c.sf, c.rht, c.w2d, 1);
  auto X = randn(M * K, 1), W = randn(N * K, 2, 0.1f), dY = randn(M * N, 3, 1e-3f);
  X[5] = 30.f;  // an outlier block
  std::vector<float> dW(N * K, 0.f), Y(M * N), dX(M * K, 0.f);
  nn::Linear lin(7, K, N, LinearPlan::uniform(r, LinearMode::FP4));
  lin.bind(W.data(), dW.data());
  nn::StepContext ctx;
  ctx.step = 3;
  ctx.seed = 99;
  lin.forward(X.data(), Y.data(), M, ctx);
  lin.backward(dY.data(), dX.data(), M, ctx);

  // fprop: X blocks along K, W 16x16 tiles (or 1x16 along K).
  const auto Xq = qdq(X, M, K, r.spec_x(), amax(X), nullptr);
  const auto Wq = qdq(W, N, K, r.spec_w(), amax(W), nullptr);
  std::vector<double> ref, mag;
  matmul_nt(Xq, Wq, M, N, K, ref, mag);
  expect_close(Y, ref, mag, "fprop");

  // dgrad: dY blocks along N with SR (operand 2, GEMM 1); W contracted over N.
  const SrKey kd{99, 3, 7, 2, 1};
  const auto dYq = qdq(dY, M, N, r.spec_dy(), amax(dY), &kd);
  std::vector<float> Wd;  // W as used by dgrad, laid out [K, N] so matmul_nt contracts over N
  if (c.w2d) {
    Wd = transpose(Wq, N, K);
  } else {
    Wd = qdq(transpose(W, N, K), K, N, r.spec_w(), amax(W), nullptr);
  }
  matmul_nt(dYq, Wd, M, K, N, ref, mag);
  expect_close(dX, ref, mag, "dgrad");

  // wgrad: dYᵀ [N, M] and Xᵀ [K, M], blocks along tokens, RHT first if the recipe says so.
  auto dYt = transpose(dY, M, N), Xt = transpose(X, M, K);
  float gdy = amax(dY), gx = amax(X);
  if (c.rht) {
    rht16_rows(dYt.data(), N, M);
    rht16_rows(Xt.data(), K, M);
    gdy = amax(dYt);
    gx = amax(Xt);
  }
  const SrKey kw{99, 3, 7, 2, 2};
  const auto dYtq = qdq(dYt, N, M, r.spec_dy(), gdy, &kw);
  const auto Xtq = qdq(Xt, K, M, r.spec_x(), gx, nullptr);
  matmul_nt(dYtq, Xtq, N, K, M, ref, mag);
  expect_close(dW, ref, mag, "wgrad");

  // The quantized product differs from the FP32 one (the test would catch a bypass).
  std::vector<double> exact, m2;
  matmul_nt(X, W, M, N, K, exact, m2);
  double diff = 0;
  for (size_t i = 0; i < exact.size(); ++i) diff = std::max(diff, std::fabs(exact[i] - Y[i]));
  EXPECT_GT(diff, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Recipes, LinearGemms,
                         ::testing::Values(Case{ScaleFormat::UE5M3, false, true},
                                           Case{ScaleFormat::E4M3, true, true},
                                           Case{ScaleFormat::UE5M3, false, false}));

TEST(Linear, SrDrawsDifferBetweenDgradAndWgrad) {
  // Independent SR draws: the dgrad and wgrad keys differ only in the GEMM field.
  const SrKey a{1, 1, 0, 2, 1}, b{1, 1, 0, 2, 2};
  std::vector<uint8_t> ba(64), bb(64);
  sr_bytes(a, 0, 64, ba.data());
  sr_bytes(b, 0, 64, bb.data());
  EXPECT_NE(ba, bb);
}

TEST(Linear, Bf16ModeRoundsEveryOperand) {
  const int64_t M = 8, K = 12, N = 5;
  Recipe r;
  r.mode = LinearMode::BF16;
  auto X = randn(M * K, 4), W = randn(N * K, 5), dY = randn(M * N, 6);
  std::vector<float> dW(N * K, 0.f), Y(M * N), dX(M * K, 0.f);
  nn::Linear lin(0, K, N, LinearPlan::uniform(r, LinearMode::BF16));
  lin.bind(W.data(), dW.data());
  nn::StepContext ctx;
  lin.forward(X.data(), Y.data(), M, ctx);
  lin.backward(dY.data(), dX.data(), M, ctx);
  auto bf = [](std::vector<float> v) { for (auto& x : v) x = round_bf16(x); return v; };
  std::vector<double> ref, mag;
  matmul_nt(bf(X), bf(W), M, N, K, ref, mag);
  expect_close(Y, ref, mag, "fprop");
  matmul_nt(bf(dY), transpose(bf(W), N, K), M, K, N, ref, mag);
  expect_close(dX, ref, mag, "dgrad");
  matmul_nt(transpose(bf(dY), M, N), transpose(bf(X), M, K), N, K, M, ref, mag);
  expect_close(dW, ref, mag, "wgrad");
}

// A [M=6, K=7] → N=5 Linear of one mode under the loss L = Σ Y ⊙ R (in double): backward(R)
// gives dX and dW, central() the finite difference of L in one input or weight element.
struct LinearFd {
  static constexpr int64_t M = 6, K = 7, N = 5;
  std::vector<float> X, W, R, dW = std::vector<float>(N * K, 0.f), Y = std::vector<float>(M * N),
                              dX = std::vector<float>(M * K, 0.f);
  Recipe r;
  nn::Linear lin;
  nn::StepContext ctx;
  LinearFd(LinearMode mode, uint32_t seed)
      : X(randn(M * K, seed)), W(randn(N * K, seed + 1)), R(randn(M * N, seed + 2)),
        r(with_mode(mode)), lin(0, K, N, LinearPlan::uniform(r, mode)) {
    lin.bind(W.data(), dW.data());
    loss();
    lin.backward(R.data(), dX.data(), M, ctx);
  }
  static Recipe with_mode(LinearMode m) {
    Recipe rr;
    rr.mode = m;
    return rr;
  }
  double loss() {
    lin.forward(X.data(), Y.data(), M, ctx);
    double s = 0;
    for (int64_t i = 0; i < M * N; ++i) s += double(Y[i]) * R[i];
    return s;
  }
  double central(std::vector<float>& v, size_t i, float h) {
    const float s = v[i];
    v[i] = s + h;
    const double lp = loss();
    v[i] = s - h;
    const double lm = loss();
    v[i] = s;
    return (lp - lm) / (2 * h);
  }
};

TEST(Linear, Fp32GradientsMatchFiniteDifferences) {
  LinearFd t(LinearMode::FP32, 7);
  const float h = 1e-2f;
  for (auto [v, g] : {std::pair{&t.X, &t.dX}, std::pair{&t.W, &t.dW}})
    for (size_t i = 0; i < v->size(); ++i)
      EXPECT_NEAR(t.central(*v, i, h), (*g)[i], 2e-3 * (1 + std::fabs((*g)[i]))) << i;
}

// BF16 mode backward is the gradient of the BF16-rounded forward (a straight-through estimator
// of the rounding): dX = bf(dY)·bf(W), dW = bf(dY)ᵀ·bf(X). Y = bf(X)·bf(W)ᵀ is linear in
// bf(X_ik), so a central difference with step h gives exactly g·(bf(x+h) − bf(x−h))/(2h),
// g = Σ_j R_ij·bf(W)_jk; |bf(x±h) − (x±h)| ≤ 2^-9·|x±h| bounds the slope error by
// 2^-8·(|x| + h)/(2h)·|g|. The backward rounds R (= dY) to BF16 too: another 2^-9·Σ|R||bf(W)|.
// Tolerance: those two plus FP32 summation, from G = Σ_j |R_ij|·|bf(W)_jk| (and likewise for W).
TEST(Linear, Bf16GradientsMatchFiniteDifferencesOfTheRoundedForward) {
  LinearFd t(LinearMode::BF16, 17);
  constexpr int64_t M = LinearFd::M, K = LinearFd::K, N = LinearFd::N;
  const auto &X = t.X, &W = t.W, &R = t.R;
  const float h = 0.25f;
  auto bf = [](float x) { return double(round_bf16(x)); };
  auto check = [&](std::vector<float>& v, const std::vector<float>& g, bool is_x) {
    for (size_t idx = 0; idx < v.size(); ++idx) {
      // G = Σ |R|·|bf(other operand)| over the contraction of this element's gradient.
      double G = 0;
      if (is_x) {
        const int64_t i = int64_t(idx) / K, k = int64_t(idx) % K;
        for (int64_t j = 0; j < N; ++j) G += std::fabs(R[i * N + j] * bf(W[j * K + k]));
      } else {
        const int64_t j = int64_t(idx) / K, k = int64_t(idx) % K;
        for (int64_t i = 0; i < M; ++i) G += std::fabs(R[i * N + j] * bf(X[i * K + k]));
      }
      const float s = v[idx];
      const double tol = (0x1p-8 * (std::fabs(s) + h) / (2 * h) + 0x1p-9 + 0x1p-20) * G + 1e-12;
      EXPECT_NEAR(t.central(v, idx, h), g[idx], tol) << (is_x ? "dX " : "dW ") << idx;
    }
  };
  check(t.X, t.dX, true);
  check(t.W, t.dW, false);
}

TEST(Linear, HeldReferenceRefreshesEvery50StepsInsideTheLayer) {
  const int64_t M = 16, K = 16, N = 16;
  Recipe r = fp4_recipe(ScaleFormat::UE5M3, false, true, 50);
  auto X = randn(M * K, 10), W = randn(N * K, 11);
  std::vector<float> dW(N * K), Y(M * N);
  nn::Linear lin(0, K, N, LinearPlan::uniform(r, LinearMode::FP4));
  lin.bind(W.data(), dW.data());
  nn::StepContext ctx;
  const float g1 = amax(X);
  for (int step = 1; step <= 120; ++step) {
    ctx.step = step;
    std::vector<float> Xs = X;
    for (auto& x : Xs) x *= 1.f + 0.01f * step;  // the activation grows every step
    lin.forward(Xs.data(), Y.data(), M, ctx);
    if (step == 1 || step == 51 || step == 101) {
      EXPECT_EQ(lin.refs().g_x, amax(Xs)) << "refresh at step " << step;
      EXPECT_EQ(lin.reference(nn::Role::X).last_refresh(), step);
    } else {
      EXPECT_LT(lin.refs().g_x, amax(Xs)) << "held (stale) value at step " << step;
    }
  }
  (void)g1;
  // Inference (training = false) uses current scaling and leaves the cache alone.
  ctx.training = false;
  ctx.step = 121;
  lin.forward(X.data(), Y.data(), M, ctx);
  EXPECT_EQ(lin.refs().g_x, amax(X));
  EXPECT_EQ(lin.reference(nn::Role::X).last_refresh(), 101);
}
}  // namespace

namespace {
TEST(Linear, HeldReferencesFeedAllThreeGemmsAtAHoldStep) {
  // D = 50: at step 2 every GEMM must use the step-1 amax of X, W and dY, although all three
  // tensors have grown; wgrad's Xᵀ shares the fprop reference and dYᵀ the dgrad reference.
  const int64_t M = 32, K = 24, N = 20;
  const Recipe r = fp4_recipe(ScaleFormat::UE5M3, false, true, 50);
  auto X1 = randn(M * K, 21), W = randn(N * K, 22, 0.1f), dY1 = randn(M * N, 23, 1e-3f);
  std::vector<float> dW(N * K, 0.f), Y(M * N), dX(M * K, 0.f);
  nn::Linear lin(3, K, N, LinearPlan::uniform(r, LinearMode::FP4));
  lin.bind(W.data(), dW.data());
  nn::StepContext ctx;
  ctx.seed = 5;
  ctx.step = 1;
  lin.forward(X1.data(), Y.data(), M, ctx);
  lin.backward(dY1.data(), dX.data(), M, ctx);
  const float gx = amax(X1), gw0 = amax(W), gdy = amax(dY1);

  auto X2 = X1, dY2 = dY1;
  for (auto& x : X2) x *= 3.f;
  for (auto& x : dY2) x *= 5.f;
  for (auto& w : W) w *= 2.f;
  std::fill(dW.begin(), dW.end(), 0.f);
  std::fill(dX.begin(), dX.end(), 0.f);
  ctx.step = 2;
  lin.forward(X2.data(), Y.data(), M, ctx);
  lin.backward(dY2.data(), dX.data(), M, ctx);
  EXPECT_EQ(lin.refs().g_x, gx);
  EXPECT_EQ(lin.refs().g_w, gw0);
  EXPECT_EQ(lin.refs().g_dy, gdy);

  std::vector<double> ref, mag;
  const auto Xq = qdq(X2, M, K, r.spec_x(), gx, nullptr);
  const auto Wq = qdq(W, N, K, r.spec_w(), gw0, nullptr);
  matmul_nt(Xq, Wq, M, N, K, ref, mag);
  expect_close(Y, ref, mag, "fprop at hold step");
  const SrKey kd{5, 2, 3, 2, 1}, kw{5, 2, 3, 2, 2};
  matmul_nt(qdq(dY2, M, N, r.spec_dy(), gdy, &kd), transpose(Wq, N, K), M, K, N, ref, mag);
  expect_close(dX, ref, mag, "dgrad at hold step");
  matmul_nt(qdq(transpose(dY2, M, N), N, M, r.spec_dy(), gdy, &kw),
            qdq(transpose(X2, M, K), K, M, r.spec_x(), gx, nullptr), N, K, M, ref, mag);
  expect_close(dW, ref, mag, "wgrad at hold step");
}
}  // namespace

#include "fp4/gemm/probe_gemm.h"

namespace {
/// Runs a probe-matched Linear of recipe r (layer 2, step 4, seed 7) forward and backward on X
/// [M, K], W [N, K], dY [M, N], and checks each of its three GEMMs bit for bit against
/// fp4::probe_gemm (with `opt`) of the operands quantized here as the contract says (dY with its
/// dgrad and wgrad SR keys; RHT on the wgrad operands when the recipe has it). Returns Y.
std::vector<float> expect_probe_linear(const Recipe& r, const std::vector<float>& X,
                                       const std::vector<float>& W, const std::vector<float>& dY,
                                       int64_t M, int64_t K, int64_t N, const ProbeGemmOptions& opt,
                                       const std::string& what) {
  std::vector<float> dW(N * K, 0.f), Y(M * N), dX(M * K, 0.f), Wc = W;
  nn::Linear lin(2, K, N, LinearPlan::uniform(r, LinearMode::FP4));
  lin.bind(Wc.data(), dW.data());
  nn::StepContext ctx;
  ctx.step = 4;
  ctx.seed = 7;
  lin.forward(X.data(), Y.data(), M, ctx);
  lin.backward(dY.data(), dX.data(), M, ctx);

  auto q = [](const std::vector<float>& x, int64_t rr, int64_t cc, const BlockQuantSpec& s,
              float g, const SrKey* k) {
    return quantize_blocks(x.data(), rr, cc, s, g, s.rounding == Rounding::SR8 ? k : nullptr);
  };
  std::vector<float> ref(M * N);
  probe_gemm(q(X, M, K, r.spec_x(), amax(X), nullptr), q(W, N, K, r.spec_w(), amax(W), nullptr),
             ref.data(), opt);
  EXPECT_EQ(0, std::memcmp(ref.data(), Y.data(), Y.size() * 4)) << "fprop, " << what;
  const SrKey kd{7, 4, 2, 2, 1}, kw{7, 4, 2, 2, 2};
  ref.assign(M * K, 0.f);
  probe_gemm(q(dY, M, N, r.spec_dy(), amax(dY), &kd),
             q(transpose(W, N, K), K, N, r.spec_w(), amax(W), nullptr), ref.data(), opt);
  // dX and dW are accumulated into zeros: 0 + (−0) = +0 (a snapped tiny negative sum is −0).
  for (float& v : ref) v = 0.0f + v;
  EXPECT_EQ(0, std::memcmp(ref.data(), dX.data(), dX.size() * 4)) << "dgrad, " << what;
  auto dYt = transpose(dY, M, N), Xt = transpose(X, M, K);
  if (r.rht_wgrad) {
    rht16_rows(dYt.data(), N, M);
    rht16_rows(Xt.data(), K, M);
  }
  ref.assign(N * K, 0.f);
  probe_gemm(q(dYt, N, M, r.spec_dy(), amax(dYt), &kw), q(Xt, K, M, r.spec_x(), amax(Xt), nullptr),
             ref.data(), opt);
  for (float& v : ref) v = 0.0f + v;
  EXPECT_EQ(0, std::memcmp(ref.data(), dW.data(), dW.size() * 4)) << "wgrad, " << what;
  return Y;
}

TEST(Linear, ProbeMatchedModeRunsAllThreeGemmsThroughTheProbeKernel) {
  const int64_t M = 32, K = 40, N = 24;
  Recipe r = fp4_recipe(ScaleFormat::UE5M3, true, true, 1);
  r.gemm = GemmMode::ProbeMatched;
  auto X = randn(M * K, 31), W = randn(N * K, 32, 0.1f), dY = randn(M * N, 33, 1e-3f);
  (void)expect_probe_linear(r, X, W, dY, M, K, N, ProbeGemmOptions{}, "default accumulator");
}

// The probe-matched Linear quantizes through the fast packed quantizers (the transposed one for
// Wᵀ, dYᵀ and Xᵀ when there is no RHT): each GEMM still equals the scalar composition
// quantize_blocks → probe_gemm, for ragged shapes (K, N and M not multiples of 16, an odd M·K),
// 1-D and 2-D weights, E4M3 and UE5M3 scales, a held reference (D = 50 at a hold step is not
// reached here: step 4 refreshes under D = 1) and MXFP4.
TEST(Linear, ProbeMatchedFastQuantizersMatchTheScalarComposition) {
  const int64_t M = 37, K = 45, N = 21;
  auto X = randn(M * K, 51), W = randn(N * K, 52, 0.1f), dY = randn(M * N, 53, 1e-3f);
  X[7] = 25.f;  // an outlier block
  for (bool w2d : {false, true})
    for (ScaleFormat sf : {ScaleFormat::UE5M3, ScaleFormat::E4M3}) {
      Recipe r = fp4_recipe(sf, /*rht=*/false, w2d, 1);
      r.gemm = GemmMode::ProbeMatched;
      (void)expect_probe_linear(r, X, W, dY, M, K, N, ProbeGemmOptions{},
                                std::string(scale_format_name(sf)) + (w2d ? " 2-D" : " 1-D"));
    }
  Recipe mx = fp4_recipe(ScaleFormat::UE8M0, false, false, 1);
  mx.scale_rule = ScaleRule::MxTe;
  mx.block = 32;
  mx.gemm = GemmMode::ProbeMatched;
  (void)expect_probe_linear(mx, X, W, dY, M, K, N, ProbeGemmOptions{}, "mxfp4");
}

// linear.probe_snap reaches all three probe GEMMs: each equals probe_gemm with that snap
// (fp4/gemm/accumulator.h), and the snap changes the result where sums have bits below 1/1024
// (rows of X scaled by 1e-7: their block scales are about 448e-7 ≈ 2^-14, so their products are).
TEST(Linear, ProbeSnapReachesEveryGemm) {
  const int64_t M = 32, K = 40, N = 24;
  auto X = randn(M * K, 41), W = randn(N * K, 42, 0.1f), dY = randn(M * N, 43, 1e-3f);
  for (int64_t i = 0; i < 4 * K; ++i) X[i] *= 1e-7f;
  std::vector<float> Y_default;
  for (int snap : {1024, 0, 4096}) {
    Recipe r = fp4_recipe(ScaleFormat::UE5M3, /*rht=*/false, /*w2d=*/true, 1);
    r.gemm = GemmMode::ProbeMatched;
    r.probe_snap = snap;
    EXPECT_EQ(LinearPlan::uniform(r, LinearMode::FP4).probe_snap, snap);
    ProbeGemmOptions opt;
    opt.accumulator.snap = snap;
    const std::vector<float> Y = expect_probe_linear(r, X, W, dY, M, K, N, opt, "snap " + std::to_string(snap));
    if (snap == 1024) Y_default = Y;
    else EXPECT_NE(0, std::memcmp(Y_default.data(), Y.data(), Y.size() * 4)) << "snap " << snap << " changed nothing";
  }
}
}  // namespace

// ------------------------------------------------------------------------------------------
// Fidelity knobs (docs/numerics.md "BF16 boundary", "Random Hadamard transform").

#include "fp4/numerics/format.h"
#include "fp4/gemm/gemm.h"

namespace {
std::vector<float> bf16_rounded(std::vector<float> v) {
  for (auto& x : v) x = round_bf16(x);
  return v;
}
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(Linear, Bf16OutputsRoundYAndTheLinearsOwnDx) {
  // With fp4.bf16_outputs a layer's Y is round_bf16 of the same layer's Y without the knob, its
  // dX contribution d is round_bf16(d) added to what dX already holds (another linear's share),
  // and dW is unchanged: two steps (D = 50 refresh and hold), decoded (with and without RHT) and
  // probe-matched, and an inference forward.
  const int64_t M = 32, K = 40, N = 24;
  std::vector<Recipe> recipes;
  recipes.push_back(fp4_recipe(ScaleFormat::UE5M3, false, true, 50));
  recipes.push_back(fp4_recipe(ScaleFormat::E4M3, true, true, 1));
  recipes.push_back(fp4_recipe(ScaleFormat::UE5M3, false, true, 50));
  recipes.back().gemm = GemmMode::ProbeMatched;
  for (size_t ri = 0; ri < recipes.size(); ++ri) {
    SCOPED_TRACE("recipe " + std::to_string(ri));
    Recipe on = recipes[ri];
    on.bf16_outputs = true;
    auto W = randn(N * K, 43, 0.1f);
    std::vector<float> dWa(N * K, 0.f), dWb(N * K, 0.f);
    nn::Linear a(3, K, N, LinearPlan::uniform(on, LinearMode::FP4)),
        b(3, K, N, LinearPlan::uniform(recipes[ri], LinearMode::FP4));
    a.bind(W.data(), dWa.data());
    b.bind(W.data(), dWb.data());
    bool rounds_something = false;
    for (int step = 1; step <= 2; ++step) {
      auto X = randn(M * K, 80 + step), dY = randn(M * N, 90 + step, 1e-3f);
      const auto share = randn(M * K, 95 + step, 1e-2f);  // another linear's dX, already there
      nn::StepContext ctx;
      ctx.step = step;
      ctx.seed = 13;
      std::vector<float> Ya(M * N), Yb(M * N), dXa = share, dXb(M * K, 0.f);
      a.forward(X.data(), Ya.data(), M, ctx);
      b.forward(X.data(), Yb.data(), M, ctx);
      a.backward(dY.data(), dXa.data(), M, ctx);
      b.backward(dY.data(), dXb.data(), M, ctx);
      EXPECT_TRUE(same_bits(Ya, bf16_rounded(Yb))) << "fprop, step " << step;
      std::vector<float> want(M * K);
      const auto db = bf16_rounded(dXb);
      for (int64_t i = 0; i < M * K; ++i) want[i] = share[i] + db[i];
      EXPECT_TRUE(same_bits(dXa, want)) << "dgrad, step " << step;
      EXPECT_TRUE(same_bits(dWa, dWb)) << "wgrad, step " << step;
      rounds_something |= !same_bits(Yb, bf16_rounded(Yb)) && !same_bits(dXb, db);
    }
    EXPECT_TRUE(rounds_something) << "the outputs were already BF16 values: the test shows nothing";
    auto X = randn(M * K, 99);
    nn::StepContext inf;
    inf.training = false;
    a.reset_inference();
    b.reset_inference();
    std::vector<float> Ya(M * N), Yb(M * N);
    a.forward(X.data(), Ya.data(), M, inf);
    b.forward(X.data(), Yb.data(), M, inf);
    EXPECT_TRUE(same_bits(Ya, bf16_rounded(Yb))) << "inference fprop";
  }
}

TEST(Linear, Bf16BoundaryEqualsQuantizingPreRoundedOperands) {
  // With fp4.bf16_boundary, a layer fed X and dY must give, bit for bit, what the same layer
  // without the knob gives when fed round_bf16(X) and round_bf16(dY): two training steps (the
  // held references of D = 50 refresh at step 1 and hold at step 2), telemetry, an inference
  // forward; for a held-reference recipe, an RHT recipe (both precisions), MX, probe-matched.
  const int64_t M = 32, K = 40, N = 24;
  std::vector<Recipe> recipes;
  recipes.push_back(fp4_recipe(ScaleFormat::UE5M3, false, true, 50));
  recipes.push_back(fp4_recipe(ScaleFormat::E4M3, true, true, 1));
  recipes.push_back(fp4_recipe(ScaleFormat::E4M3, true, true, 1));
  recipes.back().rht_precision = RhtPrecision::BF16;
  recipes.push_back(fp4_recipe(ScaleFormat::UE8M0, false, false, 1));
  recipes.back().scale_rule = ScaleRule::MxTe;
  recipes.back().block = 32;
  recipes.push_back(fp4_recipe(ScaleFormat::UE5M3, true, true, 1));
  recipes.back().gemm = GemmMode::ProbeMatched;
  for (size_t ri = 0; ri < recipes.size(); ++ri) {
    SCOPED_TRACE("recipe " + std::to_string(ri));
    Recipe on = recipes[ri], off = recipes[ri];
    on.bf16_boundary = true;
    auto W = randn(N * K, 42, 0.1f);
    std::vector<float> dWa(N * K, 0.f), dWb(N * K, 0.f), dWc(N * K, 0.f);
    nn::Linear a(5, K, N, LinearPlan::uniform(on, LinearMode::FP4)), b(5, K, N, LinearPlan::uniform(off, LinearMode::FP4)),
        c(5, K, N, LinearPlan::uniform(off, LinearMode::FP4));
    a.bind(W.data(), dWa.data());
    b.bind(W.data(), dWb.data());
    c.bind(W.data(), dWc.data());
    bool knob_changes_something = false;
    for (int step = 1; step <= 2; ++step) {
      // Inputs with low halves that BF16 rounding changes (RNE ties included).
      auto X = randn(M * K, 50 + step), dY = randn(M * N, 60 + step, 1e-3f);
      X[3] = std::bit_cast<float>(0x3F808000u);  // 1 + 2^-8 + …: a BF16 tie, rounds to even
      const auto Xr = bf16_rounded(X), dYr = bf16_rounded(dY);
      nn::StepContext ctx;
      ctx.step = step;
      ctx.seed = 11;
      ctx.telemetry = step == 1;
      std::vector<float> Ya(M * N), Yb(M * N), Yc(M * N), dXa(M * K, 0.f), dXb(M * K, 0.f),
          dXc(M * K, 0.f);
      a.forward(X.data(), Ya.data(), M, ctx);
      b.forward(Xr.data(), Yb.data(), M, ctx);
      c.forward(X.data(), Yc.data(), M, ctx);
      a.backward(dY.data(), dXa.data(), M, ctx);
      b.backward(dYr.data(), dXb.data(), M, ctx);
      c.backward(dY.data(), dXc.data(), M, ctx);
      EXPECT_TRUE(same_bits(Ya, Yb)) << "fprop, step " << step;
      EXPECT_TRUE(same_bits(dXa, dXb)) << "dgrad, step " << step;
      EXPECT_TRUE(same_bits(dWa, dWb)) << "wgrad, step " << step;
      EXPECT_EQ(a.refs().g_x, b.refs().g_x);
      EXPECT_EQ(a.refs().g_dy, b.refs().g_dy);
      if (step == 1) {
        ASSERT_TRUE(a.telemetry().valid);
        for (int o = 0; o < nn::LinearTelemetry::kOperands; ++o)
          EXPECT_EQ(a.telemetry().op[o].rel_error, b.telemetry().op[o].rel_error) << o;
      }
      knob_changes_something |= !same_bits(Ya, Yc) || !same_bits(dWa, dWc);
    }
    EXPECT_TRUE(knob_changes_something) << "the knob had no effect on unrounded inputs";
    // Inference forward (evaluation's quantized policies) rounds X too.
    auto X = randn(M * K, 70);
    const auto Xr = bf16_rounded(X);
    nn::StepContext inf;
    inf.training = false;
    a.reset_inference();
    b.reset_inference();
    std::vector<float> Ya(M * N), Yb(M * N);
    a.forward(X.data(), Ya.data(), M, inf);
    b.forward(Xr.data(), Yb.data(), M, inf);
    EXPECT_TRUE(same_bits(Ya, Yb)) << "inference fprop";
  }
}

TEST(Linear, Bf16RhtEqualsItsReferenceComposition) {
  // fp4.rht_precision = "bf16": wgrad = GEMM(q(rht16_rows_bf16(dYᵀ)), q(rht16_rows_bf16(Xᵀ))),
  // with the references amax of the BF16-transformed tensors; fprop and dgrad untouched. Both
  // GEMM modes, against their own GEMM called on the reference operands (bit for bit).
  const int64_t M = 48, K = 40, N = 24;
  for (const char* mode : {"decoded", "probe-matched"}) {
    SCOPED_TRACE(mode);
    Recipe r = fp4_recipe(ScaleFormat::E4M3, true, true, 1);
    r.gemm = parse_gemm_mode(mode);
    Recipe r32 = r;
    r.rht_precision = RhtPrecision::BF16;
    auto X = randn(M * K, 81), W = randn(N * K, 82, 0.1f), dY = randn(M * N, 83, 1e-3f);
    std::vector<float> dW(N * K, 0.f), dW32(N * K, 0.f), Y(M * N), Y32(M * N), dX(M * K, 0.f),
        dX32(M * K, 0.f);
    nn::Linear lin(4, K, N, LinearPlan::uniform(r, LinearMode::FP4)), lin32(4, K, N, LinearPlan::uniform(r32, LinearMode::FP4));
    lin.bind(W.data(), dW.data());
    lin32.bind(W.data(), dW32.data());
    nn::StepContext ctx;
    ctx.step = 2;
    ctx.seed = 13;
    lin.forward(X.data(), Y.data(), M, ctx);
    lin.backward(dY.data(), dX.data(), M, ctx);
    lin32.forward(X.data(), Y32.data(), M, ctx);
    lin32.backward(dY.data(), dX32.data(), M, ctx);
    EXPECT_TRUE(same_bits(Y, Y32)) << "fprop does not use the RHT";
    EXPECT_TRUE(same_bits(dX, dX32)) << "dgrad does not use the RHT";
    EXPECT_FALSE(same_bits(dW, dW32)) << "the BF16 RHT must change wgrad";

    auto dYt = transpose(dY, M, N), Xt = transpose(X, M, K);
    rht16_rows_bf16(dYt.data(), N, M);
    rht16_rows_bf16(Xt.data(), K, M);
    const SrKey kw{13, 2, 4, 2, 2};
    std::vector<float> ref(N * K, 0.f);
    if (std::string(mode) == "decoded") {
      const auto dYtq = qdq(dYt, N, M, r.spec_dy(), amax(dYt), &kw);
      const auto Xtq = qdq(Xt, K, M, r.spec_x(), amax(Xt), nullptr);
      sgemm(false, true, N, K, M, 1.f, dYtq.data(), M, Xtq.data(), M, 1.f, ref.data(), K);
    } else {
      std::vector<float> tmp(N * K);  // the Linear accumulates into the zeroed dW
      probe_gemm(quantize_blocks(dYt.data(), N, M, r.spec_dy(), amax(dYt), &kw),
                 quantize_blocks(Xt.data(), K, M, r.spec_x(), amax(Xt), nullptr), tmp.data());
      for (int64_t i = 0; i < N * K; ++i) ref[i] += tmp[i];
    }
    EXPECT_TRUE(same_bits(dW, ref)) << "wgrad";
  }
}
}  // namespace

// ------------------------------------------------------------------------------------------
// fp4.weight_block (docs/recipes.md "Weight tiles apart from the blocks").

namespace {
// The hand-written spec of one operand: UE5M3 or E4M3 scales, T = 448, E2M1, tensor-scaled.
BlockQuantSpec hand_spec(ScaleFormat sf, int block, bool two_d, Rounding rounding) {
  BlockQuantSpec s;
  s.scale_format = sf;
  s.block = block;
  s.two_d = two_d;
  s.target = 448.f;
  s.rounding = rounding;
  return s;
}
}  // namespace

// weight_block = 32 with block = 16: W in 32 × 32 tiles (or 1 × 32 blocks along K for fprop and
// along N for dgrad), X and dY in 1 × 16 blocks in every GEMM. Each GEMM equals its operands
// quantized here with hand-written specs (not the recipe's spec_*()), multiplied in double
// (within 1e-6 of Σ|a·b|, as LinearGemms), and bit for bit the same GEMM the layer calls on
// them: fp4::sgemm in the decoded mode, fp4::probe_gemm in the probe-matched mode. Shapes are
// ragged for both block lengths (K = 72, N = 40); the weights' tiles of 16 give another Y.
TEST(Linear, WeightBlockTilesApartFromTheActivationBlocks) {
  const int64_t M = 48, K = 72, N = 40;
  struct Case {
    ScaleFormat sf;
    bool rht, w2d;
    GemmMode gemm;
  } cases[] = {{ScaleFormat::UE5M3, false, true, GemmMode::Decoded},
               {ScaleFormat::E4M3, true, true, GemmMode::Decoded},
               {ScaleFormat::UE5M3, false, false, GemmMode::Decoded},
               {ScaleFormat::UE5M3, false, true, GemmMode::ProbeMatched},
               {ScaleFormat::E4M3, true, false, GemmMode::ProbeMatched}};
  auto X = randn(M * K, 91), W = randn(N * K, 92, 0.1f), dY = randn(M * N, 93, 1e-3f);
  X[5] = 30.f;                                            // an outlier block of X
  for (int64_t k = 0; k < 16; ++k) W[33 * K + k] *= 50.f;  // a tile of 32 with a loud corner
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(scale_format_name(c.sf)) + (c.rht ? " rht" : "") +
                 (c.w2d ? " 2-D" : " 1-D") + " " + gemm_mode_name(c.gemm));
    Recipe r = fp4_recipe(c.sf, c.rht, c.w2d, 1);
    r.gemm = c.gemm;
    r.weight_block = 32;
    std::vector<float> dW(N * K, 0.f), Y(M * N), dX(M * K, 0.f);
    nn::Linear lin(7, K, N, LinearPlan::uniform(r, LinearMode::FP4));
    lin.bind(W.data(), dW.data());
    nn::StepContext ctx;
    ctx.step = 3;
    ctx.seed = 99;
    lin.forward(X.data(), Y.data(), M, ctx);
    lin.backward(dY.data(), dX.data(), M, ctx);

    const BlockQuantSpec sx = hand_spec(c.sf, 16, false, Rounding::RNE);
    const BlockQuantSpec sw = hand_spec(c.sf, 32, c.w2d, Rounding::RNE);
    const BlockQuantSpec sdy = hand_spec(c.sf, 16, false, Rounding::SR8);
    const SrKey kd{99, 3, 7, 2, 1}, kw{99, 3, 7, 2, 2};
    auto dYt = transpose(dY, M, N), Xt = transpose(X, M, K);
    if (c.rht) {
      rht16_rows(dYt.data(), N, M);
      rht16_rows(Xt.data(), K, M);
    }
    const float gx = amax(X), gw = amax(W), gdy = amax(dY), gdyt = amax(dYt), gxt = amax(Xt);
    const std::vector<float> Wt = transpose(W, N, K);
    std::vector<float> Yr(M * N), dXr(M * K, 0.f), dWr(N * K, 0.f);
    if (c.gemm == GemmMode::Decoded) {
      const auto Xq = qdq(X, M, K, sx, gx, nullptr), Wq = qdq(W, N, K, sw, gw, nullptr);
      // dgrad's W [N, K]: the fprop tiles (2-D), or Wᵀ quantized along N and transposed back.
      const auto Wd = c.w2d ? Wq : transpose(qdq(Wt, K, N, sw, gw, nullptr), K, N);
      const auto dYq = qdq(dY, M, N, sdy, gdy, &kd);
      const auto dYtq = qdq(dYt, N, M, sdy, gdyt, &kw), Xtq = qdq(Xt, K, M, sx, gxt, nullptr);
      std::vector<double> ref, mag;
      matmul_nt(Xq, Wq, M, N, K, ref, mag);
      expect_close(Y, ref, mag, "fprop");
      matmul_nt(dYq, transpose(Wd, N, K), M, K, N, ref, mag);
      expect_close(dX, ref, mag, "dgrad");
      matmul_nt(dYtq, Xtq, N, K, M, ref, mag);
      expect_close(dW, ref, mag, "wgrad");
      sgemm(false, true, M, N, K, 1.f, Xq.data(), K, Wq.data(), K, 0.f, Yr.data(), N);
      sgemm(false, false, M, K, N, 1.f, dYq.data(), N, Wd.data(), K, 1.f, dXr.data(), K);
      sgemm(false, true, N, K, M, 1.f, dYtq.data(), M, Xtq.data(), M, 1.f, dWr.data(), K);
      // Tiles of 16 (the block) instead of 32 give another product.
      const auto Wq16 = qdq(W, N, K, hand_spec(c.sf, 16, c.w2d, Rounding::RNE), gw, nullptr);
      std::vector<float> Y16(M * N);
      sgemm(false, true, M, N, K, 1.f, Xq.data(), K, Wq16.data(), K, 0.f, Y16.data(), N);
      EXPECT_FALSE(same_bits(Y, Y16)) << "weight tiles of 16 would give the same Y";
    } else {
      auto q = [](const std::vector<float>& x, int64_t rr, int64_t cc, const BlockQuantSpec& s,
                  float g, const SrKey* k) { return quantize_blocks(x.data(), rr, cc, s, g, k); };
      std::vector<float> tmp(std::max({M * N, M * K, N * K}));
      probe_gemm(q(X, M, K, sx, gx, nullptr), q(W, N, K, sw, gw, nullptr), Yr.data());
      probe_gemm(q(dY, M, N, sdy, gdy, &kd), q(Wt, K, N, sw, gw, nullptr), tmp.data());
      for (int64_t i = 0; i < M * K; ++i) dXr[i] += tmp[i];  // accumulated into zeros
      probe_gemm(q(dYt, N, M, sdy, gdyt, &kw), q(Xt, K, M, sx, gxt, nullptr), tmp.data());
      for (int64_t i = 0; i < N * K; ++i) dWr[i] += tmp[i];
    }
    EXPECT_TRUE(same_bits(Y, Yr)) << "fprop";
    EXPECT_TRUE(same_bits(dX, dXr)) << "dgrad";
    EXPECT_TRUE(same_bits(dW, dWr)) << "wgrad";
  }
}

// ------------------------------------------------------------------------------------------
// Hadamard transforms on the dgrad and wgrad operands (fp4.hadamard_size, hadamard_gemms,
// hadamard_signs; docs/numerics.md "Random Hadamard transform", "Sizes, roles and sign
// policies").

namespace {
// The transform a Linear of id `layer` applies at `step` (the layer derives it the same way
// from its plan; here from the stated rule directly).
HadamardTransform test_transform(int n, HadamardSigns p, uint64_t seed, uint32_t layer, uint32_t step) {
  return HadamardTransform::make(n, p, RhtPrecision::FP32, seed, layer, step);
}
std::vector<float> rows_transformed(std::vector<float> x, int64_t rows, int64_t cols,
                                    const HadamardTransform& h) {
  hadamard_rows(x.data(), rows, cols, h);
  return x;
}
}  // namespace

TEST(Linear, DgradHadamardKeepsTheExactProduct) {
  // The same orthogonal transform on dY's rows and on W's columns (rows of Wᵀ), both along the
  // contraction dim N: the FP32 product dY·W is unchanged up to rounding (1e-5 of Σ|a·b|), for
  // every size and sign policy.
  const int64_t M = 24, K = 40, N = 128;
  const auto dY = randn(M * N, 61), W = randn(N * K, 62, 0.1f);
  const auto Wt = transpose(W, N, K);  // [K, N]: matmul_nt contracts over N
  std::vector<double> exact, mag;
  matmul_nt(dY, Wt, M, K, N, exact, mag);
  for (int n : {16, 32, 64, 128})
    for (HadamardSigns p : {HadamardSigns::Fixed, HadamardSigns::PerLayer, HadamardSigns::PerStep}) {
      const HadamardTransform h = test_transform(n, p, 3, 5, 8);
      std::vector<double> got, m2;
      matmul_nt(rows_transformed(dY, M, N, h), rows_transformed(Wt, K, N, h), M, K, N, got, m2);
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], exact[i], 1e-5 * mag[i]) << "n " << n << " element " << i;
      // and the transform changes the operands (the test would catch a bypass)
      EXPECT_NE(rows_transformed(dY, M, N, h), dY);
    }
}

TEST(Linear, HadamardGemmsMatchTheirReferenceComposition) {
  // hadamard_size = 64, hadamard_gemms = ["dgrad", "wgrad"], per-step signs, SR on dY: dgrad =
  // GEMM(q(H(dY) along N), q(W with H on its columns)), wgrad = GEMM(q(H(dYᵀ)), q(H(Xᵀ))) along
  // M, each reference the amax of the transformed tensor, signs keyed by (hadamard_seed, layer,
  // step); fprop untouched. Bit for bit against fp4::sgemm on operands built here, 1-D and 2-D
  // weights; any thread count gives the same bits; another step gives other signs.
  const int64_t M = 64, K = 40, N = 64;
  for (bool w2d : {true, false}) {
    SCOPED_TRACE(w2d ? "2-D weights" : "1-D weights");
    Recipe r = fp4_recipe(ScaleFormat::E4M3, true, w2d, 1);
    r.hadamard_size = 64;
    r.hadamard_dgrad = true;
    r.hadamard_signs = HadamardSigns::PerStep;
    const auto X = randn(M * K, 71), W = randn(N * K, 72, 0.1f), dY = randn(M * N, 73, 1e-3f);
    auto run = [&](int64_t step, int threads, std::vector<float>& dX, std::vector<float>& dW) {
      dX.assign(M * K, 0.f);
      dW.assign(N * K, 0.f);
      std::vector<float> Y(M * N), Wc = W;
      nn::Linear lin(7, K, N, LinearPlan::uniform(r, LinearMode::FP4));
      lin.bind(Wc.data(), dW.data());
      nn::StepContext ctx;
      ctx.step = step;
      ctx.seed = 99;
      ctx.hadamard_seed = 5;
      const int saved = omp_get_max_threads();
      omp_set_num_threads(threads);
      lin.forward(X.data(), Y.data(), M, ctx);
      lin.backward(dY.data(), dX.data(), M, ctx);
      omp_set_num_threads(saved);
    };
    std::vector<float> dX, dW, dX2, dW2;
    run(3, 1, dX, dW);
    run(3, 2, dX2, dW2);
    EXPECT_TRUE(same_bits(dX, dX2) && same_bits(dW, dW2)) << "thread count";
    run(4, 2, dX2, dW2);
    EXPECT_FALSE(same_bits(dX, dX2)) << "per-step signs: another step, another dX";

    const HadamardTransform h = test_transform(64, HadamardSigns::PerStep, 5, 7, 3);
    // dgrad
    const auto dYh = rows_transformed(dY, M, N, h);
    const auto Wth = rows_transformed(transpose(W, N, K), K, N, h);  // [K, N]
    const SrKey kd{99, 3, 7, 2, 1};
    const auto dYq = qdq(dYh, M, N, r.spec_dy(), amax(dYh), &kd);
    const auto Wq = w2d ? qdq(transpose(Wth, K, N), N, K, r.spec_w(), amax(Wth), nullptr)
                        : transpose(qdq(Wth, K, N, r.spec_w(), amax(Wth), nullptr), K, N);
    std::vector<float> ref(M * K, 0.f);
    sgemm(false, false, M, K, N, 1.f, dYq.data(), N, Wq.data(), K, 1.f, ref.data(), K);
    EXPECT_TRUE(same_bits(dX, ref)) << "dgrad";
    // wgrad
    const auto dYt = rows_transformed(transpose(dY, M, N), N, M, h);
    const auto Xt = rows_transformed(transpose(X, M, K), K, M, h);
    const SrKey kw{99, 3, 7, 2, 2};
    const auto dYtq = qdq(dYt, N, M, r.spec_dy(), amax(dYt), &kw);
    const auto Xtq = qdq(Xt, K, M, r.spec_x(), amax(Xt), nullptr);
    std::vector<float> refw(N * K, 0.f);
    sgemm(false, true, N, K, M, 1.f, dYtq.data(), M, Xtq.data(), M, 1.f, refw.data(), K);
    EXPECT_TRUE(same_bits(dW, refw)) << "wgrad";
  }
}

TEST(Linear, HadamardShapeRulesNameTheDimension) {
  // wgrad: M % n; dgrad: N % n (check_hadamard_shape), before any gradient is accumulated.
  Recipe r = fp4_recipe(ScaleFormat::E4M3, true, true, 1);
  r.hadamard_size = 32;
  const int64_t K = 16, N = 32;
  std::vector<float> X(48 * K, 1.f), W(N * K, 0.5f), dW(N * K, 0.f), Y(48 * N), dY(48 * N, 1e-3f),
      dX(48 * K, 0.f);
  nn::StepContext ctx;
  {
    nn::Linear lin(1, K, N, LinearPlan::uniform(r, LinearMode::FP4));
    lin.bind(W.data(), dW.data());
    lin.forward(X.data(), Y.data(), 48, ctx);
    try {
      lin.backward(dY.data(), dX.data(), 48, ctx);
      ADD_FAILURE() << "M = 48 with a 32-point wgrad transform";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("needs the token count M = 48 to be a multiple of 32"),
                std::string::npos) << e.what();
    }
  }
  r.rht_wgrad = false;
  r.hadamard_dgrad = true;
  r.hadamard_size = 64;
  nn::Linear lin(2, K, N, LinearPlan::uniform(r, LinearMode::FP4));
  lin.bind(W.data(), dW.data());
  lin.forward(X.data(), Y.data(), 48, ctx);
  try {
    lin.backward(dY.data(), dX.data(), 48, ctx);
    ADD_FAILURE() << "N = 32 with a 64-point dgrad transform";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("dgrad operands needs the output features N = 32 to be a "
                                         "multiple of 64"),
              std::string::npos) << e.what();
  }
  EXPECT_EQ(dW, std::vector<float>(N * K, 0.f)) << "nothing accumulated";
  EXPECT_EQ(dX, std::vector<float>(48 * K, 0.f)) << "nothing accumulated";
}
