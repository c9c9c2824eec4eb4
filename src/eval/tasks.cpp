// The next-sentence task (see include/fp4/eval/tasks.h): multiple-choice items from the
// held-out split, the task file, the rows to score and their scoring per inference policy.
#include "fp4/eval/tasks.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <toml++/toml.h>

#include "fp4/base/error.h"

namespace fp4 {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r'; }
bool is_upper(char c) { return c >= 'A' && c <= 'Z'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_closer(char c) { return c == '"' || c == '\'' || c == ')'; }
bool is_opener(char c) { return c == '"' || c == '\'' || c == '('; }

std::string trim(std::string_view s) {
  size_t a = 0, b = s.size();
  while (a < b && is_space(s[a])) ++a;
  while (b > a && is_space(s[b - 1])) --b;
  return std::string(s.substr(a, b - a));
}

// The word that ends at s[end - 1] (the character before a '.'), without leading openers.
std::string_view word_before(std::string_view s, size_t end) {
  size_t a = end;
  while (a > 0 && !is_space(s[a - 1])) --a;
  while (a < end && (is_opener(s[a]) || s[a] == '-')) ++a;
  return s.substr(a, end - a);
}

bool is_abbreviation(std::string_view w) {
  static const std::set<std::string_view> kAbbrev = {
      "Mr", "Mrs", "Ms", "Dr", "St", "Jr", "Sr", "Mt", "Ft", "Gen", "Gov", "Sen", "Rep",
      "Col", "Lt", "Capt", "Sgt", "Prof", "Rev", "Inc", "Co", "Corp", "Ltd", "No", "vs",
      "Jan", "Feb", "Aug", "Sept", "Oct", "Nov", "Dec"};
  if (w.size() == 1 && std::isalpha(static_cast<unsigned char>(w[0]))) return true;  // an initial
  return kAbbrev.count(w) > 0;
}

}  // namespace

std::vector<std::string> split_sentences(std::string_view p) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c != '.' && c != '?' && c != '!') continue;
    size_t j = i + 1;
    while (j < p.size() && is_closer(p[j])) ++j;
    if (j >= p.size() || p[j] != ' ') continue;
    size_t k = j;
    while (k < p.size() && p[k] == ' ') ++k;
    if (k >= p.size() || !(is_upper(p[k]) || is_digit(p[k]) || is_opener(p[k]))) continue;
    if (c == '.' && is_abbreviation(word_before(p, i))) continue;
    std::string s = trim(p.substr(start, j - start));
    if (!s.empty()) out.push_back(std::move(s));
    start = k;
    i = k - 1;
  }
  std::string s = trim(p.substr(start));
  if (!s.empty()) out.push_back(std::move(s));
  return out;
}

