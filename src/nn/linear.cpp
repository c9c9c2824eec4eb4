// Quantized Linear: fprop, dgrad, wgrad per docs/numerics.md: decoded-operand FP32 GEMMs (FP4),
// native BF16 GEMMs (BF16 mode), FP32 GEMMs (FP32).
#include "fp4/nn/linear.h"

#include <algorithm>
#include <bit>
#include <stdexcept>

#include "fp4/numerics/q8_0.h"
#include "fp4/numerics/bf16.h"
#include "fp4/numerics/format.h"
#include "fp4/gemm/gemm.h"
#include "fp4/numerics/hadamard.h"
#include "fp4/gemm/probe_gemm.h"
#include "fp4/base/error.h"
#include "fp4/base/profile.h"
#include "fp4/numerics/pack_fast.h"
#include "fp4/numerics/quant_fast.h"
#include "fp4/numerics/ms_eden.h"

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
// fp4::gemm_block_scaled timed and credited likewise (the decoded-bf16 GEMM).
void timed_block_scaled(Cat c, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                        BlockScaledOperand A, float gd_a, BlockScaledOperand B, float gd_b,
                        bool accumulate, float* C, BlockScaledGemmScratch& scratch) {
  Scope s(c);
  prof::add_flops(c, 2.0 * double(M) * double(N) * double(K));
  gemm_block_scaled(ta, tb, M, N, K, A, gd_a, B, gd_b, accumulate, C, scratch);
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
// One operand of a probe-matched GEMM, quantized along the contraction dim k: x is [rows, k], or
// with `transposed` x is [k, rows] and its transpose is the operand (blocks then run along x's
// rows, SR byte (r, j) of the operand is sr_byte(key, r·k + j), as quantize_blocks of xᵀ).
struct ProbeSrc {
  const float* x;
  int64_t rows;
  bool transposed;
  const BlockQuantSpec& spec;
  float g;
  const SrKey* key;  // used when spec.rounding is SR8
};
// Whether the fast packed quantizers take the spec (E2M1 with a ScaleFormat scale: pack_fast.h).
bool packable_for_probe(const BlockQuantSpec& s) { return s.element.is_e2m1() && s.scale_desc == nullptr; }

// c [A.rows, B.rows] (+)= A·Bᵀ in the probe-matched mode (docs/numerics.md "GEMM emulation"):
// both operands quantized along k with their specs/references/SR keys, then fp4::probe_gemm
// with the default accumulator and the recipe's snap. Packable specs go through
// quantize_pack_fast / quantize_pack_transposed_fast into ws.pa / ws.pb (bit-identical to
// quantize_blocks: tests/numerics/test_pack_fast.cpp; the Linear against the scalar composition:
// tests/nn/test_linear.cpp, expect_probe_linear); other element or spelled scale formats
// through quantize_blocks, which leaves probe_gemm to refuse what it cannot model.
void probe_product(const ProbeSrc& A, const ProbeSrc& B, int64_t k, float* c, bool accumulate,
                   LinearWorkspace& ws, ScratchFloats& scratch, const LinearPlan& plan) {
  ProbeGemmOptions opt;  // the default accumulator (chunk 64, RTZ) with the recipe's snap and α
  opt.accumulator.snap = plan.probe_snap;
  opt.alpha = plan.probe_alpha;
  float* out = accumulate ? scratch.get(A.rows * B.rows) : c;
  const SrKey* ka = A.spec.rounding == Rounding::SR8 ? A.key : nullptr;
  const SrKey* kb = B.spec.rounding == Rounding::SR8 ? B.key : nullptr;
  if (packable_for_probe(A.spec) && packable_for_probe(B.spec)) {
    auto quant = [k](const ProbeSrc& o, const SrKey* key, QTensor& q) {
      if (o.transposed) quantize_pack_transposed_fast(o.x, k, o.rows, o.spec, o.g, key, false, q);
      else quantize_pack_fast(o.x, o.rows, k, o.spec, o.g, key, q);
    };
    quant(A, ka, ws.pa);
    quant(B, kb, ws.pb);
    probe_gemm(ws.pa, ws.pb, out, opt);
  } else {
    auto quant = [k](const ProbeSrc& o, const SrKey* key) {
      if (!o.transposed) return quantize_blocks(o.x, o.rows, k, o.spec, o.g, key);
      std::vector<float> t(static_cast<size_t>(o.rows * k));
      transpose(o.x, k, o.rows, t.data());
      return quantize_blocks(t.data(), o.rows, k, o.spec, o.g, key);
    };
    probe_gemm(quant(A, ka), quant(B, kb), out, opt);
  }
  if (!accumulate) return;
  for (int64_t i = 0; i < A.rows * B.rows; ++i) c[i] += out[i];
}

// out[i] = round_bf16(in[i]) for i < n (the recipe's BF16 boundary, docs/numerics.md "BF16
// boundary"): fp4::round_bf16_array, elementwise, so any thread count gives the same bits.
void round_bf16_into(const float* in, int64_t n, float* out) { round_bf16_array(in, n, out); }

// Whether a spec's quantizer reads the tensor reference g (the MX scale rules do not).
bool uses_g(const BlockQuantSpec& s) { return s.scale_rule == ScaleRule::TensorScaled; }

constexpr uint32_t kOpX = 0, kOpW = 1, kOpDY = 2;
constexpr uint32_t kFprop = 0, kDgrad = 1, kWgrad = 2;
}  // namespace

float* ScratchFloats::get(int64_t n) {
  if (n > cap_) {
    p_.reset();  // free first: the old contents are not kept, so never hold both
    p_.reset(static_cast<float*>(
        ::operator new(static_cast<size_t>(n) * sizeof(float), std::align_val_t{64})));
    cap_ = n;
  }
  return p_.get();
}

int64_t LinearWorkspace::bytes() const {
  int64_t packed = 0;
  for (const QTensor* q : {&pa, &pb})
    packed += int64_t(q->packed.capacity() + q->scale_codes.capacity());
  const int64_t bf16 =
      int64_t((gemm.a.capacity() + gemm.b.capacity()) * sizeof(uint16_t) +
              (gemm.product.capacity() + gemm.wa.capacity() + gemm.wb.capacity()) * sizeof(float));
  return (row.capacity() + wqd.capacity() + t0.capacity() + t1.capacity()) *
             int64_t(sizeof(float)) + packed + bf16;
}

