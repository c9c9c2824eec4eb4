// The minimal-pair tasks (include/fp4/eval/minimal_pairs.h; docs/evaluation.md "Minimal pairs:
// `eval --task minimal-pairs`"): items from the held-out documents, one generator per
// paradigm, their rows, and their credit under an inference policy.
#include "fp4/eval/minimal_pairs.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <toml++/toml.h>

#include "fp4/base/error.h"
#include "fp4/eval/tasks.h"

namespace fp4 {
namespace {

bool is_lower_word(std::string_view w) {
  return !w.empty() && std::all_of(w.begin(), w.end(), [](char c) { return c >= 'a' && c <= 'z'; });
}
bool is_letter_word(std::string_view w) {
  return !w.empty() && std::all_of(w.begin(), w.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  });
}
std::string lower(std::string_view w) {
  std::string s(w);
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  return s;
}
bool is_ascii_punct(char c) {
  const unsigned char u = static_cast<unsigned char>(c);
  return u < 0x80 && !std::isalnum(u) && !std::isspace(u);
}

std::vector<std::string> split_words(std::string_view s) {
  std::vector<std::string> w;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    size_t j = i;
    while (j < s.size() && !std::isspace(static_cast<unsigned char>(s[j]))) ++j;
    if (j > i) w.emplace_back(s.substr(i, j - i));
    i = j;
  }
  return w;
}
std::string join(const std::vector<std::string>& w) {
  std::string s;
  for (const auto& x : w) s += (s.empty() ? "" : " ") + x;
  return s;
}

// Function words: never cloze targets or distractors (the task asks for content words).
const std::set<std::string_view>& function_words() {
  static const std::set<std::string_view> k = {
      "is",        "am",        "i",       "me",      "my",      "we",       "us",
      "he",        "it",        "his",     "our",     "the",     "and",      "for",
      "are",       "but",       "not",     "you",     "all",     "any",      "can",
      "had",       "her",       "was",     "one",     "our",     "out",      "has",
      "him",       "his",       "how",     "its",     "may",     "who",      "did",
      "yet",       "nor",       "she",     "they",    "them",    "their",    "there",
      "these",     "those",     "this",    "that",    "than",    "then",     "with",
      "from",      "into",      "onto",    "upon",    "have",    "been",     "were",
      "will",      "would",     "could",   "should",  "shall",   "might",    "must",
      "what",      "when",      "where",   "which",   "while",   "whom",     "whose",
      "why",       "also",      "about",   "above",   "after",   "again",    "against",
      "because",   "before",    "being",   "below",   "between", "both",     "during",
      "each",      "every",     "few",     "further", "here",    "more",     "most",
      "much",      "many",      "other",   "some",    "such",    "only",     "own",
      "same",      "very",      "just",    "over",    "under",   "until",    "through",
      "does",      "doing",     "having",  "itself",  "himself", "herself",  "themselves",
      "ourselves", "yourself",  "myself",  "your",    "mine",    "ours",     "hers",
      "theirs",    "either",    "neither", "whether", "though",  "although", "since",
      "unless",    "within",    "without", "among",   "toward",  "towards",  "across",
      "along",     "around",    "behind",  "beyond",  "per",     "via",      "let",
      "got",       "get",       "too",     "now",     "well",    "even",     "ever",
      "never",     "still",     "already", "perhaps", "rather",  "quite",    "thus",
      "hence",     "therefore", "however", "shall"};
  return k;
}

// The singular form s with plural_of(s) == p that the word list holds, or "" (also for a
// function word: "its", "his", "more" are not plurals).
std::string singular_in(std::string_view p, const std::map<std::string, int64_t>& wc) {
  if (function_words().count(p)) return "";
  std::vector<std::string> cands;
  static const std::map<std::string_view, std::string_view> irregular = {
      {"men", "man"},   {"women", "woman"}, {"children", "child"}, {"people", "person"},
      {"feet", "foot"}, {"teeth", "tooth"}, {"mice", "mouse"}};
  if (auto it = irregular.find(p); it != irregular.end()) cands.emplace_back(it->second);
  if (p.size() > 3 && p.substr(p.size() - 3) == "ies")
    cands.push_back(std::string(p.substr(0, p.size() - 3)) + "y");
  if (p.size() > 2 && p.substr(p.size() - 2) == "es") cands.emplace_back(p.substr(0, p.size() - 2));
  if (p.size() > 1 && p.back() == 's') cands.emplace_back(p.substr(0, p.size() - 1));
  for (const auto& s : cands)
    if (!s.empty() && plural_of(s) == p && wc.count(s)) return s;
  return "";
}
// The plural the word list holds of singular s (s not ending in 's', itself listed), or "".
std::string plural_in(std::string_view s, const std::map<std::string, int64_t>& wc) {
  if (s.empty() || s.back() == 's' || function_words().count(s) || !wc.count(std::string(s)))
    return "";
  std::string p = plural_of(s);
  return wc.count(p) ? p : "";
}

