// The fidelity panel (`fp4train fidelity`, docs/fidelity.md): on the same weights and the same
// batches, how far each recipe's quantized forward and backward are from the exact FP32
// computation. Differences between recipes are paired and deterministic: the chaotic drift of
// training trajectories, which hides FP4-vs-FP4 effects in a loss study, never enters.
//
// Per checkpoint c of a reference run and batch k (a training-distribution batch of the run's
// micro-batch size), the exact side is an FP32 forward and backward (loss L*, gradient g* of every
// parameter); the recipe side is the same with the recipe's linears, R times with different
// stochastic-rounding streams (draw d keys its SR bits with seed + d). A recipe that holds its
// tensor references (amax_interval D > 1) is evaluated with the references it would hold at step
// s + 1: sampled at the most recent refresh step t_r on the weights after t_r − 1 steps and the
// first micro-batch of step t_r of the reference run (docs/fidelity.md "References").
//
// The statistics (this header's free functions) are the contract's; FidelityPanel holds the
// per-(checkpoint, batch) values, fidelity_report writes fidelity.json and fidelity.md.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace fp4 {

/// Sums over coordinates of the R gradient draws ĝ_d of one recipe against the exact g*, in
/// double: what every per-(checkpoint, batch) metric is computed from.
struct DrawMoments {
  int draws = 0;            ///< R
  double ref_sq = 0;        ///< ‖g*‖²
  std::vector<double> err_sq;   ///< ‖ĝ_d − g*‖², one per draw
  std::vector<double> dot;      ///< ⟨ĝ_d, g*⟩
  std::vector<double> est_sq;   ///< ‖ĝ_d‖²
  double mean_err_sq = 0;   ///< ‖ḡ − g*‖², ḡ = mean of the draws
  double spread_sq = 0;     ///< Σ_d ‖ĝ_d − ḡ‖²
};

/// The moments of `draws` gradient estimates est[d] (each [n] FP32) against ref [n] (FP32),
/// over the index set [0, n), accumulated in double in index order (so any thread count gives
/// the same value: this function is sequential). Throws std::invalid_argument if est is empty
/// or an estimate is null.
DrawMoments draw_moments(const std::vector<const float*>& est, const float* ref, int64_t n);
/// The same over several disjoint ranges [begin, end) (e.g. every linear weight of a model).
DrawMoments draw_moments(const std::vector<const float*>& est, const float* ref,
                         const std::vector<std::pair<int64_t, int64_t>>& ranges);

/// The metrics of one (checkpoint, batch) and recipe, from its DrawMoments (docs/fidelity.md
/// "Metrics"): relative error mean_d ‖ĝ_d − g*‖/‖g*‖; cosine mean_d ⟨ĝ_d, g*⟩/(‖ĝ_d‖‖g*‖);
/// gain mean_d ⟨ĝ_d, g*⟩/‖g*‖² (below 1: a shrunken gradient); mse mean_d ‖ĝ_d − g*‖²/‖g*‖²;
/// variance V/‖g*‖² with V = Σ_d ‖ĝ_d − ḡ‖²/(R − 1) (the per-draw variance, 0 when R = 1);
/// bias2 (‖ḡ − g*‖² − V/R)/‖g*‖², the finite-R unbiased squared bias of the mean gradient (it
/// may come out slightly negative when the bias is below the sampling noise of ḡ); bias2 +
/// variance = mse is an identity of these sample moments (up to rounding). With ‖g*‖ = 0 every ratio is NaN except a
/// cosine of NaN as well; callers skip such samples.
struct DrawMetrics {
  double rel_error = 0, cosine = 0, gain = 0, mse = 0, bias2 = 0, variance = 0;
};
DrawMetrics draw_metrics(const DrawMoments& m);

/// A mean with a 95% percentile interval.
struct Interval {
  double mean = 0, lo = 0, hi = 0;
};

/// Two-level bootstrap of the mean of x[c][k] (checkpoint c, batch k; the panel's rows all hold
/// K ≥ 1 values, a rollout set's may hold fewer where rollouts were left out): each of
/// `resamples` draws C checkpoint indices with replacement and, for each drawn checkpoint, as
/// many batch indices with replacement as its row holds, and takes the mean of the drawn
/// values; the interval is the 2.5% and 97.5% quantiles (Hyndman–Fan type 7). Indices come from
/// splitmix64(seed, i) with rejection sampling, so the interval is the same on every machine.
/// With one checkpoint only the batches are resampled. Throws std::invalid_argument for no
/// rows, a row of zero length, a non-finite value, or resamples < 1.
Interval bootstrap_two_level(const std::vector<std::vector<double>>& x, int resamples,
                             uint64_t seed);

