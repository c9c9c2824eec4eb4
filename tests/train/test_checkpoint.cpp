// Checkpoints: bit-exact save/load, rejection of damaged files with the reason, fallback to
// the previous good checkpoint, pruning; and in-process resume of a micro model on a slice
// of the Brown corpus, bit for bit against an uninterrupted run (fp32, ue5m3-b16 with held
// amax references across the stop point, and a negative control without them).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "fp4/train/checkpoint.h"
#include "fp4/data/data.h"
#include "fp4/base/error.h"
#include "fp4/base/safetensors.h"
#include "fp4/train/train.h"

namespace fs = std::filesystem;
using namespace fp4;
using json = nlohmann::json;

namespace {
struct Scratch {
  fs::path dir = fs::temp_directory_path() / ("fp4test_ckpt_" + std::to_string(::getpid()));
  Scratch() { fs::create_directories(dir); }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
} g_scratch;

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

Checkpoint sample_checkpoint(int64_t step, size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  Checkpoint c;
  c.step = step;
  c.config_toml = run_config_to_toml(RunConfig{});
  Recipe r;
  r.name = "unit";
  c.recipe_toml = recipe_to_toml(r);
  for (size_t i = 0; i < n; ++i) {
    c.params.push_back(d(g));
    c.adam_m.push_back(d(g) * 1e-3f);
    c.adam_v.push_back(std::abs(d(g)) * 1e-7f);
  }
  if (n >= 4) {  // bit patterns that a text round trip could lose
    c.params[0] = -0.f;
    c.params[1] = std::numeric_limits<float>::denorm_min();
    c.params[2] = std::numeric_limits<float>::quiet_NaN();
    c.adam_v[3] = 1e-40f;
  }
  for (int64_t s = 0; s < step; ++s) c.losses.push_back(8.0 - 0.1 * s + 1e-17 * s);
  c.sampler_draws = 12345678901234ull;
  c.references = {{"layers.0.mixer.q_proj", 0, true, 1, 3.1415927f},
                  {"layers.3.mixer.down_proj", 2, true, step, 1e-40f},  // subnormal amax
                  {"layers.3.mixer.down_proj", 4, true, 1, 0.f}};
  c.train_seconds = 1.0 / 3;
  c.wall_seconds = 2.5;
  c.val_nll = 5.123456789012345;  // val_nll_quant stays NaN: no evaluation of it
  c.telemetry_digest = "numerics | worst \"quoted\" \\ line";
  c.data_key = "abc123";
  c.config_name = "micro";
  c.save_every = 7;
  c.keep_checkpoints = 2;
  c.log_every = 5;
  c.save_amax = false;
  return c;
}

std::string load_error(const fs::path& p) {
  try {
    load_checkpoint(p);
  } catch (const UserError& e) {
    return e.what();
  }
  return "(loaded)";
}

void expect_error(const fs::path& p, const std::string& want) {
  const std::string e = load_error(p);
  EXPECT_NE(e.find(want), std::string::npos) << "wanted '" << want << "' in: " << e;
  EXPECT_NE(e.find(p.string()), std::string::npos) << "the message must name the file: " << e;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream o;
  o << f.rdbuf();
  return o.str();
}
void spit(const fs::path& p, const std::string& s) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << s;
}

TEST(Checkpoint, RoundTripIsBitExact) {
  const Checkpoint c = sample_checkpoint(5, 1000, 1);
  const fs::path p = g_scratch.dir / "rt.safetensors";
  save_checkpoint(p, c);
  EXPECT_FALSE(fs::exists(p.string() + ".tmp"));
  const Checkpoint u = load_checkpoint(p);
  EXPECT_EQ(u.step, 5);
  EXPECT_EQ(u.config_toml, c.config_toml);
  EXPECT_EQ(u.recipe_toml, c.recipe_toml);
  EXPECT_TRUE(same_bits(u.params, c.params));
  EXPECT_TRUE(same_bits(u.adam_m, c.adam_m));
  EXPECT_TRUE(same_bits(u.adam_v, c.adam_v));
  EXPECT_TRUE(same_bits(u.losses, c.losses));
  EXPECT_EQ(u.sampler_draws, c.sampler_draws);
  ASSERT_EQ(u.references.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(u.references[i].linear, c.references[i].linear);
    EXPECT_EQ(u.references[i].role, c.references[i].role);
    EXPECT_EQ(u.references[i].has_value, c.references[i].has_value);
    EXPECT_EQ(u.references[i].last_refresh, c.references[i].last_refresh);
    EXPECT_EQ(std::memcmp(&u.references[i].held, &c.references[i].held, 4), 0) << i;
  }
  EXPECT_EQ(u.train_seconds, c.train_seconds);
  EXPECT_EQ(u.wall_seconds, c.wall_seconds);
  EXPECT_EQ(u.val_nll, c.val_nll);
  EXPECT_TRUE(std::isnan(u.val_nll_quant));
  EXPECT_EQ(u.telemetry_digest, c.telemetry_digest);
  EXPECT_EQ(u.data_key, c.data_key);
  EXPECT_EQ(u.config_name, c.config_name);
  EXPECT_EQ(u.save_every, 7);
  EXPECT_EQ(u.keep_checkpoints, 2);
  EXPECT_EQ(u.log_every, 5);
  EXPECT_FALSE(u.save_amax);

  // A plain safetensors file: Python tools can read the tensors by name.
  const std::string bytes = slurp(p);
  uint64_t hn = 0;
  for (int i = 0; i < 8; ++i) hn |= uint64_t(uint8_t(bytes[i])) << (8 * i);
  const json h = json::parse(bytes.substr(8, hn));
  EXPECT_EQ(h["params"]["dtype"], "F32");
  EXPECT_EQ(h["params"]["shape"], json({1000}));
  EXPECT_EQ(h["losses"]["dtype"], "F64");
  EXPECT_EQ(h["__metadata__"]["format"], "fp4train.checkpoint.v1");
  EXPECT_EQ((8 + hn) % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + hn + 5 * 8 + 3 * 1000 * 4);
}

