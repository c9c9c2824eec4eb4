// A training recipe is plain data: every knob of docs/numerics.md's recipe table, parsed from a
// TOML file in configs/recipes/, so new recipes need no code changes.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include "fp4/config/settings.h"
#include "fp4/gemm/gemm_mode.h"
#include "fp4/gemm/probe_gemm.h"  // AlphaRule
#include "fp4/numerics/block_quant.h"
#include "fp4/numerics/format.h"
#include "fp4/numerics/hadamard.h"

namespace fp4 {

/// How one linear layer's three GEMMs treat their operands.
enum class LinearMode {
  FP32,  ///< unquantized reference
  BF16,  ///< operands rounded to BF16 (RNE), FP32 accumulation
  FP4,   ///< E2M1 elements with block scales (docs/numerics.md "Quantizing one operand")
};
const char* linear_mode_name(LinearMode m);

/// The three GEMMs of a linear layer (docs/numerics.md "Notation"): fprop Y = X·Wᵀ, dgrad
/// dX = dY·W, wgrad dW = dYᵀ·X. Recipe names "fprop", "dgrad", "wgrad".
enum class Gemm { Fprop = 0, Dgrad = 1, Wgrad = 2 };
/// The three quantized operands: activation X, weight W, upstream gradient dY. Recipe names
/// "x", "w", "dy". Each GEMM quantizes two of them: fprop X and W, dgrad dY and W, wgrad dY
/// and X (gemm_uses()).
enum class Operand { X = 0, W = 1, DY = 2 };

/// [fp4] amax_sample: when a D = 1 reference is measured within a step of several
/// micro-batches (Recipe::amax_sample).
enum class AmaxSample { PerCall, PerStep };
/// [fp4] amax_ranks: how data-parallel ranks agree on a reference (Recipe::amax_ranks).
enum class AmaxRanks { Invariant, Max };
const char* gemm_name(Gemm g);
const char* operand_name(Operand o);

// ---- Four Over Six roles (docs/recipes.md "Four Over Six")
/// [fp4] four_over_six: the operands whose block scales Four Over Six chooses (FourOverSix in
/// block_quant.h): none, W ("weights"), X ("activations"), dY ("gradients"), all three.
enum class FourOverSixRoles { None, Weights, Activations, Gradients, All };
/// "none", "weights", "activations", "gradients", "all".
const char* four_over_six_roles_name(FourOverSixRoles r);

/// [fp4] forward_quantizer: how an FP4 linear quantizes its fprop operands X and W.
/// Blocks ("blocks", default): the block quantizer of docs/numerics.md "Quantizing one operand"
/// with the recipe's specs. QuartetRtn ("quartet2-rtn"): Quartet II's forward quantizer
/// (fp4::quartet_rtn_quantize_dequantize; docs/numerics.md "Quartet II's forward quantizer").
enum class ForwardQuantizer { Blocks, QuartetRtn };
/// [fp4] backward_quantizer: how an FP4 linear quantizes its dgrad and wgrad operands.
/// Blocks ("blocks", default): the block quantizer with the recipe's specs, from the
/// high-precision X, W and dY. MsEden ("ms-eden"): Quartet II's backward, MS-EDEN
/// (fp4::ms_eden_quantize) of the four operands after the Hadamard transform along each GEMM's
/// inner dim, re-quantizing the forward's quantized X̂ and Ŵ (docs/numerics.md "MS-EDEN in a
/// Linear").
enum class BackwardQuantizer { Blocks, MsEden };
/// "blocks" | "quartet2-rtn".
const char* forward_quantizer_name(ForwardQuantizer q);
/// "blocks" | "ms-eden".
const char* backward_quantizer_name(BackwardQuantizer q);
/// Whether roles `r` include operand `o`. Throws nothing.
bool four_over_six_applies(FourOverSixRoles r, Operand o);
/// Whether GEMM `g` has operand `o` (fprop: x, w; dgrad: dy, w; wgrad: dy, x).
bool gemm_uses(Gemm g, Operand o);

/// The FP4-eligible linear kinds of the model's mixers, as the reference implementation
/// (mamba_ssm) and HF Nemotron-H name them: "in_proj", "out_proj" (Mamba-2), "q_proj",
/// "k_proj", "v_proj", "o_proj" (attention), "up_proj", "down_proj" (MLP; SwiGLU's gate is
/// fused into "up_proj"). Model::linear_name is "layers.<block>.mixer.<kind>". Overrides
/// select linears by these names.
const std::vector<std::string>& linear_kinds();
/// The kind a recipe name stands for: a kind of linear_kinds() itself, or one of the names
/// used before the hybrid model ("attn.q", "attn.k", "attn.v", "attn.o", "mlp.up",
/// "mlp.down", aliases of q_proj .. down_proj). Returns "" for an unknown name.
std::string canonical_linear_kind(const std::string& name);

/// The Llama-only name of a kind ("down_proj" → "mlp.down"); "" for in_proj, out_proj and
/// unknown names.
std::string legacy_linear_name(const std::string& kind);

/// One linear of a model, as the recipe rules see it: the hybrid block that holds it
/// (0-based, counting every block of the pattern: Mamba-2, attention and MLP alike) and its
/// kind (linear_kinds()).
struct LinearSite {
  int block = 0;
  std::string kind;
};

/// One [[override]] of a recipe file: a change to some GEMMs/operands of some linears, applied
/// after the recipe's own settings and its [high_precision] rules, in file order (a later
/// override wins where two set the same knob). Never applied silently: the trainer's start-of-run
/// line lists every override and the linears it changed; one that changes no linear is an error.
struct LinearOverride {
  std::vector<std::string> linears;  ///< linear kinds (linear_kinds(); aliases are mapped
                                     ///< by the parser), at least one
  /// For each of `linears`, the final k blocks that hold that kind (in a hybrid `M-M*-`,
  /// final_blocks = 2 of down_proj means the last two MLP blocks; of o_proj and down_proj,
  /// the last two of each, as in the Llama-only version where k counted layers); with
  /// `blocks`, their union.
  int final_blocks = 0;
  std::vector<int> blocks;           ///< explicit 0-based hybrid blocks; neither set = every block
  /// Set by the parser when `linears` used the names of the Llama-only version (attn.q ..
  /// mlp.down): `blocks` then counts transformer layers as it did there, which only a
  /// Llama-style pattern ("*-" per layer) has (resolve_linear_plans refuses others).
  bool legacy_layers = false;
  bool has_gemm = false;             ///< gemm set: only that GEMM (else all three)
  Gemm gemm = Gemm::Fprop;
  bool has_role = false;             ///< role set: only that operand (else every operand)
  Operand role = Operand::X;
  bool has_mode = false;             ///< mode set: the whole linear's mode (no gemm/role)
  LinearMode mode = LinearMode::FP4;
  bool has_scale_target = false;     ///< scale_target set: T of the selected quantizations
  float scale_target = 448.f;
  bool has_rounding = false;         ///< rounding set: element rounding of those quantizations
  Rounding rounding = Rounding::RNE;

