// metrics.jsonl of a run directory: one JSON object per line, each with an integer "step"
// (written by fp4::train, one line per logged step). On resume from the checkpoint of step S
// the file is cut back to the lines of steps <= S (fp4::train, through cut_metrics_text).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace fp4 {

/// The metrics log of a run directory, as fp4::train writes and appends to it.
inline constexpr const char* kMetricsFile = "metrics.jsonl";
/// The same log of a finished run compacted by `fp4train compact` (zstd; docs/compare.md
/// "Compacted runs"): read by `report`, never appended to; a resume refuses a run holding it.
inline constexpr const char* kCompactMetricsFile = "metrics.jsonl.zst";

/// What cut_metrics_text keeps of a metrics.jsonl text.
struct MetricsCut {
  std::string kept;       ///< the kept lines, byte for byte, each followed by '\n'
  int64_t n_kept = 0;     ///< lines kept (step <= S)
  int64_t n_dropped = 0;  ///< well-formed lines of later steps, dropped
  bool torn = false;      ///< the last line was not a metrics line and was dropped
};

/// Cut the text of a metrics.jsonl (`text`, read from `name`, which errors name) back to the
/// lines of steps <= `step` (the checkpoint a run resumes from), in file order; empty lines are
/// skipped. A line is a metrics line if it is a JSON object whose "step" is an integer; a
/// "step" above INT64_MAX is a later step. Only the last line may be something else (a write
/// cut off by a kill): it is dropped (MetricsCut::torn). Any other such line throws
/// fp4::UserError "<name>:<line>: not a metrics line ..." rather than lose data.
/// Round trip: cut_metrics_text(kept, step) keeps every line of `kept` again, unchanged
/// (tests/fuzz/fuzz_metrics.cpp).
MetricsCut cut_metrics_text(std::string_view text, int64_t step, const std::string& name);

}  // namespace fp4
