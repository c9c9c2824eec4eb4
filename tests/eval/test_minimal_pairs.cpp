// The minimal-pair tasks (include/fp4/eval/minimal_pairs.h; docs/evaluation.md "Minimal pairs:
// `eval --task minimal-pairs`"): items by hand on a built corpus, their credit and margin, the
// credit strings, McNemar's test, and scoring at a forward length shorter than the model's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <unistd.h>
#include <vector>

#include "fp4/base/error.h"
#include "fp4/eval/eval.h"
#include "fp4/eval/minimal_pairs.h"
#include "fp4/eval/tasks.h"
#include "fp4/nn/model.h"
#include "fp4/recipe/recipe.h"

using namespace fp4;
namespace fs = std::filesystem;

namespace {
using Sv = std::vector<std::string>;

std::string join_words(const Sv& w) {
  std::string s;
  for (const auto& x : w) s += (s.empty() ? "" : " ") + x;
  return s;
}

Sv words_of(const std::string& s) {
  Sv w;
  size_t p = 0;
  while (p < s.size()) {
    size_t e = s.find(' ', p);
    if (e == std::string::npos) e = s.size();
    w.push_back(s.substr(p, e - p));
    p = e + 1;
  }
  return w;
}

TEST(MinimalPairs, PluralRules) {
  EXPECT_EQ(plural_of("book"), "books");
  EXPECT_EQ(plural_of("box"), "boxes");
  EXPECT_EQ(plural_of("church"), "churches");
  EXPECT_EQ(plural_of("wish"), "wishes");
  EXPECT_EQ(plural_of("bus"), "buses");
  EXPECT_EQ(plural_of("city"), "cities");
  EXPECT_EQ(plural_of("day"), "days");  // y after a vowel
  EXPECT_EQ(plural_of("man"), "men");
  EXPECT_EQ(plural_of("child"), "children");
}

TEST(MinimalPairs, TrainingWordCountsStripPunctuationAndKeepLetterWords) {
  CorpusSplit c;
  c.train_docs = {"The cat, the cats. \"Cat\" don't U.S. 1961 well-known", "the"};
  c.heldout_docs = {"Dogs are not counted."};
  c.heldout_names = {"h"};
  const auto wc = training_word_counts(c);
  // Lower-case words only: "The" and "Cat" are not counted (a name like "Ohio" never is);
  // don't, U.S, 1961 and well-known are not letter words.
  const std::map<std::string, int64_t> want = {{"the", 2}, {"cat", 1}, {"cats", 1}};
  EXPECT_EQ(wc, want);
}

// A corpus whose held-out sentences each have one place per paradigm, so every altered copy
// is known by hand.
CorpusSplit built_corpus() {
  CorpusSplit c;
  // Training words: both numbers of book/dog/city, words seen once, and 3-letter words of
  // distinct counts around "dog" (5): cat 1, cow 2, old 2, pig 3, hen 4 below it, fox 6,
  // owl 7, emu 8, yak 9 above it, so "dog" is the one cloze target.
  std::string t = "book books dogs city cities apple pear plum fig lime kiwi";
  for (auto [w, n] : std::vector<std::pair<std::string, int>>{{"cat", 1}, {"cow", 2}, {"old", 2},
                                                             {"pig", 3}, {"hen", 4}, {"dog", 5},
                                                             {"fox", 6}, {"owl", 7}, {"emu", 8},
                                                             {"yak", 9}})
    for (int i = 0; i < n; ++i) t += " " + w;
  c.train_docs = {t};
  c.heldout_docs = {"These books are old.\nThis dog is here. We ate plum, she said.",
                    "He has an apple. A fig, sir."};
  c.heldout_names = {"h1", "h2"};
  return c;
}

TEST(MinimalPairs, ItemsByHandOnABuiltCorpus) {
  MinimalPairOptions o;
  o.items = 50;
  o.min_words = 3;
  o.cloze_min_count = 1;
  const auto items = make_minimal_pair_items(built_corpus(), o);
  std::map<std::string, std::vector<MinimalPairItem>> by;
  for (const auto& it : items) by[it.paradigm].push_back(it);
  // swap: adjacent lower-case plain words (no punctuation): "books are", "dog is", "has
  // an"; "We ate plum, she said." and "A fig, sir." have none. One place per sentence here.
  ASSERT_EQ(by["swap"].size(), 3u);
  EXPECT_EQ(by["swap"][0].choices, (Sv{"These books are old.", "These are books old."}));
  EXPECT_EQ(by["swap"][0].doc, "h1");
  EXPECT_EQ(by["swap"][0].sentence, 0);
  EXPECT_EQ(by["swap"][1].choices, (Sv{"This dog is here.", "This is dog here."}));
  EXPECT_EQ(by["swap"][1].sentence, 1);
  EXPECT_EQ(by["swap"][2].choices, (Sv{"He has an apple.", "He an has apple."}));
  EXPECT_EQ(by["swap"][2].doc, "h2");
  // det-noun: the determiner flipped where it agrees with a noun that ends its phrase
  // ("are", "is" follow): one plural and one singular original.
  ASSERT_EQ(by["det-noun"].size(), 2u);
  EXPECT_EQ(by["det-noun"][0].choices, (Sv{"These books are old.", "This books are old."}));
  EXPECT_EQ(by["det-noun"][0].change, "These -> This");
  EXPECT_EQ(by["det-noun"][1].choices, (Sv{"This dog is here.", "These dog is here."}));
  // a-an: one "an" and one "A" original, the capital kept.
  ASSERT_EQ(by["a-an"].size(), 2u);
  EXPECT_EQ(by["a-an"][0].choices, (Sv{"He has an apple.", "He has a apple."}));
  EXPECT_EQ(by["a-an"][0].doc, "h2");
  EXPECT_EQ(by["a-an"][1].choices, (Sv{"A fig, sir.", "An fig, sir."}));
  // subj-verb: "books are" (plural noun, plural verb) → "books is"; "dog is" → "dog are"; "He
  // has" → "He have". Round robin over the pairs is/are and has/have (was/were has none),
  // within a pair alternately a singular and a plural original: is/are gives "dog is" then
  // "books are", has/have gives "He has" and closes (no "have" original).
  ASSERT_EQ(by["subj-verb"].size(), 3u);
  EXPECT_EQ(by["subj-verb"][0].choices, (Sv{"These books are old.", "These books is old."}));
  EXPECT_EQ(by["subj-verb"][1].choices, (Sv{"This dog is here.", "This dog are here."}));
  EXPECT_EQ(by["subj-verb"][2].choices, (Sv{"He has an apple.", "He have an apple."}));
  // cloze: "dog" (S1, position 1) is the only content word with 4 words of a smaller and 4 of
  // a larger count in its length class ("books", "apple" have nothing below their count 1);
  // its distractors: r of the 4 just below (hen, pig, old, cow) and 3 − r of the 4 just above
  // (fox, owl, emu, yak), distinct.
  const std::set<std::string> below = {"hen", "pig", "old", "cow"}, above = {"fox", "owl", "emu", "yak"};
  ASSERT_EQ(by["cloze"].size(), 1u);
  {
    const auto& it = by["cloze"][0];
    ASSERT_EQ(it.choices.size(), 4u);
    EXPECT_EQ(it.choices[0], "This dog is here.");
    std::set<std::string> used;
    for (size_t k = 1; k < 4; ++k) {
      Sv w = words_of(it.choices[k]);
      EXPECT_TRUE(below.count(w[1]) || above.count(w[1])) << w[1];
      used.insert(w[1]);
      w[1] = "dog";
      EXPECT_EQ(join_words(w), it.choices[0]);  // nothing else changed
    }
    EXPECT_EQ(used.size(), 3u);
  }
  // shuffle: every sentence of 3+ words with two distinct words: 5 of them; each copy is a
  // permutation of the words that differs from the sentence.
  ASSERT_EQ(by["shuffle"].size(), 5u);
  for (const auto& it : by["shuffle"]) {
    ASSERT_EQ(it.choices.size(), 2u);
    EXPECT_NE(it.choices[0], it.choices[1]);
    Sv a = words_of(it.choices[0]), b = words_of(it.choices[1]);
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    EXPECT_EQ(a, b) << it.choices[1];
  }
  // The same options give the same items; the JSON Lines name every field.
  EXPECT_EQ(minimal_pair_items_jsonl(make_minimal_pair_items(built_corpus(), o)),
            minimal_pair_items_jsonl(items));
  EXPECT_NE(minimal_pair_items_jsonl(items).find("\"change\":\"These -> This\""), std::string::npos);
}

// Without cloze_min_count = 1 nothing is frequent enough for cloze: a paradigm without a
// place is an error naming it.
TEST(MinimalPairs, AParadigmWithoutAPlaceIsAnError) {
  MinimalPairOptions o;
  o.min_words = 3;
  try {
    (void)make_minimal_pair_items(built_corpus(), o);
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("the cloze paradigm"), std::string::npos) << e.what();
  }
  // Only one form of an agreement paradigm: no balanced draw, an error naming it.
  CorpusSplit c = built_corpus();
  c.heldout_docs[1] = "He has an apple.";
  o.cloze_min_count = 1;
  try {
    (void)make_minimal_pair_items(c, o);
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("one form of the a-an paradigm"), std::string::npos) << e.what();
  }
  o.min_words = 0;
  EXPECT_THROW(make_minimal_pair_items(built_corpus(), o), std::invalid_argument);
}

