// Recipe comparison report (docs/compare.md "Comparing recipes: `fp4train compare`"): reads
// finished run directories and condenses them into the paper's side-by-side table —
// final-window training loss, held-out NLL under each quantized-inference policy, stability
// (loss spikes, gradient-norm excursions) and throughput — as Markdown.
#pragma once
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace fp4 {

/// Evaluations averaged by the metric heldout_nll_last (docs/recipes.md "Studies: claims as
/// hypotheses").
inline constexpr int kLastEvals = 2;
/// The half-width of the power table's target interval, nats (docs/recipes.md "Studies: claims
/// as hypotheses", **Power**).
inline constexpr double kPowerHalfWidth = 0.005;

/// One finished run, as read back from its directory.
struct RunRecord {
  std::filesystem::path dir;
  std::string recipe;
  uint64_t seed = 0;
  int steps = 0;                      ///< configured optimizer steps
  int warmup_steps = 0;               ///< train.warmup_steps of the run's config.toml
  /// summary.json: mean training loss over the last final_window_steps steps.
  double final_window_loss = 0;
  /// summary.json final_window_steps: the window of final_window_loss (train.final_window;
  /// by default the last 10%, max(1, steps / 10), which is also what a summary without the
  /// field had); 0 for a diverged run (no summary).
  int final_window_steps = 0;
  double tokens_per_s = 0;            ///< summary.json: training throughput
  /// summary.json machine_load.busy: the machine had more runnable threads than cores at a
  /// progress line or at the end (fp4/base/machine_load.h); false where the summary predates it.
  bool busy_machine = false;
  /// summary.json slow_path: the quantizer paths slower than the fused SIMD kernels that the
  /// run took (fp4::slow_quantizer_paths); "" when none, or where the summary predates it.
  std::string slow_path;
  std::vector<int> step;              ///< logged steps, ascending (metrics.jsonl)
  std::vector<double> loss;           ///< training loss at step[i] (nats/token)
  std::vector<double> grad_norm;      ///< global gradient norm before clipping at step[i]
  std::vector<double> step_ms;        ///< wall time of step[i] (ms)
  /// Held-out NLL (nats/token) by inference policy ("none" = FP32 inference, "current", ...).
  std::map<std::string, double> heldout;
  /// Held-out mean NLL of each window (eval.json results → policy → window_nll, in window
  /// order), by inference policy; absent for eval.json files written before it was recorded.
  std::map<std::string, std::vector<double>> heldout_windows;
  /// Held-out bits per byte by inference policy, where known.
  std::map<std::string, double> heldout_bpb;
  /// Step of the checkpoint eval.json was computed from (−1: no eval.json, the summary's
  /// values are used).
  int64_t eval_step = -1;
  int64_t tokens_per_step = 0;        ///< training tokens per optimizer step
  /// 0 for a completed run; else the step at which the run diverged (error.txt, no summary).
  int diverged_at = 0;
  std::string error;                  ///< error.txt of a diverged run
  /// The downstream task of task.json (`fp4train eval --task ... --json`), if present: its
  /// name ("" when there is none), the items' FNV-1a 64 hash, and per inference policy the
  /// per-item outcomes, raw and per character ('1' correct, '0' wrong, in item order;
  /// empty for a policy whose scores were non-finite).
  std::string task;
  std::string task_items_hash;
  double task_chance = 0;
  int64_t task_step = -1;  ///< step of the checkpoint task.json was computed from (−1: unknown)
  struct TaskOutcome {
    std::string correct, correct_per_char;
  };
  std::map<std::string, TaskOutcome> task_results;
  /// The minimal-pairs task of task-minimal-pairs.json (`fp4train eval --task minimal-pairs
  /// --json`), if present (items_hash "" when not): the paradigms (name, chance, and the
  /// item range [first, first + items)), and per inference policy with finite scores the
  /// per-item credit (0, 1 or 1/m for a tie of m; NaN for an item left out) and margin (nats).
  struct Pairs {
    std::string items_hash;
    int64_t step = -1;
    struct Paradigm {
      std::string name;
      size_t first = 0, items = 0;
      double chance = 0;
    };
    std::vector<Paradigm> paradigms;
    struct Outcome {
      std::vector<double> credit, margin;
    };
    std::map<std::string, Outcome> results;
  } pairs;
  /// summary.json compute.cpu: the CPU the run trained on ("" where the summary has none).
  std::string cpu;
  /// Held-out NLL (FP32 inference) of the evaluations during training (metrics.jsonl
  /// val_nll), by step; heldout_last is the mean of the last kLastEvals of them (NaN with
  /// fewer).
  std::vector<int> val_step;
  std::vector<double> val_nll;
  double heldout_last = std::numeric_limits<double>::quiet_NaN();
};

/// Read run `dir`: summary.json (status "completed") or, for a run that diverged, error.txt
/// (diverged_at from its "at step N"; recipe and seed from recipe.toml / config.toml),
/// metrics.jsonl (or the metrics.jsonl.zst of a compacted run, fp4/study/run_metrics.h),
/// config.toml's train.warmup_steps, eval.json if present (`fp4train eval --json` output:
/// results → policy → {nats_per_token, bits_per_byte}); without eval.json the policies "none"
/// and "current" come from summary.json; and task.json if present (a completed run only:
/// task, items_fnv1a64, chance, step, results → policy → correct / correct_per_char, each
/// accuracy checked against its outcome string). Throws fp4::UserError naming the file and
/// line on a missing or malformed file (a corrupt or truncated metrics.jsonl.zst included).
RunRecord read_run(const std::filesystem::path& dir);

/// Read a task-minimal-pairs.json (`fp4train eval --task minimal-pairs --json`): task,
/// items_fnv1a64, items, step, the six paradigms in the task's order covering the items end to
/// end, and per policy with finite scores the credits and margins, each credit checked
/// against its margin. Throws fp4::UserError naming the file and the field on anything else.
RunRecord::Pairs read_minimal_pairs_file(const std::filesystem::path& file);

/// Loss spikes (docs/compare.md "Comparing recipes: `fp4train compare`"): the number of entries
/// i whose loss exceeds the median of the previous `window` entries (all previous ones while
/// fewer exist; none for i = 0) by more than `threshold`. Non-finite losses count as spikes.
/// O(n·window·log window).
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
/// std / √n. `resolved` is false when n < 2 or the interval contains 0 ("not resolved",
/// docs/compare.md "Comparing recipes: `fp4train compare`"); `sign` is then 0, else +1 (the
/// recipe's loss is higher) or −1 (lower).
struct PairedInterval {
  double lo = 0, hi = 0;
  int n = 0;
  bool resolved = false;
  int sign = 0;
};
PairedInterval paired_interval(const MeanStd& d);

/// A paired bootstrap over held-out windows (docs/recipes.md "Studies: claims as hypotheses";
/// as the paper's reference implementation evaluates held-out loss): a 95% percentile interval
/// for the mean of paired per-window differences.
struct BootstrapInterval {
  double mean = 0;     ///< the observed mean over seeds and windows
  double lo = 0, hi = 0;
  int seeds = 0, windows = 0, resamples = 0;
  bool resolved = false;  ///< the interval excludes 0
  int sign = 0;           ///< +1 / −1 when resolved (above / below 0), else 0
};
/// Paired bootstrap of d[s][w], the difference of two recipes' (or any contrast's) mean NLL
/// on held-out window w in the runs of seed s. Every row must hold the same W ≥ 1 windows
/// (the held-out windows are the same text for every seed). Each of `resamples` draws W
/// window indices uniformly with replacement, the same indices for every seed, and takes the
/// mean of d over seeds and drawn windows; the interval is the 2.5% and 97.5% quantiles of
/// those means (linear interpolation between order statistics, Hyndman–Fan type 7). The
/// draws come from splitmix64(seed + k) with rejection sampling, so the interval is the same
/// on every machine and compiler. It measures the evaluation sample's noise only (which
/// windows were held out), not the training noise across seeds: paired_interval does that.
/// Throws std::invalid_argument for no rows, rows of different or zero length, or
/// resamples < 1.
BootstrapInterval paired_bootstrap(const std::vector<std::vector<double>>& d,
                                   int resamples = 10000, uint64_t seed = 20260902);

/// Downstream-task accuracy of one recipe under one inference policy (docs/evaluation.md
/// "Downstream task: `eval --task next-sentence`"), over the seeds whose task.json holds the
/// items most runs of the comparison hold (same task and items_fnv1a64; others are counted in
/// RecipeRow::task_excluded).
struct TaskRow {
  int seeds = 0;
  int items = 0;
  /// Accuracy pooled over seeds and items, with a 95% percentile bootstrap over items (the
  /// same items resampled for every seed: paired_bootstrap of the 0/1 outcomes), raw and
  /// per character (OLMES's normalisation).
  BootstrapInterval raw, per_char;
};

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
  /// Held-out NLL (policy `bootstrap_policy` of aggregate_runs) minus the baseline's, paired
  /// by seed and window: paired_bootstrap over the seeds both have per-window values for
  /// (seeds = 0 when none has).
  BootstrapInterval heldout_boot;
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
  int timed_steps = 0;                   ///< step times in median_step_ms (all seeds)
  /// Interquartile range of those step times over their median (0 when fewer than 4).
  double step_spread = 0;
  int busy_runs = 0;                     ///< runs timed on a busy machine (RunRecord::busy_machine)
  int slow_path_runs = 0;                ///< runs that took a slow quantizer path (slow_path)
  /// Why median_step_ms (or fp32's, for step_ratio_fp32) is not a reliable timing: "" or a
  /// list such as "busy machine, 3 steps" (fewer than 10 timed steps, a spread above 50%,
  /// any run on a busy machine), or "slow path" first when a run took a slow quantizer path
  /// (then not "busy machine": the recipe, not the machine, explains the time).
  std::string timing_note;
  std::string task;                      ///< the runs' downstream task ("" when none has one)
  std::string task_items_hash;           ///< the items its task rows are measured on
  double task_chance = 0;
  std::map<std::string, TaskRow> task_rows;  ///< per inference policy
  /// Runs of this recipe whose task.json holds other items than most runs' (not pooled).
  int task_excluded = 0;
};

