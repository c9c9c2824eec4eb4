// Bit-for-bit twin tests of the fast layer kernels (src/nn/layers_fast.cpp) against their plain
// scalar references (src/nn/layers_ref.cpp, fp4::nn::detail::*_ref): RMSNorm forward and
// backward, RoPE forward and backward, squared ReLU, SwiGLU, softmax cross-entropy forward
// (per-row losses and the mean) and backward, residual_add, the vector exp, AdamW::step and
// clip_grad_norm. Every SIMD target the CPU supports (quant_fast_use_target selects the
// layer kernels too), with 1, 2 and 3 OpenMP threads, must reproduce the twin exactly
// (memcmp), on random inputs of several distributions (normal, wide, tiny/subnormal, huge,
// signed zeros, a mixture with exact ties) and adversarial shapes (C = 1, sizes not a multiple
// of 16 or of any vector width, V = 4097 and 50304, more than 2^18 terms so the FP64
// superchunk level is used), rows of all-equal logits and −inf logits. Also: the exp's
// accuracy against exp in double and its special cases, backward accumulation onto non-zero
// gradients, and the exception contracts of the twins.
#include <gtest/gtest.h>
#include <omp.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "fp4/nn/run_config.h"
#include "fp4/nn/layers.h"
#include "fp4/nn/model.h"
#include "fp4/numerics/quant_fast.h"
#include "fp4/train/train.h"

using namespace fp4::nn;
using Vec = std::vector<float>;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

/// Runs f(label) for every SIMD target × {1, 2, 3} threads; restores the defaults after.
void for_each_config(const std::function<void(const std::string&)>& f) {
  const int saved = omp_get_max_threads();
  for (const std::string& t : fp4::quant_fast_targets()) {
    fp4::quant_fast_use_target(t);
    for (int th : {1, 2, 3}) {
      omp_set_num_threads(th);
      f(t + " threads=" + std::to_string(th));
    }
  }
  fp4::quant_fast_use_target("");
  omp_set_num_threads(saved);
}

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

/// memcmp of two float arrays; on a mismatch names the first differing index and both values.
::testing::AssertionResult same_bits(const Vec& got, const Vec& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size differs";
  // Empty vectors: data() may be null, which memcmp must not be given even for 0 bytes.
  if (got.empty() || std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0)
    return ::testing::AssertionSuccess();
  size_t i = 0;
  while (bits(got[i]) == bits(want[i])) ++i;
  char buf[160];
  std::snprintf(buf, sizeof buf, "first mismatch at %zu of %zu: fast %.9g (0x%08x), twin %.9g (0x%08x)",
                i, got.size(), static_cast<double>(got[i]), bits(got[i]),
                static_cast<double>(want[i]), bits(want[i]));
  return ::testing::AssertionFailure() << buf;
}

::testing::AssertionResult same_bits(double got, double want) {
  if (std::memcmp(&got, &want, sizeof got) == 0) return ::testing::AssertionSuccess();
  char buf[120];
  std::snprintf(buf, sizeof buf, "fast %.17g, twin %.17g", got, want);
  return ::testing::AssertionFailure() << buf;
}

enum class Dist { kNormal, kWide, kTiny, kHuge, kZeros, kMixed };
const Dist kDists[] = {Dist::kNormal, Dist::kWide, Dist::kTiny, Dist::kHuge, Dist::kZeros,
                       Dist::kMixed};
const char* dist_name(Dist d) {
  switch (d) {
    case Dist::kNormal: return "normal";
    case Dist::kWide: return "wide";
    case Dist::kTiny: return "tiny";
    case Dist::kHuge: return "huge";
    case Dist::kZeros: return "zeros";
    case Dist::kMixed: return "mixed";
  }
  return "?";
}

