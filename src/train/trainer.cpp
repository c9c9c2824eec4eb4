// The training run: its checks, a fresh start or a resume, the loop of steps (train_step.cpp)
// with progress lines, metrics.jsonl, periodic held-out evaluation and checkpoints, and the
// final summary.
#include <fcntl.h>
#include <sys/file.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <optional>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "fp4/dist/dist.h"
#include "fp4/base/error.h"
#include "fp4/eval/eval.h"
#include "fp4/base/machine_load.h"
#include "fp4/train/metrics_log.h"
#include "fp4/base/profile.h"
#include "fp4/gemm/machine.h"
#include "fp4/numerics/pack_fast.h"
#include "fp4/numerics/quant_fast.h"
#include "fp4/base/safetensors.h"
#include "fp4/base/words.h"
#include "fp4/train/resolved_run.h"
#include "fp4/train/run_lock.h"
#include "fp4/train/train.h"
#include "telemetry_json.h"

namespace fp4 {
namespace fs = std::filesystem;
using json = nlohmann::json;


namespace {
std::string read_file_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw UserError("cannot read " + p.string());
  std::ostringstream o;
  o << f.rdbuf();
  return o.str();
}

// Cut metrics.jsonl back to the lines of steps <= `step` (atomically), for a resume from the
// checkpoint of that step. Only an incomplete last line (a write cut off by a kill) may be
// dropped unread; any other unreadable line stops the resume rather than lose data.
std::string cut_metrics(const fs::path& file, int64_t step) {
  std::error_code ec;
  if (!fs::exists(file, ec)) return "metrics.jsonl was missing; it restarts at step " + std::to_string(step + 1);
  const MetricsCut cut = cut_metrics_text(read_file_bytes(file), step, file.string());
  const std::string& kept = cut.kept;
  const int64_t n_kept = cut.n_kept, n_dropped = cut.n_dropped;
  const bool torn = cut.torn;
  write_file_atomic(file, kept);
  return "metrics.jsonl: kept " + std::to_string(n_kept) + " lines up to step " +
         std::to_string(step) + ", dropped " + std::to_string(n_dropped) + " of later steps" +
         (torn ? " and an incomplete last line" : "");
}

// error.txt from one MPI rank: written to error.txt.<rank>.tmp, then renamed over
// error.txt, so that ranks meeting the same divergence at once do not collide (the last
// rename wins; their messages differ at most in the micro-batch named).
void write_error_of_rank(const fs::path& file, const std::string& msg) {
  const fs::path tmp = file.string() + "." + std::to_string(dist::rank()) + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << msg << "\n";
    if (!f) return;  // the message still reaches stderr (abort_all)
  }
  std::error_code ec;
  fs::rename(tmp, file, ec);
}

}  // namespace

ResolvedLinears check_recipe_fits(const Recipe& recipe, const RunConfig& cfg) {
  // Block indices, final_blocks (recipe and overrides), and overrides that change no linear.
  ResolvedLinears res =
      resolve_linear_plans(recipe, nn::Model::linear_sites(cfg.model), cfg.model.n_blocks());
  int rht_n = 0;  // the wgrad transform's size n, 0 if no FP4 linear has one
  for (const LinearPlan& p : res.plans)
    if (p.rht() && !p.ms_eden()) rht_n = std::max(rht_n, p.hadamard_size);  // MS-EDEN zero-pads
  // The RHT runs along the tokens of one forward: a micro-batch.
  const int64_t tokens = int64_t(cfg.train.micro()) * cfg.train.seq_len;
  if (rht_n > 0 && tokens % rht_n != 0)
    throw UserError(recipe.where() + " applies the " + std::to_string(rht_n) +
                    "-point RHT along tokens (fp4.rht_wgrad" +
                    (rht_n != 16 ? ", fp4.hadamard_size" : "") + "): " +
                    (cfg.train.micro() == cfg.train.batch_size ? "train.batch_size"
                                                               : "train.micro_batch_size") +
                    " × train.seq_len = " + std::to_string(tokens) + " must be a multiple of " +
                    std::to_string(rht_n));
  return res;
}

ValidatedRun validate_run(const RunConfig& cfg, const Recipe& recipe, bool resume) {
  ResolvedLinears plans = check_recipe_fits(recipe, cfg);
  check_process_count(cfg, resume);
  return ValidatedRun(cfg, recipe, std::move(plans));
}

ValidatedRun validate_run(const ResolvedRun& run, bool resume) {
  check_process_count(run.config, resume);
  return ValidatedRun(run.config, run.recipe, run.plans);
}

ValidatedRun ValidatedRun::with_seed(uint64_t seed) const {
  ValidatedRun v = *this;
  v.cfg_.train.seed = seed;
  return v;
}

