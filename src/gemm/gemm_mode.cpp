// GemmMode names (see fp4/gemm/gemm_mode.h).
#include "fp4/gemm/gemm_mode.h"

#include <stdexcept>

namespace fp4 {

GemmMode parse_gemm_mode(const std::string& s) {
  if (s == "decoded") return GemmMode::Decoded;
  if (s == "probe-matched") return GemmMode::ProbeMatched;
  if (s == "decoded-bf16") return GemmMode::DecodedBf16;
  throw std::invalid_argument("unknown GEMM mode '" + s +
                              "' (valid choices: decoded, probe-matched, decoded-bf16)");
}

const char* gemm_mode_name(GemmMode m) {
  switch (m) {
    case GemmMode::Decoded: return "decoded";
    case GemmMode::ProbeMatched: return "probe-matched";
    case GemmMode::DecodedBf16: return "decoded-bf16";
  }
  return "decoded";
}

}  // namespace fp4
