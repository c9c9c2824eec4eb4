// Recipe comparison report: run directories → aggregated rows → Markdown (issue 4 §4).
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

#include "fp4/recipe/config.h"
#include "fp4/data/data.h"
#include "fp4/eval/eval.h"
#include "fp4/base/error.h"
#include "fp4/recipe/recipe.h"

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

BootstrapInterval paired_bootstrap(const std::vector<std::vector<double>>& d, int resamples,
                                   uint64_t seed) {
  if (d.empty()) throw std::invalid_argument("paired_bootstrap: no seeds");
  const size_t W = d[0].size();
  if (W == 0) throw std::invalid_argument("paired_bootstrap: no windows");
  for (const auto& row : d)
    if (row.size() != W)
      throw std::invalid_argument("paired_bootstrap: seeds hold different numbers of windows (" +
                                  std::to_string(row.size()) + " and " + std::to_string(W) + ")");
  if (resamples < 1) throw std::invalid_argument("paired_bootstrap: resamples must be >= 1");
  BootstrapInterval b;
  b.seeds = static_cast<int>(d.size());
  b.windows = static_cast<int>(W);
  b.resamples = resamples;
  // Per-window mean over seeds: a resample's statistic is the mean of these over its draws.
  std::vector<double> m(W, 0.0);
  for (size_t w = 0; w < W; ++w) {
    for (const auto& row : d) m[w] += row[w];
    m[w] /= double(d.size());
  }
  double total = 0;
  for (double v : m) total += v;
  b.mean = total / double(W);
  // Unbiased uniform indices in [0, W): reject the top partial range of 2^64.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % W;
  uint64_t k = 0;
  std::vector<double> stats(static_cast<size_t>(resamples));
  for (auto& st : stats) {
    double sum = 0;
    for (size_t i = 0; i < W; ++i) {
      uint64_t u;
      do u = splitmix64(seed, k++);
      while (u >= limit);
      sum += m[u % W];
    }
    st = sum / double(W);
  }
  std::sort(stats.begin(), stats.end());
  auto quantile = [&](double q) {  // type 7: h = (n − 1)·q, interpolate between neighbours
    const double h = (stats.size() - 1) * q;
    const size_t lo = static_cast<size_t>(std::floor(h));
    const size_t hi = std::min(lo + 1, stats.size() - 1);
    return stats[lo] + (h - double(lo)) * (stats[hi] - stats[lo]);
  };
  b.lo = quantile(0.025);
  b.hi = quantile(0.975);
  b.resolved = b.lo > 0 || b.hi < 0;
  b.sign = !b.resolved ? 0 : (b.lo > 0 ? 1 : -1);
  return b;
}

