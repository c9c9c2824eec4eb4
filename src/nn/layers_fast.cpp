// Fast layer kernels (see fp4/nn/layers.h): RMSNorm, RoPE, squared ReLU, SwiGLU, softmax
// cross-entropy, residual add, and the AdamW / grad-norm kernels of src/train/optim.cpp.
// Google Highway, one build per x86 target, OpenMP over rows or fixed chunks.
//
// Why the bits match the scalar twins (layers_ref.cpp). Every FP32 operation of a twin is done
// here as the same IEEE operation on the same operands, in the same order, just in vector
// lanes (Mul and Add separately, never MulAdd; the project builds with -ffp-contract=off):
//  * elementwise formulas are written with the twin's parenthesisation; tails shorter than a
//    vector are computed on a zero-padded vector and only the valid lanes are stored;
//  * sums use the canonical order (layers_internal.h): with N lanes, 16/N accumulator vectors
//    hold the 16 partials (vector j, lane l = partial j·N + l), element i of a chunk goes to
//    vector (i / N) mod (16/N), lane i mod N, i.e. partial i mod 16; the vectors are stored to
//    16 floats and combined by the same tree16; chunk and superchunk sums are FP64 as in the
//    twin. Padded tail lanes add +0, which leaves a partial unchanged (it is never −0);
//  * exp is ExpV below, the lane-wise copy of internal::exp_scalar (same constants, same
//    clamps by compare-and-select, same integer exponent arithmetic);
//  * the cross-entropy row max is order-free (max of non-NaN values; −0 canonicalised by + 0);
//  * scalar per-row quantities (rstd, the RMSNorm backward k, 1/sum, the loss) are computed by
//    the same scalar double expressions as the twin.
// Each row (or chunk of elements, or of channels for the RMSNorm weight gradient) is handled
// start to finish by one thread, so results do not depend on the thread count.
//
// Dispatch: foreach_target.h compiles the kernels once per target in HWY_TARGETS; the target
// used is the one quant_fast_target() reports (as in pack_fast.cpp), so quant_fast_use_target()
// also selects these kernels (tests run every target that way).

// ------------------------------------------------------------------------------------------
// Shared declarations (compiled once; this file is re-included once per target).
#ifndef FP4_NN_LAYERS_FAST_SHARED_
#define FP4_NN_LAYERS_FAST_SHARED_

// See quant_fast.cpp: GCC 12's AVX-512 headers trigger false -Wmaybe-uninitialized warnings.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "fp4/nn/layers.h"
#include "fp4/numerics/quant_fast.h"
#include "layers_internal.h"

namespace fp4::nn::lf {

constexpr int64_t kMaxLanes = 64;

struct Kernels {
  const char* name;
  float (*rms_fwd_row)(float* out, const float* x, const float* w, int64_t C, float eps);
  void (*rms_bwd_row)(float* dx, const float* g, const float* x, const float* w, float r,
                      int64_t C);
  void (*rms_dw_chunk)(float* dweight, const float* dout, const float* x, const float* rstd,
                       int64_t BT, int64_t C, int64_t c0, int64_t n);
  void (*rope_row)(float* x, const float* c, const float* s, int64_t H, int64_t hd);
  void (*sqrelu_fwd)(float* out, const float* x, int64_t n);
  void (*sqrelu_bwd)(float* dx, const float* dout, const float* x, int64_t n);
  void (*swiglu_fwd_row)(float* out, const float* g, const float* u, int64_t F);
  void (*swiglu_bwd_row)(float* dg, float* du, const float* d, const float* g, const float* u,
                         int64_t F);
  double (*ce_fwd_row)(const float* z, int64_t V, int64_t y);
  void (*ce_bwd_row)(float* dz, const float* z, int64_t V, int64_t y, float scale);
  void (*add)(float* x, const float* r, int64_t n);
  void (*adamw)(float* w, const float* g, float* m, float* v, int64_t n,
                const detail::AdamWCoeffs& k);
  double (*sumsq)(const float* g, int64_t n, float s);
  void (*scale)(float* g, int64_t n, float s);
  void (*exp)(float* out, const float* x, int64_t n);
};

}  // namespace fp4::nn::lf

