// Quantized Linear: fprop, dgrad, wgrad per NUMERICS.md: decoded-operand FP32 GEMMs (FP4),
// native BF16 GEMMs (BF16 mode), FP32 GEMMs (FP32).
#include "fp4/nn/linear.h"

#include <algorithm>
#include <stdexcept>

#include "fp4/bf16.h"
#include "fp4/gemm.h"
#include "fp4/hadamard.h"
#include "fp4/probe_gemm.h"
#include "fp4/profile.h"
#include "fp4/quant_fast.h"

namespace fp4::nn {
namespace {
using prof::Cat;
using prof::Scope;

// fp4::sgemm timed as GEMM kind c (fprop / dgrad / wgrad) and credited 2·M·N·K FLOPs.
void timed_sgemm(Cat c, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A,
                 int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  Scope s(c);
  prof::add_flops(c, 2.0 * double(M) * double(N) * double(K));
  sgemm(ta, tb, M, N, K, 1.f, A, lda, B, ldb, beta, C, ldc);
}

// fp4::gemm_bf16 timed and credited likewise.
void timed_gemm_bf16(Cat c, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t* A,
                     int64_t lda, const uint16_t* B, int64_t ldb, bool accumulate, float* C,
                     int64_t ldc) {
  Scope s(c);
  prof::add_flops(c, 2.0 * double(M) * double(N) * double(K));
  gemm_bf16(ta, tb, M, N, K, A, lda, B, ldb, accumulate, C, ldc);
}
// out [cols, rows] = inᵀ for in [rows, cols]; cache-blocked, any thread count gives the same bits.
void transpose(const float* in, int64_t rows, int64_t cols, float* out) {
  constexpr int64_t B = 32;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t i0 = 0; i0 < rows; i0 += B)
    for (int64_t j0 = 0; j0 < cols; j0 += B) {
      const int64_t i1 = std::min(rows, i0 + B), j1 = std::min(cols, j0 + B);
      for (int64_t i = i0; i < i1; ++i)
        for (int64_t j = j0; j < j1; ++j) out[j * rows + i] = in[i * cols + j];
    }
}
// c [ra, rb] (+)= A·Bᵀ in the probe-matched mode (NUMERICS.md "GEMM emulation"): A [ra, k] and
// B [rb, k] quantized along k with their specs/references/SR keys, then fp4::probe_gemm.
void probe_product(const float* a, int64_t ra, const BlockQuantSpec& sa, float ga, const SrKey* ka,
                   const float* b, int64_t rb, const BlockQuantSpec& sb, float gb,
                   const SrKey* kb, int64_t k, float* c, bool accumulate,
                   AlignedFloats& scratch) {
  const QuantizedTensor qa =
      quantize_blocks(a, ra, k, sa, ga, sa.rounding == Rounding::SR8 ? ka : nullptr);
  const QuantizedTensor qb =
      quantize_blocks(b, rb, k, sb, gb, sb.rounding == Rounding::SR8 ? kb : nullptr);
  if (!accumulate) return probe_gemm(qa, qb, c);
  scratch.resize(ra * rb);
  probe_gemm(qa, qb, scratch.data());
  for (int64_t i = 0; i < ra * rb; ++i) c[i] += scratch[i];
}

// Whether two specs quantize identically (every field of BlockQuantSpec).
bool same_quantization(const BlockQuantSpec& a, const BlockQuantSpec& b) {
  return a.scale_format == b.scale_format && a.block == b.block && a.two_d == b.two_d &&
         a.target == b.target && a.rounding == b.rounding && a.element.kind == b.element.kind &&
         a.element.fp == b.element.fp && a.element.int_min == b.element.int_min &&
         a.element.int_max == b.element.int_max &&
         a.scale_rule == b.scale_rule && a.scale_desc == b.scale_desc;
}

constexpr uint32_t kOpX = 0, kOpW = 1, kOpDY = 2;
constexpr uint32_t kFprop = 0, kDgrad = 1, kWgrad = 2;
}  // namespace

