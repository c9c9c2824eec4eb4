// Run configuration (model size, data, optimisation, evaluation), parsed from TOML.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "fp4/settings.h"

namespace fp4 {

struct ModelConfig {
  int vocab_size = 4096;
  int d_model = 256;
  int n_layers = 4;
  int n_heads = 4;
  std::string mlp = "squared_relu";  ///< "squared_relu" (Nemotron-H) or "swiglu"
  int mlp_hidden = 1024;             ///< F
  float rope_theta = 10000.f;
  float norm_eps = 1e-5f;
  float init_std = 0.02f;
};

struct TrainConfig {
  int seq_len = 256;
  int batch_size = 16;  ///< sequences per optimizer step
  int steps = 300;
  double lr = 3e-3;             ///< peak learning rate
  int warmup_steps = 30;
  double decay_fraction = 0.15;  ///< final fraction of steps with linear decay
  double min_lr_ratio = 0.01;    ///< LR at the last step / peak
  double weight_decay = 0.1;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double grad_clip = 1.0;
  uint64_t seed = 1;
};

struct DataConfig {
  std::string path = "data/brown/text";  ///< text file or directory (relative to the repo)
  std::string cache = "data/cache";      ///< tokenizer and token-shard cache root
};

struct EvalConfig {
  int interval = 100;   ///< evaluate held-out NLL every N steps (and at the end)
  int windows = 64;     ///< held-out windows of seq_len tokens per evaluation
};

struct RunConfig {
  ModelConfig model;
  TrainConfig train;
  DataConfig data;
  EvalConfig eval;
  double progress_seconds = 2.0;  ///< [log] progress_seconds
  int telemetry_interval = 50;    ///< [log] numerics telemetry every N steps (and step 1); 0 = off
};

/// Parse and validate a run config. Unknown sections/keys, wrong types and out-of-range
/// values throw fp4::UserError naming the file, key and allowed range. `sets` (the config
/// part of parse_settings) override keys of the file first and are validated as the file's
/// values are; their errors name the --set argument, cross-key errors the file "with --set ...".
RunConfig load_run_config(const std::filesystem::path& file, const std::vector<Setting>& sets = {});
/// Check cross-field constraints (d_model % n_heads, even head dim, ...); throws UserError.
void validate(const RunConfig& c, const std::string& where);
/// Parse run-config TOML text (e.g. the resolved config stored in a checkpoint); `where`
/// names the source in error messages. Throws fp4::UserError like load_run_config.
RunConfig run_config_from_text(const std::string& toml, const std::string& where);
/// The resolved config as TOML text.
std::string run_config_to_toml(const RunConfig& c);

}  // namespace fp4