// A checkpoint of the Llama-only version (its stored config has n_layers, no pattern) is
// refused with the reason: its recipe rules counted layers, not hybrid blocks.
TEST(Checkpoint, PreHybridCheckpointIsRefused) {
  Checkpoint c = sample_checkpoint(3, 64, 2);
  const size_t at = c.config_toml.find("\npattern = ");
  ASSERT_NE(at, std::string::npos) << c.config_toml;
  const size_t end = c.config_toml.find('\n', at + 1);
  c.config_toml.replace(at, end - at, "\nn_layers = 2");  // as run_config_to_toml wrote it before
  const fs::path p = g_scratch.dir / "old.safetensors";
  save_checkpoint(p, c);
  expect_error(p, "written before the hybrid model");
}

TEST(Checkpoint, DamagedFilesAreRejectedWithTheReason) {
  const fs::path good = g_scratch.dir / "good.safetensors";
  save_checkpoint(good, sample_checkpoint(3, 64, 2));
  const std::string bytes = slurp(good);
  uint64_t hn = 0;
  for (int i = 0; i < 8; ++i) hn |= uint64_t(uint8_t(bytes[i])) << (8 * i);
  const fs::path p = g_scratch.dir / "bad.safetensors";

  spit(p, bytes.substr(0, bytes.size() - 5));  // truncated inside adam_v
  expect_error(p, "truncated");
  spit(p, bytes.substr(0, 8 + hn / 2));  // truncated inside the header
  expect_error(p, "exceeds the file");
  spit(p, bytes.substr(0, 5));
  expect_error(p, "shorter than 8 bytes");
  // A text file (here a run config) where a checkpoint belongs: said so, not "header length
  // 2459032605894205806 exceeds the file".
  spit(p, "# Tiny Llama-style model\n[model]\nvocab_size = 4096\n");
  expect_error(p, "not a safetensors file");
  expect_error(p, "starts with text \"# Tiny L\"");
  {
    std::string b = bytes;  // header length far past the end of the file
    b[6] = 1;
    spit(p, b);
    expect_error(p, "header length");
  }
  {
    std::string b = bytes;  // a flipped byte in the JSON syntax
    b[8] = '[';
    spit(p, b);
    expect_error(p, "not JSON");
  }
  {
    std::string b = bytes;  // a flipped byte inside a metadata value: step 3 -> 4
    const size_t at = b.find("\"step\":\"3\"");
    ASSERT_NE(at, std::string::npos);
    b[at + 8] = '4';
    spit(p, b);
    expect_error(p, "checksum mismatch");
  }
  {
    std::string b = bytes;  // a flipped bit in the tensor data
    b[8 + hn + 100] ^= 0x10;
    spit(p, b);
    expect_error(p, "checksum mismatch");
  }
  // Hand-made files: sizes that disagree, a wrong dtype, missing metadata.
  std::vector<float> a(10), m(9);
  std::vector<double> l;
  auto write = [&](const std::vector<safetensors::TensorOut>& t, const json& meta) {
    safetensors::write_file(p, safetensors::make_header(t, meta), t);
  };
  const json meta = {{"format", "fp4train.checkpoint.v1"}};
  write({{"losses", "F64", {0}, l.data(), 0},
         {"params", "F32", {10}, a.data(), 40},
         {"adam_m", "F32", {9}, m.data(), 36},
         {"adam_v", "F32", {10}, a.data(), 40}},
        meta);
  expect_error(p, "tensor 'adam_m' has 9 elements but 'params' has 10");
  write({{"losses", "F64", {0}, l.data(), 0},
         {"params", "F64", {5}, a.data(), 40},
         {"adam_m", "F32", {10}, a.data(), 40},
         {"adam_v", "F32", {10}, a.data(), 40}},
        meta);
  expect_error(p, "tensor 'params' has dtype \"F64\", expected \"F32\"");
  write({{"params", "F32", {10}, a.data(), 40}}, json::object());
  expect_error(p, "__metadata__ is missing");
  write({{"losses", "F64", {0}, l.data(), 0},
         {"params", "F32", {10}, a.data(), 40},
         {"adam_m", "F32", {10}, a.data(), 40},
         {"adam_v", "F32", {10}, a.data(), 40}},
        meta);
  expect_error(p, "metadata 'checksum' is missing");
  write({{"params", "F32", {10}, a.data(), 40}}, {{"format", "something.else"}});
  expect_error(p, "metadata 'format' is 'something.else'");
  EXPECT_NE(load_error(g_scratch.dir / "none.safetensors").find("cannot open"), std::string::npos);
  EXPECT_EQ(load_error(good), "(loaded)");
}