struct Sentence {
  size_t doc;
  int index;
  std::vector<std::string> words;
};
struct Place {
  size_t sent;    // into the sentence list
  int pos;        // word position
  int group = 0;  // the word pair altered (subj-verb: is/are 0, was/were 1, has/have 2)
  int side = 0;   // which word of the pair the original has (drawn equally within a group)
};

// det-noun flips this ↔ these only: one token each, so the copy has as many tokens as
// the sentence. (that/those: "that" is also a conjunction, "said that men ..." and "those
// stand out" are grammatical; each/all: "all year" is.)
const std::map<std::string_view, std::string_view> kDetFlip = {{"this", "these"},
                                                               {"these", "this"}};
// subj-verb: the verbs flipped, the singular ones, the pronouns of known number and the
// group of each verb's pair (is/are 0, was/were 1, has/have 2).
const std::map<std::string_view, std::string_view> kVerbFlip = {{"is", "are"},   {"are", "is"},
                                                                {"was", "were"}, {"were", "was"},
                                                                {"has", "have"}, {"have", "has"}};
const std::set<std::string_view> kSingVerb = {"is", "was", "has"};
const std::set<std::string_view> kSingPron = {"he", "she", "it"}, kPlurPron = {"they", "we"};
const std::map<std::string_view, int> kVerbPair = {{"is", 0},   {"are", 0}, {"was", 1},
                                                   {"were", 1}, {"has", 2}, {"have", 2}};

// The noun after a determiner, when it ends the noun phrase: its token (w[j]) is a lower-case
// word with at most trailing punctuation (*core and *tail), and punctuation, the sentence's
// end or a function word follows it ("these men had", "each year,"), not a word it could
// modify ("this original capsule" has no place: "original" is an adjective there).
bool phrase_noun(const std::vector<std::string>& w, size_t j, std::string* core,
                 std::string* tail) {
  const std::string& t = w[j];
  size_t e = t.size();
  while (e > 0 && is_ascii_punct(t[e - 1])) --e;
  *core = t.substr(0, e), *tail = t.substr(e);
  if (!is_lower_word(*core)) return false;
  if (!tail->empty() || j + 1 == w.size()) return true;
  const std::string nx = lower(w[j + 1]);
  size_t b = 0, f = nx.size();
  while (b < f && is_ascii_punct(nx[b])) ++b;
  while (f > b && is_ascii_punct(nx[f - 1])) --f;
  return function_words().count(std::string_view(nx).substr(b, f - b)) > 0;
}

}  // namespace

std::string plural_of(std::string_view s) {
  static const std::map<std::string_view, std::string_view> irregular = {
      {"man", "men"},   {"woman", "women"}, {"child", "children"}, {"person", "people"},
      {"foot", "feet"}, {"tooth", "teeth"}, {"mouse", "mice"}};
  if (auto it = irregular.find(s); it != irregular.end()) return std::string(it->second);
  std::string w(s);
  auto ends = [&](std::string_view e) {
    return w.size() >= e.size() && w.compare(w.size() - e.size(), e.size(), e) == 0;
  };
  if (ends("s") || ends("x") || ends("z") || ends("ch") || ends("sh")) return w + "es";
  if (w.size() >= 2 && w.back() == 'y' &&
      std::string_view("aeiou").find(w[w.size() - 2]) == std::string_view::npos)
    return w.substr(0, w.size() - 1) + "ies";
  return w + "s";
}

std::map<std::string, int64_t> training_word_counts(const CorpusSplit& split) {
  std::map<std::string, int64_t> wc;
  for (const auto& doc : split.train_docs)
    for (const std::string& raw : split_words(doc)) {
      size_t a = 0, b = raw.size();
      while (a < b && is_ascii_punct(raw[a])) ++a;
      while (b > a && is_ascii_punct(raw[b - 1])) --b;
      const std::string_view core(raw.data() + a, b - a);
      if (is_lower_word(core)) ++wc[std::string(core)];  // "Ohio", "Wes": never lower-case nouns
    }
  return wc;
}