// Cloze distractors: words of about the target's length just below and above its count, the
// target's frequency rank among the four uniform over seeds (so a frequency-only model scores
// chance), never the target, at the target's position.
TEST(MinimalPairs, ClozeRanksTheTargetUniformlyByFrequency) {
  CorpusSplit c;
  // 4-letter words of counts 1..9, "blue" in the middle (5).
  std::string t = " book books ";
  const std::vector<std::string> ladder = {"gold", "pink", "rust", "teal", "blue",
                                           "navy", "cyan", "lime", "jade"};
  for (size_t k = 0; k < ladder.size(); ++k)
    for (size_t i = 0; i <= k; ++i) t += ladder[k] + " ";
  c.train_docs = {t};
  // Places for the other paradigms, both forms of each.
  c.heldout_docs = {"I saw the blue car today.\nThese books are an idea. This book is a gift."};
  c.heldout_names = {"h"};
  MinimalPairOptions o;
  o.min_words = 3;
  o.cloze_min_count = 1;
  std::map<int, int> rank;  // distractors below the target's count → seeds
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    o.seed = seed;
    int cloze = 0;
    for (const auto& it : make_minimal_pair_items(c, o)) {
      if (it.paradigm != "cloze") continue;
      ++cloze;
      ASSERT_EQ(it.choices.size(), 4u);
      EXPECT_EQ(it.choices[0], "I saw the blue car today.");
      std::set<std::string> used;
      int r = 0;
      for (size_t k = 1; k < 4; ++k) {
        Sv w = words_of(it.choices[k]);
        ASSERT_EQ(w.size(), 6u);
        const auto at = std::find(ladder.begin(), ladder.end(), w[3]);
        ASSERT_NE(at, ladder.end()) << w[3];
        EXPECT_NE(w[3], "blue");
        r += at < ladder.begin() + 4;
        used.insert(w[3]);
        w[3] = "blue";
        EXPECT_EQ(join_words(w), it.choices[0]);
      }
      EXPECT_EQ(used.size(), 3u);
      ++rank[r];
    }
    ASSERT_EQ(cloze, 1) << "seed " << seed;
  }
  // r uniform in 0..3: 50 expected each; ±25 is beyond 4 binomial standard deviations (6.1).
  for (int r = 0; r <= 3; ++r) EXPECT_NEAR(rank[r], 50, 25) << "r = " << r;
}

