// `fp4train train`: pretrain one model with one recipe and print a summary.
#include <cstdint>
#include <cstdio>
#include <new>
#include <filesystem>
#include <memory>

#include "commands.h"
#include "fp4/error.h"
#include "fp4/train.h"
#include "paths.h"

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
};

void run_train(const TrainArgs& a) {
  const fs::path config_file = resolve(a.config);
  RunConfig cfg = load_run_config(config_file);
  const RunConfig file_cfg = cfg;
  if (a.steps > 0) cfg.train.steps = a.steps;
  if (a.seed_given) cfg.train.seed = a.seed;
  if (!a.data.empty()) cfg.data.path = a.data;
  if (cfg.train.warmup_steps >= cfg.train.steps && cfg.train.steps > 1) {
    cfg.train.warmup_steps = cfg.train.steps / 10;
    std::printf("note: --steps %d is not above train.warmup_steps = %d; warming up for %d steps\n",
                cfg.train.steps, file_cfg.train.warmup_steps, cfg.train.warmup_steps);
  }
  validate(cfg, a.config);
  const Recipe recipe = load_recipe(a.recipe, resolve("configs/recipes"));
  check_recipe_fits(recipe, cfg);

  // data.path from a config: relative to the working directory, else to the config file's
  // directory, else to the source tree (for the default corpus); --data: as given.
  fs::path data_path = cfg.data.path;
  if (a.data.empty() && data_path.is_relative() && !fs::exists(data_path)) {
    const fs::path beside = config_file.parent_path() / data_path;
    data_path = fs::exists(beside) ? beside : resolve(cfg.data.path);
  }
  if (!fs::exists(data_path)) {
    const bool is_default = a.data.empty() && cfg.data.path == DataConfig{}.path;
    throw UserError("data path " + data_path.string() + " does not exist" +
                    (is_default ? " (the default Brown corpus: run scripts/setup first)"
                                : a.data.empty() ? " (data.path in " + a.config + ")" : ""));
  }
  const std::string cfg_name = fs::path(a.config).stem().string();
  fs::path out;
  if (!a.out.empty()) {
    out = a.out;
    if (fs::exists(out / "metrics.jsonl") || fs::exists(out / "summary.json"))
      throw UserError("output directory " + out.string() +
                      " already holds a run; choose another --out (nothing was overwritten)");
  } else {
    const std::string base = "runs/" + cfg_name + "-" + recipe.name + "-s" +
                             std::to_string(cfg.train.seed);
    out = base;
    for (int i = 2; fs::exists(out); ++i) out = base + "-" + std::to_string(i);
  }

  auto logf = [&](const std::string& s) {
    if (!a.quiet) std::printf("%s\n", s.c_str()), std::fflush(stdout);
  };
  logf("data: " + data_path.string());
  const TokenData data = prepare_tokens(data_path, cfg.model.vocab_size,
                                        a.data.empty() ? resolve(cfg.data.cache) : fs::path(cfg.data.cache), logf);
  char b[256];
  std::snprintf(b, sizeof b, "tokens: %zu train, %zu held-out (vocab %d, %s)", data.train.size(),
                data.heldout.size(), data.vocab_size, data.from_cache ? "cached" : "new");
  logf(b);
  logf("run directory: " + out.string());

  TrainOptions opt;
  opt.out_dir = out;
  opt.config_name = cfg_name;
  opt.quiet = a.quiet;
  const TrainSummary s = train(cfg, recipe, data, opt);

  std::printf("\nsummary (%s, recipe %s, %d steps, seed %llu)\n", cfg_name.c_str(),
              recipe.name.c_str(), s.steps, static_cast<unsigned long long>(cfg.train.seed));
  std::printf("  first-step loss                     %.4f   (ln vocab = %.4f)\n", s.first_loss,
              std::log(double(cfg.model.vocab_size)));
  std::printf("  final-window training loss          %.4f   (mean of the last %d steps)\n",
              s.final_window_loss, std::max(1, s.steps / 10));
  std::printf("  held-out NLL, FP32 inference        %.4f nats/token\n", s.heldout_nll);
  if (recipe.mode != LinearMode::FP32)
    std::printf("  held-out NLL, quantized inference   %.4f nats/token   (%s, current scaling)\n",
                s.heldout_nll_quant, recipe.name.c_str());
  std::printf("  throughput                          %.0f tokens/s (training steps only)\n", s.tokens_per_s);
  std::printf("  written: %s/{summary.json,metrics.jsonl,config.toml,recipe.toml}\n",
              out.string().c_str());
}
}  // namespace

void register_train(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  auto* c = app.add_subcommand(
      "train",
      "Pretrain a Llama-style model on text with one recipe. Prints a progress line every few\n"
      "seconds, evaluates held-out NLL (FP32 and quantized inference) periodically, and writes\n"
      "runs/NAME/{metrics.jsonl,config.toml,recipe.toml,summary.json}.");
  c->add_option("--config", a->config, "Run config TOML (model, train, data, eval)")
      ->capture_default_str();
  c->add_option("--recipe", a->recipe,
                "Recipe name in configs/recipes/ (fp32, bf16, ue5m3-b16, nvfp4-te, ue5m3-b16-probe, ...) "
                "or the path of a recipe .toml file")
      ->capture_default_str();
  c->add_option("--steps", a->steps, "Override train.steps")->check(CLI::Range(1, 1 << 30));
  c->add_option_function<uint64_t>(
      "--seed", [a](const uint64_t& s) { a->seed = s, a->seed_given = true; },
      "Override train.seed (init, batches, SR bits), 0 .. 2^63-1")
      ->check(CLI::Range(uint64_t{0}, uint64_t{INT64_MAX}));
  c->add_option("--data", a->data,
                "UTF-8 text file or directory instead of the config's data.path (default: the "
                "Brown corpus installed by scripts/setup)");
  c->add_option("--out", a->out, "Run directory (default runs/<config>-<recipe>-s<seed>[-N])");
  c->add_flag("--quiet", a->quiet, "No progress lines, only the summary");
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
