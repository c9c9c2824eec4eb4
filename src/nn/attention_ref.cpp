// Scalar reference twin of the causal attention kernels in attention.cpp (see
// fp4/nn/layers.h, fp4::nn::detail::attention_forward_ref / attention_backward_ref).
//
// Straightforward loops over (b, h, i, j, c), h the query head (its KV head is h / (H / Hkv);
// q, out rows have stride H·hd, k, v rows Hkv·hd): no vector types, no OpenMP, no padded
// buffers. Each FP32 value is produced by exactly the operations the vector kernels use, in
// the same order, so the AVX-512, AVX2 and SSE2 builds must match this file bit for bit:
//  * every dot product / matrix-product entry is acc = std::fma(a, b, acc) from +0.0f with
//    the reduction index ascending over the whole range (the micro-kernel's k loop, one
//    fused multiply-add per term, explicitly: the project builds with -ffp-contract=off);
//  * the 1/sqrt(hd) scale multiplies the finished score (forward) and the finished
//    P·(dP − dot) product (backward), exactly where the kernel does;
//  * the softmax row reductions use 16 partials, term j going to partial j mod 16 with j
//    ascending, combined by a fixed pairwise tree: the max partials start at −inf and take
//    x when x > partial (max_tree16 below, the same select), the sum partials start at +0
//    and add exp(s − m) (internal::exp_scalar, the project's multiply/add-only expf), and
//    are combined by internal::tree16; then every e[j] is multiplied by 1/sum;
//  * the backward row dot Σ_j p[j]·dp[j] uses 16 fma partials (j mod 16) and tree16;
//  * grouped-query attention: dk/dv of a KV head receive one finished fma chain per query
//    head of its group, added in ascending h (the (b, h) loop order below), which is the
//    order in which the kernel's thread for (b, KV head) runs the group's heads;
//  * sums restricted to the causal range: the kernel never adds a masked (j > i) term (see
//    the triangular tails of micro() in attention.cpp), so none appear here either.
// Keep this file in sync with attention.cpp; tests/nn/test_attention_twin.cpp compares them.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "fp4/nn/layers.h"
#include "layers_internal.h"

namespace fp4::nn::detail {
namespace {

// As attention.cpp: max of 16 partials by a fixed tree with mx(a, b) = b > a ? b : a.
float max_tree16(float* p) {
  auto mx = [](float a, float b) { return b > a ? b : a; };
  for (int i = 0; i < 8; ++i) p[i] = mx(p[i], p[i + 8]);
  for (int i = 0; i < 4; ++i) p[i] = mx(p[i], p[i + 4]);
  for (int i = 0; i < 2; ++i) p[i] = mx(p[i], p[i + 2]);
  return mx(p[0], p[1]);
}

}  // namespace

void attention_forward_ref(float* out, float* att, const float* q, const float* k,
                           const float* v, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                           int64_t hd) {
  if (B <= 0) return;
  internal::check_attention_dims(T, H, Hkv, hd, "attention_forward_ref");
  const int64_t G = H / Hkv, C = H * hd, Ckv = Hkv * hd;  // row strides of q/out and k/v
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t off = b * T * C + h * hd;              // query head h, token 0 of batch b
      const int64_t offkv = b * T * Ckv + (h / G) * hd;    // its KV head
      const float* Q = q + off;
      const float* K = k + offkv;
      const float* V = v + offkv;
      float* O = out + off;
      float* P = att + (b * H + h) * T * T;
      for (int64_t i = 0; i < T; ++i) {
        float* p = P + i * T;
        // Scores s[j] = (q_i · k_j) · scale, kept in the att row.
        for (int64_t j = 0; j <= i; ++j) {
          float acc = 0.0f;
          for (int64_t c = 0; c < hd; ++c) acc = std::fma(Q[i * C + c], K[j * Ckv + c], acc);
          p[j] = acc;
        }
        float part[16];
        std::fill(part, part + 16, -std::numeric_limits<float>::infinity());
        for (int64_t j = 0; j <= i; ++j) {
          p[j] *= scale;
          float& mp = part[j % 16];
          mp = p[j] > mp ? p[j] : mp;
        }
        const float m = max_tree16(part);
        std::fill(part, part + 16, 0.0f);
        for (int64_t j = 0; j <= i; ++j) {
          p[j] = internal::exp_scalar(p[j] - m);
          part[j % 16] += p[j];
        }
        const float inv = 1.0f / internal::tree16(part);
        for (int64_t j = 0; j <= i; ++j) p[j] *= inv;
        for (int64_t j = i + 1; j < T; ++j) p[j] = 0.0f;
        // out_i = Σ_{j ≤ i} p[j] v_j.
        for (int64_t c = 0; c < hd; ++c) {
          float acc = 0.0f;
          for (int64_t j = 0; j <= i; ++j) acc = std::fma(p[j], V[j * Ckv + c], acc);
          O[i * C + c] = acc;
        }
      }
    }
}

