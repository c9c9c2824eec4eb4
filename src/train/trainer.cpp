// The training loop: batches → forward → loss → backward → clip → AdamW, with progress
// lines, metrics.jsonl, periodic held-out evaluation and a final summary.
#include <fcntl.h>
#include <sys/file.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
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
#include "fp4/base/safetensors.h"
#include "fp4/numerics/telemetry.h"
#include "fp4/train/train.h"

namespace fp4 {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
// An exclusive advisory lock on DIR/.fp4train.lock, held while one process trains into DIR
// (flock: the kernel releases it when the process ends, however it ends, so a killed run
// never leaves a stale lock). A second `train --resume DIR` or `train --out DIR` started
// while the first runs is refused before it changes any file.
class RunDirLock {
 public:
  explicit RunDirLock(const fs::path& dir) {
    const fs::path p = dir / ".fp4train.lock";
    fd_ = ::open(p.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0)
      throw UserError("cannot open " + p.string() + ": " + std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
      ::close(fd_);
      fd_ = -1;
      if (e == EWOULDBLOCK)
        throw UserError(dir.string() + " is in use by another fp4train process (it holds " +
                        p.string() + "); wait for it to finish or stop it, then resume");
      throw UserError("cannot lock " + p.string() + ": " + std::strerror(e));
    }
  }
  ~RunDirLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock
  }
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  int fd_ = -1;
};
}  // namespace

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
// {"layers.0.mixer.q_proj": {"x": {...}, "w": ..., "dy": ..., "dyt": ..., "xt": ...}, ...} for every
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
      json& op = layer[nn::LinearTelemetry::kNames[o]];
      op = {{"saturated_blocks", s.saturated_blocks},
            {"zero_guard_blocks", s.zero_guard_blocks},
            {"zeroed_nonzeros", s.zeroed_nonzeros},
            {"rel_error", s.rel_error}};
      if (s.has_staleness) op["staleness"] = s.staleness;  // absent under the MX rules
      upd(err, s.rel_error, where);
      upd(sat, s.saturated_blocks, where);
      upd(guard, s.zero_guard_blocks, where);
      upd(zeroed, s.zeroed_nonzeros, where);
      if (s.has_staleness) upd(stale, s.staleness, where);
    }
    t[name] = layer;
  }
  if (err.v >= 0) {
    char b[512];
    std::snprintf(b, sizeof b,
                  "numerics | worst rel. error %.4f (%s) | saturated scales %.2f%% (%s) | "
                  "zero-guard %.2f%% | nonzeros to 0 %.1f%% (%s)",
                  err.v, err.where.c_str(), 100 * sat.v, sat.where.c_str(), 100 * guard.v,
                  100 * zeroed.v, zeroed.where.c_str());
    digest = b;
    if (stale.v >= 0) {  // no operand has one under the MX rules
      std::snprintf(b, sizeof b, " | amax/held %.2f (%s)", stale.v, stale.where.c_str());
      digest += b;
    }
  }
  return t;
}

