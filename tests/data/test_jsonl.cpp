// JSONL corpora (fp4/data/jsonl.h): records, escapes, blank lines, plain and zstd files, the
// error messages, skip_bad_records. Expected texts, line numbers and byte counts are worked
// out by hand in the comments.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zstd.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "fp4/base/error.h"
#include "fp4/data/jsonl.h"

namespace fs = std::filesystem;
using fp4::UserError;

namespace {

fs::path g_root;  // per-process scratch directory

using Records = std::vector<std::pair<int64_t, std::string>>;

void write(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// One zstd frame of `text` (level 3; with the 4-byte content checksum if `checksum`).
std::string zstd_frame(const std::string& text, bool checksum = false, int level = 3) {
  std::string z(ZSTD_compressBound(text.size()), '\0');
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, level);
  ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, checksum ? 1 : 0);
  const size_t n = ZSTD_compress2(c, z.data(), z.size(), text.data(), text.size());
  ZSTD_freeCCtx(c);
  EXPECT_FALSE(ZSTD_isError(n)) << ZSTD_getErrorName(n);
  z.resize(n);
  return z;
}

// `text` as consecutive frames, cut at the given byte offsets (so a frame may end mid-line).
std::string zstd_frames(const std::string& text, const std::vector<size_t>& cuts) {
  std::string out;
  size_t from = 0;
  for (size_t at : cuts) {
    out += zstd_frame(text.substr(from, at - from));
    from = at;
  }
  return out + zstd_frame(text.substr(from));
}

Records read_bytes(const std::string& bytes, const fp4::JsonlOptions& opts = {},
                   fp4::JsonlStats* stats = nullptr) {
  Records r;
  fp4::read_jsonl_bytes(bytes, "c.jsonl", opts,
                        [&](int64_t line, std::string_view t) { r.emplace_back(line, t); }, stats);
  return r;
}

Records read_file(const fs::path& p, const fp4::JsonlOptions& opts = {},
                  fp4::JsonlStats* stats = nullptr) {
  Records r;
  fp4::read_jsonl_file(p, opts, [&](int64_t line, std::string_view t) { r.emplace_back(line, t); },
                       stats);
  return r;
}

// The UserError message of f(), or "" (a test failure) if it does not throw one.
template <class F>
std::string user_error(F&& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected fp4::UserError";
  return "";
}

std::string bytes_error(const std::string& bytes, const fp4::JsonlOptions& opts = {}) {
  return user_error([&] { read_bytes(bytes, opts); });
}

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

// What every round-trip test reads: 5 lines, 4 records.
//   line 1: other field "id" ignored             -> "first"
//   line 2: blank                                -> not a record
//   line 3: \u00e9 escape, raw U+2615 (E2 98 95), CRLF -> "café ☕"
//   line 4: empty text                           -> ""
//   line 5: \t escape, no final newline          -> "tab<TAB>here"
const std::string kContent =
    "{\"id\":1,\"text\":\"first\"}\n"
    "\n"
    "{\"text\":\"caf\\u00e9 \xE2\x98\x95\"}\r\n"
    "{\"text\":\"\"}\n"
    "{\"text\":\"tab\\there\"}";
const Records kContentRecords = {
    {1, "first"}, {3, "caf\xC3\xA9 \xE2\x98\x95"}, {4, ""}, {5, "tab\there"}};

class JsonlEnv : public ::testing::Environment {
 public:
  void SetUp() override {
    g_root = fs::temp_directory_path() / ("fp4_test_jsonl_" + std::to_string(::getpid()));
    fs::remove_all(g_root);
    fs::create_directories(g_root);
  }
  void TearDown() override { fs::remove_all(g_root); }
};
[[maybe_unused]] auto* const g_env = ::testing::AddGlobalTestEnvironment(new JsonlEnv);

}  // namespace