Linear::Linear(int id, int64_t in, int64_t out, const LinearPlan& plan)
    : id_(id), K_(in), N_(out), mode_(plan.mode), plan_(plan),
      ws_(std::make_shared<LinearWorkspace>()) {
  for (auto& r : ref_) r = TensorReference(plan.reference_interval());
  if (row_scaled_x() && plan.probe())  // the recipe parser refuses this pair with a UserError
    throw std::invalid_argument("Linear: row_scaled_activation needs the decoded GEMM");
  // decoded-bf16 takes one decode scale per operand and the block quantizer's q·c_b; the recipe
  // parser refuses these with a UserError, a LinearPlan built in code meets them here.
  if (plan.bf16_gemm() && (row_scaled_x() || plan.quartet_forward() || plan.ms_eden()))
    throw std::invalid_argument("Linear: linear.gemm = decoded-bf16 takes neither a row-scaled X "
                                "nor Quartet II's quantizers (use the decoded GEMM)");
  // The activation operands whose quantizer is the fused SIMD kernel (quant_fast_slow_path
  // names no other path): only those are quantized straight to BF16 (bf16_operands), since a
  // composed path would first stage a whole FP32 copy of the operand.
  if (plan.bf16_gemm()) {
    auto simd = [&](Gemm g, Operand o) {
      const bool t = g == Gemm::Wgrad;
      return quant_fast_slow_path(plan.spec(g, o), t, t && plan.rht_wgrad, plan.hadamard_size)
          .empty();
    };
    simd_x_ = simd(Gemm::Fprop, Operand::X);
    simd_dy_ = simd(Gemm::Dgrad, Operand::DY);
    simd_wgrad_ = simd(Gemm::Wgrad, Operand::DY) && simd(Gemm::Wgrad, Operand::X);
  }
}

int64_t Linear::scratch_bytes() const {
  int64_t n = 0;
  n += int64_t((wq_.capacity() + xr_.capacity() + dyr_.capacity()) * sizeof(float));
  for (const auto* b : {&xb_, &wb_, &dyb_}) n += int64_t(b->capacity() * sizeof(uint16_t));
  return n;
}

void Linear::bind_workspace(std::shared_ptr<LinearWorkspace> ws) {
  ws_ = ws ? std::move(ws) : std::make_shared<LinearWorkspace>();
}

Linear::WorkspaceFloats Linear::workspace_floats(const LinearPlan& plan, int64_t K, int64_t N,
                                                 int64_t M) {
  WorkspaceFloats f;
  if (plan.mode != LinearMode::FP4 || plan.probe()) return f;  // probe-matched: grows on use
  if (plan.ms_eden()) {  // backward_ms_eden: inner dims padded to a multiple of the transform
    const int64_t n = plan.hadamard_size, Np = (N + n - 1) / n * n, Mp = (M + n - 1) / n * n;
    f.row = std::max(M * K, M * Np);  // fprop X; dgrad E(dY·H)
    f.wqd = K * Np;                   // dgrad E(Ŵᵀ·H)
    f.t0 = N * Mp;                    // wgrad E(dYᵀ·H)
    f.t1 = std::max(K * Mp, M * K);   // wgrad E(X̂ᵀ·H); dgrad's BF16-output product
    return f;
  }
  f.row = M * std::max(K, N);  // fprop X; dgrad dY
  const BlockQuantSpec& sw = plan.spec(Gemm::Dgrad, Operand::W);
  const bool own_dgrad_w = !sw.two_d || sw != plan.spec(Gemm::Fprop, Operand::W);
  if (own_dgrad_w || plan.dgrad_hadamard()) f.wqd = N * K;
  f.t0 = std::max(sw.two_d && !plan.dgrad_hadamard() ? 0 : N * K, N * M);  // dgrad Wᵀ; wgrad dYᵀ
  f.t1 = K * M;                                   // wgrad Xᵀ
  // gemm_block_scaled's BF16 copies of FP32 operands: fprop X, W; dgrad dY, W; wgrad dYᵀ, Xᵀ.
  // Where the activation operands come as BF16 (bf16_operands) only the weights' copies are
  // made, so this over-reserves there (kept: the estimate is the same on every path).
  if (plan.bf16_gemm()) {
    f.bf16_a = M * std::max(K, N);
    f.bf16_b = std::max(N * K, K * M);
    f.product = std::max(M * K, N * K);  // dgrad dX, wgrad dW (accumulating)
  }
  return f;
}

void Linear::reserve_workspace(int64_t M) {
  if (mode_ != LinearMode::FP4 || probe()) return;
  LinearWorkspace& ws = *ws_;
  ws.xq.valid = false;
  const WorkspaceFloats f = workspace_floats(plan_, K_, N_, M);
  ws.row.get(f.row);
  if (f.wqd) ws.wqd.get(f.wqd);
  ws.t0.get(f.t0);
  ws.t1.get(f.t1);
  if (f.bf16_a) reserve_block_scaled(ws.gemm, f.bf16_a, f.bf16_b, f.product);
}

bool Linear::uses_reference(Role r) const {
  // Row-scaled X and Xᵀ measure per-row references at every call and hold none.
  if (row_scaled_x() && (r == Role::X || r == Role::XT_RHT)) return false;
  const bool rht = plan_.rht_wgrad, dh = plan_.hadamard_dgrad;
  auto sp = [&](Gemm g, Operand o) { return uses_g(plan_.spec(g, o)); };
  switch (r) {
    case Role::X: return sp(Gemm::Fprop, Operand::X) || (!rht && sp(Gemm::Wgrad, Operand::X));
    case Role::W: return sp(Gemm::Fprop, Operand::W) || (!dh && sp(Gemm::Dgrad, Operand::W));
    case Role::DY:
      return (!dh && sp(Gemm::Dgrad, Operand::DY)) || (!rht && sp(Gemm::Wgrad, Operand::DY));
    case Role::XT_RHT: return rht && sp(Gemm::Wgrad, Operand::X);
    case Role::DYT_RHT: return rht && sp(Gemm::Wgrad, Operand::DY);
    case Role::DY_HAD: return dh && sp(Gemm::Dgrad, Operand::DY);
    case Role::W_HAD: return dh && sp(Gemm::Dgrad, Operand::W);
  }
  return true;
}

