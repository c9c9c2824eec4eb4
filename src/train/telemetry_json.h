// The numerics fields of a telemetry step's metrics.jsonl line, which the training loop
// (trainer.cpp) writes: per-linear quantization statistics and the scale histograms
// (docs/evaluation.md "Numerics telemetry"), kept out of trainer.cpp so that the loop reads as
// its stages (docs/design.md "How data flows"). Private to src/train/.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "fp4/nn/model.h"

namespace fp4::train_detail {

/// {"layers.0.mixer.q_proj": {"x": {...}, "w": ..., "dy": ..., "dyt": ..., "xt": ...}, ...}
/// for every FP4 linear whose telemetry is valid (Linear::telemetry()), each operand's
/// saturated_blocks, zero_guard_blocks, zeroed_nonzeros, rel_error and (not under the MX rules)
/// staleness. Sets `digest` to the "numerics | worst rel. error ..." line naming the worst
/// layer and operand of each statistic, and leaves it as it was when no linear has telemetry.
/// Throws nothing but std::bad_alloc.
nlohmann::json telemetry_record(const nn::Model& model, std::string& digest);

/// The scale_hist field of a telemetry step: per operand role and scale format, the block
/// histograms over every FP4 linear, then those of the model's final down_proj alone (the
/// layout is described at the definition, telemetry_json.cpp). Throws nothing but
/// std::bad_alloc.
nlohmann::json scale_hist_record(const nn::Model& model);

}  // namespace fp4::train_detail