TEST(JsonlReader, EscapesAreUnescaped) {
  // \n \t \" \\ \/ \u00e9 (C3 A9) and the pair \ud83d\ude00 = U+1F600 (F0 9F 98 80).
  const Records r = read_bytes(
      R"({"text":"a\nb\tc\"d\\e\/f\u00e9g\ud83d\ude00h"})"
      "\n"
      // \u0000 is a NUL byte of the text; "\\ud800" is an escaped backslash, then plain "ud800".
      R"({"text":"x\u0000y\\ud800"})"
      "\n");
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0], (std::pair<int64_t, std::string>{
                      1, "a\nb\tc\"d\\e/f\xC3\xA9g\xF0\x9F\x98\x80h"}));
  EXPECT_EQ(r[1], (std::pair<int64_t, std::string>{2, std::string("x\0y\\ud800", 9)}));
}

TEST(JsonlReader, RawUnicodeIsKept) {
  // "héllo 世界 🎉": é = C3 A9, 世 = E4 B8 96, 界 = E7 95 8C, 🎉 = F0 9F 8E 89.
  const std::string t = "h\xC3\xA9llo \xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\x8E\x89";
  const Records r = read_bytes("{\"text\":\"" + t + "\"}\n");
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].second, t);
  EXPECT_EQ(r[0].second.size(), 18u);  // 1 + 2 + 3 + 1 + 3 + 3 + 1 + 4
}

TEST(JsonlReader, BlankLinesEmptyTextsAndCrlf) {
  // Lines: 1 "a" (CRLF), 2 "\r" blank, 3 spaces blank, 4 empty text, 5 tab+vt+ff blank,
  // 6 blank (empty), 7 "b" with no final newline.
  const std::string in =
      "{\"text\":\"a\"}\r\n\r\n   \n{\"text\":\"\"}\n\t\v\f\n\n{\"text\":\"b\"}";
  fp4::JsonlStats st;
  st.records = 99;  // reset by the call
  st.first_errors = {"stale"};
  const Records r = read_bytes(in, {}, &st);
  EXPECT_EQ(r, (Records{{1, "a"}, {4, ""}, {7, "b"}}));
  EXPECT_EQ(st.records, 3);
  EXPECT_EQ(st.skipped, 0);
  EXPECT_EQ(st.bytes, static_cast<int64_t>(in.size()));
  EXPECT_EQ(st.bytes, 14 + 2 + 4 + 12 + 4 + 1 + 12);
  EXPECT_TRUE(st.first_errors.empty());
  // No bytes, only newlines: no records, no errors.
  EXPECT_TRUE(read_bytes("").empty());
  fp4::JsonlStats st2;
  EXPECT_TRUE(read_bytes("\n\n \r\n", {}, &st2).empty());
  EXPECT_EQ(st2.bytes, 5);
  EXPECT_EQ(st2.records, 0);
}

TEST(JsonlReader, CustomTextFieldOtherFieldsIgnoredFirstDuplicateWins) {
  fp4::JsonlOptions o;
  o.text_field = "content";
  const Records r = read_bytes(
      R"({"id":7,"text":"no","content":"yes","meta":{"content":"nested"},"n":[1,2.5,null]})"
      "\n"
      R"({"content":"first","content":"second"})"
      "\n"
      R"({"cont\u0065nt":"escaped key"})"
      "\n",
      o);
  EXPECT_EQ(r, (Records{{1, "yes"}, {2, "first"}, {3, "escaped key"}}));
  // Only top-level fields count.
  EXPECT_EQ(bytes_error(R"({"meta":{"content":"x"}})", o), "c.jsonl:1: has no field \"content\"");
}

