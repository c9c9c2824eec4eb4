// The report's "Minimal pairs" section (fp4/study/report.h minimal_pairs_md; docs/evaluation.md
// "Minimal pairs: `eval --task minimal-pairs`"): accuracy and margin per recipe, policy and
// paradigm, and item-paired comparisons.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "fp4/eval/minimal_pairs.h"
#include "fp4/study/report.h"
#include "report_internal.h"

namespace fp4 {
using namespace report_detail;

namespace {

// The runs of one recipe on the common items, by seed: credit and margin rows.
struct Cells {
  std::vector<uint64_t> seeds;
  std::vector<std::string> cpus;  // RunRecord::cpu of each seed's run
  std::vector<std::vector<double>> credit, margin;
};

Cells cells_of(const std::vector<RunRecord>& runs, const std::string& recipe,
               const std::string& policy, const std::string& hash) {
  Cells c;
  for (const auto& r : runs) {
    if (r.recipe != recipe || r.diverged_at > 0 || r.pairs.items_hash != hash) continue;
    const auto it = r.pairs.results.find(policy);
    if (it == r.pairs.results.end()) continue;
    c.seeds.push_back(r.seed);
    c.cpus.push_back(r.cpu);
    c.credit.push_back(it->second.credit);
    c.margin.push_back(it->second.margin);
  }
  return c;
}

// Rows restricted to items [b, e) that are finite in every row of every matrix given.
std::vector<std::vector<double>> restrict_rows(const std::vector<std::vector<double>>& m,
                                               const std::vector<size_t>& keep) {
  std::vector<std::vector<double>> out;
  for (const auto& row : m) {
    std::vector<double> r;
    for (size_t i : keep) r.push_back(row[i]);
    out.push_back(std::move(r));
  }
  return out;
}
std::vector<size_t> finite_items(const std::vector<const std::vector<std::vector<double>>*>& ms,
                                 size_t b, size_t e) {
  std::vector<size_t> keep;
  for (size_t i = b; i < e; ++i) {
    bool ok = true;
    for (const auto* m : ms)
      for (const auto& row : *m) ok &= i < row.size() && std::isfinite(row[i]);
    if (ok) keep.push_back(i);
  }
  return keep;
}

std::string acc_cell(const BootstrapInterval& b) {
  return fmt("%.1f%%", 100 * b.mean) + " [" + fmt("%.1f", 100 * b.lo) + ", " +
         fmt("%.1f", 100 * b.hi) + "]";
}
std::string margin_cell(const BootstrapInterval& b) {
  return fmt("%+.3f", b.mean) + " [" + fmt("%+.3f", b.lo) + ", " + fmt("%+.3f", b.hi) + "]";
}
std::string signed_acc_cell(const BootstrapInterval& b) {
  return fmt("%+.1f", 100 * b.mean) + " [" + fmt("%+.1f", 100 * b.lo) + ", " +
         fmt("%+.1f", 100 * b.hi) + "]";
}

// The items the section reports on: those of most runs (ties: the first seen), as for
// next-sentence; ref is null when no completed run has minimal-pairs results.
struct SectionItems {
  std::string hash;
  const RunRecord* ref = nullptr;  // a run on these items, for their paradigms
  int excluded = 0;                // completed runs with results on other items
  size_t total_items = 0;
};

SectionItems section_items(const std::vector<RunRecord>& runs) {
  SectionItems s;
  std::map<std::string, int> count;
  for (const auto& r : runs)
    if (r.diverged_at == 0 && !r.pairs.items_hash.empty()) {
      const int n = ++count[r.pairs.items_hash];
      if (n > (s.hash.empty() ? 0 : count[s.hash])) s.hash = r.pairs.items_hash, s.ref = &r;
    }
  if (!s.ref) return s;
  for (const auto& r : runs)
    if (r.diverged_at == 0 && !r.pairs.items_hash.empty() && r.pairs.items_hash != s.hash)
      ++s.excluded;
  for (const auto& p : s.ref->pairs.paradigms)
    s.total_items = std::max(s.total_items, p.first + p.items);
  return s;
}

using Paradigms = std::vector<RunRecord::Pairs::Paradigm>;

// The heading and the paragraph that says what the items, the accuracy and the margin are.
void write_intro(std::ostringstream& o, const std::string& hash, const Paradigms& paradigms) {
  o << "\n## Minimal pairs\n\n"
    << "BLiMP-style items from the held-out documents (items fnv1a64 `" << hash
    << "`): the "
       "model is right on an item when the held-out sentence gets a higher total "
       "log-probability than each altered copy (a tie of m sentences counts 1/m). Paradigms "
       "and chance:";
  for (const auto& p : paradigms)
    o << " " << p.name << " (" << p.items << " items, " << fmt("%.0f%%", 100 * p.chance) << ")"
      << (&p == &paradigms.back() ? "." : ",");
  o << " Accuracy pooled over each recipe's seeds; 95% percentile bootstrap over items (10,000 "
       "resamples, the same items for every seed). Margin: the held-out sentence's "
       "log-probability minus the best altered copy's, in nats, mean over items.\n\n";
}

// The head of a table with one column per paradigm after recipe, policy and seeds.
void write_paradigm_table_head(std::ostringstream& o, const Paradigms& paradigms) {
  o << "| recipe | policy | seeds |";
  for (const auto& p : paradigms) o << " " << p.name << " |";
  o << "\n|---|---|---|";
  for (size_t i = 0; i < paradigms.size(); ++i) o << "---|";
  o << "\n";
}

// The accuracy table and the margin table (one row per recipe and policy), the intervals
// that reach down to chance, and the count of runs on other items.
void write_accuracy_tables(std::ostringstream& o, const std::vector<RunRecord>& runs,
                           const std::vector<std::string>& names,
                           const std::vector<std::string>& policies, const SectionItems& s) {
  const Paradigms& paradigms = s.ref->pairs.paradigms;
  write_paradigm_table_head(o, paradigms);
  std::ostringstream mt;  // the margin table, filled alongside
  write_paradigm_table_head(mt, paradigms);
  std::vector<std::string> below_chance;
  for (const auto& name : names)
    for (const auto& pol : policies) {
      const Cells c = cells_of(runs, name, pol, s.hash);
      if (c.seeds.empty()) continue;
      o << "| " << name << " | " << pol << " | " << c.seeds.size() << " |";
      mt << "| " << name << " | " << pol << " | " << c.seeds.size() << " |";
      for (const auto& p : paradigms) {
        const auto keep = finite_items({&c.credit}, p.first, p.first + p.items);
        if (keep.empty()) {
          o << " — |";
          mt << " — |";
          continue;
        }
        const BootstrapInterval b = paired_bootstrap(restrict_rows(c.credit, keep));
        o << " " << acc_cell(b) << " |";
        mt << " " << margin_cell(paired_bootstrap(restrict_rows(c.margin, keep))) << " |";
        if (b.lo <= p.chance) below_chance.push_back(name + " / " + pol + " / " + p.name);
      }
      o << "\n";
      mt << "\n";
    }
  if (below_chance.empty())
    o << "\nEvery interval above lies above its paradigm's chance level.\n";
  else {
    o << "\nIntervals that reach down to chance (no evidence the model does that paradigm): ";
    for (size_t i = 0; i < below_chance.size(); ++i) o << (i ? ", " : "") << below_chance[i];
    o << ".\n";
  }
  o << "\nMean margin per paradigm, nats (95% bootstrap over items). Margins differ in "
       "scale between paradigms (a shuffle costs tens of nats, an agreement error a few), so "
       "they are not pooled.\n\n"
    << mt.str();
  if (s.excluded > 0)
    o << "\n"
      << s.excluded
      << " run(s) hold minimal-pairs results on other items (another corpus "
         "or item rule) and are left out.\n";
}

// One item-paired comparison: the runs of recipe a under policy pa against those of b under pb.
struct Cmp {
  std::string a, pa, b, pb, label;
};

// The comparisons, each once, in order: every recipe against the baseline, the hypotheses of
// two recipes (contrast +1 / −1), every quantized policy against `none` of the same recipe.
std::vector<Cmp> comparisons(const std::vector<std::string>& names,
                             const std::vector<std::string>& policies, const std::string& baseline,
                             const std::vector<Hypothesis>& hyps) {
  std::vector<Cmp> cmps;
  std::set<std::string> seen;
  auto add = [&](const std::string& a, const std::string& pa, const std::string& b,
                 const std::string& pb, const std::string& label) {
    if (seen.insert(a + "\n" + pa + "\n" + b + "\n" + pb).second)
      cmps.push_back({a, pa, b, pb, label});
  };
  if (!baseline.empty() && std::find(names.begin(), names.end(), baseline) != names.end())
    for (const auto& n : names)
      if (n != baseline)
        for (const auto& p : policies) add(n, p, baseline, p, "`" + n + "` − `" + baseline + "`");
  for (const auto& h : hyps) {
    if (h.contrast.size() != 2) continue;
    const auto& [a, ca] = h.contrast[0];
    const auto& [b, cb] = h.contrast[1];
    if (ca == 1 && cb == -1)
      for (const auto& p : policies) add(a, p, b, p, h.id + ": `" + a + "` − `" + b + "`");
    else if (ca == -1 && cb == 1)
      for (const auto& p : policies) add(b, p, a, p, h.id + ": `" + b + "` − `" + a + "`");
  }
  for (const auto& n : names)
    for (const auto& p : policies)
      if (p != "none") add(n, p, n, "none", "`" + n + "`, " + p + " − none");
  return cmps;
}

// The seeds both sets of runs have, on one CPU family (as every other contrast of the
// report): a2 and b2 hold those rows of A and B in the same order; *mixed counts the seeds
// left out for their CPUs.
void pair_by_seed(const Cells& A, const Cells& B, Cells* a2, Cells* b2, int* mixed) {
  for (size_t i = 0; i < A.seeds.size(); ++i)
    for (size_t j = 0; j < B.seeds.size(); ++j)
      if (A.seeds[i] == B.seeds[j]) {
        if (!A.cpus[i].empty() && !B.cpus[j].empty() && A.cpus[i] != B.cpus[j]) {
          ++*mixed;
          continue;
        }
        a2->seeds.push_back(A.seeds[i]);
        a2->credit.push_back(A.credit[i]), a2->margin.push_back(A.margin[i]);
        b2->credit.push_back(B.credit[j]), b2->margin.push_back(B.margin[j]);
      }
}

std::vector<std::vector<double>> difference(const std::vector<std::vector<double>>& x,
                                            const std::vector<std::vector<double>>& y) {
  std::vector<std::vector<double>> d = x;
  for (size_t s = 0; s < d.size(); ++s)
    for (size_t i = 0; i < d[s].size(); ++i) d[s][i] -= y[s][i];
  return d;
}

// The row of comparison c, or false (nothing written) when the two sets share no seed or no
// item is finite in both.
bool write_comparison_row(std::ostringstream& o, const Cmp& c, const std::vector<RunRecord>& runs,
                          const SectionItems& s) {
  const Cells A = cells_of(runs, c.a, c.pa, s.hash), B = cells_of(runs, c.b, c.pb, s.hash);
  Cells a2, b2;
  int mixed = 0;
  pair_by_seed(A, B, &a2, &b2, &mixed);
  if (a2.seeds.empty()) return false;
  const auto dc = difference(a2.credit, b2.credit), dm = difference(a2.margin, b2.margin);
  const auto keep = finite_items({&a2.credit, &b2.credit}, 0, s.total_items);
  if (keep.empty()) return false;
  int64_t nb = 0, nc = 0;
  for (size_t k = 0; k < a2.credit.size(); ++k)
    for (size_t i : keep) {
      const double x = a2.credit[k][i], y = b2.credit[k][i];
      nb += x == 1 && y == 0;
      nc += x == 0 && y == 1;
    }
  const BootstrapInterval bc = paired_bootstrap(restrict_rows(dc, keep));
  o << "| " << c.label << " | " << (c.pa == c.pb ? c.pa : c.pa + " vs " + c.pb) << " | "
    << a2.seeds.size() << (mixed ? " (" + std::to_string(mixed) + " left out: other CPU)" : "")
    << " | " << signed_acc_cell(bc) << " | " << nb << " / " << nc << " | "
    << fmt("%.3g", mcnemar_exact_p(nb, nc)) << " |";
  for (const auto& p : s.ref->pairs.paradigms) {
    const auto k = finite_items({&a2.credit, &b2.credit}, p.first, p.first + p.items);
    if (k.empty()) {
      o << " — |";
      continue;
    }
    const BootstrapInterval b = paired_bootstrap(restrict_rows(dm, k));
    o << " " << fmt("%+.3f", b.mean) << (b.lo > 0 || b.hi < 0 ? "*" : "") << " |";
  }
  o << "\n";
  return true;
}

// "### Paired comparisons": what the columns are, then one row per comparison with runs.
void write_paired_comparisons(std::ostringstream& o, const std::vector<RunRecord>& runs,
                              const std::vector<Cmp>& cmps, const SectionItems& s) {
  o << "\n### Paired comparisons\n\n"
       "Each row compares two sets of runs item by item and seed by seed (the seeds both "
       "have): the differences of credit (accuracy, in points) and of margin are averaged "
       "over seeds per item and bootstrapped over items (10,000 resamples). b / c count the "
       "(item, seed) pairs right under the first only / the second only (ties left out); "
       "McNemar's exact two-sided p is computed on them as if independent, which the same item "
       "under several seeds is not, so read it with the bootstrap. Per-paradigm columns give "
       "the margin difference (nats), marked * where its interval excludes 0. Seeds whose runs "
       "were made on different CPUs are not paired.\n\n"
    << "| comparison | policy | seeds | Δ accuracy, all items, points [95% CI] | b / c | McNemar p "
       "|";
  const Paradigms& paradigms = s.ref->pairs.paradigms;
  for (const auto& p : paradigms) o << " Δ margin " << p.name << " |";
  o << "\n|---|---|---|---|---|---|";
  for (size_t i = 0; i < paradigms.size(); ++i) o << "---|";
  o << "\n";
  int rows = 0;
  for (const Cmp& c : cmps) rows += write_comparison_row(o, c, runs, s);
  if (rows == 0) o << "(no two sets of runs share a seed)\n";
}

}  // namespace

std::string minimal_pairs_md(const std::vector<RunRecord>& runs,
                             const std::vector<std::string>& names,
                             const std::vector<std::string>& policies, const std::string& baseline,
                             const std::vector<Hypothesis>& hyps) {
  const SectionItems s = section_items(runs);
  if (!s.ref) return "";
  std::ostringstream o;
  write_intro(o, s.hash, s.ref->pairs.paradigms);
  write_accuracy_tables(o, runs, names, policies, s);
  write_paired_comparisons(o, runs, comparisons(names, policies, baseline, hyps), s);
  return o.str();
}

}  // namespace fp4
