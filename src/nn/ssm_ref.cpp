// Scalar reference twins of the Mamba-2 kernels (see fp4/nn/ssm.h), the plain sequential
// SSD recurrence in FP64, and the drivers shared by both builds.
//
// The twins compile ssm_body.inc with the plain scalar primitives below: mm is a triple loop
// (acc = std::fma(A, B, acc) from +0, k ascending over the row's range), map a loop applying the
// formula to floats, dot the canonical sum (layers_internal.h), ex internal::exp_scalar.
// The twins run every unit on the calling thread (no OpenMP) in unit order. Keep in sync
// with ssm.cpp / ssm_vec.inc; tests/nn/test_ssm.cpp compares them bit for bit.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fp4/nn/ssm.h"
#include "ssm_internal.h"

namespace fp4::nn::ssm_scalar {

constexpr int kVecW = 1;  // no vectors

inline float ex(float x) { return ::fp4::nn::internal::exp_scalar(x); }

template <class F, class... In>
inline void map(int64_t n, float* out, F f, const In*... in) {
  for (int64_t j = 0; j < n; ++j) out[j] = f(in[j]...);
}

inline double dot(const float* a, const float* b, int64_t n) {
  double total = 0.0;
  for (int64_t s0 = 0; s0 < n; s0 += ::fp4::nn::internal::kSuperChunk) {
    const int64_t s1 = std::min(n, s0 + ::fp4::nn::internal::kSuperChunk);
    double sup = 0.0;
    for (int64_t c0 = s0; c0 < s1; c0 += ::fp4::nn::internal::kSumChunk) {
      const int64_t c1 = std::min(s1, c0 + ::fp4::nn::internal::kSumChunk);
      float p[16];
      for (float& v : p) v = 0.0f;
      for (int64_t i = c0; i < c1; ++i) p[i % 16] += a[i] * b[i];
      sup += static_cast<double>(::fp4::nn::internal::tree16(p));
    }
    total += sup;
  }
  return total;
}

// dst[j·ldd + i] = src[i·lds + j] for i < rows, j < cols (exact copies), in 16 × 16 tiles.
inline void transpose(float* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows,
                      int64_t cols) {
  for (int64_t i0 = 0; i0 < rows; i0 += 16)
    for (int64_t j0 = 0; j0 < cols; j0 += 16) {
      const int64_t i1 = std::min(rows, i0 + 16), j1 = std::min(cols, j0 + 16);
      for (int64_t j = j0; j < j1; ++j)
        for (int64_t i = i0; i < i1; ++i) dst[j * ldd + i] = src[i * lds + j];
    }
}

template <int Tri, bool LowerCols = false>
inline void mm(int64_t M, int64_t Nc, int64_t K, const float* A, int64_t sr, int64_t sk,
               const float* B, int64_t ldb, float* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i) {
    const int64_t k0 = Tri == ::fp4::nn::ssm_internal::kUpper ? i : 0;
    const int64_t k1 = Tri == ::fp4::nn::ssm_internal::kLower ? std::min(K, i + 1) : K;
    const int64_t nc = LowerCols ? std::min(Nc, i + 1) : Nc;
    for (int64_t j = 0; j < nc; ++j) {
      float acc = 0.0f;
      for (int64_t k = k0; k < k1; ++k) acc = std::fma(A[i * sr + k * sk], B[k * ldb + j], acc);
      C[i * ldc + j] = acc;
    }
  }
}

#include "ssm_body.inc"

}  // namespace fp4::nn::ssm_scalar

