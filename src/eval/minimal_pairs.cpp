// The minimal-pair tasks (include/fp4/eval/minimal_pairs.h, issue 23 §1): items from the
// held-out documents, their rows, and their credit under an inference policy.
#include "fp4/eval/minimal_pairs.h"

#include <algorithm>
#include <cmath>
#include <limits>
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
      "is", "am", "i", "me", "my", "we", "us", "he", "it", "his", "our", "the", "and", "for", "are", "but", "not", "you", "all", "any", "can", "had", "her", "was",
      "one", "our", "out", "has", "him", "his", "how", "its", "may", "who", "did", "yet", "nor",
      "she", "they", "them", "their", "there", "these", "those", "this", "that", "than", "then",
      "with", "from", "into", "onto", "upon", "have", "been", "were", "will", "would", "could",
      "should", "shall", "might", "must", "what", "when", "where", "which", "while", "whom",
      "whose", "why", "also", "about", "above", "after", "again", "against", "because", "before",
      "being", "below", "between", "both", "during", "each", "every", "few", "further", "here",
      "more", "most", "much", "many", "other", "some", "such", "only", "own", "same", "very",
      "just", "over", "under", "until", "through", "does", "doing", "having", "itself", "himself",
      "herself", "themselves", "ourselves", "yourself", "myself", "your", "mine", "ours", "hers",
      "theirs", "either", "neither", "whether", "though", "although", "since", "unless", "within",
      "without", "among", "toward", "towards", "across", "along", "around", "behind", "beyond",
      "per", "via", "let", "got", "get", "too", "now", "well", "even", "ever", "never", "still",
      "already", "perhaps", "rather", "quite", "thus", "hence", "therefore", "however", "shall"};
  return k;
}

// The singular form s with plural_of(s) == p that the word list holds, or "" (also for a
// function word: "its", "his", "more" are not plurals).
std::string singular_in(std::string_view p, const std::map<std::string, int64_t>& wc) {
  if (function_words().count(p)) return "";
  std::vector<std::string> cands;
  static const std::map<std::string_view, std::string_view> irregular = {
      {"men", "man"},     {"women", "woman"}, {"children", "child"}, {"people", "person"},
      {"feet", "foot"},   {"teeth", "tooth"}, {"mice", "mouse"}};
  if (auto it = irregular.find(p); it != irregular.end()) cands.emplace_back(it->second);
  if (p.size() > 3 && p.substr(p.size() - 3) == "ies") cands.push_back(std::string(p.substr(0, p.size() - 3)) + "y");
  if (p.size() > 2 && p.substr(p.size() - 2) == "es") cands.emplace_back(p.substr(0, p.size() - 2));
  if (p.size() > 1 && p.back() == 's') cands.emplace_back(p.substr(0, p.size() - 1));
  for (const auto& s : cands)
    if (!s.empty() && plural_of(s) == p && wc.count(s)) return s;
  return "";
}
// The plural the word list holds of singular s (s not ending in 's', itself listed), or "".
std::string plural_in(std::string_view s, const std::map<std::string, int64_t>& wc) {
  if (s.empty() || s.back() == 's' || function_words().count(s) || !wc.count(std::string(s))) return "";
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

}  // namespace

