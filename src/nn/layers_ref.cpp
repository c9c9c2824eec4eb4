// Scalar reference twins of the layer kernels in layers_fast.cpp (see fp4/nn/layers.h,
// fp4::nn::detail::*_ref). Plain loops: no vector types, no OpenMP, no caches. Each value is
// produced by exactly the FP32/FP64 operations of the fast kernels, in the same order:
//  * every sum is the canonical sum (layers_internal.h): FP32 partials p[i mod 16] within
//    chunks of 1024 terms, combined by tree16, chunk sums added in double, superchunk sums
//    (2^18 terms) added in double;
//  * sum_squares_ref rescales by a power of two where the FP32 sum overflows, as
//    sum_squares (layers_internal.h, "sum of squares");
//  * exp is internal::exp_scalar (the vector ExpV repeats its operations lane-wise);
//  * elementwise formulas are parenthesised exactly as the vector code evaluates them.
// Keep this file in sync with layers_fast.cpp; tests/nn/test_layers_twin.cpp compares them.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "fp4/nn/layers.h"
#include "layers_internal.h"

namespace fp4::nn::detail {
namespace {

using internal::exp_scalar;
using internal::kSumChunk;
using internal::kSuperChunk;
using internal::tree16;

/// Canonical sum of term(i), i < n (see layers_internal.h).
template <class Term>
double canon_sum_ref(int64_t n, Term term) {
  double total = 0.0;
  for (int64_t s0 = 0; s0 < n; s0 += kSuperChunk) {
    const int64_t s1 = std::min(n, s0 + kSuperChunk);
    double sup = 0.0;
    for (int64_t c0 = s0; c0 < s1; c0 += kSumChunk) {
      const int64_t c1 = std::min(s1, c0 + kSumChunk);
      float p[16];
      for (float& x : p) x = 0.0f;
      for (int64_t i = c0; i < c1; ++i) p[i % 16] += term(i);
      sup += static_cast<double>(tree16(p));
    }
    total += sup;
  }
  return total;
}

float row_max(const float* z, int64_t V) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t v = 0; v < V; ++v) m = std::max(m, z[v]);
  return m + 0.0f;  // −0 → +0
}

void rope_ref(float* x, int64_t B, int64_t T, int64_t H, int64_t hd, float theta, bool bwd,
              const char* fn) {
  internal::check_rope(hd, fn);
  internal::RopeTable tb;
  internal::build_rope_table(tb, T, hd, theta);
  const std::vector<float>& sn = bwd ? tb.sin_bwd : tb.sin_fwd;
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const int64_t t = bt % T;
    const float* c = tb.cos2.data() + t * hd;
    const float* s = sn.data() + t * hd;
    for (int64_t h = 0; h < H; ++h) {
      float* p = x + (bt * H + h) * hd;
      for (int64_t j = 0; j < hd; j += 2) {
        const float x0 = p[j], x1 = p[j + 1];
        p[j] = x0 * c[j] + x1 * s[j];
        p[j + 1] = x1 * c[j + 1] + x0 * s[j + 1];
      }
    }
  }
}

}  // namespace

float exp_ref(float x) { return exp_scalar(x); }

void rmsnorm_forward_ref(float* out, float* rstd, const float* x, const float* weight,
                         int64_t BT, int64_t C, float eps) {
  for (int64_t t = 0; t < BT; ++t) {
    const float* xr = x + t * C;
    const double ss = canon_sum_ref(C, [&](int64_t c) { return xr[c] * xr[c]; });
    const float r = static_cast<float>(
        1.0 / std::sqrt(ss / static_cast<double>(C) + static_cast<double>(eps)));
    rstd[t] = r;
    float* o = out + t * C;
    for (int64_t c = 0; c < C; ++c) o[c] = (xr[c] * r) * weight[c];
  }
}

void rmsnorm_backward_ref(float* dx, float* dweight, const float* dout, const float* x,
                          const float* weight, const float* rstd, int64_t BT, int64_t C) {
  for (int64_t t = 0; t < BT; ++t) {
    const float* xr = x + t * C;
    const float* g = dout + t * C;
    const float r = rstd[t];
    const double dot =
        canon_sum_ref(C, [&](int64_t c) { return (weight[c] * g[c]) * xr[c]; });
    const float k = static_cast<float>(dot * static_cast<double>(r) * static_cast<double>(r) /
                                       static_cast<double>(C));
    float* d = dx + t * C;
    for (int64_t c = 0; c < C; ++c) d[c] += r * (weight[c] * g[c] - xr[c] * k);
  }
  for (int64_t c = 0; c < C; ++c) {
    float acc = 0.0f;
    for (int64_t t = 0; t < BT; ++t) acc += (dout[t * C + c] * x[t * C + c]) * rstd[t];
    dweight[c] += acc;
  }
}