namespace {
// The FP4 GEMM of a run, as its recipe resolved it (docs/gemm.md), or nullptr when no linear
// runs FP4: the run header and summary.json name it.
const char* fp4_gemm_of(const Recipe& recipe, const nn::Model& model) {
  for (const LinearPlan& p : model.resolved_linears().plans)
    if (p.mode == LinearMode::FP4) return gemm_mode_name(recipe.gemm);
  return nullptr;
}
}  // namespace

std::string describe_linear_plans(const Recipe& recipe, const nn::Model& model) {
  const int L = model.n_blocks();
  const ResolvedLinears& res = model.resolved_linears();
  std::ostringstream o;
  o << "recipe " << recipe.name << " (";
  for (int l = 0; l < L; ++l) {
    // A block's mode, or its linears' modes joined by '+' where overrides made them differ.
    std::string m;
    for (size_t i = 0; i < res.plans.size(); ++i) {
      if (model.linear_sites()[i].block != l) continue;
      const std::string mj = linear_mode_name(res.plans[i].mode);
      if (m.find(mj) == std::string::npos) m += (m.empty() ? "" : "+") + mj;
    }
    o << (l ? "," : "") << m;
  }
  o << " per block";
  if (const char* g = fp4_gemm_of(recipe, model)) o << "; FP4 GEMM " << g;
  o << ")";
  for (size_t i = 0; i < recipe.overrides.size(); ++i) {
    o << "\n  override[" << i << "] " << recipe.overrides[i].describe() << " -> "
      << res.override_hits[i].size() << " linear" << (res.override_hits[i].size() == 1 ? "" : "s")
      << ":";
    for (int idx : res.override_hits[i]) o << " " << model.linear_name(size_t(idx));
  }
  return o.str();
}

std::string slow_quantizer_paths(const ResolvedLinears& res) {
  // Each distinct slow path, first seen first, with the GEMM operands that take it.
  std::vector<std::pair<std::string, std::vector<std::string>>> found;
  const std::pair<Gemm, Operand> uses[] = {{Gemm::Fprop, Operand::X}, {Gemm::Fprop, Operand::W},
                                           {Gemm::Dgrad, Operand::DY}, {Gemm::Dgrad, Operand::W},
                                           {Gemm::Wgrad, Operand::DY}, {Gemm::Wgrad, Operand::X}};
  for (const LinearPlan& p : res.plans) {
    if (p.mode != LinearMode::FP4) continue;
    for (const auto& [g, op] : uses) {
      const bool transposed = g == Gemm::Wgrad;  // the wgrad operands are quantize-transposes
      const bool row_scaled = p.row_scaled_activation && op == Operand::X;  // per-row X, Xᵀ
      const bool had = transposed ? p.rht_wgrad : g == Gemm::Dgrad && p.hadamard_dgrad;
      const bool quartet = g == Gemm::Fprop ? p.quartet_forward() : p.ms_eden();
      const std::string why =
          quartet && g == Gemm::Fprop ? "Quartet II's forward quantizer (scalar, threaded over rows)"
          : quartet    ? "MS-EDEN (transform, then the scalar quantizer, threaded over rows)"
          : p.probe()  ? pack_fast_slow_path(p.spec(g, op))
          : row_scaled ? quant_fast_slow_path_row_scaled(p.spec(g, op), transposed, transposed && p.rht_wgrad)
                       : quant_fast_slow_path(p.spec(g, op), transposed, had, p.hadamard_size);
      if (why.empty()) continue;
      const std::string use = std::string(gemm_name(g)) + " " + operand_name(op);
      auto it = std::find_if(found.begin(), found.end(),
                             [&](const auto& f) { return f.first == why; });
      if (it == found.end()) it = found.insert(found.end(), {why, {}});
      if (std::find(it->second.begin(), it->second.end(), use) == it->second.end())
        it->second.push_back(use);
    }
  }
  std::string line;
  for (const auto& [why, used] : found) {
    line += (line.empty() ? "" : "; ") + why + ":";
    for (size_t i = 0; i < used.size(); ++i) line += (i ? ", " : " ") + used[i];
  }
  return line;
}

double heldout_nll(nn::Model& model, const TokenStream& tokens,
                   const std::vector<int64_t>& starts, int seq_len, int batch, bool quantize) {
  if (starts.empty()) throw UserError("held-out split has fewer than seq_len + 1 tokens");
  EvalPolicy policy;
  policy.kind = quantize ? EvalPolicy::Kind::Current : EvalPolicy::Kind::None;
  const NllResult r = evaluate_nll(model, EvalWindows{&tokens, starts}, seq_len, batch, policy);
  // Callers decide how a non-finite tensor is reported (see safe_nll in train()).
  if (std::isnan(r.nats_per_token)) throw NonFiniteError("held-out evaluation: non-finite tensor");
  return r.nats_per_token;
}