float draw(Dist d, std::mt19937& g) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 9);
  switch (d) {
    case Dist::kNormal: return nd(g);
    case Dist::kWide: return 30.0f * nd(g);
    case Dist::kTiny: {  // subnormals and tiny normals, both signs
      const float s = pick(g) < 5 ? 1e-40f : 1e-30f;
      return s * nd(g);
    }
    case Dist::kHuge: {  // squares overflow FP32 for some
      const float s = pick(g) < 5 ? 1e20f : 1e30f;
      return s * nd(g);
    }
    case Dist::kZeros: return pick(g) < 5 ? 0.0f : -0.0f;
    case Dist::kMixed: {
      switch (pick(g)) {
        case 0: return 0.0f;
        case 1: return -0.0f;
        case 2: return 1.0f;  // exact ties
        case 3: return -2.5f;
        case 4: return 1e-42f;
        case 5: return 1e19f * nd(g);
        case 6: return 80.0f + nd(g);  // exp near overflow
        default: return nd(g);
      }
    }
  }
  return 0.0f;
}

Vec make(size_t n, Dist d, uint32_t seed) {
  std::mt19937 g(seed);
  Vec v(n);
  for (auto& x : v) x = draw(d, g);
  return v;
}

Vec randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  Vec v(n);
  for (auto& x : v) x = nd(g);
  return v;
}

// ---------------------------------------------------------------- exp
TEST(ExpTwin, VectorMatchesScalarOnEveryTarget) {
  Vec x = {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, 88.0f, 88.72283172607421875f,
           std::nextafter(88.72283172607421875f, 100.0f), 89.0f, 1e30f, kInf, -kInf,
           -87.0f, -87.33654f, -88.0f, -100.0f, -103.9f, -103.97208f, -104.0f,
           std::nextafter(-104.0f, -200.0f), -1e30f, std::numeric_limits<float>::quiet_NaN(),
           -std::numeric_limits<float>::quiet_NaN(), 1e-45f, -1e-45f, 1e-8f, FLT_MIN};
  std::mt19937 g(7);
  std::uniform_real_distribution<float> u(-110.0f, 95.0f);
  for (int i = 0; i < 100000; ++i) x.push_back(u(g));
  for (float v = -1.0f; v < 1.0f; v += 1.0f / 4096) x.push_back(v);  // near 0 and ties of k
  for (int k = -150; k <= 128; ++k)  // half-way points of the range reduction
    x.push_back(static_cast<float>((k + 0.5) * 0.6931471805599453));
  Vec want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = detail::exp_ref(x[i]);
  for (size_t len : {x.size(), size_t{1}, size_t{5}, size_t{17}}) {
    for_each_config([&](const std::string& cfg) {
      Vec got(len);
      detail::exp_fast(got.data(), x.data(), static_cast<int64_t>(len));
      EXPECT_TRUE(same_bits(got, Vec(want.begin(), want.begin() + static_cast<long>(len))))
          << cfg << " len " << len;
    });
  }
}