// checkpoint_to_bytes is what save_checkpoint writes, and checkpoint_from_bytes loads it.
TEST(Checkpoint, InMemoryBytesAreTheFileBytes) {
  const fs::path p = g_scratch.dir / "mem.safetensors";
  const Checkpoint c = sample_checkpoint(3, 16, 5);
  save_checkpoint(p, c);
  const std::string file = slurp(p);
  EXPECT_EQ(checkpoint_to_bytes(c), file);
  EXPECT_EQ(checkpoint_to_bytes(checkpoint_from_bytes(file, "mem")), file);
  EXPECT_EQ(checkpoint_to_bytes(load_checkpoint(p)), file);
}

// Integer and float fields of the metadata JSON behind a valid checksum (found by the fuzz
// target tests/fuzz/fuzz_checkpoint.cpp): checked before conversion, so a non-integer role
// (1e300: an out-of-range float-to-int conversion) or one that would wrap (2^32 + 1 read as
// 1) is refused with the field named, not converted.
TEST(Checkpoint, OutOfRangeMetadataNumbersAreRefused) {
  Checkpoint c = sample_checkpoint(3, 4, 6);
  c.references = {{"layers.0.mixer.q_proj", 0, true, 1, 2.5f}};
  const std::string good = checkpoint_to_bytes(c);
  // Change one metadata JSON text and store a matching checksum (as checkpoint.cpp computes it).
  auto edit = [&](const char* key, const std::function<void(json&)>& change) {
    auto f = safetensors::File::from_bytes(good, "x", "x");
    json h = f.header();
    json v = json::parse(h["__metadata__"][key].get<std::string>());
    change(v);
    h["__metadata__"][key] = v.dump();
    h["__metadata__"].erase("checksum");
    const std::string d = h.dump();
    uint64_t x = fnv1a64(d.data(), d.size());
    for (const char* t : {"losses", "params", "adam_m", "adam_v"}) {
      const auto b = f.tensor(t, std::string(t) == "losses" ? "F64" : "F32");
      x = fnv1a64(b.data(), b.size(), x);
    }
    char hex[20];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(x));
    h["__metadata__"]["checksum"] = hex;
    return safetensors::header_bytes(h) +
           std::string(reinterpret_cast<const char*>(f.data().data()), f.data().size());
  };
  auto error_of = [](const std::string& bytes) {
    try {
      checkpoint_from_bytes(bytes, "edited.safetensors");
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("(loaded)");
  };
  EXPECT_EQ(error_of(edit("references", [](json&) {})), "(loaded)");  // the editing itself
  EXPECT_NE(error_of(edit("references", [](json& r) { r[0]["role"] = 1e300; }))
                .find("'role' = 1e+300 is not an integer in [0, 6]"), std::string::npos);
  EXPECT_NE(error_of(edit("references", [](json& r) { r[0]["role"] = 4294967297ull; }))
                .find("'role' = 4294967297 is not an integer in [0, 6]"), std::string::npos);
  EXPECT_NE(error_of(edit("references", [](json& r) { r[0]["last_refresh"] = 4; }))
                .find("'last_refresh' = 4 is not an integer in [0, 3]"), std::string::npos);
  EXPECT_NE(error_of(edit("references", [](json& r) { r[0]["held"] = 1e300; })).find("held amax"),
            std::string::npos);
  EXPECT_NE(error_of(edit("references", [](json& r) { r[0] = 7; })).find("entry 0 is not a JSON object"),
            std::string::npos);
  EXPECT_NE(error_of(edit("trainer", [](json& t) { t["save_every"] = 4294967297ull; }))
                .find("'save_every' = 4294967297 is not an integer in [0, 2147483647]"),
            std::string::npos);
  EXPECT_NE(error_of(edit("trainer", [](json& t) { t["log_every"] = 0; }))
                .find("'log_every' = 0 is not an integer in [1, 2147483647]"), std::string::npos);
}

