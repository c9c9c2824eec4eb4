// Recipe comparison report: run directories → aggregated rows → Markdown (issue 4 §4).
#include "fp4/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "fp4/config.h"
#include "fp4/error.h"
#include "fp4/recipe.h"

namespace fp4 {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

json read_json_file(const fs::path& p) {
  std::ifstream f(p);
  if (!f) throw UserError("cannot read " + p.string());
  try {
    return json::parse(f);
  } catch (const json::exception& e) {
    throw UserError(p.string() + ": malformed JSON (" + e.what() + ")");
  }
}

double num(const json& j, const char* key, const fs::path& where) {
  if (!j.contains(key)) throw UserError(where.string() + ": missing field '" + key + "'");
  const json& v = j.at(key);
  if (v.is_null()) return kNaN;  // NaN is written as null
  if (!v.is_number())
    throw UserError(where.string() + ": field '" + key + "' is not a number");
  return v.get<double>();
}

std::string fmt(const char* f, double v) {
  if (!std::isfinite(v)) return "—";
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}
// "mean ± std" (just the mean for one value); f formats the mean, the std is unsigned.
std::string fmt_ms(const MeanStd& m, const char* f = "%.4f") {
  if (m.n == 0 || !std::isfinite(m.mean)) return "—";
  std::string s = fmt(f, m.mean);
  if (m.n > 1) s += " ± " + fmt("%.4f", m.std);
  return s;
}
}  // namespace

double median(std::vector<double> xs) {
  if (xs.empty()) return kNaN;
  std::sort(xs.begin(), xs.end());
  const size_t n = xs.size();
  return n % 2 ? xs[n / 2] : 0.5 * (xs[n / 2 - 1] + xs[n / 2]);
}

MeanStd mean_std(const std::vector<double>& xs) {
  MeanStd m;
  m.n = static_cast<int>(xs.size());
  if (xs.empty()) return m;
  double s = 0;
  for (double x : xs) s += x;
  m.mean = s / xs.size();
  if (xs.size() > 1) {
    double q = 0;
    for (double x : xs) q += (x - m.mean) * (x - m.mean);
    m.std = std::sqrt(q / (xs.size() - 1));
  }
  return m;
}

double t_quantile_975(int df) {
  // Two-sided 95% critical values of Student's t, df = 1..30 (standard statistical tables).
  static constexpr double kTable[30] = {
      12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
      2.2010,  2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
      2.0796,  2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423};
  if (df < 1) return kNaN;
  if (df <= 30) return kTable[df - 1];
  // Cornish–Fisher: t ≈ z + g1/ν + g2/ν² + g3/ν³ with z the normal 0.975 quantile.
  const double z = 1.959963984540054, v = df;
  const double z3 = z * z * z, z5 = z3 * z * z, z7 = z5 * z * z;
  return z + (z3 + z) / (4 * v) + (5 * z5 + 16 * z3 + 3 * z) / (96 * v * v) +
         (3 * z7 + 19 * z5 + 17 * z3 - 15 * z) / (384 * v * v * v);
}

PairedInterval paired_interval(const MeanStd& d) {
  PairedInterval r;
  r.n = d.n;
  if (d.n < 2) {
    r.lo = r.hi = d.n ? d.mean : kNaN;
    return r;
  }
  const double h = t_quantile_975(d.n - 1) * d.std / std::sqrt(double(d.n));
  r.lo = d.mean - h;
  r.hi = d.mean + h;
  r.resolved = r.lo > 0 || r.hi < 0;
  r.sign = !r.resolved ? 0 : (r.lo > 0 ? 1 : -1);
  return r;
}

int count_loss_spikes(const std::vector<double>& loss, int window, double threshold) {
  if (window < 1) throw std::invalid_argument("count_loss_spikes: window must be >= 1");
  int spikes = 0;
  std::vector<double> prev;
  for (size_t i = 0; i < loss.size(); ++i) {
    if (!std::isfinite(loss[i])) {
      ++spikes;
      continue;
    }
    if (i == 0) continue;
    const size_t lo = i > size_t(window) ? i - window : 0;
    prev.clear();
    for (size_t j = lo; j < i; ++j)
      if (std::isfinite(loss[j])) prev.push_back(loss[j]);
    if (!prev.empty() && loss[i] > median(prev) + threshold) ++spikes;
  }
  return spikes;
}