/// The recipe among `names` that a baseline argument `want` (e.g. `--baseline fp32`) selects:
/// `want` itself if listed, else the one name that is `want` labelled by `--set` overrides
/// ("fp32+fp4.block=32", fp4/config/settings.h labelled_name); "" if none. Throws fp4::UserError if
/// several labelled names match.
std::string find_baseline(const std::vector<std::string>& names, const std::string& want);

/// The default baseline of a comparison of `names`: bf16 when present (find_baseline), else
/// fp32, else "" (no baseline: gap columns show "—").
std::string default_baseline(const std::vector<std::string>& names);

/// One row per recipe, in `order` (recipes without runs are skipped; runs of recipes not in
/// `order` are appended in the order first seen). Gaps and paired differences are measured
/// against the recipe named `baseline` (an exact name; empty: default_baseline of the rows'
/// names). A baseline without completed runs gives NaN gaps and empty paired differences.
/// heldout_boot is computed for inference policy `bootstrap_policy` ("none": FP32 inference).
std::vector<RecipeRow> aggregate_runs(const std::vector<RunRecord>& runs,
                                      const std::vector<std::string>& order,
                                      const std::string& baseline = "",
                                      const std::string& bootstrap_policy = "none");

/// One claim of a study (docs/recipes.md "Studies: claims as hypotheses"), as a linear
/// contrast of recipes: the claim holds when Σ_i coef_i · metric(recipe_i) has the expected
/// sign. "A beats B" is {A: +1, B: −1}, expected negative; "UE5M3 scales close more than half
/// the NVFP4→BF16 gap" is
/// ue5m3-te − nvfp4-te + 0.5·(nvfp4-te − bf16) = {ue5m3-te: 1, nvfp4-te: −0.5, bf16: −0.5},
/// expected negative.
struct Hypothesis {
  std::string id;      ///< e.g. "H5"
  std::string claim;   ///< the paper's claim in words
  /// "final_loss" (final-window training loss, nats), "heldout_nll" (held-out NLL under
  /// `policy`, nats/token), "heldout_nll_last" (RunRecord::heldout_last, nats/token) or
  /// "grad_norm_excursions" (logged steps after warmup with grad
  /// norm > 1, the paper's instability count).
  std::string metric = "final_loss";
  std::string policy = "none";  ///< heldout_nll only
  std::vector<std::pair<std::string, double>> contrast;  ///< recipe name → coefficient
  int expect = -1;     ///< −1: the claim holds when the contrast is negative; +1: positive;
                       ///< 0: when it is within ±margin (an equivalence claim)
  double margin = 0;   ///< expect = 0 only: the largest |contrast| the claim calls "little"
};

