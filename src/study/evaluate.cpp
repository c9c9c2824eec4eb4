// Evaluation of a checkpoint (fp4/study/evaluate.h): the source, held-out NLL, the task,
// the gradient file. Moved from the CLI's cmd_eval.cpp, which now parses and calls.
//
// The only checkpoint-specific code is load_eval_source(): resolve_checkpoint,
// load_checkpoint, run_config_from_text and recipe_from_text of fp4/train/checkpoint.h.
#include "fp4/study/evaluate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "fp4/base/error.h"
#include "fp4/base/safetensors.h"
#include "fp4/eval/eval.h"
#include "fp4/eval/minimal_pairs.h"
#include "fp4/eval/tasks.h"
#include "fp4/nn/hf_layout.h"
#include "fp4/study/report.h"
#include "fp4/train/checkpoint.h"
#include "fp4/train/paths.h"
#include "fp4/train/resolved_run.h"
#include "fp4/train/train.h"

namespace fp4 {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
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

// data.path and data.cache: --data as given; a config's relative path: from the working
// directory, else beside the config / run directory, else the source tree.
fs::path locate_path(const EvalSource& s, const std::string& p) {
  fs::path q(p);
  if (q.is_absolute() || fs::exists(q)) return q;
  if (!s.config_dir.empty() && fs::exists(s.config_dir / q)) return s.config_dir / q;
  return resolve(p);
}

fs::path data_path_of(const EvalSource& s, const EvalSourceSpec& a) {
  return a.data.empty() ? locate_path(s, s.cfg.data.path) : fs::path(a.data);
}

// The run's data source: its [data] keys, paths found as data.path is.
DataSpec data_spec_of(const EvalSource& s, const EvalSourceSpec& a) {
  DataSpec d = data_spec(s.cfg, data_path_of(s, a), s.config_dir / "config.toml");
  if (!s.cfg.data.heldout.empty()) d.heldout = locate_path(s, s.cfg.data.heldout);
  if (!s.cfg.data.tokenizer.empty()) d.tokenizer = locate_path(s, s.cfg.data.tokenizer);
  return d;
}

}  // namespace

// Everything that depends on checkpoints is here.
EvalSource load_eval_source(const EvalSourceSpec& a) {
  EvalSource s;
  if (a.checkpoint.empty() == a.config.empty())
    throw UserError("give either --checkpoint PATH or --config FILE --init-seed S");
  if (!a.config.empty()) {
    if (a.init_seed < 0) throw UserError("--config needs --init-seed S (a freshly initialised model)");
    // The run the config and recipe define, resolved as train resolves it; the data is
    // load_eval_data's (--data, or data.path found beside the config).
    RunRequest request;
    request.config = a.config;
    request.recipe = a.recipe.empty() ? "ue5m3-b16" : a.recipe;
    request.sets = a.sets;
    if (!a.data.empty()) request.taken.push_back({"data.path", "--data"});
    request.with_data = false;
    ResolvedRun run = resolve_run(request);
    s.cfg = std::move(run.config);
    s.init_seed = static_cast<uint64_t>(a.init_seed);
    s.config_dir = run.config_file.parent_path();
    s.recipe = std::move(run.recipe);
    s.recipe_source = with_settings(request.recipe, run.sets.recipe);
    s.plans = std::move(run.plans);
    return s;
  }
  std::vector<std::pair<std::string, std::string>> taken;
  if (!a.data.empty()) taken.push_back({"data.path", "--data"});
  const Settings sets = parse_set_args(a.sets, taken);
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
    s.recipe = load_recipe_arg(a.recipe, sets.recipe);
    s.recipe_source = with_settings(a.recipe, sets.recipe);
  }
  check_fits(s.recipe, s.cfg, file.string());
  s.plans = resolve_linear_plans(s.recipe, nn::Model::linear_sites(s.cfg.model),
                                 s.cfg.model.n_blocks());
  s.params = std::move(ck.params);
  s.data_key = ck.data_key;
  s.run_dir = fs::is_directory(arg) ? arg : file.parent_path();
  if (s.run_dir.filename() == "checkpoints") s.run_dir = s.run_dir.parent_path();
  s.config_dir = s.run_dir;
  return s;
}

