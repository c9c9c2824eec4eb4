// Tests of the probe-matched GEMM emulation (docs/numerics.md "GEMM emulation").
// The reference below is written independently of src/gemm/probe_gemm.cpp: it works from
// the raw QuantizedTensor fields (e2m1_decode of each code, the 24-bit FP32 mantissa of each
// block scale), forms every product as an exact dyadic term, decides every rounding by exact
// sign comparisons against FP32 neighbours and midpoints found with std::nextafter (a
// digit-array carry normalisation, not the library's word arithmetic), and snaps with
// nearbyintl in long double. Expected values of the hand-computed cases are worked in the
// comments.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "support/variant_set.h"
#include "fp4/numerics/block_quant.h"
#include "fp4/numerics/format.h"
#include "fp4/gemm/probe_gemm.h"

using namespace fp4;

namespace {

// ------------------------------------------------------------------ exact dyadic reference

/// v·2^u, v normalised odd (or 0).
struct Dy {
  int64_t v = 0;
  int u = 0;
};

Dy norm(int64_t v, int u) {
  if (v == 0) return {0, 0};
  const int tz = std::countr_zero(static_cast<uint64_t>(v < 0 ? -v : v));
  return {v / (int64_t{1} << tz), u + tz};
}

/// Exact value of a finite double as a dyadic term.
Dy dy_of(double x) {
  if (x == 0.0) return {0, 0};
  int e = 0;
  const double m = std::frexp(x, &e);
  return norm(static_cast<int64_t>(std::ldexp(m, 53)), e - 53);
}

Dy neg(Dy d) { return {-d.v, d.u}; }
Dy half(Dy d) { return {d.v, d.u - 1}; }

/// Sign (−1, 0, +1) of Σ t exactly: one int64 coefficient per bit position, then carry
/// normalisation from the lowest position up, keeping value = Σ digit_k·2^k + carry·2^len.
int exact_sign(const std::vector<Dy>& t) {
  int umin = INT32_MAX, umax = INT32_MIN;
  for (const Dy& d : t)
    if (d.v != 0) {
      umin = std::min(umin, d.u);
      umax = std::max(umax, d.u);
    }
  if (umin == INT32_MAX) return 0;
  std::vector<int64_t> c(static_cast<size_t>(umax - umin + 1), 0);
  for (const Dy& d : t)
    if (d.v != 0) c[static_cast<size_t>(d.u - umin)] += d.v;
  int64_t carry = 0;
  bool any = false;
  for (int64_t& x : c) {
    const int64_t s = x + carry;
    const int64_t digit = s & 1;  // s mod 2 in {0, 1} (two's complement)
    carry = (s - digit) / 2;      // exact
    x = digit;
    any |= digit != 0;
  }
  if (carry < 0) return -1;
  if (carry > 0) return 1;
  return any ? 1 : 0;
}

/// Σ t truncated toward zero to 64 significant bits (a long double within 2^-63 relative of
/// the exact value, whatever cancellation the terms hold): sign–magnitude digit normalisation.
long double exact_approx(const std::vector<Dy>& t) {
  const int sg = exact_sign(t);
  if (sg == 0) return 0.0L;
  int umin = INT32_MAX, umax = INT32_MIN;
  for (const Dy& d : t)
    if (d.v != 0) {
      umin = std::min(umin, d.u);
      umax = std::max(umax, d.u);
    }
  // |Σ| < 2^64·2^(umax − umin) for the few small terms used here: 70 extra positions absorb
  // every carry of the (now non-negative) magnitude.
  std::vector<int64_t> c(static_cast<size_t>(umax - umin + 71), 0);
  for (const Dy& d : t)
    if (d.v != 0) c[static_cast<size_t>(d.u - umin)] += sg * d.v;
  int64_t carry = 0;
  for (int64_t& x : c) {
    const int64_t s = x + carry;
    x = s & 1;
    carry = (s - x) / 2;
  }
  EXPECT_EQ(carry, 0);
  long double r = 0.0L;
  int taken = 0;
  for (size_t k = c.size(); k-- > 0 && taken < 64;) {
    if (r != 0.0L) ++taken;
    if (c[k]) {
      r += std::ldexp(1.0L, static_cast<int>(k) + umin);
      if (taken == 0) taken = 1;
    }
  }
  return sg * r;
}

/// sign(Σ t − x) for a float x.
int cmp_with(std::vector<Dy> t, double x) {
  t.push_back(neg(dy_of(x)));
  return exact_sign(t);
}

bool even_float(float f) { return (std::bit_cast<uint32_t>(f) & 1u) == 0; }

/// RNE rounding of Σ t to FP32 (IEEE: subnormals, overflow to ±Inf, nonzero values rounding
/// to 0 keep their sign, exact zero is +0), by search among FP32 neighbours.
float ref_round_rne(const std::vector<Dy>& t) {
  const int sg = exact_sign(t);
  if (sg == 0) return 0.0f;
  float f = static_cast<float>(exact_approx(t));
  if (std::isinf(f)) f = std::copysign(FLT_MAX, f);
  for (int iter = 0;; ++iter) {
    EXPECT_LT(iter, 4) << "the 64-bit approximation should be within one FP32 step";
    bool moved = false;
    for (const float dir : {INFINITY, -INFINITY}) {
      const float nb = std::nextafter(f, dir);
      int s;
      if (std::isinf(nb)) {  // beyond ±FLT_MAX: the next "value" is ±2^128 (even), i.e. ±Inf
        std::vector<Dy> u = t;
        u.push_back(neg(dy_of(f)));
        u.push_back(neg(Dy{dir > 0 ? 1 : -1, 103}));  // midpoint FLT_MAX + 2^103 (ulp/2)
        s = exact_sign(u);
        if (dir < 0) s = -s;
        if (s > 0 || s == 0) return nb;  // at or beyond the midpoint: tie goes to "even" 2^128
        continue;
      }
      std::vector<Dy> u = t;
      u.push_back(neg(half(dy_of(f))));
      u.push_back(neg(half(dy_of(nb))));
      s = exact_sign(u);          // sign(Σ − (f + nb)/2)
      if (dir < 0) s = -s;        // positive: Σ lies beyond the midpoint in direction dir
      if (s > 0) {
        f = nb;
        moved = true;
        break;
      }
      if (s == 0) return even_float(f) ? (f == 0.0f ? std::copysign(0.0f, float(sg)) : f) : nb;
    }
    if (!moved) break;
  }
  if (f == 0.0f) return std::copysign(0.0f, static_cast<float>(sg));
  return f;
}

/// FP32 addition rounded toward zero: the largest-magnitude FP32 value not beyond a + b.
float ref_add_rtz(float a, float b) {
  if (!std::isfinite(a) || !std::isfinite(b)) return a + b;
  const std::vector<Dy> t = {dy_of(a), dy_of(b)};
  const int sg = exact_sign(t);
  if (sg == 0) return 0.0f;  // IEEE: an exact zero sum is +0 under RTZ
  const float away = sg > 0 ? INFINITY : -INFINITY;
  float r = static_cast<float>(static_cast<long double>(a) + static_cast<long double>(b));
  if (std::isinf(r)) r = std::copysign(FLT_MAX, r);
  if ((r > 0.0f) != (sg > 0)) r = std::copysign(0.0f, static_cast<float>(sg));
  // |r| ≤ |a + b|  ⟺  sg·(Σ − r) ≥ 0
  auto fits = [&](float x) { return sg * cmp_with(t, x) >= 0; };
  while (!fits(r)) r = std::nextafter(r, 0.0f);
  while (std::fabs(r) < FLT_MAX && fits(std::nextafter(r, away))) r = std::nextafter(r, away);
  return r;
}

/// FP32 addition rounded to nearest even: the exact sum, rounded once by the reference.
float ref_add_rne(float a, float b) {
  if (!std::isfinite(a) || !std::isfinite(b)) return a + b;
  return ref_round_rne({dy_of(a), dy_of(b)});
}

/// d⁻¹·RNE(d·x) in long double (d = 0: x), then times α (one FP32 rounding of the exact product).
float ref_finish(float acc, float alpha, int d = 1024) {
  const long double dd = d;
  const long double s = d == 0 ? static_cast<long double>(acc)
                               : std::nearbyintl(static_cast<long double>(acc) * dd) / dd;
  const float sf = static_cast<float>(s);
  if (std::isfinite(acc)) {
    EXPECT_EQ(static_cast<long double>(sf), s) << "snap not exact in FP32";
  }
  return static_cast<float>(static_cast<long double>(sf) * static_cast<long double>(alpha));
}

/// Exact product q_a·c_a·q_b·c_b as a dyadic term.
Dy product(uint8_t code_a, float c_a, uint8_t code_b, float c_b) {
  const int na = static_cast<int>(e2m1_decode(code_a) * 2.0f);  // 2q, exact
  const int nb = static_cast<int>(e2m1_decode(code_b) * 2.0f);
  const Dy da = dy_of(c_a), db = dy_of(c_b);
  return norm(static_cast<int64_t>(na) * nb * da.v * db.v, da.u + db.u - 2);
}

float scale_at(const QuantizedTensor& q, int64_t r, int64_t k) {
  const int64_t B = q.spec.block;
  const int64_t br = q.spec.two_d ? r / B : r;
  return q.scales[static_cast<size_t>(br * q.block_cols + k / B)];
}

/// One operand's part of α: (g, fl(T·6)) for a tensor-scaled operand with g > 0, and (1, 1)
/// where the quantizer used ge = gd = 1 (the g = 0 guard, the MX scale rules). Each FP32
/// operation is done in double and rounded once to FP32 (exact: a double product of two floats
/// is exact, and double then float rounding of a quotient of floats is the correct rounding).
std::pair<float, float> ref_alpha_part(const QuantizedTensor& q) {
  if (q.spec.scale_rule != ScaleRule::TensorScaled || q.g == 0.0f) return {1.0f, 1.0f};
  return {q.g, static_cast<float>(static_cast<double>(q.spec.target) * 6.0)};
}
/// The contract's α = g_a·g_b / ((T_a·6)(T_b·6)) in FP32, in that order: fl(g_a·g_b) divided
/// by fl(fl(T_a·6)·fl(T_b·6)).
float ref_alpha(const QuantizedTensor& a, const QuantizedTensor& b) {
  const auto [na, da] = ref_alpha_part(a);
  const auto [nb, db] = ref_alpha_part(b);
  const float num = static_cast<float>(static_cast<double>(na) * nb);
  const float den = static_cast<float>(static_cast<double>(da) * db);
  return static_cast<float>(static_cast<double>(num) / den);
}

/// The probe-matched rules, spelled out: chunks [c0, c0 + chunk), exact sum rounded once (RNE),
/// RTZ (or RNE) accumulation from +0 in K order, snap to 1/d (RNE; d = 0 none), times the
/// contract's α. The defaults are the paper's probe: 64, RTZ, 1/1024.
std::vector<float> ref_probe(const QuantizedTensor& a, const QuantizedTensor& b, int chunk = 64,
                             bool rtz = true, int d = 1024) {
  const int64_t M = a.rows, N = b.rows, K = a.cols;
  const float alpha = ref_alpha(a, b);
  std::vector<float> c(static_cast<size_t>(M * N));
  std::vector<Dy> terms;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      float acc = 0.0f;
      for (int64_t c0 = 0; c0 < K; c0 += chunk) {
        terms.clear();
        for (int64_t k = c0; k < std::min(K, c0 + chunk); ++k) {
          terms.push_back(product(a.codes[static_cast<size_t>(i * K + k)], scale_at(a, i, k),
                                  b.codes[static_cast<size_t>(j * K + k)], scale_at(b, j, k)));
        }
        acc = rtz ? ref_add_rtz(acc, ref_round_rne(terms)) : ref_add_rne(acc, ref_round_rne(terms));
      }
      c[static_cast<size_t>(i * N + j)] = ref_finish(acc, alpha, d);
    }
  return c;
}

