// The rollouts' files (write_rollout_report, load_rollouts; docs/fidelity.md "Paired
// rollouts"): rollout.json holds every trace, rollout.md the gaps to the fp32 reference with
// two-level bootstrap intervals (checkpoints, then batch orders), the gap by step and the
// paired contrasts.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fp4/base/error.h"
#include "fp4/base/safetensors.h"  // write_file_atomic
#include "fp4/study/rollout.h"

namespace fp4 {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
using Grid = std::vector<std::vector<double>>;  // [checkpoint][order]

json number(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }
// A figure of a trace: a number, or null for a non-finite one (as `number` above writes them);
// anything else is a damaged file. Throws fp4::UserError naming `what`.
double number(const json& j, const char* what = "a trace's figure") {
  if (j.is_null()) return kNaN;
  if (!j.is_number()) throw UserError(std::string(what) + " is neither a number nor null: " + j.dump());
  return j.get<double>();
}

// A count of the file (length, orders, windows, seed, batch size): a whole number >= `least`.
int64_t whole(const json& j, const char* what, int64_t least) {
  if (!j.is_number_integer() || j.get<int64_t>() < least)
    throw UserError(std::string(what) + " must be a whole number of at least " + std::to_string(least) + ", got " +
                    j.dump());
  return j.get<int64_t>();
}

// What one recipe's rollouts give per (checkpoint, order): the four measures of its gap, and
// the stability counts (docs/fidelity.md "Stability stress"): loss spikes against the fp32
// rollout, gradient-norm excursions, a non-finite step (0 or 1: a rollout stops at it).
struct Gaps {
  Grid final_loss, mean_loss, nll, nll_fp32, divergence;
  Grid spikes, excursions, nonfinite;
  int diverged = 0;
};


Gaps gaps_of(const RolloutResult& r, size_t i) {
  Gaps g;
  const size_t C = r.steps.size(), O = size_t(r.orders), N = size_t(r.length);
  for (Grid* x : {&g.final_loss, &g.mean_loss, &g.nll, &g.nll_fp32, &g.divergence, &g.spikes,
                  &g.excursions, &g.nonfinite})
    x->assign(C, std::vector<double>(O));
  const bool counts = r.has_grad_norms();
  for (size_t c = 0; c < C; ++c)
    for (size_t o = 0; o < O; ++o) {
      const RolloutTrace &t = r.traces[i][c][o], &ref = r.traces[0][c][o];
      g.diverged += !t.diverged.empty();
      double sum = 0;
      for (size_t k = 0; k < N; ++k) sum += t.loss[k] - ref.loss[k];
      g.final_loss[c][o] = t.loss[N - 1] - ref.loss[N - 1];
      g.mean_loss[c][o] = sum / double(N);
      g.nll[c][o] = t.nll - ref.nll;
      g.nll_fp32[c][o] = t.nll_fp32 - ref.nll_fp32;
      g.divergence[c][o] = t.divergence;
      if (!counts) continue;
      // Counted over the steps the rollout ran (a diverged one stops; a step the fp32 rollout
      // did not finish has no spike).
      double spikes = 0, excursions = 0;
      for (size_t k = 0; k < N; ++k) {
        spikes += t.loss[k] - ref.loss[k] > r.stability.spike_threshold;  // false on NaN
        excursions += t.grad_norm[k] > r.stability.grad_norm_limit;
      }
      g.spikes[c][o] = spikes, g.excursions[c][o] = excursions;
      g.nonfinite[c][o] = t.diverged.empty() ? 0.0 : 1.0;
    }
  return g;
}

size_t samples(const Grid& x) {
  size_t n = 0;
  for (const auto& row : x) n += row.size();
  return n;
}

// The finite values of x, row by row, rows left empty dropped: a rollout pair where the recipe
// or the fp32 reference stopped non-finite has no gap and is left out of that cell.
Grid finite_part(const Grid& x) {
  Grid f;
  for (const auto& row : x) {
    std::vector<double> r;
    for (double v : row)
      if (std::isfinite(v)) r.push_back(v);
    if (!r.empty()) f.push_back(std::move(r));
  }
  return f;
}

// Whether any rollout (fp32's included) stopped non-finite.
bool any_diverged(const RolloutResult& r) {
  for (const auto& by_c : r.traces)
    for (const auto& by_o : by_c)
      for (const RolloutTrace& t : by_o)
        if (!t.diverged.empty()) return true;
  return false;
}

// One cell of the report: "mean [lo, hi]" of the two-level bootstrap over the finite values
// (with "(n of N)" when some were left out) and its verdict (the interval's side of 0); with one
// rollout the mean alone and no verdict; "—" for both when none is finite. The bootstrap runs
// once per cell.
struct Cell {
  std::string text, verdict = "—";
};

Cell cell(const Grid& x, const RolloutRequest& req, int digits = 5) {
  const Grid f = finite_part(x);
  const size_t n = samples(f), all = samples(x);
  if (n == 0) return {"—"};
  char b[128];
  const std::string of = n < all ? " (" + std::to_string(n) + " of " + std::to_string(all) + ")" : "";
  if (n < 2) {
    std::snprintf(b, sizeof b, "%+.*f (one rollout%s)", digits, f[0][0],
                  n < all ? (" of " + std::to_string(all)).c_str() : "");
    return {b};
  }
  const Interval iv = bootstrap_two_level(f, req.resamples, req.bootstrap_seed);
  std::snprintf(b, sizeof b, "%+.*f [%+.*f, %+.*f]%s", digits, iv.mean, digits, iv.lo, digits, iv.hi, of.c_str());
  return {b, iv.hi < 0 ? "lower" : iv.lo > 0 ? "higher" : "not resolved"};
}

std::string interval(const Grid& x, const RolloutRequest& req) { return cell(x, req).text; }

Grid difference(const Grid& a, const Grid& b) {
  Grid d = a;
  for (size_t c = 0; c < d.size(); ++c)
    for (size_t o = 0; o < d[c].size(); ++o) d[c][o] = a[c][o] - b[c][o];
  return d;
}

// Mean over (checkpoint, order) of the loss gap at 0-based step k.
double mean_gap_at(const RolloutResult& r, size_t i, size_t k) {
  double s = 0;
  size_t n = 0;
  for (size_t c = 0; c < r.steps.size(); ++c)
    for (size_t o = 0; o < size_t(r.orders); ++o, ++n) s += r.traces[i][c][o].loss[k] - r.traces[0][c][o].loss[k];
  return s / double(n);
}

void gap_table(std::ostringstream& md, const RolloutResult& r, const std::vector<Gaps>& g,
               const RolloutRequest& req) {
  const size_t n = r.steps.size() * size_t(r.orders);
  md << "## Gap to the fp32 rollout\n\n"
        "N = " << r.length << " steps; " << n << " rollouts per recipe (" << r.steps.size()
     << " checkpoints × " << r.orders << " orders)"
     << (r.steps.size() < 3 ? "; with fewer than 3 checkpoints the intervals are rough and the "
                              "verdicts indicative" : "")
     << ". The training-loss gap includes the forward's quantization from step 1 on (compare "
        "\"Loss gap by step\"); the unquantized NLL gap is what training did to the weights. "
        "Recipe minus fp32, per (checkpoint, order), then the mean with a 95% two-level bootstrap "
        "interval (checkpoints, then orders; " << req.resamples << " resamples). Held-out NLL: "
        "under the recipe's quantized inference (policy current), and of the same weights "
        "unquantized (what training did to them, without the forward's quantization). "
        "Divergence: ‖θ_r − θ_fp32‖ / ‖θ_fp32 − θ_s‖ after the last step."
     << (any_diverged(r) ? " A rollout pair where the recipe or fp32 stopped non-finite has no gap: it "
                           "is left out of the cell, which then says how many of the rollouts it holds."
                         : "")
     << "\n\n"
        "| recipe | loss gap, step N | mean loss gap, steps 1..N | held-out NLL gap | NLL gap, unquantized | divergence | rollouts diverged |\n"
        "|--------|-----------------:|--------------------------:|-----------------:|---------------------:|-----------:|---------:|\n";
  for (size_t i = 1; i < r.recipes.size(); ++i)
    md << "| `" << r.recipes[i] << "` | " << interval(g[i].final_loss, req) << " | "
       << interval(g[i].mean_loss, req) << " | " << interval(g[i].nll, req) << " | "
       << interval(g[i].nll_fp32, req) << " | " << interval(g[i].divergence, req) << " | " << g[i].diverged
       << " of " << n << " |\n";
}

void step_table(std::ostringstream& md, const RolloutResult& r) {
  const size_t N = size_t(r.length);
  std::set<size_t> ks = {0, N / 4, N / 2, (3 * N) / 4, N - 1};
  md << "\n## Loss gap by step\n\nMean over checkpoints and orders of recipe minus fp32 training loss.\n\n| recipe |";
  for (size_t k : ks) md << " step " << k + 1 << " |";
  md << "\n|--------|";
  for (size_t k = 0; k < ks.size(); ++k) md << "------:|";
  md << "\n";
  for (size_t i = 1; i < r.recipes.size(); ++i) {
    md << "| `" << r.recipes[i] << "` |";
    for (size_t k : ks) {
      const double v = mean_gap_at(r, i, k);
      char b[32];
      std::snprintf(b, sizeof b, " %+.5f |", v);
      md << (std::isfinite(v) ? b : " — |");
    }
    md << "\n";
  }
}

void contrast_table(std::ostringstream& md, const RolloutResult& r, const std::vector<Gaps>& g,
                    const RolloutRequest& req) {
  if (r.recipes.size() < 3) return;
  md << "\n## Paired contrasts\n\nB minus A on the same checkpoints, orders and batches; the verdict "
        "is the interval's side of 0.\n\n"
        "| A | B | held-out NLL, B − A | verdict | unquantized NLL, B − A | verdict | loss at step N, B − A | verdict |\n"
        "|---|---|-------------------:|---------|----------------------:|---------|---------------------:|---------|\n";
  for (size_t a = 1; a < r.recipes.size(); ++a)
    for (size_t b = a + 1; b < r.recipes.size(); ++b) {
      const Grid dn = difference(g[b].nll, g[a].nll), du = difference(g[b].nll_fp32, g[a].nll_fp32),
                 dl = difference(g[b].final_loss, g[a].final_loss);
      md << "| `" << r.recipes[a] << "` | `" << r.recipes[b] << "` |";
      for (const Grid* d : {&dn, &du, &dl}) {
        const Cell c = cell(*d, req);
        md << " " << c.text << " | " << c.verdict << " |";
      }
      md << "\n";
    }
}

// The stress in words: "peak learning rate x 4, no warmup, 8 sequences per step".
std::string stress_text(const RolloutStress& st) {
  char b[256];
  std::snprintf(b, sizeof b, "peak learning rate x %g%s%s", st.lr_scale, st.no_warmup ? ", no warmup" : "",
                st.batch_size > 0 ? (", " + std::to_string(st.batch_size) + " sequences per step").c_str() : "");
  return b;
}

// The stability tables (only for traces with gradient norms): per recipe, fp32 included, the
// counts per rollout with intervals; then every pair's paired difference of counts.
void stability_table(std::ostringstream& md, const RolloutResult& r, const std::vector<Gaps>& g,
                     const RolloutRequest& req) {
  if (!r.has_grad_norms()) return;
  md << "\n## Stability\n\nStress: " << (r.stress.active() ? stress_text(r.stress) : std::string("none (the run's schedule and batch)"))
     << ", the same for fp32 and every recipe. Per rollout of " << r.length << " steps: loss spikes (steps whose "
        "training loss exceeds the fp32 rollout's on the same batch by more than "
     << r.stability.spike_threshold << " nats), gradient-norm excursions (global norm before clipping above "
     << r.stability.grad_norm_limit << ") and non-finite steps (a rollout stops at its first); the mean "
        "count per rollout with a 95% two-level bootstrap interval.\n\n"
        "| recipe | loss spikes | grad-norm excursions | non-finite | rollouts with a spike |\n"
        "|--------|------------:|---------------------:|-----------:|----------------------:|\n";
  const size_t n = r.steps.size() * size_t(r.orders);
  for (size_t i = 0; i < r.recipes.size(); ++i) {
    const Gaps& x = g[i];
    size_t with = 0;
    for (const auto& row : x.spikes)
      for (double v : row) with += v > 0;
    md << "| `" << r.recipes[i] << "` | " << (i == 0 ? std::string("—") : cell(x.spikes, req, 2).text) << " | "
       << cell(x.excursions, req, 2).text << " | " << cell(x.nonfinite, req, 2).text << " | "
       << (i == 0 ? std::string("—") : std::to_string(with) + " of " + std::to_string(n)) << " |\n";
  }
  if (r.recipes.size() < 3) return;
  md << "\n### Stability contrasts\n\nB minus A, counts per rollout on the same checkpoints, orders and "
        "batches.\n\n"
        "| A | B | loss spikes, B − A | verdict | grad-norm excursions, B − A | verdict | non-finite, B − A | verdict |\n"
        "|---|---|-------------------:|---------|----------------------------:|---------|------------------:|---------|\n";
  for (size_t a = 1; a < r.recipes.size(); ++a)
    for (size_t bb = a + 1; bb < r.recipes.size(); ++bb) {
      md << "| `" << r.recipes[a] << "` | `" << r.recipes[bb] << "` |";
      for (Grid Gaps::*m : {&Gaps::spikes, &Gaps::excursions, &Gaps::nonfinite}) {
        const Cell c = cell(difference(g[bb].*m, g[a].*m), req, 2);
        md << " " << c.text << " | " << c.verdict << " |";
      }
      md << "\n";
    }
}

json to_json(const RolloutResult& r) {
  json traces = json::array();
  for (const auto& by_c : r.traces) {
    json rc = json::array();
    for (const auto& by_o : by_c) {
      json ro = json::array();
      for (const RolloutTrace& t : by_o) {
        json loss = json::array();
        for (double v : t.loss) loss.push_back(number(v));
        json tr = {{"loss", loss}, {"nll", number(t.nll)}, {"nll_fp32", number(t.nll_fp32)},
                   {"divergence", number(t.divergence)}, {"diverged", t.diverged}};
        if (!t.grad_norm.empty()) {
          json gn = json::array();
          for (double v : t.grad_norm) gn.push_back(number(v));
          tr["grad_norm"] = gn;
        }
        ro.push_back(tr);
      }
      rc.push_back(ro);
    }
    traces.push_back(rc);
  }
  json j = {{"format", "fp4train.rollout.v1"}, {"run", r.run.string()}, {"steps", r.steps},
            {"recipes", r.recipes}, {"length", r.length}, {"orders", r.orders}, {"windows", r.windows},
            {"seed", r.seed}, {"machine", r.machine}, {"traces", traces}};
  // Written only where they mean something, so that files of earlier versions rebuild as they were.
  if (r.stress.active())
    j["stress"] = {{"lr_scale", r.stress.lr_scale}, {"no_warmup", r.stress.no_warmup},
                   {"batch_size", r.stress.batch_size}};
  if (r.resamples > 0) j["bootstrap"] = {{"resamples", r.resamples}, {"seed", r.bootstrap_seed}};
  if (r.has_grad_norms())
    j["stability"] = {{"spike_threshold", r.stability.spike_threshold},
                      {"grad_norm_limit", r.stability.grad_norm_limit}};
  return j;
}
}  // namespace

