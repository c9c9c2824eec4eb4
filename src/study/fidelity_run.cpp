// The fidelity panel's passes (run_fidelity; docs/fidelity.md "What it computes"): a private
// class FidelityRun, stage by stage as TrainRun (src/train/trainer.cpp) runs a training run:
// check_request → plan → execute → finish; write_fidelity_report (fidelity_report.cpp) is the
// report.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>

#include "fidelity_internal.h"
#include "fp4/base/error.h"
#include "fp4/data/data.h"
#include "fp4/dist/dist.h"
#include "fp4/eval/eval.h"
#include "fp4/gemm/machine.h"
#include "fp4/nn/model.h"
#include "fp4/numerics/telemetry.h"
#include "fp4/study/evaluate.h"
#include "fp4/train/checkpoint.h"
#include "fp4/train/paths.h"
#include "fp4/train/train.h"

namespace fp4 {
namespace fs = std::filesystem;
using namespace fidelity_detail;

namespace fidelity_detail {
std::vector<int64_t> spread_steps(const std::vector<int64_t>& all, size_t n) {
  n = std::min(n, all.size());
  std::vector<int64_t> out;
  for (size_t i = 0; i < n; ++i)
    out.push_back(all[n == 1 ? all.size() - 1 : (all.size() - 1) * i / (n - 1)]);
  return out;
}

std::map<int64_t, fs::path> checkpoints_by_step(const fs::path& run, const std::string& who) {
  const std::vector<fs::path> files = list_checkpoints(run);
  if (files.empty())
    throw UserError(who + ": run " + run.string() +
                    " holds no checkpoints (train it with "
                    "--save-every N and --keep-checkpoints large enough to keep them)");
  std::map<int64_t, fs::path> by_step;
  for (const fs::path& f : files) {
    const std::string n = f.filename().string();  // step_%08d.safetensors
    by_step[std::stoll(n.substr(5, n.find('.') - 5))] = f;
  }
  return by_step;
}

std::vector<int64_t> choose_steps(const std::map<int64_t, fs::path>& by_step,
                                  std::vector<int64_t> steps, int n, const fs::path& run,
                                  const std::string& who) {
  if (steps.empty()) {
    std::vector<int64_t> all;
    for (const auto& [s, f] : by_step) all.push_back(s);
    steps = spread_steps(all, size_t(std::max(n, 1)));
  }
  std::sort(steps.begin(), steps.end());
  const auto dup = std::adjacent_find(steps.begin(), steps.end());
  if (dup != steps.end())  // a repeated checkpoint would weigh twice in the bootstrap
    throw UserError(who + ": --steps names step " + std::to_string(*dup) +
                    " twice; give each checkpoint step once");
  for (int64_t s : steps)
    if (!by_step.count(s)) {
      std::string have;
      for (const auto& [st, f] : by_step) have += (have.empty() ? "" : ", ") + std::to_string(st);
      throw UserError(who + ": run " + run.string() + " has no checkpoint of step " +
                      std::to_string(s) + " (it holds steps " + have + ")");
    }
  return steps;
}
}  // namespace fidelity_detail

namespace {
// ------------------------------------------------------------------------------ passes

// The batch of the panel: `batch` windows of seq_len + 1 training tokens.
struct Batch {
  std::vector<int32_t> in, tg;
};

// One forward and backward of `model` on `b`; returns the loss and leaves the gradient in
// model.grads().
double pass(nn::Model& model, const Batch& b, int B, const nn::StepContext& ctx) {
  model.zero_grad();
  const double loss = model.forward(b.in.data(), b.tg.data(), B, ctx);
  model.backward(ctx);
  return loss;
}

// Copy weights into the model's parameter buffer, which its linears hold pointers into: never
// assign a new vector (a move would leave them pointing at freed memory).
void set_params(nn::Model& m, const std::vector<float>& p) {
  if (p.size() != m.params().size())
    throw UserError("fidelity: a checkpoint holds " + std::to_string(p.size()) +
                    " parameters, the model has " + std::to_string(m.params().size()));
  std::copy(p.begin(), p.end(), m.params().begin());
}

void reset_training_references(nn::Model& m) {
  for (auto& lin : m.linears())
    for (int r = 0; r < nn::kRoleCount; ++r) lin.reference(static_cast<nn::Role>(r)).reset();
}

bool recipe_has_sr(const Recipe& r) {
  if (r.mode != LinearMode::FP4) return false;
  if (r.round_x == Rounding::SR8 || r.round_w == Rounding::SR8 || r.round_dy == Rounding::SR8)
    return true;
  // MS-EDEN rounds its scales stochastically; random Hadamard signs are re-drawn per draw too.
  if (r.backward_quantizer == BackwardQuantizer::MsEden) return true;
  if ((r.rht_wgrad || r.hadamard_dgrad) && r.hadamard_signs != HadamardSigns::Fixed) return true;
  for (const auto& ov : r.overrides)
    if (ov.has_rounding && ov.rounding == Rounding::SR8) return true;
  return false;
}

// Whether parameter or linear `name` (layers.L.mixer.KIND) is a linear that reads its block's
// norm output: the input columns the outlier stress divides.
bool reads_block_norm(const std::string& name) {
  static const std::set<std::string> readers = {"q_proj", "k_proj", "v_proj", "up_proj", "in_proj"};
  if (name.rfind("layers.", 0) != 0) return false;
  const size_t dot = name.find('.', 7);
  if (dot == std::string::npos) return false;
  const std::string rest = name.substr(dot + 1);
  return rest.rfind("mixer.", 0) == 0 && readers.count(rest.substr(6)) > 0;
}

// The metrics of `mo` into fr's `scope` at (checkpoint c, batch k); returns them.
DrawMetrics put_metrics(FidelityRecipe& fr, const std::string& scope, size_t c, size_t k,
                        const DrawMoments& mo) {
  const DrawMetrics dm = draw_metrics(mo);
  auto& s = fr.scopes[scope];
  s["rel_error"][c][k] = dm.rel_error;
  s["cosine"][c][k] = dm.cosine;
  s["gain"][c][k] = dm.gain;
  s["mse"][c][k] = dm.mse;
  s["bias2"][c][k] = dm.bias2;
  s["variance"][c][k] = dm.variance;
  return dm;
}


// ------------------------------------------------------------------------------ the recipes

// The panel's sources: the exact side (the first checkpoint, recipe fp32: its config is the
// panel's) and one per recipe, in FidelityRequest::recipes order.
struct PanelSources {
  EvalSourceSpec spec;  // the exact side's: the first checkpoint, the data override
  EvalSource exact;
  std::vector<EvalSource> recipes;
};

// The run config and the recipes, each recipe loaded onto the first checkpoint and checked to
// fit its model (check_recipe_fits: overrides, RHT token counts).
PanelSources load_panel_recipes(const FidelityRequest& req, const fs::path& first_checkpoint) {
  PanelSources s;
  s.spec.checkpoint = first_checkpoint.string();
  s.spec.recipe = "fp32";
  s.spec.data = req.data;
  s.exact = load_eval_source(s.spec);
  for (const std::string& r : req.recipes) {
    EvalSourceSpec rs = s.spec;
    rs.recipe = r;
    try {
      s.recipes.push_back(load_eval_source(rs));
      check_recipe_fits(s.recipes.back().recipe, s.recipes.back().cfg);
    } catch (const UserError& e) {
      throw UserError("fidelity: recipe " + r + ": " + e.what());
    }
  }
  return s;
}

// ------------------------------------------------------------------------------ the outlier stress

// The outlier stress (docs/fidelity.md "Outlier stress"): runs of parameters multiplied by a
// power of two, θ' = f·θ; the gradient maps back the same way (∂L/∂θ = f·∂L/∂θ'). Multiplying
// by a power of two is exact (no value here comes near FP32's range limits). Empty: no stress.
class OutlierStress {
 public:
  OutlierStress() = default;
  // The runs of `exact`'s parameters: channels c of every block norm × S, column c of each
  // linear reading it ÷ S. Throws fp4::UserError for a channel outside d_model, a reading
  // linear of another width, or a model without block norms.
  OutlierStress(const FidelityRequest& req, const nn::Model& exact, int64_t d_model);
  bool empty() const { return runs_.empty(); }
  void apply(std::vector<float>& v) const {
    for (const Scaled& sc : runs_) {
      const float f = float(sc.factor);
      for (int64_t i = 0; i < sc.count; ++i) v[size_t(sc.offset + i * sc.stride)] *= f;
    }
  }
  std::vector<float> stressed(std::vector<float> v) const {
    apply(v);
    return v;
  }
  // Per-linear roles under the stress: a reading linear's input channel c is S times larger and
  // its weight column c S times smaller; in the original parametrization its dX column c is ×S
  // and its dW column c ×(1/S) (exact: powers of two). Y is unchanged.
  void map_back(size_t i, RoleTensors& t) const {
    if (reader_.empty() || !reader_[i]) return;
    const int64_t Kl = exact_->linears()[i].in(), Nl = exact_->linears()[i].out();
    const float up = float(factor_), down = float(1.0 / factor_);
    for (int ch : channels_) {
      for (int64_t r = 0; r < int64_t(t.dX.size()) / Kl; ++r) t.dX[size_t(r * Kl + ch)] *= up;
      for (int64_t r = 0; r < Nl; ++r) t.dW[size_t(r * Kl + ch)] *= down;
    }
  }

