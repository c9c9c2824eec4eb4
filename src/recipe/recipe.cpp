// Recipe files: TOML → fp4::Recipe, strictly validated.
#include "fp4/recipe/recipe.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>

#include "fp4/base/error.h"
#include "fp4/config/config.h"
#include "fp4/config/toml_reader.h"
#include "fp4/gemm/accumulator.h"

namespace fp4 {
namespace {
LinearMode parse_mode(detail::TomlReader& r, const std::string& key, const std::string& v) {
  r.choice(key, v, {"fp32", "bf16", "fp4"});
  return v == "fp32" ? LinearMode::FP32 : v == "bf16" ? LinearMode::BF16 : LinearMode::FP4;
}
Rounding parse_rounding(detail::TomlReader& r, const std::string& key, const std::string& v) {
  r.choice(key, v, {"rne", "sr8", "rna"});  // rna: docs/numerics.md "Rounding a magnitude"
  return parse_rounding_name(v);
}
std::string int_list(const std::vector<int>& v) {
  std::string o = "[";
  for (size_t i = 0; i < v.size(); ++i) o += (i ? ", " : "") + std::to_string(v[i]);
  return o + "]";
}
// Shortest exact decimal (reloads bit for bit: checkpoint resume compares recipes).
template <class T>
std::string float_str(T v) {
  std::string s = detail::toml_number(v);
  // A TOML float needs a '.', an exponent, or inf/nan.
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}
}  // namespace

const char* gemm_name(Gemm g) {
  switch (g) {
    case Gemm::Fprop: return "fprop";
    case Gemm::Dgrad: return "dgrad";
    case Gemm::Wgrad: return "wgrad";
  }
  return "?";
}
const char* operand_name(Operand o) {
  switch (o) {
    case Operand::X: return "x";
    case Operand::W: return "w";
    case Operand::DY: return "dy";
  }
  return "?";
}
bool gemm_uses(Gemm g, Operand o) {
  switch (g) {
    case Gemm::Fprop: return o != Operand::DY;
    case Gemm::Dgrad: return o != Operand::X;
    case Gemm::Wgrad: return o != Operand::W;
  }
  return false;
}

const std::vector<std::string>& linear_kinds() {
  static const std::vector<std::string> k = {"in_proj", "out_proj", "q_proj",  "k_proj",
                                             "v_proj",  "o_proj",   "up_proj", "down_proj"};
  return k;
}

std::string canonical_linear_kind(const std::string& name) {
  const auto& kinds = linear_kinds();
  if (std::find(kinds.begin(), kinds.end(), name) != kinds.end()) return name;
  static const std::pair<const char*, const char*> aliases[] = {
      {"attn.q", "q_proj"}, {"attn.k", "k_proj"},   {"attn.v", "v_proj"},
      {"attn.o", "o_proj"}, {"mlp.up", "up_proj"}, {"mlp.down", "down_proj"}};
  for (const auto& [a, k] : aliases)
    if (name == a) return k;
  return "";
}

std::string legacy_linear_name(const std::string& kind) {
  static const std::pair<const char*, const char*> names[] = {
      {"q_proj", "attn.q"}, {"k_proj", "attn.k"},   {"v_proj", "attn.v"},
      {"o_proj", "attn.o"}, {"up_proj", "mlp.up"}, {"down_proj", "mlp.down"}};
  for (const auto& [k, a] : names)
    if (kind == k) return a;
  return "";
}

std::vector<LinearSite> llama_linear_sites(int n_layers) {
  std::vector<LinearSite> s;
  for (int l = 0; l < n_layers; ++l) {
    for (const char* k : {"q_proj", "k_proj", "v_proj", "o_proj"}) s.push_back({2 * l, k});
    for (const char* k : {"up_proj", "down_proj"}) s.push_back({2 * l + 1, k});
  }
  return s;
}

namespace {
bool has_kind(const LinearOverride& ov, const std::string& kind) {
  return std::find(ov.linears.begin(), ov.linears.end(), kind) != ov.linears.end();
}
// Number of blocks holding a linear of kind `kind`.
int blocks_holding(const std::string& kind, const std::vector<LinearSite>& sites) {
  int n = 0;
  for (const LinearSite& s : sites) n += s.kind == kind;
  return n;
}
bool llama_pattern(const std::vector<LinearSite>& sites) {
  const std::vector<LinearSite> ref = llama_linear_sites(int(sites.size() / 6));
  if (ref.size() != sites.size()) return false;
  for (size_t i = 0; i < ref.size(); ++i)
    if (ref[i].block != sites[i].block || ref[i].kind != sites[i].kind) return false;
  return true;
}
}  // namespace

bool LinearOverride::selects(const std::vector<LinearSite>& sites, size_t i) const {
  const LinearSite& site = sites[i];
  if (!has_kind(*this, site.kind)) return false;
  if (final_blocks == 0 && blocks.empty()) return true;
  // Explicit blocks: hybrid block indices, or layers for the Llama-only names (block 2l is
  // layer l's attention, 2l + 1 its MLP).
  const int b = legacy_layers ? site.block / 2 : site.block;
  for (int x : blocks)
    if (x == b) return true;
  if (final_blocks == 0) return false;
  // Rank of this linear among the linears of its kind, from the end (one per block).
  int later = 0;
  for (size_t j = i + 1; j < sites.size(); ++j) later += sites[j].kind == site.kind;
  return later < final_blocks;
}

std::string LinearOverride::describe() const {
  std::string o = "linears = [";
  for (size_t i = 0; i < linears.size(); ++i) o += (i ? ", \"" : "\"") + linears[i] + "\"";
  o += "]";
  if (final_blocks > 0) o += ", final_blocks = " + std::to_string(final_blocks);
  if (!blocks.empty()) o += std::string(legacy_layers ? ", layers = " : ", blocks = ") + int_list(blocks);
  if (has_gemm) o += std::string(", gemm = \"") + gemm_name(gemm) + "\"";
  if (has_role) o += std::string(", role = \"") + operand_name(role) + "\"";
  o += ":";
  if (has_mode) o += std::string(" mode = \"") + linear_mode_name(mode) + "\"";
  if (has_scale_target) o += " scale_target = " + float_str(scale_target);
  if (has_rounding) o += std::string(" rounding = \"") + rounding_name(rounding) + "\"";
  return o;
}

const char* linear_mode_name(LinearMode m) {
  switch (m) {
    case LinearMode::FP32: return "fp32";
    case LinearMode::BF16: return "bf16";
    case LinearMode::FP4: return "fp4";
  }
  return "?";
}

int Recipe::final_high_precision_blocks(int n_blocks) const {
  int keep = 0;
  if (final_blocks_fraction > 0) {
    keep = static_cast<int>(std::floor(final_blocks_fraction * n_blocks + 0.5));
    if (keep < 1) keep = 1;
  }
  return std::max(keep, final_blocks);
}

LinearMode Recipe::block_mode(int b, int n_blocks) const {
  if (mode != LinearMode::FP4) return mode;
  for (int x : blocks)
    if (x == b) return high_precision_mode;
  if (b >= n_blocks - final_high_precision_blocks(n_blocks)) return high_precision_mode;
  return LinearMode::FP4;
}

std::string Recipe::where() const {
  return "recipe " + name + (source.empty() ? "" : " (" + source + ")");
}

std::string Recipe::scale_format_str() const {
  return scale_desc ? scale_desc->name : scale_format_name(scale_format);
}

namespace {
BlockQuantSpec make_spec(const Recipe& r, Operand role, int block, bool two_d, Rounding rounding) {
  BlockQuantSpec s{r.scale_format, block, two_d, r.scale_target, rounding};
  s.element = r.element_format;
  s.scale_rule = r.scale_rule;
  s.scale_desc = r.scale_desc;
  if (four_over_six_applies(r.four_over_six, role)) {  // docs/recipes.md "Four Over Six"
    s.four_over_six = r.four_over_six_error;
    if (r.four_over_six_scale_target > 0.f) s.target = r.four_over_six_scale_target;
  }
  return s;
}
}  // namespace

BlockQuantSpec Recipe::spec_x() const {
  return make_spec(*this, Operand::X, block, false, round_x);
}
BlockQuantSpec Recipe::spec_w() const {
  return make_spec(*this, Operand::W, weight_block_size(), weight_2d, round_w);
}
BlockQuantSpec Recipe::spec_dy() const {
  return make_spec(*this, Operand::DY, block, false, round_dy);
}

// ---- Four Over Six roles
const char* four_over_six_roles_name(FourOverSixRoles r) {
  switch (r) {
    case FourOverSixRoles::None: return "none";
    case FourOverSixRoles::Weights: return "weights";
    case FourOverSixRoles::Activations: return "activations";
    case FourOverSixRoles::Gradients: return "gradients";
    case FourOverSixRoles::All: return "all";
  }
  return "?";
}

bool four_over_six_applies(FourOverSixRoles r, Operand o) {
  return r == FourOverSixRoles::All || (r == FourOverSixRoles::Weights && o == Operand::W) ||
         (r == FourOverSixRoles::Activations && o == Operand::X) ||
         (r == FourOverSixRoles::Gradients && o == Operand::DY);
}

LinearPlan LinearPlan::uniform(const Recipe& r, LinearMode mode) {
  LinearPlan p;
  p.mode = mode;
  const BlockQuantSpec by_op[3] = {r.spec_x(), r.spec_w(), r.spec_dy()};
  for (int g = 0; g < 3; ++g)
    for (int o = 0; o < 3; ++o) p.specs[g][o] = by_op[o];
  p.gemm = r.gemm;
  p.probe_snap = r.probe_snap;
  p.probe_alpha = r.probe_alpha;
  p.amax_interval = r.amax_interval;
  p.amax_sample = r.amax_sample;
  p.rht_wgrad = r.rht_wgrad;
  p.rht_precision = r.rht_precision;
  p.hadamard_size = r.hadamard_size;
  p.hadamard_dgrad = r.hadamard_dgrad;
  p.hadamard_signs = r.hadamard_signs;
  p.bf16_boundary = r.bf16_boundary;
  p.bf16_outputs = r.bf16_outputs;
  p.row_scaled_activation = r.row_scaled_activation;
  p.forward_quantizer = r.forward_quantizer;
  p.backward_quantizer = r.backward_quantizer;
  return p;
}

const char* forward_quantizer_name(ForwardQuantizer q) {
  return q == ForwardQuantizer::QuartetRtn ? "quartet2-rtn" : "blocks";
}

const char* backward_quantizer_name(BackwardQuantizer q) {
  return q == BackwardQuantizer::MsEden ? "ms-eden" : "blocks";
}

void check_rht_tokens(const LinearPlan& plan, int64_t M, const std::string& who) {
  if (plan.rht() && M % 16 != 0)
    throw std::invalid_argument(who + ": RHT needs the token count M = " + std::to_string(M) +
                                " to be a multiple of 16");
}

void check_hadamard_shape(const LinearPlan& plan, int64_t M, int64_t N, const std::string& who) {
  if (plan.ms_eden()) return;  // MS-EDEN zero-pads the inner dims to a multiple of n
  const int n = plan.hadamard_size;
  auto fail = [&](const char* gemm, const char* dim, int64_t v) {
    throw std::invalid_argument(who + ": the " + std::to_string(n) + "-point Hadamard transform "
                                "of the " + gemm + " operands needs " + dim + " = " +
                                std::to_string(v) + " to be a multiple of " + std::to_string(n));
  };
  if (plan.rht() && n == 16) check_rht_tokens(plan, M, who);  // today's message for today's RHT
  if (plan.rht() && M % n != 0) fail("wgrad", "the token count M", M);
  if (plan.dgrad_hadamard() && N % n != 0) fail("dgrad", "the output features N", N);
}

ResolvedLinears resolve_linear_plans(const Recipe& r, const std::vector<LinearSite>& sites,
                                     int n_blocks) {
  auto fail = [&](const std::string& key, const std::string& what) {
    throw UserError(r.where() + ": key '" + key + "': " + what);
  };
  auto check_blocks = [&](const std::string& prefix, const std::vector<int>& bl) {
    for (int b : bl)
      if (b < 0 || b >= n_blocks)
        fail(prefix + "blocks", "holds block " + std::to_string(b) + " but the model has " +
                                    std::to_string(n_blocks) + " blocks (0.." +
                                    std::to_string(n_blocks - 1) + ")");
  };
  check_blocks("high_precision.", r.blocks);
  if (r.final_blocks < 0 || r.final_blocks > n_blocks)
    fail("high_precision.final_blocks", "is " + std::to_string(r.final_blocks) +
                                            " but the model has only " +
                                            std::to_string(n_blocks) + " blocks");
  ResolvedLinears res;
  res.plans.reserve(sites.size());
  for (const LinearSite& s : sites)
    res.plans.push_back(LinearPlan::uniform(r, r.block_mode(s.block, n_blocks)));
  res.override_hits.resize(r.overrides.size());
  for (size_t i = 0; i < r.overrides.size(); ++i) {
    const LinearOverride& ov = r.overrides[i];
    const std::string prefix = "override[" + std::to_string(i) + "].";
    if (ov.legacy_layers && !ov.blocks.empty()) {
      if (!llama_pattern(sites))
        fail(prefix + "blocks", "counts transformer layers, because the override names its "
                                "linears the Llama-only way (attn.q .. mlp.down), and this "
                                "model is not a Llama-style \"*-\" pattern: name the linears "
                                "q_proj .. down_proj and give hybrid block indices");
      for (int b : ov.blocks)
        if (b < 0 || b >= n_blocks / 2)
          fail(prefix + "blocks", "holds layer " + std::to_string(b) + " but the model has " +
                                      std::to_string(n_blocks / 2) + " layers (old linear names "
                                      "count layers; the new names count hybrid blocks)");
    } else {
      check_blocks(prefix, ov.blocks);
    }
    for (const auto& k : ov.linears) {
      const int holding = blocks_holding(k, sites);
      if (holding > 0 && ov.final_blocks > holding)
        fail(prefix + "final_blocks",
             "is " + std::to_string(ov.final_blocks) + " but the model has only " +
                 std::to_string(holding) + " blocks with " + k + "; for this model use --set " +
                 prefix + "final_blocks=" + std::to_string(holding) + " or less" +
                 (r.name.rfind("ue5m3-b16-t2048", 0) == 0 && r.name != "ue5m3-b16-t2048-last1"
                      ? ", or the recipe ue5m3-b16-t2048-last1 (the same on the final block only)"
                      : ""));
    }
    if (ov.final_blocks < 0)
      fail(prefix + "final_blocks", "is negative");
    for (size_t j = 0; j < sites.size(); ++j) {
      if (!ov.selects(sites, j)) continue;
      LinearPlan& p = res.plans[j];
      bool changed = false;
      // Only real changes count as hits: an override that changes nothing is an error below.
      if (ov.has_mode && p.mode != ov.mode) {
        p.mode = ov.mode;
        changed = true;
      }
      if ((ov.has_scale_target || ov.has_rounding) && p.mode == LinearMode::FP4) {
        for (int g = 0; g < 3; ++g)
          for (int o = 0; o < 3; ++o) {
            if (!gemm_uses(Gemm(g), Operand(o))) continue;
            if (ov.has_gemm && int(ov.gemm) != g) continue;
            if (ov.has_role && int(ov.role) != o) continue;
            BlockQuantSpec& sp = p.specs[g][o];
            // The MX scale rules have no tensor scale, so T means nothing to them.
            if (ov.has_scale_target && sp.scale_rule == ScaleRule::TensorScaled &&
                sp.target != ov.scale_target) {
              sp.target = ov.scale_target;
              changed = true;
            }
            if (ov.has_rounding && sp.rounding != ov.rounding) {
              sp.rounding = ov.rounding;
              changed = true;
            }
          }
      }
      if (changed) res.override_hits[i].push_back(int(j));
    }
    if (res.override_hits[i].empty())
      throw UserError(r.where() + ": [[override]] " + prefix.substr(0, prefix.size() - 1) + " (" +
                      ov.describe() + ") changes no linear of this " + std::to_string(n_blocks) +
                      "-block model (every selected linear already has these settings, is "
                      "not FP4, or uses an MX scale rule, which has no scale target; or the "
                      "model has none of its linears)");
  }
  return res;
}

namespace {
/// One [[override]] table (index i): see LinearOverride and docs/recipes.md "Overrides".
LinearOverride parse_override(detail::TomlReader& r, size_t i) {
  const std::string p = "override[" + std::to_string(i) + "].";
  LinearOverride ov;
  r.get(p + "linears", ov.linears);
  if (ov.linears.empty()) {
    std::string kinds;
    for (auto& k : linear_kinds()) kinds += (kinds.empty() ? "\"" : ", \"") + k + "\"";
    r.fail(p + "linears", "a non-empty array of linear kinds (" + kinds + ")");
  }
  size_t legacy = 0;  // names of the Llama-only version
  for (std::string& k : ov.linears) {
    const std::string canon = canonical_linear_kind(k);
    if (canon.empty()) {
      std::string list;
      for (auto& x : linear_kinds()) list += (list.empty() ? "\"" : ", \"") + x + "\"";
      r.fail(p + "linears", "linear kinds among " + list +
                                " (or the older names attn.q .. mlp.down), got \"" + k + "\"");
    }
    if (canon != k) ++legacy;
    k = canon;  // "mlp.down" and "down_proj" are one kind
  }
  ov.legacy_layers = legacy > 0;
  if (legacy > 0 && legacy < ov.linears.size())
      r.fail(p + "linears", "the names of one scheme: the current kinds (in_proj .. down_proj, "
                            "blocks counted over the hybrid pattern) or the older attn.q .. "
                            "mlp.down (blocks counted in layers), not both");
  r.get(p + "final_blocks", ov.final_blocks);
  r.range(p + "final_blocks", ov.final_blocks, 0, 1 << 20);
  r.get(p + "blocks", ov.blocks);
  for (int b : ov.blocks) r.range(p + "blocks", b, 0, 1 << 20);
  std::string s;
  r.get(p + "gemm", s);
  if (r.has(p + "gemm")) {
    r.choice(p + "gemm", s, {"fprop", "dgrad", "wgrad"});
    ov.has_gemm = true;
    ov.gemm = s == "fprop" ? Gemm::Fprop : s == "dgrad" ? Gemm::Dgrad : Gemm::Wgrad;
  }
  s.clear();
  r.get(p + "role", s);
  if (r.has(p + "role")) {
    r.choice(p + "role", s, {"x", "w", "dy"});
    ov.has_role = true;
    ov.role = s == "x" ? Operand::X : s == "w" ? Operand::W : Operand::DY;
  }
  if (ov.has_gemm && ov.has_role && !gemm_uses(ov.gemm, ov.role))
    r.fail(p + "role", std::string("an operand of the ") + gemm_name(ov.gemm) + " GEMM (" +
                           (ov.gemm == Gemm::Fprop   ? "x, w"
                            : ov.gemm == Gemm::Dgrad ? "dy, w"
                                                     : "dy, x") +
                           "), got \"" + operand_name(ov.role) + "\"");
  if (r.has(p + "mode")) {
    s.clear();
    r.get(p + "mode", s);
    ov.mode = parse_mode(r, p + "mode", s);
    ov.has_mode = true;
    if (ov.has_gemm || ov.has_role)
      r.fail(p + "mode", "no gemm or role in the same override: mode applies to the whole linear "
                         "(all three GEMMs); put scale_target/rounding changes in their own "
                         "[[override]]");
  }
  if (r.has(p + "scale_target")) {
    r.get(p + "scale_target", ov.scale_target);
    r.range(p + "scale_target", ov.scale_target, 1e-30f, 3e38f);
    ov.has_scale_target = true;
  }
  if (r.has(p + "rounding")) {
    s.clear();
    r.get(p + "rounding", s);
    ov.rounding = parse_rounding(r, p + "rounding", s);
    ov.has_rounding = true;
  }
  return ov;
}
}  // namespace

namespace {
// [fp4] four_over_six, four_over_six_error, four_over_six_scale_target (docs/recipes.md "Four
// Over Six"), after scale_rule and scale_target. The error and target knobs are refused without
// 4/6 roles (they would change nothing), 4/6 under the MX rules (no tensor scale).
void parse_four_over_six_keys(detail::TomlReader& r, Recipe& rc) {
  std::string s = four_over_six_roles_name(rc.four_over_six);
  r.get("fp4.four_over_six", s);
  r.choice("fp4.four_over_six", s, {"none", "weights", "activations", "gradients", "all"});
  for (FourOverSixRoles v : {FourOverSixRoles::None, FourOverSixRoles::Weights,
                             FourOverSixRoles::Activations, FourOverSixRoles::Gradients,
                             FourOverSixRoles::All})
    if (s == four_over_six_roles_name(v)) rc.four_over_six = v;
  const std::string roles = s;
  s = four_over_six_name(rc.four_over_six_error);
  r.get("fp4.four_over_six_error", s);
  r.choice("fp4.four_over_six_error", s, {"mae", "mse"});
  rc.four_over_six_error = parse_four_over_six(s);
  if (r.has("fp4.four_over_six_scale_target")) {
    float t = 0.f;
    r.get("fp4.four_over_six_scale_target", t);
    r.range("fp4.four_over_six_scale_target", t, 1e-30f, 3e38f);
    rc.four_over_six_scale_target = t == rc.scale_target ? 0.f : t;  // equal: stored as "same"
  }
  const bool on = rc.four_over_six != FourOverSixRoles::None;
  if (on && rc.scale_rule != ScaleRule::TensorScaled)
    r.fail("fp4.four_over_six", std::string("\"none\" with scale_rule = \"") +
                                    scale_rule_name(rc.scale_rule) + "\": Four Over Six needs a "
                                    "tensor scale (scale_rule = \"tensor-scaled\"), got \"" + roles + "\"");
  if (!on && rc.four_over_six_error != FourOverSix::MAE)
    r.fail("fp4.four_over_six_error", "to be left at \"mae\" with four_over_six = \"none\": it "
                                      "has no effect without Four Over Six roles");
  if (!on && r.has("fp4.four_over_six_scale_target"))
    r.fail("fp4.four_over_six_scale_target", "no value with four_over_six = \"none\": it has "
                                             "no effect without Four Over Six roles");
}

// [fp4] row_scaled_activation (docs/numerics.md "Per-row reference"): a per-row reference is
// the current amax of one token's row, so it composes only with current scaling measured at
// every call, a tensor scale to hold it, and the decoded GEMM (the probe-matched GEMM takes
// one α per operand pair).
void check_row_scaled_activation(detail::TomlReader& r, const Recipe& rc) {
  if (!rc.row_scaled_activation) return;
  const std::string key = "fp4.row_scaled_activation";
  if (rc.amax_interval != 1)
    r.fail(key, "false with amax_interval = " + std::to_string(rc.amax_interval) +
                    ": a per-row reference is the current amax of each row, never held "
                    "(set fp4.amax_interval = 1)");
  if (rc.amax_sample != AmaxSample::PerCall)
    r.fail(key, "false with fp4.amax_sample = \"per-step\": a row's reference is measured at "
                "every call (set amax_sample = \"per-call\")");
  if (rc.scale_rule != ScaleRule::TensorScaled)
    r.fail(key, std::string("false with fp4.scale_rule = \"") + scale_rule_name(rc.scale_rule) +
                    "\": the MX rules have no tensor scale to take per row");
  if (rc.gemm == GemmMode::ProbeMatched)
    r.fail(key,
           "false with linear.gemm = \"probe-matched\": the probe-matched GEMM applies one "
           "alpha per operand pair, not one per output row (use linear.gemm = \"decoded\")");
  if (rc.rht_wgrad && (rc.hadamard_size != 16 || rc.hadamard_signs != HadamardSigns::Fixed))
    r.fail(key, "false with a wgrad Hadamard transform other than 16 points with fixed signs: the "
                "row-scaled quantize-transpose of X takes only that one");
  if (four_over_six_applies(rc.four_over_six, Operand::X))
    r.fail(key, std::string("false with fp4.four_over_six = \"") +
                    four_over_six_roles_name(rc.four_over_six) +
                    "\": Four Over Six on a row-scaled X is not implemented (its error reads one "
                    "tensor reference; Transformer Engine refuses the pair too)");
}

// What linear.gemm = "decoded-bf16" cannot carry (docs/gemm.md "Decoded FP4 on the BF16 GEMM"),
// the first such key of rc and the value it needs, or nothing. Its operands are q·c_b in BF16,
// exact only for E2M1 elements with a scale format of at most 4 significant bits (the four
// conventions of ScaleFormat); it applies one decode scale per operand to its output, so no
// per-row reference; Quartet II's quantizers have no q·c_b output. One home for both uses: the
// refusal of a spelled "decoded-bf16" (check_decoded_bf16) and the choice of "auto"
// (resolve_auto_gemm).
struct Bf16Refusal {
  std::string key, expected;
};
std::optional<Bf16Refusal> decoded_bf16_refusal(const Recipe& rc) {
  const std::string why =
      " with linear.gemm = \"decoded-bf16\" (its BF16 operands q·c_b are exact "
      "only for E2M1 elements with ue5m3, ue5m3-ptx, e4m3 or ue8m0 scales; use "
      "linear.gemm = \"decoded\")";
  if (!rc.element_format.is_e2m1())
    return Bf16Refusal{"fp4.element_format",
                       "\"e2m1\"" + why + ", got \"" + rc.element_format.name() + "\""};
  if (rc.scale_desc != nullptr)
    return Bf16Refusal{"fp4.scale_format", "ue5m3, ue5m3-ptx, e4m3 or ue8m0" + why + ", got \"" +
                                               rc.scale_format_str() + "\""};
  if (rc.row_scaled_activation)
    return Bf16Refusal{"fp4.row_scaled_activation",
                       "false with linear.gemm = \"decoded-bf16\": that GEMM applies one decode "
                       "scale per operand to its output, not one per row (use linear.gemm = "
                       "\"decoded\")"};
  if (rc.forward_quantizer != ForwardQuantizer::Blocks ||
      rc.backward_quantizer != BackwardQuantizer::Blocks)
    return Bf16Refusal{rc.forward_quantizer != ForwardQuantizer::Blocks ? "fp4.forward_quantizer"
                                                                        : "fp4.backward_quantizer",
                       "\"blocks\" with linear.gemm = \"decoded-bf16\" (Quartet II's quantizers "
                       "run on the decoded GEMM; use linear.gemm = \"decoded\")"};
  // UE8M0 under the tensor-scaled rule: c_b ≈ a_b·T/g has no bound of its own (gemm_mode.h)
  if (rc.scale_format != ScaleFormat::UE8M0 || rc.scale_rule != ScaleRule::TensorScaled)
    return std::nullopt;
  auto band = [&](const std::string& key, float t) -> std::optional<Bf16Refusal> {
    if (decoded_bf16_target_in_band(t)) return std::nullopt;
    return Bf16Refusal{key,
                       "between 2^-24 and 2^48 with fp4.scale_format = \"ue8m0\" under the "
                       "tensor-scaled rule and linear.gemm = \"decoded-bf16\" (its unscaled "
                       "operands q·c_b, about a_b·T/g, would leave the FP32/BF16 range), got " +
                           float_str(t)};
  };
  if (auto f = band("fp4.scale_target", rc.scale_target)) return f;
  if (rc.four_over_six_scale_target > 0.f)  // the target of the 4/6 roles (make_spec)
    if (auto f = band("fp4.four_over_six_scale_target", rc.four_over_six_scale_target)) return f;
  for (size_t i = 0; i < rc.overrides.size(); ++i)
    if (rc.overrides[i].has_scale_target)
      if (auto f = band("override[" + std::to_string(i) + "].scale_target",
                        rc.overrides[i].scale_target))
        return f;
  return std::nullopt;
}

void check_decoded_bf16(detail::TomlReader& r, const Recipe& rc) {
  if (rc.gemm != GemmMode::DecodedBf16) return;
  if (const auto f = decoded_bf16_refusal(rc)) r.fail(f->key, f->expected);
}

// linear.gemm = "auto" (the key's default; docs/recipes.md "Every knob"): "decoded-bf16" where
// the recipe has an FP4 linear and that GEMM carries it, else "decoded". Resolved once here,
// from the recipe alone (never from the CPU), so a run's recipe.toml and checkpoints record the
// mode it ran.
GemmMode resolve_auto_gemm(const Recipe& rc) {
  bool fp4 = rc.mode == LinearMode::FP4;
  for (const LinearOverride& ov : rc.overrides)
    fp4 = fp4 || (ov.has_mode && ov.mode == LinearMode::FP4);
  return fp4 && !decoded_bf16_refusal(rc) ? GemmMode::DecodedBf16 : GemmMode::Decoded;
}

// [fp4] forward_quantizer = "quartet2-rtn" and backward_quantizer = "ms-eden" (docs/recipes.md
// "Quartet II's quantizers"): each implements Quartet II's kernel with its constants, so the
// recipe's spec keys for those operands must say what the kernel does (NVFP4: E2M1 elements,
// E4M3 scales, 1-D blocks of 16, ties away, current scaling, the decoded GEMM); nothing that
// would silently be ignored is accepted.
void check_quartet_quantizers(detail::TomlReader& r, const Recipe& rc) {
  const bool fwd = rc.forward_quantizer == ForwardQuantizer::QuartetRtn;
  const bool bwd = rc.backward_quantizer == BackwardQuantizer::MsEden;
  if (!fwd && !bwd) return;
  const std::string key = fwd ? "fp4.forward_quantizer" : "fp4.backward_quantizer";
  const std::string val = fwd ? "\"quartet2-rtn\"" : "\"ms-eden\"";
  auto need = [&](bool ok, const std::string& what) {
    if (!ok) r.fail(key, std::string("\"blocks\" unless ") + what + " (" + val +
                             " is Quartet II's kernel with its fixed constants)");
  };
  need(rc.element_format.is_e2m1(), "fp4.element_format = \"e2m1\"");
  need(rc.scale_format_str() == "e4m3", "fp4.scale_format = \"e4m3\"");
  need(rc.scale_rule == ScaleRule::TensorScaled, "fp4.scale_rule = \"tensor-scaled\"");
  need(rc.block == 16, "fp4.block = 16");
  need(rc.scale_target == 448.f, "fp4.scale_target is left at 448 (Quartet II's own maxima apply)");
  need(rc.mode == LinearMode::FP4, "linear.mode = \"fp4\" (the keys act on FP4 linears only)");
  need(rc.amax_interval == 1 && rc.amax_sample == AmaxSample::PerCall,
       "fp4.amax_interval = 1 and fp4.amax_sample = \"per-call\" (Quartet II scales every call "
       "by its current amax)");
  need(rc.amax_ranks == AmaxRanks::Invariant,
       "fp4.amax_ranks = \"invariant\" (Quartet II uses each process's own current amax)");
  need(rc.gemm == GemmMode::Decoded, "linear.gemm = \"decoded\"");
  need(!rc.row_scaled_activation, "fp4.row_scaled_activation = false");
  need(rc.overrides.empty(), "the recipe has no [[override]] tables");
  if (fwd) {
    need(rc.weight_block_size() == 16, "fp4.weight_block is 16 (Quartet II's weight blocks)");
    need(!rc.weight_2d, "fp4.weight_2d = false (1-D weight blocks of 16)");
    need(rc.round_x == Rounding::RNA && rc.round_w == Rounding::RNA,
         "rounding.x = rounding.w = \"rna\" (its threshold comparisons: ties away)");
    need(!four_over_six_applies(rc.four_over_six, Operand::X) &&
             !four_over_six_applies(rc.four_over_six, Operand::W),
         "fp4.four_over_six covers neither X nor W");
  }
  if (bwd) {
    const std::string k2 = "fp4.backward_quantizer";
    auto need2 = [&](bool ok, const std::string& what) {
      if (!ok) r.fail(k2, std::string("\"blocks\" unless ") + what +
                              " (\"ms-eden\" is Quartet II's kernel with its fixed constants)");
    };
    need2(rc.round_dy == Rounding::RNA, "rounding.dy = \"rna\" (MS-EDEN rounds elements to nearest, "
                                        "ties away; its randomness is in the scales)");
    need2(rc.rht_wgrad && rc.hadamard_dgrad,
          "fp4.hadamard_gemms = [\"dgrad\", \"wgrad\"] (MS-EDEN transforms all four operands)");
    need2(rc.rht_precision == RhtPrecision::FP32, "fp4.rht_precision = \"fp32\"");
    need2(!four_over_six_applies(rc.four_over_six, Operand::DY), "fp4.four_over_six does not cover dY");
  }
}

/// [fp4] hadamard_size, hadamard_gemms, hadamard_signs into rc (rht_wgrad already read): the
/// Hadamard transforms of docs/numerics.md "Random Hadamard transform". "wgrad" in
/// hadamard_gemms is rht_wgrad (the two must agree when both are given); the size and the sign
/// policy must be left at their defaults (16, "fixed") when no GEMM has a transform.
void parse_hadamard(detail::TomlReader& r, Recipe& rc) {
  if (r.has("fp4.hadamard_gemms")) {
    std::vector<std::string> gemms;
    r.get("fp4.hadamard_gemms", gemms);
    bool dgrad = false, wgrad = false;
    for (const std::string& g : gemms) {
      bool& on = g == "dgrad" ? dgrad : wgrad;
      if ((g != "dgrad" && g != "wgrad") || on)
        r.fail("fp4.hadamard_gemms", "an array of distinct GEMM names among \"dgrad\", \"wgrad\" "
                                     "(the backward GEMMs whose operands are transformed), got \"" + g + "\"");
      on = true;
    }
    if (r.has("fp4.rht_wgrad") && rc.rht_wgrad != wgrad)
      r.fail("fp4.hadamard_gemms", std::string("to agree with rht_wgrad = ") +
                                       (rc.rht_wgrad ? "true" : "false") + " on \"wgrad\" (set "
                                       "both, or only hadamard_gemms)");
    rc.rht_wgrad = wgrad;
    rc.hadamard_dgrad = dgrad;
  }
  r.get("fp4.hadamard_size", rc.hadamard_size);
  if (!hadamard_size_valid(rc.hadamard_size))
    r.fail("fp4.hadamard_size", "16, 32, 64 or 128 (the points of the Hadamard transform), got " +
                                    std::to_string(rc.hadamard_size));
  std::string s = hadamard_signs_name(rc.hadamard_signs);
  r.get("fp4.hadamard_signs", s);
  r.choice("fp4.hadamard_signs", s, {"fixed", "per-layer", "per-step", "per-call"});
  rc.hadamard_signs = parse_hadamard_signs(s);
  const bool any = rc.rht_wgrad || rc.hadamard_dgrad;
  if (!any && rc.hadamard_size != 16)
    r.fail("fp4.hadamard_size", "16 (the default) when no GEMM has a Hadamard transform (set "
                                "hadamard_gemms or rht_wgrad = true), got " + std::to_string(rc.hadamard_size));
  if (!any && rc.hadamard_signs != HadamardSigns::Fixed)
    r.fail("fp4.hadamard_signs", "\"fixed\" (the default) when no GEMM has a Hadamard transform "
                                 "(set hadamard_gemms or rht_wgrad = true), got \"" + s + "\"");
  if (rc.hadamard_dgrad && rc.gemm == GemmMode::ProbeMatched)
    r.fail("fp4.hadamard_gemms", "no \"dgrad\" with linear.gemm = \"probe-matched\" (the "
                                 "probe-matched GEMM has no dgrad Hadamard transform yet)");
}

// `default_name`: the name of a recipe whose file sets none (the file's stem). `sets`: the
// --set overrides, applied to the file first; the name is labelled with them (see
// load_recipe) unless one of them sets the name.
Recipe parse_recipe(detail::TomlReader& r, const std::string& default_name,
                    const std::vector<Setting>& sets) {
  r.apply(sets);
  Recipe rc;
  rc.source = r.where();
  std::string s;
  r.get("name", rc.name);
  if (rc.name.empty()) rc.name = default_name;
  {
    std::vector<Setting> label;
    bool named = false;
    for (const Setting& x : sets) {
      named |= x.key == "name";
      if (x.key != "description") label.push_back(x);
    }
    if (!named) rc.name = labelled_name(rc.name, label);
  }
  r.get("description", rc.description);
  s = linear_mode_name(rc.mode);
  r.get("linear.mode", s);
  rc.mode = parse_mode(r, "linear.mode", s);
  // linear.gemm: "auto" is resolved by resolve_auto_gemm once every other key is read; until
  // then the recipe counts as decoded (neither auto nor decoded is the probe-matched GEMM).
  std::string gemm_key = "auto";
  r.get("linear.gemm", gemm_key);
  r.choice("linear.gemm", gemm_key, {"auto", "decoded", "probe-matched", "decoded-bf16"});
  rc.gemm = gemm_key == "auto" ? GemmMode::Decoded : parse_gemm_mode(gemm_key);
  r.get("linear.probe_snap", rc.probe_snap);
  {
    Accumulator acc;
    acc.snap = rc.probe_snap;
    try {
      acc.check();
    } catch (const std::invalid_argument&) {
      r.fail("linear.probe_snap", "0 (no snap) or a power of two from 1 to 65536 (the snap grid "
                                  "1/d of the probe-matched GEMM; default 1024), got " +
                                      std::to_string(rc.probe_snap));
    }
    if (rc.probe_snap != 1024 && rc.gemm != GemmMode::ProbeMatched)
      r.fail("linear.probe_snap", "to be left at 1024 with gemm = \"" + gemm_key + "\", got " +
                                      std::to_string(rc.probe_snap) +
                                      ": the snap belongs to the "
                                      "probe-matched GEMM's accumulator (set linear.gemm = "
                                      "\"probe-matched\", or also set linear.probe_snap = 1024 "
                                      "to leave it)");
  }
  s = alpha_rule_name(rc.probe_alpha);
  r.get("linear.probe_alpha", s);
  r.choice("linear.probe_alpha", s, {"quotient", "reciprocal"});
  rc.probe_alpha = s == "reciprocal" ? AlphaRule::Reciprocal : AlphaRule::Quotient;
  if (rc.probe_alpha != AlphaRule::Quotient && rc.gemm != GemmMode::ProbeMatched)
    r.fail("linear.probe_alpha", "to be left at \"quotient\" with gemm = \"" + gemm_key +
                                     "\": α is the probe-matched "
                                     "GEMM's (set linear.gemm = \"probe-matched\", or also set "
                                     "linear.probe_alpha = \"quotient\" to leave it)");

  s = rc.element_format.name();
  r.get("fp4.element_format", s);
  try {
    rc.element_format = parse_element_format(s);
  } catch (const std::invalid_argument& e) {
    r.fail("fp4.element_format",
           "an element format (e2m1, e1m2, e3m0, e2m3, e3m2, e4m3, e5m2, e<E>m<M>, int4, "
           "int4-sym), got \"" + s + "\": " + e.what());
  }
  s = rc.scale_format_str();
  r.get("fp4.scale_format", s);
  try {
    BlockQuantSpec tmp;
    set_scale_format(tmp, s);
    rc.scale_format = tmp.scale_format;
    rc.scale_desc = tmp.scale_desc;
  } catch (const std::invalid_argument& e) {
    r.fail("fp4.scale_format",
           "a block-scale format (ue5m3, ue5m3-ptx, e4m3, ue8m0, ue4m3, ue<E>m<M>), got \"" + s +
               "\": " + e.what());
  }
  s = scale_rule_name(rc.scale_rule);
  r.get("fp4.scale_rule", s);
  r.choice("fp4.scale_rule", s, {"tensor-scaled", "mx-te", "mx-ocp"});
  rc.scale_rule = parse_scale_rule(s);
  if (rc.scale_rule != ScaleRule::TensorScaled) {
    const FloatFormat& sf = rc.scale_desc ? *rc.scale_desc : scale_format_desc(rc.scale_format);
    if (sf.frac_bits != 0) {
      r.fail("fp4.scale_rule", std::string("a power-of-two scale_format (ue8m0) with \"") +
                                   scale_rule_name(rc.scale_rule) + "\", got scale_format = \"" +
                                   sf.name + "\"");
    }
  }
  r.get("fp4.block", rc.block);
  r.range("fp4.block", rc.block, 1, kMaxBlock);
  if (r.has("fp4.weight_block")) {
    // W's own block (docs/recipes.md "Weight tiles apart from the blocks"). Equal to block it
    // is stored as 0 ("the same"): recipe_to_toml leaves it out, the recipe equals one without.
    int wb = 0;
    r.get("fp4.weight_block", wb);
    if (wb < 1 || wb > kMaxBlock)
      r.fail("fp4.weight_block", "the block length (1-D) or tile side (2-D) of the weights: an "
                                 "integer in 1.." + std::to_string(kMaxBlock) +
                                     " (default: fp4.block), got " + std::to_string(wb));
    rc.weight_block = wb == rc.block ? 0 : wb;
  }
  r.get("fp4.weight_2d", rc.weight_2d);
  r.get("fp4.scale_target", rc.scale_target);
  r.range("fp4.scale_target", rc.scale_target, 1e-30f, 3e38f);
  r.get("fp4.amax_interval", rc.amax_interval);
  r.range("fp4.amax_interval", rc.amax_interval, 1, 1000000);
  s = rc.amax_sample == AmaxSample::PerStep ? "per-step" : "per-call";
  r.get("fp4.amax_sample", s);
  r.choice("fp4.amax_sample", s, {"per-call", "per-step"});
  rc.amax_sample = s == "per-step" ? AmaxSample::PerStep : AmaxSample::PerCall;
  s = rc.amax_ranks == AmaxRanks::Max ? "max" : "invariant";
  r.get("fp4.amax_ranks", s);
  r.choice("fp4.amax_ranks", s, {"invariant", "max"});
  rc.amax_ranks = s == "max" ? AmaxRanks::Max : AmaxRanks::Invariant;
  r.get("fp4.rht_wgrad", rc.rht_wgrad);
  s = rht_precision_name(rc.rht_precision);
  r.get("fp4.rht_precision", s);
  r.choice("fp4.rht_precision", s, {"fp32", "bf16"});
  rc.rht_precision = parse_rht_precision(s);
  parse_hadamard(r, rc);
  if (rc.rht_precision != RhtPrecision::FP32 && !rc.rht_wgrad && !rc.hadamard_dgrad)
    r.fail("fp4.rht_precision", std::string("\"fp32\" (the default) unless rht_wgrad = true: the RHT "
                                "precision has no effect without the RHT, got \"") + s + "\"");
  r.get("fp4.bf16_boundary", rc.bf16_boundary);
  r.get("fp4.bf16_outputs", rc.bf16_outputs);
  parse_four_over_six_keys(r, rc);
  r.get("fp4.row_scaled_activation", rc.row_scaled_activation);
  s = forward_quantizer_name(rc.forward_quantizer);
  r.get("fp4.forward_quantizer", s);
  r.choice("fp4.forward_quantizer", s, {"blocks", "quartet2-rtn"});
  rc.forward_quantizer = s == "quartet2-rtn" ? ForwardQuantizer::QuartetRtn : ForwardQuantizer::Blocks;
  s = backward_quantizer_name(rc.backward_quantizer);
  r.get("fp4.backward_quantizer", s);
  r.choice("fp4.backward_quantizer", s, {"blocks", "ms-eden"});
  rc.backward_quantizer = s == "ms-eden" ? BackwardQuantizer::MsEden : BackwardQuantizer::Blocks;

  s = rounding_name(rc.round_x);
  r.get("rounding.x", s);
  rc.round_x = parse_rounding(r, "rounding.x", s);
  s = rounding_name(rc.round_w);
  r.get("rounding.w", s);
  rc.round_w = parse_rounding(r, "rounding.w", s);
  s = rounding_name(rc.round_dy);
  r.get("rounding.dy", s);
  rc.round_dy = parse_rounding(r, "rounding.dy", s);

  s = linear_mode_name(rc.high_precision_mode);
  r.get("high_precision.mode", s);
  r.choice("high_precision.mode", s, {"fp32", "bf16"});
  rc.high_precision_mode = parse_mode(r, "high_precision.mode", s);
  r.get("high_precision.final_blocks", rc.final_blocks);
  r.range("high_precision.final_blocks", rc.final_blocks, 0, 1 << 20);
  r.get("high_precision.final_blocks_fraction", rc.final_blocks_fraction);
  r.range("high_precision.final_blocks_fraction", rc.final_blocks_fraction, 0.0, 1.0);
  r.get("high_precision.blocks", rc.blocks);
  for (int b : rc.blocks) r.range("high_precision.blocks", b, 0, 1 << 20);
  const size_t n_over = r.table_array_size("override");
  for (size_t i = 0; i < n_over; ++i) rc.overrides.push_back(parse_override(r, i));
  r.reject_unknown();  // before the checks below: a misspelt knob is named as such
  for (size_t i = 0; i < rc.overrides.size(); ++i) {
    const LinearOverride& ov = rc.overrides[i];
    if (!ov.has_mode && !ov.has_scale_target && !ov.has_rounding)
      r.fail("override[" + std::to_string(i) + "]",
             "at least one knob to change: mode, scale_target or rounding");
    if (ov.has_mode && ov.mode != LinearMode::FP4 && (ov.has_scale_target || ov.has_rounding))
      r.fail("override[" + std::to_string(i) + "].mode",
             std::string("\"fp4\" when scale_target or rounding is set in the same override (a ") +
                 linear_mode_name(ov.mode) + " linear has no FP4 scale target or rounding)");
  }
  if (gemm_key == "auto") rc.gemm = resolve_auto_gemm(rc);
  check_row_scaled_activation(r, rc);
  check_quartet_quantizers(r, rc);
  check_decoded_bf16(r, rc);
  if (rc.rht_wgrad && rc.mode == LinearMode::FP4 && rc.block > 16 && rc.block % 16 != 0)
    r.fail("fp4.block", "16 or less, or a multiple of 16, when rht_wgrad = true (the 16-point "
                        "RHT must not straddle blocks above 16)");
  return rc;
}
}  // namespace

Recipe load_recipe_file(const std::filesystem::path& file, const std::vector<Setting>& sets) {
  detail::TomlReader r(file);
  return parse_recipe(r, file.stem().string(), sets);
}

Recipe recipe_from_text(const std::string& toml, const std::string& where,
                        const std::vector<Setting>& sets) {
  detail::TomlReader r(detail::TomlReader::FromText{}, toml, where);
  return parse_recipe(r, "recipe", sets);
}

Recipe load_recipe(const std::string& name_or_path, const std::filesystem::path& recipes_dir,
                   const std::vector<Setting>& sets) {
  namespace fs = std::filesystem;
  fs::path p(name_or_path);
  if (p.extension() == ".toml" || fs::exists(p)) return load_recipe_file(p, sets);
  fs::path f = recipes_dir / (name_or_path + ".toml");
  if (fs::exists(f)) return load_recipe_file(f, sets);
  std::string names;
  for (const std::string& n : toml_names(recipes_dir)) names += " " + n;
  throw UserError("unknown recipe '" + name_or_path + "' (no file " + f.string() +
                  "); available:" + (names.empty() ? " none found" : names) +
                  " ('fp4train recipes' describes them)");
}

std::string recipe_to_toml(const Recipe& r) {
  std::ostringstream o;
  o.precision(10);
  o << "name = " << detail::toml_quote(r.name) << "\n";
  o << "description = " << detail::toml_quote(r.description) << "\n";
  o << "[linear]\nmode = \"" << linear_mode_name(r.mode) << "\"\ngemm = \"" << gemm_mode_name(r.gemm)
    << "\"\n";
  // Like the fidelity knobs below, only when not the default: earlier runs' recipe.toml stays
  // byte-identical.
  if (r.probe_snap != 1024) o << "probe_snap = " << r.probe_snap << "\n";
  if (r.probe_alpha != AlphaRule::Quotient)
    o << "probe_alpha = \"" << alpha_rule_name(r.probe_alpha) << "\"\n";
  o << "[fp4]\nelement_format = \"" << r.element_format.name() << "\"\nscale_format = \""
    << r.scale_format_str() << "\"\nscale_rule = \"" << scale_rule_name(r.scale_rule)
    << "\"\nblock = " << r.block;
  // Only when it differs from block: the recipe.toml of every earlier run stays byte-identical.
  if (r.weight_block_size() != r.block) o << "\nweight_block = " << r.weight_block_size();
  o << "\nweight_2d = " << (r.weight_2d ? "true" : "false") << "\nscale_target = " << float_str(r.scale_target)
    << "\namax_interval = " << r.amax_interval << "\nrht_wgrad = " << (r.rht_wgrad ? "true" : "false")
    << "\n";
  // The fidelity knobs only when set: the resolved recipe.toml of every earlier run (and the
  // copy in its checkpoints) stays byte-identical, so resume and compare keep recognising it.
  if (r.rht_precision != RhtPrecision::FP32)
    o << "rht_precision = \"" << rht_precision_name(r.rht_precision) << "\"\n";
  // The Hadamard keys only where they differ from what rht_wgrad alone means (16, fixed).
  if (r.hadamard_size != 16) o << "hadamard_size = " << r.hadamard_size << "\n";
  if (r.hadamard_dgrad)
    o << "hadamard_gemms = [\"dgrad\"" << (r.rht_wgrad ? ", \"wgrad\"" : "") << "]\n";
  if (r.hadamard_signs != HadamardSigns::Fixed)
    o << "hadamard_signs = \"" << hadamard_signs_name(r.hadamard_signs) << "\"\n";
  if (r.bf16_boundary) o << "bf16_boundary = true\n";
  if (r.bf16_outputs) o << "bf16_outputs = true\n";
  if (r.row_scaled_activation) o << "row_scaled_activation = true\n";
  if (r.amax_sample != AmaxSample::PerCall) o << "amax_sample = \"per-step\"\n";
  if (r.amax_ranks != AmaxRanks::Invariant) o << "amax_ranks = \"max\"\n";
  // Four Over Six: only when set (docs/recipes.md "Four Over Six").
  if (r.four_over_six != FourOverSixRoles::None)
    o << "four_over_six = \"" << four_over_six_roles_name(r.four_over_six) << "\"\n";
  if (r.four_over_six_error != FourOverSix::MAE)
    o << "four_over_six_error = \"" << four_over_six_name(r.four_over_six_error) << "\"\n";
  if (r.four_over_six_scale_target > 0.f)
    o << "four_over_six_scale_target = " << float_str(r.four_over_six_scale_target) << "\n";
  // Quartet II's quantizers: only when set.
  if (r.forward_quantizer != ForwardQuantizer::Blocks)
    o << "forward_quantizer = \"" << forward_quantizer_name(r.forward_quantizer) << "\"\n";
  if (r.backward_quantizer != BackwardQuantizer::Blocks)
    o << "backward_quantizer = \"" << backward_quantizer_name(r.backward_quantizer) << "\"\n";
  o << "[rounding]\nx = \"" << rounding_name(r.round_x) << "\"\nw = \"" << rounding_name(r.round_w)
    << "\"\ndy = \"" << rounding_name(r.round_dy) << "\"\n";
  o << "[high_precision]\nmode = \"" << linear_mode_name(r.high_precision_mode)
    << "\"\nfinal_blocks = " << r.final_blocks
    << "\nfinal_blocks_fraction = " << float_str(r.final_blocks_fraction) << "\nblocks = " << int_list(r.blocks)
    << "\n";
  for (const LinearOverride& ov : r.overrides) {
    o << "\n[[override]]\nlinears = [";
    // An override written with the older names keeps them: its blocks count layers.
    for (size_t i = 0; i < ov.linears.size(); ++i)
      o << (i ? ", " : "")
        << detail::toml_quote(ov.legacy_layers ? legacy_linear_name(ov.linears[i]) : ov.linears[i]);
    o << "]\n";
    if (ov.final_blocks > 0) o << "final_blocks = " << ov.final_blocks << "\n";
    if (!ov.blocks.empty()) o << "blocks = " << int_list(ov.blocks) << "\n";
    if (ov.has_gemm) o << "gemm = \"" << gemm_name(ov.gemm) << "\"\n";
    if (ov.has_role) o << "role = \"" << operand_name(ov.role) << "\"\n";
    if (ov.has_mode) o << "mode = \"" << linear_mode_name(ov.mode) << "\"\n";
    if (ov.has_scale_target) o << "scale_target = " << float_str(ov.scale_target) << "\n";
    if (ov.has_rounding) o << "rounding = \"" << rounding_name(ov.rounding) << "\"\n";
  }
  return o.str();
}

}  // namespace fp4
