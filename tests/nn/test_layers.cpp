// Tests for the non-linear decoder layers (fp4/nn/layers.h): finite-difference gradient
// checks for every input/parameter gradient, accumulation semantics, hand-computed values,
// attention causality and a double-precision attention reference, 1-vs-2-thread
// bit-identity, and out-of-range errors.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "fp4/nn/layers.h"

using namespace fp4::nn;

namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(g);
  return v;
}

std::vector<int32_t> randint(size_t n, int32_t V, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int32_t> d(0, V - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Central differences of loss() w.r.t. every entry of x, compared with the analytic grad:
// |g − fd| ≤ atol + rtol·|fd|. x is restored afterwards.
void check_grad(const char* what, std::vector<float>& x, const std::vector<float>& grad,
                const std::function<double()>& loss, float h = 1e-3f, double rtol = 1e-2,
                double atol = 2e-3) {
  ASSERT_EQ(x.size(), grad.size());
  double worst = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float x0 = x[i];
    const float xp = x0 + h, xm = x0 - h;
    x[i] = xp;
    const double lp = loss();
    x[i] = xm;
    const double lm = loss();
    x[i] = x0;
    const double fd = (lp - lm) / (static_cast<double>(xp) - static_cast<double>(xm));
    const double err = std::fabs(grad[i] - fd);
    worst = std::max(worst, err / (atol + rtol * std::fabs(fd)));
    EXPECT_LE(err, atol + rtol * std::fabs(fd))
        << what << "[" << i << "]: analytic " << grad[i] << " vs finite difference " << fd;
  }
  EXPECT_LE(worst, 1.0) << what;
}

// Expects b == 2·a up to float rounding of the second accumulation.
void expect_doubled(const char* what, const std::vector<float>& once,
                    const std::vector<float>& twice) {
  ASSERT_EQ(once.size(), twice.size());
  for (size_t i = 0; i < once.size(); ++i)
    EXPECT_NEAR(twice[i], 2.0f * once[i], 1e-6f * (1.0f + std::fabs(once[i])))
        << what << "[" << i << "]";
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Runs fn with n OpenMP threads, restoring the previous setting.
template <class F>
void with_threads(int n, F&& fn) {
  const int prev = omp_get_max_threads();
  omp_set_num_threads(n);
  fn();
  omp_set_num_threads(prev);
}

}  // namespace

// ============================================================================ embedding

TEST(Embedding, ForwardCopiesRows) {
  const int64_t BT = 4, C = 3, V = 5;
  const auto wte = randn(V * C, 1);
  const std::vector<int32_t> tok = {4, 0, 2, 4};
  std::vector<float> out(BT * C);
  embedding_forward(out.data(), tok.data(), wte.data(), BT, C, V);
  for (int64_t t = 0; t < BT; ++t)
    for (int64_t c = 0; c < C; ++c) EXPECT_EQ(out[t * C + c], wte[tok[t] * C + c]);
}

TEST(Embedding, GradientFiniteDifference) {
  const int64_t BT = 10, C = 8, V = 6;
  auto wte = randn(V * C, 2);
  const auto tok = randint(BT, V, 3);  // repeats
  const auto R = randn(BT * C, 4);
  std::vector<float> out(BT * C), dwte(V * C, 0.0f);
  embedding_backward(dwte.data(), R.data(), tok.data(), BT, C);
  check_grad("dwte", wte, dwte, [&] {
    embedding_forward(out.data(), tok.data(), wte.data(), BT, C, V);
    return dot(out, R);
  });
}

TEST(Embedding, BackwardAccumulates) {
  const int64_t BT = 9, C = 70, V = 4;
  const auto tok = randint(BT, V, 5);
  const auto R = randn(BT * C, 6);
  std::vector<float> once(V * C, 0.0f), twice(V * C, 0.0f);
  embedding_backward(once.data(), R.data(), tok.data(), BT, C);
  embedding_backward(twice.data(), R.data(), tok.data(), BT, C);
  embedding_backward(twice.data(), R.data(), tok.data(), BT, C);
  expect_doubled("dwte", once, twice);
}

TEST(Embedding, OutOfRangeTokenThrows) {
  const int64_t C = 2, V = 3;
  const auto wte = randn(V * C, 7);
  std::vector<float> out(2 * C), dwte(V * C);
  const std::vector<int32_t> bad_hi = {0, 3}, bad_lo = {-1, 0};
  EXPECT_THROW(embedding_forward(out.data(), bad_hi.data(), wte.data(), 2, C, V),
               std::out_of_range);
  EXPECT_THROW(embedding_forward(out.data(), bad_lo.data(), wte.data(), 2, C, V),
               std::out_of_range);
  EXPECT_THROW(embedding_backward(dwte.data(), out.data(), bad_lo.data(), 2, C),
               std::out_of_range);
  try {
    embedding_forward(out.data(), bad_hi.data(), wte.data(), 2, C, V);
  } catch (const std::out_of_range& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("[1]"), std::string::npos) << msg;  // index
    EXPECT_NE(msg.find("3"), std::string::npos) << msg;    // value
  }
}