namespace {
// Grad-norm excursions of one run (the paper's stability count): logged steps after warmup
// whose norm is above 1 or not finite.
int grad_norm_excursions(const RunRecord& r) {
  int n = 0;
  for (size_t i = 0; i < r.step.size(); ++i)
    if (r.step[i] > r.warmup_steps && !(r.grad_norm[i] <= 1.0)) ++n;
  return n;
}
}  // namespace

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
    r.final_window_steps = s.contains("final_window_steps")
                               ? static_cast<int>(num(s, "final_window_steps", sp))
                               : std::max(1, r.steps / 10);
    r.tokens_per_s = num(s, "tokens_per_s", sp);
    r.tokens_per_step = s.value("tokens", int64_t{0}) / std::max(r.steps, 1);
    if (s.contains("machine_load") && s["machine_load"].is_object())
      r.busy_machine = s["machine_load"].value("busy", false);
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
      if (v.contains("window_nll")) {
        const json& wn = v.at("window_nll");
        if (!wn.is_array())
          throw UserError(ep.string() + ": results." + pol + ".window_nll is not an array");
        std::vector<double>& out = r.heldout_windows[pol];
        for (const json& x : wn) {
          if (!x.is_number() && !x.is_null())
            throw UserError(ep.string() + ": results." + pol + ".window_nll holds a non-number");
          out.push_back(x.is_null() ? kNaN : x.get<double>());
        }
      }
    }
  } else {
    r.heldout["none"] = num(s, "heldout_nll", sp);
    if (r.recipe != "fp32") r.heldout["current"] = num(s, "heldout_nll_quant", sp);
  }

  const fs::path tp = dir / "task.json";
  if (r.diverged_at == 0 && fs::exists(tp)) {
    const json t = read_json_file(tp);
    if (!t.contains("task") || !t["task"].is_string() || !t.contains("results") ||
        !t["results"].is_object())
      throw UserError(tp.string() + ": missing 'task' or object 'results' (expected `fp4train "
                      "eval --task ... --json` output)");
    r.task = t["task"].get<std::string>();
    if (!t.contains("items_fnv1a64") || !t["items_fnv1a64"].is_string() ||
        t["items_fnv1a64"].get<std::string>().empty())
      throw UserError(tp.string() + ": missing string 'items_fnv1a64' (the items' hash)");
    r.task_items_hash = t["items_fnv1a64"].get<std::string>();
    r.task_chance = num(t, "chance", tp);
    r.task_step = t.contains("step") && t["step"].is_number_integer() ? t["step"].get<int64_t>() : -1;
    const int64_t items = static_cast<int64_t>(num(t, "items", tp));
    for (const auto& [pol, v] : t["results"].items()) {
      RunRecord::TaskOutcome o;
      if (v.contains("accuracy") && !v["accuracy"].is_null()) {
        for (const char* k : {"correct", "correct_per_char"}) {
          if (!v.contains(k) || !v[k].is_string())
            throw UserError(tp.string() + ": results." + pol + ": missing string '" + k + "'");
          const std::string c = v[k].get<std::string>();
          std::string& dst = std::string(k) == "correct" ? o.correct : o.correct_per_char;
          dst = c;
          if (int64_t(c.size()) != items || c.find_first_not_of("01") != std::string::npos)
            throw UserError(tp.string() + ": results." + pol + "." + k + " is not " +
                            std::to_string(items) + " characters of 0 and 1");
          const double acc = double(std::count(c.begin(), c.end(), '1')) / double(items);
          const double said = num(v, std::string(k) == "correct" ? "accuracy" : "accuracy_per_char",
                                  tp);
          if (std::fabs(acc - said) > 1e-9)
            throw UserError(tp.string() + ": results." + pol + ": the accuracy " +
                            fmt("%.6f", said) + " disagrees with its outcomes " + k + " (" +
                            fmt("%.6f", acc) + ")");
        }
      }
      r.task_results[pol] = o;
    }
  }
  return r;
}