 private:
  struct Scaled {  // (offset, stride, count, factor): parameters to multiply
    int64_t offset, stride, count;
    double factor;  // applied to parameters; its inverse to gradients
  };
  std::vector<Scaled> runs_;
  const nn::Model* exact_ = nullptr;
  std::vector<bool> reader_;  // per linear: reads its block's norm
  double factor_ = 1;
  std::vector<int> channels_;
};

OutlierStress::OutlierStress(const FidelityRequest& req, const nn::Model& exact, int64_t Cm)
    : exact_(&exact), factor_(req.stress_factor), channels_(req.stress_channels) {
  for (int c : req.stress_channels)
    if (c < 0 || c >= Cm)
      throw UserError("fidelity: --stress-channels holds " + std::to_string(c) + ", outside 0.." +
                      std::to_string(Cm - 1) + " (d_model " + std::to_string(Cm) + ")");
  int norms = 0;
  for (const auto& pi : exact.param_infos()) {
    const std::string& n = pi.name;
    if (n.rfind("layers.", 0) != 0) continue;
    const size_t dot = n.find('.', 7);
    const std::string rest = n.substr(dot + 1);
    if (rest == "norm") {
      ++norms;
      for (int c : req.stress_channels) runs_.push_back({pi.offset + c, 1, 1, req.stress_factor});
    } else if (reads_block_norm(n)) {
      if (pi.cols != Cm)
        throw UserError("fidelity: the outlier stress expects " + n + " to read d_model = " +
                        std::to_string(Cm) + " inputs, it has " + std::to_string(pi.cols));
      for (int c : req.stress_channels)
        runs_.push_back({pi.offset + c, pi.cols, pi.rows, 1.0 / req.stress_factor});
    }
  }
  if (norms == 0)
    throw UserError(
        "fidelity: the outlier stress found no block norm (layers.L.norm) in this model");
  reader_.assign(exact.linears().size(), false);
  for (size_t i = 0; i < reader_.size(); ++i) reader_[i] = reads_block_norm(exact.linear_name(i));
}

// ------------------------------------------------------------------------------ per-linear roles

// Every linear's exact Y*, dX*, dW*: each replayed alone in FP32 on the operands `cap` observed
// in the exact pass that just ran (which holds no references), its Y checked against the pass's,
// and mapped back to the original parametrization by `stress` when given.
std::vector<RoleTensors> replay_exact(const nn::Model& exact, const Capture& cap,
                                      const std::vector<std::string>& names,
                                      const nn::StepContext& ex, const OutlierStress* stress) {
  const ReferenceState none = reference_state(exact);
  std::vector<RoleTensors> t(names.size());
  for (size_t i = 0; i < t.size(); ++i) {
    const Capture::Ops& o = cap.at(i, names[i]);
    t[i] = replay(exact.linears()[i], none[i], o.X.data(), o.dY.data(), o.M, ex);
    if (!same_bits(t[i].Y, o.Y))
      throw std::logic_error("fidelity: the FP32 replay of " + names[i] + " differs from its pass");
    if (stress) stress->map_back(i, t[i]);
  }
  return t;
}

// Per-linear roles of one (checkpoint, batch) and recipe (docs/fidelity.md "Per-linear roles").
// Construction: the exact pass of the batch, observed, and every linear's exact tensors
// (replay_exact). Then per draw: before_draw, the recipe's pass, after_draw (each linear
// replayed on its pass's own X and dY, e2e, and on X* and dY*, local; the tensors accumulated
// against the exact ones, one running sum per element). record at the end: the metrics per
// linear and concatenated over the linears, for each role scope (kLinearRoleScopes).
class BatchRoles {
 public:
  BatchRoles(nn::Model& exact, nn::Model& model, const Batch& b, int B, const nn::StepContext& ex,
             const std::vector<std::string>& names, const OutlierStress& stress)
      : model_(model), names_(names), stress_(stress), acc_(names.size()) {
    exact_ops_.emplace(exact);
    (void)pass(exact, b, B, ex);
    star_ = replay_exact(exact, *exact_ops_, names, ex, &stress);
    ops_.emplace(model);
  }
  // Before each draw's pass: the references it starts with, the observed operands forgotten.
  void before_draw() {
    refs0_ = reference_state(model_);
    ops_->clear();
  }
  void after_draw(const nn::StepContext& q, const std::string& recipe) {
    nn::StepContext qr = q;
    qr.telemetry = false;
    for (size_t i = 0; i < names_.size(); ++i) {  // e2e: its own pass's X and dY; local: X* and dY*
      const Capture::Ops& o = ops_->at(i, names_[i]);
      const Capture::Ops& ox = exact_ops_->at(i, names_[i]);
      RoleTensors e2e = replay(model_.linears()[i], refs0_[i], o.X.data(), o.dY.data(), o.M, qr);
      if (!same_bits(e2e.Y, o.Y))  // the replay must see what the pass computed
        throw std::logic_error("fidelity: recipe " + recipe + ": the replay of " + names_[i] +
                               " differs from its pass");
      RoleTensors loc = replay(model_.linears()[i], refs0_[i], ox.X.data(), ox.dY.data(), ox.M, qr);
      stress_.map_back(i, e2e);
      stress_.map_back(i, loc);
      const std::vector<float>* est[6] = {&loc.Y, &e2e.Y, &loc.dX, &e2e.dX, &loc.dW, &e2e.dW};
      for (size_t j = 0; j < 6; ++j)
        acc_[i][j].add(est[j]->data(), exact(i, j).data(), exact(i, j).size());
    }
  }
  void record(FidelityRecipe& fr, size_t c, size_t k) {
    for (size_t j = 0; j < 6; ++j) {
      DrawMoments all;
      for (size_t i = 0; i < names_.size(); ++i) {
        const DrawMoments mo = acc_[i][j].finish(exact(i, j).data());
        put_metrics(fr, names_[i] + ":" + kLinearRoleScopes[j], c, k, mo);
        add_moments(all, mo);
      }
      put_metrics(fr, kLinearRoleScopes[j], c, k, all);
    }
  }