void Linear::reset_inference(int replay_interval) {
  inf_ = InferenceState{};
  inf_.x = TensorReference(replay_interval);
}

// The training reference of role r (docs/recipes.md "Micro-batches and data parallelism"):
// sample-and-hold on optimizer steps (TensorReference), except a D = 1 reference under
// amax_sample = "per-call", measured at every call; every measurement of a role other than W
// is agreed across data-parallel ranks (ctx.ranks).
template <class F>
float Linear::training_reference(Role r, const StepContext& ctx, F&& measure) {
  TensorReference& ref = ref_[static_cast<int>(r)];
  const bool per_call = ref.interval() == 1 && plan_.amax_sample == AmaxSample::PerCall;
  auto agreed = [&]() -> float {
    const float v = measure();
    const bool replicated = r == Role::W || r == Role::W_HAD;  // weights agree already
    return ctx.ranks && !replicated ? ctx.ranks->agree(v, !per_call) : v;
  };
  if (per_call) return ref.set(ctx.step, agreed());
  return ref.get(ctx.step, agreed);
}

void Linear::note_stats(int o, const QuantStats& s) {
  tel_.op[o] = merge_tel_ ? worst_of(tel_.op[o], s) : s;
}

float Linear::reference_for(Role r, const float* x, int64_t n, const StepContext& ctx) {
  // No quantizer of this operand reads g (MX scale rules): measure nothing, hold nothing;
  // the reference reads 0 (refs(), telemetry staleness absent). The inference calibration
  // record and the frozen policy below still behave as for any recipe.
  const bool used = uses_reference(r);
  if (!used && (ctx.training || r == Role::W || ctx.infer_ref == InferenceRef::Current ||
                ctx.infer_ref == InferenceRef::Replay))
    return 0.f;
  Scope s(Cat::kQuantAmax);
  // max|x|; the activation X of a shared-input scope (LinearWorkspace) is measured once.
  LinearWorkspace& ws = *ws_;
  auto measure = [&]() -> float {
    if (r != Role::X || !ws.sharing || x != ws.shared_x) return amax_fast(x, n);
    if (ws.amax.valid && ws.amax.x == x && ws.amax.n == n) {
      ++ws.reused_amax;
      return ws.amax.value;
    }
    const float a = amax_fast(x, n);
    ws.amax.valid = true, ws.amax.x = x, ws.amax.n = n, ws.amax.value = a;
    return a;
  };
  if (ctx.training) return training_reference(r, ctx, measure);
  // Inference: its own references (InferenceRef), never the training caches ref_.
  if (r == Role::W) {
    if (!inf_.has_w) inf_.w = amax_fast(x, n), inf_.has_w = true;
    return inf_.w;
  }
  switch (ctx.infer_ref) {
    case InferenceRef::Current:
      return measure();
    case InferenceRef::Replay:
      return inf_.x.get(ctx.infer_batch, measure);
    case InferenceRef::Calibrate: {
      const float g = measure();
      inf_.calibrated_x = inf_.has_calibrated ? std::max(inf_.calibrated_x, g) : g;
      inf_.has_calibrated = true;
      return g;
    }
    case InferenceRef::Frozen:
      if (!inf_.has_calibrated)
        throw std::logic_error("Linear " + std::to_string(id_) +
                               ": frozen inference reference used before calibration");
      return inf_.calibrated_x;
    case InferenceRef::LlamaQ8:  // X is Q8_0 there (forward_llama_q8): no tensor reference
      break;
  }
  throw std::logic_error("Linear: no activation reference under this inference policy");
}

void Linear::prep(const float* src, int64_t rows, int64_t cols, const BlockQuantSpec& spec,
                  float g, const SrKey* key, float* out, bool block_scaled) const {
  Scope s(Cat::kQuantRow);
  const SrKey* sr = spec.rounding == Rounding::SR8 ? key : nullptr;
  if (block_scaled) {
    quantize_block_scaled_fast(src, rows, cols, spec, g, sr, out);
  } else {
    quantize_dequantize_fast(src, rows, cols, spec, g, sr, out);
  }
}

void Linear::prep(const float* src, int64_t rows, int64_t cols, const BlockQuantSpec& spec, float g,
                  const SrKey* key, uint16_t* out) const {
  Scope s(Cat::kQuantRow);
  quantize_block_scaled_fast(src, rows, cols, spec, g,
                             spec.rounding == Rounding::SR8 ? key : nullptr, out);
}

void Linear::quantized_product(Cat c, bool tb, int64_t M, int64_t N, int64_t K,
                               BlockScaledOperand A, float gd_a, BlockScaledOperand B, float gd_b,
                               bool accumulate, float* C) {
  if (block_scaled()) {
    timed_block_scaled(c, false, tb, M, N, K, A, gd_a, B, gd_b, accumulate, C, ws_->gemm);
    return;
  }
  if (!A.f32 || !B.f32) throw std::logic_error("Linear: the FP32 GEMM of BF16 operands");
  timed_sgemm(c, false, tb, M, N, K, A.f32, K, B.f32, tb ? K : N, accumulate ? 1.f : 0.f, C, N);
}

