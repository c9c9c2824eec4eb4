// The numerics fields of a telemetry step's metrics.jsonl line (telemetry_json.h).
#include "telemetry_json.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <utility>
#include <vector>

#include "fp4/numerics/telemetry.h"

namespace fp4::train_detail {
using json = nlohmann::json;

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

// Where the blocks fall (docs/evaluation.md "Numerics telemetry", `scale_hist`), on a telemetry
// step: for each operand role, the histograms of QuantStats summed over every FP4 linear of
// that role and scale format, and the same for the model's final down_proj alone (the reference
// implementation captures those). Dense from the first to the last nonzero bin, to keep
// metrics.jsonl small:
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

}  // namespace fp4::train_detail