void write_rollout_report(const RolloutResult& r, const RolloutRequest& req, bool json) {
  std::error_code ec;
  fs::create_directories(req.out, ec);
  if (ec) throw UserError("rollout: cannot create " + req.out.string() + ": " + ec.message());
  std::vector<Gaps> g(r.recipes.size());
  for (size_t i = 0; i < r.recipes.size(); ++i) g[i] = gaps_of(r, i);
  std::ostringstream md;
  md << "# Paired rollouts\n\nRun `" << r.run.string() << "`, checkpoints of steps";
  for (int64_t s : r.steps) md << " " << s;
  md << "; " << r.length << " steps from each, " << r.orders << " batch order(s) (order 0: the run's own "
     << "batches); held-out NLL on " << r.windows << " windows; " << r.machine << ". How to read it: "
     << "docs/fidelity.md \"Paired rollouts\".\n\n";
  if (r.stress.active())
    md << "**Stressed** (docs/fidelity.md \"Stability stress\"): " << stress_text(r.stress)
       << ", for fp32 and every recipe alike; every figure below is under it.\n\n";
  gap_table(md, r, g, req);
  step_table(md, r);
  contrast_table(md, r, g, req);
  stability_table(md, r, g, req);
  write_file_atomic(req.out / "rollout.md", md.str());
  if (json) write_file_atomic(req.out / "rollout.json", to_json(r).dump(1) + "\n");
}

