// The probe-matched GEMM's accumulator (include/fp4/gemm/accumulator.h; docs/numerics.md "GEMM
// emulation"). Scalar and exact: these functions are the reference of the SIMD kernels in
// probe_gemm.cpp / probe_gemm_avx2.cpp (which implement the default accumulator), and the code
// fp4::probe_gemm's portable kernel runs. Tests: tests/gemm/test_accumulator.cpp.
#include "fp4/gemm/accumulator.h"

#include "fp4/numerics/bf16.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace fp4 {

const char* accum_rounding_name(AccumRounding r) { return r == AccumRounding::Rne ? "rne" : "rtz"; }

AccumRounding parse_accum_rounding(const std::string& s, const std::string& what) {
  if (s == "rne") return AccumRounding::Rne;
  if (s == "rtz") return AccumRounding::Rtz;
  throw std::invalid_argument(what + ": expected \"rne\" or \"rtz\", got \"" + s + "\"");
}

void Accumulator::check() const {
  if (chunk != 16 && chunk != 32 && chunk != 64 && chunk != 128)
    throw std::invalid_argument("accumulator chunk: expected 16, 32, 64 or 128 products, got " +
                                std::to_string(chunk));
  if (snap != 0 && (snap < 1 || snap > 65536 || !std::has_single_bit(static_cast<unsigned>(snap))))
    throw std::invalid_argument("accumulator snap: expected 0 (none) or a power of two from 1 to "
                                "65536 (the grid 1/d), got " + std::to_string(snap));
}

std::string Accumulator::describe() const {
  return "chunk " + std::to_string(chunk) + ", " + accum_rounding_name(rounding) + ", snap " +
         (snap == 0 ? std::string("none") : "1/" + std::to_string(snap));
}

namespace {
/// FP32 addition rounded toward zero, exactly. s = fl64(a + b) may be inexact, so the TwoSum
/// error e (a + b = s + e exactly, |e| ≤ ulp64(s)/2) decides the truncation: if s is not an
/// FP32 value, no FP32 value lies between s and s + e (they are ≥ one ulp64 apart on the FP32
/// grid), so trunc(s + e) = trunc(s); if s is an FP32 value, s + e truncates to s unless e
/// points toward zero, then to the next FP32 value toward zero. Overflow gives ±FLT_MAX.
/// Inf/NaN operands follow IEEE (the result does not depend on the rounding mode). The double
/// sum of two floats is NOT always exact (exponents further apart than 29 need more than 53
/// bits: 1 − 2^-60 rounds to 1 in double, whose truncation would be wrong): hence e.
inline float add_rtz(float a, float b) {
  if (!std::isfinite(a) || !std::isfinite(b)) return a + b;
  const double x = a, y = b;
  const double s = x + y;
  const double bv = s - x;
  const double e = (x - (s - bv)) + (y - bv);
  float t = static_cast<float>(s);
  if (std::fabs(static_cast<double>(t)) > std::fabs(s)) {
    t = std::nextafter(t, 0.0f);  // rounded away from zero (or to Inf): step back
  } else if (static_cast<double>(t) == s && e != 0.0 && ((e < 0.0) != (s < 0.0))) {
    t = std::nextafter(t, 0.0f);
  }
  return t;
}

/// f = ±mant·2^ex exactly (mant < 2^24) for a finite f; mant = 0 for ±0.
inline void split_float(float f, int64_t& mant, int& ex) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint32_t field = (bits >> 23) & 0xFF;
  const int64_t frac = bits & 0x7FFFFF;
  if (field == 0) {
    mant = frac;
    ex = -149;
  } else {
    mant = frac | (int64_t{1} << 23);
    ex = static_cast<int>(field) - 150;
  }
  if (bits >> 31) mant = -mant;
}

void check_finite(const float* x, int64_t n, const char* name, int64_t row, const char* who) {
  for (int64_t k = 0; k < n; ++k)
    if (!std::isfinite(x[k]))
      throw std::invalid_argument(std::string(who) + ": operand " + name +
                                  (row >= 0 ? " row " + std::to_string(row) + "," : "") +
                                  " element " + std::to_string(k) + " is not finite (" +
                                  std::to_string(x[k]) + ")");
}
/// Every row of x and w [rows, K] finite; checked before anything is written.
void check_rows_finite(const float* x, const float* w, int64_t rows, int64_t K, const char* who) {
  for (int64_t i = 0; i < rows; ++i) {
    check_finite(x + i * K, K, "x", i, who);
    check_finite(w + i * K, K, "w", i, who);
  }
}

/// Step 3 on checked operands (finite, n ≤ 4096), with the terms in the caller's buffer t [n].
float chunk_sum_unchecked(const float* x, const float* w, int64_t n, detail::ExactTerm* t) {
  for (int64_t k = 0; k < n; ++k) {
    int64_t ma, mb;
    int ea, eb;
    split_float(x[k], ma, ea);
    split_float(w[k], mb, eb);
    t[k] = {ma * mb, ea + eb};  // |ma·mb| < 2^48
  }
  return detail::round_exact_terms_rne(t, static_cast<int>(n));
}