// ------------------------------------------------------------------ helpers

/// Every kernel this CPU can run that FP4_TEST_VARIANTS selects (tests/support/variant_set.h;
/// every test below runs against each of them): the portable twin always; the native SIMD
/// kernels by default; the AVX-512 kernel's code with its instructions emulated
/// (Avx512Emulated, any x86-64 CPU) under FP4_TEST_VARIANTS=emulated.
std::vector<ProbeKernel> kernels() {
  std::vector<ProbeKernel> k = {ProbeKernel::Portable};
  if (fp4::test::variant_selected(false)) {
    if (probe_gemm_avx512_available()) k.push_back(ProbeKernel::Avx512Vnni);
    if (probe_gemm_avx2_available()) k.push_back(ProbeKernel::Avx2);
  }
  if (fp4::test::variant_selected(true)) k.push_back(ProbeKernel::Avx512Emulated);
  return k;
}
const char* kname(ProbeKernel k) { return probe_kernel_name(k); }

std::vector<float> run_probe(const QuantizedTensor& a, const QuantizedTensor& b, ProbeKernel k) {
  std::vector<float> c(static_cast<size_t>(a.rows * b.rows), -12345.0f);
  probe_gemm(a, b, c.data(), ProbeGemmOptions{k, {}});
  return c;
}

/// Bitwise comparison (NaNs compare equal to NaNs); reports the first few differences.
::testing::AssertionResult same_bits(const std::vector<float>& got, const std::vector<float>& want,
                                     int64_t N) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size mismatch";
  int bad = 0;
  std::string msg;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool eq = (std::isnan(got[i]) && std::isnan(want[i])) ||
                    std::bit_cast<uint32_t>(got[i]) == std::bit_cast<uint32_t>(want[i]);
    if (!eq && bad++ < 5) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "\n  C[%lld,%lld]: got %.9g (0x%08X), want %.9g (0x%08X)",
                    static_cast<long long>(static_cast<int64_t>(i) / N),
                    static_cast<long long>(static_cast<int64_t>(i) % N), double(got[i]),
                    std::bit_cast<uint32_t>(got[i]), double(want[i]),
                    std::bit_cast<uint32_t>(want[i]));
      msg += buf;
    }
  }
  if (bad) return ::testing::AssertionFailure() << bad << " of " << got.size() << " differ" << msg;
  return ::testing::AssertionSuccess();
}

/// A QuantizedTensor built directly from codes and decoded scales (no quantizer involved).
QuantizedTensor make_qt(int64_t rows, int64_t cols, int block, bool two_d,
                        std::vector<uint8_t> codes, std::vector<float> scales, float gd = 1.0f) {
  QuantizedTensor q;
  q.rows = rows;
  q.cols = cols;
  q.spec.block = block;
  q.spec.two_d = two_d;
  q.block_cols = (cols + block - 1) / block;
  q.block_rows = two_d ? (rows + block - 1) / block : rows;
  const size_t nb = static_cast<size_t>(q.block_rows * q.block_cols);
  q.codes = std::move(codes);
  q.scales = std::move(scales);
  if (q.scales.size() != nb) ADD_FAILURE() << "make_qt: " << q.scales.size() << " scales, want " << nb;
  q.block_amax.assign(nb, 0.0f);
  q.scale_codes.assign(nb, 0);
  // Tensor scales as the quantizer would set them for T = 1 and g = 6·gd (exact for the gd
  // used here), so that gd = 1/((T·6)/g) and the contract's α is gd_a·gd_b exactly.
  q.spec.target = 1.0f;
  q.g = 6.0f * gd;
  q.ge = (q.spec.target * 6.0f) / q.g;
  q.gd = 1.0f / q.ge;
  EXPECT_EQ(q.gd, gd) << "make_qt: gd " << gd << " is not reproduced by T = 1, g = 6·gd";
  return q;
}

/// One-row operands with block 1 (each element carries its own scale) from (q, c) pairs.
QuantizedTensor row_qt(const std::vector<std::pair<float, float>>& qc, float gd = 1.0f) {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  for (auto [q, c] : qc) {
    codes.push_back(e2m1_encode(q, Rounding::RNE));
    EXPECT_EQ(e2m1_decode(codes.back()), q) << "not an E2M1 value: " << q;
    scales.push_back(c);
  }
  return make_qt(1, static_cast<int64_t>(qc.size()), 1, false, std::move(codes), std::move(scales), gd);
}

/// A one-row block-1 operand repeated as `rows` identical rows.
QuantizedTensor repeat_rows(const QuantizedTensor& q, int64_t rows) {
  QuantizedTensor r = q;
  r.rows = rows;
  r.block_rows = rows;
  for (auto* v : {&r.block_amax}) v->assign(static_cast<size_t>(rows * q.block_cols), 0.0f);
  r.scale_codes.assign(static_cast<size_t>(rows * q.block_cols), 0);
  r.codes.clear();
  r.scales.clear();
  for (int64_t i = 0; i < rows; ++i) {
    r.codes.insert(r.codes.end(), q.codes.begin(), q.codes.end());
    r.scales.insert(r.scales.end(), q.scales.begin(), q.scales.end());
  }
  return r;
}

/// Probe-matched product of two one-row operands, checked against the reference and every
/// kernel; also as a 5 × 37 product of repeated rows (every output the same value), so that
/// the SIMD kernels compute it in every lane of their 16-lane vectors, in every row of a
/// 4-row tile, and in a ragged tile.
float probe1(const QuantizedTensor& a, const QuantizedTensor& b) {
  const std::vector<float> want = ref_probe(a, b);
  for (ProbeKernel k : kernels()) EXPECT_TRUE(same_bits(run_probe(a, b, k), want, 1)) << kname(k);
  if (a.rows == 1 && b.rows == 1 && a.spec.block == 1 && b.spec.block == 1 && !a.spec.two_d &&
      !b.spec.two_d) {
    const QuantizedTensor a5 = repeat_rows(a, 5), b37 = repeat_rows(b, 37);
    const std::vector<float> all(5 * 37, want[0]);
    for (ProbeKernel k : kernels())
      EXPECT_TRUE(same_bits(run_probe(a5, b37, k), all, 37)) << kname(k) << ", 5 x 37";
  }
  return want[0];
}

std::vector<float> random_matrix(std::mt19937_64& rng, int64_t rows, int64_t cols, int dist) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (float& v : x) {
    switch (dist) {
      case 0: v = nd(rng); break;                                              // normal
      case 1: v = nd(rng) / std::max(1e-3f, std::fabs(nd(rng))); break;        // heavy tailed
      case 2: v = nd(rng) * std::ldexp(1.0f, static_cast<int>(ud(rng) * 40) - 20); break;  // wide range
      default: v = nd(rng) * 1e-30f; break;                                    // tiny
    }
  }
  // some all-zero stretches (zero blocks)
  for (int64_t r = 0; r < rows; r += 3)
    for (int64_t k = 0; k < std::min<int64_t>(cols, 16); ++k) x[static_cast<size_t>(r * cols + k)] = 0.0f;
  return x;
}

QuantizedTensor quantize(const std::vector<float>& x, int64_t rows, int64_t cols,
                         ScaleFormat f, int block, bool two_d, float g_factor,
                         Rounding rounding = Rounding::RNE) {
  BlockQuantSpec spec;
  spec.scale_format = f;
  spec.block = block;
  spec.two_d = two_d;
  spec.rounding = rounding;
  const float g = tensor_amax(x.data(), rows * cols) * g_factor;
  SrKey key;
  key.seed = 11;
  return quantize_blocks(x.data(), rows, cols, spec, g, &key);
}

// ------------------------------------------------------------------ tests

TEST(ProbeGemmReference, SelfChecks) {
  // The reference's own primitives on cases with known answers.
  EXPECT_EQ(ref_round_rne({{1, 0}, {1, -30}}), 1.0f);                         // 1 + 2^-30 → 1
  EXPECT_EQ(ref_round_rne({{1, 24}, {1, 0}}), 16777216.0f);                   // tie → even
  EXPECT_EQ(ref_round_rne({{1, 24}, {3, 0}}), 16777220.0f);                   // tie → even (up)
  EXPECT_EQ(ref_round_rne({{1, 24}, {1, 0}, {1, -60}}), 16777218.0f);         // just above tie
  EXPECT_EQ(ref_round_rne({{-1, 24}, {-1, 0}, {-1, -60}}), -16777218.0f);
  EXPECT_TRUE(std::isinf(ref_round_rne({{1, 128}})));
  EXPECT_EQ(ref_round_rne({{(int64_t{1} << 24) - 1, 104}}), FLT_MAX);
  EXPECT_TRUE(std::isinf(ref_round_rne({{(int64_t{1} << 25) - 1, 103}})));  // FLT_MAX + ulp/2: tie → Inf
  EXPECT_EQ(ref_round_rne({{1, -150}}), 0.0f);                                // half the min subnormal → 0
  EXPECT_EQ(ref_round_rne({{3, -151}}), std::ldexp(1.0f, -149));
  EXPECT_TRUE(std::signbit(ref_round_rne({{-1, -160}})));
  EXPECT_EQ(ref_add_rtz(1.0f, -std::ldexp(1.0f, -60)), std::nextafter(1.0f, 0.0f));
  EXPECT_EQ(ref_add_rtz(1.0f, std::ldexp(1.0f, -60)), 1.0f);
  EXPECT_EQ(ref_add_rtz(-1.0f, std::ldexp(1.0f, -60)), -std::nextafter(1.0f, 0.0f));
  EXPECT_EQ(ref_add_rtz(FLT_MAX, FLT_MAX), FLT_MAX);
  EXPECT_EQ(ref_add_rtz(1.0f, std::ldexp(1.0f, -23) * 1.5f), 1.0f + std::ldexp(1.0f, -23));
  EXPECT_FALSE(std::signbit(ref_add_rtz(1.5f, -1.5f)));
}

