// `fp4train export --checkpoint PATH --out DIR`: a Hugging Face style directory of a
// checkpoint's model: model.safetensors (FP32 weights under HF transformers' names,
// hf_layout.h), config.json, and the run's tokenizer.model when there is one. The map of
// names is in docs/export.md; python/fp4train/torch/models.py loads the directory.
#include <cstdio>
#include <filesystem>
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

namespace fp4::cli {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
struct ExportArgs {
  std::string checkpoint;
  std::string out;
};

void run_export(const ExportArgs& a) {
  const fs::path arg(a.checkpoint);
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
  const std::vector<HfTensor> tensors = hf_tensors(cfg.model, model.param_infos(), ck.params);

  const fs::path out(a.out);
  std::error_code ec;
  if (fs::exists(out) && !fs::is_directory(out))
    throw UserError("--out " + out.string() + " exists and is not a directory");
  fs::create_directories(out, ec);
  if (ec) throw UserError("cannot create --out directory " + out.string() + ": " + ec.message());

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
  conf["fp4train"]["recipe"] = recipe.name;
  conf["fp4train"]["config_toml"] = ck.config_toml;
  write_file_atomic(out / "config.json", conf.dump(2) + "\n");

  fs::path run_dir = fs::is_directory(arg) ? arg : file.parent_path();
  if (run_dir.filename() == "checkpoints") run_dir = run_dir.parent_path();
  const fs::path tok = run_dir / "tokenizer.model";
  const bool copied = fs::exists(tok);
  if (copied) {
    fs::copy_file(tok, out / "tokenizer.model", fs::copy_options::overwrite_existing, ec);
    if (ec) throw UserError("cannot copy " + tok.string() + " to " + out.string() + ": " + ec.message());
  }
  std::printf("exported %s (step %lld, %s layout, %zu tensors, %lld parameters) to %s: "
              "model.safetensors, config.json%s\n",
              file.string().c_str(), static_cast<long long>(ck.step),
              hf_llama_layout(cfg.model) ? "Llama" : "Nemotron-H", tensors.size(),
              static_cast<long long>(model.num_params()), out.string().c_str(),
              copied ? ", tokenizer.model" : "");
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
  c->callback([a] { run_export(*a); });
}

}  // namespace fp4::cli