namespace {

// The held-out sentences of acceptable size (min_words..max_words words, at most max_bytes
// bytes joined), in (document, sentence) order; a sentence's index counts every sentence of
// its document.
std::vector<Sentence> heldout_sentences(const CorpusSplit& split, const MinimalPairOptions& o) {
  std::vector<Sentence> sents;
  for (size_t d = 0; d < split.heldout_docs.size(); ++d) {
    int index = 0;
    const std::string& text = split.heldout_docs[d];
    size_t p = 0;
    while (p <= text.size()) {
      size_t e = text.find('\n', p);
      if (e == std::string::npos) e = text.size();
      for (const std::string& s : split_sentences(std::string_view(text).substr(p, e - p))) {
        std::vector<std::string> w = split_words(s);
        const std::string j = join(w);
        if (int(w.size()) >= o.min_words && int(w.size()) <= o.max_words &&
            int(j.size()) <= o.max_bytes)
          sents.push_back({d, index, std::move(w)});
        ++index;
      }
      p = e + 1;
    }
  }
  return sents;
}

// The cloze words: frequent content words (lower-case in training, at least cloze_min_count
// times, not function words), ranked by (count, word) within each length class.
class ClozeWords {
 public:
  ClozeWords(const std::map<std::string, int64_t>& wc, int min_count)
      : wc_(wc), min_count_(min_count) {
    std::vector<std::pair<int64_t, std::string>> by_count;  // content words by (count, word)
    for (const auto& [w, n] : wc)
      if (content(w)) by_count.push_back({n, w});
    std::sort(by_count.begin(), by_count.end());
    // Per target length L: the content words of length L − 1 .. L + 1 in (count, word)
    // order, and each one's rank there.
    for (const auto& c : by_count) {
      const size_t L = c.second.size();
      if (by_len_.count(L)) continue;
      auto& v = by_len_[L];
      for (const auto& d : by_count)
        if (d.second.size() + 1 >= L && d.second.size() <= L + 1) v.push_back(d);
      for (size_t k = 0; k < v.size(); ++k) rank_in_len_[L][v[k].second] = k;
    }
  }
  bool content(const std::string& w) const {
    if (!is_lower_word(w) || w.size() < 3 || function_words().count(w)) return false;
    auto it = wc_.find(w);
    return it != wc_.end() && it->second >= min_count_;
  }
  // The length class of a target of w's length: content words within one letter of it.
  const std::vector<std::pair<int64_t, std::string>>& ranked(const std::string& w) const {
    return by_len_.at(w.size());
  }
  // [first, last): the ranks of the words of w's length class with w's count.
  std::pair<size_t, size_t> same_count_range(const std::string& w) const {
    const auto& v = ranked(w);
    const int64_t n = wc_.at(w);
    size_t a = rank_in_len_.at(w.size()).at(w), b = a + 1;
    while (a > 0 && v[a - 1].first == n) --a;
    while (b < v.size() && v[b].first == n) ++b;
    return {a, b};
  }
  // A cloze target needs kClozeNeighbours words of a smaller count and as many of a larger
  // one in its length class (distractors never tie with it in count).
  bool target(const std::string& w) const {
    if (!content(w)) return false;
    const auto [a, b] = same_count_range(w);
    return a >= kClozeNeighbours && b + kClozeNeighbours <= ranked(w).size();
  }

 private:
  const std::map<std::string, int64_t>& wc_;
  int min_count_;
  std::map<size_t, std::vector<std::pair<int64_t, std::string>>> by_len_;
  std::map<size_t, std::map<std::string, size_t>> rank_in_len_;
};

// What every paradigm's generator reads (the training word counts, the held-out sentences,
// the cloze words) and the one splitmix64 draw stream of the whole item set.
struct ItemSource {
  ItemSource(const CorpusSplit& s, const MinimalPairOptions& opt)
      : split(s),
        o(opt),
        wc(training_word_counts(s)),
        sents(heldout_sentences(s, opt)),
        cloze(wc, opt.cloze_min_count) {}
  const CorpusSplit& split;
  const MinimalPairOptions& o;
  const std::map<std::string, int64_t> wc;
  const std::vector<Sentence> sents;
  const ClozeWords cloze;
  uint64_t draw = 0;