namespace {
// What train() needs to know when train_run throws: whether the run directory exists yet,
// the step being run, and whether error.txt was already written (a diverged run).
struct RunState {
  bool dir_ready = false, error_written = false;
  int step = 0;
};

// One call of train(), in the stages that train_run runs one after the other:
//   validate  the checks that need no model, before anything is built or a file is written
//             (those of validate_run only if the caller has not made them);
//   restore   model, AdamW state, sampler and held references, fresh (initialised from
//             train.seed) or from opt.resume_from once it is checked to belong to this run;
//             the run directory made ready (lock, config.toml, recipe.toml, tokenizer.model,
//             metrics.jsonl cut back to the checkpoint and opened); the run's header lines;
//             the summary of the steps before the checkpoint;
//   loop      the steps, each with its metrics line, progress line, evaluation, telemetry and
//             checkpoint when due; false when it stopped early (stop_after, a stop request),
//             with `sum` the result;
//   finish    the final window, summary.json and the summary returned.
// Its members are what a stage hands on to the next.
struct TrainRun {
  using clock = std::chrono::steady_clock;

  TrainRun(const RunConfig& cfg, const Recipe& recipe, const TokenData& data,
           const TrainOptions& opt, RunState& st)
      : cfg(cfg), tc(cfg.train), recipe(recipe), data(data), opt(opt), st(st) {}

  void validate(const ResolvedLinears* validated);
  void restore();
  bool loop();
  void finish();

  // restore's parts.
  void check_and_load_checkpoint();
  std::string ready_run_directory();
  void print_header(const std::string& metrics_note);
  // loop's parts.
  [[noreturn]] void stop_diverged(int step, const StepResult& r);
  void progress_line(int step, const StepResult& r);
  double mfu(double tokens_per_s) const;
  void log(const std::string& s) const;
  double safe_nll(bool quantize);
  void evaluate(int step, json& rec);
  void save_rank0(int step);
  void save(int step);

  // Given.
  const RunConfig& cfg;
  const TrainConfig& tc;
  const Recipe& recipe;
  const TokenData& data;
  const TrainOptions& opt;
  RunState& st;

  // validate.
  ResolvedLinears plans;  // the recipe's, one per linear: the model is built from them
  std::vector<int64_t> eval_starts;
  int n_ranks = 1;
  bool rank0 = true;  // the only rank that writes files and prints

  // restore.
  std::optional<nn::Model> model;
  std::optional<AdamW> opt_state;
  std::unique_ptr<nn::RankReferences> ranks;
  StepBuffers step_buffers;
  std::optional<BatchSampler> sampler;
  std::string config_text, recipe_text, data_key, tokenizer_bytes;
  fs::path ckpt_dir, metrics_file, tokenizer_copy;
  const Checkpoint* ck = nullptr;
  int start = 0;
  std::unique_ptr<RunDirLock> dir_lock;
  AppendFile metrics;
  std::vector<int32_t> inputs, targets;
  int64_t tokens_per_step = 0;
  double flops_per_token = 0;
  prof::ComputePaths compute;
  std::string slow_path;  // slow_quantizer_paths of the plans: warned at the start, in summary.json
  TrainSummary sum;
  double train_seconds = 0, window_seconds = 0, wall_before = 0;
  bool have_eval = false;
  std::string digest;  // worst layer at the latest telemetry step

