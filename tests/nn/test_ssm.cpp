// Tests of the Mamba-2 kernels (fp4/nn/ssm.h; src/nn/ssm.cpp and src/nn/ssm_ref.cpp):
//  * twin bit identity (memcmp) of every vector variant the CPU can run (AVX-512, AVX2,
//    SSE2 base) against the scalar twins, at 1, 2 and 3 OpenMP threads, forward and backward
//    (gradients accumulated onto random initial values; whole strided buffers compared, so a
//    write outside the slices shows up), on random and adversarial inputs (all zeros, large
//    dt (Δ = 30: the decay underflows to 0), Δ = 15 (just below the softplus cut), very
//    negative dt (Δ ≈ 1e-18), exact powers of two), T a multiple of Q and not, G = 1 and 2;
//  * the chunked scan against the plain FP64 sequential recurrence (tolerance below);
//  * finite-difference gradients (FP64 central differences of a random linear functional of
//    the outputs, evaluated with independent FP64 forward implementations: the sequential
//    recurrence for the scan, plain loops here for conv and norm) for every input and
//    parameter of each kernel;
//  * std::invalid_argument on bad arguments.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "fp4/nn/ssm.h"
#include "support/variant_set.h"

using namespace fp4::nn;
using detail::SsmIsa;

namespace {

std::vector<float> randn(size_t n, std::mt19937& g, float scale = 1.0f) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(g);
  return v;
}
std::vector<float> uniform(size_t n, std::mt19937& g, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(g);
  return v;
}
std::vector<double> to_d(const std::vector<float>& v) { return {v.begin(), v.end()}; }

void expect_same(const char* what, const std::string& ctx, const std::vector<float>& got,
                 const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size()) << what << " " << ctx;
  if (std::memcmp(got.data(), want.data(), sizeof(float) * got.size()) == 0) return;
  size_t i = 0;
  while (i < got.size() && std::memcmp(&got[i], &want[i], sizeof(float)) == 0) ++i;
  ADD_FAILURE() << what << " differs (" << ctx << ") first at " << i << ": " << got[i]
                << " vs " << want[i];
}

struct Variant {
  SsmIsa isa;
  const char* name;
  bool emulated;  // selected by FP4_TEST_VARIANTS=emulated (tests/support/variant_set.h)
};
const Variant kVariants[] = {{SsmIsa::kAvx512, "avx512", false},
                             {SsmIsa::kAvx2, "avx2", false},
                             {SsmIsa::kBase, "base", false},
                             {SsmIsa::kEmu16, "emu16", true}};

// Runs fn(ctx) for every variant the CPU can run that FP4_TEST_VARIANTS selects, at 1, 2, 3
// threads.
void for_variants(const std::function<void(const std::string&)>& fn) {
  const int saved = omp_get_max_threads();
  for (const Variant& v : kVariants) {
    if (!fp4::test::variant_selected(v.emulated)) continue;
    if (!detail::set_ssm_isa(v.isa)) continue;
    for (int th = 1; th <= 3; ++th) {
      omp_set_num_threads(th);
      fn(std::string(v.name) + " threads=" + std::to_string(th));
    }
  }
  detail::reset_ssm_isa();
  omp_set_num_threads(saved);
}

// ---------------------------------------------------------------- scan inputs
enum class Mode { kRandom, kZeros, kBigDt, kMidDt, kNegDt, kPow2 };
const char* mode_name(Mode m) {
  switch (m) {
    case Mode::kRandom: return "random";
    case Mode::kZeros: return "zeros";
    case Mode::kBigDt: return "dt=30";
    case Mode::kMidDt: return "dt=15";
    case Mode::kNegDt: return "dt=-40";
    case Mode::kPow2: return "pow2";
  }
  return "?";
}

// The conv output layout of Mamba-2: xBC [BT, ld] = [x (H·P) | B (G·N) | C (G·N) | pad],
// dt a column slice (offset 1) of a wider [BT, lddt] buffer.
struct Scan {
  SsdDims d;
  int64_t ld, lddt;
  std::vector<float> xbc, dt, dt_bias, A_log, D;
  int64_t HP() const { return d.H * d.P; }
  int64_t GN() const { return d.G * d.N; }
  size_t rows() const { return static_cast<size_t>(d.B * d.T); }
  template <class Vec>
  auto* xp(Vec& v) const { return v.data(); }
  template <class Vec>
  auto* bp(Vec& v) const { return v.data() + HP(); }
  template <class Vec>
  auto* cp(Vec& v) const { return v.data() + HP() + GN(); }
  template <class Vec>
  auto* dtp(Vec& v) const { return v.data() + 1; }
};