// Where the blocks fall (issue 13 §3), on a telemetry step: for each operand role, the
// histograms of QuantStats summed over every FP4 linear of that role and scale format, and
// the same for the model's final down_proj alone (the reference implementation captures
// those). Dense from the first to the last nonzero bin, to keep metrics.jsonl small:
//   [{"linears": "all" | NAME, "operand": "x" | "w" | "dy" | "dyt" | "xt",
//     "scale_format": "ue5m3", "exp_bits": 5, "frac_bits": 3, "bias": 15, "subnormals": true,
//     "scale_min": min subnormal, "scale_max": max finite,
//     "scale_code_first": c0, "scale_code_blocks": [blocks at code c0, c0 + 1, ...],
//     "zero_blocks": all-zero blocks, "guarded_blocks": blocks whose scale underflowed
//     (neither is in scale_code_blocks: both store the guard's 1.0),
//     "ratio_to": "g" | "amax", "log2_ratio_first": b0,
//     "log2_ratio_blocks": [blocks with floor(log2(a_b / r)) = b0, b0 + 1, ...]}, ...]
// A code decodes as (1 + m/2^M)·2^(e − bias), or (m/2^M)·2^(1 − bias) for e = 0 with
// subnormals (e = code >> M, m = code mod 2^M; docs/formats.md).
json scale_hist_record(const nn::Model& model) {
  struct Acc {
    const FloatFormat* fmt = nullptr;
    bool ratio_to_g = true;
    std::array<uint64_t, 256> codes{};
    std::array<uint64_t, QuantStats::kRatioBins> ratio{};
    uint64_t zero = 0, guarded = 0;
  };
  auto add = [](Acc& a, const QuantStats& s) {
    a.fmt = s.scale_format;
    a.ratio_to_g = s.ratio_to_g;
    for (size_t c = 0; c < a.codes.size(); ++c) a.codes[c] += s.scale_code_blocks[c];
    for (size_t b = 0; b < a.ratio.size(); ++b) a.ratio[b] += s.log2_amax_ratio_blocks[b];
    a.zero += s.zero_blocks;
    a.guarded += s.guarded_blocks;
  };
  auto dense = [](const auto& h, int offset, json& first, json& blocks) {
    size_t lo = h.size(), hi = 0;
    for (size_t i = 0; i < h.size(); ++i)
      if (h[i]) lo = std::min(lo, i), hi = i;
    blocks = json::array();
    first = lo < h.size() ? int(lo) - offset : 0;
    for (size_t i = lo; i <= hi && lo < h.size(); ++i) blocks.push_back(h[i]);
  };
  auto to_json = [&](const std::string& linears, const char* operand, const Acc& a) {
    const FloatFormat& f = *a.fmt;
    json j{{"linears", linears},     {"operand", operand},
           {"scale_format", f.name}, {"exp_bits", f.exp_bits},
           {"frac_bits", f.frac_bits}, {"bias", f.bias},
           {"subnormals", f.subnormals}, {"scale_min", double(format_min_subnormal(f))},
           {"scale_max", double(f.max_finite)}, {"ratio_to", a.ratio_to_g ? "g" : "amax"},
           {"zero_blocks", a.zero},  {"guarded_blocks", a.guarded}};
    dense(a.codes, 0, j["scale_code_first"], j["scale_code_blocks"]);
    dense(a.ratio, QuantStats::kRatioBias, j["log2_ratio_first"], j["log2_ratio_blocks"]);
    return j;
  };
  constexpr int kO = nn::LinearTelemetry::kOperands;
  std::vector<std::pair<std::string, Acc>> all[kO];  // per operand: per scale format
  int last_down = -1;
  for (size_t i = 0; i < model.linears().size(); ++i) {
    const auto& tel = model.linears()[i].telemetry();
    if (!tel.valid) continue;
    const std::string name = model.linear_name(i);
    if (name.size() >= 9 && name.compare(name.size() - 9, 9, "down_proj") == 0) last_down = int(i);
    for (int o = 0; o < kO; ++o) {
      const QuantStats& s = tel.op[o];
      if (!s.scale_format) continue;
      auto& v = all[o];
      auto it = std::find_if(v.begin(), v.end(),
                             [&](const auto& e) { return e.first == s.scale_format->name; });
      if (it == v.end()) it = v.insert(v.end(), {s.scale_format->name, Acc{}});
      add(it->second, s);
    }
  }
  json out = json::array();
  for (int o = 0; o < kO; ++o)
    for (const auto& [fmt, acc] : all[o]) out.push_back(to_json("all", nn::LinearTelemetry::kNames[o], acc));
  if (last_down >= 0) {
    const auto& tel = model.linears()[size_t(last_down)].telemetry();
    for (int o = 0; o < kO; ++o) {
      if (!tel.op[o].scale_format) continue;
      Acc a;
      add(a, tel.op[o]);
      out.push_back(to_json(model.linear_name(size_t(last_down)), nn::LinearTelemetry::kNames[o], a));
    }
  }
  return out;
}
}  // namespace