void Linear::forward_impl(const float* X, float* Y, int64_t M, const StepContext& ctx) {
  if (!W_) throw std::logic_error("Linear::forward: weights not bound");
  X_ = X;
  M_ = M;
  // Training moves the weights: a frozen inference weight amax or calibration is stale.
  if (ctx.training && (inf_.has_w || inf_.has_calibrated || inf_.x.has_value()))
    reset_inference(inf_.x.interval());
  const bool llama = !ctx.training && ctx.infer_ref == InferenceRef::LlamaQ8;
  quantized_ = ctx.quantize && mode_ != LinearMode::FP32 && (!llama || mode_ == LinearMode::FP4);
  if (!quantized_) {
    timed_sgemm(Cat::kGemmFprop, false, true, M, N_, K_, X, K_, W_, K_, 0.f, Y, N_);
    return;
  }
  if (llama) return forward_llama_q8(X, Y, M, ctx);
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
  if (plan_.bf16_boundary && mode_ == LinearMode::FP4) {
    // BF16 boundary: X rounded to BF16 once; the copy is what every quantization of X reads,
    // here and in backward (wgrad), and what its amax is taken of.
    Scope s(Cat::kQuantBf16);
    xr_.resize(M * K_);
    round_bf16_into(X, M * K_, xr_.data());
    X = X_ = xr_.data();
  }
  wq_.resize(N_ * K_);
  float gx = 0, gw = 0;
  if (mode_ == LinearMode::FP4) {
    refs_.g_x = gx = row_scaled_x() ? measure_x_rows(X, M, ctx) : reference_for(Role::X, X, M * K_, ctx);
    refs_.g_w = gw = reference_for(Role::W, W_, N_ * K_, ctx);
  }
  const SrKey kx{ctx.seed, uint32_t(ctx.step), uint32_t(id_), kOpX, kFprop, uint32_t(ctx.micro)};
  const SrKey kw{ctx.seed, uint32_t(ctx.step), uint32_t(id_), kOpW, kFprop, uint32_t(ctx.micro)};
  // Telemetry: the first micro-batch of a step starts it, later ones merge into it.
  // No telemetry for Quartet II's quantizers (their operands are not the block quantizer's).
  const bool tel = ctx.telemetry && ctx.training && mode_ == LinearMode::FP4 &&
                   !plan_.quartet_forward() && !plan_.ms_eden();
  merge_tel_ = tel && !ctx.first_micro && tel_.valid;
  if (!merge_tel_) tel_.valid = false;
  if (tel) {
    Scope s(Cat::kTelemetry);
    note_stats(0, row_scaled_x()
                      ? quant_stats_rows(X, M, K_, plan_.spec(Gemm::Fprop, Operand::X), x_row_g_.data(), &kx)
                      : quant_stats(X, M, K_, plan_.spec(Gemm::Fprop, Operand::X), gx, &kx));
    note_stats(1, quant_stats(W_, N_, K_, plan_.spec(Gemm::Fprop, Operand::W), gw, &kw));
  }
  if (probe()) {  // fidelity mode: quantized operands into the probe-matched GEMM
    Scope s(Cat::kGemmFprop);
    prof::add_flops(Cat::kGemmFprop, 2.0 * double(M) * double(N_) * double(K_));
    probe_product({X, M, false, plan_.spec(Gemm::Fprop, Operand::X), gx, &kx},
                  {W_, N_, false, plan_.spec(Gemm::Fprop, Operand::W), gw, &kw}, K_, Y, false, *ws_,
                  ws_->t0, plan_);
  } else {
    const BlockScaledOperand xq = plan_.quartet_forward()
                                      ? quantize_fprop_x_quartet(X, M, gx)  // Quartet II's
                                  : row_scaled_x()
                                      ? quantize_fprop_x_rows(X, M, kx)  // per-row references
                                      : quantize_fprop_x(X, M, gx, kx);  // X blocks along K
    quantize_fprop_w(gw, kw, block_scaled());
    if (plan_.ms_eden() && ctx.training)
      xhat_.assign(xq.f32, xq.f32 + M * K_);  // wgrad re-quantizes X̂
    // decoded-bf16: the decode scales of X and W (row-scaled X and Quartet II are refused there)
    const float gdx = operand_gd(plan_.spec(Gemm::Fprop, Operand::X), gx);
    const float gdw = operand_gd(plan_.spec(Gemm::Fprop, Operand::W), gw);
    quantized_product(Cat::kGemmFprop, true, M, N_, K_, xq, gdx, wq_.data(), gdw, false, Y);
  }
  if (plan_.bf16_outputs && mode_ == LinearMode::FP4) {  // the paper's BF16 output Y
    Scope s(Cat::kQuantBf16);
    round_bf16_into(Y, M * N_, Y);
  }
}

// InferenceRef::LlamaQ8, an FP4 linear as llama.cpp computes its GGUF export on a CPU: W as
// the fprop quantizes it (blocks or tiles of its recipe, the frozen inference amax), X as
// llama.cpp's Q8_0 (no BF16 boundary, no BF16 output, no probe GEMM: llama.cpp has none of
// them), then the FP32 GEMM of the two decoded operands.
void Linear::forward_llama_q8(const float* X, float* Y, int64_t M, const StepContext& ctx) {
  const float gw = reference_for(Role::W, W_, N_ * K_, ctx);
  const SrKey kw{ctx.seed, uint32_t(ctx.step), uint32_t(id_), kOpW, kFprop, uint32_t(ctx.micro)};
  wq_.resize(N_ * K_);
  quantize_fprop_w(gw, kw, false);  // W as trained, decoded: the GEMM below is FP32
  LinearWorkspace& ws = *ws_;
  ws.xq.valid = false;  // the row buffer holds Q8_0 values now, not a shareable quantized X
  float* xq = ws.row.get(M * K_);
  {
    Scope s(Cat::kQuantRow);
    q8_0_quantize_dequantize(X, M, K_, xq);
  }
  timed_sgemm(Cat::kGemmFprop, false, true, M, N_, K_, xq, K_, wq_.data(), K_, 0.f, Y, N_);
}

// dX [M, K] += round_bf16(d) for d [M, K]: a linear's own dgrad output kept in BF16 (the recipe's
// bf16_outputs) before it joins the input gradient, which other linears may share.
static void add_bf16_rounded(const float* d, int64_t n, float* dX) { add_round_bf16_array(d, n, dX); }

void Linear::quantize_fprop_w(float gw, const SrKey& kw, bool block_scaled) {
  if (!plan_.quartet_forward()) {  // W tiles (or blocks along K)
    prep(W_, N_, K_, plan_.spec(Gemm::Fprop, Operand::W), gw, &kw, wq_.data(), block_scaled);
    return;
  }
  Scope s(Cat::kQuantRow);  // Quartet II's forward quantizer
  quartet_rtn_quantize_dequantize(W_, N_, K_, gw, wq_.data());
}

const float* Linear::quantize_fprop_x_quartet(const float* X, int64_t M, float gx) {
  LinearWorkspace& ws = *ws_;
  ws.xq.valid = false;  // never shared: the reuse check compares block-quantizer specs
  float* xq = ws.row.get(M * K_);
  Scope s(Cat::kQuantRow);
  quartet_rtn_quantize_dequantize(X, M, K_, gx, xq);
  return xq;
}