RunRecord read_run(const fs::path& dir) {
  RunRecord r;
  r.dir = dir;
  const fs::path sp = dir / "summary.json", errp = dir / "error.txt", cp = dir / "config.toml";
  json s;
  if (fs::exists(sp)) {
    s = read_json_file(sp);
    if (s.value("status", "") != "completed")
      throw UserError(sp.string() + ": status is not \"completed\"");
    r.recipe = s.value("recipe", "");
    if (r.recipe.empty()) throw UserError(sp.string() + ": missing field 'recipe'");
    r.seed = s.value("seed", uint64_t{0});
    r.steps = static_cast<int>(num(s, "steps", sp));
    r.final_window_loss = num(s, "final_window_loss", sp);
    r.tokens_per_s = num(s, "tokens_per_s", sp);
    r.tokens_per_step = s.value("tokens", int64_t{0}) / std::max(r.steps, 1);
  } else if (fs::exists(errp)) {
    if (run_error(dir, &r.error) == RunError::Failed)
      throw UserError(dir.string() + " did not complete: " + r.error);
    const auto at = r.error.find(" at step ");
    if (at != std::string::npos) r.diverged_at = std::atoi(r.error.c_str() + at + 9);
    if (r.diverged_at <= 0) throw UserError(errp.string() + ": no \"at step N\" in it");
    if (!fs::exists(cp) || !fs::exists(dir / "recipe.toml"))
      throw UserError(dir.string() + ": a diverged run without config.toml and recipe.toml");
    r.recipe = load_recipe_file(dir / "recipe.toml").name;
    const RunConfig c = load_run_config(cp);
    r.seed = c.train.seed;
    r.steps = c.train.steps;
    r.final_window_loss = kNaN;
    r.tokens_per_s = kNaN;
    r.tokens_per_step = int64_t(c.train.batch_size) * c.train.seq_len;
  } else {
    throw UserError(dir.string() + " holds no summary.json: the run did not complete");
  }
  if (fs::exists(cp)) r.warmup_steps = load_run_config(cp).train.warmup_steps;

  const fs::path mp = dir / "metrics.jsonl";
  std::ifstream mf(mp);
  if (!mf) throw UserError("cannot read " + mp.string());
  std::string line;
  for (int ln = 1; std::getline(mf, line); ++ln) {
    if (line.empty()) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      throw UserError(mp.string() + ":" + std::to_string(ln) + ": malformed JSON (" + e.what() + ")");
    }
    const fs::path where = mp.string() + ":" + std::to_string(ln);
    const int st = static_cast<int>(num(j, "step", where));
    if (!r.step.empty() && st <= r.step.back())
      throw UserError(where.string() + ": steps are not increasing");
    r.step.push_back(st);
    r.loss.push_back(num(j, "loss", where));
    r.grad_norm.push_back(num(j, "grad_norm", where));
    r.step_ms.push_back(j.contains("step_ms") ? num(j, "step_ms", where) : kNaN);
  }
  if (r.step.empty()) throw UserError(mp.string() + " holds no steps");

  const fs::path ep = dir / "eval.json";
  if (r.diverged_at > 0) {
    // No held-out NLL for a diverged run.
  } else if (fs::exists(ep)) {
    const json e = read_json_file(ep);
    r.eval_step = e.value("step", int64_t{-1});
    if (!e.contains("results") || !e["results"].is_object())
      throw UserError(ep.string() + ": missing object 'results' (expected `fp4train eval --json` output)");
    for (const auto& [pol, v] : e["results"].items()) {
      r.heldout[pol] = num(v, "nats_per_token", ep);
      if (v.contains("bits_per_byte")) r.heldout_bpb[pol] = num(v, "bits_per_byte", ep);
    }
  } else {
    r.heldout["none"] = num(s, "heldout_nll", sp);
    if (r.recipe != "fp32") r.heldout["current"] = num(s, "heldout_nll_quant", sp);
  }
  return r;
}

std::string find_baseline(const std::vector<std::string>& names, const std::string& want) {
  if (want.empty()) return "";
  if (std::find(names.begin(), names.end(), want) != names.end()) return want;
  std::string found;
  for (const auto& n : names)
    if (n.rfind(want + "+", 0) == 0) {
      if (!found.empty())
        throw UserError("baseline '" + want + "' is ambiguous: both '" + found + "' and '" + n +
                        "' are " + want + " changed by --set; name one of them exactly");
      found = n;
    }
  return found;
}

std::string default_baseline(const std::vector<std::string>& names) {
  const std::string b = find_baseline(names, "bf16");
  return b.empty() ? find_baseline(names, "fp32") : b;
}