TEST(ExpTwin, SpecialCases) {
  EXPECT_EQ(bits(detail::exp_ref(-kInf)), bits(0.0f));
  EXPECT_EQ(bits(detail::exp_ref(-1e30f)), bits(0.0f));
  EXPECT_EQ(bits(detail::exp_ref(-104.5f)), bits(0.0f));
  EXPECT_EQ(detail::exp_ref(kInf), kInf);
  EXPECT_EQ(detail::exp_ref(89.0f), kInf);
  EXPECT_EQ(detail::exp_ref(std::nextafter(88.72283172607421875f, 100.0f)), kInf);
  EXPECT_TRUE(std::isfinite(detail::exp_ref(88.72283172607421875f)));
  EXPECT_TRUE(std::isnan(detail::exp_ref(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(detail::exp_ref(0.0f), 1.0f);
  EXPECT_EQ(detail::exp_ref(-0.0f), 1.0f);
}

// Max error in units of the last place of the correctly rounded FP32 result (normal results),
// and in units of 2^−149 for subnormal results, over a dense sample of [−104, 88.72].
TEST(ExpTwin, AccuracyAgainstDoubleExp) {
  double max_ulp = 0.0, max_sub = 0.0;
  float worst = 0.0f;
  auto check = [&](float x) {
    const double e = std::exp(static_cast<double>(x));
    const double y = detail::exp_ref(x);
    if (e >= FLT_MIN) {
      const float ef = static_cast<float>(e);
      const double ulp = std::nextafter(ef, kInf) - static_cast<double>(ef);
      const double err = std::fabs(y - e) / ulp;
      if (err > max_ulp) {
        max_ulp = err;
        worst = x;
      }
    } else {
      max_sub = std::max(max_sub, std::fabs(y - e) / 0x1p-149);
    }
  };
  std::mt19937 g(11);
  std::uniform_real_distribution<float> u(-104.0f, 88.72283172607421875f);
  for (int i = 0; i < 2000000; ++i) check(u(g));
  for (float x = -2.0f; x < 2.0f; x = std::nextafter(x, 3.0f) + 1e-7f) check(x);
  check(88.72283172607421875f);
  check(-87.33654f);
  // Measured here: 0.973 ulp (normal results), 0.749 of 2^−149 (subnormal results).
  EXPECT_LE(max_ulp, 2.0) << "worst x = " << worst;
  EXPECT_LE(max_sub, 1.0);
  std::printf("exp_ref: max error %.3f ulp (normal results, worst x = %.9g), %.3f x 2^-149 "
              "(subnormal results)\n",
              max_ulp, static_cast<double>(worst), max_sub);
}

// ---------------------------------------------------------------- RMSNorm
TEST(RmsNormTwin, ForwardAndBackwardBitExact) {
  struct S { int64_t BT, C; };
  const S shapes[] = {{1, 1}, {3, 7}, {5, 16}, {4, 17}, {2, 100}, {64, 768}, {3, 1025},
                      {2, 2100}, {1, 300000}};
  uint32_t seed = 1;
  for (const S& s : shapes)
    for (Dist d : kDists) {
      if (s.C >= 300000 && d != Dist::kNormal) continue;
      const size_t n = static_cast<size_t>(s.BT * s.C);
      const Vec x = make(n, d, seed++), w = make(static_cast<size_t>(s.C), Dist::kNormal, seed++);
      const Vec dout = make(n, d == Dist::kZeros ? Dist::kNormal : d, seed++);
      const Vec dx0 = randn(n, seed++), dw0 = randn(static_cast<size_t>(s.C), seed++);
      Vec out_r(n), rstd_r(static_cast<size_t>(s.BT)), dx_r = dx0, dw_r = dw0;
      detail::rmsnorm_forward_ref(out_r.data(), rstd_r.data(), x.data(), w.data(), s.BT, s.C,
                                  1e-5f);
      detail::rmsnorm_backward_ref(dx_r.data(), dw_r.data(), dout.data(), x.data(), w.data(),
                                   rstd_r.data(), s.BT, s.C);
      for_each_config([&](const std::string& cfg) {
        const std::string what = cfg + " BT=" + std::to_string(s.BT) +
                                  " C=" + std::to_string(s.C) + " " + dist_name(d);
        Vec out(n), rstd(static_cast<size_t>(s.BT)), dx = dx0, dw = dw0;
        rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), s.BT, s.C, 1e-5f);
        EXPECT_TRUE(same_bits(out, out_r)) << "out " << what;
        EXPECT_TRUE(same_bits(rstd, rstd_r)) << "rstd " << what;
        rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd_r.data(),
                         s.BT, s.C);
        EXPECT_TRUE(same_bits(dx, dx_r)) << "dx " << what;
        EXPECT_TRUE(same_bits(dw, dw_r)) << "dweight " << what;
      });
    }
}

