// Fuzz target: metrics.jsonl as `train --resume` reads it, through cut_metrics_text (the
// code fp4::train runs on the file), cut at checkpoint steps 0, 3 and 1000.
// Property: every kept line is a line of the input, unchanged, in order, and a JSON object
// whose integer "step" is <= the cut step; cutting the kept text again at the same step keeps
// it all, unchanged (n_kept equal, nothing dropped, nothing torn); the counts add up.
#include <nlohmann/json.hpp>
#include <string>

#include "fp4/base/error.h"
#include "fp4/train/metrics_log.h"
#include "fuzz_common.h"

namespace {
void check(std::string_view in, int64_t step) {
  fp4::MetricsCut c;
  try {
    c = fp4::cut_metrics_text(in, step, "run/metrics.jsonl");
  } catch (const fp4::UserError&) {
    return;
  }
  // Kept lines: a subsequence of the input's lines, each a metrics line of a step <= `step`.
  size_t from = 0, lines = 0;
  for (size_t pos = 0; pos < c.kept.size();) {
    const size_t nl = c.kept.find('\n', pos);
    FUZZ_CHECK(nl != std::string::npos, "kept text does not end with a newline");
    const std::string line = c.kept.substr(pos, nl - pos);
    pos = nl + 1;
    ++lines;
    FUZZ_CHECK(!line.empty(), "an empty line was kept");
    // The line occurs in the input as a whole line, after the previous kept one.
    size_t at = std::string_view::npos;
    for (size_t s = in.find(line, from); s != std::string_view::npos; s = in.find(line, s + 1)) {
      const bool starts = s == 0 || in[s - 1] == '\n';
      const bool ends = s + line.size() == in.size() || in[s + line.size()] == '\n';
      if (starts && ends) {
        at = s;
        break;
      }
    }
    FUZZ_CHECK(at != std::string_view::npos, "a kept line is not an input line: " + line);
    from = at + line.size();
    const auto j = nlohmann::json::parse(line, nullptr, false);
    FUZZ_CHECK(j.is_object() && j.contains("step") && j["step"].is_number_integer(), line);
    if (j["step"].is_number_unsigned())
      FUZZ_CHECK(step >= 0 && j["step"].get<uint64_t>() <= static_cast<uint64_t>(step), line);
    else
      FUZZ_CHECK(j["step"].get<int64_t>() <= step, line);
  }
  FUZZ_CHECK(static_cast<int64_t>(lines) == c.n_kept, "n_kept is not the number of kept lines");
  fp4::MetricsCut again;
  try {
    again = fp4::cut_metrics_text(c.kept, step, "run/metrics.jsonl");
  } catch (const fp4::UserError& e) {
    FUZZ_CHECK(false, std::string("the kept text does not read back: ") + e.what());
  }
  FUZZ_CHECK(again.kept == c.kept && again.n_kept == c.n_kept && again.n_dropped == 0 && !again.torn,
             "cutting the kept text again changes it");
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in = fuzz::bytes(data, size);
  for (int64_t step : {int64_t{0}, int64_t{3}, int64_t{1000}}) check(in, step);
  return 0;
}
