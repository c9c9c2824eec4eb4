// Corpus loading and the deterministic train / held-out split (see include/fp4/data/data.h).
//
// Details beyond the header:
//  * Directory mode: files and directories whose name starts with '.' are skipped (so
//    markers such as data/brown/text/.complete and editor/VCS files are not documents).
//    Files that hold only whitespace are skipped too and do not take an index.
//  * Every document is trimmed of leading and trailing ASCII whitespace.
//  * Single-file mode: a blank line is an empty or whitespace-only line; one or more of
//    them separate documents. Documents are named "<file name>#<k>", k = 0-based index.
//  * JSONL (src/data/jsonl.cpp): one document per record, named "<file>:<line>", trimmed
//    like the others; records whose text is empty after trimming take no index.
//  * Documents are streamed: one file (text directory), one document (text file) or one
//    record (jsonl) is in memory at a time.
//  * UTF-8 is validated strictly (no overlong forms, no surrogates, nothing above
//    U+10FFFF); the error names the file and the byte offset within it.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "fp4/data/data.h"
#include "fp4/data/jsonl.h"
#include "source_internal.h"
#include "utf8.h"
#include "fp4/base/error.h"

namespace fp4 {
namespace fs = std::filesystem;

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string_view trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

std::string read_whole_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError("cannot open data file '" + path.string() + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw UserError("cannot read data file '" + path.string() + "'");
  return std::move(ss).str();
}

// `text` starts `base` bytes into the file.
void check_utf8(std::string_view text, const fs::path& path, size_t base = 0) {
  size_t bad = detail::first_invalid_utf8(text);
  if (bad == std::string_view::npos) return;
  const unsigned char c = static_cast<unsigned char>(text[bad]);
  bad += base;
  char hex[8];
  std::snprintf(hex, sizeof hex, "0x%02X", static_cast<unsigned>(c));
  const std::string ext = path.extension().string();
  const bool ids = ext == ".bin" || ext == ".u16" || ext == ".u32" || ext == ".npy";
  throw UserError("data file '" + path.string() + "' is not valid UTF-8: invalid byte " + hex +
                  " at byte offset " + std::to_string(bad) +
                  (ids ? " (if it holds token ids, set data.format to \"uint16\", \"uint32\" or "
                         "\"llmc\"; docs/data.md)"
                       : ""));
}

bool hidden(const fs::path& name) {
  const std::string s = name.filename().string();
  return !s.empty() && s[0] == '.';
}


constexpr uint32_t kLlmcMagic16 = 20240520, kLlmcMagic32 = 20240801;

bool starts_with_llmc_magic(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  unsigned char b[4] = {0, 0, 0, 0};
  if (!in.read(reinterpret_cast<char*>(b), 4)) return false;
  const uint32_t m = uint32_t{b[0]} | uint32_t{b[1]} << 8 | uint32_t{b[2]} << 16 | uint32_t{b[3]} << 24;
  return m == kLlmcMagic16 || m == kLlmcMagic32;
}

// The kind of one file under format auto.
std::string file_kind(const fs::path& p) {
  if (is_jsonl_path(p)) return "jsonl";
  if (starts_with_llmc_magic(p)) return "llmc";
  return "text";
}


// Hands documents to `fn` with the running index and the split rule.
struct Emitter {
  const std::function<void(const Document&)>& fn;
  int64_t index = 0;
  void operator()(std::string_view name, std::string_view text) {
    const std::string_view t = trim(text);
    if (t.empty()) return;
    Document d;
    d.index = index;
    d.heldout = index % 10 == 9;
    d.name = name;
    d.text = t;
    fn(d);
    ++index;
  }
};

// Single text file: documents separated by blank lines, read line by line.
void stream_text_file(const fs::path& path, Emitter& emit) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError("cannot open data file '" + path.string() + "'");
  const std::string base = path.filename().string();
  std::string doc, line, name;
  size_t offset = 0;  // of the current line in the file
  int64_t k = 0;
  auto flush = [&] {
    if (doc.empty()) return;
    if (!trim(doc).empty()) {
      name = base + "#" + std::to_string(k++);
      emit(name, doc);
    }
    doc.clear();
  };
  while (std::getline(in, line)) {
    check_utf8(line, path, offset);
    offset += line.size() + 1;
    if (trim(line).empty()) {
      flush();
    } else {
      if (!doc.empty()) doc.push_back('\n');
      doc += line;
    }
  }
  if (in.bad()) throw UserError("cannot read data file '" + path.string() + "'");
  flush();
}

