// The next-sentence task (include/fp4/eval/tasks.h) and continuation scoring (fp4/eval/eval.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "fp4/base/error.h"
#include "fp4/eval/eval.h"
#include "fp4/nn/model.h"
#include "fp4/recipe/recipe.h"
#include "fp4/eval/tasks.h"

using namespace fp4;
namespace fs = std::filesystem;

namespace {
using Sv = std::vector<std::string>;

TEST(SplitSentences, HandCases) {
  EXPECT_EQ(split_sentences("Mr. Smith went home. He slept."), (Sv{"Mr. Smith went home.", "He slept."}));
  EXPECT_EQ(split_sentences("J. F. Kennedy spoke. Then he left!  Why? Because."),
            (Sv{"J. F. Kennedy spoke.", "Then he left!", "Why?", "Because."}));
  // Closing quotes stay with their sentence; an opening quote or a digit may start the next.
  EXPECT_EQ(split_sentences("He said \"Go.\" \"Now,\" she said. 3 men came."),
            (Sv{"He said \"Go.\"", "\"Now,\" she said.", "3 men came."}));
  // No split before a lowercase word, inside a number, or without a space.
  EXPECT_EQ(split_sentences("It rose 3.5 percent, e.g. in May.It fell."),
            (Sv{"It rose 3.5 percent, e.g. in May.It fell."}));
  EXPECT_EQ(split_sentences("Gov. Vandiver and Sen. Smith met. (They agreed.)"),
            (Sv{"Gov. Vandiver and Sen. Smith met.", "(They agreed.)"}));
  EXPECT_EQ(split_sentences("   "), Sv{});
  EXPECT_EQ(split_sentences("no end"), (Sv{"no end"}));
}

TEST(Fnv1a64, StandardTestVectors) {
  // The FNV reference values (Fowler, Noll, Vo: "FNV hash" test suite).
  EXPECT_EQ(fnv1a64_hex(""), "cbf29ce484222325");
  EXPECT_EQ(fnv1a64_hex("a"), "af63dc4c8601ec8c");
  EXPECT_EQ(fnv1a64_hex("foobar"), "85944171f73967e8");
}

// Three documents of 12 sentences each: "Doc X sentence NN says things." (all 30 bytes), two
// paragraphs per document.
CorpusSplit synthetic() {
  CorpusSplit c;
  for (const char* d : {"A", "B", "C"}) {
    std::string text;
    for (int i = 0; i < 12; ++i) {
      char b[64];
      std::snprintf(b, sizeof b, "Doc %s sentence %02d says things.", d, i);
      text += b;
      text += i == 5 ? "\n\n" : (i == 11 ? "\n" : " ");
    }
    c.heldout_docs.push_back(text);
    c.heldout_names.push_back(std::string("doc") + d);
  }
  return c;
}

TEST(NextSentence, ItemsFollowTheirDocumentAndDistractorsComeFromOthers) {
  NextSentenceOptions o;
  o.items = 20;
  const auto items = make_next_sentence_items(synthetic(), o);
  ASSERT_EQ(items.size(), 20u);  // 3 documents x 9 places (sentences 3..11) = 27 >= 20
  std::map<int, int> answers;
  for (const auto& it : items) {
    ASSERT_EQ(it.context.size(), 3u);
    ASSERT_EQ(it.choices.size(), 4u);
    const std::string d = it.doc.substr(3);
    for (int k = 0; k < 3; ++k) {
      char want[64];
      std::snprintf(want, sizeof want, "Doc %s sentence %02d says things.", d.c_str(), it.sentence - 3 + k);
      EXPECT_EQ(it.context[size_t(k)], want);  // runs on across the paragraph break
    }
    char truth[64];
    std::snprintf(truth, sizeof truth, "Doc %s sentence %02d says things.", d.c_str(), it.sentence);
    EXPECT_EQ(it.choices[size_t(it.answer)], truth);
    std::set<std::string> distinct(it.choices.begin(), it.choices.end());
    EXPECT_EQ(distinct.size(), 4u);
    for (int c = 0; c < 4; ++c) {
      if (c != it.answer) {
        EXPECT_NE(it.choices[size_t(c)].substr(0, 5), "Doc " + d) << it.choices[size_t(c)];
      }
    }
    ++answers[it.answer];
  }
  EXPECT_GE(answers.size(), 3u);  // the answer's position varies
  // Sorted by (document, sentence); deterministic; another seed draws another set.
  for (size_t i = 1; i < items.size(); ++i)
    EXPECT_TRUE(items[i - 1].doc < items[i].doc ||
                (items[i - 1].doc == items[i].doc && items[i - 1].sentence < items[i].sentence));
  EXPECT_EQ(next_sentence_items_jsonl(items), next_sentence_items_jsonl(make_next_sentence_items(synthetic(), o)));
  NextSentenceOptions o2 = o;
  o2.seed = 2;
  EXPECT_NE(next_sentence_items_jsonl(items), next_sentence_items_jsonl(make_next_sentence_items(synthetic(), o2)));
  o2.items = 1000;  // more than the 27 places: all of them
  EXPECT_EQ(make_next_sentence_items(synthetic(), o2).size(), 27u);
}

TEST(NextSentence, DistractorsAreLengthMatched) {
  // Doc a: four sentences of 31 bytes. Doc b: one of 33 bytes, three of 80. For a's place
  // (its sentence 3) only the 33-byte one is within ±5 bytes: too few, so the 3 nearest in
  // length are used, the 33-byte one first. For b's place (an 80-byte sentence) a's
  // sentences are all 49 bytes off: again the 3 nearest, all of doc a.
  const std::string A = "Aaaa aaaa aaaa aaaa aaaa aaa 1.";
  CorpusSplit c;
  c.heldout_names = {"a", "b"};
  c.heldout_docs = {A + " Aaaa aaaa aaaa aaaa aaaa aaa 2. Aaaa aaaa aaaa aaaa aaaa aaa 3. "
                        "Aaaa aaaa aaaa aaaa aaaa aaa 4.",
                    "Bbbb bbbb bbbb bbbb bbbb bbbb b 1. "
                    "Cccc cccc cccc cccc cccc cccc cccc cccc cccc cccc cccc cccc cccc cccc cccc ccc. "
                    "Dddd dddd dddd dddd dddd dddd dddd dddd dddd dddd dddd dddd dddd dddd dddd ddd. "
                    "Eeee eeee eeee eeee eeee eeee eeee eeee eeee eeee eeee eeee eeee eeee eeee eee."};
  ASSERT_EQ(A.size(), 31u);
  const auto items = make_next_sentence_items(c, NextSentenceOptions{});
  ASSERT_EQ(items.size(), 2u);
  for (const auto& it : items) {
    std::multiset<std::string> d;
    for (int k = 0; k < 4; ++k)
      if (k != it.answer) d.insert(it.choices[size_t(k)].substr(0, 4));
    if (it.doc == "a") {
      EXPECT_EQ(d.count("Bbbb"), 1u);
      EXPECT_EQ(d.count("Aaaa"), 0u);
    } else {
      EXPECT_EQ(d.count("Aaaa"), 3u);  // three of doc a's four
    }
  }
  CorpusSplit one;
  one.heldout_names = {"a"};
  one.heldout_docs = {c.heldout_docs[0]};
  EXPECT_THROW(make_next_sentence_items(one, NextSentenceOptions{}), UserError);
}

// A one-layer FP32 model (vocab 64, d_model 32, 2 heads, MLP 64) for the scoring tests.
ModelConfig tiny_model_config() {
  ModelConfig m;
  m.vocab_size = 64;
  m.d_model = 32;
  m.n_layers = 1;
  m.n_heads = 2;
  m.mlp_hidden = 64;
  return m;
}
Recipe fp32_recipe() {
  Recipe r;
  r.mode = LinearMode::FP32;
  return r;
}

TEST(ContinuationLogprobs, MatchAnIndependentLogSoftmaxAndIgnoreTheRestOfTheBatch) {
  const ModelConfig m = tiny_model_config();
  const int seq_len = 8, batch = 3;
  const Recipe fp32 = fp32_recipe();
  nn::Model model(m, fp32, batch, seq_len);
  model.init(3);
  const std::vector<ScoredSequence> seqs = {
      {{2, 10, 11, 12, 13}, 2}, {{2, 20, 21, 22, 23, 24, 25, 26, 27}, 5}, {{5, 6}, 1}, {{2, 30, 31}, 2}};
  EvalPolicy none;
  none.kind = EvalPolicy::Kind::None;
  const std::vector<double> got = continuation_logprobs(model, seqs, seq_len, batch, none);
  ASSERT_EQ(got.size(), seqs.size());
  // Reference: each sequence alone (one row, the rest padding), log-softmax in double.
  nn::Model one(m, fp32, 1, seq_len);
  one.params() = model.params();
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto& t = seqs[i].tokens;
    std::vector<int32_t> in(seq_len, 2), tg(seq_len, 2);
    for (size_t j = 0; j + 1 < t.size(); ++j) in[j] = t[j], tg[j] = t[j + 1];
    nn::StepContext ctx;
    ctx.training = false;
    ctx.quantize = false;
    one.forward(in.data(), tg.data(), 1, ctx);
    double want = 0;
    for (size_t j = t.size() - 1 - size_t(seqs[i].continuation); j + 1 < t.size(); ++j) {
      const float* z = one.logits() + j * size_t(m.vocab_size);
      double mx = z[0];
      for (int v = 1; v < m.vocab_size; ++v) mx = std::max(mx, double(z[v]));
      double se = 0;
      for (int v = 0; v < m.vocab_size; ++v) se += std::exp(double(z[v]) - mx);
      want += double(z[tg[j]]) - mx - std::log(se);
    }
    EXPECT_LT(got[i], 0.0);
    EXPECT_NEAR(got[i], want, 1e-5 * std::fabs(want)) << "sequence " << i;
  }
  // Bad sequences are refused.
  EXPECT_THROW(continuation_logprobs(model, {{{2, 3}, 2}}, seq_len, batch, none), std::invalid_argument);
  EXPECT_THROW(continuation_logprobs(model, {{std::vector<int32_t>(10, 3), 1}}, seq_len, batch, none),
               std::invalid_argument);
  EXPECT_ANY_THROW(continuation_logprobs(model, {{{2, 99}, 1}}, seq_len, batch, none));
}

