// Evaluation of a checkpoint (or of a freshly initialised model): held-out NLL under the
// inference policies, the downstream task, and the FP32 gradient file, as `fp4train eval`
// runs them and `compare` runs them on every run's final checkpoint. The loading of a
// checkpoint (its config, recipe, parameters, corpus) is here once for eval, sample and
// compare. The scoring itself is the eval room's (fp4/eval/eval.h, fp4/eval/tasks.h).
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "fp4/data/data.h"
#include "fp4/nn/run_config.h"
#include "fp4/nn/model.h"
#include "fp4/recipe/recipe.h"

namespace fp4 {

/// Where the model comes from: a checkpoint, or a run config (--config) and --init-seed.
struct EvalSourceSpec {
  std::string checkpoint;
  std::string config;       // with init_seed: a run config instead of a checkpoint
  int64_t init_seed = -1;
  std::string recipe;       // empty: the checkpoint's (or, with --config, ue5m3-b16)
  std::string data;         // override of data.path
  std::vector<std::string> sets;  // --set KEY=VALUE: recipe keys; config keys with --config
};

struct EvalSource {
  RunConfig cfg;
  Recipe recipe;
  // The recipe's plans on cfg.model, resolved once by load_eval_source (build_eval_model
  // builds from them); empty in a source made by hand, which build_eval_model resolves.
  ResolvedLinears plans;
  std::string recipe_source;   // "checkpoint" or the --recipe argument
  std::vector<float> params;   // empty: initialise with init_seed
  uint64_t init_seed = 0;
  std::string checkpoint;      // resolved file, or "" for an initialised model
  int64_t step = 0;
  std::filesystem::path run_dir;     // holds tokenizer.model (may be empty)
  std::filesystem::path config_dir;  // for relative data paths
  std::string data_key;        // the checkpoint's token-cache key (corpus + tokenizer), or ""
};

/// Load what `spec` names: a checkpoint (a .safetensors file or a run directory, its newest
/// good checkpoint; a note on stderr when an older one had to be used) with its config and
/// its recipe or spec.recipe, or spec.config initialised with spec.init_seed (recipe
/// ue5m3-b16 unless given). --set recipe keys apply to the recipe; config keys only with
/// spec.config. Throws fp4::UserError naming what is missing, contradictory or does not fit
/// (a recipe's high_precision.blocks outside the model).
EvalSource load_eval_source(const EvalSourceSpec& spec);
/// The model of `s` for `batch` sequences of its seq_len, parameters loaded (or initialised).
/// Throws fp4::UserError when the checkpoint's parameter count is not the config's.
std::unique_ptr<nn::Model> build_eval_model(const EvalSource& s, int batch);
/// The corpus of `s` tokenized (spec.data, else its config's data.path beside the run
/// directory or in the source tree), refusing data whose token-cache key is not the
/// checkpoint's (another corpus or tokenizer). Throws fp4::UserError.
/// `quiet`: no progress lines (cache use, tokenizing) on stderr.
TokenData load_eval_data(const EvalSource& s, const EvalSourceSpec& spec, bool quiet = false);
/// "checkpoint FILE (step N), recipe R (the checkpoint's)" or "model initialised with seed S, ...".
std::string describe_eval_source(const EvalSource& s);

/// One `fp4train eval`: the source, the policies (empty: none, current, replay-d50,
/// calibrated) and what to write.
struct EvalRequest {
  EvalSourceSpec src;
  std::vector<std::string> policies;
  int windows = 0;
  int calib_batches = 4;
  std::string json_file;
  std::string grad_out;   // --grad-out: gradient file (safetensors, HF names)
  int grad_windows = 0;   // --grad-windows: its windows (0: every evaluated window)
  std::string windows_out;  // --windows-out: the held-out windows' token ids as JSON
  std::string task;       // --task next-sentence | minimal-pairs: task accuracy instead of NLL
  std::string items_out;  // --items-out: the task's items as JSON Lines
};

/// Run `req`: held-out NLL per policy (or, with req.task, the downstream task), printed as a
/// table on stdout and, with req.json_file, written as JSON; with req.grad_out also the FP32
/// gradient file. Throws fp4::UserError for bad arguments (before any work where it can)
/// and what the loading and evaluation throw.
void evaluate_checkpoint(const EvalRequest& req);

/// `fp4train eval --checkpoint CHECKPOINT --policy POLICIES --json JSON_FILE [--data DATA]`
/// as a call (prints the table too; DATA empty: the run's data.path); throws what
/// evaluate_checkpoint throws.
void eval_checkpoint_to_json(const std::string& checkpoint, const std::string& policies,
                             const std::string& json_file, const std::string& data = "");

/// The downstream tasks `--task` knows: next-sentence (fp4/eval/tasks.h) and minimal-pairs
/// (fp4/eval/minimal_pairs.h).
const std::vector<std::string>& known_tasks();
/// Throws fp4::UserError "WHAT TASK: unknown task (known: ...)" unless `task` is known.
void check_task_name(const std::string& task, const std::string& what);
/// A --task argument as a list: split at commas, blanks trimmed, empty entries and repeats
/// dropped (first-seen order); join_task_list is the inverse ("a,b").
std::vector<std::string> split_task_list(const std::string& tasks);
std::string join_task_list(const std::vector<std::string>& tasks);
/// The file a run directory holds a task's results in: task.json for next-sentence (its
/// name since it was the only task), task-TASK.json for the others.
std::string task_file_name(const std::string& task);

/// `fp4train eval --checkpoint CHECKPOINT --task TASK --policy POLICIES --json JSON_FILE
/// [--data DATA]` as a call: the downstream task's accuracy under each policy (TASK:
/// next-sentence, minimal-pairs); prints the table too; throws what evaluate_checkpoint throws.
void task_checkpoint_to_json(const std::string& checkpoint, const std::string& task,
                             const std::string& policies, const std::string& json_file,
                             const std::string& data = "");

}  // namespace fp4