// The model of the source, parameters loaded (or initialised).
std::unique_ptr<nn::Model> build_eval_model(const EvalSource& s, int batch) {
  // The plans load_eval_source resolved; a source made by hand without them resolves here.
  auto m = s.plans.plans.empty()
               ? std::make_unique<nn::Model>(s.cfg.model, s.recipe, batch, s.cfg.train.seq_len)
               : std::make_unique<nn::Model>(s.cfg.model, s.plans, batch, s.cfg.train.seq_len);
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

TokenData load_eval_data(const EvalSource& s, const EvalSourceSpec& a, bool quiet) {
  auto locate = [&](const std::string& p) { return locate_path(s, p); };
  const fs::path data_path = data_path_of(s, a);
  if (!fs::exists(data_path))
    throw UserError("data path " + data_path.string() + " does not exist" +
                    (a.data.empty() ? " (data.path of the run config; pass --data PATH)" : ""));
  const fs::path cache = locate(s.cfg.data.cache);
  TokenData d = prepare_tokens(data_spec_of(s, a), s.cfg.model.vocab_size, cache,
                               [quiet](const std::string& l) {
                                 if (!quiet) std::fprintf(stderr, "%s\n", l.c_str());
                               });
  // Token ids only mean something with the tokenizer the model was trained with.
  const auto& aliases = d.key_aliases;
  if (!s.data_key.empty() && d.cache_dir.filename().string() != s.data_key &&
      std::find(aliases.begin(), aliases.end(), s.data_key) == aliases.end())
    throw UserError("checkpoint " + s.checkpoint + " was trained on data with token-cache key " +
                    s.data_key + ", but " + data_path.string() + " gives key " +
                    d.cache_dir.filename().string() +
                    " (another corpus or tokenizer): its token ids would not match the model. "
                    "Evaluate on the run's own corpus (data.path of its config.toml)");
  return d;
}

std::string describe_eval_source(const EvalSource& s) {
  std::string d = s.checkpoint.empty()
                      ? "model initialised with seed " + std::to_string(s.init_seed)
                      : "checkpoint " + s.checkpoint + " (step " + std::to_string(s.step) + ")";
  return d + ", recipe " + s.recipe.name +
         (s.recipe_source == "checkpoint" ? " (the checkpoint's)"
          : s.recipe_source.rfind("checkpoint with", 0) == 0
              ? " (the checkpoint's" + s.recipe_source.substr(10) + ")"
              : "");
}

namespace {
json num(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

// --grad-out: the FP32 gradient of the mean NLL of the first n held-out windows (one forward
// of n sequences with quantization off, then Model::backward), written with the names and
// shapes of `fp4train export` (hf_layout.h), plus the windows ("tokens", I32 [n, seq_len + 1])
// and the loss (metadata "loss", %.17g of the double mean).
void write_gradients(const EvalSource& s, const EvalWindows& held, int n, const std::string& file) {
  const int seq_len = s.cfg.train.seq_len;
  auto model = build_eval_model(s, n);
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

// --windows-out: the evaluated held-out windows as JSON, {"format": "fp4train.windows.v1",
// "seq_len": T, "windows": [[T + 1 token ids], ...]} in evaluation order, for another engine to
// score the same tokens (tools/llama/llama_nll.mjs; docs/export.md "The llama.cpp check").
void write_windows(const EvalWindows& held, int seq_len, const std::string& file) {
  json w = json::array();
  for (const int64_t start : held.starts) {
    json ids = json::array();
    for (int t = 0; t <= seq_len; ++t) ids.push_back((*held.tokens)[start + t]);
    w.push_back(std::move(ids));
  }
  const json j = {{"format", "fp4train.windows.v1"}, {"seq_len", seq_len}, {"windows", w}};
  write_file_atomic(file, j.dump() + "\n");
}

// `eval --task next-sentence`: accuracy of choosing the true next sentence among four, scored
// by the log-likelihood of each choice after the context (raw, and per character), under
// each policy; 95% bootstrap intervals over items.
void run_minimal_pairs(const EvalRequest& a, const EvalSource& s, nn::Model& model,
                       const TokenData& data, const std::vector<EvalPolicy>& policies,
                       const EvalWindows* calib);

void run_task(const EvalRequest& a, const EvalSource& s, nn::Model& model, const TokenData& data,
              const std::vector<EvalPolicy>& policies, const EvalWindows* calib) {
  check_task_name(a.task, "--task");
  if (a.task == "minimal-pairs") return run_minimal_pairs(a, s, model, data, policies, calib);
  const NextSentenceTask tf = load_next_sentence_task(resolve("configs/tasks/next-sentence.toml"));
  const CorpusSplit split = split_corpus(data_spec_of(s, a.src));
  const std::vector<NextSentenceItem> items = make_next_sentence_items(split, tf.opt);
  const std::string jsonl = next_sentence_items_jsonl(items);
  const std::string hash = fnv1a64_hex(jsonl);
  if (!a.items_out.empty()) write_file_atomic(a.items_out, jsonl);
  const bool shipped = !tf.shipped_hash.empty() && hash == tf.shipped_hash;
  std::set<std::string> docs;
  for (const auto& it : items) docs.insert(it.doc);
  std::printf("%s\n", describe_eval_source(s).c_str());
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

// `eval --task minimal-pairs`: per paradigm, the credit of the corpus's sentence against its
// altered copies by total log-probability, and the margin, under each policy; 95% bootstrap
// intervals over items. The rows run at their own forward length (MinimalPairRows::T).
void run_minimal_pairs(const EvalRequest& a, const EvalSource& s, nn::Model& model,
                       const TokenData& data, const std::vector<EvalPolicy>& policies,
                       const EvalWindows* calib) {
  const MinimalPairTask tf = load_minimal_pair_task(resolve("configs/tasks/minimal-pairs.toml"));
  const CorpusSplit split = split_corpus(data_spec_of(s, a.src));
  const std::vector<MinimalPairItem> items = make_minimal_pair_items(split, tf.opt);
  const std::string jsonl = minimal_pair_items_jsonl(items);
  const std::string hash = fnv1a64_hex(jsonl);
  if (!a.items_out.empty()) write_file_atomic(a.items_out, jsonl);
  const bool shipped = !tf.shipped_hash.empty() && hash == tf.shipped_hash;
  std::printf("%s\n", describe_eval_source(s).c_str());
  std::printf("minimal-pairs: %zu items (up to %d per paradigm, seed %llu), items fnv1a64 %s%s\n",
              items.size(), tf.opt.items, static_cast<unsigned long long>(tf.opt.seed),
              hash.c_str(), shipped ? " = the shipped set" : "");
  if (!shipped)
    std::fprintf(stderr,
                 "warning: these items differ from the shipped set of %s (fnv1a64 %s, made from "
                 "the default corpus data/brown/text): another corpus or item rule; the "
                 "accuracies are not comparable with docs/results.md\n",
                 tf.path.string().c_str(), tf.shipped_hash.empty() ? "none" : tf.shipped_hash.c_str());
  const MinimalPairRows rows =
      minimal_pair_rows(items, Tokenizer(data.tokenizer_model), s.cfg.train.seq_len);
  const int64_t skipped = std::count(rows.skipped.begin(), rows.skipped.end(), true);
  const int batch = s.cfg.train.micro();
  std::printf("%zu rows, %d per batch, forward length %d; %lld items left out (longer than "
              "seq_len %d tokens)\n",
              rows.seqs.size(), batch, rows.T, static_cast<long long>(skipped), s.cfg.train.seq_len);
  // Items per paradigm, in kMinimalPairParadigms order (the items are drawn in that order).
  json paradigms = json::array();
  std::vector<std::pair<size_t, size_t>> range;  // [first, last) item of each paradigm
  for (const std::string_view p : kMinimalPairParadigms) {
    size_t b = items.size(), e = 0;
    for (size_t i = 0; i < items.size(); ++i)
      if (items[i].paradigm == p) b = std::min(b, i), e = i + 1;
    if (e == 0) b = 0;
    range.push_back({b, e});
    const int choices = e > b ? int(items[b].choices.size()) : 2;
    paradigms.push_back({{"name", std::string(p)}, {"first", b}, {"items", e - b},
                         {"choices", choices}, {"chance", 1.0 / choices}});
  }
  std::printf("%-12s %-10s %24s %26s %7s\n", "policy", "paradigm", "accuracy [95% CI]",
              "margin, nats [95% CI]", "chance");
  json results = json::object(), order = json::array();
  for (const auto& p : policies) {
    const MinimalPairScore sc = score_minimal_pairs(model, items, rows, batch, p, calib);
    json jr;
    if (!sc.finite) {
      std::printf("%-12s %-10s %24s\n", p.name().c_str(), "all", "non-finite");
      jr = {{"finite", false}};
    } else {
      json per = json::object(), margins = json::array();
      for (size_t k = 0; k < kMinimalPairParadigms.size(); ++k) {
        std::vector<double> c, m;
        for (size_t i = range[k].first; i < range[k].second; ++i)
          if (!std::isnan(sc.credit[i])) c.push_back(sc.credit[i]), m.push_back(sc.margin[i]);
        if (c.empty()) continue;
        const BootstrapInterval bc = paired_bootstrap({c}), bm = paired_bootstrap({m});
        char c1[64], c2[64];
        std::snprintf(c1, sizeof c1, "%.1f%% [%.1f, %.1f]", 100 * bc.mean, 100 * bc.lo, 100 * bc.hi);
        std::snprintf(c2, sizeof c2, "%+.3f [%+.3f, %+.3f]", bm.mean, bm.lo, bm.hi);
        const double chance = paradigms[k]["chance"].get<double>();
        std::printf("%-12s %-10s %24s %26s %6.1f%%\n", p.name().c_str(),
                    std::string(kMinimalPairParadigms[k]).c_str(), c1, c2, 100 * chance);
        per[std::string(kMinimalPairParadigms[k])] = {
            {"accuracy", bc.mean}, {"accuracy_ci95", {bc.lo, bc.hi}},
            {"margin", bm.mean},   {"margin_ci95", {bm.lo, bm.hi}}};
      }
      // Margins to 1e-4 nats (the item-paired comparisons read them back).
      for (double m : sc.margin)
        margins.push_back(std::isnan(m) ? json(nullptr) : json(std::round(m * 1e4) / 1e4));
      jr = {{"finite", true}, {"credit", format_credits(sc.credit)}, {"margin", margins},
            {"paradigms", per}};
    }
    std::fflush(stdout);
    results[p.name()] = jr;
    order.push_back(p.name());
  }
  std::printf("accuracy: the corpus's sentence has the highest total log-probability (a tie "
              "of m choices counts 1/m); margin: its log-probability minus the best other's; "
              "intervals: percentile bootstrap over items (10,000 resamples)\n");
  if (a.json_file.empty()) return;
  const json j = {{"task", "minimal-pairs"},
                  {"checkpoint", s.checkpoint.empty() ? json(nullptr) : json(s.checkpoint)},
                  {"step", s.step},
                  {"recipe", s.recipe.name},
                  {"items", items.size()},
                  {"items_fnv1a64", hash},
                  {"shipped_fnv1a64", tf.shipped_hash},
                  {"shipped", shipped},
                  {"seed", tf.opt.seed},
                  {"paradigms", paradigms},
                  {"skipped_items", skipped},
                  {"forward_length", rows.T},
                  {"policies", order},
                  {"results", results}};
  write_file_atomic(a.json_file, j.dump(1) + "\n");
}

}  // namespace

const std::vector<std::string>& known_tasks() {
  static const std::vector<std::string> k = {"next-sentence", "minimal-pairs"};
  return k;
}

void check_task_name(const std::string& task, const std::string& what) {
  const auto& k = known_tasks();
  if (std::find(k.begin(), k.end(), task) != k.end()) return;
  std::string list;
  for (const auto& x : k) list += (list.empty() ? "" : ", ") + x;
  throw UserError(what + " " + task + ": unknown task (known: " + list + ")");
}

std::vector<std::string> split_task_list(const std::string& tasks) {
  std::vector<std::string> out;
  size_t p = 0;
  while (p <= tasks.size()) {
    size_t e = tasks.find(',', p);
    if (e == std::string::npos) e = tasks.size();
    std::string t = tasks.substr(p, e - p);
    const size_t a = t.find_first_not_of(" \t"), b = t.find_last_not_of(" \t");
    t = a == std::string::npos ? "" : t.substr(a, b - a + 1);
    if (!t.empty() && std::find(out.begin(), out.end(), t) == out.end()) out.push_back(t);
    p = e + 1;
  }
  return out;
}

std::string join_task_list(const std::vector<std::string>& tasks) {
  std::string s;
  for (const auto& t : tasks) s += (s.empty() ? "" : ",") + t;
  return s;
}

std::string task_file_name(const std::string& task) {
  return task == "next-sentence" ? "task.json" : "task-" + task + ".json";
}

// fp4.row_scaled_activation (docs/numerics.md "Per-row reference"): X takes one current
// reference per row, so the policies that hold one per tensor (replay-d<D>, calibrated) do not
// apply: refused when asked for, left out of the default list with a note.
static void fit_row_scaled_policies(const Recipe& r, std::vector<EvalPolicy>& policies, bool defaults) {
  if (!r.row_scaled_activation) return;
  auto held = [](const EvalPolicy& p) {
    return p.kind == EvalPolicy::Kind::Replay || p.kind == EvalPolicy::Kind::Calibrated;
  };
  for (const EvalPolicy& p : policies)
    if (held(p) && !defaults)
      throw UserError("policy '" + p.name() + "': the recipe's key fp4.row_scaled_activation "
                      "gives X one current reference per row, and this policy holds one per "
                      "tensor (use none, current or llama-q8_0)");
  const auto n = policies.size();
  std::erase_if(policies, held);
  if (policies.size() != n)
    std::fprintf(stderr, "note: the recipe's fp4.row_scaled_activation takes each row's current "
                         "amax; the held policies replay-d50 and calibrated are left out\n");
}

void evaluate_checkpoint(const EvalRequest& a) {
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
  for (const auto& [flag, file] : {std::pair{"--grad-out", a.grad_out}, {"--windows-out", a.windows_out}}) {
    const fs::path dir = fs::path(file).parent_path();
    if (!file.empty() && !dir.empty() && !fs::is_directory(dir))
      throw UserError(std::string(flag) + " " + file + ": directory " + dir.string() + " does not exist");
  }
  if (a.grad_windows > 0 && a.grad_out.empty()) throw UserError("--grad-windows goes with --grad-out FILE");
  if (!a.items_out.empty() && a.task.empty()) throw UserError("--items-out goes with --task TASK");
  if (!a.task.empty()) check_task_name(a.task, "--task");
  if (!a.task.empty() && !a.grad_out.empty()) throw UserError("--task and --grad-out are separate runs of eval; give one");
  const EvalSource s = load_eval_source(a.src);
  fit_row_scaled_policies(s.recipe, policies, a.policies.empty());
  const int seq_len = s.cfg.train.seq_len, batch = s.cfg.train.micro();  // as train evaluates
  auto model = build_eval_model(s, batch);
  const TokenData data = load_eval_data(s, a.src);
  if (data.vocab_size > s.cfg.model.vocab_size)
    throw UserError("tokenizer vocab (" + std::to_string(data.vocab_size) +
                    ") exceeds model.vocab_size (" + std::to_string(s.cfg.model.vocab_size) + ")");
  const int windows = a.windows > 0 ? a.windows : s.cfg.eval.windows;
  const EvalWindows held{&data.heldout,
                         heldout_windows(int64_t(data.heldout.size()), seq_len, windows)};
  if (held.starts.empty())
    throw UserError("the held-out split has " + std::to_string(data.heldout.size()) +
                    " tokens, fewer than train.seq_len + 1 = " + std::to_string(seq_len + 1));
  if (!a.windows_out.empty()) write_windows(held, seq_len, a.windows_out);
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
  // Bits per byte need the tokenizer's pieces: pre-tokenized data without data.tokenizer
  // has none, and its bits/byte are left out (NaN, null in the JSON).
  const bool have_tok = !data.tokenizer_model.empty();
  const std::vector<int> bytes = have_tok ? token_byte_lengths(data.tokenizer_model) : std::vector<int>{};

  std::printf("%s\n", describe_eval_source(s).c_str());
  std::printf("held-out: %zu windows x %d tokens, batch %d\n", held.starts.size(), seq_len, batch);
  std::printf("%-14s %18s %10s %8s\n", "policy", "NLL (nats/token)", "bits/byte", "tokens");
  json results = json::object(), order = json::array();
  NllResult last;
  for (const auto& p : policies) {
    const NllResult r = evaluate_nll(*model, held, seq_len, batch, p, need_calib ? &calib : nullptr,
                                     have_tok ? &bytes : nullptr);
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
  if (have_tok)
    std::printf("bits/byte = total nats / ln 2 / %lld UTF-8 bytes of the scored tokens\n",
                static_cast<long long>(last.bytes));
  else
    std::printf("bits/byte: not computed (pre-tokenized data without data.tokenizer)\n");
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

void eval_checkpoint_to_json(const std::string& checkpoint, const std::string& policies,
                             const std::string& json_file, const std::string& data) {
  EvalRequest a;
  a.src.checkpoint = checkpoint;
  a.src.data = data;
  a.policies = {policies};
  a.json_file = json_file;
  evaluate_checkpoint(a);
}

void task_checkpoint_to_json(const std::string& checkpoint, const std::string& task,
                             const std::string& policies, const std::string& json_file,
                             const std::string& data) {
  EvalRequest a;
  a.src.checkpoint = checkpoint;
  a.src.data = data;
  a.task = task;
  a.policies = {policies};
  a.json_file = json_file;
  evaluate_checkpoint(a);
}

}  // namespace fp4