// ============================================================================ RMSNorm

TEST(RmsNorm, HandComputed) {
  const float eps = 1e-5f;
  const std::vector<float> x = {3.0f, 4.0f}, w = {1.0f, 1.0f};
  std::vector<float> out(2), rstd(1);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), 1, 2, eps);
  const double r = 1.0 / std::sqrt(12.5 + eps);
  EXPECT_NEAR(rstd[0], r, 1e-7);
  EXPECT_NEAR(out[0], 3.0 * r, 1e-6);
  EXPECT_NEAR(out[1], 4.0 * r, 1e-6);
  // A weight scales the output channel-wise.
  const std::vector<float> w2 = {2.0f, -0.5f};
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w2.data(), 1, 2, eps);
  EXPECT_NEAR(out[0], 6.0 * r, 1e-6);
  EXPECT_NEAR(out[1], -2.0 * r, 1e-6);
}

TEST(RmsNorm, GradientFiniteDifference) {
  const int64_t BT = 10, C = 8;
  const float eps = 1e-5f;
  auto x = randn(BT * C, 10);
  auto w = randn(C, 11);
  for (auto& v : w) v += 1.0f;
  const auto R = randn(BT * C, 12);
  std::vector<float> out(BT * C), rstd(BT), dx(BT * C, 0.0f), dw(C, 0.0f);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), BT, C, eps);
  rmsnorm_backward(dx.data(), dw.data(), R.data(), x.data(), w.data(), rstd.data(), BT, C);
  auto loss = [&] {
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), BT, C, eps);
    return dot(out, R);
  };
  check_grad("dx", x, dx, loss);
  check_grad("dweight", w, dw, loss);
}

TEST(RmsNorm, BackwardAccumulates) {
  const int64_t BT = 7, C = 130;
  auto x = randn(BT * C, 13);
  auto w = randn(C, 14);
  const auto R = randn(BT * C, 15);
  std::vector<float> out(BT * C), rstd(BT);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), BT, C, 1e-6f);
  std::vector<float> dx1(BT * C, 0.0f), dw1(C, 0.0f), dx2(BT * C, 0.0f), dw2(C, 0.0f);
  rmsnorm_backward(dx1.data(), dw1.data(), R.data(), x.data(), w.data(), rstd.data(), BT, C);
  for (int i = 0; i < 2; ++i)
    rmsnorm_backward(dx2.data(), dw2.data(), R.data(), x.data(), w.data(), rstd.data(), BT, C);
  expect_doubled("dx", dx1, dx2);
  expect_doubled("dweight", dw1, dw2);
}

// ============================================================================ RoPE

TEST(Rope, PositionZeroIsIdentityAndNormPreserved) {
  const int64_t B = 2, T = 6, H = 2, hd = 8;
  const auto x0 = randn(B * T * H * hd, 20);
  auto x = x0;
  rope_forward(x.data(), B, T, H, hd, 10000.0f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t off = ((b * T + t) * H + h) * hd;
        double n0 = 0.0, n1 = 0.0;
        for (int64_t i = 0; i < hd; ++i) {
          if (t == 0) {
            EXPECT_EQ(x[off + i], x0[off + i]);
          }
          n0 += static_cast<double>(x0[off + i]) * x0[off + i];
          n1 += static_cast<double>(x[off + i]) * x[off + i];
          // Each pair keeps its own norm too.
          if (i % 2 == 1) {
            const double p0 = std::hypot(x0[off + i - 1], x0[off + i]);
            const double p1 = std::hypot(x[off + i - 1], x[off + i]);
            EXPECT_NEAR(p1, p0, 1e-5 * (1.0 + p0));
          }
        }
        EXPECT_NEAR(n1, n0, 1e-5 * n0);
      }
}

TEST(Rope, HandComputedAngle) {
  // One head, hd = 4, position 1: pair 0 rotates by 1 rad, pair 1 by theta^(−1/2) rad.
  const float theta = 100.0f;
  std::vector<float> x = {0, 0, 0, 0, 1.0f, 0.0f, 0.0f, 2.0f};  // T = 2
  rope_forward(x.data(), 1, 2, 1, 4, theta);
  EXPECT_NEAR(x[4], std::cos(1.0), 1e-6);
  EXPECT_NEAR(x[5], std::sin(1.0), 1e-6);
  EXPECT_NEAR(x[6], -2.0 * std::sin(0.1), 1e-6);
  EXPECT_NEAR(x[7], 2.0 * std::cos(0.1), 1e-6);
}