TEST(MinimalPairs, CreditAndMarginByHand) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  PairCredit c = minimal_pair_credit({-1.0, -2.5});
  EXPECT_EQ(c.credit, 1.0);
  EXPECT_DOUBLE_EQ(c.margin, 1.5);
  c = minimal_pair_credit({-3.0, -2.0});
  EXPECT_EQ(c.credit, 0.0);
  EXPECT_DOUBLE_EQ(c.margin, -1.0);
  c = minimal_pair_credit({-2.0, -2.0});  // a tie: chance, not full marks
  EXPECT_EQ(c.credit, 0.5);
  EXPECT_EQ(c.margin, 0.0);
  c = minimal_pair_credit({-1.0, -1.0, -4.0, -1.0});
  EXPECT_EQ(c.credit, 1.0 / 3.0);
  c = minimal_pair_credit({-1.0, -0.5, -1.0, -1.0});  // a tie below the best: no credit
  EXPECT_EQ(c.credit, 0.0);
  c = minimal_pair_credit({-1.0, nan});
  EXPECT_TRUE(std::isnan(c.credit) && std::isnan(c.margin));
  EXPECT_THROW(minimal_pair_credit({-1.0}), std::invalid_argument);
}

TEST(MinimalPairs, CreditStringsRoundTrip) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> v = {1, 0, 0.5, 1.0 / 3, 0.25, nan};
  EXPECT_EQ(format_credits(v), "10234-");
  const auto back = parse_credits("10234-");
  ASSERT_EQ(back.size(), v.size());
  for (size_t i = 0; i + 1 < v.size(); ++i) EXPECT_EQ(back[i], v[i]);
  EXPECT_TRUE(std::isnan(back[5]));
  EXPECT_THROW(format_credits({0.4}), std::invalid_argument);
  EXPECT_THROW(parse_credits("1x"), std::invalid_argument);
}