/// Step 3 for one row pair of length K on checked operands: partials [ceil(K / chunk)].
void row_partials(const float* x, const float* w, int64_t K, int64_t chunk, float* partials) {
  thread_local std::vector<detail::ExactTerm> terms;  // reused: no allocation per chunk
  terms.resize(static_cast<size_t>(std::max<int64_t>(chunk, 1)));
  for (int64_t k0 = 0, c = 0; k0 < K; k0 += chunk, ++c)
    partials[c] = chunk_sum_unchecked(x + k0, w + k0, std::min(chunk, K - k0), terms.data());
}

/// Steps 4 and 5 on a checked accumulator: the one accumulation loop of this file.
float accumulate_unchecked(const float* partials, int64_t n, const Accumulator& acc) {
  float a = 0.0f;
  for (int64_t c = 0; c < n; ++c) a = accumulate_add(a, partials[c], acc.rounding);
  return snap_to_grid(a, acc.snap);
}

float chunked_dot_unchecked(const float* x, const float* w, int64_t K, const Accumulator& acc) {
  thread_local std::vector<float> partials;
  partials.resize(static_cast<size_t>((K + acc.chunk - 1) / acc.chunk));
  row_partials(x, w, K, acc.chunk, partials.data());
  return accumulate_unchecked(partials.data(), static_cast<int64_t>(partials.size()), acc);
}
}  // namespace

float accumulate_add(float acc, float partial, AccumRounding r) {
  return r == AccumRounding::Rtz ? add_rtz(acc, partial) : acc + partial;
}

float snap_to_grid(float x, int d) {
  if (d == 0) return x;
  // x·d and the quotient are exact in double (d a power of two, |x| < 2^128); nearbyint rounds
  // to nearest even in the default mode; the result is x itself (|x| ≥ 2^23/d, already an
  // integer multiple of 1/d) or k/d with |k| ≤ 2^23, which FP32 holds exactly.
  const double dd = static_cast<double>(d);
  return static_cast<float>(std::nearbyint(static_cast<double>(x) * dd) / dd);
}

float accumulate_partials(const float* partials, int64_t n, const Accumulator& acc) {
  acc.check();
  if (n < 0) throw std::invalid_argument("accumulate_partials: n must be >= 0, got " + std::to_string(n));
  return accumulate_unchecked(partials, n, acc);
}

void accumulate_partials_rows(const float* partials, int64_t rows, int64_t chunks,
                              const Accumulator& acc, float* out) {
  acc.check();
  if (rows < 0 || chunks < 0)
    throw std::invalid_argument("accumulate_partials_rows: rows and chunks must be >= 0, got " +
                                std::to_string(rows) + " and " + std::to_string(chunks));
#pragma omp parallel for schedule(static) if (rows * chunks >= (int64_t{1} << 15))
  for (int64_t i = 0; i < rows; ++i) out[i] = accumulate_unchecked(partials + i * chunks, chunks, acc);
}

float chunk_sum_rne(const float* x, const float* w, int64_t n) {
  if (n < 0 || n > 4096)
    throw std::invalid_argument("chunk_sum_rne: n must be in [0, 4096], got " + std::to_string(n));
  check_finite(x, n, "x", -1, "chunk_sum_rne");
  check_finite(w, n, "w", -1, "chunk_sum_rne");
  std::vector<detail::ExactTerm> t(static_cast<size_t>(n));
  return chunk_sum_unchecked(x, w, n, t.data());
}

float chunked_dot(const float* x, const float* w, int64_t K, const Accumulator& acc) {
  acc.check();
  if (K < 0) throw std::invalid_argument("chunked_dot: K must be >= 0, got " + std::to_string(K));
  check_finite(x, K, "x", -1, "chunked dot");
  check_finite(w, K, "w", -1, "chunked dot");
  return chunked_dot_unchecked(x, w, K, acc);
}

void chunked_dot_rows(const float* x, const float* w, int64_t rows, int64_t K,
                      const Accumulator& acc, float* out) {
  acc.check();
  if (rows < 0 || K < 0)
    throw std::invalid_argument("chunked_dot_rows: rows and K must be >= 0, got " +
                                std::to_string(rows) + " and " + std::to_string(K));
  check_rows_finite(x, w, rows, K, "chunked dot");
#pragma omp parallel for schedule(dynamic, 16)
  for (int64_t i = 0; i < rows; ++i) out[i] = chunked_dot_unchecked(x + i * K, w + i * K, K, acc);
}

