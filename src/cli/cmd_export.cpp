// `fp4train export --checkpoint PATH --out DIR [--format hf|gguf]`: a checkpoint's model as a
// Hugging Face style directory (model.safetensors with FP32 weights under HF transformers'
// names, hf_layout.h; config.json; the run's tokenizer.model), or as one GGUF file for
// llama.cpp (DIR/model.gguf: gguf_layout.h, with the run's SentencePiece vocabulary). The
// maps of names are in docs/export.md; python/fp4train/torch/models.py loads the HF directory.
#include <cstdio>
#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "fp4/train/checkpoint.h"
#include "fp4/base/error.h"
#include "fp4/nn/model.h"
#include "fp4/base/safetensors.h"
#include "fp4/nn/hf_layout.h"
#include "fp4/base/gguf.h"
#include "fp4/data/data.h"
#include "fp4/nn/gguf_layout.h"
#include "fp4/numerics/block_quant.h"
#include "fp4/recipe/recipe.h"

namespace fp4::cli {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
struct ExportArgs {
  std::string checkpoint;
  std::string out;
  std::string format = "hf";
  std::string weights = "f32";  // gguf: f32, mxfp4 or nvfp4 for the FP4 linears
  bool requantize = false;      // gguf nvfp4: re-quantize weights that are not NVFP4
};

// A checkpoint with its run config, recipe and the model's parameter table.
struct Exported {
  fs::path file;  // the checkpoint file
  fs::path run_dir;
  Checkpoint ck;
  RunConfig cfg;
  Recipe recipe;
  std::vector<nn::ParamInfo> infos;
  std::map<std::string, LinearPlan> plans;  // by linear name ("layers.0.mixer.q_proj")
};

Exported load_exported(const std::string& checkpoint) {
  const fs::path arg(checkpoint);
  if (!fs::exists(arg)) throw UserError("checkpoint " + arg.string() + " does not exist");
  std::string warn;
  const fs::path file = resolve_checkpoint(arg, &warn);
  if (!warn.empty()) std::fprintf(stderr, "note: %s\n", warn.c_str());
  const Checkpoint ck = load_checkpoint(file);
  const RunConfig cfg = run_config_from_text(ck.config_toml, file.string() + " (config)");
  const Recipe recipe = recipe_from_text(ck.recipe_toml, file.string() + " (recipe)");
  // A model of one token only for its parameter table (names, shapes, offsets).
  const nn::Model model(cfg.model, recipe, 1, 1);
  if (static_cast<int64_t>(ck.params.size()) != model.num_params())
    throw UserError("checkpoint " + file.string() + " holds " + std::to_string(ck.params.size()) +
                    " parameters but the model of its config has " +
                    std::to_string(model.num_params()));
  fs::path run_dir = fs::is_directory(arg) ? arg : file.parent_path();
  if (run_dir.filename() == "checkpoints") run_dir = run_dir.parent_path();
  std::map<std::string, LinearPlan> plans;
  for (size_t i = 0; i < model.linears().size(); ++i)
    plans.emplace(model.linear_name(i), model.resolved_linears().plans[i]);
  return {file, run_dir, ck, cfg, recipe, model.param_infos(), std::move(plans)};
}

// --out as a directory, created.
fs::path out_directory(const std::string& out_arg) {
  const fs::path out(out_arg);
  std::error_code ec;
  if (fs::exists(out) && !fs::is_directory(out))
    throw UserError("--out " + out.string() + " exists and is not a directory");
  fs::create_directories(out, ec);
  if (ec) throw UserError("cannot create --out directory " + out.string() + ": " + ec.message());
  return out;
}

void export_hf(const Exported& e, const fs::path& out) {
  const Checkpoint& ck = e.ck;
  const RunConfig& cfg = e.cfg;
  const fs::path& file = e.file;
  const std::vector<HfTensor> tensors = hf_tensors(cfg.model, e.infos, ck.params);
  std::error_code ec;

  std::vector<safetensors::TensorOut> outs;
  for (const HfTensor& t : tensors)
    outs.push_back({t.name, "F32", t.shape, t.data.data(), t.data.size() * sizeof(float)});
  // "format": "pt" is what HF transformers expects of a PyTorch safetensors file.
  const json meta = {{"format", "pt"},
                     {"fp4train_checkpoint", file.string()},
                     {"fp4train_step", std::to_string(ck.step)}};
  safetensors::write_file(out / "model.safetensors", safetensors::make_header(outs, meta), outs);

  json conf = hf_config(cfg.model, cfg.train.seq_len, tensors);
  conf["fp4train"]["checkpoint"] = file.string();
  conf["fp4train"]["step"] = ck.step;
  conf["fp4train"]["recipe"] = e.recipe.name;
  conf["fp4train"]["config_toml"] = ck.config_toml;
  write_file_atomic(out / "config.json", conf.dump(2) + "\n");

  const fs::path tok = e.run_dir / "tokenizer.model";
  const bool copied = fs::exists(tok);
  if (copied) {
    fs::copy_file(tok, out / "tokenizer.model", fs::copy_options::overwrite_existing, ec);
    if (ec) throw UserError("cannot copy " + tok.string() + " to " + out.string() + ": " + ec.message());
  }
  std::printf("exported %s (step %lld, %s layout, %zu tensors, %lld parameters) to %s: "
              "model.safetensors, config.json%s\n",
              file.string().c_str(), static_cast<long long>(ck.step),
              hf_llama_layout(cfg.model) ? "Llama" : "Nemotron-H", tensors.size(),
              static_cast<long long>(ck.params.size()), out.string().c_str(),
              copied ? ", tokenizer.model" : "");
}

// The run's SentencePiece vocabulary as llama.cpp's "llama" (SentencePiece) tokenizer; without
// a tokenizer.model, vocabulary type "none" (llama.cpp then evaluates token ids only).
bool add_gguf_tokenizer(gguf::Writer& w, const fs::path& tokenizer_model) {
  using gguf::ValueType;
  if (!fs::exists(tokenizer_model)) {
    w.add("tokenizer.ggml.model", ValueType::String, "none");
    return false;
  }
  const Tokenizer tok(tokenizer_model);
  json pieces = json::array(), scores = json::array(), types = json::array();
  for (const Tokenizer::Piece& p : tok.vocabulary()) {
    pieces.push_back(p.piece);
    scores.push_back(p.score);
    types.push_back(p.type);
  }
  w.add("tokenizer.ggml.model", ValueType::String, "llama");
  w.add("tokenizer.ggml.pre", ValueType::String, "default");
  w.add_array("tokenizer.ggml.tokens", ValueType::String, pieces);
  w.add_array("tokenizer.ggml.scores", ValueType::F32, scores);
  w.add_array("tokenizer.ggml.token_type", ValueType::I32, types);
  w.add("tokenizer.ggml.unknown_token_id", ValueType::U32, kTokenUnk);
  w.add("tokenizer.ggml.bos_token_id", ValueType::U32, kTokenBos);
  w.add("tokenizer.ggml.eos_token_id", ValueType::U32, kTokenEos);
  // fp4train's token streams have no BOS: documents are separated by EOS (docs/data.md).
  w.add("tokenizer.ggml.add_bos_token", ValueType::Bool, false);
  w.add("tokenizer.ggml.add_eos_token", ValueType::Bool, false);
  return true;
}

// The weight spec an FP4 linear's GGUF tensor is quantized with: its fprop W spec, or with
// --requantize the NVFP4 one (E4M3 block scales, blocks or tiles of 16, T = 448, RNE).
BlockQuantSpec gguf_weight_spec(const LinearPlan& plan, const ExportArgs& a, const Recipe& r) {
  BlockQuantSpec s = plan.spec(Gemm::Fprop, Operand::W);
  const bool nvfp4 = s.scale_format == ScaleFormat::E4M3 && s.block == 16 &&
                     s.scale_rule == ScaleRule::TensorScaled && s.scale_desc == nullptr;
  if (a.weights == "nvfp4" && !nvfp4 && !a.requantize)
    throw UserError("--weights nvfp4: recipe " + r.name + " quantizes its weights with " +
                    scale_format_name(s.scale_format) + " block scales over blocks of " +
                    std::to_string(s.block) + ", not NVFP4's E4M3 over 16; --requantize writes "
                    "them re-quantized to NVFP4 (docs/export.md \"FP4 weights in GGUF\")");
  if (a.weights == "nvfp4" && a.requantize) {
    s.scale_format = ScaleFormat::E4M3, s.scale_desc = nullptr, s.block = 16, s.target = 448.f;
    s.scale_rule = ScaleRule::TensorScaled, s.rounding = Rounding::RNE;
  }
  return s;
}

// The GGUF file of `e` in memory: every check made before anything is written.
struct GgufExport {
  gguf::Writer w;
  int fp4 = 0, f32 = 0;
  bool vocab = false;
};

GgufExport build_gguf(const Exported& e, const ExportArgs& a) {
  const std::string arch = gguf_architecture(e.cfg.model);
  const auto type = a.weights == "mxfp4" ? gguf::TensorType::MXFP4 : gguf::TensorType::NVFP4;
  if (a.weights == "nvfp4" && arch == "arcee")
    throw UserError("--weights nvfp4: llama.cpp's arcee graph (squared-ReLU MLP; v0.4.0) does "
                    "not apply the FFN's .scale tensors, so NVFP4 needs a SwiGLU (llama) or "
                    "hybrid (nemotron_h) model; MXFP4 has no tensor scale and works");
  if (a.requantize && a.weights != "nvfp4") throw UserError("--requantize goes with --weights nvfp4");
  GgufExport g;
  add_gguf_metadata(g.w, e.cfg.model, e.cfg.train.seq_len,
                    e.recipe.name + " step " + std::to_string(e.ck.step), a.weights == "f32");
  g.vocab = add_gguf_tokenizer(g.w, e.run_dir / "tokenizer.model");
  g.w.add("fp4train.checkpoint", gguf::ValueType::String, e.file.string());
  g.w.add("fp4train.step", gguf::ValueType::U64, e.ck.step);
  g.w.add("fp4train.recipe", gguf::ValueType::String, e.recipe.name);
  g.w.add("fp4train.weights", gguf::ValueType::String, a.weights + (a.requantize ? " (re-quantized)" : ""));
  std::map<std::string, QuantizedTensor> quantized;  // by source: one quantization per linear
  for (const GgufTensor& t : gguf_tensors(e.cfg.model, e.infos, e.ck.params)) {
    auto plan = e.plans.find(t.source);
    if (a.weights == "f32" || plan == e.plans.end() || plan->second.mode != LinearMode::FP4) {
      g.w.add_f32(t.name, t.ne, t.data.data()), ++g.f32;
      continue;
    }
    auto q = quantized.find(t.source);
    if (q == quantized.end()) {
      const nn::ParamInfo& p = *std::find_if(e.infos.begin(), e.infos.end(),
                                             [&](const nn::ParamInfo& i) { return i.name == t.source; });
      const float* W = e.ck.params.data() + p.offset;
      const BlockQuantSpec spec = gguf_weight_spec(plan->second, a, e.recipe);
      q = quantized.emplace(t.source, quantize_blocks(W, p.rows, p.cols, spec,
                                                      tensor_amax(W, p.size), nullptr)).first;
    }
    g.w.add_tensor(t.name, t.ne, type,
                   pack_gguf_fp4(q->second, t.source_row0, t.ne[1], type,
                                 "--weights " + a.weights + ", " + t.source));
    if (type == gguf::TensorType::NVFP4) {  // the tensor decode scale, applied to the output
      const std::string base = t.name.substr(0, t.name.size() - std::string(".weight").size());
      g.w.add_f32(base + ".scale", {1}, &q->second.gd);
    }
    ++g.fp4;
  }
  return g;
}

void run_export(const ExportArgs& a) {
  const Exported e = load_exported(a.checkpoint);
  if (a.format != "gguf" && (a.weights != "f32" || a.requantize))
    throw UserError("--weights and --requantize go with --format gguf");
  if (a.format == "hf") return export_hf(e, out_directory(a.out));
  const GgufExport g = build_gguf(e, a);  // refuses before --out is created
  const fs::path file = out_directory(a.out) / "model.gguf";
  g.w.write(file);
  std::printf("exported %s (step %lld, llama.cpp architecture %s; %d tensors %s, %d F32%s) to %s\n",
              e.file.string().c_str(), static_cast<long long>(e.ck.step),
              gguf_architecture(e.cfg.model).c_str(), g.fp4,
              a.weights == "mxfp4" ? "MXFP4" : a.requantize ? "NVFP4 (re-quantized)" : "NVFP4",
              g.f32, g.vocab ? ", SentencePiece vocabulary" : ", no vocabulary (no tokenizer.model)",
              file.string().c_str());
}
}  // namespace

