// The comparison report as Markdown (fp4/study/report.h): the main table, the policy
// columns, definitions and plots.
#include "fp4/study/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <toml++/toml.h>

#include "fp4/nn/run_config.h"
#include "fp4/data/data.h"
#include "fp4/eval/eval.h"
#include "fp4/base/error.h"
#include "fp4/recipe/recipe.h"

#include "report_internal.h"

namespace fp4 {
namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace report_detail;

namespace report_detail {
std::string power_cells(int n, double std, double half_width, double effect) {
  const int need = seeds_for_half_width(std, effect);
  return "| " + std::to_string(n) + " | " + fmt("%.4f", std) + " | ±" + fmt("%.4f", half_width) +
         " | " + (need >= 100000 ? std::string("≥ 100000") : std::to_string(need)) + " |";
}

// "[lo, hi] lower|higher|not resolved", or "—" (the baseline itself, or fewer than 2 seeds).
std::string interval_cell(const RecipeRow& r, const std::string& base) {
  if (r.recipe == base || r.paired_ci95.n < 2) return "—";
  const PairedInterval& c = r.paired_ci95;
  return "[" + fmt("%+.4f", c.lo) + ", " + fmt("%+.4f", c.hi) + "] " +
         (c.sign < 0   ? "lower"
          : c.sign > 0 ? "higher"
                       : "not resolved");
}

// "mean [lo, hi]" of a bootstrap, or "—". No verdict word: a row's verdict is its t-interval
// over seeds (docs/compare.md "The report"); this interval is evaluation noise only.
std::string boot_cell(const BootstrapInterval& b) {
  if (b.seeds == 0) return "—";
  return fmt("%+.4f", b.mean) + " [" + fmt("%+.4f", b.lo) + ", " + fmt("%+.4f", b.hi) + "]";
}
}  // namespace report_detail

namespace report_detail {
// The report's definition of the final-window loss, with the window its completed runs used
// (summary.json final_window_steps of steps): one phrase when they share it, else each window
// with its number of runs.
std::string final_window_definition(const std::vector<RunRecord>& runs) {
  std::map<std::pair<int, int>, int> windows;  // (window, steps) -> runs
  for (const auto& r : runs)
    if (r.diverged_at == 0 && r.final_window_steps > 0) ++windows[{r.final_window_steps, r.steps}];
  auto window = [](int w, int n) {
    return std::to_string(w) + " of " + std::to_string(n) + " steps (" +
           fmt("%.3g%%", 100.0 * w / std::max(n, 1)) + ")";
  };
  const std::string key = " (`train.final_window`; by default the last 10% of the steps)";
  if (windows.empty()) return "mean training loss over the last steps of a run" + key + ".";
  if (windows.size() == 1)
    return "mean training loss over the last " +
           window(windows.begin()->first.first, windows.begin()->first.second) + " of each run" +
           key + ".";
  std::string s = "mean training loss over the last steps of a run" + key + "; here the last ";
  bool first = true;
  for (const auto& [wn, count] : windows) {
    s += (first ? "" : ", ") + window(wn.first, wn.second) + " in " + std::to_string(count) +
         " run" + (count == 1 ? "" : "s");
    first = false;
  }
  return s + ".";
}
}  // namespace report_detail

namespace {
// The title, the config and model, the tokens per run and the command that reproduces it.
void write_header(std::ostringstream& o, const ReportContext& ctx) {
  o << "# " << ctx.title << "\n\n";
  if (!ctx.config_name.empty()) o << "Config `" << ctx.config_name << "`";
  if (!ctx.model_line.empty()) o << " (" << ctx.model_line << ")";
  if (ctx.tokens_per_run > 0) o << ", " << ctx.tokens_per_run << " training tokens per run";
  o << ".\n\n";
  if (!ctx.command.empty()) o << "Reproduce with:\n\n    " << ctx.command << "\n\n";
}

// The inference policies of the columns: the context's, else every one a row holds, in the
// order first met.
std::vector<std::string> report_policies(const std::vector<RecipeRow>& rows,
                                         const ReportContext& ctx) {
  std::vector<std::string> policies = ctx.policies;
  if (policies.empty())
    for (const auto& r : rows)
      for (const auto& [p, v] : r.heldout)
        if (std::find(policies.begin(), policies.end(), p) == policies.end()) policies.push_back(p);
  return policies;
}

// One recipe's line of the main table; *partial_cells is set when a policy cell holds fewer
// seeds than the row.
void write_main_row(std::ostringstream& o, const RecipeRow& r,
                    const std::vector<std::string>& policies, const std::string& base,
                    bool* partial_cells) {
  o << "| " << r.recipe << " | " << r.seeds << " | " << fmt_ms(r.final_loss) << " | "
    << (std::isfinite(r.gap_to_baseline_pct) ? fmt("%+.2f%%", r.gap_to_baseline_pct) : "—") << " | "
    << (r.paired_delta_baseline.n ? fmt_ms(r.paired_delta_baseline, "%+.4f") : std::string("—"))
    << " | " << interval_cell(r, base) << " | " << boot_cell(r.heldout_boot) << " |";
  for (const auto& p : policies) {
    const auto it = r.heldout.find(p);
    o << " " << (it == r.heldout.end() ? "—" : fmt_ms(it->second));
    if (it != r.heldout.end() && it->second.n < r.seeds) {
      o << " (n=" << it->second.n << ")";
      *partial_cells = true;
    }
    o << " |";
  }
  o << " ";
  if (r.diverged == 0) o << "0";
  for (size_t i = 0; i < r.diverged_at.size(); ++i)
    o << (i ? ", " : "") << "at step " << r.diverged_at[i];
  o << " | " << r.spikes << " | " << r.grad_norm_excursions << " | " << fmt("%.3f", r.max_grad_norm)
    << " | " << fmt("%.0f", r.tokens_per_s) << " | " << fmt("%.2f×", r.step_ratio_fp32)
    << (r.timing_note.empty() ? "" : " (" + r.timing_note + ")") << " |\n";
}

// The baseline line, the main table (one row per recipe) and the notes under it.
void write_main_table(std::ostringstream& o, const std::vector<RecipeRow>& rows,
                      const std::vector<RunRecord>& runs, const std::vector<std::string>& policies,
                      const std::string& base, const std::string& bname) {
  if (!base.empty())
    o << "Baseline of the gap columns: `" << base << "`.\n\n";
  else
    o << "No baseline among these recipes (bf16 or fp32 by default; `--baseline NAME`): the gap "
         "columns are empty.\n\n";
  o << "| recipe | seeds | final-window loss | vs " << bname << " | Δ vs " << bname
    << ", paired by seed | its 95% interval | held-out NLL (none) Δ vs " << bname
    << ", bootstrap over windows (evaluation noise only) |";
  for (const auto& p : policies) o << " held-out NLL, " << p << " |";
  o << " diverged | loss spikes | grad norm > 1 after warmup | max grad norm after warmup | "
       "tokens/s | step time vs fp32 "
       "|\n|---|---|---|---|---|---|---|";
  for (size_t i = 0; i < policies.size(); ++i) o << "---|";
  o << "---|---|---|---|---|---|\n";
  bool partial_cells = false;
  for (const auto& r : rows) write_main_row(o, r, policies, base, &partial_cells);
  o << "\nMeans ± sample standard deviations over the completed seeds (runs that diverged are "
       "counted under *diverged*, not in the means). Held-out NLL in nats/token; policy `none` "
       "is FP32 inference of the same weights.\n";
  if (partial_cells)
    o << "\n(n=k): only k of the completed seeds have this value (an evaluation is missing; "
         "rerun `fp4train compare` with the same arguments to compute it).\n";
  for (const auto& r : runs)
    if (r.diverged_at == 0 && r.eval_step >= 0 && r.eval_step != r.steps)
      o << "\nNote: the held-out values of `" << r.dir.filename().string()
        << "` come from its checkpoint at step " << r.eval_step << ", not the final step "
        << r.steps << " (the final checkpoint could not be loaded).\n";
}

// "## Power": per recipe, the seeds a 95% t-interval of ±E nats on its paired difference to
// the baseline would take at the paired std measured here (docs/compare.md "Power before
// cost"); nothing without a baseline or a recipe with 2 paired seeds.
void write_power_table(std::ostringstream& o, const std::vector<RecipeRow>& rows,
                       const std::string& base, double effect) {
  std::ostringstream t;
  for (const auto& r : rows) {
    if (r.recipe == base || r.paired_delta_baseline.n < 2) continue;
    const MeanStd& d = r.paired_delta_baseline;
    t << "| " << r.recipe << " "
      << power_cells(d.n, d.std, (r.paired_ci95.hi - r.paired_ci95.lo) / 2, effect) << "\n";
  }
  if (t.str().empty()) return;
  const std::string e = fmt("%g", effect);
  o << "\n## Power\n\nSeeds for a 95% t-interval of ±" << e
    << " nats on each recipe's paired difference to `" << base
    << "` (final-window loss), at the paired std over the seeds measured here: the smallest n "
       "with t₀.₉₇₅,ₙ₋₁ · std / √n ≤ "
    << e << ". With that many, a true difference of " << e
    << " is resolved about half the time (about twice as many seeds for 80%); the std itself "
       "is uncertain with few seeds.\n\n"
    << "| recipe | paired seeds | paired std | 95% half-width now | seeds for ±" << e
    << " |\n|---|---|---|---|---|\n"
    << t.str();
}

// One recipe's line of the downstream task's table; *partial is set when a policy has fewer
// seeds than the recipe.
void write_task_row(std::ostringstream& o, const RecipeRow& r,
                    const std::vector<std::string>& policies, bool* partial) {
  int seeds = 0;
  for (const auto& [p, t] : r.task_rows) seeds = std::max(seeds, t.seeds);
  o << "| " << r.recipe << " | " << seeds << " |";
  for (const auto& p : policies) {
    const auto it = r.task_rows.find(p);
    if (it == r.task_rows.end()) {
      o << " — | — |";
      continue;
    }
    const std::string n = it->second.seeds < seeds ? " (n=" + std::to_string(it->second.seeds) + ")"
                                                   : "";
    *partial |= !n.empty();
    for (const BootstrapInterval* b : {&it->second.raw, &it->second.per_char})
      o << " " << fmt("%.1f%%", 100 * b->mean) << " [" << fmt("%.1f", 100 * b->lo) << ", "
        << fmt("%.1f", 100 * b->hi) << "]" << n << " |";
  }
  o << "\n";
}

// "## Downstream task", when any row has a task: accuracy per recipe and policy, raw and
// per character, with its notes.
void write_task_section(std::ostringstream& o, const std::vector<RecipeRow>& rows,
                        const std::vector<RunRecord>& runs,
                        const std::vector<std::string>& policies) {
  std::string task, task_hash;
  double chance = 0;
  int excluded = 0;
  for (const auto& r : rows) {
    excluded += r.task_excluded;
    if (!r.task.empty() && task.empty())
      task = r.task, task_hash = r.task_items_hash, chance = r.task_chance;
  }
  if (task.empty()) return;
  o << "\n## Downstream task: " << task << "\n\n"
    << "Accuracy under each inference policy, from each run's final checkpoint (task.json); "
       "chance is "
    << fmt("%.0f%%", 100 * chance) << ". Items fnv1a64 `" << task_hash << "`.\n\n"
    << "| recipe | seeds |";
  for (const auto& p : policies) o << " " << p << ", raw | " << p << ", per char |";
  o << "\n|---|---|";
  for (size_t i = 0; i < policies.size(); ++i) o << "---|---|";
  o << "\n";
  bool partial = false;
  for (const auto& r : rows)
    if (!r.task.empty()) write_task_row(o, r, policies, &partial);
  o << "\nRaw: the choice with the highest log-likelihood after the context; per char: "
       "log-likelihood divided by the choice's characters (OLMES). Accuracy pooled over the "
       "seeds' runs; 95% percentile bootstrap over items (10,000 resamples, the same items "
       "for every seed). An interval that contains the chance level is no evidence the "
       "model does the task. Recipes without a task.json are not listed.\n";
  if (partial) o << "\n(n=k): only k of the recipe's seeds have finite scores under this policy.\n";
  if (excluded > 0)
    o << "\n"
      << excluded
      << " run(s) hold a task.json of other items (another task, corpus "
         "or item rule) and are left out of this table.\n";
  for (const auto& r : runs)
    if (r.diverged_at == 0 && !r.task.empty() && r.task_step >= 0 && r.task_step != r.steps)
      o << "\nNote: the task accuracy of `" << r.dir.filename().string()
        << "` comes from its checkpoint at step " << r.task_step << ", not the final step "
        << r.steps << ".\n";
}

// "## Per run": one line per run directory.
void write_per_run_table(std::ostringstream& o, const std::vector<RunRecord>& runs,
                         const std::vector<std::string>& policies) {
  o << "\n## Per run\n\n| recipe | seed | final-window loss |";
  for (const auto& p : policies) o << " held-out " << p << " |";
  o << " spikes | median step (ms) | directory |\n|---|---|---|";
  for (size_t i = 0; i < policies.size(); ++i) o << "---|";
  o << "---|---|---|\n";
  for (const auto& r : runs) {
    std::vector<double> ms;
    for (size_t i = 0; i < r.step.size(); ++i)
      if (r.step[i] > 5 && std::isfinite(r.step_ms[i])) ms.push_back(r.step_ms[i]);
    o << "| " << r.recipe << " | " << r.seed << " | "
      << (r.diverged_at > 0 ? "diverged at step " + std::to_string(r.diverged_at)
                            : fmt("%.4f", r.final_window_loss))
      << " |";
    for (const auto& p : policies) {
      const auto it = r.heldout.find(p);
      o << " " << (it == r.heldout.end() ? "—" : fmt("%.4f", it->second)) << " |";
    }
    o << " " << count_loss_spikes(r.loss) << " | " << fmt("%.1f", median(ms)) << " | `"
      << r.dir.filename().string() << "` |\n";
  }
}

// "## Plots", when there are plots or a note about them.
void write_plots(std::ostringstream& o, const ReportContext& ctx) {
  if (ctx.plots.empty() && ctx.plots_note.empty()) return;
  o << "\n## Plots\n\n";
  for (const auto& p : ctx.plots) o << "![" << fs::path(p).stem().string() << "](" << p << ")\n\n";
  if (!ctx.plots_note.empty()) o << ctx.plots_note << "\n";
}

// "## Definitions": what every column means.
void write_definitions(std::ostringstream& o, const std::vector<RunRecord>& runs,
                       const std::string& base, const std::string& bname) {
  o << "\n## Definitions\n\n"
    << "* **Final-window loss**: " << final_window_definition(runs) << "\n"
    << "* **Baseline**: the recipe the gaps are measured against (`--baseline`; by default "
       "bf16 when compared, else fp32)"
    << (base.empty() ? "; none here" : ": `" + base + "` here") << ".\n"
    << "* **vs " << bname << "**: (recipe mean − " << bname << " mean) / " << bname
    << " mean of the final-window loss.\n"
    << "* **Δ vs " << bname << ", paired by seed**: mean ± std over seeds of (recipe − " << bname
    << ") final-window loss of the same seed (same initialisation and batches), in nats. Its "
       "std is the uncertainty to read when ranking recipes; the unpaired ± mostly measures "
       "how seeds differ.\n"
       "* **its 95% interval**: mean ± t₀.₉₇₅,ₙ₋₁ · std / √n over the n paired seeds (Student's "
       "t; needs n ≥ 2), and the row's one verdict. *lower* / *higher*: the interval excludes "
       "0, the recipe's loss is below / above the baseline's; *not resolved*: the interval "
       "contains 0.\n"
       "* **Bootstrap over windows (evaluation noise only)**: the held-out NLL (FP32 "
       "inference, policy `none`) of the recipe minus the baseline's, per held-out window and "
       "seed; 10,000 resamples of the windows with replacement (the same windows for every "
       "seed, splitmix64 draws with a fixed seed), the mean over seeds and drawn windows; the "
       "interval is its 2.5% and 97.5% quantiles. It measures how much the figure depends on "
       "which text was held out, for these trained runs only, not how it varies with the "
       "training seed, so it carries no verdict: an interval that excludes 0 does not make "
       "a recipe better (the t-interval over seeds decides). Empty for evaluations written "
       "before per-window values were recorded.\n"
       "* **Power**: the seeds a 95% t-interval of ±E nats would take at each recipe's "
       "measured paired std (docs/compare.md \"Power before cost\").\n"
       "* **Held-out NLL** under a quantized-inference policy: `none` FP32 inference; `current` "
       "the recipe's quantization with every tensor's own amax (D = 1); `replay-d50` cold "
       "periodic sample-and-hold over ordered evaluation batches; `calibrated` references "
       "measured on disjoint batches then frozen (docs/evaluation.md \"Quantized inference "
       "evaluation\").\n"
       "* **Loss spikes**: logged steps whose loss exceeds the median of the previous 100 "
       "logged steps by more than 0.5 nats (non-finite losses count), summed over seeds.\n"
       "* **Grad norm > 1 after warmup**: logged steps after train.warmup_steps whose global "
       "gradient norm (before clipping) exceeds 1 (or is not finite), summed over seeds; with "
       "the loss spikes, the paper's count of instability.\n"
       "* **Max grad norm after warmup**: the largest global gradient norm (before clipping) "
       "after train.warmup_steps, over all seeds.\n"
       "* **Diverged**: runs stopped by a non-finite loss or gradient (the step is named).\n"
       "* **tokens/s**: training tokens per step over the median step time (steps after the "
       "5th, all seeds pooled; evaluation excluded). **Step time vs fp32**: that median over "
       "fp32's. Runs were sequential on one machine; shared machines are noisy, so read "
       "ratios, not absolute times. A ratio is marked, in parentheses, when it is not a "
       "measurement to rely on: *slow path* (a run's quantizers took a path slower than the "
       "fused SIMD kernels, summary.json slow_path, docs/performance.md \"Block sizes and the "
       "quantizer's fast path\"), *busy machine* (a run saw more runnable threads than cores, "
       "summary.json machine_load), *N steps* (fewer than 10 timed steps), *spread P%* (the "
       "interquartile range of the step times above half their median); *fp32: …* when the "
       "reference is.\n";
}
}  // namespace

std::string comparison_report_md(const std::vector<RecipeRow>& rows,
                                 const std::vector<RunRecord>& runs, const ReportContext& ctx) {
  std::ostringstream o;
  write_header(o, ctx);
  const std::vector<std::string> policies = report_policies(rows, ctx);
  // The baseline of the gap columns (aggregate_runs); "baseline" when there is none.
  const std::string base = rows.empty() || rows[0].baseline.empty() ? "" : rows[0].baseline;
  const std::string bname = base.empty() ? "baseline" : base;
  write_main_table(o, rows, runs, policies, base, bname);
  write_power_table(o, rows, base, ctx.effect);
  write_task_section(o, rows, runs, policies);
  write_per_run_table(o, runs, policies);
  write_plots(o, ctx);
  write_definitions(o, runs, base, bname);
  return o.str();
}

}  // namespace fp4
