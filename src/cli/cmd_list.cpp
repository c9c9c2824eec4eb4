// `fp4train configs` and `fp4train recipes`: one line per shipped run config and recipe, with
// what it is, so that a user can find them without reading configs/ (docs/cli.md "The
// `fp4train` program").
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "fp4/base/error.h"
#include "fp4/base/words.h"
#include "fp4/nn/run_config.h"
#include "fp4/recipe/recipe.h"
#include "fp4/train/info.h"
#include "fp4/nn/hf_layout.h"
#include "fp4/train/paths.h"

namespace fp4::cli {
namespace fs = std::filesystem;

namespace {
// "24 Mamba-2 + 4 attention + 24 MLP": the kinds the pattern has, in registry order.
std::string kind_counts(const ModelInfo& mi) {
  std::string s;
  for (const BlockKindCount& k : mi.kinds)
    if (k.blocks) s += (s.empty() ? "" : " + ") + std::to_string(k.blocks) + " " + k.name;
  return s;
}

// `s` cut at a word boundary to at most 100 characters ("..." marks a cut).
std::string shortened(const std::string& s) {
  constexpr size_t kMax = 100;
  if (s.size() <= kMax) return s;
  size_t cut = s.rfind(' ', kMax - 3);
  if (cut == std::string::npos) cut = kMax - 3;
  return s.substr(0, cut) + "...";
}

// The first sentence of a TOML file's leading comment block ("# ..." lines), on one line,
// at most 100 characters.
std::string leading_comment_sentence(const fs::path& file) {
  std::ifstream f(file);
  std::string line, text;
  while (std::getline(f, line)) {
    if (line.rfind("#", 0) != 0) break;
    size_t b = line.find_first_not_of("# ");
    if (b == std::string::npos) continue;
    text += (text.empty() ? "" : " ") + line.substr(b);
    // The first ". " that ends a sentence (not "et al. ", "e.g. ", "i.e. ").
    for (size_t dot = text.find(". "); dot != std::string::npos; dot = text.find(". ", dot + 1)) {
      const std::string before = text.substr(0, dot + 1);
      auto ends = [&](const char* abbr) {
        const std::string a(abbr);
        return before.size() >= a.size() && before.compare(before.size() - a.size(), a.size(), a) == 0;
      };
      if (!ends(" al.") && !ends("e.g.") && !ends("i.e.")) return shortened(before);
    }
  }
  return shortened(text);
}

std::string millions(int64_t n) {
  char b[32];
  if (n >= 1'000'000'000)
    std::snprintf(b, sizeof b, "%.2f B", double(n) / 1e9);
  else
    std::snprintf(b, sizeof b, n >= 100'000'000 ? "%.0f M" : n >= 10'000'000 ? "%.1f M" : "%.2f M",
                  double(n) / 1e6);
  return b;
}

void run_configs() {
  const fs::path dir = resolve("configs");
  const std::vector<std::string> names = toml_names(dir);
  if (names.empty()) throw UserError("no run configs in " + dir.string() + " (is this an fp4train checkout?)");
  std::printf("Run configs in %s (fp4train train --config configs/NAME.toml; details: fp4train info --config ...):\n",
              dir.string().c_str());
  for (const std::string& n : names) {
    const fs::path f = dir / (n + ".toml");
    std::string facts;
    try {
      const RunConfig cfg = load_run_config(f);
      const ModelInfo mi = model_info(cfg, Recipe{});
      facts = (hf_llama_layout(cfg.model) ? "Llama-style, " + std::to_string(mi.n_blocks / 2) + " layers"
                     : "hybrid, " + kind_counts(mi) + " blocks") +
              ", d_model " + std::to_string(cfg.model.d_model) + ", " + millions(mi.parameters) +
              " parameters, " + std::to_string(cfg.train.batch_size) + " x " +
              std::to_string(cfg.train.seq_len) + " tokens per step, " +
              count_of(cfg.train.steps, "step");
    } catch (const std::exception& e) {
      facts = std::string("(does not load: ") + e.what() + ")";
    }
    std::printf("  %-16s %s\n  %-16s %s\n", n.c_str(), facts.c_str(), "",
                leading_comment_sentence(f).c_str());
  }
}

void run_recipes() {
  const fs::path dir = resolve("configs/recipes");
  const std::vector<std::string> names = toml_names(dir);
  if (names.empty()) throw UserError("no recipes in " + dir.string() + " (is this an fp4train checkout?)");
  std::printf("Recipes in %s (fp4train train --recipe NAME, or --recipe FILE.toml for your own; docs/recipes.md):\n",
              dir.string().c_str());
  for (const std::string& n : names) {
    std::string what;
    try {
      what = load_recipe_file(dir / (n + ".toml")).description;
    } catch (const std::exception& e) {
      what = std::string("(does not load: ") + e.what() + ")";
    }
    std::printf("  %-22s %s\n", n.c_str(), what.c_str());
  }
}
}  // namespace

void register_list(CLI::App& app) {
  app.add_subcommand("configs",
                     "List the shipped run configs (configs/*.toml): model shape, parameters, "
                     "tokens per step and steps, and what each is for.")
      ->callback(run_configs);
  app.add_subcommand("recipes",
                     "List the shipped recipes (configs/recipes/*.toml), sorted, each with its "
                     "description.")
      ->callback(run_recipes);
}

}  // namespace fp4::cli
