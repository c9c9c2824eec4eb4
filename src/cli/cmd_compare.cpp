// `fp4train compare` (train every recipe × seed on one config, evaluate, report), `report DIR`
// (rebuild the report) and `compact DIR...` (compress finished runs' logs): the options and
// calls into the study room (fp4/study/compare.h, fp4/study/run_metrics.h).
#include <cstdlib>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "fp4/base/error.h"
#include "fp4/base/safetensors.h"
#include "fp4/study/compare.h"
#include "fp4/study/run_metrics.h"
#include "fp4/train/metrics_log.h"
#include "fp4/train/train.h"
#include "options.h"

namespace fp4::cli {
namespace fs = std::filesystem;

namespace {
/// `fp4train compact DIR...`: each DIR a `compare` directory (its finished runs are compacted,
/// the others listed and left) or one finished run directory; prints one line per run and
/// the total.
void run_compact(const std::vector<std::string>& dirs, int level) {
  uint64_t plain = 0, packed = 0;
  int n = 0, before = 0;
  auto one = [&](const fs::path& d) {
    const CompactResult c = compact_run_metrics(d, level);
    ++n;
    plain += c.plain_bytes;
    packed += c.compact_bytes;
    if (c.already) {
      ++before;
      std::printf("%s: compacted before (%s, %llu bytes)\n", d.string().c_str(),
                  c.file.filename().string().c_str(), static_cast<unsigned long long>(c.compact_bytes));
    } else {
      std::printf("%s: %s %llu -> %s %llu bytes\n", d.string().c_str(), kMetricsFile,
                  static_cast<unsigned long long>(c.plain_bytes), kCompactMetricsFile,
                  static_cast<unsigned long long>(c.compact_bytes));
    }
    std::fflush(stdout);
  };
  for (const std::string& arg : dirs) {
    const fs::path dir = arg;
    if (!fs::exists(dir / "compare.json")) {
      one(dir);
      continue;
    }
    const ComparePlan plan = read_compare_plan(dir);
    for (const auto& r : plan.names)
      for (uint64_t s : plan.seeds) {
        const fs::path d = compare_run_dir(dir, r, s);
        const bool finished = fs::exists(d / "summary.json") ||
                              (fs::exists(d / "error.txt") && run_error(d) == RunError::Diverged);
        if (finished)
          one(d);
        else if (fs::exists(d))
          std::printf("%s: not finished, left as it is\n", d.string().c_str());
      }
  }
  std::printf("compact: %d run(s)%s, metrics logs %llu -> %llu bytes\n", n,
              before ? (", " + std::to_string(before) + " compacted before").c_str() : "",
              static_cast<unsigned long long>(plain), static_cast<unsigned long long>(packed));
}

/// `fp4train noise DIR...`: the noise table of finished comparisons (docs/compare.md "Power
/// before cost"), to stdout or --out FILE.
void register_noise(CLI::App& app) {
  auto ndirs = std::make_shared<std::vector<std::string>>();
  auto nout = std::make_shared<std::string>();
  auto* n = app.add_subcommand(
      "noise",
      "Paired noise of finished comparisons: the table compare's power estimate reads\n"
      "(configs/studies/noise.toml): per config and recipe, the std over seeds of (recipe -\n"
      "baseline) final-window loss, in nats (docs/compare.md \"Power before cost\").");
  n->add_option("dir", *ndirs,
                "Comparison directories (or a committed report.md whose runs are not kept)")
      ->required();
  n->add_option("--out", *nout, "Write the table to FILE (default: stdout)");
  n->callback([ndirs, nout] {
    std::vector<fs::path> ds(ndirs->begin(), ndirs->end());
    std::string cmd = "fp4train noise";
    for (const auto& d : *ndirs) cmd += " " + d;
    const std::string text = noise_table_toml(ds, cmd);
    if (nout->empty())
      std::fputs(text.c_str(), stdout);
    else
      write_file_atomic(*nout, text);
  });
}

}  // namespace

namespace {
// CLI11 check of --effect: a number of nats in [1e-9, 100]; the message (which CLI11 prefixes
// with the option) says whether it is not a number or out of range.
std::string check_effect(const std::string& v) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0') return "'" + v + "' is not a number (nats, e.g. 0.005)";
  if (!(x >= 1e-9 && x <= 100)) return v + " is not a difference in nats in [1e-9, 100]";
  return "";
}
}  // namespace