 private:
  // Linear i's exact tensor of role scope j (Y, Y, dX, dX, dW, dW).
  const std::vector<float>& exact(size_t i, size_t j) const {
    return j < 2 ? star_[i].Y : j < 4 ? star_[i].dX : star_[i].dW;
  }

  nn::Model& model_;
  const std::vector<std::string>& names_;
  const OutlierStress& stress_;
  std::optional<Capture> exact_ops_, ops_;         // X*, Y*, dY*; the recipe pass's X, Y, dY
  std::vector<RoleTensors> star_;                  // per linear: Y*, dX*, dW*
  std::vector<std::array<StreamMoments, 6>> acc_;  // [linear][role scope], over the draws
  ReferenceState refs0_;                           // the recipe's references at the draw's start
};

// ------------------------------------------------------------------------------ scale events

// Scale events (telemetry of draw 0) of one recipe, role and (checkpoint, batch): sums and counts.
// The block amax is counted per linear (BlockAmax below) and pooled from those counts.
struct Events {
  double sat = 0, guard = 0, zeroed = 0, stale = 0;
  int64_t n = 0, n_stale = 0;
};
// One recipe's events: [operand role][c·K + k].
using RoleEvents = std::array<std::vector<Events>, nn::LinearTelemetry::kOperands>;

// One linear's and role's block amax over this rank's samples: nonzero blocks per
// floor(log2(a_b/g)) bin and all-zero blocks. Integer counts, so the sum over ranks does not
// depend on their order.
struct BlockAmax {
  std::array<uint64_t, QuantStats::kRatioBins> hist{};
  uint64_t zero = 0;
};
// One recipe's: [linear][operand role].
using LinearBlockAmax = std::vector<std::array<BlockAmax, nn::LinearTelemetry::kOperands>>;

// The telemetry of every FP4 linear of `m` (its last pass) into ev[role][ck], and its block
// amax into by_linear[linear][role].
void add_scale_events(const nn::Model& m, RoleEvents& ev, size_t ck, LinearBlockAmax& by_linear) {
  for (size_t i = 0; i < m.linears().size(); ++i) {
    const nn::LinearTelemetry& t = m.linears()[i].telemetry();
    if (!t.valid) continue;
    for (int o = 0; o < nn::LinearTelemetry::kOperands; ++o) {
      const QuantStats& qs = t.op[o];
      if (qs.ratio_to_g) {
        BlockAmax& a = by_linear[i][size_t(o)];
        a.zero += qs.zero_blocks;
        for (int b = 0; b < QuantStats::kRatioBins; ++b) a.hist[size_t(b)] += qs.log2_amax_ratio_blocks[size_t(b)];
      }
      Events& e = ev[size_t(o)][ck];
      e.sat += qs.saturated_blocks;
      e.guard += qs.zero_guard_blocks;
      e.zeroed += qs.zeroed_nonzeros;
      ++e.n;
      if (qs.has_staleness) e.stale += qs.staleness, ++e.n_stale;
    }
  }
}

// An Events as doubles (counts < 2^53: exact), for the gather over the ranks.
constexpr size_t kEv = 6;
void events_to_doubles(const Events& e, double* x) {
  const double v[kEv] = {e.sat, e.guard, e.zeroed, e.stale, double(e.n), double(e.n_stale)};
  std::copy(v, v + kEv, x);
}
void events_from_doubles(const double* x, Events& e) {
  e.sat = x[0], e.guard = x[1], e.zeroed = x[2], e.stale = x[3];
  e.n = int64_t(x[4]), e.n_stale = int64_t(x[5]);
}

// The sums over checkpoints and batches, in their order.
Events sum_events(const std::vector<Events>& v) {
  Events e;
  for (const Events& x : v) {
    e.sat += x.sat, e.guard += x.guard, e.zeroed += x.zeroed, e.stale += x.stale;
    e.n += x.n, e.n_stale += x.n_stale;
  }
  return e;
}

// The block-amax figures of a histogram of floor(log2(a_b/g)) over nonzero blocks and a count of
// all-zero blocks (into m; nothing without nonzero blocks): the fractions of nonzero blocks with
// a_b/g below 2^-15 and at or above 1, of all-zero blocks among all, and the quantiles.
void block_amax_figures(const std::array<uint64_t, QuantStats::kRatioBins>& hist, uint64_t zero,
                        std::map<std::string, double>& m) {
  uint64_t blocks = 0, subnormal = 0, above = 0;
  for (int b = 0; b < QuantStats::kRatioBins; ++b) {
    const int lg = b - QuantStats::kRatioBias;  // a_b/g in [2^lg, 2^(lg+1))
    blocks += hist[size_t(b)];
    if (lg + 1 <= -15) subnormal += hist[size_t(b)];
    if (lg >= 0) above += hist[size_t(b)];
  }
  if (!blocks) return;
  m["e4m3_subnormal_blocks"] = double(subnormal) / double(blocks);
  m["at_or_above_reference_blocks"] = double(above) / double(blocks);
  m["zero_blocks"] = double(zero) / double(blocks + zero);
  // Quantiles of log2(a_b/g) over the nonzero blocks (the floor of the bin holding it).
  const std::pair<const char*, double> qs[] = {{"log2_ratio_q0.001", 0.001},
                                               {"log2_ratio_q0.01", 0.01},
                                               {"log2_ratio_q0.5", 0.5},
                                               {"log2_ratio_q0.99", 0.99},
                                               {"log2_ratio_q0.999", 0.999}};
  for (const auto& [key, q] : qs) {
    const double want = q * double(blocks);
    uint64_t cum = 0;
    for (int b = 0; b < QuantStats::kRatioBins; ++b) {
      cum += hist[size_t(b)];
      if (double(cum) >= want && cum > 0) {
        m[key] = double(b - QuantStats::kRatioBias);
        break;
      }
    }
  }
}

// FidelityRecipe::scale_events of one role from its sums (e.n > 0) and its block amax pooled
// over the linears.
std::map<std::string, double> scale_event_figures(const Events& e, const BlockAmax& pooled) {
  std::map<std::string, double> m;
  m["saturated_blocks"] = e.sat / double(e.n);
  m["zero_guard_blocks"] = e.guard / double(e.n);
  m["zeroed_nonzeros"] = e.zeroed / double(e.n);
  if (e.n_stale) m["staleness"] = e.stale / double(e.n_stale);
  block_amax_figures(pooled.hist, pooled.zero, m);
  return m;
}

// ------------------------------------------------------------------------------ the run

// One call of run_fidelity, in the stages that run one after the other:
//   check_request  the request on its own, before a checkpoint is read (the output directory
//                  made);
//   plan           the checkpoints, the recipes (load_panel_recipes), the batches, the models,
//                  the held references' refresh steps and the outlier stress, refusing what does
//                  not fit before any pass; the panel's grids, empty;
//   execute        per checkpoint: the exact passes, then per recipe its held references, the
//                  inference policies and, per batch of this rank, its draws;
//   finish         the ranks' values gathered, the scale events summed, the panel returned.
// Its members are what a stage hands on to the next.
class FidelityRun {
 public:
  using clock = std::chrono::steady_clock;

