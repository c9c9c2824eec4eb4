// FP32 GEMM backend over oneDNN's sgemm, made thread-count independent by fixed tiling.
#include "fp4/gemm.h"

#include <dnnl.h>
#include <omp.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace fp4 {
namespace {
// Output tile shape. Fixed (never derived from the thread count), so each output element
// is computed by exactly one single-threaded oneDNN call over the full K: its summation
// order is the same for 1, 2 or 64 threads.
constexpr int64_t kTileM = 128;
constexpr int64_t kTileN = 512;

inline const float* at(const float* p, bool trans, int64_t r, int64_t c, int64_t ld) {
  // Element (r, c) of op(P) where op(P) = P or Pᵀ; returns the base pointer of a sub-block.
  return trans ? p + c * ld + r : p + r * ld + c;
}
}  // namespace

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
           const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
           int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  const int64_t tm = (M + kTileM - 1) / kTileM, tn = (N + kTileN - 1) / kTileN;
  const int64_t tiles = tm * tn;
  int failures = 0;
  dnnl_status_t first_error = dnnl_success;
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : failures)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t i0 = (t / tn) * kTileM, j0 = (t % tn) * kTileN;
    const int64_t mb = std::min(kTileM, M - i0), nb = std::min(kTileN, N - j0);
    // Sub-block of op(A) rows i0.., all K; of op(B) all K, cols j0..
    const float* a = at(A, trans_a, i0, 0, lda);
    const float* b = at(B, trans_b, 0, j0, ldb);
    dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', mb, nb, K, alpha, a,
                                  lda, b, ldb, beta, C + i0 * ldc + j0, ldc);
    if (st != dnnl_success) {
      ++failures;
#pragma omp critical
      first_error = st;
    }
  }
  if (failures)
    throw std::runtime_error("oneDNN sgemm failed with status " + std::to_string(first_error) +
                             " (M=" + std::to_string(M) + ", N=" + std::to_string(N) +
                             ", K=" + std::to_string(K) + ")");
}

void sgemm_ref(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
               int64_t ldc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k)
        s += double(*at(A, trans_a, i, k, lda)) * double(*at(B, trans_b, k, j, ldb));
      const double prev = beta == 0.f ? 0.0 : double(beta) * C[i * ldc + j];
      C[i * ldc + j] = float(double(alpha) * s + prev);
    }
}

}  // namespace fp4