TEST(Checkpoint, ResolveFallsBackToTheOlderGoodCheckpoint) {
  const fs::path run = g_scratch.dir / "run_fallback";
  fs::create_directories(run / "checkpoints");
  for (int s : {2, 4, 6}) save_checkpoint(run / "checkpoints" / checkpoint_file_name(s), sample_checkpoint(s, 32, s));
  std::string warn;
  EXPECT_EQ(resolve_checkpoint(run, &warn).filename(), "step_00000006.safetensors");
  EXPECT_EQ(warn, "");
  // Newest truncated, the one before flipped: step 2 is used, both skips are named.
  const fs::path p6 = run / "checkpoints" / "step_00000006.safetensors";
  const fs::path p4 = run / "checkpoints" / "step_00000004.safetensors";
  fs::resize_file(p6, fs::file_size(p6) - 1);
  std::string b = slurp(p4);
  b[b.size() - 1] ^= 1;
  spit(p4, b);
  fs::path chosen;
  const Checkpoint c = load_newest_checkpoint(run, &chosen, &warn);
  EXPECT_EQ(c.step, 2);
  EXPECT_EQ(chosen.filename(), "step_00000002.safetensors");
  EXPECT_NE(warn.find("step_00000006.safetensors"), std::string::npos) << warn;
  EXPECT_NE(warn.find("truncated"), std::string::npos) << warn;
  EXPECT_NE(warn.find("step_00000004.safetensors"), std::string::npos) << warn;
  EXPECT_NE(warn.find("checksum mismatch"), std::string::npos) << warn;
  // A file argument is returned as it is; nothing usable is an error naming the reasons.
  EXPECT_EQ(resolve_checkpoint(p4), p4);
  fs::resize_file(run / "checkpoints" / "step_00000002.safetensors", 10);
  try {
    resolve_checkpoint(run);
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("no usable checkpoint"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("train it again from step 0"), std::string::npos) << e.what();
  }
  EXPECT_THROW(resolve_checkpoint(g_scratch.dir / "no_such_run"), UserError);
}

TEST(Checkpoint, PruneKeepsTheNewest) {
  const fs::path run = g_scratch.dir / "run_prune";
  fs::create_directories(run / "checkpoints");
  for (int s : {1, 2, 3, 10, 11}) save_checkpoint(run / "checkpoints" / checkpoint_file_name(s), sample_checkpoint(s, 8, s));
  spit(run / "checkpoints" / "step_00000012.safetensors.tmp", "partial");
  spit(run / "checkpoints" / "step_00000013.safetensors.corrupt", "x");
  spit(run / "checkpoints" / "notes.txt", "x");
  prune_checkpoints(run, 2);
  const auto left = list_checkpoints(run);
  ASSERT_EQ(left.size(), 2u);
  EXPECT_EQ(left[0].filename(), "step_00000010.safetensors");  // numeric order, not just names
  EXPECT_EQ(left[1].filename(), "step_00000011.safetensors");
  EXPECT_TRUE(fs::exists(run / "checkpoints" / "notes.txt"));
  EXPECT_THROW(prune_checkpoints(run, 0), std::invalid_argument);
}

TEST(AppendFile, AppendsWholeRecordsAndTruncatesOnRequest) {
  const fs::path f = g_scratch.dir / "append.jsonl";
  auto read = [&] {
    std::ifstream in(f, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  {
    AppendFile a;
    EXPECT_FALSE(a.is_open());
    EXPECT_THROW(a.append("x\n"), std::logic_error);
    a.open(f, /*truncate=*/true);
    a.append("{\"step\":1}\n");
    a.append("{\"step\":2}\n");
    a.sync();
  }
  EXPECT_EQ(read(), "{\"step\":1}\n{\"step\":2}\n");
  {
    AppendFile a;
    a.open(f, /*truncate=*/false);  // a resume appends after what is there
    a.append("{\"step\":3}\n");
  }
  EXPECT_EQ(read(), "{\"step\":1}\n{\"step\":2}\n{\"step\":3}\n");
  {
    AppendFile a;
    a.open(f, /*truncate=*/true);
    a.append("z\n");
  }
  EXPECT_EQ(read(), "z\n");
  AppendFile bad;
  try {
    bad.open(g_scratch.dir / "no" / "such" / "dir.jsonl", false);
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("dir.jsonl"), std::string::npos) << e.what();
  }
}

TEST(AppendFile, AFullDiskThrowsIoErrorNamingTheFileAndTheReason) {
  // /dev/full fails every write with ENOSPC, as a full file system does.
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  AppendFile a;
  a.open("/dev/full", false);
  try {
    a.append("{\"step\":1}\n");
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("/dev/full"), std::string::npos) << m;
    EXPECT_NE(m.find(std::strerror(ENOSPC)), std::string::npos) << m;
  }
}