/// Read the [[hypothesis]] tables of a study file (TOML). Each has `id`, `claim`, optional
/// `metric` and `policy`, and either `lower = "A"` with `than = "B"` (the contrast A − B,
/// expected negative) or `contrast = { "A" = 1.0, "B" = -1.0, ... }` with
/// `expect = "negative" | "positive"`, or `expect = "equivalent"` with `margin = m > 0` (the
/// claim that the contrast is within ±m: "changes little"). Throws fp4::UserError naming the file, the hypothesis
/// and the key on a missing or malformed entry, an unknown metric or key, or an empty or
/// all-zero contrast.
std::vector<Hypothesis> load_hypotheses(const std::filesystem::path& file);

/// The verdict on one hypothesis from the runs (docs/recipes.md "Studies: claims as
/// hypotheses", the verdicts).
struct Verdict {
  /// "supported", "contradicted", "not resolved" or "not run".
  std::string verdict;
  std::string why;          ///< e.g. the recipes without runs, or "n < 2 seeds"
  std::vector<double> per_seed;  ///< the contrast per seed (seeds where every recipe has it)
  MeanStd contrast;         ///< over those seeds
  PairedInterval t95;       ///< t-interval over seeds
  BootstrapInterval boot;   ///< heldout_nll only: paired bootstrap over windows (seeds = 0
                            ///< without per-window values)
};
/// Judge `h` on `runs`: the contrast is evaluated per seed over the seeds where every recipe
/// of the contrast has a completed run (for grad_norm_excursions, also diverged runs). It is
/// *resolved* when its 95% t-interval over seeds excludes 0 and, for heldout_nll, also the
/// paired bootstrap over windows excludes 0 on the same side; then *supported* if the sign
/// is the expected one, else *contradicted*. Otherwise *not resolved* (including n < 2
/// seeds); *not run* when a recipe of the contrast has no completed run. An equivalence
/// claim (expect 0) is *supported* when the interval (both intervals, for heldout_nll) lies
/// inside (−margin, margin), *contradicted* when one lies wholly outside [−margin, margin],
/// else *not resolved* (the two one-sided tests at 2.5% each, TOST).
Verdict judge_hypothesis(const Hypothesis& h, const std::vector<RunRecord>& runs);

