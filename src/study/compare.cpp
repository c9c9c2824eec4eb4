// The comparison of recipes (fp4/study/compare.h): its plan, its runs, their evaluation and
// the report. The CLI's cmd_compare.cpp parses the options and calls run_comparison.
#include "fp4/study/compare.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <toml++/toml.h>

#include "fp4/base/error.h"
#include "fp4/base/safetensors.h"
#include "fp4/eval/eval.h"
#include "fp4/nn/run_config.h"
#include "fp4/nn/model.h"
#include "fp4/study/evaluate.h"
#include "fp4/study/report.h"
#include "fp4/study/run_metrics.h"
#include "fp4/train/checkpoint.h"
#include "fp4/train/metrics_log.h"
#include "fp4/train/paths.h"
#include "fp4/base/words.h"
#include "fp4/train/interruptible.h"
#include "fp4/train/resolved_run.h"
#include "fp4/train/train.h"

namespace fp4 {
namespace fs = std::filesystem;
using json = nlohmann::json;
constexpr double kInf = std::numeric_limits<double>::infinity();

namespace {
std::vector<std::string> split_list(const std::string& s, const char* what) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty()) throw UserError(std::string(what) + ": empty entry in '" + s + "'");
    if (std::find(out.begin(), out.end(), item) != out.end())
      throw UserError(std::string(what) + ": '" + item + "' is listed twice");
    out.push_back(item);
  }
  if (out.empty()) throw UserError(std::string(what) + " is empty");
  return out;
}

std::string fmt_g(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", x);
  return b;
}

// x with 4 decimals.
std::string fmt_g4(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4f", x);
  return b;
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

/// A python3 that can import matplotlib: $FP4_PYTHON, else python3 on PATH, else
/// /usr/bin/python3 (Debian's, where python3-matplotlib installs). Empty if none.
std::string find_plot_python() {
  std::vector<std::string> cands;
  if (const char* e = std::getenv("FP4_PYTHON"); e && *e) cands.push_back(e);
  cands.push_back("python3");
  cands.push_back("/usr/bin/python3");
  for (const auto& c : cands)
    if (std::system((shell_quote(c) + " -c 'import matplotlib' >/dev/null 2>&1").c_str()) == 0)
      return c;
  return "";
}

json plan_json(const ComparePlan& p) {
  json j = {{"config", p.config_arg},
            {"config_name", p.config_name},
            {"config_toml", p.config_toml},
            {"recipes", p.recipes},
            {"names", p.names},
            {"policies", p.policies},
            {"seeds", p.seeds},
            {"steps", p.steps},
            {"save_every", p.save_every},
            {"keep_checkpoints", p.keep_checkpoints},
            {"tokens_per_run", p.tokens_per_run},
            {"model", p.model_line},
            {"sets", p.sets},
            {"baseline", p.baseline}};
  if (!p.hypotheses.empty()) j["hypotheses"] = p.hypotheses;  // absent: older files unchanged
  if (!p.task.empty()) j["task"] = p.task;
  if (p.effect != kPowerHalfWidth) j["effect"] = p.effect;
  if (!p.checkpoint_steps.empty()) j["checkpoint_steps"] = p.checkpoint_steps;
  return j;
}

}  // namespace

ComparePlan read_compare_plan(const fs::path& dir) {
  const fs::path f = dir / "compare.json";
  std::ifstream in(f);
  if (!in)
    throw UserError(dir.string() + " holds no compare.json (not a `fp4train compare` directory)");
  try {
    const json j = json::parse(in);
    ComparePlan p;
    p.config_arg = j.value("config", "");
    p.config_name = j.at("config_name");
    p.config_toml = j.at("config_toml");
    p.recipes = j.at("recipes").get<std::vector<std::string>>();
    p.names = j.contains("names") ? j.at("names").get<std::vector<std::string>>() : p.recipes;
    if (p.names.size() != p.recipes.size())
      throw UserError(f.string() + ": names and recipes differ in length");
    p.policies = j.at("policies").get<std::vector<std::string>>();
    p.seeds = j.at("seeds").get<std::vector<uint64_t>>();
    p.steps = j.at("steps");
    p.save_every = j.value("save_every", 50);
    p.keep_checkpoints = j.value("keep_checkpoints", 1);
    p.tokens_per_run = j.value("tokens_per_run", int64_t{0});
    p.model_line = j.value("model", "");
    if (j.contains("sets")) p.sets = j.at("sets").get<std::vector<std::string>>();
    p.baseline = j.value("baseline", "");
    p.hypotheses = j.value("hypotheses", "");
    p.task = j.value("task", "");
    p.effect = j.value("effect", kPowerHalfWidth);
    if (!(p.effect > 0)) throw UserError(f.string() + ": effect must be > 0");
    if (j.contains("checkpoint_steps"))
      p.checkpoint_steps = j.at("checkpoint_steps").get<std::vector<int>>();
    return p;
  } catch (const json::exception& e) {
    throw UserError(f.string() + ": malformed (" + e.what() + ")");
  }
}

