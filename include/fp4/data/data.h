// Real text in, token batches out: document split, SentencePiece BPE tokenizer, token
// shards on disk, seeded random windows.
#pragma once
#include <cstdint>
#include <cstdio>
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
struct DataSpec;
/// split_corpus of a text or jsonl source (DataSpec formats auto, text, jsonl): every
/// document in memory, for small corpora (tests, tasks built from the held-out documents).
CorpusSplit split_corpus(const DataSpec& spec);

/// One document of a text corpus, as for_each_document hands it over; the views are valid
/// during the callback only.
struct Document {
  int64_t index = 0;       ///< 0-based among the non-empty documents
  bool heldout = false;    ///< index % 10 == 9
  std::string_view name;   ///< relative file name; "<file>#<k>" (text file); "<file>:<line>" (jsonl)
  std::string_view text;   ///< trimmed of ASCII whitespace, non-empty, valid UTF-8
};
/// What one pass of for_each_document saw.
struct CorpusScan {
  std::string format;       ///< "text" or "jsonl"
  int64_t files = 0;        ///< files read
  int64_t documents = 0;    ///< non-empty documents handed over
  int64_t skipped_records = 0;            ///< jsonl records skipped (skip_bad_records)
  std::vector<std::string> first_errors;  ///< messages of the first skipped records
};
/// Streams the documents of a text or jsonl source in corpus order (directories: files sorted
/// by relative path, hidden names skipped), holding one document (text) or one record (jsonl)
/// at a time. Throws fp4::UserError as split_corpus does, for a jsonl error (file and line),
/// for a pre-tokenized format, and if there are fewer than 10 documents (after the pass).
CorpusScan for_each_document(const DataSpec& spec, const std::function<void(const Document&)>& fn);

/// DataSpec::format with "auto" resolved (see DataSpec) and the spec checked: an unknown
/// format, a missing path, a directory that mixes kinds of files, held-out or tokenizer keys on
/// a text format, or a pre-tokenized format without exactly one of heldout / heldout_fraction,
/// each throw fp4::UserError naming the data.* key or file.
std::string resolve_data_format(const DataSpec& spec);

/// Token ids of one split, read-only, in the order training reads them. Stored with 2 bytes
/// per id (uint16, vocabularies of at most 65,536 pieces) or 4 (uint32, larger ones), either in
/// memory or memory-mapped from a token shard, so a corpus larger than memory trains from the
/// page cache. Copies share the storage (cheap; the storage lives as long as any copy).
/// x86-64 only in practice; the bytes are little-endian on every host.
class TokenStream {
 public:
  TokenStream() = default;
  /// An in-memory stream of `ids` with `token_bytes` (2 or 4) bytes per id. Throws
  /// fp4::UserError if token_bytes is neither, or an id does not fit (id > 65535 with 2).
  static TokenStream from_ids(const std::vector<uint32_t>& ids, int token_bytes);
  /// An in-memory uint16 stream (2 bytes per id).
  static TokenStream from_u16(const std::vector<uint16_t>& ids);
  /// `count` ids of `token_bytes` bytes starting `offset` bytes into `file`, memory-mapped
  /// read-only. Throws fp4::UserError naming the file if it cannot be opened or mapped, or if
  /// it is shorter than offset + count · token_bytes.
  static TokenStream map_file(const std::filesystem::path& file, uint64_t offset, uint64_t count,
                              int token_bytes);

  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  int token_bytes() const { return width_; }
  /// Id at index i (unchecked: i < size()).
  uint32_t operator[](size_t i) const {
    const unsigned char* q = p_ + i * static_cast<size_t>(width_);
    return width_ == 2 ? uint32_t{q[0]} | uint32_t{q[1]} << 8
                       : uint32_t{q[0]} | uint32_t{q[1]} << 8 | uint32_t{q[2]} << 16 |
                             uint32_t{q[3]} << 24;
  }
  /// ids[start .. start + n) as int32 into out[0 .. n). Throws std::out_of_range past the end.
  void read(size_t start, size_t n, int32_t* out) const;
  /// The ids [start, start + n) sharing this stream's storage. Throws std::out_of_range.
  TokenStream slice(size_t start, size_t n) const;
  /// All ids, widened (tests and small streams).
  std::vector<uint32_t> ids() const;
  /// The raw little-endian bytes, size() · token_bytes() of them.
  std::string_view bytes() const {
    return {reinterpret_cast<const char*>(p_), n_ * static_cast<size_t>(width_)};
  }
  /// Index of the first id >= vocab, or size() if none.
  size_t first_at_or_above(uint32_t vocab) const;