BlockScaledOperand Linear::quantize_fprop_x(const float* X, int64_t M, float gx, const SrKey& kx) {
  LinearWorkspace& ws = *ws_;
  const BlockQuantSpec& sx = plan_.spec(Gemm::Fprop, Operand::X);
  const bool h = bf16_operands() && simd_x_;
  // Reuse the previous linear's quantized X in a shared-input scope (LinearWorkspace): same
  // tensor, shape, spec, g and form (FP32 or BF16), and RNE (SR bits are keyed by the layer id).
  const bool shareable = ws.sharing && X == ws.shared_x && sx.rounding == Rounding::RNE;
  const bool reuse = shareable && ws.xq.valid && ws.xq.x == X && ws.xq.M == M && ws.xq.K == K_ &&
                     ws.xq.spec == sx && ws.xq.bf16 == h &&
                     std::bit_cast<uint32_t>(ws.xq.g) == std::bit_cast<uint32_t>(gx);
  // reuse: the same size, so the same buffer and contents
  uint16_t* x16 = h ? ws.row.get_bf16(M * K_) : nullptr;
  float* x32 = h ? nullptr : ws.row.get(M * K_);
  const BlockScaledOperand xq = h ? BlockScaledOperand(x16) : BlockScaledOperand(x32);
  if (reuse) {
    ++ws.reused_inputs;
    return xq;
  }
  ws.xq.valid = false;
  if (h) {
    prep(X, M, K_, sx, gx, &kx, x16);
  } else {
    prep(X, M, K_, sx, gx, &kx, x32, block_scaled());
  }
  if (shareable)
    ws.xq.valid = true, ws.xq.x = X, ws.xq.M = M, ws.xq.K = K_, ws.xq.spec = sx, ws.xq.g = gx,
    ws.xq.bf16 = h;
  return xq;
}

float Linear::measure_x_rows(const float* X, int64_t M, const StepContext& ctx) {
  if (!ctx.training && ctx.infer_ref != InferenceRef::Current)
    throw UserError(std::string("recipe key fp4.row_scaled_activation: the inference policy ") +
                    (ctx.infer_ref == InferenceRef::Replay ? "replay-d<D>" : "calibrated") +
                    " holds one activation reference per tensor, but this recipe takes each "
                    "row's current amax (docs/evaluation.md); use the policy 'current'");
  Scope s(Cat::kQuantAmax);
  x_row_g_.resize(static_cast<size_t>(M));
  row_amax_fast(X, M, K_, x_row_g_.data());
  float g = 0.f;
  for (float v : x_row_g_) g = std::max(g, v);
  return g;
}

const float* Linear::quantize_fprop_x_rows(const float* X, int64_t M, const SrKey& kx) {
  LinearWorkspace& ws = *ws_;
  const BlockQuantSpec& sx = plan_.spec(Gemm::Fprop, Operand::X);
  ws.xq.valid = false;  // never shared: the reuse check compares one reference g
  float* xq = ws.row.get(M * K_);
  Scope s(Cat::kQuantRow);
  quantize_dequantize_rows_fast(X, M, K_, sx, x_row_g_.data(),
                                sx.rounding == Rounding::SR8 ? &kx : nullptr, xq);
  return xq;
}

QuantStats Linear::wgrad_x_stats(const float* xt, int64_t M, float g_xt, const SrKey& kx) {
  const BlockQuantSpec& sxw = plan_.spec(Gemm::Wgrad, Operand::X);
  if (!row_scaled_x()) return quant_stats(xt, K_, M, sxw, g_xt, &kx);
  xt_row_g_.resize(static_cast<size_t>(K_));  // per row of the (transformed) Xᵀ, as quantized
  row_amax_fast(xt, K_, M, xt_row_g_.data());
  return quant_stats_rows(xt, K_, M, sxw, xt_row_g_.data(), &kx);
}

void Linear::quantize_wgrad_x(int64_t M, float g_xt, const SrKey& kx, const HadamardTransform* wh,
                              float* xt) {
  const BlockQuantSpec& sxw = plan_.spec(Gemm::Wgrad, Operand::X);
  const SrKey* kxs = sxw.rounding == Rounding::SR8 ? &kx : nullptr;
  if (block_scaled()) {  // decoded-bf16 (never row-scaled: the recipe refuses the pair)
    quantize_block_scaled_transposed_fast(X_, M, K_, sxw, g_xt, kxs, wh, xt);
    return;
  }
  if (!row_scaled_x()) {
    quantize_dequantize_transposed_fast(X_, M, K_, sxw, g_xt, kxs, wh, xt);
    return;
  }
  // Row-scaled: only the 16-point transform with fixed signs (the recipe refuses others).
  xt_row_g_.resize(static_cast<size_t>(K_));  // one current reference per row of Xᵀ (TE's)
  quantize_dequantize_rows_transposed_fast(X_, M, K_, sxw, kxs, plan_.rht_wgrad,
                                           plan_.rht_precision, xt_row_g_.data(), xt);
}

void Linear::quantize_wgrad_x(int64_t M, float g_xt, const SrKey& kx, const HadamardTransform* wh,
                              uint16_t* xt) {
  const BlockQuantSpec& sxw = plan_.spec(Gemm::Wgrad, Operand::X);
  quantize_block_scaled_transposed_fast(X_, M, K_, sxw, g_xt,
                                        sxw.rounding == Rounding::SR8 ? &kx : nullptr, wh, xt);
}

void Linear::add_dgrad(int64_t M, int64_t inner, BlockScaledOperand a, float gd_a, bool tb,
                       BlockScaledOperand b, float gd_b, float* dX) {
  if (!plan_.bf16_outputs) {
    quantized_product(Cat::kGemmDgrad, tb, M, K_, inner, a, gd_a, b, gd_b, true, dX);
    return;
  }
  float* d = ws_->t1.get(M * K_);  // this linear's dX, rounded to BF16, then added
  quantized_product(Cat::kGemmDgrad, tb, M, K_, inner, a, gd_a, b, gd_b, false, d);
  add_bf16_rounded(d, M * K_, dX);
}

