// `fp4train info`: what a run of a config and recipe would be (parameters, FLOPs, step memory,
// every linear's mode), without building the model (fp4/train/info.h).
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "fp4/base/error.h"
#include "fp4/train/info.h"
#include "fp4/train/train.h"
#include "fp4/train/paths.h"
#include "fp4/train/resolved_run.h"
#include "options.h"

namespace fp4::cli {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {
struct InfoArgs {
  std::string config;
  std::string recipe = "ue5m3-b16";
  bool json = false;
  std::vector<std::string> sets;  // --set KEY=VALUE
};

// 8084075520 -> "8,084,075,520".
std::string grouped(int64_t v) {
  std::string s = std::to_string(v < 0 ? -v : v), o;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > 0 && (s.size() - i) % 3 == 0) o += ',';
    o += s[i];
  }
  return v < 0 ? "-" + o : o;
}

std::string human_bytes(int64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = double(b);
  int u = 0;
  while (v >= 1024 && u < 5) v /= 1024, ++u;
  char buf[64];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

std::string human_count(double v) {
  char buf[64];
  if (v >= 1e12) std::snprintf(buf, sizeof buf, "%.2f T", v / 1e12);
  else if (v >= 1e9) std::snprintf(buf, sizeof buf, "%.2f B", v / 1e9);
  else if (v >= 1e6) std::snprintf(buf, sizeof buf, "%.2f M", v / 1e6);
  else if (v >= 1e3) std::snprintf(buf, sizeof buf, "%.2f k", v / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", v);
  return buf;
}

std::string shape_str(const LinearInfo& l) {
  return "[" + std::to_string(l.out) + ", " + std::to_string(l.in) + "]";
}

void print_text(const ModelInfo& in, const std::string& cfg_name, const Recipe& recipe) {
  std::printf("config %s, recipe %s (nothing is allocated: figures from the config)\n",
              cfg_name.c_str(), recipe.name.c_str());
  std::string counts;
  for (const BlockKindCount& k : in.kinds)
    counts += (counts.empty() ? "" : ", ") + std::to_string(k.blocks) + " " + k.name;
  std::printf("pattern %s: %d blocks (%s)\n", in.pattern.c_str(), in.n_blocks, counts.c_str());
  std::printf("parameters: %s (%s)\n", grouped(in.parameters).c_str(),
              human_count(double(in.parameters)).c_str());
  for (const BlockKindCount& k : in.kinds) {
    if (k.blocks == 0) continue;
    std::printf("  %-18s %3d x %15s = %17s\n", (k.name + " blocks").c_str(), k.blocks,
                grouped(k.per_block).c_str(), grouped(k.params).c_str());
  }
  std::printf("  %-18s %25s %17s\n", "embeddings", "", grouped(in.embeddings).c_str());
  std::printf("  %-18s %25s %17s\n", "lm_head", "", grouped(in.lm_head).c_str());
  std::printf("  %-18s %25s %17s\n", "norm_f", "", grouped(in.norm_f).c_str());
  std::printf("model FLOPs: %.4e per token at seq_len %d (6N + attention/SSD terms, PaLM), "
              "%.4e per step (%s tokens = batch %d x seq %d)\n",
              in.flops_per_token, in.seq_len, in.flops_per_step,
              grouped(in.tokens_per_step).c_str(), in.batch_size, in.seq_len);
  const StepMemory& m = in.memory;
  if (in.micro_batch_size == in.batch_size)
    std::printf("memory of one training step at batch %d x seq %d, the whole batch at once as `train` holds it (FP32 unless noted):\n",
                in.batch_size, in.seq_len);
  else
    std::printf("memory of one training step in micro-batches of %d x seq %d (%d per step), as `train` holds it in one process (FP32 unless noted):\n",
                in.micro_batch_size, in.seq_len, in.batch_size / in.micro_batch_size);
  auto mem_line = [](const char* what, int64_t b, const char* note) {
    std::printf("  %-30s %12s %22s bytes%s\n", what, human_bytes(b).c_str(), grouped(b).c_str(),
                note);
  };
  mem_line("parameters", m.params, "");
  mem_line("gradients", m.grads, "");
  mem_line("AdamW moments", m.adamw, "");
  if (m.accumulation > 0)
    mem_line("gradient accumulation", m.accumulation, "  (micro-batch gradient tree: node sums)");
  mem_line("activations kept for backward", m.activations, "");
  mem_line("logits", m.logits, "");
  mem_line("backward scratch", m.backward_scratch, "");
  mem_line("per-linear copies", m.linear_scratch,
           "  (estimate: FP4 weight copy [out*in] FP32; BF16 X, W, dY copies)");
  mem_line("linear workspace", m.linear_workspace,
           "  (estimate: shared FP4 operand buffers, as reserved at construction)");
  mem_line("total", m.total(), "");

  std::printf("linears under recipe %s (mode after [high_precision] and [[override]]):\n",
              recipe.name.c_str());
  for (const LinearInfo& l : in.linears) {
    std::string ov;
    for (int k : l.overrides) ov += (ov.empty() ? "  changed by override[" : ", override[") +
                                    std::to_string(k) + "]";
    std::printf("  %-28s %-16s %s%s\n", l.name.c_str(), shape_str(l).c_str(),
                linear_mode_name(l.mode), ov.c_str());
  }
  for (size_t k = 0; k < in.override_hits.size(); ++k) {
    std::string names;
    for (int i : in.override_hits[k])
      names += (names.empty() ? "" : ", ") + in.linears[size_t(i)].name;
    const size_t n = in.override_hits[k].size();
    std::printf("override[%zu] %s -> %zu linear%s: %s\n", k, in.override_descriptions[k].c_str(),
                n, n == 1 ? "" : "s", names.c_str());
  }
  // The FP4 GEMM as the recipe resolved it (gemm = "auto" included; docs/gemm.md)
  const int fp4 = in.mode_counts[int(LinearMode::FP4)];
  std::printf("modes: %d FP4-eligible linears: %d fp4, %d bf16, %d fp32; + lm_head fp32%s%s\n",
              in.eligible_linears(), fp4, in.mode_counts[int(LinearMode::BF16)],
              in.mode_counts[int(LinearMode::FP32)], fp4 ? "; FP4 GEMM " : "",
              fp4 ? gemm_mode_name(recipe.gemm) : "");
}

json to_json(const ModelInfo& in, const std::string& config, const Settings& sets,
             const Recipe& recipe) {
  const StepMemory& m = in.memory;
  json linears = json::array();
  for (const LinearInfo& l : in.linears)
    linears.push_back({{"name", l.name},
                       {"block", l.block},
                       {"kind", l.kind},
                       {"shape", {l.out, l.in}},
                       {"mode", linear_mode_name(l.mode)},
                       {"overrides", l.overrides}});
  json overrides = json::array();
  for (size_t k = 0; k < in.override_hits.size(); ++k) {
    std::vector<std::string> names;
    for (int i : in.override_hits[k]) names.push_back(in.linears[size_t(i)].name);
    overrides.push_back({{"index", k}, {"description", in.override_descriptions[k]},
                         {"linears", names}});
  }
  json by_part = {{"embeddings", in.embeddings}, {"lm_head", in.lm_head}, {"norm_f", in.norm_f}};
  for (const BlockKindCount& k : in.kinds)
    by_part[k.key + "_blocks"] = {{"blocks", k.blocks}, {"per_block", k.per_block}, {"params", k.params}};
  return {{"config", config},
          {"sets", sets.given},
          {"recipe", recipe.name},
          {"pattern", in.pattern},
          {"blocks", in.n_blocks},
          {"parameters", in.parameters},
          {"parameters_by_part", by_part},
          {"batch_size", in.batch_size},
          {"micro_batch_size", in.micro_batch_size},
          {"seq_len", in.seq_len},
          {"tokens_per_step", in.tokens_per_step},
          {"flops_per_token", in.flops_per_token},
          {"flops_per_step", in.flops_per_step},
          {"memory_bytes",
           {{"params", m.params},
            {"grads", m.grads},
            {"adamw", m.adamw},
            {"accumulation", m.accumulation},
            {"activations", m.activations},
            {"logits", m.logits},
            {"backward_scratch", m.backward_scratch},
            {"linear_scratch", m.linear_scratch},
            {"linear_workspace", m.linear_workspace},
            {"total", m.total()}}},
          {"memory_estimates", {"linear_scratch", "linear_workspace"}},
          {"linears", linears},
          {"fp4_eligible_linears", in.eligible_linears()},
          {"mode_counts",
           {{"fp4", in.mode_counts[int(LinearMode::FP4)]},
            {"bf16", in.mode_counts[int(LinearMode::BF16)]},
            {"fp32", in.mode_counts[int(LinearMode::FP32)]}}},
          {"overrides", overrides}};
}

void run_info(const InfoArgs& a) {
  RunRequest request;
  request.config = a.config;
  request.recipe = a.recipe;
  request.sets = a.sets;
  request.with_data = false;  // the figures come from the config alone
  const ResolvedRun run = resolve_run(request);
  const ModelInfo in = model_info(run.config, run.recipe, run.plans);
  if (a.json) {
    std::printf("%s\n", to_json(in, a.config, run.sets, run.recipe).dump(2).c_str());
    return;
  }
  print_text(in, run.label, run.recipe);
}
}  // namespace

void register_info(CLI::App& app) {
  auto a = std::make_shared<InfoArgs>();
  auto* c = app.add_subcommand(
      "info",
      "Print what a training run of a config and recipe would be, without building the model\n"
      "(instant even for configs/nemotron-h-8b.toml): the pattern, the parameter count with a\n"
      "breakdown by block kind, model FLOPs per token and per step, the memory of one training\n"
      "step at the config's batch_size x seq_len by part (params, grads, AdamW moments,\n"
      "activations, logits, backward scratch; the per-linear copies and workspace estimated),\n"
      "and every linear (layers.N.mixer.<kind>, shape [out, in], mode fp4/bf16/fp32 under the\n"
      "recipe, the [[override]]s that change it; lm_head fp32). --json prints one JSON object.");
  c->add_option("--config", a->config, "Run config TOML")->required();
  c->add_option("--recipe", a->recipe, "Recipe name in configs/recipes/ or a recipe .toml path")
      ->capture_default_str()
      ->check(CLI::Validator(check_recipe_arg, "RECIPE"));
  c->add_flag("--json", a->json, "Print the same as one JSON object instead of text");
  add_set_option(c, a->sets, "");
  c->callback([a] { run_info(*a); });
}

}  // namespace fp4::cli