Linear::Linear(int id, int64_t in, int64_t out, LinearMode mode, const Recipe& recipe)
    : Linear(id, in, out, LinearPlan::uniform(recipe, mode), recipe) {}

Linear::Linear(int id, int64_t in, int64_t out, const LinearPlan& plan, const Recipe& recipe)
    : id_(id), K_(in), N_(out), mode_(plan.mode), recipe_(recipe), plan_(plan) {
  const LinearMode mode = plan.mode;
  const int D = mode == LinearMode::FP4 ? recipe.amax_interval : 1;
  for (auto& r : ref_) r = TensorReference(D);
}

int64_t Linear::scratch_bytes() const {
  int64_t n = 0;
  for (const AlignedFloats* b : {&xq_, &wq_, &wqd_, &dyq_, &t0_, &t1_}) n += int64_t(b->capacity());
  n *= int64_t(sizeof(float));
  for (const auto* b : {&xb_, &wb_, &dyb_}) n += int64_t(b->capacity() * sizeof(uint16_t));
  return n;
}

void Linear::reset_inference(int replay_interval) {
  inf_ = InferenceState{};
  inf_.x = TensorReference(replay_interval);
}

float Linear::reference_for(Role r, const float* x, int64_t n, const StepContext& ctx) {
  Scope s(Cat::kQuantAmax);
  if (ctx.training) return ref_[static_cast<int>(r)].get(ctx.step, [&] { return amax_fast(x, n); });
  // Inference: its own references (InferenceRef), never the training caches ref_.
  if (r == Role::W) {
    if (!inf_.has_w) inf_.w = amax_fast(x, n), inf_.has_w = true;
    return inf_.w;
  }
  switch (ctx.infer_ref) {
    case InferenceRef::Current:
      return amax_fast(x, n);
    case InferenceRef::Replay:
      return inf_.x.get(ctx.infer_batch, [&] { return amax_fast(x, n); });
    case InferenceRef::Calibrate: {
      const float g = amax_fast(x, n);
      inf_.calibrated_x = inf_.has_calibrated ? std::max(inf_.calibrated_x, g) : g;
      inf_.has_calibrated = true;
      return g;
    }
    case InferenceRef::Frozen:
      if (!inf_.has_calibrated)
        throw std::logic_error("Linear " + std::to_string(id_) +
                               ": frozen inference reference used before calibration");
      return inf_.calibrated_x;
  }
  throw std::logic_error("Linear: unknown inference reference policy");
}

void Linear::prep(const float* src, int64_t rows, int64_t cols, const BlockQuantSpec& spec,
                  float g, const SrKey* key, float* out) const {
  Scope s(Cat::kQuantRow);
  quantize_dequantize_fast(src, rows, cols, spec, g,
                           spec.rounding == Rounding::SR8 ? key : nullptr, out);
}