std::string plural_of(std::string_view s) {
  static const std::map<std::string_view, std::string_view> irregular = {
      {"man", "men"},     {"woman", "women"}, {"child", "children"}, {"person", "people"},
      {"foot", "feet"},   {"tooth", "teeth"}, {"mouse", "mice"}};
  if (auto it = irregular.find(s); it != irregular.end()) return std::string(it->second);
  std::string w(s);
  auto ends = [&](std::string_view e) { return w.size() >= e.size() && w.compare(w.size() - e.size(), e.size(), e) == 0; };
  if (ends("s") || ends("x") || ends("z") || ends("ch") || ends("sh")) return w + "es";
  if (w.size() >= 2 && w.back() == 'y' && std::string_view("aeiou").find(w[w.size() - 2]) == std::string_view::npos)
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

std::vector<MinimalPairItem> make_minimal_pair_items(const CorpusSplit& split,
                                                     const MinimalPairOptions& o) {
  if (o.items < 1 || o.min_words < 2 || o.min_words > o.max_words || o.max_bytes < 1 ||
      o.cloze_min_count < 1)
    throw std::invalid_argument("make_minimal_pair_items: options out of range");
  const std::map<std::string, int64_t> wc = training_word_counts(split);
  // The held-out sentences of acceptable size.
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
        if (int(w.size()) >= o.min_words && int(w.size()) <= o.max_words && int(j.size()) <= o.max_bytes)
          sents.push_back({d, index, std::move(w)});
        ++index;
      }
      p = e + 1;
    }
  }
  // Cloze: frequent content words (lower-case in training, at least cloze_min_count times).
  auto content = [&](const std::string& w) {
    if (!is_lower_word(w) || w.size() < 3 || function_words().count(w)) return false;
    auto it = wc.find(w);
    return it != wc.end() && it->second >= o.cloze_min_count;
  };
  std::vector<std::pair<int64_t, std::string>> by_count;  // content words by (count, word)
  for (const auto& [w, n] : wc)
    if (content(w)) by_count.push_back({n, w});
  std::sort(by_count.begin(), by_count.end());
  // Per target length L: the content words of length L − 1 .. L + 1 in (count, word) order,
  // and each one's rank there.
  std::map<size_t, std::vector<std::pair<int64_t, std::string>>> by_len;
  std::map<size_t, std::map<std::string, size_t>> rank_in_len;
  for (const auto& c : by_count) {
    const size_t L = c.second.size();
    if (by_len.count(L)) continue;
    auto& v = by_len[L];
    for (const auto& d : by_count)
      if (d.second.size() + 1 >= L && d.second.size() <= L + 1) v.push_back(d);
    for (size_t k = 0; k < v.size(); ++k) rank_in_len[L][v[k].second] = k;
  }
  // [first, last): the ranks of the words of w's length class with w's count.
  auto same_count_range = [&](const std::string& w) {
    const auto& v = by_len.at(w.size());
    const int64_t n = wc.at(w);
    size_t a = rank_in_len.at(w.size()).at(w), b = a + 1;
    while (a > 0 && v[a - 1].first == n) --a;
    while (b < v.size() && v[b].first == n) ++b;
    return std::pair<size_t, size_t>{a, b};
  };
  // A cloze target needs kClozeNeighbours words of a smaller count and as many of a larger
  // one in its length class (distractors never tie with it in count).
  auto cloze_target = [&](const std::string& w) {
    if (!content(w)) return false;
    const auto [a, b] = same_count_range(w);
    return a >= kClozeNeighbours && b + kClozeNeighbours <= by_len.at(w.size()).size();
  };

  // det-noun flips this ↔ these only: one token each, so the copy has as many tokens as
  // the sentence. (that/those: "that" is also a conjunction, "said that men ..." and "those
  // stand out" are grammatical; each/all: "all year" is.)
  static const std::map<std::string_view, std::string_view> kDetFlip = {{"this", "these"},
                                                                        {"these", "this"}};
  // The noun after a determiner, when it ends the noun phrase: its token is a lower-case word
  // with at most trailing punctuation, and punctuation, the sentence's end or a function word
  // follows it ("these men had", "each year,"), not a word it could modify ("this original
  // capsule" has no place: "original" is an adjective there).
  auto phrase_noun = [&](const std::vector<std::string>& w, size_t j, std::string* core,
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
  };
  static const std::map<std::string_view, std::string_view> kVerbFlip = {
      {"is", "are"}, {"are", "is"}, {"was", "were"}, {"were", "was"}, {"has", "have"}, {"have", "has"}};
  static const std::set<std::string_view> kSingVerb = {"is", "was", "has"};
  static const std::set<std::string_view> kSingPron = {"he", "she", "it"}, kPlurPron = {"they", "we"};

  uint64_t draw = 0;
  auto uniform = [&](uint64_t n) { return splitmix64(o.seed, draw++) % n; };
  std::vector<MinimalPairItem> items;
  for (const std::string_view paradigm : kMinimalPairParadigms) {
    std::vector<Place> places;
    for (size_t si = 0; si < sents.size(); ++si) {
      const auto& w = sents[si].words;
      const int n = int(w.size());
      if (paradigm == "shuffle") {
        if (std::set<std::string>(w.begin(), w.end()).size() >= 2) places.push_back({si, 0});
        continue;
      }
      for (int i = 0; i < n; ++i) {
        const std::string lw = lower(w[size_t(i)]);
        const bool next = i + 1 < n;
        bool ok = false;
        if (paradigm == "swap") {
          ok = next && is_lower_word(w[size_t(i)]) && is_lower_word(w[size_t(i) + 1]) &&
               w[size_t(i)] != w[size_t(i) + 1];
        } else if (paradigm == "det-noun") {
          std::string nn, tail;
          if (next && is_letter_word(w[size_t(i)]) && kDetFlip.count(lw) &&
              phrase_noun(w, size_t(i) + 1, &nn, &tail)) {
            // The original agrees: "this" before a noun whose plural is listed, "these"
            // before a noun whose singular is.
            const bool sing = lw == "this";
            if (sing ? !plural_in(nn, wc).empty() : !singular_in(nn, wc).empty())
              places.push_back({si, i, 0, sing ? 0 : 1});
          }
        } else if (paradigm == "a-an") {
          // The article agrees with the next word's first sound: only its first letter
          // matters here (punctuation after it is kept).
          if (next && (lw == "a" || lw == "an") && w[size_t(i) + 1][0] >= 'a' &&
              w[size_t(i) + 1][0] <= 'z')
            places.push_back({si, i, 0, lw == "a" ? 0 : 1});
        } else if (paradigm == "subj-verb") {
          if (next && is_letter_word(w[size_t(i)]) && kVerbFlip.count(w[size_t(i) + 1])) {
            const bool sing_verb = kSingVerb.count(w[size_t(i) + 1]) > 0;
            int number = 0;  // +1 singular subject, -1 plural, 0 unknown
            if (kSingPron.count(lw)) number = 1;
            else if (kPlurPron.count(lw)) number = -1;
            else if (is_lower_word(w[size_t(i)])) {
              if (!plural_in(w[size_t(i)], wc).empty()) number = 1;
              else if (!singular_in(w[size_t(i)], wc).empty()) number = -1;
            }
            static const std::map<std::string_view, int> kPair = {
                {"is", 0}, {"are", 0}, {"was", 1}, {"were", 1}, {"has", 2}, {"have", 2}};
            if (number != 0 && (number == 1) == sing_verb)
              places.push_back({si, i, kPair.at(w[size_t(i) + 1]), sing_verb ? 0 : 1});
          }
        } else if (paradigm == "cloze") {
          ok = i > 0 && cloze_target(w[size_t(i)]);
        }
        if (ok) places.push_back({si, i});
      }
    }
    if (places.empty())
      throw UserError("minimal-pairs: the held-out split has no place for the " +
                      std::string(paradigm) + " paradigm (too small a corpus, or not English "
                      "text; the task file's min_words, max_words, max_bytes and, for cloze, "
                      "cloze_min_count say where it may look)");
    for (size_t i = places.size(); i > 1; --i) std::swap(places[i - 1], places[uniform(i)]);
    // Round robin over the groups; within a group, alternately a place of each side (the
    // original's word of the pair), in shuffled order, one place per sentence; a group
    // closes when the side whose turn it is has no place left, so its sides differ by at most
    // one item and a model that knows only which word of a pair is more frequent ("was" over
    // "were", "a" over "an") scores chance on it.
    const int sides = (paradigm == "det-noun" || paradigm == "a-an" || paradigm == "subj-verb") ? 2 : 1;
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
    for (bool any = true; any && int(chosen.size()) < o.items;) {
      any = false;
      for (int g = 0; g < groups && int(chosen.size()) < o.items; ++g) {
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
                      std::string(paradigm) + " paradigm (too small a corpus; the task file's "
                      "min_words, max_words and max_bytes say which sentences are used)");
    std::sort(chosen.begin(), chosen.end(), [](const Place& a, const Place& b) {
      return a.sent != b.sent ? a.sent < b.sent : a.pos < b.pos;
    });
    for (const Place& p : chosen) {
      const Sentence& s = sents[p.sent];
      const size_t i = size_t(p.pos);
      MinimalPairItem it;
      it.paradigm = std::string(paradigm);
      it.doc = split.heldout_names[s.doc];
      it.sentence = s.index;
      it.choices.push_back(join(s.words));
      std::vector<std::string> w = s.words;
      if (paradigm == "swap") {
        std::swap(w[i], w[i + 1]);
        it.change = "swap " + std::to_string(i) + "," + std::to_string(i + 1);
      } else if (paradigm == "shuffle") {
        // A uniform permutation that changes the text (redrawn until it does).
        do {
          w = s.words;
          for (size_t k = w.size(); k > 1; --k) std::swap(w[k - 1], w[uniform(k)]);
        } while (w == s.words);
        it.change = "shuffle";
      } else if (paradigm == "det-noun") {
        std::string f(kDetFlip.at(lower(w[i])));
        if (w[i][0] >= 'A' && w[i][0] <= 'Z') f[0] = char(f[0] - 'a' + 'A');
        it.change = w[i] + " -> " + f;
        w[i] = f;
      } else if (paradigm == "a-an") {
        const std::string flip = lower(w[i]) == "a" ? "an" : "a";
        std::string f = flip;
        if (w[i][0] == 'A') f[0] = 'A';
        it.change = w[i] + " -> " + f;
        w[i] = f;
      } else if (paradigm == "subj-verb") {
        const std::string other(kVerbFlip.at(w[i + 1]));
        it.change = w[i + 1] + " -> " + other;
        w[i + 1] = other;
      } else {  // cloze: 3 frequency-rank neighbours, the target's rank among the 4 uniform
        // Among the content words within one letter of the target's length (BPE token counts
        // follow length, and an untrained model prefers fewer tokens), ranked by (count, word):
        // r of the kClozeNeighbours just below the target's count and 3 − r of those just
        // above it (never the same count), r uniform in 0..3, so the target is the most
        // frequent of the four with probability 1/4 and a model that knows only frequency
        // scores chance.
        const auto& ranked = by_len.at(w[i].size());
        const auto [first, last] = same_count_range(w[i]);
        const size_t r = size_t(uniform(4));
        std::vector<const std::string*> pick;
        auto draw_side = [&](size_t n, bool below) {
          std::vector<size_t> pool;  // the kClozeNeighbours nearest with a smaller / larger count
          for (size_t k = 1; k <= kClozeNeighbours; ++k) pool.push_back(below ? first - k : last + k - 1);
          for (size_t k = 0; k < n; ++k) {
            std::swap(pool[k], pool[k + size_t(uniform(pool.size() - k))]);
            pick.push_back(&ranked[pool[k]].second);
          }
        };
        draw_side(r, true);
        draw_side(3 - r, false);
        it.change = w[i] + " ->";
        for (const std::string* d : pick) {
          std::vector<std::string> v = s.words;
          v[i] = *d;
          it.choices.push_back(join(v));
          it.change += " " + *d;
        }
      }
      if (paradigm != "cloze") it.choices.push_back(join(w));
      items.push_back(std::move(it));
    }
  }
  return items;
}

