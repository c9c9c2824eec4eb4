// Data pipeline: corpus split, tokenizer + token cache, batch sampling.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "fp4/data/data.h"
#include "support/data_test_util.h"
#include "fp4/base/error.h"

namespace fs = std::filesystem;
using fp4::UserError;

using fp4::testing::expect_user_error;
using fp4::testing::read;
using fp4::testing::write;

namespace {

fs::path g_root;  // per-process scratch directory



fs::path fresh(const std::string& name) {
  const fs::path p = g_root / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}


// Deterministic English-like text from a small word list.
std::string generated_doc(uint64_t seed, size_t bytes) {
  static const char* kWords[] = {
      "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with",
      "be", "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which",
      "but", "have", "an", "had", "they", "you", "were", "their", "one", "all", "we", "can",
      "her", "has", "there", "been", "if", "more", "when", "will", "would", "who", "so",
      "no", "time", "people", "water", "river", "mountain", "city", "government", "music",
      "number", "morning", "evening", "question", "answer", "system", "program", "house",
      "small", "large", "quickly", "slowly", "between", "through", "because", "important",
      "national", "children", "education", "company", "development", "information"};
  constexpr size_t kN = sizeof(kWords) / sizeof(kWords[0]);
  std::string out;
  uint64_t i = 0;
  while (out.size() < bytes) {
    const int sentences = 2 + static_cast<int>(fp4::splitmix64(seed, i++) % 4);
    for (int s = 0; s < sentences; ++s) {
      const int words = 4 + static_cast<int>(fp4::splitmix64(seed, i++) % 12);
      for (int w = 0; w < words; ++w) {
        std::string word = kWords[fp4::splitmix64(seed, i++) % kN];
        if (w == 0) word[0] = static_cast<char>(word[0] - 'a' + 'A');
        out += word;
        if (w + 1 < words) out += (fp4::splitmix64(seed, i++) % 9 == 0) ? ", " : " ";
      }
      out += (s + 1 < sentences) ? ". " : ".";
    }
    out += "\n\n";
  }
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

constexpr int kDocs = 40;
constexpr int kVocab = 512;

std::string doc_name(int i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "doc%02d.txt", i);
  return buf;
}

// A generated corpus of kDocs documents (~320 KB). Held-out document 9 carries characters
// the training split never shows (byte fallback).
fs::path make_corpus(const std::string& name) {
  const fs::path dir = fresh(name);
  for (int i = 0; i < kDocs; ++i) {
    std::string text = generated_doc(1000 + i, 8000);
    if (i == 9) text += "\n\nNaïve café — 日本語 ✓ 🎉.";
    write(dir / doc_name(i), text);
  }
  return dir;
}

// Splits a token stream at EOS tokens.
std::vector<std::vector<int>> documents_of(const fp4::TokenStream& tokens) {
  std::vector<std::vector<int>> docs(1);
  for (uint32_t t : tokens.ids()) {
    if (t == fp4::kTokenEos)
      docs.emplace_back();
    else
      docs.back().push_back(t);
  }
  EXPECT_TRUE(docs.back().empty()) << "stream must end with EOS";
  docs.pop_back();
  return docs;
}

class DataEnv : public ::testing::Environment {
 public:
  void SetUp() override {
    g_root = fs::temp_directory_path() / ("fp4_test_data_" + std::to_string(::getpid()));
    fs::remove_all(g_root);
    fs::create_directories(g_root);
  }
  void TearDown() override { fs::remove_all(g_root); }
};
[[maybe_unused]] auto* const g_env = ::testing::AddGlobalTestEnvironment(new DataEnv);

}  // namespace

// ---------------------------------------------------------------------------------------
// split_corpus

TEST(SplitCorpus, DirectoryHoldsOutEveryTenthDocument) {
  const fs::path dir = fresh("split_dir");
  for (int i = 0; i < 25; ++i)
    write(dir / doc_name(i), "document " + std::to_string(i) + " body text marker" +
                                 std::to_string(i * 7919) + "\n");
  write(dir / ".complete", "not a document\n");          // hidden: skipped
  write(dir / ".git" / "config", "not a document\n");    // hidden dir: skipped
  const auto s = fp4::split_corpus(dir);
  ASSERT_EQ(s.train_docs.size(), 23u);
  ASSERT_EQ(s.heldout_docs.size(), 2u);
  ASSERT_EQ(s.train_names.size(), 23u);
  EXPECT_EQ(s.heldout_names, (std::vector<std::string>{"doc09.txt", "doc19.txt"}));
  EXPECT_EQ(s.heldout_docs[0], "document 9 body text marker" + std::to_string(9 * 7919));
  EXPECT_EQ(s.train_names.front(), "doc00.txt");
  EXPECT_EQ(s.train_names.back(), "doc24.txt");
  for (const auto& h : s.heldout_docs)
    for (const auto& t : s.train_docs) EXPECT_EQ(t.find(h), std::string::npos);
  for (const auto& n : s.train_names) EXPECT_NE(n, "doc09.txt");
}