  // loop.
  int64_t window_tokens = 0;
  clock::time_point last_print, t_start;
  // The busiest the machine was at a progress line or at the end (fp4/base/machine_load.h): step
  // times and tokens/s taken on a busy machine are marked as such in summary.json, the
  // progress line and compare's report.
  MachineLoad worst_load;
  bool busy_noted = false;  // the busy-machine note printed (once; later lines end in "| busy")
};

// validated: the plans of a run validate_run has checked (check_recipe_fits,
// check_process_count), or null; the other checks are made in the order train() has always
// made them.
void TrainRun::validate(const ResolvedLinears* validated) {
  // Everything that can be checked is checked before a file is written.
  if (data.vocab_size > cfg.model.vocab_size)
    throw UserError("tokenizer vocab (" + std::to_string(data.vocab_size) +
                    ") exceeds model.vocab_size (" + std::to_string(cfg.model.vocab_size) + ")");
  plans = validated ? *validated : check_recipe_fits(recipe, cfg);
  eval_starts = heldout_windows(static_cast<int64_t>(data.heldout.size()), tc.seq_len,
                                cfg.eval.windows);
  if (eval_starts.empty())
    throw UserError("the held-out split has " + std::to_string(data.heldout.size()) +
                    " tokens, fewer than train.seq_len + 1 = " + std::to_string(tc.seq_len + 1) +
                    "; use more held-out text or a shorter seq_len");
  if (opt.save_every < 0 || opt.keep_checkpoints < 1 || opt.log_every < 1)
    throw UserError("train options: save_every >= 0, keep_checkpoints >= 1 and log_every >= 1 "
                    "required, got " + std::to_string(opt.save_every) + ", " +
                    std::to_string(opt.keep_checkpoints) + ", " + std::to_string(opt.log_every));
  n_ranks = dist::size();
  rank0 = dist::rank() == 0;
  if (!validated) check_process_count(cfg);
}

void TrainRun::restore() {
  model.emplace(cfg.model, plans, tc.micro(), tc.seq_len);
  model->init(tc.seed);
  opt_state.emplace(model->num_params(), tc);
  ranks = rank_references(recipe);
  sampler.emplace(data.train, tc.seq_len, tc.batch_size, tc.seed);
  config_text = run_config_to_toml(cfg), recipe_text = recipe_to_toml(recipe);
  // Checkpoints store these texts; a resume reloads them, so they must parse.
  (void)run_config_from_text(config_text, "the run config");
  (void)recipe_from_text(recipe_text, "the recipe " + recipe.name);
  data_key = data.cache_dir.filename().string();
  ckpt_dir = opt.out_dir / "checkpoints";
  metrics_file = opt.out_dir / "metrics.jsonl";
  tokenizer_copy = opt.out_dir / "tokenizer.model";
  if (!data.tokenizer_model.empty() && fs::exists(data.tokenizer_model))
    tokenizer_bytes = read_file_bytes(data.tokenizer_model);

  ck = opt.resume_from;
  start = ck ? static_cast<int>(ck->step) : 0;
  if (ck) check_and_load_checkpoint();
  const std::string metrics_note = ready_run_directory();
  inputs.resize(size_t(int64_t(tc.batch_size) * tc.seq_len));
  targets.resize(inputs.size());
  tokens_per_step = int64_t(tc.batch_size) * tc.seq_len;
  flops_per_token = model->flops_per_token(tc.seq_len);
  print_header(metrics_note);

  // The steps before the checkpoint.
  sum.resumed_from = start;
  train_seconds = ck ? ck->train_seconds : 0;
  window_seconds = 0;
  wall_before = ck ? ck->wall_seconds : 0;
  have_eval = false;
  if (ck) {
    sum.losses = ck->losses;
    if (!sum.losses.empty()) sum.first_loss = sum.losses[0];
    have_eval = !std::isnan(ck->val_nll);
    if (have_eval) {
      sum.heldout_nll = ck->val_nll;
      sum.heldout_nll_quant = ck->val_nll_quant;
    }
  }
  digest = ck ? ck->telemetry_digest : "";
}

// Resume: the checkpoint must belong to this run (same config, recipe, data), then the
// whole training state is restored: weights, AdamW moments, data-loader position, held amax
// caches. SR bits are counter-based on (seed, step, ...), so they need no state.
void TrainRun::check_and_load_checkpoint() {
  const std::string where = "cannot resume " + opt.out_dir.string() + " from its checkpoint at step " +
                            std::to_string(ck->step) + ": ";
  if (ck->config_toml != config_text)
    throw UserError(where + "the checkpoint's run config (config_toml) differs from the config "
                    "given; resume with the run's own config.toml, unchanged");
  if (ck->recipe_toml != recipe_text)
    throw UserError(where + "the checkpoint's recipe (recipe_toml) differs from the recipe "
                    "given; resume with the run's own recipe.toml, unchanged");
  if (ck->step > tc.steps)
    throw UserError(where + "it is beyond train.steps = " + std::to_string(tc.steps));
  // A compacted log (`fp4train compact`, finished runs only) is not cut or appended to.
  if (const fs::path z = opt.out_dir / kCompactMetricsFile; fs::exists(z))
    throw UserError(where + "its metrics log was compacted into " + z.string() +
                    ", which a resume does not append to; decompress it first (zstd -d --rm " +
                    z.string() + "), then resume (nothing was changed)");
  if (static_cast<int64_t>(ck->params.size()) != model->num_params())
    throw UserError(where + "it holds " + std::to_string(ck->params.size()) +
                    " parameters, the model has " + std::to_string(model->num_params()));
  if (ck->losses.size() != static_cast<size_t>(ck->step))
    throw UserError(where + "it lacks the training losses of steps 1.." + std::to_string(ck->step));
  if (!ck->data_key.empty() && ck->data_key != data_key &&
      std::find(data.key_aliases.begin(), data.key_aliases.end(), ck->data_key) == data.key_aliases.end())
    throw UserError(where + "the run was trained on data with token cache key " + ck->data_key +
                    ", the data given now has key " + data_key +
                    " (different corpus or tokenizer); pass --data with the run's corpus");
  if (fs::exists(tokenizer_copy) && read_file_bytes(tokenizer_copy) != tokenizer_bytes)
    throw UserError(where + "the tokenizer of the data given now differs from the run's " +
                    tokenizer_copy.string() + "; pass --data with the run's corpus");
  model->params() = ck->params;
  opt_state->m() = ck->adam_m;
  opt_state->v() = ck->adam_v;
  sampler->set_draws(ck->sampler_draws);
  auto& lin = model->linears();
  for (const HeldReference& r : ck->references) {
    size_t i = 0;
    while (i < lin.size() && model->linear_name(i) != r.linear) ++i;
    if (i == lin.size())
      throw UserError(where + "it holds a held amax for an unknown linear '" + r.linear + "'");
    lin[i].reference(static_cast<nn::Role>(r.role)).restore(r.has_value, r.last_refresh, r.held);
  }
}

// The run directory, locked for this process, with the run's files; metrics.jsonl opened for
// appending (cut back to the checkpoint's step on a resume). Returns the note of that cut.
std::string TrainRun::ready_run_directory() {
  // Every rank has loaded what it needs (a resume's checkpoint) before rank 0 changes files.
  dist::barrier();
  if (!ck && rank0) fs::create_directories(opt.out_dir);
  // One process per run directory: refused here, before any file of the run changes (and
  // before dir_ready, so the refusal writes no error.txt into the other process's run).
  if (rank0) dir_lock = std::make_unique<RunDirLock>(opt.out_dir, "wait for it to finish or stop it, then resume");
  st.dir_ready = true;  // a resumed run's directory exists already
  if (ck && rank0) {
    // Newer checkpoints than the one resumed from did not load: keep them aside, do not count
    // them when pruning; leftovers of interrupted writes go.
    for (const fs::path& p : list_checkpoints(opt.out_dir)) {
      long long s = 0;
      const std::string n = p.filename().string();
      if (std::sscanf(n.c_str(), "step_%lld", &s) == 1 && s > ck->step) {
        fs::rename(p, p.string() + ".corrupt");
        std::fprintf(stderr, "warning: renamed the unusable checkpoint %s to %s.corrupt\n",
                     p.string().c_str(), n.c_str());
      }
    }
    // A kill between a checkpoint's rename and the pruning after it leaves one too many;
    // a resume with nothing left to train (killed in summary.json) would keep it.
    prune_checkpoints(opt.out_dir, opt.keep_checkpoints, opt.keep_steps);
    // Temporaries of writes cut off by a kill (AtomicFile's <file>.tmp: a checkpoint, the
    // metrics.jsonl rewrite below, summary.json, ...) in the checkpoint and run directories.
    for (const fs::path& dir : {ckpt_dir, opt.out_dir}) {
      std::error_code ec;
      std::vector<fs::path> stale;
      for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator();
           it.increment(ec))
        if (it->path().extension() == ".tmp" && it->is_regular_file(ec)) stale.push_back(it->path());
      for (const fs::path& p : stale) fs::remove(p, ec);
    }
    // The error.txt of an earlier failure (a full disk, ...) no longer describes the run,
    // which continues now (a divergence, met again, writes it again).
    std::error_code ec;
    fs::remove(opt.out_dir / "error.txt", ec);
  }
  std::string metrics_note;
  if (rank0) {
    if (!ck || !fs::exists(opt.out_dir / "config.toml"))
      write_file_atomic(opt.out_dir / "config.toml", config_text);
    if (!ck || !fs::exists(opt.out_dir / "recipe.toml"))
      write_file_atomic(opt.out_dir / "recipe.toml", recipe_text);
    if (!tokenizer_bytes.empty() && (!ck || !fs::exists(tokenizer_copy)))
      write_file_atomic(tokenizer_copy, tokenizer_bytes);
    if (ck) metrics_note = cut_metrics(metrics_file, ck->step);
    metrics.open(metrics_file, /*truncate=*/!ck);
  }
  return metrics_note;
}