void check_recipe_fits(const Recipe& recipe, const RunConfig& cfg) {
  // Block indices, final_blocks (recipe and overrides), and overrides that change no linear.
  const ResolvedLinears res =
      resolve_linear_plans(recipe, nn::Model::linear_sites(cfg.model), cfg.model.n_blocks());
  bool fp4_rht = false;
  for (const LinearPlan& p : res.plans) fp4_rht |= p.rht();
  // The RHT runs along the tokens of one forward: a micro-batch.
  const int64_t tokens = int64_t(cfg.train.micro()) * cfg.train.seq_len;
  if (fp4_rht && tokens % 16 != 0)
    throw UserError(recipe.where() + " applies the 16-point RHT along tokens (fp4.rht_wgrad): " +
                    (cfg.train.micro() == cfg.train.batch_size ? "train.batch_size"
                                                               : "train.micro_batch_size") +
                    " × train.seq_len = " + std::to_string(tokens) + " must be a multiple of 16");
}

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

namespace {
// A non-finite loss or tensor met in one micro-batch of this process.
struct MicroDiverged {
  std::string what;
};

// The data-parallel agreement on references (Recipe::amax_ranks).
class MpiReferences final : public nn::RankReferences {
 public:
  explicit MpiReferences(AmaxRanks rule) : rule_(rule) {}
  float agree(float local, bool sample) override {
    if (rule_ == AmaxRanks::Max) return dist::max_over_ranks(local);
    return sample ? dist::bcast_from_rank0(local) : local;
  }

 private:
  AmaxRanks rule_;
};

// Micro-batch m of the step (this process's first is `first`): forward and backward from
// zeroed gradients; its gradient is then in model.grads(). Throws MicroDiverged.
double run_micro(nn::Model& model, nn::StepContext& ctx, const int32_t* inputs,
                 const int32_t* targets, int micro, int64_t rows, int m, int first) {
  model.zero_grad();
  ctx.micro = m;
  ctx.first_micro = m == first;
  try {
    const double loss =
        model.forward(inputs + int64_t(m) * rows, targets + int64_t(m) * rows, micro, ctx);
    if (!std::isfinite(loss))
      throw MicroDiverged{"non-finite training loss (" + std::to_string(loss) +
                          ") in micro-batch " + std::to_string(m)};
    model.backward(ctx);
    return loss;
  } catch (const NonFiniteError& e) {
    throw MicroDiverged{std::string("non-finite tensor (") + e.what() + ") in micro-batch " +
                        std::to_string(m)};
  }
}
}  // namespace

void check_process_count(const RunConfig& cfg, bool resume) {
  const int n = cfg.train.n_micro(), P = dist::size();
  if (n % P == 0) return;
  throw UserError("train.batch_size / train.micro_batch_size = " + std::to_string(n) +
                  " micro-batches per step cannot be spread evenly over " + std::to_string(P) +
                  " processes (mpirun -np): use a process count that divides it" +
                  (resume ? std::string(" (a resumed run keeps its micro-batches)")
                          : std::string(", or change train.micro_batch_size")));
}

std::unique_ptr<nn::RankReferences> rank_references(const Recipe& recipe) {
  if (dist::size() == 1) return nullptr;
  return std::make_unique<MpiReferences>(recipe.amax_ranks);
}

StepResult train_step(nn::Model& model, AdamW& optimizer, BatchSampler& sampler,
                      const RunConfig& cfg, const Recipe& recipe, int step,
                      std::vector<int32_t>& inputs, std::vector<int32_t>& targets) {
  thread_local StepBuffers buffers;
  MpiReferences ranks(recipe.amax_ranks);  // agrees across processes under mpirun
  return train_step(model, optimizer, sampler, cfg, recipe, step, inputs, targets, buffers,
                    dist::size() > 1 ? &ranks : nullptr);
}

