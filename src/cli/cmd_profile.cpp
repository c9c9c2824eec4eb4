// `fp4train profile`: where the time of a training step goes (docs/performance.md "Where the
// time goes: `fp4train profile`"). The options and the printing; the steps run in the train
// room (fp4/train/profile_run.h).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "commands.h"
#include "fp4/dist/dist.h"
#include "fp4/base/error.h"
#include "fp4/base/machine_load.h"
#include "fp4/base/profile.h"
#include "fp4/gemm/machine.h"
#include "fp4/base/safetensors.h"
#include "fp4/base/words.h"
#include "fp4/train/profile_run.h"
#include "fp4/train/train.h"
#include "fp4/train/paths.h"
#include "fp4/train/resolved_run.h"
#include "options.h"

namespace fp4::cli {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {
struct ProfileArgs {
  std::string config = "configs/tiny.toml";
  std::string recipe = "ue5m3-b16";
  int steps = 5, warmup = 2;
  std::string data, json_file;
  double peak_gflops = 0;
  std::vector<std::string> sets;  // --set KEY=VALUE
};

std::string mib(int64_t bytes) {
  char b[64];
  std::snprintf(b, sizeof b, "%.1f MiB", double(bytes) / (1 << 20));
  return b;
}

// One component of the breakdown: its name and totals over the measured steps.
struct Row {
  const char* name;
  double s, flops;
  int64_t calls;
};

// The components that ran, slowest first (ties in prof::Cat order).
std::vector<Row> component_rows(const prof::Totals& t) {
  std::vector<Row> rows;
  for (int c = 0; c < int(prof::Cat::kCount); ++c)
    if (t.seconds[c] > 0 || t.calls[c] > 0)
      rows.push_back({prof::name(prof::Cat(c)), t.seconds[c], t.flops[c], t.calls[c]});
  std::stable_sort(rows.begin(), rows.end(), [](const Row& x, const Row& y) { return x.s > y.s; });
  return rows;
}

// Seconds of every component, summed in prof::Cat order: the step the percentages are of.
double total_seconds(const prof::Totals& t) {
  double total = 0;
  for (int c = 0; c < int(prof::Cat::kCount); ++c) total += t.seconds[c];
  return total;
}

// Throughput and model FLOPs utilization against the FP32 GEMM rate.
struct Rates {
  double tok_s, model_gflops, mfu, mfu_causal;
};

Rates rates_of(const ProfileResult& p, const prof::PeakRate& peak) {
  Rates r;
  r.tok_s = p.tokens_per_step / (p.mean_step_ms / 1e3);
  r.model_gflops = p.flops_per_token * r.tok_s / 1e9;
  r.mfu = r.model_gflops / peak.gflops;
  // The same with attention counted over the causal triangle the kernel computes (the
  // mixers' causal_flops_per_token).
  r.mfu_causal = p.flops_per_token_causal * r.tok_s / 1e9 / peak.gflops;
  return r;
}

// The step time first (`step: <mean ms> ms`), then what was run where.
void print_header(const ProfileArgs& a, const std::string& cfg_name, const RunConfig& cfg,
                  const Recipe& recipe, const ProfileResult& p, const prof::ComputePaths& compute,
                  const MachineLoad& load) {
  const auto& tc = cfg.train;
  std::printf("step: %.1f ms\n", p.mean_step_ms);
  std::printf("(mean of %s after %s; median %.1f ms, min %.1f, max %.1f)\n",
              count_of(a.steps, "step").c_str(), count_of(a.warmup, "warm-up step").c_str(),
              p.median_step_ms, p.min_step_ms, p.max_step_ms);
  std::printf(
      "config %s, recipe %s: %lld parameters, %lld tokens/step (batch %d x seq %d), "
      "%d OpenMP threads%s\n",
      cfg_name.c_str(), recipe.name.c_str(), static_cast<long long>(p.num_params),
      static_cast<long long>(p.tokens_per_step), tc.batch_size, tc.seq_len, omp_get_max_threads(),
      p.telemetry_steps ? " (telemetry steps included)" : "");
  if (tc.n_micro() > 1 || dist::size() > 1)
    std::printf(
        "%d micro-batches of %d sequences per step over %d process%s (MPI: rank 0's "
        "components; `comm` is its communication)\n",
        tc.n_micro(), tc.micro(), dist::size(), dist::size() > 1 ? "es" : "");
  std::printf("compute: %s\n", compute.line().c_str());
  if (load.busy())
    std::printf(
        "warning: busy machine (%s): more runnable threads than cores, so these timings "
        "measure the scheduler too; rerun on a quieter machine or with fewer threads "
        "(OMP_NUM_THREADS)\n",
        load.describe().c_str());
}

// The run's one warning when a quantizer path is slower than the fused SIMD kernels
// (slow_quantizer_paths, docs/performance.md "Block sizes and the quantizer's fast path"),
// with what quantization measured here.
void print_slow_path(const std::string& slow, const ProfileResult& p, int steps) {
  if (slow.empty()) return;
  double quant_s = 0;
  for (int c = 0; c < int(prof::Cat::kCount); ++c) {
    const std::string nm = prof::name(prof::Cat(c));
    if (nm.rfind("quant.", 0) == 0 || nm == "transpose") quant_s += p.totals.seconds[c];
  }
  std::printf(
      "warning: slow quantizer path (the fused SIMD kernels do not cover it, so step times are "
      "longer, not the machine busier): %s; quantization measured %.1f ms of the %.1f ms step\n",
      slow.c_str(), quant_s * 1e3 / steps, p.mean_step_ms);
}

// The component table (ms per step, % of the step, GFLOP/s, calls per step over n steps)
// and the GEMM and quantization shares.
void print_components(const std::vector<Row>& rows, double total, int n) {
  std::printf("\n%-24s %10s %8s %10s %8s\n", "component", "ms/step", "% step", "GFLOP/s", "calls");
  double gemm_s = 0, gemm_flops = 0, quant_s = 0;
  for (const Row& r : rows) {
    const std::string nm = r.name;
    if (nm.rfind("gemm.", 0) == 0) gemm_s += r.s, gemm_flops += r.flops;
    if (nm.rfind("quant.", 0) == 0 || nm == "transpose") quant_s += r.s;
    char gf[32] = "";
    if (r.flops > 0) std::snprintf(gf, sizeof gf, "%.1f", r.flops / r.s / 1e9);
    std::printf("%-24s %10.2f %7.1f%% %10s %8.1f\n", r.name, r.s * 1e3 / n, 100.0 * r.s / total, gf,
                double(r.calls) / n);
  }
  std::printf("%-24s %10.2f %7.1f%%\n", "sum of components", total * 1e3 / n, 100.0);
  std::printf("\nGEMMs %.1f%% of the step at %.1f GFLOP/s; quantization %.1f%%\n",
              100.0 * gemm_s / total, gemm_s > 0 ? gemm_flops / gemm_s / 1e9 : 0.0,
              100.0 * quant_s / total);
}

// Throughput, model FLOPs and MFU.
void print_rates(const ProfileResult& p, const Rates& r, const prof::PeakRate& peak,
                 const RunConfig& cfg) {
  std::printf(
      "throughput %.0f tokens/s; model FLOPs %.2f M/token (6N + mixers, N = %lld "
      "non-embedding parameters)\n",
      r.tok_s, p.flops_per_token / 1e6,
      static_cast<long long>(p.num_params - int64_t(cfg.model.vocab_size) * cfg.model.d_model));
  std::printf(
      "MFU %.1f%% (vs the FP32 GEMM rate): %.1f model GFLOP/s of %.1f GFLOP/s FP32 GEMM rate "
      "(%s)\n",
      100 * r.mfu, r.model_gflops, peak.gflops, peak.source.c_str());
  std::printf(
      "    %.1f%% with attention counted over the causal triangle only (6N + 6·A·H·hd·(T+1), A "
      "attention blocks)\n",
      100 * r.mfu_causal);
}

// Peak resident memory and the model's buffers by part.
void print_memory(const ProfileResult& p) {
  const nn::Model::MemoryUse& mem = p.memory;
  std::printf("\nmemory: peak resident %s (VmHWM). Model buffers %s:\n",
              mib(p.peak_rss_bytes).c_str(), mib(mem.total() + p.adamw_bytes).c_str());
  std::printf("  parameters %s + gradients %s + AdamW moments %s\n", mib(mem.params).c_str(),
              mib(mem.grads).c_str(), mib(p.adamw_bytes).c_str());
  std::printf("  activations kept for backward %s, logits (their gradient in place) %s\n",
              mib(mem.activations).c_str(), mib(mem.logits).c_str());
  std::printf(
      "  backward gradient buffers %s, Linear operand scratch %s (kept per layer %s, "
      "shared workspace %s)\n",
      mib(mem.backward_scratch).c_str(), mib(mem.linear_scratch + mem.linear_workspace).c_str(),
      mib(mem.linear_scratch).c_str(), mib(mem.linear_workspace).c_str());
}

// --json: the breakdown as one JSON object.
void write_profile_json(const ProfileArgs& a, const Settings& sets, const Recipe& recipe,
                        const RunConfig& cfg, const ProfileResult& p, const Rates& r,
                        const prof::PeakRate& peak, const std::vector<Row>& rows,
                        const prof::ComputePaths& compute, const MachineLoad& load,
                        const std::string& slow_path) {
  const int n = a.steps;
  const double total = total_seconds(p.totals);
  const nn::Model::MemoryUse& mem = p.memory;
  json comps = json::object();
  for (const Row& c : rows)
    comps[c.name] = {{"ms_per_step", c.s * 1e3 / n},
                     {"fraction", c.s / total},
                     {"gflops", c.flops > 0 ? c.flops / c.s / 1e9 : 0.0},
                     {"calls_per_step", double(c.calls) / n}};
  json j = {{"config", a.config},
            {"sets", sets.given},
            {"recipe", recipe.name},
            {"threads", omp_get_max_threads()},
            {"machine_load", {{"load1", load.load1}, {"cores", load.cores}, {"busy", load.busy()}}},
            {"processes", dist::size()},
            {"micro_batch_size", cfg.train.micro()},
            {"steps", n},
            {"warmup", a.warmup},
            {"step_ms", p.step_ms},
            {"mean_step_ms", p.mean_step_ms},
            {"median_step_ms", p.median_step_ms},
            {"tokens_per_step", p.tokens_per_step},
            {"tokens_per_s", r.tok_s},
            {"model_flops_per_token", p.flops_per_token},
            {"peak_gflops", peak.gflops},
            {"peak_source", peak.source},
            {"mfu", r.mfu},
            {"mfu_causal", r.mfu_causal},
            {"components", comps},
            {"peak_rss_bytes", p.peak_rss_bytes},
            {"memory",
             {{"params", mem.params},
              {"grads", mem.grads},
              {"adamw", p.adamw_bytes},
              {"activations", mem.activations},
              {"logits", mem.logits},
              {"backward_scratch", mem.backward_scratch},
              {"linear_scratch", mem.linear_scratch},
              {"linear_workspace", mem.linear_workspace}}}};
  for (const auto& [k, v] : compute.fields()) j["compute"][k] = v;
  if (!slow_path.empty()) j["slow_path"] = slow_path;
  write_file_atomic(a.json_file, j.dump(2) + "\n");
}

void run_profile(const ProfileArgs& a) {
  RunRequest request;
  request.config = a.config;
  request.recipe = a.recipe;
  request.sets = a.sets;
  if (!a.data.empty()) request.taken.push_back({"data.path", "--data"});
  request.data = a.data;
  const ResolvedRun run = resolve_run(request);
  const RunConfig& cfg = run.config;
  const Recipe& recipe = run.recipe;
  const std::string& cfg_name = run.label;
  const DataSpec& data_spec = run.data;
  const prof::PeakRate peak = prof::fp32_peak_gflops(a.peak_gflops, /*remeasure=*/true);
  // Data preparation reports on stderr (a first run trains the tokenizer: up to a minute at
  // vocab 50304), keeping stdout the breakdown alone.
  const TokenData data = prepare_tokens_all_ranks(
      data_spec, cfg.model.vocab_size, run.cache_dir,
      [](const std::string& m) { std::fprintf(stderr, "%s\n", m.c_str()); });

  const ProfileResult p = profile_steps(run, data, {a.steps, a.warmup});
  const Rates rates = rates_of(p, peak);
  const prof::ComputePaths compute = prof::compute_paths();
  const MachineLoad load = machine_load();
  print_header(a, cfg_name, cfg, recipe, p, compute, load);
  const std::string slow = slow_quantizer_paths(run.plans);
  print_slow_path(slow, p, a.steps);
  const std::vector<Row> rows = component_rows(p.totals);
  print_components(rows, total_seconds(p.totals), a.steps);
  print_rates(p, rates, peak, cfg);
  print_memory(p);
  if (!a.json_file.empty() && dist::rank() == 0)  // rank 0 alone writes (under mpirun)
    write_profile_json(a, run.sets, recipe, cfg, p, rates, peak, rows, compute, load, slow);
}
}  // namespace

void register_profile(CLI::App& app) {
  auto a = std::make_shared<ProfileArgs>();
  auto* c = app.add_subcommand(
      "profile",
      "Time training steps of a config and recipe and print where the time goes: GEMMs by\n"
      "kind (fprop, dgrad, wgrad; FP32 LM head included), quantization (tensor amax; block\n"
      "scale + E2M1 rounding, fused per block; wgrad quantize-transposes with the RHT fused;\n"
      "BF16 rounding), attention, norms, activations, loss, optimizer and data, as ms per\n"
      "step and % of the step; then tokens/s, model FLOPs utilization (MFU) against the\n"
      "machine's measured FP32 GEMM rate, and peak resident memory with the model's buffers.\n"
      "MFU is against the FP32 GEMM rate for every recipe (BF16 GEMMs can beat it). The first\n"
      "line is `step: <mean ms> ms`. Writes no run directory; --json writes the breakdown.");
  c->add_option("--config", a->config, "Run config TOML")->capture_default_str();
  c->add_option("--recipe", a->recipe, "Recipe name in configs/recipes/ or a recipe .toml path")
      ->capture_default_str()
      ->check(CLI::Validator(check_recipe_arg, "RECIPE"));
  c->add_option("--steps", a->steps, "Timed steps (after the warm-up)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  c->add_option("--warmup", a->warmup,
                "Untimed warm-up steps first (JIT, page faults, step 1's telemetry)")
      ->capture_default_str()
      ->check(CLI::Range(0, 100000));
  c->add_option(
      "--data", a->data,
      "Data file or directory instead of data.path (text, JSONL, token shards: docs/data.md)");
  c->add_option("--json", a->json_file, "Also write the breakdown as JSON to this file");
  c->add_option("--peak-gflops", a->peak_gflops,
                "FP32 GEMM rate (GFLOP/s) to compute MFU against, instead of the measured one "
                "(default: measured now with a 0.3 s oneDNN GEMM; the best rate measured per "
                "machine and thread count is kept in ~/.cache/fp4train/gemm_peak.tsv, or "
                "$FP4_CACHE_DIR/gemm_peak.tsv, and used when it is higher)")
      ->check(CLI::Validator(check_peak_gflops, "GFLOP/s"));
  add_set_option(c, a->sets, " (--data may not set data.path too)");
  c->callback([a] { run_profile(*a); });
}

}  // namespace fp4::cli