namespace fp4::nn {
namespace ssm_internal {

void run_conv_forward(const Kernels& k, bool par, const char* fn, float* out, const float* x,
                      int64_t ldx, const float* w, const float* bias, int64_t B, int64_t T,
                      int64_t C, int64_t W) {
  check_conv(fn, x, ldx, w, bias, B, T, C, W);
  need_ptr(out, fn, "out");
  thread_local std::vector<float> wT;
  if (wT.size() < static_cast<size_t>(W * C)) wT.resize(static_cast<size_t>(W * C));
  for (int64_t c = 0; c < C; ++c)
    for (int64_t j = 0; j < W; ++j) wT[j * C + c] = w[c * W + j];
  const ConvArgs a{x, w, bias, ldx, B, T, C, W, wT.data()};
  const int64_t nb = (T + kRowBlock - 1) / kRowBlock;
#pragma omp parallel for schedule(static) if (par)
  for (int64_t u = 0; u < B * nb; ++u) k.conv_fwd_block(a, out, u / nb, (u % nb) * kRowBlock);
}

void run_conv_backward(const Kernels& k, bool par, const char* fn, float* dx, float* dw,
                       float* dbias, const float* dout, const float* x, int64_t ldx,
                       const float* w, const float* bias, int64_t B, int64_t T, int64_t C,
                       int64_t W) {
  check_conv(fn, x, ldx, w, bias, B, T, C, W);
  need_ptr(dx, fn, "dx");
  need_ptr(dw, fn, "dw");
  need_ptr(dbias, fn, "dbias");
  need_ptr(dout, fn, "dout");
  thread_local std::vector<float> wT;
  if (wT.size() < static_cast<size_t>(W * C)) wT.resize(static_cast<size_t>(W * C));
  for (int64_t c = 0; c < C; ++c)
    for (int64_t j = 0; j < W; ++j) wT[j * C + c] = w[c * W + j];
  const ConvArgs a{x, w, bias, ldx, B, T, C, W, wT.data()};
  // Units (b, row block) in order u = b·nb + block; unit u's partial dw (transposed, [W, C])
  // and dbias sums at part[u·(W+1)·C ..]; then reduced over u ascending per column.
  const int64_t nb = (T + kRowBlock - 1) / kRowBlock, nu = B * nb, ld = (W + 1) * C;
  thread_local std::vector<float> part, red;
  if (part.size() < static_cast<size_t>(nu * ld)) part.resize(static_cast<size_t>(nu * ld));
  red.assign(static_cast<size_t>(ld), 0.0f);
  const int64_t ncb = (ld + kColBlock - 1) / kColBlock;
  float* pp = part.data();
  float* rp = red.data();
#pragma omp parallel if (par)
  {
#pragma omp for schedule(static)
    for (int64_t u = 0; u < nu; ++u)
      k.conv_bwd_block(a, dx, pp + u * ld, dout, u / nb, (u % nb) * kRowBlock);
#pragma omp for schedule(static)
    for (int64_t cb = 0; cb < ncb; ++cb)
      k.sum_parts(rp + cb * kColBlock, pp + cb * kColBlock, nu, ld,
                  std::min(kColBlock, ld - cb * kColBlock));
  }
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t j = 0; j < W; ++j) dw[c * W + j] += rp[j * C + c];
    dbias[c] += rp[W * C + c];
  }
}

namespace {
SsdArgs make_ssd_args(const char* fn, const float* x, int64_t ldx, const float* Bm, int64_t ldb,
                      const float* Cm, int64_t ldc, const float* dt, int64_t lddt,
                      const float* dt_bias, const float* A_log, const float* D,
                      const SsdDims& d) {
  check_ssd_inputs(d, fn, x, ldx, Bm, ldb, Cm, ldc, dt, lddt, dt_bias, A_log, D);
  return SsdArgs{d, (d.T + d.Q - 1) / d.Q, x, Bm, Cm, dt, dt_bias, A_log, D, ldx, ldb, ldc, lddt};
}
}  // namespace

