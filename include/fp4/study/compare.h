// A comparison of recipes (`fp4train compare`, `report`): its plan (DIR/compare.json), its
// run directories (DIR/<recipe>-s<seed>/), training them one after another with reuse and
// resume, evaluating each final checkpoint (fp4/study/evaluate.h), and the report
// (DIR/report.md, plots/, hypotheses.json; the statistics and Markdown of fp4/study/report.h).
// The CLI parses the options into a CompareRequest and calls run_comparison.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "fp4/study/report.h"

namespace fp4 {

/// The comparison's plan, stored as DIR/compare.json so `report` and reruns know it.
struct ComparePlan {
  std::string config_arg;              ///< --config as given
  std::string config_name, config_toml;
  std::vector<std::string> recipes;    ///< --recipes entries (names or .toml paths)
  std::vector<std::string> names;      ///< the recipes' names (unique): rows and run dirs
  std::vector<std::string> policies;
  std::vector<uint64_t> seeds;
  int steps = 0;
  int save_every = 50, keep_checkpoints = 1;
  int64_t tokens_per_run = 0;
  std::string model_line;
  std::vector<std::string> sets;       ///< --set arguments (KEY=VALUE), applied to every run
  std::string baseline;                ///< --baseline as given; empty: the default rule
  std::string hypotheses;              ///< --hypotheses study file as given; empty: none
  std::string task;                    ///< --task: comma-separated tasks (next-sentence, minimal-pairs); empty: none
  double effect = kPowerHalfWidth;     ///< --effect: the Power table's half-width, nats
  std::vector<int> checkpoint_steps;   ///< --checkpoint-steps: steps whose checkpoints are kept
};

/// The plan of the comparison in `dir` (its compare.json). Throws fp4::UserError when there
/// is none ("not a `fp4train compare` directory") or it is malformed (naming the file).
ComparePlan read_compare_plan(const std::filesystem::path& dir);

/// The directory of one run: DIR/<recipe name, dir_safe>-s<seed>.
std::filesystem::path compare_run_dir(const std::filesystem::path& out, const std::string& recipe_name,
                                      uint64_t seed);

/// Rebuild DIR/report.md (and, with `plots`, DIR/plots/*.png through tools/plot_runs.py) from
/// the finished runs of `plan`, with the gap columns and the difference plot against
/// `baseline_arg` (empty: the plan's) and the verdicts of `hypotheses_arg` (empty: the
/// plan's study file, if any; their JSON in DIR/hypotheses.json). Unfinished runs are listed
/// at the end. `print_table`: also print the main table's first columns (compare's ending).
/// Prints one line naming the report. Throws fp4::UserError when no run has finished, the
/// baseline is not compared, or the study file is missing or malformed (nothing written).
void write_comparison_report(const std::filesystem::path& out, const ComparePlan& plan, bool plots,
                             const std::string& baseline_arg = "",
                             const std::string& hypotheses_arg = "", bool print_table = false);

/// The paired noise of one finished comparison, as configs/studies/noise.toml records it
/// (docs/compare.md "Power before cost"): per recipe, the seeds paired with the baseline and
/// the sample std over them of (recipe − baseline) final-window loss, in nats.
struct MeasuredNoise {
  std::string config;  ///< the comparison's config label (compare.json config_name)
  std::string source;  ///< the comparison directory, as given to noise_table_toml
  int steps = 0;
  int64_t tokens_per_run = 0;
  std::string baseline;
  struct Paired {
    int seeds = 0;
    double std = 0;  ///< nats
  };
  std::vector<std::pair<std::string, Paired>> paired;  ///< in the comparison's recipe order
};

/// The noise table of the comparisons in `dirs` (each a `fp4train compare` directory, whose
/// finished runs are read as `report` reads them, against the comparison's baseline; or a
/// committed report.md whose runs were not committed, read from its "Per run" table against
/// the default baseline), as the TOML text of configs/studies/noise.toml: a header naming
/// `command` (how it was made) and one [[measured]] table per source. Recipes with fewer than 2 paired seeds are left out.
/// Throws fp4::UserError naming a directory that is not a comparison, has no finished run or
/// no baseline, or a report.md without a title, a --steps command or a per-run table.
std::string noise_table_toml(const std::vector<std::filesystem::path>& dirs,
                             const std::string& command);

/// Read a noise table written by noise_table_toml. Throws fp4::UserError naming the file and
/// the entry on a missing or malformed key (a std below 0, fewer than 2 seeds).
std::vector<MeasuredNoise> read_noise_table(const std::filesystem::path& file);

/// One `fp4train compare` (its options, defaults as the command's).
struct CompareRequest {
  std::string config = "configs/tiny.toml";
  std::string recipes = "fp32,bf16,ue5m3-b16,ue5m3-b32,ue5m3-te,nvfp4-te,nvfp4-all,mxfp4";
  int seeds = 1;
  uint64_t seed_base = 1;
  int steps = 0;
  std::string out;
  std::string policies = "none,current,replay-d50,calibrated";
  bool no_plots = false;
  int save_every = 50;
  int keep_checkpoints = 1;
  std::vector<std::string> sets;  // --set KEY=VALUE
  std::string baseline;           // --baseline NAME
  std::string hypotheses;         // --hypotheses FILE
  std::string task;               // --task next-sentence,minimal-pairs
  bool steps_given = false;
  /// --effect: the difference (nats, > 0) the comparison should resolve; the power estimate
  /// before training and the report's Power table use it.
  double effect = kPowerHalfWidth;
  /// Whether --effect was given: a rerun into a directory keeps the directory's effect
  /// unless it was.
  bool effect_given = false;
  /// --noise: the table of measured paired noise the power estimate reads.
  std::string noise = "configs/studies/noise.toml";
  /// --checkpoint-steps: steps whose checkpoints are also saved and never pruned (e.g. off the
  /// amax refresh grid for the fidelity panel); empty: only the resume checkpoint.
  std::vector<int> checkpoint_steps;
};

/// Run the comparison: check the config, every recipe and every existing run directory
/// against the plan before anything is trained (a mismatch throws fp4::UserError and changes
/// nothing), then train each recipe × seed in order (finished runs reused, diverged ones
/// kept as results, failed ones retried, interrupted ones resumed bit for bit from their
/// newest checkpoint), evaluate each final checkpoint under the plan's policies (and task),
/// and write the report. While a run trains, SIGINT / SIGTERM / SIGUSR1 stop it after the
/// current step with the command that continues it; the process then ends as killed by the
/// signal (during an evaluation a signal has its default action: the rerun recovers).
void run_comparison(const CompareRequest& req);

}  // namespace fp4
