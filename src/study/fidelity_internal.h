// What the fidelity panel's files share (private to src/study/): the claims file, the metric
// names, and the per-linear roles' building blocks (docs/fidelity.md "Per-linear roles"):
// the Capture observer, the replay of one linear, the streamed moments. fidelity.cpp holds the
// statistics and the claims, fidelity_roles.cpp the roles' blocks, fidelity_run.cpp the passes
// (run_fidelity), fidelity_report.cpp the report and its reading back.
#pragma once
#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "fp4/nn/model.h"
#include "fp4/study/fidelity.h"

namespace fp4::fidelity_detail {

// ------------------------------------------------------------------------------ claims

/// One [[claim]] of a claims file (docs/fidelity.md "Statistics").
struct Claim {
  std::string id, text, metric, scope = "whole", expect;  // "lower" | "higher" | "within"
  double bound = 0;                                       // expect = "within": |contrast| ≤ bound
  /// The contrast Σ coefficient × metric(recipe): a = +1, b = −1, or the file's terms.
  std::vector<std::pair<std::string, double>> terms;
};

/// The claims of `file`, checked (keys, expect, bound, metric and its scope). Throws
/// fp4::UserError naming the file, the claim and what is wrong.
std::vector<Claim> load_claims(const std::filesystem::path& file);

// ------------------------------------------------------------------------------ checkpoints

/// n of `all` (ascending), evenly spread, the last always included; all of them when n is larger.
std::vector<int64_t> spread_steps(const std::vector<int64_t>& all, size_t n);
/// A run's checkpoints by step (list_checkpoints). Throws fp4::UserError "<who>: run R holds no
/// checkpoints (...)" when it has none.
std::map<int64_t, std::filesystem::path> checkpoints_by_step(const std::filesystem::path& run,
                                                             const std::string& who);
/// The steps to evaluate: `steps` (sorted, duplicates dropped), or n of the run's evenly spread,
/// the newest always included. Throws fp4::UserError naming a step the run does not hold and
/// the steps it holds.
std::vector<int64_t> choose_steps(const std::map<int64_t, std::filesystem::path>& by_step,
                                  std::vector<int64_t> steps, int n,
                                  const std::filesystem::path& run, const std::string& who);

// ------------------------------------------------------------------------------ names

inline constexpr const char* kGradMetrics[] = {"rel_error", "cosine", "gain",
                                               "mse",       "bias2",  "variance"};
/// The metrics of per-parameter and per-linear means and of the role scopes' intervals.
inline constexpr const char* kMeanMetrics[] = {"rel_error", "cosine", "gain", "bias2", "variance"};
/// The loss penalty under each inference policy of `fp4train eval` (whole scope): the panel's K
/// batches of a checkpoint as one ordered evaluation (Replay's clock: the batch index).
inline constexpr const char* kPolicyMetrics[] = {"loss_penalty_current", "loss_penalty_replay_d50",
                                                 "loss_penalty_calibrated"};
inline constexpr const char* kPolicyNames[] = {"current", "replay-d50", "calibrated"};

/// Whether `scope` is one of kLinearRoleScopes.
bool is_role_scope(const std::string& scope);
/// "10, 20, 30".
std::string join_steps(const std::vector<int64_t>& s);

// ------------------------------------------------------------------------------ per-linear roles

/// The X, Y and dY every linear of a model sees in one whole-model pass, copied by a
/// LinearObserver, attached for its lifetime.
class Capture : public nn::LinearObserver {
 public:
  struct Ops {
    std::vector<float> X, Y, dY;
    int64_t M = 0;
    int forwards = 0, backwards = 0;
  };
  explicit Capture(nn::Model& m);
  ~Capture() override;
  Capture(const Capture&) = delete;
  Capture& operator=(const Capture&) = delete;
  void forward_done(const nn::Linear& lin, const float* X, const float* Y, int64_t M) override;
  void backward_start(const nn::Linear& lin, const float* dY, int64_t M) override;
  /// Forget the last pass (call before each).
  void clear();
  /// The operands of linear i; throws std::logic_error unless the pass called it exactly once
  /// forward and once backward (the roles compare one call per linear per pass).
  const Ops& at(size_t i, const std::string& name) const;

 private:
  nn::Model& m_;
  std::vector<Ops> ops_;
  std::map<const nn::Linear*, size_t> index_;
};

/// One linear's three role tensors: Y [M, N], dX [M, K] (its own dgrad output, not accumulated
/// into other linears'), dW [N, K].
struct RoleTensors {
  std::vector<float> Y, dX, dW;
};

/// The five tensor references of every linear of a model (the state a pass starts with).
using ReferenceState = std::vector<std::array<TensorReference, nn::kRoleCount>>;

/// Replay `lin` alone on X [M, K] and dY [M, N]: a fresh Linear of the same id (so the same SR
/// keys), plan and weight, holding the tensor references `refs` (the state `lin` started the
/// pass with), one forward and one backward under ctx. Given the operands `lin` saw in a pass,
/// it reproduces that pass's Y, and the dX and dW it contributed, bit for bit.
RoleTensors replay(const nn::Linear& lin, const std::array<TensorReference, nn::kRoleCount>& refs,
                   const float* X, const float* dY, int64_t M, const nn::StepContext& ctx);

bool same_bits(const std::vector<float>& a, const std::vector<float>& b);

ReferenceState reference_state(const nn::Model& m);

/// DrawMoments of R draws of one tensor against ref, accumulated one draw at a time (the
/// per-linear roles keep one running sum per element instead of R copies). Per draw its sums
/// (ref_sq, err_sq, dot, est_sq) are those of draw_moments to the last bit, and so is
/// mean_err_sq (the mean is the same sum in draw order, divided by R); spread_sq is
/// Σ_d est_sq[d] − R·Σ_i mean_i² (draw_moments sums (x − mean)² directly), equal up to rounding,
/// exactly 0 for one draw.
struct StreamMoments {
  std::vector<double> sum;  // Σ_d x_d per element
  DrawMoments m;
  void add(const float* x, const float* ref, size_t n);
  DrawMoments finish(const float* ref);
};

/// The sums of DrawMoments are over coordinates: two disjoint index sets' moments add.
void add_moments(DrawMoments& acc, const DrawMoments& m);

}  // namespace fp4::fidelity_detail