  ItemSource(const ItemSource&) = delete;
  ItemSource& operator=(const ItemSource&) = delete;
  uint64_t uniform(uint64_t n) { return splitmix64(o.seed, draw++) % n; }
  // An item of `paradigm` at place p, its first choice the original sentence.
  MinimalPairItem item(std::string_view paradigm, const Place& p) const {
    const Sentence& s = sents[p.sent];
    MinimalPairItem it;
    it.paradigm = std::string(paradigm);
    it.doc = split.heldout_names[s.doc];
    it.sentence = s.index;
    it.choices.push_back(join(s.words));
    return it;
  }
};

// Every place in (sentence, position) order where at(words, i, &place) holds; `at` sets the
// place's group and side.
template <class At>
std::vector<Place> places_where(const ItemSource& src, At at) {
  std::vector<Place> places;
  for (size_t si = 0; si < src.sents.size(); ++si) {
    const auto& w = src.sents[si].words;
    for (int i = 0; i < int(w.size()); ++i) {
      Place p{si, i};
      if (at(w, size_t(i), &p)) places.push_back(p);
    }
  }
  return places;
}

// The places an item is made at, in (sentence, position) order: the places shuffled, then
// round robin over the groups; within a group, alternately a place of each of `sides` sides
// (the original's word of the pair), in shuffled order, one place per sentence; a group
// closes when the side whose turn it is has no place left, so its sides differ by at most
// one item and a model that knows only which word of a pair is more frequent ("was" over
// "were", "a" over "an") scores chance on it.
std::vector<Place> choose_places(ItemSource& src, std::string_view paradigm,
                                 std::vector<Place> places, int sides) {
  if (places.empty())
    throw UserError("minimal-pairs: the held-out split has no place for the " +
                    std::string(paradigm) +
                    " paradigm (too small a corpus, or not English "
                    "text; the task file's min_words, max_words, max_bytes and, for cloze, "
                    "cloze_min_count say where it may look)");
  for (size_t i = places.size(); i > 1; --i) std::swap(places[i - 1], places[src.uniform(i)]);
  int groups = 1;
  for (const Place& p : places) groups = std::max(groups, p.group + 1);
  const std::vector<std::vector<Place>> one_group(static_cast<size_t>(sides));
  std::vector<std::vector<std::vector<Place>>> by(static_cast<size_t>(groups), one_group);
  for (const Place& p : places) by[size_t(p.group)][size_t(p.side)].push_back(p);
  const std::vector<size_t> zeros(static_cast<size_t>(sides), 0);
  std::vector<std::vector<size_t>> next(static_cast<size_t>(groups), zeros);
  std::vector<int> turn(size_t(groups), 0);
  std::vector<bool> closed(size_t(groups), false);
  std::vector<Place> chosen;
  std::set<size_t> used;
  for (bool any = true; any && int(chosen.size()) < src.o.items;) {
    any = false;
    for (int g = 0; g < groups && int(chosen.size()) < src.o.items; ++g) {
      if (closed[size_t(g)]) continue;
      const int sd = turn[size_t(g)];
      auto& q = by[size_t(g)][size_t(sd)];
      size_t& j = next[size_t(g)][size_t(sd)];
      while (j < q.size() && used.count(q[j].sent)) ++j;
      if (j == q.size()) {
        closed[size_t(g)] = true;
        continue;
      }
      used.insert(q[j].sent);
      chosen.push_back(q[j++]);
      turn[size_t(g)] = (sd + 1) % sides;
      any = true;
    }
  }
  if (chosen.empty())
    throw UserError("minimal-pairs: the held-out split has no place for one form of the " +
                    std::string(paradigm) +
                    " paradigm (too small a corpus; the task file's "
                    "min_words, max_words and max_bytes say which sentences are used)");
  std::sort(chosen.begin(), chosen.end(), [](const Place& a, const Place& b) {
    return a.sent != b.sent ? a.sent < b.sent : a.pos < b.pos;
  });
  return chosen;
}

// The item at p whose altered copy is w, described by `change`.
MinimalPairItem altered_item(const ItemSource& src, std::string_view paradigm, const Place& p,
                             const std::vector<std::string>& w, std::string change) {
  MinimalPairItem it = src.item(paradigm, p);
  it.change = std::move(change);
  it.choices.push_back(join(w));
  return it;
}

// swap: two adjacent different lower-case words exchanged.
std::vector<MinimalPairItem> swap_items(ItemSource& src) {
  const std::vector<Place> places = places_where(src, [](const auto& w, size_t i, Place*) {
    return i + 1 < w.size() && is_lower_word(w[i]) && is_lower_word(w[i + 1]) && w[i] != w[i + 1];
  });
  std::vector<MinimalPairItem> items;
  for (const Place& p : choose_places(src, "swap", places, 1)) {
    std::vector<std::string> w = src.sents[p.sent].words;
    const size_t i = size_t(p.pos);
    std::swap(w[i], w[i + 1]);
    items.push_back(
        altered_item(src, "swap", p, w, "swap " + std::to_string(i) + "," + std::to_string(i + 1)));
  }
  return items;
}

// shuffle: a uniform permutation of a sentence of at least two different words that changes
// the text (redrawn until it does).
std::vector<MinimalPairItem> shuffle_items(ItemSource& src) {
  std::vector<Place> places;
  for (size_t si = 0; si < src.sents.size(); ++si) {
    const auto& w = src.sents[si].words;
    if (std::set<std::string>(w.begin(), w.end()).size() >= 2) places.push_back({si, 0});
  }
  std::vector<MinimalPairItem> items;
  for (const Place& p : choose_places(src, "shuffle", places, 1)) {
    const std::vector<std::string>& s = src.sents[p.sent].words;
    std::vector<std::string> w;
    do {
      w = s;
      for (size_t k = w.size(); k > 1; --k) std::swap(w[k - 1], w[src.uniform(k)]);
    } while (w == s);
    items.push_back(altered_item(src, "shuffle", p, w, "shuffle"));
  }
  return items;
}

// det-noun: this ↔ these before a noun that ends the noun phrase, where the original agrees
// ("this" before a noun whose plural is listed, "these" before one whose singular is); the
// two sides are "this" and "these".
std::vector<MinimalPairItem> det_noun_items(ItemSource& src) {
  const std::vector<Place> places = places_where(src, [&](const auto& w, size_t i, Place* p) {
    const std::string lw = lower(w[i]);
    std::string nn, tail;
    if (!(i + 1 < w.size() && is_letter_word(w[i]) && kDetFlip.count(lw) &&
          phrase_noun(w, i + 1, &nn, &tail)))
      return false;
    const bool sing = lw == "this";
    p->side = sing ? 0 : 1;
    return sing ? !plural_in(nn, src.wc).empty() : !singular_in(nn, src.wc).empty();
  });
  std::vector<MinimalPairItem> items;
  for (const Place& p : choose_places(src, "det-noun", places, 2)) {
    std::vector<std::string> w = src.sents[p.sent].words;
    const size_t i = size_t(p.pos);
    std::string f(kDetFlip.at(lower(w[i])));
    if (w[i][0] >= 'A' && w[i][0] <= 'Z') f[0] = char(f[0] - 'a' + 'A');
    std::string change = w[i] + " -> " + f;
    w[i] = f;
    items.push_back(altered_item(src, "det-noun", p, w, std::move(change)));
  }
  return items;
}

// a-an: the article flipped before a word that starts with a lower-case letter (only its
// first letter matters; punctuation after it is kept); the two sides are "a" and "an".
std::vector<MinimalPairItem> a_an_items(ItemSource& src) {
  const std::vector<Place> places = places_where(src, [](const auto& w, size_t i, Place* p) {
    const std::string lw = lower(w[i]);
    p->side = lw == "a" ? 0 : 1;
    return i + 1 < w.size() && (lw == "a" || lw == "an") && w[i + 1][0] >= 'a' &&
           w[i + 1][0] <= 'z';
  });
  std::vector<MinimalPairItem> items;
  for (const Place& p : choose_places(src, "a-an", places, 2)) {
    std::vector<std::string> w = src.sents[p.sent].words;
    const size_t i = size_t(p.pos);
    std::string f = lower(w[i]) == "a" ? "an" : "a";
    if (w[i][0] == 'A') f[0] = 'A';
    std::string change = w[i] + " -> " + f;
    w[i] = f;
    items.push_back(altered_item(src, "a-an", p, w, std::move(change)));
  }
  return items;
}

// The number of a subject word: +1 singular (he, she, it; a noun whose plural is listed),
// -1 plural (they, we; a noun whose singular is), 0 unknown.
int subject_number(const std::string& word, const std::map<std::string, int64_t>& wc) {
  const std::string lw = lower(word);
  if (kSingPron.count(lw)) return 1;
  if (kPlurPron.count(lw)) return -1;
  if (is_lower_word(word)) {
    if (!plural_in(word, wc).empty()) return 1;
    if (!singular_in(word, wc).empty()) return -1;
  }
  return 0;
}

// subj-verb: is/are, was/were, has/have flipped after a subject of known number that agrees
// with it; the groups are the three pairs, the sides their singular and plural verb.
std::vector<MinimalPairItem> subj_verb_items(ItemSource& src) {
  const std::vector<Place> places = places_where(src, [&](const auto& w, size_t i, Place* p) {
    if (!(i + 1 < w.size() && is_letter_word(w[i]) && kVerbFlip.count(w[i + 1]))) return false;
    const bool sing_verb = kSingVerb.count(w[i + 1]) > 0;
    const int number = subject_number(w[i], src.wc);
    p->group = kVerbPair.at(w[i + 1]);
    p->side = sing_verb ? 0 : 1;
    return number != 0 && (number == 1) == sing_verb;
  });
  std::vector<MinimalPairItem> items;
  for (const Place& p : choose_places(src, "subj-verb", places, 2)) {
    std::vector<std::string> w = src.sents[p.sent].words;
    const size_t i = size_t(p.pos);
    const std::string other(kVerbFlip.at(w[i + 1]));
    std::string change = w[i + 1] + " -> " + other;
    w[i + 1] = other;
    items.push_back(altered_item(src, "subj-verb", p, w, std::move(change)));
  }
  return items;
}

// n of the kClozeNeighbours ranks nearest the target's count class [first, last), below
// it or above it, drawn without replacement; their words are appended to pick.
void draw_neighbours(ItemSource& src, const std::vector<std::pair<int64_t, std::string>>& ranked,
                     std::pair<size_t, size_t> range, size_t n, bool below,
                     std::vector<const std::string*>* pick) {
  const auto [first, last] = range;
  std::vector<size_t> pool;  // the kClozeNeighbours nearest with a smaller / larger count
  for (size_t k = 1; k <= kClozeNeighbours; ++k) pool.push_back(below ? first - k : last + k - 1);
  for (size_t k = 0; k < n; ++k) {
    std::swap(pool[k], pool[k + size_t(src.uniform(pool.size() - k))]);
    pick->push_back(&ranked[pool[k]].second);
  }
}

// The 3 cloze distractors of `target`: among the content words within one letter of the
// target's length (BPE token counts follow length, and an untrained model prefers fewer
// tokens), ranked by (count, word): r of the kClozeNeighbours just below the target's count
// and 3 − r of those just above it (never the same count), r uniform in 0..3, so the target
// is the most frequent of the four with probability 1/4 and a model that knows only
// frequency scores chance.
std::vector<const std::string*> cloze_distractors(ItemSource& src, const std::string& target) {
  const auto& ranked = src.cloze.ranked(target);
  const std::pair<size_t, size_t> range = src.cloze.same_count_range(target);
  const size_t r = size_t(src.uniform(4));
  std::vector<const std::string*> pick;
  draw_neighbours(src, ranked, range, r, /*below=*/true, &pick);
  draw_neighbours(src, ranked, range, 3 - r, /*below=*/false, &pick);
  return pick;
}

// cloze: a content word (not the sentence's first) against 3 words of about its frequency
// and length; 4 choices.
std::vector<MinimalPairItem> cloze_items(ItemSource& src) {
  const std::vector<Place> places = places_where(
      src, [&](const auto& w, size_t i, Place*) { return i > 0 && src.cloze.target(w[i]); });
  std::vector<MinimalPairItem> items;
  for (const Place& p : choose_places(src, "cloze", places, 1)) {
    const std::vector<std::string>& s = src.sents[p.sent].words;
    const size_t i = size_t(p.pos);
    MinimalPairItem it = src.item("cloze", p);
    it.change = s[i] + " ->";
    for (const std::string* d : cloze_distractors(src, s[i])) {
      std::vector<std::string> v = s;
      v[i] = *d;
      it.choices.push_back(join(v));
      it.change += " " + *d;
    }
    items.push_back(std::move(it));
  }
  return items;
}

}  // namespace