/// Where a panel comes from and what it computes.
struct FidelityRequest {
  std::filesystem::path run;          ///< run directory whose checkpoints/ hold the steps
  std::vector<std::string> recipes;   ///< names (configs/recipes/) or .toml paths, ≥ 1
  std::vector<int64_t> steps;         ///< checkpoint steps; empty: `checkpoints` of them,
                                      ///< evenly spread over those the run holds
  int checkpoints = 5;
  int batches = 16;                   ///< K per checkpoint (the same batches at every checkpoint)
  /// Sequences per batch; 0: the run's micro-batch (train.micro_batch_size, else batch_size).
  /// Other sizes measure how the SGD-noise fraction scales with tokens per batch.
  int batch_size = 0;
  int draws = 4;                      ///< R per (checkpoint, batch) for recipes with SR
  uint64_t seed = 1;                  ///< batch sampler and SR streams
  int resamples = 2000;               ///< bootstrap resamples
  uint64_t bootstrap_seed = 20261204;
  /// Function-preserving outlier stress (docs/fidelity.md "Outlier stress"): channels c of every
  /// block's pre-mixer RMSNorm weight × stress_factor, and column c of each linear reading that
  /// norm's output (q/k/v_proj, up_proj, in_proj) ÷ stress_factor. 1: none. A power of two, so
  /// that the exact FP32 computation is unchanged bit for bit (checked per checkpoint); gradients
  /// are mapped back to the original parametrization before any metric.
  double stress_factor = 1;
  std::vector<int> stress_channels = {0};
  std::string data;                   ///< data path override (default: the run's data.path)
  /// "held": references as the recipe would hold them (needs the checkpoints of the refresh
  /// steps); "current": every reference measured on the panel's batch (D = 1 behaviour).
  std::string references = "held";
  std::filesystem::path claims;       ///< mechanism claims file (empty: none)
  std::filesystem::path out;          ///< directory for fidelity.json and fidelity.md
  bool quiet = false;                 ///< no progress lines on stderr
  /// Per-linear roles (docs/fidelity.md "Per-linear roles"): each linear's output Y, input
  /// gradient dX and weight gradient dW, local (its quantized GEMMs fed the exact X* and dY*)
  /// and end to end (the X and dY of the recipe's own pass). About triples a recipe's cost.
  bool linear_roles = false;
};

/// The per-linear role scopes, ROLE.FORM: Y (fprop output), dX (dgrad output), dW (wgrad
/// output), each local (fed the exact X* and dY*) or e2e (fed the recipe pass's X and dY).
inline constexpr const char* kLinearRoleScopes[6] = {"Y.local", "Y.e2e", "dX.local",
                                                     "dX.e2e", "dW.local", "dW.e2e"};

/// Per-(checkpoint, batch) values of one recipe: metric name → [checkpoint][batch].
struct FidelityRecipe {
  std::string name;
  bool has_sr = false;  ///< any operand rounded stochastically (else its draws are identical)
  /// "whole" (every parameter), "linears" (the weights of the quantized linears, i.e. their
  /// wgrad outputs dW) and each parameter by name → metric → [c][k]. With per-linear roles
  /// also kLinearRoleScopes (every linear's tensor of that role and form, concatenated) and
  /// "LINEAR:ROLE.FORM" for each linear (e.g. "layers.0.mixer.q_proj:dX.local").
  std::map<std::string, std::map<std::string, std::vector<std::vector<double>>>> scopes;
  /// Scale events per operand role ("x", "w", "dy", "dyt", "xt": fprop X and W, dgrad dY, wgrad
  /// dYᵀ and Xᵀ), from the quantizer telemetry (fp4/numerics/telemetry.h) of every FP4 linear
  /// on draw 0 of each (checkpoint, batch), averaged over linears and samples:
  /// saturated_blocks, zero_guard_blocks, zeroed_nonzeros (fractions), staleness (current amax /
  /// reference g; 1 under current references), e4m3_subnormal_blocks (fraction of nonzero
  /// blocks with a_b/g below 2^-15, whose scale T·a_b/g at T = 448 lies below E4M3's smallest
  /// normal 2^-6, resolved to whole log2 bins) and at_or_above_reference_blocks (a_b ≥ g, the
  /// bins at and above log2 0: the scale T·a_b/g reaches T, and E4M3 scales at T = 448 saturate
  /// for those above g; under current references only the blocks holding the amax). Empty for
  /// recipes without FP4 linears; the last two are absent under the MX rules (no g).
  std::map<std::string, std::map<std::string, double>> scale_events;
  /// The block-amax part of scale_events per FP4 linear (its name, e.g.
  /// "layers.1.mixer.down_proj") and operand role, over the same samples: the quantiles
  /// log2_ratio_q0.001 ... q0.999 of floor(log2(a_b/g)) over nonzero blocks,
  /// e4m3_subnormal_blocks, at_or_above_reference_blocks and zero_blocks. Roles without nonzero
  /// blocks are absent; empty in panels of earlier binaries.
  std::map<std::string, std::map<std::string, std::map<std::string, double>>> block_amax_by_linear;
};