void stream_jsonl_file(const fs::path& path, const std::string& rel, const DataSpec& spec,
                       Emitter& emit, CorpusScan& scan) {
  JsonlOptions o;
  o.text_field = spec.text_field;
  o.skip_bad_records = spec.skip_bad_records;
  JsonlStats st;
  std::string name;
  read_jsonl_file(path, o, [&](int64_t line, std::string_view text) {
    name = rel + ":" + std::to_string(line);
    emit(name, text);
  }, &st);
  scan.skipped_records += st.skipped;
  for (const auto& e : st.first_errors)
    if (scan.first_errors.size() < 5) scan.first_errors.push_back(e);
}

}  // namespace

namespace detail {

std::vector<std::pair<std::string, fs::path>> list_files(const fs::path& root) {
  std::vector<std::pair<std::string, fs::path>> files;
  std::error_code ec;
  fs::recursive_directory_iterator it(root, fs::directory_options::skip_permission_denied, ec);
  if (ec) throw UserError("cannot read data directory '" + root.string() + "': " + ec.message());
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) throw UserError("cannot read data directory '" + root.string() + "': " + ec.message());
    const fs::path& p = it->path();
    if (hidden(p)) {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file(ec)) continue;
    files.emplace_back(p.lexically_relative(root).generic_string(), p);
  }
  if (ec) throw UserError("cannot read data directory '" + root.string() + "': " + ec.message());
  if (files.empty()) throw UserError("data directory '" + root.string() + "' contains no files");
  std::sort(files.begin(), files.end());
  return files;
}

bool is_token_format(const std::string& f) { return f == "llmc" || f == "uint16" || f == "uint32"; }

}  // namespace detail

using detail::is_token_format;
using detail::list_files;

const std::vector<std::string>& data_format_names() {
  static const std::vector<std::string> names = {"auto", "text", "jsonl", "llmc", "uint16", "uint32"};
  return names;
}

std::string resolve_data_format(const DataSpec& spec) {
  const auto& names = data_format_names();
  if (std::find(names.begin(), names.end(), spec.format) == names.end()) {
    std::string list;
    for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
    throw UserError("data.format = '" + spec.format + "' is not one of " + list);
  }
  std::error_code ec;
  const fs::file_status st = fs::status(spec.path, ec);
  if (ec || !fs::exists(st)) throw UserError("data path '" + spec.path.string() + "' does not exist");
  const bool dir = fs::is_directory(st);
  if (!dir && !fs::is_regular_file(st))
    throw UserError("data path '" + spec.path.string() + "' is neither a regular file nor a directory");
  std::string f = spec.format;
  if (f == "auto") {
    if (!dir) {
      f = file_kind(spec.path);
    } else {
      std::string first_kind, first_file;
      for (const auto& [rel, p] : list_files(spec.path)) {
        const std::string k = file_kind(p);
        if (first_kind.empty()) {
          first_kind = k;
          first_file = rel;
        } else if (k != first_kind) {
          throw UserError("data directory '" + spec.path.string() + "' mixes " + first_kind +
                          " files ('" + first_file + "') and " + k + " files ('" + rel +
                          "'); keep one kind per directory, or set data.format");
        }
      }
      f = first_kind;
    }
  }
  if (is_token_format(f)) {
    const bool has_file = !spec.heldout.empty(), has_frac = spec.heldout_fraction > 0;
    if (has_file == has_frac)
      throw UserError("pre-tokenized data (" + f + ", '" + spec.path.string() +
                      "') needs exactly one of data.heldout (a held-out file or directory) and "
                      "data.heldout_fraction (the last fraction of the ids, e.g. 0.1)" +
                      (has_file ? "; both are set" : "; neither is set"));
    if (has_frac && !(spec.heldout_fraction < 1))
      throw UserError("data.heldout_fraction must be in (0, 1), got " + std::to_string(spec.heldout_fraction));
  } else {
    if (!spec.heldout.empty() || spec.heldout_fraction > 0)
      throw UserError("data.heldout and data.heldout_fraction are for pre-tokenized data; " + f +
                      " data '" + spec.path.string() +
                      "' holds out every 10th document (index 9, 19, ...)");
    if (!spec.tokenizer.empty())
      throw UserError("data.tokenizer is for pre-tokenized data; " + f + " data '" +
                      spec.path.string() + "' trains its own tokenizer");
  }
  if (f != "jsonl" && (spec.text_field != DataSpec{}.text_field || spec.skip_bad_records)) {
    throw UserError(std::string(spec.skip_bad_records ? "data.skip_bad_records" : "data.text_field") +
                    " is for JSONL data; '" + spec.path.string() + "' is " + f +
                    (f == "text" ? " (a .jsonl or .jsonl.zst name, or data.format = \"jsonl\", makes it JSONL)"
                                 : ""));
  }
  return f;
}