TEST(Rope, GradientFiniteDifferenceAndInverse) {
  const int64_t B = 2, T = 5, H = 2, hd = 4;
  const size_t n = B * T * H * hd;
  auto x = randn(n, 21);
  const auto R = randn(n, 22);
  auto dx = R;
  rope_backward(dx.data(), B, T, H, hd, 10000.0f);
  std::vector<float> y(n);
  check_grad("dx", x, dx, [&] {
    y = x;
    rope_forward(y.data(), B, T, H, hd, 10000.0f);
    return dot(y, R);
  });
  // backward is the inverse rotation: backward(forward(x)) = x.
  y = x;
  rope_forward(y.data(), B, T, H, hd, 10000.0f);
  rope_backward(y.data(), B, T, H, hd, 10000.0f);
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(y[i], x[i], 1e-6f * (1.0f + std::fabs(x[i])));
}

TEST(Rope, OddHeadDimThrows) {
  std::vector<float> x(6);
  EXPECT_THROW(rope_forward(x.data(), 1, 2, 1, 3, 10000.0f), std::invalid_argument);
  EXPECT_THROW(rope_backward(x.data(), 1, 2, 1, 3, 10000.0f), std::invalid_argument);
}

// ============================================================================ attention

namespace {

// C = H·hd (q, out rows); Hkv key/value heads (0: Hkv = H), k/v rows of Hkv·hd.
struct AttnShape {
  int64_t B, T, C, H;
  int64_t Hkv = 0;
  int64_t hd() const { return C / H; }
  int64_t kvh() const { return Hkv ? Hkv : H; }
  size_t act() const { return static_cast<size_t>(B * T * C); }
  size_t act_kv() const { return static_cast<size_t>(B * T * kvh() * hd()); }
  size_t att() const { return static_cast<size_t>(B * H * T * T); }
};

// Double-precision reference of forward and backward (textbook formulas; GQA: query head h
// reads KV head h / (H / Hkv) and adds its dk, dv there).
void attention_reference(const AttnShape& s, const std::vector<float>& q,
                         const std::vector<float>& k, const std::vector<float>& v,
                         const std::vector<float>& dout, std::vector<double>& out,
                         std::vector<double>& dq, std::vector<double>& dk,
                         std::vector<double>& dv, std::vector<double>& dS) {
  const int64_t T = s.T, C = s.C, hd = s.C / s.H, Ckv = s.kvh() * hd, G = s.H / s.kvh();
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  out.assign(s.act(), 0.0);
  dq.assign(s.act(), 0.0);
  dk.assign(s.act_kv(), 0.0);
  dv.assign(s.act_kv(), 0.0);
  dS.assign(s.att(), 0.0);
  std::vector<double> P(T * T), dP(T * T);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h) {
      auto at = [&](int64_t t, int64_t c) { return (b * T + t) * C + h * hd + c; };
      auto kv = [&](int64_t t, int64_t c) { return (b * T + t) * Ckv + (h / G) * hd + c; };
      for (int64_t i = 0; i < T; ++i) {
        double m = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double sc = 0.0;
          for (int64_t c = 0; c < hd; ++c) sc += static_cast<double>(q[at(i, c)]) * k[kv(j, c)];
          P[i * T + j] = sc * scale;
          m = std::max(m, P[i * T + j]);
        }
        double z = 0.0;
        for (int64_t j = 0; j <= i; ++j) z += (P[i * T + j] = std::exp(P[i * T + j] - m));
        for (int64_t j = 0; j <= i; ++j) P[i * T + j] /= z;
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t c = 0; c < hd; ++c) out[at(i, c)] += P[i * T + j] * v[kv(j, c)];
      }
      for (int64_t i = 0; i < T; ++i) {
        double rs = 0.0;
        for (int64_t j = 0; j <= i; ++j) {
          double g = 0.0;
          for (int64_t c = 0; c < hd; ++c) g += static_cast<double>(dout[at(i, c)]) * v[kv(j, c)];
          dP[i * T + j] = g;
          rs += P[i * T + j] * g;
        }
        for (int64_t j = 0; j <= i; ++j) {
          const double ds = P[i * T + j] * (dP[i * T + j] - rs) * scale;
          dS[((b * s.H + h) * T + i) * T + j] = ds;
          for (int64_t c = 0; c < hd; ++c) {
            dq[at(i, c)] += ds * k[kv(j, c)];
            dk[kv(j, c)] += ds * q[at(i, c)];
            dv[kv(j, c)] += P[i * T + j] * dout[at(i, c)];
          }
        }
      }
    }
}

}  // namespace