// The run's header: the model and recipe line, the compute paths (kept for summary.json),
// and on a resume where it continues.
void TrainRun::print_header(const std::string& metrics_note) {
  {
    std::ostringstream o;
    o << "model: " << model->num_params() << " parameters (" << model->num_body_params()
      << " in blocks), " << model->n_blocks() << " blocks " << model->pattern() << ", d_model "
      << cfg.model.d_model << "; ";
    // The recipe's per-block modes, then one line per [[override]] with the linears it hit.
    const std::string plans = describe_linear_plans(recipe, *model);
    const size_t nl = plans.find('\n');
    o << plans.substr(0, nl) << "; " << tokens_per_step << " tokens/step";
    if (tc.n_micro() > 1 || n_ranks > 1)
      o << " (" << tc.n_micro() << " micro-batches of " << tc.micro() << " sequences"
        << (n_ranks > 1 ? ", " + std::to_string(tc.n_micro() / n_ranks) + " on each of " +
                              std::to_string(n_ranks) + " processes"
                        : std::string())
        << ")";
    o << ", " << tc.steps << " steps";
    if (nl != std::string::npos) o << plans.substr(nl);
    log(o.str());
  }
  compute = prof::compute_paths();
  log("compute: " + compute.line());
  slow_path = slow_quantizer_paths(model->resolved_linears());
  if (rank0 && !slow_path.empty())
    std::fprintf(stderr,
                 "warning: slow quantizer path (the fused SIMD kernels do not cover it, so step "
                 "times are longer, not the machine busier): %s\n",
                 slow_path.c_str());

  if (ck) {
    log("resumed at step " + std::to_string(start) + " of " + std::to_string(tc.steps) + "; " +
        metrics_note);
    if (rank0 && ck->references.empty() && recipe.mode == LinearMode::FP4 && recipe.amax_interval > 1)
      std::fprintf(stderr,
                   "warning: the checkpoint holds no amax caches (saved with --no-save-amax): "
                   "they refresh at step %d, so this run is not bit-exact with an "
                   "uninterrupted one\n", start + 1);
  }
}