  /// Whether the override selects linear `sites[i]` of a model whose linears are `sites`
  /// (its kind is in `linears` and its block is selected; see final_blocks).
  bool selects(const std::vector<LinearSite>& sites, size_t i) const;
  /// One line describing the override, e.g.
  /// `linears = ["mlp.down"], final_blocks = 4, gemm = "wgrad", role = "dy": scale_target = 2048`.
  std::string describe() const;

  /// Field-wise equality (floats by ==), for round-trip checks (tests/fuzz/).
  bool operator==(const LinearOverride&) const = default;
};

/// Recipe fields (TOML keys in brackets). See configs/recipes/*.toml and docs/recipes.md
/// "Every knob".
struct Recipe {
  std::string name;         ///< [name]
  std::string description;  ///< [description]
  LinearMode mode = LinearMode::FP32;  ///< [linear] mode = "fp32" | "bf16" | "fp4"
  /// [linear] gemm = "decoded" | "probe-matched" | "decoded-bf16" (docs/numerics.md "GEMM
  /// emulation"), parsed by the recipe reader and written back by recipe_to_toml under the same
  /// name (gemm_mode_name).
  GemmMode gemm = GemmMode::Decoded;
  /// [linear] probe_snap: the probe-matched GEMM's snap grid 1/d (fp4/gemm/accumulator.h):
  /// 1024 (default, the paper's probe), 0 = no snap, or another power of two up to 65536.
  /// Used only with gemm = "probe-matched".
  int probe_snap = 1024;
  /// [linear] probe_alpha = "quotient" (default) | "reciprocal": how the probe-matched GEMM
  /// takes α's quotient (AlphaRule; docs/gemm.md "α as the GPU computed it"). Used only with
  /// gemm = "probe-matched".
  AlphaRule probe_alpha = AlphaRule::Quotient;

