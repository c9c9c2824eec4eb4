// Paired rollouts (run_rollouts; docs/fidelity.md "Paired rollouts"): a private class
// RolloutRun, stage by stage as FidelityRun runs the panel: check → plan → execute.
// The report (rollout.md, rollout.json) is rollout_report.cpp.
#include "fp4/study/rollout.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>

#include "fidelity_internal.h"
#include "fp4/base/error.h"
#include "fp4/data/data.h"
#include "fp4/gemm/machine.h"
#include "fp4/nn/model.h"
#include "fp4/study/evaluate.h"
#include "fp4/train/checkpoint.h"
#include "fp4/train/train.h"

namespace fp4 {
namespace fs = std::filesystem;

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ‖a − b‖ in double, index order (the same for any thread count).
double distance(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = double(a[i]) - double(b[i]);
    s += d * d;
  }
  return std::sqrt(s);
}

class RolloutRun {
 public:
  explicit RolloutRun(const RolloutRequest& r) : req(r) {}
  void check() const;
  void plan();
  RolloutResult execute();

 private:
  EvalSource source(const std::string& recipe, const fs::path& checkpoint) const;
  RolloutTrace rollout(size_t r, int order, const Checkpoint& ck,
                       const std::vector<float>* fp32_final, std::vector<float>* final_params);

  const RolloutRequest& req;
  const std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  std::map<int64_t, fs::path> by_step;
  RolloutResult res;
  std::vector<EvalSource> sources;  // per recipe, on the newest checkpoint (config, recipe, plans)
  TokenData data;
  std::vector<int64_t> heldout;     // starts of the held-out windows
};

void RolloutRun::check() const {
  if (req.recipes.empty()) throw UserError("rollout: give at least one --recipe");
  if (req.length < 1) throw UserError("rollout: --length must be at least 1, got " + std::to_string(req.length));
  if (req.orders < 1) throw UserError("rollout: --orders must be at least 1, got " + std::to_string(req.orders));
  if (req.checkpoints < 1)
    throw UserError("rollout: --checkpoints must be at least 1, got " + std::to_string(req.checkpoints));
  if (req.windows < 0) throw UserError("rollout: --windows must be 0 (the run's) or more");
  if (req.resamples < 1) throw UserError("rollout: --resamples must be at least 1");
  if (!fs::is_directory(req.run)) throw UserError("rollout: run " + req.run.string() + " does not exist");
}

// The recipe `recipe` on checkpoint `checkpoint` (its config; the data override).
EvalSource RolloutRun::source(const std::string& recipe, const fs::path& checkpoint) const {
  EvalSourceSpec spec;
  spec.checkpoint = checkpoint.string();
  spec.recipe = recipe;
  spec.data = req.data;
  return load_eval_source(spec);
}

// The recipes (fp32 first; each loaded once, onto the run's newest checkpoint, which checks it
// fits the model: a run's checkpoints share its config, and rollout() takes each checkpoint's
// weights), the checkpoints, the data and the held-out windows.
void RolloutRun::plan() {
  using namespace fidelity_detail;
  by_step = checkpoints_by_step(req.run, "rollout");
  const fs::path& newest = by_step.rbegin()->second;
  sources.push_back(source("fp32", newest));
  for (const std::string& r : req.recipes) sources.push_back(source(r, newest));
  // A rollout continues the run's schedule: steps s + 1 .. s + N must lie within train.steps.
  const int64_t last = sources[0].cfg.train.steps;
  std::map<int64_t, fs::path> fits;
  for (const auto& [st, f] : by_step)
    if (st + req.length <= last) fits.emplace(st, f);
  if (req.steps.empty() && fits.empty())
    throw UserError("rollout: no checkpoint of run " + req.run.string() + " leaves " +
                    std::to_string(req.length) + " steps before its train.steps = " + std::to_string(last) +
                    " (a rollout continues the run's learning-rate schedule); use a shorter --length");
  res.steps = choose_steps(req.steps.empty() ? fits : by_step, req.steps, req.checkpoints, req.run, "rollout");
  for (int64_t st : res.steps)
    if (st + req.length > last)
      throw UserError("rollout: checkpoint " + std::to_string(st) + " + --length " + std::to_string(req.length) +
                      " runs past the run's train.steps = " + std::to_string(last) +
                      " (a rollout continues the run's learning-rate schedule)");
  res.run = req.run;
  // The reference rollout first; a requested "fp32" runs again as a recipe of its own (its gaps
  // are then exactly 0: the check that the rollouts are deterministic).
  res.recipes = {kRolloutReference};
  res.recipes.insert(res.recipes.end(), req.recipes.begin(), req.recipes.end());
  const RunConfig& cfg = sources[0].cfg;
  EvalSourceSpec spec;
  spec.checkpoint = newest.string();
  spec.data = req.data;
  data = load_eval_data(sources[0], spec, req.quiet);
  res.windows = req.windows > 0 ? req.windows : cfg.eval.windows;
  heldout = heldout_windows(int64_t(data.heldout.size()), cfg.train.seq_len, res.windows);
  if (heldout.empty()) throw UserError("rollout: the run's held-out split holds no window of seq_len + 1 tokens");
  res.windows = int(heldout.size());
  res.length = req.length;
  res.orders = req.orders;
  res.seed = req.seed;
  res.machine = prof::cpu_model_name() + ", " + std::to_string(omp_get_max_threads()) + " threads";
  res.traces.assign(res.recipes.size(), std::vector<std::vector<RolloutTrace>>(
                                            res.steps.size(), std::vector<RolloutTrace>(size_t(req.orders))));
}