namespace {
/// The command that reproduces the whole plan (all recipes and seeds so far).
std::string plan_command(const ComparePlan& p, const fs::path& out) {
  std::string recipes, policies;
  for (const auto& r : p.recipes) recipes += (recipes.empty() ? "" : ",") + r;
  for (const auto& q : p.policies) policies += (policies.empty() ? "" : ",") + q;
  std::vector<uint64_t> seeds = p.seeds;
  std::sort(seeds.begin(), seeds.end());
  std::string cmd = "fp4train compare --config " +
                    shell_quote(p.config_arg.empty() ? p.config_name : p.config_arg) +
                    " --recipes " + shell_quote(recipes) + " --steps " + std::to_string(p.steps);
  if (!seeds.empty() && seeds.back() - seeds.front() + 1 == seeds.size()) {
    cmd += " --seeds " + std::to_string(seeds.size());
    if (seeds.front() != 1) cmd += " --seed-base " + std::to_string(seeds.front());
  } else {
    cmd += "  # seeds";
    for (uint64_t x : seeds) cmd += " " + std::to_string(x);
    cmd += " (run once per --seed-base)\n   ";
  }
  for (const auto& x : p.sets) cmd += " --set " + shell_word(x);
  if (!p.baseline.empty()) cmd += " --baseline " + shell_word(p.baseline);
  if (!p.hypotheses.empty()) cmd += " --hypotheses " + shell_quote(p.hypotheses);
  if (!p.task.empty()) cmd += " --task " + shell_word(p.task);
  if (p.effect != kPowerHalfWidth) cmd += " --effect " + fmt_g(p.effect);
  if (!p.checkpoint_steps.empty()) {
    std::string list;
    for (int x : p.checkpoint_steps) list += (list.empty() ? "" : ",") + std::to_string(x);
    cmd += " --checkpoint-steps " + list;
  }
  return cmd + " --policies " + policies + " --out " + shell_quote(out.string());
}

/// The exact row name of the plan's baseline: --baseline (as given or labelled by --set,
/// find_baseline), else bf16, else fp32, else "" (none). Throws fp4::UserError when an
/// explicit --baseline is not among the compared recipes.
std::string plan_baseline(const ComparePlan& p, const std::string& baseline_arg) {
  const std::string want = baseline_arg.empty() ? p.baseline : baseline_arg;
  if (want.empty()) return default_baseline(p.names);
  const std::string b = find_baseline(p.names, want);
  if (b.empty()) {
    std::string list;
    for (const auto& n : p.names) list += (list.empty() ? "" : ", ") + n;
    throw UserError("--baseline " + want + " is not among the compared recipes (" + list +
                    "); add it to --recipes or choose one of them");
  }
  return b;
}

}  // namespace

fs::path compare_run_dir(const fs::path& out, const std::string& recipe_name, uint64_t seed) {
  return out / (dir_safe(recipe_name) + "-s" + std::to_string(seed));
}

namespace {
/// The finished runs of `plan` in `out` (completed or diverged), recipe by recipe; the
/// directories of the others go to *missing. Throws fp4::UserError when none has finished.
std::vector<RunRecord> finished_runs(const fs::path& out, const ComparePlan& plan,
                                     std::vector<std::string>* missing) {
  std::vector<RunRecord> runs;
  for (const auto& r : plan.names)
    for (uint64_t s : plan.seeds) {
      const fs::path d = compare_run_dir(out, r, s);
      if (fs::exists(d / "summary.json") || fs::exists(d / "error.txt"))
        runs.push_back(read_run(d));
      else
        missing->push_back(d.filename().string());
    }
  if (runs.empty()) throw UserError("no finished runs in " + out.string() + " yet");
  return runs;
}

/// The first columns (recipe .. the paired interval of the final-window loss) of the report's
/// main table, aligned for a terminal: what `compare` prints at its end.
void print_main_table(const std::string& md, const fs::path& report) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(md);
  std::string line;
  bool in_table = false;
  while (std::getline(in, line)) {
    if (!in_table && line.rfind("| recipe |", 0) != 0) continue;
    if (line.empty() || line[0] != '|') break;
    in_table = true;
    if (line.rfind("|---", 0) == 0) continue;
    std::vector<std::string> cells;
    size_t p = 1;
    while (cells.size() < 6) {
      const size_t q = line.find(" |", p);
      if (q == std::string::npos) break;
      std::string c = line.substr(p, q - p);
      c.erase(0, c.find_first_not_of(' '));
      cells.push_back(c);
      p = q + 2;
    }
    rows.push_back(cells);
  }
  if (rows.size() < 2) return;
  std::vector<size_t> w(6, 0);
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) w[i] = std::max(w[i], r[i].size());
  std::printf(
      "\nFinal-window loss (the full table, with held-out NLL per inference policy, "
      "stability and throughput: %s):\n",
      report.string().c_str());
  for (const auto& r : rows) {
    std::string s = " ";
    for (size_t i = 0; i < r.size(); ++i)
      s += " " + r[i] + std::string(w[i] - r[i].size() + 1, ' ');
    while (!s.empty() && s.back() == ' ') s.pop_back();
    std::printf("%s\n", s.c_str());
  }
}

}  // namespace