  explicit FidelityRun(const FidelityRequest& req) : req(req), held(req.references == "held") {}

  void check_request() const;
  void plan();
  void execute();
  FidelityPanel finish();

 private:
  // check_request's and plan's parts.
  void check_stress_request() const;
  void make_output_directory() const;
  void select_steps();
  void draw_batches();
  void build_models();
  void plan_held_references();
  void warn_unseen_staleness();
  std::string unseen_staleness(size_t r) const;
  void check_recipes() const;
  void check_claim_scopes() const;
  void start_panel();
  FidelityRecipe empty_recipe(size_t r) const;
  int64_t refresh_step(size_t r, int64_t t) const;
  // execute's parts.
  void checkpoint(size_t c);
  nn::StepContext exact_context(int64_t step) const;
  void check_stress(const std::vector<float>& params, const std::vector<float>& theta,
                    const nn::StepContext& ex);
  double first_exact_pass(const std::vector<float>& params, const OutlierStress* map_back,
                          const nn::StepContext& ex, std::vector<RoleTensors>& roles,
                          std::vector<float>& g);
  void exact_passes(size_t c, const nn::StepContext& ex);
  void sgd_noise(size_t c);
  void recipe_at(size_t r, size_t c, const std::vector<float>& theta);
  int64_t hold_references(size_t r, size_t c);
  Batch first_micro_batch(int64_t tr) const;
  void inference_penalties(size_t r, size_t c);
  void recipe_batch(size_t r, size_t c, size_t k, int64_t tr);
  double draw(size_t r, size_t c, size_t k, int d, int64_t tr, std::vector<float>& g,
              BatchRoles* roles);
  void check_finite(size_t r, size_t c, size_t k, int d, int64_t tr, double loss,
                    const std::vector<float>& g) const;
  void record_batch(size_t r, size_t c, size_t k, const std::vector<std::vector<float>>& g,
                    double loss, BatchRoles* roles);
  bool mine(size_t k) const { return int(k % size_t(nproc)) == me; }
  void progress(size_t c) const;
  // finish's parts.
  void gather_ranks();
  void sum_scale_events();

  // Given.
  const FidelityRequest& req;
  const bool held;  // --references held
  const clock::time_point t0 = clock::now();

  // plan.
  std::map<int64_t, fs::path> by_step;  // the run's checkpoints
  std::vector<int64_t> steps;           // the panel's, ascending
  PanelSources src;
  const RunConfig* cfg = nullptr;  // the exact side's (the first checkpoint's)
  int B = 0, T = 0;                // sequences per batch, tokens per sequence
  TokenData data;
  std::vector<Batch> batches;  // [K], each B × T input and target tokens
  std::vector<std::pair<const int32_t*, const int32_t*>> batch_ptrs;  // [K]: batches' in, tg
  EvalWindows calib;  // the calibrated inference policy's windows
  std::unique_ptr<nn::Model> exact;
  std::vector<std::unique_ptr<nn::Model>> models;          // one per recipe
  std::vector<int> interval;                               // per recipe: its references' D
  std::vector<std::pair<int64_t, int64_t>> linear_ranges;  // the quantized linears' weights
  OutlierStress stress;
  size_t C = 0, K = 0;  // checkpoints, batches
  int64_t NP = 0;       // parameters
  FidelityPanel P;