double TrainRun::mfu(double tokens_per_s) const {
  return opt.peak_gflops > 0 ? flops_per_token * tokens_per_s / (opt.peak_gflops * 1e9) : 0.0;
}

void TrainRun::log(const std::string& s) const {
  if (!opt.quiet && rank0) {
    std::printf("%s\n", s.c_str());
    std::fflush(stdout);
  }
}

bool TrainRun::loop() {
  last_print = clock::now();
  worst_load = machine_load();
  t_start = clock::now();
  for (int step = start + 1; step <= tc.steps; ++step) {
    st.step = step;
    const auto t0 = clock::now();
    const StepResult r = train_step(*model, *opt_state, *sampler, cfg, recipe, step, inputs,
                                    targets, step_buffers, ranks.get());
    if (!r.diverged.empty()) stop_diverged(step, r);
    const double loss = r.loss, gnorm = r.grad_norm, lr = r.lr;
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
    if (opt.peak_gflops > 0) rec["mfu"] = mfu(tokens_per_step / dt);
    const double since = std::chrono::duration<double>(clock::now() - last_print).count();
    if (since >= cfg.progress_seconds || step == start + 1 || step == tc.steps)
      progress_line(step, r);
    if (r.telemetry) {
      rec["telemetry"] = train_detail::telemetry_record(*model, digest);
      rec["scale_hist"] = train_detail::scale_hist_record(*model);
    }
    const bool eval_step = step % cfg.eval.interval == 0 || step == tc.steps;
    if (eval_step) {
      evaluate(step, rec);
      if (!digest.empty()) log(digest);
    }
    // A step's line is written (to the OS) before its checkpoint is written, so a resume
    // after a kill finds every line up to the checkpoint step.
    if (rank0 && (step % opt.log_every == 0 || eval_step || r.telemetry))
      metrics.append(rec.dump() + "\n");
    const bool due = (opt.save_every > 0 && step % opt.save_every == 0) || step == tc.steps ||
                     std::find(opt.keep_steps.begin(), opt.keep_steps.end(), step) !=
                         opt.keep_steps.end();
    if (due) save(step);
    if (step == opt.stop_after) {
      sum.stopped = true;
      sum.steps = step;
      return false;
    }
    // A stop request (SIGINT/SIGTERM) between steps: this step is complete and logged, so its
    // checkpoint is a consistent resume point. The last step completes the run instead.
    // Under MPI every rank must stop after the same step: the flag is MAX-reduced each step
    // (mpirun forwards SIGUSR1 to every rank; a rank's own SIGINT/SIGTERM works too).
    int stop_flag = opt.stop_signal ? int(*opt.stop_signal) : 0;
    if (n_ranks > 1) stop_flag = int(dist::max_over_ranks(float(stop_flag)));
    if (stop_flag != 0 && step < tc.steps) {
      if (!due) save(step);
      dist::barrier();  // rank 0's checkpoint is complete before any rank exits
      sum.stopped = true;
      sum.stop_signal = stop_flag;
      sum.steps = step;
      sum.checkpoint = ckpt_dir / checkpoint_file_name(step);
      return false;
    }
  }
  return true;
}

// A diverged run stops with the step named; metrics so far are kept, no summary written.
void TrainRun::stop_diverged(int step, const StepResult& r) {
  const std::string msg = r.diverged + " at step " + std::to_string(step) + " with recipe " +
                          recipe.name + "; the run diverged. Metrics up to step " +
                          std::to_string(step - 1) + " are in " +
                          (opt.out_dir / "metrics.jsonl").string();
  st.error_written = true;
  if (r.diverged_on_this_rank) {
    // Met in this rank's micro-batches (the others may be waiting in a collective, or
    // may have met it too): it writes error.txt through a temporary of its own (ranks
    // racing on one .tmp name would fail) and ends every process.
    write_error_of_rank(opt.out_dir / "error.txt", msg);
    dist::abort_all(msg, 2);
  }
  // Met on every rank alike (the reduced gradient's norm, or one process): rank 0
  // writes error.txt, and no rank ends the run before it has.
  if (rank0) write_file_atomic(opt.out_dir / "error.txt", msg + "\n");
  dist::barrier();
  throw UserError(msg);
}