void Linear::backward_impl(const float* dY, float* dX, int64_t M, const StepContext& ctx) {
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
  // FP4. dY has one reference shared by dgrad and wgrad (docs/numerics.md "Tensor reference g").
  if (plan_.bf16_boundary && mode_ == LinearMode::FP4) {
    // BF16 boundary: dY rounded to BF16 once; the copy feeds its amax, dgrad and wgrad.
    Scope s(Cat::kQuantBf16);
    dyr_.resize(M * N_);
    round_bf16_into(dY, M * N_, dyr_.data());
    dY = dyr_.data();
  }
  if (plan_.ms_eden()) return backward_ms_eden(dY, dX, M, ctx);
  check_hadamard_shape(plan_, M, N_, "Linear " + std::to_string(id_));  // before any gradient is accumulated
  const float gdy = refs_.g_dy = reference_for(Role::DY, dY, M * N_, ctx);
  const uint32_t step = uint32_t(ctx.step), id = uint32_t(id_), micro = uint32_t(ctx.micro);
  // The layer's Hadamard transform of this step (docs/numerics.md "Random Hadamard transform":
  // its signs are a function of the run seed, the layer and the step, never of state).
  const bool dgrad_h = plan_.dgrad_hadamard();
  const HadamardTransform had = plan_.rht_wgrad || dgrad_h
                                    ? plan_.hadamard(ctx.hadamard_seed, id, step, micro)
                                    : HadamardTransform{};
  LinearWorkspace& ws = *ws_;
  ws.xq.valid = false;  // the workspace buffers now hold this backward's operands

  // dgrad: dX [M,K] += q(dY, blocks along N) · q(W). Contraction over N. No telemetry for a
  // linear with Quartet II's forward (its forward operands recorded none either).
  const bool tel = ctx.telemetry && ctx.training && !plan_.quartet_forward();
  if (tel && !dgrad_h) {  // with the dgrad transform: of the transformed dY, below
    Scope s(Cat::kTelemetry);
    const SrKey k{ctx.seed, step, id, kOpDY, kDgrad, micro};
    note_stats(2, quant_stats(dY, M, N_, plan_.spec(Gemm::Dgrad, Operand::DY), gdy, &k));
  }
  if (probe()) {
    Scope s(Cat::kGemmWgrad);  // probe-matched mode: dgrad and wgrad timed together
    prof::add_flops(Cat::kGemmWgrad, 4.0 * double(M) * double(N_) * double(K_));
    // dgrad contracts over N: dY [M,N] along N and Wᵀ [K,N] along N (tiles are symmetric).
    // wgrad contracts over tokens: dYᵀ [N,M] and Xᵀ [K,M] along M, after the RHT if any.
    const SrKey kd{ctx.seed, step, id, kOpDY, kDgrad, micro}, kw{ctx.seed, step, id, kOpW, kDgrad, micro};
    if (dX) {
      const ProbeSrc a{dY, M, false, plan_.spec(Gemm::Dgrad, Operand::DY), gdy, &kd};
      const ProbeSrc b{W_, K_, true, plan_.spec(Gemm::Dgrad, Operand::W), refs_.g_w, &kw};  // Wᵀ
      if (plan_.bf16_outputs) {  // this linear's dX, rounded to BF16, then added
        float* d = ws.wqd.get(M * K_);  // free in the probe path
        probe_product(a, b, N_, d, false, ws, ws.t1, plan_);
        add_bf16_rounded(d, M * K_, dX);
      } else {
        probe_product(a, b, N_, dX, true, ws, ws.t1, plan_);
      }
    }
    // Without the RHT the wgrad operands dYᵀ and Xᵀ are quantized straight from dY and X.
    std::vector<float> dyt, xt;
    float g_dyt = gdy, g_xt = refs_.g_x;
    if (plan_.rht_wgrad) {  // M % 16 == 0: checked above
      dyt.resize(N_ * M);
      xt.resize(K_ * M);
      transpose(dY, M, N_, dyt.data());
      transpose(X_, M, K_, xt.data());
      hadamard_rows(dyt.data(), N_, M, had);
      hadamard_rows(xt.data(), K_, M, had);
      g_dyt = reference_for(Role::DYT_RHT, dyt.data(), N_ * M, ctx);
      g_xt = reference_for(Role::XT_RHT, xt.data(), K_ * M, ctx);
    } else if (tel) {  // telemetry reads the transposes
      dyt.resize(N_ * M);
      xt.resize(K_ * M);
      transpose(dY, M, N_, dyt.data());
      transpose(X_, M, K_, xt.data());
    }
    const SrKey kdw{ctx.seed, step, id, kOpDY, kWgrad, micro}, kxw{ctx.seed, step, id, kOpX, kWgrad, micro};
    if (tel) {
      note_stats(3, quant_stats(dyt.data(), N_, M, plan_.spec(Gemm::Wgrad, Operand::DY), g_dyt, &kdw));
      note_stats(4, quant_stats(xt.data(), K_, M, plan_.spec(Gemm::Wgrad, Operand::X), g_xt, &kxw));
      tel_.valid = true;
    }
    const bool rht = plan_.rht_wgrad;
    probe_product({rht ? dyt.data() : dY, N_, !rht, plan_.spec(Gemm::Wgrad, Operand::DY), g_dyt, &kdw},
                  {rht ? xt.data() : X_, K_, !rht, plan_.spec(Gemm::Wgrad, Operand::X), g_xt, &kxw}, M,
                  dW_, true, ws, ws.t1, plan_);
    return;
  }
  const bool bs = block_scaled();
  if (dX && dgrad_h) {
    float* dyq = ws.row.get(M * N_);
    float gd_dy = 1.f, gd_w = 1.f;
    dgrad_hadamard_dy(dY, M, ctx, had, tel, dyq, gd_dy);
    const float* wd = dgrad_hadamard_w(ctx, had, gd_w);
    add_dgrad(M, N_, dyq, gd_dy, false, wd, gd_w, dX);
  } else if (dX) {
    const SrKey k{ctx.seed, step, id, kOpDY, kDgrad, micro};
    const BlockQuantSpec& sdy = plan_.spec(Gemm::Dgrad, Operand::DY);
    BlockScaledOperand dyq = nullptr;
    if (bf16_operands() && simd_dy_) {
      uint16_t* d = ws.row.get_bf16(M * N_);
      prep(dY, M, N_, sdy, gdy, &k, d);
      dyq = d;
    } else {
      float* d = ws.row.get(M * N_);
      prep(dY, M, N_, sdy, gdy, &k, d, bs);
      dyq = d;
    }
    const BlockQuantSpec& sw = plan_.spec(Gemm::Dgrad, Operand::W);
    const float* wd = wq_.data();  // fprop's W (2-D tiles of the same spec)
    if (sw.two_d && sw != plan_.spec(Gemm::Fprop, Operand::W)) {
      // 2-D tiles are the same for W and Wᵀ, but an override gave dgrad's W its own T or
      // rounding: quantize W again from the high-precision weight with dgrad's spec and keys.
      const SrKey kw{ctx.seed, step, id, kOpW, kDgrad, micro};
      float* wqd = ws.wqd.get(N_ * K_);
      prep(W_, N_, K_, sw, refs_.g_w, &kw, wqd, bs);
      wd = wqd;
    } else if (!sw.two_d) {
      // 1-D weight blocks run along K for fprop; dgrad contracts over N, so quantize Wᵀ
      // [K, N] along N from the high-precision weight, never from the fprop copy.
      const SrKey kw{ctx.seed, step, id, kOpW, kDgrad, micro};
      float* wt = ws.t0.get(N_ * K_);
      float* wqd = ws.wqd.get(N_ * K_);
      {
        Scope s(Cat::kTranspose);
        transpose(W_, N_, K_, wt);
      }
      prep(wt, K_, N_, sw, refs_.g_w, &kw, wt, bs);
      Scope s(Cat::kTranspose);
      transpose(wt, K_, N_, wqd);
      wd = wqd;
    }
    add_dgrad(M, N_, dyq, operand_gd(sdy, gdy), false, wd, operand_gd(sw, refs_.g_w), dX);
  }

  // wgrad: dW [N,K] += q(dYᵀ [N,M], blocks along M) · q(Xᵀ [K,M], blocks along M)ᵀ, the
  // transposes (and the RHT) fused into the quantizer. With the RHT the references are those
  // of the transformed tensors; without it, the fprop X and dgrad dY references are reused.
  const bool rht = plan_.rht_wgrad;  // M % n == 0: checked above (check_hadamard_shape)
  const HadamardTransform* wh = rht ? &had : nullptr;
  float g_dyt = gdy, g_xt = refs_.g_x;
  if (rht) {
    const float* x = X_;
    Scope s(Cat::kQuantAmax);
    if (uses_reference(Role::DYT_RHT))
      g_dyt = training_reference(Role::DYT_RHT, ctx, [&] { return amax_hadamard_transposed(dY, M, N_, had); });
    else
      g_dyt = 0.f;
    if (uses_reference(Role::XT_RHT))
      g_xt = training_reference(Role::XT_RHT, ctx, [&] { return amax_hadamard_transposed(x, M, K_, had); });
    else
      g_xt = 0.f;
  }
  const SrKey kd{ctx.seed, step, id, kOpDY, kWgrad, micro};
  const SrKey kx{ctx.seed, step, id, kOpX, kWgrad, micro};
  float* dyt = ws.t0.get(N_ * M);
  float* xt = ws.t1.get(K_ * M);
  if (tel) {
    Scope s(Cat::kTelemetry);
    // Telemetry needs the operands as quantized: materialise the (transformed) transposes.
    transpose(dY, M, N_, dyt);
    transpose(X_, M, K_, xt);
    if (rht) {
      hadamard_rows(dyt, N_, M, had);
      hadamard_rows(xt, K_, M, had);
    }
    note_stats(3, quant_stats(dyt, N_, M, plan_.spec(Gemm::Wgrad, Operand::DY), g_dyt, &kd));
    note_stats(4, wgrad_x_stats(xt, M, g_xt, kx));
    tel_.valid = true;
  }
  const BlockQuantSpec& sdyw = plan_.spec(Gemm::Wgrad, Operand::DY);
  BlockScaledOperand a = dyt, b = xt;  // FP32 in dyt, xt; or BF16 in the same buffers
  {
    Scope s(Cat::kQuantWgrad);
    const SrKey* kds = sdyw.rounding == Rounding::SR8 ? &kd : nullptr;
    if (bf16_operands() && simd_wgrad_) {
      uint16_t* dyt16 = ws.t0.get_bf16(N_ * M);
      uint16_t* xt16 = ws.t1.get_bf16(K_ * M);
      quantize_block_scaled_transposed_fast(dY, M, N_, sdyw, g_dyt, kds, wh, dyt16);
      quantize_wgrad_x(M, g_xt, kx, wh, xt16);
      a = dyt16, b = xt16;
    } else {
      if (bs) {
        quantize_block_scaled_transposed_fast(dY, M, N_, sdyw, g_dyt, kds, wh, dyt);
      } else {
        quantize_dequantize_transposed_fast(dY, M, N_, sdyw, g_dyt, &kd, wh, dyt);
      }
      quantize_wgrad_x(M, g_xt, kx, wh, xt);
    }
  }
  quantized_product(Cat::kGemmWgrad, true, N_, K_, M, a, operand_gd(sdyw, g_dyt), b,
                    operand_gd(plan_.spec(Gemm::Wgrad, Operand::X), g_xt), true, dW_);
}