std::vector<MinimalPairItem> make_minimal_pair_items(const CorpusSplit& split,
                                                     const MinimalPairOptions& o) {
  if (o.items < 1 || o.min_words < 2 || o.min_words > o.max_words || o.max_bytes < 1 ||
      o.cloze_min_count < 1)
    throw std::invalid_argument("make_minimal_pair_items: options out of range");
  using Generator = std::vector<MinimalPairItem> (*)(ItemSource&);
  static const std::map<std::string_view, Generator> kGenerators = {
      {"swap", swap_items}, {"shuffle", shuffle_items},     {"det-noun", det_noun_items},
      {"a-an", a_an_items}, {"subj-verb", subj_verb_items}, {"cloze", cloze_items}};
  ItemSource src(split, o);
  std::vector<MinimalPairItem> items;
  for (const std::string_view paradigm : kMinimalPairParadigms) {
    std::vector<MinimalPairItem> more = kGenerators.at(paradigm)(src);
    items.insert(items.end(), std::make_move_iterator(more.begin()),
                 std::make_move_iterator(more.end()));
  }
  return items;
}

std::string minimal_pair_items_jsonl(const std::vector<MinimalPairItem>& items) {
  std::string out;
  for (const auto& it : items) {
    const nlohmann::json j = {{"paradigm", it.paradigm},
                              {"doc", it.doc},
                              {"sentence", it.sentence},
                              {"choices", it.choices},
                              {"change", it.change}};
    out += j.dump() + "\n";
  }
  return out;
}

