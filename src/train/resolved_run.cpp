// One resolved run for every command (fp4/train/resolved_run.h): arguments in, the validated
// config, the recipe with its per-linear plans, the data source and the label out.
#include "fp4/train/resolved_run.h"

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "fp4/base/error.h"
#include "fp4/base/safetensors.h"
#include "fp4/train/paths.h"
#include "fp4/train/train.h"

namespace fp4 {
namespace fs = std::filesystem;

Settings parse_set_args(const std::vector<std::string>& args,
                        const std::vector<std::pair<std::string, std::string>>& taken) {
  Settings s = parse_settings(args);
  for (const Setting& x : s.config)
    for (const auto& [key, option] : taken)
      if (x.key == key)
        throw UserError(x.arg + " and " + option + " both set " + key + "; give one of them");
  return s;
}

namespace {

// The plans as comparable text, one entry per linear: its mode and, for FP4, the GEMM mode
// and every quantized operand's spec.
nlohmann::json plans_json(const ResolvedLinears& res) {
  nlohmann::json out = nlohmann::json::array();
  for (const LinearPlan& p : res.plans) {
    nlohmann::json j = {{"mode", linear_mode_name(p.mode)}};
    if (p.mode == LinearMode::FP4) {
      j["gemm"] = gemm_mode_name(p.gemm);
      j["amax_interval"] = p.amax_interval;
      j["rht_wgrad"] = p.rht_wgrad;
      if (p.hadamard_size != 16) j["hadamard_size"] = p.hadamard_size;  // only when set
      if (p.hadamard_dgrad) j["hadamard_dgrad"] = true;
      if (p.hadamard_signs != HadamardSigns::Fixed)
        j["hadamard_signs"] = hadamard_signs_name(p.hadamard_signs);
      if (p.row_scaled_activation) j["row_scaled_activation"] = true;  // each only when set
      if (p.forward_quantizer != ForwardQuantizer::Blocks)
        j["forward_quantizer"] = forward_quantizer_name(p.forward_quantizer);
      if (p.backward_quantizer != BackwardQuantizer::Blocks)
        j["backward_quantizer"] = backward_quantizer_name(p.backward_quantizer);
      for (int g = 0; g < 3; ++g)
        for (int o = 0; o < 3; ++o) {
          if (!gemm_uses(Gemm(g), Operand(o))) continue;
          const BlockQuantSpec& s = p.specs[g][o];
          j[std::string(gemm_name(Gemm(g))) + "." + operand_name(Operand(o))] = {
              s.element.name(), spec_scale_format(s).name,
              s.block,          s.two_d,
              s.target,         rounding_name(s.rounding)};
          if (s.four_over_six != FourOverSix::Off)  // only when set: earlier lines unchanged
            j[std::string(gemm_name(Gemm(g))) + "." + operand_name(Operand(o))].push_back(
                std::string("4/6 ") + four_over_six_name(s.four_over_six));
        }
    }
    out.push_back(j);
  }
  return out;
}

// FP4_RESOLVED_RUN_LOG: one JSON line per resolved run, for tests/cli/resolved_run.sh.
void log_resolved_run(const ResolvedRun& run) {
  const char* file = std::getenv("FP4_RESOLVED_RUN_LOG");
  if (file == nullptr || *file == '\0') return;
  const nlohmann::json j = {{"label", run.label},
                            {"recipe", run.has_recipe ? recipe_to_toml(run.recipe) : ""},
                            {"plans", plans_json(run.plans)}};
  AppendFile f;
  f.open(file, /*truncate=*/false);
  f.append(j.dump() + "\n");
}

// The recipe `arg` with the run's recipe overrides, and its plans on the run's model.
void set_recipe(ResolvedRun& run, const std::string& arg) {
  run.recipe = load_recipe_arg(arg, run.sets.recipe);
  run.plans = check_recipe_fits(run.recipe, run.config);
  run.has_recipe = true;
}

// The config, its overrides and dedicated options applied, validated.
RunConfig resolve_config(const RunRequest& r, const ResolvedRun& run) {
  RunConfig cfg = load_run_config(run.config_file, run.sets.config);
  if (r.seed) cfg.train.seed = *r.seed;
  if (!r.data.empty()) cfg.data.path = r.data;
  override_steps(cfg, r.steps);
  validate(cfg, run.config_where);
  return cfg;
}

}  // namespace

ResolvedRun resolve_run(const RunRequest& r) {
  ResolvedRun run;
  // Arguments: the --set overrides, split into config and recipe keys.
  run.sets = parse_set_args(r.sets, r.taken);
  run.config_file = resolve(r.config);
  run.config_where = with_settings(r.config, run.sets.config);
  run.label = labelled_name(fs::path(r.config).stem().string(), run.sets.config);

  // The config, then the recipe and its plans on the config's model.
  run.config = resolve_config(r, run);
  if (!r.recipe.empty()) set_recipe(run, r.recipe);

  // The data source.
  if (r.with_data) run.data = run_data_spec(run.config, run.config_file, run.config_where, r.data);
  run.cache_dir = run_cache_dir(run.config, r.data);
  log_resolved_run(run);
  return run;
}

ResolvedRun resolve_recipe(const ResolvedRun& run, const std::string& recipe_arg) {
  ResolvedRun out = run;
  set_recipe(out, recipe_arg);
  log_resolved_run(out);
  return out;
}

}  // namespace fp4
