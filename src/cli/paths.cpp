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