void attention_backward_ref(float* dq, float* dk, float* dv, float* scratch,
                            const float* dout, const float* q, const float* k,
                            const float* v, const float* att, int64_t B, int64_t T, int64_t H,
                            int64_t Hkv, int64_t hd) {
  if (B <= 0) return;
  internal::check_attention_dims(T, H, Hkv, hd, "attention_backward_ref");
  const int64_t G = H / Hkv, C = H * hd, Ckv = Hkv * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {  // h ascending: the group order of dk/dv (see top)
      const int64_t off = b * T * C + h * hd;
      const int64_t offkv = b * T * Ckv + (h / G) * hd;
      const float* Q = q + off;
      const float* K = k + offkv;
      const float* V = v + offkv;
      const float* dO = dout + off;
      float* dQ = dq + off;
      float* dK = dk + offkv;
      float* dV = dv + offkv;
      const float* P = att + (b * H + h) * T * T;
      float* dS = scratch + (b * H + h) * T * T;

      // dS row by row: dp[j] = dO_i · v_j, then the softmax Jacobian times scale.
      for (int64_t i = 0; i < T; ++i) {
        const float* p = P + i * T;
        float* g = dS + i * T;
        for (int64_t j = 0; j <= i; ++j) {
          float acc = 0.0f;
          for (int64_t c = 0; c < hd; ++c) acc = std::fma(dO[i * C + c], V[j * Ckv + c], acc);
          g[j] = acc;
        }
        float part[16] = {};
        for (int64_t j = 0; j <= i; ++j) part[j % 16] = std::fma(p[j], g[j], part[j % 16]);
        const float dot = internal::tree16(part);
        for (int64_t j = 0; j <= i; ++j) g[j] = p[j] * (g[j] - dot) * scale;
        for (int64_t j = i + 1; j < T; ++j) g[j] = 0.0f;
      }

      // dq_i += Σ_{j=0}^{i} dS[i, j] k_j.
      for (int64_t i = 0; i < T; ++i)
        for (int64_t c = 0; c < hd; ++c) {
          float acc = 0.0f;
          for (int64_t j = 0; j <= i; ++j) acc = std::fma(dS[i * T + j], K[j * Ckv + c], acc);
          dQ[i * C + c] += acc;
        }
      // dk_j += Σ_{i=j}^{T−1} dS[i, j] q_i and dv_j += Σ_{i=j}^{T−1} P[i, j] dout_i.
      for (int64_t j = 0; j < T; ++j)
        for (int64_t c = 0; c < hd; ++c) {
          float acc_k = 0.0f, acc_v = 0.0f;
          for (int64_t i = j; i < T; ++i) {
            acc_k = std::fma(dS[i * T + j], Q[i * C + c], acc_k);
            acc_v = std::fma(P[i * T + j], dO[i * C + c], acc_v);
          }
          dK[j * Ckv + c] += acc_k;
          dV[j * Ckv + c] += acc_v;
        }
    }
}

}  // namespace fp4::nn::detail
