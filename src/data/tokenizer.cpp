// SentencePiece BPE tokenizer and the on-disk token cache (see include/fp4/data/data.h).
//
// Tokenizer: SentencePiece BPE trained on the training split only, with byte fallback (any
// UTF-8 encodes, no <unk>), identity normalization and no whitespace collapsing, so
// decode(encode(text)) == text exactly, newlines included (a '\n' is the byte piece
// <0x0A>; training sees the text one line per sentence). Special ids: kTokenUnk = 0,
// kTokenBos = 1 (unused), kTokenEos = 2, no pad id; ids 3..258 are the byte pieces.
//
// Token streams: every document is encoded on its own and followed by one kTokenEos, so a
// stream is  doc0 </s> doc1 </s> ... docN </s>  (train and held-out alike).
//
// Cache: cache_root/<16 hex digits>/ holding tokenizer.model (+ tokenizer.vocab for
// reading), train.bin, heldout.bin and meta.json. The key is FNV-1a 64 over the format
// version, the tokenizer options (vocab size included) and every document's split, name and
// bytes (length-prefixed). The whole directory is built under a temporary name in
// cache_root and renamed into place, so a cache directory is either complete or absent.
// Shard layout (little-endian): "FP4TOK01" | uint32 version = 1 | uint32 vocab |
// uint64 count | count x uint16 token ids.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <vector>

#include "fp4/data/data.h"
#include "fp4/base/error.h"