  // [fp4] block-scaled format, used when mode == FP4. Names: docs/formats.md.
  /// [fp4] element_format: e2m1 (default), e1m2, e3m0, e2m3, e3m2, e4m3, e5m2, a spelled
  /// e<E>m<M>, int4, int4-sym, parsed by the recipe reader (parse_element_format) and written
  /// back by recipe_to_toml as its canonical lower-case name (ElementFormat::name).
  ElementFormat element_format{};
  /// [fp4] scale_format when it is one of the four conventions of ScaleFormat.
  ScaleFormat scale_format = ScaleFormat::UE5M3;
  /// [fp4] scale_format naming any other block-scale format (ue4m3, ue6m2, ...): set, it
  /// overrides scale_format (see BlockQuantSpec::scale_desc); null for the four.
  const FloatFormat* scale_desc = nullptr;
  /// [fp4] scale_rule = "tensor-scaled" (default) | "mx-te" | "mx-ocp" (ScaleRule); the MX
  /// rules need a power-of-two scale format (ue8m0).
  ScaleRule scale_rule = ScaleRule::TensorScaled;
  int block = 16;              ///< [fp4] block: block length along the contraction dim
  /// [fp4] weight_block: the block length (1-D) or tile side (2-D) of every W operand (fprop
  /// and dgrad), apart from the X and dY blocks (docs/recipes.md "Weight tiles apart from the
  /// blocks"). 0 = the same as `block`: the parser stores 0 when the key is absent or equals
  /// `block`, so recipes without it compare and serialise as before. Read it through
  /// weight_block_size().
  int weight_block = 0;
  bool weight_2d = true;       ///< [fp4] weight_2d: weights in W tiles (else 1-D blocks)
  float scale_target = 448.f;  ///< T
  int amax_interval = 1;       ///< D: 1 = current scaling, 50 = periodic sample-and-hold
  /// [fp4] amax_sample, for D = 1 with several micro-batches per step (train.micro_batch_size):
  /// "per-call" (default; Transformer Engine: a new max|x| at every GEMM call, i.e. every
  /// micro-batch) or "per-step" (the reference implementation: sampled on the step's first
  /// micro-batch, reused by the others). With one micro-batch per step both are the same.
  /// D > 1 always samples on the first micro-batch of a refresh step.
  AmaxSample amax_sample = AmaxSample::PerCall;
  /// [fp4] amax_ranks, under MPI data parallelism: how the ranks agree on an activation or
  /// gradient reference (weights are replicated, so theirs agree already). "invariant"
  /// (default): a sampled reference is the amax of the step's global micro-batch 0, broadcast
  /// from rank 0 (results do not depend on the process count); a per-call (D = 1) amax is each
  /// rank's own, per micro-batch (TE; invariant by construction). "max": every sample or
  /// per-call amax is MAX-reduced over ranks (the reference implementation's rule for held
  /// references; results depend on the process count).
  AmaxRanks amax_ranks = AmaxRanks::Invariant;
  bool rht_wgrad = false;      ///< 16-point RHT on the two wgrad operands (NVFP4)
  /// [fp4] rht_precision = "fp32" (default: rht16_rows) | "bf16" (rht16_rows_bf16, the
  /// reference implementation's BF16 matmul with BF16 output); "bf16" needs rht_wgrad.
  RhtPrecision rht_precision = RhtPrecision::FP32;
  // ---- [fp4] Hadamard transforms (docs/numerics.md "Random Hadamard transform", "Sizes,
  // roles and sign policies"). rht_wgrad is the wgrad role; the defaults are what rht_wgrad
  // alone has always meant (16 points, TE's fixed signs), and recipe_to_toml writes these keys
  // only when they differ from them.
  /// [fp4] hadamard_size: n of every transform, 16 (default), 32, 64 or 128.
  int hadamard_size = 16;
  /// [fp4] hadamard_gemms contains "dgrad": transform dY along N and W's columns along N (the
  /// same transform on both, so dX = dY·W is unchanged in exact arithmetic). "wgrad" in
  /// hadamard_gemms is rht_wgrad.
  bool hadamard_dgrad = false;
  /// [fp4] hadamard_signs: "fixed" (default) | "per-layer" | "per-step" | "per-call" (HadamardSigns).
  HadamardSigns hadamard_signs = HadamardSigns::Fixed;
  /// [fp4] bf16_boundary: every FP4 linear rounds X (forward) and dY (backward) to BF16 (RNE)
  /// and uses the rounded copy for the amax and every quantization of that operand, as the
  /// paper's BF16-activation runs do (docs/numerics.md "BF16 boundary"). Default false.
  bool bf16_boundary = false;
  /// [fp4] bf16_outputs: every FP4 linear rounds its output Y (forward) and its own dX (backward,
  /// before it is added to the input gradient) to BF16 (RNE), as the paper's runs keep them;
  /// dW stays FP32 (docs/numerics.md "GEMM emulation", BF16 interface). Default false.
  bool bf16_outputs = false;
  // ---- [fp4] Four Over Six (docs/recipes.md "Four Over Six"; docs/numerics.md "Four Over Six")
  /// [fp4] four_over_six = "none" (default) | "weights" | "activations" | "gradients" | "all".
  FourOverSixRoles four_over_six = FourOverSixRoles::None;
  /// [fp4] four_over_six_error = "mae" (default, Transformer Engine's) | "mse".
  FourOverSix four_over_six_error = FourOverSix::MAE;
  /// [fp4] four_over_six_scale_target: the scale target T of the 4/6 roles (Transformer
  /// Engine's nvfp4_4over6_e4m3_use_256: 256). 0 = scale_target: the parser stores 0 when the
  /// key is absent or equals scale_target, so recipes without it serialise as before.
  float four_over_six_scale_target = 0.f;
  // ---- end Four Over Six
  /// [fp4] forward_quantizer = "blocks" (default) | "quartet2-rtn" (ForwardQuantizer).
  ForwardQuantizer forward_quantizer = ForwardQuantizer::Blocks;
  /// [fp4] backward_quantizer = "blocks" (default) | "ms-eden" (BackwardQuantizer).
  BackwardQuantizer backward_quantizer = BackwardQuantizer::Blocks;
  /// [fp4] row_scaled_activation: the forward activation X takes one tensor reference per row
  /// (per token; fprop) and its wgrad copy Xᵀ one per row of Xᵀ (per input feature), each the
  /// current amax of that row, as Transformer Engine's NVFP4BlockScaling(row_scaled_activation)
  /// (docs/numerics.md "Per-row reference"). Needs amax_interval = 1, amax_sample = "per-call",
  /// the tensor-scaled rule and gemm = "decoded". Default false (one reference per tensor).
  bool row_scaled_activation = false;
  Rounding round_x = Rounding::RNE;   ///< [rounding] x  (activations)
  Rounding round_w = Rounding::RNE;   ///< [rounding] w  (weights)
  Rounding round_dy = Rounding::SR8;  ///< [rounding] dy (upstream gradient; dgrad and wgrad)