// The progress line of `step` (tokens/s over the steps since the last one), marked "| busy"
// when the machine is busy, after one note that says what the mark means.
void TrainRun::progress_line(int step, const StepResult& r) {
  const double loss = r.loss, gnorm = r.grad_norm, lr = r.lr;
  const double tps = window_tokens / std::max(window_seconds, 1e-9);
  const double eta = (tc.steps - step) * (train_seconds / step);
  char b[240], m[32] = "";
  if (opt.peak_gflops > 0) std::snprintf(m, sizeof m, " (MFU %.0f%%)", 100 * mfu(tps));
  std::snprintf(b, sizeof b,
                "step %*d/%d | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s%s | ETA %s",
                int(std::to_string(tc.steps).size()), step, tc.steps, loss, lr, gnorm, tps, m,
                duration_words(eta).c_str());
  const MachineLoad ml = machine_load();
  if (ml.load1 > worst_load.load1) worst_load = ml;
  if (ml.busy() && !busy_noted) {
    log("note: busy machine (" + ml.describe() + "): tokens/s and ETA unreliable; progress "
        "lines taken while it stays busy end in '| busy'");
    busy_noted = true;
  }
  log(ml.busy() ? std::string(b) + " | busy" : std::string(b));
  last_print = clock::now();
  window_seconds = 0;
  window_tokens = 0;
}

// A NaN/Inf met inside an evaluation (e.g. a quantized forward overflowing in a diverging
// run) makes that NLL NaN (JSON null) instead of stopping the run; training itself stops
// on its own non-finite checks.
// Evaluation batches of micro_batch_size windows (the model's batch), spread over the ranks
// round-robin; their sums are added in batch order, so the NLL is the one-process value.
double TrainRun::safe_nll(bool quantize) {
  if (n_ranks == 1) {
    try {
      return heldout_nll(*model, data.heldout, eval_starts, tc.seq_len, tc.micro(), quantize);
    } catch (const NonFiniteError&) {
      return std::numeric_limits<double>::quiet_NaN();
    }
  }
  EvalPolicy policy;
  policy.kind = quantize ? EvalPolicy::Kind::Current : EvalPolicy::Kind::None;
  const EvalWindows w{&data.heldout, eval_starts};
  const int64_t nb = (int64_t(eval_starts.size()) + tc.micro() - 1) / tc.micro();
  const int64_t slots = (nb + n_ranks - 1) / n_ranks;
  std::vector<double> mine = nll_batch_sums(*model, w, tc.seq_len, tc.micro(), policy,
                                            dist::rank(), n_ranks);
  mine.resize(size_t(slots), 0.0);
  std::vector<double> all(size_t(slots) * size_t(n_ranks));
  dist::allgather(mine.data(), slots, all.data());
  double total = 0;
  for (int64_t b = 0; b < nb; ++b) total += all[size_t((b % n_ranks) * slots + b / n_ranks)];
  return total / double(eval_starts.size());
}

void TrainRun::evaluate(int step, json& rec) {
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
  have_eval = true;
}

void TrainRun::save_rank0(int step) {
  Checkpoint c;
  c.step = step;
  c.config_toml = config_text;
  c.recipe_toml = recipe_text;
  c.params = model->params();
  c.adam_m = opt_state->m();
  c.adam_v = opt_state->v();
  c.sampler_draws = sampler->draws();
  if (opt.save_amax)
    for (size_t i = 0; i < model->linears().size(); ++i)
      for (int r = 0; r < nn::kRoleCount; ++r) {
        const TensorReference& t = model->linears()[i].reference(static_cast<nn::Role>(r));
        // A per-call D = 1 reference is measured afresh at every call, never reused: not
        // state (and under MPI each rank's last one is its own micro-batch's).
        if (t.interval() == 1 && recipe.amax_sample == AmaxSample::PerCall) continue;
        if (t.has_value())
          c.references.push_back({model->linear_name(i), r, true, t.last_refresh(), t.held()});
      }
  c.losses = sum.losses;
  c.train_seconds = train_seconds;
  c.wall_seconds = wall_before + std::chrono::duration<double>(clock::now() - t_start).count();
  if (have_eval) {
    c.val_nll = sum.heldout_nll;
    c.val_nll_quant = sum.heldout_nll_quant;
  }
  c.telemetry_digest = digest;
  c.data_key = data_key;
  c.config_name = opt.config_name;
  c.save_every = opt.save_every;
  c.keep_checkpoints = opt.keep_checkpoints;
  c.log_every = opt.log_every;
  c.save_amax = opt.save_amax;
  // metrics.jsonl (each line written to the OS at once) reaches the disk before the
  // checkpoint that a resume cuts it back to: after a power cut it holds every line up to
  // that step.
  metrics.sync();
  fs::create_directories(ckpt_dir);
  save_checkpoint(ckpt_dir / checkpoint_file_name(step), c);
  prune_checkpoints(opt.out_dir, opt.keep_checkpoints, opt.keep_steps);
}

