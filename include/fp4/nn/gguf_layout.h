// The GGUF layout of a fp4train model for llama.cpp (`fp4train export --format gguf`):
// llama.cpp's architecture, its metadata keys and its tensor names. docs/export.md "GGUF for
// llama.cpp" has the table; in short, for a Llama-style config (pattern "*-" repeated):
//
//   architecture: "llama" (SwiGLU MLP) or "arcee" (squared-ReLU MLP, no gate); both apply
//                 RoPE to adjacent pairs (x[2i], x[2i+1]), as fp4train does, so q_proj and
//                 k_proj keep fp4train's row order (the HF export permutes them).
//   embeddings → token_embd.weight   layers.2i.norm → blk.i.attn_norm.weight
//   q/k/v/o_proj → blk.i.attn_q / attn_k / attn_v / attn_output.weight
//   layers.2i+1.norm → blk.i.ffn_norm.weight   up_proj → ffn_gate + ffn_up (SwiGLU: first /
//   second half of the rows) or ffn_up   down_proj → ffn_down
//   norm_f → output_norm.weight      lm_head → output.weight
//
// The hybrid (any other pattern) is llama.cpp's "nemotron_h": no RoPE, squared-ReLU MLPs, and
// Mamba-2 blocks as ssm_in, ssm_conv1d, ssm_dt.bias, ssm_a (A = −exp(A_log)), ssm_d, ssm_norm
// ({d_inner / G, G}) and ssm_out.
//
// A row-major [rows, cols] matrix is the GGUF tensor ne = {cols, rows}.
#pragma once
#include <string>
#include <vector>

#include "fp4/base/gguf.h"
#include "fp4/config/config.h"
#include "fp4/nn/model.h"
#include "fp4/numerics/block_quant.h"

namespace fp4 {

/// llama.cpp's architecture for `cfg`: "llama", "arcee" or "nemotron_h" (see above). Throws
/// fp4::UserError naming what llama.cpp cannot run: a Llama-style model without RoPE, a hybrid
/// with RoPE or a SwiGLU MLP.
std::string gguf_architecture(const ModelConfig& cfg);

/// One tensor of the GGUF layout: FP32 values, dims in GGUF order (ne[0] fastest).
struct GgufTensor {
  std::string name;    ///< e.g. "blk.0.attn_q.weight"
  std::string source;  ///< the fp4train parameter, e.g. "layers.0.mixer.q_proj"
  std::vector<int64_t> ne;
  std::vector<float> data;  ///< row-major, ne[0] fastest
  /// The tensor's rows are rows [source_row0, source_row0 + ne[1]) of its source parameter,
  /// in order (every Llama-style and hybrid tensor is such a row range: SwiGLU's ffn_gate and
  /// ffn_up are the two halves of up_proj), so a quantized source packs row by row.
  int64_t source_row0 = 0;
};

/// The GGUF blocks of rows [row0, row0 + rows) of q, an E2M1 weight quantized as W [N, K] for
/// fprop (fp4/numerics/block_quant.h), in ggml's layout (ggml-common.h):
///  * MXFP4 (q: UE8M0 scales, an MX scale rule, 1-D blocks of 32 along K): per block of 32,
///    the E8M0 scale byte (UE8M0's code: 2^(code − 127)), then 16 bytes whose byte j holds
///    element j in its low and element j + 16 in its high nibble;
///  * NVFP4 (q: E4M3 scales, the tensor-scaled rule, blocks or 16 × 16 tiles of 16, K a
///    multiple of 64): per 64 values, the four E4M3 scale codes of its 16-value blocks (a tile's
///    code repeated over its 16 rows), then 4 × 8 bytes, byte j of sub-block s holding element
///    16s + j low and 16s + j + 8 high. The tensor decode scale gd goes in the separate
///    "<name>.scale" tensor.
/// E2M1 codes are the same in both (sign in bit 3, magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6).
/// Throws fp4::UserError naming `what` when q's spec is not the type's (a different scale
/// format, rule, block length or element format, or K not a multiple of 64 for NVFP4), and
/// std::invalid_argument for rows outside q.
std::vector<uint8_t> pack_gguf_fp4(const QuantizedTensor& q, int64_t row0, int64_t rows,
                                   gguf::TensorType type, const std::string& what);

/// The GGUF tensors of a model of `cfg` whose parameters are `values` (in the layout of
/// `infos`, Model::param_infos), in llama.cpp's names, F32. Throws as gguf_architecture, and
/// std::invalid_argument for a parameter this layout does not know.
std::vector<GgufTensor> gguf_tensors(const ModelConfig& cfg,
                                     const std::vector<nn::ParamInfo>& infos,
                                     const std::vector<float>& values);

/// The architecture's metadata keys of `cfg` added to `w` (general.architecture, general.name
/// = `name`, general.file_type, <arch>.context_length = `context_length`, embedding_length,
/// block_count, feed_forward_length, attention.head_count(_kv), layer_norm_rms_epsilon,
/// vocab_size; rope.* for llama and arcee; ssm.* and per-block arrays for nemotron_h), as
/// llama.cpp's loader reads them (llama-arch.cpp LLM_KV_*). `all_f32`: every tensor F32
/// (general.file_type 0). Throws as gguf_architecture.
void add_gguf_metadata(gguf::Writer& w, const ModelConfig& cfg, int context_length,
                       const std::string& name, bool all_f32);

}  // namespace fp4
