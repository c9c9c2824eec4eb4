// `fp4train eval` (held-out NLL under the inference policies, or the downstream task) and
// `fp4train sample` (text generation), both on a checkpoint (or, for baselines and tests, a
// freshly initialised model) with the checkpoint's recipe or another one: the options, then
// the study room's evaluate_checkpoint (fp4/study/evaluate.h) or the eval room's
// sample_tokens. See docs/evaluation.md.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "fp4/base/error.h"
#include "fp4/base/safetensors.h"
#include "fp4/data/data.h"
#include "fp4/eval/eval.h"
#include "fp4/study/evaluate.h"
#include "options.h"

namespace fp4::cli {
namespace fs = std::filesystem;

namespace {

void add_source_options(CLI::App* c, EvalSourceSpec& a) {
  c->add_option("--checkpoint", a.checkpoint,
                "Checkpoint: a .safetensors file, or a run directory (its newest good "
                "checkpoint under checkpoints/)");
  c->add_option("--recipe", a.recipe,
                "Quantize with this recipe (name in configs/recipes/ or a .toml path) instead of "
                "the checkpoint's own")
      ->check(CLI::Validator(check_recipe_arg, "RECIPE"));
  c->add_option("--data", a.data, "Text file or directory instead of the run config's data.path");
  c->add_option("--config", a.config,
                "Instead of --checkpoint (with --init-seed): a run config whose model is freshly "
                "initialised; a baseline near ln(vocab), used by the tests");
  c->add_option("--init-seed", a.init_seed, "Seed of that initialisation (with --config)")
      ->check(CLI::Range(int64_t{0}, int64_t{INT64_MAX}));
  add_set_option(c, a.sets,
                 ". Recipe keys change the recipe used (the checkpoint's or --recipe's); config "
                 "keys only with --config (a checkpoint's model is fixed; --windows and --data "
                 "cover evaluation)");
}
// ----------------------------------------------------------------------------- sample

struct SampleArgs {
  EvalSourceSpec src;
  std::string prompt;
  int tokens = 100;
  double temperature = 0.8;
  int top_k = 40;
  uint64_t seed = 1;
  std::string policy = "current";
  int calib_batches = 4;
  std::string ids_out;  // --ids-out: the prompt's and the continuation's token ids as JSON
};

void run_sample(const SampleArgs& a) {
  const std::vector<EvalPolicy> pol = parse_eval_policies(a.policy);
  if (pol.size() != 1) throw UserError("sample takes one --policy, got '" + a.policy + "'");
  const EvalSource s = load_eval_source(a.src);
  const int seq_len = s.cfg.train.seq_len, batch = s.cfg.train.micro();  // as train evaluates
  SampleOptions opt;
  opt.max_new_tokens = a.tokens;
  opt.temperature = a.temperature;
  opt.top_k = a.top_k;
  opt.seed = a.seed;
  opt.policy = pol[0];
  const bool calibrated = opt.policy.kind == EvalPolicy::Kind::Calibrated;
  // The run's tokenizer; the data (cache) only when it is missing or calibration needs it.
  fs::path tok = s.run_dir.empty() ? fs::path() : s.run_dir / "tokenizer.model";
  TokenData data;
  if (calibrated || tok.empty() || !fs::exists(tok)) {
    data = load_eval_data(s, a.src);
    if (tok.empty() || !fs::exists(tok)) tok = data.tokenizer_model;
  }
  if (tok.empty())
    throw UserError("sample needs a tokenizer, and the run has none: its data is pre-tokenized "
                    "without data.tokenizer (docs/data.md); set data.tokenizer to the "
                    "SentencePiece model its ids come from");
  const Tokenizer sp(tok);
  if (sp.pieces() > s.cfg.model.vocab_size)
    throw UserError("tokenizer " + tok.string() + " has " + std::to_string(sp.pieces()) +
                    " pieces, more than model.vocab_size " + std::to_string(s.cfg.model.vocab_size));
  // Every document follows an EOS in the training streams: start from one.
  std::vector<int> prompt = {kTokenEos};
  if (!a.prompt.empty()) {
    const std::vector<int> ids = sp.encode(a.prompt, "--prompt");
    prompt.insert(prompt.end(), ids.begin(), ids.end());
  }
  EvalWindows calib;
  if (calibrated) calib = calibration_windows(data.train, seq_len, batch, a.calib_batches);
  auto model = build_eval_model(s, calibrated ? batch : 1);
  const std::vector<int> out =
      sample_tokens(*model, prompt, opt, seq_len, calibrated ? batch : 1, calibrated ? &calib : nullptr);
  std::fprintf(stderr, "%s; policy %s, temperature %g, top-k %d, seed %llu, %zu tokens\n",
               describe_eval_source(s).c_str(), opt.policy.name().c_str(), opt.temperature, opt.top_k,
               static_cast<unsigned long long>(opt.seed), out.size());
  if (!a.ids_out.empty()) {
    const nlohmann::json ids = {{"prompt", prompt}, {"continuation", out}};
    write_file_atomic(a.ids_out, ids.dump() + "\n");
  }
  std::vector<int> all(prompt.begin() + 1, prompt.end());
  all.insert(all.end(), out.begin(), out.end());
  std::printf("%s\n", detokenize(tok, all).c_str());
}

}  // namespace

void register_eval(CLI::App& app) {
  auto a = std::make_shared<EvalRequest>();
  auto* c = app.add_subcommand(
      "eval",
      "Held-out NLL (nats/token and bits/byte) of a checkpoint under quantized inference.\n"
      "The recipe's forward quantization is applied to every quantized linear; weights' amax is\n"
      "measured once and frozen; the activation reference follows --policy:\n"
      "  none        FP32 inference, no quantization\n"
      "  current     amax of each activation tensor at each call (D = 1)\n"
      "  replay-d50  cold sample-and-hold over the ordered evaluation batches: refreshed at\n"
      "              batch 1, 51, 101, ... and held in between (replay-d<D> for another D)\n"
      "  calibrated  max of each activation's amax over --calib-batches batches from the start\n"
      "              of the training split (current scaling), then frozen\n"
      "  llama-q8_0  as llama.cpp computes a GGUF export (export --format gguf --weights ...):\n"
      "              FP4 linears' activations as its Q8_0, other linears FP32 (not a default)\n"
      "Held-out windows: the first --windows non-overlapping seq_len windows of the held-out\n"
      "split, train.micro_batch_size (batch_size unless micro-batched) per batch. Prints a table; --json writes it for machines.");
  add_source_options(c, a->src);
  c->add_option("--policy", a->policies,
                "none, current, replay-d50 (replay-d<D>), calibrated, llama-q8_0; repeatable or a "
                "comma list (default: the first four)");
  c->add_option("--windows", a->windows, "Held-out windows (default: eval.windows of the config)")
      ->check(CLI::Range(1, 1 << 24));
  c->add_option("--calib-batches", a->calib_batches,
                "Calibration batches for the calibrated policy")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  c->add_option("--json", a->json_file, "Also write the results as JSON to this file");
  c->add_option("--windows-out", a->windows_out,
                "Also write the evaluated held-out windows (seq_len + 1 token ids each, in "
                "order) as JSON to this file, for another engine to score the same tokens "
                "(tools/llama/llama_nll.mjs; docs/export.md \"The llama.cpp check\")");
  c->add_option("--grad-out", a->grad_out,
                "Also write the FP32 gradient (quantization off, whatever the recipe) of the mean "
                "NLL of the first --grad-windows held-out windows, run as one batch, to this "
                "safetensors file: one F32 tensor per parameter under the names and shapes of "
                "`fp4train export` (docs/export.md), \"tokens\" (I32 [windows, seq_len + 1], "
                "the windows) and the loss in the metadata (\"loss\")");
  c->add_option("--grad-windows", a->grad_windows,
                "Windows of --grad-out (default: all evaluated windows)")
      ->check(CLI::Range(1, 1 << 20));
  c->add_option("--task", a->task,
                "next-sentence: instead of held-out NLL, the accuracy of picking a held-out "
                "document's true next sentence among 4 (3 length-matched sentences of other "
                "held-out documents), after 3 sentences of context, under each --policy; items "
                "drawn as configs/tasks/next-sentence.toml says and checked against its hash "
                "(docs/evaluation.md \"Downstream task: `eval --task next-sentence`\"). "
                "minimal-pairs: the accuracy of giving a held-out sentence a higher total "
                "log-probability than its altered copies (adjacent swap, shuffle, "
                "determiner-noun and a/an, subject-verb agreement, a cloze of 4 "
                "frequency-matched words), per paradigm, with the log-probability margin; items "
                "as configs/tasks/minimal-pairs.toml says (docs/evaluation.md \"Minimal pairs: "
                "`eval --task minimal-pairs`\")");
  c->add_option("--items-out", a->items_out, "With --task: also write the items as JSON Lines");
  c->callback([a] { evaluate_checkpoint(*a); });
}

void register_sample(CLI::App& app) {
  auto a = std::make_shared<SampleArgs>();
  auto* c = app.add_subcommand(
      "sample",
      "Generate text from a checkpoint with the same quantization options as eval. The prompt\n"
      "is encoded with the run's tokenizer.model after an end-of-document token; each new token\n"
      "runs one forward over the last seq_len tokens (the window slides beyond seq_len).\n"
      "Temperature 0 is greedy; otherwise top-k sampling with a counter-based RNG, so the same\n"
      "seed gives the same text. Stops after --tokens tokens or an end-of-document token.");
  add_source_options(c, a->src);
  c->add_option("--prompt", a->prompt, "Text to continue (default: start a new document)");
  c->add_option("--tokens", a->tokens, "Tokens to generate")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  c->add_option("--temperature", a->temperature, "Softmax temperature; 0 = greedy")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 100.0));
  c->add_option("--top-k", a->top_k, "Sample among the k most likely tokens; 0 = all")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  c->add_option("--seed", a->seed, "Sampling seed")->capture_default_str();
  c->add_option("--policy", a->policy, "Inference policy: none, current, replay-d<D>, calibrated")
      ->capture_default_str();
  c->add_option("--calib-batches", a->calib_batches, "Calibration batches (calibrated policy)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  c->add_option("--ids-out", a->ids_out,
                "Also write the token ids as JSON: {\"prompt\": [EOS, prompt ids...], "
                "\"continuation\": [generated ids...]} (for tools/llama/llama_greedy.mjs)");
  c->callback([a] { run_sample(*a); });
}

}  // namespace fp4::cli
