// Training checkpoints: everything a run needs to continue bit for bit, in one safetensors
// file (DESIGN.md "Checkpoints are safetensors files"), written atomically.
//
// Layout of a run directory:
//   <run>/checkpoints/step_<8-digit step>.safetensors   one per save, newest kept (keep_last)
//   <run>/tokenizer.model                                copy of the SentencePiece model
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "fp4/config.h"
#include "fp4/recipe.h"

namespace fp4 {

/// One held tensor reference (NUMERICS.md "Tensor reference g") of one Linear and role.
struct HeldReference {
  std::string linear;  ///< Model::linear_name, e.g. "blocks.2.mlp.down"
  int role = 0;        ///< fp4::nn::Role as int (X=0, W=1, DY=2, XT_RHT=3, DYT_RHT=4)
  bool has_value = false;
  int64_t last_refresh = 0;  ///< 1-based step of the last refresh
  float held = 0.f;          ///< the held amax g
};

/// Full training state after `step` completed optimizer steps.
struct Checkpoint {
  int64_t step = 0;             ///< completed optimizer steps (1-based step numbering)
  std::string config_toml;      ///< run_config_to_toml of the run
  std::string recipe_toml;      ///< recipe_to_toml of the run's recipe
  std::vector<float> params;    ///< FP32 master weights, Model::params() layout
  std::vector<float> adam_m;    ///< AdamW first moments, same layout
  std::vector<float> adam_v;    ///< AdamW second moments, same layout
  uint64_t sampler_draws = 0;   ///< BatchSampler::draws() after `step`
  std::vector<HeldReference> references;  ///< held amax caches (may be empty)
};

/// Write `c` to `file` atomically (temporary file in the same directory, fsync, rename,
/// fsync of the directory). Tensors are named "params", "adam_m", "adam_v" (F32, 1-D); the
/// rest is JSON in the safetensors "__metadata__" map. Throws fp4::UserError on I/O errors.
void save_checkpoint(const std::filesystem::path& file, const Checkpoint& c);

/// Read and validate a checkpoint written by save_checkpoint. Throws fp4::UserError naming
/// the file and what is wrong (truncated, bad header, sizes that disagree, wrong dtype).
Checkpoint load_checkpoint(const std::filesystem::path& file);

/// A checkpoint argument: a .safetensors file, or a run directory whose newest checkpoint
/// that loads is returned (older ones are tried when the newest is corrupt; the skipped
/// file is reported through `warn`). Throws fp4::UserError if none is usable.
std::filesystem::path resolve_checkpoint(const std::filesystem::path& file_or_run_dir,
                                         std::string* warn = nullptr);

/// Parse the resolved config / recipe TOML stored in a checkpoint (`where` names the
/// source in error messages). Throw fp4::UserError like load_run_config / load_recipe_file.
RunConfig run_config_from_text(const std::string& toml, const std::string& where);
Recipe recipe_from_text(const std::string& toml, const std::string& where);

}  // namespace fp4