void register_compare(CLI::App& app) {
  auto a = std::make_shared<CompareRequest>();
  auto* c = app.add_subcommand(
      "compare",
      "Train every recipe x seed on one config, one after another, then write DIR/report.md\n"
      "and DIR/plots/*.png: final-window loss (mean ± std over seeds, gap to --baseline), held-out\n"
      "NLL per inference policy (from each run's final checkpoint, DIR/<run>/eval.json), loss\n"
      "spikes, max grad norm after warmup, tokens/s and step time vs fp32. Resumable: finished\n"
      "runs (DIR/<recipe>-s<seed>/summary.json) are reused, interrupted ones continue bit for\n"
      "bit from their newest checkpoint.");
  c->add_option("--config", a->config, "Run config TOML")->capture_default_str();
  c->add_option("--recipes", a->recipes, "Comma-separated recipe names or .toml paths")
      ->capture_default_str();
  c->add_option("--seeds", a->seeds, "Number of seeds per recipe")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  c->add_option("--seed-base", a->seed_base, "First seed (seeds are base, base+1, ...)")
      ->check(CLI::Range(uint64_t{0}, uint64_t{INT64_MAX / 2}))
      ->capture_default_str();
  c->add_option("--steps", a->steps, "Override train.steps of every run")
      ->check(CLI::Range(1, 1 << 30));
  c->add_option("--out", a->out, "Comparison directory (runs, report.md, plots/)")->required();
  c->add_option("--policies", a->policies,
                "Quantized-inference policies for held-out NLL: none, current, replay-d<D>, "
                "calibrated (docs/evaluation.md)")
      ->capture_default_str();
  c->add_option("--save-every", a->save_every,
                "Checkpoint every N steps, so an interrupted comparison resumes its current run "
                "(the final step is always saved; it is what eval.json is computed from)")
      ->check(CLI::Range(0, 1 << 30))
      ->capture_default_str();
  c->add_option("--keep-checkpoints", a->keep_checkpoints,
                "Resume checkpoints kept per run (the newest; the final one when it finishes)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  c->add_option("--checkpoint-steps", a->checkpoint_steps,
                "Comma-separated steps whose checkpoints are also saved and kept in every run, "
                "e.g. off the amax refresh grid for `fp4train fidelity` (docs/compare.md "
                "\"Checkpoints\")")
      ->delimiter(',')
      ->check(CLI::Range(1, 1 << 30));
  CLI::Option* effect =
      c->add_option("--effect", a->effect,
                    "The difference (nats) the comparison should resolve: before training, the "
                    "95% half-width the planned seeds give and the seeds this takes, from the "
                    "measured paired noise of the config (--noise); the report's Power table. "
                    "A rerun into the same --out keeps the effect it had unless given")
          ->check(CLI::Validator(check_effect, "NATS"))
          ->capture_default_str();
  c->add_option("--noise", a->noise,
                "Table of measured paired noise per config (`fp4train noise`; docs/compare.md "
                "\"Power before cost\")")
      ->capture_default_str();
  c->add_option("--baseline", a->baseline,
                "Recipe the gap columns (vs X, Δ vs X paired by seed) and the difference plot "
                "are measured against; one of the compared recipes (also its --set-labelled "
                "name). Default: bf16 when compared, else fp32, else none")
      ->check([](const std::string& v) { return v.empty() ? std::string("empty name") : std::string(); });
  c->add_option("--hypotheses", a->hypotheses,
                "Study file of [[hypothesis]] claims (e.g. configs/studies/claims.toml): the "
                "report judges each as supported / contradicted / not resolved / not run "
                "(docs/recipes.md \"Studies: claims as hypotheses\"); remembered in "
                "DIR/compare.json");
  add_set_option(c, a->sets,
                 ", in every run of the comparison (recipe keys in every recipe: fp32+fp4.block=32, "
                 "ue5m3-b16+fp4.block=32, ...; train.seed is set by --seeds, train.steps by --steps)");
  c->add_option("--task", a->task,
                "Downstream task run on every run's final checkpoint under every --policies "
                "policy, or a comma-separated list: next-sentence (docs/evaluation.md \"Downstream "
                "task: `eval --task next-sentence`\"), into DIR/<run>/task.json; minimal-pairs "
                "(\"Minimal pairs: `eval --task minimal-pairs`\"), into "
                "DIR/<run>/task-minimal-pairs.json; the report adds their accuracy tables and "
                "item-paired comparisons; remembered in DIR/compare.json (tasks accumulate)");
  c->add_flag("--no-plots", a->no_plots, "Skip tools/plot_runs.py");
  c->callback([a, effect] {
    a->effect_given = effect->count() > 0;
    run_comparison(*a);
  });

  auto dir = std::make_shared<std::string>();
  auto no_plots = std::make_shared<bool>(false);
  auto baseline = std::make_shared<std::string>();
  auto hypotheses = std::make_shared<std::string>();
  auto* r = app.add_subcommand(
      "report",
      "Rebuild DIR/report.md and DIR/plots/ of a `fp4train compare` directory from its finished\n"
      "runs, without training. Unfinished runs are listed at the end of the report.");
  r->add_option("dir", *dir, "Comparison directory")->required();
  r->add_flag("--no-plots", *no_plots, "Skip tools/plot_runs.py");
  r->add_option("--baseline", *baseline,
                "Recipe the gap columns and the difference plot are measured against (default: "
                "the comparison's --baseline, else bf16, else fp32)");
  r->add_option("--hypotheses", *hypotheses,
                "Study file of [[hypothesis]] claims to judge (default: the comparison's "
                "--hypotheses, if any)");
  r->callback([dir, no_plots, baseline, hypotheses] {
    write_comparison_report(*dir, read_compare_plan(*dir), !*no_plots, *baseline, *hypotheses);
  });

  register_noise(app);

  auto dirs = std::make_shared<std::vector<std::string>>();
  auto level = std::make_shared<int>(19);
  auto* k = app.add_subcommand(
      "compact",
      "Compress the metrics.jsonl of finished runs into metrics.jsonl.zst (zstd, checked to\n"
      "decompress to the same bytes), for committing them: `report` and the plots read either,\n"
      "with the same results (docs/compare.md \"Compacted runs\"). DIR is a `fp4train compare`\n"
      "directory (its finished runs are compacted, unfinished ones listed and left) or one run\n"
      "directory. Refused for a run that has not finished, failed, or is being trained (its\n"
      ".fp4train.lock is held). A compacted run is not resumed: decompress it first.");
  k->add_option("dir", *dirs, "Comparison or run directories")->required();
  k->add_option("--level", *level, "zstd compression level")
      ->check(CLI::Range(1, 22))
      ->capture_default_str();
  k->callback([dirs, level] { run_compact(*dirs, *level); });
}

}  // namespace fp4::cli
