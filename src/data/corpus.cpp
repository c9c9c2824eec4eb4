// Corpus loading and the deterministic train / held-out split (see include/fp4/data/data.h).
//
// Details beyond the header:
//  * Directory mode: files and directories whose name starts with '.' are skipped (so
//    markers such as data/brown/text/.complete and editor/VCS files are not documents).
//    Files that hold only whitespace are skipped too and do not take an index.
//  * Every document is trimmed of leading and trailing ASCII whitespace.
//  * Single-file mode: a blank line is an empty or whitespace-only line; one or more of
//    them separate documents. Documents are named "<file name>#<k>", k = 0-based index.
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

// Offset of the first byte of the first invalid UTF-8 sequence, or npos if valid.
size_t first_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // no overlong
      if (c == 0xED) hi = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // no overlong
      if (c == 0xF4) hi = 0x8F;  // <= U+10FFFF
    } else {
      return i;
    }
    if (i + len > n) return i;
    if (p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k)
      if (p[i + k] < 0x80 || p[i + k] > 0xBF) return i;
    i += len;
  }
  return std::string_view::npos;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError("cannot open data file '" + path.string() + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw UserError("cannot read data file '" + path.string() + "'");
  return std::move(ss).str();
}

void check_utf8(const std::string& text, const fs::path& path) {
  const size_t bad = first_invalid_utf8(text);
  if (bad == std::string_view::npos) return;
  char hex[8];
  std::snprintf(hex, sizeof hex, "0x%02X", static_cast<unsigned>(static_cast<unsigned char>(text[bad])));
  throw UserError("data file '" + path.string() + "' is not valid UTF-8: invalid byte " + hex +
                  " at byte offset " + std::to_string(bad));
}

bool hidden(const fs::path& name) {
  const std::string s = name.filename().string();
  return !s.empty() && s[0] == '.';
}

struct Doc {
  std::string name, text;
};

std::vector<Doc> load_directory(const fs::path& root) {
  std::vector<std::pair<std::string, fs::path>> files;  // (relative generic path, path)
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
  if (files.empty())
    throw UserError("data directory '" + root.string() + "' contains no files");
  std::sort(files.begin(), files.end());

  std::vector<Doc> docs;
  for (const auto& [rel, path] : files) {
    std::string text = read_file(path);
    check_utf8(text, path);
    const std::string_view t = trim(text);
    if (t.empty()) continue;
    docs.push_back({rel, std::string(t)});
  }
  if (docs.empty())
    throw UserError("data directory '" + root.string() + "' holds no text: all " +
                    std::to_string(files.size()) + " files are empty or whitespace only");
  return docs;
}

std::vector<Doc> load_single_file(const fs::path& path) {
  const std::string text = read_file(path);
  check_utf8(text, path);
  const std::string base = path.filename().string();
  std::vector<Doc> docs;
  size_t doc_begin = std::string::npos, doc_end = 0;  // byte range of the current document
  auto flush = [&] {
    if (doc_begin == std::string::npos) return;
    const std::string_view d = trim(std::string_view(text).substr(doc_begin, doc_end - doc_begin));
    if (!d.empty()) docs.push_back({base + "#" + std::to_string(docs.size()), std::string(d)});
    doc_begin = std::string::npos;
  };
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    const size_t next = eol == std::string::npos ? text.size() : eol + 1;
    if (eol == std::string::npos) eol = text.size();
    const std::string_view line = std::string_view(text).substr(pos, eol - pos);
    if (trim(line).empty()) {
      flush();
    } else {
      if (doc_begin == std::string::npos) doc_begin = pos;
      doc_end = eol;
    }
    pos = next;
  }
  flush();
  if (docs.empty())
    throw UserError("data file '" + path.string() + "' holds no text (empty or whitespace only)");
  return docs;
}

}  // namespace

CorpusSplit split_corpus(const fs::path& data_path) {
  std::error_code ec;
  const fs::file_status st = fs::status(data_path, ec);
  if (ec || !fs::exists(st))
    throw UserError("data path '" + data_path.string() + "' does not exist");
  std::vector<Doc> docs;
  const bool dir = fs::is_directory(st);
  if (dir) {
    docs = load_directory(data_path);
  } else if (fs::is_regular_file(st)) {
    docs = load_single_file(data_path);
  } else {
    throw UserError("data path '" + data_path.string() +
                    "' is neither a regular file nor a directory");
  }
  if (docs.size() < 10)
    throw UserError("data path '" + data_path.string() + "' has only " +
                    std::to_string(docs.size()) +
                    " non-empty document(s); at least 10 are needed because every 10th "
                    "document (index 9, 19, ...) is held out for evaluation" +
                    (dir ? std::string(" (one document per file)")
                         : std::string(" (separate documents with blank lines)")));
  CorpusSplit split;
  for (size_t i = 0; i < docs.size(); ++i) {
    if (i % 10 == 9) {
      split.heldout_docs.push_back(std::move(docs[i].text));
      split.heldout_names.push_back(std::move(docs[i].name));
    } else {
      split.train_docs.push_back(std::move(docs[i].text));
      split.train_names.push_back(std::move(docs[i].name));
    }
  }
  return split;
}

}  // namespace fp4