/// The number of seeds n ≥ 2 whose 95% t-interval half-width t_{0.975,n−1} · sd / √n is at
/// most `half_width` (the power table): 0 for a non-finite or negative sd or a half_width ≤ 0;
/// at most 100000.
int seeds_for_half_width(double sd, double half_width);

/// The "Hypotheses" section of a report: one row per hypothesis with its contrast, metric,
/// per-seed values, intervals and verdict, and the rule that decides them.
std::string hypotheses_md(const std::vector<Hypothesis>& hs, const std::vector<RunRecord>& runs);

/// The same verdicts as JSON (written as DIR/hypotheses.json by compare/report, read by
/// tools/plot_runs.py --hypotheses): an array of {id, claim, metric, policy (heldout_nll),
/// contrast {recipe: coefficient}, expect ("negative" | "positive" | "equivalent"), margin
/// (equivalent), per_seed [...], mean, t95 [lo, hi] (n ≥ 2 seeds), bootstrap95 {lo, hi,
/// seeds, windows, resamples} (heldout_nll with per-window values), verdict, why}. Units are
/// the metric's (nats, or counts); a non-finite value is null.
std::string hypotheses_json(const std::vector<Hypothesis>& hs, const std::vector<RunRecord>& runs);

/// The "Minimal pairs" section of a report ("" when no run has task-minimal-pairs.json):
/// accuracy per recipe (in `names` order), policy and paradigm, pooled over seeds with a
/// bootstrap over items; the mean margin; and item-paired comparisons (credit and margin
/// differences bootstrapped over items, McNemar's exact test on the discordant pairs) of
/// each recipe against `baseline`, of the two-recipe contrasts among `hyps`, and of each
/// quantized-inference policy against `none` within a recipe. Only runs on the items of
/// most runs are used (the others are counted).
std::string minimal_pairs_md(const std::vector<RunRecord>& runs, const std::vector<std::string>& names,
                             const std::vector<std::string>& policies, const std::string& baseline,
                             const std::vector<Hypothesis>& hyps);

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
  /// The half-width E (nats) of the "Power" table's target interval (`compare --effect`).
  double effect = kPowerHalfWidth;
};

/// The Markdown report: main table (one verdict per row: the t-interval over seeds), the
/// Power table (seeds for ±ctx.effect at each recipe's paired std, when a baseline and 2
/// paired seeds exist), per-seed table, definitions and plots (docs/compare.md "The report").
std::string comparison_report_md(const std::vector<RecipeRow>& rows,
                                 const std::vector<RunRecord>& runs, const ReportContext& ctx);

}  // namespace fp4