Scan make_scan(SsdDims d, Mode m, uint32_t seed) {
  std::mt19937 g(seed);
  Scan s{d, d.H * d.P + 2 * d.G * d.N + 3, d.H + 2, {}, {}, {}, {}, {}};
  const size_t R = s.rows();
  s.xbc = randn(R * s.ld, g);
  s.dt = randn(R * s.lddt, g);
  s.dt_bias = uniform(d.H, g, -4.0f, 0.0f);
  s.A_log = uniform(d.H, g, 0.0f, 2.7f);  // A in [−15, −1] (Mamba-2 init range)
  s.D = randn(d.H, g);
  auto fill = [](std::vector<float>& v, float x) { std::fill(v.begin(), v.end(), x); };
  switch (m) {
    case Mode::kRandom: break;
    case Mode::kZeros:
      fill(s.xbc, 0.0f), fill(s.dt, 0.0f), fill(s.dt_bias, 0.0f), fill(s.A_log, 0.0f),
          fill(s.D, 0.0f);
      break;
    case Mode::kBigDt: fill(s.dt, 30.0f), fill(s.dt_bias, 0.0f); break;
    case Mode::kMidDt: fill(s.dt, 15.0f), fill(s.dt_bias, 0.0f); break;
    case Mode::kNegDt: fill(s.dt, -40.0f); break;
    case Mode::kPow2: {
      std::uniform_int_distribution<int> e(-6, 6), sg(0, 1);
      for (auto* v : {&s.xbc, &s.dt, &s.D})
        for (auto& x : *v) x = std::ldexp(sg(g) ? 1.0f : -1.0f, e(g));
      for (auto& x : s.dt_bias) x = -1.0f;
      for (auto& x : s.A_log) x = 0.5f;
      break;
    }
  }
  return s;
}

struct ScanOut {
  std::vector<float> y, ws, dxbc, ddt, dA_log, dD, d_dt_bias;
};

using ScanFwd = decltype(&ssd_scan_forward);
using ScanBwd = decltype(&ssd_scan_backward);

ScanOut run_scan(ScanFwd fwd, ScanBwd bwd, const Scan& s, const std::vector<float>& dy,
                 const ScanOut& init) {
  ScanOut o = init;
  o.y.assign(s.rows() * s.HP(), -7.0f);
  o.ws.assign(static_cast<size_t>(ssd_workspace_floats(s.d)), -7.0f);
  fwd(o.y.data(), o.ws.data(), s.xp(s.xbc), s.ld, s.bp(s.xbc), s.ld, s.cp(s.xbc), s.ld,
      s.dtp(s.dt), s.lddt, s.dt_bias.data(), s.A_log.data(), s.D.data(), s.d);
  bwd(s.xp(o.dxbc), s.bp(o.dxbc), s.cp(o.dxbc), s.dtp(o.ddt), o.dA_log.data(), o.dD.data(),
      o.d_dt_bias.data(), dy.data(), o.ws.data(), s.xp(s.xbc), s.ld, s.bp(s.xbc), s.ld,
      s.cp(s.xbc), s.ld, s.dtp(s.dt), s.lddt, s.dt_bias.data(), s.A_log.data(), s.D.data(),
      s.d);
  return o;
}

ScanOut scan_init(const Scan& s, uint32_t seed) {
  std::mt19937 g(seed);
  ScanOut o;
  o.dxbc = randn(s.xbc.size(), g);
  o.ddt = randn(s.dt.size(), g);
  o.dA_log = randn(s.d.H, g);
  o.dD = randn(s.d.H, g);
  o.d_dt_bias = randn(s.d.H, g);
  return o;
}

void expect_scan_same(const std::string& ctx, const ScanOut& a, const ScanOut& b) {
  expect_same("y", ctx, a.y, b.y);
  expect_same("ws", ctx, a.ws, b.ws);
  expect_same("dx/dB/dC", ctx, a.dxbc, b.dxbc);
  expect_same("d_dt", ctx, a.ddt, b.ddt);
  expect_same("dA_log", ctx, a.dA_log, b.dA_log);
  expect_same("dD", ctx, a.dD, b.dD);
  expect_same("d_dt_bias", ctx, a.d_dt_bias, b.d_dt_bias);
}

// ---------------------------------------------------------------- scan twin
TEST(SsmTwin, ScanForwardBackwardBitIdentical) {
  const SsdDims shapes[] = {
      {2, 37, 4, 8, 1, 16, 16},   // T not a multiple of Q, G = 1
      {2, 64, 4, 8, 2, 16, 16},   // T a multiple of Q, G = 2
      {1, 37, 4, 5, 2, 3, 16},    // P, N not multiples of any vector width
      {3, 20, 2, 17, 1, 33, 7},   // odd Q, widths past one 16-column block
      {1, 5, 2, 4, 2, 4, 64},     // one short chunk
      {1, 70, 2, 64, 1, 64, 64},  // full-size head dims, two chunks (the second short)
  };
  int n = 0;
  for (const SsdDims& d : shapes)
    for (Mode m : {Mode::kRandom, Mode::kZeros, Mode::kBigDt, Mode::kMidDt, Mode::kNegDt,
                   Mode::kPow2}) {
      const Scan s = make_scan(d, m, 100 + n);
      std::mt19937 g(200 + n++);
      const std::vector<float> dy = randn(s.rows() * s.HP(), g);
      const ScanOut init = scan_init(s, 300 + n);
      const ScanOut ref = run_scan(ssd_scan_forward_ref, ssd_scan_backward_ref, s, dy, init);
      for (const float v : ref.y) ASSERT_TRUE(std::isfinite(v)) << mode_name(m);
      for (const float v : ref.dxbc) ASSERT_TRUE(std::isfinite(v)) << mode_name(m);
      const std::string shp = "B=" + std::to_string(d.B) + " T=" + std::to_string(d.T) +
                              " H=" + std::to_string(d.H) + " P=" + std::to_string(d.P) +
                              " G=" + std::to_string(d.G) + " N=" + std::to_string(d.N) +
                              " Q=" + std::to_string(d.Q) + " " + mode_name(m) + " ";
      for_variants([&](const std::string& ctx) {
        expect_scan_same(shp + ctx, run_scan(ssd_scan_forward, ssd_scan_backward, s, dy, init),
                         ref);
      });
    }
}

