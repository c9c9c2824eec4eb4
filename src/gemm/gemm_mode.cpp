// GemmMode names (see fp4/gemm/gemm_mode.h).
#include "fp4/gemm/gemm_mode.h"

#include <stdexcept>

namespace fp4 {

GemmMode parse_gemm_mode(const std::string& s) {
  if (s == "decoded") return GemmMode::Decoded;
  if (s == "probe-matched") return GemmMode::ProbeMatched;
  throw std::invalid_argument("unknown GEMM mode '" + s +
                              "' (valid choices: decoded, probe-matched)");
}

const char* gemm_mode_name(GemmMode m) {
  return m == GemmMode::Decoded ? "decoded" : "probe-matched";
}

}  // namespace fp4
