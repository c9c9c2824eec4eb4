// Where the time of a training step goes (fp4/train/profile_run.h): the steps of a config and
// recipe with the component timers on, as `fp4train profile` prints them.
#include "fp4/train/profile_run.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>

#include "fp4/base/error.h"
#include "fp4/train/train.h"

namespace fp4 {
namespace {

// The component timers on for a scope, off when it ends (also by an exception).
class ProfilingOn {
 public:
  ProfilingOn() { prof::enable(true); }
  ~ProfilingOn() { prof::enable(false); }
  ProfilingOn(const ProfilingOn&) = delete;
  ProfilingOn& operator=(const ProfilingOn&) = delete;
};

// Steps 1 .. warmup + steps; the timers are zeroed before the first measured one. Fills the
// step times, the telemetry count and the component totals of r.
void run_steps(nn::Model& model, AdamW& optimizer, BatchSampler& sampler, const RunConfig& cfg,
               const Recipe& recipe, const ProfileOptions& opt, ProfileResult& r) {
  const std::unique_ptr<nn::RankReferences> ranks = rank_references(recipe);
  StepBuffers buffers;
  std::vector<int32_t> inputs(r.tokens_per_step), targets(r.tokens_per_step);
  const ProfilingOn on;
  for (int step = 1; step <= opt.warmup + opt.steps; ++step) {
    if (step == opt.warmup + 1) prof::reset();
    const auto t0 = std::chrono::steady_clock::now();
    const StepResult s = train_step(model, optimizer, sampler, cfg, recipe, step, inputs, targets,
                                    buffers, ranks.get());
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!s.diverged.empty())
      throw UserError(s.diverged + " at step " + std::to_string(step) + " while profiling");
    if (step > opt.warmup) {
      r.step_ms.push_back(ms);
      r.telemetry_steps += s.telemetry;
    }
  }
  r.totals = prof::totals();
}

// Mean, median, min and max of the measured step times.
void step_statistics(ProfileResult& r) {
  const int n = int(r.step_ms.size());
  double mean_ms = 0;
  for (double m : r.step_ms) mean_ms += m;
  r.mean_step_ms = mean_ms / n;
  std::vector<double> sorted = r.step_ms;
  std::sort(sorted.begin(), sorted.end());
  r.median_step_ms = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  r.min_step_ms = sorted.front();
  r.max_step_ms = sorted.back();
}

}  // namespace

ProfileResult profile_steps(const ResolvedRun& run, const TokenData& data,
                            const ProfileOptions& opt) {
  const RunConfig& run_cfg = run.config;
  const Recipe& recipe = run.recipe;
  if (opt.steps < 1 || opt.warmup < 0)
    throw std::invalid_argument("profile_steps: steps must be >= 1 and warmup >= 0");
  if (data.vocab_size > run_cfg.model.vocab_size)
    throw UserError("tokenizer vocab exceeds model.vocab_size");
  // The steps run with train's schedule over warmup + steps steps; telemetry only as train
  // would do it (step 1, inside the warm-up, and every telemetry_interval-th step).
  RunConfig cfg = run_cfg;
  cfg.train.steps = std::max(cfg.train.steps, opt.warmup + opt.steps);
  const TrainConfig& tc = cfg.train;

  ProfileResult r;
  r.tokens_per_step = int64_t(tc.batch_size) * tc.seq_len;
  nn::Model model(cfg.model, run.plans, tc.micro(), tc.seq_len);  // one micro-batch per forward
  model.init(tc.seed);
  AdamW optimizer(model.num_params(), tc);
  BatchSampler sampler(data.train, tc.seq_len, tc.batch_size, tc.seed);
  run_steps(model, optimizer, sampler, cfg, recipe, opt, r);
  step_statistics(r);

  r.num_params = model.num_params();
  r.flops_per_token = model.flops_per_token(tc.seq_len);
  r.flops_per_token_causal = model.flops_per_token(tc.seq_len, /*causal=*/true);
  r.memory = model.memory_use();
  r.adamw_bytes = 2 * int64_t(model.num_params()) * int64_t(sizeof(float));
  r.peak_rss_bytes = prof::peak_rss_bytes();
  return r;
}

}  // namespace fp4
