// The fidelity panel's statistics (include/fp4/study/fidelity.h, docs/fidelity.md "Metrics" and
// "Statistics") and its claims file; the passes are in fidelity_run.cpp, the report in
// fidelity_report.cpp.
#include "fp4/study/fidelity.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <set>
#include <stdexcept>
#include <toml++/toml.h>

#include "fidelity_internal.h"
#include "fp4/base/error.h"
#include "fp4/data/data.h"

namespace fp4 {
namespace fs = std::filesystem;

// ------------------------------------------------------------------------------ statistics

DrawMoments draw_moments(const std::vector<const float*>& est, const float* ref,
                         const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  if (est.empty()) throw std::invalid_argument("draw_moments: no draws");
  for (const float* e : est)
    if (!e) throw std::invalid_argument("draw_moments: null draw");
  const size_t R = est.size();
  DrawMoments m;
  m.draws = int(R);
  m.err_sq.assign(R, 0.0);
  m.dot.assign(R, 0.0);
  m.est_sq.assign(R, 0.0);
  for (const auto& [b, e] : ranges)
    for (int64_t i = b; i < e; ++i) {
      const double g = ref[i];
      double mean = 0;
      for (size_t d = 0; d < R; ++d) {
        const double x = est[d][i];
        m.err_sq[d] += (x - g) * (x - g);
        m.dot[d] += x * g;
        m.est_sq[d] += x * x;
        mean += x;
      }
      mean /= double(R);
      m.ref_sq += g * g;
      m.mean_err_sq += (mean - g) * (mean - g);
      for (size_t d = 0; d < R; ++d) {
        const double x = est[d][i] - mean;
        m.spread_sq += x * x;
      }
    }
  return m;
}

DrawMoments draw_moments(const std::vector<const float*>& est, const float* ref, int64_t n) {
  return draw_moments(est, ref, std::vector<std::pair<int64_t, int64_t>>{{0, n}});
}

DrawMetrics draw_metrics(const DrawMoments& m) {
  DrawMetrics r;
  const double R = m.draws, n2 = m.ref_sq, n = std::sqrt(n2);
  double rel = 0, cos = 0, gain = 0, mse = 0;
  for (int d = 0; d < m.draws; ++d) {
    rel += std::sqrt(m.err_sq[d]) / n;
    cos += m.dot[d] / (std::sqrt(m.est_sq[d]) * n);
    gain += m.dot[d] / n2;
    mse += m.err_sq[d] / n2;
  }
  r.rel_error = rel / R;
  r.cosine = cos / R;
  r.gain = gain / R;
  r.mse = mse / R;
  const double V = m.draws > 1 ? m.spread_sq / (R - 1) : 0.0;
  r.variance = V / n2;
  r.bias2 = (m.mean_err_sq - V / R) / n2;
  return r;
}

Interval bootstrap_two_level(const std::vector<std::vector<double>>& x, int resamples,
                             uint64_t seed) {
  if (x.empty()) throw std::invalid_argument("bootstrap_two_level: no checkpoints");
  size_t n = 0;  // values in all
  for (const auto& row : x) {
    if (row.empty()) throw std::invalid_argument("bootstrap_two_level: no batches");
    n += row.size();
    for (double v : row)
      if (!std::isfinite(v))
        throw std::invalid_argument("bootstrap_two_level: a value is not finite");
  }
  if (resamples < 1) throw std::invalid_argument("bootstrap_two_level: resamples must be >= 1");
  const size_t C = x.size();
  Interval out;
  double total = 0;
  for (const auto& row : x)
    for (double v : row) total += v;
  out.mean = total / double(n);
  uint64_t k = 0;
  auto draw = [&](size_t m) {  // uniform in [0, m): reject the top partial range of 2^64
    const uint64_t limit = UINT64_MAX - UINT64_MAX % m;
    uint64_t u;
    do u = splitmix64(seed, k++);
    while (u >= limit);
    return size_t(u % m);
  };
  // Each resample: C rows drawn, then as many values from each drawn row as it holds; the mean
  // of all drawn values (with rows of one length K: C·K of them).
  std::vector<double> stats(static_cast<size_t>(resamples));
  for (auto& st : stats) {
    double sum = 0;
    size_t drawn = 0;
    for (size_t c = 0; c < C; ++c) {
      const auto& row = x[C == 1 ? 0 : draw(C)];
      for (size_t b = 0; b < row.size(); ++b) sum += row[draw(row.size())];
      drawn += row.size();
    }
    st = sum / double(drawn);
  }
  std::sort(stats.begin(), stats.end());
  auto quantile = [&](double q) {
    const double h = double(stats.size() - 1) * q;
    const size_t lo = size_t(std::floor(h)), hi = std::min(lo + 1, stats.size() - 1);
    return stats[lo] + (h - double(lo)) * (stats[hi] - stats[lo]);
  };
  out.lo = quantile(0.025);
  out.hi = quantile(0.975);
  return out;
}
// ------------------------------------------------------------------------------ the claims file

namespace fidelity_detail {
namespace {
// The string at `key` into v; an error when it is missing and required.
void read_string(const toml::table& c, const char* key, std::string& v, bool required,
                 const std::string& where) {
  if (auto x = c[key].value<std::string>())
    v = *x;
  else if (required)
    throw UserError("fidelity: " + where + ": key '" + key + "' (a string) is missing");
}

// The contrast's terms: the table terms = { RECIPE = coefficient, ... }, or a (+1) and b (−1).
void read_terms(const toml::table& c, const std::string& where, Claim& cl) {
  if (const toml::table* t = c["terms"].as_table()) {
    for (const auto& [k, v] : *t) {
      const auto x = v.value<double>();
      if (!x || !std::isfinite(*x))
        throw UserError("fidelity: " + where + ": terms." + std::string(k.str()) +
                        " must be a finite number");
      cl.terms.push_back({std::string(k.str()), *x});
    }
    if (cl.terms.empty()) throw UserError("fidelity: " + where + ": terms is empty");
    if (c["a"] || c["b"]) throw UserError("fidelity: " + where + ": give either a and b, or terms");
  } else {
    std::string a, b;
    read_string(c, "a", a, true, where);
    read_string(c, "b", b, true, where);
    cl.terms = {{a, 1.0}, {b, -1.0}};
  }
}

// expect ("lower", "higher" or "within"), the id not used before, and bound with "within" only.
void read_expect(const toml::table& c, const std::string& where, const std::vector<Claim>& before,
                 Claim& cl) {
  read_string(c, "expect", cl.expect, true, where);
  if (cl.expect != "lower" && cl.expect != "higher" && cl.expect != "within")
    throw UserError("fidelity: " + where + " (" + cl.id +
                    "): expect must be \"lower\", \"higher\" (a's metric against b's) or "
                    "\"within\" (with bound), got \"" +
                    cl.expect + "\"");
  for (const Claim& prev : before)
    if (prev.id == cl.id)
      throw UserError("fidelity: " + where + ": id \"" + cl.id + "\" is used twice");
  if (cl.expect != "within" && c["bound"])
    throw UserError("fidelity: " + where + " (" + cl.id +
                    "): bound goes with expect = \"within\" only");
  if (cl.expect == "within") {
    const auto b = c["bound"].value<double>();
    if (!b || !(*b > 0))
      throw UserError("fidelity: " + where + " (" + cl.id +
                      "): expect = \"within\" needs bound, a number > 0");
    cl.bound = *b;
  }
}

// A metric the panel computes, in a scope that has it (the loss penalties and noise ratios:
// whole only).
void check_metric(const std::string& where, const Claim& cl) {
  static const std::set<std::string> known = {"rel_error",
                                              "cosine",
                                              "gain",
                                              "mse",
                                              "bias2",
                                              "variance",
                                              "loss_penalty",
                                              "sgd_noise_fraction",
                                              "qnoise_to_grad",
                                              "loss_penalty_current",
                                              "loss_penalty_replay_d50",
                                              "loss_penalty_calibrated"};
  if (!known.count(cl.metric))
    throw UserError(
        "fidelity: " + where + " (" + cl.id + "): unknown metric '" + cl.metric +
        "' (rel_error, cosine, gain, mse, bias2, variance; scope whole also loss_penalty, "
        "sgd_noise_fraction, qnoise_to_grad, loss_penalty_current, loss_penalty_replay_d50, "
        "loss_penalty_calibrated)");
  const bool whole_only = cl.metric.rfind("loss_penalty", 0) == 0 ||
                          cl.metric == "sgd_noise_fraction" || cl.metric == "qnoise_to_grad";
  if (whole_only && cl.scope != "whole")
    throw UserError("fidelity: " + where + " (" + cl.id + "): metric " + cl.metric +
                    " exists for scope whole only, got scope '" + cl.scope + "'");
}

// One [[claim]] table; `before`: the claims above it in the file.
Claim read_claim(const toml::table& c, const std::string& where, const std::vector<Claim>& before) {
  static const std::set<std::string> keys = {"id", "text",  "metric", "scope", "a",
                                             "b",  "terms", "expect", "bound"};
  for (const auto& [k, v] : c)
    if (!keys.count(std::string(k.str())))
      throw UserError("fidelity: " + where + ": unknown key '" + std::string(k.str()) +
                      "' (keys: id, text, metric, scope, a, b, terms, expect, bound)");
  Claim cl;
  read_string(c, "id", cl.id, true, where);
  read_string(c, "text", cl.text, false, where);
  read_string(c, "metric", cl.metric, true, where);
  read_string(c, "scope", cl.scope, false, where);
  read_terms(c, where, cl);
  read_expect(c, where, before, cl);
  check_metric(where, cl);
  return cl;
}
}  // namespace

std::vector<Claim> load_claims(const fs::path& file) {
  std::vector<Claim> out;
  toml::table t;
  try {
    t = toml::parse_file(file.string());
  } catch (const toml::parse_error& e) {
    throw UserError("fidelity: claims file " + file.string() + ": " + std::string(e.description()));
  }
  const toml::array* arr = t["claim"].as_array();
  if (!arr) throw UserError("fidelity: claims file " + file.string() + " has no [[claim]] tables");
  for (size_t i = 0; i < arr->size(); ++i) {
    const toml::table* c = (*arr)[i].as_table();
    const std::string where = file.string() + ": claim " + std::to_string(i + 1);
    if (!c) throw UserError("fidelity: " + where + " is not a table");
    out.push_back(read_claim(*c, where, out));
  }
  return out;
}

bool is_role_scope(const std::string& scope) {
  return std::find(std::begin(kLinearRoleScopes), std::end(kLinearRoleScopes), scope) !=
         std::end(kLinearRoleScopes);
}

std::string join_steps(const std::vector<int64_t>& s) {
  std::string o;
  for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
  return o;
}
}  // namespace fidelity_detail
}  // namespace fp4
