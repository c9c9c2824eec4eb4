// Internal pieces shared by the fast layer kernels (layers_fast.cpp, Highway) and their scalar
// twins (layers_ref.cpp): the canonical reduction order, the exp, the RoPE table and the id
// check. Everything here is scalar code; the vector code in layers_fast.cpp repeats the same
// IEEE operations lane-wise. Not a public header.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace fp4::nn::internal {

// ---------------------------------------------------------------- canonical sum
// The canonical sum S = Σ_{i<n} term(i) (documented in fp4/nn/layers.h, "Canonical sum"):
//   * the n terms are cut into superchunks of kSuperChunk consecutive terms, each superchunk
//     into chunks of kSumChunk terms (both counted from i = 0);
//   * chunk: 16 FP32 partials p[0..15] from +0; term i is added to p[i mod 16], i ascending;
//     the partials are combined by tree16 (below) into one FP32 chunk sum;
//   * superchunk: FP64 sum from 0.0 of its chunk sums (converted exactly), ascending;
//   * S: FP64 sum from 0.0 of the superchunk sums, ascending.
// The order depends only on n, never on the vector width or the thread count. A partial that
// starts at +0 never becomes −0 under round-to-nearest, so adding +0 for padded lanes is exact.
constexpr int64_t kSumChunk = 1024;
constexpr int64_t kSuperChunk = int64_t{1} << 18;

/// The fixed pairwise tree over 16 partials: p[i] += p[i+8] (i < 8), p[i] += p[i+4] (i < 4),
/// p[i] += p[i+2] (i < 2), then p[0] + p[1]. Overwrites p.
inline float tree16(float* p) {
  for (int i = 0; i < 8; ++i) p[i] += p[i + 8];
  for (int i = 0; i < 4; ++i) p[i] += p[i + 4];
  for (int i = 0; i < 2; ++i) p[i] += p[i + 2];
  return p[0] + p[1];
}

// ---------------------------------------------------------------- sum of squares
// detail::sum_squares (fp4/nn/layers.h): S = canonical sum of (g[i]·s)·(g[i]·s), FP32, with
// s = 1. If S is +inf although every g[i] is finite (an FP32 chunk partial overflowed: from
// four entries of 1e19 on), it is recomputed with s = 2^−k, k = the exponent below,
// and returned as that sum · 2^(2k) (double, exact scaling). Every entry's scaled square is
// then below 16, so no partial can overflow.

/// k = min(ilogb(max |g[i]|), 126) for that rescaling (2^−k is a normal float, and scaling by
/// it is exact for every |g[i]| ≥ 2^(k−126)); −1 if some g[i] is ±Inf (the sum is truly
/// +inf). Exact (a max of bit patterns), order-free; n ≥ 1.
inline int sumsq_rescale_exponent(const float* g, int64_t n) {
  uint32_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t b = std::bit_cast<uint32_t>(g[i]) & 0x7FFFFFFFu;
    m = b > m ? b : m;
  }
  if (m > 0x7F7FFFFFu) return -1;
  if (m == 0) return 0;
  const int k = std::ilogb(std::bit_cast<float>(m));
  return k < 126 ? k : 126;
}

// ---------------------------------------------------------------- exp
// exp(x) in FP32 with multiplies and adds only (no FMA; the project builds with
// -ffp-contract=off), Cody–Waite range reduction and a degree-5 polynomial (Cephes expf).
// exp_scalar and ExpV (layers_fast.cpp) perform these operations in this order:
//   xc = x ≥ kExpLo ? x : kExpLo;  xc = xc ≤ kExpHi ? xc : kExpHi      (NaN → kExpLo)
//   t  = xc·log2e + 1.5·2^23;  kf = t − 1.5·2^23;  k = bits(t) − bits(1.5·2^23)  (round to int)
//   r  = (xc − kf·ln2_hi) − kf·ln2_lo;  z = r·r
//   p  = ((((P0·r + P1)·r + P2)·r + P3)·r + P4)·r + P5;  y = (p·z + r) + 1
//   k1 = k >> 1 (arithmetic), k2 = k − k1;  y = (y·2^k1)·2^k2          (both powers normal)
//   x > kExpHi → +inf;  x < kExpLo → +0;  x NaN → x.
constexpr float kExpHi = 88.72283172607421875f;  // largest float with a finite exp
constexpr float kExpLo = -104.0f;                 // exp(x) < 2^-150 below: rounds to 0
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kRoundMagic = 12582912.0f;  // 1.5·2^23
constexpr float kLn2Hi = 0.693359375f;      // 355/512: kf·kLn2Hi is exact for |k| ≤ 2^15
constexpr float kLn2Lo = -2.12194440e-4f;   // ln 2 − kLn2Hi
constexpr float kExpP0 = 1.9875691500e-4f;
constexpr float kExpP1 = 1.3981999507e-3f;
constexpr float kExpP2 = 8.3334519073e-3f;
constexpr float kExpP3 = 4.1665795894e-2f;
constexpr float kExpP4 = 1.6666665459e-1f;
constexpr float kExpP5 = 5.0000001201e-1f;