std::vector<RecipeRow> aggregate_runs(const std::vector<RunRecord>& runs,
                                      const std::vector<std::string>& order,
                                      const std::string& baseline_arg) {
  std::vector<std::string> names = order;
  for (const auto& r : runs)
    if (std::find(names.begin(), names.end(), r.recipe) == names.end()) names.push_back(r.recipe);
  std::vector<RecipeRow> rows;
  for (const auto& name : names) {
    RecipeRow row;
    row.recipe = name;
    std::vector<double> fl, ms;
    std::map<std::string, std::vector<double>> held;
    int64_t tokens_per_step = 0;
    bool any = false;
    for (const auto& r : runs) {
      if (r.recipe != name) continue;
      any = true;
      row.spikes += count_loss_spikes(r.loss);
      tokens_per_step = r.tokens_per_step;
      if (r.diverged_at > 0) {
        ++row.diverged;
        row.diverged_at.push_back(r.diverged_at);
      } else {
        ++row.seeds;
        fl.push_back(r.final_window_loss);
        for (const auto& [p, v] : r.heldout) held[p].push_back(v);
      }
      for (size_t i = 0; i < r.step.size(); ++i) {
        if (r.step[i] > r.warmup_steps && std::isfinite(r.grad_norm[i]))
          row.max_grad_norm = std::max(row.max_grad_norm, r.grad_norm[i]);
        // Grad-norm excursions (the paper's stability count): norm > 1 after warmup.
        if (r.step[i] > r.warmup_steps && !(r.grad_norm[i] <= 1.0)) ++row.grad_norm_excursions;
        if (r.step[i] > 5 && std::isfinite(r.step_ms[i])) ms.push_back(r.step_ms[i]);
      }
    }
    if (!any) continue;
    row.final_loss = mean_std(fl);
    if (fl.empty()) row.final_loss.mean = kNaN;
    for (const auto& [p, v] : held) row.heldout[p] = mean_std(v);
    row.median_step_ms = median(ms);
    row.tokens_per_s = tokens_per_step * 1e3 / row.median_step_ms;
    rows.push_back(row);
  }
  std::vector<std::string> row_names;
  for (const auto& r : rows) row_names.push_back(r.recipe);
  const std::string baseline = baseline_arg.empty() ? default_baseline(row_names) : baseline_arg;
  // The step-time reference: fp32, or fp32 as changed by --set (its speed is fp32's).
  const std::string fp32_name = find_baseline(row_names, "fp32");
  const RecipeRow *base = nullptr, *fp32 = nullptr;
  for (const auto& r : rows) {
    if (!baseline.empty() && r.recipe == baseline) base = &r;
    if (!fp32_name.empty() && r.recipe == fp32_name) fp32 = &r;
  }
  std::map<uint64_t, double> base_loss;  // seed → final-window loss of a completed baseline run
  for (const auto& r : runs)
    if (!baseline.empty() && r.recipe == baseline && r.diverged_at == 0)
      base_loss[r.seed] = r.final_window_loss;
  for (auto& row : rows) {
    std::vector<double> d;
    for (const auto& r : runs)
      if (r.recipe == row.recipe && r.diverged_at == 0 && base_loss.count(r.seed))
        d.push_back(r.final_window_loss - base_loss[r.seed]);
    row.paired_delta_baseline = mean_std(d);
    row.paired_ci95 = paired_interval(row.paired_delta_baseline);
  }
  for (auto& r : rows) {
    r.baseline = baseline;
    r.gap_to_baseline_pct =
        base ? 100.0 * (r.final_loss.mean - base->final_loss.mean) / base->final_loss.mean : kNaN;
    r.step_ratio_fp32 = fp32 ? r.median_step_ms / fp32->median_step_ms : kNaN;
  }
  return rows;
}

namespace {
// "[lo, hi] lower|higher|not resolved", or "—" (the baseline itself, or fewer than 2 seeds).
std::string interval_cell(const RecipeRow& r, const std::string& base) {
  if (r.recipe == base || r.paired_ci95.n < 2) return "—";
  const PairedInterval& c = r.paired_ci95;
  return "[" + fmt("%+.4f", c.lo) + ", " + fmt("%+.4f", c.hi) + "] " +
         (c.sign < 0 ? "lower" : c.sign > 0 ? "higher" : "not resolved");
}
}  // namespace