std::string minimal_pair_items_jsonl(const std::vector<MinimalPairItem>& items) {
  std::string out;
  for (const auto& it : items) {
    const nlohmann::json j = {{"paradigm", it.paradigm}, {"doc", it.doc}, {"sentence", it.sentence},
                              {"choices", it.choices},   {"change", it.change}};
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
    static const std::set<std::string_view> known = {"items",     "seed",      "min_words",
                                                     "max_words", "max_bytes", "cloze_min_count",
                                                     "fnv1a64"};
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
      if (ids.empty()) throw UserError("minimal-pairs: a sentence encodes to no token: '" + c + "'");
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
  if (lp[0] > best_other) c.credit = 1;
  else if (lp[0] < best_other) c.credit = 0;
  else c.credit = 1.0 / double(std::count(lp.begin(), lp.end(), lp[0]));
  return c;
}

MinimalPairScore score_minimal_pairs(nn::Model& model, const std::vector<MinimalPairItem>& items,
                                     const MinimalPairRows& rows, int batch,
                                     const EvalPolicy& policy, const EvalWindows* calib) {
  if (rows.first_row.size() != items.size() || rows.skipped.size() != items.size())
    throw std::invalid_argument("score_minimal_pairs: rows of another item set");
  const std::vector<double> lp =
      rows.seqs.empty() ? std::vector<double>()
                        : continuation_logprobs(model, rows.seqs, rows.T, batch, policy, calib);
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
    if (std::isnan(c)) { s += '-'; continue; }
    if (c == 1) { s += '1'; continue; }
    if (c == 0) { s += '0'; continue; }
    const double m = 1.0 / c;
    const long r = std::lround(m);
    if (r < 2 || r > 9 || 1.0 / double(r) != c)
      throw std::invalid_argument("format_credits: credit " + std::to_string(c) + " is not 0, 1 or 1/m");
    s += char('0' + r);
  }
  return s;
}

std::vector<double> parse_credits(std::string_view s) {
  std::vector<double> v;
  for (char ch : s) {
    if (ch == '-') v.push_back(std::numeric_limits<double>::quiet_NaN());
    else if (ch == '0') v.push_back(0);
    else if (ch == '1') v.push_back(1);
    else if (ch >= '2' && ch <= '9') v.push_back(1.0 / double(ch - '0'));
    else throw std::invalid_argument(std::string("parse_credits: '") + ch + "' is not 0, 1, 2..9 or -");
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