MinimalPairTask load_minimal_pair_task(const std::filesystem::path& file) {
  MinimalPairTask t;
  t.path = file;
  toml::table tb;
  try {
    tb = toml::parse_file(file.string());
  } catch (const toml::parse_error& e) {
    throw UserError(file.string() + ": " + std::string(e.description()));
  }
  for (const auto& [k, v] : tb) {
    static const std::set<std::string_view> known = {
        "items", "seed", "min_words", "max_words", "max_bytes", "cloze_min_count", "fnv1a64"};
    if (!known.count(k.str()))
      throw UserError(file.string() + ": unknown key '" + std::string(k.str()) + "'");
  }
  auto get_int = [&](const char* k, int& v, int lo, int hi) {
    if (auto x = tb[k].value<int64_t>()) {
      if (*x < lo || *x > hi)
        throw UserError(file.string() + ": " + k + " = " + std::to_string(*x) + " is outside " +
                        std::to_string(lo) + ".." + std::to_string(hi));
      v = int(*x);
    } else if (tb.contains(k)) {
      throw UserError(file.string() + ": " + k + " must be an integer");
    }
  };
  get_int("items", t.opt.items, 1, 1 << 20);
  get_int("min_words", t.opt.min_words, 2, 1000);
  get_int("max_words", t.opt.max_words, 2, 1000);
  get_int("max_bytes", t.opt.max_bytes, 1, 1 << 20);
  get_int("cloze_min_count", t.opt.cloze_min_count, 1, 1 << 30);
  int seed = int(t.opt.seed);
  get_int("seed", seed, 0, 1 << 30);
  t.opt.seed = uint64_t(seed);
  if (t.opt.min_words > t.opt.max_words)
    throw UserError(file.string() + ": min_words must be <= max_words");
  if (tb.contains("fnv1a64") && !tb["fnv1a64"].is_string())
    throw UserError(file.string() + ": fnv1a64 must be a string");
  t.shipped_hash = tb["fnv1a64"].value_or(std::string());
  return t;
}