  // [high_precision] which hybrid blocks keep their linears out of FP4 (blocks are counted
  // over the whole pattern: a Llama-style layer is two blocks, attention and MLP).
  LinearMode high_precision_mode = LinearMode::BF16;  ///< format of those linears
  /// [high_precision] final_blocks: keep the final k blocks (0..n_blocks; check_recipe_fits).
  int final_blocks = 0;
  double final_blocks_fraction = 0.0;  ///< keep the final round(f·L) blocks (≥1 if f>0)
  std::vector<int> blocks;             ///< explicit 0-based block indices
  // The three rules combine as a union: a block is high precision if any rule selects it.

  /// [[override]] tables, in file order (LinearOverride).
  std::vector<LinearOverride> overrides;
  /// The file the recipe was loaded from (for error messages; not written by recipe_to_toml).
  std::string source;

  /// Mode of the linears of hybrid block `b` in a model of `n_blocks` blocks, from
  /// [linear] mode and the [high_precision] rules (before any [[override]]; see
  /// resolve_linear_plans for the per-linear result).
  LinearMode block_mode(int b, int n_blocks) const;
  /// Number of final blocks kept high precision by final_blocks and final_blocks_fraction
  /// together: max(final_blocks, round(f·n_blocks) (≥ 1 if f > 0)).
  int final_high_precision_blocks(int n_blocks) const;
  /// "recipe NAME (FILE)" or "recipe NAME" when no file: the prefix of recipe errors.
  std::string where() const;
  /// Name of the block-scale format (scale_desc's if set, else scale_format's).
  std::string scale_format_str() const;
  /// The block length (1-D, weight_2d = false) or tile side (2-D) of the weight operand W in
  /// fprop and dgrad: weight_block, or block when weight_block is 0. 1..kMaxBlock for a
  /// parsed recipe. Throws nothing.
  int weight_block_size() const { return weight_block > 0 ? weight_block : block; }
  /// The block-quantization spec of a role (X, W or dY) for one GEMM: scale format, block
  /// (weight_block_size() for W, block for X and dY), 2-D (W), target, rounding of the role,
  /// element format, scale rule; for a Four Over Six role its error mode and target.
  /// Throws nothing.
  BlockQuantSpec spec_x() const;
  BlockQuantSpec spec_w() const;
  BlockQuantSpec spec_dy() const;