TEST(MinimalPairs, McNemarExactByHand) {
  EXPECT_EQ(mcnemar_exact_p(0, 0), 1.0);
  EXPECT_NEAR(mcnemar_exact_p(5, 0), 2.0 / 32, 1e-12);          // 2 · (1/2)^5
  EXPECT_NEAR(mcnemar_exact_p(1, 9), 2.0 * 11 / 1024, 1e-12);   // 2 · (1 + 10) / 2^10
  EXPECT_NEAR(mcnemar_exact_p(9, 1), 2.0 * 11 / 1024, 1e-12);   // symmetric
  EXPECT_EQ(mcnemar_exact_p(3, 3), 1.0);                        // 2 · 42/64 > 1
  EXPECT_THROW(mcnemar_exact_p(-1, 2), std::invalid_argument);
}

// The task file: keys, defaults, errors naming the file and key.
TEST(MinimalPairs, TaskFileKeysAndErrors) {
  const fs::path f = fs::temp_directory_path() / ("fp4_mp_task_" + std::to_string(::getpid()) + ".toml");
  std::ofstream(f) << "items = 7\nseed = 3\nfnv1a64 = \"abc\"\n";
  MinimalPairTask t = load_minimal_pair_task(f);
  EXPECT_EQ(t.opt.items, 7);
  EXPECT_EQ(t.opt.seed, 3u);
  EXPECT_EQ(t.opt.max_words, MinimalPairOptions{}.max_words);
  EXPECT_EQ(t.shipped_hash, "abc");
  auto expect_error = [&](const std::string& text, const std::string& needle) {
    std::ofstream(f) << text;
    try {
      (void)load_minimal_pair_task(f);
      ADD_FAILURE() << "no error for " << text;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(f.string()), std::string::npos) << e.what();
    }
  };
  expect_error("items = 0\n", "items = 0 is outside");
  expect_error("items = \"x\"\n", "items must be an integer");
  expect_error("min_words = 9\nmax_words = 5\n", "min_words must be <= max_words");
  expect_error("itmes = 3\n", "unknown key 'itmes'");
  expect_error("items = [\n", f.string());
  fs::remove(f);
}