TEST(SplitCorpus, DirectoryIsRecursiveAndSortedByRelativePath) {
  const fs::path dir = fresh("split_rec");
  // Sorted relative paths: a/x00 .. a/x04, b/y00 .. b/y09, c.txt
  for (int i = 0; i < 5; ++i) write(dir / "a" / ("x0" + std::to_string(i)), "a" + std::to_string(i));
  for (int i = 0; i < 10; ++i) write(dir / "b" / ("y0" + std::to_string(i)), "b" + std::to_string(i));
  write(dir / "c.txt", "c");
  write(dir / "empty.txt", " \n\n");  // whitespace only: skipped, takes no index
  const auto s = fp4::split_corpus(dir);
  EXPECT_EQ(s.train_docs.size() + s.heldout_docs.size(), 16u);
  EXPECT_EQ(s.heldout_names, std::vector<std::string>{"b/y04"});
  EXPECT_EQ(s.heldout_docs, std::vector<std::string>{"b4"});
}

TEST(SplitCorpus, SingleFileSplitsAtBlankLines) {
  const fs::path dir = fresh("split_file");
  std::string text = "\n\n";
  for (int i = 0; i < 21; ++i) {
    text += "doc " + std::to_string(i) + " first line\ndoc " + std::to_string(i) + " second line\n";
    text += (i % 3 == 0) ? "\n  \t\n\n" : "\n";  // whitespace-only lines also separate
  }
  write(dir / "corpus.txt", text);
  const auto s = fp4::split_corpus(dir / "corpus.txt");
  ASSERT_EQ(s.train_docs.size(), 19u);
  ASSERT_EQ(s.heldout_docs.size(), 2u);
  EXPECT_EQ(s.heldout_names, (std::vector<std::string>{"corpus.txt#9", "corpus.txt#19"}));
  EXPECT_EQ(s.heldout_docs[0], "doc 9 first line\ndoc 9 second line");
  EXPECT_EQ(s.train_docs[0], "doc 0 first line\ndoc 0 second line");
  EXPECT_EQ(s.train_names[9], "corpus.txt#10");
  for (const auto& h : s.heldout_docs)
    for (const auto& t : s.train_docs) EXPECT_EQ(t.find(h), std::string::npos);
}

TEST(SplitCorpus, Errors) {
  expect_user_error([] { fp4::split_corpus(g_root / "no_such_dir"); }, {"no_such_dir", "does not exist"});

  const fs::path empty = fresh("err_empty");
  expect_user_error([&] { fp4::split_corpus(empty); }, {"err_empty", "no files"});

  const fs::path blanks = fresh("err_blanks");
  for (int i = 0; i < 12; ++i) write(blanks / doc_name(i), i % 2 ? "" : "  \n");
  expect_user_error([&] { fp4::split_corpus(blanks); }, {"err_blanks", "empty"});

  const fs::path few = fresh("err_few");
  for (int i = 0; i < 9; ++i) write(few / doc_name(i), "text " + std::to_string(i));
  expect_user_error([&] { fp4::split_corpus(few); }, {"only 9", "held out"});

  write(g_root / "err_file" / "one.txt", "a\n\nb\n\nc\n");
  expect_user_error([&] { fp4::split_corpus(g_root / "err_file" / "one.txt"); }, {"one.txt", "only 3"});
}

TEST(SplitCorpus, InvalidUtf8NamesFileAndOffset) {
  const fs::path dir = fresh("err_utf8");
  for (int i = 0; i < 12; ++i) write(dir / doc_name(i), "fine text é € 𝄞 " + std::to_string(i));
  write(dir / "doc05.txt", std::string("hello\xff world"));
  expect_user_error([&] { fp4::split_corpus(dir); }, {"doc05.txt", "UTF-8", "offset 5", "0xFF"});

  // Overlong encoding, surrogate, truncated sequence, beyond U+10FFFF.
  const std::vector<std::string> bad = {"ab\xC0\xAF", "abc\xED\xA0\x80", "a\xE2\x82", "\xF4\x90\x80\x80"};
  const std::vector<int> offset = {2, 3, 1, 0};
  for (size_t k = 0; k < bad.size(); ++k) {
    write(dir / "doc05.txt", bad[k]);
    expect_user_error([&] { fp4::split_corpus(dir); }, {"doc05.txt", "offset " + std::to_string(offset[k])});
  }
  write(dir / "doc05.txt", "ok");
  EXPECT_NO_THROW(fp4::split_corpus(dir));
}