namespace fp4 {
namespace fs = std::filesystem;

namespace {

constexpr uint32_t kShardVersion = kTokenShardVersion;
// Lines longer than this are cut (at a space where possible) before training;
// SentencePiece skips sentences longer than max_sentence_length.
constexpr size_t kMaxTrainLine = 8192;
// At most this much text is used to train the tokenizer (a deterministic subsample of
// lines beyond it); encoding always covers the whole corpus.
constexpr size_t kMaxTrainBytes = size_t{256} << 20;
constexpr unsigned kTrainSeed = 0x5EED;

// Every option that changes the tokenizer; part of the cache key.
std::unordered_map<std::string, std::string> trainer_options(int vocab_size) {
  return {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      {"character_coverage", "1.0"},
      {"byte_fallback", "true"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "true"},
      {"split_digits", "false"},
      {"unk_id", std::to_string(kTokenUnk)},
      {"bos_id", std::to_string(kTokenBos)},
      {"eos_id", std::to_string(kTokenEos)},
      {"pad_id", "-1"},
      {"max_sentence_length", std::to_string(2 * kMaxTrainLine)},
      {"input_sentence_size", "2000000"},
      {"shuffle_input_sentence", "true"},
      {"max_train_bytes", std::to_string(kMaxTrainBytes)},  // ours, not passed to SentencePiece
      {"seed", std::to_string(kTrainSeed)},                  // ours
  };
}

std::string options_string(const std::unordered_map<std::string, std::string>& opts) {
  std::vector<std::pair<std::string, std::string>> v(opts.begin(), opts.end());
  std::sort(v.begin(), v.end());
  std::string s;
  for (const auto& [k, val] : v) s += k + "=" + val + ";";
  return s;
}

struct Fnv64 {
  uint64_t h = 0xcbf29ce484222325ull;
  void bytes(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) {
      h ^= p[i];
      h *= 0x100000001b3ull;
    }
  }
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

std::string cache_key(const CorpusSplit& split, const std::string& options) {
  Fnv64 f;
  f.str("fp4train token cache v1");
  f.str(options);
  f.u64(split.train_docs.size());
  for (size_t i = 0; i < split.train_docs.size(); ++i) {
    f.str(split.train_names[i]);
    f.str(split.train_docs[i]);
  }
  f.u64(split.heldout_docs.size());
  for (size_t i = 0; i < split.heldout_docs.size(); ++i) {
    f.str(split.heldout_names[i]);
    f.str(split.heldout_docs[i]);
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(f.h));
  return hex;
}

std::string corrupt(const fs::path& file, const std::string& why) { return token_cache_corrupt(file, why); }

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

std::vector<uint16_t> read_shard(const fs::path& path, int vocab) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(corrupt(path, "missing or unreadable"));
  const std::string b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return token_shard_from_bytes(b, vocab, path);
}

void load_processor(sentencepiece::SentencePieceProcessor& sp, const fs::path& model) {
  const auto status = sp.Load(model.string());
  if (!status.ok())
    throw UserError("cannot load tokenizer model '" + model.string() + "': " + status.ToString());
}

// Cuts a line into pieces of at most kMaxTrainLine bytes, at spaces where possible and
// never inside a UTF-8 sequence.
void append_training_line(std::string_view line, std::string& out) {
  while (line.size() > kMaxTrainLine) {
    size_t cut = line.rfind(' ', kMaxTrainLine);
    if (cut == std::string_view::npos || cut < kMaxTrainLine / 2) {
      cut = kMaxTrainLine;
      while (cut > 0 && (static_cast<unsigned char>(line[cut]) & 0xC0) == 0x80) --cut;
    }
    out.append(line.substr(0, cut));
    out.push_back('\n');
    line.remove_prefix(cut);
    while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
  }
  if (!line.empty()) {
    out.append(line);
    out.push_back('\n');
  }
}

// Training text: one non-blank line per sentence; a deterministic subsample when the
// corpus holds more than kMaxTrainBytes.
std::string training_text(const std::vector<std::string>& docs, size_t total_bytes) {
  const size_t stride = total_bytes > kMaxTrainBytes ? (total_bytes + kMaxTrainBytes - 1) / kMaxTrainBytes : 1;
  std::string out;
  out.reserve(std::min(total_bytes, kMaxTrainBytes) + docs.size());
  size_t line_no = 0;
  for (const std::string& doc : docs) {
    std::string_view rest(doc);
    while (!rest.empty()) {
      const size_t eol = rest.find('\n');
      std::string_view line = rest.substr(0, eol);
      rest = eol == std::string_view::npos ? std::string_view() : rest.substr(eol + 1);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      bool blank = true;
      for (char c : line) blank = blank && (c == ' ' || c == '\t' || c == '\f' || c == '\v' || c == '\r');
      if (blank) continue;
      if (line_no++ % stride == 0) append_training_line(line, out);
    }
  }
  return out;
}

std::vector<uint16_t> encode_docs(const sentencepiece::SentencePieceProcessor& sp,
                                  const std::vector<std::string>& docs,
                                  const std::vector<std::string>& names) {
  std::vector<std::vector<int>> ids(docs.size());
  std::vector<std::string> errors(docs.size());
  const long n = static_cast<long>(docs.size());
#pragma omp parallel for schedule(dynamic, 4)
  for (long i = 0; i < n; ++i) {
    const auto status = sp.Encode(docs[i], &ids[i]);
    if (!status.ok()) errors[i] = status.ToString();
  }
  size_t total = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    if (!errors[i].empty())
      throw UserError("cannot tokenize document '" + names[i] + "': " + errors[i]);
    total += ids[i].size() + 1;
  }
  std::vector<uint16_t> out;
  out.reserve(total);
  for (const auto& v : ids) {
    for (int id : v) out.push_back(static_cast<uint16_t>(id));
    out.push_back(static_cast<uint16_t>(kTokenEos));
  }
  return out;
}

size_t total_bytes(const std::vector<std::string>& docs) {
  size_t n = 0;
  for (const auto& d : docs) n += d.size();
  return n;
}