void run_ssd_forward(const Kernels& k, bool par, const char* fn, float* y, float* ws,
                     const float* x, int64_t ldx, const float* Bm, int64_t ldb, const float* Cm,
                     int64_t ldc, const float* dt, int64_t lddt, const float* dt_bias,
                     const float* A_log, const float* D, const SsdDims& d) {
  const SsdArgs a = make_ssd_args(fn, x, ldx, Bm, ldb, Cm, ldc, dt, lddt, dt_bias, A_log, D, d);
  need_ptr(y, fn, "y");
  need_ptr(ws, fn, "ws");
  // Phase 1, units (b, g, c): B, C rows and Gm = C Bᵀ of every chunk, shared by the heads of
  // a group; phase 2, units (b, h).
  thread_local std::vector<float> pack;
  const size_t np = static_cast<size_t>(ssd_pack_total(d, a.nc));
  if (pack.size() < np) pack.resize(np);
  float* pk = pack.data();
  const int64_t ngc = d.G * a.nc;
#pragma omp parallel if (par)
  {
#pragma omp for schedule(static)
    for (int64_t u = 0; u < d.B * ngc; ++u)
      k.ssd_pack_bgc(a, pk, u / ngc, (u % ngc) / a.nc, u % a.nc);
    // Static, not dynamic: with a dynamic schedule a thread first given a unit at step 3
    // would grow its scratch then (an allocation in the steady state, test_alloc).
#pragma omp for schedule(static)
    for (int64_t u = 0; u < d.B * d.H; ++u) k.ssd_fwd_bh(a, y, ws, pk, u / d.H, u % d.H);
  }
}

void run_ssd_backward(const Kernels& k, bool par, const char* fn, float* dx, float* dB,
                      float* dC, float* d_dt, float* dA_log, float* dD, float* d_dt_bias,
                      const float* dy, const float* ws, const float* x, int64_t ldx,
                      const float* Bm, int64_t ldb, const float* Cm, int64_t ldc,
                      const float* dt, int64_t lddt, const float* dt_bias, const float* A_log,
                      const float* D, const SsdDims& d) {
  const SsdArgs a = make_ssd_args(fn, x, ldx, Bm, ldb, Cm, ldc, dt, lddt, dt_bias, A_log, D, d);
  need_ptr(dx, fn, "dx");
  need_ptr(dB, fn, "dB");
  need_ptr(dC, fn, "dC");
  need_ptr(d_dt, fn, "d_dt");
  need_ptr(dA_log, fn, "dA_log");
  need_ptr(dD, fn, "dD");
  need_ptr(d_dt_bias, fn, "d_dt_bias");
  need_ptr(dy, fn, "dy");
  need_ptr(ws, fn, "ws");
  thread_local std::vector<double> part;
  part.assign(static_cast<size_t>(d.B * d.H * 3), 0.0);
  const SsdGrads g{dx, dB, dC, d_dt, part.data(), dy, ws};
  // A unit's results do not depend on the thread that runs it (its own dx, dB, dC, d_dt rows
  // and part entries; per-thread scratch only). Static, so every thread meets its scratch
  // size in the first steps and the steady state allocates nothing (test_alloc).
#pragma omp parallel for schedule(static) if (par)
  for (int64_t u = 0; u < d.B * d.G; ++u) k.ssd_bwd_bg(a, g, u / d.G, u % d.G);
  for (int64_t h = 0; h < d.H; ++h) {
    double s[3] = {0.0, 0.0, 0.0};
    for (int64_t b = 0; b < d.B; ++b)
      for (int j = 0; j < 3; ++j) s[j] += part[static_cast<size_t>((b * d.H + h) * 3 + j)];
    dD[h] += static_cast<float>(s[0]);
    dA_log[h] += static_cast<float>(s[1]);
    d_dt_bias[h] += static_cast<float>(s[2]);
  }
}