// Hand-computed cases. Operands of block 1 so each element has its own scale; gd = 1 (α = 1)
// unless stated.
TEST(ProbeGemmHand, ChunkSumRoundedOnceToFp32) {
  // K = 2: 1·1 + (0.5·2^-14)·(0.5·2^-14) = 1 + 2^-30: rounds to 1 in FP32, snap keeps 1.
  const float t = std::ldexp(1.0f, -14);
  EXPECT_EQ(probe1(row_qt({{1, 1}, {0.5f, t}}), row_qt({{1, 1}, {0.5f, t}})), 1.0f);
  // One chunk of products 2^14, 2^-10, 2^-10: exact sum 16384 + 2^-9 is an FP32 value
  // (ulp 2^-9 at 2^14) and on the 1/1024 grid → 16384.001953125. Adding the products one at a
  // time in FP32 would give 16384 twice (each 2^-10 is a tie, rounded to even).
  const auto a = row_qt({{4, 32}, {0.5f, std::ldexp(1.0f, -4)}, {0.5f, std::ldexp(1.0f, -4)}});
  const auto b = row_qt({{4, 32}, {0.5f, std::ldexp(1.0f, -4)}, {0.5f, std::ldexp(1.0f, -4)}});
  EXPECT_EQ(probe1(a, b), 16384.001953125f);
}

TEST(ProbeGemmHand, RoundTowardZeroAcrossChunks) {
  // K = 65: chunk 1 = 4·32 · 4·32 = 2^14; chunk 2 (element 64) = (0.5·2^-10)·(−0.5·2^-8) = −2^-20.
  // RTZ(2^14 − 2^-20) = 2^14 − 2^-10 (ulp 2^-10 below 2^14), on the snap grid: 16383.9990234375.
  // Round-to-nearest accumulation would give 16384.
  std::vector<std::pair<float, float>> qa(65, {0.0f, 1.0f}), qb(65, {0.0f, 1.0f});
  qa[0] = {4, 32};
  qb[0] = {4, 32};
  qa[64] = {0.5f, std::ldexp(1.0f, -10)};
  qb[64] = {-0.5f, std::ldexp(1.0f, -8)};
  EXPECT_EQ(probe1(row_qt(qa), row_qt(qb)), 16383.9990234375f);
  // Negative sum: −2^14 + 2^-20 truncates toward zero as well: −16383.9990234375.
  qa[0] = {-4, 32};
  qb[64] = {0.5f, std::ldexp(1.0f, -8)};
  EXPECT_EQ(probe1(row_qt(qa), row_qt(qb)), -16383.9990234375f);
  // At magnitude 1 the snap hides RTZ: RTZ(1 − 2^-30) = 1 − 2^-24, snapped back to 1.
  qa[0] = {1, 1};
  qb[0] = {1, 1};
  qa[64] = {0.5f, std::ldexp(1.0f, -14)};
  qb[64] = {-0.5f, std::ldexp(1.0f, -14)};
  EXPECT_EQ(probe1(row_qt(qa), row_qt(qb)), 1.0f);
  // Same sum in ONE chunk (K = 2): 1 − 2^-30 rounds to nearest, 1.
  EXPECT_EQ(probe1(row_qt({{1, 1}, {0.5f, std::ldexp(1.0f, -14)}}),
                   row_qt({{1, 1}, {-0.5f, std::ldexp(1.0f, -14)}})),
            1.0f);
}

TEST(ProbeGemmHand, SnapToGrid1024) {
  const float c5 = std::ldexp(1.0f, -5), c4 = std::ldexp(1.0f, -4);
  // 1 + (0.5·2^-5)(0.5·2^-4) = 1 + 2^-11: halfway between 1024/1024 and 1025/1024 → even → 1.
  EXPECT_EQ(probe1(row_qt({{1, 1}, {0.5f, c5}}), row_qt({{1, 1}, {0.5f, c4}})), 1.0f);
  // 1 + (1.5·2^-5)(0.5·2^-4) = 1 + 3·2^-11: halfway between 1025/1024 and 1026/1024 → 1 + 2^-9.
  EXPECT_EQ(probe1(row_qt({{1, 1}, {1.5f, c5}}), row_qt({{1, 1}, {0.5f, c4}})),
            1.0f + std::ldexp(1.0f, -9));
  // −(1 + 3·2^-11) → −(1 + 2^-9) (RNE is symmetric).
  EXPECT_EQ(probe1(row_qt({{-1, 1}, {-1.5f, c5}}), row_qt({{1, 1}, {0.5f, c4}})),
            -(1.0f + std::ldexp(1.0f, -9)));
  // A lone product below 2^-11 snaps to zero; a negative one to −0.
  EXPECT_EQ(probe1(row_qt({{0.5f, c5}}), row_qt({{0.5f, c5}})), 0.0f);
  const float nz = probe1(row_qt({{-0.5f, c5}}), row_qt({{0.5f, c5}}));
  EXPECT_EQ(nz, 0.0f);
  EXPECT_TRUE(std::signbit(nz));
}

TEST(ProbeGemmHand, AlphaAppliedAfterSnap) {
  // gd_a = 2^-3, gd_b = 3 (α = 3·2^-3 = 0.375): 6·448 · 6·448 = 7225344, times 0.375 = 2709504.
  EXPECT_EQ(probe1(row_qt({{6, 448}}, 0.125f), row_qt({{6, 448}}, 3.0f)), 2709504.0f);
  // Snap happens before α: (0.5·2^-5)^2 = 2^-12 snaps to 0 even though α = 2^20 would make it 256.
  EXPECT_EQ(probe1(row_qt({{0.5f, std::ldexp(1.0f, -5)}}, 1024.0f),
                   row_qt({{0.5f, std::ldexp(1.0f, -5)}}, 1024.0f)),
            0.0f);
}

// α (docs/numerics.md "GEMM emulation"): α = g_a·g_b / ((T_a·6)(T_b·6)) in FP32, in that order.
TEST(ProbeGemmAlpha, IssueExampleGivesTheExactProduct) {
  // A = [3, 1 × 15], B = [7, 1 × 15], one row each, K = 16, ue5m3 blocks of 16, T = 448,
  // g = the current amax (what `fp4train gemm` does):
  //  A: ge = 2688/3 = 896, c = RNE(3·896/6) = 448, elements 3·896/448 = 6 and 1·896/448 = 2,
  //     so the operand is exactly [3, 1, ...];
  //  B: ge = 2688/7 = 384, c = RNE(7·384/6) = 448, elements 7·384/448 = 6 and 1·384/448 ≈ 0.857
  //     → 1 (E2M1 RNE), which decodes to 448/384 = 7/6.
  // Exact product of the quantized operands: 3·7 + 15·(1·7/6) = 21 + 17.5 = 38.5.
  // Probe-matched: one chunk, (6·448)(6·448) + 15·(2·448)(1·448) = 448²·66 = 13246464 (exact in
  // FP32 and on the 1/1024 grid). α = fl(3·7) / fl(2688·2688) = 21/7225344 = 1/(21·2^14), rounded
  // once: fl(1/21) = 12782641·2^-28, relative error ε ≈ +1.86e-8, so y·α = 38.5·(1 + ε) and
  // 38.5·ε ≈ 7.2e-7 is below half an ulp of 38.5 (2^-19 ≈ 1.9e-6): RNE gives 38.5 exactly.
  // (α = fl(gd_a·gd_b), with gd = fl(1/896) and fl(1/384), gave 38.5 + 2^-18 = 38.500003814697266.)
  std::vector<float> xa(16, 1.0f), xb(16, 1.0f);
  xa[0] = 3.0f;
  xb[0] = 7.0f;
  const BlockQuantSpec spec;  // ue5m3, block 16, T = 448, RNE
  const auto qa = quantize_blocks(xa.data(), 1, 16, spec, tensor_amax(xa.data(), 16), nullptr);
  const auto qb = quantize_blocks(xb.data(), 1, 16, spec, tensor_amax(xb.data(), 16), nullptr);
  for (ProbeKernel k : kernels()) EXPECT_EQ(run_probe(qa, qb, k)[0], 38.5f) << kname(k);
  EXPECT_EQ(probe_gemm_alpha(qa, qb), std::ldexp(12782641.0f, -28 - 14));
}

TEST(ProbeGemmAlpha, EqualsTheContractFormulaForRandomReferencesAndTargets) {
  std::mt19937_64 rng(2026);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  const float targets[] = {448.0f, 2048.0f, 1.0f, 6.0f};
  std::vector<float> x(3 * 70);
  int differs_from_gd_product = 0, n = 0;
  for (int rep = 0; rep < 3000; ++rep) {
    for (float& v : x) v = (u(rng) - 0.5f) * 8.0f;
    BlockQuantSpec sa, sb;
    // Targets: the recipes' values or any float in [1, 10^4); references: any float over
    // 2^-40 .. 2^40 (held references far from the data's amax included).
    sa.target = rng() % 2 ? targets[rng() % 4] : std::exp(u(rng) * 9.2f);
    sb.target = rng() % 2 ? targets[rng() % 4] : std::exp(u(rng) * 9.2f);
    sb.two_d = rng() % 2;
    const float ga = std::ldexp(1.0f + u(rng), static_cast<int>(rng() % 81) - 40);
    const float gb = rep % 3 ? std::ldexp(1.0f + u(rng), static_cast<int>(rng() % 81) - 40)
                             : tensor_amax(x.data(), 3 * 70);
    const auto qa = quantize_blocks(x.data(), 3, 70, sa, ga, nullptr);
    const auto qb = quantize_blocks(x.data(), 3, 70, sb, gb, nullptr);
    const float want = ref_alpha(qa, qb);
    ASSERT_EQ(std::bit_cast<uint32_t>(probe_gemm_alpha(qa, qb)), std::bit_cast<uint32_t>(want))
        << "g_a " << ga << " T_a " << sa.target << " g_b " << gb << " T_b " << sb.target;
    differs_from_gd_product += qa.gd * qb.gd != want;
    ++n;
    if (rep % 100 == 0) {  // and α is what the outputs are multiplied by
      const auto ref = ref_probe(qa, qb);
      for (ProbeKernel k : kernels()) EXPECT_TRUE(same_bits(run_probe(qa, qb, k), ref, 3)) << kname(k);
    }
  }
  // fl(gd_a·gd_b) is not the contract's α: it differs in the last bit for a good part of the
  // cases, so this test would catch it.
  std::printf("fl(gd_a*gd_b) != contract alpha in %d of %d cases\n", differs_from_gd_product, n);
  EXPECT_GT(differs_from_gd_product, n / 10);
}