#endif  // FP4_NN_LAYERS_FAST_SHARED_

// ------------------------------------------------------------------------------------------
// Per-target kernels.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "layers_fast.cpp"  // found via the room's own src/ dir (fp4_room)
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace fp4::nn::lf::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace in = fp4::nn::internal;

using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using VF = hn::Vec<DF>;
using VI = hn::Vec<DI>;

constexpr int64_t N = static_cast<int64_t>(hn::MaxLanes(DF()));
static_assert(N >= 1 && N <= 16 && 16 % N == 0, "canonical sum needs 16 % lanes == 0");
constexpr int64_t NA = 16 / N;  // accumulator vectors of the canonical sum

/// Load cnt ≤ N floats from p (the rest of the vector +0).
HWY_INLINE VF Ld(const float* p, int64_t cnt) {
  const DF df;
  if (cnt == N) return hn::LoadU(df, p);
  HWY_ALIGN float b[kMaxLanes] = {};
  std::memcpy(b, p, static_cast<size_t>(cnt) * sizeof(float));
  return hn::Load(df, b);
}

/// Store the first cnt ≤ N lanes of v to p.
HWY_INLINE void St(VF v, float* p, int64_t cnt) {
  const DF df;
  if (cnt == N) {
    hn::StoreU(v, df, p);
    return;
  }
  HWY_ALIGN float b[kMaxLanes];
  hn::Store(v, df, b);
  std::memcpy(p, b, static_cast<size_t>(cnt) * sizeof(float));
}

/// body(i, cnt) for i = 0, N, 2N, … < n with cnt = min(N, n − i).
template <class Body>
HWY_INLINE void Loop(int64_t n, const Body& body) {
  for (int64_t i = 0; i < n; i += N) body(i, std::min(N, n - i));
}

/// internal::exp_scalar lane-wise (same operations, same order).
HWY_INLINE VF ExpV(VF x) {
  const DF df;
  const DI di;
  const VF lo = hn::Set(df, in::kExpLo), hi = hn::Set(df, in::kExpHi);
  const VF magic = hn::Set(df, in::kRoundMagic);
  VF xc = hn::IfThenElse(hn::Ge(x, lo), x, lo);
  xc = hn::IfThenElse(hn::Le(xc, hi), xc, hi);
  const VF t = hn::Add(hn::Mul(xc, hn::Set(df, in::kLog2e)), magic);
  const VF kf = hn::Sub(t, magic);
  const VI k = hn::Sub(hn::BitCast(di, t), hn::BitCast(di, magic));
  const VF r = hn::Sub(hn::Sub(xc, hn::Mul(kf, hn::Set(df, in::kLn2Hi))),
                       hn::Mul(kf, hn::Set(df, in::kLn2Lo)));
  const VF z = hn::Mul(r, r);
  VF p = hn::Add(hn::Mul(hn::Set(df, in::kExpP0), r), hn::Set(df, in::kExpP1));
  p = hn::Add(hn::Mul(p, r), hn::Set(df, in::kExpP2));
  p = hn::Add(hn::Mul(p, r), hn::Set(df, in::kExpP3));
  p = hn::Add(hn::Mul(p, r), hn::Set(df, in::kExpP4));
  p = hn::Add(hn::Mul(p, r), hn::Set(df, in::kExpP5));
  VF y = hn::Add(hn::Add(hn::Mul(p, z), r), hn::Set(df, 1.0f));
  const VI k1 = hn::ShiftRight<1>(k);
  const VI k2 = hn::Sub(k, k1);
  const VI bias = hn::Set(di, 127);
  y = hn::Mul(y, hn::BitCast(df, hn::ShiftLeft<23>(hn::Add(k1, bias))));
  y = hn::Mul(y, hn::BitCast(df, hn::ShiftLeft<23>(hn::Add(k2, bias))));
  y = hn::IfThenElse(hn::Gt(x, hi), hn::Set(df, std::numeric_limits<float>::infinity()), y);
  y = hn::IfThenElse(hn::Lt(x, lo), hn::Zero(df), y);
  y = hn::IfThenElse(hn::IsNaN(x), x, y);  // (Highway's Ne is ordered: false for NaN)
  return y;
}

