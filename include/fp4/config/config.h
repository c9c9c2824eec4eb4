// Run configuration (model size, data, optimisation, evaluation), parsed from TOML; the
// names of the TOML files of a directory (toml_names: configs/, configs/recipes/).
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "fp4/config/settings.h"

namespace fp4 {

/// The model: a pattern of hybrid blocks (Nemotron-H, arXiv 2504.03624), each computing
/// x + mixer(RMSNorm(x)), then a final RMSNorm and an untied FP32 LM head.
struct ModelConfig {
  int vocab_size = 4096;
  int d_model = 256;
  /// Llama-style layers when `pattern` is empty: the pattern is then "*-" repeated n_layers
  /// times (attention block, MLP block). Ignored (and refused by the parser) with a pattern.
  int n_layers = 4;
  /// Nemotron-H's hybrid_override_pattern: one character per block, 'M' Mamba-2, '*'
  /// attention, '-' MLP. Empty: the Llama-style pattern of n_layers (block_pattern()).
  std::string pattern;
  int n_heads = 4;      ///< attention query heads
  int n_kv_heads = 0;   ///< attention key/value heads (GQA); 0 = n_heads
  int head_dim = 0;     ///< attention head dimension; 0 = d_model / n_heads
  bool rope = true;     ///< rotary embedding on q and k (Llama); Nemotron-H applies none
  std::string mlp = "squared_relu";  ///< "squared_relu" (Nemotron-H) or "swiglu"
  int mlp_hidden = 1024;             ///< F
  float rope_theta = 10000.f;
  float norm_eps = 1e-5f;
  float init_std = 0.02f;
  // Mamba-2 mixer (mamba_ssm Mamba2; HF NemotronHMamba2Mixer), used by 'M' blocks.
  int mamba_num_heads = 0;     ///< H; d_inner = H·mamba_head_dim
  int mamba_head_dim = 64;     ///< P
  int mamba_n_groups = 1;      ///< G (H % G == 0)
  int mamba_state_size = 64;   ///< N
  int mamba_conv_kernel = 4;   ///< causal depthwise conv1d width
  int mamba_chunk_size = 64;   ///< SSD chunk length Q (changes the FP32 summation order)
  float mamba_dt_min = 1e-3f;  ///< dt_bias init: dt log-uniform in [dt_min, dt_max] ...
  float mamba_dt_max = 0.1f;
  float mamba_dt_init_floor = 1e-4f;  ///< ... floored at this

  /// The block pattern (pattern, or "*-" × n_layers when it is empty).
  std::string block_pattern() const;
  int n_blocks() const { return static_cast<int>(block_pattern().size()); }
  int kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
  int attn_head_dim() const { return head_dim > 0 ? head_dim : d_model / n_heads; }
  int mamba_d_inner() const { return mamba_num_heads * mamba_head_dim; }

  /// Field-wise equality (floats by ==), for round-trip checks (tests/fuzz/).
  bool operator==(const ModelConfig&) const = default;
};

struct TrainConfig {
  int seq_len = 256;
  int batch_size = 16;  ///< sequences per optimizer step (the global batch, over all ranks)
  /// Sequences per forward (gradient accumulation): batch_size must be a multiple of it, and
  /// the step's batch_size / micro_batch_size micro-batches are spread evenly over the MPI
  /// ranks. 0 (the default) = batch_size: one forward per step.
  int micro_batch_size = 0;
  int micro() const { return micro_batch_size > 0 ? micro_batch_size : batch_size; }
  /// Micro-batches per optimizer step.
  int n_micro() const { return batch_size / micro(); }
  int steps = 300;
  double lr = 3e-3;             ///< peak learning rate
  int warmup_steps = 30;
  double decay_fraction = 0.15;  ///< final fraction of steps with linear decay
  double min_lr_ratio = 0.01;    ///< LR at the last step / peak
  double weight_decay = 0.1;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double grad_clip = 1.0;
  /// The window of the final-window loss (summary.json final_window_loss, the comparison
  /// report's headline figure): train.final_window, either a fraction of train.steps in
  /// (0, 1) (a TOML float: the last floor(fraction·steps) steps, at least 1) or a whole
  /// number of steps >= 1 (a TOML integer, at most train.steps). The default 0.1 is the last
  /// 10% of the steps, max(1, steps / 10), the window of every run made before the key
  /// existed. The paper (arXiv 2609.02846) averages the ten losses it logged, one every 25
  /// steps, in the last 250 of its 30,000 steps; `final_window = 250` is that window, with
  /// every step's loss in the mean (fp4train has the loss of every step).
  double final_window = 0.1;
  /// The number of steps of the final window for this config: final_window as a step count
  /// when >= 1 (capped at steps), else max(1, floor(final_window·steps)), the product rounded
  /// down to the step within 1e-6 (so 0.3 of 10 steps is 3, whatever the binary rounding of
  /// 0.3). With the default 0.1 it is max(1, steps / 10) for every steps. Throws nothing.
  int final_window_steps() const;
  uint64_t seed = 1;
  /// Seed of the stochastic-rounding stream (the Philox key of every SR draw, docs/numerics.md
  /// "Stochastic-rounding bits (Philox keys)");
  /// -1, the default, means `seed`. Changing only this isolates SR noise from the
  /// initialisation and batch order (docs/results.md "The noise floor").
  int64_t sr_seed = -1;
  uint64_t sr_key_seed() const { return sr_seed >= 0 ? uint64_t(sr_seed) : seed; }

