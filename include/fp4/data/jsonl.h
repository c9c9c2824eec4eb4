// JSONL corpora: one JSON object per line, the document text in one string field, read as a
// stream from a plain `.jsonl` file or a zstd-compressed `.jsonl.zst` file (docs/data.md
// "JSONL"). Each line is parsed with simdjson (DOM parser, strict: the whole line must
// be one JSON value, valid UTF-8); `.zst` files are decompressed with libzstd's streaming API.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace fp4 {

/// How a JSONL corpus is read.
struct JsonlOptions {
  std::string text_field = "text";  ///< top-level string field holding the document text
  bool skip_bad_records = false;    ///< false: the first bad record throws; true: skip and count it
};

/// What a read_jsonl_file / read_jsonl_bytes call saw. The call resets it at its start and
/// updates it as it goes, so after a throw it holds the counts up to the failing line.
struct JsonlStats {
  int64_t records = 0;   ///< records delivered to the callback (including empty texts)
  int64_t skipped = 0;   ///< bad records skipped (only with skip_bad_records)
  int64_t bytes = 0;     ///< uncompressed bytes read
  std::vector<std::string> first_errors;  ///< messages of the first (at most 5) skipped records
};

/// Calls fn(line, text) for every record of a `.jsonl` or `.jsonl.zst` file (a `.zst` file when
/// the name ends in ".zst", otherwise plain), in file order, streaming: memory stays bounded by
/// the longest line plus fixed buffers, whatever the file size (about 16 bytes per byte of the
/// longest line: the line, simdjson's tape and string buffer; fixed: a 256 KiB read buffer, and
/// for `.zst` the zstd window, at most 128 MiB: libzstd's default limit).
///
/// Lines end at '\n' (a trailing '\r' is dropped, the last line may lack '\n'); `line` is the
/// 1-based line number in the uncompressed stream. A blank line (nothing but ' ', '\t', '\r',
/// '\f', '\v') is skipped silently and is not a record. Every other line is a record: one JSON
/// object (any length; other fields are ignored; of duplicate keys the first counts) whose field
/// opts.text_field is a string. `text` is that string, unescaped, valid UTF-8 (strictly: no
/// overlong forms, no surrogates, nothing above U+10FFFF; it may be empty: the caller skips
/// empty documents); the view is valid only during the call of fn.
///
/// Errors: fp4::UserError, the message "<file>:<line>: <what>" for a bad record, <what> one of
///   "not valid JSON (<simdjson's reason>)", also "not valid JSON (unpaired surrogate escape
///     \uD800 at byte offset <k> of the line)" for an escape that is not half of a pair,
///   "not valid UTF-8 (invalid byte 0xC3 at byte offset <k> of the line)" (raw bytes),
///   "the record is not a JSON object (it is an array)",
///   "has no field \"text\"", "field \"text\" is not a string (it is a number)",
///   "the text is not valid UTF-8 (invalid byte 0x.. at byte offset <k> of the text)";
/// byte offsets are 0-based. With opts.skip_bad_records such a record is counted in stats
/// (skipped, first_errors) instead and reading goes on. Always thrown, whatever the option:
///   "<file>: cannot open the file (<strerror>)", "<file>: cannot read the file (<strerror>)",
///   "<file>: not zstd data (<ZSTD_getErrorName>)" (the first bytes are not a zstd frame, or the
///     file is empty), "<file>: corrupt zstd data (<ZSTD_getErrorName>) after <N> uncompressed
///     bytes" (a later frame or block is bad, e.g. a checksum mismatch or trailing garbage),
///   "<file>: a zstd frame needs a window above the reader's limit of 128 MiB (...)",
///   "<file>: truncated zstd frame (the stream ends inside a frame after <N> uncompressed bytes)".
/// An exception thrown by fn propagates unchanged (it is not a bad record). Calls share
/// nothing (each has its own parser and buffers): files may be read on several threads at once.
void read_jsonl_file(const std::filesystem::path& file, const JsonlOptions& opts,
                     const std::function<void(int64_t line, std::string_view text)>& fn,
                     JsonlStats* stats = nullptr);

/// The same on bytes already in memory (uncompressed JSONL), `name` used in messages in place of
/// the file. What the fuzz target drives; read_jsonl_file splits its stream into lines and hands
/// each to this same per-line code. With opts.skip_bad_records it throws nothing of its own
/// (only std::bad_alloc when memory runs out, and what fn throws).
void read_jsonl_bytes(std::string_view bytes, const std::string& name, const JsonlOptions& opts,
                      const std::function<void(int64_t line, std::string_view text)>& fn,
                      JsonlStats* stats = nullptr);

/// True if `p`'s file name ends in ".jsonl" or ".jsonl.zst" (case-sensitive; the name only:
/// whether the file exists is not looked at).
bool is_jsonl_path(const std::filesystem::path& p);

}  // namespace fp4
