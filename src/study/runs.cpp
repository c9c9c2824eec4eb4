// Run records and their aggregation (fp4/study/report.h): a run directory read into a
// RunRecord, stability counts, the rows of the comparison with their paired intervals.
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
#include "fp4/eval/minimal_pairs.h"
#include "fp4/base/error.h"
#include "fp4/recipe/recipe.h"
#include "fp4/study/run_metrics.h"

#include "report_internal.h"

namespace fp4 {
namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace report_detail;

namespace report_detail {
// Grad-norm excursions of one run (the paper's stability count): logged steps after warmup
// whose norm is above 1 or not finite.
int grad_norm_excursions(const RunRecord& r) {
  int n = 0;
  for (size_t i = 0; i < r.step.size(); ++i)
    if (r.step[i] > r.warmup_steps && !(r.grad_norm[i] <= 1.0)) ++n;
  return n;
}
}  // namespace report_detail

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

RunRecord::Pairs read_minimal_pairs_file(const fs::path& pf) {
  const json t = read_json_file(pf);
  RunRecord::Pairs P;
  const std::string f = pf.string();
  try {
    if (!t.is_object() || !t.contains("task") || !t["task"].is_string() ||
        t["task"].get<std::string>() != "minimal-pairs" || !t.contains("results") ||
        !t["results"].is_object() || !t.contains("paradigms") || !t["paradigms"].is_array())
      throw UserError(f + ": not a minimal-pairs task file (expected `fp4train eval "
                      "--task minimal-pairs --json` output: task, paradigms, results)");
    if (!t.contains("items_fnv1a64") || !t["items_fnv1a64"].is_string() ||
        t["items_fnv1a64"].get<std::string>().empty())
      throw UserError(f + ": missing string 'items_fnv1a64' (the items' hash)");
    auto count = [&](const json& j, const char* key, const std::string& where) -> size_t {
      if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() < 0)
        throw UserError(f + ": " + where + key + " must be a non-negative integer");
      return static_cast<size_t>(j[key].get<int64_t>());
    };
    const size_t items = count(t, "items", "");
    P.step = t.contains("step") && t["step"].is_number_integer() ? t["step"].get<int64_t>() : -1;
    // The paradigms: the known ones, once each, in order, covering the items end to end.
    size_t at = 0;
    for (const json& pj : t["paradigms"]) {
      RunRecord::Pairs::Paradigm q;
      if (!pj.is_object() || !pj.contains("name") || !pj["name"].is_string())
        throw UserError(f + ": a paradigm without a name");
      q.name = pj["name"].get<std::string>();
      const std::string w = "paradigm " + q.name + ": ";
      q.first = count(pj, "first", w);
      q.items = count(pj, "items", w);
      q.chance = num(pj, "chance", pf);
      if (!(q.chance > 0 && q.chance < 1)) throw UserError(f + ": " + w + "chance must be in (0, 1)");
      const size_t k = P.paradigms.size();
      if (k >= kMinimalPairParadigms.size() || q.name != kMinimalPairParadigms[k])
        throw UserError(f + ": paradigm " + std::to_string(k + 1) + " is '" + q.name +
                        "', expected the paradigms in the order of the task (swap, shuffle, "
                        "det-noun, a-an, subj-verb, cloze)");
      if (q.first != at)
        throw UserError(f + ": " + w + "first is " + std::to_string(q.first) + ", expected " +
                        std::to_string(at) + " (the paradigms cover the items in order)");
      at += q.items;
      if (at > items)
        throw UserError(f + ": paradigm " + q.name + " runs past the " + std::to_string(items) + " items");
      P.paradigms.push_back(q);
    }
    if (P.paradigms.size() != kMinimalPairParadigms.size() || at != items)
      throw UserError(f + ": the paradigms must be the task's " +
                      std::to_string(kMinimalPairParadigms.size()) + " and cover its " +
                      std::to_string(items) + " items");
    for (const auto& [pol, v] : t["results"].items()) {
      if (!v.is_object() || !v.contains("finite") || !v["finite"].is_boolean())
        throw UserError(f + ": results." + pol + ": missing boolean 'finite'");
      if (!v["finite"].get<bool>()) continue;  // non-finite: no outcomes
      if (!v.contains("credit") || !v["credit"].is_string() || !v.contains("margin") ||
          !v["margin"].is_array())
        throw UserError(f + ": results." + pol + ": missing string 'credit' or array 'margin'");
      RunRecord::Pairs::Outcome o;
      try {
        o.credit = parse_credits(v["credit"].get<std::string>());
      } catch (const std::invalid_argument& e) {
        throw UserError(f + ": results." + pol + ".credit: " + e.what());
      }
      for (const json& m : v["margin"]) {
        if (!m.is_number() && !m.is_null())
          throw UserError(f + ": results." + pol + ".margin holds a non-number");
        o.margin.push_back(m.is_null() ? kNaN : m.get<double>());
      }
      if (o.credit.size() != items || o.margin.size() != items)
        throw UserError(f + ": results." + pol + ": credit and margin must hold " +
                        std::to_string(items) + " items");
      for (size_t i = 0; i < items; ++i)
        if (std::isnan(o.credit[i]) != std::isnan(o.margin[i]) ||
            (o.credit[i] == 1 && o.margin[i] < 0) || (o.credit[i] == 0 && o.margin[i] > 0) ||
            (o.credit[i] > 0 && o.credit[i] < 1 && o.margin[i] != 0))  // margins: 1e-4 nats
          throw UserError(f + ": results." + pol + ": item " + std::to_string(i) +
                          "'s credit disagrees with its margin");
      P.results[pol] = std::move(o);
    }
    P.items_hash = t["items_fnv1a64"].get<std::string>();
  } catch (const json::exception& e) {
    throw UserError(f + ": malformed (" + e.what() + ")");
  }
  return P;
}

