// The token cache (see include/fp4/data/data.h): describe_data and prepare_tokens.
//
// Cache: cache_root/<16 hex digits>/ holding train.bin, heldout.bin (token shards, see
// token_shard.cpp), meta.json and, where there is one, tokenizer.model (+ tokenizer.vocab).
// The whole directory is built under a temporary name in cache_root and renamed into place,
// so a cache directory is either complete or absent.
//
// Keys: FNV-1a 64 over
//   text, jsonl:  "fp4train token cache v2", the tokenizer options (vocab size included), and
//                 per split the number of documents and an FNV-1a 64 of every document's name
//                 and bytes (length-prefixed), in corpus order;
//   llmc, uint16, uint32:  "fp4train token cache v2 tokens", the format, the vocab size, the
//                 held-out choice (file list or fraction), every token file's relative name and
//                 bytes, and the tokenizer model's bytes if one is given.
// The format of a text corpus is not in the key: the same documents give the same tokens.
//
// Streaming: a source is read three times at most (the scan that computes the key; on a
// miss, the tokenizer's training text; the encoding), each pass holding one document or
// record (text) or one chunk of ids (tokens) at a time, plus one batch of documents being
// encoded in parallel (kEncodeBatchBytes). Streams handed back are memory-mapped shards.
#include <omp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <system_error>
#include <vector>

#include "fp4/base/error.h"
#include "fp4/base/safetensors.h"  // fnv1a64
#include "fp4/data/data.h"
#include "source_internal.h"
#include "tokenizer_internal.h"

namespace fp4 {
namespace fs = std::filesystem;

namespace {

constexpr size_t kEncodeBatchBytes = size_t{8} << 20;
constexpr double kProgressSeconds = 5.0;

struct Fnv64 {
  uint64_t h = 0xcbf29ce484222325ull;
  void bytes(const void* data, size_t n) { h = fnv1a64(data, n, h); }
  void u64(uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
    bytes(b, 8);
  }
  void str(std::string_view s) {
    u64(s.size());
    bytes(s.data(), s.size());
  }
};

std::string hex16(uint64_t h) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

std::string megabytes(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", bytes / 1e6);
  return buf;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string fmt_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}

using detail::is_token_format;

// Rate-limited progress lines.
struct Progress {
  const std::function<void(const std::string&)>& log;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now(), last = t0;
  bool due() {
    if (!log) return false;
    const auto now = std::chrono::steady_clock::now();
    if (std::chrono::duration<double>(now - last).count() < kProgressSeconds) return false;
    last = now;
    return true;
  }
  double elapsed() const { return seconds_since(t0); }
};

// Removes a temporary directory unless released.
struct TempDir {
  fs::path path;
  ~TempDir() {
    if (!path.empty()) {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  }
};

void write_file_atomic(const fs::path& path, const std::string& bytes) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw UserError("cannot write '" + tmp.string() + "'");
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) throw UserError("cannot write '" + tmp.string() + "' (disk full?)");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw UserError("cannot rename '" + tmp.string() + "': " + ec.message());
}

// Streams a file's bytes into `f`.
void hash_file(const fs::path& p, Fnv64& f) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw UserError("cannot open token file '" + p.string() + "'");
  std::string buf(size_t{4} << 20, '\0');
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    f.bytes(buf.data(), static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) throw UserError("cannot read token file '" + p.string() + "'");
}

// One pre-tokenized input file.
struct TokenFile {
  fs::path path;
  std::string rel;
  TokenFileLayout layout;
  uint64_t size = 0;
};

std::vector<TokenFile> list_token_files(const fs::path& root, const std::string& format) {
  std::vector<std::pair<std::string, fs::path>> files;
  std::error_code ec;
  if (fs::is_directory(root, ec))
    files = detail::list_files(root);
  else if (fs::is_regular_file(root, ec))
    files.emplace_back(root.filename().string(), root);
  else
    throw UserError("token data '" + root.string() + "' does not exist");
  std::vector<TokenFile> out;
  for (const auto& [rel, p] : files) {
    TokenFile t;
    t.path = p;
    t.rel = rel;
    t.size = fs::file_size(p, ec);
    if (ec) throw UserError("cannot read token file '" + p.string() + "': " + ec.message());
    std::ifstream in(p, std::ios::binary);
    std::string head(1024, '\0');
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    head.resize(static_cast<size_t>(in.gcount()));
    t.layout = token_file_layout(head, t.size, format, p);
    out.push_back(std::move(t));
  }
  return out;
}

