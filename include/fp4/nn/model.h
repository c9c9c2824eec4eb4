// Llama-style decoder: token embedding; L blocks of pre-RMSNorm causal multi-head attention
// with RoPE (q, k, v, o projections, no biases) and an MLP (squared ReLU or SwiGLU); final
// RMSNorm; untied FP32 LM head. Every linear except the LM head is an fp4::nn::Linear.
// Parameters and their gradients each live in one contiguous FP32 buffer (llm.c style).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fp4/config.h"
#include "fp4/nn/linear.h"
#include "fp4/recipe.h"

namespace fp4::nn {

/// One named parameter tensor: a slice [offset, offset + size) of the parameter buffer.
struct ParamInfo {
  std::string name;
  int64_t offset = 0, size = 0;
  int64_t rows = 0, cols = 0;
  bool weight_decay = true;  ///< false for norm weights
};

class Model {
 public:
  /// Builds the model for `batch` sequences of `seq_len` tokens (activation buffers are sized
  /// for that). Throws fp4::UserError on inconsistent config.
  Model(const ModelConfig& cfg, const Recipe& recipe, int batch, int seq_len);

  /// Initialise parameters: N(0, init_std) for matrices, output projections (o, down) scaled
  /// by 1/sqrt(2L), norm weights 1. Deterministic in `seed`.
  void init(uint64_t seed);

  /// Forward pass over tokens [B, T] (B ≤ batch; T = seq_len, or 1 ≤ T ≤ seq_len when given,
  /// e.g. a sampling context shorter than seq_len). If targets is non-null returns the mean
  /// cross-entropy (nats/token), else 0. Logits [B·T, vocab] stay in logits().
  /// Throws std::invalid_argument on a bad B or T.
  double forward(const int32_t* tokens, const int32_t* targets, int B, const StepContext& ctx,
                 int T = 0);

  /// Backward of the last forward (which must have had targets); ACCUMULATES into grads().
  void backward(const StepContext& ctx);

  void zero_grad();

  /// Linear::reset_inference on every linear: forget the inference references (frozen weight
  /// amax, Replay holds of interval `replay_interval`, calibration). See fp4/eval.h.
  void reset_inference(int replay_interval = 50);

  std::vector<float>& params() { return params_; }
  std::vector<float>& grads() { return grads_; }
  const std::vector<ParamInfo>& param_infos() const { return infos_; }
  const std::vector<Linear>& linears() const { return linears_; }
  std::vector<Linear>& linears() { return linears_; }  ///< (checkpoint resume)
  /// Name of linears()[i], e.g. "blocks.2.mlp.down".
  std::string linear_name(size_t i) const;
  /// Logits [B·T, vocab] of the last forward; backward() overwrites them with their gradient.
  const float* logits() const { return logits_.data(); }
  int64_t num_params() const { return static_cast<int64_t>(params_.size()); }
  /// Parameters excluding the token embedding and the LM head.
  int64_t num_body_params() const;
  /// Model FLOPs of one training step per token (forward + backward) at sequence length T,
  /// the standard count of PaLM (Chowdhery et al. 2022, appendix B): 6·N + 12·L·d·T, where N
  /// = num_params() − vocab·d, every parameter except the input embedding table (a lookup,
  /// no FLOPs); the LM head is an untied vocab × d matmul and counts. 6N covers the
  /// forward (2N) and backward (4N) matmuls; 12·L·d·T the attention score and value
  /// products (QKᵀ and PV, 2·T·d FLOPs each per token forward, ×3 with backward), counted
  /// over the full T × T square as in PaLM although the causal kernel skips the masked
  /// half. Norms, activations, softmax and the optimizer are not counted (as in PaLM).
  double flops_per_token(int64_t T) const;

  /// Bytes of the model's buffers, by what they hold (FP32 throughout).
  struct MemoryUse {
    int64_t params = 0;            ///< master weights, num_params() floats
    int64_t grads = 0;             ///< their gradients
    int64_t activations = 0;       ///< what backward needs from forward: per block ln1, q,
                                   ///< k, v, y, x2, ln2, h, a, x3, rstd ([BT·(8C+U+F+2)]),
                                   ///< attention probabilities [B·H·T·T]; embedding out, ln_f
    int64_t logits = 0;            ///< logits [BT·V]; backward overwrites them with their gradient
    int64_t backward_scratch = 0;  ///< gradient buffers reused across blocks (dq, dk, dv,
                                   ///< dln, datt, dh, dact, dres, attention scratch [B·H·T·T])
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
  struct BlockActs;
  BlockActs block(int l, int64_t BT);
  int64_t add_param(const std::string& name, int64_t rows, int64_t cols, bool decay);
  void bind_linears();

  ModelConfig cfg_;
  Recipe recipe_;
  int batch_, seq_len_;
  std::vector<ParamInfo> infos_;
  std::vector<float> params_, grads_;
  std::vector<Linear> linears_;  // 6 per block: q, k, v, o, up, down
  std::shared_ptr<LinearWorkspace> workspace_;  // transient FP4 buffers of every linear
  // parameter offsets
  int64_t off_wte_, off_lnf_, off_head_;
  std::vector<int64_t> off_ln1_, off_ln2_, off_lin_;  // off_lin_[6·l + j]
  // activations
  std::vector<std::vector<float>> acts_;  // per block, see model.cpp for layout
  std::vector<float> x0_, lnf_, lnf_rstd_, xL_, logits_, dln_, dq_, dk_, dv_, datt_,
      dh_, dact_, scratch_;
  std::vector<int32_t> tokens_, targets_;
  int B_ = 0;
  int T_ = 0;  // sequence length of the last forward (seq_len_ unless forward got a T)
};

}  // namespace fp4::nn