std::string comparison_report_md(const std::vector<RecipeRow>& rows,
                                 const std::vector<RunRecord>& runs, const ReportContext& ctx) {
  std::ostringstream o;
  o << "# " << ctx.title << "\n\n";
  if (!ctx.config_name.empty()) o << "Config `" << ctx.config_name << "`";
  if (!ctx.model_line.empty()) o << " (" << ctx.model_line << ")";
  if (ctx.tokens_per_run > 0) o << ", " << ctx.tokens_per_run << " training tokens per run";
  o << ".\n\n";
  if (!ctx.command.empty()) o << "Reproduce with:\n\n    " << ctx.command << "\n\n";

  std::vector<std::string> policies = ctx.policies;
  if (policies.empty())
    for (const auto& r : rows)
      for (const auto& [p, v] : r.heldout)
        if (std::find(policies.begin(), policies.end(), p) == policies.end()) policies.push_back(p);

  // The baseline of the gap columns (aggregate_runs); "baseline" when there is none.
  const std::string base = rows.empty() || rows[0].baseline.empty() ? "" : rows[0].baseline;
  const std::string bname = base.empty() ? "baseline" : base;
  if (!base.empty())
    o << "Baseline of the gap columns: `" << base << "`.\n\n";
  else
    o << "No baseline among these recipes (bf16 or fp32 by default; `--baseline NAME`): the gap "
         "columns are empty.\n\n";
  o << "| recipe | seeds | final-window loss | vs " << bname << " | Δ vs " << bname
    << ", paired by seed | its 95% interval |";
  for (const auto& p : policies) o << " held-out NLL, " << p << " |";
  o << " diverged | loss spikes | grad norm > 1 after warmup | max grad norm after warmup | tokens/s | step time vs fp32 "
       "|\n|---|---|---|---|---|---|";
  for (size_t i = 0; i < policies.size(); ++i) o << "---|";
  o << "---|---|---|---|---|---|\n";
  bool partial_cells = false;
  for (const auto& r : rows) {
    o << "| " << r.recipe << " | " << r.seeds << " | " << fmt_ms(r.final_loss) << " | "
      << (std::isfinite(r.gap_to_baseline_pct) ? fmt("%+.2f%%", r.gap_to_baseline_pct) : "—") << " | "
      << (r.paired_delta_baseline.n ? fmt_ms(r.paired_delta_baseline, "%+.4f") : std::string("—"))
      << " | " << interval_cell(r, base) << " |";
    for (const auto& p : policies) {
      const auto it = r.heldout.find(p);
      o << " " << (it == r.heldout.end() ? "—" : fmt_ms(it->second));
      if (it != r.heldout.end() && it->second.n < r.seeds) {
        o << " (n=" << it->second.n << ")";
        partial_cells = true;
      }
      o << " |";
    }
    o << " ";
    if (r.diverged == 0) o << "0";
    for (size_t i = 0; i < r.diverged_at.size(); ++i)
      o << (i ? ", " : "") << "at step " << r.diverged_at[i];
    o << " | " << r.spikes << " | " << r.grad_norm_excursions << " | " << fmt("%.3f", r.max_grad_norm) << " | "
      << fmt("%.0f", r.tokens_per_s) << " | " << fmt("%.2f×", r.step_ratio_fp32) << " |\n";
  }
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

  if (!ctx.plots.empty() || !ctx.plots_note.empty()) {
    o << "\n## Plots\n\n";
    for (const auto& p : ctx.plots) o << "![" << fs::path(p).stem().string() << "](" << p << ")\n\n";
    if (!ctx.plots_note.empty()) o << ctx.plots_note << "\n";
  }

  o << "\n## Definitions\n\n"
       "* **Final-window loss**: mean training loss over the last 10% of steps of a run.\n"
       "* **Baseline**: the recipe the gaps are measured against (`--baseline`; by default "
       "bf16 when compared, else fp32)"
    << (base.empty() ? "; none here" : ": `" + base + "` here") << ".\n"
    << "* **vs " << bname << "**: (recipe mean − " << bname << " mean) / " << bname
    << " mean of the final-window loss.\n"
    << "* **Δ vs " << bname << ", paired by seed**: mean ± std over seeds of (recipe − " << bname
    << ") final-window loss of the same seed (same initialisation and batches), in nats. Its "
       "std is the uncertainty to read when ranking recipes; the unpaired ± mostly measures "
       "how seeds differ.\n"
       "* **its 95% interval**: mean ± t₀.₉₇₅,ₙ₋₁ · std / √n over the n paired seeds (Student's "
       "t; needs n ≥ 2). *lower* / *higher*: the interval excludes 0, the recipe's loss is "
       "below / above the baseline's; *not resolved*: the interval contains 0.\n"
       "* **Held-out NLL** under a quantized-inference policy: `none` FP32 inference; `current` "
       "the recipe's quantization with every tensor's own amax (D = 1); `replay-d50` cold "
       "periodic sample-and-hold over ordered evaluation batches; `calibrated` references "
       "measured on disjoint batches then frozen (README, \"Quantized inference evaluation\").\n"
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
       "ratios, not absolute times.\n";
  return o.str();
}

}  // namespace fp4