 private:
  struct Storage;
  std::shared_ptr<const Storage> keep_;
  const unsigned char* p_ = nullptr;
  size_t n_ = 0;
  int width_ = 2;
};

/// Bytes per token id for a vocabulary of `vocab` pieces: 2 up to 65,536, else 4.
inline int token_bytes_for_vocab(int64_t vocab) { return vocab <= 65536 ? 2 : 4; }

/// Where a run's tokens come from: the `[data]` keys of a run config, paths resolved.
/// Formats (`format`):
///   "text"   a text file (documents separated by blank lines) or a directory of text files
///            (one document per file), see split_corpus;
///   "jsonl"  a `.jsonl` / `.jsonl.zst` file or a directory of them: one document per record,
///            the string field `text_field`; a bad record throws unless `skip_bad_records`
///            (then it is counted in the log);
///   "llmc"   pre-tokenized shards as llm.c writes them: 256 int32 header (magic 20240520,
///            version 1: uint16 ids; magic 20240801, version 7: uint32 ids; [2] = count),
///            then the ids; nanoGPT's headerless uint16 `.bin` files are "uint16";
///   "uint16", "uint32"  headerless little-endian ids;
///   "auto"   (default) by name and content: `.jsonl` / `.jsonl.zst` → jsonl, a file that
///            starts with an llm.c magic → llmc, anything else → text; a directory takes the
///            kind of its files and refuses a mix.
/// Pre-tokenized formats take their held-out split from `heldout` (a file or directory of the
/// same format) or from the last `heldout_fraction` of the ids, exactly one of the two; and a
/// SentencePiece `tokenizer` model optionally (needed only to sample or score text tasks).
/// Text formats hold out every 10th document (index % 10 == 9) and train their own tokenizer.
struct DataSpec {
  std::filesystem::path path;
  std::string format = "auto";
  std::string text_field = "text";
  bool skip_bad_records = false;
  std::filesystem::path heldout;
  double heldout_fraction = 0;
  std::filesystem::path tokenizer;
};

/// The names DataSpec::format takes, for --help and error messages: "auto, text, jsonl, llmc,
/// uint16, uint32".
const std::vector<std::string>& data_format_names();

