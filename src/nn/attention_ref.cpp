// Scalar reference twin of the causal attention kernels in attention.cpp (see
// fp4/nn/layers.h, fp4::nn::detail::attention_forward_ref / attention_backward_ref).
//
// Straightforward loops over (b, h, i, j, c): no vector types, no OpenMP, no padded
// buffers. Each FP32 value is produced by exactly the operations the vector kernels use, in
// the same order, so the AVX-512, AVX2 and SSE2 builds must match this file bit for bit:
//  * every dot product / matrix-product entry is a sum that starts at +0.0f and adds one
//    separately rounded product per step, with the reduction index ascending (the
//    micro-kernel's k loop; the project builds with -ffp-contract=off, so no FMA);
//  * the 1/sqrt(hd) scale multiplies the finished score (forward) and the finished
//    P·(dP − dot) product (backward), exactly where the kernel does;
//  * the softmax is max (std::max, from −inf), then exp(s − m) and the running sum in one
//    ascending pass, then a multiply by 1/sum;
//  * sums restricted to the causal range: the kernel never adds a masked (j > i) term (see
//    the triangular tails of micro() in attention.cpp), so none appear here either.
// Keep this file in sync with attention.cpp; tests/test_attention_twin.cpp compares them.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "fp4/nn/layers.h"

namespace fp4::nn::detail {
namespace {

void check_dims(int64_t T, int64_t C, int64_t H, const char* fn) {
  if (T <= 0 || C <= 0 || H <= 0 || C % H != 0)
    throw std::invalid_argument(std::string(fn) + ": need T, C, H > 0 and C % H == 0 (got T=" +
                                std::to_string(T) + ", C=" + std::to_string(C) +
                                ", H=" + std::to_string(H) + ")");
}

}  // namespace

void attention_forward_ref(float* out, float* att, const float* q, const float* k,
                           const float* v, int64_t B, int64_t T, int64_t C, int64_t H) {
  if (B <= 0) return;
  check_dims(T, C, H, "attention_forward_ref");
  const int64_t hd = C / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t off = b * T * C + h * hd;  // head h, token 0 of batch b
      const float* Q = q + off;
      const float* K = k + off;
      const float* V = v + off;
      float* O = out + off;
      float* P = att + (b * H + h) * T * T;
      for (int64_t i = 0; i < T; ++i) {
        float* p = P + i * T;
        // Scores s[j] = (q_i · k_j) · scale, kept in the att row.
        for (int64_t j = 0; j <= i; ++j) {
          float acc = 0.0f;
          for (int64_t c = 0; c < hd; ++c) acc += Q[i * C + c] * K[j * C + c];
          p[j] = acc;
        }
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j <= i; ++j) {
          p[j] *= scale;
          m = std::max(m, p[j]);
        }
        float sum = 0.0f;
        for (int64_t j = 0; j <= i; ++j) {
          p[j] = std::exp(p[j] - m);
          sum += p[j];
        }
        const float inv = 1.0f / sum;
        for (int64_t j = 0; j <= i; ++j) p[j] *= inv;
        for (int64_t j = i + 1; j < T; ++j) p[j] = 0.0f;
        // out_i = Σ_{j ≤ i} p[j] v_j.
        for (int64_t c = 0; c < hd; ++c) {
          float acc = 0.0f;
          for (int64_t j = 0; j <= i; ++j) acc += p[j] * V[j * C + c];
          O[i * C + c] = acc;
        }
      }
    }
}

void attention_backward_ref(float* dq, float* dk, float* dv, float* scratch,
                            const float* dout, const float* q, const float* k,
                            const float* v, const float* att, int64_t B, int64_t T, int64_t C,
                            int64_t H) {
  if (B <= 0) return;
  check_dims(T, C, H, "attention_backward_ref");
  const int64_t hd = C / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t off = b * T * C + h * hd;
      const float* Q = q + off;
      const float* K = k + off;
      const float* V = v + off;
      const float* dO = dout + off;
      float* dQ = dq + off;
      float* dK = dk + off;
      float* dV = dv + off;
      const float* P = att + (b * H + h) * T * T;
      float* dS = scratch + (b * H + h) * T * T;

      // dS row by row: dp[j] = dO_i · v_j, then the softmax Jacobian times scale.
      for (int64_t i = 0; i < T; ++i) {
        const float* p = P + i * T;
        float* g = dS + i * T;
        for (int64_t j = 0; j <= i; ++j) {
          float acc = 0.0f;
          for (int64_t c = 0; c < hd; ++c) acc += dO[i * C + c] * V[j * C + c];
          g[j] = acc;
        }
        float dot = 0.0f;
        for (int64_t j = 0; j <= i; ++j) dot += p[j] * g[j];
        for (int64_t j = 0; j <= i; ++j) g[j] = p[j] * (g[j] - dot) * scale;
        for (int64_t j = i + 1; j < T; ++j) g[j] = 0.0f;
      }

      // dq_i += Σ_{j=0}^{i} dS[i, j] k_j.
      for (int64_t i = 0; i < T; ++i)
        for (int64_t c = 0; c < hd; ++c) {
          float acc = 0.0f;
          for (int64_t j = 0; j <= i; ++j) acc += dS[i * T + j] * K[j * C + c];
          dQ[i * C + c] += acc;
        }
      // dk_j += Σ_{i=j}^{T−1} dS[i, j] q_i and dv_j += Σ_{i=j}^{T−1} P[i, j] dout_i.
      for (int64_t j = 0; j < T; ++j)
        for (int64_t c = 0; c < hd; ++c) {
          float acc_k = 0.0f, acc_v = 0.0f;
          for (int64_t i = j; i < T; ++i) {
            acc_k += dS[i * T + j] * Q[i * C + c];
            acc_v += P[i * T + j] * dO[i * C + c];
          }
          dK[j * C + c] += acc_k;
          dV[j * C + c] += acc_v;
        }
    }
}

}  // namespace fp4::nn::detail