TEST(MinimalPairs, TheBrownItemsAreTheShippedSet) {
  const fs::path brown = fs::path(FP4_SOURCE_DIR) / "data/brown/text";
  if (!fs::exists(brown)) GTEST_SKIP() << "default corpus not installed (scripts/setup)";
  const MinimalPairTask t =
      load_minimal_pair_task(fs::path(FP4_SOURCE_DIR) / "configs/tasks/minimal-pairs.toml");
  ASSERT_EQ(t.shipped_hash.size(), 16u) << "no fnv1a64 in configs/tasks/minimal-pairs.toml";
  const auto items = make_minimal_pair_items(split_corpus(brown), t.opt);
  std::map<std::string, int> n;
  for (const auto& it : items) ++n[it.paradigm];
  // 300 per paradigm but det-noun (too few "these" originals for 150 of each).
  for (auto p : kMinimalPairParadigms) EXPECT_GE(n[std::string(p)], p == "det-noun" ? 80 : 300) << p;
  // Each word of a pair is the original as often as the other (±1), per pair: the change
  // field names the original's word first ("was -> were").
  std::map<std::string, int> orig;
  for (const auto& it : items)
    if (it.paradigm == "det-noun" || it.paradigm == "a-an" || it.paradigm == "subj-verb") {
      std::string w = it.change.substr(0, it.change.find(' '));
      for (char& ch : w) ch = char(std::tolower(static_cast<unsigned char>(ch)));
      ++orig[w];
    }
  for (auto [a, b] : std::vector<std::pair<std::string, std::string>>{
           {"this", "these"}, {"a", "an"}, {"is", "are"}, {"was", "were"}, {"has", "have"}}) {
    EXPECT_GT(orig[a], 10) << a;
    EXPECT_LE(std::abs(orig[a] - orig[b]), 1) << a << " " << orig[a] << ", " << b << " " << orig[b];
  }
  EXPECT_EQ(fnv1a64_hex(minimal_pair_items_jsonl(items)), t.shipped_hash)
      << "the items changed: a changed rule or draw must update the shipped hash (and the "
         "results that used the old items)";
}

ModelConfig small_model() {
  ModelConfig m;
  m.vocab_size = 64;
  m.d_model = 32;
  m.n_layers = 1;
  m.n_heads = 2;
  m.mlp_hidden = 64;
  return m;
}

// Rows scored at a forward length shorter than the model's (MinimalPairRows::T) give the
// scores of the full-length forward (causal: the extra padding is never seen), and an item
// whose credit comes from them is the hand rule on those scores.
TEST(MinimalPairs, ShortForwardScoresEqualTheFullLengthOnes) {
  Recipe fp32;
  fp32.mode = LinearMode::FP32;
  const int seq_len = 32, batch = 4;
  nn::Model model(small_model(), fp32, batch, seq_len);
  model.init(7);
  EvalPolicy none;
  none.kind = EvalPolicy::Kind::None;
  const std::vector<ScoredSequence> seqs = {{{2, 10, 11, 12}, 3},
                                            {{2, 11, 10, 12}, 3},
                                            {{2, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35}, 16},
                                            {{2, 21, 20, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35}, 16}};
  const auto full = continuation_logprobs(model, seqs, seq_len, batch, none);
  const auto shrt = continuation_logprobs(model, seqs, 16, batch, none);
  ASSERT_EQ(full.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(shrt[i], full[i], 1e-5 * std::fabs(full[i])) << i;
  // As rows of two items.
  std::vector<MinimalPairItem> items(2);
  items[0].choices = {"a", "b"};
  items[1].choices = {"c", "d"};
  MinimalPairRows rows;
  rows.seqs = seqs;
  rows.first_row = {0, 2};
  rows.skipped = {false, false};
  rows.T = 16;
  const MinimalPairScore sc = score_minimal_pairs(model, items, rows, batch, none);
  ASSERT_EQ(sc.credit.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(sc.credit[i], minimal_pair_credit({shrt[2 * i], shrt[2 * i + 1]}).credit);
    EXPECT_DOUBLE_EQ(sc.margin[i], shrt[2 * i] - shrt[2 * i + 1]);
  }
  // A skipped item has no rows and NaN outcomes.
  rows.seqs.resize(2);
  rows.skipped = {false, true};
  const MinimalPairScore s2 = score_minimal_pairs(model, items, rows, batch, none);
  EXPECT_TRUE(std::isnan(s2.credit[1]) && std::isnan(s2.margin[1]));
  EXPECT_TRUE(s2.finite);
}

}  // namespace