/// Canonical sum (layers_internal.h) of n terms; term(i, cnt) returns the vector of terms
/// i .. i + cnt − 1 (cnt ≤ N; lanes ≥ cnt are ignored, replaced by +0 here).
template <class Term>
HWY_INLINE double CanonSum(int64_t n, const Term& term) {
  const DF df;
  double total = 0.0;
  for (int64_t s0 = 0; s0 < n; s0 += in::kSuperChunk) {
    const int64_t s1 = std::min(n, s0 + in::kSuperChunk);
    double sup = 0.0;
    for (int64_t c0 = s0; c0 < s1; c0 += in::kSumChunk) {
      const int64_t c1 = std::min(s1, c0 + in::kSumChunk);
      VF acc[NA];
      for (int64_t j = 0; j < NA; ++j) acc[j] = hn::Zero(df);
      int64_t i = c0;
      for (; i + 16 <= c1; i += 16)
        for (int64_t j = 0; j < NA; ++j) acc[j] = hn::Add(acc[j], term(i + j * N, N));
      for (int64_t j = 0; j < NA; ++j) {
        const int64_t off = i + j * N;
        if (off >= c1) break;
        const int64_t cnt = std::min(N, c1 - off);
        VF v = term(off, cnt);
        if (cnt < N) v = hn::IfThenElseZero(hn::FirstN(df, static_cast<size_t>(cnt)), v);
        acc[j] = hn::Add(acc[j], v);
      }
      HWY_ALIGN float p[16];
      for (int64_t j = 0; j < NA; ++j) hn::Store(acc[j], df, p + j * N);
      sup += static_cast<double>(in::tree16(p));
    }
    total += sup;
  }
  return total;
}

// ---------------------------------------------------------------- RMSNorm
float RmsFwdRow(float* out, const float* x, const float* w, int64_t C, float eps) {
  const DF df;
  const double ss = CanonSum(C, [&](int64_t i, int64_t cnt) HWY_ATTR {
    const VF v = Ld(x + i, cnt);
    return hn::Mul(v, v);
  });
  const float r = static_cast<float>(
      1.0 / std::sqrt(ss / static_cast<double>(C) + static_cast<double>(eps)));
  const VF rv = hn::Set(df, r);
  Loop(C, [&](int64_t i, int64_t cnt) HWY_ATTR {
    St(hn::Mul(hn::Mul(Ld(x + i, cnt), rv), Ld(w + i, cnt)), out + i, cnt);
  });
  return r;
}

void RmsBwdRow(float* dx, const float* g, const float* x, const float* w, float r, int64_t C) {
  const DF df;
  const double dot = CanonSum(C, [&](int64_t i, int64_t cnt) HWY_ATTR {
    return hn::Mul(hn::Mul(Ld(w + i, cnt), Ld(g + i, cnt)), Ld(x + i, cnt));
  });
  const float k = static_cast<float>(dot * static_cast<double>(r) * static_cast<double>(r) /
                                     static_cast<double>(C));
  const VF rv = hn::Set(df, r), kv = hn::Set(df, k);
  Loop(C, [&](int64_t i, int64_t cnt) HWY_ATTR {
    const VF wg = hn::Mul(Ld(w + i, cnt), Ld(g + i, cnt));
    const VF d = hn::Mul(rv, hn::Sub(wg, hn::Mul(Ld(x + i, cnt), kv)));
    St(hn::Add(Ld(dx + i, cnt), d), dx + i, cnt);
  });
}

