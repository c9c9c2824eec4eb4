// Paired rollouts (`fp4train rollout`, docs/fidelity.md "Paired rollouts"): from shared
// checkpoints of a reference run, with its optimizer state, every recipe and `fp32` train the
// same N steps on exactly the same batches. The trajectories start identical, so over a short N
// the chaotic drift of training has not grown yet, and each recipe's gap to the fp32 rollout is
// its systematic effect through the training dynamics (bias that accumulates, held-reference
// staleness, SR averaging), which the one-step fidelity panel cannot see.
//
// Per checkpoint c (step s) of the run and batch order o: order 0 continues the run's own batch
// sampler from its saved position (the batches the run itself trained on next); order o > 0 draws
// batches from a sampler seeded by splitmix64(seed, o), the same for every recipe. Each rollout
// runs train_step for steps s + 1 .. s + N (the run's learning-rate schedule, AdamW state from
// the checkpoint, the recipe's SR keyed by the run seed and step), records the training loss of
// every step, and at the end the held-out NLL (the recipe's quantized inference, policy
// `current`, and unquantized, which isolates what training did to the weights) and the
// parameters' divergence from the fp32 rollout,
// ‖θ_r − θ_fp32‖ / ‖θ_fp32 − θ_s‖. A recipe's held tensor references start empty: they are
// sampled at the rollout's first step (its refresh step), whatever the reference run held.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "fp4/study/fidelity.h"  // Interval, bootstrap_two_level