void run_norm_forward(const Kernels& k, bool par, const char* fn, float* out, float* rstd,
                      const float* y, const float* z, int64_t ldz, const float* weight,
                      int64_t BT, int64_t d_inner, int64_t G, float eps) {
  check_norm(fn, y, z, ldz, weight, BT, d_inner, G);
  need_ptr(out, fn, "out");
  need_ptr(rstd, fn, "rstd");
  const NormArgs a{y, z, weight, ldz, BT, d_inner, G};
#pragma omp parallel for schedule(static) if (par)
  for (int64_t r = 0; r < BT; ++r) k.norm_fwd_row(a, out, rstd, eps, r);
}

void run_norm_backward(const Kernels& k, bool par, const char* fn, float* dy, float* dz,
                       float* dweight, const float* dout, const float* y, const float* z,
                       int64_t ldz, const float* weight, const float* rstd, int64_t BT,
                       int64_t d_inner, int64_t G) {
  check_norm(fn, y, z, ldz, weight, BT, d_inner, G);
  need_ptr(dy, fn, "dy");
  need_ptr(dz, fn, "dz");
  need_ptr(dweight, fn, "dweight");
  need_ptr(dout, fn, "dout");
  need_ptr(rstd, fn, "rstd");
  const NormArgs a{y, z, weight, ldz, BT, d_inner, G};
  // Units of kRowBlock rows; unit u's partial dweight at part[u·d_inner ..], reduced over u
  // ascending per column (sum_parts adds the total to dweight).
  const int64_t nu = (BT + kRowBlock - 1) / kRowBlock;
  thread_local std::vector<float> part;
  if (part.size() < static_cast<size_t>(nu * d_inner))
    part.resize(static_cast<size_t>(nu * d_inner));
  const int64_t ncb = (d_inner + kColBlock - 1) / kColBlock;
  float* pp = part.data();
#pragma omp parallel if (par)
  {
#pragma omp for schedule(static)
    for (int64_t u = 0; u < nu; ++u) k.norm_bwd_block(a, dy, dz, pp + u * d_inner, dout, rstd,
                                                      u * kRowBlock);
#pragma omp for schedule(static)
    for (int64_t cb = 0; cb < ncb; ++cb)
      k.sum_parts(dweight + cb * kColBlock, pp + cb * kColBlock, nu, d_inner,
                  std::min(kColBlock, d_inner - cb * kColBlock));
  }
}

}  // namespace ssm_internal

using namespace ssm_internal;

namespace {
constexpr Kernels kRef = ssm_scalar::kKernels;
}

int64_t ssd_workspace_floats(const SsdDims& d) {
  check_ssd_dims(d, "ssd_workspace_floats");
  const int64_t nc = (d.T + d.Q - 1) / d.Q;
  return d.B * d.H * (nc * d.N * d.P + d.T);
}
int64_t ssd_workspace_floats(int64_t B, int64_t T, int64_t H, int64_t P, int64_t G, int64_t N,
                             int64_t Q) {
  return ssd_workspace_floats(SsdDims{B, T, H, P, G, N, Q});
}