// α as the paper's 8B runs computed it (docs/gemm.md "α as the GPU computed it"): PyTorch's CUDA
// division by a scalar multiplies by its reciprocal. g_a = 1.5811971f (0x3FCA64AB), g_b =
// 7.614871f (0x40F3AD06), T = 448 for both: den = 2688² = 7225344 exactly; the quotient rule
// gives α = 1.66644134e-6 (bits 903850621), the reciprocal rule fl(num · fl(1/den)) one ulp more
// (903850622): worked out in float32 by hand from those bits.
TEST(ProbeGemmAlpha, ReciprocalRuleDiffersFromTheQuotientByAnUlpHere) {
  QuantizedTensor qa, qb;  // only g, the target and the scale rule enter α
  qa.g = std::bit_cast<float>(uint32_t{1070228651});
  qb.g = std::bit_cast<float>(uint32_t{1089711366});
  EXPECT_EQ(std::bit_cast<uint32_t>(probe_gemm_alpha(qa, qb)), 903850621u);
  EXPECT_EQ(std::bit_cast<uint32_t>(probe_gemm_alpha(qa, qb, AlphaRule::Reciprocal)), 903850622u);
  EXPECT_EQ(std::bit_cast<uint32_t>(probe_gemm_alpha(qa, qb, AlphaRule::Quotient)), 903850621u);
  // The GEMM multiplies by the α its options name: one row of 16 ones against the same, with
  // those references, differs between the two rules by exactly that ulp of α.
  std::vector<float> x(16, 1.0f);
  const BlockQuantSpec spec;
  const auto a = quantize_blocks(x.data(), 1, 16, spec, qa.g, nullptr);
  const auto b = quantize_blocks(x.data(), 1, 16, spec, qb.g, nullptr);
  float cq = 0, cr = 0;
  ProbeGemmOptions o;
  probe_gemm(a, b, &cq, o);
  o.alpha = AlphaRule::Reciprocal;
  probe_gemm(a, b, &cr, o);
  const float aq = probe_gemm_alpha(a, b), ar = probe_gemm_alpha(a, b, AlphaRule::Reciprocal);
  EXPECT_EQ(aq, std::bit_cast<float>(903850621u));
  EXPECT_EQ(cq, (cq / aq) * aq);  // the snapped sum times α, for either rule
  EXPECT_EQ(cr, (cq / aq) * ar);
  EXPECT_NE(cq, cr);
}

TEST(ProbeGemmAlpha, MxRulesAndTheZeroReferenceGuardContributeOne) {
  std::vector<float> x(32);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) - 3.0f;
  // MX rules: no tensor scale (ge = gd = 1), g is validated but unused: α = 1.
  BlockQuantSpec mx;
  mx.scale_format = ScaleFormat::UE8M0;
  mx.block = 32;
  for (ScaleRule rule : {ScaleRule::MxTe, ScaleRule::MxOcp}) {
    mx.scale_rule = rule;
    const auto q = quantize_blocks(x.data(), 1, 32, mx, 5.0f, nullptr);
    EXPECT_EQ(probe_gemm_alpha(q, q), 1.0f) << scale_rule_name(rule);
    const auto want = ref_probe(q, q);
    for (ProbeKernel k : kernels()) EXPECT_TRUE(same_bits(run_probe(q, q, k), want, 1)) << kname(k);
  }
  // Tensor-scaled with g = 0: the quantizer's guard sets ge = gd = 1, so that operand's factor
  // is 1; against B with g = 3, T = 448: α = fl(3)/fl(2688) = 1/896 rounded once.
  const BlockQuantSpec ts;
  const auto qz = quantize_blocks(x.data(), 1, 32, ts, 0.0f, nullptr);
  const auto q3 = quantize_blocks(x.data(), 1, 32, ts, 3.0f, nullptr);
  EXPECT_EQ(probe_gemm_alpha(qz, q3), 1.0f / 896.0f);
  EXPECT_EQ(probe_gemm_alpha(q3, qz), 1.0f / 896.0f);
  EXPECT_EQ(probe_gemm_alpha(qz, qz), 1.0f);
  // An MX operand against a tensor-scaled one (g = 7): α = fl(7)/fl(2688) = 1/384 rounded once.
  mx.scale_rule = ScaleRule::MxTe;
  const auto qm = quantize_blocks(x.data(), 1, 32, mx, 0.0f, nullptr);
  const auto q7 = quantize_blocks(x.data(), 1, 32, ts, 7.0f, nullptr);
  EXPECT_EQ(probe_gemm_alpha(qm, q7), 1.0f / 384.0f);
  // FP32 range, as the formula in FP32 gives it: g_a = g_b = 2e19: fl(4e38) = +Inf, so α = +Inf.
  const auto qh = quantize_blocks(x.data(), 1, 32, ts, 2e19f, nullptr);
  EXPECT_EQ(probe_gemm_alpha(qh, qh), INFINITY);
  // g = 1e-37 < T·6/FLT_MAX: the quantizer caps ge at FLT_MAX, α still follows the formula:
  // fl(1e-37·3) / fl(2688·2688) ≈ 4.15e-44, an FP32 subnormal.
  const auto qt = quantize_blocks(x.data(), 1, 32, ts, 1e-37f, nullptr);
  EXPECT_EQ(qt.ge, FLT_MAX);
  const float want_tiny = (1e-37f * 3.0f) / 7225344.0f;
  EXPECT_EQ(probe_gemm_alpha(qt, q3), want_tiny);
  EXPECT_GT(want_tiny, 0.0f);
}

TEST(ProbeGemmHand, TiesInsideAChunk) {
  // Chunk sums exactly halfway between FP32 neighbours (ulp 2 at 2^24):
  // 2^24 + 1 → 2^24 (even);  2^24 + 3 → 2^24 + 4 (even);  2^24 + 1 + 2^-10 → 2^24 + 2.
  const float big = 4096.0f;  // 4·4096 = 2^14; (2^14)·(2^10) = 2^24 with b = 4·256
  EXPECT_EQ(probe1(row_qt({{4, big}, {1, 1}}), row_qt({{4, 256}, {1, 1}})), 16777216.0f);
  EXPECT_EQ(probe1(row_qt({{4, big}, {3, 1}}), row_qt({{4, 256}, {1, 1}})), 16777220.0f);
  EXPECT_EQ(probe1(row_qt({{4, big}, {1, 1}, {0.5f, std::ldexp(1.0f, -4)}}),
                   row_qt({{4, 256}, {1, 1}, {0.5f, std::ldexp(1.0f, -4)}})),
            16777218.0f);
  // Negative: −(2^24 + 3) → −(2^24 + 4).
  EXPECT_EQ(probe1(row_qt({{-4, big}, {-3, 1}}), row_qt({{4, 256}, {1, 1}})), -16777220.0f);
  // A tie broken by a product 2^64 times smaller: 2^24 + 1 + 2^-40 → 2^24 + 2. The exact sum
  // needs 65 bits, so a plain double sum would round it back onto the tie and then to 2^24:
  // scales 2^-20 and 2^-18 next to 4096 and 256 must send this chunk to the exact path.
  EXPECT_EQ(probe1(row_qt({{4, big}, {1, 1}, {0.5f, std::ldexp(1.0f, -20)}}),
                   row_qt({{4, 256}, {1, 1}, {0.5f, std::ldexp(1.0f, -18)}})),
            16777218.0f);
  EXPECT_EQ(probe1(row_qt({{4, big}, {1, 1}, {-0.5f, std::ldexp(1.0f, -20)}}),
                   row_qt({{4, 256}, {1, 1}, {0.5f, std::ldexp(1.0f, -18)}})),
            16777216.0f);
}

TEST(ProbeGemmHand, DoubleIsNotEnoughBeyondTheSpanLimit) {
  // 62 products (6·1920)(6·1.875) = 129600 (scale mantissa 15 both sides) sum to 8035200, in
  // [2^22, 2^23) where the FP32 ulp is 0.5; one product (0.5·16)(0.5·2^-4) = 0.25 puts the sum
  // exactly on a tie, and one product (0.5·2^-10)(0.5·2^-19) = 2^-31 breaks it: 8035200.5.
  // The exact sum spans 2^22 .. 2^-31 (54 bits), one more than double holds: a double sum rounds
  // 2^-31 away (to even), leaving the tie, which goes to even, 8035200. Scale exponents span
  // 20 (A) + 19 (B) = 39 > 32 here, so the chunk must take the exact multi-word path.
  std::vector<std::pair<float, float>> a(62, {6.0f, 1920.0f}), b(62, {6.0f, 1.875f});
  a.push_back({0.5f, 16.0f});
  b.push_back({0.5f, 0.0625f});
  a.push_back({0.5f, std::ldexp(1.0f, -10)});
  b.push_back({0.5f, std::ldexp(1.0f, -19)});
  EXPECT_EQ(probe1(row_qt(a), row_qt(b)), 8035200.5f);
  b.back().first = -0.5f;  // 8035200.25 − 2^-31: below the tie → 8035200
  EXPECT_EQ(probe1(row_qt(a), row_qt(b)), 8035200.0f);
}

TEST(ProbeGemmHand, RtzAccumulationSaturatesAtFltMax) {
  // Block 1; element 0 and element 64 (two chunks) each give (4·2^62)(4·2^61) = 2^127, a finite
  // chunk sum. RTZ(2^127 + 2^127 = 2^128) = FLT_MAX (RNE would give +Inf); the snap keeps it
  // (|x| ≥ 2^13), α = 1. A third chunk (element 128) of −2^127 then gives
  // RTZ(FLT_MAX − 2^127) = 2^128 − 2^104 − 2^127 = 2^127 − 2^104, exact.
  std::vector<std::pair<float, float>> qa(192, {0.0f, 1.0f}), qb(192, {0.0f, 1.0f});
  for (int k : {0, 64, 128}) {
    qa[static_cast<size_t>(k)] = {4, std::ldexp(1.0f, 62)};
    qb[static_cast<size_t>(k)] = {4, std::ldexp(1.0f, 61)};
  }
  auto a2 = qa, b2 = qb;
  a2.resize(128);
  b2.resize(128);
  EXPECT_EQ(probe1(row_qt(a2), row_qt(b2)), FLT_MAX);
  a2[0].first = a2[64].first = -4;
  EXPECT_EQ(probe1(row_qt(a2), row_qt(b2)), -FLT_MAX);
  qa[128].first = -4;
  EXPECT_EQ(probe1(row_qt(qa), row_qt(qb)), std::ldexp(1.0f, 127) - std::ldexp(1.0f, 104));
}

TEST(ProbeGemmHand, CancellationAndZeroChunk) {
  // Chunk 1: 2^20 − 2^20 + 2^-5 exactly (not 0): needs the exact chunk sum.
  // 2^20 = (4·512)(4·64)... use 4·1024 · 4·64 = 2^20.
  const auto a = row_qt({{4, 1024}, {-4, 1024}, {0.5f, 0.125f}});
  const auto b = row_qt({{4, 64}, {4, 64}, {0.5f, 0.125f}});
  // Exact sum = 0.25·2^-6 = 2^-8 → snapped: 2^-8 = 4/1024 exactly.
  EXPECT_EQ(probe1(a, b), std::ldexp(1.0f, -8));
  // An exactly cancelling chunk gives +0.
  const float z = probe1(row_qt({{4, 1024}, {-4, 1024}}), row_qt({{4, 64}, {4, 64}}));
  EXPECT_EQ(z, 0.0f);
  EXPECT_FALSE(std::signbit(z));
}