/// Tokenized corpus ready for training.
struct TokenData {
  TokenStream train;    ///< token ids of the training split, documents concatenated
  TokenStream heldout;  ///< token ids of the held-out split
  int vocab_size = 0;
  std::string format;                     ///< the resolved DataSpec::format ("text", ...)
  std::filesystem::path tokenizer_model;  ///< SentencePiece .model file; empty: none
  std::filesystem::path cache_dir;
  bool from_cache = false;
  int64_t skipped_records = 0;  ///< jsonl records skipped (skip_bad_records)
  /// Other keys of the same tokens: the key the cache had before version 2 of the key
  /// (2026-12), for a text corpus whose tokenizer is unchanged by it (checkpoints made
  /// earlier name that key).
  std::vector<std::string> key_aliases;
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

/// What a data source holds, from one streaming pass over it (and from its cache once built):
/// what `fp4train data` prints.
struct DataSummary {
  std::string format;            ///< resolved format
  std::filesystem::path path;
  int64_t files = 0;             ///< input files read
  int64_t train_docs = 0, heldout_docs = 0;    ///< text formats: non-empty documents
  int64_t train_bytes = 0, heldout_bytes = 0;  ///< text: UTF-8 bytes; tokens: file bytes
  int64_t skipped_records = 0;   ///< jsonl with skip_bad_records
  std::vector<std::string> first_errors;  ///< the first skipped records' errors
  int vocab_size = 0;
  int token_bytes = 2;           ///< bytes per id in the cache
  std::string key;               ///< cache key: 16 hex digits
  std::filesystem::path cache_dir;
  bool cached = false;           ///< cache_dir holds a complete cache
  int64_t train_tokens = -1, heldout_tokens = -1;  ///< from the cache; -1: not built
  std::filesystem::path tokenizer_model;           ///< empty: none
  /// The key came from an earlier full scan with the same scan stamp (file names, sizes and
  /// modification times): the corpus was not read again (prepare_tokens only).
  bool scan_reused = false;
};

/// Scan `spec` (one full streaming pass, memory bounded by the largest document or record) and
/// look its cache up under `cache_root`, without building anything. A built cache's scan is
/// stored under cache_root/.scans/ (see prepare_tokens). Throws fp4::UserError as
/// prepare_tokens does for bad data.
DataSummary describe_data(const DataSpec& spec, int vocab_size,
                          const std::filesystem::path& cache_root,
                          const std::function<void(const std::string&)>& log = {});

/// Train (or load from cache) a SentencePiece BPE tokenizer of `vocab_size` pieces on the
/// training split only, encode both splits and write token shards (`train.bin`,
/// `heldout.bin`, see token_shard_to_bytes) under `cache_root / <hash of inputs>`; for
/// pre-tokenized formats, check the ids against `vocab_size` and copy them into the same
/// shards. The hash covers the format, document names and bytes (or token files' names and
/// bytes, and the held-out choice), vocab size and tokenizer options, so a changed corpus never
/// reuses a stale cache. Corpora are streamed: documents are read and encoded in batches on
/// every core, so memory stays bounded whatever the corpus size; the returned streams are
/// memory-mapped from the cache. The key's pass over the data is skipped when an earlier full
/// scan of the same files (same relative names, sizes and modification times, and the same
/// other inputs) found a cache that still exists: describe_data always scans in full. The
/// tokenizer trains on at most kMaxTokenizerTrainBytes of
/// text (a deterministic line subsample beyond it). Writes are atomic (the directory is built
/// under a temporary name and renamed). `log` receives progress lines.
/// Throws fp4::UserError on bad data (naming the file, line or offset), vocab_size outside
/// [256, 2^31), a tokenizer the training split is too small for, or a corrupt cache (names the
/// file).
TokenData prepare_tokens(const DataSpec& spec, int vocab_size,
                         const std::filesystem::path& cache_root,
                         const std::function<void(const std::string&)>& log = {});
/// prepare_tokens of DataSpec{data_path} (format auto).
TokenData prepare_tokens(const std::filesystem::path& data_path, int vocab_size,
                         const std::filesystem::path& cache_root,
                         const std::function<void(const std::string&)>& log = {});

/// The tokenizer of a text corpus trains on at most this many bytes of its training split.
inline constexpr size_t kMaxTokenizerTrainBytes = size_t{32} << 20;

/// Version of the token-shard layout written by token_shard_to_bytes / TokenShardWriter.
inline constexpr uint32_t kTokenShardVersion = 2;

/// The bytes of one token shard of the cache (train.bin, heldout.bin), little-endian:
/// "FP4TOK01" | uint32 version = 2 | uint32 vocab | uint32 token_bytes (2 or 4) | uint32 0 |
/// uint64 count | count × token_bytes ids (32-byte header). Version 1 (written before
/// 2026-12, still read): "FP4TOK01" | uint32 1 | uint32 vocab | uint64 count | uint16 ids.
/// Ids are not checked (token_shard_from_bytes checks them). token_bytes is the stream's.
std::string token_shard_to_bytes(const TokenStream& tokens, int vocab);

/// The layout of a token shard, from its first bytes and its size.
struct TokenShardLayout {
  uint32_t version = 0;
  int token_bytes = 2;
  uint64_t count = 0;
  size_t header_bytes = 0;
};
/// Parse and check a shard header: `head` is at least the file's first 32 bytes (or all of
/// it), `file_size` its size. Throws fp4::UserError (token_cache_corrupt naming `name`) if it
/// is shorter than its header, has a bad magic, an unknown version, another vocab, a width
/// other than 2 or 4 (or 2 for a vocabulary above 65,536), or a count that disagrees with the
/// size.
TokenShardLayout token_shard_layout(std::string_view head, uint64_t file_size, int vocab,
                                    const std::filesystem::path& name);

/// Parse a token shard (either version) read from `name`, for a tokenizer of `vocab` pieces:
/// token_shard_layout's checks, then every id < vocab (else token_cache_corrupt naming the
/// index). The result owns a copy of the ids. Accepted version-2 bytes are exactly
/// token_shard_to_bytes of the result (tests/fuzz/fuzz_token_shard.cpp).
TokenStream token_shard_from_bytes(std::string_view bytes, int vocab,
                                   const std::filesystem::path& name);

/// token_shard_from_bytes's checks on a shard file (the ids checked with read_token_chunks),
/// then the shard memory-mapped: its pages enter the process as training reads them.
TokenStream map_token_shard(const std::filesystem::path& file, int vocab);

/// Reads ids [0, count) of `token_bytes` bytes each, starting `offset` bytes into `file`, in
/// chunks of at most 2^20 ids with read(2), calling fn(ids, n, index of ids[0]) per chunk.
/// Unlike a mapping, the process's memory does not grow with the file (only the page cache
/// does). Throws fp4::UserError naming the file if it cannot be read or is shorter.
void read_token_chunks(const std::filesystem::path& file, uint64_t offset, uint64_t count, int token_bytes,
                       const std::function<void(const uint32_t* ids, size_t n, uint64_t first)>& fn);

/// "token cache file '<file>' is corrupt (<why>); delete '<its directory>' to rebuild it".
std::string token_cache_corrupt(const std::filesystem::path& file, const std::string& why);

/// Writes a version-2 token shard incrementally: ids are appended in chunks and the count is
/// patched into the header by finish(), so a shard of any size is written with bounded memory.
/// A writer destroyed before finish() removes its file.
class TokenShardWriter {
 public:
  /// Creates (truncates) `file`; ids take token_bytes_for_vocab(vocab) bytes. Throws
  /// fp4::UserError if the file cannot be created.
  TokenShardWriter(const std::filesystem::path& file, int vocab);
  ~TokenShardWriter();
  TokenShardWriter(const TokenShardWriter&) = delete;
  TokenShardWriter& operator=(const TokenShardWriter&) = delete;
  /// Appends ids (each must be < vocab: throws std::logic_error otherwise, a bug of the caller).
  void append(const uint32_t* ids, size_t n);
  void append(const int* ids, size_t n);
  uint64_t count() const { return count_; }
  /// Writes the header's count, flushes and closes. Throws fp4::UserError on a write error
  /// (disk full).
  void finish();

