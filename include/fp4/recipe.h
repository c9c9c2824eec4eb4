// A training recipe is plain data: every knob of NUMERICS.md's recipe table, parsed from a
// TOML file in configs/recipes/, so new recipes need no code changes.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include "fp4/block_quant.h"
#include "fp4/format.h"

namespace fp4 {

/// How one linear layer's three GEMMs treat their operands.
enum class LinearMode {
  FP32,  ///< unquantized reference
  BF16,  ///< operands rounded to BF16 (RNE), FP32 accumulation
  FP4,   ///< E2M1 elements with block scales (NUMERICS.md "Quantizing one operand")
};
const char* linear_mode_name(LinearMode m);

/// Recipe fields (TOML keys in brackets). See configs/recipes/*.toml and README "Recipes".
struct Recipe {
  std::string name;         ///< [name]
  std::string description;  ///< [description]
  LinearMode mode = LinearMode::FP32;  ///< [linear] mode = "fp32" | "bf16" | "fp4"
  std::string gemm = "decoded";        ///< [linear] gemm = "decoded" | "probe-matched" (NUMERICS.md)

  // [fp4] block-scaled format, used when mode == FP4. Names: docs/formats.md.
  /// [fp4] element_format: e2m1 (default), e1m2, e3m0, e2m3, e3m2, e4m3, e5m2, a spelled
  /// e<E>m<M>, int4, int4-sym (parse_element_format); stored in canonical lower case.
  std::string element_format = "e2m1";
  /// [fp4] scale_format when it is one of the four conventions of ScaleFormat.
  ScaleFormat scale_format = ScaleFormat::UE5M3;
  /// [fp4] scale_format naming any other block-scale format (ue4m3, ue6m2, ...): set, it
  /// overrides scale_format (see BlockQuantSpec::scale_desc); null for the four.
  const FloatFormat* scale_desc = nullptr;
  /// [fp4] scale_rule = "tensor-scaled" (default) | "mx-te" | "mx-ocp" (ScaleRule); the MX
  /// rules need a power-of-two scale format (ue8m0).
  ScaleRule scale_rule = ScaleRule::TensorScaled;
  int block = 16;              ///< block length along the contraction dim
  bool weight_2d = true;       ///< weights in block × block tiles (else 1-D along K)
  float scale_target = 448.f;  ///< T
  int amax_interval = 1;       ///< D: 1 = current scaling, 50 = periodic sample-and-hold
  bool rht_wgrad = false;      ///< 16-point RHT on the two wgrad operands (NVFP4)
  Rounding round_x = Rounding::RNE;   ///< [rounding] x  (activations)
  Rounding round_w = Rounding::RNE;   ///< [rounding] w  (weights)
  Rounding round_dy = Rounding::SR8;  ///< [rounding] dy (upstream gradient; dgrad and wgrad)

  // [high_precision] which transformer blocks keep their linears out of FP4.
  LinearMode high_precision_mode = LinearMode::BF16;  ///< format of those linears
  double final_blocks_fraction = 0.0;  ///< keep the final round(f·L) blocks (≥1 if f>0)
  std::vector<int> blocks;             ///< explicit 0-based block indices

  /// Mode of the linears of transformer block `b` in a model of `n_blocks` blocks.
  LinearMode block_mode(int b, int n_blocks) const;
  /// Name of the block-scale format (scale_desc's if set, else scale_format's).
  std::string scale_format_str() const;
  /// The block-quantization spec of a role (X, W or dY) for one GEMM: scale format, block,
  /// 2-D (W), target, rounding of the role, element format, scale rule. Throws
  /// std::invalid_argument if element_format is not a valid element format name.
  BlockQuantSpec spec_x() const;
  BlockQuantSpec spec_w() const;
  BlockQuantSpec spec_dy() const;
};

/// Parse a recipe file. Throws fp4::UserError naming the file, the key and the expected
/// value for malformed TOML, unknown keys, wrong types or out-of-range values.
Recipe load_recipe_file(const std::filesystem::path& file);

/// Resolve a recipe argument: an existing .toml path, or a name looked up as
/// `<recipes_dir>/<name>.toml`. Throws fp4::UserError listing the available names.
Recipe load_recipe(const std::string& name_or_path, const std::filesystem::path& recipes_dir);

/// Recipe as TOML text (for the resolved config written next to a run).
std::string recipe_to_toml(const Recipe& r);

}  // namespace fp4