void rope_forward_ref(float* x, int64_t B, int64_t T, int64_t H, int64_t hd, float theta) {
  rope_ref(x, B, T, H, hd, theta, false, "rope_forward_ref");
}

void rope_backward_ref(float* dx, int64_t B, int64_t T, int64_t H, int64_t hd, float theta) {
  rope_ref(dx, B, T, H, hd, theta, true, "rope_backward_ref");
}

void squared_relu_forward_ref(float* out, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float r = x[i] > 0.0f ? x[i] : 0.0f;
    out[i] = r * r;
  }
}

void squared_relu_backward_ref(float* dx, const float* dout, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float r = x[i] > 0.0f ? x[i] : 0.0f;
    dx[i] += dout[i] * (2.0f * r);
  }
}

void swiglu_forward_ref(float* out, const float* x, int64_t BT, int64_t F) {
  for (int64_t t = 0; t < BT; ++t) {
    const float* g = x + t * 2 * F;
    const float* u = g + F;
    float* o = out + t * F;
    for (int64_t i = 0; i < F; ++i) {
      const float s = 1.0f / (1.0f + exp_scalar(-g[i]));
      o[i] = (g[i] * s) * u[i];
    }
  }
}

void swiglu_backward_ref(float* dx, const float* dout, const float* x, int64_t BT, int64_t F) {
  for (int64_t t = 0; t < BT; ++t) {
    const float* g = x + t * 2 * F;
    const float* u = g + F;
    const float* d = dout + t * F;
    float* dg = dx + t * 2 * F;
    float* du = dg + F;
    for (int64_t i = 0; i < F; ++i) {
      const float s = 1.0f / (1.0f + exp_scalar(-g[i]));
      const float silu = g[i] * s;
      dg[i] += (d[i] * u[i]) * (s * (1.0f + g[i] * (1.0f - s)));
      du[i] += d[i] * silu;
    }
  }
}

double cross_entropy_forward_ref(float* losses, const float* logits, const int32_t* targets,
                                 int64_t BT, int64_t V) {
  internal::check_ids(targets, BT, V, "cross_entropy_forward_ref", "targets");
  if (BT <= 0) return 0.0;
  double total = 0.0;
  for (int64_t t = 0; t < BT; ++t) {
    const float* z = logits + t * V;
    const float m = row_max(z, V);
    const double sum = canon_sum_ref(V, [&](int64_t v) { return exp_scalar(z[v] - m); });
    const double loss =
        static_cast<double>(m) + std::log(sum) - static_cast<double>(z[targets[t]]);
    total += loss;
    if (losses) losses[t] = static_cast<float>(loss);
  }
  return total / static_cast<double>(BT);
}

void cross_entropy_backward_ref(float* dlogits, const float* logits, const int32_t* targets,
                                int64_t BT, int64_t V, float scale) {
  internal::check_ids(targets, BT, V, "cross_entropy_backward_ref", "targets");
  for (int64_t t = 0; t < BT; ++t) {
    const float* z = logits + t * V;
    float* dz = dlogits + t * V;
    const float m = row_max(z, V);
    const double sum = canon_sum_ref(V, [&](int64_t v) {
      const float e = exp_scalar(z[v] - m);
      dz[v] = e;
      return e;
    });
    const float inv = static_cast<float>(1.0 / sum);
    const int64_t y = targets[t];
    const float py = dz[y] * inv;
    for (int64_t v = 0; v < V; ++v) dz[v] = (dz[v] * inv) * scale;
    dz[y] = (py - 1.0f) * scale;
  }
}

void residual_add_ref(float* x, const float* r, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += r[i];
}

void adamw_update_ref(float* w, const float* g, float* m, float* v, int64_t n,
                      const AdamWCoeffs& k) {
  for (int64_t i = 0; i < n; ++i) {
    m[i] = k.b1 * m[i] + k.omb1 * g[i];
    v[i] = k.b2 * v[i] + (k.omb2 * g[i]) * g[i];
    const float mh = m[i] / k.bc1, vh = v[i] / k.bc2;
    w[i] = w[i] - k.lr * (mh / (std::sqrt(vh) + k.eps) + k.wd * w[i]);
  }
}

double sum_squares_ref(const float* g, int64_t n) {
  if (n <= 0) return 0.0;
  const double s = canon_sum_ref(n, [&](int64_t i) {
    const float t = g[i] * 1.0f;
    return t * t;
  });
  if (s != std::numeric_limits<double>::infinity()) return s;
  const int k = internal::sumsq_rescale_exponent(g, n);  // FP32 overflow: rescale by 2^−k
  if (k < 0) return s;                                   // a ±Inf entry
  const float sc = std::ldexp(1.0f, -k);
  return std::ldexp(canon_sum_ref(n, [&](int64_t i) {
                      const float t = g[i] * sc;
                      return t * t;
                    }),
                    2 * k);
}

void scale_inplace_ref(float* g, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) g[i] = g[i] * s;
}

}  // namespace fp4::nn::detail