// ---------------------------------------------------------------- RoPE
TEST(RopeTwin, ForwardAndBackwardBitExact) {
  struct S { int64_t B, T, H, hd; float theta; };
  const S shapes[] = {{1, 1, 1, 2, 10000.f}, {2, 5, 3, 6, 10000.f}, {1, 7, 2, 18, 500.f},
                      {2, 9, 4, 64, 10000.f}, {1, 3, 1, 34, 1e6f}, {4, 64, 4, 64, 10000.f}};
  uint32_t seed = 100;
  for (const S& s : shapes)
    for (Dist d : kDists) {
      const size_t n = static_cast<size_t>(s.B * s.T * s.H * s.hd);
      const Vec x = make(n, d, seed++);
      Vec f_r = x, b_r = x;
      detail::rope_forward_ref(f_r.data(), s.B, s.T, s.H, s.hd, s.theta);
      detail::rope_backward_ref(b_r.data(), s.B, s.T, s.H, s.hd, s.theta);
      for_each_config([&](const std::string& cfg) {
        const std::string what = cfg + " T=" + std::to_string(s.T) + " H=" +
                                 std::to_string(s.H) + " hd=" + std::to_string(s.hd) + " " +
                                 dist_name(d);
        Vec f = x, b = x;
        rope_forward(f.data(), s.B, s.T, s.H, s.hd, s.theta);
        rope_backward(b.data(), s.B, s.T, s.H, s.hd, s.theta);
        EXPECT_TRUE(same_bits(f, f_r)) << "forward " << what;
        EXPECT_TRUE(same_bits(b, b_r)) << "backward " << what;
      });
    }
  Vec x(6);
  EXPECT_THROW(detail::rope_forward_ref(x.data(), 1, 1, 1, 3, 1e4f), std::invalid_argument);
  EXPECT_THROW(detail::rope_backward_ref(x.data(), 1, 1, 1, 0, 1e4f), std::invalid_argument);
}

// ---------------------------------------------------------------- squared ReLU, residual
TEST(ElementwiseTwin, SquaredReluAndResidualAddBitExact) {
  uint32_t seed = 200;
  for (int64_t n : std::vector<int64_t>{0, 1, 15, 17, 1000, 40000, 70001})
    for (Dist d : kDists) {
      const size_t un = static_cast<size_t>(n);
      const Vec x = make(un, d, seed++), dout = make(un, Dist::kNormal, seed++);
      const Vec dx0 = make(un, d, seed++);
      Vec out_r(un), dx_r = dx0, add_r = dx0;
      detail::squared_relu_forward_ref(out_r.data(), x.data(), n);
      detail::squared_relu_backward_ref(dx_r.data(), dout.data(), x.data(), n);
      detail::residual_add_ref(add_r.data(), x.data(), n);
      for_each_config([&](const std::string& cfg) {
        const std::string what = cfg + " n=" + std::to_string(n) + " " + dist_name(d);
        Vec out(un), dx = dx0, add = dx0;
        squared_relu_forward(out.data(), x.data(), n);
        squared_relu_backward(dx.data(), dout.data(), x.data(), n);
        residual_add(add.data(), x.data(), n);
        EXPECT_TRUE(same_bits(out, out_r)) << "sqrelu fwd " << what;
        EXPECT_TRUE(same_bits(dx, dx_r)) << "sqrelu bwd " << what;
        EXPECT_TRUE(same_bits(add, add_r)) << "residual_add " << what;
      });
    }
}