void Linear::dgrad_hadamard_dy(const float* dY, int64_t M, const StepContext& ctx,
                               const HadamardTransform& h, bool tel, float* dyq, float& gd) {
  const BlockQuantSpec& sp = plan_.spec(Gemm::Dgrad, Operand::DY);
  const SrKey k{ctx.seed, uint32_t(ctx.step), uint32_t(id_), kOpDY, kDgrad, uint32_t(ctx.micro)};
  {  // 1. dY's rows transformed along N, in the quantizer's buffer
    Scope s(Cat::kQuantRow);
    std::copy(dY, dY + M * N_, dyq);
    hadamard_rows(dyq, M, N_, h);
  }
  // 2. the reference of the transformed dY; 3. telemetry of the operand as quantized
  const float g = reference_for(Role::DY_HAD, dyq, M * N_, ctx);
  if (tel) {
    Scope s(Cat::kTelemetry);
    note_stats(2, quant_stats(dyq, M, N_, sp, g, &k));
  }
  // 4. quantized in place, blocks along N
  prep(dyq, M, N_, sp, g, &k, dyq, block_scaled());
  gd = operand_gd(sp, g);
}

const float* Linear::dgrad_hadamard_w(const StepContext& ctx, const HadamardTransform& h,
                                      float& gd) {
  LinearWorkspace& ws = *ws_;
  const BlockQuantSpec& sw = plan_.spec(Gemm::Dgrad, Operand::W);
  const SrKey kw{ctx.seed, uint32_t(ctx.step), uint32_t(id_), kOpW, kDgrad, uint32_t(ctx.micro)};
  float* wt = ws.t0.get(N_ * K_);
  float* wqd = ws.wqd.get(N_ * K_);
  {  // 1. Wᵀ [K, N] from the high-precision weight, its rows (W's columns) transformed along N
    Scope s(Cat::kTranspose);
    transpose(W_, N_, K_, wt);
    hadamard_rows(wt, K_, N_, h);
  }
  // 2. the reference of the transformed weight (held like W's under D > 1)
  const float g = reference_for(Role::W_HAD, wt, N_ * K_, ctx);
  // 3. quantized: 1-D blocks along N (rows of Wᵀ), then back to [N, K]; or tiles of the
  // transformed W [N, K] as fprop tiles W
  gd = operand_gd(sw, g);
  if (!sw.two_d) {
    prep(wt, K_, N_, sw, g, &kw, wt, block_scaled());
    Scope s(Cat::kTranspose);
    transpose(wt, K_, N_, wqd);
  } else {
    {
      Scope s(Cat::kTranspose);
      transpose(wt, K_, N_, wqd);
    }
    prep(wqd, N_, K_, sw, g, &kw, wqd, block_scaled());
  }
  return wqd;
}