void TrainRun::save(int step) {
  if (rank0) save_rank0(step);
}

void TrainRun::finish() {
  // The final window: train.final_window (default: the last 10%, max(1, n / 10) steps).
  const int n = tc.steps, w = tc.final_window_steps();
  double s = 0;
  for (int i = n - w; i < n; ++i) s += sum.losses[i];
  sum.steps = n;
  sum.final_window_steps = w;
  sum.final_window_loss = s / w;
  sum.tokens_per_s = double(n) * tokens_per_step / std::max(train_seconds, 1e-9);
  sum.mfu = mfu(sum.tokens_per_s);
  json js = {{"status", "completed"},
             {"recipe", recipe.name},
             {"config", opt.config_name},
             {"steps", n},
             {"seed", tc.seed},
             {"tokens", int64_t(n) * tokens_per_step},
             {"parameters", model->num_params()},
             {"first_loss", sum.first_loss},
             {"final_window_loss", sum.final_window_loss},
             {"final_window_steps", w},
             {"heldout_nll", sum.heldout_nll},
             {"heldout_nll_quant", sum.heldout_nll_quant},
             {"heldout_tokens", int64_t(eval_starts.size()) * tc.seq_len},
             {"tokens_per_s", sum.tokens_per_s},
             {"model_flops_per_token", flops_per_token},
             {"wall_seconds",
              wall_before + std::chrono::duration<double>(clock::now() - t_start).count()}};
  if (const char* g = fp4_gemm_of(recipe, *model)) js["fp4_gemm"] = g;
  if (tc.sr_seed >= 0) js["sr_seed"] = tc.sr_seed;
  if (start > 0) js["resumed_from_step"] = start;
  if (opt.peak_gflops > 0) {
    js["peak_gflops"] = opt.peak_gflops;
    js["mfu"] = sum.mfu;
  }
  for (const auto& [k, v] : compute.fields()) js["compute"][k] = v;
  if (!slow_path.empty()) js["slow_path"] = slow_path;
  if (const MachineLoad ml = machine_load(); ml.load1 > worst_load.load1) worst_load = ml;
  js["machine_load"] = {{"max_load1", worst_load.load1},
                        {"cores", worst_load.cores},
                        {"threads", omp_get_max_threads()},
                        {"busy", worst_load.busy()}};
  if (rank0) write_file_atomic(opt.out_dir / "summary.json", js.dump(2) + "\n");
}

// One train() call, stage by stage (TrainRun).
TrainSummary train_run(const RunConfig& cfg, const Recipe& recipe, const TokenData& data,
                       const TrainOptions& opt, const ResolvedLinears* validated, RunState& st) {
  TrainRun run(cfg, recipe, data, opt, st);
  run.validate(validated);
  run.restore();
  if (run.loop()) run.finish();
  return std::move(run.sum);
}

// train_run, with error.txt for a failure once the run directory exists.
TrainSummary train_with_error_txt(const RunConfig& cfg, const Recipe& recipe,
                                  const TokenData& data, const TrainOptions& opt,
                                  const ResolvedLinears* validated) {
  RunState st;
  try {
    return train_run(cfg, recipe, data, opt, validated, st);
  } catch (const std::exception& e) {
    // A run that fails once its directory exists (a oneDNN error at step 1, a full disk, a
    // checkpoint that cannot be written, ...) leaves error.txt naming the cause, as a diverged
    // run does. Failures of the checks before any file is written leave no directory.
    if (st.dir_ready && !st.error_written && dist::rank() == 0) {
      const std::string when =
          st.step == 0 ? std::string("before the first step")
                       : "in step " + std::to_string(st.step) + " of " + std::to_string(cfg.train.steps);
      const std::string msg = std::string(kRunFailedPrefix) + when + " (recipe " + recipe.name +
                              "): " + e.what() + "; not a divergence: fix the cause and start "
                              "the run again";
      try {
        write_file_atomic(opt.out_dir / "error.txt", msg + "\n");
      } catch (const std::exception&) {
        // The original error is the one to report.
      }
    }
    throw;
  }
}
}  // namespace

TrainSummary train(const RunConfig& cfg, const Recipe& recipe, const TokenData& data,
                   const TrainOptions& opt) {
  return train_with_error_txt(cfg, recipe, data, opt, /*validated=*/nullptr);
}

TrainSummary train(const ValidatedRun& run, const TokenData& data, const TrainOptions& opt) {
  return train_with_error_txt(run.config(), run.recipe(), data, opt, &run.plans());
}

}  // namespace fp4
