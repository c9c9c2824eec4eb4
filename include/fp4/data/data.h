// Real text in, token batches out: document split, SentencePiece BPE tokenizer, token
// shards on disk, seeded random windows.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace fp4 {

/// Text documents of a corpus, split deterministically into train and held-out parts.
/// A directory: every regular file below it (recursively, sorted by relative path) is one
/// document; documents whose 0-based index i satisfies i % 10 == 9 are held out.
/// A single file: documents are separated by blank lines, same rule.
/// Throws fp4::UserError if the path does not exist, holds no non-empty text, is not valid
/// UTF-8 (names the file and byte offset), or yields no held-out document.
struct CorpusSplit {
  std::vector<std::string> train_docs;
  std::vector<std::string> heldout_docs;
  std::vector<std::string> train_names, heldout_names;  ///< file names (or "file#k")
};
CorpusSplit split_corpus(const std::filesystem::path& data_path);

/// Tokenized corpus ready for training.
struct TokenData {
  std::vector<uint16_t> train;   ///< token ids of the training split, documents concatenated
  std::vector<uint16_t> heldout; ///< token ids of the held-out split
  int vocab_size = 0;
  std::filesystem::path tokenizer_model;  ///< SentencePiece .model file
  std::filesystem::path cache_dir;
  bool from_cache = false;
};

/// Special token ids of the tokenizer that prepare_tokens trains: 0 = <unk> (not produced:
/// byte fallback encodes any UTF-8), 1 = <s> (unused), 2 = </s>, written after every
/// document in the train/held-out streams. There is no padding id. Ids 3..258 are the 256
/// byte-fallback pieces <0x00>..<0xFF>.
inline constexpr int kTokenUnk = 0, kTokenBos = 1, kTokenEos = 2;

/// Output `index` (0-based) of the SplitMix64 generator seeded with `seed`:
/// z = seed + (index + 1)·0x9E3779B97F4A7C15, then the SplitMix64 finalizer. Used by
/// BatchSampler; splitmix64(0, 0) == 0xE220A8397B1DCDAF.
uint64_t splitmix64(uint64_t seed, uint64_t index);

/// Train (or load from cache) a SentencePiece BPE tokenizer of `vocab_size` pieces on the
/// training split only, encode both splits and write token shards (`train.bin`,
/// `heldout.bin`, little-endian uint16 with a small header) under
/// `cache_root / <hash of inputs>`. The hash covers document names and bytes, vocab size and
/// tokenizer options, so a changed corpus never reuses a stale cache. Writes are atomic
/// (temporary file then rename). `log` receives human-readable progress lines.
/// Throws fp4::UserError on bad data (see split_corpus), vocab_size outside [256, 65535],
/// or a corrupt cache (names the file).
TokenData prepare_tokens(const std::filesystem::path& data_path, int vocab_size,
                         const std::filesystem::path& cache_root,
                         const std::function<void(const std::string&)>& log = {});

/// Version of the token-shard layout (token_shard_to_bytes), the uint32 after the magic.
inline constexpr uint32_t kTokenShardVersion = 1;

/// The bytes of one token shard of the cache (train.bin, heldout.bin), little-endian:
/// "FP4TOK01" | uint32 version (kTokenShardVersion) | uint32 vocab | uint64 count |
/// count × uint16 token ids. Ids are not checked (token_shard_from_bytes checks them).
std::string token_shard_to_bytes(const std::vector<uint16_t>& tokens, int vocab);

/// Parse a token shard (the layout of token_shard_to_bytes) read from `name`, for a tokenizer
/// of `vocab` pieces. Throws fp4::UserError (token_cache_corrupt: names the file and says to
/// delete the cache directory) if it is shorter than the 24-byte header, has a bad magic, an
/// unknown version, another vocab, a count that disagrees with its size, or an id >= vocab.
/// Accepted bytes are exactly token_shard_to_bytes of the result (tests/fuzz/fuzz_token_shard.cpp).
std::vector<uint16_t> token_shard_from_bytes(std::string_view bytes, int vocab,
                                             const std::filesystem::path& name);

/// "token cache file '<file>' is corrupt (<why>); delete '<its directory>' to rebuild it".
std::string token_cache_corrupt(const std::filesystem::path& file, const std::string& why);

/// A trained SentencePiece model (the run's tokenizer.model), loaded once: what the commands
/// above `data` use instead of SentencePiece itself.
class Tokenizer {
 public:
  /// Loads `model`; throws fp4::UserError "cannot load tokenizer model '<file>': <why>".
  explicit Tokenizer(const std::filesystem::path& model);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  /// The ids of `text` (no EOS added; the model's dummy prefix applies). Throws
  /// fp4::UserError naming `what` (e.g. "--prompt") if SentencePiece refuses the text.
  std::vector<int> encode(std::string_view text, const std::string& what = "text") const;
  /// Pieces of the vocabulary (ids 0 .. pieces() − 1).
  int pieces() const;
  const std::filesystem::path& path() const { return path_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::filesystem::path path_;
};

/// Decode token ids back to text with the tokenizer (for samples and tests).
std::string detokenize(const std::filesystem::path& tokenizer_model, const std::vector<int>& ids);

/// Random contiguous windows of seq_len + 1 tokens drawn by a seeded counter-based
/// generator: window r of draw k starts at splitmix64(seed, k·batch + r) mod
/// (n − seq_len), so the stream is reproducible and resumable from draws() alone.
/// inputs/targets are [batch, seq_len] int32, targets shifted by one.
/// Throws fp4::UserError if the token stream is shorter than seq_len + 1.
class BatchSampler {
 public:
  BatchSampler(const std::vector<uint16_t>& tokens, int seq_len, int batch, uint64_t seed);
  void next(int32_t* inputs, int32_t* targets);
  uint64_t draws() const { return draws_; }
  void set_draws(uint64_t d) { draws_ = d; }

 private:
  const std::vector<uint16_t>* tokens_;
  int seq_len_, batch_;
  uint64_t seed_, draws_ = 0;
};

/// Deterministic held-out evaluation windows: non-overlapping windows of seq_len + 1 tokens
/// (stride seq_len) from the start of `tokens`, at most `max_windows`.
/// Returns the start offsets.
std::vector<int64_t> heldout_windows(int64_t n_tokens, int seq_len, int max_windows);

}  // namespace fp4
