// Fast Mamba-2 kernels (see fp4/nn/ssm.h): conv1d + SiLU, chunked SSD scan, gated RMSNorm.
//
// The per-unit bodies (ssm_body.inc) are compiled three times, each inside a
// `#pragma GCC target` region with the vector primitives of ssm_vec.inc for that width:
// AVX-512 (16 lanes, 6 × 64-column mm tiles), AVX2 + FMA (8 lanes, 6 × 16) and baseline SSE2
// (4 lanes, 6 × 8), then 4-row and single-row tiles for the remaining rows, plus, for tests
// only, the AVX-512 code (the same 6 × 64 tiles) for the baseline target (emu16).
// The variant is chosen once from the CPU and FP4_MAX_CPU_ISA
// (detail::set_ssm_isa forces one). The drivers in ssm_ref.cpp run the units under OpenMP
// (static schedule, so every thread meets its scratch size in the first steps and the steady
// state allocates nothing; a unit writes only its own outputs, so the schedule cannot change a
// result; units: conv (b, 64-row block) over all channels, forward and backward;
// scan forward (b, g, chunk) packing B, C and Gm = C Bᵀ once per group and chunk, then
// (b, h); scan backward (b, g) (same packing, then chunks descending, the heads of the group
// ascending within a chunk, each head carrying its own dS, the chunk's dx added once per row
// from the group's scratch; x, dy, S_prev read in place when P % 16 == 0); norm rows
// forward and 64-row blocks backward; the weight gradients of conv and norm are per-block
// partials reduced in block order, by 256-column units), so each output is produced by one
// thread in a fixed order.
//
// Why the bits match the scalar twins (ssm_ref.cpp, the same body with scalar primitives):
//  * mm: each output lane accumulates acc = fma(a, b, acc) (one rounding: vfmadd where the
//    target has it, std::fma per lane in the baseline and emu16 builds) from +0,
//    k ascending over exactly the twin's range (the triangular ranges skip the masked terms
//    per row, as the twin does); the register blocking only decides which outputs are
//    computed together;
//  * map: the same generic formula evaluated on vectors, lane by lane; exp is the lane-wise
//    copy of internal::exp_scalar;
//  * dot: the canonical sum with the 16 partials spread over 16/VW vectors and tree16.
// The vector code reads and writes padding of the scratch matrices beyond the twin's columns,
// and reads scratch entries above a triangle's diagonal that no one wrote (the row selects of
// chunk_coeffs and the decay gradients drop them); neither ever feeds a valid output.
#pragma GCC diagnostic ignored "-Wpsabi"

#include "fp4/nn/ssm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include <immintrin.h>

#include "fp4/base/cpu_isa.h"
#include "ssm_internal.h"

// FP4_SSM_NATIVE names the instructions ssm_vec.inc may use for the build: 512 (AVX-512:
// vfmadd, masked loads and stores), 256 (AVX2 + FMA: vfmadd, vmaskmovps), 0 (neither:
// std::fma per lane and lane-copied tails, x86-64 baseline and emu16).
#pragma GCC push_options
#pragma GCC target("avx512f")
#define FP4_SSM_NATIVE 512
namespace fp4::nn::ssm_avx512 {
constexpr int VW = 16;
constexpr int kNB = 4;
constexpr int kMR = 6;
#include "ssm_vec.inc"
#include "ssm_body.inc"
}  // namespace fp4::nn::ssm_avx512
#undef FP4_SSM_NATIVE
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define FP4_SSM_NATIVE 256
namespace fp4::nn::ssm_avx2 {
constexpr int VW = 8;
constexpr int kNB = 2;
constexpr int kMR = 6;
#include "ssm_vec.inc"
#include "ssm_body.inc"
}  // namespace fp4::nn::ssm_avx2
#undef FP4_SSM_NATIVE
#pragma GCC pop_options

#define FP4_SSM_NATIVE 0  // no native FMA or masked tails (x86-64 baseline)
namespace fp4::nn::ssm_base {
constexpr int VW = 4;
constexpr int kNB = 2;
constexpr int kMR = 6;
#include "ssm_vec.inc"
#include "ssm_body.inc"
}  // namespace fp4::nn::ssm_base

namespace fp4::nn::ssm_emu16 {
constexpr int VW = 16;
constexpr int kNB = 4;
constexpr int kMR = 6;
#include "ssm_vec.inc"
#include "ssm_body.inc"
}  // namespace fp4::nn::ssm_emu16
#undef FP4_SSM_NATIVE

