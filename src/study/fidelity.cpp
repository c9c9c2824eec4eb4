// The fidelity panel (include/fp4/study/fidelity.h, docs/fidelity.md): its statistics
// (docs/fidelity.md "Metrics" and "Statistics"), its claims file and the panel's forward/backward
// passes on a run's checkpoints; the report is in fidelity_report.cpp.
#include "fp4/study/fidelity.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <optional>
#include <set>
#include <stdexcept>
#include <toml++/toml.h>

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

// ------------------------------------------------------------------------------ statistics

DrawMoments draw_moments(const std::vector<const float*>& est, const float* ref,
                         const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  if (est.empty()) throw std::invalid_argument("draw_moments: no draws");
  for (const float* e : est)
    if (!e) throw std::invalid_argument("draw_moments: null draw");
  const size_t R = est.size();
  DrawMoments m;
  m.draws = int(R);
  m.err_sq.assign(R, 0.0);
  m.dot.assign(R, 0.0);
  m.est_sq.assign(R, 0.0);
  for (const auto& [b, e] : ranges)
    for (int64_t i = b; i < e; ++i) {
      const double g = ref[i];
      double mean = 0;
      for (size_t d = 0; d < R; ++d) {
        const double x = est[d][i];
        m.err_sq[d] += (x - g) * (x - g);
        m.dot[d] += x * g;
        m.est_sq[d] += x * x;
        mean += x;
      }
      mean /= double(R);
      m.ref_sq += g * g;
      m.mean_err_sq += (mean - g) * (mean - g);
      for (size_t d = 0; d < R; ++d) {
        const double x = est[d][i] - mean;
        m.spread_sq += x * x;
      }
    }
  return m;
}

DrawMoments draw_moments(const std::vector<const float*>& est, const float* ref, int64_t n) {
  return draw_moments(est, ref, std::vector<std::pair<int64_t, int64_t>>{{0, n}});
}

DrawMetrics draw_metrics(const DrawMoments& m) {
  DrawMetrics r;
  const double R = m.draws, n2 = m.ref_sq, n = std::sqrt(n2);
  double rel = 0, cos = 0, gain = 0, mse = 0;
  for (int d = 0; d < m.draws; ++d) {
    rel += std::sqrt(m.err_sq[d]) / n;
    cos += m.dot[d] / (std::sqrt(m.est_sq[d]) * n);
    gain += m.dot[d] / n2;
    mse += m.err_sq[d] / n2;
  }
  r.rel_error = rel / R;
  r.cosine = cos / R;
  r.gain = gain / R;
  r.mse = mse / R;
  const double V = m.draws > 1 ? m.spread_sq / (R - 1) : 0.0;
  r.variance = V / n2;
  r.bias2 = (m.mean_err_sq - V / R) / n2;
  return r;
}

Interval bootstrap_two_level(const std::vector<std::vector<double>>& x, int resamples,
                             uint64_t seed) {
  if (x.empty()) throw std::invalid_argument("bootstrap_two_level: no checkpoints");
  const size_t K = x[0].size();
  if (K == 0) throw std::invalid_argument("bootstrap_two_level: no batches");
  for (const auto& row : x) {
    if (row.size() != K)
      throw std::invalid_argument("bootstrap_two_level: checkpoints hold different numbers of "
                                  "batches (" + std::to_string(row.size()) + " and " +
                                  std::to_string(K) + ")");
    for (double v : row)
      if (!std::isfinite(v)) throw std::invalid_argument("bootstrap_two_level: a value is not finite");
  }
  if (resamples < 1) throw std::invalid_argument("bootstrap_two_level: resamples must be >= 1");
  const size_t C = x.size();
  Interval out;
  double total = 0;
  for (const auto& row : x)
    for (double v : row) total += v;
  out.mean = total / double(C * K);
  uint64_t k = 0;
  auto draw = [&](size_t n) {  // uniform in [0, n): reject the top partial range of 2^64
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t u;
    do u = splitmix64(seed, k++);
    while (u >= limit);
    return size_t(u % n);
  };
  std::vector<double> stats(static_cast<size_t>(resamples));
  for (auto& st : stats) {
    double sum = 0;
    for (size_t c = 0; c < C; ++c) {
      const auto& row = x[C == 1 ? 0 : draw(C)];
      for (size_t b = 0; b < K; ++b) sum += row[draw(K)];
    }
    st = sum / double(C * K);
  }
  std::sort(stats.begin(), stats.end());
  auto quantile = [&](double q) {
    const double h = double(stats.size() - 1) * q;
    const size_t lo = size_t(std::floor(h)), hi = std::min(lo + 1, stats.size() - 1);
    return stats[lo] + (h - double(lo)) * (stats[hi] - stats[lo]);
  };
  out.lo = quantile(0.025);
  out.hi = quantile(0.975);
  return out;
}
// ------------------------------------------------------------------------------ the claims file