TEST(NextSentence, TheBrownItemsAreTheShippedSet) {
  const fs::path brown = fs::path(FP4_SOURCE_DIR) / "data/brown/text";
  if (!fs::exists(brown)) GTEST_SKIP() << "default corpus not installed (scripts/setup)";
  std::ifstream f(fs::path(FP4_SOURCE_DIR) / "configs/tasks/next-sentence.toml");
  std::string line, shipped;
  while (std::getline(f, line))
    if (line.rfind("fnv1a64 = \"", 0) == 0) shipped = line.substr(11, 16);
  ASSERT_EQ(shipped.size(), 16u) << "no fnv1a64 in configs/tasks/next-sentence.toml";
  const auto items = make_next_sentence_items(split_corpus(brown), NextSentenceOptions{});
  EXPECT_EQ(items.size(), 500u);
  EXPECT_EQ(fnv1a64_hex(next_sentence_items_jsonl(items)), shipped)
      << "the items changed: a changed sentence rule or draw must update the shipped hash "
         "(and the results that used the old items)";
}
// score_next_sentence picks, per item, the choice of highest log-likelihood (raw) and of
// highest log-likelihood per character, against continuation_logprobs of the same rows
// (the independent reference above checks those); the lower index wins a tie (two identical
// rows); the answer is what decides correctness; rows that are not 4 per item are refused.
TEST(NextSentence, ScoreTakesTheArgmaxOfTheRowsAndTheLowerIndexOnTies) {
  const int seq_len = 8, batch = 4;
  nn::Model model(tiny_model_config(), fp32_recipe(), batch, seq_len);
  model.init(5);
  EvalPolicy none;
  none.kind = EvalPolicy::Kind::None;
  NextSentenceRows rows;
  std::vector<NextSentenceItem> items(3);
  for (int i = 0; i < 3; ++i) {
    for (int c = 0; c < 4; ++c) {
      // Item 2's choices 1 and 3 are one row twice: a tie, whatever the model.
      const int cc = (i == 2 && c == 3) ? 1 : c;
      rows.seqs.push_back({{2, 10 + i, 20 + cc, 30 + cc, 40 + i * cc}, 2 + (cc % 2)});
      rows.chars.push_back(1 + 3 * cc);
    }
  }
  const std::vector<double> lp = continuation_logprobs(model, rows.seqs, seq_len, batch, none);
  for (int i = 0; i < 3; ++i) {
    int best = 0, best_n = 0;
    for (int c = 1; c < 4; ++c) {
      if (lp[4 * i + c] > lp[4 * i + best]) best = c;
      if (lp[4 * i + c] / rows.chars[4 * i + c] > lp[4 * i + best_n] / rows.chars[4 * i + best_n]) best_n = c;
    }
    items[size_t(i)].answer = i == 0 ? best : i == 1 ? (best + 1) % 4 : best_n;
    if (i == 2) {
      ASSERT_EQ(lp[8 + 1], lp[8 + 3]);  // the tie
      EXPECT_NE(best, 3);
    }
  }
  const NextSentenceScore sc = score_next_sentence(model, items, rows, seq_len, batch, none);
  EXPECT_TRUE(sc.finite);
  ASSERT_EQ(sc.raw.size(), 3u);
  EXPECT_EQ(sc.raw[0], 1.0);  // the answer is the argmax
  EXPECT_EQ(sc.raw[1], 0.0);  // it is not
  EXPECT_EQ(sc.per_char[2], 1.0);
  rows.seqs.pop_back();
  EXPECT_THROW(score_next_sentence(model, items, rows, seq_len, batch, none), std::invalid_argument);
}