void Linear::forward(const float* X, float* Y, int64_t M, const StepContext& ctx) {
  if (!W_) throw std::logic_error("Linear::forward: weights not bound");
  X_ = X;
  M_ = M;
  // Training moves the weights: a frozen inference weight amax or calibration is stale.
  if (ctx.training && (inf_.has_w || inf_.has_calibrated || inf_.x.has_value()))
    reset_inference(inf_.x.interval());
  quantized_ = ctx.quantize && mode_ != LinearMode::FP32;
  if (!quantized_) {
    timed_sgemm(Cat::kGemmFprop, false, true, M, N_, K_, X, K_, W_, K_, 0.f, Y, N_);
    return;
  }
  if (mode_ == LinearMode::BF16) {  // BF16 operands (RNE), FP32 accumulate; kept for backward
    xb_.resize(M * K_);
    wb_.resize(N_ * K_);
    {
      Scope s(Cat::kQuantBf16);
      to_bf16_bits(X, M * K_, xb_.data());
      to_bf16_bits(W_, N_ * K_, wb_.data());
    }
    timed_gemm_bf16(Cat::kGemmFprop, false, true, M, N_, K_, xb_.data(), K_, wb_.data(), K_, false, Y, N_);
    return;
  }
  xq_.resize(M * K_);
  wq_.resize(N_ * K_);
  float gx = 0, gw = 0;
  if (mode_ == LinearMode::FP4) {
    refs_.g_x = gx = reference_for(Role::X, X, M * K_, ctx);
    refs_.g_w = gw = reference_for(Role::W, W_, N_ * K_, ctx);
  }
  const SrKey kx{ctx.seed, uint32_t(ctx.step), uint32_t(id_), kOpX, kFprop};
  const SrKey kw{ctx.seed, uint32_t(ctx.step), uint32_t(id_), kOpW, kFprop};
  tel_.valid = false;
  if (ctx.telemetry && ctx.training && mode_ == LinearMode::FP4) {
    Scope s(Cat::kTelemetry);
    tel_.op[0] = quant_stats(X, M, K_, plan_.spec(Gemm::Fprop, Operand::X), gx, &kx);
    tel_.op[1] = quant_stats(W_, N_, K_, plan_.spec(Gemm::Fprop, Operand::W), gw, &kw);
  }
  if (probe()) {  // fidelity mode: quantized operands into the probe-matched GEMM
    Scope s(Cat::kGemmFprop);
    prof::add_flops(Cat::kGemmFprop, 2.0 * double(M) * double(N_) * double(K_));
    probe_product(X, M, plan_.spec(Gemm::Fprop, Operand::X), gx, &kx, W_, N_, plan_.spec(Gemm::Fprop, Operand::W), gw, &kw, K_, Y,
                  false, t0_);
    return;
  }
  prep(X, M, K_, plan_.spec(Gemm::Fprop, Operand::X), gx, &kx, xq_.data());   // X blocks along K
  prep(W_, N_, K_, plan_.spec(Gemm::Fprop, Operand::W), gw, &kw, wq_.data()); // W tiles (or blocks along K)
  timed_sgemm(Cat::kGemmFprop, false, true, M, N_, K_, xq_.data(), K_, wq_.data(), K_, 0.f, Y, N_);
}