TEST(JsonlReader, PlainAndZstdFilesGiveTheSameRecords) {
  const fs::path plain = g_root / "rt" / "c.jsonl";
  const fs::path one = g_root / "rt" / "c1.jsonl.zst";
  const fs::path multi = g_root / "rt" / "c3.jsonl.zst";
  const fs::path skippable = g_root / "rt" / "cs.jsonl.zst";
  write(plain, kContent);
  write(one, zstd_frame(kContent, true));
  // Line lengths with their line ends: 24, 1, 26, 12, 20 (offsets 0, 24, 25, 51, 63). Frames
  // end inside line 1 (after 5 bytes), right after line 2 (25) and inside the CRLF of line 3
  // (50: its '\r' is byte 49, its '\n' byte 50, the first of the next frame).
  write(multi, zstd_frames(kContent, {5, 25, 50}));
  // A skippable frame (magic 0x184D2A50, 4-byte size 3, 3 bytes) before the data.
  write(skippable, std::string("\x50\x2A\x4D\x18\x03\x00\x00\x00xyz", 11) + zstd_frame(kContent));
  for (const fs::path& p : {plain, one, multi, skippable}) {
    fp4::JsonlStats st;
    EXPECT_EQ(read_file(p, {}, &st), kContentRecords) << p;
    EXPECT_EQ(st.records, 4) << p;
    EXPECT_EQ(st.bytes, static_cast<int64_t>(kContent.size())) << p;
    EXPECT_EQ(st.bytes, 24 + 1 + 26 + 12 + 20) << p;
  }
}

TEST(JsonlReader, LargeFileWithALineLongerThanTheReadBuffer) {
  // 30000 short lines (100 bytes each: {"text":"doc NNNNN + 79 dots + "} and '\n') and, at
  // line 15001 (bytes 1,500,000 .. 3,000,021), one of a 1.5 MB text: {"text":" + 1.5 MB +
  // ","n":15001} and '\n'. 4.5 MB in all, far past the 256 KiB read chunk.
  std::string in;
  Records want;
  const std::string dots(79, '.');
  std::string long_text;
  for (int i = 0; i < 150000; ++i) long_text += "0123456789";
  for (int i = 1; i <= 30001; ++i) {
    if (i == 15001) {
      in += "{\"text\":\"" + long_text + "\",\"n\":15001}\n";
      want.emplace_back(i, long_text);
      continue;
    }
    char head[16];
    std::snprintf(head, sizeof head, "doc %05d", i);
    const std::string t = std::string(head) + dots;
    in += "{\"text\":\"" + t + "\"}\n";
    want.emplace_back(i, t);
  }
  ASSERT_EQ(in.size(), 30000u * 100u + (9 + 1500000 + 12 + 1));
  const fs::path plain = g_root / "big" / "big.jsonl";
  const fs::path z1 = g_root / "big" / "big.jsonl.zst";
  const fs::path z2 = g_root / "big" / "big-frames.jsonl.zst";
  write(plain, in);
  write(z1, zstd_frame(in, true, 1));
  // Frames cut at the long line's start, twice inside it, and elsewhere.
  write(z2, zstd_frames(in, {777, 1500000, 2000000, 2400001, 3999999}));
  for (const fs::path& p : {plain, z1, z2}) {
    fp4::JsonlStats st;
    const Records r = read_file(p, {}, &st);
    EXPECT_EQ(st.records, 30001) << p;
    EXPECT_EQ(st.bytes, static_cast<int64_t>(in.size())) << p;
    ASSERT_EQ(r.size(), want.size()) << p;
    EXPECT_TRUE(r == want) << p;
    EXPECT_EQ(r[15000].second.size(), 1500000u) << p;
  }
}

