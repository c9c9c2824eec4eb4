// The fidelity panel's statistics (fp4/study/fidelity.h, docs/fidelity.md "Metrics"): exact
// estimates, a hand-computed case, the bias/variance split on a synthetic estimator of known bias
// and variance, stochastic rounding's unbiased mean against RNE's bias, and the two-level
// bootstrap against binomial closed forms. The panel itself: tests/cli/fidelity_cli.sh.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "fp4/numerics/block_quant.h"
#include "fp4/study/fidelity.h"

using namespace fp4;

namespace {
DrawMetrics metrics(const std::vector<std::vector<float>>& draws, const std::vector<float>& ref) {
  std::vector<const float*> est;
  for (const auto& d : draws) est.push_back(d.data());
  return draw_metrics(draw_moments(est, ref.data(), int64_t(ref.size())));
}

TEST(FidelityStats, AnExactEstimateHasErrorZeroCosineOneGainOne) {
  std::mt19937 g(1);
  std::normal_distribution<float> nd;
  std::vector<float> ref(1000);
  for (auto& v : ref) v = nd(g);
  const DrawMetrics m = metrics({ref, ref, ref}, ref);
  EXPECT_EQ(m.rel_error, 0.0);
  EXPECT_EQ(m.gain, 1.0);
  EXPECT_EQ(m.mse, 0.0);
  EXPECT_EQ(m.bias2, 0.0);
  EXPECT_EQ(m.variance, 0.0);
  EXPECT_NEAR(m.cosine, 1.0, 1e-15);  // ⟨g, g⟩/(‖g‖‖g‖): one rounding of a square root apart
}

// g* = (3, 4), ‖g*‖ = 5. One draw (3, 5): error 1, so rel 1/5, gain ⟨(3,5),(3,4)⟩/25 = 29/25,
// cosine 29/(√34·5), mse 1/25 = bias², no variance. Two draws (3, 5) and (3, 3): the mean is g*
// itself; V = (1 + 1)/(2 − 1) = 2, so variance 2/25 and bias² (0 − 2/2)/25 = −1/25 (the
// finite-R correction overshoots a zero bias), and bias² + variance = mse = 1/25.
TEST(FidelityStats, HandComputedCase) {
  const std::vector<float> ref = {3, 4};
  const DrawMetrics one = metrics({{3, 5}}, ref);
  EXPECT_DOUBLE_EQ(one.rel_error, 0.2);
  EXPECT_DOUBLE_EQ(one.gain, 29.0 / 25.0);
  EXPECT_DOUBLE_EQ(one.cosine, 29.0 / (std::sqrt(34.0) * 5.0));
  EXPECT_DOUBLE_EQ(one.mse, 1.0 / 25.0);
  EXPECT_DOUBLE_EQ(one.bias2, 1.0 / 25.0);
  EXPECT_EQ(one.variance, 0.0);
  const DrawMetrics two = metrics({{3, 5}, {3, 3}}, ref);
  EXPECT_DOUBLE_EQ(two.rel_error, 0.2);
  EXPECT_DOUBLE_EQ(two.gain, (29.0 + 21.0) / 2.0 / 25.0);
  EXPECT_DOUBLE_EQ(two.mse, 1.0 / 25.0);
  EXPECT_DOUBLE_EQ(two.variance, 2.0 / 25.0);
  EXPECT_DOUBLE_EQ(two.bias2, -1.0 / 25.0);
  // Disjoint ranges: the second coordinate alone.
  std::vector<float> d1 = {3, 5}, d2 = {3, 3};
  const DrawMetrics part = draw_metrics(draw_moments({d1.data(), d2.data()}, ref.data(), {{1, 2}}));
  EXPECT_DOUBLE_EQ(part.variance, 2.0 / 16.0);
  EXPECT_DOUBLE_EQ(part.rel_error, 0.25);
}

// ĝ_d = g* + b + s_d, s_d ~ N(0, σ²) per coordinate: over many trials of R = 4 draws the
// corrected bias² averages ‖b‖²/‖g*‖² and the variance nσ²/‖g*‖²; the uncorrected ‖ḡ − g*‖²
// would average (‖b‖² + nσ²/R)/‖g*‖², which the test tells apart.
TEST(FidelityStats, BiasVarianceSplitRecoversAKnownBiasAndVariance) {
  const int n = 400, R = 4, trials = 400;
  const double sigma = 0.3;
  std::mt19937 g(7);
  std::normal_distribution<double> nd;
  std::vector<float> ref(n), bias(n);
  double ref2 = 0, b2 = 0;
  for (int i = 0; i < n; ++i) {
    ref[i] = float(nd(g));
    bias[i] = float(0.1 * nd(g));
    ref2 += double(ref[i]) * ref[i];
  }
  std::vector<std::vector<float>> draws(R, std::vector<float>(n));
  // The bias as it enters the draws (in float).
  for (int i = 0; i < n; ++i) {
    const double b = double(float(ref[i] + bias[i])) - ref[i];
    b2 += b * b;
  }
  double mb = 0, mv = 0, raw = 0;
  for (int t = 0; t < trials; ++t) {
    for (auto& d : draws)
      for (int i = 0; i < n; ++i) d[i] = float(double(ref[i] + bias[i]) + sigma * nd(g));
    const DrawMetrics m = metrics(draws, ref);
    mb += m.bias2;
    mv += m.variance;
    raw += m.bias2 + m.variance / R;  // = ‖ḡ − g*‖²/‖g*‖²
  }
  mb /= trials, mv /= trials, raw /= trials;
  const double want_b = b2 / ref2, want_v = n * sigma * sigma / ref2;
  // Standard errors: bias² about √(4‖b‖²σ²/R + 2n(σ²/R)²)/‖g*‖²/√trials ≈ 5e-4 here.
  EXPECT_NEAR(mb, want_b, 0.003) << "corrected bias2";
  EXPECT_NEAR(mv, want_v, 0.01 * want_v + 0.003) << "variance";
  EXPECT_GT(raw - want_b, 0.5 * want_v / R) << "the uncorrected estimate must be visibly biased here";
}

// Stochastic rounding is unbiased: the mean of many SR8 quantizations approaches x, so the
// corrected bias² is far below RNE's, whose draws are identical (variance exactly 0, all bias).
TEST(FidelityStats, SrMeanConvergesToTheExactValueAndRneDoesNot) {
  const int n = 512, R = 64;
  std::mt19937 g(3);
  std::normal_distribution<float> nd;
  std::vector<float> x(n);
  for (auto& v : x) v = nd(g);
  const float amax = tensor_amax(x.data(), n);
  BlockQuantSpec spec;
  std::vector<std::vector<float>> rne(R, std::vector<float>(n)), sr(R, std::vector<float>(n));
  for (int d = 0; d < R; ++d) {
    quantize_dequantize(x.data(), 1, n, spec, amax, nullptr, rne[d].data());
    BlockQuantSpec s = spec;
    s.rounding = Rounding::SR8;
    SrKey key{uint64_t(100 + d), 1, 0, 2, 1, 0};
    quantize_dequantize(x.data(), 1, n, s, amax, &key, sr[d].data());
  }
  const DrawMetrics mr = metrics(rne, x), ms = metrics(sr, x);
  EXPECT_EQ(mr.variance, 0.0);
  EXPECT_NEAR(mr.bias2, mr.mse, 1e-12 * mr.mse);  // all of RNE's error is bias
  EXPECT_GT(mr.bias2, 1e-4);
  EXPECT_GT(ms.variance, mr.mse) << "SR's per-draw error exceeds RNE's";
  EXPECT_LT(std::fabs(ms.bias2), 0.1 * mr.bias2) << "SR's mean is (nearly) unbiased";
}

// One checkpoint, K = 2 values {0, 1}: a resample mean is 0, 1/2 or 1 with probabilities
// 1/4, 1/2, 1/4, so the 2.5% and 97.5% quantiles are 0 and 1. K = 4 values {0, 0, 0, 1}:
// P(mean = 0) = (3/4)^4 ≈ 0.32 and P(mean = 1) = 1/256 < 2.5% < P(mean ≥ 3/4) ≈ 0.051, so
// [0, 3/4]. Constant data give a point interval; several checkpoints keep the overall mean.
TEST(FidelityStats, TwoLevelBootstrapGivesTheBinomialIntervals) {
  const Interval a = bootstrap_two_level({{0.0, 1.0}}, 20000, 5);
  EXPECT_DOUBLE_EQ(a.mean, 0.5);
  EXPECT_DOUBLE_EQ(a.lo, 0.0);
  EXPECT_DOUBLE_EQ(a.hi, 1.0);
  const Interval b = bootstrap_two_level({{0.0, 0.0, 0.0, 1.0}}, 20000, 5);
  EXPECT_DOUBLE_EQ(b.mean, 0.25);
  EXPECT_DOUBLE_EQ(b.lo, 0.0);
  EXPECT_DOUBLE_EQ(b.hi, 0.75);
  const Interval c = bootstrap_two_level({{2.0, 2.0}, {2.0, 2.0}, {2.0, 2.0}}, 100, 1);
  EXPECT_EQ(c.mean, 2.0);
  EXPECT_EQ(c.lo, 2.0);
  EXPECT_EQ(c.hi, 2.0);
  // Checkpoints are resampled too: two checkpoints of constant rows 0 and 1 give a resample
  // mean of 0, 1/2 or 1 (which rows were drawn), the interval [0, 1].
  const Interval d = bootstrap_two_level({{0.0, 0.0, 0.0}, {1.0, 1.0, 1.0}}, 20000, 9);
  EXPECT_DOUBLE_EQ(d.mean, 0.5);
  EXPECT_DOUBLE_EQ(d.lo, 0.0);
  EXPECT_DOUBLE_EQ(d.hi, 1.0);
  // The same seed gives the same interval.
  const Interval e = bootstrap_two_level({{0.3, 0.1, 0.7}, {0.2, 0.9, 0.4}}, 500, 11),
                 f = bootstrap_two_level({{0.3, 0.1, 0.7}, {0.2, 0.9, 0.4}}, 500, 11);
  EXPECT_EQ(e.lo, f.lo);
  EXPECT_EQ(e.hi, f.hi);
  // Rows of different lengths (a rollout set with a rollout left out): {0} and {1, 1}. The mean
  // is over the values, 2/3; a resample draws 2 rows and as many values from each as it holds:
  // rows (0, 0) give 0, (1, 1) give 1, one of each gives 2/3 (two ones and a zero), with
  // probabilities 1/4, 1/4, 1/2: the interval [0, 1].
  const Interval g = bootstrap_two_level({{0.0}, {1.0, 1.0}}, 20000, 3);
  EXPECT_DOUBLE_EQ(g.mean, 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(g.lo, 0.0);
  EXPECT_DOUBLE_EQ(g.hi, 1.0);
}

TEST(FidelityStats, BadInputIsRefused) {
  EXPECT_THROW(bootstrap_two_level({}, 10, 1), std::invalid_argument);
  EXPECT_THROW(bootstrap_two_level({{}}, 10, 1), std::invalid_argument);
  EXPECT_THROW(bootstrap_two_level({{1.0, 2.0}, {}}, 10, 1), std::invalid_argument);
  EXPECT_THROW(bootstrap_two_level({{1.0, NAN}}, 10, 1), std::invalid_argument);
  EXPECT_THROW(bootstrap_two_level({{1.0}}, 0, 1), std::invalid_argument);
  const std::vector<float> ref = {1, 2};
  EXPECT_THROW(draw_moments({}, ref.data(), 2), std::invalid_argument);
  EXPECT_THROW(draw_moments({nullptr}, ref.data(), 2), std::invalid_argument);
}
}  // namespace