  /// Field-wise equality (floats by ==), for round-trip checks (tests/fuzz/).
  bool operator==(const Recipe&) const = default;
};

/// The resolved recipe of one linear layer: everything an nn::Linear needs, so that a Linear
/// never reads a Recipe (the recipe is resolved once, by resolve_linear_plans or uniform()).
/// Its mode and the block-quantization spec of every (GEMM, operand) pair it quantizes, after
/// [high_precision] and [[override]]; and the recipe-wide knobs of its FP4 path. The dY
/// reference g is still one per layer, shared by dgrad and wgrad (docs/numerics.md "Tensor
/// reference g"); specs may differ only in what the quantization does with it (T, rounding).
/// The knobs below mode and specs are the recipe's values, whatever the mode; a Linear applies
/// them only in FP4 mode (rht(), probe(), reference_interval()).
struct LinearPlan {
  LinearMode mode = LinearMode::FP32;
  BlockQuantSpec specs[3][3];  ///< [Gemm][Operand]; pairs a GEMM does not use are unused
  GemmMode gemm = GemmMode::Decoded;  ///< [linear] gemm (docs/numerics.md "GEMM emulation")
  int probe_snap = 1024;              ///< [linear] probe_snap: snap grid 1/d of the probe-matched GEMM
  AlphaRule probe_alpha = AlphaRule::Quotient;  ///< [linear] probe_alpha: how α's quotient is taken
  int amax_interval = 1;              ///< [fp4] amax_interval: D of the tensor references
  AmaxSample amax_sample = AmaxSample::PerCall;  ///< [fp4] amax_sample
  bool rht_wgrad = false;             ///< [fp4] rht_wgrad: 16-point RHT on the wgrad operands
  RhtPrecision rht_precision = RhtPrecision::FP32;  ///< [fp4] rht_precision
  int hadamard_size = 16;             ///< [fp4] hadamard_size: n of the wgrad/dgrad transforms
  bool hadamard_dgrad = false;        ///< [fp4] hadamard_gemms has "dgrad"
  HadamardSigns hadamard_signs = HadamardSigns::Fixed;  ///< [fp4] hadamard_signs
  bool bf16_boundary = false;         ///< [fp4] bf16_boundary: X and dY rounded to BF16 first
  bool bf16_outputs = false;          ///< [fp4] bf16_outputs: Y and this linear's dX rounded to BF16
  bool row_scaled_activation = false;  ///< [fp4] row_scaled_activation: per-row references of X and Xᵀ
  ForwardQuantizer forward_quantizer = ForwardQuantizer::Blocks;     ///< [fp4] forward_quantizer
  BackwardQuantizer backward_quantizer = BackwardQuantizer::Blocks;  ///< [fp4] backward_quantizer