/// dweight[c0 .. c0 + n) += Σ_t (dout[t, c]·x[t, c])·rstd[t], n ≤ 64, t ascending from +0.
void RmsDwChunk(float* dweight, const float* dout, const float* x, const float* rstd,
                int64_t BT, int64_t C, int64_t c0, int64_t n) {
  const DF df;
  constexpr int64_t kV = 64 / N;
  VF acc[kV];
  const int64_t nv = (n + N - 1) / N;
  for (int64_t j = 0; j < kV; ++j) acc[j] = hn::Zero(df);
  for (int64_t t = 0; t < BT; ++t) {
    const float* g = dout + t * C + c0;
    const float* xr = x + t * C + c0;
    const VF r = hn::Set(df, rstd[t]);
    for (int64_t j = 0; j < nv; ++j) {
      const int64_t cnt = std::min(N, n - j * N);
      acc[j] = hn::Add(acc[j], hn::Mul(hn::Mul(Ld(g + j * N, cnt), Ld(xr + j * N, cnt)), r));
    }
  }
  for (int64_t j = 0; j < nv; ++j) {
    const int64_t cnt = std::min(N, n - j * N);
    float* d = dweight + c0 + j * N;
    St(hn::Add(Ld(d, cnt), acc[j]), d, cnt);
  }
}

// ---------------------------------------------------------------- RoPE
/// One token: H heads of hd (even) values, table rows c, s [hd] (layers_internal.h):
/// x[j] = x[j]·c[j] + x[j ^ 1]·s[j].
void RopeRow(float* x, const float* c, const float* s, int64_t H, int64_t hd) {
  const DF df;
  for (int64_t h = 0; h < H; ++h) {
    float* p = x + h * hd;
    if constexpr (N >= 2) {
      Loop(hd, [&](int64_t j, int64_t cnt) HWY_ATTR {
        const VF v = Ld(p + j, cnt);
        const VF sw = hn::Reverse2(df, v);
        St(hn::Add(hn::Mul(v, Ld(c + j, cnt)), hn::Mul(sw, Ld(s + j, cnt))), p + j, cnt);
      });
    } else {
      for (int64_t j = 0; j < hd; j += 2) {
        const float x0 = p[j], x1 = p[j + 1];
        p[j] = x0 * c[j] + x1 * s[j];
        p[j + 1] = x1 * c[j + 1] + x0 * s[j + 1];
      }
    }
  }
}

// ---------------------------------------------------------------- squared ReLU
HWY_INLINE VF Relu(VF x) {
  const DF df;
  return hn::IfThenElse(hn::Gt(x, hn::Zero(df)), x, hn::Zero(df));
}

void SqReluFwd(float* out, const float* x, int64_t n) {
  Loop(n, [&](int64_t i, int64_t cnt) HWY_ATTR {
    const VF r = Relu(Ld(x + i, cnt));
    St(hn::Mul(r, r), out + i, cnt);
  });
}

void SqReluBwd(float* dx, const float* dout, const float* x, int64_t n) {
  const DF df;
  const VF two = hn::Set(df, 2.0f);
  Loop(n, [&](int64_t i, int64_t cnt) HWY_ATTR {
    const VF r = Relu(Ld(x + i, cnt));
    St(hn::Add(Ld(dx + i, cnt), hn::Mul(Ld(dout + i, cnt), hn::Mul(two, r))), dx + i, cnt);
  });
}

// ---------------------------------------------------------------- SwiGLU
HWY_INLINE VF Sigmoid(VF g) {
  const DF df;
  const VF one = hn::Set(df, 1.0f);
  return hn::Div(one, hn::Add(one, ExpV(hn::Neg(g))));
}

void SwigluFwdRow(float* out, const float* g, const float* u, int64_t F) {
  Loop(F, [&](int64_t i, int64_t cnt) HWY_ATTR {
    const VF gv = Ld(g + i, cnt);
    St(hn::Mul(hn::Mul(gv, Sigmoid(gv)), Ld(u + i, cnt)), out + i, cnt);
  });
}