// Rows [t0, t0 + Tn) of every sequence of s, as a scan of B' = B (or the one sequence b1 when
// b1 >= 0) sequences of Tn tokens with the same parameters and strides.
Scan sub_scan(const Scan& s, int64_t Tn, int64_t b1 = -1) {
  Scan r = s;
  r.d.T = Tn;
  r.d.B = b1 >= 0 ? 1 : s.d.B;
  r.xbc.clear();
  r.dt.clear();
  for (int64_t b = 0; b < s.d.B; ++b) {
    if (b1 >= 0 && b != b1) continue;
    const int64_t r0 = b * s.d.T;
    r.xbc.insert(r.xbc.end(), s.xbc.begin() + r0 * s.ld, s.xbc.begin() + (r0 + Tn) * s.ld);
    r.dt.insert(r.dt.end(), s.dt.begin() + r0 * s.lddt, s.dt.begin() + (r0 + Tn) * s.lddt);
  }
  return r;
}

// The scan is causal and per sequence, bit for bit: a forward over the first Tn < T tokens
// (chunks cut at the same multiples of Q, the last one shorter) gives the first Tn rows of y
// of the full forward, and sequence 1 alone (B = 1) gives the rows it had as the second of
// B = 2; for the scalar twin and every vector variant (the property the whole-model test
// HybridModel.CausalPerSequenceAndShorterT can only check to FP32 rounding, as its GEMMs
// change shape).
TEST(SsmScan, PrefixOfLongerTAndOneSequenceAlone) {
  const SsdDims shapes[] = {{2, 12, 4, 4, 2, 4, 5}, {2, 37, 4, 8, 1, 16, 16},
                            {2, 70, 2, 17, 2, 5, 32}};
  using Fwd = ScanFwd;
  auto forward = [](Fwd fwd, const Scan& s) {
    std::vector<float> y(s.rows() * s.HP(), -7.0f);
    std::vector<float> ws(static_cast<size_t>(ssd_workspace_floats(s.d)), -7.0f);
    fwd(y.data(), ws.data(), s.xp(s.xbc), s.ld, s.bp(s.xbc), s.ld, s.cp(s.xbc), s.ld,
        s.dtp(s.dt), s.lddt, s.dt_bias.data(), s.A_log.data(), s.D.data(), s.d);
    return y;
  };
  uint32_t seed = 900;
  for (const SsdDims& d : shapes) {
    const Scan full = make_scan(d, Mode::kRandom, seed++);
    const int64_t HP = full.HP();
    for (const int64_t Tn : {d.T - 3, d.Q, d.Q + 1, int64_t{1}}) {
      const Scan part = sub_scan(full, Tn);
      auto check = [&](Fwd fwd, const std::string& ctx) {
        const std::vector<float> yf = forward(fwd, full), yp = forward(fwd, part);
        for (int64_t b = 0; b < d.B; ++b) {
          const std::vector<float> want(yf.begin() + b * d.T * HP, yf.begin() + (b * d.T + Tn) * HP);
          const std::vector<float> got(yp.begin() + b * Tn * HP, yp.begin() + (b + 1) * Tn * HP);
          expect_same("y prefix", ctx + " T=" + std::to_string(d.T) + " Tn=" +
                      std::to_string(Tn) + " b=" + std::to_string(b), got, want);
        }
      };
      check(ssd_scan_forward_ref, "scalar twin");
      for_variants([&](const std::string& ctx) { check(ssd_scan_forward, ctx); });
    }
    const Scan alone = sub_scan(full, d.T, 1);
    auto check_alone = [&](Fwd fwd, const std::string& ctx) {
      const std::vector<float> yf = forward(fwd, full), ya = forward(fwd, alone);
      expect_same("y of sequence 1 alone", ctx + " T=" + std::to_string(d.T), ya,
                  std::vector<float>(yf.begin() + d.T * HP, yf.end()));
    };
    check_alone(ssd_scan_forward_ref, "scalar twin");
    for_variants([&](const std::string& ctx) { check_alone(ssd_scan_forward, ctx); });
  }
}