TEST(ProbeGemmHand, Fp32SubnormalBlockScale) {
  // FP32 subnormal block scales (c_b = 2^127 brings the products into view). Packing must
  // split them as m·2^e from the stored mantissa, not as a normal float's 2^23 + fraction:
  // c_a = 1.5·2^-140 (mantissa 3·2^8) is 12·2^-143 with 3 fraction bits; read as a normal
  // float's fields it would need 15 (probe_gemm would then throw std::logic_error).
  // (6·c_a)(6·c_b) = 54·2^-13 = 6.75·2^-10, snapped to 7/1024.
  const float ca = 1.5f * std::ldexp(1.0f, -140);
  ASSERT_LT(ca, FLT_MIN);
  // 2^-128 (bits 0x00200000, no implicit bit): 36·2^-1 = 18.
  EXPECT_EQ(probe1(row_qt({{6, std::ldexp(1.0f, -128)}}), row_qt({{6, std::ldexp(1.0f, 127)}})),
            18.0f);
  EXPECT_EQ(probe1(row_qt({{6, ca}}), row_qt({{6, std::ldexp(1.0f, 127)}})), 7.0f / 1024.0f);
  // Block 16, 3 rows × 64 of A, UE5M3 scales; row 1 holds the subnormal scale in its block 2:
  // its segments take the one-at-a-time split, rows 0 and 2 the whole-row one. B's scales
  // are 2^127 in block 2 and 2^-8 elsewhere. Every kernel against the reference.
  std::mt19937_64 rng(5);
  std::vector<uint8_t> ca_codes(3 * 64), cb_codes(2 * 64);
  for (auto& c : ca_codes) c = static_cast<uint8_t>(rng() % 16);
  for (auto& c : cb_codes) c = static_cast<uint8_t>(rng() % 16);
  std::vector<float> sa(3 * 4), sb(2 * 4, std::ldexp(1.0f, -8));
  for (auto& c : sa) c = scale_decode(static_cast<uint8_t>(0x60 + rng() % 32), ScaleFormat::UE5M3);
  sa[1 * 4 + 2] = ca;
  sb[0 * 4 + 2] = sb[1 * 4 + 2] = std::ldexp(1.0f, 127);
  const auto a = make_qt(3, 64, 16, false, ca_codes, sa),
             b = make_qt(2, 64, 16, false, cb_codes, sb);
  const auto want = ref_probe(a, b);
  for (ProbeKernel k : kernels()) EXPECT_TRUE(same_bits(run_probe(a, b, k), want, 2)) << kname(k);
}

TEST(ProbeGemm, RandomQuantizedMatchReferenceBitForBit) {
  std::mt19937_64 rng(20260901);
  const ScaleFormat formats[] = {ScaleFormat::UE5M3, ScaleFormat::UE5M3_PTX, ScaleFormat::E4M3,
                                 ScaleFormat::UE8M0};
  const int64_t Ks[] = {1, 63, 64, 65, 200};
  int cases = 0;
  for (int64_t K : Ks)
    for (ScaleFormat f : formats)
      for (int variant = 0; variant < 3; ++variant) {
        const int64_t M = 1 + static_cast<int64_t>(rng() % 11), N = 1 + static_cast<int64_t>(rng() % 37);
        const int block_a = variant == 2 ? 32 : 16;
        const int block_b = variant == 1 ? 8 : (variant == 2 ? 32 : 16);
        const bool b2d = variant != 0;
        const int dist = static_cast<int>(rng() % 4);
        // g_factor < 1: a held reference smaller than the current amax (scales saturate).
        const float ga = variant == 1 ? 0.01f : 1.0f;
        const auto xa = random_matrix(rng, M, K, dist);
        const auto xb = random_matrix(rng, N, K, static_cast<int>(rng() % 4));
        const auto qa = quantize(xa, M, K, f, block_a, false, ga,
                                 variant == 2 ? Rounding::SR8 : Rounding::RNE);
        const auto qb = quantize(xb, N, K, f, block_b, b2d, 1.0f);
        const auto want = ref_probe(qa, qb);
        for (ProbeKernel k : kernels()) {
          EXPECT_TRUE(same_bits(run_probe(qa, qb, k), want, N))
              << kname(k) << " K=" << K << " format " << scale_format_name(f) << " variant "
              << variant << " M=" << M << " N=" << N;
        }
        ++cases;
      }
  EXPECT_EQ(cases, 60);
}

/// The packed-operand overload (QTensor, as fp4::nn::Linear's probe-matched mode feeds it from
/// quantize_pack_fast) equals the QuantizedTensor one bit for bit: every packable scale format,
/// the MX rule, odd element counts (a row starting mid-byte), 2-D tiles, SR elements.
TEST(ProbeGemm, PackedOperandsMatchTheUnpackedBitForBit) {
  std::mt19937_64 rng(20261204);
  const ScaleFormat formats[] = {ScaleFormat::UE5M3, ScaleFormat::UE5M3_PTX, ScaleFormat::E4M3};
  int cases = 0;
  for (int64_t K : {int64_t{33}, int64_t{64}, int64_t{130}})
    for (ScaleFormat f : formats)
      for (int variant = 0; variant < 2; ++variant) {
        const int64_t M = 1 + static_cast<int64_t>(rng() % 9) * 2 + 1, N = 3 + static_cast<int64_t>(rng() % 20);
        const auto xa = random_matrix(rng, M, K, static_cast<int>(rng() % 4));
        const auto xb = random_matrix(rng, N, K, static_cast<int>(rng() % 4));
        const auto qa = quantize(xa, M, K, f, 16, false, variant ? 0.05f : 1.0f,
                                 variant ? Rounding::SR8 : Rounding::RNE);
        const auto qb = quantize(xb, N, K, f, 16, variant == 1, 1.0f);
        std::vector<float> want(static_cast<size_t>(M * N)), got(want.size(), -1.0f);
        probe_gemm(qa, qb, want.data());
        probe_gemm(pack(qa), pack(qb), got.data());
        EXPECT_TRUE(same_bits(got, want, N)) << "K=" << K << " " << scale_format_name(f) << " variant " << variant;
        ++cases;
      }
  // MXFP4 (UE8M0 under mx-te, no tensor scale) and a non-default accumulator.
  const auto xa = random_matrix(rng, 7, 96, 1), xb = random_matrix(rng, 5, 96, 2);
  BlockQuantSpec mx;
  mx.scale_format = ScaleFormat::UE8M0;
  mx.scale_rule = ScaleRule::MxTe;
  mx.block = 32;
  const auto qa = quantize_blocks(xa.data(), 7, 96, mx, 0.0f, nullptr);
  const auto qb = quantize_blocks(xb.data(), 5, 96, mx, 0.0f, nullptr);
  ProbeGemmOptions opt;
  opt.accumulator.chunk = 32;
  opt.accumulator.snap = 0;
  std::vector<float> want(35), got(35);
  probe_gemm(qa, qb, want.data(), opt);
  probe_gemm(pack(qa), pack(qb), got.data(), opt);
  EXPECT_TRUE(same_bits(got, want, 5)) << "mx-te";
  EXPECT_EQ(cases, 18);
  // Errors name the operand: a QTensor whose decode scale does not follow from g and T, and one
  // whose sizes do not match its layout.
  QTensor pa = pack(quantize(xa, 7, 96, ScaleFormat::UE5M3, 16, false, 1.0f)), pb = pack(qb);
  pa.decode_scale *= 2.0f;
  EXPECT_THROW(
      {
        try {
          probe_gemm(pa, pa, got.data());
        } catch (const std::invalid_argument& e) {
          EXPECT_NE(std::string(e.what()).find("operand A"), std::string::npos) << e.what();
          EXPECT_NE(std::string(e.what()).find("do not follow"), std::string::npos) << e.what();
          throw;
        }
      },
      std::invalid_argument);
  pb.packed.resize(3);
  EXPECT_THROW(
      {
        try {
          probe_gemm(pack(qa), pb, got.data());
        } catch (const std::invalid_argument& e) {
          EXPECT_NE(std::string(e.what()).find("operand B: unpack"), std::string::npos) << e.what();
          throw;
        }
      },
      std::invalid_argument);
}

/// Random codes and scales drawn directly, to reach what the quantizer rarely produces.
QuantizedTensor random_qt(std::mt19937_64& rng, int64_t rows, int64_t cols, int block, bool two_d,
                          int scale_kind, float gd = 1.0f) {
  const int64_t bc = (cols + block - 1) / block, br = two_d ? (rows + block - 1) / block : rows;
  std::vector<uint8_t> codes(static_cast<size_t>(rows * cols));
  for (auto& c : codes) c = static_cast<uint8_t>(rng() % 16);
  // zero rows of blocks now and then
  for (int64_t r = 0; r < rows; ++r)
    if (rng() % 5 == 0) {
      const int64_t b0 = static_cast<int64_t>(rng() % static_cast<uint64_t>(bc)) * block;
      for (int64_t k = b0; k < std::min(cols, b0 + block); ++k) codes[static_cast<size_t>(r * cols + k)] = rng() % 2 ? 0 : 8;
    }
  std::vector<float> scales(static_cast<size_t>(br * bc));
  for (auto& s : scales) {
    switch (scale_kind) {
      case 0:  // the whole UE5M3 grid, subnormals included (code 0 = zero is never a scale)
        s = scale_decode(static_cast<uint8_t>(1 + rng() % 0xF7), ScaleFormat::UE5M3);
        break;
      case 1:  // the whole UE8M0 range 2^-127..2^127: overflow, underflow, huge spans
        s = scale_decode(static_cast<uint8_t>(rng() % 0xFF), ScaleFormat::UE8M0);
        break;
      case 2:  // E4M3 near its maximum
        s = scale_decode(static_cast<uint8_t>(0x70 + rng() % 15), ScaleFormat::E4M3);
        break;
      case 3:  // 8 significant bits (a spelled format like ue3m7): wider mantissas, smaller span limit
        s = std::ldexp(static_cast<float>(128 + rng() % 128), static_cast<int>(rng() % 30) - 22);
        break;
      default:  // a narrow band of UE5M3 exponents: the fast path everywhere
        s = scale_decode(static_cast<uint8_t>(0x78 + rng() % 24), ScaleFormat::UE5M3);
        break;
    }
  }
  return make_qt(rows, cols, block, two_d, std::move(codes), std::move(scales), gd);
}