namespace fidelity_detail {
namespace {
// The string at `key` into v; an error when it is missing and required.
void read_string(const toml::table& c, const char* key, std::string& v, bool required,
                 const std::string& where) {
  if (auto x = c[key].value<std::string>()) v = *x;
  else if (required) throw UserError("fidelity: " + where + ": key '" + key + "' (a string) is missing");
}

// The contrast's terms: the table terms = { RECIPE = coefficient, ... }, or a (+1) and b (−1).
void read_terms(const toml::table& c, const std::string& where, Claim& cl) {
  if (const toml::table* t = c["terms"].as_table()) {
    for (const auto& [k, v] : *t) {
      const auto x = v.value<double>();
      if (!x || !std::isfinite(*x))
        throw UserError("fidelity: " + where + ": terms." + std::string(k.str()) + " must be a finite number");
      cl.terms.push_back({std::string(k.str()), *x});
    }
    if (cl.terms.empty()) throw UserError("fidelity: " + where + ": terms is empty");
    if (c["a"] || c["b"]) throw UserError("fidelity: " + where + ": give either a and b, or terms");
  } else {
    std::string a, b;
    read_string(c, "a", a, true, where);
    read_string(c, "b", b, true, where);
    cl.terms = {{a, 1.0}, {b, -1.0}};
  }
}

// expect ("lower", "higher" or "within"), the id not used before, and bound with "within" only.
void read_expect(const toml::table& c, const std::string& where, const std::vector<Claim>& before,
                 Claim& cl) {
  read_string(c, "expect", cl.expect, true, where);
  if (cl.expect != "lower" && cl.expect != "higher" && cl.expect != "within")
    throw UserError("fidelity: " + where + " (" + cl.id + "): expect must be \"lower\", \"higher\" (a's metric against b's) or \"within\" (with bound), got \"" + cl.expect + "\"");
  for (const Claim& prev : before)
    if (prev.id == cl.id) throw UserError("fidelity: " + where + ": id \"" + cl.id + "\" is used twice");
  if (cl.expect != "within" && c["bound"])
    throw UserError("fidelity: " + where + " (" + cl.id + "): bound goes with expect = \"within\" only");
  if (cl.expect == "within") {
    const auto b = c["bound"].value<double>();
    if (!b || !(*b > 0))
      throw UserError("fidelity: " + where + " (" + cl.id + "): expect = \"within\" needs bound, a number > 0");
    cl.bound = *b;
  }
}

// A metric the panel computes, in a scope that has it (the loss penalties and noise ratios:
// whole only).
void check_metric(const std::string& where, const Claim& cl) {
  static const std::set<std::string> known = {"rel_error", "cosine", "gain", "mse", "bias2", "variance",
                                               "loss_penalty", "sgd_noise_fraction", "qnoise_to_grad",
                                               "loss_penalty_current", "loss_penalty_replay_d50",
                                               "loss_penalty_calibrated"};
  if (!known.count(cl.metric))
    throw UserError("fidelity: " + where + " (" + cl.id + "): unknown metric '" + cl.metric +
                    "' (rel_error, cosine, gain, mse, bias2, variance; scope whole also loss_penalty, "
                    "sgd_noise_fraction, qnoise_to_grad, loss_penalty_current, loss_penalty_replay_d50, "
                    "loss_penalty_calibrated)");
  const bool whole_only = cl.metric.rfind("loss_penalty", 0) == 0 || cl.metric == "sgd_noise_fraction" || cl.metric == "qnoise_to_grad";
  if (whole_only && cl.scope != "whole")
    throw UserError("fidelity: " + where + " (" + cl.id + "): metric " + cl.metric + " exists for scope whole only, got scope '" + cl.scope + "'");
}

// One [[claim]] table; `before`: the claims above it in the file.
Claim read_claim(const toml::table& c, const std::string& where, const std::vector<Claim>& before) {
  static const std::set<std::string> keys = {"id", "text", "metric", "scope", "a", "b", "terms", "expect", "bound"};
  for (const auto& [k, v] : c)
    if (!keys.count(std::string(k.str())))
      throw UserError("fidelity: " + where + ": unknown key '" + std::string(k.str()) +
                      "' (keys: id, text, metric, scope, a, b, terms, expect, bound)");
  Claim cl;
  read_string(c, "id", cl.id, true, where);
  read_string(c, "text", cl.text, false, where);
  read_string(c, "metric", cl.metric, true, where);
  read_string(c, "scope", cl.scope, false, where);
  read_terms(c, where, cl);
  read_expect(c, where, before, cl);
  check_metric(where, cl);
  return cl;
}
}  // namespace

std::vector<Claim> load_claims(const fs::path& file) {
  std::vector<Claim> out;
  toml::table t;
  try {
    t = toml::parse_file(file.string());
  } catch (const toml::parse_error& e) {
    throw UserError("fidelity: claims file " + file.string() + ": " + std::string(e.description()));
  }
  const toml::array* arr = t["claim"].as_array();
  if (!arr) throw UserError("fidelity: claims file " + file.string() + " has no [[claim]] tables");
  for (size_t i = 0; i < arr->size(); ++i) {
    const toml::table* c = (*arr)[i].as_table();
    const std::string where = file.string() + ": claim " + std::to_string(i + 1);
    if (!c) throw UserError("fidelity: " + where + " is not a table");
    out.push_back(read_claim(*c, where, out));
  }
  return out;
}

bool is_role_scope(const std::string& scope) {
  return std::find(std::begin(kLinearRoleScopes), std::end(kLinearRoleScopes), scope) != std::end(kLinearRoleScopes);
}

std::string join_steps(const std::vector<int64_t>& s) {
  std::string o;
  for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
  return o;
}
}  // namespace fidelity_detail

// ------------------------------------------------------------------------------ the panel

namespace {
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

bool recipe_has_sr(const Recipe& r) {
  if (r.mode != LinearMode::FP4) return false;
  if (r.round_x == Rounding::SR8 || r.round_w == Rounding::SR8 || r.round_dy == Rounding::SR8)
    return true;
  for (const auto& ov : r.overrides)
    if (ov.has_rounding && ov.rounding == Rounding::SR8) return true;
  return false;
}

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

// Per-linear roles (docs/fidelity.md "Per-linear roles"): the X, Y and dY every linear of a
// model sees in one whole-model pass, copied by a LinearObserver, attached for its lifetime.
class Capture : public nn::LinearObserver {
 public:
  struct Ops {
    std::vector<float> X, Y, dY;
    int64_t M = 0;
    int forwards = 0, backwards = 0;
  };
  explicit Capture(nn::Model& m) : m_(m), ops_(m.linears().size()) {
    for (size_t i = 0; i < m.linears().size(); ++i) {
      index_[&m.linears()[i]] = i;
      m.linears()[i].set_observer(this);
    }
  }
  ~Capture() override {
    for (auto& lin : m_.linears()) lin.set_observer(nullptr);
  }
  Capture(const Capture&) = delete;
  Capture& operator=(const Capture&) = delete;
  void forward_done(const nn::Linear& lin, const float* X, const float* Y, int64_t M) override {
    Ops& o = ops_.at(index_.at(&lin));
    o.X.assign(X, X + M * lin.in());
    o.Y.assign(Y, Y + M * lin.out());
    o.M = M;
    ++o.forwards;
  }
  void backward_start(const nn::Linear& lin, const float* dY, int64_t M) override {
    Ops& o = ops_.at(index_.at(&lin));
    o.dY.assign(dY, dY + M * lin.out());
    ++o.backwards;
  }
  /// Forget the last pass (call before each).
  void clear() {
    for (Ops& o : ops_) o.forwards = o.backwards = 0;
  }
  /// The operands of linear i; throws std::logic_error unless the pass called it exactly once
  /// forward and once backward (the roles compare one call per linear per pass).
  const Ops& at(size_t i, const std::string& name) const {
    const Ops& o = ops_.at(i);
    if (o.forwards != 1 || o.backwards != 1)
      throw std::logic_error("fidelity: linear " + name + " ran " + std::to_string(o.forwards) +
                             " forward and " + std::to_string(o.backwards) +
                             " backward calls in one pass; per-linear roles need exactly one of each");
    return o;
  }