TEST(JsonlReader, MalformedJsonNamesFileAndLine) {
  // Line 1 is fine, line 2 lacks its closing brace.
  EXPECT_TRUE(starts_with(bytes_error("{\"text\":\"ok\"}\n{\"text\": \"a\"\n"),
                          "c.jsonl:2: not valid JSON ("));
  const std::string two = bytes_error(R"({"text":"a"} {"text":"b"})");
  EXPECT_TRUE(starts_with(two, "c.jsonl:1: not valid JSON (")) << two;
  EXPECT_EQ(two.back(), ')');
  EXPECT_TRUE(starts_with(bytes_error("{\"text\":\"a\x01\"}"), "c.jsonl:1: not valid JSON (")) ;
  EXPECT_TRUE(starts_with(bytes_error("{text:\"a\"}"), "c.jsonl:1: not valid JSON ("));
  // Blank lines and CRLF still count as lines: the bad record is line 4.
  EXPECT_TRUE(starts_with(bytes_error("\r\n\n{\"text\":\"a\"}\r\n{\"text\":}\r\n"),
                          "c.jsonl:4: not valid JSON ("));
}

TEST(JsonlReader, NonObjectMissingFieldAndNonStringField) {
  EXPECT_EQ(bytes_error("[1,2]"), "c.jsonl:1: the record is not a JSON object (it is an array)");
  EXPECT_EQ(bytes_error("\"just text\""),
            "c.jsonl:1: the record is not a JSON object (it is a string)");
  EXPECT_EQ(bytes_error("\n42\n"), "c.jsonl:2: the record is not a JSON object (it is a number)");
  EXPECT_EQ(bytes_error(R"({"txt":"a"})"), "c.jsonl:1: has no field \"text\"");
  EXPECT_EQ(bytes_error(R"({})"), "c.jsonl:1: has no field \"text\"");
  EXPECT_EQ(bytes_error(R"({"text":12})"),
            "c.jsonl:1: field \"text\" is not a string (it is a number)");
  EXPECT_EQ(bytes_error(R"({"text":null})"),
            "c.jsonl:1: field \"text\" is not a string (it is null)");
  EXPECT_EQ(bytes_error(R"({"text":true})"),
            "c.jsonl:1: field \"text\" is not a string (it is a boolean)");
  EXPECT_EQ(bytes_error(R"({"text":["a"]})"),
            "c.jsonl:1: field \"text\" is not a string (it is an array)");
  EXPECT_EQ(bytes_error(R"({"text":{"t":"a"}})"),
            "c.jsonl:1: field \"text\" is not a string (it is an object)");
}

TEST(JsonlReader, UnpairedSurrogateEscapesAreRefused) {
  // {"text":"ab\ud800cd"}: the backslash is byte 11 (0-based: { " t e x t " : " a b = 0..10).
  EXPECT_EQ(bytes_error(R"({"text":"ab\ud800cd"})"),
            "c.jsonl:1: not valid JSON (unpaired surrogate escape \\ud800 at byte offset 11 of "
            "the line)");
  // A lone low surrogate, at byte 9.
  EXPECT_EQ(bytes_error(R"({"text":"\udc00"})"),
            "c.jsonl:1: not valid JSON (unpaired surrogate escape \\udc00 at byte offset 9 of "
            "the line)");
  // A high surrogate followed by an escape that is not a low one, at byte 10; as typed.
  EXPECT_EQ(bytes_error(R"({"text":"x\uD800\u0041"})"),
            "c.jsonl:1: not valid JSON (unpaired surrogate escape \\uD800 at byte offset 10 of "
            "the line)");
  // Two high surrogates: the first is unpaired.
  EXPECT_EQ(bytes_error("\n" R"({"text":"\ud83d\ud83d\ude00"})"),
            "c.jsonl:2: not valid JSON (unpaired surrogate escape \\ud83d at byte offset 9 of "
            "the line)");
}

