// The hybrid decoder of Nemotron-H (arXiv 2504.03624), of which the Llama-style decoder is
// the pattern "*-*-...": token embedding; a pattern of blocks, each x + mixer(RMSNorm(x))
// with a Mamba-2 ('M'), attention ('*') or MLP ('-') mixer (fp4/nn/mixer.h); final RMSNorm;
// untied FP32 LM head. Every linear except the LM head is an fp4::nn::Linear, named as in
// HF Nemotron-H: layers.N.mixer.{in_proj, out_proj, q_proj, k_proj, v_proj, o_proj,
// up_proj, down_proj}. Parameters and their gradients each live in one contiguous FP32
// buffer (llm.c style), in the order embeddings, per block (norm, mixer parameters, linear
// weights), norm_f, lm_head.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fp4/nn/run_config.h"
#include "fp4/nn/linear.h"
#include "fp4/nn/mixer.h"
#include "fp4/recipe/recipe.h"

namespace fp4::nn {

/// One named parameter tensor: a slice [offset, offset + size) of the parameter buffer.
struct ParamInfo {
  std::string name;
  int64_t offset = 0, size = 0;
  int64_t rows = 0, cols = 0;
  bool weight_decay = true;  ///< false for norm weights and Mamba-2's A_log, D, dt_bias, conv bias
  ParamInit init = ParamInit::kNormal;
  int block = -1;            ///< hybrid block holding it; -1 for embeddings, norm_f, lm_head
};

class Model {
 public:
  /// Builds the model for `batch` sequences of `seq_len` tokens (activation buffers are sized
  /// for that), its linears from `recipe` resolved for them (resolve_linear_plans). Throws
  /// fp4::UserError on inconsistent config and what resolve_linear_plans throws.
  Model(const ModelConfig& cfg, const Recipe& recipe, int batch, int seq_len);
  /// The same with the plans resolved already (check_recipe_fits on this config: one per
  /// linear, in linear_sites(cfg) order), which a run resolves once. Throws fp4::UserError on
  /// inconsistent config, std::invalid_argument when plans.plans does not hold one plan per
  /// linear of the model.
  Model(const ModelConfig& cfg, ResolvedLinears plans, int batch, int seq_len);

  /// Initialise parameters, in parameter order from one mt19937_64(seed) stream:
  /// N(0, init_std) for matrices; projections into the residual stream (o_proj, down_proj,
  /// out_proj) N(0, init_std/sqrt(n_blocks)) (GPT-2's residual scaling; 1/sqrt(2L) for a
  /// Llama-style model of L layers, as mamba_ssm's rescale of out_proj by 1/sqrt(n_layer));
  /// norm weights 1; Mamba-2's own parameters as its mixer says (mixer_mamba2.cpp).
  void init(uint64_t seed);

  /// Forward pass over tokens [B, T] (B ≤ batch; T = seq_len, or 1 ≤ T ≤ seq_len when given,
  /// e.g. a sampling context shorter than seq_len). If targets is non-null returns the mean
  /// cross-entropy (nats/token), else 0. Logits [B·T, vocab] stay in logits().
  /// Throws std::invalid_argument on a bad B or T.
  double forward(const int32_t* tokens, const int32_t* targets, int B, const StepContext& ctx,
                 int T = 0);
  /// The sequence length the model was built for (the longest forward).
  int max_seq_len() const { return seq_len_; }

  /// Backward of the last forward (which must have had targets); ACCUMULATES into grads().
  void backward(const StepContext& ctx);

  void zero_grad();

  /// Linear::reset_inference on every linear: forget the inference references (frozen weight
  /// amax, Replay holds of interval `replay_interval`, calibration). See fp4/eval/eval.h.
  void reset_inference(int replay_interval = 50);

  std::vector<float>& params() { return params_; }
  std::vector<float>& grads() { return grads_; }
  const std::vector<ParamInfo>& param_infos() const { return infos_; }
  const std::vector<Linear>& linears() const { return linears_; }
  std::vector<Linear>& linears() { return linears_; }  ///< (checkpoint resume)
  /// Name of linears()[i], e.g. "layers.3.mixer.down_proj".
  std::string linear_name(size_t i) const;
  /// Block and kind of every linear, in linears() order (what the recipe rules select on).
  const std::vector<LinearSite>& linear_sites() const { return sites_; }
  /// The recipe resolved for every linear (resolve_linear_plans, once, at construction): the
  /// plan each Linear was built from, in linears() order, and the linears each [[override]]
  /// changed. For `info`, the run's log line and the fit checks.
  const ResolvedLinears& resolved_linears() const { return resolved_; }
  /// Number of hybrid blocks (the pattern's length) and the pattern.
  int n_blocks() const { return static_cast<int>(blocks_.size()); }
  const std::string& pattern() const { return pattern_; }
  /// Logits [B·T, vocab] of the last forward; backward() overwrites them with their gradient.
  const float* logits() const { return logits_.data(); }
  int64_t num_params() const { return static_cast<int64_t>(params_.size()); }
  /// Parameters excluding the token embedding and the LM head.
  int64_t num_body_params() const;
  /// Model FLOPs of one training step per token (forward + backward) at sequence length T,
  /// the standard count of PaLM (Chowdhery et al. 2022, appendix B): 6·N + Σ over blocks of
  /// the mixer's extra_flops_per_token(T), where N = num_params() − vocab·d, every parameter
  /// except the input embedding table (a lookup, no FLOPs); the LM head is an untied vocab × d
  /// matmul and counts. 6N covers the forward (2N) and backward (4N) matmuls. Attention adds
  /// 12·(H·hd)·T (QKᵀ and PV, 2·T·H·hd FLOPs each per token forward, ×3 with backward),
  /// counted over the full T × T square as in PaLM although the causal kernel skips the
  /// masked half; for a Llama-style model that is PaLM's 12·L·d·T. Mamba-2 adds
  /// 12·d_inner·N (the SSD's state update and readout, 2·d_inner·N each per token forward,
  /// ×3). Norms, activations, softmax, the conv and the optimizer are not counted.
  /// `causal`: the mixers' causal_flops_per_token instead (attention over the causal
  /// triangle, 6·(H·hd)·(T + 1); `fp4train profile`'s second MFU).
  double flops_per_token(int64_t T, bool causal = false) const;
  /// The same without building a model (fp4train info).
  static double flops_per_token(const ModelConfig& cfg, int64_t T, bool causal = false);
  /// linear_sites() of the model `cfg` describes, without building it. Throws
  /// fp4::UserError for a bad pattern character.
  static std::vector<LinearSite> linear_sites(const ModelConfig& cfg);