  const BlockQuantSpec& spec(Gemm g, Operand o) const { return specs[int(g)][int(o)]; }
  /// FP4 with gemm = probe-matched: quantized operands multiplied by fp4::probe_gemm.
  bool probe() const { return mode == LinearMode::FP4 && gemm == GemmMode::ProbeMatched; }
  /// FP4 with gemm = decoded-bf16: operands quantized to q·c_b, multiplied by
  /// fp4::gemm_block_scaled (the BF16 GEMM, decode scales on the output).
  bool bf16_gemm() const { return mode == LinearMode::FP4 && gemm == GemmMode::DecodedBf16; }
  /// FP4 with rht_wgrad: every call's token count M must be a multiple of 16 (check_rht_tokens).
  bool rht() const { return mode == LinearMode::FP4 && rht_wgrad; }
  /// FP4 with "dgrad" in hadamard_gemms: dY and W transformed along N before dgrad's
  /// quantization (the layer's N must be a multiple of hadamard_size: check_hadamard_shape).
  bool dgrad_hadamard() const { return mode == LinearMode::FP4 && hadamard_dgrad; }
  /// FP4 with forward_quantizer = "quartet2-rtn": X and W by Quartet II's forward quantizer.
  bool quartet_forward() const {
    return mode == LinearMode::FP4 && forward_quantizer == ForwardQuantizer::QuartetRtn;
  }
  /// FP4 with backward_quantizer = "ms-eden": the four backward operands by MS-EDEN, after the
  /// Hadamard transform (the inner dim zero-padded to a multiple of hadamard_size).
  bool ms_eden() const { return mode == LinearMode::FP4 && backward_quantizer == BackwardQuantizer::MsEden; }
  /// The transform of this plan for layer `layer` at 1-based optimizer step `step` of a run
  /// with seed `seed` (HadamardTransform::make with hadamard_size, hadamard_signs and
  /// rht_precision). Throws nothing for a parsed recipe's plan.
  HadamardTransform hadamard(uint64_t seed, uint32_t layer, uint32_t step, uint32_t micro = 0) const {
    return HadamardTransform::make(hadamard_size, hadamard_signs, rht_precision, seed, layer, step,
                                   micro);
  }
  /// D of this linear's training references: amax_interval in FP4 mode, else 1.
  int reference_interval() const { return mode == LinearMode::FP4 ? amax_interval : 1; }
  /// The plan every linear of mode `mode` gets from a recipe without overrides: spec_x() for
  /// X, spec_w() for W, spec_dy() for dY, in every GEMM, and the recipe's knobs. Throws
  /// nothing.
  static LinearPlan uniform(const Recipe& r, LinearMode mode);