void register_export(CLI::App& app) {
  auto a = std::make_shared<ExportArgs>();
  auto* c = app.add_subcommand(
      "export",
      "Write a checkpoint's model as a Hugging Face style directory: model.safetensors (FP32,\n"
      "HF transformers parameter names), config.json (HF keys plus an \"fp4train\" object) and\n"
      "the run's tokenizer.model. A Llama-style pattern (*- repeated) gets LlamaForCausalLM\n"
      "names, any other pattern NemotronHForCausalLM names:\n"
      "  embeddings            model.embed_tokens.weight | backbone.embeddings.weight\n"
      "  layers.2i.norm        model.layers.i.input_layernorm.weight\n"
      "  layers.2i.mixer.q_proj  model.layers.i.self_attn.q_proj.weight (k, v, o likewise)\n"
      "  layers.2i+1.norm      model.layers.i.post_attention_layernorm.weight\n"
      "  layers.2i+1.mixer.up_proj  mlp.gate_proj.weight + mlp.up_proj.weight (SwiGLU: first /\n"
      "                        second half of the rows) or mlp.up_proj.weight (squared ReLU)\n"
      "  layers.N.norm         backbone.layers.N.norm.weight (Nemotron-H)\n"
      "  layers.N.mixer.X      backbone.layers.N.mixer.X.weight; conv1d -> conv1d.weight\n"
      "                        [C, 1, W], conv1d_bias -> conv1d.bias, A_log, D, dt_bias,\n"
      "                        norm -> norm.weight\n"
      "  norm_f                model.norm.weight | backbone.norm_f.weight\n"
      "  lm_head               lm_head.weight\n"
      "With RoPE the q_proj and k_proj rows are permuted within each head from fp4train's\n"
      "interleaved pairs to HF's rotate-half pairs. Full table: docs/export.md.");
  c->add_option("--checkpoint", a->checkpoint,
                "Checkpoint: a .safetensors file, or a run directory (its newest good checkpoint)")
      ->required();
  c->add_option("--out", a->out, "Output directory (created; existing files are replaced)")
      ->required();
  c->add_option("--format", a->format,
                "hf: the Hugging Face directory above; gguf: DIR/model.gguf for llama.cpp "
                "(Llama-style configs with RoPE: architecture llama for SwiGLU, arcee for "
                "squared ReLU; the hybrid without RoPE: nemotron_h; F32 weights; the run's "
                "SentencePiece vocabulary; docs/export.md \"GGUF for llama.cpp\")")
      ->capture_default_str()
      ->check(CLI::IsMember({"hf", "gguf"}));
  c->add_option("--weights", a->weights,
                "gguf: how the FP4 linears' weights are written: f32 (the FP32 master weights), "
                "mxfp4 (an MXFP4 run's weights exactly as its forward quantizes them: E2M1 codes "
                "and E8M0 scales), nvfp4 (an NVFP4 run's: E2M1, E4M3 scales of 16 values, the "
                "FP32 tensor scale as <name>.scale); other linears (BF16, FP32, the LM head) "
                "stay F32. Score the export in fp4train with eval --policy llama-q8_0 "
                "(docs/export.md \"FP4 weights in GGUF\")")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "mxfp4", "nvfp4"}));
  c->add_flag("--requantize", a->requantize,
              "With --weights nvfp4: re-quantize weights trained with other block scales (e.g. "
              "UE5M3) to NVFP4 (E4M3 scales over 16, T = 448); without it such a run is refused");
  c->callback([a] { run_export(*a); });
}

}  // namespace fp4::cli
