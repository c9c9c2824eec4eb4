// `fp4train data`: what a run's data source holds (documents, bytes, the split, the
// vocabulary, the cache key and whether the cache is built), from one streaming pass; with
// --build it builds the cache as train would, with --export it writes the cached token
// streams as pre-tokenized files (llm.c shards or headerless ids). docs/data.md.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "fp4/base/error.h"
#include "fp4/data/data.h"
#include "fp4/nn/run_config.h"
#include "fp4/train/paths.h"
#include "fp4/train/resolved_run.h"
#include "options.h"

namespace fp4::cli {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
struct DataArgs {
  std::string config = "configs/tiny.toml";
  std::string data;
  std::vector<std::string> sets;
  bool build = false, as_json = false;
  std::string export_dir, export_format = "llmc";
};

std::string with_commas(int64_t v) {
  std::string s = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string mb(int64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f MB", double(bytes) / 1e6);
  return b;
}

bool token_format(const std::string& f) { return f == "llmc" || f == "uint16" || f == "uint32"; }

void run_data(const DataArgs& a) {
  RunRequest request;  // a run without a recipe: its data alone
  request.config = a.config;
  request.sets = a.sets;
  if (!a.data.empty()) request.taken.push_back({"data.path", "--data"});
  request.data = a.data;
  const ResolvedRun run = resolve_run(request);
  if (!run.sets.recipe.empty())
    throw UserError("fp4train data takes run-config settings only (data.*, model.vocab_size); "
                    "--set " + run.sets.recipe.front().key + " is a recipe key");
  for (const Setting& st : run.sets.config)
    if (st.key.rfind("data.", 0) != 0 && st.key != "model.vocab_size")
      throw UserError(st.arg + ": fp4train data reads only data.* and model.vocab_size; " + st.key +
                      " changes nothing it shows");
  const RunConfig& cfg = run.config;
  const DataSpec& spec = run.data;
  const fs::path& cache = run.cache_dir;
  auto progress = [](const std::string& m) { std::fprintf(stderr, "%s\n", m.c_str()); };
  const bool build = a.build || !a.export_dir.empty();
  DataSummary s = describe_data(spec, cfg.model.vocab_size, cache, progress);
  if (build && !s.cached) {
    prepare_tokens(spec, cfg.model.vocab_size, cache, progress);
    s = describe_data(spec, cfg.model.vocab_size, cache);
  }
  const bool tokens = token_format(s.format);
  if (a.as_json) {
    json j = {{"path", s.path.string()},
              {"format", s.format},
              {"files", s.files},
              {"vocab_size", s.vocab_size},
              {"token_bytes", s.token_bytes},
              {"key", s.key},
              {"cache_dir", s.cache_dir.string()},
              {"cached", s.cached},
              {"train_bytes", s.train_bytes},
              {"heldout_bytes", s.heldout_bytes}};
    if (!tokens) {
      j["train_docs"] = s.train_docs;
      j["heldout_docs"] = s.heldout_docs;
      j["skipped_records"] = s.skipped_records;
      j["heldout_rule"] = "every 10th document (index % 10 == 9)";
    } else {
      j["heldout_rule"] = spec.heldout.empty() ? "last fraction " + std::to_string(spec.heldout_fraction)
                                               : "file " + spec.heldout.string();
    }
    j["train_tokens"] = s.train_tokens >= 0 ? json(s.train_tokens) : json(nullptr);
    j["heldout_tokens"] = s.heldout_tokens >= 0 ? json(s.heldout_tokens) : json(nullptr);
    j["tokenizer"] = s.tokenizer_model.empty() ? json(nullptr) : json(s.tokenizer_model.string());
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("data:       %s (%s, %lld file%s)\n", s.path.string().c_str(), s.format.c_str(),
                static_cast<long long>(s.files), s.files == 1 ? "" : "s");
    if (!tokens) {
      std::printf("documents:  %s train, %s held-out (every 10th document is held out)\n",
                  with_commas(s.train_docs).c_str(), with_commas(s.heldout_docs).c_str());
      std::printf("text:       %s train, %s held-out (UTF-8, documents trimmed)\n",
                  mb(s.train_bytes).c_str(), mb(s.heldout_bytes).c_str());
      if (s.skipped_records > 0) {
        std::printf("skipped:    %s bad records (data.skip_bad_records)\n",
                    with_commas(s.skipped_records).c_str());
        for (const auto& e : s.first_errors) std::printf("            %s\n", e.c_str());
      }
    } else {
      std::printf("token files: %s train%s\n", mb(s.train_bytes).c_str(),
                  spec.heldout.empty()
                      ? (", held-out: the last " + std::to_string(spec.heldout_fraction) + " of the ids").c_str()
                      : (", " + mb(s.heldout_bytes) + " held-out (" + spec.heldout.string() + ")").c_str());
    }
    std::printf("vocabulary: %d (model.vocab_size; %d-byte ids in the cache)\n", s.vocab_size,
                s.token_bytes);
    std::printf("cache key:  %s\n", s.key.c_str());
    if (s.cached) {
      std::printf("cache:      %s (built)\n", s.cache_dir.string().c_str());
      std::printf("tokens:     %s train, %s held-out\n", with_commas(s.train_tokens).c_str(),
                  with_commas(s.heldout_tokens).c_str());
    } else {
      std::printf("cache:      %s (not built: `fp4train data --build` or the first train run builds it)\n",
                  s.cache_dir.string().c_str());
    }
    std::printf("tokenizer:  %s\n", s.tokenizer_model.empty()
                                        ? (tokens ? "none (data.tokenizer; needed only by sample and text tasks)"
                                                  : "trained when the cache is built")
                                        : s.tokenizer_model.string().c_str());
  }
  if (!a.export_dir.empty()) {
    const TokenData td = prepare_tokens(spec, cfg.model.vocab_size, cache);
    const fs::path out(a.export_dir);
    std::error_code ec;
    fs::create_directories(out, ec);
    if (ec) throw UserError("cannot create --export directory " + out.string() + ": " + ec.message());
    write_token_file(td.train, out / "train.bin", a.export_format);
    write_token_file(td.heldout, out / "val.bin", a.export_format);
    if (!td.tokenizer_model.empty()) {
      fs::copy_file(td.tokenizer_model, out / "tokenizer.model", fs::copy_options::overwrite_existing, ec);
      if (ec) throw UserError("cannot copy the tokenizer to " + out.string() + ": " + ec.message());
    }
    std::fprintf(a.as_json ? stderr : stdout,
                 "exported %s: train.bin (%zu ids), val.bin (%zu ids)%s, format %s\n",
                 out.string().c_str(), td.train.size(), td.heldout.size(),
                 td.tokenizer_model.empty() ? "" : ", tokenizer.model", a.export_format.c_str());
  }
}
}  // namespace

void register_data(CLI::App& app) {
  auto a = std::make_shared<DataArgs>();
  auto* c = app.add_subcommand(
      "data",
      "What a run's data source holds, before a long run: format, files, documents and bytes\n"
      "of each split, the vocabulary, the cache key and whether the token cache is built (and\n"
      "then its token counts). One streaming pass over the source; nothing is written unless\n"
      "--build or --export. Sources (data.format, docs/data.md): a text file or directory,\n"
      "JSONL or JSONL.zst files (data.text_field, data.skip_bad_records), pre-tokenized llm.c\n"
      "shards or headerless uint16 / uint32 ids (data.heldout or data.heldout_fraction,\n"
      "data.tokenizer). Example:\n"
      "  fp4train data --config configs/tiny.toml --set data.path='\"corpus/\"' --build");
  c->add_option("--config", a->config, "Run config TOML whose [data] and model.vocab_size are used")
      ->capture_default_str();
  c->add_option("--data", a->data, "Data path instead of the config's data.path");
  c->add_flag("--build", a->build, "Build the token cache if it is not built (as train would)");
  c->add_flag("--json", a->as_json, "Print the description as JSON");
  c->add_option("--export", a->export_dir,
                "Write the cached streams to DIR/train.bin and DIR/val.bin (+ tokenizer.model) as "
                "pre-tokenized files (builds the cache first)");
  c->add_option("--export-format", a->export_format,
                "llmc (llm.c's 1024-byte header; 2- or 4-byte ids as the vocabulary needs), "
                "uint16 or uint32 (headerless, nanoGPT's layout for uint16)")
      ->capture_default_str()
      ->check(CLI::IsMember({"llmc", "uint16", "uint32"}));
  add_set_option(c, a->sets, " (run-config keys: data.*, model.vocab_size)");
  c->callback([a] { run_data(*a); });
}

}  // namespace fp4::cli
