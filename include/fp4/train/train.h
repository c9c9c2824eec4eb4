// Training: the optimiser, the LR schedule, one training step (train_step), the checks of a
// run before anything is prepared (validate_run) and the run itself (train).
#pragma once
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fp4/train/checkpoint.h"
#include "fp4/nn/run_config.h"
#include "fp4/data/data.h"
#include "fp4/dist/dist.h"
#include "fp4/nn/layers.h"
#include "fp4/nn/model.h"
#include "fp4/recipe/recipe.h"

namespace fp4 {

/// Warmup-stable-decay LR at 1-based step t of `steps`: linear warmup from lr/warmup to lr
/// over warmup_steps, constant, then linear decay over the final ceil(decay_fraction·steps)
/// steps reaching min_lr_ratio·lr at the last step.
double wsd_lr(const TrainConfig& c, int step);

/// Global L2 norm of g[0..n) FP32: sqrt (double) of nn::detail::sum_squares (FP32 squares
/// summed in the canonical order of fp4/nn/layers.h: FP32 within chunks of 1024, FP64
/// beyond, rescaled by a power of two where FP32 would overflow; it does not depend on
/// thread count or SIMD target). If max_norm > 0 and the norm is finite and exceeds it,
/// scales g by float(max_norm / norm) (nn::detail::scale_inplace; that factor is an FP32
/// subnormal, with fewer bits, only when norm > 2^126·max_norm). Returns the norm before
/// clipping: finite for every finite g (at most sqrt(n)·FLT_MAX; e.g. 128 entries of 1e19
/// give 1.1314e20, clipped to max_norm 2 as 0.17678 each), +inf if g has a ±Inf, NaN if it
/// has a NaN; g is then left as it is (the trainer skips the step). Throws nothing.
double clip_grad_norm(float* g, int64_t n, double max_norm);

namespace detail {
/// Scalar twin of clip_grad_norm (nn::detail::sum_squares_ref, scale_inplace_ref): same
/// result bit for bit.
double clip_grad_norm_ref(float* g, int64_t n, double max_norm);
}  // namespace detail

/// AdamW (decoupled weight decay, bias-corrected moments) over a flat parameter buffer;
/// parameters whose ParamInfo::weight_decay is false (norms) get no decay.
class AdamW {
 public:
  AdamW(int64_t n, const TrainConfig& c) : m_(n, 0.f), v_(n, 0.f), c_(c) {}
  /// One update at 1-based step t with learning rate lr, over each parameter range of
  /// `infos` (params, grads [n] FP32): nn::detail::adamw_update with coefficients
  /// β1, β2, 1 − β (FP32), bias corrections 1 − β^t (double, rounded to FP32), lr, eps and
  /// weight_decay (0 where ParamInfo::weight_decay is false). Elementwise, so independent of
  /// thread count and SIMD target. Throws nothing.
  void step(float* params, const float* grads, const std::vector<nn::ParamInfo>& infos,
            double lr, int t);
  /// Scalar twin of step (nn::detail::adamw_update_ref): same bits, for tests and benchmarks.
  void step_ref(float* params, const float* grads, const std::vector<nn::ParamInfo>& infos,
                double lr, int t);
  /// First and second moments [n] (Model::params() layout), for checkpoints; resizing them
  /// is the caller's error.
  std::vector<float>& m() { return m_; }
  std::vector<float>& v() { return v_; }
  const std::vector<float>& m() const { return m_; }
  const std::vector<float>& v() const { return v_; }