namespace {
// A completed run of `recipe` with seed `seed`, or null.
const RunRecord* find_run(const std::vector<RunRecord>& runs, const std::string& recipe,
                          uint64_t seed, bool completed_only = true) {
  for (const auto& r : runs)
    if (r.recipe == recipe && r.seed == seed && (!completed_only || r.diverged_at == 0)) return &r;
  return nullptr;
}

// Seeds (ascending) at which every recipe of the contrast has a run.
std::vector<uint64_t> common_seeds(const std::vector<RunRecord>& runs,
                                   const std::vector<std::pair<std::string, double>>& c,
                                   bool completed_only = true) {
  std::set<uint64_t> seeds;
  for (const auto& r : runs) seeds.insert(r.seed);
  std::vector<uint64_t> out;
  for (uint64_t s : seeds)
    if (std::all_of(c.begin(), c.end(),
                    [&](const auto& t) { return find_run(runs, t.first, s, completed_only); }))
      out.push_back(s);
  return out;
}

// d[s][w] = Σ coef · window NLL under `policy`, over the seeds where every recipe of the
// contrast has finite per-window values of the same length; empty when no seed has.
std::vector<std::vector<double>> window_differences(
    const std::vector<RunRecord>& runs, const std::vector<std::pair<std::string, double>>& c,
    const std::string& policy) {
  std::vector<std::vector<double>> d;
  for (uint64_t s : common_seeds(runs, c)) {
    std::vector<double> row;
    bool ok = true;
    for (const auto& [name, coef] : c) {
      const RunRecord* r = find_run(runs, name, s);
      const auto it = r->heldout_windows.find(policy);
      if (it == r->heldout_windows.end() || it->second.empty() ||
          (!row.empty() && it->second.size() != row.size())) {
        ok = false;
        break;
      }
      if (row.empty()) row.assign(it->second.size(), 0.0);
      for (size_t w = 0; w < row.size(); ++w) row[w] += coef * it->second[w];
    }
    if (ok && std::all_of(row.begin(), row.end(), [](double v) { return std::isfinite(v); }))
      d.push_back(std::move(row));
  }
  return d;
}
}  // namespace

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
                                      const std::string& baseline_arg,
                                      const std::string& bootstrap_policy) {
  std::vector<std::string> names = order;
  for (const auto& r : runs)
    if (std::find(names.begin(), names.end(), r.recipe) == names.end()) names.push_back(r.recipe);
  // The items every recipe's task row is measured on: those of most runs (ties: the first
  // seen), so one run on other items cannot take its recipe's row away.
  std::string task_hash;
  {
    std::map<std::string, int> count;
    std::vector<std::string> seen;
    for (const auto& r : runs)
      if (r.diverged_at == 0 && !r.task.empty()) {
        const std::string k = r.task + "\n" + r.task_items_hash;
        if (count[k]++ == 0) seen.push_back(k);
      }
    int best = 0;
    for (const auto& k : seen)
      if (count[k] > best) best = count[k], task_hash = k;
  }
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
      row.grad_norm_excursions += grad_norm_excursions(r);
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
        if (r.step[i] > 5 && std::isfinite(r.step_ms[i])) ms.push_back(r.step_ms[i]);
      }
    }
    if (!any) continue;
    row.final_loss = mean_std(fl);
    if (fl.empty()) row.final_loss.mean = kNaN;
    for (const auto& [p, v] : held) row.heldout[p] = mean_std(v);
    row.median_step_ms = median(ms);
    row.tokens_per_s = tokens_per_step * 1e3 / row.median_step_ms;
    row.timed_steps = int(ms.size());
    if (ms.size() >= 4) {
      std::vector<double> q = ms;
      std::sort(q.begin(), q.end());
      auto at = [&](double f) {  // linear interpolation between order statistics
        const double x = f * double(q.size() - 1);
        const size_t i = size_t(x);
        return i + 1 < q.size() ? q[i] + (x - double(i)) * (q[i + 1] - q[i]) : q[i];
      };
      row.step_spread = (at(0.75) - at(0.25)) / row.median_step_ms;
    }
    for (const auto& r : runs)
      if (r.recipe == name && r.busy_machine) ++row.busy_runs;
    // The downstream task: per policy, the 0/1 outcomes of every seed on the same items.
    std::map<std::string, std::vector<std::vector<double>>> raw, per_char;
    for (const auto& r : runs) {
      if (r.recipe != name || r.diverged_at > 0 || r.task.empty()) continue;
      if (r.task + "\n" + r.task_items_hash != task_hash) {
        ++row.task_excluded;
        continue;
      }
      row.task = r.task, row.task_items_hash = r.task_items_hash, row.task_chance = r.task_chance;
      for (const auto& [p, o] : r.task_results) {
        if (o.correct.empty()) continue;
        std::vector<double> a, b;
        for (char c : o.correct) a.push_back(c == '1');
        for (char c : o.correct_per_char) b.push_back(c == '1');
        raw[p].push_back(a), per_char[p].push_back(b);
      }
    }
    for (const auto& [p, v] : raw) {
      TaskRow t;
      t.seeds = int(v.size());
      t.items = int(v[0].size());
      t.raw = paired_bootstrap(v);
      t.per_char = paired_bootstrap(per_char[p]);
      row.task_rows[p] = t;
    }
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
    if (row.recipe != baseline) {
      const std::vector<std::vector<double>> dw =
          window_differences(runs, {{row.recipe, 1.0}, {baseline, -1.0}}, bootstrap_policy);
      if (!dw.empty()) row.heldout_boot = paired_bootstrap(dw);
    }
  }
  for (auto& r : rows) {
    r.baseline = baseline;
    r.gap_to_baseline_pct =
        base ? 100.0 * (r.final_loss.mean - base->final_loss.mean) / base->final_loss.mean : kNaN;
    r.step_ratio_fp32 = fp32 ? r.median_step_ms / fp32->median_step_ms : kNaN;
  }
  // Marks on timings that should not be read as measurements (a ratio inherits fp32's).
  auto own_note = [](const RecipeRow& r) {
    std::string n;
    auto add = [&](const std::string& x) { n += (n.empty() ? "" : ", ") + x; };
    if (r.busy_runs > 0) add("busy machine");
    if (r.timed_steps < 10) add(std::to_string(r.timed_steps) + " step" + (r.timed_steps == 1 ? "" : "s"));
    if (r.step_spread > 0.5) add(fmt("spread %.0f%%", 100 * r.step_spread));
    return n;
  };
  const std::string fp32_note = fp32 ? own_note(*fp32) : "";
  for (auto& r : rows) {
    r.timing_note = own_note(r);
    if (&r != fp32 && !fp32_note.empty() && fp32 && r.recipe != fp32->recipe)
      r.timing_note += (r.timing_note.empty() ? "fp32: " : "; fp32: ") + fp32_note;
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

// "[lo, hi] lower|higher|not resolved" of a bootstrap, or "—".
std::string boot_cell(const BootstrapInterval& b) {
  if (b.seeds == 0) return "—";
  return fmt("%+.4f", b.mean) + " [" + fmt("%+.4f", b.lo) + ", " + fmt("%+.4f", b.hi) + "] " +
         (b.sign < 0 ? "lower" : b.sign > 0 ? "higher" : "not resolved");
}
}  // namespace