// ---------------------------------------------------------------- SwiGLU
TEST(SwigluTwin, ForwardAndBackwardBitExact) {
  struct S { int64_t BT, F; };
  const S shapes[] = {{1, 1}, {3, 17}, {2, 50}, {5, 33}, {32, 2048}};
  uint32_t seed = 300;
  for (const S& s : shapes)
    for (Dist d : kDists) {
      const size_t nx = static_cast<size_t>(s.BT * 2 * s.F), no = static_cast<size_t>(s.BT * s.F);
      const Vec x = make(nx, d, seed++), dout = make(no, Dist::kNormal, seed++);
      const Vec dx0 = randn(nx, seed++);
      Vec out_r(no), dx_r = dx0;
      detail::swiglu_forward_ref(out_r.data(), x.data(), s.BT, s.F);
      detail::swiglu_backward_ref(dx_r.data(), dout.data(), x.data(), s.BT, s.F);
      for_each_config([&](const std::string& cfg) {
        const std::string what = cfg + " BT=" + std::to_string(s.BT) +
                                 " F=" + std::to_string(s.F) + " " + dist_name(d);
        Vec out(no), dx = dx0;
        swiglu_forward(out.data(), x.data(), s.BT, s.F);
        swiglu_backward(dx.data(), dout.data(), x.data(), s.BT, s.F);
        EXPECT_TRUE(same_bits(out, out_r)) << "forward " << what;
        EXPECT_TRUE(same_bits(dx, dx_r)) << "backward " << what;
      });
    }
}

// ---------------------------------------------------------------- cross-entropy
TEST(CrossEntropyTwin, ForwardAndBackwardBitExact) {
  struct S { int64_t BT, V; };
  const S shapes[] = {{1, 1}, {3, 17}, {4, 100}, {2, 4097}, {2, 50304}, {1, 300000}};
  uint32_t seed = 400;
  for (const S& s : shapes)
    for (int kind = 0; kind < 8; ++kind) {
      if (s.V >= 300000 && kind > 1) continue;
      const size_t n = static_cast<size_t>(s.BT * s.V);
      Vec z;
      if (kind < 6) {
        // Huge logits: the row max dominates and every other exp underflows.
        z = make(n, kDists[kind], seed++);
      } else if (kind == 6) {  // rows of all-equal logits (one row all −0)
        z.assign(n, 3.25f);
        for (int64_t v = 0; v < s.V; ++v) z[static_cast<size_t>(v)] = -0.0f;
      } else {  // −inf logits (never the whole row), incl. at the target of row 0
        z = make(n, Dist::kNormal, seed++);
        for (size_t i = 0; i < n; i += 3) z[i] = -kInf;
        if (s.V > 1) z[1] = 0.5f;
      }
      std::vector<int32_t> y(static_cast<size_t>(s.BT));
      std::mt19937 g(seed++);
      for (auto& t : y) t = std::uniform_int_distribution<int32_t>(0, static_cast<int32_t>(s.V - 1))(g);
      if (kind == 7) y[0] = 0;
      Vec loss_r(static_cast<size_t>(s.BT)), dz_r(n);
      const double mean_r =
          detail::cross_entropy_forward_ref(loss_r.data(), z.data(), y.data(), s.BT, s.V);
      detail::cross_entropy_backward_ref(dz_r.data(), z.data(), y.data(), s.BT, s.V,
                                         1.0f / static_cast<float>(s.BT));
      for_each_config([&](const std::string& cfg) {
        const std::string what = cfg + " BT=" + std::to_string(s.BT) + " V=" +
                                 std::to_string(s.V) + " kind=" + std::to_string(kind);
        Vec loss(static_cast<size_t>(s.BT)), dz(n, 7.0f);
        const double mean = cross_entropy_forward(loss.data(), z.data(), y.data(), s.BT, s.V);
        EXPECT_TRUE(same_bits(mean, mean_r)) << "mean " << what;
        EXPECT_TRUE(same_bits(loss, loss_r)) << "losses " << what;
        EXPECT_TRUE(same_bits(cross_entropy_forward(nullptr, z.data(), y.data(), s.BT, s.V),
                              mean_r))
            << "mean (no losses) " << what;
        cross_entropy_backward(dz.data(), z.data(), y.data(), s.BT, s.V,
                               1.0f / static_cast<float>(s.BT));
        EXPECT_TRUE(same_bits(dz, dz_r)) << "dlogits " << what;
        Vec inplace = z;  // the model computes the gradient over the logits themselves
        cross_entropy_backward(inplace.data(), inplace.data(), y.data(), s.BT, s.V,
                               1.0f / static_cast<float>(s.BT));
        EXPECT_TRUE(same_bits(inplace, dz_r)) << "dlogits in place " << what;
      });
      Vec inplace_r = z;
      detail::cross_entropy_backward_ref(inplace_r.data(), inplace_r.data(), y.data(), s.BT, s.V,
                                         1.0f / static_cast<float>(s.BT));
      EXPECT_TRUE(same_bits(inplace_r, dz_r)) << "twin in place";
    }
}