// What the scan of a source yields: the summary (key included) and what a build needs.
struct Scan {
  DataSummary sum;
  DataSpec spec;
  std::string options;                    // text: tokenizer options
  std::vector<TokenFile> train_files, heldout_files;  // tokens
  uint64_t total_ids = 0, heldout_ids = 0;              // tokens, heldout_fraction
  int id_bound = 0;  // tokens: ids must be below this (the tokenizer's pieces, else the vocab)
  fs::path stamp_file;  // where a full scan's result is stored (empty: the scan was reused)
};

// The scan stamp: a hash of what the source's files are without reading them (the files
// of data.path, data.heldout and data.tokenizer that the readers read: relative name, size,
// modification time in ns) and of every other input of the key. A full scan stores its
// result under cache_root/.scans/<stamp>.json; a later scan with the same stamp whose cache is
// built takes the key from there instead of reading the corpus again.
void stamp_files(const fs::path& root, Fnv64& f) {
  std::vector<std::pair<std::string, fs::path>> files;
  std::error_code ec;
  if (fs::is_directory(root, ec))
    files = detail::list_files(root);  // the files the readers read
  else
    files.emplace_back(root.filename().string(), root);
  f.str(fs::absolute(root, ec).string());
  f.u64(files.size());
  for (const auto& [rel, p] : files) {
    struct stat st {};
    f.str(rel);
    if (::stat(p.c_str(), &st) != 0) {
      f.u64(~uint64_t{0});
      continue;
    }
    f.u64(static_cast<uint64_t>(st.st_size));
    f.u64(static_cast<uint64_t>(st.st_mtim.tv_sec) * 1000000000ull + static_cast<uint64_t>(st.st_mtim.tv_nsec));
  }
}

std::string scan_stamp(const DataSpec& spec, const std::string& format, int vocab) {
  Fnv64 f;
  f.str("fp4train scan stamp v1");
  f.str(format);
  f.u64(static_cast<uint64_t>(vocab));
  f.str(spec.text_field);
  f.u64(spec.skip_bad_records ? 1 : 0);
  char frac[40];
  std::snprintf(frac, sizeof frac, "%.17g", spec.heldout_fraction);
  f.str(frac);
  stamp_files(spec.path, f);
  f.u64(spec.heldout.empty() ? 0 : 1);
  if (!spec.heldout.empty()) stamp_files(spec.heldout, f);
  f.u64(spec.tokenizer.empty() ? 0 : 1);
  if (!spec.tokenizer.empty()) stamp_files(spec.tokenizer, f);
  return hex16(f.h);
}