namespace fp4::nn {
namespace {

using ssm_internal::Kernels;
using detail::SsmIsa;

bool isa_ok(SsmIsa isa) {
  __builtin_cpu_init();
  switch (isa) {
    case SsmIsa::kAvx512:
      return __builtin_cpu_supports("avx512f") && cpu_isa_allowed(CpuIsa::Avx512);
    case SsmIsa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             cpu_isa_allowed(CpuIsa::Avx2);
    case SsmIsa::kBase:
    case SsmIsa::kEmu16:
      return true;
  }
  return false;
}
SsmIsa best_isa() {
  return isa_ok(SsmIsa::kAvx512) ? SsmIsa::kAvx512
         : isa_ok(SsmIsa::kAvx2) ? SsmIsa::kAvx2
                                 : SsmIsa::kBase;
}
constexpr Kernels kAvx512 = ssm_avx512::kKernels;
constexpr Kernels kAvx2 = ssm_avx2::kKernels;
constexpr Kernels kBase = ssm_base::kKernels;
constexpr Kernels kEmu16 = ssm_emu16::kKernels;
const Kernels* table(SsmIsa isa) {
  return isa == SsmIsa::kAvx512 ? &kAvx512
         : isa == SsmIsa::kAvx2 ? &kAvx2
         : isa == SsmIsa::kEmu16 ? &kEmu16
                                 : &kBase;
}
const Kernels* g_k = table(best_isa());

}  // namespace

namespace detail {
bool set_ssm_isa(SsmIsa isa) {
  if (!isa_ok(isa)) return false;
  g_k = table(isa);
  return true;
}
void reset_ssm_isa() { g_k = table(best_isa()); }
}  // namespace detail

using namespace ssm_internal;

void ssm_conv_forward(float* out, const float* x, int64_t ldx, const float* w,
                      const float* bias, int64_t B, int64_t T, int64_t C, int64_t W) {
  run_conv_forward(*g_k, true, "ssm_conv_forward", out, x, ldx, w, bias, B, T, C, W);
}
void ssm_conv_backward(float* dx, float* dw, float* dbias, const float* dout, const float* x,
                       int64_t ldx, const float* w, const float* bias, int64_t B, int64_t T,
                       int64_t C, int64_t W) {
  run_conv_backward(*g_k, true, "ssm_conv_backward", dx, dw, dbias, dout, x, ldx, w, bias, B,
                    T, C, W);
}
void ssd_scan_forward(float* y, float* ws, const float* x, int64_t ldx, const float* Bm,
                      int64_t ldb, const float* Cm, int64_t ldc, const float* dt, int64_t lddt,
                      const float* dt_bias, const float* A_log, const float* D,
                      const SsdDims& d) {
  run_ssd_forward(*g_k, true, "ssd_scan_forward", y, ws, x, ldx, Bm, ldb, Cm, ldc, dt, lddt,
                  dt_bias, A_log, D, d);
}
void ssd_scan_backward(float* dx, float* dB, float* dC, float* d_dt, float* dA_log, float* dD,
                       float* d_dt_bias, const float* dy, const float* ws, const float* x,
                       int64_t ldx, const float* Bm, int64_t ldb, const float* Cm, int64_t ldc,
                       const float* dt, int64_t lddt, const float* dt_bias, const float* A_log,
                       const float* D, const SsdDims& d) {
  run_ssd_backward(*g_k, true, "ssd_scan_backward", dx, dB, dC, d_dt, dA_log, dD, d_dt_bias, dy,
                   ws, x, ldx, Bm, ldb, Cm, ldc, dt, lddt, dt_bias, A_log, D, d);
}
void gated_rmsnorm_forward(float* out, float* rstd, const float* y, const float* z, int64_t ldz,
                           const float* weight, int64_t BT, int64_t d_inner, int64_t G,
                           float eps) {
  run_norm_forward(*g_k, true, "gated_rmsnorm_forward", out, rstd, y, z, ldz, weight, BT,
                   d_inner, G, eps);
}
void gated_rmsnorm_backward(float* dy, float* dz, float* dweight, const float* dout,
                            const float* y, const float* z, int64_t ldz, const float* weight,
                            const float* rstd, int64_t BT, int64_t d_inner, int64_t G) {
  run_norm_backward(*g_k, true, "gated_rmsnorm_backward", dy, dz, dweight, dout, y, z, ldz,
                    weight, rstd, BT, d_inner, G);
}

}  // namespace fp4::nn