TEST(CrossEntropyTwin, RefSanityAndErrors) {
  // All-equal logits: loss = log V exactly enough; the gradient sums to 0.
  const int64_t V = 4097;
  Vec z(static_cast<size_t>(V), 1.5f), dz(static_cast<size_t>(V));
  const int32_t y = 5;
  const double l = detail::cross_entropy_forward_ref(nullptr, z.data(), &y, 1, V);
  EXPECT_NEAR(l, std::log(static_cast<double>(V)), 1e-6);
  detail::cross_entropy_backward_ref(dz.data(), z.data(), &y, 1, V, 1.0f);
  double s = 0.0;
  for (float v : dz) s += v;
  EXPECT_NEAR(s, 0.0, 1e-5);
  const int32_t bad = static_cast<int32_t>(V);
  EXPECT_THROW(detail::cross_entropy_forward_ref(nullptr, z.data(), &bad, 1, V), std::out_of_range);
  EXPECT_THROW(detail::cross_entropy_backward_ref(dz.data(), z.data(), &bad, 1, V, 1.0f),
               std::out_of_range);
  EXPECT_THROW(cross_entropy_forward(nullptr, z.data(), &bad, 1, V), std::out_of_range);
}

// ---------------------------------------------------------------- optimizer
TEST(OptimTwin, ClipGradNormBitExact) {
  uint32_t seed = 500;
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{17}, int64_t{5000}, (int64_t{1} << 18) + 37, int64_t{600000}})
    for (Dist d : kDists)
      for (double max_norm : {0.0, 1e-3, 1e30}) {
        const Vec g0 = make(static_cast<size_t>(n), d, seed++);
        Vec g_r = g0;
        const double norm_r = fp4::detail::clip_grad_norm_ref(g_r.data(), n, max_norm);
        for_each_config([&](const std::string& cfg) {
          Vec g = g0;
          const double norm = fp4::clip_grad_norm(g.data(), n, max_norm);
          const std::string what = cfg + " n=" + std::to_string(n) + " " + dist_name(d);
          EXPECT_TRUE(same_bits(norm, norm_r)) << "norm " << what;
          EXPECT_TRUE(same_bits(g, g_r)) << "clipped g " << what;
        });
      }
}