Scan scan_source(const DataSpec& spec, int vocab_size, const fs::path& cache_root,
                 const std::function<void(const std::string&)>& log, bool full = false) {
  if (vocab_size < 256)
    throw UserError("model.vocab_size = " + std::to_string(vocab_size) +
                    " is too small: the tokenizer holds 256 byte pieces and 3 special ids");
  Scan s;
  s.spec = spec;
  s.sum.path = spec.path;
  s.sum.format = resolve_data_format(spec);
  s.sum.vocab_size = vocab_size;
  s.sum.token_bytes = token_bytes_for_vocab(vocab_size);
  Fnv64 key;
  const std::string stamp = scan_stamp(spec, s.sum.format, vocab_size);
  const fs::path stamp_file = cache_root / ".scans" / (stamp + ".json");
  nlohmann::json stamped;
  if (!full) {
    std::ifstream in(stamp_file);
    std::error_code ec;
    try {
      if (in) in >> stamped;
      if (!stamped.is_object() || !stamped.contains("key") || !stamped["key"].is_string() ||
          !fs::exists(cache_root / stamped["key"].get<std::string>() / "meta.json", ec))
        stamped = nullptr;
    } catch (const std::exception&) {
      stamped = nullptr;  // a broken stamp only costs a full scan
    }
  }
  if (!is_token_format(s.sum.format) && stamped.is_object()) {
    DataSummary sum = s.sum;
    try {
      const auto& j = stamped;
      sum.key = j.at("key").get<std::string>();
      sum.files = j.at("files").get<int64_t>();
      sum.train_docs = j.at("train_docs").get<int64_t>();
      sum.heldout_docs = j.at("heldout_docs").get<int64_t>();
      sum.train_bytes = j.at("train_bytes").get<int64_t>();
      sum.heldout_bytes = j.at("heldout_bytes").get<int64_t>();
      sum.skipped_records = j.at("skipped_records").get<int64_t>();
      sum.first_errors = j.at("first_errors").get<std::vector<std::string>>();
      sum.cache_dir = cache_root / sum.key;
      sum.cached = true;
      sum.scan_reused = true;
      s.sum = std::move(sum);
      s.options = detail::options_string(detail::trainer_options(vocab_size));
      return s;
    } catch (const std::exception&) {
      stamped = nullptr;  // a broken stamp only costs a full scan
    }
  }
  if (!is_token_format(s.sum.format)) {
    s.options = detail::options_string(detail::trainer_options(vocab_size));
    Fnv64 train, held;
    Progress prog{log};
    const CorpusScan cs = for_each_document(spec, [&](const Document& d) {
      Fnv64& f = d.heldout ? held : train;
      f.str(d.name);
      f.str(d.text);
      (d.heldout ? s.sum.heldout_docs : s.sum.train_docs) += 1;
      (d.heldout ? s.sum.heldout_bytes : s.sum.train_bytes) += static_cast<int64_t>(d.text.size());
      if (prog.due())
        log("scanning " + spec.path.string() + ": " + std::to_string(d.index + 1) + " documents, " +
            megabytes(double(s.sum.train_bytes + s.sum.heldout_bytes)));
    });
    s.sum.files = cs.files;
    s.sum.skipped_records = cs.skipped_records;
    s.sum.first_errors = cs.first_errors;
    key.str("fp4train token cache v2");
    key.str(s.options);
    key.u64(static_cast<uint64_t>(s.sum.train_docs));
    key.u64(train.h);
    key.u64(static_cast<uint64_t>(s.sum.heldout_docs));
    key.u64(held.h);
  } else {
    key.str("fp4train token cache v2 tokens");
    key.str(s.sum.format);
    key.u64(static_cast<uint64_t>(vocab_size));
    s.train_files = list_token_files(spec.path, s.sum.format);
    if (!spec.heldout.empty()) {
      if (!fs::exists(spec.heldout))
        throw UserError("data.heldout '" + spec.heldout.string() + "' does not exist");
      s.heldout_files = list_token_files(spec.heldout, s.sum.format);
      // llm.c keeps train and val shards in one directory: held-out files found under
      // data.path are held out only, never trained on.
      std::vector<TokenFile> kept;
      for (TokenFile& t : s.train_files) {
        bool held = false;
        for (const TokenFile& h : s.heldout_files) held = held || fs::equivalent(t.path, h.path);
        if (!held) kept.push_back(std::move(t));
        else if (log) log("data: " + t.path.string() + " is data.heldout: held out, not trained on");
      }
      if (kept.empty())
        throw UserError("data.path '" + spec.path.string() + "' holds only the data.heldout files: "
                        "nothing is left to train on");
      s.train_files = std::move(kept);
    }
    const bool reuse = stamped.is_object();
    auto add = [&](const std::vector<TokenFile>& files, int64_t& bytes, uint64_t& ids) {
      key.u64(files.size());
      for (const TokenFile& t : files) {
        key.str(t.rel);
        key.u64(t.size);
        if (!reuse) hash_file(t.path, key);
        bytes += static_cast<int64_t>(t.size);
        ids += t.layout.count;
      }
    };
    uint64_t train_ids = 0, held_ids = 0;
    add(s.train_files, s.sum.train_bytes, train_ids);
    if (train_ids == 0)
      throw UserError("data.path '" + spec.path.string() + "' holds no token ids (" +
                      std::to_string(s.train_files.size()) + " empty file" +
                      (s.train_files.size() == 1 ? "" : "s") + ")");
    if (!s.heldout_files.empty()) {
      key.str("heldout files");
      add(s.heldout_files, s.sum.heldout_bytes, held_ids);
      if (held_ids == 0)
        throw UserError("data.heldout '" + spec.heldout.string() + "' holds no token ids");
    } else {
      char frac[40];
      std::snprintf(frac, sizeof frac, "%.17g", spec.heldout_fraction);
      key.str(std::string("heldout fraction ") + frac);
      std::snprintf(frac, sizeof frac, "%g", spec.heldout_fraction);
      s.total_ids = train_ids;
      s.heldout_ids = static_cast<uint64_t>(std::floor(double(train_ids) * spec.heldout_fraction));
      if (s.heldout_ids == 0 || s.heldout_ids == train_ids)
        throw UserError("data.heldout_fraction = " + std::string(frac) + " of the " +
                        std::to_string(train_ids) + " ids of '" + spec.path.string() +
                        "' leaves " + (s.heldout_ids == 0 ? "no held-out" : "no training") + " ids");
    }
    s.sum.files = static_cast<int64_t>(s.train_files.size() + s.heldout_files.size());
    if (!spec.tokenizer.empty()) {
      if (!fs::is_regular_file(spec.tokenizer))
        throw UserError("data.tokenizer '" + spec.tokenizer.string() + "' does not exist");
      const Tokenizer tok(spec.tokenizer);
      if (tok.pieces() > vocab_size)
        throw UserError("data.tokenizer '" + spec.tokenizer.string() + "' has " +
                        std::to_string(tok.pieces()) + " pieces, more than model.vocab_size = " +
                        std::to_string(vocab_size));
      key.str("tokenizer");
      if (!reuse) hash_file(spec.tokenizer, key);
      s.id_bound = tok.pieces();
    }
  }
  s.sum.key = stamped.is_object() ? stamped["key"].get<std::string>() : hex16(key.h);
  s.sum.scan_reused = stamped.is_object();
  s.sum.cache_dir = cache_root / s.sum.key;
  std::error_code ec;
  s.sum.cached = fs::exists(s.sum.cache_dir / "meta.json", ec);
  if (!s.sum.scan_reused) s.stamp_file = stamp_file;
  return s;
}

