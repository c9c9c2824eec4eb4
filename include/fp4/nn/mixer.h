// The mixers of the hybrid model (Nemotron-H, arXiv 2504.03624): one interface per kind of
// block. A block computes x + mixer(RMSNorm(x)); the Model owns the norm, the residual
// stream, the parameter buffer and the Linears, and asks each block's mixer for its
// parameters, its linears, the activation memory it keeps and its forward and backward.
// A new kind of mixer is a new class (and file) plus one line in make_mixer.
//
// Kinds (pattern characters):
//   '*' attention: grouped-query causal attention, q/k/v/o_proj, optional RoPE (mixer_attention.cpp)
//   '-' MLP: up_proj, squared ReLU (or SwiGLU), down_proj (mixer_mlp.cpp)
//   'M' Mamba-2: in_proj, causal conv1d, SSD scan, gated RMSNorm, out_proj (mixer_mamba2.cpp)
#pragma once
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "fp4/recipe/config.h"
#include "fp4/nn/linear.h"

namespace fp4::nn {

/// How a parameter tensor is initialised (Model::init draws every tensor from one
/// mt19937_64 stream, in parameter order).
enum class ParamInit {
  kNormal,     ///< N(0, init_std)
  kNormalOut,  ///< N(0, init_std / sqrt(n_blocks)): projections into the residual stream
  kOnes,       ///< 1 (norm weights, Mamba-2 D)
  kCustom,     ///< Mixer::init_param
};

/// One parameter tensor of a mixer, besides its linears' weights.
struct MixerParam {
  std::string name;   ///< relative to the mixer, e.g. "A_log" (full name layers.N.mixer.A_log)
  int64_t rows = 1, cols = 1;
  bool weight_decay = false;
  ParamInit init = ParamInit::kOnes;
};

/// One FP4-eligible linear of a mixer: Y [M, out] = X [M, in] · Wᵀ, weight [out, in].
struct MixerLinear {
  std::string kind;  ///< linear_kinds() name: "q_proj", "in_proj", ...
  int64_t in = 0, out = 0;
  bool output_projection = false;  ///< into the residual stream: initialised kNormalOut
};

/// The buffers of one forward or backward call of one block's mixer.
struct MixerCall {
  int B = 0, T = 0;                 ///< sequences and tokens per sequence (T ≤ seq_len)
  const float* const* params;       ///< the mixer's params() tensors, in order
  float* const* grads;              ///< their gradients (backward accumulates)
  Linear* linears;                  ///< the mixer's linears() in order (contiguous)
  float* acts;                      ///< activation_floats(batch, seq_len): this block's own
  float* scratch;                   ///< scratch_floats(batch, seq_len): shared by all blocks
  LinearWorkspace* workspace;       ///< shared-input scopes (attention's q, k, v)
  const StepContext* ctx;
};

class Mixer {
 public:
  virtual ~Mixer() = default;
  /// Pattern character: 'M', '*' or '-'.
  virtual char symbol() const = 0;
  /// Parameters besides the linears, in storage order (before the linears' weights).
  virtual std::vector<MixerParam> params() const { return {}; }
  /// The FP4-eligible linears, in storage and execution order.
  virtual std::vector<MixerLinear> linears() const = 0;
  /// Initialise params()[i] (only those with ParamInit::kCustom), `w` its size floats.
  virtual void init_param(size_t i, float* w, std::mt19937_64& rng) const;
  /// Floats the mixer keeps from forward to backward for `batch` sequences of `seq_len`.
  virtual int64_t activation_floats(int64_t batch, int64_t seq_len) const = 0;
  /// Floats of backward scratch (reused by every block, so only the largest counts).
  virtual int64_t scratch_floats(int64_t batch, int64_t seq_len) const = 0;
  /// Forward: x [B·T, d_model] (the normed input; the Model keeps it until backward) →
  /// y [B·T, d_model], overwritten.
  virtual void forward(const MixerCall& c, const float* x, float* y) = 0;
  /// Backward of the last forward: dy [B·T, d_model] → dx [B·T, d_model], overwritten;
  /// parameter and weight gradients accumulated. May overwrite what it kept in c.acts.
  virtual void backward(const MixerCall& c, const float* x, const float* dy, float* dx) = 0;
  /// Model FLOPs per token of the mixer's non-linear products (forward + backward) at
  /// sequence length T, in the PaLM convention (Model::flops_per_token); 0 for none.
  virtual double extra_flops_per_token(int64_t T) const {
    (void)T;
    return 0.0;
  }
};

/// The mixer of pattern character `symbol` ('M', '*', '-') for `cfg`. Throws
/// fp4::UserError for any other character.
std::unique_ptr<Mixer> make_mixer(char symbol, const ModelConfig& cfg);

/// Parameter and linear counts of one block kind without building a model (for
/// `fp4train info`): parameters including the block's norm weight, and its linears.
int64_t block_param_count(char symbol, const ModelConfig& cfg);

}  // namespace fp4::nn
