// Training checkpoints: everything a run needs to continue bit for bit, in one safetensors
// file (docs/design.md "Conventions"), written atomically.
//
// Layout of a run directory:
//   <run>/checkpoints/step_<8-digit step>.safetensors   one per save, newest kept (keep_last)
//   <run>/tokenizer.model                                copy of the SentencePiece model
#pragma once
#include <cstdint>
#include <limits>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "fp4/nn/run_config.h"
#include "fp4/recipe/recipe.h"

namespace fp4 {

/// One held tensor reference (docs/numerics.md "Tensor reference g") of one Linear and role.
struct HeldReference {
  std::string linear;  ///< Model::linear_name, e.g. "layers.5.mixer.down_proj"
  int role = 0;        ///< fp4::nn::Role as int (X=0, W=1, DY=2, XT_RHT=3, DYT_RHT=4, DY_HAD=5, W_HAD=6)
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

  // Trainer state beyond the tensors above, so a resumed run can finish its summary.
  std::vector<double> losses;   ///< training loss of steps 1..step (F64 tensor "losses";
                                ///< empty, or exactly `step` long)
  double train_seconds = 0;     ///< accumulated seconds of training steps (throughput)
  double wall_seconds = 0;      ///< accumulated wall-clock seconds of the run
  double val_nll = std::numeric_limits<double>::quiet_NaN();       ///< latest held-out NLL
  double val_nll_quant = std::numeric_limits<double>::quiet_NaN(); ///< (NaN: none yet)
  std::string telemetry_digest; ///< latest numerics digest line (console only)
  std::string data_key;         ///< TokenData::cache_dir name: hash of corpus and tokenizer
  std::string config_name;      ///< TrainOptions::config_name (summary.json "config")
  int save_every = 0;           ///< the run's TrainOptions at save time (resume defaults)
  int keep_checkpoints = 3;
  int log_every = 1;
  bool save_amax = true;
};

/// Write `c` to `file` atomically (temporary file in the same directory, fsync, rename,
/// fsync of the directory). Tensors are named "params", "adam_m", "adam_v" (F32, 1-D) and
/// "losses" (F64, 1-D); the rest is in the safetensors "__metadata__" map (strings; the
/// references and trainer state as JSON text), with "format" = "fp4train.checkpoint.v1" and
/// "checksum", an FNV-1a 64 hash of the header without it and of the tensor bytes.
/// Throws fp4::UserError on I/O errors, std::invalid_argument if adam_m/adam_v/losses do
/// not match params/step in size.
void save_checkpoint(const std::filesystem::path& file, const Checkpoint& c);

/// Read and validate a checkpoint written by save_checkpoint. Throws fp4::UserError naming
/// the file and what is wrong (truncated, bad header, sizes that disagree, wrong dtype,
/// missing or malformed metadata, checksum mismatch).
Checkpoint load_checkpoint(const std::filesystem::path& file);

/// The bytes save_checkpoint writes for `c` (the same header and tensors, in memory). A
/// checkpoint loaded by load_checkpoint / checkpoint_from_bytes re-saves to the bytes it was
/// loaded from when those were written by save_checkpoint; any accepted file re-saves to a
/// file that loads to the same Checkpoint (tests/fuzz/fuzz_checkpoint.cpp checks both).
/// Throws std::invalid_argument like save_checkpoint.
std::string checkpoint_to_bytes(const Checkpoint& c);

/// load_checkpoint of a file already in memory (`bytes`; `name` names it in errors): the
/// same checks, the same errors (load_checkpoint reads the file and runs the same code).
Checkpoint checkpoint_from_bytes(std::string_view bytes, const std::string& name);

/// Checkpoint files `step_<digits>.safetensors` of a run directory (looked up in
/// `<dir>/checkpoints`, or in `dir` itself if it has no such subdirectory), sorted by step,
/// oldest first. Other names (temporary files, *.corrupt) are ignored; none: empty.
std::vector<std::filesystem::path> list_checkpoints(const std::filesystem::path& run_dir);

/// The file name of the checkpoint after `step` steps: "step_%08d.safetensors".
std::string checkpoint_file_name(int64_t step);

/// Delete all but the newest `keep` (>= 1) checkpoints of list_checkpoints(run_dir), leaving
/// those of the steps in `also_keep` (which do not count against `keep`). Throws
/// fp4::UserError if a file cannot be removed.
void prune_checkpoints(const std::filesystem::path& run_dir, int keep,
                       const std::vector<int64_t>& also_keep = {});

/// The newest checkpoint of a run directory that loads (like resolve_checkpoint, which
/// calls it), loaded once; its path goes to `file` and skipped newer files, each with the
/// reason, to `warn` (one line each). Throws fp4::UserError if none loads.
Checkpoint load_newest_checkpoint(const std::filesystem::path& run_dir,
                                  std::filesystem::path* file = nullptr,
                                  std::string* warn = nullptr);

/// A checkpoint argument: a .safetensors file, or a run directory whose newest checkpoint
/// that loads is returned (older ones are tried when the newest is corrupt; the skipped
/// file is reported through `warn`). Throws fp4::UserError if none is usable.
std::filesystem::path resolve_checkpoint(const std::filesystem::path& file_or_run_dir,
                                         std::string* warn = nullptr);

}  // namespace fp4