TEST(JsonlReader, RawInvalidUtf8IsRefused) {
  // Offsets: the text starts at byte 9 ({"text":" is 9 bytes).
  EXPECT_EQ(bytes_error("{\"text\":\"ab\xC3(\"}"),
            "c.jsonl:1: not valid UTF-8 (invalid byte 0xC3 at byte offset 11 of the line)");
  // An encoded surrogate (U+D800 = ED A0 80).
  EXPECT_EQ(bytes_error("{\"text\":\"\xED\xA0\x80\"}"),
            "c.jsonl:1: not valid UTF-8 (invalid byte 0xED at byte offset 9 of the line)");
  // An overlong '/' (C0 AF).
  EXPECT_EQ(bytes_error("{\"text\":\"\xC0\xAF\"}"),
            "c.jsonl:1: not valid UTF-8 (invalid byte 0xC0 at byte offset 9 of the line)");
  // U+110000 (F4 90 80 80), above U+10FFFF.
  EXPECT_EQ(bytes_error("{\"text\":\"\xF4\x90\x80\x80\"}"),
            "c.jsonl:1: not valid UTF-8 (invalid byte 0xF4 at byte offset 9 of the line)");
  // Outside the string too, and in another field than the text.
  EXPECT_EQ(bytes_error("{\"text\":\"ok\"}\n{\"x\":\"\xFF\",\"text\":\"a\"}"),
            "c.jsonl:2: not valid UTF-8 (invalid byte 0xFF at byte offset 6 of the line)");
}

TEST(JsonlReader, ErrorsInFilesNameTheFileAndTheUncompressedLine) {
  // Line 3 lacks the field; in the .zst file lines 1-2 are one frame, line 3 another.
  const std::string in = "{\"text\":\"a\"}\n{\"text\":\"b\"}\n{\"title\":\"c\"}\n";
  const fs::path plain = g_root / "err" / "bad.jsonl";
  const fs::path z = g_root / "err" / "bad.jsonl.zst";
  write(plain, in);
  write(z, zstd_frames(in, {26}));
  EXPECT_EQ(user_error([&] { read_file(plain); }), plain.string() + ":3: has no field \"text\"");
  EXPECT_EQ(user_error([&] { read_file(z); }), z.string() + ":3: has no field \"text\"");
}

