// The hybrid decoder's forward and backward: embedding, a loop over the pattern's blocks
// (x + mixer(RMSNorm(x)), fp4/nn/mixer.h), final norm, LM head (llm.c style, top to bottom).
#include "fp4/nn/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <utility>

#include "fp4/base/error.h"
#include "fp4/gemm/gemm.h"
#include "fp4/nn/layers.h"
#include "fp4/base/profile.h"

namespace fp4::nn {
using prof::Cat;
using prof::Scope;

int64_t Model::add_param(const std::string& name, int64_t rows, int64_t cols, bool decay,
                         ParamInit init, int block) {
  ParamInfo p;
  p.name = name;
  p.rows = rows;
  p.cols = cols;
  p.size = rows * cols;
  p.offset = infos_.empty() ? 0 : infos_.back().offset + infos_.back().size;
  p.weight_decay = decay;
  p.init = init;
  p.block = block;
  infos_.push_back(p);
  return p.offset;
}

Model::Model(const ModelConfig& cfg, const Recipe& recipe, int batch, int seq_len)
    : Model(cfg, &recipe, nullptr, batch, seq_len) {}

Model::Model(const ModelConfig& cfg, ResolvedLinears plans, int batch, int seq_len)
    : Model(cfg, nullptr, &plans, batch, seq_len) {}

Model::Model(const ModelConfig& cfg, const Recipe* recipe, ResolvedLinears* plans, int batch,
             int seq_len)
    : cfg_(cfg), batch_(batch), seq_len_(seq_len),
      pattern_(cfg.block_pattern()), T_(seq_len) {
  const int64_t C = cfg.d_model, V = cfg.vocab_size;
  if (pattern_.empty()) throw UserError("model: the block pattern is empty");
  check_block_kinds(cfg, [](const std::string& what) { throw UserError("model: " + what); });
  off_wte_ = add_param("embeddings", V, C, true, ParamInit::kNormal, -1);
  const int L = static_cast<int>(pattern_.size());
  blocks_.resize(L);
  for (int l = 0; l < L; ++l) {
    Block& b = blocks_[l];
    b.symbol = pattern_[l];
    b.mixer = make_mixer(b.symbol, cfg);
    const std::string pre = "layers." + std::to_string(l) + ".";
    b.off_norm = add_param(pre + "norm", 1, C, false, ParamInit::kOnes, l);
    for (const MixerParam& p : b.mixer->params())
      b.off_params.push_back(
          add_param(pre + "mixer." + p.name, p.rows, p.cols, p.weight_decay, p.init, l));
    b.first_linear = sites_.size();
    for (const MixerLinear& lin : b.mixer->linears()) {
      b.off_linears.push_back(add_param(pre + "mixer." + lin.kind, lin.out, lin.in, true,
                                        lin.output_projection ? ParamInit::kNormalOut
                                                              : ParamInit::kNormal,
                                        l));
      off_lin_.push_back(b.off_linears.back());
      sites_.push_back({l, lin.kind});
    }
  }
  off_lnf_ = add_param("norm_f", 1, C, false, ParamInit::kOnes, -1);
  off_head_ = add_param("lm_head", V, C, true, ParamInit::kNormal, -1);
  params_.assign(infos_.back().offset + infos_.back().size, 0.f);
  grads_.assign(params_.size(), 0.f);

  // Per-linear mode and specs: [high_precision] rules and [[override]]s (recipe.h), resolved
  // here or given.
  if (plans == nullptr) {
    resolved_ = resolve_linear_plans(*recipe, sites_, L);
  } else if (plans->plans.size() != sites_.size()) {
    throw std::invalid_argument("model: " + std::to_string(plans->plans.size()) +
                                " linear plans given for a model of " +
                                std::to_string(sites_.size()) + " linears");
  } else {
    resolved_ = std::move(*plans);
  }
  const ResolvedLinears& resolved = resolved_;
  linears_.reserve(sites_.size());
  for (int l = 0; l < L; ++l) {
    const std::vector<MixerLinear> ls = blocks_[l].mixer->linears();
    for (size_t j = 0; j < ls.size(); ++j) {
      const size_t i = blocks_[l].first_linear + j;
      const LinearPlan& plan = resolved.plans[i];
      if (plan.dgrad_hadamard() && !plan.ms_eden() && ls[j].out % plan.hadamard_size != 0)  // check_hadamard_shape; MS-EDEN pads
        throw UserError("model: linear " + std::to_string(i) + " (block " + std::to_string(l) +
                        ", " + sites_[i].kind + ") has N = " + std::to_string(ls[j].out) +
                        " output features, not a multiple of fp4.hadamard_size = " +
                        std::to_string(plan.hadamard_size) + " (the dgrad Hadamard transform, "
                        "fp4.hadamard_gemms, runs along N)");
      linears_.emplace_back(int(i), ls[j].in, ls[j].out, plan);
    }
  }
  bind_linears();
  // One workspace for every linear (only one runs at a time), grown once for the largest.
  workspace_ = std::make_shared<LinearWorkspace>();
  for (Linear& lin : linears_) {
    lin.bind_workspace(workspace_);
    lin.reserve_workspace(int64_t(batch) * seq_len);
  }

  const int64_t BT = int64_t(batch) * seq_len;
  int64_t scratch = 0;
  for (Block& b : blocks_) {
    b.acts.assign(BT * (2 * C + 1) + b.mixer->activation_floats(batch, seq_len), 0.f);
    scratch = std::max(scratch, b.mixer->scratch_floats(batch, seq_len));
  }
  x0_.resize(BT * C);
  lnf_.resize(BT * C);
  lnf_rstd_.resize(BT);
  logits_.resize(BT * V);
  dres_.resize(BT * C);
  dln_.resize(BT * C);
  scratch_.resize(scratch);
  size_t max_params = 0;  // the MixerCall pointer arrays, grown once (no allocation per step)
  for (const Block& b : blocks_) max_params = std::max(max_params, b.off_params.size());
  call_params_.reserve(max_params);
  call_grads_.reserve(max_params);
  tokens_.resize(BT);
  targets_.resize(BT);
}

std::vector<LinearSite> Model::linear_sites(const ModelConfig& cfg) {
  const std::string pat = cfg.block_pattern();
  std::vector<LinearSite> sites;
  for (int l = 0; l < int(pat.size()); ++l)
    for (const MixerLinear& lin : make_mixer(pat[l], cfg)->linears()) sites.push_back({l, lin.kind});
  return sites;
}

std::string Model::linear_name(size_t i) const {
  return "layers." + std::to_string(sites_[i].block) + ".mixer." + sites_[i].kind;
}

void Model::bind_linears() {
  for (size_t i = 0; i < linears_.size(); ++i)
    linears_[i].bind(params_.data() + off_lin_[i], grads_.data() + off_lin_[i]);
}

int64_t Model::num_body_params() const {
  const int64_t VC = int64_t(cfg_.vocab_size) * cfg_.d_model;
  return num_params() - 2 * VC;
}

double Model::flops_per_token(const ModelConfig& cfg, int64_t T, bool causal) {
  const std::string pat = cfg.block_pattern();
  const double VC = double(cfg.vocab_size) * cfg.d_model;
  double n = 2.0 * VC + cfg.d_model;  // embeddings, lm_head, norm_f
  double extra = 0.0;
  for (char c : pat) {
    n += double(block_param_count(c, cfg));
    const std::unique_ptr<Mixer> m = make_mixer(c, cfg);
    extra += causal ? m->causal_flops_per_token(T) : m->extra_flops_per_token(T);
  }
  return 6.0 * (n - VC) + extra;
}

double Model::flops_per_token(int64_t T, bool causal) const {
  const double N = double(num_params()) - double(cfg_.vocab_size) * cfg_.d_model;
  double extra = 0.0;
  for (const Block& b : blocks_)
    extra += causal ? b.mixer->causal_flops_per_token(T) : b.mixer->extra_flops_per_token(T);
  return 6.0 * N + extra;
}

Model::MemoryUse Model::memory_use() const {
  auto bytes = [](const auto& v) { return int64_t(v.size() * sizeof(v[0])); };
  MemoryUse m;
  m.params = bytes(params_);
  m.grads = bytes(grads_);
  for (const Block& b : blocks_) m.activations += bytes(b.acts);
  m.activations += bytes(x0_) + bytes(lnf_) + bytes(lnf_rstd_);
  m.logits = bytes(logits_);
  m.backward_scratch = bytes(dres_) + bytes(dln_) + bytes(scratch_);
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
  const float out_std = cfg_.init_std / std::sqrt(float(pattern_.size()));
  std::vector<size_t> custom_index(infos_.size(), 0);  // index among its mixer's params()
  for (const Block& b : blocks_)
    for (size_t j = 0; j < b.off_params.size(); ++j)
      for (size_t i = 0; i < infos_.size(); ++i)
        if (infos_[i].offset == b.off_params[j]) custom_index[i] = j;
  for (size_t i = 0; i < infos_.size(); ++i) {
    const ParamInfo& p = infos_[i];
    float* w = params_.data() + p.offset;
    switch (p.init) {
      case ParamInit::kOnes:
        std::fill(w, w + p.size, 1.f);
        break;
      case ParamInit::kNormal:
      case ParamInit::kNormalOut: {
        std::normal_distribution<float> d(0.f, p.init == ParamInit::kNormalOut ? out_std
                                                                                : cfg_.init_std);
        for (int64_t k = 0; k < p.size; ++k) w[k] = d(rng);
        break;
      }
      case ParamInit::kCustom:
        blocks_[p.block].mixer->init_param(custom_index[i], w, rng);
        break;
    }
  }
}

void Model::zero_grad() { std::fill(grads_.begin(), grads_.end(), 0.f); }

void Model::reset_inference(int replay_interval) {
  for (auto& lin : linears_) lin.reset_inference(replay_interval);
}

MixerCall Model::call(int l, int B, const StepContext& ctx, std::vector<const float*>& p,
                      std::vector<float*>& g) {
  Block& b = blocks_[l];
  p.clear();
  g.clear();
  for (int64_t off : b.off_params) {
    p.push_back(params_.data() + off);
    g.push_back(grads_.data() + off);
  }
  MixerCall c;
  c.B = B;
  c.T = T_;
  c.params = p.data();
  c.grads = g.data();
  c.linears = linears_.data() + b.first_linear;
  c.acts = block_mixer_acts(l);
  c.scratch = scratch_.data();
  c.workspace = workspace_.get();
  c.ctx = &ctx;
  return c;
}

double Model::forward(const int32_t* tokens, const int32_t* targets, int B,
                      const StepContext& ctx, int T_in) {
  if (B < 1 || B > batch_) throw std::invalid_argument("Model::forward: bad batch size");
  if (T_in < 0 || T_in > seq_len_)
    throw std::invalid_argument("Model::forward: sequence length " + std::to_string(T_in) +
                                " outside 1.." + std::to_string(seq_len_));
  B_ = B;
  T_ = T_in > 0 ? T_in : seq_len_;
  const int64_t T = T_, BT = int64_t(B) * T, C = cfg_.d_model, V = cfg_.vocab_size;
  std::memcpy(tokens_.data(), tokens, BT * sizeof(int32_t));
  if (targets) std::memcpy(targets_.data(), targets, BT * sizeof(int32_t));
  const float* P = params_.data();

  {
    Scope s(Cat::kEmbedding);
    embedding_forward(x0_.data(), tokens, P + off_wte_, BT, C, V);
  }
  std::vector<const float*>& pp = call_params_;
  std::vector<float*>& gp = call_grads_;
  const float* res = x0_.data();
  for (int l = 0; l < n_blocks(); ++l) {
    float* ln = block_ln(l);
    float* out = block_out(l);
    {
      Scope s(Cat::kNorm);
      rmsnorm_forward(ln, block_rstd(l), res, P + blocks_[l].off_norm, BT, C, cfg_.norm_eps);
    }
    blocks_[l].mixer->forward(call(l, B, ctx, pp, gp), ln, out);
    {
      Scope s(Cat::kResidual);
      residual_add(out, res, BT * C);
    }
    res = out;
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
  const int64_t T = T_, BT = int64_t(B) * T, C = cfg_.d_model, V = cfg_.vocab_size;
  const int L = n_blocks();
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

  float* dres = dres_.data();  // gradient of the residual stream, carried down the blocks
  std::fill(dres, dres + BT * C, 0.f);
  const float* resL = L > 0 ? block_out(L - 1) : x0_.data();
  {
    Scope s(Cat::kNorm);
    rmsnorm_backward(dres, G + off_lnf_, dln_.data(), resL, P + off_lnf_, lnf_rstd_.data(), BT, C);
  }
  std::vector<const float*>& pp = call_params_;
  std::vector<float*>& gp = call_grads_;
  for (int l = L - 1; l >= 0; --l) {
    // out = res + mixer(rmsnorm(res)): dres passes through, and the branch adds its part.
    const float* res = l > 0 ? block_out(l - 1) : x0_.data();
    blocks_[l].mixer->backward(call(l, B, ctx, pp, gp), block_ln(l), dres, dln_.data());
    Scope s(Cat::kNorm);
    const int64_t off = blocks_[l].off_norm;
    rmsnorm_backward(dres, G + off, dln_.data(), res, P + off, block_rstd(l), BT, C);
  }
  Scope s(Cat::kEmbedding);
  embedding_backward(G + off_wte_, dres, tokens_.data(), BT, C);
}

}  // namespace fp4::nn