namespace {
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
           window(windows.begin()->first.first, windows.begin()->first.second) +
           " of each run" + key + ".";
  std::string s = "mean training loss over the last steps of a run" + key + "; here the last ";
  bool first = true;
  for (const auto& [wn, count] : windows) {
    s += (first ? "" : ", ") + window(wn.first, wn.second) + " in " + std::to_string(count) +
         " run" + (count == 1 ? "" : "s");
    first = false;
  }
  return s + ".";
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
    << ", paired by seed | its 95% interval | held-out NLL (none) Δ vs " << bname
    << ", paired bootstrap over windows |";
  for (const auto& p : policies) o << " held-out NLL, " << p << " |";
  o << " diverged | loss spikes | grad norm > 1 after warmup | max grad norm after warmup | tokens/s | step time vs fp32 "
       "|\n|---|---|---|---|---|---|---|";
  for (size_t i = 0; i < policies.size(); ++i) o << "---|";
  o << "---|---|---|---|---|---|\n";
  bool partial_cells = false;
  for (const auto& r : rows) {
    o << "| " << r.recipe << " | " << r.seeds << " | " << fmt_ms(r.final_loss) << " | "
      << (std::isfinite(r.gap_to_baseline_pct) ? fmt("%+.2f%%", r.gap_to_baseline_pct) : "—") << " | "
      << (r.paired_delta_baseline.n ? fmt_ms(r.paired_delta_baseline, "%+.4f") : std::string("—"))
      << " | " << interval_cell(r, base) << " | " << boot_cell(r.heldout_boot) << " |";
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
      << fmt("%.0f", r.tokens_per_s) << " | " << fmt("%.2f×", r.step_ratio_fp32)
      << (r.timing_note.empty() ? "" : " (" + r.timing_note + ")") << " |\n";
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

  // The downstream task, when any run has one.
  std::string task, task_hash;
  double chance = 0;
  int excluded = 0;
  for (const auto& r : rows) {
    excluded += r.task_excluded;
    if (!r.task.empty() && task.empty()) task = r.task, task_hash = r.task_items_hash, chance = r.task_chance;
  }
  if (!task.empty()) {
    o << "\n## Downstream task: " << task << "\n\n"
      << "Accuracy under each inference policy, from each run's final checkpoint (task.json); "
         "chance is " << fmt("%.0f%%", 100 * chance) << ". Items fnv1a64 `" << task_hash << "`.\n\n"
      << "| recipe | seeds |";
    for (const auto& p : policies) o << " " << p << ", raw | " << p << ", per char |";
    o << "\n|---|---|";
    for (size_t i = 0; i < policies.size(); ++i) o << "---|---|";
    o << "\n";
    bool partial = false;
    for (const auto& r : rows) {
      if (r.task.empty()) continue;
      int seeds = 0;
      for (const auto& [p, t] : r.task_rows) seeds = std::max(seeds, t.seeds);
      o << "| " << r.recipe << " | " << seeds << " |";
      for (const auto& p : policies) {
        const auto it = r.task_rows.find(p);
        if (it == r.task_rows.end()) {
          o << " — | — |";
          continue;
        }
        const std::string n = it->second.seeds < seeds ? " (n=" + std::to_string(it->second.seeds) + ")" : "";
        partial |= !n.empty();
        for (const BootstrapInterval* b : {&it->second.raw, &it->second.per_char})
          o << " " << fmt("%.1f%%", 100 * b->mean) << " [" << fmt("%.1f", 100 * b->lo) << ", "
            << fmt("%.1f", 100 * b->hi) << "]" << n << " |";
      }
      o << "\n";
    }
    o << "\nRaw: the choice with the highest log-likelihood after the context; per char: "
         "log-likelihood divided by the choice's characters (OLMES). Accuracy pooled over the "
         "seeds' runs; 95% percentile bootstrap over items (10,000 resamples, the same items "
         "for every seed). An interval that contains the chance level is no evidence the "
         "model does the task. Recipes without a task.json are not listed.\n";
    if (partial)
      o << "\n(n=k): only k of the recipe's seeds have finite scores under this policy.\n";
    if (excluded > 0)
      o << "\n" << excluded << " run(s) hold a task.json of other items (another task, corpus "
           "or item rule) and are left out of this table.\n";
    for (const auto& r : runs)
      if (r.diverged_at == 0 && !r.task.empty() && r.task_step >= 0 && r.task_step != r.steps)
        o << "\nNote: the task accuracy of `" << r.dir.filename().string()
          << "` comes from its checkpoint at step " << r.task_step << ", not the final step "
          << r.steps << ".\n";
  }

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
       "t; needs n ≥ 2). *lower* / *higher*: the interval excludes 0, the recipe's loss is "
       "below / above the baseline's; *not resolved*: the interval contains 0.\n"
       "* **Paired bootstrap over windows**: the held-out NLL (FP32 inference, policy "
       "`none`) of the recipe minus the baseline's, per held-out window and seed; 10,000 "
       "resamples of the windows with replacement (the same windows for every seed, "
       "splitmix64 draws with a fixed seed), the mean over seeds and drawn windows; the "
       "interval is its 2.5% and 97.5% quantiles. It measures how much the figure depends on "
       "which text was held out, not how it varies with the training seed (the t-interval "
       "does that). Empty for evaluations written before per-window values were recorded.\n"
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
       "ratios, not absolute times. A ratio is marked, in parentheses, when it is not a "
       "measurement to rely on: *busy machine* (a run saw more runnable threads than cores, "
       "summary.json machine_load), *N steps* (fewer than 10 timed steps), *spread P%* (the "
       "interquartile range of the step times above half their median); *fp32: …* when the "
       "reference is.\n";
  return o.str();
}

std::vector<Hypothesis> load_hypotheses(const fs::path& file) {
  const std::string f = file.string();
  if (!fs::is_regular_file(file)) throw UserError(f + ": file not found (a study file of [[hypothesis]] tables)");
  toml::table t;
  try {
    t = toml::parse_file(f);
  } catch (const toml::parse_error& e) {
    throw UserError(f + ":" + std::to_string(e.source().begin.line) + ": malformed TOML: " +
                    std::string(e.description()));
  }
  const toml::array* arr = t["hypothesis"].as_array();
  if (!arr || !arr->is_array_of_tables() || arr->empty())
    throw UserError(f + ": no [[hypothesis]] tables");
  static const std::set<std::string> kKeys = {"id", "claim", "metric", "policy", "lower",
                                              "than", "contrast", "expect", "margin"};
  static const std::set<std::string> kMetrics = {"final_loss", "heldout_nll", "grad_norm_excursions"};
  std::vector<Hypothesis> out;
  std::set<std::string> ids;
  for (size_t i = 0; i < arr->size(); ++i) {
    const toml::table& h = *arr->at(i).as_table();
    std::string where = f + ": hypothesis " + std::to_string(i + 1);  // then by its id
    const std::string& at = where;
    for (const auto& [k, v] : h)
      if (!kKeys.count(std::string(k.str())))
        throw UserError(at + ": unknown key '" + std::string(k.str()) +
                        "' (keys: id, claim, metric, policy, lower, than, contrast, expect, margin)");
    auto str = [&](const char* key, bool required) -> std::string {
      const toml::node* n = h.get(key);
      if (!n) {
        if (required) throw UserError(at + ": missing string '" + key + "'");
        return "";
      }
      if (!n->is_string()) throw UserError(at + ": '" + key + "' must be a string");
      return std::string(*n->value<std::string>());
    };
    Hypothesis x;
    x.id = str("id", true);
    if (x.id.empty()) throw UserError(at + ": 'id' is empty");
    where = f + ": hypothesis " + x.id;
    if (!ids.insert(x.id).second) throw UserError(where + ": id is used twice");
    x.claim = str("claim", true);
    if (x.claim.empty()) throw UserError(where + ": 'claim' is empty");
    if (h.contains("metric")) x.metric = str("metric", true);
    if (!kMetrics.count(x.metric))
      throw UserError(where + ": metric '" + x.metric +
                      "' is not one of final_loss, heldout_nll, grad_norm_excursions");
    if (h.contains("policy")) {
      x.policy = str("policy", true);
      if (x.metric != "heldout_nll")
        throw UserError(where + ": 'policy' goes with metric = \"heldout_nll\", not " + x.metric);
      try {
        x.policy = parse_eval_policy(x.policy).name();
      } catch (const UserError& e) {
        throw UserError(where + ": " + e.what());
      }
    }
    const bool pair = h.contains("lower") || h.contains("than");
    if (pair == h.contains("contrast"))
      throw UserError(where + ": give either lower = \"A\" with than = \"B\", or contrast = { ... }");
    if (pair) {
      const std::string a = str("lower", true), b = str("than", true);
      if (a == b) throw UserError(where + ": lower and than name the same recipe '" + a + "'");
      if (h.contains("expect")) throw UserError(where + ": 'expect' goes with 'contrast', not lower/than");
      x.contrast = {{a, 1.0}, {b, -1.0}};
      x.expect = -1;
    } else {
      const toml::table* c = h.get("contrast")->as_table();
      if (!c || c->empty()) throw UserError(where + ": 'contrast' must be a non-empty table of recipe = coefficient");
      bool nonzero = false;
      // toml++ keeps keys sorted; list them in the file's order (their source positions).
      std::vector<std::pair<std::string, const toml::node*>> entries;
      for (const auto& [k, v] : *c) entries.emplace_back(std::string(k.str()), &v);
      std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
        const auto &pa = a.second->source().begin, &pb = b.second->source().begin;
        return pa.line != pb.line ? pa.line < pb.line : pa.column < pb.column;
      });
      for (const auto& [key, node] : entries) {
        const toml::node& v = *node;
        const std::string_view k = key;
        const std::optional<double> coef = v.value<double>();
        if (!coef || !std::isfinite(*coef) || !(v.is_floating_point() || v.is_integer()))
          throw UserError(where + ": contrast." + std::string(k) + " must be a finite number");
        nonzero |= *coef != 0;
        x.contrast.emplace_back(std::string(k), *coef);
      }
      if (!nonzero) throw UserError(where + ": every coefficient of 'contrast' is 0");
      double sum = 0, mag = 0;
      for (const auto& [n, c] : x.contrast) {
        sum += c;
        mag += std::fabs(c);
      }
      if (std::fabs(sum) > 1e-9 * mag)
        throw UserError(where + ": the coefficients of 'contrast' sum to " + fmt("%g", sum) +
                        ", not 0 (a contrast compares recipes: e.g. { A = 1, B = -1 })");
      const std::string e = str("expect", true);
      if (e == "negative") x.expect = -1;
      else if (e == "positive") x.expect = 1;
      else if (e == "equivalent") x.expect = 0;
      else throw UserError(where + ": expect must be \"negative\", \"positive\" or \"equivalent\", not '" + e + "'");
    }
    if (h.contains("margin")) {
      const std::optional<double> m = h.get("margin")->value<double>();
      if (x.expect != 0) throw UserError(where + ": 'margin' goes with expect = \"equivalent\"");
      if (!m || !(*m > 0) || !std::isfinite(*m))
        throw UserError(where + ": margin must be a finite number > 0");
      x.margin = *m;
    } else if (x.expect == 0) {
      throw UserError(where + ": expect = \"equivalent\" needs margin = m > 0 (the largest |contrast| that counts as little)");
    }
    out.push_back(std::move(x));
  }
  return out;
}