std::string megabytes(size_t bytes) {
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

TokenData load_cache(const fs::path& dir, int vocab_size) {
  const fs::path meta_path = dir / "meta.json";
  std::ifstream in(meta_path);
  if (!in) throw UserError(corrupt(meta_path, "missing or unreadable"));
  nlohmann::json meta;
  try {
    in >> meta;
  } catch (const std::exception& e) {
    throw UserError(corrupt(meta_path, std::string("invalid JSON: ") + e.what()));
  }
  TokenData td;
  td.vocab_size = vocab_size;
  td.cache_dir = dir;
  td.tokenizer_model = dir / "tokenizer.model";
  td.from_cache = true;
  td.train = read_shard(dir / "train.bin", vocab_size);
  td.heldout = read_shard(dir / "heldout.bin", vocab_size);
  try {
    // Compared as non-negative JSON integers: get<int>() of 1e300 would be an out-of-range
    // float-to-int conversion (undefined behaviour), of 2^32 + 4096 a wrap to 4096.
    auto is = [&](const char* key, uint64_t want) {
      const auto& v = meta.at(key);
      return v.is_number_unsigned() && v.get<uint64_t>() == want;
    };
    if (!is("vocab_size", static_cast<uint64_t>(vocab_size)))
      throw UserError(corrupt(meta_path, "vocab_size does not match"));
    if (!is("train_tokens", td.train.size()) || !is("heldout_tokens", td.heldout.size()))
      throw UserError(corrupt(meta_path, "token counts do not match the shards"));
  } catch (const nlohmann::json::exception& e) {
    throw UserError(corrupt(meta_path, e.what()));
  }
  sentencepiece::SentencePieceProcessor sp;
  const auto status = sp.Load(td.tokenizer_model.string());
  if (!status.ok()) throw UserError(corrupt(td.tokenizer_model, status.ToString()));
  if (sp.GetPieceSize() != vocab_size)
    throw UserError(corrupt(td.tokenizer_model, "has " + std::to_string(sp.GetPieceSize()) +
                                                    " pieces, expected " + std::to_string(vocab_size)));
  return td;
}

}  // namespace

TokenData prepare_tokens(const fs::path& data_path, int vocab_size, const fs::path& cache_root,
                         const std::function<void(const std::string&)>& log) {
  auto say = [&](const std::string& s) {
    if (log) log(s);
  };
  if (vocab_size < 256 || vocab_size > 65535)
    throw UserError("model.vocab_size = " + std::to_string(vocab_size) +
                    " cannot be trained: the tokenizer and token shards take 256 to 65535 "
                    "pieces (token ids are stored as uint16); fp4train info describes larger "
                    "models");
  const CorpusSplit split = split_corpus(data_path);
  const auto opts = trainer_options(vocab_size);
  const std::string key = cache_key(split, options_string(opts));
  const fs::path dir = cache_root / key;

  std::error_code ec;
  if (fs::exists(dir, ec)) {
    TokenData td = load_cache(dir, vocab_size);
    say("using cached tokens " + dir.string() + " (" + std::to_string(td.train.size()) +
        " train, " + std::to_string(td.heldout.size()) + " held-out tokens)");
    return td;
  }

  fs::create_directories(cache_root, ec);
  if (ec)
    throw UserError("cannot create cache directory '" + cache_root.string() + "': " + ec.message());
  std::random_device rd;
  TempDir tmp{cache_root / (".tmp-" + key + "-" + std::to_string(::getpid()) + "-" +
                            std::to_string(rd()))};
  fs::create_directories(tmp.path, ec);
  if (ec) throw UserError("cannot create '" + tmp.path.string() + "': " + ec.message());

  // 1. Tokenizer.
  const size_t train_bytes = total_bytes(split.train_docs);
  say("training tokenizer on " + std::to_string(split.train_docs.size()) + " docs (" +
      megabytes(train_bytes) + "), BPE vocab " + std::to_string(vocab_size) + "...");
  const auto t0 = std::chrono::steady_clock::now();
  const fs::path input = tmp.path / "train.txt";
  write_file_atomic(input, training_text(split.train_docs, train_bytes));
  auto kwargs = opts;
  kwargs.erase("max_train_bytes");
  kwargs.erase("seed");
  kwargs["input"] = input.string();
  kwargs["model_prefix"] = (tmp.path / "tokenizer").string();
  kwargs["num_threads"] = "2";
  kwargs["minloglevel"] = "1";  // warnings and errors only
  sentencepiece::SetRandomGeneratorSeed(kTrainSeed);
  const auto status = sentencepiece::SentencePieceTrainer::Train(kwargs);
  if (!status.ok()) {
    std::string msg = status.ToString();
    if (msg.find("required_chars") != std::string::npos)
      msg += " (the 256 byte-fallback pieces and 3 special tokens count toward vocab_size, and "
             "every distinct character of the training text needs a piece of its own)";
    throw UserError("tokenizer training on '" + data_path.string() + "' with vocab_size " +
                    std::to_string(vocab_size) + " failed: " + msg);
  }
  fs::remove(input, ec);
  const fs::path model = tmp.path / "tokenizer.model";
  sentencepiece::SentencePieceProcessor sp;
  load_processor(sp, model);
  if (sp.GetPieceSize() != vocab_size)
    throw UserError("the training split of '" + data_path.string() + "' is too small for vocab_size " +
                    std::to_string(vocab_size) + ": BPE found only " +
                    std::to_string(sp.GetPieceSize()) + " pieces; use a smaller vocab_size");
  say("trained tokenizer in " + fmt_seconds(seconds_since(t0)));

  // 2. Token streams.
  const auto t1 = std::chrono::steady_clock::now();
  TokenData td;
  td.vocab_size = vocab_size;
  td.train = encode_docs(sp, split.train_docs, split.train_names);
  td.heldout = encode_docs(sp, split.heldout_docs, split.heldout_names);
  say("encoded " + std::to_string(td.train.size() + td.heldout.size()) + " tokens (" +
      std::to_string(td.train.size()) + " train, " + std::to_string(td.heldout.size()) +
      " held-out) in " + fmt_seconds(seconds_since(t1)));

  // 3. Shards and metadata, then publish the directory.
  write_file_atomic(tmp.path / "train.bin", token_shard_to_bytes(td.train, vocab_size));
  write_file_atomic(tmp.path / "heldout.bin", token_shard_to_bytes(td.heldout, vocab_size));
  nlohmann::json meta = {
      {"format", "FP4TOK01"},
      {"shard_version", kShardVersion},
      {"vocab_size", vocab_size},
      {"train_tokens", td.train.size()},
      {"heldout_tokens", td.heldout.size()},
      {"train_docs", split.train_docs.size()},
      {"heldout_docs", split.heldout_docs.size()},
      {"train_bytes", train_bytes},
      {"heldout_bytes", total_bytes(split.heldout_docs)},
      {"source", fs::absolute(data_path, ec).string()},
      {"key", key},
      {"special_ids", {{"unk", kTokenUnk}, {"bos", kTokenBos}, {"eos", kTokenEos}, {"pad", -1}}},
      {"eos_after_each_document", true},
      {"tokenizer_options", opts},
  };
  write_file_atomic(tmp.path / "meta.json", meta.dump(2) + "\n");
  fs::rename(tmp.path, dir, ec);
  if (ec) {
    // Another process may have published the same key first: use theirs.
    std::error_code ec2;
    if (fs::exists(dir / "meta.json", ec2)) return load_cache(dir, vocab_size);
    throw UserError("cannot create cache directory '" + dir.string() + "': " + ec.message());
  }
  tmp.path.clear();
  td.cache_dir = dir;
  td.tokenizer_model = dir / "tokenizer.model";
  td.from_cache = false;
  say("wrote token cache " + dir.string());
  return td;
}

