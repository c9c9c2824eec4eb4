// `fp4train fidelity`: the fidelity panel of a run's checkpoints (fp4/study/fidelity.h,
// docs/fidelity.md): the options, then run_fidelity and write_fidelity_report.
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "options.h"
#include "fp4/base/error.h"
#include "fp4/dist/dist.h"
#include "fp4/study/fidelity.h"

namespace fp4::cli {

namespace {
struct FidelityArgs {
  FidelityRequest req;
  std::string run, out, claims, steps, from;
  bool resamples_given = false;
  std::vector<std::string> recipes;
};

void run(FidelityArgs& a) {
  FidelityRequest& r = a.req;
  if (!a.from.empty()) {  // the report (and claims) again from a panel's fidelity.json
    if (!a.run.empty() || !a.recipes.empty() || !a.steps.empty() || r.linear_roles)
      throw UserError("--from rebuilds the report of a finished panel; --run, --recipe, --steps and "
                      "--linear-roles go with a new panel");
    r.claims = a.claims;
    if (!a.claims.empty() && !std::filesystem::exists(a.claims))
      throw UserError("--claims " + a.claims + " does not exist");
    r.out = a.out.empty() ? std::filesystem::path(a.from).parent_path() : std::filesystem::path(a.out);
    if (r.out.empty()) r.out = ".";
    const FidelityPanel p = load_fidelity_panel(a.from);
    if (dist::rank() != 0) return;  // under mpirun rank 0 alone writes
    // The file's bootstrap unless --resamples is given, so a plain rebuild reproduces the report.
    if (!a.resamples_given && p.resamples > 0) r.resamples = p.resamples;
    if (p.bootstrap_seed) r.bootstrap_seed = p.bootstrap_seed;
    write_fidelity_report(p, r);
    for (const std::string& w : p.warnings)  // run_fidelity printed them when it ran the panel
      std::fprintf(stderr, "fidelity: warning: %s\n", w.c_str());
    std::printf("fidelity: report of %s rebuilt in %s\n", a.from.c_str(), r.out.string().c_str());
    return;
  }
  if (a.run.empty() || a.recipes.empty()) throw UserError("fidelity needs --run DIR and --recipe R,... (or --from FILE)");
  r.run = a.run;
  r.recipes = split_list(a.recipes);
  r.out = a.out.empty() ? std::filesystem::path(a.run) / "fidelity" : std::filesystem::path(a.out);
  r.claims = a.claims;
  if (!a.claims.empty() && !std::filesystem::exists(a.claims))
    throw UserError("--claims " + a.claims + " does not exist");
  r.steps = parse_step_list(a.steps, "--steps");
  const FidelityPanel p = run_fidelity(r);
  if (dist::rank() != 0) return;  // under mpirun rank 0 alone writes (every rank holds the panel)
  write_fidelity_report(p, r);
  std::printf("fidelity: %zu recipes x %zu checkpoints x %d batches in %.0f s; wrote %s and %s\n",
              p.recipes.size(), p.steps.size(), p.batches, p.seconds,
              (r.out / "fidelity.json").string().c_str(), (r.out / "fidelity.md").string().c_str());
}
}  // namespace

void register_fidelity(CLI::App& app) {
  auto a = std::make_shared<FidelityArgs>();
  auto* c = app.add_subcommand(
      "fidelity",
      "How far each recipe's quantized forward and backward are from the exact FP32 ones, on the\n"
      "same weights (checkpoints of a reference run) and the same batches: gradient relative\n"
      "error, cosine, gain, squared bias and variance over SR draws, quantization noise against\n"
      "SGD noise, and the forward loss penalty, with bootstrap intervals; recipes are compared\n"
      "paired on identical (checkpoint, batch), so trajectory noise never enters. Writes\n"
      "fidelity.json and fidelity.md (docs/fidelity.md). Example:\n"
      "  fp4train fidelity --run runs/bf16 --recipe ue5m3-b16,nvfp4-te,ue5m3-te");
  c->add_option("--run", a->run, "Reference run directory (its checkpoints/ hold the steps)");
  c->add_option("--recipe", a->recipes,
                "Recipes to measure: names (fp4train recipes) or .toml paths; repeatable or a "
                "comma list. Contrasts are each against the first");
  c->add_option("--from", a->from,
                "Instead of a new panel: rebuild fidelity.json and fidelity.md (and the --claims "
                "verdicts) from a panel's fidelity.json, without rerunning it");
  c->add_option("--steps", a->steps,
                "Checkpoint steps, a comma list (default: --checkpoints of those the run holds, "
                "evenly spread, the newest included). A step that is a multiple of a recipe's "
                "amax_interval D is followed by a refresh step and shows no staleness; when all "
                "are, the panel warns (docs/fidelity.md \"Choosing the steps\")");
  c->add_option("--checkpoints", a->req.checkpoints, "How many checkpoints without --steps")
      ->capture_default_str()->check(CLI::Range(1, 1000));
  c->add_option("--batches", a->req.batches,
                "Batches per checkpoint (training micro-batches, the same at every checkpoint)")
      ->capture_default_str()->check(CLI::Range(2, 100000));
  c->add_option("--batch-size", a->req.batch_size,
                "Sequences per batch (default: the run's micro-batch); other sizes show how the "
                "quantization noise compares with SGD noise at other tokens per step")
      ->check(CLI::Range(1, 1 << 16));
  auto* sf = c->add_option("--stress-factor", a->req.stress_factor,
                "Outlier stress (default 1: none): multiply channels --stress-channels (default 0) of "
                "every block's norm by this power of two (2 .. 2^20) and divide the matching input columns of q/k/v_proj, "
                "up_proj and in_proj by it; the exact function is unchanged, the quantized "
                "operands gain outlier channels (docs/fidelity.md \"Outlier stress\")");
  auto* sc = c->add_option("--stress-channels", a->req.stress_channels,
                "Channels of the outlier stress (comma list, each once; used with --stress-factor)")
      ->delimiter(',')->capture_default_str();
  c->add_flag("--linear-roles", a->req.linear_roles,
              "Also each linear's output Y, input gradient dX and weight gradient dW, local (its "
              "quantized GEMMs fed the exact X* and dY*) and end to end (fed the recipe pass's own "
              "X and dY); scopes Y.local, Y.e2e, dX.local, dX.e2e, dW.local, dW.e2e for claims. "
              "About triples the time per recipe (docs/fidelity.md \"Per-linear roles\")");
  c->add_option("--draws", a->req.draws,
                "Stochastic-rounding draws per batch for recipes with SR (RNE recipes: 1)")
      ->capture_default_str()->check(CLI::Range(1, 1000));
  c->add_option("--seed", a->req.seed, "Seed of the batches and of the SR streams")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  auto* rs = c->add_option("--resamples", a->req.resamples, "Bootstrap resamples (with --from: the file's unless given)")
      ->capture_default_str()->check(CLI::Range(1, 1000000));
  c->add_option("--references", a->req.references,
                "held: each recipe's tensor references as it would hold them at the evaluated "
                "step (D > 1: sampled at the last refresh step t_r on the checkpoint of step t_r - 1 "
                "and step t_r's training batch; needs those checkpoints); current: measured on each batch")
      ->capture_default_str()->check(CLI::IsMember({"held", "current"}));
  c->add_option("--data", a->req.data, "Text file or directory instead of the run's data.path");
  c->add_option("--claims", a->claims,
                "Mechanism claims (TOML [[claim]] tables: id, text, metric, scope, the contrast as a "
                "and b or as terms = {recipe = coefficient}, expect = \"lower\" | \"higher\" | "
                "\"within\" with bound; e.g. configs/studies/mechanisms.toml), each given a "
                "verdict; checked before any work");
  c->add_option("--out", a->out, "Output directory (default: RUN/fidelity)");
  c->add_flag("--quiet", a->req.quiet, "No progress lines");
  c->callback([a, rs, sf, sc] {
    a->resamples_given = rs->count() > 0;
    if (sc->count() > 0 && (sf->count() == 0 || a->req.stress_factor == 1))
      throw UserError("--stress-channels needs --stress-factor S (a power of two from 2 to 2^20)");
    run(*a);
  });
}

}  // namespace fp4::cli