  /// Bytes of the model's buffers, by what they hold (FP32 throughout).
  struct MemoryUse {
    int64_t params = 0;            ///< master weights, num_params() floats
    int64_t grads = 0;             ///< their gradients
    int64_t activations = 0;       ///< what backward needs from forward: per block its normed
                                   ///< input, rstd and output [BT·(2C+1)] and what its mixer
                                   ///< keeps (Mixer::activation_floats: attention q, k, v, y
                                   ///< and probabilities [B·H·T·T]; MLP h, a; Mamba-2 see
                                   ///< mixer_mamba2.cpp); embedding out, norm_f
    int64_t logits = 0;            ///< logits [BT·V]; backward overwrites them with their gradient
    int64_t backward_scratch = 0;  ///< gradient buffers reused across blocks: the residual
                                   ///< and normed-input gradients [BT·C] each and the largest
                                   ///< Mixer::scratch_floats
    int64_t linear_scratch = 0;    ///< Linear::scratch_bytes() summed over every linear: what
                                   ///< each keeps from forward to backward (FP4/BF16 weight
                                   ///< copy [N·K]; BF16 mode also its operand copies)
    int64_t linear_workspace = 0;  ///< the LinearWorkspace all linears share, counted once:
                                   ///< transient FP4 operands of the largest linear (quantized
                                   ///< X or dY [BT·max(K,N)], transposes [BT·N], [BT·K], dgrad
                                   ///< weight copy [N·K] for 1-D weights); 0 without FP4
    int64_t total() const {
      return params + grads + activations + logits + backward_scratch + linear_scratch +
             linear_workspace;
    }
  };
  MemoryUse memory_use() const;
  const ModelConfig& config() const { return cfg_; }

  /// Whether the q, k and v projections may share one quantized copy of their common input
  /// (LinearWorkspace shared-input scope: only when spec, g and RNE rounding agree, so the
  /// results are bit-identical either way). On by default; tests turn it off to compare.
  void set_share_linear_inputs(bool on) { workspace_->sharing = on; }
  const LinearWorkspace& linear_workspace() const { return *workspace_; }

 private:
  struct Block {
    char symbol = '*';
    std::unique_ptr<Mixer> mixer;
    int64_t off_norm = 0;                 ///< its RMSNorm weight
    std::vector<int64_t> off_params;      ///< mixer->params(), in order
    std::vector<int64_t> off_linears;     ///< mixer->linears() weights, in order
    size_t first_linear = 0;              ///< index of its first linear in linears_
    std::vector<float> acts;              ///< ln [BT,C] | rstd [BT] | out [BT,C] | mixer's
  };
  float* block_ln(int l) { return blocks_[l].acts.data(); }
  float* block_rstd(int l) { return block_ln(l) + int64_t(batch_) * seq_len_ * cfg_.d_model; }
  float* block_out(int l) { return block_rstd(l) + int64_t(batch_) * seq_len_; }
  float* block_mixer_acts(int l) {
    return block_out(l) + int64_t(batch_) * seq_len_ * cfg_.d_model;
  }
  MixerCall call(int l, int B, const StepContext& ctx, std::vector<const float*>& p,
                 std::vector<float*>& g);
  int64_t add_param(const std::string& name, int64_t rows, int64_t cols, bool decay,
                    ParamInit init, int block);
  void bind_linears();

  ModelConfig cfg_;
  ResolvedLinears resolved_;  // the recipe, resolved once per linear (resolve_linear_plans)
  // The constructors' body: `recipe` is resolved on the model's linears unless `plans` is given.
  Model(const ModelConfig& cfg, const Recipe* recipe, ResolvedLinears* plans, int batch,
        int seq_len);
  int batch_, seq_len_;
  std::string pattern_;
  std::vector<ParamInfo> infos_;
  std::vector<float> params_, grads_;
  std::vector<Block> blocks_;
  std::vector<Linear> linears_;                 // every block's, in block order
  std::vector<LinearSite> sites_;               // [linears_.size()]
  std::vector<int64_t> off_lin_;                // weight offset of linears_[i]
  std::shared_ptr<LinearWorkspace> workspace_;  // transient FP4 buffers of every linear
  int64_t off_wte_, off_lnf_, off_head_;
  std::vector<float> x0_, lnf_, lnf_rstd_, logits_, dres_, dln_, scratch_;
  std::vector<int32_t> tokens_, targets_;
  // The params / grads pointer arrays of the current MixerCall (call()), reserved in the
  // constructor for the largest mixer so that a step allocates nothing.
  std::vector<const float*> call_params_;
  std::vector<float*> call_grads_;
  int B_ = 0;
  int T_ = 0;  // sequence length of the last forward (seq_len_ unless forward got a T)
};

}  // namespace fp4::nn
