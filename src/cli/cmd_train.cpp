// `fp4train train`: pretrain one model with one recipe and print a summary.
#include <unistd.h>

#include <cstdint>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <new>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "fp4/train/checkpoint.h"
#include "fp4/train/metrics_log.h"
#include "fp4/dist/dist.h"
#include "fp4/base/error.h"
#include "fp4/base/profile.h"
#include "fp4/gemm/machine.h"
#include "fp4/base/safetensors.h"  // fp4::IoError
#include "fp4/train/info.h"
#include "fp4/train/train.h"
#include "fp4/train/paths.h"
#include "fp4/base/words.h"
#include "fp4/train/interruptible.h"
#include "fp4/train/resolved_run.h"
#include "options.h"

namespace fp4::cli {
namespace fs = std::filesystem;

namespace {
struct TrainArgs {
  std::string config = "configs/tiny.toml";
  std::string recipe = "ue5m3-b16";
  int steps = 0;
  uint64_t seed = 0;
  bool seed_given = false;
  std::string data, out;
  bool quiet = false;
  int save_every = 0, keep_checkpoints = 3, log_every = 1;
  bool no_save_amax = false;
  std::string resume;
  double peak_gflops = 0;
  std::vector<std::string> sets;  // --set KEY=VALUE
  // Options given on the command line (resume: what may and may not be combined with it).
  CLI::App* app = nullptr;
  bool given(const char* name) const { return app->count(name) > 0; }
};

void print_summary(const TrainSummary& s, const RunConfig& cfg, const Recipe& recipe,
                   const std::string& cfg_name, const fs::path& out) {
  std::printf("\nsummary (%s, recipe %s, %s, seed %llu)\n", cfg_name.c_str(),
              recipe.name.c_str(), count_of(s.steps, "step").c_str(),
              static_cast<unsigned long long>(cfg.train.seed));
  std::printf("  first-step loss                     %.4f   (ln vocab = %.4f)\n", s.first_loss,
              std::log(double(cfg.model.vocab_size)));
  const int window = s.final_window_steps;
  std::printf("  final-window training loss          %.4f   (mean of the last %s)\n",
              s.final_window_loss, window == 1 ? "step" : count_of(window, "step").c_str());
  std::printf("  held-out NLL, FP32 inference        %.4f nats/token\n", s.heldout_nll);
  if (recipe.mode != LinearMode::FP32)
    std::printf("  held-out NLL, quantized inference   %.4f nats/token   (%s, current scaling)\n",
                s.heldout_nll_quant, recipe.name.c_str());
  std::printf("  throughput                          %.0f tokens/s (training steps only)\n", s.tokens_per_s);
  if (s.mfu > 0)
    std::printf("  model FLOPs utilization (MFU)       %.1f%% of the FP32 GEMM rate (PaLM model FLOPs/token, docs/performance.md)\n", 100 * s.mfu);
  if (s.resumed_from > 0)
    std::printf("  resumed from the checkpoint of step %d\n", s.resumed_from);
  std::printf("  written: %s/{summary.json,metrics.jsonl,config.toml,recipe.toml,checkpoints/}\n",
              out.string().c_str());
}

TrainOptions checkpoint_options(const TrainArgs& a) {
  TrainOptions opt;
  opt.quiet = a.quiet;
  opt.save_every = a.save_every;
  opt.keep_checkpoints = a.keep_checkpoints;
  opt.log_every = a.log_every;
  opt.save_amax = !a.no_save_amax;
  if (dist::size() > 1 && a.peak_gflops <= 0) {
    // Under mpirun the processes may share cores or not: one process's GEMM rate is no
    // peak for the run, and measuring it on every rank at once would skew it and race on
    // the cache file. No MFU unless --peak-gflops gives the run's rate.
    if (!a.quiet) std::printf("MFU: not reported under mpirun (give --peak-gflops for the run's FP32 GEMM rate)\n");
    return opt;
  }
  const prof::PeakRate peak = prof::fp32_peak_gflops(a.peak_gflops);
  opt.peak_gflops = peak.gflops;
  if (!a.quiet)
    std::printf("FP32 GEMM rate for MFU: %.1f GFLOP/s (%s)\n", peak.gflops, peak.source.c_str());
  return opt;
}

// train() under StopOnSignal: on SIGINT/SIGTERM the run stops after its current step with a
// checkpoint, says how to resume, and the process ends as killed by the signal (130 / 143).
TrainSummary train_or_stop(const ValidatedRun& checked, const TokenData& data, TrainOptions opt,
                           const TrainArgs& a) {
  std::string cmd = shell_word(a.app->get_parent()->get_name()) + " train --resume " +
                    shell_word(opt.out_dir.string());
  if (!a.data.empty()) cmd += " --data " + shell_word(a.data);
  InterruptibleRun run;
  try {
    run = train_interruptible(checked, data, opt);
  } catch (const IoError& e) {
    // A full disk (or an I/O error) while writing the run: what to do about it.
    const bool some = !list_checkpoints(opt.out_dir).empty();
    throw IoError(std::string(e.what()) + "; the run stopped" +
                  (some ? "; its checkpoints written before are complete: free space and "
                          "continue it with " + cmd
                        : std::string("")));
  }
  const TrainSummary& s = run.summary;
  // A signal during the last step: the run completed, and the process still ends as killed
  // by it, as promised.
  if (run.late_signal != 0)
    end_by_signal(run.late_signal, "\n" + signal_name(run.late_signal) +
                                       " arrived during the last step: the run completed (" +
                                       (opt.out_dir / "summary.json").string() + ")\n");
  if (s.stop_signal == 0) return s;
  end_by_signal(s.stop_signal,
                "\nstopped by " + signal_name(s.stop_signal) + " after step " +
                    std::to_string(s.steps) + " of " + std::to_string(checked.config().train.steps) +
                    "; checkpoint " + s.checkpoint.string() +
                    "\nmetrics.jsonl holds the steps so far; no summary.json. Continue, bit for "
                    "bit as if never stopped, with:\n  " + cmd + "\n");
}

// `train --resume runs/NAME`: continue a run from its newest checkpoint that loads, with the
// run's stored config and recipe; only options that cannot change the results may be given.
void run_resume(const TrainArgs& a) {
  const fs::path dir = a.resume;
  for (const char* o : {"--config", "--recipe", "--steps", "--seed", "--out", "--set"})
    if (a.given(o))
      throw UserError(std::string("--resume continues ") + dir.string() +
                      " with its own config.toml, recipe.toml, seed and steps; " + o +
                      " cannot be combined with it (allowed: --data with the run's corpus, "
                      "--save-every, --keep-checkpoints, --log-every, --no-save-amax, --quiet)");
  if (!fs::is_directory(dir)) throw UserError("--resume " + dir.string() + ": no such run directory");
  if (fs::exists(dir / "summary.json")) {
    std::string steps = "?";
    try {
      std::ifstream f(dir / "summary.json");
      steps = std::to_string(nlohmann::json::parse(f).at("steps").get<int>());
    } catch (const std::exception&) {
    }
    std::printf("run %s already completed (%s steps, %s); nothing to resume\n",
                dir.string().c_str(), steps.c_str(), (dir / "summary.json").string().c_str());
    return;
  }
  if (list_checkpoints(dir).empty())
    throw UserError("--resume " + dir.string() + ": the run has no checkpoint to resume from (it "
                    "stopped before its first one; --save-every N saves every N steps); start "
                    "it again with another --out");
  std::string warn;
  fs::path ck_file;
  const Checkpoint ck = load_newest_checkpoint(dir, &ck_file, &warn);
  if (!warn.empty()) std::fprintf(stderr, "%s", warn.c_str());

  // The run's config and recipe: its stored files, which must agree with the checkpoint.
  const fs::path cfg_file = dir / "config.toml", recipe_file = dir / "recipe.toml";
  const RunConfig cfg = fs::exists(cfg_file)
                            ? load_run_config(cfg_file)
                            : run_config_from_text(ck.config_toml, ck_file.string() + " (config_toml)");
  if (run_config_to_toml(cfg) != ck.config_toml)
    throw UserError(cfg_file.string() + " differs from the config stored in " + ck_file.string() +
                    "; the run cannot be resumed with a changed config (restore config.toml)");
  const Recipe recipe = fs::exists(recipe_file)
                            ? load_recipe_file(recipe_file)
                            : recipe_from_text(ck.recipe_toml, ck_file.string() + " (recipe_toml)");
  if (recipe_to_toml(recipe) != ck.recipe_toml)
    throw UserError(recipe_file.string() + " differs from the recipe stored in " + ck_file.string() +
                    "; the run cannot be resumed with a changed recipe (restore recipe.toml)");
  // Checked once, before the data is prepared; train() does not repeat it.
  const ValidatedRun checked = validate_run(cfg, recipe, /*resume=*/true);

  fs::path data_path = a.data.empty() ? fs::path(cfg.data.path) : fs::path(a.data);
  if (a.data.empty() && data_path.is_relative() && !fs::exists(data_path))
    data_path = resolve(cfg.data.path);
  if (!fs::exists(data_path))
    throw UserError("data path " + data_path.string() + " of the run does not exist; pass --data " +
                    "with the run's corpus");
  auto logf = [&](const std::string& s) {
    if (!a.quiet) std::printf("%s\n", s.c_str()), std::fflush(stdout);
  };
  logf("resuming " + dir.string() + " from " + ck_file.string() + " (step " +
       std::to_string(ck.step) + " of " + std::to_string(cfg.train.steps) + ")");
  logf("data: " + data_path.string());
  const TokenData data = prepare_tokens_all_ranks(data_spec(cfg, data_path, dir / "config.toml"),
                                                  cfg.model.vocab_size, resolve(cfg.data.cache), logf);

  TrainOptions opt = checkpoint_options(a);
  if (!a.given("--save-every")) opt.save_every = ck.save_every;
  if (!a.given("--keep-checkpoints")) opt.keep_checkpoints = ck.keep_checkpoints;
  if (!a.given("--log-every")) opt.log_every = ck.log_every;
  if (!a.given("--no-save-amax")) opt.save_amax = ck.save_amax;
  opt.out_dir = dir;
  opt.config_name = ck.config_name.empty() ? "run" : ck.config_name;
  opt.resume_from = &ck;
  const TrainSummary s = train_or_stop(checked, data, opt, a);
  print_summary(s, cfg, recipe, opt.config_name, dir);
}

// Refuses a run whose training step (fp4train info's estimate: weights, gradients, AdamW
// moments, activations, logits, scratch) needs more memory than the machine has, before any
// data is prepared: the 8B config fails here in a second instead of after a tokenizer run.
void check_fits_in_memory(const RunConfig& cfg, const Recipe& recipe, const std::string& config_arg) {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return;
  const double have = double(pages) * double(page);
  const double need = double(model_info(cfg, recipe).memory.total());
  if (need <= have) return;
  char b[320];
  std::snprintf(b, sizeof b,
                "the training step of %s needs about %.1f GiB (weights, gradients, AdamW moments, "
                "activations; `fp4train info --config %s` itemises it), more than this machine's "
                "%.1f GiB of memory; use a smaller model, train.micro_batch_size or train.seq_len",
                config_arg.c_str(), need / 1073741824.0, config_arg.c_str(), have / 1073741824.0);
  throw UserError(b);
}

// The run the arguments define (resolve_run), with train's own checks before any data.
ResolvedRun resolve_train_run(const TrainArgs& a) {
  RunRequest r;
  r.config = a.config;
  r.recipe = a.recipe;
  r.sets = a.sets;
  if (a.given("--steps")) r.taken.push_back({"train.steps", "--steps"});
  if (a.given("--seed")) r.taken.push_back({"train.seed", "--seed"});
  if (a.given("--data")) r.taken.push_back({"data.path", "--data"});
  r.data = a.data;
  r.steps = a.steps;
  if (a.seed_given) r.seed = a.seed;
  return resolve_run(r);
}

void run_train(const TrainArgs& a) {
  if (!a.resume.empty()) return run_resume(a);
  const ResolvedRun run = resolve_train_run(a);
  const RunConfig& cfg = run.config;
  const Recipe& recipe = run.recipe;
  // Checked once, before any data is prepared; train() does not repeat it.
  const ValidatedRun checked = validate_run(run);
  check_fits_in_memory(cfg, recipe, run.config_where);
  const DataSpec& data_spec = run.data;
  const fs::path& data_path = data_spec.path;
  // A config changed by --set is not reported under the file's name either.
  const std::string& cfg_name = run.label;
  fs::path out;
  if (!a.out.empty()) {
    out = a.out;
    if (fs::exists(out / kMetricsFile) || fs::exists(out / kCompactMetricsFile) ||
        fs::exists(out / "summary.json") ||
        fs::exists(out / "checkpoints"))
      throw UserError("output directory " + out.string() +
                      " already holds a run; choose another --out, or continue it with "
                      "--resume " + out.string() + " (nothing was overwritten)");
  } else {
    std::string name = dir_safe(cfg_name + "-" + recipe.name + "-s" + std::to_string(cfg.train.seed));
    if (name.size() > 120) {
      // --set labels with data paths can pass the 255-byte name limit: keep the start and a
      // hash (FNV-1a 32) of the whole name.
      uint32_t h = 2166136261u;
      for (unsigned char ch : name) h = (h ^ ch) * 16777619u;
      char hex[9];
      std::snprintf(hex, sizeof hex, "%08x", h);
      name = name.substr(0, 100) + "-" + hex;
    }
    const std::string base = "runs/" + name;
    out = base;
    for (int i = 2; fs::exists(out); ++i) out = base + "-" + std::to_string(i);
  }

  auto logf = [&](const std::string& s) {
    if (!a.quiet) std::printf("%s\n", s.c_str()), std::fflush(stdout);
  };
  logf("data: " + data_path.string() + (data_spec.format == "auto" ? "" : " (" + data_spec.format + ")"));
  const TokenData data =
      prepare_tokens_all_ranks(data_spec, cfg.model.vocab_size, run.cache_dir, logf);
  char b[256];
  std::snprintf(b, sizeof b, "tokens: %zu train, %zu held-out (vocab %d, %s)", data.train.size(),
                data.heldout.size(), data.vocab_size, data.from_cache ? "cached" : "new");
  logf(b);
  if (!run.sets.empty()) {
    std::string list;
    for (const auto& g : run.sets.given) list += " --set " + shell_word(g);
    logf("overrides:" + list + " (resolved values in the run's config.toml and recipe.toml)");
  }
  logf("run directory: " + out.string());

  TrainOptions opt = checkpoint_options(a);
  opt.out_dir = out;
  opt.config_name = cfg_name;
  const TrainSummary s = train_or_stop(checked, data, opt, a);
  print_summary(s, cfg, recipe, cfg_name, out);
}
}  // namespace

void register_train(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  auto* c = app.add_subcommand(
      "train",
      "Pretrain a model on text with one recipe: any block pattern of attention, MLP and Mamba-2\n"
      "blocks, e.g. configs/tiny.toml (Llama-style, the default) or configs/nemotron-h-tiny.toml\n"
      "(the paper's Nemotron-H hybrid). Prints a progress line every few\n"
      "seconds (loss, LR, grad norm, tokens/s, model FLOPs utilization, ETA), evaluates held-out NLL (FP32 and quantized inference) periodically, and writes\n"
      "runs/NAME/{metrics.jsonl,config.toml,recipe.toml,tokenizer.model,checkpoints/,summary.json}.\n"
      "A stopped or killed run continues bit for bit with: fp4train train --resume runs/NAME.\n"
      "Ctrl-C (SIGINT) or SIGTERM finishes the current step, writes a checkpoint, prints that\n"
      "command and exits as killed by the signal (status 130 / 143); a second one stops at once.\n"
      "Under mpirun: kill -USR1 <mpirun pid> does that on every process (mpirun kills the job\n"
      "on SIGINT / SIGTERM); mpirun -np P trains the micro-batches (train.micro_batch_size) of\n"
      "each step on P processes, bit-identical to one process (docs/parallel.md).\n"
      "--set KEY=VALUE changes any key of the config or recipe, e.g. --set train.lr=1e-3\n"
      "--set fp4.block=32: recipe ue5m3-b16+fp4.block=32, config tiny+train.lr=1e-3, run\n"
      "directory runs/tiny+train.lr=1e-3-ue5m3-b16+fp4.block=32-s1.");
  c->add_option("--config", a->config, "Run config TOML (model, train, data, eval)")
      ->capture_default_str();
  c->add_option(
       "--recipe", a->recipe,
       "Recipe name in configs/recipes/ (fp32, bf16, ue5m3-b16, nvfp4-te, ue5m3-b16-probe, ...) "
       "or the path of a recipe .toml file")
      ->capture_default_str()
      ->check(CLI::Validator(check_recipe_arg, "RECIPE"));
  c->add_option("--steps", a->steps, "Override train.steps")->check(CLI::Range(1, 1 << 30));
  c->add_option_function<uint64_t>(
      "--seed", [a](const uint64_t& s) { a->seed = s, a->seed_given = true; },
      "Override train.seed (init, batches, SR bits), 0 .. 2^63-1")
      ->check(CLI::Range(uint64_t{0}, uint64_t{INT64_MAX}));
  c->add_option("--data", a->data,
                "Data file or directory instead of the config's data.path: text, .jsonl(.zst) or token "
                "shards, by data.format (docs/data.md; default: the "
                "Brown corpus installed by scripts/setup)");
  c->add_option("--out", a->out, "Run directory (default runs/<config>-<recipe>-s<seed>[-N])");
  c->add_flag("--quiet", a->quiet, "No progress lines, only the summary");
  c->add_option("--save-every", a->save_every,
                "Checkpoint every N steps into <run>/checkpoints/step_NNNNNNNN.safetensors "
                "(weights, AdamW moments, data position, held amax caches); 0 = only the final "
                "step, which is always saved")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 30));
  c->add_option("--keep-checkpoints", a->keep_checkpoints,
                "Keep the newest K checkpoints, delete older ones after each save")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 30));
  c->add_option("--log-every", a->log_every,
                "Write a metrics.jsonl line every N steps (evaluation, telemetry and final "
                "steps always get one)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 30));
  c->add_flag("--no-save-amax", a->no_save_amax,
              "Leave the held amax caches out of checkpoints: a resumed run then refreshes them "
              "at its first step and is no longer bit-exact with an uninterrupted run");
  c->add_option("--resume", a->resume,
                "Continue runs/NAME from its newest checkpoint that loads, with the run's "
                "config.toml and recipe.toml, to its configured steps; bit-exact with an "
                "uninterrupted run. Cannot be combined with --config, --recipe, --steps, "
                "--seed, --out; a completed run is reported, not retrained");
  c->add_option("--peak-gflops", a->peak_gflops,
                "FP32 GEMM rate (GFLOP/s) that model FLOPs utilization (MFU) is reported against; "
                "default: the best rate measured on this machine (a 0.3 s oneDNN GEMM the first "
                "time, then cached in ~/.cache/fp4train/gemm_peak.tsv or $FP4_CACHE_DIR)")
      ->check(CLI::Validator(check_peak_gflops, "GFLOP/s"));
  add_set_option(c, a->sets, " (not with --resume; --steps, --seed, --data may not set the same key)");
  a->app = c;
  c->callback([a] {
    try {
      run_train(*a);
    } catch (const std::bad_alloc&) {
      throw UserError(
          "out of memory allocating the model, optimizer state and activations; reduce "
          "model size, train.batch_size or train.seq_len in " + a->config);
    }
  });
}

}  // namespace fp4::cli
