// One resolved run: what a command was given (config, recipe, `--set` overrides, data options,
// seed, steps) turned into one object, once, for every command that defines a run: train,
// profile, info, data, compare, eval and the Python module (docs/cli.md "Command-line
// overrides", docs/design.md "The house: rooms, and the direction of includes").
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fp4/config/settings.h"
#include "fp4/data/data.h"
#include "fp4/nn/run_config.h"
#include "fp4/recipe/recipe.h"

namespace fp4 {

/// parse_settings(args), refusing a config key that a dedicated option (`--steps` for
/// train.steps, ...) also sets: `taken` lists pairs {key, option} of the options given.
/// Throws fp4::UserError naming both.
Settings parse_set_args(const std::vector<std::string>& args,
                        const std::vector<std::pair<std::string, std::string>>& taken);

/// The arguments of a command that define a run, as given on its command line.
struct RunRequest {
  std::string config;  ///< --config, as typed ("configs/tiny.toml"); found by resolve()
  /// --recipe: a shipped name or a .toml path (load_recipe_arg). Empty: no recipe is resolved
  /// (fp4train data takes none; compare resolves each of its own with resolve_recipe).
  std::string recipe;
  std::vector<std::string> sets;  ///< --set KEY=VALUE arguments, as given
  /// {config key, option} of the dedicated options the command was given that set a config
  /// key (--steps: train.steps, --seed: train.seed, --data: data.path); a `--set` of the same
  /// key is refused (parse_set_args).
  std::vector<std::pair<std::string, std::string>> taken;
  std::string data;              ///< --data: the corpus instead of data.path; empty = data.path
  int steps = 0;                 ///< --steps: train.steps (override_steps); 0 = the config's
  std::optional<uint64_t> seed;  ///< --seed: train.seed
  /// Resolve the data source (RunRequest::data or data.path; it must exist). False for
  /// commands that read no data (info) or find it their own way (eval --config, whose
  /// load_eval_data looks beside the config too).
  bool with_data = true;
};

/// A run as every command sees it: resolved once by resolve_run.
struct ResolvedRun {
  std::filesystem::path config_file;  ///< resolve(request.config)
  Settings sets;                      ///< the parsed `--set` arguments
  /// The config with its `--set` overrides, --seed, --data and --steps applied, validated.
  RunConfig config;
  /// The recipe with its `--set` overrides; a default Recipe when none was resolved.
  Recipe recipe;
  /// One LinearPlan per linear of config.model (nn::Model::linear_sites order), checked
  /// against the config (check_recipe_fits); empty when no recipe was resolved.
  ResolvedLinears plans;
  bool has_recipe = false;  ///< whether recipe and plans were resolved
  /// The data source (run_data_spec); its path is empty when request.with_data is false.
  DataSpec data;
  /// The token cache root (run_cache_dir: data.cache found like the repository's paths when
  /// the corpus is the config's, as given with --data).
  std::filesystem::path cache_dir;
  /// The run's label: the config file's stem with its result-changing `--set` overrides,
  /// "tiny+train.lr=0.001" (labelled_name); names run directories and summaries.
  std::string label;
  /// The config as error messages name it: "configs/tiny.toml with --set train.lr=0.001"
  /// (with_settings of the config argument as typed).
  std::string config_where;
};

/// Resolve what a command was given into one run, in this order (each step throws
/// fp4::UserError naming the argument, file and key at fault): the `--set` arguments
/// (parse_set_args against request.taken); the config file through resolve(), with the
/// config overrides (load_run_config); --seed, --data (as data.path) and --steps
/// (override_steps, which prints a note when it moves the warm-up or the final window);
/// validation of the config; the recipe and its plans (resolve_recipe; none when
/// request.recipe is empty); the data source when request.with_data (run_data_spec: the path
/// must exist). With FP4_RESOLVED_RUN_LOG set to a file name, appends one JSON line
/// {"label", "recipe", "plans"} to it: how a test sees that every entry point resolves the
/// same run (tests/cli/resolved_run.sh).
ResolvedRun resolve_run(const RunRequest& request);

/// `run` with the recipe `recipe_arg` (a shipped name or a .toml path, load_recipe_arg) and
/// the run's recipe overrides (run.sets.recipe), its per-linear plans checked on run.config
/// (check_recipe_fits: the recipe fits the model, and its RHT token rule). What resolve_run
/// does for request.recipe; compare calls it once per recipe of one config. Logs like
/// resolve_run. Throws fp4::UserError naming the recipe file and key.
ResolvedRun resolve_recipe(const ResolvedRun& run, const std::string& recipe_arg);

}  // namespace fp4
