// The decoder's forward and backward, top to bottom in two functions (llm.c style).
#include "fp4/nn/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "fp4/error.h"
#include "fp4/gemm.h"
#include "fp4/nn/layers.h"
#include "fp4/profile.h"

namespace fp4::nn {
using prof::Cat;
using prof::Scope;

// Per-block activation buffer layout (BT = B·T rows, U = up width = F or 2F):
//   ln1 [BT,C] | rstd1 [BT] | q [BT,C] | k [BT,C] | v [BT,C] | y [BT,C] (attention out)
//   | x2 [BT,C] (residual after attention) | ln2 [BT,C] | rstd2 [BT] | h [BT,U] | a [BT,F]
//   | att [B,H,T,T] (softmax probabilities)
// The residual stream entering block l is res(l): x0_ for l = 0, else x3 of block l-1,
// stored as the trailing [BT,C] slice "x3" of that block.
struct Model::BlockActs {
  float *ln1, *rstd1, *q, *k, *v, *y, *x2, *ln2, *rstd2, *h, *a, *att, *x3;
};

namespace {
// A LinearWorkspace shared-input scope for the lifetime of the object (closed on exceptions).
struct SharedInput {
  LinearWorkspace& ws;
  SharedInput(LinearWorkspace& w, const float* X) : ws(w) { ws.begin_shared_input(X); }
  ~SharedInput() { ws.end_shared_input(); }
  SharedInput(const SharedInput&) = delete;
  SharedInput& operator=(const SharedInput&) = delete;
};
enum { kQ = 0, kK, kV, kO, kUp, kDown, kLinearsPerBlock };
const char* kLinearNames[] = {"attn.q", "attn.k", "attn.v", "attn.o", "mlp.up", "mlp.down"};
}  // namespace

Model::BlockActs Model::block(int l, int64_t BT) {
  const int64_t C = cfg_.d_model, F = cfg_.mlp_hidden, H = cfg_.n_heads, T = T_;
  const int64_t U = cfg_.mlp == "swiglu" ? 2 * F : F;
  float* p = acts_[l].data();
  BlockActs A;
  auto take = [&](int64_t n) { float* r = p; p += n; return r; };
  A.ln1 = take(BT * C);
  A.rstd1 = take(BT);
  A.q = take(BT * C);
  A.k = take(BT * C);
  A.v = take(BT * C);
  A.y = take(BT * C);
  A.x2 = take(BT * C);
  A.ln2 = take(BT * C);
  A.rstd2 = take(BT);
  A.h = take(BT * U);
  A.a = take(BT * F);
  A.att = take(BT / T * H * T * T);
  A.x3 = take(BT * C);
  return A;
}

int64_t Model::add_param(const std::string& name, int64_t rows, int64_t cols, bool decay) {
  ParamInfo p;
  p.name = name;
  p.rows = rows;
  p.cols = cols;
  p.size = rows * cols;
  p.offset = infos_.empty() ? 0 : infos_.back().offset + infos_.back().size;
  p.weight_decay = decay;
  infos_.push_back(p);
  return p.offset;
}

Model::Model(const ModelConfig& cfg, const Recipe& recipe, int batch, int seq_len)
    : cfg_(cfg), recipe_(recipe), batch_(batch), seq_len_(seq_len), T_(seq_len) {
  const int64_t C = cfg.d_model, V = cfg.vocab_size, F = cfg.mlp_hidden, L = cfg.n_layers;
  const int64_t U = cfg.mlp == "swiglu" ? 2 * F : F;
  if (C % cfg.n_heads || (C / cfg.n_heads) % 2)
    throw UserError("model: d_model must be a multiple of 2·n_heads");
  off_wte_ = add_param("wte", V, C, true);
  for (int l = 0; l < L; ++l) {
    const std::string b = "blocks." + std::to_string(l) + ".";
    off_ln1_.push_back(add_param(b + "ln1", 1, C, false));
    const int64_t shapes[kLinearsPerBlock][2] = {{C, C}, {C, C}, {C, C}, {C, C}, {U, C}, {C, F}};
    for (int j = 0; j < kLinearsPerBlock; ++j) {
      if (j == kUp) off_ln2_.push_back(add_param(b + "ln2", 1, C, false));
      off_lin_.push_back(add_param(b + kLinearNames[j], shapes[j][0], shapes[j][1], true));
    }
  }
  off_lnf_ = add_param("ln_f", 1, C, false);
  off_head_ = add_param("lm_head", V, C, true);
  params_.assign(infos_.back().offset + infos_.back().size, 0.f);
  grads_.assign(params_.size(), 0.f);

  // Per-linear mode and specs: [high_precision] rules and [[override]]s (recipe.h).
  const ResolvedLinears resolved = resolve_linear_plans(recipe, static_cast<int>(L));
  for (int l = 0; l < L; ++l) {
    const int64_t shapes[kLinearsPerBlock][2] = {{C, C}, {C, C}, {C, C}, {C, C}, {C, U}, {F, C}};
    for (int j = 0; j < kLinearsPerBlock; ++j)
      linears_.emplace_back(l * kLinearsPerBlock + j, shapes[j][0], shapes[j][1],
                            resolved.plans[l * kLinearsPerBlock + j], recipe);
  }
  bind_linears();
  // One workspace for every linear (only one runs at a time), grown once for the largest.
  workspace_ = std::make_shared<LinearWorkspace>();
  for (Linear& lin : linears_) {
    lin.bind_workspace(workspace_);
    lin.reserve_workspace(int64_t(batch) * seq_len);
  }

  const int64_t BT = int64_t(batch) * seq_len, H = cfg.n_heads, T = seq_len;
  const int64_t per_block = BT * (7 * C + U + F + 2) + int64_t(batch) * H * T * T + BT * C;
  acts_.assign(L, std::vector<float>(per_block));
  x0_.resize(BT * C);
  lnf_.resize(BT * C);
  lnf_rstd_.resize(BT);
  logits_.resize(BT * V);
  dln_.resize(BT * C);
  dq_.resize(BT * C);
  dk_.resize(BT * C);
  dv_.resize(BT * C);
  datt_.resize(BT * C);
  dh_.resize(BT * U);
  dact_.resize(BT * F);
  scratch_.resize(int64_t(batch) * H * T * T);
  xL_.resize(BT * C);
  tokens_.resize(BT);
  targets_.resize(BT);
}

std::string Model::linear_name(size_t i) const {
  return "blocks." + std::to_string(i / kLinearsPerBlock) + "." + kLinearNames[i % kLinearsPerBlock];
}

void Model::bind_linears() {
  for (size_t i = 0; i < linears_.size(); ++i)
    linears_[i].bind(params_.data() + off_lin_[i], grads_.data() + off_lin_[i]);
}

int64_t Model::num_body_params() const {
  const int64_t VC = int64_t(cfg_.vocab_size) * cfg_.d_model;
  return num_params() - 2 * VC;
}

double Model::flops_per_token(int64_t T) const {
  const double N = double(num_params()) - double(cfg_.vocab_size) * cfg_.d_model;
  return 6.0 * N + 12.0 * cfg_.n_layers * double(cfg_.d_model) * double(T);
}

Model::MemoryUse Model::memory_use() const {
  auto bytes = [](const auto& v) { return int64_t(v.size() * sizeof(v[0])); };
  MemoryUse m;
  m.params = bytes(params_);
  m.grads = bytes(grads_);
  for (const auto& a : acts_) m.activations += bytes(a);
  m.activations += bytes(x0_) + bytes(lnf_) + bytes(lnf_rstd_);
  m.logits = bytes(logits_);
  m.backward_scratch = bytes(dln_) + bytes(dq_) + bytes(dk_) + bytes(dv_) + bytes(datt_) +
                       bytes(dh_) + bytes(dact_) + bytes(scratch_) + bytes(xL_);
  std::vector<const LinearWorkspace*> seen;  // each workspace once (all are workspace_ here)
  for (const Linear& l : linears_) {
    m.linear_scratch += l.scratch_bytes();
    const LinearWorkspace* w = &l.workspace();
    if (std::find(seen.begin(), seen.end(), w) == seen.end()) {
      seen.push_back(w);
      m.linear_workspace += w->bytes();
    }
  }
  return m;
}

void Model::init(uint64_t seed) {
  std::mt19937_64 rng(seed);
  const float out_std = cfg_.init_std / std::sqrt(2.f * cfg_.n_layers);
  for (const auto& p : infos_) {
    float* w = params_.data() + p.offset;
    if (!p.weight_decay) {  // norm weights
      std::fill(w, w + p.size, 1.f);
      continue;
    }
    const bool proj = p.name.ends_with("attn.o") || p.name.ends_with("mlp.down");
    std::normal_distribution<float> d(0.f, proj ? out_std : cfg_.init_std);
    for (int64_t i = 0; i < p.size; ++i) w[i] = d(rng);
  }
}

void Model::zero_grad() { std::fill(grads_.begin(), grads_.end(), 0.f); }

void Model::reset_inference(int replay_interval) {
  for (auto& lin : linears_) lin.reset_inference(replay_interval);
}

double Model::forward(const int32_t* tokens, const int32_t* targets, int B,
                      const StepContext& ctx, int T_in) {
  if (B < 1 || B > batch_) throw std::invalid_argument("Model::forward: bad batch size");
  if (T_in < 0 || T_in > seq_len_)
    throw std::invalid_argument("Model::forward: sequence length " + std::to_string(T_in) +
                                " outside 1.." + std::to_string(seq_len_));
  B_ = B;
  T_ = T_in > 0 ? T_in : seq_len_;
  const int64_t T = T_, BT = int64_t(B) * T, C = cfg_.d_model, V = cfg_.vocab_size,
                H = cfg_.n_heads, F = cfg_.mlp_hidden, L = cfg_.n_layers;
  const bool swiglu = cfg_.mlp == "swiglu";
  const int64_t U = swiglu ? 2 * F : F;
  std::memcpy(tokens_.data(), tokens, BT * sizeof(int32_t));
  if (targets) std::memcpy(targets_.data(), targets, BT * sizeof(int32_t));
  const float* P = params_.data();

  {
    Scope s(Cat::kEmbedding);
    embedding_forward(x0_.data(), tokens, P + off_wte_, BT, C, V);
  }
  const float* res = x0_.data();
  for (int l = 0; l < L; ++l) {
    BlockActs A = block(l, BT);
    Linear* lin = &linears_[l * kLinearsPerBlock];
    {
      Scope s(Cat::kNorm);
      rmsnorm_forward(A.ln1, A.rstd1, res, P + off_ln1_[l], BT, C, cfg_.norm_eps);
    }
    {  // q, k, v read the same unchanged ln1: it may be quantized (and its amax taken) once
      SharedInput shared(*workspace_, A.ln1);
      lin[kQ].forward(A.ln1, A.q, BT, ctx);
      lin[kK].forward(A.ln1, A.k, BT, ctx);
      lin[kV].forward(A.ln1, A.v, BT, ctx);
    }
    {
      Scope s(Cat::kRope);
      rope_forward(A.q, B, T, H, C / H, cfg_.rope_theta);
      rope_forward(A.k, B, T, H, C / H, cfg_.rope_theta);
    }
    {
      Scope s(Cat::kAttention);
      // FLOPs actually done: QKᵀ and PV over the causal triangle, T(T+1)/2 dot products of
      // length hd each, per (batch, head).
      prof::add_flops(Cat::kAttention, 2.0 * 2.0 * B * H * (T * (T + 1) / 2) * (C / H));
      attention_forward(A.y, A.att, A.q, A.k, A.v, B, T, C, H);
    }
    lin[kO].forward(A.y, A.x2, BT, ctx);
    {
      Scope s(Cat::kResidual);
      residual_add(A.x2, res, BT * C);
    }
    {
      Scope s(Cat::kNorm);
      rmsnorm_forward(A.ln2, A.rstd2, A.x2, P + off_ln2_[l], BT, C, cfg_.norm_eps);
    }
    lin[kUp].forward(A.ln2, A.h, BT, ctx);
    {
      Scope s(Cat::kActivation);
      if (swiglu)
        swiglu_forward(A.a, A.h, BT, F);
      else
        squared_relu_forward(A.a, A.h, BT * F);
    }
    (void)U;
    lin[kDown].forward(A.a, A.x3, BT, ctx);
    {
      Scope s(Cat::kResidual);
      residual_add(A.x3, A.x2, BT * C);
    }
    res = A.x3;
  }
  {
    Scope s(Cat::kNorm);
    rmsnorm_forward(lnf_.data(), lnf_rstd_.data(), res, P + off_lnf_, BT, C, cfg_.norm_eps);
  }
  {  // LM head in FP32 (every recipe).
    Scope s(Cat::kGemmFprop);
    prof::add_flops(Cat::kGemmFprop, 2.0 * BT * V * C);
    sgemm(false, true, BT, V, C, 1.f, lnf_.data(), C, P + off_head_, C, 0.f, logits_.data(), V);
  }
  if (!targets) return 0.0;
  Scope s(Cat::kLoss);
  return cross_entropy_forward(nullptr, logits_.data(), targets, BT, V);
}

void Model::backward(const StepContext& ctx) {
  const int B = B_;
  const int64_t T = T_, BT = int64_t(B) * T, C = cfg_.d_model, V = cfg_.vocab_size,
                H = cfg_.n_heads, F = cfg_.mlp_hidden, L = cfg_.n_layers;
  const bool swiglu = cfg_.mlp == "swiglu";
  const int64_t U = swiglu ? 2 * F : F;
  const float* P = params_.data();
  float* G = grads_.data();

  float* dlogits = logits_.data();  // the gradient overwrites the logits (in place)
  {
    Scope s(Cat::kLoss);
    cross_entropy_backward(dlogits, logits_.data(), targets_.data(), BT, V, 1.f / float(BT));
  }
  {
    Scope s(Cat::kGemmWgrad);
    prof::add_flops(Cat::kGemmWgrad, 2.0 * BT * V * C);
    sgemm(true, false, V, C, BT, 1.f, dlogits, V, lnf_.data(), C, 1.f, G + off_head_, C);
  }
  {
    Scope s(Cat::kGemmDgrad);
    prof::add_flops(Cat::kGemmDgrad, 2.0 * BT * V * C);
    sgemm(false, false, BT, C, V, 1.f, dlogits, V, P + off_head_, C, 0.f, dln_.data(), C);
  }

  float* dres = xL_.data();  // gradient of the residual stream, carried down the blocks
  std::fill(dres, dres + BT * C, 0.f);
  const float* resL = L > 0 ? block(L - 1, BT).x3 : x0_.data();
  {
    Scope s(Cat::kNorm);
    rmsnorm_backward(dres, G + off_lnf_, dln_.data(), resL, P + off_lnf_, lnf_rstd_.data(), BT, C);
  }

  for (int64_t l = L - 1; l >= 0; --l) {
    BlockActs A = block(int(l), BT);
    Linear* lin = &linears_[l * kLinearsPerBlock];
    const float* res = l > 0 ? block(int(l) - 1, BT).x3 : x0_.data();
    // MLP branch: x3 = x2 + down(act(up(rmsnorm(x2)))).
    std::fill(dact_.begin(), dact_.begin() + BT * F, 0.f);
    lin[kDown].backward(dres, dact_.data(), BT, ctx);
    std::fill(dh_.begin(), dh_.begin() + BT * U, 0.f);
    {
      Scope s(Cat::kActivation);
      if (swiglu)
        swiglu_backward(dh_.data(), dact_.data(), A.h, BT, F);
      else
        squared_relu_backward(dh_.data(), dact_.data(), A.h, BT * F);
    }
    std::fill(dln_.begin(), dln_.begin() + BT * C, 0.f);
    lin[kUp].backward(dh_.data(), dln_.data(), BT, ctx);
    {
      Scope s(Cat::kNorm);
      rmsnorm_backward(dres, G + off_ln2_[l], dln_.data(), A.x2, P + off_ln2_[l], A.rstd2, BT, C);
    }
    // Attention branch: x2 = res + o(attention(rope(q), rope(k), v)).
    std::fill(datt_.begin(), datt_.begin() + BT * C, 0.f);
    lin[kO].backward(dres, datt_.data(), BT, ctx);
    std::fill(dq_.begin(), dq_.begin() + BT * C, 0.f);
    std::fill(dk_.begin(), dk_.begin() + BT * C, 0.f);
    std::fill(dv_.begin(), dv_.begin() + BT * C, 0.f);
    {
      Scope s(Cat::kAttention);
      prof::add_flops(Cat::kAttention, 4.0 * 2.0 * B * H * (T * (T + 1) / 2) * (C / H));  // dP, dQ, dK, dV
      attention_backward(dq_.data(), dk_.data(), dv_.data(), scratch_.data(), datt_.data(), A.q,
                         A.k, A.v, A.att, B, T, C, H);
    }
    {
      Scope s(Cat::kRope);
      rope_backward(dq_.data(), B, T, H, C / H, cfg_.rope_theta);
      rope_backward(dk_.data(), B, T, H, C / H, cfg_.rope_theta);
    }
    std::fill(dln_.begin(), dln_.begin() + BT * C, 0.f);
    lin[kQ].backward(dq_.data(), dln_.data(), BT, ctx);
    lin[kK].backward(dk_.data(), dln_.data(), BT, ctx);
    lin[kV].backward(dv_.data(), dln_.data(), BT, ctx);
    {
      Scope s(Cat::kNorm);
      rmsnorm_backward(dres, G + off_ln1_[l], dln_.data(), res, P + off_ln1_[l], A.rstd1, BT, C);
    }
  }
  Scope s(Cat::kEmbedding);
  embedding_backward(G + off_wte_, dres, tokens_.data(), BT, C);
}

}  // namespace fp4::nn