TEST(Checkpoint, StoredConfigAndRecipeReloadExactly) {
  RunConfig cfg;
  cfg.train.lr = 0.0012345678901234567;  // more digits than a 10-digit printout keeps
  cfg.train.beta2 = 0.95 + 1e-15;
  cfg.model.init_std = 0.0234567891f;
  cfg.progress_seconds = 1.0 / 3;
  const RunConfig back = run_config_from_text(run_config_to_toml(cfg), "x");
  EXPECT_EQ(back.train.lr, cfg.train.lr);
  EXPECT_EQ(back.train.beta2, cfg.train.beta2);
  EXPECT_EQ(back.model.init_std, cfg.model.init_std);
  EXPECT_EQ(back.progress_seconds, cfg.progress_seconds);
  EXPECT_EQ(run_config_to_toml(back), run_config_to_toml(cfg));
  const Recipe r = load_recipe("ue5m3-b16", fs::path(FP4_SOURCE_DIR) / "configs/recipes");
  EXPECT_EQ(recipe_to_toml(recipe_from_text(recipe_to_toml(r), "x")), recipe_to_toml(r));
  try {
    run_config_from_text("[train]\nlr = \"fast\"\n", "ckpt.safetensors (config_toml)");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("ckpt.safetensors (config_toml): key 'train.lr'"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(recipe_from_text("[linear\n", "w"), UserError);
}

// ---------------------------------------------------------------------------------------
// In-process resume on real text.

const TokenData& micro_data() {
  static const TokenData data = [] {
    const fs::path text = g_scratch.dir / "text";
    fs::create_directories(text);
    std::vector<fs::path> docs;
    for (auto& e : fs::directory_iterator(fs::path(FP4_SOURCE_DIR) / "data/brown/text"))
      docs.push_back(e.path());
    std::sort(docs.begin(), docs.end());
    if (docs.size() < 20) throw std::runtime_error("Brown corpus missing (scripts/setup)");
    for (size_t i = 0; i < 20; ++i) fs::copy_file(docs[i], text / docs[i].filename());
    return prepare_tokens(text, 512, g_scratch.dir / "cache");
  }();
  return data;
}

RunConfig micro_config(int steps) {
  RunConfig c;
  c.model.vocab_size = 512;
  c.model.d_model = 32;
  c.model.n_layers = 2;
  c.model.n_heads = 2;
  c.model.mlp_hidden = 64;
  c.train.seq_len = 32;
  c.train.batch_size = 4;
  c.train.steps = steps;
  c.train.lr = 1e-2;
  c.train.warmup_steps = 2;
  c.eval.interval = 2;
  c.eval.windows = 4;
  c.progress_seconds = 3600;
  c.telemetry_interval = 2;
  return c;
}

struct RunResult {
  TrainSummary summary;
  Checkpoint final_ckpt;
  std::vector<json> metrics;
  json summary_json;
};

RunResult finish(const fs::path& dir, const TrainSummary& s) {
  RunResult r;
  r.summary = s;
  r.final_ckpt = load_newest_checkpoint(dir);
  std::ifstream f(dir / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) r.metrics.push_back(json::parse(line));
  r.summary_json = json::parse(std::ifstream(dir / "summary.json"));
  return r;
}

RunResult run_uninterrupted(const RunConfig& cfg, const Recipe& recipe, const std::string& name) {
  TrainOptions o;
  o.out_dir = g_scratch.dir / name;
  o.quiet = true;
  return finish(o.out_dir, train(cfg, recipe, micro_data(), o));
}

// Train to `stop` (checkpoints every `save_every`), as if killed there; then resume from the
// newest checkpoint like `fp4train train --resume` does.
RunResult run_interrupted(const RunConfig& cfg, const Recipe& recipe, const std::string& name,
                          int save_every, int stop, bool save_amax = true, int log_every = 1) {
  TrainOptions o;
  o.out_dir = g_scratch.dir / name;
  o.quiet = true;
  o.save_every = save_every;
  o.save_amax = save_amax;
  o.log_every = log_every;
  o.stop_after = stop;
  const TrainSummary first = train(cfg, recipe, micro_data(), o);
  EXPECT_TRUE(first.stopped);
  EXPECT_FALSE(fs::exists(o.out_dir / "summary.json"));
  EXPECT_TRUE(fs::exists(o.out_dir / "tokenizer.model"));
  // A write cut off by the kill: an incomplete last metrics line.
  std::ofstream(o.out_dir / "metrics.jsonl", std::ios::app) << "{\"step\": " << stop + 1 << ", \"lo";
  const Checkpoint ck = load_newest_checkpoint(o.out_dir);
  o.stop_after = 0;
  o.resume_from = &ck;
  const TrainSummary s = train(cfg, recipe, micro_data(), o);
  EXPECT_EQ(s.resumed_from, ck.step);
  return finish(o.out_dir, s);
}

// Everything but timings, bit for bit.
void expect_identical(const RunResult& a, const RunResult& b, bool all_lines = true) {
  EXPECT_TRUE(same_bits(a.summary.losses, b.summary.losses));
  EXPECT_EQ(a.summary.first_loss, b.summary.first_loss);
  EXPECT_EQ(a.summary.final_window_loss, b.summary.final_window_loss);
  EXPECT_EQ(a.summary.heldout_nll, b.summary.heldout_nll);
  EXPECT_EQ(a.summary.heldout_nll_quant, b.summary.heldout_nll_quant);
  EXPECT_EQ(a.final_ckpt.step, b.final_ckpt.step);
  EXPECT_TRUE(same_bits(a.final_ckpt.params, b.final_ckpt.params)) << "final parameters differ";
  EXPECT_TRUE(same_bits(a.final_ckpt.adam_m, b.final_ckpt.adam_m));
  EXPECT_TRUE(same_bits(a.final_ckpt.adam_v, b.final_ckpt.adam_v));
  EXPECT_EQ(a.final_ckpt.sampler_draws, b.final_ckpt.sampler_draws);
  for (const char* k : {"first_loss", "final_window_loss", "heldout_nll", "heldout_nll_quant", "steps"})
    EXPECT_EQ(a.summary_json[k], b.summary_json[k]) << k;
  if (all_lines) {
    ASSERT_EQ(a.metrics.size(), b.metrics.size());
  }
  size_t j = 0;
  for (const json& line : b.metrics) {  // every line of b matches a's line of the same step
    while (j < a.metrics.size() && a.metrics[j]["step"] != line["step"]) ++j;
    ASSERT_LT(j, a.metrics.size()) << "step " << line["step"] << " missing or out of order";
    for (const char* k : {"loss", "grad_norm", "lr", "tokens", "val_nll", "val_nll_quant", "telemetry"})
      EXPECT_EQ(a.metrics[j].contains(k) ? a.metrics[j][k] : json(),
                line.contains(k) ? line[k] : json())
          << "step " << line["step"] << " field " << k;
  }
}

Recipe recipe_named(const std::string& name) {
  return load_recipe(name, fs::path(FP4_SOURCE_DIR) / "configs/recipes");
}

TEST(Resume, Fp32IsBitExact) {
  const RunConfig cfg = micro_config(6);
  const Recipe r = recipe_named("fp32");
  const RunResult a = run_uninterrupted(cfg, r, "fp32_a");
  // Killed after step 3 with checkpoints every 2: resumes from step 2, redoes step 3.
  const RunResult b = run_interrupted(cfg, r, "fp32_b", 2, 3);
  expect_identical(a, b);
  EXPECT_EQ(b.summary_json["resumed_from_step"], 2);
  EXPECT_EQ(a.metrics.size(), 6u);
  // The final checkpoint always exists, older ones beyond keep_checkpoints are gone.
  EXPECT_EQ(list_checkpoints(g_scratch.dir / "fp32_a").size(), 1u);
  EXPECT_EQ(list_checkpoints(g_scratch.dir / "fp32_b").size(), 3u);  // steps 2, 4, 6
}

TEST(Resume, HeldAmaxReferencesCarryOverBitExact) {
  // ue5m3-b16 (D = 50): the references sampled at step 1 are used through step 6, so the
  // resumed half must get them from the checkpoint.
  const RunConfig cfg = micro_config(6);
  const Recipe r = recipe_named("ue5m3-b16");
  ASSERT_EQ(r.amax_interval, 50);
  const RunResult a = run_uninterrupted(cfg, r, "ue_a");
  const RunResult b = run_interrupted(cfg, r, "ue_b", 3, 3);
  expect_identical(a, b);
  ASSERT_FALSE(b.final_ckpt.references.empty());
  for (const auto& ref : b.final_ckpt.references) EXPECT_EQ(ref.last_refresh, 1) << ref.linear;

  // D = 4 (refreshes at 1 and 5): stop at 2, so the resumed part crosses a refresh; metrics
  // every 4 steps (plus evaluation/telemetry steps) must not lose the summary's inputs.
  Recipe r4 = r;
  r4.amax_interval = 4;
  const RunResult a4 = run_uninterrupted(cfg, r4, "ue4_a");
  const RunResult b4 = run_interrupted(cfg, r4, "ue4_b", 1, 2, true, 4);
  expect_identical(a4, b4, /*all_lines=*/false);
  for (const auto& ref : b4.final_ckpt.references) EXPECT_EQ(ref.last_refresh, 5) << ref.linear;

  // Negative control: without the saved references the resumed run refreshes them at its
  // first step and departs from the uninterrupted one.
  const RunResult c = run_interrupted(cfg, r, "ue_c", 3, 3, /*save_amax=*/false);
  EXPECT_TRUE(same_bits(std::vector<double>(a.summary.losses.begin(), a.summary.losses.begin() + 3),
                        std::vector<double>(c.summary.losses.begin(), c.summary.losses.begin() + 3)));
  EXPECT_NE(a.summary.losses[3], c.summary.losses[3]);
}

// ---- Four Over Six recipes (docs/recipes.md "Four Over Six"): a tiny run resumes bit-exactly,
// and 4/6 changes the run (against its base recipe).
TEST(Resume, FourOverSixRecipesAreBitExact) {
  const RunConfig cfg = micro_config(4);
  for (const std::string name : {"nvfp4-te-4over6", "ue5m3-b16-4over6"}) {
    const Recipe r = recipe_named(name);
    const RunResult a = run_uninterrupted(cfg, r, name + "_a");
    const RunResult b = run_interrupted(cfg, r, name + "_b", 2, 3);
    expect_identical(a, b);
    const RunResult base = run_uninterrupted(cfg, recipe_named(name.substr(0, name.size() - 7)),
                                             name + "_base");
    EXPECT_NE(a.summary.losses.back(), base.summary.losses.back()) << name;
  }
}

// train.sr_seed re-keys the SR draws and nothing else: -1 (the default) and sr_seed = seed give
// the same bits; another sr_seed leaves step 1's loss (its forward has no SR: SR is on dY only,
// NUMERICS.md) and a recipe without SR unchanged, and changes the SR recipe's later steps.
TEST(SrSeed, ChangesTheSrDrawsAndNothingElse) {
  RunConfig cfg = micro_config(3);
  const Recipe ue = recipe_named("ue5m3-b16"), bf = recipe_named("bf16");
  const RunResult base = run_uninterrupted(cfg, ue, "sr_base");
  cfg.train.sr_seed = int64_t(cfg.train.seed);
  const RunResult same = run_uninterrupted(cfg, ue, "sr_same");
  EXPECT_TRUE(same_bits(base.summary.losses, same.summary.losses));
  EXPECT_TRUE(same_bits(base.final_ckpt.params, same.final_ckpt.params));
  cfg.train.sr_seed = 12345;
  const RunResult other = run_uninterrupted(cfg, ue, "sr_other");
  EXPECT_EQ(base.summary.losses[0], other.summary.losses[0]);
  EXPECT_NE(base.summary.losses[2], other.summary.losses[2]);
  EXPECT_FALSE(same_bits(base.final_ckpt.params, other.final_ckpt.params));
  EXPECT_EQ(other.summary_json["sr_seed"], 12345);
  EXPECT_FALSE(base.summary_json.contains("sr_seed"));
  // The resolved config carries it (a resume must reproduce the same draws) and re-parses.
  const RunConfig back = run_config_from_text(run_config_to_toml(cfg), "sr_seed config");
  EXPECT_EQ(back.train.sr_seed, 12345);
  EXPECT_EQ(run_config_from_text(run_config_to_toml(micro_config(3)), "default").train.sr_seed, -1);
  // bf16 has no SR: any sr_seed, the same run.
  RunConfig c0 = micro_config(3);
  const RunResult b0 = run_uninterrupted(c0, bf, "sr_bf_a");
  c0.train.sr_seed = 999;
  const RunResult b1 = run_uninterrupted(c0, bf, "sr_bf_b");
  EXPECT_TRUE(same_bits(b0.summary.losses, b1.summary.losses));
  EXPECT_TRUE(same_bits(b0.final_ckpt.params, b1.final_ckpt.params));
}

// train.final_window on a tiny run of 8 steps: the default gives max(1, 8 / 10) = 1 step (as
// before the key existed), 3 gives the last 3 steps, 0.3 gives floor(2.4) = 2. The
// final-window loss is the mean of those steps' losses in metrics.jsonl, summary.json names
// the window, and the key changes nothing else (the losses are the same bits).
TEST(FinalWindow, StepsAndFractionGiveTheirWindowOnATinyRun) {
  const Recipe r = recipe_named("fp32");
  struct Case {
    const char* name;
    double final_window;
    int want_window;
  };
  std::vector<double> losses0;
  for (const Case& k : {Case{"fw_default", 0.1, 1}, Case{"fw_steps", 3, 3}, Case{"fw_frac", 0.3, 2}}) {
    RunConfig cfg = micro_config(8);
    cfg.train.final_window = k.final_window;
    const RunResult res = run_uninterrupted(cfg, r, k.name);
    ASSERT_EQ(res.metrics.size(), 8u) << k.name;
    EXPECT_EQ(res.summary_json["final_window_steps"], k.want_window) << k.name;
    EXPECT_EQ(res.summary.final_window_steps, k.want_window) << k.name;
    double s = 0;  // the last want_window logged losses, summed in step order as the trainer does
    for (int step = 8 - k.want_window + 1; step <= 8; ++step)
      s += res.metrics[size_t(step - 1)]["loss"].get<double>();
    EXPECT_DOUBLE_EQ(res.summary_json["final_window_loss"].get<double>(), s / k.want_window) << k.name;
    EXPECT_DOUBLE_EQ(res.summary.final_window_loss, s / k.want_window) << k.name;
    if (losses0.empty())
      losses0 = res.summary.losses;
    else
      EXPECT_TRUE(same_bits(losses0, res.summary.losses)) << k.name;
  }
}

TEST(Resume, RefusesACheckpointOfAnotherRun) {
  const RunConfig cfg = micro_config(4);
  const Recipe r = recipe_named("fp32");
  TrainOptions o;
  o.out_dir = g_scratch.dir / "refuse";
  o.quiet = true;
  o.save_every = 2;
  o.stop_after = 2;
  train(cfg, r, micro_data(), o);
  const Checkpoint ck = load_newest_checkpoint(o.out_dir);
  o.stop_after = 0;
  o.resume_from = &ck;
  RunConfig other = cfg;
  other.train.seed = 2;
  try {
    train(other, r, micro_data(), o);
    FAIL() << "a changed seed must be refused";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("config_toml"), std::string::npos) << e.what();
  }
  try {
    train(cfg, recipe_named("bf16"), micro_data(), o);
    FAIL() << "a changed recipe must be refused";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("recipe_toml"), std::string::npos) << e.what();
  }
}