namespace {
// The run's outcome: a completed run's summary.json (returned, for the held-out fallback of
// read_heldout), or a diverged run's error.txt with its config.toml and recipe.toml (an empty
// object returned); then train.warmup_steps from config.toml when there is one.
json read_outcome(const fs::path& dir, RunRecord& r) {
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
    if (s.contains("slow_path") && s["slow_path"].is_string())
      r.slow_path = s["slow_path"].get<std::string>();
    if (s.contains("compute") && s["compute"].is_object() && s["compute"].contains("cpu") &&
        s["compute"]["cpu"].is_string())
      r.cpu = s["compute"]["cpu"].get<std::string>();
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
  return s;
}

// The logged steps of metrics.jsonl, or metrics.jsonl.zst of a compacted run (the same
// lines), and the mean of the last kLastEvals held-out evaluations among them.
void read_metrics(const fs::path& dir, RunRecord& r) {
  const fs::path mp = run_metrics_file(dir);
  MetricsReader mf(mp);
  std::string line;
  for (int ln = 1; mf.next(line); ++ln) {
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
    if (j.contains("val_nll")) r.val_step.push_back(st), r.val_nll.push_back(num(j, "val_nll", where));
  }
  if (r.step.empty()) throw UserError(mp.string() + " holds no steps");
  if (r.val_nll.size() >= size_t(kLastEvals)) {
    double sum = 0;
    for (size_t i = r.val_nll.size() - size_t(kLastEvals); i < r.val_nll.size(); ++i) sum += r.val_nll[i];
    r.heldout_last = sum / kLastEvals;
  }
}

// The held-out NLL per policy of a completed run: eval.json (with per-window values when it
// has them), else summary.json's heldout_nll and heldout_nll_quant. None for a diverged run.
void read_heldout(const fs::path& dir, const json& summary, RunRecord& r) {
  const fs::path ep = dir / "eval.json", sp = dir / "summary.json";
  if (r.diverged_at > 0) return;  // no held-out NLL for a diverged run
  if (!fs::exists(ep)) {
    r.heldout["none"] = num(summary, "heldout_nll", sp);
    if (r.recipe != "fp32") r.heldout["current"] = num(summary, "heldout_nll_quant", sp);
    return;
  }
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
}

// One policy's outcomes of task.json: the 0/1 strings, raw and per character, each checked
// against its length and its stated accuracy. Empty when the policy has no accuracy.
RunRecord::TaskOutcome read_task_outcome(const json& v, const std::string& pol, int64_t items,
                                         const fs::path& tp) {
  RunRecord::TaskOutcome o;
  if (!v.contains("accuracy") || v["accuracy"].is_null()) return o;
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
    const double said = num(v, std::string(k) == "correct" ? "accuracy" : "accuracy_per_char", tp);
    if (std::fabs(acc - said) > 1e-9)
      throw UserError(tp.string() + ": results." + pol + ": the accuracy " + fmt("%.6f", said) +
                      " disagrees with its outcomes " + k + " (" + fmt("%.6f", acc) + ")");
  }
  return o;
}