// ---------------------------------------------------------------- chunked vs sequential
// Tolerance: |y_chunked − y_seq| ≤ 1e-5 · y_abs + 1e-30, where y_abs is the sequential
// recurrence run on |x|, |B|, |C|, |D| (the sum of the absolute values of every term of y,
// so this is a relative error per term). FP32 rounding of the O(Q + N) products and sums
// along one term, of exp (≤ 2 ulp) and of the in-chunk decay sums (relative error of
// exp(seg) ≈ |error of seg| ≤ Q·eps·Σ|a|, i.e. ~1e-5 when the decay is still ≥ e^−20)
// stays below that; the measured maximum is printed (8.5e-7 when written, over random, dt = 15, dt = 30, dt = −40 and power-of-two inputs).
TEST(SsmScan, ChunkedMatchesSequential) {
  const SsdDims shapes[] = {{2, 37, 4, 8, 2, 16, 16},
                            {2, 64, 4, 8, 1, 16, 16},
                            {1, 256, 2, 64, 1, 64, 64},
                            {1, 100, 4, 16, 2, 32, 1},
                            {1, 100, 4, 16, 2, 32, 100}};
  double worst = 0.0;
  int n = 0;
  for (const SsdDims& d : shapes)
    for (Mode m : {Mode::kRandom, Mode::kNegDt, Mode::kPow2, Mode::kBigDt, Mode::kMidDt}) {
      const Scan s = make_scan(d, m, 500 + n++);
      std::vector<float> y(s.rows() * s.HP()), ws(ssd_workspace_floats(d));
      ssd_scan_forward(y.data(), ws.data(), s.xp(s.xbc), s.ld, s.bp(s.xbc), s.ld, s.cp(s.xbc),
                       s.ld, s.dtp(s.dt), s.lddt, s.dt_bias.data(), s.A_log.data(),
                       s.D.data(), d);
      auto run_seq = [&](bool absval) {
        std::vector<double> xd = to_d(s.xbc), Dd = to_d(s.D), dtd = to_d(s.dt);
        if (absval) {
          for (auto& v : xd) v = std::fabs(v);
          for (auto& v : Dd) v = std::fabs(v);
        }
        const std::vector<double> bd = to_d(s.dt_bias), ad = to_d(s.A_log);
        std::vector<double> yd(y.size());
        ssd_scan_sequential(yd.data(), s.xp(xd), s.ld, s.bp(xd), s.ld, s.cp(xd), s.ld,
                            s.dtp(dtd), s.lddt, bd.data(), ad.data(), Dd.data(), d);
        return yd;
      };
      const std::vector<double> ys = run_seq(false), ya = run_seq(true);
      for (size_t i = 0; i < y.size(); ++i) {
        const double err = std::fabs(static_cast<double>(y[i]) - ys[i]);
        const double rel = err / (ya[i] + 1e-30);
        worst = std::max(worst, rel);
        ASSERT_LE(err, 1e-5 * ya[i] + 1e-30)
            << "Q=" << d.Q << " T=" << d.T << " " << mode_name(m) << " i=" << i << " y=" << y[i]
            << " seq=" << ys[i] << " abs=" << ya[i];
      }
    }
  std::printf("chunked vs sequential: max |err| / y_abs = %.3g\n", worst);
}

// ---------------------------------------------------------------- finite differences
// Central differences (h = 1e-5 · max(1, |v|)) of L = Σ r·out in FP64; the analytic gradient
// (FP32 kernels) must match within 2e-3 · max(|fd|, 0.05 · max_i |fd_i|) + 1e-7.
void fd_check(const char* name, std::vector<double>& param, const std::vector<float>& analytic,
              size_t offset, const std::function<double()>& loss) {
  std::vector<double> fd(param.size());
  double mx = 0.0;
  for (size_t i = 0; i < param.size(); ++i) {
    const double v = param[i], h = 1e-5 * std::max(1.0, std::fabs(v));
    param[i] = v + h;
    const double lp = loss();
    param[i] = v - h;
    const double lm = loss();
    param[i] = v;
    fd[i] = (lp - lm) / (2 * h);
    mx = std::max(mx, std::fabs(fd[i]));
  }
  ASSERT_GT(mx, 0.0) << name << ": the functional does not depend on it";
  for (size_t i = 0; i < param.size(); ++i) {
    const double tol = 2e-3 * std::max(std::fabs(fd[i]), 0.05 * mx) + 1e-7;
    ASSERT_NEAR(analytic[offset + i], fd[i], tol) << name << "[" << i << "]";
  }
}

TEST(SsmGrad, ScanFiniteDifferences) {
  for (const SsdDims d : {SsdDims{2, 7, 4, 3, 2, 4, 3}, SsdDims{1, 9, 2, 3, 1, 5, 4},
                          SsdDims{1, 5, 2, 2, 2, 3, 1}, SsdDims{1, 6, 2, 2, 1, 3, 8}}) {
    Scan s = make_scan(d, Mode::kRandom, 7);
    std::mt19937 g(8);
    for (auto& v : s.dt) v *= 0.5f;
    const std::vector<float> r = randn(s.rows() * s.HP(), g);
    ScanOut zero;
    zero.dxbc.assign(s.xbc.size(), 0.0f);
    zero.ddt.assign(s.dt.size(), 0.0f);
    zero.dA_log.assign(d.H, 0.0f);
    zero.dD.assign(d.H, 0.0f);
    zero.d_dt_bias.assign(d.H, 0.0f);
    const ScanOut an = run_scan(ssd_scan_forward, ssd_scan_backward, s, r, zero);
    std::vector<double> xd = to_d(s.xbc), dtd = to_d(s.dt), bd = to_d(s.dt_bias),
                        ad = to_d(s.A_log), Dd = to_d(s.D);
    std::vector<double> yd(r.size());
    auto loss = [&]() {
      ssd_scan_sequential(yd.data(), s.xp(xd), s.ld, s.bp(xd), s.ld, s.cp(xd), s.ld,
                          s.dtp(dtd), s.lddt, bd.data(), ad.data(), Dd.data(), d);
      double L = 0.0;
      for (size_t i = 0; i < yd.size(); ++i) L += r[i] * yd[i];
      return L;
    };
    fd_check("x|B|C", xd, an.dxbc, 0, loss);
    fd_check("dt", dtd, an.ddt, 0, loss);
    fd_check("dt_bias", bd, an.d_dt_bias, 0, loss);
    fd_check("A_log", ad, an.dA_log, 0, loss);
    fd_check("D", Dd, an.dD, 0, loss);
  }
}