namespace fp4 {

/// A stated stress for the stability probe (docs/fidelity.md "Stability stress"), applied alike
/// to the fp32 reference and every recipe: the run's schedule with its peak learning rate
/// scaled, optionally without warmup (the paper's 8B schedule shape: peak LR from step 1), and
/// fewer sequences per step. The default is no stress.
struct RolloutStress {
  double lr_scale = 1.0;  ///< train.lr × this (> 0): the WSD schedule's shape, a higher peak
  bool no_warmup = false; ///< train.warmup_steps = 0: the peak (× lr_scale) from step 1 on
  int batch_size = 0;     ///< sequences per step instead of train.batch_size (0: the run's)
  bool active() const { return lr_scale != 1.0 || no_warmup || batch_size != 0; }
};

/// What the stability tables count (docs/fidelity.md "Stability stress"), per rollout.
struct RolloutStability {
  /// A loss spike: a step whose training loss exceeds the fp32 rollout's on the same batch by
  /// more than this (nats).
  double spike_threshold = 0.1;
  /// A gradient-norm excursion: a step whose global gradient norm before clipping exceeds this
  /// (the paper's 8B count uses 1).
  double grad_norm_limit = 1.0;
};

/// What `fp4train rollout` computes.
struct RolloutRequest {
  std::filesystem::path run;         ///< run directory whose checkpoints/ hold the steps
  /// Names or .toml paths, ≥ 1; the fp32 reference rollout is always run first (a listed "fp32"
  /// runs again as a recipe, with gaps of exactly 0).
  std::vector<std::string> recipes;
  std::vector<int64_t> steps;        ///< checkpoint steps; empty: `checkpoints` spread over the run's
  int checkpoints = 3;
  int length = 20;                   ///< N optimizer steps per rollout
  int orders = 2;                    ///< batch orders per checkpoint (order 0: the run's own)
  uint64_t seed = 1;                 ///< batch orders o > 0
  int windows = 0;                   ///< held-out windows for the final NLL; 0: the run's eval.windows
  int resamples = 2000;              ///< two-level bootstrap (checkpoints, then orders)
  uint64_t bootstrap_seed = 20261206;
  std::string data;                  ///< data path override (default: the run's data.path)
  std::filesystem::path out;         ///< directory for rollout.json and rollout.md
  bool quiet = false;                ///< no progress lines on stderr
  RolloutStress stress;              ///< the stability probe's stress (default none)
  RolloutStability stability;        ///< the stability tables' thresholds
};

/// The name of the reference rollout (recipe fp32) in RolloutResult::recipes.
inline constexpr const char* kRolloutReference = "fp32 (reference)";

/// One rollout: a recipe from one checkpoint along one batch order.
struct RolloutTrace {
  std::vector<double> loss;  ///< training loss of steps s + 1 .. s + N (NaN after a divergence)
  double nll = 0;            ///< held-out NLL (nats/token) after the last step, the recipe's
                             ///< quantized inference (policy current; fp32: unquantized); NaN if diverged
  double nll_fp32 = 0;       ///< the same weights' held-out NLL with unquantized (FP32) inference
  /// Global gradient norm before clipping of steps s + 1 .. s + N (NaN from a divergence on);
  /// empty in rollout.json files written before it was recorded.
  std::vector<double> grad_norm;
  double divergence = 0;     ///< ‖θ_r − θ_fp32‖ / ‖θ_fp32 − θ_s‖ after the last step
  std::string diverged;      ///< non-empty: the step and what was non-finite
};

/// Every rollout of a request: traces[r][c][o], recipe 0 being the fp32 reference.
struct RolloutResult {
  std::filesystem::path run;
  std::vector<int64_t> steps;         ///< the checkpoints' steps, ascending
  std::vector<std::string> recipes;   ///< kRolloutReference, then the request's, as named there
  int length = 0, orders = 0, windows = 0;
  uint64_t seed = 0;
  std::string machine;                ///< CPU, threads, processes (provenance)
  RolloutStress stress;               ///< the stress the rollouts ran under
  /// The report's bootstrap (RolloutRequest::resamples, bootstrap_seed) as the rollouts were
  /// reported; 0 in files of earlier versions, whose reports used the request's.
  int resamples = 0;
  uint64_t bootstrap_seed = 0;
  RolloutStability stability;         ///< thresholds of the stability tables
  std::vector<std::vector<std::vector<RolloutTrace>>> traces;
  /// Whether the traces hold gradient norms (rollout.json files written before they were
  /// recorded do not: their reports have no stability tables). load_rollouts makes sure all or
  /// none do.
  bool has_grad_norms() const {
    return !traces.empty() && !traces[0].empty() && !traces[0][0].empty() && !traces[0][0][0].grad_norm.empty();
  }
};

/// The checks of `req` that need no run (the stress values and the stability thresholds), so
/// that a bad option costs nothing: run_rollouts makes them first. Throws fp4::UserError naming
/// the option and its value.
void check_rollout_request(const RolloutRequest& req);
/// The stability thresholds alone (also those of a `--from` rebuild): finite and above 0.
/// Throws fp4::UserError naming the option and its value.
void check_stability(const RolloutStability& st);

/// Run the rollouts of `req`: validates it (steps the run holds, length ≥ 1, orders ≥ 1,
/// recipes that fit the run's model, a stress the run's config accepts), loads each checkpoint
/// once, and runs fp32 and every recipe for every order. Under mpirun the (checkpoint, order)
/// pairs are spread over the ranks: pair k = c·orders + o is rank k mod P's, which trains its
/// rollouts alone (dist::Solo), and every rank ends with every trace (gathered). Progress on
/// stderr unless req.quiet. Bits do not depend on the thread or process count (train_step's
/// contract; the same code on the same inputs on whichever rank). Throws fp4::UserError naming
/// what is wrong: no checkpoints, a missing step, a bad count, a recipe that does not load or
/// fit, a stress batch size the micro-batches do not divide.
RolloutResult run_rollouts(const RolloutRequest& req);

/// Write rollout.json (every trace; `load_rollouts` reads it back; skipped when `json` is false)
/// and rollout.md (the gaps to fp32 with two-level bootstrap intervals over checkpoints and
/// orders with req.resamples and req.bootstrap_seed, the gap by step, paired contrasts between
/// the recipes, the stability tables) into req.out, created. Throws fp4::UserError if the
/// directory cannot be written.
void write_rollout_report(const RolloutResult& r, const RolloutRequest& req, bool json = true);

/// Read a rollout.json back (for `rollout --from`). Throws fp4::UserError naming the file and
/// the field that is missing or malformed.
RolloutResult load_rollouts(const std::filesystem::path& file);

}  // namespace fp4