// Rebuild DIR/report.md (and DIR/plots/*.png) from the finished runs of the plan, with the gap
// columns and the difference plot against `baseline_arg` (empty: the plan's).
void write_comparison_report(const fs::path& out, const ComparePlan& plan, bool plots,
                             const std::string& baseline_arg, const std::string& hypotheses_arg,
                             bool print_table) {
  const std::string baseline = plan_baseline(plan, baseline_arg);
  const std::string hyp_file = hypotheses_arg.empty() ? plan.hypotheses : hypotheses_arg;
  // Read before anything is written, so a bad study file changes nothing.
  if (hypotheses_arg.empty() && !hyp_file.empty() && !fs::is_regular_file(resolve(hyp_file)))
    throw UserError((out / "compare.json").string() + " names the study file '" + hyp_file +
                    "' (its --hypotheses), which is not found from here; give --hypotheses FILE");
  const std::vector<Hypothesis> hyps = hyp_file.empty() ? std::vector<Hypothesis>{}
                                                        : load_hypotheses(resolve(hyp_file));
  std::vector<std::string> missing;
  const std::vector<RunRecord> runs = finished_runs(out, plan, &missing);
  ReportContext ctx;
  ctx.title = "Recipe comparison: " + plan.config_name;
  ctx.config_name = plan.config_name;
  ctx.command = plan_command(plan, out);
  ctx.model_line = plan.model_line;
  ctx.tokens_per_run = plan.tokens_per_run;
  ctx.policies = plan.policies;
  ctx.effect = plan.effect;
  // The verdicts as JSON, for the plot (and for anyone's own analysis); removed when the
  // report has no study file, so a stale one never describes other runs.
  const fs::path hyp_json = out / "hypotheses.json";
  if (!hyps.empty())
    write_file_atomic(hyp_json, hypotheses_json(hyps, runs));
  else if (fs::exists(hyp_json))
    fs::remove(hyp_json);
  if (!plots && fs::is_directory(out / "plots") && !fs::is_empty(out / "plots"))
    ctx.plots_note =
        "Plots were not remade (--no-plots): plots/ holds those of an earlier "
        "report, which may not match this one (another baseline, other runs).";
  if (plots) {
    const std::string py = find_plot_python();
    if (py.empty()) {
      ctx.plots_note =
          "Plots were not made: no python3 with matplotlib (Debian: apt install "
          "python3-matplotlib, or set FP4_PYTHON).";
    } else {
      std::string cmd = shell_quote(py) + " " +
                        shell_quote(resolve("tools/plot_runs.py").string()) + " --title " +
                        shell_quote(plan.config_name) + " --baseline " + shell_quote(baseline) +
                        " --out " + shell_quote((out / "plots").string());
      if (!hyps.empty()) cmd += " --hypotheses " + shell_quote(hyp_json.string());
      for (const auto& r : runs) cmd += " " + shell_quote(r.dir.string());
      const fs::path plots_dir = out / "plots";
      if (fs::exists(plots_dir) && !fs::is_directory(plots_dir))
        throw UserError(plots_dir.string() +
                        " exists and is not a directory; remove it or use --no-plots");
      std::fflush(stdout);
      if (std::system(cmd.c_str()) == 0) {
        for (const char* p : {"loss.png", "loss_vs_baseline.png", "heldout.png", "telemetry.png"})
          ctx.plots.push_back(std::string("plots/") + p);
        // Made only when the runs have the data (scale_hist telemetry, a study file).
        for (const char* p : {"scale_range.png", "hypotheses.png"})
          if (fs::exists(plots_dir / p)) ctx.plots.push_back(std::string("plots/") + p);
      } else {
        ctx.plots_note = "Plots failed: tools/plot_runs.py exited non-zero (see its message).";
      }
    }
  }
  std::string md = comparison_report_md(aggregate_runs(runs, plan.names, baseline), runs, ctx);
  md += minimal_pairs_md(runs, plan.names, plan.policies, baseline, hyps);
  if (!hyps.empty()) md += hypotheses_md(hyps, runs) + "\nStudy file: `" + hyp_file + "`.\n";
  if (!missing.empty()) {
    md += "\n## Not finished\n\n";
    for (const auto& m : missing) md += "* `" + m + "`\n";
  }
  write_file_atomic(out / "report.md", md);
  if (print_table) print_main_table(md, out / "report.md");
  std::printf("report: %s (%zu runs%s)\n", (out / "report.md").string().c_str(), runs.size(),
              missing.empty() ? ""
                              : (", " + std::to_string(missing.size()) + " not finished").c_str());
}

namespace {
// A comparison as its noise needs it: config label, steps, tokens, recipes and finished runs.
struct NoiseSource {
  std::string config;
  int steps = 0;
  int64_t tokens_per_run = 0;
  std::vector<std::string> names;
  std::vector<RunRecord> runs;
  std::string baseline;
};

// A comparison directory, read as `report` reads it.
NoiseSource noise_source_dir(const fs::path& dir) {
  const ComparePlan plan = read_compare_plan(dir);
  std::vector<std::string> missing;
  return {plan.config_name, plan.steps,  plan.tokens_per_run,
          plan.names,       finished_runs(dir, plan, &missing), plan_baseline(plan, "")};
}

// A committed report.md whose runs were not committed (docs/results/report.md): its title
// ("# Recipe comparison: CONFIG"), its reproduce command's --steps, its tokens per run, and the
// final-window loss of each run in its "## Per run" table (4 decimals; diverged runs left out).
NoiseSource noise_source_report(const fs::path& md) {
  std::ifstream in(md);
  if (!in) throw UserError("cannot read " + md.string());
  NoiseSource src;
  std::string line;
  bool per_run = false;
  while (std::getline(in, line)) {
    if (line.rfind("# Recipe comparison: ", 0) == 0) src.config = line.substr(21);
    if (const size_t p = line.find(" --steps "); p != std::string::npos && src.steps == 0)
      src.steps = std::atoi(line.c_str() + p + 9);
    if (const size_t p = line.find(" training tokens per run"); p != std::string::npos) {
      const size_t b = line.find_last_of(' ', p - 1);
      src.tokens_per_run = std::atoll(line.c_str() + (b == std::string::npos ? 0 : b + 1));
    }
    if (line.rfind("## ", 0) == 0) per_run = line == "## Per run";
    if (!per_run || line.rfind("| ", 0) != 0 || line.rfind("| recipe |", 0) == 0) continue;
    std::istringstream cells(line.substr(2));
    std::string recipe, seed, loss;
    std::getline(cells, recipe, '|'), std::getline(cells, seed, '|'), std::getline(cells, loss, '|');
    RunRecord r;
    r.recipe = recipe.substr(0, recipe.find_last_not_of(' ') + 1);
    r.seed = std::strtoull(seed.c_str(), nullptr, 10);
    r.final_window_loss = std::strtod(loss.c_str(), nullptr);
    r.steps = src.steps;
    if (loss.find("diverged") != std::string::npos) continue;
    if (std::find(src.names.begin(), src.names.end(), r.recipe) == src.names.end())
      src.names.push_back(r.recipe);
    src.runs.push_back(r);
  }
  if (src.config.empty() || src.steps < 1 || src.runs.empty())
    throw UserError(md.string() + ": not a comparison report with a title, a reproduce command "
                    "with --steps and a \"## Per run\" table");
  src.baseline = default_baseline(src.names);
  return src;
}
}  // namespace

