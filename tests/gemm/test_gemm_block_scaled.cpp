// fp4::gemm_block_scaled and fp4::apply_decode_scales (gemm.h; docs/gemm.md "Decoded FP4 on the
// BF16 GEMM"): the scale step bit for bit against its formula, the product against an FP64
// reference within the FP32-summation bound, on both gemm_bf16 paths, for 1, 2 and 3 threads.
#include <gtest/gtest.h>
#include <omp.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "fp4/gemm/gemm.h"
#include "fp4/numerics/bf16.h"
#include "fp4/gemm/probe_gemm.h"
#include "fp4/numerics/block_quant.h"

using namespace fp4;

namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

BlockQuantSpec ue5m3() {
  BlockQuantSpec s;
  s.scale_format = ScaleFormat::UE5M3;
  s.block = 16;
  return s;
}

/// A block-scaled operand q·c_b [rows, cols] (blocks along cols) of random data, and its gd.
struct Op {
  std::vector<float> v;
  float gd;
};
Op operand(int64_t rows, int64_t cols, uint32_t seed, float scale) {
  const std::vector<float> x = randn(size_t(rows * cols), seed, scale);
  const float g = tensor_amax(x.data(), rows * cols);
  Op o{std::vector<float>(x.size()), tensor_decode_scale(ue5m3(), g)};
  quantize_block_scaled(x.data(), rows, cols, ue5m3(), g, nullptr, o.v.data());
  return o;
}
/// [rows, cols] → [cols, rows]
std::vector<float> transposed(const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<float> t(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = x[size_t(r * cols + c)];
  return t;
}

class BlockScaledGemm : public ::testing::TestWithParam<Bf16GemmPath> {
 protected:
  void SetUp() override {
    saved_ = gemm_bf16_path();
    if (GetParam() == Bf16GemmPath::Native && !gemm_bf16_native_available())
      GTEST_SKIP() << "no native BF16 matmul on this CPU (or capped): the widened path is tested";
    if (GetParam() == Bf16GemmPath::Blocked && !gemm_bf16_blocked_available())
      GTEST_SKIP() << "no brgemm BF16 matmul on this CPU (or capped)";
    gemm_bf16_set_path(GetParam());
  }
  void TearDown() override { gemm_bf16_set_path(saved_); }
  Bf16GemmPath saved_{};
};

TEST(DecodeScales, FormulaBitForBit) {
  // C = fl32(fl64(P·fl64(gd_a·gd_b))) and the accumulating form, against the formula written out
  // element by element; includes scales whose FP32 product would underflow (s = 1e-50) and
  // values the FP64 step rounds.
  std::vector<float> P = randn(70001, 3, 1e3f);
  P[0] = 0.f, P[1] = -0.f, P[2] = 3.0e38f, P[3] = 1e-30f, P[4] = 16777217.f * 4;
  const float pairs[][2] = {{1.f, 1.f}, {1.f / 2688, 3.7e-4f}, {1e-25f, 1e-25f}, {3.f, 7.f}};
  for (const auto& gd : pairs)
    for (bool acc : {false, true}) {
      std::vector<float> C = randn(P.size(), 4), want = C;
      const double s = double(gd[0]) * double(gd[1]);
      for (size_t i = 0; i < P.size(); ++i) {
        const float v = float(double(P[i]) * s);
        want[i] = acc ? want[i] + v : v;
      }
      for (int team : {1, 3}) {
        std::vector<float> got = C;
        omp_set_num_threads(team);
        apply_decode_scales(P.data(), int64_t(P.size()), gd[0], gd[1], acc, got.data());
        ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0)
            << "gd " << gd[0] << " " << gd[1] << " acc " << acc << " threads " << team;
      }
    }
  omp_set_num_threads(2);
  // in place (P = C) without accumulate
  std::vector<float> C = P, want(P.size());
  for (size_t i = 0; i < P.size(); ++i) want[i] = float(double(P[i]) * (double(0.5f) * double(3.f)));
  apply_decode_scales(C.data(), int64_t(C.size()), 0.5f, 3.f, false, C.data());
  EXPECT_EQ(std::memcmp(C.data(), want.data(), C.size() * 4), 0);
}