namespace {
// The hypothesis' metric of one run (NaN when it has none).
double metric_of(const Hypothesis& h, const RunRecord& r) {
  if (h.metric == "final_loss") return r.final_window_loss;
  if (h.metric == "heldout_nll") {
    const auto it = r.heldout.find(h.policy);
    return it == r.heldout.end() ? kNaN : it->second;
  }
  return grad_norm_excursions(r);
}
}  // namespace

Verdict judge_hypothesis(const Hypothesis& h, const std::vector<RunRecord>& runs) {
  Verdict v;
  const bool completed_only = h.metric != "grad_norm_excursions";
  std::string missing;
  for (const auto& [name, coef] : h.contrast)
    if (std::none_of(runs.begin(), runs.end(), [&](const RunRecord& r) {
          return r.recipe == name && (!completed_only || r.diverged_at == 0);
        }))
      missing += (missing.empty() ? "" : ", ") + name;
  if (!missing.empty()) {
    v.verdict = "not run";
    v.why = "no completed run of " + missing;
    return v;
  }
  for (uint64_t s : common_seeds(runs, h.contrast, completed_only)) {
    double c = 0;
    for (const auto& [name, coef] : h.contrast)
      c += coef * metric_of(h, *find_run(runs, name, s, completed_only));
    if (std::isfinite(c)) v.per_seed.push_back(c);
  }
  v.contrast = mean_std(v.per_seed);
  v.t95 = paired_interval(v.contrast);
  if (h.metric == "heldout_nll") {
    const auto d = window_differences(runs, h.contrast, h.policy);
    if (!d.empty()) v.boot = paired_bootstrap(d);
  }
  v.verdict = "not resolved";
  if (h.expect == 0 && v.per_seed.size() >= 2) {
    // Equivalence: both intervals inside (−m, m) supports; one wholly outside contradicts.
    const double m = h.margin;
    auto inside = [m](double lo, double hi) { return lo > -m && hi < m; };
    auto outside = [m](double lo, double hi) { return lo > m || hi < -m; };
    const bool boot = h.metric == "heldout_nll";
    if (v.contrast.std == 0) {
      v.why = "the same value on every seed: a zero-width t-interval says nothing about the spread";
    } else if (boot && v.boot.seeds == 0) {
      v.why = "no per-window held-out values for the bootstrap";
    } else if (inside(v.t95.lo, v.t95.hi) && (!boot || inside(v.boot.lo, v.boot.hi))) {
      v.verdict = "supported";
    } else if (outside(v.t95.lo, v.t95.hi) || (boot && outside(v.boot.lo, v.boot.hi))) {
      v.verdict = "contradicted";
    } else {
      v.why = "an interval reaches past ±" + fmt("%g", m);
    }
    return v;
  }
  if (v.per_seed.size() < 2) {
    v.why = v.per_seed.empty() ? "no seed where every recipe has a value"
                               : "one seed: no interval over seeds";
    return v;
  }
  int sign = v.t95.sign;
  if (h.metric == "heldout_nll") {
    if (v.boot.seeds == 0) {
      v.why = v.t95.resolved ? "no per-window held-out values for the bootstrap"
                             : "the t-interval over seeds contains 0 (and no per-window held-out "
                               "values for the bootstrap)";
      return v;
    }
    if (v.boot.sign != sign) {
      v.why = v.t95.resolved ? "the bootstrap over windows contains 0"
                             : "the t-interval over seeds contains 0";
      return v;
    }
  }
  if (!v.t95.resolved) {
    v.why = "the t-interval over seeds contains 0";
    return v;
  }
  if (v.contrast.std == 0) {
    v.why = "the same value on every seed: a zero-width t-interval says nothing about the spread";
    return v;
  }
  v.verdict = sign == h.expect ? "supported" : "contradicted";
  return v;
}

