// Fuzz target: JSONL corpora through read_jsonl_bytes (fp4/data/jsonl.h), the per-line code
// read_jsonl_file runs on every line of a .jsonl or .jsonl.zst file, once with
// skip_bad_records off and once on (text field "text").
// Properties:
//  * every delivered text is valid UTF-8 (strict: checked here by decoding, independently of
//    the library: no overlong forms, no surrogates, nothing above U+10FFFF), and line numbers
//    rise strictly and stay within the input's lines;
//  * skip on: nothing at all escapes (with skip_bad_records the reader has no error of its own;
//    std::bad_alloc would be reported by libFuzzer's memory limit first); records + skipped ==
//    the non-blank lines counted here, bytes == the input size, first_errors holds
//    min(5, skipped) messages "fuzz.jsonl:<line>: ...", their lines rising;
//  * skip off: either no error, and then skip on skipped nothing and delivered the same
//    records; or fp4::UserError whose message is skip on's first_errors[0], after delivering
//    exactly skip on's records that precede that line.
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "fp4/base/error.h"
#include "fp4/data/jsonl.h"
#include "fuzz_common.h"

namespace {

using Records = std::vector<std::pair<int64_t, std::string>>;

// Strict UTF-8 by decoding each sequence to its code point.
bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int len;
    uint32_t cp;
    if (c < 0x80) { len = 1; cp = c; }
    else if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; }
    else return false;
    if (i + len > s.size()) return false;
    for (int k = 1; k < len; ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    static const uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

// Lines of `in` (split at '\n'; a last line without '\n' counts) and how many are not blank.
std::pair<int64_t, int64_t> count_lines(std::string_view in) {
  int64_t lines = 0, non_blank = 0;
  size_t pos = 0;
  while (pos < in.size()) {
    size_t eol = in.find('\n', pos);
    if (eol == std::string_view::npos) eol = in.size();
    ++lines;
    bool blank = true;
    for (size_t k = pos; k < eol; ++k)
      if (std::string_view(" \t\r\f\v").find(in[k]) == std::string_view::npos) blank = false;
    if (!blank) ++non_blank;
    pos = eol + 1;
  }
  return {lines, non_blank};
}

// The line number of a message "fuzz.jsonl:<line>: ...", or -1.
int64_t message_line(const std::string& m) {
  const std::string prefix = "fuzz.jsonl:";
  if (m.rfind(prefix, 0) != 0) return -1;
  size_t k = prefix.size();
  int64_t n = 0;
  if (k >= m.size() || m[k] < '0' || m[k] > '9') return -1;
  while (k < m.size() && m[k] >= '0' && m[k] <= '9') n = n * 10 + (m[k++] - '0');
  return m.compare(k, 2, ": ") == 0 ? n : -1;
}

void check_records(const Records& r, int64_t lines) {
  int64_t last = 0;
  for (const auto& [line, text] : r) {
    FUZZ_CHECK(line > last && line <= lines, "line " + std::to_string(line) + " out of order");
    FUZZ_CHECK(valid_utf8(text), "a delivered text is not valid UTF-8 (line " +
                                     std::to_string(line) + ")");
    last = line;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in = fuzz::bytes(data, size);
  const auto [lines, non_blank] = count_lines(in);

  // skip_bad_records on: nothing throws, every non-blank line is a record or a skipped one.
  fp4::JsonlOptions skip;
  skip.skip_bad_records = true;
  fp4::JsonlStats st;
  Records all;
  try {
    fp4::read_jsonl_bytes(in, "fuzz.jsonl", skip,
                          [&](int64_t l, std::string_view t) { all.emplace_back(l, t); }, &st);
  } catch (const std::exception& e) {
    FUZZ_CHECK(false, std::string("skip_bad_records threw: ") + e.what());
  }
  check_records(all, lines);
  FUZZ_CHECK(st.records == static_cast<int64_t>(all.size()), "records is not the delivered count");
  FUZZ_CHECK(st.records + st.skipped == non_blank,
             std::to_string(st.records) + " records + " + std::to_string(st.skipped) +
                 " skipped != " + std::to_string(non_blank) + " non-blank lines");
  FUZZ_CHECK(st.bytes == static_cast<int64_t>(size), "bytes is not the input size");
  FUZZ_CHECK(static_cast<int64_t>(st.first_errors.size()) == std::min<int64_t>(5, st.skipped),
             "first_errors does not hold the first min(5, skipped) messages");
  int64_t last_bad = 0;
  for (const std::string& m : st.first_errors) {
    const int64_t l = message_line(m);
    FUZZ_CHECK(l > last_bad && l <= lines, "a skipped record's message names no line: " + m);
    last_bad = l;
  }

  // skip_bad_records off: the same records up to the first bad one, which throws.
  Records strict;
  try {
    fp4::read_jsonl_bytes(in, "fuzz.jsonl", {},
                          [&](int64_t l, std::string_view t) { strict.emplace_back(l, t); });
  } catch (const fp4::UserError& e) {
    FUZZ_CHECK(!st.first_errors.empty() && e.what() == st.first_errors[0],
               std::string("strict error differs from the first skipped one: ") + e.what());
    const int64_t bad = message_line(e.what());
    Records before;
    for (const auto& r : all)
      if (r.first < bad) before.push_back(r);
    FUZZ_CHECK(strict == before, "strict reading delivered other records before its error");
    return 0;
  }
  FUZZ_CHECK(st.skipped == 0, "strict reading accepted what skip_bad_records skipped");
  FUZZ_CHECK(strict == all, "strict reading delivered other records");
  return 0;
}
