// The report's statistics (fp4/study/report.h): median, mean and std, Student-t intervals
// of paired differences, the paired bootstrap.
#include "fp4/study/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <toml++/toml.h>

#include "fp4/nn/run_config.h"
#include "fp4/data/data.h"
#include "fp4/eval/eval.h"
#include "fp4/base/error.h"
#include "fp4/recipe/recipe.h"

#include "report_internal.h"

namespace fp4 {
namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace report_detail;

double median(std::vector<double> xs) {
  if (xs.empty()) return kNaN;
  std::sort(xs.begin(), xs.end());
  const size_t n = xs.size();
  return n % 2 ? xs[n / 2] : 0.5 * (xs[n / 2 - 1] + xs[n / 2]);
}

MeanStd mean_std(const std::vector<double>& xs) {
  MeanStd m;
  m.n = static_cast<int>(xs.size());
  if (xs.empty()) return m;
  double s = 0;
  for (double x : xs) s += x;
  m.mean = s / xs.size();
  if (xs.size() > 1) {
    double q = 0;
    for (double x : xs) q += (x - m.mean) * (x - m.mean);
    m.std = std::sqrt(q / (xs.size() - 1));
  }
  return m;
}

double t_quantile_975(int df) {
  // Two-sided 95% critical values of Student's t, df = 1..30 (standard statistical tables).
  static constexpr double kTable[30] = {
      12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
      2.2010,  2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
      2.0796,  2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423};
  if (df < 1) return kNaN;
  if (df <= 30) return kTable[df - 1];
  // Cornish–Fisher: t ≈ z + g1/ν + g2/ν² + g3/ν³ with z the normal 0.975 quantile.
  const double z = 1.959963984540054, v = df;
  const double z3 = z * z * z, z5 = z3 * z * z, z7 = z5 * z * z;
  return z + (z3 + z) / (4 * v) + (5 * z5 + 16 * z3 + 3 * z) / (96 * v * v) +
         (3 * z7 + 19 * z5 + 17 * z3 - 15 * z) / (384 * v * v * v);
}

PairedInterval paired_interval(const MeanStd& d) {
  PairedInterval r;
  r.n = d.n;
  if (d.n < 2) {
    r.lo = r.hi = d.n ? d.mean : kNaN;
    return r;
  }
  const double h = t_quantile_975(d.n - 1) * d.std / std::sqrt(double(d.n));
  r.lo = d.mean - h;
  r.hi = d.mean + h;
  r.resolved = r.lo > 0 || r.hi < 0;
  r.sign = !r.resolved ? 0 : (r.lo > 0 ? 1 : -1);
  return r;
}

BootstrapInterval paired_bootstrap(const std::vector<std::vector<double>>& d, int resamples,
                                   uint64_t seed) {
  if (d.empty()) throw std::invalid_argument("paired_bootstrap: no seeds");
  const size_t W = d[0].size();
  if (W == 0) throw std::invalid_argument("paired_bootstrap: no windows");
  for (const auto& row : d)
    if (row.size() != W)
      throw std::invalid_argument("paired_bootstrap: seeds hold different numbers of windows (" +
                                  std::to_string(row.size()) + " and " + std::to_string(W) + ")");
  if (resamples < 1) throw std::invalid_argument("paired_bootstrap: resamples must be >= 1");
  BootstrapInterval b;
  b.seeds = static_cast<int>(d.size());
  b.windows = static_cast<int>(W);
  b.resamples = resamples;
  // Per-window mean over seeds: a resample's statistic is the mean of these over its draws.
  std::vector<double> m(W, 0.0);
  for (size_t w = 0; w < W; ++w) {
    for (const auto& row : d) m[w] += row[w];
    m[w] /= double(d.size());
  }
  double total = 0;
  for (double v : m) total += v;
  b.mean = total / double(W);
  // Unbiased uniform indices in [0, W): reject the top partial range of 2^64.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % W;
  uint64_t k = 0;
  std::vector<double> stats(static_cast<size_t>(resamples));
  for (auto& st : stats) {
    double sum = 0;
    for (size_t i = 0; i < W; ++i) {
      uint64_t u;
      do u = splitmix64(seed, k++);
      while (u >= limit);
      sum += m[u % W];
    }
    st = sum / double(W);
  }
  std::sort(stats.begin(), stats.end());
  auto quantile = [&](double q) {  // type 7: h = (n − 1)·q, interpolate between neighbours
    const double h = (stats.size() - 1) * q;
    const size_t lo = static_cast<size_t>(std::floor(h));
    const size_t hi = std::min(lo + 1, stats.size() - 1);
    return stats[lo] + (h - double(lo)) * (stats[hi] - stats[lo]);
  };
  b.lo = quantile(0.025);
  b.hi = quantile(0.975);
  b.resolved = b.lo > 0 || b.hi < 0;
  b.sign = !b.resolved ? 0 : (b.lo > 0 ? 1 : -1);
  return b;
}

}  // namespace fp4