// Quartet II's backward (Quartet_II_fn.backward; docs/numerics.md "MS-EDEN in a Linear"): one
// transform h per call (the plan's signs, re-drawn per call under "per-call"), the same on both
// operands of a GEMM, applied along that GEMM's inner dim, zero-padded to a multiple of h.n
// (exact: (a·H)·(b·H)ᵀ = a·bᵀ for the orthogonal H, and the padded entries of a and b are 0).
//   dgrad: dX [M,K] += E(dY·H) [M,Np] · E(Ŵᵀ·H) [K,Np]ᵀ       contraction over N (Np ≥ N)
//   wgrad: dW [N,K] += E(dYᵀ·H) [N,Mp] · E(X̂ᵀ·H) [K,Mp]ᵀ      contraction over M (Mp ≥ M)
// E = MS-EDEN with its own current reference per operand (roles DY_HAD, W_HAD, DYT_RHT,
// XT_RHT); X̂ and Ŵ are the forward's quantized operands, as Quartet II saves them.
void Linear::backward_ms_eden(const float* dY, float* dX, int64_t M, const StepContext& ctx) {
  const uint32_t step = uint32_t(ctx.step), id = uint32_t(id_), micro = uint32_t(ctx.micro);
  const HadamardTransform h = plan_.hadamard(ctx.hadamard_seed, id, step, micro);
  auto padded = [&](int64_t v) { return (v + h.n - 1) / h.n * h.n; };
  const int64_t Np = padded(N_), Mp = padded(M);
  if (xhat_.size() != static_cast<size_t>(M * K_))
    throw std::logic_error("Linear::backward (MS-EDEN): no quantized X̂ kept by a training forward");
  LinearWorkspace& ws = *ws_;
  ws.xq.valid = false;  // the workspace buffers now hold this backward's operands
  auto key = [&](uint32_t op, uint32_t gemm) { return SrKey{ctx.seed, step, id, op, gemm, micro}; };

  // 1. dgrad, contraction over N: dY [M,N] and Ŵᵀ [K,N], both transformed along N.
  if (dX) {
    float* a = ws.row.get(M * Np);
    float* b = ws.wqd.get(K_ * Np);
    ms_eden_operand(dY, M, N_, false, Np, h, Role::DY_HAD, key(kOpDY, kDgrad), ctx, a);
    ms_eden_operand(wq_.data(), K_, N_, true, Np, h, Role::W_HAD, key(kOpW, kDgrad), ctx, b);
    add_dgrad(M, Np, a, 1.f, true, b, 1.f, dX);  // FP32 decoded (decoded-bf16: the constructor refuses)
  }
  // 2. wgrad, contraction over the M tokens: dYᵀ [N,M] and X̂ᵀ [K,M], transformed along M.
  float* c = ws.t0.get(N_ * Mp);
  float* d = ws.t1.get(K_ * Mp);
  ms_eden_operand(dY, N_, M, true, Mp, h, Role::DYT_RHT, key(kOpDY, kWgrad), ctx, c);
  ms_eden_operand(xhat_.data(), K_, M, true, Mp, h, Role::XT_RHT, key(kOpX, kWgrad), ctx, d);
  timed_sgemm(Cat::kGemmWgrad, false, true, N_, K_, Mp, c, Mp, d, Mp, 1.f, dW_, K_);
}

void Linear::ms_eden_operand(const float* src, int64_t rows, int64_t cols, bool transposed,
                             int64_t cols_p, const HadamardTransform& h, Role r, const SrKey& key,
                             const StepContext& ctx, float* out) {
  {  // 1. out [rows, cols_p] = src (or srcᵀ, in 32 × 32 tiles), zero-padded; 2. transformed
    Scope s(Cat::kTranspose);
    constexpr int64_t B = 32;
#pragma omp parallel for schedule(static)
    for (int64_t i0 = 0; i0 < rows; i0 += B) {
      const int64_t i1 = std::min(rows, i0 + B);
      for (int64_t j0 = 0; j0 < cols; j0 += B) {
        const int64_t j1 = std::min(cols, j0 + B);
        for (int64_t i = i0; i < i1; ++i)
          for (int64_t j = j0; j < j1; ++j)
            out[i * cols_p + j] = transposed ? src[j * rows + i] : src[i * cols + j];
      }
      for (int64_t i = i0; i < i1; ++i) std::fill(out + i * cols_p + cols, out + (i + 1) * cols_p, 0.f);
    }
    hadamard_rows(out, rows, cols_p, h);
  }
  // 3. the reference of the transformed operand (current: Quartet II's delayed_amax = False)
  const float g = reference_for(r, out, rows * cols_p, ctx);
  // 4. MS-EDEN, decoded in place
  Scope s(Cat::kQuantRow);
  MsEdenSpec spec;
  spec.group = h.n;
  ms_eden_dequantize(ms_eden_quantize(out, rows, cols_p, spec, g, key), out);
}

}  // namespace fp4::nn