// Backward accumulates: two backward calls from zero give exactly twice one call (v + v = 2v
// is exact), for every gradient. Two heads per group (H = 4, G = 2): each dB/dC row's total
// over the group's heads and chunks is added once per call (fp4/nn/ssm.h).
TEST(SsmGrad, ScanBackwardAccumulates) {
  const Scan s = make_scan(SsdDims{2, 21, 4, 5, 2, 6, 8}, Mode::kRandom, 9);
  std::mt19937 g(10);
  const std::vector<float> dy = randn(s.rows() * s.HP(), g);
  ScanOut zero;
  zero.dxbc.assign(s.xbc.size(), 0.0f);
  zero.ddt.assign(s.dt.size(), 0.0f);
  zero.dA_log.assign(s.d.H, 0.0f);
  zero.dD.assign(s.d.H, 0.0f);
  zero.d_dt_bias.assign(s.d.H, 0.0f);
  const ScanOut once = run_scan(ssd_scan_forward, ssd_scan_backward, s, dy, zero);
  const ScanOut twice = run_scan(ssd_scan_forward, ssd_scan_backward, s, dy, once);
  auto dbl = [](std::vector<float> v) {
    for (auto& x : v) x = x + x;
    return v;
  };
  expect_same("dx/dB/dC", "twice", twice.dxbc, dbl(once.dxbc));
  expect_same("d_dt", "twice", twice.ddt, dbl(once.ddt));
  expect_same("dA_log", "twice", twice.dA_log, dbl(once.dA_log));
  expect_same("dD", "twice", twice.dD, dbl(once.dD));
  expect_same("d_dt_bias", "twice", twice.d_dt_bias, dbl(once.d_dt_bias));
}

// ---------------------------------------------------------------- conv
struct Conv {
  int64_t B, T, C, W, ld;
  std::vector<float> x, w, bias;  // x [BT, ld], slice at column 2
};
Conv make_conv(int64_t B, int64_t T, int64_t C, int64_t W, Mode m, uint32_t seed) {
  std::mt19937 g(seed);
  Conv c{B, T, C, W, C + 5, {}, {}, {}};
  c.x = randn(static_cast<size_t>(B * T * c.ld), g);
  c.w = randn(static_cast<size_t>(C * W), g, 0.5f);
  c.bias = randn(static_cast<size_t>(C), g);
  if (m == Mode::kZeros) {
    std::fill(c.x.begin(), c.x.end(), 0.0f);
    std::fill(c.bias.begin(), c.bias.end(), 0.0f);
  } else if (m == Mode::kPow2) {
    std::uniform_int_distribution<int> e(-4, 4), sg(0, 1);
    for (auto* v : {&c.x, &c.w, &c.bias})
      for (auto& x : *v) x = std::ldexp(sg(g) ? 1.0f : -1.0f, e(g));
  } else if (m == Mode::kBigDt) {  // large pre-activations: SiLU saturates / exp overflows
    for (auto& x : c.x) x *= 60.0f;
  }
  return c;
}

struct ConvOut {
  std::vector<float> out, dx, dw, dbias;
};
ConvOut run_conv(decltype(&ssm_conv_forward) fwd, decltype(&ssm_conv_backward) bwd,
                 const Conv& c, const std::vector<float>& dout, const ConvOut& init) {
  ConvOut o = init;
  o.out.assign(static_cast<size_t>(c.B * c.T * c.C), -7.0f);
  fwd(o.out.data(), c.x.data() + 2, c.ld, c.w.data(), c.bias.data(), c.B, c.T, c.C, c.W);
  bwd(o.dx.data() + 2, o.dw.data(), o.dbias.data(), dout.data(), c.x.data() + 2, c.ld,
      c.w.data(), c.bias.data(), c.B, c.T, c.C, c.W);
  return o;
}

TEST(SsmTwin, ConvBitIdentical) {
  int n = 0;
  for (auto [B, T, C, W] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{2, 37, 70, 4},
                            {3, 5, 200, 4}, {1, 2, 13, 4}, {2, 9, 64, 3},
                            {2, 150, 21, 4}})  // several row blocks (64 rows), the last partial
    for (Mode m : {Mode::kRandom, Mode::kZeros, Mode::kPow2, Mode::kBigDt}) {
      const Conv c = make_conv(B, T, C, W, m, 40 + n);
      std::mt19937 g(50 + n++);
      const std::vector<float> dout = randn(static_cast<size_t>(B * T * C), g);
      ConvOut init{{}, randn(c.x.size(), g), randn(c.w.size(), g), randn(c.bias.size(), g)};
      const ConvOut ref = run_conv(ssm_conv_forward_ref, ssm_conv_backward_ref, c, dout, init);
      const std::string shp = "C=" + std::to_string(C) + " T=" + std::to_string(T) + " " +
                              mode_name(m) + " ";
      for_variants([&](const std::string& ctx) {
        const ConvOut o = run_conv(ssm_conv_forward, ssm_conv_backward, c, dout, init);
        expect_same("out", shp + ctx, o.out, ref.out);
        expect_same("dx", shp + ctx, o.dx, ref.dx);
        expect_same("dw", shp + ctx, o.dw, ref.dw);
        expect_same("dbias", shp + ctx, o.dbias, ref.dbias);
      });
    }
}