TEST(Attention, GradientFiniteDifference) {
  const AttnShape s{2, 5, 8, 2};
  auto q = randn(s.act(), 30), k = randn(s.act(), 31), v = randn(s.act(), 32);
  const auto R = randn(s.act(), 33);
  std::vector<float> out(s.act()), att(s.att()), scratch(s.att());
  std::vector<float> dq(s.act(), 0.0f), dk(s.act(), 0.0f), dv(s.act(), 0.0f);
  attention_forward(out.data(), att.data(), q.data(), k.data(), v.data(), s.B, s.T, s.C, s.H);
  attention_backward(dq.data(), dk.data(), dv.data(), scratch.data(), R.data(), q.data(),
                     k.data(), v.data(), att.data(), s.B, s.T, s.C, s.H);
  auto loss = [&] {
    attention_forward(out.data(), att.data(), q.data(), k.data(), v.data(), s.B, s.T, s.C,
                      s.H);
    return dot(out, R);
  };
  check_grad("dq", q, dq, loss);
  check_grad("dk", k, dk, loss);
  check_grad("dv", v, dv, loss);
}

TEST(Attention, MatchesDoubleReference) {
  // T and hd not multiples of the kernel tile (37, 24) plus a tile-aligned shape.
  for (const AttnShape s : {AttnShape{2, 37, 72, 3}, AttnShape{1, 32, 64, 2}}) {
    const auto q = randn(s.act(), 40), k = randn(s.act(), 41), v = randn(s.act(), 42);
    const auto dout = randn(s.act(), 43);
    std::vector<float> out(s.act()), att(s.att()), scratch(s.att());
    std::vector<float> dq(s.act(), 0.0f), dk(s.act(), 0.0f), dv(s.act(), 0.0f);
    attention_forward(out.data(), att.data(), q.data(), k.data(), v.data(), s.B, s.T, s.C,
                      s.H);
    attention_backward(dq.data(), dk.data(), dv.data(), scratch.data(), dout.data(), q.data(),
                       k.data(), v.data(), att.data(), s.B, s.T, s.C, s.H);
    std::vector<double> rout, rdq, rdk, rdv, rds;
    attention_reference(s, q, k, v, dout, rout, rdq, rdk, rdv, rds);
    // scratch holds ∂L/∂(q_i·k_j), zero above the diagonal.
    for (size_t i = 0; i < s.att(); ++i)
      EXPECT_NEAR(scratch[i], rds[i], 1e-5 * (1.0 + std::fabs(rds[i]))) << "scratch " << i;
    for (size_t i = 0; i < s.act(); ++i) {
      EXPECT_NEAR(out[i], rout[i], 1e-5 * (1.0 + std::fabs(rout[i]))) << "out " << i;
      EXPECT_NEAR(dq[i], rdq[i], 1e-4 * (1.0 + std::fabs(rdq[i]))) << "dq " << i;
      EXPECT_NEAR(dk[i], rdk[i], 1e-4 * (1.0 + std::fabs(rdk[i]))) << "dk " << i;
      EXPECT_NEAR(dv[i], rdv[i], 1e-4 * (1.0 + std::fabs(rdv[i]))) << "dv " << i;
    }
    // att rows are probability distributions over j ≤ i, zero above the diagonal.
    for (int64_t bh = 0; bh < s.B * s.H; ++bh)
      for (int64_t i = 0; i < s.T; ++i) {
        double sum = 0.0;
        for (int64_t j = 0; j < s.T; ++j) {
          const float p = att[(bh * s.T + i) * s.T + j];
          if (j > i) {
            EXPECT_EQ(p, 0.0f);
          } else {
            EXPECT_GE(p, 0.0f);
          }
          sum += p;
        }
        EXPECT_NEAR(sum, 1.0, 1e-5);
      }
  }
}

TEST(Attention, FirstTokenOutputIsItsValue) {
  const AttnShape s{1, 3, 4, 2};
  const auto q = randn(s.act(), 44), k = randn(s.act(), 45), v = randn(s.act(), 46);
  std::vector<float> out(s.act()), att(s.att());
  attention_forward(out.data(), att.data(), q.data(), k.data(), v.data(), s.B, s.T, s.C, s.H);
  for (int64_t c = 0; c < s.C; ++c) EXPECT_EQ(out[c], v[c]);
  EXPECT_EQ(att[0], 1.0f);
}