void SwigluBwdRow(float* dg, float* du, const float* d, const float* g, const float* u,
                  int64_t F) {
  const DF df;
  const VF one = hn::Set(df, 1.0f);
  Loop(F, [&](int64_t i, int64_t cnt) HWY_ATTR {
    const VF gv = Ld(g + i, cnt), uv = Ld(u + i, cnt), dv = Ld(d + i, cnt);
    const VF s = Sigmoid(gv);
    const VF silu = hn::Mul(gv, s);
    const VF ds = hn::Mul(s, hn::Add(one, hn::Mul(gv, hn::Sub(one, s))));
    St(hn::Add(Ld(dg + i, cnt), hn::Mul(hn::Mul(dv, uv), ds)), dg + i, cnt);
    St(hn::Add(Ld(du + i, cnt), hn::Mul(dv, silu)), du + i, cnt);
  });
}

// ---------------------------------------------------------------- cross-entropy
/// max of z[0..V) (V ≥ 1), + 0 (−0 → +0); from −inf.
HWY_INLINE float RowMax(const float* z, int64_t V) {
  const DF df;
  VF m = hn::Set(df, -std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + N <= V; i += N) m = hn::Max(m, hn::LoadU(df, z + i));
  float ms = hn::GetLane(hn::MaxOfLanes(df, m));
  for (; i < V; ++i) ms = std::max(ms, z[i]);
  return ms + 0.0f;
}

double CeFwdRow(const float* z, int64_t V, int64_t y) {
  const DF df;
  const float m = RowMax(z, V);
  const VF mv = hn::Set(df, m);
  const double sum = CanonSum(V, [&](int64_t i, int64_t cnt) HWY_ATTR {
    return ExpV(hn::Sub(Ld(z + i, cnt), mv));
  });
  return static_cast<double>(m) + std::log(sum) - static_cast<double>(z[y]);
}

void CeBwdRow(float* dz, const float* z, int64_t V, int64_t y, float scale) {
  const DF df;
  const float m = RowMax(z, V);
  const VF mv = hn::Set(df, m);
  const double sum = CanonSum(V, [&](int64_t i, int64_t cnt) HWY_ATTR {
    const VF e = ExpV(hn::Sub(Ld(z + i, cnt), mv));
    St(e, dz + i, cnt);
    return e;
  });
  const float inv = static_cast<float>(1.0 / sum);
  const float py = dz[y] * inv;
  const VF iv = hn::Set(df, inv), sv = hn::Set(df, scale);
  Loop(V, [&](int64_t i, int64_t cnt) HWY_ATTR {
    St(hn::Mul(hn::Mul(Ld(dz + i, cnt), iv), sv), dz + i, cnt);
  });
  dz[y] = (py - 1.0f) * scale;
}

// ---------------------------------------------------------------- residual, optimizer
void AddInto(float* x, const float* r, int64_t n) {
  Loop(n, [&](int64_t i, int64_t cnt) HWY_ATTR {
    St(hn::Add(Ld(x + i, cnt), Ld(r + i, cnt)), x + i, cnt);
  });
}

void AdamW(float* w, const float* g, float* m, float* v, int64_t n,
           const detail::AdamWCoeffs& k) {
  const DF df;
  const VF b1 = hn::Set(df, k.b1), b2 = hn::Set(df, k.b2), omb1 = hn::Set(df, k.omb1),
           omb2 = hn::Set(df, k.omb2), bc1 = hn::Set(df, k.bc1), bc2 = hn::Set(df, k.bc2),
           lr = hn::Set(df, k.lr), eps = hn::Set(df, k.eps), wd = hn::Set(df, k.wd);
  Loop(n, [&](int64_t i, int64_t cnt) HWY_ATTR {
    const VF gv = Ld(g + i, cnt), wv = Ld(w + i, cnt);
    const VF mv = hn::Add(hn::Mul(b1, Ld(m + i, cnt)), hn::Mul(omb1, gv));
    const VF vv = hn::Add(hn::Mul(b2, Ld(v + i, cnt)), hn::Mul(hn::Mul(omb2, gv), gv));
    const VF mh = hn::Div(mv, bc1), vh = hn::Div(vv, bc2);
    const VF upd = hn::Add(hn::Div(mh, hn::Add(hn::Sqrt(vh), eps)), hn::Mul(wd, wv));
    St(mv, m + i, cnt);
    St(vv, v + i, cnt);
    St(hn::Sub(wv, hn::Mul(lr, upd)), w + i, cnt);
  });
}

