// Inputs and helpers shared by the bit-exact tests of the SIMD quantizers against their scalar
// twins (tests/numerics/test_quant_fast.cpp, tests/numerics/test_pack_fast.cpp): random tensors from several
// distributions, the scale formats and roundings to sweep, and a first-differing-element
// search.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "fp4/numerics/block_quant.h"
#include "fp4/numerics/philox.h"

namespace fp4::testing {

inline constexpr ScaleFormat kFormats[] = {ScaleFormat::UE5M3, ScaleFormat::UE5M3_PTX,
                                           ScaleFormat::E4M3, ScaleFormat::UE8M0};
inline constexpr Rounding kRoundings[] = {Rounding::RNE, Rounding::SR8, Rounding::RNA};

/// An SR key with every field nonzero.
inline const SrKey kKey{0x123456789ABCDEF0ull, 7, 3, 2, 2};

enum class Dist { Normal, Cauchy, Tiny, Huge };
inline constexpr Dist kDists[] = {Dist::Normal, Dist::Cauchy, Dist::Tiny, Dist::Huge};

/// n finite values: N(0,1); Cauchy (heavy tails, clipped to ±1e30 to stay finite after
/// scaling); tiny (N(0,1)·1e-41: FP32 subnormals, some exact zeros, with occasional normal
/// 1e-37 values); huge (N(0,1)·1e30, with some ±1e36 outliers). Sprinkles exact zeros and −0.
inline std::vector<float> make_data(Dist d, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::cauchy_distribution<float> cd(0.f, 1.f);
  std::uniform_int_distribution<int> pick(0, 99);
  std::vector<float> v(n);
  for (auto& x : v) {
    const int p = pick(rng);
    switch (d) {
      case Dist::Normal: x = nd(rng); break;
      case Dist::Cauchy: x = std::clamp(cd(rng), -1e30f, 1e30f); break;
      case Dist::Tiny: x = p < 3 ? nd(rng) * 1e-37f : nd(rng) * 1e-41f; break;
      case Dist::Huge: x = p < 2 ? nd(rng) * 1e36f : nd(rng) * 1e30f; break;
    }
    if (p == 50) x = 0.f;
    if (p == 51) x = -0.f;
  }
  return v;
}

inline BlockQuantSpec make_spec(ScaleFormat f, Rounding r, int block = 16, bool two_d = false) {
  BlockQuantSpec s;
  s.scale_format = f;
  s.rounding = r;
  s.block = block;
  s.two_d = two_d;
  return s;
}

inline std::string spec_str(const BlockQuantSpec& s) {
  return std::string(scale_format_name(s.scale_format)) +
         " " + rounding_name(s.rounding) + " block " + std::to_string(s.block) +
         (s.two_d ? " 2D" : " 1D");
}

/// Index of the first element whose bytes differ (bit patterns for floats), or -1; 0 if the
/// sizes differ.
template <class T>
int64_t first_diff(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  // Empty vectors: data() may be null, which memcmp must not be given even for 0 bytes.
  if (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0) return -1;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return int64_t(i);
  return -1;
}

/// Adversarial [64, 48] tensors, named, drawn from rng (seeded by the caller): all-zero blocks
/// next to normal ones; values at ±6·d_b and just above over 40 binades; one huge among tiny
/// ones (and −3e38); FP32 subnormals through FLT_MIN.
inline std::vector<std::pair<std::string, std::vector<float>>> adversarial_inputs(
    std::mt19937_64& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<std::pair<std::string, std::vector<float>>> inputs;
  {
    std::vector<float> v(64 * 48);
    for (size_t i = 0; i < v.size(); ++i) v[i] = (i / 16) % 3 == 0 ? 0.f : nd(rng);
    inputs.push_back({"zero blocks", v});
  }
  {
    std::vector<float> v(64 * 48, 0.f);
    for (size_t i = 0; i < v.size(); ++i) {
      const float s = std::ldexp(1.f, int(i % 40) - 20);
      const float vals[] = {6.f * s, -6.f * s, std::nextafter(6.f * s, 1e30f),
                            -std::nextafter(6.f * s, 1e30f), 6.5f * s, 1e-3f * s};
      v[i] = vals[i % 6];
    }
    inputs.push_back({"at and above 6 d_b", v});
  }
  {
    std::vector<float> v(64 * 48);
    for (size_t i = 0; i < v.size(); ++i) v[i] = nd(rng) * 1e-30f;
    for (size_t i = 5; i < v.size(); i += 97) v[i] = 1e30f;
    v[7] = -3e38f;
    inputs.push_back({"huge among tiny", v});
  }
  {
    std::vector<float> v(64 * 48);
    for (size_t i = 0; i < v.size(); ++i) v[i] = nd(rng) * std::ldexp(1.f, int(i % 200) - 149);
    inputs.push_back({"subnormals and FLT_MIN", v});
  }
  return inputs;
}

/// Inputs whose x·e_b is exactly an E2M1 midpoint (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5) or an
/// exact grid point, for scale format f (f and r seed the search in (b)):
/// (a) x [rows, 48] with power-of-two block scales: g = T·6 (so ge = 1 and e_b = 2^-k exactly
///     for block amax 6·2^k, k = −12..12), ± every midpoint and grid point, and a block of amax
///     7·2^k (not a grid scale);
/// (b) x2 [400·16] with arbitrary scales under g2 = 777: candidates around m·d_b (d_b and e_b
///     from the scalar quantizer) kept only if x·e_b == m exactly in FP32; exact_hits counts them.
struct TieInputs {
  std::vector<float> x, x2;
  int64_t rows = 0, cols = 48;
  float g = 448.f * 6.f, g2 = 777.f;
  int exact_hits = 0;
};
inline TieInputs tie_inputs(ScaleFormat f, Rounding r) {
  const float mids[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.f};
  const float grid[] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  TieInputs in;
  // (a) power-of-two scales
  for (int k = -12; k <= 12; ++k) {
    const float s = std::ldexp(1.f, k);
    std::vector<float> row(size_t(in.cols), 0.f);
    // block 0: amax 6·2^k (c_b = 2^k where the format reaches it), ± every midpoint
    row[0] = 6.f * s;
    size_t i = 1;
    for (float m : mids) {
      row[i++] = m * s;
      row[i++] = -m * s;
    }
    row[i++] = std::nextafter(6.f * s, 0.f);
    // block 1: amax 6·2^k, ± every grid point
    row[16] = -6.f * s;
    i = 17;
    for (float q : grid) row[i++] = q * s;
    for (int t = 1; t < 8; ++t) row[i++] = -grid[t] * s;
    // block 2: amax 7·2^k (not a grid scale), the midpoints again
    for (size_t j = 32; j < 48; ++j) row[j] = row[j - 32] * 0.875f;
    row[32] = 7.f * s;
    in.x.insert(in.x.end(), row.begin(), row.end());
  }
  in.rows = int64_t(in.x.size()) / in.cols;
  // (b) arbitrary scales: exact midpoints found by search
  std::mt19937_64 rng(42 + int(f) * 2 + int(r));
  std::uniform_real_distribution<float> ua(0.1f, 1000.f);
  for (int b = 0; b < 400; ++b) {
    std::vector<float> blk(16, 0.f);
    blk[0] = ua(rng);
    // d_b and e_b from the scalar quantizer itself
    const QuantizedTensor q =
        quantize_blocks(blk.data(), 1, 16, make_spec(f, Rounding::RNE), in.g2, nullptr);
    const float d = q.scales[0] * q.gd, e = 1.f / d;
    size_t i = 1;
    for (float m : mids) {
      float c = m * d;
      for (int t = 0; t < 6 && i < 16; ++t) {
        if (std::fabs(c) * e == m && c < blk[0]) {
          blk[i++] = (b & 1) ? -c : c;
          ++in.exact_hits;
          break;
        }
        c = std::nextafter(c, t % 2 ? 0.f : 1e30f);
      }
    }
    in.x2.insert(in.x2.end(), blk.begin(), blk.end());
  }
  return in;
}

/// An operand [rows, cols] (cols ≥ 2) whose block scales are all e_b = 1 under g = 448·6 (each
/// 16-block starts with 6): the exact half-way point m of every E2M1 interval (0.25, 0.75,
/// 1.25, 1.75, 2.5, 3.5, 5), one and two floats below and above it, values above 6, and in the
/// first interval m − 2^−k for k = 24..30 (where fl(s + 0.5) of a round-by-adding kernel would
/// round up: 0.25 − 2^−26 must go to 0 under RNA), zeros; both signs. For the RNA twin tests.
inline std::vector<float> rna_tie_inputs(int64_t rows, int64_t cols) {
  const float mids[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.f};
  std::vector<float> x(size_t(rows * cols));
  for (int64_t i = 0; i < rows * cols; ++i) {
    if ((i % cols) % 16 == 0) {
      x[size_t(i)] = 6.f;  // block amax 6 → e_b = 1
      continue;
    }
    const float m = mids[i % 7];
    float y = m;
    switch ((i / 7) % 8) {
      case 0: break;                                                   // the tie: away
      case 1: y = std::nextafter(m, 0.f); break;                       // just below: down
      case 2: y = std::nextafter(m, 10.f); break;                      // just above: up
      case 3: y = std::nextafter(std::nextafter(m, 0.f), 0.f); break;
      case 4: y = 0.25f - std::ldexp(1.f, -24 - int(i % 7)); break;    // fine bits below 0.25
      case 5: y = 5.f + float(i % 3); break;                           // 5, 6, 7: saturation edge
      case 6: y = 0.f; break;
      case 7: y = std::ldexp(m, -int(i % 30) - 1); break;              // smaller binades
    }
    x[size_t(i)] = (i % 5 == 0) ? -y : y;
  }
  return x;
}

}  // namespace fp4::testing