inline float pow2_normal(int32_t k) {  // 2^k for k in [−126, 127]
  return std::bit_cast<float>(static_cast<int32_t>(static_cast<uint32_t>(k + 127) << 23));
}

inline float exp_scalar(float x) {
  float xc = x >= kExpLo ? x : kExpLo;
  xc = xc <= kExpHi ? xc : kExpHi;
  const float t = xc * kLog2e + kRoundMagic;
  const float kf = t - kRoundMagic;
  const int32_t k = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kRoundMagic);
  const float r = (xc - kf * kLn2Hi) - kf * kLn2Lo;
  const float z = r * r;
  float p = kExpP0 * r + kExpP1;
  p = p * r + kExpP2;
  p = p * r + kExpP3;
  p = p * r + kExpP4;
  p = p * r + kExpP5;
  float y = (p * z + r) + 1.0f;
  const int32_t k1 = k >> 1, k2 = k - k1;
  y = y * pow2_normal(k1);
  y = y * pow2_normal(k2);
  if (x > kExpHi) y = std::numeric_limits<float>::infinity();
  if (x < kExpLo) y = 0.0f;
  if (x != x) y = x;
  return y;
}

// ---------------------------------------------------------------- RoPE table
// Expanded table [T, hd] for the pair rotation written lane-wise:
//   out[j] = x[j]·cos2[j] + x[j ^ 1]·sin2[j]
// with cos2[2i] = cos2[2i+1] = cos(a), forward sin2 = (−sin a, +sin a), backward sin2 =
// (+sin a, −sin a), a = t · theta^(−2i/hd) evaluated in double (std::pow, std::cos, std::sin)
// and rounded to float. x0·c + x1·(−s) equals x0·c − x1·s bit for bit (IEEE a − b ≡ a + (−b)).
struct RopeTable {
  int64_t T = 0, hd = 0;
  float theta = 0.0f;
  std::vector<float> cos2, sin_fwd, sin_bwd;
};

inline void build_rope_table(RopeTable& tb, int64_t T, int64_t hd, float theta) {
  tb.T = T;
  tb.hd = hd;
  tb.theta = theta;
  const auto n = static_cast<size_t>(T * hd);
  tb.cos2.assign(n, 0.0f);
  tb.sin_fwd.assign(n, 0.0f);
  tb.sin_bwd.assign(n, 0.0f);
  for (int64_t i = 0; i < hd / 2; ++i) {
    const double inv_freq = std::pow(static_cast<double>(theta),
                                      -2.0 * static_cast<double>(i) / static_cast<double>(hd));
    for (int64_t t = 0; t < T; ++t) {
      const double a = static_cast<double>(t) * inv_freq;
      const float c = static_cast<float>(std::cos(a)), s = static_cast<float>(std::sin(a));
      const int64_t j = t * hd + 2 * i;
      tb.cos2[j] = tb.cos2[j + 1] = c;
      tb.sin_fwd[j] = -s;
      tb.sin_fwd[j + 1] = s;
      tb.sin_bwd[j] = s;
      tb.sin_bwd[j + 1] = -s;
    }
  }
}

inline void check_rope(int64_t hd, const char* fn) {
  if (hd <= 0 || hd % 2 != 0)
    throw std::invalid_argument(std::string(fn) + ": head dim must be even and > 0 (got " +
                                std::to_string(hd) + ")");
}

// Throws std::out_of_range if any ids[i] is outside [0, V) (V < 0: only checks ≥ 0).
inline void check_ids(const int32_t* ids, int64_t n, int64_t V, const char* fn,
                      const char* what) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = ids[i];
    if (id < 0 || (V >= 0 && id >= V))
      throw std::out_of_range(std::string(fn) + ": " + what + "[" + std::to_string(i) +
                              "] = " + std::to_string(id) + " is outside [0, " +
                              (V >= 0 ? std::to_string(V) : std::string("V")) + ")");
  }
}

// Argument check of the causal attention kernels (attention.cpp) and their twins
// (attention_ref.cpp): throws std::invalid_argument, naming `fn` and the offending argument,
// unless T, H, Hkv, hd > 0, H % Hkv == 0 and T, H, hd < 2^31 (the vector kernels compare
// column indices as int32).
inline void check_attention_dims(int64_t T, int64_t H, int64_t Hkv, int64_t hd,
                                 const char* fn) {
  auto bad = [&](const std::string& why) {
    throw std::invalid_argument(std::string(fn) + ": " + why + " (got T=" + std::to_string(T) +
                                ", H=" + std::to_string(H) + ", Hkv=" + std::to_string(Hkv) +
                                ", hd=" + std::to_string(hd) + ")");
  };
  if (T <= 0) bad("T must be > 0");
  if (H <= 0) bad("H (query heads) must be > 0");
  if (Hkv <= 0) bad("Hkv (key/value heads) must be > 0");
  if (hd <= 0) bad("hd (head size) must be > 0");
  if (H % Hkv != 0) bad("H must be a multiple of Hkv");
  constexpr int64_t kMax = int64_t{1} << 31;
  if (T >= kMax || H >= kMax || hd >= kMax) bad("T, H and hd must be < 2^31");
}

}  // namespace fp4::nn::internal