TEST_P(BlockScaledGemm, WithinTheFp32SumBoundOfTheExactProduct) {
  struct Shape {
    int64_t M, N, K;
  };
  for (Shape sh : {Shape{37, 19, 48}, Shape{300, 130, 272}, Shape{64, 256, 1024}})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (bool acc : {false, true}) {
          const int64_t M = sh.M, N = sh.N, K = sh.K;
          const Op a = operand(M, K, 10, 1.f), b = operand(N, K, 11, 1e-5f);  // A [M,K], B [N,K]
          const std::vector<float> A = ta ? transposed(a.v, M, K) : a.v;      // stored [K,M]
          const std::vector<float> B = tb ? b.v : transposed(b.v, N, K);      // [N,K] or [K,N]
          std::vector<float> C0 = randn(size_t(M * N), 12, 1e-3f), C = C0;
          BlockScaledGemmScratch scratch;
          gemm_block_scaled(ta, tb, M, N, K, A.data(), a.gd, B.data(), b.gd, acc, C.data(), scratch);
          const double s = double(a.gd) * double(b.gd);
          const double u = std::ldexp(1.0, -24), gk = (K + 1) * u / (1 - (K + 1) * u);
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) {
              double exact = 0, mag = 0;
              for (int64_t k = 0; k < K; ++k) {
                const double p = double(a.v[size_t(i * K + k)]) * double(b.v[size_t(j * K + k)]);
                exact += p, mag += std::fabs(p);
              }
              const double old = acc ? double(C0[size_t(i * N + j)]) : 0.0;
              const double want = exact * s + old;
              const double bound = gk * mag * s + 4 * u * (std::fabs(exact * s) + std::fabs(want)) + 1e-44;
              ASSERT_LE(std::fabs(double(C[size_t(i * N + j)]) - want), bound)
                  << "[" << i << "," << j << "] M" << M << " N" << N << " K" << K << " ta" << ta
                  << " tb" << tb << " acc" << acc;
            }
        }
}

TEST_P(BlockScaledGemm, ThreadCountDoesNotChangeBits) {
  const int64_t M = 515, N = 300, K = 256;
  const Op a = operand(M, K, 20, 2.f), b = operand(N, K, 21, 0.1f);
  std::vector<float> want;
  for (int team : {1, 2, 3}) {
    omp_set_num_threads(team);
    for (bool acc : {false, true}) {
      std::vector<float> C = randn(size_t(M * N), 22);
      BlockScaledGemmScratch scratch;
      gemm_block_scaled(false, true, M, N, K, a.v.data(), a.gd, b.v.data(), b.gd, acc, C.data(), scratch);
      if (!acc) continue;
      if (want.empty()) want = C;
      ASSERT_EQ(std::memcmp(C.data(), want.data(), C.size() * 4), 0) << team << " threads";
    }
  }
  omp_set_num_threads(2);
}

TEST_P(BlockScaledGemm, QuantizedGemmModeComposesTheTwins) {
  // quantized_gemm(DecodedBf16) = gemm_block_scaled of the two operands' q·c_b, bit for bit, and
  // close to the decoded mode (same codes and scales; only the decode scales' rounding and the
  // summation order differ).
  const int64_t M = 40, N = 24, K = 96;
  const std::vector<float> x = randn(size_t(M * K), 30), w = randn(size_t(N * K), 31, 0.02f);
  const float gx = tensor_amax(x.data(), M * K), gw = tensor_amax(w.data(), N * K);
  const QuantizedTensor qa = quantize_blocks(x.data(), M, K, ue5m3(), gx, nullptr);
  const QuantizedTensor qb = quantize_blocks(w.data(), N, K, ue5m3(), gw, nullptr);
  std::vector<float> got(size_t(M * N)), dec(size_t(M * N)), want(size_t(M * N));
  quantized_gemm(GemmMode::DecodedBf16, qa, qb, got.data());
  quantized_gemm(GemmMode::Decoded, qa, qb, dec.data());
  std::vector<float> va(x.size()), vb(w.size());
  quantize_block_scaled(x.data(), M, K, ue5m3(), gx, nullptr, va.data());
  quantize_block_scaled(w.data(), N, K, ue5m3(), gw, nullptr, vb.data());
  BlockScaledGemmScratch scratch;
  gemm_block_scaled(false, true, M, N, K, va.data(), qa.gd, vb.data(), qb.gd, false, want.data(), scratch);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], dec[i], 1e-5f * (1 + std::fabs(dec[i]))) << i;
  EXPECT_EQ(std::string(gemm_mode_name(parse_gemm_mode("decoded-bf16"))), "decoded-bf16");
}

