// Non-linear decoder layers (see fp4/nn/layers.h): embedding, RMSNorm, RoPE, squared ReLU,
// SwiGLU and softmax cross-entropy. Attention lives in attention.cpp.
//
// Determinism: per-token work is parallelised over rows (each row is computed by one thread
// in a fixed order). Reductions over tokens (dweight of RMSNorm, dwte of the embedding) are
// parallelised over channel chunks, each chunk summing tokens in ascending order, and the
// cross-entropy mean is a serial double sum in row order — so results do not depend on the
// number of OpenMP threads.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "fp4/nn/layers.h"

namespace fp4::nn {
namespace {

constexpr int64_t kChunk = 64;  // channels per task in token reductions
// Loops with less work (in elements) than this run on the calling thread only: waking a
// thread team costs more than it saves, and a busy machine makes it far worse. Results
// do not depend on it.
constexpr int64_t kParallelMin = int64_t{1} << 15;

// Throws std::out_of_range if any ids[i] is outside [0, V) (V < 0: only checks ≥ 0).
void check_ids(const int32_t* ids, int64_t n, int64_t V, const char* fn, const char* what) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = ids[i];
    if (id < 0 || (V >= 0 && id >= V))
      throw std::out_of_range(std::string(fn) + ": " + what + "[" + std::to_string(i) +
                              "] = " + std::to_string(id) + " is outside [0, " +
                              (V >= 0 ? std::to_string(V) : std::string("V")) + ")");
  }
}

}  // namespace

// ---------------------------------------------------------------- embedding
void embedding_forward(float* out, const int32_t* tokens, const float* wte, int64_t BT,
                       int64_t C, int64_t V) {
  check_ids(tokens, BT, V, "embedding_forward", "tokens");
#pragma omp parallel for schedule(static) if (BT * C >= kParallelMin)
  for (int64_t t = 0; t < BT; ++t) {
    const float* src = wte + static_cast<int64_t>(tokens[t]) * C;
    std::copy(src, src + C, out + t * C);
  }
}

// dwte[tokens[t], c] += dout[t, c]; parallel over channel chunks, tokens in ascending order,
// so repeated tokens are summed in a fixed order.
void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int64_t BT,
                        int64_t C) {
  check_ids(tokens, BT, -1, "embedding_backward", "tokens");
  const int64_t nchunks = (C + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (BT * C >= kParallelMin)
  for (int64_t ch = 0; ch < nchunks; ++ch) {
    const int64_t c0 = ch * kChunk, c1 = std::min(C, c0 + kChunk);
    for (int64_t t = 0; t < BT; ++t) {
      float* dst = dwte + static_cast<int64_t>(tokens[t]) * C;
      const float* g = dout + t * C;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) dst[c] += g[c];
    }
  }
}

// ---------------------------------------------------------------- RMSNorm
// rstd = 1 / sqrt(mean_c(x²) + eps) (sum of squares in double), out = x · rstd · w.
void rmsnorm_forward(float* out, float* rstd, const float* x, const float* weight,
                     int64_t BT, int64_t C, float eps) {
#pragma omp parallel for schedule(static) if (BT * C >= kParallelMin)
  for (int64_t t = 0; t < BT; ++t) {
    const float* xr = x + t * C;
    double ss = 0.0;
    for (int64_t c = 0; c < C; ++c) ss += static_cast<double>(xr[c]) * xr[c];
    const float r = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(C) + eps));
    rstd[t] = r;
    float* o = out + t * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] = xr[c] * r * weight[c];
  }
}

