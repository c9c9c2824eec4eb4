// The Hugging Face layout of a fp4train model: see hf_layout.h and docs/export.md.
#include "fp4/nn/hf_layout.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

#include "fp4/base/error.h"

namespace fp4 {
using json = nlohmann::json;

namespace {
// The source row of each row of every piece that is a choice of the parameter's rows: the
// pieces of a parameter whose element (r, c) holds r, read back row by row (exact: a row index
// below 2^24 is an FP32 integer). A piece whose row is not one constant index, or whose width
// is not the parameter's, is not such a choice and gets no rows.
void trace_source_rows(const nn::MixerKind& kind, const std::string& param, const nn::ParamInfo& p,
                       const ModelConfig& cfg, std::vector<HfTensor>& out, size_t first) {
  if (p.rows <= 1 || p.rows >= (int64_t{1} << 24)) return;
  std::vector<float> index(p.size);
  for (int64_t r = 0; r < p.rows; ++r)
    std::fill(index.begin() + r * p.cols, index.begin() + (r + 1) * p.cols, float(r));
  const std::vector<nn::HfPiece> traced = kind.hf(param, index.data(), p.rows, p.cols, cfg);
  for (size_t i = 0; i < traced.size() && first + i < out.size(); ++i) {
    const std::vector<float>& d = traced[i].data;
    if (traced[i].shape.size() != 2 || traced[i].shape[1] != p.cols) continue;
    std::vector<int64_t> rows(traced[i].shape[0]);
    bool choice = true;
    for (size_t j = 0; j < rows.size() && choice; ++j) {
      rows[j] = int64_t(d[j * p.cols]);
      choice = std::all_of(d.begin() + j * p.cols, d.begin() + (j + 1) * p.cols,
                           [&](float v) { return v == d[j * p.cols]; });
    }
    if (choice) out[first + i].source_rows = std::move(rows);
  }
}

std::vector<int64_t> identity_rows(int64_t n) {
  std::vector<int64_t> r(n);
  for (int64_t i = 0; i < n; ++i) r[i] = i;
  return r;
}
}  // namespace

bool hf_llama_layout(const ModelConfig& cfg) {
  const std::string p = cfg.block_pattern();
  if (p.empty() || p.size() % 2) return false;
  for (size_t i = 0; i < p.size(); i += 2)
    if (p[i] != '*' || p[i + 1] != '-') return false;
  return true;
}

std::vector<HfTensor> hf_tensors(const ModelConfig& cfg, const std::vector<nn::ParamInfo>& infos,
                                 const std::vector<float>& values) {
  const bool llama = hf_llama_layout(cfg);
  const std::string pattern = cfg.block_pattern();
  std::vector<HfTensor> out;
  for (const nn::ParamInfo& p : infos) {
    if (p.offset + p.size > static_cast<int64_t>(values.size()))
      throw std::invalid_argument("hf_tensors: values hold " + std::to_string(values.size()) +
                                  " floats, fewer than the parameters need");
    const float* v = values.data() + p.offset;
    auto add = [&](std::string name, std::vector<int64_t> shape, const float* src, int64_t n) {
      HfTensor t{std::move(name), p.name, std::move(shape), std::vector<float>(src, src + n), {}};
      if (t.shape.size() == 2) t.source_rows = identity_rows(t.shape[0]);
      out.push_back(std::move(t));
    };
    const std::vector<int64_t> mat = {p.rows, p.cols};
    const std::vector<int64_t> vec = {p.size};
    if (p.name == "embeddings") {
      add(llama ? "model.embed_tokens.weight" : "backbone.embeddings.weight", mat, v, p.size);
      continue;
    }
    if (p.name == "norm_f") {
      add(llama ? "model.norm.weight" : "backbone.norm_f.weight", vec, v, p.size);
      continue;
    }
    if (p.name == "lm_head") {
      add("lm_head.weight", mat, v, p.size);
      continue;
    }
    const int L = p.block;
    const std::string pre = "layers." + std::to_string(L) + ".";
    if (L < 0 || L >= int(pattern.size()) || p.name.rfind(pre, 0) != 0)
      throw std::invalid_argument("hf_tensors: unknown parameter " + p.name);
    const std::string rest = p.name.substr(pre.size());
    const nn::MixerKind& kind = nn::mixer_kind(pattern[L]);
    if (llama && kind.hf_llama_module.empty())
      throw std::invalid_argument("hf_tensors: " + kind.name + " blocks have no Llama layout");
    const std::string hpre = llama ? "model.layers." + std::to_string(L / 2) + "."
                                   : "backbone.layers." + std::to_string(L) + ".";
    if (rest == "norm") {
      add(hpre + (llama ? kind.hf_llama_norm : "norm.weight"), vec, v, p.size);
      continue;
    }
    if (rest.rfind("mixer.", 0) != 0) throw std::invalid_argument("hf_tensors: unknown parameter " + p.name);
    const std::string mix = hpre + (llama ? kind.hf_llama_module : "mixer.");
    std::vector<nn::HfPiece> pieces;
    if (kind.hf) pieces = kind.hf(rest.substr(6), v, p.rows, p.cols, cfg);
    if (pieces.empty())
      throw std::invalid_argument("hf_tensors: unknown " + kind.name + " parameter " + p.name);
    const size_t first = out.size();
    for (nn::HfPiece& piece : pieces)
      out.push_back(HfTensor{mix + piece.name, p.name, std::move(piece.shape), std::move(piece.data), {}});
    trace_source_rows(kind, rest.substr(6), p, cfg, out, first);
  }
  return out;
}

json hf_config(const ModelConfig& cfg, int seq_len, const std::vector<HfTensor>& tensors) {
  const bool llama = hf_llama_layout(cfg);
  const bool swiglu = cfg.mlp == "swiglu";
  // Floats as the double they are (JSON numbers round-trip doubles exactly).
  auto f = [](float x) { return double(x); };
  json j;
  if (llama) {
    j["architectures"] = {"LlamaForCausalLM"};
    j["model_type"] = "llama";
    j["num_hidden_layers"] = cfg.n_blocks() / 2;
    j["hidden_act"] = swiglu ? "silu" : "relu2";
    j["rms_norm_eps"] = f(cfg.norm_eps);
    j["rope_theta"] = f(cfg.rope_theta);
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
  } else {
    j["architectures"] = {"NemotronHForCausalLM"};
    j["model_type"] = "nemotron_h";
    j["num_hidden_layers"] = cfg.n_blocks();
    j["hybrid_override_pattern"] = cfg.block_pattern();
    j["attention_head_dim"] = cfg.attn_head_dim();
    j["mlp_hidden_act"] = swiglu ? "swiglu" : "relu2";
    j["layer_norm_epsilon"] = f(cfg.norm_eps);
    j["mamba_num_heads"] = cfg.mamba_num_heads;
    j["mamba_head_dim"] = cfg.mamba_head_dim;
    j["n_groups"] = cfg.mamba_n_groups;
    j["ssm_state_size"] = cfg.mamba_state_size;
    j["conv_kernel"] = cfg.mamba_conv_kernel;
    j["chunk_size"] = cfg.mamba_chunk_size;
    if (cfg.mamba_num_heads > 0 && cfg.mamba_d_inner() % cfg.d_model == 0)
      j["expand"] = cfg.mamba_d_inner() / cfg.d_model;
    j["mamba_hidden_act"] = "silu";
    j["time_step_min"] = f(cfg.mamba_dt_min);
    j["time_step_max"] = f(cfg.mamba_dt_max);
    j["time_step_floor"] = f(cfg.mamba_dt_init_floor);
    // The clamp of Δ after softplus: fp4train applies none. nvidia's configs say
    // [0.0, Infinity], Python's json spelling of an infinite bound, which is not JSON
    // (RFC 8259 has no non-finite numbers; nlohmann would write null). The upper bound here is
    // FLT_MAX, the largest finite FP32, which clamps no finite FP32 Δ (and rounds to +inf in
    // BF16): the same no-clamp in valid JSON. docs/export.md "config.json: two keys of the
    // Nemotron-H layout".
    j["time_step_limit"] = {0.0, double(std::numeric_limits<float>::max())};
    j["use_conv_bias"] = true;
    j["use_bias"] = false;
    j["mamba_proj_bias"] = false;
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
    // As nvidia's Nemotron-H configs. fp4train's residual stream is FP32, and so is HF's for
    // this FP32 export (torch_dtype float32) whatever this flag says.
    j["residual_in_fp32"] = false;
  }
  j["vocab_size"] = cfg.vocab_size;
  j["hidden_size"] = cfg.d_model;
  j["intermediate_size"] = cfg.mlp_hidden;
  j["num_attention_heads"] = cfg.n_heads;
  j["num_key_value_heads"] = cfg.kv_heads();
  j["head_dim"] = cfg.attn_head_dim();
  j["max_position_embeddings"] = seq_len;
  j["initializer_range"] = f(cfg.init_std);
  j["tie_word_embeddings"] = false;
  j["bos_token_id"] = 1;
  j["eos_token_id"] = 2;
  j["torch_dtype"] = "float32";
  json names = json::object();
  for (const HfTensor& t : tensors) names[t.name] = t.source;
  j["fp4train"] = {{"format", "fp4train.hf_export.v1"},
                   {"layout", llama ? "llama" : "nemotron_h"},
                   {"pattern", cfg.block_pattern()},
                   {"mlp", cfg.mlp},
                   {"mlp_gated", swiglu},
                   {"rope", cfg.rope},
                   {"rope_theta", f(cfg.rope_theta)},
                   {"rope_pairs", "halves"},
                   {"norm_eps", f(cfg.norm_eps)},
                   {"names", names}};
  return j;
}

bool is_nvfp4_spec(const BlockQuantSpec& s) {
  return s.element.is_e2m1() && s.scale_format == ScaleFormat::E4M3 && s.scale_desc == nullptr &&
         s.scale_rule == ScaleRule::TensorScaled && s.block == 16;
}

const char* nvfp4_convention_name(Nvfp4Convention c) {
  return c == Nvfp4Convention::CompressedTensors ? "compressed-tensors" : "modelopt";
}

HfNvfp4 pack_hf_nvfp4(const QuantizedTensor& q, const std::vector<int64_t>& source_rows,
                      const std::string& what) {
  const BlockQuantSpec& s = q.spec;
  if (!is_nvfp4_spec(s))
    throw UserError(what + ": its weights are quantized as " + spec_scale_format(s).name +
                    " block " + std::to_string(s.block) + (s.two_d ? " tiles" : "") +
                    ", not as NVFP4 (E2M1, E4M3 scales, tensor-scaled, blocks of 16)");
  if (q.cols % 16 != 0)
    throw UserError(what + ": inner dimension " + std::to_string(q.cols) +
                    " is not a multiple of 16, NVFP4's block");
  HfNvfp4 out;
  out.rows = static_cast<int64_t>(source_rows.size());
  out.cols = q.cols;
  out.weight.resize(static_cast<size_t>(out.rows * q.cols / 2));
  out.weight_scale.resize(static_cast<size_t>(out.rows * q.cols / 16));
  for (int64_t j = 0; j < out.rows; ++j) {
    const int64_t r = source_rows[j];
    if (r < 0 || r >= q.rows) throw std::invalid_argument("pack_hf_nvfp4: source row outside the weight");
    const uint8_t* c = q.codes.data() + r * q.cols;
    uint8_t* w = out.weight.data() + j * q.cols / 2;
    for (int64_t i = 0; i < q.cols / 2; ++i)  // the even column in the low nibble
      w[i] = static_cast<uint8_t>((c[2 * i] & 0xF) | (c[2 * i + 1] & 0xF) << 4);
    const int64_t br = s.two_d ? r / s.block : r;  // the block row of element row r
    for (int64_t b = 0; b < q.cols / 16; ++b)
      out.weight_scale[static_cast<size_t>(j * (q.cols / 16) + b)] =
          q.scale_codes[static_cast<size_t>(br * q.block_cols + b)];
  }
  return out;
}

}  // namespace fp4
