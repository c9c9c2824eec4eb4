// What the fidelity panel's files share (private to src/study/): the claims file and the metric
// names. fidelity.cpp holds the statistics, the claims and the passes (run_fidelity),
// fidelity_report.cpp the report and its reading back.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "fp4/study/fidelity.h"

namespace fp4::fidelity_detail {

// ------------------------------------------------------------------------------ claims

/// One [[claim]] of a claims file (docs/fidelity.md "Statistics").
struct Claim {
  std::string id, text, metric, scope = "whole", expect;  // "lower" | "higher" | "within"
  double bound = 0;  // expect = "within": |contrast| ≤ bound
  /// The contrast Σ coefficient × metric(recipe): a = +1, b = −1, or the file's terms.
  std::vector<std::pair<std::string, double>> terms;
};

/// The claims of `file`, checked (keys, expect, bound, metric and its scope). Throws
/// fp4::UserError naming the file, the claim and what is wrong.
std::vector<Claim> load_claims(const std::filesystem::path& file);

// ------------------------------------------------------------------------------ names

inline constexpr const char* kGradMetrics[] = {"rel_error", "cosine", "gain", "mse", "bias2", "variance"};
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

}  // namespace fp4::fidelity_detail