// With y_c = x_c · r · w_c and r = (mean(x²) + eps)^(−1/2), ∂r/∂x_c = −r³ x_c / C, so
//   dx_c += r · (w_c dout_c − x_c · r² · (Σ_j w_j dout_j x_j) / C)
//   dw_c += Σ_t dout[t, c] · x[t, c] · r_t
void rmsnorm_backward(float* dx, float* dweight, const float* dout, const float* x,
                      const float* weight, const float* rstd, int64_t BT, int64_t C) {
#pragma omp parallel for schedule(static) if (BT * C >= kParallelMin)
  for (int64_t t = 0; t < BT; ++t) {
    const float* xr = x + t * C;
    const float* g = dout + t * C;
    const float r = rstd[t];
    double dot = 0.0;
    for (int64_t c = 0; c < C; ++c)
      dot += static_cast<double>(weight[c]) * g[c] * static_cast<double>(xr[c]);
    const float k = static_cast<float>(dot * r * r / static_cast<double>(C));
    float* d = dx + t * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) d[c] += r * (weight[c] * g[c] - xr[c] * k);
  }
  const int64_t nchunks = (C + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (BT * C >= kParallelMin)
  for (int64_t ch = 0; ch < nchunks; ++ch) {
    const int64_t c0 = ch * kChunk, n = std::min(C, c0 + kChunk) - c0;
    float acc[kChunk] = {};
    for (int64_t t = 0; t < BT; ++t) {
      const float* g = dout + t * C + c0;
      const float* xr = x + t * C + c0;
      const float r = rstd[t];
#pragma omp simd
      for (int64_t c = 0; c < n; ++c) acc[c] += g[c] * xr[c] * r;
    }
    for (int64_t c = 0; c < n; ++c) dweight[c0 + c] += acc[c];
  }
}

// ---------------------------------------------------------------- RoPE
namespace {
void check_rope(int64_t hd, const char* fn) {
  if (hd <= 0 || hd % 2 != 0)
    throw std::invalid_argument(std::string(fn) + ": head dim must be even and > 0 (got " +
                                std::to_string(hd) + ")");
}
// cos/sin table [T, hd/2]: angle = t · theta^(−2i/hd), evaluated in double.
void rope_table(std::vector<float>& cs, std::vector<float>& sn, int64_t T, int64_t hd,
                float theta) {
  const int64_t half = hd / 2;
  cs.resize(static_cast<size_t>(T * half));
  sn.resize(static_cast<size_t>(T * half));
  for (int64_t i = 0; i < half; ++i) {
    const double inv_freq =
        std::pow(static_cast<double>(theta), -2.0 * static_cast<double>(i) / static_cast<double>(hd));
    for (int64_t t = 0; t < T; ++t) {
      const double a = static_cast<double>(t) * inv_freq;
      cs[t * half + i] = static_cast<float>(std::cos(a));
      sn[t * half + i] = static_cast<float>(std::sin(a));
    }
  }
}
}  // namespace

namespace {
// Rotate every pair (x0, x1) by +angle (forward) or −angle (backward, the transpose):
// (x0, x1) ← (x0 cos − x1 sin', x0 sin' + x1 cos) with sin' = ±sin. Negating sin is exact,
// so backward equals (d0 cos + d1 sin, d1 cos − d0 sin) bit for bit.
void rope_rotate(float* x, int64_t B, int64_t T, int64_t H, int64_t hd, float theta,
                 bool inverse, const char* fn) {
  check_rope(hd, fn);
  std::vector<float> cs, sn;
  rope_table(cs, sn, T, hd, theta);
  if (inverse)
    for (float& v : sn) v = -v;
  const int64_t half = hd / 2;
#pragma omp parallel for schedule(static) if (B * T * H * hd >= kParallelMin)
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const int64_t t = bt % T;
    const float* c = cs.data() + t * half;
    const float* s = sn.data() + t * half;
    for (int64_t h = 0; h < H; ++h) {
      float* p = x + (bt * H + h) * hd;
      for (int64_t i = 0; i < half; ++i) {
        const float x0 = p[2 * i], x1 = p[2 * i + 1];
        p[2 * i] = x0 * c[i] - x1 * s[i];
        p[2 * i + 1] = x0 * s[i] + x1 * c[i];
      }
    }
  }
}
}  // namespace

void rope_forward(float* x, int64_t B, int64_t T, int64_t H, int64_t hd, float theta) {
  rope_rotate(x, B, T, H, hd, theta, false, "rope_forward");
}

void rope_backward(float* dx, int64_t B, int64_t T, int64_t H, int64_t hd, float theta) {
  rope_rotate(dx, B, T, H, hd, theta, true, "rope_backward");
}

// ---------------------------------------------------------------- squared ReLU
// out = max(x, 0)², dx += dout · 2 · max(x, 0)
void squared_relu_forward(float* out, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float r = x[i] > 0.0f ? x[i] : 0.0f;
    out[i] = r * r;
  }
}