TEST(SsmGrad, ConvFiniteDifferences) {
  const Conv c0 = make_conv(2, 6, 5, 4, Mode::kRandom, 3);
  std::mt19937 g(4);
  const std::vector<float> r = randn(static_cast<size_t>(c0.B * c0.T * c0.C), g);
  ConvOut zero{{}, std::vector<float>(c0.x.size()), std::vector<float>(c0.w.size()),
               std::vector<float>(c0.bias.size())};
  const ConvOut an = run_conv(ssm_conv_forward, ssm_conv_backward, c0, r, zero);
  std::vector<double> x = to_d(c0.x), w = to_d(c0.w), bias = to_d(c0.bias);
  auto loss = [&]() {  // FP64 causal depthwise conv + SiLU, straight from the definition
    double L = 0.0;
    for (int64_t b = 0; b < c0.B; ++b)
      for (int64_t t = 0; t < c0.T; ++t)
        for (int64_t ch = 0; ch < c0.C; ++ch) {
          double pre = bias[ch];
          for (int64_t k = 0; k < c0.W; ++k) {
            const int64_t ts = t - (c0.W - 1) + k;
            if (ts >= 0) pre += w[ch * c0.W + k] * x[(b * c0.T + ts) * c0.ld + 2 + ch];
          }
          L += r[(b * c0.T + t) * c0.C + ch] * pre / (1.0 + std::exp(-pre));
        }
    return L;
  };
  fd_check("conv x", x, an.dx, 0, loss);
  fd_check("conv w", w, an.dw, 0, loss);
  fd_check("conv bias", bias, an.dbias, 0, loss);
}

// The weight gradients are sums over all B·T rows, computed in row blocks (64 rows of one
// sequence) whose partials are then added: check them against FP64 sums of the terms straight
// from the definition on a shape with several blocks per sequence (the last one partial),
// relative to the sum of the terms' magnitudes.
TEST(SsmGrad, ConvWeightGradsOverRowBlocks) {
  const Conv c = make_conv(3, 150, 7, 4, Mode::kRandom, 5);
  std::mt19937 g(6);
  const std::vector<float> r = randn(static_cast<size_t>(c.B * c.T * c.C), g);
  ConvOut zero{{}, std::vector<float>(c.x.size()), std::vector<float>(c.w.size()),
               std::vector<float>(c.bias.size())};
  const ConvOut an = run_conv(ssm_conv_forward, ssm_conv_backward, c, r, zero);
  std::vector<double> dw(c.w.size()), adw(c.w.size()), db(c.C), adb(c.C);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t ch = 0; ch < c.C; ++ch) {
        auto xv = [&](int64_t k) {
          const int64_t ts = t - (c.W - 1) + k;
          return ts < 0 ? 0.0 : double(c.x[(b * c.T + ts) * c.ld + 2 + ch]);
        };
        double pre = c.bias[ch];
        for (int64_t k = 0; k < c.W; ++k) pre += double(c.w[ch * c.W + k]) * xv(k);
        const double sg = 1.0 / (1.0 + std::exp(-pre));
        const double dp = r[(b * c.T + t) * c.C + ch] * sg * (1.0 + pre * (1.0 - sg));
        db[ch] += dp, adb[ch] += std::fabs(dp);
        for (int64_t k = 0; k < c.W; ++k)
          dw[ch * c.W + k] += dp * xv(k), adw[ch * c.W + k] += std::fabs(dp * xv(k));
      }
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(an.dw[i], dw[i], 1e-5 * adw[i] + 1e-6) << i;
  for (int64_t i = 0; i < c.C; ++i) EXPECT_NEAR(an.dbias[i], db[i], 1e-5 * adb[i] + 1e-6) << i;
}

// ---------------------------------------------------------------- gated RMSNorm
struct Norm {
  int64_t BT, Dn, G, ldz;
  std::vector<float> y, z, w;  // z [BT, ldz], slice at column 3
};
Norm make_norm(int64_t BT, int64_t Dn, int64_t G, Mode m, uint32_t seed) {
  std::mt19937 g(seed);
  Norm n{BT, Dn, G, Dn + 7, {}, {}, {}};
  n.y = randn(static_cast<size_t>(BT * Dn), g);
  n.z = randn(static_cast<size_t>(BT * n.ldz), g, 2.0f);
  n.w = uniform(static_cast<size_t>(Dn), g, 0.5f, 1.5f);
  if (m == Mode::kZeros) {
    std::fill(n.y.begin(), n.y.end(), 0.0f);
  } else if (m == Mode::kPow2) {
    std::uniform_int_distribution<int> e(-4, 4), sg(0, 1);
    for (auto* v : {&n.y, &n.z, &n.w})
      for (auto& x : *v) x = std::ldexp(sg(g) ? 1.0f : -1.0f, e(g));
  } else if (m == Mode::kBigDt) {
    for (auto& x : n.z) x *= 50.0f;
  }
  return n;
}
struct NormOut {
  std::vector<float> out, rstd, dy, dz, dw;
};
NormOut run_norm(decltype(&gated_rmsnorm_forward) fwd, decltype(&gated_rmsnorm_backward) bwd,
                 const Norm& n, const std::vector<float>& dout, const NormOut& init) {
  NormOut o = init;
  o.out.assign(n.y.size(), -7.0f);
  o.rstd.assign(static_cast<size_t>(n.BT * n.G), -7.0f);
  fwd(o.out.data(), o.rstd.data(), n.y.data(), n.z.data() + 3, n.ldz, n.w.data(), n.BT, n.Dn,
      n.G, 1e-5f);
  bwd(o.dy.data(), o.dz.data() + 3, o.dw.data(), dout.data(), n.y.data(), n.z.data() + 3, n.ldz,
      n.w.data(), o.rstd.data(), n.BT, n.Dn, n.G);
  return o;
}

