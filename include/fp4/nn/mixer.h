// The mixers of the hybrid model (Nemotron-H, arXiv 2504.03624): one interface per kind of
// block. A block computes x + mixer(RMSNorm(x)); the Model owns the norm, the residual
// stream, the parameter buffer and the Linears, and asks each block's mixer for its
// parameters, its linears, the activation memory it keeps and its forward and backward.
//
// Everything fp4train knows about a kind of block is in its MixerKind entry (below): the
// pattern character, its names, its config checks, its linears, its factory, its Hugging
// Face names; its FLOPs are the Mixer's own. Config validation (nn/run_config.h), the model,
// `info`, `profile`, `export` and the recipe rules all read the registry, mixer_kinds(). A new
// kind is one file (the Mixer class and its MixerKind), its entry function's declaration in
// src/nn/mixers.h and one line in mixer.cpp's list of built-in kinds;
// tests/nn/test_mixer_registry.cpp registers a toy kind at run time. Outside the entry: a
// kind's own config keys (ModelConfig and its parser), a new linear-kind name (the recipe
// vocabulary, linear_kinds()), and the two fixed layouts of the export (hf_layout.cpp: the
// Llama layout is '*' '-' pairs, Nemotron-H's config.json has the Mamba-2 keys).
//
// Built-in kinds (pattern characters), in registry order:
//   'M' Mamba-2: in_proj, causal conv1d, SSD scan, gated RMSNorm, out_proj (mixer_mamba2.cpp)
//   '*' attention: grouped-query causal attention, q/k/v/o_proj, optional RoPE (mixer_attention.cpp)
//   '-' MLP: up_proj, squared ReLU (or SwiGLU), down_proj (mixer_mlp.cpp)
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "fp4/config/config.h"
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
  /// Pattern character: its MixerKind's symbol ('M', '*', '-' for the built-in kinds).
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
  /// The same FLOPs counted over the work the kernels do (attention: the causal triangle,
  /// (T + 1)/2 query-key pairs per token instead of T), for `fp4train profile`'s second MFU.
  /// Defaults to extra_flops_per_token(T).
  virtual double causal_flops_per_token(int64_t T) const { return extra_flops_per_token(T); }
};

/// One tensor of the Hugging Face layout made from one mixer parameter (docs/export.md).
struct HfPiece {
  std::string name;             ///< after the block's module prefix: "q_proj.weight", "A_log"
  std::vector<int64_t> shape;   ///< HF shape
  std::vector<float> data;      ///< row-major, reordered where the layouts differ
};

/// Reports a config error of a kind's check: the message names the key ("model.n_heads
/// (6) must be ..."); the caller prefixes the source and throws fp4::UserError.
using ConfigFail = std::function<void(const std::string& message)>;

/// Everything fp4train knows about one kind of hybrid block (the registry's entry).
struct MixerKind {
  char symbol = 0;    ///< pattern character ('M', '*', '-'); printable ASCII, not a space or quote
  std::string name;   ///< for people: "Mamba-2", "attention", "MLP" (info, errors)
  std::string key;    ///< for files: "mamba2", "attention", "mlp" (info --json "<key>_blocks")
  /// Its linears' kinds in execution order, each a recipe linear kind (linear_kinds()).
  std::vector<std::string> linears;
  /// Cross-key checks of the model section for configs whose pattern has this kind; calls
  /// fail(message) for the first violation. Null: nothing to check.
  void (*check)(const ModelConfig& cfg, const ConfigFail& fail) = nullptr;
  /// The mixer of one block (config already checked).
  std::unique_ptr<Mixer> (*make)(const ModelConfig& cfg) = nullptr;
  /// Hugging Face names: the submodule of a Llama layer ("self_attn.", "mlp."; empty: the
  /// kind has no Llama layout) and the name of the block's norm there.
  std::string hf_llama_module, hf_llama_norm;
  /// The HF tensors of the mixer parameter `param` (mixer-relative: "q_proj", "A_log"),
  /// `v` its rows × cols floats; empty for a name the kind does not have. Null: the kind
  /// cannot be exported.
  std::vector<HfPiece> (*hf)(const std::string& param, const float* v, int64_t rows,
                             int64_t cols, const ModelConfig& cfg) = nullptr;
};

/// The registered kinds: the built-in ones ('M' Mamba-2, '*' attention, '-' MLP, in that
/// order), then any register_mixer_kind added, in the order added. Not thread-safe against a
/// concurrent register_mixer_kind.
const std::vector<MixerKind>& mixer_kinds();
/// The kind of pattern character `symbol`, or nullptr.
const MixerKind* find_mixer_kind(char symbol);
/// The kind of `symbol`; throws fp4::UserError naming the character and the registered kinds.
const MixerKind& mixer_kind(char symbol);
/// "'M' (Mamba-2), '*' (attention) and '-' (MLP)": the registered kinds for messages.
std::string mixer_kinds_listing();
/// Add a kind (tests, extensions), before any model or config uses it. Throws
/// std::invalid_argument for a symbol, name or key already taken (info --json names a kind
/// by its key), a symbol not printable, a null make, an empty name or key, or a linear kind
/// that linear_kinds() does not name (the recipe rules would not match it).
void register_mixer_kind(MixerKind kind);
/// Remove a kind register_mixer_kind added (tests); built-in kinds cannot be removed
/// (std::invalid_argument).
void unregister_mixer_kind(char symbol);
/// Run the checks of every kind in `cfg`'s pattern (registry order), and refuse characters
/// that no kind has; fail(message) as MixerKind::check. The pattern's length is the parser's.
void check_block_kinds(const ModelConfig& cfg, const ConfigFail& fail);

/// The mixer of pattern character `symbol` for `cfg` (mixer_kind(symbol).make). Throws
/// fp4::UserError for a character no registered kind has.
std::unique_ptr<Mixer> make_mixer(char symbol, const ModelConfig& cfg);

/// Parameter and linear counts of one block kind without building a model (for
/// `fp4train info`): parameters including the block's norm weight, and its linears.
int64_t block_param_count(char symbol, const ModelConfig& cfg);

}  // namespace fp4::nn
