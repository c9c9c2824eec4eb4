// JSONL corpora, plain and zstd-compressed (see include/fp4/data/jsonl.h).
//
// Details beyond the header:
//  * One code path per line (LineReader::line): read_jsonl_bytes splits its bytes at '\n',
//    read_jsonl_file splits a stream of 256 KiB chunks (fread, or ZSTD_decompressStream) and
//    hands every line to the same LineReader; a line that spans chunks is gathered in `carry_`.
//  * Each line is copied into a buffer with SIMDJSON_PADDING bytes behind it and parsed by one
//    simdjson DOM parser, reused for every line (its buffers grow to the longest line and stay).
//    The DOM parser validates the whole line: exactly one JSON value, UTF-8 (strict: simdjson
//    refuses overlong forms, surrogates and code points above U+10FFFF in raw bytes), string
//    escapes (an unpaired \uD800..\uDFFF escape is a STRING_ERROR), no unescaped control
//    characters. Its reason is reported as error_message(code); for UTF8_ERROR and STRING_ERROR
//    the line is scanned again here to name the byte or the escape.
//  * The text is checked once more with the strict UTF-8 check of corpus.cpp (the same rules,
//    repeated here because corpus.cpp keeps it private): simdjson's unescaping cannot produce
//    invalid UTF-8, so "the text is not valid UTF-8" is a guard, not an expected message.
//  * zstd: frames follow one another (a multi-frame file is one stream; skippable frames are
//    skipped by libzstd); the stream must end at a frame boundary. The window limit is libzstd's
//    default (ZSTD_WINDOWLOG_LIMIT_DEFAULT, 2^27 bytes).
#include "fp4/data/jsonl.h"
#include "utf8.h"

#include <simdjson.h>
#include <zstd.h>
#include <zstd_errors.h>  // ZSTD_getErrorCode

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fp4/base/error.h"

namespace fp4 {
namespace fs = std::filesystem;

namespace {

using RecordFn = std::function<void(int64_t line, std::string_view text)>;

constexpr size_t kMaxFirstErrors = 5;
constexpr size_t kReadChunk = size_t{256} << 10;  // bytes per fread / per decompressed chunk

// A blank line holds only these (corpus.cpp's whitespace; '\n' ends the line).
bool is_blank(std::string_view s) {
  for (char c : s)
    if (c != ' ' && c != '\t' && c != '\r' && c != '\f' && c != '\v') return false;
  return true;
}

std::string hex_byte(char c) {
  char hex[8];
  std::snprintf(hex, sizeof hex, "0x%02X", static_cast<unsigned>(static_cast<unsigned char>(c)));
  return hex;
}

// "invalid byte 0xC3 at byte offset 17 of the <what>"
std::string invalid_byte(std::string_view s, size_t at, const char* what) {
  return "invalid byte " + hex_byte(s[at]) + " at byte offset " + std::to_string(at) + " of the " +
         what;
}

// The value of 4 hex digits at s[i..i+4), or -1.
int hex4(std::string_view s, size_t i) {
  if (i + 4 > s.size()) return -1;
  int v = 0;
  for (size_t k = i; k < i + 4; ++k) {
    const char c = s[k];
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else return -1;
    v = v * 16 + d;
  }
  return v;
}

// The first \uXXXX escape of `s` that is a surrogate not paired (a high one not followed by
// a low-surrogate escape, or a lone low one): its offset, or npos. Every backslash is taken
// as the start of an escape (outside strings a backslash is an error anyway).
size_t unpaired_surrogate_escape(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (s[i] != '\\') {
      ++i;
      continue;
    }
    if (i + 1 >= s.size() || s[i + 1] != 'u') {
      i += 2;
      continue;
    }
    const int cp = hex4(s, i + 2);
    if (cp < 0) {
      i += 2;
      continue;
    }
    if (cp >= 0xDC00 && cp <= 0xDFFF) return i;
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      const bool paired = i + 8 <= s.size() && s[i + 6] == '\\' && s[i + 7] == 'u' &&
                          hex4(s, i + 8) >= 0xDC00 && hex4(s, i + 8) <= 0xDFFF;
      if (!paired) return i;
      i += 12;
      continue;
    }
    i += 6;
  }
  return std::string_view::npos;
}

const char* type_name(simdjson::dom::element_type t) {
  using T = simdjson::dom::element_type;
  switch (t) {
    case T::ARRAY: return "an array";
    case T::OBJECT: return "an object";
    case T::INT64:
    case T::UINT64:
    case T::DOUBLE: return "a number";
    case T::STRING: return "a string";
    case T::BOOL: return "a boolean";
    case T::NULL_VALUE: return "null";
  }
  return "of another type";
}