  /// Field-wise equality (floats by ==), for round-trip checks (tests/fuzz/).
  bool operator==(const TrainConfig&) const = default;
};

struct DataConfig {
  std::string path = "data/brown/text";  ///< text file or directory (relative to the repo)
  std::string cache = "data/cache";      ///< tokenizer and token-shard cache root
  /// auto | text | jsonl | llmc | uint16 | uint32 (fp4/data/data.h DataSpec, docs/data.md)
  std::string format = "auto";
  std::string text_field = "text";       ///< jsonl: the record's string field with the text
  bool skip_bad_records = false;         ///< jsonl: skip (and count) bad records instead of failing
  std::string heldout;                   ///< pre-tokenized: held-out file or directory
  double heldout_fraction = 0;           ///< pre-tokenized: held-out tail fraction, in (0, 1)
  std::string tokenizer;                 ///< pre-tokenized: SentencePiece model (optional)

  /// Field-wise equality (floats by ==), for round-trip checks (tests/fuzz/).
  bool operator==(const DataConfig&) const = default;
};

struct EvalConfig {
  int interval = 100;   ///< evaluate held-out NLL every N steps (and at the end)
  int windows = 64;     ///< held-out windows of seq_len tokens per evaluation

  /// Field-wise equality (floats by ==), for round-trip checks (tests/fuzz/).
  bool operator==(const EvalConfig&) const = default;
};

struct RunConfig {
  ModelConfig model;
  TrainConfig train;
  DataConfig data;
  EvalConfig eval;
  double progress_seconds = 2.0;  ///< [log] progress_seconds
  int telemetry_interval = 50;    ///< [log] numerics telemetry every N steps (and step 1); 0 = off

  /// Field-wise equality (floats by ==), for round-trip checks (tests/fuzz/).
  bool operator==(const RunConfig&) const = default;
};

/// What the parser needs to know of the block kinds, from the mixer registry of the nn room
/// (nn::block_kind_rules() in fp4/nn/run_config.h, which also declares load_run_config, the
/// entry point most callers want). The parser itself knows no kind.
struct BlockKindRules {
  std::string symbols;  ///< the pattern characters: "M*-"
  std::string listing;  ///< for the pattern error: "'M' (Mamba-2), '*' (attention) and '-' (MLP)"
  /// The kinds' cross-key checks of the model section (nn::check_block_kinds): calls
  /// fail(message) for the first violation. Null: none.
  std::function<void(const ModelConfig&, const std::function<void(const std::string&)>& fail)> check;
};

/// Rules that take every printable ASCII character (other than space, quotes and backslash)
/// for a block kind and check nothing of the kinds: for readers that only need the text to
/// be a well-formed config and validate it with the registry later (the checkpoint reader,
/// which the model-free fuzz build links).
BlockKindRules any_block_kinds();

/// Parse and validate a run config under `kinds`. Unknown sections/keys, wrong types and
/// out-of-range values throw fp4::UserError naming the file, key and allowed range. `sets`
/// (the config part of parse_settings) override keys of the file first and are validated as
/// the file's values are; their errors name the --set argument, cross-key errors the file
/// "with --set ...". Most callers want fp4::load_run_config (fp4/nn/run_config.h).
RunConfig parse_run_config_file(const std::filesystem::path& file, const std::vector<Setting>& sets,
                                const BlockKindRules& kinds);
/// Check cross-field constraints (batch and micro-batch, final window, warm-up, and the
/// kinds' checks: d_model % n_heads, even head dim, ...); throws UserError prefixed `where`.
void validate_run_config(const RunConfig& c, const std::string& where, const BlockKindRules& kinds);
/// Parse run-config TOML text (e.g. the resolved config stored in a checkpoint); `where`
/// names the source in error messages. Throws fp4::UserError like parse_run_config_file.
RunConfig parse_run_config_text(const std::string& toml, const std::string& where,
                                const BlockKindRules& kinds);
/// The resolved config as TOML text.
std::string run_config_to_toml(const RunConfig& c);

/// The names of the *.toml files of `dir` without the extension, sorted: the recipes of
/// configs/recipes/, the run configs of configs/. Empty if `dir` is not a readable directory.
std::vector<std::string> toml_names(const std::filesystem::path& dir);

}  // namespace fp4
