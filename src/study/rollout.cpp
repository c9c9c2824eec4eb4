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
#include "fp4/dist/dist.h"
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

// A trace as doubles for the gather over ranks (exact: losses, norms and NLLs are doubles, the
// divergence message's bytes and every count are small integers): N losses, N gradient norms,
// nll, nll_fp32, divergence, the message's length and its bytes.
void pack(const RolloutTrace& t, std::vector<double>& out) {
  out.insert(out.end(), t.loss.begin(), t.loss.end());
  out.insert(out.end(), t.grad_norm.begin(), t.grad_norm.end());
  out.insert(out.end(), {t.nll, t.nll_fp32, t.divergence, double(t.diverged.size())});
  for (unsigned char ch : t.diverged) out.push_back(double(ch));
}

RolloutTrace unpack(const double*& p, size_t n) {
  RolloutTrace t;
  t.loss.assign(p, p + n), p += n;
  t.grad_norm.assign(p, p + n), p += n;
  t.nll = p[0], t.nll_fp32 = p[1], t.divergence = p[2];
  const size_t len = size_t(p[3]);
  p += 4;
  for (size_t i = 0; i < len; ++i) t.diverged.push_back(char(int(p[i])));
  p += len;
  return t;
}

// run_rollouts' stages, as FidelityRun's:
//   check    the request's counts and the run directory;
//   plan     the recipes (each loaded once, the stress applied), the checkpoints, the data;
//   execute  this rank's (checkpoint, order) pairs, each rollout alone (dist::Solo);
//   gather   every rank's traces to every rank (under mpirun).
class RolloutRun {
 public:
  explicit RolloutRun(const RolloutRequest& r) : req(r) {}
  void check() const;
  void plan();
  void execute();
  RolloutResult gather();

 private:
  EvalSource source(const std::string& recipe, const fs::path& checkpoint) const;
  void apply_stress(EvalSource& s) const;
  bool mine(size_t c, int o) const { return (c * size_t(req.orders) + size_t(o)) % size_t(nproc) == size_t(me); }
  RolloutTrace rollout(size_t r, int order, const Checkpoint& ck,
                       const std::vector<float>* fp32_final, std::vector<float>* final_params);

  const RolloutRequest& req;
  const std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  std::map<int64_t, fs::path> by_step;
  RolloutResult res;
  std::vector<EvalSource> sources;  // per recipe, on the newest checkpoint (config, recipe, plans)
  TokenData data;
  std::vector<int64_t> heldout;     // starts of the held-out windows
  const int me = dist::rank(), nproc = dist::size();
};

