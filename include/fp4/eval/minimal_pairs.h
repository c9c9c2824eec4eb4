// Minimal-pair tasks under quantized inference (docs/evaluation.md "Minimal pairs: `eval --task
// minimal-pairs`"): BLiMP-style items (Warstadt et al., arXiv 1912.00582) drawn from the
// held-out split only. Each item is a sentence of a held-out document and one or more altered
// copies of it; the model is right when it gives the corpus's sentence the highest total
// log-probability. Unlike next-sentence, a model of the study's size passes these: they need
// local word order and agreement, not discourse.
#pragma once
#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "fp4/data/data.h"
#include "fp4/eval/eval.h"

namespace fp4 {

/// The paradigms, in the order items are drawn and reported:
///  - `swap`: two adjacent plain words exchanged (2 choices);
///  - `shuffle`: every word of the sentence permuted (2 choices);
///  - `det-noun`: this ↔ these before a noun, only where the original agrees (the noun's
///    other number is in the training split's word list: singular after "this", plural after
///    "these") and the noun ends the noun phrase (punctuation, the sentence's end or a
///    function word follows it, so that an adjective is not taken for the noun). The
///    determiner is flipped, not the noun, so the two sentences have as many tokens; that ↔
///    those and each ↔ all are not used ("said that men ...", "those stand out", "all year"
///    are grammatical) (2 choices);
///  - `a-an`: the indefinite article exchanged, a ↔ an, before a word that starts with a
///    lower-case ASCII letter (2 choices);
///  - `subj-verb`: the verb after an adjacent subject of known number changed to the other
///    number (is/are, was/were, has/have; subjects he/she/it, they/we, or a noun whose other
///    number is in the word list), only where the original agrees (2 choices);
///  - `cloze`: a frequent content word replaced by 3 words near it in frequency: among the
///    content words within one letter of its length, ranked by (training count, word), r of
///    the kClozeNeighbours just below its count and 3 − r of those just above it (never of
///    its count), with r uniform in 0..3, so the target is the most frequent of the four with
///    probability 1/4; a target needs kClozeNeighbours such words on each side (4 choices).
/// A noun is never a function word or pronoun ("its", "his", "more", "still" are not nouns).
inline constexpr std::array<std::string_view, 6> kMinimalPairParadigms = {
    "swap", "shuffle", "det-noun", "a-an", "subj-verb", "cloze"};
/// A cloze item's distractors come from this many frequency-rank neighbours on each side.
inline constexpr size_t kClozeNeighbours = 4;

/// How the items are drawn (defaults: configs/tasks/minimal-pairs.toml).
struct MinimalPairOptions {
  int items = 300;          ///< per paradigm (fewer where the held-out split has fewer places)
  uint64_t seed = 1;        ///< splitmix64 seed of every draw
  int min_words = 4;        ///< a sentence has min_words..max_words words (split at spaces)
  int max_words = 30;
  int max_bytes = 200;      ///< and at most this many UTF-8 bytes
  int cloze_min_count = 20; ///< a cloze target or distractor occurs ≥ this often in training
};

/// One item: `choices[0]` is the held-out sentence (words joined by single spaces), the
/// others its altered copies (1 for the two-choice paradigms, 3 for cloze). `change` says
/// what was altered ("books -> book", "swap 3,4", ...), for readers of the items file.
struct MinimalPairItem {
  std::string paradigm;
  std::string doc;       ///< the held-out document's name
  int sentence = 0;      ///< index of the sentence in the document (split_sentences, in order)
  std::vector<std::string> choices;
  std::string change;
};

/// Word counts of the training split: every whitespace-separated word, stripped of leading
/// and trailing ASCII punctuation, counted when it is made of lower-case ASCII letters only
/// (so a capitalised name, "Ohio", is not a cloze word, and "Wes" does not make "we" a
/// noun). The list the agreement flips and the cloze frequencies are taken from.
std::map<std::string, int64_t> training_word_counts(const CorpusSplit& split);

/// The regular English plural of a lower-case word: +es after s, x, z, ch, sh; y → ies after
/// a consonant; +s otherwise; and man/men, woman/women, child/children, person/people,
/// foot/feet, tooth/teeth, mouse/mice. Used only where the word list holds both forms.
std::string plural_of(std::string_view singular);

/// The items of `split`'s held-out documents (paragraphs are its lines; split_sentences
/// splits them). For each paradigm in kMinimalPairParadigms order, every place (sentence and
/// word position) where it applies is collected in (document, sentence, position) order; a
/// seeded Fisher–Yates shuffle (splitmix64(seed, draw++), one stream for the whole set)
/// orders them, and the first place of each not-yet-used sentence is taken until `items`
/// are. det-noun, a-an and subj-verb take their places in turns: round robin over the word
/// pairs altered (subj-verb: is/are, was/were, has/have), and within a pair alternately an
/// original with each word, a pair closing when the word whose turn it is has no place left;
/// so the two words of a pair differ by at most one item, and a model that knows only which
/// word is more frequent scores chance. The chosen places are sorted back into
/// (document, sentence) order before the altered
/// copies (shuffle permutations, cloze distractors) are drawn. Deterministic: the same split
/// and options give the same items. Throws fp4::UserError when a paradigm has no place in
/// the held-out split (the corpus is too small or not English), std::invalid_argument on
/// options out of range.
std::vector<MinimalPairItem> make_minimal_pair_items(const CorpusSplit& split,
                                                     const MinimalPairOptions& opt);

/// The items as JSON Lines (paradigm, doc, sentence, choices, change; keys sorted, no
/// spaces): the canonical text their FNV-1a 64 hash (fnv1a64_hex) is taken of.
std::string minimal_pair_items_jsonl(const std::vector<MinimalPairItem>& items);

/// The task file (configs/tasks/minimal-pairs.toml): MinimalPairOptions' keys (absent keys
/// keep the defaults) and fnv1a64, the hash of the set the default corpus gives.
struct MinimalPairTask {
  MinimalPairOptions opt;
  std::string shipped_hash;
  std::filesystem::path path;
};
/// Read the task file. Throws fp4::UserError naming the file and key for malformed TOML, a
/// non-integer or out-of-range value, or min_words > max_words.
MinimalPairTask load_minimal_pair_task(const std::filesystem::path& file);

/// The rows to score: per item, one row per choice (in order), EOS then the choice's
/// tokens, all of them the continuation. An item with a row longer than max_tokens + 1 ids
/// is left out (`skipped[i]` true, no rows); `first_row[i]` is its first row's index.
/// `T` is the forward length the rows need: the longest row minus 1, rounded up to a
/// multiple of 16, at most max_tokens. Throws fp4::UserError for a choice that encodes to
/// no token.
struct MinimalPairRows {
  std::vector<ScoredSequence> seqs;
  std::vector<size_t> first_row;
  std::vector<bool> skipped;
  int T = 0;
};
MinimalPairRows minimal_pair_rows(const std::vector<MinimalPairItem>& items, const Tokenizer& tok,
                                  int max_tokens);

/// One item's credit and margin from its choices' total log-probabilities lp (lp[0] the
/// corpus sentence): credit 1 when lp[0] is above every other, 0 when one is above it, 1/m
/// when it ties with m − 1 others at the maximum (so a model that scores all choices alike
/// gets chance, not full marks); margin = lp[0] − max of the others (nats). Non-finite
/// scores give credit NaN and margin NaN.
struct PairCredit {
  double credit = 0, margin = 0;
};
PairCredit minimal_pair_credit(const std::vector<double>& lp);

/// The task under one policy: per item, its credit and margin (NaN for a skipped item), from
/// continuation_logprobs over `rows` (forward length rows.T, `batch` rows a forward).
/// `finite` is false when a score of an item that is not skipped is not finite.
struct MinimalPairScore {
  bool finite = true;
  std::vector<double> credit, margin;  ///< [items]
};
MinimalPairScore score_minimal_pairs(nn::Model& model, const std::vector<MinimalPairItem>& items,
                                     const MinimalPairRows& rows, int batch,
                                     const EvalPolicy& policy, const EvalWindows* calib = nullptr);

/// Credits as one character per item, as task files store them: '1' (credit 1), '0'
/// (credit 0), the digit m for a tie 1/m (2..9), '-' for a skipped (NaN) item. Throws
/// std::invalid_argument on a credit it cannot write. parse_credits is the inverse, throwing
/// std::invalid_argument on another character.
std::string format_credits(const std::vector<double>& credit);
std::vector<double> parse_credits(std::string_view s);

/// McNemar's exact test on paired binary outcomes: b items right under A only, c under B
/// only. Two-sided p = min(1, 2 · P[Binomial(b + c, 1/2) ≤ min(b, c)]); 1 when b + c = 0.
double mcnemar_exact_p(int64_t b, int64_t c);

}  // namespace fp4