/// Every accumulator of the contract's knobs (chunk 16/32/64/128, RTZ/RNE additions, snap none,
/// 1/256, 1/1024, 1/4096) against the reference with the same knobs, on random quantized operands
/// of several formats and K (ragged chunks included). Auto and Portable must match; a SIMD kernel
/// asked for by name refuses any accumulator but the default.
TEST(ProbeGemm, EveryAccumulatorMatchesTheReference) {
  std::mt19937_64 rng(24);
  // Operand pairs: quantizer output of three formats (sums mostly exact in FP32), block scales
  // over UE5M3's whole range (inexact chunk sums: the chunk and the rounding matter), and every
  // block scale 2^-7 (sums with bits below 1/1024: the snap matters).
  std::vector<std::pair<QuantizedTensor, QuantizedTensor>> pairs;
  std::vector<std::string> names;
  for (int64_t K : {40, 129, 300}) {
    for (ScaleFormat f : {ScaleFormat::UE5M3, ScaleFormat::E4M3, ScaleFormat::UE8M0}) {
      const int64_t M = 1 + static_cast<int64_t>(rng() % 9), N = 1 + static_cast<int64_t>(rng() % 21);
      const auto xa = random_matrix(rng, M, K, static_cast<int>(rng() % 4));
      const auto xb = random_matrix(rng, N, K, static_cast<int>(rng() % 4));
      pairs.emplace_back(quantize(xa, M, K, f, 16, false, 1.0f, Rounding::SR8),
                         quantize(xb, N, K, f, 16, true, 1.0f));
      names.push_back(std::string("quantized ") + scale_format_name(f) + " K=" + std::to_string(K));
    }
    pairs.emplace_back(random_qt(rng, 5, K, 16, false, 0), random_qt(rng, 9, K, 16, true, 0));
    names.push_back("UE5M3 range K=" + std::to_string(K));
    const int64_t bc = (K + 15) / 16;
    std::vector<uint8_t> codes_a(static_cast<size_t>(4 * K)), codes_b(static_cast<size_t>(8 * K));
    for (auto& c : codes_a) c = static_cast<uint8_t>(rng() % 16);
    for (auto& c : codes_b) c = static_cast<uint8_t>(rng() % 16);
    pairs.emplace_back(make_qt(4, K, 16, false, codes_a, std::vector<float>(static_cast<size_t>(4 * bc), 1.0f / 128)),
                       make_qt(8, K, 16, false, codes_b, std::vector<float>(static_cast<size_t>(8 * bc), 1.0f / 128)));
    names.push_back("scales 2^-7 K=" + std::to_string(K));
  }
  int cases = 0;
  for (size_t t = 0; t < pairs.size(); ++t) {
    const QuantizedTensor& qa = pairs[t].first;
    const QuantizedTensor& qb = pairs[t].second;
    const int64_t M = qa.rows, N = qb.rows;
    for (int chunk : {16, 32, 64, 128})
      for (bool rtz : {true, false})
        for (int d : {0, 256, 1024, 4096}) {
          Accumulator acc;
          acc.chunk = chunk;
          acc.rounding = rtz ? AccumRounding::Rtz : AccumRounding::Rne;
          acc.snap = d;
          const auto want = ref_probe(qa, qb, chunk, rtz, d);
          for (ProbeKernel k : {ProbeKernel::Auto, ProbeKernel::Portable}) {
            std::vector<float> c(static_cast<size_t>(M * N), -1.0f);
            probe_gemm(qa, qb, c.data(), ProbeGemmOptions{k, acc});
            EXPECT_TRUE(same_bits(c, want, N)) << kname(k) << " " << acc.describe() << ", " << names[t];
          }
          if (!acc.is_default()) {
            std::vector<float> c(static_cast<size_t>(M * N));
            for (ProbeKernel k : {ProbeKernel::Avx512Vnni, ProbeKernel::Avx2, ProbeKernel::Avx512Emulated})
              EXPECT_THROW(probe_gemm(qa, qb, c.data(), ProbeGemmOptions{k, acc}), std::invalid_argument)
                  << kname(k) << " " << acc.describe();
          }
          ++cases;
        }
  }
  EXPECT_EQ(cases, 15 * 32);
  // The operand pairs tell the knobs apart (else the loop above could not fail for one). Five
  // pairs per K, in the order built: K = 300's UE5M3-range pair is 13, its 2^-7 pair 14.
  const auto& [ra, rb] = pairs[13];
  const auto& [va, vb] = pairs[14];
  EXPECT_NE(ref_probe(ra, rb, 64, true, 0), ref_probe(ra, rb, 64, false, 0));
  EXPECT_NE(ref_probe(ra, rb, 16, true, 0), ref_probe(ra, rb, 128, true, 0));
  EXPECT_NE(ref_probe(va, vb, 64, true, 0), ref_probe(va, vb, 64, true, 1024));
  EXPECT_NE(ref_probe(va, vb, 64, true, 1024), ref_probe(va, vb, 64, true, 256));
}

TEST(ProbeGemm, AdversarialScalesMatchReferenceBitForBit) {
  std::mt19937_64 rng(7);
  int nonfinite = 0;
  for (int scale_kind = 0; scale_kind < 5; ++scale_kind)
    for (int64_t K : {1, 63, 64, 65, 130})
      for (int rep = 0; rep < 6; ++rep) {
        const int64_t M = 1 + static_cast<int64_t>(rng() % 9), N = 1 + static_cast<int64_t>(rng() % 40);
        const bool odd = rep % 2 == 1;
        const int block = odd ? static_cast<int>(1 + rng() % 40) : 16;  // odd blocks too
        const auto a = random_qt(rng, M, K, block, false, scale_kind, 0.5f);
        const auto b = random_qt(rng, N, K, odd ? block + 3 : 16, odd, scale_kind, 0.25f);
        const auto want = ref_probe(a, b);
        for (float v : want) nonfinite += !std::isfinite(v);
        for (ProbeKernel k : kernels()) {
          EXPECT_TRUE(same_bits(run_probe(a, b, k), want, N))
              << kname(k) << " scale kind " << scale_kind << " K=" << K << " block " << block;
        }
      }
  EXPECT_GT(nonfinite, 0) << "the UE8M0 cases should reach FP32 overflow";
}

TEST(ProbeGemm, RandomNearTiesMatchReferenceBitForBit) {
  // Each row starts with a product of 2^24 (4·4096 times 4·256) followed by small products
  // (scale 1 both sides, so multiples of 1/4): chunk sums land on the FP32 grid of spacing 2
  // and exactly halfway between neighbours whenever the small part is an odd integer; a second
  // chunk of tiny products (scale 2^-12) then exercises RTZ at every sign.
  std::mt19937_64 rng(17);
  int ties = 0;
  for (const int64_t K : {64, 100}) {
    const int64_t M = 24, N = 24;
    std::vector<uint8_t> ca(static_cast<size_t>(M * K)), cb(static_cast<size_t>(N * K));
    std::vector<float> sa(static_cast<size_t>(M * K), 1.0f), sb(static_cast<size_t>(N * K), 1.0f);
    for (auto& c : ca) c = static_cast<uint8_t>(rng() % 16);
    for (auto& c : cb) c = static_cast<uint8_t>(rng() % 6);  // 0 .. 3, positive
    for (int64_t i = 0; i < M; ++i) {
      ca[static_cast<size_t>(i * K)] = i % 2 ? 6 : 14;  // ±4
      sa[static_cast<size_t>(i * K)] = 4096.0f;
      for (int64_t k = 64; k < K; ++k) sa[static_cast<size_t>(i * K + k)] = std::ldexp(1.0f, -12);
    }
    for (int64_t j = 0; j < N; ++j) {
      cb[static_cast<size_t>(j * K)] = 6;
      sb[static_cast<size_t>(j * K)] = 256.0f;
    }
    const auto a = make_qt(M, K, 1, false, ca, sa), b = make_qt(N, K, 1, false, cb, sb);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double small = 0;  // exact: multiples of 1/4 below 2^12
        for (int64_t k = 1; k < std::min<int64_t>(K, 64); ++k)
          small += double(e2m1_decode(ca[size_t(i * K + k)])) * e2m1_decode(cb[size_t(j * K + k)]);
        ties += std::fabs(std::fmod(small, 2.0)) == 1.0;
      }
    const auto want = ref_probe(a, b);
    for (ProbeKernel k : kernels()) EXPECT_TRUE(same_bits(run_probe(a, b, k), want, N)) << kname(k) << " K=" << K;
  }
  EXPECT_GT(ties, 20) << "the construction should produce exact ties";
}

TEST(ProbeGemm, MaxMagnitudesAndZeroBlocks) {
  // Every element ±6 with the largest UE5M3 scale 61440: each product is (6·61440)^2
  // ≈ 1.36e11 (27 significant bits above 2^10, so chunk sums need their one FP32 rounding),
  // a chunk of 64 up to ≈ 8.7e12.
  for (const int64_t K : {64, 65, 200}) {
    std::vector<uint8_t> ca(static_cast<size_t>(3 * K)), cb(static_cast<size_t>(2 * K));
    for (size_t i = 0; i < ca.size(); ++i) ca[i] = i < size_t(K) ? 7 : ((i % 3) ? 7 : 15);  // row 0 all +6
    for (size_t i = 0; i < cb.size(); ++i) cb[i] = 7;
    const int64_t bc = (K + 15) / 16;
    auto a = make_qt(3, K, 16, false, ca, std::vector<float>(static_cast<size_t>(3 * bc), 61440.0f));
    auto b = make_qt(2, K, 16, false, cb, std::vector<float>(static_cast<size_t>(2 * bc), 61440.0f));
    // zero block in row 1 of b: its scale is the guard value 1
    for (int64_t k = 16; k < 32 && k < K; ++k) b.codes[static_cast<size_t>(K + k)] = 0;
    b.scales[static_cast<size_t>(bc + 1)] = 1.0f;
    const auto want = ref_probe(a, b);
    for (ProbeKernel k : kernels()) EXPECT_TRUE(same_bits(run_probe(a, b, k), want, 2)) << kname(k) << " K=" << K;
  }
}

TEST(ProbeGemm, ThreadCountDoesNotChangeBits) {
  std::mt19937_64 rng(3);
  const int64_t M = 67, N = 45, K = 300;
  const auto a = random_qt(rng, M, K, 16, false, 0);
  const auto b = random_qt(rng, N, K, 16, true, 0);
  const int saved = omp_get_max_threads();
  for (ProbeKernel k : kernels()) {
    omp_set_num_threads(1);
    const auto one = run_probe(a, b, k);
    omp_set_num_threads(2);
    const auto two = run_probe(a, b, k);
    omp_set_num_threads(3);
    const auto three = run_probe(a, b, k);
    EXPECT_TRUE(same_bits(one, two, N)) << kname(k);
    EXPECT_TRUE(same_bits(one, three, N)) << kname(k);
  }
  omp_set_num_threads(saved);
  // And the SIMD kernels agree with the portable one on larger cases (the reference is slow),
  // with many row groups and panels packed on demand by whichever thread needs them first.
  const auto a2 = random_qt(rng, 130, 1000, 16, false, 0);
  const auto b2 = random_qt(rng, 97, 1000, 16, true, 1);
  const auto a3 = random_qt(rng, 700, 128, 16, false, 4);
  const auto b3 = random_qt(rng, 333, 128, 16, true, 4);
  const auto ref2 = run_probe(a2, b2, ProbeKernel::Portable);
  omp_set_num_threads(1);
  const auto ref3 = run_probe(a3, b3, ProbeKernel::Portable);
  for (ProbeKernel k : kernels()) {
    if (k == ProbeKernel::Portable) continue;
    omp_set_num_threads(saved);
    EXPECT_TRUE(same_bits(run_probe(a2, b2, k), ref2, 97)) << kname(k);
    for (int t : {1, 2, 4}) {
      omp_set_num_threads(t);
      EXPECT_TRUE(same_bits(run_probe(a3, b3, k), ref3, 333)) << kname(k) << ", " << t << " threads";
      EXPECT_TRUE(same_bits(run_probe(a3, b3, ProbeKernel::Portable), ref3, 333)) << t << " threads";
    }
  }
  omp_set_num_threads(saved);
}

