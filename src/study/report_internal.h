// Helpers shared by the study room's report files (statistics, run records and aggregation,
// markdown, hypotheses: docs/design.md "The rooms, file by file"). Private to src/study/.
#pragma once
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fp4/base/error.h"
#include "fp4/study/report.h"

namespace fp4::report_detail {
namespace fs = std::filesystem;
using json = nlohmann::json;

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

/// The JSON of file p. Throws fp4::UserError naming p (unreadable, malformed).
inline json read_json_file(const fs::path& p) {
  std::ifstream f(p);
  if (!f) throw UserError("cannot read " + p.string());
  try {
    return json::parse(f);
  } catch (const json::exception& e) {
    throw UserError(p.string() + ": malformed JSON (" + e.what() + ")");
  }
}

/// Number field `key` of j (null: NaN). Throws fp4::UserError naming `where` and the key.
inline double num(const json& j, const char* key, const fs::path& where) {
  if (!j.contains(key)) throw UserError(where.string() + ": missing field '" + key + "'");
  const json& v = j.at(key);
  if (v.is_null()) return kNaN;  // NaN is written as null
  if (!v.is_number())
    throw UserError(where.string() + ": field '" + key + "' is not a number");
  return v.get<double>();
}

/// v printed with printf format f, or "—" if not finite.
inline std::string fmt(const char* f, double v) {
  if (!std::isfinite(v)) return "—";
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}
/// "mean ± std" (just the mean for one value); f formats the mean, the std is unsigned.
inline std::string fmt_ms(const MeanStd& m, const char* f = "%.4f") {
  if (m.n == 0 || !std::isfinite(m.mean)) return "—";
  std::string s = fmt(f, m.mean);
  if (m.n > 1) s += " ± " + fmt("%.4f", m.std);
  return s;
}

// Defined in runs.cpp, used by hypotheses.cpp and report_md.cpp.
int grad_norm_excursions(const RunRecord& r);
const RunRecord* find_run(const std::vector<RunRecord>& runs, const std::string& recipe,
                          uint64_t seed, bool completed_only = true);
// Seeds where every recipe of c has a run, all of them on one CPU (RunRecord::cpu, "" matching
// any): results may differ across CPU families, so pairs never cross them. mixed_cpu, when
// given, counts the seeds left out for that.
std::vector<uint64_t> common_seeds(const std::vector<RunRecord>& runs,
                                   const std::vector<std::pair<std::string, double>>& c,
                                   bool completed_only = true, int* mixed_cpu = nullptr);
std::vector<std::vector<double>> window_differences(
    const std::vector<RunRecord>& runs, const std::vector<std::pair<std::string, double>>& c,
    const std::string& policy);
// Defined in report_md.cpp, used by hypotheses.cpp.
std::string boot_cell(const BootstrapInterval& b);
// The two Power tables' cells (the report's and the hypotheses'): "| n | std | ±half-width |
// seeds |" of a paired std over n seeds, the seeds for ±effect by seeds_for_half_width.
std::string power_cells(int n, double std, double half_width, double effect);

}  // namespace fp4::report_detail