// Stores a full scan's result under its stamp, once its cache exists (best effort: a stamp
// that cannot be written only costs the next run a full scan).
void write_stamp(const Scan& s) {
  if (s.stamp_file.empty()) return;
  std::error_code ec;
  fs::create_directories(s.stamp_file.parent_path(), ec);
  const nlohmann::json j = {{"key", s.sum.key},
                            {"source", fs::absolute(s.spec.path, ec).string()},
                            {"format", s.sum.format},
                            {"files", s.sum.files},
                            {"train_docs", s.sum.train_docs},
                            {"heldout_docs", s.sum.heldout_docs},
                            {"train_bytes", s.sum.train_bytes},
                            {"heldout_bytes", s.sum.heldout_bytes},
                            {"skipped_records", s.sum.skipped_records},
                            {"first_errors", s.sum.first_errors}};
  try {
    write_file_atomic(s.stamp_file, j.dump(2) + "\n");
  } catch (const UserError&) {
  }
}

// Reads a complete cache directory.
TokenData load_cache(const fs::path& dir, int vocab_size, const std::string& format) {
  const fs::path meta_path = dir / "meta.json";
  auto corrupt = [](const fs::path& f, const std::string& why) { return UserError(token_cache_corrupt(f, why)); };
  std::ifstream in(meta_path);
  if (!in) throw corrupt(meta_path, "missing or unreadable");
  nlohmann::json meta;
  try {
    in >> meta;
  } catch (const std::exception& e) {
    throw corrupt(meta_path, std::string("invalid JSON: ") + e.what());
  }
  TokenData td;
  td.vocab_size = vocab_size;
  td.format = format;
  td.cache_dir = dir;
  td.from_cache = true;
  td.train = map_token_shard(dir / "train.bin", vocab_size);
  td.heldout = map_token_shard(dir / "heldout.bin", vocab_size);
  try {
    // Compared as non-negative JSON integers: get<int>() of 1e300 would be an out-of-range
    // float-to-int conversion (undefined behaviour), of 2^32 + 4096 a wrap to 4096.
    auto is = [&](const char* key, uint64_t want) {
      const auto& v = meta.at(key);
      return v.is_number_unsigned() && v.get<uint64_t>() == want;
    };
    if (!is("vocab_size", static_cast<uint64_t>(vocab_size)))
      throw corrupt(meta_path, "vocab_size does not match");
    if (!is("train_tokens", td.train.size()) || !is("heldout_tokens", td.heldout.size()))
      throw corrupt(meta_path, "token counts do not match the shards");
    if (meta.contains("skipped_records") && meta["skipped_records"].is_number_unsigned())
      td.skipped_records = meta["skipped_records"].get<int64_t>();
    if (meta.contains("legacy_keys") && meta["legacy_keys"].is_array())
      for (const auto& k : meta["legacy_keys"])
        if (k.is_string()) td.key_aliases.push_back(k.get<std::string>());
  } catch (const nlohmann::json::exception& e) {
    throw corrupt(meta_path, e.what());
  }
  const fs::path model = dir / "tokenizer.model";
  std::error_code ec;
  const bool text = !is_token_format(format);
  if (text || fs::exists(model, ec)) {
    if (!fs::exists(model, ec)) throw corrupt(model, "missing");
    int pieces = 0;
    try {
      pieces = Tokenizer(model).pieces();
    } catch (const UserError& e) {
      throw corrupt(model, e.what());
    }
    if (text ? pieces != vocab_size : pieces > vocab_size)
      throw corrupt(model, "has " + std::to_string(pieces) + " pieces, expected " +
                               (text ? "" : "at most ") + std::to_string(vocab_size));
    td.tokenizer_model = model;
  }
  return td;
}

