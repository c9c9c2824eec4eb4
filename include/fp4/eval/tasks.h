// Downstream tasks under quantized inference (docs/evaluation.md "Downstream task: `eval --task
// next-sentence`"): multiple-choice items built from the held-out split only, scored by
// log-likelihood (OLMES's raw and per-character forms).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <filesystem>

#include "fp4/data/data.h"
#include "fp4/eval/eval.h"

namespace fp4 {

/// The sentences of one paragraph (one line of text), in order, trimmed. A sentence ends at
/// '.', '?' or '!' (with any closing '"', '\'' or ')' after it) that is followed by a space
/// and then an uppercase ASCII letter, a digit or an opening '"', '\'' or '(' — unless the
/// word ending in '.' is a single letter (an initial: "J. F. Kennedy") or one of the
/// abbreviations Mr Mrs Ms Dr St Jr Sr Mt Ft Gen Gov Sen Rep Col Lt Capt Sgt Prof Rev Inc Co
/// Corp Ltd No vs Jan Feb Aug Sept Oct Nov Dec (case as written). The paragraph's end also
/// ends a sentence. A rule, not a parser: a few sentences of the Brown corpus are split or
/// joined wrongly by it; the items it makes are still fixed by their hash.
std::vector<std::string> split_sentences(std::string_view paragraph);

/// How the next-sentence items are drawn (defaults: configs/tasks/next-sentence.toml).
struct NextSentenceOptions {
  int context_sentences = 3;  ///< k: sentences of context before the one to predict
  int items = 500;            ///< items drawn (fewer if the held-out split has fewer places)
  uint64_t seed = 1;          ///< splitmix64 seed of every draw
  int min_chars = 20;         ///< a true or distractor sentence has min..max UTF-8 bytes
  int max_chars = 300;
  double length_tolerance = 0.10;  ///< distractors within ±10% (and ±5 bytes) of its length
};

/// One multiple-choice item: `context` (k sentences of one held-out document, in order)
/// and four `choices`, one of them (`answer`, 0-based) the true next sentence, the others
/// length-matched sentences drawn from other held-out documents.
struct NextSentenceItem {
  std::string doc;                   ///< the held-out document's name
  int sentence = 0;                  ///< index of the true next sentence in that document
  std::vector<std::string> context;  ///< k sentences
  std::vector<std::string> choices;  ///< 4 sentences
  int answer = 0;
};

/// The items of `split`'s held-out documents (paragraphs are its lines; split_sentences
/// splits them; a document's sentences run on across its paragraphs). Places: every
/// sentence i ≥ k of a document whose length is in [min_chars, max_chars]. The seeded
/// shuffle (Fisher–Yates with splitmix64(seed, ·)) of all places gives the first `items`,
/// sorted back into (document, sentence) order. Each draws 3 distractors uniformly from the
/// distinct sentence texts of the other held-out documents within the length tolerance (when
/// fewer than 3 are, the 3 nearest in length), none equal to the true sentence, and the
/// answer's position uniformly in 0..3.
/// Deterministic: the same split and options give the same items. Throws fp4::UserError
/// when the held-out split has no place or fewer than 2 documents, std::invalid_argument on
/// options out of range (k < 1, items < 1, min_chars < 1 or > max_chars, tolerance < 0).
std::vector<NextSentenceItem> make_next_sentence_items(const CorpusSplit& split,
                                                        const NextSentenceOptions& opt);

/// The items as JSON Lines (one object per item: doc, sentence, context, choices, answer;
/// keys sorted, UTF-8, no spaces), the canonical text their hash is taken of.
std::string next_sentence_items_jsonl(const std::vector<NextSentenceItem>& items);

/// FNV-1a, 64 bits, of `bytes` (offset basis 0xcbf29ce484222325, prime 0x100000001b3), as 16
/// lowercase hex digits: an identity check for shipped item sets, not a cryptographic hash.
std::string fnv1a64_hex(std::string_view bytes);

/// The task file (configs/tasks/next-sentence.toml): the draw options (keys
/// context_sentences, items, min_chars, max_chars, seed, length_tolerance; absent keys keep
/// NextSentenceOptions' defaults) and fnv1a64, the hash of the items the default corpus
/// gives (the shipped set).
struct NextSentenceTask {
  NextSentenceOptions opt;
  std::string shipped_hash;  ///< "" when the file has none
  std::filesystem::path path;
};
/// Read the task file. Throws fp4::UserError naming the file and key for malformed TOML, a
/// non-integer or out-of-range value, min_chars > max_chars or a negative length_tolerance.
NextSentenceTask load_next_sentence_task(const std::filesystem::path& file);

/// The rows to score: for every item, one row per choice (4 per item, in order): EOS, the
/// context sentences joined by spaces, then the choice, all encoded with `tok`; the context
/// is cut from the left to fit seq_len + 1 tokens, and a choice longer than seq_len tokens is
/// cut to its first seq_len (counted in `truncated`). `chars[k]` is row k's choice length in
/// UTF-8 code points (at least 1), the per-character normaliser (OLMES). Throws
/// fp4::UserError for a choice that encodes to no token.
struct NextSentenceRows {
  std::vector<ScoredSequence> seqs;
  std::vector<int64_t> chars;
  int64_t truncated = 0;
};
NextSentenceRows next_sentence_rows(const std::vector<NextSentenceItem>& items, const Tokenizer& tok,
                                    int seq_len);

/// The task under one inference policy: per item, 1 if the choice with the highest
/// log-likelihood (continuation_logprobs of its row) is the answer, else 0 (`raw`; ties go to
/// the lower index), and the same with each log-likelihood divided by the choice's
/// characters (`per_char`). `finite` is false when any score is not finite (the accuracies
/// then mean nothing). Throws what continuation_logprobs throws.
struct NextSentenceScore {
  bool finite = true;
  std::vector<double> raw, per_char;  ///< [items], 0 or 1
};
NextSentenceScore score_next_sentence(nn::Model& model, const std::vector<NextSentenceItem>& items,
                                      const NextSentenceRows& rows, int seq_len, int batch,
                                      const EvalPolicy& policy, const EvalWindows* calib = nullptr);

}  // namespace fp4