CorpusScan for_each_document(const DataSpec& spec, const std::function<void(const Document&)>& fn) {
  CorpusScan scan;
  scan.format = resolve_data_format(spec);
  if (is_token_format(scan.format))
    throw UserError("data '" + spec.path.string() + "' is pre-tokenized (" + scan.format +
                    "): it has no text documents");
  Emitter emit{fn};
  const bool dir = fs::is_directory(spec.path);
  if (!dir) {
    scan.files = 1;
    if (scan.format == "jsonl")
      stream_jsonl_file(spec.path, spec.path.filename().string(), spec, emit, scan);
    else
      stream_text_file(spec.path, emit);
    if (emit.index == 0)
      throw UserError("data file '" + spec.path.string() + "' holds no text (" +
                      (scan.format == "jsonl" ? std::string("no record has a non-empty text")
                                              : std::string("empty or whitespace only")) + ")");
  } else {
    const auto files = list_files(spec.path);
    for (const auto& [rel, path] : files) {
      ++scan.files;
      if (scan.format == "jsonl") {
        if (!is_jsonl_path(path))
          throw UserError("data file '" + path.string() +
                          "' is not a .jsonl or .jsonl.zst file (data.format = jsonl reads a "
                          "directory of them only)");
        stream_jsonl_file(path, rel, spec, emit, scan);
      } else {
        const std::string text = read_whole_file(path);
        check_utf8(text, path);
        emit(rel, text);
      }
    }
    if (emit.index == 0)
      throw UserError("data directory '" + spec.path.string() + "' holds no text: all " +
                      std::to_string(files.size()) + " files are empty or whitespace only" +
                      (scan.format == "jsonl" ? std::string(" records") : std::string()));
  }
  scan.documents = emit.index;
  if (scan.documents < 10)
    throw UserError("data path '" + spec.path.string() + "' has only " +
                    std::to_string(scan.documents) +
                    " non-empty document(s); at least 10 are needed because every 10th "
                    "document (index 9, 19, ...) is held out for evaluation" +
                    (scan.format == "jsonl" ? std::string(" (one document per record)")
                     : dir ? std::string(" (one document per file)")
                           : std::string(" (separate documents with blank lines)")));
  return scan;
}

CorpusSplit split_corpus(const DataSpec& spec) {
  CorpusSplit split;
  for_each_document(spec, [&](const Document& d) {
    (d.heldout ? split.heldout_docs : split.train_docs).emplace_back(d.text);
    (d.heldout ? split.heldout_names : split.train_names).emplace_back(d.name);
  });
  return split;
}

CorpusSplit split_corpus(const fs::path& data_path) {
  DataSpec spec;
  spec.path = data_path;
  return split_corpus(spec);
}

}  // namespace fp4
