// Locating configs and data from the working directory or the source tree, and preparing
// the tokens on every MPI rank (fp4/train/paths.h).
#include "fp4/train/paths.h"

#include "fp4/dist/dist.h"
#include "fp4/base/error.h"
#include "fp4/base/words.h"

#include <cmath>
#include <cstdlib>

#include <cstdio>

namespace fp4 {
std::filesystem::path resolve(const std::string& rel) {
  namespace fs = std::filesystem;
  fs::path p(rel);
  if (p.is_absolute() || fs::exists(p)) return p;
#ifdef FP4_SOURCE_DIR
  fs::path q = fs::path(FP4_SOURCE_DIR) / p;
  if (fs::exists(q)) return q;
#endif
  return p;
}
}  // namespace fp4

namespace fp4 {
std::filesystem::path resolve_data_path(const std::string& data_path,
                                        const std::filesystem::path& config_file) {
  namespace fs = std::filesystem;
  fs::path p = data_path;
  if (p.is_relative() && !fs::exists(p)) {
    const fs::path beside = config_file.parent_path() / p;
    p = fs::exists(beside) ? beside : resolve(data_path);
  }
  return p;
}
}  // namespace fp4

namespace fp4 {
void override_steps(RunConfig& cfg, int steps) {
  if (steps > 0) cfg.train.steps = steps;
  if (cfg.train.warmup_steps >= cfg.train.steps && cfg.train.steps > 1) {
    const int was = cfg.train.warmup_steps;
    cfg.train.warmup_steps = cfg.train.steps / 10;
    std::printf("note: --steps %d is not above train.warmup_steps = %d; warming up for %s\n",
                cfg.train.steps, was, count_of(cfg.train.warmup_steps, "step").c_str());
  }
  if (cfg.train.final_window >= 1.0 && cfg.train.final_window > cfg.train.steps) {
    const auto was = static_cast<long long>(cfg.train.final_window);
    cfg.train.final_window = TrainConfig{}.final_window;
    const int w = cfg.train.final_window_steps();
    std::printf("note: --steps %d is below train.final_window = %lld steps; the final-window loss "
                "is the mean of the last %s (the default, 10%%)\n",
                cfg.train.steps, was, w == 1 ? "step" : count_of(w, "step").c_str());
  }
}
std::filesystem::path run_data_path(const RunConfig& cfg, const std::filesystem::path& config_file,
                                    const std::string& config_arg, const std::string& data_arg) {
  const std::filesystem::path p =
      data_arg.empty() ? resolve_data_path(cfg.data.path, config_file) : std::filesystem::path(data_arg);
  if (!std::filesystem::exists(p)) {
    const bool is_default = data_arg.empty() && cfg.data.path == DataConfig{}.path;
    throw UserError("data path " + p.string() + " does not exist" +
                    (is_default ? " (the default Brown corpus: run scripts/setup first)"
                                : data_arg.empty() ? " (data.path in " + config_arg + ")" : ""));
  }
  return p;
}

DataSpec run_data_spec(const RunConfig& cfg, const std::filesystem::path& config_file,
                       const std::string& config_arg, const std::string& data_arg) {
  return data_spec(cfg, run_data_path(cfg, config_file, config_arg, data_arg), config_file);
}

DataSpec data_spec(const RunConfig& cfg, const std::filesystem::path& data_path,
                   const std::filesystem::path& config_file) {
  DataSpec d;
  d.path = data_path;
  d.format = cfg.data.format;
  d.text_field = cfg.data.text_field;
  d.skip_bad_records = cfg.data.skip_bad_records;
  d.heldout_fraction = cfg.data.heldout_fraction;
  if (!cfg.data.heldout.empty()) d.heldout = resolve_data_path(cfg.data.heldout, config_file);
  if (!cfg.data.tokenizer.empty()) d.tokenizer = resolve_data_path(cfg.data.tokenizer, config_file);
  return d;
}

std::filesystem::path run_cache_dir(const RunConfig& cfg, const std::string& data_arg) {
  return data_arg.empty() ? resolve(cfg.data.cache) : std::filesystem::path(cfg.data.cache);
}


TokenData prepare_tokens_all_ranks(const DataSpec& data_path, int vocab_size,
                                   const std::filesystem::path& cache_root,
                                   const std::function<void(const std::string&)>& log) {
  if (dist::size() == 1) return prepare_tokens(data_path, vocab_size, cache_root, log);
  TokenData d;
  if (dist::rank() == 0) d = prepare_tokens(data_path, vocab_size, cache_root, log);
  dist::barrier();
  if (dist::rank() != 0) d = prepare_tokens(data_path, vocab_size, cache_root);
  return d;
}

}  // namespace fp4

namespace fp4 {
Recipe load_recipe_arg(const std::string& name_or_path, const std::vector<Setting>& sets) {
  const std::filesystem::path p(name_or_path);
  const std::string arg = p.extension() == ".toml" ? resolve(name_or_path).string() : name_or_path;
  return load_recipe(arg, resolve("configs/recipes"), sets);
}
}  // namespace fp4