std::vector<NextSentenceItem> make_next_sentence_items(const CorpusSplit& split,
                                                        const NextSentenceOptions& o) {
  if (o.context_sentences < 1 || o.items < 1 || o.min_chars < 1 || o.min_chars > o.max_chars ||
      !(o.length_tolerance >= 0))
    throw std::invalid_argument("make_next_sentence_items: options out of range");
  const size_t D = split.heldout_docs.size();
  if (D < 2)
    throw UserError("next-sentence: the held-out split has " + std::to_string(D) +
                    " document(s); distractors come from other documents, so at least 2 are needed");
  // Sentences per document, across its paragraphs (lines).
  std::vector<std::vector<std::string>> sent(D);
  for (size_t d = 0; d < D; ++d) {
    const std::string& text = split.heldout_docs[d];
    for (size_t a = 0; a <= text.size();) {
      size_t b = text.find('\n', a);
      if (b == std::string::npos) b = text.size();
      for (auto& s : split_sentences(std::string_view(text).substr(a, b - a)))
        sent[d].push_back(std::move(s));
      a = b + 1;
    }
  }
  auto ok_len = [&](const std::string& s) {
    return int(s.size()) >= o.min_chars && int(s.size()) <= o.max_chars;
  };
  struct Place {
    size_t doc, i;
  };
  std::vector<Place> places;
  for (size_t d = 0; d < D; ++d)
    for (size_t i = size_t(o.context_sentences); i < sent[d].size(); ++i)
      if (ok_len(sent[d][i])) places.push_back({d, i});
  if (places.empty())
    throw UserError("next-sentence: no held-out document has " +
                    std::to_string(o.context_sentences + 1) + " sentences with a last one of " +
                    std::to_string(o.min_chars) + ".." + std::to_string(o.max_chars) + " bytes");
  uint64_t draw = 0;  // every random draw: splitmix64(seed, draw++)
  auto uniform = [&](uint64_t n) { return splitmix64(o.seed, draw++) % n; };  // n ≪ 2^64
  for (size_t i = places.size(); i > 1; --i) std::swap(places[i - 1], places[uniform(i)]);
  places.resize(std::min(places.size(), size_t(o.items)));
  std::sort(places.begin(), places.end(),
            [](const Place& a, const Place& b) { return a.doc != b.doc ? a.doc < b.doc : a.i < b.i; });
  // Distractor pool: every sentence of an acceptable length, with its document.
  struct Cand {
    size_t doc;
    const std::string* s;
  };
  std::vector<Cand> pool;
  for (size_t d = 0; d < D; ++d)
    for (const auto& s : sent[d])
      if (ok_len(s)) pool.push_back({d, &s});
  std::vector<NextSentenceItem> items;
  for (const Place& p : places) {
    const std::string& truth = sent[p.doc][p.i];
    const double len = double(truth.size());
    const double tol = std::max(5.0, o.length_tolerance * len);
    // Distinct texts only (a sentence repeated across documents counts once), never the truth.
    std::vector<const std::string*> near;
    std::set<std::string_view> seen = {truth};
    for (const Cand& c : pool)
      if (c.doc != p.doc && std::fabs(double(c.s->size()) - len) <= tol && seen.insert(*c.s).second)
        near.push_back(c.s);
    if (near.size() < 3) {  // the 3 nearest in length (ties: pool order)
      near.clear();
      seen = {truth};
      std::vector<const Cand*> other;
      for (const Cand& c : pool)
        if (c.doc != p.doc && seen.insert(*c.s).second) other.push_back(&c);
      std::stable_sort(other.begin(), other.end(), [&](const Cand* a, const Cand* b) {
        return std::fabs(double(a->s->size()) - len) < std::fabs(double(b->s->size()) - len);
      });
      for (size_t k = 0; k < other.size() && near.size() < 3; ++k) near.push_back(other[k]->s);
      if (near.size() < 3)
        throw UserError("next-sentence: fewer than 3 distractor sentences in the other held-out documents");
    }
    // 3 distinct, uniformly: a partial Fisher-Yates over `near`.
    for (size_t k = 0; k < 3; ++k) std::swap(near[k], near[k + uniform(near.size() - k)]);
    NextSentenceItem it;
    it.doc = split.heldout_names[p.doc];
    it.sentence = int(p.i);
    for (size_t c = p.i - size_t(o.context_sentences); c < p.i; ++c) it.context.push_back(sent[p.doc][c]);
    it.answer = int(uniform(4));
    for (int c = 0, k = 0; c < 4; ++c) it.choices.push_back(c == it.answer ? truth : *near[k++]);
    items.push_back(std::move(it));
  }
  return items;
}

std::string next_sentence_items_jsonl(const std::vector<NextSentenceItem>& items) {
  std::string out;
  for (const auto& it : items) {
    const nlohmann::json j = {{"doc", it.doc},         {"sentence", it.sentence},
                              {"context", it.context}, {"choices", it.choices},
                              {"answer", it.answer}};
    out += j.dump() + "\n";  // nlohmann's object keys are sorted; dump() has no spaces
  }
  return out;
}

std::string fnv1a64_hex(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(h));
  return b;
}

