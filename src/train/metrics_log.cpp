// Cutting metrics.jsonl back for a resume (see include/fp4/train/metrics_log.h).
#include "fp4/train/metrics_log.h"

#include <nlohmann/json.hpp>

#include "fp4/base/error.h"

namespace fp4 {
using json = nlohmann::json;

MetricsCut cut_metrics_text(std::string_view text, int64_t step, const std::string& name) {
  MetricsCut out;
  int64_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t nl = text.find('\n', pos);
    const bool last = nl == std::string_view::npos || nl + 1 == text.size();
    if (nl == std::string_view::npos) nl = text.size();
    const std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (line.empty()) continue;
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    const json* s = nullptr;
    if (!j.is_discarded() && j.is_object()) {
      const auto it = j.find("step");
      if (it != j.end() && it->is_number_integer()) s = &*it;
    }
    if (s == nullptr) {
      if (last) {
        out.torn = true;
        continue;
      }
      throw UserError(name + ":" + std::to_string(line_no) +
                      ": not a metrics line with an integer \"step\"; resume does not drop "
                      "lines it cannot read: repair or remove that line");
    }
    // An unsigned step above INT64_MAX is later than any checkpoint (not a negative step).
    const bool later = s->is_number_unsigned()
                           ? step < 0 || s->get<uint64_t>() > static_cast<uint64_t>(step)
                           : s->get<int64_t>() > step;
    if (!later) {
      out.kept.append(line);
      out.kept += '\n';
      ++out.n_kept;
    } else {
      ++out.n_dropped;
    }
  }
  return out;
}

}  // namespace fp4
