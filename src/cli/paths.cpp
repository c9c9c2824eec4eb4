#include "paths.h"

#include <cmath>
#include <cstdlib>

#include <cstdio>

namespace fp4::cli {
std::filesystem::path resolve(const std::string& rel) {
  namespace fs = std::filesystem;
  fs::path p(rel);
  if (p.is_absolute() || fs::exists(p)) return p;
#ifdef FP4_SOURCE_DIR
  fs::path q = fs::path(FP4_SOURCE_DIR) / p;
  if (fs::exists(q)) return q;
#endif
  return p;
}
}  // namespace fp4::cli

namespace fp4::cli {
std::filesystem::path resolve_data_path(const std::string& data_path,
                                        const std::filesystem::path& config_file) {
  namespace fs = std::filesystem;
  fs::path p = data_path;
  if (p.is_relative() && !fs::exists(p)) {
    const fs::path beside = config_file.parent_path() / p;
    p = fs::exists(beside) ? beside : resolve(data_path);
  }
  return p;
}
}  // namespace fp4::cli

namespace fp4::cli {
void override_steps(RunConfig& cfg, int steps) {
  if (steps > 0) cfg.train.steps = steps;
  if (cfg.train.warmup_steps >= cfg.train.steps && cfg.train.steps > 1) {
    const int was = cfg.train.warmup_steps;
    cfg.train.warmup_steps = cfg.train.steps / 10;
    std::printf("note: --steps %d is not above train.warmup_steps = %d; warming up for %d steps\n",
                cfg.train.steps, was, cfg.train.warmup_steps);
  }
}
std::string check_peak_gflops(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end == text.c_str() || *end != '\0')
    return "'" + text + "' is not a number (GFLOP/s, e.g. 250)";
  if (!std::isfinite(v) || v < 0.01 || v > 1e6)
    return text + " is not a GFLOP/s rate in [0.01, 1e6]";
  return "";
}

}  // namespace fp4::cli