  /// Field-wise equality (floats by ==), for round-trip checks (tests/fuzz/).
  bool operator==(const LinearPlan&) const = default;
};

/// Per-linear plans of a recipe for a model's linears (one per LinearSite, in model order),
/// and for each override the linear indices it changed.
struct ResolvedLinears {
  std::vector<LinearPlan> plans;                ///< [sites.size()]
  std::vector<std::vector<int>> override_hits;  ///< [overrides.size()], ascending indices
};

/// Resolve [linear], [high_precision] and every [[override]] for the linears `sites` of a
/// model of `n_blocks` hybrid blocks. An override changes a linear when it selects it and
/// (for scale_target/rounding) the linear is FP4 after the mode rules. Throws
/// fp4::UserError naming the recipe file and the key when high_precision.blocks /
/// final_blocks or an override's blocks / final_blocks do not fit the model (an override's
/// final_blocks counts the blocks that hold its linears), or when an override changes no
/// linear.
ResolvedLinears resolve_linear_plans(const Recipe& r, const std::vector<LinearSite>& sites,
                                     int n_blocks);

/// The one check of the RHT's shape rule (docs/numerics.md "Random Hadamard transform"): the
/// 16-point RHT of the wgrad operands runs along the M tokens of one call, so M must be a
/// multiple of 16 when the plan applies it (plan.rht()). Throws std::invalid_argument "<who>:
/// RHT needs the token count M = <M> to be a multiple of 16" otherwise; no-op for plans without
/// the RHT.
void check_rht_tokens(const LinearPlan& plan, int64_t M, const std::string& who);

/// The shape rules of a plan's Hadamard transforms (docs/numerics.md "Random Hadamard
/// transform"), generalising check_rht_tokens: with rht() the token count M of the call must be
/// a multiple of hadamard_size (the wgrad transform runs along M), with dgrad_hadamard() the
/// layer's output features N (the dgrad contraction dim). Throws std::invalid_argument
/// "<who>: the <n>-point Hadamard transform of the <wgrad|dgrad> operands needs <M|N> = <v> to
/// be a multiple of <n>" otherwise; no-op for plans without them.
void check_hadamard_shape(const LinearPlan& plan, int64_t M, int64_t N, const std::string& who);

/// The linears of the Llama-style pattern "*-" repeated n_layers times (2·n_layers blocks;
/// q, k, v, o_proj in each even block, up, down_proj in each odd one): for tests and tools
/// that think in transformer layers.
std::vector<LinearSite> llama_linear_sites(int n_layers);

/// Parse a recipe file. Throws fp4::UserError naming the file, the key and the expected
/// value for malformed TOML, unknown keys, wrong types or out-of-range values.
/// `sets` (the recipe part of parse_settings) override keys of the file first and are
/// validated exactly as the file's values; an error about an overridden key names its --set
/// argument. A recipe changed by `sets` is renamed so that it is never reported under the
/// file's name: "NAME+KEY=VALUE+..." (labelled_name; `description` changes no name), or the
/// name a `recipe.name` setting gives.
Recipe load_recipe_file(const std::filesystem::path& file, const std::vector<Setting>& sets = {});

/// Resolve a recipe argument: an existing .toml path, or a name looked up as
/// `<recipes_dir>/<name>.toml`, then load_recipe_file with `sets`. Throws fp4::UserError
/// listing the available names.
Recipe load_recipe(const std::string& name_or_path, const std::filesystem::path& recipes_dir,
                   const std::vector<Setting>& sets = {});

/// Recipe as TOML text (for the resolved config written next to a run).
std::string recipe_to_toml(const Recipe& r);

/// Parse recipe TOML text (e.g. the resolved recipe stored in a checkpoint); `where` names
/// the source in error messages; `sets` as in load_recipe_file (`fp4train eval --set` on a
/// checkpoint's recipe). Throws fp4::UserError like load_recipe_file.
Recipe recipe_from_text(const std::string& toml, const std::string& where,
                        const std::vector<Setting>& sets = {});

}  // namespace fp4