TEST(Attention, Causality) {
  const AttnShape s{2, 21, 16, 2};
  const auto q = randn(s.act(), 50), k = randn(s.act(), 51), v = randn(s.act(), 52);
  std::vector<float> out0(s.act()), att(s.att());
  attention_forward(out0.data(), att.data(), q.data(), k.data(), v.data(), s.B, s.T, s.C, s.H);
  for (int64_t j : {0, 1, 7, 20}) {
    auto k2 = k, v2 = v;
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t c = 0; c < s.C; ++c) {
        k2[(b * s.T + j) * s.C + c] += 3.0f;
        v2[(b * s.T + j) * s.C + c] -= 5.0f;
      }
    std::vector<float> out1(s.act());
    attention_forward(out1.data(), att.data(), q.data(), k2.data(), v2.data(), s.B, s.T, s.C,
                      s.H);
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t i = 0; i < s.T; ++i) {
        bool same = true;
        for (int64_t c = 0; c < s.C; ++c)
          same &= out1[(b * s.T + i) * s.C + c] == out0[(b * s.T + i) * s.C + c];
        if (i < j) {
          EXPECT_TRUE(same) << "output " << i << " changed when token " << j << " did";
        } else if (i == j) {
          EXPECT_FALSE(same) << "token " << j << " does not see itself";
        }
      }
  }
}

TEST(Attention, BackwardAccumulates) {
  const AttnShape s{2, 9, 12, 3};
  const auto q = randn(s.act(), 60), k = randn(s.act(), 61), v = randn(s.act(), 62);
  const auto dout = randn(s.act(), 63);
  std::vector<float> out(s.act()), att(s.att()), scratch(s.att());
  attention_forward(out.data(), att.data(), q.data(), k.data(), v.data(), s.B, s.T, s.C, s.H);
  std::vector<float> g1[3], g2[3];
  for (int i = 0; i < 3; ++i) {
    g1[i].assign(s.act(), 0.0f);
    g2[i].assign(s.act(), 0.0f);
  }
  attention_backward(g1[0].data(), g1[1].data(), g1[2].data(), scratch.data(), dout.data(),
                     q.data(), k.data(), v.data(), att.data(), s.B, s.T, s.C, s.H);
  for (int r = 0; r < 2; ++r)
    attention_backward(g2[0].data(), g2[1].data(), g2[2].data(), scratch.data(), dout.data(),
                       q.data(), k.data(), v.data(), att.data(), s.B, s.T, s.C, s.H);
  expect_doubled("dq", g1[0], g2[0]);
  expect_doubled("dk", g1[1], g2[1]);
  expect_doubled("dv", g1[2], g2[2]);
}

namespace {

// Grouped-query attention (H query heads, Hkv < H key/value heads): double central
// differences of L = Σ R ⊙ out (R random) w.r.t. q, k, v, optionally with RoPE applied to q
// (H heads) and k (Hkv heads) before attention, as in a Llama / Nemotron-H attention block.
void gqa_gradient_check(int64_t Hkv, bool rope, uint32_t seed) {
  const int64_t B = 2, T = 5, H = 4, hd = 4;
  const float theta = 10000.0f;
  SCOPED_TRACE("Hkv=" + std::to_string(Hkv) + (rope ? " with RoPE" : " without RoPE"));
  const size_t nq = B * T * H * hd, nkv = B * T * Hkv * hd;
  auto q = randn(nq, seed), k = randn(nkv, seed + 1), v = randn(nkv, seed + 2);
  const auto R = randn(nq, seed + 3);
  std::vector<float> qr(nq), kr(nkv), out(nq), att(attention_scratch_floats(B, T, H));
  std::vector<float> scratch(att.size());
  auto forward = [&] {
    qr = q;
    kr = k;
    if (rope) {
      rope_forward(qr.data(), B, T, H, hd, theta);
      rope_forward(kr.data(), B, T, Hkv, hd, theta);
    }
    attention_forward(out.data(), att.data(), qr.data(), kr.data(), v.data(), B, T, H, Hkv, hd);
    return dot(out, R);
  };
  forward();
  std::vector<float> dq(nq, 0.0f), dk(nkv, 0.0f), dv(nkv, 0.0f);
  attention_backward(dq.data(), dk.data(), dv.data(), scratch.data(), R.data(), qr.data(),
                     kr.data(), v.data(), att.data(), B, T, H, Hkv, hd);
  if (rope) {
    rope_backward(dq.data(), B, T, H, hd, theta);
    rope_backward(dk.data(), B, T, Hkv, hd, theta);
  }
  check_grad("dq", q, dq, forward);
  check_grad("dk", k, dk, forward);
  check_grad("dv", v, dv, forward);
}

}  // namespace

TEST(Attention, GqaGradientFiniteDifference) {
  gqa_gradient_check(2, false, 70);
  gqa_gradient_check(1, false, 74);
}

TEST(Attention, GqaWithRopeGradientFiniteDifference) {
  gqa_gradient_check(2, true, 80);
  gqa_gradient_check(1, true, 84);
}

