// The training loop: batches → forward → loss → backward → clip → AdamW, with progress
// lines, metrics.jsonl, periodic held-out evaluation and a final summary.
#include <chrono>
#include <limits>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "fp4/error.h"
#include "fp4/eval.h"
#include "fp4/train.h"

namespace fp4 {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
void write_atomic(const fs::path& p, const std::string& text) {
  const fs::path tmp = p.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw UserError("cannot write " + tmp.string());
    f << text;
    f.flush();
    if (!f) throw UserError("write failed: " + tmp.string());
  }
  fs::rename(tmp, p);
}

std::string fmt_duration(double s) {
  char b[32];
  if (s < 0 || !std::isfinite(s)) return "?";
  const int t = static_cast<int>(s + 0.5);
  if (t >= 3600)
    std::snprintf(b, sizeof b, "%dh%02dm", t / 3600, (t / 60) % 60);
  else if (t >= 60)
    std::snprintf(b, sizeof b, "%dm%02ds", t / 60, t % 60);
  else
    std::snprintf(b, sizeof b, "%ds", t);
  return b;
}
}  // namespace

namespace {
// {"blocks.0.attn.q": {"x": {...}, "w": ..., "dy": ..., "dyt": ..., "xt": ...}, ...} for every
// FP4 linear, and a digest line naming the worst layer/operand for each statistic.
json telemetry_record(const nn::Model& model, std::string& digest) {
  json t = json::object();
  struct Worst {
    double v = -1;
    std::string where;
  } err, sat, guard, zeroed, stale;
  auto upd = [](Worst& w, double v, const std::string& where) {
    if (v > w.v) w = {v, where};
  };
  for (size_t i = 0; i < model.linears().size(); ++i) {
    const auto& tel = model.linears()[i].telemetry();
    if (!tel.valid) continue;
    const std::string name = model.linear_name(i);
    json layer;
    for (int o = 0; o < nn::LinearTelemetry::kOperands; ++o) {
      const QuantStats& s = tel.op[o];
      const std::string where = name + " " + nn::LinearTelemetry::kNames[o];
      layer[nn::LinearTelemetry::kNames[o]] = {{"saturated_blocks", s.saturated_blocks},
                                               {"zero_guard_blocks", s.zero_guard_blocks},
                                               {"zeroed_nonzeros", s.zeroed_nonzeros},
                                               {"rel_error", s.rel_error},
                                               {"staleness", s.staleness}};
      upd(err, s.rel_error, where);
      upd(sat, s.saturated_blocks, where);
      upd(guard, s.zero_guard_blocks, where);
      upd(zeroed, s.zeroed_nonzeros, where);
      upd(stale, s.staleness, where);
    }
    t[name] = layer;
  }
  if (err.v >= 0) {
    char b[512];
    std::snprintf(b, sizeof b,
                  "numerics | worst rel. error %.4f (%s) | saturated scales %.2f%% (%s) | "
                  "zero-guard %.2f%% | nonzeros to 0 %.1f%% (%s) | amax/held %.2f (%s)",
                  err.v, err.where.c_str(), 100 * sat.v, sat.where.c_str(), 100 * guard.v,
                  100 * zeroed.v, zeroed.where.c_str(), stale.v, stale.where.c_str());
    digest = b;
  }
  return t;
}
}  // namespace

void check_recipe_fits(const Recipe& recipe, const RunConfig& cfg) {
  const int L = cfg.model.n_layers;
  // Block indices, final_blocks (recipe and overrides), and overrides that change no linear.
  const ResolvedLinears res = resolve_linear_plans(recipe, L);
  bool fp4_rht = false;
  for (const LinearPlan& p : res.plans) fp4_rht |= recipe.rht_wgrad && p.mode == LinearMode::FP4;
  const int64_t tokens = int64_t(cfg.train.batch_size) * cfg.train.seq_len;
  if (fp4_rht && tokens % 16 != 0)
    throw UserError(recipe.where() + " applies the 16-point RHT along tokens (fp4.rht_wgrad): " +
                    "train.batch_size × train.seq_len = " + std::to_string(tokens) +
                    " must be a multiple of 16");
}

std::string describe_linear_plans(const Recipe& recipe, const nn::Model& model) {
  const int L = model.config().n_layers;
  const ResolvedLinears res = resolve_linear_plans(recipe, L);
  const size_t K = linear_kinds().size();
  std::ostringstream o;
  o << "recipe " << recipe.name << " (";
  for (int l = 0; l < L; ++l) {
    // A block's mode, or its linears' modes joined by '+' where overrides made them differ.
    std::string m;
    for (size_t j = 0; j < K; ++j) {
      const std::string mj = linear_mode_name(res.plans[l * K + j].mode);
      if (m.find(mj) == std::string::npos) m += (m.empty() ? "" : "+") + mj;
    }
    o << (l ? "," : "") << m;
  }
  o << " per block)";
  for (size_t i = 0; i < recipe.overrides.size(); ++i) {
    o << "\n  override[" << i << "] " << recipe.overrides[i].describe() << " -> "
      << res.override_hits[i].size() << " linear" << (res.override_hits[i].size() == 1 ? "" : "s")
      << ":";
    for (int idx : res.override_hits[i]) o << " " << model.linear_name(size_t(idx));
  }
  return o.str();
}

