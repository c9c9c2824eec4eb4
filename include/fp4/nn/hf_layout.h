// The Hugging Face layout of a fp4train model (`fp4train export`, `fp4train eval
// --grad-out`): fp4train's parameters (fp4/nn/model.h ParamInfo, FP32) renamed and reshaped
// to HF transformers' names, and the config.json that describes them. docs/export.md has
// the full table; in short:
//
//   Llama layout (pattern "*-" repeated, i.e. a Llama-style config; HF LlamaForCausalLM):
//     embeddings              model.embed_tokens.weight             [V, d]
//     layers.{2i}.norm        model.layers.i.input_layernorm.weight [d]
//     layers.{2i}.mixer.q_proj model.layers.i.self_attn.q_proj.weight (k_proj, v_proj, o_proj)
//     layers.{2i+1}.norm      model.layers.i.post_attention_layernorm.weight
//     layers.{2i+1}.mixer.up_proj  SwiGLU: rows [0, F) → mlp.gate_proj.weight, rows [F, 2F)
//                                  → mlp.up_proj.weight; squared ReLU: mlp.up_proj.weight
//     layers.{2i+1}.mixer.down_proj model.layers.i.mlp.down_proj.weight
//     norm_f                  model.norm.weight;   lm_head  lm_head.weight
//   Nemotron-H layout (any other pattern; HF NemotronHForCausalLM):
//     embeddings → backbone.embeddings.weight; layers.N.norm → backbone.layers.N.norm.weight;
//     layers.N.mixer.<linear> → backbone.layers.N.mixer.<linear>.weight;
//     conv1d [C', W] → backbone.layers.N.mixer.conv1d.weight [C', 1, W]; conv1d_bias →
//     mixer.conv1d.bias [C']; dt_bias, A_log, D → mixer.dt_bias, mixer.A_log, mixer.D [H];
//     norm (gated RMSNorm) → mixer.norm.weight [d_inner]; norm_f → backbone.norm_f.weight;
//     lm_head → lm_head.weight.
//
// RoPE: fp4train rotates interleaved pairs (x[2i], x[2i+1]) (fp4/nn/layers.h rope_forward),
// HF the halves (x[i], x[i + hd/2]) (rotate_half). With model.rope the rows of q_proj and
// k_proj are permuted within each head, HF row j ← fp4train row 2j (j < hd/2) or
// 2(j − hd/2) + 1 (j ≥ hd/2), which makes the two attention computations identical (the same
// permutation as HF's convert_llama_weights_to_hf, in reverse).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fp4/nn/run_config.h"
#include "fp4/nn/model.h"
#include "fp4/numerics/block_quant.h"

namespace fp4 {

/// One tensor of the HF layout: FP32 values in HF's shape (row-major).
struct HfTensor {
  std::string name;            ///< HF name, e.g. "model.layers.0.self_attn.q_proj.weight"
  std::string source;          ///< the fp4train parameter it comes from, e.g. "layers.0.mixer.q_proj"
  std::vector<int64_t> shape;  ///< HF shape
  std::vector<float> data;
  /// For a matrix parameter (rows > 1) whose HF tensor is a choice of its rows (every linear:
  /// kept, permuted by RoPE's pair layout, or split like SwiGLU's up_proj): HF row j is row
  /// source_rows[j] of the fp4train parameter, so a per-row quantized weight (block scales
  /// along its columns) maps row by row. Empty otherwise (vectors, conv1d's reshape).
  std::vector<int64_t> source_rows;
};

/// Whether `cfg` is exported in the Llama layout (its pattern is "*-" repeated), else the
/// Nemotron-H layout.
bool hf_llama_layout(const ModelConfig& cfg);

/// The HF tensors of `values` (num_params floats in the layout of `infos`, the
/// Model::param_infos of a model of `cfg`: its parameters, or their gradients, which map the
/// same way since every step is a permutation or a split), in `infos` order. Throws
/// std::invalid_argument if a parameter name is not one of the model's (a layout this code
/// does not know) or `values` is shorter than the parameters.
std::vector<HfTensor> hf_tensors(const ModelConfig& cfg, const std::vector<nn::ParamInfo>& infos,
                                 const std::vector<float>& values);

/// The config.json of the export: HF transformers' keys for LlamaForCausalLM or
/// NemotronHForCausalLM, and an "fp4train" object with what HF has no key for (MLP kind,
/// RoPE on/off and its pair layout, the fp4train pattern and config TOML, the map from HF
/// names to fp4train names). `seq_len` becomes max_position_embeddings. The Nemotron-H layout
/// says residual_in_fp32 = false and time_step_limit = [0.0, FLT_MAX], as nvidia's configs
/// (whose [0.0, Infinity] is not JSON; FLT_MAX clamps no finite FP32 Δ, and fp4train clamps Δ
/// nowhere): docs/export.md "config.json: two keys of the Nemotron-H layout".
nlohmann::json hf_config(const ModelConfig& cfg, int seq_len, const std::vector<HfTensor>& tensors);

// ----------------------------------------------------------------------------- NVFP4

/// Whether `s` quantizes as NVFP4 (E2M1 elements, E4M3 block scales, the tensor-scaled rule,
/// blocks of 16 or 16 × 16 tiles): the weights the NVFP4 exports write as they were trained.
bool is_nvfp4_spec(const BlockQuantSpec& s);

/// The two conventions of an NVFP4 safetensors checkpoint (docs/export.md "NVFP4 safetensors
/// for vLLM and TensorRT-LLM"), which differ in tensor names and in the tensor scale:
///  * ModelOpt (NVIDIA TensorRT Model Optimizer's Hugging Face checkpoint, hf_quant_config.json):
///    `weight`, `weight_scale`, `weight_scale_2` = the decode scale gd, `input_scale` = the
///    activation's decode scale;
///  * CompressedTensors (compressed-tensors' "nvfp4-pack-quantized"): `weight_packed`,
///    `weight_scale`, `weight_global_scale` = the encode scale ge = 1 / weight_scale_2 (its
///    reciprocal convention), `input_global_scale` = the activation's encode scale.
enum class Nvfp4Convention { ModelOpt, CompressedTensors };
/// "modelopt" or "compressed-tensors".
const char* nvfp4_convention_name(Nvfp4Convention c);

/// One FP4 linear's HF weight in NVFP4, row by row: `weight` [rows, cols / 2] (two E2M1 codes
/// per byte, the even column in the low nibble, sign in bit 3 of each nibble), `weight_scale`
/// [rows, cols / 16] (the E4M3 block-scale codes, OCP float8_e4m3fn bits; a 16 × 16 tile's code
/// repeated over its 16 rows).
struct HfNvfp4 {
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> weight;
  std::vector<uint8_t> weight_scale;
};

/// The rows `source_rows` (HfTensor::source_rows) of q, an NVFP4 weight W [N, K] as quantized
/// for fprop (is_nvfp4_spec), packed as HfNvfp4. Throws fp4::UserError naming `what` when q is
/// not NVFP4 or K is not a multiple of 16 (every block whole), std::invalid_argument for a
/// source row outside q.
HfNvfp4 pack_hf_nvfp4(const QuantizedTensor& q, const std::vector<int64_t>& source_rows,
                      const std::string& what);

}  // namespace fp4