void ssm_conv_forward_ref(float* out, const float* x, int64_t ldx, const float* w,
                          const float* bias, int64_t B, int64_t T, int64_t C, int64_t W) {
  run_conv_forward(kRef, false, "ssm_conv_forward_ref", out, x, ldx, w, bias, B, T, C, W);
}
void ssm_conv_backward_ref(float* dx, float* dw, float* dbias, const float* dout,
                           const float* x, int64_t ldx, const float* w, const float* bias,
                           int64_t B, int64_t T, int64_t C, int64_t W) {
  run_conv_backward(kRef, false, "ssm_conv_backward_ref", dx, dw, dbias, dout, x, ldx, w, bias,
                    B, T, C, W);
}
void ssd_scan_forward_ref(float* y, float* ws, const float* x, int64_t ldx, const float* Bm,
                          int64_t ldb, const float* Cm, int64_t ldc, const float* dt,
                          int64_t lddt, const float* dt_bias, const float* A_log,
                          const float* D, const SsdDims& d) {
  run_ssd_forward(kRef, false, "ssd_scan_forward_ref", y, ws, x, ldx, Bm, ldb, Cm, ldc, dt,
                  lddt, dt_bias, A_log, D, d);
}
void ssd_scan_backward_ref(float* dx, float* dB, float* dC, float* d_dt, float* dA_log,
                           float* dD, float* d_dt_bias, const float* dy, const float* ws,
                           const float* x, int64_t ldx, const float* Bm, int64_t ldb,
                           const float* Cm, int64_t ldc, const float* dt, int64_t lddt,
                           const float* dt_bias, const float* A_log, const float* D,
                           const SsdDims& d) {
  run_ssd_backward(kRef, false, "ssd_scan_backward_ref", dx, dB, dC, d_dt, dA_log, dD,
                   d_dt_bias, dy, ws, x, ldx, Bm, ldb, Cm, ldc, dt, lddt, dt_bias, A_log, D, d);
}
void gated_rmsnorm_forward_ref(float* out, float* rstd, const float* y, const float* z,
                               int64_t ldz, const float* weight, int64_t BT, int64_t d_inner,
                               int64_t G, float eps) {
  run_norm_forward(kRef, false, "gated_rmsnorm_forward_ref", out, rstd, y, z, ldz, weight, BT,
                   d_inner, G, eps);
}
void gated_rmsnorm_backward_ref(float* dy, float* dz, float* dweight, const float* dout,
                                const float* y, const float* z, int64_t ldz,
                                const float* weight, const float* rstd, int64_t BT,
                                int64_t d_inner, int64_t G) {
  run_norm_backward(kRef, false, "gated_rmsnorm_backward_ref", dy, dz, dweight, dout, y, z, ldz,
                    weight, rstd, BT, d_inner, G);
}

void ssd_scan_sequential(double* y, const double* x, int64_t ldx, const double* Bm, int64_t ldb,
                         const double* Cm, int64_t ldc, const double* dt, int64_t lddt,
                         const double* dt_bias, const double* A_log, const double* D,
                         const SsdDims& d) {
  const char* fn = "ssd_scan_sequential";
  check_ssd_dims(d, fn);
  for (const void* p : {static_cast<const void*>(y), static_cast<const void*>(x),
                        static_cast<const void*>(Bm), static_cast<const void*>(Cm),
                        static_cast<const void*>(dt), static_cast<const void*>(dt_bias),
                        static_cast<const void*>(A_log), static_cast<const void*>(D)})
    need_ptr(p, fn, "a pointer argument");
  need_ld(ldx, d.H * d.P, fn, "ldx");
  need_ld(ldb, d.G * d.N, fn, "ldb");
  need_ld(ldc, d.G * d.N, fn, "ldc");
  need_ld(lddt, d.H, fn, "lddt");
  const int64_t P = d.P, N = d.N, HG = d.H / d.G;
  std::vector<double> S(static_cast<size_t>(P * N));
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h) {
      const int64_t g = h / HG;
      const double A = -std::exp(A_log[h]);
      std::fill(S.begin(), S.end(), 0.0);
      for (int64_t t = 0; t < d.T; ++t) {
        const int64_t r = b * d.T + t;
        const double u = dt[r * lddt + h] + dt_bias[h];
        const double dl = u > 20.0 ? u : std::log1p(std::exp(u));
        const double dA = std::exp(dl * A);
        const double* xr = x + r * ldx + h * P;
        const double* br = Bm + r * ldb + g * N;
        const double* cr = Cm + r * ldc + g * N;
        double* yr = y + r * d.H * P + h * P;
        for (int64_t p = 0; p < P; ++p) {
          double acc = 0.0;
          for (int64_t n = 0; n < N; ++n) {
            double& s = S[static_cast<size_t>(p * N + n)];
            s = dA * s + dl * xr[p] * br[n];
            acc += s * cr[n];
          }
          yr[p] = acc + D[h] * xr[p];
        }
      }
    }
}

}  // namespace fp4::nn