 private:
  void put(uint32_t id);
  void flush_buffer();
  std::filesystem::path file_;
  std::FILE* f_ = nullptr;
  int vocab_, width_;
  uint64_t count_ = 0;
  std::string buf_;
};

/// Writes `tokens` as a pre-tokenized file of `format`: "llmc" (llm.c's 1024-byte header:
/// magic 20240520 / version 1 with 2-byte streams, 20240801 / 7 with 4-byte ones, then the
/// ids), "uint16" or "uint32" (headerless). Atomic (temporary file, then rename). Throws
/// fp4::UserError for an unknown format, ids that do not fit (uint16 with ids above 65,535),
/// more than 2^31 − 1 ids in an llmc file (its count is an int32), or a write error.
void write_token_file(const TokenStream& tokens, const std::filesystem::path& file,
                      const std::string& format);

/// Pre-tokenized input files (DataSpec formats llmc, uint16, uint32): where the ids are.
struct TokenFileLayout {
  size_t header_bytes = 0;  ///< 1024 for llmc, 0 for headerless files
  int token_bytes = 2;
  uint64_t count = 0;
};
/// The layout of a pre-tokenized file of `format` ("llmc", "uint16" or "uint32"): `head` is at
/// least its first 1024 bytes (or all of it), `file_size` its size. Throws fp4::UserError
/// naming `name` if an llmc file has another magic or version, a negative count, or a size that
/// is not header + count · width, or if a headerless file's size is not a multiple of its width.
TokenFileLayout token_file_layout(std::string_view head, uint64_t file_size,
                                  const std::string& format, const std::filesystem::path& name);

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
  /// One vocabulary entry: its piece ("▁the", "<0x0A>"), score (the BPE merge rank as
  /// SentencePiece stores it) and type as SentencePiece numbers them (ModelProto
  /// SentencePiece.Type: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte),
  /// which are llama.cpp's token types too (llama_token_type).
  struct Piece {
    std::string piece;
    float score = 0;
    int type = 1;
  };
  /// Every entry of the vocabulary, by id.
  std::vector<Piece> vocabulary() const;
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
  BatchSampler(const TokenStream& tokens, int seq_len, int batch, uint64_t seed);
  void next(int32_t* inputs, int32_t* targets);
  uint64_t draws() const { return draws_; }
  void set_draws(uint64_t d) { draws_ = d; }

 private:
  TokenStream tokens_;
  int seq_len_, batch_;
  uint64_t seed_, draws_ = 0;
};

/// Deterministic held-out evaluation windows: non-overlapping windows of seq_len + 1 tokens
/// (stride seq_len) from the start of `tokens`, at most `max_windows`.
/// Returns the start offsets.
std::vector<int64_t> heldout_windows(int64_t n_tokens, int seq_len, int max_windows);

}  // namespace fp4
