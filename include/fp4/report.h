// Recipe comparison report (issue 4 §4): reads finished run directories and condenses them
// into the paper's side-by-side table — final-window training loss, held-out NLL under each
// quantized-inference policy, stability (loss spikes, gradient-norm excursions) and
// throughput — as Markdown.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace fp4 {

/// One finished run, as read back from its directory.
struct RunRecord {
  std::filesystem::path dir;
  std::string recipe;
  uint64_t seed = 0;
  int steps = 0;                      ///< configured optimizer steps
  int warmup_steps = 0;               ///< train.warmup_steps of the run's config.toml
  double final_window_loss = 0;       ///< summary.json: mean loss over the last 10% of steps
  double tokens_per_s = 0;            ///< summary.json: training throughput
  std::vector<int> step;              ///< logged steps, ascending (metrics.jsonl)
  std::vector<double> loss;           ///< training loss at step[i] (nats/token)
  std::vector<double> grad_norm;      ///< global gradient norm before clipping at step[i]
  std::vector<double> step_ms;        ///< wall time of step[i] (ms)
  /// Held-out NLL (nats/token) by inference policy ("none" = FP32 inference, "current", ...).
  std::map<std::string, double> heldout;
  /// Held-out bits per byte by inference policy, where known.
  std::map<std::string, double> heldout_bpb;
  /// Step of the checkpoint eval.json was computed from (−1: no eval.json, the summary's
  /// values are used).
  int64_t eval_step = -1;
  int64_t tokens_per_step = 0;        ///< training tokens per optimizer step
  /// 0 for a completed run; else the step at which the run diverged (error.txt, no summary).
  int diverged_at = 0;
  std::string error;                  ///< error.txt of a diverged run
};

/// Read run `dir`: summary.json (status "completed") or, for a run that diverged, error.txt
/// (diverged_at from its "at step N"; recipe and seed from recipe.toml / config.toml),
/// metrics.jsonl, config.toml's train.warmup_steps, and eval.json if present (`fp4train eval --json` output: results →
/// policy → {nats_per_token, bits_per_byte}); without eval.json the policies "none" and
/// "current" come from summary.json. Throws fp4::UserError
/// naming the file and line on a missing or malformed file.
RunRecord read_run(const std::filesystem::path& dir);

/// Loss spikes (issue 4 §4): the number of entries i whose loss exceeds the median of the
/// previous `window` entries (all previous ones while fewer exist; none for i = 0) by more
/// than `threshold`. Non-finite losses count as spikes. O(n·window·log window).
int count_loss_spikes(const std::vector<double>& loss, int window = 100, double threshold = 0.5);

/// Median of xs (mean of the two middle values for an even count); NaN for an empty input.
double median(std::vector<double> xs);

/// Mean and sample standard deviation (n − 1; 0 for a single value) of xs.
struct MeanStd {
  double mean = 0, std = 0;
  int n = 0;
};
MeanStd mean_std(const std::vector<double>& xs);
/// The 0.975 quantile of Student's t distribution with `df` degrees of freedom (the factor
/// of a two-sided 95% interval): the standard table's values (4 decimals) for df 1..30, the
/// Cornish–Fisher expansion in 1/df to the third order beyond (within 2e-4 of the exact
/// value there). NaN for df < 1.
double t_quantile_975(int df);
/// A two-sided 95% t-interval for the mean of paired differences: mean ± t_{0.975, n−1} ·
/// std / √n. `resolved` is false when n < 2 or the interval contains 0 (issue 13: "not
/// resolved"); `sign` is then 0, else +1 (the recipe's loss is higher) or −1 (lower).
struct PairedInterval {
  double lo = 0, hi = 0;
  int n = 0;
  bool resolved = false;
  int sign = 0;
};
PairedInterval paired_interval(const MeanStd& d);

/// Aggregate of one recipe over its seeds (one row of the report).
struct RecipeRow {
  std::string recipe;
  int seeds = 0;                         ///< completed runs
  MeanStd final_loss;                    ///< final-window training loss over completed runs
  /// The recipe the gaps below are measured against (the comparison's baseline, e.g. "bf16");
  /// empty when there is none.
  std::string baseline;
  /// (mean − baseline mean) / baseline mean · 100; NaN without a baseline (or its runs).
  double gap_to_baseline_pct = 0;
  /// Paired difference to the baseline: mean ± std over the seeds both completed of (this
  /// run's final-window loss − the baseline run's of the same seed), in nats. A seed fixes the
  /// initialisation and the batches, so pairing removes most seed-to-seed variance.
  MeanStd paired_delta_baseline;
  /// Its 95% t-interval over the paired seeds (paired_interval).
  PairedInterval paired_ci95;
  std::map<std::string, MeanStd> heldout;  ///< per inference policy
  int diverged = 0;                      ///< runs that diverged (not in the means)
  std::vector<int> diverged_at;          ///< their divergence steps
  int spikes = 0;                        ///< loss spikes summed over seeds
  double max_grad_norm = 0;              ///< max over seeds of max grad norm after warmup
  int grad_norm_excursions = 0;          ///< logged steps after warmup with grad norm > 1
                                         ///< (or non-finite), summed over seeds
  double tokens_per_s = 0;               ///< tokens per step / median_step_ms
  double median_step_ms = 0;             ///< median step time over all seeds' steps after 5
  double step_ratio_fp32 = 0;            ///< median_step_ms / fp32's; NaN if no fp32 run
};

/// The recipe among `names` that a baseline argument `want` (e.g. `--baseline fp32`) selects:
/// `want` itself if listed, else the one name that is `want` labelled by `--set` overrides
/// ("fp32+fp4.block=32", fp4/settings.h labelled_name); "" if none. Throws fp4::UserError if
/// several labelled names match.
std::string find_baseline(const std::vector<std::string>& names, const std::string& want);

/// The default baseline of a comparison of `names`: bf16 when present (find_baseline), else
/// fp32, else "" (no baseline: gap columns show "—").
std::string default_baseline(const std::vector<std::string>& names);

/// One row per recipe, in `order` (recipes without runs are skipped; runs of recipes not in
/// `order` are appended in the order first seen). Gaps and paired differences are measured
/// against the recipe named `baseline` (an exact name; empty: default_baseline of the rows'
/// names). A baseline without completed runs gives NaN gaps and empty paired differences.
std::vector<RecipeRow> aggregate_runs(const std::vector<RunRecord>& runs,
                                      const std::vector<std::string>& order,
                                      const std::string& baseline = "");

/// Everything the report states about how the runs were made.
struct ReportContext {
  std::string title = "Recipe comparison";
  std::string config_name;   ///< e.g. "tiny"
  std::string command;       ///< the command that reproduces the runs
  std::string model_line;    ///< e.g. "5.2 M parameters, 4 layers, d_model 256"
  int64_t tokens_per_run = 0;
  std::vector<std::string> policies;  ///< inference policies to tabulate, in order
  std::vector<std::string> plots;     ///< PNG paths relative to the report (may be empty)
  std::string plots_note;             ///< why plots are missing, if they are
};

/// The Markdown report: main table, per-seed table, definitions and plots.
std::string comparison_report_md(const std::vector<RecipeRow>& rows,
                                 const std::vector<RunRecord>& runs, const ReportContext& ctx);

}  // namespace fp4
