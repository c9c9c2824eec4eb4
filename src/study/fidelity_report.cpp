// The fidelity panel's report (docs/fidelity.md "Output"): fidelity.json and fidelity.md from a
// FidelityPanel, each section written by a function of its own, with the contrasts and claims'
// verdicts (docs/fidelity.md "Statistics"); and the panel read back from fidelity.json
// (load_fidelity_panel, `fidelity --from`).
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "fidelity_internal.h"
#include "fp4/base/error.h"
#include "fp4/base/safetensors.h"
#include "fp4/study/fidelity.h"

namespace fp4 {
namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace fidelity_detail;

namespace {
using Grid = std::vector<std::vector<double>>;  // [checkpoint][batch]

json interval_json(const Interval& i) { return {{"mean", i.mean}, {"lo", i.lo}, {"hi", i.hi}}; }

// The mean of a [c][k] grid's finite values (a parameter whose g* is 0 on a batch gives 0/0
// there); NaN when none is finite. Per-parameter and per-linear figures are stored as these
// means only: intervals for each would bloat the file.
double finite_mean(const Grid& x) {
  double t = 0;
  int n = 0;
  for (const auto& row : x)
    for (double v : row)
      if (std::isfinite(v)) t += v, ++n;
  return n ? t / n : std::nan("");
}
json mean_json(const Grid& x) {
  const double m = finite_mean(x);
  return std::isnan(m) ? json(nullptr) : json(m);
}

std::string fmt(double v, int prec = 4) {
  char b[64];
  const double a = std::fabs(v);
  if (v != 0 && (a < 1e-3 || a >= 1e5))
    std::snprintf(b, sizeof b, "%.*e", prec - 1, v);
  else
    std::snprintf(b, sizeof b, "%.*f", prec, v);
  return b;
}
std::string fmt_iv(const Interval& i) {
  return fmt(i.mean) + " [" + fmt(i.lo) + ", " + fmt(i.hi) + "]";
}

// The report's two-level bootstrap (FidelityRequest::resamples and bootstrap_seed).
struct Boot {
  int resamples;
  uint64_t seed;
  Interval operator()(const Grid& x) const { return bootstrap_two_level(x, resamples, seed); }
};

// ------------------------------------------------------------------------------ reading back

// A grid of C checkpoints × K batches, or an error naming `what` in file `w`.
void check_grid(const Grid& g, size_t C, size_t K, const std::string& w, const std::string& what) {
  if (g.size() != C)
    throw UserError(w + ": " + what + " holds " + std::to_string(g.size()) +
                    " checkpoints, expected " + std::to_string(C));
  for (const auto& row : g)
    if (row.size() != K)
      throw UserError(w + ": " + what + " holds a row of " + std::to_string(row.size()) +
                      " batches, expected " + std::to_string(K));
}

// The panel's description and exact side (fidelity.json's top-level keys and samples' exact_*).
FidelityPanel read_description(const json& j, const std::string& w) {
  FidelityPanel P;
  P.run = j.at("run").get<std::string>();
  P.config_name = j.value("config", "");
  P.steps = j.at("checkpoints").get<std::vector<int64_t>>();
  P.batches = j.at("batches").get<int>();
  P.draws = j.at("draws").get<int>();
  P.tokens_per_batch = j.at("tokens_per_batch").get<int>();
  P.seed = j.at("seed").get<uint64_t>();
  P.cpu = j.value("cpu", "");
  P.seconds = j.value("seconds", 0.0);
  if (j.contains("linear_names"))
    P.linear_names = j["linear_names"].get<std::vector<std::string>>();
  P.references = j.value("references", "");
  P.warnings = j.value("warnings", std::vector<std::string>{});  // none in older panels
  if (j.contains("stress")) {
    P.stress_factor = j["stress"].at("factor").get<double>();
    P.stress_channels = j["stress"].at("channels").get<std::vector<int>>();
    P.stress_loss_diff = j["stress"].at("exact_loss_max_abs_diff").get<double>();
    P.stress_grad_diff = j["stress"].at("exact_grad_max_abs_diff").get<double>();
    P.stress_roles_diff = j["stress"].value("exact_roles_max_abs_diff", 0.0);
  }
  P.sgd_var = j.at("exact").at("sgd_variance_by_checkpoint").get<std::vector<double>>();
  if (j.contains("bootstrap")) {
    P.resamples = j["bootstrap"].value("resamples", 0);
    P.bootstrap_seed = j["bootstrap"].value("seed", uint64_t{0});
  }
  const json& smp = j.at("samples");
  P.exact_loss = smp.at("exact_loss").get<Grid>();
  P.exact_grad_norm = smp.at("exact_grad_norm").get<Grid>();
  const size_t C = P.steps.size(), K = size_t(P.batches);
  check_grid(P.exact_loss, C, K, w, "samples.exact_loss");
  check_grid(P.exact_grad_norm, C, K, w, "samples.exact_grad_norm");
  return P;
}

// One recipe of fidelity.json (`r`, with its samples in `smp`) into P: its refresh steps, scale
// events, the samples of whole, linears and the role scopes, the means per linear and parameter
// (the first recipe also gives P.param_names).
void read_recipe(const json& r, const json& smp, FidelityPanel& P, const std::string& w) {
  const size_t C = P.steps.size(), K = size_t(P.batches);
  FidelityRecipe fr;
  fr.name = r.at("name").get<std::string>();
  fr.has_sr = r.at("has_sr").get<bool>();
  P.refresh_steps.push_back(r.value("refresh_steps", std::vector<int64_t>(C, 0)));
  if (r.contains("scale_events"))
    fr.scale_events = r["scale_events"].get<std::map<std::string, std::map<std::string, double>>>();
  if (r.contains("block_amax_by_linear"))
    fr.block_amax_by_linear =
        r["block_amax_by_linear"].get<std::map<std::string, std::map<std::string, std::map<std::string, double>>>>();
  const json& rs = smp.at("recipes").at(fr.name);
  auto read_samples = [&](const json& ms, const std::string& scope, const std::string& what) {
    for (const auto& [m, g] : ms.items()) {
      auto grid = g.get<Grid>();
      check_grid(grid, C, K, w, what + "." + m);
      fr.scopes[scope][m] = std::move(grid);
    }
  };
  for (const char* scope : {"whole", "linears"})
    read_samples(rs.at(scope), scope, "samples." + fr.name + "." + scope);
  if (!P.linear_names
           .empty()) {  // per-linear roles: samples of the concatenated scopes, means per linear
    for (const char* key : kLinearRoleScopes)
      read_samples(rs.at("roles").at(key), key, "samples." + fr.name + ".roles." + key);
    for (const std::string& ln : P.linear_names)
      for (const char* key : kLinearRoleScopes)
        for (const auto& [m, v] : r.at("linear_roles").at(ln).at(key).items())
          fr.scopes[ln + ":" + key][m] = {{v.is_number() ? v.get<double>() : std::nan("")}};
  }
  // Per-parameter figures are stored as means only: one value per metric.
  const bool first = P.recipes.empty();
  for (const auto& [pn, ms] : r.at("params").items()) {
    if (first) P.param_names.push_back(pn);
    for (const auto& [m, v] : ms.items())
      fr.scopes[pn][m] = {{v.is_number() ? v.get<double>() : std::nan("")}};
  }
  P.recipes.push_back(std::move(fr));
}
}  // namespace

FidelityPanel load_fidelity_panel(const fs::path& file) {
  const std::string w = "fidelity: " + file.string();
  std::ifstream in(file, std::ios::binary);
  if (!in) throw UserError(w + ": cannot be read");
  std::stringstream text;
  text << in.rdbuf();
  json j;
  try {
    j = json::parse(text.str());
  } catch (const json::exception& e) {
    throw UserError(w + ": not JSON (" + std::string(e.what()) + ")");
  }
  try {
    if (j.value("format", "") != "fp4train.fidelity.v1")
      throw UserError(w + ": not a fidelity.json (format " +
                      j.value("format", std::string("missing")) + ")");
    if (!j.contains("samples"))
      throw UserError(
          w + ": holds no per-batch samples (written before they were stored); rerun the panel");
    FidelityPanel P = read_description(j, w);
    for (const json& r : j.at("recipes")) read_recipe(r, j.at("samples"), P, w);
    if (P.recipes.empty()) throw UserError(w + ": holds no recipes");
    P.params_means_only = true;
    return P;
  } catch (const json::exception& e) {
    throw UserError(w + ": malformed (" + std::string(e.what()) + ")");
  }
}

namespace {
// ------------------------------------------------------------------------------ fidelity.json

// Every value must be finite (run_fidelity refuses non-finite gradients and losses); a
// parameter whose exact gradient is 0 on a batch (e.g. an unused embedding row block) gives
// 0/0 ratios, which the per-parameter means skip (finite_mean), so only whole, linears and the
// role scopes are checked.
void check_finite_samples(const FidelityPanel& P) {
  std::vector<std::string> checked = {"whole", "linears"};
  if (!P.linear_names.empty())
    checked.insert(checked.end(), std::begin(kLinearRoleScopes), std::end(kLinearRoleScopes));
  for (const FidelityRecipe& fr : P.recipes)
    for (const std::string& scope : checked)
      for (const auto& [m, x] : fr.scopes.at(scope))
        for (size_t c = 0; c < x.size(); ++c)
          for (size_t k = 0; k < x[c].size(); ++k)
            if (!std::isfinite(x[c][k]))
              throw UserError("fidelity: recipe " + fr.name + ": " + scope + " " + m + " is " +
                              std::to_string(x[c][k]) + " at checkpoint " +
                              std::to_string(P.steps[c]) + ", batch " + std::to_string(k + 1));
}

// The panel's description, the bootstrap and the exact side.
json description_json(const FidelityPanel& P, const Boot& boot) {
  json j;
  j["format"] = "fp4train.fidelity.v1";
  j["run"] = P.run;
  j["config"] = P.config_name;
  j["checkpoints"] = P.steps;
  j["batches"] = P.batches;
  j["draws"] = P.draws;
  j["tokens_per_batch"] = P.tokens_per_batch;
  j["seed"] = P.seed;
  j["references"] = P.references;
  j["warnings"] = P.warnings;
  if (P.stress_factor != 1) {
    j["stress"] = {{"factor", P.stress_factor},
                   {"channels", P.stress_channels},
                   {"exact_loss_max_abs_diff", P.stress_loss_diff},
                   {"exact_grad_max_abs_diff", P.stress_grad_diff}};
    if (!P.linear_names.empty()) j["stress"]["exact_roles_max_abs_diff"] = P.stress_roles_diff;
  }
  j["bootstrap"] = {{"resamples", boot.resamples},
                    {"seed", boot.seed},
                    {"method",
                     "two-level: checkpoints with replacement, then batches with replacement "
                     "within each drawn checkpoint; 95% percentile interval"}};
  j["cpu"] = P.cpu;
  j["seconds"] = P.seconds;
  if (!P.linear_names.empty()) j["linear_names"] = P.linear_names;
  j["exact"] = {{"loss", interval_json(boot(P.exact_loss))},
                {"grad_norm", interval_json(boot(P.exact_grad_norm))},
                {"sgd_variance_by_checkpoint", P.sgd_var}};
  return j;
}

// A recipe's whole or linears scope: every metric's interval; whole also grad_to_qnoise.
json scope_json(const FidelityRecipe& fr, const std::string& scope, const Boot& boot) {
  json s;
  for (const auto& [m, x] : fr.scopes.at(scope)) s[m] = interval_json(boot(x));
  if (scope == "whole") {  // ‖g*‖/σ_q ("FP4 All the Way"): the reciprocal
    const Interval q = boot(fr.scopes.at("whole").at("qnoise_to_grad"));
    auto inv = [](double v) { return v > 0 ? json(1.0 / v) : json(nullptr); };  // null: +∞
    s["grad_to_qnoise"] = {{"mean", inv(q.mean)}, {"lo", inv(q.hi)}, {"hi", inv(q.lo)}};
  }
  return s;
}

// Per parameter: the means of kMeanMetrics.
json params_json(const FidelityPanel& P, const FidelityRecipe& fr) {
  json params = json::object();
  for (const std::string& pn : P.param_names) {
    json s;
    for (const char* m : kMeanMetrics) s[m] = mean_json(fr.scopes.at(pn).at(m));
    params[pn] = s;
  }
  return params;
}

// Per-linear roles: concatenated over linears with intervals ("roles"); per linear, means
// ("linear_roles").
void add_roles_json(const FidelityPanel& P, const FidelityRecipe& fr, const Boot& boot, json& r) {
  json ro, lr = json::object();
  for (const char* key : kLinearRoleScopes)
    for (const char* m : kMeanMetrics) ro[key][m] = interval_json(boot(fr.scopes.at(key).at(m)));
  for (const std::string& ln : P.linear_names)
    for (const char* key : kLinearRoleScopes)
      for (const char* m : kMeanMetrics)
        lr[ln][key][m] = mean_json(fr.scopes.at(ln + ":" + key).at(m));
  r["roles"] = ro;
  r["linear_roles"] = lr;
}

// Per checkpoint: the whole scope's means over the batches.
json by_checkpoint_json(const FidelityPanel& P, const FidelityRecipe& fr) {
  json byc = json::array();
  for (size_t c = 0; c < P.steps.size(); ++c) {
    json e;
    e["step"] = P.steps[c];
    for (const char* m : {"rel_error", "bias2", "variance", "loss_penalty", "sgd_noise_fraction"}) {
      const auto& row = fr.scopes.at("whole").at(m)[c];
      double t = 0;
      for (double v : row) t += v;
      e[m] = t / double(row.size());
    }
    byc.push_back(e);
  }
  return byc;
}

// Recipe r of the panel.
json recipe_json(const FidelityPanel& P, size_t r, const Boot& boot) {
  const FidelityRecipe& fr = P.recipes[r];
  json j;
  j["name"] = fr.name;
  j["has_sr"] = fr.has_sr;
  j["draws"] = fr.has_sr ? P.draws : 1;
  j["refresh_steps"] = P.refresh_steps[r];
  j["scale_events"] = fr.scale_events;
  if (!fr.block_amax_by_linear.empty()) j["block_amax_by_linear"] = fr.block_amax_by_linear;
  for (const char* scope : {"whole", "linears"}) j[scope] = scope_json(fr, scope, boot);
  j["params"] = params_json(P, fr);
  if (!P.linear_names.empty()) add_roles_json(P, fr, boot, j);
  j["by_checkpoint"] = by_checkpoint_json(P, fr);
  return j;
}

// The per-(checkpoint, batch) values of the exact side and of every recipe's whole, linears
// and role scopes: load_fidelity_panel rebuilds the panel from them (`fidelity --from`), so
// reports and claims can be redone from the committed file without rerunning the passes.
json samples_json(const FidelityPanel& P) {
  json smp;
  smp["exact_loss"] = P.exact_loss;
  smp["exact_grad_norm"] = P.exact_grad_norm;
  json rs = json::object();
  for (const FidelityRecipe& fr : P.recipes) {
    json r;
    for (const char* scope : {"whole", "linears"}) r[scope] = fr.scopes.at(scope);
    if (!P.linear_names.empty())
      for (const char* key : kLinearRoleScopes) r["roles"][key] = fr.scopes.at(key);
    rs[fr.name] = r;
  }
  smp["recipes"] = rs;
  return smp;
}

// ------------------------------------------------------------------------------ contrasts

using Terms = std::vector<std::pair<const FidelityRecipe*, double>>;  // (recipe, coefficient)

// "a − b", "−fp32 + 2.00·x − y": the terms as text.
std::string contrast_label(const Terms& terms) {
  std::string label;
  for (const auto& [fr, coef] : terms) {
    const bool unit = std::fabs(std::fabs(coef) - 1.0) == 0.0;
    label += (label.empty() ? (coef < 0 ? "−" : "") : (coef < 0 ? " − " : " + ")) +
             (unit ? "" : fmt(std::fabs(coef), 2) + "·") + fr->name;
  }
  return label;
}

// Σ coefficient × metric per (checkpoint, batch).
Grid contrast_samples(const Terms& terms, const std::string& scope, const std::string& metric) {
  Grid x;
  for (const auto& [fr, coef] : terms) {
    const auto& v = fr->scopes.at(scope).at(metric);
    if (x.empty()) x.assign(v.size(), std::vector<double>(v[0].size(), 0.0));
    for (size_t c = 0; c < v.size(); ++c)
      for (size_t k = 0; k < v[c].size(); ++k) x[c][k] += coef * v[c][k];
  }
  return x;
}

// expect "lower" / "higher" (the sum below / above 0) or "within" (|sum| ≤ bound); none: the
// interval's side of 0.
std::string contrast_verdict(const Interval& iv, const std::string& expect, double bound) {
  const bool resolved = iv.lo > 0 || iv.hi < 0;
  if (expect == "within")  // supported: the interval inside ±bound; contradicted: outside it
    return iv.lo >= -bound && iv.hi <= bound ? "supported"
           : iv.lo > bound || iv.hi < -bound ? "contradicted"
                                             : "not resolved";
  if (!expect.empty() && resolved)
    return (expect == "lower") == (iv.hi < 0) ? "supported" : "contradicted";
  return resolved ? (iv.hi < 0 ? "below 0" : "above 0") : "not resolved";
}

// The report's contrasts: each bootstrapped, with its verdict, as JSON entries and markdown rows.
struct Contrasts {
  explicit Contrasts(const Boot& b) : boot(b) {}
  Boot boot;
  json entries = json::array();
  std::vector<std::string> md_rows;

