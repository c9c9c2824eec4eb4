// The GGUF layout of a fp4train model: see gguf_layout.h and docs/export.md.
#include "fp4/nn/gguf_layout.h"

#include <cmath>
#include <map>
#include <stdexcept>

#include "fp4/base/error.h"
#include "fp4/nn/hf_layout.h"

namespace fp4 {
namespace {

static const std::map<std::string, std::string> nemotron_top = {
    {"backbone.embeddings.weight", "token_embd.weight"},
    {"backbone.norm_f.weight", "output_norm.weight"}};

// llama.cpp's name of an HF Nemotron-H tensor of block N, "backbone.layers.N.<rest>"
// (convert_hf_to_gguf's map for NemotronHForCausalLM; A, D without ".weight"), or "".
std::string nemotron_block_name(const std::string& hf) {
  static const std::map<std::string, std::string> block = {
      {"norm.weight", "attn_norm.weight"},
      {"mixer.q_proj.weight", "attn_q.weight"},
      {"mixer.k_proj.weight", "attn_k.weight"},
      {"mixer.v_proj.weight", "attn_v.weight"},
      {"mixer.o_proj.weight", "attn_output.weight"},
      {"mixer.up_proj.weight", "ffn_up.weight"},
      {"mixer.down_proj.weight", "ffn_down.weight"},
      {"mixer.in_proj.weight", "ssm_in.weight"},
      {"mixer.conv1d.weight", "ssm_conv1d.weight"},
      {"mixer.conv1d.bias", "ssm_conv1d.bias"},
      {"mixer.dt_bias", "ssm_dt.bias"},
      {"mixer.A_log", "ssm_a"},
      {"mixer.D", "ssm_d"},
      {"mixer.norm.weight", "ssm_norm.weight"},
      {"mixer.out_proj.weight", "ssm_out.weight"}};
  const std::string pre = "backbone.layers.";
  const size_t dot = hf.find('.', pre.size());
  if (dot == std::string::npos) return "";
  auto it = block.find(hf.substr(dot + 1));
  return it == block.end() ? ""
                           : "blk." + hf.substr(pre.size(), dot - pre.size()) + "." + it->second;
}

// llama.cpp's name of an HF Llama-layout tensor (convert_hf_to_gguf's map for LlamaForCausalLM),
// or "" if it has none.
std::string gguf_name(const std::string& hf) {
  static const std::map<std::string, std::string> top = {
      {"model.embed_tokens.weight", "token_embd.weight"},
      {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"}};
  static const std::map<std::string, std::string> layer = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"}};
  if (auto it = top.find(hf); it != top.end()) return it->second;
  if (auto it = nemotron_top.find(hf); it != nemotron_top.end()) return it->second;
  if (hf.rfind("backbone.layers.", 0) == 0) return nemotron_block_name(hf);
  const std::string pre = "model.layers.";
  if (hf.rfind(pre, 0) != 0) return "";
  const size_t dot = hf.find('.', pre.size());
  if (dot == std::string::npos) return "";
  auto it = layer.find(hf.substr(dot + 1));
  return it == layer.end() ? ""
                           : "blk." + hf.substr(pre.size(), dot - pre.size()) + "." + it->second;
}

// Rows of an HF q_proj / k_proj (heads of hd rows, RoPE pairs in halves) back in fp4train's
// order (adjacent pairs), which is llama.cpp's: row 2i of a head is HF row i, row 2i + 1 is
// HF row i + hd/2 (the inverse of hf_layout.h's permutation).
std::vector<float> rope_rows_adjacent(const std::vector<float>& hf, int64_t cols, int hd) {
  std::vector<float> out(hf.size());
  const int64_t rows = static_cast<int64_t>(hf.size()) / cols;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t head = r / hd, j = r % hd;
    const int64_t src = head * hd + (j % 2 == 0 ? j / 2 : j / 2 + hd / 2);
    std::copy(hf.begin() + src * cols, hf.begin() + (src + 1) * cols, out.begin() + r * cols);
  }
  return out;
}
}  // namespace

std::string gguf_architecture(const ModelConfig& cfg) {
  if (!hf_llama_layout(cfg)) {
    // The hybrid: llama.cpp's nemotron_h has no positional embedding and squared-ReLU MLPs.
    const bool attention = cfg.block_pattern().find('*') != std::string::npos;
    if (attention && cfg.rope)
      throw UserError("GGUF export: pattern '" + cfg.block_pattern() +
                      "' with model.rope = true, but llama.cpp's nemotron_h applies no RoPE "
                      "(docs/export.md \"GGUF for llama.cpp\")");
    if (cfg.mlp != "squared_relu")
      throw UserError("GGUF export: pattern '" + cfg.block_pattern() + "' with mlp = '" + cfg.mlp +
                      "', but llama.cpp's nemotron_h MLP is squared ReLU");
    // Its hybrid memory holds a recurrent and an attention cache; with either kind of block
    // missing, llama.cpp v0.4.0 aborts on the file (GGML_ASSERT(buffer) in ggml-backend).
    const std::string p = cfg.block_pattern();
    if (p.find('M') == std::string::npos || !attention)
      throw UserError("GGUF export: pattern '" + p + "' has no " +
                      (p.find('M') == std::string::npos ? "Mamba-2 (M)" : "attention (*)") +
                      " block, but llama.cpp's nemotron_h needs at least one of each");
    return "nemotron_h";
  }
  if (!cfg.rope)
    throw UserError(
        "GGUF export: model.rope = false, but llama.cpp's llama and arcee "
        "architectures apply RoPE to every attention block");
  if (cfg.mlp == "swiglu") return "llama";
  if (cfg.mlp == "squared_relu") return "arcee";
  throw UserError("GGUF export: MLP '" + cfg.mlp + "' has no llama.cpp architecture");
}

std::vector<GgufTensor> gguf_tensors(const ModelConfig& cfg,
                                     const std::vector<nn::ParamInfo>& infos,
                                     const std::vector<float>& values) {
  gguf_architecture(cfg);  // throws for a config llama.cpp cannot run
  std::vector<GgufTensor> out;
  std::map<std::string, int64_t> rows_taken;  // rows of each source handed out so far
  for (HfTensor& t : hf_tensors(cfg, infos, values)) {
    const std::string name = gguf_name(t.name);
    if (name.empty()) throw std::invalid_argument("gguf_tensors: no GGUF name for " + t.name);
    const bool rope_rows = name.ends_with("attn_q.weight") || name.ends_with("attn_k.weight");
    std::vector<int64_t> ne(t.shape.rbegin(), t.shape.rend());
    std::vector<float> data = rope_rows && cfg.rope
                                  ? rope_rows_adjacent(t.data, t.shape[1], cfg.attn_head_dim())
                                  : std::move(t.data);
    // Mamba-2 (llama.cpp's shapes, convert_hf_to_gguf's Mamba2Model): the conv1d weight
    // [C', 1, W] as {W, C'}; A and D [H] as {1, H}, A itself (−exp(A_log), what the scan takes);
    // the gated RMSNorm's weight [d_inner] as {d_inner / G, G} (one norm per group).
    if (name.ends_with("ssm_conv1d.weight")) ne = {t.shape[2], t.shape[0]};
    if (name.ends_with("ssm_a") || name.ends_with("ssm_d")) ne = {1, t.shape[0]};
    if (name.ends_with("ssm_a"))
      for (float& v : data) v = -std::exp(v);
    if (name.ends_with("ssm_norm.weight"))
      ne = {t.shape[0] / cfg.mamba_n_groups, cfg.mamba_n_groups};
    const int64_t rows = t.shape.size() >= 2 ? t.shape[0] : 1;
    int64_t& row0 = rows_taken[t.source];
    out.push_back({name, t.source, std::move(ne), std::move(data), row0});
    row0 += rows;
  }
  return out;
}

std::vector<uint8_t> pack_gguf_fp4(const QuantizedTensor& q, int64_t row0, int64_t rows,
                                   gguf::TensorType type, const std::string& what) {
  const BlockQuantSpec& s = q.spec;
  const bool mx = type == gguf::TensorType::MXFP4;
  if (!mx && type != gguf::TensorType::NVFP4)
    throw std::invalid_argument("pack_gguf_fp4: not an FP4 type: " + gguf::type_name(type));
  const bool fits = s.element.is_e2m1() && s.scale_desc == nullptr &&
                    (mx ? s.scale_format == ScaleFormat::UE8M0 &&
                              s.scale_rule != ScaleRule::TensorScaled && s.block == 32 && !s.two_d
                        : is_nvfp4_spec(s));
  if (!fits)
    throw UserError(what + ": its weights are quantized as " + scale_format_name(s.scale_format) +
                    " block " + std::to_string(s.block) + (s.two_d ? " tiles" : "") +
                    (mx ? ", not as MXFP4 (E2M1, UE8M0 scales, an MX rule, 1-D blocks of 32)"
                        : ", not as NVFP4 (E2M1, E4M3 scales, tensor-scaled, blocks of 16)"));
  const int64_t K = q.cols;
  if (!mx && K % 64 != 0)
    throw UserError(what + ": inner dimension " + std::to_string(K) +
                    " is not a multiple of 64, the NVFP4 block of GGUF");
  if (row0 < 0 || rows < 0 || row0 + rows > q.rows)
    throw std::invalid_argument("pack_gguf_fp4: rows outside the quantized tensor");
  const int64_t per = mx ? 32 : 64, half = mx ? 16 : 8, sub = mx ? 32 : 16;
  std::vector<uint8_t> out;
  out.reserve(static_cast<size_t>(rows * (K / per) * (mx ? 17 : 36)));
  for (int64_t r = row0; r < row0 + rows; ++r) {
    const int64_t br = s.two_d ? r / s.block : r;  // the block row of element row r
    const uint8_t* c = q.codes.data() + r * K;
    for (int64_t b0 = 0; b0 < K; b0 += per) {
      for (int64_t j = b0; j < b0 + per; j += sub)  // the scale byte(s)
        out.push_back(q.scale_codes[static_cast<size_t>(br * q.block_cols + j / s.block)]);
      for (int64_t j = b0; j < b0 + per; j += sub)  // each sub-block's nibble pairs
        for (int64_t i = 0; i < half; ++i)
          out.push_back(static_cast<uint8_t>((c[j + i] & 0xF) | (c[j + i + half] & 0xF) << 4));
    }
  }
  return out;
}

void add_gguf_metadata(gguf::Writer& w, const ModelConfig& cfg, int context_length,
                       const std::string& name, bool all_f32) {
  using gguf::ValueType;
  const std::string arch = gguf_architecture(cfg);
  w.add("general.architecture", ValueType::String, arch);
  w.add("general.name", ValueType::String, name);
  // llama_ftype: 0 = all F32 (LLAMA_FTYPE_ALL_F32).
  if (all_f32) w.add("general.file_type", ValueType::U32, 0);
  w.add(arch + ".context_length", ValueType::U32, context_length);
  w.add(arch + ".embedding_length", ValueType::U32, cfg.d_model);
  w.add(arch + ".attention.head_count", ValueType::U32, cfg.n_heads);
  w.add(arch + ".attention.key_length", ValueType::U32, cfg.attn_head_dim());
  w.add(arch + ".attention.value_length", ValueType::U32, cfg.attn_head_dim());
  w.add(arch + ".attention.layer_norm_rms_epsilon", ValueType::F32, cfg.norm_eps);
  w.add(arch + ".vocab_size", ValueType::U32, cfg.vocab_size);
  if (arch != "nemotron_h") {
    w.add(arch + ".block_count", ValueType::U32, cfg.n_blocks() / 2);
    w.add(arch + ".feed_forward_length", ValueType::U32, cfg.mlp_hidden);
    w.add(arch + ".attention.head_count_kv", ValueType::U32, cfg.kv_heads());
    w.add(arch + ".rope.freq_base", ValueType::F32, cfg.rope_theta);
    w.add(arch + ".rope.dimension_count", ValueType::U32, cfg.attn_head_dim());
    return;
  }
  // nemotron_h: one block per pattern character; llama.cpp takes a block for Mamba-2 when its
  // feed_forward_length and head_count_kv are both 0, for attention when only the first is.
  const std::string pattern = cfg.block_pattern();
  nlohmann::json ff = nlohmann::json::array(), kv = nlohmann::json::array();
  for (char c : pattern) {
    ff.push_back(c == '-' ? cfg.mlp_hidden : 0);
    kv.push_back(c == '*' ? cfg.kv_heads() : 0);
  }
  w.add(arch + ".block_count", ValueType::U32, cfg.n_blocks());
  w.add_array(arch + ".feed_forward_length", ValueType::U32, ff);
  w.add_array(arch + ".attention.head_count_kv", ValueType::U32, kv);
  // Read by the loader for the multi-token-prediction head's LayerNorm, required.
  w.add(arch + ".attention.layer_norm_epsilon", ValueType::F32, cfg.norm_eps);
  w.add(arch + ".ssm.conv_kernel", ValueType::U32, cfg.mamba_conv_kernel);
  w.add(arch + ".ssm.inner_size", ValueType::U32, cfg.mamba_d_inner());
  w.add(arch + ".ssm.state_size", ValueType::U32, cfg.mamba_state_size);
  w.add(arch + ".ssm.time_step_rank", ValueType::U32, cfg.mamba_num_heads);
  w.add(arch + ".ssm.group_count", ValueType::U32, cfg.mamba_n_groups);
}

}  // namespace fp4
