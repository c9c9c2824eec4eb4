// Hypotheses of a study file (fp4/study/report.h): parsing, verdicts from the runs, and
// their Markdown and JSON.
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
  static const std::set<std::string> kMetrics = {"final_loss", "heldout_nll", "heldout_nll_last",
                                                 "grad_norm_excursions"};
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
                      "' is not one of final_loss, heldout_nll, heldout_nll_last, grad_norm_excursions");
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

namespace report_detail {
// The hypothesis' metric of one run (NaN when it has none).
double metric_of(const Hypothesis& h, const RunRecord& r) {
  if (h.metric == "final_loss") return r.final_window_loss;
  if (h.metric == "heldout_nll_last") return r.heldout_last;
  if (h.metric == "heldout_nll") {
    const auto it = r.heldout.find(h.policy);
    return it == r.heldout.end() ? kNaN : it->second;
  }
  return grad_norm_excursions(r);
}
}  // namespace report_detail

namespace {
Verdict judge_paired(const Hypothesis& h, const std::vector<RunRecord>& runs, int* mixed_cpu);
}  // namespace

Verdict judge_hypothesis(const Hypothesis& h, const std::vector<RunRecord>& runs) {
  int mixed = 0;
  Verdict v = judge_paired(h, runs, &mixed);
  if (mixed > 0)
    v.why += std::string(v.why.empty() ? "" : "; ") + std::to_string(mixed) +
             " seed(s) left out: their runs were made on different CPUs";
  return v;
}

namespace {
Verdict judge_paired(const Hypothesis& h, const std::vector<RunRecord>& runs, int* mixed_out) {
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
  for (uint64_t s : common_seeds(runs, h.contrast, completed_only, mixed_out)) {
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
}  // namespace

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
       "(two one-sided tests). Grad-norm excursions are counts per run. `heldout_nll_last`: "
       "the mean held-out NLL (FP32 inference) of the run's last " << kLastEvals << " evaluations "
       "during training (metrics.jsonl val_nll, the same held-out windows each time): it "
       "averages two points of the trajectory, so one end point's fluctuation weighs less, "
       "but it mixes in an earlier point (on configs/study.toml, step 300, before the LR decay "
       "of steps 320-400). It is not checkpoint (weight) averaging (arXiv 2508.13144), which "
       "fp4train does not do.\n";
  // Power: seeds for a ±0.005-nat interval at the measured paired spread.
  bool any = false;
  std::ostringstream p;
  p << "\n### Power\n\nSeeds for a 95% t-interval of ±" << fmt("%g", kPowerHalfWidth)
    << " nats at each contrast's measured paired std over seeds (the smallest n with "
       "t₀.₉₇₅,ₙ₋₁ · std / √n ≤ " << fmt("%g", kPowerHalfWidth) << "; the std itself is "
       "uncertain with few seeds).\n\n"
       "| id | metric | seeds | paired std | 95% half-width now | seeds for ±" << fmt("%g", kPowerHalfWidth) << " |\n"
       "|---|---|---|---|---|---|\n";
  for (const auto& h : hs) {
    if (h.metric == "grad_norm_excursions") continue;
    const Verdict v = judge_hypothesis(h, runs);
    if (v.contrast.n < 2) continue;
    any = true;
    p << "| " << h.id << " | " << h.metric << " "
      << power_cells(v.contrast.n, v.contrast.std, (v.t95.hi - v.t95.lo) / 2, kPowerHalfWidth)
      << "\n";
  }
  if (any) o << p.str();
  return o.str();
}

int seeds_for_half_width(double sd, double half_width) {
  if (!std::isfinite(sd) || sd < 0 || !(half_width > 0)) return 0;
  for (int n = 2; n <= 100000; ++n)
    if (t_quantile_975(n - 1) * sd / std::sqrt(double(n)) <= half_width) return n;
  return 100000;
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