  void add(const std::string& id, const Terms& terms, const std::string& scope,
           const std::string& metric, const std::string& expect, double bound,
           const std::string& text) {
    const std::string label = contrast_label(terms);
    json jt = json::object();
    for (const auto& [fr, coef] : terms) jt[fr->name] = coef;
    const Interval iv = boot(contrast_samples(terms, scope, metric));
    const std::string verdict = contrast_verdict(iv, expect, bound);
    json c = {{"id", id},       {"contrast", label}, {"terms", jt},
              {"scope", scope}, {"metric", metric},  {"mean", iv.mean},
              {"lo", iv.lo},    {"hi", iv.hi},       {"verdict", verdict}};
    if (terms.size() == 2 && terms[0].second == 1.0 && terms[1].second == -1.0)
      c["a"] = terms[0].first->name, c["b"] = terms[1].first->name;
    if (!text.empty()) c["claim"] = text;
    if (expect == "within")
      c["expect"] = "|contrast| <= " + fmt(bound);
    else if (!expect.empty())
      c["expect"] = expect == "lower" ? "contrast < 0" : "contrast > 0";
    entries.push_back(c);
    md_rows.push_back("| " + id + " | " + label + " | " + scope + " " + metric + " | " +
                      fmt_iv(iv) + " | " + verdict + " |");
  }
};

// Each recipe minus the first on rel_error, bias2, variance and loss_penalty.
void recipe_contrasts(const FidelityPanel& P, Contrasts& out) {
  for (size_t r = 1; r < P.recipes.size(); ++r)
    for (const char* m : {"rel_error", "bias2", "variance", "loss_penalty"})
      out.add(P.recipes[r].name + "-vs-" + P.recipes[0].name,
              {{&P.recipes[r], 1.0}, {&P.recipes[0], -1.0}}, "whole", m, "", 0, "");
}

const FidelityRecipe* find_recipe(const FidelityPanel& P, const std::string& name) {
  for (const auto& fr : P.recipes)
    if (fr.name == name) return &fr;
  return nullptr;
}

// The claims of `file`: a claim naming a recipe the panel did not run is skipped with a note
// on stderr; a scope or metric the panel lacks is refused.
void claim_contrasts(const FidelityPanel& P, const fs::path& file, Contrasts& out) {
  for (const Claim& cl : load_claims(file)) {
    Terms terms;
    std::string absent;
    for (const auto& [name, coef] : cl.terms) {
      const FidelityRecipe* fr = find_recipe(P, name);
      if (!fr) absent += (absent.empty() ? "" : ", ") + name;
      terms.push_back({fr, coef});
    }
    if (!absent.empty()) {
      std::fprintf(stderr, "claim %s: skipped (not in this panel: %s)\n", cl.id.c_str(),
                   absent.c_str());
      continue;
    }
    if (is_role_scope(cl.scope) && P.linear_names.empty())
      throw UserError("fidelity: claim " + cl.id + ": scope '" + cl.scope +
                      "' needs a panel run with "
                      "--linear-roles, and this one was not");
    if (!terms[0].first->scopes.count(cl.scope) ||
        !terms[0].first->scopes.at(cl.scope).count(cl.metric))
      throw UserError(
          "fidelity: claim " + cl.id + ": no metric '" + cl.metric + "' in scope '" + cl.scope +
          "' (metrics: rel_error, cosine, gain, mse, bias2, variance; whole also loss_penalty, "
          "loss_penalty_current, loss_penalty_replay_d50, loss_penalty_calibrated, "
          "sgd_noise_fraction, qnoise_to_grad; scopes: whole, linears, a parameter name, or with "
          "per-linear roles Y.local, Y.e2e, dX.local, dX.e2e, dW.local, dW.e2e)");
    const bool sampled_scope = cl.scope == "whole" || cl.scope == "linears" ||
                               is_role_scope(cl.scope);
    if (P.params_means_only && !sampled_scope)
      throw UserError("fidelity: claim " + cl.id + ": scope '" + cl.scope +
                      "' needs per-batch samples of "
                      "one parameter or linear, which fidelity.json does not store (whole, linears "
                      "and the role "
                      "scopes only); rerun the panel");
    out.add(cl.id, terms, cl.scope, cl.metric, cl.expect, cl.bound, cl.text);
  }
}

// ------------------------------------------------------------------------------ fidelity.md

// The title and what the panel ran: checkpoints, batches, draws, references, bootstrap, CPU.
void md_description(std::ostream& md, const FidelityPanel& P, const Boot& boot) {
  md << "# Fidelity panel: " << P.run << "\n\n";
  md << "Checkpoints (steps) " << join_steps(P.steps) << "; " << P.batches << " batches of "
     << P.tokens_per_batch << " tokens per checkpoint (the same batches at every checkpoint); "
     << P.draws
     << " SR draws for recipes with stochastic rounding (1 otherwise: their draws are "
        "identical); seed "
     << P.seed << ". References: "
     << (P.references == "held"
             ? "held (as each recipe would hold them at the evaluated step; docs/fidelity.md)"
             : "current (measured on each batch)")
     << ". "
     << "Intervals: 95%, two-level bootstrap (checkpoints, then batches), " << boot.resamples
     << " resamples, seed " << boot.seed << ". CPU: " << P.cpu << "; " << fmt(P.seconds, 0)
     << " s.\n\n";
}

// What the panel cannot show with its steps (FidelityPanel::warnings), before any figure.
void md_warnings(std::ostream& md, const FidelityPanel& P) {
  for (const std::string& w : P.warnings) md << "**Warning:** " << w << "\n\n";
}

// The outlier stress (docs/fidelity.md "Outlier stress") and how well the exact side kept.
void md_stress(std::ostream& md, const FidelityPanel& P) {
  if (P.stress_factor == 1) return;
  std::string ch;
  for (int c : P.stress_channels) ch += (ch.empty() ? "" : ", ") + std::to_string(c);
  md << "**Outlier stress:** channels " << ch << " of every block's norm × "
     << fmt(P.stress_factor, 0)
     << ", the reading linears' columns ÷ the same (docs/fidelity.md); exact side with and without "
        "it: "
     << "|ΔL*| ≤ " << fmt(P.stress_loss_diff) << ", |Δg*| ≤ " << fmt(P.stress_grad_diff)
     << (!P.linear_names.empty()
             ? ", every linear's |ΔY*|, |ΔdX*|, |ΔdW*| ≤ " + fmt(P.stress_roles_diff)
             : std::string())
     << " (0: the function is preserved bit for bit). Gradients are compared in the original "
        "parametrization.\n\n";
}

// The exact side's loss and gradient norm, then the whole gradient per recipe.
void md_whole_gradient(std::ostream& md, const FidelityPanel& P, const Boot& boot) {
  md << "Exact side: loss " << fmt_iv(boot(P.exact_loss)) << ", ‖g*‖ "
     << fmt_iv(boot(P.exact_grad_norm)) << ".\n\n";
  md << "## Whole gradient\n\n| recipe | rel. error | cosine | gain | bias² / ‖g*‖² | variance / "
        "‖g*‖² | loss penalty (nats) | quant. / SGD noise | σ_q / ‖g*‖ "
        "|\n|---|---|---|---|---|---|---|---|---|\n";
  for (const FidelityRecipe& fr : P.recipes) {
    const auto& w = fr.scopes.at("whole");
    md << "| " << fr.name;
    for (const char* m : {"rel_error", "cosine", "gain", "bias2", "variance", "loss_penalty",
                          "sgd_noise_fraction", "qnoise_to_grad"})
      md << " | " << fmt_iv(boot(w.at(m)));
    md << " |\n";
  }
}

// The loss penalty of the training forward and of each inference policy (panels of earlier
// binaries have none).
void md_policy_penalties(std::ostream& md, const FidelityPanel& P, const Boot& boot) {
  if (P.recipes.empty() || !P.recipes[0].scopes.at("whole").count(kPolicyMetrics[0])) return;
  md << "\n## Loss penalty by forward (nats: L − L*, mean [95%])\n\nTraining forward (the recipe's "
        "references, "
        "mean over draws) and the inference policies of `fp4train eval` on the same batches (run "
        "in order "
        "as one evaluation: replay-d50 samples at the first batch and holds; calibrated measures "
        "on eval's "
        "calibration windows first).\n\n| recipe | training | current | replay-d50 | calibrated "
        "|\n|---|---|---|---|---|\n";
  for (const FidelityRecipe& fr : P.recipes) {
    const auto& w = fr.scopes.at("whole");
    md << "| " << fr.name << " | " << fmt_iv(boot(w.at("loss_penalty")));
    for (const char* m : kPolicyMetrics) md << " | " << fmt_iv(boot(w.at(m)));
    md << " |\n";
  }
}

void md_linear_weights(std::ostream& md, const FidelityPanel& P, const Boot& boot) {
  md << "\n## Linear weights (dW)\n\n| recipe | rel. error | cosine | gain | bias² / ‖g*‖² | "
        "variance / ‖g*‖² |\n|---|---|---|---|---|---|\n";
  for (const FidelityRecipe& fr : P.recipes) {
    const auto& w = fr.scopes.at("linears");
    md << "| " << fr.name;
    for (const char* m : kMeanMetrics) md << " | " << fmt_iv(boot(w.at(m)));
    md << " |\n";
  }
}

// Per-linear roles (docs/fidelity.md "Per-linear roles"): the concatenated scopes' intervals,
// then per recipe a table of every linear's means.
void md_roles(std::ostream& md, const FidelityPanel& P, const Boot& boot) {
  if (P.linear_names.empty()) return;
  md << "\n## Per-linear roles (relative error; every linear's tensor of the role, "
        "concatenated)\n\n"
        "Local: the linear's quantized GEMMs fed the exact X* and dY*. End to end (e2e): fed the X "
        "and dY "
        "of the recipe's own pass, where the errors of other layers reach them. dX is the linear's "
        "own "
        "dgrad output.\n\n| recipe | Y local | Y e2e | dX local | dX e2e | dW local | dW e2e "
        "|\n|---|---|---|---|---|---|---|\n";
  for (const FidelityRecipe& fr : P.recipes) {
    md << "| " << fr.name;
    for (const char* key : kLinearRoleScopes)
      md << " | " << fmt_iv(boot(fr.scopes.at(key).at("rel_error")));
    md << " |\n";
  }
  for (const FidelityRecipe& fr : P.recipes) {
    md << "\n### " << fr.name
       << ": relative error per linear (means)\n\n| linear | Y local | Y e2e | dX local | dX e2e | "
          "dW local | dW e2e |\n|---|---|---|---|---|---|---|\n";
    for (const std::string& ln : P.linear_names) {
      md << "| " << ln;
      for (const char* key : kLinearRoleScopes)
        md << " | " << fmt(finite_mean(fr.scopes.at(ln + ":" + key).at("rel_error")));
      md << " |\n";
    }
  }
}

// Value `k` of a role's scale events, or "—" when absent.
std::string event_or_dash(const std::map<std::string, double>& ev, const char* k, int prec) {
  const auto f = ev.find(k);
  return f == ev.end() ? std::string("—") : fmt(f->second, prec);
}

const char* const kEventRoles[] = {"x", "w", "dy", "dyt", "xt"};

// Scale events (docs/fidelity.md "Scale events"), per recipe and operand role.
void md_scale_events(std::ostream& md, const FidelityPanel& P) {
  md << "\n## Scale events (telemetry of draw 0, mean over linears, checkpoints and batches)\n\n"
        "| recipe | role | saturated blocks | zero-guarded blocks | zeroed nonzeros | staleness "
        "(amax / g) | "
        "a_b/g < 2^-15 (E4M3-subnormal scale at T = 448) | a_b ≥ g "
        "|\n|---|---|---|---|---|---|---|---|\n";
  for (const FidelityRecipe& fr : P.recipes)
    for (const char* role : kEventRoles) {
      const auto it = fr.scale_events.find(role);
      if (it == fr.scale_events.end()) continue;
      auto v = [&](const char* k) { return event_or_dash(it->second, k, 4); };
      md << "| " << fr.name << " | " << role << " | " << v("saturated_blocks") << " | "
         << v("zero_guard_blocks") << " | " << v("zeroed_nonzeros") << " | " << v("staleness")
         << " | " << v("e4m3_subnormal_blocks") << " | " << v("at_or_above_reference_blocks")
         << " |\n";
    }
}

// The quantiles of log2(a_b/g) per recipe and role (no table for a panel without them: panels
// of earlier binaries).
void md_block_amax(std::ostream& md, const FidelityPanel& P) {
  bool any_quantiles = false;
  for (const FidelityRecipe& fr : P.recipes)
    for (const auto& [role, ev] : fr.scale_events) any_quantiles |= ev.count("log2_ratio_q0.5") > 0;
  if (any_quantiles)
    md << "\n## Block amax against the tensor reference (telemetry of draw 0)\n\nQuantiles of "
          "log2(a_b/g) over the "
          "nonzero blocks of each role (floor of the log2 bin, clamped to [−96, 31]; E4M3 scales "
          "at T = 448 turn "
          "subnormal below −15 and saturate at 0 or above, UE5M3 ones turn subnormal below −23), "
          "and the all-zero "
          "blocks.\n\n"
          "| recipe | role | 0.1% | 1% | median | 99% | 99.9% | all-zero blocks "
          "|\n|---|---|---|---|---|---|---|---|\n";
  for (const FidelityRecipe& fr : P.recipes)
    for (const char* role : kEventRoles) {
      const auto it = fr.scale_events.find(role);
      if (it == fr.scale_events.end() || !it->second.count("log2_ratio_q0.5")) continue;
      auto v = [&](const char* k) { return event_or_dash(it->second, k, 0); };
      md << "| " << fr.name << " | " << role << " | " << v("log2_ratio_q0.001") << " | "
         << v("log2_ratio_q0.01") << " | " << v("log2_ratio_q0.5") << " | " << v("log2_ratio_q0.99")
         << " | " << v("log2_ratio_q0.999") << " | " << event_or_dash(it->second, "zero_blocks", 4)
         << " |\n";
    }
}

// The block amax per linear and role of the first recipe with them (every recipe's are in
// fidelity.json; the distribution changes between recipes only through their forward passes and
// references). No table for panels of earlier binaries.
void md_block_amax_by_linear(std::ostream& md, const FidelityPanel& P) {
  const FidelityRecipe* fr = nullptr;
  for (const FidelityRecipe& x : P.recipes)
    if (!x.block_amax_by_linear.empty()) {
      fr = &x;
      break;
    }
  if (!fr) return;
  md << "\n## Block amax per linear (" << fr->name << ")\n\nThe quantiles above for each FP4 linear "
        "and role of `" << fr->name << "` (every recipe's are in fidelity.json, "
        "`block_amax_by_linear`): log2(a_b/g), floor of the bin, over the linear's nonzero blocks; "
        "a_b/g < 2^-15 is where E4M3 scales at T = 448 turn subnormal.\n\n"
        "| linear | role | 0.1% | 1% | median | 99% | 99.9% | a_b/g < 2^-15 | all-zero blocks "
        "|\n|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& [name, roles] : fr->block_amax_by_linear)
    for (const char* role : kEventRoles) {
      const auto it = roles.find(role);
      if (it == roles.end()) continue;
      auto v = [&](const char* k) { return event_or_dash(it->second, k, 0); };
      md << "| " << name << " | " << role << " | " << v("log2_ratio_q0.001") << " | " << v("log2_ratio_q0.01")
         << " | " << v("log2_ratio_q0.5") << " | " << v("log2_ratio_q0.99") << " | " << v("log2_ratio_q0.999")
         << " | " << event_or_dash(it->second, "e4m3_subnormal_blocks", 4) << " | "
         << event_or_dash(it->second, "zero_blocks", 4) << " |\n";
    }
}

// The whole-gradient relative error per checkpoint (mean over batches).
void md_over_training(std::ostream& md, const FidelityPanel& P) {
  md << "\n## Over training (whole-gradient relative error, mean over batches)\n\n| recipe |";
  for (int64_t s : P.steps) md << " step " << s << " |";
  md << "\n|---|";
  for (size_t c = 0; c < P.steps.size(); ++c) md << "---|";
  md << "\n";
  for (const FidelityRecipe& fr : P.recipes) {
    md << "| " << fr.name << " |";
    for (const auto& row : fr.scopes.at("whole").at("rel_error")) {
      double t = 0;
      for (double v : row) t += v;
      md << " " << fmt(t / double(row.size())) << " |";
    }
    md << "\n";
  }
}

void md_contrasts(std::ostream& md, const std::vector<std::string>& rows) {
  md << "\n## Contrasts (paired on identical checkpoint and batch)\n\n| id | contrast | metric | "
        "mean [95%] | verdict |\n|---|---|---|---|---|\n";
  for (const std::string& l : rows) md << l << "\n";
}

// Every quantity the tables print, in one place (docs/fidelity.md "Reading the report" is the
// long form).
void md_definitions(std::ostream& md) {
  md << R"(
## Definitions (docs/fidelity.md "Reading the report")

Per (checkpoint, batch): g* and L* are the exact FP32 gradient and loss (‖g*‖ its norm); ĝ_d
and L_d the recipe's, draw d of R (R = 1 without stochastic rounding), ḡ their mean. A table
entry is the mean over checkpoints and batches with its 95% interval [lo, hi] (two-level
bootstrap: checkpoints, then batches within each).

* **rel. error** = mean_d ‖ĝ_d − g*‖ / ‖g*‖. **cosine** = mean_d ⟨ĝ_d, g*⟩ / (‖ĝ_d‖ ‖g*‖).
* **gain** = mean_d ⟨ĝ_d, g*⟩ / ‖g*‖²: the length of ĝ_d's component along g*, in units of ‖g*‖;
  1 when that component is g* itself, below 1 a shrunken (biased) gradient, above 1 an
  inflated one.
* **variance / ‖g*‖²** = V / ‖g*‖², V = Σ_d ‖ĝ_d − ḡ‖² / (R − 1) (0 for R = 1); **bias² /
  ‖g*‖²** = (‖ḡ − g*‖² − V/R) / ‖g*‖², the squared bias over SR draws for the batch (slightly
  below 0 when the bias is under the noise of ḡ). They sum to mse = mean_d ‖ĝ_d − g*‖² / ‖g*‖².
* **loss penalty** = mean_d L_d − L* in nats, for the training forward; under an inference
  policy of `fp4train eval` (current, replay-d50, calibrated), that policy's loss − L*.
* **quant. / SGD noise** = mean_d ‖ĝ_d − g*‖² / σ²_sgd, σ²_sgd = Σ_k ‖g*_k − mean_k g*_k‖² /
  (K − 1) over the checkpoint's K batches: quantization noise as a fraction of minibatch noise.
* **σ_q / ‖g*‖**: σ_q = √(mean_d ‖ĝ_d − g*‖²), the root-mean-square quantization error of the
  gradient; fidelity.json's grad_to_qnoise is its reciprocal ‖g*‖ / σ_q.
* Scopes: **whole gradient**, every parameter; **linear weights (dW)**, the weights of the
  quantized linears; **per-linear roles**, each linear's Y, dX and dW, local (fed the exact X*
  and dY*) or e2e (fed the recipe pass's own X and dY).
* Scale events, per operand role (x, w: fprop; dy: dgrad; dyt, xt: wgrad), on draw 0, averaged
  over linears, checkpoints and batches. a_b = max |x| over block b; g = the tensor reference
  (the amax the recipe scales against: measured on the batch, or held since the refresh step
  t_r); T the scale target (448 unless the recipe sets another). **saturated blocks**:
  fraction of blocks whose scale clipped at the scale format's maximum; **zero-guarded
  blocks**: nonzero blocks whose scale underflowed to 0 and became 1; **zeroed nonzeros**:
  nonzero elements quantized to ±0;
  **staleness** = max |x| of the operand now / g (1 under current references, above 1 when the
  tensor outgrew a held g); **a_b/g < 2^-15**: nonzero blocks whose scale T·a_b/g falls below
  E4M3's smallest normal, 2^-6, at T = 448; **a_b ≥ g**: nonzero blocks whose scale reaches T.
* Block amax: quantiles of floor(log2(a_b/g)) over the nonzero blocks; **all-zero blocks**:
  fraction of blocks with a_b = 0.
* **Over training**: the whole-gradient rel. error of each checkpoint, mean over its batches.
* Contrasts: Σ coefficient × metric per (checkpoint, batch), bootstrapped (paired); verdict
  "below 0" / "above 0" when the interval excludes 0, else "not resolved"; a claim's is
  "supported" / "contradicted" by its `expect` (lower or higher than 0: the interval on that
  side or the other; within ±bound: the interval inside or outside it), else "not resolved".
)";
}
}  // namespace