TEST(Attention, GqaMatchesDoubleReference) {
  // H = 6 query heads on Hkv = 3 and 1 KV heads, hd = 24, T = 37 (not a tile multiple);
  // 1, 2 and 3 threads give the same bits.
  for (const AttnShape s : {AttnShape{2, 37, 144, 6, 3}, AttnShape{1, 37, 144, 6, 1}}) {
    SCOPED_TRACE("Hkv=" + std::to_string(s.Hkv));
    const auto q = randn(s.act(), 90), k = randn(s.act_kv(), 91), v = randn(s.act_kv(), 92);
    const auto dout = randn(s.act(), 93);
    std::vector<double> rout, rdq, rdk, rdv, rds;
    attention_reference(s, q, k, v, dout, rout, rdq, rdk, rdv, rds);
    std::vector<std::vector<float>> first;
    for (int threads : {1, 2, 3}) {
      std::vector<float> out(s.act()), att(s.att()), scratch(s.att());
      std::vector<float> dq(s.act(), 0.0f), dk(s.act_kv(), 0.0f), dv(s.act_kv(), 0.0f);
      with_threads(threads, [&] {
        attention_forward(out.data(), att.data(), q.data(), k.data(), v.data(), s.B, s.T, s.H,
                          s.Hkv, s.hd());
        attention_backward(dq.data(), dk.data(), dv.data(), scratch.data(), dout.data(),
                           q.data(), k.data(), v.data(), att.data(), s.B, s.T, s.H, s.Hkv,
                           s.hd());
      });
      if (threads == 1) {
        for (size_t i = 0; i < s.att(); ++i)
          EXPECT_NEAR(scratch[i], rds[i], 1e-5 * (1.0 + std::fabs(rds[i]))) << "scratch " << i;
        for (size_t i = 0; i < s.act(); ++i) {
          EXPECT_NEAR(out[i], rout[i], 1e-5 * (1.0 + std::fabs(rout[i]))) << "out " << i;
          EXPECT_NEAR(dq[i], rdq[i], 1e-4 * (1.0 + std::fabs(rdq[i]))) << "dq " << i;
        }
        for (size_t i = 0; i < s.act_kv(); ++i) {
          EXPECT_NEAR(dk[i], rdk[i], 1e-4 * (1.0 + std::fabs(rdk[i]))) << "dk " << i;
          EXPECT_NEAR(dv[i], rdv[i], 1e-4 * (1.0 + std::fabs(rdv[i]))) << "dv " << i;
        }
        first = {out, att, scratch, dq, dk, dv};
      } else {
        const std::vector<std::vector<float>> got = {out, att, scratch, dq, dk, dv};
        for (size_t a = 0; a < got.size(); ++a)
          EXPECT_TRUE(bit_equal(got[a], first[a])) << "array " << a << ", " << threads
                                                   << " threads";
      }
    }
  }
}

TEST(Attention, GqaBadArgumentsThrow) {
  std::vector<float> buf(1024);
  float* p = buf.data();
  // H % Hkv != 0, Hkv = 0, hd = 0, H = 0.
  for (auto [H, Hkv, hd] : {std::tuple<int64_t, int64_t, int64_t>{4, 3, 8}, {4, 0, 8},
                            {4, 2, 0}, {0, 1, 8}, {2, 4, 8}}) {
    EXPECT_THROW(attention_forward(p, p, p, p, p, 1, 2, H, Hkv, hd), std::invalid_argument);
    EXPECT_THROW(attention_backward(p, p, p, p, p, p, p, p, p, 1, 2, H, Hkv, hd),
                 std::invalid_argument);
  }
}

TEST(Attention, BadHeadCountThrows) {
  std::vector<float> buf(64);
  EXPECT_THROW(attention_forward(buf.data(), buf.data(), buf.data(), buf.data(), buf.data(), 1,
                                 2, 6, 4),
               std::invalid_argument);
}

// ============================================================================ squared ReLU

TEST(SquaredRelu, HandComputed) {
  const std::vector<float> x = {-1.0f, 2.0f, 0.0f, 0.5f};
  std::vector<float> out(4), dx(4, 0.0f);
  squared_relu_forward(out.data(), x.data(), 4);
  EXPECT_EQ(out, (std::vector<float>{0.0f, 4.0f, 0.0f, 0.25f}));
  const std::vector<float> ones(4, 1.0f);
  squared_relu_backward(dx.data(), ones.data(), x.data(), 4);
  EXPECT_EQ(dx, (std::vector<float>{0.0f, 4.0f, 0.0f, 1.0f}));
}