// ---------------------------------------------------------------------------------------
// prepare_tokens: one trained tokenizer shared by the tests below.

class Tokens : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    corpus_ = new fs::path(make_corpus("tok_corpus"));
    cache_ = new fs::path(g_root / "tok_cache");
    logs_ = new std::vector<std::string>;
    first_ = new fp4::TokenData(fp4::prepare_tokens(
        *corpus_, kVocab, *cache_, [](const std::string& s) { logs_->push_back(s); }));
  }
  static void TearDownTestSuite() {
    delete corpus_;
    delete cache_;
    delete logs_;
    delete first_;
  }
  static fs::path* corpus_;
  static fs::path* cache_;
  static std::vector<std::string>* logs_;
  static fp4::TokenData* first_;
};
fs::path* Tokens::corpus_ = nullptr;
fs::path* Tokens::cache_ = nullptr;
std::vector<std::string>* Tokens::logs_ = nullptr;
fp4::TokenData* Tokens::first_ = nullptr;

TEST_F(Tokens, TrainsAndRoundTrips) {
  const fp4::TokenData& td = *first_;
  EXPECT_FALSE(td.from_cache);
  EXPECT_EQ(td.vocab_size, kVocab);
  EXPECT_TRUE(fs::exists(td.tokenizer_model));
  EXPECT_EQ(td.cache_dir.parent_path(), *cache_);
  EXPECT_EQ(td.cache_dir.filename().string().size(), 16u);
  for (const char* f : {"tokenizer.model", "train.bin", "heldout.bin", "meta.json"})
    EXPECT_TRUE(fs::exists(td.cache_dir / f)) << f;
  EXPECT_EQ(td.train.token_bytes(), 2);
  for (uint32_t t : td.train.ids()) ASSERT_LT(t, uint32_t(kVocab));
  for (uint32_t t : td.heldout.ids()) ASSERT_LT(t, uint32_t(kVocab));

  const auto split = fp4::split_corpus(*corpus_);
  const auto train_docs = documents_of(td.train);
  const auto heldout_docs = documents_of(td.heldout);
  ASSERT_EQ(train_docs.size(), split.train_docs.size());
  ASSERT_EQ(heldout_docs.size(), split.heldout_docs.size());
  // BPE compresses: well under one token per byte.
  EXPECT_LT(td.train.size() * 2, split.train_docs[0].size() * split.train_docs.size());
  for (size_t i = 0; i < 3; ++i)
    EXPECT_EQ(fp4::detokenize(td.tokenizer_model, train_docs[i]), split.train_docs[i]);
  // Held-out doc 0 (doc09) has characters never seen in training: byte fallback.
  EXPECT_EQ(fp4::detokenize(td.tokenizer_model, heldout_docs[0]), split.heldout_docs[0]);
  EXPECT_NE(split.heldout_docs[0].find("日本語"), std::string::npos);
  for (int t : heldout_docs[0]) EXPECT_NE(t, fp4::kTokenUnk);
  // EOS renders as a blank line between documents.
  std::vector<int> two = train_docs[0];
  two.push_back(fp4::kTokenEos);
  two.insert(two.end(), train_docs[1].begin(), train_docs[1].end());
  EXPECT_EQ(fp4::detokenize(td.tokenizer_model, two), split.train_docs[0] + "\n\n" + split.train_docs[1]);

  bool saw_training = false, saw_encoded = false;
  for (const auto& l : *logs_) {
    saw_training |= l.find("training tokenizer on 36 docs") != std::string::npos;
    saw_encoded |= l.find("encoded") != std::string::npos;
  }
  EXPECT_TRUE(saw_training);
  EXPECT_TRUE(saw_encoded);

  expect_user_error([&] { fp4::detokenize(td.tokenizer_model, {5, kVocab}); }, {"outside"});
}

