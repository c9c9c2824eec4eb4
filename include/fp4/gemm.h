// FP32 GEMM backend (oneDNN). Deterministic: the result does not depend on the thread count.
#pragma once
#include <cstdint>

namespace fp4 {

/// Row-major C[M,N] = alpha · op(A) · op(B) + beta · C, op(A) = A [M,K] or Aᵀ (A stored [K,M]),
/// op(B) = B [K,N] or Bᵀ (B stored [N,K]); lda/ldb/ldc are row strides in elements.
/// Runs oneDNN's single-threaded sgemm on fixed output tiles in an OpenMP loop, so the
/// per-element accumulation order is independent of thread count.
/// Throws std::runtime_error if oneDNN reports an error.
void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
           const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
           int64_t ldc);

/// Naive reference of sgemm accumulating in double, for tests.
void sgemm_ref(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
               int64_t ldc);

}  // namespace fp4