double heldout_nll(nn::Model& model, const std::vector<uint16_t>& tokens,
                   const std::vector<int64_t>& starts, int seq_len, int batch, bool quantize) {
  if (starts.empty()) throw UserError("held-out split has fewer than seq_len + 1 tokens");
  EvalPolicy policy;
  policy.kind = quantize ? EvalPolicy::Kind::Current : EvalPolicy::Kind::None;
  const NllResult r = evaluate_nll(model, EvalWindows{&tokens, starts}, seq_len, batch, policy);
  // Callers decide how a non-finite tensor is reported (see safe_nll in train()).
  if (std::isnan(r.nats_per_token)) throw NonFiniteError("held-out evaluation: non-finite tensor");
  return r.nats_per_token;
}

TrainSummary train(const RunConfig& cfg, const Recipe& recipe, const TokenData& data,
                   const TrainOptions& opt) {
  using clock = std::chrono::steady_clock;
  const auto& tc = cfg.train;
  // Everything that can be checked is checked before a file is written.
  if (data.vocab_size > cfg.model.vocab_size)
    throw UserError("tokenizer vocab (" + std::to_string(data.vocab_size) +
                    ") exceeds model.vocab_size (" + std::to_string(cfg.model.vocab_size) + ")");
  check_recipe_fits(recipe, cfg);
  const auto eval_starts = heldout_windows(static_cast<int64_t>(data.heldout.size()), tc.seq_len,
                                           cfg.eval.windows);
  if (eval_starts.empty())
    throw UserError("the held-out split has " + std::to_string(data.heldout.size()) +
                    " tokens, fewer than train.seq_len + 1 = " + std::to_string(tc.seq_len + 1) +
                    "; use more held-out text or a shorter seq_len");
  nn::Model model(cfg.model, recipe, tc.batch_size, tc.seq_len);
  model.init(tc.seed);
  AdamW opt_state(model.num_params(), tc);
  BatchSampler sampler(data.train, tc.seq_len, tc.batch_size, tc.seed);

  fs::create_directories(opt.out_dir);
  write_atomic(opt.out_dir / "config.toml", run_config_to_toml(cfg));
  write_atomic(opt.out_dir / "recipe.toml", recipe_to_toml(recipe));
  std::ofstream metrics(opt.out_dir / "metrics.jsonl", std::ios::trunc);
  if (!metrics) throw UserError("cannot write " + (opt.out_dir / "metrics.jsonl").string());
  std::vector<int32_t> inputs(int64_t(tc.batch_size) * tc.seq_len), targets(inputs.size());
  const int64_t tokens_per_step = int64_t(tc.batch_size) * tc.seq_len;

  auto log = [&](const std::string& s) {
    if (!opt.quiet) {
      std::printf("%s\n", s.c_str());
      std::fflush(stdout);
    }
  };
  {
    std::ostringstream o;
    o << "model: " << model.num_params() << " parameters (" << model.num_body_params()
      << " in blocks), " << cfg.model.n_layers << " layers, d_model " << cfg.model.d_model
      << "; ";
    // The recipe's per-block modes, then one line per [[override]] with the linears it hit.
    const std::string plans = describe_linear_plans(recipe, model);
    const size_t nl = plans.find('\n');
    o << plans.substr(0, nl) << "; " << tokens_per_step << " tokens/step, " << tc.steps << " steps";
    if (nl != std::string::npos) o << plans.substr(nl);
    log(o.str());
  }

  TrainSummary sum;
  double train_seconds = 0, window_seconds = 0;
  int64_t window_tokens = 0;
  auto last_print = clock::now();
  const auto t_start = clock::now();

  // A NaN/Inf met inside an evaluation (e.g. a quantized forward overflowing in a diverging
  // run) makes that NLL NaN (JSON null) instead of stopping the run; training itself stops
  // on its own non-finite checks.
  auto safe_nll = [&](bool quantize) {
    try {
      return heldout_nll(model, data.heldout, eval_starts, tc.seq_len, tc.batch_size, quantize);
    } catch (const NonFiniteError&) {
      return std::numeric_limits<double>::quiet_NaN();
    }
  };
  auto evaluate = [&](int step, json& rec) {
    const double nll = safe_nll(false);
    double nllq = nll;
    if (recipe.mode != LinearMode::FP32) nllq = safe_nll(true);
    rec["val_nll"] = nll;
    rec["val_nll_quant"] = nllq;
    char b[200];
    if (recipe.mode == LinearMode::FP32)
      std::snprintf(b, sizeof b, "eval step %d | held-out NLL %.4f", step, nll);
    else
      std::snprintf(b, sizeof b,
                    "eval step %d | held-out NLL %.4f (FP32 inference) | %.4f (%s inference, "
                    "current scaling)",
                    step, nll, nllq, recipe.name.c_str());
    log(b);
    sum.heldout_nll = nll;
    sum.heldout_nll_quant = nllq;
  };

  std::string digest;  // one line on the worst layer at the latest telemetry step
  for (int step = 1; step <= tc.steps; ++step) {
    const auto t0 = clock::now();
    sampler.next(inputs.data(), targets.data());
    nn::StepContext ctx;
    ctx.step = step;
    ctx.seed = tc.seed;
    ctx.telemetry = cfg.telemetry_interval > 0 && recipe.mode == LinearMode::FP4 &&
                    (step == 1 || step % cfg.telemetry_interval == 0);
    // A diverged run stops with the step named; metrics so far are kept, no summary written.
    auto diverged = [&](const std::string& what) {
      const std::string msg = what + " at step " + std::to_string(step) + " with recipe " +
                              recipe.name + "; the run diverged. Metrics up to step " +
                              std::to_string(step - 1) + " are in " +
                              (opt.out_dir / "metrics.jsonl").string();
      write_atomic(opt.out_dir / "error.txt", msg + "\n");
      throw UserError(msg);
    };
    model.zero_grad();
    double loss = 0;
    try {
      loss = model.forward(inputs.data(), targets.data(), tc.batch_size, ctx);
      if (!std::isfinite(loss)) diverged("non-finite training loss (" + std::to_string(loss) + ")");
      model.backward(ctx);
    } catch (const NonFiniteError& e) {
      // A quantizer met NaN/Inf activations or gradients before the loss showed it.
      diverged(std::string("non-finite tensor (") + e.what() + ")");
    }
    const double gnorm = clip_grad_norm(model.grads().data(), model.num_params(), tc.grad_clip);
    const double lr = wsd_lr(tc, step);
    if (!std::isfinite(gnorm)) diverged("non-finite gradient norm");
    opt_state.step(model.params().data(), model.grads().data(), model.param_infos(), lr, step);
    const double dt = std::chrono::duration<double>(clock::now() - t0).count();
    train_seconds += dt;
    window_seconds += dt;
    window_tokens += tokens_per_step;
    sum.losses.push_back(loss);
    if (step == 1) sum.first_loss = loss;

    json rec = {{"step", step},
                {"tokens", int64_t(step) * tokens_per_step},
                {"loss", loss},
                {"lr", lr},
                {"grad_norm", gnorm},
                {"tokens_per_s", tokens_per_step / dt},
                {"step_ms", dt * 1e3}};
    const double since = std::chrono::duration<double>(clock::now() - last_print).count();
    if (since >= cfg.progress_seconds || step == 1 || step == tc.steps) {
      const double tps = window_tokens / std::max(window_seconds, 1e-9);
      const double eta = (tc.steps - step) * (train_seconds / step);
      char b[200];
      std::snprintf(b, sizeof b,
                    "step %*d/%d | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s | ETA %s",
                    int(std::to_string(tc.steps).size()), step, tc.steps, loss, lr, gnorm, tps,
                    fmt_duration(eta).c_str());
      log(b);
      last_print = clock::now();
      window_seconds = 0;
      window_tokens = 0;
    }
    if (ctx.telemetry) rec["telemetry"] = telemetry_record(model, digest);
    if (step % cfg.eval.interval == 0 || step == tc.steps) {
      evaluate(step, rec);
      if (!digest.empty()) log(digest);
    }
    metrics << rec.dump() << "\n";
    metrics.flush();
  }

  const int n = tc.steps, w = std::max(1, n / 10);
  double s = 0;
  for (int i = n - w; i < n; ++i) s += sum.losses[i];
  sum.steps = n;
  sum.final_window_loss = s / w;
  sum.tokens_per_s = double(n) * tokens_per_step / std::max(train_seconds, 1e-9);
  json js = {{"status", "completed"},
             {"recipe", recipe.name},
             {"config", opt.config_name},
             {"steps", n},
             {"seed", tc.seed},
             {"tokens", int64_t(n) * tokens_per_step},
             {"parameters", model.num_params()},
             {"first_loss", sum.first_loss},
             {"final_window_loss", sum.final_window_loss},
             {"final_window_steps", w},
             {"heldout_nll", sum.heldout_nll},
             {"heldout_nll_quant", sum.heldout_nll_quant},
             {"heldout_tokens", int64_t(eval_starts.size()) * tc.seq_len},
             {"tokens_per_s", sum.tokens_per_s},
             {"wall_seconds", std::chrono::duration<double>(clock::now() - t_start).count()}};
  write_atomic(opt.out_dir / "summary.json", js.dump(2) + "\n");
  return sum;
}

}  // namespace fp4