TEST(SsmTwin, GatedNormBitIdentical) {
  int k = 0;
  for (auto [BT, Dn, G] : {std::tuple<int64_t, int64_t, int64_t>{9, 96, 1}, {9, 96, 2},
                           {5, 200, 4}, {3, 2100, 1}, {4, 6, 3}, {150, 24, 2}})
    for (Mode m : {Mode::kRandom, Mode::kZeros, Mode::kPow2, Mode::kBigDt}) {
      const Norm n = make_norm(BT, Dn, G, m, 60 + k);
      std::mt19937 g(70 + k++);
      const std::vector<float> dout = randn(n.y.size(), g);
      NormOut init{{}, {}, randn(n.y.size(), g), randn(n.z.size(), g), randn(n.w.size(), g)};
      const NormOut ref =
          run_norm(gated_rmsnorm_forward_ref, gated_rmsnorm_backward_ref, n, dout, init);
      const std::string shp = "d_inner=" + std::to_string(Dn) + " G=" + std::to_string(G) +
                              " " + mode_name(m) + " ";
      for_variants([&](const std::string& ctx) {
        const NormOut o = run_norm(gated_rmsnorm_forward, gated_rmsnorm_backward, n, dout, init);
        expect_same("out", shp + ctx, o.out, ref.out);
        expect_same("rstd", shp + ctx, o.rstd, ref.rstd);
        expect_same("dy", shp + ctx, o.dy, ref.dy);
        expect_same("dz", shp + ctx, o.dz, ref.dz);
        expect_same("dweight", shp + ctx, o.dw, ref.dw);
      });
    }
}

TEST(SsmGrad, GatedNormFiniteDifferences) {
  for (int64_t G : {1, 2}) {
    const Norm n0 = make_norm(3, 8, G, Mode::kRandom, 11);
    std::mt19937 g(12);
    const std::vector<float> r = randn(n0.y.size(), g);
    NormOut zero{{}, {}, std::vector<float>(n0.y.size()), std::vector<float>(n0.z.size()),
                 std::vector<float>(n0.w.size())};
    const NormOut an = run_norm(gated_rmsnorm_forward, gated_rmsnorm_backward, n0, r, zero);
    std::vector<double> y = to_d(n0.y), z = to_d(n0.z), w = to_d(n0.w);
    auto loss = [&]() {  // FP64 RMSNormGated(norm_before_gate=False)
      const int64_t gs = n0.Dn / n0.G;
      double L = 0.0;
      for (int64_t t = 0; t < n0.BT; ++t)
        for (int64_t grp = 0; grp < n0.G; ++grp) {
          std::vector<double> gv(static_cast<size_t>(gs));
          double ss = 0.0;
          for (int64_t j = 0; j < gs; ++j) {
            const int64_t c = grp * gs + j;
            const double zz = z[t * n0.ldz + 3 + c];
            gv[j] = y[t * n0.Dn + c] * zz / (1.0 + std::exp(-zz));
            ss += gv[j] * gv[j];
          }
          const double rs = 1.0 / std::sqrt(ss / gs + 1e-5);
          for (int64_t j = 0; j < gs; ++j) {
            const int64_t c = grp * gs + j;
            L += r[t * n0.Dn + c] * gv[j] * rs * w[c];
          }
        }
      return L;
    };
    fd_check("norm y", y, an.dy, 0, loss);
    fd_check("norm z", z, an.dz, 0, loss);
    fd_check("norm weight", w, an.dw, 0, loss);
  }
}

// dweight over several 64-row blocks (the last partial) against FP64 sums from the definition.
TEST(SsmGrad, GatedNormWeightGradOverRowBlocks) {
  const Norm n = make_norm(150, 24, 2, Mode::kRandom, 13);
  std::mt19937 g(14);
  const std::vector<float> r = randn(n.y.size(), g);
  NormOut zero{{}, {}, std::vector<float>(n.y.size()), std::vector<float>(n.z.size()),
               std::vector<float>(n.w.size())};
  const NormOut an = run_norm(gated_rmsnorm_forward, gated_rmsnorm_backward, n, r, zero);
  const int64_t gs = n.Dn / n.G;
  std::vector<double> dw(static_cast<size_t>(n.Dn)), adw(static_cast<size_t>(n.Dn));
  for (int64_t t = 0; t < n.BT; ++t)
    for (int64_t grp = 0; grp < n.G; ++grp) {
      std::vector<double> gv(static_cast<size_t>(gs));
      double ss = 0.0;
      for (int64_t j = 0; j < gs; ++j) {
        const int64_t c = grp * gs + j;
        const double zz = n.z[t * n.ldz + 3 + c];
        gv[j] = n.y[t * n.Dn + c] * zz / (1.0 + std::exp(-zz));
        ss += gv[j] * gv[j];
      }
      const double rs = 1.0 / std::sqrt(ss / gs + 1e-5);
      for (int64_t j = 0; j < gs; ++j) {
        const int64_t c = grp * gs + j;
        const double term = r[t * n.Dn + c] * gv[j] * rs;
        dw[c] += term, adw[c] += std::fabs(term);
      }
    }
  for (int64_t c = 0; c < n.Dn; ++c) EXPECT_NEAR(an.dw[c], dw[c], 1e-5 * adw[c] + 1e-6) << c;
}