 private:
  nn::detail::AdamWCoeffs coeffs(double lr, int t) const;
  std::vector<float> m_, v_;
  TrainConfig c_;
};

/// Mean held-out NLL (nats/token) of the model over windows of seq_len + 1 tokens starting at
/// `starts`, processed `batch` at a time; quantize = apply the recipe's forward quantization
/// with the `current` inference policy (D = 1; fp4/eval/eval.h), else FP32 (policy `none`). The
/// trainer's val_nll_quant / heldout_nll_quant are this with quantize = true. A thin wrapper
/// of evaluate_nll; throws NonFiniteError if a quantizer meets NaN/Inf.
double heldout_nll(nn::Model& model, const TokenStream& tokens,
                   const std::vector<int64_t>& starts, int seq_len, int batch, bool quantize);

/// Check that a recipe can run on a config: high_precision.blocks and .final_blocks inside the
/// model, every [[override]]'s blocks / final_blocks inside it and changing at least one linear
/// (resolve_linear_plans over nn::Model::linear_sites(cfg.model): no model is built), tokens
/// per micro-batch (train.micro_batch_size × train.seq_len) a multiple of 16 when an FP4
/// linear uses the RHT. Throws fp4::UserError naming the recipe file and the key (e.g.
/// `override[0].final_blocks`). Returns the plans it resolved, one per linear in
/// nn::Model::linear_sites order: a run resolves them once, here (resolve_run, validate_run,
/// or train() itself), and builds its model from them.
ResolvedLinears check_recipe_fits(const Recipe& recipe, const RunConfig& cfg);

/// The start-of-run description of a recipe on a model: "recipe NAME (m0,m1,... per block)"
/// with each block's linear mode (modes joined by '+' where overrides mix them), then one line
/// per [[override]]: "  override[i] <describe()> -> n linears: layers.7.mixer.down_proj ...".
/// Throws what resolve_linear_plans throws.
std::string describe_linear_plans(const Recipe& recipe, const nn::Model& model);

/// The quantizer paths of a run that are slower than the fused SIMD kernels, as one line for
/// its warning and summary.json's "slow_path": "" when every FP4 operand of every linear takes
/// a SIMD kernel; else each distinct path (fp4::quant_fast_slow_path, or
/// fp4::pack_fast_slow_path for probe-matched linears) followed by the GEMM operands that take
/// it, e.g. "scalar reference quantizer (scale format ue4m3 has no SIMD kernel): fprop x,
/// fprop w, ...", several joined by "; " (docs/performance.md "Block sizes and the
/// quantizer's fast path"). Throws nothing.
std::string slow_quantizer_paths(const ResolvedLinears& plans);

struct TrainOptions {
  std::filesystem::path out_dir;   ///< run directory (created; must not hold a previous run)
  std::string config_name = "run";
  bool quiet = false;              ///< no progress lines (tests)
  /// Checkpoint <out_dir>/checkpoints/step_%08d.safetensors every N-th step (0: none but the
  /// final one, which is always written).
  int save_every = 0;
  int keep_checkpoints = 3;        ///< keep the newest K checkpoints (>= 1), delete older ones
  /// Also checkpoint these steps, and never prune their checkpoints (they do not count
  /// against keep_checkpoints): e.g. off the amax refresh grid for the fidelity panel
  /// (docs/compare.md "Checkpoints", docs/fidelity.md "References"). Steps above the run's are
  /// never reached.
  std::vector<int64_t> keep_steps;
  /// metrics.jsonl gets a line every N-th step, and always at evaluation, telemetry and the
  /// final step.
  int log_every = 1;
  /// Store the held amax caches (TensorReference of every Linear and role) in checkpoints.
  /// Without them a resumed run starts with empty caches and refreshes them at its first
  /// step, so with amax_interval D > 1 it is no longer bit-exact with an uninterrupted run.
  bool save_amax = true;
  /// Continue the run in out_dir from this checkpoint of it (load_newest_checkpoint), which
  /// must hold cfg and recipe exactly (config_toml, recipe_toml) and the run's data
  /// (data_key, tokenizer.model): metrics.jsonl is cut back to lines of steps <= its step,
  /// newer (unloadable) checkpoints are renamed *.corrupt, and training continues to
  /// cfg.train.steps bit for bit as if never stopped. Throws fp4::UserError on a mismatch.
  const Checkpoint* resume_from = nullptr;
  /// Testing hook: return right after this step (its metrics line and any checkpoint due at it
  /// written), as if the process had been killed; no summary.json. 0 = off.
  int stop_after = 0;
  /// Stop request, set asynchronously (a signal handler: fp4train's StopOnSignal). Read after
  /// each step, once its metrics line is written: if nonzero and the step is not the last,
  /// the step's checkpoint is written (if not already due) and train() returns with
  /// TrainSummary::stopped and stop_signal = the flag's value; no summary.json. Resuming from
  /// that checkpoint gives the uninterrupted run's bits. Null = never.
  const volatile std::sig_atomic_t* stop_signal = nullptr;
  /// FP32 GEMM rate (GFLOP/s) that model FLOPs utilization is reported against
  /// (fp4/gemm/machine.h fp32_peak_gflops); 0 = no MFU in progress lines, metrics or summary.
  double peak_gflops = 0;
};

struct TrainSummary {
  int steps = 0;
  /// Mean training loss over the last final_window_steps steps (train.final_window; by
  /// default the last 10% of the steps).
  double final_window_loss = 0;
  int final_window_steps = 0;      ///< TrainConfig::final_window_steps() of the run
  double heldout_nll = 0;          ///< final held-out NLL, unquantized (FP32 inference)
  double heldout_nll_quant = 0;    ///< final held-out NLL, recipe's quantized inference, policy `current`
  double tokens_per_s = 0;         ///< training throughput over the whole run (excl. evaluation)
  /// Model FLOPs utilization over the whole run: Model::flops_per_token · tokens_per_s /
  /// TrainOptions::peak_gflops (0 when no peak was given).
  double mfu = 0;
  double first_loss = 0;
  std::vector<double> losses;      ///< per-step training loss (steps 1..steps, also across a resume)
  int resumed_from = 0;            ///< checkpoint step the run continued from (0: fresh start)
  bool stopped = false;            ///< returned early: TrainOptions::stop_after or stop_signal
  int stop_signal = 0;             ///< the stop_signal value that stopped the run (0: none)
  std::filesystem::path checkpoint;  ///< when stopped by stop_signal: the checkpoint written
};

/// Buffers of a training step with several micro-batches (the gradient tree's node sums,
/// dist::TreeAccumulator), reused across steps so that steady-state steps allocate nothing.
struct StepBuffers {
  std::unique_ptr<dist::TreeAccumulator> tree;
  int tree_n = 0, tree_a = -1;
  int64_t tree_len = -1;
  std::vector<double> losses, all_losses, tel;
};

/// Outcome of one optimizer step.
struct StepResult {
  double loss = 0;       ///< mean training cross-entropy of the batch (nats/token)
  double grad_norm = 0;  ///< global gradient norm before clipping
  double lr = 0;         ///< learning rate applied
  bool telemetry = false;  ///< numerics telemetry was collected (Linear::telemetry())
  /// Non-empty if the step hit a non-finite loss, tensor or gradient norm (what, without the
  /// step); then the optimizer update was NOT applied.
  std::string diverged;
  /// The divergence was met in one of this process's micro-batches while other data-parallel
  /// ranks may be waiting in a collective: train() ends the whole run (dist::abort_all).
  bool diverged_on_this_rank = false;
};

/// Under mpirun: throws fp4::UserError unless the step's micro-batches
/// (train.batch_size / train.micro_batch_size) spread evenly over the dist::size()
/// processes; `resume` words the advice for a resumed run (which keeps its micro-batches).
void check_process_count(const RunConfig& cfg, bool resume = false);

/// The data-parallel agreement on activation and gradient references under `recipe`
/// (Recipe::amax_ranks) over the MPI ranks of this run; null for one process.
std::unique_ptr<nn::RankReferences> rank_references(const Recipe& recipe);

/// One training step as train() runs it: the step's global batch (train.batch_size
/// sequences) from `sampler` into inputs/targets (each batch_size·seq_len), then per
/// micro-batch of train.micro_batch_size sequences (the model is built for that many) held by
/// this rank: zero_grad, forward, backward; the micro-batch gradients are summed in the fixed
/// tree of fp4/dist/dist.h over all ranks and divided by their count (dist::reduce_mean); the loss
/// is the mean of the micro-batch losses (double, micro-batch order). Then global-norm
/// clipping and AdamW at the WSD learning rate of 1-based `step`, identical on every rank.
/// With one micro-batch and one process this is zero_grad, forward, backward, clip, AdamW.
/// Micro-batch m keys its SR bits (StepContext::micro); held references are sampled on the
/// first micro-batch (docs/recipes.md "Micro-batches and data parallelism"); `ranks` agrees
/// on references across processes (rank_references). Telemetry on step 1 and every
/// cfg.telemetry_interval-th step of an FP4 recipe, the worst over micro-batches and ranks.
/// Timed by component when profiling is on (fp4/base/profile.h). Throws fp4::UserError if the
/// micro-batch count is not a multiple of the process count.
StepResult train_step(nn::Model& model, AdamW& optimizer, BatchSampler& sampler,
                      const RunConfig& cfg, const Recipe& recipe, int step,
                      std::vector<int32_t>& inputs, std::vector<int32_t>& targets,
                      StepBuffers& buffers, nn::RankReferences* ranks = nullptr);
/// The same with buffers of the calling thread (kept between calls) and, under mpirun,
/// rank_references(recipe).
StepResult train_step(nn::Model& model, AdamW& optimizer, BatchSampler& sampler,
                      const RunConfig& cfg, const Recipe& recipe, int step,
                      std::vector<int32_t>& inputs, std::vector<int32_t>& targets);

class ValidatedRun;
struct ResolvedRun;
/// The checks of a train run that need neither data nor a model, made before the slow work
/// (train --resume calls it before it prepares data): check_recipe_fits(recipe, cfg), then
/// check_process_count(cfg, resume). Returns the pair as checked, with the plans
/// check_recipe_fits resolved, for train(const ValidatedRun&, ...), which does not repeat
/// these checks. Throws fp4::UserError as those two do, with their messages.
ValidatedRun validate_run(const RunConfig& cfg, const Recipe& recipe, bool resume = false);
/// The same for a run resolve_run has resolved (fp4train train and compare): its plans are
/// checked already, so only check_process_count(run.config, resume) remains. Throws
/// fp4::UserError as check_process_count does.
ValidatedRun validate_run(const ResolvedRun& run, bool resume = false);

/// A run config and recipe that passed validate_run, with the recipe's per-linear plans.
/// Only validate_run (and with_seed) makes one, and it holds its own copies, so what was
/// checked is what train() runs.
class ValidatedRun {
 public:
  const RunConfig& config() const { return cfg_; }
  const Recipe& recipe() const { return recipe_; }
  /// The recipe's plans on config().model (check_recipe_fits), from which train() builds
  /// the model: they are not resolved again.
  const ResolvedLinears& plans() const { return plans_; }
  /// The same run with train.seed = seed: no check of validate_run depends on the seed, so
  /// one validation serves every seed of a recipe (fp4train compare). Throws nothing but
  /// std::bad_alloc.
  ValidatedRun with_seed(uint64_t seed) const;