void chunk_partials_rows(const float* x, const float* w, int64_t rows, int64_t K, int chunk,
                         float* partials) {
  if (rows < 0 || K < 0 || chunk < 1 || chunk > 4096)
    throw std::invalid_argument("chunk_partials_rows: rows and K must be >= 0 and chunk in [1, 4096], got " +
                                std::to_string(rows) + ", " + std::to_string(K) + " and " +
                                std::to_string(chunk));
  check_rows_finite(x, w, rows, K, "chunk partials");
  const int64_t nc = (K + chunk - 1) / chunk;
#pragma omp parallel for schedule(dynamic, 16)
  for (int64_t i = 0; i < rows; ++i) row_partials(x + i * K, w + i * K, K, chunk, partials + i * nc);
}

void chunked_dot_rows_bf16(const uint16_t* x, const uint16_t* w, int64_t rows, int64_t K,
                           const Accumulator& acc, float* out) {
  if (rows < 0 || K < 0)
    throw std::invalid_argument("chunked_dot_rows_bf16: rows and K must be >= 0, got " +
                                std::to_string(rows) + " and " + std::to_string(K));
  std::vector<float> xf(static_cast<size_t>(rows * K)), wf(static_cast<size_t>(rows * K));
  for (int64_t i = 0; i < rows * K; ++i) {  // BF16 → FP32 is exact
    xf[static_cast<size_t>(i)] = bf16_value(x[i]);
    wf[static_cast<size_t>(i)] = bf16_value(w[i]);
  }
  chunked_dot_rows(xf.data(), wf.data(), rows, K, acc, out);
}

namespace detail {

float round_exact_terms_rne(const ExactTerm* t, int n) {
  int umin = INT_MAX, umax = INT_MIN;
  for (int i = 0; i < n; ++i) {
    if (t[i].v == 0) continue;
    umin = std::min(umin, t[i].u);
    umax = std::max(umax, t[i].u);
  }
  if (umin == INT_MAX) return 0.0f;
  // |Σ| < 4096·2^62·2^(umax − umin) = 2^(74 + umax − umin): width bits plus sign fit in L words.
  const int L = (umax - umin + 75) / 64 + 2;
  std::vector<uint64_t> w(static_cast<size_t>(L), 0);
  for (int i = 0; i < n; ++i) {
    const int64_t v = t[i].v;
    if (v == 0) continue;
    const int sh = t[i].u - umin, wi = sh / 64, b = sh % 64;
    const uint64_t ext = v < 0 ? ~uint64_t{0} : 0;
    const uint64_t lo = static_cast<uint64_t>(v) << b;
    const uint64_t hi = b == 0 ? ext : static_cast<uint64_t>(v >> (64 - b));
    uint64_t carry = 0;
    for (int k = wi; k < L; ++k) {
      const uint64_t add = k == wi ? lo : (k == wi + 1 ? hi : ext);
      const uint64_t s1 = w[static_cast<size_t>(k)] + add;
      const uint64_t c1 = s1 < add;
      const uint64_t s2 = s1 + carry;
      const uint64_t c2 = s2 < carry;
      w[static_cast<size_t>(k)] = s2;
      carry = c1 | c2;
    }
  }
  const bool neg = (w[static_cast<size_t>(L - 1)] >> 63) != 0;
  if (neg) {  // magnitude = ~w + 1
    uint64_t carry = 1;
    for (auto& x : w) {
      x = ~x + carry;
      carry = (carry && x == 0) ? 1 : 0;
    }
  }
  int top = -1;
  for (int k = L - 1; k >= 0 && top < 0; --k) {
    if (w[static_cast<size_t>(k)]) top = 64 * k + 63 - std::countl_zero(w[static_cast<size_t>(k)]);
  }
  if (top < 0) return 0.0f;  // exact cancellation: +0
  auto bit = [&](int pos) { return (w[static_cast<size_t>(pos / 64)] >> (pos % 64)) & 1u; };
  const int etop = umin + top;
  const int q = std::max(etop - 23, -149);  // exponent of one FP32 ulp at this magnitude
  const int sh = q - umin;
  uint64_t m = 0;
  int scale_exp;
  if (sh <= 0) {  // every bit is kept (top ≤ 23): the value is already on the FP32 grid
    for (int pos = top; pos >= 0; --pos) m = (m << 1) | bit(pos);
    scale_exp = umin;
  } else {
    for (int pos = top; pos >= sh; --pos) m = (m << 1) | bit(pos);
    const bool round = bit(sh - 1) != 0;
    bool sticky = false;
    for (int pos = sh - 2; pos >= 0 && !sticky; --pos) sticky = bit(pos) != 0;
    if (round && (sticky || (m & 1u))) ++m;
    scale_exp = q;
  }
  // m < 2^25 and scale_exp far inside double's range: exact in double; the float conversion is
  // exact, or overflows to Inf exactly when the rounded value is ≥ 2^128 (IEEE RNE overflow).
  const float r = static_cast<float>(std::ldexp(static_cast<double>(m), scale_exp));
  return neg ? -r : r;
}

}  // namespace detail
}  // namespace fp4