struct Tokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
};

Tokenizer::Tokenizer(const fs::path& model) : impl_(std::make_unique<Impl>()), path_(model) {
  load_processor(impl_->sp, model);
}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

std::vector<int> Tokenizer::encode(std::string_view text, const std::string& what) const {
  std::vector<int> ids;
  if (const auto st = impl_->sp.Encode(std::string(text), &ids); !st.ok())
    throw UserError("cannot encode " + what + " with " + path_.string() + ": " + st.ToString());
  return ids;
}

int Tokenizer::pieces() const { return impl_->sp.GetPieceSize(); }

std::string detokenize(const fs::path& tokenizer_model, const std::vector<int>& ids) {
  sentencepiece::SentencePieceProcessor sp;
  load_processor(sp, tokenizer_model);
  const int n = sp.GetPieceSize();
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= n)
      throw UserError("token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                      " is outside the vocabulary of '" + tokenizer_model.string() + "' (" +
                      std::to_string(n) + " pieces)");
  // Documents are decoded separately (each starts with its own dummy-prefix space) and an
  // EOS becomes a blank line, so a decoded stream stays readable across document ends.
  std::string text;
  std::vector<int> seg;
  auto flush = [&] {
    std::string piece;
    const auto status = sp.Decode(seg, &piece);
    if (!status.ok()) throw UserError("cannot decode tokens: " + status.ToString());
    text += piece;
    seg.clear();
  };
  for (int id : ids) {
    if (id == kTokenEos) {
      flush();
      text += "\n\n";
    } else {
      seg.push_back(id);
    }
  }
  flush();
  return text;
}

}  // namespace fp4