std::string hypotheses_md(const std::vector<Hypothesis>& hs, const std::vector<RunRecord>& runs) {
  std::ostringstream o;
  o << "\n## Hypotheses\n\n"
       "| id | claim | metric | contrast (claim: its sign) | per seed | mean | 95% t-interval over "
       "seeds | paired bootstrap over windows | verdict |\n"
       "|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& h : hs) {
    const Verdict v = judge_hypothesis(h, runs);
    std::string c;
    for (const auto& [name, coef] : h.contrast) {
      const std::string mag = std::fabs(coef) == 1 ? "" : fmt("%g·", std::fabs(coef));
      c += (c.empty() ? (coef < 0 ? "−" : "") : (coef < 0 ? " − " : " + ")) + mag + "`" + name + "`";
    }
    c += h.expect < 0 ? " < 0" : h.expect > 0 ? " > 0" : " within ±" + fmt("%g", h.margin);
    std::string ps;
    const char* f = h.metric == "grad_norm_excursions" ? "%+.0f" : "%+.4f";
    for (double x : v.per_seed) ps += (ps.empty() ? "" : ", ") + fmt(f, x);
    std::string claim = h.claim;  // Markdown table cell: no '|' or line break
    for (size_t p = 0; (p = claim.find_first_of("|\n\r", p)) != std::string::npos;) {
      if (claim[p] == '|') {
        claim.insert(p, "\\");
        p += 2;
      } else {
        claim[p++] = ' ';
      }
    }
    o << "| " << h.id << " | " << claim << " | " << h.metric
      << (h.metric == "heldout_nll" ? " (" + h.policy + ")" : "") << " | " << c << " | "
      << (ps.empty() ? "—" : ps) << " | "
      // A mean of counts is not a count ("-0" for −1/3): two decimals, as its interval.
      << (v.contrast.n ? fmt(h.metric == "grad_norm_excursions" ? "%+.2f" : "%+.4f", v.contrast.mean) : "—")
      << " | "
      << (v.t95.n >= 2 ? "[" + fmt(h.metric == "grad_norm_excursions" ? "%+.2f" : "%+.4f", v.t95.lo) + ", " +
                             fmt(h.metric == "grad_norm_excursions" ? "%+.2f" : "%+.4f", v.t95.hi) + "]"
                       : "—")
      << " | " << (h.metric == "heldout_nll" ? boot_cell(v.boot) : "—") << " | **" << v.verdict
      << "**" << (v.why.empty() ? "" : " (" + v.why + ")") << " |\n";
  }
  o << "\nEach claim is a contrast of recipes, evaluated per seed (the seeds where every recipe "
       "of it has a run). *Supported*: the 95% t-interval over seeds excludes 0 on the side "
       "the claim expects (for held-out NLL, the paired bootstrap over windows must also "
       "exclude 0 on that side); *contradicted*: it excludes 0 on the other side; *not "
       "resolved*: an interval contains 0, or fewer than 2 seeds; *not run*: a recipe of the "
       "contrast has no completed run. An equivalence claim (\"within ±m\") is supported when "
       "the intervals lie inside (−m, m) and contradicted when one lies wholly outside it "
       "(two one-sided tests). Grad-norm excursions are counts per run.\n";
  return o.str();
}