StepResult train_step(nn::Model& model, AdamW& optimizer, BatchSampler& sampler,
                      const RunConfig& cfg, const Recipe& recipe, int step,
                      std::vector<int32_t>& inputs, std::vector<int32_t>& targets,
                      StepBuffers& buf, nn::RankReferences* ranks) {
  using prof::Cat;
  using prof::Scope;
  const auto& tc = cfg.train;
  check_process_count(cfg);
  const int n = tc.n_micro(), P = dist::size();
  StepResult r;
  {
    Scope s(Cat::kData);
    sampler.next(inputs.data(), targets.data());
  }
  nn::StepContext ctx;
  ctx.step = step;
  ctx.seed = tc.sr_key_seed();
  ctx.ranks = ranks;
  ctx.telemetry = r.telemetry = cfg.telemetry_interval > 0 && recipe.mode == LinearMode::FP4 &&
                                (step == 1 || step % cfg.telemetry_interval == 0);
  const int64_t len = model.num_params();
  if (n == 1 && P == 1) {
    // One forward per step: the gradient is the model's own.
    model.zero_grad();
    try {
      r.loss = model.forward(inputs.data(), targets.data(), tc.batch_size, ctx);
      if (!std::isfinite(r.loss)) {
        r.diverged = "non-finite training loss (" + std::to_string(r.loss) + ")";
        return r;
      }
      model.backward(ctx);
    } catch (const NonFiniteError& e) {
      // A quantizer met NaN/Inf activations or gradients before the loss showed it.
      r.diverged = std::string("non-finite tensor (") + e.what() + ")";
      return r;
    }
  } else {
    const int k = n / P, a = dist::rank() * k, b = a + k;
    if (!buf.tree || buf.tree_n != n || buf.tree_a != a ||
        buf.tree_len != len) {
      buf.tree = std::make_unique<dist::TreeAccumulator>(n, a, b, len);
      buf.tree_n = n, buf.tree_a = a, buf.tree_len = len;
    }
    buf.tree->reset();
    buf.losses.resize(size_t(k));
    const int64_t rows = int64_t(tc.micro()) * tc.seq_len;
    try {
      for (int m = a; m < b; ++m) {
        buf.losses[size_t(m - a)] =
            run_micro(model, ctx, inputs.data(), targets.data(), tc.micro(), rows, m, a);
        prof::Scope s(Cat::kOther);
        buf.tree->add(model.grads().data());
      }
    } catch (const MicroDiverged& e) {
      r.diverged = e.what;
      r.diverged_on_this_rank = P > 1;
      return r;
    }
    dist::reduce_mean(n, buf.tree->node_sums(), len, model.grads().data());
    // The step's loss: the mean of the micro-batch losses, in micro-batch order.
    buf.all_losses.resize(size_t(n));
    dist::allgather(buf.losses.data(), k, buf.all_losses.data());
    double sum = 0;
    for (int m = 0; m < n; ++m) sum += buf.all_losses[size_t(m)];
    r.loss = sum / n;
    if (ctx.telemetry && P > 1) {
      // The worst of every statistic over the ranks (each holds the worst of its micro-batches).
      constexpr int kF = 6, kO = nn::LinearTelemetry::kOperands;
      auto& lin = model.linears();
      buf.tel.assign(lin.size() * kO * kF, 0.0);
      for (size_t i = 0; i < lin.size(); ++i)
        for (int o = 0; o < kO; ++o) {
          const QuantStats& q = lin[i].telemetry().op[o];
          double* t = &buf.tel[(i * kO + size_t(o)) * kF];
          t[0] = q.saturated_blocks, t[1] = q.zero_guard_blocks, t[2] = q.zeroed_nonzeros;
          t[3] = q.rel_error, t[4] = q.staleness, t[5] = q.has_staleness ? 1 : 0;
        }
      dist::max_over_ranks(buf.tel.data(), int64_t(buf.tel.size()));
      for (size_t i = 0; i < lin.size(); ++i)
        for (int o = 0; o < kO; ++o) {
          QuantStats& q = lin[i].telemetry_for_reduction().op[o];
          const double* t = &buf.tel[(i * kO + size_t(o)) * kF];
          q.saturated_blocks = t[0], q.zero_guard_blocks = t[1], q.zeroed_nonzeros = t[2];
          q.rel_error = t[3], q.staleness = t[4], q.has_staleness = t[5] != 0;
        }
    }
  }
  {
    Scope s(Cat::kGradClip);
    r.grad_norm = clip_grad_norm(model.grads().data(), model.num_params(), tc.grad_clip);
  }
  r.lr = wsd_lr(tc, step);
  if (!std::isfinite(r.grad_norm)) {
    r.diverged = "non-finite gradient norm";
    return r;
  }
  Scope s(Cat::kOptimizer);
  optimizer.step(model.params().data(), model.grads().data(), model.param_infos(), r.lr, step);
  return r;
}

