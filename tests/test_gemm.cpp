// The FP32 GEMM backend: agrees with a double-precision naive reference and is bit-identical
// for 1 and 2 threads on shapes that exercise tiling and transposes.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "fp4/gemm.h"

namespace {
std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

struct Shape { int64_t M, N, K; bool ta, tb; };

TEST(Gemm, MatchesDoubleReferenceAllTransposes) {
  for (Shape s : {Shape{7, 5, 3, false, false}, Shape{130, 513, 33, false, true},
                  Shape{129, 70, 300, true, false}, Shape{33, 600, 17, true, true}}) {
    auto A = randn(s.M * s.K, 1), B = randn(s.K * s.N, 2), C0 = randn(s.M * s.N, 3);
    const int64_t lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
    auto C = C0, R = C0;
    fp4::sgemm(s.ta, s.tb, s.M, s.N, s.K, 0.5f, A.data(), lda, B.data(), ldb, 2.f, C.data(), s.N);
    fp4::sgemm_ref(s.ta, s.tb, s.M, s.N, s.K, 0.5f, A.data(), lda, B.data(), ldb, 2.f, R.data(),
                   s.N);
    for (size_t i = 0; i < C.size(); ++i)
      ASSERT_NEAR(C[i], R[i], 1e-4f * (1.f + std::sqrt(float(s.K))))
          << "M=" << s.M << " N=" << s.N << " K=" << s.K << " i=" << i;
  }
}

TEST(Gemm, HandComputed2x2) {
  const float A[] = {1, 2, 3, 4}, B[] = {5, 6, 7, 8};
  float C[4] = {};
  fp4::sgemm(false, false, 2, 2, 2, 1.f, A, 2, B, 2, 0.f, C, 2);
  EXPECT_EQ(C[0], 19.f); EXPECT_EQ(C[1], 22.f); EXPECT_EQ(C[2], 43.f); EXPECT_EQ(C[3], 50.f);
}

TEST(Gemm, BitIdenticalForOneAndTwoThreads) {
  // wgrad-like shape: small output, long contraction over tokens.
  for (Shape s : {Shape{256, 256, 4096, true, false}, Shape{1000, 300, 256, false, true}}) {
    auto A = randn(s.M * s.K, 4), B = randn(s.K * s.N, 5);
    const int64_t lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
    std::vector<float> C1(s.M * s.N), C2(s.M * s.N);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    fp4::sgemm(s.ta, s.tb, s.M, s.N, s.K, 1.f, A.data(), lda, B.data(), ldb, 0.f, C1.data(), s.N);
    omp_set_num_threads(2);
    fp4::sgemm(s.ta, s.tb, s.M, s.N, s.K, 1.f, A.data(), lda, B.data(), ldb, 0.f, C2.data(), s.N);
    omp_set_num_threads(saved);
    ASSERT_EQ(0, std::memcmp(C1.data(), C2.data(), C1.size() * sizeof(float)));
  }
}
}  // namespace