/// Canonical sum of (g[i]·s)·(g[i]·s) (detail::sum_squares; s = 1 or the rescaling 2^−k).
double SumSq(const float* g, int64_t n, float s) {
  const DF df;
  const VF sv = hn::Set(df, s);
  return CanonSum(n, [&](int64_t i, int64_t cnt) HWY_ATTR {
    const VF v = hn::Mul(Ld(g + i, cnt), sv);
    return hn::Mul(v, v);
  });
}

void Scale(float* g, int64_t n, float s) {
  const DF df;
  const VF sv = hn::Set(df, s);
  Loop(n, [&](int64_t i, int64_t cnt) HWY_ATTR { St(hn::Mul(Ld(g + i, cnt), sv), g + i, cnt); });
}

void Exp(float* out, const float* x, int64_t n) {
  Loop(n, [&](int64_t i, int64_t cnt) HWY_ATTR { St(ExpV(Ld(x + i, cnt)), out + i, cnt); });
}

}  // namespace fp4::nn::lf::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

// ------------------------------------------------------------------------------------------
// Dispatch and public API (compiled once).
#if HWY_ONCE
#include "fp4/numerics/hwy_dispatch.h"
namespace fp4::nn {
namespace lf {
namespace {

// Loops with less work (in elements) than this run on the calling thread only (waking a
// thread team costs more than it saves). Results do not depend on it.
constexpr int64_t kParallelMin = int64_t{1} << 15;
constexpr int64_t kElemChunk = int64_t{1} << 14;  // elements per task of elementwise kernels
constexpr int64_t kDwChunk = 64;                  // channels per task of the RMSNorm dweight

#define FP4_LF_KERNELS(NS, NAME)                                                            \
  Kernels {                                                                                 \
    NAME, &NS::RmsFwdRow, &NS::RmsBwdRow, &NS::RmsDwChunk, &NS::RopeRow, &NS::SqReluFwd,    \
        &NS::SqReluBwd, &NS::SwigluFwdRow, &NS::SwigluBwdRow, &NS::CeFwdRow, &NS::CeBwdRow, \
        &NS::AddInto, &NS::AdamW, &NS::SumSq, &NS::Scale, &NS::Exp                          \
  }

/// Every target compiled in (fp4/numerics/hwy_dispatch.h, named as quant_fast_targets() names
/// them); the one used is the one quant_fast_target() reports, so quant_fast_use_target()
/// selects these kernels too.
#define FP4_LF_ENTRY(NS, TARGET) {TARGET, FP4_LF_KERNELS(NS, hwy_dispatch::target_name(TARGET))},
const hwy_dispatch::Table<Kernels>& compiled() {
  static const hwy_dispatch::Table<Kernels> t({FP4_HWY_FOR_EACH_TARGET(FP4_LF_ENTRY)});
  return t;
}
#undef FP4_LF_ENTRY
#undef FP4_LF_KERNELS

/// The kernels of the target quant_fast_target() names.
const Kernels& active() {
  const std::string name = quant_fast_target();
  if (const Kernels* k = compiled().find(name)) return *k;
  throw std::logic_error("layers_fast: SIMD target '" + name + "' is not compiled into layers_fast.cpp");
}

/// f(i0, i1) over [0, n) in chunks of kElemChunk, threaded when n is large.
template <class F>
void for_chunks(int64_t n, const F& f) {
  const int64_t nc = (n + kElemChunk - 1) / kElemChunk;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t c = 0; c < nc; ++c) f(c * kElemChunk, std::min(n, (c + 1) * kElemChunk));
}

/// The cached RoPE table of (T, hd, theta): built once, shared by all later calls (a few
/// entries kept; lookups under a mutex, tables immutable once published).
std::shared_ptr<const internal::RopeTable> rope_table(int64_t T, int64_t hd, float theta) {
  static std::mutex mu;
  static std::vector<std::shared_ptr<const internal::RopeTable>> cache;
  constexpr size_t kKeep = 8;
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& e : cache)
    if (e->T == T && e->hd == hd && std::memcmp(&e->theta, &theta, sizeof theta) == 0) return e;
  auto tb = std::make_shared<internal::RopeTable>();
  internal::build_rope_table(*tb, T, hd, theta);
  if (cache.size() >= kKeep) cache.erase(cache.begin());
  cache.push_back(tb);
  return tb;
}

void rope(float* x, int64_t B, int64_t T, int64_t H, int64_t hd, float theta, bool bwd,
          const char* fn) {
  internal::check_rope(hd, fn);
  if (B <= 0 || T <= 0 || H <= 0) return;
  const Kernels& k = active();
  const auto tb = rope_table(T, hd, theta);
  const float* cs = tb->cos2.data();
  const float* sn = bwd ? tb->sin_bwd.data() : tb->sin_fwd.data();
#pragma omp parallel for schedule(static) if (B * T * H * hd >= kParallelMin)
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const int64_t t = bt % T;
    k.rope_row(x + bt * H * hd, cs + t * hd, sn + t * hd, H, hd);
  }
}

}  // namespace
}  // namespace lf

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* weight,
                     int64_t BT, int64_t C, float eps) {
  const lf::Kernels& k = lf::active();
#pragma omp parallel for schedule(static) if (BT * C >= lf::kParallelMin)
  for (int64_t t = 0; t < BT; ++t) rstd[t] = k.rms_fwd_row(out + t * C, x + t * C, weight, C, eps);
}