NextSentenceTask load_next_sentence_task(const std::filesystem::path& file) {
  NextSentenceTask t;
  t.path = file;
  toml::table tb;
  try {
    tb = toml::parse_file(t.path.string());
  } catch (const toml::parse_error& e) {
    throw UserError(t.path.string() + ": " + std::string(e.description()));
  }
  auto get_int = [&](const char* k, int& v, int lo, int hi) {
    if (auto x = tb[k].value<int64_t>()) {
      if (*x < lo || *x > hi)
        throw UserError(t.path.string() + ": " + k + " = " + std::to_string(*x) + " is outside " +
                        std::to_string(lo) + ".." + std::to_string(hi));
      v = int(*x);
    } else if (tb.contains(k)) {
      throw UserError(t.path.string() + ": " + k + " must be an integer");
    }
  };
  get_int("context_sentences", t.opt.context_sentences, 1, 100);
  get_int("items", t.opt.items, 1, 1 << 20);
  get_int("min_chars", t.opt.min_chars, 1, 1 << 20);
  get_int("max_chars", t.opt.max_chars, 1, 1 << 20);
  int seed = int(t.opt.seed);
  get_int("seed", seed, 0, 1 << 30);
  t.opt.seed = uint64_t(seed);
  if (auto x = tb["length_tolerance"].value<double>()) t.opt.length_tolerance = *x;
  if (t.opt.min_chars > t.opt.max_chars || !(t.opt.length_tolerance >= 0))
    throw UserError(t.path.string() + ": min_chars must be <= max_chars and length_tolerance >= 0");
  t.shipped_hash = tb["fnv1a64"].value_or(std::string());
  return t;
}

namespace {
// UTF-8 code points of s (bytes that do not continue a sequence).
int64_t utf8_chars(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}
}  // namespace

NextSentenceRows next_sentence_rows(const std::vector<NextSentenceItem>& items, const Tokenizer& tok,
                                    int seq_len) {
  NextSentenceRows rows;
  for (const auto& it : items) {
    std::string ctx_text;
    for (const auto& c : it.context) ctx_text += (ctx_text.empty() ? "" : " ") + c;
    const std::vector<int> ctx_ids = tok.encode(ctx_text, "a next-sentence context");
    for (const auto& ch : it.choices) {
      std::vector<int> ch_ids = tok.encode(ch, "a next-sentence choice");
      if (ch_ids.empty()) throw UserError("next-sentence: a choice encodes to no token: '" + ch + "'");
      if (int(ch_ids.size()) > seq_len) ch_ids.resize(size_t(seq_len)), ++rows.truncated;
      std::vector<int32_t> all = {kTokenEos};
      all.insert(all.end(), ctx_ids.begin(), ctx_ids.end());
      all.insert(all.end(), ch_ids.begin(), ch_ids.end());
      const size_t keep = size_t(seq_len) + 1;
      if (all.size() > keep) all.erase(all.begin(), all.end() - std::ptrdiff_t(keep));
      rows.seqs.push_back({all, int(ch_ids.size())});
      rows.chars.push_back(std::max<int64_t>(1, utf8_chars(ch)));
    }
  }
  return rows;
}

NextSentenceScore score_next_sentence(nn::Model& model, const std::vector<NextSentenceItem>& items,
                                      const NextSentenceRows& rows, int seq_len, int batch,
                                      const EvalPolicy& policy, const EvalWindows* calib) {
  if (rows.seqs.size() != 4 * items.size() || rows.chars.size() != rows.seqs.size())
    throw std::invalid_argument("score_next_sentence: " + std::to_string(rows.seqs.size()) +
                                " rows for " + std::to_string(items.size()) + " items (4 each)");
  const std::vector<double> lp = continuation_logprobs(model, rows.seqs, seq_len, batch, policy, calib);
  const std::vector<int64_t>& chars = rows.chars;
  NextSentenceScore sc;
  sc.raw.resize(items.size());
  sc.per_char.resize(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    int best = 0, best_n = 0;
    for (int c = 0; c < 4; ++c) {
      const size_t k = i * 4 + size_t(c);
      sc.finite &= std::isfinite(lp[k]);
      if (lp[k] > lp[i * 4 + size_t(best)]) best = c;  // ties: the lower index
      if (lp[k] / double(chars[k]) > lp[i * 4 + size_t(best_n)] / double(chars[i * 4 + size_t(best_n)]))
        best_n = c;
    }
    sc.raw[i] = best == items[i].answer;
    sc.per_char[i] = best_n == items[i].answer;
  }
  return sc;
}

}  // namespace fp4