std::string noise_table_toml(const std::vector<fs::path>& dirs, const std::string& command) {
  std::ostringstream o;
  o << "# The paired noise of finished comparisons: per config and recipe, the std over seeds of\n"
       "# (recipe - baseline) final-window loss, in nats. `fp4train compare` reads it to say,\n"
       "# before it trains, how many seeds a difference of --effect nats takes (docs/compare.md\n"
       "# \"Power before cost\"). Generated from the runs in each `source` (a report.md: its\n"
       "# per-run table, 4 decimals), do not edit:\n#   "
    << command << "\n";
  for (const fs::path& dir : dirs) {
    const NoiseSource src =
        dir.extension() == ".md" ? noise_source_report(dir) : noise_source_dir(dir);
    if (src.baseline.empty())
      throw UserError(dir.string() +
                      ": no baseline among its recipes (bf16 or fp32, or "
                      "--baseline): no paired noise to measure");
    const std::vector<RecipeRow> rows = aggregate_runs(src.runs, src.names, src.baseline);
    if (std::none_of(rows.begin(), rows.end(), [&](const RecipeRow& r) {
          return r.recipe != src.baseline && r.paired_delta_baseline.n >= 2;
        }))
      throw UserError(dir.string() + ": no recipe has 2 or more seeds paired with the baseline " +
                      src.baseline + ", so it measures no paired noise");
    o << "\n[[measured]]\nconfig = " << json(src.config).dump()
      << "\nsource = " << json(dir.string()).dump() << "\nsteps = " << src.steps
      << "\ntokens_per_run = " << src.tokens_per_run << "\nbaseline = " << json(src.baseline).dump()
      << "\n# recipe = { seeds paired with the baseline, std over them (nats) }\n"
         "[measured.paired]\n";
    for (const RecipeRow& r : rows) {
      if (r.recipe == src.baseline || r.paired_delta_baseline.n < 2) continue;
      char b[64];
      std::snprintf(b, sizeof b, "%.6f", r.paired_delta_baseline.std);
      o << json(r.recipe).dump() << " = { seeds = " << r.paired_delta_baseline.n << ", std = " << b
        << " }\n";
    }
  }
  return o.str();
}

namespace {
// One [[measured]] table of a noise table (read_noise_table); `where` names it in errors.
MeasuredNoise read_measured(const toml::table& t, const std::string& where) {
  MeasuredNoise m;
  auto text = [&](const char* key) {
    const auto v = t[key].value<std::string>();
    if (!v || v->empty()) throw UserError(where + ": missing or empty '" + key + "'");
    return *v;
  };
  m.config = text("config");
  m.source = text("source");
  m.baseline = text("baseline");
  m.steps = static_cast<int>(t["steps"].value<int64_t>().value_or(0));
  m.tokens_per_run = t["tokens_per_run"].value<int64_t>().value_or(0);
  if (m.steps < 1) throw UserError(where + ": 'steps' must be an integer >= 1");
  const toml::table* paired = t["paired"].as_table();
  if (!paired) throw UserError(where + ": missing table 'paired'");
  for (const auto& [key, node] : *paired) {
    const std::string name(key.str());
    const toml::table* e = node.as_table();
    const auto seeds = e ? (*e)["seeds"].value<int64_t>() : std::nullopt;
    const auto sd = e ? (*e)["std"].value<double>() : std::nullopt;
    if (!seeds || *seeds < 2 || !sd || !(*sd >= 0))
      throw UserError(where + ": paired '" + name + "' needs seeds >= 2 and std >= 0");
    m.paired.push_back({name, {static_cast<int>(*seeds), *sd}});
  }
  return m;
}
}  // namespace

std::vector<MeasuredNoise> read_noise_table(const fs::path& file) {
  toml::table t;
  try {
    t = toml::parse_file(file.string());
  } catch (const toml::parse_error& e) {
    throw UserError(file.string() + ": malformed TOML (" + std::string(e.description()) + ")");
  }
  const toml::array* arr = t["measured"].as_array();
  if (!arr) throw UserError(file.string() + ": no [[measured]] tables");
  std::vector<MeasuredNoise> out;
  for (size_t i = 0; i < arr->size(); ++i) {
    const toml::table* m = arr->at(i).as_table();
    const std::string where = file.string() + " [[measured]] #" + std::to_string(i + 1);
    if (!m) throw UserError(where + ": not a table");
    out.push_back(read_measured(*m, where));
  }
  return out;
}

namespace {

// One comparison, stage by stage (as TrainRun in src/train/trainer.cpp): plan (the config and
// the plan, merged with the directory's), check (every recipe and every existing run against
// the plan, before anything is trained), execute (each recipe × seed trained, evaluated and
// scored), report. Its members are what a stage hands on to the next.
struct Comparison {
  explicit Comparison(const CompareRequest& a) : a(a), out(a.out) {}

  void plan_runs();
  void check();
  void estimate_power() const;
  void execute();
  void report() { write_comparison_report(out, plan, !a.no_plots, "", "", /*print_table=*/true); }

  // plan's and check's parts.
  void merge_directory_plan();
  void check_recipes();
  void check_run_directory(size_t ri, uint64_t seed) const;
  // execute's parts.
  void write_plan();
  bool train_one(size_t ri, uint64_t seed, const std::string& head);
  void note_missing_checkpoints(const fs::path& d, const std::string& head) const;
  void train_interruptibly(const ValidatedRun& checked, const TrainOptions& opt);
  void evaluate_one(const fs::path& d, const std::string& head);
  void score_tasks(const fs::path& d, const std::string& head);
  static void log(const std::string& s) { std::printf("%s\n", s.c_str()), std::fflush(stdout); }

  // Given.
  const CompareRequest& a;
  const fs::path out;