// One rollout of recipe r from checkpoint c along batch order `order`: the checkpoint's weights
// and AdamW moments, N train_steps, the held-out NLL, and (recipes after fp32) the divergence
// from fp32's final weights. fp32's own final weights go to `final_params`.
RolloutTrace RolloutRun::rollout(size_t r, int order, const Checkpoint& ck,
                                 const std::vector<float>* fp32_final, std::vector<float>* final_params) {
  const EvalSource& s = sources[r];
  const RunConfig& cfg = s.cfg;
  const TrainConfig& tc = cfg.train;
  // Model and optimizer: the checkpoint's state, the recipe's linears (references start empty).
  EvalSource at = s;
  at.params = ck.params;
  at.step = ck.step;
  auto model = build_eval_model(at, tc.micro());
  AdamW opt(int64_t(ck.params.size()), tc);
  opt.m() = ck.adam_m;
  opt.v() = ck.adam_v;
  // Batches: order 0 continues the run's sampler; order o > 0 a sampler of its own.
  BatchSampler sampler(data.train, tc.seq_len, tc.batch_size,
                       order == 0 ? tc.seed : splitmix64(req.seed, uint64_t(order)));
  if (order == 0) sampler.set_draws(ck.sampler_draws);
  std::vector<int32_t> in(size_t(tc.batch_size) * size_t(tc.seq_len)), tg(in.size());
  RolloutTrace t;
  t.loss.assign(size_t(req.length), kNaN);
  for (int i = 0; i < req.length && t.diverged.empty(); ++i) {
    const int step = int(ck.step) + 1 + i;
    const StepResult sr = train_step(*model, opt, sampler, cfg, s.recipe, step, in, tg);
    if (!sr.diverged.empty()) t.diverged = "step " + std::to_string(step) + ": " + sr.diverged;
    else t.loss[size_t(i)] = sr.loss;
  }
  // The end: held-out NLL (quantized inference, policy current; fp32 unquantized), divergence.
  t.nll = kNaN, t.nll_fp32 = kNaN, t.divergence = kNaN;
  if (t.diverged.empty()) {
    t.nll_fp32 = heldout_nll(*model, data.heldout, heldout, tc.seq_len, tc.micro(), false);
    t.nll = s.recipe.mode == LinearMode::FP32
                ? t.nll_fp32
                : heldout_nll(*model, data.heldout, heldout, tc.seq_len, tc.micro(), true);
    if (fp32_final) t.divergence = distance(model->params(), *fp32_final) / distance(*fp32_final, ck.params);
  }
  if (final_params) *final_params = model->params();
  if (!req.quiet)
    std::fprintf(stderr, "rollout: checkpoint %lld, order %d, %-22s final loss %.4f, NLL %.4f%s (%.0f s)\n",
                 static_cast<long long>(ck.step), order, res.recipes[r].c_str(), t.loss.back(), t.nll,
                 t.diverged.empty() ? "" : (", diverged at " + t.diverged).c_str(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return t;
}

RolloutResult RolloutRun::execute() {
  for (size_t c = 0; c < res.steps.size(); ++c) {
    const Checkpoint ck = load_checkpoint(by_step.at(res.steps[c]));
    for (int o = 0; o < req.orders; ++o) {
      std::vector<float> fp32_final;
      res.traces[0][c][size_t(o)] = rollout(0, o, ck, nullptr, &fp32_final);
      // fp32 against itself: its own final weights, so the divergence is exactly 0 when finite.
      res.traces[0][c][size_t(o)].divergence = res.traces[0][c][size_t(o)].diverged.empty() ? 0.0 : kNaN;
      for (size_t r = 1; r < res.recipes.size(); ++r)
        res.traces[r][c][size_t(o)] = rollout(r, o, ck, &fp32_final, nullptr);
    }
  }
  return res;
}
}  // namespace

RolloutResult run_rollouts(const RolloutRequest& req) {
  RolloutRun run(req);
  run.check();
  run.plan();
  return run.execute();
}

}  // namespace fp4
