// `fp4train rollout`: paired rollouts from a run's checkpoints (fp4/study/rollout.h,
// docs/fidelity.md "Paired rollouts"): the options, then run_rollouts and write_rollout_report.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "options.h"
#include "fp4/base/error.h"
#include "fp4/dist/dist.h"
#include "fp4/study/rollout.h"

namespace fp4::cli {

namespace {
struct RolloutArgs {
  RolloutRequest req;
  std::string run, out, steps, from;
  std::vector<std::string> recipes;
  CLI::Option *spike = nullptr, *gnorm = nullptr, *resamples = nullptr;  // given: they override a --from file's
  std::vector<CLI::Option*> fresh;  // options of new rollouts only (refused with --from)
};

void run(RolloutArgs& a) {
  RolloutRequest& r = a.req;
  if (!a.from.empty()) {  // the report again from a finished rollout.json
    std::string given;
    for (const CLI::Option* o : a.fresh)
      if (o->count()) given += (given.empty() ? "" : ", ") + o->get_name();
    if (!a.run.empty() || !a.recipes.empty() || !a.steps.empty() || r.stress.active() || !given.empty())
      throw UserError("--from rebuilds the report of finished rollouts; --run, --recipe, --steps, --checkpoints, "
                      "--length, --orders, --seed, --windows, --data and the stress (--lr-scale, --no-warmup, "
                      "--batch-size) go with new ones" + (given.empty() ? std::string() : " (given: " + given + ")"));
    r.out = a.out.empty() ? std::filesystem::path(a.from).parent_path() : std::filesystem::path(a.out);
    if (r.out.empty()) r.out = ".";
    RolloutResult res = load_rollouts(a.from);
    const bool recount = a.spike->count() || a.gnorm->count() || a.resamples->count();
    if (a.spike->count()) res.stability.spike_threshold = r.stability.spike_threshold;
    if (a.gnorm->count()) res.stability.grad_norm_limit = r.stability.grad_norm_limit;
    check_stability(res.stability);
    // The file's own bootstrap unless --resamples is given (files of earlier versions record
    // none: the default, as their reports used).
    if (a.resamples->count() || res.resamples == 0) res.resamples = r.resamples, res.bootstrap_seed = r.bootstrap_seed;
    r.resamples = res.resamples, r.bootstrap_seed = res.bootstrap_seed;
    // The input is never rewritten: beside it only rollout.md is, and only as it was (a
    // recount with other thresholds or resamples needs an --out of its own).
    std::error_code ec;
    const bool beside = std::filesystem::equivalent(r.out / "rollout.json", a.from, ec);
    if (beside && recount)
      throw UserError("rollout --from: a recount with other --spike-threshold, --grad-norm-limit or --resamples "
                      "would replace the report beside " + a.from + "; give --out DIR");
    if ((a.spike->count() || a.gnorm->count()) && !res.has_grad_norms())
      std::fprintf(stderr, "rollout: note: %s records no gradient norms (an earlier binary's), so its report has "
                           "no stability tables and the thresholds change nothing\n", a.from.c_str());
    if (dist::rank() != 0) return;  // under mpirun rank 0 alone writes
    write_rollout_report(res, r, !beside);
    std::printf("rollout: report of %s rebuilt in %s\n", a.from.c_str(), r.out.string().c_str());
    return;
  }
  if (a.run.empty() || a.recipes.empty()) throw UserError("rollout needs --run DIR and --recipe R,... (or --from FILE)");
  r.run = a.run;
  r.recipes = split_list(a.recipes);
  r.out = a.out.empty() ? std::filesystem::path(a.run) / "rollout" : std::filesystem::path(a.out);
  r.steps = parse_step_list(a.steps, "--steps");
  check_rollout_request(r);  // before --out is made
  if (!std::filesystem::is_directory(r.run)) throw UserError("rollout: run " + a.run + " does not exist");
  std::error_code ec;  // the output directory first, so a bad --out costs no training
  std::filesystem::create_directories(r.out, ec);
  if (ec || !std::filesystem::is_directory(r.out))
    throw UserError("--out " + r.out.string() + ": cannot create the directory" + (ec ? ": " + ec.message() : ""));
  const RolloutResult res = run_rollouts(r);
  if (dist::rank() != 0) return;  // under mpirun rank 0 alone writes (every rank holds every trace)
  write_rollout_report(res, r);
  std::printf("rollout: %zu recipes and fp32 x %zu checkpoints x %d orders x %d steps; wrote %s and %s\n",
              res.recipes.size() - 1, res.steps.size(), res.orders, res.length,
              (r.out / "rollout.json").string().c_str(), (r.out / "rollout.md").string().c_str());
}
}  // namespace

void register_rollout(CLI::App& app) {
  auto a = std::make_shared<RolloutArgs>();
  auto* c = app.add_subcommand(
      "rollout",
      "Paired rollouts: from checkpoints of a reference run, with its optimizer state, every\n"
      "recipe and fp32 train --length steps on exactly the same batches. The trajectories start\n"
      "identical, so each recipe's gap to the fp32 rollout (training loss per step, held-out NLL\n"
      "at the end, parameter divergence) is its systematic effect through training, before chaos\n"
      "grows; intervals by a two-level bootstrap over checkpoints and batch orders. With a\n"
      "stress (--lr-scale, --no-warmup, --batch-size) it is a stability probe: loss spikes,\n"
      "gradient-norm excursions and non-finite steps per recipe. Under mpirun the rollouts are\n"
      "spread over the ranks (same bits). Writes rollout.json and rollout.md (docs/fidelity.md\n"
      "\"Paired rollouts\", \"Stability stress\"). Example:\n"
      "  fp4train rollout --run runs/bf16 --recipe ue5m3-b16,nvfp4-te --length 20");
  c->add_option("--run", a->run, "Reference run directory (its checkpoints/ hold the steps)");
  c->add_option("--recipe", a->recipes,
                "Recipes to roll out: names or .toml paths; repeatable or a comma list. fp32 runs "
                "first as the reference; listing fp32 runs it again (its gaps are exactly 0)");
  c->add_option("--from", a->from, "Instead of new rollouts: rebuild rollout.md from a rollout.json");
  c->add_option("--steps", a->steps,
                "Checkpoint steps, a comma list (default: --checkpoints of those the run holds, evenly "
                "spread, the newest included)");
  a->fresh.push_back(c->add_option("--checkpoints", a->req.checkpoints, "How many checkpoints without --steps")
      ->capture_default_str()->check(CLI::Range(1, 1000)));
  a->fresh.push_back(c->add_option("--length", a->req.length, "Optimizer steps per rollout (N)")
      ->capture_default_str()->check(CLI::Range(1, 1000000)));
  a->fresh.push_back(c->add_option("--orders", a->req.orders,
                "Batch orders per checkpoint: order 0 continues the run's own batches, order o > 0 "
                "draws from a sampler seeded by (--seed, o), the same for every recipe")
      ->capture_default_str()->check(CLI::Range(1, 1000)));
  a->fresh.push_back(c->add_option("--seed", a->req.seed, "Seed of the batch orders o > 0")
      ->capture_default_str()->check(CLI::NonNegativeNumber));
  a->fresh.push_back(c->add_option("--windows", a->req.windows, "Held-out windows of the final NLL (default: the run's eval.windows)")
      ->check(CLI::Range(1, 1 << 24)));
  a->resamples = c->add_option("--resamples", a->req.resamples,
                               "Bootstrap resamples (with --from: instead of the file's)")
      ->capture_default_str()->check(CLI::Range(1, 1000000));
  a->fresh.push_back(c->add_option("--data", a->req.data, "Text file or directory instead of the run config's data.path"));
  c->add_option("--out", a->out, "Output directory (default RUN/rollout; with --from, the file's)");
  c->add_option("--lr-scale", a->req.stress.lr_scale,
                "Stability stress: the run's peak learning rate times this, for fp32 and every recipe "
                "(docs/fidelity.md \"Stability stress\")")
      ->capture_default_str();
  c->add_flag("--no-warmup", a->req.stress.no_warmup,
              "Stability stress: no warmup (the peak learning rate from step 1, the paper's 8B schedule "
              "shape); matters for checkpoints inside the run's warmup");
  c->add_option("--batch-size", a->req.stress.batch_size,
                "Stability stress: sequences per step instead of the run's train.batch_size (fewer tokens "
                "per step); a multiple of train.micro_batch_size when that is set")
      ->check(CLI::Range(1, 1 << 20));
  a->spike = c->add_option("--spike-threshold", a->req.stability.spike_threshold,
                "A loss spike: a step whose loss exceeds the fp32 rollout's on the same batch by more than "
                "this many nats (with --from: instead of the file's)")
      ->capture_default_str();
  a->gnorm = c->add_option("--grad-norm-limit", a->req.stability.grad_norm_limit,
                "A gradient-norm excursion: a step whose global gradient norm before clipping exceeds this (with --from: instead of the file's)")
      ->capture_default_str();
  c->add_flag("--quiet", a->req.quiet, "No progress lines");
  c->callback([a] { run(*a); });
}

}  // namespace fp4::cli