TEST(SquaredRelu, GradientFiniteDifferenceAndAccumulates) {
  const int64_t n = 80;
  auto x = randn(n, 70);
  for (auto& v : x)
    if (std::fabs(v) < 0.05f) v = 0.3f;  // keep away from the kink at 0
  const auto R = randn(n, 71);
  std::vector<float> out(n), dx(n, 0.0f);
  squared_relu_backward(dx.data(), R.data(), x.data(), n);
  check_grad("dx", x, dx, [&] {
    squared_relu_forward(out.data(), x.data(), n);
    return dot(out, R);
  });
  auto dx2 = std::vector<float>(n, 0.0f);
  squared_relu_backward(dx2.data(), R.data(), x.data(), n);
  squared_relu_backward(dx2.data(), R.data(), x.data(), n);
  expect_doubled("dx", dx, dx2);
}

// ============================================================================ SwiGLU

TEST(SwiGlu, HandComputed) {
  // rows: [gate | up], F = 2
  const std::vector<float> x = {0.0f, 1.0f, 5.0f, 3.0f};
  std::vector<float> out(2);
  swiglu_forward(out.data(), x.data(), 1, 2);
  EXPECT_EQ(out[0], 0.0f);                                       // silu(0) = 0
  EXPECT_NEAR(out[1], 1.0 / (1.0 + std::exp(-1.0)) * 3.0, 1e-6);  // silu(1) · 3
}

TEST(SwiGlu, GradientFiniteDifferenceAndAccumulates) {
  const int64_t BT = 10, F = 8;
  auto x = randn(BT * 2 * F, 80, 2.0f);
  const auto R = randn(BT * F, 81);
  std::vector<float> out(BT * F), dx(BT * 2 * F, 0.0f);
  swiglu_backward(dx.data(), R.data(), x.data(), BT, F);
  check_grad("dx", x, dx, [&] {
    swiglu_forward(out.data(), x.data(), BT, F);
    return dot(out, R);
  });
  std::vector<float> dx2(BT * 2 * F, 0.0f);
  swiglu_backward(dx2.data(), R.data(), x.data(), BT, F);
  swiglu_backward(dx2.data(), R.data(), x.data(), BT, F);
  expect_doubled("dx", dx, dx2);
}

// ============================================================================ cross-entropy

TEST(CrossEntropy, UniformLogitsGiveLogV) {
  const int64_t BT = 3, V = 7;
  const std::vector<float> logits(BT * V, 2.5f);
  const std::vector<int32_t> tgt = {0, 6, 3};
  std::vector<float> losses(BT);
  const double mean = cross_entropy_forward(losses.data(), logits.data(), tgt.data(), BT, V);
  EXPECT_NEAR(mean, std::log(7.0), 1e-7);
  for (float l : losses) EXPECT_NEAR(l, std::log(7.0), 1e-6);
  // losses may be null.
  EXPECT_EQ(cross_entropy_forward(nullptr, logits.data(), tgt.data(), BT, V), mean);
}

TEST(CrossEntropy, LargeLogitsAreStable) {
  const std::vector<float> logits = {1000.0f, 0.0f, -1000.0f};
  const std::vector<int32_t> tgt = {1};
  const double l = cross_entropy_forward(nullptr, logits.data(), tgt.data(), 1, 3);
  EXPECT_NEAR(l, 1000.0, 1e-3);
  std::vector<float> d(3);
  cross_entropy_backward(d.data(), logits.data(), tgt.data(), 1, 3, 1.0f);
  EXPECT_NEAR(d[0], 1.0f, 1e-6f);
  EXPECT_NEAR(d[1], -1.0f, 1e-6f);
  EXPECT_EQ(d[2], 0.0f);
}

TEST(CrossEntropy, GradientFiniteDifferenceAndOverwrites) {
  const int64_t BT = 6, V = 9;
  auto logits = randn(BT * V, 90, 2.0f);
  const auto tgt = randint(BT, V, 91);
  std::vector<float> d(BT * V, 123.0f);  // garbage: backward overwrites
  cross_entropy_backward(d.data(), logits.data(), tgt.data(), BT, V, 1.0f / BT);
  check_grad("dlogits", logits, d, [&] {
    return cross_entropy_forward(nullptr, logits.data(), tgt.data(), BT, V);
  }, 1e-3f, 1e-2, 1e-4);
  // Rows of (softmax − onehot) sum to 0.
  for (int64_t t = 0; t < BT; ++t) {
    double s = 0.0;
    for (int64_t v = 0; v < V; ++v) s += d[t * V + v];
    EXPECT_NEAR(s, 0.0, 1e-6);
  }
}

