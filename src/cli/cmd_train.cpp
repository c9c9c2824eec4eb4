// `fp4train train`: pretrain one model with one recipe and print a summary.
#include <cstdio>
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
  int64_t seed = -1;
  std::string data, out;
  bool quiet = false;
};

void run_train(const TrainArgs& a) {
  RunConfig cfg = load_run_config(resolve(a.config));
  if (a.steps > 0) cfg.train.steps = a.steps;
  if (a.seed >= 0) cfg.train.seed = static_cast<uint64_t>(a.seed);
  if (!a.data.empty()) cfg.data.path = a.data;
  if (cfg.train.warmup_steps >= cfg.train.steps)
    cfg.train.warmup_steps = std::max(0, cfg.train.steps / 10);
  validate(cfg, a.config);
  const Recipe recipe = load_recipe(a.recipe, resolve("configs/recipes"));

  fs::path data_path = a.data.empty() ? resolve(cfg.data.path) : fs::path(cfg.data.path);
  if (!fs::exists(data_path)) {
    std::string hint = a.data.empty() ? " (the default Brown corpus: run scripts/setup first)" : "";
    throw UserError("data path " + data_path.string() + " does not exist" + hint);
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
                "Recipe name in configs/recipes/ (fp32, bf16, ue5m3-b16, nvfp4-te) or a .toml path")
      ->capture_default_str();
  c->add_option("--steps", a->steps, "Override train.steps")->check(CLI::PositiveNumber);
  c->add_option("--seed", a->seed, "Override train.seed (init, batches, SR bits)")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--data", a->data,
                "UTF-8 text file or directory instead of the config's data.path (default: the "
                "Brown corpus installed by scripts/setup)");
  c->add_option("--out", a->out, "Run directory (default runs/<config>-<recipe>-s<seed>[-N])");
  c->add_flag("--quiet", a->quiet, "No progress lines, only the summary");
  c->callback([a] { run_train(*a); });
}

}  // namespace fp4::cli