 private:
  nn::Model& m_;
  std::vector<Ops> ops_;
  std::map<const nn::Linear*, size_t> index_;
};

// One linear's three role tensors: Y [M, N], dX [M, K] (its own dgrad output, not accumulated
// into other linears'), dW [N, K].
struct RoleTensors {
  std::vector<float> Y, dX, dW;
};

// Replay `lin` alone on X [M, K] and dY [M, N]: a fresh Linear of the same id (so the same SR
// keys), plan and weight, holding the tensor references `refs` (the state `lin` started the
// pass with), one forward and one backward under ctx. Given the operands `lin` saw in a pass,
// it reproduces that pass's Y, and the dX and dW it contributed, bit for bit.
RoleTensors replay(const nn::Linear& lin, const std::array<TensorReference, 5>& refs,
                   const float* X, const float* dY, int64_t M, const nn::StepContext& ctx) {
  const int64_t K = lin.in(), N = lin.out();
  nn::Linear rep(lin.id(), K, N, lin.plan());
  std::vector<float> W(lin.weight(), lin.weight() + N * K);
  RoleTensors t;
  t.Y.resize(size_t(M * N));
  t.dX.assign(size_t(M * K), 0.f);
  t.dW.assign(size_t(N * K), 0.f);
  rep.bind(W.data(), t.dW.data());
  for (int r = 0; r < 5; ++r) rep.reference(static_cast<nn::Role>(r)) = refs[size_t(r)];
  rep.forward(X, t.Y.data(), M, ctx);
  rep.backward(dY, t.dX.data(), M, ctx);
  return t;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<std::array<TensorReference, 5>> reference_state(const nn::Model& m) {
  std::vector<std::array<TensorReference, 5>> s(m.linears().size());
  for (size_t i = 0; i < s.size(); ++i)
    for (int r = 0; r < 5; ++r) s[i][size_t(r)] = m.linears()[i].reference(static_cast<nn::Role>(r));
  return s;
}

// DrawMoments of R draws of one tensor against ref, accumulated one draw at a time (the
// per-linear roles keep one running sum per element instead of R copies). Per draw its sums
// (ref_sq, err_sq, dot, est_sq) are those of draw_moments to the last bit, and so is
// mean_err_sq (the mean is the same sum in draw order, divided by R); spread_sq is
// Σ_d est_sq[d] − R·Σ_i mean_i² (draw_moments sums (x − mean)² directly), equal up to rounding,
// exactly 0 for one draw.
struct StreamMoments {
  std::vector<double> sum;  // Σ_d x_d per element
  DrawMoments m;
  void add(const float* x, const float* ref, size_t n) {
    if (m.draws == 0) {
      sum.assign(n, 0.0);
      for (size_t i = 0; i < n; ++i) m.ref_sq += double(ref[i]) * ref[i];
    }
    double e = 0, dt = 0, es = 0;
    for (size_t i = 0; i < n; ++i) {
      const double v = x[i], g = ref[i];
      e += (v - g) * (v - g);
      dt += v * g;
      es += v * v;
      sum[i] += v;
    }
    m.err_sq.push_back(e);
    m.dot.push_back(dt);
    m.est_sq.push_back(es);
    ++m.draws;
  }
  DrawMoments finish(const float* ref) {
    const double R = m.draws;
    double me = 0, mm = 0, es = 0;
    for (size_t i = 0; i < sum.size(); ++i) {
      const double mean = sum[i] / R, g = ref[i];
      me += (mean - g) * (mean - g);
      mm += mean * mean;
    }
    for (double v : m.est_sq) es += v;
    m.mean_err_sq = me;
    m.spread_sq = std::max(0.0, es - R * mm);
    return m;
  }
};

// The sums of DrawMoments are over coordinates: two disjoint index sets' moments add.
void add_moments(DrawMoments& acc, const DrawMoments& m) {
  if (acc.draws == 0) {
    acc = m;
    return;
  }
  acc.ref_sq += m.ref_sq;
  for (size_t d = 0; d < acc.err_sq.size(); ++d) {
    acc.err_sq[d] += m.err_sq[d];
    acc.dot[d] += m.dot[d];
    acc.est_sq[d] += m.est_sq[d];
  }
  acc.mean_err_sq += m.mean_err_sq;
  acc.spread_sq += m.spread_sq;
}

void reset_training_references(nn::Model& m) {
  for (auto& lin : m.linears())
    for (int r = 0; r < 5; ++r) lin.reference(static_cast<nn::Role>(r)).reset();
}

}  // namespace

FidelityPanel run_fidelity(const FidelityRequest& req) {
  const auto t0 = std::chrono::steady_clock::now();
  if (req.recipes.empty()) throw UserError("fidelity: give at least one --recipe");
  for (size_t i = 0; i < req.recipes.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (req.recipes[i] == req.recipes[j])
        throw UserError("fidelity: --recipe names " + req.recipes[i] + " twice");
  if (req.batches < 2)
    throw UserError("fidelity: --batches must be at least 2 (the SGD noise is their spread), got " +
                    std::to_string(req.batches));
  if (req.draws < 1) throw UserError("fidelity: --draws must be at least 1, got " + std::to_string(req.draws));
  if (req.checkpoints < 1) throw UserError("fidelity: --checkpoints must be at least 1");
  if (req.references != "held" && req.references != "current")
    throw UserError("fidelity: --references must be held or current, got '" + req.references + "'");
  const bool held = req.references == "held";
  if (req.stress_factor != 1) {
    int e = 0;
    const double m = std::frexp(req.stress_factor, &e);
    if (!(req.stress_factor >= 2) || m != 0.5 || req.stress_factor > 1048576.0)
      throw UserError("fidelity: --stress-factor must be a power of two from 2 to 2^20 (so that the "
                      "exact computation is unchanged bit for bit), got " + std::to_string(req.stress_factor));
    if (req.stress_channels.empty()) throw UserError("fidelity: --stress-channels is empty");
    std::set<int> seen;
    for (int c : req.stress_channels)
      if (!seen.insert(c).second)
        throw UserError("fidelity: --stress-channels names channel " + std::to_string(c) +
                        " twice (it would be scaled twice)");
  }
  if (!req.claims.empty()) (void)load_claims(req.claims);  // refuse a bad file before any work
  if (!fs::exists(req.run)) throw UserError("fidelity: run directory " + req.run.string() + " does not exist");
  if (!fs::is_directory(req.run)) throw UserError("fidelity: --run " + req.run.string() + " is not a directory (give the run directory)");
  {  // the output directory, before any work
    std::error_code ec;
    fs::create_directories(req.out, ec);
    if (ec || !fs::is_directory(req.out))
      throw UserError("fidelity: output directory " + req.out.string() + " cannot be created" +
                      (ec ? ": " + ec.message() : std::string(" (a file is in the way)")));
  }
  const std::vector<fs::path> files = list_checkpoints(req.run);
  if (files.empty())
    throw UserError("fidelity: run " + req.run.string() + " holds no checkpoints (train it with "
                    "--save-every N and --keep-checkpoints large enough to keep them)");
  std::map<int64_t, fs::path> by_step;
  for (const fs::path& f : files) {
    const std::string n = f.filename().string();  // step_%08d.safetensors
    by_step[std::stoll(n.substr(5, n.find('.') - 5))] = f;
  }
  std::vector<int64_t> steps = req.steps;
  if (steps.empty()) {
    std::vector<int64_t> all;
    for (const auto& [s, f] : by_step) all.push_back(s);
    const size_t n = std::min<size_t>(size_t(req.checkpoints), all.size());
    for (size_t i = 0; i < n; ++i)  // evenly spread, the newest always included
      steps.push_back(all[n == 1 ? all.size() - 1 : (all.size() - 1) * i / (n - 1)]);
  }
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  for (int64_t s : steps)
    if (!by_step.count(s)) {
      std::string have;
      for (const auto& [st, f] : by_step) have += (have.empty() ? "" : ", ") + std::to_string(st);
      throw UserError("fidelity: run " + req.run.string() + " has no checkpoint of step " +
                      std::to_string(s) + " (it holds steps " + have + ")");
    }

  // The exact model (the first checkpoint's config, recipe fp32) and one model per recipe.
  EvalSourceSpec spec;
  spec.checkpoint = by_step[steps[0]].string();
  spec.recipe = "fp32";
  spec.data = req.data;
  EvalSource exact_src = load_eval_source(spec);
  const RunConfig& cfg = exact_src.cfg;
  const int B = req.batch_size > 0 ? req.batch_size : cfg.train.micro(), T = cfg.train.seq_len;
  std::vector<EvalSource> rsrc;
  for (const std::string& r : req.recipes) {
    EvalSourceSpec rs = spec;
    rs.recipe = r;
    try {
      rsrc.push_back(load_eval_source(rs));
      check_recipe_fits(rsrc.back().recipe, rsrc.back().cfg);  // overrides, RHT token counts
    } catch (const UserError& e) {
      throw UserError("fidelity: recipe " + r + ": " + e.what());
    }
  }
  const TokenData data = load_eval_data(exact_src, spec, req.quiet);
  std::vector<Batch> batches(static_cast<size_t>(req.batches));
  {
    BatchSampler sampler(data.train, T, B, splitmix64(req.seed, 0x66696465));  // "fide"
    for (Batch& b : batches) {
      b.in.resize(size_t(B) * T);
      b.tg.resize(b.in.size());
      sampler.next(b.in.data(), b.tg.data());
    }
  }
  // The calibrated inference policy's windows: eval's (the first 4 batches of the training split).
  const EvalWindows calib = calibration_windows(data.train, T, B, 4);
  std::vector<std::pair<const int32_t*, const int32_t*>> batch_ptrs;
  for (const Batch& b : batches) batch_ptrs.push_back({b.in.data(), b.tg.data()});
  // Capacity for the panel's batches and for the run's micro-batch (the held references' pass).
  const int cap = std::max(B, cfg.train.micro());
  auto exact = build_eval_model(exact_src, cap);
  std::vector<std::unique_ptr<nn::Model>> models;
  for (const EvalSource& s : rsrc) models.push_back(build_eval_model(s, cap));

  // Held references: each recipe's D (one per recipe) and the checkpoints its refresh steps need.
  std::vector<int> interval(models.size(), 1);
  std::set<int64_t> missing;
  auto refresh_step = [&](size_t r, int64_t t) {  // the refresh step whose references step t holds
    const int D = interval[r];
    return held && D > 1 ? t - (t - 1) % D : t;
  };
  for (size_t r = 0; r < models.size(); ++r) {
    std::set<int> ds;
    for (const auto& lin : models[r]->linears())
      if (lin.plan().mode == LinearMode::FP4) ds.insert(lin.plan().reference_interval());
    if (held && ds.size() > 1)
      throw UserError("fidelity: recipe " + req.recipes[r] + " holds references with different "
                      "intervals in different linears; the panel emulates one interval per recipe "
                      "(use --references current)");
    interval[r] = ds.empty() ? 1 : *ds.begin();
    for (int64_t s : steps) {
      const int64_t tr = refresh_step(r, s + 1);
      if (tr < s + 1 && tr > 1 && !by_step.count(tr - 1)) missing.insert(tr - 1);
    }
  }
  if (!missing.empty())
    throw UserError("fidelity: held references need the checkpoints of the steps before each "
                    "refresh step, and run " + req.run.string() + " lacks steps " +
                    join_steps({missing.begin(), missing.end()}) +
                    " (train the reference run with --save-every dividing the recipes' "
                    "amax_interval, e.g. 10 for D = 50, or pass --references current)");

  for (size_t r = 0; r < models.size(); ++r)
    for (const auto& lin : models[r]->linears())
      if (lin.plan().rht() && (int64_t(B) * T) % 16 != 0)
        throw UserError("fidelity: recipe " + req.recipes[r] + " uses the RHT, which needs the tokens per "
                        "batch (--batch-size " + std::to_string(B) + " x seq_len " + std::to_string(T) +
                        ") to be a multiple of 16");
  for (size_t r = 0; r < rsrc.size(); ++r)
    if (recipe_has_sr(rsrc[r].recipe) && req.draws < 2)
      throw UserError("fidelity: recipe " + req.recipes[r] + " rounds stochastically: its bias and "
                      "variance need --draws 2 or more, got " + std::to_string(req.draws));
  if (!req.claims.empty()) {  // scopes name whole, linears or a parameter of this model
    std::set<std::string> scopes = {"whole", "linears"};
    for (const auto& pi : exact->param_infos()) scopes.insert(pi.name);
    if (req.linear_roles) scopes.insert(std::begin(kLinearRoleScopes), std::end(kLinearRoleScopes));
    for (const Claim& cl : load_claims(req.claims))
      if (!scopes.count(cl.scope))
        throw UserError("fidelity: claim " + cl.id + ": scope '" + cl.scope + "' is not whole, linears "
                        "or a parameter of this model (e.g. " + exact->param_infos().back().name + ")" +
                        (req.linear_roles ? std::string(", nor a role scope (Y.local, Y.e2e, dX.local, dX.e2e, "
                                                        "dW.local, dW.e2e)")
                                          : std::string(" (role scopes such as dX.local need --linear-roles)")));
  }

  FidelityPanel P;
  P.run = req.run.string();
  P.references = req.references;
  P.stress_factor = req.stress_factor;
  if (req.stress_factor != 1) P.stress_channels = req.stress_channels;
  P.refresh_steps.assign(models.size(), std::vector<int64_t>(steps.size(), 0));
  P.steps = steps;
  P.batches = req.batches;
  P.draws = req.draws;
  P.tokens_per_batch = B * T;
  P.seed = req.seed;
  P.cpu = prof::cpu_model_name();
  const auto& infos = exact->param_infos();
  for (const auto& pi : infos) P.param_names.push_back(pi.name);
  if (req.linear_roles)
    for (size_t i = 0; i < exact->linears().size(); ++i) P.linear_names.push_back(exact->linear_name(i));
  // The weights of the quantized linears: parameters named after a linear ("NAME.weight").
  std::vector<std::pair<int64_t, int64_t>> linear_ranges;
  {
    std::set<std::string> lin;
    for (size_t i = 0; i < exact->linears().size(); ++i) lin.insert(exact->linear_name(i));
    for (const auto& pi : infos) {
      const std::string n = pi.name;
      const std::string base = n.size() > 7 && n.substr(n.size() - 7) == ".weight" ? n.substr(0, n.size() - 7) : n;
      if (lin.count(base)) linear_ranges.push_back({pi.offset, pi.offset + pi.size});
    }
  }
  // The outlier stress: (offset, stride, count, factor) runs of parameters to multiply.
  struct Scaled {
    int64_t offset, stride, count;
    double factor;  // applied to parameters; its inverse to gradients
  };
  std::vector<Scaled> stress;
  if (req.stress_factor != 1) {
    const int64_t Cm = cfg.model.d_model;
    for (int c : req.stress_channels)
      if (c < 0 || c >= Cm)
        throw UserError("fidelity: --stress-channels holds " + std::to_string(c) + ", outside 0.." +
                        std::to_string(Cm - 1) + " (d_model " + std::to_string(Cm) + ")");
    int norms = 0;
    for (const auto& pi : infos) {
      const std::string& n = pi.name;
      if (n.rfind("layers.", 0) != 0) continue;
      const size_t dot = n.find('.', 7);
      const std::string rest = n.substr(dot + 1);
      if (rest == "norm") {
        ++norms;
        for (int c : req.stress_channels) stress.push_back({pi.offset + c, 1, 1, req.stress_factor});
      } else if (reads_block_norm(n)) {
        if (pi.cols != Cm)
          throw UserError("fidelity: the outlier stress expects " + n + " to read d_model = " +
                          std::to_string(Cm) + " inputs, it has " + std::to_string(pi.cols));
        for (int c : req.stress_channels) stress.push_back({pi.offset + c, pi.cols, pi.rows, 1.0 / req.stress_factor});
      }
    }
    if (norms == 0) throw UserError("fidelity: the outlier stress found no block norm (layers.L.norm) in this model");
  }
  // θ' = f·θ on the stressed parameters; the gradient maps back the same way (∂L/∂θ = f·∂L/∂θ').
  // Multiplying by a power of two is exact (no value here comes near FP32's range limits).
  auto apply_stress = [&](std::vector<float>& v) {
    for (const Scaled& sc : stress) {
      const float f = float(sc.factor);
      for (int64_t i = 0; i < sc.count; ++i) v[size_t(sc.offset + i * sc.stride)] *= f;
    }
  };
  auto stressed = [&](std::vector<float> v) {
    apply_stress(v);
    return v;
  };
  // Per-linear roles under the stress: a reading linear's input channel c is S times larger and
  // its weight column c S times smaller; in the original parametrization its dX column c is ×S
  // and its dW column c ×(1/S) (exact: powers of two). Y is unchanged.
  std::vector<bool> reader(exact->linears().size(), false);
  if (!stress.empty())
    for (size_t i = 0; i < reader.size(); ++i) reader[i] = reads_block_norm(exact->linear_name(i));
  auto map_back_roles = [&](size_t i, RoleTensors& t) {
    if (!reader[i]) return;
    const int64_t Kl = exact->linears()[i].in(), Nl = exact->linears()[i].out();
    const float up = float(req.stress_factor), down = float(1.0 / req.stress_factor);
    for (int ch : req.stress_channels) {
      for (int64_t r = 0; r < int64_t(t.dX.size()) / Kl; ++r) t.dX[size_t(r * Kl + ch)] *= up;
      for (int64_t r = 0; r < Nl; ++r) t.dW[size_t(r * Kl + ch)] *= down;
    }
  };
  const size_t C = steps.size(), K = batches.size();
  const int64_t NP = exact->num_params();
  auto grid = [&] { return std::vector<std::vector<double>>(C, std::vector<double>(K, 0.0)); };
  P.exact_loss = grid();
  P.exact_grad_norm = grid();
  P.sgd_var.assign(C, 0.0);
  for (size_t r = 0; r < req.recipes.size(); ++r) {
    FidelityRecipe fr;
    fr.name = rsrc[r].recipe.name;
    fr.has_sr = recipe_has_sr(rsrc[r].recipe);
    std::vector<std::string> scopes = {"whole", "linears"};
    for (const auto& pi : infos) scopes.push_back(pi.name);
    for (const char* key : kLinearRoleScopes) {
      if (!req.linear_roles) break;
      scopes.push_back(key);
      for (const std::string& ln : P.linear_names) scopes.push_back(ln + ":" + key);
    }
    for (const std::string& sc : scopes)
      for (const char* m : kGradMetrics) fr.scopes[sc][m] = grid();
    for (const char* m : {"loss_penalty", "sgd_noise_fraction", "qnoise_to_grad"}) fr.scopes["whole"][m] = grid();
    for (const char* m : kPolicyMetrics) fr.scopes["whole"][m] = grid();
    P.recipes.push_back(std::move(fr));
  }

  // Under mpirun, batch k of every checkpoint is rank k mod P's (the exact passes, which every
  // batch's metrics and the SGD noise need, and the inference policies run on every rank); the
  // per-(checkpoint, batch) values are gathered at the end, so every value is computed by the
  // same code on the same inputs whatever the process count.
  const int nproc = dist::size(), me = dist::rank();
  auto mine = [&](size_t k) { return int(k % size_t(nproc)) == me; };
  // Scale events (telemetry of draw 0), per recipe, role and (checkpoint, batch): sums and counts.
  struct Events {
    double sat = 0, guard = 0, zeroed = 0, stale = 0;
    int64_t n = 0, n_stale = 0;
    uint64_t blocks = 0, subnormal = 0, above = 0, zero = 0;
    std::array<uint64_t, QuantStats::kRatioBins> hist{};  // blocks per floor(log2(a_b/g)) bin
  };
  std::vector<std::array<std::vector<Events>, nn::LinearTelemetry::kOperands>> events(models.size());
  for (auto& per_role : events)
    for (auto& v : per_role) v.assign(steps.size() * batches.size(), Events{});
  std::vector<std::vector<float>> gstar(K, std::vector<float>(size_t(NP)));
  // An error on one rank's batch (a non-finite gradient) would leave the others waiting in the
  // gather: under mpirun it ends every process (exit status 2, the message naming it).
  try {
  for (size_t c = 0; c < C; ++c) {
    const int64_t step = steps[c];
    const Checkpoint ck = load_checkpoint(by_step[step]);
    if (int64_t(ck.params.size()) != NP)
      throw UserError("fidelity: checkpoint " + by_step[step].string() + " holds " +
                      std::to_string(ck.params.size()) + " parameters, the model of step " +
                      std::to_string(steps[0]) + "'s config has " + std::to_string(NP));
    if (c == 0) P.config_name = ck.config_name;
    const std::vector<float> theta = stress.empty() ? ck.params : stressed(ck.params);
    nn::StepContext ex;
    ex.step = step + 1;  // the weights after `step` steps are those step + 1 computes with
    ex.seed = req.seed;
    ex.quantize = false;
    if (!stress.empty()) {  // the stress preserves the exact function: L* and g* of batch 1
      // With per-linear roles, also every linear's exact Y, dX and dW, the stressed ones mapped
      // back (an independent check of map_back_roles: nothing else compares it with the truth).
      const size_t NL = req.linear_roles ? exact->linears().size() : 0;
      // The exact pass of batch 1 (its roles observed when asked: replays leave the gradient alone).
      auto exact_pass = [&](bool stressed_pass, std::vector<RoleTensors>& t) {
        std::optional<Capture> cap;
        if (NL) cap.emplace(*exact);
        const double l = pass(*exact, batches[0], B, ex);
        const auto none = reference_state(*exact);
        t.resize(NL);
        for (size_t i = 0; i < NL; ++i) {
          const Capture::Ops& o = cap->at(i, P.linear_names[i]);
          t[i] = replay(exact->linears()[i], none[i], o.X.data(), o.dY.data(), o.M, ex);
          if (stressed_pass) map_back_roles(i, t[i]);
        }
        return l;
      };
      std::vector<RoleTensors> r0, r1;
      set_params(*exact, ck.params);
      const double l0 = exact_pass(false, r0);
      const std::vector<float> g0 = exact->grads();
      set_params(*exact, theta);
      const double l1 = exact_pass(true, r1);
      std::vector<float> g1 = exact->grads();
      apply_stress(g1);
      P.stress_loss_diff = std::max(P.stress_loss_diff, std::fabs(l1 - l0));
      for (size_t i = 0; i < g0.size(); ++i)
        P.stress_grad_diff = std::max(P.stress_grad_diff, double(std::fabs(g1[i] - g0[i])));
      for (size_t i = 0; i < NL; ++i)
        for (auto mem : {&RoleTensors::Y, &RoleTensors::dX, &RoleTensors::dW})
          for (size_t e = 0; e < (r0[i].*mem).size(); ++e)
            P.stress_roles_diff = std::max(P.stress_roles_diff, double(std::fabs((r1[i].*mem)[e] - (r0[i].*mem)[e])));
    }
    set_params(*exact, theta);
    for (size_t k = 0; k < K; ++k) {
      P.exact_loss[c][k] = pass(*exact, batches[k], B, ex);
      gstar[k] = exact->grads();
      apply_stress(gstar[k]);  // back to the original parametrization (nothing without stress)
      double n2 = 0;
      for (float g : gstar[k]) n2 += double(g) * g;
      P.exact_grad_norm[c][k] = std::sqrt(n2);
    }
    {  // SGD noise: the spread of the K exact gradients about their mean
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
    for (size_t r = 0; r < models.size(); ++r) {
      nn::Model& m = *models[r];
      FidelityRecipe& fr = P.recipes[r];
      // Held references: one training pass at the refresh step t_r, on the weights after t_r − 1
      // steps and the first micro-batch of step t_r, leaves each linear holding what it would
      // hold at step + 1 (t_r ≤ step + 1 < t_r + D: no refresh below).
      const int64_t tr = refresh_step(r, step + 1);
      P.refresh_steps[r][c] = tr;
      const bool hold = tr < step + 1;
      if (hold) {
        if (tr == 1) {
          m.init(cfg.train.seed);  // the run's initial weights
          if (!stress.empty()) set_params(m, stressed(m.params()));
        } else {
          set_params(m, stressed(load_checkpoint(by_step[tr - 1]).params));
        }
        BatchSampler train_sampler(data.train, T, cfg.train.batch_size, cfg.train.seed);
        train_sampler.set_draws(uint64_t(tr - 1));  // one draw of batch_size windows per step
        std::vector<int32_t> in(size_t(cfg.train.batch_size) * T), tg(in.size());
        train_sampler.next(in.data(), tg.data());
        // The run's first micro-batch of step t_r (its micro() sequences).
        const int mb = cfg.train.micro();
        Batch first;
        first.in.assign(in.begin(), in.begin() + size_t(mb) * T);
        first.tg.assign(tg.begin(), tg.begin() + size_t(mb) * T);
        nn::StepContext q;
        q.step = tr;
        q.seed = req.seed;
        reset_training_references(m);
        (void)pass(m, first, mb, q);
      }
      set_params(m, theta);
      for (size_t p = 0; p < std::size(kPolicyMetrics); ++p) {  // inference never touches training references
        const std::vector<double> lp =
            evaluate_batches_nll(m, batch_ptrs, T, B, parse_eval_policy(kPolicyNames[p]), &calib);
        for (size_t k = 0; k < K; ++k) {
          if (!std::isfinite(lp[k]))
            throw UserError("fidelity: recipe " + fr.name + " gives a non-finite loss under the " +
                            kPolicyNames[p] + " inference policy at checkpoint " + std::to_string(step) +
                            ", batch " + std::to_string(k + 1));
          fr.scopes["whole"][kPolicyMetrics[p]][c][k] = lp[k] - P.exact_loss[c][k];
        }
      }
      const int R = fr.has_sr ? req.draws : 1;  // without SR every draw gives the same bits
      std::vector<std::vector<float>> g(static_cast<size_t>(R), std::vector<float>(static_cast<size_t>(NP)));
      for (size_t k = 0; k < K; ++k) {
        if (!mine(k)) continue;  // another rank's batch
        double loss = 0;
        // Per-linear roles: the exact pass of this batch, observed (X*, Y*, dY* of every linear),
        // and each linear's exact dX* and dW* replayed alone in FP32.
        const size_t NL = req.linear_roles ? m.linears().size() : 0;
        std::optional<Capture> cex, cr;
        std::vector<RoleTensors> star(NL);
        // acc[i][j]: linear i's tensor of role scope j (kLinearRoleScopes), over the draws.
        std::vector<std::array<StreamMoments, 6>> acc(NL);
        if (NL) {
          cex.emplace(*exact);
          (void)pass(*exact, batches[k], B, ex);
          const auto none = reference_state(*exact);
          for (size_t i = 0; i < NL; ++i) {
            const Capture::Ops& o = cex->at(i, P.linear_names[i]);
            star[i] = replay(exact->linears()[i], none[i], o.X.data(), o.dY.data(), o.M, ex);
            if (!same_bits(star[i].Y, o.Y))
              throw std::logic_error("fidelity: the FP32 replay of " + P.linear_names[i] + " differs from its pass");
            map_back_roles(i, star[i]);
          }
          cr.emplace(m);
        }
        for (int d = 0; d < R; ++d) {
          nn::StepContext q;
          q.step = step + 1;
          q.seed = req.seed + uint64_t(d);  // draw d's SR stream
          q.telemetry = d == 0;             // scale events (the quantized bits are the same)
          if (!hold) reset_training_references(m);  // current: references of this batch
          const auto refs0 = NL ? reference_state(m) : std::vector<std::array<TensorReference, 5>>{};
          if (NL) cr->clear();
          const double l = pass(m, batches[k], B, q);
          g[size_t(d)] = m.grads();
          apply_stress(g[size_t(d)]);  // the original parametrization
          const auto bad = std::find_if(g[size_t(d)].begin(), g[size_t(d)].end(),
                                        [](float v) { return !std::isfinite(v); });
          if (!std::isfinite(l) || bad != g[size_t(d)].end())
            throw UserError("fidelity: recipe " + fr.name + " gives a non-finite " +
                            (std::isfinite(l) ? "gradient (parameter element " +
                                                    std::to_string(bad - g[size_t(d)].begin()) + ")"
                                              : std::string("loss")) +
                            " at checkpoint " + std::to_string(step) + ", batch " +
                            std::to_string(k + 1) + ", draw " + std::to_string(d + 1) +
                            (hold ? " (references held from step " + std::to_string(tr) + ")" : ""));
          for (size_t i = 0; i < NL; ++i) {  // e2e: its own pass's X and dY; local: X* and dY*
            const Capture::Ops& o = cr->at(i, P.linear_names[i]);
            const Capture::Ops& ox = cex->at(i, P.linear_names[i]);
            nn::StepContext qr = q;
            qr.telemetry = false;
            RoleTensors e2e = replay(m.linears()[i], refs0[i], o.X.data(), o.dY.data(), o.M, qr);
            if (!same_bits(e2e.Y, o.Y))  // the replay must see what the pass computed
              throw std::logic_error("fidelity: recipe " + fr.name + ": the replay of " + P.linear_names[i] +
                                     " differs from its pass");
            RoleTensors loc = replay(m.linears()[i], refs0[i], ox.X.data(), ox.dY.data(), ox.M, qr);
            map_back_roles(i, e2e);
            map_back_roles(i, loc);
            const std::vector<float>* est[6] = {&loc.Y, &e2e.Y, &loc.dX, &e2e.dX, &loc.dW, &e2e.dW};
            for (size_t j = 0; j < 6; ++j) {
              const std::vector<float>& ref = j < 2 ? star[i].Y : j < 4 ? star[i].dX : star[i].dW;
              acc[i][j].add(est[j]->data(), ref.data(), ref.size());
            }
          }
          loss += l;
          if (d == 0)
            for (const auto& lin : m.linears()) {
              const nn::LinearTelemetry& t = lin.telemetry();
              if (!t.valid) continue;
              for (int o = 0; o < nn::LinearTelemetry::kOperands; ++o) {
                const QuantStats& qs = t.op[o];
                Events& e = events[r][size_t(o)][c * K + k];
                e.sat += qs.saturated_blocks;
                e.guard += qs.zero_guard_blocks;
                e.zeroed += qs.zeroed_nonzeros;
                ++e.n;
                if (qs.has_staleness) e.stale += qs.staleness, ++e.n_stale;
                if (qs.ratio_to_g) e.zero += qs.zero_blocks;
                if (qs.ratio_to_g)
                  for (int b = 0; b < QuantStats::kRatioBins; ++b) {
                    const uint64_t cnt = qs.log2_amax_ratio_blocks[size_t(b)];
                    const int lg = b - QuantStats::kRatioBias;  // a_b/g in [2^lg, 2^(lg+1))
                    e.blocks += cnt;
                    if (lg + 1 <= -15) e.subnormal += cnt;
                    if (lg >= 0) e.above += cnt;
                    e.hist[size_t(b)] += cnt;
                  }
              }
            }
        }
        std::vector<const float*> est;
        for (const auto& v : g) est.push_back(v.data());
        auto put = [&](const std::string& scope, const DrawMoments& mo) {
          const DrawMetrics dm = draw_metrics(mo);
          auto& s = fr.scopes[scope];
          s["rel_error"][c][k] = dm.rel_error;
          s["cosine"][c][k] = dm.cosine;
          s["gain"][c][k] = dm.gain;
          s["mse"][c][k] = dm.mse;
          s["bias2"][c][k] = dm.bias2;
          s["variance"][c][k] = dm.variance;
          return dm;
        };
        const DrawMoments whole = draw_moments(est, gstar[k].data(), NP);
        const DrawMetrics dw = put("whole", whole);
        put("linears", draw_moments(est, gstar[k].data(), linear_ranges));
        for (size_t j = 0; j < 6 && NL; ++j) {  // each role and form: per linear, and concatenated
          DrawMoments all;
          for (size_t i = 0; i < NL; ++i) {
            const std::vector<float>& ref = j < 2 ? star[i].Y : j < 4 ? star[i].dX : star[i].dW;
            const DrawMoments mo = acc[i][j].finish(ref.data());
            put(P.linear_names[i] + ":" + kLinearRoleScopes[j], mo);
            add_moments(all, mo);
          }
          put(kLinearRoleScopes[j], all);
        }
        for (const auto& pi : infos)
          put(pi.name, draw_moments(est, gstar[k].data(), {{pi.offset, pi.offset + pi.size}}));
        auto& w = fr.scopes["whole"];
        w["loss_penalty"][c][k] = loss / R - P.exact_loss[c][k];
        w["sgd_noise_fraction"][c][k] = dw.mse * whole.ref_sq / P.sgd_var[c];
        w["qnoise_to_grad"][c][k] = std::sqrt(dw.mse);  // σ_q/‖g*‖; reported inverted too
      }
    }
    if (!req.quiet && me == 0)
      std::fprintf(stderr, "fidelity: checkpoint %zu/%zu (step %lld): %zu batches x %zu recipes done, %.0f s\n",
                   c + 1, C, static_cast<long long>(step), K, models.size(),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  } catch (const UserError& e) {
    if (nproc > 1) dist::abort_all(e.what(), 2);
    throw;
  }
  // Every rank's batches to every rank: each (checkpoint, batch) value from the rank that owns it.
  constexpr size_t kEv = 10 + QuantStats::kRatioBins;  // an Events as doubles (counts < 2^53: exact)
  auto ev_put = [](const Events& e, double* x) {
    const double v[10] = {e.sat, e.guard, e.zeroed, e.stale, double(e.n), double(e.n_stale),
                          double(e.blocks), double(e.subnormal), double(e.above), double(e.zero)};
    std::copy(v, v + 10, x);
    for (int b = 0; b < QuantStats::kRatioBins; ++b) x[10 + b] = double(e.hist[size_t(b)]);
  };
  auto ev_get = [](const double* x, Events& e) {
    e.sat = x[0], e.guard = x[1], e.zeroed = x[2], e.stale = x[3];
    e.n = int64_t(x[4]), e.n_stale = int64_t(x[5]);
    e.blocks = uint64_t(x[6]), e.subnormal = uint64_t(x[7]), e.above = uint64_t(x[8]), e.zero = uint64_t(x[9]);
    for (int b = 0; b < QuantStats::kRatioBins; ++b) e.hist[size_t(b)] = uint64_t(x[10 + b]);
  };
  if (nproc > 1) {
    std::vector<std::vector<std::vector<double>>*> grids;  // every recipe's [c][k] grids, in map order
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
        for (const Events& e : v) ev_put(e, &mine_v[at]), at += kEv;
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
        for (size_t ck = 0; ck < CK; ++ck, at += kEv) ev_get(&all[owner(ck % K) + at], v[ck]);
  }
  for (size_t r = 0; r < models.size(); ++r)
    for (int o = 0; o < nn::LinearTelemetry::kOperands; ++o) {
      Events e;  // the sums over checkpoints and batches, in their order
      for (const Events& x : events[r][size_t(o)]) {
        e.sat += x.sat, e.guard += x.guard, e.zeroed += x.zeroed, e.stale += x.stale;
        e.n += x.n, e.n_stale += x.n_stale;
        e.blocks += x.blocks, e.subnormal += x.subnormal, e.above += x.above, e.zero += x.zero;
        for (int b = 0; b < QuantStats::kRatioBins; ++b) e.hist[size_t(b)] += x.hist[size_t(b)];
      }
      if (e.n == 0) continue;
      auto& m = P.recipes[r].scale_events[nn::LinearTelemetry::kNames[o]];
      m["saturated_blocks"] = e.sat / double(e.n);
      m["zero_guard_blocks"] = e.guard / double(e.n);
      m["zeroed_nonzeros"] = e.zeroed / double(e.n);
      if (e.n_stale) m["staleness"] = e.stale / double(e.n_stale);
      if (e.blocks) {
        m["e4m3_subnormal_blocks"] = double(e.subnormal) / double(e.blocks);
        m["at_or_above_reference_blocks"] = double(e.above) / double(e.blocks);
        m["zero_blocks"] = double(e.zero) / double(e.blocks + e.zero);
        // Quantiles of log2(a_b/g) over the nonzero blocks (the floor of the bin holding it).
        const std::pair<const char*, double> qs[] = {{"log2_ratio_q0.001", 0.001}, {"log2_ratio_q0.01", 0.01},
                                                     {"log2_ratio_q0.5", 0.5}, {"log2_ratio_q0.99", 0.99},
                                                     {"log2_ratio_q0.999", 0.999}};
        for (const auto& [key, q] : qs) {
          const double want = q * double(e.blocks);
          uint64_t cum = 0;
          for (int b = 0; b < QuantStats::kRatioBins; ++b) {
            cum += e.hist[size_t(b)];
            if (double(cum) >= want && cum > 0) {
              m[key] = double(b - QuantStats::kRatioBias);
              break;
            }
          }
        }
      }
    }
  P.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return P;
}

}  // namespace fp4