// Encodes a batch of documents on every core, in order, into the two writers.
struct Encoder {
  const Tokenizer& tok;
  TokenShardWriter& train;
  TokenShardWriter& heldout;
  std::vector<std::string> texts, names;
  std::vector<char> held;
  size_t bytes = 0;
  void add(const Document& d) {
    texts.emplace_back(d.text);
    names.emplace_back(d.name);
    held.push_back(d.heldout ? 1 : 0);
    bytes += d.text.size();
  }
  void flush() {
    const long n = static_cast<long>(texts.size());
    std::vector<std::vector<int>> ids(texts.size());
    std::vector<std::string> errors(texts.size());
#pragma omp parallel for schedule(dynamic, 1)
    for (long i = 0; i < n; ++i) {
      try {
        ids[i] = tok.encode(texts[i], "document '" + names[i] + "'");
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    }
    for (long i = 0; i < n; ++i) {
      if (!errors[i].empty()) throw UserError("cannot tokenize: " + errors[i]);
      TokenShardWriter& w = held[i] ? heldout : train;
      w.append(ids[i].data(), ids[i].size());
      const int eos = kTokenEos;
      w.append(&eos, 1);
    }
    texts.clear();
    names.clear();
    held.clear();
    bytes = 0;
  }
};

nlohmann::json common_meta(const Scan& s, const TokenShardWriter& train, const TokenShardWriter& held) {
  std::error_code ec;
  return {
      {"format", "FP4TOK01"},
      {"shard_version", kTokenShardVersion},
      {"token_bytes", s.sum.token_bytes},
      {"vocab_size", s.sum.vocab_size},
      {"train_tokens", train.count()},
      {"heldout_tokens", held.count()},
      {"source", fs::absolute(s.spec.path, ec).string()},
      {"source_format", s.sum.format},
      {"key", s.sum.key},
  };
}

void build_text_cache(const Scan& s, const fs::path& tmp,
                      const std::function<void(const std::string&)>& log) {
  auto say = [&](const std::string& m) {
    if (log) log(m);
  };
  const int vocab = s.sum.vocab_size;
  // 1. Tokenizer.
  const size_t stride = detail::training_stride(static_cast<size_t>(s.sum.train_bytes));
  say("training tokenizer on " + std::to_string(s.sum.train_docs) + " docs (" +
      megabytes(double(s.sum.train_bytes)) + (stride > 1 ? ", every " + std::to_string(stride) + "th line" : std::string()) +
      "), BPE vocab " + std::to_string(vocab) + "...");
  const auto t0 = std::chrono::steady_clock::now();
  const fs::path input = tmp / "train.txt";
  // The key of version 1 (before 2026-12): the train documents hashed here, the held-out
  // ones in the encoding pass. It names the same tokens while the tokenizer trains on the
  // whole training split under both caps (the only option that changed).
  constexpr size_t kLegacyMaxTrainBytes = size_t{256} << 20;
  const bool legacy_valid = static_cast<size_t>(s.sum.train_bytes) <= kMaxTokenizerTrainBytes;
  Fnv64 legacy;
  {
    auto opts = detail::trainer_options(vocab);
    opts["max_train_bytes"] = std::to_string(kLegacyMaxTrainBytes);
    legacy.str("fp4train token cache v1");
    legacy.str(detail::options_string(opts));
    legacy.u64(static_cast<uint64_t>(s.sum.train_docs));
  }
  {
    std::ofstream out(input, std::ios::binary | std::ios::trunc);
    if (!out) throw UserError("cannot write '" + input.string() + "'");
    size_t line_no = 0;
    std::string buf;
    for_each_document(s.spec, [&](const Document& d) {
      if (d.heldout) return;
      legacy.str(d.name);
      legacy.str(d.text);
      detail::append_training_lines(d.text, stride, line_no, buf);
      if (buf.size() >= (size_t{1} << 20)) {
        out.write(buf.data(), static_cast<std::streamsize>(buf.size()));
        buf.clear();
      }
    });
    out.write(buf.data(), static_cast<std::streamsize>(buf.size()));
    out.flush();
    if (!out) throw UserError("cannot write '" + input.string() + "' (disk full?)");
  }
  detail::train_tokenizer(input, tmp / "tokenizer", vocab, s.spec.path);
  std::error_code ec;
  fs::remove(input, ec);
  say("trained tokenizer in " + fmt_seconds(seconds_since(t0)));

  // 2. Token streams, encoded in batches on every core.
  const Tokenizer tok(tmp / "tokenizer.model");
  TokenShardWriter train(tmp / "train.bin", vocab), held(tmp / "heldout.bin", vocab);
  Encoder enc{tok, train, held, {}, {}, {}, 0};
  Progress prog{log};
  const double total = double(s.sum.train_bytes + s.sum.heldout_bytes);
  double done = 0;
  legacy.u64(static_cast<uint64_t>(s.sum.heldout_docs));
  for_each_document(s.spec, [&](const Document& d) {
    if (d.heldout) {
      legacy.str(d.name);
      legacy.str(d.text);
    }
    enc.add(d);
    if (enc.bytes >= kEncodeBatchBytes) {
      done += double(enc.bytes);
      enc.flush();
      if (prog.due()) {
        char b[160];
        std::snprintf(b, sizeof b, "encoding: %s of %s (%.0f%%), %.2f M tokens, %.1f MB/s on %d threads",
                      megabytes(done).c_str(), megabytes(total).c_str(), 100.0 * done / total,
                      double(train.count() + held.count()) / 1e6, done / 1e6 / prog.elapsed(),
                      omp_get_max_threads());
        log(b);
      }
    }
  });
  enc.flush();
  train.finish();
  held.finish();
  const double secs = prog.elapsed();
  char b[200];
  std::snprintf(b, sizeof b, "encoded %llu tokens (%llu train, %llu held-out) in %s, %.0f tokens/s",
                static_cast<unsigned long long>(train.count() + held.count()),
                static_cast<unsigned long long>(train.count()),
                static_cast<unsigned long long>(held.count()), fmt_seconds(secs).c_str(),
                double(train.count() + held.count()) / std::max(secs, 1e-9));
  say(b);
  nlohmann::json meta = common_meta(s, train, held);
  meta["train_docs"] = s.sum.train_docs;
  meta["heldout_docs"] = s.sum.heldout_docs;
  meta["train_bytes"] = s.sum.train_bytes;
  meta["heldout_bytes"] = s.sum.heldout_bytes;
  meta["skipped_records"] = s.sum.skipped_records;
  meta["special_ids"] = {{"unk", kTokenUnk}, {"bos", kTokenBos}, {"eos", kTokenEos}, {"pad", -1}};
  meta["eos_after_each_document"] = true;
  meta["tokenizer_options"] = detail::trainer_options(vocab);
  meta["legacy_keys"] = legacy_valid ? nlohmann::json::array({hex16(legacy.h)}) : nlohmann::json::array();
  write_file_atomic(tmp / "meta.json", meta.dump(2) + "\n");
}

// Copies ids [from, to) of the concatenated files into `w`, checking each against the vocab
// (read in chunks, not mapped: memory stays flat whatever the files' size).
void copy_ids(const std::vector<TokenFile>& files, uint64_t from, uint64_t to, int bound,
              TokenShardWriter& w, Progress& prog, uint64_t total, bool by_tokenizer) {
  uint64_t pos = 0;  // of the current file's first id in the concatenation
  for (const TokenFile& f : files) {
    const uint64_t n = f.layout.count, lo = std::max(from, pos), hi = std::min(to, pos + n);
    if (lo < hi) {
      const uint64_t skip = lo - pos;
      read_token_chunks(f.path, f.layout.header_bytes + skip * f.layout.token_bytes, hi - lo,
                        f.layout.token_bytes, [&](const uint32_t* ids, size_t k, uint64_t first) {
        for (size_t j = 0; j < k; ++j)
          if (ids[j] >= static_cast<uint32_t>(bound))
            throw UserError("token file '" + f.path.string() + "': id " + std::to_string(ids[j]) +
                            " at index " + std::to_string(skip + first + j) + " is not below " +
                            (by_tokenizer ? "the " + std::to_string(bound) + " pieces of data.tokenizer"
                                          : "model.vocab_size = " + std::to_string(bound)));
        w.append(ids, k);
        if (prog.due()) {
          char b[120];
          std::snprintf(b, sizeof b, "copying ids: %.2f of %.2f M", double(w.count()) / 1e6, double(total) / 1e6);
          prog.log(b);
        }
      });
    }
    pos += n;
  }
}

void build_token_cache(const Scan& s, const fs::path& tmp,
                       const std::function<void(const std::string&)>& log) {
  const int vocab = s.sum.vocab_size, bound = s.id_bound > 0 ? s.id_bound : vocab;
  TokenShardWriter train(tmp / "train.bin", vocab), held(tmp / "heldout.bin", vocab);
  Progress prog{log};
  auto count = [](const std::vector<TokenFile>& v) {
    uint64_t n = 0;
    for (const auto& f : v) n += f.layout.count;
    return n;
  };
  const uint64_t n_train = count(s.train_files);
  if (!s.heldout_files.empty()) {
    const uint64_t n_held = count(s.heldout_files);
    copy_ids(s.train_files, 0, n_train, bound, train, prog, n_train + n_held, s.id_bound > 0);
    copy_ids(s.heldout_files, 0, n_held, bound, held, prog, n_train + n_held, s.id_bound > 0);
  } else {
    const uint64_t cut = n_train - s.heldout_ids;
    copy_ids(s.train_files, 0, cut, bound, train, prog, n_train, s.id_bound > 0);
    copy_ids(s.train_files, cut, n_train, bound, held, prog, n_train, s.id_bound > 0);
  }
  train.finish();
  held.finish();
  if (!s.spec.tokenizer.empty()) {
    std::error_code ec;
    fs::copy_file(s.spec.tokenizer, tmp / "tokenizer.model", ec);
    if (ec) throw UserError("cannot copy data.tokenizer '" + s.spec.tokenizer.string() + "': " + ec.message());
  }
  nlohmann::json meta = common_meta(s, train, held);
  nlohmann::json files = nlohmann::json::array(), hfiles = nlohmann::json::array();
  for (const auto& f : s.train_files) files.push_back({{"name", f.rel}, {"bytes", f.size}, {"tokens", f.layout.count}});
  for (const auto& f : s.heldout_files) hfiles.push_back({{"name", f.rel}, {"bytes", f.size}, {"tokens", f.layout.count}});
  meta["files"] = files;
  if (!s.heldout_files.empty()) {
    std::error_code ec;
    meta["heldout_source"] = fs::absolute(s.spec.heldout, ec).string();
    meta["heldout_files"] = hfiles;
  } else {
    meta["heldout_fraction"] = s.spec.heldout_fraction;
  }
  if (!s.spec.tokenizer.empty()) {
    std::error_code ec;
    meta["tokenizer_source"] = fs::absolute(s.spec.tokenizer, ec).string();
  }
  write_file_atomic(tmp / "meta.json", meta.dump(2) + "\n");
  char b[160];
  std::snprintf(b, sizeof b, "copied %llu ids (%llu train, %llu held-out) in %s",
                static_cast<unsigned long long>(train.count() + held.count()),
                static_cast<unsigned long long>(train.count()),
                static_cast<unsigned long long>(held.count()), fmt_seconds(prog.elapsed()).c_str());
  if (log) log(b);
}

// A build killed before it could clean up (SIGKILL, a signal's default action) leaves its
// cache_root/.tmp-<key>-<pid>-<n> directory: removed once no process of that pid runs (on this
// machine; a cache root shared between machines keeps other hosts' builds).
void remove_stale_builds(const fs::path& cache_root, const std::function<void(const std::string&)>& log) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(cache_root, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".tmp-", 0) != 0) continue;
    const size_t a = name.find('-', 5), b = a == std::string::npos ? a : name.find('-', a + 1);
    if (b == std::string::npos) continue;
    const long pid = std::strtol(name.substr(a + 1, b - a - 1).c_str(), nullptr, 10);
    if (pid <= 0 || pid == ::getpid() || ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    std::error_code rm;
    fs::remove_all(e.path(), rm);
    if (!rm && log) log("removed " + e.path().string() + ", an incomplete cache build of process " +
                        std::to_string(pid) + ", which no longer runs");
  }
}