struct FidelityPanel {
  std::string run, config_name;
  std::vector<int64_t> steps;
  int batches = 0, draws = 0, tokens_per_batch = 0;
  uint64_t seed = 0;
  std::vector<std::string> param_names;  ///< in Model::param_infos order
  /// With per-linear roles: the linears' names, in Model::linears order (empty without).
  std::vector<std::string> linear_names;
  std::vector<FidelityRecipe> recipes;
  /// Exact-side values per [c][k]: "loss" (L*), "grad_norm" (‖g*‖) and per checkpoint the SGD
  /// noise σ²_sgd(c) = Σ_k ‖g*_k − mean_k g*_k‖²/(K − 1) (needs K ≥ 2).
  std::vector<std::vector<double>> exact_loss, exact_grad_norm;
  std::vector<double> sgd_var;
  std::string references;  ///< FidelityRequest::references
  double stress_factor = 1;           ///< FidelityRequest::stress_factor
  std::vector<int> stress_channels;   ///< (empty without stress)
  /// With stress: the largest |L*(stressed) − L*| and |g*(stressed, mapped back) − g*| over the
  /// checkpoints' first batches (0 when the function is preserved bit for bit).
  double stress_loss_diff = 0, stress_grad_diff = 0;
  /// With stress and per-linear roles: the largest |difference| of every linear's exact Y, dX
  /// and dW (stressed, mapped back) from the unstressed ones on those batches (0 when preserved).
  double stress_roles_diff = 0;
  /// Per recipe (FidelityPanel::recipes order) and checkpoint: the step whose weights and batch
  /// gave the held references (the evaluation step s + 1 itself when they are current).
  std::vector<std::vector<int64_t>> refresh_steps;
  /// What the panel cannot show with the steps it evaluated, one sentence each: a recipe that
  /// holds its tensor scale (amax_interval D > 1) evaluated only at checkpoint steps that are
  /// multiples of D, each followed by a refresh step, so its staleness is not seen
  /// (docs/fidelity.md "Choosing the steps"). Printed on stderr by run_fidelity, written to
  /// fidelity.json ("warnings") and fidelity.md, read back by load_fidelity_panel.
  std::vector<std::string> warnings;
  double seconds = 0;
  std::string cpu;
  /// Loaded from fidelity.json (load_fidelity_panel): per-parameter scopes hold one mean per
  /// metric ([1][1]), not per-batch values.
  bool params_means_only = false;
  /// Loaded from fidelity.json: the bootstrap it was reported with (0: not recorded).
  int resamples = 0;
  uint64_t bootstrap_seed = 0;
};

/// Run the panel: load every requested checkpoint of req.run, draw the batches, compute the
/// exact and the quantized forward/backward, and collect the per-(checkpoint, batch) metrics:
/// rel_error, cosine, gain, mse, bias2, variance (scopes whole, linears and each parameter),
/// loss_penalty (L_r − L*, mean over draws; whole only), sgd_noise_fraction (mse·‖g*‖²/σ²_sgd)
/// and qnoise_to_grad (√(mean_d ‖ĝ_d − g*‖²)/‖g*‖, the reciprocal of the "FP4 All the Way"
/// ratio ‖g*‖/σ_q, which the report gives as grad_to_qnoise). Prints a
/// progress line per checkpoint on stderr unless req.quiet, and the panel's warnings
/// (FidelityPanel::warnings) before any pass, quiet or not. Results do not depend on the thread
/// count. Throws fp4::UserError (exit status 2 from the CLI) naming what is wrong, before any
/// pass: a run directory that is missing or holds no checkpoints, a requested step without a
/// checkpoint, a recipe that does not load or does not fit the model (check_recipe_fits: RHT
/// token counts, overrides), fewer than 2 batches, draws < 1 (< 2 for a recipe with SR), an
/// output directory that cannot be created, a bad claims file, references other than
/// held/current, and under "held" a missing refresh-step checkpoint (listing the steps needed)
/// or a recipe whose FP4 linears hold references of different intervals.
FidelityPanel run_fidelity(const FidelityRequest& req);

/// Read a panel back from the fidelity.json write_fidelity_report wrote (its "samples": the
/// per-(checkpoint, batch) values of the exact side and of every recipe's whole and linears
/// metrics; per-parameter figures come back as means only), so that the report and claims can be
/// redone without the passes (`fp4train fidelity --from FILE`). Throws fp4::UserError naming the
/// file and what is wrong: not JSON, another format, no samples, grids of the wrong shape.
FidelityPanel load_fidelity_panel(const std::filesystem::path& file);

/// Write req.out/fidelity.json and req.out/fidelity.md from `panel`: per recipe the whole,
/// linears and per-parameter metrics with two-level bootstrap intervals, per checkpoint means,
/// the contrasts (each recipe minus the first on rel_error, bias2, variance and loss_penalty,
/// and the claims of req.claims with verdicts; a claim naming a recipe the panel did not run is
/// skipped with a note on stderr), the panel's warnings, and in fidelity.md a closing
/// Definitions section (docs/fidelity.md "Reading the report"). Throws fp4::UserError on I/O
/// errors or a claims file that does not parse, names an unknown metric or key, or a scope the
/// panel lacks.
void write_fidelity_report(const FidelityPanel& panel, const FidelityRequest& req);

}  // namespace fp4