TEST(JsonlReader, BrokenZstdStreamsAlwaysThrow) {
  // A = B = 15 bytes: {"text":"one"} is 14, plus '\n'.
  const std::string a = "{\"text\":\"one\"}\n", b = "{\"text\":\"two\"}\n";
  ASSERT_EQ(a.size(), 15u);
  const fs::path d = g_root / "zerr";
  for (bool skip : {false, true}) {
    SCOPED_TRACE(skip ? "skip_bad_records" : "strict");
    fp4::JsonlOptions o;
    o.skip_bad_records = skip;
    Records got;
    auto read_into = [&](const fs::path& p) {
      got.clear();
      fp4::read_jsonl_file(p, o, [&](int64_t l, std::string_view t) { got.emplace_back(l, t); });
    };
    // A compressible line C (2 + 9 + 400 + 2 = 413 bytes with its '\n') in one compressed
    // block, its frame without the last byte (no checksum: the cut is inside the block, which
    // decodes only whole): A's 15 bytes came out, A's record was delivered before the error.
    const std::string c = "\n{\"text\":\"" + std::string(400, 'c') + "\"}\n";
    ASSERT_EQ(c.size(), 413u);
    const std::string fc = zstd_frame(c);
    ASSERT_LT(fc.size(), 100u);  // compressed, not stored
    write(d / "t1.jsonl.zst", zstd_frame(a) + fc.substr(0, fc.size() - 1));
    EXPECT_EQ(user_error([&] { read_into(d / "t1.jsonl.zst"); }),
              (d / "t1.jsonl.zst").string() +
                  ": truncated zstd frame (the stream ends inside a frame after 15 uncompressed "
                  "bytes)");
    EXPECT_EQ(got, (Records{{1, "one"}}));
    // B is too short to compress: zstd stores it as a raw block, which streams out as it
    // arrives, so without its last byte 15 + 14 = 29 bytes came out (line 2 lacks its '\n',
    // so only line 1 was delivered).
    const std::string fb = zstd_frame(b);
    write(d / "t1raw.jsonl.zst", zstd_frame(a) + fb.substr(0, fb.size() - 1));
    EXPECT_EQ(user_error([&] { read_into(d / "t1raw.jsonl.zst"); }),
              (d / "t1raw.jsonl.zst").string() +
                  ": truncated zstd frame (the stream ends inside a frame after 29 uncompressed "
                  "bytes)");
    EXPECT_EQ(got, (Records{{1, "one"}}));
    // Frame B without its 4-byte checksum: all 30 bytes came out, both records delivered.
    const std::string fbc = zstd_frame(b, true);
    write(d / "t2.jsonl.zst", zstd_frame(a) + fbc.substr(0, fbc.size() - 4));
    EXPECT_EQ(user_error([&] { read_into(d / "t2.jsonl.zst"); }),
              (d / "t2.jsonl.zst").string() +
                  ": truncated zstd frame (the stream ends inside a frame after 30 uncompressed "
                  "bytes)");
    EXPECT_EQ(got, (Records{{1, "one"}, {2, "two"}}));
    // Only the 4-byte magic number.
    write(d / "t3.jsonl.zst", zstd_frame(a).substr(0, 4));
    EXPECT_EQ(user_error([&] { read_into(d / "t3.jsonl.zst"); }),
              (d / "t3.jsonl.zst").string() +
                  ": truncated zstd frame (the stream ends inside a frame after 0 uncompressed "
                  "bytes)");
    // Plain JSONL named .zst.
    write(d / "plain.jsonl.zst", a);
    EXPECT_EQ(user_error([&] { read_into(d / "plain.jsonl.zst"); }),
              (d / "plain.jsonl.zst").string() + ": not zstd data (Unknown frame descriptor)");
    write(d / "empty.jsonl.zst", "");
    EXPECT_EQ(user_error([&] { read_into(d / "empty.jsonl.zst"); }),
              (d / "empty.jsonl.zst").string() + ": not zstd data (the file is empty)");
    // Garbage after a whole frame.
    write(d / "tail.jsonl.zst", zstd_frame(a) + "garbage!");
    EXPECT_EQ(user_error([&] { read_into(d / "tail.jsonl.zst"); }),
              (d / "tail.jsonl.zst").string() +
                  ": corrupt zstd data (Unknown frame descriptor) after 15 uncompressed bytes");
    // A flipped byte of the compressed data in a checksummed frame (the last byte of the
    // checksum): libzstd reports the checksum mismatch.
    std::string flip = zstd_frame(a, true);
    flip.back() = static_cast<char>(flip.back() ^ 0x01);
    write(d / "flip.jsonl.zst", flip);
    EXPECT_TRUE(starts_with(user_error([&] { read_into(d / "flip.jsonl.zst"); }),
                            (d / "flip.jsonl.zst").string() + ": corrupt zstd data ("));
  }
}

TEST(JsonlReader, UnreadableFilesAlwaysThrow) {
  fp4::JsonlOptions skip;
  skip.skip_bad_records = true;
  const fs::path missing = g_root / "nope" / "missing.jsonl";
  EXPECT_EQ(user_error([&] { read_file(missing, skip); }),
            missing.string() + ": cannot open the file (No such file or directory)");
  const fs::path dir = g_root / "adir.jsonl";
  fs::create_directories(dir);
  EXPECT_EQ(user_error([&] { read_file(dir, skip); }),
            dir.string() + ": cannot read the file (Is a directory)");
}