TEST_F(Tokens, SecondCallHitsCache) {
  std::vector<std::string> logs;
  const auto td = fp4::prepare_tokens(*corpus_, kVocab, *cache_,
                                      [&](const std::string& s) { logs.push_back(s); });
  EXPECT_TRUE(td.from_cache);
  EXPECT_EQ(td.cache_dir, first_->cache_dir);
  EXPECT_EQ(td.train.ids(), first_->train.ids());
  EXPECT_EQ(td.heldout.ids(), first_->heldout.ids());
  EXPECT_EQ(td.vocab_size, kVocab);
  for (const auto& l : logs) EXPECT_EQ(l.find("training"), std::string::npos) << l;
  // Only the published directory is left in the cache root (no temporaries), beside the
  // stored scans (.scans/).
  int entries = 0;
  for (const auto& e : fs::directory_iterator(*cache_))
    if (e.path().filename() != ".scans") ++entries;
  EXPECT_EQ(entries, 1);
  EXPECT_TRUE(fs::is_directory(*cache_ / ".scans"));
}

TEST_F(Tokens, ChangedDocumentInvalidatesCache) {
  const fs::path copy = g_root / "tok_corpus_changed";
  fs::remove_all(copy);
  fs::copy(*corpus_, copy, fs::copy_options::recursive);
  write(copy / doc_name(3), read(copy / doc_name(3)) + " One more sentence.");
  const auto td = fp4::prepare_tokens(copy, kVocab, *cache_);
  EXPECT_FALSE(td.from_cache);
  EXPECT_NE(td.cache_dir, first_->cache_dir);
  EXPECT_NE(td.train.ids(), first_->train.ids());
  // A different vocab size is a different cache entry too.
  const auto split = fp4::split_corpus(copy);
  EXPECT_EQ(documents_of(td.train).size(), split.train_docs.size());
}