namespace {
// minimal_pair_rows: one EOS-led row per sentence, every token its continuation; an item with a
// sentence longer than max_tokens tokens is left out with no rows; T is the longest row minus
// one rounded up to 16, at most max_tokens.
TEST(MinimalPairs, RowsSkipLongItemsAndRoundTheForwardLength) {
  const fs::path dir = fs::temp_directory_path() / ("fp4_mp_rows_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "corpus");
  const Sv words = {"the", "dog", "saw", "a", "cat", "and", "these", "books", "are", "old"};
  for (int d = 0; d < 20; ++d) {
    std::string text;
    for (int i = 0; i < 400; ++i) text += words[size_t((i * 7 + d * 3) % 10)] + (i % 9 == 8 ? ".\n" : " ");
    std::ofstream(dir / "corpus" / ("d" + std::to_string(100 + d) + ".txt")) << text;
  }
  const TokenData td = prepare_tokens(dir / "corpus", 300, dir / "cache");
  const Tokenizer tok(td.tokenizer_model);
  std::vector<MinimalPairItem> items(3);
  items[0].choices = {"the dog saw a cat.", "the saw dog a cat."};
  std::string long_text;
  for (int i = 0; i < 40; ++i) long_text += "these books are old ";
  items[1].choices = {long_text, long_text + "x"};
  items[2].choices = {"a cat.", "an cat.", "the cat.", "old cat."};
  const int max_tokens = 24;
  const MinimalPairRows r = minimal_pair_rows(items, tok, max_tokens);
  EXPECT_EQ(r.skipped, (std::vector<bool>{false, true, false}));
  EXPECT_EQ(r.first_row, (std::vector<size_t>{0, 2, 2}));
  ASSERT_EQ(r.seqs.size(), 6u);
  size_t longest = 0;
  const std::vector<std::string> kept = {items[0].choices[0], items[0].choices[1], items[2].choices[0],
                                         items[2].choices[1], items[2].choices[2], items[2].choices[3]};
  for (size_t k = 0; k < 6; ++k) {
    const std::vector<int> ids = tok.encode(kept[k]);
    ASSERT_EQ(r.seqs[k].tokens.size(), ids.size() + 1) << kept[k];
    EXPECT_EQ(r.seqs[k].tokens[0], kTokenEos);
    EXPECT_EQ(r.seqs[k].continuation, int(ids.size()));
    for (size_t j = 0; j < ids.size(); ++j) EXPECT_EQ(r.seqs[k].tokens[j + 1], ids[j]);
    longest = std::max(longest, r.seqs[k].tokens.size());
  }
  EXPECT_GT(tok.encode(long_text).size(), size_t(max_tokens));
  EXPECT_EQ(r.T, std::min(max_tokens, int((longest - 1 + 15) / 16 * 16)));
  fs::remove_all(dir);
}
}  // namespace
