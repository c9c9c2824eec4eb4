// `fp4train export --checkpoint PATH --out DIR [--format hf|gguf|nvfp4-safetensors]`: a
// checkpoint's model as a Hugging Face style directory (model.safetensors with FP32 weights
// under HF transformers' names, hf_layout.h; config.json; the run's tokenizer.model), as that
// directory with the FP4 linears packed as NVFP4 for vLLM / TensorRT-LLM (ModelOpt's or
// compressed-tensors' convention), or as one GGUF file for llama.cpp (DIR/model.gguf:
// gguf_layout.h, with the run's SentencePiece vocabulary). The maps of names are in
// docs/export.md; python/fp4train/torch/models.py loads the HF directory.
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
#include "fp4/eval/eval.h"
#include "fp4/study/evaluate.h"
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
  bool requantize = false;      // gguf nvfp4, nvfp4-safetensors: re-quantize weights that are not NVFP4
  std::string convention = "modelopt";  // nvfp4-safetensors: modelopt or compressed-tensors
  std::string input_scale = "auto";     // nvfp4-safetensors: auto, held or calibrated
  int calib_batches = 4;                // nvfp4-safetensors: batches of the calibration
  bool calib_given = false;             // --calib-batches was given
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

// config.json (hf_config, an "fp4train" object, and `quantization_config` unless null) and
// the run's tokenizer.model, beside a model.safetensors of `tensors`' names. Returns whether
// the tokenizer was copied.
bool write_hf_sidecars(const Exported& e, const fs::path& out, const std::vector<HfTensor>& tensors,
                       const json& quantization_config) {
  json conf = hf_config(e.cfg.model, e.cfg.train.seq_len, tensors);
  conf["fp4train"]["checkpoint"] = e.file.string();
  conf["fp4train"]["step"] = e.ck.step;
  conf["fp4train"]["recipe"] = e.recipe.name;
  conf["fp4train"]["config_toml"] = e.ck.config_toml;
  if (!quantization_config.is_null()) conf["quantization_config"] = quantization_config;
  write_file_atomic(out / "config.json", conf.dump(2) + "\n");
  const fs::path tok = e.run_dir / "tokenizer.model";
  if (!fs::exists(tok)) return false;
  std::error_code ec;
  fs::copy_file(tok, out / "tokenizer.model", fs::copy_options::overwrite_existing, ec);
  if (ec) throw UserError("cannot copy " + tok.string() + " to " + out.string() + ": " + ec.message());
  return true;
}