 private:
  friend ValidatedRun validate_run(const RunConfig& cfg, const Recipe& recipe, bool resume);
  friend ValidatedRun validate_run(const ResolvedRun& run, bool resume);
  ValidatedRun(const RunConfig& cfg, const Recipe& recipe, ResolvedLinears plans)
      : cfg_(cfg), recipe_(recipe), plans_(std::move(plans)) {}
  RunConfig cfg_;
  Recipe recipe_;
  ResolvedLinears plans_;
};

/// Train `cfg` with `recipe` on `data`, writing metrics.jsonl, config.toml, recipe.toml,
/// tokenizer.model, checkpoints (see TrainOptions) and, on success, summary.json into
/// opt.out_dir. With opt.resume_from, continues the run in opt.out_dir bit for bit. Throws
/// fp4::UserError on a non-finite loss (message names the step) after writing error.txt;
/// metrics up to that step are kept. Under mpirun (fp4/dist/dist.h) the ranks train together and
/// rank 0 alone writes files; a non-finite loss or tensor met in one rank's micro-batches
/// writes error.txt from that rank and ends every process (dist::abort_all, status 2)
/// instead of throwing. Any other failure once opt.out_dir exists (e.g. a GEMM
/// error at step 1) also writes error.txt, "failed before the first step (recipe R): cause"
/// or "failed in step N of S (recipe R): cause" (RunError::Failed), and is rethrown.
/// The run header and summary.json ("compute") name the CPU, the FP32 and BF16 GEMM
/// implementations and the SIMD target (fp4/gemm/gemm.h, fp4/numerics/quant_fast.h).
/// Before any file is written it checks, in this order: the tokenizer's vocabulary against
/// model.vocab_size, check_recipe_fits, the held-out split (at least seq_len + 1 tokens), the
/// options, check_process_count; each throws fp4::UserError and leaves no run directory.
TrainSummary train(const RunConfig& cfg, const Recipe& recipe, const TokenData& data,
                   const TrainOptions& opt);
/// The same for a run validate_run has checked: run.config() with run.recipe(), without
/// repeating check_recipe_fits and check_process_count (the checks of data and options are
/// made as above). What the CLI calls, having validated before it prepared the data.
TrainSummary train(const ValidatedRun& run, const TokenData& data, const TrainOptions& opt);

}  // namespace fp4