// The downstream task of a completed run, from task.json when there is one.
void read_task(const fs::path& dir, RunRecord& r) {
  const fs::path tp = dir / "task.json";
  if (r.diverged_at != 0 || !fs::exists(tp)) return;
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
  for (const auto& [pol, v] : t["results"].items())
    r.task_results[pol] = read_task_outcome(v, pol, items, tp);
}
}  // namespace

RunRecord read_run(const fs::path& dir) {
  RunRecord r;
  r.dir = dir;
  const json summary = read_outcome(dir, r);
  read_metrics(dir, r);
  read_heldout(dir, summary, r);
  read_task(dir, r);
  const fs::path pf = dir / "task-minimal-pairs.json";
  if (r.diverged_at == 0 && fs::exists(pf)) r.pairs = read_minimal_pairs_file(pf);
  return r;
}

namespace report_detail {
// A completed run of `recipe` with seed `seed`, or null.
const RunRecord* find_run(const std::vector<RunRecord>& runs, const std::string& recipe,
                          uint64_t seed, bool completed_only) {
  for (const auto& r : runs)
    if (r.recipe == recipe && r.seed == seed && (!completed_only || r.diverged_at == 0)) return &r;
  return nullptr;
}

// Seeds (ascending) at which every recipe of the contrast has a run.
std::vector<uint64_t> common_seeds(const std::vector<RunRecord>& runs,
                                   const std::vector<std::pair<std::string, double>>& c,
                                   bool completed_only, int* mixed_cpu) {
  if (mixed_cpu) *mixed_cpu = 0;
  std::set<uint64_t> seeds;
  for (const auto& r : runs) seeds.insert(r.seed);
  std::vector<uint64_t> out;
  for (uint64_t s : seeds) {
    if (!std::all_of(c.begin(), c.end(),
                     [&](const auto& t) { return find_run(runs, t.first, s, completed_only); }))
      continue;
    // Pairs within one CPU family only: results may differ across families (docs/determinism.md).
    std::set<std::string> cpus;
    for (const auto& t : c)
      if (const std::string& cpu = find_run(runs, t.first, s, completed_only)->cpu; !cpu.empty())
        cpus.insert(cpu);
    if (cpus.size() <= 1) out.push_back(s);
    else if (mixed_cpu) ++*mixed_cpu;
  }
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
}  // namespace report_detail

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

namespace {
// The recipes in the order given, then those only the runs name, in the order first met.
std::vector<std::string> recipe_names(const std::vector<RunRecord>& runs,
                                      const std::vector<std::string>& order) {
  std::vector<std::string> names = order;
  for (const auto& r : runs)
    if (std::find(names.begin(), names.end(), r.recipe) == names.end()) names.push_back(r.recipe);
  return names;
}

// The items every recipe's task row is measured on ("task\nitems hash"): those of most runs
// (ties: the first seen), so one run on other items cannot take its recipe's row away.
std::string common_task_key(const std::vector<RunRecord>& runs) {
  std::string task_key;
  std::map<std::string, int> count;
  std::vector<std::string> seen;
  for (const auto& r : runs)
    if (r.diverged_at == 0 && !r.task.empty()) {
      const std::string k = r.task + "\n" + r.task_items_hash;
      if (count[k]++ == 0) seen.push_back(k);
    }
  int best = 0;
  for (const auto& k : seen)
    if (count[k] > best) best = count[k], task_key = k;
  return task_key;
}

// Interquartile range of the step times over their median (step_spread); 0 for fewer than 4.
double step_spread(const std::vector<double>& ms, double median_ms) {
  if (ms.size() < 4) return 0;
  std::vector<double> q = ms;
  std::sort(q.begin(), q.end());
  auto at = [&](double f) {  // linear interpolation between order statistics
    const double x = f * double(q.size() - 1);
    const size_t i = size_t(x);
    return i + 1 < q.size() ? q[i] + (x - double(i)) * (q[i + 1] - q[i]) : q[i];
  };
  return (at(0.75) - at(0.25)) / median_ms;
}

// The losses, stability counts and timings of the recipe's runs into row; false when the
// recipe has no run.
bool add_loss_and_timing(RecipeRow& row, const std::vector<RunRecord>& runs) {
  std::vector<double> fl, ms;
  std::map<std::string, std::vector<double>> held;
  int64_t tokens_per_step = 0;
  bool any = false;
  for (const auto& r : runs) {
    if (r.recipe != row.recipe) continue;
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
  if (!any) return false;
  row.final_loss = mean_std(fl);
  if (fl.empty()) row.final_loss.mean = kNaN;
  for (const auto& [p, v] : held) row.heldout[p] = mean_std(v);
  row.median_step_ms = median(ms);
  row.tokens_per_s = tokens_per_step * 1e3 / row.median_step_ms;
  row.timed_steps = int(ms.size());
  if (ms.size() >= 4) row.step_spread = step_spread(ms, row.median_step_ms);
  for (const auto& r : runs)
    if (r.recipe == row.recipe && r.busy_machine) ++row.busy_runs;
  for (const auto& r : runs)
    if (r.recipe == row.recipe && !r.slow_path.empty()) ++row.slow_path_runs;
  return true;
}

// The downstream task of the recipe's completed runs on the common items (task_key): per
// policy, the 0/1 outcomes of every seed, bootstrapped over items.
void add_task(RecipeRow& row, const std::vector<RunRecord>& runs, const std::string& task_key) {
  std::map<std::string, std::vector<std::vector<double>>> raw, per_char;
  for (const auto& r : runs) {
    if (r.recipe != row.recipe || r.diverged_at > 0 || r.task.empty()) continue;
    if (r.task + "\n" + r.task_items_hash != task_key) {
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
}

// The columns against the baseline: the final-window loss paired by seed (within one CPU
// family, as common_seeds) with its t-interval, the held-out NLL's bootstrap over windows
// under bootstrap_policy, the gap of the means; and the step time over fp32's.
void add_baseline_columns(std::vector<RecipeRow>& rows, const std::vector<RunRecord>& runs,
                          const std::string& baseline, const std::string& bootstrap_policy,
                          const RecipeRow* base, const RecipeRow* fp32) {
  std::map<uint64_t, const RunRecord*> base_run;  // seed → a completed baseline run
  for (const auto& r : runs)
    if (!baseline.empty() && r.recipe == baseline && r.diverged_at == 0) base_run[r.seed] = &r;
  for (auto& row : rows) {
    std::vector<double> d;
    for (const auto& r : runs) {
      if (r.recipe != row.recipe || r.diverged_at != 0 || !base_run.count(r.seed)) continue;
      const RunRecord& b = *base_run[r.seed];
      if (!r.cpu.empty() && !b.cpu.empty() && r.cpu != b.cpu) continue;
      d.push_back(r.final_window_loss - b.final_window_loss);
    }
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
}

// Why a row's own timing should not be read as a measurement: "slow path" (a run took a
// quantizer path slower than the SIMD kernels: docs/performance.md "Block sizes and the
// quantizer's fast path"; it explains the time, so "busy machine" is then left out), "busy
// machine", "N steps", "spread P%", comma-separated; "" when none applies.
std::string own_timing_note(const RecipeRow& r) {
  std::string n;
  auto add = [&](const std::string& x) { n += (n.empty() ? "" : ", ") + x; };
  if (r.slow_path_runs > 0) add("slow path");
  else if (r.busy_runs > 0) add("busy machine");
  if (r.timed_steps < 10) add(std::to_string(r.timed_steps) + " step" + (r.timed_steps == 1 ? "" : "s"));
  if (r.step_spread > 0.5) add(fmt("spread %.0f%%", 100 * r.step_spread));
  return n;
}

// Marks on timings that should not be read as measurements (a ratio inherits fp32's).
void add_timing_notes(std::vector<RecipeRow>& rows, const RecipeRow* fp32) {
  const std::string fp32_note = fp32 ? own_timing_note(*fp32) : "";
  for (auto& r : rows) {
    r.timing_note = own_timing_note(r);
    if (&r != fp32 && !fp32_note.empty() && fp32 && r.recipe != fp32->recipe)
      r.timing_note += (r.timing_note.empty() ? "fp32: " : "; fp32: ") + fp32_note;
  }
}
}  // namespace

std::vector<RecipeRow> aggregate_runs(const std::vector<RunRecord>& runs,
                                      const std::vector<std::string>& order,
                                      const std::string& baseline_arg,
                                      const std::string& bootstrap_policy) {
  const std::string task_key = common_task_key(runs);
  std::vector<RecipeRow> rows;
  for (const auto& name : recipe_names(runs, order)) {
    RecipeRow row;
    row.recipe = name;
    if (!add_loss_and_timing(row, runs)) continue;
    add_task(row, runs, task_key);
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
  add_baseline_columns(rows, runs, baseline, bootstrap_policy, base, fp32);
  add_timing_notes(rows, fp32);
  return rows;
}

}  // namespace fp4
