// `fp4train eval` (held-out NLL under the inference policies; the downstream task, scored by
// fp4/eval/tasks.h) and `fp4train sample` (text
// generation), both on a checkpoint (or, for baselines and tests, a freshly initialised model)
// with the checkpoint's recipe or another one. See README "Quantized inference evaluation".
//
// The only checkpoint-specific code is load_source(): resolve_checkpoint, load_checkpoint,
// run_config_from_text and recipe_from_text of fp4/train/checkpoint.h.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "commands.h"
#include "fp4/train/checkpoint.h"
#include "fp4/data/data.h"
#include "fp4/base/error.h"
#include "fp4/eval/eval.h"
#include "fp4/study/report.h"
#include "fp4/eval/tasks.h"
#include "fp4/base/safetensors.h"
#include "fp4/train/train.h"
#include "hf_layout.h"
#include "paths.h"
#include "run_control.h"

namespace fp4::cli {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Where the model comes from: a checkpoint, or --config + --init-seed.
struct SourceArgs {
  std::string checkpoint;
  std::string config;       // with init_seed: a run config instead of a checkpoint
  int64_t init_seed = -1;
  std::string recipe;       // empty: the checkpoint's (or, with --config, ue5m3-b16)
  std::string data;         // override of data.path
  std::vector<std::string> sets;  // --set KEY=VALUE: recipe keys; config keys with --config
};

struct Source {
  RunConfig cfg;
  Recipe recipe;
  std::string recipe_source;   // "checkpoint" or the --recipe argument
  std::vector<float> params;   // empty: initialise with init_seed
  uint64_t init_seed = 0;
  std::string checkpoint;      // resolved file, or "" for an initialised model
  int64_t step = 0;
  fs::path run_dir;            // holds tokenizer.model (may be empty)
  fs::path config_dir;         // for relative data paths
  std::string data_key;        // the checkpoint's token-cache key (corpus + tokenizer), or ""
};

void add_source_options(CLI::App* c, SourceArgs& a) {
  c->add_option("--checkpoint", a.checkpoint,
                "Checkpoint: a .safetensors file, or a run directory (its newest good "
                "checkpoint under checkpoints/)");
  c->add_option("--recipe", a.recipe,
                "Quantize with this recipe (name in configs/recipes/ or a .toml path) instead of "
                "the checkpoint's own");
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

// The recipe must fit the model: explicit high-precision blocks inside it.
void check_fits(const Recipe& r, const RunConfig& cfg, const std::string& where) {
  const int L = cfg.model.n_blocks();
  for (int b : r.blocks)
    if (b < 0 || b >= L)
      throw UserError("recipe " + r.name + " does not fit the model of " + where +
                      ": high_precision.blocks holds block " + std::to_string(b) +
                      " but the model has " + std::to_string(L) + " blocks (0.." +
                      std::to_string(L - 1) + ")");
}

// Everything that depends on checkpoints is here.
Source load_source(const SourceArgs& a) {
  Source s;
  if (a.checkpoint.empty() == a.config.empty())
    throw UserError("give either --checkpoint PATH or --config FILE --init-seed S");
  std::vector<std::pair<std::string, std::string>> taken;
  if (!a.data.empty()) taken.push_back({"data.path", "--data"});
  const Settings sets = parse_set_args(a.sets, taken);
  if (!a.config.empty()) {
    if (a.init_seed < 0) throw UserError("--config needs --init-seed S (a freshly initialised model)");
    const fs::path f = resolve(a.config);
    s.cfg = load_run_config(f, sets.config);
    validate(s.cfg, with_settings(a.config, sets.config));
    s.init_seed = static_cast<uint64_t>(a.init_seed);
    s.config_dir = f.parent_path();
    s.recipe = load_recipe(a.recipe.empty() ? "ue5m3-b16" : a.recipe, resolve("configs/recipes"),
                           sets.recipe);
    s.recipe_source = with_settings(a.recipe.empty() ? "ue5m3-b16" : a.recipe, sets.recipe);
    check_fits(s.recipe, s.cfg, a.config);
    return s;
  }
  if (a.init_seed >= 0) throw UserError("--init-seed goes with --config, not --checkpoint");
  if (!sets.config.empty())
    throw UserError(sets.config[0].arg + ": a checkpoint's run config is fixed (its model and "
                    "data); only recipe keys may be set (--windows and --data change the "
                    "evaluation)");
  const fs::path arg(a.checkpoint);
  if (!fs::exists(arg)) throw UserError("checkpoint " + arg.string() + " does not exist");
  std::string warn;
  const fs::path file = resolve_checkpoint(arg, &warn);
  if (!warn.empty()) std::fprintf(stderr, "note: %s\n", warn.c_str());
  Checkpoint ck = load_checkpoint(file);
  s.checkpoint = file.string();
  s.step = ck.step;
  s.cfg = run_config_from_text(ck.config_toml, file.string() + " (config)");
  if (a.recipe.empty()) {
    s.recipe = recipe_from_text(ck.recipe_toml, file.string() + " (recipe)", sets.recipe);
    s.recipe_source = with_settings("checkpoint", sets.recipe);
  } else {
    s.recipe = load_recipe(a.recipe, resolve("configs/recipes"), sets.recipe);
    s.recipe_source = with_settings(a.recipe, sets.recipe);
  }
  check_fits(s.recipe, s.cfg, file.string());
  s.params = std::move(ck.params);
  s.data_key = ck.data_key;
  s.run_dir = fs::is_directory(arg) ? arg : file.parent_path();
  if (s.run_dir.filename() == "checkpoints") s.run_dir = s.run_dir.parent_path();
  s.config_dir = s.run_dir;
  return s;
}

// The model of the source, parameters loaded (or initialised).
std::unique_ptr<nn::Model> build_model(const Source& s, int batch) {
  auto m = std::make_unique<nn::Model>(s.cfg.model, s.recipe, batch, s.cfg.train.seq_len);
  if (s.params.empty()) {
    m->init(s.init_seed);
  } else {
    if (static_cast<int64_t>(s.params.size()) != m->num_params())
      throw UserError("checkpoint " + s.checkpoint + " holds " + std::to_string(s.params.size()) +
                      " parameters but the model of its config has " +
                      std::to_string(m->num_params()));
    m->params() = s.params;
  }
  return m;
}

// data.path and data.cache: --data as given; a config's relative path: from the working
// directory, else beside the config / run directory, else the source tree.
fs::path locate_path(const Source& s, const std::string& p) {
  fs::path q(p);
  if (q.is_absolute() || fs::exists(q)) return q;
  if (!s.config_dir.empty() && fs::exists(s.config_dir / q)) return s.config_dir / q;
  return resolve(p);
}

fs::path data_path_of(const Source& s, const SourceArgs& a) {
  return a.data.empty() ? locate_path(s, s.cfg.data.path) : fs::path(a.data);
}

TokenData load_data(const Source& s, const SourceArgs& a) {
  auto locate = [&](const std::string& p) { return locate_path(s, p); };
  const fs::path data_path = data_path_of(s, a);
  if (!fs::exists(data_path))
    throw UserError("data path " + data_path.string() + " does not exist" +
                    (a.data.empty() ? " (data.path of the run config; pass --data PATH)" : ""));
  const fs::path cache = locate(s.cfg.data.cache);
  TokenData d = prepare_tokens(data_path, s.cfg.model.vocab_size, cache,
                               [](const std::string& l) { std::fprintf(stderr, "%s\n", l.c_str()); });
  // Token ids only mean something with the tokenizer the model was trained with.
  if (!s.data_key.empty() && d.cache_dir.filename().string() != s.data_key)
    throw UserError("checkpoint " + s.checkpoint + " was trained on data with token-cache key " +
                    s.data_key + ", but " + data_path.string() + " gives key " +
                    d.cache_dir.filename().string() +
                    " (another corpus or tokenizer): its token ids would not match the model. "
                    "Evaluate on the run's own corpus (data.path of its config.toml)");
  return d;
}

std::string describe(const Source& s) {
  std::string d = s.checkpoint.empty()
                      ? "model initialised with seed " + std::to_string(s.init_seed)
                      : "checkpoint " + s.checkpoint + " (step " + std::to_string(s.step) + ")";
  return d + ", recipe " + s.recipe.name +
         (s.recipe_source == "checkpoint" ? " (the checkpoint's)"
          : s.recipe_source.rfind("checkpoint with", 0) == 0
              ? " (the checkpoint's" + s.recipe_source.substr(10) + ")"
              : "");
}

// ------------------------------------------------------------------------------- eval

struct EvalArgs {
  SourceArgs src;
  std::vector<std::string> policies;
  int windows = 0;
  int calib_batches = 4;
  std::string json_file;
  std::string grad_out;   // --grad-out: gradient file (safetensors, HF names)
  int grad_windows = 0;   // --grad-windows: its windows (0: every evaluated window)
  std::string task;       // --task next-sentence: multiple-choice accuracy instead of NLL
  std::string items_out;  // --items-out: the task's items as JSON Lines
};

json num(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

// --grad-out: the FP32 gradient of the mean NLL of the first n held-out windows (one forward
// of n sequences with quantization off, then Model::backward), written with the names and
// shapes of `fp4train export` (hf_layout.h), plus the windows ("tokens", I32 [n, seq_len + 1])
// and the loss (metadata "loss", %.17g of the double mean).
void write_gradients(const Source& s, const EvalWindows& held, int n, const std::string& file) {
  const int seq_len = s.cfg.train.seq_len;
  auto model = build_model(s, n);
  std::vector<int32_t> in(int64_t(n) * seq_len), tg(in.size()), win(int64_t(n) * (seq_len + 1));
  for (int b = 0; b < n; ++b)
    for (int t = 0; t <= seq_len; ++t) {
      const int32_t id = (*held.tokens)[held.starts[b] + t];
      win[int64_t(b) * (seq_len + 1) + t] = id;
      if (t < seq_len) in[int64_t(b) * seq_len + t] = id;
      if (t > 0) tg[int64_t(b) * seq_len + t - 1] = id;
    }
  nn::StepContext ctx;  // a training step (backward allowed) with every linear in FP32
  ctx.quantize = false;
  model->zero_grad();
  const double loss = model->forward(in.data(), tg.data(), n, ctx);
  model->backward(ctx);
  const std::vector<HfTensor> grads = hf_tensors(s.cfg.model, model->param_infos(), model->grads());
  std::vector<safetensors::TensorOut> outs;
  for (const HfTensor& t : grads)
    outs.push_back({t.name, "F32", t.shape, t.data.data(), t.data.size() * sizeof(float)});
  outs.push_back({"tokens", "I32", {n, seq_len + 1}, win.data(), win.size() * sizeof(int32_t)});
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", loss);
  const json meta = {{"format", "fp4train.grad.v1"},
                     {"loss", buf},
                     {"windows", std::to_string(n)},
                     {"seq_len", std::to_string(seq_len)},
                     {"checkpoint", s.checkpoint},
                     {"step", std::to_string(s.step)}};
  safetensors::write_file(file, safetensors::make_header(outs, meta), outs);
  std::printf("gradient of the mean NLL of the first %d held-out windows (FP32, loss %.6f) "
              "written to %s\n", n, loss, file.c_str());
}

// `eval --task next-sentence`: accuracy of choosing the true next sentence among four, scored
// by the log-likelihood of each choice after the context (raw, and per character), under
// each policy; 95% bootstrap intervals over items.
void run_task(const EvalArgs& a, const Source& s, nn::Model& model, const TokenData& data,
              const std::vector<EvalPolicy>& policies, const EvalWindows* calib) {
  if (a.task != "next-sentence")
    throw UserError("--task " + a.task + ": unknown task (next-sentence)");
  const NextSentenceTask tf = load_next_sentence_task(resolve("configs/tasks/next-sentence.toml"));
  const CorpusSplit split = split_corpus(data_path_of(s, a.src));
  const std::vector<NextSentenceItem> items = make_next_sentence_items(split, tf.opt);
  const std::string jsonl = next_sentence_items_jsonl(items);
  const std::string hash = fnv1a64_hex(jsonl);
  if (!a.items_out.empty()) write_file_atomic(a.items_out, jsonl);
  const bool shipped = !tf.shipped_hash.empty() && hash == tf.shipped_hash;
  std::set<std::string> docs;
  for (const auto& it : items) docs.insert(it.doc);
  std::printf("%s\n", describe(s).c_str());
  std::printf("next-sentence: %zu items from %zu held-out documents (%d context sentences, "
              "seed %llu), items fnv1a64 %s%s\n",
              items.size(), docs.size(), tf.opt.context_sentences,
              static_cast<unsigned long long>(tf.opt.seed), hash.c_str(),
              shipped ? " = the shipped set" : "");
  if (!shipped)
    std::fprintf(stderr,
                 "warning: these items differ from the shipped set of %s (fnv1a64 %s, made from "
                 "the default corpus data/brown/text): another corpus or sentence rule; the "
                 "accuracies are not comparable with docs/results.md\n",
                 tf.path.string().c_str(), tf.shipped_hash.empty() ? "none" : tf.shipped_hash.c_str());
  const int seq_len = s.cfg.train.seq_len, batch = s.cfg.train.micro();
  const NextSentenceRows rows = next_sentence_rows(items, Tokenizer(data.tokenizer_model), seq_len);
  const int64_t truncated = rows.truncated;
  std::printf("%zu choice rows, %d per batch, seq_len %d; %lld choices cut to seq_len tokens\n",
              rows.seqs.size(), batch, seq_len, static_cast<long long>(truncated));
  std::printf("%-14s %26s %26s %8s\n", "policy", "accuracy raw [95% CI]", "per char [95% CI]",
              "chance");
  json results = json::object(), order = json::array();
  for (const auto& p : policies) {
    const NextSentenceScore sc = score_next_sentence(model, items, rows, seq_len, batch, p, calib);
    const std::vector<double>&raw = sc.raw, &norm = sc.per_char;
    const bool finite = sc.finite;
    std::string raw_s, norm_s;
    for (size_t i = 0; i < items.size(); ++i) {
      raw_s += raw[i] ? '1' : '0';
      norm_s += norm[i] ? '1' : '0';
    }
    json jr;
    if (!finite) {
      std::printf("%-14s %26s %26s %7.1f%%\n", p.name().c_str(), "non-finite", "non-finite", 25.0);
      jr = {{"accuracy", nullptr}, {"accuracy_per_char", nullptr}};
    } else {
      const BootstrapInterval br = paired_bootstrap({raw}), bn = paired_bootstrap({norm});
      char c1[64], c2[64];
      std::snprintf(c1, sizeof c1, "%.1f%% [%.1f, %.1f]", 100 * br.mean, 100 * br.lo, 100 * br.hi);
      std::snprintf(c2, sizeof c2, "%.1f%% [%.1f, %.1f]", 100 * bn.mean, 100 * bn.lo, 100 * bn.hi);
      std::printf("%-14s %26s %26s %7.1f%%\n", p.name().c_str(), c1, c2, 25.0);
      jr = {{"accuracy", br.mean},        {"accuracy_ci95", {br.lo, br.hi}},
            {"accuracy_per_char", bn.mean}, {"accuracy_per_char_ci95", {bn.lo, bn.hi}},
            {"correct", raw_s},           {"correct_per_char", norm_s}};
    }
    std::fflush(stdout);
    results[p.name()] = jr;
    order.push_back(p.name());
  }
  std::printf("raw: the choice with the highest log-likelihood; per char: divided by its "
              "characters (OLMES); intervals: percentile bootstrap over items (10,000 resamples)\n");
  if (a.json_file.empty()) return;
  const json j = {{"task", "next-sentence"},
                  {"checkpoint", s.checkpoint.empty() ? json(nullptr) : json(s.checkpoint)},
                  {"step", s.step},
                  {"recipe", s.recipe.name},
                  {"items", items.size()},
                  {"documents", docs.size()},
                  {"context_sentences", tf.opt.context_sentences},
                  {"seed", tf.opt.seed},
                  {"items_fnv1a64", hash},
                  {"shipped_fnv1a64", tf.shipped_hash},
                  {"shipped", shipped},
                  {"chance", 0.25},
                  {"truncated_choices", truncated},
                  {"policies", order},
                  {"results", results}};
  write_file_atomic(a.json_file, j.dump(2) + "\n");
}

void run_eval(const EvalArgs& a) {
  std::vector<EvalPolicy> policies;
  if (a.policies.empty()) policies = default_eval_policies();
  for (const auto& p : a.policies)
    for (const auto& q : parse_eval_policies(p))
      if (std::none_of(policies.begin(), policies.end(),
                       [&](const EvalPolicy& x) { return x.name() == q.name(); }))
        policies.push_back(q);
  if (!a.json_file.empty()) {  // fail before the work, not after
    const fs::path dir = fs::path(a.json_file).parent_path();
    if (!dir.empty() && !fs::is_directory(dir))
      throw UserError("--json " + a.json_file + ": directory " + dir.string() + " does not exist");
  }
  if (!a.grad_out.empty()) {
    const fs::path dir = fs::path(a.grad_out).parent_path();
    if (!dir.empty() && !fs::is_directory(dir))
      throw UserError("--grad-out " + a.grad_out + ": directory " + dir.string() + " does not exist");
  }
  if (a.grad_windows > 0 && a.grad_out.empty()) throw UserError("--grad-windows goes with --grad-out FILE");
  if (!a.items_out.empty() && a.task.empty()) throw UserError("--items-out goes with --task next-sentence");
  if (!a.task.empty() && a.task != "next-sentence")
    throw UserError("--task " + a.task + ": unknown task (known: next-sentence)");
  if (!a.task.empty() && !a.grad_out.empty()) throw UserError("--task and --grad-out are separate runs of eval; give one");
  const Source s = load_source(a.src);
  const int seq_len = s.cfg.train.seq_len, batch = s.cfg.train.micro();  // as train evaluates
  auto model = build_model(s, batch);
  const TokenData data = load_data(s, a.src);
  if (data.vocab_size > s.cfg.model.vocab_size)
    throw UserError("tokenizer vocab (" + std::to_string(data.vocab_size) +
                    ") exceeds model.vocab_size (" + std::to_string(s.cfg.model.vocab_size) + ")");
  const int windows = a.windows > 0 ? a.windows : s.cfg.eval.windows;
  const EvalWindows held{&data.heldout,
                         heldout_windows(int64_t(data.heldout.size()), seq_len, windows)};
  if (held.starts.empty())
    throw UserError("the held-out split has " + std::to_string(data.heldout.size()) +
                    " tokens, fewer than train.seq_len + 1 = " + std::to_string(seq_len + 1));
  if (!a.grad_out.empty()) {
    const int n = a.grad_windows > 0 ? a.grad_windows : int(held.starts.size());
    if (n > int(held.starts.size()))
      throw UserError("--grad-windows " + std::to_string(n) + " exceeds the " +
                      std::to_string(held.starts.size()) + " held-out windows");
    write_gradients(s, held, n, a.grad_out);
  }
  const bool need_calib = std::any_of(policies.begin(), policies.end(), [](const EvalPolicy& p) {
    return p.kind == EvalPolicy::Kind::Calibrated;
  });
  EvalWindows calib;
  if (need_calib) calib = calibration_windows(data.train, seq_len, batch, a.calib_batches);
  if (!a.task.empty()) return run_task(a, s, *model, data, policies, need_calib ? &calib : nullptr);
  const std::vector<int> bytes = token_byte_lengths(data.tokenizer_model);

  std::printf("%s\n", describe(s).c_str());
  std::printf("held-out: %zu windows x %d tokens, batch %d\n", held.starts.size(), seq_len, batch);
  std::printf("%-14s %18s %10s %8s\n", "policy", "NLL (nats/token)", "bits/byte", "tokens");
  json results = json::object(), order = json::array();
  NllResult last;
  for (const auto& p : policies) {
    const NllResult r = evaluate_nll(*model, held, seq_len, batch, p, need_calib ? &calib : nullptr,
                                     &bytes);
    std::printf("%-14s %18.4f %10.4f %8lld\n", r.policy.c_str(), r.nats_per_token,
                r.bits_per_byte, static_cast<long long>(r.tokens));
    std::fflush(stdout);
    json jr = {{"nats_per_token", num(r.nats_per_token)},
               {"bits_per_byte", num(r.bits_per_byte)},
               {"total_nats", num(r.total_nats)},
               {"tokens", r.tokens},
               {"bytes", r.bytes},
               {"batches", r.batches}};
    json wn = json::array();
    for (double v : r.window_nll) wn.push_back(num(v));
    jr["window_nll"] = wn;  // per held-out window, in window order (paired bootstrap)
    if (p.kind == EvalPolicy::Kind::Replay) jr["interval"] = p.interval;
    if (p.kind == EvalPolicy::Kind::Calibrated) jr["calibration_tokens"] = r.calib_tokens;
    results[r.policy] = jr;
    order.push_back(r.policy);
    last = r;
  }
  if (need_calib)
    std::printf("calibrated: references = max over %zu training-split windows (%d per batch, "
                "from its start) of each linear's max|X|, then frozen\n",
                calib.starts.size(), batch);
  std::printf("bits/byte = total nats / ln 2 / %lld UTF-8 bytes of the scored tokens\n",
              static_cast<long long>(last.bytes));
  if (a.json_file.empty()) return;
  json j = {{"checkpoint", s.checkpoint.empty() ? json(nullptr) : json(s.checkpoint)},
            {"step", s.step},
            {"recipe", s.recipe.name},
            {"recipe_source", s.recipe_source},
            {"model_parameters", model->num_params()},
            {"seq_len", seq_len},
            {"batch", batch},
            {"windows", held.starts.size()},
            {"tokens", last.tokens},
            {"bytes", last.bytes},
            {"policies", order},
            {"results", results}};
  if (!s.checkpoint.empty()) j["init_seed"] = nullptr;
  else j["init_seed"] = s.init_seed;
  if (need_calib)
    j["calibration"] = {{"split", "train"},
                        {"windows", calib.starts.size()},
                        {"batches", (calib.starts.size() + batch - 1) / batch},
                        {"tokens", int64_t(calib.starts.size()) * seq_len},
                        {"statistic", "max over calibration batches of max|X| per linear"}};
  write_file_atomic(a.json_file, j.dump(2) + "\n");
}

// ----------------------------------------------------------------------------- sample

struct SampleArgs {
  SourceArgs src;
  std::string prompt;
  int tokens = 100;
  double temperature = 0.8;
  int top_k = 40;
  uint64_t seed = 1;
  std::string policy = "current";
  int calib_batches = 4;
};

void run_sample(const SampleArgs& a) {
  const std::vector<EvalPolicy> pol = parse_eval_policies(a.policy);
  if (pol.size() != 1) throw UserError("sample takes one --policy, got '" + a.policy + "'");
  const Source s = load_source(a.src);
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
    data = load_data(s, a.src);
    if (tok.empty() || !fs::exists(tok)) tok = data.tokenizer_model;
  }
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
  auto model = build_model(s, calibrated ? batch : 1);
  const std::vector<int> out =
      sample_tokens(*model, prompt, opt, seq_len, calibrated ? batch : 1, calibrated ? &calib : nullptr);
  std::fprintf(stderr, "%s; policy %s, temperature %g, top-k %d, seed %llu, %zu tokens\n",
               describe(s).c_str(), opt.policy.name().c_str(), opt.temperature, opt.top_k,
               static_cast<unsigned long long>(opt.seed), out.size());
  std::vector<int> all(prompt.begin() + 1, prompt.end());
  all.insert(all.end(), out.begin(), out.end());
  std::printf("%s\n", detokenize(tok, all).c_str());
}

}  // namespace

void eval_checkpoint_to_json(const std::string& checkpoint, const std::string& policies,
                             const std::string& json_file, const std::string& data) {
  EvalArgs a;
  a.src.checkpoint = checkpoint;
  a.src.data = data;
  a.policies = {policies};
  a.json_file = json_file;
  run_eval(a);
}

void task_checkpoint_to_json(const std::string& checkpoint, const std::string& task,
                             const std::string& policies, const std::string& json_file,
                             const std::string& data) {
  EvalArgs a;
  a.src.checkpoint = checkpoint;
  a.src.data = data;
  a.task = task;
  a.policies = {policies};
  a.json_file = json_file;
  run_eval(a);
}

void register_eval(CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
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
      "Held-out windows: the first --windows non-overlapping seq_len windows of the held-out\n"
      "split, train.micro_batch_size (batch_size unless micro-batched) per batch. Prints a table; --json writes it for machines.");
  add_source_options(c, a->src);
  c->add_option("--policy", a->policies,
                "none, current, replay-d50 (replay-d<D>), calibrated; repeatable or a comma list "
                "(default: all four)");
  c->add_option("--windows", a->windows, "Held-out windows (default: eval.windows of the config)")
      ->check(CLI::Range(1, 1 << 24));
  c->add_option("--calib-batches", a->calib_batches,
                "Calibration batches for the calibrated policy")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  c->add_option("--json", a->json_file, "Also write the results as JSON to this file");
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
                "(docs/evaluation.md \"Downstream task\")");
  c->add_option("--items-out", a->items_out, "With --task: also write the items as JSON Lines");
  c->callback([a] { run_eval(*a); });
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
  c->callback([a] { run_sample(*a); });
}

}  // namespace fp4::cli