void export_hf(const Exported& e, const fs::path& out) {
  const Checkpoint& ck = e.ck;
  const std::vector<HfTensor> tensors = hf_tensors(e.cfg.model, e.infos, ck.params);
  std::vector<safetensors::TensorOut> outs;
  for (const HfTensor& t : tensors)
    outs.push_back({t.name, "F32", t.shape, t.data.data(), t.data.size() * sizeof(float)});
  // "format": "pt" is what HF transformers expects of a PyTorch safetensors file.
  const json meta = {{"format", "pt"},
                     {"fp4train_checkpoint", e.file.string()},
                     {"fp4train_step", std::to_string(ck.step)}};
  safetensors::write_file(out / "model.safetensors", safetensors::make_header(outs, meta), outs);
  std::error_code ec;
  fs::remove(out / "hf_quant_config.json", ec);  // an earlier NVFP4 export's, now stale
  const bool copied = write_hf_sidecars(e, out, tensors, json());
  std::printf("exported %s (step %lld, %s layout, %zu tensors, %lld parameters) to %s: "
              "model.safetensors, config.json%s\n",
              e.file.string().c_str(), static_cast<long long>(ck.step),
              hf_llama_layout(e.cfg.model) ? "Llama" : "Nemotron-H", tensors.size(),
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

// The NVFP4 spec an export re-quantizes to (--requantize): `s` with E4M3 block scales over
// blocks (or tiles) of 16, T = 448, the tensor-scaled rule and RNE.
BlockQuantSpec nvfp4_requantized(BlockQuantSpec s) {
  s.scale_format = ScaleFormat::E4M3, s.scale_desc = nullptr, s.block = 16, s.target = 448.f;
  s.scale_rule = ScaleRule::TensorScaled, s.rounding = Rounding::RNE;
  return s;
}

// The weight spec an FP4 linear is exported with: its fprop W spec, or with --requantize the
// NVFP4 one. `option` names what asked for NVFP4 ("--weights nvfp4", "--format
// nvfp4-safetensors") in the refusal of a run whose weights are not NVFP4.
BlockQuantSpec export_weight_spec(const LinearPlan& plan, const ExportArgs& a, const Recipe& r,
                                  bool nvfp4_wanted, const std::string& option) {
  const BlockQuantSpec s = plan.spec(Gemm::Fprop, Operand::W);
  if (!nvfp4_wanted) return s;
  if (a.requantize) return nvfp4_requantized(s);
  if (plan.quartet_forward())  // trained with Quartet II's quantizer, not the block quantizer
    throw UserError(option + ": recipe " + r.name + " quantizes its weights with Quartet II's "
                    "forward quantizer (scale maximum 447.99, its own operation order), which "
                    "NVFP4's block quantizer reproduces only to the last bit of its scales; "
                    "--requantize writes them re-quantized to NVFP4 (docs/recipes.md \"Quartet "
                    "II's quantizers\")");
  if (!is_nvfp4_spec(s))
    throw UserError(option + ": recipe " + r.name + " quantizes its weights with " +
                    spec_scale_format(s).name + " block scales over blocks of " +
                    std::to_string(s.block) + ", not NVFP4's E4M3 over 16; --requantize writes "
                    "them re-quantized to NVFP4 (docs/export.md \"" +
                    (option == "--weights nvfp4" ? "FP4 weights in GGUF"
                                                 : "NVFP4 safetensors for vLLM and TensorRT-LLM") +
                    "\")");
  return s;
}

// The FP4 weight of linear `source` (a parameter name), quantized once per export.
const QuantizedTensor& quantized_weight(std::map<std::string, QuantizedTensor>& cache,
                                        const Exported& e, const std::string& source,
                                        const BlockQuantSpec& spec) {
  auto q = cache.find(source);
  if (q != cache.end()) return q->second;
  const nn::ParamInfo& p = *std::find_if(e.infos.begin(), e.infos.end(),
                                         [&](const nn::ParamInfo& i) { return i.name == source; });
  const float* W = e.ck.params.data() + p.offset;
  return cache.emplace(source, quantize_blocks(W, p.rows, p.cols, spec, tensor_amax(W, p.size), nullptr))
      .first->second;
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
    const QuantizedTensor& q = quantized_weight(
        quantized, e, t.source,
        export_weight_spec(plan->second, a, e.recipe, a.weights == "nvfp4", "--weights nvfp4"));
    g.w.add_tensor(t.name, t.ne, type,
                   pack_gguf_fp4(q, t.source_row0, t.ne[1], type, "--weights " + a.weights + ", " + t.source));
    if (type == gguf::TensorType::NVFP4) {  // the tensor decode scale, applied to the output
      const std::string base = t.name.substr(0, t.name.size() - std::string(".weight").size());
      g.w.add_f32(base + ".scale", {1}, &q.gd);
    }
    ++g.fp4;
  }
  return g;
}

// ------------------------------------------------------------------ NVFP4 safetensors

// The fprop activation reference g_x of every FP4 linear, for its input scale: the checkpoint's
// held reference (recipes with D > 1 keep one per linear), or the `calibrated` policy's on the
// run's training text (--calib-batches), as --input-scale says (auto: held when every FP4
// linear has one, else calibrated).
struct InputReferences {
  std::map<std::string, float> g;  // by linear name
  std::string source;              // "held reference of step N" or "calibration on T tokens (B batches)"
};

InputReferences input_references(const Exported& e, const ExportArgs& a) {
  InputReferences r;
  for (const HeldReference& h : e.ck.references)  // role 0: fprop X (fp4::nn::Role::X)
    if (h.role == 0 && h.has_value) r.g[h.linear] = h.held;
  bool all_held = true;
  for (const auto& [name, plan] : e.plans)
    if (plan.mode == LinearMode::FP4 && !r.g.count(name)) all_held = false;
  if (a.input_scale == "held" && !all_held)
    throw UserError("--input-scale held: checkpoint " + e.file.string() + " holds no activation "
                    "reference for some FP4 linear (recipe " + e.recipe.name + " measures X afresh "
                    "at every call, D = 1); use --input-scale calibrated");
  if (a.input_scale != "calibrated" && all_held) {
    r.source = "held reference of step " + std::to_string(e.ck.step);
    return r;
  }
  EvalSourceSpec spec;
  spec.checkpoint = e.file.string();
  const EvalSource src = load_eval_source(spec);
  const TokenData data = load_eval_data(src, spec, /*quiet=*/true);
  const int seq_len = src.cfg.train.seq_len, batch = src.cfg.train.micro();
  const EvalWindows calib = calibration_windows(data.train, seq_len, batch, a.calib_batches);
  auto model = build_eval_model(src, batch);
  const std::vector<float> amax = calibrated_activation_amax(*model, calib, seq_len, batch);
  r.g.clear();
  for (size_t i = 0; i < amax.size(); ++i) r.g[model->linear_name(i)] = amax[i];
  const size_t batches = (calib.starts.size() + size_t(batch) - 1) / size_t(batch);
  r.source = "calibration on " + std::to_string(calib.starts.size() * size_t(seq_len)) +
             " training tokens (" + std::to_string(batches) + " batches)";
  return r;
}

// The tensor scales (ge, gd) the quantizer takes from reference g under `spec` (one home: the
// quantizer itself, on a zero row).
std::pair<float, float> tensor_scales_of(BlockQuantSpec spec, float g) {
  spec.rounding = Rounding::RNE;
  const std::vector<float> zero(static_cast<size_t>(spec.block), 0.0f);
  const QuantizedTensor q = quantize_blocks(zero.data(), 1, spec.block, spec, g, nullptr);
  return {q.ge, q.gd};
}

// The NVFP4 tensors of the HF layout: every FP4 linear packed (HfNvfp4) with its two tensor
// scales in `conv`'s names, every other tensor F32. Owns the bytes the TensorOuts point to.
struct Nvfp4Tensors {
  std::vector<safetensors::TensorOut> outs;
  std::vector<std::unique_ptr<HfNvfp4>> packed;
  std::vector<std::unique_ptr<float>> scalars;
  std::vector<std::string> excluded;  // HF modules of linears that stay high precision
  int fp4 = 0;
};

Nvfp4Tensors nvfp4_tensors(const Exported& e, const ExportArgs& a, const std::vector<HfTensor>& tensors,
                           const InputReferences& refs, Nvfp4Convention conv) {
  const bool ct = conv == Nvfp4Convention::CompressedTensors;
  Nvfp4Tensors n;
  std::map<std::string, QuantizedTensor> quantized;  // by source: one quantization per linear
  auto scalar = [&](const std::string& name, float v) {
    n.scalars.push_back(std::make_unique<float>(v));
    n.outs.push_back({name, "F32", ct ? std::vector<int64_t>{1} : std::vector<int64_t>{},
                      n.scalars.back().get(), 4});
  };
  for (const HfTensor& t : tensors) {
    const auto plan = e.plans.find(t.source);
    const bool weight = t.name.size() > 7 && t.name.ends_with(".weight");
    const std::string base = weight ? t.name.substr(0, t.name.size() - 7) : t.name;
    if (plan == e.plans.end() || plan->second.mode != LinearMode::FP4 || !weight) {
      n.outs.push_back({t.name, "F32", t.shape, t.data.data(), t.data.size() * sizeof(float)});
      if (plan != e.plans.end() || t.source == "lm_head") n.excluded.push_back(base);
      continue;
    }
    const std::string what = "--format nvfp4-safetensors, " + t.source;
    const QuantizedTensor& q = quantized_weight(
        quantized, e, t.source, export_weight_spec(plan->second, a, e.recipe, true, "--format nvfp4-safetensors"));
    n.packed.push_back(std::make_unique<HfNvfp4>(pack_hf_nvfp4(q, t.source_rows, what)));
    const HfNvfp4& w = *n.packed.back();
    n.outs.push_back({base + (ct ? ".weight_packed" : ".weight"), "U8", {w.rows, w.cols / 2},
                      w.weight.data(), w.weight.size()});
    n.outs.push_back({base + ".weight_scale", "F8_E4M3", {w.rows, w.cols / 16}, w.weight_scale.data(),
                      w.weight_scale.size()});
    BlockQuantSpec sx = plan->second.spec(Gemm::Fprop, Operand::X);
    if (a.requantize) sx = nvfp4_requantized(sx);
    const auto [ge_x, gd_x] = tensor_scales_of(sx, refs.g.at(t.source));
    scalar(base + (ct ? ".weight_global_scale" : ".weight_scale_2"), ct ? q.ge : q.gd);
    scalar(base + (ct ? ".input_global_scale" : ".input_scale"), ct ? ge_x : gd_x);
    ++n.fp4;
  }
  return n;
}

// The quantization description: hf_quant_config.json's "quantization" object (ModelOpt) or
// config.json's "quantization_config" (compressed-tensors).
json nvfp4_quant_config(Nvfp4Convention conv, const std::vector<std::string>& excluded) {
  if (conv == Nvfp4Convention::ModelOpt)
    return {{"quant_algo", "NVFP4"}, {"kv_cache_quant_algo", nullptr}, {"group_size", 16},
            {"exclude_modules", excluded}};
  const json fp4 = {{"num_bits", 4}, {"type", "float"}, {"symmetric", true},
                    {"strategy", "tensor_group"}, {"group_size", 16}};
  json act = fp4;
  act["dynamic"] = "local";
  json wt = fp4;
  wt["dynamic"] = false;
  return {{"quant_method", "compressed-tensors"}, {"format", "nvfp4-pack-quantized"},
          {"quantization_status", "compressed"},
          {"config_groups", {{"group_0", {{"targets", {"Linear"}}, {"weights", wt}, {"input_activations", act}}}}},
          {"ignore", excluded}};
}

void export_nvfp4(const Exported& e, const ExportArgs& a) {
  const Nvfp4Convention conv = a.convention == "compressed-tensors" ? Nvfp4Convention::CompressedTensors
                                                                    : Nvfp4Convention::ModelOpt;
  bool any_fp4 = false;
  for (const auto& [name, plan] : e.plans) any_fp4 = any_fp4 || plan.mode == LinearMode::FP4;
  if (!any_fp4)
    throw UserError("--format nvfp4-safetensors: recipe " + e.recipe.name + " has no FP4 linear; "
                    "--format hf exports its FP32 weights");
  // Stages: the layout (HF names, rows traced), the activation references, the tensors, the files.
  const std::vector<HfTensor> tensors = hf_tensors(e.cfg.model, e.infos, e.ck.params);
  const InputReferences refs = input_references(e, a);
  const Nvfp4Tensors n = nvfp4_tensors(e, a, tensors, refs, conv);  // every refusal before --out
  const fs::path out = out_directory(a.out);
  const json quant = nvfp4_quant_config(conv, n.excluded);
  const json meta = {{"format", "pt"}, {"fp4train_checkpoint", e.file.string()},
                     {"fp4train_step", std::to_string(e.ck.step)},
                     {"fp4train_input_scale", refs.source},
                     {"fp4train_weights", a.requantize ? "re-quantized to NVFP4" : "as trained"}};
  safetensors::write_file(out / "model.safetensors", safetensors::make_header(n.outs, meta), n.outs);
  write_hf_sidecars(e, out, tensors, conv == Nvfp4Convention::CompressedTensors ? quant : json());
  std::error_code ec;
  if (conv != Nvfp4Convention::ModelOpt) fs::remove(out / "hf_quant_config.json", ec);  // a stale one
  if (conv == Nvfp4Convention::ModelOpt) {
    const json hq = {{"producer", {{"name", "fp4train"}, {"version", "1"}}}, {"quantization", quant}};
    write_file_atomic(out / "hf_quant_config.json", hq.dump(2) + "\n");
  }
  std::printf("exported %s (step %lld, %s layout) to %s: %d NVFP4 linears (%s, %s convention; "
              "input scales from the %s), %zu other tensors F32\n",
              e.file.string().c_str(), static_cast<long long>(e.ck.step),
              hf_llama_layout(e.cfg.model) ? "Llama" : "Nemotron-H", out.string().c_str(), n.fp4,
              a.requantize ? "re-quantized" : "as trained", nvfp4_convention_name(conv),
              refs.source.c_str(), n.outs.size() - size_t(4 * n.fp4));
}

void run_export(const ExportArgs& a) {
  const Exported e = load_exported(a.checkpoint);
  if (a.format != "gguf" && a.weights != "f32") throw UserError("--weights goes with --format gguf");
  if (a.format == "hf" && a.requantize)
    throw UserError("--requantize goes with --format gguf --weights nvfp4 or --format nvfp4-safetensors");
  if (a.format != "nvfp4-safetensors" && (a.convention != "modelopt" || a.input_scale != "auto" || a.calib_given))
    throw UserError("--convention, --input-scale and --calib-batches go with --format nvfp4-safetensors");
  if (a.calib_given && a.input_scale == "held")
    throw UserError("--calib-batches goes with --input-scale calibrated or auto, not held");
  if (a.format == "hf") return export_hf(e, out_directory(a.out));
  if (a.format == "nvfp4-safetensors") return export_nvfp4(e, a);
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
                "SentencePiece vocabulary; docs/export.md \"GGUF for llama.cpp\"); nvfp4-safetensors: "
                "the HF directory with every FP4 linear packed as NVFP4 for vLLM and TensorRT-LLM "
                "(docs/export.md \"NVFP4 safetensors for vLLM and TensorRT-LLM\")")
      ->capture_default_str()
      ->check(CLI::IsMember({"hf", "gguf", "nvfp4-safetensors"}));
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
              "With --weights nvfp4 or --format nvfp4-safetensors: re-quantize weights trained "
              "with other block scales (e.g. UE5M3) to NVFP4 (E4M3 scales over 16, T = 448); "
              "without it such a run is refused");
  c->add_option("--convention", a->convention,
                "nvfp4-safetensors: modelopt (weight, weight_scale, weight_scale_2 = decode "
                "scale, input_scale; hf_quant_config.json) or compressed-tensors (weight_packed, "
                "weight_scale, weight_global_scale = 1 / weight_scale_2, input_global_scale; "
                "quantization_config in config.json)")
      ->capture_default_str()
      ->check(CLI::IsMember({"modelopt", "compressed-tensors"}));
  c->add_option("--input-scale", a->input_scale,
                "nvfp4-safetensors: the activation reference behind each input scale: held (the "
                "checkpoint's held X reference, recipes with D > 1), calibrated (max of amax(X) "
                "over --calib-batches batches of training text, as eval's calibrated policy), "
                "auto (held when every FP4 linear has one, else calibrated)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "held", "calibrated"}));
  auto* cb = c->add_option("--calib-batches", a->calib_batches, "nvfp4-safetensors: calibration batches")
                 ->capture_default_str()
                 ->check(CLI::Range(1, 1000000));
  c->callback([a, cb] {
    a->calib_given = cb->count() > 0;
    run_export(*a);
  });
}

}  // namespace fp4::cli