MinimalPairRows minimal_pair_rows(const std::vector<MinimalPairItem>& items, const Tokenizer& tok,
                                  int max_tokens) {
  MinimalPairRows r;
  size_t longest = 2;
  for (const auto& it : items) {
    std::vector<ScoredSequence> rows;
    bool fits = true;
    for (const auto& c : it.choices) {
      const std::vector<int> ids = tok.encode(c, "a minimal-pairs sentence");
      if (ids.empty())
        throw UserError("minimal-pairs: a sentence encodes to no token: '" + c + "'");
      fits &= int(ids.size()) <= max_tokens;
      std::vector<int32_t> t = {kTokenEos};
      t.insert(t.end(), ids.begin(), ids.end());
      rows.push_back({std::move(t), int(ids.size())});
    }
    r.first_row.push_back(r.seqs.size());
    r.skipped.push_back(!fits);
    if (!fits) continue;
    for (auto& q : rows) {
      longest = std::max(longest, q.tokens.size());
      r.seqs.push_back(std::move(q));
    }
  }
  r.T = std::min(max_tokens, int((longest - 1 + 15) / 16 * 16));
  return r;
}

PairCredit minimal_pair_credit(const std::vector<double>& lp) {
  constexpr double nan = std::numeric_limits<double>::quiet_NaN();
  if (lp.size() < 2) throw std::invalid_argument("minimal_pair_credit: fewer than 2 choices");
  double best_other = -std::numeric_limits<double>::infinity();
  for (double x : lp)
    if (!std::isfinite(x)) return {nan, nan};
  for (size_t k = 1; k < lp.size(); ++k) best_other = std::max(best_other, lp[k]);
  PairCredit c;
  c.margin = lp[0] - best_other;
  if (lp[0] > best_other)
    c.credit = 1;
  else if (lp[0] < best_other)
    c.credit = 0;
  else
    c.credit = 1.0 / double(std::count(lp.begin(), lp.end(), lp[0]));
  return c;
}