  // plan.
  ResolvedRun run;  // the config, without a recipe; check resolves each recipe on it
  ComparePlan plan;
  // check.
  std::vector<ValidatedRun> recipes;  // each checked on the config once (validate_run)
  // execute.
  TokenData data;
  std::string policies;  // plan.policies joined by ','
  size_t diverged = 0;
};

void Comparison::plan_runs() {
  if (a.out.empty()) throw UserError("--out DIR is required");
  RunRequest request;
  request.config = a.config;
  request.sets = a.sets;
  if (a.steps > 0) request.taken.push_back({"train.steps", "--steps"});
  request.taken.push_back({"train.seed", "--seeds/--seed-base (every run sets its own seed)"});
  request.steps = a.steps;
  run = resolve_run(request);
  const RunConfig& cfg = run.config;

  plan.config_arg = a.config;
  plan.config_name = run.label;
  plan.sets = run.sets.given;
  plan.baseline = a.baseline;
  plan.hypotheses = a.hypotheses;
  for (const std::string& t : split_task_list(a.task)) check_task_name(t, "--task");
  plan.task = join_task_list(split_task_list(a.task));
  if (!a.hypotheses.empty()) (void)load_hypotheses(resolve(a.hypotheses));  // fail before training
  plan.recipes = split_list(a.recipes, "--recipes");
  for (const EvalPolicy& p : parse_eval_policies(a.policies)) plan.policies.push_back(p.name());
  for (int i = 0; i < a.seeds; ++i) plan.seeds.push_back(a.seed_base + i);
  plan.steps = cfg.train.steps;
  plan.save_every = a.save_every;
  plan.keep_checkpoints = a.keep_checkpoints;
  if (!(a.effect > 0) || !std::isfinite(a.effect))
    throw UserError("--effect must be a difference in nats > 0, got " + fmt_g(a.effect));
  plan.effect = a.effect;
  for (int st : a.checkpoint_steps)
    if (st < 1 || st > cfg.train.steps)
      throw UserError("--checkpoint-steps: step " + std::to_string(st) +
                      " is not a step of the runs (1.." + std::to_string(cfg.train.steps) + ")");
  plan.checkpoint_steps = a.checkpoint_steps;
  std::sort(plan.checkpoint_steps.begin(), plan.checkpoint_steps.end());
  plan.checkpoint_steps.erase(
      std::unique(plan.checkpoint_steps.begin(), plan.checkpoint_steps.end()),
      plan.checkpoint_steps.end());
  plan.tokens_per_run = int64_t(cfg.train.steps) * cfg.train.batch_size * cfg.train.seq_len;
  RunConfig c0 = cfg;
  c0.train.seed = 0;  // the plan's config is seed-free; runs set their own
  plan.config_toml = run_config_to_toml(c0);
  if (fs::exists(out / "compare.json")) merge_directory_plan();
}

// The plan of a comparison already in --out: the same --set arguments and config, and the
// union of its recipes, seeds, policies and tasks with the new ones, in first-seen order.
void Comparison::merge_directory_plan() {
  const ComparePlan old = read_compare_plan(out);
  if (old.sets != plan.sets) {
    auto list = [](const std::vector<std::string>& v) {
      std::string o;
      for (const auto& x : v) o += " --set " + shell_word(x);
      return o.empty() ? std::string(" no --set") : o;
    };
    throw UserError(out.string() + " holds a comparison made with" + list(old.sets) + ", not" +
                    list(plan.sets) +
                    "; give the same --set arguments or choose another --out "
                    "(nothing was changed)");
  }
  if (old.config_toml != plan.config_toml)
    throw UserError(out.string() + " holds a comparison with a different config or --steps (" +
                    old.config_name + ", " + std::to_string(old.steps) +
                    " steps); choose another --out (nothing was changed)");
  auto add_new = [](auto& to, const auto& from) {
    for (const auto& x : from)
      if (std::find(to.begin(), to.end(), x) == to.end()) to.push_back(x);
  };
  add_new(plan.recipes, old.recipes);
  add_new(plan.seeds, old.seeds);
  add_new(plan.policies, old.policies);
  if (plan.baseline.empty()) plan.baseline = old.baseline;
  if (plan.hypotheses.empty()) plan.hypotheses = old.hypotheses;
  if (!a.effect_given) plan.effect = old.effect;  // not given: the directory's
  if (plan.checkpoint_steps.empty()) plan.checkpoint_steps = old.checkpoint_steps;
  std::vector<std::string> tasks = split_task_list(old.task);  // the old ones, then the new
  add_new(tasks, split_task_list(plan.task));
  plan.task = join_task_list(tasks);
}

void Comparison::check() {
  check_recipes();
  (void)plan_baseline(plan, "");  // the baseline must be among the recipes
  for (size_t ri = 0; ri < recipes.size(); ++ri)
    for (uint64_t seed : plan.seeds) check_run_directory(ri, seed);
  // The task reads the held-out documents: refused before any run for pre-tokenized data.
  if (!plan.task.empty()) {
    const std::string f = resolve_data_format(run.data);
    if (f != "text" && f != "jsonl")
      throw UserError("--task " + plan.task + " scores held-out documents, and the data ('" +
                      run.data.path.string() + "', " + f + ") is pre-tokenized: it has none");
  }
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec || !fs::is_directory(out))
    throw UserError("cannot create the comparison directory --out " + out.string() + " (" +
                    (ec ? ec.message() : "exists and is not a directory") + ")");
}

// Every recipe resolved on the config and checked before anything runs; names must be unique
// (they label the rows and name the run directories).
void Comparison::check_recipes() {
  for (const auto& arg : plan.recipes) {
    recipes.push_back(validate_run(resolve_recipe(run, arg)));
    const std::string& name = recipes.back().recipe().name;
    for (size_t i = 0; i < plan.names.size(); ++i)
      if (plan.names[i] == name || dir_safe(plan.names[i]) == dir_safe(name))
        throw UserError("--recipes: '" + plan.recipes[i] + "' and '" + arg + "' are both named '" +
                        name +
                        "' (runs and report rows are labelled by name); give one of them "
                        "another `name = ...` in its file");
    plan.names.push_back(name);
  }
}