// The per-line logic of both entry points: blank lines, the JSON record, its text field,
// the UTF-8 check, the callback or the bad-record accounting.
class LineReader {
 public:
  LineReader(const std::string& name, const JsonlOptions& opts, const RecordFn& fn,
             JsonlStats* stats)
      : name_(name), opts_(opts), fn_(fn), stats_(stats ? stats : &own_stats_) {
    *stats_ = JsonlStats{};
  }

  /// The next line of the stream, without its '\n'; `terminated`: it had one.
  void line(std::string_view l, bool terminated) {
    ++lineno_;
    stats_->bytes += static_cast<int64_t>(l.size()) + (terminated ? 1 : 0);
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    if (is_blank(l)) return;
    std::string_view text;
    std::string what = record_text(l, &text);
    if (!what.empty()) {
      std::string msg = name_ + ":" + std::to_string(lineno_) + ": " + what;
      if (!opts_.skip_bad_records) throw UserError(msg);
      ++stats_->skipped;
      if (stats_->first_errors.size() < kMaxFirstErrors)
        stats_->first_errors.push_back(std::move(msg));
      return;
    }
    ++stats_->records;
    fn_(lineno_, text);
  }

 private:
  // Parses the line; on success sets *text (valid until the next parse) and returns "", else
  // returns what is wrong with the record.
  std::string record_text(std::string_view l, std::string_view* text) {
    const size_t need = l.size() + simdjson::SIMDJSON_PADDING;
    if (buf_.size() < need) buf_.resize(need);
    std::memcpy(buf_.data(), l.data(), l.size());
    simdjson::dom::element doc;
    const simdjson::error_code err = parser_.parse(buf_.data(), l.size(), false).get(doc);
    if (err) return json_error(err, l);
    simdjson::dom::object obj;
    if (doc.get_object().get(obj))
      return std::string("the record is not a JSON object (it is ") + type_name(doc.type()) + ")";
    simdjson::dom::element v;
    if (obj.at_key(opts_.text_field).get(v)) return "has no field \"" + opts_.text_field + "\"";
    if (v.get_string().get(*text))
      return "field \"" + opts_.text_field + "\" is not a string (it is " + type_name(v.type()) +
             ")";
    const size_t bad = detail::first_invalid_utf8(*text);
    if (bad != std::string_view::npos)
      return "the text is not valid UTF-8 (" + invalid_byte(*text, bad, "text") + ")";
    return {};
  }

  static std::string json_error(simdjson::error_code err, std::string_view l) {
    if (err == simdjson::MEMALLOC) throw std::bad_alloc();
    if (err == simdjson::UTF8_ERROR) {
      const size_t bad = detail::first_invalid_utf8(l);
      if (bad != std::string_view::npos)
        return "not valid UTF-8 (" + invalid_byte(l, bad, "line") + ")";
    }
    if (err == simdjson::STRING_ERROR) {
      const size_t at = unpaired_surrogate_escape(l);
      if (at != std::string_view::npos)
        return "not valid JSON (unpaired surrogate escape " + std::string(l.substr(at, 6)) +
               " at byte offset " + std::to_string(at) + " of the line)";
    }
    if (l.substr(0, 3) == "\xEF\xBB\xBF")
      return "not valid JSON (the line starts with a UTF-8 byte-order mark, EF BB BF; JSONL has "
             "none: remove it)";
    return std::string("not valid JSON (") + simdjson::error_message(err) + ")";
  }

  const std::string& name_;
  const JsonlOptions& opts_;
  const RecordFn& fn_;
  JsonlStats own_stats_;
  JsonlStats* stats_;
  int64_t lineno_ = 0;
  simdjson::dom::parser parser_;
  std::vector<char> buf_;  // the current line + SIMDJSON_PADDING (contents behind it unused)
};

// Splits a stream of chunks into lines for a LineReader; a line that spans chunks is gathered.
class LineSplitter {
 public:
  explicit LineSplitter(LineReader& r) : r_(r) {}
  void chunk(std::string_view c) {
    size_t pos = 0;
    while (pos < c.size()) {
      const size_t eol = c.find('\n', pos);
      if (eol == std::string_view::npos) {
        carry_.append(c.substr(pos));
        return;
      }
      if (carry_.empty()) {
        r_.line(c.substr(pos, eol - pos), true);
      } else {
        carry_.append(c.substr(pos, eol - pos));
        r_.line(carry_, true);
        carry_.clear();  // keeps its capacity: bounded by the longest line
      }
      pos = eol + 1;
    }
  }
  /// The end of the stream: a last line without '\n'.
  void finish() {
    if (!carry_.empty()) r_.line(carry_, false);
    carry_.clear();
  }

 private:
  LineReader& r_;
  std::string carry_;
};

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

File open_file(const fs::path& file) {
  File f(std::fopen(file.c_str(), "rb"));
  if (!f) throw UserError(file.string() + ": cannot open the file (" + std::strerror(errno) + ")");
  return f;
}