void rmsnorm_backward(float* dx, float* dweight, const float* dout, const float* x,
                      const float* weight, const float* rstd, int64_t BT, int64_t C) {
  const lf::Kernels& k = lf::active();
#pragma omp parallel for schedule(static) if (BT * C >= lf::kParallelMin)
  for (int64_t t = 0; t < BT; ++t)
    k.rms_bwd_row(dx + t * C, dout + t * C, x + t * C, weight, rstd[t], C);
  const int64_t nch = (C + lf::kDwChunk - 1) / lf::kDwChunk;
#pragma omp parallel for schedule(static) if (BT * C >= lf::kParallelMin)
  for (int64_t ch = 0; ch < nch; ++ch) {
    const int64_t c0 = ch * lf::kDwChunk;
    k.rms_dw_chunk(dweight, dout, x, rstd, BT, C, c0, std::min(lf::kDwChunk, C - c0));
  }
}

void rope_forward(float* x, int64_t B, int64_t T, int64_t H, int64_t hd, float theta) {
  lf::rope(x, B, T, H, hd, theta, false, "rope_forward");
}

void rope_backward(float* dx, int64_t B, int64_t T, int64_t H, int64_t hd, float theta) {
  lf::rope(dx, B, T, H, hd, theta, true, "rope_backward");
}

void squared_relu_forward(float* out, const float* x, int64_t n) {
  const lf::Kernels& k = lf::active();
  lf::for_chunks(n, [&](int64_t i0, int64_t i1) { k.sqrelu_fwd(out + i0, x + i0, i1 - i0); });
}

void squared_relu_backward(float* dx, const float* dout, const float* x, int64_t n) {
  const lf::Kernels& k = lf::active();
  lf::for_chunks(n, [&](int64_t i0, int64_t i1) {
    k.sqrelu_bwd(dx + i0, dout + i0, x + i0, i1 - i0);
  });
}

void swiglu_forward(float* out, const float* x, int64_t BT, int64_t F) {
  const lf::Kernels& k = lf::active();
#pragma omp parallel for schedule(static) if (BT * F >= lf::kParallelMin)
  for (int64_t t = 0; t < BT; ++t) {
    const float* g = x + t * 2 * F;
    k.swiglu_fwd_row(out + t * F, g, g + F, F);
  }
}

void swiglu_backward(float* dx, const float* dout, const float* x, int64_t BT, int64_t F) {
  const lf::Kernels& k = lf::active();
#pragma omp parallel for schedule(static) if (BT * F >= lf::kParallelMin)
  for (int64_t t = 0; t < BT; ++t) {
    const float* g = x + t * 2 * F;
    float* dg = dx + t * 2 * F;
    k.swiglu_bwd_row(dg, dg + F, dout + t * F, g, g + F, F);
  }
}

