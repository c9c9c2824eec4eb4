// Where the time of a training step goes (`fp4train profile`, docs/performance.md "Where the
// time goes: `fp4train profile`"): training steps of a config and recipe run as train runs
// them, with the per-component timing of fp4/base/profile.h on, and what the printout needs
// from the model. Writes no run directory.
#pragma once
#include <cstdint>
#include <vector>

#include "fp4/base/profile.h"
#include "fp4/data/data.h"
#include "fp4/nn/run_config.h"
#include "fp4/nn/model.h"
#include "fp4/recipe/recipe.h"
#include "fp4/train/resolved_run.h"

namespace fp4 {

/// How many steps profile_steps runs.
struct ProfileOptions {
  int steps = 5;   ///< measured steps, >= 1
  int warmup = 2;  ///< untimed steps first (JIT, page faults, step 1's telemetry), >= 0
};

/// The measured steps of profile_steps and the model's figures. Times are wall-clock
/// (std::chrono::steady_clock) of this process; under mpirun, rank 0's are what it prints.
struct ProfileResult {
  std::vector<double> step_ms;  ///< each measured step's time, ms, in step order (steps)
  double mean_step_ms = 0;      ///< their mean, ms
  double median_step_ms = 0;    ///< their median (mean of the middle two for an even count), ms
  double min_step_ms = 0, max_step_ms = 0;
  int telemetry_steps = 0;  ///< measured steps that collected numerics telemetry
  /// Per component (prof::Cat), summed over the measured steps: exclusive wall seconds,
  /// GEMM FLOPs, regions opened.
  prof::Totals totals;
  int64_t num_params = 0;             ///< the model's parameters N (all of them)
  int64_t tokens_per_step = 0;        ///< train.batch_size · train.seq_len
  double flops_per_token = 0;         ///< model FLOPs per token, attention over the full T × T
  double flops_per_token_causal = 0;  ///< the same, attention over the causal triangle
  /// The model's buffers after the measured steps, bytes (Linear scratch exists only once a
  /// step has run).
  nn::Model::MemoryUse memory;
  int64_t adamw_bytes = 0;     ///< AdamW's two FP32 moments: 2 · 4 · N bytes
  int64_t peak_rss_bytes = 0;  ///< the process's peak resident memory (VmHWM) after the steps
};

/// Build the model of the resolved run `run` (config, recipe and its plans, resolve_run; one
/// micro-batch per forward, seeded by train.seed), AdamW and the batch sampler over data.train, and run opt.warmup + opt.steps
/// training steps exactly as train runs them (train_step, the WSD schedule over
/// max(train.steps, warmup + steps) steps; telemetry on step 1, inside the warm-up, and every
/// telemetry_interval-th step), the component timers zeroed after the warm-up and switched
/// off on return. Collective under mpirun: every rank calls it. Throws fp4::UserError when
/// data.vocab_size exceeds model.vocab_size, when a step diverges ("<what> at step N while
/// profiling"), or as train_step does; std::invalid_argument when opt.steps < 1 or
/// opt.warmup < 0.
ProfileResult profile_steps(const ResolvedRun& run, const TokenData& data,
                            const ProfileOptions& opt);

}  // namespace fp4