RolloutResult load_rollouts(const fs::path& file) {
  if (fs::is_directory(file)) throw UserError("rollout --from: " + file.string() + " is a directory, not a rollout.json");
  std::ifstream in(file);
  if (!in) throw UserError("rollout --from: cannot read " + file.string());
  RolloutResult r;
  try {
    const json j = json::parse(in);
    if (!j.is_object() || j.value("format", json()) != "fp4train.rollout.v1")
      throw UserError("rollout --from: " + file.string() + " is not a rollout.json (no \"format\": "
                      "\"fp4train.rollout.v1\")");
    r.run = j.at("run").get<std::string>();
    r.steps = j.at("steps").get<std::vector<int64_t>>();
    r.recipes = j.at("recipes").get<std::vector<std::string>>();
    r.length = int(whole(j.at("length"), "length", 1)), r.orders = int(whole(j.at("orders"), "orders", 1));
    r.windows = int(whole(j.at("windows"), "windows", 1));
    r.seed = uint64_t(whole(j.at("seed"), "seed", 0)), r.machine = j.at("machine");
    if (r.recipes.size() < 2 || r.recipes[0] != kRolloutReference)
      throw UserError("recipes must list \"" + std::string(kRolloutReference) + "\" first and at least one recipe");
    if (j.contains("stress")) {
      const json& st = j.at("stress");
      r.stress.lr_scale = number(st.at("lr_scale"), "stress.lr_scale"), r.stress.no_warmup = st.at("no_warmup");
      r.stress.batch_size = int(whole(st.at("batch_size"), "stress.batch_size", 0));
      if (!(r.stress.lr_scale > 0) || !std::isfinite(r.stress.lr_scale))
        throw UserError("stress.lr_scale must be a finite number above 0");
    }
    if (j.contains("bootstrap")) {
      r.resamples = j.at("bootstrap").at("resamples"), r.bootstrap_seed = j.at("bootstrap").at("seed");
      if (r.resamples < 1) throw UserError("bootstrap.resamples must be at least 1");
    }
    if (j.contains("stability")) {
      const json& st = j.at("stability");
      r.stability.spike_threshold = number(st.at("spike_threshold"), "stability.spike_threshold");
      r.stability.grad_norm_limit = number(st.at("grad_norm_limit"), "stability.grad_norm_limit");
      if (!(r.stability.spike_threshold > 0) || !std::isfinite(r.stability.spike_threshold) ||
          !(r.stability.grad_norm_limit > 0) || !std::isfinite(r.stability.grad_norm_limit))
        throw UserError("stability thresholds must be finite numbers above 0");
    }
    for (const json& rc : j.at("traces")) {
      r.traces.emplace_back();
      for (const json& ro : rc) {
        r.traces.back().emplace_back();
        for (const json& t : ro) {
          RolloutTrace tr;
          for (const json& v : t.at("loss")) tr.loss.push_back(number(v));
          tr.nll = number(t.at("nll")), tr.nll_fp32 = number(t.at("nll_fp32"));
          tr.divergence = number(t.at("divergence"));
          tr.diverged = t.at("diverged");
          if (t.contains("grad_norm"))
            for (const json& v : t.at("grad_norm")) tr.grad_norm.push_back(number(v));
          if (int(tr.loss.size()) != r.length) throw UserError("a trace's loss is not `length` long");
          if (!tr.grad_norm.empty() && int(tr.grad_norm.size()) != r.length)
            throw UserError("a trace's grad_norm is not `length` long");
          r.traces.back().back().push_back(tr);
        }
      }
    }
  } catch (const json::exception& e) {
    throw UserError("rollout --from: " + file.string() + ": " + e.what());
  } catch (const UserError& e) {
    throw UserError(std::string(e.what()).rfind("rollout", 0) == 0 ? e.what()
                                                                   : "rollout --from: " + file.string() + ": " + e.what());
  }
  if (r.traces.size() != r.recipes.size() || r.steps.empty() || r.length < 1 || r.orders < 1)
    throw UserError("rollout --from: " + file.string() + ": traces do not match recipes, steps, length and orders");
  for (const auto& rc : r.traces) {
    if (rc.size() != r.steps.size()) throw UserError("rollout --from: " + file.string() + ": a recipe lacks checkpoints");
    for (const auto& ro : rc) {
      if (ro.size() != size_t(r.orders)) throw UserError("rollout --from: " + file.string() + ": a checkpoint lacks orders");
      for (const RolloutTrace& t : ro)
        if (t.grad_norm.empty() == r.has_grad_norms())
          throw UserError("rollout --from: " + file.string() + ": some traces have grad_norm and some do not");
    }
  }
  return r;
}

}  // namespace fp4