void squared_relu_backward(float* dx, const float* dout, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float r = x[i] > 0.0f ? x[i] : 0.0f;
    dx[i] += dout[i] * (2.0f * r);
  }
}

// ---------------------------------------------------------------- SwiGLU
// σ(g) = 1 / (1 + e^(−g)), silu(g) = g σ(g), out = silu(g) · u.
// d silu/dg = σ(g) (1 + g (1 − σ(g))), so dg += dout · u · σ (1 + g (1 − σ)), du += dout · silu(g).
void swiglu_forward(float* out, const float* x, int64_t BT, int64_t F) {
#pragma omp parallel for schedule(static) if (BT * F >= kParallelMin)
  for (int64_t t = 0; t < BT; ++t) {
    const float* g = x + t * 2 * F;
    const float* u = g + F;
    float* o = out + t * F;
    for (int64_t i = 0; i < F; ++i) {
      const float s = 1.0f / (1.0f + std::exp(-g[i]));
      o[i] = g[i] * s * u[i];
    }
  }
}

void swiglu_backward(float* dx, const float* dout, const float* x, int64_t BT, int64_t F) {
#pragma omp parallel for schedule(static) if (BT * F >= kParallelMin)
  for (int64_t t = 0; t < BT; ++t) {
    const float* g = x + t * 2 * F;
    const float* u = g + F;
    const float* d = dout + t * F;
    float* dg = dx + t * 2 * F;
    float* du = dg + F;
    for (int64_t i = 0; i < F; ++i) {
      const float s = 1.0f / (1.0f + std::exp(-g[i]));
      const float silu = g[i] * s;
      dg[i] += d[i] * u[i] * (s * (1.0f + g[i] * (1.0f - s)));
      du[i] += d[i] * silu;
    }
  }
}

// ---------------------------------------------------------------- cross-entropy
// loss_t = logsumexp(z_t) − z_t[y_t] with logsumexp(z) = m + log Σ_v exp(z_v − m), m = max z;
// the exponentials are summed in double, the mean is a serial double sum over rows.
double cross_entropy_forward(float* losses, const float* logits, const int32_t* targets,
                             int64_t BT, int64_t V) {
  check_ids(targets, BT, V, "cross_entropy_forward", "targets");
  if (BT <= 0) return 0.0;
  std::vector<double> row(static_cast<size_t>(BT));
#pragma omp parallel for schedule(static) if (BT * V >= kParallelMin)
  for (int64_t t = 0; t < BT; ++t) {
    const float* z = logits + t * V;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t v = 0; v < V; ++v) m = std::max(m, z[v]);
    double sum = 0.0;
    for (int64_t v = 0; v < V; ++v) sum += static_cast<double>(std::exp(z[v] - m));
    row[t] = static_cast<double>(m) + std::log(sum) - static_cast<double>(z[targets[t]]);
  }
  double total = 0.0;
  for (int64_t t = 0; t < BT; ++t) {
    total += row[t];
    if (losses) losses[t] = static_cast<float>(row[t]);
  }
  return total / static_cast<double>(BT);
}

// dz_t = (softmax(z_t) − onehot(y_t)) · scale, softmax(z)_v = exp(z_v − m) / Σ exp(z − m).
void cross_entropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                            int64_t BT, int64_t V, float scale) {
  check_ids(targets, BT, V, "cross_entropy_backward", "targets");
#pragma omp parallel for schedule(static) if (BT * V >= kParallelMin)
  for (int64_t t = 0; t < BT; ++t) {
    const float* z = logits + t * V;
    float* dz = dlogits + t * V;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t v = 0; v < V; ++v) m = std::max(m, z[v]);
    double sum = 0.0;
    for (int64_t v = 0; v < V; ++v) {
      const float e = std::exp(z[v] - m);
      dz[v] = e;
      sum += static_cast<double>(e);
    }
    const float inv = static_cast<float>(1.0 / sum);
    const int64_t y = targets[t];
    const float py = dz[y] * inv;
#pragma omp simd
    for (int64_t v = 0; v < V; ++v) dz[v] = dz[v] * inv * scale;
    dz[y] = (py - 1.0f) * scale;
  }
}

}  // namespace fp4::nn
