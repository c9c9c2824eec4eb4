#include "paths.h"

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
