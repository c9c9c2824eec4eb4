// SentencePiece BPE tokenizer (see include/fp4/data/data.h; the cache that uses it is
// src/data/token_cache.cpp).
//
// Tokenizer: SentencePiece BPE trained on the training split only, with byte fallback (any
// UTF-8 encodes, no <unk>), identity normalization and no whitespace collapsing, so
// decode(encode(text)) == text exactly, newlines included (a '\n' is the byte piece
// <0x0A>; training sees the text one line per sentence, at most kMaxTokenizerTrainBytes of
// it: a deterministic subsample of lines beyond). Special ids: kTokenUnk = 0, kTokenBos = 1
// (unused), kTokenEos = 2, no pad id; ids 3..258 are the byte pieces.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "fp4/data/data.h"
#include "tokenizer_internal.h"
#include "fp4/base/error.h"

namespace fp4 {
namespace fs = std::filesystem;

namespace {
// Lines longer than this are cut (at a space where possible) before training;
// SentencePiece skips sentences longer than max_sentence_length.
constexpr size_t kMaxTrainLine = 8192;
constexpr unsigned kTrainSeed = 0x5EED;

}  // namespace

namespace detail {
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
      {"max_train_bytes", std::to_string(kMaxTokenizerTrainBytes)},  // ours, not passed to SentencePiece
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
}  // namespace detail

namespace {

void load_processor(sentencepiece::SentencePieceProcessor& sp, const fs::path& model) {
  const auto status = sp.Load(model.string());
  if (!status.ok())
    throw UserError("cannot load tokenizer model '" + model.string() + "': " + status.ToString());
}

}  // namespace

namespace detail {

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

void append_training_lines(std::string_view doc, size_t stride, size_t& line_no, std::string& out) {
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

size_t training_stride(size_t train_bytes) {
  return train_bytes > kMaxTokenizerTrainBytes
             ? (train_bytes + kMaxTokenizerTrainBytes - 1) / kMaxTokenizerTrainBytes
             : 1;
}

namespace {
// The training text's lines, one sentence each, as SentencePiece's own file reader would
// give them. Training through an iterator (not input=FILE) keeps the temporary file's path out
// of the model's trainer spec: two builds of one cache write byte-identical tokenizer.model
// files, wherever they were built (a rebuilt cache then still resumes its runs).
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(const fs::path& file) : in_(file, std::ios::binary) {
    if (!in_) throw UserError("cannot read tokenizer training text '" + file.string() + "'");
    Next();
  }
  bool done() const override { return done_; }
  void Next() override { done_ = !std::getline(in_, line_); }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return sentencepiece::util::Status(); }

 private:
  std::ifstream in_;
  std::string line_;
  bool done_ = false;
};
}  // namespace

void train_tokenizer(const fs::path& input, const fs::path& model_prefix, int vocab_size,
                     const fs::path& data_path) {
  auto kwargs = trainer_options(vocab_size);
  kwargs.erase("max_train_bytes");
  kwargs.erase("seed");
  kwargs["num_threads"] = "2";
  kwargs["minloglevel"] = "1";  // warnings and errors only
  sentencepiece::SetRandomGeneratorSeed(kTrainSeed);
  LineIterator lines(input);
  std::string proto;
  const auto status = sentencepiece::SentencePieceTrainer::Train(kwargs, &lines, &proto);
  if (!status.ok()) {
    std::string msg = status.ToString();
    if (msg.find("required_chars") != std::string::npos)
      msg += " (the 256 byte-fallback pieces and 3 special tokens count toward vocab_size, and "
             "every distinct character of the training text needs a piece of its own)";
    throw UserError("tokenizer training on '" + data_path.string() + "' with vocab_size " +
                    std::to_string(vocab_size) + " failed: " + msg);
  }
  {
    std::ofstream out(model_prefix.string() + ".model", std::ios::binary | std::ios::trunc);
    out.write(proto.data(), static_cast<std::streamsize>(proto.size()));
    out.flush();
    if (!out) throw UserError("cannot write '" + model_prefix.string() + ".model' (disk full?)");
  }
  sentencepiece::SentencePieceProcessor sp;
  load_processor(sp, model_prefix.string() + ".model");
  if (sp.GetPieceSize() != vocab_size)
    throw UserError("the training split of '" + data_path.string() + "' is too small for vocab_size " +
                    std::to_string(vocab_size) + ": BPE found only " +
                    std::to_string(sp.GetPieceSize()) + " pieces; use a smaller vocab_size");
  // tokenizer.vocab, for reading: "<piece>\t<score>" per id, as SentencePiece writes it.
  std::ofstream vocab(model_prefix.string() + ".vocab", std::ios::binary | std::ios::trunc);
  for (int id = 0; id < sp.GetPieceSize(); ++id) vocab << sp.IdToPiece(id) << '\t' << sp.GetScore(id) << '\n';
}

}  // namespace detail

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

std::vector<Tokenizer::Piece> Tokenizer::vocabulary() const {
  const sentencepiece::SentencePieceProcessor& sp = impl_->sp;
  std::vector<Piece> v(static_cast<size_t>(sp.GetPieceSize()));
  for (int id = 0; id < sp.GetPieceSize(); ++id) {
    Piece& p = v[static_cast<size_t>(id)];
    p.piece = sp.IdToPiece(id);
    p.score = sp.GetScore(id);
    p.type = sp.IsUnknown(id) ? 2 : sp.IsControl(id) ? 3 : sp.IsUnused(id) ? 5 : sp.IsByte(id) ? 6 : 1;
  }
  return v;
}

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