namespace {
// The GEMM mode of a run's recipe.toml (file) that differs from `now` in linear.gemm alone, or ""
// when it differs in anything else or does not parse. Runs made before gemm = "auto" moved the
// shipped recipes to decoded-bf16 differ from them in exactly that.
std::string gemm_of_older_run(const fs::path& file, const Recipe& now) {
  try {
    Recipe old = load_recipe_file(file);
    const GemmMode was = old.gemm;
    if (was == now.gemm) return "";
    old.gemm = now.gemm;
    return recipe_to_toml(old) == recipe_to_toml(now) ? gemm_mode_name(was) : "";
  } catch (const std::exception&) {
    return "";
  }
}
}  // namespace

// A reused or resumed run must have been made with exactly this config and recipe.
void Comparison::check_run_directory(size_t ri, uint64_t seed) const {
  const fs::path d = compare_run_dir(out, plan.names[ri], seed);
  RunConfig rc = run.config;
  rc.train.seed = seed;
  auto same = [&](const char* file, const std::string& text) {
    std::ifstream f(d / file, std::ios::binary);
    if (!f) return true;  // not started
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str() == text;
  };
  // A summary without the files a run writes first is not a finished run (another process,
  // still running or killed mid-way, wrote into a recreated directory): it would be reused
  // with no config to check and no metrics to report. (A compacted run holds
  // metrics.jsonl.zst instead of metrics.jsonl.)
  if (fs::exists(d / "summary.json"))
    for (const char* f : {"config.toml", "recipe.toml", kMetricsFile})
      if (!fs::exists(d / f) &&
          !(f == std::string(kMetricsFile) && fs::exists(d / kCompactMetricsFile)))
        throw UserError(d.string() + " holds summary.json but no " + f +
                        ": not a complete run (was another process writing into it?); remove "
                        "that run directory to train it again (nothing was changed)");
  const Recipe& now = recipes[ri].recipe();
  const bool same_config = same("config.toml", run_config_to_toml(rc));
  const bool same_recipe = same("recipe.toml", recipe_to_toml(now));
  if (same_config && !same_recipe)
    if (const std::string old = gemm_of_older_run(d / "recipe.toml", now); !old.empty())
      throw UserError(d.string() + " holds a run made with linear.gemm = \"" + old + "\", where " +
                      plan.recipes[ri] + " now runs \"" + gemm_mode_name(now.gemm) +
                      "\" (the recipe is otherwise the same; docs/gemm.md \"Decoded FP4 on the "
                      "BF16 GEMM\"): the two GEMMs round differently, so their runs are not mixed "
                      "in one comparison. Use another --out for new runs (`fp4train report` still "
                      "reads the finished ones), adding --set linear.gemm=" +
                      old +
                      " there to rerun that GEMM's arithmetic (other kernels may have changed "
                      "since: docs/results.md); nothing was changed");
  if (!same_config || !same_recipe)
    throw UserError(d.string() + " holds a run made with a different " +
                    (same_config ? "recipe (recipe.toml)" : "config (config.toml)") +
                    " than " + plan.recipes[ri] +
                    " now gives; remove that run directory or use "
                    "another --out (nothing was changed)");
}

namespace {
// The paired std a power estimate uses for one recipe against the baseline: the measurement
// with the most seeds among `measured` (one config's entries), else the largest measured for
// any recipe of that config (measured = false).
struct PowerInput {
  double std = 0;
  int seeds = 0;
  std::string source;
  bool measured = false;
};
PowerInput power_input(const std::vector<const MeasuredNoise*>& measured, const std::string& recipe,
                       const std::string& baseline) {
  PowerInput in;
  for (const MeasuredNoise* m : measured)
    for (const auto& [name, p] : m->paired) {
      const bool mine = name == recipe && m->baseline == baseline;
      if (mine && (!in.measured || p.seeds > in.seeds)) in = {p.std, p.seeds, m->source, true};
      if (!in.measured && p.std > in.std)
        in = {p.std, p.seeds, m->source + " (" + name + ")", false};
    }
  return in;
}

// The seeds the least favourable recipe of a config's entries needs for ±effect (0: none).
int config_seeds_needed(const std::vector<const MeasuredNoise*>& measured, double effect) {
  int n = 0;
  for (const MeasuredNoise* m : measured)
    for (const auto& [name, p] : m->paired) n = std::max(n, seeds_for_half_width(p.std, effect));
  return n;
}
}  // namespace