void write_fidelity_report(const FidelityPanel& P, const FidelityRequest& req) {
  check_finite_samples(P);
  const Boot boot{req.resamples, req.bootstrap_seed};
  json j = description_json(P, boot);
  json recs = json::array();
  for (size_t r = 0; r < P.recipes.size(); ++r) recs.push_back(recipe_json(P, r, boot));
  j["recipes"] = recs;
  j["samples"] = samples_json(P);
  Contrasts contrasts(boot);
  recipe_contrasts(P, contrasts);
  if (!req.claims.empty()) claim_contrasts(P, req.claims, contrasts);
  j["contrasts"] = contrasts.entries;

  std::ostringstream md;
  md_description(md, P, boot);
  md_warnings(md, P);
  md_stress(md, P);
  md_whole_gradient(md, P, boot);
  md_policy_penalties(md, P, boot);
  md_linear_weights(md, P, boot);
  md_roles(md, P, boot);
  md_scale_events(md, P);
  md_block_amax(md, P);
  md_block_amax_by_linear(md, P);
  md_over_training(md, P);
  md_contrasts(md, contrasts.md_rows);
  md_definitions(md);

  std::error_code ec;
  fs::create_directories(req.out, ec);
  if (ec) throw UserError("fidelity: cannot create " + req.out.string() + ": " + ec.message());
  write_file_atomic(req.out / "fidelity.json", j.dump(1) + "\n");
  write_file_atomic(req.out / "fidelity.md", md.str());
}

}  // namespace fp4