// A checkpoint names its data by the token-cache key. Data whose key differs is refused,
// unless its cache lists the checkpoint's key among its aliases (the version-1 key of an
// unchanged text cache, docs/data.md "The token cache"): then the run resumes as if
// uninterrupted.
TEST(Resume, AcceptsTheDataUnderAnAliasOfItsKey) {
  const RunConfig cfg = micro_config(4);
  const Recipe r = recipe_named("fp32");
  const RunResult whole = run_uninterrupted(cfg, r, "alias-whole");
  TrainOptions o;
  o.out_dir = g_scratch.dir / "alias";
  o.quiet = true;
  o.save_every = 2;
  o.stop_after = 2;
  train(cfg, r, micro_data(), o);
  const Checkpoint ck = load_newest_checkpoint(o.out_dir);
  ASSERT_EQ(ck.data_key, micro_data().cache_dir.filename().string());
  o.stop_after = 0;
  o.resume_from = &ck;
  TokenData renamed = micro_data();  // the same tokens under another key
  renamed.cache_dir = renamed.cache_dir.parent_path() / "0123456789abcdef";
  try {
    train(cfg, r, renamed, o);
    FAIL() << "data under another key must be refused";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("token cache key"), std::string::npos) << e.what();
  }
  renamed.key_aliases = {"fedcba9876543210", ck.data_key};
  const RunResult resumed = finish(o.out_dir, train(cfg, r, renamed, o));
  EXPECT_EQ(resumed.final_ckpt.params, whole.final_ckpt.params);
}

