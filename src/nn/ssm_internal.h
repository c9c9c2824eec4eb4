// Internal pieces shared by the Mamba-2 kernels (ssm.cpp, vector) and their scalar twins
// (ssm_ref.cpp): argument checks, the scalar softplus, the per-thread scratch, the table of
// per-unit kernels and the drivers that run the units (OpenMP in the fast build, sequential
// in the twin). Not a public header.
//
// The kernel bodies themselves live in ssm_body.inc, which is compiled once per vector width
// (ssm.cpp, inside a `#pragma GCC target` region per ISA) and once with plain scalar
// primitives (ssm_ref.cpp). The body is written against four primitives that each build
// provides: mm (small matrix product, contraction index ascending, FP32 from +0), dot (the
// canonical sum of products), map (an elementwise formula applied to n elements), ex (exp).
// The vector primitives perform, per lane, exactly the scalar primitives' operations, so the
// two builds agree bit for bit.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>

#include "fp4/base/int_math.h"
#include "fp4/nn/ssm.h"
#include "layers_internal.h"

namespace fp4::nn::ssm_internal {

enum Tri { kFull = 0, kLower = 1, kUpper = 2 };  // k range: all / k ≤ i / k ≥ i

constexpr int64_t kPad = 16;  // padded widths of the scratch matrices (≥ every vector width)
/// Floats of the SSD forward's shared per-(b, g) pack (ssm_body.inc SsdGroupPack): per chunk
/// the B and C rows (Qp × Np each) and Gm = C Bᵀ (Qp × Qp), Qp, Np the padded Q, N.
inline int64_t ssd_pack_total(const SsdDims& d, int64_t nc) {
  const int64_t Qp = round_up(d.Q, kPad), Np = round_up(d.N, kPad);
  return d.B * d.G * nc * (2 * Qp * Np + Qp * Qp);
}

/// softplus(u) = u > 20 ? u : log1p(exp(u)) (exp = exp_scalar, log1p = std::log1p(float)).
inline float softplus(float u) {
  return u > 20.0f ? u : std::log1p(internal::exp_scalar(u));
}
/// softplus′(u) = u > 20 ? 1 : σ(u), σ(u) = 1 / (1 + exp(−u)).
inline float softplus_grad(float u) {
  return u > 20.0f ? 1.0f : 1.0f / (1.0f + internal::exp_scalar(-u));
}

struct AlignedFree {
  void operator()(float* p) const { std::free(p); }
};
/// The calling thread's scratch of at least n floats (64-byte aligned, contents undefined),
/// grown only when too small: steady-state calls allocate nothing.
inline float* thread_ws(int64_t n) {
  thread_local std::unique_ptr<float[], AlignedFree> p;
  thread_local int64_t cap = 0;
  if (n > cap) {
    const size_t bytes = static_cast<size_t>(round_up(n * 4, 64));
    p.reset();
    p.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
    if (!p) throw std::bad_alloc();
    cap = n;
  }
  return p.get();
}

// ---------------------------------------------------------------- argument checks
[[noreturn]] inline void bad(const char* fn, const std::string& what) {
  throw std::invalid_argument(std::string(fn) + ": " + what);
}
inline void need_ptr(const void* p, const char* fn, const char* name) {
  if (p == nullptr) bad(fn, std::string(name) + " is null");
}
inline void need_pos(int64_t v, const char* fn, const char* name) {
  if (v < 1) bad(fn, std::string(name) + " must be >= 1 (got " + std::to_string(v) + ")");
}
inline void need_ld(int64_t ld, int64_t width, const char* fn, const char* name) {
  if (ld < width)
    bad(fn, std::string(name) + " = " + std::to_string(ld) + " is below the row width " +
                std::to_string(width));
}
inline void check_ssd_dims(const SsdDims& d, const char* fn) {
  need_pos(d.B, fn, "B");
  need_pos(d.T, fn, "T");
  need_pos(d.H, fn, "H");
  need_pos(d.P, fn, "P");
  need_pos(d.G, fn, "G");
  need_pos(d.N, fn, "N");
  need_pos(d.Q, fn, "Q");
  if (d.H % d.G != 0)
    bad(fn, "H % G != 0 (H=" + std::to_string(d.H) + ", G=" + std::to_string(d.G) + ")");
}
inline void check_ssd_inputs(const SsdDims& d, const char* fn, const float* x, int64_t ldx,
                             const float* Bm, int64_t ldb, const float* Cm, int64_t ldc,
                             const float* dt, int64_t lddt, const float* dt_bias,
                             const float* A_log, const float* D) {
  check_ssd_dims(d, fn);
  need_ptr(x, fn, "x");
  need_ptr(Bm, fn, "Bm");
  need_ptr(Cm, fn, "Cm");
  need_ptr(dt, fn, "dt");
  need_ptr(dt_bias, fn, "dt_bias");
  need_ptr(A_log, fn, "A_log");
  need_ptr(D, fn, "D");
  need_ld(ldx, d.H * d.P, fn, "ldx");
  need_ld(ldb, d.G * d.N, fn, "ldb");
  need_ld(ldc, d.G * d.N, fn, "ldc");
  need_ld(lddt, d.H, fn, "lddt");
}
inline void check_conv(const char* fn, const float* x, int64_t ldx, const float* w,
                       const float* bias, int64_t B, int64_t T, int64_t C, int64_t W) {
  need_ptr(x, fn, "x");
  need_ptr(w, fn, "w");
  need_ptr(bias, fn, "bias");
  need_pos(B, fn, "B");
  need_pos(T, fn, "T");
  need_pos(C, fn, "C");
  need_pos(W, fn, "W");
  need_ld(ldx, C, fn, "ldx");
}
inline void check_norm(const char* fn, const float* y, const float* z, int64_t ldz,
                       const float* weight, int64_t BT, int64_t d_inner, int64_t G) {
  need_ptr(y, fn, "y");
  need_ptr(z, fn, "z");
  need_ptr(weight, fn, "weight");
  need_pos(BT, fn, "BT");
  need_pos(d_inner, fn, "d_inner");
  need_pos(G, fn, "G");
  if (d_inner % G != 0)
    bad(fn, "d_inner % G != 0 (d_inner=" + std::to_string(d_inner) + ", G=" +
                std::to_string(G) + ")");
  need_ld(ldz, d_inner, fn, "ldz");
}

// ---------------------------------------------------------------- argument bundles
struct SsdArgs {
  SsdDims d;
  int64_t nc;  // chunks per sequence
  const float *x, *Bm, *Cm, *dt, *dt_bias, *A_log, *D;
  int64_t ldx, ldb, ldc, lddt;
};
struct SsdGrads {
  float *dx, *dB, *dC, *d_dt;
  double* part;  // [B·H][3]: per (b, h) FP64 sums of dD, dA_log, d_dt_bias
  const float* dy;
  const float* ws;
};
struct ConvArgs {
  const float *x, *w, *bias;
  int64_t ldx, B, T, C, W;
  const float* wT;  // [W, C] transposed weight
};
struct NormArgs {
  const float *y, *z, *weight;
  int64_t ldz, BT, d_inner, G;
};

// Per-unit kernels of one build (ssm_body.inc).
struct Kernels {
  void (*ssd_pack_bgc)(const SsdArgs&, float* pack, int64_t b, int64_t g, int64_t c);
  void (*ssd_fwd_bh)(const SsdArgs&, float* y, float* ws, const float* pack, int64_t b,
                     int64_t h);
  void (*ssd_bwd_bg)(const SsdArgs&, const SsdGrads&, int64_t b, int64_t g);
  void (*conv_fwd_block)(const ConvArgs&, float* out, int64_t b, int64_t t0);
  void (*conv_bwd_block)(const ConvArgs&, float* dx, float* part, const float* dout, int64_t b,
                         int64_t t0);
  void (*norm_fwd_row)(const NormArgs&, float* out, float* rstd, float eps, int64_t r);
  void (*norm_bwd_block)(const NormArgs&, float* dy, float* dz, float* part, const float* dout,
                         const float* rstd, int64_t r0);
  void (*sum_parts)(float* dst, const float* part, int64_t nu, int64_t ld, int64_t n);
};
// Rows per conv unit (of one sequence) and per gated-norm backward unit. Fixed (never derived
// from the thread count): the weight-gradient partial sums are per unit, reduced in unit order.
constexpr int64_t kRowBlock = 64;
// Columns per unit of the reduction of those partials (sum_parts).
constexpr int64_t kColBlock = 256;

/// Drivers (defined in ssm_ref.cpp, shared by both builds): check the arguments (throwing
/// std::invalid_argument naming `fn` and the argument), then run the units with `k`, in
/// parallel (OpenMP over independent units, static schedule; par) or sequentially.
void run_conv_forward(const Kernels& k, bool par, const char* fn, float* out, const float* x,
                      int64_t ldx, const float* w, const float* bias, int64_t B, int64_t T,
                      int64_t C, int64_t W);
void run_conv_backward(const Kernels& k, bool par, const char* fn, float* dx, float* dw,
                       float* dbias, const float* dout, const float* x, int64_t ldx,
                       const float* w, const float* bias, int64_t B, int64_t T, int64_t C,
                       int64_t W);
void run_ssd_forward(const Kernels& k, bool par, const char* fn, float* y, float* ws,
                     const float* x, int64_t ldx, const float* Bm, int64_t ldb, const float* Cm,
                     int64_t ldc, const float* dt, int64_t lddt, const float* dt_bias,
                     const float* A_log, const float* D, const SsdDims& d);
void run_ssd_backward(const Kernels& k, bool par, const char* fn, float* dx, float* dB,
                      float* dC, float* d_dt, float* dA_log, float* dD, float* d_dt_bias,
                      const float* dy, const float* ws, const float* x, int64_t ldx,
                      const float* Bm, int64_t ldb, const float* Cm, int64_t ldc,
                      const float* dt, int64_t lddt, const float* dt_bias, const float* A_log,
                      const float* D, const SsdDims& d);
void run_norm_forward(const Kernels& k, bool par, const char* fn, float* out, float* rstd,
                      const float* y, const float* z, int64_t ldz, const float* weight,
                      int64_t BT, int64_t d_inner, int64_t G, float eps);
void run_norm_backward(const Kernels& k, bool par, const char* fn, float* dy, float* dz,
                       float* dweight, const float* dout, const float* y, const float* z,
                       int64_t ldz, const float* weight, const float* rstd, int64_t BT,
                       int64_t d_inner, int64_t G);

}  // namespace fp4::nn::ssm_internal
