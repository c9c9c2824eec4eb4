// Data sources beyond a text corpus (docs/data.md "Pre-tokenized shards", "Vocabularies above
// 65,535"): token streams of 2 and 4 bytes, the version-2 token shard and its writer,
// pre-tokenized input files (llm.c shards, headerless uint16 / uint32), their cache with a
// held-out file or fraction, vocabularies above 65,535, the format rules of DataSpec, and
// streaming text files. Expected values are built by hand here (header bytes written field by
// field, split points computed from the counts), not by the readers.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "fp4/base/error.h"
#include "fp4/data/data.h"
#include "support/data_test_util.h"

namespace fs = std::filesystem;
using fp4::TokenStream;
using fp4::UserError;

using fp4::testing::expect_user_error;
using fp4::testing::read;
using fp4::testing::write;

namespace {

fs::path g_root;

class Env : public ::testing::Environment {
 public:
  void SetUp() override {
    g_root = fs::temp_directory_path() / ("fp4_test_sources_" + std::to_string(::getpid()));
    fs::remove_all(g_root);
    fs::create_directories(g_root);
  }
  void TearDown() override { fs::remove_all(g_root); }
};
[[maybe_unused]] auto* const g_env = ::testing::AddGlobalTestEnvironment(new Env);

fs::path fresh(const std::string& name) {
  const fs::path p = g_root / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}



void le(std::string& s, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
}

// An llm.c shard written field by field: 256 int32 header (magic, version, count), then ids.
std::string llmc_bytes(const std::vector<uint32_t>& ids, int width) {
  std::string s;
  le(s, width == 2 ? 20240520 : 20240801, 4);
  le(s, width == 2 ? 1 : 7, 4);
  le(s, ids.size(), 4);
  s.resize(1024, '\0');
  for (uint32_t id : ids) le(s, id, width);
  return s;
}

std::string raw_bytes(const std::vector<uint32_t>& ids, int width) {
  std::string s;
  for (uint32_t id : ids) le(s, id, width);
  return s;
}

std::vector<uint32_t> random_ids(size_t n, uint32_t vocab, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<uint32_t> v(n);
  for (auto& x : v) x = g() % vocab;
  return v;
}


fp4::DataSpec token_spec(const fs::path& path, const std::string& format) {
  fp4::DataSpec s;
  s.path = path;
  s.format = format;
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// TokenStream

TEST(TokenStream, TwoAndFourByteIdsReadBack) {
  const std::vector<uint32_t> a = {0, 1, 65535, 300};
  const TokenStream s2 = TokenStream::from_ids(a, 2);
  EXPECT_EQ(s2.token_bytes(), 2);
  EXPECT_EQ(s2.ids(), a);
  EXPECT_EQ(s2.bytes(), raw_bytes(a, 2));
  const std::vector<uint32_t> b = {70000, 0, 131071, 4294967295u};
  const TokenStream s4 = TokenStream::from_ids(b, 4);
  EXPECT_EQ(s4.ids(), b);
  EXPECT_EQ(s4.bytes(), raw_bytes(b, 4));
  std::vector<int32_t> out(2);
  s4.read(1, 2, out.data());
  EXPECT_EQ(out[0], 0);
  EXPECT_EQ(out[1], 131071);
  EXPECT_EQ(s4.first_at_or_above(131071), 2u);
  EXPECT_EQ(s2.first_at_or_above(65536), s2.size());
  expect_user_error([] { TokenStream::from_ids({65536}, 2); }, {"65536", "2 bytes"});
  expect_user_error([] { TokenStream::from_ids({1}, 3); }, {"2 or 4"});
  EXPECT_THROW(s2.read(3, 2, out.data()), std::out_of_range);
  const TokenStream sl = s4.slice(1, 2);
  EXPECT_EQ(sl.ids(), (std::vector<uint32_t>{0, 131071}));
  EXPECT_THROW(s4.slice(3, 2), std::out_of_range);
}

TEST(TokenStream, MapFileSeesTheBytesAtItsOffset) {
  const fs::path f = fresh("map") / "ids.bin";
  const std::vector<uint32_t> ids = random_ids(1000, 100000, 3);
  write(f, std::string(40, 'x') + raw_bytes(ids, 4));
  const TokenStream t = TokenStream::map_file(f, 40, ids.size(), 4);
  EXPECT_EQ(t.ids(), ids);
  // The mapping outlives the copies' source.
  TokenStream copy = t.slice(10, 5);
  { const TokenStream gone = t; }
  EXPECT_EQ(copy[0], ids[10]);
  expect_user_error([&] { TokenStream::map_file(f, 40, ids.size() + 1, 4); }, {"ids.bin", "fewer"});
  expect_user_error([&] { TokenStream::map_file(f.string() + ".missing", 0, 1, 2); }, {"cannot open"});
  EXPECT_EQ(TokenStream::map_file(f, 0, 0, 2).size(), 0u);
}

// ---------------------------------------------------------------------------------------
// Token shards

TEST(TokenShard, VersionTwoHeaderByHand) {
  const std::vector<uint32_t> ids = {7, 70000, 3};
  std::string want = "FP4TOK01";
  le(want, 2, 4);        // version
  le(want, 70001, 4);    // vocab
  le(want, 4, 4);        // token bytes
  le(want, 0, 4);        // reserved
  le(want, 3, 8);        // count
  want += raw_bytes(ids, 4);
  const TokenStream t = TokenStream::from_ids(ids, 4);
  EXPECT_EQ(fp4::token_shard_to_bytes(t, 70001), want);
  EXPECT_EQ(fp4::token_shard_from_bytes(want, 70001, "x.bin").ids(), ids);
  // 70000 is outside a vocabulary of 70000.
  std::string v = want;
  v[12] = static_cast<char>(70000 & 0xFF), v[13] = static_cast<char>((70000 >> 8) & 0xFF),
  v[14] = static_cast<char>(70000 >> 16);
  expect_user_error([&] { fp4::token_shard_from_bytes(v, 70000, "x.bin"); }, {"token 70000 at index 1"});
  // 2-byte ids cannot hold a vocabulary above 65,536.
  std::string w = fp4::token_shard_to_bytes(TokenStream::from_ids({1, 2}, 2), 70001);
  expect_user_error([&] { fp4::token_shard_from_bytes(w, 70001, "x.bin"); }, {"2-byte ids"});
  std::string bad_width = want;
  bad_width[16] = 3;
  expect_user_error([&] { fp4::token_shard_from_bytes(bad_width, 70001, "x.bin"); }, {"width 3"});
}

TEST(TokenShard, VersionOneStillReads) {
  std::string v1 = "FP4TOK01";
  le(v1, 1, 4);
  le(v1, 512, 4);
  le(v1, 2, 8);
  le(v1, 5, 2);
  le(v1, 511, 2);
  const TokenStream t = fp4::token_shard_from_bytes(v1, 512, "old.bin");
  EXPECT_EQ(t.ids(), (std::vector<uint32_t>{5, 511}));
  EXPECT_EQ(t.token_bytes(), 2);
}

TEST(TokenShard, WriterEqualsBytesAndMapsBack) {
  const fs::path dir = fresh("writer");
  for (int vocab : {4096, 131072}) {
    const std::vector<uint32_t> ids = random_ids(300000, static_cast<uint32_t>(vocab), vocab);
    const fs::path f = dir / ("s" + std::to_string(vocab) + ".bin");
    {
      fp4::TokenShardWriter w(f, vocab);
      w.append(ids.data(), 1000);  // chunks of different sizes
      std::vector<int> rest(ids.begin() + 1000, ids.end());
      w.append(rest.data(), rest.size());
      EXPECT_EQ(w.count(), ids.size());
      w.finish();
    }
    const int width = fp4::token_bytes_for_vocab(vocab);
    EXPECT_EQ(read(f), fp4::token_shard_to_bytes(TokenStream::from_ids(ids, width), vocab));
    const TokenStream m = fp4::map_token_shard(f, vocab);
    EXPECT_EQ(m.token_bytes(), width);
    EXPECT_EQ(m.ids(), ids);
  }
  // A writer that is not finished leaves no file.
  {
    fp4::TokenShardWriter w(dir / "unfinished.bin", 512);
    const uint32_t one = 1;
    w.append(&one, 1);
  }
  EXPECT_FALSE(fs::exists(dir / "unfinished.bin"));
  fp4::TokenShardWriter w(dir / "bad.bin", 512);
  const uint32_t big = 512;
  EXPECT_THROW(w.append(&big, 1), std::logic_error);
}

// ---------------------------------------------------------------------------------------
// Pre-tokenized input files

TEST(TokenFile, LlmcAndRawLayouts) {
  const std::vector<uint32_t> ids = {1, 2, 3, 65535};
  const std::string a = llmc_bytes(ids, 2);
  auto l = fp4::token_file_layout(a, a.size(), "llmc", "a.bin");
  EXPECT_EQ(l.header_bytes, 1024u);
  EXPECT_EQ(l.token_bytes, 2);
  EXPECT_EQ(l.count, 4u);
  const std::string b = llmc_bytes({70000, 9}, 4);
  l = fp4::token_file_layout(b, b.size(), "llmc", "b.bin");
  EXPECT_EQ(l.token_bytes, 4);
  EXPECT_EQ(l.count, 2u);
  expect_user_error([&] { fp4::token_file_layout(a.substr(0, a.size() - 1), a.size() - 1, "llmc", "a.bin"); },
                    {"a.bin", "truncated"});
  std::string wrong = a;
  wrong[0] = 1;
  expect_user_error([&] { fp4::token_file_layout(wrong, wrong.size(), "llmc", "a.bin"); }, {"magic"});
  std::string ver = a;
  ver[4] = 7;  // magic 20240520 with uint32's version
  expect_user_error([&] { fp4::token_file_layout(ver, ver.size(), "llmc", "a.bin"); }, {"version 7"});
  expect_user_error([&] { fp4::token_file_layout("abc", 3, "llmc", "s.bin"); }, {"1024-byte header"});
  l = fp4::token_file_layout("", 10, "uint16", "r.bin");
  EXPECT_EQ(l.count, 5u);
  EXPECT_EQ(l.header_bytes, 0u);
  expect_user_error([] { fp4::token_file_layout("", 10, "uint32", "r.bin"); }, {"r.bin", "4-byte"});
}

TEST(TokenFile, WriteTokenFileRoundTrips) {
  const fs::path dir = fresh("wtf");
  const std::vector<uint32_t> small = {0, 5, 65535}, big = {70000, 1};
  fp4::write_token_file(TokenStream::from_ids(small, 2), dir / "a.bin", "llmc");
  EXPECT_EQ(read(dir / "a.bin"), llmc_bytes(small, 2));
  fp4::write_token_file(TokenStream::from_ids(big, 4), dir / "b.bin", "llmc");
  EXPECT_EQ(read(dir / "b.bin"), llmc_bytes(big, 4));
  fp4::write_token_file(TokenStream::from_ids(small, 2), dir / "c.bin", "uint32");
  EXPECT_EQ(read(dir / "c.bin"), raw_bytes(small, 4));
  fp4::write_token_file(TokenStream::from_ids(small, 4), dir / "d.bin", "uint16");
  EXPECT_EQ(read(dir / "d.bin"), raw_bytes(small, 2));
  expect_user_error([&] { fp4::write_token_file(TokenStream::from_ids(big, 4), dir / "e.bin", "uint16"); },
                    {"65,535"});
}

// ---------------------------------------------------------------------------------------
// The cache of pre-tokenized data

TEST(PreTokenized, HeldoutFileAndTokenizerlessCache) {
  const fs::path dir = fresh("pt_file");
  const std::vector<uint32_t> train = random_ids(5000, 1000, 1), held = random_ids(700, 1000, 2);
  write(dir / "shards" / "train_000.bin", llmc_bytes({train.begin(), train.begin() + 3000}, 2));
  write(dir / "shards" / "train_001.bin", llmc_bytes({train.begin() + 3000, train.end()}, 2));
  write(dir / "val.bin", llmc_bytes(held, 2));
  fp4::DataSpec spec;  // format auto: llm.c's magic decides
  spec.path = dir / "shards";
  spec.heldout = dir / "val.bin";
  std::vector<std::string> log;
  const fp4::TokenData td = fp4::prepare_tokens(spec, 1000, dir / "cache",
                                                [&](const std::string& l) { log.push_back(l); });
  EXPECT_EQ(td.format, "llmc");
  EXPECT_FALSE(td.from_cache);
  EXPECT_EQ(td.train.ids(), train);  // the shards concatenated in name order
  EXPECT_EQ(td.heldout.ids(), held);
  EXPECT_TRUE(td.tokenizer_model.empty());
  EXPECT_FALSE(fs::exists(td.cache_dir / "tokenizer.model"));
  const fp4::TokenData again = fp4::prepare_tokens(spec, 1000, dir / "cache");
  EXPECT_TRUE(again.from_cache);
  EXPECT_EQ(again.cache_dir, td.cache_dir);
  EXPECT_EQ(again.train.ids(), train);
  // Another vocabulary or another held-out choice is another cache.
  EXPECT_NE(fp4::describe_data(spec, 1024, dir / "cache").key, td.cache_dir.filename().string());
  // A changed shard is another key.
  write(dir / "shards" / "train_001.bin", llmc_bytes({train.begin() + 3000, train.end() - 1}, 2));
  EXPECT_NE(fp4::describe_data(spec, 1000, dir / "cache").key, td.cache_dir.filename().string());
}

TEST(PreTokenized, HeldoutFractionIsTheTail) {
  const fs::path dir = fresh("pt_frac");
  const std::vector<uint32_t> ids = random_ids(1000, 500, 4);
  write(dir / "ids.u16", raw_bytes(ids, 2));
  fp4::DataSpec spec = token_spec(dir / "ids.u16", "uint16");
  spec.heldout_fraction = 0.1;  // floor(1000 * 0.1) = 100 held-out ids: the last 100
  const fp4::TokenData td = fp4::prepare_tokens(spec, 512, dir / "cache");
  ASSERT_EQ(td.train.size(), 900u);
  ASSERT_EQ(td.heldout.size(), 100u);
  EXPECT_EQ(td.train.ids(), std::vector<uint32_t>(ids.begin(), ids.begin() + 900));
  EXPECT_EQ(td.heldout.ids(), std::vector<uint32_t>(ids.begin() + 900, ids.end()));
  spec.heldout_fraction = 0.0005;  // floor(0.5) = 0 ids
  expect_user_error([&] { fp4::prepare_tokens(spec, 512, dir / "cache"); }, {"no held-out"});
}

// A vocabulary above 65,535: 4-byte ids in the input, the cache and the batches.
TEST(PreTokenized, VocabularyAbove65535) {
  const fs::path dir = fresh("pt_big");
  std::vector<uint32_t> ids = random_ids(4000, 131072, 5);
  ids[17] = 131071;
  write(dir / "ids.u32", raw_bytes(ids, 4));
  fp4::DataSpec spec = token_spec(dir / "ids.u32", "uint32");
  spec.heldout_fraction = 0.25;
  const fp4::TokenData td = fp4::prepare_tokens(spec, 131072, dir / "cache");
  EXPECT_EQ(td.train.token_bytes(), 4);
  EXPECT_EQ(td.train.ids(), std::vector<uint32_t>(ids.begin(), ids.begin() + 3000));
  EXPECT_EQ(fp4::describe_data(spec, 131072, dir / "cache").token_bytes, 4);
  fp4::BatchSampler s(td.train, 32, 2, 9);
  std::vector<int32_t> in(64), tg(64);
  s.next(in.data(), tg.data());
  const uint64_t start = fp4::splitmix64(9, 0) % (3000 - 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(uint32_t(in[j]), ids[start + j]);
  // An id at or above model.vocab_size names the file and the index.
  expect_user_error([&] { fp4::prepare_tokens(spec, 131071, dir / "cache"); },
                    {"ids.u32", "id 131071 at index 17", "model.vocab_size = 131071"});
}

TEST(PreTokenized, ErrorsNameWhatIsWrong) {
  const fs::path dir = fresh("pt_err");
  write(dir / "a.bin", llmc_bytes({1, 2, 3}, 2));
  fp4::DataSpec spec = token_spec(dir / "a.bin", "llmc");
  expect_user_error([&] { fp4::prepare_tokens(spec, 512, dir / "c"); },
                    {"data.heldout", "data.heldout_fraction", "neither"});
  spec.heldout = dir / "a.bin";
  spec.heldout_fraction = 0.1;
  expect_user_error([&] { fp4::prepare_tokens(spec, 512, dir / "c"); }, {"both"});
  spec.heldout_fraction = 0;
  spec.heldout = dir / "missing.bin";
  expect_user_error([&] { fp4::prepare_tokens(spec, 512, dir / "c"); }, {"missing.bin"});
  // A truncated llm.c shard.
  const std::string full = llmc_bytes({1, 2, 3}, 2);
  write(dir / "t.bin", full.substr(0, full.size() - 1));
  spec = token_spec(dir / "t.bin", "llmc");
  spec.heldout_fraction = 0.5;
  expect_user_error([&] { fp4::prepare_tokens(spec, 512, dir / "c"); }, {"t.bin", "truncated"});
  // Files with no ids.
  write(dir / "empty.u16", "");
  fp4::DataSpec e = token_spec(dir / "empty.u16", "uint16");
  e.heldout_fraction = 0.5;
  expect_user_error([&] { fp4::prepare_tokens(e, 512, dir / "c"); }, {"empty.u16", "holds no token ids"});
  write(dir / "one.u16", raw_bytes({1, 2, 3}, 2));
  e = token_spec(dir / "one.u16", "uint16");
  e.heldout = dir / "empty.u16";
  expect_user_error([&] { fp4::prepare_tokens(e, 512, dir / "c"); }, {"data.heldout", "holds no token ids"});
  // A text-format key on text data.
  fp4::DataSpec text;
  text.path = dir / "a.bin";
  text.format = "text";
  text.heldout_fraction = 0.1;
  expect_user_error([&] { fp4::resolve_data_format(text); }, {"pre-tokenized", "every 10th"});
  text.heldout_fraction = 0;
  text.tokenizer = dir / "a.bin";
  expect_user_error([&] { fp4::resolve_data_format(text); }, {"data.tokenizer"});
  text.tokenizer.clear();
  text.text_field = "body";
  expect_user_error([&] { fp4::resolve_data_format(text); }, {"data.text_field", "is for JSONL"});
  text.text_field = "text";
  text.skip_bad_records = true;
  expect_user_error([&] { fp4::resolve_data_format(text); }, {"data.skip_bad_records", "is for JSONL"});
  text.format = "parquet";
  expect_user_error([&] { fp4::resolve_data_format(text); }, {"data.format", "parquet", "jsonl"});
}

TEST(DataFormat, AutoTakesTheKindOfTheFilesAndRefusesAMix) {
  const fs::path dir = fresh("auto");
  write(dir / "text" / "a.txt", "hello");
  EXPECT_EQ(fp4::resolve_data_format(token_spec(dir / "text", "auto")), "text");
  write(dir / "j" / "a.jsonl", "{}\n");
  write(dir / "j" / "b.jsonl.zst", "");
  EXPECT_EQ(fp4::resolve_data_format(token_spec(dir / "j" / "a.jsonl", "auto")), "jsonl");
  EXPECT_EQ(fp4::resolve_data_format(token_spec(dir / "j", "auto")), "jsonl");
  write(dir / "j" / "notes.txt", "a text file among the shards");
  expect_user_error([&] { fp4::resolve_data_format(token_spec(dir / "j", "auto")); },
                    {"mixes", "jsonl", "notes.txt", "data.format"});
  write(dir / "l" / "x.bin", llmc_bytes({1}, 2));
  fp4::DataSpec l = token_spec(dir / "l" / "x.bin", "auto");
  l.heldout_fraction = 0.5;
  EXPECT_EQ(fp4::resolve_data_format(l), "llmc");
}

// A single text file streams line by line with the rules of split_corpus: documents at
// blank lines, CRLF kept inside a document, trimmed; a UTF-8 error names the file offset.
TEST(TextFile, StreamsDocumentsAtBlankLines) {
  const fs::path dir = fresh("textfile");
  std::string text;
  for (int i = 0; i < 12; ++i) text += "  doc " + std::to_string(i) + " line one\r\nline two  \n \t\n\n";
  write(dir / "c.txt", text);
  const fp4::CorpusSplit s = fp4::split_corpus(dir / "c.txt");
  ASSERT_EQ(s.train_docs.size(), 11u);
  ASSERT_EQ(s.heldout_docs.size(), 1u);
  EXPECT_EQ(s.train_docs[0], "doc 0 line one\r\nline two");
  EXPECT_EQ(s.heldout_docs[0], "doc 9 line one\r\nline two");
  EXPECT_EQ(s.heldout_names[0], "c.txt#9");
  const size_t at = text.size();
  write(dir / "bad.txt", text + "ok \xC3(\n");
  expect_user_error([&] { fp4::split_corpus(dir / "bad.txt"); },
                    {"bad.txt", "0xC3", "byte offset " + std::to_string(at + 3)});
}

// ---------------------------------------------------------------------------------------
// JSONL corpora through the corpus, the tokenizer and the cache

namespace {
std::string json_string(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\', o += c;
    else if (c == '\n') o += "\\n";
    else if (c == '\r') o += "\\r";
    else if (c == '\t') o += "\\t";
    else o += c;
  }
  return o + "\"";
}

// Documents of a few sentences each, with newlines, quotes and non-ASCII text.
std::vector<std::string> sample_docs(int n) {
  static const char* kWords[] = {"river", "city", "morning", "answer", "café", "\"quoted\"",
                                 "naïve", "system", "between", "children", "日本", "water"};
  std::vector<std::string> docs;
  for (int i = 0; i < n; ++i) {
    std::string d;
    for (int s = 0; s < 6; ++s) {
      for (int w = 0; w < 9; ++w) d += std::string(kWords[fp4::splitmix64(i, s * 9 + w) % 12]) + " ";
      d += s == 2 ? ".\n\n" : ".\n";
    }
    docs.push_back(d);
  }
  return docs;
}
}  // namespace

// The same documents as a text directory and as JSONL give the same token streams: the
// tokenizer and the encoding see only the texts (the keys differ: names are hashed too).
TEST(JsonlCorpus, SameTokensAsTheTextDirectory) {
  const fs::path dir = fresh("jsonl_same");
  const std::vector<std::string> docs = sample_docs(24);
  std::string jsonl = "\n";  // a blank line is no record
  for (size_t i = 0; i < docs.size(); ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "doc%02zu.txt", i);
    write(dir / "text" / name, docs[i]);
    jsonl += "{\"id\": " + std::to_string(i) + ", \"text\": " + json_string(docs[i]) + "}\n";
    if (i == 5) jsonl += "{\"text\": \"   \"}\n";  // empty after trimming: no index
  }
  write(dir / "c.jsonl", jsonl);
  fp4::DataSpec t, j;
  t.path = dir / "text";
  j.path = dir / "c.jsonl";
  const fp4::TokenData a = fp4::prepare_tokens(t, 300, dir / "cache");
  const fp4::TokenData b = fp4::prepare_tokens(j, 300, dir / "cache");
  EXPECT_EQ(a.format, "text");
  EXPECT_EQ(b.format, "jsonl");
  EXPECT_NE(a.cache_dir, b.cache_dir);
  EXPECT_EQ(a.train.ids(), b.train.ids());
  EXPECT_EQ(a.heldout.ids(), b.heldout.ids());
  const fp4::CorpusSplit s = fp4::split_corpus(j);
  ASSERT_EQ(s.heldout_docs.size(), 2u);  // indices 9 and 19 of 24
  EXPECT_EQ(s.heldout_names[0], "c.jsonl:12");  // line 1 blank, record i on line i + 2, +1 after 5
  const fp4::DataSummary d = fp4::describe_data(j, 300, dir / "cache");
  EXPECT_TRUE(d.cached);
  EXPECT_EQ(d.train_docs, 22);
  EXPECT_EQ(d.heldout_docs, 2);
}

TEST(JsonlCorpus, BadRecordsStopOrAreCounted) {
  const fs::path dir = fresh("jsonl_bad");
  std::string jsonl;
  const auto docs = sample_docs(12);
  for (size_t i = 0; i < docs.size(); ++i) {
    jsonl += "{\"text\": " + json_string(docs[i]) + "}\n";
    if (i == 3) jsonl += "{\"text\": 5}\n";          // line 5
    if (i == 7) jsonl += "{\"body\": \"x\"}\n";      // line 10
  }
  write(dir / "shards" / "a.jsonl", jsonl);
  fp4::DataSpec spec;
  spec.path = dir / "shards";
  expect_user_error([&] { fp4::prepare_tokens(spec, 300, dir / "cache"); },
                    {"a.jsonl:5", "not a string"});
  spec.skip_bad_records = true;
  std::vector<std::string> log;
  const fp4::TokenData td = fp4::prepare_tokens(spec, 300, dir / "cache",
                                                [&](const std::string& l) { log.push_back(l); });
  EXPECT_EQ(td.skipped_records, 2);
  bool said = false;
  for (const auto& l : log) said |= l.find("skipped 2 bad records") != std::string::npos;
  EXPECT_TRUE(said);
  EXPECT_EQ(fp4::describe_data(spec, 300, dir / "cache").train_docs, 11);
  spec.skip_bad_records = false;
  spec.text_field = "body";  // only one record has it: fewer than 10 documents
  expect_user_error([&] { fp4::prepare_tokens(spec, 300, dir / "cache"); }, {"a.jsonl:1", "has no field"});
}

// Two builds of one cache, in different places, write the same tokenizer.model bytes (the
// training text's temporary path is not recorded in it), so a deleted and rebuilt cache still
// matches the runs that copied its tokenizer.
TEST(TokenizerModel, RebuildsByteIdentically) {
  const fs::path dir = fresh("tok_rebuild");
  const std::vector<std::string> docs = sample_docs(20);
  for (size_t i = 0; i < docs.size(); ++i) write(dir / "text" / ("d" + std::to_string(100 + i)), docs[i]);
  fp4::DataSpec t;
  t.path = dir / "text";
  const fp4::TokenData a = fp4::prepare_tokens(t, 300, dir / "c1");
  const fp4::TokenData b = fp4::prepare_tokens(t, 300, dir / "c2");
  EXPECT_EQ(a.cache_dir.filename(), b.cache_dir.filename());
  EXPECT_EQ(read(a.tokenizer_model), read(b.tokenizer_model));
  EXPECT_EQ(read(a.tokenizer_model).find(dir.string()), std::string::npos);
  EXPECT_TRUE(fs::exists(a.cache_dir / "tokenizer.vocab"));

  // Pre-tokenized data with that tokenizer (300 pieces) and a padded vocabulary of 512:
  // ids from 300 up would not decode, and are refused naming the tokenizer.
  std::vector<uint32_t> ids = random_ids(2000, 300, 8);
  write(dir / "ok.u16", raw_bytes(ids, 2));
  fp4::DataSpec p = token_spec(dir / "ok.u16", "uint16");
  p.heldout_fraction = 0.1;
  p.tokenizer = a.tokenizer_model;
  const fp4::TokenData td = fp4::prepare_tokens(p, 512, dir / "c3");
  EXPECT_EQ(read(td.tokenizer_model), read(a.tokenizer_model));
  ids[1234] = 400;
  write(dir / "bad.u16", raw_bytes(ids, 2));
  p.path = dir / "bad.u16";
  expect_user_error([&] { fp4::prepare_tokens(p, 512, dir / "c3"); },
                    {"bad.u16", "id 400 at index 1234", "300 pieces of data.tokenizer"});
}

// llm.c's layout: train and val shards in one directory. data.heldout's files found under
// data.path are held out only.
TEST(PreTokenized, HeldoutShardsInsideThePathAreNotTrainedOn) {
  const fs::path dir = fresh("pt_layout");
  const std::vector<uint32_t> train = random_ids(3000, 1000, 11), val = random_ids(500, 1000, 12);
  write(dir / "d" / "fineweb_train_000001.bin", llmc_bytes(train, 2));
  write(dir / "d" / "fineweb_val_000000.bin", llmc_bytes(val, 2));
  fp4::DataSpec spec;
  spec.path = dir / "d";
  spec.heldout = dir / "d" / "fineweb_val_000000.bin";
  const fp4::TokenData td = fp4::prepare_tokens(spec, 1000, dir / "cache");
  EXPECT_EQ(td.train.ids(), train);
  EXPECT_EQ(td.heldout.ids(), val);
  spec.path = dir / "d" / "fineweb_val_000000.bin";
  expect_user_error([&] { fp4::prepare_tokens(spec, 1000, dir / "cache"); }, {"nothing is left to train on"});
}

// A cache directory without meta.json (an interrupted copy, a hand edit) is named, with the
// directory to delete, instead of "Directory not empty".
TEST(PreTokenized, IncompleteCacheDirectoryIsNamed) {
  const fs::path dir = fresh("pt_incomplete");
  write(dir / "ids.u16", raw_bytes(random_ids(1000, 500, 13), 2));
  fp4::DataSpec spec = token_spec(dir / "ids.u16", "uint16");
  spec.heldout_fraction = 0.1;
  const fp4::DataSummary s = fp4::describe_data(spec, 512, dir / "cache");
  fs::create_directories(s.cache_dir);
  write(s.cache_dir / "train.bin", "partial");
  expect_user_error([&] { fp4::prepare_tokens(spec, 512, dir / "cache"); },
                    {"meta.json", "delete '" + s.cache_dir.string() + "'"});
  // A build killed before its cleanup leaves .tmp-<key>-<pid>-<n>: removed once that pid is gone.
  fs::remove_all(s.cache_dir);
  const fs::path stale = dir / "cache" / (".tmp-" + s.key + "-999999999-1");
  write(stale / "train.bin", "partial");
  EXPECT_TRUE(fp4::prepare_tokens(spec, 512, dir / "cache").train.size() == 900u);
  EXPECT_FALSE(fs::exists(stale));
}

// A built cache's scan is stored under its stamp (file names, sizes, modification times): the
// next prepare_tokens takes the key from it without reading the corpus; a changed file (a new
// size or time) is scanned again; describe_data always scans in full.
TEST(ScanStamp, UnchangedFilesAreNotReadAgain) {
  const fs::path dir = fresh("stamp");
  const std::vector<std::string> docs = sample_docs(20);
  for (size_t i = 0; i < docs.size(); ++i) write(dir / "text" / ("d" + std::to_string(100 + i)), docs[i]);
  fp4::DataSpec t;
  t.path = dir / "text";
  auto run = [&](std::vector<std::string>& log) {
    return fp4::prepare_tokens(t, 300, dir / "cache", [&](const std::string& l) { log.push_back(l); });
  };
  auto said = [](const std::vector<std::string>& log, const std::string& what) {
    for (const auto& l : log)
      if (l.find(what) != std::string::npos) return true;
    return false;
  };
  std::vector<std::string> l1, l2, l3, l4;
  const fp4::TokenData a = run(l1);
  EXPECT_FALSE(said(l1, "unchanged since its last scan"));
  const fp4::TokenData b = run(l2);
  EXPECT_TRUE(said(l2, "unchanged since its last scan"));
  EXPECT_TRUE(b.from_cache);
  EXPECT_EQ(b.cache_dir, a.cache_dir);
  EXPECT_EQ(b.train.ids(), a.train.ids());
  // The stamp is trusted, not the bytes: the same size and time give the stored key (the
  // documented limit), a new time a full scan and the same key, a new size a new key.
  const fs::path f = dir / "text" / "d103";
  const auto when = fs::last_write_time(f);
  std::string same_size = docs[3];
  same_size[0] = same_size[0] == 'x' ? 'y' : 'x';
  write(f, same_size);
  fs::last_write_time(f, when);
  EXPECT_EQ(fp4::prepare_tokens(t, 300, dir / "cache").cache_dir, a.cache_dir);
  EXPECT_NE(fp4::describe_data(t, 300, dir / "cache").key, a.cache_dir.filename().string());
  write(f, docs[3]);
  fs::last_write_time(f, when + std::chrono::seconds(5));
  const fp4::TokenData c = run(l3);
  EXPECT_FALSE(said(l3, "unchanged since its last scan"));
  EXPECT_EQ(c.cache_dir, a.cache_dir);
  write(f, docs[3] + " More.");
  const fp4::TokenData d = run(l4);
  EXPECT_FALSE(said(l4, "unchanged since its last scan"));
  EXPECT_NE(d.cache_dir, a.cache_dir);
}