TEST(JsonlReader, SkipBadRecordsCountsAndContinues) {
  // 7 bad records (lines 1, 3, 4, 6, 7, 9, 11), 3 good ones (2, 8, 12), blanks 5 and 10.
  const std::string in =
      "[1]\n"                           // 1 bad: not an object
      "{\"text\":\"a\"}\n"              // 2
      "{\"text\":1}\n"                  // 3 bad: a number
      "{\"t\":\"x\"}\n"                 // 4 bad: no field
      "\n"                              // 5 blank
      "{\"text\":\"\\ud800\"}\n"        // 6 bad: unpaired surrogate escape at byte 9
      "{\"text\":\"\xFF\"}\n"           // 7 bad: raw 0xFF at byte 9
      "{\"text\":\"\"}\n"               // 8 (empty text)
      "{\"text\":\n"                    // 9 bad: JSON
      "  \n"                            // 10 blank
      "null\n"                          // 11 bad
      "{\"text\":\"z\"}";               // 12
  fp4::JsonlOptions o;
  o.skip_bad_records = true;
  fp4::JsonlStats st;
  const Records r = read_bytes(in, o, &st);
  EXPECT_EQ(r, (Records{{2, "a"}, {8, ""}, {12, "z"}}));
  EXPECT_EQ(st.records, 3);
  EXPECT_EQ(st.skipped, 7);
  EXPECT_EQ(st.bytes, static_cast<int64_t>(in.size()));
  EXPECT_EQ(st.first_errors,
            (std::vector<std::string>{
                "c.jsonl:1: the record is not a JSON object (it is an array)",
                "c.jsonl:3: field \"text\" is not a string (it is a number)",
                "c.jsonl:4: has no field \"text\"",
                "c.jsonl:6: not valid JSON (unpaired surrogate escape \\ud800 at byte offset 9 "
                "of the line)",
                "c.jsonl:7: not valid UTF-8 (invalid byte 0xFF at byte offset 9 of the line)"}));
  // Without the option the first bad record throws, with the same message, after nothing.
  fp4::JsonlStats st2;
  EXPECT_EQ(user_error([&] { read_bytes(in, {}, &st2); }),
            "c.jsonl:1: the record is not a JSON object (it is an array)");
  EXPECT_EQ(st2.records, 0);
  EXPECT_EQ(st2.skipped, 0);
  // From line 2 on, strict reading delivers line 2 and stops at line 3.
  Records strict;
  EXPECT_EQ(user_error([&] {
              fp4::read_jsonl_bytes(in.substr(4), "c.jsonl", {}, [&](int64_t l, std::string_view t) {
                strict.emplace_back(l, t);
              });
            }),
            "c.jsonl:2: field \"text\" is not a string (it is a number)");
  EXPECT_EQ(strict, (Records{{1, "a"}}));
}

TEST(JsonlReader, CallbackExceptionsPropagateUnchanged) {
  fp4::JsonlOptions o;
  o.skip_bad_records = true;
  fp4::JsonlStats st;
  int calls = 0;
  EXPECT_THROW(fp4::read_jsonl_bytes(
                   "{\"text\":\"a\"}\n{\"text\":\"b\"}\n", "c.jsonl", o,
                   [&](int64_t, std::string_view) {
                     ++calls;
                     throw std::runtime_error("stop");
                   },
                   &st),
               std::runtime_error);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(st.records, 1);
  EXPECT_EQ(st.skipped, 0);
}

TEST(JsonlReader, IsJsonlPath) {
  EXPECT_TRUE(fp4::is_jsonl_path("a.jsonl"));
  EXPECT_TRUE(fp4::is_jsonl_path("dir/shard-00001.jsonl.zst"));
  EXPECT_TRUE(fp4::is_jsonl_path("/abs/x.y.jsonl"));
  EXPECT_FALSE(fp4::is_jsonl_path("a.json"));
  EXPECT_FALSE(fp4::is_jsonl_path("a.jsonl.gz"));
  EXPECT_FALSE(fp4::is_jsonl_path("a.zst"));
  EXPECT_FALSE(fp4::is_jsonl_path("a.JSONL"));
  EXPECT_FALSE(fp4::is_jsonl_path("a.jsonl.zst/"));  // a directory path: empty file name
  EXPECT_FALSE(fp4::is_jsonl_path("jsonl"));
  EXPECT_FALSE(fp4::is_jsonl_path("a.jsonlx"));
}