// Power before cost (docs/compare.md "Power before cost"): from the measured paired noise of
// this config (the --noise table), the 95% half-width the planned seeds give each recipe's
// difference to the baseline and the seeds ±effect takes; a warning, naming those seeds and a
// measured config that could, when the plan cannot resolve it. Never refuses.
void Comparison::estimate_power() const {
  const std::string base = plan_baseline(plan, ""), e = fmt_g(plan.effect);
  const fs::path table = resolve(a.noise);
  const bool contrasts = std::any_of(plan.names.begin(), plan.names.end(),
                                     [&](const std::string& r) { return r != base; });
  if (base.empty() || !contrasts || !fs::is_regular_file(table)) {
    log("power: not estimated (" +
        (base.empty() ? std::string("no baseline")
         : !contrasts ? "no recipe besides the baseline " + base
                      : "no noise table " + a.noise) +
        ")");
    return;
  }
  const std::vector<MeasuredNoise> all = read_noise_table(table);
  std::map<std::string, std::vector<const MeasuredNoise*>> by_config;
  for (const MeasuredNoise& m : all) by_config[m.config].push_back(&m);
  // The measured config that resolves ±effect with the fewest seeds: the suggestion.
  std::string best;
  int best_n = 0;
  for (const auto& [name, ms] : by_config) {
    const int n = config_seeds_needed(ms, plan.effect);
    if (n > 0 && (best.empty() || n < best_n)) best = name, best_n = n;
  }
  const int planned = static_cast<int>(plan.seeds.size());
  auto it = by_config.find(plan.config_name);
  if (it != by_config.end() && std::all_of(it->second.begin(), it->second.end(),
                                           [](const MeasuredNoise* m) { return m->paired.empty(); }))
    it = by_config.end();  // entries with nothing measured: unknown noise
  if (it == by_config.end()) {
    std::string known;
    for (const auto& [name, ms] : by_config) known += (known.empty() ? "" : ", ") + name;
    log("power: the paired noise of config " + plan.config_name + " is unknown (" + a.noise +
        " measures " + known + "); a pilot measures it: 3 seeds of " + base +
        " and one recipe, then `fp4train report DIR` gives its Power table" +
        (best.empty() ? ""
                      : "; configs/" + best + ".toml resolves ±" + e + " nats with " +
                            std::to_string(best_n) + " seeds"));
    return;
  }
  log("power: the paired noise of config " + plan.config_name + " (" + a.noise + ") against " +
      base + ", for ±" + e + " nats with the planned " + count_of(planned, "seed") + ":");
  int need = 0;
  for (const std::string& r : plan.names) {
    if (r == base) continue;
    const PowerInput in = power_input(it->second, r, base);
    const int n = seeds_for_half_width(in.std, plan.effect);
    need = std::max(need, n);
    const double hw = planned >= 2
                          ? t_quantile_975(planned - 1) * in.std / std::sqrt(double(planned))
                          : kInf;
    char b[160];
    std::snprintf(b, sizeof b, "  %s: paired std %.4f -> 95%% half-width %s; ±%s takes %s%d seeds (",
                  r.c_str(), in.std, planned >= 2 ? ("±" + fmt_g4(hw)).c_str() : "none (1 seed)",
                  e.c_str(), n >= 100000 ? ">= " : "", n);
    log(b +
        std::string(in.measured
                        ? "measured over " + std::to_string(in.seeds) + " seeds in " + in.source
                        : "not measured: the largest of the config, " + in.source) +
        ")");
  }
  for (const MeasuredNoise* m : it->second)
    if (m->steps != plan.steps)
      log("  (" + m->source + " was measured at " + std::to_string(m->steps) +
          " steps; this plan has " + std::to_string(plan.steps) + ": its spread may differ)");
  // --seeds takes at most kMaxSeeds; seeds_for_half_width stops searching at 100000.
  constexpr int kMaxSeeds = 100;
  const std::string takes =
      need >= 100000   ? "100000 seeds or more"
      : need > kMaxSeeds ? count_of(need, "seed") + ", more than --seeds allows (" +
                             std::to_string(kMaxSeeds) + ")"
                         : count_of(need, "seed") + " (--seeds " + std::to_string(need) + ")";
  if (need > planned)
    log("WARNING: " + count_of(planned, "seed") + " cannot resolve ±" + e + " nats on " +
        plan.config_name + ": it takes " + takes +
        (!best.empty() && best != plan.config_name && best_n < need
             ? "; configs/" + best + ".toml could with " + std::to_string(best_n)
             : "") +
        ". Training anyway.");
}

void Comparison::execute() {
  data = prepare_tokens(run.data, run.config.model.vocab_size, run.cache_dir, log);
  write_plan();
  for (const auto& p : plan.policies) policies += (policies.empty() ? "" : ",") + p;
  const size_t total = recipes.size() * plan.seeds.size();
  size_t k = 0;
  for (size_t ri = 0; ri < recipes.size(); ++ri)
    for (uint64_t seed : plan.seeds) {
      char head[256];
      std::snprintf(head, sizeof head, "[%zu/%zu] recipe %s, seed %llu: ", ++k, total,
                    plan.names[ri].c_str(), static_cast<unsigned long long>(seed));
      if (!train_one(ri, seed, head)) continue;  // diverged: a result, with nothing to evaluate
      const fs::path d = compare_run_dir(out, plan.names[ri], seed);
      evaluate_one(d, head);
      score_tasks(d, head);
    }
  if (diverged)
    log(std::to_string(diverged) + " run(s) diverged; see the report's *diverged* column");
}

// compare.json, with the model's line for the report.
void Comparison::write_plan() {
  const RunConfig& cfg = run.config;
  nn::Model probe(cfg.model, Recipe{}, 1, 1);
  char b[160];
  std::snprintf(b, sizeof b, "%.2f M parameters, %d blocks ", probe.num_params() / 1e6,
                probe.n_blocks());
  plan.model_line = b + probe.pattern();
  std::snprintf(b, sizeof b, ", d_model %d, vocab %d", cfg.model.d_model, cfg.model.vocab_size);
  plan.model_line += b;
  write_file_atomic(out / "compare.json", plan_json(plan).dump(2) + "\n");
}

// One run of the plan: reused when finished, kept when diverged (training is deterministic:
// it would diverge again), moved aside and retried when it failed, resumed bit for bit from
// its newest checkpoint when interrupted, else trained. False when it diverged.
// A reused run saved before --checkpoint-steps named some of its steps has no checkpoint there:
// say so (nothing retrains a finished run), so a fidelity panel on those steps is no surprise.
void Comparison::note_missing_checkpoints(const fs::path& d, const std::string& head) const {
  std::string missing;
  for (int s : plan.checkpoint_steps) {
    if (s <= plan.steps && !fs::exists(d / "checkpoints" / checkpoint_file_name(s)))
      missing += (missing.empty() ? "" : ",") + std::to_string(s);
  }
  if (!missing.empty())
    log(head + "note: it has no checkpoint at --checkpoint-steps " + missing +
        " (it finished before they were asked for); remove " + d.string() +
        " to train it again with them");
}