TEST(RunFailure, AFailureAfterTheRunDirectoryExistsWritesErrorTxt) {
  // The checkpoint directory is blocked by a regular file, so the save at the end of step 1
  // fails (a filesystem error, not a divergence): error.txt names the recipe, the step and
  // the cause, no summary.json is written, and the error reaches the caller.
  RunConfig cfg = micro_config(3);
  cfg.train.warmup_steps = 1;
  TrainOptions o;
  o.out_dir = g_scratch.dir / "fail-at-step-1";
  o.save_every = 1;
  o.quiet = true;
  fs::create_directories(o.out_dir);
  std::ofstream(o.out_dir / "checkpoints") << "not a directory";
  EXPECT_ANY_THROW(train(cfg, recipe_named("fp32"), micro_data(), o));
  ASSERT_TRUE(fs::exists(o.out_dir / "error.txt"));
  std::ifstream f(o.out_dir / "error.txt");
  const std::string msg((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(msg.rfind("failed in step 1 of 3 (recipe fp32): ", 0), 0u) << msg;
  EXPECT_EQ(run_error(o.out_dir), RunError::Failed);
  EXPECT_NE(msg.find("checkpoints"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(o.out_dir / "summary.json"));
}

TEST(RunFailure, SummaryNamesTheComputePaths) {
  const RunResult r = run_uninterrupted(micro_config(3), recipe_named("bf16"), "compute-paths");
  const json& c = r.summary_json.at("compute");
  for (const char* k : {"cpu", "gemm_fp32", "gemm_bf16", "simd", "probe_gemm"})
    EXPECT_FALSE(c.at(k).get<std::string>().empty()) << k;
  EXPECT_NE(c.at("gemm_fp32").get<std::string>().find("sgemm"), std::string::npos);
}

// validate_run: a train run checks its recipe once, before the data (the CLI), or inside
// train() for a caller that never validated (docs/design.md "How data flows").
std::string user_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(ValidateRun, RefusesWhatTrainRefusesWithTheSameMessage) {
  // final_blocks beyond the micro model's 4 blocks: check_recipe_fits, validate_run and
  // train() itself refuse it with one message, and train() leaves no run directory.
  const RunConfig cfg = micro_config(2);
  Recipe r = recipe_named("ue5m3-b16");
  r.final_blocks = 9;
  const std::string want = user_error_of([&] { check_recipe_fits(r, cfg); });
  ASSERT_NE(want.find("high_precision.final_blocks"), std::string::npos) << want;
  EXPECT_EQ(user_error_of([&] { (void)validate_run(cfg, r); }), want);
  EXPECT_EQ(user_error_of([&] { (void)validate_run(cfg, r, /*resume=*/true); }), want);
  TrainOptions o;
  o.out_dir = g_scratch.dir / "unfit";
  o.quiet = true;
  EXPECT_EQ(user_error_of([&] { train(cfg, r, micro_data(), o); }), want);
  EXPECT_FALSE(fs::exists(o.out_dir));
}

TEST(ValidateRun, TrainsTheRunTrainTrains) {
  // train(validate_run(cfg, r), ...) is train(cfg, r, ...) bit for bit; with_seed changes the
  // seed and nothing else.
  const RunConfig cfg = micro_config(3);
  const Recipe r = recipe_named("ue5m3-b16");
  const RunResult a = run_uninterrupted(cfg, r, "validated_a");
  TrainOptions o;
  o.out_dir = g_scratch.dir / "validated_b";
  o.quiet = true;
  const RunResult b = finish(o.out_dir, train(validate_run(cfg, r), micro_data(), o));
  expect_identical(a, b);
  RunConfig seed2 = cfg;
  seed2.train.seed = 2;
  const ValidatedRun v = validate_run(cfg, r).with_seed(2);
  EXPECT_EQ(run_config_to_toml(v.config()), run_config_to_toml(seed2));
  EXPECT_EQ(recipe_to_toml(v.recipe()), recipe_to_toml(r));
}
}  // namespace
