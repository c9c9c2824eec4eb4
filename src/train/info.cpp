// model_info (fp4/train/info.h): a run's size, FLOPs, step memory and linear plan from its config.
#include "fp4/train/info.h"

#include <algorithm>
#include <memory>
#include <stdexcept>

#include "fp4/base/error.h"
#include "fp4/nn/mixer.h"
#include "fp4/nn/model.h"

namespace fp4 {

const BlockKindCount& ModelInfo::kind(char symbol) const {
  for (const BlockKindCount& k : kinds)
    if (k.symbol == symbol) return k;
  throw std::out_of_range(std::string("ModelInfo::kind: no block kind '") + symbol + "'");
}

namespace {
// model_info's body: `given` are the recipe's plans resolved already, or null.
ModelInfo describe_run(const RunConfig& cfg, const Recipe& recipe, const ResolvedLinears* given) {
  const ModelConfig& m = cfg.model;
  ModelInfo info;
  info.pattern = m.block_pattern();
  info.n_blocks = static_cast<int>(info.pattern.size());
  if (info.n_blocks == 0) throw UserError("model: the block pattern is empty");
  const int64_t d = m.d_model, V = m.vocab_size;
  // The step's tokens (FLOPs) are the whole batch; its buffers hold one micro-batch.
  const int64_t T = cfg.train.seq_len, BT_step = int64_t(cfg.train.batch_size) * T;
  const int64_t B = cfg.train.micro(), BT = B * T;
  info.batch_size = cfg.train.batch_size;
  info.micro_batch_size = cfg.train.micro();
  info.seq_len = cfg.train.seq_len;
  info.tokens_per_step = BT_step;

  // One mixer per kind present (they depend on the kind and the config only).
  nn::check_block_kinds(m, [](const std::string& what) { throw UserError("model: " + what); });
  const std::vector<nn::MixerKind>& registry = nn::mixer_kinds();
  std::vector<std::unique_ptr<nn::Mixer>> mixers(registry.size());
  for (const nn::MixerKind& k : registry) {
    BlockKindCount c;
    c.symbol = k.symbol;
    c.name = k.name;
    c.key = k.key;
    info.kinds.push_back(c);
  }
  auto slot = [&](char c) {
    for (size_t i = 0; i < registry.size(); ++i)
      if (registry[i].symbol == c) return i;
    throw std::logic_error("model_info: unchecked block character");
  };
  for (char c : info.pattern) {
    std::unique_ptr<nn::Mixer>& mx = mixers[slot(c)];
    if (!mx) {
      mx = nn::make_mixer(c, m);
      info.kinds[slot(c)].per_block = nn::block_param_count(c, m);
    }
    ++info.kinds[slot(c)].blocks;
  }
  info.embeddings = V * d;
  info.lm_head = V * d;
  info.norm_f = d;
  info.parameters = info.embeddings + info.norm_f + info.lm_head;
  for (BlockKindCount& k : info.kinds) {
    k.params = k.blocks * k.per_block;
    info.parameters += k.params;
  }
  info.flops_per_token = nn::Model::flops_per_token(m, T);
  info.flops_per_step = info.flops_per_token * double(BT_step);

  // Memory, as nn::Model allocates it (model.cpp), in floats first.
  constexpr int64_t F = sizeof(float);
  StepMemory& mem = info.memory;
  mem.params = F * info.parameters;
  mem.grads = F * info.parameters;
  mem.adamw = 2 * F * info.parameters;
  // Gradient accumulation in one process (trainer.cpp MicroRunner): the root node's sum and
  // one right-child sum per tree level below it, ceil(log2 n) levels.
  if (const int n = cfg.train.n_micro(); n > 1) {
    int levels = 0;
    while ((1 << levels) < n) ++levels;
    mem.accumulation = F * info.parameters * (1 + levels);
  }
  int64_t acts = 0, scratch = 0;
  for (char c : info.pattern) {
    const nn::Mixer& mx = *mixers[slot(c)];
    acts += BT * (2 * d + 1) + mx.activation_floats(B, T);
    scratch = std::max(scratch, mx.scratch_floats(B, T));
  }
  acts += BT * d + BT * d + BT;  // embedding output x0, final norm output and its rstd
  mem.activations = F * acts;
  mem.logits = F * BT * V;
  mem.backward_scratch = F * (2 * BT * d + scratch);

  // Linears and their plans.
  const std::vector<LinearSite> sites = nn::Model::linear_sites(m);
  const ResolvedLinears resolved =
      given ? ResolvedLinears{} : resolve_linear_plans(recipe, sites, info.n_blocks);
  const ResolvedLinears& res = given ? *given : resolved;
  if (res.plans.size() != sites.size())
    throw std::invalid_argument("model_info: " + std::to_string(res.plans.size()) +
                                " linear plans given for a model of " +
                                std::to_string(sites.size()) + " linears");
  std::vector<nn::MixerLinear> shapes;
  for (char c : info.pattern)
    for (const nn::MixerLinear& l : mixers[slot(c)]->linears()) shapes.push_back(l);
  if (shapes.size() != sites.size())
    throw std::logic_error("model_info: linear sites and mixer linears disagree");
  int64_t row = 0, wqd = 0, t0 = 0, t1 = 0;  // LinearWorkspace buffers (floats)
  int64_t bf16_a = 0, bf16_b = 0, product = 0;  // its decoded-bf16 GEMM scratch
  for (size_t i = 0; i < sites.size(); ++i) {
    LinearInfo li;
    li.block = sites[i].block;
    li.kind = sites[i].kind;
    li.name = "layers." + std::to_string(li.block) + ".mixer." + li.kind;
    li.out = shapes[i].out;
    li.in = shapes[i].in;
    const LinearPlan& plan = res.plans[i];
    li.mode = plan.mode;
    ++info.mode_counts[int(li.mode)];
    const int64_t K = li.in, N = li.out;
    if (li.mode == LinearMode::FP4) {
      mem.linear_scratch += F * N * K;  // wq_
      if (plan.bf16_boundary) mem.linear_scratch += F * (BT * K + BT * N);  // xr_, dyr_
      if (plan.ms_eden()) mem.linear_scratch += F * BT * K;  // xhat_: the forward's X̂
      const nn::Linear::WorkspaceFloats w = nn::Linear::workspace_floats(plan, K, N, BT);
      row = std::max(row, w.row);
      wqd = std::max(wqd, w.wqd);
      t0 = std::max(t0, w.t0);
      t1 = std::max(t1, w.t1);
      bf16_a = std::max(bf16_a, w.bf16_a);
      bf16_b = std::max(bf16_b, w.bf16_b);
      product = std::max(product, w.product);
    } else if (li.mode == LinearMode::BF16) {
      mem.linear_scratch += int64_t(sizeof(uint16_t)) * (BT * K + N * K + BT * N);  // xb_, wb_, dyb_
    }
    info.linears.push_back(std::move(li));
  }
  mem.linear_workspace = F * (row + wqd + t0 + t1 + product) +
                         int64_t(sizeof(uint16_t)) * (bf16_a + bf16_b);
  for (size_t k = 0; k < res.override_hits.size(); ++k) {
    info.override_descriptions.push_back(recipe.overrides[k].describe());
    info.override_hits.push_back(res.override_hits[k]);
    for (int i : res.override_hits[k]) info.linears[size_t(i)].overrides.push_back(int(k));
  }
  LinearInfo head;
  head.name = head.kind = "lm_head";
  head.out = V;
  head.in = d;
  head.mode = LinearMode::FP32;
  info.linears.push_back(head);
  return info;
}

}  // namespace

ModelInfo model_info(const RunConfig& cfg, const Recipe& recipe) {
  return describe_run(cfg, recipe, nullptr);
}

ModelInfo model_info(const RunConfig& cfg, const Recipe& recipe, const ResolvedLinears& plans) {
  return describe_run(cfg, recipe, &plans);
}

}  // namespace fp4