  // execute.
  int nproc = 1, me = 0;
  std::vector<RoleEvents> events;         // [recipe][role][c·K + k]
  std::vector<LinearBlockAmax> amax_by_linear;  // [recipe][linear][role], this rank's samples
  std::vector<std::vector<float>> gstar;  // [K][NP]: g* per batch (original parametrization)
};

// ------------------------------------------------------------------------------ check_request

void FidelityRun::check_request() const {
  if (req.recipes.empty()) throw UserError("fidelity: give at least one --recipe");
  for (size_t i = 0; i < req.recipes.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (req.recipes[i] == req.recipes[j])
        throw UserError("fidelity: --recipe names " + req.recipes[i] + " twice");
  if (req.batches < 2)
    throw UserError("fidelity: --batches must be at least 2 (the SGD noise is their spread), got " +
                    std::to_string(req.batches));
  if (req.draws < 1)
    throw UserError("fidelity: --draws must be at least 1, got " + std::to_string(req.draws));
  if (req.checkpoints < 1) throw UserError("fidelity: --checkpoints must be at least 1");
  if (req.references != "held" && req.references != "current")
    throw UserError("fidelity: --references must be held or current, got '" + req.references + "'");
  check_stress_request();
  if (!req.claims.empty()) (void)load_claims(req.claims);  // refuse a bad file before any work
  if (!fs::exists(req.run))
    throw UserError("fidelity: run directory " + req.run.string() + " does not exist");
  if (!fs::is_directory(req.run))
    throw UserError("fidelity: --run " + req.run.string() +
                    " is not a directory (give the run directory)");
  make_output_directory();
}

void FidelityRun::check_stress_request() const {
  if (req.stress_factor == 1) return;
  int e = 0;
  const double m = std::frexp(req.stress_factor, &e);
  if (!(req.stress_factor >= 2) || m != 0.5 || req.stress_factor > 1048576.0)
    throw UserError(
        "fidelity: --stress-factor must be a power of two from 2 to 2^20 (so that the "
        "exact computation is unchanged bit for bit), got " +
        std::to_string(req.stress_factor));
  if (req.stress_channels.empty()) throw UserError("fidelity: --stress-channels is empty");
  std::set<int> seen;
  for (int c : req.stress_channels)
    if (!seen.insert(c).second)
      throw UserError("fidelity: --stress-channels names channel " + std::to_string(c) +
                      " twice (it would be scaled twice)");
}

// The output directory, before any work.
void FidelityRun::make_output_directory() const {
  std::error_code ec;
  fs::create_directories(req.out, ec);
  if (ec || !fs::is_directory(req.out))
    throw UserError("fidelity: output directory " + req.out.string() + " cannot be created" +
                    (ec ? ": " + ec.message() : std::string(" (a file is in the way)")));
}

// ------------------------------------------------------------------------------ plan

void FidelityRun::plan() {
  select_steps();
  src = load_panel_recipes(req, by_step.at(steps[0]));
  cfg = &src.exact.cfg;
  B = req.batch_size > 0 ? req.batch_size : cfg->train.micro();
  T = cfg->train.seq_len;
  draw_batches();
  build_models();
  plan_held_references();
  warn_unseen_staleness();
  check_recipes();
  check_claim_scopes();
  start_panel();
  if (req.stress_factor != 1) stress = OutlierStress(req, *exact, cfg->model.d_model);
  for (size_t r = 0; r < req.recipes.size(); ++r) P.recipes.push_back(empty_recipe(r));
}

// The run's checkpoints by step, and the panel's steps: req.steps, or req.checkpoints of them
// evenly spread, the newest always included.
void FidelityRun::select_steps() {
  by_step = checkpoints_by_step(req.run, "fidelity");
  steps = choose_steps(by_step, req.steps, req.checkpoints, req.run, "fidelity");
}

// K batches of B sequences from the training split (the same at every checkpoint), and the
// calibrated inference policy's windows: eval's (the first 4 batches of the training split).
void FidelityRun::draw_batches() {
  data = load_eval_data(src.exact, src.spec, req.quiet);
  batches.resize(static_cast<size_t>(req.batches));
  BatchSampler sampler(data.train, T, B, splitmix64(req.seed, 0x66696465));  // "fide"
  for (Batch& b : batches) {
    b.in.resize(size_t(B) * T);
    b.tg.resize(b.in.size());
    sampler.next(b.in.data(), b.tg.data());
  }
  calib = calibration_windows(data.train, T, B, 4);
  for (const Batch& b : batches) batch_ptrs.push_back({b.in.data(), b.tg.data()});
}

// The exact model (recipe fp32) and one per recipe, with capacity for the panel's batches and
// for the run's micro-batch (the held references' pass).
void FidelityRun::build_models() {
  const int cap = std::max(B, cfg->train.micro());
  exact = build_eval_model(src.exact, cap);
  for (const EvalSource& s : src.recipes) models.push_back(build_eval_model(s, cap));
}

// Held references (docs/fidelity.md "References"): each recipe's D (one per recipe) and the
// checkpoints its refresh steps need.
void FidelityRun::plan_held_references() {
  interval.assign(models.size(), 1);
  std::set<int64_t> missing;
  for (size_t r = 0; r < models.size(); ++r) {
    std::set<int> ds;
    for (const auto& lin : models[r]->linears())
      if (lin.plan().mode == LinearMode::FP4) ds.insert(lin.plan().reference_interval());
    if (held && ds.size() > 1)
      throw UserError("fidelity: recipe " + req.recipes[r] +
                      " holds references with different "
                      "intervals in different linears; the panel emulates one interval per recipe "
                      "(use --references current)");
    interval[r] = ds.empty() ? 1 : *ds.begin();
    for (int64_t s : steps) {
      const int64_t tr = refresh_step(r, s + 1);
      if (tr < s + 1 && tr > 1 && !by_step.count(tr - 1)) missing.insert(tr - 1);
    }
  }
  if (!missing.empty())
    throw UserError(
        "fidelity: held references need the checkpoints of the steps before each "
        "refresh step, and run " +
        req.run.string() + " lacks steps " + join_steps({missing.begin(), missing.end()}) +
        " (train the reference run with --save-every dividing the recipes' "
        "amax_interval, e.g. 10 for D = 50, or pass --references current)");
}

// Staleness the panel cannot see (docs/fidelity.md "Choosing the steps"): each recipe whose
// evaluated steps are all refresh steps gets a warning, on stderr (rank 0, quiet or not)
// and in the panel.
void FidelityRun::warn_unseen_staleness() {
  for (size_t r = 0; r < models.size(); ++r) {
    const std::string w = unseen_staleness(r);
    if (w.empty()) continue;
    P.warnings.push_back(w);
    if (dist::rank() == 0) std::fprintf(stderr, "fidelity: warning: %s\n", w.c_str());
  }
}

// The warning of recipe r, or "" when it holds no tensor scale (current references, D = 1, the
// MX rules) or some evaluated step s + 1 holds references older than itself. Step s + 1 is a
// refresh step exactly when s is a multiple of D; the remedy is a checkpoint off that grid
// (whose step before its refresh the run also holds, or which refreshes at step 1).
std::string FidelityRun::unseen_staleness(size_t r) const {
  const int D = interval[r];
  bool tensor_scaled = false;
  for (const auto& lin : models[r]->linears())
    if (lin.plan().mode == LinearMode::FP4)
      for (const auto& per_gemm : lin.plan().specs)
        for (const BlockQuantSpec& sp : per_gemm)
          tensor_scaled |= sp.scale_rule == ScaleRule::TensorScaled;
  if (!held || D <= 1 || !tensor_scaled) return "";
  std::vector<int64_t> refresh, usable, save, save_before;
  for (int64_t s : steps) {
    if (refresh_step(r, s + 1) < s + 1) return "";  // this step shows held references
    refresh.push_back(s + 1);
    if (s - 1 > 0) save.push_back(s - 1);         // step s holds step s − D + 1's, D − 1 old
    if (s - D > 0) save_before.push_back(s - D);  // the step before that refresh
  }
  for (const auto& [s, f] : by_step) {
    const int64_t tr = refresh_step(r, s + 1);
    if (tr < s + 1 && (tr == 1 || by_step.count(tr - 1))) usable.push_back(s);
  }
  const std::string d = std::to_string(D);
  std::string w = "recipe " + src.recipes[r].recipe.name +
                  " holds its tensor scale for amax_interval D = " + d +
                  " steps, but every evaluated checkpoint step (" + join_steps(steps) +
                  ") is a multiple of D, so each is followed by a refresh step (" +
                  join_steps(refresh) +
                  ") that measures its references afresh: its staleness reads 1 and the cost of "
                  "holding the scale is not seen. ";
  if (!usable.empty())
    w += "Evaluate checkpoints that are not multiples of " + d + ": this run holds " +
         join_steps(spread_steps(usable, 8)) + " (--steps). ";
  else
    w += "This run holds no checkpoint it could evaluate instead (off the grid, with the "
         "checkpoint of the step before its refresh). ";
  w += "Save checkpoints at steps that are not multiples of D (train --save-every / compare's "
       "checkpoint options)";
  if (!save.empty())
    w += ", e.g. steps " + join_steps(save) +
         (save_before.empty() ? std::string()
                              : " and, for their refreshes, " + join_steps(save_before));
  return w + ".";
}

// The refresh step whose references recipe r holds at step t.
int64_t FidelityRun::refresh_step(size_t r, int64_t t) const {
  const int D = interval[r];
  return held && D > 1 ? t - (t - 1) % D : t;
}

// What the recipes need of the panel's batches: RHT token counts, SR draws.
void FidelityRun::check_recipes() const {
  for (size_t r = 0; r < models.size(); ++r)
    for (const auto& lin : models[r]->linears())
      if (lin.plan().rht() && !lin.plan().ms_eden() && (int64_t(B) * T) % 16 != 0)  // MS-EDEN pads
        throw UserError("fidelity: recipe " + req.recipes[r] +
                        " uses the RHT, which needs the tokens per "
                        "batch (--batch-size " +
                        std::to_string(B) + " x seq_len " + std::to_string(T) +
                        ") to be a multiple of 16");
  for (size_t r = 0; r < src.recipes.size(); ++r)
    if (recipe_has_sr(src.recipes[r].recipe) && req.draws < 2)
      throw UserError("fidelity: recipe " + req.recipes[r] +
                      " rounds stochastically: its bias and "
                      "variance need --draws 2 or more, got " +
                      std::to_string(req.draws));
}

// The claims' scopes name whole, linears or a parameter of this model (or, with per-linear
// roles, a role scope).
void FidelityRun::check_claim_scopes() const {
  if (req.claims.empty()) return;
  std::set<std::string> scopes = {"whole", "linears"};
  for (const auto& pi : exact->param_infos()) scopes.insert(pi.name);
  if (req.linear_roles) scopes.insert(std::begin(kLinearRoleScopes), std::end(kLinearRoleScopes));
  for (const Claim& cl : load_claims(req.claims))
    if (!scopes.count(cl.scope))
      throw UserError("fidelity: claim " + cl.id + ": scope '" + cl.scope +
                      "' is not whole, linears "
                      "or a parameter of this model (e.g. " +
                      exact->param_infos().back().name + ")" +
                      (req.linear_roles
                           ? std::string(", nor a role scope (Y.local, Y.e2e, dX.local, dX.e2e, "
                                         "dW.local, dW.e2e)")
                           : std::string(" (role scopes such as dX.local need --linear-roles)")));
}

// The panel's description, names and exact-side grids; the weights of the quantized linears
// (parameters named after a linear, "NAME.weight").
void FidelityRun::start_panel() {
  C = steps.size();
  K = batches.size();
  NP = exact->num_params();
  P.run = req.run.string();
  P.references = req.references;
  P.stress_factor = req.stress_factor;
  if (req.stress_factor != 1) P.stress_channels = req.stress_channels;
  P.refresh_steps.assign(models.size(), std::vector<int64_t>(C, 0));
  P.steps = steps;
  P.batches = req.batches;
  P.draws = req.draws;
  P.tokens_per_batch = B * T;
  P.seed = req.seed;
  P.cpu = prof::cpu_model_name();
  for (const auto& pi : exact->param_infos()) P.param_names.push_back(pi.name);
  std::set<std::string> lin;
  for (size_t i = 0; i < exact->linears().size(); ++i) {
    lin.insert(exact->linear_name(i));
    if (req.linear_roles) P.linear_names.push_back(exact->linear_name(i));
  }
  for (const auto& pi : exact->param_infos()) {
    const std::string n = pi.name;
    const std::string base = n.size() > 7 && n.substr(n.size() - 7) == ".weight"
                                 ? n.substr(0, n.size() - 7)
                                 : n;
    if (lin.count(base)) linear_ranges.push_back({pi.offset, pi.offset + pi.size});
  }
  P.exact_loss.assign(C, std::vector<double>(K, 0.0));
  P.exact_grad_norm.assign(C, std::vector<double>(K, 0.0));
  P.sgd_var.assign(C, 0.0);
}

// Recipe r's scopes (FidelityRecipe::scopes), each metric a [c][k] grid of zeros.
FidelityRecipe FidelityRun::empty_recipe(size_t r) const {
  FidelityRecipe fr;
  fr.name = src.recipes[r].recipe.name;
  fr.has_sr = recipe_has_sr(src.recipes[r].recipe);
  const std::vector<std::vector<double>> grid(C, std::vector<double>(K, 0.0));
  std::vector<std::string> scopes = {"whole", "linears"};
  for (const std::string& pn : P.param_names) scopes.push_back(pn);
  for (const char* key : kLinearRoleScopes) {
    if (!req.linear_roles) break;
    scopes.push_back(key);
    for (const std::string& ln : P.linear_names) scopes.push_back(ln + ":" + key);
  }
  for (const std::string& sc : scopes)
    for (const char* m : kGradMetrics) fr.scopes[sc][m] = grid;
  for (const char* m : {"loss_penalty", "sgd_noise_fraction", "qnoise_to_grad"})
    fr.scopes["whole"][m] = grid;
  for (const char* m : kPolicyMetrics) fr.scopes["whole"][m] = grid;
  return fr;
}

// ------------------------------------------------------------------------------ execute

// Under mpirun, batch k of every checkpoint is rank k mod P's (docs/fidelity.md "Processes"):
// the exact passes, which every batch's metrics and the SGD noise need, and the inference
// policies run on every rank; the per-(checkpoint, batch) values are gathered in finish, so
// every value is computed by the same code on the same inputs whatever the process count.
void FidelityRun::execute() {
  nproc = dist::size();
  me = dist::rank();
  events.assign(models.size(), RoleEvents{});
  for (auto& per_role : events)
    for (auto& v : per_role) v.assign(C * K, Events{});
  amax_by_linear.clear();
  for (const auto& m : models) amax_by_linear.emplace_back(m->linears().size());
  gstar.assign(K, std::vector<float>(size_t(NP)));
  // An error on one rank's batch (a non-finite gradient) would leave the others waiting in the
  // gather: under mpirun it ends every process (exit status 2, the message naming it).
  try {
    for (size_t c = 0; c < C; ++c) checkpoint(c);
  } catch (const UserError& e) {
    if (nproc > 1) dist::abort_all(e.what(), 2);
    throw;
  }
}

// Checkpoint c: its weights θ (stressed when asked), the exact side, then every recipe.
void FidelityRun::checkpoint(size_t c) {
  const int64_t step = steps[c];
  const Checkpoint ck = load_checkpoint(by_step.at(step));
  if (int64_t(ck.params.size()) != NP)
    throw UserError("fidelity: checkpoint " + by_step.at(step).string() + " holds " +
                    std::to_string(ck.params.size()) + " parameters, the model of step " +
                    std::to_string(steps[0]) + "'s config has " + std::to_string(NP));
  if (c == 0) P.config_name = ck.config_name;
  const std::vector<float> theta = stress.empty() ? ck.params : stress.stressed(ck.params);
  const nn::StepContext ex = exact_context(step);
  if (!stress.empty()) check_stress(ck.params, theta, ex);
  set_params(*exact, theta);
  exact_passes(c, ex);
  sgd_noise(c);
  for (size_t r = 0; r < models.size(); ++r) recipe_at(r, c, theta);
  progress(c);
}

// The exact side's step context: the weights after `step` steps are those step + 1 computes with.
nn::StepContext FidelityRun::exact_context(int64_t step) const {
  nn::StepContext ex;
  ex.step = step + 1;
  ex.seed = req.seed;
  ex.quantize = false;
  return ex;
}

// The stress preserves the exact function: L* and g* of batch 1 with and without it. With
// per-linear roles, also every linear's exact Y, dX and dW, the stressed ones mapped back (an
// independent check of OutlierStress::map_back: nothing else compares it with the truth).
void FidelityRun::check_stress(const std::vector<float>& params, const std::vector<float>& theta,
                               const nn::StepContext& ex) {
  std::vector<RoleTensors> r0, r1;
  std::vector<float> g0, g1;
  const double l0 = first_exact_pass(params, nullptr, ex, r0, g0);
  const double l1 = first_exact_pass(theta, &stress, ex, r1, g1);
  stress.apply(g1);
  P.stress_loss_diff = std::max(P.stress_loss_diff, std::fabs(l1 - l0));
  for (size_t i = 0; i < g0.size(); ++i)
    P.stress_grad_diff = std::max(P.stress_grad_diff, double(std::fabs(g1[i] - g0[i])));
  for (size_t i = 0; i < r0.size(); ++i)
    for (auto mem : {&RoleTensors::Y, &RoleTensors::dX, &RoleTensors::dW})
      for (size_t e = 0; e < (r0[i].*mem).size(); ++e)
        P.stress_roles_diff = std::max(P.stress_roles_diff,
                                       double(std::fabs((r1[i].*mem)[e] - (r0[i].*mem)[e])));
}

// The exact pass of batch 1 on `params`: its loss, its gradient into g and, with per-linear
// roles, its linears' tensors into roles (replay_exact, mapped back by `map_back` when given).
double FidelityRun::first_exact_pass(const std::vector<float>& params,
                                     const OutlierStress* map_back, const nn::StepContext& ex,
                                     std::vector<RoleTensors>& roles, std::vector<float>& g) {
  set_params(*exact, params);
  std::optional<Capture> cap;
  if (req.linear_roles) cap.emplace(*exact);
  const double l = pass(*exact, batches[0], B, ex);
  if (cap) roles = replay_exact(*exact, *cap, P.linear_names, ex, map_back);
  g = exact->grads();
  return l;
}

// L* and g* of every batch (g* mapped back to the original parametrization), and ‖g*‖.
void FidelityRun::exact_passes(size_t c, const nn::StepContext& ex) {
  for (size_t k = 0; k < K; ++k) {
    P.exact_loss[c][k] = pass(*exact, batches[k], B, ex);
    gstar[k] = exact->grads();
    stress.apply(gstar[k]);  // nothing without stress
    double n2 = 0;
    for (float g : gstar[k]) n2 += double(g) * g;
    P.exact_grad_norm[c][k] = std::sqrt(n2);
  }
}

// SGD noise: the spread of the K exact gradients about their mean.
void FidelityRun::sgd_noise(size_t c) {
  double s = 0;
  for (int64_t i = 0; i < NP; ++i) {
    double mean = 0;
    for (size_t k = 0; k < K; ++k) mean += gstar[k][size_t(i)];
    mean /= double(K);
    for (size_t k = 0; k < K; ++k) {
      const double d = gstar[k][size_t(i)] - mean;
      s += d * d;
    }
  }
  P.sgd_var[c] = s / double(K - 1);
}

// Recipe r at checkpoint c: its references, θ, the inference policies, its batches.
void FidelityRun::recipe_at(size_t r, size_t c, const std::vector<float>& theta) {
  const int64_t tr = hold_references(r, c);
  set_params(*models[r], theta);
  inference_penalties(r, c);
  for (size_t k = 0; k < K; ++k)
    if (mine(k)) recipe_batch(r, c, k, tr);  // else another rank's batch
}

// Held references: one training pass at the refresh step t_r, on the weights after t_r − 1
// steps and the first micro-batch of step t_r, leaves each linear holding what it would hold at
// step + 1 (t_r ≤ step + 1 < t_r + D: no refresh below). Returns t_r (step + 1: current).
int64_t FidelityRun::hold_references(size_t r, size_t c) {
  nn::Model& m = *models[r];
  const int64_t tr = refresh_step(r, steps[c] + 1);
  P.refresh_steps[r][c] = tr;
  const bool hold = tr < steps[c] + 1;
  if (!hold) return tr;
  if (tr == 1) {
    m.init(cfg->train.seed);  // the run's initial weights
    if (!stress.empty()) set_params(m, stress.stressed(m.params()));
  } else {
    set_params(m, stress.stressed(load_checkpoint(by_step.at(tr - 1)).params));
  }
  nn::StepContext q;
  q.step = tr;
  q.seed = req.seed;
  reset_training_references(m);
  (void)pass(m, first_micro_batch(tr), cfg->train.micro(), q);
  return tr;
}

// The run's first micro-batch of step t (its micro() sequences of that step's batch).
Batch FidelityRun::first_micro_batch(int64_t t) const {
  BatchSampler train_sampler(data.train, T, cfg->train.batch_size, cfg->train.seed);
  train_sampler.set_draws(uint64_t(t - 1));  // one draw of batch_size windows per step
  std::vector<int32_t> in(size_t(cfg->train.batch_size) * T), tg(in.size());
  train_sampler.next(in.data(), tg.data());
  const int mb = cfg->train.micro();
  Batch first;
  first.in.assign(in.begin(), in.begin() + size_t(mb) * T);
  first.tg.assign(tg.begin(), tg.begin() + size_t(mb) * T);
  return first;
}

// L − L* under each inference policy of `fp4train eval` (inference never touches training
// references).
void FidelityRun::inference_penalties(size_t r, size_t c) {
  FidelityRecipe& fr = P.recipes[r];
  for (size_t p = 0; p < std::size(kPolicyMetrics); ++p) {
    const std::vector<double> lp = evaluate_batches_nll(*models[r], batch_ptrs, T, B,
                                                        parse_eval_policy(kPolicyNames[p]), &calib);
    for (size_t k = 0; k < K; ++k) {
      if (!std::isfinite(lp[k]))
        throw UserError("fidelity: recipe " + fr.name + " gives a non-finite loss under the " +
                        kPolicyNames[p] + " inference policy at checkpoint " +
                        std::to_string(steps[c]) + ", batch " + std::to_string(k + 1));
      fr.scopes["whole"][kPolicyMetrics[p]][c][k] = lp[k] - P.exact_loss[c][k];
    }
  }
}

// Recipe r on batch k of checkpoint c: R draws (1 without SR: every draw gives the same bits),
// with per-linear roles when asked, and their metrics.
void FidelityRun::recipe_batch(size_t r, size_t c, size_t k, int64_t tr) {
  const int R = P.recipes[r].has_sr ? req.draws : 1;
  std::vector<std::vector<float>> g(static_cast<size_t>(R),
                                    std::vector<float>(static_cast<size_t>(NP)));  // [R][NP]
  std::optional<BatchRoles> roles;
  if (req.linear_roles)
    roles.emplace(*exact, *models[r], batches[k], B, exact_context(steps[c]), P.linear_names,
                  stress);
  double loss = 0;
  for (int d = 0; d < R; ++d) loss += draw(r, c, k, d, tr, g[size_t(d)], roles ? &*roles : nullptr);
  record_batch(r, c, k, g, loss, roles ? &*roles : nullptr);
}

// Draw d: the recipe's pass with SR stream seed + d, its gradient into g (the original
// parametrization), its roles and (draw 0) its scale events. Returns the loss.
double FidelityRun::draw(size_t r, size_t c, size_t k, int d, int64_t tr, std::vector<float>& g,
                         BatchRoles* roles) {
  nn::Model& m = *models[r];
  nn::StepContext q;
  q.step = steps[c] + 1;
  q.seed = req.seed + uint64_t(d);  // draw d's SR stream
  // ... and its Hadamard signs (the policies that draw them: per-layer, per-step, per-call), so
  // that the draws average over the recipe's random rotations as over its SR bits
  q.hadamard_seed = req.seed + uint64_t(d);
  q.telemetry = d == 0;             // scale events (the quantized bits are the same)
  const bool hold = tr < steps[c] + 1;
  if (!hold) reset_training_references(m);  // current: references of this batch
  if (roles) roles->before_draw();
  const double l = pass(m, batches[k], B, q);
  g = m.grads();
  stress.apply(g);
  check_finite(r, c, k, d, tr, l, g);
  if (roles) roles->after_draw(q, P.recipes[r].name);
  if (d == 0) add_scale_events(m, events[r], c * K + k, amax_by_linear[r]);
  return l;
}

void FidelityRun::check_finite(size_t r, size_t c, size_t k, int d, int64_t tr, double loss,
                               const std::vector<float>& g) const {
  const auto bad = std::find_if(g.begin(), g.end(), [](float v) { return !std::isfinite(v); });
  if (std::isfinite(loss) && bad == g.end()) return;
  const bool hold = tr < steps[c] + 1;
  throw UserError("fidelity: recipe " + P.recipes[r].name + " gives a non-finite " +
                  (std::isfinite(loss)
                       ? "gradient (parameter element " + std::to_string(bad - g.begin()) + ")"
                       : std::string("loss")) +
                  " at checkpoint " + std::to_string(steps[c]) + ", batch " +
                  std::to_string(k + 1) + ", draw " + std::to_string(d + 1) +
                  (hold ? " (references held from step " + std::to_string(tr) + ")" : ""));
}

// The metrics of batch k's draws g (scopes whole, linears, the roles, each parameter) and its
// loss penalty (mean over the draws of their summed `loss`) and noise ratios.
void FidelityRun::record_batch(size_t r, size_t c, size_t k,
                               const std::vector<std::vector<float>>& g, double loss,
                               BatchRoles* roles) {
  FidelityRecipe& fr = P.recipes[r];
  const int R = int(g.size());
  std::vector<const float*> est;
  for (const auto& v : g) est.push_back(v.data());
  const DrawMoments whole = draw_moments(est, gstar[k].data(), NP);
  const DrawMetrics dw = put_metrics(fr, "whole", c, k, whole);
  put_metrics(fr, "linears", c, k, draw_moments(est, gstar[k].data(), linear_ranges));
  if (roles) roles->record(fr, c, k);
  for (const auto& pi : exact->param_infos())
    put_metrics(fr, pi.name, c, k,
                draw_moments(est, gstar[k].data(), {{pi.offset, pi.offset + pi.size}}));
  auto& w = fr.scopes["whole"];
  w["loss_penalty"][c][k] = loss / R - P.exact_loss[c][k];
  w["sgd_noise_fraction"][c][k] = dw.mse * whole.ref_sq / P.sgd_var[c];
  w["qnoise_to_grad"][c][k] = std::sqrt(dw.mse);  // σ_q/‖g*‖; reported inverted too
}

void FidelityRun::progress(size_t c) const {
  if (req.quiet || me != 0) return;
  std::fprintf(stderr,
               "fidelity: checkpoint %zu/%zu (step %lld): %zu batches x %zu recipes done, %.0f s\n",
               c + 1, C, static_cast<long long>(steps[c]), K, models.size(),
               std::chrono::duration<double>(clock::now() - t0).count());
}

// ------------------------------------------------------------------------------ finish

FidelityPanel FidelityRun::finish() {
  if (nproc > 1) gather_ranks();
  sum_scale_events();
  P.seconds = std::chrono::duration<double>(clock::now() - t0).count();
  return std::move(P);
}

// Every rank's batches to every rank: each (checkpoint, batch) value from the rank that owns it.
void FidelityRun::gather_ranks() {
  std::vector<std::vector<std::vector<double>>*>
      grids;  // every recipe's [c][k] grids, in map order
  for (FidelityRecipe& fr : P.recipes)
    for (auto& [scope, ms] : fr.scopes)
      for (auto& [metric, g] : ms) grids.push_back(&g);
  const size_t CK = C * K, nev = events.size() * nn::LinearTelemetry::kOperands;
  std::vector<double> mine_v(grids.size() * CK + nev * CK * kEv);
  size_t at = 0;
  for (const auto* g : grids)
    for (size_t c = 0; c < C; ++c)
      for (size_t k = 0; k < K; ++k) mine_v[at++] = (*g)[c][k];
  for (const auto& per_role : events)
    for (const auto& v : per_role)
      for (const Events& e : v) events_to_doubles(e, &mine_v[at]), at += kEv;
  const int64_t n = int64_t(mine_v.size());
  std::vector<double> all(size_t(n) * size_t(nproc));
  dist::allgather(mine_v.data(), n, all.data());
  auto owner = [&](size_t k) { return size_t(k % size_t(nproc)) * size_t(n); };
  at = 0;
  for (auto* g : grids)
    for (size_t c = 0; c < C; ++c)
      for (size_t k = 0; k < K; ++k, ++at) (*g)[c][k] = all[owner(k) + at];
  for (auto& per_role : events)
    for (auto& v : per_role)
      for (size_t ck = 0; ck < CK; ++ck, at += kEv)
        events_from_doubles(&all[owner(ck % K) + at], v[ck]);
  // The per-linear block amax: every rank's counts summed (exact: integers below 2^53).
  std::vector<double> mine_a;
  for (const auto& rec : amax_by_linear)
    for (const auto& roles : rec)
      for (const BlockAmax& a : roles) {
        mine_a.insert(mine_a.end(), a.hist.begin(), a.hist.end());
        mine_a.push_back(double(a.zero));
      }
  const int64_t na = int64_t(mine_a.size());
  std::vector<double> all_a(size_t(na) * size_t(nproc));
  dist::allgather(mine_a.data(), na, all_a.data());
  size_t ia = 0;
  for (auto& rec : amax_by_linear)
    for (auto& roles : rec)
      for (BlockAmax& a : roles) {
        auto sum = [&](size_t i) {
          uint64_t s = 0;
          for (size_t p = 0; p < size_t(nproc); ++p) s += uint64_t(all_a[p * size_t(na) + i]);
          return s;
        };
        for (auto& h : a.hist) h = sum(ia++);
        a.zero = sum(ia++);
      }
}

// FidelityRecipe::scale_events: per recipe and operand role, over checkpoints and batches.
void FidelityRun::sum_scale_events() {
  for (size_t r = 0; r < models.size(); ++r)
    for (int o = 0; o < nn::LinearTelemetry::kOperands; ++o) {
      const Events e = sum_events(events[r][size_t(o)]);
      if (e.n == 0) continue;
      BlockAmax pooled;  // integer counts: the sum over linears in any order
      for (const auto& roles : amax_by_linear[r]) {
        const BlockAmax& a = roles[size_t(o)];
        pooled.zero += a.zero;
        for (int b = 0; b < QuantStats::kRatioBins; ++b) pooled.hist[size_t(b)] += a.hist[size_t(b)];
      }
      P.recipes[r].scale_events[nn::LinearTelemetry::kNames[o]] = scale_event_figures(e, pooled);
    }
  // Per linear and role: the same block-amax figures, from that linear's counts alone.
  for (size_t r = 0; r < models.size(); ++r)
    for (size_t i = 0; i < amax_by_linear[r].size(); ++i)
      for (int o = 0; o < nn::LinearTelemetry::kOperands; ++o) {
        std::map<std::string, double> m;
        const BlockAmax& a = amax_by_linear[r][i][size_t(o)];
        block_amax_figures(a.hist, a.zero, m);
        if (!m.empty()) P.recipes[r].block_amax_by_linear[models[r]->linear_name(i)][nn::LinearTelemetry::kNames[o]] = m;
      }
}
}  // namespace

// One run_fidelity call, stage by stage (FidelityRun).
FidelityPanel run_fidelity(const FidelityRequest& req) {
  FidelityRun run(req);
  run.check_request();
  run.plan();
  run.execute();
  return run.finish();
}

}  // namespace fp4