TEST_F(Tokens, CorruptShardIsUserError) {
  const fs::path root2 = fresh("tok_cache_corrupt");
  const fs::path dir2 = root2 / first_->cache_dir.filename();
  auto reset = [&] {
    fs::remove_all(dir2);
    fs::copy(first_->cache_dir, dir2, fs::copy_options::recursive);
  };
  reset();
  EXPECT_TRUE(fp4::prepare_tokens(*corpus_, kVocab, root2).from_cache);

  // Truncated train shard.
  fs::resize_file(dir2 / "train.bin", fs::file_size(dir2 / "train.bin") - 3);
  expect_user_error([&] { fp4::prepare_tokens(*corpus_, kVocab, root2); }, {"train.bin"});

  // Shorter than the header.
  reset();
  fs::resize_file(dir2 / "heldout.bin", 10);
  expect_user_error([&] { fp4::prepare_tokens(*corpus_, kVocab, root2); }, {"heldout.bin"});

  // Bad magic.
  reset();
  {
    std::fstream f(dir2 / "heldout.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(0);
    f.write("XXXX", 4);
  }
  expect_user_error([&] { fp4::prepare_tokens(*corpus_, kVocab, root2); }, {"heldout.bin", "magic"});

  // Header count disagrees with the payload.
  reset();
  {
    std::fstream f(dir2 / "train.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(16);
    const char big[8] = {1, 0, 0, 0, 0, 0, 0, 0};
    f.write(big, 8);
  }
  expect_user_error([&] { fp4::prepare_tokens(*corpus_, kVocab, root2); }, {"train.bin"});

  // Broken metadata.
  reset();
  write(dir2 / "meta.json", "{ not json");
  expect_user_error([&] { fp4::prepare_tokens(*corpus_, kVocab, root2); }, {"meta.json"});
}

TEST(TokensArgs, VocabOutOfRange) {
  expect_user_error([] { fp4::prepare_tokens(g_root, 255, g_root / "c"); }, {"vocab_size", "255"});
}

// ---------------------------------------------------------------------------------------
// Batches

TEST(Batches, SplitMix64) {
  EXPECT_EQ(fp4::splitmix64(0, 0), 0xE220A8397B1DCDAFull);
  EXPECT_NE(fp4::splitmix64(1, 0), fp4::splitmix64(0, 0));
}

// 0, 1, ..., n - 1 (+ offset) in a stream of `bytes` bytes per id.
fp4::TokenStream ramp(size_t n, int bytes = 2, uint32_t offset = 0) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint32_t>(i) + offset;
  return fp4::TokenStream::from_ids(v, bytes);
}

TEST(Batches, WindowsAreContiguousAndShifted) {
  const auto tokens = ramp(5000);
  const int T = 32, B = 8;
  fp4::BatchSampler s(tokens, T, B, 42);
  std::vector<int32_t> in(B * T), tg(B * T);
  for (int k = 0; k < 20; ++k) {
    s.next(in.data(), tg.data());
    EXPECT_EQ(s.draws(), static_cast<uint64_t>(k + 1));
    for (int r = 0; r < B; ++r) {
      const int64_t start = static_cast<int64_t>(fp4::splitmix64(42, uint64_t(k) * B + r) % (5000 - T));
      EXPECT_EQ(in[r * T], start);
      for (int j = 0; j < T; ++j) {
        ASSERT_EQ(in[r * T + j], in[r * T] + j);
        ASSERT_EQ(tg[r * T + j], in[r * T + j] + 1);
        ASSERT_LT(tg[r * T + j], 5000);
      }
    }
  }
}

// Ids above 65,535 (4-byte streams) reach the batches whole.
TEST(Batches, FourByteIdsAboveUint16) {
  const uint32_t offset = 70000;
  const auto tokens = ramp(3000, 4, offset);
  ASSERT_EQ(tokens.token_bytes(), 4);
  const int T = 16, B = 4;
  fp4::BatchSampler s(tokens, T, B, 5);
  std::vector<int32_t> in(B * T), tg(B * T);
  s.next(in.data(), tg.data());
  for (int r = 0; r < B; ++r) {
    const int64_t start = static_cast<int64_t>(fp4::splitmix64(5, uint64_t(r)) % (3000 - T));
    EXPECT_EQ(in[r * T], start + offset);
    for (int j = 0; j < T; ++j) ASSERT_EQ(tg[r * T + j], in[r * T + j] + 1);
  }
}

TEST(Batches, SeedDeterminesStream) {
  const auto tokens = ramp(10000);
  const int T = 16, B = 4;
  auto stream = [&](uint64_t seed, int draws) {
    fp4::BatchSampler s(tokens, T, B, seed);
    std::vector<int32_t> all, in(B * T), tg(B * T);
    for (int k = 0; k < draws; ++k) {
      s.next(in.data(), tg.data());
      all.insert(all.end(), in.begin(), in.end());
      all.insert(all.end(), tg.begin(), tg.end());
    }
    return all;
  };
  EXPECT_EQ(stream(7, 5), stream(7, 5));
  EXPECT_NE(stream(7, 5), stream(8, 5));
}

TEST(Batches, SetDrawsResumes) {
  const auto tokens = ramp(10000);
  const int T = 16, B = 4;
  fp4::BatchSampler a(tokens, T, B, 123);
  std::vector<std::vector<int32_t>> ins, tgs;
  for (int k = 0; k < 6; ++k) {
    std::vector<int32_t> in(B * T), tg(B * T);
    a.next(in.data(), tg.data());
    ins.push_back(in);
    tgs.push_back(tg);
  }
  fp4::BatchSampler b(tokens, T, B, 123);
  b.set_draws(3);
  for (int k = 3; k < 6; ++k) {
    std::vector<int32_t> in(B * T), tg(B * T);
    b.next(in.data(), tg.data());
    EXPECT_EQ(in, ins[k]);
    EXPECT_EQ(tg, tgs[k]);
  }
  EXPECT_EQ(b.draws(), 6u);
}

TEST(Batches, ShortStream) {
  const auto tokens = ramp(17);
  EXPECT_THROW(fp4::BatchSampler(tokens, 17, 2, 1), UserError);
  fp4::BatchSampler s(tokens, 16, 2, 1);  // exactly seq_len + 1 tokens: one possible window
  std::vector<int32_t> in(32), tg(32);
  s.next(in.data(), tg.data());
  EXPECT_EQ(in[0], 0);
  EXPECT_EQ(in[16], 0);
  EXPECT_EQ(tg[15], 16);
  const fp4::TokenStream none;
  EXPECT_THROW(fp4::BatchSampler(none, 4, 1, 1), UserError);
}

TEST(Batches, HeldoutWindowsDoNotOverlap) {
  const int T = 64;
  const auto w = fp4::heldout_windows(1000, T, 100);
  ASSERT_EQ(w.size(), 15u);  // (1000 - 1) / 64
  for (size_t i = 0; i < w.size(); ++i) {
    EXPECT_EQ(w[i], static_cast<int64_t>(i) * T);
    EXPECT_LE(w[i] + T + 1, 1000);
    if (i) {
      EXPECT_GE(w[i], w[i - 1] + T);  // input ranges [s, s + T) are disjoint
    }
  }
  EXPECT_EQ(fp4::heldout_windows(1000, T, 4).size(), 4u);
  EXPECT_EQ(fp4::heldout_windows(65, T, 10).size(), 1u);
  EXPECT_TRUE(fp4::heldout_windows(64, T, 10).empty());
  EXPECT_EQ(fp4::heldout_windows(129, T, 10).size(), 2u);
}