void fill_counts(DataSummary& sum, const TokenData& td) {
  sum.train_tokens = static_cast<int64_t>(td.train.size());
  sum.heldout_tokens = static_cast<int64_t>(td.heldout.size());
  sum.tokenizer_model = td.tokenizer_model;
}

}  // namespace

DataSummary describe_data(const DataSpec& spec, int vocab_size, const fs::path& cache_root,
                          const std::function<void(const std::string&)>& log) {
  Scan s = scan_source(spec, vocab_size, cache_root, log, /*full=*/true);
  if (s.sum.cached) {
    fill_counts(s.sum, load_cache(s.sum.cache_dir, vocab_size, s.sum.format));
    write_stamp(s);
  }
  else if (!spec.tokenizer.empty()) s.sum.tokenizer_model = spec.tokenizer;
  return s.sum;
}

TokenData prepare_tokens(const fs::path& data_path, int vocab_size, const fs::path& cache_root,
                         const std::function<void(const std::string&)>& log) {
  DataSpec spec;
  spec.path = data_path;
  return prepare_tokens(spec, vocab_size, cache_root, log);
}

TokenData prepare_tokens(const DataSpec& spec, int vocab_size, const fs::path& cache_root,
                         const std::function<void(const std::string&)>& log) {
  auto say = [&](const std::string& m) {
    if (log) log(m);
  };
  const Scan s = scan_source(spec, vocab_size, cache_root, log);
  if (s.sum.skipped_records > 0) {
    say("skipped " + std::to_string(s.sum.skipped_records) + " bad record" +
        (s.sum.skipped_records == 1 ? "" : "s") + " (data.skip_bad_records)");
    for (const auto& e : s.sum.first_errors) say("  " + e);
  }
  const fs::path dir = s.sum.cache_dir;
  std::error_code ec0;
  if (!s.sum.cached && fs::exists(dir, ec0) && !fs::exists(dir / "meta.json", ec0))
    throw UserError(token_cache_corrupt(dir / "meta.json", "missing: the directory is incomplete"));
  if (s.sum.scan_reused)
    say("data unchanged since its last scan (names, sizes, modification times): key " + s.sum.key);
  if (s.sum.cached) {
    TokenData td = load_cache(dir, vocab_size, s.sum.format);
    write_stamp(s);
    say("using cached tokens " + dir.string() + " (" + std::to_string(td.train.size()) +
        " train, " + std::to_string(td.heldout.size()) + " held-out tokens)");
    return td;
  }
  std::error_code ec;
  fs::create_directories(cache_root, ec);
  if (ec)
    throw UserError("cannot create cache directory '" + cache_root.string() + "': " + ec.message());
  remove_stale_builds(cache_root, log);
  std::random_device rd;
  TempDir tmp{cache_root / (".tmp-" + s.sum.key + "-" + std::to_string(::getpid()) + "-" +
                            std::to_string(rd()))};
  fs::create_directories(tmp.path, ec);
  if (ec) throw UserError("cannot create '" + tmp.path.string() + "': " + ec.message());
  if (is_token_format(s.sum.format))
    build_token_cache(s, tmp.path, log);
  else
    build_text_cache(s, tmp.path, log);
  fs::rename(tmp.path, dir, ec);
  if (ec) {
    // Another process may have published the same key first: use theirs.
    std::error_code ec2;
    if (!fs::exists(dir / "meta.json", ec2))
      throw UserError("cannot create cache directory '" + dir.string() + "': " + ec.message());
  } else {
    tmp.path.clear();
    say("wrote token cache " + dir.string());
  }
  TokenData td = load_cache(dir, vocab_size, s.sum.format);
  td.from_cache = false;
  write_stamp(s);
  return td;
}

}  // namespace fp4