MinimalPairScore score_minimal_pairs(nn::Model& model, const std::vector<MinimalPairItem>& items,
                                     const MinimalPairRows& rows, int batch,
                                     const EvalPolicy& policy, const EvalWindows* calib) {
  if (rows.first_row.size() != items.size() || rows.skipped.size() != items.size())
    throw std::invalid_argument("score_minimal_pairs: rows of another item set");
  const std::vector<double> lp = rows.seqs.empty() ? std::vector<double>()
                                                   : continuation_logprobs(model, rows.seqs, rows.T,
                                                                           batch, policy, calib);
  constexpr double nan = std::numeric_limits<double>::quiet_NaN();
  MinimalPairScore sc;
  for (size_t i = 0; i < items.size(); ++i) {
    if (rows.skipped[i]) {
      sc.credit.push_back(nan), sc.margin.push_back(nan);
      continue;
    }
    const size_t k0 = rows.first_row[i];
    const std::vector<double> v(lp.begin() + std::ptrdiff_t(k0),
                                lp.begin() + std::ptrdiff_t(k0 + items[i].choices.size()));
    const PairCredit c = minimal_pair_credit(v);
    sc.finite &= std::isfinite(c.credit);
    sc.credit.push_back(c.credit), sc.margin.push_back(c.margin);
  }
  return sc;
}

std::string format_credits(const std::vector<double>& credit) {
  std::string s;
  for (double c : credit) {
    if (std::isnan(c)) {
      s += '-';
      continue;
    }
    if (c == 1) {
      s += '1';
      continue;
    }
    if (c == 0) {
      s += '0';
      continue;
    }
    const double m = 1.0 / c;
    const long r = std::lround(m);
    if (r < 2 || r > 9 || 1.0 / double(r) != c)
      throw std::invalid_argument("format_credits: credit " + std::to_string(c) +
                                  " is not 0, 1 or 1/m");
    s += char('0' + r);
  }
  return s;
}

std::vector<double> parse_credits(std::string_view s) {
  std::vector<double> v;
  for (char ch : s) {
    if (ch == '-')
      v.push_back(std::numeric_limits<double>::quiet_NaN());
    else if (ch == '0')
      v.push_back(0);
    else if (ch == '1')
      v.push_back(1);
    else if (ch >= '2' && ch <= '9')
      v.push_back(1.0 / double(ch - '0'));
    else
      throw std::invalid_argument(std::string("parse_credits: '") + ch +
                                  "' is not 0, 1, 2..9 or -");
  }
  return v;
}

double mcnemar_exact_p(int64_t b, int64_t c) {
  if (b < 0 || c < 0) throw std::invalid_argument("mcnemar_exact_p: negative count");
  const int64_t n = b + c, k = std::min(b, c);
  if (n == 0) return 1;
  // P[X <= k], X ~ Binomial(n, 1/2), summed in log space.
  double tail = 0;
  for (int64_t i = 0; i <= k; ++i)
    tail += std::exp(std::lgamma(double(n) + 1) - std::lgamma(double(i) + 1) -
                     std::lgamma(double(n - i) + 1) - double(n) * std::log(2.0));
  return std::min(1.0, 2 * tail);
}

}  // namespace fp4