void RolloutRun::check() const {
  check_rollout_request(req);
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

// The stress on one recipe's config (the same for fp32 and every recipe): the peak learning rate
// scaled, the warmup dropped, fewer sequences per step; the recipe checked against the changed
// batch (RHT and Hadamard token counts).
void RolloutRun::apply_stress(EvalSource& s) const {
  const RolloutStress& st = req.stress;
  TrainConfig& tc = s.cfg.train;
  tc.lr *= st.lr_scale;
  if (st.no_warmup) tc.warmup_steps = 0;
  if (st.batch_size > 0) {
    if (st.batch_size > tc.batch_size)
      throw UserError("rollout: --batch-size " + std::to_string(st.batch_size) + " is more than the run's " +
                      "train.batch_size = " + std::to_string(tc.batch_size) +
                      " (the stress is fewer tokens per step)");
    if (tc.micro_batch_size > 0 && st.batch_size % tc.micro_batch_size != 0)
      throw UserError("rollout: --batch-size " + std::to_string(st.batch_size) +
                      " is not a multiple of the run's train.micro_batch_size = " +
                      std::to_string(tc.micro_batch_size));
    tc.batch_size = st.batch_size;
    s.plans = check_recipe_fits(s.recipe, s.cfg);
  }
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
  const int run_batch = sources[0].cfg.train.batch_size;
  for (EvalSource& s : sources) apply_stress(s);
  // A rollout continues the run's schedule: steps s + 1 .. s + N must lie within train.steps.
  const int64_t last = sources[0].cfg.train.steps;
  std::map<int64_t, fs::path> fits;
  for (const auto& [st, f] : by_step)
    if (st + req.length <= last) fits.emplace(st, f);
  if (req.steps.empty() && fits.empty())
    throw UserError("rollout: no checkpoint of run " + req.run.string() + " leaves " +
                    std::to_string(req.length) + " steps before its train.steps = " + std::to_string(last) +
                    " (a rollout continues the run's learning-rate schedule); use a shorter --length, or "
                    "keep earlier checkpoints: train --save-every N --keep-checkpoints M");
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
  data = load_eval_data(sources[0], spec, req.quiet || me > 0);  // one rank tells about the data
  res.windows = req.windows > 0 ? req.windows : cfg.eval.windows;
  heldout = heldout_windows(int64_t(data.heldout.size()), cfg.train.seq_len, res.windows);
  if (heldout.empty()) throw UserError("rollout: the run's held-out split holds no window of seq_len + 1 tokens");
  res.windows = int(heldout.size());
  res.length = req.length;
  res.orders = req.orders;
  res.seed = req.seed;
  res.machine = prof::cpu_model_name() + ", " + std::to_string(omp_get_max_threads()) + " threads" +
                (nproc > 1 ? ", " + std::to_string(nproc) + " processes" : "");
  res.stress = req.stress;
  if (res.stress.batch_size == run_batch) res.stress.batch_size = 0;  // the run's own: no stress
  res.stability = req.stability;
  res.resamples = req.resamples;
  res.bootstrap_seed = req.bootstrap_seed;
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
  at.checkpoint = by_step.at(ck.step).string();  // the file its errors name
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
  t.grad_norm.assign(size_t(req.length), kNaN);
  for (int i = 0; i < req.length && t.diverged.empty(); ++i) {
    const int step = int(ck.step) + 1 + i;
    const StepResult sr = train_step(*model, opt, sampler, cfg, s.recipe, step, in, tg);
    if (!sr.diverged.empty()) t.diverged = "step " + std::to_string(step) + ": " + sr.diverged;
    else t.loss[size_t(i)] = sr.loss, t.grad_norm[size_t(i)] = sr.grad_norm;
  }
  // The end: held-out NLL (quantized inference, policy current; fp32 unquantized), divergence.
  // Weights that trained to the end with finite steps can still give a non-finite held-out
  // evaluation (a stress's blown-up weights): that rollout counts as diverged there.
  t.nll = kNaN, t.nll_fp32 = kNaN, t.divergence = kNaN;
  if (t.diverged.empty()) {
    const std::string after = "held-out evaluation after step " + std::to_string(ck.step + req.length) + ": ";
    try {
      t.nll_fp32 = heldout_nll(*model, data.heldout, heldout, tc.seq_len, tc.micro(), false);
      t.nll = s.recipe.mode == LinearMode::FP32
                  ? t.nll_fp32
                  : heldout_nll(*model, data.heldout, heldout, tc.seq_len, tc.micro(), true);
      if (!std::isfinite(t.nll) || !std::isfinite(t.nll_fp32)) t.diverged = after + "non-finite NLL";
    } catch (const NonFiniteError& e) {
      t.diverged = after + "non-finite tensor (" + e.what() + ")";
    }
    if (!t.diverged.empty()) t.nll = kNaN, t.nll_fp32 = kNaN;
    else if (fp32_final) t.divergence = distance(model->params(), *fp32_final) / distance(*fp32_final, ck.params);
  }
  if (final_params) *final_params = model->params();
  if (!req.quiet)
    std::fprintf(stderr, "rollout%s: checkpoint %lld, order %d, %-22s final loss %.4f, NLL %.4f%s (%.0f s)\n",
                 nproc > 1 ? (" rank " + std::to_string(me)).c_str() : "", static_cast<long long>(ck.step),
                 order, res.recipes[r].c_str(), t.loss.back(), t.nll,
                 t.diverged.empty() ? "" : (", diverged at " + t.diverged).c_str(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return t;
}

// This rank's (checkpoint, order) pairs: fp32, then every recipe. Each rank trains alone
// (dist::Solo): a rollout is one process's work, whatever the process count. An error on one
// rank (a checkpoint it cannot read) would leave the others waiting in the gather: under
// mpirun it ends every process (exit status 2, the message naming it).
void RolloutRun::execute() {
  dist::Solo solo;
  try {
  for (size_t c = 0; c < res.steps.size(); ++c) {
    bool any = false;
    for (int o = 0; o < req.orders; ++o) any = any || mine(c, o);
    if (!any) continue;
    const Checkpoint ck = load_checkpoint(by_step.at(res.steps[c]));
    for (int o = 0; o < req.orders; ++o) {
      if (!mine(c, o)) continue;  // another rank's
      std::vector<float> fp32_final;
      res.traces[0][c][size_t(o)] = rollout(0, o, ck, nullptr, &fp32_final);
      // fp32 against itself: its own final weights, so the divergence is exactly 0 when finite.
      res.traces[0][c][size_t(o)].divergence = res.traces[0][c][size_t(o)].diverged.empty() ? 0.0 : kNaN;
      for (size_t r = 1; r < res.recipes.size(); ++r)
        res.traces[r][c][size_t(o)] = rollout(r, o, ck, &fp32_final, nullptr);
    }
  }
  } catch (const std::exception& e) {
    if (nproc == 1) throw;
    dist::abort_all(std::string("rollout: ") + e.what(), 2);
  }
}

// Every rank's traces to every rank: each rank packs its pairs' traces (pair order, then
// recipe order), the packed lengths are gathered first, then the traces padded to the longest.
RolloutResult RolloutRun::gather() {
  if (nproc == 1) return res;
  const size_t C = res.steps.size(), O = size_t(req.orders), R = res.recipes.size(), N = size_t(req.length);
  std::vector<double> packed;
  for (size_t c = 0; c < C; ++c)
    for (size_t o = 0; o < O; ++o)
      if (mine(c, int(o)))
        for (size_t r = 0; r < R; ++r) pack(res.traces[r][c][o], packed);
  std::vector<double> lengths(static_cast<size_t>(nproc));
  const double my_length = double(packed.size());
  dist::allgather(&my_length, 1, lengths.data());
  const size_t longest = size_t(*std::max_element(lengths.begin(), lengths.end()));
  packed.resize(longest, 0.0);
  std::vector<double> all(longest * size_t(nproc));
  dist::allgather(packed.data(), int64_t(longest), all.data());
  std::vector<const double*> at(static_cast<size_t>(nproc));
  for (size_t p = 0; p < size_t(nproc); ++p) at[p] = all.data() + p * longest;
  for (size_t c = 0; c < C; ++c)
    for (size_t o = 0; o < O; ++o) {
      const double*& p = at[(c * O + o) % size_t(nproc)];
      for (size_t r = 0; r < R; ++r) res.traces[r][c][o] = unpack(p, N);
    }
  return res;
}
}  // namespace

static std::string g_text(double v) {  // %g: "0.1", "nan", "1e+06"
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

void check_stability(const RolloutStability& st) {
  if (!(st.spike_threshold > 0) || !std::isfinite(st.spike_threshold))
    throw UserError("rollout: --spike-threshold must be a finite number of nats above 0, got " +
                    g_text(st.spike_threshold));
  if (!(st.grad_norm_limit > 0) || !std::isfinite(st.grad_norm_limit))
    throw UserError("rollout: --grad-norm-limit must be a finite number above 0, got " + g_text(st.grad_norm_limit));
}

void check_rollout_request(const RolloutRequest& req) {
  if (!(req.stress.lr_scale > 0) || !std::isfinite(req.stress.lr_scale))
    throw UserError("rollout: --lr-scale must be a finite number above 0, got " + g_text(req.stress.lr_scale));
  if (req.stress.batch_size < 0)
    throw UserError("rollout: --batch-size must be at least 1, got " + std::to_string(req.stress.batch_size));
  check_stability(req.stability);
}

RolloutResult run_rollouts(const RolloutRequest& req) {
  RolloutRun run(req);
  run.check();
  run.plan();
  run.execute();
  return run.gather();
}

}  // namespace fp4