TEST_P(BlockScaledGemm, Bf16OperandsGiveTheBitsOfFp32Ones) {
  // The same q·c_b values given as BF16 bit patterns (fp4::bf16_bits, element by element) in
  // either or both places: the same bits as the FP32 operands, on every path (the widened one
  // widens them back), for every transpose and with accumulate.
  const int64_t M = 300, N = 130, K = 272;
  const Op a = operand(M, K, 40, 1.f), b = operand(N, K, 41, 1e-3f);
  auto bits = [](const std::vector<float>& v) {
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = bf16_bits(v[i]);
    return h;
  };
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (bool acc : {false, true}) {
        const std::vector<float> A = ta ? transposed(a.v, M, K) : a.v;
        const std::vector<float> B = tb ? b.v : transposed(b.v, N, K);
        const std::vector<uint16_t> Ah = bits(A), Bh = bits(B);
        const std::vector<float> C0 = randn(size_t(M * N), 42, 1e-3f);
        std::vector<float> want = C0;
        BlockScaledGemmScratch scratch;
        gemm_block_scaled(ta, tb, M, N, K, A.data(), a.gd, B.data(), b.gd, acc, want.data(), scratch);
        for (int which = 1; which < 4; ++which) {  // 1: A in BF16, 2: B, 3: both
          std::vector<float> got = C0;
          const BlockScaledOperand oa = which & 1 ? BlockScaledOperand(Ah.data()) : A.data();
          const BlockScaledOperand ob = which & 2 ? BlockScaledOperand(Bh.data()) : B.data();
          gemm_block_scaled(ta, tb, M, N, K, oa, a.gd, ob, b.gd, acc, got.data(), scratch);
          ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0)
              << "ta" << ta << " tb" << tb << " acc" << acc << " bf16 operands " << which;
        }
      }
}

TEST_P(BlockScaledGemm, EdgeShapesAndErrors) {
  BlockScaledGemmScratch scratch;
  std::vector<float> C(6, 5.f);
  const float a = 1.f;
  gemm_block_scaled(false, true, 2, 3, 0, nullptr, 1.f, nullptr, 1.f, false, C.data(), scratch);
  for (float c : C) EXPECT_EQ(c, 0.f);  // K = 0: P = 0
  std::fill(C.begin(), C.end(), 5.f);
  gemm_block_scaled(false, true, 2, 3, 0, nullptr, 1.f, nullptr, 1.f, true, C.data(), scratch);
  for (float c : C) EXPECT_EQ(c, 5.f);  // accumulate + 0
  EXPECT_THROW(gemm_block_scaled(false, true, 2, 3, -1, &a, 1.f, &a, 1.f, false, C.data(), scratch),
               std::invalid_argument);
  EXPECT_THROW(gemm_block_scaled(false, true, 2, 3, 4, nullptr, 1.f, &a, 1.f, false, C.data(), scratch),
               std::invalid_argument);
  const uint16_t h = 0x3F80;  // 1.0
  EXPECT_THROW(gemm_block_scaled(false, true, 2, 3, 4, &h, 1.f, static_cast<const uint16_t*>(nullptr),
                                 1.f, false, C.data(), scratch),
               std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(Paths, BlockScaledGemm,
                         ::testing::Values(Bf16GemmPath::Native, Bf16GemmPath::Widened,
                                           Bf16GemmPath::Blocked),
                         [](const auto& info) {
                           return std::string(info.param == Bf16GemmPath::Native    ? "Native"
                                              : info.param == Bf16GemmPath::Blocked ? "Blocked"
                                                                                    : "Widened");
                         });

}  // namespace