double cross_entropy_forward(float* losses, const float* logits, const int32_t* targets,
                             int64_t BT, int64_t V) {
  internal::check_ids(targets, BT, V, "cross_entropy_forward", "targets");
  if (BT <= 0) return 0.0;
  const lf::Kernels& k = lf::active();
  static thread_local std::vector<double> row;  // per-row losses; reused across calls
  if (row.size() < static_cast<size_t>(BT)) row.resize(static_cast<size_t>(BT));
  double* rw = row.data();
#pragma omp parallel for schedule(static) if (BT * V >= lf::kParallelMin)
  for (int64_t t = 0; t < BT; ++t) rw[t] = k.ce_fwd_row(logits + t * V, V, targets[t]);
  double total = 0.0;
  for (int64_t t = 0; t < BT; ++t) {
    total += rw[t];
    if (losses) losses[t] = static_cast<float>(rw[t]);
  }
  return total / static_cast<double>(BT);
}

void cross_entropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                            int64_t BT, int64_t V, float scale) {
  internal::check_ids(targets, BT, V, "cross_entropy_backward", "targets");
  const lf::Kernels& k = lf::active();
#pragma omp parallel for schedule(static) if (BT * V >= lf::kParallelMin)
  for (int64_t t = 0; t < BT; ++t)
    k.ce_bwd_row(dlogits + t * V, logits + t * V, V, targets[t], scale);
}

void residual_add(float* x, const float* r, int64_t n) {
  const lf::Kernels& k = lf::active();
  lf::for_chunks(n, [&](int64_t i0, int64_t i1) { k.add(x + i0, r + i0, i1 - i0); });
}

namespace detail {

void exp_fast(float* out, const float* x, int64_t n) {
  if (n > 0) lf::active().exp(out, x, n);
}

void adamw_update(float* w, const float* g, float* m, float* v, int64_t n,
                  const AdamWCoeffs& c) {
  const lf::Kernels& k = lf::active();
  lf::for_chunks(n, [&](int64_t i0, int64_t i1) {
    k.adamw(w + i0, g + i0, m + i0, v + i0, i1 - i0, c);
  });
}

namespace {
/// Canonical sum of (g[i]·sc)², threaded over superchunks (their sums added in order).
double sum_squares_scaled(const float* g, int64_t n, float sc) {
  const lf::Kernels& k = lf::active();
  const int64_t ns = (n + internal::kSuperChunk - 1) / internal::kSuperChunk;
  if (ns == 1) return k.sumsq(g, n, sc);
  static thread_local std::vector<double> part;  // superchunk sums; reused across calls
  if (part.size() < static_cast<size_t>(ns)) part.resize(static_cast<size_t>(ns));
  double* p = part.data();
#pragma omp parallel for schedule(static)
  for (int64_t s = 0; s < ns; ++s) {
    const int64_t i0 = s * internal::kSuperChunk;
    p[s] = k.sumsq(g + i0, std::min(n, i0 + internal::kSuperChunk) - i0, sc);
  }
  double total = 0.0;
  for (int64_t s = 0; s < ns; ++s) total += p[s];
  return total;
}
}  // namespace

double sum_squares(const float* g, int64_t n) {
  if (n <= 0) return 0.0;
  const double s = sum_squares_scaled(g, n, 1.0f);
  if (s != std::numeric_limits<double>::infinity()) return s;
  const int k = internal::sumsq_rescale_exponent(g, n);  // see layers_internal.h
  if (k < 0) return s;                                   // a ±Inf entry
  return std::ldexp(sum_squares_scaled(g, n, std::ldexp(1.0f, -k)), 2 * k);
}

void scale_inplace(float* g, int64_t n, float s) {
  const lf::Kernels& k = lf::active();
  lf::for_chunks(n, [&](int64_t i0, int64_t i1) { k.scale(g + i0, i1 - i0, s); });
}

}  // namespace detail
}  // namespace fp4::nn
#endif  // HWY_ONCE