TEST(CrossEntropy, OutOfRangeTargetThrows) {
  const std::vector<float> logits(2 * 4, 0.0f);
  std::vector<float> d(8);
  const std::vector<int32_t> hi = {0, 4}, lo = {-2, 0};
  EXPECT_THROW(cross_entropy_forward(nullptr, logits.data(), hi.data(), 2, 4), std::out_of_range);
  EXPECT_THROW(cross_entropy_forward(nullptr, logits.data(), lo.data(), 2, 4), std::out_of_range);
  EXPECT_THROW(cross_entropy_backward(d.data(), logits.data(), hi.data(), 2, 4, 0.5f),
               std::out_of_range);
  try {
    cross_entropy_forward(nullptr, logits.data(), lo.data(), 2, 4);
  } catch (const std::out_of_range& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("[0]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("-2"), std::string::npos) << msg;
  }
}

// ============================================================================ determinism

// Every layer's outputs and gradients must be bit-identical with 1 and 2 OpenMP threads.
// Shapes are large enough that every layer actually runs its parallel loops.
TEST(Determinism, OneVsTwoThreadsBitIdentical) {
  const int64_t B = 3, T = 70, C = 200, H = 5, hd = C / H, V = 300, F = 200;
  const int64_t BT = B * T;
  const auto x = randn(BT * C, 100), w = randn(C, 101), R = randn(BT * C, 102);
  const auto q = randn(BT * C, 103), k = randn(BT * C, 104), v = randn(BT * C, 105);
  const auto wte = randn(V * C, 106), logits = randn(BT * V, 107, 3.0f);
  const auto g2 = randn(BT * 2 * F, 108), RF = randn(BT * F, 109);
  const auto tok = randint(BT, 20, 110);  // many repeated tokens
  const auto tgt = randint(BT, V, 111);

  auto run = [&](double& mean) {
    std::vector<std::vector<float>> r;
    auto add = [&](std::vector<float> a) { r.push_back(std::move(a)); };
    std::vector<float> out(BT * C), dwte(V * C, 0.5f);
    embedding_forward(out.data(), tok.data(), wte.data(), BT, C, V);
    embedding_backward(dwte.data(), R.data(), tok.data(), BT, C);
    add(out);
    add(dwte);
    std::vector<float> rstd(BT), dx(BT * C, 0.0f), dw(C, 0.0f);
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), BT, C, 1e-5f);
    rmsnorm_backward(dx.data(), dw.data(), R.data(), x.data(), w.data(), rstd.data(), BT, C);
    add(out);
    add(rstd);
    add(dx);
    add(dw);
    auto xr = x, dr = R;
    rope_forward(xr.data(), B, T, H, hd, 10000.0f);
    rope_backward(dr.data(), B, T, H, hd, 10000.0f);
    add(xr);
    add(dr);
    std::vector<float> att(B * H * T * T), scratch(B * H * T * T);
    std::vector<float> dq(BT * C, 0.0f), dk(BT * C, 0.0f), dv(BT * C, 0.0f);
    attention_forward(out.data(), att.data(), q.data(), k.data(), v.data(), B, T, C, H);
    attention_backward(dq.data(), dk.data(), dv.data(), scratch.data(), R.data(), q.data(),
                       k.data(), v.data(), att.data(), B, T, C, H);
    add(out);
    add(att);
    add(dq);
    add(dk);
    add(dv);
    add(scratch);
    std::vector<float> sq(BT * C), dsq(BT * C, 0.0f);
    squared_relu_forward(sq.data(), x.data(), BT * C);
    squared_relu_backward(dsq.data(), R.data(), x.data(), BT * C);
    add(sq);
    add(dsq);
    std::vector<float> sw(BT * F), dsw(BT * 2 * F, 0.0f);
    swiglu_forward(sw.data(), g2.data(), BT, F);
    swiglu_backward(dsw.data(), RF.data(), g2.data(), BT, F);
    add(sw);
    add(dsw);
    std::vector<float> losses(BT), dl(BT * V);
    mean = cross_entropy_forward(losses.data(), logits.data(), tgt.data(), BT, V);
    cross_entropy_backward(dl.data(), logits.data(), tgt.data(), BT, V, 1.0f / BT);
    add(losses);
    add(dl);
    return r;
  };
  std::vector<std::vector<float>> r1, r2;
  double m1 = 0.0, m2 = 1.0;
  with_threads(1, [&] { r1 = run(m1); });
  with_threads(2, [&] { r2 = run(m2); });
  EXPECT_EQ(std::memcmp(&m1, &m2, sizeof m1), 0) << m1 << " vs " << m2;
  ASSERT_EQ(r1.size(), r2.size());
  for (size_t i = 0; i < r1.size(); ++i) EXPECT_TRUE(bit_equal(r1[i], r2[i])) << "array " << i;
}
