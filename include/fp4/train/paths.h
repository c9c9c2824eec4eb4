// Locating the repository's configs and data (the CLI and the study room): relative to the working
// directory first, then to the source tree the binary was built from.
#pragma once
#include <filesystem>
#include <string>

#include "fp4/nn/run_config.h"
#include "fp4/recipe/recipe.h"
#include "fp4/data/data.h"

#include <functional>

namespace fp4 {
/// `rel` if it exists relative to the working directory, else FP4_SOURCE_DIR/rel if that
/// exists, else `rel` unchanged (so the error names what the user typed).
std::filesystem::path resolve(const std::string& rel);

/// The recipe a --recipe argument names: a shipped name (configs/recipes/NAME.toml, found
/// through resolve) or a .toml path, which is also looked up through resolve, as --config is.
/// Throws what load_recipe throws (an unknown name lists the shipped ones).
Recipe load_recipe_arg(const std::string& name_or_path, const std::vector<Setting>& sets = {});
/// data.path of a run config: as given if absolute or existing relative to the working
/// directory, else relative to the config file's directory if it exists there, else
/// resolve(data_path) (the source tree, for the default corpus). Existence is the caller's check.
std::filesystem::path resolve_data_path(const std::string& data_path,
                                        const std::filesystem::path& config_file);

/// The corpus of a run: `data_arg` (--data) as given if not empty, else data.path of the
/// config (resolve_data_path). Throws fp4::UserError if it does not exist, saying where the
/// path came from (the default corpus: run scripts/setup; or data.path in `config_arg`).
std::filesystem::path run_data_path(const RunConfig& cfg, const std::filesystem::path& config_file,
                                    const std::string& config_arg, const std::string& data_arg);

/// The data source of a run: `data_path` for the corpus, and the [data] keys of `cfg`
/// (format, text_field, skip_bad_records, heldout_fraction), with data.heldout and
/// data.tokenizer resolved like data.path (resolve_data_path; missing files are
/// prepare_tokens's error, which names them).
DataSpec data_spec(const RunConfig& cfg, const std::filesystem::path& data_path,
                   const std::filesystem::path& config_file);
/// data_spec of run_data_path.
DataSpec run_data_spec(const RunConfig& cfg, const std::filesystem::path& config_file,
                       const std::string& config_arg, const std::string& data_arg);

/// The token cache root of a run: data.cache resolved like the repository's paths when the
/// corpus is the config's, as given with --data.
std::filesystem::path run_cache_dir(const RunConfig& cfg, const std::string& data_arg);
/// prepare_tokens on every MPI rank: rank 0 first (it may train the tokenizer and write the
/// cache), then, after a barrier, the other ranks, which read rank 0's cache. One process:
/// prepare_tokens. `log` is called on rank 0 only.
TokenData prepare_tokens_all_ranks(const DataSpec& data, int vocab_size,
                                   const std::filesystem::path& cache_root,
                                   const std::function<void(const std::string&)>& log = {});

/// --steps N on a run config: sets train.steps (N > 0) and, when train.warmup_steps is no
/// longer below it, warms up for steps / 10 instead, printing a note saying so; likewise,
/// when train.final_window is a step count above the new steps, the final window becomes the
/// default last 10% (with a note).
void override_steps(RunConfig& cfg, int steps);

}  // namespace fp4