void Linear::backward(const float* dY, float* dX, int64_t M, const StepContext& ctx) {
  if (M != M_ || !X_) throw std::logic_error("Linear::backward without matching forward");
  if (!quantized_) {
    if (dX) timed_sgemm(Cat::kGemmDgrad, false, false, M, K_, N_, dY, N_, W_, K_, 1.f, dX, K_);
    timed_sgemm(Cat::kGemmWgrad, true, false, N_, K_, M, dY, N_, X_, K_, 1.f, dW_, K_);
    return;
  }
  if (mode_ == LinearMode::BF16) {  // the fprop BF16 X and W, dY rounded to BF16 (RNE)
    dyb_.resize(M * N_);
    {
      Scope s(Cat::kQuantBf16);
      to_bf16_bits(dY, M * N_, dyb_.data());
    }
    if (dX) timed_gemm_bf16(Cat::kGemmDgrad, false, false, M, K_, N_, dyb_.data(), N_, wb_.data(), K_, true, dX, K_);
    timed_gemm_bf16(Cat::kGemmWgrad, true, false, N_, K_, M, dyb_.data(), N_, xb_.data(), K_, true, dW_, K_);
    return;
  }
  dyq_.resize(M * N_);
  // FP4. dY has one reference shared by dgrad and wgrad (NUMERICS.md "Tensor reference").
  if (recipe_.rht_wgrad && M % 16 != 0)  // checked before any gradient is accumulated
    throw std::invalid_argument("Linear " + std::to_string(id_) + ": RHT needs the token count " +
                                std::to_string(M) + " to be a multiple of 16");
  const float gdy = refs_.g_dy = reference_for(Role::DY, dY, M * N_, ctx);
  const uint32_t step = uint32_t(ctx.step), id = uint32_t(id_);

  // dgrad: dX [M,K] += q(dY, blocks along N) · q(W). Contraction over N.
  const bool tel = ctx.telemetry && ctx.training;
  if (tel) {
    Scope s(Cat::kTelemetry);
    const SrKey k{ctx.seed, step, id, kOpDY, kDgrad};
    tel_.op[2] = quant_stats(dY, M, N_, plan_.spec(Gemm::Dgrad, Operand::DY), gdy, &k);
  }
  if (probe()) {
    Scope s(Cat::kGemmWgrad);  // probe-matched mode: dgrad and wgrad timed together
    prof::add_flops(Cat::kGemmWgrad, 4.0 * double(M) * double(N_) * double(K_));
    // dgrad contracts over N: dY [M,N] along N and Wᵀ [K,N] along N (tiles are symmetric).
    // wgrad contracts over tokens: dYᵀ [N,M] and Xᵀ [K,M] along M, after the RHT if any.
    const SrKey kd{ctx.seed, step, id, kOpDY, kDgrad}, kw{ctx.seed, step, id, kOpW, kDgrad};
    if (dX) {
      t0_.resize(N_ * K_);
      transpose(W_, N_, K_, t0_.data());
      probe_product(dY, M, plan_.spec(Gemm::Dgrad, Operand::DY), gdy, &kd, t0_.data(), K_, plan_.spec(Gemm::Dgrad, Operand::W),
                    refs_.g_w, &kw, N_, dX, true, t1_);
    }
    std::vector<float> dyt(N_ * M), xt(K_ * M);
    transpose(dY, M, N_, dyt.data());
    transpose(X_, M, K_, xt.data());
    float g_dyt = gdy, g_xt = refs_.g_x;
    if (recipe_.rht_wgrad) {
      if (M % 16 != 0)
        throw std::invalid_argument("Linear " + std::to_string(id_) +
                                    ": RHT needs the token count to be a multiple of 16");
      rht16_rows(dyt.data(), N_, M);
      rht16_rows(xt.data(), K_, M);
      g_dyt = reference_for(Role::DYT_RHT, dyt.data(), N_ * M, ctx);
      g_xt = reference_for(Role::XT_RHT, xt.data(), K_ * M, ctx);
    }
    const SrKey kdw{ctx.seed, step, id, kOpDY, kWgrad}, kxw{ctx.seed, step, id, kOpX, kWgrad};
    if (tel) {
      tel_.op[3] = quant_stats(dyt.data(), N_, M, plan_.spec(Gemm::Wgrad, Operand::DY), g_dyt, &kdw);
      tel_.op[4] = quant_stats(xt.data(), K_, M, plan_.spec(Gemm::Wgrad, Operand::X), g_xt, &kxw);
      tel_.valid = true;
    }
    probe_product(dyt.data(), N_, plan_.spec(Gemm::Wgrad, Operand::DY), g_dyt, &kdw, xt.data(), K_,
                  plan_.spec(Gemm::Wgrad, Operand::X), g_xt, &kxw, M, dW_, true, t1_);
    return;
  }
  if (dX) {
    const SrKey k{ctx.seed, step, id, kOpDY, kDgrad};
    {
      Scope s(Cat::kQuantRow);
      quantize_dequantize_fast(dY, M, N_, plan_.spec(Gemm::Dgrad, Operand::DY), gdy, &k, dyq_.data());
    }
    const BlockQuantSpec& sw = plan_.spec(Gemm::Dgrad, Operand::W);
    const float* wd = wq_.data();
    if (sw.two_d && !same_quantization(sw, plan_.spec(Gemm::Fprop, Operand::W))) {
      // 2-D tiles are the same for W and Wᵀ, but an override gave dgrad's W its own T or
      // rounding: quantize W again from the high-precision weight with dgrad's spec and keys.
      const SrKey kw{ctx.seed, step, id, kOpW, kDgrad};
      wqd_.resize(N_ * K_);
      Scope s(Cat::kQuantRow);
      quantize_dequantize_fast(W_, N_, K_, sw, refs_.g_w, &kw, wqd_.data());
      wd = wqd_.data();
    } else if (!sw.two_d) {
      // 1-D weight blocks run along K for fprop; dgrad contracts over N, so quantize Wᵀ
      // [K, N] along N from the high-precision weight, never from the fprop copy.
      const SrKey kw{ctx.seed, step, id, kOpW, kDgrad};
      t0_.resize(N_ * K_);
      wqd_.resize(N_ * K_);
      {
        Scope s(Cat::kTranspose);
        transpose(W_, N_, K_, t0_.data());
      }
      {
        Scope s(Cat::kQuantRow);
        quantize_dequantize_fast(t0_.data(), K_, N_, sw, refs_.g_w, &kw, t0_.data());
      }
      Scope s(Cat::kTranspose);
      transpose(t0_.data(), K_, N_, wqd_.data());
      wd = wqd_.data();
    }
    timed_sgemm(Cat::kGemmDgrad, false, false, M, K_, N_, dyq_.data(), N_, wd, K_, 1.f, dX, K_);
  }

  // wgrad: dW [N,K] += q(dYᵀ [N,M], blocks along M) · q(Xᵀ [K,M], blocks along M)ᵀ, the
  // transposes (and the RHT) fused into the quantizer. With the RHT the references are those
  // of the transformed tensors; without it, the fprop X and dgrad dY references are reused.
  const bool rht = recipe_.rht_wgrad;
  if (rht && M % 16 != 0)
    throw std::invalid_argument("Linear " + std::to_string(id_) + ": RHT needs the token count " +
                                std::to_string(M) + " to be a multiple of 16");
  float g_dyt = gdy, g_xt = refs_.g_x;
  if (rht) {
    const float* x = X_;
    Scope s(Cat::kQuantAmax);
    g_dyt = ref_[int(Role::DYT_RHT)].get(ctx.step, [&] { return amax_rht16_transposed(dY, M, N_); });
    g_xt = ref_[int(Role::XT_RHT)].get(ctx.step, [&] { return amax_rht16_transposed(x, M, K_); });
  }
  const SrKey kd{ctx.seed, step, id, kOpDY, kWgrad};
  const SrKey kx{ctx.seed, step, id, kOpX, kWgrad};
  t0_.resize(N_ * M);
  t1_.resize(K_ * M);
  if (tel) {
    Scope s(Cat::kTelemetry);
    // Telemetry needs the operands as quantized: materialise the (transformed) transposes.
    transpose(dY, M, N_, t0_.data());
    transpose(X_, M, K_, t1_.data());
    if (rht) {
      rht16_rows(t0_.data(), N_, M);
      rht16_rows(t1_.data(), K_, M);
    }
    tel_.op[3] = quant_stats(t0_.data(), N_, M, plan_.spec(Gemm::Wgrad, Operand::DY), g_dyt, &kd);
    tel_.op[4] = quant_stats(t1_.data(), K_, M, plan_.spec(Gemm::Wgrad, Operand::X), g_xt, &kx);
    tel_.valid = true;
  }
  {
    Scope s(Cat::kQuantWgrad);
    quantize_dequantize_transposed_fast(dY, M, N_, plan_.spec(Gemm::Wgrad, Operand::DY), g_dyt, &kd, rht, t0_.data());
  quantize_dequantize_transposed_fast(X_, M, K_, plan_.spec(Gemm::Wgrad, Operand::X), g_xt,
                                      plan_.spec(Gemm::Wgrad, Operand::X).rounding == Rounding::SR8 ? &kx : nullptr, rht,
                                      t1_.data());
  }
  timed_sgemm(Cat::kGemmWgrad, false, true, N_, K_, M, t0_.data(), M, t1_.data(), M, 1.f, dW_, K_);
}

}  // namespace fp4::nn