// The task file: its keys, defaults for absent ones, and errors naming the file and key.
TEST(NextSentence, TaskFileKeysAndErrors) {
  const fs::path dir = fs::temp_directory_path() / ("fp4_task_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    const fs::path f = dir / name;
    std::ofstream(f) << text;
    return f;
  };
  const NextSentenceTask t = load_next_sentence_task(
      write("ok.toml", "context_sentences = 2\nitems = 7\nseed = 9\nfnv1a64 = \"0123456789abcdef\"\n"));
  EXPECT_EQ(t.opt.context_sentences, 2);
  EXPECT_EQ(t.opt.items, 7);
  EXPECT_EQ(t.opt.seed, 9u);
  EXPECT_EQ(t.opt.min_chars, NextSentenceOptions{}.min_chars);
  EXPECT_EQ(t.shipped_hash, "0123456789abcdef");
  auto error_of = [&](const std::string& text) {
    try {
      (void)load_next_sentence_task(write("bad.toml", text));
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  std::string e = error_of("items = 0\n");
  EXPECT_NE(e.find("bad.toml: items = 0 is outside 1.."), std::string::npos) << e;
  e = error_of("seed = \"x\"\n");
  EXPECT_NE(e.find("seed must be an integer"), std::string::npos) << e;
  e = error_of("min_chars = 50\nmax_chars = 10\n");
  EXPECT_NE(e.find("min_chars must be <= max_chars"), std::string::npos) << e;
  e = error_of("items = [\n");
  EXPECT_NE(e.find("bad.toml"), std::string::npos) << e;
  // The shipped file loads, with a hash.
  EXPECT_EQ(load_next_sentence_task(fs::path(FP4_SOURCE_DIR) / "configs/tasks/next-sentence.toml").shipped_hash.size(), 16u);
  fs::remove_all(dir);
}

}  // namespace