// The SIMD kernels' own hazards (src/gemm/probe_gemm_avx2.cpp, the AVX-512 kernel): integer
// dot-product bounds, panel padding with stale bytes, ragged tiles.
TEST(ProbeGemmKernels, ExtremeDotProductsInFullChunkSegments) {
  // Blocks of 64 (and longer) on both sides: one segment per 64-chunk, so the int16 pair sums
  // of the AVX2 kernel add up over 16 groups of 4 k, the most the design allows. Every element
  // ±6 (n = ±12, B's biased byte 0 or 24): dots of ±144·64 = ±9216 and their mixtures.
  std::mt19937_64 rng(64);
  for (const int block : {64, 100, 128}) {
    const int64_t M = 9, N = 35, K = 256;
    std::vector<uint8_t> ca(static_cast<size_t>(M * K)), cb(static_cast<size_t>(N * K));
    for (int64_t i = 0; i < M; ++i)
      for (int64_t k = 0; k < K; ++k)  // rows: all +6, all −6, then random ±6 / 0
        ca[size_t(i * K + k)] = i == 0 ? 7 : i == 1 ? 15 : static_cast<uint8_t>(rng() % 3 == 0 ? 0 : (rng() % 2 ? 7 : 15));
    for (int64_t j = 0; j < N; ++j)
      for (int64_t k = 0; k < K; ++k)
        cb[size_t(j * K + k)] = j == 0 ? 7 : j == 1 ? 15 : static_cast<uint8_t>(rng() % 2 ? 7 : 15);
    const int64_t bc = (K + block - 1) / block;
    std::vector<float> sa(static_cast<size_t>(M * bc)), sb(static_cast<size_t>(N * bc));
    for (auto& v : sa) v = scale_decode(static_cast<uint8_t>(0x70 + rng() % 32), ScaleFormat::UE5M3);
    for (auto& v : sb) v = scale_decode(static_cast<uint8_t>(0x70 + rng() % 32), ScaleFormat::UE5M3);
    const auto a = make_qt(M, K, block, false, ca, sa), b = make_qt(N, K, block, false, cb, sb);
    const auto want = ref_probe(a, b);
    for (ProbeKernel k : kernels()) EXPECT_TRUE(same_bits(run_probe(a, b, k), want, N)) << kname(k) << " block " << block;
  }
}

TEST(ProbeGemmKernels, IntegerChunkPathAtItsLimits) {
  // The SIMD kernels sum a chunk in int32 as Σ D·f_a·f_b with f = m·2^(e − emin) when
  // span_A + span_B ≤ 15 − bitlength(mmax_a·mmax_b) (7 for 4-bit scale mantissas) and
  // |emin| ≤ 62 on both sides, and in double otherwise (src/gemm/probe_gemm.cpp, "Integer
  // chunk sums"). Here: every element ±6 (|D| at its maximum), scale mantissas 15 (or 31, a
  // 5-bit spelled scale, limit 5), and per 64-chunk exponents e0 + {0, span, ...} on each side,
  // so that f_a·f_b and the int32 chunk sum reach their bounds just inside and just outside
  // the limit; base exponents at and beyond the ±62 band (chunk sums near 2^-126 included).
  struct Case {
    int span_a, span_b, e_a, e_b, m;
  };
  const Case cases[] = {{0, 7, 0, 0, 15},    {3, 4, 0, 0, 15},    {4, 4, 0, 0, 15},   {7, 0, 2, -3, 15},
                        {7, 1, 0, 0, 15},    {0, 8, 0, 0, 15},    {5, 0, 0, 0, 31},   {3, 3, 0, 0, 31},
                        {0, 0, 62, -62, 15}, {0, 0, 63, -62, 15}, {1, 1, -62, -62, 15}, {0, 0, -63, -62, 15},
                        {2, 2, -62, -63, 15}, {6, 1, 62, -66, 15}};
  std::mt19937_64 rng(1515);
  for (const Case& cs : cases) {
    const int64_t M = 7, N = 37, K = 192, bc = K / 16;  // 3 chunks of 4 blocks
    auto scales = [&](int64_t rows, int span, int e0) {
      std::vector<float> sc(static_cast<size_t>(rows * bc));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t b = 0; b < bc; ++b) {
          // Block b % 4 of each chunk: offsets 0, span, then random in [0, span]; the row's
          // chunks shifted by r % 3 so that rows of one tile differ.
          const int64_t q = b % 4;
          const int off = q == 0 ? 0 : q == 1 ? span : static_cast<int>(rng() % (span + 1));
          sc[static_cast<size_t>(r * bc + b)] = std::ldexp(static_cast<float>(cs.m), e0 + off + static_cast<int>(r % 3));
        }
      return sc;
    };
    auto codes = [&](int64_t rows) {
      std::vector<uint8_t> c(static_cast<size_t>(rows * K));
      for (auto& v : c) v = rng() % 8 == 0 ? static_cast<uint8_t>(rng() % 16) : (rng() % 2 ? 7 : 15);
      return c;
    };
    const auto a = make_qt(M, K, 16, false, codes(M), scales(M, cs.span_a, cs.e_a));
    const auto b = make_qt(N, K, 16, false, codes(N), scales(N, cs.span_b, cs.e_b));
    const auto want = ref_probe(a, b);
    for (ProbeKernel k : kernels())
      EXPECT_TRUE(same_bits(run_probe(a, b, k), want, N))
          << kname(k) << " spans " << cs.span_a << "+" << cs.span_b << ", exponents " << cs.e_a
          << ", " << cs.e_b << ", mantissa " << cs.m;
  }
}

/// A random operand for the integer-path sweep below: codes mostly ±6 (|D| near its maximum)
/// or uniform; block scales m·2^(base + offset) with offsets in [0, span] (the extremes often),
/// rows shifted by r % 3 when `row_shift`, mantissas of `frac_bits` fraction bits (0: powers
/// of two, as UE8M0), and about zero_pct% all-zero blocks (scale 1, the zero guard, or random).
QuantizedTensor span_operand(std::mt19937_64& rng, int64_t rows, int64_t K, int block, bool two_d,
                             int base, int span, int frac_bits, int zero_pct, bool row_shift) {
  const int64_t bc = (K + block - 1) / block, br = two_d ? (rows + block - 1) / block : rows;
  std::vector<uint8_t> codes(static_cast<size_t>(rows * K));
  const bool uniform = rng() % 3 == 0;
  for (auto& c : codes) c = uniform ? static_cast<uint8_t>(rng() % 16) : (rng() % 2 ? 7 : 15);
  std::vector<float> sc(static_cast<size_t>(br * bc));
  for (int64_t r = 0; r < br; ++r)
    for (int64_t b = 0; b < bc; ++b) {
      int off = static_cast<int>(rng() % (span + 1));
      if (rng() % 4 == 0) off = rng() % 2 ? span : 0;
      int m = (1 << frac_bits) + static_cast<int>(rng() % (1u << frac_bits));
      if (rng() % 3 == 0) m = (2 << frac_bits) - 1;  // the largest mantissa
      const int e = base + off + (row_shift ? static_cast<int>(r % 3) : 0);
      float& c = sc[static_cast<size_t>(r * bc + b)];
      c = std::ldexp(static_cast<float>(m), e);
      if (!(c > 0.0f) || !std::isfinite(c)) c = 1.0f;
      if (static_cast<int>(rng() % 100) < zero_pct) {
        if (rng() % 2) c = 1.0f;
        const int64_t k0 = b * block, k1 = std::min<int64_t>(K, k0 + block);
        const int64_t r0 = two_d ? r * block : r, r1 = two_d ? std::min<int64_t>(rows, r0 + block) : r + 1;
        for (int64_t i = r0; i < r1; ++i)
          for (int64_t k = k0; k < k1; ++k) codes[static_cast<size_t>(i * K + k)] = rng() % 2 ? 0 : 8;
      }
    }
  return make_qt(rows, K, block, two_d, std::move(codes), std::move(sc));
}

TEST(ProbeGemmKernels, IntegerChunkPathRandomSpansMatchPortable) {
  // Random shapes, blocks (1, 7, 16, 24, 32, 64; A and B apart), 1-D and 2-D operands, spans
  // 0..9 per side, base exponents around the ±62 band and far beyond it, 3-bit, 4..7-bit and
  // power-of-two mantissas, zero blocks, 1..3 threads: every SIMD kernel against the portable
  // one, and the portable one against the independent reference on the small cases.
  std::mt19937_64 rng(777);
  const int blocks[] = {1, 7, 16, 24, 32, 64, 16, 16};
  const int bases[] = {0, -3, 5, 58, 59, 60, 61, 62, 63, 65, -62, -63, -64, -65, -66, 30, -30, 97, 110, -123};
  const int saved = omp_get_max_threads();
  int refchecks = 0;
  for (int it = 0; it < 300; ++it) {
    omp_set_num_threads(1 + static_cast<int>(rng() % 3));
    const int64_t M = 1 + static_cast<int64_t>(rng() % 9), N = 1 + static_cast<int64_t>(rng() % 70);
    const int64_t K = rng() % 4 == 0 ? 64 * (1 + static_cast<int64_t>(rng() % 4)) : 1 + static_cast<int64_t>(rng() % 300);
    const int ba = blocks[rng() % 8], bb = rng() % 2 ? ba : blocks[rng() % 8];
    const int span_a = static_cast<int>(rng() % 10), span_b = static_cast<int>(rng() % 10);
    const int ea = bases[rng() % std::size(bases)];
    const int eb = rng() % 3 == 0 ? -ea + static_cast<int>(rng() % 7) - 3 : bases[rng() % std::size(bases)];
    const int sel = static_cast<int>(rng() % 8);
    const int fa = sel < 5 ? 3 : sel == 5 ? 0 : 4 + static_cast<int>(rng() % 4);
    const int fb = rng() % 4 == 0 ? (rng() % 2 ? 0 : 4 + static_cast<int>(rng() % 4)) : 3;
    const auto a = span_operand(rng, M, K, ba, rng() % 4 == 0, ea, span_a, fa, static_cast<int>(rng() % 30), rng() % 2);
    const auto b = span_operand(rng, N, K, bb, rng() % 4 == 0, eb, span_b, fb, static_cast<int>(rng() % 30), rng() % 2);
    const auto want = run_probe(a, b, ProbeKernel::Portable);
    if (M * N * K < 6000 && it % 3 == 0) {
      ++refchecks;
      EXPECT_TRUE(same_bits(want, ref_probe(a, b), N)) << "portable, iteration " << it;
    }
    for (ProbeKernel k : kernels()) {
      if (k == ProbeKernel::Portable) continue;
      EXPECT_TRUE(same_bits(run_probe(a, b, k), want, N))
          << kname(k) << ", iteration " << it << ": M=" << M << " N=" << N << " K=" << K << " blocks " << ba
          << "/" << bb << " spans " << span_a << "/" << span_b << " exponents " << ea << "/" << eb
          << " fraction bits " << fa << "/" << fb;
    }
  }
  omp_set_num_threads(saved);
  EXPECT_GT(refchecks, 30);
}