bool Comparison::train_one(size_t ri, uint64_t seed, const std::string& head) {
  const fs::path d = compare_run_dir(out, plan.names[ri], seed);
  const ValidatedRun checked = recipes[ri].with_seed(seed);  // no check depends on the seed
  TrainOptions opt;
  opt.out_dir = d;
  opt.config_name = plan.config_name;
  opt.save_every = a.save_every;
  opt.keep_checkpoints = a.keep_checkpoints;
  opt.keep_steps.assign(plan.checkpoint_steps.begin(), plan.checkpoint_steps.end());
  if (!fs::exists(d / "summary.json") && run_error(d) == RunError::Failed) {
    // A failure (not a divergence) is not a result: start that run again.
    const fs::path failed = d.string() + ".failed";
    fs::remove_all(failed);
    fs::rename(d, failed);
    log(head + "failed earlier, moved to " + failed.string() + " and retried");
  }
  if (fs::exists(d / "summary.json")) {
    log(head + "finished earlier, reused (" + d.string() + ")");
    note_missing_checkpoints(d, head);
    return true;
  }
  if (fs::exists(d / "error.txt")) {
    log(head + "diverged earlier, kept (" + (d / "error.txt").string() + ")");
    ++diverged;
    return false;
  }
  try {
    if (fs::exists(d) && !list_checkpoints(d).empty()) {
      std::string warn;
      const Checkpoint ck = load_newest_checkpoint(d, nullptr, &warn);
      if (!warn.empty()) log(warn);
      log(head + "resuming " + d.string() + " from step " + std::to_string(ck.step));
      opt.resume_from = &ck;
      train_interruptibly(checked, opt);
      return true;
    }
    if (fs::exists(d)) {  // started, but stopped before its first checkpoint
      const fs::path stale = d.string() + ".incomplete";
      fs::remove_all(stale);
      fs::rename(d, stale);
      log(head + "an unfinished run without checkpoints was moved to " + stale.string());
    }
    log(head + "training into " + d.string());
    train_interruptibly(checked, opt);
    return true;
  } catch (const UserError& e) {
    if (run_error(d) != RunError::Diverged) throw;  // not a divergence: stop the comparison
    log(head + "DIVERGED: " + e.what() + "; continuing with the next run");
    ++diverged;
    return false;
  }
}

// One run, stopped after its current step by SIGINT / SIGTERM (StopOnSignal): the message
// says how to continue, and the process ends as killed by the signal.
void Comparison::train_interruptibly(const ValidatedRun& checked, const TrainOptions& opt) {
  const InterruptibleRun r = train_interruptible(checked, data, opt);
  const TrainSummary& s = r.summary;
  // During the run's last step: it completed; the comparison stops before the next.
  if (r.late_signal != 0)
    end_by_signal(r.late_signal, "\n" + signal_name(r.late_signal) +
                                     " arrived during the last step of " + opt.out_dir.string() +
                                     ", which completed; its held-out evaluation and "
                                     "the other runs are left. Continue the comparison with:\n  " +
                                     plan_command(plan, out) + "\n");
  if (s.stop_signal == 0) return;
  end_by_signal(s.stop_signal,
                "\nstopped by " + signal_name(s.stop_signal) + " in " + opt.out_dir.string() +
                    " after step " + std::to_string(s.steps) + " of " +
                    std::to_string(checked.config().train.steps) + "; checkpoint " +
                    s.checkpoint.string() +
                    "\nContinue the comparison (finished runs are reused, this one resumes "
                    "bit for bit) with:\n  " +
                    plan_command(plan, out) + "\n");
}

// Held-out NLL under every policy of the plan, from the run's final checkpoint; recomputed
// when eval.json lacks a policy (e.g. one added to the plan later).
void Comparison::evaluate_one(const fs::path& d, const std::string& head) {
  bool need_eval = !fs::exists(d / "eval.json");
  if (!need_eval) {
    std::ifstream f(d / "eval.json");
    json e = json::parse(f, nullptr, false);
    for (const auto& p : plan.policies)
      need_eval |= e.is_discarded() || !e.contains("results") || !e["results"].contains(p);
  }
  if (!need_eval) return;
  log(head + "held-out NLL under " + policies);
  eval_checkpoint_to_json(d.string(), policies, (d / "eval.json").string(), run.data.path.string());
}

// Each downstream task under every policy (DIR/<run>/task.json, task-TASK.json), when the plan
// has tasks; recomputed when the file lacks a policy. It needs the final checkpoint, which a
// fresh clone of committed runs does not have: then the run is listed and skipped.
void Comparison::score_tasks(const fs::path& d, const std::string& head) {
  for (const std::string& task : split_task_list(plan.task)) {
    const std::string file = task_file_name(task);
    // Checked as the report reads it (read_run), so a file the report would refuse is
    // recomputed, not reused.
    bool need_task = true, unusable = false;
    if (fs::exists(d / file)) {
      try {
        if (task == "next-sentence") {
          const RunRecord rr = read_run(d);
          need_task = rr.task != task;
          for (const auto& p : plan.policies) need_task |= rr.task_results.count(p) == 0;
        } else {  // its own file only: a bad task.json does not make it unusable
          const RunRecord::Pairs pr = read_minimal_pairs_file(d / file);
          need_task = false;
          for (const auto& p : plan.policies) need_task |= pr.results.count(p) == 0;
        }
      } catch (const UserError& e) {
        unusable = true;
        log(head + file + " is unusable (" + e.what() + ")");
      }
    }
    if (need_task && list_checkpoints(d).empty()) {
      if (unusable) {
        fs::rename(d / file, d / (file + ".unusable"));
        log(head + "moved it to " + (d / (file + ".unusable")).string());
      }
      log(head + "no checkpoint to run --task " + task + " on (" + d.string() + "): " +
          (fs::exists(d / file) ? "its " + file + " is reported as it is"
                                : "the report has no " + task + " accuracy for it"));
    } else if (need_task) {
      log(head + task + " under " + policies);
      task_checkpoint_to_json(d.string(), task, policies, (d / file).string(),
                              run.data.path.string());
    }
  }
}

}  // namespace

void run_comparison(const CompareRequest& a) {
  Comparison c(a);
  c.plan_runs();
  c.check();
  c.estimate_power();
  c.execute();
  c.report();
}

}  // namespace fp4