namespace {
// What train() needs to know when train_run throws: whether the run directory exists yet,
// the step being run, and whether error.txt was already written (a diverged run).
struct RunState {
  bool dir_ready = false, error_written = false;
  int step = 0;
};

TrainSummary train_run(const RunConfig& cfg, const Recipe& recipe, const TokenData& data,
                       const TrainOptions& opt, RunState& st) {
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
  if (opt.save_every < 0 || opt.keep_checkpoints < 1 || opt.log_every < 1)
    throw UserError("train options: save_every >= 0, keep_checkpoints >= 1 and log_every >= 1 "
                    "required, got " + std::to_string(opt.save_every) + ", " +
                    std::to_string(opt.keep_checkpoints) + ", " + std::to_string(opt.log_every));
  const int n_ranks = dist::size();
  const bool rank0 = dist::rank() == 0;  // the only rank that writes files and prints
  check_process_count(cfg);
  nn::Model model(cfg.model, recipe, tc.micro(), tc.seq_len);
  model.init(tc.seed);
  AdamW opt_state(model.num_params(), tc);
  const std::unique_ptr<nn::RankReferences> ranks = rank_references(recipe);
  StepBuffers step_buffers;
  BatchSampler sampler(data.train, tc.seq_len, tc.batch_size, tc.seed);
  const std::string config_text = run_config_to_toml(cfg), recipe_text = recipe_to_toml(recipe);
  // Checkpoints store these texts; a resume reloads them, so they must parse.
  (void)run_config_from_text(config_text, "the run config");
  (void)recipe_from_text(recipe_text, "the recipe " + recipe.name);
  const std::string data_key = data.cache_dir.filename().string();
  const fs::path ckpt_dir = opt.out_dir / "checkpoints";
  const fs::path metrics_file = opt.out_dir / "metrics.jsonl";
  const fs::path tokenizer_copy = opt.out_dir / "tokenizer.model";
  std::string tokenizer_bytes;
  if (!data.tokenizer_model.empty() && fs::exists(data.tokenizer_model))
    tokenizer_bytes = read_file_bytes(data.tokenizer_model);

  // Resume: the checkpoint must belong to this run (same config, recipe, data), then the
  // whole training state is restored: weights, AdamW moments, data-loader position, held amax
  // caches. SR bits are counter-based on (seed, step, ...), so they need no state.
  const Checkpoint* ck = opt.resume_from;
  const int start = ck ? static_cast<int>(ck->step) : 0;
  if (ck) {
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
    if (static_cast<int64_t>(ck->params.size()) != model.num_params())
      throw UserError(where + "it holds " + std::to_string(ck->params.size()) +
                      " parameters, the model has " + std::to_string(model.num_params()));
    if (ck->losses.size() != static_cast<size_t>(ck->step))
      throw UserError(where + "it lacks the training losses of steps 1.." + std::to_string(ck->step));
    if (!ck->data_key.empty() && ck->data_key != data_key)
      throw UserError(where + "the run was trained on data with token cache key " + ck->data_key +
                      ", the data given now has key " + data_key +
                      " (different corpus or tokenizer); pass --data with the run's corpus");
    if (fs::exists(tokenizer_copy) && read_file_bytes(tokenizer_copy) != tokenizer_bytes)
      throw UserError(where + "the tokenizer of the data given now differs from the run's " +
                      tokenizer_copy.string() + "; pass --data with the run's corpus");
    model.params() = ck->params;
    opt_state.m() = ck->adam_m;
    opt_state.v() = ck->adam_v;
    sampler.set_draws(ck->sampler_draws);
    auto& lin = model.linears();
    for (const HeldReference& r : ck->references) {
      size_t i = 0;
      while (i < lin.size() && model.linear_name(i) != r.linear) ++i;
      if (i == lin.size())
        throw UserError(where + "it holds a held amax for an unknown linear '" + r.linear + "'");
      lin[i].reference(static_cast<nn::Role>(r.role)).restore(r.has_value, r.last_refresh, r.held);
    }
  }

  // Every rank has loaded what it needs (a resume's checkpoint) before rank 0 changes files.
  dist::barrier();
  if (!ck && rank0) fs::create_directories(opt.out_dir);
  // One process per run directory: refused here, before any file of the run changes (and
  // before dir_ready, so the refusal writes no error.txt into the other process's run).
  std::unique_ptr<RunDirLock> dir_lock;
  if (rank0) dir_lock = std::make_unique<RunDirLock>(opt.out_dir);
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
    prune_checkpoints(opt.out_dir, opt.keep_checkpoints);
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
  AppendFile metrics;
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
  std::vector<int32_t> inputs(int64_t(tc.batch_size) * tc.seq_len), targets(inputs.size());
  const int64_t tokens_per_step = int64_t(tc.batch_size) * tc.seq_len;
  const double flops_per_token = model.flops_per_token(tc.seq_len);
  auto mfu = [&](double tokens_per_s) {
    return opt.peak_gflops > 0 ? flops_per_token * tokens_per_s / (opt.peak_gflops * 1e9) : 0.0;
  };

  auto log = [&](const std::string& s) {
    if (!opt.quiet && rank0) {
      std::printf("%s\n", s.c_str());
      std::fflush(stdout);
    }
  };
  {
    std::ostringstream o;
    o << "model: " << model.num_params() << " parameters (" << model.num_body_params()
      << " in blocks), " << model.n_blocks() << " blocks " << model.pattern() << ", d_model "
      << cfg.model.d_model << "; ";
    // The recipe's per-block modes, then one line per [[override]] with the linears it hit.
    const std::string plans = describe_linear_plans(recipe, model);
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
  const prof::ComputePaths compute = prof::compute_paths();
  log("compute: " + compute.line());

  if (ck) {
    log("resumed at step " + std::to_string(start) + " of " + std::to_string(tc.steps) + "; " +
        metrics_note);
    if (rank0 && ck->references.empty() && recipe.mode == LinearMode::FP4 && recipe.amax_interval > 1)
      std::fprintf(stderr,
                   "warning: the checkpoint holds no amax caches (saved with --no-save-amax): "
                   "they refresh at step %d, so this run is not bit-exact with an "
                   "uninterrupted one\n", start + 1);
  }

  TrainSummary sum;
  sum.resumed_from = start;
  double train_seconds = ck ? ck->train_seconds : 0, window_seconds = 0;
  const double wall_before = ck ? ck->wall_seconds : 0;
  bool have_eval = false;
  if (ck) {
    sum.losses = ck->losses;
    if (!sum.losses.empty()) sum.first_loss = sum.losses[0];
    have_eval = !std::isnan(ck->val_nll);
    if (have_eval) {
      sum.heldout_nll = ck->val_nll;
      sum.heldout_nll_quant = ck->val_nll_quant;
    }
  }
  int64_t window_tokens = 0;
  auto last_print = clock::now();
  // The busiest the machine was at a progress line or at the end (fp4/base/machine_load.h): step
  // times and tokens/s taken on a busy machine are marked as such in summary.json, the
  // progress line and compare's report.
  MachineLoad worst_load = machine_load();
  const auto t_start = clock::now();

  // A NaN/Inf met inside an evaluation (e.g. a quantized forward overflowing in a diverging
  // run) makes that NLL NaN (JSON null) instead of stopping the run; training itself stops
  // on its own non-finite checks.
  // Evaluation batches of micro_batch_size windows (the model's batch), spread over the ranks
  // round-robin; their sums are added in batch order, so the NLL is the one-process value.
  auto safe_nll = [&](bool quantize) {
    if (n_ranks == 1) {
      try {
        return heldout_nll(model, data.heldout, eval_starts, tc.seq_len, tc.micro(), quantize);
      } catch (const NonFiniteError&) {
        return std::numeric_limits<double>::quiet_NaN();
      }
    }
    EvalPolicy policy;
    policy.kind = quantize ? EvalPolicy::Kind::Current : EvalPolicy::Kind::None;
    const EvalWindows w{&data.heldout, eval_starts};
    const int64_t nb = (int64_t(eval_starts.size()) + tc.micro() - 1) / tc.micro();
    const int64_t slots = (nb + n_ranks - 1) / n_ranks;
    std::vector<double> mine = nll_batch_sums(model, w, tc.seq_len, tc.micro(), policy,
                                              dist::rank(), n_ranks);
    mine.resize(size_t(slots), 0.0);
    std::vector<double> all(size_t(slots) * size_t(n_ranks));
    dist::allgather(mine.data(), slots, all.data());
    double sum = 0;
    for (int64_t b = 0; b < nb; ++b) sum += all[size_t((b % n_ranks) * slots + b / n_ranks)];
    return sum / double(eval_starts.size());
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
    have_eval = true;
  };

  std::string digest = ck ? ck->telemetry_digest : "";  // worst layer at the latest telemetry step
  auto save_rank0 = [&](int step) {
    Checkpoint c;
    c.step = step;
    c.config_toml = config_text;
    c.recipe_toml = recipe_text;
    c.params = model.params();
    c.adam_m = opt_state.m();
    c.adam_v = opt_state.v();
    c.sampler_draws = sampler.draws();
    if (opt.save_amax)
      for (size_t i = 0; i < model.linears().size(); ++i)
        for (int r = 0; r < 5; ++r) {
          const TensorReference& t = model.linears()[i].reference(static_cast<nn::Role>(r));
          // A per-call D = 1 reference is measured afresh at every call, never reused: not
          // state (and under MPI each rank's last one is its own micro-batch's).
          if (t.interval() == 1 && recipe.amax_sample == AmaxSample::PerCall) continue;
          if (t.has_value())
            c.references.push_back({model.linear_name(i), r, true, t.last_refresh(), t.held()});
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
    prune_checkpoints(opt.out_dir, opt.keep_checkpoints);
  };
  auto save = [&](int step) {
    if (rank0) save_rank0(step);
  };

  for (int step = start + 1; step <= tc.steps; ++step) {
    st.step = step;
    const auto t0 = clock::now();
    const StepResult r = train_step(model, opt_state, sampler, cfg, recipe, step, inputs,
                                    targets, step_buffers, ranks.get());
    // A diverged run stops with the step named; metrics so far are kept, no summary written.
    if (!r.diverged.empty()) {
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
    if (since >= cfg.progress_seconds || step == start + 1 || step == tc.steps) {
      const double tps = window_tokens / std::max(window_seconds, 1e-9);
      const double eta = (tc.steps - step) * (train_seconds / step);
      char b[240], m[32] = "";
      if (opt.peak_gflops > 0) std::snprintf(m, sizeof m, " (MFU %.0f%%)", 100 * mfu(tps));
      std::snprintf(b, sizeof b,
                    "step %*d/%d | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s%s | ETA %s",
                    int(std::to_string(tc.steps).size()), step, tc.steps, loss, lr, gnorm, tps, m,
                    fmt_duration(eta).c_str());
      const MachineLoad ml = machine_load();
      if (ml.load1 > worst_load.load1) worst_load = ml;
      log(ml.busy() ? std::string(b) + " | busy machine (" + ml.describe() +
                          "): timings unreliable"
                    : std::string(b));
      last_print = clock::now();
      window_seconds = 0;
      window_tokens = 0;
    }
    if (r.telemetry) {
      rec["telemetry"] = telemetry_record(model, digest);
      rec["scale_hist"] = scale_hist_record(model);
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
    const bool due = (opt.save_every > 0 && step % opt.save_every == 0) || step == tc.steps;
    if (due) save(step);
    if (step == opt.stop_after) {
      sum.stopped = true;
      sum.steps = step;
      return sum;
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
      return sum;
    }
  }

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
             {"parameters", model.num_params()},
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
  if (tc.sr_seed >= 0) js["sr_seed"] = tc.sr_seed;
  if (start > 0) js["resumed_from_step"] = start;
  if (opt.peak_gflops > 0) {
    js["peak_gflops"] = opt.peak_gflops;
    js["mfu"] = sum.mfu;
  }
  for (const auto& [k, v] : compute.fields()) js["compute"][k] = v;
  if (const MachineLoad ml = machine_load(); ml.load1 > worst_load.load1) worst_load = ml;
  js["machine_load"] = {{"max_load1", worst_load.load1},
                        {"cores", worst_load.cores},
                        {"threads", omp_get_max_threads()},
                        {"busy", worst_load.busy()}};
  if (rank0) write_file_atomic(opt.out_dir / "summary.json", js.dump(2) + "\n");
  return sum;
}
}  // namespace

TrainSummary train(const RunConfig& cfg, const Recipe& recipe, const TokenData& data,
                   const TrainOptions& opt) {
  RunState st;
  try {
    return train_run(cfg, recipe, data, opt, st);
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

}  // namespace fp4