TEST(ProbeGemmKernels, StalePanelBytesAndRaggedShapes) {
  // A larger product first leaves random bytes in the calling thread's packing buffers; the
  // padding columns of the next, ragged products then hold stale bytes (their scale is 0).
  std::mt19937_64 rng(31);
  for (ProbeKernel k : kernels()) {
    const auto big_a = random_qt(rng, 40, 300, 16, false, 4), big_b = random_qt(rng, 200, 300, 16, true, 4);
    (void)run_probe(big_a, big_b, k);
    for (const int64_t M : {1, 3, 5, 7}) {
      const int64_t N = 1 + static_cast<int64_t>(rng() % 47), K = 1 + static_cast<int64_t>(rng() % 300);
      const auto a = random_qt(rng, M, K, 16, false, static_cast<int>(rng() % 5));
      const auto b = random_qt(rng, N, K, 32, rng() % 2, static_cast<int>(rng() % 5));
      EXPECT_TRUE(same_bits(run_probe(a, b, k), ref_probe(a, b), N)) << kname(k) << " M=" << M << " N=" << N << " K=" << K;
    }
  }
}

TEST(ProbeGemmKernels, LargerRaggedShapesAgreeWithPortable) {
  // Shapes with every remainder (M % 4, N % 16 and % 32, K % 4, K % 64), mixed block lengths,
  // every scale kind (overflow and the exact path included), against the portable kernel.
  std::mt19937_64 rng(77);
  for (int rep = 0; rep < 6; ++rep) {
    const int64_t M = 61 + static_cast<int64_t>(rng() % 70), N = 33 + static_cast<int64_t>(rng() % 70);
    const int64_t K = 100 + static_cast<int64_t>(rng() % 700);
    const int kind = rep % 5;
    const auto a = random_qt(rng, M, K, rep % 2 ? 16 : 24, false, kind, 0.5f);
    const auto b = random_qt(rng, N, K, rep % 3 ? 16 : 40, rep % 2 == 0, kind, 2.0f);
    const auto want = run_probe(a, b, ProbeKernel::Portable);
    for (ProbeKernel k : kernels())
      EXPECT_TRUE(same_bits(run_probe(a, b, k), want, N)) << kname(k) << " M=" << M << " N=" << N << " K=" << K;
  }
}

TEST(ProbeGemm, WithinRoundingBoundOfDecodedGemm) {
  // |probe − decoded| ≤ α·(2^-11 + 2^-24·(K + 2·n_chunks + 10)·S), S = Σ_k |q_a c_a q_b c_b|
  // (docs/gemm.md "Relation to the decoded mode"): snap, chunk and RTZ roundings on one side,
  // dequantization and FP32 summation on the other.
  std::mt19937_64 rng(5);
  double worst = 0.0;
  for (const int64_t K : {64, 200, 1024}) {
    const int64_t M = 33, N = 29;
    const auto xa = random_matrix(rng, M, K, 0), xb = random_matrix(rng, N, K, 1);
    const auto qa = quantize(xa, M, K, ScaleFormat::UE5M3, 16, false, 1.0f);
    const auto qb = quantize(xb, N, K, ScaleFormat::UE5M3, 16, true, 1.0f);
    std::vector<float> p(static_cast<size_t>(M * N)), d(static_cast<size_t>(M * N));
    probe_gemm(qa, qb, p.data());
    decoded_gemm(qa, qb, d.data());
    const double alpha = double(qa.gd) * qb.gd, nc = double((K + 63) / 64);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double S = 0;
        for (int64_t k = 0; k < K; ++k)
          S += std::fabs(double(e2m1_decode(qa.codes[size_t(i * K + k)])) * scale_at(qa, i, k) *
                         e2m1_decode(qb.codes[size_t(j * K + k)]) * scale_at(qb, j, k));
        const double bound = alpha * (std::ldexp(1.0, -11) + std::ldexp(1.0, -24) * (K + 2 * nc + 10) * S);
        const double diff = std::fabs(double(p[size_t(i * N + j)]) - d[size_t(i * N + j)]);
        EXPECT_LE(diff, bound) << "C[" << i << "," << j << "] K=" << K;
        worst = std::max(worst, bound > 0 ? diff / bound : 0.0);
      }
  }
  std::printf("worst |probe - decoded| / bound = %.3g\n", worst);
}

TEST(ProbeGemm, ShapesAndEdgeCases) {
  std::mt19937_64 rng(9);
  // K = 0: every output is +0·α = 0.
  auto a0 = make_qt(2, 0, 16, false, {}, {}), b0 = make_qt(3, 0, 16, false, {}, {});
  for (ProbeKernel k : kernels()) {
    const auto c = run_probe(a0, b0, k);
    for (float v : c) EXPECT_EQ(std::bit_cast<uint32_t>(v), 0u);
  }
  // M = 0 or N = 0: nothing written, no throw.
  auto a = random_qt(rng, 0, 20, 16, false, 0), b = random_qt(rng, 3, 20, 16, false, 0);
  float sentinel = 7.0f;
  EXPECT_NO_THROW(probe_gemm(a, b, &sentinel));
  EXPECT_EQ(sentinel, 7.0f);
  // 2-D tiles for A as well, blocks of different lengths for A and B.
  const auto a2 = random_qt(rng, 20, 77, 8, true, 4), b2 = random_qt(rng, 19, 77, 32, true, 4);
  const auto want = ref_probe(a2, b2);
  for (ProbeKernel k : kernels()) EXPECT_TRUE(same_bits(run_probe(a2, b2, k), want, 19)) << kname(k);
}

TEST(ProbeGemm, InvalidInputsThrow) {
  std::mt19937_64 rng(1);
  const auto a = random_qt(rng, 2, 20, 16, false, 0);
  const auto b = random_qt(rng, 3, 21, 16, false, 0);
  std::vector<float> c(6);
  EXPECT_THROW(probe_gemm(a, b, c.data()), std::invalid_argument);  // K mismatch
  EXPECT_THROW(decoded_gemm(a, b, c.data()), std::invalid_argument);
  auto bad = random_qt(rng, 3, 20, 16, false, 0);
  bad.codes[5] = 16;
  auto wide = random_qt(rng, 3, 200, 16, false, 0), wide_a = random_qt(rng, 2, 200, 16, false, 0);
  wide.codes[3 * 200 - 190] = 200;  // in a 64-byte stretch of the last row
  EXPECT_THROW(probe_gemm(wide_a, wide, c.data()), std::invalid_argument);
  for (ProbeKernel k : kernels())
    EXPECT_THROW(probe_gemm(a, bad, c.data(), ProbeGemmOptions{k, {}}), std::invalid_argument);
  bad = random_qt(rng, 3, 20, 16, false, 0);
  bad.scales[1] = 1.0f + std::ldexp(1.0f, -10);  // 11 significant bits
  EXPECT_THROW(probe_gemm(a, bad, c.data()), std::invalid_argument);
  bad.scales[1] = 0.0f;
  EXPECT_THROW(probe_gemm(a, bad, c.data()), std::invalid_argument);
  bad.scales[1] = INFINITY;
  EXPECT_THROW(probe_gemm(a, bad, c.data()), std::invalid_argument);
  bad = random_qt(rng, 3, 20, 16, false, 0);
  bad.scales.pop_back();
  EXPECT_THROW(probe_gemm(a, bad, c.data()), std::invalid_argument);  // inconsistent grid
  bad = random_qt(rng, 3, 20, 16, false, 0);
  bad.gd = 0.0f;
  EXPECT_THROW(probe_gemm(a, bad, c.data()), std::invalid_argument);
  // Tensor scales that do not follow from g and T (α is computed from g and T; the decoded
  // values use gd): ge = (T·6)/g, gd = 1/ge, or 1 and 1 under the MX rules.
  bad = random_qt(rng, 3, 20, 16, false, 0);
  bad.g *= 2.0f;
  EXPECT_THROW(probe_gemm(a, bad, c.data()), std::invalid_argument);
  bad = random_qt(rng, 3, 20, 16, false, 0);
  bad.gd = std::nextafter(bad.gd, 2.0f);
  EXPECT_THROW(probe_gemm(a, bad, c.data()), std::invalid_argument);
  bad = random_qt(rng, 3, 20, 16, false, 0, 0.5f);
  bad.spec.scale_rule = ScaleRule::MxTe;  // MX: ge = gd = 1 required
  EXPECT_THROW(probe_gemm(a, bad, c.data()), std::invalid_argument);
  bad = random_qt(rng, 3, 20, 16, false, 0);
  bad.spec.element = parse_element_format("int4");
  EXPECT_THROW(probe_gemm(a, bad, c.data()), std::invalid_argument);  // not E2M1
  if (!probe_gemm_avx512_available()) {
    EXPECT_THROW(probe_gemm(a, a, c.data(), ProbeGemmOptions{ProbeKernel::Avx512Vnni, {}}),
                 std::runtime_error);
  }
  if (!probe_gemm_avx2_available()) {
    EXPECT_THROW(probe_gemm(a, a, c.data(), ProbeGemmOptions{ProbeKernel::Avx2, {}}), std::runtime_error);
  }
}

TEST(ProbeGemm, ModeNamesAndDispatch) {
  EXPECT_EQ(parse_gemm_mode("decoded"), GemmMode::Decoded);
  EXPECT_EQ(parse_gemm_mode("probe-matched"), GemmMode::ProbeMatched);
  EXPECT_STREQ(gemm_mode_name(GemmMode::ProbeMatched), "probe-matched");
  EXPECT_STREQ(gemm_mode_name(GemmMode::Decoded), "decoded");
  EXPECT_THROW(parse_gemm_mode("probe"), std::invalid_argument);
  std::mt19937_64 rng(2);
  const auto a = random_qt(rng, 4, 40, 16, false, 4), b = random_qt(rng, 5, 40, 16, false, 4);
  std::vector<float> c1(20), c2(20);
  quantized_gemm(GemmMode::ProbeMatched, a, b, c1.data());
  probe_gemm(a, b, c2.data());
  EXPECT_TRUE(same_bits(c1, c2, 5));
  quantized_gemm(GemmMode::Decoded, a, b, c1.data());
  decoded_gemm(a, b, c2.data());
  EXPECT_TRUE(same_bits(c1, c2, 5));
  // Auto is the widest kernel the CPU has.
  const ProbeKernel autok = probe_gemm_auto_kernel();
  EXPECT_EQ(autok, probe_gemm_avx512_available() ? ProbeKernel::Avx512Vnni
                   : probe_gemm_avx2_available() ? ProbeKernel::Avx2
                                                 : ProbeKernel::Portable);
  EXPECT_STREQ(probe_kernel_name(ProbeKernel::Avx2), "avx2");
  EXPECT_STREQ(probe_kernel_name(ProbeKernel::Avx512Emulated), "avx512-emulated");
  EXPECT_STREQ(probe_kernel_name(ProbeKernel::Avx512Vnni), "avx512-vnni");
  EXPECT_STREQ(probe_kernel_name(ProbeKernel::Portable), "portable");
}

}  // namespace