std::string hypotheses_json(const std::vector<Hypothesis>& hs, const std::vector<RunRecord>& runs) {
  using nlohmann::json;
  auto num = [](double x) { return std::isfinite(x) ? json(x) : json(nullptr); };
  json out = json::array();
  for (const auto& h : hs) {
    const Verdict v = judge_hypothesis(h, runs);
    json c = json::object();
    for (const auto& [name, coef] : h.contrast) c[name] = coef;
    json per = json::array();
    for (double x : v.per_seed) per.push_back(num(x));
    json j{{"id", h.id},
           {"claim", h.claim},
           {"metric", h.metric},
           {"contrast", c},
           {"expect", h.expect < 0 ? "negative" : h.expect > 0 ? "positive" : "equivalent"},
           {"per_seed", per},
           {"verdict", v.verdict},
           {"why", v.why}};
    if (h.metric == "heldout_nll") j["policy"] = h.policy;
    if (h.expect == 0) j["margin"] = h.margin;
    if (v.contrast.n) j["mean"] = num(v.contrast.mean);
    if (v.t95.n >= 2) j["t95"] = {num(v.t95.lo), num(v.t95.hi)};
    if (h.metric == "heldout_nll" && v.boot.seeds > 0)
      j["bootstrap95"] = {{"lo", num(v.boot.lo)}, {"hi", num(v.boot.hi)}, {"seeds", v.boot.seeds},
                          {"windows", v.boot.windows}, {"resamples", v.boot.resamples}};
    out.push_back(j);
  }
  return out.dump(2) + "\n";
}

}  // namespace fp4
