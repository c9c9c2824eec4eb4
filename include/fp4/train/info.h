// What a training run of a config and recipe would be, computed from the config alone
// (`fp4train info`): parameter counts, model FLOPs, the memory of one training step by part,
// and every linear's mode under the recipe. Nothing here allocates the model's buffers, so a
// config far beyond the machine (configs/nemotron-h-8b.toml) is described at once.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "fp4/nn/run_config.h"
#include "fp4/recipe/recipe.h"

namespace fp4 {

/// Bytes of one training step's buffers at micro_batch_size × seq_len (one forward; the
/// whole batch when there is no micro-batching), by part. The fields are those
/// of nn::Model::MemoryUse (same meaning, same value for a model built with the same config,
/// recipe, batch and seq_len), plus the optimizer's moments.
struct StepMemory {
  int64_t params = 0;            ///< FP32 master weights: 4·N bytes
  int64_t grads = 0;             ///< their gradients: 4·N
  int64_t adamw = 0;             ///< AdamW first and second moments: 2·4·N
  /// Gradient accumulation (train.micro_batch_size < batch_size), one process: the tree's
  /// node sums, 4·N·(1 + ceil(log2 n)) for n micro-batches; 0 for one forward per step.
  int64_t accumulation = 0;
  int64_t activations = 0;       ///< per block BT·(2·d + 1) + Mixer::activation_floats; the
                                 ///< embedding output, final norm and its rstd BT·(2·d + 1)
  int64_t logits = 0;            ///< BT·V
  int64_t backward_scratch = 0;  ///< 2·BT·d + the largest Mixer::scratch_floats
  /// ESTIMATE of Linear::scratch_bytes() summed over the linears once a training step has run
  /// (a built model holds none before its first forward): FP4 a quantized weight copy
  /// [out·in] FP32 (and with fp4.bf16_boundary the rounded X [BT·in] and dY [BT·out] FP32);
  /// BF16 the BF16 copies of X [BT·in], W [out·in] and dY [BT·out] (2 bytes each); FP32 none.
  int64_t linear_scratch = 0;
  /// The LinearWorkspace all linears share, as Linear::reserve_workspace sizes it when the
  /// model is built (the largest FP4 linear's quantized X or dY [BT·max(in, out)], transposes
  /// [out·BT] and [in·BT], a dgrad weight copy [out·in] when its quantization differs from
  /// fprop's); 0 without FP4 linears. An ESTIMATE under gemm = "probe-matched", whose scratch
  /// grows on use (counted as 0 here, as at construction).
  int64_t linear_workspace = 0;
  int64_t total() const {
    return params + grads + adamw + accumulation + activations + logits + backward_scratch + linear_scratch +
           linear_workspace;
  }
};

/// One linear of the model: an FP4-eligible one of a block, or the FP32 LM head.
struct LinearInfo {
  std::string name;       ///< "layers.N.mixer.<kind>", or "lm_head"
  int block = -1;         ///< hybrid block (0-based); -1 for lm_head
  std::string kind;       ///< linear_kinds() name, or "lm_head"
  int64_t out = 0, in = 0;  ///< weight shape [out, in]
  LinearMode mode = LinearMode::FP32;  ///< after [high_precision] and [[override]] (mode)
  std::vector<int> overrides;          ///< indices of the [[override]]s that changed it
};

/// Parameters of one kind of block, summed over the pattern.
struct BlockKindCount {
  char symbol = 0;          ///< nn::MixerKind::symbol
  std::string name, key;    ///< nn::MixerKind::name ("Mamba-2"), key ("mamba2")
  int blocks = 0;           ///< blocks of this kind in the pattern
  int64_t per_block = 0;    ///< nn::block_param_count (norm weight included)
  int64_t params = 0;       ///< blocks · per_block
};

struct ModelInfo {
  std::string pattern;  ///< ModelConfig::block_pattern()
  int n_blocks = 0;
  /// Every registered kind (nn::mixer_kinds(), in registry order: 'M' Mamba-2, '*'
  /// attention, '-' MLP, then any registered later), absent ones with 0 blocks.
  std::vector<BlockKindCount> kinds;
  /// The count of kind `symbol`; throws std::out_of_range for an unregistered one.
  const BlockKindCount& kind(char symbol) const;
  int64_t embeddings = 0;  ///< V·d
  int64_t lm_head = 0;     ///< V·d
  int64_t norm_f = 0;      ///< d
  int64_t parameters = 0;  ///< all of the above: nn::Model::num_params() of the built model
  int batch_size = 0, micro_batch_size = 0, seq_len = 0;
  int64_t tokens_per_step = 0;   ///< batch_size · seq_len
  double flops_per_token = 0;    ///< nn::Model::flops_per_token(cfg, seq_len)
  double flops_per_step = 0;     ///< flops_per_token · tokens_per_step
  StepMemory memory;             ///< at micro_batch_size × seq_len
  /// Every FP4-eligible linear in model order (nn::Model::linear_sites), then lm_head (FP32).
  std::vector<LinearInfo> linears;
  /// Per [[override]]: its LinearOverride::describe() and the linears() indices it changed.
  std::vector<std::string> override_descriptions;
  std::vector<std::vector<int>> override_hits;
  /// FP4-eligible linears (lm_head excluded) per mode, indexed by int(LinearMode).
  int mode_counts[3] = {0, 0, 0};
  int eligible_linears() const { return mode_counts[0] + mode_counts[1] + mode_counts[2]; }
};

/// Describe the run of `cfg` under `recipe` without building the model: parameters (embeddings
/// V·d + lm_head V·d + norm_f d + Σ over the pattern of nn::block_param_count), model FLOPs
/// (nn::Model::flops_per_token, PaLM convention), the step memory at cfg.train.batch_size ×
/// cfg.train.seq_len (StepMemory) and the per-linear modes from resolve_linear_plans. Cost:
/// one mixer object per block (no buffers). Throws fp4::UserError for a bad pattern character
/// and what resolve_linear_plans throws when the recipe does not fit the model (naming the
/// recipe file and key).
ModelInfo model_info(const RunConfig& cfg, const Recipe& recipe);
/// The same with the recipe's plans resolved already (check_recipe_fits on `cfg`, or
/// ResolvedRun::plans): they are not resolved again. Throws std::invalid_argument when `plans`
/// does not hold one plan per linear of cfg.model.
ModelInfo model_info(const RunConfig& cfg, const Recipe& recipe, const ResolvedLinears& plans);

}  // namespace fp4