// ---------------------------------------------------------------- bad arguments
TEST(SsmArgs, BadArgumentsThrow) {
  const SsdDims d{1, 4, 2, 2, 1, 2, 2};
  std::vector<float> buf(1024, 0.0f), ws(1024, 0.0f);
  float* p = buf.data();
  auto fwd = [&](const SsdDims& dd, int64_t ldx, int64_t ldb, int64_t lddt, const float* x) {
    ssd_scan_forward(p, ws.data(), x, ldx, p, ldb, p, 8, p, lddt, p, p, p, dd);
  };
  EXPECT_NO_THROW(fwd(d, 8, 8, 2, p));
  EXPECT_THROW(fwd(SsdDims{1, 4, 3, 2, 2, 2, 2}, 8, 8, 3, p), std::invalid_argument);  // H % G
  EXPECT_THROW(fwd(SsdDims{1, 4, 2, 2, 1, 2, 0}, 8, 8, 2, p), std::invalid_argument);  // Q < 1
  EXPECT_THROW(fwd(SsdDims{1, 0, 2, 2, 1, 2, 2}, 8, 8, 2, p), std::invalid_argument);  // T < 1
  EXPECT_THROW(fwd(d, 3, 8, 2, p), std::invalid_argument);        // ldx < H·P
  EXPECT_THROW(fwd(d, 8, 1, 2, p), std::invalid_argument);        // ldb < G·N
  EXPECT_THROW(fwd(d, 8, 8, 1, p), std::invalid_argument);        // lddt < H
  EXPECT_THROW(fwd(d, 8, 8, 2, nullptr), std::invalid_argument);  // null x
  EXPECT_THROW(ssd_scan_forward_ref(p, ws.data(), p, 8, p, 8, p, 8, p, 2, p, p, p,
                                    SsdDims{1, 4, 3, 2, 2, 2, 2}),
               std::invalid_argument);
  EXPECT_THROW(ssd_scan_backward(p, p, p, p, p, p, nullptr, p, ws.data(), p, 8, p, 8, p, 8, p, 2,
                                 p, p, p, d),
               std::invalid_argument);
  EXPECT_THROW(ssd_workspace_floats(1, 4, 3, 2, 2, 2, 2), std::invalid_argument);
  EXPECT_THROW(ssd_workspace_floats(1, 4, 2, 2, 1, 2, 0), std::invalid_argument);
  EXPECT_EQ(ssd_workspace_floats(2, 5, 2, 3, 1, 4, 2), 2 * 2 * (3 * 4 * 3 + 5));
  try {
    fwd(d, 3, 8, 2, p);
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("ldx"), std::string::npos) << e.what();
  }
  // conv
  EXPECT_NO_THROW(ssm_conv_forward(p, p, 4, p, p, 1, 4, 4, 4));
  EXPECT_THROW(ssm_conv_forward(p, p, 3, p, p, 1, 4, 4, 4), std::invalid_argument);  // ldx < C
  EXPECT_THROW(ssm_conv_forward(p, nullptr, 4, p, p, 1, 4, 4, 4), std::invalid_argument);
  EXPECT_THROW(ssm_conv_backward(p, p, nullptr, p, p, 4, p, p, 1, 4, 4, 4),
               std::invalid_argument);
  EXPECT_THROW(ssm_conv_backward_ref(p, p, p, p, p, 4, p, p, 1, 4, 4, 0), std::invalid_argument);
  // norm
  EXPECT_NO_THROW(gated_rmsnorm_forward(p, p, p, p, 8, p, 2, 8, 2, 1e-5f));
  EXPECT_THROW(gated_rmsnorm_forward(p, p, p, p, 8, p, 2, 8, 3, 1e-5f), std::invalid_argument);
  EXPECT_THROW(gated_rmsnorm_forward(p, p, p, p, 7, p, 2, 8, 2, 1e-5f), std::invalid_argument);
  EXPECT_THROW(gated_rmsnorm_backward(p, nullptr, p, p, p, p, 8, p, p, 2, 8, 2),
               std::invalid_argument);
  EXPECT_THROW(gated_rmsnorm_backward_ref(p, p, p, p, p, p, 8, p, p, 2, 8, 0),
               std::invalid_argument);
}

TEST(SsmTwin, VariantsAvailable) {
  std::string avail;
  for (const Variant& v : kVariants)
    if (detail::set_ssm_isa(v.isa)) avail += std::string(" ") + v.name;
  detail::reset_ssm_isa();
  std::printf("ssm variants on this CPU:%s\n", avail.c_str());
  EXPECT_TRUE(detail::set_ssm_isa(SsmIsa::kBase));
  EXPECT_TRUE(detail::set_ssm_isa(SsmIsa::kEmu16));
  detail::reset_ssm_isa();
}

}  // namespace