// Gradient-norm overflow (docs/numerics.md "Gradient clipping"). By hand: 128 entries of 1e19
// have the norm sqrt(128)·1e19 = 1.1314e20, far below FLT_MAX, and clipping to max_norm 2
// scales every entry to 2/sqrt(128) = 0.17678. Four entries of 1e19: norm 2e19. 1000 entries of
// ±FLT_MAX: norm sqrt(1000)·3.4028e38 = 1.0761e40 (the norm is a double). None of these may
// come out Inf.
TEST(OptimTwin, ClipGradNormHugeEntriesHandComputed) {
  const auto check = [](const std::string& what, double (*clip)(float*, int64_t, double)) {
    Vec g(128, 1e19f);
    const double norm = clip(g.data(), 128, 2.0);
    EXPECT_NEAR(norm, 1.1314e20, 1.1314e20 * 1e-4) << what;
    for (float v : g) EXPECT_NEAR(v, 0.17678f, 0.17678f * 1e-4f) << what;
    Vec four(4, 1e19f);
    EXPECT_NEAR(clip(four.data(), 4, 0.0), 2e19, 2e19 * 1e-6) << what;
    for (float v : four) EXPECT_EQ(v, 1e19f) << what << ": max_norm 0 never clips";
    Vec top(1000);
    for (size_t i = 0; i < top.size(); ++i) top[i] = i % 3 == 0 ? -FLT_MAX : FLT_MAX;
    const double tn = clip(top.data(), 1000, 1.0);
    EXPECT_NEAR(tn, 1.0761e40, 1.0761e40 * 1e-4) << what;
    for (float v : top) EXPECT_NEAR(std::fabs(v), 1.0 / std::sqrt(1000.0), 1e-6) << what;
  };
  check("twin", &fp4::detail::clip_grad_norm_ref);
  for_each_config([&](const std::string& cfg) { check(cfg, &fp4::clip_grad_norm); });
}

// A real Inf or NaN gradient gives a non-finite norm and leaves g untouched, so the trainer's
// step (train_step: "non-finite gradient norm") skips the update.
TEST(OptimTwin, ClipGradNormNonFiniteLeavesGradients) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (float bad : {kInf, -kInf, nan}) {
    Vec g0(3000, 0.5f);
    g0[1700] = bad;
    const auto check = [&](const std::string& what, double (*clip)(float*, int64_t, double)) {
      Vec g = g0;
      const double norm = clip(g.data(), static_cast<int64_t>(g.size()), 1.0);
      if (std::isnan(bad)) {
        EXPECT_TRUE(std::isnan(norm)) << what << ": " << norm;
      } else {
        EXPECT_EQ(norm, std::numeric_limits<double>::infinity()) << what;
      }
      EXPECT_TRUE(same_bits(g, g0)) << what;
    };
    check("twin", &fp4::detail::clip_grad_norm_ref);
    for_each_config([&](const std::string& cfg) { check(cfg, &fp4::clip_grad_norm); });
  }
}

TEST(OptimTwin, AdamWStepBitExact) {
  fp4::TrainConfig c;
  c.beta1 = 0.9;
  c.beta2 = 0.95;
  c.eps = 1e-8;
  c.weight_decay = 0.1;
  const int64_t n = 70001;
  const std::vector<ParamInfo> infos = [] {
    std::vector<ParamInfo> v(3);
    v[0].offset = 0;
    v[0].size = 17;
    v[0].weight_decay = false;
    v[1].offset = 17;
    v[1].size = 50000;
    v[1].weight_decay = true;
    v[2].offset = 50017;
    v[2].size = 19984;
    v[2].weight_decay = true;
    return v;
  }();
  uint32_t seed = 600;
  for (Dist d : kDists) {
    const Vec p0 = make(static_cast<size_t>(n), Dist::kNormal, seed++);
    std::vector<Vec> grads;
    for (int s = 0; s < 3; ++s) grads.push_back(make(static_cast<size_t>(n), d, seed++));
    fp4::AdamW ref(n, c);
    Vec p_r = p0;
    for (int s = 0; s < 3; ++s) ref.step_ref(p_r.data(), grads[s].data(), infos, 3e-3, s + 1);
    for_each_config([&](const std::string& cfg) {
      fp4::AdamW opt(n, c);
      Vec p = p0;
      for (int s = 0; s < 3; ++s) opt.step(p.data(), grads[s].data(), infos, 3e-3, s + 1);
      const std::string what = cfg + " " + dist_name(d);
      EXPECT_TRUE(same_bits(p, p_r)) << "params " << what;
      EXPECT_TRUE(same_bits(opt.m(), ref.m())) << "m " << what;
      EXPECT_TRUE(same_bits(opt.v(), ref.v())) << "v " << what;
    });
  }
}

}  // namespace