// Up to cap bytes of the file; 0 at its end.
size_t read_some(std::FILE* f, char* buf, size_t cap, const fs::path& file) {
  errno = 0;
  const size_t got = std::fread(buf, 1, cap, f);
  if (got < cap && std::ferror(f))
    throw UserError(file.string() + ": cannot read the file (" +
                    std::strerror(errno ? errno : EIO) + ")");
  return got;
}

// A .zst file as a stream of decompressed chunks.
class ZstdReader {
 public:
  ZstdReader(std::FILE* f, const fs::path& file)
      : f_(f), file_(file), in_(ZSTD_DStreamInSize()) {
    dctx_ = ZSTD_createDCtx();
    if (!dctx_) throw std::bad_alloc();
  }
  ~ZstdReader() { ZSTD_freeDCtx(dctx_); }
  ZstdReader(const ZstdReader&) = delete;
  ZstdReader& operator=(const ZstdReader&) = delete;

  /// Up to cap decompressed bytes; 0 at the end of the stream (after a complete frame).
  size_t read(char* out, size_t cap) {
    ZSTD_outBuffer ob{out, cap, 0};
    while (ob.pos < ob.size) {
      if (ib_.pos == ib_.size && !eof_) refill();
      if (ib_.pos == ib_.size && eof_) {
        if (hint_ == 0) break;  // between frames: the end of the stream
        // Inside a frame with no input left: flush what the decoder holds, if anything.
        const size_t before = ob.pos;
        step(&ob);
        if (ob.pos == before) {
          if (hint_ != 0 && ob.pos > 0) break;  // deliver what came out; throw on the next call
          if (hint_ != 0)
            throw UserError(file_.string() +
                            ": truncated zstd frame (the stream ends inside a frame after " +
                            std::to_string(produced_ + ob.pos) + " uncompressed bytes)");
          break;
        }
        continue;
      }
      step(&ob);
    }
    produced_ += static_cast<int64_t>(ob.pos);
    return ob.pos;
  }

 private:
  void refill() {
    const size_t got = read_some(f_, in_.data(), in_.size(), file_);
    if (got == 0) {
      eof_ = true;
      if (!any_input_) throw UserError(file_.string() + ": not zstd data (the file is empty)");
      return;
    }
    any_input_ = true;
    ib_ = ZSTD_inBuffer{in_.data(), got, 0};
  }

  void step(ZSTD_outBuffer* ob) {
    const size_t r = ZSTD_decompressStream(dctx_, ob, &ib_);
    if (ZSTD_isError(r)) {
      const std::string why = ZSTD_getErrorName(r);
      const ZSTD_ErrorCode code = ZSTD_getErrorCode(r);
      if (code == ZSTD_error_prefix_unknown && frames_ == 0 && produced_ + ob->pos == 0)
        throw UserError(file_.string() + ": not zstd data (" + why + ")");
      if (code == ZSTD_error_frameParameter_windowTooLarge)
        throw UserError(file_.string() + ": a zstd frame needs a window above the reader's limit "
                        "of 128 MiB (" + why + "); compress it without --long");
      throw UserError(file_.string() + ": corrupt zstd data (" + why + ") after " +
                      std::to_string(produced_ + ob->pos) + " uncompressed bytes");
    }
    if (r == 0) ++frames_;  // a frame (or a skippable frame) ended in this call
    hint_ = r;
  }

  std::FILE* f_;
  const fs::path& file_;
  ZSTD_DCtx* dctx_ = nullptr;
  std::vector<char> in_;
  ZSTD_inBuffer ib_{nullptr, 0, 0};
  size_t hint_ = 0;  // ZSTD_decompressStream's last return: 0 when a frame just ended
  bool eof_ = false, any_input_ = false;
  int64_t produced_ = 0, frames_ = 0;
};

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

void read_jsonl_bytes(std::string_view bytes, const std::string& name, const JsonlOptions& opts,
                      const RecordFn& fn, JsonlStats* stats) {
  LineReader reader(name, opts, fn, stats);
  LineSplitter split(reader);
  split.chunk(bytes);
  split.finish();
}

void read_jsonl_file(const fs::path& file, const JsonlOptions& opts, const RecordFn& fn,
                     JsonlStats* stats) {
  const std::string name = file.string();
  LineReader reader(name, opts, fn, stats);
  LineSplitter split(reader);
  File f = open_file(file);
  std::vector<char> chunk(kReadChunk);
  if (ends_with(file.filename().string(), ".zst")) {
    ZstdReader z(f.get(), file);
    while (const size_t n = z.read(chunk.data(), chunk.size())) split.chunk({chunk.data(), n});
  } else {
    while (const size_t n = read_some(f.get(), chunk.data(), chunk.size(), file))
      split.chunk({chunk.data(), n});
  }
  split.finish();
}

bool is_jsonl_path(const fs::path& p) {
  const std::string n = p.filename().string();
  return ends_with(n, ".jsonl") || ends_with(n, ".jsonl.zst");
}

}  // namespace fp4
